//! The load: open-loop pacers that start each call as its own task (so
//! a stalled store does not slow the offered rate: 2,000 calls a second
//! stay 2,000 during a Redis stall), bounded by a cap on calls in flight,
//! spread round-robin over the quotad replicas. Calls on tracked keys are
//! kept for the checker; background calls are counted by outcome.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quotad_proto::v1::concurrency_client::ConcurrencyClient;
use quotad_proto::v1::leases_client::LeasesClient;
use quotad_proto::v1::quota_client::QuotaClient;
use quotad_proto::v1::{self as pb, check_request};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use tokio::sync::Semaphore;
use tonic::transport::{Channel, Endpoint};

use super::checker::{Answer, FAULT_CODES, Said};
use super::{CHECKED, CONC, LEASE, POLICIES, epoch_ms};

/// Deadline every call carries (`grpc-timeout`): quotad answers by then.
pub(super) const DEADLINE: Duration = Duration::from_secs(1);
/// A call not answered this long after its deadline is a hung server.
const NO_ANSWER_AFTER: Duration = Duration::from_secs(5);
/// Calls in flight at most; beyond, a tick is skipped and counted.
const MAX_IN_FLIGHT: usize = 4_000;
/// Background keys (churned through).
const BACKGROUND_KEYS: u64 = 2_000;

/// Counts of one phase.
#[derive(Debug, Default, Serialize)]
pub struct Tally {
    /// Calls answered, by method.
    pub calls: BTreeMap<String, u64>,
    /// gRPC errors by code (tracked and background).
    pub errors: BTreeMap<String, u64>,
    /// Decisions by reason (tracked and background).
    pub reasons: BTreeMap<String, u64>,
    /// Ticks skipped because [`MAX_IN_FLIGHT`] calls were in flight.
    pub skipped: u64,
    /// Calls whose deadline passed before quotad answered (counted as
    /// `DEADLINE_EXCEEDED` above): quotad should answer by the deadline.
    pub unanswered_by_deadline: u64,
    /// The first message of each code not documented for faults.
    pub samples: BTreeMap<String, String>,
    /// Every failure with a code not documented for faults (first 10,000).
    pub odd: Vec<Odd>,
}

/// A call that failed with a code not in [`FAULT_CODES`].
#[derive(Clone, Debug, Serialize)]
pub struct Odd {
    pub replica: usize,
    pub recv_ms: u64,
    pub method: String,
    pub code: String,
    pub message: String,
}

/// What every load task shares.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) answers: Mutex<Vec<Answer>>,
    tally: Mutex<Tally>,
    pub(super) stop: AtomicBool,
    skipped: AtomicU64,
    /// Calls started.
    pub(super) sent: AtomicU64,
    in_flight: Arc<Semaphore>,
    keys: u32,
}

impl Shared {
    pub(super) fn new(keys: u32) -> Arc<Shared> {
        Arc::new(Shared {
            answers: Mutex::new(Vec::new()),
            tally: Mutex::new(Tally::default()),
            stop: AtomicBool::new(false),
            skipped: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            keys,
        })
    }

    fn keep(&self, answer: Answer) {
        self.answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(answer);
    }

    fn count(&self, replica: usize, method: &str, outcome: Result<&[pb::Decision], &Failure>) {
        let mut t = self.tally.lock().unwrap_or_else(|p| p.into_inner());
        match outcome {
            Ok(decisions) => {
                *t.calls.entry(method.to_owned()).or_default() += 1;
                for d in decisions {
                    *t.reasons.entry(reason_name(d.reason)).or_default() += 1;
                }
            }
            Err(e) => {
                *t.errors.entry(e.code.clone()).or_default() += 1;
                if e.local_deadline {
                    t.unanswered_by_deadline += 1;
                }
                if !e.message.is_empty() && !t.samples.contains_key(&e.code) {
                    t.samples
                        .insert(e.code.clone(), format!("{method}: {}", e.message));
                }
                if !FAULT_CODES.contains(&e.code.as_str()) && t.odd.len() < 10_000 {
                    t.odd.push(Odd {
                        replica,
                        recv_ms: epoch_ms(),
                        method: method.to_owned(),
                        code: e.code.clone(),
                        message: e.message.clone(),
                    });
                }
            }
        }
    }

    pub(super) fn take(&self) -> (Vec<Answer>, Tally) {
        let answers = std::mem::take(&mut *self.answers.lock().unwrap_or_else(|p| p.into_inner()));
        let mut tally = std::mem::take(&mut *self.tally.lock().unwrap_or_else(|p| p.into_inner()));
        tally.skipped = self.skipped.load(Ordering::Relaxed);
        (answers, tally)
    }
}

pub(super) fn reason_name(reason: i32) -> String {
    pb::Reason::try_from(reason).map_or_else(
        |_| format!("UNKNOWN_{reason}"),
        |r| r.as_str_name().to_owned(),
    )
}

/// One quotad replica's clients (lazy channels: a replica that is down
/// fails its calls, and is reconnected when it is back).
#[derive(Clone, Debug)]
pub(super) struct Replica {
    quota: QuotaClient<Channel>,
    leases: LeasesClient<Channel>,
    slots: ConcurrencyClient<Channel>,
}

impl Replica {
    pub(super) fn lazy(grpc_port: u16) -> anyhow::Result<Replica> {
        let channel = Endpoint::from_shared(format!("http://127.0.0.1:{grpc_port}"))?
            .connect_timeout(Duration::from_millis(500))
            .connect_lazy();
        Ok(Replica {
            quota: QuotaClient::new(channel.clone()),
            leases: LeasesClient::new(channel.clone()),
            slots: ConcurrencyClient::new(channel),
        })
    }
}

fn request<T>(message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.set_timeout(DEADLINE);
    r
}

fn named(key: String, policy: &str) -> pb::CheckRequest {
    pb::CheckRequest {
        key,
        cost: None,
        policy: Some(check_request::Policy::PolicyName(policy.to_owned())),
    }
}

/// A failed call: its code (`NO_ANSWER` when quotad said nothing within
/// [`NO_ANSWER_AFTER`] past the deadline), and its message when the code
/// is not one documented for faults.
#[derive(Clone, Debug)]
struct Failure {
    code: String,
    message: String,
    /// The deadline passed here before quotad answered.
    local_deadline: bool,
}

impl Failure {
    fn said(self) -> Said {
        Said::Failed {
            code: self.code,
            message: self.message,
        }
    }
}

async fn call<T, F>(f: F) -> Result<T, Failure>
where
    F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    match tokio::time::timeout(DEADLINE + NO_ANSWER_AFTER, f).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        // tonic ends a call whose deadline passes before the answer with
        // CANCELLED "Timeout expired", raised in this process: to the
        // caller that is the deadline exceeded (gRPC's name for it).
        Ok(Err(status))
            if status.code() == tonic::Code::Cancelled
                && status.message() == tonic::TimeoutExpired(()).to_string() =>
        {
            Err(Failure {
                code: "DEADLINE_EXCEEDED".to_owned(),
                message: String::new(),
                local_deadline: true,
            })
        }
        Ok(Err(status)) => {
            let code = quotad_proto::convert::code_name(status.code()).to_owned();
            let message = if FAULT_CODES.contains(&code.as_str()) {
                String::new()
            } else {
                status.message().chars().take(300).collect()
            };
            Err(Failure {
                code,
                message,
                local_deadline: false,
            })
        }
        Err(_) => Err(Failure {
            code: "NO_ANSWER".to_owned(),
            message: format!("nothing within {:?}", DEADLINE + NO_ANSWER_AFTER),
            local_deadline: false,
        }),
    }
}

fn key_name(key: u32) -> String {
    format!("k{key}")
}

fn decision_said(d: &pb::Decision, slot: String, slot_ttl_ms: u64) -> Said {
    Said::Decision {
        allowed: d.allowed,
        reason: reason_name(d.reason),
        reset_after_ms: d.reset_after_ms,
        slot_ttl_ms,
        slot,
    }
}

/// A pacer: `rate` ticks a second until stop, each starting one call
/// (chosen by the seeded RNG) as its own task.
pub(super) async fn pacer(
    id: u64,
    seed: u64,
    rate: u64,
    replicas: Arc<Vec<Replica>>,
    shared: Arc<Shared>,
) {
    let mut rng =
        ChaCha8Rng::seed_from_u64(seed.wrapping_add(id.wrapping_mul(0x2545_f491_4f6c_dd1d)));
    let mut ticks = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate.max(1)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut turn = id as usize;
    while !shared.stop.load(Ordering::Relaxed) {
        ticks.tick().await;
        let Ok(permit) = Arc::clone(&shared.in_flight).try_acquire_owned() else {
            shared.skipped.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        shared.sent.fetch_add(1, Ordering::Relaxed);
        turn = turn.wrapping_add(1);
        let replica = turn % replicas.len();
        let client = replicas[replica].clone();
        let op = Op::draw(&mut rng, shared.keys);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            op.run(client, replica, &shared).await;
            drop(permit);
        });
    }
}

/// One call, drawn.
#[derive(Debug)]
enum Op {
    Check {
        policy: usize,
        key: u32,
    },
    Batch {
        items: Vec<(usize, u32)>,
        all_or_nothing: bool,
    },
    Lease {
        key: u32,
    },
    Slot {
        key: u32,
        hold_ms: u64,
    },
    Background {
        key: u64,
        kind: u8,
    },
}

impl Op {
    fn draw(rng: &mut ChaCha8Rng, keys: u32) -> Op {
        let key = |rng: &mut ChaCha8Rng| rng.random_range(0..keys);
        let checked = |rng: &mut ChaCha8Rng| CHECKED[rng.random_range(0..CHECKED.len())];
        match rng.random_range(0..100u32) {
            0..35 => Op::Check {
                policy: checked(rng),
                key: key(rng),
            },
            35..45 => Op::Batch {
                items: (0..4).map(|_| (checked(rng), key(rng))).collect(),
                all_or_nothing: false,
            },
            45..52 => {
                // One key under three policies: one hash tag, one script.
                let k = key(rng);
                let p = |name| POLICIES.iter().position(|p| p.name == name).unwrap_or(0);
                Op::Batch {
                    items: vec![(p("fw_error"), k), (p("tb"), k), (p("log"), k)],
                    all_or_nothing: true,
                }
            }
            52..56 => Op::Lease { key: key(rng) },
            56..60 => Op::Slot {
                key: key(rng),
                hold_ms: rng.random_range(50..300),
            },
            n => Op::Background {
                key: rng.random_range(0..BACKGROUND_KEYS),
                kind: u8::try_from(n % 10).unwrap_or(0),
            },
        }
    }

    async fn run(self, mut c: Replica, replica: usize, shared: &Shared) {
        let sent_ms = epoch_ms();
        let keep = |policy: usize, key: u32, sent_ms: u64, said: Said| {
            shared.keep(Answer {
                policy,
                key,
                sent_ms,
                recv_ms: epoch_ms(),
                replica,
                said,
            });
        };
        match self {
            Op::Check { policy, key } => {
                let r = call(
                    c.quota
                        .check(request(named(key_name(key), POLICIES[policy].name))),
                )
                .await;
                let said = match r {
                    Ok(resp) => {
                        let d = resp.decision.unwrap_or_default();
                        shared.count(replica, "check", Ok(std::slice::from_ref(&d)));
                        decision_said(&d, String::new(), 0)
                    }
                    Err(e) => {
                        shared.count(replica, "check", Err(&e));
                        e.said()
                    }
                };
                keep(policy, key, sent_ms, said);
            }
            Op::Batch {
                items,
                all_or_nothing,
            } => {
                let mode = if all_or_nothing {
                    pb::BatchMode::AllOrNothing
                } else {
                    pb::BatchMode::Independent
                };
                let message = pb::CheckBatchRequest {
                    items: items
                        .iter()
                        .map(|(p, k)| named(key_name(*k), POLICIES[*p].name))
                        .collect(),
                    mode: mode.into(),
                };
                let method = if all_or_nothing {
                    "batch_all_or_nothing"
                } else {
                    "batch_independent"
                };
                match call(c.quota.check_batch(request(message))).await {
                    Ok(resp) => {
                        shared.count(replica, method, Ok(&resp.decisions));
                        for ((p, k), d) in items.iter().zip(&resp.decisions) {
                            keep(*p, *k, sent_ms, decision_said(d, String::new(), 0));
                        }
                    }
                    Err(e) => {
                        shared.count(replica, method, Err(&e));
                        for (p, k) in items {
                            keep(p, k, sent_ms, e.clone().said());
                        }
                    }
                }
            }
            Op::Lease { key } => {
                let message = pb::LeaseRequest {
                    key: key_name(key),
                    policy: Some(pb::lease_request::Policy::PolicyName(
                        POLICIES[LEASE].name.to_owned(),
                    )),
                    inline_terms: None,
                    want: 5,
                    settle: None,
                };
                let said = match call(c.leases.lease(request(message))).await {
                    Ok(resp) => {
                        shared.count(replica, "lease", Ok(&[]));
                        Said::Lease {
                            units: resp.lease.map_or(0, |l| l.units),
                            reset_after_ms: resp.reset_after_ms,
                        }
                    }
                    Err(e) => {
                        shared.count(replica, "lease", Err(&e));
                        e.said()
                    }
                };
                keep(LEASE, key, sent_ms, said);
            }
            Op::Slot { key, hold_ms } => {
                let policy = || {
                    Some(pb::acquire_request::Policy::PolicyName(
                        POLICIES[CONC].name.to_owned(),
                    ))
                };
                let message = pb::AcquireRequest {
                    key: key_name(key),
                    cost: None,
                    policy: policy(),
                };
                let slot = match call(c.slots.acquire(request(message))).await {
                    Ok(resp) => {
                        let d = resp.decision.unwrap_or_default();
                        shared.count(replica, "acquire", Ok(std::slice::from_ref(&d)));
                        keep(
                            CONC,
                            key,
                            sent_ms,
                            decision_said(&d, resp.slot_id.clone(), resp.ttl_ms),
                        );
                        resp.slot_id
                    }
                    Err(e) => {
                        shared.count(replica, "acquire", Err(&e));
                        keep(CONC, key, sent_ms, e.said());
                        String::new()
                    }
                };
                if slot.is_empty() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                let message = pb::SlotRequest {
                    key: key_name(key),
                    policy: Some(pb::slot_request::Policy::PolicyName(
                        POLICIES[CONC].name.to_owned(),
                    )),
                    slot_id: slot.clone(),
                };
                let released_sent = epoch_ms();
                keep(CONC, key, released_sent, Said::Release { slot });
                match call(c.slots.release(request(message))).await {
                    Ok(_) => shared.count(replica, "release", Ok(&[])),
                    Err(e) => {
                        shared.count(replica, "release", Err(&e));
                        keep(CONC, key, released_sent, e.said());
                    }
                }
            }
            Op::Background { key, kind } => {
                let k = format!("bg{key}");
                let outcome = match kind {
                    0..=6 => call(c.quota.check(request(named(k, "bg"))))
                        .await
                        .map(|r| r.decision.into_iter().collect::<Vec<_>>()),
                    7 => call(c.quota.peek(request(named(k, "bg"))))
                        .await
                        .map(|r| r.decision.into_iter().collect()),
                    8 => call(c.quota.check(request(named(k, "reloaded"))))
                        .await
                        .map(|r| r.decision.into_iter().collect()),
                    _ => {
                        let message = pb::CheckBatchRequest {
                            items: (0..5)
                                .map(|i| named(format!("bg{}", (key + i) % BACKGROUND_KEYS), "bg"))
                                .collect(),
                            mode: pb::BatchMode::Independent.into(),
                        };
                        call(c.quota.check_batch(request(message)))
                            .await
                            .map(|r| r.decisions)
                    }
                };
                match &outcome {
                    Ok(d) => shared.count(replica, "background", Ok(d)),
                    Err(e) => shared.count(replica, "background", Err(e)),
                }
            }
        }
    }
}
