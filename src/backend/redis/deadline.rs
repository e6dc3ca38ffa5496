//! Deadlines in Redis's own clock, so that a script Redis runs after quotad
//! has given up on it refuses to touch state.
//!
//! quotad gives up on a call at local time `s + allowed`, where `s` is when
//! the call began and `allowed` the store's timeout or, if it ends sooner,
//! the caller's deadline (see `connection::Bound`). The script compares
//! Redis `TIME` against a deadline, so that instant must be translated into
//! Redis's clock without trusting the two clocks to agree. Each reply
//! carries the `TIME` the script read, `t`; the reply arrived at local `r`,
//! after Redis read `t`, so the true offset `redis - local` is at least
//! `t - r`. The deadline sent is `s + allowed + L - 1 ms`, where `L` is the
//! largest such lower bound over recent replies: never later, in Redis's
//! clock, than the moment quotad gives up. Any error in the estimate makes
//! a refusal earlier, never later.
//!
//! The local side is a **monotonic** clock (milliseconds since an
//! [`Instant`] taken once per process), never the wall clock: a step of the
//! quotad host's clock moves neither `s` nor `r`. Rounding is always
//! towards an earlier refusal: `r` is rounded up, `s + allowed` down, and
//! the millisecond taken off covers the script's own rounding (it compares
//! whole milliseconds of Redis's microsecond clock, so it runs until just
//! before the millisecond after the deadline).
//!
//! Bounds belong to one connection (its `Link`: a new connection starts
//! with none of the old one's), are kept per Cluster slot (nodes have
//! clocks of their own; a standalone server is slot 0) and age out after
//! [`FRESH_MS`], so a Redis clock stepped back stops counting within that
//! time. A slot with no reply yet uses the smallest bound known for any
//! slot, which starts with the `TIME` read from every primary when quotad
//! connects.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The origin of the local monotonic clock.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

fn since_origin(at: Instant) -> Duration {
    at.saturating_duration_since(origin())
}

/// `at` in local monotonic milliseconds, rounded down.
pub(super) fn floor_ms(at: Instant) -> u64 {
    u64::try_from(since_origin(at).as_millis()).unwrap_or(u64::MAX)
}

/// `at` in local monotonic milliseconds, rounded up.
pub(super) fn ceil_ms(at: Instant) -> u64 {
    let d = since_origin(at);
    let whole = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if d.subsec_nanos().is_multiple_of(1_000_000) {
        whole
    } else {
        whole.saturating_add(1)
    }
}

/// How long a bound counts: the larger of the bounds from the last two
/// periods of this length is used.
pub(super) const FRESH_MS: u64 = 5_000;

/// Lower bounds on `redis clock - local clock`, in milliseconds.
#[derive(Debug, Default)]
pub(super) struct Offsets {
    slots: Mutex<HashMap<u16, Bound>>,
}

#[derive(Clone, Copy, Debug)]
struct Bound {
    /// The largest bound seen since `since`.
    current: i64,
    /// The largest bound of the period before.
    previous: Option<i64>,
    /// Local ms when `current`'s period began.
    since: u64,
}

impl Bound {
    fn best(&self) -> i64 {
        self.previous.map_or(self.current, |p| p.max(self.current))
    }
}

impl Offsets {
    /// Records a reply: Redis read `redis_ms` before the reply arrived at
    /// local `local_ms`.
    pub(super) fn record(&self, slot: u16, redis_ms: u64, local_ms: u64) {
        let bound = clamp(i128::from(redis_ms) - i128::from(local_ms));
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        match slots.get_mut(&slot) {
            None => {
                slots.insert(
                    slot,
                    Bound {
                        current: bound,
                        previous: None,
                        since: local_ms,
                    },
                );
            }
            Some(b) if local_ms.saturating_sub(b.since) < FRESH_MS => {
                b.current = b.current.max(bound);
            }
            Some(b) => {
                let one_period = local_ms.saturating_sub(b.since) < 2 * FRESH_MS;
                b.previous = one_period.then_some(b.current);
                b.current = bound;
                b.since = local_ms;
            }
        }
    }

    /// The offset to translate a local instant for `slot`: its own recent
    /// bound, or the smallest one known; `None` before any reply at all.
    pub(super) fn lower_bound(&self, slot: u16) -> Option<i64> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        match slots.get(&slot) {
            Some(b) => Some(b.best()),
            None => slots.values().map(Bound::best).min(),
        }
    }

    /// Redis's clock at local `local_ms`, as well as quotad knows it (at
    /// most the call's round trip behind); `None` before any reply.
    pub(super) fn redis_now(&self, slot: u16, local_ms: u64) -> Option<u64> {
        let offset = self.lower_bound(slot)?;
        u64::try_from((i128::from(local_ms) + i128::from(offset)).max(0)).ok()
    }

    /// The deadline in Redis's clock for a call that quotad gives up on at
    /// local `give_up_ms`, a millisecond early for the script's rounding;
    /// `None` before any reply (the caller probes first).
    pub(super) fn deadline(&self, slot: u16, give_up_ms: u64) -> Option<u64> {
        let offset = self.lower_bound(slot)?;
        let d = i128::from(give_up_ms) + i128::from(offset) - 1;
        Some(u64::try_from(d.max(0)).unwrap_or(0))
    }
}

fn clamp(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of its hash tag, modulo
/// 16384, as Redis computes it.
pub(super) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % 16_384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_uses_the_largest_recent_lower_bound() {
        let offsets = Offsets::default();
        assert_eq!(offsets.deadline(0, 1_000), None);
        // Redis is 500 ms ahead; replies took 3 and 40 ms to arrive.
        offsets.record(0, 10_500, 10_003);
        offsets.record(0, 10_600, 10_140);
        assert_eq!(offsets.lower_bound(0), Some(497));
        // A millisecond early: the script runs while Redis's whole
        // milliseconds are at most the deadline.
        assert_eq!(offsets.deadline(0, 11_000), Some(11_496));
    }

    #[test]
    fn a_bound_ages_out_so_a_clock_stepped_back_counts_within_two_periods() {
        let offsets = Offsets::default();
        offsets.record(0, 1_000_500, 1_000_000);
        // Redis's clock steps back by 400 ms.
        offsets.record(0, 1_000_100 + FRESH_MS, 1_000_000 + FRESH_MS);
        assert_eq!(
            offsets.lower_bound(0),
            Some(500),
            "the previous period still counts"
        );
        offsets.record(0, 1_000_100 + 2 * FRESH_MS, 1_000_000 + 2 * FRESH_MS);
        assert_eq!(offsets.lower_bound(0), Some(100));
    }

    #[test]
    fn a_slot_without_replies_takes_the_smallest_bound_known() {
        let offsets = Offsets::default();
        offsets.record(1, 2_000, 1_000);
        offsets.record(2, 1_100, 1_000);
        assert_eq!(offsets.lower_bound(3), Some(100));
        assert_eq!(offsets.lower_bound(1), Some(1_000));
    }

    #[test]
    fn the_local_clock_is_monotonic_and_rounds_each_way_on_purpose() {
        let now = Instant::now();
        let later = now + Duration::from_micros(1_500);
        assert!(floor_ms(later) > floor_ms(now));
        assert!(ceil_ms(later) >= floor_ms(later));
        assert!(ceil_ms(later) - floor_ms(later) <= 1);
        // The local side never reads the wall clock: one instant, one value.
        assert_eq!(floor_ms(later), floor_ms(later));
        let exact = origin() + Duration::from_millis(7);
        assert_eq!((floor_ms(exact), ceil_ms(exact)), (7, 7));
        let inside = origin() + Duration::from_micros(7_001);
        assert_eq!((floor_ms(inside), ceil_ms(inside)), (7, 8));
    }

    #[test]
    fn slots_follow_the_hash_tag_as_redis_computes_them() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_eq!(slot(b"quotad:p|{alice}"), slot(b"alice"));
    }
}
