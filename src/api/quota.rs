//! The `quotad.v1.Quota` gRPC service.
//!
//! Every handler runs the same steps: convert the protobuf request to
//! domain values ([`super::request`]), resolve each policy against one
//! snapshot of the named policies and the server's limits, build every
//! backend item, and only then call the backend, once. A request rejected at
//! any step has touched no state. Errors become a gRPC status in one
//! function ([`super::error::to_status`]); timings, errors and decisions go
//! to the metrics.
//!
//! Decisions of `Check` and `CheckBatch` are counted in
//! `quotad_decisions_total`; `Peek` consumes nothing and is not counted
//! there.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use quotad_core::{BatchMode, CheckItem, Decision, Policy, Reason};
use quotad_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::answer::{Answer, StoreOps, on_backend_error, store_failed};
use super::error::ServiceError;
use super::request::{
    BatchSpec, CheckSpec, PolicyRef, ResetSpec, check_key_bytes, decision_to_pb, inline_namespace,
};
use crate::auth::Origin;
use crate::backend::{Atomicity, Backend, BackendError, Deadline, ItemResult};
use crate::config::{OnError, ResetAccess};
use crate::metrics::{DecisionCounters, DecisionTally, Method, Metrics};
use crate::registry::{PolicyRegistry, PolicySet};

/// What the service enforces on every request from the settings that take
/// a restart; `[limits]` reload with the policies ([`PolicySet::limits`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RequestLimits {
    pub(crate) max_key_bytes: usize,
    /// `store.on_error`, for inline policies.
    pub(crate) on_error: OnError,
    /// `transport.request_timeout`: tonic ends every call after it.
    pub(crate) request_timeout: Duration,
}

/// The Quota service over a backend `S`.
#[derive(Debug)]
pub(crate) struct QuotaService<S> {
    backend: Arc<S>,
    policies: Arc<PolicyRegistry>,
    metrics: Arc<Metrics>,
    limits: RequestLimits,
    store_ops: StoreOps,
}

/// A request's policy, resolved: the state namespace, the policy and the
/// counters its decisions go to.
#[derive(Clone)]
struct Target<'a> {
    namespace: Cow<'a, str>,
    policy: Policy,
    on_error: OnError,
    decisions: &'a DecisionCounters,
}

impl<'a> Target<'a> {
    /// The item of `key` and `cost`: for a concurrency policy, an acquire
    /// of a slot with a new random id (a `Peek` of it takes nothing).
    fn item<'k>(&'k self, key: &'k str, cost: u64) -> Result<CheckItem<'k>, ServiceError> {
        if self.policy.algorithm().is_rate() {
            Ok(CheckItem::new(&self.namespace, self.policy, key, cost)?)
        } else {
            let id = super::concurrency::new_slot_id();
            Ok(CheckItem::acquire(
                &self.namespace,
                self.policy,
                key,
                cost,
                id,
            )?)
        }
    }

    /// What a check answers when the backend failed ([`on_backend_error`]
    /// with the policy's `on_error`).
    fn on_backend_error(
        &self,
        error: &BackendError,
        answer: Answer,
    ) -> Result<Decision, ServiceError> {
        on_backend_error(error, self.on_error, &self.policy, answer)
    }
}

/// The decision for a lone check's result: decided, or what its target's
/// `on_error` answers for the whole call.
fn resolve_one(target: &Target<'_>, result: ItemResult) -> Result<Decision, ServiceError> {
    result.or_else(|error| {
        store_failed(&error);
        target.on_backend_error(&error, Answer::Whole)
    })
}

/// The decisions for a batch's results: decided items stand, and each
/// failed one gets its own target's `on_error` (or the error, if any such
/// target wants it passed on). An all-or-nothing batch stays all or
/// nothing: when it failed, one item failing closed denies every item.
fn resolve_results(
    targets: &Targets<'_>,
    results: Vec<ItemResult>,
    answer: Answer,
) -> Result<Vec<Decision>, ServiceError> {
    let mut failed = false;
    let mut decisions = results
        .into_iter()
        .enumerate()
        .map(|(i, result)| {
            result.or_else(|error| {
                if !failed {
                    store_failed(&error);
                }
                failed = true;
                targets.of(i).on_backend_error(&error, answer)
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if failed && answer == Answer::Whole && decisions.iter().any(|d| !d.allowed) {
        for d in &mut decisions {
            d.allowed = false;
            d.reason = Reason::FailClosed;
        }
    }
    Ok(decisions)
}

/// A batch's policy (`mixed` when its items name several), algorithm and
/// outcome (`mixed` when some items were allowed and some denied) on the
/// call's span.
fn record_batch(targets: &Targets<'_>, decisions: &[Decision]) {
    if !crate::grpc::trace::recording() {
        return;
    }
    fn one<'s>(mut values: impl Iterator<Item = &'s str>) -> &'s str {
        let first = values.next().unwrap_or("none");
        if values.all(|v| v == first) {
            first
        } else {
            "mixed"
        }
    }
    let policy = one(targets
        .distinct
        .iter()
        .map(|t| crate::trace::policy_label(&t.namespace)));
    let algorithm = one(targets
        .distinct
        .iter()
        .map(|t| t.policy.algorithm().as_str()));
    let outcome = one(decisions
        .iter()
        .map(|d| if d.allowed { "allowed" } else { "denied" }));
    crate::grpc::trace::record(policy, algorithm, outcome, Some(decisions.len()));
}

/// How many of a batch's most recently resolved policies an item's policy
/// is compared with before it is resolved again: enough for the batches
/// clients send (one policy, or a few interleaved, such as per-second and
/// per-day limits of each user), and a bound on the work a batch of 1,000
/// distinct policies can cause.
const RECENT_TARGETS: usize = 8;

/// The targets of a batch's items. Each policy a batch names is resolved
/// once (its lookup, its inline limits and namespace), not once per item,
/// and items refer to their target by index.
struct Targets<'a> {
    distinct: Vec<Target<'a>>,
    of_item: Vec<usize>,
}

impl<'a> Targets<'a> {
    /// The target of item `i`.
    fn of(&self, i: usize) -> &Target<'a> {
        &self.distinct[self.of_item[i]]
    }

    /// Counts every decision under its target's counters: one increment
    /// per target, reason and outcome.
    fn record(&self, decisions: &[Decision]) {
        let mut tallies = vec![DecisionTally::default(); self.distinct.len()];
        for (&t, decision) in self.of_item.iter().zip(decisions) {
            tallies[t].add(decision);
        }
        for (target, tally) in self.distinct.iter().zip(&tallies) {
            target.decisions.record_tally(tally);
        }
    }
}

impl<S: Backend> QuotaService<S> {
    pub(crate) fn new(
        backend: Arc<S>,
        policies: Arc<PolicyRegistry>,
        metrics: Arc<Metrics>,
        limits: RequestLimits,
    ) -> Self {
        let name = backend.name();
        let store_ops = StoreOps::new(&metrics, name);
        QuotaService {
            backend,
            policies,
            metrics,
            limits,
            store_ops,
        }
    }

    /// Resolves a request's key and policy against the server's limits and
    /// the named policies in `set`.
    fn resolve<'a>(
        &'a self,
        set: &'a PolicySet,
        key: &str,
        policy: &PolicyRef,
    ) -> Result<Target<'a>, ServiceError> {
        self.check_key(key)?;
        self.target(set, policy, key)
    }

    /// Resolves every item of a batch, reporting the first item that
    /// fails, as [`QuotaService::resolve`] would one by one.
    fn resolve_batch<'a>(
        &'a self,
        set: &'a PolicySet,
        items: &[CheckSpec],
    ) -> Result<Targets<'a>, ServiceError> {
        let mut resolved: Vec<(&PolicyRef, Target<'a>)> = Vec::new();
        let mut of_item = Vec::with_capacity(items.len());
        for (i, spec) in items.iter().enumerate() {
            self.check_key(&spec.key).map_err(|e| e.at_item(i))?;
            let recent = resolved.len().saturating_sub(RECENT_TARGETS);
            // A policy with overrides may count each key by other numbers.
            let per_key = matches!(&spec.policy, PolicyRef::Named(n) if set.has_overrides(n));
            let known = resolved[recent..]
                .iter()
                .rposition(|(policy, _)| !per_key && **policy == spec.policy);
            let index = match known {
                Some(at) => recent + at,
                None => {
                    let target = self
                        .target(set, &spec.policy, &spec.key)
                        .map_err(|e| e.at_item(i))?;
                    resolved.push((&spec.policy, target));
                    resolved.len() - 1
                }
            };
            of_item.push(index);
        }
        Ok(Targets {
            distinct: resolved.into_iter().map(|(_, target)| target).collect(),
            of_item,
        })
    }

    fn check_key(&self, key: &str) -> Result<(), ServiceError> {
        check_key_bytes(key, self.limits.max_key_bytes)
    }

    /// The target of `policy` for `key`: a named policy of `set` (with
    /// the key's override, if one is in force), or an inline policy within
    /// `[limits]`.
    fn target<'a>(
        &'a self,
        set: &'a PolicySet,
        policy: &PolicyRef,
        key: &str,
    ) -> Result<Target<'a>, ServiceError> {
        match policy {
            PolicyRef::Named(name) => {
                let (stored, named, active) =
                    set.get_for(name, key)
                        .ok_or_else(|| ServiceError::UnknownPolicy {
                            field: "policy_name".to_owned(),
                            name: name.clone(),
                        })?;
                Ok(Target {
                    namespace: Cow::Borrowed(stored),
                    policy: active.map_or(named.settings.policy, |a| a.policy),
                    on_error: named.settings.on_error,
                    decisions: &named.decisions,
                })
            }
            PolicyRef::Inline(policy) => {
                if !set.limits().allow_inline_policies {
                    return Err(ServiceError::InlineDisabled {
                        field: "inline_policy".to_owned(),
                    });
                }
                set.limits()
                    .check_inline(policy)
                    .map_err(|(field, message)| {
                        ServiceError::invalid(&format!("inline_policy.{field}"), message)
                    })?;
                Ok(Target {
                    namespace: Cow::Owned(inline_namespace(policy)),
                    policy: *policy,
                    on_error: self.limits.on_error,
                    decisions: self.metrics.inline_policy(policy.algorithm()),
                })
            }
        }
    }

    async fn decide_one(
        &self,
        request: pb::CheckRequest,
        deadline: Deadline,
    ) -> Result<pb::CheckResponse, ServiceError> {
        let spec = CheckSpec::try_from(request)?;
        let set = self.policies.snapshot();
        let target = self.resolve(&set, &spec.key, &spec.policy)?;
        if !target.policy.algorithm().is_rate() {
            // A lone acquire is Concurrency.Acquire, which answers its slot.
            return Err(ServiceError::invalid(
                super::concurrency::policy_field(&spec.policy),
                "a concurrency policy is acquired, not checked: use Concurrency.Acquire (or an item of CheckBatch, whose decision carries the slot)",
            ));
        }
        let item = target.item(&spec.key, spec.cost)?;
        self.store_ops.check.increment(1);
        let result = self.backend.check_one(&item, deadline).await;
        let decision = resolve_one(&target, result)?;
        target.decisions.record(&decision);
        crate::grpc::trace::record(
            crate::trace::policy_label(&target.namespace),
            target.policy.algorithm().as_str(),
            if decision.allowed {
                "allowed"
            } else {
                "denied"
            },
            None,
        );
        Ok(pb::CheckResponse {
            decision: Some(decision_to_pb(&decision)),
        })
    }

    async fn decide_batch(
        &self,
        request: pb::CheckBatchRequest,
        deadline: Deadline,
    ) -> Result<pb::CheckBatchResponse, ServiceError> {
        let batch = BatchSpec::try_from(request)?;
        let set = self.policies.snapshot();
        let targets = self.resolve_batch(&set, &batch.items)?;
        let items = batch
            .items
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                targets
                    .of(i)
                    .item(&spec.key, spec.cost)
                    .map_err(|e| e.at_item(i))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // An acquire takes a slot its caller must hold and release: only an
        // all-or-nothing batch, which its caller builds on purpose, may
        // carry one (clients coalesce plain checks into independent ones).
        if batch.mode == BatchMode::Independent
            && let Some(i) = items.iter().position(|item| item.slot().is_some())
        {
            return Err(ServiceError::invalid(
                &format!("items[{i}]"),
                "a concurrency policy is acquired with Concurrency.Acquire, or as an item of an ALL_OR_NOTHING batch; an independent batch may not take slots",
            ));
        }
        // A batch the store refuses by its size is not a call to it.
        if batch.mode == BatchMode::Independent
            || self.backend.atomicity(items.iter().copied()) != Atomicity::TooLarge
        {
            self.store_ops.check_batch.increment(1);
        }
        let results = self.backend.check(&items, batch.mode, deadline).await;
        let decisions = resolve_results(&targets, results, Answer::of(batch.mode))?;
        targets.record(&decisions);
        record_batch(&targets, &decisions);
        Ok(pb::CheckBatchResponse {
            decisions: decisions
                .iter()
                .zip(&items)
                .map(|(decision, item)| match item.slot() {
                    // An acquire decided by the store holds the slot it
                    // asked for (one answered open holds none).
                    Some(id) if decision.reason == Reason::WithinLimit => {
                        let slot = quotad_core::Grant {
                            id,
                            units: item.cost().get(),
                            granted_at: 0,
                            ends_at: item.policy().slot_ttl_ms(),
                        };
                        super::concurrency::acquire_decision_to_pb(decision, Some(&slot))
                    }
                    _ => decision_to_pb(decision),
                })
                .collect(),
        })
    }

    async fn peek_one(
        &self,
        request: pb::CheckRequest,
        deadline: Deadline,
    ) -> Result<pb::CheckResponse, ServiceError> {
        let spec = CheckSpec::try_from(request)?;
        let set = self.policies.snapshot();
        let target = self.resolve(&set, &spec.key, &spec.policy)?;
        let item = target.item(&spec.key, spec.cost)?;
        self.store_ops.peek.increment(1);
        let result = self.backend.peek(&item, deadline).await;
        let decision = resolve_one(&target, result)?;
        Ok(pb::CheckResponse {
            decision: Some(decision_to_pb(&decision)),
        })
    }

    async fn reset_one(
        &self,
        request: pb::ResetRequest,
        origin: Origin,
        deadline: Deadline,
    ) -> Result<pb::ResetResponse, ServiceError> {
        let set = self.policies.snapshot();
        match (set.limits().allow_reset, origin) {
            (ResetAccess::Nobody, _) => return Err(ServiceError::ResetDisabled),
            (ResetAccess::Local, Origin::Remote(from)) => {
                let from = from.map_or_else(
                    || "an unknown address".to_owned(),
                    |a| std::net::SocketAddr::new(a.ip().to_canonical(), a.port()).to_string(),
                );
                return Err(ServiceError::ResetNotLocal { from });
            }
            (ResetAccess::Local, Origin::Local | Origin::Authenticated)
            | (ResetAccess::Anyone, _) => {}
        }
        let spec = ResetSpec::try_from(request)?;
        let target = self.resolve(&set, &spec.key, &spec.policy)?;
        self.store_ops.reset.increment(1);
        self.backend
            .reset(&target.namespace, &target.policy, &spec.key, deadline)
            .await
            .inspect_err(store_failed)?;
        Ok(pb::ResetResponse {})
    }
}

#[tonic::async_trait]
impl<S: Backend> pb::quota_server::Quota for QuotaService<S> {
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let timeout = self.limits.request_timeout;
        super::serve(&self.metrics, Method::Check, request, timeout, |r, d| {
            self.decide_one(r, d)
        })
        .await
    }

    async fn check_batch(
        &self,
        request: Request<pb::CheckBatchRequest>,
    ) -> Result<Response<pb::CheckBatchResponse>, Status> {
        let timeout = self.limits.request_timeout;
        super::serve(
            &self.metrics,
            Method::CheckBatch,
            request,
            timeout,
            |r, d| self.decide_batch(r, d),
        )
        .await
    }

    async fn peek(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let timeout = self.limits.request_timeout;
        super::serve(&self.metrics, Method::Peek, request, timeout, |r, d| {
            self.peek_one(r, d)
        })
        .await
    }

    async fn reset(
        &self,
        request: Request<pb::ResetRequest>,
    ) -> Result<Response<pb::ResetResponse>, Status> {
        let timeout = self.limits.request_timeout;
        let origin = Origin::of(&request);
        super::serve(&self.metrics, Method::Reset, request, timeout, |r, d| {
            self.reset_one(r, origin, d)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use quotad_core::{Algorithm, FakeClock, MemoryStore, OnFull, StoreConfig};

    use super::*;
    use crate::config::Config;

    /// One target per item, as a batch of distinct policies resolves.
    fn one_per_item<'a>(targets: &[Target<'a>]) -> Targets<'a> {
        Targets {
            distinct: targets.to_vec(),
            of_item: (0..targets.len()).collect(),
        }
    }

    fn decided(allowed: bool) -> Decision {
        Decision {
            allowed,
            limit: 10,
            remaining: 3,
            retry_after_ms: 0,
            reset_after_ms: 1_000,
            reason: if allowed {
                Reason::WithinLimit
            } else {
                Reason::LimitExceeded
            },
        }
    }

    #[test]
    fn store_failures_follow_each_targets_on_error_and_keep_what_was_decided() {
        let metrics = Metrics::new().expect("metrics");
        let counters = metrics.named_policy("p", Algorithm::FixedWindow);
        let policy = Policy::try_new(Algorithm::FixedWindow, 10, Duration::from_secs(1), None)
            .expect("valid");
        let target = |on_error| Target {
            namespace: Cow::Borrowed("p"),
            policy,
            on_error,
            decisions: &counters,
        };
        let targets = one_per_item(&[
            target(OnError::FailOpen),
            target(OnError::FailClosed),
            target(OnError::FailOpen),
        ]);
        let down = || BackendError::from(crate::backend::NotRun::NotConnected);
        let all_down = |n: usize| vec![Err(down()); n];

        let each = resolve_results(&targets, all_down(3), Answer::PerItem).expect("answers");
        let reasons: Vec<Reason> = each.iter().map(|d| d.reason).collect();
        assert_eq!(
            reasons,
            [Reason::FailOpen, Reason::FailClosed, Reason::FailOpen]
        );

        let all = resolve_results(&targets, all_down(3), Answer::Whole).expect("answers");
        assert!(
            all.iter()
                .all(|d| !d.allowed && d.reason == Reason::FailClosed)
        );

        // A partly failed independent batch: decided items stand.
        let partial = vec![Ok(decided(true)), Err(down()), Ok(decided(false))];
        let mixed = resolve_results(&targets, partial, Answer::PerItem).expect("answers");
        assert_eq!(mixed[0], decided(true));
        assert_eq!(mixed[1].reason, Reason::FailClosed);
        assert_eq!(mixed[2], decided(false));

        // `error` passes the failure on: as the call's error for a lone
        // check or an all-or-nothing batch, as the item's reason in an
        // independent batch whose other items stand.
        let strict = one_per_item(&[target(OnError::Error)]);
        assert!(resolve_results(&strict, all_down(1), Answer::Whole).is_err());
        let both = one_per_item(&[target(OnError::Error), target(OnError::FailOpen)]);
        let one_down = vec![Err(down()), Ok(decided(true))];
        let answered = resolve_results(&both, one_down, Answer::PerItem).expect("answers");
        assert_eq!(
            (answered[0].allowed, answered[0].reason),
            (false, Reason::Unavailable)
        );
        assert_eq!(answered[1], decided(true));
        assert!(resolve_results(&both, all_down(2), Answer::Whole).is_err());
        // A bug in the store is never failed open.
        let bug = || Err(BackendError::Internal("bad reply".into()));
        assert!(resolve_one(targets.of(0), bug()).is_err());
        let faulty = resolve_results(&targets, vec![bug(), Ok(decided(true))], Answer::PerItem)
            .expect("answers");
        assert_eq!(
            (faulty[0].allowed, faulty[0].reason),
            (false, Reason::Unavailable),
            "a fault is never failed open, and does not fail the consumed items"
        );

        // A decided all-or-nothing batch is answered as decided.
        let decided_all = vec![Ok(decided(true)), Ok(decided(false)), Ok(decided(true))];
        let kept = resolve_results(&targets, decided_all, Answer::Whole).expect("answers");
        assert_eq!(kept[0], decided(true));
    }

    /// A service over a memory store, with the policies of `toml`.
    fn service(toml: &str) -> QuotaService<MemoryStore> {
        let config = Config::from_toml(toml).expect("valid config");
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let set = PolicySet::new(config.policies(), config.limits(), &metrics);
        let store = StoreConfig::try_new(10_000, 4, OnFull::Deny).expect("valid store");
        QuotaService::new(
            Arc::new(MemoryStore::new(store, Arc::new(FakeClock::new(0)))),
            Arc::new(PolicyRegistry::new(set)),
            metrics,
            RequestLimits {
                max_key_bytes: 8,
                on_error: OnError::Error,
                request_timeout: Duration::from_secs(1),
            },
        )
    }

    const TWO_POLICIES: &str = r#"
        [policies.api]
        algorithm = "fixed_window"
        limit = 2
        window = "1m"

        [policies.day]
        algorithm = "fixed_window"
        limit = 100
        window = "1d"
    "#;

    fn inline(limit: u64) -> PolicyRef {
        PolicyRef::Inline(
            Policy::try_new(Algorithm::TokenBucket, limit, Duration::from_secs(1), None)
                .expect("valid"),
        )
    }

    fn spec(key: &str, policy: PolicyRef) -> CheckSpec {
        CheckSpec {
            key: key.to_owned(),
            cost: 1,
            policy,
        }
    }

    #[test]
    fn a_batch_resolves_each_policy_once_and_every_item_to_its_own() {
        let service = service(TWO_POLICIES);
        let set = service.policies.snapshot();
        let api = || PolicyRef::Named("api".to_owned());
        let day = || PolicyRef::Named("day".to_owned());
        let items = [
            spec("a", api()),
            spec("a", day()),
            spec("b", api()),
            spec("b", day()),
            spec("c", inline(5)),
            spec("d", inline(5)),
            spec("e", inline(6)),
            spec("f", api()),
        ];
        let targets = service.resolve_batch(&set, &items).expect("valid");
        assert_eq!(
            targets.distinct.len(),
            4,
            "api, day and two inline policies"
        );
        for (i, item) in items.iter().enumerate() {
            let expected = service
                .resolve(&set, &item.key, &item.policy)
                .expect("valid");
            let target = targets.of(i);
            assert_eq!(target.namespace, expected.namespace, "item {i}");
            assert_eq!(target.policy, expected.policy, "item {i}");
        }
        // More distinct policies than are remembered: every item still gets
        // its own.
        let many: Vec<CheckSpec> = (1..=3 * RECENT_TARGETS as u64)
            .chain(1..=3 * RECENT_TARGETS as u64)
            .map(|limit| spec("k", inline(limit)))
            .collect();
        let targets = service.resolve_batch(&set, &many).expect("valid");
        for (i, item) in many.iter().enumerate() {
            let PolicyRef::Inline(policy) = &item.policy else {
                unreachable!("inline items")
            };
            assert_eq!(
                targets.of(i).namespace,
                inline_namespace(policy),
                "item {i}"
            );
        }
    }

    #[test]
    fn a_batch_refuses_the_first_bad_item_even_after_its_policy_resolved() {
        let service = service(TWO_POLICIES);
        let set = service.policies.snapshot();
        let field = |items: &[CheckSpec]| match service.resolve_batch(&set, items) {
            Err(
                ServiceError::Invalid { field, .. } | ServiceError::UnknownPolicy { field, .. },
            ) => field,
            Err(other) => panic!("unexpected error {other:?}"),
            Ok(_) => panic!("expected an error"),
        };
        let api = || PolicyRef::Named("api".to_owned());
        let long_key = [
            spec("a", api()),
            spec("b", api()),
            spec("too-long-key", api()),
        ];
        assert_eq!(field(&long_key), "items[2].key");
        let unknown = [
            spec("a", api()),
            spec("b", api()),
            spec("c", PolicyRef::Named("nope".to_owned())),
            spec("d", api()),
        ];
        assert_eq!(field(&unknown), "items[2].policy_name");
        let too_big = [spec("a", inline(5)), spec("b", inline(2_000_000))];
        assert_eq!(field(&too_big), "items[1].inline_policy.limit");
    }

    #[tokio::test]
    async fn a_batch_counts_each_decision_under_its_own_policy() {
        let service = service(TWO_POLICIES);
        let item = |key: &str, policy: &str| pb::CheckRequest {
            key: key.to_owned(),
            cost: None,
            policy: Some(pb::check_request::Policy::PolicyName(policy.to_owned())),
        };
        let request = pb::CheckBatchRequest {
            // "u" under `api` (limit 2): allowed, allowed, denied.
            items: vec![
                item("u", "api"),
                item("u", "day"),
                item("u", "api"),
                item("v", "day"),
                item("u", "api"),
            ],
            mode: pb::BatchMode::Independent.into(),
        };
        let deadline = Deadline::after(Duration::from_secs(1));
        let response = service
            .decide_batch(request, deadline)
            .await
            .expect("decided");
        let allowed: Vec<bool> = response.decisions.iter().map(|d| d.allowed).collect();
        assert_eq!(allowed, [true, true, true, true, false]);
        let text = service.metrics.render();
        for (series, count) in [
            (
                r#"policy="api",algorithm="fixed_window",outcome="allowed",reason="within_limit"} "#,
                2,
            ),
            (
                r#"policy="api",algorithm="fixed_window",outcome="denied",reason="limit_exceeded"} "#,
                1,
            ),
            (
                r#"policy="day",algorithm="fixed_window",outcome="allowed",reason="within_limit"} "#,
                2,
            ),
        ] {
            assert!(
                text.contains(&format!("quotad_decisions_total{{{series}{count}")),
                "{series}{count} in\n{text}"
            );
        }
    }

    /// A `Reset` of `key` under `api` as it arrives from `from` (`None`:
    /// the unix socket).
    async fn reset_from(
        service: &QuotaService<MemoryStore>,
        key: &str,
        from: Option<&str>,
    ) -> Result<(), Status> {
        use pb::quota_server::Quota as _;
        use tonic::transport::server::{TcpConnectInfo, UdsConnectInfo};
        let mut request = Request::new(pb::ResetRequest {
            key: key.to_owned(),
            policy: Some(pb::reset_request::Policy::PolicyName("api".to_owned())),
        });
        match from {
            Some(addr) => {
                request.extensions_mut().insert(TcpConnectInfo {
                    local_addr: None,
                    remote_addr: Some(addr.parse().expect("address")),
                });
            }
            None => {
                request.extensions_mut().insert(UdsConnectInfo {
                    peer_addr: None,
                    peer_cred: None,
                });
            }
        }
        service.reset(request).await.map(|_| ())
    }

    async fn spend(service: &QuotaService<MemoryStore>, key: &str) -> u64 {
        let set = service.policies.snapshot();
        let decision = service
            .decide_one(
                pb::CheckRequest {
                    key: key.to_owned(),
                    cost: Some(1),
                    policy: Some(pb::check_request::Policy::PolicyName("api".to_owned())),
                },
                Deadline::after(Duration::from_secs(1)),
            )
            .await
            .expect("decided");
        drop(set);
        decision.decision.expect("decision").remaining
    }

    #[tokio::test]
    async fn reset_is_refused_by_default_to_callers_from_another_host_and_resets_nothing() {
        let service = service(TWO_POLICIES);
        assert_eq!(spend(&service, "k").await, 1);
        for remote in ["10.1.2.3:4000", "[2001:db8::1]:4000", "192.168.0.9:1"] {
            let refused = reset_from(&service, "k", Some(remote))
                .await
                .expect_err("refused");
            assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{remote}");
            assert!(
                refused.message().contains("limits.allow_reset")
                    && refused.message().contains(remote),
                "{}",
                refused.message()
            );
        }
        assert_eq!(spend(&service, "k").await, 0, "nothing was reset");
        for local in [
            Some("127.0.0.1:4000"),
            Some("[::1]:4000"),
            Some("[::ffff:127.0.0.1]:4000"),
            None,
        ] {
            reset_from(&service, "k", local)
                .await
                .expect("local callers may reset");
        }
        assert_eq!(spend(&service, "k").await, 1, "reset");
    }

    #[tokio::test]
    async fn allow_reset_anyone_opens_reset_and_nobody_closes_it_even_locally() {
        let anyone = service(&format!(
            "[limits]\nallow_reset = \"anyone\"\n{TWO_POLICIES}"
        ));
        spend(&anyone, "k").await;
        reset_from(&anyone, "k", Some("10.1.2.3:4000"))
            .await
            .expect("anyone");
        assert_eq!(spend(&anyone, "k").await, 1);
        // The booleans of older configs keep their meaning.
        let open = service(&format!("[limits]\nallow_reset = true\n{TWO_POLICIES}"));
        reset_from(&open, "k", Some("10.1.2.3:4000"))
            .await
            .expect("true: anyone");
        for closed in ["\"nobody\"", "false"] {
            let nobody = service(&format!("[limits]\nallow_reset = {closed}\n{TWO_POLICIES}"));
            let refused = reset_from(&nobody, "k", Some("127.0.0.1:1"))
                .await
                .expect_err("nobody");
            assert_eq!(refused.code(), tonic::Code::PermissionDenied);
            assert!(
                refused
                    .message()
                    .contains("limits.allow_reset = \"nobody\""),
                "{}",
                refused.message()
            );
        }
        let error =
            Config::from_toml("[limits]\nallow_reset = \"everyone\"\n").expect_err("invalid");
        assert!(
            error.to_string().contains("limits.allow_reset")
                && error
                    .to_string()
                    .contains("\"local\", \"anyone\" or \"nobody\""),
            "{error}"
        );
    }
}
