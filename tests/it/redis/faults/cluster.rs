//! A Redis Cluster whose master hangs with its sockets open: at start,
//! quotad serves the others; while serving, it follows the failover to the
//! master's replica, however seldom the master's keys are called; while
//! the master stays hung, its calls neither make quotad connect again and
//! again nor hold up the other masters'. A dropped connection, a failback
//! and a resharded slot are followed without taking a healthy master for
//! an unreachable one.

use std::time::{Duration, Instant};

use quotad_proto::v1::quota_client::QuotaClient;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use super::{Answer, ask, attempts, three_policies};
use crate::common::redis::RedisCluster;
use crate::common::{TestServer, eventually};

/// quotad on the Cluster `nodes` (seeds) with the three policies (`open`
/// limited to `open_limit`) and a 200 ms timeout: a node is silent after
/// 600 ms, and the library gives up on a request after 800 ms.
async fn on_cluster(nodes: &[String], open_limit: u64) -> TestServer {
    TestServer::start(three_policies(
        &format!("cluster_nodes = {nodes:?}"),
        "200ms",
        open_limit,
    ))
    .await
}

/// Calls `key` under `policy` every `every` until `for_` after `started`,
/// each answer with when it came.
fn keep_calling(
    client: &QuotaClient<Channel>,
    key: &str,
    policy: &'static str,
    started: Instant,
    for_: Duration,
    every: Duration,
) -> JoinHandle<Vec<(Duration, Answer)>> {
    let (mut client, key) = (client.clone(), key.to_owned());
    tokio::spawn(async move {
        let mut answers = Vec::new();
        while started.elapsed() < for_ {
            let answer = ask(&mut client, &key, policy).await;
            answers.push((started.elapsed(), answer));
            tokio::time::sleep(every).await;
        }
        answers
    })
}

/// A master with a replica hangs, its sockets open, while its key is
/// called every `every`; the replica takes over within a few seconds
/// (cluster-node-timeout 1 s). The key fails open meanwhile, and is decided
/// again once quotad follows the failover: checked for 40 s at most.
async fn followed_to_the_replica(prefix: &str, every: Duration) {
    let mut cluster = RedisCluster::start_with_replica();
    let seeds: Vec<String> = cluster.urls().into_iter().take(3).collect();
    let key = cluster.keys_on(2, prefix, 1).remove(0);
    let server = on_cluster(&seeds, 1_000).await;
    let mut client = server.client().await;
    assert!(matches!(ask(&mut client, &key, "open").await, Answer::Decided(d) if d.allowed));

    cluster.nodes[2].pause();
    let paused = Instant::now();
    let mut answers = Vec::new();
    while paused.elapsed() < Duration::from_secs(40) {
        let answer = ask(&mut client, &key, "open").await;
        let decided = matches!(answer, Answer::Decided(_));
        answers.push(answer);
        if decided {
            break;
        }
        tokio::time::sleep(every).await;
    }
    assert!(
        matches!(answers.last(), Some(Answer::Decided(_))),
        "the hung master's key is decided again, by its replica: {answers:?}"
    );
    assert!(
        cluster.nodes[3].cli(&["role"]).starts_with("master"),
        "the replica is the master now"
    );
    cluster.nodes[2].resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_is_followed_to_its_promoted_replica() {
    followed_to_the_replica("hung", Duration::from_millis(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_called_less_often_than_the_librarys_bound_is_followed_all_the_same() {
    // One call every 1.5 s: each request has ended unanswered (after
    // 800 ms) before the next is sent, so none is waiting when it looks.
    followed_to_the_replica("sparse", Duration::from_millis(1_500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotad_starts_with_a_cluster_master_hung_and_serves_the_other_masters_keys() {
    let mut cluster = RedisCluster::start();
    let healthy = cluster.keys_on(0, "start", 1).remove(0);
    let hung = cluster.keys_on(2, "start", 1).remove(0);
    cluster.nodes[2].pause();
    let server = on_cluster(&cluster.urls(), 10).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_stays_hung_is_not_a_storm_of_connections() {
    let mut cluster = RedisCluster::start();
    let key = cluster.keys_on(2, "storm", 1).remove(0);
    let server = on_cluster(&cluster.urls(), 1_000).await;
    let mut client = server.client().await;
    assert!(matches!(ask(&mut client, &key, "open").await, Answer::Decided(d) if d.allowed));
    let (ok, failed) = attempts(&server).await;

    // No replica takes over: the master's keys fail for as long as it
    // hangs. One call a second: the second finds the master silent (the
    // library gave up on the first one's request after 800 ms).
    cluster.nodes[2].pause();
    let mut answers = Vec::new();
    for _ in 0..10 {
        answers.push(ask(&mut client, &key, "open").await);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (ok_after, failed_after) = attempts(&server).await;
    cluster.nodes[2].resume();
    assert!(
        answers
            .iter()
            .all(|a| *a == Answer::Failed("FailOpen".to_owned())),
        "{answers:?}"
    );
    let rebuilds = ok_after + failed_after - ok - failed;
    // One rebuild when a call finds the master silent (two if the first
    // attempt failed): the new connection has none to the hung master, and
    // the library fails its calls at once, so it is not judged silent
    // again.
    assert!(
        (1.0..=2.0).contains(&rebuilds),
        "{rebuilds} rebuilds for 10 calls to a hung master, one a second"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_being_resharded_fails_only_the_keys_its_old_master_lacks_and_counts_each_hit_once()
{
    let cluster = RedisCluster::start();
    let key = cluster.keys_on(2, "reshard", 1).remove(0);
    // Another client key in the same slot: its Redis key's hash tag is
    // `key` (the first `{...}` of `...|{<key>}fresh}|...`).
    let fresh = format!("{key}}}fresh");
    let server = on_cluster(&cluster.urls(), 10).await;
    let mut client = server.client().await;
    let mut ask_closed = async |key: &str| match ask(&mut client, key, "closed").await {
        Answer::Decided(d) => Some(d.remaining),
        Answer::Failed(reason) => {
            assert_eq!(reason, "FailClosed", "{key}");
            None
        }
    };
    assert_eq!(ask_closed(&key).await, Some(9));

    // Move the key's slot from node 2 to node 0, as `redis-cli --cluster
    // reshard` does: mark it, move its keys, hand the slot over.
    let (from, to) = (&cluster.nodes[2], &cluster.nodes[0]);
    let slot = from.cli(&["cluster", "keyslot", &key]).trim().to_owned();
    let id =
        |node: &crate::common::redis::RedisServer| node.cli(&["cluster", "myid"]).trim().to_owned();
    let (from_id, to_id) = (id(from), id(to));
    assert_eq!(
        to.cli(&["cluster", "setslot", &slot, "importing", &from_id])
            .trim(),
        "OK"
    );
    assert_eq!(
        from.cli(&["cluster", "setslot", &slot, "migrating", &to_id])
            .trim(),
        "OK"
    );
    // Marked: the old master decides the key it holds; one it does not
    // hold gets ASK, not followed: it fails, and nothing is created.
    assert_eq!(ask_closed(&key).await, Some(8));
    assert_eq!(ask_closed(&fresh).await, None);
    assert_eq!(to.cli(&["cluster", "countkeysinslot", &slot]).trim(), "0");

    let keys = from.cli(&["cluster", "getkeysinslot", &slot, "100"]);
    let keys: Vec<&str> = keys
        .lines()
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .collect();
    assert!(!keys.is_empty(), "the slot holds the key's state");
    let port = to.port.to_string();
    let mut migrate = vec!["migrate", "127.0.0.1", &port, "", "0", "5000", "keys"];
    migrate.extend(keys.iter().copied());
    assert_eq!(from.cli(&migrate).trim(), "OK");
    // Moved, slot still migrating: ASK; the key's calls fail and count
    // nothing on either master.
    for _ in 0..3 {
        assert_eq!(ask_closed(&key).await, None);
    }

    // The slot is node 0's. The library still sends it to node 2, which
    // answers MOVED: quotad sends it once more, and the count goes on from
    // where the old master left it.
    for node in &cluster.nodes {
        assert_eq!(
            node.cli(&["cluster", "setslot", &slot, "node", &to_id])
                .trim(),
            "OK"
        );
    }
    for left in [7, 6, 5] {
        assert_eq!(ask_closed(&key).await, Some(left));
    }
    assert_eq!(ask_closed(&fresh).await, Some(9));
    assert_eq!(from.cli(&["cluster", "countkeysinslot", &slot]).trim(), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_hung_master_do_not_hold_up_the_healthy_masters() {
    let mut cluster = RedisCluster::start();
    let hung = cluster.keys_on(2, "held", 1).remove(0);
    let healthy = cluster.keys_on(0, "held", 1).remove(0);
    let server = on_cluster(&cluster.urls(), 1_000_000).await;
    let client = server.client().await;
    assert!(matches!(
        ask(&mut client.clone(), &hung, "open").await,
        Answer::Decided(_)
    ));

    // No replica: the master stays hung for the 8 s of the test, its key
    // called 20 times a second, and a healthy master's key as often. Each
    // call to a primary the client library cannot reach would make it read
    // the slot map again, holding every call for up to a timeout.
    cluster.nodes[2].pause();
    let started = Instant::now();
    let (eight_s, every) = (Duration::from_secs(8), Duration::from_millis(50));
    let to_hung = keep_calling(&client, &hung, "open", started, eight_s, every);
    let to_healthy = keep_calling(&client, &healthy, "err", started, eight_s, every);
    let to_hung: Vec<Answer> = to_hung
        .await
        .expect("hung calls")
        .into_iter()
        .map(|(_, a)| a)
        .collect();
    let to_healthy: Vec<Answer> = to_healthy
        .await
        .expect("healthy calls")
        .into_iter()
        .map(|(_, a)| a)
        .collect();
    cluster.nodes[2].resume();
    assert!(
        to_hung
            .iter()
            .all(|a| *a == Answer::Failed("FailOpen".to_owned())),
        "{to_hung:?}"
    );
    let failed = to_healthy
        .iter()
        .filter(|a| !matches!(a, Answer::Decided(_)))
        .count();
    // At most one call through to the hung master every 5 s (after the
    // first that finds it unreachable), each holding the healthy calls
    // for up to a timeout: a few failures, not one in four.
    assert!(
        failed * 10 <= to_healthy.len(),
        "{failed} of {} calls to a healthy master failed",
        to_healthy.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failback_is_followed_at_once_not_taken_for_an_unreachable_master() {
    let cluster = RedisCluster::start_with_replica();
    let seeds: Vec<String> = cluster.urls().into_iter().take(3).collect();
    let key = cluster.keys_on(2, "failback", 1).remove(0);
    let server = on_cluster(&seeds, 1_000_000).await;
    let mut client = server.client().await;
    assert!(matches!(
        ask(&mut client, &key, "err").await,
        Answer::Decided(_)
    ));
    let (master, replica) = (&cluster.nodes[2], &cluster.nodes[3]);
    let is_master =
        |node: &crate::common::redis::RedisServer| node.cli(&["role"]).starts_with("master");
    let until_decided = |what: &'static str| {
        let client = client.clone();
        let key = key.clone();
        eventually(Duration::from_secs(1), what, move || {
            let mut client = client.clone();
            let key = key.clone();
            async move { matches!(ask(&mut client, &key, "err").await, Answer::Decided(_)) }
        })
    };

    // An operator's failover to the replica and back (`CLUSTER FAILOVER`):
    // nothing hangs, so quotad's own slot map keeps the first master. After
    // the failback, the library (which followed the failover) sends the
    // key to the replica, which answers MOVED back to the master quotad's
    // map names: the library reconnects at once, and the key is decided
    // again within moments, not failed for the 5 s of an unreachable one.
    assert_eq!(replica.cli(&["cluster", "failover"]).trim(), "OK");
    eventually(
        Duration::from_secs(10),
        "the replica is promoted",
        || async { is_master(replica) },
    )
    .await;
    until_decided("decided by the promoted replica").await;
    eventually(
        Duration::from_secs(20),
        "the old master replicates",
        || async {
            master
                .cli(&["info", "replication"])
                .contains("master_link_status:up")
        },
    )
    .await;
    // The other masters vote for the same shard's replica again only after
    // twice cluster-node-timeout: an operator's failover is asked again
    // until it is taken.
    eventually(Duration::from_secs(20), "the master is back", || async {
        if !is_master(master) {
            master.cli(&["cluster", "failover"]);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        is_master(master)
    })
    .await;
    until_decided("decided by the master again").await;
    for _ in 0..20 {
        assert!(matches!(
            ask(&mut client, &key, "err").await,
            Answer::Decided(_)
        ));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_primary_whose_connection_drops_is_not_taken_for_unreachable() {
    let cluster = RedisCluster::start();
    let key = cluster.keys_on(0, "kill", 1).remove(0);
    let server = on_cluster(&cluster.urls(), 1_000_000).await;
    let client = server.client().await;
    assert!(matches!(
        ask(&mut client.clone(), &key, "err").await,
        Answer::Decided(_)
    ));

    // Six callers on one key for 4 s; after 1 s its master drops every
    // client connection (`CLIENT KILL`, as an idle timeout or a proxy
    // restart would). While the library reconnects, it sends the key's
    // requests to other nodes, which answer MOVED back to the master: a
    // few calls fail, then it is reached again at once.
    let started = Instant::now();
    let callers: Vec<_> = (0..6)
        .map(|_| {
            let (four_s, every) = (Duration::from_secs(4), Duration::from_millis(5));
            keep_calling(&client, &key, "err", started, four_s, every)
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = cluster.nodes[0].cli(&["client", "kill", "type", "normal"]);
    assert!(
        killed.trim().parse::<u32>().is_ok_and(|n| n >= 1),
        "{killed}"
    );
    let mut answers = Vec::new();
    for caller in callers {
        answers.extend(caller.await.expect("caller"));
    }
    // Marked unreachable, the master's calls would fail for 5 s from the
    // kill on; reached again, those a second after it are all decided.
    let late: Vec<_> = answers
        .iter()
        .filter(|(at, _)| *at > Duration::from_secs(2))
        .collect();
    assert!(late.len() >= 6, "calls went on after the kill");
    let failed: Vec<_> = late
        .iter()
        .filter(|(_, a)| !matches!(a, Answer::Decided(_)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} calls a second after one dropped connection failed: {:?}",
        failed.len(),
        late.len(),
        failed.first()
    );
}
