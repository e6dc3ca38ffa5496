//! A Redis Cluster whose master hangs with its sockets open: at start,
//! quotad serves the others; while serving, it follows the failover to the
//! master's replica.

use std::time::Duration;

use super::{Answer, ask, three_policies};
use crate::common::redis::RedisCluster;
use crate::common::{TestServer, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_is_followed_to_its_promoted_replica() {
    let mut cluster = RedisCluster::start_with_replica();
    let seeds: Vec<String> = cluster.urls().into_iter().take(3).collect();
    let key = cluster.keys_on(2, "hung", 1).remove(0);
    let server = TestServer::start(three_policies(
        &format!("cluster_nodes = {seeds:?}"),
        "200ms",
        1_000,
    ))
    .await;
    let mut client = server.client().await;
    assert!(matches!(ask(&mut client, &key, "open").await, Answer::Decided(d) if d.allowed));

    // The master hangs, its sockets open; its replica takes over within a
    // few seconds (cluster-node-timeout 1 s). Its keys fail open meanwhile,
    // and are decided again once quotad follows the failover.
    cluster.nodes[2].pause();
    eventually(
        Duration::from_secs(30),
        "the hung master's keys are decided again, by its replica",
        || {
            let mut client = client.clone();
            let key = key.clone();
            async move { matches!(ask(&mut client, &key, "open").await, Answer::Decided(_)) }
        },
    )
    .await;
    assert!(
        cluster.nodes[3].cli(&["role"]).starts_with("master"),
        "the replica is the master now"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotad_starts_with_a_cluster_master_hung_and_serves_the_other_masters_keys() {
    let mut cluster = RedisCluster::start();
    let healthy = cluster.keys_on(0, "start", 1).remove(0);
    let hung = cluster.keys_on(2, "start", 1).remove(0);
    cluster.nodes[2].pause();
    let server = TestServer::start(three_policies(
        &format!("cluster_nodes = {:?}", cluster.urls()),
        "200ms",
        10,
    ))
    .await;
    let client = server.client().await;
    eventually(
        Duration::from_secs(15),
        "a healthy master's key is decided",
        || {
            let mut client = client.clone();
            let key = healthy.clone();
            async move { matches!(ask(&mut client, &key, "err").await, Answer::Decided(d) if d.allowed) }
        },
    )
    .await;
    assert!(!server.has_stopped(), "quotad serves");
    let mut client = client.clone();
    assert_eq!(
        ask(&mut client, &hung, "closed").await,
        Answer::Failed("FailClosed".to_owned())
    );
    assert_eq!(
        ask(&mut client, &hung, "open").await,
        Answer::Failed("FailOpen".to_owned())
    );
    cluster.nodes[2].resume();
}
