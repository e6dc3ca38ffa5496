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

fn config_with(redis_url: &str, poll: &str, limits: &str) -> Config {
    Config::from_toml(&format!(
        r#"
[store]
backend = "redis"

[store.redis]
url = "{redis_url}"
timeout = "200ms"
overrides_poll_interval = "{poll}"

[limits]
{limits}

[policies.api]
algorithm = "fixed_window"
limit = 3
window = "1d"
"#
    ))
    .expect("valid config")
}

fn set_key(k: &str, limit: u64) -> pb::SetOverrideRequest {
    pb::SetOverrideRequest {
        scope: Some(pb::OverrideScope {
            scope: Some(pb::override_scope::Scope::Key(k.to_owned())),
        }),
        ..set_prefix("unused", limit)
    }
}

/// The overrides stored in Redis (the hash's fields but its own).
fn stored(redis: &RedisServer) -> Vec<String> {
    redis
        .cli(&["HKEYS", "quotad:overrides"])
        .lines()
        .filter(|f| !f.trim().is_empty() && !f.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn sets_racing_on_two_replicas_never_exceed_max_overrides() {
    let redis = RedisServer::start();
    // A long poll: neither replica learns of the other's writes, so only
    // the store can hold the count.
    let a = TestServer::start(config_with(&redis.url(), "1h", "max_overrides = 3")).await;
    let b = TestServer::start(config_with(&redis.url(), "1h", "max_overrides = 3")).await;
    let (on_a, on_b) = (overrides(&a).await, overrides(&b).await);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..8 {
        for (name, client) in [("a", &on_a), ("b", &on_b)] {
            let mut client = client.clone();
            calls.spawn(async move {
                client
                    .set_override(set_key(&format!("{name}{i}"), 10))
                    .await
            });
        }
    }
    let (mut kept, mut refused) = (0, 0);
    while let Some(answer) = calls.join_next().await {
        match answer.expect("the call ran") {
            Ok(_) => kept += 1,
            Err(status) => {
                assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
                assert!(
                    status.message().contains("limits.max_overrides"),
                    "{}",
                    status.message()
                );
                refused += 1;
            }
        }
    }
    assert_eq!((kept, refused), (3, 13));
    assert_eq!(stored(&redis).len(), 3, "{:?}", stored(&redis));
    // Replacing one already stored is no new override: still allowed.
    let mut on_a = on_a;
    let first = stored(&redis)[0].clone();
    let key: (String, serde_json::Value) = serde_json::from_str(&first).expect("a field");
    let key = key.1["key"].as_str().expect("a key scope").to_owned();
    on_a.set_override(set_key(&key, 11))
        .await
        .expect("a replacement fits");
}

#[tokio::test]
async fn a_set_answers_the_value_the_store_held_not_the_replicas_stale_copy() {
    let redis = RedisServer::start();
    let a = TestServer::start(config(&redis, "1h")).await;
    let b = TestServer::start(config(&redis, "1h")).await;
    let (mut on_a, mut on_b) = (overrides(&a).await, overrides(&b).await);
    let first = on_a
        .set_override(set_key("k", 5))
        .await
        .expect("set on a")
        .into_inner();
    assert!(first.previous.is_none());
    // b has not polled since: its own copy has no override for k.
    let second = on_b
        .set_override(set_key("k", 7))
        .await
        .expect("set on b")
        .into_inner();
    assert_eq!(second.previous.map(|p| p.limit), Some(5));
    let removed = on_a
        .remove_override(pb::RemoveOverrideRequest {
            policy: "api".to_owned(),
            scope: set_key("k", 1).scope,
        })
        .await
        .expect("removed on a")
        .into_inner();
    assert!(removed.removed);
    assert_eq!(removed.previous.map(|p| p.limit), Some(7));
}

#[tokio::test]
async fn a_replica_writing_while_it_polls_never_reverts_its_own_write() {
    let redis = RedisServer::start();
    // A poll always under way, and the other replica changing the hash
    // all the time, so most polls read it whole.
    let a = TestServer::start(config(&redis, "1ms")).await;
    let b = TestServer::start(config(&redis, "1ms")).await;
    let (mut on_a, on_b) = (overrides(&a).await, overrides(&b).await);
    let noise = tokio::spawn(async move {
        let mut on_b = on_b;
        for round in 0..400u64 {
            on_b.set_override(set_key("b", 100 + round))
                .await
                .expect("set on b");
        }
    });
    let mut reverted = 0;
    for round in 0..150u64 {
        let limit = 10 + round;
        on_a.set_override(set_key("a", limit))
            .await
            .expect("set on a");
        // Several looks, each after a poll may have landed.
        for _ in 0..3 {
            let seen = listed(&mut on_a).await;
            let own = seen
                .overrides
                .iter()
                .find(|o| {
                    o.scope.as_ref().and_then(|s| s.scope.clone())
                        == Some(pb::override_scope::Scope::Key("a".to_owned()))
                })
                .map(|o| o.limit);
            if own != Some(limit) {
                reverted += 1;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    noise.abort();
    assert_eq!(
        reverted, 0,
        "looks at a's own override that saw an older value"
    );
}

#[tokio::test]
async fn a_hash_lost_and_written_again_up_to_a_version_seen_is_read_again() {
    let redis = RedisServer::start();
    let a = TestServer::start(config(&redis, "300ms")).await;
    let b = TestServer::start(config(&redis, "1h")).await;
    let (on_a, mut on_b) = (overrides(&a).await, overrides(&b).await);
    for limit in [5, 6, 7] {
        on_b.set_override(set_key("old", limit)).await.expect("set");
    }
    eventually(WITHIN, "a reads the first history", || {
        let mut on_a = on_a.clone();
        async move { listed(&mut on_a).await.overrides.len() == 1 }
    })
    .await;
    // The hash is lost (a flush, a failover to an empty replica) and the
    // same number of changes writes other overrides: the version number
    // alone comes back to the one a holds.
    redis.cli(&["DEL", "quotad:overrides"]);
    for limit in [8, 9, 10] {
        on_b.set_override(set_key("new", limit)).await.expect("set");
    }
    eventually(WITHIN, "a reads the new history", || {
        let mut on_a = on_a.clone();
        async move {
            let seen = listed(&mut on_a).await;
            seen.overrides.len() == 1 && seen.overrides[0].limit == 10
        }
    })
    .await;
    assert_eq!(limit_of(&a, "old").await, 3);
    assert_eq!(limit_of(&a, "new").await, 10);
}

#[tokio::test]
async fn overrides_already_in_redis_apply_once_redis_comes_up_after_quotad() {
    let port = RedisServer::free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let a = TestServer::start(config_with(&url, "50ms", "")).await;
    let mut on_a = overrides(&a).await;
    let seen = listed(&mut on_a).await;
    assert!(!seen.in_sync, "nothing read yet: out of sync");
    assert_eq!(
        a.metrics().await.value("quotad_overrides_in_sync", &[]),
        0.0
    );
    // Redis comes up holding an override another replica wrote.
    let redis = RedisServer::start_on(port);
    let b = TestServer::start(config_with(&url, "1h", "")).await;
    overrides(&b)
        .await
        .set_override(set_prefix("t:", 9))
        .await
        .expect("set on b");
    let up = Instant::now();
    eventually(WITHIN, "a applies the stored override", || {
        let mut on_a = on_a.clone();
        async move {
            let seen = listed(&mut on_a).await;
            seen.in_sync && seen.overrides.first().map(|o| o.limit) == Some(9)
        }
    })
    .await;
    eprintln!("override applied {:?} after Redis answered", up.elapsed());
    assert_eq!(limit_of(&a, "t:1").await, 9);
    assert_eq!(
        a.metrics().await.value("quotad_overrides_in_sync", &[]),
        1.0
    );
    drop(redis);
}

#[tokio::test]
async fn a_set_whose_answer_times_out_says_it_may_have_been_applied() {
    // The server runs on this test's one thread: its audit lines land here.
    let logs = Captured::default();
    let sink = logs.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish(),
    );
    let mut redis = RedisServer::start();
    let a = TestServer::start(config(&redis, "50ms")).await;
    let mut on_a = overrides(&a).await;
    on_a.set_override(set_prefix("t:", 9)).await.expect("set");
    redis.pause();
    let refused = on_a
        .set_override(set_prefix("t:", 99))
        .await
        .expect_err("redis is stalled");
    assert_eq!(refused.code(), Code::Unavailable);
    assert!(
        refused
            .message()
            .contains("may have been applied; List to see"),
        "{}",
        refused.message()
    );
    // The audit line says what the change would have set.
    let audit = logs.text();
    let unknown: Vec<&str> = audit
        .lines()
        .filter(|l| l.contains("outcome unknown"))
        .collect();
    assert_eq!(unknown.len(), 1, "{audit}");
    assert!(
        unknown[0].contains("WARN") && unknown[0].contains("new=limit=99 window=-"),
        "{audit}"
    );
    // Not applied here, whatever the store does with it.
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
    // It reached Redis past its deadline, in Redis's clock: refused there.
    // Redis answers commands in order, so once a PING is answered the
    // stalled script has been run or refused: the hash says which.
    assert_eq!(redis.cli(&["PING"]).trim(), "PONG");
    let held: Vec<String> = stored(&redis)
        .iter()
        .map(|f| redis.cli(&["HGET", "quotad:overrides", f]))
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(
        held[0].contains("\"limit\":9,") && !held[0].contains("\"limit\":99"),
        "redis holds {held:?}"
    );
    assert_eq!(
        listed(&mut on_a).await.overrides.first().map(|o| o.limit),
        Some(9)
    );
    assert_eq!(limit_of(&a, "t:1").await, 9);
}

/// Now by this machine's clock, which the test's Redis shares.
fn wall_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is past 1970");
    u64::try_from(since.as_millis()).expect("milliseconds fit in u64")
}

const HOUR_MS: u64 = 3_600_000;

#[tokio::test]
async fn an_override_expired_by_the_stores_clock_is_purged_though_the_writers_clock_runs_behind() {
    let redis = RedisServer::start();
    // The writer's clock is an hour behind Redis's: by it, `brief` is
    // live for another half hour; by the store's clock it expired half an
    // hour ago.
    let clock = std::sync::Arc::new(quotad_core::FakeClock::new(wall_ms() - HOUR_MS));
    let a = TestServer::start(
        config_with(&redis.url(), "1h", "max_overrides = 1").with_clock(clock.clone()),
    )
    .await;
    let mut on_a = overrides(&a).await;
    let mut brief = set_key("brief", 10);
    brief.expires_at_ms = Some(wall_ms() - HOUR_MS / 2);
    on_a.set_override(brief).await.expect("set");
    assert_eq!(stored(&redis).len(), 1);
    on_a.set_override(set_key("other", 10))
        .await
        .expect("the override expired in the store's clock no longer counts");
    let left = stored(&redis);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].contains("other"), "{left:?}");
}

#[tokio::test]
async fn a_writer_whose_clock_runs_ahead_does_not_purge_a_live_override() {
    let redis = RedisServer::start();
    let on_time = std::sync::Arc::new(quotad_core::FakeClock::new(wall_ms()));
    let a = TestServer::start(
        config_with(&redis.url(), "1h", "max_overrides = 1").with_clock(on_time.clone()),
    )
    .await;
    let mut live = set_key("live", 10);
    live.expires_at_ms = Some(wall_ms() + HOUR_MS);
    overrides(&a).await.set_override(live).await.expect("set");
    // A replica two hours ahead: by its clock `live` has expired, by the
    // store's it has an hour to go, so the policy is still full.
    let ahead = std::sync::Arc::new(quotad_core::FakeClock::new(wall_ms() + 2 * HOUR_MS));
    let b = TestServer::start(
        config_with(&redis.url(), "1h", "max_overrides = 1").with_clock(ahead.clone()),
    )
    .await;
    let full = overrides(&b)
        .await
        .set_override(set_key("other", 10))
        .await
        .expect_err("the policy is full in the store's clock");
    assert_eq!(full.code(), Code::InvalidArgument);
    let left = stored(&redis);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].contains("live"), "{left:?}");
}

/// The overrides `client` lists, as (key or prefix, limit).
async fn scopes(client: &mut OverridesClient<Channel>) -> Vec<(String, u64)> {
    let mut seen: Vec<(String, u64)> = listed(client)
        .await
        .overrides
        .iter()
        .filter_map(|o| {
            let scope = match o.scope.as_ref()?.scope.as_ref()? {
                pb::override_scope::Scope::Key(k) | pb::override_scope::Scope::Prefix(k) => {
                    k.clone()
                }
            };
            Some((scope, o.limit))
        })
        .collect();
    seen.sort();
    seen
}

#[tokio::test]
async fn a_store_gone_back_within_its_epoch_is_followed_and_later_changes_reach_every_replica() {
    let redis = RedisServer::start();
    let a = TestServer::start(config(&redis, "50ms")).await;
    let b = TestServer::start(config(&redis, "50ms")).await;
    let (mut on_a, mut on_b) = (overrides(&a).await, overrides(&b).await);
    for limit in [5, 6, 7, 8] {
        on_a.set_override(set_key("old", limit)).await.expect("set");
    }
    eventually(WITHIN, "b reads the four changes", || {
        let mut on_b = on_b.clone();
        async move { scopes(&mut on_b).await == [("old".to_owned(), 8)] }
    })
    .await;
    let epoch = redis.cli(&["HGET", "quotad:overrides", "#epoch"]);
    // The store goes back within its epoch (restored from an older copy,
    // a failover that lost the last writes): the version is smaller and
    // the last change is gone.
    let field = stored(&redis).pop().expect("the override is stored");
    let value = redis.cli(&["HGET", "quotad:overrides", &field]);
    let older = value.trim().replace("\"limit\":8", "\"limit\":6");
    assert_ne!(older, value.trim(), "the stored value names its limit");
    redis.cli(&["HSET", "quotad:overrides", "#version", "2", &field, &older]);
    assert_eq!(redis.cli(&["HGET", "quotad:overrides", "#epoch"]), epoch);
    // A new change on one replica takes a version the other has held
    // already (3): it must still reach both.
    on_b.set_override(set_key("after", 42)).await.expect("set");
    for (name, client) in [("a", &mut on_a), ("b", &mut on_b)] {
        let started = Instant::now();
        loop {
            let seen = scopes(client).await;
            if seen.contains(&("after".to_owned(), 42)) {
                assert_eq!(
                    seen,
                    [("after".to_owned(), 42), ("old".to_owned(), 6)],
                    "{name} follows the store gone back"
                );
                break;
            }
            assert!(
                started.elapsed() < WITHIN,
                "replica {name} never saw the change made after the store went back: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(limit_of(&a, "after").await, 42);
    assert_eq!(limit_of(&a, "old").await, 6);
}

#[tokio::test]
async fn a_removal_that_changes_nothing_leaves_the_stores_version_as_it_is() {
    let redis = RedisServer::start();
    let a = TestServer::start(config(&redis, "1h")).await;
    let mut on_a = overrides(&a).await;
    let remove = |k: &str| pb::RemoveOverrideRequest {
        policy: "api".to_owned(),
        scope: set_key(k, 1).scope,
    };
    // On an empty store no hash is made for it.
    let answer = on_a
        .remove_override(remove("nothing"))
        .await
        .expect("removed")
        .into_inner();
    assert!(!answer.removed);
    assert_eq!(redis.cli(&["EXISTS", "quotad:overrides"]).trim(), "0");
    on_a.set_override(set_key("k", 9)).await.expect("set");
    let version = redis.cli(&["HGET", "quotad:overrides", "#version"]);
    assert_eq!(version.trim(), "1");
    for _ in 0..5 {
        let answer = on_a
            .remove_override(remove("absent"))
            .await
            .expect("removed")
            .into_inner();
        assert!(!answer.removed);
    }
    assert_eq!(
        redis.cli(&["HGET", "quotad:overrides", "#version"]),
        version
    );
    // A removal that removes bumps it, and the override is gone.
    let answer = on_a
        .remove_override(remove("k"))
        .await
        .expect("removed")
        .into_inner();
    assert!(answer.removed);
    assert_eq!(
        redis.cli(&["HGET", "quotad:overrides", "#version"]).trim(),
        "2"
    );
    assert_eq!(limit_of(&a, "k").await, 3);
}

/// Log lines written while a test runs.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }
}
