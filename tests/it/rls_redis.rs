//! Envoy's rate limit service on Redis: several quotad replicas share one
//! budget, the reference count mode spends denied hits, and a Redis
//! Cluster decides the descriptors of a request one by one.

use quotad::Config;
use quotad_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tempfile::TempDir;

use crate::common::TestServer;
use crate::common::redis::{RedisCluster, RedisServer};
use crate::rls::{
    FIFTY_A_DAY, RlsClient, ask, concurrent_oks, descriptor, is_ok, request, rls_client, rls_toml,
    rules_dir,
};

/// A server with one rules file holding `rules`, the `[rls]` settings
/// `rls` and the `[store]` lines `store`, on the Redis that the
/// `[store.redis]` lines `redis` name; a client of it, and the rules folder
/// (kept as long as the server).
async fn serve(
    rules: &str,
    rls: &str,
    store: &str,
    redis: &str,
) -> (TestServer, RlsClient, TempDir) {
    let dir = rules_dir(&[("rules.yaml", rules)]);
    let toml = format!(
        "{}\n[store]\nbackend = \"redis\"\n{store}\n\n[store.redis]\n{redis}\ntimeout = \"2s\"\n",
        rls_toml(&dir, rls)
    );
    let server = TestServer::start(Config::from_toml(&toml).expect("valid config")).await;
    let client = rls_client(&server).await;
    (server, client, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_one_redis_give_exactly_fifty_oks_of_two_hundred() {
    let redis = RedisServer::start();
    let target = format!("url = {:?}", redis.url());
    let (mut servers, mut clients) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let (server, client, dir) = serve(FIFTY_A_DAY, "", "", &target).await;
        servers.push((server, dir));
        clients.push(client);
    }
    for run in 0..3 {
        let key = format!("user-{run}-{}", std::process::id());
        assert_eq!(
            concurrent_oks(&clients, "api", &key, 200).await,
            50,
            "run {run}"
        );
    }
}

const APP: &str = "domain: app\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 5}\n  - key: c\n    rate_limit: {unit: day, requests_per_unit: 1}\n";

#[tokio::test]
async fn the_reference_count_mode_spends_denied_hits_on_redis_too() {
    let redis = RedisServer::start();
    let (_server, mut client, _dir) = serve(
        APP,
        "count_mode = \"reference\"",
        "",
        &format!("url = {:?}", redis.url()),
    )
    .await;
    let key = format!("k-{}", std::process::id());
    let mut hits = request("app", vec![descriptor(&[("a", &key)])]);
    hits.hits_addend = 2;
    assert!(is_ok(&ask(&mut client, hits.clone()).await));
    // 4 do not fit in the 3 left: denied, and the 3 are spent.
    hits.hits_addend = 4;
    assert_eq!(
        ask(&mut client, hits.clone()).await.overall_code,
        Code::OverLimit as i32
    );
    hits.hits_addend = 1;
    assert_eq!(
        ask(&mut client, hits).await.overall_code,
        Code::OverLimit as i32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_decides_the_descriptors_of_a_request_one_by_one() {
    let cluster = RedisCluster::start();
    let target = format!("cluster_nodes = {:?}", cluster.urls());
    let (_server, mut client, _dir) = serve(APP, "", "", &target).await;
    let key = format!("k-{}", std::process::id());
    // Keys in different slots: no CROSSSLOT refusal, each decided alone.
    let both = request(
        "app",
        vec![descriptor(&[("a", &key)]), descriptor(&[("c", &key)])],
    );
    assert!(is_ok(&ask(&mut client, both.clone()).await));
    let over = ask(&mut client, both).await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    // a was counted although c was over (the documented consequence).
    assert_eq!(over.statuses[0].limit_remaining, 3);
}

/// What each of three servers on one Redis, with `store.on_error` set to
/// `fail_open`, `fail_closed` and `error`, answers one request: its
/// overall code, or the gRPC code of its failure.
async fn answers(clients: &mut [RlsClient], key: &str) -> Vec<Result<i32, tonic::Code>> {
    let mut out = Vec::new();
    for (i, client) in clients.iter_mut().enumerate() {
        // A key per server: they share one Redis.
        let key = format!("{key}-{i}");
        let req = request(
            "app",
            vec![descriptor(&[("a", &key)]), descriptor(&[("c", &key)])],
        );
        let answer = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            client.should_rate_limit(req),
        )
        .await
        .expect("an answer within 5 s: quotad does not hang on a dead Redis");
        out.push(
            answer
                .map(|r| r.into_inner().overall_code)
                .map_err(|s| s.code()),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_answers_as_store_on_error_says() {
    let mut redis = RedisServer::start();
    let target = format!("url = {:?}", redis.url());
    let (mut servers, mut clients) = (Vec::new(), Vec::new());
    for on_error in ["fail_open", "fail_closed", "error"] {
        let store = format!("on_error = \"{on_error}\"");
        let headers = "response_headers = [\"reference\"]";
        let (server, client, dir) = serve(APP, headers, &store, &target).await;
        servers.push((server, dir));
        clients.push(client);
    }
    let ok = Ok(Code::Ok as i32);
    let key = format!("up-{}", std::process::id());
    assert_eq!(answers(&mut clients, &key).await, [ok, ok, ok]);

    redis.stop();
    for run in 0..2 {
        let key = format!("down-{run}-{}", std::process::id());
        assert_eq!(
            answers(&mut clients, &key).await,
            [
                ok,
                Ok(Code::OverLimit as i32),
                Err(tonic::Code::Unavailable)
            ]
        );
    }
    // Failed open, the store said nothing: no header claims 0 remaining.
    let down = request("app", vec![descriptor(&[("a", "down-headers")])]);
    let open = ask(&mut clients[0], down).await;
    assert!(is_ok(&open));
    assert!(
        open.response_headers_to_add.is_empty(),
        "{:?}",
        open.response_headers_to_add
    );
}

#[tokio::test]
async fn a_standalone_redis_counts_nothing_of_a_request_with_one_descriptor_over() {
    let redis = RedisServer::start();
    let (_server, mut client, _dir) = serve(APP, "", "", &format!("url = {:?}", redis.url())).await;
    let key = format!("k-{}", std::process::id());
    let both = request(
        "app",
        vec![descriptor(&[("a", &key)]), descriptor(&[("c", &key)])],
    );
    assert!(is_ok(&ask(&mut client, both.clone()).await));
    for _ in 0..3 {
        let over = ask(&mut client, both.clone()).await;
        assert_eq!(over.overall_code, Code::OverLimit as i32);
        // a fitted, and was not counted: one all-or-nothing script.
        assert_eq!(over.statuses[0].code, Code::Ok as i32);
        assert_eq!(over.statuses[0].limit_remaining, 4);
    }
}

const WITH_SHADOW: &str = "domain: app\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 5}\n  - key: s\n    shadow_mode: true\n    rate_limit: {unit: day, requests_per_unit: 5}\n";

#[tokio::test]
async fn a_store_failure_on_a_shadow_descriptor_fails_nothing_else_of_the_request() {
    let redis = RedisServer::start();
    let (server, mut client, _dir) = serve(
        WITH_SHADOW,
        "response_headers = [\"reference\"]",
        "",
        &format!("url = {:?}", redis.url()),
    )
    .await;
    let key = format!("k-{}", std::process::id());
    // s alone first, so that its key is the only one in Redis.
    assert!(is_ok(
        &ask(
            &mut client,
            request("app", vec![descriptor(&[("s", &key)])])
        )
        .await
    ));
    let stored = redis.cli(&["--scan"]);
    let s_key = stored.lines().next().expect("s's key").to_owned();
    redis.cli(&["del", &s_key]);
    redis.cli(&["lpush", &s_key, "not a counter"]);

    let both = request(
        "app",
        vec![descriptor(&[("a", &key)]), descriptor(&[("s", &key)])],
    );
    for n in 1..=2 {
        let response = ask(&mut client, both.clone()).await;
        assert!(
            is_ok(&response),
            "request {n}: s's state is corrupt, a's is not"
        );
        assert_eq!(response.statuses[0].limit_remaining, 5 - n);
        // s could not be decided: UNKNOWN, and no shadow denial counted.
        assert_eq!(response.statuses[1].code, Code::Unknown as i32);
        // The headers show a's count, not s's unknown remaining 0.
        let remaining = response
            .response_headers_to_add
            .iter()
            .find(|h| h.key == "RateLimit-Remaining")
            .map(|h| h.value.clone());
        assert_eq!(remaining, Some((5 - n).to_string()), "request {n}");
    }
    let metrics = server.metrics().await;
    assert_eq!(
        metrics.value(
            "quotad_rls_shadow_denials_total",
            &[("policy", "rls:app/s")]
        ),
        0.0
    );
}

const MIXED: &str = "domain: m\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 5}\n  - key: b\n    rate_limit: {unit: day, requests_per_unit: 5}\n  - key: z\n    rate_limit: {unit: day, requests_per_unit: 0}\n  - key: s\n    shadow_mode: true\n    rate_limit: {unit: day, requests_per_unit: 5}\n  - key: q1\n    quota_mode: true\n    rate_limit: {unit: day, requests_per_unit: 5}\n  - key: q2\n    quota_mode: true\n    rate_limit: {unit: day, requests_per_unit: 5}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_store_down_a_request_fails_only_when_its_answer_depends_on_the_store() {
    let mut redis = RedisServer::start();
    let target = format!("url = {:?}", redis.url());
    let (server, mut client, _dir) = serve(MIXED, "", "on_error = \"error\"", &target).await;
    server.readyz_turns(200).await;
    redis.stop();
    // Keys written `?k` are probes.
    let call = |keys: &[&str]| {
        let descriptors = keys
            .iter()
            .map(|k| {
                let probe = k.strip_prefix('?');
                let mut d = descriptor(&[(probe.unwrap_or(k), "1")]);
                if probe.is_some() {
                    d.hits_addend = Some(0);
                }
                d
            })
            .collect();
        request("m", descriptors)
    };
    let mut answer = async |keys: &[&str]| {
        client
            .should_rate_limit(call(keys))
            .await
            .map(|r| Code::try_from(r.into_inner().overall_code).expect("a code"))
            .map_err(|s| s.code())
    };
    let unavailable = Err(tonic::Code::Unavailable);
    // The answer rests on the store: the call fails, and Envoy's
    // failure_mode_deny decides.
    assert_eq!(answer(&["a"]).await, unavailable);
    assert_eq!(answer(&["a", "b"]).await, unavailable);
    assert_eq!(answer(&["q1", "q2"]).await, unavailable);
    assert_eq!(answer(&["a", "?b"]).await, unavailable);
    // It does not: a limit of 0 denies whatever the store says, and
    // shadow-mode descriptors, probes included, never change the answer.
    assert_eq!(answer(&["a", "z"]).await, Ok(Code::OverLimit));
    assert_eq!(answer(&["?a", "z"]).await, Ok(Code::OverLimit));
    assert_eq!(answer(&["s"]).await, Ok(Code::Ok));
    assert_eq!(answer(&["?s", "nomatch"]).await, Ok(Code::Ok));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_look_failed_open_in_a_denied_request_is_counted_as_failed_open() {
    let mut redis = RedisServer::start();
    let target = format!("url = {:?}", redis.url());
    let (server, mut client, _dir) = serve(MIXED, "", "on_error = \"fail_open\"", &target).await;
    server.readyz_turns(200).await;
    redis.stop();
    // z (a limit of 0) denies; s, shadow mode, is only looked at.
    let denied = request(
        "m",
        vec![descriptor(&[("z", "1")]), descriptor(&[("s", "1")])],
    );
    let answer = ask(&mut client, denied).await;
    assert_eq!(answer.overall_code, Code::OverLimit as i32);
    assert_eq!(answer.statuses[1].code, Code::Ok as i32);
    let metrics = server.metrics().await;
    let of_s: Vec<(&str, &str, f64)> = metrics
        .series("quotad_decisions_total")
        .into_iter()
        .filter(|(labels, _)| labels["policy"] == "rls:m/s")
        .map(|(labels, n)| (labels["outcome"].as_str(), labels["reason"].as_str(), n))
        .collect();
    assert_eq!(of_s, [("allowed", "fail_open", 1.0)]);
}

/// A call that fails after some of its descriptors were counted (decided
/// one by one: here the reference's counting) still records the decisions
/// the store made.
#[tokio::test]
async fn a_failed_call_still_records_the_decisions_the_store_made() {
    let redis = RedisServer::start();
    let url = format!("url = {:?}", redis.url());
    let (server, mut client, _dir) = serve(APP, "count_mode = \"reference\"", "", &url).await;
    // c's state, then garbage in its place.
    assert!(is_ok(
        &ask(&mut client, request("app", vec![descriptor(&[("c", "x")])])).await
    ));
    let stored = redis.cli(&["--scan", "--pattern", "*rls:app/c*"]);
    let c_key = stored.trim();
    redis.cli(&["del", c_key]);
    redis.cli(&["lpush", c_key, "not a counter"]);

    let both = request(
        "app",
        vec![descriptor(&[("a", "x")]), descriptor(&[("c", "x")])],
    );
    let status = client
        .should_rate_limit(both)
        .await
        .expect_err("c is unreadable");
    assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    let metrics = server.metrics().await;
    let of_a: Vec<(&str, &str, f64)> = metrics
        .series("quotad_decisions_total")
        .into_iter()
        .filter(|(labels, _)| labels["policy"] == "rls:app/a")
        .map(|(labels, n)| (labels["outcome"].as_str(), labels["reason"].as_str(), n))
        .collect();
    assert_eq!(of_a, [("allowed", "within_limit", 1.0)], "a was counted");
    let remaining = ask(&mut client, request("app", vec![descriptor(&[("a", "x")])])).await;
    assert_eq!(
        remaining.statuses[0].limit_remaining, 3,
        "a holds the failed call's hit"
    );
}

const FIVE: &str = "domain: app\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: c\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: d\n    rate_limit: {unit: day, requests_per_unit: 1}\n  - key: e\n    rate_limit: {unit: day, requests_per_unit: 1}\n";

/// A request with more descriptors than one Redis script may hold
/// (`store.redis.max_atomic_items`) is counted descriptor by descriptor, as
/// on a Cluster, instead of failing: Envoy lets a failed call through.
#[tokio::test]
async fn a_request_past_max_atomic_items_is_counted_one_by_one_not_failed() {
    let redis = RedisServer::start();
    let target = format!("url = {:?}\nmax_atomic_items = 4", redis.url());
    let (_server, mut client, _dir) = serve(FIVE, "", "", &target).await;
    let key = format!("k-{}", std::process::id());
    let all = request(
        "app",
        ["a", "b", "c", "d", "e"]
            .iter()
            .map(|d| descriptor(&[(d, &key)]))
            .collect(),
    );
    assert!(is_ok(&ask(&mut client, all.clone()).await));
    let over = ask(&mut client, all).await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    // Two descriptors fit one script: still all or nothing.
    let two = |k: &str| {
        request(
            "app",
            vec![descriptor(&[("a", k)]), descriptor(&[("b", k)])],
        )
    };
    let fresh = format!("f-{}", std::process::id());
    let mut one_over = request("app", vec![descriptor(&[("a", &fresh)])]);
    one_over.hits_addend = 1;
    assert!(is_ok(&ask(&mut client, one_over).await));
    let refused = ask(&mut client, two(&fresh)).await;
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    assert_eq!(refused.statuses[1].limit_remaining, 1, "b not counted");
}

/// The scripts Redis has run (EVALSHA and EVAL calls), from its own count.
fn script_calls(redis: &RedisServer) -> u64 {
    let stats = redis.cli(&["info", "commandstats"]);
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .map(|l| {
            let calls = l.split_once("calls=").expect("calls=").1;
            let calls = calls.split(',').next().expect("a number");
            calls.parse::<u64>().expect("a count")
        })
        .sum()
}

/// Each status's code and remaining, in order.
fn each_status(
    response: &quotad_proto::envoy::service::ratelimit::v3::RateLimitResponse,
) -> Vec<(i32, u32)> {
    response
        .statuses
        .iter()
        .map(|s| (s.code, s.limit_remaining))
        .collect()
}

#[tokio::test]
async fn many_probes_or_denied_hits_in_one_request_cost_a_few_scripts_not_one_each() {
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let redis = RedisServer::start();
    let url = format!("url = {:?}", redis.url());
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    let (_server, mut client, _dir) = serve(APP, "", "", &url).await;
    // Key i has spent 1 + i % 5 of its 5: 4 - i % 5 left.
    let spend = request(
        "app",
        keys.iter()
            .enumerate()
            .map(|(i, k)| {
                let mut d = descriptor(&[("a", k)]);
                d.hits_addend = Some(1 + i as u64 % 5);
                d
            })
            .collect(),
    );
    assert!(is_ok(&ask(&mut client, spend).await));
    let left = |i: usize| 4 - (i % 5) as u32;

    // 200 probes, and k7 twice: looked at in scripts of 64 (4), not one
    // call each, every answer its own key's.
    let mut probed: Vec<usize> = (0..200).collect();
    probed.push(7);
    let probes = request(
        "app",
        probed
            .iter()
            .map(|&i| {
                let mut d = descriptor(&[("a", &keys[i])]);
                d.hits_addend = Some(0);
                d
            })
            .collect(),
    );
    let before = script_calls(&redis);
    let looked = ask(&mut client, probes).await;
    assert_eq!(script_calls(&redis) - before, 4, "201 probes in 4 scripts");
    // A probe asks whether one more hit fits; where none is left it is over.
    let probed_with = |left: u32| if left > 0 { (ok, left) } else { (over, 0) };
    let expected: Vec<(i32, u32)> = probed.iter().map(|&i| probed_with(left(i))).collect();
    assert_eq!(each_status(&looked), expected);

    // The reference's counting on the first 100 keys: even ones take 1 hit,
    // odd ones 6 (never fit). The 40 odd ones with budget left spend it by
    // second checks, all in one script after the 2 that decide.
    let (_server, mut client, _dir) = serve(APP, "count_mode = \"reference\"", "", &url).await;
    let hits = |i: usize| if i.is_multiple_of(2) { 1 } else { 6 };
    let counted = request(
        "app",
        (0..100)
            .map(|i| {
                let mut d = descriptor(&[("a", &keys[i])]);
                d.hits_addend = Some(hits(i));
                d
            })
            .collect(),
    );
    let before = script_calls(&redis);
    let answer = ask(&mut client, counted).await;
    assert_eq!(
        script_calls(&redis) - before,
        3,
        "2 scripts to decide, 1 to spend"
    );
    let after = |i: usize| {
        if hits(i) <= u64::from(left(i)) {
            left(i) - 1
        } else {
            0
        }
    };
    let expected: Vec<(i32, u32)> = (0..100)
        .map(|i| {
            (
                if hits(i) <= u64::from(left(i)) {
                    ok
                } else {
                    over
                },
                after(i),
            )
        })
        .collect();
    assert_eq!(each_status(&answer), expected);
    // What the store holds now: each key as answered.
    let probes = request(
        "app",
        (0..100)
            .map(|i| {
                let mut d = descriptor(&[("a", &keys[i])]);
                d.hits_addend = Some(0);
                d
            })
            .collect(),
    );
    let looked = ask(&mut client, probes).await;
    let expected: Vec<(i32, u32)> = (0..100).map(|i| probed_with(after(i))).collect();
    assert_eq!(each_status(&looked), expected);
}
