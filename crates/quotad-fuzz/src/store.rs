//! A [`MemoryStore`] driven by an arbitrary list of operations on a
//! [`FakeClock`]: checks, batches in both modes, peeks, resets, sweeps,
//! and the clock moving (also backwards).
//!
//! With room to spare (no byte budget, more keys allowed than the input
//! can name), the store must decide exactly as [`decide`] and [`peek`] do
//! on a plain map of states: sharding, locking and sweeping change no
//! decision. State the store may have dropped as fresh is forgotten on
//! both sides before each operation (see `Harness::forget_fresh` for the
//! two cases where dropping it is not neutral: a clock step back, and a
//! policy whose window grew). With a tight budget it is checked against
//! its bounds: live keys within `max_keys`, counted bytes within
//! `max_bytes`, no eviction unless `on_full = evict`, and every decision
//! keeps the rules of [`check_decision`]; in `deny` mode, the map model
//! still holds except where the store answers `CAPACITY`, which it may
//! only do to a cost that fits, and which changes nothing.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use quotad_core::{
    Algorithm, BatchMode, CheckItem, Decision, FakeClock, MemoryStore, OnFull, Policy, Reason,
    State, StoreConfig, decide, peek,
};

use crate::invariants::check_decision;

/// Policy names: state is kept per (name, key).
const NAMES: [&str; 3] = ["a", "b", "rls:edge/user"];

/// Keys: short ones, kept inline by the store, and long ones on the heap.
fn key(k: u8) -> String {
    match k % 4 {
        0 | 1 => format!("k{}", k % 32),
        2 => format!("k{}-{}", k % 32, "x".repeat(40)),
        _ => format!("k{}-{}", k % 32, "y".repeat(250)),
    }
}

/// The policies a request picks from; a name is not tied to one, so a
/// key's state is sometimes another policy's (as after a reload).
fn policies() -> Vec<Policy> {
    let p = |algorithm, limit, ms, burst| {
        Policy::try_new(algorithm, limit, Duration::from_millis(ms), burst)
            .expect("the fuzzed policies are valid")
    };
    vec![
        p(Algorithm::FixedWindow, 5, 1_000, None),
        p(Algorithm::SlidingWindow, 10, 2_000, None),
        p(Algorithm::TokenBucket, 3, 1_000, Some(6)),
        p(Algorithm::LeakyBucket, 4, 500, Some(2)),
        p(Algorithm::SlidingLog, 8, 2_000, None),
        p(Algorithm::SlidingLog, 200, 5_000, None),
        p(Algorithm::FixedWindow, 1, 60_000, None),
        p(Algorithm::TokenBucket, 1_000, 1, None),
    ]
}

/// One check: which name, policy and key, and how much.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct Req {
    name: u8,
    policy: u8,
    key: u8,
    cost: u8,
}

/// One operation on the store.
#[derive(Arbitrary, Clone, Debug)]
pub enum Op {
    /// `check_one`.
    Check(Req),
    /// `check` of a batch; `true` for all-or-nothing.
    Batch(Vec<Req>, bool),
    /// `peek`.
    Peek(Req),
    /// `reset` of (name, key).
    Reset(u8, u8),
    /// One `sweep_step`.
    Sweep,
    /// The clock moves forward this many ms.
    Advance(u16),
    /// The clock moves forward this many seconds.
    Leap(u8),
    /// The clock steps back this many ms.
    Back(u8),
}

/// The store's bounds.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub struct Bounds {
    /// No byte budget and keys to spare: the exact model applies.
    roomy: bool,
    max_keys: u16,
    shards_log2: u8,
    evict: bool,
    max_bytes: Option<u16>,
}

/// A whole input.
#[derive(Arbitrary, Clone, Debug)]
pub struct Input {
    bounds: Bounds,
    ops: Vec<Op>,
}

/// Decodes a structured input from `data` and runs it.
pub fn run(data: &[u8]) {
    if let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) {
        run_input(&input);
    }
}

/// A key of the model: (index into [`NAMES`], key).
type Slot = (usize, String);

/// The states a store with room would hold, by (name, key), each with the
/// instant it turns fresh (as the store computes it).
#[derive(Debug, Default)]
struct Model {
    states: HashMap<Slot, (State, u64)>,
}

impl Model {
    fn state(&self, slot: &Slot) -> Option<&State> {
        self.states.get(slot).map(|(state, _)| state)
    }

    fn write(&mut self, slot: Slot, state: Option<State>, now: u64, decision: &Decision) {
        match state {
            Some(state) => {
                let fresh_at = now.saturating_add(decision.reset_after_ms);
                self.states.insert(slot, (state, fresh_at));
            }
            None => {
                self.states.remove(&slot);
            }
        }
    }

    /// The keys whose state was fresh by `instant`: the store may have
    /// dropped them by then.
    fn fresh_by(&self, instant: u64) -> Vec<Slot> {
        self.states
            .iter()
            .filter(|(_, (_, fresh_at))| *fresh_at <= instant)
            .map(|(slot, _)| slot.clone())
            .collect()
    }
}

struct Harness {
    store: MemoryStore,
    clock: Arc<FakeClock>,
    policies: Vec<Policy>,
    /// `Some` while the store must decide as the model does.
    model: Option<Model>,
    /// Whether the model holds except for `CAPACITY` denials.
    tight_deny: bool,
    /// The latest instant the clock has shown.
    latest: u64,
}

/// Runs one input's operations, checking the store after each.
pub fn run_input(input: &Input) {
    let b = input.bounds;
    let on_full = if b.evict { OnFull::Evict } else { OnFull::Deny };
    let shards = 1usize << (b.shards_log2 % 5);
    let config = if b.roomy {
        StoreConfig::try_new(1 << 20, shards, on_full)
    } else {
        let max_keys = usize::from(b.max_keys % 512).max(1);
        StoreConfig::try_new(max_keys, shards, on_full).and_then(|c| match b.max_bytes {
            // The least a store takes: 64 entries of ENTRY_BYTES.
            Some(bytes) => c.with_max_bytes(64 * quotad_core::ENTRY_BYTES + usize::from(bytes)),
            None => Ok(c),
        })
    }
    .expect("the fuzzed store configurations are valid");
    let clock = Arc::new(FakeClock::new(1_767_225_600_000));
    let mut h = Harness {
        store: MemoryStore::new(config, clock.clone()),
        clock,
        policies: policies(),
        model: (b.roomy || !b.evict).then(Model::default),
        tight_deny: !b.roomy,
        latest: 0,
    };
    for op in input.ops.iter().take(512) {
        h.apply(op);
        h.check_bounds();
    }
}

impl Harness {
    fn item<'a>(&self, r: &Req, key: &'a str) -> CheckItem<'a> {
        let policy = self.policies[usize::from(r.policy) % self.policies.len()];
        let name = NAMES[usize::from(r.name) % NAMES.len()];
        CheckItem::new(name, policy, key, cost_of(r.cost).get())
            .expect("the fuzzed items are valid")
    }

    fn slot(r: &Req) -> Slot {
        (usize::from(r.name) % NAMES.len(), key(r.key))
    }

    fn apply(&mut self, op: &Op) {
        // The store's time: its clock, never before its latest drop.
        let now = self.store.now_ms();
        self.latest = self.latest.max(now);
        self.forget_fresh();
        match op {
            Op::Check(r) => {
                let k = key(r.key);
                let item = self.item(r, &k);
                let got = self.store.check_one(&item);
                self.check_one(r, &item, got, now);
            }
            Op::Batch(rs, all) => {
                let rs: Vec<Req> = rs.iter().take(16).copied().collect();
                if rs.is_empty() {
                    return;
                }
                let keys: Vec<String> = rs.iter().map(|r| key(r.key)).collect();
                let items: Vec<CheckItem<'_>> =
                    rs.iter().zip(&keys).map(|(r, k)| self.item(r, k)).collect();
                let mode = if *all {
                    BatchMode::AllOrNothing
                } else {
                    BatchMode::Independent
                };
                let got = self.store.check(&items, mode);
                assert_eq!(got.len(), items.len(), "one decision per item");
                if *all {
                    self.check_all_or_nothing(&rs, &items, &got, now);
                } else {
                    for ((r, item), d) in rs.iter().zip(&items).zip(got) {
                        self.check_one(r, item, d, now);
                    }
                }
            }
            Op::Peek(r) => {
                let k = key(r.key);
                let item = self.item(r, &k);
                let got = self.store.peek(&item);
                check_decision(&got, item.policy().capacity(), item.cost().get());
                if let Some(model) = &self.model {
                    let want = peek(item.policy(), model.state(&Self::slot(r)), now, item.cost());
                    self.agree(&got, &want, "peek");
                }
            }
            Op::Reset(n, k) => {
                let name = NAMES[usize::from(*n) % NAMES.len()];
                let key = key(*k);
                let had = self.store.reset(name, &key);
                if let Some(model) = &mut self.model {
                    let was = model.states.remove(&(usize::from(*n) % NAMES.len(), key));
                    // The store may already have dropped state that was fresh.
                    assert!(!had || was.is_some(), "reset found state the model lacks");
                }
            }
            Op::Sweep => {
                self.store.sweep_step();
            }
            Op::Advance(ms) => self.clock.advance(Duration::from_millis(u64::from(*ms))),
            Op::Leap(s) => self.clock.advance(Duration::from_secs(u64::from(*s))),
            Op::Back(ms) => self.clock.set(now.saturating_sub(u64::from(*ms))),
        }
    }

    /// A decision of the store against the model's, for one item decided
    /// alone.
    fn check_one(&mut self, r: &Req, item: &CheckItem<'_>, got: Decision, now: u64) {
        check_decision(&got, item.policy().capacity(), item.cost().get());
        let tight_deny = self.tight_deny;
        let Some(model) = &mut self.model else {
            return;
        };
        let slot = Self::slot(r);
        let (state, want) = decide(item.policy(), model.state(&slot).cloned(), now, item.cost());
        if got.reason == Reason::Capacity && tight_deny {
            assert!(
                want.allowed,
                "CAPACITY for a cost that does not fit: {want:?}"
            );
            return;
        }
        Self::agree_with(&got, &want, "check", tight_deny);
        model.write(slot, state, now, &want);
    }

    /// An all-or-nothing batch: every item admitted and the model advanced,
    /// or nothing admitted and the model unchanged.
    fn check_all_or_nothing(
        &mut self,
        rs: &[Req],
        items: &[CheckItem<'_>],
        got: &[Decision],
        now: u64,
    ) {
        for (item, d) in items.iter().zip(got) {
            check_decision(d, item.policy().capacity(), item.cost().get());
        }
        let admitted = got.iter().filter(|d| d.allowed).count();
        assert!(
            admitted == 0 || admitted == got.len(),
            "an all-or-nothing batch admitted {admitted} of {}",
            got.len()
        );
        let tight_deny = self.tight_deny;
        let Some(model) = &mut self.model else {
            return;
        };
        // The batch decided in order on a copy, each key seeing its own
        // earlier items.
        let mut scratch: HashMap<Slot, (Option<State>, Decision)> = HashMap::new();
        let mut wanted = Vec::with_capacity(items.len());
        for (r, item) in rs.iter().zip(items) {
            let slot = Self::slot(r);
            let current = match scratch.get(&slot) {
                Some((state, _)) => state.clone(),
                None => model.state(&slot).cloned(),
            };
            let (state, want) = decide(item.policy(), current, now, item.cost());
            scratch.insert(slot, (state, want));
            wanted.push(want);
        }
        let fits = wanted.iter().all(|d| d.allowed);
        let short = got.iter().any(|d| d.reason == Reason::Capacity);
        if fits && !short {
            for (d, want) in got.iter().zip(&wanted) {
                Self::agree_with(d, want, "batch item", tight_deny);
            }
            for (slot, (state, last)) in scratch {
                model.write(slot, state, now, &last);
            }
            return;
        }
        assert!(
            !short || (fits && tight_deny),
            "CAPACITY in a batch with room: {got:?}"
        );
        // Rejected: the items that fit are BATCH_REJECTED (or CAPACITY),
        // showing their key as it was; the others keep their own denial.
        for ((r, item), (d, want)) in rs.iter().zip(items).zip(got.iter().zip(&wanted)) {
            if d.reason == Reason::Capacity {
                continue;
            }
            if want.allowed {
                let was = peek(item.policy(), model.state(&Self::slot(r)), now, item.cost());
                assert_eq!(
                    (d.reason, d.remaining, d.limit),
                    (Reason::BatchRejected, was.remaining, was.limit),
                    "a rejected batch's item that fit"
                );
            } else {
                Self::agree_with(d, want, "a rejected batch's denied item", tight_deny);
            }
        }
    }

    /// Before each operation: the store may have dropped any state that was
    /// fresh (by the policy that wrote it) at the latest instant the clock
    /// showed, whenever a sweep or a purge reached it. Dropping it changes
    /// no decision while the clock moves forward and the policy stays; it
    /// does after a clock step back (the key starts fresh at the earlier
    /// time) or under a policy with a longer window (whose entries would
    /// still count). Both forget those keys, so they agree again.
    fn forget_fresh(&mut self) {
        let Some(model) = &mut self.model else {
            return;
        };
        for slot in model.fresh_by(self.latest) {
            self.store.reset(NAMES[slot.0], &slot.1);
            model.states.remove(&slot);
        }
    }

    fn agree(&self, got: &Decision, want: &Decision, what: &str) {
        if got.reason == Reason::Capacity && self.tight_deny {
            assert!(
                want.allowed,
                "{what}: CAPACITY for a cost that does not fit"
            );
            return;
        }
        Self::agree_with(got, want, what, self.tight_deny);
    }

    fn agree_with(got: &Decision, want: &Decision, what: &str, tight_deny: bool) {
        if tight_deny && got.reason == Reason::Capacity {
            return;
        }
        assert_eq!(got, want, "{what}: the store and decide() disagree");
    }

    fn check_bounds(&self) {
        let config = self.store.config();
        let live = self.store.live_keys();
        assert!(
            live <= config.max_keys(),
            "{live} keys over {}",
            config.max_keys()
        );
        if let Some(max) = config.max_bytes() {
            let used = self.store.used_bytes();
            assert!(used <= max, "{used} bytes over {max}");
        }
        if config.on_full() == OnFull::Deny {
            assert_eq!(self.store.evictions(), 0, "evicted in deny mode");
        }
        if let Some(model) = &self.model {
            // The store drops state only when it is fresh; the model keeps it.
            let held = model.states.len();
            assert!(live <= held, "{live} live keys, {held} in the model");
        }
    }
}

/// A request's cost: mostly 1 to 15, sometimes past every capacity.
fn cost_of(cost: u8) -> NonZeroU64 {
    NonZeroU64::new(u64::from(cost % 16).max(1) + if cost >= 250 { 1_000 } else { 0 })
        .expect("at least 1")
}
