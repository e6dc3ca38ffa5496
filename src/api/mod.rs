//! The gRPC edges of the server, side by side. Each converts protobuf
//! requests to domain values at the edge ([`request`]), resolves policies,
//! calls the [`Backend`](crate::backend::Backend) once, and maps every error
//! to a gRPC status in one place ([`error::to_status`]).
//!
//! - [`quota`]: `quotad.v1.Quota` (Check, CheckBatch, Peek, Reset).
//! - [`rls`]: Envoy's `RateLimitService` (ShouldRateLimit).

pub(crate) mod error;
pub(crate) mod quota;
pub(crate) mod request;
pub(crate) mod rls;

pub(crate) use quota::{QuotaService, RequestLimits};
pub(crate) use rls::{RlsOptions, RlsService};

use std::time::Instant;

use tonic::{Response, Status};

use self::error::{ServiceError, to_status};
use crate::metrics::{Method, Metrics};

/// Runs one handler: times it, and turns its error into a status, counted
/// by method and code. A store failure has been logged where it happened.
pub(crate) async fn observe<T>(
    metrics: &Metrics,
    method: Method,
    call: impl Future<Output = Result<T, ServiceError>>,
) -> Result<Response<T>, Status> {
    let started = Instant::now();
    let result = call.await;
    metrics.request_duration(method, started.elapsed());
    result.map(Response::new).map_err(|error| {
        let status = to_status(&error);
        metrics.request_error(method, status.code());
        status
    })
}
