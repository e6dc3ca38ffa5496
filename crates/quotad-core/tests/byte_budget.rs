//! The byte budget: every key costs [`ENTRY_BYTES`], its long key and its
//! sliding log; a shard never holds more than its share, and `on_full`
//! decides what happens at the budget, for new keys and for logs that must
//! grow alike.

use std::sync::Arc;
use std::time::Duration;

use quotad_core::{
    Algorithm, BatchMode, CheckItem, ENTRY_BYTES, FakeClock, MemoryStore, OnFull, Policy, Reason,
    StoreConfig, StoreConfigError,
};

const NOW: u64 = 1_767_268_800_000;

fn store(max_keys: usize, max_bytes: usize, shards: usize, on_full: OnFull) -> MemoryStore {
    let config = StoreConfig::try_new(max_keys, shards, on_full)
        .and_then(|c| c.with_max_bytes(max_bytes))
        .expect("valid config");
    MemoryStore::new(config, Arc::new(FakeClock::new(NOW)))
}

fn per_hour(algorithm: Algorithm, limit: u64) -> Policy {
    Policy::try_new(algorithm, limit, Duration::from_secs(3_600), None).expect("valid policy")
}

fn log_policy(limit: u64) -> Policy {
    per_hour(Algorithm::SlidingLog, limit)
}

fn hourly(limit: u64) -> Policy {
    per_hour(Algorithm::FixedWindow, limit)
}

/// Fills `key`'s log with `entries` admissions, one per millisecond, on a
/// store whose clock is `clock`.
fn fill_log(store: &MemoryStore, clock: &FakeClock, key: &str, entries: u64) -> Vec<Reason> {
    let item = CheckItem::new("api", log_policy(entries), key, 1).expect("valid");
    (0..entries)
        .map(|_| {
            clock.advance(Duration::from_millis(1));
            store.check_one(&item).reason
        })
        .collect()
}

#[test]
fn a_budget_below_64_entries_is_refused_and_small_budgets_use_fewer_shards() {
    let config = StoreConfig::try_new(1_000_000, 64, OnFull::Deny).expect("valid");
    assert_eq!(
        config.with_max_bytes(6_143),
        Err(StoreConfigError::MaxBytesTooSmall {
            max_bytes: 6_143,
            min: 64 * ENTRY_BYTES
        })
    );
    let small = config.with_max_bytes(4 * 64 * ENTRY_BYTES).expect("valid");
    assert_eq!(small.shards(), 4);
    assert_eq!(small.max_bytes(), Some(4 * 64 * ENTRY_BYTES));
    assert_eq!(config.max_bytes(), None, "no byte budget unless set");
}

#[test]
fn a_flood_of_full_sliding_logs_never_takes_a_shard_past_its_byte_budget() {
    for on_full in [OnFull::Deny, OnFull::Evict] {
        let max_bytes = 1 << 20;
        let clock = Arc::new(FakeClock::new(NOW));
        let config = StoreConfig::try_new(100_000, 8, on_full)
            .and_then(|c| c.with_max_bytes(max_bytes))
            .expect("valid config");
        let store = MemoryStore::new(config, clock.clone());
        // 200 keys of 1,000 entries would take some 3.2 MB.
        let mut capacity = 0;
        for k in 0..200 {
            let reasons = fill_log(&store, &clock, &format!("flood-{k}"), 1_000);
            capacity += reasons.iter().filter(|&&r| r == Reason::Capacity).count();
            assert!(
                store.used_bytes() <= max_bytes,
                "{on_full:?}: {} bytes after key {k}",
                store.used_bytes()
            );
        }
        assert!(
            store.used_bytes() > max_bytes / 2,
            "{on_full:?} filled the budget"
        );
        match on_full {
            OnFull::Deny => assert!(capacity > 0 && store.evictions() == 0),
            OnFull::Evict => assert!(capacity == 0 && store.evictions() > 0),
        }
    }
}

#[test]
fn long_keys_cost_their_heap_bytes() {
    let used = |key_len: usize| {
        let store = store(100_000, 1 << 20, 1, OnFull::Deny);
        let pad = "x".repeat(key_len);
        for i in 0..10 {
            let key = format!("{i}{pad}");
            let item = CheckItem::new("api", hourly(10), &key, 1).expect("valid");
            assert!(store.check_one(&item).allowed);
        }
        store.used_bytes()
    };
    // Ten keys take the same table slots; "api", NUL and a 257-byte key
    // add 261 heap bytes each, and an 11-byte one none (it is inline).
    assert_eq!(used(256) - used(10), 10 * 261);
    assert_eq!(
        used(10) % ENTRY_BYTES,
        0,
        "short keys cost table slots only"
    );
}

#[test]
fn long_keys_fill_a_byte_budget_sooner() {
    let budget = 64 * 1024;
    let admitted = |key_len: usize| {
        let store = store(100_000, budget, 1, OnFull::Deny);
        let pad = "x".repeat(key_len);
        let n = (0..10_000)
            .take_while(|i| {
                let key = format!("{i:05}{pad}");
                let d =
                    store.check_one(&CheckItem::new("api", hourly(10), &key, 1).expect("valid"));
                d.allowed
            })
            .count();
        assert!(store.used_bytes() <= budget);
        n
    };
    // Short keys cost a slot each: 682 of them fill 64 KiB.
    assert_eq!(admitted(0), budget / ENTRY_BYTES);
    // Keys of 256 bytes cost 356 bytes and their slot: at most 184 fit,
    // fewer when the table doubled into room their keys would have used.
    let long = admitted(251);
    assert!(long <= budget / (ENTRY_BYTES + 260), "{long}");
    assert!(long >= budget / (ENTRY_BYTES + 260) * 3 / 4, "{long}");
}

/// A one-shard store whose budget a 600-entry log nearly fills, with the
/// log `hog` at 300 entries (its allocation full) and nothing else.
fn store_with_a_log_at_its_allocation(on_full: OnFull) -> (Arc<FakeClock>, MemoryStore) {
    let clock = Arc::new(FakeClock::new(NOW));
    let config = StoreConfig::try_new(1_000, 1, on_full)
        .and_then(|c| c.with_max_bytes(9_000))
        .expect("valid config");
    let store = MemoryStore::new(config, clock.clone());
    let item = CheckItem::new("api", log_policy(600), "hog", 1).expect("valid");
    for _ in 0..256 {
        clock.advance(Duration::from_millis(1));
        assert!(store.check_one(&item).allowed);
    }
    (clock, store)
}

/// Fills what `store` has free with hourly fixed-window keys `small-0`,
/// `small-1`, ...; returns their names.
fn fill_with_small_keys(store: &MemoryStore, max_bytes: usize) -> Vec<String> {
    let policy = hourly(10);
    let mut keys = Vec::new();
    while store.used_bytes() + ENTRY_BYTES <= max_bytes {
        let key = format!("small-{}", keys.len());
        let d = store.check_one(&CheckItem::new("api", policy, &key, 1).expect("valid"));
        assert!(d.allowed, "{d:?}");
        keys.push(key);
    }
    keys
}

#[test]
fn at_the_budget_a_log_that_must_grow_is_denied_capacity_and_consumes_nothing() {
    let (clock, store) = store_with_a_log_at_its_allocation(OnFull::Deny);
    let hog = CheckItem::new("api", log_policy(600), "hog", 1).expect("valid");
    fill_with_small_keys(&store, 9_000);
    let used = store.used_bytes();
    // In the millisecond of its last admission, the log adds to that entry
    // and needs no room: at the budget, a log works within what it holds.
    assert!(store.check_one(&hog).allowed);
    assert_eq!(store.used_bytes(), used);
    // A new millisecond needs a new entry, past the log's allocation.
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        store.peek(&hog).reason,
        Reason::Capacity,
        "peek says what check would"
    );
    let d = store.check_one(&hog);
    assert!(!d.allowed);
    assert_eq!(d.reason, Reason::Capacity);
    assert_eq!(d.retry_after_ms, 0);
    assert_eq!(d.remaining, 600 - 257, "nothing consumed");
    assert_eq!(store.peek(&hog).remaining, 600 - 257);
    assert_eq!(store.used_bytes(), used);
    assert_eq!(store.evictions(), 0);
}

#[test]
fn at_the_budget_a_log_that_must_grow_evicts_others_in_evict_mode_never_itself() {
    let (clock, store) = store_with_a_log_at_its_allocation(OnFull::Evict);
    let hog = CheckItem::new("api", log_policy(600), "hog", 1).expect("valid");
    let small = fill_with_small_keys(&store, 9_000);
    assert_eq!(store.evictions(), 0);
    clock.advance(Duration::from_millis(1));
    assert!(store.peek(&hog).allowed);
    let d = store.check_one(&hog);
    assert!(d.allowed, "{d:?}");
    assert_eq!(d.remaining, 600 - 257);
    assert!(store.evictions() > 0, "room was made by evicting others");
    assert!(store.used_bytes() <= 9_000);
    assert_eq!(
        store.live_keys() as u64 + store.evictions(),
        small.len() as u64 + 1
    );
}

#[test]
fn an_all_or_nothing_batch_whose_log_cannot_grow_is_rejected_whole_and_evicts_nothing() {
    let (clock, store) = store_with_a_log_at_its_allocation(OnFull::Evict);
    let small = fill_with_small_keys(&store, 9_000);
    clock.advance(Duration::from_millis(1));
    // Every key of the shard is in the batch: room could only come from
    // evicting the batch's own keys.
    let hog = CheckItem::new("api", log_policy(600), "hog", 1).expect("valid");
    let mut items: Vec<CheckItem<'_>> = small
        .iter()
        .map(|k| CheckItem::new("api", hourly(10), k, 1).expect("valid"))
        .collect();
    items.push(hog);
    let live = store.live_keys();
    assert_eq!(live, items.len());
    let d = store.check(&items, BatchMode::AllOrNothing);
    assert_eq!(d.last().map(|d| d.reason), Some(Reason::Capacity));
    assert!(
        d[..small.len()]
            .iter()
            .all(|d| d.reason == Reason::BatchRejected)
    );
    assert_eq!(store.evictions(), 0);
    assert_eq!(store.live_keys(), live);
    assert_eq!(store.peek(&hog).remaining, 600 - 256, "nothing consumed");
    assert_eq!(store.peek(&items[0]).remaining, 9);
    // Alone, the log makes its room by evicting others.
    assert!(store.check_one(&hog).allowed);
    assert!(store.evictions() > 0);
}
