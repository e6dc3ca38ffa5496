//! Envoy's Rate Limit Quota Service (RLQS), `StreamRateLimitQuotas`:
//! Envoy reports usage per bucket on a stream, and quotad answers each
//! bucket with an assignment Envoy enforces locally (`docs/rlqs.md`).
//!
//! Each assignment of a policy rule is a **lease** of the bucket's key
//! (quotad's grant ledger, where the key lives: memory, or the key's Redis
//! slot), charged when it is granted and cut into an Envoy token bucket
//! that cannot admit more than the lease holds
//! ([`quotad_core::AssignmentTerms::bucket`]). Usage reports are demand,
//! not debits: they size the next lease, and settle nothing. quotad
//! renews every assignment before its TTL ends, on its own timer (Envoy
//! reports only every few seconds), so the sum over every replica, stream
//! and Envoy stays within the policy: the store's lease rules bound what
//! its live leases can admit.
//!
//! A stream's first message names the domain; every message is checked in
//! full before anything is granted, and a bad one closes that stream alone
//! with INVALID_ARGUMENT naming the field. A closed stream's leases keep
//! counting until they end (Envoy keeps spending its assignments through a
//! reconnect).

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use pb::rate_limit_quota_response::BucketAction;
use pb::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Act, QuotaAssignmentAction,
};
use quotad_core::{
    Algorithm, AssignmentTerms, EnvoyBucket, LeaseAnswer, LeaseAsk, LeaseTerms, Settle,
};
use quotad_proto::envoy::service::rate_limit_quota::v3 as pb;
use quotad_proto::envoy::r#type::v3::{RateLimitStrategy, TokenBucket, rate_limit_strategy};
use rand::Rng as _;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::{Request, Response, Status, Streaming};

use super::RequestLimits;
use super::answer::store_failed;
use super::error::{ServiceError, to_status};
use crate::backend::{Backend, Deadline, LeaseItem};
use crate::metrics::{Method, Metrics};
use crate::policy::rlqs::{Action, RlqsRegistry};
use crate::registry::PolicyRegistry;

/// The most buckets one stream tracks; a report past it is refused.
pub(crate) const MAX_BUCKETS_PER_STREAM: usize = 10_000;

/// Reports in a row with no request in them after which a bucket is
/// abandoned (once its assignment has ended).
pub(crate) const IDLE_REPORTS_BEFORE_ABANDON: u32 = 6;

/// How long before an assignment's TTL ends quotad renews it (a quarter
/// of the TTL when that is shorter): time for the store call and the
/// answer to reach Envoy, and no more, since the old lease's unspent units
/// stay charged until it ends.
const RENEW_LEAD: Duration = Duration::from_millis(250);

/// The TTL of a deny-all answer given because nothing could be leased
/// (the budget is spent, the store failed, or what is left of a window is
/// under a second): quotad asks again before it ends.
const RETRY_TTL_S: u64 = 1;

/// The RLQS service over a backend `S`.
#[derive(Debug)]
pub(crate) struct RlqsService<S> {
    shared: Arc<Shared<S>>,
}

#[derive(Debug)]
struct Shared<S> {
    backend: Arc<S>,
    metrics: Arc<Metrics>,
    policies: Arc<PolicyRegistry>,
    rules: Arc<RlqsRegistry>,
    limits: RequestLimits,
}

impl<S: Backend> RlqsService<S> {
    pub(crate) fn new(
        backend: Arc<S>,
        metrics: Arc<Metrics>,
        policies: Arc<PolicyRegistry>,
        rules: Arc<RlqsRegistry>,
        limits: RequestLimits,
    ) -> Self {
        RlqsService {
            shared: Arc::new(Shared {
                backend,
                metrics,
                policies,
                rules,
                limits,
            }),
        }
    }
}

type Outbound = Pin<Box<dyn Stream<Item = Result<pb::RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<S: Backend> pb::rate_limit_quota_service_server::RateLimitQuotaService for RlqsService<S> {
    type StreamRateLimitQuotasStream = Outbound;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<pb::RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Outbound>, Status> {
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let session = Session {
            shared: Arc::clone(&self.shared),
            domain: None,
            buckets: HashMap::new(),
            tx,
        };
        tokio::spawn(session.run(inbound));
        let outbound = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(Response::new(Box::pin(outbound)))
    }
}

/// A bucket's identity: its pairs, sorted (the order Envoy sends them in
/// does not matter).
type BucketKey = Vec<(String, String)>;

/// One bucket a stream reported.
#[derive(Debug)]
struct Bucket {
    /// As Envoy sent it: answers echo it.
    id: pb::BucketId,
    /// Requests (admitted and denied) in the last report, and the seconds
    /// it covered.
    demand: (u64, u64),
    /// Reports in a row with no request.
    idle: u32,
    /// When quotad next renews the assignment.
    refresh_at: Instant,
    /// When Envoy's assignment ends, by quotad's clock (from the send).
    live_until: Instant,
    /// The token bucket last sent, if the last assignment was one.
    last: Option<EnvoyBucket>,
}

struct Session<S> {
    shared: Arc<Shared<S>>,
    domain: Option<String>,
    buckets: HashMap<BucketKey, Bucket>,
    tx: mpsc::Sender<Result<pb::RateLimitQuotaResponse, Status>>,
}

/// A report, checked: each bucket's key and what it reported.
struct Checked {
    usages: Vec<(BucketKey, pb::BucketId, u64, u64)>,
}

impl<S: Backend> Session<S> {
    async fn run(mut self, mut inbound: Streaming<pb::RateLimitQuotaUsageReports>) {
        loop {
            let next = self
                .buckets
                .values()
                .map(|b| b.refresh_at)
                .min()
                .unwrap_or_else(|| Instant::now() + Duration::from_secs(3_600));
            tokio::select! {
                message = inbound.message() => match message {
                    Ok(Some(reports)) => {
                        let checked = match self.check(reports) {
                            Ok(checked) => checked,
                            Err(error) => {
                                tracing::debug!(%error, "RLQS report refused; closing its stream");
                                let status = to_status(&error);
                                self.shared
                                    .metrics
                                    .request_error(Method::StreamRateLimitQuotas, status.code());
                                let _ = self.tx.send(Err(status)).await;
                                return;
                            }
                        };
                        if !self.report(checked).await {
                            return;
                        }
                    }
                    // The client closed its side, or the stream broke: its
                    // leases count until they end.
                    Ok(None) => return,
                    // A message that cannot be decoded (or a broken
                    // stream): counted, and the stream ends with its status.
                    Err(status) => {
                        self.shared
                            .metrics
                            .request_error(Method::StreamRateLimitQuotas, status.code());
                        tracing::debug!(%status, "RLQS stream ended by an error");
                        return;
                    }
                },
                () = tokio::time::sleep_until(next) => {
                    if !self.refresh_due().await {
                        return;
                    }
                }
                () = self.tx.closed() => return,
            }
        }
    }

    /// Checks a whole message before anything is granted.
    fn check(&mut self, reports: pb::RateLimitQuotaUsageReports) -> Result<Checked, ServiceError> {
        match (&self.domain, reports.domain.is_empty()) {
            (None, true) => {
                return Err(ServiceError::invalid(
                    "domain",
                    "must be set on a stream's first report",
                ));
            }
            (None, false) => {}
            (Some(_), true) => {}
            (Some(domain), false) if *domain == reports.domain => {}
            (Some(domain), false) => {
                return Err(ServiceError::invalid(
                    "domain",
                    format!(
                        "a stream keeps the domain of its first report ({domain:?}, got {:?}); open another stream for another domain",
                        reports.domain
                    ),
                ));
            }
        }
        let domain = self
            .domain
            .clone()
            .unwrap_or_else(|| reports.domain.clone());
        let rules = self.shared.rules.snapshot();
        let policies = self.shared.policies.snapshot();
        let mut usages = Vec::with_capacity(reports.bucket_quota_usages.len());
        let mut new = 0;
        for (i, usage) in reports.bucket_quota_usages.into_iter().enumerate() {
            let field = |name: &str| format!("bucket_quota_usages[{i}].{name}");
            let Some(id) = usage.bucket_id else {
                return Err(ServiceError::invalid(&field("bucket_id"), "must be set"));
            };
            if id.bucket.is_empty() {
                return Err(ServiceError::invalid(
                    &field("bucket_id.bucket"),
                    "must hold at least one pair",
                ));
            }
            if id.bucket.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
                return Err(ServiceError::invalid(
                    &field("bucket_id.bucket"),
                    "names and values must not be empty",
                ));
            }
            let elapsed = match usage.time_elapsed {
                None => return Err(ServiceError::invalid(&field("time_elapsed"), "must be set")),
                Some(d) if d.seconds < 0 || !(0..1_000_000_000).contains(&d.nanos) => {
                    return Err(ServiceError::invalid(
                        &field("time_elapsed"),
                        "must be a duration of 0 or more",
                    ));
                }
                Some(d) => u64::try_from(d.seconds).expect("not negative"),
            };
            let pairs: BTreeMap<&str, &str> = id
                .bucket
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            if let Action::Policy { policy, key, .. } = rules.find(&domain, &pairs).action {
                let key = key.key(&pairs);
                if key.len() > self.shared.limits.max_key_bytes {
                    return Err(ServiceError::invalid(
                        &field("bucket_id"),
                        format!(
                            "makes a key of {} bytes, more than store.max_key_bytes ({})",
                            key.len(),
                            self.shared.limits.max_key_bytes
                        ),
                    ));
                }
                if !policies
                    .get(policy)
                    .is_some_and(|(_, named)| named.settings.policy.algorithm().is_rate())
                {
                    tracing::warn!(policy = %policy, "RLQS rule names a policy that is not a configured rate policy; its buckets are denied");
                }
            }
            let bucket_key: BucketKey = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            if !self.buckets.contains_key(&bucket_key) {
                new += 1;
            }
            let demanded = usage
                .num_requests_allowed
                .saturating_add(usage.num_requests_denied);
            usages.push((bucket_key, id, demanded, elapsed));
        }
        if self.buckets.len() + new > MAX_BUCKETS_PER_STREAM {
            return Err(ServiceError::invalid(
                "bucket_quota_usages",
                format!("a stream tracks at most {MAX_BUCKETS_PER_STREAM} buckets"),
            ));
        }
        self.domain = Some(domain);
        Ok(Checked { usages })
    }

    /// Records what a checked report says; a bucket reported for the first
    /// time is answered at once. `false` once the client is gone.
    async fn report(&mut self, checked: Checked) -> bool {
        let mut fresh = Vec::new();
        for (key, id, demanded, elapsed) in checked.usages {
            match self.buckets.get_mut(&key) {
                Some(bucket) => {
                    bucket.demand = (demanded, elapsed);
                    bucket.idle = if demanded == 0 { bucket.idle + 1 } else { 0 };
                }
                // A bucket quotad does not track, reported with no request:
                // a report Envoy sent before it received the bucket's
                // abandon (or an idle bucket after a reconnect). Tracking it
                // would lease for a bucket Envoy may have forgotten, and
                // would leave unanswered the first report with which Envoy
                // starts it again; Envoy's next report with a request in it
                // starts it here.
                None if demanded == 0 => {}
                None => {
                    let now = Instant::now();
                    self.buckets.insert(
                        key.clone(),
                        Bucket {
                            id,
                            demand: (demanded, elapsed),
                            idle: 0,
                            refresh_at: now,
                            live_until: now,
                            last: None,
                        },
                    );
                    fresh.push(key);
                }
            }
        }
        // Each assignment goes out as soon as its lease is cut: its TTL
        // counts from now, so answering many buckets together would age the
        // first ones' leases by the time the others take.
        for key in fresh {
            if let Some(action) = self.assign(&key).await
                && !self.send(vec![action]).await
            {
                return false;
            }
        }
        true
    }

    /// Renews (or abandons) every bucket whose time has come.
    async fn refresh_due(&mut self) -> bool {
        let now = Instant::now();
        let due: Vec<BucketKey> = self
            .buckets
            .iter()
            .filter(|(_, b)| b.refresh_at <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let mut actions = Vec::new();
        for key in due {
            let Some(bucket) = self.buckets.get_mut(&key) else {
                continue;
            };
            if bucket.idle >= IDLE_REPORTS_BEFORE_ABANDON {
                // Freed only once its assignment has ended at Envoy: its
                // lease counts until then anyway.
                if bucket.live_until <= now {
                    let bucket = self.buckets.remove(&key).expect("just found");
                    actions.push(BucketAction {
                        bucket_id: Some(bucket.id),
                        bucket_action: Some(Act::AbandonAction(AbandonAction {})),
                    });
                } else {
                    bucket.refresh_at = bucket.live_until;
                }
                continue;
            }
            // Sent at once, as in `report`: the lease's TTL counts from now.
            if let Some(action) = self.assign(&key).await
                && !self.send(vec![action]).await
            {
                return false;
            }
        }
        self.send(actions).await
    }

    async fn send(&self, actions: Vec<BucketAction>) -> bool {
        if actions.is_empty() {
            return true;
        }
        let response = pb::RateLimitQuotaResponse {
            bucket_action: actions,
        };
        self.tx.send(Ok(response)).await.is_ok()
    }

    /// The next assignment of the bucket `key`, and when to renew it.
    async fn assign(&mut self, key: &BucketKey) -> Option<BucketAction> {
        let bucket = self.buckets.get(key)?;
        let domain = self.domain.clone().unwrap_or_default();
        let pairs: BTreeMap<&str, &str> =
            key.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let rules = self.shared.rules.snapshot();
        let (strategy, ttl_s, renew_after, sent) = match rules.find(&domain, &pairs).action {
            Action::AllowAll { ttl_s } => (
                blanket(rate_limit_strategy::BlanketRule::AllowAll),
                *ttl_s,
                None,
                None,
            ),
            Action::DenyAll { ttl_s } => (
                blanket(rate_limit_strategy::BlanketRule::DenyAll),
                *ttl_s,
                None,
                None,
            ),
            Action::Policy {
                policy,
                key: template,
                terms,
            } => {
                let key = template.key(&pairs);
                self.lease(policy, &key, terms, bucket.demand, bucket.last.as_ref())
                    .await
            }
        };
        let now = Instant::now();
        let bucket = self.buckets.get_mut(key)?;
        if let (Some(retry), None) = (renew_after, &sent)
            && bucket.live_until > now
        {
            // (`last` stays: it is what Envoy still holds.)
            // Nothing could be leased, but Envoy's assignment has not ended:
            // it keeps it (charged when granted) while quotad asks again.
            bucket.refresh_at = now + retry.min(bucket.live_until - now);
            return None;
        }
        let ttl = Duration::from_secs(ttl_s);
        let regular = ttl - (ttl / 4).min(RENEW_LEAD);
        let renew_after = match (renew_after, &sent) {
            // A lease that ends with its window: renewed no later than the
            // last moment a renewal still gets a whole second of it.
            (Some(latest), Some(_)) => regular.min(latest),
            (Some(retry), None) => retry,
            (None, _) => regular,
        };
        bucket.refresh_at = now + renew_after;
        bucket.last = sent;
        bucket.live_until = now + ttl;
        Some(BucketAction {
            bucket_id: Some(bucket.id.clone()),
            bucket_action: Some(Act::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(prost_types::Duration {
                    seconds: i64::try_from(ttl_s).expect("at most a day"),
                    nanos: 0,
                }),
                rate_limit_strategy: Some(strategy),
            })),
        })
    }

    /// A lease of `key` under `policy`, as a token bucket; deny-all and
    /// when to ask again (`Some`) when nothing can be leased.
    async fn lease(
        &self,
        policy: &str,
        key: &str,
        terms: &AssignmentTerms,
        (demanded, elapsed): (u64, u64),
        last: Option<&EnvoyBucket>,
    ) -> (
        RateLimitStrategy,
        u64,
        Option<Duration>,
        Option<EnvoyBucket>,
    ) {
        let deny = |retry: Duration| {
            (
                blanket(rate_limit_strategy::BlanketRule::DenyAll),
                RETRY_TTL_S,
                Some(retry),
                None,
            )
        };
        let retry = Duration::from_millis(500);
        let set = self.shared.policies.snapshot();
        // A policy removed, or reloaded into a concurrency one (whose slots
        // are no lease): its buckets are denied.
        let Some((namespace, named, active)) = set
            .get_for(policy, key)
            .filter(|(_, named, _)| named.settings.policy.algorithm().is_rate())
        else {
            return deny(retry);
        };
        // The key's override, if one is in force: the same counting, other
        // numbers.
        let counted = active.map_or(named.settings.policy, |a| a.policy);
        let lease_terms = match LeaseTerms::try_new(
            terms.max_units(),
            1,
            Duration::from_millis(terms.lease_ms()),
        ) {
            Ok(t) => t,
            Err(error) => {
                tracing::warn!(%error, "RLQS lease terms refused");
                return deny(retry);
            }
        };
        let mut item = LeaseItem {
            name: namespace,
            key,
            policy: counted,
            terms: lease_terms,
            ask: LeaseAsk {
                settle: None,
                want: terms.want(demanded, elapsed),
                new_id: rand::rng().random(),
            },
        };
        let deadline = Deadline::after(self.shared.limits.request_timeout);
        let grant = match self.shared.backend.lease(&item, deadline).await {
            Ok(Ok(outcome)) => match outcome.answer {
                LeaseAnswer::Granted(grant) => grant,
                LeaseAnswer::Direct | LeaseAnswer::None => return deny(retry),
            },
            Ok(Err(error)) => {
                tracing::warn!(%error, "RLQS lease refused by the store");
                return deny(retry);
            }
            Err(error) => {
                store_failed(&error);
                return deny(retry);
            }
        };
        let lease_ms = grant.ends_at.saturating_sub(grant.granted_at);
        // The buckets' leases are shares of a rate: Envoy spreads them over
        // their life. Any other algorithm's lease is all there at once.
        let cut = match counted.algorithm() {
            Algorithm::TokenBucket | Algorithm::LeakyBucket => terms.bucket(grant.units, lease_ms),
            _ => terms.window_bucket(grant.units, lease_ms),
        };
        match cut.map(|b| b.unlike(last)) {
            Some(bucket) => (
                RateLimitStrategy {
                    strategy: Some(rate_limit_strategy::Strategy::TokenBucket(TokenBucket {
                        max_tokens: bucket.max_tokens,
                        tokens_per_fill: Some(bucket.tokens_per_fill),
                        fill_interval: Some(prost_types::Duration {
                            seconds: i64::try_from(bucket.fill_interval_s)
                                .expect("a day and a minute at most"),
                            nanos: 0,
                        }),
                        name: String::new(),
                    })),
                },
                bucket.ttl_s,
                // Cut short by its window's end: a renewal after this
                // would leave under a second of the window, and none.
                (lease_ms < terms.lease_ms())
                    .then(|| lease_ms.checked_sub(terms.margin_ms() + 1_000))
                    .flatten()
                    .map(Duration::from_millis),
                Some(bucket),
            ),
            None => {
                // Under a second of the window is left after the margin:
                // Envoy's whole-second TTL cannot end within it. The units
                // go back, and the bucket is denied until the window ends.
                item.ask = LeaseAsk {
                    settle: Some(Settle {
                        id: grant.id,
                        ends_at: grant.ends_at,
                        spent: 0,
                    }),
                    want: 0,
                    new_id: 0,
                };
                if let Err(error) = self.shared.backend.lease(&item, deadline).await {
                    store_failed(&error);
                }
                deny(Duration::from_millis(lease_ms + 1))
            }
        }
    }
}

fn blanket(rule: rate_limit_strategy::BlanketRule) -> RateLimitStrategy {
    RateLimitStrategy {
        strategy: Some(rate_limit_strategy::Strategy::BlanketRule(rule.into())),
    }
}
