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
//! let listeners = quotad::Listeners {
//!     grpc: TcpListener::bind("127.0.0.1:0").await?,
//!     admin: TcpListener::bind("127.0.0.1:0").await?,
//! };
//! let addr = listeners.grpc.local_addr()?;
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

mod admin;
mod api;
mod health;
mod metrics;
mod tasks;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::BuildError;
use quotad_core::MemoryStore;
use quotad_proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitServiceServer, SERVICE_NAME as RLS_SERVICE,
};
use quotad_proto::v1::quota_server::{QuotaServer, SERVICE_NAME as QUOTA_SERVICE};
use tokio::net::TcpListener;
use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;
use tonic::service::Routes;

pub use config::{Config, ConfigError, OnError, Overrides, PolicySettings};

use crate::admin::AdminState;
use crate::api::{QuotaService, RequestLimits, RlsOptions, RlsService};
use crate::backend::Backend;
use crate::backend::redis::RedisBackend;
use crate::config::BackendSettings;
use crate::health::Health;
use crate::metrics::Metrics;
use crate::policy::{PolicyRegistry, PolicySet, Reloader};
use crate::tasks::Tasks;

/// The bound sockets the server accepts on. `main` binds them from the
/// config; tests bind `127.0.0.1:0`.
#[derive(Debug)]
pub struct Listeners {
    /// The gRPC port (the `quotad.v1.Quota` API, health, reflection).
    pub grpc: TcpListener,
    /// The admin HTTP port (metrics, health and readiness, policies).
    pub admin: TcpListener,
}

impl Listeners {
    /// Binds `server.grpc_addr` and `server.admin_addr`.
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
        Ok(Listeners {
            grpc: bind("gRPC", config.server().grpc_addr).await?,
            admin: bind("admin", config.server().admin_addr).await?,
        })
    }
}

/// Why the server stopped other than by a requested shutdown.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The metrics registry could not be built.
    #[error("metrics: {0}")]
    Metrics(#[from] BuildError),
    /// The reflection service could not be built.
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The gRPC server failed (including a TLS configuration it rejected).
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The TLS files could not be read at start.
    #[error("TLS: {0}")]
    Tls(String),
    /// The admin HTTP server failed.
    #[error("admin server: {0}")]
    Admin(#[source] std::io::Error),
    /// A server task panicked or was cancelled.
    #[error("server task: {0}")]
    Task(#[from] JoinError),
    /// The state store could not be reached at start (Redis).
    #[error("{0}")]
    Store(#[source] backend::BackendError),
    /// The RLS rules could not be loaded at start.
    #[error("RLS rules: {0}")]
    Rls(#[from] policy::rls::RlsConfigError),
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
/// the gRPC server stops accepting and lets calls in flight finish (with
/// no deadline of its own), then the admin server stops the same way, and
/// `run` returns `Ok(())` once every connection has closed.
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
    let result = match &config.store().backend {
        BackendSettings::Memory(settings) => {
            let store = Arc::new(MemoryStore::new(settings.store, Arc::clone(config.clock())));
            let (swept, interval) = (Arc::clone(&store), settings.sweep_interval);
            tasks.spawn(|stop| backend::memory::sweep(swept, interval, stop));
            serve(&config, listeners, shutdown, store, metrics, &mut tasks).await
        }
        BackendSettings::Redis(settings) => match RedisBackend::connect(settings).await {
            Ok(store) => {
                let store = Arc::new(store);
                serve(&config, listeners, shutdown, store, metrics, &mut tasks).await
            }
            Err(error) => Err(Error::Store(error)),
        },
    };
    tasks.stop().await;
    result
}

/// Runs both servers over `backend` until `shutdown`, or until one of them
/// fails (which brings the other down too).
async fn serve<B: Backend>(
    config: &Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
    backend: Arc<B>,
    metrics: Arc<Metrics>,
    tasks: &mut Tasks,
) -> Result<(), Error> {
    let registry = policies(config, &metrics, tasks);
    let upkeep = Arc::clone(&metrics);
    tasks.spawn(|stop| metrics_upkeep(upkeep, stop));

    let (health, health_service) = Health::new(&[QUOTA_SERVICE, RLS_SERVICE]);
    let quota = QuotaService::new(
        Arc::clone(&backend),
        Arc::clone(&registry),
        Arc::clone(&metrics),
        RequestLimits {
            max_key_bytes: config.store().max_key_bytes,
            on_error: config.store().on_error,
        },
    );
    let rls = RlsService::new(
        Arc::clone(&backend),
        policy::rls::start(config, &metrics, tasks)?,
        Arc::clone(&metrics),
        RlsOptions::new(config),
    );
    let routes = Routes::new(QuotaServer::new(quota)).add_service(RateLimitServiceServer::new(rls));
    let grpc_addr = display_addr(listeners.grpc.local_addr());
    let admin_addr = display_addr(listeners.admin.local_addr());
    let mut grpc = grpc::spawn(
        listeners.grpc,
        config.server().tls.as_ref(),
        health_service,
        routes,
    )?;
    let mut admin = admin::spawn(
        listeners.admin,
        AdminState {
            metrics,
            policies: registry,
            health: health.clone(),
            backend_stats: Arc::new(move || backend.stats()),
        },
    );
    health.set_ready(true).await;
    tracing::info!(%grpc_addr, %admin_addr, "quotad serving");

    let failed = tokio::select! {
        () = shutdown => {
            tracing::info!("shutting down: draining calls in flight");
            None
        }
        result = grpc.stopped() => Some(result),
        result = admin.stopped() => Some(result),
    };
    health.set_ready(false).await;
    // gRPC stops first; the admin server stays up while calls drain, so
    // /readyz reports 503 and /metrics can still be scraped meanwhile.
    let grpc_result = grpc.stop().await;
    let admin_result = admin.stop().await;
    tracing::info!("quotad stopped");
    failed.unwrap_or(Ok(())).and(grpc_result).and(admin_result)
}

/// The named policies in force, and the task that reloads them when the
/// config file changes.
fn policies(config: &Config, metrics: &Arc<Metrics>, tasks: &mut Tasks) -> Arc<PolicyRegistry> {
    let registry = Arc::new(PolicyRegistry::new(PolicySet::new(
        config.policies(),
        config.limits(),
        metrics,
    )));
    if let Some(reloader) = Reloader::new(config, Arc::clone(&registry), Arc::clone(metrics)) {
        let poll = config.server().config_poll_interval;
        tasks.spawn(|stop| reloader.run(poll, stop));
    }
    registry
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
