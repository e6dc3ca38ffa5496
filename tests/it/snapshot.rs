//! A restart keeps every budget: the memory store written to
//! `[store.snapshot] path` on shutdown (and every `interval`), loaded on
//! start. Servers on a fake clock for exact decisions; the built binary
//! and SIGKILL for a crash.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quotad::Config;
use quotad_core::FakeClock;
use quotad_proto::v1 as pb;

use crate::common::binary::Server;
use crate::common::{NOON_30, TestServer, check, eventually, named, peek};

fn config(path: &Path, extra: &str) -> String {
    format!(
        r#"
[store.snapshot]
path = {path:?}
{extra}

[policies.per_minute]
algorithm = "fixed_window"
limit = 5
window = "1m"

[policies.exact]
algorithm = "sliding_log"
limit = 4
window = "10s"
"#
    )
}

async fn start(path: &Path, extra: &str, clock: &Arc<FakeClock>) -> TestServer {
    TestServer::start_toml(&config(path, extra), clock.clone()).await
}

#[tokio::test]
async fn a_half_spent_budget_is_the_same_after_a_graceful_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("quotad.snapshot");
    let clock = Arc::new(FakeClock::new(NOON_30));
    let server = start(&path, "", &clock).await;
    let mut client = server.client().await;
    for _ in 0..3 {
        assert!(
            check(&mut client, named("alice", "per_minute", None))
                .await
                .allowed
        );
    }
    for _ in 0..4 {
        assert!(
            check(&mut client, named("alice", "exact", None))
                .await
                .allowed
        );
        clock.advance(Duration::from_secs(1));
    }
    let before = peek(&mut client, named("alice", "per_minute", None)).await;
    let denied = check(&mut client, named("alice", "exact", None)).await;
    assert!(!denied.allowed);
    server
        .shutdown()
        .await
        .expect("a clean stop writes the snapshot");
    assert!(path.exists());

    clock.advance(Duration::from_secs(2));
    let server = start(&path, "", &clock).await;
    let mut client = server.client().await;
    let after = peek(&mut client, named("alice", "per_minute", None)).await;
    assert_eq!(after.remaining, 2, "3 of 5 spent before the restart");
    assert_eq!(after.reset_after_ms, before.reset_after_ms - 2_000);
    let exact = check(&mut client, named("alice", "exact", None)).await;
    assert!(!exact.allowed, "the log's admissions survived");
    assert_eq!(exact.retry_after_ms, denied.retry_after_ms - 2_000);
    let metrics = server.metrics().await;
    assert_eq!(
        metrics.value(
            "quotad_snapshot_loaded_entries_total",
            &[("outcome", "loaded")]
        ),
        2.0
    );
}

/// The decisions of `steps` against one server, restarted after step
/// `restart_after` when given: (key, policy, cost, ms to advance after).
async fn decisions(
    path: &Path,
    steps: &[(&str, &str, u64, u64)],
    restart_after: Option<usize>,
) -> Vec<(bool, u64, u64)> {
    let clock = Arc::new(FakeClock::new(NOON_30 + 29_000));
    let mut server = start(path, "", &clock).await;
    let mut client = server.client().await;
    let mut out = Vec::new();
    for (i, &(key, policy, cost, advance)) in steps.iter().enumerate() {
        let d = check(&mut client, named(key, policy, Some(cost))).await;
        out.push((d.allowed, d.remaining, d.retry_after_ms));
        clock.advance(Duration::from_millis(advance));
        if restart_after == Some(i) {
            server.shutdown().await.expect("clean stop");
            server = start(path, "", &clock).await;
            client = server.client().await;
        }
    }
    out
}

#[tokio::test]
async fn the_window_boundary_and_the_sliding_log_decide_as_if_there_had_been_no_restart() {
    // A burst before the minute's end, the restart, a burst after it; the
    // same for the exact log across its window.
    let mut steps = Vec::new();
    for _ in 0..5 {
        steps.push(("b", "per_minute", 1, 10));
        steps.push(("b", "exact", 1, 10));
    }
    // Across the minute's boundary, with the restart.
    steps[9].3 = 1_000;
    for _ in 0..7 {
        steps.push(("b", "per_minute", 1, 10));
        steps.push(("b", "exact", 1, 2_000));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let uninterrupted = decisions(&dir.path().join("a.snapshot"), &steps, None).await;
    let restarted = decisions(&dir.path().join("b.snapshot"), &steps, Some(9)).await;
    assert_eq!(restarted, uninterrupted);
    // The fixed window's boundary burst is there on both sides: 5 before
    // the minute's end and 5 after it.
    let fixed_admitted = uninterrupted
        .iter()
        .step_by(2)
        .filter(|(allowed, _, _)| *allowed)
        .count();
    assert_eq!(fixed_admitted, 10);
}

/// A snapshot file damaged in one of the ways a disk or an operator can.
fn damage(path: &Path, how: &str) {
    let mut bytes = std::fs::read(path).expect("read the snapshot");
    match how {
        "truncated" => bytes.truncate(bytes.len() / 2),
        "corrupt" => {
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
        }
        "wrong version" => bytes[8] = bytes[8].wrapping_add(1),
        "not a snapshot" => bytes = b"quotad was here\n".to_vec(),
        other => panic!("no damage {other}"),
    }
    std::fs::write(path, bytes).expect("write the damaged snapshot");
}

async fn a_written_snapshot(path: &Path, clock: &Arc<FakeClock>) {
    let server = start(path, "", clock).await;
    let mut client = server.client().await;
    assert!(
        check(&mut client, named("carol", "per_minute", Some(5)))
            .await
            .allowed
    );
    server.shutdown().await.expect("clean stop");
}

#[tokio::test]
async fn a_bad_snapshot_starts_empty_loudly_by_default_or_refuses_to_start() {
    for how in ["truncated", "corrupt", "wrong version", "not a snapshot"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("quotad.snapshot");
        let clock = Arc::new(FakeClock::new(NOON_30));
        a_written_snapshot(&path, &clock).await;
        damage(&path, how);

        let server = start(&path, "", &clock).await;
        let mut client = server.client().await;
        let fresh = peek(&mut client, named("carol", "per_minute", None)).await;
        assert_eq!(fresh.remaining, 5, "{how}: started empty");
        let metrics = server.metrics().await;
        assert_eq!(
            metrics.value("quotad_snapshot_load_failures_total", &[]),
            1.0,
            "{how}"
        );
        server.shutdown().await.expect("clean stop");

        damage(&path, how);
        let refusing = Config::from_toml(&config(&path, "on_bad_file = \"refuse\""))
            .expect("valid")
            .with_clock(clock.clone());
        let listeners = quotad::Listeners::loopback().await.expect("bind");
        let error = quotad::run(refusing, listeners, std::future::pending())
            .await
            .expect_err("refuses to start");
        let message = error.to_string();
        assert!(
            matches!(error, quotad::Error::Snapshot(_)),
            "{how}: {message}"
        );
        assert!(message.contains(&path.display().to_string()), "{message}");
    }
}

#[tokio::test]
async fn an_unreadable_snapshot_is_a_bad_one_and_a_missing_one_is_none_yet() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(FakeClock::new(NOON_30));
    // A folder where the file should be: it exists, and cannot be read.
    let folder = dir.path().join("a-folder");
    std::fs::create_dir(&folder).expect("mkdir");
    let refusing = Config::from_toml(&config(&folder, "on_bad_file = \"refuse\""))
        .expect("valid")
        .with_clock(clock.clone());
    let listeners = quotad::Listeners::loopback().await.expect("bind");
    let error = quotad::run(refusing, listeners, std::future::pending())
        .await
        .expect_err("refuses to start");
    assert!(error.to_string().contains("a-folder"), "{error}");

    let missing = dir.path().join("not-yet.snapshot");
    let server = start(&missing, "on_bad_file = \"refuse\"", &clock).await;
    let metrics = server.metrics().await;
    assert_eq!(
        metrics.value("quotad_snapshot_load_failures_total", &[]),
        0.0
    );
    server.shutdown().await.expect("clean stop");
    assert!(missing.exists(), "written on shutdown");
}

#[tokio::test]
async fn entries_of_removed_and_changed_policies_are_loaded_and_counted() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("quotad.snapshot");
    let clock = Arc::new(FakeClock::new(NOON_30));
    let server = start(&path, "", &clock).await;
    let mut client = server.client().await;
    assert!(
        check(&mut client, named("dave", "per_minute", Some(2)))
            .await
            .allowed
    );
    assert!(
        check(&mut client, named("dave", "exact", None))
            .await
            .allowed
    );
    server.shutdown().await.expect("clean stop");

    // per_minute's limit is raised, exact is gone.
    let changed = format!(
        "[store.snapshot]\npath = {path:?}\n\n[policies.per_minute]\nalgorithm = \"fixed_window\"\nlimit = 8\nwindow = \"1m\"\n"
    );
    let server = TestServer::start_toml(&changed, clock.clone()).await;
    let metrics = server.metrics().await;
    let loaded = |outcome| {
        metrics.value(
            "quotad_snapshot_loaded_entries_total",
            &[("outcome", outcome)],
        )
    };
    assert_eq!(loaded("loaded"), 2.0);
    assert_eq!(loaded("policy_changed"), 1.0);
    assert_eq!(loaded("policy_removed"), 1.0);
    let mut client = server.client().await;
    // As after a reload: the count stands, the new limit applies.
    let d = peek(&mut client, named("dave", "per_minute", None)).await;
    assert_eq!(d.remaining, 6);
}

/// A folder for the binary: its config, whose snapshots go to `snapshot`
/// every `interval` ("0s": only on shutdown).
struct Files {
    _dir: tempfile::TempDir,
    snapshot: std::path::PathBuf,
    config: String,
}

fn binary_files(interval: &str) -> Files {
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshot = dir.path().join("quotad.snapshot");
    let text = format!(
        r#"
[server]
grpc_addr = "127.0.0.1:0"
admin_addr = "127.0.0.1:0"

[store.snapshot]
path = {snapshot:?}
interval = "{interval}"

[policies.per_day]
algorithm = "fixed_window"
limit = 100
window = "1d"
"#
    );
    let path = dir.path().join("quotad.toml");
    std::fs::write(&path, text).expect("write config");
    Files {
        config: path.to_string_lossy().into_owned(),
        snapshot,
        _dir: dir,
    }
}

async fn spend(grpc: std::net::SocketAddr, key: &str, n: u64) {
    let mut client = quotad_proto::v1::quota_client::QuotaClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    for _ in 0..n {
        assert!(
            check(&mut client, named(key, "per_day", None))
                .await
                .allowed
        );
    }
}

async fn remaining(grpc: std::net::SocketAddr, key: &str) -> u64 {
    let mut client = quotad_proto::v1::quota_client::QuotaClient::connect(format!("http://{grpc}"))
        .await
        .expect("connect");
    let d: pb::Decision = peek(&mut client, named(key, "per_day", None)).await;
    d.remaining
}

async fn snapshot_written_after(admin: std::net::SocketAddr, after_s: f64) {
    eventually(Duration::from_secs(10), "a periodic snapshot", || async {
        let (_, body) = crate::common::http_get(admin, "/metrics").await;
        crate::common::Metrics::parse(&body)
            .get("quotad_snapshot_last_write_timestamp_seconds", &[])
            .is_some_and(|at| at > after_s)
    })
    .await;
}

fn now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64()
}

#[tokio::test]
async fn a_crash_loses_at_most_what_came_after_the_last_periodic_snapshot() {
    let Files { config, .. } = &binary_files("200ms");
    let mut server = Server::spawn(&["serve", "--config", config]);
    let (grpc, admin) = server.addresses();
    spend(grpc, "erin", 10).await;
    snapshot_written_after(admin, now_s()).await;
    // Five more, then SIGKILL before a snapshot can take them.
    spend(grpc, "erin", 5).await;
    server.signal("KILL");
    let status = server.wait(Duration::from_secs(10));
    assert!(!status.success());

    let server = Server::spawn(&["serve", "--config", config]);
    let (grpc, _) = server.addresses();
    let left = remaining(grpc, "erin").await;
    assert!(
        (85..=90).contains(&left),
        "the 10 spent before the last snapshot survived; at most the 5 after it are lost: {left} left"
    );
}

#[tokio::test]
async fn sigterm_writes_the_snapshot_that_the_next_start_loads() {
    let Files {
        snapshot, config, ..
    } = &binary_files("0s");
    // No periodic snapshots: only the shutdown writes one.
    let mut server = Server::spawn(&["serve", "--config", config]);
    let (grpc, _) = server.addresses();
    spend(grpc, "frank", 7).await;
    // Start wrote one (proving the folder writable): gone, so that what is
    // found after the shutdown was written by it.
    std::fs::remove_file(snapshot).expect("the start's snapshot");
    server.signal("TERM");
    let status = server.wait(Duration::from_secs(20));
    assert!(status.success(), "{status:?}");
    assert!(snapshot.exists(), "written on SIGTERM");

    let server = Server::spawn(&["serve", "--config", config]);
    let (grpc, _) = server.addresses();
    assert_eq!(remaining(grpc, "frank").await, 93);
}

#[tokio::test]
async fn refusing_a_bad_snapshot_exits_two_naming_the_file() {
    let Files {
        snapshot, config, ..
    } = &binary_files("200ms");
    std::fs::write(snapshot, b"not a snapshot at all").expect("write");
    let mut server = Server::spawn(&[
        "serve",
        "--config",
        config,
        "--snapshot-on-bad-file",
        "refuse",
    ]);
    let status = server.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(2));
    let log: Vec<String> = server.lines.try_iter().collect();
    assert!(
        log.iter()
            .any(|l| l.contains("quotad.snapshot") && l.contains("not a quotad snapshot")),
        "{log:?}"
    );
}

#[tokio::test]
async fn a_snapshot_folder_quotad_cannot_write_to_stops_it_at_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let nowhere = dir.path().join("no-such-folder").join("quotad.snapshot");
    let config = Config::from_toml(&config(&nowhere, ""))
        .expect("valid")
        .with_clock(Arc::new(FakeClock::new(NOON_30)));
    let listeners = quotad::Listeners::loopback().await.expect("bind");
    let error = quotad::run(config, listeners, std::future::pending())
        .await
        .expect_err("refuses to serve");
    assert!(matches!(error, quotad::Error::SnapshotWrite(_)), "{error}");
    assert!(error.to_string().contains("no-such-folder"), "{error}");
}

#[tokio::test]
async fn a_bad_snapshot_is_kept_aside_and_a_crashs_leftovers_are_removed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("quotad.snapshot");
    let clock = Arc::new(FakeClock::new(NOON_30));
    a_written_snapshot(&path, &clock).await;
    damage(&path, "corrupt");
    let damaged = std::fs::read(&path).expect("read");
    let leftover = dir.path().join(".quotad-snapshot-quotad.snapshot.A1b2C3d4");
    std::fs::write(&leftover, b"half a snapshot").expect("write");
    // Other quotads' snapshots, of other names (one that starts with this
    // one's), being written there.
    let theirs = dir.path().join(".quotad-snapshot-other.snapshot.E5f6G7h8");
    std::fs::write(&theirs, b"half of another snapshot").expect("write");
    let longer = dir
        .path()
        .join(".quotad-snapshot-quotad.snapshot.2.E5f6G7h8");
    std::fs::write(&longer, b"half of another snapshot").expect("write");

    let server = start(&path, "", &clock).await;
    // Serving: the start, with its load, is over.
    let mut client = server.client().await;
    let fresh = peek(&mut client, named("carol", "per_minute", None)).await;
    assert_eq!(fresh.remaining, 5);
    let aside = dir.path().join("quotad.snapshot.bad");
    assert_eq!(
        std::fs::read(&aside).expect("kept aside"),
        damaged,
        "the bad file is kept for an operator, not overwritten"
    );
    assert!(!leftover.exists(), "the crash's leftover is gone");
    assert!(
        theirs.exists(),
        "another snapshot's file in progress is left alone"
    );
    assert!(
        longer.exists(),
        "so is one of a snapshot whose name starts with this one's"
    );
    server.shutdown().await.expect("clean stop");
    assert!(path.exists(), "a good snapshot in its place");

    // A second bad file is kept under a name of its own: the first one
    // (perhaps the only copy of counts a downgrade could not read) stays.
    damage(&path, "truncated");
    let damaged_again = std::fs::read(&path).expect("read");
    assert_ne!(damaged_again, damaged);
    let server = start(&path, "", &clock).await;
    server.client().await;
    assert_eq!(std::fs::read(&aside).expect("the first kept"), damaged);
    assert_eq!(
        std::fs::read(dir.path().join("quotad.snapshot.bad.2")).expect("the second kept"),
        damaged_again
    );
    server.shutdown().await.expect("clean stop");
}
