//! Sliding log: the time of every admission within the last window, with a
//! running total. Exact: no window-long interval ever holds more than
//! `limit`. Memory is one 16-byte entry per distinct admission millisecond,
//! at most `limit` entries (capped by [`crate::SLIDING_LOG_MAX_LIMIT`]).
//!
//! Each entry keeps the running total of units admitted up to and including
//! it, rather than its own cost, so the units within the log, and those of
//! any prefix, are one subtraction; the exact retry time is then a search
//! for the first prefix whose leaving makes room. Both that search and the
//! one for expired entries gallop from the front: a check costs O(log n) at
//! most, and O(1) amortized.

use std::collections::VecDeque;

use super::{Meter, State};
use crate::grant::Grant;
use crate::policy::Policy;

/// A log never keeps room for fewer entries than this, so a key admitted
/// a few times does not reallocate on each admission.
const MIN_CAPACITY: usize = 4;

/// The admissions of one key within the last window, oldest first.
#[derive(Clone, Debug, Default)]
pub struct Log {
    /// `(admitted at ms, running total)`, one entry per distinct
    /// millisecond, in increasing time. The running total counts every unit
    /// the key was ever admitted, up to and including this entry, modulo
    /// 2^64: only differences are read, and each is at most the log's
    /// total, so wrapping never changes one.
    entries: VecDeque<(u64, u64)>,
    /// The running total before the oldest entry: units that have left.
    base: u64,
}

impl Log {
    /// The instant of the latest admission.
    pub fn last_ms(&self) -> Option<u64> {
        self.entries.back().map(|&(ms, _)| ms)
    }

    /// Units admitted within the log.
    pub fn total(&self) -> u64 {
        self.entries
            .back()
            .map_or(0, |&(_, sum)| sum.wrapping_sub(self.base))
    }

    /// Number of entries kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Heap bytes the log holds: itself (it lives in a `Box`) and its
    /// entries' allocation, by capacity.
    pub fn heap_bytes(&self) -> usize {
        size_of::<Log>() + self.entries.capacity() * size_of::<(u64, u64)>()
    }

    /// `(admitted at ms, units)` for each entry, oldest first.
    pub fn admissions(&self) -> impl ExactSizeIterator<Item = (u64, u64)> + '_ {
        let mut before = self.base;
        self.entries.iter().map(move |&(ms, sum)| {
            let cost = sum.wrapping_sub(before);
            before = sum;
            (ms, cost)
        })
    }

    /// A log of `(admitted at ms, units)` entries, oldest first. The caller
    /// guarantees strictly increasing instants and non-zero units.
    #[cfg(feature = "snapshot")]
    pub(crate) fn from_admissions(admissions: impl ExactSizeIterator<Item = (u64, u64)>) -> Self {
        let mut entries = VecDeque::with_capacity(admissions.len());
        let mut sum = 0u64;
        for (ms, units) in admissions {
            sum = sum.wrapping_add(units);
            entries.push_back((ms, sum));
        }
        Log { entries, base: 0 }
    }

    /// The first entry whose leaving frees at least `excess` units.
    #[cold]
    #[inline(never)]
    fn first_freeing(&self, excess: u64) -> Option<&(u64, u64)> {
        let base = self.base;
        let n = self.leading(|&(_, sum)| sum.wrapping_sub(base) < excess);
        self.entries.get(n)
    }

    /// The number of leading entries `pred` holds for, given that it holds
    /// for a prefix of the log: galloping from the front, then a binary
    /// search, so an answer of `k` costs O(log k) steps. The common answers
    /// (nothing or one entry expired; the oldest entry frees enough) cost
    /// one or two.
    fn leading(&self, pred: impl Fn(&(u64, u64)) -> bool) -> usize {
        let len = self.entries.len();
        // `pred` holds below `lo`; the answer is in `lo..=hi`.
        let (mut lo, mut hi, mut step) = (0, len, 1);
        while lo < len {
            let probe = (lo + step - 1).min(len - 1);
            if !pred(&self.entries[probe]) {
                hi = probe;
                break;
            }
            lo = probe + 1;
            step *= 2;
        }
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if pred(&self.entries[mid]) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Drops the entries that admitted at or before `last` (a prefix of the
    /// log).
    #[inline]
    fn expire(&mut self, last: u64) {
        let gone = |i: usize| self.entries.get(i).is_some_and(|&(ms, _)| ms <= last);
        // Nothing or one entry expires on most checks: no search for those.
        match (gone(0), gone(1)) {
            (false, _) => {}
            (true, false) => {
                if let Some((_, sum)) = self.entries.pop_front() {
                    self.base = sum;
                }
                self.give_back();
            }
            (true, true) => self.expire_many(last),
        }
    }

    /// [`Log::expire`] when more than one entry goes.
    #[cold]
    #[inline(never)]
    fn expire_many(&mut self, last: u64) {
        let n = self.leading(|&(ms, _)| ms <= last);
        self.base = self.entries[n - 1].1;
        // Entries are plain integers: dropping a prefix moves no element.
        self.entries.drain(..n);
        self.give_back();
    }

    /// Gives back most of an allocation that a burst grew, so that an idle
    /// key does not keep room for a full log; amortized, as growing is.
    #[inline]
    fn give_back(&mut self) {
        let capacity = self.entries.capacity();
        if capacity > MIN_CAPACITY && self.entries.len() < capacity / 4 {
            self.entries
                .shrink_to((self.entries.len() * 2).max(MIN_CAPACITY));
        }
    }

    /// The capacity a push would leave the log with: doubling, as usual,
    /// but never past `limit` entries, which no log under that limit
    /// outgrows (each entry holds at least one unit).
    fn capacity_after_push(&self, limit: u64) -> usize {
        let len = self.entries.len();
        let capacity = self.entries.capacity();
        if len < capacity {
            return capacity;
        }
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        (capacity * 2).max(MIN_CAPACITY).min(limit).max(len + 1)
    }
}

/// Two logs are equal when they hold the same admissions, whatever their
/// running totals started from.
impl PartialEq for Log {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.admissions().eq(other.admissions())
    }
}

impl Eq for Log {}

pub(super) struct SlidingLog {
    limit: u64,
    window: u64,
    at: u64,
    /// The log's total, kept here so a check reads it once.
    total: u64,
    log: Box<Log>,
    /// The key's leases still counted: `(counted until, units)`. A lease is
    /// one entry, counted from its grant until a window after its end, as
    /// its holder may admit with it until then.
    leased: Vec<(u64, u64)>,
    /// Their units.
    leased_total: u64,
}

impl SlidingLog {
    /// Units counted now: the log's and the leases'.
    fn counted(&self) -> u64 {
        self.total + self.leased_total
    }

    /// The wait until `excess` units have left, the log's entries and the
    /// leases' together, soonest first.
    #[cold]
    fn wait_with_leases(&self, excess: u64) -> u64 {
        let window = self.window;
        let mut leaving: Vec<(u64, u64)> = self
            .log
            .admissions()
            .map(|(ms, units)| (ms.saturating_add(window), units))
            .chain(self.leased.iter().copied())
            .collect();
        leaving.sort_unstable();
        let mut freed = 0u64;
        for (at, units) in leaving {
            freed += units;
            if freed >= excess {
                return at.saturating_sub(self.at);
            }
        }
        window
    }
}

impl Meter for SlidingLog {
    #[inline]
    fn advance(policy: &Policy, state: Option<State>, grants: &[Grant], at: u64) -> Self {
        let window = policy.window_ms();
        let mut log = match state {
            Some(State::SlidingLog { log, .. }) => log,
            _ => Box::default(),
        };
        // An admission at `ms` counts during `[ms, ms + window)`: it has
        // left once `ms + window <= at`.
        if let Some(last) = at.checked_sub(window) {
            log.expire(last);
        }
        let leased: Vec<(u64, u64)> = grants
            .iter()
            .map(|g| (g.ends_at.saturating_add(window), g.units))
            .filter(|&(until, _)| until > at)
            .collect();
        Self {
            limit: policy.limit(),
            window,
            at,
            total: log.total(),
            log,
            leased_total: leased.iter().map(|&(_, units)| units).sum(),
            leased,
        }
    }

    fn fits(&self, cost: u64) -> bool {
        self.counted() <= self.limit - cost
    }

    #[inline]
    fn consume(&mut self, cost: u64) {
        self.total += cost;
        let log = &mut *self.log;
        match log.entries.back_mut() {
            Some((ms, sum)) if *ms == self.at => *sum = sum.wrapping_add(cost),
            last => {
                let sum = last.map_or(log.base, |&mut (_, sum)| sum);
                if log.entries.len() == log.entries.capacity() {
                    let capacity = log.capacity_after_push(self.limit);
                    log.entries.reserve_exact(capacity - log.entries.len());
                }
                log.entries.push_back((self.at, sum.wrapping_add(cost)));
            }
        }
    }

    fn heap_bytes_after_consume(&self) -> usize {
        if self.log.last_ms() == Some(self.at) {
            self.log.heap_bytes()
        } else {
            size_of::<Log>() + self.log.capacity_after_push(self.limit) * size_of::<(u64, u64)>()
        }
    }

    fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.counted())
    }

    #[inline]
    fn retry_after(&self, cost: u64) -> u64 {
        if !self.leased.is_empty() {
            return self.wait_with_leases(self.counted() - (self.limit - cost));
        }
        // Wait for the oldest admissions to leave until `cost` fits: the
        // first prefix holding at least the excess (most often the oldest
        // entry alone).
        let excess = self.total - (self.limit - cost);
        let base = self.log.base;
        let frees = |&(_, sum): &(u64, u64)| sum.wrapping_sub(base) >= excess;
        let first = match self.log.entries.front() {
            Some(e) if frees(e) => Some(e),
            _ => self.log.first_freeing(excess),
        };
        match first {
            Some(&(ms, _)) => ms.saturating_add(self.window) - self.at,
            None => self.window,
        }
    }

    fn reset_after(&self) -> u64 {
        let log = self
            .log
            .last_ms()
            .map_or(self.at, |ms| ms.saturating_add(self.window));
        let leased = self
            .leased
            .iter()
            .map(|&(until, _)| until)
            .max()
            .unwrap_or(self.at);
        log.max(leased) - self.at
    }

    fn lease_end(&self) -> u64 {
        u64::MAX
    }

    fn grant(&mut self, units: u64, ends_at: u64) {
        self.leased
            .push((ends_at.saturating_add(self.window), units));
        self.leased_total += units;
    }

    fn refund(&mut self, grant: &Grant, unused: u64) -> Option<Grant> {
        let counted = (grant.ends_at.saturating_add(self.window), grant.units);
        if let Some(i) = self.leased.iter().position(|&l| l == counted) {
            self.leased.swap_remove(i);
            self.leased_total -= grant.units;
        }
        // What was spent stays counted, as admitted until now, for a window
        // (never from before the grant: a clock that stepped back).
        let spent = grant.units - unused;
        let end = self.at.max(grant.granted_at);
        (spent > 0).then(|| {
            self.leased.push((end.saturating_add(self.window), spent));
            self.leased_total += spent;
            Grant {
                units: spent,
                ends_at: end,
                ..*grant
            }
        })
    }

    fn linger(&self) -> u64 {
        self.window
    }

    fn into_state(self) -> Option<State> {
        (!self.log.is_empty()).then_some(State::SlidingLog {
            log: self.log,
            window_ms: self.window,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU64;
    use std::time::Duration;

    use super::*;
    use crate::algorithm::decide;
    use crate::policy::Algorithm;

    fn log_of(state: &Option<State>) -> &Log {
        match state {
            Some(State::SlidingLog { log, .. }) => log,
            other => panic!("not a log: {other:?}"),
        }
    }

    #[test]
    fn leading_finds_the_end_of_every_prefix() {
        for len in 0..40u64 {
            let log = Log {
                entries: (0..len).map(|i| (i, i + 1)).collect(),
                base: 0,
            };
            for k in 0..=len {
                assert_eq!(log.leading(|&(ms, _)| ms < k), k as usize, "{k} of {len}");
            }
        }
    }

    #[test]
    fn a_log_never_allocates_room_for_more_entries_than_its_limit() {
        let policy = Policy::try_new(Algorithm::SlidingLog, 1_000, Duration::from_secs(60), None)
            .expect("valid");
        let mut state = None;
        for at in 1..=1_000 {
            state = decide(&policy, state, at, NonZeroU64::MIN).0;
            let log = log_of(&state);
            assert!(log.entries.capacity() <= 1_000, "{} at {at}", log.len());
        }
        assert_eq!(log_of(&state).entries.capacity(), 1_000);
        assert_eq!(log_of(&state).heap_bytes(), size_of::<Log>() + 16_000);
    }

    #[test]
    fn a_log_gives_back_room_once_most_of_it_has_expired() {
        let policy = Policy::try_new(Algorithm::SlidingLog, 1_000, Duration::from_secs(1), None)
            .expect("valid");
        let mut state = None;
        for at in 1..=1_000 {
            state = decide(&policy, state, at, NonZeroU64::MIN).0;
        }
        // A second on, one admission every 100 ms keeps ten entries.
        for at in (2_000..4_000).step_by(100) {
            state = decide(&policy, state, at, NonZeroU64::MIN).0;
        }
        let log = log_of(&state);
        assert_eq!(log.len(), 10);
        assert!(log.entries.capacity() <= 40, "{}", log.entries.capacity());
    }

    #[test]
    fn logs_holding_the_same_admissions_are_equal_whatever_left_them() {
        let policy = Policy::try_new(Algorithm::SlidingLog, 10, Duration::from_millis(10), None)
            .expect("valid");
        let mut long = None;
        for at in [1, 2, 3, 20, 21] {
            long = decide(&policy, long, at, NonZeroU64::MIN).0;
        }
        let mut short = None;
        for at in [20, 21] {
            short = decide(&policy, short, at, NonZeroU64::MIN).0;
        }
        assert_eq!(log_of(&long), log_of(&short));
        assert_eq!(log_of(&long).total(), 2);
        assert_eq!(
            log_of(&long).admissions().collect::<Vec<_>>(),
            [(20, 1), (21, 1)]
        );
    }
}
