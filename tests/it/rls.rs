//! Envoy's rate limit service (`ShouldRateLimit`) on the memory store:
//! each kind of rule and every field of the answer, the two count modes,
//! and exactness under concurrency. Requests go through a client generated
//! from the vendored Envoy protos, as Envoy's would.

use std::sync::Arc;
use std::time::Duration;

use quotad::Config;
use quotad_core::FakeClock;
use quotad_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use quotad_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use quotad_proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use quotad_proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use quotad_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tempfile::TempDir;
use tonic::transport::Channel;

use crate::common::{NOON_30, TestServer};

pub(crate) type RlsClient = RateLimitServiceClient<Channel>;

/// Envoy's unit numbers.
const SECOND: i32 = 1;
const MINUTE: i32 = 2;
const HOUR: i32 = 3;

/// A folder holding `files` as `(name, YAML)`.
pub(crate) fn rules_dir(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write rules");
    }
    dir
}

/// The TOML of a server serving the rules in `dir`, plus `extra` lines of
/// `[rls]` and then any other tables.
pub(crate) fn rls_toml(dir: &TempDir, extra: &str) -> String {
    format!(
        "[rls]\nconfig_dir = {:?}\n{extra}\n",
        dir.path().display().to_string()
    )
}

/// A server on the memory store serving `dir`, at 12:00:30 on a fake clock.
pub(crate) async fn start(dir: &TempDir, extra: &str) -> (Arc<FakeClock>, TestServer) {
    let clock = Arc::new(FakeClock::new(NOON_30));
    let config = Config::from_toml(&rls_toml(dir, extra))
        .expect("valid config")
        .with_clock(clock.clone());
    (clock, TestServer::start(config).await)
}

pub(crate) async fn rls_client(server: &TestServer) -> RlsClient {
    RateLimitServiceClient::new(server.channel().await)
}

pub(crate) fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

pub(crate) fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

pub(crate) async fn ask(client: &mut RlsClient, request: RateLimitRequest) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .expect("ShouldRateLimit answers")
        .into_inner()
}

pub(crate) fn is_ok(response: &RateLimitResponse) -> bool {
    response.overall_code == Code::Ok as i32
}

/// A limited status, field by field.
fn limited(
    code: Code,
    name: &str,
    rpu: u32,
    unit: i32,
    remaining: u32,
    reset_s: i64,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: name.to_owned(),
            requests_per_unit: rpu,
            unit,
        }),
        limit_remaining: remaining,
        duration_until_reset: Some(prost_types::Duration {
            seconds: reset_s,
            nanos: 0,
        }),
        quota: None,
    }
}

/// The status of a descriptor with no limit.
fn no_limit(remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        limit_remaining: remaining,
        ..DescriptorStatus::default()
    }
}

const EDGE: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_ip}
  - key: path
    value: /health
    rate_limit: {unlimited: true}
  - key: path
    value: "/api/*"
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: plan
    value: free
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: canary
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: canary}
  - key: tokens
    rate_limit: {unit: minute, requests_per_unit: 10}
    metadata:
      quotad: {algorithm: token_bucket, burst: 4}
  - key: per_day
    rate_limit: {unit: day, requests_per_unit: 5, name: daily, replaces: [{name: per_ip}]}
"#;

#[tokio::test]
async fn each_kind_of_rule_answers_with_every_status_field() {
    let dir = rules_dir(&[("edge.yaml", EDGE)]);
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    let all = || {
        request(
            "edge",
            vec![
                descriptor(&[("remote_address", "10.0.0.1")]),
                descriptor(&[("path", "/health")]),
                descriptor(&[("path", "/api/orders")]),
                descriptor(&[("plan", "free"), ("user", "bob")]),
                descriptor(&[("unknown", "x")]),
                descriptor(&[("plan", "free")]),
            ],
        )
    };
    let first = ask(&mut client, all()).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(
        first.statuses,
        vec![
            limited(Code::Ok, "per_ip", 3, MINUTE, 2, 30),
            no_limit(u32::MAX),
            limited(Code::Ok, "", 2, HOUR, 1, 3_570),
            limited(Code::Ok, "", 1, SECOND, 0, 1),
            no_limit(0),
            no_limit(0),
        ]
    );
    assert!(
        first.response_headers_to_add.is_empty(),
        "headers are off by default"
    );

    // Again: the per-second rule is over, so the request is, and (all or
    // nothing) nothing of it was counted.
    let second = ask(&mut client, all()).await;
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    assert_eq!(
        second.statuses[0],
        limited(Code::Ok, "per_ip", 3, MINUTE, 2, 30)
    );
    assert_eq!(second.statuses[2], limited(Code::Ok, "", 2, HOUR, 1, 3_570));
    assert_eq!(
        second.statuses[3],
        limited(Code::OverLimit, "", 1, SECOND, 0, 1)
    );
    let third = ask(
        &mut client,
        request("edge", vec![descriptor(&[("remote_address", "10.0.0.1")])]),
    )
    .await;
    assert_eq!(
        third.statuses[0],
        limited(Code::Ok, "per_ip", 3, MINUTE, 1, 30)
    );

    // Unknown domains: every descriptor OK, with no limit.
    let unknown = ask(
        &mut client,
        request("nowhere", vec![descriptor(&[("remote_address", "1")])]),
    )
    .await;
    assert_eq!(
        (unknown.overall_code, unknown.statuses.clone()),
        (Code::Ok as i32, vec![no_limit(0)])
    );

    let metrics = server.metrics().await;
    let no_limit_count = |reason| metrics.value("quotad_rls_no_limit_total", &[("reason", reason)]);
    assert_eq!(no_limit_count("unknown_domain"), 1.0);
    assert_eq!(no_limit_count("no_match"), 4.0);
    assert_eq!(no_limit_count("unlimited"), 2.0);
    let decisions = |policy, outcome, reason| {
        metrics.value(
            "quotad_decisions_total",
            &[
                ("policy", policy),
                ("algorithm", "fixed_window"),
                ("outcome", outcome),
                ("reason", reason),
            ],
        )
    };
    assert_eq!(
        decisions("rls:edge/remote_address", "allowed", "within_limit"),
        2.0
    );
    assert_eq!(
        decisions("rls:edge/remote_address", "denied", "batch_rejected"),
        1.0
    );
    assert_eq!(
        decisions("rls:edge/plan=free/user", "denied", "limit_exceeded"),
        1.0
    );
}

#[tokio::test]
async fn a_limit_of_zero_is_over_and_counts_nothing_else_of_the_request() {
    let dir = rules_dir(&[("edge.yaml", EDGE)]);
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    let both = request(
        "edge",
        vec![
            descriptor(&[("remote_address", "10.0.0.2")]),
            descriptor(&[("blocked", "yes")]),
        ],
    );
    let response = ask(&mut client, both.clone()).await;
    assert_eq!(response.overall_code, Code::OverLimit as i32);
    assert_eq!(
        response.statuses,
        vec![
            limited(Code::Ok, "per_ip", 3, MINUTE, 3, 30),
            limited(Code::OverLimit, "", 0, MINUTE, 0, 30),
        ]
    );
    let again = ask(&mut client, both).await;
    assert_eq!(again.statuses[0].limit_remaining, 3, "nothing was counted");
}

#[tokio::test]
async fn replaced_rules_are_not_counted_and_shadow_mode_answers_ok_counting_the_denial() {
    let dir = rules_dir(&[("edge.yaml", EDGE)]);
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;

    // per_day replaces per_ip when both match one request.
    let replaced = request(
        "edge",
        vec![
            descriptor(&[("remote_address", "10.0.0.3")]),
            descriptor(&[("per_day", "x")]),
        ],
    );
    let response = ask(&mut client, replaced).await;
    assert_eq!(response.statuses[0], no_limit(0));
    assert_eq!(
        response.statuses[1],
        limited(Code::Ok, "daily", 5, 4, 4, 43_170)
    );

    let canary = || request("edge", vec![descriptor(&[("canary", "c")])]);
    assert!(is_ok(&ask(&mut client, canary()).await));
    let over = ask(&mut client, canary()).await;
    assert!(is_ok(&over), "shadow mode never denies");
    // As the reference: OK, with the limit and nothing remaining.
    assert_eq!(
        over.statuses[0],
        limited(Code::Ok, "canary", 1, MINUTE, 0, 30)
    );
    let metrics = server.metrics().await;
    assert_eq!(
        metrics.value(
            "quotad_rls_shadow_denials_total",
            &[("policy", "rls:edge/canary")]
        ),
        1.0
    );
    assert_eq!(
        metrics.value("quotad_rls_no_limit_total", &[("reason", "replaced")]),
        1.0
    );
}

#[tokio::test]
async fn the_extension_counts_with_a_token_bucket_and_hits_addend_sets_the_cost() {
    let dir = rules_dir(&[("edge.yaml", EDGE)]);
    let (clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    let tokens = |hits: u32| RateLimitRequest {
        hits_addend: hits,
        ..request("edge", vec![descriptor(&[("tokens", "t")])])
    };
    // A burst of 4, refilled at 10 a minute (one every 6 s).
    let first = ask(&mut client, tokens(3)).await;
    assert_eq!(first.statuses[0].limit_remaining, 1);
    let over = ask(&mut client, tokens(2)).await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    // Over: the wait until 2 would pass (one more token: 6 s).
    assert_eq!(
        over.statuses[0],
        limited(Code::OverLimit, "", 10, MINUTE, 0, 6)
    );
    clock.advance(Duration::from_secs(6));
    assert!(is_ok(&ask(&mut client, tokens(2)).await));

    // hits_addend 0 only looks; a descriptor's own hits_addend wins.
    let mut probe = tokens(0);
    probe.descriptors[0].hits_addend = Some(0);
    let looked = ask(&mut client, probe).await;
    assert_eq!(
        (looked.overall_code, looked.statuses[0].limit_remaining),
        (Code::OverLimit as i32, 0)
    );
    let metrics = server.metrics().await;
    let probes = metrics.value(
        "quotad_store_operations_total",
        &[("backend", "memory"), ("op", "peek")],
    );
    assert_eq!(probes, 1.0);
}

#[tokio::test]
async fn a_limit_sent_by_envoy_replaces_the_rules_for_known_domains() {
    let dir = rules_dir(&[("edge.yaml", EDGE)]);
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    let with_limit = |domain: &str, rpu| {
        let mut d = descriptor(&[("remote_address", "10.0.0.4")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: rpu,
            unit: SECOND,
        });
        request(domain, vec![d])
    };
    let first = ask(&mut client, with_limit("edge", 1)).await;
    assert_eq!(first.statuses[0], limited(Code::Ok, "", 1, SECOND, 0, 1));
    // The reference keys a sent limit by descriptor and unit, not by its
    // number: 2 per second shares the count of 1 per second.
    let second = ask(&mut client, with_limit("edge", 2)).await;
    assert_eq!(second.statuses[0], limited(Code::Ok, "", 2, SECOND, 0, 1));
    let unknown = ask(&mut client, with_limit("nowhere", 1)).await;
    assert_eq!(unknown.statuses[0], no_limit(0));
}

/// A descriptor with a `limit` sent for `remote_address` 10.0.0.6.
fn sent_limit(requests_per_unit: u32, unit: i32) -> RateLimitDescriptor {
    let mut d = descriptor(&[("remote_address", "10.0.0.6")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit,
        unit,
    });
    d
}

#[tokio::test]
async fn a_limit_sent_by_envoy_is_bounded_as_an_inline_policy_and_refused_whole() {
    const DAY: i32 = 4;
    const WEEK: i32 = 7;
    const YEAR: i32 = 6;
    let dir = rules_dir(&[("edge.yaml", EDGE)]);
    let plain = || descriptor(&[("remote_address", "10.0.0.6")]);
    let refused = |status: tonic::Status, code, field: &str, setting: &str| {
        assert_eq!(status.code(), code, "{}", status.message());
        assert!(status.message().starts_with(field), "{}", status.message());
        assert!(status.message().contains(setting), "{}", status.message());
    };

    // Off: every sent limit is refused, known domain or not, and the
    // request's other descriptors count nothing.
    let (_clock, server) = start(&dir, "[limits]\nallow_inline_policies = false").await;
    let mut client = rls_client(&server).await;
    for domain in ["edge", "nowhere"] {
        let status = client
            .should_rate_limit(request(domain, vec![plain(), sent_limit(1, DAY)]))
            .await
            .expect_err("refused");
        refused(
            status,
            tonic::Code::FailedPrecondition,
            "descriptors[1].limit: ",
            "limits.allow_inline_policies",
        );
    }
    let answer = ask(&mut client, request("edge", vec![plain()])).await;
    assert_eq!(answer.statuses[0].limit_remaining, 2, "nothing was counted");

    // On, with the default bounds: a day at most, a limit of 1,000,000.
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    let cases = [
        (
            sent_limit(5, WEEK),
            "descriptors[1].limit.unit: ",
            "limits.max_inline_window",
        ),
        (
            sent_limit(1_000_001, DAY),
            "descriptors[1].limit.requests_per_unit: ",
            "limits.max_inline_limit",
        ),
    ];
    for (sent, field, setting) in cases {
        let status = client
            .should_rate_limit(request("edge", vec![plain(), sent]))
            .await
            .expect_err("refused");
        refused(status, tonic::Code::InvalidArgument, field, setting);
    }
    let answer = ask(&mut client, request("edge", vec![plain()])).await;
    assert_eq!(answer.statuses[0].limit_remaining, 2, "nothing was counted");
    let day = ask(
        &mut client,
        request("edge", vec![sent_limit(1_000_000, DAY)]),
    )
    .await;
    assert_eq!(day.statuses[0].limit_remaining, 999_999);

    // Raised: a year is taken, as the reference takes it.
    let (_clock, server) = start(&dir, "[limits]\nmax_inline_window = \"365d\"").await;
    let mut client = rls_client(&server).await;
    let year = ask(&mut client, request("edge", vec![sent_limit(3, YEAR)])).await;
    assert_eq!(year.statuses[0].limit_remaining, 2);
}

#[tokio::test]
async fn bad_requests_are_refused_naming_the_field_and_count_nothing() {
    let dir = rules_dir(&[("edge.yaml", EDGE)]);
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    let mut bad_unit = descriptor(&[("remote_address", "10.0.0.5")]);
    bad_unit.limit = Some(RateLimitOverride {
        requests_per_unit: 5,
        unit: 0,
    });
    let cases = [
        (request("", vec![descriptor(&[("a", "b")])]), "domain: "),
        (request("edge", vec![]), "descriptors: "),
        (
            request(
                "edge",
                vec![descriptor(&[("remote_address", "10.0.0.5")]), bad_unit],
            ),
            "descriptors[1].limit.unit: ",
        ),
        (
            request("edge", vec![descriptor(&[("a", "b")]); 1_001]),
            "descriptors: must hold at most 1000",
        ),
    ];
    for (bad, field) in cases {
        let status = client.should_rate_limit(bad).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().starts_with(field), "{}", status.message());
    }
    let ip = request("edge", vec![descriptor(&[("remote_address", "10.0.0.5")])]);
    assert_eq!(
        ask(&mut client, ip).await.statuses[0].limit_remaining,
        2,
        "nothing was counted before"
    );
}

#[tokio::test]
async fn descriptor_values_longer_than_max_key_bytes_are_counted_under_a_digest() {
    let dir = rules_dir(&[(
        "edge.yaml",
        "domain: files\ndescriptors:\n  - key: path\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    )]);
    let (_clock, server) = start(&dir, "\n[store]\nmax_key_bytes = 32").await;
    let mut client = rls_client(&server).await;
    let long = |tail: &str| {
        request(
            "files",
            vec![descriptor(&[(
                "path",
                &format!("/{}{tail}", "a".repeat(300)),
            )])],
        )
    };
    assert_eq!(
        ask(&mut client, long("x")).await.statuses[0].limit_remaining,
        1
    );
    assert_eq!(
        ask(&mut client, long("x")).await.statuses[0].limit_remaining,
        0
    );
    assert_eq!(
        ask(&mut client, long("x")).await.overall_code,
        Code::OverLimit as i32
    );
    // Another long value has a budget of its own.
    assert_eq!(
        ask(&mut client, long("y")).await.statuses[0].limit_remaining,
        1
    );
}

#[tokio::test]
async fn response_headers_follow_the_descriptor_closest_to_its_limit() {
    let dir = rules_dir(&[("edge.yaml", EDGE)]);
    let (_clock, server) = start(
        &dir,
        "response_headers = [\"reference\", \"draft\"]\nreset_header = \"X-Reset\"",
    )
    .await;
    let mut client = rls_client(&server).await;
    let two = request(
        "edge",
        vec![
            descriptor(&[("remote_address", "10.0.0.6")]),
            descriptor(&[("path", "/api/a")]),
        ],
    );
    let response = ask(&mut client, two).await;
    let headers: Vec<(&str, &str)> = response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    // The hourly /api/* rule has 1 left, per_ip 2: the hourly one is shown.
    assert_eq!(
        headers,
        [
            ("RateLimit-Limit", "2"),
            ("RateLimit-Remaining", "1"),
            ("X-Reset", "3570"),
            ("RateLimit-Policy", "\"default\";q=2;w=3600"),
            ("RateLimit", "\"default\";r=1;t=3570"),
        ]
    );
    let none = ask(
        &mut client,
        request("edge", vec![descriptor(&[("path", "/health")])]),
    )
    .await;
    assert!(
        none.response_headers_to_add.is_empty(),
        "no limit, no headers"
    );
}

#[tokio::test]
async fn quota_mode_and_server_shadow_mode_turn_the_overall_code_as_the_reference() {
    let quota = "domain: q\ndescriptors:\n  - key: a\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: b\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let dir = rules_dir(&[("q.yaml", quota)]);
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    let both = || {
        request(
            "q",
            vec![descriptor(&[("a", "1")]), descriptor(&[("b", "1")])],
        )
    };
    assert!(is_ok(&ask(&mut client, both()).await));
    // a is over, b is not: a soft limit does not deny alone.
    let one_over = ask(&mut client, both()).await;
    assert!(is_ok(&one_over));
    assert_eq!(one_over.statuses[0].code, Code::OverLimit as i32);
    let only_a = ask(&mut client, request("q", vec![descriptor(&[("a", "1")])])).await;
    assert_eq!(
        only_a.overall_code,
        Code::OverLimit as i32,
        "every quota descriptor is over"
    );

    let dir = rules_dir(&[("edge.yaml", EDGE)]);
    let (_clock, shadow) = start(&dir, "shadow_mode = true").await;
    let mut client = rls_client(&shadow).await;
    let user = || request("edge", vec![descriptor(&[("plan", "free"), ("user", "u")])]);
    assert!(is_ok(&ask(&mut client, user()).await));
    let over = ask(&mut client, user()).await;
    assert!(is_ok(&over));
    assert_eq!(
        over.statuses[0].code,
        Code::OverLimit as i32,
        "the status still says so"
    );
    let metrics = shadow.metrics().await;
    assert_eq!(
        metrics.value(
            "quotad_rls_shadow_denials_total",
            &[("policy", "rls:edge/plan=free/user")]
        ),
        1.0
    );
}

/// Three descriptors of one request, the third over its limit.
fn three(limit_c: &str) -> (TempDir, RateLimitRequest) {
    let text = format!(
        "domain: app\ndescriptors:\n  - key: a\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\n  - key: b\n    rate_limit: {{unit: minute, requests_per_unit: 5}}\n  - key: c\n    rate_limit: {{unit: minute, requests_per_unit: {limit_c}}}\n"
    );
    let request = request(
        "app",
        vec![
            descriptor(&[("a", "1")]),
            descriptor(&[("b", "1")]),
            descriptor(&[("c", "1")]),
        ],
    );
    (rules_dir(&[("app.yaml", &text)]), request)
}

async fn remaining(client: &mut RlsClient, key: &str) -> u32 {
    let mut probe = request("app", vec![descriptor(&[(key, "1")])]);
    probe.descriptors[0].hits_addend = Some(0);
    ask(client, probe).await.statuses[0].limit_remaining
}

#[tokio::test]
async fn one_descriptor_over_counts_nothing_of_the_request_by_default() {
    let (dir, req) = three("1");
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    assert!(is_ok(&ask(&mut client, req.clone()).await));
    for _ in 0..3 {
        let response = ask(&mut client, req.clone()).await;
        assert_eq!(response.overall_code, Code::OverLimit as i32);
        // The others fitted and say so, with their budget as it stands.
        assert_eq!(
            response.statuses[0],
            limited(Code::Ok, "", 5, MINUTE, 4, 30)
        );
        assert_eq!(
            response.statuses[2],
            limited(Code::OverLimit, "", 1, MINUTE, 0, 30)
        );
    }
    assert_eq!(
        (
            remaining(&mut client, "a").await,
            remaining(&mut client, "b").await
        ),
        (4, 4)
    );
}

#[tokio::test]
async fn the_reference_count_mode_counts_every_descriptor_and_denied_hits() {
    let (dir, req) = three("1");
    let (_clock, server) = start(&dir, "count_mode = \"reference\"").await;
    let mut client = rls_client(&server).await;
    assert!(is_ok(&ask(&mut client, req.clone()).await));
    for _ in 0..3 {
        assert_eq!(
            ask(&mut client, req.clone()).await.overall_code,
            Code::OverLimit as i32
        );
    }
    // a and b counted every time, as the reference counts them.
    assert_eq!(
        (
            remaining(&mut client, "a").await,
            remaining(&mut client, "b").await
        ),
        (1, 1)
    );

    // A denied hit is counted too: 4 hits on a budget of 5 with 3 left
    // are over, and spend the 3, so one more is over as well.
    let mut big = request("app", vec![descriptor(&[("a", "2")])]);
    big.hits_addend = 2;
    assert!(is_ok(&ask(&mut client, big.clone()).await));
    big.hits_addend = 4;
    assert_eq!(
        ask(&mut client, big.clone()).await.overall_code,
        Code::OverLimit as i32
    );
    big.hits_addend = 1;
    assert_eq!(
        ask(&mut client, big).await.overall_code,
        Code::OverLimit as i32
    );
}

/// `n` concurrent requests on one descriptor over `clients`, and how many
/// were answered OK.
pub(crate) async fn concurrent_oks(
    clients: &[RlsClient],
    domain: &str,
    key: &str,
    n: usize,
) -> usize {
    let calls: Vec<_> = (0..n)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let req = request(domain, vec![descriptor(&[("user", key)])]);
            tokio::spawn(async move { ask(&mut client, req).await })
        })
        .collect();
    let mut oks = 0;
    for call in calls {
        oks += usize::from(is_ok(&call.await.expect("no panic")));
    }
    oks
}

pub(crate) const FIFTY_A_DAY: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 50}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_requests_on_a_limit_of_fifty_get_exactly_fifty_oks() {
    let dir = rules_dir(&[("api.yaml", FIFTY_A_DAY)]);
    let (_clock, server) = start(&dir, "").await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(rls_client(&server).await);
    }
    for run in 0..5 {
        let oks = concurrent_oks(&clients, "api", &format!("user-{run}"), 200).await;
        assert_eq!(oks, 50, "run {run}");
    }
}

#[tokio::test]
async fn health_and_reflection_list_the_rate_limit_service() {
    let dir = rules_dir(&[("api.yaml", FIFTY_A_DAY)]);
    let (_clock, server) = start(&dir, "").await;
    let name = "envoy.service.ratelimit.v3.RateLimitService";
    let status = crate::common::health_status(&server, name).await;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let services = crate::decisions::reflection_v1(&server).await;
    assert!(services.contains(&name.to_owned()), "{services:?}");
}
