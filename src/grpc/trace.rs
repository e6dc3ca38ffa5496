//! A span per call: the RPC's OpenTelemetry server span, a child of the
//! W3C trace context (`traceparent`, `tracestate`) the caller sent in its
//! metadata (Envoy sends it on rate limit calls too).
//!
//! The span is a `tracing` span of [`crate::trace::TARGET`]; with export
//! off ([`crate::trace::exporting`]) the layer makes none, neither reads
//! the headers nor records anything. The handlers add what they know (policy,
//! algorithm, outcome, batch size: [`record`]); the layer adds the gRPC
//! status code of the answer: the `grpc-status` of a trailers-only answer
//! (every error quotad returns), else OK (a unary answer's status comes in
//! its trailers, which a successful handler always ends with OK).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::trace::TARGET;

/// The layer that opens a span per call.
#[derive(Clone, Copy, Debug, Default)]
pub struct RpcTraceLayer;

impl<S> Layer<S> for RpcTraceLayer {
    type Service = RpcTrace<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcTrace { inner }
    }
}

/// See [`RpcTraceLayer`].
#[derive(Clone, Debug)]
pub struct RpcTrace<S> {
    inner: S,
}

impl<S, B, RB> Service<Request<B>> for RpcTrace<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = Traced<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let span = rpc_span(&request);
        let inner = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        Traced { inner, span }
    }
}

/// The call's span, a child of the caller's trace context; disabled (and
/// nothing read) when export is off.
fn rpc_span<B>(request: &Request<B>) -> Span {
    if !crate::trace::exporting() {
        return Span::none();
    }
    let path = request.uri().path();
    let span = tracing::info_span!(
        target: TARGET,
        "rpc",
        otel.name = Empty,
        otel.kind = "server",
        otel.status_code = Empty,
        rpc.system = "grpc",
        rpc.service = Empty,
        rpc.method = Empty,
        rpc.grpc.status_code = Empty,
        quotad.policy = Empty,
        quotad.algorithm = Empty,
        quotad.outcome = Empty,
        quotad.batch_size = Empty,
    );
    if span.is_disabled() {
        return span;
    }
    let name = path.strip_prefix('/').unwrap_or(path);
    let (service, method) = name.split_once('/').unwrap_or((name, ""));
    span.record("otel.name", name);
    span.record("rpc.service", service);
    span.record("rpc.method", method);
    // Only fails when the span is disabled or started, neither of which
    // holds for a span just made here.
    let _ = span.set_parent(crate::trace::parent_of(request.headers()));
    span
}

/// gRPC codes a server span counts as errors (OpenTelemetry's semantic
/// conventions for gRPC servers).
fn is_server_error(code: i32) -> bool {
    use tonic::Code;
    [
        Code::Unknown,
        Code::DeadlineExceeded,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
    ]
    .iter()
    .any(|c| *c as i32 == code)
}

fn record_status<RB>(span: &Span, response: &Response<RB>) {
    let code = response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(tonic::Code::Ok as i32);
    span.record("rpc.grpc.status_code", code);
    if is_server_error(code) {
        span.record("otel.status_code", "error");
    }
}

pin_project_lite::pin_project! {
    /// The inner service's future, run in the call's span, which records
    /// the answer's status code.
    #[derive(Debug)]
    pub struct Traced<F> {
        #[pin]
        inner: F,
        span: Span,
    }
}

impl<F, RB, E> Future for Traced<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        let output = std::task::ready!(this.inner.poll(cx));
        if !this.span.is_disabled()
            && let Ok(response) = &output
        {
            record_status(this.span, response);
        }
        Poll::Ready(output)
    }
}

/// Whether the code runs in a call's span that records (export is on).
pub(crate) fn recording() -> bool {
    crate::trace::exporting() && !Span::current().is_disabled()
}

/// What the handler of a call knows, on the call's span (nothing is done
/// when export is off): the policy (a name, `inline`, or `mixed` for a
/// batch of several), its algorithm, the outcome (`allowed`, `denied`, or
/// `mixed`), and how many items a batch held.
pub(crate) fn record(policy: &str, algorithm: &str, outcome: &str, batch_size: Option<usize>) {
    if !crate::trace::exporting() {
        return;
    }
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    span.record("quotad.policy", policy);
    span.record("quotad.algorithm", algorithm);
    span.record("quotad.outcome", outcome);
    if let Some(n) = batch_size {
        span.record("quotad.batch_size", i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// What an RLS call's handler knows, on the call's span: the domain (the
/// Envoy configuration's, which quotad's rules name; `quotad.policy`), the
/// overall outcome (`allowed` for OK, `denied` for OVER_LIMIT) and how many
/// descriptors (`quotad.batch_size`).
pub(crate) fn record_rls(domain: &str, outcome: &str, descriptors: usize) {
    if !crate::trace::exporting() {
        return;
    }
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    span.record("quotad.policy", format!("rls:{domain}").as_str());
    span.record("quotad.outcome", outcome);
    span.record(
        "quotad.batch_size",
        i64::try_from(descriptors).unwrap_or(i64::MAX),
    );
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    /// Counts the spans made under it; it enables every callsite.
    struct CountSpans(Arc<AtomicUsize>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountSpans {
        fn on_new_span(
            &self,
            _: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_process_that_exports_nothing_makes_no_span_even_under_a_subscriber_that_would_take_it() {
        // The unit tests' process builds no tracer, so export is off.
        assert!(!crate::trace::exporting());
        let made = Arc::new(AtomicUsize::new(0));
        let subscriber = tracing_subscriber::registry().with(CountSpans(Arc::clone(&made)));
        tracing::subscriber::with_default(subscriber, || {
            // The subscriber takes spans: one made directly is counted.
            drop(tracing::info_span!(target: crate::trace::TARGET, "probe"));
            assert_eq!(made.load(Ordering::Relaxed), 1);
            let request = Request::builder()
                .uri("/quotad.v1.Quota/Check")
                .header(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )
                .body(())
                .expect("valid");
            let span = rpc_span(&request);
            assert!(span.is_none(), "no span is made with export off");
            record("api", "fixed_window", "allowed", None);
            assert!(!recording());
            assert_eq!(
                made.load(Ordering::Relaxed),
                1,
                "the RPC layer made no span"
            );
        });
    }

    #[test]
    fn only_server_side_failures_mark_a_server_span_as_an_error() {
        assert!(is_server_error(tonic::Code::Unavailable as i32));
        assert!(is_server_error(tonic::Code::Internal as i32));
        assert!(!is_server_error(tonic::Code::Ok as i32));
        assert!(!is_server_error(tonic::Code::InvalidArgument as i32));
        assert!(!is_server_error(tonic::Code::NotFound as i32));
    }
}
