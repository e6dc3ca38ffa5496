//! The no-op server: quotad's APIs with nothing behind them.

use quotad::grpc::arrival::ArrivalLayer;
use quotad::grpc::status::SizeStatusLayer;
use quotad::listen::{ConnectionLimit, Incoming, UnixIncoming, UnixSocket};
use quotad_proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use quotad_proto::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use quotad_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use quotad_proto::v1::quota_server::{Quota, QuotaServer};
use quotad_proto::v1::{
    CheckBatchRequest, CheckBatchResponse, CheckRequest, CheckResponse, Decision, Reason,
    ResetRequest, ResetResponse,
};
use tokio::net::TcpListener;
use tonic::transport::server::Router;
use tonic::{Request, Response, Status};
use tower_layer::{Identity, Stack};

/// The layers of quotad's server builder ([`quotad::grpc::GrpcServer`]).
type Layers = Stack<SizeStatusLayer, Stack<ArrivalLayer, Identity>>;

/// The one decision the no-op server gives: allowed, within a limit that
/// no benchmark reaches.
const ALLOWED: Decision = Decision {
    allowed: true,
    limit: 1_000_000,
    remaining: 999_999,
    retry_after_ms: 0,
    reset_after_ms: 0,
    reason: Reason::WithinLimit as i32,
    slot_id: String::new(),
    slot_ttl_ms: 0,
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

/// An Envoy `RateLimitService` that answers every `ShouldRateLimit` at once
/// with `OK` and, per descriptor, a fixed status the size of quotad's (a
/// named limit, what remains, the time to reset); it validates nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopRls;

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        current_limit: Some(RateLimit {
            name: String::new(),
            requests_per_unit: 1_000_000,
            unit: 1,
        }),
        limit_remaining: 999_999,
        duration_until_reset: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        quota: None,
    }
}

#[tonic::async_trait]
impl RateLimitService for NoopRls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let descriptors = request.get_ref().descriptors.len();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: (0..descriptors).map(|_| ok_status()).collect(),
            ..RateLimitResponse::default()
        }))
    }
}

/// Serves [`NoopQuota`] and [`NoopRls`] on `listener` until `shutdown`
/// resolves, then finishes the calls in flight and returns once every
/// connection has closed.
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
    let incoming = quotad::grpc::incoming(listener, &transport);
    noop_router(&transport)?
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(quotad::Error::Grpc)?;
    Ok(())
}

/// [`serve_noop`] on a unix socket, accepted as quotad accepts its own
/// (at most `transport.max_connections` at once).
///
/// # Errors
///
/// The error that stopped the server.
pub async fn serve_noop_unix(
    socket: UnixSocket,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), quotad::Error> {
    let transport = quotad::TransportSettings::default();
    let limit = ConnectionLimit::new(transport.max_connections, "grpc")
        .silent_for(transport.handshake_timeout);
    let incoming = Incoming::new(UnixIncoming::new(socket), limit);
    noop_router(&transport)?
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(quotad::Error::Grpc)?;
    Ok(())
}

/// Both no-op services on quotad's server builder.
fn noop_router(transport: &quotad::TransportSettings) -> Result<Router<Layers>, quotad::Error> {
    Ok(quotad::grpc::server(transport, None)?
        .add_service(
            QuotaServer::new(NoopQuota).max_decoding_message_size(transport.max_message_bytes),
        )
        .add_service(
            RateLimitServiceServer::new(NoopRls)
                .max_decoding_message_size(transport.max_message_bytes),
        ))
}
