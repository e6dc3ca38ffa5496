//! `loadgen`: drives a quotad (or `noop-server`) with `Check` or
//! `CheckBatch` requests and reports throughput, latency percentiles,
//! errors by gRPC code, and allowed and denied counts.
//!
//! Exit codes: 0 after a run, 1 when the run could not start or finish or
//! `--expect-allowed` did not hold, 2 for an invalid command line.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgGroup, Parser, ValueEnum};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use quotad_bench::{
    ClientCalls, KeyDistribution, LoadConfig, MAX_DURATION, Mode, PolicySpec, Report,
};

/// Load generator for quotad's gRPC API.
#[derive(Debug, Parser)]
#[command(name = "loadgen", version)]
#[command(group(ArgGroup::new("policy_source").args(["policy", "inline"])))]
#[command(group(ArgGroup::new("bound").required(true).multiple(true).args(["duration", "requests"])))]
struct Cli {
    /// The server, as http://HOST:PORT (or HOST:PORT).
    #[arg(long, default_value = "http://127.0.0.1:50051", value_name = "URL")]
    addr: String,
    /// Requests in flight (closed loop), or at most in flight (--rate).
    #[arg(long, short = 'c', default_value_t = 64, value_name = "C")]
    concurrency: usize,
    /// Distinct HTTP/2 connections; requests go to them round-robin.
    #[arg(long, short = 'k', default_value_t = 2, value_name = "K")]
    connections: usize,
    /// Unary Check, CheckBatch of --batch-size items, Envoy's
    /// ShouldRateLimit with --descriptors descriptors, or one check a
    /// request through quotad-client (client; see --coalescing and
    /// --deny-cache), or through quotad-client with leases on (lease; see
    /// --lease-want).
    #[arg(long, value_enum, default_value_t = CliMode::Unary)]
    mode: CliMode,
    /// Lease mode: the units each lease asks for (quotad grants at most the
    /// policy's lease.max_units, or a fair share of what is left).
    #[arg(long, default_value_t = 1_000, value_name = "N")]
    lease_want: u64,
    /// Client mode: whether the client coalesces concurrent checks into
    /// CheckBatch calls.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    coalescing: Switch,
    /// Client mode: whether the client answers LIMIT_EXCEEDED denials from
    /// its deny cache until their retry time.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    deny_cache: Switch,
    /// Client mode with coalescing: requests the client keeps in flight
    /// before checks queue for a batch [default: the client's default]
    #[arg(long, value_name = "N")]
    max_in_flight: Option<usize>,
    /// Items per CheckBatch (batch mode).
    #[arg(long, default_value_t = 100, value_name = "B")]
    batch_size: usize,
    /// Descriptors per ShouldRateLimit (rls mode): descriptor i has the one
    /// entry d<i> = a key from --keys.
    #[arg(long, default_value_t = 1, value_name = "N")]
    descriptors: usize,
    /// The domain of every ShouldRateLimit (rls mode).
    #[arg(long, default_value = "bench", value_name = "DOMAIN")]
    domain: String,
    /// Key distribution: hot, uniform:N or zipf:N[:S] (S defaults to 1.0).
    #[arg(long, default_value = "hot", value_name = "DIST")]
    keys: KeyDistribution,
    /// Prepended to every key [default: a random lgXXXXXXXX: per run, so
    /// runs never share budgets]
    #[arg(long, value_name = "PREFIX")]
    key_prefix: Option<String>,
    /// A named policy from the server's config (Check and CheckBatch; one
    /// of --policy and --inline is required for them).
    #[arg(long, value_name = "NAME")]
    policy: Option<String>,
    /// An inline policy: ALGORITHM:LIMIT:WINDOW_MS[:BURST], e.g.
    /// fixed_window:100:60000.
    #[arg(long, value_name = "SPEC")]
    inline: Option<PolicySpec>,
    /// The cost of every check [default: none sent, the server takes 1]
    #[arg(long, value_name = "N")]
    cost: Option<u64>,
    /// Seconds to measure, after the warmup (at most 300).
    #[arg(long, value_name = "SECS", value_parser = parse_secs)]
    duration: Option<Duration>,
    /// Requests to measure, after the warmup; the run also stops after 300 s.
    #[arg(long, value_name = "N")]
    requests: Option<u64>,
    /// Seconds of unmeasured traffic first.
    #[arg(long, value_name = "SECS", default_value = "0", value_parser = parse_secs)]
    warmup: Duration,
    /// Open loop: this many requests/s on a fixed schedule; latency counts
    /// from each request's scheduled send time.
    #[arg(long, value_name = "R")]
    rate: Option<f64>,
    /// Client-side deadline of each request, in milliseconds.
    #[arg(long, default_value_t = 5_000, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(1..=60_000))]
    timeout_ms: u64,
    /// Seeds the key draws.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Runtime worker threads; keep it low when the server shares the box.
    #[arg(long, default_value_t = 1, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
    /// Exit 1 unless exactly N decisions were allowed (correctness under
    /// load: a key with a known budget). Counts measured traffic only, so
    /// it cannot be combined with --warmup.
    #[arg(long, value_name = "N", conflicts_with = "warmup")]
    expect_allowed: Option<u64>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum CliMode {
    Unary,
    Batch,
    Rls,
    Client,
    Lease,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Switch {
    On,
    Off,
}

fn parse_secs(text: &str) -> Result<Duration, String> {
    match text.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 && secs <= MAX_DURATION.as_secs_f64() => {
            Ok(Duration::from_secs_f64(secs))
        }
        _ => Err(format!(
            "expected seconds from 0 to {}",
            MAX_DURATION.as_secs()
        )),
    }
}

impl Cli {
    fn load_config(&self) -> Result<LoadConfig, String> {
        let target = if self.addr.contains("://") || self.addr.starts_with("unix:") {
            self.addr.clone()
        } else {
            format!("http://{}", self.addr)
        };
        let policy = match (&self.policy, &self.inline, self.mode) {
            (_, Some(inline), _) => inline.clone(),
            (Some(name), None, _) => PolicySpec::Named(name.clone()),
            (None, None, CliMode::Rls) => PolicySpec::Named(String::new()),
            (None, None, _) => {
                return Err("--policy or --inline is required for Check and CheckBatch".to_owned());
            }
        };
        let mut config = LoadConfig::new(target, policy);
        config.concurrency = self.concurrency;
        config.connections = self.connections;
        config.mode = match self.mode {
            CliMode::Unary => Mode::Unary,
            CliMode::Batch => Mode::Batch {
                size: self.batch_size,
            },
            CliMode::Rls => Mode::Rls {
                descriptors: self.descriptors,
            },
            CliMode::Client => Mode::Client {
                coalescing: self.coalescing == Switch::On,
                deny_cache: self.deny_cache == Switch::On,
                lease_want: None,
            },
            CliMode::Lease => Mode::Client {
                coalescing: self.coalescing == Switch::On,
                deny_cache: self.deny_cache == Switch::On,
                lease_want: Some(self.lease_want),
            },
        };
        config.domain.clone_from(&self.domain);
        config.keys = self.keys;
        if let Some(prefix) = &self.key_prefix {
            config.key_prefix.clone_from(prefix);
        }
        config.cost = self.cost;
        config.duration = self.duration;
        config.requests = self.requests;
        config.warmup = self.warmup;
        config.rate = self.rate;
        config.timeout = Duration::from_millis(self.timeout_ms);
        config.seed = self.seed;
        if let Some(slots) = self.max_in_flight {
            config.max_in_flight = slots;
        }
        Ok(config)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    quotad::init_tool_logs("warn");
    let config = match cli.load_config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    if let Err(error) = config.validate() {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(cli.threads))
        .thread_name("loadgen")
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // quotad-client counts its calls through the `metrics` facade.
    let calls = matches!(config.mode, Mode::Client { .. }).then(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().map(|()| snapshotter)
    });
    let mut report = match runtime.block_on(quotad_bench::run(config)) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("error: {:#}", anyhow::Error::from(error));
            return ExitCode::FAILURE;
        }
    };
    match calls {
        Some(Ok(snapshotter)) => report.client_calls = Some(client_calls(&snapshotter, &report)),
        Some(Err(error)) => tracing::warn!(%error, "client calls not counted"),
        None => {}
    }
    if let Err(error) = print_report(&report, cli.json, cli.threads) {
        eprintln!("error: cannot write the report: {error}");
        return ExitCode::FAILURE;
    }
    match cli.expect_allowed {
        Some(expected) if report.allowed != expected => {
            eprintln!(
                "error: expected {expected} allowed decisions, got {} ({} denied, {} errors)",
                report.allowed, report.denied, report.errors
            );
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    }
}

/// The calls quotad-client counted over the run.
fn client_calls(snapshotter: &Snapshotter, report: &Report) -> ClientCalls {
    let (mut checks, mut batches, mut leases, mut local_denials) = (0, 0, 0, 0);
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let DebugValue::Counter(count) = value else {
            continue;
        };
        let key = key.key();
        let method = key
            .labels()
            .find(|label| label.key() == "method")
            .map(|label| label.value());
        match (key.name(), method) {
            ("quotad_client_calls_total", Some("check")) => checks += count,
            ("quotad_client_calls_total", Some("check_batch")) => batches += count,
            ("quotad_client_calls_total", Some("lease")) => leases += count,
            ("quotad_client_local_denials_total", _) => local_denials += count,
            _ => {}
        }
    }
    ClientCalls::new(checks, batches, leases, local_denials, report)
}

#[allow(clippy::print_stdout)]
fn print_report(report: &Report, json: bool, threads: u16) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        let text = serde_json::to_string(report).map_err(std::io::Error::other)?;
        writeln!(out, "{text}")?;
        return out.flush();
    }
    let loop_kind = match report.target_rate {
        Some(rate) => format!("open loop at {rate} req/s"),
        None => "closed loop".to_owned(),
    };
    writeln!(
        out,
        "{} | {loop_kind} | concurrency {} over {} connection(s) | {} loadgen thread(s)",
        report.mode, report.concurrency, report.connections, threads
    )?;
    writeln!(
        out,
        "keys {} (prefix {:?}) | policy {}",
        report.keys, report.key_prefix, report.policy
    )?;
    writeln!(
        out,
        "elapsed     {:.2} s (after {} warmup requests)",
        report.elapsed_secs, report.warmup_requests
    )?;
    writeln!(
        out,
        "requests    {:>12} {:>14.0} /s",
        report.requests, report.requests_per_sec
    )?;
    writeln!(
        out,
        "decisions   {:>12} {:>14.0} /s",
        report.decisions, report.decisions_per_sec
    )?;
    writeln!(
        out,
        "allowed     {:>12}\ndenied      {:>12}",
        report.allowed, report.denied
    )?;
    write!(out, "errors      {:>12}", report.errors)?;
    for (code, count) in &report.errors_by_code {
        write!(out, "  {code}={count}")?;
    }
    writeln!(out)?;
    if let Some(calls) = &report.client_calls {
        writeln!(
            out,
            "client calls {} Check + {} CheckBatch + {} Lease, {} local denials ({:.4} calls per decision, warmup included)",
            calls.checks,
            calls.batches,
            calls.leases,
            calls.local_denials,
            calls.calls_per_decision
        )?;
    }
    if let Some(leases) = &report.leases {
        writeln!(
            out,
            "leases      {} acquired, {} renewed, {} returned, {} direct, {} failed; {} local admissions ({:.4} of the decisions, warmup included)",
            leases.acquired,
            leases.renewed,
            leases.returned,
            leases.direct,
            leases.failed,
            leases.local_admissions,
            leases.local_share
        )?;
    }
    if let Some(cpu) = report.loadgen_cpu_us_per_decision {
        writeln!(
            out,
            "loadgen CPU {cpu:.3} us per decision (warmup included)"
        )?;
    }
    if report.missed > 0 {
        writeln!(
            out,
            "missed      {:>12} (scheduled, never sent)",
            report.missed
        )?;
    }
    let l = &report.latency;
    writeln!(
        out,
        "latency us (from {:?}): p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}  mean {:.1}",
        report.latency_from, l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us, l.mean_us
    )?;
    if report.errors > 0 {
        let l = &report.decided_latency;
        writeln!(
            out,
            "decided us (failed calls left out): p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us
        )?;
    }
    if let Some(l) = &report.send_lag {
        writeln!(
            out,
            "send lag us (part of the latency): p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            l.p50_us, l.p90_us, l.p99_us, l.p999_us, l.max_us
        )?;
    }
    out.flush()
}
