//! The server's lifecycle as load balancers and log collectors see it:
//! `server.shutdown_delay` (not ready but still serving, then draining),
//! `--log-format json` (one JSON object a line) and `--log-level`.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{NOON_30, TestServer, check, eventually, named};
use quotad::Config;
use quotad_core::FakeClock;
use tonic_health::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

const CONFIG: &str = r#"
[server]
shutdown_delay = "3s"

[policies.api]
algorithm = "fixed_window"
limit = 100
window = "1m"
"#;

const PATIENCE: Duration = Duration::from_secs(10);

#[tokio::test]
async fn during_the_shutdown_delay_health_says_not_serving_and_calls_still_succeed() {
    let mut server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let mut client = server.client().await;
    let mut health = HealthClient::new(server.channel().await);
    assert!(check(&mut client, named("k", "api", None)).await.allowed);

    server.trigger_shutdown();
    eventually(PATIENCE, "/readyz turns 503", || async {
        server.get("/readyz").await.0 == 503
    })
    .await;
    let status = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health answers during the delay")
        .into_inner()
        .status;
    assert_eq!(status, ServingStatus::NotServing as i32);

    // Still serving: on an open connection, and on a new one (the listener
    // stays open until the delay ends).
    assert!(check(&mut client, named("k", "api", None)).await.allowed);
    let mut fresh = server.client().await;
    assert!(check(&mut fresh, named("k", "api", None)).await.allowed);
    drop((client, fresh, health));

    // Then it drains and run returns Ok.
    server.join().await.expect("run returns Ok after the delay");
}

#[tokio::test]
async fn json_logs_are_one_object_a_line() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_quotad"))
        .args([
            "serve",
            "--log-format",
            "json",
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .env_remove("RUST_LOG")
        .env_remove("QUOTAD_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start quotad");
    let pid = child.id();
    let stderr = child.stderr.take().expect("piped stderr");
    let lines = tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.expect("a line of stderr");
            let serving = line.contains("quotad serving");
            lines.push(line);
            if serving {
                // Ask for a graceful stop (the process this test started,
                // by its id), then read what it logs until it exits.
                let stopped = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .expect("kill runs");
                assert!(stopped.success());
            }
        }
        lines
    });
    let Ok(lines) = tokio::time::timeout(PATIENCE, lines).await else {
        let _ = child.kill();
        panic!("quotad did not start and stop within {PATIENCE:?}");
    };
    let lines = lines.expect("the reader finishes");
    let status = child.wait().expect("quotad exits");
    assert!(status.success(), "graceful exit: {status}; {lines:?}");

    assert!(lines.len() >= 2, "{lines:?}");
    for line in &lines {
        let object: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(object.is_object(), "{line}");
        assert!(
            object.get("level").is_some() && object.get("fields").is_some(),
            "{line}"
        );
    }
    assert!(
        lines.iter().any(|l| l.contains("quotad serving")),
        "{lines:?}"
    );
}

/// `--log-level error` keeps the info lines (the "serving" line) out and
/// the errors in: a bad snapshot file is logged at error level at start,
/// and the server then serves (its admin port answers) without a word more.
#[tokio::test]
async fn log_level_error_keeps_info_lines_out_and_errors_in() {
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("quotad.snapshot");
    std::fs::write(&snapshot, b"not a snapshot").expect("write");
    let config = dir.path().join("quotad.toml");
    std::fs::write(&config, format!("[store.snapshot]\npath = {snapshot:?}\n"))
        .expect("write config");
    let admin = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        probe.local_addr().expect("address")
    };
    let mut server = crate::common::binary::Server::spawn(&[
        "serve",
        "--config",
        &config.to_string_lossy(),
        "--log-level",
        "error",
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        &admin.to_string(),
    ]);
    eventually(PATIENCE, "the admin port answers", || async {
        match tokio::net::TcpStream::connect(admin).await {
            Ok(_) => crate::common::http_get(admin, "/readyz").await.0 == 200,
            Err(_) => false,
        }
    })
    .await;
    server.signal("TERM");
    assert!(server.wait(PATIENCE).success());
    let lines: Vec<String> = server.lines.try_iter().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("ERROR") && l.contains("quotad.snapshot")),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| !l.contains(" INFO ") && !l.contains("quotad serving")),
        "{lines:?}"
    );
}

#[tokio::test]
async fn a_stream_that_never_ends_cannot_hold_a_shutdown_past_the_drain_timeout() {
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("quotad.snapshot");
    let config = Config::from_toml(&format!(
        "[transport]\ndrain_timeout = \"300ms\"\n[store.snapshot]\npath = {snapshot:?}\n"
    ))
    .expect("valid config");
    let mut server = TestServer::start(config).await;
    let mut health = HealthClient::new(server.channel().await);
    // Client-side health checking keeps a Watch open for good.
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("watch")
        .into_inner();
    assert!(watch.message().await.expect("a status").is_some());
    std::fs::remove_file(&snapshot).expect("written at start");
    server.trigger_shutdown();
    // TestServer::join gives up after 10 s.
    server.join().await.expect("stops cleanly");
    assert!(snapshot.exists(), "the last snapshot was written");
    // The stream ended with the server: its connection was closed, not
    // left running in a task of its own. (Statuses sent before, such as
    // NOT_SERVING at the start of the shutdown, may still be read first.)
    let mut statuses = 0;
    loop {
        let next = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .expect("the Watch stream ended once quotad stopped");
        match next {
            Ok(Some(_)) if statuses < 10 => statuses += 1,
            Ok(Some(status)) => panic!("the stream goes on: {status:?}"),
            Ok(None) | Err(_) => break,
        }
    }
}
