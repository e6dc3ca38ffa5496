//! gRPC's conventions for the statuses the transport makes itself.
//!
//! tonic refuses a request message larger than its limit with OUT_OF_RANGE
//! before any handler runs; gRPC's convention (and every other
//! implementation) says RESOURCE_EXHAUSTED. Those answers are headers-only
//! (no handler ran, no body was sent), so this layer rewrites the status in
//! the response headers, for every service on the port.

use std::task::{Context, Poll};

use futures_util::TryFutureExt as _;
use futures_util::future::MapOk;
use http::{HeaderValue, Request, Response};
use tonic::Code;
use tower_layer::Layer;
use tower_service::Service;

/// The text of tonic's size refusal, which tells it apart from any other
/// OUT_OF_RANGE (quotad itself answers none).
const TOO_LARGE: &str = "message length too large";

/// `grpc-status` of OUT_OF_RANGE, as sent.
const OUT_OF_RANGE: &[u8] = b"11";

/// Wraps a service so that a refused oversized request answers
/// RESOURCE_EXHAUSTED.
#[derive(Clone, Copy, Debug, Default)]
pub struct SizeStatusLayer;

impl<S> Layer<S> for SizeStatusLayer {
    type Service = SizeStatus<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SizeStatus { inner }
    }
}

/// See [`SizeStatusLayer`].
#[derive(Clone, Debug)]
pub struct SizeStatus<S> {
    inner: S,
}

impl<S, B, RB> Service<Request<B>> for SizeStatus<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = MapOk<S::Future, fn(Response<RB>) -> Response<RB>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.inner.call(request).map_ok(resource_exhausted)
    }
}

fn resource_exhausted<RB>(mut response: Response<RB>) -> Response<RB> {
    let headers = response.headers_mut();
    // A successful unary response carries its status in the trailers, so
    // this lookup finds nothing on the hot path.
    let out_of_range = headers
        .get("grpc-status")
        .is_some_and(|v| v.as_bytes() == OUT_OF_RANGE);
    if !out_of_range {
        return response;
    }
    // grpc-message is percent-encoded; tonic's encodes spaces only, here.
    let too_large = headers
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|m| m.replace("%20", " ").contains(TOO_LARGE));
    if too_large {
        headers.insert(
            "grpc-status",
            HeaderValue::from(Code::ResourceExhausted as i32),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: Code, message: &str) -> Response<()> {
        let mut response = Response::new(());
        let headers = response.headers_mut();
        headers.insert("grpc-status", HeaderValue::from(status as i32));
        headers.insert(
            "grpc-message",
            HeaderValue::from_str(message).expect("ASCII"),
        );
        response
    }

    fn status(response: &Response<()>) -> &str {
        response.headers()["grpc-status"].to_str().expect("ASCII")
    }

    #[test]
    fn out_of_range_is_code_eleven() {
        assert_eq!(
            OUT_OF_RANGE,
            (Code::OutOfRange as i32).to_string().as_bytes()
        );
    }

    #[test]
    fn the_size_refusal_becomes_resource_exhausted_and_nothing_else_changes() {
        let refused = response(
            Code::OutOfRange,
            "Error,%20decoded%20message%20length%20too%20large:%20found%20400000%20bytes",
        );
        assert_eq!(status(&resource_exhausted(refused)), "8");
        let other = response(Code::OutOfRange, "something else");
        assert_eq!(status(&resource_exhausted(other)), "11");
        let invalid = response(Code::InvalidArgument, "message length too large");
        assert_eq!(status(&resource_exhausted(invalid)), "3");
    }
}
