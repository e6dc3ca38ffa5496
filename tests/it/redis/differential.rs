//! The memory store and Redis decide identically: the same random
//! operation sequences, at injected instants, under policies that reload
//! (limit, window, burst, algorithm) and with a clock that steps backwards,
//! for all five algorithms; independent batches also past 64 items, which
//! go to Redis as several pipelined scripts.
//!
//! One rule both stores keep makes this possible: state is read only under
//! the algorithm and window that wrote it. Where the stores hold state
//! differently by design, the sequences stay out of it: a reload never
//! returns a policy to an algorithm and window it left in the same case
//! (Redis still holds the key of those parameters, the memory store has
//! replaced the key's one state; docs/configuration.md, *Hot reload*).
//! And a key's state is fresh at the instant the policy that last wrote it
//! said: Redis expires it then by its TTL, which runs on Redis's own clock,
//! not on the injected one (there the TTL has a minute of slack). Where that
//! instant matters — a bucket whose rate a reload changed, read after the
//! writer's fresh instant — the test does what the TTL would: it forgets
//! the key in both stores at that instant.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use quotad::backend::{Backend, Deadline};
use quotad_core::{Algorithm, BatchMode, CheckItem, Clock, Decision, FakeClock, Policy};

use super::{START, both_stores};

const NONE: Deadline = Deadline::NONE;
use crate::common::redis::RedisServer;

/// A change a reload makes to the policy under test.
#[derive(Clone, Copy, Debug)]
enum Change {
    Limit(u64),
    /// An index into [`WINDOWS`], or a window of its own.
    Window(u64),
    Burst(Option<u64>),
    Algorithm(Algorithm),
}

#[derive(Clone, Debug)]
enum Op {
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
    Reload(Change),
    /// The clock steps back by `pick % (window * 2 + 1)` ms.
    StepBack(u64),
}

/// How far the clock moves forward before an operation, as a share of the
/// current window (which reloads change).
#[derive(Clone, Copy, Debug)]
enum Step {
    None,
    Small(u64),
    Half,
    Any(u64),
}

/// Small even windows make exact halves (rounding) common; a day keeps the
/// arithmetic near its 2^53 bound for the buckets.
const WINDOWS: [u64; 6] = [2, 4, 10, 1_000, 3_000, 86_400_000];

fn window_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => prop::sample::select(WINDOWS.to_vec()),
        1 => 1u64..=5_000,
    ]
}

fn algorithm_strategy() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(Algorithm::RATES.to_vec())
}

fn policy_strategy() -> impl Strategy<Value = Policy> {
    (
        algorithm_strategy(),
        1u64..=20,
        window_strategy(),
        prop::option::of(1u64..=30),
    )
        .prop_map(|(algorithm, limit, window, burst)| {
            policy(algorithm, limit, window, burst).expect("generated within the rules")
        })
}

fn policy(algorithm: Algorithm, limit: u64, window_ms: u64, burst: Option<u64>) -> Option<Policy> {
    let burst = burst.filter(|_| algorithm.is_bucket());
    Policy::try_new(algorithm, limit, Duration::from_millis(window_ms), burst).ok()
}

fn ops() -> impl Strategy<Value = Vec<(Step, Op)>> {
    let cost = prop_oneof![4 => 1u64..=3, 1 => 1u64..=32];
    let item = (0usize..3, cost);
    let change = prop_oneof![
        2 => (1u64..=20).prop_map(Change::Limit),
        2 => window_strategy().prop_map(Change::Window),
        1 => prop::option::of(1u64..=30).prop_map(Change::Burst),
        2 => algorithm_strategy().prop_map(Change::Algorithm),
    ];
    let op = prop_oneof![
        8 => item.clone().prop_map(|(key, cost)| Op::Check { key, cost }),
        2 => item.clone().prop_map(|(key, cost)| Op::Peek { key, cost }),
        2 => prop::collection::vec(item.clone(), 1..4).prop_map(Op::AllOrNothing),
        2 => prop::collection::vec(item.clone(), 1..4).prop_map(Op::Independent),
        // Past 64 items: several scripts, one key's items in several of
        // them, decided in the batch's order all the same.
        1 => prop::collection::vec(item, 65..200).prop_map(Op::Independent),
        1 => change.prop_map(Op::Reload),
        1 => any::<u64>().prop_map(Op::StepBack),
    ];
    let step = prop_oneof![
        3 => Just(Step::None),
        4 => any::<u64>().prop_map(Step::Small),
        1 => Just(Step::Half),
        1 => any::<u64>().prop_map(Step::Any),
    ];
    prop::collection::vec((step, op), 1..60)
}

/// The policy after `change`, kept within the rules and away from an
/// algorithm and window the case has left (see the module docs).
fn reloaded(current: Policy, change: Change, left: &HashSet<(Algorithm, u64)>) -> Policy {
    let (mut algorithm, mut limit, mut window, mut burst) = (
        current.algorithm(),
        current.limit(),
        current.window_ms(),
        current.algorithm().is_bucket().then_some(current.burst()),
    );
    match change {
        Change::Limit(l) => limit = l,
        Change::Window(w) => window = w,
        Change::Burst(b) => burst = b,
        Change::Algorithm(a) => algorithm = a,
    }
    while left.contains(&(algorithm, window)) {
        window += 1;
    }
    policy(algorithm, limit, window, burst).expect("small parameters are within the rules")
}

/// A batch's decisions, every item decided.
fn decided(results: Vec<quotad::backend::ItemResult>) -> Vec<Decision> {
    results.into_iter().map(|r| r.expect("decided")).collect()
}

#[test]
fn memory_and_redis_decide_identically_across_reloads_and_clock_steps_back() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let clock = Arc::new(FakeClock::new(START));
    let (redis_store, memory) = both_stores(&runtime, &redis, &clock);
    let cases = AtomicU64::new(0);
    let (reloads, steps_back) = (AtomicU64::new(0), AtomicU64::new(0));
    let chunked = AtomicU64::new(0);
    let expired = AtomicU64::new(0);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 1_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let started = Instant::now();
    runner
        .run(&(policy_strategy(), ops()), |(first, ops)| {
            // A policy name of its own per case: no state from other cases.
            let name = format!("case{}", cases.fetch_add(1, Ordering::Relaxed));
            let keys = ["alice", "bob", "{team}carol"];
            let mut policy = first;
            let mut left = HashSet::new();
            // Per key, the instant its state is fresh under the policy that
            // wrote it, for state a reload left to be read under a rate of
            // another policy.
            let mut expires: [Option<u64>; 3] = [None; 3];
            clock.set(START);
            for (step, op) in ops {
                let window = policy.window_ms().min(10_000);
                clock.advance(Duration::from_millis(match step {
                    Step::None => 0,
                    Step::Small(pick) => pick % (window / 4 + 2),
                    Step::Half => window / 2,
                    Step::Any(pick) => pick % (window * 2 + 1),
                }));
                let item = |key: usize, cost: u64| {
                    CheckItem::new(&name, policy, keys[key], cost).expect("valid item")
                };
                let now = clock.now_ms();
                for (key, at) in expires.iter_mut().enumerate() {
                    if at.is_some_and(|at| at <= now) {
                        *at = None;
                        runtime.block_on(async {
                            Backend::reset(&memory, &name, &policy, keys[key], NONE)
                                .await
                                .expect("memory");
                            redis_store
                                .reset(&name, &policy, keys[key], NONE)
                                .await
                                .expect("redis");
                        });
                        expired.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let (from_memory, from_redis) = runtime.block_on(async {
                    match &op {
                        Op::Check { key, cost } => {
                            let i = item(*key, *cost);
                            (
                                vec![Backend::check_one(&memory, &i, NONE).await.expect("memory")],
                                vec![redis_store.check_one(&i, NONE).await.expect("redis")],
                            )
                        }
                        Op::Peek { key, cost } => {
                            let i = item(*key, *cost);
                            (
                                vec![Backend::peek(&memory, &i, NONE).await.expect("memory")],
                                vec![redis_store.peek(&i, NONE).await.expect("redis")],
                            )
                        }
                        Op::AllOrNothing(items) | Op::Independent(items) => {
                            let mode = match op {
                                Op::AllOrNothing(_) => BatchMode::AllOrNothing,
                                _ => BatchMode::Independent,
                            };
                            let items: Vec<_> = items.iter().map(|&(k, c)| item(k, c)).collect();
                            chunked.fetch_add(u64::from(items.len() > 64), Ordering::Relaxed);
                            (
                                decided(Backend::check(&memory, &items, mode, NONE).await),
                                decided(redis_store.check(&items, mode, NONE).await),
                            )
                        }
                        Op::Reload(_) | Op::StepBack(_) => (Vec::new(), Vec::new()),
                    }
                });
                prop_assert_eq!(
                    &from_memory,
                    &from_redis,
                    "{:?} at {} under {:?}",
                    op,
                    clock.now_ms(),
                    policy
                );
                // What this operation wrote is fresh when its own decision
                // says, in both stores alike.
                let written: Vec<usize> = match &op {
                    Op::Check { key, .. } => vec![*key],
                    Op::Independent(items) => items.iter().map(|&(k, _)| k).collect(),
                    Op::AllOrNothing(items) if from_memory.iter().all(|d| d.allowed) => {
                        items.iter().map(|&(k, _)| k).collect()
                    }
                    _ => Vec::new(),
                };
                for key in written {
                    expires[key] = None;
                }
                match op {
                    Op::Reload(change) => {
                        let next = reloaded(policy, change, &left);
                        let pair = |p: &Policy| (p.algorithm(), p.window_ms());
                        if pair(&next) != pair(&policy) {
                            left.insert(pair(&policy));
                            expires = [None; 3];
                        } else if next != policy {
                            for (key, at) in expires.iter_mut().enumerate() {
                                let peeked = runtime
                                    .block_on(Backend::peek(&memory, &item(key, 1), NONE))
                                    .expect("memory");
                                // Fresh already (0): the TTL has run out.
                                if at.is_none() {
                                    *at = Some(now + peeked.reset_after_ms);
                                }
                            }
                        }
                        policy = next;
                        reloads.fetch_add(1, Ordering::Relaxed);
                    }
                    Op::StepBack(pick) => {
                        let back = pick % (window * 2 + 1);
                        clock.set(clock.now_ms() - back);
                        steps_back.fetch_add(u64::from(back > 0), Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
            Ok(())
        })
        .expect("the backends agree");
    // The sequences did what they are for.
    assert!(reloads.load(Ordering::Relaxed) > 500, "{reloads:?}");
    assert!(steps_back.load(Ordering::Relaxed) > 500, "{steps_back:?}");
    assert!(chunked.load(Ordering::Relaxed) > 200, "{chunked:?}");
    eprintln!(
        "{} cases, {} reloads, {} steps back, {} keys forgotten as a TTL would in {:?}",
        cases.load(Ordering::Relaxed),
        reloads.load(Ordering::Relaxed),
        steps_back.load(Ordering::Relaxed),
        expired.load(Ordering::Relaxed),
        started.elapsed()
    );
}
