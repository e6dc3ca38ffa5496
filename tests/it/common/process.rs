//! Runs a child process to completion within a time limit, collecting its
//! output; a child still running at the limit is killed (by its own
//! handle) and the test fails with what it printed so far.
//!
//! Included with `#[path = "common/process.rs"] mod process;`.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a finished child printed, and how it exited.
#[derive(Debug)]
pub(crate) struct Finished {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Finished {
    /// Everything printed, for assertion messages.
    pub(crate) fn transcript(&self) -> String {
        format!(
            "exit: {}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs `command` (stdin closed) and waits at most `limit` for it.
pub(crate) fn run_within(mut command: Command, limit: Duration) -> Finished {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let status = wait(&mut child, limit);
    let finished = |status| Finished {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    };
    match status {
        Some(status) => finished(status),
        None => {
            let _ = child.kill();
            let status = child.wait().expect("wait for the killed child");
            panic!(
                "{command:?} did not finish within {limit:?}\n{}",
                finished(status).transcript()
            );
        }
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Polls for the child's exit until `limit`; `None` if it is still running.
fn wait(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
