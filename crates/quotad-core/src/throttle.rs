//! A log throttle: at most one line per interval, carrying the count of the
//! events it kept quiet.
//!
//! An outage makes every call fail at once; a warning per call floods the
//! logs exactly when they are needed. [`Throttle::record`] says whether this
//! event gets a line and, if so, how many were suppressed since the last one.
//! It reads no clock of its own: callers pass the time, so tests drive it with
//! a [`FakeClock`](crate::FakeClock).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Lets one event through per interval and counts the rest.
///
/// ```
/// use std::time::Duration;
/// use quotad_core::Throttle;
///
/// let throttle = Throttle::new(Duration::from_secs(10));
/// assert_eq!(throttle.record(1_000), Some(0)); // the first event is logged
/// assert_eq!(throttle.record(2_000), None); // then quiet for 10 s
/// assert_eq!(throttle.record(3_000), None);
/// assert_eq!(throttle.record(11_000), Some(2)); // and the count of the quiet ones
/// ```
#[derive(Debug)]
pub struct Throttle {
    interval_ms: u64,
    /// The first instant at which the next line may be written.
    next_ms: AtomicU64,
    suppressed: AtomicU64,
}

impl Throttle {
    /// At most one line per `interval` (whole milliseconds; zero lets every
    /// event through).
    pub fn new(interval: Duration) -> Self {
        Self {
            interval_ms: u64::try_from(interval.as_millis()).unwrap_or(u64::MAX),
            next_ms: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Records one event at `now_ms`: `Some(suppressed)` when it should be
    /// logged, with the number of events suppressed since the last logged
    /// one; `None` when it should stay quiet.
    ///
    /// Safe to call from many threads: exactly one of the events that
    /// arrive once an interval has passed is let through.
    pub fn record(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Acquire);
        if now_ms >= next
            && self
                .next_ms
                .compare_exchange(
                    next,
                    now_ms.saturating_add(self.interval_ms),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::AcqRel));
        }
        self.suppressed.fetch_add(1, Ordering::AcqRel);
        None
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{Clock, FakeClock};

    #[test]
    fn the_first_event_is_logged_and_the_next_ones_in_the_interval_are_counted() {
        let clock = FakeClock::new(1_700_000_000_000);
        let throttle = Throttle::new(Duration::from_secs(10));
        assert_eq!(throttle.record(clock.now_ms()), Some(0));
        for _ in 0..5 {
            clock.advance(Duration::from_secs(1));
            assert_eq!(throttle.record(clock.now_ms()), None);
        }
        clock.advance(Duration::from_millis(4_999));
        assert_eq!(
            throttle.record(clock.now_ms()),
            None,
            "9.999 s after the line"
        );
        clock.advance(Duration::from_millis(1));
        assert_eq!(throttle.record(clock.now_ms()), Some(6));
        assert_eq!(throttle.record(clock.now_ms()), None);
    }

    #[test]
    fn a_quiet_period_resets_the_count() {
        let clock = FakeClock::new(0);
        let throttle = Throttle::new(Duration::from_millis(100));
        assert_eq!(throttle.record(clock.now_ms()), Some(0));
        clock.advance(Duration::from_secs(60));
        assert_eq!(throttle.record(clock.now_ms()), Some(0));
    }

    #[test]
    fn a_zero_interval_logs_every_event() {
        let throttle = Throttle::new(Duration::ZERO);
        for now in [5, 5, 6] {
            assert_eq!(throttle.record(now), Some(0));
        }
    }

    #[test]
    fn concurrent_events_let_exactly_one_line_through_and_count_the_rest() {
        for _ in 0..20 {
            let throttle = Arc::new(Throttle::new(Duration::from_secs(1)));
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let throttle = Arc::clone(&throttle);
                    std::thread::spawn(move || {
                        (0..1_000)
                            .filter_map(|_| throttle.record(5_000))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            let logged: Vec<u64> = threads
                .into_iter()
                .flat_map(|t| t.join().expect("no panic"))
                .collect();
            assert_eq!(logged, vec![0], "one line in the interval");
            assert_eq!(throttle.record(6_000), Some(7_999));
        }
    }
}
