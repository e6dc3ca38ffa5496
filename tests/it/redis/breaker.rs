//! The local fallback's breaker with three quotad replicas on one real
//! Redis that is stalled (SIGSTOP, its sockets open): after one call of
//! each replica times out, no call is sent to Redis until a probe answers,
//! so every later call is answered locally at once; and across the stall
//! and its end (SIGCONT) Redis counts only what it decided itself, beyond
//! at most the calls in flight when the stall began. Counted by Redis's own
//! `INFO commandstats` and the breaker's metrics, never by the clock.

use std::time::Duration;

use quotad::Config;
use quotad_proto::v1 as pb;

use crate::common::redis::RedisServer;
use crate::common::{TestServer, check, eventually, named, peek};

const REPLICAS: usize = 3;

fn config(redis: &RedisServer) -> String {
    format!(
        r#"
[store]
backend = "redis"

[store.redis]
url = {:?}
timeout = "250ms"

[store.fallback]
replicas = {REPLICAS}

[policies.day]
algorithm = "fixed_window"
limit = 30
window = "1d"
on_error = "local"
"#,
        redis.url()
    )
}

/// The scripts Redis has run since start, by `INFO commandstats` (a
/// script refused past its deadline ran too: it is counted).
fn scripts_run(redis: &RedisServer) -> u64 {
    let info = redis.cli(&["info", "commandstats"]);
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .map(|l| {
            let calls = l
                .split([':', ','])
                .find_map(|f| f.strip_prefix("calls="))
                .expect("a calls field");
            calls.parse::<u64>().expect("a number")
        })
        .sum()
}

async fn breaker(server: &TestServer) -> (f64, f64, f64) {
    let m = server.metrics().await;
    (
        m.value("quotad_store_breaker_state", &[]),
        m.value("quotad_store_breaker_transitions_total", &[("to", "open")]),
        m.value(
            "quotad_store_breaker_transitions_total",
            &[("to", "closed")],
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_costs_each_replica_one_timeout_and_counts_only_what_it_decided() {
    let mut redis = RedisServer::start();
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..REPLICAS {
        let config = Config::from_toml(&config(&redis)).expect("valid config");
        let server = TestServer::start(config).await;
        server.readyz_turns(200).await;
        clients.push(server.client().await);
        servers.push(server);
    }
    let key = "breaker";
    let mut decided_by_redis = 0;
    for client in &mut clients {
        eventually(Duration::from_secs(10), "Redis answers", || {
            let mut client = client.clone();
            async move {
                peek(&mut client, named(key, "day", None)).await.reason() == pb::Reason::WithinLimit
            }
        })
        .await;
        for _ in 0..2 {
            let d = check(client, named(key, "day", None)).await;
            assert_eq!((d.allowed, d.reason()), (true, pb::Reason::WithinLimit));
            decided_by_redis += 1;
        }
    }
    for server in &servers {
        assert_eq!(breaker(server).await, (0.0, 0.0, 0.0), "closed from start");
    }
    let before = scripts_run(&redis);

    redis.pause();
    let mut admitted_locally = 0;
    for client in &mut clients {
        for _ in 0..8 {
            let d = check(client, named(key, "day", None)).await;
            assert_eq!(d.reason(), pb::Reason::LocalFallback, "{d:?}");
            admitted_locally += u64::from(d.allowed);
        }
    }
    assert_eq!(admitted_locally, 24, "8 of each replica's share of 10");
    for server in &servers {
        let (state, opened, _) = breaker(server).await;
        assert!(state != 0.0, "open or probing while Redis is stalled");
        assert!(opened >= 1.0, "{opened}");
    }
    redis.resume();

    // Only the first call of each replica reached Redis during the stall
    // (probes are PINGs): read before any replica sends another script.
    let during = scripts_run(&redis) - before;
    assert_eq!(
        during, REPLICAS as u64,
        "one script a replica reached the stalled Redis"
    );

    // Each replica's breaker closes when a probe answers (a call past the
    // back-off makes one; a peek consumes nothing); checks go to Redis
    // again.
    for (server, client) in servers.iter().zip(&mut clients) {
        eventually(
            Duration::from_secs(15),
            "a probe closes the breaker",
            || {
                let mut client = client.clone();
                async move {
                    peek(&mut client, named(key, "day", None)).await.reason()
                        == pb::Reason::WithinLimit
                }
            },
        )
        .await;
        assert_eq!(breaker(server).await.0, 0.0, "closed");
        let d = check(client, named(key, "day", None)).await;
        assert_eq!((d.allowed, d.reason()), (true, pb::Reason::WithinLimit));
        decided_by_redis += 1;
        assert!(breaker(server).await.2 >= 1.0, "closed at least once");
    }

    // Redis holds what it decided; of the calls in flight when the stall
    // began (one a replica), those it ran before their deadline are the
    // only ones counted there as well as locally.
    let d = peek(&mut clients[0], named(key, "day", None)).await;
    assert_eq!(d.reason(), pb::Reason::WithinLimit, "{d:?}");
    let counted = 30 - d.remaining;
    assert!(
        counted >= decided_by_redis && counted - decided_by_redis <= REPLICAS as u64,
        "Redis counted {counted}, decided {decided_by_redis}"
    );
    let mut late_counted = 0.0;
    for server in &servers {
        late_counted += server
            .metrics()
            .await
            .value("quotad_redis_late_scripts_total", &[("outcome", "counted")]);
    }
    assert!(
        late_counted <= (counted - decided_by_redis) as f64,
        "{late_counted}"
    );
}
