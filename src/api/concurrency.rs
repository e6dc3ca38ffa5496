//! The `quotad.v1.Concurrency` gRPC service: slots of concurrency limits,
//! acquired, renewed and released (quotad-core's grants; a slot is a grant
//! of in-flight capacity returned on release; `docs/concurrency.md`).
//!
//! A handler runs the same steps as the Quota service's: convert the
//! request, resolve its key and policy against one snapshot of the named
//! policies and the server's limits, and only then call the backend, once.
//! A request rejected at any step has touched no state.
//!
//! An acquire the backend could not decide answers as the policy's
//! `on_error` says, as a check does (`fail_open` admits with no slot:
//! there is nothing to renew or release). A renew or release that failed is
//! always the call's error: a renewal answered open would tell a holder it
//! still has a slot that may have ended, and a failed release leaves the
//! slot to end by its TTL.
//!
//! Slot ids on the wire are 16 lowercase hex digits: the grant's random
//! 64-bit id ([`SlotId`]).

use std::borrow::Cow;
use std::sync::Arc;

use quotad_core::{Acquired, CheckItem, Decision, Grant, Policy, SlotError};
use quotad_proto::v1 as pb;
use rand::Rng as _;
use tonic::{Request, Response, Status};

use super::RequestLimits;
use super::answer::{Answer, on_backend_error, store_failed};
use super::error::ServiceError;
use super::request::{
    PolicyRef, check_key_bytes, decision_to_pb, inline, inline_namespace, key, missing_policy,
    named,
};
use crate::backend::{Backend, BackendError, Deadline, SlotItem};
use crate::config::OnError;
use crate::metrics::{DecisionCounters, Method, Metrics};
use crate::registry::{PolicyRegistry, PolicySet};

/// A slot's name on the wire: its grant's id as 16 lowercase hex digits.
/// Opaque to clients; unguessable by its random id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotId(pub(crate) u64);

/// Text that is not a [`SlotId`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a slot id")]
pub(crate) struct MalformedSlotId;

impl std::fmt::Display for SlotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl std::str::FromStr for SlotId {
    type Err = MalformedSlotId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        // One spelling per id: `from_str_radix` alone would also take
        // upper case and a leading `+`.
        let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if text.len() != 16 || !text.bytes().all(hex) {
            return Err(MalformedSlotId);
        }
        u64::from_str_radix(text, 16)
            .map(SlotId)
            .map_err(|_| MalformedSlotId)
    }
}

/// A new slot's id: unguessable, since whoever presents it can release
/// the slot, so from a CSPRNG (the thread's, seeded by the OS), never a
/// counter.
pub(crate) fn new_slot_id() -> u64 {
    rand::rng().random()
}

/// The field naming a request's policy, for an error about which call it
/// takes.
pub(crate) fn policy_field(policy: &PolicyRef) -> &'static str {
    match policy {
        PolicyRef::Named(_) => "policy_name",
        PolicyRef::Inline(_) => "inline_policy.algorithm",
    }
}

/// The error for a rate policy named where a concurrency limit is needed.
fn not_concurrency(policy: &PolicyRef, resolved: &Policy) -> ServiceError {
    ServiceError::invalid(
        policy_field(policy),
        format!(
            "a {} policy is a rate: decide it with Quota.Check; only a concurrency policy is acquired",
            resolved.algorithm()
        ),
    )
}

/// The pb decision of an acquire item: with its slot when admitted.
pub(crate) fn acquire_decision_to_pb(decision: &Decision, slot: Option<&Grant>) -> pb::Decision {
    let mut pb = decision_to_pb(decision);
    if let Some(slot) = slot.filter(|_| decision.allowed) {
        pb.slot_id = SlotId(slot.id).to_string();
        pb.slot_ttl_ms = slot.ends_at.saturating_sub(slot.granted_at);
    }
    pb
}

/// The Concurrency service over a backend `S`.
#[derive(Debug)]
pub(crate) struct ConcurrencyService<S> {
    backend: Arc<S>,
    policies: Arc<PolicyRegistry>,
    metrics: Arc<Metrics>,
    limits: RequestLimits,
    store_acquire: metrics::Counter,
    store_renew: metrics::Counter,
    store_release: metrics::Counter,
}

/// A request's concurrency policy, resolved.
struct Target<'a> {
    namespace: Cow<'a, str>,
    policy: Policy,
    on_error: OnError,
    decisions: &'a DecisionCounters,
}

impl<S: Backend> ConcurrencyService<S> {
    pub(crate) fn new(
        backend: Arc<S>,
        policies: Arc<PolicyRegistry>,
        metrics: Arc<Metrics>,
        limits: RequestLimits,
    ) -> Self {
        let name = backend.name();
        ConcurrencyService {
            store_acquire: metrics.store_operation(name, "acquire"),
            store_renew: metrics.store_operation(name, "renew"),
            store_release: metrics.store_operation(name, "release"),
            backend,
            policies,
            metrics,
            limits,
        }
    }

    /// The target of `policy`: a named concurrency policy of `set`, or an
    /// inline one within `[limits]`.
    fn target<'a>(
        &'a self,
        set: &'a PolicySet,
        key: &str,
        policy: &PolicyRef,
    ) -> Result<Target<'a>, ServiceError> {
        check_key_bytes(key, self.limits.max_key_bytes)?;
        let target = match policy {
            PolicyRef::Named(name) => {
                let (stored, named, active) =
                    set.get_for(name, key)
                        .ok_or_else(|| ServiceError::UnknownPolicy {
                            field: "policy_name".to_owned(),
                            name: name.clone(),
                        })?;
                Target {
                    namespace: Cow::Borrowed(stored),
                    policy: active.map_or(named.settings.policy, |a| a.policy),
                    on_error: named.settings.on_error,
                    decisions: &named.decisions,
                }
            }
            PolicyRef::Inline(inline) => {
                let limits = set.limits();
                if !limits.allow_inline_policies {
                    return Err(ServiceError::InlineDisabled {
                        field: "inline_policy".to_owned(),
                    });
                }
                limits.check_inline(inline).map_err(|(field, message)| {
                    ServiceError::invalid(&format!("inline_policy.{field}"), message)
                })?;
                Target {
                    namespace: Cow::Owned(inline_namespace(inline)),
                    policy: *inline,
                    on_error: self.limits.on_error,
                    decisions: self.metrics.inline_policy(inline.algorithm()),
                }
            }
        };
        if target.policy.algorithm().is_rate() {
            return Err(not_concurrency(policy, &target.policy));
        }
        Ok(target)
    }

    async fn acquire_one(
        &self,
        request: pb::AcquireRequest,
        deadline: Deadline,
    ) -> Result<pb::AcquireResponse, ServiceError> {
        use pb::acquire_request::Policy as P;
        let policy = match request.policy {
            Some(P::PolicyName(name)) => named(name)?,
            Some(P::InlinePolicy(policy)) => inline(&policy)?,
            None => return Err(missing_policy()),
        };
        let key = key(request.key)?;
        let cost = match request.cost {
            None => 1,
            Some(0) => {
                return Err(ServiceError::invalid(
                    "cost",
                    "must be at least 1 (omit it for 1)",
                ));
            }
            Some(cost) => cost,
        };
        let set = self.policies.snapshot();
        let target = self.target(&set, &key, &policy)?;
        // Bad input is refused here, before anything is sent.
        CheckItem::acquire(&target.namespace, target.policy, &key, cost, 0)?;
        let taken = self
            .take_slot(
                target.namespace.clone().into_owned(),
                target.policy,
                key,
                cost,
                deadline,
            )
            .await;
        let acquired = match taken {
            Ok(acquired) => acquired,
            // Not the store's failure: the call's error, on_error aside.
            Err(Taken::Fault(error)) => return Err(error.into()),
            Err(Taken::Store(error)) => {
                store_failed(&error);
                let decision =
                    on_backend_error(&error, target.on_error, &target.policy, Answer::Whole)?;
                target.decisions.record(&decision);
                return Ok(pb::AcquireResponse {
                    decision: Some(decision_to_pb(&decision)),
                    slot_id: String::new(),
                    ttl_ms: 0,
                });
            }
        };
        target.decisions.record(&acquired.decision);
        let slot = acquired.slot.filter(|_| acquired.decision.allowed);
        Ok(pb::AcquireResponse {
            decision: Some(decision_to_pb(&acquired.decision)),
            slot_id: slot.map(|s| SlotId(s.id).to_string()).unwrap_or_default(),
            ttl_ms: slot.map_or(0, |s| s.ends_at.saturating_sub(s.granted_at)),
        })
    }

    /// Takes a slot in the backend on a task of its own, so that a caller
    /// who goes away while the store works (its call cancelled: tonic drops
    /// the handler) does not strand a slot the store takes after all: one
    /// taken for a caller no longer waiting is released at once.
    async fn take_slot(
        &self,
        name: String,
        policy: Policy,
        key: String,
        cost: u64,
        deadline: Deadline,
    ) -> Result<Acquired, Taken> {
        let orphan = Orphan {
            backend: Arc::clone(&self.backend),
            releases: self.store_release.clone(),
            grace: self.limits.request_timeout,
            name,
            key,
            policy,
        };
        let acquires = self.store_acquire.clone();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let by_task = orphan.clone();
        tokio::spawn(async move {
            let o = &by_task;
            let taken = take(
                &*o.backend,
                &o.name,
                o.policy,
                &o.key,
                cost,
                deadline,
                &acquires,
            )
            .await;
            if let Err(unheard) = answer.send(taken) {
                by_task.release(&unheard).await;
            }
        });
        let mut pending = Pending {
            answered,
            orphan: Some(orphan),
        };
        let answer = (&mut pending.answered).await;
        pending.orphan = None;
        answer.unwrap_or_else(|_| {
            Err(Taken::Fault(BackendError::Internal(
                "the acquire task ended without an answer".into(),
            )))
        })
    }

    /// Converts a renew or release request and resolves its target.
    fn slot_request<'a>(
        &'a self,
        set: &'a PolicySet,
        request: pb::SlotRequest,
    ) -> Result<(Target<'a>, String, u64), ServiceError> {
        use pb::slot_request::Policy as P;
        let policy = match request.policy {
            Some(P::PolicyName(name)) => named(name)?,
            Some(P::InlinePolicy(policy)) => inline(&policy)?,
            None => return Err(missing_policy()),
        };
        let key = key(request.key)?;
        let SlotId(id) = request.slot_id.parse().map_err(|_| {
            ServiceError::invalid(
                "slot_id",
                "is not a slot id (16 lowercase hex digits, as Acquire answered it)",
            )
        })?;
        let target = self.target(set, &key, &policy)?;
        Ok((target, key, id))
    }

    async fn renew_one(
        &self,
        request: pb::SlotRequest,
        deadline: Deadline,
    ) -> Result<pb::RenewResponse, ServiceError> {
        let set = self.policies.snapshot();
        let (target, key, id) = self.slot_request(&set, request)?;
        let slot = SlotItem {
            name: &target.namespace,
            key: &key,
            policy: target.policy,
            id,
        };
        self.store_renew.increment(1);
        let answer = self
            .backend
            .renew(&slot, deadline)
            .await
            .inspect_err(store_failed)?;
        Ok(pb::RenewResponse {
            renewed: answer.slot.is_some(),
            ttl_ms: answer.slot.map_or(0, |_| target.policy.slot_ttl_ms()),
            remaining: answer.remaining,
            limit: answer.limit,
        })
    }

    async fn release_one(
        &self,
        request: pb::SlotRequest,
        deadline: Deadline,
    ) -> Result<pb::ReleaseResponse, ServiceError> {
        let set = self.policies.snapshot();
        let (target, key, id) = self.slot_request(&set, request)?;
        let slot = SlotItem {
            name: &target.namespace,
            key: &key,
            policy: target.policy,
            id,
        };
        self.store_release.increment(1);
        let answer = self
            .backend
            .release(&slot, deadline)
            .await
            .inspect_err(store_failed)?;
        Ok(pb::ReleaseResponse {
            was_held: answer.slot.is_some(),
            remaining: answer.remaining,
            limit: answer.limit,
        })
    }
}

/// Why an acquire took no slot, when not by a decision.
#[derive(Debug)]
enum Taken {
    /// The store failed: the policy's `on_error` answers.
    Store(BackendError),
    /// Not the store's failure (an id clash four times over, a task lost):
    /// the call's error.
    Fault(BackendError),
}

/// One acquire in `backend`: ids are drawn at random; one the key already
/// holds (one in 2^64 per slot held) is drawn again.
async fn take<S: Backend>(
    backend: &S,
    name: &str,
    policy: Policy,
    key: &str,
    cost: u64,
    deadline: Deadline,
    acquires: &metrics::Counter,
) -> Result<Acquired, Taken> {
    let fault = |message: String| Taken::Fault(BackendError::Internal(message.into()));
    for _ in 0..4 {
        let item = CheckItem::acquire(name, policy, key, cost, new_slot_id())
            .map_err(|e| fault(e.to_string()))?;
        acquires.increment(1);
        match backend
            .acquire(&item, deadline)
            .await
            .map_err(Taken::Store)?
        {
            Ok(acquired) => return Ok(acquired),
            Err(SlotError::IdInUse) => {}
            Err(e @ SlotError::NotConcurrency(_)) => return Err(fault(e.to_string())),
        }
    }
    Err(fault("four random slot ids were all in use".to_owned()))
}

/// What releasing a slot taken for a caller gone away needs.
struct Orphan<S> {
    backend: Arc<S>,
    releases: metrics::Counter,
    grace: std::time::Duration,
    name: String,
    key: String,
    policy: Policy,
}

impl<S> Clone for Orphan<S> {
    fn clone(&self) -> Self {
        Orphan {
            backend: Arc::clone(&self.backend),
            releases: self.releases.clone(),
            grace: self.grace,
            name: self.name.clone(),
            key: self.key.clone(),
            policy: self.policy,
        }
    }
}

impl<S: Backend> Orphan<S> {
    /// Releases the slot `unheard` took, if it took one.
    async fn release(&self, unheard: &Result<Acquired, Taken>) {
        let Ok(Acquired {
            decision,
            slot: Some(slot),
        }) = unheard
        else {
            return;
        };
        if !decision.allowed {
            return;
        }
        self.releases.increment(1);
        let item = SlotItem {
            name: &self.name,
            key: &self.key,
            policy: self.policy,
            id: slot.id,
        };
        match self
            .backend
            .release(&item, Deadline::after(self.grace))
            .await
        {
            Ok(_) => tracing::debug!(
                policy = %self.name,
                "a slot taken for a caller gone away was released"
            ),
            Err(error) => tracing::warn!(
                policy = %self.name,
                error = %crate::log::Causes(&error),
                "a slot taken for a caller gone away was not released; it ends by its TTL"
            ),
        }
    }
}

/// The handler's end of an acquire sent on a task. Dropped before the
/// answer was taken (tonic dropped the handler: the caller went away), it
/// closes the hand-off and releases a slot an answer already handed over
/// holds; an answer not yet handed over is then refused to the task, which
/// releases it. Exactly one side sees each answer.
struct Pending<S: Backend> {
    answered: tokio::sync::oneshot::Receiver<Result<Acquired, Taken>>,
    /// `None` once the answer was taken.
    orphan: Option<Orphan<S>>,
}

impl<S: Backend> Drop for Pending<S> {
    fn drop(&mut self) {
        let Some(orphan) = self.orphan.take() else {
            return;
        };
        self.answered.close();
        if let Ok(unheard) = self.answered.try_recv() {
            tokio::spawn(async move { orphan.release(&unheard).await });
        }
    }
}

#[tonic::async_trait]
impl<S: Backend> pb::concurrency_server::Concurrency for ConcurrencyService<S> {
    async fn acquire(
        &self,
        request: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let timeout = self.limits.request_timeout;
        super::serve(&self.metrics, Method::Acquire, request, timeout, |r, d| {
            self.acquire_one(r, d)
        })
        .await
    }

    async fn renew(
        &self,
        request: Request<pb::SlotRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let timeout = self.limits.request_timeout;
        super::serve(&self.metrics, Method::Renew, request, timeout, |r, d| {
            self.renew_one(r, d)
        })
        .await
    }

    async fn release(
        &self,
        request: Request<pb::SlotRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let timeout = self.limits.request_timeout;
        super::serve(&self.metrics, Method::Release, request, timeout, |r, d| {
            self.release_one(r, d)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_ids_round_trip_and_anything_else_is_malformed() {
        for id in [0, 7, u64::MAX] {
            let text = SlotId(id).to_string();
            assert_eq!(text.len(), 16);
            assert_eq!(text.parse(), Ok(SlotId(id)));
        }
        let good = SlotId(0xab).to_string();
        for bad in [
            String::new(),
            good[..15].to_owned(),
            format!("{good}0"),
            "00000000000000AB".to_owned(),
            format!("+{}", &good[1..]),
            format!("g{}", &good[1..]),
            format!("é{}", &good[2..]),
        ] {
            assert_eq!(bad.parse::<SlotId>(), Err(MalformedSlotId), "{bad:?}");
        }
    }
}
