//! quotad started before Redis (`store.redis.required_at_start = false`,
//! the default): it serves from the start, each check answering its
//! policy's `on_error`, reports not ready while readiness follows the
//! store, connects in the background, and decides exactly from the first
//! answer on. The outage is logged once, and its end.

use std::time::{Duration, Instant};

use quotad_client::{Check, Client, Reason};

use crate::common::binary::Server;
use crate::common::http_get;
use crate::common::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotad_started_before_redis_serves_on_error_then_decides_exactly_once_redis_runs() {
    let port = RedisServer::free_port();
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("quotad.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nreadiness_follows_store = true\n\n[store]\nbackend = \"redis\"\n\n[store.redis]\nurl = \"redis://127.0.0.1:{port}/0\"\ntimeout = \"200ms\"\n\n[policies.api]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1h\"\non_error = \"fail_closed\"\n"
        ),
    )
    .expect("write config");
    let config = config.to_string_lossy().into_owned();
    let mut server = Server::spawn(&[
        "serve",
        "-c",
        &config,
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ]);
    let ((grpc, admin), mut lines) = server.addresses_and_log();
    let client = Client::builder(format!("http://{grpc}"))
        .deadline(Duration::from_secs(2))
        .deny_cache(0)
        .build()
        .expect("client");
    let check = Check::named("api", "k");

    // Serving without Redis: every check answers on_error, at once, and
    // readiness says so.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let decision = client.check(&check).await.expect("answered");
        assert_eq!(
            (decision.allowed, decision.reason),
            (false, Reason::FailClosed)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(http_get(admin, "/readyz").await.0, 503);

    let _redis = RedisServer::start_on(port);
    // Decided exactly from the first answer on: the first decision made by
    // Redis has 4 left, and each one after it one less.
    let first = loop {
        let decision = client.check(&check).await.expect("answered");
        if decision.reason != Reason::FailClosed {
            break decision;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never connected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((first.allowed, first.remaining), (true, 4), "{first:?}");
    for left in (0..4).rev() {
        let decision = client.check(&check).await.expect("answered");
        assert_eq!((decision.allowed, decision.remaining), (true, left));
    }
    let over = client.check(&check).await.expect("answered");
    assert_eq!((over.allowed, over.reason), (false, Reason::LimitExceeded));
    crate::common::eventually(Duration::from_secs(10), "/readyz turns 200", || async {
        http_get(admin, "/readyz").await.0 == 200
    })
    .await;

    server.signal("TERM");
    assert_eq!(server.wait(Duration::from_secs(10)).code(), Some(0));
    lines.extend(server.lines.try_iter());
    let warned = lines
        .iter()
        .filter(|l| l.contains("WARN") && l.contains("cannot connect to redis"))
        .count();
    assert_eq!(warned, 1, "the outage is logged once: {lines:#?}");
    assert!(
        lines.iter().any(|l| l.contains("the outage is over")),
        "{lines:#?}"
    );
}
