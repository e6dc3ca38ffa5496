//! All or nothing, the default count mode, where a request's descriptors
//! disagree: a request that does not go through counts nothing, whatever
//! kind of descriptor denied it (an enforced limit, an enforced
//! `hits_addend: 0` probe, every quota-mode descriptor), and one that goes
//! through counts every descriptor that fitted (shadow mode included).

use quotad_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::rls::{RlsClient, ask, descriptor, is_ok, request, rls_client, rules_dir, start};

/// Rules of domain `d`: each `(key, per minute, mode)`, mode one of
/// `""`, `"quota_mode"` and `"shadow_mode"`.
fn rules(limits: &[(&str, u32, &str)]) -> String {
    let mut text = String::from("domain: d\ndescriptors:\n");
    for (key, limit, mode) in limits {
        text.push_str(&format!("  - key: {key}\n"));
        if !mode.is_empty() {
            text.push_str(&format!("    {mode}: true\n"));
        }
        text.push_str(&format!(
            "    rate_limit: {{unit: minute, requests_per_unit: {limit}}}\n"
        ));
    }
    text
}

/// A request of one hit on each of `keys`; a key written `?k` is a probe
/// (`hits_addend: 0`).
fn hits(keys: &[&str]) -> quotad_proto::envoy::service::ratelimit::v3::RateLimitRequest {
    let descriptors = keys
        .iter()
        .map(|key| {
            let probe = key.strip_prefix('?');
            let mut d = descriptor(&[(probe.unwrap_or(key), "1")]);
            if probe.is_some() {
                d.hits_addend = Some(0);
            }
            d
        })
        .collect();
    request("d", descriptors)
}

/// What is left of `key`'s budget, looked at with a probe.
async fn left(client: &mut RlsClient, key: &str) -> u32 {
    let probe = format!("?{key}");
    ask(client, hits(&[&probe])).await.statuses[0].limit_remaining
}

fn code(response: &quotad_proto::envoy::service::ratelimit::v3::RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).expect("a known code")
}

#[tokio::test]
async fn an_enforced_probe_over_its_limit_denies_before_anything_is_counted() {
    let dir = rules_dir(&[(
        "d.yaml",
        &rules(&[("a", 5, ""), ("b", 5, ""), ("p", 1, "")]),
    )]);
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    // With p's budget whole the probe fits, and a and b count.
    assert!(is_ok(&ask(&mut client, hits(&["a", "b", "?p"])).await));
    assert_eq!(
        (left(&mut client, "a").await, left(&mut client, "b").await),
        (4, 4)
    );
    assert!(is_ok(&ask(&mut client, hits(&["p"])).await));
    for _ in 0..3 {
        let response = ask(&mut client, hits(&["a", "b", "?p"])).await;
        assert_eq!(code(&response), Code::OverLimit);
        assert_eq!(response.statuses[2].code, Code::OverLimit as i32);
        // a and b fitted and say so, with their budget as it stands.
        assert_eq!(response.statuses[0].code, Code::Ok as i32);
        assert_eq!(response.statuses[0].limit_remaining, 4);
    }
    assert_eq!(
        (left(&mut client, "a").await, left(&mut client, "b").await),
        (4, 4)
    );
}

#[tokio::test]
async fn a_request_denied_by_its_quota_mode_descriptors_counts_nothing() {
    let limits = [
        ("a", 5, ""),
        ("q1", 1, "quota_mode"),
        ("q2", 2, "quota_mode"),
    ];
    let dir = rules_dir(&[("d.yaml", &rules(&limits))]);
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    let all = || hits(&["a", "q1", "q2"]);
    // Both quotas fit: everything counts.
    assert!(is_ok(&ask(&mut client, all()).await));
    assert_eq!(left(&mut client, "a").await, 4);
    // q1 is over, q2 fits: the request goes through, counting a and q2.
    let one_fits = ask(&mut client, all()).await;
    assert!(is_ok(&one_fits));
    assert_eq!(one_fits.statuses[1].code, Code::OverLimit as i32);
    assert_eq!(one_fits.statuses[2].code, Code::Ok as i32);
    assert_eq!(left(&mut client, "a").await, 3);
    assert_eq!(left(&mut client, "q2").await, 0);
    // Both over: denied, and a is not counted.
    for _ in 0..3 {
        let denied = ask(&mut client, all()).await;
        assert_eq!(code(&denied), Code::OverLimit);
        assert_eq!(denied.statuses[0].code, Code::Ok as i32);
        assert_eq!(denied.statuses[0].limit_remaining, 3);
    }
    assert_eq!(left(&mut client, "a").await, 3);
}

#[tokio::test]
async fn a_request_denied_by_an_enforced_limit_spends_no_quota_or_shadow_budget() {
    let limits = [
        ("a", 1, ""),
        ("q", 5, "quota_mode"),
        ("s", 5, "shadow_mode"),
    ];
    let dir = rules_dir(&[("d.yaml", &rules(&limits))]);
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    let all = || hits(&["a", "q", "s"]);
    assert!(is_ok(&ask(&mut client, all()).await));
    for _ in 0..3 {
        let denied = ask(&mut client, all()).await;
        assert_eq!(code(&denied), Code::OverLimit);
        assert_eq!(denied.statuses[1].limit_remaining, 4);
        assert_eq!(denied.statuses[2].limit_remaining, 4);
    }
    assert_eq!(
        (left(&mut client, "q").await, left(&mut client, "s").await),
        (4, 4)
    );
}

#[tokio::test]
async fn a_shadow_descriptor_over_its_limit_neither_denies_nor_stops_counting() {
    let limits = [("a", 5, ""), ("s", 1, "shadow_mode")];
    let dir = rules_dir(&[("d.yaml", &rules(&limits))]);
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    for n in 1..=3 {
        let response = ask(&mut client, hits(&["a", "s"])).await;
        assert!(is_ok(&response), "request {n}");
        assert_eq!(response.statuses[1].code, Code::Ok as i32);
    }
    assert_eq!(left(&mut client, "a").await, 2);
}

#[tokio::test]
async fn under_the_servers_quota_mode_a_request_goes_through_while_one_limit_fits() {
    let dir = rules_dir(&[("d.yaml", &rules(&[("a", 1, ""), ("b", 2, "")]))]);
    let (_clock, server) = start(&dir, "quota_mode = true").await;
    let mut client = rls_client(&server).await;
    let both = || hits(&["a", "b"]);
    assert!(is_ok(&ask(&mut client, both()).await));
    // a is over, b fits: through, and b counts.
    let one = ask(&mut client, both()).await;
    assert!(is_ok(&one));
    assert_eq!(one.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(left(&mut client, "b").await, 0);
    // Both over: denied, nothing counted.
    let denied = ask(&mut client, both()).await;
    assert_eq!(code(&denied), Code::OverLimit);
    // A probe of a quota-mode descriptor that fits is enough to go through
    // (and counts nothing itself); every probe over is not.
    let dir = rules_dir(&[("d.yaml", &rules(&[("a", 1, ""), ("p", 1, "")]))]);
    let (_clock, server) = start(&dir, "quota_mode = true").await;
    let mut client = rls_client(&server).await;
    assert!(is_ok(&ask(&mut client, hits(&["a", "?p"])).await));
    assert!(is_ok(&ask(&mut client, hits(&["a", "?p"])).await));
    assert_eq!(left(&mut client, "p").await, 1);
    assert!(is_ok(&ask(&mut client, hits(&["p"])).await));
    assert_eq!(
        code(&ask(&mut client, hits(&["a", "?p"])).await),
        Code::OverLimit
    );
}

#[tokio::test]
async fn quota_mode_descriptors_over_a_limit_of_zero_deny_without_counting() {
    let limits = [("a", 5, ""), ("z", 0, "quota_mode")];
    let dir = rules_dir(&[("d.yaml", &rules(&limits))]);
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    let response = ask(&mut client, hits(&["a", "z"])).await;
    assert_eq!(code(&response), Code::OverLimit);
    assert_eq!(left(&mut client, "a").await, 5);
}

#[tokio::test]
async fn descriptors_only_looked_at_are_recorded_as_rejected_not_as_decisions() {
    let limits = [("a", 1, ""), ("s", 5, "shadow_mode")];
    let dir = rules_dir(&[("d.yaml", &rules(&limits))]);
    let (_clock, server) = start(&dir, "").await;
    let mut client = rls_client(&server).await;
    for _ in 0..3 {
        ask(&mut client, hits(&["a", "s"])).await;
    }
    let metrics = server.metrics().await;
    let s = |outcome: &str, reason: &str| {
        metrics.value(
            "quotad_decisions_total",
            &[
                ("policy", "rls:d/s"),
                ("algorithm", "fixed_window"),
                ("outcome", outcome),
                ("reason", reason),
            ],
        )
    };
    assert_eq!(s("allowed", "within_limit"), 1.0);
    assert_eq!(s("denied", "batch_rejected"), 2.0);
}
