//! Requests converted from protobuf to domain values at the edge. What can
//! be checked without the server's state is checked here; the service then
//! resolves policy names and applies its configured limits.

use std::time::Duration;

use quotad_core::calendar::{self, Calendar, CalendarError, Period, Zone};
use quotad_core::{Algorithm, BatchMode, Decision, Policy, PolicyError};
use quotad_proto::MAX_BATCH_ITEMS;
use quotad_proto::convert::{self, UnknownValue};
use quotad_proto::v1 as pb;

use super::error::ServiceError;
use crate::policy::{policy_error_field, validate_policy_name};

/// The policy a request is decided under (quotad-core's, shared with the
/// client).
pub(crate) use quotad_core::PolicyRef;

/// A `Check` or `Peek` request, or one item of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CheckSpec {
    pub(crate) key: String,
    pub(crate) cost: u64,
    pub(crate) policy: PolicyRef,
}

/// A `Reset` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ResetSpec {
    pub(crate) key: String,
    pub(crate) policy: PolicyRef,
}

/// A `CheckBatch` request, its size checked and every item converted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BatchSpec {
    pub(crate) items: Vec<CheckSpec>,
    pub(crate) mode: BatchMode,
}

impl TryFrom<pb::CheckRequest> for CheckSpec {
    type Error = ServiceError;

    fn try_from(request: pb::CheckRequest) -> Result<Self, Self::Error> {
        CheckSpec::convert(request, None, &mut None)
    }
}

impl CheckSpec {
    /// Converts `request`, one item of a batch. A batch's items nearly
    /// always share their policy, which is then validated once: a policy
    /// the same as the previous item's (`previous`; for an inline policy,
    /// as sent: `previous_inline`) is taken from it as it is.
    fn convert(
        request: pb::CheckRequest,
        previous: Option<&PolicyRef>,
        previous_inline: &mut Option<pb::Policy>,
    ) -> Result<Self, ServiceError> {
        use pb::check_request::Policy as P;
        let policy = match (request.policy, previous) {
            (Some(P::PolicyName(name)), Some(PolicyRef::Named(last))) if *last == name => {
                PolicyRef::Named(name)
            }
            (Some(P::InlinePolicy(sent)), Some(PolicyRef::Inline(last)))
                if previous_inline.as_ref() == Some(&sent) =>
            {
                PolicyRef::Inline(*last)
            }
            (Some(P::PolicyName(name)), _) => named(name)?,
            (Some(P::InlinePolicy(sent)), _) => {
                let policy = inline(&sent)?;
                *previous_inline = Some(sent);
                policy
            }
            (None, _) => return Err(missing_policy()),
        };
        Ok(CheckSpec {
            key: key(request.key)?,
            cost: cost(request.cost)?,
            policy,
        })
    }
}

impl TryFrom<pb::ResetRequest> for ResetSpec {
    type Error = ServiceError;

    fn try_from(request: pb::ResetRequest) -> Result<Self, Self::Error> {
        use pb::reset_request::Policy as P;
        let policy = match request.policy {
            Some(P::PolicyName(name)) => named(name)?,
            Some(P::InlinePolicy(policy)) => inline(&policy)?,
            None => return Err(missing_policy()),
        };
        Ok(ResetSpec {
            key: key(request.key)?,
            policy,
        })
    }
}

impl TryFrom<pb::CheckBatchRequest> for BatchSpec {
    type Error = ServiceError;

    fn try_from(request: pb::CheckBatchRequest) -> Result<Self, Self::Error> {
        let mode = convert::batch_mode(request.mode).map_err(|_| {
            ServiceError::invalid("mode", format!("unknown batch mode {}", request.mode))
        })?;
        let count = request.items.len();
        if count == 0 {
            return Err(ServiceError::invalid("items", "must hold at least 1 item"));
        }
        if count > MAX_BATCH_ITEMS {
            return Err(ServiceError::invalid(
                "items",
                format!("must hold at most {MAX_BATCH_ITEMS} items (got {count})"),
            ));
        }
        let mut items: Vec<CheckSpec> = Vec::with_capacity(count);
        let mut previous_inline = None;
        for (i, item) in request.items.into_iter().enumerate() {
            let previous = items.last().map(|spec| &spec.policy);
            let spec = CheckSpec::convert(item, previous, &mut previous_inline)
                .map_err(|e| e.at_item(i))?;
            items.push(spec);
        }
        Ok(BatchSpec { items, mode })
    }
}

/// A request's key, checked for the rules that need no configuration.
pub(super) fn key(key: String) -> Result<String, ServiceError> {
    if key.is_empty() {
        return Err(ServiceError::invalid("key", "must not be empty"));
    }
    Ok(key)
}

/// Checks a key against `store.max_key_bytes`: every service that takes
/// a key refuses the same ones.
pub(super) fn check_key_bytes(key: &str, max_key_bytes: usize) -> Result<(), ServiceError> {
    if key.len() > max_key_bytes {
        return Err(ServiceError::invalid(
            "key",
            format!("must be at most {max_key_bytes} bytes (got {})", key.len()),
        ));
    }
    Ok(())
}

/// The cost asked for, checked here with the rest of the request (before
/// its policy is looked up), so a bad cost is INVALID_ARGUMENT whether or
/// not the policy exists.
fn cost(cost: Option<u64>) -> Result<u64, ServiceError> {
    match cost {
        None => Ok(1),
        Some(0) => Err(ServiceError::invalid(
            "cost",
            "must be at least 1 (omit it for 1)",
        )),
        Some(cost) if cost > quotad_core::MAX_EXACT => Err(ServiceError::invalid(
            "cost",
            format!(
                "must be at most 2^53 = {} (got {cost})",
                quotad_core::MAX_EXACT
            ),
        )),
        Some(cost) => Ok(cost),
    }
}

pub(super) fn missing_policy() -> ServiceError {
    ServiceError::invalid("policy", "set policy_name or inline_policy")
}

pub(super) fn named(name: String) -> Result<PolicyRef, ServiceError> {
    validate_policy_name(&name).map_err(|message| ServiceError::invalid("policy_name", message))?;
    Ok(PolicyRef::Named(name))
}

pub(super) fn inline(policy: &pb::Policy) -> Result<PolicyRef, ServiceError> {
    let algorithm = algorithm(policy.algorithm)?;
    let window = Duration::from_millis(policy.window_ms);
    let made = match inline_calendar(policy)? {
        Some(_) if policy.window_ms != 0 => {
            return Err(ServiceError::invalid(
                "inline_policy.period",
                "give either window_ms (a fixed length) or period (a calendar day, week, month or year), not both",
            ));
        }
        Some(_) if policy.burst.is_some() && algorithm == Algorithm::FixedWindow => {
            Err(PolicyError::BurstNotApplicable(algorithm))
        }
        Some(calendar) => Policy::calendar(algorithm, policy.limit, calendar),
        None => Policy::try_new(algorithm, policy.limit, window, policy.burst),
    };
    made.map(PolicyRef::Inline).map_err(|e| {
        let field = format!("inline_policy.{}", policy_error_field(&e).proto_name());
        ServiceError::invalid(&field, e.to_string())
    })
}

/// The calendar an inline policy's `period`, `time_zone` and `week_start`
/// give; `None` without a period.
fn inline_calendar(policy: &pb::Policy) -> Result<Option<Calendar>, ServiceError> {
    let invalid = |field: &str, message: String| {
        ServiceError::invalid(&format!("inline_policy.{field}"), message)
    };
    if policy.period.is_empty() {
        if !policy.time_zone.is_empty() {
            return Err(invalid(
                "time_zone",
                "applies only with a period".to_owned(),
            ));
        }
        if !policy.week_start.is_empty() {
            return Err(invalid(
                "week_start",
                "applies only with period \"week\"".to_owned(),
            ));
        }
        return Ok(None);
    }
    let mut period: Period = policy
        .period
        .parse()
        .map_err(|e: CalendarError| invalid("period", e.to_string()))?;
    if !policy.week_start.is_empty() {
        let Period::Week(start) = &mut period else {
            return Err(invalid(
                "week_start",
                "applies only with period \"week\"".to_owned(),
            ));
        };
        *start = calendar::parse_weekday(&policy.week_start)
            .map_err(|e| invalid("week_start", e.to_string()))?;
    }
    let zone = if policy.time_zone.is_empty() {
        Zone::utc()
    } else {
        Zone::named(&policy.time_zone).map_err(|e| invalid("time_zone", e.to_string()))?
    };
    Ok(Some(Calendar::new(period, zone)))
}

fn algorithm(value: i32) -> Result<Algorithm, ServiceError> {
    const FIELD: &str = "inline_policy.algorithm";
    convert::algorithm(value).map_err(|e| match e {
        UnknownValue::Unspecified => ServiceError::invalid(FIELD, "must be set"),
        UnknownValue::Unknown(v) => ServiceError::invalid(FIELD, format!("unknown algorithm {v}")),
    })
}

/// The state namespace of an inline policy: every parameter, so that two
/// inline policies share state only if they are the same policy. `:` cannot
/// appear in a policy name, so it never collides with named state.
pub(crate) fn inline_namespace(policy: &Policy) -> String {
    let mut namespace = format!(
        "inline:{}:{}:{}:{}",
        policy.algorithm(),
        policy.limit(),
        policy.window_ms(),
        policy.burst()
    );
    // A calendar quota's periods, too: `...:day@America/New_York`.
    if let Some(calendar) = policy.calendar_period() {
        namespace.push(':');
        namespace.push_str(&calendar.spec());
    }
    namespace
}

/// The protobuf decision.
pub(crate) fn decision_to_pb(decision: &Decision) -> pb::Decision {
    decision.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(
        key: &str,
        cost: Option<u64>,
        policy: pb::check_request::Policy,
    ) -> pb::CheckRequest {
        pb::CheckRequest {
            key: key.to_owned(),
            cost,
            policy: Some(policy),
        }
    }

    fn named_request(key: &str) -> pb::CheckRequest {
        request(
            key,
            None,
            pb::check_request::Policy::PolicyName("api".into()),
        )
    }

    #[test]
    fn an_absent_cost_means_one_unit() {
        let spec = CheckSpec::try_from(named_request("user")).expect("valid");
        assert_eq!(spec.cost, 1);
        assert_eq!(spec.policy, PolicyRef::Named("api".into()));
    }

    #[test]
    fn a_cost_above_2_pow_53_is_refused_before_the_policy_is_looked_up() {
        let name = pb::check_request::Policy::PolicyName("no-such-policy".into());
        let at_most = request("user", Some(quotad_core::MAX_EXACT), name.clone());
        assert_eq!(CheckSpec::try_from(at_most).expect("valid").cost, 1 << 53);
        let over = request("user", Some(quotad_core::MAX_EXACT + 1), name);
        let error = CheckSpec::try_from(over).expect_err("too large");
        assert!(
            matches!(&error, ServiceError::Invalid { field, .. } if field == "cost"),
            "{error:?}"
        );
    }

    #[test]
    fn converts_every_algorithm_of_an_inline_policy() {
        for (pb_algorithm, algorithm) in [
            (pb::Algorithm::FixedWindow, Algorithm::FixedWindow),
            (pb::Algorithm::SlidingWindow, Algorithm::SlidingWindow),
            (pb::Algorithm::TokenBucket, Algorithm::TokenBucket),
            (pb::Algorithm::LeakyBucket, Algorithm::LeakyBucket),
            (pb::Algorithm::SlidingLog, Algorithm::SlidingLog),
        ] {
            let policy = pb::Policy {
                algorithm: pb_algorithm.into(),
                limit: 10,
                window_ms: 1_000,
                burst: None,
                ..Default::default()
            };
            let spec = CheckSpec::try_from(request(
                "k",
                Some(2),
                pb::check_request::Policy::InlinePolicy(policy),
            ))
            .expect("valid");
            let PolicyRef::Inline(policy) = spec.policy else {
                panic!("inline expected");
            };
            assert_eq!(policy.algorithm(), algorithm);
            assert_eq!(spec.cost, 2);
        }
    }

    #[test]
    fn inline_namespaces_differ_by_every_parameter_and_cannot_be_names() {
        let p =
            |a, l, w: u64, b| Policy::try_new(a, l, Duration::from_millis(w), b).expect("valid");
        let base = inline_namespace(&p(Algorithm::TokenBucket, 10, 1_000, Some(5)));
        assert_eq!(base, "inline:token_bucket:10:1000:5");
        for other in [
            p(Algorithm::LeakyBucket, 10, 1_000, Some(5)),
            p(Algorithm::TokenBucket, 11, 1_000, Some(5)),
            p(Algorithm::TokenBucket, 10, 1_001, Some(5)),
            p(Algorithm::TokenBucket, 10, 1_000, Some(6)),
        ] {
            assert_ne!(inline_namespace(&other), base);
        }
        assert!(validate_policy_name(&base).is_err());
    }

    #[test]
    fn a_batch_validates_each_policy_even_after_a_valid_one() {
        let inline = |limit, burst| {
            pb::check_request::Policy::InlinePolicy(pb::Policy {
                algorithm: pb::Algorithm::FixedWindow.into(),
                limit,
                window_ms: 1_000,
                burst,
                ..Default::default()
            })
        };
        let name = |n: &str| pb::check_request::Policy::PolicyName(n.to_owned());
        let batch = |items: Vec<pb::CheckRequest>| pb::CheckBatchRequest { items, mode: 0 };
        let valid = BatchSpec::try_from(batch(vec![
            request("a", None, name("api")),
            request("b", None, name("api")),
            request("c", None, inline(10, None)),
            request("d", None, inline(10, None)),
            request("e", None, name("api")),
            request("f", None, inline(11, None)),
        ]))
        .expect("valid");
        let policies: Vec<&PolicyRef> = valid.items.iter().map(|s| &s.policy).collect();
        let p = |limit| {
            PolicyRef::Inline(
                Policy::try_new(Algorithm::FixedWindow, limit, Duration::from_secs(1), None)
                    .expect("valid"),
            )
        };
        let api = PolicyRef::Named("api".to_owned());
        assert_eq!(policies, [&api, &api, &p(10), &p(10), &api, &p(11)]);
        // A bad policy after a good one is still refused, naming its item,
        // whether it follows a named or an inline policy.
        let field = |r: Result<BatchSpec, ServiceError>| match r {
            Err(ServiceError::Invalid { field, .. }) => field,
            other => panic!("expected invalid, got {other:?}"),
        };
        let after_named = batch(vec![
            request("a", None, name("api")),
            request("b", None, name("api")),
            request("c", None, name("no spaces")),
        ]);
        assert_eq!(
            field(BatchSpec::try_from(after_named)),
            "items[2].policy_name"
        );
        let after_inline = batch(vec![
            request("a", None, inline(10, None)),
            request("b", None, inline(10, None)),
            request("c", None, inline(0, None)),
        ]);
        assert_eq!(
            field(BatchSpec::try_from(after_inline)),
            "items[2].inline_policy.limit"
        );
        let burst_changed = batch(vec![
            request("a", None, inline(10, None)),
            request("b", None, inline(10, Some(0))),
        ]);
        assert_eq!(
            field(BatchSpec::try_from(burst_changed)),
            "items[1].inline_policy.burst"
        );
        let named_between = batch(vec![
            request("a", None, inline(10, None)),
            request("b", None, name("api")),
            request("c", None, inline(0, None)),
        ]);
        assert_eq!(
            field(BatchSpec::try_from(named_between)),
            "items[2].inline_policy.limit"
        );
    }

    #[test]
    fn rejects_an_unknown_batch_mode_and_bad_sizes() {
        let batch = |n: usize, mode: i32| pb::CheckBatchRequest {
            items: vec![named_request("k"); n],
            mode,
        };
        let field = |r: Result<BatchSpec, ServiceError>| match r {
            Err(ServiceError::Invalid { field, .. }) => field,
            other => panic!("expected invalid, got {other:?}"),
        };
        assert_eq!(field(BatchSpec::try_from(batch(1, 9))), "mode");
        assert_eq!(field(BatchSpec::try_from(batch(0, 0))), "items");
        assert_eq!(field(BatchSpec::try_from(batch(1_001, 0))), "items");
        assert_eq!(
            BatchSpec::try_from(batch(1_000, 1)).expect("valid").mode,
            BatchMode::AllOrNothing
        );
    }
}
