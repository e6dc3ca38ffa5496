//! The reason quotad exists: application replicas that each count locally
//! admit about N x the limit; replicas that ask one quotad admit exactly the
//! limit. Each replica here is independent: its own thread, its own tokio
//! runtime and its own client connection.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::common::{TestServer, admitted};
use quotad_client::Client;
use quotad_core::{Algorithm, CheckItem, FakeClock, MemoryStore, OnFull, Policy, StoreConfig};

const LIMIT: u64 = 30;
const REPLICAS: usize = 3;
const REQUESTS_PER_REPLICA: usize = 40;

const CONFIG: &str = r#"
[policies.orders]
algorithm = "sliding_window"
limit = 30
window = "1h"
"#;

/// Runs `replica` on REPLICAS threads released together; sums what they admit.
fn replicas(replica: impl Fn(usize) -> usize + Send + Sync + 'static) -> usize {
    let replica = Arc::new(replica);
    let start = Arc::new(Barrier::new(REPLICAS));
    let threads: Vec<_> = (0..REPLICAS)
        .map(|r| {
            let replica = Arc::clone(&replica);
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                replica(r)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("replica finished"))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_through_one_quotad_admit_exactly_the_limit_every_run() {
    let clock = Arc::new(FakeClock::new(1_767_268_800_000));
    let server = TestServer::start_toml(CONFIG, clock).await;
    let address = format!("http://{}", server.grpc_addr);
    for run in 0..10 {
        let address = address.clone();
        let key = format!("customer-{run}");
        let admitted = tokio::task::spawn_blocking(move || {
            replicas(move |_| {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("a replica runtime");
                runtime.block_on(async {
                    let client = Client::builder(address.clone())
                        .deadline(Duration::from_secs(10))
                        .build()
                        .expect("valid address");
                    admitted(&[client], "orders", &key, REQUESTS_PER_REPLICA).await
                })
            })
        })
        .await
        .expect("replicas finished");
        assert_eq!(admitted as u64, LIMIT, "run {run}");
    }
}

#[test]
fn three_replicas_with_local_limiters_admit_three_times_the_limit() {
    let admitted = replicas(|_| {
        // What each replica would do on its own: an in-process limiter.
        let config = StoreConfig::try_new(1_000, 1, OnFull::Deny).expect("valid");
        let local = MemoryStore::new(config, Arc::new(FakeClock::new(1_767_268_800_000)));
        let policy = Policy::try_new(
            Algorithm::SlidingWindow,
            LIMIT,
            Duration::from_secs(3_600),
            None,
        )
        .expect("valid");
        let item = CheckItem::new("orders", policy, "customer", 1).expect("valid");
        (0..REQUESTS_PER_REPLICA)
            .filter(|_| local.check_one(&item).allowed)
            .count()
    });
    assert_eq!(admitted as u64, LIMIT * REPLICAS as u64);
}
