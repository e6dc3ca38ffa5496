//! `quotad demo`, run as the built binary on the real clock: the fixed
//! window admits 2 x the limit across a boundary, the sliding window does
//! not.
//!
//! The demo waits for real window boundaries (its windows are 2 s), so each
//! run takes 2-4 s; the demo gives up by itself after about 11 s, and the
//! tests kill it at 60 s.

use std::process::Command;
use std::time::Duration;

use crate::common::TestServer;
use crate::common::process::{Finished, run_within};

const BIN: &str = env!("CARGO_BIN_EXE_quotad");

/// The demo's limit (per 2 s window, under both policies).
const LIMIT: u64 = 10;

async fn demo(args: &[&str]) -> Finished {
    let mut command = Command::new(BIN);
    command.arg("demo").args(args).env_remove("RUST_LOG");
    tokio::task::spawn_blocking(move || run_within(command, Duration::from_secs(60)))
        .await
        .expect("the runner does not panic")
}

/// `(admitted, sent)` from the line that starts with `prefix`, which goes
/// on `<admitted> of <sent>`.
fn admitted(out: &Finished, prefix: &str) -> (u64, u64) {
    let line = out
        .stdout
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?}\n{}", out.transcript()));
    let mut numbers = line
        .split_whitespace()
        .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok());
    match (numbers.next(), numbers.next()) {
        (Some(admitted), Some(sent)) => (admitted, sent),
        _ => panic!("no counts in {line:?}"),
    }
}

/// Every summary the demo prints.
fn assert_the_boundary_attack_shows(out: &Finished) {
    assert_eq!(out.status.code(), Some(0), "{}", out.transcript());

    // 1 and 2 run well inside one window, on fresh keys.
    assert!(
        out.stdout.contains(
            "   => fixed_window admitted 5 of 5, sliding_window admitted 5 of 5\n\n2. an over-limit burst"
        ),
        "{}",
        out.transcript()
    );
    assert!(
        out.stdout
            .contains("   => fixed_window admitted 10 of 15, sliding_window admitted 10 of 15\n"),
        "{}",
        out.transcript()
    );
    assert!(out.stdout.contains("-- window boundary --"));

    // Exact, because the demo reports only an attempt whose timing it
    // verified from quotad's own answers (in the same batch, so at the same
    // instant): all of the first burst before the boundary, all of the
    // second within 100 ms after it, in the very next window. Then the
    // fixed window admits LIMIT on each side: 2 x LIMIT. The sliding window
    // admits LIMIT before the boundary (a fresh key, an empty previous
    // window) and nothing after it: up to 100 ms into a 2 s window the
    // previous window's 10 still weigh round(10 x 1,900 / 2,000) = 10, so
    // the estimate is already at the limit. A busy machine makes the demo
    // try again at the next boundary, never report a skewed attempt.
    assert_eq!(
        admitted(out, "result: fixed_window admitted"),
        (2 * LIMIT, 2 * LIMIT)
    );
    assert_eq!(
        admitted(out, "result: sliding_window admitted"),
        (LIMIT, 2 * LIMIT)
    );
    assert!(out.stdout.contains("2.0 x the limit of 10"));
    assert!(out.stdout.contains("1.0 x the limit of 10"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_with_its_own_quotad_lets_twice_the_limit_through_a_fixed_window_boundary_but_not_a_sliding_one()
 {
    let out = demo(&[]).await;
    assert!(
        out.stdout
            .contains("server: quotad started in this process on http://127.0.0.1:"),
        "{}",
        out.transcript()
    );
    assert_the_boundary_attack_shows(&out);
    assert_eq!(out.stderr, "", "nothing is logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_against_a_running_quotad_shows_the_same_with_inline_policies() {
    let server = TestServer::start(quotad::Config::default()).await;
    let addr = server.grpc_addr.to_string();
    let out = demo(&["--addr", &addr]).await;
    assert!(
        out.stdout.contains(&format!(
            "server: quotad at http://{addr}, with inline policies"
        )),
        "{}",
        out.transcript()
    );
    assert_the_boundary_attack_shows(&out);

    // Fresh keys per run: a second run against the same quotad shows the
    // same, it is not throttled by the first one's state.
    let again = demo(&["--addr", &addr]).await;
    assert_the_boundary_attack_shows(&again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_against_a_quotad_refusing_inline_policies_exits_one_saying_so() {
    let config = quotad::Config::from_toml("[limits]\nallow_inline_policies = false\n")
        .expect("valid config");
    let server = TestServer::start(config).await;
    let addr = server.grpc_addr.to_string();
    let out = demo(&["--addr", &addr]).await;
    assert_eq!(out.status.code(), Some(1), "{}", out.transcript());
    assert!(
        out.stderr.contains(
            "error: quotad refused the request (FAILED_PRECONDITION): items[0].inline_policy: inline policies are disabled"
        ),
        "{}",
        out.transcript()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_grpc_addr_chooses_where_its_own_quotad_listens() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("address").port()
    };
    let addr = format!("127.0.0.1:{port}");
    let out = demo(&["--grpc-addr", &addr]).await;
    assert!(
        out.stdout.contains(&format!(
            "server: quotad started in this process on http://{addr} "
        )),
        "{}",
        out.transcript()
    );
    assert_the_boundary_attack_shows(&out);
    // A port in use is an error naming it, not a demo elsewhere.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = taken.local_addr().expect("address").to_string();
    let out = demo(&["--grpc-addr", &taken]).await;
    assert_eq!(out.status.code(), Some(1), "{}", out.transcript());
    assert!(
        out.stderr.contains(&format!("cannot bind {taken}")),
        "{}",
        out.transcript()
    );
}
