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
