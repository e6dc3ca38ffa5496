//! `quotad check` and `quotad peek`: the built binary against a real
//! quotad on loopback. One decision a line; exit 0 whenever quotad
//! answered, 1 when it could not or refused, 2 for bad input.

use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::common::process::{Finished, run_within};
use crate::common::{API_3_A_MINUTE, NOON_30, TestServer};
use quotad_core::FakeClock;

const BIN: &str = env!("CARGO_BIN_EXE_quotad");

const CONFIG: &str = API_3_A_MINUTE;

async fn server() -> TestServer {
    TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await
}

/// Runs the binary with `args`, unaffected by the caller's environment.
fn quotad(args: &[&str]) -> impl Future<Output = Finished> + use<> {
    let mut command = Command::new(BIN);
    command.args(args).env_remove("RUST_LOG");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("QUOTAD_") {
            command.env_remove(name);
        }
    }
    // Blocking, so the test server keeps serving on the runtime meanwhile.
    async move {
        tokio::task::spawn_blocking(move || run_within(command, Duration::from_secs(30)))
            .await
            .expect("the runner does not panic")
    }
}

fn assert_exit(finished: &Finished, code: i32) {
    assert_eq!(
        finished.status.code(),
        Some(code),
        "{}",
        finished.transcript()
    );
}

/// A loopback address nothing listens on.
fn closed_port() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    drop(listener);
    addr.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_prints_one_line_per_decision_and_exits_zero_even_when_denied() {
    let server = server().await;
    let addr = server.grpc_addr.to_string();
    let out = quotad(&[
        "check", "--addr", &addr, "--policy", "api", "--key", "user-42", "--count", "5",
    ])
    .await;
    assert_exit(&out, 0);
    assert_eq!(
        out.stdout,
        "\
#1  allowed  remaining 2/3  reset in 30s  (within_limit)
#2  allowed  remaining 1/3  reset in 30s  (within_limit)
#3  allowed  remaining 0/3  reset in 30s  (within_limit)
#4  denied   remaining 0/3  retry in 30s  reset in 30s  (limit_exceeded)
#5  denied   remaining 0/3  retry in 30s  reset in 30s  (limit_exceeded)
5 checks: 3 allowed, 2 denied
"
    );
    assert_eq!(out.stderr, "", "nothing is logged on success");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_accepts_an_address_with_a_scheme_and_a_cost() {
    let server = server().await;
    let addr = format!("http://{}", server.grpc_addr);
    let out = quotad(&[
        "check", "--addr", &addr, "--policy", "api", "--key", "k", "--cost", "2",
    ])
    .await;
    assert_exit(&out, 0);
    assert_eq!(
        out.stdout,
        "#1  allowed  remaining 1/3  reset in 30s  (within_limit)\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_above_the_limit_is_a_denial_that_can_never_fit_not_an_error() {
    let server = server().await;
    let addr = server.grpc_addr.to_string();
    let out = quotad(&[
        "check", "--addr", &addr, "--policy", "api", "--key", "k", "--cost", "5",
    ])
    .await;
    assert_exit(&out, 0);
    assert_eq!(
        out.stdout,
        "#1  denied   remaining 3/3  cost 5 can never fit  (cost_exceeds_capacity)\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_shows_the_decision_without_consuming_any_budget() {
    let server = server().await;
    let addr = server.grpc_addr.to_string();
    let peek = || quotad(&["peek", "--addr", &addr, "--policy", "api", "--key", "k"]);
    for _ in 0..2 {
        let out = peek().await;
        assert_exit(&out, 0);
        assert_eq!(
            out.stdout,
            "peek  would be allowed  remaining 3/3  (within_limit)\n"
        );
    }

    let out = quotad(&[
        "check", "--addr", &addr, "--policy", "api", "--key", "k", "--count", "3",
    ])
    .await;
    assert_exit(&out, 0);
    let out = peek().await;
    assert_exit(&out, 0);
    assert_eq!(
        out.stdout,
        "peek  would be denied   remaining 0/3  retry in 30s  reset in 30s  (limit_exceeded)\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_policy_exits_one_with_the_servers_not_found_message() {
    let server = server().await;
    let addr = server.grpc_addr.to_string();
    for command in ["check", "peek"] {
        let out = quotad(&[command, "--addr", &addr, "--policy", "nope", "--key", "k"]).await;
        assert_exit(&out, 1);
        assert_eq!(out.stdout, "");
        assert_eq!(
            out.stderr,
            "error: quotad refused the request (NOT_FOUND): policy_name: no policy named \"nope\"\n"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_server_rejects_exits_one_naming_the_field() {
    let server = server().await;
    let addr = server.grpc_addr.to_string();
    let long_key = "k".repeat(300);
    let out = quotad(&[
        "check", "--addr", &addr, "--policy", "api", "--key", &long_key,
    ])
    .await;
    assert_exit(&out, 1);
    assert!(
        out.stderr
            .starts_with("error: quotad refused the request (INVALID_ARGUMENT): key: "),
        "{}",
        out.transcript()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_quotad_exits_one_naming_the_address() {
    let addr = closed_port();
    for command in ["check", "peek"] {
        let out = quotad(&[command, "--addr", &addr, "--policy", "api", "--key", "k"]).await;
        assert_exit(&out, 1);
        assert_eq!(out.stdout, "");
        let expected = format!("error: cannot reach quotad at http://{addr}: ");
        assert!(out.stderr.starts_with(&expected), "{}", out.transcript());
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.transcript());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_exits_two_before_anything_is_sent() {
    // Nothing listens here: had the binary tried to connect, it would exit
    // 1 with "cannot reach", not 2 naming the input.
    let addr = closed_port();
    let base = |flag: &str, value: &str| {
        let mut args = vec!["check".to_owned(), "--policy".to_owned(), "api".to_owned()];
        for (name, default) in [("--addr", addr.as_str()), ("--key", "k")] {
            if name != flag {
                args.extend([name.to_owned(), default.to_owned()]);
            }
        }
        args.extend([flag.to_owned(), value.to_owned()]);
        args
    };
    let cases = [
        ("--cost", "0", "'--cost <N>': must be at least 1"),
        ("--count", "0", "'--count <N>': must be at least 1"),
        ("--count", "100001", "'--count <N>': must be at most 100000"),
        ("--count", "many", "'--count <N>': not a whole number"),
        ("--key", "", "--key <KEY>"),
        (
            "--addr",
            "https://127.0.0.1:1",
            "only plaintext http:// addresses",
        ),
        ("--addr", "not an address", "--addr: http://not an address"),
    ];
    for (flag, value, message) in cases {
        let args = base(flag, value);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = quotad(&args).await;
        assert_exit(&out, 2);
        assert!(
            out.stderr.contains(message),
            "{flag} {value:?}: {}",
            out.transcript()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_address_is_the_servers_default_grpc_port() {
    let out = quotad(&["check", "--help"]).await;
    assert_exit(&out, 0);
    assert!(
        out.stdout.contains("[default: http://127.0.0.1:50051]"),
        "{}",
        out.transcript()
    );
}
