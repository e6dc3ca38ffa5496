//! The `quotad` binary: parses the command line, builds a validated
//! [`quotad::Config`], binds the listeners and runs the server until
//! SIGTERM or SIGINT. It is also a client (`check`, `peek`, `demo`; see
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
use quotad::{Causes, Config, ConfigError, FlagValues, Listeners};
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
    /// Check a config file (and the TLS and RLS rules files it names)
    /// without serving.
    ValidateConfig {
        /// The TOML file to check.
        file: PathBuf,
        /// RLS rules to check too, in place of the file's rls.config_dir.
        #[arg(long, value_name = "DIR")]
        rls_config: Option<PathBuf>,
    },
    /// Ask a running quotad for decisions (each one consumes budget).
    Check(cli::CheckArgs),
    /// Ask a running quotad what a check would answer, consuming nothing.
    Peek(cli::PeekArgs),
    /// Take a slot of a concurrency policy, hold it (renewing it) for
    /// --hold, then release it.
    Acquire(cli::AcquireArgs),
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
        Some(Command::ValidateConfig { file, rls_config }) => {
            validate_config(&file, rls_config.as_deref())
        }
        Some(Command::Serve(args)) => serve(*args),
        Some(Command::Check(args)) => cli::execute(|out| cli::check(args, out)),
        Some(Command::Peek(args)) => cli::execute(|out| cli::peek(args, out)),
        Some(Command::Acquire(args)) => cli::execute(|out| cli::acquire(args, out)),
        Some(Command::Demo(args)) => cli::execute(|out| cli::demo(args, out)),
        Some(Command::Simulate(args)) => {
            cli::execute(|out| std::future::ready(cli::simulate(args, out)))
        }
        None => serve(cli.serve),
    }
}

fn validate_config(file: &Path, rls_config: Option<&Path>) -> ExitCode {
    let flags = match rls_config {
        Some(dir) => FlagValues::new().with("rls.config_dir", &dir.to_string_lossy()),
        None => FlagValues::new(),
    };
    match Config::load(Some(file), &flags) {
        Ok(config) => {
            let mut out = std::io::stdout().lock();
            let rls = match (config.rls().config_dir.as_deref(), config.rls().rules()) {
                (Some(dir), Ok(rules)) => format!(
                    ", {} RLS rules in {} domains from {}",
                    rules.rule_count(),
                    rules.domains().count(),
                    dir.display()
                ),
                _ => String::new(),
            };
            // A closed stdout is no reason to fail a valid config.
            let _ = writeln!(
                out,
                "{}: ok ({} named policies{rls})",
                file.display(),
                config.policies().len()
            );
            ExitCode::SUCCESS
        }
        Err(error) => config_error(Some(file), &error),
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    let config = match Config::load(args.config.as_deref(), &args.flags) {
        Ok(config) => config,
        Err(error) => return config_error(args.config.as_deref(), &error),
    };
    init_server_tracing(config.log());
    match serve_config(config) {
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

fn serve_config(config: Config) -> anyhow::Result<()> {
    raise_open_files_limit(config.transport().max_connections);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = config.server().worker_threads {
        runtime.worker_threads(threads);
    }
    let runtime = runtime
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        ignore_hangup();
        let listeners = Listeners::bind(&config).await?;
        let shutdown = shutdown_signal().context("cannot listen for SIGTERM/SIGINT")?;
        quotad::run(config, listeners, shutdown).await?;
        Ok(())
    })
}

/// Raises the soft limit on open files to the hard one: each connection is
/// a file, and both ports may hold `max_connections` (the common soft limit
/// of 1,024 is below the default 10,000). Warns when even the hard limit is
/// too low, since accept then fails (EMFILE) before the cap is reached.
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
    // Both ports' connections, and room for the store, logs and snapshots.
    let needed = 2 * max_connections as u64 + 64;
    if open_files < needed {
        tracing::warn!(
            open_files,
            needed,
            "the open files limit is below 2 x transport.max_connections: raise it (ulimit -n) or lower the cap"
        );
    }
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
/// or one JSON object a line.
fn init_server_tracing(log: &LogSettings) {
    let filter = EnvFilter::new(&log.level);
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match log.format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().init(),
    }
}
