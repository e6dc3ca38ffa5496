//! OpenTelemetry traces, received by a real OTLP/gRPC receiver the test
//! starts on a loopback port, from quotad run as a process with the SDK's
//! own environment variables: the RPC span is the child of the caller's
//! `traceparent`, the store call's span the child of the RPC's, no span
//! carries the key, log lines carry the trace id, and nothing is exported
//! without an endpoint.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use quotad_proto::v1 as pb;
use quotad_proto::v1::quota_client::QuotaClient;
use tokio::net::TcpListener;
use tonic::transport::Channel;

use crate::common::binary::{Server, quotad};
use crate::common::redis::RedisServer;

/// A key no span may carry, in any form.
const KEY: &str = "k3y-7f0c9e-distinctive";

/// What the receiver has been sent.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0
            .lock()
            .expect("receiver lock")
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Received {
    fn spans(&self) -> Vec<Span> {
        self.0
            .lock()
            .expect("receiver lock")
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.clone())
            .collect()
    }

    fn exports(&self) -> usize {
        self.0.lock().expect("receiver lock").len()
    }

    /// The spans of trace `trace_id` once `done` holds of them, within 10 s.
    async fn trace_until(&self, trace_id: &[u8], done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let spans: Vec<Span> = self
                .spans()
                .into_iter()
                .filter(|s| s.trace_id == trace_id)
                .collect();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "the spans of trace {} did not arrive: got {spans:#?}",
                hex(trace_id)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// An OTLP/gRPC receiver on `listener`.
fn receive(listener: TcpListener) -> Received {
    let received = Received::default();
    let service = TraceServiceServer::new(received.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    received
}

/// A receiver on a fresh loopback port, and its endpoint URL.
async fn receiver() -> (Received, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    (receive(listener), endpoint)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A random 16-byte trace id and 8-byte span id, as a caller makes them.
fn ids() -> ([u8; 16], [u8; 8]) {
    let trace: [u8; 16] = rand::random();
    let span: [u8; 8] = rand::random();
    (trace, span)
}

fn traceparent(trace: &[u8], span: &[u8]) -> String {
    format!("00-{}-{}-01", hex(trace), hex(span))
}

const CONFIG: &str = r#"
[policies.api]
algorithm = "sliding_window"
limit = 100
window = "1m"
"#;

/// quotad serving `config` (a file in `dir`), exporting to `endpoint` when
/// given, with `extra` environment variables and arguments.
fn serve(dir: &Path, config: &str, env: &[(&str, &str)], args: &[&str]) -> Server {
    let path = dir.join("quotad.toml");
    std::fs::write(&path, config).expect("write config");
    let path = path.to_string_lossy().into_owned();
    let mut all = vec![
        "serve",
        "--config",
        &path,
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ];
    all.extend(args);
    let mut command = quotad(&all);
    // Spans leave 50 ms after they end, not 5 s.
    command.env("OTEL_BSP_SCHEDULE_DELAY", "50");
    command.envs(env.iter().copied());
    Server::spawn_command(command)
}

async fn client(server: &Server) -> QuotaClient<Channel> {
    let (grpc, _) = server.addresses();
    connect(grpc).await
}

/// The gRPC address of a server logging JSON lines, from its "serving" line.
fn json_grpc_address(server: &Server) -> std::net::SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = server
            .lines
            .recv_timeout(left)
            .expect("quotad logs that it is serving");
        let json: serde_json::Value = serde_json::from_str(&line).expect("a JSON line");
        if json["fields"]["message"] == "quotad serving" {
            return json["fields"]["grpc_addr"]
                .as_str()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("no grpc_addr in {line}"));
        }
    }
}

async fn connect(grpc: std::net::SocketAddr) -> QuotaClient<Channel> {
    QuotaClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect")
}

fn with_parent<T>(message: T, parent: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("traceparent", parent.parse().expect("ascii"));
    request
}

fn check_request(key: &str) -> pb::CheckRequest {
    crate::common::named(key, "api", None)
}

fn attribute<'s>(span: &'s Span, key: &str) -> Option<&'s any_value::Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text<'s>(span: &'s Span, key: &str) -> &'s str {
    match attribute(span, key) {
        Some(any_value::Value::StringValue(s)) => s,
        other => panic!("{key} of span {:?} is {other:?}", span.name),
    }
}

fn int(span: &Span, key: &str) -> i64 {
    match attribute(span, key) {
        Some(any_value::Value::IntValue(n)) => *n,
        other => panic!("{key} of span {:?} is {other:?}", span.name),
    }
}

/// Every string a value holds, nested ones included.
fn strings(value: &AnyValue, out: &mut Vec<String>) {
    match &value.value {
        Some(any_value::Value::StringValue(s)) => out.push(s.clone()),
        Some(any_value::Value::BytesValue(b)) => out.push(String::from_utf8_lossy(b).into_owned()),
        Some(any_value::Value::ArrayValue(a)) => a.values.iter().for_each(|v| strings(v, out)),
        Some(any_value::Value::KvlistValue(l)) => l.values.iter().for_each(|kv| pair(kv, out)),
        Some(other) => out.push(format!("{other:?}")),
        None => {}
    }
}

fn pair(kv: &KeyValue, out: &mut Vec<String>) {
    out.push(kv.key.clone());
    if let Some(v) = &kv.value {
        strings(v, out);
    }
}

/// Every name, attribute key and value, event and link of a span, as text.
fn everything_in(span: &Span) -> Vec<String> {
    let mut out = vec![span.name.clone(), span.trace_state.clone()];
    span.attributes.iter().for_each(|kv| pair(kv, &mut out));
    for event in &span.events {
        out.push(event.name.clone());
        event.attributes.iter().for_each(|kv| pair(kv, &mut out));
    }
    for link in &span.links {
        out.push(link.trace_state.clone());
        link.attributes.iter().for_each(|kv| pair(kv, &mut out));
    }
    out
}

fn assert_no_key(spans: &[Span]) {
    for span in spans {
        for text in everything_in(span) {
            assert!(
                !text.contains(KEY),
                "span {:?} carries the key in {text:?}",
                span.name
            );
        }
    }
}

fn named<'s>(spans: &'s [Span], name: &str) -> &'s Span {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name:?} in {spans:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_and_a_batch_are_spans_under_the_callers_with_their_store_calls_and_no_key() {
    let (received, endpoint) = receiver().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = serve(
        dir.path(),
        CONFIG,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
        &[],
    );
    let mut client = client(&server).await;

    // One Check, under the caller's span.
    let (trace, caller) = ids();
    let decision = client
        .check(with_parent(
            check_request(KEY),
            &traceparent(&trace, &caller),
        ))
        .await
        .expect("check")
        .into_inner()
        .decision
        .expect("a decision");
    assert!(decision.allowed);
    let spans = received
        .trace_until(&trace, |s| {
            s.iter().any(|s| s.name == "quotad.v1.Quota/Check")
                && s.iter().any(|s| s.name == "memory check")
        })
        .await;
    let rpc = named(&spans, "quotad.v1.Quota/Check");
    let store = named(&spans, "memory check");
    assert_eq!(
        rpc.parent_span_id, caller,
        "the RPC span's parent is the caller's"
    );
    assert_eq!(
        store.parent_span_id, rpc.span_id,
        "the store span's parent is the RPC's"
    );
    assert_eq!(store.trace_id, trace);
    assert_eq!(text(rpc, "rpc.system"), "grpc");
    assert_eq!(text(rpc, "rpc.service"), "quotad.v1.Quota");
    assert_eq!(text(rpc, "rpc.method"), "Check");
    assert_eq!(int(rpc, "rpc.grpc.status_code"), 0);
    assert_eq!(text(rpc, "quotad.policy"), "api");
    assert_eq!(text(rpc, "quotad.algorithm"), "sliding_window");
    assert_eq!(text(rpc, "quotad.outcome"), "allowed");
    assert_eq!(text(store, "quotad.backend"), "memory");
    assert_eq!(text(store, "quotad.policy"), "api");
    assert_eq!(text(store, "quotad.outcome"), "allowed");
    assert_eq!(int(store, "quotad.items"), 1);

    // A CheckBatch of two items, under another trace.
    let (trace, caller) = ids();
    let other_key = format!("{KEY}-2");
    let batch = pb::CheckBatchRequest {
        items: vec![check_request(KEY), check_request(&other_key)],
        mode: pb::BatchMode::AllOrNothing.into(),
    };
    let decisions = client
        .check_batch(with_parent(batch, &traceparent(&trace, &caller)))
        .await
        .expect("batch")
        .into_inner()
        .decisions;
    assert_eq!(decisions.len(), 2);
    let spans = received
        .trace_until(&trace, |s| {
            s.iter().any(|s| s.name == "quotad.v1.Quota/CheckBatch")
                && s.iter().any(|s| s.name == "memory check_batch")
        })
        .await;
    let rpc = named(&spans, "quotad.v1.Quota/CheckBatch");
    let store = named(&spans, "memory check_batch");
    assert_eq!(rpc.parent_span_id, caller);
    assert_eq!(store.parent_span_id, rpc.span_id);
    assert_eq!(int(rpc, "quotad.batch_size"), 2);
    assert_eq!(text(rpc, "quotad.outcome"), "allowed");
    assert_eq!(int(store, "quotad.items"), 2);

    // A refused call: its code, and still no key (nor the field's value).
    let (trace, caller) = ids();
    let status = client
        .check(with_parent(
            crate::common::named(KEY, "no-such-policy", None),
            &traceparent(&trace, &caller),
        ))
        .await
        .expect_err("an unknown policy is refused");
    assert_eq!(status.code(), tonic::Code::NotFound);
    let spans = received
        .trace_until(&trace, |s| {
            s.iter().any(|s| s.name == "quotad.v1.Quota/Check")
        })
        .await;
    let rpc = named(&spans, "quotad.v1.Quota/Check");
    assert_eq!(rpc.parent_span_id, caller);
    assert_eq!(
        int(rpc, "rpc.grpc.status_code"),
        tonic::Code::NotFound as i64
    );

    // Without a traceparent, a call starts a trace of its own.
    let before = received.spans().len();
    client
        .check(check_request(KEY))
        .await
        .expect("check without a parent");
    let deadline = Instant::now() + Duration::from_secs(10);
    while received.spans().len() < before + 2 {
        assert!(
            Instant::now() < deadline,
            "the parentless call's spans did not arrive"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spans = received.spans();
    let root = spans[before..]
        .iter()
        .find(|s| s.name == "quotad.v1.Quota/Check")
        .expect("the parentless call's RPC span");
    assert!(root.parent_span_id.is_empty(), "a root span: {root:?}");

    // Not in any span exported so far, nor in the resource.
    assert_no_key(&received.spans());
    let resources = received.0.lock().expect("receiver lock").clone();
    for resource in resources.iter().flat_map(|r| &r.resource_spans) {
        let mut out = Vec::new();
        for kv in resource.resource.iter().flat_map(|r| &r.attributes) {
            pair(kv, &mut out);
        }
        assert!(out.iter().all(|t| !t.contains(KEY)));
        assert!(
            out.iter().any(|t| t == "quotad"),
            "service.name is quotad: {out:?}"
        );
    }
}

/// One decision under a traceparent, and the log lines of a Redis that
/// stopped answering (SIGSTOP) in `format`: the warning carries the trace
/// id; the store span says which Redis and that it failed.
async fn a_store_failure_is_logged_with_the_trace_id(format: &str) -> (String, Vec<Span>) {
    let (received, endpoint) = receiver().await;
    let mut redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "{CONFIG}\n[store]\nbackend = \"redis\"\non_error = \"fail_closed\"\n\n[store.redis]\nurl = \"{}\"\ntimeout = \"200ms\"\n",
        redis.url()
    );
    let server = serve(
        dir.path(),
        &config,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
        &["--log-format", format],
    );
    let mut client = if format == "json" {
        connect(json_grpc_address(&server)).await
    } else {
        client(&server).await
    };
    client
        .check(check_request(KEY))
        .await
        .expect("Redis answers");

    redis.pause();
    let (trace, caller) = ids();
    let decision = client
        .check(with_parent(
            check_request(KEY),
            &traceparent(&trace, &caller),
        ))
        .await
        .expect("fail_closed answers")
        .into_inner()
        .decision
        .expect("a decision");
    redis.resume();
    assert!(!decision.allowed, "a failed store call fails closed");

    let id = hex(&trace);
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = server
            .lines
            .recv_timeout(left)
            .expect("quotad logs the store failure");
        if line.contains("state store call failed") {
            break line;
        }
    };
    assert!(line.contains(&id), "{line:?} carries trace id {id}");
    assert!(!line.contains(KEY), "{line:?}");
    let spans = received
        .trace_until(&trace, |s| s.iter().any(|s| s.name == "redis check"))
        .await;
    assert_no_key(&received.spans());
    (line, spans)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_log_line_written_in_a_call_carries_its_trace_id() {
    let (line, spans) = a_store_failure_is_logged_with_the_trace_id("text").await;
    let store = named(&spans, "redis check");
    let id = hex(&store.trace_id);
    assert!(line.ends_with(&format!(" trace_id={id}")), "{line:?}");
    assert_eq!(text(store, "quotad.outcome"), "error");
    assert!(text(store, "server.address").starts_with("127.0.0.1:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_log_line_written_in_a_call_carries_its_trace_id() {
    let (line, spans) = a_store_failure_is_logged_with_the_trace_id("json").await;
    let store = named(&spans, "redis check");
    let json: serde_json::Value = serde_json::from_str(&line).expect("one JSON object a line");
    assert_eq!(json["trace_id"], hex(&store.trace_id));
    assert_eq!(json["level"], "WARN");
}

/// Calls under a sampled traceparent, then a graceful shutdown (which
/// sends every span still held): the receiver must get nothing.
async fn calls_then_shutdown(mut server: Server, grpc: std::net::SocketAddr) {
    let mut client = QuotaClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    for _ in 0..5 {
        let (trace, caller) = ids();
        client
            .check(with_parent(
                check_request(KEY),
                &traceparent(&trace, &caller),
            ))
            .await
            .expect("check");
    }
    drop(client);
    server.signal("TERM");
    let status = tokio::task::spawn_blocking(move || server.wait(Duration::from_secs(15)))
        .await
        .expect("wait");
    assert!(status.success(), "quotad exits 0 on SIGTERM: {status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_exported_to_the_default_endpoint_without_one_configured() {
    // The OTLP exporter's default endpoint: an exporter built without an
    // endpoint configured would send here.
    let listener = TcpListener::bind("127.0.0.1:4317")
        .await
        .expect("this test listens on OTLP's default port 4317, which must be free");
    let received = receive(listener);
    let dir = tempfile::tempdir().expect("tempdir");
    let server = serve(
        dir.path(),
        CONFIG,
        &[("OTEL_TRACES_SAMPLER", "always_on")],
        &[],
    );
    let ((grpc, _), log) = server.addresses_and_log();
    assert!(log.iter().all(|l| !l.contains("trace_id")), "{log:?}");
    calls_then_shutdown(server, grpc).await;
    assert_eq!(received.exports(), 0, "nothing is exported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otel_sdk_disabled_turns_export_off_even_with_an_endpoint() {
    let (received, endpoint) = receiver().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = serve(
        dir.path(),
        CONFIG,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_SDK_DISABLED", "true"),
        ],
        &[],
    );
    let (grpc, _) = server.addresses();
    calls_then_shutdown(server, grpc).await;
    assert_eq!(received.exports(), 0, "nothing is exported");

    // The same calls with the SDK on are exported, by the shutdown at the
    // latest: the test above would see them.
    let server = serve(
        dir.path(),
        CONFIG,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
        &[],
    );
    let (grpc, _) = server.addresses();
    calls_then_shutdown(server, grpc).await;
    assert!(received.exports() > 0, "spans are exported with the SDK on");
}

/// The trace id and span id of a caller's span, as bytes.
fn ids_of(cx: &opentelemetry::trace::SpanContext) -> (Vec<u8>, Vec<u8>) {
    (
        cx.trace_id().to_bytes().to_vec(),
        cx.span_id().to_bytes().to_vec(),
    )
}

/// quotad exporting to a fresh receiver, and a Rust client of it.
async fn traced_server_and_client(dir: &Path) -> (Server, Received, quotad_client::Client) {
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    // The application's propagator: W3C trace context, which quotad reads.
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let (received, endpoint) = receiver().await;
    let server = serve(
        dir,
        CONFIG,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
        &[],
    );
    let (grpc, _) = server.addresses();
    let client = quotad_client::Client::builder(format!("http://{grpc}"))
        .build()
        .expect("valid address");
    (server, received, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_sends_the_callers_opentelemetry_context() {
    use opentelemetry::trace::{
        FutureExt as _, Span as _, TraceContextExt as _, Tracer as _, TracerProvider as _,
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, received, client) = traced_server_and_client(dir.path()).await;
    let app = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let span = app.tracer("app").start("handle request");
    let (trace, caller) = ids_of(span.span_context());
    let cx = opentelemetry::Context::current_with_span(span);

    let decision = client
        .check(&quotad_client::Check::named("api", KEY))
        .with_context(cx)
        .await
        .expect("check");
    assert!(decision.allowed);
    let spans = received
        .trace_until(&trace, |s| {
            s.iter().any(|s| s.name == "quotad.v1.Quota/Check")
        })
        .await;
    let rpc = named(&spans, "quotad.v1.Quota/Check");
    assert_eq!(
        rpc.parent_span_id, caller,
        "the client's span is the RPC's parent"
    );
    assert_no_key(&spans);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_sends_the_current_tracing_span_bridged_to_opentelemetry() {
    use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
    use tracing::instrument::{Instrument as _, WithSubscriber as _};
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let (_server, received, client) = traced_server_and_client(dir.path()).await;
    let app = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(app.tracer("app")));
    let dispatch = tracing::Dispatch::new(subscriber);
    let (span, (trace, caller)) = tracing::dispatcher::with_default(&dispatch, || {
        let span = tracing::info_span!("handle request");
        let ids = ids_of(span.context().span().span_context());
        (span, ids)
    });

    let decision = client
        .check(&quotad_client::Check::named("api", KEY))
        .instrument(span)
        .with_subscriber(dispatch)
        .await
        .expect("check");
    assert!(decision.allowed);
    let spans = received
        .trace_until(&trace, |s| {
            s.iter().any(|s| s.name == "quotad.v1.Quota/Check")
        })
        .await;
    let rpc = named(&spans, "quotad.v1.Quota/Check");
    assert_eq!(
        rpc.parent_span_id, caller,
        "the tracing span is the RPC's parent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoy_rate_limit_call_is_a_span_under_envoys_without_the_descriptor_value() {
    use crate::rls::{descriptor, request, rules_dir};
    use quotad_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let (received, endpoint) = receiver().await;
    let rules = rules_dir(&[(
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )]);
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "{CONFIG}\n[rls]\nconfig_dir = {:?}\n",
        rules.path().display().to_string()
    );
    let server = serve(
        dir.path(),
        &config,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)],
        &[],
    );
    let (grpc, _) = server.addresses();
    let mut rls = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    let mut traces = Vec::new();
    // The second hit of the minute is over the limit of one.
    for _ in 0..2 {
        let (trace, caller) = ids();
        rls.should_rate_limit(with_parent(
            request("edge", vec![descriptor(&[("user", KEY)])]),
            &traceparent(&trace, &caller),
        ))
        .await
        .expect("ShouldRateLimit answers");
        traces.push((trace, caller));
    }
    let name = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    for ((trace, caller), outcome) in traces.iter().zip(["allowed", "denied"]) {
        let spans = received
            .trace_until(trace, |s| {
                s.iter().any(|s| s.name == name) && s.iter().any(|s| s.name == "memory check")
            })
            .await;
        let rpc = named(&spans, name);
        let store = named(&spans, "memory check");
        assert_eq!(rpc.parent_span_id, *caller);
        assert_eq!(store.parent_span_id, rpc.span_id);
        assert_eq!(text(rpc, "quotad.policy"), "rls:edge");
        assert_eq!(text(rpc, "quotad.outcome"), outcome);
        assert_eq!(int(rpc, "quotad.batch_size"), 1);
        assert_eq!(int(rpc, "rpc.grpc.status_code"), 0);
    }
    assert_no_key(&received.spans());
}
