//! The Redis backend against real Redis servers started by the tests:
//! identical decisions to the memory store, one budget across quotad
//! replicas (standalone and Cluster), all-or-nothing batches, and what
//! happens when Redis fails.

mod breaker;
mod calendar;
mod concurrency;
mod credentials;
mod differential;
mod fallback;
mod faults;
mod leases;
mod readiness;
mod rollouts;
mod sentinel;
mod start;
mod tls;

use std::sync::Arc;
use std::time::Duration;

use crate::common::redis::{RedisCluster, RedisServer};
use crate::common::{TestServer, admitted, check, eventually, named, peek};
use quotad::Config;
use quotad::backend::redis::{RedisBackend, RedisSettings, RedisTarget};
use quotad::backend::{Backend, Deadline};
use quotad_client::Client;
use quotad_core::{
    Algorithm, CheckItem, Clock, FakeClock, MemoryStore, OnFull, Policy, StoreConfig,
};
use quotad_proto::v1 as pb;
use tonic::Code;

const START: u64 = 1_767_268_800_000;

fn settings(target: RedisTarget) -> RedisSettings {
    RedisSettings::new(target, Duration::from_secs(2))
}

/// The two stores side by side, deciding by `clock`: Redis (on `redis`, at
/// the injected instants) and a memory store.
fn both_stores(
    runtime: &tokio::runtime::Runtime,
    redis: &RedisServer,
    clock: &Arc<FakeClock>,
) -> (RedisBackend, MemoryStore) {
    let redis_store = runtime
        .block_on(RedisBackend::connect(&settings(RedisTarget::Standalone(
            redis.url(),
        ))))
        .expect("connect to the test Redis")
        .with_test_clock(clock.clone());
    let memory = MemoryStore::new(
        StoreConfig::try_new(100_000, 16, OnFull::Deny).expect("valid"),
        clock.clone(),
    );
    (redis_store, memory)
}

/// A sliding log whose entries mostly left at once (a key unused for most
/// of a window) is emptied over its next writes, at most 32 entries each,
/// so that no check's script removes thousands in one call; its decisions
/// stay those of the memory store meanwhile.
#[test]
fn a_sliding_logs_entries_that_left_go_at_most_32_per_write() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let clock = Arc::new(FakeClock::new(START));
    let (redis_store, memory) = both_stores(&runtime, &redis, &clock);
    let policy = Policy::try_new(
        Algorithm::SlidingLog,
        1_000,
        Duration::from_millis(1_000),
        None,
    )
    .expect("valid");
    let item = CheckItem::new("log", policy, "k", 1).expect("valid");
    let check = || {
        runtime.block_on(async {
            let from_redis = redis_store
                .check_one(&item, Deadline::NONE)
                .await
                .expect("redis");
            let from_memory = Backend::check_one(&memory, &item, Deadline::NONE)
                .await
                .expect("memory");
            assert_eq!(from_redis, from_memory, "at {}", clock.now_ms());
            from_redis
        })
    };
    // 300 entries, one a millisecond.
    for _ in 0..300 {
        assert!(check().allowed);
        clock.advance(Duration::from_millis(1));
    }
    let entries = || -> u64 {
        let key = redis.cli(&["--scan"]);
        redis
            .cli(&["zcard", key.trim()])
            .trim()
            .parse()
            .expect("a count")
    };
    assert_eq!(entries(), 300);
    // The first 251 have left the window; 49 have not.
    clock.set(START + 1_250);
    let decision = check();
    assert_eq!(decision.remaining, 1_000 - 49 - 1);
    assert_eq!(entries(), 300 - 32 + 1, "32 removed, one added");
    // The same millisecond: merged into the last entry; 32 more go.
    assert_eq!(check().remaining, 1_000 - 49 - 2);
    assert_eq!(entries(), 300 - 64 + 1);
    // Seven more writes take the rest of the 251 (the memory store agrees
    // on every decision meanwhile).
    for _ in 0..7 {
        check();
    }
    assert_eq!(entries(), 49 + 1);
}

const REPLICA_CONFIG: &str = r#"
[store]
backend = "redis"

[store.redis]
REDIS_TARGET
timeout = "2s"

[policies.orders]
algorithm = "token_bucket"
limit = 25
window = "1d"

[policies.per_second]
algorithm = "fixed_window"
limit = 5
window = "1s"

[policies.per_day]
algorithm = "token_bucket"
limit = 2
window = "1d"

[policies.log]
algorithm = "sliding_log"
limit = 2
window = "1d"
"#;

fn replica_config(target: &str) -> Config {
    Config::from_toml(&REPLICA_CONFIG.replace("REDIS_TARGET", target)).expect("valid config")
}

/// Three quotad replicas on one Redis (or Cluster) take 150 concurrent
/// checks of one key, spread over them: exactly the budget is admitted.
async fn replicas_admit_exactly_the_limit(target: &str) {
    let servers = [
        TestServer::start(replica_config(target)).await,
        TestServer::start(replica_config(target)).await,
        TestServer::start(replica_config(target)).await,
    ];
    let clients: Vec<Client> = servers
        .iter()
        .map(|s| {
            Client::builder(format!("http://{}", s.grpc_addr))
                .deadline(Duration::from_secs(10))
                .build()
                .expect("valid address")
        })
        .collect();
    for run in 0..5 {
        let key = format!("customer-{run}-{}", std::process::id());
        let admitted = admitted(&clients, "orders", &key, 150).await;
        assert_eq!(admitted, 25, "run {run}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start();
    replicas_admit_exactly_the_limit(&format!("url = {:?}", redis.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_a_redis_cluster_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    replicas_admit_exactly_the_limit(&format!("cluster_nodes = {:?}", cluster.urls())).await;
}

fn batch(items: &[(&str, &str)]) -> pb::CheckBatchRequest {
    pb::CheckBatchRequest {
        items: items
            .iter()
            .map(|(key, policy)| named(key, policy, None))
            .collect(),
        mode: pb::BatchMode::AllOrNothing.into(),
    }
}

/// An all-or-nothing batch is one script, during which Redis serves no one
/// else: past `store.redis.max_atomic_items` items (64 by default) it is
/// refused before anything is sent, and consumes nothing; independent
/// batches of any size are split instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_batches_past_max_atomic_items_are_refused_and_consume_nothing() {
    let redis = RedisServer::start();
    let target = format!("url = {:?}", redis.url());
    let keys = |n: usize, tag: &str| -> Vec<(String, &'static str)> {
        (0..n).map(|i| (format!("{tag}-{i}"), "per_day")).collect()
    };
    let request = |items: &[(String, &str)], mode: pb::BatchMode| {
        let items: Vec<(&str, &str)> = items.iter().map(|(k, p)| (k.as_str(), *p)).collect();
        let mut request = batch(&items);
        request.mode = mode.into();
        request
    };
    let cases = [
        (format!("{target}\nmax_atomic_items = 4"), 4),
        (target.clone(), 64),
    ];
    for (redis_lines, max) in cases {
        let server = TestServer::start(replica_config(&redis_lines)).await;
        let mut client = server.client().await;
        let tag = format!("atomic-{max}-{}", std::process::id());
        let over = keys(max + 1, &tag);
        let status = client
            .check_batch(request(&over, pb::BatchMode::AllOrNothing))
            .await
            .expect_err("one item too many");
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(
            status.message().contains(&format!("at most {max} items"))
                && status.message().contains("store.redis.max_atomic_items"),
            "{}",
            status.message()
        );
        let metrics = server.metrics().await;
        let batches = metrics.value(
            "quotad_store_operations_total",
            &[("backend", "redis"), ("op", "check_batch")],
        );
        assert_eq!(batches, 0.0, "a refused batch never called the store");
        // Nothing was consumed: every key still has its whole budget.
        for (key, policy) in &over {
            assert_eq!(
                peek(&mut client, named(key, policy, None)).await.remaining,
                2
            );
        }
        // At the bound the batch is decided, and split independent batches
        // past it are too.
        let fits = client
            .check_batch(request(&over[..max], pb::BatchMode::AllOrNothing))
            .await
            .expect("at the bound")
            .into_inner();
        assert!(fits.decisions.iter().all(|d| d.allowed), "{fits:?}");
        let independent = client
            .check_batch(request(
                &keys(max * 2 + 1, &format!("{tag}-i")),
                pb::BatchMode::Independent,
            ))
            .await
            .expect("independent batches are split")
            .into_inner();
        assert_eq!(independent.decisions.len(), max * 2 + 1);
        assert!(independent.decisions.iter().all(|d| d.allowed));
    }
    // A sliding log counts as 4: 16 fit the default, 17 do not.
    let server = TestServer::start(replica_config(&target)).await;
    let mut client = server.client().await;
    let logs: Vec<(String, &str)> = (0..17).map(|i| (format!("log-{i}"), "log")).collect();
    let status = client
        .check_batch(request(&logs, pb::BatchMode::AllOrNothing))
        .await
        .expect_err("68 units");
    assert!(
        status.message().contains("(got 68)"),
        "{}",
        status.message()
    );
    let fits = client
        .check_batch(request(&logs[..16], pb::BatchMode::AllOrNothing))
        .await
        .expect("64 units")
        .into_inner();
    assert!(fits.decisions.iter().all(|d| d.allowed), "{fits:?}");
}

/// An independent batch past one script goes as several pipelined
/// scripts; when Redis has lost its scripts (a restart, a failover) every
/// one of them answers NOSCRIPT and is sent again, in order: each item is
/// decided exactly once and a key's items in the batch's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_batch_after_redis_lost_its_scripts_decides_each_item_once_in_order() {
    let redis = RedisServer::start();
    let server = TestServer::start(replica_config(&format!("url = {:?}", redis.url()))).await;
    let mut client = server.client().await;
    // Load the script, then lose it.
    check(&mut client, named("warm", "per_day", None)).await;
    assert_eq!(redis.cli(&["script", "flush"]).trim(), "OK");
    // 50 keys, each named three times, 50 items apart: 150 items, three
    // scripts of at most 64, so every key's items are in different ones.
    let keys: Vec<String> = (0..50).map(|i| format!("lost-{i}")).collect();
    let items: Vec<(&str, &str)> = (0..150)
        .map(|i| (keys[i % 50].as_str(), "per_day"))
        .collect();
    let mut request = batch(&items);
    request.mode = pb::BatchMode::Independent.into();
    let decisions = client
        .check_batch(request)
        .await
        .expect("decided after NOSCRIPT")
        .into_inner()
        .decisions;
    assert_eq!(decisions.len(), 150);
    // A budget of 2: each key's first two items in, its third out.
    for (i, d) in decisions.iter().enumerate() {
        assert_eq!(d.allowed, i < 100, "item {i}: {d:?}");
    }
    for key in &keys {
        assert_eq!(
            peek(&mut client, named(key, "per_day", None))
                .await
                .remaining,
            0,
            "{key}: counted exactly twice"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_on_one_key_is_atomic_on_a_cluster_and_spares_the_other_budget() {
    let cluster = RedisCluster::start();
    let server = TestServer::start(replica_config(&format!(
        "cluster_nodes = {:?}",
        cluster.urls()
    )))
    .await;
    let mut client = server.client().await;
    let both = batch(&[("alice", "per_second"), ("alice", "per_day")]);
    for _ in 0..2 {
        let d = client
            .check_batch(both.clone())
            .await
            .expect("one slot: allowed")
            .into_inner()
            .decisions;
        assert!(d.iter().all(|d| d.allowed));
    }
    // The day budget (2) is spent: the batch is refused as a whole...
    let d = client
        .check_batch(both)
        .await
        .expect("answered")
        .into_inner()
        .decisions;
    assert_eq!(d[0].reason(), pb::Reason::BatchRejected);
    assert_eq!(d[1].reason(), pb::Reason::LimitExceeded);
    // ...and the per-second budget was not touched by the refused batch.
    let second = peek(&mut client, named("alice", "per_second", None)).await;
    assert!(second.remaining >= 3, "{second:?}");
    // A key starting with `}` still keeps its policies in one slot.
    let odd = client
        .check_batch(batch(&[("}odd", "per_second"), ("}odd", "per_day")]))
        .await
        .expect("one slot")
        .into_inner()
        .decisions;
    assert!(odd.iter().all(|d| d.allowed), "{odd:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_across_cluster_slots_is_refused_with_a_clear_error() {
    let cluster = RedisCluster::start();
    let slot = |key: &str| {
        cluster.nodes[0].cli(&["cluster", "keyslot", &format!("quotad:per_day|{{{key}}}")])
    };
    let (a, b) = ("alice", "bob");
    assert_ne!(slot(a), slot(b), "the test needs keys in two slots");
    let server = TestServer::start(replica_config(&format!(
        "cluster_nodes = {:?}",
        cluster.urls()
    )))
    .await;
    let mut client = server.client().await;
    let status = client
        .check_batch(batch(&[(a, "per_day"), (b, "per_day")]))
        .await
        .expect_err("two slots cannot be one script");
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("hash tag"),
        "{}",
        status.message()
    );
    // A common hash tag puts them in one slot.
    let tagged = client
        .check_batch(batch(&[
            ("{team-7}alice", "per_day"),
            ("{team-7}bob", "per_day"),
        ]))
        .await
        .expect("one slot")
        .into_inner()
        .decisions;
    assert!(tagged.iter().all(|d| d.allowed));
    // Nothing was consumed by the refused batch.
    assert_eq!(
        peek(&mut client, named(a, "per_day", None)).await.remaining,
        2
    );
}

const FAULT_CONFIG: &str = r#"
[store]
backend = "redis"
on_error = "fail_closed"

[store.redis]
url = "REDIS_URL"
timeout = "200ms"

[policies.open]
algorithm = "token_bucket"
limit = 1000
window = "1d"
on_error = "fail_open"

[policies.closed]
algorithm = "token_bucket"
limit = 1000
window = "1d"

[policies.strict]
algorithm = "token_bucket"
limit = 1000
window = "1d"
on_error = "error"
"#;

/// Asks all three policies, each call bounded so a hang fails the test.
async fn ask_all(
    client: &mut quotad_proto::v1::quota_client::QuotaClient<tonic::transport::Channel>,
) -> (
    Result<pb::Decision, Code>,
    Result<pb::Decision, Code>,
    Result<pb::Decision, Code>,
) {
    let one = |policy: &'static str| {
        let mut client = client.clone();
        async move {
            let call = client.check(named("k", policy, None));
            match tokio::time::timeout(Duration::from_secs(5), call).await {
                Ok(Ok(r)) => Ok(r.into_inner().decision.expect("a decision")),
                Ok(Err(status)) => Err(status.code()),
                Err(_) => panic!("{policy}: no answer within 5 s: quotad hung on a dead Redis"),
            }
        }
    };
    (one("open").await, one("closed").await, one("strict").await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_answers_per_on_error_and_quotad_recovers_without_a_restart() {
    let mut redis = RedisServer::start();
    let config =
        Config::from_toml(&FAULT_CONFIG.replace("REDIS_URL", &redis.url())).expect("valid config");
    let server = TestServer::start(config).await;
    let mut client = server.client().await;

    let (open, closed, strict) = ask_all(&mut client).await;
    for d in [open, closed, strict] {
        assert_eq!(d.expect("Redis is up").reason(), pb::Reason::WithinLimit);
    }

    redis.stop();
    for _ in 0..3 {
        let (open, closed, strict) = ask_all(&mut client).await;
        let open = open.expect("fail_open answers");
        assert!(open.allowed);
        assert_eq!(open.reason(), pb::Reason::FailOpen);
        let closed = closed.expect("fail_closed answers");
        assert!(!closed.allowed);
        assert_eq!(closed.reason(), pb::Reason::FailClosed);
        assert_eq!(
            strict.expect_err("error passes the failure on"),
            Code::Unavailable
        );
    }

    redis.restart();
    eventually(Duration::from_secs(20), "quotad uses Redis again", || {
        let mut client = client.clone();
        async move {
            matches!(
                client.check(named("k", "strict", None)).await,
                Ok(r) if r.get_ref().decision.as_ref().is_some_and(|d| d.reason() == pb::Reason::WithinLimit)
            )
        }
    })
    .await;

    // The restarted Redis has no scripts loaded: NOSCRIPT is handled.
    assert_eq!(redis.cli(&["script", "flush"]).trim(), "OK");
    let d = check(&mut client, named("k", "closed", None)).await;
    assert_eq!(d.reason(), pb::Reason::WithinLimit);
    assert_eq!(d.remaining, 999);
}

/// [`FAULT_CONFIG`] on `url`, refusing to start without Redis.
fn required_at_start(url: &str) -> String {
    FAULT_CONFIG.replace(
        "url = \"REDIS_URL\"",
        &format!("url = \"{url}\"\nrequired_at_start = true"),
    )
}

#[tokio::test]
async fn a_redis_required_at_start_that_cannot_be_reached_stops_the_server_with_a_clear_error() {
    let redis = RedisServer::start();
    let url = redis.url();
    drop(redis);
    let config = Config::from_toml(&required_at_start(&url)).expect("valid");
    let mut server = TestServer::start(config).await;
    let error = server.join().await.expect_err("no Redis, no server");
    assert!(error.to_string().contains("redis"), "{error}");
}

#[tokio::test]
async fn a_redis_that_refuses_connections_at_start_is_an_error_that_says_its_cause_once() {
    let config = Config::from_toml(&required_at_start("redis://127.0.0.1:1/0")).expect("valid");
    let mut server = TestServer::start(config).await;
    let error = server.join().await.expect_err("no Redis, no server");
    // As an error chain printer writes it: every cause, each once.
    let printed = format!("{:#}", anyhow::Error::from(error));
    assert_eq!(
        printed.matches("state store unavailable").count(),
        1,
        "{printed}"
    );
    assert_eq!(
        printed.to_lowercase().matches("refused").count(),
        1,
        "{printed}"
    );
}

#[test]
fn a_redis_backend_needs_a_target_and_says_so() {
    let error = Config::from_toml("[store]\nbackend = \"redis\"\n")
        .expect_err("no [store.redis]")
        .to_string();
    assert!(error.starts_with("store.backend: "), "{error}");
    let error = Config::from_toml(
        "[store]\nbackend = \"redis\"\n[store.redis]\nurl = \"redis://a:1\"\ncluster_nodes = [\"redis://b:1\"]\n",
    )
    .expect_err("both")
    .to_string();
    assert!(error.contains("not both"), "{error}");
    let error =
        Config::from_toml("[store]\nbackend = \"redis\"\n[store.redis]\nurl = \"http://x\"\n")
            .expect_err("not a redis URL")
            .to_string();
    assert!(error.starts_with("store.redis.url: "), "{error}");
}

#[test]
fn cost_checks_stay_exact_at_the_2_pow_53_bound() {
    // The largest limit a one-day window allows a sliding window: every
    // intermediate value in Lua is then at most 2^53, where doubles are
    // still exact. A fixed window only adds: 2^53 a year, and a window of
    // 2^53 ms.
    let (day, year) = (86_400_000, 365 * 86_400_000);
    let max = quotad_core::MAX_EXACT;
    for (algorithm, limit, window) in [
        (Algorithm::SlidingWindow, max / day, day),
        (Algorithm::FixedWindow, max, year),
        (Algorithm::FixedWindow, max, max),
    ] {
        let policy = Policy::try_new(algorithm, limit, Duration::from_millis(window), None)
            .expect("at the bound");
        let redis = RedisServer::start();
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        let clock = Arc::new(FakeClock::new(START + day / 2));
        let (store, memory) = both_stores(&runtime, &redis, &clock);
        for cost in [limit - 1, 1, 1, limit / 3] {
            let item = CheckItem::new("big", policy, "k", cost).expect("valid");
            let (a, b) = runtime.block_on(async {
                (
                    Backend::check_one(&memory, &item, Deadline::NONE)
                        .await
                        .expect("memory"),
                    store.check_one(&item, Deadline::NONE).await.expect("redis"),
                )
            });
            assert_eq!(a, b, "{algorithm} cost {cost}");
            clock.advance(Duration::from_millis(day / 3));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_expires_in_redis_when_it_would_be_fresh_again() {
    let redis = RedisServer::start();
    let server = TestServer::start(replica_config(&format!("url = {:?}", redis.url()))).await;
    let mut client = server.client().await;
    let d = check(&mut client, named("ttl-key", "per_second", None)).await;
    assert!(d.allowed);
    let ttl: u64 = redis
        .cli(&["pttl", "quotad:per_second|{ttl-key}|2F1000"])
        .trim()
        .parse()
        .expect("a TTL in ms");
    // The TTL is the time until the window ends, as the decision says
    // (less the time the two calls took).
    assert!(ttl <= d.reset_after_ms && ttl > 0, "ttl {ttl} vs {d:?}");
    // A key whose state is fresh again holds nothing in Redis.
    assert_eq!(
        redis
            .cli(&["exists", "quotad:per_second|{never-used}|2F1000"])
            .trim(),
        "0"
    );
    let p = peek(&mut client, named("never-used", "per_second", None)).await;
    assert!(p.allowed);
    assert_eq!(
        redis
            .cli(&["exists", "quotad:per_second|{never-used}|2F1000"])
            .trim(),
        "0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_value_in_redis_is_an_internal_error_not_an_outage_to_fail_open_on() {
    let redis = RedisServer::start();
    let config =
        Config::from_toml(&FAULT_CONFIG.replace("REDIS_URL", &redis.url())).expect("valid config");
    let server = TestServer::start(config).await;
    let mut client = server.client().await;
    assert_eq!(
        redis
            .cli(&["set", "quotad:open|{corrupt}|2T86400000", "T not numbers"])
            .trim(),
        "OK"
    );
    let status = client
        .check(named("corrupt", "open", None))
        .await
        .expect_err("a script error is not a decision, even failing open");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    // Other keys are unaffected.
    let d = check(&mut client, named("fine", "open", None)).await;
    assert_eq!(d.reason(), pb::Reason::WithinLimit);
}
