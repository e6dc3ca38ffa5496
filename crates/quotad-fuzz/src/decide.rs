//! Arbitrary policies, states, times and costs through quotad-core's pure
//! transitions, [`decide`] and [`peek`].
//!
//! An input is a policy (any numbers: [`Policy::try_new`] must refuse the
//! invalid ones and keep its bounds on the valid ones), an optional
//! starting state with any fields (as a snapshot or another version might
//! leave), and a list of steps: decide, peek, move the clock (also
//! backwards) or replace the policy (a reload). On every step:
//!
//! - the decision rules of [`check_decision`];
//! - `peek` agrees with `decide` (and equals it on a denial).
//!
//! And on states that quotad itself produced (no arbitrary starting
//! state, which a decision may bring into line and so change), what the
//! API promises: a denial changes nothing about the key; after an
//! admission the new state shows what the decision said remains; a
//! `LIMIT_EXCEEDED` denial's `retry_after_ms` is the first instant the
//! same cost fits; at `reset_after_ms` the key decides as a fresh one.
//! Instants within a window of `u64::MAX` ms, where window ends saturate,
//! are held to the rules of [`check_decision_saturated`] only.

use std::num::NonZeroU64;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use quotad_core::{
    Algorithm, MAX_EXACT, Policy, Reason, SLIDING_LOG_MAX_LIMIT, State, decide, peek,
};

use crate::invariants::{check_decision, check_decision_saturated};

/// Instants past this are only checked for panics: exactness needs room
/// to add waits without saturating.
const EXACT_UNTIL_MS: u64 = 1 << 62;

/// Policy numbers as written, before validation.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct PolicyInput {
    algorithm: u8,
    limit: Number,
    window_ms: Number,
    burst: Option<Number>,
}

/// A number drawn small most of the time, any `u64` otherwise.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Number {
    /// 0 to 255.
    Small(u8),
    /// 0 to 65,535.
    Medium(u16),
    /// Any.
    Any(u64),
}

impl Number {
    fn get(self) -> u64 {
        match self {
            Number::Small(n) => u64::from(n),
            Number::Medium(n) => u64::from(n),
            Number::Any(n) => n,
        }
    }
}

impl PolicyInput {
    /// The policy, if the numbers make a valid one; checks that
    /// [`Policy::try_new`] kept every bound when it accepted them.
    pub fn policy(&self) -> Option<Policy> {
        let algorithm = Algorithm::RATES[usize::from(self.algorithm) % Algorithm::RATES.len()];
        let (limit, window_ms) = (self.limit.get(), self.window_ms.get());
        let burst = self.burst.map(Number::get);
        let policy =
            Policy::try_new(algorithm, limit, Duration::from_millis(window_ms), burst).ok()?;
        let exact = u128::from(MAX_EXACT);
        assert!(policy.limit() >= 1 && policy.window_ms() >= 1, "{policy:?}");
        if algorithm == Algorithm::FixedWindow {
            // It only adds: each of the two within 2^53.
            assert!(
                policy.limit() <= MAX_EXACT && policy.window_ms() <= MAX_EXACT,
                "{policy:?}"
            );
        } else {
            assert!(
                u128::from(policy.limit()) * u128::from(policy.window_ms()) <= exact,
                "{policy:?}"
            );
        }
        if algorithm.is_bucket() {
            assert!(
                u128::from(policy.burst()) * u128::from(policy.window_ms()) <= exact,
                "{policy:?}"
            );
        } else {
            assert_eq!(policy.burst(), policy.limit(), "{policy:?}");
        }
        if algorithm == Algorithm::SlidingLog {
            assert!(policy.limit() <= SLIDING_LOG_MAX_LIMIT, "{policy:?}");
        }
        if !algorithm.is_bucket() {
            assert!(
                burst.is_none() && policy.burst() == policy.limit(),
                "{policy:?}"
            );
        }
        Some(policy)
    }
}

/// A starting state with any fields (a sliding log cannot be built from
/// outside quotad-core, so it starts empty).
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum StateInput {
    /// `State::FixedWindow`.
    FixedWindow {
        start_ms: u64,
        count: u64,
        window_ms: u64,
    },
    /// `State::SlidingWindow`.
    SlidingWindow {
        start_ms: u64,
        previous: u64,
        current: u64,
        window_ms: u64,
    },
    /// `State::TokenBucket`.
    TokenBucket {
        tokens: u64,
        at_ms: u64,
        window_ms: u64,
    },
    /// `State::LeakyBucket`.
    LeakyBucket {
        level: u64,
        at_ms: u64,
        window_ms: u64,
    },
}

impl StateInput {
    /// The latest instant the state names.
    fn latest_ms(&self) -> u64 {
        match *self {
            StateInput::FixedWindow { start_ms, .. }
            | StateInput::SlidingWindow { start_ms, .. } => start_ms,
            StateInput::TokenBucket { at_ms, .. } | StateInput::LeakyBucket { at_ms, .. } => at_ms,
        }
    }

    fn state(self) -> State {
        match self {
            StateInput::FixedWindow {
                start_ms,
                count,
                window_ms,
            } => State::FixedWindow {
                start_ms,
                end_ms: start_ms.saturating_add(window_ms),
                count,
                window_ms,
            },
            StateInput::SlidingWindow {
                start_ms,
                previous,
                current,
                window_ms,
            } => State::SlidingWindow {
                start_ms,
                previous,
                current,
                window_ms,
            },
            StateInput::TokenBucket {
                tokens,
                at_ms,
                window_ms,
            } => State::TokenBucket {
                tokens,
                at_ms,
                window_ms,
            },
            StateInput::LeakyBucket {
                level,
                at_ms,
                window_ms,
            } => State::LeakyBucket {
                level,
                at_ms,
                window_ms,
            },
        }
    }
}

/// One step of a key's life.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Step {
    /// Decide `cost` at the current instant.
    Decide(Number),
    /// Peek `cost` at the current instant.
    Peek(Number),
    /// Move the clock forward.
    Advance(Number),
    /// Move the clock back (a clock step; time must not run back for the
    /// key).
    Back(u16),
    /// Replace the policy, as a reload does; ignored when invalid.
    Reload(PolicyInput),
}

/// A whole input.
#[derive(Arbitrary, Clone, Debug)]
pub struct Input {
    policy: PolicyInput,
    start_ms: Number,
    /// Whether `start_ms` is offset from 2026 (otherwise it is taken as is).
    near_now: bool,
    state: Option<StateInput>,
    steps: Vec<Step>,
}

/// Decodes a structured input from `data` and runs it.
pub fn run(data: &[u8]) {
    if let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) {
        run_input(&input);
    }
}

/// Runs one input's steps, checking every decision.
pub fn run_input(input: &Input) {
    let Some(mut policy) = input.policy.policy() else {
        return;
    };
    let mut now = if input.near_now {
        1_767_225_600_000_u64.saturating_add(input.start_ms.get() % (1 << 40))
    } else {
        input.start_ms.get()
    };
    // Whether the state is one quotad made: exactness is promised for those.
    let made = input.state.is_none();
    let mut state = input.state.map(StateInput::state);
    // Whether any instant seen so far is near the end of u64 time.
    let mut far = input.state.is_some_and(|s| s.latest_ms() >= EXACT_UNTIL_MS);
    for step in input.steps.iter().take(256) {
        far |= now >= EXACT_UNTIL_MS;
        let check = if far {
            check_decision_saturated
        } else {
            check_decision
        };
        match *step {
            Step::Decide(cost) => state = decide_step(&policy, state, now, cost, made, far),
            Step::Peek(cost) => {
                let cost = cost_of(cost);
                let decision = peek(&policy, state.as_ref(), now, cost);
                check(&decision, policy.capacity(), cost.get());
            }
            Step::Advance(by) => now = now.saturating_add(by.get()),
            Step::Back(by) => now = now.saturating_sub(u64::from(by)),
            Step::Reload(next) => {
                if let Some(next) = next.policy() {
                    policy = next;
                }
            }
        }
    }
}

fn cost_of(cost: Number) -> NonZeroU64 {
    NonZeroU64::new(cost.get()).unwrap_or(NonZeroU64::MIN)
}

/// Decides one step: `made` when the state is quotad's own, `far` when an
/// instant seen is near the end of u64 time.
fn decide_step(
    policy: &Policy,
    state: Option<State>,
    now: u64,
    cost: Number,
    made: bool,
    far: bool,
) -> Option<State> {
    let check = if far {
        check_decision_saturated
    } else {
        check_decision
    };
    let cost = cost_of(cost);
    let capacity = policy.capacity();
    let one = NonZeroU64::MIN;
    let before = peek(policy, state.as_ref(), now, one);
    let peeked = peek(policy, state.as_ref(), now, cost);
    let (state, decision) = decide(policy, state, now, cost);
    check(&decision, capacity, cost.get());
    check(&peeked, capacity, cost.get());
    assert_eq!(
        (peeked.allowed, peeked.reason, peeked.retry_after_ms),
        (decision.allowed, decision.reason, decision.retry_after_ms),
        "peek and decide disagree"
    );
    let after = peek(policy, state.as_ref(), now, one);
    if decision.allowed && made && !far {
        assert_eq!(
            after.remaining, decision.remaining,
            "the state kept is not the one decided"
        );
    } else if !decision.allowed {
        assert_eq!(peeked, decision, "a denial is what peek said");
        // A state from outside may be brought into line by any decision (a
        // window start aligned, which changes what it counts): only quotad's
        // own states are held to this.
        if made && !far {
            assert_eq!(after, before, "a denial changed the key");
        }
    }
    if made && !far {
        check_times(policy, state.as_ref(), now, cost, &decision);
    }
    state
}

/// The retry time is the first instant the cost fits, and at the reset
/// time the key decides as a fresh one.
fn check_times(
    policy: &Policy,
    state: Option<&State>,
    now: u64,
    cost: NonZeroU64,
    decision: &quotad_core::Decision,
) {
    if decision.reason == Reason::LimitExceeded {
        let at = now + decision.retry_after_ms;
        assert!(
            peek(policy, state, at, cost).allowed,
            "not admitted at the retry time: {decision:?}"
        );
        assert!(
            !peek(policy, state, at - 1, cost).allowed,
            "admitted before the retry time: {decision:?}"
        );
    }
    let fresh_at = now + decision.reset_after_ms;
    assert_eq!(
        peek(policy, state, fresh_at, NonZeroU64::MIN),
        peek(policy, None, fresh_at, NonZeroU64::MIN),
        "not fresh at the reset time: {decision:?}"
    );
}
