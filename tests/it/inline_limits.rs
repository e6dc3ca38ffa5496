//! What an inline policy may ask for (`limits.max_inline_*`): past a bound,
//! INVALID_ARGUMENT naming the field and the setting, and nothing created.

use std::sync::Arc;

use crate::common::{NOON_30, TestServer, check, inline, policy};
use quotad_core::FakeClock;
use quotad_proto::v1 as pb;
use tonic::Code;

const CONFIG: &str = r#"
[limits]
max_inline_window = "1m"
max_inline_limit = 100
max_inline_log_limit = 10
"#;

#[tokio::test]
async fn inline_policies_past_the_configured_bounds_are_refused_naming_the_field() {
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let mut client = server.client().await;
    let cases = [
        (
            policy(pb::Algorithm::FixedWindow, 10, 60_001, None),
            "inline_policy.window_ms: must be at most 60000",
        ),
        (
            policy(pb::Algorithm::FixedWindow, 101, 60_000, None),
            "inline_policy.limit: must be at most 100",
        ),
        (
            policy(pb::Algorithm::SlidingLog, 11, 1_000, None),
            "inline_policy.limit: must be at most 10",
        ),
        (
            policy(pb::Algorithm::TokenBucket, 10, 1_000, Some(101)),
            "inline_policy.burst: must be at most 100",
        ),
    ];
    for (inline_policy, message) in cases {
        let status = client
            .check(inline("k", inline_policy, None))
            .await
            .expect_err("out of bounds");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().starts_with(message),
            "{}",
            status.message()
        );
    }
    // In a batch, the item is named.
    let batch = pb::CheckBatchRequest {
        items: vec![
            inline(
                "k",
                policy(pb::Algorithm::FixedWindow, 10, 1_000, None),
                None,
            ),
            inline(
                "k",
                policy(pb::Algorithm::SlidingLog, 11, 1_000, None),
                None,
            ),
        ],
        mode: pb::BatchMode::Independent.into(),
    };
    let status = client.check_batch(batch).await.expect_err("item 1");
    assert!(
        status.message().starts_with("items[1].inline_policy.limit"),
        "{}",
        status.message()
    );
    assert_eq!(server.metrics().await.live_keys(), 0.0, "nothing created");

    // At the bounds, served.
    let at_bounds = policy(pb::Algorithm::SlidingLog, 10, 60_000, None);
    assert!(
        check(&mut client, inline("k", at_bounds, None))
            .await
            .allowed
    );
}
