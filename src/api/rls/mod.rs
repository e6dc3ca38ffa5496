//! Envoy's rate limit service, `envoy.service.ratelimit.v3.RateLimitService`,
//! answered from envoyproxy/ratelimit's YAML rules over quotad's store.
//!
//! `ShouldRateLimit` runs the steps of `quotad.v1`: the request is
//! converted at the edge (borrowing its strings), matched against one
//! snapshot of the rules ([`crate::policy::rls`]), every store item is built,
//! and only then is the backend called: once for most requests. A request
//! refused at any step (INVALID_ARGUMENT naming the field) has counted
//! nothing.
//!
//! How the descriptors of one request count ([`CountMode`]):
//!
//! - `all_or_nothing` (the default): the enforced descriptors form one
//!   all-or-nothing batch, so when any of them is over its limit none is
//!   counted, and a denied hit is never counted. Shadow-mode and quota-mode
//!   descriptors (whose denial does not deny the request) are decided on
//!   their own, and `hits_addend: 0` probes only look. On a Redis Cluster
//!   the descriptors are decided on their own (their keys live in different
//!   slots), as the reference does.
//! - `reference`: envoyproxy/ratelimit's counting: each descriptor on its
//!   own, and a denied hit spends what is left of its budget
//!   ([`Spend::Always`]), which makes a fixed window decide exactly as the
//!   reference's counter. A backend that cannot spend atomically
//!   ([`Backend::spends_when_denied`]) gets a second check of what the
//!   denial left.
//!
//! The answer follows the reference: [`status`] builds each descriptor's
//! status, the overall code and the optional headers.

mod status;

use std::sync::Arc;

use quotad_core::{BatchMode, CheckItem, Clock, Decision, Reason, Spend};
use quotad_proto::MAX_BATCH_ITEMS;
use quotad_proto::envoy::service::ratelimit::v3 as pb;
use tonic::{Request, Response, Status};

use super::error::ServiceError;
use super::quota::{Answer, StoreOps, on_backend_error};
use crate::backend::redis::{RedisSettings, RedisTarget};
use crate::backend::{Backend, Deadline, ItemResult};
use crate::config::{BackendSettings, Config, CountMode, OnError, ResponseHeaders};
use crate::metrics::{Method, Metrics};
use crate::policy::rls::{self as rules, Applied, Charge, Resolution, RlsRegistry};

/// How `ShouldRateLimit` answers, from `[rls]` and `[store]`.
#[derive(Clone, Debug)]
pub(crate) struct RlsOptions {
    pub(crate) count_mode: CountMode,
    /// Whether enforced descriptors may share one all-or-nothing batch
    /// (not on a Redis Cluster, where their keys live in different slots).
    pub(crate) one_batch: bool,
    pub(crate) headers: ResponseHeaders,
    pub(crate) shadow_mode: bool,
    pub(crate) quota_mode: bool,
    /// `store.max_key_bytes`: longer descriptor keys are stored as digests.
    pub(crate) max_key_bytes: usize,
    /// `store.on_error`.
    pub(crate) on_error: OnError,
    /// `transport.request_timeout`: tonic ends every call after it.
    pub(crate) request_timeout: std::time::Duration,
    /// The server's clock, for the window end of a limit nothing was
    /// stored for.
    pub(crate) clock: Arc<dyn Clock>,
}

/// The RLS service over a backend `S`.
#[derive(Debug)]
pub(crate) struct RlsService<S> {
    backend: Arc<S>,
    rules: Arc<RlsRegistry>,
    metrics: Arc<Metrics>,
    options: RlsOptions,
    store_ops: StoreOps,
}

/// Store items decided together, with the descriptor of each.
#[derive(Default)]
struct Batch<'a> {
    descriptors: Vec<usize>,
    items: Vec<CheckItem<'a>>,
}

impl<'a> Batch<'a> {
    fn push(&mut self, descriptor: usize, item: CheckItem<'a>) {
        self.descriptors.push(descriptor);
        self.items.push(item);
    }
}

/// Where a descriptor's limit is decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// In the request's all-or-nothing batch.
    Group,
    /// On its own (shadow or quota mode, the reference's counting, a
    /// Cluster).
    Alone,
    /// Looked at, not counted (`hits_addend: 0`).
    Probe,
}

/// What the store said for one descriptor, if it was asked.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    /// The descriptor has no limit to check.
    NoLimit,
    /// A limit of 0: over it, with nothing stored.
    Zero,
    /// The store's decision (or `on_error`'s).
    Decided(Decision),
}

impl RlsOptions {
    /// The options `config` sets.
    pub(crate) fn new(config: &Config) -> Self {
        let rls = config.rls();
        let cluster = matches!(
            &config.store().backend,
            BackendSettings::Redis(RedisSettings {
                target: RedisTarget::Cluster(_),
                ..
            })
        );
        if cluster && rls.count_mode == CountMode::AllOrNothing {
            tracing::info!(
                "Redis Cluster: the descriptors of an RLS request are decided one by one (each key lives in its own slot)"
            );
        }
        RlsOptions {
            count_mode: rls.count_mode,
            one_batch: !cluster,
            headers: rls.headers.clone(),
            shadow_mode: rls.shadow_mode,
            quota_mode: rls.quota_mode,
            max_key_bytes: config.store().max_key_bytes,
            on_error: config.store().on_error,
            request_timeout: config.transport().request_timeout,
            clock: Arc::clone(config.clock()),
        }
    }
}

impl<S: Backend> RlsService<S> {
    pub(crate) fn new(
        backend: Arc<S>,
        rules: Arc<RlsRegistry>,
        metrics: Arc<Metrics>,
        options: RlsOptions,
    ) -> Self {
        let name = backend.name();
        let store_ops = StoreOps::new(&metrics, name);
        if options.count_mode == CountMode::Reference && !backend.spends_when_denied() {
            tracing::info!(
                backend = name,
                "rls.count_mode = reference: a denied hit is spent by a second check (this backend cannot spend within the denial)"
            );
        }
        RlsService {
            backend,
            rules,
            metrics,
            options,
            store_ops,
        }
    }

    async fn decide(
        &self,
        request: &pb::RateLimitRequest,
        deadline: Deadline,
    ) -> Result<pb::RateLimitResponse, ServiceError> {
        let request = convert(request)?;
        let set = self.rules.snapshot();
        let mut resolved = set
            .rules()
            .resolve(&request)
            .map_err(|e| ServiceError::invalid(&e.field, e.message))?;
        for resolution in &mut resolved {
            if let Resolution::Limited(applied) = resolution {
                applied.bound_key(self.options.max_key_bytes);
            }
        }
        let spend = match self.options.count_mode {
            CountMode::Reference => Spend::Always,
            CountMode::AllOrNothing => Spend::WhenAdmitted,
        };
        // The common case, one descriptor with a limit: one store call and
        // no lists to sort the answers back from.
        if let [Resolution::Limited(applied)] = resolved.as_slice()
            && let Some(item) = applied.check_item()
        {
            let outcome = Outcome::Decided(self.check_alone(applied, item, spend, deadline).await?);
            let outcomes = std::slice::from_ref(&outcome);
            return Ok(status::respond(
                &resolved,
                outcomes,
                &set,
                &self.options,
                &self.metrics,
            ));
        }
        // Boxed: its state is larger than the whole of the common case's,
        // and would otherwise be part of every call's future.
        let outcomes = Box::pin(self.check_many(&resolved, spend, deadline)).await?;
        Ok(status::respond(
            &resolved,
            &outcomes,
            &set,
            &self.options,
            &self.metrics,
        ))
    }

    /// Where each descriptor is decided.
    fn role(&self, applied: &Applied<'_>) -> Role {
        let o = &self.options;
        if applied.charge() == Charge::Probe {
            Role::Probe
        } else if o.count_mode == CountMode::Reference
            || !o.one_batch
            || o.shadow_mode
            || o.quota_mode
            || applied.shadow_mode()
            || applied.quota_mode()
        {
            Role::Alone
        } else {
            Role::Group
        }
    }

    /// The decision for the one limited descriptor of a request.
    async fn check_alone(
        &self,
        applied: &Applied<'_>,
        item: CheckItem<'_>,
        spend: Spend,
        deadline: Deadline,
    ) -> Result<Decision, ServiceError> {
        let result = match self.role(applied) {
            Role::Probe => {
                self.store_ops.peek.increment(1);
                self.backend.peek(&item, deadline).await
            }
            Role::Group | Role::Alone => {
                self.store_ops.check.increment(1);
                let item = item.with_spend(spend);
                let mut result = self.backend.check_one(&item, deadline).await;
                if let Ok(decision) = &mut result
                    && !self.backend.spends_when_denied()
                {
                    Box::pin(self.spend_rest(&item, decision, deadline)).await;
                }
                result
            }
        };
        result.or_else(|error| {
            crate::log::store_failed(&error);
            on_backend_error(&error, self.options.on_error, item.policy(), Answer::Whole)
        })
    }

    /// Asks the store about every limited descriptor of a request that is
    /// not the common case: the group in one all-or-nothing call, the
    /// others in one independent call, probes by peeking.
    async fn check_many(
        &self,
        resolved: &[Resolution<'_>],
        spend: Spend,
        deadline: Deadline,
    ) -> Result<Vec<Outcome>, ServiceError> {
        let mut outcomes = Vec::with_capacity(resolved.len());
        // Each list of store items, with the descriptor of each item.
        let (mut group, mut alone, mut probes) =
            (Batch::default(), Batch::default(), Batch::default());
        // Whether an enforced descriptor is over before the store is asked.
        let mut doomed = false;
        for (i, resolution) in resolved.iter().enumerate() {
            let Resolution::Limited(applied) = resolution else {
                outcomes.push(Outcome::NoLimit);
                continue;
            };
            let role = self.role(applied);
            let Some(item) = applied.check_item() else {
                // A limit of 0 is over whatever the store holds.
                doomed |= role == Role::Group;
                outcomes.push(Outcome::Zero);
                continue;
            };
            outcomes.push(Outcome::NoLimit);
            match role {
                Role::Group => group.push(i, item),
                Role::Alone => alone.push(i, item.with_spend(spend)),
                Role::Probe => probes.push(i, item),
            }
        }
        if group.items.len() == 1 && !doomed {
            // One enforced descriptor: all or nothing is itself.
            alone.descriptors.append(&mut group.descriptors);
            alone.items.append(&mut group.items);
        }

        let (group_results, alone_results, probe_results) = tokio::join!(
            async {
                if doomed {
                    self.peek_rejected(&group.items, deadline).await
                } else {
                    self.all_or_nothing(&group.items, deadline).await
                }
            },
            self.independent(&alone.items, deadline),
            self.peek_each(&probes.items, deadline),
        );
        for (batch, results) in [
            (&group, group_results),
            (&alone, alone_results),
            (&probes, probe_results),
        ] {
            for ((&descriptor, item), result) in
                batch.descriptors.iter().zip(&batch.items).zip(results)
            {
                let decision = result.or_else(|error| {
                    crate::log::store_failed(&error);
                    on_backend_error(&error, self.options.on_error, item.policy(), Answer::Whole)
                })?;
                outcomes[descriptor] = Outcome::Decided(decision);
            }
        }
        Ok(outcomes)
    }

    async fn all_or_nothing(&self, items: &[CheckItem<'_>], deadline: Deadline) -> Vec<ItemResult> {
        if items.is_empty() {
            return Vec::new();
        }
        self.store_ops.check_batch.increment(1);
        self.backend
            .check(items, BatchMode::AllOrNothing, deadline)
            .await
    }

    async fn independent(&self, items: &[CheckItem<'_>], deadline: Deadline) -> Vec<ItemResult> {
        let mut results = match items {
            [] => return Vec::new(),
            [item] => {
                self.store_ops.check.increment(1);
                vec![self.backend.check_one(item, deadline).await]
            }
            _ => {
                self.store_ops.check_batch.increment(1);
                self.backend
                    .check(items, BatchMode::Independent, deadline)
                    .await
            }
        };
        if !self.backend.spends_when_denied() {
            for (item, result) in items.iter().zip(&mut results) {
                if let Ok(decision) = result {
                    Box::pin(self.spend_rest(item, decision, deadline)).await;
                }
            }
        }
        results
    }

    /// For a backend that does not spend on denial: an item marked
    /// [`Spend::Always`] that was denied with budget left spends it by a
    /// second check of exactly that much. Never admits more than the
    /// limit; another request may take the budget in between, and then the
    /// second check is simply denied.
    async fn spend_rest(&self, item: &CheckItem<'_>, decision: &mut Decision, deadline: Deadline) {
        if item.spend() != Spend::Always || decision.allowed || decision.remaining == 0 {
            return;
        }
        let Ok(rest) = CheckItem::new(item.name(), *item.policy(), item.key(), decision.remaining)
        else {
            return;
        };
        self.store_ops.check.increment(1);
        match self.backend.check_one(&rest, deadline).await {
            Ok(_) => decision.remaining = 0,
            // A failure is logged (throttled); the hit stays uncounted.
            Err(error) => crate::log::store_failed(&error),
        }
    }

    /// The group of a request already over (a limit of 0 among its
    /// enforced descriptors): nothing is counted, and what would have
    /// fitted is answered as rejected with the batch.
    async fn peek_rejected(&self, items: &[CheckItem<'_>], deadline: Deadline) -> Vec<ItemResult> {
        let mut results = self.peek_each(items, deadline).await;
        for decision in results.iter_mut().flatten() {
            if decision.allowed {
                decision.allowed = false;
                decision.reason = Reason::BatchRejected;
            }
        }
        results
    }

    async fn peek_each(&self, items: &[CheckItem<'_>], deadline: Deadline) -> Vec<ItemResult> {
        let mut results = Vec::with_capacity(items.len());
        for item in items {
            self.store_ops.peek.increment(1);
            results.push(self.backend.peek(item, deadline).await);
        }
        results
    }
}

/// The matcher's view of a request, borrowing its strings.
fn convert(request: &pb::RateLimitRequest) -> Result<rules::Request<'_>, ServiceError> {
    let count = request.descriptors.len();
    if count > MAX_BATCH_ITEMS {
        return Err(ServiceError::invalid(
            "descriptors",
            format!("must hold at most {MAX_BATCH_ITEMS} descriptors (got {count})"),
        ));
    }
    let mut descriptors = rules::Descriptors::with_capacity(count);
    descriptors.extend(request.descriptors.iter().map(|d| {
        rules::Descriptor {
            entries: d
                .entries
                .iter()
                .map(|e| rules::Entry {
                    key: &e.key,
                    value: &e.value,
                })
                .collect(),
            limit: d.limit.as_ref().map(|l| rules::LimitOverride {
                requests_per_unit: l.requests_per_unit,
                unit: l.unit,
            }),
            hits_addend: d.hits_addend,
        }
    }));
    Ok(rules::Request {
        domain: &request.domain,
        descriptors,
        hits_addend: request.hits_addend,
    })
}

#[tonic::async_trait]
impl<S: Backend> pb::rate_limit_service_server::RateLimitService for RlsService<S> {
    async fn should_rate_limit(
        &self,
        request: Request<pb::RateLimitRequest>,
    ) -> Result<Response<pb::RateLimitResponse>, Status> {
        let deadline = super::call_deadline(request.metadata(), self.options.request_timeout);
        super::observe(
            &self.metrics,
            Method::ShouldRateLimit,
            self.decide(request.get_ref(), deadline),
        )
        .await
    }
}
