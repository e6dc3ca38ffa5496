//! The local deny cache, against a fake quotad on a clock the test drives.

use std::sync::Arc;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use quotad_client::{Check, Client, Clock, PolicyRef, Reason};

use crate::fake::{Call, Fake, NOON, clock_of, serve_tcp};

const SECOND: Duration = Duration::from_secs(1);

async fn client(fake: &Arc<Fake>) -> Client {
    let addr = serve_tcp(fake, None).await;
    Client::builder(format!("http://{addr}"))
        .deadline(Duration::from_secs(30))
        .clock(clock_of(fake))
        .build()
        .expect("valid address")
}

fn rpcs(fake: &Fake) -> usize {
    fake.calls().len()
}

#[tokio::test]
async fn a_key_offered_at_ten_times_its_limit_makes_one_call_per_retry_interval_and_local_answers_equal_the_servers()
 {
    let recorder = DebuggingRecorder::new();
    let snapshots = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    // 10 a second, offered 100 a second for 3 seconds.
    let fake = Fake::new(10, SECOND);
    let client = client(&fake).await;
    let check = Check::named("api", "hot");
    let mut local = 0;
    for second in 0..3u64 {
        let before = rpcs(&fake);
        for _ in 0..100 {
            let calls = rpcs(&fake);
            let decision = client.check(&check).await.expect("decided");
            if rpcs(&fake) == calls {
                local += 1;
                // What quotad would have said at this instant.
                let server = fake.peek("hot", 1);
                assert!(!server.allowed);
                assert_eq!(decision.reason, Reason::LimitExceeded);
                // Reported from the answer's arrival plus the clocks'
                // margin (1 ms for waits under 1 s): never shorter than
                // quotad's.
                assert_eq!(
                    decision.retry_after_ms,
                    server.retry_after_ms + 1,
                    "{decision:?} vs {server:?}"
                );
                assert_eq!(decision.limit, server.limit);
                assert_eq!(decision.remaining, server.remaining);
            }
            fake.clock.advance(Duration::from_millis(10));
        }
        assert_eq!(
            rpcs(&fake) - before,
            11,
            "second {second}: ten admitted, one denial, the rest local"
        );
    }
    assert_eq!(local, 3 * 89);

    let counted: u64 = snapshots
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == "quotad_client_local_denials_total")
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            other => panic!("a counter, not {other:?}"),
        })
        .sum();
    assert_eq!(counted, 3 * 89);
}

#[tokio::test]
async fn a_smaller_cost_than_the_denied_one_still_asks_the_server() {
    let fake = Fake::new(10, Duration::from_secs(60));
    let client = client(&fake).await;
    let big = Check::named("api", "k").cost(6);
    assert!(client.check(&big).await.expect("decided").allowed);
    let denied = client.check(&big).await.expect("decided");
    assert_eq!(denied.reason, Reason::LimitExceeded);
    assert_eq!(rpcs(&fake), 2);

    assert!(
        !client
            .check(&big.clone().cost(9))
            .await
            .expect("local")
            .allowed
    );
    assert_eq!(rpcs(&fake), 2, "a larger cost is answered locally");
    let small = client
        .check(&big.clone().cost(4))
        .await
        .expect("decided by the server");
    assert!(small.allowed, "4 of the 4 left fit");
    assert_eq!(rpcs(&fake), 3);
}

#[tokio::test]
async fn a_reset_through_the_client_drops_the_cached_denial() {
    let fake = Fake::new(1, Duration::from_secs(60));
    let client = client(&fake).await;
    let check = Check::named("api", "k");
    assert!(client.check(&check).await.expect("decided").allowed);
    assert!(!client.check(&check).await.expect("decided").allowed);
    assert!(!client.check(&check).await.expect("local").allowed);
    assert_eq!(rpcs(&fake), 2);

    client
        .reset(&PolicyRef::Named("api".into()), "k")
        .await
        .expect("reset");
    let after = client.check(&check).await.expect("decided");
    assert!(after.allowed, "the reset made room at once");
    assert_eq!(
        fake.calls(),
        vec![
            Call::Check("k".into()),
            Call::Check("k".into()),
            Call::Reset("k".into()),
            Call::Check("k".into()),
        ]
    );
}

#[tokio::test]
async fn the_local_window_counts_from_the_send_and_the_reported_wait_from_the_arrival() {
    let fake = Fake::new(1, SECOND);
    let client = client(&fake).await;
    let check = Check::named("api", "k");
    assert!(client.check(&check).await.expect("decided").allowed);
    // The denial is decided 100 ms after it was sent, 900 ms before the
    // window ends: quotad says 900 ms, counted from its own instant.
    fake.set_transit(Duration::from_millis(100));
    let denied = client.check(&check).await.expect("decided");
    assert_eq!(denied.retry_after_ms, 900);
    fake.set_transit(Duration::ZERO);
    assert_eq!(fake.clock.now_ms(), NOON + 100);

    // Sent at NOON + 0: local until NOON + 899 (quotad's 900 ms less the
    // clocks' 1 ms margin), 101 ms before the server's. The wait it reports
    // counts from the answer's arrival (NOON + 100) plus the margin: up to
    // NOON + 1,001, never before the server's NOON + 1,000.
    fake.clock.advance(Duration::from_millis(798));
    let local = client.check(&check).await.expect("local");
    assert_eq!(local.retry_after_ms, 103);
    assert_eq!(fake.peek("k", 1).retry_after_ms, 102);
    assert_eq!(rpcs(&fake), 2);
    fake.clock.advance(Duration::from_millis(1));
    let asked = client.check(&check).await.expect("decided");
    assert_eq!(rpcs(&fake), 3, "asked quotad once the local window ended");
    assert_eq!(asked.retry_after_ms, 101, "quotad still denies for 101 ms");
}

#[tokio::test]
async fn a_cached_denial_never_reports_a_shorter_wait_than_quotad_at_the_same_instant() {
    for (window, transit_ms, step_ms) in [
        (SECOND, 0, 1),
        (SECOND, 1, 1),
        (SECOND, 250, 1),
        (Duration::from_secs(60), 0, 7),
        (Duration::from_secs(60), 3_000, 7),
    ] {
        let fake = Fake::new(2, window);
        let client = client(&fake).await;
        let check = Check::named("api", "k");
        fake.clock.advance(Duration::from_millis(123));
        for _ in 0..2 {
            assert!(client.check(&check).await.expect("decided").allowed);
        }
        // Decided `transit_ms` after it was sent; the answer arrives at
        // once.
        fake.set_transit(Duration::from_millis(transit_ms));
        let denied = client.check(&check).await.expect("decided");
        assert_eq!(denied.reason, Reason::LimitExceeded);
        fake.set_transit(Duration::ZERO);

        let mut local = 0;
        loop {
            let calls = rpcs(&fake);
            let decision = client.check(&check).await.expect("decided");
            if rpcs(&fake) != calls {
                break;
            }
            local += 1;
            let server = fake.peek("k", 1);
            let at = fake.clock.now_ms();
            assert!(!server.allowed, "{window:?} +{transit_ms}: at {at}");
            assert!(
                decision.retry_after_ms >= server.retry_after_ms,
                "{window:?} +{transit_ms}: at {at} {decision:?} vs {server:?}"
            );
            assert!(
                decision.reset_after_ms >= server.reset_after_ms,
                "{window:?} +{transit_ms}: at {at} {decision:?} vs {server:?}"
            );
            fake.clock.advance(Duration::from_millis(step_ms));
        }
        assert!(local > 0, "{window:?} +{transit_ms}: answered locally");
    }
}

#[tokio::test]
async fn only_limit_exceeded_is_cached() {
    let fake = Fake::new(5, Duration::from_secs(60));
    let client = client(&fake).await;
    let too_big = Check::named("api", "k").cost(6);
    for _ in 0..3 {
        let decision = client.check(&too_big).await.expect("decided");
        assert_eq!(decision.reason, Reason::CostExceedsCapacity);
    }
    assert_eq!(
        rpcs(&fake),
        3,
        "a denial that time cannot lift is never cached"
    );
}

#[tokio::test]
async fn the_cache_can_be_turned_off() {
    let fake = Fake::new(1, Duration::from_secs(60));
    let addr = serve_tcp(&fake, None).await;
    let client = Client::builder(format!("http://{addr}"))
        .clock(clock_of(&fake))
        .deny_cache(0)
        .build()
        .expect("valid address");
    for _ in 0..4 {
        client
            .check(&Check::named("api", "k"))
            .await
            .expect("decided");
    }
    assert_eq!(rpcs(&fake), 4);
}
