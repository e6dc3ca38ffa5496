//! `Spend::Always`: a denial spends what is left of the budget.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use quotad_core::{
    Algorithm, BatchMode, CheckItem, FakeClock, MemoryStore, OnFull, Policy, Reason, Spend,
    StoreConfig, decide, decide_spending,
};

/// Far from the epoch, as real time is.
const START: u64 = 1_767_268_800_000;

fn hits(n: u64) -> NonZeroU64 {
    NonZeroU64::new(n).expect("hits are generated >= 1")
}

fn policy(algorithm: Algorithm, limit: u64, window_ms: u64) -> Policy {
    Policy::try_new(algorithm, limit, Duration::from_millis(window_ms), None).expect("valid")
}

proptest! {
    /// A counter that counts every hit, admitted or not, and answers "over"
    /// once the count passes the limit (envoyproxy/ratelimit's fixed
    /// window), decides exactly as a fixed window that spends on denial.
    #[test]
    fn a_fixed_window_spending_on_denial_decides_as_a_counter_of_every_hit(
        limit in 1u64..=20,
        window in prop_oneof![Just(1_000u64), 1u64..=50],
        traffic in prop::collection::vec((0u64..=30, 1u64..=25), 1..150),
    ) {
        let policy = policy(Algorithm::FixedWindow, limit, window);
        let (mut state, mut now) = (None, START);
        let (mut counted, mut counted_window) = (0u64, START - START % window);
        for (step, n) in traffic {
            now += step;
            let start = now - now % window;
            if start != counted_window {
                (counted, counted_window) = (0, start);
            }
            counted += n;
            let (next, decision) = decide_spending(&policy, state, now, hits(n), Spend::Always);
            state = next;
            prop_assert_eq!(decision.allowed, counted <= limit, "at {} with {} hits", now, n);
            let remaining = limit.saturating_sub(counted);
            prop_assert_eq!(decision.remaining, remaining);
        }
    }
}

#[test]
fn every_algorithm_spends_what_is_left_on_a_denial_and_only_then() {
    for algorithm in Algorithm::RATES {
        let policy = policy(algorithm, 10, 60_000);
        let (state, first) = decide(&policy, None, START, hits(7));
        assert!(first.allowed, "{algorithm}");
        // 5 do not fit in the 3 left.
        let (kept, denied) = decide(&policy, state.clone(), START, hits(5));
        assert_eq!(
            (denied.allowed, denied.remaining),
            (false, 3),
            "{algorithm}"
        );
        assert_eq!(kept, state, "{algorithm}: a plain denial changes nothing");

        let (spent, denied) = decide_spending(&policy, state, START, hits(5), Spend::Always);
        assert_eq!(
            (denied.allowed, denied.reason, denied.remaining),
            (false, Reason::LimitExceeded, 0),
            "{algorithm}"
        );
        let (_, next) = decide(&policy, spent.clone(), START, hits(1));
        assert!(!next.allowed, "{algorithm}: nothing is left");
        // The wait is for the budget as spent: as long as for all 5 from
        // an empty budget.
        let (_, from_empty) = decide(&policy, spent, START, hits(5));
        assert_eq!(
            denied.retry_after_ms, from_empty.retry_after_ms,
            "{algorithm}"
        );

        // A cost above the capacity spends the whole budget too.
        let (state, over) = decide_spending(&policy, None, START, hits(11), Spend::Always);
        assert_eq!(
            (over.allowed, over.reason),
            (false, Reason::CostExceedsCapacity)
        );
        let (_, after) = decide(&policy, state, START, hits(1));
        assert!(!after.allowed, "{algorithm}");
    }
}

#[test]
fn the_memory_store_spends_per_item_and_never_in_a_rejected_all_or_nothing_batch() {
    let clock = Arc::new(FakeClock::new(START));
    let config = StoreConfig::try_new(1_000, 4, OnFull::Deny).expect("valid");
    let store = MemoryStore::new(config, clock);
    let p = policy(Algorithm::FixedWindow, 10, 60_000);
    let item = |key, n| CheckItem::new("p", p, key, n).expect("valid");

    assert!(store.check_one(&item("a", 8)).allowed);
    let spending = item("a", 5).with_spend(Spend::Always);
    assert_eq!(spending.spend(), Spend::Always);
    assert!(!store.check_one(&spending).allowed);
    assert_eq!(store.peek(&item("a", 1)).remaining, 0);

    // Independent: each denied item spends; the admitted one counts.
    assert!(store.check_one(&item("b", 8)).allowed);
    let batch = [
        item("b", 5).with_spend(Spend::Always),
        item("c", 1).with_spend(Spend::Always),
    ];
    let decided = store.check(&batch, BatchMode::Independent);
    assert_eq!((decided[0].allowed, decided[1].allowed), (false, true));
    assert_eq!(store.peek(&item("b", 1)).remaining, 0);
    assert_eq!(store.peek(&item("c", 1)).remaining, 9);

    // All or nothing: a rejected batch commits nothing, spending included.
    assert!(store.check_one(&item("d", 8)).allowed);
    let batch = [
        item("d", 5).with_spend(Spend::Always),
        item("e", 1).with_spend(Spend::Always),
    ];
    let decided = store.check(&batch, BatchMode::AllOrNothing);
    assert!(decided.iter().all(|d| !d.allowed));
    assert_eq!(store.peek(&item("d", 1)).remaining, 2);
    assert_eq!(store.peek(&item("e", 1)).remaining, 10);
}
