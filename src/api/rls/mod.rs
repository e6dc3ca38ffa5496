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
//!   counted once the request is known to go through. Where the backend
//!   cannot promise one atomic batch ([`Backend::atomicity`]: a Redis
//!   Cluster, whose keys live in different slots, or a batch too large)
//!   the descriptors are decided on their own, as the reference does.
//! - `reference`: envoyproxy/ratelimit's counting: each descriptor on its
//!   own, and a denied hit spends what is left of its budget
//!   ([`Spend::Always`]), which makes a fixed window decide exactly as the
//!   reference's counter. A backend that cannot spend atomically
//!   ([`Backend::spends_when_denied`]) gets a second check of what the
//!   denial left.
//!
//! The answer follows the reference: [`status`] builds each descriptor's
//! status, the overall code and the optional headers.
//!
//! How a request is counted (alone, each on
//! its own, or together) and the verdict on a store failure are one plan,
//! read together; the answer's shape is in `status.rs`, the rules in
//! `crate::policy::rls`.

mod status;

use std::sync::Arc;

use quotad_core::{Algorithm, BatchMode, CheckItem, Clock, Decision, Policy, Reason, Spend};
use quotad_proto::MAX_BATCH_ITEMS;
use quotad_proto::envoy::service::ratelimit::v3 as pb;
use smallvec::SmallVec;
use tonic::{Request, Response, Status};

use super::answer::{Answer, StoreOps, on_backend_error, store_failed};
use super::error::ServiceError;
use crate::backend::{Atomicity, Backend, BackendError, Deadline, ItemResult};
use crate::config::{Config, CountMode, LimitSettings, OnError, ResponseHeaders};
use crate::metrics::{Method, Metrics};
use crate::policy::rls::{self as rules, Applied, Charge, Resolution};
use crate::registry::PolicyRegistry;
use crate::registry::RlsRegistry;

/// How `ShouldRateLimit` answers, from `[rls]` and `[store]`.
#[derive(Clone, Debug)]
pub(crate) struct RlsOptions {
    pub(crate) count_mode: CountMode,
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
    /// The named policies' registry, for `[limits]` as in force now: a
    /// `limit` sent on a descriptor is bounded as an inline policy is.
    policies: Arc<PolicyRegistry>,
    metrics: Arc<Metrics>,
    options: RlsOptions,
    store_ops: StoreOps,
}

/// The descriptors of a request up to which its working lists need no
/// heap allocation.
const FEW: usize = 4;

/// A working list of a request's descriptors.
type Few<T> = SmallVec<[T; FEW]>;

/// Store items decided together, with the descriptor of each.
#[derive(Default)]
struct Batch<'a> {
    descriptors: Few<usize>,
    items: Few<CheckItem<'a>>,
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

    /// Whether the store failed, and `store.on_error` passed it on.
    pub(crate) fn failed(self) -> bool {
        matches!(self, Outcome::Decided(d) if d.reason == Reason::Unavailable)
    }

    /// Whether the store did not answer (it failed, whatever `on_error`
    /// made of it): the budget it left is not known.
    pub(crate) fn unknown(self) -> bool {
        matches!(self, Outcome::Decided(d) if matches!(d.reason, Reason::Unavailable | Reason::FailOpen | Reason::FailClosed))
    }
}

/// Answers of items that were only looked at, because the request does
/// not go through: those that would have fitted are rejected with it.
fn reject(results: &mut [ItemResult]) {
    for decision in results.iter_mut().flatten() {
        if decision.allowed {
            decision.allowed = false;
            decision.reason = Reason::BatchRejected;
        }
    }
}

/// What the store said about a request's descriptors so far, and the first
/// failure that `store.on_error` passes on (`error`, or a fault).
struct Answers {
    outcomes: Few<Outcome>,
    failure: Option<BackendError>,
}

impl Answers {
    fn new(descriptors: usize) -> Self {
        Answers {
            outcomes: SmallVec::from_elem(Outcome::NoLimit, descriptors),
            failure: None,
        }
    }
}

/// What a descriptor's answer does to the request's overall code, as
/// envoyproxy/ratelimit has it: declared once, for counting
/// ([`RlsService::check_together`]), for a failure ([`RlsService::verdict`])
/// and for the answer ([`status::respond`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Role {
    /// A quota-mode descriptor: the request is denied only when every one
    /// of them is over.
    pub(crate) quota: bool,
    /// Never over in the answer: a shadow-mode rule, or no limit.
    pub(crate) never_over: bool,
}

impl Role {
    /// The role of a descriptor; `None` for one that plays no part
    /// (`unlimited`).
    pub(crate) fn of(options: &RlsOptions, resolution: &Resolution<'_>) -> Option<Role> {
        match resolution {
            Resolution::Unlimited(_) => None,
            Resolution::NoLimit(_) => Some(Role {
                quota: options.quota_mode,
                never_over: true,
            }),
            Resolution::Limited(applied) => Some(Role {
                quota: options.quota_mode || applied.quota_mode(),
                never_over: applied.shadow_mode(),
            }),
        }
    }

    /// Whether the descriptor over denies the request.
    fn denies(self) -> bool {
        !self.quota && !self.never_over
    }
}

/// The quota-mode descriptors of a request: whether there are any, whether
/// one is known to fit, whether one could not be decided.
#[derive(Clone, Copy, Debug, Default)]
struct QuotaState {
    any: bool,
    fits: bool,
    failed: bool,
}

impl QuotaState {
    fn add(&mut self, fits: bool, failed: bool) {
        self.any = true;
        self.fits |= fits && !failed;
        self.failed |= failed;
    }

    /// Whether the request's fate rests on a quota-mode descriptor the
    /// store failed on.
    fn undecided(self) -> bool {
        self.any && !self.fits && self.failed
    }
}

impl RlsOptions {
    /// The options `config` sets.
    pub(crate) fn new(config: &Config) -> Self {
        let rls = config.rls();
        RlsOptions {
            count_mode: rls.count_mode,
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
        policies: Arc<PolicyRegistry>,
        metrics: Arc<Metrics>,
        options: RlsOptions,
    ) -> Self {
        let name = backend.name();
        let store_ops = StoreOps::new(&metrics, name);
        if options.count_mode == CountMode::AllOrNothing
            && backend.atomicity(std::iter::empty()) == Atomicity::IfColocated
        {
            tracing::info!(
                backend = name,
                "the descriptors of an RLS request are decided one by one (this backend decides a batch atomically only when its keys live together, as on a Redis Cluster)"
            );
        }
        if options.count_mode == CountMode::Reference && !backend.spends_when_denied() {
            tracing::info!(
                backend = name,
                "rls.count_mode = reference: a denied hit is spent by a second check (this backend cannot spend within the denial)"
            );
        }
        RlsService {
            backend,
            rules,
            policies,
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
        if request.descriptors.iter().any(|d| d.limit.is_some()) {
            check_overrides(&request, self.policies.snapshot().limits())?;
        }
        for resolution in &mut resolved {
            if let Resolution::Limited(applied) = resolution {
                applied.bound_key(self.options.max_key_bytes);
            }
        }
        let spend = match self.options.count_mode {
            CountMode::Reference => Spend::Always,
            CountMode::AllOrNothing => Spend::WhenAdmitted,
        };
        let mut answers = Answers::new(resolved.len());
        // The common case, one descriptor with a limit: one store call and
        // no lists to sort the answers back from.
        if let [Resolution::Limited(applied)] = resolved.as_slice()
            && let Some(item) = applied.check_item()
        {
            let result = self.check_alone(applied, item, spend, deadline).await;
            self.settle_one(&mut answers, 0, &item, result);
        } else {
            // Boxed: its state is larger than the whole of the common
            // case's, and would otherwise be part of every call's future.
            Box::pin(self.check_many(&resolved, spend, deadline, &mut answers)).await;
        }
        let verdict = self.verdict(&resolved, &answers);
        status::record(&resolved, &answers.outcomes, &set, verdict.is_ok());
        verdict?;
        let response = status::respond(
            &resolved,
            &answers.outcomes,
            &set,
            &self.options,
            &self.metrics,
        );
        let over = response.overall_code == pb::rate_limit_response::Code::OverLimit as i32;
        crate::grpc::trace::record_rls(
            request.domain,
            if over { "denied" } else { "allowed" },
            resolved.len(),
        );
        Ok(response)
    }

    /// Whether the answer stands although the store failed on some
    /// descriptors (`store.on_error = "error"`, or a fault): it does when
    /// it is the same whatever they would have said, and the call fails
    /// with the store's error otherwise.
    fn verdict(&self, resolved: &[Resolution<'_>], answers: &Answers) -> Result<(), ServiceError> {
        let Some(error) = &answers.failure else {
            return Ok(());
        };
        if self.options.shadow_mode {
            // Every request goes through.
            return Ok(());
        }
        let (mut enforced_failed, mut quota) = (false, QuotaState::default());
        for (resolution, outcome) in resolved.iter().zip(&answers.outcomes) {
            let Some(role) = Role::of(&self.options, resolution) else {
                continue;
            };
            let (failed, over) = (outcome.failed(), outcome.over());
            if role.quota {
                quota.add(role.never_over || !over, failed);
            } else if !role.never_over {
                if over && !failed {
                    // Denied, whatever the failed descriptors say.
                    return Ok(());
                }
                enforced_failed |= failed;
            }
        }
        if enforced_failed || quota.undecided() {
            Err(error.clone().into())
        } else {
            Ok(())
        }
    }

    /// The store's result for the one limited descriptor of a request.
    async fn check_alone(
        &self,
        applied: &Applied<'_>,
        item: CheckItem<'_>,
        spend: Spend,
        deadline: Deadline,
    ) -> ItemResult {
        match applied.charge() {
            Charge::Probe => {
                self.store_ops.peek.increment(1);
                self.backend.peek(&item, deadline).await
            }
            Charge::Hits(_) => {
                self.store_ops.check.increment(1);
                let item = item.with_spend(spend);
                let mut result = [self.backend.check_one(&item, deadline).await];
                if spend == Spend::Always && !self.backend.spends_when_denied() {
                    Box::pin(self.spend_rest(std::slice::from_ref(&item), &mut result, deadline))
                        .await;
                }
                let [result] = result;
                result
            }
        }
    }

    /// Asks the store about every limited descriptor of a request that is
    /// not the common case.
    async fn check_many(
        &self,
        resolved: &[Resolution<'_>],
        spend: Spend,
        deadline: Deadline,
        answers: &mut Answers,
    ) {
        let o = &self.options;
        if o.count_mode == CountMode::Reference || o.shadow_mode || !self.one_batch(resolved) {
            self.check_each(resolved, spend, deadline, answers).await;
        } else {
            self.check_together(resolved, deadline, answers).await;
        }
    }

    /// Whether every limited descriptor of a request is sure to be one
    /// atomic all-or-nothing batch in the store (on Redis, within
    /// `store.redis.max_atomic_items`, and not on a Cluster, where keys
    /// live in different slots). A request that could not is counted
    /// descriptor by descriptor rather than failed: Envoy would let a
    /// failed call through.
    fn one_batch(&self, resolved: &[Resolution<'_>]) -> bool {
        let items = resolved.iter().filter_map(|r| match r {
            Resolution::Limited(applied) => applied.check_item(),
            _ => None,
        });
        self.backend.atomicity(items) == Atomicity::Atomic
    }

    /// Each descriptor on its own (the reference's counting, a Cluster, the
    /// server's shadow mode, where every request goes through): the
    /// counted ones in one independent call, probes by peeking.
    async fn check_each(
        &self,
        resolved: &[Resolution<'_>],
        spend: Spend,
        deadline: Deadline,
        answers: &mut Answers,
    ) {
        let (mut counted, mut probes) = (Batch::default(), Batch::default());
        for (i, resolution) in resolved.iter().enumerate() {
            let Resolution::Limited(applied) = resolution else {
                continue;
            };
            match (applied.check_item(), applied.charge()) {
                (None, _) => answers.outcomes[i] = Outcome::Zero,
                (Some(item), Charge::Probe) => probes.push(i, item),
                (Some(item), Charge::Hits(_)) => counted.push(i, item.with_spend(spend)),
            }
        }
        let (counted_results, probe_results) = tokio::join!(
            self.independent(&counted.items, deadline),
            self.peek_each(&probes.items, deadline),
        );
        self.settle(answers, &counted, counted_results);
        self.settle(answers, &probes, probe_results);
    }

    /// All or nothing: the request's hits are counted only when it goes
    /// through, and a request that does not go through counts nothing.
    ///
    /// 1. Probes, and quota-mode descriptors when the answer depends on
    ///    them, are looked at, all at once. An enforced probe over denies
    ///    the request; so do quota-mode descriptors all over.
    /// 2. The enforced descriptors are one all-or-nothing batch, with the
    ///    first quota-mode descriptor that fitted when one must fit (and,
    ///    only if another request took its budget in between, again with
    ///    the next). With no enforced descriptor, the quota-mode ones that
    ///    fitted are checked at once, each counted if it still fits.
    /// 3. Shadow-mode descriptors, and quota-mode ones the answer no longer
    ///    depends on, are counted once the request is known to go through,
    ///    and answered as looked at (not counted) when it does not.
    ///
    /// Four store round trips at most (more only while other requests take
    /// the budgets tried), one when every descriptor is enforced. A store
    /// failure is answered for its descriptor, and fails the call only when
    /// the answer depends on it ([`Self::verdict`]).
    async fn check_together(
        &self,
        resolved: &[Resolution<'_>],
        deadline: Deadline,
        answers: &mut Answers,
    ) {
        let (mut group, mut quotas, mut rest, mut probes) = (
            Batch::default(),
            Batch::default(),
            Batch::default(),
            Batch::default(),
        );
        // Each probe's role, in order.
        let mut probe_roles: Few<Role> = Few::new();
        // Whether the request is over before the store is asked.
        let mut doomed = false;
        let mut quota = QuotaState::default();
        for (i, resolution) in resolved.iter().enumerate() {
            let Some(role) = Role::of(&self.options, resolution) else {
                continue;
            };
            quota.any |= role.quota;
            if role.quota && role.never_over {
                quota.add(true, false);
            }
            let Resolution::Limited(applied) = resolution else {
                continue;
            };
            let Some(item) = applied.check_item() else {
                // A limit of 0 is over whatever the store holds.
                answers.outcomes[i] = Outcome::Zero;
                if role.quota && !role.never_over {
                    quota.add(false, false);
                }
                doomed |= role.denies();
                continue;
            };
            match applied.charge() {
                Charge::Probe => {
                    probes.push(i, item);
                    probe_roles.push(role);
                }
                Charge::Hits(_) if role.never_over => rest.push(i, item),
                Charge::Hits(_) if role.quota => quotas.push(i, item),
                Charge::Hits(_) => group.push(i, item),
            }
        }

        // 1. Look.
        let look_at_quotas = !doomed && quota.any && !quota.fits;
        let (probe_results, quota_looks) =
            tokio::join!(self.peek_each(&probes.items, deadline), async {
                if look_at_quotas {
                    self.peek_each(&quotas.items, deadline).await
                } else {
                    Vec::new()
                }
            },);
        self.settle(answers, &probes, probe_results);
        for (&descriptor, role) in probes.descriptors.iter().zip(&probe_roles) {
            let outcome = answers.outcomes[descriptor];
            doomed |= role.denies() && outcome.over();
            if role.quota && !role.never_over {
                quota.add(!outcome.over(), outcome.failed());
            }
        }
        // The quota-mode descriptors that fitted when looked at.
        let mut fitting = Batch::default();
        if look_at_quotas {
            let mut looks = quota_looks;
            reject(&mut looks);
            self.settle(answers, &quotas, looks);
            for (&descriptor, &item) in quotas.descriptors.iter().zip(&quotas.items) {
                let outcome = answers.outcomes[descriptor];
                quota.add(false, outcome.failed());
                if !outcome.over() {
                    fitting.push(descriptor, item);
                }
            }
            quotas = Batch::default();
        }
        doomed |= quota.any && !quota.fits && fitting.items.is_empty();

        // 2. Decide.
        let mut admitted = false;
        if doomed {
            let mut results = self.peek_each(&group.items, deadline).await;
            reject(&mut results);
            self.settle(answers, &group, results);
        } else if !quota.any || quota.fits {
            admitted = self.try_group(&group, answers, deadline).await;
        } else if group.items.is_empty() {
            let results = self.independent(&fitting.items, deadline).await;
            self.settle(answers, &fitting, results);
            admitted = fitting
                .descriptors
                .iter()
                .any(|&d| answers.outcomes[d].admitted());
            fitting = Batch::default();
        } else {
            // One try, and another only when another request took the
            // budget of the one tried since it was looked at.
            let mut tried = 0;
            for (&descriptor, &item) in fitting.descriptors.iter().zip(&fitting.items) {
                tried += 1;
                let mut with = Batch {
                    descriptors: group.descriptors.clone(),
                    items: group.items.clone(),
                };
                with.push(descriptor, item);
                admitted = self.try_group(&with, answers, deadline).await;
                if admitted
                    || group
                        .descriptors
                        .iter()
                        .any(|&d| answers.outcomes[d].over())
                {
                    break;
                }
            }
            fitting.descriptors.drain(..tried);
            fitting.items.drain(..tried);
        }

        // 3. What the answer no longer depends on.
        rest.descriptors.append(&mut quotas.descriptors);
        rest.items.append(&mut quotas.items);
        if admitted {
            rest.descriptors.append(&mut fitting.descriptors);
            rest.items.append(&mut fitting.items);
            let results = self.independent(&rest.items, deadline).await;
            self.settle(answers, &rest, results);
        } else {
            let mut results = self.peek_each(&rest.items, deadline).await;
            reject(&mut results);
            self.settle(answers, &rest, results);
        }
    }

    /// Decides `group` as one all-or-nothing batch (nothing to decide is
    /// admitted); whether it was admitted.
    async fn try_group(
        &self,
        group: &Batch<'_>,
        answers: &mut Answers,
        deadline: Deadline,
    ) -> bool {
        let results = if let [item] = group.items.as_slice() {
            self.independent(std::slice::from_ref(item), deadline).await
        } else {
            self.all_or_nothing(&group.items, deadline).await
        };
        self.settle(answers, group, results);
        group
            .descriptors
            .iter()
            .all(|&d| answers.outcomes[d].admitted())
    }

    /// Records the store's results for `batch`.
    fn settle(&self, answers: &mut Answers, batch: &Batch<'_>, results: Vec<ItemResult>) {
        for ((&descriptor, item), result) in batch.descriptors.iter().zip(&batch.items).zip(results)
        {
            self.settle_one(answers, descriptor, item, result);
        }
    }

    /// Records the store's result for one descriptor: a failure as
    /// `store.on_error` has it, and the first failure it passes on.
    fn settle_one(
        &self,
        answers: &mut Answers,
        descriptor: usize,
        item: &CheckItem<'_>,
        result: ItemResult,
    ) {
        let decision = result.unwrap_or_else(|error| {
            store_failed(&error);
            let decision = on_backend_error(
                &error,
                self.options.on_error,
                item.policy(),
                Answer::PerItem,
            )
            .expect("a failure answered per item is a decision");
            if decision.reason == Reason::Unavailable && answers.failure.is_none() {
                answers.failure = Some(error);
            }
            decision
        });
        answers.outcomes[descriptor] = Outcome::Decided(decision);
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
        let mut results = self.check_independent(items, deadline).await;
        if !self.backend.spends_when_denied() {
            Box::pin(self.spend_rest(items, &mut results, deadline)).await;
        }
        results
    }

    /// One store call deciding each item on its own.
    async fn check_independent(
        &self,
        items: &[CheckItem<'_>],
        deadline: Deadline,
    ) -> Vec<ItemResult> {
        match items {
            [] => Vec::new(),
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
        }
    }

    /// For a backend that does not spend on denial: each item marked
    /// [`Spend::Always`] that was denied with budget left spends it by a
    /// second check of exactly that much, all of them in one store call.
    /// Never admits more than the limit; another request may take the
    /// budget in between, and then the second check is simply denied.
    async fn spend_rest(
        &self,
        items: &[CheckItem<'_>],
        results: &mut [ItemResult],
        deadline: Deadline,
    ) {
        // Which results the second checks are for, and the checks.
        let (mut of, mut rests): (Few<usize>, Few<CheckItem<'_>>) = Default::default();
        for (i, (item, result)) in items.iter().zip(results.iter()).enumerate() {
            if let Ok(decision) = result
                && item.spend() == Spend::Always
                && !decision.allowed
                && decision.remaining > 0
                && let Ok(rest) =
                    CheckItem::new(item.name(), *item.policy(), item.key(), decision.remaining)
            {
                of.push(i);
                rests.push(rest);
            }
        }
        let spent = self.check_independent(&rests, deadline).await;
        for (i, result) in of.into_iter().zip(spent) {
            match (result, &mut results[i]) {
                (Ok(_), Ok(decision)) => decision.remaining = 0,
                // A failure is logged (throttled); the hit stays uncounted.
                (Err(error), _) => store_failed(&error),
                // Only decided items have second checks.
                (Ok(_), Err(_)) => {}
            }
        }
    }

    /// Looks at each item, in one store call where the store can.
    async fn peek_each(&self, items: &[CheckItem<'_>], deadline: Deadline) -> Vec<ItemResult> {
        if items.is_empty() {
            return Vec::new();
        }
        // One call, however many items it looks at (as a batch counts one
        // `check_batch`).
        self.store_ops.peek.increment(1);
        self.backend.peek_each(items, deadline).await
    }
}

/// Refuses the `limit`s sent on descriptors that `[limits]` does not allow.
/// Such a limit is chosen by the caller, as an inline policy of
/// `quotad.v1` is (a fixed window of the unit), and is bounded the same
/// way: refused when inline policies are off, above
/// `limits.max_inline_window` or `limits.max_inline_limit`. Otherwise a
/// caller could pin a key for a year per descriptor value it makes up.
/// Called once the request resolved (every sent unit is known).
fn check_overrides(
    request: &rules::Request<'_>,
    limits: &LimitSettings,
) -> Result<(), ServiceError> {
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        let Some(sent) = descriptor.limit else {
            continue;
        };
        let field = |name: &str| format!("descriptors[{i}].limit{name}");
        if !limits.allow_inline_policies {
            return Err(ServiceError::InlineDisabled { field: field("") });
        }
        let unit = rules::Unit::from_number(sent.unit).expect("resolve refuses unknown units");
        // A limit of 0 stores nothing, and is bounded as a limit of 1.
        let policy = Policy::try_new(
            Algorithm::FixedWindow,
            u64::from(sent.requests_per_unit.max(1)),
            unit.window(),
            None,
        )
        .expect("a fixed window takes any 32-bit limit over any unit");
        limits.check_inline(&policy).map_err(|(name, message)| {
            if name == "window_ms" {
                let message = format!(
                    "a {} is longer than limits.max_inline_window allows for a limit the caller sends ({message})",
                    unit.as_str()
                );
                ServiceError::invalid(&field(".unit"), message)
            } else {
                ServiceError::invalid(&field(".requests_per_unit"), message)
            }
        })?;
    }
    Ok(())
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
        let timeout = self.options.request_timeout;
        super::serve(
            &self.metrics,
            Method::ShouldRateLimit,
            request,
            timeout,
            |r, d| async move { self.decide(&r, d).await },
        )
        .await
    }
}
