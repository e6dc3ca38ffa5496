//! Concurrency limits: slots acquired, renewed and released on the memory
//! store, held against a model of the slots; in batches next to rates;
//! bounded, and carried by snapshots.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use quotad_core::{
    Algorithm, BatchMode, CheckItem, FakeClock, InvalidItem, MemoryStore, OnFull, Policy, Reason,
    SlotError, SnapshotReader, StoreConfig,
};

/// 2026-01-01 12:00:00 UTC.
const NOON: u64 = 1_767_268_800_000;

fn store(clock: &Arc<FakeClock>) -> MemoryStore {
    let config = StoreConfig::try_new(10_000, 4, OnFull::Deny).expect("valid config");
    MemoryStore::new(config, clock.clone())
}

fn conc(limit: u64, ttl_ms: u64) -> Policy {
    Policy::concurrency(limit, Duration::from_millis(ttl_ms)).expect("valid policy")
}

fn acquire<'a>(policy: Policy, key: &'a str, cost: u64, id: u64) -> CheckItem<'a> {
    CheckItem::acquire("jobs", policy, key, cost, id).expect("valid acquire")
}

#[test]
fn at_most_limit_units_are_held_and_a_release_frees_exactly_its_own() {
    let clock = Arc::new(FakeClock::new(NOON));
    let store = store(&clock);
    let p = conc(5, 30_000);
    for id in 1..=5 {
        let a = store.acquire(&acquire(p, "t", 1, id)).expect("acquired");
        assert!(a.decision.allowed, "slot {id}");
        assert_eq!(a.decision.remaining, 5 - id);
        let slot = a.slot.expect("a slot");
        assert_eq!((slot.id, slot.units, slot.ends_at), (id, 1, NOON + 30_000));
    }
    let denied = store.acquire(&acquire(p, "t", 1, 6)).expect("answered");
    assert_eq!(denied.decision.reason, Reason::LimitExceeded);
    assert_eq!(denied.slot, None);
    assert_eq!(denied.decision.retry_after_ms, 30_000);
    // Releasing an id no one holds frees nothing.
    let none = store.release("jobs", "t", &p, 99).expect("answered");
    assert_eq!((none.slot, none.remaining), (None, 0));
    assert!(
        !store
            .acquire(&acquire(p, "t", 1, 6))
            .expect("answered")
            .decision
            .allowed
    );
    let released = store.release("jobs", "t", &p, 3).expect("answered");
    assert_eq!(released.slot.map(|s| s.id), Some(3));
    assert_eq!(released.remaining, 1);
    // Released twice: answered as released, nothing more freed.
    let again = store.release("jobs", "t", &p, 3).expect("answered");
    assert_eq!((again.slot, again.remaining), (None, 1));
    assert!(
        store
            .acquire(&acquire(p, "t", 1, 6))
            .expect("answered")
            .decision
            .allowed
    );
    assert!(
        !store
            .acquire(&acquire(p, "t", 1, 7))
            .expect("answered")
            .decision
            .allowed
    );
}

#[test]
fn retry_after_is_the_earliest_end_that_frees_enough() {
    let clock = Arc::new(FakeClock::new(NOON));
    let store = store(&clock);
    let p = conc(10, 10_000);
    // Slots of 4, 3 and 3 units, ending 10 s, 12 s and 15 s from NOON.
    for (id, cost, at) in [(1, 4, 0), (2, 3, 2_000), (3, 3, 5_000)] {
        clock.set(NOON + at);
        assert!(
            store
                .acquire(&acquire(p, "t", cost, id))
                .expect("answered")
                .decision
                .allowed
        );
    }
    clock.set(NOON + 6_000);
    for (cost, wait) in [
        (1, 4_000),
        (4, 4_000),
        (5, 6_000),
        (7, 6_000),
        (8, 9_000),
        (10, 9_000),
    ] {
        let d = store
            .acquire(&acquire(p, "t", cost, 50))
            .expect("answered")
            .decision;
        assert_eq!((d.allowed, d.retry_after_ms), (false, wait), "cost {cost}");
        assert_eq!((d.remaining, d.reset_after_ms), (0, 9_000));
        // Denied one millisecond before, admitted at it.
        clock.set(NOON + 6_000 + wait - 1);
        assert!(
            !store.peek(&acquire(p, "t", cost, 50)).allowed,
            "cost {cost}"
        );
        clock.set(NOON + 6_000 + wait);
        assert!(
            store.peek(&acquire(p, "t", cost, 50)).allowed,
            "cost {cost}"
        );
        clock.set(NOON + 6_000);
    }
}

#[test]
fn a_renewed_slot_lives_on_and_an_expired_one_is_not_renewed() {
    let clock = Arc::new(FakeClock::new(NOON));
    let store = store(&clock);
    let p = conc(1, 1_000);
    assert!(
        store
            .acquire(&acquire(p, "t", 1, 1))
            .expect("answered")
            .decision
            .allowed
    );
    clock.advance(Duration::from_millis(900));
    let renewed = store.renew("jobs", "t", &p, 1).expect("answered");
    assert_eq!(renewed.slot.map(|s| s.ends_at), Some(NOON + 1_900));
    clock.advance(Duration::from_millis(999));
    assert!(
        !store
            .acquire(&acquire(p, "t", 1, 2))
            .expect("answered")
            .decision
            .allowed
    );
    clock.advance(Duration::from_millis(1));
    // Ended at 1,900 ms: not renewed, and its unit is free for another.
    assert_eq!(
        store.renew("jobs", "t", &p, 1).expect("answered").slot,
        None
    );
    let next = store.acquire(&acquire(p, "t", 1, 2)).expect("answered");
    assert!(next.decision.allowed);
    // The expired holder's late release does not free the new holder's slot.
    assert_eq!(
        store.release("jobs", "t", &p, 1).expect("answered").slot,
        None
    );
    assert!(
        !store
            .acquire(&acquire(p, "t", 1, 3))
            .expect("answered")
            .decision
            .allowed
    );
    assert_eq!(store.slots_expired(), 1);
}

#[test]
fn bad_acquires_are_refused_and_change_nothing() {
    let clock = Arc::new(FakeClock::new(NOON));
    let store = store(&clock);
    let p = conc(3, 1_000);
    assert_eq!(
        CheckItem::acquire("jobs", p, "t", 4, 1).map(|_| ()),
        Err(InvalidItem::CostAboveLimit { cost: 4, limit: 3 })
    );
    assert_eq!(
        CheckItem::acquire("jobs", p, "t", 0, 1).map(|_| ()),
        Err(InvalidItem::ZeroCost)
    );
    // A concurrency policy is acquired, never checked; a rate never acquired.
    assert_eq!(
        CheckItem::new("jobs", p, "t", 1).map(|_| ()),
        Err(InvalidItem::WrongOperation(Algorithm::Concurrency))
    );
    let rate = Policy::try_new(Algorithm::FixedWindow, 3, Duration::from_secs(1), None)
        .expect("valid policy");
    assert!(CheckItem::acquire("jobs", rate, "t", 1, 1).is_err());
    assert_eq!(
        store.release("jobs", "t", &rate, 1),
        Err(SlotError::NotConcurrency(Algorithm::FixedWindow))
    );
    // An id the key holds is refused for a new slot.
    assert!(
        store
            .acquire(&acquire(p, "t", 1, 7))
            .expect("answered")
            .decision
            .allowed
    );
    assert_eq!(
        store.acquire(&acquire(p, "t", 1, 7)),
        Err(SlotError::IdInUse)
    );
    assert_eq!(store.peek(&acquire(p, "t", 1, 8)).remaining, 2);
    assert_eq!(store.live_keys(), 1);
}

#[test]
fn a_key_holding_slots_is_never_evicted() {
    let clock = Arc::new(FakeClock::new(NOON));
    let config = StoreConfig::try_new(64, 1, OnFull::Evict).expect("valid config");
    let store = MemoryStore::new(config, clock.clone());
    let p = conc(2, 60_000);
    assert!(
        store
            .acquire(&acquire(p, "held", 2, 1))
            .expect("answered")
            .decision
            .allowed
    );
    let rate = Policy::try_new(Algorithm::FixedWindow, 3, Duration::from_secs(60), None)
        .expect("valid policy");
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    for k in &keys {
        store.check_one(&CheckItem::new("api", rate, k, 1).expect("valid item"));
    }
    assert!(store.evictions() > 0);
    assert!(
        !store
            .acquire(&acquire(p, "held", 1, 2))
            .expect("answered")
            .decision
            .allowed
    );
    assert_eq!(store.slots_held(), vec![("jobs".to_owned(), 2)]);
}

#[test]
fn a_full_byte_budget_denies_a_slot_that_needs_room_and_takes_nothing() {
    let clock = Arc::new(FakeClock::new(NOON));
    let config = StoreConfig::try_new(64, 1, OnFull::Deny)
        .and_then(|c| c.with_max_bytes(64 * 104 + 400))
        .expect("valid config");
    let store = MemoryStore::new(config, clock.clone());
    let p = conc(10_000, 60_000);
    let mut taken = 0;
    for id in 0..200 {
        let a = store.acquire(&acquire(p, "t", 1, id)).expect("answered");
        if !a.decision.allowed {
            assert_eq!(a.decision.reason, Reason::Capacity);
            break;
        }
        taken += 1;
    }
    assert!(taken > 0 && taken < 200, "{taken} slots");
    assert!(store.used_bytes() <= 64 * 104 + 400);
    assert_eq!(
        store.peek(&acquire(p, "t", 1, 999)).remaining,
        10_000 - taken
    );
    // A release makes room for the next.
    assert!(
        store
            .release("jobs", "t", &p, 0)
            .expect("answered")
            .slot
            .is_some()
    );
    assert!(
        store
            .acquire(&acquire(p, "t", 1, 500))
            .expect("answered")
            .decision
            .allowed
    );
}

#[test]
fn an_all_or_nothing_batch_takes_its_slots_only_when_every_item_fits() {
    let clock = Arc::new(FakeClock::new(NOON));
    let store = store(&clock);
    let slots = conc(2, 10_000);
    let rate = Policy::try_new(Algorithm::FixedWindow, 3, Duration::from_secs(60), None)
        .expect("valid policy");
    let batch = |id: u64| {
        vec![
            CheckItem::new("per-minute", rate, "t", 1).expect("valid item"),
            CheckItem::acquire("at-once", slots, "t", 1, id).expect("valid acquire"),
        ]
    };
    for id in [1, 2] {
        let d = store.check(&batch(id), BatchMode::AllOrNothing);
        assert!(d.iter().all(|d| d.allowed), "{d:?}");
    }
    // The third: the rate would admit, the slots are full: nothing taken.
    let d = store.check(&batch(3), BatchMode::AllOrNothing);
    assert_eq!(d[0].reason, Reason::BatchRejected);
    assert_eq!(
        (d[1].reason, d[1].retry_after_ms),
        (Reason::LimitExceeded, 10_000)
    );
    let peek_rate = CheckItem::new("per-minute", rate, "t", 1).expect("valid item");
    assert_eq!(store.peek(&peek_rate).remaining, 1);
    // Releasing one lets the next batch in; the rate then denies a fourth
    // and the slot it would have taken is not taken.
    assert!(
        store
            .release("at-once", "t", &slots, 1)
            .expect("answered")
            .slot
            .is_some()
    );
    assert!(
        store
            .check(&batch(4), BatchMode::AllOrNothing)
            .iter()
            .all(|d| d.allowed)
    );
    assert!(
        store
            .release("at-once", "t", &slots, 2)
            .expect("answered")
            .slot
            .is_some()
    );
    let d = store.check(&batch(5), BatchMode::AllOrNothing);
    assert_eq!(
        (d[0].reason, d[1].reason),
        (Reason::LimitExceeded, Reason::BatchRejected)
    );
    assert_eq!(
        store
            .release("at-once", "t", &slots, 5)
            .expect("answered")
            .slot,
        None
    );
    let peek_slot = CheckItem::acquire("at-once", slots, "t", 1, 9).expect("valid acquire");
    assert_eq!(store.peek(&peek_slot).remaining, 1);
    // Two acquires of one key in one batch see each other.
    let two = [
        CheckItem::acquire("at-once", slots, "t", 1, 6).expect("valid acquire"),
        CheckItem::acquire("at-once", slots, "t", 1, 7).expect("valid acquire"),
    ];
    let d = store.check(&two, BatchMode::AllOrNothing);
    assert_eq!(
        (d[1].reason, d[0].reason),
        (Reason::LimitExceeded, Reason::BatchRejected)
    );
    assert_eq!(store.peek(&peek_slot).remaining, 1);
}

#[test]
fn slots_survive_a_snapshot_and_end_when_they_would_have() {
    let clock = Arc::new(FakeClock::new(NOON));
    let store = store(&clock);
    let p = conc(3, 5_000);
    for (id, at) in [(1, 0), (2, 1_000)] {
        clock.set(NOON + at);
        assert!(
            store
                .acquire(&acquire(p, "t", 1, id))
                .expect("answered")
                .decision
                .allowed
        );
    }
    let mut file = Vec::new();
    store.export(&mut file, b"").expect("writing to a Vec");
    let config = StoreConfig::try_new(10_000, 4, OnFull::Deny).expect("valid config");
    let (restored, report) = SnapshotReader::open(file.as_slice())
        .and_then(|r| r.load(config, clock.clone(), |_| true))
        .expect("loads");
    assert_eq!(report.namespaces["jobs"].loaded, 1);
    for s in [&store, &restored] {
        let d = s
            .acquire(&acquire(p, "t", 2, 3))
            .expect("answered")
            .decision;
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms),
            (false, 1, 4_000)
        );
    }
    // The restored store knows the slots by id.
    assert_eq!(
        restored
            .release("jobs", "t", &p, 2)
            .expect("answered")
            .remaining,
        2
    );
    assert!(
        restored
            .renew("jobs", "t", &p, 1)
            .expect("answered")
            .slot
            .is_some()
    );
}

/// One step of a run: acquire (key, cost, id), renew or release a slot
/// picked from those handed out (or an id never handed out), or let time
/// pass.
#[derive(Clone, Debug)]
enum Op {
    Acquire(u8, u64),
    Renew(usize),
    Release(usize),
    ReleaseUnknown(u8),
    Batch(Vec<(u8, u64)>),
    Sweep,
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..3, 1u64..=4).prop_map(|(k, c)| Op::Acquire(k, c)),
        2 => any::<usize>().prop_map(Op::Renew),
        3 => any::<usize>().prop_map(Op::Release),
        1 => (0u8..3).prop_map(Op::ReleaseUnknown),
        2 => prop::collection::vec((0u8..3, 1u64..=4), 1..4).prop_map(Op::Batch),
        1 => Just(Op::Sweep),
        4 => prop_oneof![0u64..50, 0u64..2_000].prop_map(Op::Advance),
    ]
}

/// The model: per key, the slots held as `(id, units, ends_at)`.
#[derive(Default)]
struct Model {
    slots: [Vec<(u64, u64, u64)>; 3],
}

impl Model {
    fn live(&self, k: usize, now: u64) -> impl Iterator<Item = &(u64, u64, u64)> {
        self.slots[k].iter().filter(move |s| s.2 > now)
    }

    fn held_at(&self, k: usize, now: u64, t: u64) -> u64 {
        self.live(k, now).filter(|s| s.2 > t).map(|s| s.1).sum()
    }

    /// The smallest wait after which `cost` fits, found by trying every
    /// instant a slot ends at, and checked against the instant before.
    fn retry_after(&self, k: usize, now: u64, cost: u64, limit: u64) -> u64 {
        let mut ends: Vec<u64> = self.live(k, now).map(|s| s.2).collect();
        ends.sort_unstable();
        let t = ends
            .into_iter()
            .find(|&e| self.held_at(k, now, e) + cost <= limit)
            .expect("a cost within the limit fits once every slot ends");
        assert!(self.held_at(k, now, t - 1) + cost > limit);
        t - now
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_store_holds_exactly_the_slots_the_model_holds(
        ops in prop::collection::vec(op(), 1..150),
        limit in 1u64..8,
        ttl in 1u64..3_000,
    ) {
        let clock = Arc::new(FakeClock::new(NOON));
        let store = store(&clock);
        let p = conc(limit, ttl);
        let keys = ["a", "b", "c"];
        let mut model = Model::default();
        let mut handed: Vec<(usize, u64)> = Vec::new();
        let mut next_id = 1u64;
        for op in &ops {
            let now = clock.now_ms_value();
            match op {
                Op::Acquire(k, cost) => {
                    let (k, cost) = (usize::from(*k), (*cost).min(limit));
                    let id = next_id;
                    next_id += 1;
                    let a = store.acquire(&acquire(p, keys[k], cost, id)).expect("answered");
                    let held = model.held_at(k, now, now);
                    prop_assert_eq!(a.decision.allowed, held + cost <= limit);
                    if a.decision.allowed {
                        let slot = a.slot.expect("a slot when admitted");
                        prop_assert_eq!((slot.id, slot.units, slot.ends_at), (id, cost, now + ttl));
                        model.slots[k].push((id, cost, now + ttl));
                        handed.push((k, id));
                        prop_assert_eq!(a.decision.remaining, limit - held - cost);
                    } else {
                        prop_assert_eq!(a.slot, None);
                        prop_assert_eq!(a.decision.reason, Reason::LimitExceeded);
                        prop_assert_eq!(a.decision.remaining, limit.saturating_sub(held));
                        prop_assert_eq!(
                            a.decision.retry_after_ms,
                            model.retry_after(k, now, cost, limit)
                        );
                    }
                }
                Op::Batch(items) => {
                    let first = next_id;
                    let items: Vec<CheckItem<'_>> = items
                        .iter()
                        .enumerate()
                        .map(|(i, &(k, c))| acquire(p, keys[usize::from(k)], c.min(limit), first + i as u64))
                        .collect();
                    next_id += items.len() as u64;
                    let d = store.check(&items, BatchMode::AllOrNothing);
                    // The model admits the batch when every key's slots
                    // plus all the batch asks of it fit.
                    let fits = (0..3).all(|k| {
                        let asked: u64 = items.iter().filter(|i| i.key() == keys[k]).map(|i| i.cost().get()).sum();
                        model.held_at(k, now, now) + asked <= limit
                    });
                    prop_assert_eq!(d.iter().all(|d| d.allowed), fits);
                    if fits {
                        for i in &items {
                            let k = keys.iter().position(|&key| key == i.key()).expect("a key");
                            let id = i.slot().expect("an acquire");
                            model.slots[k].push((id, i.cost().get(), now + ttl));
                            handed.push((k, id));
                        }
                    }
                }
                Op::Renew(_) | Op::Release(_) if handed.is_empty() => {}
                Op::Renew(i) => {
                    let (k, id) = handed[i % handed.len()];
                    let r = store.renew("jobs", keys[k], &p, id).expect("answered");
                    let live = model.slots[k].iter_mut().find(|s| s.0 == id && s.2 > now);
                    prop_assert_eq!(r.slot.is_some(), live.is_some());
                    if let Some(s) = live {
                        s.2 = now + ttl;
                        prop_assert_eq!(r.slot.map(|g| g.ends_at), Some(now + ttl));
                    }
                    prop_assert_eq!(r.remaining, limit.saturating_sub(model.held_at(k, now, now)));
                }
                Op::Release(i) => {
                    let (k, id) = handed[i % handed.len()];
                    let r = store.release("jobs", keys[k], &p, id).expect("answered");
                    let live = model.slots[k].iter().position(|s| s.0 == id && s.2 > now);
                    prop_assert_eq!(r.slot.is_some(), live.is_some());
                    model.slots[k].retain(|s| s.0 != id);
                    prop_assert_eq!(r.remaining, limit.saturating_sub(model.held_at(k, now, now)));
                }
                Op::ReleaseUnknown(k) => {
                    let k = usize::from(*k);
                    let r = store.release("jobs", keys[k], &p, u64::MAX - 1).expect("answered");
                    prop_assert_eq!(r.slot, None);
                    prop_assert_eq!(r.remaining, limit.saturating_sub(model.held_at(k, now, now)));
                }
                Op::Sweep => {
                    for _ in 0..4 {
                        store.sweep_step();
                    }
                }
                Op::Advance(ms) => clock.advance(Duration::from_millis(*ms)),
            }
            let now = clock.now_ms_value();
            for (k, key) in keys.iter().enumerate() {
                let held = model.held_at(k, now, now);
                prop_assert_eq!(store.peek(&acquire(p, key, 1, 0)).remaining, limit - held);
            }
        }
    }
}

/// The fake clock's reading.
trait NowValue {
    fn now_ms_value(&self) -> u64;
}

impl NowValue for FakeClock {
    fn now_ms_value(&self) -> u64 {
        quotad_core::Clock::now_ms(self)
    }
}
