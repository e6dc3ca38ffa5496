//! What a changed policy (a hot reload) does to state saved under the old
//! one, the rule the Redis backend keeps too: a state written under another
//! algorithm or another window is fresh; a changed limit or burst keeps it
//! (counts and a leaky bucket's level are kept and the new limit applies at
//! once; a token bucket keeps its tokens, capped at the new burst).

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
fn a_changed_window_starts_the_key_fresh_for_every_algorithm() {
    for algorithm in Algorithm::RATES {
        let state = spend(&policy(algorithm, 10, 60_000), 10);
        assert_eq!(
            remaining(&policy(algorithm, 10, 60_000), &state),
            0,
            "{algorithm}"
        );
        // Longer, shorter, and a multiple whose windows contain the old one.
        for window in [120_000, 1_000, 59_999] {
            assert_eq!(
                remaining(&policy(algorithm, 10, window), &state),
                10,
                "{algorithm} over {window} ms"
            );
        }
    }
}

#[test]
fn a_state_counted_under_a_new_window_replaces_the_old_one() {
    // A key keeps one state: once counted over a second, the count over a
    // minute is gone, and a return to the minute starts it fresh. (A Redis
    // key per window keeps the minute's count until it is fresh instead.)
    let minute = policy(Algorithm::FixedWindow, 10, 60_000);
    let second = policy(Algorithm::FixedWindow, 10, 1_000);
    let state = spend(&minute, 10);
    let one = NonZeroU64::MIN;
    let (state, d) = decide(&second, state, NOW, one);
    assert!(d.allowed && d.remaining == 9, "{d:?}");
    assert!(state.as_ref().is_some_and(|s| s.counts_under(&second)));
    assert!(!state.as_ref().is_some_and(|s| s.counts_under(&minute)));
}

#[test]
fn a_changed_burst_keeps_the_bucket_capped_at_the_new_burst() {
    let bucket = |algorithm, burst| {
        Policy::try_new(algorithm, 10, Duration::from_millis(60_000), Some(burst)).expect("valid")
    };
    // Token bucket: 12 of a burst of 20 spent, 8 tokens left.
    let state = spend(&bucket(Algorithm::TokenBucket, 20), 12);
    assert_eq!(remaining(&bucket(Algorithm::TokenBucket, 5), &state), 5);
    assert_eq!(remaining(&bucket(Algorithm::TokenBucket, 30), &state), 8);
    // Leaky bucket: a level of 12; a burst of 5 holds nothing more until
    // it drains below 5, a burst of 30 has 18 of room.
    let state = spend(&bucket(Algorithm::LeakyBucket, 20), 12);
    assert_eq!(remaining(&bucket(Algorithm::LeakyBucket, 5), &state), 0);
    assert_eq!(remaining(&bucket(Algorithm::LeakyBucket, 30), &state), 18);
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
