//! Snapshots of the memory store: a restore decides as an uninterrupted
//! store would, a snapshot taken under load holds every key once, and a
//! damaged snapshot is refused with its own error.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use proptest::prelude::*;
use quotad_core::{
    Algorithm, CheckItem, Decision, FakeClock, LoadReport, MemoryStore, OnFull, Policy,
    SNAPSHOT_VERSION, SnapshotError, SnapshotReader, StoreConfig,
};

/// 2026-01-01 12:00:00 UTC.
const NOON: u64 = 1_767_268_800_000;

fn config(max_keys: usize, shards: usize) -> StoreConfig {
    StoreConfig::try_new(max_keys, shards, OnFull::Deny).expect("valid config")
}

fn policy(algorithm: Algorithm, limit: u64, window: Duration) -> Policy {
    Policy::try_new(algorithm, limit, window, None).expect("valid policy")
}

fn item<'a>(name: &'a str, policy: Policy, key: &'a str, cost: u64) -> CheckItem<'a> {
    CheckItem::new(name, policy, key, cost).expect("valid item")
}

fn export(store: &MemoryStore) -> Vec<u8> {
    let mut bytes = Vec::new();
    store
        .export(&mut bytes, b"header")
        .expect("writing to a Vec");
    bytes
}

fn load(
    bytes: &[u8],
    config: StoreConfig,
    clock: Arc<FakeClock>,
) -> Result<(MemoryStore, LoadReport), SnapshotError> {
    SnapshotReader::open(bytes)?.load(config, clock, |_| true)
}

#[test]
fn a_half_spent_key_keeps_its_remaining_and_retry_times_across_a_restore() {
    for algorithm in Algorithm::RATES {
        let clock = Arc::new(FakeClock::new(NOON + 12_345));
        let store = MemoryStore::new(config(1_000, 4), clock.clone());
        let p = policy(algorithm, 10, Duration::from_secs(60));
        store.check_one(&item("api", p, "half", 5));
        for _ in 0..3 {
            clock.advance(Duration::from_millis(700));
            store.check_one(&item("api", p, "spent", 4));
        }
        let (restored, report) =
            load(&export(&store), config(1_000, 4), clock.clone()).expect("loads");
        assert_eq!(report.namespaces["api"].loaded, 2, "{algorithm}");
        for later in [0, 1, 700, 29_000, 59_999, 60_000, 125_000] {
            for (key, cost) in [("half", 1), ("half", 6), ("spent", 1), ("spent", 10)] {
                let i = item("api", p, key, cost);
                let (was, is) = (store.peek(&i), restored.peek(&i));
                assert_eq!(was, is, "{algorithm} {key} cost {cost}, {later} ms on");
            }
            clock.advance(Duration::from_millis(later));
        }
    }
}

/// Runs `requests` (`(ms since the last, key, cost)`) on a fresh store,
/// exporting and loading it into a new one before request `restore_at`.
fn run_with_restore(
    p: Policy,
    requests: &[(u64, u8, u64)],
    restore_at: Option<usize>,
) -> Vec<Decision> {
    let clock = Arc::new(FakeClock::new(NOON));
    let mut store = MemoryStore::new(config(1_000, 4), clock.clone());
    let keys = ["k0", "k1", "k2", "k3"];
    let mut decisions = Vec::new();
    for (i, &(step, key, cost)) in requests.iter().enumerate() {
        if Some(i) == restore_at {
            store = load(&export(&store), config(1_000, 4), clock.clone())
                .expect("loads")
                .0;
        }
        clock.advance(Duration::from_millis(step));
        decisions.push(store.check_one(&item("api", p, keys[usize::from(key) % 4], cost)));
    }
    decisions
}

#[test]
fn the_fixed_window_boundary_burst_passes_the_same_after_a_restore() {
    // Limit 5 per 3 s: five requests at 2.9 s, a restore, five more at 3.0 s.
    let p = policy(Algorithm::FixedWindow, 5, Duration::from_secs(3));
    let mut requests = vec![(2_900 - NOON % 3_000 + 3_000, 0, 1)];
    requests.extend([(0, 0, 1); 4]);
    requests.push((100, 0, 1));
    requests.extend([(0, 0, 1); 4]);
    let straight = run_with_restore(p, &requests, None);
    let restored = run_with_restore(p, &requests, Some(5));
    assert_eq!(straight.iter().filter(|d| d.allowed).count(), 10);
    assert_eq!(restored, straight);
}

#[test]
fn a_sliding_log_decides_the_same_after_a_restore() {
    let p = policy(Algorithm::SlidingLog, 5, Duration::from_secs(3));
    let mut requests = vec![(2_900, 0, 1)];
    requests.extend([(0, 0, 1); 4]);
    requests.push((100, 0, 1));
    requests.extend([(0, 0, 1); 4]);
    // At 5.899 s the first five still count; at 5.9 s they have left.
    requests.extend([(2_899, 0, 1), (1, 0, 1), (1, 0, 2)]);
    let straight = run_with_restore(p, &requests, None);
    let restored = run_with_restore(p, &requests, Some(5));
    let allowed: Vec<bool> = straight.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed[..10].iter().filter(|&&a| a).count(), 5, "throttled");
    assert_eq!(allowed[10..], [false, true, true]);
    assert_eq!(restored, straight);
}

fn any_policy() -> impl Strategy<Value = Policy> {
    (
        prop::sample::select(Algorithm::RATES.to_vec()),
        1u64..=20,
        1u64..=5_000,
    )
        .prop_map(|(a, limit, window)| policy(a, limit, Duration::from_millis(window)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn a_restored_store_decides_as_one_that_never_stopped(
        p in any_policy(),
        requests in prop::collection::vec(
            (prop_oneof![3 => Just(0u64), 3 => 0u64..500, 1 => 0u64..10_000], 0u8..4, 1u64..=25),
            1..80,
        ),
        restore in any::<prop::sample::Index>(),
    ) {
        let at = restore.index(requests.len());
        prop_assert_eq!(
            run_with_restore(p, &requests, Some(at)),
            run_with_restore(p, &requests, None)
        );
    }
}

#[test]
fn a_snapshot_taken_while_four_threads_hammer_the_store_holds_every_key_exactly_once() {
    const KEYS: usize = 20_000;
    let p = policy(
        Algorithm::SlidingWindow,
        1_000_000,
        Duration::from_secs(3_600),
    );
    let mut during_exports = 0;
    for round in 0..20 {
        let clock = Arc::new(FakeClock::new(NOON));
        let store = Arc::new(MemoryStore::new(config(100_000, 64), clock.clone()));
        let keys: Arc<Vec<String>> = Arc::new((0..KEYS).map(|i| format!("user-{i}")).collect());
        for k in keys.iter() {
            assert!(store.check_one(&item("api", p, k, 1)).allowed);
        }
        let start = Arc::new(Barrier::new(5));
        let done = Arc::new(AtomicBool::new(false));
        let checks = Arc::new(AtomicU64::new(0));
        let hammers: Vec<_> = (0..4)
            .map(|t| {
                let (store, keys, start, done, checks) = (
                    store.clone(),
                    keys.clone(),
                    start.clone(),
                    done.clone(),
                    checks.clone(),
                );
                thread::spawn(move || {
                    start.wait();
                    let mut i = t * 7_919;
                    while !done.load(Ordering::Relaxed) {
                        checks.fetch_add(1, Ordering::Relaxed);
                        i = (i + 7_919) % KEYS;
                        store.check_one(&item("api", p, &keys[i], 1));
                        // Churn in another namespace: inserts and removals
                        // move entries around inside the shards.
                        let churn = format!("churn-{}", i % 512);
                        store.check_one(&item("churn", p, &churn, 1));
                        if i % 3 == 0 {
                            store.reset("churn", &churn);
                        }
                    }
                })
            })
            .collect();
        start.wait();
        let before = checks.load(Ordering::Relaxed);
        let bytes = export(&store);
        during_exports += checks.load(Ordering::Relaxed) - before;
        done.store(true, Ordering::Relaxed);
        for h in hammers {
            h.join().expect("no panic");
        }
        // A key written twice would fail the load; every key is there.
        let (restored, report) = load(&bytes, config(200_000, 64), clock.clone())
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let api = report.namespaces["api"];
        assert_eq!(api.loaded, KEYS as u64, "round {round}: {report:?}");
        assert_eq!(api.expired + api.over_capacity + api.skipped, 0);
        for k in keys.iter().step_by(97) {
            assert!(restored.peek(&item("api", p, k, 1)).remaining < 1_000_000);
        }
    }
    assert!(during_exports > 0, "the threads checked while exports ran");
}

#[test]
fn entries_already_fresh_at_load_time_are_dropped_and_counted() {
    let clock = Arc::new(FakeClock::new(NOON));
    let store = MemoryStore::new(config(1_000, 4), clock.clone());
    let second = policy(Algorithm::FixedWindow, 10, Duration::from_secs(1));
    let hour = policy(Algorithm::TokenBucket, 10, Duration::from_secs(3_600));
    for i in 0..30 {
        let key = format!("k{i}");
        store.check_one(&item("per_second", second, &key, 1));
        store.check_one(&item("per_hour", hour, &key, 1));
    }
    let bytes = export(&store);
    clock.advance(Duration::from_secs(1));
    let (restored, report) = load(&bytes, config(1_000, 4), clock.clone()).expect("loads");
    assert_eq!(report.namespaces["per_second"].expired, 30);
    assert_eq!(report.namespaces["per_second"].loaded, 0);
    assert_eq!(report.namespaces["per_hour"].loaded, 30);
    assert_eq!(restored.live_keys(), 30);
    assert_eq!(report.taken_at_ms, NOON);
}

#[test]
fn a_smaller_store_loads_what_fits_in_snapshot_order_and_counts_the_rest() {
    let clock = Arc::new(FakeClock::new(NOON));
    let store = MemoryStore::new(config(10_000, 16), clock.clone());
    let p = policy(Algorithm::FixedWindow, 10, Duration::from_secs(60));
    for i in 0..2_000 {
        store.check_one(&item("api", p, &format!("k{i}"), 1));
    }
    let bytes = export(&store);
    let small = StoreConfig::try_new(1_000, 16, OnFull::Evict).expect("valid");
    let (restored, report) = load(&bytes, small, clock.clone()).expect("loads");
    let api = report.namespaces["api"];
    assert_eq!(api.loaded + api.over_capacity, 2_000);
    assert!(api.loaded <= 1_000 && api.loaded >= 900, "{api:?}");
    assert_eq!(restored.live_keys() as u64, api.loaded);
    assert_eq!(restored.evictions(), 0, "loading never evicts");

    let bounded = config(10_000, 16).with_max_bytes(64 * 1024).expect("valid");
    let (restored, report) = load(&bytes, bounded, clock).expect("loads");
    let api = report.namespaces["api"];
    assert_eq!(api.loaded + api.over_capacity, 2_000);
    assert!(restored.used_bytes() <= 64 * 1024);
    assert!(api.loaded > 0 && api.over_capacity > 0, "{api:?}");
}

#[test]
fn namespaces_the_caller_does_not_keep_are_skipped_and_counted() {
    let clock = Arc::new(FakeClock::new(NOON));
    let store = MemoryStore::new(config(1_000, 4), clock.clone());
    let p = policy(Algorithm::SlidingLog, 10, Duration::from_secs(60));
    for i in 0..10 {
        let key = format!("k{i}");
        store.check_one(&item("kept", p, &key, 1));
        store.check_one(&item("removed", p, &key, 1));
    }
    let bytes = export(&store);
    let snapshot = SnapshotReader::open(bytes.as_slice()).expect("opens");
    assert_eq!(snapshot.header(), b"header");
    assert_eq!(snapshot.taken_at_ms(), NOON);
    let mut asked = Vec::new();
    let (restored, report) = snapshot
        .load(config(1_000, 4), clock, |ns| {
            asked.push(ns.to_owned());
            ns == "kept"
        })
        .expect("loads");
    asked.sort();
    assert_eq!(asked, ["kept", "removed"], "asked once per namespace");
    assert_eq!(report.namespaces["kept"].loaded, 10);
    assert_eq!(report.namespaces["removed"].skipped, 10);
    assert_eq!(restored.live_keys(), 10);
    assert_eq!(report.total().loaded + report.total().skipped, 20);
}

#[test]
fn an_empty_store_round_trips() {
    let clock = Arc::new(FakeClock::new(NOON));
    let store = MemoryStore::new(config(1_000, 4), clock.clone());
    let bytes = export(&store);
    let (restored, report) = load(&bytes, config(1_000, 4), clock).expect("loads");
    assert_eq!(restored.live_keys(), 0);
    assert!(report.namespaces.is_empty());
}

/// A snapshot of a few keys of every algorithm, in two shards.
fn small_snapshot() -> Vec<u8> {
    let clock = Arc::new(FakeClock::new(NOON));
    let store = MemoryStore::new(config(1_000, 2), clock);
    for (i, algorithm) in Algorithm::RATES.into_iter().enumerate() {
        let p = policy(algorithm, 10, Duration::from_secs(60));
        store.check_one(&item(algorithm.as_str(), p, &format!("key-{i}"), 3));
        store.check_one(&item("api", p, &format!("other-{i}"), 1));
    }
    export(&store)
}

fn load_bytes(bytes: &[u8]) -> Result<LoadReport, SnapshotError> {
    let clock = Arc::new(FakeClock::new(NOON));
    load(bytes, config(1_000, 2), clock).map(|(_, report)| report)
}

#[test]
fn a_snapshot_cut_short_anywhere_is_refused_as_truncated() {
    let bytes = small_snapshot();
    assert!(load_bytes(&bytes).is_ok());
    for cut in 0..bytes.len() {
        let err = load_bytes(&bytes[..cut]).expect_err("a cut snapshot is refused");
        assert!(
            matches!(err, SnapshotError::Truncated { .. }),
            "cut at {cut}: {err}"
        );
    }
}

#[test]
fn a_snapshot_with_any_bit_flipped_is_refused_with_the_error_of_where_it_is() {
    let bytes = small_snapshot();
    for byte in 0..bytes.len() {
        for bit in 0..8 {
            let mut damaged = bytes.clone();
            damaged[byte] ^= 1 << bit;
            let err = load_bytes(&damaged).expect_err("a damaged snapshot is refused");
            match byte {
                0..8 => assert!(matches!(err, SnapshotError::WrongMagic), "{byte}: {err}"),
                8..12 => assert!(
                    matches!(err, SnapshotError::UnsupportedVersion { .. }),
                    "{byte}: {err}"
                ),
                _ => assert!(
                    matches!(
                        err,
                        SnapshotError::Checksum { .. } | SnapshotError::Truncated { .. }
                    ),
                    "byte {byte} bit {bit}: {err}"
                ),
            }
        }
    }
}

#[test]
fn wrong_magic_wrong_version_and_trailing_bytes_each_have_their_error() {
    let bytes = small_snapshot();
    let mut other = bytes.clone();
    other[..8].copy_from_slice(b"PK\x03\x04zip!");
    assert!(matches!(load_bytes(&other), Err(SnapshotError::WrongMagic)));

    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&(SNAPSHOT_VERSION + 1).to_le_bytes());
    match load_bytes(&newer) {
        Err(SnapshotError::UnsupportedVersion { found, supported }) => {
            assert_eq!((found, supported), (SNAPSHOT_VERSION + 1, SNAPSHOT_VERSION));
        }
        other => panic!("expected an unsupported version, got {other:?}"),
    }
    // Version 1 stored no window in fixed and sliding windows and logs.
    let mut older = bytes.clone();
    older[8..12].copy_from_slice(&1u32.to_le_bytes());
    assert!(matches!(
        load_bytes(&older),
        Err(SnapshotError::UnsupportedVersion { found: 1, .. })
    ));

    let mut longer = bytes.clone();
    longer.push(0);
    assert!(matches!(
        load_bytes(&longer),
        Err(SnapshotError::TrailingBytes)
    ));
}

/// Splits a snapshot into its frames (header frame first, each with its
/// length and checksum) and the rest (end marker and trailer).
fn frames(bytes: &[u8]) -> Vec<&[u8]> {
    let mut at = 12;
    let mut frames = Vec::new();
    loop {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            return frames;
        }
        frames.push(&bytes[at..at + 8 + len]);
        at += 8 + len;
    }
}

#[test]
fn a_key_found_twice_is_an_invalid_entry_even_with_good_checksums() {
    let bytes = small_snapshot();
    let frames = frames(&bytes);
    let mut forged = bytes[..12].to_vec();
    forged.extend_from_slice(frames[0]);
    for frame in frames[1..].iter().chain(&frames[1..]) {
        forged.extend_from_slice(frame);
    }
    forged.extend_from_slice(&0u32.to_le_bytes());
    forged.extend_from_slice(&20u64.to_le_bytes());
    let crc = crc32fast::hash(&forged);
    forged.extend_from_slice(&crc.to_le_bytes());
    match load_bytes(&forged) {
        Err(SnapshotError::InvalidEntry { index, reason }) => {
            assert_eq!(index, 10);
            assert!(reason.contains("twice"), "{reason}");
        }
        other => panic!("expected an invalid entry, got {other:?}"),
    }
}

#[test]
fn a_trailer_that_miscounts_the_entries_is_refused() {
    let bytes = small_snapshot();
    let n = bytes.len();
    let mut forged = bytes[..n - 12].to_vec();
    forged.extend_from_slice(&11u64.to_le_bytes());
    let crc = crc32fast::hash(&forged);
    forged.extend_from_slice(&crc.to_le_bytes());
    assert!(matches!(
        load_bytes(&forged),
        Err(SnapshotError::CountMismatch {
            expected: 11,
            found: 10
        })
    ));
}
