//! The local deny cache: a `LIMIT_EXCEEDED` denial answered again without
//! asking quotad, for as long as it is certain to hold.
//!
//! A denial of cost `c` with retry time `r` says the budget of that key has
//! less than `c` room, and that waiting `r` with no other traffic makes room.
//! Other traffic only consumes, so until `r` has passed every check of that
//! key for a cost of `c` or more is denied too. The cache times `r` from when
//! the denied request was *sent*, before quotad decided, so its window never
//! outlasts quotad's.
//!
//! The window ends a little before quotad's ([`margin`]): the client's and
//! quotad's clocks read whole milliseconds at different phases and may run
//! at slightly different rates.
//!
//! What a cached answer *reports* is the other bound: its `retry_after_ms`
//! (and `reset_after_ms`) count from when quotad's answer *arrived*, plus
//! the margin, so it is never shorter than what quotad would answer at the
//! same instant, and a caller that waits it out (an HTTP `Retry-After`) is
//! never early. The local window is shorter than the wait it reports by
//! the round trip and two margins.
//!
//! Some things make room early, and the cache cannot see them for certain:
//! an operator's `Reset` (one made through this client drops the entry), a
//! policy reload that raises the limit or changes the window (the entry is
//! dropped when quotad next answers for the key with another limit, e.g. a
//! smaller cost that still goes to quotad), and quotad forgetting the key
//! (an eviction from a full memory store, or a restart of a memory store
//! without a snapshot). Otherwise the entry lives out its retry time, at
//! most one window.

use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use quotad_core::{Decision, Reason};

use crate::request::{Check, PolicyRef};

/// How much earlier than quotad's retry time a cached denial ends: 1 ms for
/// the two clocks reading whole milliseconds at different phases, and 1 ms
/// a second of the wait for the two clocks running at different rates (up
/// to 1,000 ppm), so the local window never outlasts quotad's.
fn margin(retry_after_ms: u64) -> u64 {
    1 + retry_after_ms / 1_000
}

/// The default number of keys the deny cache holds.
pub const DEFAULT_DENY_CACHE_CAPACITY: usize = 10_000;

/// A bounded map from (policy, key) to the denial that still holds.
#[derive(Debug)]
pub(crate) struct DenyCache {
    capacity: usize,
    hasher: std::collections::hash_map::RandomState,
    state: Mutex<State>,
    /// Bumped by every reset through the client: a denial decided before
    /// a reset is not cached after it.
    epoch: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// By hash of (policy, key); the entry keeps both, so a collision is a
    /// miss (and an overwrite), never a wrong answer.
    entries: HashMap<u64, Entry>,
    /// `(until_ms, hash)` of every entry, earliest first: expired entries
    /// leave from the front, so making room never scans the live ones.
    expiry: BTreeSet<(u64, u64)>,
    /// Index items looked at while purging, to bound the work per record.
    #[cfg(test)]
    examined: u64,
}

impl State {
    fn insert(&mut self, hash: u64, entry: Entry) {
        self.expiry.insert((entry.until_ms, hash));
        if let Some(old) = self.entries.insert(hash, entry) {
            self.expiry.remove(&(old.until_ms, hash));
        }
    }

    fn remove(&mut self, hash: u64) {
        if let Some(old) = self.entries.remove(&hash) {
            self.expiry.remove(&(old.until_ms, hash));
        }
    }

    /// Drops every entry whose window has ended by `now_ms`. Each entry
    /// leaves once, so this is amortized O(log n) a record.
    fn purge(&mut self, now_ms: u64) {
        while let Some(&(until_ms, hash)) = self.expiry.first() {
            #[cfg(test)]
            {
                self.examined += 1;
            }
            if until_ms > now_ms {
                return;
            }
            self.expiry.pop_first();
            self.entries.remove(&hash);
        }
    }
}

#[derive(Debug)]
struct Entry {
    policy: PolicyRef,
    key: String,
    /// Any cost at least this is denied...
    cost: u64,
    /// ...until this instant (client clock, from the request's send time).
    until_ms: u64,
    /// The wait reported is up to this instant (from the answer's arrival,
    /// plus the margin): never earlier than quotad's own.
    retry_until_ms: u64,
    /// When the key's state is back to fresh at the latest, per the denial
    /// (timed as `retry_until_ms`).
    reset_until_ms: u64,
    limit: u64,
    remaining: u64,
}

impl Entry {
    fn is(&self, check: &Check) -> bool {
        self.key == check.key() && &self.policy == check.policy()
    }
}

/// What the cache knows when a check is sent, to record its answer with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sent {
    at_ms: u64,
    epoch: u64,
}

impl Sent {
    /// The same, sent at `at_ms` instead (a check that left later, in a
    /// batch).
    pub(crate) fn at(self, at_ms: u64) -> Self {
        Self { at_ms, ..self }
    }
}

impl DenyCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            hasher: std::collections::hash_map::RandomState::new(),
            state: Mutex::new(State::default()),
            epoch: AtomicU64::new(0),
        }
    }

    fn hash(&self, policy: &PolicyRef, key: &str) -> u64 {
        self.hasher.hash_one((policy, key))
    }

    /// The denial `check` gets at `now_ms` without asking quotad, if one is
    /// certain.
    pub(crate) fn lookup(&self, check: &Check, now_ms: u64) -> Option<Decision> {
        let hash = self.hash(check.policy(), check.key());
        let state = self.state.lock();
        let entry = state.entries.get(&hash)?;
        // A cost above the capacity is quotad's COST_EXCEEDS_CAPACITY, which
        // no wait cures: never a cached LIMIT_EXCEEDED.
        let cost = check.cost_units();
        if !entry.is(check) || now_ms >= entry.until_ms || cost < entry.cost || cost > entry.limit {
            return None;
        }
        let retry_after_ms = entry.retry_until_ms.saturating_sub(now_ms);
        Some(Decision {
            allowed: false,
            limit: entry.limit,
            remaining: entry.remaining,
            retry_after_ms,
            reset_after_ms: entry
                .reset_until_ms
                .saturating_sub(now_ms)
                .max(retry_after_ms),
            reason: Reason::LimitExceeded,
        })
    }

    /// Marks a check as sent now.
    pub(crate) fn sent(&self, now_ms: u64) -> Sent {
        Sent {
            at_ms: now_ms,
            epoch: self.epoch.load(Ordering::Acquire),
        }
    }

    /// Learns from quotad's answer to `check`, sent at `sent` and received
    /// at `received_ms`.
    pub(crate) fn record(&self, check: &Check, decision: &Decision, sent: Sent, received_ms: u64) {
        let hash = self.hash(check.policy(), check.key());
        let mut state = self.state.lock();
        // Read under the lock that `forget` bumps it under: a reset either
        // comes before this (and the denial is dropped) or after (and the
        // entry with it).
        if sent.epoch != self.epoch.load(Ordering::Acquire) {
            return;
        }
        let margin = margin(decision.retry_after_ms);
        let hold_ms = decision.retry_after_ms.saturating_sub(margin);
        let cacheable =
            !decision.allowed && decision.reason == Reason::LimitExceeded && hold_ms > 0;
        if !cacheable {
            // quotad answering with another limit (a reload) or admitting a
            // cost the entry denies (a reset elsewhere) proves room came
            // early: the entry goes.
            let stale = state.entries.get(&hash).is_some_and(|e| {
                e.is(check)
                    && (e.limit != decision.limit
                        || (decision.allowed && check.cost_units() >= e.cost))
            });
            if stale {
                state.remove(hash);
            }
            return;
        }
        let entry = Entry {
            policy: check.policy().clone(),
            key: check.key().to_owned(),
            cost: check.cost_units(),
            until_ms: sent.at_ms.saturating_add(hold_ms),
            retry_until_ms: received_ms
                .saturating_add(decision.retry_after_ms)
                .saturating_add(margin),
            reset_until_ms: received_ms
                .saturating_add(decision.reset_after_ms)
                .saturating_add(margin),
            limit: decision.limit,
            remaining: decision.remaining,
        };
        if let Some(old) = state.entries.get(&hash)
            && old.is(check)
            && old.cost <= entry.cost
            && old.until_ms >= entry.until_ms
            && old.limit == entry.limit
        {
            // The entry already denies more, for longer.
            return;
        }
        state.purge(received_ms);
        if state.entries.len() >= self.capacity && !state.entries.contains_key(&hash) {
            // Full of live denials: keep them; this one goes uncached.
            return;
        }
        state.insert(hash, entry);
    }

    /// Drops what is known of `key` under `policy`, and every denial still
    /// in flight: its budget was reset.
    pub(crate) fn forget(&self, policy: &PolicyRef, key: &str) {
        let hash = self.hash(policy, key);
        let mut state = self.state.lock();
        self.epoch.fetch_add(1, Ordering::AcqRel);
        if state
            .entries
            .get(&hash)
            .is_some_and(|e| e.key == key && &e.policy == policy)
        {
            state.remove(hash);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let state = self.state.lock();
        assert_eq!(
            state.entries.len(),
            state.expiry.len(),
            "one index item an entry"
        );
        state.entries.len()
    }

    #[cfg(test)]
    fn examined(&self) -> u64 {
        self.state.lock().examined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial(cost_limit: u64, retry_after_ms: u64) -> Decision {
        Decision {
            allowed: false,
            limit: cost_limit,
            remaining: 0,
            retry_after_ms,
            reset_after_ms: retry_after_ms * 2,
            reason: Reason::LimitExceeded,
        }
    }

    fn allowed(limit: u64) -> Decision {
        Decision {
            allowed: true,
            limit,
            remaining: 3,
            retry_after_ms: 0,
            reset_after_ms: 1_000,
            reason: Reason::WithinLimit,
        }
    }

    #[test]
    fn a_denial_answers_larger_costs_until_its_retry_time_from_the_send_and_reports_it_from_the_arrival()
     {
        let cache = DenyCache::new(10);
        let check = Check::named("api", "k").cost(3);
        let sent = cache.sent(1_000);
        // Sent at 1,000, answered at 1,050: quotad decided in between.
        cache.record(&check, &denial(10, 500), sent, 1_050);
        let local = cache.lookup(&check, 1_200).expect("denied locally");
        // Held until 1,499 (from the send, less the clocks' 1 ms margin);
        // reported up to 1,551 (from the arrival, plus the margin).
        assert_eq!(local.retry_after_ms, 351);
        assert_eq!(local.reset_after_ms, 851);
        assert_eq!(local.reason, Reason::LimitExceeded);
        assert!(cache.lookup(&check.clone().cost(7), 1_498).is_some());
        assert!(cache.lookup(&check.clone().cost(7), 1_499).is_none());
        assert!(
            cache.lookup(&check.clone().cost(2), 1_200).is_none(),
            "smaller cost"
        );
        assert!(cache.lookup(&check, 1_500).is_none(), "retry time reached");
        assert!(
            cache.lookup(&check.clone().cost(11), 1_200).is_none(),
            "a cost above the capacity is quotad's COST_EXCEEDS_CAPACITY"
        );
        assert!(
            cache
                .lookup(&Check::named("api", "other").cost(3), 1_200)
                .is_none()
        );
        assert!(
            cache
                .lookup(&Check::named("web", "k").cost(3), 1_200)
                .is_none()
        );
    }

    #[test]
    fn only_limit_exceeded_denials_are_cached() {
        let cache = DenyCache::new(10);
        let check = Check::named("api", "k");
        for reason in [
            Reason::CostExceedsCapacity,
            Reason::Capacity,
            Reason::BatchRejected,
            Reason::FailClosed,
        ] {
            let d = Decision {
                reason,
                ..denial(10, 500)
            };
            cache.record(&check, &d, cache.sent(0), 0);
        }
        cache.record(&check, &allowed(10), cache.sent(0), 0);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn a_reset_drops_the_entry_and_denials_decided_before_it() {
        let cache = DenyCache::new(10);
        let check = Check::named("api", "k");
        let policy = check.policy().clone();
        cache.record(&check, &denial(10, 500), cache.sent(0), 0);
        let in_flight = cache.sent(10);
        cache.forget(&policy, "k");
        assert!(cache.lookup(&check, 20).is_none());
        cache.record(&check, &denial(10, 500), in_flight, 15);
        assert!(
            cache.lookup(&check, 20).is_none(),
            "decided before the reset"
        );
        cache.record(&check, &denial(10, 500), cache.sent(30), 30);
        assert!(
            cache.lookup(&check, 40).is_some(),
            "decided after the reset"
        );
    }

    #[test]
    fn another_limit_or_an_admitted_larger_cost_drops_the_entry() {
        let cache = DenyCache::new(10);
        let check = Check::named("api", "k").cost(5);
        cache.record(&check, &denial(10, 500), cache.sent(0), 0);
        cache.record(&check.clone().cost(1), &allowed(10), cache.sent(1), 1);
        assert!(
            cache.lookup(&check, 2).is_some(),
            "a smaller cost proves nothing"
        );
        cache.record(&check.clone().cost(1), &allowed(20), cache.sent(3), 3);
        assert!(cache.lookup(&check, 4).is_none(), "the limit was raised");

        cache.record(&check, &denial(10, 500), cache.sent(10), 10);
        cache.record(&check.clone().cost(6), &allowed(10), cache.sent(11), 11);
        assert!(cache.lookup(&check, 12).is_none(), "room came early");
    }

    #[test]
    fn the_cache_holds_at_most_its_capacity_and_makes_room_from_expired_entries() {
        let cache = DenyCache::new(2);
        for (key, retry) in [("a", 100), ("b", 1_000), ("c", 1_000)] {
            cache.record(
                &Check::named("api", key),
                &denial(10, retry),
                cache.sent(0),
                0,
            );
        }
        assert_eq!(cache.len(), 2);
        assert!(cache.lookup(&Check::named("api", "c"), 1).is_none(), "full");
        cache.record(
            &Check::named("api", "c"),
            &denial(10, 1_000),
            cache.sent(100),
            100,
        );
        assert_eq!(cache.len(), 2);
        assert!(cache.lookup(&Check::named("api", "a"), 100).is_none());
        assert!(cache.lookup(&Check::named("api", "b"), 100).is_some());
        assert!(cache.lookup(&Check::named("api", "c"), 100).is_some());
    }

    #[test]
    fn making_room_under_key_churn_looks_at_each_entry_about_once() {
        // Full of denials that end one a millisecond apart, then a new key
        // denied every millisecond: each new denial finds one expired entry
        // to replace, and must not look at the live ones to find it.
        const CAPACITY: u64 = 1_000;
        let cache = DenyCache::new(CAPACITY as usize);
        for i in 0..CAPACITY {
            let check = Check::named("api", format!("old{i}"));
            // Held until 10 + i (the retry less the 1 ms margin).
            cache.record(&check, &denial(10, 11 + i), cache.sent(0), 0);
        }
        assert_eq!(cache.len(), CAPACITY as usize);
        for j in 0..CAPACITY {
            let now = 10 + j;
            let check = Check::named("api", format!("new{j}"));
            cache.record(&check, &denial(10, 100_000), cache.sent(now), now);
            assert!(cache.lookup(&check, now).is_some(), "room was made");
            assert!(
                cache
                    .lookup(&Check::named("api", format!("old{j}")), now)
                    .is_none()
            );
        }
        assert_eq!(cache.len(), CAPACITY as usize);
        let records = 2 * CAPACITY;
        assert!(
            cache.examined() <= 2 * records,
            "{} index items looked at for {records} records",
            cache.examined()
        );
    }

    #[test]
    fn an_overwritten_or_dropped_entry_leaves_the_expiry_index_too() {
        let cache = DenyCache::new(2);
        let check = Check::named("api", "k");
        cache.record(&check, &denial(10, 100), cache.sent(0), 0);
        // A longer denial of the same key replaces the entry and its index
        // item: when the first window ends the key is still denied.
        cache.record(&check, &denial(10, 1_000), cache.sent(1), 1);
        assert_eq!(cache.len(), 1);
        cache.record(
            &Check::named("api", "other"),
            &denial(10, 1_000),
            cache.sent(200),
            200,
        );
        assert!(cache.lookup(&check, 200).is_some());
        cache.forget(check.policy(), "k");
        assert_eq!(cache.len(), 1);
        // The slot the reset freed takes a new key at once.
        cache.record(
            &Check::named("api", "third"),
            &denial(10, 1_000),
            cache.sent(201),
            201,
        );
        assert!(cache.lookup(&Check::named("api", "third"), 201).is_some());
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn a_weaker_denial_does_not_replace_a_stronger_one() {
        let cache = DenyCache::new(10);
        let check = Check::named("api", "k");
        cache.record(&check, &denial(10, 1_000), cache.sent(0), 0);
        cache.record(&check.clone().cost(4), &denial(10, 100), cache.sent(0), 0);
        assert_eq!(
            cache.lookup(&check, 500).map(|d| d.retry_after_ms),
            Some(500 + margin(1_000))
        );
    }

    #[test]
    fn long_waits_end_earlier_by_a_rate_margin_and_tiny_ones_are_not_cached() {
        assert_eq!(margin(1), 1);
        assert_eq!(margin(999), 1);
        assert_eq!(margin(60_000), 61);
        assert_eq!(margin(86_400_000), 86_401);
        let cache = DenyCache::new(10);
        let check = Check::named("api", "k");
        cache.record(&check, &denial(10, 1), cache.sent(0), 0);
        assert!(cache.lookup(&check, 0).is_none(), "1 ms is all margin");
        cache.record(&check, &denial(10, 60_000), cache.sent(0), 0);
        assert!(cache.lookup(&check, 59_938).is_some());
        assert!(cache.lookup(&check, 59_939).is_none());
    }
}
