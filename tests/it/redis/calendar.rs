//! Calendar quotas on Redis: the script counts in the local periods quotad
//! computes for it, deciding as the memory store does (a differential
//! test at injected instants around clock changes, month and year ends,
//! with the clock stepping back), and exactly by Redis's own clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use quotad::backend::{Backend, Deadline};
use quotad_core::calendar::{Calendar, Period, Zone};
use quotad_core::{Algorithm, BatchMode, CheckItem, Clock, Decision, FakeClock, Policy};

use super::{START, both_stores, settings};
use crate::common::redis::RedisServer;
use quotad::backend::redis::{RedisBackend, RedisTarget};

const NONE: Deadline = Deadline::NONE;
const HOUR: u64 = 3_600_000;

/// Calendar policies of every period, in zones with 1-hour, 30-minute and
/// no clock changes, and one plain window to mix into batches.
fn policies() -> Vec<Policy> {
    let cal = |period, zone: &str, limit| {
        let calendar = Calendar::new(period, Zone::named(zone).expect("a bundled zone"));
        Policy::calendar(Algorithm::FixedWindow, limit, calendar).expect("valid")
    };
    vec![
        cal(Period::Day, "America/New_York", 5),
        cal(Period::Day, "Australia/Lord_Howe", 3),
        cal(
            Period::Week(quotad_core::calendar::parse_weekday("sunday").expect("a day")),
            "Europe/Berlin",
            8,
        ),
        cal(Period::Month, "Asia/Kathmandu", 10),
        cal(Period::Year, "America/New_York", 12),
        Policy::try_new(Algorithm::FixedWindow, 4, Duration::from_millis(HOUR), None)
            .expect("valid"),
        // The first policy's namespace in another zone, as a replica
        // mid-rollout counts it: one key, each zone honouring the other's
        // day until it ends.
        cal(Period::Day, "Asia/Tokyo", 5),
    ]
}

/// The namespace policy `p` counts in: the last policy shares the
/// first's.
fn namespace(case: u64, p: usize, policies: usize) -> String {
    let p = if p == policies - 1 { 0 } else { p };
    format!("calendar{case}p{p}")
}

/// Instants a little before the periods change in interesting ways
/// (2024): New York's 23- and 25-hour days, Lord Howe's 30-minute
/// shifts, Berlin's spring forward, February 29th, a year's end.
const STARTS: [u64; 7] = [
    1_710_043_200_000, // 2024-03-10 04:00 UTC (23:00 EST the day before)
    1_730_592_000_000, // 2024-11-03 00:00 UTC
    1_728_133_200_000, // 2024-10-05 13:00 UTC (Lord Howe 23:30 +10:30)
    1_712_404_800_000, // 2024-04-06 12:00 UTC (Lord Howe 23:00 +11)
    1_711_836_000_000, // 2024-03-30 22:00 UTC (Berlin)
    1_709_164_800_000, // 2024-02-29 00:00 UTC
    1_735_700_400_000, // 2025-01-01 03:00 UTC (22:00 EST on Dec 31st)
];

#[derive(Clone, Debug)]
enum Op {
    Check(usize, usize, u64),
    Peek(usize, usize, u64),
    AllOrNothing(Vec<(usize, usize, u64)>),
    Independent(Vec<(usize, usize, u64)>),
    /// The clock steps back by `pick % 6h`, never more than 6 hours behind
    /// the latest instant of the case (within half of any period: see
    /// docs/algorithms.md, *Calendar quotas*).
    StepBack(u64),
}

fn ops(policies: usize) -> impl Strategy<Value = Vec<(u64, i64, Op)>> {
    let item = (
        0..policies,
        0usize..3,
        prop_oneof![4 => 1u64..=2, 1 => 1u64..=12],
    );
    let op = prop_oneof![
        6 => item.clone().prop_map(|(p, k, c)| Op::Check(p, k, c)),
        2 => item.clone().prop_map(|(p, k, c)| Op::Peek(p, k, c)),
        2 => prop::collection::vec(item.clone(), 1..5).prop_map(Op::AllOrNothing),
        2 => prop::collection::vec(item, 1..5).prop_map(Op::Independent),
        1 => any::<u64>().prop_map(Op::StepBack),
    ];
    // Mostly minutes, sometimes hours: a case crosses a few local
    // midnights, the clock change among them.
    let step = prop_oneof![
        3 => Just(0u64),
        4 => 0u64..=30 * 60_000,
        2 => 0u64..=6 * HOUR,
        1 => 0u64..=48 * HOUR,
    ];
    // How far quotad's reading of Redis's clock is from the instant the
    // script decides at (used where the test reads apart): often across a
    // midnight near the starts.
    let skew = prop_oneof![
        2 => Just(0i64),
        2 => -2_000i64..=2_000,
        1 => -90 * 60_000i64..=90 * 60_000,
    ];
    prop::collection::vec((step, skew, op), 1..50)
}

fn decided(results: Vec<quotad::backend::ItemResult>) -> Vec<Decision> {
    results.into_iter().map(|r| r.expect("decided")).collect()
}

#[test]
fn memory_and_redis_decide_calendar_quotas_identically() {
    differential(false);
}

/// The same, with quotad's reading of Redis's clock (from which it computes
/// the periods it sends) up to 90 minutes behind or ahead of the instant
/// the script decides at: the script still counts in the period holding
/// its own instant, as the memory store does.
#[test]
fn memory_and_redis_agree_when_quotads_reading_of_redis_time_is_off() {
    differential(true);
}

fn differential(read_apart: bool) {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let clock = Arc::new(FakeClock::new(START));
    let reading = Arc::new(FakeClock::new(START));
    let (redis_store, memory) = both_stores(&runtime, &redis, &clock);
    let redis_store = if read_apart {
        redis_store.with_test_reading(reading.clone())
    } else {
        redis_store
    };
    let policies = policies();
    let case = AtomicU64::new(0);
    let (denied, crossed) = (AtomicU64::new(0), AtomicU64::new(0));
    let read_in_another_day = AtomicU64::new(0);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &(prop::sample::select(STARTS.to_vec()), ops(policies.len())),
            |(start, ops)| {
                let case = case.fetch_add(1, Ordering::Relaxed);
                let names: Vec<String> = (0..policies.len())
                    .map(|p| namespace(case, p, policies.len()))
                    .collect();
                let keys = ["alice", "bob", "{team}carol"];
                clock.set(start);
                let mut latest = start;
                for (step, skew, op) in ops {
                    clock.advance(Duration::from_millis(step));
                    let now = clock.now_ms();
                    reading.set(now.saturating_add_signed(skew));
                    // (Every policy but the plain window is a calendar.)
                    if read_apart
                        && policies.iter().any(|p| {
                            p.calendar_period().is_some()
                                && p.window_bounds(reading.now_ms()) != p.window_bounds(now)
                        })
                    {
                        read_in_another_day.fetch_add(1, Ordering::Relaxed);
                    }
                    if step > 0 && policies[0].window_bounds(now - step).1 <= now {
                        crossed.fetch_add(1, Ordering::Relaxed);
                    }
                    latest = latest.max(now);
                    // A namespace per policy, as named policies have.
                    let item = |p: usize, k: usize, c: u64| {
                        CheckItem::new(&names[p], policies[p], keys[k], c).expect("valid item")
                    };
                    let (from_memory, from_redis) = runtime.block_on(async {
                        match &op {
                            Op::Check(p, k, c) => {
                                let i = item(*p, *k, *c);
                                (
                                    vec![
                                        Backend::check_one(&memory, &i, NONE)
                                            .await
                                            .expect("memory"),
                                    ],
                                    vec![redis_store.check_one(&i, NONE).await.expect("redis")],
                                )
                            }
                            Op::Peek(p, k, c) => {
                                let i = item(*p, *k, *c);
                                (
                                    vec![Backend::peek(&memory, &i, NONE).await.expect("memory")],
                                    vec![redis_store.peek(&i, NONE).await.expect("redis")],
                                )
                            }
                            Op::AllOrNothing(items) | Op::Independent(items) => {
                                let mode = match op {
                                    Op::AllOrNothing(_) => BatchMode::AllOrNothing,
                                    _ => BatchMode::Independent,
                                };
                                let items: Vec<_> =
                                    items.iter().map(|&(p, k, c)| item(p, k, c)).collect();
                                (
                                    decided(Backend::check(&memory, &items, mode, NONE).await),
                                    decided(redis_store.check(&items, mode, NONE).await),
                                )
                            }
                            Op::StepBack(_) => (Vec::new(), Vec::new()),
                        }
                    });
                    prop_assert_eq!(&from_memory, &from_redis, "{:?} at {}", op, now);
                    let no = from_memory.iter().filter(|d| !d.allowed).count();
                    denied.fetch_add(no as u64, Ordering::Relaxed);
                    if let Op::StepBack(pick) = op {
                        let floor = latest - 6 * HOUR;
                        clock.set(now.saturating_sub(pick % (6 * HOUR)).max(floor));
                    }
                }
                Ok(())
            },
        )
        .expect("the backends agree");
    // The sequences did what they are for.
    let (denied, crossed) = (denied.into_inner(), crossed.into_inner());
    assert!(denied > 100, "{denied} denials");
    assert!(crossed > 100, "{crossed} steps over a New York midnight");
    let read_in_another_day = read_in_another_day.into_inner();
    assert!(
        !read_apart || read_in_another_day > 50,
        "{read_in_another_day} readings in another period than the instant decided at"
    );
}

/// By Redis's own clock (no injected time), the reset is the next local
/// midnight exactly as the memory store computes it from the same instant:
/// the bounds quotad sends are around its reading of Redis's clock.
#[test]
fn by_redis_time_a_daily_quota_resets_at_the_next_local_midnight() {
    let redis = RedisServer::start();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let store = runtime
        .block_on(RedisBackend::connect(&settings(RedisTarget::Standalone(
            redis.url(),
        ))))
        .expect("connect");
    for zone in ["Asia/Kathmandu", "America/New_York", "Australia/Lord_Howe"] {
        let calendar = Calendar::new(Period::Day, Zone::named(zone).expect("zone"));
        let policy = Policy::calendar(Algorithm::FixedWindow, 2, calendar).expect("valid");
        // A key of its own in each zone: one key's count would be honoured
        // by the next zone until its period ends (docs/algorithms.md).
        let item = CheckItem::new("daily", policy, zone, 1).expect("valid");
        // A midnight between the checks would begin a new count.
        std::thread::sleep(crate::calendar::wait_clear_of_period_ends(
            &[calendar],
            60_000,
        ));
        let before = now_ms();
        let first = runtime
            .block_on(store.check_one(&item, NONE))
            .expect("decided");
        let after = now_ms();
        assert!(first.allowed && first.remaining == 1, "{zone}: {first:?}");
        // Redis decided at some instant of [before, after] (the same host
        // clock): from it, the reset is the local midnight after it.
        let exact = |wait: u64| (before..=after).any(|t| t + wait == calendar.bounds(t).1);
        assert!(exact(first.reset_after_ms), "{zone}: {first:?}");
        let _ = runtime.block_on(store.check_one(&item, NONE));
        let before = now_ms();
        let denied = runtime
            .block_on(store.check_one(&item, NONE))
            .expect("decided");
        let after = now_ms();
        assert!(!denied.allowed, "{zone}: {denied:?}");
        let exact = |wait: u64| (before..=after).any(|t| t + wait == calendar.bounds(t).1);
        assert!(exact(denied.retry_after_ms), "{zone}: {denied:?}");
    }
}

fn now_ms() -> u64 {
    quotad_core::SystemClock.now_ms()
}

/// A daily quota spent on the primary, replicated, is the same after a
/// Sentinel failover (the primary SIGKILLed): its remaining budget and its
/// reset at the next local midnight, by the new primary's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_quota_survives_a_sentinel_failover() {
    use super::sentinel::{MASTER, Sentinel};
    use quotad_client::{Check, Client, Reason};

    let mut primary = RedisServer::start();
    primary.config_set("repl-diskless-sync-delay", "0");
    let replica = RedisServer::start_replica_of(primary.port);
    let sentinels: Vec<Sentinel> = (0..3).map(|_| Sentinel::start(primary.port)).collect();
    let started = std::time::Instant::now();
    while !sentinels.iter().all(Sentinel::ready)
        || !replica
            .cli(&["info", "replication"])
            .contains("master_link_status:up")
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the replica and the sentinels were not ready within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let nodes: Vec<String> = sentinels
        .iter()
        .map(|s| format!("redis://127.0.0.1:{}", s.port))
        .collect();
    let config = quotad::Config::from_toml(&format!(
        "[store]\nbackend = \"redis\"\n\n[store.redis]\nurl = \"redis://{MASTER}/0\"\nsentinel_nodes = {nodes:?}\ntimeout = \"200ms\"\n\n[policies.daily]\nalgorithm = \"fixed_window\"\nlimit = 5\nperiod = \"day\"\ntime_zone = \"Asia/Kathmandu\"\n"
    ))
    .expect("valid config");
    let server = crate::common::TestServer::start(config).await;
    let client = Client::builder(format!("http://{}", server.grpc_addr))
        .deadline(Duration::from_millis(500))
        .deny_cache(0)
        .build()
        .expect("client");
    let check = Check::named("daily", "k");
    for _ in 0..3 {
        assert!(client.check(&check).await.expect("decided").allowed);
    }
    // Replicated before the kill: what asynchronous replication may lose
    // is the sentinel test's subject, not this one's.
    assert_eq!(primary.cli(&["wait", "1", "5000"]).trim(), "1");
    primary.stop();
    let killed = std::time::Instant::now();
    let after = loop {
        match client.peek(&check).await {
            Ok(decision) if decision.reason == Reason::WithinLimit => break decision,
            Ok(decision) => panic!("unexpected answer {decision:?}"),
            Err(_) => {}
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "no failover within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(after.remaining, 2, "3 of 5 spent before the failover");
    let calendar = Calendar::new(Period::Day, Zone::named("Asia/Kathmandu").expect("zone"));
    for _ in 0..2 {
        assert!(client.check(&check).await.expect("decided").allowed);
    }
    let before = now_ms();
    let denied = client.check(&check).await.expect("decided");
    let at = now_ms();
    assert_eq!(denied.reason, Reason::LimitExceeded);
    let wait = denied.retry_after_ms;
    assert!(
        (before..=at).any(|t| t + wait == calendar.bounds(t).1),
        "{denied:?}"
    );
}
