//! The processes a soak phase starts, and what it reads from them.
//!
//! Every process is a child of the driver; it is signalled by its own PID
//! (`kill`, the command) and nothing else, and killed when its handle is
//! dropped, so an error or a panic in the driver leaves nothing running.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A child process, stopped by PID.
#[derive(Debug)]
pub(crate) struct Managed {
    child: Option<Child>,
    name: &'static str,
}

impl Managed {
    pub(crate) fn spawn(command: &mut Command, name: &'static str) -> anyhow::Result<Managed> {
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {name} ({command:?})"))?;
        Ok(Managed {
            child: Some(child),
            name,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// SIGKILL, and the exit reaped: nothing of the process is left.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits up to `within` for the exit (then SIGKILL).
    /// Fails unless the process exited 0 after SIGTERM.
    pub(crate) async fn stop(&mut self, within: Duration) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if let Some(status) = child.try_wait()? {
            bail!(
                "{} (pid {}) had exited before the end: {status}",
                self.name,
                child.id()
            );
        }
        signal(child.id(), "-TERM")?;
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    bail!("{} exited with {status} after SIGTERM", self.name);
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("{} did not stop within {within:?} of SIGTERM", self.name);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Sends `signal` to `pid`, a process this driver started.
pub(crate) fn signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .status()
        .context("cannot run kill")?;
    if !status.success() {
        bail!("kill {signal} {pid} failed: {status}");
    }
    Ok(())
}

/// A redis-server on 127.0.0.1 with an append-only file, fsynced every
/// second and on shutdown: a restart by SIGTERM keeps every count. (Fsync
/// on every write stalls writes past quotad's Redis timeout when the disk
/// is busy; a soak run on this shared machine saw it.)
#[derive(Debug)]
pub(crate) struct Redis {
    binary: PathBuf,
    dir: PathBuf,
    pub(crate) port: u16,
    process: Managed,
}

impl Redis {
    pub(crate) async fn start(binary: &Path, port: u16, dir: &Path) -> anyhow::Result<Redis> {
        let process = Self::spawn(binary, port, dir)?;
        let redis = Redis {
            binary: binary.to_owned(),
            dir: dir.to_owned(),
            port,
            process,
        };
        redis.wait_ready(Duration::from_secs(20)).await?;
        Ok(redis)
    }

    fn spawn(binary: &Path, port: u16, dir: &Path) -> anyhow::Result<Managed> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("redis.log"))?;
        Managed::spawn(
            Command::new(binary)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args([
                    "--save",
                    "",
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "everysec",
                ])
                .args(["--daemonize", "no"])
                .arg("--dir")
                .arg(dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log),
            "redis-server",
        )
    }

    /// Stops Redis (SIGTERM: it finishes the command in progress and
    /// exits) and starts it again on the same port and files.
    pub(crate) async fn restart(&mut self) -> anyhow::Result<()> {
        tracing::info!(port = self.port, "restarting redis-server");
        self.process.stop(Duration::from_secs(20)).await?;
        self.process = Self::spawn(&self.binary, self.port, &self.dir)?;
        self.wait_ready(Duration::from_secs(20)).await
    }

    pub(crate) async fn stop(&mut self) -> anyhow::Result<()> {
        self.process.stop(Duration::from_secs(20)).await
    }

    async fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if ping(self.port).await.unwrap_or(false) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("redis-server on port {} did not answer PING", self.port);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Whether Redis on `port` answers `PING` with `PONG` (not while it loads
/// its append-only file).
async fn ping(port: u16) -> anyhow::Result<bool> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(b"PING\r\n").await?;
    let mut reply = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(1), stream.read(&mut reply)).await??;
    Ok(reply[..n].starts_with(b"+PONG"))
}

/// A port on 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// The resident memory of `pid`, KiB (`VmRSS` in `/proc/PID/status`).
pub(crate) fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read the status of pid {pid}"))?;
    parse_rss_kib(&status).with_context(|| format!("no VmRSS for pid {pid}"))
}

/// `VmRSS` from the text of `/proc/PID/status`, KiB.
pub(crate) fn parse_rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The body of `GET path` on the admin port (HTTP/1.0, one request).
pub(crate) async fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response)).await??;
    let text = String::from_utf8_lossy(&response);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .context("no HTTP body")?;
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vmrss_in_kib() {
        let status = "Name:\tquotad\nVmPeak:\t  200000 kB\nVmRSS:\t   41236 kB\nThreads:\t3\n";
        assert_eq!(parse_rss_kib(status), Some(41_236));
        assert_eq!(parse_rss_kib("Name:\tx\n"), None);
    }

    #[test]
    fn reads_its_own_rss() {
        assert!(rss_kib(std::process::id()).expect("readable") > 0);
    }
}
