//! quotad-client's concurrency slots against a real quotad: the guard
//! renews its slot in the background, and releases it when dropped, also
//! on a panic and on a cancelled future; the tower `ConcurrencyLayer`
//! holds a slot for each request's whole duration and answers 429 (or 503,
//! by setting) with `Retry-After` when the key's slots are full.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::{HeaderName, StatusCode};
use quotad_client::{Acquired, Check, Client, ConcurrencyLayer, KeyExtractor, SlotGuard};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::common::{TestServer, eventually};

/// `one`: one in flight per key, slots of 600 ms; `long`: slots of 60 s,
/// which only a release frees within a test.
const CONFIG: &str = r#"
[policies.one]
algorithm = "concurrency"
limit = 1
slot_ttl = "600ms"

[policies.long]
algorithm = "concurrency"
limit = 1
slot_ttl = "60s"
"#;

async fn start() -> (TestServer, Client) {
    let server = TestServer::start_toml(CONFIG, Arc::new(quotad_core::SystemClock)).await;
    let client = Client::builder(format!("http://{}", server.grpc_addr))
        .build()
        .expect("a client");
    (server, client)
}

async fn held(client: &Client, policy: &str, key: &str) -> Option<SlotGuard> {
    match client
        .acquire(&Check::named(policy, key))
        .await
        .expect("answered")
    {
        Acquired::Held(guard) => Some(guard),
        Acquired::Denied(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_renews_its_slot_and_releases_it_when_dropped() {
    let (_server, client) = start().await;
    let guard = held(&client, "one", "k").await.expect("the first is held");
    assert_eq!(guard.slot_id().len(), 16);
    // Held for more than twice its TTL: only renewals keep it.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(!guard.is_lost());
    assert!(held(&client, "one", "k").await.is_none(), "still held");
    drop(guard);
    eventually(
        Duration::from_millis(400),
        "the dropped slot is free",
        || async { held(&client, "one", "k").await.is_some() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_or_a_cancelled_future_releases_the_slot() {
    let (_server, client) = start().await;
    // A panic while holding the slot drops the guard.
    let c = client.clone();
    let panicked = tokio::spawn(async move {
        let _guard = held(&c, "long", "p").await.expect("held");
        panic!("the work failed");
    })
    .await;
    assert!(panicked.is_err());
    eventually(
        Duration::from_secs(2),
        "the panicked holder's slot is free",
        || async {
            match held(&client, "long", "p").await {
                Some(guard) => guard.release().await.expect("released"),
                None => false,
            }
        },
    )
    .await;
    // A future cancelled while it holds the slot drops the guard too.
    let c = client.clone();
    let cancelled = tokio::time::timeout(Duration::from_millis(200), async move {
        let _guard = held(&c, "long", "c").await.expect("held");
        tokio::time::sleep(Duration::from_secs(3_600)).await;
    })
    .await;
    assert!(cancelled.is_err(), "timed out, so cancelled");
    eventually(
        Duration::from_secs(2),
        "the cancelled holder's slot is free",
        || async {
            match held(&client, "long", "c").await {
                Some(guard) => guard.release().await.expect("released"),
                None => false,
            }
        },
    )
    .await;
}

/// Status and `Retry-After` of a GET over a fresh connection.
async fn get_status(addr: SocketAddr, tenant: &str) -> (u16, Option<String>) {
    let mut stream = TcpStream::connect(addr).await.expect("connect to the app");
    let request = format!(
        "GET /export HTTP/1.1\r\nHost: {addr}\r\nx-tenant: {tenant}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    let raw = String::from_utf8(raw).expect("UTF-8");
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let retry = raw.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("retry-after: ")
            .map(str::to_owned)
    });
    (status, retry)
}

async fn serve(layer: ConcurrencyLayer, gate: Arc<Notify>) -> SocketAddr {
    let app = Router::new().route(
        "/export",
        get(move || {
            let gate = Arc::clone(&gate);
            async move {
                gate.notified().await;
                "exported\n"
            }
        })
        .layer(layer),
    );
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the app");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_holds_a_slot_per_request_and_answers_full_by_setting() {
    let (_server, client) = start().await;
    for (when_full, expected) in [
        (StatusCode::TOO_MANY_REQUESTS, 429),
        (StatusCode::SERVICE_UNAVAILABLE, 503),
    ] {
        let key = KeyExtractor::Header(HeaderName::from_static("x-tenant"));
        let layer = ConcurrencyLayer::new(client.clone(), "long", key).when_full(when_full);
        let gate = Arc::new(Notify::new());
        let addr = serve(layer, Arc::clone(&gate)).await;
        let tenant = format!("t{expected}");
        let first = {
            let tenant = tenant.clone();
            tokio::spawn(async move { get_status(addr, &tenant).await })
        };
        // While the first is in the handler, its slot is held (probed with
        // Peek, which takes no slot: a probe that acquired one would race
        // the request it watches).
        eventually(
            Duration::from_secs(5),
            "the first holds its slot",
            || async {
                !client
                    .peek(&Check::named("long", tenant.as_str()))
                    .await
                    .expect("answered")
                    .allowed
            },
        )
        .await;
        let (status, retry) = get_status(addr, &tenant).await;
        assert_eq!(status, expected);
        let retry: u64 = retry.expect("Retry-After").trim().parse().expect("seconds");
        assert!((1..=60).contains(&retry), "{retry}");
        // Another tenant has its own slot.
        let other = tokio::spawn(async move { get_status(addr, "someone-else").await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        gate.notify_waiters();
        assert_eq!(first.await.expect("first").0, 200);
        assert_eq!(other.await.expect("other").0, 200);
        // Done: the slot is released with the response (the release call
        // goes out as the response does; wait for it to land rather than
        // race it).
        eventually(Duration::from_secs(5), "the slot is released", || async {
            client
                .peek(&Check::named("long", tenant.as_str()))
                .await
                .expect("answered")
                .allowed
        })
        .await;
        let next = tokio::spawn({
            let tenant = tenant.clone();
            async move { get_status(addr, &tenant).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        gate.notify_waiters();
        assert_eq!(next.await.expect("next").0, 200);
    }
}
