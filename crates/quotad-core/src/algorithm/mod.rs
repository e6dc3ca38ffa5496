//! The five rate algorithms and the concurrency limit as pure state
//! transitions.
//!
//! Each algorithm is a [`Meter`]: its state brought forward to one instant,
//! which can say whether a cost fits, consume it, and report what remains and
//! when. [`decide`] and [`peek`] run any meter through the same steps, so the
//! rules shared by every algorithm (the capacity check, the clock that went
//! backwards, what counts as fresh) live in one place.
//!
//! Token bucket and leaky bucket are duals: a token bucket holding `t`
//! tokens decides exactly as a leaky bucket of the same capacity filled to
//! `burst - t`. Both are kept because users name them; a property test
//! proves they agree.

mod bucket;
mod concurrency;
mod fixed_window;
mod sliding_log;
mod sliding_window;

use std::num::NonZeroU64;

pub use sliding_log::Log;

use crate::decision::{Decision, Reason};
use crate::grant::{
    Grant, LeaseAnswer, LeaseAsk, LeaseError, LeaseOutcome, LeaseTerms, Ledger, Settle, Settled,
    SlotError, lease_size,
};
use crate::policy::{Algorithm, Policy};

/// The saved state of one key under one policy. `None` (no state) means
/// fresh: a full budget.
///
/// Values are in exact integers. Bucket levels are kept in units of
/// `1 / window_ms` of a token, so that a refill of `limit` tokens per window
/// adds exactly `limit` units per millisecond.
///
/// Every state names the window it was counted over: a state is read only
/// under the algorithm and the window that wrote it, and under any other it
/// is fresh (see [`State::counts_under`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Count within the window from `start_ms` to `end_ms`.
    FixedWindow {
        /// Start of the counted window (epoch-aligned, or a calendar
        /// period's first instant).
        start_ms: u64,
        /// End of the counted window: `start_ms + window_ms` for a plain
        /// window; for a calendar period, where the period of the calendar
        /// that began the count ends, which is what a replica or a reload
        /// counting the same period kind in another zone reads it up to.
        end_ms: u64,
        /// Units admitted in that window.
        count: u64,
        /// The window length counted over.
        window_ms: u64,
    },
    /// Counts of the window starting at `start_ms` and of the one before.
    SlidingWindow {
        /// Start of the current window (epoch-aligned).
        start_ms: u64,
        /// Units admitted in the previous window.
        previous: u64,
        /// Units admitted in the current window.
        current: u64,
        /// The window length counted over.
        window_ms: u64,
    },
    /// Tokens left, scaled by `window_ms`, as of `at_ms`.
    TokenBucket {
        /// Tokens x `window_ms`.
        tokens: u64,
        /// When `tokens` was last brought up to date.
        at_ms: u64,
        /// The window the scale refers to.
        window_ms: u64,
    },
    /// Bucket level, scaled by `window_ms`, as of `at_ms`.
    LeakyBucket {
        /// Level x `window_ms`.
        level: u64,
        /// When `level` was last brought up to date.
        at_ms: u64,
        /// The window the scale refers to.
        window_ms: u64,
    },
    /// Admissions within the last window.
    SlidingLog {
        /// The admissions, oldest first.
        log: Box<Log>,
        /// The window length counted over.
        window_ms: u64,
    },
}

impl State {
    /// The algorithm this state belongs to.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            State::FixedWindow { .. } => Algorithm::FixedWindow,
            State::SlidingWindow { .. } => Algorithm::SlidingWindow,
            State::TokenBucket { .. } => Algorithm::TokenBucket,
            State::LeakyBucket { .. } => Algorithm::LeakyBucket,
            State::SlidingLog { .. } => Algorithm::SlidingLog,
        }
    }

    /// The window length this state was counted over.
    pub fn window_ms(&self) -> u64 {
        match *self {
            State::FixedWindow { window_ms, .. }
            | State::SlidingWindow { window_ms, .. }
            | State::TokenBucket { window_ms, .. }
            | State::LeakyBucket { window_ms, .. }
            | State::SlidingLog { window_ms, .. } => window_ms,
        }
    }

    /// Whether `policy` reads this state: it was written under the same
    /// algorithm and the same window (for a calendar policy, the same
    /// calendar: [`Policy::ledger_window_ms`]). A state written under another is
    /// fresh, as a Redis key bound to other parameters is; a changed limit
    /// or burst keeps the state.
    pub fn counts_under(&self, policy: &Policy) -> bool {
        self.algorithm() == policy.algorithm() && self.window_ms() == policy.ledger_window_ms()
    }

    /// Heap bytes the state holds beyond its own size: a sliding log's, by
    /// the capacity it has allocated; nothing for the others.
    pub fn heap_bytes(&self) -> usize {
        match self {
            State::SlidingLog { log, .. } => log.heap_bytes(),
            _ => 0,
        }
    }

    /// The latest instant the state has seen. A clock reading earlier than
    /// this is treated as this instant: time never runs backwards for a key,
    /// so a clock step back neither panics nor refunds.
    fn time_floor(&self) -> u64 {
        match self {
            State::FixedWindow { start_ms, .. } | State::SlidingWindow { start_ms, .. } => {
                *start_ms
            }
            State::TokenBucket { at_ms, .. } | State::LeakyBucket { at_ms, .. } => *at_ms,
            State::SlidingLog { log, .. } => log.last_ms().unwrap_or(0),
        }
    }
}

/// One algorithm's state brought forward to a single instant.
trait Meter: Sized {
    /// The state at instant `at`; a missing state is fresh. Only ever given
    /// a state that [`State::counts_under`] the policy. `grants` are the
    /// key's grants (for most keys, none): those the algorithm still counts
    /// shape how it refills or what it holds.
    fn advance(policy: &Policy, state: Option<State>, grants: &[Grant], at: u64) -> Self;
    /// Whether `cost` fits now. Only called with `cost <= capacity`.
    fn fits(&self, cost: u64) -> bool;
    /// Takes `cost`. Only called when it fits.
    fn consume(&mut self, cost: u64);
    /// The heap bytes the state will hold once `consume` has run: more than
    /// now only if consuming allocates.
    fn heap_bytes_after_consume(&self) -> usize {
        0
    }
    /// Unit-cost requests that would be admitted at this instant.
    fn remaining(&self) -> u64;
    /// The exact wait until `cost` fits, with no other traffic. Only called
    /// when it does not fit now and `cost <= capacity`.
    fn retry_after(&self, cost: u64) -> u64;
    /// The wait until the state is fresh again.
    fn reset_after(&self) -> u64;
    /// The latest instant a lease charged now may end at (`u64::MAX`: no
    /// bound of the algorithm's own, only the lease's TTL).
    fn lease_end(&self) -> u64;
    /// Charges a lease of `units` that ends at `ends_at`. Only called when
    /// `units` fit.
    fn grant(&mut self, units: u64, ends_at: u64) {
        let _ = ends_at;
        self.consume(units);
    }
    /// Settles the live lease `grant`, of which `unused` units were not
    /// spent; returns what the ledger keeps of it (an algorithm that counts
    /// a lease's admissions for a while after it ends keeps them).
    fn refund(&mut self, grant: &Grant, unused: u64) -> Option<Grant>;
    /// How long after its end a grant still counts.
    fn linger(&self) -> u64 {
        0
    }
    /// The state to keep; `None` when it is equivalent to fresh.
    fn into_state(self) -> Option<State>;
}

/// Decides one request and returns the state to keep (`None`: fresh, keep
/// nothing) with the decision.
///
/// Pure: the caller reads the clock once and passes `now_ms`. A state left by
/// another algorithm or over another window (the policy changed) counts as
/// fresh; one left under another limit or burst is kept.
///
/// ```
/// use std::num::NonZeroU64;
/// use std::time::Duration;
/// use quotad_core::{decide, Algorithm, Policy};
///
/// let policy = Policy::try_new(Algorithm::FixedWindow, 2, Duration::from_secs(1), None)?;
/// let one = NonZeroU64::MIN;
/// let (state, first) = decide(&policy, None, 5_000, one);
/// let (state, second) = decide(&policy, state, 5_001, one);
/// let (_, third) = decide(&policy, state, 5_002, one);
/// assert!(first.allowed && second.allowed && !third.allowed);
/// assert_eq!(third.retry_after_ms, 998);
/// # Ok::<(), quotad_core::PolicyError>(())
/// ```
pub fn decide(
    policy: &Policy,
    state: Option<State>,
    now_ms: u64,
    cost: NonZeroU64,
) -> (Option<State>, Decision) {
    decide_spending(policy, state, now_ms, cost, Spend::WhenAdmitted)
}

/// [`decide`], with what a denial spends said by `spend`.
///
/// With [`Spend::Always`] a denied request (over the limit, or a cost above
/// the capacity) spends whatever is left of the budget, so that the next
/// request is denied as if the denied hits had been counted:
///
/// ```
/// use std::num::NonZeroU64;
/// use std::time::Duration;
/// use quotad_core::{decide_spending, Algorithm, Policy, Spend};
///
/// let policy = Policy::try_new(Algorithm::FixedWindow, 10, Duration::from_secs(60), None)?;
/// let hits = |n| NonZeroU64::new(n).expect("not zero");
/// let (state, first) = decide_spending(&policy, None, 0, hits(8), Spend::Always);
/// assert!(first.allowed && first.remaining == 2);
/// // 5 more do not fit: denied, and the 2 left are spent.
/// let (state, second) = decide_spending(&policy, state, 1, hits(5), Spend::Always);
/// assert!(!second.allowed && second.remaining == 0);
/// let (_, third) = decide_spending(&policy, state, 2, hits(2), Spend::Always);
/// assert!(!third.allowed);
/// # Ok::<(), quotad_core::PolicyError>(())
/// ```
pub fn decide_spending(
    policy: &Policy,
    state: Option<State>,
    now_ms: u64,
    cost: NonZeroU64,
    spend: Spend,
) -> (Option<State>, Decision) {
    evaluate(
        policy,
        state,
        &[],
        now_ms,
        cost,
        Some(spend),
        UNBOUNDED,
        &mut None,
    )
}

/// The decision [`decide`] would make, with nothing consumed: `allowed` says
/// whether `cost` would fit, `remaining` is what is left right now.
pub fn peek(policy: &Policy, state: Option<&State>, now_ms: u64, cost: NonZeroU64) -> Decision {
    evaluate(
        policy,
        state.cloned(),
        &[],
        now_ms,
        cost,
        None,
        UNBOUNDED,
        &mut None,
    )
    .1
}

/// What a denied request does to the budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Spend {
    /// Only an admitted cost is consumed; a denial changes nothing.
    #[default]
    WhenAdmitted,
    /// A denial spends what is left of the budget, up to the limit: a
    /// window's count reaches the limit, a bucket empties, a log fills.
    /// Hits that arrive anyway (reported after they were served) are then
    /// counted against the next requests. Nothing is owed beyond the
    /// limit: for a fixed window this decides every later request exactly
    /// as a counter that went past the limit would.
    Always,
}

/// No bound on the heap bytes a state may hold.
const UNBOUNDED: usize = usize::MAX;

/// [`decide`] on a key that holds `grants`, with the state's heap bytes
/// bounded by `room`: a cost that fits but whose consumption would make the
/// state allocate past `room` is denied with [`Reason::Capacity`] and not
/// consumed. The state comes back brought forward to `now_ms` either way,
/// and, on that denial, with the heap bytes consuming needs.
pub(crate) fn decide_within(
    policy: &Policy,
    state: Option<State>,
    grants: &[Grant],
    now_ms: u64,
    cost: NonZeroU64,
    spend: Spend,
    room: usize,
) -> (Option<State>, Decision, Option<usize>) {
    let mut short = None;
    let (state, decision) = evaluate(
        policy,
        state,
        grants,
        now_ms,
        cost,
        Some(spend),
        room,
        &mut short,
    );
    (state, decision, short)
}

/// [`decide_spending`] on a key that holds `grants`.
pub(crate) fn decide_granted(
    policy: &Policy,
    state: Option<State>,
    grants: &[Grant],
    now_ms: u64,
    cost: NonZeroU64,
    spend: Spend,
) -> (Option<State>, Decision) {
    evaluate(
        policy,
        state,
        grants,
        now_ms,
        cost,
        Some(spend),
        UNBOUNDED,
        &mut None,
    )
}

/// [`peek`] on a key that holds `grants`, with the room [`decide_within`]
/// would have.
pub(crate) fn peek_within(
    policy: &Policy,
    state: Option<&State>,
    grants: &[Grant],
    now_ms: u64,
    cost: NonZeroU64,
    room: usize,
) -> Decision {
    evaluate(
        policy,
        state.cloned(),
        grants,
        now_ms,
        cost,
        None,
        room,
        &mut None,
    )
    .1
}

/// Decides (or peeks, without `consume`: `None`), with the state's heap bytes
/// bounded by `room`; sets `short` to the bytes consuming would have needed
/// when that bound denied it.
#[allow(
    clippy::too_many_arguments,
    reason = "one internal entry for four public ones"
)]
fn evaluate(
    policy: &Policy,
    state: Option<State>,
    grants: &[Grant],
    now_ms: u64,
    cost: NonZeroU64,
    consume: Option<Spend>,
    room: usize,
    short: &mut Option<usize>,
) -> (Option<State>, Decision) {
    // A key's grants count whatever the policy: their holders spend them
    // until they end, even if the policy changed since they were granted.
    let state = state.filter(|s| s.counts_under(policy));
    let at = state
        .as_ref()
        .map_or(now_ms, |s| s.time_floor().max(now_ms));
    let step = Step {
        policy,
        grants,
        at,
        skew: at - now_ms,
        cost: cost.get(),
        consume,
        room,
    };

    match policy.algorithm() {
        Algorithm::FixedWindow => step.run::<fixed_window::FixedWindow>(state, short),
        Algorithm::SlidingWindow => step.run::<sliding_window::SlidingWindow>(state, short),
        Algorithm::TokenBucket => step.run::<bucket::TokenBucket>(state, short),
        Algorithm::LeakyBucket => step.run::<bucket::LeakyBucket>(state, short),
        Algorithm::SlidingLog => step.run::<sliding_log::SlidingLog>(state, short),
        Algorithm::Concurrency => step.run::<concurrency::Concurrency>(state, short),
    }
}

/// Decides an acquire of a slot of `cost` units with id `id` on a
/// concurrency key whose slots are `ledger`, at `now`: admitted when the
/// live slots' units plus `cost` are within the limit. Ended slots are
/// dropped first (a ledger charged under another algorithm starts fresh).
/// Returns the decision, the slot to add when admitted (ending at `now +
/// slot_ttl`; the caller adds it), and how many ended slots were dropped
/// (slots that expired unreleased).
///
/// A denial's `retry_after_ms` is the earliest end of a live slot after
/// which `cost` fits with no other traffic (the slots' ends, soonest
/// first); `reset_after_ms` is when the last slot, the new one included,
/// ends.
///
/// # Errors
///
/// [`SlotError::IdInUse`] when a slot with `id` is held; the ledger is
/// then only purged.
pub(crate) fn acquire(
    policy: &Policy,
    ledger: &mut Ledger,
    now_ms: u64,
    cost: NonZeroU64,
    id: u64,
) -> Result<(Decision, Option<Grant>, usize), SlotError> {
    if !ledger.counts_under(policy) {
        ledger.clear();
    }
    let before = ledger.len();
    ledger.purge(now_ms, 0);
    let expired = before - ledger.len();
    if ledger.holds(id) {
        return Err(SlotError::IdInUse);
    }
    let (_, mut decision) = evaluate(
        policy,
        None,
        ledger.grants(),
        now_ms,
        cost,
        Some(Spend::WhenAdmitted),
        UNBOUNDED,
        &mut None,
    );
    let slot = decision.allowed.then(|| Grant {
        id,
        units: cost.get(),
        granted_at: now_ms,
        ends_at: now_ms.saturating_add(policy.slot_ttl_ms()),
    });
    if let Some(slot) = slot {
        decision.reset_after_ms = ledger.last_end().max(slot.ends_at) - now_ms;
    }
    Ok((decision, slot, expired))
}

/// Whether the lease `settle` names can be settled against `ledger` at
/// `now`: it is held and was not overspent, or it has ended. Nothing is
/// changed; [`lease`] is only called after this passed.
///
/// # Errors
///
/// [`LeaseError::UnknownLease`] for a lease neither held nor ended,
/// [`LeaseError::Overspent`] for a report of more than it granted.
pub(crate) fn check_settle(ledger: &Ledger, settle: &Settle, now: u64) -> Result<(), LeaseError> {
    let held = ledger.grants().iter().find(|g| g.id == settle.id);
    match held {
        Some(g) if g.ends_at > now && settle.spent > g.units => Err(LeaseError::Overspent {
            spent: settle.spent,
            units: g.units,
        }),
        // Held, live or ended (a log counts an ended one a while longer).
        Some(_) => Ok(()),
        None if settle.ends_at <= now => Ok(()),
        None => Err(LeaseError::UnknownLease),
    }
}

/// Settles one lease and grants another, on one key's state and ledger, at
/// `now`. The caller has passed [`check_settle`]. Returns the state to keep
/// and the outcome; the ledger is updated in place (ended grants dropped).
///
/// A lease is charged to the meter as an admission of its units; its
/// unspent units go back while it is live (so, for the window algorithms,
/// while the window it was charged to is current). A state written under
/// another algorithm or window is fresh; its grants still count until they end.
pub(crate) fn lease(
    policy: &Policy,
    terms: &LeaseTerms,
    state: Option<State>,
    ledger: &mut Ledger,
    now_ms: u64,
    ask: &LeaseAsk,
) -> (Option<State>, LeaseOutcome) {
    let state = state.filter(|s| s.counts_under(policy));
    if !ledger.counts_under(policy) {
        // Charged under another algorithm or window: the key starts fresh,
        // grants and all (as on Redis, where both are bound to them). No
        // return of those grants is credited to the new meter.
        ledger.clear();
    }
    let at = state
        .as_ref()
        .map_or(now_ms, |s| s.time_floor().max(now_ms));
    let (state, mut outcome) = match policy.algorithm() {
        Algorithm::FixedWindow => {
            lease_on::<fixed_window::FixedWindow>(policy, terms, state, ledger, at, ask)
        }
        Algorithm::SlidingWindow => {
            lease_on::<sliding_window::SlidingWindow>(policy, terms, state, ledger, at, ask)
        }
        Algorithm::TokenBucket => {
            lease_on::<bucket::TokenBucket>(policy, terms, state, ledger, at, ask)
        }
        Algorithm::LeakyBucket => {
            lease_on::<bucket::LeakyBucket>(policy, terms, state, ledger, at, ask)
        }
        Algorithm::SlidingLog => {
            lease_on::<sliding_log::SlidingLog>(policy, terms, state, ledger, at, ask)
        }
        Algorithm::Concurrency => {
            lease_on::<concurrency::Concurrency>(policy, terms, state, ledger, at, ask)
        }
    };
    // From the clock, as a check reports it: the meter's wait runs from
    // `at`, which a clock that stepped back leaves ahead of `now_ms`, and
    // the store takes the key as fresh at `now_ms` + this.
    if outcome.reset_after_ms > 0 {
        outcome.reset_after_ms = outcome.reset_after_ms.saturating_add(at - now_ms);
    }
    (state, outcome)
}

fn lease_on<M: Meter>(
    policy: &Policy,
    terms: &LeaseTerms,
    state: Option<State>,
    ledger: &mut Ledger,
    at: u64,
    ask: &LeaseAsk,
) -> (Option<State>, LeaseOutcome) {
    let mut meter = M::advance(policy, state, ledger.grants(), at);
    let linger = meter.linger();
    ledger.purge(at, linger);
    let settled = ask.settle.map(|s| match ledger.take_live(s.id, at) {
        Some(g) => {
            let returned = g.units - s.spent.min(g.units);
            if let Some(kept) = meter.refund(&g, returned) {
                ledger.push(kept, policy);
            }
            Settled::Returned { returned }
        }
        None => Settled::Ended,
    });
    let answer = if ask.want == 0 {
        LeaseAnswer::None
    } else {
        let end = meter.lease_end();
        let (live, held) = (ledger.live(at), ledger.len());
        match lease_size(terms, ask.want, meter.remaining(), live, held) {
            Some(units) if meter.fits(units) && end > at => {
                let ends_at = end.min(at.saturating_add(terms.max_ttl_ms()));
                meter.grant(units, ends_at);
                let grant = Grant {
                    id: ask.new_id,
                    units,
                    granted_at: at,
                    ends_at,
                };
                ledger.push(grant, policy);
                LeaseAnswer::Granted(grant)
            }
            _ => LeaseAnswer::Direct,
        }
    };
    let outcome = LeaseOutcome {
        settled,
        answer,
        remaining: meter.remaining(),
        limit: policy.capacity(),
        reset_after_ms: meter.reset_after(),
    };
    (meter.into_state(), outcome)
}

struct Step<'a> {
    policy: &'a Policy,
    grants: &'a [Grant],
    /// The instant decided at: the clock, or the state's floor if later.
    at: u64,
    /// How far `at` is ahead of the clock; added to every wait reported.
    skew: u64,
    cost: u64,
    /// `None` for a peek.
    consume: Option<Spend>,
    /// The most heap bytes the state may hold after consuming.
    room: usize,
}

impl Step<'_> {
    fn run<M: Meter>(
        &self,
        state: Option<State>,
        short: &mut Option<usize>,
    ) -> (Option<State>, Decision) {
        let mut meter = M::advance(self.policy, state, self.grants, self.at);
        let capacity = self.policy.capacity();
        let wait = |ms: u64| {
            if ms == 0 {
                0
            } else {
                ms.saturating_add(self.skew)
            }
        };
        // The capacity check comes first, so `fits` may compute
        // `capacity - cost` without underflow.
        let wanted = |meter: &M| {
            if self.room == UNBOUNDED {
                return None;
            }
            let bytes = meter.heap_bytes_after_consume();
            (bytes > self.room).then_some(bytes)
        };
        let (allowed, reason) = if self.cost > capacity {
            (false, Reason::CostExceedsCapacity)
        } else if meter.fits(self.cost) {
            *short = wanted(&meter);
            if short.is_some() {
                (false, Reason::Capacity)
            } else {
                if self.consume.is_some() {
                    meter.consume(self.cost);
                }
                (true, Reason::WithinLimit)
            }
        } else {
            (false, Reason::LimitExceeded)
        };
        if !allowed && reason != Reason::Capacity && self.consume == Some(Spend::Always) {
            // What is left fits by definition of `remaining`; a state that
            // may not grow (a full byte budget) keeps what it has.
            let left = meter.remaining();
            if left > 0 && wanted(&meter).is_none() {
                meter.consume(left);
            }
        }
        // After any spending: the wait is for the budget as it is left.
        let retry_after_ms = if reason == Reason::LimitExceeded {
            wait(meter.retry_after(self.cost))
        } else {
            0
        };
        let decision = Decision {
            allowed,
            limit: capacity,
            remaining: meter.remaining(),
            retry_after_ms,
            reset_after_ms: wait(meter.reset_after()),
            reason,
        };
        (meter.into_state(), decision)
    }
}

/// `a / b` rounded up; `b > 0`.
fn div_ceil(a: u128, b: u128) -> u64 {
    u64::try_from(a.div_ceil(b)).unwrap_or(u64::MAX)
}

/// Converts a u128 that is known to be at most a u64 value back, saturating.
fn narrow(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}
