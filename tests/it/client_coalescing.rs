//! Coalesced and one-by-one checks get the same decisions from the real
//! server.
//!
//! A module of the root integration test binary (`tests/it`, declared as
//! `mod client_coalescing;`), using its `common` helpers.

use std::sync::Arc;
use std::time::Duration;

use quotad_client::{Check, Client, Coalescing, DEFAULT_MAX_BATCH_BYTES, Decision};
use quotad_core::FakeClock;

use crate::common::{NOON_30, TestServer};

const CONFIG: &str = r#"
[policies.api]
algorithm = "sliding_window"
limit = 10
window = "1m"
"#;

/// Waves of concurrent checks: within a wave every check has its own key
/// (so its decision does not depend on the order), and the waves, one after
/// another, spend from the same keys until they are denied.
async fn run_waves(client: &Client) -> Vec<Decision> {
    let mut decisions = Vec::new();
    for wave in 0..6u64 {
        let calls: Vec<_> = (0..25u64)
            .map(|k| {
                let client = client.clone();
                let check = Check::named("api", format!("key-{k}")).cost(1 + (k + wave) % 5);
                tokio::spawn(async move { client.check(&check).await })
            })
            .collect();
        for call in calls {
            decisions.push(call.await.expect("no panic").expect("decided"));
        }
    }
    decisions
}

async fn server() -> TestServer {
    // A clock that stands still: both servers decide at the same instant.
    TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await
}

fn client(server: &TestServer, coalescing: Coalescing) -> Client {
    Client::builder(format!("http://{}", server.grpc_addr))
        .deadline(Duration::from_secs(10))
        .coalescing(coalescing)
        // Every check reaches the server, so both runs are decided there.
        .deny_cache(0)
        .build()
        .expect("valid address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_checks_get_the_decisions_checks_sent_one_by_one_get() {
    for round in 0..3 {
        let batched_server = server().await;
        let single_server = server().await;
        let one_slot = Coalescing::try_new(1, 1_000, DEFAULT_MAX_BATCH_BYTES).expect("valid");
        let batched = run_waves(&client(&batched_server, one_slot)).await;
        let single = run_waves(&client(&single_server, Coalescing::off())).await;
        assert_eq!(batched, single, "round {round}");
        assert!(
            batched.iter().any(|d| !d.allowed),
            "the waves reach the limit"
        );

        let ops = |m: &crate::common::Metrics, op: &str| {
            m.value(
                "quotad_store_operations_total",
                &[("backend", "memory"), ("op", op)],
            )
        };
        let batched_metrics = batched_server.metrics().await;
        let single_metrics = single_server.metrics().await;
        assert!(
            ops(&batched_metrics, "check_batch") > 0.0,
            "some checks shared a batch"
        );
        assert_eq!(ops(&single_metrics, "check_batch"), 0.0);
        assert_eq!(ops(&single_metrics, "check"), 150.0);
    }
}
