//! Graceful shutdown: calls in flight finish, then `run` returns `Ok`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::common::{NOON_30, TestServer, check, eventually, named};
use quotad_core::Clock;
use quotad_proto::v1 as pb;

const CONFIG: &str = r#"
[store]
# No sweep step during the test: the gate below must only catch the call.
sweep_interval = "1h"

[policies.api]
algorithm = "fixed_window"
limit = 5000
window = "1m"
"#;

/// A clock that, once armed, holds the next reading until opened: the
/// call that reads it is then provably inside the server, in flight.
#[derive(Debug, Default)]
struct GateClock {
    armed: AtomicBool,
    entered: AtomicBool,
    open: Mutex<bool>,
    opened: Condvar,
}

impl GateClock {
    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    fn entered(&self) -> bool {
        self.entered.load(Ordering::SeqCst)
    }

    fn open(&self) {
        *self.open.lock().expect("gate lock") = true;
        self.opened.notify_all();
    }
}

impl Clock for GateClock {
    fn now_ms(&self) -> u64 {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.entered.store(true, Ordering::SeqCst);
            // block_in_place hands this worker's queue and the I/O and timer
            // drivers to another thread while the call is held, as any
            // blocking code in a multi-threaded runtime must.
            tokio::task::block_in_place(|| {
                let mut open = self.open.lock().expect("gate lock");
                while !*open {
                    open = self.opened.wait(open).expect("gate lock");
                }
            });
        }
        NOON_30
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_lets_an_in_flight_batch_finish_and_run_returns_ok() {
    let clock = Arc::new(GateClock::default());
    let mut server = TestServer::start_toml(CONFIG, clock.clone()).await;
    let mut client = server.client().await;
    assert!(
        check(&mut client, named("warm-up", "api", None))
            .await
            .allowed
    );

    clock.arm();
    let items = (0..1_000)
        .map(|i| named(&format!("user-{i}"), "api", None))
        .collect();
    let request = pb::CheckBatchRequest {
        items,
        mode: pb::BatchMode::AllOrNothing.into(),
    };
    let in_flight = tokio::spawn(async move { client.check_batch(request).await });
    eventually(
        Duration::from_secs(5),
        "the batch reaches the store",
        || async { clock.entered() },
    )
    .await;

    server.trigger_shutdown();
    // Draining: not ready any more, but still running while the call is held.
    eventually(Duration::from_secs(5), "/readyz turns 503", || async {
        server.get("/readyz").await.0 == 503
    })
    .await;
    assert!(
        !server.has_stopped(),
        "run must wait for the call in flight"
    );

    clock.open();
    let response = in_flight
        .await
        .expect("caller task")
        .expect("the call in flight completes OK")
        .into_inner();
    assert_eq!(response.decisions.len(), 1_000);
    assert!(response.decisions.iter().all(|d| d.allowed));
    server.join().await.expect("run returns Ok after draining");
}

#[tokio::test]
async fn after_shutdown_the_ports_are_closed() {
    let clock = Arc::new(GateClock::default());
    let server = TestServer::start_toml(CONFIG, clock).await;
    let (grpc, admin) = (server.grpc_addr, server.admin_addr);
    server.shutdown().await.expect("run returns Ok");
    assert!(
        tokio::net::TcpStream::connect(grpc).await.is_err(),
        "gRPC port closed"
    );
    assert!(
        tokio::net::TcpStream::connect(admin).await.is_err(),
        "admin port closed"
    );
}
