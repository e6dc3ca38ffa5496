//! Behaviour under contention: every transition of a key is atomic, and
//! all-or-nothing batches neither deadlock nor consume partially.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use quotad_core::{
    Algorithm, BatchMode, CheckItem, FakeClock, MemoryStore, OnFull, Policy, Reason, StoreConfig,
};

fn store() -> MemoryStore {
    // The clock stands still: no window can end during a run.
    let clock = Arc::new(FakeClock::new(1_767_268_800_000));
    let config = StoreConfig::try_new(100_000, 64, OnFull::Deny).expect("valid config");
    MemoryStore::new(config, clock)
}

fn policy(algorithm: Algorithm, limit: u64) -> Policy {
    Policy::try_new(algorithm, limit, Duration::from_secs(60), None).expect("valid policy")
}

/// Runs `f` on another thread and fails the test if it does not finish in
/// time: a deadlock becomes a failure, not a hung test run.
fn within_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("finished within a minute (a deadlock would not)")
}

#[test]
fn a_hundred_threads_on_one_key_admit_exactly_the_limit_every_time() {
    for algorithm in Algorithm::RATES {
        for round in 0..50 {
            let store = Arc::new(store());
            let barrier = Arc::new(Barrier::new(100));
            let policy = policy(algorithm, 10);
            let handles: Vec<_> = (0..100)
                .map(|_| {
                    let store = Arc::clone(&store);
                    let barrier = Arc::clone(&barrier);
                    thread::spawn(move || {
                        let item = CheckItem::new("api", policy, "hot", 1).expect("valid");
                        barrier.wait();
                        store.check_one(&item).allowed
                    })
                })
                .collect();
            let allowed = handles
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .filter(|&a| a)
                .count();
            assert_eq!(allowed, 10, "{algorithm} round {round}");
        }
    }
}

/// Runs `batches(t, keys)` on `threads` threads started together, each with
/// `keys` (reversed on odd threads); their results, in thread order.
fn on_threads<T, F>(threads: usize, keys: &[String], batches: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize, &[String]) -> T + Send + Sync + 'static,
{
    let batches = Arc::new(batches);
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (batches, barrier) = (Arc::clone(&batches), Arc::clone(&barrier));
            let mut keys = keys.to_vec();
            if t % 2 == 1 {
                keys.reverse();
            }
            thread::spawn(move || {
                barrier.wait();
                batches(t, &keys)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("no panic"))
        .collect()
}

#[test]
fn opposite_order_all_or_nothing_batches_never_deadlock_nor_consume_partially() {
    for round in 0..50 {
        let outcome = within_a_minute(move || {
            let store = Arc::new(store());
            // Keys chosen to spread over many shards; each batch names them
            // all, half the threads in reverse order.
            let keys: Vec<String> = (0..8).map(|k| format!("user-{k}")).collect();
            let small = policy(Algorithm::FixedWindow, 30);
            let large = policy(Algorithm::FixedWindow, 1_000);
            let shared = Arc::clone(&store);
            let admitted: u32 = on_threads(16, &keys, move |_, keys| {
                let mut admitted = 0;
                for _ in 0..10 {
                    // The first key is held to 30; the rest could take
                    // 1,000, so any partial commit would show.
                    let items: Vec<CheckItem<'_>> = keys
                        .iter()
                        .map(|k| {
                            let p = if k == "user-0" { small } else { large };
                            CheckItem::new("api", p, k, 1).expect("valid")
                        })
                        .collect();
                    let decisions = shared.check(&items, BatchMode::AllOrNothing);
                    let all = decisions.iter().all(|d| d.allowed);
                    assert!(all || decisions.iter().all(|d| !d.allowed));
                    admitted += u32::from(all);
                }
                admitted
            })
            .into_iter()
            .sum();
            let used: Vec<u64> = keys
                .iter()
                .map(|k| {
                    let p = if k == "user-0" { small } else { large };
                    let item = CheckItem::new("api", p, k, 1).expect("valid");
                    p.limit() - store.peek(&item).remaining
                })
                .collect();
            (admitted, used)
        });
        let (admitted, used) = outcome;
        assert_eq!(admitted, 30, "round {round}");
        assert!(used.iter().all(|&u| u == 30), "round {round}: {used:?}");
    }
}

#[test]
fn independent_and_all_or_nothing_batches_in_opposite_orders_admit_exactly_each_limit() {
    // Independent batches lock a few items' shards at a time and
    // all-or-nothing batches all of theirs: in any mix and any key order
    // they must neither deadlock nor admit a key past its limit.
    for round in 0..30 {
        let allowed = within_a_minute(move || {
            let store = Arc::new(store());
            let keys: Vec<String> = (0..20).map(|k| format!("user-{k}")).collect();
            let policy = policy(Algorithm::FixedWindow, 50);
            let mut total = HashMap::<String, u64>::new();
            let per_thread = on_threads(16, &keys, move |t, keys| {
                let mode = if t % 4 < 2 {
                    BatchMode::Independent
                } else {
                    BatchMode::AllOrNothing
                };
                let mut allowed = HashMap::<String, u64>::new();
                for _ in 0..10 {
                    let items: Vec<CheckItem<'_>> = keys
                        .iter()
                        .map(|k| CheckItem::new("api", policy, k, 1).expect("valid"))
                        .collect();
                    for (k, d) in keys.iter().zip(store.check(&items, mode)) {
                        *allowed.entry(k.clone()).or_default() += u64::from(d.allowed);
                    }
                }
                allowed
            });
            for (k, n) in per_thread.into_iter().flatten() {
                *total.entry(k).or_default() += n;
            }
            total
        });
        // 80 independent checks of each key alone exceed its limit of 50.
        assert_eq!(allowed.len(), 20, "round {round}");
        assert!(
            allowed.values().all(|&n| n == 50),
            "round {round}: {allowed:?}"
        );
    }
}

#[test]
fn a_rejected_batch_reports_which_item_failed_and_consumes_nothing() {
    let store = store();
    let per_second =
        Policy::try_new(Algorithm::FixedWindow, 5, Duration::from_secs(1), None).expect("valid");
    let per_day = Policy::try_new(Algorithm::FixedWindow, 1, Duration::from_secs(86_400), None)
        .expect("valid");
    let items = [
        CheckItem::new("per_second", per_second, "alice", 1).expect("valid"),
        CheckItem::new("per_day", per_day, "alice", 1).expect("valid"),
    ];
    let first = store.check(&items, BatchMode::AllOrNothing);
    assert!(first.iter().all(|d| d.allowed));
    let second = store.check(&items, BatchMode::AllOrNothing);
    assert_eq!(second[0].reason, Reason::BatchRejected);
    assert_eq!(second[0].remaining, 4, "the per-second budget is untouched");
    assert_eq!(second[1].reason, Reason::LimitExceeded);
    assert_eq!(store.peek(&items[0]).remaining, 4);
}

#[test]
fn a_key_named_twice_in_a_batch_sees_its_own_earlier_item() {
    let store = store();
    let p = policy(Algorithm::TokenBucket, 3);
    let items = [
        CheckItem::new("api", p, "k", 2).expect("valid"),
        CheckItem::new("api", p, "k", 2).expect("valid"),
    ];
    let all = store.check(&items, BatchMode::AllOrNothing);
    assert_eq!(all[0].reason, Reason::BatchRejected);
    assert_eq!(all[1].reason, Reason::LimitExceeded);
    assert_eq!(store.peek(&items[0]).remaining, 3);
    let each = store.check(&items, BatchMode::Independent);
    assert!(each[0].allowed && !each[1].allowed);
}
