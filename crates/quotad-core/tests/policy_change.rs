//! What a changed policy (a hot reload) does to state saved under the old
//! one: counts (a leaky bucket's level) are kept and the new limit applies
//! at once; a token bucket keeps its tokens, capped at the new burst; a
//! changed window carries bucket levels over in whole tokens; a changed
//! algorithm starts the key fresh.

use std::num::NonZeroU64;
use std::time::Duration;

use quotad_core::{Algorithm, Policy, State, decide, peek};

const NOW: u64 = 1_767_268_800_000;

fn policy(algorithm: Algorithm, limit: u64, window_ms: u64) -> Policy {
    Policy::try_new(algorithm, limit, Duration::from_millis(window_ms), None).expect("valid")
}

fn spend(policy: &Policy, units: u64) -> Option<State> {
    let cost = NonZeroU64::new(units).expect("non-zero");
    let (state, d) = decide(policy, None, NOW, cost);
    assert!(d.allowed);
    state
}

fn remaining(policy: &Policy, state: &Option<State>) -> u64 {
    peek(policy, state.as_ref(), NOW, NonZeroU64::MIN).remaining
}

#[test]
fn a_changed_limit_keeps_the_count_and_applies_at_once() {
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::LeakyBucket,
    ] {
        // Five units used (for the leaky bucket: its level is five).
        let state = spend(&policy(algorithm, 10, 60_000), 5);
        assert_eq!(
            remaining(&policy(algorithm, 3, 60_000), &state),
            0,
            "{algorithm}"
        );
        assert_eq!(
            remaining(&policy(algorithm, 20, 60_000), &state),
            15,
            "{algorithm}"
        );
    }
}

#[test]
fn a_token_bucket_keeps_its_tokens_capped_at_the_new_burst() {
    let state = spend(&policy(Algorithm::TokenBucket, 10, 60_000), 5);
    let lower = policy(Algorithm::TokenBucket, 3, 60_000);
    assert_eq!(remaining(&lower, &state), 3);
    let higher = policy(Algorithm::TokenBucket, 20, 60_000);
    assert_eq!(
        remaining(&higher, &state),
        5,
        "and refills towards 20 from there"
    );
}

#[test]
fn a_changed_bucket_window_carries_whole_tokens_over() {
    for algorithm in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let state = spend(&policy(algorithm, 10, 1_000), 4);
        assert_eq!(
            remaining(&policy(algorithm, 10, 2_000), &state),
            6,
            "{algorithm}"
        );
        assert_eq!(
            remaining(&policy(algorithm, 10, 7), &state),
            6,
            "{algorithm}"
        );
    }
}

#[test]
fn a_changed_algorithm_starts_the_key_fresh() {
    let state = spend(&policy(Algorithm::FixedWindow, 10, 60_000), 10);
    assert_eq!(
        remaining(&policy(Algorithm::FixedWindow, 10, 60_000), &state),
        0
    );
    assert_eq!(
        remaining(&policy(Algorithm::SlidingWindow, 10, 60_000), &state),
        10
    );
}
