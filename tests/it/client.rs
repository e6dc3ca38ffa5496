//! quotad-client against a real quotad: it outlives quotad restarts, keeps
//! its deadline, and applies its failure policy only to an unreachable
//! quotad, never to a refusal.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::common::{NOON_30, eventually};
use quotad::{Config, Listeners};
use quotad_client::{Check, Client, Error, FailurePolicy, Reason};
use quotad_core::FakeClock;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const CONFIG: &str = r#"
[policies.api]
algorithm = "fixed_window"
limit = 100
window = "1m"
"#;

/// Runs quotad with gRPC on `addr`; stops it when the sender is dropped or
/// fired.
async fn serve_on(addr: SocketAddr) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let config = Config::from_toml(CONFIG)
        .expect("valid config")
        .with_clock(Arc::new(FakeClock::new(NOON_30)));
    let listeners = Listeners {
        grpc: TcpListener::bind(addr)
            .await
            .expect("the port is free again")
            .into(),
        admin: TcpListener::bind("127.0.0.1:0").await.expect("bind admin"),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        quotad::run(config, listeners, async {
            let _ = stopped.await;
        })
        .await
        .expect("quotad serves and stops cleanly");
    });
    (stop, task)
}

async fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    listener.local_addr().expect("address")
}

#[tokio::test]
async fn a_client_made_before_quotad_starts_works_once_it_is_up_and_after_it_restarts() {
    let addr = free_addr().await;
    let client = Client::builder(format!("http://{addr}"))
        .deadline(Duration::from_millis(500))
        .build()
        .expect("valid address");
    let check = Check::named("api", "alice");
    assert!(matches!(
        client.check(&check).await,
        Err(Error::Unavailable(_))
    ));

    let (stop, task) = serve_on(addr).await;
    eventually(Duration::from_secs(10), "the client reaches quotad", || {
        let (client, check) = (client.clone(), check.clone());
        async move { client.check(&check).await.is_ok() }
    })
    .await;
    let _ = stop.send(());
    task.await.expect("stopped");
    assert!(client.check(&check).await.is_err(), "quotad is down");

    // A new quotad on the same port: the same client (and its clones) goes on.
    let (_stop, _task) = serve_on(addr).await;
    let clone = client.clone();
    eventually(Duration::from_secs(10), "the client reconnects", || {
        let (clone, check) = (clone.clone(), check.clone());
        async move { clone.check(&check).await.is_ok() }
    })
    .await;
}

/// A peer that accepts connections and never answers.
async fn black_hole() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    addr
}

#[tokio::test]
async fn a_silent_quotad_gets_the_failure_policy_within_the_deadline() {
    let addr = black_hole().await;
    for (policy, reason) in [
        (FailurePolicy::FailOpen, Some(Reason::FailOpen)),
        (FailurePolicy::FailClosed, Some(Reason::FailClosed)),
        (FailurePolicy::Error, None),
    ] {
        let client = Client::builder(format!("http://{addr}"))
            .deadline(Duration::from_millis(200))
            .on_unavailable(policy)
            .build()
            .expect("valid address");
        // The bound only catches a hang; it is not a timing assertion.
        let answer = tokio::time::timeout(
            Duration::from_secs(5),
            client.check(&Check::named("api", "alice")),
        )
        .await
        .expect("the deadline ends the call");
        match reason {
            Some(reason) => {
                let d = answer.expect("the failure policy answers");
                assert_eq!(d.reason, reason);
                assert_eq!(d.allowed, reason == Reason::FailOpen);
            }
            None => assert!(matches!(answer, Err(Error::Unavailable(_)))),
        }
    }
}

#[tokio::test]
async fn a_refusal_is_an_error_even_when_failing_open() {
    let addr = free_addr().await;
    let (_stop, _task) = serve_on(addr).await;
    let client = Client::builder(format!("http://{addr}"))
        .deadline(Duration::from_secs(5))
        .on_unavailable(FailurePolicy::FailOpen)
        .build()
        .expect("valid address");
    let unknown = client.check(&Check::named("no_such_policy", "alice")).await;
    assert!(
        matches!(&unknown, Err(Error::Rejected(s)) if s.code() == tonic::Code::NotFound),
        "{unknown:?}"
    );
    let zero = client.check(&Check::named("api", "alice").cost(0)).await;
    assert!(
        matches!(&zero, Err(Error::Rejected(s)) if s.code() == tonic::Code::InvalidArgument),
        "{zero:?}"
    );
    let d = client
        .check(&Check::named("api", "alice").cost(3))
        .await
        .expect("admitted");
    assert_eq!((d.allowed, d.remaining), (true, 97));
}
