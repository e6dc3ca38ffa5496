//! `[limits]`: what an inline policy, and its lease terms, may ask for.

use quotad_core::{Algorithm, LeaseTerms, Policy};

use super::settings::LimitSettings;

impl LimitSettings {
    /// Checks an inline policy against `limits.max_inline_*`.
    ///
    /// # Errors
    ///
    /// The offending field of the inline policy (`window_ms`, `limit`,
    /// `burst`) and a message naming the setting that bounds it.
    pub fn check_inline(&self, policy: &Policy) -> Result<(), (&'static str, String)> {
        let max_window_ms = u64::try_from(self.max_inline_window.as_millis()).unwrap_or(u64::MAX);
        if let Some(calendar) = policy.calendar_period()
            && policy.window_ms() > max_window_ms
        {
            // The caller sent a period, not a window: name what it sent.
            return Err((
                "period",
                format!(
                    "a {} ({} ms at its longest nominal length) is longer than an inline policy may count over (limits.max_inline_window = {max_window_ms} ms)",
                    calendar.period().as_str(),
                    policy.window_ms()
                ),
            ));
        }
        if policy.window_ms() > max_window_ms {
            return Err((
                "window_ms",
                format!(
                    "must be at most {max_window_ms} for an inline policy (limits.max_inline_window); got {}",
                    policy.window_ms()
                ),
            ));
        }
        let (max_limit, setting) = if policy.algorithm() == Algorithm::SlidingLog
            && self.max_inline_log_limit < self.max_inline_limit
        {
            (self.max_inline_log_limit, "limits.max_inline_log_limit")
        } else {
            (self.max_inline_limit, "limits.max_inline_limit")
        };
        if policy.limit() > max_limit {
            return Err((
                "limit",
                format!(
                    "must be at most {max_limit} for an inline {} policy ({setting}); got {}",
                    policy.algorithm(),
                    policy.limit()
                ),
            ));
        }
        if policy.algorithm().is_bucket() && policy.burst() > self.max_inline_limit {
            return Err((
                "burst",
                format!(
                    "must be at most {} for an inline policy (limits.max_inline_limit); got {}",
                    self.max_inline_limit,
                    policy.burst()
                ),
            ));
        }
        Ok(())
    }

    /// Checks the lease terms of an inline policy against
    /// `limits.lease_max_*`.
    ///
    /// # Errors
    ///
    /// The offending field of the terms (`max_units`, `max_ttl_ms`) and a
    /// message naming the setting that bounds it.
    pub fn check_lease(&self, terms: &LeaseTerms) -> Result<(), (&'static str, String)> {
        if terms.max_units() > self.lease_max_units {
            return Err((
                "max_units",
                format!(
                    "must be at most {} for an inline policy (limits.lease_max_units); got {}",
                    self.lease_max_units,
                    terms.max_units()
                ),
            ));
        }
        let max_ttl_ms = u64::try_from(self.lease_max_ttl.as_millis()).unwrap_or(u64::MAX);
        if terms.max_ttl_ms() > max_ttl_ms {
            return Err((
                "max_ttl_ms",
                format!(
                    "must be at most {max_ttl_ms} for an inline policy (limits.lease_max_ttl); got {}",
                    terms.max_ttl_ms()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Config;

    fn policy(algorithm: Algorithm, limit: u64, window: Duration, burst: Option<u64>) -> Policy {
        Policy::try_new(algorithm, limit, window, burst).expect("a valid policy")
    }

    #[test]
    fn an_inline_calendar_longer_than_max_inline_window_names_its_period() {
        use quotad_core::{Calendar, Period, Zone};
        let limits = Config::default().limits().clone();
        let in_ = |period| {
            let calendar = Calendar::new(period, Zone::named("Europe/Berlin").expect("a zone"));
            Policy::calendar(Algorithm::FixedWindow, 10, calendar).expect("valid")
        };
        assert!(limits.check_inline(&in_(Period::Day)).is_ok());
        let monday = quotad_core::calendar::Weekday::Monday;
        for period in [Period::Week(monday), Period::Month, Period::Year] {
            let (field, message) = limits.check_inline(&in_(period)).expect_err("too long");
            assert_eq!(field, "period", "{period:?}");
            assert!(message.contains("limits.max_inline_window"), "{message}");
            assert!(message.contains(period.as_str()), "{message}");
        }
    }

    #[test]
    fn inline_policies_stay_within_the_configured_bounds() {
        let limits = Config::default().limits().clone();
        let day = Duration::from_secs(86_400);
        let ok = |p: Policy| limits.check_inline(&p);
        let field = |p: Policy| limits.check_inline(&p).expect_err("out of bounds").0;

        assert!(ok(policy(Algorithm::FixedWindow, 1_000_000, day, None)).is_ok());
        assert_eq!(
            field(policy(
                Algorithm::FixedWindow,
                10,
                day + Duration::from_millis(1),
                None
            )),
            "window_ms"
        );
        assert_eq!(
            field(policy(Algorithm::FixedWindow, 1_000_001, day, None)),
            "limit"
        );
        assert!(ok(policy(Algorithm::SlidingLog, 100, day, None)).is_ok());
        let (name, message) = limits
            .check_inline(&policy(Algorithm::SlidingLog, 101, day, None))
            .expect_err("a long log");
        assert_eq!(name, "limit");
        assert!(message.contains("limits.max_inline_log_limit"), "{message}");
        // Where max_inline_limit is the smaller, it is the one named.
        let mut tight = limits.clone();
        tight.max_inline_limit = 50;
        let (_, message) = tight
            .check_inline(&policy(Algorithm::SlidingLog, 51, day, None))
            .expect_err("over max_inline_limit");
        assert!(
            message.contains("at most 50") && message.contains("limits.max_inline_limit"),
            "{message}"
        );
        assert_eq!(
            field(policy(Algorithm::TokenBucket, 10, day, Some(1_000_001))),
            "burst"
        );
    }

    #[test]
    fn inline_lease_terms_stay_within_the_configured_bounds() {
        let limits = Config::default().limits().clone();
        let terms = |max_units, ttl_ms| {
            LeaseTerms::try_new(max_units, 1, Duration::from_millis(ttl_ms)).expect("valid terms")
        };
        assert!(limits.check_lease(&terms(1_000, 10_000)).is_ok());
        let (field, message) = limits
            .check_lease(&terms(1_001, 10_000))
            .expect_err("too many units");
        assert_eq!(field, "max_units");
        assert!(message.contains("limits.lease_max_units"), "{message}");
        let (field, message) = limits
            .check_lease(&terms(10, 10_001))
            .expect_err("too long");
        assert_eq!(field, "max_ttl_ms");
        assert!(message.contains("limits.lease_max_ttl"), "{message}");
        // 0 refuses every inline lease.
        let mut none = limits.clone();
        none.lease_max_units = 0;
        assert_eq!(
            none.check_lease(&terms(1, 1)).map_err(|e| e.0),
            Err("max_units")
        );
    }
}
