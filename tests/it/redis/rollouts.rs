//! Replicas that disagree during a rollout share one Redis without
//! overwriting each other's state (a reset through one clears its own);
//! deployments with their own key prefix share it without sharing budgets.

use crate::common::redis::RedisServer;
use crate::common::{TestServer, named, peek};
use quotad::Config;
use quotad_proto::v1 as pb;

fn replica(url: &str, algorithm: &str, window: &str, limit: u64) -> Config {
    with_prefix(url, "quotad", algorithm, window, limit)
}

fn with_prefix(url: &str, prefix: &str, algorithm: &str, window: &str, limit: u64) -> Config {
    Config::from_toml(&format!(
        "[store]\nbackend = \"redis\"\n[store.redis]\nurl = {url:?}\ntimeout = \"2s\"\nkey_prefix = {prefix:?}\n\
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
    assert_eq!(n, 20, "each counts its own 10");
    // One algorithm, two windows.
    let n = admitted_alternating(
        replica(&url, "token_bucket", "1h", 10),
        replica(&url, "token_bucket", "1d", 10),
        "windows",
    )
    .await;
    assert_eq!(n, 20, "each counts its own 10");
    // A changed limit shares the state: together no more than the larger.
    let n = admitted_alternating(
        replica(&url, "fixed_window", "1h", 10),
        replica(&url, "fixed_window", "1h", 15),
        "limits",
    )
    .await;
    assert_eq!(n, 15, "one count, judged by each replica's limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_during_a_rollout_clears_the_count_of_the_replica_it_went_through() {
    let redis = RedisServer::start();
    let url = redis.url();
    let a = TestServer::start(replica(&url, "fixed_window", "1h", 10)).await;
    let b = TestServer::start(replica(&url, "sliding_window", "1h", 10)).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    for client in [&mut ca, &mut cb] {
        client
            .check(named("reset", "api", Some(4)))
            .await
            .expect("decided");
    }
    let reset = pb::ResetRequest {
        key: "reset".to_owned(),
        policy: Some(pb::reset_request::Policy::PolicyName("api".to_owned())),
    };
    ca.reset(reset).await.expect("reset");
    // A's key is fresh; B counts in its own key (another algorithm), which
    // the reset did not name.
    assert_eq!(
        peek(&mut ca, named("reset", "api", None)).await.remaining,
        10
    );
    assert_eq!(
        peek(&mut cb, named("reset", "api", None)).await.remaining,
        6
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_with_their_own_key_prefix_keep_their_own_budgets_on_one_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let same = admitted_alternating(
        with_prefix(&url, "team-a", "fixed_window", "1h", 10),
        with_prefix(&url, "team-a", "fixed_window", "1h", 10),
        "shared",
    )
    .await;
    assert_eq!(same, 10, "one prefix, one budget");
    let apart = admitted_alternating(
        with_prefix(&url, "team-a", "fixed_window", "1h", 10),
        with_prefix(&url, "team-b", "fixed_window", "1h", 10),
        "apart",
    )
    .await;
    assert_eq!(apart, 20, "two prefixes, two budgets");
    let keys = redis.cli(&["--scan"]);
    assert!(
        keys.lines().any(|k| k.starts_with("team-a:"))
            && keys.lines().any(|k| k.starts_with("team-b:")),
        "{keys}"
    );
}
