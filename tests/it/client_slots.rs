//! quotad-client's concurrency slots against a real quotad: the guard
//! renews its slot in the background, and releases it when dropped, also
//! on a panic and on a cancelled future; the tower `ConcurrencyLayer`
//! holds a slot for each request's whole duration, to the end of its
//! response body, and answers 429 (or 503, by setting) with `Retry-After`
//! when the key's slots are full. An acquire whose caller stops waiting
//! releases the slot it is answered; a guard whose renewals go unanswered
//! past its TTL says it is lost.

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

[policies.many]
algorithm = "fixed_window"
limit = 1000
window = "1m"
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
    // Held for more than twice its TTL: only renewals keep it, and each
    // answered renewal moves the end the guard counts from.
    let lost = tokio::time::timeout(Duration::from_millis(1_500), guard.lost()).await;
    assert!(lost.is_err(), "renewed, so never lost");
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

/// A TCP proxy in front of quotad whose replies can be held: while held,
/// what quotad sends is kept, and passed on when they are let through;
/// requests always pass.
struct ReplyGate {
    addr: SocketAddr,
    open: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl ReplyGate {
    async fn start(upstream: SocketAddr) -> ReplyGate {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (open, gate) = tokio::sync::watch::channel(true);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut gate = gate.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::io::copy(&mut cr, &mut sw);
                    let down = async move {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if gate.wait_for(|open| *open).await.is_err()
                                || cw.write_all(&buf[..n]).await.is_err()
                            {
                                return;
                            }
                        }
                    };
                    let _ = tokio::join!(up, down);
                });
            }
        });
        ReplyGate { addr, open, task }
    }

    fn hold(&self) {
        self.open.send_replace(false);
    }

    fn pass(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for ReplyGate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A client through `gate`, with a 2 s deadline.
async fn gated_client(server: &TestServer) -> (ReplyGate, Client) {
    let gate = ReplyGate::start(server.grpc_addr).await;
    let client = Client::builder(format!("http://{}", gate.addr))
        .deadline(Duration::from_secs(2))
        .build()
        .expect("a client");
    // The connection is up, its settings exchanged, before replies are held.
    let warm_up = client.peek(&Check::named("long", "warm-up")).await;
    assert_eq!(warm_up.expect("answered").limit, 1);
    (gate, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_caller_stopped_waiting_releases_the_slot_it_gets() {
    let (server, direct) = start().await;
    let (gate, client) = gated_client(&server).await;
    for round in 0..3 {
        let key = format!("gone-{round}");
        // quotad takes the slot and answers; the answer is held, and the
        // caller stops waiting long before the client's 2 s deadline.
        gate.hold();
        let check = Check::named("long", key.as_str());
        let cancelled =
            tokio::time::timeout(Duration::from_millis(300), client.acquire(&check)).await;
        assert!(cancelled.is_err(), "cancelled before the answer came");
        // The slot was taken (a 60 s slot: only a release frees it soon).
        assert!(
            !direct.peek(&check).await.expect("answered").allowed,
            "quotad took the slot"
        );
        gate.pass();
        eventually(
            Duration::from_secs(3),
            "the slot nobody heard of is released",
            || async { direct.peek(&check).await.expect("answered").allowed },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_whose_renewals_go_unanswered_past_its_ttl_is_lost() {
    let (server, _direct) = start().await;
    let (gate, client) = gated_client(&server).await;
    let guard = held(&client, "one", "unheard").await.expect("held");
    assert!(!guard.is_lost());
    // Renewals reach quotad, but none is answered: after the TTL (600 ms)
    // counted from when the last answered one was sent, the slot may have
    // ended. That is before the hold began plus the TTL; 1.5 s leaves room
    // for a loaded machine, and is well before an end counted from the
    // answer's deadline (2 s), which would be the unsafe side.
    gate.hold();
    tokio::time::timeout(Duration::from_millis(1_500), guard.lost())
        .await
        .expect("lost once its TTL passed unrenewed");
    assert!(guard.is_lost());
    // quotad did renew it meanwhile (the requests passed): once answers
    // come again, a renewal finds it live, so it never ended.
    gate.pass();
    eventually(
        Duration::from_secs(5),
        "a renewal answered live holds it again",
        || async { !guard.is_lost() },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_holds_the_slot_until_the_response_body_ends() {
    use axum::body::Body;
    let (_server, client) = start().await;
    let key = KeyExtractor::Header(HeaderName::from_static("x-tenant"));
    let layer = ConcurrencyLayer::new(client.clone(), "long", key);
    let rest = Arc::new(Notify::new());
    let app = Router::new().route(
        "/download",
        get({
            let rest = Arc::clone(&rest);
            move || {
                let rest = Arc::clone(&rest);
                async move {
                    // The head and a first chunk now, the rest later.
                    let chunks = futures_util::stream::unfold(0u8, move |n| {
                        let rest = Arc::clone(&rest);
                        async move {
                            match n {
                                0 => Some((Ok::<_, std::io::Error>("first\n"), 1)),
                                1 => {
                                    rest.notified().await;
                                    Some((Ok("rest\n"), 2))
                                }
                                _ => None,
                            }
                        }
                    });
                    Body::from_stream(chunks)
                }
            }
        })
        .layer(layer),
    );
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the app");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut stream = TcpStream::connect(addr).await.expect("connect to the app");
    let request = format!(
        "GET /download HTTP/1.1\r\nHost: {addr}\r\nx-tenant: big\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&seen).contains("first") {
        let n = stream.read(&mut buf).await.expect("read");
        assert!(n > 0, "the first chunk comes");
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    // The head is out and the body is not over: the slot is still held.
    let check = Check::named("long", "big");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !client.peek(&check).await.expect("answered").allowed,
        "held while the body streams"
    );
    rest.notify_one();
    stream.read_to_end(&mut seen).await.expect("read the rest");
    assert!(String::from_utf8_lossy(&seen).contains("rest"));
    eventually(
        Duration::from_secs(5),
        "released at the body's end",
        || async { client.peek(&check).await.expect("answered").allowed },
    )
    .await;
}

/// `quotad acquire` with `args`, run to its end (at most 30 s).
async fn acquire_command(args: Vec<String>) -> crate::common::process::Finished {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_quotad"));
    command.arg("acquire").args(args).env_remove("RUST_LOG");
    tokio::task::spawn_blocking(move || {
        crate::common::process::run_within(command, Duration::from_secs(30))
    })
    .await
    .expect("the runner does not panic")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acquire_command_prints_json_and_exits_one_when_its_slot_is_lost() {
    let (server, direct) = start().await;
    let addr = server.grpc_addr.to_string();
    let args = |key: &str, hold: &str| -> Vec<String> {
        [
            "--policy",
            "one",
            "--key",
            key,
            "--hold",
            hold,
            "--timeout",
            "1s",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    let mut json = args("j", "300ms");
    json.extend([
        "--addr".to_owned(),
        addr.clone(),
        "--output".to_owned(),
        "json".to_owned(),
    ]);
    let out = acquire_command(json).await;
    assert_eq!(out.status.code(), Some(0), "{}", out.transcript());
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    assert_eq!(lines[0]["outcome"], "acquired");
    assert_eq!(lines[0]["ttl_ms"], 600);
    assert_eq!(lines[0]["slot_id"].as_str().map(str::len), Some(16));
    assert_eq!(lines[1]["outcome"], "released");
    assert_eq!(lines[1]["was_held"], true);
    assert_eq!(lines[1]["slot_id"], lines[0]["slot_id"]);

    // Through a proxy whose replies are then held: renewals go unanswered
    // past the 600 ms TTL, so the slot may have ended; the command says so
    // and exits 1.
    let gate = ReplyGate::start(server.grpc_addr).await;
    let mut lost = args("l", "30s");
    lost.extend(["--addr".to_owned(), gate.addr.to_string()]);
    let run = tokio::spawn(acquire_command(lost));
    eventually(
        Duration::from_secs(10),
        "the command holds its slot",
        || async {
            !direct
                .peek(&Check::named("one", "l"))
                .await
                .expect("answered")
                .allowed
        },
    )
    .await;
    gate.hold();
    let out = run.await.expect("ran");
    assert_eq!(out.status.code(), Some(1), "{}", out.transcript());
    assert!(out.stdout.starts_with("acquired slot="), "{}", out.stdout);
    assert!(out.stdout.contains("\nlost slot="), "{}", out.stdout);
    assert!(out.stderr.contains("may have ended"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_compose_and_the_slot_is_held_until_the_stacks_body_ends() {
    use tower::{ServiceBuilder, ServiceExt as _};
    let (_server, client) = start().await;
    let key = || KeyExtractor::Header(HeaderName::from_static("x-tenant"));
    // A rate limit around a concurrency limit around a service, as tower
    // composes them (no axum between the layers).
    let stack = ServiceBuilder::new()
        .layer(quotad_client::RateLimitLayer::new(
            client.clone(),
            "many",
            key(),
        ))
        .layer(ConcurrencyLayer::new(client.clone(), "long", key()))
        .service_fn(|_request: http::Request<String>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new("body".to_owned()))
        });
    let request = || {
        http::Request::builder()
            .header("x-tenant", "stacked")
            .body(String::new())
            .expect("a request")
    };
    let response = stack.clone().oneshot(request()).await.expect("answered");
    assert_eq!(response.status(), 200);
    assert!(response.body().holds_slot(), "the body holds the slot");
    let check = Check::named("long", "stacked");
    assert!(!client.peek(&check).await.expect("answered").allowed);
    let full = stack.clone().oneshot(request()).await.expect("answered");
    assert_eq!(full.status(), 429, "one at a time");
    assert!(!full.body().holds_slot());
    // Taken out of the stack's body, the inner one no longer holds it.
    assert_eq!(response.into_body().into_inner(), "body");
    eventually(
        Duration::from_secs(5),
        "released at the body's end",
        || async { client.peek(&check).await.expect("answered").allowed },
    )
    .await;
}
