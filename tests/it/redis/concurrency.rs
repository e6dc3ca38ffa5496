//! Concurrency slots on Redis decide as quotad-core's do: the same random
//! sequences of acquires (ids across the whole u64 range), renewals,
//! releases of held, ended and unknown slots, and time passing, fed to the
//! memory store and to Redis at injected instants, must answer the same:
//! every decision with its remaining, exact retry and reset times, every
//! slot's end, every renewal and release. And the same for acquires as
//! items of batches next to a rate (all-or-nothing and independent, two
//! acquires of one key in one batch, ids held already) and for peeks of a
//! concurrency policy: every item's decision, and what they leave.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use quotad::backend::{Backend, Deadline, SlotItem};
use quotad_core::{Algorithm, BatchMode, CheckItem, Clock, Decision, FakeClock, Policy, Reason};

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

/// An operation of the batch sequences: a batch of a rate item and one or
/// two acquires on `key` (the rate first or last), a peek of the
/// concurrency policy, or a release of a held slot.
#[derive(Clone, Debug)]
enum BatchOp {
    Batch {
        key: usize,
        all: bool,
        rate_first: bool,
        rate_cost: u64,
        acquires: Vec<(u64, u64)>,
    },
    Peek {
        key: usize,
        cost: u64,
    },
    Release {
        key: usize,
        pick: usize,
    },
}

fn batch_ops() -> impl Strategy<Value = Vec<(u64, BatchOp)>> {
    // Ids from a small range too, so that some are held already (or twice
    // in one batch).
    let id = prop_oneof![any::<u64>(), (0u64..6).prop_map(|i| u64::MAX - i)];
    let op = prop_oneof![
        6 => (
            0usize..2,
            any::<bool>(),
            any::<bool>(),
            1u64..=3,
            prop::collection::vec((1u64..=4, id), 1..=2),
        )
            .prop_map(|(key, all, rate_first, rate_cost, acquires)| BatchOp::Batch {
                key,
                all,
                rate_first,
                rate_cost,
                acquires,
            }),
        3 => (0usize..2, 1u64..=4).prop_map(|(key, cost)| BatchOp::Peek { key, cost }),
        3 => (0usize..2, any::<usize>()).prop_map(|(key, pick)| BatchOp::Release { key, pick }),
    ];
    prop::collection::vec((any::<u64>(), op), 1..40)
}

#[test]
fn memory_and_redis_decide_acquires_in_batches_and_peeks_alike() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let clock = Arc::new(FakeClock::new(START));
    let (redis_store, memory) = both_stores(&runtime, &redis, &clock);
    let cases = AtomicU64::new(0);
    // How often each kind of answer came, to show the sequences reach
    // them: [all taken, all rejected by the slots, all rejected by the
    // rate, independent, an id held, a peek denied].
    let seen: [AtomicU64; 6] = Default::default();
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 150,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(1u64..=5, 1u64..=3_000, 1u64..=8, batch_ops()),
            |(limit, ttl, rate_limit, ops)| {
                let case = cases.fetch_add(1, Ordering::Relaxed);
                let (slots_name, rate_name) = (format!("bslots{case}"), format!("brate{case}"));
                let slots = Policy::concurrency(limit, Duration::from_millis(ttl)).expect("valid");
                let rate = Policy::try_new(
                    Algorithm::FixedWindow,
                    rate_limit,
                    Duration::from_millis(2 * ttl),
                    None,
                )
                .expect("valid");
                let keys = ["alice", "{team}bob"];
                let mut ids: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
                clock.set(START);
                for (step, op) in ops {
                    clock.advance(Duration::from_millis(step % (ttl / 2 + 2)));
                    let now = clock.now_ms();
                    let (from_memory, from_redis): (Vec<Decision>, Vec<Decision>) = runtime
                        .block_on(async {
                            match &op {
                                BatchOp::Batch {
                                    key,
                                    all,
                                    rate_first,
                                    rate_cost,
                                    acquires,
                                } => {
                                    let k = keys[*key];
                                    let mut items: Vec<CheckItem<'_>> = acquires
                                        .iter()
                                        .map(|&(cost, id)| {
                                            CheckItem::acquire(
                                                &slots_name,
                                                slots,
                                                k,
                                                cost.min(limit),
                                                id,
                                            )
                                            .expect("valid acquire")
                                        })
                                        .collect();
                                    let rated = CheckItem::new(
                                        &rate_name,
                                        rate,
                                        k,
                                        (*rate_cost).min(rate_limit),
                                    )
                                    .expect("valid check");
                                    if *rate_first {
                                        items.insert(0, rated);
                                    } else {
                                        items.push(rated);
                                    }
                                    let mode = if *all {
                                        BatchMode::AllOrNothing
                                    } else {
                                        BatchMode::Independent
                                    };
                                    let m = memory.check(&items, mode);
                                    let r: Vec<Decision> =
                                        Backend::check(&redis_store, &items, mode, NONE)
                                            .await
                                            .into_iter()
                                            .map(|d| d.expect("redis answers"))
                                            .collect();
                                    for (item, d) in items.iter().zip(&m) {
                                        if let (Some(id), true) = (item.slot(), d.allowed) {
                                            ids[*key].push(id);
                                        }
                                    }
                                    let which = if !*all {
                                        3
                                    } else if m.iter().any(|d| d.reason == Reason::Capacity) {
                                        4
                                    } else if m.iter().all(|d| d.allowed) {
                                        0
                                    } else if m[usize::from(!*rate_first) * (items.len() - 1)]
                                        .allowed
                                        || m[usize::from(!*rate_first) * (items.len() - 1)].reason
                                            == Reason::BatchRejected
                                    {
                                        1
                                    } else {
                                        2
                                    };
                                    seen[which].fetch_add(1, Ordering::Relaxed);
                                    (m, r)
                                }
                                BatchOp::Peek { key, cost } => {
                                    let item = CheckItem::acquire(
                                        &slots_name,
                                        slots,
                                        keys[*key],
                                        (*cost).min(limit),
                                        7,
                                    )
                                    .expect("valid acquire");
                                    let m = memory.peek(&item);
                                    let r = Backend::peek(&redis_store, &item, NONE)
                                        .await
                                        .expect("redis answers");
                                    if !m.allowed {
                                        seen[5].fetch_add(1, Ordering::Relaxed);
                                    }
                                    // A peek of both keys at once, as peek_each does.
                                    let other = CheckItem::acquire(
                                        &slots_name,
                                        slots,
                                        keys[1 - *key],
                                        1,
                                        7,
                                    )
                                    .expect("valid acquire");
                                    let both = [item, other];
                                    let r_each: Vec<Decision> = redis_store
                                        .peek_each(&both, NONE)
                                        .await
                                        .into_iter()
                                        .map(|d| d.expect("redis answers"))
                                        .collect();
                                    let m_each: Vec<Decision> =
                                        both.iter().map(|i| memory.peek(i)).collect();
                                    (vec![m, m_each[0], m_each[1]], vec![r, r_each[0], r_each[1]])
                                }
                                BatchOp::Release { key, pick } => {
                                    if ids[*key].is_empty() {
                                        return (Vec::new(), Vec::new());
                                    }
                                    let id = ids[*key].swap_remove(pick % ids[*key].len());
                                    let slot = SlotItem {
                                        name: &slots_name,
                                        key: keys[*key],
                                        policy: slots,
                                        id,
                                    };
                                    let m = memory
                                        .release(slot.name, slot.key, &slots, id)
                                        .expect("answered");
                                    let r = redis_store
                                        .release(&slot, NONE)
                                        .await
                                        .expect("redis answers");
                                    let free = |a: quotad_core::SlotAnswer| Decision {
                                        allowed: a.slot.is_some(),
                                        limit: a.limit,
                                        remaining: a.remaining,
                                        retry_after_ms: 0,
                                        reset_after_ms: 0,
                                        reason: Reason::WithinLimit,
                                    };
                                    (vec![free(m)], vec![free(r)])
                                }
                            }
                        });
                    prop_assert_eq!(from_memory, from_redis, "{:?} at {} ms", op, now - START);
                }
                Ok(())
            },
        )
        .expect("memory and Redis agree");
    for (what, n) in [
        "all taken",
        "rejected by the slots",
        "rejected by the rate",
        "independent",
        "an id held",
        "a peek denied",
    ]
    .iter()
    .zip(&seen)
    {
        assert!(n.load(Ordering::Relaxed) > 5, "{what}: {n:?}");
    }
}
