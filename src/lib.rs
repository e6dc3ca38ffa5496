//! quotad: a gRPC state owner for rate limits and quotas.
//!
//! Application replicas call `Check(key, cost, policy)`; because they all
//! ask the same quotad, one budget holds across all of them. This crate is
//! the server: the binary (`src/main.rs`) only parses the command line,
//! builds a [`Config`], binds the [`Listeners`] and calls [`run`].
//!
//! Data flows one way: request -> `api` (validate, convert) -> [`policy`]
//! lookup -> [`backend`] transition -> decision -> response and metrics.
//!
//! - [`config`]: the TOML file, flags and environment, validated into a
//!   [`Config`] before anything is bound;
//! - [`policy`]: named policies, their registry and hot reload;
//! - `api`: the gRPC edges (`quotad.v1.Quota`): proto -> domain at the
//!   edge, one error mapping;
//! - `methods`: every gRPC method declared once (its service, path,
//!   `[auth]` group and metric label), from which routes, authorization,
//!   metrics and health follow; `services` builds each service from one
//!   context and registers its routes;
//! - [`backend`]: the one [`backend::Backend`] trait, memory and Redis;
//! - [`grpc`], `admin`: the two servers (gRPC with health checking and
//!   reflection; admin HTTP with `/metrics`, `/healthz`, `/readyz`,
//!   `/policies`), `health` the readiness both report, `tasks` what runs
//!   beside them, `metrics` the Prometheus registry.
//!
//! ```
//! use quotad_proto::v1::{CheckRequest, check_request, quota_client::QuotaClient};
//! use tokio::net::TcpListener;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = quotad::Config::from_toml(r#"
//!     [policies.login]
//!     algorithm = "fixed_window"
//!     limit = 5
//!     window = "1m"
//! "#)?;
//! let grpc = TcpListener::bind("127.0.0.1:0").await?;
//! let addr = grpc.local_addr()?;
//! let listeners = quotad::Listeners {
//!     grpc: grpc.into(),
//!     admin: TcpListener::bind("127.0.0.1:0").await?,
//! };
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let server = tokio::spawn(quotad::run(config, listeners, async {
//!     let _ = stopped.await;
//! }));
//!
//! let mut client = QuotaClient::connect(format!("http://{addr}")).await?;
//! let request = CheckRequest {
//!     key: "alice".to_owned(),
//!     cost: None,
//!     policy: Some(check_request::Policy::PolicyName("login".to_owned())),
//! };
//! let decision = client.check(request).await?.into_inner().decision.ok_or("no decision")?;
//! assert!(decision.allowed);
//! assert_eq!(decision.remaining, 4);
//!
//! let _ = stop.send(());
//! server.await??;
//! # Ok(())
//! # }
//! ```

pub mod backend;
pub mod config;
pub mod grpc;
pub mod policy;
pub mod trace;

pub mod listen;

mod admin;
mod api;
mod auth;
mod health;
mod log;
mod methods;
mod metrics;
mod registry;
mod services;
mod tasks;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::BuildError;
use tokio::net::TcpListener;
use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;

pub use config::{
    Config, ConfigError, FlagValues, ListenAddr, OnError, PolicySettings, TransportSettings,
};
pub use listen::GrpcListener;
pub use log::{Causes, WithTraceId, init_tool_logs};
#[doc(hidden)]
pub use registry::overrides::PrefixLookup;
pub use services::RegisterError;

use crate::admin::AdminState;
use crate::backend::fallback::{self, Fallback};
use crate::backend::memory::snapshot;
use crate::backend::redis::RedisBackend;
use crate::backend::traced::Traced;
use crate::backend::{Backend, OverridesSync};
use crate::config::BackendSettings;
use crate::health::Health;
use crate::listen::{ConnectionLimit, HTTP2_PREFACE_BYTES};
use crate::methods::Service;
use crate::metrics::Metrics;
use crate::registry::{PolicyRegistry, PolicySet, Reloader};
use crate::services::ServiceContext;
use crate::tasks::{ServerFailed, ServerTask, Tasks};

/// The bound sockets the server accepts on. `main` binds them from the
/// config; tests bind `127.0.0.1:0` (`TcpListener::bind(..).await?.into()`)
/// or a [`listen::UnixSocket`] in a temporary folder.
#[derive(Debug)]
pub struct Listeners {
    /// The gRPC port (the `quotad.v1.Quota` API, health, reflection): TCP
    /// or a unix socket.
    pub grpc: GrpcListener,
    /// The admin HTTP port (metrics, health and readiness, policies).
    pub admin: TcpListener,
}

impl Listeners {
    /// Binds `server.grpc_addr` (a unix socket with
    /// `server.unix_socket_mode`) and `server.admin_addr`.
    ///
    /// # Errors
    ///
    /// The I/O error of the address that could not be bound, naming it.
    pub async fn bind(config: &Config) -> std::io::Result<Listeners> {
        let bind = |what: &'static str, addr: std::net::SocketAddr| async move {
            TcpListener::bind(addr).await.map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot bind the {what} address {addr}: {e}"),
                )
            })
        };
        let server = config.server();
        let grpc = match &server.grpc_addr {
            ListenAddr::Tcp(addr) => bind("gRPC", *addr).await?.into(),
            ListenAddr::Unix(path) => {
                listen::UnixSocket::bind(path, server.unix_socket_mode)?.into()
            }
        };
        Ok(Listeners {
            grpc,
            admin: bind("admin", server.admin_addr).await?,
        })
    }

    /// Two fresh ports on 127.0.0.1, for tests and embedding.
    ///
    /// # Errors
    ///
    /// The I/O error of a port that could not be bound.
    pub async fn loopback() -> std::io::Result<Listeners> {
        Ok(Listeners {
            grpc: TcpListener::bind("127.0.0.1:0").await?.into(),
            admin: TcpListener::bind("127.0.0.1:0").await?,
        })
    }
}

/// Why the server stopped other than by a requested shutdown.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The metrics registry could not be built.
    #[error("metrics")]
    Metrics(#[from] BuildError),
    /// The gRPC server could not be built (its TLS files, its reflection
    /// service).
    #[error(transparent)]
    Build(#[from] grpc::BuildError),
    /// A service could not be built (the RLS rules could not be loaded).
    #[error(transparent)]
    Service(#[from] services::RegisterError),
    /// The gRPC server failed while serving.
    #[error("gRPC server")]
    Grpc(#[source] tonic::transport::Error),
    /// A server task panicked or was cancelled.
    #[error("server task")]
    Task(#[source] JoinError),
    /// The state store could not be reached at start (Redis at `at`,
    /// passwords left out).
    #[error("cannot start on {at}")]
    Store {
        at: String,
        #[source]
        source: backend::BackendError,
    },
    /// The memory store's snapshot could not be read, and
    /// `store.snapshot.on_bad_file` says to refuse to start.
    #[error(transparent)]
    Snapshot(#[from] snapshot::LoadError),
    /// The memory store's snapshot could not be written: at start (quotad
    /// then does not serve), or the last one on shutdown.
    #[error(transparent)]
    SnapshotWrite(#[from] snapshot::WriteError),
}

impl From<backend::memory::StartError> for Error {
    fn from(error: backend::memory::StartError) -> Self {
        match error {
            backend::memory::StartError::Load(error) => Error::Snapshot(error),
            backend::memory::StartError::Write(error) => Error::SnapshotWrite(error),
        }
    }
}

impl From<ServerFailed<tonic::transport::Error>> for Error {
    fn from(failed: ServerFailed<tonic::transport::Error>) -> Self {
        match failed {
            ServerFailed::Serve(error) => Error::Grpc(error),
            ServerFailed::Task(error) => Error::Task(error),
        }
    }
}

impl From<ServerFailed<Infallible>> for Error {
    fn from(failed: ServerFailed<Infallible>) -> Self {
        match failed {
            ServerFailed::Serve(never) => match never {},
            ServerFailed::Task(error) => Error::Task(error),
        }
    }
}

/// Installs ring as the process-wide rustls crypto provider, unless one is
/// installed already. The gRPC server's TLS takes the process-wide
/// provider, and rustls cannot choose one by itself once two are compiled
/// in; [`run`] calls this before it builds anything.
pub fn install_crypto_provider() {
    // An error means a provider is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Serves the gRPC API and the admin HTTP server on `listeners` until
/// `shutdown` resolves, then shuts down gracefully.
///
/// On shutdown, `/readyz` turns 503 and gRPC health reports NOT_SERVING;
/// the server keeps serving for `server.shutdown_delay` (0 by default), so
/// load balancers stop sending first; then the gRPC server stops accepting
/// and lets calls in flight finish (with no deadline of its own), then the
/// admin server stops the same way, and `run` returns `Ok(())` once every
/// connection has closed.
///
/// # Errors
///
/// [`Error`] when a server cannot start or fails while serving.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    install_crypto_provider();
    let metrics = Arc::new(Metrics::new()?);
    let mut tasks = Tasks::default();
    let registry = policies(&config, &metrics, &mut tasks);
    // The memory store's last snapshot, written once everything else stopped.
    let mut last_snapshot = None;
    let result = match &config.store().backend {
        BackendSettings::Memory(settings) => {
            let store =
                backend::memory::start(settings, &config, &registry, &metrics, &mut tasks).await?;
            last_snapshot = settings
                .snapshot
                .as_ref()
                .map(|snapshot| (Arc::clone(&store), snapshot.path.clone()));
            let store = Arc::new(Traced::new(Arc::clone(&store), None));
            let cx = ServiceContext::new(&config, store, &registry, &metrics, &mut tasks);
            serve(cx, listeners, shutdown).await
        }
        BackendSettings::Redis(settings) => {
            let redis = RedisBackend::connect(settings)
                .await
                .map_err(|source| Error::Store {
                    at: settings.target.to_string(),
                    source,
                })?;
            let store = Arc::new(Fallback::new(
                redis,
                &config.store().fallback,
                Arc::clone(config.clock()),
                fallback::local_policies(&registry, config.store().on_error),
            ));
            let local = Arc::clone(store.local());
            tasks.spawn(move |stop| backend::memory::sweep(local, fallback::SWEEP_INTERVAL, stop));
            // Every replica on this Redis applies the same overrides.
            let mut sync =
                OverridesSync::new(Arc::clone(&store), Arc::clone(&registry), settings.timeout);
            sync.read().await;
            let interval = settings.overrides_poll_interval;
            tasks.spawn(move |stop| sync.run(interval, stop));
            let store = Arc::new(Traced::new(store, redis_node(&settings.target)));
            let cx = ServiceContext::new(&config, store, &registry, &metrics, &mut tasks);
            serve(cx, listeners, shutdown).await
        }
    };
    tasks.stop().await;
    if let Some((store, path)) = last_snapshot {
        let written =
            snapshot::write_now(&store, &path, &registry, &metrics, snapshot::When::Shutdown).await;
        return result.and(written.map_err(Error::SnapshotWrite));
    }
    result
}

/// Runs both servers over the context's backend until `shutdown`, or until
/// one of them fails (which brings the other down too).
async fn serve<B: Backend>(
    mut cx: ServiceContext<'_, B>,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Error> {
    let upkeep = Arc::clone(&cx.metrics);
    cx.tasks.spawn(|stop| metrics_upkeep(upkeep, stop));

    let (health, health_service) = Health::new(&Service::NAMES);
    for service in Service::ALL {
        cx.register(service)?;
    }
    let ServiceContext {
        config,
        backend,
        registry,
        metrics,
        tasks,
        routes,
    } = cx;
    let probed = Arc::clone(&backend);
    let transport = config.transport();
    let routes = routes.routes();
    let grpc_addr = listeners.grpc.describe();
    let admin_addr = display_addr(listeners.admin.local_addr());
    let limit = |max, port| {
        ConnectionLimit::new(max, port)
            .counting(metrics.connections_rejected(port))
            .silent_for(transport.handshake_timeout)
    };
    let (grpc_limit, admin_limit) = (
        limit(transport.max_connections, "grpc").until_bytes(HTTP2_PREFACE_BYTES),
        limit(
            transport.max_connections.min(listen::ADMIN_MAX_CONNECTIONS),
            "admin",
        ),
    );
    let mut grpc = grpc::spawn(
        listeners.grpc,
        transport,
        grpc_limit.clone(),
        config.server().tls.as_ref(),
        tower_layer::Stack::new(
            auth::layer(config.auth(), &metrics),
            grpc::shed::ShedLayer::new(transport.max_in_flight, metrics.calls_shed()),
        ),
        health_service,
        routes,
    )?;
    let mut admin = admin::spawn(
        listeners.admin,
        AdminState {
            metrics: Arc::clone(&metrics),
            policies: registry,
            health: health.clone(),
            backend_stats: Arc::new(move || backend.stats()),
        },
        transport.admin_header_timeout,
        admin_limit.clone(),
    );
    health.set_serving(true).await;
    if config.server().readiness_follows_store {
        let (probed, ready) = (Arc::clone(&probed), health.clone());
        tasks.spawn(|stop| health::follow_store(probed, ready, STORE_PROBE_INTERVAL, stop));
    }
    tracing::info!(
        %grpc_addr,
        %admin_addr,
        store = config.store().backend.name(),
        policies = config.policies().len(),
        // The IANA release calendar quotas decide by (compiled in).
        tzdb = quotad_core::tzdb_version(),
        "quotad serving"
    );

    let mut ended = tokio::select! {
        () = shutdown => false,
        () = grpc.stopped() => true,
        () = admin.stopped() => true,
    };
    health.set_serving(false).await;
    let delay = config.server().shutdown_delay;
    if !ended && !delay.is_zero() {
        // Not ready, still serving: load balancers see it and stop sending
        // before the listener closes.
        tracing::info!(
            ?delay,
            "shutting down: not ready, serving for server.shutdown_delay"
        );
        ended = tokio::select! {
            () = tokio::time::sleep(delay) => false,
            () = grpc.stopped() => true,
            () = admin.stopped() => true,
        };
    }
    if !ended {
        tracing::info!("shutting down: draining calls in flight");
    }
    // gRPC stops first; the admin server stays up while calls drain, so
    // /readyz reports 503 and /metrics can still be scraped meanwhile. Each
    // drain is bounded: streams such as gRPC health's Watch never end.
    let drain = transport.drain_timeout;
    let grpc_result = stop(grpc, &grpc_limit, drain, "grpc").await;
    let admin_result = stop(admin, &admin_limit, drain, "admin").await;
    tracing::info!("quotad stopped");
    grpc_result.and(admin_result)
}

/// Stops `server` within `drain` ([`ServerTask::stop`]), then ends the
/// connections it admitted that are still open (each runs in a task of its
/// own, which stopping the server does not end) and waits for them to
/// close, so that `run` returns with no connection left.
async fn stop<E: Send + 'static>(
    server: ServerTask<E>,
    limit: &ConnectionLimit,
    drain: Duration,
    what: &'static str,
) -> Result<(), Error>
where
    Error: From<ServerFailed<E>>,
{
    let result = server.stop(drain, what).await.map_err(Error::from);
    limit.close_all();
    if !limit.all_closed(CONNECTIONS_CLOSE_WITHIN).await {
        tracing::warn!(
            server = what,
            "connections still open after they were closed"
        );
    }
    result
}

/// How long connections ended at shutdown have to close.
const CONNECTIONS_CLOSE_WITHIN: Duration = Duration::from_secs(1);

/// How often the store is probed when readiness follows it.
const STORE_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The named policies in force, and the task that reloads them when the
/// config file changes.
fn policies(config: &Config, metrics: &Arc<Metrics>, tasks: &mut Tasks) -> Arc<PolicyRegistry> {
    let set = PolicySet::new(config.policies(), config.limits(), metrics);
    let registry = Arc::new(PolicyRegistry::with_clock(
        PolicySet::new(config.policies(), config.limits(), metrics),
        Arc::clone(config.clock()),
    ));
    registry.replace_with_file(set, config.overrides());
    if let Some(reloader) = Reloader::new(config, Arc::clone(&registry), Arc::clone(metrics)) {
        let poll = config.server().config_poll_interval;
        tasks.spawn(|stop| reloader.run(poll, stop));
    }
    registry
}

/// The address of a standalone Redis, which serves every key (`host:port`),
/// for the store-call spans; `None` for a Cluster or a Sentinel-found
/// master, whose node varies.
fn redis_node(target: &config::redis::RedisTarget) -> Option<String> {
    let config::redis::RedisTarget::Standalone(url) = target else {
        return None;
    };
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?;
    Some(match uri.port_u16() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

fn display_addr(addr: std::io::Result<std::net::SocketAddr>) -> String {
    addr.map_or_else(|e| format!("unknown ({e})"), |a| a.to_string())
}

/// Publishes histogram samples regularly, so they do not pile up between
/// scrapes.
async fn metrics_upkeep(metrics: Arc<Metrics>, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => metrics.run_upkeep(),
        }
    }
}
