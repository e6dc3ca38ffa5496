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
//! - `all_or_nothing` (the default): a request's hits are counted only when
//!   it goes through, and a request that does not go through counts
//!   nothing ([`RlsService::check_together`]). The enforced descriptors
//!   form one all-or-nothing batch; probes (`hits_addend: 0`) are looked at
//!   first; quota-mode descriptors, which deny only when all of them are
//!   over, are tried with the batch until one fits; shadow-mode ones are
//!   counted once the request is known to go through. On a Redis Cluster
//!   the descriptors are decided on their own (their keys live in
//!   different slots), as the reference does.
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

impl Outcome {
    /// Whether the descriptor is over its limit (a descriptor that fitted
    /// but was not counted with an all-or-nothing batch is not).
    fn over(self) -> bool {
        match self {
            Outcome::NoLimit => false,
            Outcome::Zero => true,
            Outcome::Decided(d) => !d.allowed && d.reason != Reason::BatchRejected,
        }
    }

    /// Whether the store counted (or would have counted) the hits.
    fn admitted(self) -> bool {
        matches!(self, Outcome::Decided(d) if d.allowed)
    }
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

    /// The decision for the one limited descriptor of a request.
    async fn check_alone(
        &self,
        applied: &Applied<'_>,
        item: CheckItem<'_>,
        spend: Spend,
        deadline: Deadline,
    ) -> Result<Decision, ServiceError> {
        let result = match applied.charge() {
            Charge::Probe => {
                self.store_ops.peek.increment(1);
                self.backend.peek(&item, deadline).await
            }
            Charge::Hits(_) => {
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
    /// not the common case.
    async fn check_many(
        &self,
        resolved: &[Resolution<'_>],
        spend: Spend,
        deadline: Deadline,
    ) -> Result<Vec<Outcome>, ServiceError> {
        let o = &self.options;
        if o.count_mode == CountMode::Reference || !o.one_batch || o.shadow_mode {
            self.check_each(resolved, spend, deadline).await
        } else {
            self.check_together(resolved, deadline).await
        }
    }

    /// Each descriptor on its own (the reference's counting, a Cluster, the
    /// server's shadow mode, where every request goes through): the
    /// counted ones in one independent call, probes by peeking.
    async fn check_each(
        &self,
        resolved: &[Resolution<'_>],
        spend: Spend,
        deadline: Deadline,
    ) -> Result<Vec<Outcome>, ServiceError> {
        let mut outcomes = vec![Outcome::NoLimit; resolved.len()];
        let (mut counted, mut probes) = (Batch::default(), Batch::default());
        for (i, resolution) in resolved.iter().enumerate() {
            let Resolution::Limited(applied) = resolution else {
                continue;
            };
            match (applied.check_item(), applied.charge()) {
                (None, _) => outcomes[i] = Outcome::Zero,
                (Some(item), Charge::Probe) => probes.push(i, item),
                (Some(item), Charge::Hits(_)) => counted.push(i, item.with_spend(spend)),
            }
        }
        let (counted_results, probe_results) = tokio::join!(
            self.independent(&counted.items, deadline),
            self.peek_each(&probes.items, deadline),
        );
        self.settle(&counted, counted_results, Answer::Whole, &mut outcomes)?;
        self.settle(&probes, probe_results, Answer::Whole, &mut outcomes)?;
        Ok(outcomes)
    }

    /// All or nothing: the request's hits are counted only when it goes
    /// through, and a request that does not go through counts nothing.
    ///
    /// The enforced descriptors are one all-or-nothing batch. Probes are
    /// looked at first: an enforced one over denies the request before
    /// anything is counted. Quota-mode descriptors deny only when every one
    /// of them is over; when none is known to fit yet, the batch is tried
    /// with each in turn (or, with no enforced descriptor, all of them at
    /// once independently) until one fits. Shadow-mode descriptors, and
    /// quota-mode ones the answer no longer depends on, are counted once
    /// the request is known to go through, and only looked at otherwise;
    /// a store failure there is answered for that descriptor
    /// (`store.on_error`, `UNAVAILABLE` as over) and fails nothing else.
    async fn check_together(
        &self,
        resolved: &[Resolution<'_>],
        deadline: Deadline,
    ) -> Result<Vec<Outcome>, ServiceError> {
        let o = &self.options;
        let mut outcomes = vec![Outcome::NoLimit; resolved.len()];
        let (mut group, mut quotas, mut rest, mut probes) = (
            Batch::default(),
            Batch::default(),
            Batch::default(),
            Batch::default(),
        );
        // The effect of each probe's answer: (denies when over, quota).
        let mut probe_effects = Vec::new();
        // Whether the request is over before the store is asked; whether a
        // quota-mode descriptor is known not to be over.
        let (mut doomed, mut any_quota, mut quota_fits) = (false, false, false);
        for (i, resolution) in resolved.iter().enumerate() {
            let applied = match resolution {
                Resolution::Limited(applied) => applied,
                Resolution::NoLimit(_) => {
                    // Answered OK; under the server's quota mode, a quota
                    // descriptor that is not over.
                    any_quota |= o.quota_mode;
                    quota_fits |= o.quota_mode;
                    continue;
                }
                Resolution::Unlimited(_) => continue,
            };
            let quota = o.quota_mode || applied.quota_mode();
            let shadow = applied.shadow_mode();
            any_quota |= quota;
            // A shadow descriptor is never over in the answer.
            quota_fits |= quota && shadow;
            let Some(item) = applied.check_item() else {
                // A limit of 0 is over whatever the store holds.
                doomed |= !quota && !shadow;
                outcomes[i] = Outcome::Zero;
                continue;
            };
            match applied.charge() {
                Charge::Probe => {
                    probes.push(i, item);
                    probe_effects.push((!quota && !shadow, quota && !shadow));
                }
                Charge::Hits(_) if shadow => rest.push(i, item),
                Charge::Hits(_) if quota => quotas.push(i, item),
                Charge::Hits(_) => group.push(i, item),
            }
        }

        let probe_results = self.peek_each(&probes.items, deadline).await;
        self.settle(&probes, probe_results, Answer::Whole, &mut outcomes)?;
        for (&descriptor, (denies, quota)) in probes.descriptors.iter().zip(probe_effects) {
            let over = outcomes[descriptor].over();
            doomed |= denies && over;
            quota_fits |= quota && !over;
        }
        // Every quota-mode descriptor is over already (a limit of 0, a probe).
        doomed |= any_quota && !quota_fits && quotas.items.is_empty();

        let mut admitted = false;
        if !doomed && (!any_quota || quota_fits) {
            admitted = self.try_group(&group, &mut outcomes, deadline).await?;
        } else if !doomed && group.items.is_empty() {
            // Only quota-mode descriptors to count: each counts if it fits,
            // and the request goes through if one does.
            let results = self.independent(&quotas.items, deadline).await;
            self.settle(&quotas, results, Answer::PerItem, &mut outcomes)?;
            admitted = quotas.descriptors.iter().any(|&d| outcomes[d].admitted());
            quotas = Batch::default();
        } else if !doomed {
            // The group with each quota-mode descriptor in turn, until the
            // group is over, or one fits with it.
            let mut tried = 0;
            for (&descriptor, &item) in quotas.descriptors.iter().zip(&quotas.items) {
                tried += 1;
                let mut with = Batch {
                    descriptors: group.descriptors.clone(),
                    items: group.items.clone(),
                };
                with.push(descriptor, item);
                admitted = self.try_group(&with, &mut outcomes, deadline).await?;
                if admitted || group.descriptors.iter().any(|&d| outcomes[d].over()) {
                    break;
                }
            }
            quotas.descriptors.drain(..tried);
            quotas.items.drain(..tried);
        }

        // What the answer no longer depends on: counted if the request goes
        // through, looked at if it does not.
        rest.descriptors.append(&mut quotas.descriptors);
        rest.items.append(&mut quotas.items);
        let (group_results, rest_results) = tokio::join!(
            async {
                if doomed {
                    self.peek_rejected(&group.items, deadline).await
                } else {
                    Vec::new()
                }
            },
            async {
                if admitted {
                    self.independent(&rest.items, deadline).await
                } else {
                    self.peek_each(&rest.items, deadline).await
                }
            },
        );
        if doomed {
            self.settle(&group, group_results, Answer::Whole, &mut outcomes)?;
        }
        self.settle(&rest, rest_results, Answer::PerItem, &mut outcomes)?;
        Ok(outcomes)
    }

    /// Decides `group` as one all-or-nothing batch (nothing to decide is
    /// admitted); whether it was admitted.
    async fn try_group(
        &self,
        group: &Batch<'_>,
        outcomes: &mut [Outcome],
        deadline: Deadline,
    ) -> Result<bool, ServiceError> {
        if let [item] = group.items.as_slice() {
            let results = self.independent(std::slice::from_ref(item), deadline).await;
            self.settle(group, results, Answer::Whole, outcomes)?;
        } else {
            let results = self.all_or_nothing(&group.items, deadline).await;
            self.settle(group, results, Answer::Whole, outcomes)?;
        }
        Ok(group.descriptors.iter().all(|&d| outcomes[d].admitted()))
    }

    /// Records the store's answers for `batch` in `outcomes`, a failure as
    /// `store.on_error` and `answer` have it.
    fn settle(
        &self,
        batch: &Batch<'_>,
        results: Vec<ItemResult>,
        answer: Answer,
        outcomes: &mut [Outcome],
    ) -> Result<(), ServiceError> {
        for ((&descriptor, item), result) in batch.descriptors.iter().zip(&batch.items).zip(results)
        {
            let decision = result.or_else(|error| {
                crate::log::store_failed(&error);
                on_backend_error(&error, self.options.on_error, item.policy(), answer)
            })?;
            outcomes[descriptor] = Outcome::Decided(decision);
        }
        Ok(())
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

    /// Looks at each item, all at once.
    async fn peek_each(&self, items: &[CheckItem<'_>], deadline: Deadline) -> Vec<ItemResult> {
        self.store_ops.peek.increment(items.len() as u64);
        futures_util::future::join_all(items.iter().map(|item| self.backend.peek(item, deadline)))
            .await
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
