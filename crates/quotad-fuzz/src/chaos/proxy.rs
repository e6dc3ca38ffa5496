//! A TCP proxy on loopback in front of one Redis node, that the driver
//! can blackhole: every connection open when the blackhole starts, or
//! accepted while it lasts, stops forwarding for good (bytes read and
//! dropped, the socket held open: a partition, or a peer gone without a
//! FIN); connections accepted after it ends pass as usual. Clients find
//! out only by their own timeouts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The proxy; its task ends when it is dropped.
#[derive(Debug)]
pub(super) struct Proxy {
    pub(super) port: u16,
    /// Bumped when a blackhole starts: a connection born earlier is dead.
    generation: Arc<AtomicU64>,
    /// Whether a blackhole is on (new connections are born dead).
    on: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`.
    pub(super) async fn start(upstream: u16) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let generation = Arc::new(AtomicU64::new(0));
        let on = Arc::new(AtomicBool::new(false));
        let (gen_, on_) = (Arc::clone(&generation), Arc::clone(&on));
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let born = if on_.load(Ordering::SeqCst) {
                    None
                } else {
                    Some(gen_.load(Ordering::SeqCst))
                };
                let live = Arc::clone(&gen_);
                tokio::spawn(async move {
                    let alive = move || born.is_some_and(|b| live.load(Ordering::SeqCst) == b);
                    let _ = client.set_nodelay(true);
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    let up = pump(cr, sw, alive.clone());
                    let down = pump(sr, cw, alive);
                    tokio::join!(up, down);
                });
            }
        });
        Ok(Proxy {
            port,
            generation,
            on,
            task,
        })
    }

    /// Starts a blackhole: every open connection is dead from now on, and
    /// so is every connection accepted until [`Proxy::heal`].
    pub(super) fn blackhole(&self) {
        self.on.store(true, Ordering::SeqCst);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Ends the blackhole for connections accepted from now on; the dead
    /// ones stay dead until their peers close them.
    pub(super) fn heal(&self) {
        self.on.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to` while `alive()`; once it is not, reads and drops
/// everything and holds the socket open.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    alive: impl Fn() -> bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if alive() && to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn echo() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    async fn round_trip(stream: &mut TcpStream) -> bool {
        stream.write_all(b"ping").await.expect("write");
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_millis(300), stream.read_exact(&mut buf))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    #[tokio::test]
    async fn a_blackhole_stops_open_and_new_connections_and_later_ones_pass() {
        let proxy = Proxy::start(echo().await).await.expect("proxy");
        let mut before = TcpStream::connect(("127.0.0.1", proxy.port))
            .await
            .expect("connect");
        assert!(round_trip(&mut before).await);
        proxy.blackhole();
        assert!(!round_trip(&mut before).await, "an open connection stops");
        let mut during = TcpStream::connect(("127.0.0.1", proxy.port))
            .await
            .expect("connect");
        assert!(!round_trip(&mut during).await, "a new one is born dead");
        proxy.heal();
        assert!(!round_trip(&mut before).await, "the dead stay dead");
        assert!(!round_trip(&mut during).await, "the dead stay dead");
        let mut after = TcpStream::connect(("127.0.0.1", proxy.port))
            .await
            .expect("connect");
        assert!(
            round_trip(&mut after).await,
            "a connection after the heal passes"
        );
    }
}
