//! The answer to `ShouldRateLimit`: a status per descriptor, the overall
//! code and the optional headers, as envoyproxy/ratelimit gives them.
//!
//! - No limit (unknown domain, no matching rule, a replaced rule): `OK`
//!   and nothing else. An `unlimited` rule: `OK`, `limit_remaining`
//!   `u32::MAX`.
//! - A limit: `OK` or `OVER_LIMIT`, `current_limit` (the rule's name,
//!   requests per unit, unit), `limit_remaining` (0 when over, as the
//!   reference) and `duration_until_reset` in whole seconds, rounded up:
//!   for a fixed window the end of the current window (the reference's
//!   figure), for a bucket or sliding algorithm the wait until the hits
//!   would pass when over, or until the budget is whole again. A descriptor
//!   that fitted but was not counted because another one of the request was
//!   over (all or nothing) says `OK` with its budget as it stands.
//! - Shadow mode (the rule's) answers `OK` where the limit is over; the
//!   server's `shadow_mode` turns only the overall code. Both are counted
//!   in `quotad_rls_shadow_denials_total`.
//! - A limit the store failed on (`store.on_error = "error"`, or a fault),
//!   where the answer does not depend on it: `UNKNOWN`, counted in no
//!   shadow denial. (Where the answer depends on it, the call fails.)
//! - The overall code is `OVER_LIMIT` when a descriptor that is not in
//!   quota mode is over, or when every quota-mode descriptor is.

use quotad_core::{Algorithm, Decision, Policy, Reason};
use quotad_proto::envoy::config::core::v3::HeaderValue;
use quotad_proto::envoy::service::ratelimit::v3::RateLimitResponse;
use quotad_proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};

use super::{Outcome, RlsOptions, Role};
use crate::metrics::{Metrics, NoLimitReason};
use crate::policy::rls::{Applied, NoLimit, Resolution, Unit};
use crate::registry::RlsSet;

/// The response for `resolved` descriptors and what the store said.
pub(super) fn respond(
    resolved: &[Resolution<'_>],
    outcomes: &[Outcome],
    set: &RlsSet,
    options: &RlsOptions,
    metrics: &Metrics,
) -> RateLimitResponse {
    let mut now = Now::new(options);
    let mut statuses = Vec::with_capacity(resolved.len());
    let (mut failed, mut quota_total, mut quota_failed) = (0usize, 0usize, 0usize);
    // The descriptor closest to its limit, for the headers (the reference's
    // choice: the lowest remaining, or the last one over). One the store
    // did not answer is shown only when over (`fail_closed`): its
    // remaining 0 is not a count.
    let mut closest: Option<usize> = None;
    let mut lowest = u32::MAX;
    for (i, (resolution, outcome)) in resolved.iter().zip(outcomes).enumerate() {
        let status = match resolution {
            Resolution::NoLimit(why) => {
                metrics.rls_no_limit(match why {
                    NoLimit::UnknownDomain => NoLimitReason::UnknownDomain,
                    NoLimit::NoMatch => NoLimitReason::NoMatch,
                    NoLimit::Replaced(_) => NoLimitReason::Replaced,
                });
                status(Code::Ok, None, 0, None)
            }
            Resolution::Unlimited(_) => {
                metrics.rls_no_limit(NoLimitReason::Unlimited);
                status(Code::Ok, None, u32::MAX, None)
            }
            Resolution::Limited(applied) => limited(applied, *outcome, set, &mut now),
        };
        let Some(role) = Role::of(options, resolution) else {
            statuses.push(status);
            continue;
        };
        if status.current_limit.is_some() && !outcome.unknown() && status.limit_remaining < lowest {
            (closest, lowest) = (Some(i), status.limit_remaining);
        }
        let over = status.code == Code::OverLimit as i32;
        if role.quota {
            quota_total += 1;
            quota_failed += usize::from(over);
        } else if over {
            failed += 1;
            (closest, lowest) = (Some(i), 0);
        }
        statuses.push(status);
    }

    let mut overall = if failed > 0 || (quota_total > 0 && quota_total == quota_failed) {
        Code::OverLimit
    } else {
        Code::Ok
    };
    if overall == Code::OverLimit && options.shadow_mode {
        overall = Code::Ok;
        for (resolution, status) in resolved.iter().zip(&statuses) {
            if let Resolution::Limited(applied) = resolution
                && status.code == Code::OverLimit as i32
                && let Some(counters) = set.counters(applied)
            {
                counters.shadow_denial();
            }
        }
    }

    let response_headers_to_add = match closest {
        Some(i) if options.headers.any() => headers(options, &statuses[i], rule_name(&resolved[i])),
        _ => Vec::new(),
    };
    RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        response_headers_to_add,
        ..RateLimitResponse::default()
    }
}

/// Records the decisions of a request's counted descriptors in their
/// rules' metrics: every one the store made, whether or not the call then
/// fails (a descriptor decided before another failed stays counted), and
/// a store failure only when the call answers it (`UNKNOWN`).
pub(super) fn record(
    resolved: &[Resolution<'_>],
    outcomes: &[Outcome],
    set: &RlsSet,
    answered: bool,
) {
    for (resolution, outcome) in resolved.iter().zip(outcomes) {
        let Resolution::Limited(applied) = resolution else {
            continue;
        };
        if !applied.charge().counts() {
            continue;
        }
        let Some(counters) = set.counters(applied) else {
            continue;
        };
        match outcome {
            Outcome::Decided(d) if answered || !outcome.failed() => counters.decisions.record(d),
            Outcome::Decided(_) => {}
            Outcome::Zero | Outcome::NoLimit => counters.decisions.record(&zero_denial()),
        }
    }
}

/// The status of a descriptor with a limit.
fn limited(
    applied: &Applied<'_>,
    outcome: Outcome,
    set: &RlsSet,
    now: &mut Now<'_>,
) -> DescriptorStatus {
    let limit = applied.limit();
    let unit = limit.unit();
    let policy = limit.policy();
    let algorithm = policy.map_or(Algorithm::FixedWindow, |p| p.algorithm());
    let counters = set.counters(applied);
    let (over, remaining, reset_ms) = match outcome {
        Outcome::Decided(d) => {
            // (One that fitted but was not counted is not over.)
            let over = outcome.over();
            let remaining = if over {
                0
            } else {
                u32::try_from(d.remaining).unwrap_or(u32::MAX)
            };
            (
                over,
                remaining,
                reset_ms(algorithm, policy, unit, &d, over, now),
            )
        }
        Outcome::Zero | Outcome::NoLimit => (true, 0, now.window_end(policy, unit)),
    };
    // A store failure `store.on_error` passed on: the call failed unless
    // the answer does not depend on this descriptor (see `verdict`).
    let failed = outcome.failed();
    let code = if failed {
        Code::Unknown
    } else if over && !applied.shadow_mode() {
        Code::OverLimit
    } else {
        let store_failure =
            matches!(outcome, Outcome::Decided(d) if d.reason == Reason::FailClosed);
        if over
            && !store_failure
            && let Some(c) = counters
        {
            c.shadow_denial();
        }
        Code::Ok
    };
    let current = RateLimit {
        name: applied.name().to_owned(),
        requests_per_unit: limit.requests_per_unit(),
        unit: unit.number(),
    };
    status(code, Some(current), remaining, Some(reset_ms))
}

/// Milliseconds until the status's reset: the window's end for a fixed
/// window (the store's figure, or the clock's when nothing is stored);
/// otherwise the wait until the hits would pass when over, or until the
/// budget is whole again.
fn reset_ms(
    algorithm: Algorithm,
    policy: Option<&Policy>,
    unit: Unit,
    d: &Decision,
    over: bool,
    now: &mut Now<'_>,
) -> u64 {
    match algorithm {
        Algorithm::FixedWindow if d.reset_after_ms > 0 => d.reset_after_ms,
        Algorithm::FixedWindow => now.window_end(policy, unit),
        _ if over && d.retry_after_ms > 0 => d.retry_after_ms,
        _ => d.reset_after_ms,
    }
}

/// The denial of a limit of 0, for the metrics.
fn zero_denial() -> Decision {
    Decision {
        allowed: false,
        limit: 0,
        remaining: 0,
        retry_after_ms: 0,
        reset_after_ms: 0,
        reason: Reason::LimitExceeded,
    }
}

fn status(
    code: Code,
    current_limit: Option<RateLimit>,
    limit_remaining: u32,
    reset_ms: Option<u64>,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit,
        limit_remaining,
        duration_until_reset: reset_ms.map(|ms| prost_types::Duration {
            seconds: i64::try_from(seconds(ms)).unwrap_or(i64::MAX),
            nanos: 0,
        }),
        quota: None,
    }
}

/// Whole seconds, rounded up: a client told to wait must not be early.
fn seconds(ms: u64) -> u64 {
    ms.div_ceil(1_000)
}

/// The server's clock, read at most once per response.
struct Now<'a> {
    options: &'a RlsOptions,
    ms: Option<u64>,
}

impl<'a> Now<'a> {
    fn new(options: &'a RlsOptions) -> Self {
        Now { options, ms: None }
    }

    /// The ms to the end of the window holding now: the rule's policy's
    /// (a calendar period, a `window:` of its own), else its unit's.
    fn window_end(&mut self, policy: Option<&Policy>, unit: Unit) -> u64 {
        let now = *self.ms.get_or_insert_with(|| self.options.clock.now_ms());
        match policy {
            Some(policy) => policy.window_bounds(now).1.saturating_sub(now),
            None => unit.until_window_end_ms(now),
        }
    }
}

/// The headers for the status closest to its limit.
fn headers(options: &RlsOptions, status: &DescriptorStatus, name: &str) -> Vec<HeaderValue> {
    let Some(limit) = &status.current_limit else {
        return Vec::new();
    };
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds);
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    };
    let mut out = Vec::new();
    if let Some(names) = &options.headers.reference {
        out.push(header(&names.limit, limit.requests_per_unit.to_string()));
        out.push(header(&names.remaining, status.limit_remaining.to_string()));
        out.push(header(&names.reset, reset.to_string()));
    }
    if options.headers.draft {
        let name = policy_name(name);
        let window = Unit::from_number(limit.unit).map_or(0, Unit::seconds);
        out.push(header(
            "RateLimit-Policy",
            format!("\"{name}\";q={};w={window}", limit.requests_per_unit),
        ));
        out.push(header(
            "RateLimit",
            format!("\"{name}\";r={};t={reset}", status.limit_remaining),
        ));
    }
    out
}

/// The rule's name as the inside of a structured-field string: printable
/// ASCII with `"` and `\` escaped; `default` for an unnamed rule.
fn policy_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars().filter(|c| (' '..='~').contains(c)) {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    if out.is_empty() {
        out.push_str("default");
    }
    out
}

/// The name of the rule that applies, empty when none does.
fn rule_name<'a>(resolution: &'a Resolution<'_>) -> &'a str {
    match resolution {
        Resolution::Limited(applied) => applied.name(),
        Resolution::NoLimit(_) | Resolution::Unlimited(_) => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_are_structured_field_strings() {
        assert_eq!(policy_name("per_ip"), "per_ip");
        assert_eq!(policy_name(""), "default");
        assert_eq!(policy_name("a\"b\\c"), "a\\\"b\\\\c");
        assert_eq!(policy_name("é\n"), "default");
    }

    #[test]
    fn resets_round_up_to_the_second() {
        assert_eq!(seconds(0), 0);
        assert_eq!(seconds(1), 1);
        assert_eq!(seconds(29_600), 30);
        assert_eq!(seconds(30_000), 30);
    }
}
