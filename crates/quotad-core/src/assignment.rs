//! Envoy quota assignments (RLQS) cut from leases: the arithmetic that turns
//! a lease of `units`, charged to the key when it was granted, into a token
//! bucket Envoy enforces on its own, such that Envoy can never admit more
//! with it than the lease holds.
//!
//! Envoy's `rate_limit_quota` filter reads an assignment's TTL and a token
//! bucket's `fill_interval` in whole seconds, starts a new bucket full
//! (`max_tokens`), refills it continuously at `tokens_per_fill /
//! fill_interval` per second, and keeps the bucket it has (tokens and all)
//! when an identical one arrives before the old one expired. An assignment
//! whose lease holds `C` units and whose TTL is `T` seconds is therefore cut
//! as a burst `U` and a rate `r` per second with `U + r x (T + margin) <= C`:
//! whatever Envoy holds when the assignment arrives (a new bucket is full, a
//! kept one holds at most `U`), it admits at most `C` before the TTL ends,
//! even when its timer fires up to `margin` late. The margin is what the
//! lease's ledger counts beyond the TTL, so the lease is still live in the
//! store for as long as Envoy may spend it (the store's lease rules then
//! keep every key within its policy: `docs/leases.md`).
//!
//! What is lost: the refill budgeted over the margin, and the rounding of
//! `C` into `U` and `r` (under-admission, never over). The window
//! algorithms' leases are cut without a refill
//! ([`AssignmentTerms::window_bucket`]): all `C` units at once.

use thiserror::Error;

/// The most units one assignment may hold: Envoy's `max_tokens` is a
/// `uint32`.
pub const MAX_ASSIGNMENT_UNITS: u64 = u32::MAX as u64;

/// The longest assignment TTL, in seconds (a day, the longest lease).
pub const MAX_ASSIGNMENT_TTL_S: u64 = 86_400;

/// How assignments are cut: validated, so terms that exist are usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AssignmentTerms {
    ttl_s: u64,
    margin_ms: u64,
    max_units: u64,
}

/// Assignment terms that break a rule.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum AssignmentTermsError {
    /// The TTL is not from 1 s to a day.
    #[error("ttl must be whole seconds from 1s to 1d")]
    Ttl,
    /// The margin is above a minute.
    #[error("margin must be at most 1m")]
    Margin,
    /// `max_tokens` is 0 or above `u32::MAX`.
    #[error("max_tokens must be from 1 to 4294967295")]
    MaxUnits,
}

impl AssignmentTerms {
    /// Assignments lasting `ttl_s` seconds at Envoy, leased for `margin_ms`
    /// more in the store, each holding at most `max_units`.
    ///
    /// # Errors
    ///
    /// One [`AssignmentTermsError`] per broken rule.
    pub fn try_new(
        ttl_s: u64,
        margin_ms: u64,
        max_units: u64,
    ) -> Result<Self, AssignmentTermsError> {
        if ttl_s == 0 || ttl_s > MAX_ASSIGNMENT_TTL_S {
            return Err(AssignmentTermsError::Ttl);
        }
        if margin_ms > 60_000 {
            return Err(AssignmentTermsError::Margin);
        }
        if max_units == 0 || max_units > MAX_ASSIGNMENT_UNITS {
            return Err(AssignmentTermsError::MaxUnits);
        }
        Ok(Self {
            ttl_s,
            margin_ms,
            max_units,
        })
    }

    /// The TTL Envoy is given, in whole seconds.
    pub fn ttl_s(&self) -> u64 {
        self.ttl_s
    }

    /// How long past the TTL the store keeps counting a lease: the longest
    /// delay from the store granting it to Envoy's timer ending it.
    pub fn margin_ms(&self) -> u64 {
        self.margin_ms
    }

    /// The most units one assignment holds.
    pub fn max_units(&self) -> u64 {
        self.max_units
    }

    /// How long the store counts an assignment's lease: the TTL and the
    /// margin.
    pub fn lease_ms(&self) -> u64 {
        self.ttl_s * 1_000 + self.margin_ms
    }

    /// The units to ask for, from what the holder reported: `demanded`
    /// requests (admitted and denied) over `elapsed_s` seconds. A first
    /// report (`elapsed_s` 0) says nothing of a rate: it asks for the most.
    /// Otherwise the rate over a lease's life, rounded up, at least 1.
    pub fn want(&self, demanded: u64, elapsed_s: u64) -> u64 {
        if elapsed_s == 0 {
            return self.max_units;
        }
        let over_life = u128::from(demanded) * u128::from(self.lease_ms());
        let want = over_life.div_ceil(u128::from(elapsed_s) * 1_000);
        u64::try_from(want)
            .unwrap_or(u64::MAX)
            .clamp(1, self.max_units)
    }

    /// A bucket of all of a lease's `units` that does not refill within
    /// its life: for the window algorithms, whose leases end with their
    /// window (when in the window a leased unit is spent does not matter,
    /// so nothing is held back for a refill). `None` as for
    /// [`AssignmentTerms::bucket`].
    pub fn window_bucket(&self, units: u64, lease_ms: u64) -> Option<EnvoyBucket> {
        let ttl_s = (lease_ms.saturating_sub(self.margin_ms) / 1_000).min(self.ttl_s);
        if ttl_s == 0 || units == 0 {
            return None;
        }
        let units = units.min(MAX_ASSIGNMENT_UNITS);
        let life = ttl_s * 1_000 + self.margin_ms;
        Some(EnvoyBucket {
            max_tokens: u32::try_from(units).expect("units <= u32::MAX"),
            tokens_per_fill: 1,
            fill_interval_s: life / 1_000 + 1,
            ttl_s,
        })
    }

    /// The Envoy token bucket for a lease of `units` that the store counts
    /// for `lease_ms` (less than [`AssignmentTerms::lease_ms`] when the
    /// lease ends with a window): `None` when what is left of it after the
    /// margin is under a whole second, the shortest TTL Envoy reads.
    pub fn bucket(&self, units: u64, lease_ms: u64) -> Option<EnvoyBucket> {
        let ttl_s = (lease_ms.saturating_sub(self.margin_ms) / 1_000).min(self.ttl_s);
        if ttl_s == 0 || units == 0 {
            return None;
        }
        let units = units.min(MAX_ASSIGNMENT_UNITS);
        // Envoy may spend for up to `life` ms: its TTL, and its timer late
        // by up to the margin.
        let life = ttl_s * 1_000 + self.margin_ms;
        // r x (life + 1 s) <= units, so that U = units - ceil(r x life) >= r.
        let rate = units * 1_000 / (life + 1_000);
        let (max_tokens, tokens_per_fill, fill_interval_s) = if rate == 0 {
            // Too few units to refill: a bucket of all of them whose one
            // token per fill interval never comes within its life.
            (units, 1, life / 1_000 + 1)
        } else {
            (units - (rate * life).div_ceil(1_000), rate, 1)
        };
        Some(EnvoyBucket {
            max_tokens: u32::try_from(max_tokens).expect("max_tokens <= units <= u32::MAX"),
            tokens_per_fill: u32::try_from(tokens_per_fill).expect("rate <= units <= u32::MAX"),
            fill_interval_s,
            ttl_s,
        })
    }
}

/// An assignment as Envoy's token bucket enforces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EnvoyBucket {
    /// `max_tokens`: the burst, and what a new bucket starts with.
    pub max_tokens: u32,
    /// `tokens_per_fill`.
    pub tokens_per_fill: u32,
    /// `fill_interval`, whole seconds.
    pub fill_interval_s: u64,
    /// `assignment_time_to_live`, whole seconds.
    pub ttl_s: u64,
}

impl EnvoyBucket {
    /// This bucket, or, when Envoy would take it for `previous`, one a
    /// token smaller (burst first, then rate): Envoy keeps its current
    /// bucket, tokens, refill and all, when one it deems identical arrives,
    /// so a renewal that came out the same would give the holder nothing of
    /// its new lease, and one with a slower refill would be refilled at the
    /// old rate. Envoy deems two buckets identical when their `max_tokens`,
    /// `tokens_per_fill` and the *nanoseconds* of `fill_interval` match
    /// (its seconds are not compared), and quotad's fill intervals are
    /// whole seconds: so the interval is not compared here either. Smaller
    /// never admits more; a bucket of one token and one per fill cannot
    /// shrink and is kept as it is (docs/rlqs.md: known limits).
    #[must_use]
    pub fn unlike(self, previous: Option<&EnvoyBucket>) -> EnvoyBucket {
        let same = |p: &EnvoyBucket| {
            (p.max_tokens, p.tokens_per_fill) == (self.max_tokens, self.tokens_per_fill)
        };
        match previous {
            Some(p) if same(p) && self.max_tokens > 1 => EnvoyBucket {
                max_tokens: self.max_tokens - 1,
                ..self
            },
            Some(p) if same(p) && self.tokens_per_fill > 1 => EnvoyBucket {
                tokens_per_fill: self.tokens_per_fill - 1,
                ..self
            },
            _ => self,
        }
    }

    /// The most Envoy admits with this bucket within `ms` of receiving it,
    /// starting full: the burst and the continuous refill, rounded down.
    pub fn most_admitted_within(&self, ms: u64) -> u64 {
        let refill = u128::from(self.tokens_per_fill) * u128::from(ms)
            / (u128::from(self.fill_interval_s) * 1_000);
        u64::from(self.max_tokens) + u64::try_from(refill).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_renewal_envoy_would_take_for_the_old_bucket_differs_from_it_even_in_interval_only() {
        let old = EnvoyBucket {
            max_tokens: 6,
            tokens_per_fill: 1,
            fill_interval_s: 1,
            ttl_s: 5,
        };
        // The same tokens with a slower refill: Envoy compares only the
        // interval's nanoseconds, so it would keep refilling at 1/s.
        let slower = EnvoyBucket {
            fill_interval_s: 6,
            ..old
        };
        let sent = slower.unlike(Some(&old));
        assert_ne!(
            (sent.max_tokens, sent.tokens_per_fill),
            (old.max_tokens, old.tokens_per_fill)
        );
        assert!(
            sent.max_tokens <= slower.max_tokens && sent.tokens_per_fill <= slower.tokens_per_fill
        );
        // A bucket Envoy would not confuse is sent as it is.
        let other = EnvoyBucket {
            max_tokens: 7,
            ..old
        };
        assert_eq!(other.unlike(Some(&old)), other);
    }

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn terms_name_the_rule_they_break() {
        assert_eq!(
            AssignmentTerms::try_new(0, 0, 1),
            Err(AssignmentTermsError::Ttl)
        );
        assert_eq!(
            AssignmentTerms::try_new(86_401, 0, 1),
            Err(AssignmentTermsError::Ttl)
        );
        assert_eq!(
            AssignmentTerms::try_new(1, 60_001, 1),
            Err(AssignmentTermsError::Margin)
        );
        assert_eq!(
            AssignmentTerms::try_new(1, 0, 0),
            Err(AssignmentTermsError::MaxUnits)
        );
        assert_eq!(
            AssignmentTerms::try_new(1, 0, MAX_ASSIGNMENT_UNITS + 1),
            Err(AssignmentTermsError::MaxUnits)
        );
    }

    #[test]
    fn a_lease_shorter_than_a_second_after_the_margin_is_no_assignment() {
        let terms = AssignmentTerms::try_new(5, 500, 100).expect("valid");
        assert_eq!(terms.bucket(10, 1_499), None);
        assert_eq!(terms.bucket(0, 10_000), None);
        let bucket = terms.bucket(10, 1_500).expect("a second is left");
        assert_eq!(bucket.ttl_s, 1);
        // A longer lease than the terms' is cut to their TTL.
        assert_eq!(terms.bucket(10, 60_000).expect("valid").ttl_s, 5);
    }

    #[test]
    fn demand_is_a_rate_over_the_leases_life_and_a_first_report_asks_for_the_most() {
        let terms = AssignmentTerms::try_new(2, 500, 1_000).expect("valid");
        assert_eq!(terms.want(1, 0), 1_000);
        // 50 per second over 2.5 s.
        assert_eq!(terms.want(250, 5), 125);
        assert_eq!(terms.want(0, 5), 1);
        assert_eq!(terms.want(1_000_000, 1), 1_000);
    }

    #[test]
    fn a_bucket_refills_when_the_units_allow_it() {
        let terms = AssignmentTerms::try_new(2, 500, 10_000).expect("valid");
        let bucket = terms.bucket(350, 2_500).expect("valid");
        // 350 over 2.5 s (and one more second of slack): 100 a second.
        assert_eq!(
            (
                bucket.max_tokens,
                bucket.tokens_per_fill,
                bucket.fill_interval_s
            ),
            (100, 100, 1)
        );
        let few = terms.bucket(3, 2_500).expect("valid");
        assert_eq!((few.max_tokens, few.tokens_per_fill), (3, 1));
        assert!(few.fill_interval_s * 1_000 > 2_500);
    }

    #[test]
    fn a_renewal_that_came_out_the_same_is_a_token_smaller() {
        let terms = AssignmentTerms::try_new(2, 500, 10_000).expect("valid");
        let bucket = terms.bucket(350, 2_500).expect("valid");
        let next = terms
            .bucket(350, 2_500)
            .expect("valid")
            .unlike(Some(&bucket));
        assert_eq!((next.max_tokens, next.tokens_per_fill), (99, 100));
        // The one after differs from that one, and is whole again.
        assert_eq!(bucket.unlike(Some(&next)), bucket);
        let one = EnvoyBucket {
            max_tokens: 1,
            tokens_per_fill: 3,
            fill_interval_s: 1,
            ttl_s: 1,
        };
        assert_eq!(one.unlike(Some(&one)).tokens_per_fill, 2);
        let least = EnvoyBucket {
            tokens_per_fill: 1,
            ..one
        };
        assert_eq!(least.unlike(Some(&least)), least);
    }

    proptest! {
        /// Envoy admits no more than the lease holds, however full its
        /// bucket is when the assignment arrives (at most `max_tokens`) and
        /// however late its timer ends it within the margin; and at least
        /// one unit is usable.
        #[test]
        fn envoy_never_admits_more_than_the_lease_holds(
            ttl_s in 1_u64..=120,
            margin_ms in 0_u64..=5_000,
            units in 1_u64..=MAX_ASSIGNMENT_UNITS,
            short in 0_u64..=130_000,
        ) {
            let terms = AssignmentTerms::try_new(ttl_s, margin_ms, MAX_ASSIGNMENT_UNITS)
                .expect("valid");
            let lease_ms = terms.lease_ms().saturating_sub(short);
            match terms.bucket(units, lease_ms) {
                None => prop_assert!(lease_ms < margin_ms + 1_000),
                Some(bucket) => {
                    prop_assert!(bucket.ttl_s >= 1 && bucket.ttl_s <= ttl_s);
                    prop_assert!(bucket.ttl_s * 1_000 + margin_ms <= lease_ms);
                    prop_assert!(bucket.fill_interval_s >= 1);
                    prop_assert!(bucket.max_tokens >= 1 && bucket.tokens_per_fill >= 1);
                    let life = bucket.ttl_s * 1_000 + margin_ms;
                    prop_assert!(bucket.most_admitted_within(life) <= units);
                    // Under-admission is bounded: at most a second's refill
                    // and the margin's, and the rounding.
                    let used = bucket.most_admitted_within(bucket.ttl_s * 1_000);
                    let rate = u64::from(bucket.tokens_per_fill) / bucket.fill_interval_s;
                    prop_assert!(
                        used + rate * (2 + margin_ms.div_ceil(1_000)) + 2 >= units,
                        "used {} of {}", used, units
                    );
                }
            }
            match terms.window_bucket(units, lease_ms) {
                None => prop_assert!(lease_ms < margin_ms + 1_000),
                Some(bucket) => {
                    let life = bucket.ttl_s * 1_000 + margin_ms;
                    prop_assert!(bucket.ttl_s * 1_000 + margin_ms <= lease_ms);
                    prop_assert_eq!(bucket.most_admitted_within(life), units);
                    prop_assert!(bucket.max_tokens >= 1 && bucket.fill_interval_s >= 1);
                }
            }
        }
    }
}
