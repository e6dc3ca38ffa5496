//! Decisions over gRPC against the real server: the seed table, concurrent
//! callers, batches, peek, reset, inline policies and a full key table.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{NOON_30, TestServer, check, check_batch, inline, named, peek, policy};
use quotad_core::FakeClock;
use quotad_proto::v1 as pb;

const POLICIES: &str = r#"
[policies.api]
algorithm = "fixed_window"
limit = 10
window = "1m"

[policies.per_second]
algorithm = "fixed_window"
limit = 5
window = "1s"

[policies.per_day]
algorithm = "fixed_window"
limit = 3
window = "1d"

[policies.bucket]
algorithm = "token_bucket"
limit = 10
window = "1s"
burst = 4
"#;

async fn server_at(now: u64) -> (Arc<FakeClock>, TestServer) {
    let clock = Arc::new(FakeClock::new(now));
    let server = TestServer::start_toml(POLICIES, clock.clone()).await;
    (clock, server)
}

#[tokio::test]
async fn allows_ten_with_remaining_nine_to_zero_then_denies_the_eleventh_with_exact_retry_and_reset()
 {
    let (clock, server) = server_at(NOON_30).await;
    let mut client = server.client().await;
    for expected_remaining in (0..10).rev() {
        let d = check(&mut client, named("alice", "api", None)).await;
        assert!(d.allowed);
        assert_eq!(d.limit, 10);
        assert_eq!(d.remaining, expected_remaining);
        assert_eq!(d.retry_after_ms, 0);
        assert_eq!(d.reset_after_ms, 30_000, "the window ends at 12:01:00");
        assert_eq!(d.reason(), pb::Reason::WithinLimit);
    }
    let eleventh = check(&mut client, named("alice", "api", None)).await;
    assert!(!eleventh.allowed);
    assert_eq!(eleventh.reason(), pb::Reason::LimitExceeded);
    assert_eq!(eleventh.remaining, 0);
    assert_eq!(eleventh.retry_after_ms, 30_000);
    assert_eq!(eleventh.reset_after_ms, 30_000);

    // The retry time is exact: still denied 1 ms before, allowed at it.
    clock.advance(Duration::from_millis(29_999));
    let early = check(&mut client, named("alice", "api", None)).await;
    assert!(!early.allowed);
    assert_eq!(early.retry_after_ms, 1);
    clock.advance(Duration::from_millis(1));
    let next_window = check(&mut client, named("alice", "api", None)).await;
    assert!(next_window.allowed);
    assert_eq!(next_window.remaining, 9);

    // Another key has its own budget.
    let bob = check(&mut client, named("bob", "api", None)).await;
    assert_eq!(bob.remaining, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_concurrent_callers_on_one_key_with_limit_ten_get_exactly_ten_allowed() {
    // The clock stands still, so no window boundary can fall inside a round.
    let (clock, server) = server_at(NOON_30).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(server.client().await);
    }
    for round in 0..25 {
        let calls = (0..100).map(|i| {
            let mut client = clients[i % clients.len()].clone();
            tokio::spawn(async move { check(&mut client, named("shared", "api", None)).await })
        });
        let mut allowed = 0;
        let mut remaining_seen = Vec::new();
        for call in calls.collect::<Vec<_>>() {
            let decision = call.await.expect("caller task");
            if decision.allowed {
                allowed += 1;
                remaining_seen.push(decision.remaining);
            } else {
                assert_eq!(decision.reason(), pb::Reason::LimitExceeded);
            }
        }
        assert_eq!(allowed, 10, "round {round}");
        remaining_seen.sort_unstable();
        assert_eq!(
            remaining_seen,
            (0..10).collect::<Vec<u64>>(),
            "round {round}: each unit once"
        );
        clock.advance(Duration::from_secs(60));
    }
}

#[tokio::test]
async fn all_or_nothing_leaves_the_per_second_budget_untouched_when_the_day_is_spent() {
    let (_clock, server) = server_at(NOON_30).await;
    let mut client = server.client().await;
    for _ in 0..3 {
        assert!(
            check(&mut client, named("tenant", "per_day", None))
                .await
                .allowed
        );
    }
    let decisions = check_batch(
        &mut client,
        vec![
            named("tenant", "per_second", None),
            named("tenant", "per_day", None),
        ],
        pb::BatchMode::AllOrNothing,
    )
    .await;
    assert_eq!(decisions.len(), 2);
    assert!(!decisions[0].allowed);
    assert_eq!(decisions[0].reason(), pb::Reason::BatchRejected);
    assert!(!decisions[1].allowed);
    assert_eq!(decisions[1].reason(), pb::Reason::LimitExceeded);

    let per_second = peek(&mut client, named("tenant", "per_second", None)).await;
    assert!(per_second.allowed);
    assert_eq!(
        per_second.remaining, 5,
        "nothing was taken from the per-second budget"
    );
}

#[tokio::test]
async fn an_independent_batch_consumes_every_item_that_fits() {
    let (_clock, server) = server_at(NOON_30).await;
    let mut client = server.client().await;
    for _ in 0..3 {
        check(&mut client, named("tenant", "per_day", None)).await;
    }
    let decisions = check_batch(
        &mut client,
        vec![
            named("tenant", "per_second", None),
            named("tenant", "per_day", None),
        ],
        pb::BatchMode::Independent,
    )
    .await;
    assert!(decisions[0].allowed);
    assert!(!decisions[1].allowed);
    let per_second = peek(&mut client, named("tenant", "per_second", None)).await;
    assert_eq!(per_second.remaining, 4);
}

#[tokio::test]
async fn an_all_or_nothing_batch_that_fits_consumes_from_every_item() {
    let (_clock, server) = server_at(NOON_30).await;
    let mut client = server.client().await;
    let decisions = check_batch(
        &mut client,
        vec![
            named("t", "per_second", Some(2)),
            named("t", "per_day", None),
        ],
        pb::BatchMode::AllOrNothing,
    )
    .await;
    assert!(decisions.iter().all(|d| d.allowed));
    assert_eq!(decisions[0].remaining, 3);
    assert_eq!(decisions[1].remaining, 2);
}

#[tokio::test]
async fn peek_consumes_nothing_and_creates_no_state() {
    let (_clock, server) = server_at(NOON_30).await;
    let mut client = server.client().await;
    for _ in 0..3 {
        let d = peek(&mut client, named("carol", "api", Some(4))).await;
        assert!(d.allowed);
        assert_eq!(d.remaining, 10);
    }
    assert_eq!(server.metrics().await.live_keys(), 0.0);
    check(&mut client, named("carol", "api", Some(4))).await;
    let after = peek(&mut client, named("carol", "api", Some(7))).await;
    assert!(!after.allowed, "7 does not fit in the 6 left");
    assert_eq!(after.remaining, 6);
    assert_eq!(after.retry_after_ms, 30_000);
}

#[tokio::test]
async fn reset_gives_the_key_a_fresh_budget_under_that_policy_only() {
    let (_clock, server) = server_at(NOON_30).await;
    let mut client = server.client().await;
    check(&mut client, named("dave", "api", Some(10))).await;
    check(&mut client, named("dave", "per_second", Some(5))).await;
    let reset = pb::ResetRequest {
        key: "dave".to_owned(),
        policy: Some(pb::reset_request::Policy::PolicyName("api".to_owned())),
    };
    client.reset(reset.clone()).await.expect("reset");
    assert_eq!(
        peek(&mut client, named("dave", "api", None))
            .await
            .remaining,
        10
    );
    assert_eq!(
        peek(&mut client, named("dave", "per_second", None))
            .await
            .remaining,
        0
    );
    // Resetting a key with no state succeeds too.
    client.reset(reset).await.expect("reset again");
}

#[tokio::test]
async fn inline_policies_keep_state_apart_from_named_ones_and_from_each_other() {
    let (_clock, server) = server_at(NOON_30).await;
    let mut client = server.client().await;
    check(&mut client, named("erin", "api", Some(10))).await;

    // Same parameters as `api`, but inline: a separate budget.
    let same_as_api = policy(pb::Algorithm::FixedWindow, 10, 60_000, None);
    let first = check(&mut client, inline("erin", same_as_api.clone(), Some(3))).await;
    assert!(first.allowed);
    assert_eq!(first.remaining, 7);
    // The same inline policy again shares that budget.
    let second = check(&mut client, inline("erin", same_as_api.clone(), None)).await;
    assert_eq!(second.remaining, 6);
    // A different limit is a different inline policy.
    let other = check(
        &mut client,
        inline(
            "erin",
            policy(pb::Algorithm::FixedWindow, 11, 60_000, None),
            None,
        ),
    )
    .await;
    assert_eq!(other.remaining, 10);
    // An explicit burst equal to the default is the same bucket policy.
    let bucket = policy(pb::Algorithm::TokenBucket, 5, 1_000, None);
    check(&mut client, inline("erin", bucket, Some(2))).await;
    let explicit = check(
        &mut client,
        inline(
            "erin",
            policy(pb::Algorithm::TokenBucket, 5, 1_000, Some(5)),
            None,
        ),
    )
    .await;
    assert_eq!(explicit.remaining, 2);

    let reset = pb::ResetRequest {
        key: "erin".to_owned(),
        policy: Some(pb::reset_request::Policy::InlinePolicy(same_as_api.clone())),
    };
    client.reset(reset).await.expect("reset inline");
    assert_eq!(
        peek(&mut client, inline("erin", same_as_api.clone(), None))
            .await
            .remaining,
        10
    );
    assert_eq!(
        peek(&mut client, named("erin", "api", None))
            .await
            .remaining,
        0
    );
}

#[tokio::test]
async fn a_cost_above_capacity_is_denied_without_consuming() {
    let (_clock, server) = server_at(NOON_30).await;
    let mut client = server.client().await;
    let d = check(&mut client, named("frank", "bucket", Some(5))).await;
    assert!(!d.allowed);
    assert_eq!(d.reason(), pb::Reason::CostExceedsCapacity);
    assert_eq!(d.limit, 4, "a bucket's capacity is its burst");
    assert_eq!(d.retry_after_ms, 0);
    assert_eq!(
        peek(&mut client, named("frank", "bucket", None))
            .await
            .remaining,
        4
    );
}

#[tokio::test]
async fn a_full_key_table_denies_new_keys_with_capacity_when_on_full_is_deny() {
    let clock = Arc::new(FakeClock::new(NOON_30));
    let config = format!("[store]\nmax_keys = 64\non_full = \"deny\"\n{POLICIES}");
    let server = TestServer::start_toml(&config, clock).await;
    let mut client = server.client().await;
    for i in 0..64 {
        assert!(
            check(&mut client, named(&format!("k{i}"), "api", None))
                .await
                .allowed
        );
    }
    let denied = check(&mut client, named("one-too-many", "api", None)).await;
    assert!(!denied.allowed);
    assert_eq!(denied.reason(), pb::Reason::Capacity);
    assert!(
        check(&mut client, named("k0", "api", None)).await.allowed,
        "existing keys go on"
    );
    assert_eq!(server.metrics().await.live_keys(), 64.0);
}

#[tokio::test]
async fn a_full_key_table_evicts_and_counts_it_when_on_full_is_evict() {
    let clock = Arc::new(FakeClock::new(NOON_30));
    let config = format!("[store]\nmax_keys = 64\non_full = \"evict\"\n{POLICIES}");
    let server = TestServer::start_toml(&config, clock).await;
    let mut client = server.client().await;
    for i in 0..65 {
        assert!(
            check(&mut client, named(&format!("k{i}"), "api", None))
                .await
                .allowed
        );
    }
    let metrics = server.metrics().await;
    assert_eq!(metrics.value("quotad_evictions_total", &[]), 1.0);
    assert_eq!(metrics.live_keys(), 64.0);
}

#[tokio::test]
async fn health_reports_serving_and_reflection_lists_the_api_in_v1_and_v1alpha() {
    let (_clock, server) = server_at(NOON_30).await;
    const RLQS: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";
    for service in ["quotad.v1.Quota", RLQS, ""] {
        let status = crate::common::health_status(&server, service).await;
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
    }

    let services = reflection_v1(&server).await;
    assert!(
        services.contains(&"quotad.v1.Quota".to_owned()),
        "{services:?}"
    );
    assert!(
        services.contains(&"grpc.health.v1.Health".to_owned()),
        "{services:?}"
    );
    assert!(services.contains(&RLQS.to_owned()), "{services:?}");
    let services = reflection_v1alpha(&server).await;
    assert!(
        services.contains(&"quotad.v1.Quota".to_owned()),
        "{services:?}"
    );
}

/// Lists the services through one version of the reflection API; v1 and
/// v1alpha are the same messages in two generated modules.
macro_rules! list_services {
    ($name:ident, $version:ident) => {
        pub(crate) async fn $name(server: &TestServer) -> Vec<String> {
            use tonic_reflection::pb::$version::{
                ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
                server_reflection_request::MessageRequest,
                server_reflection_response::MessageResponse,
            };
            let mut client = ServerReflectionClient::new(server.channel().await);
            let request = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let mut responses = client
                .server_reflection_info(tokio_stream::iter([request]))
                .await
                .expect(stringify!(reflection $version))
                .into_inner();
            let response = responses
                .message()
                .await
                .expect("a response")
                .expect("not empty");
            match response.message_response {
                Some(MessageResponse::ListServicesResponse(list)) => {
                    list.service.into_iter().map(|s| s.name).collect()
                }
                other => panic!("unexpected reflection response {other:?}"),
            }
        }
    };
}

list_services!(reflection_v1, v1);
list_services!(reflection_v1alpha, v1alpha);
