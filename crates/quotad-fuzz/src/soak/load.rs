//! The load: paced workers sending a mix of calls, and the checker.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use quotad_proto::v1::quota_client::QuotaClient;
use quotad_proto::v1::{self as pb, check_request};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::sync::Mutex;
use tonic::transport::{Channel, Endpoint};

use super::verdict::CheckerAnswer;

/// Connects to `target`, retrying until the server answers a `Peek` or
/// `within` has passed.
pub(super) async fn connect(target: &str, within: Duration) -> anyhow::Result<Channel> {
    let deadline = Instant::now() + within;
    let endpoint = Endpoint::from_shared(target.to_owned())?.timeout(Duration::from_secs(5));
    loop {
        let attempt = async {
            let channel = endpoint.connect().await?;
            QuotaClient::new(channel.clone())
                .peek(named("checker", "checker", 1))
                .await?;
            anyhow::Ok(channel)
        };
        match attempt.await {
            Ok(channel) => return Ok(channel),
            Err(e) if Instant::now() > deadline => {
                return Err(e).context(format!("quotad did not answer on {target}"));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

fn named(key: &str, policy: &str, cost: u64) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.to_owned(),
        cost: (cost != 1).then_some(cost),
        policy: Some(check_request::Policy::PolicyName(policy.to_owned())),
    }
}

fn inline(key: &str) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.to_owned(),
        cost: None,
        policy: Some(check_request::Policy::InlinePolicy(pb::Policy {
            algorithm: pb::Algorithm::TokenBucket.into(),
            limit: 20,
            window_ms: 1_000,
            burst: Some(40),
            ..Default::default()
        })),
    }
}

/// Counts of one phase: calls by method, errors by gRPC code (with when),
/// decisions by reason.
#[derive(Debug, Default, Serialize)]
pub struct Tally {
    /// Calls answered OK, by method.
    pub calls: BTreeMap<String, u64>,
    /// Decisions (items of a batch each), by reason.
    pub reasons: BTreeMap<String, u64>,
    /// Calls that failed, by gRPC code.
    pub errors: BTreeMap<String, u64>,
    /// Failures, each as (seconds into the phase, code); decisions whose
    /// reason is `UNAVAILABLE`, `FAIL_OPEN` or `FAIL_CLOSED` (a store
    /// failure answered as a decision) are listed by their reason.
    pub failures: Vec<(f64, String)>,
    /// Failures not listed past the first 10,000.
    pub failures_not_listed: u64,
}

/// The shared [`Tally`] of every task of a phase.
#[derive(Debug)]
pub(super) struct Tallies {
    started: Instant,
    inner: Mutex<Tally>,
    churn: AtomicU64,
}

const MAX_LISTED: usize = 10_000;

impl Tallies {
    pub(super) fn new(started: Instant) -> Self {
        Tallies {
            started,
            inner: Mutex::new(Tally::default()),
            churn: AtomicU64::new(0),
        }
    }

    pub(super) fn into_tally(self) -> Tally {
        self.inner.into_inner().unwrap_or_else(|p| p.into_inner())
    }

    fn with(&self, f: impl FnOnce(&mut Tally)) {
        let mut tally = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut tally);
    }

    fn failure(tally: &mut Tally, at: f64, what: &str) {
        if tally.failures.len() < MAX_LISTED {
            tally.failures.push((at, what.to_owned()));
        } else {
            tally.failures_not_listed += 1;
        }
    }

    fn answered(&self, method: &str, decisions: &[pb::Decision]) {
        let at = self.started.elapsed().as_secs_f64();
        self.with(|t| {
            *t.calls.entry(method.to_owned()).or_default() += 1;
            for d in decisions {
                let reason = reason_name(d.reason);
                *t.reasons.entry(reason.clone()).or_default() += 1;
                if matches!(
                    pb::Reason::try_from(d.reason),
                    Ok(pb::Reason::Unavailable | pb::Reason::FailOpen | pb::Reason::FailClosed)
                ) {
                    Self::failure(t, at, &reason);
                }
            }
        });
    }

    fn failed(&self, status: &tonic::Status) {
        let at = self.started.elapsed().as_secs_f64();
        let code = quotad_proto::convert::code_name(status.code()).to_owned();
        self.with(|t| {
            *t.errors.entry(code.clone()).or_default() += 1;
            Self::failure(t, at, &code);
        });
    }

    /// The next churning key's index.
    fn next_churn(&self, keyspace: u64) -> u64 {
        self.churn.fetch_add(1, Ordering::Relaxed) % keyspace
    }
}

fn reason_name(reason: i32) -> String {
    pb::Reason::try_from(reason).map_or_else(
        |_| format!("UNKNOWN_{reason}"),
        |r| r.as_str_name().to_owned(),
    )
}

/// One load worker: `rate` calls a second until `stop`.
pub(super) async fn worker(
    channel: Channel,
    id: usize,
    rate: u64,
    keyspace: u64,
    stop: Arc<AtomicBool>,
    tallies: Arc<Tallies>,
) {
    let mut client = QuotaClient::new(channel);
    let mut rng = SmallRng::seed_from_u64(id as u64);
    let mut ticks = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate.max(1)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut all_or_nothing = false;
    while !stop.load(Ordering::Relaxed) {
        ticks.tick().await;
        let churn = |t: &Tallies| format!("churn-{}", t.next_churn(keyspace));
        let hot = |rng: &mut SmallRng| format!("hot-{}", rng.random_range(0..100));
        let roll: u32 = rng.random_range(0..100);
        match roll {
            0..50 => {
                let request = named(&churn(&tallies), "churn", 1);
                record(&tallies, "check", client.check(request).await.map(one));
            }
            50..65 => {
                let mut items: Vec<pb::CheckRequest> = (0..6)
                    .map(|_| named(&churn(&tallies), "churn", rng.random_range(1..3)))
                    .collect();
                items.push(named(&hot(&mut rng), "api", 1));
                items.push(inline(&hot(&mut rng)));
                all_or_nothing = !all_or_nothing;
                let mode = if all_or_nothing {
                    pb::BatchMode::AllOrNothing
                } else {
                    pb::BatchMode::Independent
                };
                let request = pb::CheckBatchRequest {
                    items,
                    mode: mode.into(),
                };
                let answer = client
                    .check_batch(request)
                    .await
                    .map(|r| r.into_inner().decisions);
                record(&tallies, "check_batch", answer);
            }
            65..80 => {
                let request = if roll.is_multiple_of(2) {
                    named(&churn(&tallies), "churn", 1)
                } else {
                    named(&hot(&mut rng), "bucket", 1)
                };
                record(&tallies, "peek", client.peek(request).await.map(one));
            }
            80..90 => {
                let request = pb::ResetRequest {
                    key: churn(&tallies),
                    policy: Some(pb::reset_request::Policy::PolicyName("churn".to_owned())),
                };
                record(
                    &tallies,
                    "reset",
                    client.reset(request).await.map(|_| Vec::new()),
                );
            }
            _ => {
                let policy = match roll % 3 {
                    0 => "api",
                    1 => "bucket",
                    _ => "reloaded",
                };
                let request = named(&hot(&mut rng), policy, 1);
                record(&tallies, "check", client.check(request).await.map(one));
            }
        }
    }
}

fn one(response: tonic::Response<pb::CheckResponse>) -> Vec<pb::Decision> {
    response.into_inner().decision.into_iter().collect()
}

fn record(tallies: &Tallies, method: &str, answer: Result<Vec<pb::Decision>, tonic::Status>) {
    match answer {
        Ok(decisions) => tallies.answered(method, &decisions),
        Err(status) => tallies.failed(&status),
    }
}

/// Checks the checker key back to back (one call in flight, at most one
/// every 4 ms) until `stop`; returns every answer.
pub(super) async fn checker(
    channel: Channel,
    stop: Arc<AtomicBool>,
    tallies: Arc<Tallies>,
) -> Vec<CheckerAnswer> {
    let mut client = QuotaClient::new(channel);
    let mut answers = Vec::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(4));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        ticks.tick().await;
        let answer = client.check(named("checker", "checker", 1)).await;
        let received_ms = epoch_ms();
        match answer {
            Ok(response) => {
                let decisions = one(response);
                tallies.answered("check", &decisions);
                if let Some(d) = decisions.first() {
                    answers.push(CheckerAnswer {
                        received_ms,
                        failed: false,
                        allowed: d.allowed,
                        reset_after_ms: d.reset_after_ms,
                        reason: reason_name(d.reason),
                    });
                }
            }
            Err(status) => {
                tallies.failed(&status);
                answers.push(CheckerAnswer {
                    received_ms,
                    failed: true,
                    allowed: false,
                    reset_after_ms: 0,
                    reason: quotad_proto::convert::code_name(status.code()).to_owned(),
                });
            }
        }
    }
    answers
}

/// Milliseconds since the Unix epoch: the clock the server's windows are
/// aligned to (both run on this machine).
fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
