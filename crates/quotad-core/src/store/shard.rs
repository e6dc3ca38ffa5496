//! One shard of the key table. Its lock serializes every transition of the
//! keys that hash to it.
//!
//! Each key is hashed once per check, from its parts, and that hash both
//! picks the shard and finds the entry: no table key is built to look up a
//! key that is already there.

use std::hash::{BuildHasher, Hash, Hasher};

use compact_str::CompactString;
use indexmap::IndexMap;
use indexmap::map::RawEntryApiV1;
use indexmap::map::raw_entry_v1::RawEntryMut;

use crate::algorithm::State;
use crate::grant::{Grant, Ledger};
use crate::policy::{Algorithm, Policy};

/// How many entries an eviction looks at to choose its victim.
const EVICTION_SAMPLE: usize = 16;

/// The heap bytes one slot of a shard's table costs, used or not: the
/// 80-byte entry (8-byte hash, 24-byte key with its inline buffer, 48-byte
/// slot: the state of up to four integers, its tag and when it is fresh;
/// a key holding grants keeps its state and ledger behind one pointer in
/// the same 40 bytes) and its share of the index table.
///
/// Measured with `cargo run --release -p quotad-core --example
/// bytes_per_key`: 1,000,000 fixed-window keys of 16 bytes (inline) in 64
/// shards take 102.8 heap bytes per key, index table included; rounded up,
/// since the index table's share of a slot varies with how full it is
/// (from 10 to 21 bytes). A key's heap bytes beyond the inline buffer, and a
/// sliding log's entries, come on top (see
/// [`crate::StoreConfig::with_max_bytes`]).
pub const ENTRY_BYTES: usize = 104;

/// Bytes a table key is stored in inline, without a heap allocation.
const INLINE_KEY_BYTES: usize = 24;

/// The smallest heap buffer a table key longer than [`INLINE_KEY_BYTES`]
/// gets (compact_str's minimum heap capacity).
const MIN_HEAP_KEY_BYTES: usize = 32;

/// The heap bytes of a table key of `len` bytes (`name`, NUL, `key`), as
/// [`StoreKey::new`] allocates it.
fn key_heap_bytes(len: usize) -> usize {
    if len <= INLINE_KEY_BYTES {
        0
    } else {
        len.max(MIN_HEAP_KEY_BYTES)
    }
}

/// The bytes the entry of `(name, key)` holding `state` costs its shard
/// beyond its table slot: its key's heap bytes and its state's.
pub(super) fn extra_bytes(name: &str, key: &str, state: &State) -> usize {
    key_heap_bytes(name.len() + 1 + key.len()) + state.heap_bytes()
}

/// [`extra_bytes`] of an entry that may also hold grants.
pub(super) fn extra_bytes_with(
    name: &str,
    key: &str,
    state: Option<&State>,
    ledger: &Ledger,
) -> usize {
    key_heap_bytes(name.len() + 1 + key.len())
        + state.map_or(0, State::heap_bytes)
        + granted_bytes(ledger)
}

/// The heap bytes a ledger costs an entry: none while it is empty (the
/// entry holds its state inline), else the box holding state and ledger and
/// the ledger's grants.
fn granted_bytes(ledger: &Ledger) -> usize {
    if ledger.is_empty() {
        0
    } else {
        size_of::<Granted>() + ledger.heap_bytes()
    }
}

/// The concurrency slots a ledger holds (none for a lease ledger).
fn slots_in(ledger: &Ledger) -> u64 {
    if ledger
        .charged_under()
        .is_some_and(|(a, _)| a == Algorithm::Concurrency)
    {
        ledger.len() as u64
    } else {
        0
    }
}

/// Keys, and bytes beyond table slots: what a change needs free in a shard,
/// or what it lacks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Room {
    pub(super) keys: usize,
    pub(super) bytes: usize,
}

impl Room {
    pub(super) fn is_empty(self) -> bool {
        self.keys == 0 && self.bytes == 0
    }
}

/// The hasher shared by every shard.
pub(super) type KeyHasher = foldhash::fast::RandomState;

/// The table key: policy name, NUL, key. Names cannot hold NUL, so the split
/// is unambiguous; up to 24 bytes are stored inline, without a heap
/// allocation.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct StoreKey(CompactString);

impl StoreKey {
    pub(super) fn new(name: &str, key: &str) -> Self {
        let mut k = CompactString::with_capacity(name.len() + 1 + key.len());
        k.push_str(name);
        k.push('\0');
        k.push_str(key);
        StoreKey(k)
    }

    /// Whether this is the key of `(name, key)`.
    pub(super) fn is(&self, name: &str, key: &str) -> bool {
        let s = self.0.as_bytes();
        s.len() == name.len() + 1 + key.len()
            && s.starts_with(name.as_bytes())
            && s[name.len()] == 0
            && s.ends_with(key.as_bytes())
    }

    /// The policy name and the key.
    pub(super) fn parts(&self) -> (&str, &str) {
        self.0.split_once('\0').unwrap_or((self.0.as_str(), ""))
    }

    /// Heap bytes held beyond the inline buffer.
    fn heap_bytes(&self) -> usize {
        key_heap_bytes(self.0.len())
    }
}

/// Hashes a key from its parts, exactly as `StoreKey`'s `Hash` does.
fn hash_parts<H: Hasher>(name: &str, key: &str, h: &mut H) {
    h.write(name.as_bytes());
    h.write_u8(0);
    h.write(key.as_bytes());
}

impl Hash for StoreKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        let (name, key) = self.parts();
        hash_parts(name, key, h);
    }
}

/// The hash of `(name, key)`, as the shards' tables see it.
pub(super) fn key_hash(hasher: &KeyHasher, name: &str, key: &str) -> u64 {
    let mut h = hasher.build_hasher();
    hash_parts(name, key, &mut h);
    h.finish()
}

/// What the store keeps for one key, and when it becomes equivalent to
/// fresh.
#[derive(Debug)]
struct Slot {
    fresh_at: u64,
    body: Body,
}

/// A key's meter state and, once it holds grants, its ledger. The common
/// case, a meter alone, stays inline: a ledger costs a key nothing until it
/// has one.
#[derive(Debug)]
enum Body {
    /// The meter's state. `None` only while taken out for one transition
    /// (an entry with neither state nor grants is removed).
    Meter(Option<State>),
    /// State and grants together.
    Granted(Box<Granted>),
}

/// A key's state with its live grants.
#[derive(Debug)]
struct Granted {
    /// `None` while taken out for one transition, or when only grants keep
    /// the entry.
    state: Option<State>,
    /// Never empty while in the table.
    ledger: Ledger,
}

impl Slot {
    fn state(&self) -> Option<&State> {
        match &self.body {
            Body::Meter(state) => state.as_ref(),
            Body::Granted(g) => g.state.as_ref(),
        }
    }

    fn state_mut(&mut self) -> &mut Option<State> {
        match &mut self.body {
            Body::Meter(state) => state,
            Body::Granted(g) => &mut g.state,
        }
    }

    fn ledger(&self) -> Option<&Ledger> {
        match &self.body {
            Body::Meter(_) => None,
            Body::Granted(g) => Some(&g.ledger),
        }
    }

    fn state_bytes(&self) -> usize {
        self.state().map_or(0, State::heap_bytes)
    }

    fn ledger_bytes(&self) -> usize {
        self.ledger().map_or(0, granted_bytes)
    }

    /// The slot of `state` and `ledger`.
    fn new(fresh_at: u64, state: Option<State>, ledger: Ledger) -> Self {
        let body = if ledger.is_empty() {
            Body::Meter(state)
        } else {
            Body::Granted(Box::new(Granted { state, ledger }))
        };
        Slot { fresh_at, body }
    }
}

/// What an entry costs beyond its table slot.
fn extra_of(key: &StoreKey, slot: &Slot) -> usize {
    key.heap_bytes() + slot.state_bytes() + slot.ledger_bytes()
}

/// A shard's table and its budgets. Its cost is counted as every table slot
/// it has allocated, used or not, at [`ENTRY_BYTES`], plus each entry's
/// extra bytes: so what it counts is what it holds, and the table grows
/// only into bytes the budget has free.
#[derive(Debug)]
pub(super) struct Shard {
    map: IndexMap<StoreKey, Slot, KeyHasher>,
    /// The most keys this shard may hold; its table never grows past room
    /// for exactly this many.
    max_keys: usize,
    /// The most bytes it may cost.
    max_bytes: usize,
    /// Entries the table has room for: what it has reserved. (The index
    /// table's own count can dip below this after removals.)
    slots: usize,
    /// What it costs now: its slots and its entries' extra bytes, less the
    /// state of an entry taken out for a transition.
    bytes: usize,
    /// No entry becomes fresh before this instant (a lower bound), so a
    /// purge before it would find nothing.
    next_expiry: u64,
    /// Where the next eviction sample starts.
    cursor: usize,
    /// Concurrency slots the shard dropped unreleased, with the entries
    /// they kept (swept as fresh, or found fresh by a transition).
    expired_slots: u64,
    /// Counts the changes that may move entries (a removal: a write of
    /// fresh state, a purge, an eviction), so that where a key was found
    /// stays known until one happens ([`Found`]). An insert appends, and
    /// growing or shrinking the table keeps every entry where it is.
    moves: u64,
}

/// Where a key's entry was (or that it had none) when it was looked up
/// ([`Shard::lookup`]), and the shard's count of moves then. The caller
/// holds the shard's lock from the lookup on, and inserts no entry for
/// this key meanwhile.
#[derive(Clone, Copy, Debug)]
pub(super) struct Found {
    index: Option<usize>,
    moves: u64,
}

impl Found {
    /// The index of the entry when it was looked up.
    pub(super) fn index(self) -> Option<usize> {
        self.index
    }
}

impl Shard {
    /// An empty shard that will hold at most `max_keys` keys and cost at
    /// most `max_bytes`.
    pub(super) fn new(max_keys: usize, max_bytes: usize, hasher: KeyHasher) -> Self {
        Self {
            map: IndexMap::with_hasher(hasher),
            max_keys,
            max_bytes,
            slots: 0,
            bytes: 0,
            next_expiry: u64::MAX,
            cursor: 0,
            expired_slots: 0,
            moves: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Concurrency slots dropped unreleased with their entries.
    pub(super) fn expired_slots(&self) -> u64 {
        self.expired_slots
    }

    /// Calls `f` with each entry's policy name and ledger, for entries
    /// holding grants.
    pub(super) fn for_each_ledger(&self, mut f: impl FnMut(&str, &Ledger)) {
        for (k, slot) in &self.map {
            if let Some(ledger) = slot.ledger() {
                f(k.parts().0, ledger);
            }
        }
    }

    /// What the shard costs now.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes free under the budget.
    pub(super) fn free_bytes(&self) -> usize {
        self.max_bytes.saturating_sub(self.bytes)
    }

    /// What `need` lacks here: keys beyond the key budget, and bytes beyond
    /// the byte budget, counting the slots the table would have to add;
    /// with `shrink`, as if the table were first shrunk to fit its entries
    /// and `need`.
    pub(super) fn short(&self, need: Room, shrink: bool) -> Room {
        self.short_with(need, self.map.len(), self.bytes, shrink)
    }

    /// [`Shard::short`] with `len` entries costing `bytes` in all.
    fn short_with(&self, need: Room, len: usize, bytes: usize, shrink: bool) -> Room {
        let wanted = len + need.keys;
        let slots = if shrink {
            wanted
        } else {
            self.slots.max(wanted)
        };
        let bytes = bytes - self.slots * ENTRY_BYTES + slots * ENTRY_BYTES + need.bytes;
        Room {
            keys: wanted.saturating_sub(self.max_keys),
            bytes: bytes.saturating_sub(self.max_bytes),
        }
    }

    /// The most heap bytes the state of the entry at `index` may hold after
    /// a check: with `evict`, what the budget leaves were every other entry
    /// evicted and the table shrunk to this one; otherwise, what is free
    /// now, with the table shrunk to fit its entries.
    pub(super) fn room_for_state(&self, index: usize, evict: bool) -> usize {
        let Some((key, slot)) = self.map.get_index(index) else {
            return 0;
        };
        if evict {
            self.max_bytes
                .saturating_sub(ENTRY_BYTES + key.heap_bytes())
        } else {
            self.free_bytes() + slot.state_bytes() + (self.slots - self.map.len()) * ENTRY_BYTES
        }
    }

    /// What the entry at `index` costs beyond its slot.
    pub(super) fn extra_at(&self, index: usize) -> usize {
        self.map
            .get_index(index)
            .map_or(0, |(k, slot)| extra_of(k, slot))
    }

    /// What the shard costs, counted from scratch.
    #[cfg(test)]
    pub(super) fn recount(&self) -> usize {
        assert!(self.map.len() <= self.slots);
        self.slots * ENTRY_BYTES
            + self
                .map
                .iter()
                .map(|(k, slot)| extra_of(k, slot))
                .sum::<usize>()
    }

    /// Each entry: its policy name, key, when it becomes fresh, its state
    /// and its grants (if any).
    #[cfg(feature = "snapshot")]
    pub(super) fn entries(
        &self,
    ) -> impl Iterator<Item = (&str, &str, u64, Option<&State>, Option<&Ledger>)> {
        self.map.iter().map(|(k, slot)| {
            let (name, key) = k.parts();
            (name, key, slot.fresh_at, slot.state(), slot.ledger())
        })
    }

    /// Where the key's entry is, if it has one.
    pub(super) fn find(&self, hash: u64, name: &str, key: &str) -> Option<usize> {
        self.map
            .raw_entry_v1()
            .index_from_hash(hash, |k| k.is(name, key))
    }

    /// Looks the key up, for [`Shard::refind`] to answer again without a
    /// lookup while no entry has moved.
    pub(super) fn lookup(&self, hash: u64, name: &str, key: &str) -> Found {
        Found {
            index: self.find(hash, name, key),
            moves: self.moves,
        }
    }

    /// Where the key `found` was looked up for is now: where it was, unless
    /// entries may have moved since, and then looked up again.
    pub(super) fn refind(&self, found: Found, hash: u64, name: &str, key: &str) -> Option<usize> {
        if found.moves == self.moves {
            debug_assert_eq!(found.index, self.find(hash, name, key));
            found.index
        } else {
            self.find(hash, name, key)
        }
    }

    /// The state at `index`, taken out for one transition at `now`; until
    /// it is written back, its bytes are not counted. State fresh by `now`
    /// (as of the policy that wrote it) is none, swept or not.
    pub(super) fn take(&mut self, index: usize, now: u64) -> Option<State> {
        let state = self
            .map
            .get_index_mut(index)
            .and_then(|(_, slot)| slot.state_mut().take());
        self.bytes -= state.as_ref().map_or(0, State::heap_bytes);
        state.filter(|_| !self.fresh_by(index, now))
    }

    /// The state at `index`, to read at `now`: none once fresh, as
    /// [`Shard::take`].
    pub(super) fn state(&self, index: usize, now: u64) -> Option<&State> {
        self.map
            .get_index(index)
            .and_then(|(_, slot)| slot.state())
            .filter(|_| !self.fresh_by(index, now))
    }

    /// The grants of the entry at `index`, taken out for one transition at
    /// `now` (empty once the entry is fresh); until they are written back
    /// with [`Shard::write_granted`], their bytes are not counted.
    pub(super) fn take_ledger(&mut self, index: usize, now: u64) -> Ledger {
        let (ledger, fresh) = self.remove_ledger(index, now);
        if fresh {
            self.expired_slots += slots_in(&ledger);
            Ledger::new()
        } else {
            ledger
        }
    }

    /// Drops the grants of the entry at `index` without counting its ended
    /// slots: for a caller that has counted them already.
    pub(super) fn drop_ledger(&mut self, index: usize, now: u64) {
        drop(self.remove_ledger(index, now));
    }

    /// The ledger taken out of the entry at `index`, and whether the entry
    /// was fresh at `now` (every grant of it ended).
    fn remove_ledger(&mut self, index: usize, now: u64) -> (Ledger, bool) {
        let fresh = self.fresh_by(index, now);
        let Some((_, slot)) = self.map.get_index_mut(index) else {
            return (Ledger::new(), fresh);
        };
        let bytes = slot.ledger_bytes();
        let ledger = match &mut slot.body {
            Body::Meter(_) => Ledger::new(),
            Body::Granted(g) => {
                let ledger = std::mem::take(&mut g.ledger);
                let state = g.state.take();
                slot.body = Body::Meter(state);
                ledger
            }
        };
        self.bytes -= bytes;
        (ledger, fresh)
    }

    /// The grants of the entry at `index`, if it holds any (ended ones
    /// too, until the next transition drops them).
    pub(super) fn ledger_at(&self, index: usize) -> Option<&Ledger> {
        self.map
            .get_index(index)
            .and_then(|(_, slot)| slot.ledger())
    }

    /// The grants of the entry at `index` that `policy` counts: none for
    /// most keys.
    pub(super) fn grants_at(&self, index: usize, policy: &Policy) -> &[Grant] {
        self.ledger_at(index)
            .map_or(&[], |l| l.grants_under(policy))
    }

    /// When the entry at `index` becomes fresh.
    pub(super) fn fresh_at(&self, index: usize) -> u64 {
        self.map
            .get_index(index)
            .map_or(0, |(_, slot)| slot.fresh_at)
    }

    /// Writes `state` and `ledger` back at `index` (both taken out), or
    /// removes the entry when both are empty. The entry is fresh no earlier
    /// than its last grant ends.
    pub(super) fn write_granted(
        &mut self,
        index: usize,
        state: Option<State>,
        ledger: Ledger,
        fresh_at: u64,
    ) {
        let Some((key, slot)) = self.map.get_index_mut(index) else {
            return;
        };
        self.bytes -= slot.state_bytes() + slot.ledger_bytes();
        if state.is_none() && ledger.is_empty() {
            self.bytes -= key.heap_bytes();
            self.remove_at(index);
            return;
        }
        let fresh_at = fresh_at.max(ledger.last_end());
        self.next_expiry = self.next_expiry.min(fresh_at);
        self.bytes += state.as_ref().map_or(0, State::heap_bytes) + granted_bytes(&ledger);
        *slot = Slot::new(fresh_at, state, ledger);
    }

    /// Whether the entry at `index` is fresh by `now`: the store drops it
    /// then (the sweep, or room being made), and until it does, reads it as
    /// none, so that no decision depends on when the sweep came by.
    fn fresh_by(&self, index: usize, now: u64) -> bool {
        self.map
            .get_index(index)
            .is_some_and(|(_, slot)| slot.fresh_at <= now)
    }

    /// Writes `state` back at `index`, keeping the entry's grants; removes
    /// the entry when `state` is fresh and it holds no grants (a key whose
    /// grants still count keeps its entry until they end).
    pub(super) fn write(&mut self, index: usize, state: Option<State>, fresh_at: u64) {
        let Some((key, slot)) = self.map.get_index_mut(index) else {
            return;
        };
        self.bytes -= slot.state_bytes();
        if state.is_none() && slot.ledger().is_none() {
            self.bytes -= key.heap_bytes();
            self.remove_at(index);
            return;
        }
        let fresh_at = fresh_at.max(slot.ledger().map_or(0, Ledger::last_end));
        self.next_expiry = self.next_expiry.min(fresh_at);
        self.bytes += state.as_ref().map_or(0, State::heap_bytes);
        slot.fresh_at = fresh_at;
        *slot.state_mut() = state;
    }

    /// Removes the entry at `index`, state and grants.
    pub(super) fn remove(&mut self, index: usize) {
        if let Some((key, slot)) = self.map.get_index(index) {
            self.bytes -= extra_of(key, slot);
            self.remove_at(index);
        }
    }

    /// Removes the entry at `index` (the last one takes its place), counted
    /// as a move; the caller accounts for its bytes.
    fn remove_at(&mut self, index: usize) -> Option<(StoreKey, Slot)> {
        let removed = self.map.swap_remove_index(index);
        self.moves += 1;
        removed
    }

    /// Adds a key that has no entry yet. The caller has made room.
    pub(super) fn insert(&mut self, hash: u64, name: &str, key: &str, state: State, fresh_at: u64) {
        self.insert_granted(hash, name, key, Some(state), Ledger::new(), fresh_at);
    }

    /// Adds a key that has no entry yet, with its grants: at least one of
    /// `state` and `ledger` holds something. The caller has made room.
    pub(super) fn insert_granted(
        &mut self,
        hash: u64,
        name: &str,
        key: &str,
        state: Option<State>,
        ledger: Ledger,
        fresh_at: u64,
    ) {
        debug_assert!(state.is_some() || !ledger.is_empty());
        self.reserve(1, extra_bytes_with(name, key, state.as_ref(), &ledger));
        let fresh_at = fresh_at.max(ledger.last_end());
        self.next_expiry = self.next_expiry.min(fresh_at);
        self.bytes += state.as_ref().map_or(0, State::heap_bytes) + granted_bytes(&ledger);
        let slot = Slot::new(fresh_at, state, ledger);
        match self
            .map
            .raw_entry_mut_v1()
            .from_hash(hash, |k| k.is(name, key))
        {
            RawEntryMut::Vacant(v) => {
                let key = StoreKey::new(name, key);
                self.bytes += key.heap_bytes();
                v.insert_hashed_nocheck(hash, key, slot);
            }
            RawEntryMut::Occupied(mut o) => {
                self.bytes -= o.get().state_bytes() + o.get().ledger_bytes();
                o.insert(slot);
            }
        }
    }

    /// Makes sure the table has slots for `keys` more entries, leaving
    /// `keep` bytes free for what they hold. It grows by doubling, as
    /// usual, but never past `max_keys` slots, so a full shard holds no
    /// unused slots (left alone, the entry list would grow to the index
    /// table's size, up to 1.75x the keys), and never into bytes the budget
    /// does not have. A table that grows with its keys also stays small,
    /// and cache-resident, when far fewer keys than `max_keys` are live.
    pub(super) fn reserve(&mut self, keys: usize, keep: usize) {
        let len = self.map.len();
        let capacity = self.slots;
        if len + keys <= capacity {
            return;
        }
        let affordable = capacity + self.free_bytes().saturating_sub(keep) / ENTRY_BYTES;
        let target = (capacity * 2)
            .max(16)
            .min(self.max_keys)
            .min(affordable)
            .max(len + keys);
        self.map.reserve_exact(target - len);
        self.slots = target;
        self.bytes += (target - capacity) * ENTRY_BYTES;
    }

    /// Shrinks the table to slots for its entries and `keys` more, giving
    /// the rest back to the allocator (and to the budget).
    pub(super) fn shrink(&mut self, keys: usize) {
        let target = self.map.len() + keys;
        if target < self.slots {
            self.map.shrink_to(target);
            self.bytes -= (self.slots - target) * ENTRY_BYTES;
            self.slots = target;
        }
    }

    /// Drops every entry that is fresh by `now`, if any can be. Returns how
    /// many were dropped.
    pub(super) fn purge_expired(&mut self, now: u64) -> usize {
        if now < self.next_expiry {
            return 0;
        }
        let before = self.map.len();
        let mut next = u64::MAX;
        let mut freed = 0;
        let mut expired = 0;
        self.map.retain(|key, slot| {
            let keep = slot.fresh_at > now;
            if keep {
                next = next.min(slot.fresh_at);
            } else {
                freed += extra_of(key, slot);
                expired += slot.ledger().map_or(0, slots_in);
            }
            keep
        });
        self.expired_slots += expired;
        self.bytes -= freed;
        self.next_expiry = next;
        if self.map.len() < before {
            self.moves += 1;
        }
        // A table left under a quarter full gives most of its room back,
        // as the keys that needed it are gone.
        let len = self.map.len();
        if self.slots > 64 && len < self.slots / 4 {
            self.shrink(len.max(16));
        }
        before - len
    }

    /// Whether evicting entries `protect` does not cover, then shrinking
    /// the table, can make `need` fit. Stops looking as soon as evicting
    /// those seen so far would.
    pub(super) fn can_evict_for(&self, need: Room, protect: &dyn Fn(&StoreKey) -> bool) -> bool {
        let (mut len, mut bytes) = (self.map.len(), self.bytes);
        if self.short_with(need, len, bytes, true).is_empty() {
            return true;
        }
        for (key, slot) in &self.map {
            if protect(key) || slot.ledger().is_some() {
                continue;
            }
            len -= 1;
            bytes -= extra_of(key, slot);
            if self.short_with(need, len, bytes, true).is_empty() {
                return true;
            }
        }
        false
    }

    /// Evicts the entry closest to fresh among a sample of those `protect`
    /// does not cover, which for one policy is the one least recently used
    /// (the way Redis samples for LRU). Returns whether an entry was
    /// evicted.
    pub(super) fn evict_one(&mut self, protect: &dyn Fn(&StoreKey) -> bool) -> bool {
        let len = self.map.len();
        let start = self.cursor % len.max(1);
        let victim = (0..len)
            .map(|i| (start + i) % len)
            .filter_map(|i| {
                let (key, slot) = self.map.get_index(i)?;
                // A key holding grants is never evicted: its holders go on
                // spending them, and a fresh budget beside them would
                // admit twice. Its grants end by their TTL.
                (!protect(key) && slot.ledger().is_none()).then_some((i, slot.fresh_at))
            })
            .take(EVICTION_SAMPLE)
            .min_by_key(|&(_, fresh_at)| fresh_at);
        self.cursor = start + EVICTION_SAMPLE;
        match victim.and_then(|(i, _)| self.remove_at(i)) {
            Some((key, slot)) => {
                self.bytes -= extra_of(&key, &slot);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;
    use std::time::Duration;

    use super::*;
    use crate::algorithm::{Spend, decide_spending};
    use crate::policy::{Algorithm, Policy};

    fn some_state() -> State {
        let policy = Policy::try_new(Algorithm::FixedWindow, 10, Duration::from_secs(60), None)
            .expect("valid policy");
        decide_spending(&policy, None, 0, NonZeroU64::MIN, Spend::WhenAdmitted)
            .0
            .expect("a check leaves state")
    }

    #[test]
    fn a_key_without_grants_costs_no_more_than_a_meter_did() {
        // The 48-byte slot of ENTRY_BYTES: the ledger shares the state's
        // room behind the enum's niche, so keys without grants pay nothing.
        assert_eq!(size_of::<Slot>(), 48);
        assert_eq!(size_of::<Body>(), size_of::<Option<State>>());
    }

    #[test]
    fn a_key_found_before_entries_moved_is_found_where_it_is_now() {
        let hasher = KeyHasher::default();
        let hash = |key: &str| key_hash(&hasher, "p", key);
        // Each way an entry leaves the table: the last one takes its place
        // (a write of fresh state, an eviction) or moves down (a purge).
        for removal in ["write fresh state", "purge", "evict"] {
            let mut shard = Shard::new(100, usize::MAX, hasher.clone());
            for (key, fresh_at) in [("a", 10), ("b", 1000), ("c", 1000), ("d", 1000)] {
                shard.insert(hash(key), "p", key, some_state(), fresh_at);
            }
            let d = shard.lookup(hash("d"), "p", "d");
            let e = shard.lookup(hash("e"), "p", "e");
            assert_eq!(d.index(), Some(3));
            // An insert appends; growing and shrinking the table keep every
            // entry where it is.
            shard.insert(hash("f"), "p", "f", some_state(), 1000);
            shard.reserve(50, 0);
            shard.shrink(0);
            assert_eq!(shard.find(hash("d"), "p", "d"), Some(3), "d stayed");
            assert_eq!(
                shard.refind(d, hash("d"), "p", "d"),
                Some(3),
                "nothing moved yet"
            );
            let f = shard.lookup(hash("f"), "p", "f");
            assert_eq!(f.index(), Some(4));
            match removal {
                "write fresh state" => shard.write(0, None, 0),
                "purge" => assert_eq!(shard.purge_expired(10), 1),
                _ => assert!(shard.evict_one(&|k| !k.is("p", "a"))),
            }
            let now = shard.find(hash("f"), "p", "f");
            assert!(now.is_some() && now != Some(4), "{removal}: f moved");
            assert_eq!(shard.refind(f, hash("f"), "p", "f"), now, "{removal}");
            let now = shard.find(hash("d"), "p", "d");
            assert_eq!(shard.refind(d, hash("d"), "p", "d"), now, "{removal}");
            assert_eq!(shard.refind(e, hash("e"), "p", "e"), None, "{removal}");
        }
    }

    #[test]
    fn a_key_hashes_the_same_from_its_parts_and_as_a_whole() {
        let hasher = KeyHasher::default();
        let whole = StoreKey::new("api", "user-1");
        assert_eq!(hasher.hash_one(&whole), key_hash(&hasher, "api", "user-1"));
        assert!(whole.is("api", "user-1"));
        assert!(!whole.is("ap", "i\0user-1"));
        assert!(!whole.is("api", "user-12"));
    }

    #[test]
    fn a_key_costs_the_heap_bytes_its_string_really_allocated() {
        for len in 1..300 {
            let key = "k".repeat(len);
            let k = StoreKey::new("api", &key);
            let allocated = if k.0.is_heap_allocated() {
                k.0.capacity()
            } else {
                0
            };
            assert_eq!(k.heap_bytes(), allocated, "key of {len} bytes");
        }
    }
}
