//! The soak test's driver (`scripts/soak.sh` builds and runs it): mixed
//! load against a release quotad on loopback, memory then Redis, with
//! the pass criteria checked. Exits 0 when every phase passed, 1 when one
//! failed, 2 when the run could not be made.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use quotad_fuzz::soak::{self, Options, PhaseReport};

/// Soak quotad: bounded mixed load on 127.0.0.1 with memory, error and
/// budget checks.
#[derive(Debug, Parser)]
struct Args {
    /// The quotad binary to run (a release build).
    #[arg(long)]
    quotad: PathBuf,
    /// The redis-server binary for the Redis phase; without it, only the
    /// memory phase runs.
    #[arg(long)]
    redis_server: Option<PathBuf>,
    /// Seconds of load in all (split evenly between the phases); 10 to
    /// 3,600.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(10..=3_600))]
    duration: u64,
    /// Where configs, logs, soak.json and rss.svg go.
    #[arg(long)]
    out: PathBuf,
    /// `store.max_keys` of the memory phase (keys churn over twice this).
    #[arg(long, default_value_t = 5_000)]
    max_keys: u64,
    /// Calls a second, all load workers together (the checker adds up to
    /// 250); at most 20,000.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=20_000))]
    rate: u64,
    /// Load workers, one call in flight each.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=64))]
    concurrency: u64,
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
    let options = Options {
        quotad: args.quotad,
        redis_server: args.redis_server,
        duration: Duration::from_secs(args.duration),
        out: args.out,
        max_keys: args.max_keys,
        rate: args.rate,
        concurrency: usize::try_from(args.concurrency).unwrap_or(8),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("soak: cannot start a runtime: {e}");
            return ExitCode::from(2);
        }
    };
    // A signal drops the run, and with it the processes it started
    // (their handles kill them when dropped).
    let outcome = runtime.block_on(async {
        tokio::select! {
            result = soak::run(&options) => Some(result),
            () = stop_signal() => None,
        }
    });
    let reports = match outcome {
        Some(Ok(reports)) => reports,
        Some(Err(e)) => {
            eprintln!("soak: the run could not be made: {e:#}");
            return ExitCode::from(2);
        }
        None => {
            eprintln!("soak: stopped by a signal; the processes it started are stopped");
            return ExitCode::from(2);
        }
    };
    let json = serde_json::to_string_pretty(&reports).unwrap_or_default();
    if let Err(e) = std::fs::write(options.out.join("soak.json"), json) {
        eprintln!("soak: cannot write soak.json: {e}");
        return ExitCode::from(2);
    }
    // The summary is the program's output (docs/security.md quotes it).
    let _ = std::io::Write::write_all(&mut std::io::stdout(), summary(&reports).as_bytes());
    if reports.iter().all(|r| r.verdict.passed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// SIGINT or SIGTERM (`timeout` sends the latter).
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without handlers the default actions stand; never resolve.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
}

/// The result as markdown, for docs/security.md.
fn summary(reports: &[PhaseReport]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| phase | seconds | calls | decisions by reason | errors by code | RSS after warm-up (MiB) | checker windows | reloads | verdict |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for r in reports {
        let calls: u64 = r.tally.calls.values().sum();
        let mib = |kib: u64| kib as f64 / 1_024.0;
        let rss = r.verdict.rss_range_kib.map_or_else(
            || "-".to_owned(),
            |(reference, low, high)| {
                format!("{:.1} ({:.1}..{:.1})", mib(reference), mib(low), mib(high))
            },
        );
        let exact = r
            .checker
            .iter()
            .filter(|w| w.complete && w.admitted == soak::CHECKER_LIMIT)
            .count();
        let verdict = if r.verdict.passed() {
            "pass".to_owned()
        } else {
            format!("FAIL: {}", r.verdict.failures().join("; "))
        };
        let _ = writeln!(
            out,
            "| {:?} | {:.0} | {calls} | {:?} | {:?} | {rss} | {exact} of {} exactly {} | {} written, {} applied, {} rejected | {verdict} |",
            r.backend,
            r.seconds,
            r.tally.reasons,
            r.tally.errors,
            r.verdict.windows_judged,
            soak::CHECKER_LIMIT,
            r.reloads_written,
            r.reloads_seen.0,
            r.reloads_seen.1,
        );
    }
    for r in reports {
        let series: Vec<String> = r
            .rss
            .iter()
            .map(|s| format!("{:.0}s {:.1}", s.at_s, s.rss_kib as f64 / 1_024.0))
            .collect();
        let _ = writeln!(
            out,
            "\n{:?} RSS (MiB) every 10 s: {}",
            r.backend,
            series.join(", ")
        );
        if let Some((down, up)) = r.redis_restart_s {
            let _ = writeln!(
                out,
                "Redis stopped at {down:.1} s, answered again at {up:.1} s; last UNAVAILABLE {} after",
                r.verdict
                    .recovered_after_s
                    .map_or_else(|| "none".to_owned(), |s| format!("{s:.2} s")),
            );
        }
        for w in r
            .checker
            .iter()
            .filter(|w| w.complete && w.admitted != soak::CHECKER_LIMIT)
        {
            let _ = writeln!(
                out,
                "checker window at {} ms: admitted {}, {} calls failed",
                w.start_ms, w.admitted, w.failed
            );
        }
        if let Some(live) = r.live_keys {
            let _ = writeln!(out, "live keys at the end: {live}");
        }
    }
    out
}
