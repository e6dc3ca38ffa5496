//! The `quotad` binary: parses the command line, builds a validated
//! [`quotad::Config`], binds the listeners and runs the server until
//! SIGTERM or SIGINT. It is also a client (`check`, `peek`, `demo`; see
//! the `cli` module).
//!
//! Exit codes: 0 after a graceful shutdown (or a valid config for
//! `validate-config`, or an answer from quotad), 2 for an invalid config or
//! command line (nothing has been bound or sent then), 1 for any other
//! failure.

mod cli;

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use quotad::{Config, ConfigError, Listeners, Overrides};
use tracing_subscriber::EnvFilter;

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
    overrides: Overrides,
}

/// An invalid config; exits with code 2.
const EXIT_INVALID_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The client commands print their own output; only problems are logged.
    let client = matches!(
        cli.command,
        Some(Command::Check(_) | Command::Peek(_) | Command::Demo(_) | Command::Simulate(_))
    );
    init_tracing(if client { "warn" } else { "info" });
    match cli.command {
        Some(Command::ValidateConfig { file, rls_config }) => {
            validate_config(&file, rls_config.as_deref())
        }
        Some(Command::Serve(args)) => serve(*args),
        Some(Command::Check(args)) => cli::execute(|out| cli::check(args, out)),
        Some(Command::Peek(args)) => cli::execute(|out| cli::peek(args, out)),
        Some(Command::Demo(args)) => cli::execute(|out| cli::demo(args, out)),
        Some(Command::Simulate(args)) => {
            cli::execute(|out| std::future::ready(cli::simulate(args, out)))
        }
        None => serve(cli.serve),
    }
}

fn validate_config(file: &Path, rls_config: Option<&Path>) -> ExitCode {
    let overrides = match rls_config {
        Some(dir) => Overrides::new().with("rls.config_dir", &dir.to_string_lossy()),
        None => Overrides::new(),
    };
    match Config::load(Some(file), &overrides) {
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
    let config = match Config::load(args.config.as_deref(), &args.overrides) {
        Ok(config) => config,
        Err(error) => return config_error(args.config.as_deref(), &error),
    };
    match serve_config(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

fn config_error(file: Option<&Path>, error: &ConfigError) -> ExitCode {
    match file {
        Some(file) if !matches!(error, ConfigError::Read { .. }) => {
            eprintln!("error: invalid config {}: {error}", file.display());
        }
        _ => eprintln!("error: invalid config: {error}"),
    }
    ExitCode::from(EXIT_INVALID_CONFIG)
}

fn serve_config(config: Config) -> anyhow::Result<()> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = config.server().worker_threads {
        runtime.worker_threads(threads);
    }
    let runtime = runtime
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let listeners = Listeners::bind(&config).await?;
        let shutdown = shutdown_signal().context("cannot listen for SIGTERM/SIGINT")?;
        quotad::run(config, listeners, shutdown).await?;
        Ok(())
    })
}

/// Resolves on the first SIGTERM or SIGINT (Ctrl-C).
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

/// Logs to stderr; `RUST_LOG` filters (default `default_level`).
fn init_tracing(default_level: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}
