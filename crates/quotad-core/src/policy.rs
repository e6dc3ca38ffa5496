//! Validated rate-limit policies. A [`Policy`] that exists is valid: every
//! rule is checked once, in [`Policy::try_new`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use thiserror::Error;

use crate::calendar::Calendar;

/// The largest value every intermediate product may reach: 2^53. Below it,
/// integers are exact in an IEEE double, so a Lua script (Redis) computes
/// the same numbers as this crate.
pub const MAX_EXACT: u64 = 1 << 53;

/// The largest `limit` a [`Algorithm::SlidingLog`] policy may have. The log
/// keeps one entry per admitted request, so this caps memory per key.
pub const SLIDING_LOG_MAX_LIMIT: u64 = 10_000;

/// The largest `limit` a [`Algorithm::Concurrency`] policy may have. Each
/// slot held is one grant in the key's ledger and a slot holds at least one
/// unit, so this caps a key's slots, and its memory (32 bytes a slot), as
/// the sliding log's cap does its entries.
pub const CONCURRENCY_MAX_LIMIT: u64 = 10_000;

/// The longest `slot_ttl`: a holder that dies strands its slot at most this
/// long.
pub const MAX_SLOT_TTL: Duration = Duration::from_secs(86_400);

/// How a policy counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum Algorithm {
    /// A counter per epoch-aligned window. Cheap; allows up to 2x the limit
    /// across a window boundary.
    FixedWindow,
    /// The previous window's count weighted by its overlap, plus the current
    /// count. Smooths the boundary burst; an approximation.
    SlidingWindow,
    /// A bucket of `burst` tokens refilled at `limit` per window.
    TokenBucket,
    /// A bucket of capacity `burst` drained at `limit` per window; requests
    /// that would overflow it are rejected, never queued.
    LeakyBucket,
    /// Every admitted request's time, kept for one window. Exact; memory
    /// grows with the limit.
    SlidingLog,
    /// At most `limit` units in flight at once: each admission is a slot
    /// held until it is released or its `slot_ttl` passes unrenewed. Not a
    /// rate: acquired, renewed and released, never checked.
    Concurrency,
}

impl Algorithm {
    /// Every algorithm, in declaration order: `Algorithm::ALL[a as usize] == a`.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::SlidingLog,
        Algorithm::Concurrency,
    ];

    /// The five rate algorithms, those a check counts with: every one but
    /// [`Algorithm::Concurrency`].
    pub const RATES: [Algorithm; 5] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
        Algorithm::SlidingLog,
    ];

    /// The snake_case name used in config files and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// Whether the algorithm is a rate (checked) rather than a concurrency
    /// limit (acquired).
    pub fn is_rate(self) -> bool {
        self != Algorithm::Concurrency
    }

    /// Whether the algorithm is a bucket, whose capacity is `burst`.
    pub fn is_bucket(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::LeakyBucket)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name given is not an algorithm.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error(
    "unknown algorithm {0:?} (expected fixed_window, sliding_window, token_bucket, leaky_bucket, sliding_log or concurrency)"
)]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    /// Parses the snake_case name, case-insensitively (`FIXED_WINDOW` too).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownAlgorithm(s.to_owned()))
    }
}

/// One broken rule of a policy.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PolicyError {
    /// `limit` is zero.
    #[error("limit must be at least 1")]
    LimitZero,
    /// `window` is shorter than a millisecond.
    #[error("window must be at least 1 ms")]
    WindowTooShort,
    /// `window` has a sub-millisecond part.
    #[error("window must be a whole number of milliseconds (got {0:?})")]
    WindowNotWholeMillis(Duration),
    /// `burst` is zero.
    #[error("burst must be at least 1")]
    BurstZero,
    /// `burst` was given for an algorithm that has no bucket.
    #[error("burst applies only to token_bucket and leaky_bucket, not {0}")]
    BurstNotApplicable(Algorithm),
    /// `limit * window_ms` exceeds 2^53 (for a fixed window: `limit` or
    /// `window_ms` does).
    #[error("{}", limit_window_message(*limit, *window_ms))]
    LimitWindowTooLarge {
        /// The limit given.
        limit: u64,
        /// The window given, in milliseconds.
        window_ms: u64,
    },
    /// `burst * window_ms` exceeds 2^53.
    #[error("burst x window_ms must be at most 2^53 (burst {burst}, window {window_ms} ms)")]
    BurstWindowTooLarge {
        /// The burst given.
        burst: u64,
        /// The window given, in milliseconds.
        window_ms: u64,
    },
    /// A sliding log's limit is above [`SLIDING_LOG_MAX_LIMIT`].
    #[error("sliding_log limit must be at most {SLIDING_LOG_MAX_LIMIT} (got {0})")]
    SlidingLogLimitTooLarge(u64),
    /// A concurrency policy's limit is above [`CONCURRENCY_MAX_LIMIT`].
    #[error("concurrency limit must be at most {CONCURRENCY_MAX_LIMIT} (got {0})")]
    ConcurrencyLimitTooLarge(u64),
    /// A concurrency policy's `slot_ttl` is not from 1 ms to 1 day in whole
    /// milliseconds.
    #[error("slot_ttl must be from 1ms to 1d in whole milliseconds (got {0:?})")]
    SlotTtl(Duration),
    /// A calendar period was given for an algorithm that does not count in
    /// windows of a calendar: only a fixed window does (a sliding window
    /// would weigh a previous period of another length; buckets and logs
    /// have no periods).
    #[error("period applies only to fixed_window, not {0}")]
    PeriodNotApplicable(Algorithm),
}

/// A validated rate limit: `limit` units per `window`, counted by
/// `algorithm`, with bucket capacity `burst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    algorithm: Algorithm,
    limit: u64,
    window_ms: u64,
    burst: u64,
    /// Windows are this calendar's local periods instead of epoch-aligned
    /// `window_ms`.
    calendar: Option<Calendar>,
}

/// The message of [`PolicyError::LimitWindowTooLarge`]: a fixed window
/// can only break the bound with one of its two numbers.
fn limit_window_message(limit: u64, window_ms: u64) -> String {
    if limit > MAX_EXACT || window_ms > MAX_EXACT {
        format!(
            "limit and window_ms must each be at most 2^53 (limit {limit}, window {window_ms} ms)"
        )
    } else {
        format!(
            "limit x window_ms must be at most 2^53 for this algorithm (limit {limit}, window {window_ms} ms); a fixed_window has no such bound"
        )
    }
}

impl Policy {
    /// Builds a policy, checking every rule.
    ///
    /// `burst` is the bucket capacity for [`Algorithm::TokenBucket`] and
    /// [`Algorithm::LeakyBucket`] and defaults to `limit`; the other
    /// algorithms take none.
    ///
    /// # Errors
    ///
    /// One [`PolicyError`] variant per broken rule: `limit >= 1`, a window of
    /// at least 1 ms in whole milliseconds, `burst >= 1` and only for
    /// buckets, `limit * window_ms <= 2^53` (for a fixed window, which only
    /// adds: `limit <= 2^53` and `window_ms <= 2^53`), `burst * window_ms <=
    /// 2^53`, and a sliding log's `limit <= 10,000`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use quotad_core::{Algorithm, Policy};
    ///
    /// let policy = Policy::try_new(Algorithm::TokenBucket, 10, Duration::from_secs(1), Some(20))?;
    /// assert_eq!(policy.capacity(), 20);
    /// assert!(Policy::try_new(Algorithm::FixedWindow, 0, Duration::from_secs(1), None).is_err());
    /// # Ok::<(), quotad_core::PolicyError>(())
    /// ```
    pub fn try_new(
        algorithm: Algorithm,
        limit: u64,
        window: Duration,
        burst: Option<u64>,
    ) -> Result<Self, PolicyError> {
        if algorithm == Algorithm::Concurrency {
            if burst.is_some() {
                return Err(PolicyError::BurstNotApplicable(algorithm));
            }
            return Self::concurrency(limit, window);
        }
        if limit == 0 {
            return Err(PolicyError::LimitZero);
        }
        if window < Duration::from_millis(1) {
            return Err(PolicyError::WindowTooShort);
        }
        if !window.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(PolicyError::WindowNotWholeMillis(window));
        }
        // Saturating: a window beyond u64 milliseconds fails the bound below.
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        // A fixed window only adds costs up to its limit and its window to
        // the time; the other algorithms multiply the two.
        let too_large = if algorithm == Algorithm::FixedWindow {
            limit > MAX_EXACT || window_ms > MAX_EXACT
        } else {
            limit > MAX_EXACT / window_ms
        };
        if too_large {
            return Err(PolicyError::LimitWindowTooLarge { limit, window_ms });
        }
        let burst = match burst {
            None => limit,
            Some(_) if !algorithm.is_bucket() => {
                return Err(PolicyError::BurstNotApplicable(algorithm));
            }
            Some(0) => return Err(PolicyError::BurstZero),
            Some(burst) if burst > MAX_EXACT / window_ms => {
                return Err(PolicyError::BurstWindowTooLarge { burst, window_ms });
            }
            Some(burst) => burst,
        };
        if algorithm == Algorithm::SlidingLog && limit > SLIDING_LOG_MAX_LIMIT {
            return Err(PolicyError::SlidingLogLimitTooLarge(limit));
        }
        Ok(Self {
            algorithm,
            limit,
            window_ms,
            burst,
            calendar: None,
        })
    }

    /// A policy of `limit` units per local period of `calendar` (a day,
    /// week, month or year in a time zone): its windows start at local
    /// midnight and last as long as the period does. Its
    /// [`Policy::window_ms`] is the period's longest length in whole days
    /// ([`crate::calendar::Period::nominal_ms`]), for limits and displays.
    ///
    /// # Errors
    ///
    /// [`PolicyError::PeriodNotApplicable`] for any algorithm but
    /// [`Algorithm::FixedWindow`]; [`PolicyError::LimitZero`] and
    /// [`PolicyError::LimitWindowTooLarge`] as [`Policy::try_new`] has them.
    ///
    /// ```
    /// use quotad_core::{Algorithm, Calendar, Period, Policy, Zone};
    ///
    /// let month = Calendar::new(Period::Month, Zone::named("Europe/Berlin")?);
    /// let policy = Policy::calendar(Algorithm::FixedWindow, 100_000, month)?;
    /// assert_eq!(policy.calendar_period(), Some(month));
    /// assert!(Policy::calendar(Algorithm::SlidingWindow, 10, month).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn calendar(
        algorithm: Algorithm,
        limit: u64,
        calendar: Calendar,
    ) -> Result<Self, PolicyError> {
        if algorithm != Algorithm::FixedWindow {
            return Err(PolicyError::PeriodNotApplicable(algorithm));
        }
        let window = Duration::from_millis(calendar.period().nominal_ms());
        let mut policy = Self::try_new(algorithm, limit, window, None)?;
        policy.calendar = Some(calendar);
        Ok(policy)
    }

    /// The calendar whose local periods are the windows, if any.
    pub fn calendar_period(&self) -> Option<Calendar> {
        self.calendar
    }

    /// The window holding the instant `at_ms`: `(start, end)` in ms, with
    /// `start <= at_ms < end`; the local period of the calendar, or the
    /// epoch-aligned window.
    pub fn window_bounds(&self, at_ms: u64) -> (u64, u64) {
        match &self.calendar {
            Some(calendar) => calendar.bounds(at_ms),
            None => {
                let start = at_ms - at_ms % self.window_ms;
                (start, start.saturating_add(self.window_ms))
            }
        }
    }

    /// A concurrency limit: at most `limit` units held at once, each slot
    /// lasting `slot_ttl` unless renewed. ([`Policy::try_new`] with
    /// [`Algorithm::Concurrency`] takes `slot_ttl` as its window.)
    ///
    /// # Errors
    ///
    /// [`PolicyError::LimitZero`], [`PolicyError::ConcurrencyLimitTooLarge`]
    /// (above 10,000), or [`PolicyError::SlotTtl`] for a `slot_ttl` that is
    /// 0, above a day, or not whole milliseconds.
    ///
    /// ```
    /// use std::time::Duration;
    /// use quotad_core::{Algorithm, Policy};
    ///
    /// let policy = Policy::concurrency(5, Duration::from_secs(30))?;
    /// assert_eq!((policy.algorithm(), policy.capacity(), policy.slot_ttl_ms()), (Algorithm::Concurrency, 5, 30_000));
    /// assert!(Policy::concurrency(5, Duration::ZERO).is_err());
    /// # Ok::<(), quotad_core::PolicyError>(())
    /// ```
    pub fn concurrency(limit: u64, slot_ttl: Duration) -> Result<Self, PolicyError> {
        if limit == 0 {
            return Err(PolicyError::LimitZero);
        }
        if limit > CONCURRENCY_MAX_LIMIT {
            return Err(PolicyError::ConcurrencyLimitTooLarge(limit));
        }
        if slot_ttl < Duration::from_millis(1)
            || slot_ttl > MAX_SLOT_TTL
            || !slot_ttl.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(PolicyError::SlotTtl(slot_ttl));
        }
        let slot_ttl_ms = u64::try_from(slot_ttl.as_millis()).expect("at most a day of ms");
        Ok(Self {
            algorithm: Algorithm::Concurrency,
            limit,
            window_ms: slot_ttl_ms,
            burst: limit,
            calendar: None,
        })
    }

    /// How long a concurrency slot lasts unrenewed, in ms (the policy's
    /// window; for a rate, its window).
    pub fn slot_ttl_ms(&self) -> u64 {
        self.window_ms
    }

    /// The window a key's grants are bound to: a ledger counts only under
    /// the algorithm and this window. A concurrency slot carries its own
    /// end, so its ledger is bound to no window (0) and a reload that
    /// changes `slot_ttl` keeps the slots held. A calendar policy's is its
    /// calendar's [`Calendar::binding`]: state counted in another zone or
    /// period is fresh. State is bound to the same number.
    pub fn ledger_window_ms(&self) -> u64 {
        if self.algorithm == Algorithm::Concurrency {
            0
        } else if let Some(calendar) = &self.calendar {
            calendar.binding()
        } else {
            self.window_ms
        }
    }

    /// The counting algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Units admitted per window (the refill or drain rate for buckets).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window length in milliseconds.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// The bucket capacity; equal to `limit` for the other algorithms.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The largest cost that can ever be admitted at once: `burst` for
    /// buckets, `limit` otherwise.
    pub fn capacity(&self) -> u64 {
        if self.algorithm.is_bucket() {
            self.burst
        } else {
            self.limit
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn rejects_a_zero_limit() {
        let err = Policy::try_new(Algorithm::FixedWindow, 0, ms(1000), None);
        assert_eq!(err, Err(PolicyError::LimitZero));
    }

    #[test]
    fn rejects_a_window_shorter_than_a_millisecond() {
        for window in [Duration::ZERO, Duration::from_micros(999)] {
            let err = Policy::try_new(Algorithm::FixedWindow, 1, window, None);
            assert_eq!(err, Err(PolicyError::WindowTooShort));
        }
    }

    #[test]
    fn rejects_a_window_with_a_sub_millisecond_part() {
        let window = Duration::from_micros(1500);
        let err = Policy::try_new(Algorithm::FixedWindow, 1, window, None);
        assert_eq!(err, Err(PolicyError::WindowNotWholeMillis(window)));
    }

    #[test]
    fn rejects_a_zero_burst() {
        let err = Policy::try_new(Algorithm::TokenBucket, 1, ms(1000), Some(0));
        assert_eq!(err, Err(PolicyError::BurstZero));
    }

    #[test]
    fn rejects_burst_on_algorithms_without_a_bucket() {
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
        ] {
            let err = Policy::try_new(algorithm, 5, ms(1000), Some(5));
            assert_eq!(err, Err(PolicyError::BurstNotApplicable(algorithm)));
        }
    }

    #[test]
    fn limit_times_window_may_reach_but_not_pass_2_pow_53() {
        let window_ms = 1_000;
        let max = MAX_EXACT / window_ms;
        for algorithm in [
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
            Algorithm::LeakyBucket,
        ] {
            assert!(Policy::try_new(algorithm, max, ms(window_ms), None).is_ok());
            let err = Policy::try_new(algorithm, max + 1, ms(window_ms), None);
            assert_eq!(
                err,
                Err(PolicyError::LimitWindowTooLarge {
                    limit: max + 1,
                    window_ms
                })
            );
            assert!(
                err.expect_err("refused")
                    .to_string()
                    .contains("a fixed_window has no such bound")
            );
        }
    }

    #[test]
    fn a_fixed_window_bounds_its_limit_and_window_each_by_2_pow_53() {
        let year_ms = 365 * 86_400_000;
        for (limit, window_ms) in [(MAX_EXACT, year_ms), (1, MAX_EXACT), (MAX_EXACT, MAX_EXACT)] {
            let policy = Policy::try_new(Algorithm::FixedWindow, limit, ms(window_ms), None);
            assert_eq!(policy.map(|p| p.capacity()), Ok(limit));
        }
        for (limit, window_ms) in [(MAX_EXACT + 1, 1_000), (1, MAX_EXACT + 1)] {
            let err = Policy::try_new(Algorithm::FixedWindow, limit, ms(window_ms), None);
            assert_eq!(
                err,
                Err(PolicyError::LimitWindowTooLarge { limit, window_ms })
            );
            assert!(
                err.expect_err("refused")
                    .to_string()
                    .starts_with("limit and window_ms must each be at most 2^53")
            );
        }
    }

    #[test]
    fn the_bound_is_checked_by_division_so_huge_values_cannot_wrap() {
        let err = Policy::try_new(Algorithm::FixedWindow, u64::MAX, ms(u64::MAX), None);
        assert!(matches!(err, Err(PolicyError::LimitWindowTooLarge { .. })));
        let huge = Duration::from_secs(u64::MAX);
        let err = Policy::try_new(Algorithm::FixedWindow, 1, huge, None);
        assert!(matches!(err, Err(PolicyError::LimitWindowTooLarge { .. })));
    }

    #[test]
    fn burst_times_window_may_not_pass_2_pow_53() {
        let err = Policy::try_new(Algorithm::LeakyBucket, 1, ms(2), Some(MAX_EXACT / 2 + 1));
        assert_eq!(
            err,
            Err(PolicyError::BurstWindowTooLarge {
                burst: MAX_EXACT / 2 + 1,
                window_ms: 2
            })
        );
    }

    #[test]
    fn sliding_log_limit_is_capped() {
        let at_cap = Policy::try_new(Algorithm::SlidingLog, SLIDING_LOG_MAX_LIMIT, ms(1000), None);
        assert!(at_cap.is_ok());
        let err = Policy::try_new(
            Algorithm::SlidingLog,
            SLIDING_LOG_MAX_LIMIT + 1,
            ms(1000),
            None,
        );
        assert_eq!(
            err,
            Err(PolicyError::SlidingLogLimitTooLarge(
                SLIDING_LOG_MAX_LIMIT + 1
            ))
        );
    }

    #[test]
    fn a_concurrency_policy_names_the_rule_it_breaks() {
        let c = Policy::concurrency;
        assert_eq!(c(0, ms(1000)), Err(PolicyError::LimitZero));
        assert_eq!(
            c(CONCURRENCY_MAX_LIMIT + 1, ms(1000)),
            Err(PolicyError::ConcurrencyLimitTooLarge(
                CONCURRENCY_MAX_LIMIT + 1
            ))
        );
        for ttl in [
            Duration::ZERO,
            Duration::from_micros(1500),
            MAX_SLOT_TTL + ms(1),
        ] {
            assert_eq!(c(5, ttl), Err(PolicyError::SlotTtl(ttl)));
        }
        let p = c(CONCURRENCY_MAX_LIMIT, MAX_SLOT_TTL).expect("at the bounds");
        assert_eq!(
            (p.capacity(), p.slot_ttl_ms()),
            (CONCURRENCY_MAX_LIMIT, 86_400_000)
        );
        assert_eq!(p.ledger_window_ms(), 0);
        // Through try_new, slot_ttl is the window, and burst is refused.
        let q = Policy::try_new(Algorithm::Concurrency, 5, ms(1000), None);
        assert_eq!(q, c(5, ms(1000)));
        assert_eq!(
            Policy::try_new(Algorithm::Concurrency, 5, Duration::ZERO, None),
            Err(PolicyError::SlotTtl(Duration::ZERO))
        );
        assert_eq!(
            Policy::try_new(Algorithm::Concurrency, 5, ms(1000), Some(5)),
            Err(PolicyError::BurstNotApplicable(Algorithm::Concurrency))
        );
    }

    #[test]
    fn rates_are_every_algorithm_but_concurrency() {
        let mut all = Algorithm::RATES.to_vec();
        all.push(Algorithm::Concurrency);
        assert_eq!(all, Algorithm::ALL);
        assert!(Algorithm::RATES.iter().all(|a| a.is_rate()));
        assert!(!Algorithm::Concurrency.is_rate());
    }

    #[test]
    fn burst_defaults_to_limit_and_is_the_bucket_capacity() {
        let p = Policy::try_new(Algorithm::TokenBucket, 7, ms(1000), None).expect("valid");
        assert_eq!((p.burst(), p.capacity()), (7, 7));
        let p = Policy::try_new(Algorithm::LeakyBucket, 7, ms(1000), Some(3)).expect("valid");
        assert_eq!((p.limit(), p.capacity()), (7, 3));
        let p = Policy::try_new(Algorithm::FixedWindow, 7, ms(1000), None).expect("valid");
        assert_eq!(p.capacity(), 7);
    }

    #[test]
    fn all_lists_every_algorithm_at_its_own_index() {
        for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
            assert_eq!(algorithm as usize, i, "{algorithm}");
        }
    }

    #[test]
    fn algorithm_names_round_trip_case_insensitively() {
        for a in Algorithm::ALL {
            assert_eq!(a.as_str().parse::<Algorithm>(), Ok(a));
            assert_eq!(a.as_str().to_uppercase().parse::<Algorithm>(), Ok(a));
        }
        assert!("gcra".parse::<Algorithm>().is_err());
    }
}
