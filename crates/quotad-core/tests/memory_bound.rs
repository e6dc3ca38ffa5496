//! The key table stays within `max_keys`: state equivalent to fresh goes
//! first, then `on_full` decides.

use std::sync::Arc;
use std::time::Duration;

use quotad_core::{
    Algorithm, BatchMode, CheckItem, FakeClock, MemoryStore, OnFull, Policy, Reason, StoreConfig,
};

const MAX_KEYS: usize = 1_024;

fn store(on_full: OnFull) -> (Arc<FakeClock>, MemoryStore) {
    let clock = Arc::new(FakeClock::new(1_767_268_800_000));
    let config = StoreConfig::try_new(MAX_KEYS, 8, on_full).expect("valid config");
    (clock.clone(), MemoryStore::new(config, clock))
}

fn per(window: Duration) -> Policy {
    Policy::try_new(Algorithm::FixedWindow, 100, window, None).expect("valid policy")
}

#[test]
fn twice_max_keys_distinct_keys_never_hold_more_than_max_keys() {
    for on_full in [OnFull::Deny, OnFull::Evict] {
        let (_, store) = store(on_full);
        let policy = per(Duration::from_secs(3_600));
        for i in 0..2 * MAX_KEYS {
            let key = format!("key-{i}");
            store.check_one(&CheckItem::new("api", policy, &key, 1).expect("valid"));
            assert!(store.live_keys() <= MAX_KEYS, "{on_full:?} after {i}");
        }
        assert!(store.live_keys() > MAX_KEYS / 2, "{on_full:?} is not empty");
    }
}

#[test]
fn on_full_deny_refuses_new_keys_with_reason_capacity_but_serves_existing_ones() {
    let (_, store) = store(OnFull::Deny);
    let policy = per(Duration::from_secs(3_600));
    let mut denied = None;
    for i in 0..2 * MAX_KEYS {
        let key = format!("key-{i}");
        let d = store.check_one(&CheckItem::new("api", policy, &key, 1).expect("valid"));
        if !d.allowed {
            denied = Some((key, d));
            break;
        }
    }
    let (key, d) = denied.expect("a new key is refused once full");
    assert_eq!(d.reason, Reason::Capacity);
    let peeked = store.peek(&CheckItem::new("api", policy, &key, 1).expect("valid"));
    assert_eq!(
        peeked.reason,
        Reason::Capacity,
        "peek says what check would"
    );
    assert_eq!(store.evictions(), 0);
    let again = store.check_one(&CheckItem::new("api", policy, &key, 1).expect("valid"));
    assert_eq!(
        again.reason,
        Reason::Capacity,
        "the refused key was not stored"
    );
    let old = store.check_one(&CheckItem::new("api", policy, "key-0", 1).expect("valid"));
    assert!(old.allowed);
    assert_eq!(old.remaining, 98);
}

#[test]
fn on_full_deny_refuses_an_all_or_nothing_batch_that_needs_a_new_key() {
    let (_, store) = store(OnFull::Deny);
    let policy = per(Duration::from_secs(3_600));
    let mut i = 0;
    // Fill until some key is refused.
    let refused = loop {
        let key = format!("key-{i}");
        i += 1;
        let d = store.check_one(&CheckItem::new("api", policy, &key, 1).expect("valid"));
        if !d.allowed {
            break key;
        }
    };
    let live = store.live_keys();
    let items = [
        CheckItem::new("api", policy, "key-0", 1).expect("valid"),
        CheckItem::new("api", policy, &refused, 1).expect("valid"),
    ];
    let d = store.check(&items, BatchMode::AllOrNothing);
    assert_eq!(d[1].reason, Reason::Capacity);
    assert_eq!(d[0].reason, Reason::BatchRejected);
    assert_eq!(store.live_keys(), live);
    let key0 = CheckItem::new("api", policy, "key-0", 1).expect("valid");
    assert_eq!(store.peek(&key0).remaining, 99, "nothing was consumed");
}

#[test]
fn on_full_evict_makes_room_and_counts_every_eviction() {
    let (_, store) = store(OnFull::Evict);
    let policy = per(Duration::from_secs(3_600));
    for i in 0..2 * MAX_KEYS {
        let key = format!("key-{i}");
        let d = store.check_one(&CheckItem::new("api", policy, &key, 1).expect("valid"));
        assert!(d.allowed, "evict mode admits new keys");
    }
    let live = store.live_keys() as u64;
    assert_eq!(live + store.evictions(), 2 * MAX_KEYS as u64);
    assert!(store.evictions() >= MAX_KEYS as u64);
}

#[test]
fn expired_state_is_reclaimed_before_anything_live_is_evicted() {
    // One shard, so the table is full at exactly MAX_KEYS.
    let clock = Arc::new(FakeClock::new(1_767_268_800_000));
    let config = StoreConfig::try_new(MAX_KEYS, 1, OnFull::Evict).expect("valid config");
    let store = MemoryStore::new(config, clock.clone());
    let short = per(Duration::from_secs(1));
    let long = per(Duration::from_secs(3_600));
    // Half the table holds long-lived state, half short-lived.
    for i in 0..MAX_KEYS {
        let key = format!("key-{i}");
        let policy = if i % 2 == 0 { long } else { short };
        store.check_one(&CheckItem::new("api", policy, &key, 1).expect("valid"));
    }
    assert_eq!(store.live_keys(), MAX_KEYS);
    clock.advance(Duration::from_secs(2));
    for i in 0..MAX_KEYS / 2 {
        let key = format!("new-{i}");
        store.check_one(&CheckItem::new("api", long, &key, 1).expect("valid"));
    }
    assert_eq!(store.evictions(), 0, "nothing live was evicted");
    assert_eq!(store.reclaimed(), (MAX_KEYS / 2) as u64);
    for i in (0..MAX_KEYS).step_by(2) {
        let key = format!("key-{i}");
        let item = CheckItem::new("api", long, &key, 1).expect("valid");
        assert_eq!(store.peek(&item).remaining, 99, "{key} kept its state");
    }
    // Only now, with nothing left to reclaim, does a new key evict.
    store.check_one(&CheckItem::new("api", long, "one-more", 1).expect("valid"));
    assert_eq!(store.evictions(), 1);
    assert_eq!(store.live_keys(), MAX_KEYS);
}

#[test]
fn the_sweep_drops_fresh_state_one_shard_at_a_time() {
    let (clock, store) = store(OnFull::Deny);
    let short = per(Duration::from_secs(1));
    for i in 0..500 {
        let key = format!("key-{i}");
        store.check_one(&CheckItem::new("api", short, &key, 1).expect("valid"));
    }
    assert_eq!(store.live_keys(), 500);
    assert_eq!(store.sweep_step(), 0, "nothing is fresh yet");
    clock.advance(Duration::from_secs(1));
    let shards = store.config().shards();
    let mut dropped = 0;
    for step in 0..shards {
        dropped += store.sweep_step();
        assert!(store.live_keys() >= 500 - dropped, "step {step}");
    }
    assert_eq!(dropped, 500);
    assert_eq!(store.live_keys(), 0);
}

#[test]
fn a_tiny_table_holds_exactly_max_keys() {
    for max_keys in [1, 2, 15, 16, 17] {
        let clock = Arc::new(FakeClock::new(1_767_268_800_000));
        let config = StoreConfig::try_new(max_keys, 64, OnFull::Deny).expect("valid config");
        let store = MemoryStore::new(config, clock);
        let policy = per(Duration::from_secs(3_600));
        for i in 0..max_keys + 3 {
            let key = format!("key-{i}");
            let d = store.check_one(&CheckItem::new("api", policy, &key, 1).expect("valid"));
            assert_eq!(d.allowed, i < max_keys, "max_keys {max_keys}, key {i}");
        }
        assert_eq!(store.live_keys(), max_keys);
    }
}

/// A full one-shard store of 16 keys under `policy`, each with 1 unit used.
fn full_store(on_full: OnFull, policy: Policy) -> MemoryStore {
    let clock = Arc::new(FakeClock::new(1_767_268_800_000));
    let config = StoreConfig::try_new(16, 1, on_full).expect("valid config");
    let store = MemoryStore::new(config, clock);
    for i in 0..16 {
        let key = format!("key-{i}");
        assert!(
            store
                .check_one(&CheckItem::new("api", policy, &key, 1).expect("valid"))
                .allowed
        );
    }
    store
}

#[test]
fn a_rejected_all_or_nothing_batch_evicts_nothing() {
    let policy = per(Duration::from_secs(3_600));
    let store = full_store(OnFull::Evict, policy);
    let items = [
        CheckItem::new("api", policy, "newcomer", 1).expect("valid"),
        CheckItem::new("api", policy, "key-0", 101).expect("valid"),
    ];
    let d = store.check(&items, BatchMode::AllOrNothing);
    assert_eq!(d[1].reason, Reason::CostExceedsCapacity);
    assert_eq!(d[0].reason, Reason::BatchRejected);
    assert_eq!(store.evictions(), 0);
    assert_eq!(store.live_keys(), 16);
    for i in 0..16 {
        let key = format!("key-{i}");
        let item = CheckItem::new("api", policy, &key, 1).expect("valid");
        assert_eq!(store.peek(&item).remaining, 99, "{key} kept its state");
    }
}

#[test]
fn an_all_or_nothing_batch_never_evicts_its_own_keys_nor_overfills() {
    let policy = per(Duration::from_secs(3_600));
    let store = full_store(OnFull::Evict, policy);
    let keys: Vec<String> = (0..16)
        .map(|i| format!("key-{i}"))
        .chain((0..8).map(|i| format!("new-{i}")))
        .collect();
    let items: Vec<CheckItem<'_>> = keys
        .iter()
        .map(|k| CheckItem::new("api", policy, k, 1).expect("valid"))
        .collect();
    let d = store.check(&items, BatchMode::AllOrNothing);
    assert!(
        d.iter().all(|d| !d.allowed),
        "no room without evicting the batch itself"
    );
    assert!(d[16..].iter().all(|d| d.reason == Reason::Capacity));
    assert_eq!(store.evictions(), 0);
    assert_eq!(store.live_keys(), 16);

    // With strangers to evict, the batch commits, within the bound.
    let small: Vec<CheckItem<'_>> = items[14..18].to_vec();
    let d = store.check(&small, BatchMode::AllOrNothing);
    assert!(d.iter().all(|d| d.allowed));
    assert_eq!(store.evictions(), 2);
    assert_eq!(store.live_keys(), 16);
    for item in &small {
        assert_eq!(
            store.peek(item).remaining,
            98 + u64::from(item.key().starts_with("new"))
        );
    }
}

/// A full one-shard store (`on_full = deny`) of 16 keys, `key-i` having
/// used `used(i)` of 100 under a window of an hour, but `key-0` under a
/// window of a second, which has ended: room comes from dropping it, which
/// moves every entry after it. Returns the store and the hour's policy.
fn full_store_with_one_spent(used: impl Fn(u64) -> u64) -> (MemoryStore, Policy) {
    let clock = Arc::new(FakeClock::new(1_767_268_800_000));
    let config = StoreConfig::try_new(16, 1, OnFull::Deny).expect("valid config");
    let store = MemoryStore::new(config, clock.clone());
    let (short, long) = (per(Duration::from_secs(1)), per(Duration::from_secs(3_600)));
    for i in 0..16u64 {
        let key = format!("key-{i}");
        let policy = if i == 0 { short } else { long };
        let item = CheckItem::new("api", policy, &key, used(i)).expect("valid");
        assert!(store.check_one(&item).allowed);
    }
    clock.advance(Duration::from_secs(2));
    (store, long)
}

#[test]
fn an_all_or_nothing_batch_that_makes_room_by_dropping_spent_state_writes_each_key_where_it_is() {
    let (store, long) = full_store_with_one_spent(|_| 1);
    let items = [
        CheckItem::new("api", long, "key-15", 1).expect("valid"),
        CheckItem::new("api", long, "newcomer", 1).expect("valid"),
    ];
    let d = store.check(&items, BatchMode::AllOrNothing);
    assert!(d.iter().all(|d| d.allowed), "{d:?}");
    assert_eq!(store.reclaimed(), 1, "the spent key made the room");
    assert_eq!(store.live_keys(), 16);
    for i in 1..16 {
        let key = format!("key-{i}");
        let item = CheckItem::new("api", long, &key, 1).expect("valid");
        let used = if i == 15 { 2 } else { 1 };
        assert_eq!(store.peek(&item).remaining, 100 - used, "{key}");
    }
    assert_eq!(store.peek(&items[1]).remaining, 99, "newcomer");
}

#[test]
fn a_batch_refused_for_room_answers_from_the_state_it_started_from_after_entries_moved() {
    // Each key used a different amount, so a state read from the wrong
    // entry shows; dropping the spent key frees one key of the two needed.
    let (store, long) = full_store_with_one_spent(|i| i.max(1));
    let items = [
        CheckItem::new("api", long, "key-15", 1).expect("valid"),
        CheckItem::new("api", long, "new-a", 1).expect("valid"),
        CheckItem::new("api", long, "new-b", 1).expect("valid"),
    ];
    let d = store.check(&items, BatchMode::AllOrNothing);
    assert_eq!(store.reclaimed(), 1, "the spent key was dropped");
    assert_eq!(d[1].reason, Reason::Capacity);
    assert_eq!(d[2].reason, Reason::Capacity);
    assert_eq!(d[0].reason, Reason::BatchRejected);
    assert_eq!(d[0].remaining, 85, "key-15 as it was: 15 used");
    for i in 1..16u64 {
        let key = format!("key-{i}");
        let item = CheckItem::new("api", long, &key, 1).expect("valid");
        assert_eq!(store.peek(&item).remaining, 100 - i, "{key} unchanged");
    }
}
