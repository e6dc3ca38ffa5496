//! The chaos run's driver (`scripts/chaos.sh` builds and runs it): three
//! quotad replicas on Redis (Sentinel, then Cluster) under load while a
//! seeded fault schedule plays; every answer judged. Exits 0 when every
//! phase passed, 1 when one failed (the seed and the first failure
//! printed), 2 when the run could not be made.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use quotad_fuzz::chaos::{self, Options, schedule::Topology};

/// Seeded chaos against quotad on 127.0.0.1: faults in Redis, Sentinel,
/// the Cluster, the network and quotad, with every answer checked.
#[derive(Debug, Parser)]
struct Args {
    /// The quotad binary.
    #[arg(long)]
    quotad: PathBuf,
    /// The redis-server binary (also run with --sentinel).
    #[arg(long)]
    redis_server: PathBuf,
    /// Seconds in all, split evenly between the phases; 30 to 3,600.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(30..=3_600))]
    seconds: u64,
    /// The seed of the fault schedule and of the load's choices.
    #[arg(long)]
    seed: u64,
    /// Where configs, logs and chaos.json go.
    #[arg(long)]
    out: PathBuf,
    /// Calls a second offered, all together; at most 10,000.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(50..=10_000))]
    rate: u64,
    /// Only one topology: sentinel or cluster.
    #[arg(long)]
    only: Option<String>,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let topologies = match args.only.as_deref() {
        None => vec![Topology::Sentinel, Topology::Cluster],
        Some("sentinel") => vec![Topology::Sentinel],
        Some("cluster") => vec![Topology::Cluster],
        Some(other) => {
            eprintln!("chaos: --only takes sentinel or cluster, not {other}");
            return ExitCode::from(2);
        }
    };
    let options = Options {
        quotad: args.quotad,
        redis_server: args.redis_server,
        seconds: args.seconds,
        seed: args.seed,
        out: args.out,
        rate: args.rate,
        topologies,
    };
    let mut out = String::new();
    out.push_str(&format!(
        "chaos: seed {} for {} s at {} calls/s\n",
        options.seed, options.seconds, options.rate
    ));
    for (topology, events) in chaos::schedules(&options) {
        out.push_str(&format!("schedule ({topology:?}):\n"));
        for e in events {
            out.push_str(&format!("  {e}\n"));
        }
    }
    print(&out);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("chaos: cannot start a runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = runtime.block_on(async {
        tokio::select! {
            result = chaos::run(&options) => Some(result),
            () = stop_signal() => None,
        }
    });
    // The load's tasks may still hold channels: do not wait for them.
    runtime.shutdown_background();
    let report = match outcome {
        Some(Ok(report)) => report,
        Some(Err(e)) => {
            eprintln!(
                "chaos: the run could not be made (seed {}): {e:#}",
                options.seed
            );
            return ExitCode::from(2);
        }
        None => {
            eprintln!("chaos: stopped by a signal; the processes it started are stopped");
            return ExitCode::from(2);
        }
    };
    let json = serde_json::to_string_pretty(&report).unwrap_or_default();
    if let Err(e) = std::fs::write(options.out.join("chaos.json"), json) {
        eprintln!("chaos: cannot write chaos.json: {e}");
        return ExitCode::from(2);
    }
    print(&summary(&report));
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn print(text: &str) {
    let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
}

/// SIGINT or SIGTERM (`timeout` sends the latter).
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
}

fn summary(report: &chaos::Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for p in &report.phases {
        let calls: u64 = p.tally.calls.values().sum();
        let errors: u64 = p.tally.errors.values().sum();
        let _ = writeln!(
            out,
            "\n{:?}: {:.0} s, {} faults played, {calls} calls answered, {errors} failed {:?} ({} of them unanswered by their deadline, {} ended by a quotad SIGKILL), {:.0} calls/s started, {} ticks skipped",
            p.topology,
            p.seconds,
            p.played.len(),
            p.tally.errors,
            p.tally.unanswered_by_deadline,
            p.killed_calls,
            p.achieved_rps,
            p.tally.skipped
        );
        let f = &p.findings;
        let _ = writeln!(
            out,
            "  checker: {} admissions, {} intervals judged, {} unplaced, {} over the bound outside loss events, {} inside",
            f.admissions,
            f.intervals_judged,
            f.unplaced,
            f.over_admitted.len(),
            f.lost_in_failover.len()
        );
        for l in &p.losses {
            let _ = writeln!(
                out,
                "  loss event: {} ({} ms)",
                l.what,
                l.to_ms.saturating_sub(l.from_ms)
            );
        }
        for e in &f.lost_in_failover {
            let _ = writeln!(
                out,
                "  measured loss: {} k{}: {} admitted where {} may be, {}..{} ms, during {}",
                e.policy,
                e.key,
                e.admitted,
                e.bound,
                e.from_ms,
                e.to_ms,
                e.during.as_deref().unwrap_or("-")
            );
        }
        let _ = writeln!(
            out,
            "  reloads: {} written, {} applied by the replicas running at the end",
            p.reloads.0, p.reloads.1
        );
        let keys: usize = p.ttl_scans.iter().map(|s| s.keys).sum();
        let worst = p
            .ttl_scans
            .iter()
            .map(|s| s.worst_fraction)
            .fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "  TTL: {} scans, {keys} keys, longest TTL {:.0}% of its bound, {} over",
            p.ttl_scans.len(),
            worst * 100.0,
            p.ttl_violations.len()
        );
        for s in &p.stall {
            let _ = writeln!(
                out,
                "  stall RSS quotad-{}: {:.1} MiB before, {:.1} MiB peak during (bound {:.1} MiB) at {:.0} calls/s started",
                s.replica,
                s.before_kib as f64 / 1024.0,
                s.during_kib as f64 / 1024.0,
                s.bound_kib as f64 / 1024.0,
                s.offered_rps
            );
        }
        match p.failures.first() {
            None => {
                let _ = writeln!(out, "  PASS");
            }
            Some(first) => {
                let _ = writeln!(
                    out,
                    "  FAIL (seed {}): {first}; {} failures in all (chaos.json)",
                    report.seed,
                    p.failures.len()
                );
            }
        }
    }
    out
}
