//! Time sources. Every decision reads the clock once and passes the instant
//! down, so algorithms stay pure and tests drive time by hand.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in whole milliseconds since the Unix epoch.
///
/// Windows are aligned to the epoch, so every node that agrees on the time
/// agrees on where a window starts.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The operating system's real-time clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A clock set before 1970 reads as the epoch; the algorithms treat a
        // clock that goes backwards as standing still, so this never refunds.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that never steps back: the wall-clock time when it was made,
/// plus the time a monotonic clock has measured since. For what must not
/// stretch or stop when the system clock is set (timers, log throttles,
/// a client's cached denials); decisions use the wall clock, since windows
/// are aligned to it.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin: std::time::Instant,
    origin_ms: u64,
}

impl MonotonicClock {
    /// A clock that reads the wall-clock time now and moves on monotonically.
    pub fn new() -> Self {
        Self {
            origin: std::time::Instant::now(),
            origin_ms: SystemClock.now_ms(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.origin_ms.saturating_add(elapsed)
    }
}

/// A clock that only moves when told to; for tests and simulations.
#[derive(Debug, Default)]
pub struct FakeClock {
    now_ms: AtomicU64,
}

impl FakeClock {
    /// A clock that reads `now_ms` until moved.
    pub fn new(now_ms: u64) -> Self {
        Self {
            now_ms: AtomicU64::new(now_ms),
        }
    }

    /// Moves the clock forward by `by` (whole milliseconds; sub-millisecond
    /// parts are dropped).
    pub fn advance(&self, by: Duration) {
        let ms = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock to `now_ms`, forwards or backwards.
    pub fn set(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_clock_moves_only_when_told() {
        let clock = FakeClock::new(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        clock.advance(Duration::from_millis(250));
        assert_eq!(clock.now_ms(), 1_250);
        clock.set(10);
        assert_eq!(clock.now_ms(), 10);
    }

    #[test]
    fn system_clock_reads_a_time_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }
}
