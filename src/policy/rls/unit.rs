//! The time units of RLS limits and their windows.

use std::fmt;
use std::time::Duration;

/// The unit of an RLS limit: its window, aligned to the Unix epoch.
///
/// The lengths are envoyproxy/ratelimit's: a month is 30 days and a year
/// 365 days, counted from the epoch, not calendar months or years. Its
/// windows start at `now - now % length` (in whole seconds there, in
/// milliseconds here), which is how quotad-core aligns every window, so the
/// windows are the same instants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// 1 second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The window length in seconds.
    pub fn seconds(self) -> u64 {
        const DAY: u64 = 86_400;
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        }
    }

    /// The window length.
    pub fn window(self) -> Duration {
        Duration::from_secs(self.seconds())
    }

    /// The window length in milliseconds.
    pub fn window_ms(self) -> u64 {
        self.seconds() * 1_000
    }

    /// The lowercase name used in YAML files and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Parses a YAML `unit`, case-insensitively as the reference does
    /// (`second`, `SECOND`, `Second`).
    pub fn from_name(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.as_str().eq_ignore_ascii_case(name))
    }

    /// The unit with this number in Envoy's protos
    /// (`RateLimitResponse.RateLimit.Unit`; `RateLimitUnit` numbers the
    /// same units alike and has no week): 1 second, 2 minute, 3 hour,
    /// 4 day, 5 month, 6 year, 7 week. `None` for 0 (`UNKNOWN`) and numbers
    /// Envoy does not define.
    pub fn from_number(number: i32) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.number() == number)
    }

    /// The number of this unit in Envoy's protos.
    pub fn number(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// Milliseconds from `now_ms` to the end of the window holding it.
    ///
    /// The reference reports `duration_until_reset` in whole seconds,
    /// `length - now_s % length`, which is this figure rounded up to the
    /// second.
    pub fn until_window_end_ms(self, now_ms: u64) -> u64 {
        let window = self.window_ms();
        window - now_ms % window
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_the_references() {
        let lengths: Vec<u64> = Unit::ALL.iter().map(|u| u.seconds()).collect();
        assert_eq!(
            lengths,
            [1, 60, 3_600, 86_400, 604_800, 2_592_000, 31_536_000]
        );
        assert_eq!(Unit::Year.window_ms(), 31_536_000_000);
        assert_eq!(Unit::Month.window(), Duration::from_secs(2_592_000));
    }

    #[test]
    fn names_parse_case_insensitively_and_round_trip() {
        for unit in Unit::ALL {
            assert_eq!(Unit::from_name(unit.as_str()), Some(unit));
            assert_eq!(Unit::from_name(&unit.as_str().to_uppercase()), Some(unit));
        }
        assert_eq!(Unit::from_name("Minute"), Some(Unit::Minute));
        for bad in ["", "unknown", "UNKNOWN", "seconds", "fortnight"] {
            assert_eq!(Unit::from_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn numbers_are_envoys() {
        for unit in Unit::ALL {
            assert_eq!(Unit::from_number(unit.number()), Some(unit));
        }
        assert_eq!(Unit::from_number(7), Some(Unit::Week));
        assert_eq!(Unit::from_number(5), Some(Unit::Month));
        for bad in [0, 8, -1, i32::MAX] {
            assert_eq!(Unit::from_number(bad), None, "{bad}");
        }
    }

    #[test]
    fn windows_are_epoch_aligned_like_the_references() {
        // The reference's window start is (now_s / length) * length.
        let now_ms: u64 = 1_700_000_123_456;
        for unit in Unit::ALL {
            let now_s = now_ms / 1_000;
            let start_s = now_s / unit.seconds() * unit.seconds();
            let end_ms = (start_s + unit.seconds()) * 1_000;
            assert_eq!(now_ms + unit.until_window_end_ms(now_ms), end_ms, "{unit}");
        }
        assert_eq!(Unit::Minute.until_window_end_ms(120_000), 60_000);
        assert_eq!(Unit::Minute.until_window_end_ms(179_999), 1);
    }
}
