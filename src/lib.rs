//! quotad: a gRPC state owner for rate limits and quotas.
//!
//! Application replicas call `Check(key, cost, policy)`; because they all
//! ask the same quotad, one budget holds across all of them. This crate is
//! the server: the binary (`src/main.rs`) only parses the command line,
//! builds a [`Config`], binds the [`Listeners`] and calls [`run`].
//!
//! - [`config`]: the TOML file, flags and environment, validated into a
//!   [`Config`] before anything is bound;
//! - [`policy`]: named policies, their registry and hot reload;
//! - `service`: the `quotad.v1.Quota` handlers (proto -> domain at the edge,
//!   one error mapping);
//! - [`store`]: the [`store::StateStore`] trait and its in-memory backend;
//! - `metrics`, `admin`: Prometheus metrics and the admin HTTP server
//!   (`/metrics`, `/healthz`, `/readyz`, `/policies`).
//!
//! The gRPC port also serves health checking (`grpc.health.v1`) and server
//! reflection (v1 and v1alpha).
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
pub mod policy;

mod admin;
mod api;
mod metrics;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::BuildError;
use quotad_proto::v1::quota_server::QuotaServer;

use tokio::net::TcpListener;
use tokio::task::{JoinError, JoinSet};
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

pub use config::{Config, ConfigError, OnError, Overrides, PolicySettings};

use crate::admin::AdminState;
use crate::api::{QuotaService, RequestLimits};
use crate::backend::redis::RedisBackend;
use crate::config::BackendSettings;
use crate::metrics::Metrics;
use crate::policy::{PolicyRegistry, PolicySet, Reloader};
use quotad_core::MemoryStore;

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
    /// The admin HTTP server failed.
    #[error("admin server: {0}")]
    Admin(#[source] std::io::Error),
    /// A server task panicked or was cancelled.
    #[error("server task: {0}")]
    Task(#[from] JoinError),
    /// The TLS files could not be read or used at start.
    #[error("TLS: {0}")]
    Tls(String),
    /// The state store could not be reached at start (Redis).
    #[error("{0}")]
    Store(#[source] backend::BackendError),
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
    let metrics = Arc::new(Metrics::new()?);
    let mut background = Background::default();
    let result = match &config.store().backend {
        BackendSettings::Memory(settings) => {
            let store = Arc::new(MemoryStore::new(settings.store, Arc::clone(config.clock())));
            let sweep_interval = settings.sweep_interval;
            let swept = Arc::clone(&store);
            background.spawn(|stop| backend::memory::sweep(swept, sweep_interval, stop));
            serve(config, listeners, shutdown, store, metrics, &mut background).await
        }
        BackendSettings::Redis(settings) => {
            let store = RedisBackend::connect(settings)
                .await
                .map_err(Error::Store)?;
            serve(
                config,
                listeners,
                shutdown,
                Arc::new(store),
                metrics,
                &mut background,
            )
            .await
        }
    };
    background.stop().await;
    result
}

/// Runs both servers over `store` until `shutdown`.
async fn serve<S: backend::Backend>(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
    store: Arc<S>,
    metrics: Arc<Metrics>,
    background: &mut Background,
) -> Result<(), Error> {
    let registry = Arc::new(PolicyRegistry::new(PolicySet::new(
        config.policies(),
        config.limits(),
        &metrics,
    )));
    if let Some(reloader) = Reloader::new(&config, Arc::clone(&registry), Arc::clone(&metrics)) {
        let poll = config.server().config_poll_interval;
        background.spawn(|stop| reloader.run(poll, stop));
    }
    let upkeep_metrics = Arc::clone(&metrics);
    background.spawn(|stop| metrics_upkeep(upkeep_metrics, stop));

    let service = QuotaService::new(
        Arc::clone(&store),
        Arc::clone(&registry),
        Arc::clone(&metrics),
        RequestLimits {
            max_key_bytes: config.store().max_key_bytes,
            on_error: config.store().on_error,
        },
    );
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<QuotaServer<QuotaService<S>>>().await;
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(quotad_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    // v1alpha too: older grpcurl and other tools still ask for it.
    let (reflection_v1, reflection_v1alpha) =
        (reflection().build_v1()?, reflection().build_v1alpha()?);

    let mut builder = Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)));
    if let Some(tls) = &config.server().tls {
        let tls = tls
            .server_config()
            .map_err(|e| Error::Tls(format!("server.tls.{}: {}", e.field, e.message)))?;
        builder = builder.tls_config(tls)?;
    }
    // TcpIncoming sets TCP_NODELAY on each accepted socket; the builder's
    // own tcp_nodelay is ignored for a pre-bound listener.
    let incoming = TcpIncoming::from(listeners.grpc)
        .with_nodelay(Some(true))
        .with_keepalive(Some(Duration::from_secs(60)));
    let grpc_addr = display_addr(incoming.local_addr());
    let admin_addr = display_addr(listeners.admin.local_addr());

    // gRPC stops first; the admin server stays up while calls drain, so
    // /readyz reports 503 and /metrics can still be scraped meanwhile.
    let (stop_grpc, stop_admin) = (CancellationToken::new(), CancellationToken::new());
    let grpc = builder
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(QuotaServer::new(service))
        .serve_with_incoming_shutdown(incoming, stop_grpc.clone().cancelled_owned());
    let mut grpc = tokio::spawn(async move { grpc.await.map_err(Error::Grpc) });

    let ready = Arc::new(AtomicBool::new(true));
    let admin_state = AdminState {
        metrics: Arc::clone(&metrics),
        policies: Arc::clone(&registry),
        ready: Arc::clone(&ready),
        store_stats: Arc::new(move || store.stats()),
    };
    let admin = axum::serve(listeners.admin, admin::router(admin_state))
        .with_graceful_shutdown(stop_admin.clone().cancelled_owned());
    let mut admin = tokio::spawn(async move { admin.await.map_err(Error::Admin) });
    tracing::info!(%grpc_addr, %admin_addr, "quotad serving");

    // Serve until asked to stop, or until a server stops by itself (an
    // error), which brings the other one down too.
    let (mut grpc_result, mut admin_result) = (None, None);
    tokio::select! {
        () = shutdown => tracing::info!("shutting down: draining calls in flight"),
        result = &mut grpc => grpc_result = Some(flatten(result)),
        result = &mut admin => admin_result = Some(flatten(result)),
    }
    ready.store(false, Ordering::Release);
    health
        .set_not_serving::<QuotaServer<QuotaService<S>>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    stop_grpc.cancel();
    let grpc_result = match grpc_result {
        Some(result) => result,
        None => flatten(grpc.await),
    };
    stop_admin.cancel();
    let admin_result = match admin_result {
        Some(result) => result,
        None => flatten(admin.await),
    };
    tracing::info!("quotad stopped");
    grpc_result.and(admin_result)
}

fn display_addr(addr: std::io::Result<std::net::SocketAddr>) -> String {
    addr.map_or_else(|e| format!("unknown ({e})"), |a| a.to_string())
}

fn flatten(result: Result<Result<(), Error>, JoinError>) -> Result<(), Error> {
    result.map_err(Error::Task).and_then(|inner| inner)
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

/// Background tasks (sweep, reload, metrics upkeep), stopped together
/// after the servers.
#[derive(Debug, Default)]
struct Background {
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl Background {
    fn spawn<F, Fut>(&mut self, task: F)
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.tasks.spawn(task(self.stop.clone()));
    }

    async fn stop(mut self) {
        self.stop.cancel();
        while let Some(result) = self.tasks.join_next().await {
            if let Err(error) = result {
                tracing::error!(%error, "background task failed");
            }
        }
    }
}
