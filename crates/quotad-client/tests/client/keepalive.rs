//! A connection that stops answering without closing is found by keepalive
//! pings and replaced: a TCP relay between the client and the server starts
//! swallowing every byte of the connection it carries, as a partition or a
//! blackholed route would, while new connections go through.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use quotad_client::{Check, Client, Error, Keepalive, Reason};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use crate::fake::{Fake, serve_tcp};

/// A loopback relay to `upstream` that can blackhole the connections it
/// carries.
struct Relay {
    addr: SocketAddr,
    /// One switch per connection accepted so far.
    connections: Arc<parking_lot::Mutex<Vec<Arc<AtomicBool>>>>,
    accepted: Arc<AtomicUsize>,
}

impl Relay {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let connections = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let accepted = Arc::new(AtomicUsize::new(0));
        let (list, count) = (Arc::clone(&connections), Arc::clone(&accepted));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let server = TcpStream::connect(upstream).await.expect("upstream");
                let swallow = Arc::new(AtomicBool::new(false));
                list.lock().push(Arc::clone(&swallow));
                count.fetch_add(1, Ordering::SeqCst);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pipe(client_read, server_write, Arc::clone(&swallow)));
                tokio::spawn(pipe(server_read, client_write, swallow));
            }
        });
        Self {
            addr,
            connections,
            accepted,
        }
    }

    /// Every connection open now swallows its bytes, both ways, from now
    /// on and stays open; later connections are not touched.
    fn blackhole_open_connections(&self) {
        for swallow in self.connections.lock().iter() {
            swallow.store(true, Ordering::SeqCst);
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to` until either side closes; once `swallow` is set,
/// reads on and drops what it reads, so the sender sees its bytes taken
/// but never answered.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, swallow: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if swallow.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_connection_is_dropped_and_the_next_checks_are_decided_on_a_new_one() {
    let fake = Fake::new(1_000, Duration::from_secs(60));
    let relay = Relay::start(serve_tcp(&fake, None).await).await;
    let ping = Duration::from_millis(100);
    let client = Client::builder(format!("http://{}", relay.addr))
        .deadline(Duration::from_millis(300))
        .keepalive(Keepalive::try_new(ping, ping).expect("valid keepalive"))
        .deny_cache(0)
        .build()
        .expect("valid address");

    for _ in 0..3 {
        let decision = client
            .check(&Check::named("api", "k"))
            .await
            .expect("decided");
        assert_eq!(decision.reason, Reason::WithinLimit);
    }
    assert_eq!(relay.accepted(), 1, "one connection carried the traffic");

    relay.blackhole_open_connections();
    let lost = client.check(&Check::named("api", "k")).await;
    assert!(
        matches!(lost, Err(Error::Unavailable(_))),
        "the blackholed connection answers nothing: {lost:?}"
    );
    assert_eq!(fake.calls().len(), 3, "the lost check never reached quotad");

    // Bounded in attempts, not timed: without keepalive every attempt
    // times out on the old connection.
    let mut recovered = None;
    for _ in 0..100 {
        match client.check(&Check::named("api", "k")).await {
            Ok(decision) => {
                recovered = Some(decision);
                break;
            }
            Err(Error::Unavailable(_)) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("only unavailability is expected: {other:?}"),
        }
    }
    let decision = recovered.expect("a check was decided again on a new connection");
    assert_eq!(decision.reason, Reason::WithinLimit);
    assert_eq!(relay.accepted(), 2, "the client connected once more");
}
