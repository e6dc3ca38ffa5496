//! The embedded default store: a fixed number of shards, each a mutex over
//! its own table.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use foldhash::HashMap;
use parking_lot::{Mutex, MutexGuard};
use thiserror::Error;

use super::item::{BatchMode, CheckItem};
use super::shard::{KeyHasher, Shard, StoreKey, key_hash};
use crate::algorithm::{self, State};
use crate::clock::Clock;
use crate::decision::{Decision, Reason};
use crate::policy::Policy;

/// A shard holds at least this many keys before the store splits further,
/// so that uneven hashing costs little of the bound.
const MIN_KEYS_PER_SHARD: usize = 64;

/// The shard index comes from 16 bits of the key hash.
const MAX_SHARDS: usize = 1 << 16;

/// What to do with a new key when its shard is full of live state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum OnFull {
    /// Deny the new key with reason [`Reason::Capacity`]; existing keys go on.
    #[default]
    Deny,
    /// Evict the live key closest to fresh (about the least recently used).
    /// Its budget starts over; every eviction is counted.
    Evict,
}

/// A store configuration that breaks a rule.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum StoreConfigError {
    /// `max_keys` is zero.
    #[error("max_keys must be at least 1")]
    MaxKeysZero,
    /// `shards` is not a power of two between 1 and 65,536.
    #[error("shards must be a power of two from 1 to 65536 (got {0})")]
    ShardsNotPowerOfTwo(usize),
}

/// Bounds and layout of a [`MemoryStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    max_keys: usize,
    shards: usize,
    on_full: OnFull,
}

impl StoreConfig {
    /// At most `max_keys` keys in `shards` shards (a power of two; fewer are
    /// used when `max_keys` is small, so each shard holds at least 64 keys).
    ///
    /// The bound is kept per shard, `max_keys / shards` each, so a shard that
    /// hashing filled early is full a little before the table is.
    ///
    /// # Errors
    ///
    /// [`StoreConfigError`] when `max_keys` is 0 or `shards` is not a power
    /// of two from 1 to 65,536.
    pub fn try_new(
        max_keys: usize,
        shards: usize,
        on_full: OnFull,
    ) -> Result<Self, StoreConfigError> {
        if max_keys == 0 {
            return Err(StoreConfigError::MaxKeysZero);
        }
        if !shards.is_power_of_two() || shards > MAX_SHARDS {
            return Err(StoreConfigError::ShardsNotPowerOfTwo(shards));
        }
        let fit = (max_keys / MIN_KEYS_PER_SHARD).max(1);
        let fit = 1 << fit.ilog2();
        Ok(Self {
            max_keys,
            shards: shards.min(fit),
            on_full,
        })
    }

    /// The bound on live keys.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// Shards in use.
    pub fn shards(&self) -> usize {
        self.shards
    }

    /// What happens to new keys when full.
    pub fn on_full(&self) -> OnFull {
        self.on_full
    }
}

/// The sharded in-memory store: every transition of one key is serialized by
/// its shard's lock; memory is bounded by `max_keys`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use quotad_core::{Algorithm, BatchMode, CheckItem, FakeClock, MemoryStore, OnFull, Policy, StoreConfig};
///
/// let clock = Arc::new(FakeClock::new(0));
/// let store = MemoryStore::new(StoreConfig::try_new(1_000, 16, OnFull::Deny)?, clock.clone());
/// let policy = Policy::try_new(Algorithm::FixedWindow, 1, Duration::from_secs(1), None)?;
/// let item = CheckItem::new("login", policy, "alice", 1)?;
/// assert!(store.check_one(&item).allowed);
/// assert!(!store.check_one(&item).allowed);
/// clock.advance(Duration::from_secs(1));
/// assert!(store.check_one(&item).allowed);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    per_shard: usize,
    config: StoreConfig,
    hasher: KeyHasher,
    clock: Arc<dyn Clock>,
    evictions: AtomicU64,
    reclaimed: AtomicU64,
    sweep_cursor: AtomicUsize,
}

/// One key's working state inside an all-or-nothing batch.
struct Pending<'a> {
    name: &'a str,
    key: &'a str,
    hash: u64,
    shard: usize,
    original: Option<State>,
    state: Option<State>,
    fresh_at: u64,
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    ///
    /// Each shard's table grows with its keys, never past its share of
    /// `max_keys`.
    pub fn new(config: StoreConfig, clock: Arc<dyn Clock>) -> Self {
        let per_shard = config.max_keys() / config.shards();
        let hasher = KeyHasher::default();
        let shards = (0..config.shards())
            .map(|_| CachePadded::new(Mutex::new(Shard::new(per_shard, hasher.clone()))))
            .collect();
        Self {
            shards,
            per_shard,
            config,
            hasher,
            clock,
            evictions: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
            sweep_cursor: AtomicUsize::new(0),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Decides one item: reads the clock once, locks the key's shard,
    /// decides, writes back.
    pub fn check_one(&self, item: &CheckItem<'_>) -> Decision {
        self.check_at(item, self.clock.now_ms())
    }

    /// Decides a batch at one instant. `Independent` decides each item alone;
    /// `AllOrNothing` locks every shard involved in ascending order (so two
    /// batches can never deadlock), decides all items in order (a key named
    /// twice sees its own earlier item), and commits only if every item is
    /// admitted. Otherwise nothing changes: denied items keep their decision
    /// and the others are denied with [`Reason::BatchRejected`].
    pub fn check(&self, items: &[CheckItem<'_>], mode: BatchMode) -> Vec<Decision> {
        let now = self.clock.now_ms();
        match mode {
            BatchMode::Independent => items.iter().map(|i| self.check_at(i, now)).collect(),
            BatchMode::AllOrNothing => self.check_all_or_nothing(items, now),
        }
    }

    /// What [`MemoryStore::check_one`] would decide, consuming nothing and
    /// creating nothing.
    pub fn peek(&self, item: &CheckItem<'_>) -> Decision {
        let now = self.clock.now_ms();
        let (name, key) = (item.name(), item.key());
        let hash = key_hash(&self.hasher, name, key);
        let mut shard = self.lock(self.shard_of(hash));
        if let Some(i) = shard.find(hash, name, key) {
            return algorithm::peek(item.policy(), shard.state(i), now, item.cost());
        }
        let decision = algorithm::peek(item.policy(), None, now, item.cost());
        // A new key that a check would refuse for want of room: say so.
        // Dropping fresh-equivalent state to find out changes no decision.
        let full = self.per_shard.saturating_sub(shard.len()) == 0;
        if decision.allowed && full && self.config.on_full() == OnFull::Deny {
            let dropped = shard.purge_expired(now);
            self.reclaimed.fetch_add(dropped as u64, Ordering::Relaxed);
            if self.per_shard.saturating_sub(shard.len()) == 0 {
                return capacity_denial(item.policy());
            }
        }
        decision
    }

    /// Forgets the state of `key` under the policy `name`. Returns whether
    /// there was any.
    pub fn reset(&self, name: &str, key: &str) -> bool {
        let hash = key_hash(&self.hasher, name, key);
        let mut shard = self.lock(self.shard_of(hash));
        match shard.find(hash, name, key) {
            Some(i) => {
                shard.write(i, None, 0);
                true
            }
            None => false,
        }
    }

    /// Keys holding state now. Locks each shard in turn; for metrics.
    pub fn live_keys(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Live keys evicted to make room since the store was made.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Keys dropped because their state had become fresh.
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed.load(Ordering::Relaxed)
    }

    /// Drops the fresh-equivalent keys of the next shard in turn: one step of
    /// the incremental sweep, holding one shard's lock. Call it on a timer so
    /// that every shard is visited regularly; returns the keys dropped.
    pub fn sweep_step(&self) -> usize {
        let index = self.sweep_cursor.fetch_add(1, Ordering::Relaxed) % self.shards.len();
        let now = self.clock.now_ms();
        let dropped = self.lock(index).purge_expired(now);
        self.reclaimed.fetch_add(dropped as u64, Ordering::Relaxed);
        dropped
    }

    fn check_at(&self, item: &CheckItem<'_>, now: u64) -> Decision {
        let (name, key) = (item.name(), item.key());
        let hash = key_hash(&self.hasher, name, key);
        let mut shard = self.lock(self.shard_of(hash));
        // One probe: the entry found is written back in place.
        if let Some(i) = shard.find(hash, name, key) {
            let state = shard.take(i);
            let (state, decision) =
                algorithm::decide_spending(item.policy(), state, now, item.cost(), item.spend());
            shard.write(i, state, fresh_at(now, &decision));
            return decision;
        }
        let (state, decision) =
            algorithm::decide_spending(item.policy(), None, now, item.cost(), item.spend());
        if let Some(state) = state {
            if !self.make_room(&mut shard, &|_| 1, now, &|_| false) {
                return capacity_denial(item.policy());
            }
            shard.insert(hash, name, key, state, fresh_at(now, &decision));
        }
        decision
    }

    fn check_all_or_nothing(&self, items: &[CheckItem<'_>], now: u64) -> Vec<Decision> {
        let hashes: Vec<u64> = items
            .iter()
            .map(|i| key_hash(&self.hasher, i.name(), i.key()))
            .collect();
        let mut order: Vec<usize> = hashes.iter().map(|&h| self.shard_of(h)).collect();
        order.sort_unstable();
        order.dedup();
        // Ascending shard order: any two batches lock in the same order.
        let mut guards: Vec<MutexGuard<'_, Shard>> = order.iter().map(|&i| self.lock(i)).collect();
        let guard_of = |shard: usize| {
            order
                .binary_search(&shard)
                .expect("every item's shard was locked")
        };

        let mut pending: Vec<Pending<'_>> = Vec::new();
        let mut index_of: HashMap<(&str, &str), usize> = HashMap::default();
        let mut decisions = Vec::with_capacity(items.len());
        let mut slot_of_item = Vec::with_capacity(items.len());
        for (item, &hash) in items.iter().zip(&hashes) {
            let (name, key) = (item.name(), item.key());
            let p = *index_of.entry((name, key)).or_insert_with(|| {
                let shard = self.shard_of(hash);
                let guard = &guards[guard_of(shard)];
                let original = guard
                    .find(hash, name, key)
                    .and_then(|i| guard.state(i))
                    .cloned();
                pending.push(Pending {
                    name,
                    key,
                    hash,
                    shard,
                    state: original.clone(),
                    original,
                    fresh_at: 0,
                });
                pending.len() - 1
            });
            let entry = &mut pending[p];
            let (state, decision) = algorithm::decide_spending(
                item.policy(),
                entry.state.take(),
                now,
                item.cost(),
                item.spend(),
            );
            entry.state = state;
            entry.fresh_at = fresh_at(now, &decision);
            decisions.push(decision);
            slot_of_item.push(p);
        }

        // Only a batch whose every item fits may make room, so a rejected
        // batch changes nothing, not even by evicting someone else's state;
        // and it never evicts its own keys.
        if decisions.iter().all(|d| d.allowed) {
            for (g, guard) in guards.iter_mut().enumerate() {
                let shard = order[g];
                let members: Vec<&Pending<'_>> =
                    pending.iter().filter(|p| p.shard == shard).collect();
                // Room for all of them as new keys: no lookup needed.
                if members.len() <= self.per_shard.saturating_sub(guard.len()) {
                    continue;
                }
                let needed = |s: &Shard| {
                    members
                        .iter()
                        .filter(|p| p.state.is_some() && s.find(p.hash, p.name, p.key).is_none())
                        .count()
                };
                let protect = |k: &StoreKey| members.iter().any(|p| k.is(p.name, p.key));
                if !self.make_room(guard, &needed, now, &protect) {
                    for (i, item) in items.iter().enumerate() {
                        let p = &pending[slot_of_item[i]];
                        if p.shard == shard && guard.find(p.hash, p.name, p.key).is_none() {
                            decisions[i] = capacity_denial(item.policy());
                        }
                    }
                }
            }
        }

        if decisions.iter().all(|d| d.allowed) {
            for p in pending {
                let shard = &mut guards[guard_of(p.shard)];
                match (shard.find(p.hash, p.name, p.key), p.state) {
                    (Some(i), state) => shard.write(i, state, p.fresh_at),
                    (None, Some(state)) => shard.insert(p.hash, p.name, p.key, state, p.fresh_at),
                    (None, None) => {}
                }
            }
            return decisions;
        }
        for (i, item) in items.iter().enumerate() {
            if decisions[i].allowed {
                let original = pending[slot_of_item[i]].original.as_ref();
                let current = algorithm::peek(item.policy(), original, now, item.cost());
                decisions[i] = Decision {
                    allowed: false,
                    reason: Reason::BatchRejected,
                    retry_after_ms: 0,
                    ..current
                };
            }
        }
        decisions
    }

    /// Makes room for the new keys `needed` counts in `shard`: first by
    /// dropping state that is already fresh, then as `on_full` says,
    /// evicting only keys `protect` does not cover. Returns false, having
    /// evicted nothing, when the new keys must be denied.
    fn make_room(
        &self,
        shard: &mut Shard,
        needed: &dyn Fn(&Shard) -> usize,
        now: u64,
        protect: &dyn Fn(&StoreKey) -> bool,
    ) -> bool {
        let short = |s: &Shard| needed(s).saturating_sub(self.per_shard.saturating_sub(s.len()));
        if short(shard) == 0 {
            return true;
        }
        // Dropping fresh-equivalent state changes no decision; needed is
        // counted again after, as it may have dropped a key about to be
        // written.
        let dropped = shard.purge_expired(now);
        self.reclaimed.fetch_add(dropped as u64, Ordering::Relaxed);
        let missing = short(shard);
        if missing == 0 {
            return true;
        }
        if self.config.on_full() == OnFull::Deny || shard.count_unprotected(protect) < missing {
            return false;
        }
        for _ in 0..missing {
            shard.evict_one(protect);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    fn shard_of(&self, hash: u64) -> usize {
        // Bits 40 and up: the tables inside use the low bits to place an
        // entry and the top seven as its tag, so the shard choice stays
        // independent of both (at most 2^16 shards).
        ((hash >> 40) as usize) & (self.shards.len() - 1)
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard].lock()
    }
}

fn fresh_at(now: u64, decision: &Decision) -> u64 {
    now.saturating_add(decision.reset_after_ms)
}

fn capacity_denial(policy: &Policy) -> Decision {
    Decision {
        allowed: false,
        limit: policy.capacity(),
        remaining: 0,
        retry_after_ms: 0,
        reset_after_ms: 0,
        reason: Reason::Capacity,
    }
}
