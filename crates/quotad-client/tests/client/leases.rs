//! Leases, against a fake quotad on a clock the test drives: what is
//! decided locally, what is asked, and when a lease stops being spent.

use std::sync::Arc;
use std::time::Duration;

use quotad_client::{
    Check, Client, Clock, DEFAULT_LEASE_MARGIN, Decision, FailurePolicy, LeaseOptions, LeaseTerms,
    Reason,
};
use tonic::Status;

use crate::fake::{Fake, LeaseCall, NOON, clock_of, serve_tcp, until};

const MINUTE: Duration = Duration::from_secs(60);

fn terms(max_units: u64, min_units: u64, max_ttl: Duration) -> LeaseTerms {
    LeaseTerms::try_new(max_units, min_units, max_ttl).expect("valid terms")
}

/// A client of `fake` with leases of `want` units, on the fake's clock.
async fn client(fake: &Arc<Fake>, want: u64) -> Client {
    client_with(fake, LeaseOptions::try_new(want).expect("valid")).await
}

async fn client_with(fake: &Arc<Fake>, options: LeaseOptions) -> Client {
    let addr = serve_tcp(fake, None).await;
    Client::builder(format!("http://{addr}"))
        .deadline(Duration::from_secs(30))
        .clock(clock_of(fake))
        .leases(options)
        .build()
        .expect("valid address")
}

async fn check(client: &Client, key: &str) -> Decision {
    client
        .check(&Check::named("api", key))
        .await
        .expect("decided")
}

/// Sends the first check of `key` (decided by the server) and waits for
/// the lease acquired behind it.
async fn acquire(fake: &Fake, client: &Client, key: &str) -> LeaseCall {
    let calls = fake.leases().len();
    let acquired = client.lease_stats().acquired;
    assert!(check(client, key).await.allowed);
    until("the lease is granted and held", || {
        fake.leases().len() == calls + 1 && client.lease_stats().acquired == acquired + 1
    })
    .await;
    fake.leases().pop().expect("one lease call")
}

#[tokio::test]
async fn checks_covered_by_a_lease_are_admitted_locally_without_a_call() {
    let fake = Fake::leasing(1_000, MINUTE, terms(100, 1, Duration::from_secs(10)));
    let client = client(&fake, 10).await;
    let call = acquire(&fake, &client, "k").await;
    assert_eq!((call.want, call.settle.clone()), (10, None));
    assert_eq!(call.granted().map(|l| l.units), Some(10));
    assert_eq!(fake.checks(), 1, "the first check went to quotad at once");

    for remaining in [9, 8, 7, 6] {
        let d = check(&client, "k").await;
        assert!(d.allowed);
        assert_eq!(d.reason, Reason::WithinLimit);
        assert_eq!((d.remaining, d.limit), (remaining, 1_000));
    }
    assert_eq!(fake.checks(), 1, "no call for a local admission");
    assert_eq!(fake.leases().len(), 1, "not half spent yet");
    // The lease was charged when granted: quotad counts 1 + 10.
    assert_eq!(fake.peek("k", 1).remaining, 1_000 - 11);
    let stats = client.lease_stats();
    assert_eq!((stats.local_admissions, stats.acquired), (4, 1));
}

#[tokio::test]
async fn a_lease_half_spent_is_renewed_with_what_was_spent_and_spending_goes_on() {
    let fake = Fake::leasing(1_000, MINUTE, terms(100, 1, Duration::from_secs(10)));
    let client = client(&fake, 10).await;
    let first = acquire(&fake, &client, "k").await;
    let first_id = first.granted().expect("granted").lease_id.clone();
    for _ in 0..5 {
        assert!(check(&client, "k").await.allowed);
    }
    until("the renewal is answered", || {
        fake.leases().len() == 2 && client.lease_stats().renewed == 1
    })
    .await;
    let renewal = fake.leases().pop().expect("the renewal");
    // The lease held is spent on while its successor is asked for: the
    // renewal settles nothing, so no failure of it can leave a settled
    // lease in use.
    assert_eq!(renewal.settle, None);
    assert_eq!(renewal.want, 10);
    let answer = renewal.answer.clone().expect("answered");
    assert_eq!(answer.lease.map(|l| l.units), Some(10));

    let checks = fake.checks();
    let d = check(&client, "k").await;
    assert_eq!(d.remaining, 9, "spent from the new lease");
    assert_eq!(fake.checks(), checks);
    // 1 direct check, the first lease (5 spent, 5 not yet returned), 10 of
    // the second held.
    assert_eq!(fake.peek("k", 1).remaining, 1_000 - 21);
    // The stopped lease is settled with the next call: here, at shutdown.
    client.shutdown().await;
    let settles: Vec<_> = fake
        .leases()
        .iter()
        .filter_map(|c| c.settle.clone())
        .collect();
    assert!(settles.contains(&(first_id, 5)), "{settles:?}");
    assert_eq!(client.lease_stats().returned_units, 5 + 9);
    // 1 direct check, 5 of the first lease and 1 of the second spent.
    assert_eq!(fake.peek("k", 1).remaining, 1_000 - 7);
}

#[tokio::test]
async fn a_lease_is_renewed_at_half_its_ttl_though_little_was_spent() {
    let fake = Fake::leasing(1_000, MINUTE, terms(100, 1, Duration::from_secs(10)));
    let client = client(&fake, 10).await;
    let first = acquire(&fake, &client, "k").await;
    let first_id = first.granted().expect("granted").lease_id.clone();
    assert!(check(&client, "k").await.allowed);
    fake.clock.advance(Duration::from_millis(4_999));
    assert!(check(&client, "k").await.allowed);
    assert_eq!(fake.leases().len(), 1);
    fake.clock.advance(Duration::from_millis(1));
    assert!(check(&client, "k").await.allowed);
    until("renewed", || client.lease_stats().renewed == 1).await;
    let renewal = fake.leases().pop().expect("the renewal");
    assert_eq!(renewal.settle, None, "the lease held is spent on meanwhile");
    client.shutdown().await;
    let settles: Vec<_> = fake
        .leases()
        .iter()
        .filter_map(|c| c.settle.clone())
        .collect();
    assert!(settles.contains(&(first_id, 3)), "{settles:?}");
}

#[tokio::test]
async fn a_direct_answer_sends_each_check_to_quotad_until_the_back_off_ends() {
    // A fair share of the 9 units left is below the minimum of 20.
    let fake = Fake::leasing(10, MINUTE, terms(100, 20, Duration::from_secs(10)));
    let client = client(&fake, 50).await;
    assert!(check(&client, "k").await.allowed);
    until("direct", || client.lease_stats().direct == 1).await;
    assert!(fake.leases()[0].answer.as_ref().expect("answered").direct);
    for _ in 0..3 {
        check(&client, "k").await;
    }
    assert_eq!(fake.checks(), 4, "each check went to quotad");
    assert_eq!(
        fake.leases().len(),
        1,
        "no lease asked for within the back-off"
    );

    fake.clock.advance(Duration::from_secs(1));
    check(&client, "k").await;
    until("asked again", || fake.leases().len() == 2).await;
    assert_eq!(client.lease_stats().held, 0);
}

#[tokio::test]
async fn a_policy_quotad_will_not_lease_is_remembered_for_every_key() {
    let fake = Fake::new(1_000, MINUTE);
    let client = client(&fake, 10).await;
    assert!(check(&client, "a").await.allowed);
    until("refused", || client.lease_stats().not_leasable == 1).await;
    assert_eq!(
        fake.leases()[0].answer,
        Err(tonic::Code::InvalidArgument),
        "no lease settings"
    );
    for key in ["a", "a", "b", "c"] {
        assert!(check(&client, key).await.allowed);
    }
    assert_eq!(fake.checks(), 5);
    assert_eq!(fake.leases().len(), 1, "asked once for the policy");
}

#[tokio::test]
async fn a_refusal_naming_the_key_stops_leasing_for_that_key_only() {
    let fake = Fake::leasing(1_000, MINUTE, terms(100, 1, Duration::from_secs(10)));
    let client = client(&fake, 10).await;
    // quotad refuses the key itself (here: empty), for the check and for
    // the lease the check started.
    let refused = client.check(&Check::named("api", "")).await;
    assert!(refused.is_err(), "an empty key is refused: {refused:?}");
    until("the lease call is refused", || {
        fake.leases().len() == 1 && client.lease_stats().failed == 1
    })
    .await;
    assert_eq!(fake.leases()[0].answer, Err(tonic::Code::InvalidArgument));
    let stats = client.lease_stats();
    assert_eq!(
        (stats.not_leasable, stats.failed),
        (0, 1),
        "the key, not the policy"
    );

    // The policy's other keys still lease.
    let call = acquire(&fake, &client, "k").await;
    assert_eq!(call.granted().map(|l| l.units), Some(10));
    let checks = fake.checks();
    assert!(check(&client, "k").await.allowed);
    assert_eq!(fake.checks(), checks, "admitted locally");

    // The refused key is not asked for again within the recheck.
    assert!(client.check(&Check::named("api", "")).await.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fake.leases().len(), 2, "no second call for the refused key");
}

#[tokio::test]
async fn a_refused_key_is_not_asked_for_again_for_exactly_60_s_while_other_keys_lease() {
    // An hour's window: 60 s on, "k" is far from its end (a lease is never
    // granted past the window).
    let hour = Duration::from_secs(3_600);
    let fake = Fake::leasing(1_000, hour, terms(100, 1, Duration::from_secs(10)));
    let client = client(&fake, 10).await;
    assert!(client.check(&Check::named("api", "")).await.is_err());
    until("the lease call is refused", || {
        fake.leases().len() == 1 && client.lease_stats().failed == 1
    })
    .await;

    fake.clock.advance(Duration::from_millis(59_999));
    assert!(client.check(&Check::named("api", "")).await.is_err());
    // Another key leases meanwhile; its call leaves after anything the
    // refused key's check could have started.
    let call = acquire(&fake, &client, "k").await;
    assert_eq!(call.granted().map(|l| l.units), Some(10));
    assert_eq!(
        fake.leases().len(),
        2,
        "the refused key is not asked again within 60 s"
    );

    fake.clock.advance(Duration::from_millis(1));
    assert!(client.check(&Check::named("api", "")).await.is_err());
    until("asked again at 60 s", || {
        fake.leases().len() == 3 && client.lease_stats().failed == 2
    })
    .await;
}

/// Spends `key` one check per millisecond from now until the client asks
/// quotad again; returns the instant of the last local admission, if any.
async fn spend_until_asked(fake: &Fake, client: &Client, key: &str) -> Option<u64> {
    let mut last = None;
    loop {
        let checks = fake.checks();
        let at = fake.clock.now_ms();
        check(client, key).await;
        if fake.checks() != checks {
            return last;
        }
        last = Some(at);
        fake.clock.advance(Duration::from_millis(1));
    }
}

#[tokio::test]
async fn a_lease_is_never_spent_past_its_send_time_plus_the_ttl_less_a_thousandth_and_the_margin() {
    let ttl = 1_000;
    let margin = u64::try_from(DEFAULT_LEASE_MARGIN.as_millis()).expect("5 ms");
    // (time on the way to quotad, time of the answer on the way back)
    for (transit, reply) in [(0, 0), (0, 300), (200, 300), (0, 700), (300, 690)] {
        let fake = Fake::leasing(
            1_000_000,
            MINUTE,
            terms(1_000, 1, Duration::from_millis(ttl)),
        );
        let client = client(&fake, 1_000).await;
        acquire(&fake, &client, "k").await;
        fake.set_transit(Duration::from_millis(transit));
        fake.set_lease_reply_delay(Duration::from_millis(reply));
        // Half the TTL: this spend sends the renewal, from this instant.
        fake.clock.advance(Duration::from_millis(ttl / 2));
        let sent = fake.clock.now_ms();
        assert!(check(&client, "k").await.allowed);
        until("renewed", || client.lease_stats().renewed == 1).await;
        let renewal = fake.leases().pop().expect("the renewal");
        let server_end = renewal.ends_at.expect("granted");
        assert_eq!(server_end, sent + transit + ttl);
        assert_eq!(fake.clock.now_ms(), sent + transit + reply, "answered late");
        // Later renewals find quotad unreachable: this lease is the one
        // spent to its end.
        fake.fail_leases(Some(Status::unavailable("quotad is restarting")));
        let last = spend_until_asked(&fake, &client, "k").await;
        let end = sent + ttl - ttl / 1_000 - margin;
        assert_eq!(last, Some(end - 1), "+{transit} ms / +{reply} ms");
        assert!(end < server_end, "+{transit} ms / +{reply} ms");
    }
}

#[tokio::test]
async fn a_lease_that_arrives_too_late_to_spend_goes_straight_back() {
    let fake = Fake::leasing(1_000, MINUTE, terms(100, 1, Duration::from_millis(100)));
    let client = client(&fake, 10).await;
    fake.set_lease_reply_delay(Duration::from_millis(95));
    assert!(check(&client, "k").await.allowed);
    until("returned", || client.lease_stats().returned == 1).await;
    let calls = fake.leases();
    assert_eq!(calls.len(), 2);
    let id = calls[0].granted().expect("granted").lease_id.clone();
    assert_eq!(calls[1].settle, Some((id, 0)));
    assert_eq!(calls[1].want, 0);
    assert_eq!(client.lease_stats().held, 0);
    assert_eq!(fake.peek("k", 1).remaining, 1_000 - 1);
}

#[tokio::test]
async fn while_quotad_is_unreachable_a_lease_is_spent_to_its_end_then_the_failure_policy_answers() {
    let fake = Fake::leasing(1_000, MINUTE, terms(1_000, 1, Duration::from_secs(2)));
    let client = client(&fake, 1_000).await;
    let client = client.with_failure_policy(FailurePolicy::FailClosed);
    acquire(&fake, &client, "k").await;
    fake.take_down("k");
    fake.fail_leases(Some(Status::unavailable("state store unavailable")));
    let end = NOON + 2_000 - 2 - 5;
    let mut local = 0;
    while fake.clock.now_ms() < end {
        let d = check(&client, "k").await;
        assert!(
            d.allowed && d.reason == Reason::WithinLimit,
            "at {}: {d:?}",
            fake.clock.now_ms()
        );
        local += 1;
        if fake.clock.now_ms() >= NOON + 1_000 {
            // Half the TTL: the renewal fails, and what is held is spent on.
            until("the renewal failed", || client.lease_stats().failed == 1).await;
        }
        fake.clock.advance(Duration::from_millis(20));
    }
    assert_eq!(local, 100);
    let d = check(&client, "k").await;
    assert_eq!(d.reason, Reason::FailClosed, "past the lease's end");
}

#[tokio::test]
async fn shutdown_returns_the_unspent_units_with_what_was_spent() {
    let fake = Fake::leasing(1_000, MINUTE, terms(100, 1, Duration::from_secs(10)));
    let client = client(&fake, 10).await;
    let id = acquire(&fake, &client, "k")
        .await
        .granted()
        .expect("granted")
        .lease_id
        .clone();
    for _ in 0..3 {
        check(&client, "k").await;
    }
    client.shutdown().await;
    let back = fake.leases().pop().expect("the return");
    assert_eq!((back.settle, back.want), (Some((id, 3)), 0));
    assert_eq!(back.answer.expect("answered").returned, 7);
    assert_eq!(fake.peek("k", 1).remaining, 1_000 - 4);
    let stats = client.lease_stats();
    assert_eq!(
        (stats.returned, stats.returned_units, stats.held),
        (1, 7, 0)
    );

    let checks = fake.checks();
    check(&client, "k").await;
    assert_eq!(
        fake.checks(),
        checks + 1,
        "after shutdown, checks go to quotad"
    );
    assert_eq!(fake.leases().len(), 2, "and nothing is leased");
}

#[tokio::test]
async fn dropping_the_last_handle_returns_the_lease_on_a_task() {
    let fake = Fake::leasing(1_000, MINUTE, terms(100, 1, Duration::from_secs(10)));
    let client = client(&fake, 10).await;
    acquire(&fake, &client, "k").await;
    check(&client, "k").await;
    drop(client);
    until("returned", || fake.leases().len() == 2).await;
    let back = fake.leases().pop().expect("the return");
    assert_eq!((back.settle.map(|(_, s)| s), back.want), (Some(1), 0));
    assert_eq!(fake.peek("k", 1).remaining, 1_000 - 2);
}

/// 16 tasks, `per_task` checks each, of one key; returns how many were
/// admitted locally (those the server did not decide).
async fn hammer(fake: &Arc<Fake>, client: &Client, key: &str, per_task: usize) -> usize {
    let decided = fake.decided().len();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let client = client.clone();
            let key = key.to_owned();
            tokio::spawn(async move {
                for _ in 0..per_task {
                    client
                        .check(&Check::named("api", key.clone()))
                        .await
                        .expect("decided");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("no task panicked");
    }
    16 * per_task - (fake.decided().len() - decided)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_tasks_on_one_key_admit_exactly_the_leases_units_locally() {
    const UNITS: u64 = 64;
    let fake = Fake::leasing(1_000_000, MINUTE, terms(UNITS, 1, Duration::from_secs(10)));
    let client = client(&fake, UNITS).await;
    for round in 0..20 {
        let key = format!("k{round}");
        acquire(&fake, &client, &key).await;
        // The renewal (half spent) fails and puts the lease back: the one
        // lease granted is spent to its last unit, and no further.
        fake.fail_leases(Some(Status::unavailable("no renewals this round")));
        let before = client.lease_stats().local_admissions;
        let mut local = hammer(&fake, &client, &key, 20).await;
        until("the renewal failed", || {
            client.lease_stats().failed == round + 1
        })
        .await;
        local += hammer(&fake, &client, &key, 20).await;
        assert_eq!(local as u64, UNITS, "round {round}");
        assert_eq!(client.lease_stats().local_admissions - before, UNITS);
        fake.fail_leases(None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn under_contention_every_local_admission_is_reported_spent_exactly_once() {
    let fake = Fake::leasing(1_000_000, MINUTE, terms(32, 1, Duration::from_secs(10)));
    for round in 0..10 {
        let client = client(&fake, 32).await;
        let key = format!("k{round}");
        let before = fake.leases().len();
        acquire(&fake, &client, &key).await;
        let local = hammer(&fake, &client, &key, 50).await;
        client.shutdown().await;
        let calls = &fake.leases()[before..];
        let spent: u64 = calls
            .iter()
            .filter_map(|c| c.settle.as_ref().map(|(_, s)| *s))
            .sum();
        assert_eq!(spent, local as u64, "round {round}");
        let granted = calls.iter().filter(|c| c.granted().is_some()).count();
        let settled = calls.iter().filter(|c| c.settle.is_some()).count();
        assert_eq!(granted, settled, "round {round}: every lease settled once");
        assert!(granted > 1, "round {round}: renewed under load");
    }
}

#[tokio::test]
async fn inline_policies_with_terms_ask_for_leases_and_without_terms_never_do() {
    let fake = Fake::leasing(1_000, MINUTE, terms(100, 1, Duration::from_secs(10)));
    let client = client(&fake, 10).await;
    let policy =
        quotad_core::Policy::try_new(quotad_core::Algorithm::FixedWindow, 10, MINUTE, None)
            .expect("valid");
    // The fake decides named policies only: both checks are refused, but
    // only the one with terms asks for a lease.
    let _ = client.check(&Check::inline(policy, "k")).await;
    assert!(fake.leases().is_empty());
    let _ = client
        .check(&Check::inline(policy, "k").lease_terms(terms(5, 1, MINUTE)))
        .await;
    until("asked", || fake.leases().len() == 1).await;
}

#[tokio::test]
async fn a_check_of_cost_zero_goes_to_quotad_even_with_a_lease_held() {
    let fake = Fake::leasing(1_000, MINUTE, terms(100, 1, Duration::from_secs(10)));
    let client = client(&fake, 10).await;
    acquire(&fake, &client, "k").await;
    let checks = fake.checks();
    let admitted = client.lease_stats().local_admissions;
    // quotad refuses a cost of 0 (INVALID_ARGUMENT); a lease must not
    // admit it for nothing.
    let _ = client.check(&Check::named("api", "k").cost(0)).await;
    assert_eq!(fake.checks(), checks + 1, "the check went to quotad");
    assert_eq!(client.lease_stats().local_admissions, admitted);
}
