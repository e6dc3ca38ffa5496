//! `noop-server`: quotad's gRPC API answering every call at once with an
//! allowed decision, with quotad's own tonic settings. The floor that
//! quotad's throughput and latency are compared with.
//!
//! Prints `listening ADDR` as its first line on stdout once it accepts
//! connections, so a script can bind port 0 and read the port. Stops on
//! SIGINT or SIGTERM, or by itself after `--max-seconds`; calls in flight
//! then get up to 5 s to finish.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use quotad::listen::UnixSocket;
use tokio::net::TcpListener;

/// quotad's allocator (its binary's default), so that the floor allocates
/// as quotad does.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long open connections may take to close after the stop.
const DRAIN: Duration = Duration::from_secs(5);

/// A no-op quotad.v1.Quota server: every check is allowed at once.
#[derive(Debug, Parser)]
#[command(name = "noop-server", version)]
struct Cli {
    /// The address to listen on: HOST:PORT (port 0 picks a free port) or
    /// unix:///PATH, a unix socket (mode 0600) as quotad binds its own.
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR", value_parser = parse_addr)]
    addr: Addr,
    /// Stop by itself after this many seconds.
    #[arg(long, default_value_t = 600, value_name = "N",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    max_seconds: u64,
    /// Runtime worker threads [default: one per core, as quotad]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: Option<u16>,
}

/// Where the server listens.
#[derive(Debug, Clone)]
enum Addr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

fn parse_addr(text: &str) -> Result<Addr, String> {
    match text.strip_prefix("unix://") {
        Some("") => Err("a unix address needs a socket path (unix:///path/to.sock)".to_owned()),
        Some(path) => Ok(Addr::Unix(PathBuf::from(path))),
        None => text
            .parse()
            .map(Addr::Tcp)
            .map_err(|e| format!("expected HOST:PORT or unix:///PATH: {e}")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    quotad::init_tool_logs("info");
    match serve(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(cli: &Cli) -> anyhow::Result<()> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = cli.threads {
        builder.worker_threads(usize::from(threads));
    }
    let runtime = builder
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let stop = stop_signal(Duration::from_secs(cli.max_seconds))
            .context("cannot listen for SIGTERM/SIGINT")?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let stopped = async {
            let _ = stop_rx.await;
        };
        let server: Pin<Box<dyn Future<Output = Result<(), quotad::Error>>>> = match &cli.addr {
            Addr::Tcp(addr) => {
                let listener = TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("cannot listen on {addr}"))?;
                let local = listener.local_addr().context("no local address")?;
                announce(&local.to_string()).context("cannot write to stdout")?;
                Box::pin(quotad_bench::serve_noop(listener, stopped))
            }
            Addr::Unix(path) => {
                let socket = UnixSocket::bind(path, 0o600)
                    .with_context(|| format!("cannot listen on {}", path.display()))?;
                announce(&format!("unix://{}", path.display()))
                    .context("cannot write to stdout")?;
                Box::pin(quotad_bench::serve_noop_unix(socket, stopped))
            }
        };
        let mut server = server;
        let reason = tokio::select! {
            result = &mut server => return result.context("the server failed"),
            reason = stop => reason,
        };
        tracing::info!(reason, "stopping");
        let _ = stop_tx.send(());
        match tokio::time::timeout(DRAIN, server).await {
            Ok(result) => result.context("the server failed while stopping"),
            Err(_) => {
                tracing::warn!(drain = ?DRAIN, "connections still open; exiting anyway");
                Ok(())
            }
        }
    })
}

/// The first line on stdout, which scripts wait for.
#[allow(clippy::print_stdout)]
fn announce(addr: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening {addr}")?;
    out.flush()
}

/// Resolves with its reason on SIGTERM, SIGINT or after `max`.
fn stop_signal(max: Duration) -> std::io::Result<impl Future<Output = &'static str>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = terminate.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
                () = tokio::time::sleep(max) => "max-seconds",
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => "Ctrl-C",
                () = tokio::time::sleep(max) => "max-seconds",
            }
        })
    }
}
