//! Concurrency slots on Redis decide as quotad-core's do: the same random
//! sequences of acquires (ids across the whole u64 range), renewals,
//! releases of held, ended and unknown slots, and time passing, fed to the
//! memory store and to Redis at injected instants, must answer the same:
//! every decision with its remaining, exact retry and reset times, every
//! slot's end, every renewal and release.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use quotad::backend::{Backend, Deadline, SlotItem};
use quotad_core::{CheckItem, Clock, FakeClock, Policy};

use super::{START, both_stores};
use crate::common::redis::RedisServer;

const NONE: Deadline = Deadline::NONE;

#[derive(Clone, Debug)]
enum Op {
    Acquire { key: usize, cost: u64, id: u64 },
    Renew { key: usize, pick: usize },
    Release { key: usize, pick: usize },
    ReleaseUnknown { key: usize, id: u64 },
}

fn ops() -> impl Strategy<Value = Vec<(u64, Op)>> {
    let id = prop_oneof![any::<u64>(), (0u64..1_000).prop_map(|i| u64::MAX - i)];
    let op = prop_oneof![
        6 => (0usize..2, 1u64..=4, id.clone()).prop_map(|(key, cost, id)| Op::Acquire { key, cost, id }),
        2 => (0usize..2, any::<usize>()).prop_map(|(key, pick)| Op::Renew { key, pick }),
        3 => (0usize..2, any::<usize>()).prop_map(|(key, pick)| Op::Release { key, pick }),
        1 => (0usize..2, id).prop_map(|(key, id)| Op::ReleaseUnknown { key, id }),
    ];
    prop::collection::vec((any::<u64>(), op), 1..60)
}

/// What one operation answered, whichever store: for an acquire its
/// decision and slot end; for a renew or release whether the slot was
/// live, its end after a renew, and what is free.
type Answer = (bool, u64, u64, u64, u64, u64);

#[test]
fn memory_and_redis_hold_the_same_slots() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let clock = Arc::new(FakeClock::new(START));
    let (redis_store, memory) = both_stores(&runtime, &redis, &clock);
    let cases = AtomicU64::new(0);
    let (admitted, denied, renewed, released) = (
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
        AtomicU64::new(0),
    );
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&(1u64..=6, 1u64..=3_000, ops()), |(limit, ttl, ops)| {
            let name = format!("conc{}", cases.fetch_add(1, Ordering::Relaxed));
            let policy = Policy::concurrency(limit, Duration::from_millis(ttl)).expect("valid");
            let keys = ["alice", "{team}bob"];
            let mut ids: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
            clock.set(START);
            for (step, op) in ops {
                clock.advance(Duration::from_millis(step % (ttl / 2 + 2)));
                let now = clock.now_ms();
                let answers: (Answer, Answer) = runtime.block_on(async {
                    match op {
                        Op::Acquire { key, cost, id } => {
                            let cost = cost.min(limit);
                            let item = CheckItem::acquire(&name, policy, keys[key], cost, id)
                                .expect("valid acquire");
                            let m = memory.acquire(&item);
                            let r = Backend::acquire(&redis_store, &item, NONE)
                                .await
                                .expect("redis answers");
                            match &m {
                                Ok(a) if a.decision.allowed => {
                                    ids[key].push(id);
                                    admitted.fetch_add(1, Ordering::Relaxed);
                                }
                                _ => {
                                    denied.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            // An id held already is refused by both.
                            type Acquire = Result<quotad_core::Acquired, quotad_core::SlotError>;
                            let answer = |a: Acquire| match a {
                                Ok(a) => {
                                    let d = a.decision;
                                    (
                                        d.allowed,
                                        d.remaining,
                                        d.retry_after_ms,
                                        d.reset_after_ms,
                                        a.slot.map_or(0, |s| s.ends_at),
                                        d.reason as u64,
                                    )
                                }
                                Err(_) => (false, 0, 0, 0, 0, 99),
                            };
                            (answer(m), answer(r))
                        }
                        Op::Renew { key, pick } | Op::Release { key, pick }
                            if ids[key].is_empty() =>
                        {
                            let _ = pick;
                            ((false, 0, 0, 0, 0, 0), (false, 0, 0, 0, 0, 0))
                        }
                        Op::Renew { key, pick } => {
                            let slot = SlotItem {
                                name: &name,
                                key: keys[key],
                                policy,
                                id: ids[key][pick % ids[key].len()],
                            };
                            let m = memory
                                .renew(slot.name, slot.key, &policy, slot.id)
                                .expect("answered");
                            let r = redis_store.renew(&slot, NONE).await.expect("redis answers");
                            if m.slot.is_some() {
                                renewed.fetch_add(1, Ordering::Relaxed);
                            }
                            let answer = |a: quotad_core::SlotAnswer| {
                                (
                                    a.slot.is_some(),
                                    a.remaining,
                                    a.slot.map_or(0, |s| s.ends_at),
                                    0,
                                    0,
                                    1,
                                )
                            };
                            (answer(m), answer(r))
                        }
                        Op::Release { key, pick } => {
                            let slot = SlotItem {
                                name: &name,
                                key: keys[key],
                                policy,
                                id: ids[key][pick % ids[key].len()],
                            };
                            let m = memory
                                .release(slot.name, slot.key, &policy, slot.id)
                                .expect("answered");
                            let r = redis_store
                                .release(&slot, NONE)
                                .await
                                .expect("redis answers");
                            if m.slot.is_some() {
                                released.fetch_add(1, Ordering::Relaxed);
                            }
                            let answer = |a: quotad_core::SlotAnswer| {
                                (a.slot.is_some(), a.remaining, 0, 0, 0, 2)
                            };
                            (answer(m), answer(r))
                        }
                        Op::ReleaseUnknown { key, id } => {
                            let slot = SlotItem {
                                name: &name,
                                key: keys[key],
                                policy,
                                id,
                            };
                            let m = memory
                                .release(slot.name, slot.key, &policy, id)
                                .expect("answered");
                            let r = redis_store
                                .release(&slot, NONE)
                                .await
                                .expect("redis answers");
                            let answer = |a: quotad_core::SlotAnswer| {
                                (a.slot.is_some(), a.remaining, 0, 0, 0, 3)
                            };
                            (answer(m), answer(r))
                        }
                    }
                });
                prop_assert_eq!(answers.0, answers.1, "at {} ms", now - START);
            }
            Ok(())
        })
        .expect("memory and Redis agree");
    // The sequences reached every kind of answer.
    for (what, n) in [
        ("admitted", &admitted),
        ("denied", &denied),
        ("renewed", &renewed),
        ("released", &released),
    ] {
        assert!(n.load(Ordering::Relaxed) > 20, "{what}: {n:?}");
    }
}
