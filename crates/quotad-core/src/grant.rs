//! Grants: shares of a key's budget held outside the store, written
//! atomically with the key's state.
//!
//! A grant `(id, units, granted_at, ends_at)` lives in the key's entry, next
//! to its meter, and is bounded in number per key ([`MAX_GRANTS_PER_KEY`]).
//! A **lease** is a grant of rate budget: it is charged to the meter when it
//! is made, as an admission of `units`, and its holder admits locally until
//! its units or its time run out, then reports what it spent; what it did not
//! spend goes back to the meter while the window it was charged to is still
//! current. The invariant: the admissions counted directly plus the units the
//! live grants can still spend form a history the policy's algorithm would
//! have accepted (`docs/leases.md` has the model and the proof sketch).
//!
//! Every algorithm offers leases, each with its rule: the window algorithms'
//! leases end with the window they were charged to; a bucket refills only up
//! to its capacity less its live leases (a leaky bucket drains only down to
//! them); a sliding log counts a lease as one entry until a window after it
//! ends.

use std::time::Duration;

use thiserror::Error;

use crate::policy::{Algorithm, MAX_EXACT, Policy};

/// The most grants one key holds, live or still counted after their end (a
/// sliding log counts an ended lease for a window); a lease asked for past
/// it is answered [`LeaseAnswer::Direct`].
pub const MAX_GRANTS_PER_KEY: usize = 32;

/// One share of a key's budget held outside the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Chosen by the caller that made it (unguessable: whoever presents it
    /// can return its units).
    pub id: u64,
    /// Units granted, all charged to the meter when granted.
    pub units: u64,
    /// When it was granted (store time).
    pub granted_at: u64,
    /// When it ends (store time): its holder stops spending before then.
    pub ends_at: u64,
}

/// The grants of one key, oldest first, and the counting parameters they
/// were charged under: like a key's state, a ledger counts only under the
/// algorithm and window that wrote it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    grants: Vec<Grant>,
    /// The algorithm and window the grants were charged under; `None` while
    /// the ledger is empty.
    under: Option<(Algorithm, u64)>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// A ledger of `grants` charged under `algorithm` and `window_ms`, as
    /// a snapshot holds them.
    pub fn from_grants(grants: Vec<Grant>, algorithm: Algorithm, window_ms: u64) -> Self {
        let under = (!grants.is_empty()).then_some((algorithm, window_ms));
        Self { grants, under }
    }

    /// The algorithm and window the grants were charged under, if any.
    pub fn charged_under(&self) -> Option<(Algorithm, u64)> {
        self.under
    }

    /// Whether `policy` counts these grants: they were charged under its
    /// algorithm and window (a reload to another starts the key fresh,
    /// grants and all, as it does the key's state).
    pub fn counts_under(&self, policy: &Policy) -> bool {
        self.under
            .is_none_or(|u| u == (policy.algorithm(), policy.ledger_window_ms()))
    }

    /// The grants `policy` counts: none for a ledger charged under another
    /// algorithm or window.
    pub fn grants_under(&self, policy: &Policy) -> &[Grant] {
        if self.counts_under(policy) {
            &self.grants
        } else {
            &[]
        }
    }

    /// The grants, oldest first.
    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }

    /// Whether it holds no grant.
    pub fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }

    /// Drops every grant that no longer counts at `now`: those that ended
    /// `linger` ms ago or earlier.
    pub fn purge(&mut self, now: u64, linger: u64) {
        self.grants
            .retain(|g| g.ends_at.saturating_add(linger) > now);
        if self.grants.is_empty() {
            self.under = None;
        }
    }

    /// Drops every grant.
    pub(crate) fn clear(&mut self) {
        self.grants.clear();
        self.under = None;
    }

    /// Grants held, live or still counted.
    pub fn len(&self) -> usize {
        self.grants.len()
    }

    /// Grants that have not ended by `now`.
    pub fn live(&self, now: u64) -> usize {
        self.grants.iter().filter(|g| g.ends_at > now).count()
    }

    /// The latest end of any grant, 0 for none. (A sliding log counts a
    /// grant a window longer; its meter's reset says so.)
    pub fn last_end(&self) -> u64 {
        self.grants.iter().map(|g| g.ends_at).max().unwrap_or(0)
    }

    /// The grant `id`, taken out of the ledger, if it has not ended by
    /// `now`.
    pub(crate) fn take_live(&mut self, id: u64, now: u64) -> Option<Grant> {
        let i = self
            .grants
            .iter()
            .position(|g| g.id == id && g.ends_at > now)?;
        Some(self.grants.remove(i))
    }

    /// Adds `grant`, charged under `policy`.
    pub(crate) fn push(&mut self, grant: Grant, policy: &Policy) {
        self.under = Some((policy.algorithm(), policy.ledger_window_ms()));
        self.grants.push(grant);
    }

    /// Moves the end of the grant `id`, if it has not ended by `now`, to
    /// `ends_at`; returns it as it is now.
    pub(crate) fn extend(&mut self, id: u64, now: u64, ends_at: u64) -> Option<Grant> {
        let g = self
            .grants
            .iter_mut()
            .find(|g| g.id == id && g.ends_at > now)?;
        g.ends_at = ends_at;
        Some(*g)
    }

    /// Whether a grant `id` is held, live or not.
    pub(crate) fn holds(&self, id: u64) -> bool {
        self.grants.iter().any(|g| g.id == id)
    }

    /// Units of the grants that have not ended by `now`.
    pub fn live_units(&self, now: u64) -> u64 {
        self.grants
            .iter()
            .filter(|g| g.ends_at > now)
            .map(|g| g.units)
            .sum()
    }

    /// Room for `more` grants, allocated now so that what the ledger costs
    /// is known before it is written.
    pub(crate) fn reserve(&mut self, more: usize) {
        self.grants.reserve_exact(more);
    }

    /// Grants it has room for without allocating.
    pub(crate) fn capacity(&self) -> usize {
        self.grants.capacity()
    }

    /// Heap bytes held, by allocated capacity.
    pub fn heap_bytes(&self) -> usize {
        self.grants.capacity() * size_of::<Grant>()
    }
}

/// The answer to an acquire: the decision, and the slot it holds when
/// admitted (its id, units, and `ends_at`, by which the holder renews or
/// loses it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquired {
    /// Admitted or not, with `remaining` (units free now) and, when denied,
    /// the exact `retry_after_ms`: the earliest end of the live slots after
    /// which the cost fits, with no release or renewal.
    pub decision: crate::decision::Decision,
    /// The slot taken, when admitted.
    pub slot: Option<Grant>,
}

/// The answer to a renew or a release of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotAnswer {
    /// The slot as it is now (renewed: with its new end), or as it was
    /// when released; `None` when no live slot had the id (unknown,
    /// released or ended): a renew of it fails, a release of it is done.
    pub slot: Option<Grant>,
    /// The policy's limit.
    pub limit: u64,
    /// Units free now, after the change.
    pub remaining: u64,
}

/// A slot request the store cannot act on; nothing was changed.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum SlotError {
    /// The policy is a rate, which holds no slots.
    #[error("a {0} policy holds no slots: only a concurrency policy is acquired")]
    NotConcurrency(Algorithm),
    /// The id asked for the new slot is already held by the key (ids are
    /// drawn at random; ask again with another).
    #[error("slot id already held")]
    IdInUse,
}

/// How a policy hands out leases: validated, so terms that exist are
/// usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseTerms {
    max_units: u64,
    min_units: u64,
    max_ttl_ms: u64,
}

/// Lease terms that break a rule.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum LeaseTermsError {
    /// `max_units` is 0.
    #[error("lease.max_units must be at least 1")]
    ZeroMaxUnits,
    /// `min_units` is 0 or above `max_units`.
    #[error("lease.min_units must be from 1 to lease.max_units ({max_units}), got {min_units}")]
    MinUnits {
        /// The minimum given.
        min_units: u64,
        /// The maximum it must not exceed.
        max_units: u64,
    },
    /// `max_units` is above 2^53.
    #[error("lease.max_units must be at most 2^53")]
    MaxUnitsTooLarge,
    /// `max_ttl` is shorter than one millisecond or longer than a day.
    #[error("lease.max_ttl must be from 1ms to 1d")]
    MaxTtl,
}

/// The longest lease: a holder that crashes strands its units at most this
/// long.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(86_400);

impl LeaseTerms {
    /// Terms granting at most `max_units` per lease, none smaller than
    /// `min_units` (below it the answer is direct), each lasting at most
    /// `max_ttl`.
    ///
    /// # Errors
    ///
    /// One [`LeaseTermsError`] per broken rule.
    pub fn try_new(
        max_units: u64,
        min_units: u64,
        max_ttl: Duration,
    ) -> Result<Self, LeaseTermsError> {
        if max_units == 0 {
            return Err(LeaseTermsError::ZeroMaxUnits);
        }
        if max_units > MAX_EXACT {
            return Err(LeaseTermsError::MaxUnitsTooLarge);
        }
        if min_units == 0 || min_units > max_units {
            return Err(LeaseTermsError::MinUnits {
                min_units,
                max_units,
            });
        }
        let ms = u64::try_from(max_ttl.as_millis()).unwrap_or(u64::MAX);
        if ms == 0 || max_ttl > MAX_LEASE_TTL || !max_ttl.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(LeaseTermsError::MaxTtl);
        }
        Ok(Self {
            max_units,
            min_units,
            max_ttl_ms: ms,
        })
    }

    /// The most units one lease gets.
    pub fn max_units(&self) -> u64 {
        self.max_units
    }

    /// The fewest units worth a lease; below it the answer is direct.
    pub fn min_units(&self) -> u64 {
        self.min_units
    }

    /// The longest a lease lasts, in ms.
    pub fn max_ttl_ms(&self) -> u64 {
        self.max_ttl_ms
    }
}

/// The end of a lease the caller holds: its id and what it spent of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settle {
    /// The lease's id.
    pub id: u64,
    /// When it ends, as the store answered it: a lease whose end has passed
    /// is settled as ended, whether or not the store still holds it.
    pub ends_at: u64,
    /// Units its holder admitted with it.
    pub spent: u64,
}

/// What happened to the lease a request settled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settled {
    /// It was live: `returned` units went back to the budget (0 when the
    /// window it was charged to is over, or it was all spent).
    Returned {
        /// Units given back.
        returned: u64,
    },
    /// It had ended: nothing to give back.
    Ended,
}

/// A lease request the store cannot act on; nothing was changed.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum LeaseError {
    /// The lease named is not held by the key and has not ended: it was
    /// never granted there, or the key was reset.
    #[error("lease_id names no lease of this key")]
    UnknownLease,
    /// The holder reports spending more than the lease granted.
    #[error("spent is {spent}, more than the lease's {units} units")]
    Overspent {
        /// What it reported.
        spent: u64,
        /// What the lease granted.
        units: u64,
    },
}

/// What a lease request asked for: settle one lease, then (with `want > 0`)
/// get a new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseAsk {
    /// The lease to end first, if any.
    pub settle: Option<Settle>,
    /// Units wanted for a new lease; 0 asks for none (a plain return).
    pub want: u64,
    /// The id a new lease gets.
    pub new_id: u64,
}

/// The answer to a lease request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseOutcome {
    /// What became of the lease settled, if one was named.
    pub settled: Option<Settled>,
    /// The new lease, or why there is none.
    pub answer: LeaseAnswer,
    /// Units left to grant or admit right now, net of every live lease.
    pub remaining: u64,
    /// The policy's capacity.
    pub limit: u64,
    /// Time until the key's meter is back to fresh, as a check reports it.
    pub reset_after_ms: u64,
}

/// Whether a new lease was granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// Granted: spend it locally until it ends.
    Granted(Grant),
    /// No lease: check each request directly. The budget is near its end
    /// (a fair share would be below `min_units`), the key holds as many
    /// leases as it may, or the algorithm offers none.
    Direct,
    /// No lease was asked for (`want` 0).
    None,
}

/// The units a new lease gets: at most `want`, at most `max_units`, at most a
/// fair share `free / (live + 1)` of what is free; `None` (direct) below
/// `min_units` or when the key holds as many grants as it may (`held`, live
/// or still counted: a settle never adds one, so this bounds them all).
pub(crate) fn lease_size(
    terms: &LeaseTerms,
    want: u64,
    free: u64,
    live: usize,
    held: usize,
) -> Option<u64> {
    if held >= MAX_GRANTS_PER_KEY {
        return None;
    }
    let share = free / (live as u64 + 1);
    let units = want.min(terms.max_units).min(share);
    (units >= terms.min_units).then_some(units)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms() -> LeaseTerms {
        LeaseTerms::try_new(100, 10, Duration::from_secs(10)).expect("valid terms")
    }

    #[test]
    fn terms_name_the_rule_they_break() {
        let s = Duration::from_secs(1);
        assert_eq!(
            LeaseTerms::try_new(0, 1, s),
            Err(LeaseTermsError::ZeroMaxUnits)
        );
        assert!(matches!(
            LeaseTerms::try_new(5, 6, s),
            Err(LeaseTermsError::MinUnits { .. })
        ));
        assert!(matches!(
            LeaseTerms::try_new(5, 0, s),
            Err(LeaseTermsError::MinUnits { .. })
        ));
        assert_eq!(
            LeaseTerms::try_new(5, 1, Duration::ZERO),
            Err(LeaseTermsError::MaxTtl)
        );
        assert_eq!(
            LeaseTerms::try_new(5, 1, Duration::from_secs(86_401)),
            Err(LeaseTermsError::MaxTtl)
        );
        assert_eq!(
            LeaseTerms::try_new(MAX_EXACT + 1, 1, s),
            Err(LeaseTermsError::MaxUnitsTooLarge)
        );
    }

    #[test]
    fn a_lease_is_a_fair_share_of_what_is_free_and_direct_below_the_minimum() {
        let t = terms();
        assert_eq!(lease_size(&t, 1_000, 10_000, 0, 0), Some(100));
        assert_eq!(lease_size(&t, 50, 10_000, 0, 0), Some(50));
        assert_eq!(lease_size(&t, 1_000, 60, 1, 1), Some(30));
        assert_eq!(lease_size(&t, 1_000, 60, 5, 5), Some(10));
        assert_eq!(lease_size(&t, 1_000, 60, 6, 6), None);
        let max = MAX_GRANTS_PER_KEY;
        assert_eq!(lease_size(&t, 1_000, 10_000, max, max), None);
        // Grants still counted after their end count towards the bound.
        assert_eq!(lease_size(&t, 1_000, 10_000, 0, max), None);
        // Fewer than the minimum is not worth a lease, even when asked for.
        assert_eq!(lease_size(&t, 3, 10_000, 0, 0), None);
        assert_eq!(lease_size(&t, 0, 10_000, 0, 0), None);
    }
}
