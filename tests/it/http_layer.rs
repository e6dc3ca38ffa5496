//! quotad-client's tower layer in a real axum app, against a real quotad:
//! 429 with `Retry-After` and the RateLimit fields on denial, headers on
//! admitted responses, fail-open and fail-closed when quotad is down.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{API_3_A_MINUTE, NOON_30, TestServer};
use axum::Router;
use axum::routing::get;
use http::HeaderName;
use quotad_client::{Client, FailurePolicy, KeyExtractor, RateLimitLayer};
use quotad_core::FakeClock;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

const CONFIG: &str = API_3_A_MINUTE;

struct Reply {
    status: u16,
    headers: HashMap<String, String>,
}

/// A GET with extra headers over a fresh connection.
async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut stream = TcpStream::connect(addr).await.expect("connect to the app");
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let raw = String::from_utf8(raw).expect("UTF-8");
    let (head, _) = raw.split_once("\r\n\r\n").expect("headers end");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        .collect();
    Reply { status, headers }
}

/// Serves the example's routes with `layer` on a loopback port.
async fn serve_app(layer: RateLimitLayer) -> SocketAddr {
    let app = Router::new()
        .route("/api/demo", get(|| async { "unlimited\n" }))
        .route("/api/limited", get(|| async { "ok\n" }).layer(layer));
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the app");
    let addr = listener.local_addr().expect("app address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
    });
    addr
}

fn client(address: String, policy: FailurePolicy) -> Client {
    Client::builder(address)
        .deadline(Duration::from_millis(500))
        .on_unavailable(policy)
        .build()
        .expect("valid address")
}

#[tokio::test]
async fn a_denial_is_a_429_with_retry_after_and_ratelimit_fields() {
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30 + 100))).await;
    let quotad = client(format!("http://{}", server.grpc_addr), FailurePolicy::Error);
    let layer = RateLimitLayer::new(quotad, "api", KeyExtractor::PeerIp).window_secs(60);
    let app = serve_app(layer).await;

    for remaining in (0..3).rev() {
        let ok = get_with(app, "/api/limited", &[]).await;
        assert_eq!(ok.status, 200);
        assert_eq!(ok.headers["x-ratelimit-remaining"], remaining.to_string());
        assert_eq!(ok.headers["ratelimit-policy"], "\"api\";q=3;w=60");
    }
    let denied = get_with(app, "/api/limited", &[]).await;
    assert_eq!(denied.status, 429);
    // 29.9 s left in the minute: rounded up to whole seconds.
    assert_eq!(denied.headers["retry-after"], "30");
    assert_eq!(denied.headers["ratelimit"], "\"api\";r=0;t=30");
    assert_eq!(denied.headers["ratelimit-policy"], "\"api\";q=3;w=60");
    assert_eq!(denied.headers["x-ratelimit-limit"], "3");
    assert_eq!(denied.headers["x-ratelimit-remaining"], "0");
    assert_eq!(denied.headers["x-ratelimit-reset"], "30");

    let free = get_with(app, "/api/demo", &[]).await;
    assert_eq!(free.status, 200, "the unlimited route is not limited");
    assert!(!free.headers.contains_key("ratelimit"));
}

#[tokio::test]
async fn keys_from_a_header_are_counted_apart() {
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let quotad = client(format!("http://{}", server.grpc_addr), FailurePolicy::Error);
    let key = KeyExtractor::Header(HeaderName::from_static("x-api-key"));
    let app = serve_app(RateLimitLayer::new(quotad, "api", key)).await;
    for _ in 0..3 {
        let r = get_with(app, "/api/limited", &[("x-api-key", "alice")]).await;
        assert_eq!(r.status, 200);
    }
    let alice = get_with(app, "/api/limited", &[("x-api-key", "alice")]).await;
    assert_eq!(alice.status, 429);
    let bob = get_with(app, "/api/limited", &[("x-api-key", "bob")]).await;
    assert_eq!(bob.status, 200);
    let anonymous = get_with(app, "/api/limited", &[]).await;
    assert_eq!(anonymous.status, 400, "no key, no free pass");
}

#[tokio::test]
async fn the_cost_extractor_prices_requests() {
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let quotad = client(format!("http://{}", server.grpc_addr), FailurePolicy::Error);
    let layer = RateLimitLayer::new(quotad, "api", KeyExtractor::PeerIp).cost(|parts| {
        if parts.headers.contains_key("x-expensive") {
            3
        } else {
            1
        }
    });
    let app = serve_app(layer).await;
    let first = get_with(app, "/api/limited", &[("x-expensive", "1")]).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.headers["x-ratelimit-remaining"], "0");
    assert_eq!(get_with(app, "/api/limited", &[]).await.status, 429);
}

#[tokio::test]
async fn a_cost_that_can_never_fit_is_a_429_without_retry_after() {
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let quotad = client(format!("http://{}", server.grpc_addr), FailurePolicy::Error);
    let layer = RateLimitLayer::new(quotad, "api", KeyExtractor::PeerIp).cost(|_| 4);
    let app = serve_app(layer).await;
    let denied = get_with(app, "/api/limited", &[]).await;
    assert_eq!(denied.status, 429);
    assert!(
        !denied.headers.contains_key("retry-after"),
        "waiting never helps a cost above the limit of 3"
    );
    assert_eq!(denied.headers["x-ratelimit-limit"], "3");
}

#[tokio::test]
async fn a_key_quotad_refuses_is_the_callers_fault_and_other_refusals_the_apps() {
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let quotad = client(format!("http://{}", server.grpc_addr), FailurePolicy::Error);
    let key = KeyExtractor::Header(HeaderName::from_static("x-api-key"));
    let app = serve_app(RateLimitLayer::new(quotad.clone(), "api", key)).await;
    let long = "k".repeat(300);
    let refused = get_with(app, "/api/limited", &[("x-api-key", &long)]).await;
    assert_eq!(refused.status, 400, "the key came from the request");

    let unknown = serve_app(RateLimitLayer::new(quotad, "nope", KeyExtractor::PeerIp)).await;
    assert_eq!(
        get_with(unknown, "/api/limited", &[]).await.status,
        500,
        "an unknown policy is the app's misconfiguration"
    );
}

#[tokio::test]
async fn an_app_served_without_peer_addresses_answers_500_not_400() {
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let quotad = client(format!("http://{}", server.grpc_addr), FailurePolicy::Error);
    let layer = RateLimitLayer::new(quotad, "api", KeyExtractor::PeerIp);
    // Served without into_make_service_with_connect_info: no ConnectInfo.
    let app = Router::new().route("/api/limited", get(|| async { "ok\n" }).layer(layer));
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the app");
    let addr = listener.local_addr().expect("app address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    assert_eq!(get_with(addr, "/api/limited", &[]).await.status, 500);
}

/// A loopback address with nothing listening.
async fn dead_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    drop(listener);
    format!("http://{addr}")
}

#[tokio::test(flavor = "current_thread")]
async fn quotad_unreachable_fails_open_and_counts_it() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshots = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let quotad = client(dead_address().await, FailurePolicy::FailOpen);
    let app = serve_app(RateLimitLayer::new(quotad, "api", KeyExtractor::PeerIp)).await;
    let r = get_with(app, "/api/limited", &[]).await;
    assert_eq!(r.status, 200, "fail-open lets the request through");

    let counted: u64 = snapshots
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "quotad_client_unavailable_total")
        .filter(|(key, ..)| key.key().labels().any(|l| l.value() == "fail_open"))
        .map(|(.., value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
    assert_eq!(counted, 1);
}

#[tokio::test]
async fn quotad_unreachable_fails_closed_with_a_503() {
    let quotad = client(dead_address().await, FailurePolicy::FailClosed);
    let app = serve_app(RateLimitLayer::new(quotad, "api", KeyExtractor::PeerIp)).await;
    assert_eq!(get_with(app, "/api/limited", &[]).await.status, 503);
    assert_eq!(get_with(app, "/api/demo", &[]).await.status, 200);
}

/// 1,000 a minute, leases of up to 10.
const LEASED: &str = r#"
[policies.api]
algorithm = "fixed_window"
limit = 1000
window = "1m"
lease = { max_units = 10, max_ttl = "30s" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_decides_from_leases_with_the_same_answers_and_fewer_calls() {
    let server = TestServer::start_toml(LEASED, Arc::new(FakeClock::new(NOON_30))).await;
    let options = quotad_client::LeaseOptions::try_new(10).expect("valid lease options");
    let quotad = Client::builder(format!("http://{}", server.grpc_addr))
        .deadline(Duration::from_secs(5))
        .leases(options)
        .build()
        .expect("valid address");
    let layer = RateLimitLayer::new(quotad, "api", KeyExtractor::PeerIp).window_secs(60);
    let app = serve_app(layer).await;
    for _ in 0..30 {
        let ok = get_with(app, "/api/limited", &[]).await;
        assert_eq!(ok.status, 200);
        assert_eq!(ok.headers["ratelimit-policy"], "\"api\";q=1000;w=60");
        assert!(ok.headers.contains_key("x-ratelimit-remaining"));
    }
    // The direct checks and the lease calls quotad saw are fewer than the
    // 30 requests: the rest were decided from leases, with no call.
    let metrics = server.metrics().await;
    let sum = |name: &str| -> f64 {
        metrics
            .series(name)
            .iter()
            .filter(|(labels, _)| labels.get("policy").map(String::as_str) == Some("api"))
            .map(|(_, v)| v)
            .sum()
    };
    let (checks, leases) = (sum("quotad_decisions_total"), sum("quotad_leases_total"));
    assert!(leases >= 1.0, "{}", metrics.text);
    assert!(
        checks + leases < 30.0,
        "{checks} checks + {leases} lease calls for 30 requests"
    );
}
