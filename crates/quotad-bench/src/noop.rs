//! The no-op server: quotad's API with nothing behind it.

use quotad_proto::v1::quota_server::{Quota, QuotaServer};
use quotad_proto::v1::{
    CheckBatchRequest, CheckBatchResponse, CheckRequest, CheckResponse, Decision, Reason,
    ResetRequest, ResetResponse,
};
use tokio::net::TcpListener;
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
/// The transport is quotad's own ([`quotad::grpc::server`] and
/// [`quotad::grpc::incoming`]), plaintext, so the floor moves with quotad's
/// settings.
///
/// # Errors
///
/// The error that stopped the server.
pub async fn serve_noop(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), quotad::Error> {
    let transport = quotad::TransportSettings::default();
    quotad::grpc::server(&transport, None)?
        .add_service(
            QuotaServer::new(NoopQuota).max_decoding_message_size(transport.max_message_bytes),
        )
        .serve_with_incoming_shutdown(quotad::grpc::incoming(listener, &transport), shutdown)
        .await?;
    Ok(())
}
