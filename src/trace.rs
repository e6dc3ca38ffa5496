//! OpenTelemetry traces: the tracer the server exports spans with, set up
//! from the OpenTelemetry SDK's own environment variables (`OTEL_*`), and
//! the W3C trace context of incoming calls.
//!
//! Export is off unless `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set (and `OTEL_SDK_DISABLED` is not
//! `true`): then no OpenTelemetry layer is installed, and a call makes no
//! span at all: each place that would checks [`exporting`], one relaxed
//! load of a flag set when the tracer is built, instead of asking the
//! subscriber about a disabled callsite (BENCHMARKS.md has what each
//! costs).
//!
//! Spans are `tracing` spans of the target [`TARGET`], bridged to
//! OpenTelemetry by `tracing-opentelemetry`; only those spans are exported,
//! and never a log event (an event could carry a key), so what a span holds
//! is only what quotad puts in it: never a key.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::{TraceContextExt as _, TraceId, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{FilterFn, Filtered};
use tracing_subscriber::registry::LookupSpan;

/// The `tracing` target of every span quotad exports (the RPC's and the
/// store call's). The log filter (`log.level`) never shows these spans.
pub const TARGET: &str = "quotad::spans";

/// The log filter's directive that leaves quotad's exported spans out of
/// the log (added to `log.level`): their fields are the trace's, and a
/// filter of the log's own keeps the log's callsites as cheap as without
/// traces (a per-layer filter function would leave every callsite of
/// every level enabled at the subscriber, to be filtered on each call).
pub const NOT_LOGGED: &str = "quotad::spans=off";

/// The service name spans carry unless `OTEL_SERVICE_NAME` (or
/// `service.name` in `OTEL_RESOURCE_ATTRIBUTES`) says otherwise.
const SERVICE_NAME: &str = "quotad";

/// How long the last spans have to leave at shutdown.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// The environment variables that turn export on, in the order the OTLP
/// exporter reads them.
const ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// Set once a [`Tracer`] is built: this process exports spans.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether this process exports spans (a [`Tracer`] was built). When not,
/// the RPC layer and the store wrapper make no span and record nothing.
pub(crate) fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Why the tracer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The OTLP exporter refused its settings (the endpoint's URL).
    #[error("OTLP trace exporter")]
    Exporter(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// The exporting tracer, while it runs; [`Tracer::shutdown`] sends what is
/// left.
#[derive(Debug)]
pub struct Tracer {
    provider: SdkTracerProvider,
}

/// The layer that sends quotad's spans to a [`Tracer`], filtered to them.
pub type TraceLayer<S> = Filtered<
    tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
    FilterFn<fn(&tracing::Metadata<'_>) -> bool>,
    S,
>;

/// Whether the environment turns export on: an OTLP endpoint is set and
/// the SDK is not disabled (`OTEL_SDK_DISABLED=true`).
pub fn export_configured() -> bool {
    export_configured_by(|name| std::env::var(name).ok())
}

fn export_configured_by(var: impl Fn(&str) -> Option<String>) -> bool {
    let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled
        && ENDPOINT_VARS
            .iter()
            .any(|name| var(name).is_some_and(|v| !v.trim().is_empty()))
}

impl Tracer {
    /// The tracer the environment asks for, and the layer that feeds it;
    /// `None` when export is off ([`export_configured`]).
    ///
    /// The OTLP/gRPC exporter reads its endpoint, headers, timeout and
    /// compression from `OTEL_EXPORTER_OTLP_*`, the batch processor its
    /// delay and sizes from `OTEL_BSP_*`, the sampler
    /// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (the SDK's
    /// default: `parentbased_always_on`), the resource `OTEL_SERVICE_NAME`
    /// and `OTEL_RESOURCE_ATTRIBUTES`. Must be called within a tokio
    /// runtime, which the exporter's connection runs on.
    ///
    /// # Errors
    ///
    /// [`TraceError`] when the exporter refuses its settings.
    pub fn from_env<S>() -> Result<Option<(Tracer, TraceLayer<S>)>, TraceError>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        if !export_configured() {
            return Ok(None);
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()?;
        let mut resource = opentelemetry_sdk::Resource::builder();
        let named = std::env::var("OTEL_SERVICE_NAME").is_ok()
            || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| {
                a.split(',')
                    .any(|kv| kv.trim().starts_with("service.name="))
            });
        if !named {
            resource = resource.with_service_name(SERVICE_NAME);
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer("quotad");
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_level(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(FilterFn::new(
                is_trace_span as fn(&tracing::Metadata<'_>) -> bool,
            ));
        EXPORTING.store(true, Ordering::Relaxed);
        Ok(Some((Tracer { provider }, layer)))
    }

    /// Sends the spans not exported yet, within a few seconds, and stops
    /// the exporter.
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::warn!(%error, "the last spans could not be exported");
        }
    }
}

/// Whether a `tracing` span is one quotad exports (the log lines leave
/// them out: their fields are the trace's, and formatting them would cost
/// every call).
pub fn is_trace_span(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span() && meta.target() == TARGET
}

/// The W3C trace context (`traceparent`, `tracestate`) of an incoming
/// call's headers (gRPC metadata): the parent of its RPC span. An absent
/// or malformed `traceparent` gives the empty context (a new trace).
pub(crate) fn parent_of(headers: &http::HeaderMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Reads W3C trace context from HTTP headers.
struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// The trace id of the span the current code runs in, when it is one of
/// quotad's exported spans (or inside one): what log lines carry.
pub(crate) fn current_trace_id() -> Option<TraceId> {
    if !exporting() {
        return None;
    }
    let span = tracing::Span::current();
    if span.is_none() {
        return None;
    }
    let cx = span.context();
    let id = cx.span().span_context().trace_id();
    (id != TraceId::INVALID).then_some(id)
}

/// What a policy is called in a span: its name, `inline` for a policy the
/// request carried (whose namespace spells its parameters), and the rule's
/// place for an RLS rule.
pub(crate) fn policy_label(namespace: &str) -> &str {
    if namespace.starts_with("inline:") {
        "inline"
    } else {
        namespace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(set: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            set.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn export_is_on_only_with_an_endpoint_and_the_sdk_not_disabled() {
        assert!(!export_configured_by(vars(&[])));
        assert!(!export_configured_by(vars(&[(
            "OTEL_TRACES_SAMPLER",
            "always_on"
        )])));
        assert!(export_configured_by(vars(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://127.0.0.1:4317"
        )])));
        assert!(export_configured_by(vars(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:4317"
        )])));
        assert!(!export_configured_by(vars(&[(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            " "
        )])));
        assert!(!export_configured_by(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_SDK_DISABLED", "TRUE"),
        ])));
        assert!(export_configured_by(vars(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_SDK_DISABLED", "false"),
        ])));
    }

    #[test]
    fn a_traceparent_header_becomes_the_parent_and_a_bad_one_starts_a_trace() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        );
        let cx = parent_of(&headers);
        let parent = cx.span().span_context().clone();
        assert!(parent.is_remote());
        assert_eq!(
            parent.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(parent.span_id().to_string(), "00f067aa0ba902b7");
        assert!(parent.is_sampled());

        headers.insert("traceparent", http::HeaderValue::from_static("00-zz-01"));
        assert!(!parent_of(&headers).span().span_context().is_valid());
        assert!(
            !parent_of(&http::HeaderMap::new())
                .span()
                .span_context()
                .is_valid()
        );
    }

    #[test]
    fn inline_policies_are_labelled_inline() {
        assert_eq!(policy_label("inline:fixed_window:10:1000:10"), "inline");
        assert_eq!(policy_label("login"), "login");
    }
}
