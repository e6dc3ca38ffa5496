//! Criterion bench of the local decision: `Client::check` answered from a
//! held lease, with no call.
//!
//! Run with `cargo bench -p quotad-client --bench local_decision`. A small
//! in-process `quotad.v1.Leases` server grants one lease large and long
//! enough that no measured check renews it; each iteration polls
//! `Client::check` once (it completes without waiting: that is the local
//! path), so no executor is timed.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use quotad_client::{Check, Client, Clock, Decision, LeaseOptions, MAX_LEASE_WANT};
use quotad_core::MonotonicClock;
use quotad_proto::v1 as pb;
use quotad_proto::v1::leases_server::{Leases, LeasesServer};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// Grants every request a lease of all it wants, for a day.
struct Generous;

#[tonic::async_trait]
impl Leases for Generous {
    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let want = request.into_inner().want;
        Ok(Response::new(pb::LeaseResponse {
            lease: (want > 0).then(|| pb::Lease {
                lease_id: "bench".to_owned(),
                units: want,
                ttl_ms: 86_400_000,
            }),
            limit: want,
            remaining: 0,
            reset_after_ms: 86_400_000,
            ..Default::default()
        }))
    }
}

/// Polls a future that must complete at once.
fn now<F: Future<Output = T>, T>(future: F) -> T {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("the local path never waits"),
    }
}

fn local_decision(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let client = runtime.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(LeasesServer::new(Generous))
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        let client = Client::builder(format!("http://{addr}"))
            .leases(LeaseOptions::try_new(MAX_LEASE_WANT).expect("valid"))
            .build()
            .expect("valid address");
        // The first check finds no lease: it goes to quotad (not served
        // here) while the lease is acquired behind it.
        let _ = client.check(&Check::named("api", "user-42")).await;
        for _ in 0..10_000 {
            if client.lease_stats().held == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(client.lease_stats().held, 1, "the lease was granted");
        client
    });

    let check = Check::named("api", "user-42");
    let decision: Decision = now(client.check(&check)).expect("local");
    assert!(decision.allowed);
    let mut group = c.benchmark_group("local_decision");
    group.bench_function("one_key", |b| {
        b.iter(|| now(client.check(black_box(&check))))
    });
    // The floor under it: the one clock read every local decision makes
    // (the clock rule needs the instant of each admission).
    let clock = MonotonicClock::new();
    group.bench_function("clock_read", |b| b.iter(|| black_box(&clock).now_ms()));
    group.finish();
    assert_eq!(client.lease_stats().renewed, 0, "no measured check renewed");
    drop(client);
    drop(runtime);
}

criterion_group!(benches, local_decision);
criterion_main!(benches);
