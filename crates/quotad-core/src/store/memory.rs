//! The embedded default store: a fixed number of shards, each a mutex over
//! its own table.
//!
//! Finding, deciding and writing
//! back, making room and the batch paths are one locking protocol over the
//! shards (one shard lock, or several taken in ascending order), read
//! together; the shard's table is in `shard.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use thiserror::Error;

use super::item::{BatchMode, CheckItem};
use super::shard::{
    ENTRY_BYTES, Found, KeyHasher, Room, Shard, StoreKey, extra_bytes, extra_bytes_with, key_hash,
};
use crate::algorithm::{self, State};
use crate::clock::Clock;
use crate::decision::{Decision, Reason};
use crate::grant::{
    Acquired, Grant, LeaseAnswer, LeaseAsk, LeaseError, LeaseOutcome, LeaseTerms, Ledger,
    SlotAnswer, SlotError,
};
use crate::policy::{Algorithm, Policy};

/// A shard holds at least this many keys before the store splits further,
/// so that uneven hashing costs little of the bound.
const MIN_KEYS_PER_SHARD: usize = 64;

/// The shard index comes from 16 bits of the key hash.
const MAX_SHARDS: usize = 1 << 16;

/// A shard has a byte budget for at least this much before the store splits
/// further: [`MIN_KEYS_PER_SHARD`] entries of [`ENTRY_BYTES`].
const MIN_BYTES_PER_SHARD: usize = MIN_KEYS_PER_SHARD * ENTRY_BYTES;

/// What to do when a shard is full of live state, by keys or bytes, and a
/// new key must be stored or a key's state must grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum OnFull {
    /// Deny with reason [`Reason::Capacity`], consuming nothing: a new key
    /// is not stored, a state that must grow stays as it was. Existing
    /// keys whose state need not grow go on.
    #[default]
    Deny,
    /// Evict live keys closest to fresh (about the least recently used)
    /// until there is room; never the key being decided, nor any key of an
    /// all-or-nothing batch (an independent batch's item protects only its
    /// own key, as a separate check would). An evicted key's budget starts
    /// over; every eviction is counted.
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
    /// `max_bytes` is below the smallest byte budget.
    #[error("max_bytes must be at least {min} (got {max_bytes})")]
    MaxBytesTooSmall {
        /// The budget given.
        max_bytes: usize,
        /// The smallest budget: room for 64 fixed-size entries.
        min: usize,
    },
}

/// Bounds and layout of a [`MemoryStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    max_keys: usize,
    max_bytes: usize,
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
    /// Memory is then bounded by keys alone; add a byte budget with
    /// [`StoreConfig::with_max_bytes`].
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
            max_bytes: usize::MAX,
            shards: shards.min(fit),
            on_full,
        })
    }

    /// The same configuration, with the memory its keys may take bounded by
    /// `max_bytes` as well.
    ///
    /// The budget is kept per shard, `max_bytes / shards` each (fewer shards
    /// are used when a share would be below 64 entries), and counts what
    /// the shard holds: every table slot it has reserved, used or not, at
    /// [`ENTRY_BYTES`] (measured); each key's `policy name + 1 + key` bytes
    /// when longer than the 24 kept inline (at least 32, as allocated); and
    /// each sliding log's 40 bytes and 16 per entry it has room for (a log
    /// allocates room for at most its limit). A table grows by doubling,
    /// only into bytes its shard has free, and shrinks when that makes room
    /// or when a purge leaves it under a quarter full.
    /// [`MemoryStore::used_bytes`] reports the count.
    ///
    /// When a new key, or a state that must grow (a sliding log whose
    /// allocation is full), would take a shard past either budget, state
    /// equivalent to fresh and unused table slots go first, then `on_full`
    /// applies: deny with [`Reason::Capacity`], consuming nothing (a log
    /// that cannot grow stays as it was), or evict other keys, never the
    /// key decided nor a batch's own. A sliding log admits within its
    /// allocation without needing room, so at the budget a log keeps
    /// working at the size it has, which may hold fewer entries than its
    /// limit until room frees.
    ///
    /// Not counted: a shard's fixed size, the allocator's own overhead (the
    /// process's resident memory runs a few percent above the count, more
    /// with many small logs), and an index table the hash table may rebuild
    /// larger after heavy churn.
    ///
    /// # Errors
    ///
    /// [`StoreConfigError::MaxBytesTooSmall`] when `max_bytes` is below 64
    /// entries of [`ENTRY_BYTES`] (6,656 bytes).
    ///
    /// ```
    /// use quotad_core::{OnFull, StoreConfig};
    ///
    /// let config = StoreConfig::try_new(1_000_000, 64, OnFull::Deny)?.with_max_bytes(512 << 20)?;
    /// assert_eq!(config.max_bytes(), Some(512 << 20));
    /// assert!(StoreConfig::try_new(10, 1, OnFull::Deny)?.with_max_bytes(1_000).is_err());
    /// # Ok::<(), quotad_core::StoreConfigError>(())
    /// ```
    pub fn with_max_bytes(self, max_bytes: usize) -> Result<Self, StoreConfigError> {
        if max_bytes < MIN_BYTES_PER_SHARD {
            return Err(StoreConfigError::MaxBytesTooSmall {
                max_bytes,
                min: MIN_BYTES_PER_SHARD,
            });
        }
        let fit = 1 << (max_bytes / MIN_BYTES_PER_SHARD).ilog2();
        Ok(Self {
            max_bytes,
            shards: self.shards.min(fit),
            ..self
        })
    }

    /// The bound on live keys.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// The byte budget, if one was set.
    pub fn max_bytes(&self) -> Option<usize> {
        (self.max_bytes != usize::MAX).then_some(self.max_bytes)
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
/// its shard's lock; memory is bounded by `max_keys` and, if set, a byte
/// budget (see [`StoreConfig::with_max_bytes`]).
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
    config: StoreConfig,
    hasher: KeyHasher,
    clock: Arc<dyn Clock>,
    /// The latest instant the store dropped state at because it was fresh:
    /// the store's time never goes back past it. A key keeps its own floor in its state;
    /// once its state is dropped, this keeps a clock stepped back from
    /// judging it younger than it was judged fresh.
    floor: AtomicU64,
    evictions: AtomicU64,
    reclaimed: AtomicU64,
    /// Concurrency slots dropped because they ended unreleased, by a
    /// transition of their key (the sweep's are counted by its shard).
    slots_expired: AtomicU64,
    sweep_cursor: AtomicUsize,
}

/// One key's working state inside an all-or-nothing batch.
struct Pending<'a> {
    name: &'a str,
    key: &'a str,
    hash: u64,
    shard: usize,
    /// Where its entry was when the shards were locked.
    found: Found,
    /// Its state as the batch's items so far leave it.
    state: Option<State>,
    /// Its grants (which a check leaves as they are): none for most keys.
    grants: Vec<Grant>,
    /// The slots the batch's acquires of this key take, written with the
    /// rest when it commits.
    added: Vec<Grant>,
    /// The policy of its first item (a concurrency key's slots are written
    /// under it).
    policy: Policy,
    fresh_at: u64,
}

/// The shards of a set of items, locked, with each item's hash, shard and
/// entry (where its key was when the shards were locked).
struct Locked<'s> {
    hashes: Small<u64>,
    shards: Small<usize>,
    found: Small<Found>,
    /// The shards locked, ascending; `guards` in the same order.
    order: Small<usize>,
    guards: Small<MutexGuard<'s, Shard>>,
}

impl Locked<'_> {
    fn guard_index(&self, shard: usize) -> usize {
        self.order
            .binary_search(&shard)
            .expect("every item's shard was locked")
    }

    fn shard_mut(&mut self, shard: usize) -> &mut Shard {
        let g = self.guard_index(shard);
        &mut self.guards[g]
    }

    /// The shard of item `i`.
    fn item_shard(&self, i: usize) -> &Shard {
        &self.guards[self.guard_index(self.shards[i])]
    }

    fn item_shard_mut(&mut self, i: usize) -> &mut Shard {
        self.shard_mut(self.shards[i])
    }
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    ///
    /// Each shard's table grows with its keys, never past its share of
    /// `max_keys` nor of what the byte budget holds.
    pub fn new(config: StoreConfig, clock: Arc<dyn Clock>) -> Self {
        let keys = config.max_keys() / config.shards();
        let bytes = config.max_bytes / config.shards();
        let hasher = KeyHasher::default();
        let shards = (0..config.shards())
            .map(|_| CachePadded::new(Mutex::new(Shard::new(keys, bytes, hasher.clone()))))
            .collect();
        Self {
            shards,
            config,
            hasher,
            clock,
            floor: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
            slots_expired: AtomicU64::new(0),
            sweep_cursor: AtomicUsize::new(0),
        }
    }

    /// The configuration in force.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Decides one item: locks the key's shard, reads the clock, decides,
    /// writes back.
    ///
    /// The clock is read under the lock, as a Redis script reads `TIME`
    /// inside its atomic run: a decision is never made at an instant
    /// earlier than one at which the shard already dropped a state as
    /// fresh (read before the lock, a check could find a key that the
    /// sweep dropped meanwhile gone, and decide at its earlier instant as
    /// if the key had never had the state it still had then).
    pub fn check_one(&self, item: &CheckItem<'_>) -> Decision {
        let hash = key_hash(&self.hasher, item.name(), item.key());
        let mut shard = self.lock(self.shard_of(hash));
        let now = self.now();
        self.check_in(&mut shard, item, hash, now)
    }

    /// Decides a batch: `AllOrNothing` at one instant, `Independent` at one
    /// per chunk of a few items (each read once the chunk's shards are
    /// locked). `Independent` decides each item alone;
    /// `AllOrNothing` locks every shard involved in ascending order (so two
    /// batches can never deadlock), decides all items in order (a key named
    /// twice sees its own earlier item), and commits only if every item is
    /// admitted. Otherwise nothing changes: denied items keep their decision
    /// and the others are denied with [`Reason::BatchRejected`].
    pub fn check(&self, items: &[CheckItem<'_>], mode: BatchMode) -> Vec<Decision> {
        match mode {
            BatchMode::Independent => {
                let mut decisions = Vec::with_capacity(items.len());
                // A few items at a time, so that no shard stays locked for
                // long while the chunk's lookups still overlap; each chunk
                // at the instant read once its shards are locked.
                for chunk in items.chunks(SMALL) {
                    let mut locked = self.lock_all(chunk);
                    let now = self.now();
                    for (i, item) in chunk.iter().enumerate() {
                        let hash = locked.hashes[i];
                        decisions.push(self.check_in(locked.item_shard_mut(i), item, hash, now));
                    }
                }
                decisions
            }
            BatchMode::AllOrNothing => self.check_all_or_nothing(items),
        }
    }

    /// What [`MemoryStore::check_one`] would decide, consuming nothing and
    /// creating nothing.
    pub fn peek(&self, item: &CheckItem<'_>) -> Decision {
        let hash = key_hash(&self.hasher, item.name(), item.key());
        let mut shard = self.lock(self.shard_of(hash));
        let now = self.now();
        let decision = self.peek_in(&shard, item, hash, now);
        if decision.reason != Reason::Capacity {
            return decision;
        }
        // A check would first drop fresh-equivalent state; so does peek, to
        // find out, which changes no decision.
        self.reclaim(shard.purge_expired(now), now);
        self.peek_in(&shard, item, hash, now)
    }

    /// What a check would decide in `shard` as it is, dropping nothing; in
    /// evict mode, room is what evicting every other key would leave.
    fn peek_in(&self, shard: &Shard, item: &CheckItem<'_>, hash: u64, now: u64) -> Decision {
        let (name, key, policy, cost) = (item.name(), item.key(), item.policy(), item.cost());
        let evict = self.config.on_full() == OnFull::Evict;
        if let Some(i) = shard.find(hash, name, key) {
            let room = shard.room_for_state(i, evict);
            let grants = shard.grants_at(i, policy);
            return algorithm::peek_within(policy, shard.state(i, now), grants, now, cost, room);
        }
        let decision = algorithm::peek(policy, None, now, cost);
        if !decision.allowed {
            return decision;
        }
        let Some(state) = algorithm::decide(policy, None, now, cost).0 else {
            return decision;
        };
        let need = Room {
            keys: 1,
            bytes: extra_bytes(name, key, &state),
        };
        let fits = if evict {
            shard.can_evict_for(need, &|_| false)
        } else {
            shard.short(need, true).is_empty()
        };
        if fits {
            decision
        } else {
            capacity_denial(policy)
        }
    }

    /// Settles the lease `ask` names (its unspent units go back) and grants
    /// a new one of up to `ask.want` units, on the key `key` of the policy
    /// `name`, in one transition with the key's state: a lease is charged
    /// as an admission of its units, and its grant is kept in the key's
    /// entry until it ends (bounded in number, counted in the byte budget,
    /// written to snapshots). Near the end of the budget, or for an
    /// algorithm that offers no leases, the answer is
    /// [`LeaseAnswer::Direct`]; so it is when the store has no room for the
    /// grant (nothing is evicted for a lease: it is never needed, as direct
    /// checks decide exactly).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use quotad_core::{Algorithm, CheckItem, FakeClock, LeaseAnswer, LeaseAsk, LeaseTerms, MemoryStore, OnFull, Policy, StoreConfig};
    ///
    /// let store = MemoryStore::new(StoreConfig::try_new(1_000, 16, OnFull::Deny)?, Arc::new(FakeClock::new(0)));
    /// let policy = Policy::try_new(Algorithm::FixedWindow, 100, Duration::from_secs(60), None)?;
    /// let terms = LeaseTerms::try_new(40, 5, Duration::from_secs(10))?;
    /// let ask = LeaseAsk { settle: None, want: 50, new_id: 7 };
    /// let outcome = store.lease("api", "alice", &policy, &terms, &ask)?;
    /// let LeaseAnswer::Granted(grant) = outcome.answer else { panic!("far from the limit") };
    /// assert_eq!((grant.units, grant.ends_at), (40, 10_000));
    /// // The lease is charged: a direct check sees 60 left.
    /// assert_eq!(store.peek(&CheckItem::new("api", policy, "alice", 1)?).remaining, 60);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`LeaseError`] when the lease to settle is unknown (not held, not
    /// ended) or reported overspent; nothing is changed then.
    pub fn lease(
        &self,
        name: &str,
        key: &str,
        policy: &Policy,
        terms: &LeaseTerms,
        ask: &LeaseAsk,
    ) -> Result<LeaseOutcome, LeaseError> {
        let hash = key_hash(&self.hasher, name, key);
        let mut shard = self.lock(self.shard_of(hash));
        let now = self.now();
        if let Some(settle) = &ask.settle {
            let empty = Ledger::new();
            let held = shard
                .find(hash, name, key)
                .and_then(|i| shard.ledger_at(i))
                .unwrap_or(&empty);
            algorithm::check_settle(held, settle, now)?;
        }
        let this = |k: &StoreKey| k.is(name, key);
        // One probe, as a check: a grant that needs bytes the shard lacks
        // gets room made once (never by evicting this key); without it, the
        // lease is settled and the answer is direct.
        for attempt in 0..2 {
            let Some(i) = shard.find(hash, name, key) else {
                break;
            };
            let fresh_before = shard.fresh_at(i);
            let state = shard.take(i, now);
            let ledger = shard.take_ledger(i, now);
            let before = entry_bytes(state.as_ref(), &ledger);
            let mut granted = ledger.clone();
            let (new_state, outcome) =
                algorithm::lease(policy, terms, state.clone(), &mut granted, now, ask);
            let after = entry_bytes(new_state.as_ref(), &granted);
            if after <= shard.free_bytes() {
                let fresh_at = fresh_at_ms(now, outcome.reset_after_ms);
                shard.write_granted(i, new_state, granted, fresh_at);
                return Ok(outcome);
            }
            if attempt == 0 {
                let grow = Room {
                    keys: 0,
                    bytes: after.saturating_sub(before),
                };
                shard.write_granted(i, state, ledger, fresh_before);
                if self.make_room(&mut shard, &|_| grow, now, &this) {
                    continue;
                }
                // Making room never evicts this key, but may drop it as
                // fresh: then it is a new key (and its lease, if it named
                // one, has ended).
                let Some(i) = shard.find(hash, name, key) else {
                    break;
                };
                let state = shard.take(i, now);
                let ledger = shard.take_ledger(i, now);
                return Ok(settle_only(
                    &mut shard, i, policy, terms, state, ledger, now, ask,
                ));
            }
            return Ok(settle_only(
                &mut shard, i, policy, terms, state, ledger, now, ask,
            ));
        }
        let mut ledger = Ledger::new();
        let (state, outcome) = algorithm::lease(policy, terms, None, &mut ledger, now, ask);
        if state.is_some() || !ledger.is_empty() {
            let need = Room {
                keys: 1,
                bytes: extra_bytes_with(name, key, state.as_ref(), &ledger),
            };
            if !self.make_room(&mut shard, &|_| need, now, &|_| false) {
                // A new key with no room: no lease, nothing changed.
                let ask = LeaseAsk { want: 0, ..*ask };
                let (_, outcome) =
                    algorithm::lease(policy, terms, None, &mut Ledger::new(), now, &ask);
                return Ok(LeaseOutcome {
                    answer: LeaseAnswer::Direct,
                    ..outcome
                });
            }
            let fresh_at = fresh_at_ms(now, outcome.reset_after_ms);
            shard.insert_granted(hash, name, key, state, ledger, fresh_at);
        }
        Ok(outcome)
    }

    /// Acquires a slot of a concurrency limit: `item` (made with
    /// [`CheckItem::acquire`]) is admitted when the units its key's live
    /// slots hold plus its cost are within the limit, and then holds a
    /// slot with the item's id until it is released, or until `slot_ttl`
    /// after it was taken (or last renewed) passes. A slot is a grant in
    /// the key's ledger: it keeps the key from being evicted while it is
    /// live, is counted in the byte budget (a key with no room for another
    /// slot is denied with [`Reason::Capacity`]) and is written to
    /// snapshots.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use quotad_core::{CheckItem, FakeClock, MemoryStore, OnFull, Policy, StoreConfig};
    ///
    /// let clock = Arc::new(FakeClock::new(0));
    /// let store = MemoryStore::new(StoreConfig::try_new(1_000, 16, OnFull::Deny)?, clock.clone());
    /// let exports = Policy::concurrency(2, Duration::from_secs(30))?;
    /// let a = store.acquire(&CheckItem::acquire("exports", exports, "tenant-1", 1, 11)?)?;
    /// clock.advance(Duration::from_secs(10));
    /// let b = store.acquire(&CheckItem::acquire("exports", exports, "tenant-1", 1, 12)?)?;
    /// let c = store.acquire(&CheckItem::acquire("exports", exports, "tenant-1", 1, 13)?)?;
    /// assert!(a.decision.allowed && b.decision.allowed && !c.decision.allowed);
    /// // The first slot ends first, 20 s from now, unless renewed or released.
    /// assert_eq!(c.decision.retry_after_ms, 20_000);
    /// assert!(store.release("exports", "tenant-1", &exports, 11)?.slot.is_some());
    /// assert!(store.acquire(&CheckItem::acquire("exports", exports, "tenant-1", 1, 13)?)?.decision.allowed);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`SlotError::IdInUse`] when the key already holds a slot with the
    /// item's id, [`SlotError::NotConcurrency`] for an item of a rate;
    /// nothing is changed then.
    pub fn acquire(&self, item: &CheckItem<'_>) -> Result<Acquired, SlotError> {
        let hash = key_hash(&self.hasher, item.name(), item.key());
        let mut shard = self.lock(self.shard_of(hash));
        let now = self.now();
        self.acquire_in(&mut shard, item, hash, now)
    }

    /// Renews the slot `id` of `key` under the concurrency policy `name`:
    /// a live slot's end moves to `slot_ttl` from now (the policy's
    /// `slot_ttl` as it is now). A slot that has ended, or was released, is
    /// not renewed (`slot` is `None`): its units may be someone else's
    /// already.
    ///
    /// # Errors
    ///
    /// [`SlotError::NotConcurrency`] for a rate policy.
    pub fn renew(
        &self,
        name: &str,
        key: &str,
        policy: &Policy,
        id: u64,
    ) -> Result<SlotAnswer, SlotError> {
        self.on_slots(name, key, policy, |ledger, now| {
            ledger.extend(id, now, now.saturating_add(policy.slot_ttl_ms()))
        })
    }

    /// Releases the slot `id` of `key` under the concurrency policy
    /// `name`. Idempotent: an unknown, released or ended slot is answered
    /// as released (`slot` is `None`), and nothing else is freed: only the
    /// slot with this id, if it is live.
    ///
    /// # Errors
    ///
    /// [`SlotError::NotConcurrency`] for a rate policy.
    pub fn release(
        &self,
        name: &str,
        key: &str,
        policy: &Policy,
        id: u64,
    ) -> Result<SlotAnswer, SlotError> {
        self.on_slots(name, key, policy, |ledger, now| ledger.take_live(id, now))
    }

    /// Concurrency slots that ended without being released (their holders
    /// died, hung, or stopped renewing), as the store dropped them, since
    /// it was made: a leak signal.
    pub fn slots_expired(&self) -> u64 {
        self.slots_expired.load(Ordering::Relaxed)
            + self
                .shards
                .iter()
                .map(|s| s.lock().expired_slots())
                .sum::<u64>()
    }

    /// Units held by live concurrency slots, by policy name. Locks each
    /// shard in turn and reads every key's ledger; for metrics.
    pub fn slots_held(&self) -> Vec<(String, u64)> {
        let now = self.now();
        let mut held: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
        for shard in self.shards.iter() {
            shard.lock().for_each_ledger(|name, ledger| {
                if ledger
                    .charged_under()
                    .is_some_and(|(a, _)| a == Algorithm::Concurrency)
                {
                    let units = ledger.live_units(now);
                    if units > 0 {
                        *held.entry(name.to_owned()).or_default() += units;
                    }
                }
            });
        }
        held.into_iter().collect()
    }

    /// Runs `change` on the slots of `key` under the concurrency policy
    /// `name` (ended ones dropped first), in one transition.
    fn on_slots(
        &self,
        name: &str,
        key: &str,
        policy: &Policy,
        change: impl FnOnce(&mut Ledger, u64) -> Option<Grant>,
    ) -> Result<SlotAnswer, SlotError> {
        if policy.algorithm() != Algorithm::Concurrency {
            return Err(SlotError::NotConcurrency(policy.algorithm()));
        }
        let hash = key_hash(&self.hasher, name, key);
        let mut shard = self.lock(self.shard_of(hash));
        let now = self.now();
        let mut answer = SlotAnswer {
            slot: None,
            limit: policy.limit(),
            remaining: policy.limit(),
        };
        let Some(i) = shard.find(hash, name, key) else {
            return Ok(answer);
        };
        let fresh_before = shard.fresh_at(i);
        let state = shard.take(i, now);
        let mut ledger = shard.take_ledger(i, now);
        if ledger.counts_under(policy) {
            let before = ledger.len();
            ledger.purge(now, 0);
            self.count_expired(before - ledger.len());
            answer.slot = change(&mut ledger, now);
            answer.remaining = policy.limit().saturating_sub(ledger.live_units(now));
        }
        let fresh_at = if state.is_some() { fresh_before } else { now };
        shard.write_granted(i, state, ledger, fresh_at);
        Ok(answer)
    }

    fn count_expired(&self, slots: usize) {
        if slots > 0 {
            self.slots_expired
                .fetch_add(slots as u64, Ordering::Relaxed);
        }
    }

    /// Acquires `item`'s slot in its shard, which the caller holds. A
    /// ledger that must grow for the slot and finds no room gets room made
    /// once (never by evicting this key), then is decided again at the same
    /// instant; without room, the answer is [`Reason::Capacity`].
    fn acquire_in(
        &self,
        shard: &mut Shard,
        item: &CheckItem<'_>,
        hash: u64,
        now: u64,
    ) -> Result<Acquired, SlotError> {
        let (name, key, policy, cost) = (item.name(), item.key(), item.policy(), item.cost());
        let Some(id) = item.slot() else {
            return Err(SlotError::NotConcurrency(policy.algorithm()));
        };
        let this = |k: &StoreKey| k.is(name, key);
        for attempt in 0..2 {
            let Some(i) = shard.find(hash, name, key) else {
                break;
            };
            let fresh_before = shard.fresh_at(i);
            let state = shard.take(i, now);
            let mut ledger = shard.take_ledger(i, now);
            let fresh_at = if state.is_some() { fresh_before } else { now };
            let (counted, before) = (ledger.counts_under(policy), ledger.len());
            let decided = algorithm::acquire(policy, &mut ledger, now, cost, id);
            let (decision, slot, expired) = match decided {
                Ok(d) => d,
                Err(e) => {
                    // The ledger was purged: its ended slots are gone now,
                    // and counted once, here.
                    if counted {
                        self.count_expired(before - ledger.len());
                    }
                    shard.write_granted(i, state, ledger, fresh_at);
                    return Err(e);
                }
            };
            self.count_expired(expired);
            let Some(slot) = slot else {
                shard.write_granted(i, state, ledger, fresh_at);
                return Ok(Acquired { decision, slot });
            };
            if ledger.len() < ledger.capacity() {
                ledger.push(slot, policy);
                shard.write_granted(i, state, ledger, fresh_at);
                return Ok(Acquired {
                    decision,
                    slot: Some(slot),
                });
            }
            let grown = grown_with(&ledger, slot, policy);
            let (before, after) = (
                entry_bytes(state.as_ref(), &ledger),
                entry_bytes(state.as_ref(), &grown),
            );
            if after <= shard.free_bytes() {
                shard.write_granted(i, state, grown, fresh_at);
                return Ok(Acquired {
                    decision,
                    slot: Some(slot),
                });
            }
            shard.write_granted(i, state, ledger, fresh_at);
            let grow = Room {
                keys: 0,
                bytes: after - before,
            };
            if attempt > 0 || !self.make_room(shard, &|_| grow, now, &this) {
                return Ok(Acquired {
                    decision: capacity_denial(policy),
                    slot: None,
                });
            }
        }
        let mut ledger = Ledger::new();
        let (decision, slot, _) = algorithm::acquire(policy, &mut ledger, now, cost, id)?;
        let Some(slot) = slot else {
            return Ok(Acquired { decision, slot });
        };
        let grown = grown_with(&ledger, slot, policy);
        let need = Room {
            keys: 1,
            bytes: extra_bytes_with(name, key, None, &grown),
        };
        if !self.make_room(shard, &|_| need, now, &|_| false) {
            return Ok(Acquired {
                decision: capacity_denial(policy),
                slot: None,
            });
        }
        shard.insert_granted(hash, name, key, None, grown, now);
        Ok(Acquired {
            decision,
            slot: Some(slot),
        })
    }

    /// Forgets the state of `key` under the policy `name`, and its grants
    /// (their holders may still spend what they hold). Returns whether
    /// there was any.
    pub fn reset(&self, name: &str, key: &str) -> bool {
        let hash = key_hash(&self.hasher, name, key);
        let mut shard = self.lock(self.shard_of(hash));
        match shard.find(hash, name, key) {
            Some(i) => {
                shard.remove(i);
                true
            }
            None => false,
        }
    }

    /// Keys holding state now. Locks each shard in turn; for metrics.
    pub fn live_keys(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Bytes the live keys cost, as the byte budget counts them (see
    /// [`StoreConfig::with_max_bytes`]). Locks each shard in turn; for
    /// metrics.
    pub fn used_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().bytes()).sum()
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
        let mut shard = self.lock(index);
        let now = self.now();
        let dropped = shard.purge_expired(now);
        drop(shard);
        self.reclaim(dropped, now);
        dropped
    }

    /// The store's time, which every decision is made at: its clock, but
    /// never before the latest instant the store dropped state at because
    /// it was fresh (a clock stepped back after that cannot judge a dropped
    /// key younger than it was found fresh).
    pub fn now_ms(&self) -> u64 {
        self.now()
    }

    fn now(&self) -> u64 {
        self.clock.now_ms().max(self.floor.load(Ordering::Relaxed))
    }

    /// Counts `dropped` keys let go at `now` as fresh, and keeps the
    /// store's time from going back before `now`.
    fn reclaim(&self, dropped: usize, now: u64) {
        if dropped > 0 {
            self.reclaimed.fetch_add(dropped as u64, Ordering::Relaxed);
            self.floor.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// Decides one item hashed `hash` in its shard, which the caller holds.
    fn check_in(&self, shard: &mut Shard, item: &CheckItem<'_>, hash: u64, now: u64) -> Decision {
        if item.slot().is_some() {
            return match self.acquire_in(shard, item, hash, now) {
                Ok(acquired) => acquired.decision,
                Err(_) => capacity_denial(item.policy()),
            };
        }
        let (name, key, policy, cost) = (item.name(), item.key(), item.policy(), item.cost());
        let this = |k: &StoreKey| k.is(name, key);
        // One probe: the entry found is written back in place. A state that
        // must grow and finds no room gets room made once (never by evicting
        // itself), then is decided again at the same instant.
        for attempt in 0..2 {
            let Some(i) = shard.find(hash, name, key) else {
                break;
            };
            let state = shard.take(i, now);
            // Only a key that holds grants pays for copying them.
            let grants = shard.grants_at(i, policy).to_vec();
            // The state is not counted while taken: what is free is its room.
            let room = shard.free_bytes();
            let (state, decision, wanted) =
                algorithm::decide_within(policy, state, &grants, now, cost, item.spend(), room);
            let held = state.as_ref().map_or(0, State::heap_bytes);
            shard.write(i, state, fresh_at(now, &decision));
            let Some(wanted) = wanted else {
                return decision;
            };
            let grow = Room {
                keys: 0,
                bytes: wanted.saturating_sub(held),
            };
            if attempt > 0 || !self.make_room(shard, &|_| grow, now, &this) {
                return decision;
            }
        }
        let (state, decision) = algorithm::decide_spending(policy, None, now, cost, item.spend());
        if let Some(state) = state {
            let need = Room {
                keys: 1,
                bytes: extra_bytes(name, key, &state),
            };
            if !self.make_room(shard, &|_| need, now, &|_| false) {
                return capacity_denial(policy);
            }
            shard.insert(hash, name, key, state, fresh_at(now, &decision));
        }
        decision
    }

    /// Locks the shards of `items` in ascending order (so that two callers
    /// can never deadlock) and looks every key up in one pass before
    /// anything is decided: the lookups do not depend on each other, so in
    /// a table larger than the cache their misses overlap instead of each
    /// waiting for the one before (a decision between two lookups would
    /// keep them apart). An independent batch uses the pass only to bring
    /// its entries into the cache: each item looks its key up again, since
    /// an earlier item's write may have moved entries.
    fn lock_all(&self, items: &[CheckItem<'_>]) -> Locked<'_> {
        let hashes: Small<u64> = items
            .iter()
            .map(|i| key_hash(&self.hasher, i.name(), i.key()))
            .collect();
        let shards: Small<usize> = hashes.iter().map(|&h| self.shard_of(h)).collect();
        let mut order = shards.clone();
        order.sort_unstable();
        order.dedup();
        let guards = order.iter().map(|&i| self.lock(i)).collect();
        let mut locked = Locked {
            hashes,
            shards,
            found: Small::new(),
            order,
            guards,
        };
        locked.found = items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                locked
                    .item_shard(i)
                    .lookup(locked.hashes[i], item.name(), item.key())
            })
            .collect();
        locked
    }

    fn check_all_or_nothing(&self, items: &[CheckItem<'_>]) -> Vec<Decision> {
        let mut locked = self.lock_all(items);
        let now = self.now();
        let first = first_of_each_key(items, &locked.hashes);
        let mut pending: Small<Pending<'_>> = Small::new();
        let mut decisions = Vec::with_capacity(items.len());
        let mut slot_of_item: Small<usize> = Small::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let p = if first[i] < i {
                // A key named before shares that item's pending state.
                slot_of_item[first[i]]
            } else {
                let (name, key, hash, shard) =
                    (item.name(), item.key(), locked.hashes[i], locked.shards[i]);
                let found = locked.found[i];
                // Decided on a copy: the shard keeps the state as it was
                // until the batch commits.
                let state = found
                    .index()
                    .and_then(|f| locked.item_shard(i).state(f, now))
                    .cloned();
                let grants = found
                    .index()
                    .map(|f| locked.item_shard(i).grants_at(f, item.policy()).to_vec())
                    .unwrap_or_default();
                pending.push(Pending {
                    name,
                    key,
                    hash,
                    shard,
                    found,
                    state,
                    grants,
                    added: Vec::new(),
                    policy: *item.policy(),
                    fresh_at: 0,
                });
                pending.len() - 1
            };
            let entry = &mut pending[p];
            let decision = if let Some(id) = item.slot() {
                // An acquire: decided on the key's slots and those the
                // batch took before it.
                let mut ledger = Ledger::from_grants(
                    entry.grants.iter().chain(&entry.added).copied().collect(),
                    Algorithm::Concurrency,
                    0,
                );
                if entry.policy != *item.policy() {
                    // The same key under two policies of one name: only
                    // the first's slots are written.
                    capacity_denial(item.policy())
                } else {
                    match algorithm::acquire(item.policy(), &mut ledger, now, item.cost(), id) {
                        Ok((decision, slot, _)) => {
                            entry.added.extend(slot);
                            decision
                        }
                        Err(_) => capacity_denial(item.policy()),
                    }
                }
            } else {
                let (state, decision) = algorithm::decide_granted(
                    item.policy(),
                    entry.state.take(),
                    &entry.grants,
                    now,
                    item.cost(),
                    item.spend(),
                );
                entry.state = state;
                entry.fresh_at = fresh_at(now, &decision);
                decision
            };
            decisions.push(decision);
            slot_of_item.push(p);
        }

        // Only a batch whose every item fits may make room, and only once
        // every shard of the batch is known to have room or to be able to
        // make it: so a rejected batch changes nothing, not even by
        // evicting someone else's state in one shard while another has no
        // room; and it never evicts its own keys.
        if decisions.iter().all(|d| d.allowed) {
            let mut spaces: Small<Space> = Small::new();
            for making in [false, true] {
                for (g, guard) in locked.guards.iter_mut().enumerate() {
                    if making && spaces[g] != Space::ToMake {
                        continue;
                    }
                    let shard = locked.order[g];
                    let members: Small<&Pending<'_>> =
                        pending.iter().filter(|p| p.shard == shard).collect();
                    let needed = |s: &Shard| needed_by(&members, s);
                    let protect = |k: &StoreKey| members.iter().any(|p| k.is(p.name, p.key));
                    let space = if making {
                        // Known to be makeable: every shard stayed locked.
                        if self.make(guard, &needed, &protect) {
                            Space::Free
                        } else {
                            Space::Lacking
                        }
                    } else {
                        let space = self.space_for(guard, &needed, now, &protect);
                        spaces.push(space);
                        space
                    };
                    if space == Space::Lacking {
                        for (i, item) in items.iter().enumerate() {
                            let p = &pending[slot_of_item[i]];
                            if p.shard != shard {
                                continue;
                            }
                            let (new, before, after) = p.change(guard);
                            if new || after > before {
                                decisions[i] = capacity_denial(item.policy());
                            }
                        }
                    }
                }
                if spaces.contains(&Space::Lacking) {
                    break;
                }
            }
        }

        if decisions.iter().all(|d| d.allowed) {
            // Slots for every new key first, so no insert grows the table
            // into bytes another entry of the batch was counted on.
            for (g, guard) in locked.guards.iter_mut().enumerate() {
                let (mut keys, mut keep) = (0, 0);
                for p in pending.iter().filter(|p| p.shard == locked.order[g]) {
                    let (new, before, after) = p.change(guard);
                    keys += usize::from(new);
                    keep += after.saturating_sub(before);
                }
                guard.reserve(keys, keep);
            }
            for p in pending {
                let shard = locked.shard_mut(p.shard);
                let found = p.find(shard);
                if !p.added.is_empty() {
                    let ledger = found.and_then(|i| shard.ledger_at(i));
                    let (slots, expired) = p.slots(ledger, now);
                    self.count_expired(expired);
                    match found {
                        Some(i) => {
                            let fresh_before = shard.fresh_at(i);
                            let state = shard.take(i, now);
                            // Its ended slots were counted by `p.slots`.
                            shard.drop_ledger(i, now);
                            let fresh = if state.is_some() { fresh_before } else { now };
                            shard.write_granted(i, state, slots, fresh);
                        }
                        None => shard.insert_granted(p.hash, p.name, p.key, None, slots, now),
                    }
                    continue;
                }
                match (found, p.state) {
                    (Some(i), state) => shard.write(i, state, p.fresh_at),
                    (None, Some(state)) => shard.insert(p.hash, p.name, p.key, state, p.fresh_at),
                    (None, None) => {}
                }
            }
            return decisions;
        }
        for (i, item) in items.iter().enumerate() {
            if decisions[i].allowed {
                // Nothing of the batch's keys was written: the shard holds
                // the state the batch started from.
                let shard = locked.item_shard(i);
                let p = &pending[slot_of_item[i]];
                let original = p.find(shard).and_then(|f| shard.state(f, now));
                let current = algorithm::peek_within(
                    item.policy(),
                    original,
                    &p.grants,
                    now,
                    item.cost(),
                    usize::MAX,
                );
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

    /// Whether `shard` has `needed` free, keys and bytes, or
    /// [`MemoryStore::make_room`] can make it. Drops state that is already
    /// fresh, which changes no decision, and changes nothing else.
    fn space_for(
        &self,
        shard: &mut Shard,
        needed: &dyn Fn(&Shard) -> Room,
        now: u64,
        protect: &dyn Fn(&StoreKey) -> bool,
    ) -> Space {
        if shard.short(needed(shard), false).is_empty() {
            return Space::Free;
        }
        // `needed` is counted again, as a purge may have dropped a key about
        // to be written.
        self.reclaim(shard.purge_expired(now), now);
        let need = needed(shard);
        let makeable = match self.config.on_full() {
            OnFull::Evict => shard.can_evict_for(need, protect),
            OnFull::Deny => shard.short(need, true).is_empty(),
        };
        if makeable {
            Space::ToMake
        } else {
            Space::Lacking
        }
    }

    /// Makes `needed` free in `shard`, keys and bytes: first by dropping
    /// state that is already fresh and table slots no entry uses, then as
    /// `on_full` says, evicting only keys `protect` does not cover. Returns
    /// false, having evicted nothing, when the change must be denied.
    fn make_room(
        &self,
        shard: &mut Shard,
        needed: &dyn Fn(&Shard) -> Room,
        now: u64,
        protect: &dyn Fn(&StoreKey) -> bool,
    ) -> bool {
        match self.space_for(shard, needed, now, protect) {
            Space::Free => true,
            Space::Lacking => false,
            Space::ToMake => self.make(shard, needed, protect),
        }
    }

    /// Makes the room [`MemoryStore::space_for`] found can be made, by
    /// dropping table slots no entry uses or evicting keys `protect` does
    /// not cover; neither changes a decision of the change. Returns whether
    /// it did.
    fn make(
        &self,
        shard: &mut Shard,
        needed: &dyn Fn(&Shard) -> Room,
        protect: &dyn Fn(&StoreKey) -> bool,
    ) -> bool {
        let evict = self.config.on_full() == OnFull::Evict;
        loop {
            let need = needed(shard);
            if shard.short(need, false).is_empty() {
                return true;
            }
            if shard.short(need, true).is_empty() {
                shard.shrink(need.keys);
                return true;
            }
            // Evicting all the unprotected keys would do, so this ends.
            if !evict || !shard.evict_one(protect) {
                return false;
            }
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The shards, in order.
    #[cfg(feature = "snapshot")]
    pub(super) fn shards(&self) -> &[CachePadded<Mutex<Shard>>] {
        &self.shards
    }

    /// The hasher keys are placed with.
    #[cfg(feature = "snapshot")]
    pub(super) fn hasher(&self) -> &KeyHasher {
        &self.hasher
    }

    /// The shard of a key hashed `hash`, to fill a store no one else sees.
    #[cfg(feature = "snapshot")]
    pub(super) fn shard_mut(&mut self, hash: u64) -> &mut Shard {
        let i = self.shard_of(hash);
        self.shards[i].get_mut()
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

/// Whether a shard has the room a change needs ([`MemoryStore::space_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Space {
    /// It has.
    Free,
    /// It can be made: by dropping unused slots or evicting.
    ToMake,
    /// It cannot.
    Lacking,
}

/// What writing `members`, the pending keys of one shard, needs in it: new
/// keys, and the bytes the shard's entries grow by in all (beyond the slots
/// of new keys, which the shard counts).
fn needed_by(members: &[&Pending<'_>], shard: &Shard) -> Room {
    let (mut keys, mut grows, mut shrinks) = (0, 0, 0);
    for p in members {
        let (new, before, after) = p.change(shard);
        keys += usize::from(new);
        grows += after.saturating_sub(before);
        shrinks += before.saturating_sub(after);
    }
    Room {
        keys,
        bytes: grows.saturating_sub(shrinks),
    }
}

impl Pending<'_> {
    /// The ledger this key's acquires write: its live slots (at `now`; 0
    /// keeps every one) and those added, with the room [`grown_with`]
    /// gives; and how many ended slots it drops.
    fn slots(&self, held: Option<&Ledger>, now: u64) -> (Ledger, usize) {
        let mut ledger = held.cloned().unwrap_or_default();
        if !ledger.counts_under(&self.policy) {
            ledger.clear();
        }
        let before = ledger.len();
        ledger.purge(now, 0);
        let expired = before - ledger.len();
        let (last, rest) = self.added.split_last().expect("called with slots added");
        for g in rest {
            ledger.push(*g, &self.policy);
        }
        (grown_with(&ledger, *last, &self.policy), expired)
    }

    /// Where this key's entry is in `shard` now.
    fn find(&self, shard: &Shard) -> Option<usize> {
        shard.refind(self.found, self.hash, self.name, self.key)
    }

    /// What writing this key's outcome changes in `shard`: whether it adds
    /// a key, and the entry's bytes beyond its slot before and after.
    fn change(&self, shard: &Shard) -> (bool, usize, usize) {
        let found = self.find(shard);
        let before = found.map_or(0, |i| shard.extra_at(i));
        if !self.added.is_empty() {
            let (slots, _) = self.slots(found.and_then(|i| shard.ledger_at(i)), 0);
            let after = extra_bytes_with(self.name, self.key, self.state.as_ref(), &slots);
            return (found.is_none(), before, after);
        }
        // The entry's grants stay with it, whatever its state: it is
        // removed only when it has neither.
        let ledger = found.and_then(|i| shard.ledger_at(i));
        let after = match (&self.state, ledger) {
            (state, Some(ledger)) => extra_bytes_with(self.name, self.key, state.as_ref(), ledger),
            (Some(state), None) => extra_bytes(self.name, self.key, state),
            (None, None) => 0,
        };
        (found.is_none() && self.state.is_some(), before, after)
    }
}

/// The batch size up to which an all-or-nothing batch's working lists need
/// no heap allocation, and the items an independent batch decides per
/// [`MemoryStore::lock_all`] (so its lists never need one).
const SMALL: usize = 8;

/// A working list of a batch.
type Small<T> = SmallVec<[T; SMALL]>;

/// For each item, the first item of the batch with the same name and key
/// (itself when none comes before it). Sorted by hash, items of one key are
/// neighbours, so this neither hashes a key again nor builds a map.
fn first_of_each_key(items: &[CheckItem<'_>], hashes: &[u64]) -> Small<usize> {
    let mut first: Small<usize> = (0..items.len()).collect();
    let mut by_hash: Small<usize> = (0..items.len()).collect();
    by_hash.sort_unstable_by_key(|&i| (hashes[i], i));
    for (n, &i) in by_hash.iter().enumerate() {
        let same =
            |j: usize| items[j].name() == items[i].name() && items[j].key() == items[i].key();
        // Items of the same hash before `i` here came before it in the batch.
        if let Some(&j) = by_hash[..n]
            .iter()
            .rev()
            .take_while(|&&j| hashes[j] == hashes[i])
            .find(|&&j| same(j))
        {
            first[i] = first[j];
        }
    }
    first
}

fn fresh_at(now: u64, decision: &Decision) -> u64 {
    fresh_at_ms(now, decision.reset_after_ms)
}

fn fresh_at_ms(now: u64, reset_after_ms: u64) -> u64 {
    now.saturating_add(reset_after_ms)
}

/// The heap bytes a key's state and grants cost its entry, beyond its key.
fn entry_bytes(state: Option<&State>, ledger: &Ledger) -> usize {
    extra_bytes_with("", "", state, ledger)
}

/// `ledger` with room for more slots (doubling, at least 4, at most the
/// policy's limit of them: each holds a unit or more) and `slot` added.
fn grown_with(ledger: &Ledger, slot: Grant, policy: &Policy) -> Ledger {
    let most = usize::try_from(policy.limit()).unwrap_or(usize::MAX);
    let target = (ledger.capacity() * 2)
        .max(4)
        .min(most)
        .max(ledger.len() + 1);
    let mut grown = Ledger::new();
    grown.reserve(target);
    for g in ledger.grants() {
        grown.push(*g, policy);
    }
    grown.push(slot, policy);
    grown
}

/// Settles the lease `ask` names without granting one (the shard has no
/// room for a new grant), writing the key's entry back at `index`; a settle
/// alone never grows an entry. The answer is direct.
#[allow(
    clippy::too_many_arguments,
    reason = "the lease path's last step, kept apart"
)]
fn settle_only(
    shard: &mut Shard,
    index: usize,
    policy: &Policy,
    terms: &LeaseTerms,
    state: Option<State>,
    mut ledger: Ledger,
    now: u64,
    ask: &LeaseAsk,
) -> LeaseOutcome {
    let ask = LeaseAsk { want: 0, ..*ask };
    let (state, outcome) = algorithm::lease(policy, terms, state, &mut ledger, now, &ask);
    shard.write_granted(
        index,
        state,
        ledger,
        fresh_at_ms(now, outcome.reset_after_ms),
    );
    LeaseOutcome {
        answer: LeaseAnswer::Direct,
        ..outcome
    }
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::clock::FakeClock;
    use crate::policy::Algorithm;

    #[test]
    fn a_batch_locks_each_of_its_shards_once_in_ascending_order() {
        let config = StoreConfig::try_new(10_000, 64, OnFull::Deny).expect("valid config");
        let store = MemoryStore::new(config, Arc::new(FakeClock::new(0)));
        let policy = policies()[0];
        // Keys in descending order, over nearly every shard, some twice.
        let keys: Vec<String> = (0..200)
            .rev()
            .map(|k| format!("user-{}", k % 150))
            .collect();
        let items: Vec<CheckItem<'_>> = keys
            .iter()
            .map(|k| CheckItem::new("a", policy, k, 1).expect("valid"))
            .collect();
        let locked = store.lock_all(&items);
        assert!(locked.order.len() > 32, "{} shards", locked.order.len());
        assert!(
            locked.order.windows(2).all(|w| w[0] < w[1]),
            "{:?}",
            locked.order
        );
        for i in 0..items.len() {
            assert_eq!(
                locked.order[locked.guard_index(locked.shards[i])],
                locked.shards[i]
            );
        }
    }

    /// A clock that, each time it is read, notes whether the store's
    /// shard `shard` was locked then.
    #[derive(Debug)]
    struct LockWitness {
        store: std::sync::OnceLock<std::sync::Weak<MemoryStore>>,
        shard: usize,
        reads: AtomicUsize,
        unlocked_reads: AtomicUsize,
    }

    impl Clock for LockWitness {
        fn now_ms(&self) -> u64 {
            if let Some(store) = self.store.get().and_then(std::sync::Weak::upgrade) {
                self.reads.fetch_add(1, Ordering::Relaxed);
                if store.shards[self.shard].try_lock().is_some() {
                    self.unlocked_reads.fetch_add(1, Ordering::Relaxed);
                }
            }
            1_000
        }
    }

    /// Every decision reads the clock while holding its key's shard, as a
    /// Redis script reads TIME inside its atomic run: a check that read
    /// the clock first and locked after could find a key the sweep dropped
    /// in between, and decide at its earlier instant as if the key had
    /// never had the state it still had then (one more hit in a full
    /// window). The sweep reads it under the lock too.
    #[test]
    fn decisions_and_the_sweep_read_the_clock_under_the_shards_lock() {
        let policy = policies()[0];
        let item = CheckItem::new("a", policy, "k", 1).expect("valid");
        let config = StoreConfig::try_new(100, 1, OnFull::Deny).expect("valid config");
        let clock = Arc::new(LockWitness {
            store: std::sync::OnceLock::new(),
            shard: 0,
            reads: AtomicUsize::new(0),
            unlocked_reads: AtomicUsize::new(0),
        });
        let store = Arc::new(MemoryStore::new(config, clock.clone()));
        clock.store.set(Arc::downgrade(&store)).expect("set once");
        store.check_one(&item);
        store.check(&[item, item], BatchMode::Independent);
        store.check(&[item, item], BatchMode::AllOrNothing);
        store.peek(&item);
        store.sweep_step();
        assert!(clock.reads.load(Ordering::Relaxed) >= 5);
        assert_eq!(clock.unlocked_reads.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_all_or_nothing_batch_without_room_in_one_shard_evicts_nothing_in_another() {
        // Two shards of 64 keys, both full: one of strangers, the other of
        // the batch's own keys, which it may not evict. Shards are locked
        // and their room made in ascending order: each side comes first once.
        for (theirs, ours) in [(0, 1), (1, 0)] {
            let config = StoreConfig::try_new(128, 2, OnFull::Evict).expect("valid config");
            let store = MemoryStore::new(config, Arc::new(FakeClock::new(0)));
            assert_eq!(store.shards.len(), 2);
            let policy = policies()[0];
            let shard_of = |key: &str| store.shard_of(key_hash(&store.hasher, "a", key));
            let keys_in = |shard: usize, prefix: &str| {
                (0..)
                    .map(|i| format!("{prefix}-{i}"))
                    .filter(|k| shard_of(k) == shard)
                    .take(65)
                    .collect::<Vec<_>>()
            };
            let (strangers, own) = (keys_in(theirs, "stranger"), keys_in(ours, "own"));
            for key in strangers[..64].iter().chain(&own[..64]) {
                let item = CheckItem::new("a", policy, key, 1).expect("valid");
                assert!(store.check_one(&item).allowed, "{key}");
            }
            assert_eq!(store.live_keys(), 128);
            // A new key in each shard: the strangers' shard could evict one
            // of them, the batch's own cannot make room: refused whole.
            let keys = [&strangers[64], &own[64]].into_iter().chain(&own[..64]);
            let items: Vec<CheckItem<'_>> = keys
                .map(|k| CheckItem::new("a", policy, k, 1).expect("valid"))
                .collect();
            let decisions = store.check(&items, BatchMode::AllOrNothing);
            assert!(decisions.iter().all(|d| !d.allowed));
            assert_eq!(decisions[1].reason, Reason::Capacity);
            assert_eq!(store.evictions(), 0, "nothing evicted");
            assert_eq!(store.live_keys(), 128);
            for key in strangers[..64].iter().chain(&own[..64]) {
                let item = CheckItem::new("a", policy, key, 1).expect("valid");
                assert_eq!(store.peek(&item).remaining, 4, "{key} kept its state");
            }
        }
    }

    #[test]
    fn repeated_keys_point_at_their_first_item_even_when_hashes_collide() {
        let policy = Policy::try_new(Algorithm::FixedWindow, 5, Duration::from_secs(1), None)
            .expect("valid");
        let item = |name, key| CheckItem::new(name, policy, key, 1).expect("valid");
        let items = [
            item("a", "x"),
            item("a", "y"),
            item("b", "x"),
            item("a", "x"),
            item("a", "y"),
            item("a", "x"),
        ];
        // Every item under one hash: only the names and keys tell them apart.
        assert_eq!(
            first_of_each_key(&items, &[7; 6]).as_slice(),
            [0, 1, 2, 0, 1, 0]
        );
        // Equal keys under their real hashes.
        let hasher = KeyHasher::default();
        let hashes: Vec<u64> = items
            .iter()
            .map(|i| key_hash(&hasher, i.name(), i.key()))
            .collect();
        assert_eq!(
            first_of_each_key(&items, &hashes).as_slice(),
            [0, 1, 2, 0, 1, 0]
        );
    }

    /// Policies the operations pick from: small limits, so logs fill and
    /// windows pass within a run.
    fn policies() -> [Policy; 4] {
        let p = |a, limit, ms| {
            Policy::try_new(a, limit, Duration::from_millis(ms), None).expect("valid")
        };
        [
            p(Algorithm::FixedWindow, 5, 1_000),
            p(Algorithm::SlidingLog, 8, 2_000),
            p(Algorithm::SlidingLog, 64, 5_000),
            p(Algorithm::TokenBucket, 3, 1_000),
        ]
    }

    /// Short keys, kept inline, and long ones, on the heap.
    fn key(k: u8) -> String {
        match k % 3 {
            0 => format!("k{k}"),
            1 => format!("k{k}-{}", "x".repeat(40)),
            _ => format!("k{k}-{}", "y".repeat(300)),
        }
    }

    /// `(policy name, policy, key, cost)`: the name and the policy are
    /// drawn apart, so a key's state is sometimes another algorithm's.
    type Req = (u8, u8, u8, u64);

    #[derive(Clone, Debug)]
    enum Op {
        Check(Req),
        Batch(Vec<Req>),
        Independent(Vec<Req>),
        Peek(Req),
        Reset(u8, u8),
        Sweep,
        Advance(u64),
        /// Acquire a slot (key, cost, id) of the concurrency policy, alone
        /// or in an all-or-nothing batch next to a rate item.
        Acquire(u8, u64, u8, bool),
        Release(u8, u8),
    }

    fn req() -> impl Strategy<Value = Req> {
        (
            0u8..2,
            0u8..4,
            0u8..40,
            prop_oneof![4 => Just(1u64), 1 => 1u64..=10],
        )
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => req().prop_map(Op::Check),
            2 => prop::collection::vec(req(), 1..5).prop_map(Op::Batch),
            // Past the 8 items an independent batch decides per locking.
            2 => prop::collection::vec(req(), 1..20).prop_map(Op::Independent),
            1 => req().prop_map(Op::Peek),
            1 => (0u8..2, 0u8..40).prop_map(|(n, k)| Op::Reset(n, k)),
            1 => Just(Op::Sweep),
            2 => prop_oneof![3 => 0u64..20, 1 => 0u64..3_000].prop_map(Op::Advance),
            3 => (0u8..40, 1u64..=3, any::<u8>(), any::<bool>()).prop_map(|(k, c, id, b)| Op::Acquire(k, c, id, b)),
            2 => (0u8..40, any::<u8>()).prop_map(|(k, id)| Op::Release(k, id)),
        ]
    }

    /// The concurrency policy the slot operations use: up to 20 slots a key.
    fn slots_policy() -> Policy {
        Policy::concurrency(20, Duration::from_millis(1_500)).expect("valid")
    }

    /// The policy names, policies and keys a [`Req`] picks from.
    struct Universe {
        policies: [Policy; 4],
        keys: Vec<String>,
    }

    const NAMES: [&str; 2] = ["a", "b"];

    impl Universe {
        fn new() -> Self {
            Self {
                policies: policies(),
                keys: (0..40).map(key).collect(),
            }
        }

        fn item(&self, &(n, p, k, cost): &Req) -> CheckItem<'_> {
            CheckItem::new(
                NAMES[usize::from(n)],
                self.policies[usize::from(p)],
                &self.keys[usize::from(k)],
                cost,
            )
            .expect("valid item")
        }

        fn items(&self, reqs: &[Req]) -> Vec<CheckItem<'_>> {
            reqs.iter().map(|r| self.item(r)).collect()
        }
    }

    fn assert_accounting_exact(store: &MemoryStore) -> Result<(), TestCaseError> {
        let keys = store.config.max_keys() / store.shards.len();
        let bytes = store.config.max_bytes / store.shards.len();
        for (i, shard) in store.shards.iter().enumerate() {
            let shard = shard.lock();
            prop_assert_eq!(shard.bytes(), shard.recount(), "shard {}", i);
            prop_assert!(shard.bytes() <= bytes, "shard {} over its byte budget", i);
            prop_assert!(shard.len() <= keys, "shard {} over its key budget", i);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        #[test]
        fn the_byte_count_equals_a_recount_after_any_operations(
            ops in prop::collection::vec(op(), 1..400),
            max_bytes in (64 * ENTRY_BYTES)..16_000,
            evict in any::<bool>(),
        ) {
            let on_full = if evict { OnFull::Evict } else { OnFull::Deny };
            let config = StoreConfig::try_new(256, 4, on_full)
                .and_then(|c| c.with_max_bytes(max_bytes))
                .expect("valid config");
            let clock = Arc::new(FakeClock::new(1_767_268_800_000));
            let store = MemoryStore::new(config, clock.clone());
            let u = Universe::new();
            for op in &ops {
                match op {
                    Op::Check(r) => {
                        store.check_one(&u.item(r));
                    }
                    Op::Batch(rs) => {
                        store.check(&u.items(rs), BatchMode::AllOrNothing);
                    }
                    Op::Independent(rs) => {
                        store.check(&u.items(rs), BatchMode::Independent);
                    }
                    Op::Peek(r) => {
                        store.peek(&u.item(r));
                    }
                    Op::Reset(n, k) => {
                        store.reset(NAMES[usize::from(*n)], &u.keys[usize::from(*k)]);
                    }
                    Op::Sweep => {
                        store.sweep_step();
                    }
                    Op::Advance(ms) => clock.advance(Duration::from_millis(*ms)),
                    Op::Acquire(k, cost, id, batch) => {
                        let key = &u.keys[usize::from(*k)];
                        let slot = CheckItem::acquire("c", slots_policy(), key, *cost, u64::from(*id))
                            .expect("valid");
                        if *batch {
                            let rate = u.item(&(0, 0, *k, 1));
                            store.check(&[rate, slot], BatchMode::AllOrNothing);
                        } else {
                            let _ = store.acquire(&slot);
                        }
                    }
                    Op::Release(k, id) => {
                        let key = &u.keys[usize::from(*k)];
                        store.release("c", key, &slots_policy(), u64::from(*id)).expect("a concurrency policy");
                    }
                }
                assert_accounting_exact(&store)?;
            }
        }

        #[test]
        fn an_independent_batch_decides_as_its_items_checked_one_by_one(
            batches in prop::collection::vec(
                (prop::collection::vec(req(), 1..20), prop_oneof![3 => 0u64..20, 1 => 0u64..3_000]),
                1..40,
            ),
        ) {
            // Budgets nothing fills: each store places keys by its own
            // random hash, so only a store with room decides independently
            // of where its keys land.
            let config = || StoreConfig::try_new(100_000, 4, OnFull::Deny).expect("valid config");
            let clock = Arc::new(FakeClock::new(1_767_268_800_000));
            let (batched, alone) = (
                MemoryStore::new(config(), clock.clone()),
                MemoryStore::new(config(), clock.clone()),
            );
            let u = Universe::new();
            for (rs, ms) in &batches {
                let items = u.items(rs);
                let one_by_one: Vec<Decision> = items.iter().map(|i| alone.check_one(i)).collect();
                prop_assert_eq!(batched.check(&items, BatchMode::Independent), one_by_one);
                clock.advance(Duration::from_millis(*ms));
            }
        }

        #[test]
        fn repeated_keys_match_a_pairwise_search(
            reqs in prop::collection::vec((0u8..2, 0u8..4), 0..30),
            salt in 0u64..3,
        ) {
            let policy = policies()[0];
            let keys = ["x", "y", "z", "w"];
            let items: Vec<CheckItem<'_>> = reqs
                .iter()
                .map(|&(n, k)| {
                    CheckItem::new(NAMES[usize::from(n)], policy, keys[usize::from(k)], 1).expect("valid")
                })
                .collect();
            // Three hash values for eight keys: unequal keys often share a
            // hash; equal keys always do, as with real hashes.
            let hashes: Vec<u64> = reqs
                .iter()
                .map(|&(n, k)| (u64::from(n) * 4 + u64::from(k) + salt) % 3)
                .collect();
            let first: Vec<usize> = (0..items.len())
                .map(|i| {
                    (0..=i)
                        .find(|&j| items[j].name() == items[i].name() && items[j].key() == items[i].key())
                        .expect("an item is its own match")
                })
                .collect();
            let found = first_of_each_key(&items, &hashes);
            prop_assert_eq!(found.as_slice(), first.as_slice());
        }
    }
}
