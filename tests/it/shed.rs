//! Load shedding at `transport.max_in_flight`: with the bound's worth of
//! calls held in flight by a stalled Redis (SIGSTOP), the next call is
//! refused with UNAVAILABLE without reaching the store or counting
//! anything, health checking still answers, and calls are served again
//! once the held ones finish.

use quotad::Config;
use quotad_proto::v1 as pb;
use std::time::Duration;
use tonic::Code;

use crate::common::redis::RedisServer;
use crate::common::{TestServer, check, eventually, health_status, named, peek};

const MAX_IN_FLIGHT: usize = 4;

fn config(redis: &RedisServer) -> Config {
    Config::from_toml(&format!(
        r#"
[transport]
max_in_flight = {MAX_IN_FLIGHT}

[store]
backend = "redis"

[store.redis]
url = {:?}
timeout = "4s"

[policies.api]
algorithm = "fixed_window"
limit = 1000
window = "1d"

[policies.jobs]
algorithm = "concurrency"
limit = 5
slot_ttl = "1m"
"#,
        redis.url()
    ))
    .expect("valid config")
}

async fn store_checks(server: &TestServer) -> f64 {
    server.metrics().await.value(
        "quotad_store_operations_total",
        &[("backend", "redis"), ("op", "check")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_past_max_in_flight_is_refused_at_once_and_counts_nothing() {
    let mut redis = RedisServer::start();
    let server = TestServer::start(config(&redis)).await;
    let mut client = server.client().await;
    let first = check(&mut client, named("k", "api", None)).await;
    assert!(first.allowed);
    let mut admitted = 1;
    let mut shed = 0.0;
    // Repeated: each round fills the bound anew.
    for round in 0..3 {
        let before = store_checks(&server).await;
        redis.pause();
        let mut held = Vec::new();
        for _ in 0..MAX_IN_FLIGHT {
            let mut client = client.clone();
            held.push(tokio::spawn(async move {
                client.check(named("k", "api", None)).await
            }));
        }
        eventually(
            Duration::from_secs(10),
            "the bound's worth of calls waits on the stalled Redis",
            || async { store_checks(&server).await == before + MAX_IN_FLIGHT as f64 },
        )
        .await;

        // Refused while every held call still waits on Redis: it was never
        // queued behind them.
        let refused = client
            .check(named("k", "api", None))
            .await
            .expect_err("shed");
        assert_eq!(refused.code(), Code::Unavailable, "round {round}");
        assert!(
            refused.message().contains("max_in_flight"),
            "{}",
            refused.message()
        );
        assert!(held.iter().all(|h| !h.is_finished()), "round {round}");
        shed += 1.0;
        let metrics = server.metrics().await;
        assert_eq!(metrics.value("quotad_calls_shed_total", &[]), shed);
        assert_eq!(
            store_checks(&server).await,
            before + MAX_IN_FLIGHT as f64,
            "the shed call never reached the store"
        );
        // Health is never shed: a busy replica is not a dead one.
        assert_eq!(health_status(&server, "").await, 1, "SERVING");
        // Nor is a slot's release (or renewal): shed, it would strand the
        // capacity it frees. It goes to the (stalled) store instead.
        let mut slots =
            quotad_proto::v1::concurrency_client::ConcurrencyClient::new(server.channel().await);
        let release = tokio::spawn(async move {
            slots
                .release(pb::SlotRequest {
                    key: "k".to_owned(),
                    policy: Some(pb::slot_request::Policy::PolicyName("jobs".to_owned())),
                    slot_id: "00000000000000ab".to_owned(),
                })
                .await
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !release.is_finished(),
            "round {round}: the release was not shed"
        );

        redis.resume();
        let released = release.await.expect("no panic").expect("answered");
        assert!(!released.into_inner().was_held, "an unknown slot");
        for call in held {
            let d = call
                .await
                .expect("no panic")
                .expect("answered once Redis resumes")
                .into_inner()
                .decision
                .expect("a decision");
            assert_eq!(d.reason(), pb::Reason::WithinLimit, "{d:?}");
            admitted += 1;
        }
        let next = check(&mut client, named("k", "api", None)).await;
        assert!(next.allowed, "served again: {next:?}");
        admitted += 1;
    }
    let d = peek(&mut client, named("k", "api", None)).await;
    assert_eq!(
        d.remaining,
        1000 - admitted,
        "the shed calls counted nothing"
    );
}
