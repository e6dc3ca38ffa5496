//! The `quotad.v1.Leases` gRPC service: shares of a key's budget, held by
//! the client and spent locally (quotad-core's grants; `docs/leases.md`).
//!
//! A handler runs the same steps as the Quota service's: convert the
//! request ([`LeaseSpec`]), resolve its key and policy against one
//! snapshot of the named policies and the server's limits, and only then
//! call the backend, once. A request rejected at any step has touched no
//! state; so has one the store refuses (an unknown or overspent lease).
//!
//! A backend failure is always the call's error (UNAVAILABLE, or INTERNAL
//! for a fault), whatever the policy's `on_error`: failing open would grant
//! budget nobody counted, and failing closed is what the error already
//! tells a client, which keeps spending the lease it holds until it ends.
//!
//! Lease ids on the wire are 32 lowercase hex digits: the grant's random
//! id, then the store time it ends at ([`LeaseId`]). The end rides along
//! so that a lease the store has already purged is still settled as ended
//! rather than unknown.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use metrics::Counter;
use quotad_core::grant::MAX_LEASE_TTL;
use quotad_core::{
    LeaseAnswer, LeaseAsk, LeaseOutcome, LeaseTerms, LeaseTermsError, MAX_EXACT, Policy, Settle,
    Settled,
};
use quotad_proto::v1 as pb;
use rand::Rng as _;
use tonic::{Request, Response, Status};

use super::RequestLimits;
use super::answer::store_failed;
use super::error::ServiceError;
use super::request::{
    PolicyRef, check_key_bytes, inline, inline_namespace, key, missing_policy, named,
};
use crate::backend::{Backend, Deadline, LeaseItem};
use crate::metrics::{LeaseCounters, LeaseEvent, Method, Metrics};
use crate::registry::{PolicyRegistry, PolicySet};

/// A `Lease` request, converted: every field checked that can be without
/// the server's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseSpec {
    pub(crate) key: String,
    pub(crate) policy: PolicyRef,
    /// The terms of an inline policy; `None` for a named one (its terms
    /// are the server's).
    pub(crate) inline_terms: Option<LeaseTerms>,
    pub(crate) want: u64,
    pub(crate) settle: Option<Settle>,
}

impl TryFrom<pb::LeaseRequest> for LeaseSpec {
    type Error = ServiceError;

    fn try_from(request: pb::LeaseRequest) -> Result<Self, Self::Error> {
        use pb::lease_request::Policy as P;
        let policy = match request.policy {
            Some(P::PolicyName(name)) => named(name)?,
            Some(P::InlinePolicy(policy)) => inline(&policy)?,
            None => return Err(missing_policy()),
        };
        let key = key(request.key)?;
        if request.want > MAX_EXACT {
            return Err(ServiceError::invalid(
                "want",
                format!("must be at most 2^53 = {MAX_EXACT} (got {})", request.want),
            ));
        }
        let settle = request.settle.map(settle).transpose()?;
        // A named policy's terms are the server's; what the request says
        // of terms is then ignored, as the proto documents.
        let inline_terms = match (&policy, request.inline_terms) {
            (PolicyRef::Named(_), _) => None,
            (PolicyRef::Inline(_), Some(terms)) => Some(lease_terms(&terms)?),
            (PolicyRef::Inline(_), None) => {
                return Err(ServiceError::invalid(
                    "inline_terms",
                    "must be set for an inline policy (its lease terms)",
                ));
            }
        };
        Ok(LeaseSpec {
            key,
            policy,
            inline_terms,
            want: request.want,
            settle,
        })
    }
}

fn settle(settle: pb::LeaseSettle) -> Result<Settle, ServiceError> {
    let LeaseId { id, ends_at } = settle.lease_id.parse().map_err(|_| {
        ServiceError::invalid(
            "settle.lease_id",
            "is not a lease id (32 lowercase hex digits, as a Lease answer gave it)",
        )
    })?;
    // No lease holds more than 2^53 units, and the bound keeps every value
    // exact in a Lua double, as `cost` is kept.
    if settle.spent > MAX_EXACT {
        return Err(ServiceError::invalid(
            "settle.spent",
            format!("must be at most 2^53 = {MAX_EXACT} (got {})", settle.spent),
        ));
    }
    Ok(Settle {
        id,
        ends_at,
        spent: settle.spent,
    })
}

/// An inline policy's lease terms, each broken rule naming its field.
fn lease_terms(terms: &pb::LeaseTerms) -> Result<LeaseTerms, ServiceError> {
    let ttl = Duration::from_millis(terms.max_ttl_ms);
    LeaseTerms::try_new(terms.max_units, terms.min_units, ttl).map_err(|e| {
        let (field, message) = match e {
            LeaseTermsError::ZeroMaxUnits => ("max_units", "must be at least 1".to_owned()),
            LeaseTermsError::MaxUnitsTooLarge => (
                "max_units",
                format!(
                    "must be at most 2^53 = {MAX_EXACT} (got {})",
                    terms.max_units
                ),
            ),
            LeaseTermsError::MinUnits {
                min_units,
                max_units,
            } => (
                "min_units",
                format!("must be from 1 to max_units ({max_units}), got {min_units}"),
            ),
            LeaseTermsError::MaxTtl => (
                "max_ttl_ms",
                format!(
                    "must be from 1 to {} (a day), got {}",
                    MAX_LEASE_TTL.as_millis(),
                    terms.max_ttl_ms
                ),
            ),
        };
        ServiceError::invalid(&format!("inline_terms.{field}"), message)
    })
}

/// A lease's name on the wire: its grant's id and the store time it ends
/// at, as 32 lowercase hex digits. Opaque to clients; unguessable by its
/// random id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseId {
    pub(crate) id: u64,
    pub(crate) ends_at: u64,
}

/// Text that is not a [`LeaseId`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a lease id")]
pub(crate) struct MalformedLeaseId;

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}{:016x}", self.id, self.ends_at)
    }
}

impl std::str::FromStr for LeaseId {
    type Err = MalformedLeaseId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        // One spelling per id: `from_str_radix` alone would also take
        // upper case and a leading `+`.
        let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if text.len() != 32 || !text.bytes().all(hex) {
            return Err(MalformedLeaseId);
        }
        let half = |part: &str| u64::from_str_radix(part, 16).map_err(|_| MalformedLeaseId);
        Ok(LeaseId {
            id: half(&text[..16])?,
            ends_at: half(&text[16..])?,
        })
    }
}

/// The answer for an outcome of the store.
fn response(outcome: &LeaseOutcome) -> pb::LeaseResponse {
    let (settled, returned) = match outcome.settled {
        None => (pb::Settled::Unspecified, 0),
        Some(Settled::Returned { returned }) => (pb::Settled::Returned, returned),
        Some(Settled::Ended) => (pb::Settled::Ended, 0),
    };
    let lease = match outcome.answer {
        LeaseAnswer::Granted(grant) => Some(pb::Lease {
            lease_id: LeaseId {
                id: grant.id,
                ends_at: grant.ends_at,
            }
            .to_string(),
            units: grant.units,
            // The store's own time at grant, so that clock offsets between
            // quotad and the store do not shorten or stretch it.
            ttl_ms: grant.ends_at.saturating_sub(grant.granted_at),
        }),
        LeaseAnswer::Direct | LeaseAnswer::None => None,
    };
    pb::LeaseResponse {
        lease,
        direct: outcome.answer == LeaseAnswer::Direct,
        settled: settled.into(),
        returned,
        remaining: outcome.remaining,
        limit: outcome.limit,
        reset_after_ms: outcome.reset_after_ms,
    }
}

/// The Leases service over a backend `S`.
#[derive(Debug)]
pub(crate) struct LeaseService<S> {
    backend: Arc<S>,
    policies: Arc<PolicyRegistry>,
    metrics: Arc<Metrics>,
    /// `on_error` is not read: a failed lease request is never answered
    /// as granted or denied (see [the module](self)).
    limits: RequestLimits,
    /// `quotad_store_operations_total{op="lease"}`.
    store_op: Counter,
}

/// A lease request's policy, resolved: the state namespace (the one
/// `Check` uses for the same policy), the policy, its lease terms and the
/// counters its outcomes go to.
struct Target<'a> {
    namespace: Cow<'a, str>,
    policy: Policy,
    terms: LeaseTerms,
    counters: &'a LeaseCounters,
}

impl<S: Backend> LeaseService<S> {
    pub(crate) fn new(
        backend: Arc<S>,
        policies: Arc<PolicyRegistry>,
        metrics: Arc<Metrics>,
        limits: RequestLimits,
    ) -> Self {
        let store_op = metrics.store_operation(backend.name(), "lease");
        LeaseService {
            backend,
            policies,
            metrics,
            limits,
            store_op,
        }
    }

    /// The target of `spec`: a named policy of `set` with lease settings,
    /// or an inline policy and terms within `[limits]`.
    fn target<'a>(
        &'a self,
        set: &'a PolicySet,
        spec: &LeaseSpec,
    ) -> Result<Target<'a>, ServiceError> {
        match &spec.policy {
            PolicyRef::Named(name) => {
                let (stored, named, active) =
                    set.get_for(name, &spec.key)
                        .ok_or_else(|| ServiceError::UnknownPolicy {
                            field: "policy_name".to_owned(),
                            name: name.clone(),
                        })?;
                let (Some(terms), Some(counters)) = (named.settings.lease, &named.leases) else {
                    return Err(ServiceError::invalid(
                        "policy_name",
                        format!(
                            "policy {name:?} has no lease settings (policies.{name}.lease): decide each request with Check"
                        ),
                    ));
                };
                Ok(Target {
                    namespace: Cow::Borrowed(stored),
                    policy: active.map_or(named.settings.policy, |a| a.policy),
                    terms,
                    counters,
                })
            }
            PolicyRef::Inline(policy) => {
                let limits = set.limits();
                if !limits.allow_inline_policies {
                    return Err(ServiceError::InlineDisabled {
                        field: "inline_policy".to_owned(),
                    });
                }
                limits.check_inline(policy).map_err(|(field, message)| {
                    ServiceError::invalid(&format!("inline_policy.{field}"), message)
                })?;
                if !policy.algorithm().is_rate() {
                    return Err(ServiceError::invalid(
                        "inline_policy.algorithm",
                        "a concurrency policy holds slots (Concurrency.Acquire), not leases",
                    ));
                }
                let terms = spec.inline_terms.ok_or_else(|| {
                    ServiceError::invalid("inline_terms", "must be set for an inline policy")
                })?;
                limits.check_lease(&terms).map_err(|(field, message)| {
                    ServiceError::invalid(&format!("inline_terms.{field}"), message)
                })?;
                Ok(Target {
                    namespace: Cow::Owned(inline_namespace(policy)),
                    policy: *policy,
                    terms,
                    counters: self.metrics.inline_leases(),
                })
            }
        }
    }

    async fn lease_one(
        &self,
        request: pb::LeaseRequest,
        deadline: Deadline,
    ) -> Result<pb::LeaseResponse, ServiceError> {
        let spec = LeaseSpec::try_from(request)?;
        check_key_bytes(&spec.key, self.limits.max_key_bytes)?;
        let set = self.policies.snapshot();
        let target = self.target(&set, &spec)?;
        let item = LeaseItem {
            name: &target.namespace,
            key: &spec.key,
            policy: target.policy,
            terms: target.terms,
            ask: LeaseAsk {
                settle: spec.settle,
                want: spec.want,
                // Unguessable: whoever presents a lease's id can return its
                // units, so ids come from a CSPRNG (the thread's, seeded by
                // the OS), never a counter.
                new_id: rand::rng().random(),
            },
        };
        self.store_op.increment(1);
        let outcome = match self.backend.lease(&item, deadline).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(refused)) => {
                target.counters.record(LeaseEvent::Refused);
                return Err(refused.into());
            }
            Err(error) => {
                store_failed(&error);
                target.counters.record(LeaseEvent::Refused);
                return Err(error.into());
            }
        };
        record(target.counters, &outcome);
        Ok(response(&outcome))
    }
}

/// Counts what became of the lease settled and of the one asked for.
fn record(counters: &LeaseCounters, outcome: &LeaseOutcome) {
    match outcome.settled {
        Some(Settled::Returned { returned }) => {
            counters.record(LeaseEvent::Returned);
            counters.returned_units(returned);
        }
        Some(Settled::Ended) => counters.record(LeaseEvent::Ended),
        None => {}
    }
    match outcome.answer {
        LeaseAnswer::Granted(grant) => {
            counters.record(LeaseEvent::Granted);
            counters.granted_units(grant.units);
        }
        LeaseAnswer::Direct => counters.record(LeaseEvent::Direct),
        LeaseAnswer::None => {}
    }
}

#[tonic::async_trait]
impl<S: Backend> pb::leases_server::Leases for LeaseService<S> {
    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let timeout = self.limits.request_timeout;
        super::serve(&self.metrics, Method::Lease, request, timeout, |r, d| {
            self.lease_one(r, d)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use quotad_core::{BatchMode, CheckItem, FakeClock, MemoryStore, OnFull, StoreConfig};

    use super::*;
    use crate::backend::{BackendError, BackendStats, ItemResult, LeaseResult};
    use crate::config::{Config, OnError};

    #[test]
    fn lease_ids_round_trip_and_anything_else_is_malformed() {
        for id in [
            LeaseId { id: 0, ends_at: 0 },
            LeaseId {
                id: u64::MAX,
                ends_at: 1_767_268_840_000,
            },
        ] {
            let text = id.to_string();
            assert_eq!(text.len(), 32);
            assert_eq!(text.parse(), Ok(id));
        }
        let good = LeaseId { id: 7, ends_at: 9 }.to_string();
        for bad in [
            String::new(),
            good[..31].to_owned(),
            format!("{good}0"),
            good.to_uppercase().replace('0', "A"),
            format!("+{}", &good[1..]),
            format!("g{}", &good[1..]),
            format!("é{}", &good[2..]),
        ] {
            assert_eq!(bad.parse::<LeaseId>(), Err(MalformedLeaseId), "{bad:?}");
        }
    }

    fn request(policy: pb::lease_request::Policy) -> pb::LeaseRequest {
        pb::LeaseRequest {
            key: "k".to_owned(),
            policy: Some(policy),
            inline_terms: None,
            want: 10,
            settle: None,
        }
    }

    fn named_request() -> pb::LeaseRequest {
        request(pb::lease_request::Policy::PolicyName("api".to_owned()))
    }

    fn inline_request(terms: Option<pb::LeaseTerms>) -> pb::LeaseRequest {
        let policy = pb::Policy {
            algorithm: pb::Algorithm::FixedWindow.into(),
            limit: 100,
            window_ms: 60_000,
            burst: None,
            ..Default::default()
        };
        pb::LeaseRequest {
            inline_terms: terms,
            ..request(pb::lease_request::Policy::InlinePolicy(policy))
        }
    }

    fn field(result: Result<LeaseSpec, ServiceError>) -> String {
        match result {
            Err(ServiceError::Invalid { field, .. }) => field,
            other => panic!("expected invalid, got {other:?}"),
        }
    }

    #[test]
    fn a_request_names_the_field_it_breaks() {
        let spec = LeaseSpec::try_from(named_request()).expect("valid");
        assert_eq!(spec.want, 10);
        assert_eq!(spec.settle, None);
        let with = |edit: fn(&mut pb::LeaseRequest)| {
            let mut r = named_request();
            edit(&mut r);
            LeaseSpec::try_from(r)
        };
        assert_eq!(field(with(|r| r.key.clear())), "key");
        assert_eq!(field(with(|r| r.policy = None)), "policy");
        assert_eq!(field(with(|r| r.want = MAX_EXACT + 1)), "want");
        assert!(with(|r| r.want = MAX_EXACT).is_ok());
        let settle = |lease_id: &str, spent| pb::LeaseSettle {
            lease_id: lease_id.to_owned(),
            spent,
        };
        let id = LeaseId { id: 1, ends_at: 2 }.to_string();
        let mut r = named_request();
        r.settle = Some(settle(&id, 3));
        let spec = LeaseSpec::try_from(r).expect("valid");
        assert_eq!(
            spec.settle,
            Some(Settle {
                id: 1,
                ends_at: 2,
                spent: 3
            })
        );
        let mut r = named_request();
        r.settle = Some(settle("not-an-id", 3));
        assert_eq!(field(LeaseSpec::try_from(r)), "settle.lease_id");
        let mut r = named_request();
        r.settle = Some(settle(&id, MAX_EXACT + 1));
        assert_eq!(field(LeaseSpec::try_from(r)), "settle.spent");
    }

    #[test]
    fn inline_terms_are_required_and_checked_only_for_an_inline_policy() {
        let terms = |max_units, min_units, max_ttl_ms| pb::LeaseTerms {
            max_units,
            min_units,
            max_ttl_ms,
        };
        assert_eq!(
            field(LeaseSpec::try_from(inline_request(None))),
            "inline_terms"
        );
        let ok = LeaseSpec::try_from(inline_request(Some(terms(10, 2, 1_000)))).expect("valid");
        assert_eq!(
            ok.inline_terms
                .map(|t| (t.max_units(), t.min_units(), t.max_ttl_ms())),
            Some((10, 2, 1_000))
        );
        for (bad, name) in [
            (terms(0, 1, 1_000), "inline_terms.max_units"),
            (terms(MAX_EXACT + 1, 1, 1_000), "inline_terms.max_units"),
            (terms(10, 0, 1_000), "inline_terms.min_units"),
            (terms(10, 11, 1_000), "inline_terms.min_units"),
            (terms(10, 1, 0), "inline_terms.max_ttl_ms"),
            (terms(10, 1, 86_400_001), "inline_terms.max_ttl_ms"),
        ] {
            assert_eq!(field(LeaseSpec::try_from(inline_request(Some(bad)))), name);
        }
        // A named policy's terms are the server's: whatever is sent is
        // ignored.
        let mut r = named_request();
        r.inline_terms = Some(terms(0, 0, 0));
        assert_eq!(LeaseSpec::try_from(r).expect("valid").inline_terms, None);
    }

    /// A backend that always fails.
    struct Down;

    impl Backend for Down {
        fn name(&self) -> &'static str {
            "down"
        }
        async fn check_one(&self, _: &CheckItem<'_>, _: Deadline) -> ItemResult {
            Err(down())
        }
        async fn check(
            &self,
            items: &[CheckItem<'_>],
            _: BatchMode,
            _: Deadline,
        ) -> Vec<ItemResult> {
            vec![Err(down()); items.len()]
        }
        async fn peek(&self, _: &CheckItem<'_>, _: Deadline) -> ItemResult {
            Err(down())
        }
        async fn lease(&self, _: &LeaseItem<'_>, _: Deadline) -> LeaseResult {
            Err(down())
        }
        async fn acquire(&self, _: &CheckItem<'_>, _: Deadline) -> crate::backend::AcquireResult {
            Err(down())
        }
        async fn renew(
            &self,
            _: &crate::backend::SlotItem<'_>,
            _: Deadline,
        ) -> crate::backend::SlotResult {
            Err(down())
        }
        async fn release(
            &self,
            _: &crate::backend::SlotItem<'_>,
            _: Deadline,
        ) -> crate::backend::SlotResult {
            Err(down())
        }
        async fn reset(
            &self,
            _: &str,
            _: &Policy,
            _: &str,
            _: Deadline,
        ) -> Result<(), BackendError> {
            Err(down())
        }
        crate::backend::keeps_no_overrides!();

        fn stats(&self) -> BackendStats {
            BackendStats::default()
        }
    }

    fn down() -> BackendError {
        BackendError::from(crate::backend::NotRun::NotConnected)
    }

    const FAIL_OPEN: &str = r#"
        [policies.api]
        algorithm = "fixed_window"
        limit = 100
        window = "1m"
        on_error = "fail_open"
        lease = { max_units = 10, max_ttl = "10s" }

        [policies.plain]
        algorithm = "fixed_window"
        limit = 100
        window = "1m"
    "#;

    fn service<B: Backend>(backend: B) -> LeaseService<B> {
        let config = Config::from_toml(FAIL_OPEN).expect("valid config");
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let set = PolicySet::new(config.policies(), config.limits(), &metrics);
        LeaseService::new(
            Arc::new(backend),
            Arc::new(PolicyRegistry::new(set)),
            metrics,
            RequestLimits {
                max_key_bytes: 8,
                on_error: OnError::FailOpen,
                request_timeout: Duration::from_secs(1),
            },
        )
    }

    #[tokio::test]
    async fn a_store_failure_never_grants_whatever_on_error_says() {
        let service = service(Down);
        let deadline = Deadline::after(Duration::from_secs(1));
        let error = service
            .lease_one(named_request(), deadline)
            .await
            .expect_err("the store is down");
        assert!(
            matches!(error, ServiceError::Backend(BackendError::Unavailable(_))),
            "{error:?}"
        );
        let text = service.metrics.render();
        assert!(
            text.contains(r#"quotad_leases_total{policy="api",outcome="refused"} 1"#),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_policy_without_lease_settings_and_a_long_key_are_refused_before_the_store() {
        let store = StoreConfig::try_new(1_000, 4, OnFull::Deny).expect("valid store");
        let service = service(MemoryStore::new(store, Arc::new(FakeClock::new(0))));
        let deadline = Deadline::after(Duration::from_secs(1));
        let mut plain = named_request();
        plain.policy = Some(pb::lease_request::Policy::PolicyName("plain".to_owned()));
        let error = service
            .lease_one(plain, deadline)
            .await
            .expect_err("no lease");
        assert!(
            error
                .to_string()
                .starts_with("policy_name: policy \"plain\" has no lease settings"),
            "{error}"
        );
        let mut long = named_request();
        long.key = "a-key-too-long".to_owned();
        let error = service
            .lease_one(long, deadline)
            .await
            .expect_err("too long");
        assert!(
            error
                .to_string()
                .starts_with("key: must be at most 8 bytes"),
            "{error}"
        );
        assert_eq!(service.backend.live_keys(), 0, "nothing created");
        let granted = service
            .lease_one(named_request(), deadline)
            .await
            .expect("granted");
        let lease = granted.lease.expect("a lease");
        assert_eq!((lease.units, lease.ttl_ms), (10, 10_000));
        assert_eq!(granted.remaining, 90);
    }
}
