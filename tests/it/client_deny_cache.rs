//! The client's deny cache against the real server on the real clock.
//!
//! A module of the root integration test binary (`tests/it`, declared as
//! `mod client_deny_cache;`), using its `common` helpers.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use quotad::Config;
use quotad_client::{Check, Client, Reason};

use crate::common::TestServer;

const CONFIG: &str = r#"
[policies.api]
algorithm = "fixed_window"
limit = 5
window = "1s"
"#;

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    u64::try_from(since.as_millis()).expect("fits")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_at_ten_times_its_limit_costs_one_call_per_window_and_local_answers_match_the_server()
{
    let server = TestServer::start(Config::from_toml(CONFIG).expect("valid config")).await;
    let client = Client::builder(format!("http://{}", server.grpc_addr))
        .deadline(Duration::from_secs(5))
        .build()
        .expect("valid address");
    let peeker = Client::builder(format!("http://{}", server.grpc_addr))
        .deadline(Duration::from_secs(5))
        .deny_cache(0)
        .build()
        .expect("valid address");
    let check = Check::named("api", "hot");

    // 50 a second against a limit of 5 a second, for about two seconds.
    let started_ms = now_ms();
    let mut answers = 0u64;
    // The longest check so far, in whole ms rounded up: a bound on the
    // trip back of any denial the client cached.
    let mut longest = 0u64;
    for _ in 0..100 {
        let asked = Instant::now();
        let decision = client.check(&check).await.expect("decided");
        let took = asked.elapsed().as_micros().div_ceil(1_000);
        longest = longest.max(u64::try_from(took).expect("fits"));
        answers += 1;
        if !decision.allowed {
            assert_eq!(decision.reason, Reason::LimitExceeded);
            // quotad agrees, unless its window ended between the two calls
            // (only possible when the answer said so little time was left).
            // A local answer reports its wait from when quotad's denial
            // arrived, plus the clocks' 1 ms margin, so it may exceed
            // quotad's by that margin, the denial's trip back and a
            // millisecond of rounding.
            let server = peeker.peek(&check).await.expect("peeked");
            let between = u64::try_from(asked.elapsed().as_millis()).expect("fits");
            let slack = between + longest + 2;
            if server.allowed {
                assert!(decision.retry_after_ms <= slack, "{decision:?}");
            } else {
                assert!(decision.retry_after_ms <= server.retry_after_ms + slack);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let windows = now_ms() / 1_000 - started_ms / 1_000 + 1;

    let metrics = server.metrics().await;
    let decided = |outcome: &str, reason: &str| {
        metrics.value(
            "quotad_decisions_total",
            &[
                ("policy", "api"),
                ("algorithm", "fixed_window"),
                ("outcome", outcome),
                ("reason", reason),
            ],
        ) as u64
    };
    let allowed = decided("allowed", "within_limit");
    let denied = decided("denied", "limit_exceeded");
    assert!(
        allowed <= 5 * windows,
        "{allowed} admitted in {windows} windows"
    );
    // One call per retry interval: the denial that starts it, and at most
    // one more sent in the window's last milliseconds, after the local
    // window closed (it ends before quotad's by the request's transit time
    // and the clocks' margin, so that it never outlasts quotad's).
    assert!(
        denied <= 2 * windows,
        "at most two denials reached quotad per window: {denied} in {windows}"
    );
    assert!(
        allowed + denied < answers / 2,
        "most denials were answered locally: {} calls for {answers} checks",
        allowed + denied
    );
}
