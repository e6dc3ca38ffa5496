//! A client of Envoy's RLQS built from the vendored protos, behaving as
//! Envoy's `rate_limit_quota` filter does (its `global_client_impl.cc`):
//!
//! - a bucket is created by its first request, which is decided by
//!   `no_assignment_behavior` (here: deny), and reported at once with
//!   `time_elapsed` 0;
//! - every bucket is reported on a fixed timer, `time_elapsed` in whole
//!   seconds, usage counters reset at each report;
//! - an assignment's TTL is read in whole seconds from when it arrives; an
//!   expired assignment falls back to `expired_assignment_behavior` (here:
//!   deny, as with none);
//! - a token bucket is Envoy's `AtomicTokenBucketImpl`: it starts full at
//!   `max_tokens` and refills continuously at `tokens_per_fill /
//!   fill_interval` (whole seconds) per second; an assignment whose token
//!   bucket equals the active one (`max_tokens`, `tokens_per_fill` and
//!   `fill_interval.nanos`, as Envoy compares them) keeps the bucket and
//!   its tokens; any other starts a new, full one;
//! - `requests_per_time_unit` is not enforced (Envoy logs and skips it);
//! - an abandon action erases the bucket.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pb::rate_limit_quota_response::bucket_action::BucketAction as Act;
use quotad_proto::envoy::service::rate_limit_quota::v3 as pb;
use quotad_proto::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use quotad_proto::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// What a simulated Envoy holds for one bucket.
#[derive(Debug)]
struct Cached {
    id: pb::BucketId,
    allowed: u64,
    denied: u64,
    last_report: Instant,
    action: Option<Active>,
}

#[derive(Clone, Debug)]
struct Active {
    expires: Instant,
    rule: Rule,
}

#[derive(Clone, Debug)]
enum Rule {
    Allow,
    Deny,
    Bucket(TokenBucket),
}

#[derive(Clone, Debug)]
struct TokenBucket {
    max_tokens: u32,
    tokens_per_fill: u32,
    fill_interval_nanos: i32,
    rate_per_s: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn consume(&mut self, now: Instant) -> bool {
        let elapsed = now.duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate_per_s).min(f64::from(self.max_tokens));
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The assignments one simulated Envoy received, as strategies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    Allow,
    Deny,
    Bucket {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval_s: i64,
        ttl_s: i64,
    },
    Abandon,
}

#[derive(Default)]
struct State {
    buckets: HashMap<Vec<(String, String)>, Cached>,
    /// Wall-clock microseconds of every admitted request.
    admitted: Vec<u64>,
    seen: Vec<(BTreeMap<String, String>, Seen)>,
    /// When each of `seen` arrived.
    seen_at: Vec<Instant>,
    /// The status the stream ended with, if the server ended it.
    closed: Option<tonic::Status>,
}

/// A simulated Envoy on one RLQS stream.
pub(crate) struct SimEnvoy {
    domain: String,
    state: Arc<Mutex<State>>,
    client: RateLimitQuotaServiceClient<Channel>,
    outbound: Option<mpsc::Sender<pb::RateLimitQuotaUsageReports>>,
    tasks: Vec<JoinHandle<()>>,
    report_every: Duration,
}

fn key_of(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut key: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    key.sort();
    key
}

pub(crate) fn now_us() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_micros(),
    )
    .expect("fits")
}

impl SimEnvoy {
    /// An Envoy of `domain` reporting every `report_every`, on `channel`.
    pub(crate) async fn start(channel: Channel, domain: &str, report_every: Duration) -> SimEnvoy {
        let mut envoy = SimEnvoy {
            domain: domain.to_owned(),
            state: Arc::default(),
            client: RateLimitQuotaServiceClient::new(channel),
            outbound: None,
            tasks: Vec::new(),
            report_every,
        };
        envoy.open().await;
        envoy
    }

    /// Opens a new stream (Envoy keeps its buckets across streams) and
    /// starts the report timer.
    pub(crate) async fn open(&mut self) {
        let (tx, rx) = mpsc::channel(64);
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        let response = self
            .client
            .stream_rate_limit_quotas(stream)
            .await
            .expect("open the RLQS stream");
        let mut inbound = response.into_inner();
        let state = Arc::clone(&self.state);
        self.tasks.push(tokio::spawn(async move {
            loop {
                match inbound.message().await {
                    Ok(Some(response)) => apply(&state, response),
                    Ok(None) => return,
                    Err(status) => {
                        state.lock().expect("state").closed = Some(status);
                        return;
                    }
                }
            }
        }));
        let state = Arc::clone(&self.state);
        let domain = self.domain.clone();
        let every = self.report_every;
        let timer_tx = tx.clone();
        self.tasks.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                ticks.tick().await;
                let report = build_report(&state, &domain, None);
                if report.bucket_quota_usages.is_empty() {
                    continue;
                }
                if timer_tx.send(report).await.is_err() {
                    return;
                }
            }
        }));
        self.outbound = Some(tx);
    }

    /// Breaks the stream as a lost connection would: no more reports or
    /// answers on it. The buckets and their assignments stay.
    pub(crate) fn break_stream(&mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
        self.outbound = None;
    }

    /// Decides one request of the bucket `pairs`, as Envoy's filter does.
    pub(crate) async fn request(&self, pairs: &[(&str, &str)]) -> bool {
        let key = key_of(pairs);
        let now = Instant::now();
        let (allowed, first) = {
            let mut state = self.state.lock().expect("state");
            let state = &mut *state;
            match state.buckets.get_mut(&key) {
                None => {
                    // No assignment yet: no_assignment_behavior is deny.
                    state.buckets.insert(
                        key.clone(),
                        Cached {
                            id: pb::BucketId {
                                bucket: pairs
                                    .iter()
                                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                                    .collect(),
                            },
                            allowed: 0,
                            denied: 1,
                            last_report: now,
                            action: None,
                        },
                    );
                    (false, true)
                }
                Some(cached) => {
                    if cached.action.as_ref().is_some_and(|a| a.expires <= now) {
                        cached.action = None;
                    }
                    let allowed = match cached.action.as_mut().map(|a| &mut a.rule) {
                        None | Some(Rule::Deny) => false,
                        Some(Rule::Allow) => true,
                        Some(Rule::Bucket(bucket)) => bucket.consume(now),
                    };
                    if allowed {
                        cached.allowed += 1;
                        state.admitted.push(now_us());
                    } else {
                        cached.denied += 1;
                    }
                    (allowed, false)
                }
            }
        };
        if first {
            let report = build_report(&self.state, &self.domain, Some(&key));
            if let Some(tx) = &self.outbound {
                let _ = tx.send(report).await;
            }
        }
        allowed
    }

    /// Sends `report` as is (for malformed reports).
    pub(crate) async fn send_raw(&self, report: pb::RateLimitQuotaUsageReports) {
        if let Some(tx) = &self.outbound {
            let _ = tx.send(report).await;
        }
    }

    /// Wall-clock microseconds of every admitted request so far.
    pub(crate) fn admitted(&self) -> Vec<u64> {
        self.state.lock().expect("state").admitted.clone()
    }

    /// Every assignment received, with its bucket.
    pub(crate) fn seen(&self) -> Vec<(BTreeMap<String, String>, Seen)> {
        self.state.lock().expect("state").seen.clone()
    }

    /// When each of [`SimEnvoy::seen`] arrived.
    pub(crate) fn seen_at(&self) -> Vec<Instant> {
        self.state.lock().expect("state").seen_at.clone()
    }

    /// The status the server closed the stream with, if it did.
    pub(crate) fn closed(&self) -> Option<tonic::Status> {
        self.state.lock().expect("state").closed.clone()
    }
}

impl Drop for SimEnvoy {
    fn drop(&mut self) {
        self.break_stream();
    }
}

fn build_report(
    state: &Mutex<State>,
    domain: &str,
    only: Option<&Vec<(String, String)>>,
) -> pb::RateLimitQuotaUsageReports {
    let mut state = state.lock().expect("state");
    let now = Instant::now();
    let mut usages = Vec::new();
    for (key, cached) in &mut state.buckets {
        if only.is_some_and(|o| o != key) {
            continue;
        }
        let elapsed = now.duration_since(cached.last_report).as_secs();
        cached.last_report = now;
        let usage = pb::rate_limit_quota_usage_reports::BucketQuotaUsage {
            bucket_id: Some(cached.id.clone()),
            time_elapsed: Some(prost_types::Duration {
                seconds: i64::try_from(elapsed).expect("fits"),
                nanos: 0,
            }),
            num_requests_allowed: std::mem::take(&mut cached.allowed),
            num_requests_denied: std::mem::take(&mut cached.denied),
        };
        usages.push(usage);
    }
    pb::RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages: usages,
    }
}

fn apply(state: &Mutex<State>, response: pb::RateLimitQuotaResponse) {
    let mut state = state.lock().expect("state");
    let now = Instant::now();
    for action in response.bucket_action {
        let Some(id) = action.bucket_id else { continue };
        let mut key: Vec<(String, String)> = id.bucket.clone().into_iter().collect();
        key.sort();
        let pairs: BTreeMap<String, String> = id.bucket.clone().into_iter().collect();
        let Some(cached) = state.buckets.get_mut(&key) else {
            continue;
        };
        match action.bucket_action {
            Some(Act::AbandonAction(_)) => {
                state.buckets.remove(&key);
                state.seen.push((pairs, Seen::Abandon));
                state.seen_at.push(now);
            }
            Some(Act::QuotaAssignmentAction(assignment)) => {
                let ttl_s = assignment.assignment_time_to_live.map_or(0, |d| d.seconds);
                // The timer has fired: the active assignment is gone.
                if cached.action.as_ref().is_some_and(|a| a.expires <= now) {
                    cached.action = None;
                }
                let strategy = assignment.rate_limit_strategy.and_then(|s| s.strategy);
                let (rule, seen) = match strategy {
                    None => (Rule::Allow, Seen::Allow),
                    Some(Strategy::BlanketRule(b)) if b == BlanketRule::DenyAll as i32 => {
                        (Rule::Deny, Seen::Deny)
                    }
                    Some(Strategy::BlanketRule(_)) => (Rule::Allow, Seen::Allow),
                    Some(Strategy::RequestsPerTimeUnit(_)) => {
                        // Envoy skips it: the bucket keeps what it had.
                        continue;
                    }
                    Some(Strategy::TokenBucket(tb)) => {
                        let fill = tb.fill_interval.unwrap_or_default();
                        let tokens_per_fill = tb.tokens_per_fill.unwrap_or(0);
                        let seen = Seen::Bucket {
                            max_tokens: tb.max_tokens,
                            tokens_per_fill,
                            fill_interval_s: fill.seconds,
                            ttl_s,
                        };
                        let same = match cached.action.as_ref().map(|a| &a.rule) {
                            Some(Rule::Bucket(old)) => {
                                old.max_tokens == tb.max_tokens
                                    && old.tokens_per_fill == tokens_per_fill
                                    && old.fill_interval_nanos == fill.nanos
                            }
                            _ => false,
                        };
                        let bucket = match (&cached.action, same) {
                            (
                                Some(Active {
                                    rule: Rule::Bucket(old),
                                    ..
                                }),
                                true,
                            ) => old.clone(),
                            _ => TokenBucket {
                                max_tokens: tb.max_tokens,
                                tokens_per_fill,
                                fill_interval_nanos: fill.nanos,
                                // Envoy divides by whole seconds.
                                rate_per_s: f64::from(tokens_per_fill) / fill.seconds as f64,
                                tokens: f64::from(tb.max_tokens),
                                last: now,
                            },
                        };
                        (Rule::Bucket(bucket), seen)
                    }
                };
                let ttl = Duration::from_secs(u64::try_from(ttl_s).expect("not negative"));
                cached.action = Some(Active {
                    expires: now + ttl,
                    rule,
                });
                state.seen.push((pairs, seen));
                state.seen_at.push(now);
            }
            None => {}
        }
    }
}
