//! Any language can use quotad through the proto: the Python example
//! (`examples/python/quotad_check.py`, stubs generated from
//! `crates/quotad-proto/proto/` at run time by grpcio-tools) against a real
//! quotad.
//!
//! Needs python3 with grpcio and grpcio-tools. Without them the test fails
//! with the command that installs them; it never skips.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::common::process::run_within;
use crate::common::{NOON_30, TestServer};
use quotad_core::FakeClock;
use serde_json::Value;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/python/quotad_check.py"
);

const HOW_TO_INSTALL: &str = "this test needs python3 with the grpcio and grpcio-tools modules: \
     install them with `pip install -r examples/python/requirements.txt`, \
     or run scripts/test.sh, which installs them when missing";

/// A fixed window of 3 per minute; at NOON_30 it has 30 s left.
const CONFIG: &str = r#"
[policies.checkout]
algorithm = "fixed_window"
limit = 3
window = "1m"
"#;

/// Fails the test, saying how to get them, unless python3 can import the
/// gRPC modules.
fn require_python_grpc() {
    let mut probe = Command::new("python3");
    probe.args(["-c", "import grpc, grpc_tools"]);
    let probed = match probe.output() {
        Ok(output) => output,
        Err(error) => panic!("cannot run python3 ({error}); {HOW_TO_INSTALL}"),
    };
    assert!(
        probed.status.success(),
        "python3 cannot import grpc and grpc_tools ({}); {HOW_TO_INSTALL}",
        String::from_utf8_lossy(&probed.stderr)
            .lines()
            .last()
            .unwrap_or("no message")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_gets_the_same_decisions_as_any_client() {
    require_python_grpc();
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let addr = server.grpc_addr.to_string();
    // Its own temporary folder, to see that the script leaves nothing there.
    let tmp = tempfile::tempdir().expect("a temporary folder");
    let mut command = Command::new("python3");
    command.args([
        SCRIPT, "--addr", &addr, "--policy", "checkout", "--key", "cart-7", "--count", "5",
    ]);
    command.env("TMPDIR", tmp.path());
    // Blocking, so the test server keeps serving on the runtime meanwhile;
    // generating the stubs takes a second or two.
    let out = tokio::task::spawn_blocking(move || run_within(command, Duration::from_secs(120)))
        .await
        .expect("the runner does not panic");
    assert_eq!(out.status.code(), Some(0), "{}", out.transcript());

    let decisions: Vec<Value> = out
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object a line"))
        .collect();
    assert_eq!(decisions.len(), 5, "{}", out.transcript());
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("the temporary folder is readable")
        .collect();
    assert!(left.is_empty(), "the script left {left:?} behind");
    for (i, decision) in decisions.iter().enumerate() {
        let admitted = i < 3;
        let expected = serde_json::json!({
            "allowed": admitted,
            "limit": 3,
            "remaining": if admitted { 2 - i } else { 0 },
            "retry_after_ms": if admitted { 0 } else { 30_000 },
            "reset_after_ms": 30_000,
            "reason": if admitted { "REASON_WITHIN_LIMIT" } else { "REASON_LIMIT_EXCEEDED" },
        });
        assert_eq!(decision, &expected, "decision {}", i + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_reports_an_unknown_policy_and_exits_one() {
    require_python_grpc();
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let addr = server.grpc_addr.to_string();
    let mut command = Command::new("python3");
    command.args([SCRIPT, "--addr", &addr, "--policy", "nope", "--key", "k"]);
    let out = tokio::task::spawn_blocking(move || run_within(command, Duration::from_secs(120)))
        .await
        .expect("the runner does not panic");
    assert_eq!(out.status.code(), Some(1), "{}", out.transcript());
    assert_eq!(out.stdout, "");
    assert!(
        out.stderr
            .contains("quotad error: NOT_FOUND: policy_name: no policy named \"nope\""),
        "{}",
        out.transcript()
    );
}
