//! The admin HTTP server: `/metrics`, `/healthz`, `/readyz`, `/policies`.
//!
//! - `/metrics`: the Prometheus text exposition; store counts (live keys,
//!   evictions, reclaimed keys) are read at scrape time.
//! - `/healthz`: 200 while the process runs (liveness).
//! - `/readyz`: 200 while the gRPC server accepts calls, 503 once shutdown
//!   has begun (readiness).
//! - `/policies`: the named policies in force, as JSON:
//!   `{"policies": {"login": {"algorithm": "fixed_window", "limit": 5,
//!   "window_ms": 60000, "burst": null, "on_error": "error"}}}` (`burst` is
//!   set for the bucket algorithms only); a policy with lease settings also
//!   has `"lease": {"max_units": 100, "min_units": 10, "max_ttl_ms": 10000}`.
//!
//! HTTP/1.1 only (Prometheus and the kubelet speak it). A client has
//! `transport.admin_header_timeout` to send a request's headers, and the
//! port holds at most `transport.max_connections` connections: a client
//! that sends half a request, or opens connections and sends nothing,
//! cannot hold the port.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::backend::BackendStats;
use crate::health::Health;
use crate::listen::ConnectionLimit;
use crate::metrics::Metrics;
use crate::registry::PolicyRegistry;
use crate::tasks::ServerTask;

/// What the admin handlers read.
#[derive(Clone)]
pub(crate) struct AdminState {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) policies: Arc<PolicyRegistry>,
    pub(crate) health: Health,
    pub(crate) backend_stats: Arc<dyn Fn() -> BackendStats + Send + Sync>,
}

impl std::fmt::Debug for AdminState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminState")
            .field("health", &self.health)
            .finish_non_exhaustive()
    }
}

/// Serves the admin routes on `listener` until stopped, then lets requests
/// in flight finish. Each connection has `header_timeout` to send each
/// request's headers; at most `limit` are open at once.
pub(crate) fn spawn(
    listener: TcpListener,
    state: AdminState,
    header_timeout: Duration,
    limit: ConnectionLimit,
) -> ServerTask<Infallible> {
    ServerTask::spawn(move |stop| serve(listener, router(state), header_timeout, limit, stop))
}

async fn serve(
    listener: TcpListener,
    router: Router,
    header_timeout: Duration,
    limit: ConnectionLimit,
    stop: CancellationToken,
) -> Result<(), Infallible> {
    let mut http = hyper::server::conn::http1::Builder::new();
    // hyper enforces the header read timeout only with a timer.
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, _) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // A connection that failed before it was accepted (reset,
                // or out of file descriptors): keep serving the others.
                Err(error) => {
                    tracing::debug!(%error, "admin port: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let Some(permit) = limit.admit() else {
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "admin connection ended with an error");
            }
            drop(permit);
        });
    }
    // Stop accepting (the listener closes), then let requests in flight
    // finish; idle keep-alive connections close at once.
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The admin routes.
fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/policies", get(policies))
        .with_state(state)
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    state.metrics.store_stats((state.backend_stats)());
    crate::registry::overrides::export(&state.policies, &state.metrics);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if state.health.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

#[derive(Serialize)]
struct PoliciesBody<'a> {
    policies: BTreeMap<&'a str, PolicyBody>,
}

#[derive(Serialize)]
struct PolicyBody {
    algorithm: &'static str,
    limit: u64,
    window_ms: u64,
    burst: Option<u64>,
    on_error: &'static str,
    /// A calendar quota's period (`day@America/New_York`,
    /// `week:sunday@UTC`); left out for the others.
    #[serde(skip_serializing_if = "Option::is_none")]
    period: Option<String>,
    // Left out, not null, for a policy without leases: most policies have
    // none, and their bodies stay as short as they were.
    #[serde(skip_serializing_if = "Option::is_none")]
    lease: Option<LeaseBody>,
}

#[derive(Serialize)]
struct LeaseBody {
    max_units: u64,
    min_units: u64,
    max_ttl_ms: u64,
}

async fn policies(State(state): State<AdminState>) -> impl IntoResponse {
    let set = state.policies.snapshot();
    let policies = set
        .sorted()
        .into_iter()
        .map(|(name, settings)| {
            let p = settings.policy;
            let body = PolicyBody {
                algorithm: p.algorithm().as_str(),
                limit: p.limit(),
                window_ms: p.window_ms(),
                burst: p.algorithm().is_bucket().then_some(p.burst()),
                on_error: settings.on_error.as_str(),
                period: p.calendar_period().map(|c| c.spec()),
                lease: settings.lease.map(|terms| LeaseBody {
                    max_units: terms.max_units(),
                    min_units: terms.min_units(),
                    max_ttl_ms: terms.max_ttl_ms(),
                }),
            };
            (name, body)
        })
        .collect();
    axum::Json(PoliciesBody { policies }).into_response()
}
