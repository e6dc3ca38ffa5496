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
            "an https:// address needs --tls-ca FILE",
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

/// A policy `leased` whose leases hold up to 10 units for up to 10 s.
const LEASED: &str = r#"
[policies.leased]
algorithm = "fixed_window"
limit = 100
window = "1m"
lease = { max_units = 10, min_units = 2, max_ttl = "10s" }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_with_leases_decides_most_checks_locally_and_stamps_each_line() {
    let server = TestServer::start_toml(LEASED, Arc::new(FakeClock::new(NOON_30))).await;
    let addr = server.grpc_addr.to_string();
    let before_ms = wall_clock_ms();
    let out = quotad(&[
        "check",
        "--addr",
        &addr,
        "--policy",
        "leased",
        "--key",
        "k",
        "--count",
        "20",
        "--leases",
        "10",
        "--interval",
        "2ms",
        "--timestamps",
    ])
    .await;
    let after_ms = wall_clock_ms();
    assert_exit(&out, 0);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 21, "{}", out.transcript());
    let mut stamps = Vec::new();
    let mut local = 0;
    for (n, line) in lines[..20].iter().enumerate() {
        let rest = line
            .strip_prefix(&format!("#{:<2}  at ", n + 1))
            .unwrap_or_else(|| panic!("line {}: {line:?}", n + 1));
        let (stamp, decision) = rest.split_once("  ").expect("a stamp, then the decision");
        stamps.push(stamp.parse::<u128>().expect("milliseconds"));
        assert!(decision.starts_with("allowed  remaining "), "{line:?}");
        local += usize::from(decision.ends_with("(within_limit)  from a lease"));
    }
    assert!(
        stamps.windows(2).all(|w| w[0] <= w[1]),
        "in order: {stamps:?}"
    );
    assert!(
        stamps[0] >= before_ms && stamps[19] <= after_ms,
        "{stamps:?}"
    );
    // Two pauses of at least 2 ms each, at least, between three checks.
    assert!(stamps[19] - stamps[0] >= 19 * 2, "{stamps:?}");
    assert!(local > 0, "{}", out.transcript());
    assert_eq!(
        lines[20],
        format!("20 checks: 20 allowed, 0 denied, {local} decided from leases")
    );

    // Every check quotad saw is a call: the direct checks and the lease
    // calls (acquire, renew, the return at exit) together are fewer than
    // the 20 decisions.
    let metrics = server.metrics().await;
    let sum = |name: &str| -> f64 {
        metrics
            .series(name)
            .iter()
            .filter(|(labels, _)| labels.get("policy").map(String::as_str) == Some("leased"))
            .map(|(_, v)| v)
            .sum()
    };
    let (checks, leases) = (sum("quotad_decisions_total"), sum("quotad_leases_total"));
    assert_eq!(checks, (20 - local) as f64, "{}", metrics.text);
    assert!(leases >= 1.0, "{}", metrics.text);
    assert!(
        checks + leases < 20.0,
        "{checks} checks + {leases} lease calls"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_new_flags_the_output_is_unchanged_and_bad_values_exit_two() {
    let server = TestServer::start_toml(LEASED, Arc::new(FakeClock::new(NOON_30))).await;
    let addr = server.grpc_addr.to_string();
    let out = quotad(&[
        "check", "--addr", &addr, "--policy", "leased", "--key", "k", "--count", "2",
    ])
    .await;
    assert_exit(&out, 0);
    assert_eq!(
        out.stdout,
        "\
#1  allowed  remaining 99/100  reset in 30s  (within_limit)
#2  allowed  remaining 98/100  reset in 30s  (within_limit)
2 checks: 2 allowed, 0 denied
"
    );
    let cases = [
        ("--leases", "0", "'--leases <N>': must be at least 1"),
        (
            "--leases",
            "9007199254740993",
            "'--leases <N>': must be at most 9007199254740992",
        ),
        ("--interval", "soon", "'--interval <DURATION>'"),
    ];
    for (flag, value, message) in cases {
        let out = quotad(&[
            "check", "--addr", &addr, "--policy", "leased", "--key", "k", flag, value,
        ])
        .await;
        assert_exit(&out, 2);
        assert!(out.stderr.contains(message), "{}", out.transcript());
    }
}

/// Milliseconds since the Unix epoch, as `--timestamps` prints them.
fn wall_clock_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_peek_take_an_inline_policy_and_name_the_flag_of_a_bad_one() {
    let server = server().await;
    let addr = server.grpc_addr.to_string();
    let inline = [
        "--addr",
        &addr,
        "--algorithm",
        "fixed_window",
        "--limit",
        "2",
        "--window",
        "1m",
        "--key",
        "k",
    ];
    let out = quotad(&[&["check"][..], &inline, &["--count", "3"]].concat()).await;
    assert_exit(&out, 0);
    assert_eq!(
        out.stdout,
        "\
#1  allowed  remaining 1/2  reset in 30s  (within_limit)
#2  allowed  remaining 0/2  reset in 30s  (within_limit)
#3  denied   remaining 0/2  retry in 30s  reset in 30s  (limit_exceeded)
3 checks: 2 allowed, 1 denied
"
    );
    let out = quotad(&[&["peek"][..], &inline].concat()).await;
    assert_exit(&out, 0);
    assert!(
        out.stdout.starts_with("peek  would be denied "),
        "{}",
        out.stdout
    );

    for (flags, says) in [
        (
            &[
                "--algorithm",
                "token_bucket",
                "--limit",
                "0",
                "--window",
                "1s",
            ][..],
            "--limit: ",
        ),
        (
            &[
                "--algorithm",
                "fixed_window",
                "--limit",
                "5",
                "--window",
                "1s",
                "--burst",
                "9",
            ][..],
            "--burst: ",
        ),
        (
            &["--algorithm", "fixed_window", "--limit", "5"][..],
            "--window",
        ),
        (
            &["--policy", "api", "--algorithm", "fixed_window"][..],
            "cannot be used with",
        ),
        (&[][..], "--policy"),
    ] {
        let out = quotad(&[&["check", "--addr", &addr, "--key", "k"][..], flags].concat()).await;
        assert_exit(&out, 2);
        assert!(out.stderr.contains(says), "{flags:?}: {}", out.stderr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_json_prints_one_object_a_decision_with_the_apis_fields() {
    let server = server().await;
    let addr = server.grpc_addr.to_string();
    let args = [
        "--addr", &addr, "--policy", "api", "--key", "j", "--output", "json",
    ];
    let out = quotad(&[&["check"][..], &args, &["--count", "4"]].concat()).await;
    assert_exit(&out, 0);
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect();
    assert_eq!(lines.len(), 5, "{}", out.stdout);
    assert_eq!(lines[0]["allowed"], true);
    assert_eq!(lines[0]["remaining"], 2);
    assert_eq!(lines[0]["limit"], 3);
    assert_eq!(lines[0]["reset_after_ms"], 30_000);
    assert_eq!(lines[0]["reason"], "within_limit");
    assert_eq!(lines[3]["allowed"], false);
    assert_eq!(lines[3]["retry_after_ms"], 30_000);
    assert_eq!(lines[3]["n"], 4);
    assert_eq!(
        lines[4],
        serde_json::json!({"checks": 4, "allowed": 3, "denied": 1, "from_leases": 0})
    );
    let out = quotad(&[&["peek"][..], &args].concat()).await;
    assert_exit(&out, 0);
    let peek: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    assert_eq!(
        (peek["allowed"].clone(), peek["remaining"].clone()),
        (false.into(), 0.into())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_gives_the_key_its_budget_back_and_is_refused_where_the_server_says_nobody() {
    let server = server().await;
    let addr = server.grpc_addr.to_string();
    let target = ["--addr", &addr, "--policy", "api", "--key", "r"];
    assert_exit(
        &quotad(&[&["check"][..], &target, &["--count", "3"]].concat()).await,
        0,
    );
    let out = quotad(&[&["reset"][..], &target].concat()).await;
    assert_exit(&out, 0);
    assert_eq!(out.stdout, "reset  r under api\n");
    let out = quotad(&[&["check"][..], &target].concat()).await;
    assert!(
        out.stdout.contains("allowed  remaining 2/3"),
        "{}",
        out.stdout
    );

    let closed = TestServer::start_toml(
        &format!("[limits]\nallow_reset = \"nobody\"\n{CONFIG}"),
        Arc::new(FakeClock::new(NOON_30)),
    )
    .await;
    let addr = closed.grpc_addr.to_string();
    let out = quotad(&["reset", "--addr", &addr, "--policy", "api", "--key", "r"]).await;
    assert_exit(&out, 1);
    assert!(
        out.stderr.contains("PERMISSION_DENIED") && out.stderr.contains("limits.allow_reset"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_sends_items_from_arguments_or_a_file_all_or_nothing_taking_nothing_when_one_is_denied()
 {
    let server = server().await;
    let addr = server.grpc_addr.to_string();
    let out = quotad(&[
        "batch",
        "--addr",
        &addr,
        "--item",
        "api*2:b",
        "--item",
        "api*2:b",
        "--all-or-nothing",
    ])
    .await;
    assert_exit(&out, 0);
    assert!(
        out.stdout
            .ends_with("2 items: 0 allowed, 2 denied (all or nothing)\n"),
        "{}",
        out.stdout
    );
    let out = quotad(&["peek", "--addr", &addr, "--policy", "api", "--key", "b"]).await;
    assert!(
        out.stdout.contains("remaining 3/3"),
        "nothing taken: {}",
        out.stdout
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("items.json");
    std::fs::write(
        &file,
        r#"[{"key": "b", "policy": "api"},
            {"key": "c", "cost": 2, "policy": {"algorithm": "token_bucket", "limit": 5, "window": "1s"}}]"#,
    )
    .expect("write items");
    let file = file.to_string_lossy().into_owned();
    let out = quotad(&[
        "batch", "--addr", &addr, "--file", &file, "--output", "json",
    ])
    .await;
    assert_exit(&out, 0);
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    assert_eq!(lines[0]["remaining"], 2);
    assert_eq!(lines[0]["policy"], "api");
    assert_eq!(lines[1]["remaining"], 3);
    assert_eq!(lines[1]["policy"], "inline token_bucket 5/1s");
    assert_eq!(
        lines[2],
        serde_json::json!({"total": {"items": 2, "allowed": 2, "denied": 0, "all_or_nothing": false}})
    );
    // A key may hold colons: everything after the first one is the key.
    let out = quotad(&[
        "batch",
        "--addr",
        &addr,
        "--item",
        "api:user:42",
        "--output",
        "json",
    ])
    .await;
    assert_exit(&out, 0);
    let first: serde_json::Value =
        serde_json::from_str(out.stdout.lines().next().expect("a line")).expect("JSON");
    assert_eq!(
        (first["key"].clone(), first["remaining"].clone()),
        ("user:42".into(), 2.into())
    );

    for (args, says) in [
        (&["--item", "api"][..], "POLICY:KEY"),
        (&["--item", "api*0:k"][..], "at least 1"),
        (&["--item", "api*x:k"][..], "not a whole number"),
        (
            &["--file", "/nonexistent.json"][..],
            "--file /nonexistent.json",
        ),
    ] {
        let out = quotad(&[&["batch", "--addr", &addr][..], args].concat()).await;
        assert_exit(&out, 2);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
    }
    let out = quotad(&["batch", "--addr", &addr, "--item", "nope:k"]).await;
    assert_exit(&out, 1);
    assert!(
        out.stderr.contains("items[0].policy_name"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_checks_over_tls_and_mtls() {
    let dir = tempfile::tempdir().expect("temp dir");
    crate::tls::write_pki(dir.path());
    let pki = dir.path().join("tls");
    let path = |name: &str| pki.join(name).to_string_lossy().into_owned();
    let (ca, cert, key) = (path("ca.pem"), path("client.pem"), path("client.key"));
    let server = crate::tls::start(dir.path(), true).await;
    let addr = format!("localhost:{}", server.grpc_addr.port());
    let target = ["--addr", &addr, "--policy", "api", "--key", "t"];
    let out = quotad(
        &[
            &["check"][..],
            &target,
            &["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key],
        ]
        .concat(),
    )
    .await;
    assert_exit(&out, 0);
    assert!(
        out.stdout.contains("allowed  remaining 9/10"),
        "{}",
        out.stdout
    );
    // mTLS callers may reset by default, wherever they call from.
    let out = quotad(
        &[
            &["reset"][..],
            &target,
            &["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key],
        ]
        .concat(),
    )
    .await;
    assert_exit(&out, 0);
    // Without the client certificate the server refuses the handshake.
    let out = quotad(&[&["check"][..], &target, &["--tls-ca", &ca]].concat()).await;
    assert_exit(&out, 1);
    // A plaintext client, and https without a CA.
    let out = quotad(&[&["check"][..], &target].concat()).await;
    assert_exit(&out, 1);
    let https = format!("https://{addr}");
    let out = quotad(&["check", "--addr", &https, "--policy", "api", "--key", "t"]).await;
    assert_exit(&out, 2);
    assert!(out.stderr.contains("--tls-ca"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_named_policy_prints_no_reset_instant_where_explain_is_refused() {
    let closed = TestServer::start_toml(
        &format!("[limits]\nallow_reset = \"nobody\"\n{CONFIG}"),
        Arc::new(FakeClock::new(NOON_30)),
    )
    .await;
    let addr = closed.grpc_addr.to_string();
    let target = ["--addr", &addr, "--policy", "api", "--key", "plain"];
    let out = quotad(&[&["check"][..], &target].concat()).await;
    assert_exit(&out, 0);
    assert!(
        out.stdout
            .starts_with("#1  allowed  remaining 2/3  reset in 30s"),
        "{}",
        out.transcript()
    );
    assert!(!out.stdout.contains(" resets "), "{}", out.transcript());
    // One hint, naming the flag that prints a local time and the refusal.
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.transcript());
    assert!(
        out.stderr.contains("--time-zone") && out.stderr.contains("limits.allow_reset"),
        "{}",
        out.transcript()
    );
    let out = quotad(&[&["peek"][..], &target, &["--output", "json"]].concat()).await;
    assert_exit(&out, 0);
    assert!(
        out.stdout.contains("\"reset_after_ms\":30000"),
        "{}",
        out.transcript()
    );
    assert!(!out.stdout.contains("reset_at"), "{}", out.transcript());
}
