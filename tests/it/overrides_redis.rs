//! Runtime overrides on Redis: every replica on one Redis applies the same
//! overrides within about `store.redis.overrides_poll_interval`, and a
//! replica that cannot read them keeps the last set it read and says so.
//! Real redis-server processes; SIGSTOP for a stalled Redis.

use std::time::{Duration, Instant};

use quotad::Config;
use quotad_proto::v1 as pb;
use quotad_proto::v1::overrides_client::OverridesClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::common::redis::RedisServer;
use crate::common::{TestServer, check, eventually, named};

/// A generous bound on what the tests wait for (not a performance claim:
/// the propagation measured is printed).
const WITHIN: Duration = Duration::from_secs(10);

fn config(redis: &RedisServer, poll: &str) -> Config {
    Config::from_toml(&format!(
        r#"
[store]
backend = "redis"

[store.redis]
url = "{}"
timeout = "200ms"
overrides_poll_interval = "{poll}"

[policies.api]
algorithm = "fixed_window"
limit = 3
window = "1d"
"#,
        redis.url()
    ))
    .expect("valid config")
}

fn set_prefix(p: &str, limit: u64) -> pb::SetOverrideRequest {
    pb::SetOverrideRequest {
        policy: "api".to_owned(),
        scope: Some(pb::OverrideScope {
            scope: Some(pb::override_scope::Scope::Prefix(p.to_owned())),
        }),
        limit,
        ..pb::SetOverrideRequest::default()
    }
}

async fn overrides(server: &TestServer) -> OverridesClient<Channel> {
    OverridesClient::new(server.channel().await)
}

async fn listed(client: &mut OverridesClient<Channel>) -> pb::ListOverridesResponse {
    client
        .list_overrides(pb::ListOverridesRequest::default())
        .await
        .expect("listed")
        .into_inner()
}

/// The limit `server` counts `key` under `api` by, as a check reports it.
async fn limit_of(server: &TestServer, key: &str) -> u64 {
    let mut client = server.client().await;
    check(&mut client, named(key, "api", None)).await.limit
}

#[tokio::test]
async fn a_change_on_one_replica_is_in_force_on_the_other_within_the_poll_interval() {
    let redis = RedisServer::start();
    let a = TestServer::start(config(&redis, "50ms")).await;
    let b = TestServer::start(config(&redis, "50ms")).await;
    let (mut on_a, mut on_b) = (overrides(&a).await, overrides(&b).await);
    let mut took = Vec::new();
    for round in 0..5u64 {
        let limit = 10 + round;
        let started = Instant::now();
        on_a.set_override(set_prefix("t:", limit))
            .await
            .expect("set on a");
        loop {
            let seen = listed(&mut on_b).await;
            if seen.overrides.first().map(|o| o.limit) == Some(limit) {
                took.push(started.elapsed());
                break;
            }
            assert!(
                started.elapsed() < WITHIN,
                "replica b never saw limit {limit}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(limit_of(&b, &format!("t:{round}")).await, limit);
    }
    eprintln!("override propagation with a 50ms poll, 5 changes: {took:?}");
    // A removal propagates too, and the policy applies again.
    on_a.remove_override(pb::RemoveOverrideRequest {
        policy: "api".to_owned(),
        scope: set_prefix("t:", 1).scope,
    })
    .await
    .expect("removed");
    eventually(WITHIN, "b drops the removed override", || {
        let mut on_b = on_b.clone();
        async move { listed(&mut on_b).await.overrides.is_empty() }
    })
    .await;
    assert_eq!(limit_of(&b, "t:new").await, 3);
    // A replica started later reads them before it serves.
    on_b.set_override(set_prefix("late:", 7))
        .await
        .expect("set on b");
    let c = TestServer::start(config(&redis, "1h")).await;
    assert_eq!(limit_of(&c, "late:1").await, 7);
}

#[tokio::test]
async fn a_replica_that_cannot_read_the_overrides_keeps_its_last_set_and_says_so() {
    let mut redis = RedisServer::start();
    let a = TestServer::start(config(&redis, "50ms")).await;
    let mut on_a = overrides(&a).await;
    on_a.set_override(set_prefix("t:", 9)).await.expect("set");
    assert!(listed(&mut on_a).await.in_sync);
    redis.pause();
    eventually(WITHIN, "a reports it is out of sync", || {
        let mut on_a = on_a.clone();
        async move { !listed(&mut on_a).await.in_sync }
    })
    .await;
    let seen = listed(&mut on_a).await;
    assert_eq!(
        seen.overrides.first().map(|o| o.limit),
        Some(9),
        "the last set read"
    );
    let metrics = a.metrics().await;
    assert_eq!(metrics.value("quotad_overrides_in_sync", &[]), 0.0);
    // A change the store cannot keep is refused and changes nothing.
    let refused = on_a
        .set_override(set_prefix("t:", 99))
        .await
        .expect_err("redis is stalled");
    assert_eq!(refused.code(), Code::Unavailable);
    assert_eq!(
        listed(&mut on_a).await.overrides.first().map(|o| o.limit),
        Some(9)
    );
    redis.resume();
    eventually(WITHIN, "a is in sync again", || {
        let mut on_a = on_a.clone();
        async move { listed(&mut on_a).await.in_sync }
    })
    .await;
    assert_eq!(limit_of(&a, "t:1").await, 9);
    assert_eq!(
        a.metrics().await.value("quotad_overrides_in_sync", &[]),
        1.0
    );
}
