//! Replicas that disagree during a rollout share one Redis without
//! overwriting each other's state.

use crate::common::redis::RedisServer;
use crate::common::{TestServer, named};
use quotad::Config;
use quotad_proto::v1 as pb;

fn replica(url: &str, algorithm: &str, window: &str, limit: u64) -> Config {
    Config::from_toml(&format!(
        "[store]\nbackend = \"redis\"\n[store.redis]\nurl = {url:?}\ntimeout = \"2s\"\n\
         [policies.api]\nalgorithm = \"{algorithm}\"\nlimit = {limit}\nwindow = \"{window}\"\n"
    ))
    .expect("valid config")
}

/// 100 checks of one key alternating between two replicas.
async fn admitted_alternating(a: Config, b: Config, key: &str) -> u32 {
    let (a, b) = (TestServer::start(a).await, TestServer::start(b).await);
    let mut clients = [a.client().await, b.client().await];
    let mut admitted = 0;
    for i in 0..100 {
        let d = clients[i % 2]
            .check(named(key, "api", None))
            .await
            .expect("decided")
            .into_inner()
            .decision
            .expect("a decision");
        assert!(
            matches!(
                d.reason(),
                pb::Reason::WithinLimit | pb::Reason::LimitExceeded
            ),
            "{d:?}"
        );
        admitted += u32::from(d.allowed);
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_that_disagree_on_algorithm_or_window_admit_at_most_the_sum_of_their_limits() {
    let redis = RedisServer::start();
    let url = redis.url();
    // Two algorithms, one window.
    let n = admitted_alternating(
        replica(&url, "fixed_window", "1h", 10),
        replica(&url, "sliding_window", "1h", 10),
        "algorithms",
    )
    .await;
    assert!(n <= 20, "{n} admitted");
    // One algorithm, two windows.
    let n = admitted_alternating(
        replica(&url, "token_bucket", "1h", 10),
        replica(&url, "token_bucket", "1d", 10),
        "windows",
    )
    .await;
    assert!(n <= 20, "{n} admitted");
    // A changed limit shares the state: together no more than the larger.
    let n = admitted_alternating(
        replica(&url, "fixed_window", "1h", 10),
        replica(&url, "fixed_window", "1h", 15),
        "limits",
    )
    .await;
    assert!(n <= 15, "{n} admitted");
}
