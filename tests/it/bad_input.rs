//! Bad input is rejected with the right status code and a message naming
//! the field, and a rejected request creates and consumes nothing.

use std::sync::Arc;

use crate::common::{NOON_30, TestServer, check, inline, named, peek, policy};
use quotad_core::FakeClock;
use quotad_proto::v1 as pb;
use quotad_proto::v1::quota_client::QuotaClient;
use tonic::Code;
use tonic::transport::Channel;

const CONFIG: &str = r#"
[store]
max_key_bytes = 16

[policies.api]
algorithm = "fixed_window"
limit = 10
window = "1m"
"#;

/// One call of any method.
#[derive(Clone)]
enum Call {
    Check(pb::CheckRequest),
    Peek(pb::CheckRequest),
    Batch(pb::CheckBatchRequest),
    Reset(pb::ResetRequest),
}

async fn call(client: &mut QuotaClient<Channel>, call: Call) -> Result<(), tonic::Status> {
    match call {
        Call::Check(r) => client.check(r).await.map(drop),
        Call::Peek(r) => client.peek(r).await.map(drop),
        Call::Batch(r) => client.check_batch(r).await.map(drop),
        Call::Reset(r) => client.reset(r).await.map(drop),
    }
}

fn no_policy(key: &str) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.to_owned(),
        cost: None,
        policy: None,
    }
}

fn batch(items: Vec<pb::CheckRequest>, mode: pb::BatchMode) -> Call {
    Call::Batch(pb::CheckBatchRequest {
        items,
        mode: mode.into(),
    })
}

fn reset(key: &str, policy: Option<pb::reset_request::Policy>) -> Call {
    Call::Reset(pb::ResetRequest {
        key: key.to_owned(),
        policy,
    })
}

fn inline_with(algorithm: i32, limit: u64, window_ms: u64, burst: Option<u64>) -> pb::CheckRequest {
    inline(
        "victim",
        pb::Policy {
            algorithm,
            limit,
            window_ms,
            burst,
            ..Default::default()
        },
        None,
    )
}

fn valid() -> pb::CheckRequest {
    named("victim", "api", None)
}

#[tokio::test]
async fn rejects_each_kind_of_bad_input_naming_the_field_and_changes_no_state() {
    use pb::Algorithm as A;
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let mut client = server.client().await;
    // One key with state, so "unchanged" is not trivially zero.
    check(&mut client, named("existing", "api", Some(3))).await;
    assert_eq!(server.metrics().await.live_keys(), 1.0);

    let two_53 = 1u64 << 53;
    let fixed = A::FixedWindow as i32;
    let bucket = A::TokenBucket as i32;
    let cases: Vec<(&str, Call, Code, &str)> = vec![
        (
            "empty key",
            Call::Check(named("", "api", None)),
            Code::InvalidArgument,
            "key: must not be empty",
        ),
        (
            "key over max_key_bytes",
            Call::Check(named(&"k".repeat(17), "api", None)),
            Code::InvalidArgument,
            "key: must be at most 16 bytes (got 17)",
        ),
        (
            "key over max_key_bytes in bytes, not chars",
            Call::Check(named(&"é".repeat(9), "api", None)),
            Code::InvalidArgument,
            "key: must be at most 16 bytes (got 18)",
        ),
        (
            "cost 0",
            Call::Check(named("victim", "api", Some(0))),
            Code::InvalidArgument,
            "cost:",
        ),
        (
            "no policy",
            Call::Check(no_policy("victim")),
            Code::InvalidArgument,
            "policy:",
        ),
        (
            "unknown policy",
            Call::Check(named("victim", "nope", None)),
            Code::NotFound,
            "policy_name: no policy named \"nope\"",
        ),
        (
            "empty policy name",
            Call::Check(named("victim", "", None)),
            Code::InvalidArgument,
            "policy_name:",
        ),
        (
            "policy name naming inline state",
            Call::Check(named("victim", "inline:fixed_window:10:60000:10", None)),
            Code::InvalidArgument,
            "policy_name:",
        ),
        (
            "inline algorithm unspecified",
            Call::Check(inline_with(A::Unspecified as i32, 10, 1_000, None)),
            Code::InvalidArgument,
            "inline_policy.algorithm: must be set",
        ),
        (
            "inline algorithm unknown",
            Call::Check(inline_with(99, 10, 1_000, None)),
            Code::InvalidArgument,
            "inline_policy.algorithm: unknown algorithm 99",
        ),
        (
            "inline limit 0",
            Call::Check(inline_with(fixed, 0, 1_000, None)),
            Code::InvalidArgument,
            "inline_policy.limit:",
        ),
        (
            "inline window 0",
            Call::Check(inline_with(fixed, 10, 0, None)),
            Code::InvalidArgument,
            "inline_policy.window_ms:",
        ),
        (
            "inline burst 0",
            Call::Check(inline_with(bucket, 10, 1_000, Some(0))),
            Code::InvalidArgument,
            "inline_policy.burst:",
        ),
        (
            "inline burst on a window algorithm",
            Call::Check(inline_with(fixed, 10, 1_000, Some(5))),
            Code::InvalidArgument,
            "inline_policy.burst:",
        ),
        (
            "inline limit x window over 2^53",
            Call::Check(inline_with(bucket, two_53 / 1_000 + 1, 1_000, None)),
            Code::InvalidArgument,
            "inline_policy.limit:",
        ),
        (
            "inline fixed window limit over 2^53",
            Call::Check(inline_with(fixed, two_53 + 1, 1_000, None)),
            Code::InvalidArgument,
            "inline_policy.limit:",
        ),
        (
            "inline burst x window over 2^53",
            Call::Check(inline_with(bucket, 1, 1_000, Some(two_53 / 1_000 + 1))),
            Code::InvalidArgument,
            "inline_policy.burst:",
        ),
        (
            "inline sliding log over 10000",
            Call::Check(inline_with(A::SlidingLog as i32, 10_001, 1_000, None)),
            Code::InvalidArgument,
            "inline_policy.limit:",
        ),
        (
            "empty batch",
            batch(vec![], pb::BatchMode::Independent),
            Code::InvalidArgument,
            "items: must hold at least 1 item",
        ),
        (
            "batch over 1000 items",
            batch(vec![valid(); 1_001], pb::BatchMode::Independent),
            Code::InvalidArgument,
            "items: must hold at most 1000 items",
        ),
        (
            "unknown batch mode",
            Call::Batch(pb::CheckBatchRequest {
                items: vec![valid()],
                mode: 7,
            }),
            Code::InvalidArgument,
            "mode: unknown batch mode 7",
        ),
        (
            "bad last item of an all-or-nothing batch",
            batch(
                vec![valid(), valid(), named("victim", "api", Some(0))],
                pb::BatchMode::AllOrNothing,
            ),
            Code::InvalidArgument,
            "items[2].cost:",
        ),
        (
            "unknown policy in an independent batch",
            batch(
                vec![valid(), named("victim", "nope", None)],
                pb::BatchMode::Independent,
            ),
            Code::NotFound,
            "items[1].policy_name:",
        ),
        (
            "bad inline item in a batch",
            batch(
                vec![inline_with(fixed, 10, 0, None), valid()],
                pb::BatchMode::Independent,
            ),
            Code::InvalidArgument,
            "items[0].inline_policy.window_ms:",
        ),
        (
            "oversized key in a batch",
            batch(
                vec![valid(), named(&"k".repeat(17), "api", None)],
                pb::BatchMode::Independent,
            ),
            Code::InvalidArgument,
            "items[1].key:",
        ),
        (
            "peek with cost 0",
            Call::Peek(named("victim", "api", Some(0))),
            Code::InvalidArgument,
            "cost:",
        ),
        (
            "peek with an empty key",
            Call::Peek(named("", "api", None)),
            Code::InvalidArgument,
            "key:",
        ),
        (
            "peek of an unknown policy",
            Call::Peek(named("victim", "nope", None)),
            Code::NotFound,
            "policy_name:",
        ),
        (
            "reset with an empty key",
            reset(
                "",
                Some(pb::reset_request::Policy::PolicyName("api".into())),
            ),
            Code::InvalidArgument,
            "key:",
        ),
        (
            "reset with no policy",
            reset("victim", None),
            Code::InvalidArgument,
            "policy:",
        ),
        (
            "reset of an unknown policy",
            reset(
                "existing",
                Some(pb::reset_request::Policy::PolicyName("nope".into())),
            ),
            Code::NotFound,
            "policy_name:",
        ),
        (
            "reset with an invalid inline policy",
            reset(
                "existing",
                Some(pb::reset_request::Policy::InlinePolicy(policy(
                    A::FixedWindow,
                    0,
                    1_000,
                    None,
                ))),
            ),
            Code::InvalidArgument,
            "inline_policy.limit:",
        ),
    ];
    assert!(cases.len() >= 15);
    for (name, request, code, message) in cases {
        let status = call(&mut client, request).await.expect_err(name);
        assert_eq!(status.code(), code, "{name}: {}", status.message());
        assert!(
            status.message().starts_with(message),
            "{name}: {:?} does not start with {message:?}",
            status.message()
        );
    }

    assert_eq!(
        server.metrics().await.live_keys(),
        1.0,
        "no rejected request created a key"
    );
    let victim = peek(&mut client, valid()).await;
    assert_eq!(
        victim.remaining, 10,
        "no rejected batch consumed its valid items"
    );
    let existing = peek(&mut client, named("existing", "api", None)).await;
    assert_eq!(existing.remaining, 7, "no rejected reset forgot state");
}

#[tokio::test]
async fn accepts_a_key_of_exactly_max_key_bytes() {
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let mut client = server.client().await;
    assert!(
        check(&mut client, named(&"k".repeat(16), "api", None))
            .await
            .allowed
    );
    assert!(
        check(&mut client, named(&"é".repeat(8), "api", None))
            .await
            .allowed
    );
}

#[tokio::test]
async fn a_batch_of_exactly_a_thousand_items_is_accepted() {
    let server = TestServer::start_toml(CONFIG, Arc::new(FakeClock::new(NOON_30))).await;
    let mut client = server.client().await;
    let items = (0..1_000)
        .map(|i| named(&format!("k{i}"), "api", None))
        .collect();
    let request = pb::CheckBatchRequest {
        items,
        mode: pb::BatchMode::AllOrNothing.into(),
    };
    let decisions = client
        .check_batch(request)
        .await
        .expect("batch")
        .into_inner()
        .decisions;
    assert_eq!(decisions.len(), 1_000);
    assert!(decisions.iter().all(|d| d.allowed));
}

#[tokio::test]
async fn inline_policies_fail_the_precondition_when_disabled() {
    let config = format!("[limits]\nallow_inline_policies = false\n{CONFIG}");
    let server = TestServer::start_toml(&config, Arc::new(FakeClock::new(NOON_30))).await;
    let mut client = server.client().await;
    let inline_policy = policy(pb::Algorithm::FixedWindow, 10, 1_000, None);
    let cases = [
        (
            Call::Check(inline("k", inline_policy.clone(), None)),
            "inline_policy: inline policies are disabled",
        ),
        (
            Call::Peek(inline("k", inline_policy.clone(), None)),
            "inline_policy:",
        ),
        (
            reset(
                "k",
                Some(pb::reset_request::Policy::InlinePolicy(
                    inline_policy.clone(),
                )),
            ),
            "inline_policy:",
        ),
        (
            batch(
                vec![valid(), inline("k", inline_policy.clone(), None)],
                pb::BatchMode::Independent,
            ),
            "items[1].inline_policy:",
        ),
    ];
    for (request, message) in cases {
        let status = call(&mut client, request)
            .await
            .expect_err("inline is disabled");
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(
            status.message().starts_with(message),
            "{}",
            status.message()
        );
    }
    assert_eq!(server.metrics().await.live_keys(), 0.0);
    assert!(
        check(&mut client, valid()).await.allowed,
        "named policies still work"
    );
}

#[tokio::test]
async fn reset_is_permission_denied_when_disabled_and_changes_nothing() {
    let config = format!("[limits]\nallow_reset = false\n{CONFIG}");
    let server = TestServer::start_toml(&config, Arc::new(FakeClock::new(NOON_30))).await;
    let mut client = server.client().await;
    let before = check(&mut client, valid()).await;
    let status = call(
        &mut client,
        reset(
            &valid().key,
            valid().policy.map(|p| match p {
                pb::check_request::Policy::PolicyName(n) => {
                    pb::reset_request::Policy::PolicyName(n)
                }
                pb::check_request::Policy::InlinePolicy(p) => {
                    pb::reset_request::Policy::InlinePolicy(p)
                }
            }),
        ),
    )
    .await
    .expect_err("reset is disabled");
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status.message().contains("limits.allow_reset"),
        "{}",
        status.message()
    );
    let after = peek(&mut client, valid()).await;
    assert_eq!(after.remaining, before.remaining, "the key kept its state");
}
