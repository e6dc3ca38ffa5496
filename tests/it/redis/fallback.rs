//! `on_error = "local"` with three quotad replicas on one real Redis: while
//! Redis is down (SIGKILL) or stalled (SIGSTOP), each replica decides from
//! its own memory with a third of the limit, so the fleet admits at most
//! the limit per window; decisions say `REASON_LOCAL_FALLBACK`, the
//! metrics count them, and nothing decided locally reaches Redis.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quotad::Config;
use quotad_proto::v1 as pb;

use crate::common::redis::RedisServer;
use crate::common::{TestServer, check, eventually, named, peek};

/// Three replicas' config: `win`, a fixed window of 30 per 2 s, and
/// `day`, 30 per day, both falling back locally with a share of 10 each.
fn config(redis: &RedisServer) -> String {
    format!(
        r#"
[store]
backend = "redis"

[store.redis]
url = {:?}
timeout = "250ms"

[store.fallback]
replicas = 3

[policies.win]
algorithm = "fixed_window"
limit = 30
window = "2s"
on_error = "local"

[policies.day]
algorithm = "fixed_window"
limit = 30
window = "1d"
on_error = "local"

[policies.strict]
algorithm = "fixed_window"
limit = 30
window = "1d"
"#,
        redis.url()
    )
}

async fn fleet(redis: &RedisServer) -> Vec<TestServer> {
    let mut servers = Vec::new();
    for _ in 0..3 {
        let config = Config::from_toml(&config(redis)).expect("valid config");
        servers.push(TestServer::start(config).await);
    }
    for server in &servers {
        server.readyz_turns(200).await;
        // Redis answers this replica (a peek consumes nothing).
        let client = server.client().await;
        eventually(Duration::from_secs(10), "Redis answers", || {
            let mut client = client.clone();
            async move {
                peek(&mut client, named("warm-up", "day", None))
                    .await
                    .reason()
                    == pb::Reason::WithinLimit
            }
        })
        .await;
    }
    servers
}

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis(),
    )
    .expect("fits")
}

/// One admitted check: the end of the window it was counted in, and why.
#[derive(Debug)]
struct Admission {
    window_end: u64,
    reason: pb::Reason,
}

/// The end of the 2 s window a fixed-window decision sent at `sent` and
/// received at `received` was made in: the one multiple of the window in
/// `[sent + reset_after, received + reset_after]`.
fn window_end(sent: u64, received: u64, reset_after: u64) -> u64 {
    let end = (sent + reset_after).div_ceil(2_000) * 2_000;
    assert!(
        end <= received + reset_after,
        "the call took longer than a window"
    );
    end
}

/// Checks `key` under `win` on every replica from two clients each for
/// `period`: every admission, and every reason seen.
async fn hammer(
    servers: &[TestServer],
    key: &str,
    period: Duration,
) -> (Vec<Admission>, BTreeMap<i32, u64>) {
    let mut tasks = Vec::new();
    for server in servers {
        for _ in 0..2 {
            let mut client = server.client().await;
            let key = key.to_owned();
            tasks.push(tokio::spawn(async move {
                let (mut admitted, mut reasons) = (Vec::new(), BTreeMap::new());
                let until = Instant::now() + period;
                while Instant::now() < until {
                    let sent = now_ms();
                    let d = check(&mut client, named(&key, "win", None)).await;
                    let received = now_ms();
                    *reasons.entry(d.reason).or_insert(0) += 1;
                    if d.allowed {
                        admitted.push(Admission {
                            window_end: window_end(sent, received, d.reset_after_ms),
                            reason: d.reason(),
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                (admitted, reasons)
            }));
        }
    }
    let (mut admitted, mut reasons) = (Vec::new(), BTreeMap::new());
    for task in tasks {
        let (a, r) = task.await.expect("the client task does not panic");
        admitted.extend(a);
        for (reason, n) in r {
            *reasons.entry(reason).or_insert(0) += n;
        }
    }
    (admitted, reasons)
}

/// The admissions per window end.
fn per_window(admitted: &[Admission]) -> BTreeMap<u64, u64> {
    let mut windows = BTreeMap::new();
    for a in admitted {
        *windows.entry(a.window_end).or_insert(0) += 1;
    }
    windows
}

/// The local decisions each replica counted, allowed and denied.
async fn local_decisions(servers: &[TestServer]) -> f64 {
    let mut total = 0.0;
    for server in servers {
        let metrics = server.metrics().await;
        for outcome in ["allowed", "denied"] {
            total += metrics.value(
                "quotad_local_fallback_decisions_total",
                &[("outcome", outcome)],
            );
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_with_redis_killed_admit_at_most_the_limit_per_window() {
    let mut redis = RedisServer::start();
    let servers = fleet(&redis).await;
    let key = "killed";
    let mut client = servers[0].client().await;
    let before = check(&mut client, named(key, "win", None)).await;
    assert_eq!(
        before.reason(),
        pb::Reason::WithinLimit,
        "Redis decides first"
    );

    redis.stop();
    let killed = now_ms();
    let (admitted, reasons) = hammer(&servers, key, Duration::from_millis(5_500)).await;
    let ended = now_ms();

    let local = pb::Reason::LocalFallback as i32;
    let decisions: u64 = reasons.values().sum();
    assert_eq!(
        reasons.keys().copied().collect::<Vec<_>>(),
        vec![local],
        "every decision of the outage is local: {reasons:?}"
    );
    assert!(
        admitted
            .iter()
            .all(|a| a.reason == pb::Reason::LocalFallback)
    );
    let windows = per_window(&admitted);
    for (&end, &count) in &windows {
        assert!(
            count <= 30,
            "the window ending at {end} admitted {count} across the fleet: {windows:?}"
        );
    }
    // Windows wholly inside the outage, with every replica hammered, are
    // filled to the bound: each replica admitted its share of 10.
    let full: Vec<u64> = windows
        .iter()
        .filter(|&(&end, _)| end - 2_000 >= killed && end <= ended)
        .map(|(_, &count)| count)
        .collect();
    assert!(
        !full.is_empty(),
        "a whole window in the outage: {windows:?}"
    );
    assert!(full.iter().all(|&c| c == 30), "{windows:?}");
    let counted = local_decisions(&servers).await;
    assert_eq!(
        counted, decisions as f64,
        "quotad_local_fallback_decisions_total counts every local decision"
    );
    let by_policy: f64 = {
        let mut sum = 0.0;
        for server in &servers {
            sum += server
                .metrics()
                .await
                .series("quotad_decisions_total")
                .iter()
                .filter(|(labels, _)| {
                    labels.get("reason").map(String::as_str) == Some("local_fallback")
                        && labels.get("policy").map(String::as_str) == Some("win")
                })
                .map(|(_, v)| v)
                .sum::<f64>();
        }
        sum
    };
    assert_eq!(by_policy, decisions as f64, "quotad_decisions_total too");

    // Redis again (empty): decisions are Redis-backed once more.
    redis.restart();
    eventually(
        Duration::from_secs(10),
        "checks are decided by Redis again",
        || {
            let mut client = client.clone();
            async move {
                check(&mut client, named("after", "win", None))
                    .await
                    .reason()
                    == pb::Reason::WithinLimit
            }
        },
    )
    .await;
    // Each replica's breaker closes at its next probe (its back-off, at
    // most 5 s, after the calls it answered locally).
    for server in &servers {
        let client = server.client().await;
        eventually(
            Duration::from_secs(10),
            "each replica's checks are decided by Redis again",
            || {
                let mut client = client.clone();
                async move {
                    peek(&mut client, named("after-each", "day", None))
                        .await
                        .reason()
                        == pb::Reason::WithinLimit
                }
            },
        )
        .await;
        let mut client = client.clone();
        let d = check(&mut client, named("after-each", "day", None)).await;
        assert_eq!(d.reason(), pb::Reason::WithinLimit, "{d:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_gets_none_of_the_local_admissions_when_it_resumes() {
    let mut redis = RedisServer::start();
    let servers = fleet(&redis).await;
    let key = "stalled";
    let mut clients = Vec::new();
    for server in &servers {
        clients.push(server.client().await);
    }
    for _ in 0..5 {
        let d = check(&mut clients[0], named(key, "day", None)).await;
        assert_eq!((d.allowed, d.reason()), (true, pb::Reason::WithinLimit));
    }

    redis.pause();
    let mut admitted_locally = 0;
    for client in &mut clients {
        for _ in 0..15 {
            let d = check(client, named(key, "day", None)).await;
            assert_eq!(d.reason(), pb::Reason::LocalFallback, "{d:?}");
            assert_eq!(d.limit, 10, "the replica's share");
            admitted_locally += u64::from(d.allowed);
        }
        // A policy that reports errors still does.
        let strict = client.check(named(key, "strict", None)).await;
        assert_eq!(
            strict.expect_err("on_error = error").code(),
            tonic::Code::Unavailable
        );
    }
    assert_eq!(admitted_locally, 30, "10 a replica, 30 across the fleet");
    let allowed_locally: f64 = {
        let mut sum = 0.0;
        for server in &servers {
            sum += server.metrics().await.value(
                "quotad_local_fallback_decisions_total",
                &[("outcome", "allowed")],
            );
        }
        sum
    };
    assert_eq!(allowed_locally, 30.0);
    redis.resume();

    // Redis holds the 5 it counted itself, none of the 30 decided locally
    // and none of the scripts that arrived after their deadline. Each
    // replica finds Redis again on its own (its connection may have been
    // replaced during the stall).
    for client in &clients {
        eventually(
            Duration::from_secs(10),
            "peeks are answered by Redis again",
            || {
                let mut client = client.clone();
                async move {
                    peek(&mut client, named(key, "day", None)).await.reason()
                        != pb::Reason::LocalFallback
                }
            },
        )
        .await;
    }
    let d = peek(&mut clients[1], named(key, "day", None)).await;
    assert_eq!((d.remaining, d.limit), (25, 30), "{d:?}");
    let d = check(&mut clients[2], named(key, "day", None)).await;
    assert_eq!((d.allowed, d.reason()), (true, pb::Reason::WithinLimit));
    let d = peek(&mut clients[0], named(key, "day", None)).await;
    assert_eq!(d.remaining, 24, "{d:?}");
}
