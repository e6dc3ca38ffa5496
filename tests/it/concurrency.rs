//! `quotad.v1.Concurrency` end to end: slots acquired, renewed and released
//! on the memory store and on Redis; acquires as items of an all-or-nothing
//! batch next to a rate; bad input named and changing nothing; and, on one
//! real Redis behind three quotad replicas, 200 concurrent acquirers of a
//! limit of 5 never holding more than 5 at once by their own clocks, a
//! stalled Redis acquiring nothing late.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quotad_core::FakeClock;
use quotad_proto::v1 as pb;
use quotad_proto::v1::concurrency_client::ConcurrencyClient;
use quotad_proto::v1::quota_client::QuotaClient;
use rand::Rng as _;
use tonic::Code;
use tonic::transport::Channel;

use crate::common::redis::RedisServer;
use crate::common::{NOON_30, TestServer, check_batch, named, peek};

/// `exports`: at most 2 in flight, slots of 10 s; `per-minute`: a rate.
const CONFIG: &str = r#"
[policies.exports]
algorithm = "concurrency"
limit = 2
slot_ttl = "10s"

[policies.per-minute]
algorithm = "fixed_window"
limit = 3
window = "1m"
"#;

async fn start(toml: &str) -> (Arc<FakeClock>, TestServer) {
    let clock = Arc::new(FakeClock::new(NOON_30));
    let server = TestServer::start_toml(toml, clock.clone()).await;
    (clock, server)
}

async fn clients(server: &TestServer) -> (ConcurrencyClient<Channel>, QuotaClient<Channel>) {
    let channel = server.channel().await;
    (
        ConcurrencyClient::new(channel.clone()),
        QuotaClient::new(channel),
    )
}

fn acquire_req(key: &str, policy: &str, cost: Option<u64>) -> pb::AcquireRequest {
    pb::AcquireRequest {
        key: key.to_owned(),
        cost,
        policy: Some(pb::acquire_request::Policy::PolicyName(policy.to_owned())),
    }
}

fn slot_req(key: &str, policy: &str, slot_id: &str) -> pb::SlotRequest {
    pb::SlotRequest {
        key: key.to_owned(),
        policy: Some(pb::slot_request::Policy::PolicyName(policy.to_owned())),
        slot_id: slot_id.to_owned(),
    }
}

async fn acquire(
    client: &mut ConcurrencyClient<Channel>,
    request: pb::AcquireRequest,
) -> pb::AcquireResponse {
    client
        .acquire(request)
        .await
        .expect("acquire is answered")
        .into_inner()
}

async fn release(client: &mut ConcurrencyClient<Channel>, request: pb::SlotRequest) -> bool {
    client
        .release(request)
        .await
        .expect("release is answered")
        .into_inner()
        .was_held
}

/// The remaining units of `key`, as a Peek of the concurrency policy says.
async fn free(quota: &mut QuotaClient<Channel>, key: &str) -> u64 {
    peek(quota, named(key, "exports", None)).await.remaining
}

fn field_of(status: &tonic::Status) -> String {
    status
        .message()
        .split(':')
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn slots_are_acquired_renewed_and_released_and_never_more_than_the_limit() {
    let (clock, server) = start(CONFIG).await;
    let (mut conc, mut quota) = clients(&server).await;
    let a = acquire(&mut conc, acquire_req("t", "exports", None)).await;
    let b = acquire(&mut conc, acquire_req("t", "exports", None)).await;
    for answer in [&a, &b] {
        let d = answer.decision.as_ref().expect("a decision");
        assert!(d.allowed, "{answer:?}");
        assert_eq!(answer.slot_id.len(), 16);
        assert_eq!(answer.ttl_ms, 10_000);
    }
    assert_ne!(a.slot_id, b.slot_id);
    clock.advance(Duration::from_secs(4));
    let c = acquire(&mut conc, acquire_req("t", "exports", None)).await;
    let d = c.decision.expect("a decision");
    assert_eq!((d.allowed, d.reason()), (false, pb::Reason::LimitExceeded));
    assert_eq!(
        (d.remaining, d.retry_after_ms, c.slot_id.as_str()),
        (0, 6_000, "")
    );
    // A renewal moves the slot's end to 10 s from now.
    let renewed = conc
        .renew(slot_req("t", "exports", &a.slot_id))
        .await
        .expect("renew is answered")
        .into_inner();
    assert!(renewed.renewed);
    assert_eq!(renewed.ttl_ms, 10_000);
    clock.advance(Duration::from_secs(6));
    // b ended unreleased at 10 s; a lives on to 14 s.
    assert_eq!(free(&mut quota, "t").await, 1);
    assert!(!release(&mut conc, slot_req("t", "exports", &b.slot_id)).await);
    assert_eq!(
        free(&mut quota, "t").await,
        1,
        "an ended slot frees no one else's"
    );
    assert!(release(&mut conc, slot_req("t", "exports", &a.slot_id)).await);
    assert!(
        !release(&mut conc, slot_req("t", "exports", &a.slot_id)).await,
        "idempotent"
    );
    assert_eq!(free(&mut quota, "t").await, 2);
    let renewed = conc
        .renew(slot_req("t", "exports", &a.slot_id))
        .await
        .expect("renew is answered")
        .into_inner();
    assert!(!renewed.renewed, "a released slot is not renewed");
    // The acquisitions are counted as decisions of the policy.
    let metrics = server.metrics().await;
    let labels = |outcome| {
        [
            ("policy", "exports"),
            ("algorithm", "concurrency"),
            ("outcome", outcome),
        ]
    };
    let allowed = metrics.series("quotad_decisions_total");
    assert!(!allowed.is_empty());
    assert_eq!(
        metrics
            .series("quotad_decisions_total")
            .iter()
            .filter(|(l, _)| labels("allowed")
                .iter()
                .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
            .map(|(_, v)| v)
            .sum::<f64>(),
        2.0
    );
}

#[tokio::test]
async fn bad_input_is_named_and_changes_nothing() {
    let (_clock, server) = start(CONFIG).await;
    let (mut conc, mut quota) = clients(&server).await;
    let held = acquire(&mut conc, acquire_req("t", "exports", None)).await;
    assert!(held.decision.expect("a decision").allowed);
    let invalid = |status: tonic::Status, field: &str| {
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(field_of(&status), field, "{status:?}");
    };
    // Cost above the limit, and 0.
    invalid(
        conc.acquire(acquire_req("t", "exports", Some(3)))
            .await
            .expect_err("refused"),
        "cost",
    );
    invalid(
        conc.acquire(acquire_req("t", "exports", Some(0)))
            .await
            .expect_err("refused"),
        "cost",
    );
    // A rate is not acquired; a concurrency policy is not checked.
    invalid(
        conc.acquire(acquire_req("t", "per-minute", None))
            .await
            .expect_err("refused"),
        "policy_name",
    );
    invalid(
        quota
            .check(named("t", "exports", None))
            .await
            .expect_err("refused"),
        "policy_name",
    );
    // An inline policy with slot_ttl (its window_ms) 0.
    let zero_ttl = pb::AcquireRequest {
        policy: Some(pb::acquire_request::Policy::InlinePolicy(pb::Policy {
            algorithm: pb::Algorithm::Concurrency.into(),
            limit: 5,
            window_ms: 0,
            burst: None,
            ..Default::default()
        })),
        ..acquire_req("t", "exports", None)
    };
    let status = conc.acquire(zero_ttl).await.expect_err("refused");
    invalid(status.clone(), "inline_policy.window_ms");
    assert!(status.message().contains("slot_ttl"), "{status:?}");
    // Slot ids that are not 16 lowercase hex digits.
    for bad in ["", "xyz", "00000000000000AB", &format!("{}0", held.slot_id)] {
        invalid(
            conc.release(slot_req("t", "exports", bad))
                .await
                .expect_err("refused"),
            "slot_id",
        );
        invalid(
            conc.renew(slot_req("t", "exports", bad))
                .await
                .expect_err("refused"),
            "slot_id",
        );
    }
    // Unknown policy.
    let status = conc
        .acquire(acquire_req("t", "nope", None))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::NotFound);
    // Nothing of it took or freed a slot.
    assert_eq!(free(&mut quota, "t").await, 1);
}

#[tokio::test]
async fn a_config_names_a_concurrency_policys_own_rules() {
    for (toml, field) in [
        (
            "algorithm = \"concurrency\"\nlimit = 2\nslot_ttl = \"0s\"",
            "policies.p.slot_ttl",
        ),
        (
            "algorithm = \"concurrency\"\nlimit = 2",
            "policies.p: missing field `slot_ttl`",
        ),
        (
            "algorithm = \"concurrency\"\nlimit = 2\nwindow = \"1s\"",
            "policies.p.window",
        ),
        (
            "algorithm = \"concurrency\"\nlimit = 10001\nslot_ttl = \"1s\"",
            "policies.p.limit",
        ),
        (
            "algorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1s\"\nslot_ttl = \"1s\"",
            "policies.p.slot_ttl",
        ),
    ] {
        let text = format!("[policies.p]\n{toml}\n");
        let error = quotad::Config::from_toml(&text)
            .expect_err("refused")
            .to_string();
        assert!(error.contains(field), "{toml}: {error}");
    }
}

#[tokio::test]
async fn an_all_or_nothing_batch_takes_slots_only_when_every_item_fits() {
    let (_clock, server) = start(CONFIG).await;
    batch_takes_slots_only_when_every_item_fits(&server).await;
}

/// `exports` (2 in flight, slots of 10 s) and `per-minute`, 3 units a day
/// refilling (too slowly to refill a unit while a test runs on Redis's
/// clock), on the Redis of `target` (its `[store.redis]` lines).
fn redis_batch_config(target: &str, on_error: &str) -> String {
    format!(
        r#"
[store]
backend = "redis"

[store.redis]
{target}
timeout = "300ms"

[policies.exports]
algorithm = "concurrency"
limit = 2
slot_ttl = "10s"
on_error = "{on_error}"

[policies.per-minute]
algorithm = "token_bucket"
limit = 3
window = "1d"
on_error = "{on_error}"
"#
    )
}

#[tokio::test]
async fn on_redis_an_all_or_nothing_batch_takes_slots_only_when_every_item_fits() {
    let redis = RedisServer::start();
    let toml = redis_batch_config(&format!("url = {:?}", redis.url()), "error");
    let server = TestServer::start_toml(&toml, Arc::new(quotad_core::SystemClock)).await;
    batch_takes_slots_only_when_every_item_fits(&server).await;
}

/// The same on a Cluster: a key's rate and slots share its hash tag, so
/// its Cluster slot, and the batch is one script there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_an_all_or_nothing_batch_takes_slots_only_when_every_item_fits() {
    let cluster = crate::common::redis::RedisCluster::start();
    let toml = redis_batch_config(&format!("cluster_nodes = {:?}", cluster.urls()), "error");
    let server = TestServer::start_toml(&toml, Arc::new(quotad_core::SystemClock)).await;
    batch_takes_slots_only_when_every_item_fits(&server).await;
}

/// "3 per minute and at most 2 at once" as all-or-nothing batches of key
/// `t` on `server`: each takes the rate's unit and a slot, or nothing, as
/// Peeks of both policies show after each.
async fn batch_takes_slots_only_when_every_item_fits(server: &TestServer) {
    let (mut conc, mut quota) = clients(server).await;
    let batch = || vec![named("t", "per-minute", None), named("t", "exports", None)];
    let rate_left = |quota: &mut QuotaClient<Channel>| {
        let mut quota = quota.clone();
        async move {
            peek(&mut quota, named("t", "per-minute", None))
                .await
                .remaining
        }
    };
    let mut slots = Vec::new();
    for taken in 1..=2 {
        let d = check_batch(&mut quota, batch(), pb::BatchMode::AllOrNothing).await;
        assert!(d.iter().all(|d| d.allowed), "{d:?}");
        assert_eq!((d[0].slot_id.as_str(), d[1].slot_id.len()), ("", 16));
        assert_eq!(d[1].slot_ttl_ms, 10_000);
        assert_eq!(d[1].remaining, 2 - taken);
        slots.push(d[1].slot_id.clone());
        assert_eq!(free(&mut quota, "t").await, 2 - taken);
        assert_eq!(rate_left(&mut quota).await, 3 - taken);
    }
    // Slots full: the rate's unit is not taken either.
    let d = check_batch(&mut quota, batch(), pb::BatchMode::AllOrNothing).await;
    assert_eq!(d[0].reason(), pb::Reason::BatchRejected);
    assert_eq!(d[1].reason(), pb::Reason::LimitExceeded);
    assert!((1..=10_000).contains(&d[1].retry_after_ms), "{d:?}");
    assert_eq!(rate_left(&mut quota).await, 1);
    // A Peek of the full slots answers what the acquire did, twice: it
    // takes nothing.
    for _ in 0..2 {
        let p = peek(&mut quota, named("t", "exports", None)).await;
        assert_eq!((p.allowed, p.remaining), (false, 0), "{p:?}");
        assert!((1..=10_000).contains(&p.retry_after_ms), "{p:?}");
        assert!(p.retry_after_ms <= d[1].retry_after_ms, "{p:?} after {d:?}");
    }
    // The batch's slot is released like any.
    assert!(release(&mut conc, slot_req("t", "exports", &slots[0])).await);
    assert_eq!(free(&mut quota, "t").await, 1);
    let d = check_batch(&mut quota, batch(), pb::BatchMode::AllOrNothing).await;
    assert!(d.iter().all(|d| d.allowed), "{d:?}");
    assert_eq!(
        (free(&mut quota, "t").await, rate_left(&mut quota).await),
        (0, 0)
    );
    // The rate is spent: the slot is not taken.
    assert!(release(&mut conc, slot_req("t", "exports", &slots[1])).await);
    let d = check_batch(&mut quota, batch(), pb::BatchMode::AllOrNothing).await;
    assert_eq!(d[0].reason(), pb::Reason::LimitExceeded);
    assert_eq!(
        (d[1].reason(), d[1].slot_id.as_str()),
        (pb::Reason::BatchRejected, "")
    );
    assert_eq!(free(&mut quota, "t").await, 1);
    // Two acquires of one key in one batch see each other: with one slot
    // free, both are refused and neither is taken.
    let two = vec![named("t", "exports", None), named("t", "exports", None)];
    let d = check_batch(&mut quota, two, pb::BatchMode::AllOrNothing).await;
    assert_eq!(
        (d[0].reason(), d[1].reason()),
        (pb::Reason::BatchRejected, pb::Reason::LimitExceeded),
        "{d:?}"
    );
    assert_eq!(free(&mut quota, "t").await, 1);
    // An independent batch with an acquire is refused, taking nothing.
    let status = quota
        .check_batch(pb::CheckBatchRequest {
            items: vec![named("u", "per-minute", None), named("u", "exports", None)],
            mode: pb::BatchMode::Independent.into(),
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(field_of(&status), "items[1]", "{status:?}");
    assert_eq!(free(&mut quota, "u").await, 2);
    assert_eq!(
        peek(&mut quota, named("u", "per-minute", None))
            .await
            .remaining,
        3
    );
}

#[tokio::test]
async fn an_independent_batch_takes_no_slot_and_names_the_item() {
    let (_clock, server) = start(CONFIG).await;
    let (_conc, mut quota) = clients(&server).await;
    // As a client's coalescer would send them: independent, one of them an
    // acquire its caller could never release.
    let status = quota
        .check_batch(pb::CheckBatchRequest {
            items: vec![named("t", "per-minute", None), named("t", "exports", None)],
            mode: pb::BatchMode::Independent.into(),
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(field_of(&status), "items[1]", "{status:?}");
    assert_eq!(free(&mut quota, "t").await, 2, "no slot taken");
    assert_eq!(
        peek(&mut quota, named("t", "per-minute", None))
            .await
            .remaining,
        3,
        "nothing counted"
    );
}

#[tokio::test]
async fn a_lease_of_an_inline_concurrency_policy_is_refused() {
    let (_clock, server) = start(CONFIG).await;
    let mut leases = quotad_proto::v1::leases_client::LeasesClient::new(server.channel().await);
    let status = leases
        .lease(pb::LeaseRequest {
            key: "t".to_owned(),
            want: 1,
            policy: Some(pb::lease_request::Policy::InlinePolicy(pb::Policy {
                algorithm: pb::Algorithm::Concurrency.into(),
                limit: 2,
                window_ms: 10_000,
                burst: None,
                ..Default::default()
            })),
            inline_terms: Some(pb::LeaseTerms {
                max_units: 1,
                min_units: 1,
                max_ttl_ms: 1_000,
            }),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(field_of(&status), "inline_policy.algorithm", "{status:?}");
}

fn redis_config(redis: &RedisServer, limit: u64, slot_ttl: &str, on_error: &str) -> String {
    redis_config_within(redis, limit, slot_ttl, on_error, "300ms")
}

fn redis_config_within(
    redis: &RedisServer,
    limit: u64,
    slot_ttl: &str,
    on_error: &str,
    timeout: &str,
) -> String {
    format!(
        r#"
[store]
backend = "redis"

[store.redis]
url = "{url}"
timeout = "{timeout}"

[policies.jobs]
algorithm = "concurrency"
limit = {limit}
slot_ttl = "{slot_ttl}"
on_error = "{on_error}"
"#,
        url = redis.url()
    )
}

/// Runs `acquirers` tasks over `replicas`, each acquiring a slot (retrying
/// after the answer's wait while full), holding it a random 1 to 5 ms and
/// releasing it; returns each holder's interval, from when its acquire was
/// answered to when its release was sent, by one clock.
async fn hold_many(replicas: &[TestServer], acquirers: usize) -> Vec<(Instant, Instant)> {
    let mut clients = Vec::new();
    for r in replicas {
        clients.push(ConcurrencyClient::new(r.channel().await));
    }
    let tasks: Vec<_> = (0..acquirers)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            tokio::spawn(async move {
                loop {
                    let answer = acquire(&mut client, acquire_req("hot", "jobs", None)).await;
                    let answered = Instant::now();
                    let decision = answer.decision.expect("a decision");
                    if decision.allowed {
                        let hold = rand::rng().random_range(1..=5);
                        tokio::time::sleep(Duration::from_millis(hold)).await;
                        let sent = Instant::now();
                        assert!(
                            release(&mut client, slot_req("hot", "jobs", &answer.slot_id)).await
                        );
                        return (answered, sent);
                    }
                    assert_eq!(decision.reason(), pb::Reason::LimitExceeded);
                    // A release frees a slot sooner than its TTL: poll.
                    let wait = rand::rng().random_range(2..=20);
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                }
            })
        })
        .collect();
    let mut intervals = Vec::new();
    for task in tasks {
        intervals.push(task.await.expect("an acquirer finished"));
    }
    intervals
}

/// The most intervals that overlap at any instant: each holder held its
/// slot at least from its acquire's answer to its release's sending.
fn most_at_once(intervals: &[(Instant, Instant)]) -> usize {
    let mut events: Vec<(Instant, i32)> = intervals
        .iter()
        .flat_map(|&(from, to)| [(from, 1), (to, -1)])
        .collect();
    // At one instant, ends before starts: touching intervals do not overlap.
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).expect("never negative")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_acquirers_over_three_replicas_never_hold_more_than_the_limit() {
    let redis = RedisServer::start();
    for run in 0..3 {
        let clock = Arc::new(quotad_core::SystemClock);
        let mut replicas = Vec::new();
        for _ in 0..3 {
            // A busy test host can take a while to answer 200 callers.
            let toml = redis_config_within(&redis, 5, "10s", "error", "5s");
            replicas.push(TestServer::start_toml(&toml, clock.clone()).await);
        }
        let intervals = hold_many(&replicas, 200).await;
        assert_eq!(intervals.len(), 200);
        let most = most_at_once(&intervals);
        assert!(most <= 5, "run {run}: {most} held at once");
        assert!(
            most >= 2,
            "run {run}: the slots were shared ({most} at most)"
        );
        // Every slot was released: the key holds none.
        let mut conc = ConcurrencyClient::new(replicas[1].channel().await);
        let answer = acquire(
            &mut conc,
            pb::AcquireRequest {
                cost: Some(5),
                ..acquire_req("hot", "jobs", None)
            },
        )
        .await;
        assert!(
            answer.decision.expect("a decision").allowed,
            "run {run}: all 5 free"
        );
        assert!(release(&mut conc, slot_req("hot", "jobs", &answer.slot_id)).await);
    }
}

/// The same over a three-master Redis Cluster: each key's slots live in
/// its own Cluster slot, whichever node holds it; keys on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_two_hundred_acquirers_over_three_replicas_never_hold_more_than_the_limit() {
    let cluster = crate::common::redis::RedisCluster::start();
    let clock = Arc::new(quotad_core::SystemClock);
    let toml = format!(
        r#"
[store]
backend = "redis"

[store.redis]
cluster_nodes = {nodes:?}
timeout = "5s"

[policies.jobs]
algorithm = "concurrency"
limit = 5
slot_ttl = "10s"
on_error = "error"
"#,
        nodes = cluster.urls()
    );
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(TestServer::start_toml(&toml, clock.clone()).await);
    }
    let intervals = hold_many(&replicas, 200).await;
    let most = most_at_once(&intervals);
    assert!(most <= 5, "{most} held at once");
    assert!(most >= 2, "the slots were shared ({most} at most)");
    // Keys on each of the three nodes: their own limits, all released.
    let mut conc = ConcurrencyClient::new(replicas[2].channel().await);
    for node in 0..3 {
        for key in cluster.keys_on(node, "tenant-", 2) {
            let full = acquire(
                &mut conc,
                pb::AcquireRequest {
                    cost: Some(5),
                    ..acquire_req(&key, "jobs", None)
                },
            )
            .await;
            assert!(
                full.decision.expect("a decision").allowed,
                "{key} on node {node}"
            );
            let more = acquire(&mut conc, acquire_req(&key, "jobs", None)).await;
            assert!(!more.decision.expect("a decision").allowed, "{key}: full");
            assert!(release(&mut conc, slot_req(&key, "jobs", &full.slot_id)).await);
        }
    }
    let answer = acquire(
        &mut conc,
        pb::AcquireRequest {
            cost: Some(5),
            ..acquire_req("hot", "jobs", None)
        },
    )
    .await;
    assert!(
        answer.decision.expect("a decision").allowed,
        "all 5 of hot free"
    );
}

#[tokio::test]
async fn on_redis_a_release_of_an_ended_slot_frees_no_one_elses() {
    let redis = RedisServer::start();
    let clock = Arc::new(quotad_core::SystemClock);
    let server = TestServer::start_toml(&redis_config(&redis, 1, "300ms", "error"), clock).await;
    let mut conc = ConcurrencyClient::new(server.channel().await);
    let first = acquire(&mut conc, acquire_req("k", "jobs", None)).await;
    assert!(first.decision.expect("a decision").allowed);
    let denied = acquire(&mut conc, acquire_req("k", "jobs", None)).await;
    let d = denied.decision.expect("a decision");
    assert!(!d.allowed);
    assert!((1..=300).contains(&d.retry_after_ms), "{d:?}");
    tokio::time::sleep(Duration::from_millis(350)).await;
    let second = acquire(&mut conc, acquire_req("k", "jobs", None)).await;
    assert!(
        second.decision.expect("a decision").allowed,
        "the ended slot came back"
    );
    assert!(!release(&mut conc, slot_req("k", "jobs", &first.slot_id)).await);
    let third = acquire(&mut conc, acquire_req("k", "jobs", None)).await;
    assert!(
        !third.decision.expect("a decision").allowed,
        "the second holder still holds"
    );
    let renewed = conc
        .renew(slot_req("k", "jobs", &second.slot_id))
        .await
        .expect("renew is answered")
        .into_inner();
    assert!(renewed.renewed);
    assert!(release(&mut conc, slot_req("k", "jobs", &second.slot_id)).await);
}

#[tokio::test]
async fn a_stalled_redis_acquires_nothing_late_and_on_error_applies() {
    let mut redis = RedisServer::start();
    let clock = Arc::new(quotad_core::SystemClock);
    let closed = TestServer::start_toml(
        &redis_config(&redis, 1, "30s", "fail_closed"),
        clock.clone(),
    )
    .await;
    let failing = TestServer::start_toml(&redis_config(&redis, 1, "30s", "error"), clock).await;
    let mut closed_client = ConcurrencyClient::new(closed.channel().await);
    let mut failing_client = ConcurrencyClient::new(failing.channel().await);
    // Make sure both have loaded the script and connected.
    let warm = acquire(&mut closed_client, acquire_req("warm", "jobs", None)).await;
    assert!(warm.decision.expect("a decision").allowed);
    let _ = acquire(&mut failing_client, acquire_req("warm2", "jobs", None)).await;
    redis.pause();
    let d = acquire(&mut closed_client, acquire_req("stalled", "jobs", None))
        .await
        .decision
        .expect("a decision");
    assert_eq!((d.allowed, d.reason()), (false, pb::Reason::FailClosed));
    let status = failing_client
        .acquire(acquire_req("stalled", "jobs", None))
        .await
        .expect_err("unavailable");
    assert_eq!(status.code(), Code::Unavailable);
    tokio::time::sleep(Duration::from_millis(400)).await;
    redis.resume();
    // The acquires queued in the stalled Redis ran past their deadline and
    // took nothing: the key's one slot is free.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after = acquire(&mut failing_client, acquire_req("stalled", "jobs", None)).await;
    assert!(
        after.decision.expect("a decision").allowed,
        "nothing was acquired late"
    );
}

/// An all-or-nothing batch of a rate and an acquire sent to a stalled
/// Redis is answered by on_error, and when Redis runs it after its
/// deadline it takes neither the slot nor the rate's unit.
#[tokio::test]
async fn a_stalled_redis_takes_nothing_late_from_a_batch_of_a_rate_and_an_acquire() {
    let mut redis = RedisServer::start();
    let clock = Arc::new(quotad_core::SystemClock);
    let target = format!("url = {:?}", redis.url());
    let closed =
        TestServer::start_toml(&redis_batch_config(&target, "fail_closed"), clock.clone()).await;
    let failing = TestServer::start_toml(&redis_batch_config(&target, "error"), clock).await;
    let (_, mut closed_quota) = clients(&closed).await;
    let (_, mut failing_quota) = clients(&failing).await;
    let batch = |key: &str| vec![named(key, "per-minute", None), named(key, "exports", None)];
    // Both connected and with the script loaded.
    for quota in [&mut closed_quota, &mut failing_quota] {
        let d = check_batch(quota, batch("warm"), pb::BatchMode::AllOrNothing).await;
        assert!(d.iter().all(|d| d.allowed), "{d:?}");
    }
    redis.pause();
    let d = check_batch(
        &mut closed_quota,
        batch("stalled"),
        pb::BatchMode::AllOrNothing,
    )
    .await;
    assert!(
        d.iter()
            .all(|d| !d.allowed && d.reason() == pb::Reason::FailClosed && d.slot_id.is_empty()),
        "{d:?}"
    );
    let status = failing_quota
        .check_batch(pb::CheckBatchRequest {
            items: batch("stalled"),
            mode: pb::BatchMode::AllOrNothing.into(),
        })
        .await
        .expect_err("unavailable");
    assert_eq!(status.code(), Code::Unavailable);
    tokio::time::sleep(Duration::from_millis(400)).await;
    redis.resume();
    // The two batches queued in the stalled Redis reach it now, past their
    // deadline: each server hears its script refuse to run (not a dropped
    // connection that never sent it), and nothing was taken: both slots
    // and all three units are there.
    for server in [&closed, &failing] {
        server.late_script_refused().await;
    }
    assert_eq!(free(&mut failing_quota, "stalled").await, 2);
    assert_eq!(
        peek(&mut failing_quota, named("stalled", "per-minute", None))
            .await
            .remaining,
        3
    );
}

#[tokio::test]
async fn on_redis_an_acquire_whose_caller_went_away_strands_no_slot() {
    let mut redis = RedisServer::start();
    let server = TestServer::start_toml(
        &redis_config_within(&redis, 1, "30s", "error", "3s"),
        Arc::new(quotad_core::SystemClock),
    )
    .await;
    let mut client = ConcurrencyClient::new(server.channel().await);
    let warm = acquire(&mut client, acquire_req("warm", "jobs", None)).await;
    assert!(warm.decision.expect("a decision").allowed);
    for round in 0..2 {
        let key = format!("gone-{round}");
        // The script is sent to a stalled Redis; the caller goes away (its
        // call cancelled) before Redis wakes and runs it, within its 3 s
        // deadline, taking the key's one 30 s slot for no one.
        redis.pause();
        let gone = tokio::time::timeout(
            Duration::from_millis(300),
            client.acquire(acquire_req(&key, "jobs", None)),
        )
        .await;
        assert!(gone.is_err(), "the caller stopped waiting");
        tokio::time::sleep(Duration::from_millis(200)).await;
        redis.resume();
        // quotad released it: the key's slot is free again long before 30 s.
        let probe = client.clone();
        crate::common::eventually(
            Duration::from_secs(3),
            "the slot taken for no one is released",
            || {
                let mut probe = probe.clone();
                let key = key.clone();
                async move {
                    let answer = acquire(&mut probe, acquire_req(&key, "jobs", None)).await;
                    let allowed = answer.decision.expect("a decision").allowed;
                    if allowed {
                        assert!(release(&mut probe, slot_req(&key, "jobs", &answer.slot_id)).await);
                    }
                    allowed
                }
            },
        )
        .await;
        // Released once by quotad (and once by the probe), per round: the
        // orphaned script did take the slot, and exactly one side of the
        // hand-off released it.
        let releases = server.metrics().await.value(
            "quotad_store_operations_total",
            &[("backend", "redis"), ("op", "release")],
        );
        assert_eq!(releases, f64::from(2 * (round + 1)), "round {round}");
    }
}

/// A `quotad acquire --hold 1h` process: it takes a slot, prints it, and
/// renews it until it is killed (by its own handle, on drop too).
struct Holder(std::process::Child);

impl Holder {
    fn spawn(addr: std::net::SocketAddr) -> (Holder, String) {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_quotad"))
            .args([
                "acquire",
                "--addr",
                &addr.to_string(),
                "--policy",
                "jobs",
                "--key",
                "k",
            ])
            .args(["--hold", "1h"])
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start quotad acquire");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the holder's first line");
        (Holder(child), line)
    }

    fn kill(&mut self) {
        // SIGKILL: no release, no goodbye.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_slot_comes_back_after_slot_ttl_and_not_before() {
    let redis = RedisServer::start();
    for run in 0..3 {
        let clock = Arc::new(quotad_core::SystemClock);
        let toml = redis_config_within(&redis, 1, "1500ms", "error", "2s");
        let server = TestServer::start_toml(&toml, clock).await;
        let mut conc = ConcurrencyClient::new(server.channel().await);
        let addr = server.grpc_addr;
        let (mut holder, line) = tokio::task::spawn_blocking(move || Holder::spawn(addr))
            .await
            .expect("spawned");
        assert!(line.starts_with("acquired slot="), "run {run}: {line}");
        // Held past its TTL by renewals (every 500 ms).
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        let d = acquire(&mut conc, acquire_req("k", "jobs", None))
            .await
            .decision
            .expect("a decision");
        assert!(!d.allowed, "run {run}: the renewed slot is still held");
        holder.kill();
        let killed = Instant::now();
        // Not before: its last renewal was at most ~500 ms before the kill,
        // so the slot lives at least ~1 s more.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let d = acquire(&mut conc, acquire_req("k", "jobs", None))
            .await
            .decision
            .expect("a decision");
        assert!(!d.allowed, "run {run}: back too soon");
        assert!((1..=1_500).contains(&d.retry_after_ms), "run {run}: {d:?}");
        let back_at = Instant::now() + Duration::from_millis(d.retry_after_ms);
        assert!(
            back_at <= killed + Duration::from_millis(1_600),
            "run {run}: within slot_ttl of the kill"
        );
        // After slot_ttl from the kill, it is free.
        tokio::time::sleep_until((killed + Duration::from_millis(1_600)).into()).await;
        let answer = acquire(&mut conc, acquire_req("k", "jobs", None)).await;
        assert!(
            answer.decision.expect("a decision").allowed,
            "run {run}: the slot came back"
        );
        assert!(release(&mut conc, slot_req("k", "jobs", &answer.slot_id)).await);
        let metrics = server.metrics().await;
        assert!(
            metrics.value("quotad_concurrency_slots_expired_total", &[]) >= 1.0,
            "run {run}"
        );
    }
}
