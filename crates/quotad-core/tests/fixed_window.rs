//! The fixed-window rules, through the store as a caller sees them.

use std::sync::Arc;
use std::time::Duration;

use quotad_core::{
    Algorithm, CheckItem, FakeClock, InvalidItem, MemoryStore, OnFull, Policy, Reason, State,
    StoreConfig, decide,
};

/// 2026-01-01 12:00:30 UTC.
const NOON_30: u64 = 1_767_268_830_000;
const MINUTE: u64 = 60_000;

fn per_minute(limit: u64) -> Policy {
    Policy::try_new(
        Algorithm::FixedWindow,
        limit,
        Duration::from_millis(MINUTE),
        None,
    )
    .expect("valid policy")
}

fn store_at(now: u64) -> (Arc<FakeClock>, MemoryStore) {
    let clock = Arc::new(FakeClock::new(now));
    let config = StoreConfig::try_new(1_000, 16, OnFull::Deny).expect("valid config");
    let store = MemoryStore::new(config, clock.clone());
    (clock, store)
}

fn item<'a>(policy: Policy, key: &'a str, cost: u64) -> CheckItem<'a> {
    CheckItem::new("api", policy, key, cost).expect("valid item")
}

#[test]
fn allows_ten_with_remaining_nine_to_zero_then_denies_the_eleventh() {
    let (_, store) = store_at(NOON_30);
    let unit = item(per_minute(10), "alice", 1);
    for expected_remaining in (0..10).rev() {
        let d = store.check_one(&unit);
        assert!(d.allowed);
        assert_eq!(d.remaining, expected_remaining);
        assert_eq!(d.limit, 10);
        assert_eq!(d.reason, Reason::WithinLimit);
    }
    let eleventh = store.check_one(&unit);
    assert!(!eleventh.allowed);
    assert_eq!(eleventh.reason, Reason::LimitExceeded);
    assert_eq!(eleventh.remaining, 0);
}

#[test]
fn a_denial_at_12_00_30_retries_after_30_s_and_resets_at_12_01_00() {
    let (_, store) = store_at(NOON_30);
    let unit = item(per_minute(10), "alice", 1);
    for _ in 0..10 {
        store.check_one(&unit);
    }
    let denied = store.check_one(&unit);
    assert_eq!(denied.retry_after_ms, 30_000);
    // Reset is the window's end (12:01:00), not a minute after the first
    // request (12:01:30).
    assert_eq!(NOON_30 + denied.reset_after_ms, NOON_30 + 30_000);
}

#[test]
fn keys_are_counted_apart() {
    let (_, store) = store_at(NOON_30);
    let policy = per_minute(10);
    for _ in 0..10 {
        store.check_one(&item(policy, "alice", 1));
    }
    assert!(!store.check_one(&item(policy, "alice", 1)).allowed);
    let bob = store.check_one(&item(policy, "bob", 1));
    assert!(bob.allowed);
    assert_eq!(bob.remaining, 9);
}

#[test]
fn one_key_under_two_policies_has_two_states() {
    let (_, store) = store_at(NOON_30);
    let policy = per_minute(1);
    let a = CheckItem::new("login", policy, "alice", 1).expect("valid");
    let b = CheckItem::new("search", policy, "alice", 1).expect("valid");
    assert!(store.check_one(&a).allowed);
    assert!(store.check_one(&b).allowed);
    assert!(!store.check_one(&a).allowed);
}

#[test]
fn the_next_window_starts_fresh() {
    let (clock, store) = store_at(NOON_30);
    let unit = item(per_minute(10), "alice", 1);
    for _ in 0..11 {
        store.check_one(&unit);
    }
    clock.advance(Duration::from_secs(30));
    let d = store.check_one(&unit);
    assert!(d.allowed);
    assert_eq!(d.remaining, 9);
}

#[test]
fn twenty_pass_across_a_boundary_the_fixed_window_burst_kept_on_purpose() {
    // Ten at 12:00:59.999 and ten at 12:01:00.000: twice the limit within
    // two milliseconds. This is the known cost of a fixed window.
    let (clock, store) = store_at(NOON_30 + 29_999);
    let unit = item(per_minute(10), "alice", 1);
    let mut allowed = 0;
    for _ in 0..10 {
        allowed += u32::from(store.check_one(&unit).allowed);
    }
    clock.advance(Duration::from_millis(1));
    for _ in 0..10 {
        allowed += u32::from(store.check_one(&unit).allowed);
    }
    assert_eq!(allowed, 20);
}

#[test]
fn cost_zero_is_an_error_and_creates_no_state() {
    let (_, store) = store_at(NOON_30);
    let err = CheckItem::new("api", per_minute(10), "alice", 0);
    assert_eq!(err.err(), Some(InvalidItem::ZeroCost));
    assert_eq!(store.live_keys(), 0);
}

#[test]
fn a_cost_above_2_pow_53_is_an_error_every_backend_could_not_compute_exactly() {
    let policy = per_minute(10);
    let too_big = quotad_core::MAX_EXACT + 1;
    assert_eq!(
        CheckItem::new("api", policy, "alice", too_big).err(),
        Some(InvalidItem::CostTooLarge)
    );
    assert!(CheckItem::new("api", policy, "alice", quotad_core::MAX_EXACT).is_ok());
}

#[test]
fn an_empty_key_or_a_bad_policy_name_is_an_error() {
    let policy = per_minute(10);
    assert_eq!(
        CheckItem::new("api", policy, "", 1).err(),
        Some(InvalidItem::EmptyKey)
    );
    assert_eq!(
        CheckItem::new("", policy, "k", 1).err(),
        Some(InvalidItem::PolicyName)
    );
    assert_eq!(
        CheckItem::new("a\0b", policy, "k", 1).err(),
        Some(InvalidItem::PolicyName)
    );
}

#[test]
fn an_oversized_cost_is_denied_without_consuming_or_creating_state() {
    let (_, store) = store_at(NOON_30);
    let policy = per_minute(10);
    let big = store.check_one(&item(policy, "alice", 11));
    assert!(!big.allowed);
    assert_eq!(big.reason, Reason::CostExceedsCapacity);
    assert_eq!(big.retry_after_ms, 0);
    assert_eq!(store.live_keys(), 0);

    store.check_one(&item(policy, "alice", 4));
    let big = store.check_one(&item(policy, "alice", 11));
    assert_eq!(big.reason, Reason::CostExceedsCapacity);
    assert_eq!(big.remaining, 6);
    let rest = store.check_one(&item(policy, "alice", 6));
    assert!(rest.allowed, "the oversized request consumed nothing");
}

#[test]
fn a_huge_stored_count_cannot_overflow_into_an_allow() {
    let policy = per_minute(10);
    let start = NOON_30 - 30_000;
    for count in [11, u64::MAX - 5, u64::MAX] {
        let state = State::FixedWindow {
            start_ms: start,
            end_ms: start + 60_000,
            count,
            window_ms: 60_000,
        };
        for cost in [1, 10] {
            let cost = std::num::NonZeroU64::new(cost).expect("non-zero");
            let (_, d) = decide(&policy, Some(state.clone()), NOON_30, cost);
            assert!(!d.allowed, "count {count} cost {cost}");
            assert_eq!(d.remaining, 0);
        }
    }
}

#[test]
fn a_clock_that_steps_back_neither_panics_nor_refunds() {
    let (clock, store) = store_at(NOON_30);
    let unit = item(per_minute(10), "alice", 1);
    for _ in 0..10 {
        store.check_one(&unit);
    }
    // Back into the previous minute: the key's window has not ended for it.
    clock.set(NOON_30 - 45_000);
    let d = store.check_one(&unit);
    assert!(!d.allowed);
    // The wait is measured on the clock as it reads now.
    assert_eq!(d.retry_after_ms, 75_000);
    clock.set(0);
    assert!(!store.check_one(&unit).allowed);
}

#[test]
fn peek_consumes_nothing_and_creates_nothing() {
    let (_, store) = store_at(NOON_30);
    let unit = item(per_minute(2), "alice", 1);
    let p = store.peek(&unit);
    assert!(p.allowed);
    assert_eq!(p.remaining, 2);
    assert_eq!(store.live_keys(), 0);
    store.check_one(&unit);
    let p = store.peek(&unit);
    assert_eq!((p.allowed, p.remaining), (true, 1));
    store.check_one(&unit);
    let p = store.peek(&unit);
    assert_eq!(
        (p.allowed, p.remaining, p.retry_after_ms),
        (false, 0, 30_000)
    );
}

#[test]
fn reset_gives_the_key_a_full_budget() {
    let (_, store) = store_at(NOON_30);
    let unit = item(per_minute(1), "alice", 1);
    store.check_one(&unit);
    assert!(!store.check_one(&unit).allowed);
    assert!(store.reset("api", "alice"));
    assert!(store.check_one(&unit).allowed);
    assert!(!store.reset("api", "nobody"));
}
