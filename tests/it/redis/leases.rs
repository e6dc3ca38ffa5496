//! Leases on Redis: the script's ledger decides as quotad-core's does, a
//! stalled Redis grants nothing late, and a Cluster keeps a key's state and
//! ledger in one slot.
//!
//! The differential test feeds the same random sequences to the memory
//! store and to Redis at injected instants, for all five algorithms:
//! leases asked for, renewed with what was spent, returned, overspent,
//! named by ids never granted; direct checks, peeks and batches of both
//! modes on the same keys; and a clock that steps back. Every outcome must
//! be identical: units granted and their ends, what was settled and
//! returned, remaining, reset times, and every decision with its retry
//! time. Policies do not reload here: a lease's ledger is bound to the
//! algorithm and window that granted it on Redis, and to the key alone in
//! the memory store (docs/redis.md, *Leases*).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use quotad::backend::redis::{RedisBackend, RedisTarget};
use quotad::backend::{Backend, BackendError, Deadline, LeaseItem};
use quotad_core::{
    Algorithm, BatchMode, CheckItem, Clock, Decision, FakeClock, Grant, LeaseAnswer, LeaseAsk,
    LeaseTerms, Policy, Settle,
};

use super::{START, both_stores, settings};
use crate::common::redis::{RedisCluster, RedisServer};

const NONE: Deadline = Deadline::NONE;

/// Which lease a request settles.
#[derive(Clone, Copy, Debug)]
enum Named {
    None,
    /// One the key was granted (an index into them, modulo), reporting
    /// `spent` of its units: `spent % (units + 2)`, so overspending too.
    Granted(usize, u64),
    /// An id never granted, ended by its own account or not.
    Unknown(u64, bool),
}

#[derive(Clone, Debug)]
enum Op {
    Lease {
        key: usize,
        named: Named,
        want: u64,
        new_id: u64,
    },
    Check {
        key: usize,
        cost: u64,
    },
    Peek {
        key: usize,
        cost: u64,
    },
    AllOrNothing(Vec<(usize, u64)>),
    Independent(Vec<(usize, u64)>),
    /// The clock steps back by `pick % (window + 1)` ms.
    StepBack(u64),
}

/// Small even windows make exact halves common; a day keeps the buckets'
/// arithmetic near its 2^53 bound.
const WINDOWS: [u64; 6] = [2, 4, 10, 1_000, 3_000, 86_400_000];

fn policy_strategy() -> impl Strategy<Value = Policy> {
    (
        prop::sample::select(Algorithm::RATES.to_vec()),
        1u64..=20,
        prop_oneof![
            3 => prop::sample::select(WINDOWS.to_vec()),
            1 => 1u64..=5_000,
        ],
        prop::option::of(1u64..=30),
    )
        .prop_map(|(algorithm, limit, window, burst)| {
            let burst = burst.filter(|_| algorithm.is_bucket());
            Policy::try_new(algorithm, limit, Duration::from_millis(window), burst)
                .expect("generated within the rules")
        })
}

/// Terms whose TTL is a share of the window (or, for a long one, of a
/// day), so that leases end within the sequences.
fn terms_strategy() -> impl Strategy<Value = (u64, u64, u64)> {
    (1u64..=12, 1u64..=12, any::<u64>())
}

fn terms(policy: &Policy, (max, min, ttl): (u64, u64, u64)) -> LeaseTerms {
    let window = policy.window_ms().min(10_000);
    let ttl = 1 + ttl % (2 * window);
    LeaseTerms::try_new(max, min.min(max), Duration::from_millis(ttl)).expect("valid terms")
}

fn ops() -> impl Strategy<Value = Vec<(u64, Op)>> {
    let cost = prop_oneof![4 => 1u64..=3, 1 => 1u64..=32];
    let item = (0usize..2, cost);
    let named = prop_oneof![
        2 => Just(Named::None),
        5 => (any::<usize>(), any::<u64>()).prop_map(|(i, s)| Named::Granted(i, s)),
        1 => (any::<u64>(), any::<bool>()).prop_map(|(id, ended)| Named::Unknown(id, ended)),
    ];
    // Ids across the whole u64 range: the script must keep them exact.
    let id = prop_oneof![any::<u64>(), (0u64..1_000).prop_map(|i| u64::MAX - i)];
    let lease = (
        0usize..2,
        named,
        prop_oneof![1 => Just(0u64), 4 => 1u64..=15],
        id,
    )
        .prop_map(|(key, named, want, new_id)| Op::Lease {
            key,
            named,
            want,
            new_id,
        });
    let op = prop_oneof![
        8 => lease,
        5 => item.clone().prop_map(|(key, cost)| Op::Check { key, cost }),
        2 => item.clone().prop_map(|(key, cost)| Op::Peek { key, cost }),
        1 => prop::collection::vec(item.clone(), 1..4).prop_map(Op::AllOrNothing),
        1 => prop::collection::vec(item, 1..4).prop_map(Op::Independent),
        1 => any::<u64>().prop_map(Op::StepBack),
    ];
    prop::collection::vec((any::<u64>(), op), 1..50)
}

fn decided(results: Vec<quotad::backend::ItemResult>) -> Vec<Decision> {
    results.into_iter().map(|r| r.expect("decided")).collect()
}

/// What one operation answered, whichever store.
#[derive(Debug, PartialEq)]
enum Answer {
    Lease(Result<quotad_core::LeaseOutcome, quotad_core::LeaseError>),
    Decisions(Vec<Decision>),
    Nothing,
}

#[test]
fn memory_and_redis_lease_identically_for_every_algorithm() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let clock = Arc::new(FakeClock::new(START));
    let (redis_store, memory) = both_stores(&runtime, &redis, &clock);
    let cases = AtomicU64::new(0);
    let (granted, returned, refused) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let (denied_with_leases, steps_back) = (AtomicU64::new(0), AtomicU64::new(0));
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 600,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let started = Instant::now();
    runner
        .run(
            &(policy_strategy(), terms_strategy(), ops()),
            |(policy, picked, ops)| {
                let name = format!("lease{}", cases.fetch_add(1, Ordering::Relaxed));
                let keys = ["alice", "{team}bob"];
                let terms = terms(&policy, picked);
                let window = policy.window_ms().min(10_000);
                // Every lease each key was granted, for requests to name.
                let mut leases: [Vec<Grant>; 2] = [Vec::new(), Vec::new()];
                clock.set(START);
                for (step, op) in ops {
                    clock.advance(Duration::from_millis(match step % 4 {
                        0 => 0,
                        1 | 2 => step % (window / 4 + 2),
                        _ => step % (window * 2 + 1),
                    }));
                    let now = clock.now_ms();
                    let item = |key: usize, cost: u64| {
                        CheckItem::new(&name, policy, keys[key], cost).expect("valid item")
                    };
                    let (from_memory, from_redis) = runtime.block_on(async {
                        match &op {
                            Op::Lease {
                                key,
                                named,
                                want,
                                new_id,
                            } => {
                                let settle = match *named {
                                    Named::None => None,
                                    Named::Granted(_, _) if leases[*key].is_empty() => None,
                                    Named::Granted(i, spent) => {
                                        let g = leases[*key][i % leases[*key].len()];
                                        Some(Settle {
                                            id: g.id,
                                            ends_at: g.ends_at,
                                            spent: spent % (g.units + 2),
                                        })
                                    }
                                    Named::Unknown(id, ended) => Some(Settle {
                                        id,
                                        ends_at: if ended { now } else { now + 1 },
                                        spent: 0,
                                    }),
                                };
                                let lease = LeaseItem {
                                    name: &name,
                                    key: keys[*key],
                                    policy,
                                    terms,
                                    ask: LeaseAsk {
                                        settle,
                                        want: *want,
                                        new_id: *new_id,
                                    },
                                };
                                (
                                    Answer::Lease(
                                        Backend::lease(&memory, &lease, NONE)
                                            .await
                                            .expect("memory"),
                                    ),
                                    Answer::Lease(
                                        redis_store.lease(&lease, NONE).await.expect("redis"),
                                    ),
                                )
                            }
                            Op::Check { key, cost } => {
                                let i = item(*key, *cost);
                                (
                                    Answer::Decisions(vec![
                                        Backend::check_one(&memory, &i, NONE)
                                            .await
                                            .expect("memory"),
                                    ]),
                                    Answer::Decisions(vec![
                                        redis_store.check_one(&i, NONE).await.expect("redis"),
                                    ]),
                                )
                            }
                            Op::Peek { key, cost } => {
                                let i = item(*key, *cost);
                                (
                                    Answer::Decisions(vec![
                                        Backend::peek(&memory, &i, NONE).await.expect("memory"),
                                    ]),
                                    Answer::Decisions(vec![
                                        redis_store.peek(&i, NONE).await.expect("redis"),
                                    ]),
                                )
                            }
                            Op::AllOrNothing(items) | Op::Independent(items) => {
                                let mode = match op {
                                    Op::AllOrNothing(_) => BatchMode::AllOrNothing,
                                    _ => BatchMode::Independent,
                                };
                                let items: Vec<_> =
                                    items.iter().map(|&(k, c)| item(k, c)).collect();
                                (
                                    Answer::Decisions(decided(
                                        Backend::check(&memory, &items, mode, NONE).await,
                                    )),
                                    Answer::Decisions(decided(
                                        redis_store.check(&items, mode, NONE).await,
                                    )),
                                )
                            }
                            Op::StepBack(_) => (Answer::Nothing, Answer::Nothing),
                        }
                    });
                    prop_assert_eq!(
                        &from_memory,
                        &from_redis,
                        "{:?} at {} under {:?} and {:?}",
                        op,
                        now,
                        policy,
                        terms
                    );
                    match (&op, &from_memory) {
                        (Op::Lease { key, .. }, Answer::Lease(Ok(outcome))) => {
                            if let LeaseAnswer::Granted(g) = outcome.answer {
                                leases[*key].push(g);
                                granted.fetch_add(1, Ordering::Relaxed);
                            }
                            if let Some(quotad_core::Settled::Returned { .. }) = outcome.settled {
                                returned.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        (Op::Lease { .. }, Answer::Lease(Err(_))) => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        (Op::Check { key, .. }, Answer::Decisions(d))
                            if !d[0].allowed && !leases[*key].is_empty() =>
                        {
                            denied_with_leases.fetch_add(1, Ordering::Relaxed);
                        }
                        (Op::StepBack(pick), _) => {
                            let back = pick % (window + 1);
                            clock.set(clock.now_ms() - back);
                            steps_back.fetch_add(u64::from(back > 0), Ordering::Relaxed);
                        }
                        _ => {}
                    }
                }
                Ok(())
            },
        )
        .expect("the backends agree");
    // The sequences did what they are for.
    for (what, count) in [
        ("granted", &granted),
        ("returned", &returned),
        ("refused", &refused),
        ("denied with leases", &denied_with_leases),
        ("steps back", &steps_back),
    ] {
        assert!(count.load(Ordering::Relaxed) > 100, "{what}: {count:?}");
    }
    eprintln!(
        "{} cases: {} granted, {} returned, {} refused, {} denials with leases, {} steps back in {:?}",
        cases.load(Ordering::Relaxed),
        granted.load(Ordering::Relaxed),
        returned.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        denied_with_leases.load(Ordering::Relaxed),
        steps_back.load(Ordering::Relaxed),
        started.elapsed()
    );
}

fn fixed_window() -> Policy {
    Policy::try_new(
        Algorithm::FixedWindow,
        100,
        Duration::from_secs(86_400),
        None,
    )
    .expect("valid")
}

fn token_bucket() -> Policy {
    Policy::try_new(
        Algorithm::TokenBucket,
        100,
        Duration::from_secs(86_400),
        None,
    )
    .expect("valid")
}

fn lease_of<'a>(name: &'a str, key: &'a str, policy: Policy, ask: LeaseAsk) -> LeaseItem<'a> {
    LeaseItem {
        name,
        key,
        policy,
        terms: LeaseTerms::try_new(10, 1, Duration::from_secs(60)).expect("valid terms"),
        ask,
    }
}

fn ask(want: u64, new_id: u64) -> LeaseAsk {
    LeaseAsk {
        settle: None,
        want,
        new_id,
    }
}

/// A SIGSTOPped Redis: lease calls during the stall fail, and once it runs
/// again, what they asked was neither granted nor returned: the budget is
/// as the last answered call left it, and the lease settled in the stall
/// is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_grants_and_returns_nothing_late() {
    let mut redis = RedisServer::start();
    let mut settings = settings(RedisTarget::Standalone(redis.url()));
    settings.timeout = Duration::from_millis(100);
    let store = RedisBackend::connect(&settings)
        .await
        .expect("connect to the test Redis");
    for policy in [fixed_window(), token_bucket()] {
        let name = format!("stall-{}", policy.algorithm());
        let lease = |ask| lease_of(&name, "k", policy, ask);
        let first = store
            .lease(&lease(ask(10, u64::MAX)), NONE)
            .await
            .expect("answered")
            .expect("no lease named");
        let LeaseAnswer::Granted(held) = first.answer else {
            panic!("a full budget grants: {first:?}");
        };
        assert_eq!((held.id, held.units, first.remaining), (u64::MAX, 10, 90));
        redis.pause();
        let stalled = Instant::now();
        let mut failed = 0;
        for i in 0..5 {
            let asks = [
                ask(10, i),
                LeaseAsk {
                    settle: Some(Settle {
                        id: held.id,
                        ends_at: held.ends_at,
                        spent: 0,
                    }),
                    want: 10,
                    new_id: 100 + i,
                },
            ];
            for a in asks {
                match store.lease(&lease(a), NONE).await {
                    Err(BackendError::Unavailable(_)) => failed += 1,
                    other => panic!("a stalled Redis answered {other:?}"),
                }
            }
        }
        assert_eq!(failed, 10);
        // Past the stall, the scripts queued in it run, each after its
        // deadline in Redis's clock.
        tokio::time::sleep(Duration::from_millis(1_000).saturating_sub(stalled.elapsed())).await;
        redis.resume();
        let check = CheckItem::new(&name, policy, "k", 1).expect("valid item");
        let recovered = Instant::now() + Duration::from_secs(10);
        let peeked = loop {
            match store.peek(&check, NONE).await {
                Ok(d) => break d,
                Err(e) => assert!(Instant::now() < recovered, "no recovery: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(peeked.remaining, 90, "{policy:?}: nothing granted late");
        // The lease settled during the stall is still held: returning it
        // now gives its 10 units back.
        let returned = store
            .lease(
                &lease(LeaseAsk {
                    settle: Some(Settle {
                        id: held.id,
                        ends_at: held.ends_at,
                        spent: 0,
                    }),
                    want: 0,
                    new_id: 0,
                }),
                NONE,
            )
            .await
            .expect("answered")
            .expect("still held");
        assert_eq!(
            returned.settled,
            Some(quotad_core::Settled::Returned { returned: 10 }),
            "{policy:?}"
        );
        assert_eq!(returned.remaining, 100, "{policy:?}");
    }
    assert!(store.counts().late_refused > 0, "{:?}", store.counts());
    assert_eq!(store.counts().late_counted, 0, "{:?}", store.counts());
}

/// On a three-node Cluster, keys in different slots lease, are checked
/// under their leases and are reset with them: each key's state and ledger
/// share its slot, whichever node holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_a_cluster_live_in_their_keys_slot() {
    let cluster = RedisCluster::start();
    let store = RedisBackend::connect(&settings(RedisTarget::Cluster(cluster.urls())))
        .await
        .expect("connect to the test Cluster");
    let policy = token_bucket();
    let keys: Vec<String> = (0..12).map(|i| format!("user-{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let lease = |ask| lease_of("cluster", key, policy, ask);
        let outcome = store
            .lease(&lease(ask(10, i as u64)), NONE)
            .await
            .expect("answered")
            .expect("no lease named");
        let LeaseAnswer::Granted(held) = outcome.answer else {
            panic!("{key}: a full budget grants: {outcome:?}");
        };
        assert_eq!(outcome.remaining, 90, "{key}");
        // A direct check counts the lease: 90 left, then 89.
        let check = CheckItem::new("cluster", policy, key, 1).expect("valid item");
        let d = store.check_one(&check, NONE).await.expect("decided");
        assert!(d.allowed && d.remaining == 89, "{key}: {d:?}");
        // Renewed with 4 spent: 6 back, 10 more out.
        let renewed = store
            .lease(
                &lease(LeaseAsk {
                    settle: Some(Settle {
                        id: held.id,
                        ends_at: held.ends_at,
                        spent: 4,
                    }),
                    want: 10,
                    new_id: 1_000 + i as u64,
                }),
                NONE,
            )
            .await
            .expect("answered")
            .expect("held");
        assert_eq!(
            renewed.settled,
            Some(quotad_core::Settled::Returned { returned: 6 }),
            "{key}"
        );
        assert!(matches!(renewed.answer, LeaseAnswer::Granted(g) if g.units == 10));
        assert_eq!(renewed.remaining, 85, "{key}");
        // An id the key never granted is unknown; nothing changes.
        let unknown = store
            .lease(
                &lease(LeaseAsk {
                    settle: Some(Settle {
                        id: held.id,
                        ends_at: u64::MAX,
                        spent: 0,
                    }),
                    want: 10,
                    new_id: 7,
                }),
                NONE,
            )
            .await
            .expect("answered");
        assert_eq!(unknown, Err(quotad_core::LeaseError::UnknownLease), "{key}");
        // A reset forgets the key's leases with its state.
        store
            .reset("cluster", &policy, key, NONE)
            .await
            .expect("reset");
        let d = store.peek(&check, NONE).await.expect("decided");
        assert_eq!(d.remaining, 100, "{key}");
    }
    let slots: std::collections::HashSet<String> = keys
        .iter()
        .map(|k| cluster.nodes[0].cli(&["cluster", "keyslot", k]))
        .collect();
    assert!(slots.len() > 6, "the keys span slots: {slots:?}");
}
