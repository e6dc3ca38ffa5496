//! The `quotad` binary: `validate-config`, refusing a bad config before
//! binding, SIGHUP reload and SIGTERM shutdown.

use std::net::TcpListener;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use crate::common::binary::{Server, quotad};
use crate::common::{eventually, http_get};

const BAD_LIMIT: &str = r#"
[policies.login]
algorithm = "fixed_window"
limit = 0
window = "1m"
"#;

fn run(args: &[&str]) -> Output {
    quotad(args).output().expect("run quotad")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write file");
    path.to_string_lossy().into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The process exited with `code` and its error output says `says`.
#[track_caller]
fn assert_exit(output: &Output, code: i32, says: &str) {
    let stderr = stderr(output);
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    assert!(stderr.contains(says), "expected {says:?} in: {stderr}");
}

#[test]
fn validate_config_accepts_the_example_config() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config/quotad.example.toml");
    let output = run(&["validate-config", example]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(String::from_utf8_lossy(&output.stdout).contains(": ok (6 named policies)"));
}

#[test]
fn validate_config_names_the_field_and_line_and_exits_two() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(dir.path(), "bad.toml", BAD_LIMIT);
    let output = run(&["validate-config", &path]);
    assert_eq!(output.status.code(), Some(2));
    let message = stderr(&output);
    assert!(
        message.contains("policies.login.limit: limit must be at least 1 (line 4)"),
        "{message}"
    );
    assert_eq!(message.lines().count(), 1, "one clear message: {message}");
}

#[test]
fn validate_config_rejects_unknown_fields_and_missing_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(dir.path(), "typo.toml", "[store]\nmax_key = 10\n");
    let output = run(&["validate-config", &path]);
    assert_exit(&output, 2, "store.max_key: unknown field `max_key`");

    let missing = dir.path().join("missing.toml");
    let output = run(&["validate-config", &missing.to_string_lossy()]);
    assert_exit(&output, 2, "cannot read");
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn validate_config_reads_the_environment_and_flags_that_serve_reads() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config/quotad.example.toml");
    // An environment variable serve would refuse is refused here too,
    // named as coming from the environment.
    let output = quotad(&["validate-config", example])
        .env("QUOTAD_GRPC_ADDR", "bogus")
        .output()
        .expect("run quotad");
    assert_exit(
        &output,
        2,
        "server.grpc_addr: \"bogus\": invalid socket address syntax",
    );
    assert!(stderr(&output).contains("from a flag or environment variable"));
    // A flag too; and what was read is said.
    let output = run(&["validate-config", example, "--max-keys", "0"]);
    assert_exit(&output, 2, "store.max_keys");
    let output = quotad(&["validate-config", "--max-keys", "10"])
        .env("QUOTAD_CONFIG", example)
        .output()
        .expect("run quotad");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stdout(&output).trim(),
        format!("{example}: ok (6 named policies; flags or environment set store.max_keys)")
    );
}

#[test]
fn validate_config_without_a_file_checks_the_defaults_and_an_rls_folder_alone() {
    let output = run(&["validate-config"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "defaults: ok (0 named policies)");

    let dir = tempfile::tempdir().expect("temp dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    let good = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    write(&rules, "edge.yaml", good);
    let folder = rules.to_string_lossy().into_owned();
    let output = run(&["validate-config", "--rls-config", &folder]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(
        stdout(&output).contains("1 RLS rule in 1 domain from"),
        "{}",
        stdout(&output)
    );
    write(&rules, "edge.yaml", &good.replace("minute", "minit"));
    let output = run(&["validate-config", "--rls-config", &folder]);
    assert_exit(&output, 2, "edge.yaml: descriptors[0].rate_limit.unit");
    assert!(
        stderr(&output).contains("(line 4, column 24)"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn validate_config_checks_the_file_it_is_given_where_quotad_config_is_set() {
    let dir = tempfile::tempdir().expect("temp dir");
    let running = write(dir.path(), "running.toml", "");
    let new = write(dir.path(), "new.toml", BAD_LIMIT);
    // As in a container whose environment names the running config.
    let output = quotad(&["validate-config", &new])
        .env("QUOTAD_CONFIG", &running)
        .output()
        .expect("run quotad");
    assert_exit(&output, 2, "policies.login.limit");
    assert!(stderr(&output).contains("new.toml"), "{}", stderr(&output));
}

#[test]
fn a_redis_that_refuses_connections_at_start_is_printed_once_and_exits_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        dir.path(),
        "redis.toml",
        "[store]\nbackend = \"redis\"\n\n[store.redis]\nurl = \"redis://app:hunter2@127.0.0.1:1/0\"\ntimeout = \"2s\"\nrequired_at_start = true\n",
    );
    let output = run(&[
        "serve",
        "--config",
        &path,
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ]);
    assert_exit(&output, 1, "state store unavailable");
    let stderr = stderr(&output);
    assert!(
        stderr.contains("cannot start on redis://app:***@127.0.0.1:1/0: state store unavailable"),
        "names where: {stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
    let fatal: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(fatal.len(), 1, "{stderr}");
    assert_eq!(
        fatal[0].matches("state store unavailable").count(),
        1,
        "{stderr}"
    );
    assert_eq!(
        fatal[0].to_lowercase().matches("refused").count(),
        1,
        "{stderr}"
    );
}

#[test]
fn serve_refuses_an_invalid_config_before_binding_any_port() {
    // Both ports are taken: had quotad tried to bind first, it would fail
    // with "cannot bind" (exit 1) instead of naming the field (exit 2).
    let taken_grpc = TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken_admin = TcpListener::bind("127.0.0.1:0").expect("bind");
    let grpc = taken_grpc.local_addr().expect("addr").to_string();
    let admin = taken_admin.local_addr().expect("addr").to_string();
    let dir = tempfile::tempdir().expect("temp dir");

    let path = write(dir.path(), "bad.toml", BAD_LIMIT);
    let output = run(&[
        "serve",
        "--config",
        &path,
        "--grpc-addr",
        &grpc,
        "--admin-addr",
        &admin,
    ]);
    assert_exit(&output, 2, "policies.login.limit");
    assert!(!stderr(&output).contains("bind"), "{}", stderr(&output));

    let tls = write(
        dir.path(),
        "tls.toml",
        "[server.tls]\ncert = \"missing.pem\"\nkey = \"missing.key\"\n",
    );
    let output = run(&[
        "serve",
        "--config",
        &tls,
        "--grpc-addr",
        &grpc,
        "--admin-addr",
        &admin,
    ]);
    assert_exit(&output, 2, "server.tls.cert: cannot read");

    // Flags and environment variables are validated the same way.
    let output = quotad(&[
        "--max-keys",
        "0",
        "--grpc-addr",
        &grpc,
        "--admin-addr",
        &admin,
    ])
    .output()
    .expect("run quotad");
    assert_exit(
        &output,
        2,
        "store.max_keys: max_keys must be at least 1 (from a flag",
    );
    let output = quotad(&["serve", "--grpc-addr", &grpc, "--admin-addr", &admin])
        .env("QUOTAD_SHARDS", "3")
        .output()
        .expect("run quotad");
    assert_exit(&output, 2, "store.shards");
}

#[test]
fn serve_reports_a_port_in_use_with_exit_code_one() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let grpc = taken.local_addr().expect("addr").to_string();
    let output = run(&["serve", "--grpc-addr", &grpc, "--admin-addr", "127.0.0.1:0"]);
    assert_exit(&output, 1, "cannot bind the gRPC address");
}

#[tokio::test]
async fn serve_without_a_config_file_survives_sighup() {
    let mut server = serve_on_free_ports(&[]);
    let (_grpc, admin) = server.addresses();
    server.signal("HUP");
    server.signal("HUP");
    // Still serving: SIGHUP with nothing to reload is not the end.
    readyz_turns(admin, 200).await;
    server.signal("TERM");
    let status = server.wait(Duration::from_secs(10));
    assert_eq!(
        status.code(),
        Some(0),
        "a graceful shutdown exits 0, not killed by SIGHUP"
    );
}

/// `quotad serve` with `args`, both ports on a free loopback port.
fn serve_on_free_ports(args: &[&str]) -> Server {
    let ports = ["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"];
    Server::spawn(&[&["serve"][..], args, &ports].concat())
}

/// Waits (up to 10 s) until the admin port's `/readyz` answers `code`.
async fn readyz_turns(admin: std::net::SocketAddr, code: u16) {
    eventually(
        Duration::from_secs(10),
        &format!("/readyz answers {code}"),
        || async { http_get(admin, "/readyz").await.0 == code },
    )
    .await;
}

#[tokio::test]
async fn a_second_sigterm_ends_a_shutdown_that_waits() {
    let mut server = serve_on_free_ports(&["--shutdown-delay", "60s"]);
    let (_grpc, admin) = server.addresses();
    server.signal("TERM");
    // The first one starts the shutdown: not ready, still serving for 60 s.
    readyz_turns(admin, 503).await;
    server.signal("TERM");
    let status = server.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(1), "the second one ends it at once");
}

#[tokio::test]
async fn serve_reloads_policies_on_sighup_and_exits_zero_on_sigterm() {
    let dir = tempfile::tempdir().expect("temp dir");
    let policy = |limit: u32| {
        format!(
            "[server]\nconfig_poll_interval = \"0s\"\n\n[policies.api]\nalgorithm = \"fixed_window\"\nlimit = {limit}\nwindow = \"1m\"\n"
        )
    };
    let path = write(dir.path(), "quotad.toml", &policy(10));
    let mut server = serve_on_free_ports(&["-c", &path]);
    let (_grpc, admin) = server.addresses();
    let limit = || async {
        let (_, body) = http_get(admin, "/policies").await;
        let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        json["policies"]["api"]["limit"].as_u64()
    };
    assert_eq!(limit().await, Some(10));

    // File polling is off, so only SIGHUP can apply this.
    write(dir.path(), "quotad.toml", &policy(20));
    server.signal("HUP");
    eventually(
        Duration::from_secs(10),
        "SIGHUP applies the new limit",
        || async { limit().await == Some(20) },
    )
    .await;

    server.signal("TERM");
    let status = server.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "a graceful shutdown exits 0");
}

/// Lines of `server`'s log until one contains `until` (included), waiting
/// up to 10 s.
fn lines_until(server: &Server, until: &str) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = server
            .lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no log line with {until:?} in: {lines:#?}"));
        let done = line.contains(until);
        lines.push(line);
        if done {
            return lines;
        }
    }
}

#[track_caller]
fn logged<'a>(lines: &'a [String], message: &str, fields: &[&str]) -> &'a str {
    lines
        .iter()
        .find(|l| l.contains(message) && fields.iter().all(|f| l.contains(f)))
        .unwrap_or_else(|| panic!("no {message:?} line with {fields:?} in: {lines:#?}"))
}

#[test]
fn the_log_says_what_was_loaded_written_and_reloaded() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    write(
        &rules,
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
    );
    let config = |inline: bool| {
        format!(
            "[server]\nconfig_poll_interval = \"0s\"\n\n[store.snapshot]\npath = \"quotad.snapshot\"\n\n[limits]\nallow_inline_policies = {inline}\n\n[rls]\nconfig_dir = \"rules\"\n\n[policies.a]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1m\"\n\n[policies.b]\nalgorithm = \"token_bucket\"\nlimit = 1\nwindow = \"1s\"\n"
        )
    };
    let path = write(dir.path(), "quotad.toml", &config(true));
    let mut server = serve_on_free_ports(&["-c", &path]);
    let start = lines_until(&server, "quotad serving");
    logged(&start, "RLS rules loaded", &["rules=2", "domains=1"]);
    logged(
        &start,
        "snapshot written",
        &["entries=0", "bytes=", "elapsed_ms=", "when=Start"],
    );
    logged(
        &start,
        "quotad serving",
        &["store=\"memory\"", "policies=2"],
    );

    // A reload that changes only a setting says which.
    write(dir.path(), "quotad.toml", &config(false));
    server.signal("HUP");
    let reload = lines_until(&server, "policies reloaded");
    logged(
        &reload,
        "policies reloaded",
        &["changed=[]", "settings=[\"limits.allow_inline_policies\"]"],
    );

    server.signal("TERM");
    let stop = lines_until(&server, "quotad stopped");
    assert!(
        !stop.iter().any(|l| l.contains("snapshot written")),
        "{stop:#?}"
    );
    let last = lines_until(&server, "snapshot written");
    logged(&last, "snapshot written", &["when=Shutdown"]);
    assert_eq!(server.wait(Duration::from_secs(10)).code(), Some(0));
}
