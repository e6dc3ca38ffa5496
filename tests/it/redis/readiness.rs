//! Readiness that follows Redis (`server.readiness_follows_store`): the
//! probe is a `PING` within the store's timeout, on every primary of a
//! Cluster.

use quotad::Config;

use crate::common::TestServer;
use crate::common::redis::{RedisCluster, RedisServer};

fn config(target: &str) -> Config {
    Config::from_toml(&format!(
        r#"
[server]
readiness_follows_store = true

[store]
backend = "redis"

[store.redis]
{target}
timeout = "200ms"

[policies.api]
algorithm = "fixed_window"
limit = 10
window = "1m"
"#
    ))
    .expect("valid config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_redis_is_stopped_and_200_once_it_runs_again() {
    let mut redis = RedisServer::start();
    let server = TestServer::start(config(&format!("url = {:?}", redis.url()))).await;
    server.readyz_turns(200).await;
    redis.pause();
    server.readyz_turns(503).await;
    // Liveness does not follow the store: the process is fine.
    assert_eq!(server.get("/healthz").await.0, 200);
    redis.resume();
    server.readyz_turns(200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stopped_cluster_primary_makes_quotad_not_ready() {
    let mut cluster = RedisCluster::start();
    let server = TestServer::start(config(&format!("cluster_nodes = {:?}", cluster.urls()))).await;
    server.readyz_turns(200).await;
    cluster.nodes[1].pause();
    server.readyz_turns(503).await;
    cluster.nodes[1].resume();
    server.readyz_turns(200).await;
}
