//! The gRPC edges of the server, side by side. Each converts protobuf
//! requests to domain values at the edge ([`request`]), resolves policies,
//! calls the [`Backend`](crate::backend::Backend) once, and maps every error
//! to a gRPC status in one place ([`error::to_status`]).
//!
//! - [`quota`]: `quotad.v1.Quota` (Check, CheckBatch, Peek, Reset).
//! - [`lease`]: `quotad.v1.Leases` (Lease): shares of a key's budget.
//! - [`concurrency`]: `quotad.v1.Concurrency` (Acquire, Renew, Release):
//!   slots of concurrency limits.
//! - [`rls`]: Envoy's `RateLimitService` (ShouldRateLimit).
//! - [`rlqs`]: Envoy's `RateLimitQuotaService` (StreamRateLimitQuotas):
//!   quota assignments cut from leases.
//! - [`admin`]: `quotad.v1.Overrides` (runtime overrides) and
//!   `quotad.v1.Explain` (a key's state in words).
//! - `answer`: what both answer when the store failed, and the store
//!   calls they count.

pub(crate) mod admin;
mod answer;
pub(crate) mod concurrency;
pub(crate) mod error;
pub(crate) mod lease;
pub(crate) mod quota;
pub(crate) mod request;
pub(crate) mod rlqs;
pub(crate) mod rls;

pub(crate) use admin::{ExplainService, OverridesService};
pub(crate) use concurrency::ConcurrencyService;
pub(crate) use lease::LeaseService;
pub(crate) use quota::{QuotaService, RequestLimits};
pub(crate) use rlqs::RlqsService;
pub(crate) use rls::{RlsOptions, RlsService};

use std::time::{Duration, Instant};

use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use self::error::{ServiceError, to_status};
use crate::backend::Deadline;
use crate::grpc::arrival::Arrived;
use crate::metrics::{Method, Metrics};

/// Runs one handler: times it, and turns its error into a status, counted
/// by method and code. A store failure has been logged where it happened.
/// A call dropped before it answered (its client cancelled it or went
/// away, tonic's own timer ended it, or a shutdown closed its connection)
/// is counted with code `Cancelled`, and not in the duration histogram.
pub(crate) async fn observe<T>(
    metrics: &Metrics,
    method: Method,
    call: impl Future<Output = Result<T, ServiceError>>,
) -> Result<Response<T>, Status> {
    let started = Instant::now();
    let mut unanswered = Unanswered(Some((metrics, method)));
    let result = call.await;
    unanswered.0 = None;
    metrics.request_duration(method, started.elapsed());
    result.map(Response::new).map_err(|error| {
        let status = to_status(&error);
        metrics.request_error(method, status.code());
        status
    })
}

/// Counts a call as `Cancelled` if dropped while armed.
struct Unanswered<'a>(Option<(&'a Metrics, Method)>);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some((metrics, method)) = self.0.take() {
            metrics.request_error(method, tonic::Code::Cancelled);
        }
    }
}

/// Serves one call: `handle` gets the request's message and when its
/// caller stops waiting ([`call_deadline`]), and is observed as `method`.
pub(crate) async fn serve<T, R, Fut>(
    metrics: &Metrics,
    method: Method,
    request: Request<T>,
    request_timeout: Duration,
    handle: impl FnOnce(T, Deadline) -> Fut,
) -> Result<Response<R>, Status>
where
    Fut: Future<Output = Result<R, ServiceError>>,
{
    let arrived = request
        .extensions()
        .get::<Arrived>()
        .map_or_else(Instant::now, |a| a.0);
    let deadline = call_deadline(request.metadata(), request_timeout, arrived);
    observe(metrics, method, handle(request.into_inner(), deadline)).await
}

/// How long before tonic's own end of a call quotad's deadline for it
/// passes. tonic starts its timer (`grpc-timeout`, or `request_timeout`)
/// when the call arrives, before the body is read and decoded; quotad's
/// deadline counts from the same moment (the [`Arrived`] stamp of the
/// outermost layer), less this, so it ends at least a whole timer tick
/// (1 ms) earlier. tonic polls the handler before its own timer, so the
/// handler, whose store call has timed out by then, answers first. Counted
/// from the handler with no margin, about one call in ten on a stalled
/// store got `CANCELLED` instead of its `on_error` answer (and its store
/// call was dropped, not followed to its late end).
pub(crate) const ANSWER_MARGIN: Duration = Duration::from_millis(2);

/// When quotad gives up on the call of `metadata`'s request, counted from
/// when it `arrived` (as tonic counts its own timeout): its `grpc-timeout`,
/// if it sent one, or `request_timeout`, whichever ends first (tonic
/// cancels the call then), less [`ANSWER_MARGIN`], so that the call is
/// answered (a store failure as its `on_error` says) before tonic ends it.
/// The store is given it, so that a call answered as failed is never
/// counted later.
///
/// The request's transit is not in it: the client's own deadline ended
/// that much earlier (`docs/redis.md`, the residual window).
pub(crate) fn call_deadline(
    metadata: &MetadataMap,
    request_timeout: Duration,
    arrived: Instant,
) -> Deadline {
    let asked = metadata
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(grpc_timeout);
    let ends = asked.map_or(request_timeout, |t| t.min(request_timeout));
    arrived
        .checked_add(ends.saturating_sub(ANSWER_MARGIN))
        .map_or(Deadline::NONE, Deadline::at)
}

/// A `grpc-timeout` value: 1 to 8 digits and a unit (`H`, `M`, `S`, `m`,
/// `u`, `n`), as the gRPC HTTP/2 protocol defines it.
fn grpc_timeout(value: &str) -> Option<Duration> {
    let digits = value.get(..value.len().checked_sub(1)?)?;
    if !(1..=8).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match &value[digits.len()..] {
        "H" => Duration::from_secs(n * 3_600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_call_deadline_is_the_earlier_of_grpc_timeout_and_the_request_timeout() {
        assert_eq!(grpc_timeout("50m"), Some(Duration::from_millis(50)));
        assert_eq!(grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3_600)));
        assert_eq!(grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(
            grpc_timeout("99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(grpc_timeout("7n"), Some(Duration::from_nanos(7)));
        for bad in ["", "m", "123456789m", "5", "5x", "-5m", "+5m", "5 m", "5é"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
        let within = |metadata: &MetadataMap, timeout: Duration| {
            let before = Instant::now();
            let at = call_deadline(metadata, timeout, Instant::now())
                .instant()
                .expect("a deadline");
            at.duration_since(before)
        };
        let mut metadata = MetadataMap::new();
        let five = Duration::from_secs(5);
        let no_grpc_timeout = within(&metadata, five);
        assert!(
            no_grpc_timeout >= five - ANSWER_MARGIN && no_grpc_timeout < five,
            "no grpc-timeout: the request timeout, less the margin: {no_grpc_timeout:?}"
        );
        metadata.insert("grpc-timeout", "50m".parse().expect("ascii"));
        let asked = within(&metadata, five);
        assert!(
            asked >= Duration::from_millis(50) - ANSWER_MARGIN && asked < Duration::from_millis(50),
            "{asked:?}"
        );
        assert!(within(&metadata, Duration::from_millis(20)) < Duration::from_millis(20));
    }
}
