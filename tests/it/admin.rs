//! The admin port: `/metrics`, `/healthz`, `/readyz`, `/policies`.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{NOON_30, TestServer, check, eventually, inline, named, peek, policy};
use quotad_core::FakeClock;
use quotad_proto::v1 as pb;

const CONFIG: &str = r#"
[policies.api]
algorithm = "fixed_window"
limit = 10
window = "1m"

[policies.per_day]
algorithm = "sliding_window"
limit = 1
window = "1d"

[policies.burst]
algorithm = "token_bucket"
limit = 10
window = "1s"
burst = 20
"#;

#[tokio::test]
async fn metrics_count_decisions_by_policy_algorithm_outcome_and_reason_and_never_show_a_key() {
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let mut client = server.client().await;
    for _ in 0..11 {
        check(&mut client, named("secret-key-4f9a", "api", None)).await;
    }
    let inline_bucket = policy(pb::Algorithm::TokenBucket, 5, 1_000, None);
    check(
        &mut client,
        inline("inline-secret-77", inline_bucket.clone(), Some(2)),
    )
    .await;
    check(
        &mut client,
        inline("inline-secret-77", inline_bucket.clone(), Some(9)),
    )
    .await;
    check(&mut client, named("secret-key-4f9a", "per_day", None)).await;
    let batch = pb::CheckBatchRequest {
        items: vec![
            named("batch-secret-1", "api", None),
            named("secret-key-4f9a", "per_day", None),
        ],
        mode: pb::BatchMode::AllOrNothing.into(),
    };
    client.check_batch(batch).await.expect("batch");
    peek(&mut client, named("peek-secret", "api", None)).await;
    client
        .check(named("", "api", None))
        .await
        .expect_err("empty key");
    client
        .check(named("error-secret", "nope", None))
        .await
        .expect_err("unknown policy");

    let metrics = server.metrics().await;
    let decisions = |policy: &str, algorithm: &str, outcome: &str, reason: &str| {
        metrics.value(
            "quotad_decisions_total",
            &[
                ("policy", policy),
                ("algorithm", algorithm),
                ("outcome", outcome),
                ("reason", reason),
            ],
        )
    };
    for (policy, algorithm, outcome, reason, count) in [
        ("api", "fixed_window", "allowed", "within_limit", 10.0),
        ("api", "fixed_window", "denied", "limit_exceeded", 1.0),
        ("api", "fixed_window", "denied", "batch_rejected", 1.0),
        ("per_day", "sliding_window", "allowed", "within_limit", 1.0),
        ("per_day", "sliding_window", "denied", "limit_exceeded", 1.0),
        ("inline", "token_bucket", "allowed", "within_limit", 1.0),
        (
            "inline",
            "token_bucket",
            "denied",
            "cost_exceeds_capacity",
            1.0,
        ),
    ] {
        assert_eq!(
            decisions(policy, algorithm, outcome, reason),
            count,
            "{policy} {algorithm} {outcome} {reason}"
        );
    }
    let total: f64 = metrics
        .series("quotad_decisions_total")
        .iter()
        .map(|(_, v)| v)
        .sum();
    assert_eq!(total, 16.0, "peeks and rejected requests are not decisions");

    let errors = |method: &str, code: &str| {
        metrics.value(
            "quotad_request_errors_total",
            &[("method", method), ("code", code)],
        )
    };
    assert_eq!(errors("check", "InvalidArgument"), 1.0);
    assert_eq!(errors("check", "NotFound"), 1.0);

    let store_ops = |op: &str| {
        metrics.value(
            "quotad_store_operations_total",
            &[("backend", "memory"), ("op", op)],
        )
    };
    assert_eq!(
        store_ops("check"),
        14.0,
        "one store call per accepted Check"
    );
    assert_eq!(store_ops("check_batch"), 1.0);
    assert_eq!(store_ops("peek"), 1.0);
    assert_eq!(store_ops("reset"), 0.0);

    assert_eq!(
        metrics.value(
            "quotad_decision_duration_seconds_count",
            &[("method", "check")]
        ),
        16.0,
        "every Check is timed, failed ones too"
    );
    assert_eq!(
        metrics.value(
            "quotad_decision_duration_seconds_bucket",
            &[("method", "check"), ("le", "+Inf")]
        ),
        16.0
    );
    assert!(
        metrics
            .get(
                "quotad_decision_duration_seconds_bucket",
                &[("method", "check"), ("le", "0.00001")]
            )
            .is_some()
    );
    assert!(
        metrics
            .get(
                "quotad_decision_duration_seconds_bucket",
                &[("method", "check"), ("le", "0.1")]
            )
            .is_some()
    );
    assert_eq!(metrics.live_keys(), 3.0);
    assert_eq!(metrics.value("quotad_evictions_total", &[]), 0.0);
    for help in [
        "quotad_decisions_total",
        "quotad_live_keys",
        "quotad_decision_duration_seconds",
    ] {
        assert!(
            metrics.text.contains(&format!("# HELP {help} ")),
            "HELP for {help}"
        );
    }

    assert!(
        !metrics.text.contains("secret"),
        "a key leaked into /metrics:\n{}",
        metrics.text
    );
    for (labels, _) in metrics.series("quotad_decisions_total") {
        let policy = &labels["policy"];
        assert!(
            ["api", "per_day", "burst", "inline"].contains(&policy.as_str()),
            "{policy}"
        );
    }
}

#[tokio::test]
async fn healthz_and_readyz_answer_ok_while_serving() {
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    assert_eq!(server.get("/healthz").await.0, 200);
    assert_eq!(server.get("/readyz").await.0, 200);
    assert_eq!(server.get("/nope").await.0, 404);
}

#[tokio::test]
async fn policies_lists_the_named_policies_as_json() {
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let (status, body) = server.get("/policies").await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        json,
        serde_json::json!({
            "policies": {
                "api": {"algorithm": "fixed_window", "limit": 10, "window_ms": 60_000, "burst": null, "on_error": "error"},
                "burst": {"algorithm": "token_bucket", "limit": 10, "window_ms": 1_000, "burst": 20, "on_error": "error"},
                "per_day": {"algorithm": "sliding_window", "limit": 1, "window_ms": 86_400_000, "burst": null, "on_error": "error"},
            }
        })
    );
}

#[tokio::test]
async fn state_that_has_become_fresh_is_swept_and_counted_as_reclaimed() {
    let clock = Arc::new(FakeClock::new(NOON_30));
    let config = format!("[store]\nmax_keys = 64\nsweep_interval = \"10ms\"\n{CONFIG}");
    let server = TestServer::start_toml(&config, clock.clone()).await;
    let mut client = server.client().await;
    check(&mut client, named("gone-soon", "api", None)).await;
    assert_eq!(server.metrics().await.live_keys(), 1.0);
    clock.advance(Duration::from_secs(30));
    eventually(
        Duration::from_secs(5),
        "the sweep drops the fresh key",
        || async {
            let metrics = server.metrics().await;
            metrics.live_keys() == 0.0 && metrics.value("quotad_reclaimed_keys_total", &[]) == 1.0
        },
    )
    .await;
}
