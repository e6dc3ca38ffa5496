//! The chaos run's driver (`scripts/chaos.sh` builds and runs it): three
//! quotad replicas on Redis under load on every algorithm, while a seeded
//! schedule of faults plays, and a checker that keeps every answer and
//! judges, per key and window, that nothing was admitted beyond the policy
//! (docs/chaos.md).
//!
//! Two phases, half of `--seconds` each:
//!
//! 1. **sentinel**: a primary and a replica (append-only files) and three
//!    sentinels; quotad finds the primary through the sentinels
//!    (`store.redis.sentinel_nodes`), and every connection to a data node
//!    (quotad's, the sentinels', the replication link) goes through a
//!    [`proxy::Proxy`] the driver can blackhole.
//! 2. **cluster**: three masters with one replica each
//!    (`store.redis.cluster_nodes`).
//!
//! Faults ([`schedule`]): SIGSTOP/SIGCONT and SIGKILL + restart of Redis
//! nodes (by role: the primary or the replica as they are when the fault
//! plays), SIGKILL + restart of quotad replicas and of sentinels,
//! `SENTINEL FAILOVER` / `CLUSTER FAILOVER`, blackholes, config reloads,
//! and one long stall of the primary under the full load during which
//! quotad's resident memory must stay flat.
//!
//! Every process is a child of the driver, signalled by its own PID, and
//! killed when its handle drops (an error, a panic, or SIGINT/SIGTERM,
//! which drop the run).

pub mod checker;
mod load;
mod proxy;
mod redis;
pub mod schedule;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

use crate::soak::process::{Managed, free_port, rss_kib, signal};
use checker::{Findings, LossEvent, Rule, Tracked};
pub use load::Tally;
use schedule::{Event, Fault, Role, Topology};

/// The tracked policies: every answer on their keys is judged.
pub const POLICIES: &[Tracked] = &[
    tracked(
        "fw_closed",
        "fixed_window",
        Rule::Window,
        20,
        2_000,
        20,
        "fail_closed",
    ),
    tracked(
        "fw_open",
        "fixed_window",
        Rule::Window,
        20,
        2_000,
        20,
        "fail_open",
    ),
    tracked(
        "fw_error",
        "fixed_window",
        Rule::Window,
        20,
        2_000,
        20,
        "error",
    ),
    tracked("sw", "sliding_window", Rule::Window, 30, 2_000, 30, "error"),
    tracked(
        "tb",
        "token_bucket",
        Rule::Bucket,
        10,
        1_000,
        20,
        "fail_closed",
    ),
    tracked("lb", "leaky_bucket", Rule::Bucket, 10, 1_000, 20, "error"),
    tracked("log", "sliding_log", Rule::Log, 15, 1_500, 15, "error"),
    tracked(
        "lease",
        "fixed_window",
        Rule::Window,
        40,
        2_000,
        40,
        "error",
    ),
    tracked("conc", "concurrency", Rule::Slots, 3, 2_000, 3, "error"),
];

/// The policies plain checks (and batches) go to: all but concurrency.
pub(crate) const CHECKED: &[usize] = &[0, 1, 2, 3, 4, 5, 6, 7];
/// The policy leases are taken on (its `lease` terms are in [`config`]).
pub(crate) const LEASE: usize = 7;
/// The concurrency policy.
pub(crate) const CONC: usize = 8;
/// `lease.max_ttl` of [`LEASE`].
const LEASE_MAX_TTL_MS: u64 = 1_000;
/// Background policy window (untracked load).
const BG_WINDOW_MS: u64 = 5_000;
/// The reloaded policy's window.
const RELOADED_WINDOW_MS: u64 = 2_000;
/// Keys that may run this long past their need: the concurrency script
/// keeps a key for a minute after its last slot ends
/// (`concurrency.lua`, `GRACE`), so that a late release finds it.
const SLOT_GRACE_MS: u64 = 60_000;
/// quotad's Redis timeout.
const REDIS_TIMEOUT: &str = "300ms";
/// A loss event covers this much before and after it (the append-only
/// file's second of unsynced writes, the failover noticed late).
const LOSS_MARGIN_MS: u64 = 1_500;
/// A call that fails this soon after its quotad was SIGKILLed, with the
/// connection error tonic gives, failed with the kill.
const KILLED_CALLS_MS: u64 = 1_000;
/// A failover seen at T is a loss event from T minus this (the primary
/// went down-after-milliseconds, 1.5 s, plus a poll before)...
const FAILOVER_BEFORE_MS: u64 = 2_000;
/// ... to T plus this (the old primary, back, is demoted a moment later).
const FAILOVER_AFTER_MS: u64 = 2_000;
/// RSS during the stall may exceed the peak of the 3 s before it by this
/// fraction of it plus [`RSS_SLACK_KIB`].
pub const RSS_GROWTH: f64 = 0.10;
/// See [`RSS_GROWTH`]: allocator noise on a small heap.
pub const RSS_SLACK_KIB: u64 = 4_096;

#[allow(clippy::too_many_arguments)]
const fn tracked(
    name: &'static str,
    algorithm: &'static str,
    rule: Rule,
    limit: u64,
    window_ms: u64,
    burst: u64,
    on_error: &'static str,
) -> Tracked {
    Tracked {
        name,
        algorithm,
        rule,
        limit,
        window_ms,
        burst,
        on_error,
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    pub quotad: PathBuf,
    pub redis_server: PathBuf,
    /// Both phases together.
    pub seconds: u64,
    pub seed: u64,
    pub out: PathBuf,
    /// Calls a second offered, all pacers together.
    pub rate: u64,
    /// Which phases: both by default.
    pub topologies: Vec<Topology>,
}

/// A fault as it was played.
#[derive(Debug, Serialize)]
pub struct Played {
    /// Planned start, ms into the phase.
    pub planned_ms: u64,
    /// Real start and end, ms into the phase.
    pub from_ms: u64,
    pub to_ms: u64,
    /// The schedule's line.
    pub line: String,
    /// What it hit or what happened (the node's port, an error).
    pub note: String,
}

/// A key whose TTL is longer than its policy needs.
#[derive(Debug, Serialize)]
pub struct TtlViolation {
    pub key: String,
    pub pttl_ms: i64,
    pub bound_ms: u64,
    pub after: String,
}

/// One TTL scan.
#[derive(Debug, Serialize)]
pub struct TtlScan {
    pub after: String,
    pub keys: usize,
    /// The longest TTL over its bound's fraction, for the record.
    pub worst_fraction: f64,
}

/// RSS of one quotad replica around the stall.
#[derive(Debug, Serialize)]
pub struct StallRss {
    pub replica: usize,
    /// Peak in the 3 s before the stall, KiB.
    pub before_kib: u64,
    /// Peak during the stall and the second after, KiB.
    pub during_kib: u64,
    /// The bound `during` must stay under.
    pub bound_kib: u64,
    /// Calls a second started during the stall (all replicas).
    pub offered_rps: f64,
}

/// What a phase did and found.
#[derive(Debug, Serialize)]
pub struct PhaseReport {
    pub topology: Topology,
    pub seconds: f64,
    pub schedule: Vec<String>,
    pub played: Vec<Played>,
    pub losses: Vec<LossEvent>,
    pub findings: Findings,
    pub ttl_scans: Vec<TtlScan>,
    pub ttl_violations: Vec<TtlViolation>,
    pub stall: Vec<StallRss>,
    /// Calls that ended with UNKNOWN "transport error" as their quotad
    /// was SIGKILLed (counted as UNAVAILABLE).
    pub killed_calls: usize,
    /// Config rewrites made, and reloads the replicas running at the end
    /// applied (a replica restarted since a rewrite started with it).
    pub reloads: (u64, u64),
    /// Changes of primaries a `CLUSTER FAILOVER` made (not loss events).
    pub coordinated: Vec<String>,
    /// Calls started a second, over the phase.
    pub achieved_rps: f64,
    pub tally: Tally,
    /// Everything that fails the phase, first first.
    pub failures: Vec<String>,
}

/// The whole run.
#[derive(Debug, Serialize)]
pub struct Report {
    pub seed: u64,
    pub seconds: u64,
    pub rate: u64,
    pub phases: Vec<PhaseReport>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.phases.iter().all(|p| p.failures.is_empty())
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn epoch_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Every phase's schedule, as printed before the run.
pub fn schedules(options: &Options) -> Vec<(Topology, Vec<Event>)> {
    let per = options.seconds / options.topologies.len().max(1) as u64;
    options
        .topologies
        .iter()
        .enumerate()
        .map(|(i, t)| (*t, schedule::schedule(options.seed, i as u64, *t, per)))
        .collect()
}

/// Runs every phase.
///
/// # Errors
///
/// When a process cannot be started or a topology does not come up: the
/// run says nothing about quotad then.
pub async fn run(options: &Options) -> anyhow::Result<Report> {
    std::fs::create_dir_all(&options.out)?;
    let per = options.seconds / options.topologies.len().max(1) as u64;
    let mut phases = Vec::new();
    for (i, (topology, events)) in schedules(options).into_iter().enumerate() {
        tracing::info!(?topology, seconds = per, "chaos phase starting");
        let dir = options.out.join(format!("{topology:?}").to_lowercase());
        let report = run_phase(options, topology, events, per, i, &dir).await?;
        tracing::info!(
            ?topology,
            failures = report.failures.len(),
            "chaos phase done"
        );
        phases.push(report);
    }
    Ok(Report {
        seed: options.seed,
        seconds: options.seconds,
        rate: options.rate,
        phases,
    })
}

/// The Redis side of a phase.
enum Store {
    Sentinel(redis::SentinelSet),
    Cluster(redis::Cluster),
}

impl Store {
    fn toml(&self) -> String {
        match self {
            Store::Sentinel(s) => format!(
                "url = \"redis://{}/0\"\nsentinel_nodes = {:?}\n",
                redis::MASTER,
                s.sentinel_urls()
            ),
            Store::Cluster(c) => format!("cluster_nodes = {:?}\n", c.urls()),
        }
    }

    /// The data node a role names now.
    async fn resolve(&self, role: Role) -> Option<usize> {
        match self {
            Store::Sentinel(s) => Some(s.resolve(role).await),
            Store::Cluster(c) => c.resolve(role).await,
        }
    }

    fn node(&mut self, i: usize) -> &mut redis::Node {
        match self {
            Store::Sentinel(s) => &mut s.nodes[i],
            Store::Cluster(c) => &mut c.nodes[i],
        }
    }

    fn watch(&self) -> redis::Watch {
        match self {
            Store::Sentinel(s) => s.watch(),
            Store::Cluster(c) => c.watch(),
        }
    }
}

/// One quotad replica.
struct Quotad {
    binary: PathBuf,
    config: PathBuf,
    log: PathBuf,
    grpc_port: u16,
    process: Managed,
}

impl Quotad {
    fn spawn(binary: &Path, config: &Path, log: &Path) -> anyhow::Result<Managed> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        Managed::spawn(
            std::process::Command::new(binary)
                .arg("--config")
                .arg(config)
                .stdin(std::process::Stdio::null())
                .stdout(file.try_clone()?)
                .stderr(file),
            "quotad",
        )
    }

    async fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if crate::soak::process::http_get(self.admin_port()?, "/healthz")
                .await
                .is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "quotad on {} did not answer /healthz within {within:?}",
                    self.grpc_port
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn admin_port(&self) -> anyhow::Result<u16> {
        let text = std::fs::read_to_string(&self.config)?;
        text.lines()
            .find_map(|l| l.strip_prefix("admin_addr = \"127.0.0.1:"))
            .and_then(|p| p.trim_end_matches('"').parse().ok())
            .context("the config names its admin port")
    }
}

/// A replica's config; `generation` changes the `reloaded` policy.
pub fn config(grpc_port: u16, admin_port: u16, store: &str, generation: u64) -> String {
    use std::fmt::Write as _;
    let mut policies = String::new();
    for p in POLICIES {
        let _ = write!(
            policies,
            "\n[policies.{}]\nalgorithm = \"{}\"\nlimit = {}\n",
            p.name, p.algorithm, p.limit
        );
        if p.rule == Rule::Slots {
            let _ = writeln!(policies, "slot_ttl = \"{}ms\"", p.window_ms);
        } else {
            let _ = writeln!(policies, "window = \"{}ms\"", p.window_ms);
        }
        if p.rule == Rule::Bucket {
            let _ = writeln!(policies, "burst = {}", p.burst);
        }
        let _ = writeln!(policies, "on_error = \"{}\"", p.on_error);
        if p.name == POLICIES[LEASE].name {
            let _ = writeln!(
                policies,
                "lease = {{ max_units = 5, min_units = 1, max_ttl = \"{LEASE_MAX_TTL_MS}ms\" }}"
            );
        }
    }
    format!(
        r#"# Written by the chaos driver.
[server]
grpc_addr = "127.0.0.1:{grpc_port}"
admin_addr = "127.0.0.1:{admin_port}"
config_poll_interval = "0s"
worker_threads = 1

[log]
level = "warn"

[store]
backend = "redis"
on_error = "error"

[store.redis]
{store}timeout = "{REDIS_TIMEOUT}"
{policies}
[policies.bg]
algorithm = "fixed_window"
limit = 1000
window = "{BG_WINDOW_MS}ms"

[policies.reloaded]
algorithm = "sliding_log"
limit = {reloaded}
window = "{RELOADED_WINDOW_MS}ms"
"#,
        reloaded = 20 + generation % 50,
    )
}

/// The longest TTL a quotad key of this name needs: its policy's state
/// lasts at most this (a fixed window or a log: one window; a sliding
/// window: two; a bucket: until full; a concurrency key: its slots'
/// TTL and the script's grace); a lease ledger (`|g`) at most the lease
/// TTL or the state's. `None` for a key no policy of the run writes.
pub fn ttl_bound_ms(key: &str) -> Option<u64> {
    let name = key.strip_prefix("quotad:")?.split('|').next()?;
    let state = match name {
        "bg" => BG_WINDOW_MS,
        "reloaded" => RELOADED_WINDOW_MS,
        _ => {
            let p = POLICIES.iter().find(|p| p.name == name)?;
            match p.algorithm {
                "sliding_window" => 2 * p.window_ms,
                "token_bucket" | "leaky_bucket" => (p.burst * p.window_ms).div_ceil(p.limit),
                "concurrency" => p.window_ms + SLOT_GRACE_MS,
                _ => p.window_ms,
            }
        }
    };
    Some(if key.ends_with("|g") {
        state.max(LEASE_MAX_TTL_MS)
    } else {
        state
    })
}

async fn scan_ttls(
    store: &Store,
    after: &str,
    scans: &mut Vec<TtlScan>,
    bad: &mut Vec<TtlViolation>,
) {
    let mut keys = 0;
    let mut worst: f64 = 0.0;
    let primaries = store.watch().primaries().await;
    if primaries.is_empty() {
        bad.push(TtlViolation {
            key: "(no primary answered: nothing scanned)".to_owned(),
            pttl_ms: 0,
            bound_ms: 0,
            after: after.to_owned(),
        });
    }
    for port in primaries {
        match redis::ttls(port, "quotad").await {
            Ok(list) => {
                keys += list.len();
                for (key, pttl) in list {
                    let bound = ttl_bound_ms(&key);
                    let over = match bound {
                        None => true,
                        Some(b) => {
                            pttl == -1 || pttl < -2 || pttl > i64::try_from(b).unwrap_or(i64::MAX)
                        }
                    };
                    if let Some(b) = bound
                        && pttl > 0
                    {
                        worst = worst.max(pttl as f64 / b as f64);
                    }
                    if over && bad.len() < 50 {
                        bad.push(TtlViolation {
                            key,
                            pttl_ms: pttl,
                            bound_ms: bound.unwrap_or(0),
                            after: after.to_owned(),
                        });
                    }
                }
            }
            Err(e) => bad.push(TtlViolation {
                key: format!("(the scan of port {port} failed: {e})"),
                pttl_ms: 0,
                bound_ms: 0,
                after: after.to_owned(),
            }),
        }
    }
    scans.push(TtlScan {
        after: after.to_owned(),
        keys,
        worst_fraction: worst,
    });
}

#[allow(clippy::too_many_lines)]
async fn run_phase(
    options: &Options,
    topology: Topology,
    events: Vec<Event>,
    seconds: u64,
    index: usize,
    dir: &Path,
) -> anyhow::Result<PhaseReport> {
    std::fs::create_dir_all(dir)?;
    let mut store = match topology {
        Topology::Sentinel => {
            Store::Sentinel(redis::SentinelSet::start(&options.redis_server, dir).await?)
        }
        Topology::Cluster => {
            Store::Cluster(redis::Cluster::start(&options.redis_server, dir).await?)
        }
    };
    let store_toml = store.toml();
    let mut quotads = Vec::new();
    for i in 0..3 {
        let (grpc_port, admin_port) = (free_port()?, free_port()?);
        let config_path = dir.join(format!("quotad-{i}.toml"));
        std::fs::write(&config_path, config(grpc_port, admin_port, &store_toml, 0))?;
        let log = dir.join(format!("quotad-{i}.log"));
        let process = Quotad::spawn(&options.quotad, &config_path, &log)?;
        quotads.push(Quotad {
            binary: options.quotad.clone(),
            config: config_path,
            log,
            grpc_port,
            process,
        });
    }
    for q in &quotads {
        q.wait_ready(Duration::from_secs(30)).await?;
    }
    let replicas = Arc::new(
        quotads
            .iter()
            .map(|q| load::Replica::lazy(q.grpc_port))
            .collect::<anyhow::Result<Vec<_>>>()?,
    );
    let pids: Arc<Vec<AtomicU32>> = Arc::new(
        quotads
            .iter()
            .map(|q| AtomicU32::new(q.process.pid()))
            .collect(),
    );
    let keys = u32::try_from((options.rate / 500).clamp(1, 8)).unwrap_or(1);
    let shared = load::Shared::new(keys);

    let started = Instant::now();
    let started_ms = epoch_ms();
    let at = |ms: u64| tokio::time::Instant::from_std(started + Duration::from_millis(ms));
    let since = move || u64::try_from(started.elapsed().as_millis()).unwrap_or(0);

    // RSS of every replica every 200 ms: (ms into the phase, replica, KiB);
    // and the calls started by then: (ms into the phase, count).
    let rss = Arc::new(std::sync::Mutex::new(Vec::<(u64, usize, u64)>::new()));
    let sent = Arc::new(std::sync::Mutex::new(Vec::<(u64, u64)>::new()));
    let sampler = {
        let (rss, pids, shared, sent) = (
            Arc::clone(&rss),
            Arc::clone(&pids),
            Arc::clone(&shared),
            Arc::clone(&sent),
        );
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(200));
            while !shared.stop.load(Ordering::Relaxed) {
                ticks.tick().await;
                sent.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((since(), shared.sent.load(Ordering::Relaxed)));
                for (i, pid) in pids.iter().enumerate() {
                    if let Ok(kib) = rss_kib(pid.load(Ordering::Relaxed)) {
                        rss.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((since(), i, kib));
                    }
                }
            }
        })
    };
    // Role changes (failovers), polled every 250 ms: (epoch ms, the
    // primaries before, after, the fault last started).
    let last_fault = Arc::new(std::sync::Mutex::new(String::from("no fault yet")));
    let watcher = {
        let (watch, shared, last_fault) =
            (store.watch(), Arc::clone(&shared), Arc::clone(&last_fault));
        tokio::spawn(async move {
            let mut changes = Vec::new();
            // Times when more nodes said master than should (an old
            // primary not yet demoted): (from, to, the fault last started).
            let mut splits: Vec<(u64, u64, String)> = Vec::new();
            let mut split_since: Option<(u64, String)> = None;
            let mut before = watch.primaries().await;
            while !shared.stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let fault = last_fault.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let now = watch.primaries().await;
                if !now.is_empty() && now != before {
                    changes.push((epoch_ms(), before, now.clone(), fault.clone()));
                    before = now;
                }
                let (masters, expected) = watch.masters().await;
                match (masters > expected, split_since.take()) {
                    (true, None) => split_since = Some((epoch_ms(), fault)),
                    (true, Some(since)) => split_since = Some(since),
                    (false, Some((from, fault))) => splits.push((from, epoch_ms(), fault)),
                    (false, None) => {}
                }
            }
            if let Some((from, fault)) = split_since {
                splits.push((from, epoch_ms(), fault));
            }
            (changes, splits)
        })
    };
    let mut pacers = Vec::new();
    let per_pacer = (options.rate / 4).max(1);
    for id in 0..4 {
        pacers.push(tokio::spawn(load::pacer(
            id,
            options.seed ^ (index as u64) << 32,
            per_pacer,
            Arc::clone(&replicas),
            Arc::clone(&shared),
        )));
    }

    let mut played = Vec::new();
    let mut losses = Vec::new();
    let mut ttl_scans = Vec::new();
    let mut ttl_violations = Vec::new();
    let mut stalls = Vec::new();
    let mut generation = 0;
    // (replica, epoch ms) of each quotad SIGKILL.
    let mut kills: Vec<(usize, u64)> = Vec::new();
    for event in &events {
        tokio::time::sleep_until(at(event.at_ms)).await;
        let from_ms = since();
        let line = event.to_string();
        tracing::info!(%line, "fault");
        line.clone_into(&mut last_fault.lock().unwrap_or_else(|p| p.into_inner()));
        let mut note = String::new();
        match event.fault {
            Fault::Stop { node, for_ms } | Fault::Stall { node, for_ms } => {
                if let Some(i) = store.resolve(node).await {
                    let n = store.node(i);
                    note = format!("port {}", n.port);
                    n.pause()?;
                    tokio::time::sleep(Duration::from_millis(for_ms)).await;
                    store.node(i).resume()?;
                    if matches!(event.fault, Fault::Stall { .. }) {
                        stalls.push((from_ms, since()));
                    }
                } else {
                    note = "no such node now".to_owned();
                }
            }
            Fault::Kill { node, down_ms } => {
                if let Some(i) = store.resolve(node).await {
                    let was_primary = matches!(node, Role::Primary(_));
                    let n = store.node(i);
                    note = format!("port {}", n.port);
                    n.kill();
                    let killed = epoch_ms();
                    tokio::time::sleep(Duration::from_millis(down_ms)).await;
                    if let Err(e) = store.node(i).restart().await {
                        note.push_str(&format!("; restart: {e}"));
                    }
                    if was_primary {
                        losses.push(LossEvent {
                            what: format!("{line} (its unsynced append-only second)"),
                            from_ms: killed,
                            to_ms: epoch_ms(),
                        });
                    }
                } else {
                    note = "no such node now".to_owned();
                }
            }
            Fault::KillQuotad { replica, down_ms } => {
                let q = &mut quotads[replica];
                kills.push((replica, epoch_ms()));
                q.process.kill();
                tokio::time::sleep(Duration::from_millis(down_ms)).await;
                q.process = Quotad::spawn(&q.binary, &q.config, &q.log)?;
                pids[replica].store(q.process.pid(), Ordering::Relaxed);
                if let Err(e) = q.wait_ready(Duration::from_secs(20)).await {
                    note = e.to_string();
                }
                scan_ttls(&store, &line, &mut ttl_scans, &mut ttl_violations).await;
            }
            Fault::KillSentinel { sentinel, down_ms } => {
                if let Store::Sentinel(s) = &mut store {
                    s.sentinels[sentinel].kill();
                    tokio::time::sleep(Duration::from_millis(down_ms)).await;
                    if let Err(e) = s.sentinels[sentinel].restart().await {
                        note = e.to_string();
                    }
                }
            }
            Fault::Failover { primary } => match &store {
                Store::Sentinel(s) => note = s.failover().await?.trim().to_owned(),
                Store::Cluster(c) => {
                    if let Some(r) = c.resolve(Role::Replica(primary)).await {
                        note = c.nodes[r]
                            .cli(&["cluster", "failover"])
                            .await?
                            .trim()
                            .to_owned();
                        note.push_str(&format!(" (port {})", c.nodes[r].port));
                    } else {
                        note = "no replica now".to_owned();
                    }
                }
            },
            Fault::Blackhole { node, for_ms } => {
                if let Store::Sentinel(s) = &store {
                    let i = s.resolve(node).await;
                    note = format!("port {}", s.nodes[i].port);
                    s.proxies[i].blackhole();
                    tokio::time::sleep(Duration::from_millis(for_ms)).await;
                    s.proxies[i].heal();
                }
            }
            Fault::Reload => {
                generation += 1;
                for q in &quotads {
                    let admin = q.admin_port()?;
                    std::fs::write(
                        &q.config,
                        config(q.grpc_port, admin, &store_toml, generation),
                    )?;
                    signal(q.process.pid(), "-HUP")?;
                }
            }
        }
        played.push(Played {
            planned_ms: event.at_ms,
            from_ms,
            to_ms: since(),
            line,
            note,
        });
    }
    tokio::time::sleep_until(at(seconds * 1_000)).await;
    // Scanned while the load still runs: every key is live.
    scan_ttls(&store, "the end", &mut ttl_scans, &mut ttl_violations).await;
    shared.stop.store(true, Ordering::SeqCst);
    for p in pacers {
        p.await?;
    }
    sampler.await?;
    let (changes, splits) = watcher.await?;
    let mut coordinated = Vec::new();
    for (at_ms, before, after, fault) in changes {
        // CLUSTER FAILOVER (no FORCE) waits for the replica to catch up:
        // it loses nothing, and an excess around it fails the run.
        if topology == Topology::Cluster && fault.contains(" failover ") {
            coordinated.push(format!(
                "primaries {before:?} -> {after:?} at {at_ms} ms after {fault}"
            ));
            continue;
        }
        // A promotion is seen up to down-after-milliseconds (1.5 s) plus
        // a poll after the primary went.
        losses.push(LossEvent {
            what: format!("failover (primaries {before:?} -> {after:?}) seen after {fault}"),
            from_ms: at_ms.saturating_sub(FAILOVER_BEFORE_MS),
            to_ms: at_ms + FAILOVER_AFTER_MS,
        });
    }
    for (from_ms, to_ms, fault) in splits {
        // An old primary that still says master takes the writes of
        // whoever is still connected to it, and loses them when it is
        // demoted: measured, from the first poll that saw two masters to
        // the first that saw one.
        losses.push(LossEvent {
            what: format!(
                "two masters at once for {} ms, after {fault}",
                to_ms - from_ms
            ),
            from_ms,
            to_ms,
        });
    }
    // Calls still in flight end by their deadline (plus the no-answer
    // bound).
    tokio::time::sleep(load::DEADLINE + Duration::from_secs(1)).await;
    let phase_seconds = started.elapsed().as_secs_f64();
    let mut failures = Vec::new();
    // Reloads: none rejected (a replica restarted since counts from then).
    let mut reloads_applied = 0;
    for (i, q) in quotads.iter().enumerate() {
        let metrics = match q.admin_port() {
            Ok(port) => crate::soak::process::http_get(port, "/metrics")
                .await
                .unwrap_or_default(),
            Err(_) => String::new(),
        };
        let metric = |name: &str| crate::soak::verdict::metric(&metrics, name);
        reloads_applied += metric("quotad_policy_reloads_total{outcome=\"ok\"}").unwrap_or(0);
        if let Some(n) = metric("quotad_policy_reloads_total{outcome=\"error\"}")
            && n > 0
        {
            failures.push(format!("quotad-{i} rejected {n} config reloads"));
        }
    }
    for q in &mut quotads {
        if let Err(e) = q.process.stop(Duration::from_secs(15)).await {
            failures.push(format!("quotad did not stop cleanly: {e}"));
        }
    }
    drop(store);

    let (mut answers, mut tally) = shared.take();
    // A call in flight on a quotad the driver SIGKILLs ends when its
    // connection does: tonic says UNKNOWN "transport error", or CANCELLED
    // "operation was canceled" for one not sent yet (gRPC's UNAVAILABLE:
    // the server went away). Only those, within a second of a kill of the
    // replica they were sent to, are taken as such.
    let killed_with = |replica: usize, recv_ms: u64, code: &str, message: &str| {
        matches!(
            (code, message),
            ("UNKNOWN", "transport error") | ("CANCELLED", "operation was canceled")
        ) && kills
            .iter()
            .any(|(r, at)| *r == replica && recv_ms >= *at && recv_ms <= at + KILLED_CALLS_MS)
    };
    for a in &mut answers {
        if let checker::Said::Failed { code, message } = &mut a.said
            && killed_with(a.replica, a.recv_ms, code, message)
        {
            "UNAVAILABLE".clone_into(code);
            "quotad SIGKILLed".clone_into(message);
        }
    }
    let killed_calls = tally.odd.len();
    tally
        .odd
        .retain(|o| !killed_with(o.replica, o.recv_ms, &o.code, &o.message));
    let killed_calls = killed_calls - tally.odd.len();
    let findings = checker::judge(POLICIES, &answers, &losses, LOSS_MARGIN_MS);
    let samples = rss.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let sent = sent.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let stall = judge_stalls(&stalls, &samples, &sent);
    let achieved_rps = sent
        .last()
        .map_or(0.0, |(t, n)| *n as f64 * 1_000.0 / (*t).max(1) as f64);
    for e in &findings.over_admitted {
        failures.push(format!(
            "{} key k{}: {} admitted where {} may be, from {} to {} ms ({:.1} s into the phase)",
            e.policy,
            e.key,
            e.admitted,
            e.bound,
            e.from_ms,
            e.to_ms,
            e.from_ms.saturating_sub(started_ms) as f64 / 1_000.0
        ));
    }
    for a in &findings.bad_codes {
        failures.push(format!(
            "undocumented answer {:?} from {} on {}",
            a.said, a.replica, POLICIES[a.policy].name
        ));
    }
    for a in &findings.wrong_fallback {
        failures.push(format!(
            "{:?} on {} whose on_error is {}",
            a.said, POLICIES[a.policy].name, POLICIES[a.policy].on_error
        ));
    }
    if let Some(o) = tally.odd.first() {
        failures.push(format!(
            "{} calls (all load) failed with codes not documented for faults, the first: {} {} from quotad-{} at {} ms: {}",
            tally.odd.len(),
            o.method,
            o.code,
            o.replica,
            o.recv_ms,
            o.message
        ));
    }
    for t in &ttl_violations {
        failures.push(format!(
            "{} has PTTL {} ms where its policy needs at most {} (after {})",
            t.key, t.pttl_ms, t.bound_ms, t.after
        ));
    }
    for s in &stall {
        if s.during_kib > s.bound_kib {
            failures.push(format!(
                "quotad-{} RSS grew from {} KiB to {} KiB during the stall (bound {} KiB)",
                s.replica, s.before_kib, s.during_kib, s.bound_kib
            ));
        }
    }
    if findings.admissions == 0 {
        failures.push("nothing was admitted: the load did not reach quotad".to_owned());
    }
    Ok(PhaseReport {
        topology,
        seconds: phase_seconds,
        schedule: events.iter().map(ToString::to_string).collect(),
        played,
        losses,
        findings,
        ttl_scans,
        ttl_violations,
        stall,
        killed_calls,
        reloads: (generation, reloads_applied),
        coordinated,
        achieved_rps,
        tally,
        failures,
    })
}

fn judge_stalls(
    stalls: &[(u64, u64)],
    samples: &[(u64, usize, u64)],
    sent: &[(u64, u64)],
) -> Vec<StallRss> {
    let mut out = Vec::new();
    for &(from, to) in stalls {
        let at = |t: u64| sent.iter().find(|(s, _)| *s >= t).copied();
        let offered_rps = match (at(from), at(to)) {
            (Some((t0, n0)), Some((t1, n1))) if t1 > t0 => {
                (n1 - n0) as f64 * 1_000.0 / (t1 - t0) as f64
            }
            _ => 0.0,
        };
        for replica in 0..3 {
            let peak = |lo: u64, hi: u64| {
                samples
                    .iter()
                    .filter(|(t, r, _)| *r == replica && *t >= lo && *t <= hi)
                    .map(|(_, _, k)| *k)
                    .max()
                    .unwrap_or(0)
            };
            let before = peak(from.saturating_sub(3_000), from);
            let during = peak(from, to + 1_000);
            let bound = before + (before as f64 * RSS_GROWTH) as u64 + RSS_SLACK_KIB;
            out.push(StallRss {
                replica,
                before_kib: before,
                during_kib: during,
                bound_kib: bound,
                offered_rps,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_generation_of_the_config_is_valid_and_changes_only_a_policy() {
        let store = "url = \"redis://chaos/0\"\nsentinel_nodes = [\"redis://127.0.0.1:1\"]\n";
        let first = quotad::Config::from_toml(&config(1, 2, store, 0)).expect("valid");
        let next = quotad::Config::from_toml(&config(1, 2, store, 1)).expect("valid");
        assert!(first.restart_required_changes(&next).is_empty());
        assert_ne!(
            first.policies()["reloaded"].policy.limit(),
            next.policies()["reloaded"].policy.limit()
        );
        for p in POLICIES {
            assert_eq!(
                first.policies()[p.name].policy.limit(),
                p.limit,
                "{}",
                p.name
            );
        }
        quotad::Config::from_toml(&config(
            1,
            2,
            "cluster_nodes = [\"redis://127.0.0.1:1\"]\n",
            0,
        ))
        .expect("valid");
    }

    #[test]
    fn ttl_bounds_follow_each_policy() {
        assert_eq!(ttl_bound_ms("quotad:fw_error|{k0}|2F2000"), Some(2_000));
        assert_eq!(ttl_bound_ms("quotad:sw|{k0}|2S2000"), Some(4_000));
        assert_eq!(ttl_bound_ms("quotad:tb|{k0}|2T1000"), Some(2_000));
        assert_eq!(ttl_bound_ms("quotad:conc|{k0}|2C0"), Some(62_000));
        assert_eq!(ttl_bound_ms("quotad:lease|{k0}|2F2000|g"), Some(2_000));
        assert_eq!(ttl_bound_ms("quotad:bg|{bg1}|2F5000"), Some(5_000));
        assert_eq!(ttl_bound_ms("quotad:unknown|{k0}|2F1"), None);
        assert_eq!(ttl_bound_ms("other"), None);
    }
}
