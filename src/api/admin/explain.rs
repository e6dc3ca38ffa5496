//! The `quotad.v1.Explain` gRPC service: why a key is (or is not)
//! limited, consuming nothing.
//!
//! It resolves the key as `Check` does (the named policy and the key's
//! override, if one is in force), asks the store what a unit-cost `Peek`
//! answers, and reports both, with the exact time until the key is fresh
//! and, for the window algorithms, the aligned window it is in. Gated like
//! `Reset` (`limits.allow_reset`, `[auth] reset`): it shows one tenant's
//! numbers to whoever asks.

use std::sync::Arc;
use std::time::Duration;

use quotad_core::{Algorithm, CheckItem};
use quotad_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::entry_to_pb;
use crate::api::error::ServiceError;
use crate::api::request::{check_key_bytes, decision_to_pb};
use crate::auth::Origin;
use crate::backend::{Backend, Deadline};
use crate::metrics::{Method, Metrics};
use crate::registry::PolicyRegistry;

/// The Explain service over a backend `S`.
#[derive(Debug)]
pub(crate) struct ExplainService<S> {
    backend: Arc<S>,
    policies: Arc<PolicyRegistry>,
    metrics: Arc<Metrics>,
    max_key_bytes: usize,
    request_timeout: Duration,
}

impl<S: Backend> ExplainService<S> {
    pub(crate) fn new(
        backend: Arc<S>,
        policies: Arc<PolicyRegistry>,
        metrics: Arc<Metrics>,
        max_key_bytes: usize,
        request_timeout: Duration,
    ) -> Self {
        ExplainService {
            backend,
            policies,
            metrics,
            max_key_bytes,
            request_timeout,
        }
    }

    async fn explain(
        &self,
        request: pb::ExplainRequest,
        origin: Origin,
        deadline: Deadline,
    ) -> Result<pb::ExplainResponse, ServiceError> {
        let set = self.policies.snapshot();
        origin
            .admitted_by(set.limits().allow_reset, "Explain", "limits.allow_reset")
            .map_err(ServiceError::Refused)?;
        if request.policy.is_empty() {
            return Err(ServiceError::invalid(
                "policy",
                "must name a configured policy",
            ));
        }
        if request.key.is_empty() {
            return Err(ServiceError::invalid("key", "must not be empty"));
        }
        check_key_bytes(&request.key, self.max_key_bytes)?;
        let now = self.policies.now_ms();
        let (stored, named, active) = set
            .get_for_at(&request.policy, &request.key, now)
            .ok_or_else(|| ServiceError::UnknownPolicy {
                field: "policy".to_owned(),
                name: request.policy.clone(),
            })?;
        let configured = named.settings.policy;
        let in_force = active.map_or(configured, |a| a.policy);
        let item = if in_force.algorithm().is_rate() {
            CheckItem::new(stored, in_force, &request.key, 1)?
        } else {
            // A peek of an acquire takes nothing; the id is never kept.
            CheckItem::acquire(
                stored,
                in_force,
                &request.key,
                1,
                crate::api::concurrency::new_slot_id(),
            )?
        };
        let decision = self.backend.peek(&item, deadline).await?;
        let (window_start_ms, window_end_ms) = match in_force.algorithm() {
            // The local period of a calendar policy, else the epoch-aligned
            // window.
            Algorithm::FixedWindow | Algorithm::SlidingWindow => in_force.window_bounds(now),
            _ => (0, 0),
        };
        Ok(pb::ExplainResponse {
            policy: request.policy,
            in_force: Some((&in_force).into()),
            configured: Some((&configured).into()),
            active_override: active.map(|a| entry_to_pb(&a.entry)),
            used: decision.limit.saturating_sub(decision.remaining),
            now_ms: now,
            reset_at_ms: now.saturating_add(decision.reset_after_ms),
            state: Some(decision_to_pb(&decision)),
            window_start_ms,
            window_end_ms,
        })
    }
}

#[tonic::async_trait]
impl<S: Backend> pb::explain_server::Explain for ExplainService<S> {
    async fn explain(
        &self,
        request: Request<pb::ExplainRequest>,
    ) -> Result<Response<pb::ExplainResponse>, Status> {
        let origin = Origin::of(&request);
        crate::api::serve(
            &self.metrics,
            Method::Explain,
            request,
            self.request_timeout,
            |r, d| self.explain(r, origin, d),
        )
        .await
    }
}
