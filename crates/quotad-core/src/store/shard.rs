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

/// How many entries an eviction looks at to choose its victim.
const EVICTION_SAMPLE: usize = 16;

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

    fn parts(&self) -> (&str, &str) {
        self.0.split_once('\0').unwrap_or((self.0.as_str(), ""))
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

/// The state of one key and when it becomes equivalent to fresh.
#[derive(Debug)]
struct Slot {
    fresh_at: u64,
    /// Always `Some` while in the table; taken only inside one transition.
    state: Option<State>,
}

#[derive(Debug)]
pub(super) struct Shard {
    map: IndexMap<StoreKey, Slot, KeyHasher>,
    /// The most keys this shard may hold; its table never grows past room
    /// for exactly this many.
    limit: usize,
    /// No entry becomes fresh before this instant (a lower bound), so a
    /// purge before it would find nothing.
    next_expiry: u64,
    /// Where the next eviction sample starts.
    cursor: usize,
}

impl Shard {
    /// An empty shard that will hold at most `limit` keys.
    pub(super) fn new(limit: usize, hasher: KeyHasher) -> Self {
        Self {
            map: IndexMap::with_hasher(hasher),
            limit,
            next_expiry: u64::MAX,
            cursor: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    /// Where the key's entry is, if it has one.
    pub(super) fn find(&self, hash: u64, name: &str, key: &str) -> Option<usize> {
        self.map
            .raw_entry_v1()
            .index_from_hash(hash, |k| k.is(name, key))
    }

    /// The state at `index`, taken out for one transition.
    pub(super) fn take(&mut self, index: usize) -> Option<State> {
        self.map
            .get_index_mut(index)
            .and_then(|(_, slot)| slot.state.take())
    }

    /// The state at `index`, to read.
    pub(super) fn state(&self, index: usize) -> Option<&State> {
        self.map
            .get_index(index)
            .and_then(|(_, slot)| slot.state.as_ref())
    }

    /// Writes `state` back at `index`, or removes the entry when `state` is
    /// fresh.
    pub(super) fn write(&mut self, index: usize, state: Option<State>, fresh_at: u64) {
        match state {
            Some(state) => {
                self.next_expiry = self.next_expiry.min(fresh_at);
                if let Some((_, slot)) = self.map.get_index_mut(index) {
                    *slot = Slot {
                        fresh_at,
                        state: Some(state),
                    };
                }
            }
            None => {
                self.map.swap_remove_index(index);
            }
        }
    }

    /// Adds a key that has no entry yet. The caller has made room.
    pub(super) fn insert(&mut self, hash: u64, name: &str, key: &str, state: State, fresh_at: u64) {
        self.grow();
        self.next_expiry = self.next_expiry.min(fresh_at);
        let slot = Slot {
            fresh_at,
            state: Some(state),
        };
        match self
            .map
            .raw_entry_mut_v1()
            .from_hash(hash, |k| k.is(name, key))
        {
            RawEntryMut::Vacant(v) => {
                v.insert_hashed_nocheck(hash, StoreKey::new(name, key), slot);
            }
            RawEntryMut::Occupied(mut o) => {
                o.insert(slot);
            }
        }
    }

    /// Makes room for one more entry: doubling, as usual, but never past
    /// `limit`, so a full shard holds no unused slots (left alone, the entry
    /// list would grow to the index table's size, up to 1.75x the keys). A
    /// table that grows with its keys also stays small, and cache-resident,
    /// when far fewer keys than `max_keys` are live.
    fn grow(&mut self) {
        let len = self.map.len();
        if len < self.map.capacity() {
            return;
        }
        let cap = self.limit.max(len + 1);
        let target = (len * 2).max(16).min(cap);
        self.map.reserve_exact(target - len);
    }

    /// Drops every entry that is fresh by `now`, if any can be. Returns how
    /// many were dropped.
    pub(super) fn purge_expired(&mut self, now: u64) -> usize {
        if now < self.next_expiry {
            return 0;
        }
        let before = self.map.len();
        let mut next = u64::MAX;
        self.map.retain(|_, slot| {
            let keep = slot.fresh_at > now;
            if keep {
                next = next.min(slot.fresh_at);
            }
            keep
        });
        self.next_expiry = next;
        before - self.map.len()
    }

    /// How many entries `protect` does not cover.
    pub(super) fn count_unprotected(&self, protect: &dyn Fn(&StoreKey) -> bool) -> usize {
        self.map.keys().filter(|k| !protect(k)).count()
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
                (!protect(key)).then_some((i, slot.fresh_at))
            })
            .take(EVICTION_SAMPLE)
            .min_by_key(|&(_, fresh_at)| fresh_at);
        self.cursor = start + EVICTION_SAMPLE;
        victim.is_some_and(|(i, _)| self.map.swap_remove_index(i).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_hashes_the_same_from_its_parts_and_as_a_whole() {
        let hasher = KeyHasher::default();
        let whole = StoreKey::new("api", "user-1");
        assert_eq!(hasher.hash_one(&whole), key_hash(&hasher, "api", "user-1"));
        assert!(whole.is("api", "user-1"));
        assert!(!whole.is("ap", "i\0user-1"));
        assert!(!whole.is("api", "user-12"));
    }
}
