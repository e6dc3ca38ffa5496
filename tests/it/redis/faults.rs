//! Real faults under the Redis backend: a stalled server (SIGSTOP), a
//! stalled Cluster master, a blackholed connection, a refused one, a
//! failover behind one address, refused credentials and corrupt state.
//! Each test holds quotad to what `docs/redis.md` promises: nothing
//! answered as failed is counted later, every decided call counts once,
//! and one broken thing fails only its own calls.

mod cluster;
mod recovery;
mod refusals;

use std::time::{Duration, Instant};

use quotad::Config;
use quotad_proto::v1 as pb;
use quotad_proto::v1::quota_client::QuotaClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::common::redis::{BlackholeProxy, RedisCluster, RedisServer};
use crate::common::{TestServer, eventually, named, peek};

/// Connection attempts so far: (connected, failed).
async fn attempts(server: &TestServer) -> (f64, f64) {
    let metrics = server.metrics().await;
    let outcome = |o| metrics.value("quotad_redis_connection_attempts_total", &[("outcome", o)]);
    (outcome("ok"), outcome("error"))
}

/// One policy per `on_error`, each a fixed window of 10 per day.
fn stall_config(target: &str, timeout: &str) -> Config {
    three_policies(target, timeout, 10)
}

/// Policies `err`, `open` (limit `open_limit`) and `closed`, fixed windows
/// of a day, each with the `on_error` of its name.
fn three_policies(target: &str, timeout: &str, open_limit: u64) -> Config {
    Config::from_toml(&three_policies_toml(target, timeout, open_limit)).expect("valid config")
}

fn three_policies_toml(target: &str, timeout: &str, open_limit: u64) -> String {
    format!(
        r#"
[store]
backend = "redis"

[store.redis]
{target}
timeout = "{timeout}"

[policies.err]
algorithm = "fixed_window"
limit = 10
window = "1d"
on_error = "error"

[policies.open]
algorithm = "fixed_window"
limit = {open_limit}
window = "1d"
on_error = "fail_open"

[policies.closed]
algorithm = "fixed_window"
limit = 10
window = "1d"
on_error = "fail_closed"
"#
    )
}

const POLICIES: [&str; 3] = ["err", "open", "closed"];

/// What one check answered: decided (counted if allowed), or failed.
#[derive(Debug, PartialEq)]
enum Answer {
    Decided(pb::Decision),
    Failed(String),
}

async fn ask(client: &mut QuotaClient<Channel>, key: &str, policy: &str) -> Answer {
    ask_within(client, key, policy, None).await
}

/// [`ask`], with the client's deadline `deadline` (sent as `grpc-timeout`,
/// as Envoy sends its 20 ms).
async fn ask_within(
    client: &mut QuotaClient<Channel>,
    key: &str,
    policy: &str,
    deadline: Option<Duration>,
) -> Answer {
    let mut request = tonic::Request::new(named(key, policy, None));
    if let Some(deadline) = deadline {
        request.set_timeout(deadline);
    }
    let call = client.check(request);
    match tokio::time::timeout(Duration::from_secs(10), call).await {
        Ok(Ok(r)) => {
            let d = r.into_inner().decision.expect("a decision");
            match d.reason() {
                pb::Reason::WithinLimit | pb::Reason::LimitExceeded => Answer::Decided(d),
                other => Answer::Failed(format!("{other:?}")),
            }
        }
        Ok(Err(status)) => Answer::Failed(format!("{:?}", status.code())),
        Err(_) => panic!("{policy}: no answer within 10 s"),
    }
}

fn admitted(answers: &[Answer]) -> u64 {
    answers
        .iter()
        .filter(|a| matches!(a, Answer::Decided(d) if d.allowed))
        .count() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_redis_counts_nothing_that_was_answered_as_failed() {
    let mut redis = RedisServer::start();
    let server =
        TestServer::start(stall_config(&format!("url = {:?}", redis.url()), "100ms")).await;
    let mut client = server.client().await;
    let key = "stalled";
    let mut answers: Vec<Vec<Answer>> = vec![Vec::new(), Vec::new(), Vec::new()];
    for (i, policy) in POLICIES.iter().enumerate() {
        for _ in 0..2 {
            answers[i].push(ask(&mut client, key, policy).await);
        }
    }
    // A 1.5 s stall, with 5 checks under each policy during it.
    redis.pause();
    let stalled = Instant::now();
    for (i, policy) in POLICIES.iter().enumerate() {
        for _ in 0..5 {
            answers[i].push(ask(&mut client, key, policy).await);
        }
    }
    let left = Duration::from_millis(1_500).saturating_sub(stalled.elapsed());
    tokio::time::sleep(left).await;
    redis.resume();

    // Every script queued in the stall reaches Redis now; the late ones
    // must refuse to count.
    server.late_script_refused().await;
    for (i, policy) in POLICIES.iter().enumerate() {
        let failed = answers[i]
            .iter()
            .filter(|a| matches!(a, Answer::Failed(_)))
            .count();
        assert!(
            failed >= 5,
            "{policy}: the stall failed its checks: {:?}",
            answers[i]
        );
        let d = peek(&mut client, named(key, policy, None)).await;
        assert_eq!(
            d.remaining,
            10 - admitted(&answers[i]),
            "{policy}: only the checks answered as decided count: {:?}",
            answers[i]
        );
    }
    let metrics = server.metrics().await;
    assert_eq!(
        metrics.value("quotad_redis_late_scripts_total", &[("outcome", "counted")]),
        0.0,
        "no script ran in time with its reply late: the stall began between calls"
    );
}

fn cluster_config(nodes: &[String]) -> Config {
    three_policies(&format!("cluster_nodes = {nodes:?}"), "200ms", 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_cluster_master_fails_only_its_own_items() {
    let mut cluster = RedisCluster::start();
    let healthy_a = cluster.keys_on(0, "a", 1).remove(0);
    let healthy_b = cluster.keys_on(1, "b", 1).remove(0);
    let stalled = cluster.keys_on(2, "c", 1).remove(0);
    let server = TestServer::start(cluster_config(&cluster.urls())).await;
    let mut client = server.client().await;

    // Spend `open` (limit 1) on a healthy master.
    assert!(matches!(ask(&mut client, &healthy_a, "open").await, Answer::Decided(d) if d.allowed));

    cluster.nodes[2].pause();
    let items = [
        (&healthy_a, "open"),
        (&healthy_b, "closed"),
        (&stalled, "open"),
        (&stalled, "closed"),
        (&stalled, "err"),
        (&healthy_b, "err"),
    ];
    let batch = pb::CheckBatchRequest {
        items: items.iter().map(|(k, p)| named(k, p, None)).collect(),
        mode: pb::BatchMode::Independent.into(),
    };
    let d = client
        .check_batch(batch)
        .await
        .expect("an independent batch answers per item")
        .into_inner()
        .decisions;
    // The exhausted key on a healthy master stays denied under fail_open.
    assert_eq!(
        (d[0].allowed, d[0].reason()),
        (false, pb::Reason::LimitExceeded)
    );
    // A fresh key on a healthy master is decided under fail_closed.
    assert_eq!(
        (d[1].allowed, d[1].reason()),
        (true, pb::Reason::WithinLimit)
    );
    // The stalled master's items get their own on_error.
    assert_eq!((d[2].allowed, d[2].reason()), (true, pb::Reason::FailOpen));
    assert_eq!(
        (d[3].allowed, d[3].reason()),
        (false, pb::Reason::FailClosed)
    );
    assert_eq!(
        (d[4].allowed, d[4].reason()),
        (false, pb::Reason::Unavailable)
    );
    assert_eq!(
        (d[5].allowed, d[5].reason()),
        (true, pb::Reason::WithinLimit)
    );

    // Calls to the healthy masters are not held up by the stalled one.
    for _ in 0..5 {
        let a = ask(&mut client, &healthy_b, "err").await;
        assert!(matches!(a, Answer::Decided(ref d) if d.allowed), "{a:?}");
    }
    cluster.nodes[2].resume();

    // Counted exactly once each: one `closed` and six `err` on healthy_b.
    let closed = peek(&mut client, named(&healthy_b, "closed", None)).await;
    assert_eq!(closed.remaining, 9);
    let err = peek(&mut client, named(&healthy_b, "err", None)).await;
    assert_eq!(err.remaining, 4);
    // Nothing answered as failed on the stalled master was counted.
    eventually(Duration::from_secs(5), "the stalled master answers", || {
        let mut client = client.clone();
        let key = stalled.clone();
        async move { client.peek(named(&key, "closed", None)).await.is_ok() }
    })
    .await;
    for policy in ["open", "closed", "err"] {
        let d = peek(&mut client, named(&stalled, policy, None)).await;
        let full = if policy == "open" { 1 } else { 10 };
        assert_eq!(d.remaining, full, "{policy} on the stalled master");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_connection_is_replaced_within_two_seconds() {
    let redis = RedisServer::start();
    let proxy = BlackholeProxy::start(redis.port).await;
    let server =
        TestServer::start(stall_config(&format!("url = {:?}", proxy.url()), "100ms")).await;
    let mut client = server.client().await;
    assert!(matches!(
        ask(&mut client, "bh", "err").await,
        Answer::Decided(_)
    ));

    proxy.blackhole();
    let blackholed = Instant::now();
    // The connection now swallows everything; checks fail until quotad
    // gives up on it and connects again.
    let first = ask(&mut client, "bh", "closed").await;
    assert_eq!(first, Answer::Failed("FailClosed".to_owned()));
    eventually(Duration::from_secs(2), "checks are decided again", || {
        let mut client = client.clone();
        async move { matches!(ask(&mut client, "bh", "err").await, Answer::Decided(_)) }
    })
    .await;
    assert!(blackholed.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_fails_each_check_at_once_instead_of_waiting_the_timeout() {
    let mut redis = RedisServer::start();
    // A long timeout: any check that waited it out would show.
    let server = TestServer::start(stall_config(&format!("url = {:?}", redis.url()), "10s")).await;
    let mut client = server.client().await;
    assert!(matches!(
        ask(&mut client, "r", "err").await,
        Answer::Decided(_)
    ));

    redis.stop();
    let started = Instant::now();
    let mut answers = Vec::new();
    for _ in 0..20 {
        answers.push(ask(&mut client, "r", "closed").await);
        answers.push(ask(&mut client, "r", "err").await);
    }
    for pair in answers.chunks(2) {
        assert_eq!(pair[0], Answer::Failed("FailClosed".to_owned()));
        assert_eq!(pair[1], Answer::Failed("Unavailable".to_owned()));
    }
    // 40 checks answered in less than one timeout: none waited it out.
    assert!(started.elapsed() < Duration::from_secs(10));
    let metrics = server.metrics().await;
    let failed = metrics.value(
        "quotad_redis_connection_attempts_total",
        &[("outcome", "error")],
    );
    assert!(
        (1.0..=40.0).contains(&failed),
        "each check tries to connect at most once: {failed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_behind_one_address_is_followed_at_the_first_readonly() {
    let primary = RedisServer::start();
    let replica = RedisServer::start();
    // Sync the replica at once, not after Redis's default 5 s wait for
    // more replicas.
    for server in [&primary, &replica] {
        server.config_set("repl-diskless-sync-delay", "0");
    }
    assert_eq!(
        replica
            .cli(&["replicaof", "127.0.0.1", &primary.port.to_string()])
            .trim(),
        "OK"
    );
    let proxy = BlackholeProxy::start(primary.port).await;
    let server = TestServer::start(stall_config(&format!("url = {:?}", proxy.url()), "1s")).await;
    let mut client = server.client().await;
    assert!(matches!(ask(&mut client, "fo", "err").await, Answer::Decided(d) if d.allowed));
    eventually(
        Duration::from_secs(10),
        "the replica has the count",
        || async { replica.cli(&["dbsize"]).trim() == "1" },
    )
    .await;

    // The failover: the replica becomes the primary, the old primary its
    // replica, and the address now leads to the new primary.
    assert_eq!(replica.cli(&["replicaof", "no", "one"]).trim(), "OK");
    assert_eq!(
        primary
            .cli(&["replicaof", "127.0.0.1", &replica.port.to_string()])
            .trim(),
        "OK"
    );
    proxy.switch_to(replica.port);

    // quotad's connection still reaches the old primary, now read-only:
    // that one check fails, and the next one is served by the new primary.
    let first = ask(&mut client, "fo", "closed").await;
    assert_eq!(first, Answer::Failed("FailClosed".to_owned()));
    let next = ask(&mut client, "fo", "err").await;
    match next {
        Answer::Decided(d) => assert_eq!(d.remaining, 8, "the count carried over"),
        other => panic!("the new primary serves at once: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_an_outage_subject_to_on_error() {
    let redis = RedisServer::start();
    let server = TestServer::start(stall_config(&format!("url = {:?}", redis.url()), "1s")).await;
    let mut client = server.client().await;
    assert!(matches!(
        ask(&mut client, "auth", "err").await,
        Answer::Decided(_)
    ));
    // The server starts requiring a password and drops quotad's
    // connection: the new one is refused with NOAUTH.
    redis.config_set("requirepass", "now-secret");
    let _ = redis.cli(&[
        "-a",
        "now-secret",
        "--no-auth-warning",
        "client",
        "kill",
        "type",
        "normal",
    ]);
    // The first call may find the connection closed; after that, every
    // connection attempt is refused.
    let _ = ask(&mut client, "auth", "err").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let status = client
        .check(named("auth", "err", None))
        .await
        .expect_err("no credentials, no decision");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("NOAUTH"), "{status:?}");
    assert_eq!(
        ask(&mut client, "auth", "open").await,
        Answer::Failed("FailOpen".to_owned())
    );
    assert_eq!(
        ask(&mut client, "auth", "closed").await,
        Answer::Failed("FailClosed".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_state_is_internal_counted_and_never_failed_open() {
    let redis = RedisServer::start();
    let server = TestServer::start(stall_config(&format!("url = {:?}", redis.url()), "1s")).await;
    let mut client = server.client().await;
    // Garbage under the key quotad uses, and a value of the wrong type.
    assert!(matches!(
        ask(&mut client, "garbage", "open").await,
        Answer::Decided(_)
    ));
    let stored = redis.cli(&["--scan", "--pattern", "*garbage*"]);
    let stored = stored.trim();
    assert!(!stored.is_empty(), "quotad stored state for the key");
    assert_eq!(redis.cli(&["set", stored, "not quotad state"]).trim(), "OK");
    let status = client
        .check(named("garbage", "open", None))
        .await
        .expect_err("corrupt state is not a decision, even failing open");
    assert_eq!(status.code(), Code::Internal, "{status:?}");

    assert!(matches!(
        ask(&mut client, "hash", "closed").await,
        Answer::Decided(_)
    ));
    let stored = redis.cli(&["--scan", "--pattern", "*hash*"]);
    let stored = stored.trim();
    assert_eq!(redis.cli(&["del", stored]).trim(), "1");
    assert_eq!(redis.cli(&["hset", stored, "f", "v"]).trim(), "1");
    let status = client
        .check(named("hash", "closed", None))
        .await
        .expect_err("a value of the wrong type is corrupt state");
    assert_eq!(status.code(), Code::Internal, "{status:?}");

    let metrics = server.metrics().await;
    assert_eq!(metrics.value("quotad_redis_corrupt_state_total", &[]), 2.0);
    // Other keys are unaffected.
    assert!(matches!(ask(&mut client, "fine", "open").await, Answer::Decided(d) if d.allowed));
}

/// Policies `err`, `open` and `closed` on Redis with a 2 s timeout, and
/// `[transport]` as given.
fn long_timeout_config(url: &str, transport: &str) -> Config {
    let toml = format!(
        "{transport}\n{}",
        three_policies_toml(&format!("url = {url:?}"), "2s", 10)
    );
    Config::from_toml(&toml).expect("valid config")
}

/// Whether a call was answered as failed: an error (the deadline, or
/// `on_error = error`), or a decision made by `on_error`.
fn not_decided(answer: &Result<Option<pb::Decision>, tonic::Status>) -> bool {
    match answer {
        Err(_) => true,
        Ok(d) => d.as_ref().is_some_and(|d| {
            !matches!(
                d.reason(),
                pb::Reason::WithinLimit | pb::Reason::LimitExceeded
            )
        }),
    }
}

/// Checks `key` under every policy while Redis is stopped, each call ended
/// by a deadline far shorter than the store's timeout (`deadline`: the
/// client's, sent as `grpc-timeout`; `None`: the server's
/// `transport.request_timeout`), as single checks and as an independent
/// batch; then lets Redis run the scripts queued meanwhile, and requires
/// that none of them counted.
async fn nothing_failed_by_a_deadline_counts_after_a_stall(
    redis: &mut RedisServer,
    server: &TestServer,
    deadline: Option<Duration>,
) {
    let mut client = server.client().await;
    let key = "deadline";
    // Each policy decided once before the stall (the connection made and
    // the script loaded). With a 50 ms request timeout a loaded machine
    // can miss the first call's deadline: asked again until decided.
    for policy in POLICIES {
        let mut tries = 0;
        while !matches!(ask(&mut client, key, policy).await, Answer::Decided(d) if d.allowed) {
            tries += 1;
            assert!(tries < 50, "{policy}: never decided before the stall");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // What Redis holds before the stall (a missed first call may have
    // counted too): the stall must add nothing to it.
    let mut before = Vec::new();
    for policy in POLICIES {
        before.push(peek(&mut client, named(key, policy, None)).await.remaining);
    }
    redis.pause();
    let stalled = Instant::now();
    fn with_deadline<T>(message: T, deadline: Option<Duration>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(d) = deadline {
            request.set_timeout(d);
        }
        request
    }
    for _ in 0..3 {
        for policy in POLICIES {
            let call = client.check(with_deadline(named(key, policy, None), deadline));
            let answer = tokio::time::timeout(Duration::from_secs(1), call)
                .await
                .expect("answered well within the store's 2 s timeout");
            assert!(
                not_decided(&answer.map(|r| r.into_inner().decision)),
                "{policy}: the deadline ends the call"
            );
        }
        let batch = pb::CheckBatchRequest {
            items: POLICIES.iter().map(|p| named(key, p, None)).collect(),
            mode: pb::BatchMode::Independent.into(),
        };
        let call = client.check_batch(with_deadline(batch, deadline));
        let answer = tokio::time::timeout(Duration::from_secs(1), call)
            .await
            .expect("answered well within the store's 2 s timeout");
        match answer {
            Ok(r) => {
                for d in r.into_inner().decisions {
                    assert!(not_decided(&Ok(Some(d))), "the deadline ends the batch");
                }
            }
            Err(status) => assert!(not_decided(&Err(status))),
        }
    }
    // Resumed well before the store's own timeout: a script whose deadline
    // were that timeout would run now, and count. (Not at once after the
    // last call: quotad's deadline counts from when it read the request,
    // the request's transit later than the client's.)
    let left = Duration::from_millis(600).saturating_sub(stalled.elapsed());
    tokio::time::sleep(left.max(Duration::from_millis(100))).await;
    redis.resume();
    // One connection, answered in order: this peek's reply comes after
    // every script queued in the stall has run (or refused to).
    for (policy, before) in POLICIES.iter().zip(before) {
        let d = peek(&mut client, named(key, policy, None)).await;
        assert_eq!(
            d.remaining, before,
            "{policy}: nothing the caller saw fail was counted"
        );
    }
    let metrics = server.metrics().await;
    assert_eq!(
        metrics.value("quotad_redis_late_scripts_total", &[("outcome", "counted")]),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_deadline_shorter_than_the_redis_timeout_is_the_scripts_deadline() {
    let mut redis = RedisServer::start();
    let server = TestServer::start(long_timeout_config(&redis.url(), "")).await;
    nothing_failed_by_a_deadline_counts_after_a_stall(
        &mut redis,
        &server,
        Some(Duration::from_millis(50)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_timeout_shorter_than_the_redis_timeout_is_the_scripts_deadline() {
    let mut redis = RedisServer::start();
    let server = TestServer::start(long_timeout_config(
        &redis.url(),
        "[transport]\nrequest_timeout = \"50ms\"\n",
    ))
    .await;
    nothing_failed_by_a_deadline_counts_after_a_stall(&mut redis, &server, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_answered_as_failed_in_a_stall_does_not_happen_later() {
    let mut redis = RedisServer::start();
    let server = TestServer::start(long_timeout_config(&redis.url(), "")).await;
    let mut client = server.client().await;
    assert!(matches!(ask(&mut client, "kept", "err").await, Answer::Decided(d) if d.allowed));

    redis.pause();
    let stalled = Instant::now();
    let mut reset = tonic::Request::new(pb::ResetRequest {
        key: "kept".to_owned(),
        policy: Some(pb::reset_request::Policy::PolicyName("err".to_owned())),
    });
    reset.set_timeout(Duration::from_millis(50));
    let answer = tokio::time::timeout(Duration::from_secs(1), client.reset(reset))
        .await
        .expect("answered well within the store's 2 s timeout");
    assert!(answer.is_err(), "the deadline ends the reset: {answer:?}");
    // Resumed before the store's own timeout: a reset bounded by it alone
    // would run now.
    let left = Duration::from_millis(600).saturating_sub(stalled.elapsed());
    tokio::time::sleep(left).await;
    redis.resume();
    let d = peek(&mut client, named("kept", "err", None)).await;
    assert_eq!(
        d.remaining, 9,
        "the reset answered as failed did not happen"
    );
}

/// A call ended by `transport.request_timeout` while Redis is stalled gets
/// its policy's `on_error` (here `fail_open`), never the transport's own
/// `CANCELLED`, and its script is followed to the end: each one is counted
/// as refused once Redis runs it late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_ended_by_the_request_timeout_in_a_stall_all_get_their_on_error() {
    let mut redis = RedisServer::start();
    let server = TestServer::start(long_timeout_config(
        &redis.url(),
        "[transport]\nrequest_timeout = \"50ms\"\n",
    ))
    .await;
    let mut client = server.client().await;
    assert!(matches!(
        ask(&mut client, "warm", "open").await,
        Answer::Decided(_)
    ));
    redis.pause();
    let mut answers = Vec::new();
    for i in 0..60 {
        answers.push(ask(&mut client, &format!("stall-{i}"), "open").await);
    }
    redis.resume();
    let failed_open = answers
        .iter()
        .filter(|a| matches!(a, Answer::Failed(r) if r == "FailOpen"))
        .count();
    assert_eq!(failed_open, 60, "{answers:?}");
    eventually(
        Duration::from_secs(10),
        "every late script is refused",
        || async {
            server
                .metrics()
                .await
                .value("quotad_redis_late_scripts_total", &[("outcome", "refused")])
                == 60.0
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_their_clients_give_up_on_in_a_stall_are_counted_as_cancelled() {
    let mut redis = RedisServer::start();
    let server = TestServer::start(stall_config(&format!("url = {:?}", redis.url()), "5s")).await;
    let mut client = server.client().await;
    assert!(matches!(
        ask(&mut client, "gone", "err").await,
        Answer::Decided(_)
    ));
    redis.pause();
    // No grpc-timeout sent: the client stops waiting on its own and resets
    // each stream, long before quotad's 5 s would answer.
    for _ in 0..3 {
        let call = client.check(named("gone", "err", None));
        assert!(
            tokio::time::timeout(Duration::from_millis(200), call)
                .await
                .is_err(),
            "no answer while Redis is stalled"
        );
    }
    eventually(
        Duration::from_secs(3),
        "three calls counted as cancelled",
        || async {
            server.metrics().await.value(
                "quotad_request_errors_total",
                &[("method", "check"), ("code", "Cancelled")],
            ) == 3.0
        },
    )
    .await;
    redis.resume();
}
