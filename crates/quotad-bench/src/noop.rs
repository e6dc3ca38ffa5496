//! The no-op server: quotad's API with nothing behind it.

use std::time::Duration;

use quotad_proto::v1::quota_server::{Quota, QuotaServer};
use quotad_proto::v1::{
    CheckBatchRequest, CheckBatchResponse, CheckRequest, CheckResponse, Decision, Reason,
    ResetRequest, ResetResponse,
};
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// The one decision the no-op server gives: allowed, within a limit that
/// no benchmark reaches.
const ALLOWED: Decision = Decision {
    allowed: true,
    limit: 1_000_000,
    remaining: 999_999,
    retry_after_ms: 0,
    reset_after_ms: 0,
    reason: Reason::WithinLimit as i32,
};

/// A `quotad.v1.Quota` service that answers every call at once with a fixed
/// allowed decision (one per item for `CheckBatch`), and validates nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopQuota;

#[tonic::async_trait]
impl Quota for NoopQuota {
    async fn check(
        &self,
        _request: Request<CheckRequest>,
    ) -> Result<Response<CheckResponse>, Status> {
        Ok(Response::new(CheckResponse {
            decision: Some(ALLOWED),
        }))
    }

    async fn check_batch(
        &self,
        request: Request<CheckBatchRequest>,
    ) -> Result<Response<CheckBatchResponse>, Status> {
        let items = request.get_ref().items.len();
        Ok(Response::new(CheckBatchResponse {
            decisions: vec![ALLOWED; items],
        }))
    }

    async fn peek(
        &self,
        _request: Request<CheckRequest>,
    ) -> Result<Response<CheckResponse>, Status> {
        Ok(Response::new(CheckResponse {
            decision: Some(ALLOWED),
        }))
    }

    async fn reset(
        &self,
        _request: Request<ResetRequest>,
    ) -> Result<Response<ResetResponse>, Status> {
        Ok(Response::new(ResetResponse {}))
    }
}

/// Serves [`NoopQuota`] on `listener` until `shutdown` resolves, then
/// finishes the calls in flight and returns once every connection has
/// closed.
///
/// The server settings are quotad's own (`src/lib.rs`): TCP_NODELAY and TCP
/// keepalive on every accepted socket through tonic's `TcpIncoming` (the
/// builder's `tcp_nodelay` is ignored for a pre-bound listener), HTTP/2
/// keepalive pings, and tonic's default HTTP/2 windows and stream limits.
/// Keep the two in step, or the floor stops being a floor.
///
/// # Errors
///
/// The transport error that stopped the server.
pub async fn serve_noop(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let incoming = TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(Duration::from_secs(60)));
    Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(QuotaServer::new(NoopQuota))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
