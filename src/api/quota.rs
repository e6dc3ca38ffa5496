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
use std::time::{Duration, Instant};

use metrics::Counter;
use quotad_core::{BatchMode, CheckItem, Decision, Policy, Reason};
use quotad_proto::v1 as pb;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use super::error::{ServiceError, to_status};
use super::request::{
    BatchSpec, CheckSpec, PolicyRef, ResetSpec, decision_to_pb, inline_namespace,
};
use crate::backend::{Backend, BackendError, Deadline, ItemResult};
use crate::config::OnError;
use crate::metrics::{DecisionCounters, Method, Metrics};
use crate::policy::{PolicyRegistry, PolicySet};

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

/// When the caller of `metadata`'s request stops waiting, counted from now:
/// its `grpc-timeout`, if it sent one, or `request_timeout`, whichever ends
/// first (tonic cancels the call then). The store is given it, so that a
/// call answered as failed is never counted later.
///
/// The request's transit is not in it: the client's own deadline ended
/// that much earlier (`docs/redis.md`, the residual window).
pub(crate) fn call_deadline(metadata: &MetadataMap, request_timeout: Duration) -> Deadline {
    let asked = metadata
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(grpc_timeout);
    Deadline::after(asked.map_or(request_timeout, |t| t.min(request_timeout)))
}

/// A `grpc-timeout` value: 1 to 8 digits and a unit (`H`, `M`, `S`, `m`,
/// `u`, `n`), as the gRPC HTTP/2 protocol defines it.
fn grpc_timeout(value: &str) -> Option<Duration> {
    let digits = value.get(..value.len().checked_sub(1)?)?;
    if !(1..=8).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match &value[digits.len()..] {
        "H" => Duration::from_secs(n * 3_600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
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

/// `quotad_store_operations_total`, one handle per operation.
#[derive(Debug)]
struct StoreOps {
    check: Counter,
    check_batch: Counter,
    peek: Counter,
    reset: Counter,
}

/// A request's policy, resolved: the state namespace, the policy and the
/// counters its decisions go to.
struct Target<'a> {
    namespace: Cow<'a, str>,
    policy: Policy,
    on_error: OnError,
    decisions: &'a DecisionCounters,
}

impl<'a> Target<'a> {
    fn item<'k>(&'k self, key: &'k str, cost: u64) -> Result<CheckItem<'k>, ServiceError> {
        Ok(CheckItem::new(&self.namespace, self.policy, key, cost)?)
    }

    /// What a check answers when the backend failed: as the policy's
    /// `on_error` says, a decision whose reason tells what happened, or the
    /// error itself. Only an unavailable backend is subject to `on_error`;
    /// in an independent batch an error (`on_error = error`, or a fault of
    /// the backend) answers the item [`Reason::Unavailable`], since the call
    /// as a whole cannot fail once other items are consumed.
    fn on_backend_error(
        &self,
        error: &BackendError,
        answer: Answer,
    ) -> Result<Decision, ServiceError> {
        let reason = match (error, self.on_error, answer) {
            (BackendError::Unavailable(_), OnError::FailOpen, _) => Reason::FailOpen,
            (BackendError::Unavailable(_), OnError::FailClosed, _) => Reason::FailClosed,
            // Never failed open or closed: a fault is not an outage. Alone,
            // it is the call's error; in an independent batch, whose other
            // items may be consumed, it is the item's.
            (_, _, Answer::PerItem) => Reason::Unavailable,
            (_, _, Answer::Whole) => return Err(error.clone().into()),
        };
        Ok(Decision {
            allowed: reason == Reason::FailOpen,
            limit: self.policy.capacity(),
            remaining: 0,
            retry_after_ms: 0,
            reset_after_ms: 0,
            reason,
        })
    }
}

/// How a call answers a failed item: as the whole call's error (a lone
/// check, or an all-or-nothing batch), or item by item (an independent
/// batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Whole,
    PerItem,
}

impl Answer {
    fn of(mode: BatchMode) -> Self {
        match mode {
            BatchMode::Independent => Answer::PerItem,
            BatchMode::AllOrNothing => Answer::Whole,
        }
    }
}

/// The decisions for a batch's results: decided items stand, and each
/// failed one gets its own target's `on_error` (or the error, if any such
/// target wants it passed on). An all-or-nothing batch stays all or
/// nothing: when it failed, one item failing closed denies every item.
fn resolve_results(
    targets: &[Target<'_>],
    results: Vec<ItemResult>,
    answer: Answer,
) -> Result<Vec<Decision>, ServiceError> {
    let mut failed = false;
    let mut decisions = targets
        .iter()
        .zip(results)
        .map(|(target, result)| {
            result.or_else(|error| {
                if !failed {
                    crate::log::store_failed(&error);
                }
                failed = true;
                target.on_backend_error(&error, answer)
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

impl<S: Backend> QuotaService<S> {
    pub(crate) fn new(
        backend: Arc<S>,
        policies: Arc<PolicyRegistry>,
        metrics: Arc<Metrics>,
        limits: RequestLimits,
    ) -> Self {
        let name = backend.name();
        let store_ops = StoreOps {
            check: metrics.store_operation(name, "check"),
            check_batch: metrics.store_operation(name, "check_batch"),
            peek: metrics.store_operation(name, "peek"),
            reset: metrics.store_operation(name, "reset"),
        };
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
        if key.len() > self.limits.max_key_bytes {
            return Err(ServiceError::invalid(
                "key",
                format!(
                    "must be at most {} bytes (got {})",
                    self.limits.max_key_bytes,
                    key.len()
                ),
            ));
        }
        match policy {
            PolicyRef::Named(name) => {
                let (stored, named) = set.get(name).ok_or_else(|| ServiceError::UnknownPolicy {
                    field: "policy_name".to_owned(),
                    name: name.clone(),
                })?;
                Ok(Target {
                    namespace: Cow::Borrowed(stored),
                    policy: named.settings.policy,
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
        let item = target.item(&spec.key, spec.cost)?;
        self.store_ops.check.increment(1);
        let result = self.backend.check_one(&item, deadline).await;
        let decision = first(resolve_results(
            std::slice::from_ref(&target),
            vec![result],
            Answer::Whole,
        )?);
        target.decisions.record(&decision);
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
        let targets = batch
            .items
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                self.resolve(&set, &spec.key, &spec.policy)
                    .map_err(|e| e.at_item(i))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let items = batch
            .items
            .iter()
            .zip(&targets)
            .enumerate()
            .map(|(i, (spec, target))| target.item(&spec.key, spec.cost).map_err(|e| e.at_item(i)))
            .collect::<Result<Vec<_>, _>>()?;
        self.store_ops.check_batch.increment(1);
        let results = self.backend.check(&items, batch.mode, deadline).await;
        let decisions = resolve_results(&targets, results, Answer::of(batch.mode))?;
        for (target, decision) in targets.iter().zip(&decisions) {
            target.decisions.record(decision);
        }
        Ok(pb::CheckBatchResponse {
            decisions: decisions.iter().map(decision_to_pb).collect(),
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
        let decision = first(resolve_results(
            std::slice::from_ref(&target),
            vec![result],
            Answer::Whole,
        )?);
        Ok(pb::CheckResponse {
            decision: Some(decision_to_pb(&decision)),
        })
    }

    async fn reset_one(
        &self,
        request: pb::ResetRequest,
    ) -> Result<pb::ResetResponse, ServiceError> {
        let set = self.policies.snapshot();
        if !set.limits().allow_reset {
            return Err(ServiceError::ResetDisabled);
        }
        let spec = ResetSpec::try_from(request)?;
        let target = self.resolve(&set, &spec.key, &spec.policy)?;
        self.store_ops.reset.increment(1);
        self.backend
            .reset(&target.namespace, &target.policy, &spec.key)
            .await
            .inspect_err(crate::log::store_failed)?;
        Ok(pb::ResetResponse {})
    }

    /// Runs one handler: times it, and turns its error into a status,
    /// counted by method and code.
    async fn observe<T>(
        &self,
        method: Method,
        call: impl Future<Output = Result<T, ServiceError>>,
    ) -> Result<Response<T>, Status> {
        let started = Instant::now();
        let result = call.await;
        self.metrics.request_duration(method, started.elapsed());
        result.map(Response::new).map_err(|error| {
            // A store failure has been logged where it happened.
            let status = to_status(&error);
            self.metrics.request_error(method, status.code());
            status
        })
    }
}

fn first(decisions: Vec<Decision>) -> Decision {
    decisions
        .into_iter()
        .next()
        .expect("one decision per target")
}

#[tonic::async_trait]
impl<S: Backend> pb::quota_server::Quota for QuotaService<S> {
    async fn check(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let deadline = call_deadline(request.metadata(), self.limits.request_timeout);
        self.observe(
            Method::Check,
            self.decide_one(request.into_inner(), deadline),
        )
        .await
    }

    async fn check_batch(
        &self,
        request: Request<pb::CheckBatchRequest>,
    ) -> Result<Response<pb::CheckBatchResponse>, Status> {
        let deadline = call_deadline(request.metadata(), self.limits.request_timeout);
        self.observe(
            Method::CheckBatch,
            self.decide_batch(request.into_inner(), deadline),
        )
        .await
    }

    async fn peek(
        &self,
        request: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let deadline = call_deadline(request.metadata(), self.limits.request_timeout);
        self.observe(Method::Peek, self.peek_one(request.into_inner(), deadline))
            .await
    }

    async fn reset(
        &self,
        request: Request<pb::ResetRequest>,
    ) -> Result<Response<pb::ResetResponse>, Status> {
        self.observe(Method::Reset, self.reset_one(request.into_inner()))
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use quotad_core::Algorithm;

    use super::*;

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
    fn the_call_deadline_is_the_earlier_of_grpc_timeout_and_the_request_timeout() {
        assert_eq!(grpc_timeout("50m"), Some(Duration::from_millis(50)));
        assert_eq!(grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3_600)));
        assert_eq!(grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(
            grpc_timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(grpc_timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "123456789m", "5", "5x", "-5m", "+5m", "5 m", "5é"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
        let within = |metadata: &MetadataMap, timeout: Duration| {
            let before = Instant::now();
            let at = call_deadline(metadata, timeout)
                .instant()
                .expect("a deadline");
            at.duration_since(before)
        };
        let mut metadata = MetadataMap::new();
        let five = Duration::from_secs(5);
        assert!(
            within(&metadata, five) >= five,
            "no grpc-timeout: the request timeout"
        );
        metadata.insert("grpc-timeout", "50m".parse().expect("ascii"));
        let asked = within(&metadata, five);
        assert!(
            asked >= Duration::from_millis(50) && asked < five,
            "{asked:?}"
        );
        assert!(within(&metadata, Duration::from_millis(20)) < Duration::from_millis(50));
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
        let targets = [
            target(OnError::FailOpen),
            target(OnError::FailClosed),
            target(OnError::FailOpen),
        ];
        let down = || BackendError::Unavailable("down".to_owned());
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
        let strict = [target(OnError::Error)];
        assert!(resolve_results(&strict, all_down(1), Answer::Whole).is_err());
        let both = [target(OnError::Error), target(OnError::FailOpen)];
        let one_down = vec![Err(down()), Ok(decided(true))];
        let answered = resolve_results(&both, one_down, Answer::PerItem).expect("answers");
        assert_eq!(
            (answered[0].allowed, answered[0].reason),
            (false, Reason::Unavailable)
        );
        assert_eq!(answered[1], decided(true));
        assert!(resolve_results(&both, all_down(2), Answer::Whole).is_err());
        // A bug in the store is never failed open.
        let bug = || Err(BackendError::Internal("bad reply".to_owned()));
        assert!(resolve_results(&targets[..1], vec![bug()], Answer::Whole).is_err());
        let faulty = resolve_results(
            &targets[..2],
            vec![bug(), Ok(decided(true))],
            Answer::PerItem,
        )
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
}
