//! The built `quotad` binary, run as a user runs it: a clean environment,
//! its log on stderr, signals by PID.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_quotad");

/// A command running the binary with `args`.
pub(crate) fn quotad(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command.args(args);
    // The environment must not configure the binary behind the test's back.
    for (name, _) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        if name_text.starts_with("QUOTAD_") || name_text.starts_with("OTEL_") {
            command.env_remove(name);
        }
    }
    command.env("RUST_LOG", "info");
    command
}

/// A running `quotad serve`, killed if the test fails before stopping it.
pub(crate) struct Server {
    child: Child,
    pub(crate) lines: mpsc::Receiver<String>,
}

impl Server {
    pub(crate) fn spawn(args: &[&str]) -> Server {
        Server::spawn_command(quotad(args))
    }

    /// Runs `command` (made by [`quotad`], with more settings) as a server.
    pub(crate) fn spawn_command(mut command: Command) -> Server {
        let mut child = command
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
    pub(crate) fn addresses(&self) -> (SocketAddr, SocketAddr) {
        self.addresses_and_log().0
    }

    /// As [`Server::addresses`], with the log lines up to the "serving"
    /// one (included).
    pub(crate) fn addresses_and_log(&self) -> ((SocketAddr, SocketAddr), Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut log = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .expect("quotad logs that it is serving");
            log.push(line.clone());
            if line.contains("quotad serving") {
                let field = |name: &str| {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix(name))
                        .and_then(|a| a.parse().ok())
                        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
                };
                return ((field("grpc_addr="), field("admin_addr=")), log);
            }
        }
    }

    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    pub(crate) fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
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
