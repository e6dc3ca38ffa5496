//! `[policies.NAME]`: named policies, and what their checks answer when the
//! store fails.

use std::collections::BTreeMap;
use std::time::Duration;

use quotad_core::calendar::{self, Calendar, CalendarError, Period, Zone};
use quotad_core::{Algorithm, LeaseTerms, LeaseTermsError, Policy, PolicyError};
use serde::Deserialize;

use super::human_duration;
use crate::metrics::INLINE_POLICY_LABEL;
use crate::policy::{PolicyField, policy_error_field, validate_policy_name};

/// What a check answers when the store fails (Redis down or too slow).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// The call fails with gRPC `UNAVAILABLE`; the client's own failure
    /// policy decides.
    #[default]
    Error,
    /// Admit, with reason `FAIL_OPEN`; nothing is counted.
    FailOpen,
    /// Deny, with reason `FAIL_CLOSED`.
    FailClosed,
    /// Decide from this replica's own memory with the limit divided by
    /// `store.fallback.replicas`, with reason `LOCAL_FALLBACK`; a
    /// concurrency slot fails closed.
    Local,
}

impl OnError {
    /// The snake_case name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            OnError::Error => "error",
            OnError::FailOpen => "fail_open",
            OnError::FailClosed => "fail_closed",
            OnError::Local => "local",
        }
    }
}

/// A named policy, what its checks answer when the store fails, and how
/// it hands out leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicySettings {
    /// The validated policy.
    pub policy: Policy,
    /// `policies.NAME.on_error`, or `store.on_error` when not set.
    pub on_error: OnError,
    /// `policies.NAME.lease`: how `Leases.Lease` hands out shares of a
    /// key's budget; `None` (no `lease` table) when the policy has no
    /// leases.
    pub lease: Option<LeaseTerms>,
}

/// `[policies.NAME]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    algorithm: String,
    limit: u64,
    /// A rate's window; a concurrency policy has none.
    #[serde(default, deserialize_with = "some_duration")]
    window: Option<Duration>,
    /// A concurrency policy's slot TTL; a rate has none.
    #[serde(default, deserialize_with = "some_duration")]
    slot_ttl: Option<Duration>,
    burst: Option<u64>,
    /// A fixed window's calendar period instead of a `window`: `day`,
    /// `week`, `month` or `year`, in `time_zone`.
    period: Option<String>,
    /// The IANA zone whose local midnights bound `period`; UTC when left
    /// out.
    time_zone: Option<String>,
    /// The day a `period = "week"` starts on; Monday when left out.
    week_start: Option<String>,
    on_error: Option<OnError>,
    lease: Option<RawLease>,
}

impl RawPolicy {
    /// The calendar `period`, `time_zone` and `week_start` give, `None`
    /// without a period; or the field that breaks a rule. Whether the
    /// algorithm takes a period is the policy's to say.
    fn calendar(&self) -> Result<Option<Calendar>, (&'static str, String)> {
        let Some(period) = &self.period else {
            if self.time_zone.is_some() {
                return Err(("time_zone", "applies only with a period".to_owned()));
            }
            if self.week_start.is_some() {
                return Err((
                    "week_start",
                    "applies only with period = \"week\"".to_owned(),
                ));
            }
            return Ok(None);
        };
        if self.window.is_some() {
            return Err((
                "period",
                "give either window (a fixed length) or period (a calendar day, week, month or year), not both".to_owned(),
            ));
        }
        let mut period: Period = period
            .parse()
            .map_err(|e: CalendarError| ("period", e.to_string()))?;
        match (&mut period, &self.week_start) {
            (Period::Week(start), Some(day)) => {
                *start = calendar::parse_weekday(day).map_err(|e| ("week_start", e.to_string()))?;
            }
            (_, Some(_)) => {
                return Err((
                    "week_start",
                    "applies only with period = \"week\"".to_owned(),
                ));
            }
            (_, None) => {}
        }
        let zone = match &self.time_zone {
            Some(name) => Zone::named(name).map_err(|e| ("time_zone", e.to_string()))?,
            None => Zone::utc(),
        };
        Ok(Some(Calendar::new(period, zone)))
    }
}

/// `policies.NAME.lease` as written:
/// `lease = { max_units = 100, min_units = 10, max_ttl = "10s" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLease {
    max_units: u64,
    /// Below it a lease is not worth its call: 1 when left out, so that
    /// only exhaustion itself answers direct.
    #[serde(default = "one")]
    min_units: u64,
    #[serde(deserialize_with = "human_duration")]
    max_ttl: Duration,
}

fn one() -> u64 {
    1
}

/// A duration that is present: `human_duration`, for an optional field.
pub(super) fn some_duration<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    human_duration(deserializer).map(Some)
}

impl RawLease {
    /// The validated terms, or the `lease` field that breaks a rule.
    fn validate(self) -> Result<LeaseTerms, (&'static str, String)> {
        LeaseTerms::try_new(self.max_units, self.min_units, self.max_ttl).map_err(|e| {
            let field = match e {
                LeaseTermsError::ZeroMaxUnits | LeaseTermsError::MaxUnitsTooLarge => "max_units",
                LeaseTermsError::MinUnits { .. } => "min_units",
                LeaseTermsError::MaxTtl => "max_ttl",
            };
            (field, e.to_string())
        })
    }
}

/// A validation error: the field's path, and what is wrong.
pub(super) type Invalid = (Vec<String>, String);

/// Validates every policy; `default_on_error` is `store.on_error`.
pub(super) fn validate(
    raw: BTreeMap<String, RawPolicy>,
    default_on_error: OnError,
) -> Result<BTreeMap<String, PolicySettings>, Invalid> {
    let mut policies = BTreeMap::new();
    for (name, raw) in raw {
        let field = |f: &str| vec!["policies".to_owned(), name.clone(), f.to_owned()];
        let table = || vec!["policies".to_owned(), name.clone()];
        if let Err(message) = validate_policy_name(&name) {
            return Err((
                vec!["policies".to_owned(), name.clone()],
                format!("policy name {message}"),
            ));
        }
        // The metrics label every inline policy so: a policy of that name
        // would add its decisions to theirs. (A request naming it finds no
        // such policy: NOT_FOUND.)
        if name == INLINE_POLICY_LABEL {
            return Err((
                vec!["policies".to_owned(), name.clone()],
                format!(
                    "policy name {INLINE_POLICY_LABEL:?} is reserved: the metrics label inline policies with it"
                ),
            ));
        }
        let algorithm: quotad_core::Algorithm =
            raw.algorithm
                .parse()
                .map_err(|e: quotad_core::UnknownAlgorithm| {
                    (field(PolicyField::Algorithm.config_name()), e.to_string())
                })?;
        let calendar = raw.calendar().map_err(|(f, message)| (field(f), message))?;
        // A rate counts over a window (or a calendar period); a concurrency
        // limit's slots last slot_ttl. Each takes its own, and refuses the
        // other's.
        let window = match (algorithm.is_rate(), raw.window, raw.slot_ttl) {
            (true, Some(window), None) => window,
            (true, None, None) if calendar.is_some() => Duration::ZERO,
            (false, None, Some(slot_ttl)) => slot_ttl,
            (true, _, Some(_)) => {
                return Err((
                    field("slot_ttl"),
                    format!("applies only to a concurrency policy, not {algorithm} (use window)"),
                ));
            }
            (false, Some(_), _) => {
                return Err((
                    field("window"),
                    "a concurrency policy has no window: its slots last slot_ttl".to_owned(),
                ));
            }
            // Named at the table, as serde names a missing field.
            (true, None, None) => {
                return Err((
                    table(),
                    "missing field `window` (or `period`, for a calendar quota)".to_owned(),
                ));
            }
            (false, None, None) => {
                return Err((
                    table(),
                    "missing field `slot_ttl`: how long a slot lasts unrenewed (the most a dead holder strands it)".to_owned(),
                ));
            }
        };
        let policy = match calendar {
            Some(_) if raw.burst.is_some() && algorithm == Algorithm::FixedWindow => {
                Err(PolicyError::BurstNotApplicable(algorithm))
            }
            Some(calendar) => Policy::calendar(algorithm, raw.limit, calendar),
            None => Policy::try_new(algorithm, raw.limit, window, raw.burst),
        }
        .map_err(|e| (field(policy_error_field(&e).config_name()), e.to_string()))?;
        if !algorithm.is_rate() && raw.lease.is_some() {
            return Err((
                field("lease"),
                "a concurrency policy has no leases: its slots are acquired and released"
                    .to_owned(),
            ));
        }
        let on_error = raw.on_error.unwrap_or(default_on_error);
        let lease = raw
            .lease
            .map(RawLease::validate)
            .transpose()
            .map_err(|(f, message)| {
                let mut path = field("lease");
                path.push(f.to_owned());
                (path, message)
            })?;
        policies.insert(
            name,
            PolicySettings {
                policy,
                on_error,
                lease,
            },
        );
    }
    Ok(policies)
}
