//! One shard of the key table. Its lock serializes every transition of the
//! keys that hash to it.

use compact_str::CompactString;
use indexmap::IndexMap;

use crate::algorithm::State;

/// How many entries an eviction looks at to choose its victim.
const EVICTION_SAMPLE: usize = 16;

/// The state of one key and when it becomes equivalent to fresh.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) fresh_at: u64,
    /// Always `Some` while in the table; taken only inside one transition.
    pub(super) state: Option<State>,
}

#[derive(Debug, Default)]
pub(super) struct Shard {
    pub(super) map: IndexMap<CompactString, Slot, foldhash::fast::RandomState>,
    /// No entry becomes fresh before this instant (a lower bound), so a
    /// purge before it would find nothing.
    next_expiry: u64,
    /// Where the next eviction sample starts.
    cursor: usize,
}

impl Shard {
    pub(super) fn new() -> Self {
        Self {
            next_expiry: u64::MAX,
            ..Self::default()
        }
    }

    /// Writes `state` for `key`, or removes the key when `state` is fresh.
    /// Returns the change in the number of keys: -1, 0 or +1.
    pub(super) fn put(&mut self, key: CompactString, state: Option<State>, fresh_at: u64) -> isize {
        match state {
            Some(state) => {
                self.next_expiry = self.next_expiry.min(fresh_at);
                let slot = Slot {
                    fresh_at,
                    state: Some(state),
                };
                match self.map.insert(key, slot) {
                    Some(_) => 0,
                    None => 1,
                }
            }
            None => match self.map.swap_remove(&key) {
                Some(_) => -1,
                None => 0,
            },
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

    /// Evicts the live entry closest to fresh among a sample, which for one
    /// policy is the one least recently used (the way Redis samples for
    /// LRU). Returns whether an entry was evicted.
    pub(super) fn evict_one(&mut self) -> bool {
        let len = self.map.len();
        if len == 0 {
            return false;
        }
        let start = self.cursor % len;
        let victim = (0..EVICTION_SAMPLE.min(len))
            .map(|i| (start + i) % len)
            .min_by_key(|&i| self.map.get_index(i).map_or(u64::MAX, |(_, s)| s.fresh_at))
            .unwrap_or(start);
        self.cursor = start + EVICTION_SAMPLE;
        self.map.swap_remove_index(victim).is_some()
    }
}
