//! Connections, workers and pacing: the load generator's core.
//!
//! A closed-loop run spawns `concurrency` workers; each sends its next
//! request as soon as the last one is answered. An open-loop run (`rate`)
//! has a pacer thread release send slots on a fixed schedule through a
//! semaphore; `concurrency` workers take the slots in order and measure each
//! latency from the slot's due time when it is sent late, so time a request
//! spends waiting for a free worker is counted (no coordinated omission).
//! Slots are released in batches up to [`RELEASE_AHEAD`] early; a request
//! sent early is measured from its actual send.
//!
//! The pacer is a plain thread sleeping with `std::thread::sleep` because
//! tokio's timer has millisecond granularity, which would add up to 1 ms to
//! every open-loop latency; on Linux it also shrinks its own timer slack
//! (50 µs by default). What remains, the pacer's wake-up and the hand-over
//! to a worker, is counted in the latency and reported as `send_lag`.
//!
//! The closed and open loops share one way of
//! sending a request in every mode (unary, batch, RLS, through
//! quotad-client) and of counting its answer; the options are in
//! `config.rs`, the keys in `keys.rs`, the report in `report.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use quotad_client::{
    Coalescing, DEFAULT_DENY_CACHE_CAPACITY, DEFAULT_MAX_BATCH_BYTES, LeaseOptions,
};
use quotad_proto::MAX_BATCH_ITEMS;
use quotad_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use quotad_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use quotad_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use quotad_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use quotad_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use quotad_proto::v1::quota_client::QuotaClient;
use quotad_proto::v1::{BatchMode, CheckBatchRequest, CheckRequest, check_request};
use rand::SeedableRng as _;
use rand::rngs::SmallRng;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};

use crate::config::{ConfigError, LoadConfig, MAX_DURATION, Mode};
use crate::keys::{KeyPool, ParseKeysError};
use crate::report::{Outcome, Report, RunInfo, Tally};

/// How long connecting to the target may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How far ahead of its due time the open-loop pacer may release a slot.
/// Waking once per slot costs more than the requests themselves in a VM
/// (a context switch on each side, about 15 µs of CPU at 20k/s); batching
/// bounds the pacer to 5,000 wake-ups per second. A request sent early is
/// measured from when it was sent, so releasing early never flatters the
/// latency, and the schedule stays an open loop with at most this jitter.
const RELEASE_AHEAD: Duration = Duration::from_micros(200);

/// A load run that could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A setting is out of range.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The key distribution cannot be used.
    #[error(transparent)]
    Keys(#[from] ParseKeysError),
    /// The target could not be reached.
    #[error("cannot connect to {target}")]
    Connect {
        /// The target.
        target: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// The client of [`Mode::Client`] could not connect to the target.
    #[error("cannot connect to {target}")]
    ClientConnect {
        /// The target.
        target: String,
        /// Why.
        #[source]
        source: quotad_client::Error,
    },
    /// The pacer thread could not be started.
    #[error("cannot start the pacer thread")]
    Pacer(#[source] std::io::Error),
    /// A worker task panicked or was cancelled.
    #[error("a load worker failed")]
    Worker(#[from] tokio::task::JoinError),
}

/// Runs the load `config` describes and reports on it.
///
/// Must be called within a tokio runtime; the workers are spawned on it, so
/// a multi-threaded runtime spreads them over its threads. Every run is
/// bounded: it ends after its duration, its request count, or
/// [`MAX_DURATION`], whichever comes first, plus at most one request
/// timeout for the requests still in flight.
///
/// # Errors
///
/// [`LoadError`] when the configuration is invalid, the target cannot be
/// reached, or a worker fails. Failed requests are not errors of the run:
/// the report counts them by gRPC code.
pub async fn run(config: LoadConfig) -> Result<Report, LoadError> {
    config.validate()?;
    let keys = KeyPool::new(config.keys, &config.key_prefix)?;
    let (channels, apps) = match config.mode {
        Mode::Client {
            coalescing,
            deny_cache,
            lease_want,
        } => (
            Vec::new(),
            connect_clients(&config, coalescing, deny_cache, lease_want).await?,
        ),
        _ => (connect(&config).await?, Vec::new()),
    };
    tracing::debug!(
        target = %config.target,
        connections = config.connections,
        concurrency = config.concurrency,
        "connected"
    );

    // Read after connecting, so only the run itself is counted.
    let cpu_start = process_cpu();
    let start = Instant::now();
    let measure_start = start + config.warmup;
    let deadline = config
        .duration
        .map_or(start + MAX_DURATION, |d| measure_start + d);
    let shared = Arc::new(Shared {
        channels,
        apps,
        keys,
        policy: config.policy.to_proto(),
        check_policy: match config.mode {
            Mode::Client { .. } => Some(config.policy.to_client()?),
            _ => None,
        },
        domain: config.domain.clone(),
        cost: config.cost,
        mode: config.mode,
        measure_start,
        deadline,
        limit: config.requests,
        issued: AtomicU64::new(0),
        seed: config.seed,
    });

    let mut workers = JoinSet::new();
    let mut pacer = None;
    match config.rate {
        None => {
            for worker in 0..config.concurrency {
                workers.spawn(closed_loop(Arc::clone(&shared), worker));
            }
        }
        Some(rate) => {
            let pacing = Arc::new(Pacing::new(&config, rate, start, deadline));
            for worker in 0..config.concurrency {
                workers.spawn(open_loop(Arc::clone(&shared), Arc::clone(&pacing), worker));
            }
            let thread_pacing = Arc::clone(&pacing);
            let workers_count = config.concurrency;
            let handle = std::thread::Builder::new()
                .name("loadgen-pacer".to_owned())
                .spawn(move || thread_pacing.pace(workers_count))
                .map_err(LoadError::Pacer)?;
            pacer = Some((pacing, handle));
        }
    }
    // Stops the pacer if this future is dropped before the workers finish.
    let _stop_pacer = StopOnDrop(pacer.as_ref().map(|(pacing, _)| Arc::clone(pacing)));

    let mut total = Tally::new(config.rate.is_some());
    while let Some(tally) = workers.join_next().await {
        total.merge(&tally?);
    }
    let loadgen_cpu = cpu_start
        .zip(process_cpu())
        .map(|(before, after)| after.saturating_sub(before));
    if let Some((_, handle)) = pacer {
        // The workers stop only after the pacer has released its last slot,
        // so the thread is finishing or finished.
        let joined = tokio::task::spawn_blocking(move || handle.join()).await?;
        if joined.is_err() {
            tracing::error!("the pacer thread panicked");
        }
    }
    let lease_stats = match config.mode {
        Mode::Client {
            lease_want: Some(_),
            ..
        } => Some(shared.apps.iter().map(|app| app.lease_stats()).collect()),
        _ => None,
    };
    // What the clients still hold goes back at once, so that a run never
    // strands budget for the next run on the same keys.
    for app in &shared.apps {
        app.shutdown().await;
    }

    let info = RunInfo {
        mode: config.mode,
        concurrency: config.concurrency,
        connections: config.connections,
        keys: config.keys.to_string(),
        key_prefix: config.key_prefix,
        policy: config.policy.to_string(),
        target_rate: config.rate,
        measure_start,
        loadgen_cpu,
        lease_stats,
    };
    Ok(Report::new(info, &total))
}

/// This process's CPU time so far, every thread, user and system; `None`
/// where the clock cannot be read.
fn process_cpu() -> Option<Duration> {
    #[cfg(target_os = "linux")]
    {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        let secs = u64::try_from(t.tv_sec).ok()?;
        let nanos = u32::try_from(t.tv_nsec).ok()?;
        Some(Duration::new(secs, nanos))
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Opens `config.connections` HTTP/2 connections to the target.
async fn connect(config: &LoadConfig) -> Result<Vec<Channel>, LoadError> {
    let error = |source| LoadError::Connect {
        target: config.target.clone(),
        source,
    };
    let endpoint = Endpoint::from_shared(config.target.clone())
        .map_err(error)?
        .tcp_nodelay(true)
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(config.timeout);
    let mut channels = Vec::with_capacity(config.connections);
    for _ in 0..config.connections {
        // Each `connect` opens its own connection; clones of a `Channel`
        // would share one.
        channels.push(endpoint.connect().await.map_err(error)?);
    }
    Ok(channels)
}

/// `config.connections` clients of quotad-client, each with its own
/// connection, coalescing queue, deny cache and leases, for
/// [`Mode::Client`].
async fn connect_clients(
    config: &LoadConfig,
    coalescing: bool,
    deny_cache: bool,
    lease_want: Option<u64>,
) -> Result<Vec<quotad_client::Client>, LoadError> {
    let leases = lease_want
        .map(LeaseOptions::try_new)
        .transpose()
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    let mut clients = Vec::with_capacity(config.connections);
    for _ in 0..config.connections {
        let builder = quotad_client::Client::builder(config.target.clone());
        let builder = match leases {
            Some(options) => builder.leases(options),
            None => builder,
        };
        let client = builder
            .deadline(config.timeout)
            .coalescing(if coalescing {
                Coalescing::try_new(
                    config.max_in_flight,
                    MAX_BATCH_ITEMS,
                    DEFAULT_MAX_BATCH_BYTES,
                )
                .map_err(|e| ConfigError::Invalid(e.to_string()))?
            } else {
                Coalescing::off()
            })
            .deny_cache(if deny_cache {
                DEFAULT_DENY_CACHE_CAPACITY
            } else {
                0
            })
            .connect()
            .await
            .map_err(|source| LoadError::ClientConnect {
                target: config.target.clone(),
                source,
            })?;
        clients.push(client);
    }
    Ok(clients)
}

/// What every worker reads; written once before the workers start.
#[derive(Debug)]
struct Shared {
    /// The raw gRPC connections (every mode but [`Mode::Client`]).
    channels: Vec<Channel>,
    /// The clients of [`Mode::Client`].
    apps: Vec<quotad_client::Client>,
    keys: KeyPool,
    policy: check_request::Policy,
    /// The policy of a [`Mode::Client`] check.
    check_policy: Option<quotad_client::PolicyRef>,
    domain: String,
    cost: Option<u64>,
    mode: Mode,
    measure_start: Instant,
    /// No request is sent at or after this instant.
    deadline: Instant,
    /// How many measured requests to send, if bounded by count.
    limit: Option<u64>,
    issued: AtomicU64,
    seed: u64,
}

impl Shared {
    /// What worker `worker` sends through, with the round-robin position it
    /// starts from: a client per connection, or in [`Mode::Client`] the
    /// one client of quotad-client the worker calls.
    fn clients(&self, worker: usize) -> (Vec<Client>, usize) {
        if !self.apps.is_empty() {
            let app = self.apps[worker % self.apps.len()].clone();
            return (vec![Client::App(app)], 0);
        }
        let clients: Vec<_> = self
            .channels
            .iter()
            .cloned()
            .map(|channel| {
                Client::Raw(Box::new(Raw {
                    quota: QuotaClient::new(channel.clone()),
                    rls: RateLimitServiceClient::new(channel),
                }))
            })
            .collect();
        let first = worker % clients.len();
        (clients, first)
    }

    /// A random source of its own for worker `worker`, so workers draw
    /// keys without sharing state and a run with the same seed repeats.
    fn rng(&self, worker: usize) -> SmallRng {
        let worker = u64::try_from(worker).unwrap_or(u64::MAX);
        SmallRng::seed_from_u64(self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ worker)
    }

    /// Takes the right to send one more measured request.
    fn take_ticket(&self) -> bool {
        self.limit
            .is_none_or(|limit| self.issued.fetch_add(1, Ordering::Relaxed) < limit)
    }

    /// A check of the next key. The policy and key are cloned: prost
    /// messages own their strings, and tonic takes the message by value.
    fn check_request(&self, rng: &mut SmallRng) -> CheckRequest {
        CheckRequest {
            key: self.keys.sample(rng).to_owned(),
            cost: self.cost,
            policy: Some(self.policy.clone()),
        }
    }

    /// A `ShouldRateLimit` of `descriptors` descriptors, `d<i>` = a key.
    fn rls_request(&self, descriptors: usize, rng: &mut SmallRng) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors: (0..descriptors)
                .map(|i| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: format!("d{i}"),
                        value: self.keys.sample(rng).to_owned(),
                    }],
                    ..RateLimitDescriptor::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    /// One check of the next key through quotad-client, as an application
    /// calls it.
    async fn check_through(&self, app: &quotad_client::Client, rng: &mut SmallRng) -> Outcome {
        let key = self.keys.sample(rng).to_owned();
        let check = match &self.check_policy {
            Some(quotad_client::PolicyRef::Inline(policy)) => {
                quotad_client::Check::inline(*policy, key)
            }
            Some(quotad_client::PolicyRef::Named(name)) => {
                quotad_client::Check::named(name.clone(), key)
            }
            None => return Outcome::Malformed,
        };
        let check = match self.cost {
            Some(cost) => check.cost(cost),
            None => check,
        };
        match app.check(&check).await {
            Ok(decision) => Outcome::Decided {
                allowed: u64::from(decision.allowed),
                denied: u64::from(!decision.allowed),
            },
            Err(
                quotad_client::Error::Unavailable(status) | quotad_client::Error::Rejected(status),
            ) => Outcome::Failed(status.code()),
            Err(quotad_client::Error::InvalidAddress(_)) => {
                Outcome::Failed(tonic::Code::InvalidArgument)
            }
            Err(quotad_client::Error::BadResponse(_)) => Outcome::Malformed,
        }
    }

    /// Sends one request on `client` and sorts out its answer.
    async fn send(&self, client: &mut Client, rng: &mut SmallRng) -> Outcome {
        let (quota, rls) = match client {
            Client::App(app) => return self.check_through(app, rng).await,
            Client::Raw(raw) => (&mut raw.quota, &mut raw.rls),
        };
        match self.mode {
            Mode::Rls { descriptors } => {
                match rls
                    .should_rate_limit(self.rls_request(descriptors, rng))
                    .await
                {
                    Ok(response) => {
                        let statuses = response.into_inner().statuses;
                        let ok = statuses.iter().map(|s| s.code == Code::Ok as i32);
                        tally(ok, descriptors)
                    }
                    Err(status) => Outcome::Failed(status.code()),
                }
            }
            // Built with Client::App, answered above.
            Mode::Client { .. } => Outcome::Malformed,
            Mode::Unary => match quota.check(self.check_request(rng)).await {
                Ok(response) => match response.into_inner().decision {
                    Some(decision) => Outcome::Decided {
                        allowed: u64::from(decision.allowed),
                        denied: u64::from(!decision.allowed),
                    },
                    None => Outcome::Malformed,
                },
                Err(status) => Outcome::Failed(status.code()),
            },
            Mode::Batch { size } => {
                let request = CheckBatchRequest {
                    items: (0..size).map(|_| self.check_request(rng)).collect(),
                    mode: BatchMode::Independent.into(),
                };
                match quota.check_batch(request).await {
                    Ok(response) => {
                        let decisions = response.into_inner().decisions;
                        tally(decisions.iter().map(|d| d.allowed), size)
                    }
                    Err(status) => Outcome::Failed(status.code()),
                }
            }
        }
    }
}

/// The outcome of a response with one answer per item (`true`: allowed):
/// malformed unless it holds exactly `expected` answers.
fn tally(answers: impl ExactSizeIterator<Item = bool>, expected: usize) -> Outcome {
    if answers.len() != expected {
        return Outcome::Malformed;
    }
    let allowed = answers.filter(|a| *a).count();
    Outcome::Decided {
        allowed: u64::try_from(allowed).unwrap_or(u64::MAX),
        denied: u64::try_from(expected - allowed).unwrap_or(u64::MAX),
    }
}

/// What a worker sends through: the gRPC clients of one connection, or a
/// client of quotad-client ([`Mode::Client`]).
#[derive(Debug)]
enum Client {
    Raw(Box<Raw>),
    App(quotad_client::Client),
}

/// The gRPC clients of one connection.
#[derive(Debug)]
struct Raw {
    quota: QuotaClient<Channel>,
    rls: RateLimitServiceClient<Channel>,
}

/// A closed-loop worker: sends, waits for the answer, sends again, until
/// the deadline or the request count.
async fn closed_loop(shared: Arc<Shared>, worker: usize) -> Tally {
    let mut rng = shared.rng(worker);
    let (mut clients, mut next) = shared.clients(worker);
    let client_count = clients.len();
    let mut tally = Tally::new(false);
    loop {
        let sent = Instant::now();
        if sent >= shared.deadline {
            break;
        }
        let measuring = sent >= shared.measure_start;
        if measuring && !shared.take_ticket() {
            break;
        }
        let client = &mut clients[next];
        next = (next + 1) % client_count;
        let outcome = shared.send(client, &mut rng).await;
        let done = Instant::now();
        if measuring {
            tally.record(done - sent, done, outcome);
        } else {
            tally.warmup += 1;
        }
        // A check answered locally (a held lease, a cached denial) never
        // waits, so without this a worker would keep its thread until the
        // deadline and starve the client's own background calls (a lease's
        // renewal) and the other workers; an application's callers wait on
        // something between checks. It yields once per coop budget (128
        // polls), so it costs nothing measurable when every check is a call.
        tokio::task::coop::consume_budget().await;
    }
    tally
}

/// The open-loop schedule: slot `i` is due at `start + i / rate`.
#[derive(Debug)]
struct Pacing {
    /// One permit per released slot, plus one per worker at the end.
    permits: Semaphore,
    start: Instant,
    rate: f64,
    /// Slots due before the end of the warmup.
    warmup_slots: u64,
    /// The most slots to release: warmup plus the request count.
    max_slots: u64,
    /// No slot due at or after this is released.
    deadline: Instant,
    /// Slots still unsent at this instant are counted as missed.
    drain_deadline: Instant,
    /// Slots taken by workers so far; a slot's number is its ticket.
    taken: AtomicU64,
    /// How many slots were released, once the pacer has stopped.
    released: AtomicU64,
    stop: AtomicBool,
}

impl Pacing {
    fn new(config: &LoadConfig, rate: f64, start: Instant, deadline: Instant) -> Self {
        // Slot counts stay far below 2^53, where f64 -> u64 is exact.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let warmup_slots = (config.warmup.as_secs_f64() * rate).ceil() as u64;
        Self {
            permits: Semaphore::new(0),
            start,
            rate,
            warmup_slots,
            max_slots: config
                .requests
                .map_or(u64::MAX, |n| warmup_slots.saturating_add(n)),
            deadline,
            drain_deadline: deadline + config.timeout,
            taken: AtomicU64::new(0),
            released: AtomicU64::new(u64::MAX),
            stop: AtomicBool::new(false),
        }
    }

    fn due(&self, slot: u64) -> Instant {
        #[allow(clippy::cast_precision_loss)]
        let offset = slot as f64 / self.rate;
        self.start + Duration::from_secs_f64(offset)
    }

    /// The pacer thread: releases the slots in batches, each slot up to
    /// [`RELEASE_AHEAD`] before it falls due, until the deadline or the slot
    /// count; then one extra permit per worker to tell the workers the
    /// schedule has ended.
    fn pace(&self, workers: usize) {
        shrink_timer_slack();
        let mut released = 0u64;
        // Bounded: each pass releases at least one slot or sleeps until
        // one can be released, and the schedule ends at the deadline.
        while released < self.max_slots && !self.stop.load(Ordering::Relaxed) {
            let next = self.due(released);
            if next >= self.deadline {
                break;
            }
            let now = Instant::now();
            let horizon = now + RELEASE_AHEAD;
            if next > horizon {
                std::thread::sleep(next - horizon);
                continue;
            }
            let mut batch = 0usize;
            while released < self.max_slots {
                let at = self.due(released);
                if at > horizon || at >= self.deadline {
                    break;
                }
                released += 1;
                batch += 1;
            }
            self.permits.add_permits(batch);
            // At most one wake-up per RELEASE_AHEAD, however high the rate.
            let rest = horizon.saturating_duration_since(Instant::now());
            if !rest.is_zero() {
                std::thread::sleep(rest);
            }
        }
        self.released.store(released, Ordering::Release);
        self.permits.add_permits(workers);
    }
}

/// Asks Linux to wake this thread from `sleep` within ~1 ns of the time
/// asked for, rather than within the default 50 µs timer slack, which would
/// otherwise add up to 50 µs to every open-loop latency. Only the calling
/// thread's slack changes, which needs no privilege; elsewhere, or if it
/// fails, the pacer runs with the default slack.
fn shrink_timer_slack() {
    #[cfg(target_os = "linux")]
    if let Err(error) = rustix::thread::set_current_timer_slack(std::num::NonZeroU64::new(1)) {
        tracing::debug!(%error, "cannot shrink the pacer's timer slack");
    }
}

/// Stops the pacer early when the run is dropped.
struct StopOnDrop(Option<Arc<Pacing>>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(pacing) = &self.0 {
            pacing.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// An open-loop worker: takes each released slot in order, sends at once
/// and measures from the slot's due time.
async fn open_loop(shared: Arc<Shared>, pacing: Arc<Pacing>, worker: usize) -> Tally {
    let mut rng = shared.rng(worker);
    let (mut clients, mut next) = shared.clients(worker);
    let client_count = clients.len();
    let mut tally = Tally::new(true);
    // Bounded: the pacer releases finitely many slots and then one end
    // permit per worker; each worker leaves on the first slot past the end.
    loop {
        let Ok(permit) = pacing.permits.acquire().await else {
            break;
        };
        permit.forget();
        // A ticket at or past `released` means more permits were taken than
        // slots released, so some taker got an end permit, added after
        // `released` was stored; AcqRel carries that store along the
        // tickets.
        let slot = pacing.taken.fetch_add(1, Ordering::AcqRel);
        if slot >= pacing.released.load(Ordering::Acquire) {
            break;
        }
        let measuring = slot >= pacing.warmup_slots;
        if Instant::now() >= pacing.drain_deadline {
            if measuring {
                tally.missed += 1;
            }
            continue;
        }
        let scheduled = pacing.due(slot);
        let client = &mut clients[next];
        next = (next + 1) % client_count;
        let sent = Instant::now();
        let outcome = shared.send(client, &mut rng).await;
        let done = Instant::now();
        if measuring {
            // Late: from the due time, so waiting for a worker counts.
            // Early (released ahead): from the actual send.
            let origin = scheduled.min(sent);
            tally.record(done.saturating_duration_since(origin), done, outcome);
            tally.record_send_lag(sent.saturating_duration_since(scheduled));
        } else {
            tally.warmup += 1;
        }
        // As in the closed loop: local answers must not starve the rest.
        tokio::task::coop::consume_budget().await;
    }
    tally
}
