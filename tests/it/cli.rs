//! The `quotad` binary: `validate-config`, refusing a bad config before
//! binding, SIGHUP reload and SIGTERM shutdown.

use std::io::{BufRead as _, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::{eventually, http_get};

const BIN: &str = env!("CARGO_BIN_EXE_quotad");

const BAD_LIMIT: &str = r#"
[policies.login]
algorithm = "fixed_window"
limit = 0
window = "1m"
"#;

fn quotad(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command.args(args);
    // The environment must not configure the binary behind the test's back.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("QUOTAD_") {
            command.env_remove(name);
        }
    }
    command.env("RUST_LOG", "info");
    command
}

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

#[test]
fn validate_config_accepts_the_example_config() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/config/quotad.example.toml");
    let output = run(&["validate-config", example]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(String::from_utf8_lossy(&output.stdout).contains("ok (5 named policies)"));
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
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("store.max_key: unknown field `max_key`"),
        "{}",
        stderr(&output)
    );

    let missing = dir.path().join("missing.toml");
    let output = run(&["validate-config", &missing.to_string_lossy()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("cannot read"),
        "{}",
        stderr(&output)
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
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("policies.login.limit"),
        "{}",
        stderr(&output)
    );
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
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("server.tls.cert: cannot read"),
        "{}",
        stderr(&output)
    );

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
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("store.max_keys: max_keys must be at least 1 (from a flag"),
        "{}",
        stderr(&output)
    );
    let output = quotad(&["serve", "--grpc-addr", &grpc, "--admin-addr", &admin])
        .env("QUOTAD_SHARDS", "3")
        .output()
        .expect("run quotad");
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("store.shards"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn serve_reports_a_port_in_use_with_exit_code_one() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let grpc = taken.local_addr().expect("addr").to_string();
    let output = run(&["serve", "--grpc-addr", &grpc, "--admin-addr", "127.0.0.1:0"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("cannot bind the gRPC address"),
        "{}",
        stderr(&output)
    );
}

/// A running `quotad serve`, killed if the test fails before stopping it.
struct Server {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Server {
    fn spawn(args: &[&str]) -> Server {
        let mut child = quotad(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn quotad");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Server { child, lines }
    }

    /// Waits for the "serving" log line and returns (gRPC, admin) addresses.
    fn addresses(&self) -> (SocketAddr, SocketAddr) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .expect("quotad logs that it is serving");
            if line.contains("quotad serving") {
                let field = |name: &str| {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix(name))
                        .and_then(|a| a.parse().ok())
                        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
                };
                return (field("grpc_addr="), field("admin_addr="));
            }
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "quotad did not exit in time");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    let mut server = Server::spawn(&[
        "serve",
        "-c",
        &path,
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ]);
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
