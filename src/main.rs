//! The `quotad` binary: parses the command line, builds a validated
//! [`quotad::Config`], binds the listeners and runs the server until
//! SIGTERM or SIGINT. It is also a client (`check`, `peek`, `reset`,
//! `batch`, `demo`; see
//! the `cli` module).
//!
//! Exit codes: 0 after a graceful shutdown (or a valid config for
//! `validate-config`, or an answer from quotad), 2 for an invalid config or
//! command line, or a memory-store snapshot that cannot be read under
//! `store.snapshot.on_bad_file = "refuse"` (nothing has been served then),
//! 1 for any other failure.

mod cli;

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use quotad::config::{LogFormat, LogSettings};
use quotad::policy::rlqs::BucketRules;
use quotad::{Causes, Config, ConfigError, FlagValues, Listeners, WithTraceId};
use tracing_subscriber::EnvFilter;

/// The process's allocator with the `mimalloc` feature; the system's
/// otherwise.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A gRPC state owner for rate limits and quotas.
#[derive(Debug, Parser)]
#[command(
    name = "quotad",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// With no subcommand, quotad serves.
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the gRPC API and the admin HTTP port (the default).
    Serve(Box<ServeArgs>),
    /// Check the configuration `serve` would run (the file, flags and
    /// environment variables, and the TLS and RLS rules files they name)
    /// without serving.
    ValidateConfig(Box<ValidateArgs>),
    /// Ask a running quotad for decisions (each one consumes budget).
    Check(cli::CheckArgs),
    /// Ask a running quotad what a check would answer, consuming nothing.
    Peek(cli::PeekArgs),
    /// Give a key a full budget under a policy again (quotad serves it to
    /// local and mTLS callers by default: limits.allow_reset).
    Reset(cli::ResetArgs),
    /// Several checks in one call, each decided on its own or all or
    /// nothing.
    Batch(cli::BatchArgs),
    /// Take a slot of a concurrency policy, hold it (renewing it) for
    /// --hold, then release it.
    Acquire(cli::AcquireArgs),
    /// Set, remove or list runtime overrides of named policies (quotad
    /// serves them to local and mTLS callers by default:
    /// limits.allow_overrides).
    Override(cli::OverrideArgs),
    /// Explain a key's state under a policy in words: the policy and
    /// override in force, its counts and when it is fresh again; consumes
    /// nothing.
    Explain(cli::ExplainArgs),
    /// Show the window-boundary attack on fixed_window vs sliding_window,
    /// live (starts its own quotad unless --addr is given).
    Demo(cli::DemoArgs),
    /// Run every algorithm in-process on synthetic traffic; write SVG plots
    /// and a CSV, and compare sliding_window with the exact sliding_log.
    Simulate(cli::SimulateArgs),
}

#[derive(Debug, Default, clap::Args)]
struct ServeArgs {
    /// The TOML config file; without one, every setting has its default.
    #[arg(long, short = 'c', env = "QUOTAD_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    flags: FlagValues,
}

#[derive(Debug, clap::Args)]
struct ValidateArgs {
    /// The TOML file to check, in place of --config or QUOTAD_CONFIG;
    /// without either, the defaults with the flags and environment
    /// variables given.
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
    #[command(flatten)]
    serve: ServeArgs,
}

/// An invalid config; exits with code 2.
const EXIT_INVALID_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The server logs as `[log]` says, once its configuration is loaded;
    // the client commands print their own output and log only problems.
    let serving = matches!(cli.command, None | Some(Command::Serve(_)));
    if !serving {
        quotad::init_tool_logs("warn");
    }
    match cli.command {
        Some(Command::ValidateConfig(args)) => validate_config(*args),
        Some(Command::Serve(args)) => serve(*args),
        Some(Command::Check(args)) => cli::execute(|out| cli::check(args, out)),
        Some(Command::Peek(args)) => cli::execute(|out| cli::peek(args, out)),
        Some(Command::Reset(args)) => cli::execute(|out| cli::reset(args, out)),
        Some(Command::Batch(args)) => cli::execute(|out| cli::batch(args, out)),
        Some(Command::Acquire(args)) => cli::execute(|out| cli::acquire(args, out)),
        Some(Command::Override(args)) => cli::execute(|out| cli::override_command(args, out)),
        Some(Command::Explain(args)) => cli::execute(|out| cli::explain(args, out)),
        Some(Command::Demo(args)) => cli::execute(|out| cli::demo(args, out)),
        Some(Command::Simulate(args)) => {
            cli::execute(|out| std::future::ready(cli::simulate(args, out)))
        }
        None => serve(cli.serve),
    }
}

fn validate_config(args: ValidateArgs) -> ExitCode {
    // `--rls-config DIR` is the flag of rls.config_dir: without a FILE it
    // checks the rules alone.
    let ValidateArgs {
        file,
        serve: ServeArgs { config, flags },
    } = args;
    let file = file.or(config);
    match Config::load(file.as_deref(), &flags) {
        Ok(config) => {
            let rlqs = match rlqs_rules(&config) {
                Ok(rlqs) => rlqs,
                Err(error) => {
                    let source = file
                        .as_deref()
                        .map_or_else(|| "defaults".to_owned(), |f| f.display().to_string());
                    eprintln!("error: {source}: invalid RLQS bucket rules: {error}");
                    return ExitCode::from(EXIT_INVALID_CONFIG);
                }
            };
            // A closed stdout is no reason to fail a valid config.
            let _ = writeln!(
                std::io::stdout().lock(),
                "{}",
                validated(file.as_deref(), &flags, &config, rlqs)
            );
            ExitCode::SUCCESS
        }
        Err(error) => config_error(file.as_deref(), &error),
    }
}

/// What `validate-config` read and found: `FILE: ok (...)`, or `defaults:
/// ok (...)` without a file, naming the flags and environment variables
/// that replaced file values.
/// `rlqs.rules`, read and checked against the named policies: what
/// `validate-config` says of them (`None` without such a file).
fn rlqs_rules(config: &Config) -> Result<Option<String>, String> {
    let Some(path) = config.rlqs().rules.as_deref() else {
        return Ok(None);
    };
    let rules = BucketRules::read(path)
        .and_then(|text| {
            BucketRules::parse(path, &text, |p| {
                // Assignments are leases: a rate policy, not a concurrency one.
                config
                    .policies()
                    .get(p)
                    .is_some_and(|s| s.policy.algorithm().is_rate())
            })
        })
        .map_err(|e| e.to_string())?;
    let n = rules.rules().len();
    Ok(Some(format!(
        "{n} RLQS bucket {} from {}",
        if n == 1 { "rule" } else { "rules" },
        path.display()
    )))
}

fn validated(
    file: Option<&Path>,
    flags: &FlagValues,
    config: &Config,
    rlqs: Option<String>,
) -> String {
    let source = file.map_or_else(|| "defaults".to_owned(), |f| f.display().to_string());
    let count =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    let mut found = vec![count(
        config.policies().len(),
        "named policy",
        "named policies",
    )];
    if let (Some(dir), Ok(rules)) = (config.rls().config_dir.as_deref(), config.rls().rules()) {
        found.push(format!(
            "{} in {} from {}",
            count(rules.rule_count(), "RLS rule", "RLS rules"),
            count(rules.domains().count(), "domain", "domains"),
            dir.display()
        ));
    }
    found.extend(rlqs);
    let given: Vec<&str> = flags.paths().collect();
    if !given.is_empty() {
        found.push(format!("flags or environment set {}", given.join(", ")));
    }
    format!("{source}: ok ({})", found.join("; "))
}

fn serve(args: ServeArgs) -> ExitCode {
    let config = match Config::load(args.config.as_deref(), &args.flags) {
        Ok(config) => config,
        Err(error) => return config_error(args.config.as_deref(), &error),
    };
    let runtime = match runtime(&config) {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // The trace exporter's connection runs on the runtime.
    let tracer = {
        let _entered = runtime.enter();
        init_server_tracing(config.log())
    };
    let served = serve_config(config, &runtime);
    if let Some(tracer) = tracer {
        tracer.shutdown();
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // Each cause once, whatever the errors of the chain print.
            tracing::error!("{}", Causes(error.as_ref()));
            // A snapshot quotad was told not to start without is like an
            // invalid config: nothing was served.
            if let Some(quotad::Error::Snapshot(_)) = error.downcast_ref() {
                return ExitCode::from(EXIT_INVALID_CONFIG);
            }
            ExitCode::FAILURE
        }
    }
}

fn config_error(file: Option<&Path>, error: &ConfigError) -> ExitCode {
    match file {
        Some(file) if !matches!(error, ConfigError::Read { .. }) => {
            eprintln!(
                "error: invalid config {}: {}",
                file.display(),
                Causes(error)
            );
        }
        _ => eprintln!("error: invalid config: {}", Causes(error)),
    }
    ExitCode::from(EXIT_INVALID_CONFIG)
}

/// The server's runtime: `server.worker_threads` threads, or one a core.
fn runtime(config: &Config) -> std::io::Result<tokio::runtime::Runtime> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = config.server().worker_threads {
        runtime.worker_threads(threads);
    }
    runtime.enable_all().build()
}

fn serve_config(config: Config, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    raise_open_files_limit(config.transport().max_connections);
    runtime.block_on(async {
        ignore_hangup();
        let listeners = Listeners::bind(&config).await?;
        let shutdown = shutdown_signal().context("cannot listen for SIGTERM/SIGINT")?;
        quotad::run(config, listeners, shutdown).await?;
        Ok(())
    })
}

/// Raises the soft limit on open files to the hard one: each connection is
/// a file (the common soft limit of 1,024 is below the default cap of
/// 10,000 gRPC connections). Warns when even the hard limit leaves too
/// little room, since accept then fails (EMFILE) before the cap is
/// reached: the gRPC port's `max_connections`, the admin port's (at most
/// [`quotad::listen::ADMIN_MAX_CONNECTIONS`]), and [`OTHER_FILES`] for the
/// store's connections, logs and snapshots.
fn raise_open_files_limit(max_connections: usize) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    if let Err(error) = setrlimit(Resource::Nofile, raised) {
        tracing::warn!(%error, "cannot raise the open files limit");
    }
    let open_files = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    if let Some(needed) = open_files_short(open_files, max_connections) {
        tracing::warn!(
            open_files,
            needed,
            "the open files limit is below what transport.max_connections on both ports and {OTHER_FILES} other files need: raise it (ulimit -n) or lower the cap"
        );
    }
}

/// Files quotad may hold besides connections: the store's, logs,
/// snapshots.
const OTHER_FILES: u64 = 64;

/// The files needed when `open_files` is below them; `None` when it is
/// enough.
fn open_files_short(open_files: u64, max_connections: usize) -> Option<u64> {
    let admin = max_connections.min(quotad::listen::ADMIN_MAX_CONNECTIONS);
    let needed = (max_connections as u64)
        .saturating_add(admin as u64)
        .saturating_add(OTHER_FILES);
    (open_files < needed).then_some(needed)
}

/// Takes SIGHUP from its default action (ending the process) for good: it
/// asks for a reload, which the reloaders listen for themselves; with
/// nothing to reload (no config file, no RLS folder), or before they run,
/// it is only logged.
fn ignore_hangup() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(mut hangup) => {
                tokio::spawn(async move {
                    while hangup.recv().await.is_some() {
                        tracing::debug!("SIGHUP received");
                    }
                });
            }
            Err(error) => tracing::warn!(%error, "cannot listen for SIGHUP; it ends the process"),
        }
    }
}

/// Resolves on the first SIGTERM or SIGINT (Ctrl-C). A second one ends the
/// process at once (exit 1), without the rest of the shutdown delay, the
/// drain or the final snapshot: an operator's way out of a shutdown that
/// waits too long.
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()> + Send + 'static> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        Ok(async move {
            let name = tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
            };
            tracing::info!(signal = name, "shutdown requested");
            tokio::spawn(async move {
                let name = tokio::select! {
                    _ = terminate.recv() => "SIGTERM",
                    _ = interrupt.recv() => "SIGINT",
                };
                tracing::warn!(
                    signal = name,
                    "second signal: exiting now, without draining or the final snapshot"
                );
                std::process::exit(1);
            });
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("shutdown requested");
        })
    }
}

/// The server's logs on stderr: `log.level` filters, `log.format` is text
/// or one JSON object a line, and a line written inside an exported span
/// carries its trace id. With an OTLP endpoint in the environment, spans
/// are exported too ([`quotad::trace`]); the returned tracer sends the last
/// ones at shutdown.
fn init_server_tracing(log: &LogSettings) -> Option<quotad::trace::Tracer> {
    use tracing_subscriber::util::SubscriberInitExt as _;

    let (tracer, exporting, failed) = match quotad::trace::Tracer::from_env() {
        Ok(Some((tracer, layer))) => (Some(tracer), Some(layer), None),
        Ok(None) => (None, None, None),
        Err(error) => (None, None, Some(error)),
    };
    server_subscriber(log, exporting).init();
    if let Some(error) = failed {
        tracing::error!("traces are not exported: {}", Causes(&error));
    }
    tracer
}

/// The log layer, and the exporting layer when there is one.
fn server_subscriber(
    log: &LogSettings,
    exporting: Option<quotad::trace::TraceLayer<LogsOnly>>,
) -> Box<dyn tracing::Subscriber + Send + Sync> {
    use tracing_subscriber::fmt::{format, format::JsonFields, layer};
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::{Layer as _, Registry};

    // The exported spans are the trace's, not the log's.
    let filter = EnvFilter::new(&log.level).add_directive(
        quotad::trace::NOT_LOGGED
            .parse()
            .expect("the directive is well formed"),
    );
    let logs: Box<dyn tracing_subscriber::Layer<Registry> + Send + Sync> = match log.format {
        LogFormat::Text => layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .event_format(WithTraceId::new(format(), false))
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => layer()
            .with_writer(std::io::stderr)
            .fmt_fields(JsonFields::new())
            .event_format(WithTraceId::new(format().json(), true))
            .with_filter(filter)
            .boxed(),
    };
    let subscriber = tracing_subscriber::registry().with(logs);
    // Without an exporter there is no layer in its place: an `Option`
    // layer that is `None` answers every callsite "always", which would
    // enable the trace's spans on every call with nothing to send them to.
    match exporting {
        Some(exporting) => Box::new(subscriber.with(exporting)),
        None => Box::new(subscriber),
    }
}

/// The subscriber the exporting layer sits on: the registry and the log layer.
type LogsOnly = tracing_subscriber::layer::Layered<
    Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>,
    tracing_subscriber::Registry,
>;

#[cfg(test)]
mod tests {
    use super::open_files_short;

    #[test]
    fn without_an_exporter_the_traces_spans_are_disabled_and_log_lines_still_written() {
        let config = quotad::Config::load(None, &quotad::FlagValues::default())
            .expect("the defaults are a valid config");
        let subscriber = super::server_subscriber(config.log(), None);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!(target: quotad::trace::TARGET, "rpc");
            assert!(
                span.is_disabled(),
                "a trace span costs nothing when nothing exports it"
            );
            assert!(tracing::enabled!(target: "quotad", tracing::Level::WARN));
        });
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory as _;
        super::Cli::command().debug_assert();
    }

    #[test]
    fn the_open_files_warning_comes_only_when_the_caps_cannot_be_reached() {
        // The default cap on a machine whose limit is 20,000, or 1M: enough.
        assert_eq!(open_files_short(20_000, 10_000), None);
        assert_eq!(open_files_short(1 << 20, 10_000), None);
        assert_eq!(open_files_short(11_088, 10_000), None);
        // A hard limit of 4,096 cannot hold 10,000 connections.
        assert_eq!(open_files_short(4_096, 10_000), Some(11_088));
        assert_eq!(open_files_short(11_087, 10_000), Some(11_088));
        // A small cap: both ports' connections at most.
        assert_eq!(open_files_short(263, 100), Some(264));
        assert_eq!(open_files_short(264, 100), None);
    }
}
