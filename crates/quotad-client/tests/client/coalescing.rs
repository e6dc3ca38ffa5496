//! Coalescing: what the server receives, and what each caller gets.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use quotad_client::{
    BATCH_REFUSAL_BACKOFF, Check, Client, ClientBuilder, Coalescing, DEFAULT_MAX_BATCH_BYTES,
    Decision, Error, FailurePolicy, MAX_RESENT_ALONE, Reason,
};
use tokio::task::JoinHandle;
use tonic::{Code, Status};

use crate::fake::{Call, Fake, clock_of, serve_tcp, until};

const LONG: Duration = Duration::from_secs(30);

/// Settings for a client of `fake` with `slots` in-flight slots and no
/// deny cache (so every check reaches the server).
async fn builder(fake: &Arc<Fake>, slots: usize) -> ClientBuilder {
    let addr = serve_tcp(fake, None).await;
    Client::builder(format!("http://{addr}"))
        .deadline(LONG)
        .coalescing(Coalescing::try_new(slots, 1_000, DEFAULT_MAX_BATCH_BYTES).expect("valid"))
        .deny_cache(0)
}

/// A client of `fake` as [`builder`] sets it up.
async fn client(fake: &Arc<Fake>, slots: usize) -> Client {
    builder(fake, slots).await.build().expect("valid address")
}

fn spawn_check(client: &Client, check: Check) -> JoinHandle<Result<Decision, Error>> {
    let client = client.clone();
    tokio::spawn(async move { client.check(&check).await })
}

/// Holds the server and puts one check in flight on the only slot.
async fn occupy_the_slot(fake: &Arc<Fake>, client: &Client) -> JoinHandle<Result<Decision, Error>> {
    occupy_the_slot_with(fake, client, "first").await
}

/// Holds the server and puts a check of `key` in flight on the only slot.
async fn occupy_the_slot_with(
    fake: &Arc<Fake>,
    client: &Client,
    key: &str,
) -> JoinHandle<Result<Decision, Error>> {
    fake.hold();
    let sent = fake.calls().len();
    let first = spawn_check(client, Check::named("api", key));
    until("the check reaches the server", || {
        fake.calls().len() == sent + 1
    })
    .await;
    first
}

/// Queues `checks` one after another (so their order is known).
async fn queue(
    client: &Client,
    checks: impl IntoIterator<Item = Check>,
) -> Vec<JoinHandle<Result<Decision, Error>>> {
    let mut handles = Vec::new();
    for check in checks {
        let queued = client.queued_checks();
        handles.push(spawn_check(client, check));
        until("the check is queued", || {
            client.queued_checks() == queued + 1
        })
        .await;
    }
    handles
}

/// Lets the check that held the slot through (it is allowed), then the
/// outcomes of the queued ones, in order.
async fn release(
    fake: &Fake,
    first: JoinHandle<Result<Decision, Error>>,
    waiting: Vec<JoinHandle<Result<Decision, Error>>>,
) -> Vec<Result<Decision, Error>> {
    fake.open();
    assert!(outcome(first).await.expect("decided").allowed);
    let mut outcomes = Vec::new();
    for handle in waiting {
        outcomes.push(outcome(handle).await);
    }
    outcomes
}

async fn outcome(handle: JoinHandle<Result<Decision, Error>>) -> Result<Decision, Error> {
    handle.await.expect("the check task did not panic")
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_waiting_while_one_is_in_flight_leave_as_one_batch_and_each_gets_its_own_decision() {
    for _ in 0..5 {
        let fake = Fake::new(100, Duration::from_secs(60));
        let client = client(&fake, 1).await;
        let first = occupy_the_slot(&fake, &client).await;

        // Each caller has its own key and cost, so its decision is its own:
        // remaining = 100 - cost.
        let waiting: Vec<_> = (1..=10u64)
            .map(|cost| spawn_check(&client, Check::named("api", format!("k{cost}")).cost(cost)))
            .collect();
        until("ten checks queue", || client.queued_checks() == 10).await;
        assert_eq!(
            fake.calls().len(),
            1,
            "nothing else left while the slot was busy"
        );
        fake.open();

        assert!(outcome(first).await.expect("decided").allowed);
        for (cost, handle) in (1..=10u64).zip(waiting) {
            let decision = outcome(handle).await.expect("decided");
            assert!(decision.allowed);
            assert_eq!(decision.remaining, 100 - cost, "caller k{cost} got its own");
        }
        let calls = fake.calls();
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(calls[0], Call::Check("first".into()));
        let Call::Batch(mut batch) = calls[1].clone() else {
            panic!("the waiting checks left as one batch: {calls:?}");
        };
        batch.sort_by_key(|k| k[1..].parse::<u64>().expect("numbered key"));
        assert_eq!(batch, keys("k", 11)[1..].to_vec());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_check_goes_out_at_once_on_its_own() {
    let fake = Fake::new(100, Duration::from_secs(60));
    let client = client(&fake, 2).await;
    for key in keys("seq", 5) {
        client
            .check(&Check::named("api", key))
            .await
            .expect("decided");
    }
    let expected: Vec<Call> = keys("seq", 5).into_iter().map(Call::Check).collect();
    assert_eq!(fake.calls(), expected, "one Check each, never a batch");

    // With one slot busy, a second check still has a free slot: it is sent
    // while the first is held, not queued behind it.
    fake.hold();
    let first = spawn_check(&client, Check::named("api", "held"));
    let second = spawn_check(&client, Check::named("api", "free-slot"));
    until("both reach the server while it holds them", || {
        fake.calls().len() == 7
    })
    .await;
    assert_eq!(client.queued_checks(), 0);
    fake.open();
    assert!(outcome(first).await.expect("decided").allowed);
    assert!(outcome(second).await.expect("decided").allowed);
    assert!(
        fake.calls()[5..]
            .iter()
            .all(|c| matches!(c, Call::Check(_)))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_whose_deadline_passes_in_the_queue_gets_its_failure_policy_and_is_never_sent() {
    for _ in 0..3 {
        let fake = Fake::new(100, Duration::from_secs(60));
        let client = client(&fake, 1).await;
        let first = occupy_the_slot(&fake, &client).await;

        let impatient = client
            .with_deadline(Duration::from_millis(50))
            .with_failure_policy(FailurePolicy::FailClosed);
        let hurried = queue(&impatient, [Check::named("api", "impatient")]).await;
        let patient = queue(&client, [Check::named("api", "patient")]).await;

        // Decided while the server still holds everything.
        for handle in hurried {
            let decision = outcome(handle).await.expect("the failure policy answers");
            assert_eq!(decision.reason, Reason::FailClosed);
        }
        assert_eq!(client.queued_checks(), 1, "only the patient check waits");
        for outcome in release(&fake, first, patient).await {
            assert!(outcome.expect("decided").allowed);
        }
        assert_eq!(
            fake.calls(),
            vec![Call::Check("first".into()), Call::Check("patient".into())],
            "the impatient check was never sent"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_whose_deadline_passes_in_flight_gets_its_own_failure_policy_at_its_deadline() {
    let fake = Fake::new(100, Duration::from_secs(60));
    let client = client(&fake, 1).await;
    fake.hold();
    let open = client
        .with_deadline(Duration::from_millis(50))
        .with_failure_policy(FailurePolicy::FailOpen);
    let decision = open
        .check(&Check::named("api", "held"))
        .await
        .expect("the failure policy answers");
    assert_eq!(decision.reason, Reason::FailOpen);
    let error = client
        .with_deadline(Duration::from_millis(50))
        .check(&Check::named("api", "held-too"))
        .await
        .expect_err("the default failure policy is an error");
    // The client's timer or the server's (`grpc-timeout`) ends the call.
    assert!(
        matches!(&error, Error::Unavailable(s) if matches!(s.code(), Code::DeadlineExceeded | Code::Cancelled)),
        "{error:?}"
    );
    fake.open();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_refused_in_a_batch_gets_its_own_error_and_the_others_are_decided_alone() {
    for _ in 0..3 {
        let fake = Fake::new(100, Duration::from_secs(60));
        let client = client(&fake, 1).await;
        let first = occupy_the_slot(&fake, &client).await;
        let waiting = queue(
            &client,
            [
                Check::named("api", "good"),
                Check::named("nope", "unknown-policy"),
                Check::named("api", ""),
                Check::named("api", "also-good").cost(4),
            ],
        )
        .await;
        let outcomes = release(&fake, first, waiting).await;
        assert_eq!(outcomes[0].as_ref().expect("decided").remaining, 99);
        match &outcomes[1] {
            Err(Error::Rejected(status)) => {
                assert_eq!(status.code(), Code::NotFound);
                assert_eq!(status.message(), "policy_name: no policy named \"nope\"");
            }
            other => panic!("the unknown policy's own error: {other:?}"),
        }
        match &outcomes[2] {
            Err(Error::Rejected(status)) => {
                assert_eq!(status.code(), Code::InvalidArgument);
                assert_eq!(status.message(), "key: must not be empty");
            }
            other => panic!("the empty key's own error: {other:?}"),
        }
        assert_eq!(outcomes[3].as_ref().expect("decided").remaining, 96);

        // The refused batch consumed nothing: each good check counted once.
        assert_eq!(fake.peek("good", 1).remaining, 99);
        assert_eq!(fake.peek("also-good", 1).remaining, 96);
        let calls = fake.calls();
        assert_eq!(
            calls[1],
            Call::Batch(vec![
                "good".into(),
                "unknown-policy".into(),
                String::new(),
                "also-good".into()
            ])
        );
        let mut resent: Vec<_> = calls[2..].to_vec();
        resent.sort_by_key(|c| format!("{c:?}"));
        assert_eq!(
            resent,
            vec![
                Call::Check(String::new()),
                Call::Check("also-good".into()),
                Call::Check("good".into()),
            ],
            "the others went again, alone; the named offender did not"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_batch_gives_each_caller_its_own_failure_policy_and_is_not_sent_again() {
    let fake = Fake::new(100, Duration::from_secs(60));
    let client = client(&fake, 1).await;
    fake.fail_batches(Status::unavailable("backend down"));
    let first = occupy_the_slot(&fake, &client).await;
    let open = client.with_failure_policy(FailurePolicy::FailOpen);
    let closed = client.with_failure_policy(FailurePolicy::FailClosed);
    let mut waiting = queue(&open, [Check::named("api", "open")]).await;
    waiting.extend(queue(&closed, [Check::named("api", "closed")]).await);
    waiting.extend(queue(&client, [Check::named("api", "error")]).await);
    let outcomes = release(&fake, first, waiting).await;
    assert_eq!(
        outcomes[0].as_ref().expect("fails open").reason,
        Reason::FailOpen
    );
    assert_eq!(
        outcomes[1].as_ref().expect("fails closed").reason,
        Reason::FailClosed
    );
    assert!(matches!(&outcomes[2], Err(Error::Unavailable(s)) if s.code() == Code::Unavailable));
    assert_eq!(
        fake.calls(),
        vec![
            Call::Check("first".into()),
            Call::Batch(vec!["open".into(), "closed".into(), "error".into()]),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_the_backend_failed_is_sent_again_alone_and_gets_its_callers_failure_policy_and_the_others_their_decisions()
 {
    let fake = Fake::new(100, Duration::from_secs(60));
    let client = client(&fake, 1).await;
    fake.take_down("down-open");
    fake.take_down("down-error");
    let first = occupy_the_slot(&fake, &client).await;
    let open = client.with_failure_policy(FailurePolicy::FailOpen);
    let mut waiting = queue(&open, [Check::named("api", "down-open")]).await;
    waiting.extend(queue(&client, [Check::named("api", "down-error")]).await);
    waiting.extend(queue(&client, [Check::named("api", "up")]).await);
    let outcomes = release(&fake, first, waiting).await;
    let calls = fake.calls();
    assert_eq!(
        calls[..2],
        [
            Call::Check("first".into()),
            Call::Batch(vec!["down-open".into(), "down-error".into(), "up".into()]),
        ]
    );
    let mut resent = calls[2..].to_vec();
    resent.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(
        resent,
        vec![
            Call::Check("down-error".into()),
            Call::Check("down-open".into())
        ],
        "the items quotad could not decide went again, alone; the decided one did not"
    );
    // As each was sent alone: a lone check of a failed item answers
    // UNAVAILABLE, which the caller's failure policy turns into its
    // outcome.
    assert_eq!(
        outcomes[0].as_ref().expect("fails open").reason,
        Reason::FailOpen
    );
    assert!(matches!(&outcomes[1], Err(Error::Unavailable(s)) if s.code() == Code::Unavailable));
    let up = outcomes[2].as_ref().expect("decided");
    assert_eq!((up.allowed, up.reason), (true, Reason::WithinLimit));
    assert!(matches!(
        open.check(&Check::named("api", "down-error")).await,
        Ok(d) if d.reason == Reason::FailOpen
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_that_alone_answers_internal_gets_internal_when_coalesced_not_its_failure_policy() {
    for _ in 0..3 {
        let fake = Fake::new(100, Duration::from_secs(60));
        let client = client(&fake, 1).await;
        fake.corrupt("corrupt");
        let open = client.with_failure_policy(FailurePolicy::FailOpen);
        let first = occupy_the_slot(&fake, &client).await;
        let mut waiting = queue(&open, [Check::named("api", "corrupt")]).await;
        waiting.extend(queue(&open, [Check::named("api", "up")]).await);
        let outcomes = release(&fake, first, waiting).await;

        let alone = open.check(&Check::named("api", "corrupt")).await;
        let Err(Error::Rejected(alone)) = alone else {
            panic!("a lone check of corrupt state is INTERNAL: {alone:?}");
        };
        assert_eq!(alone.code(), Code::Internal);
        match &outcomes[0] {
            Err(Error::Rejected(status)) => {
                assert_eq!(status.code(), alone.code());
                assert_eq!(status.message(), alone.message());
            }
            other => panic!("the lone check's INTERNAL, not FailOpen: {other:?}"),
        }
        let up = outcomes[1].as_ref().expect("decided");
        assert_eq!((up.allowed, up.remaining), (true, 99));
        assert_eq!(
            fake.calls(),
            vec![
                Call::Check("first".into()),
                Call::Batch(vec!["corrupt".into(), "up".into()]),
                Call::Check("corrupt".into()),
                Call::Check("corrupt".into()),
            ],
            "only the undecided item went again, then the lone check"
        );
        assert_eq!(fake.peek("up", 1).remaining, 99, "up counted once");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_decisions_equal_the_decisions_of_the_same_sequence_sent_one_by_one() {
    for round in 0..5 {
        // 4 keys x costs 1..=10: 55 units a key against a limit of 20, so
        // the order decides who is admitted.
        let fake = Fake::new(20, Duration::from_secs(60));
        let client = client(&fake, 2).await;
        let checks: Vec<Check> = (0..4)
            .flat_map(|k| (1..=10u64).map(move |c| Check::named("api", format!("k{k}")).cost(c)))
            .collect();
        let handles: Vec<_> = checks
            .iter()
            .map(|check| spawn_check(&client, check.clone()))
            .collect();
        let mut got = HashMap::new();
        for (check, handle) in checks.iter().zip(handles) {
            let decision = outcome(handle).await.expect("decided");
            got.insert((check.key().to_owned(), check.cost_units()), decision);
        }

        // The same sequence, in the order the server decided it, one Check
        // at a time with coalescing off, on a fresh server.
        let decided = fake.decided();
        assert_eq!(decided.len(), checks.len());
        let replay = Fake::new(20, Duration::from_secs(60));
        let addr = serve_tcp(&replay, None).await;
        let one_by_one = Client::builder(format!("http://{addr}"))
            .deadline(LONG)
            .coalescing(Coalescing::off())
            .deny_cache(0)
            .build()
            .expect("valid address");
        for d in &decided {
            let alone = one_by_one
                .check(&Check::named("api", d.key.clone()).cost(d.cost))
                .await
                .expect("decided");
            assert_eq!(alone, got[&(d.key.clone(), d.cost)], "round {round}: {d:?}");
            assert_eq!(alone, d.decision);
        }
        assert!(replay.calls().iter().all(|c| matches!(c, Call::Check(_))));
        if round == 0 {
            // Forty checks on two slots: some had to share a batch.
            let batches = fake
                .calls()
                .iter()
                .filter(|c| matches!(c, Call::Batch(_)))
                .count();
            assert!(batches > 0, "{:?}", fake.calls());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_respect_the_item_bound() {
    let fake = Fake::new(100, Duration::from_secs(60));
    let addr = serve_tcp(&fake, None).await;
    let client = Client::builder(format!("http://{addr}"))
        .deadline(LONG)
        .coalescing(Coalescing::try_new(1, 3, DEFAULT_MAX_BATCH_BYTES).expect("valid"))
        .deny_cache(0)
        .build()
        .expect("valid address");
    let first = occupy_the_slot(&fake, &client).await;
    let waiting = queue(
        &client,
        keys("b", 7).into_iter().map(|k| Check::named("api", k)),
    )
    .await;
    for outcome in release(&fake, first, waiting).await {
        assert!(outcome.expect("decided").allowed);
    }
    let calls = fake.calls();
    assert_eq!(
        calls[1..],
        [
            Call::Batch(keys("b", 3)),
            Call::Batch(keys("b", 7)[3..6].to_vec()),
            Call::Check("b6".into()),
        ],
        "batches of at most three, in queue order, one slot at a time"
    );
}

/// Holds every call, queues `checks` behind one in flight, then lets the
/// first through while the batch the queue leaves as is held at the door.
async fn hold_a_batch_of(
    fake: &Arc<Fake>,
    queued: Vec<(Client, Check)>,
) -> Vec<JoinHandle<Result<Decision, Error>>> {
    let handle = queued[0].0.clone();
    let first = occupy_the_slot(fake, &handle).await;
    let mut waiting = Vec::new();
    for (client, check) in queued {
        waiting.extend(queue(&client, [check]).await);
    }
    fake.hold_batches();
    fake.open();
    assert!(outcome(first).await.expect("decided").allowed);
    until("the batch reaches the server", || {
        fake.calls().iter().any(|c| matches!(c, Call::Batch(_)))
    })
    .await;
    waiting
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_ends_at_its_earliest_deadline_so_no_caller_is_counted_after_its_answer() {
    let fake = Fake::new(100, Duration::from_secs(60));
    let client = client(&fake, 1).await;
    let impatient = client
        .with_deadline(Duration::from_millis(300))
        .with_failure_policy(FailurePolicy::FailOpen);
    let waiting = hold_a_batch_of(
        &fake,
        vec![
            (impatient, Check::named("api", "impatient")),
            (client.clone(), Check::named("api", "patient")),
        ],
    )
    .await;
    let mut outcomes = Vec::new();
    for handle in waiting {
        outcomes.push(outcome(handle).await);
    }
    assert_eq!(
        outcomes[0].as_ref().expect("its failure policy").reason,
        Reason::FailOpen,
        "answered at its own deadline, as admitted without counting"
    );
    assert!(
        matches!(&outcomes[1], Err(Error::Unavailable(_))),
        "the batch's deadline is its earliest: {:?}",
        outcomes[1]
    );
    until("the server drops the abandoned batch", || {
        fake.calls()
            .contains(&Call::Abandoned(vec!["impatient".into(), "patient".into()]))
    })
    .await;
    fake.open_batches();
    assert!(
        fake.decided().iter().all(|d| d.key == "first"),
        "nothing of the batch was counted: {:?}",
        fake.decided()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_callers_all_left_is_dropped_and_counts_nothing() {
    let fake = Fake::new(100, Duration::from_secs(60));
    let client = client(&fake, 1).await;
    let waiting = hold_a_batch_of(
        &fake,
        vec![
            (client.clone(), Check::named("api", "gone-a")),
            (client.clone(), Check::named("api", "gone-b")),
        ],
    )
    .await;
    for handle in &waiting {
        handle.abort();
    }
    until("the server drops the abandoned batch", || {
        fake.calls()
            .contains(&Call::Abandoned(vec!["gone-a".into(), "gone-b".into()]))
    })
    .await;
    fake.open_batches();
    assert!(fake.decided().iter().all(|d| d.key == "first"));
    // The slot came back: the next check goes out at once.
    let next = client.check(&Check::named("api", "next")).await;
    assert!(next.expect("decided").allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_caller_that_leaves_is_taken_off_the_queue_and_never_sent() {
    let fake = Fake::new(100, Duration::from_secs(60));
    let client = client(&fake, 1).await;
    let first = occupy_the_slot(&fake, &client).await;
    let waiting = queue(&client, [Check::named("api", "leaves")]).await;
    assert_eq!(client.queued_checks(), 1);
    waiting[0].abort();
    until("the check leaves the queue", || client.queued_checks() == 0).await;
    fake.open();
    assert!(outcome(first).await.expect("decided").allowed);
    let next = client.check(&Check::named("api", "next")).await;
    assert!(next.expect("decided").allowed);
    assert_eq!(
        fake.calls(),
        vec![Call::Check("first".into()), Call::Check("next".into())]
    );
}

/// Has the fake refuse `CheckBatch` with `status`, and one batch (of "a"
/// and "b", behind "first") refused; its checks are sent again alone.
async fn have_a_batch_refused(fake: &Arc<Fake>, client: &Client, status: Status) {
    fake.fail_batches(status);
    let first = occupy_the_slot(fake, client).await;
    let waiting = queue(client, [Check::named("api", "a"), Check::named("api", "b")]).await;
    for outcome in release(fake, first, waiting).await {
        assert!(outcome.expect("re-sent alone").allowed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_refused_batches_as_such_sends_its_checks_alone_for_a_while() {
    let fake = Fake::new(100, Duration::from_secs(60));
    let client = client(&fake, 1).await;
    have_a_batch_refused(
        &fake,
        &client,
        Status::permission_denied("quotad.v1.Quota/CheckBatch is not allowed for this client"),
    )
    .await;
    // For the back-off nothing queues behind a busy slot: every check goes
    // alone.
    fake.hold();
    let held = spawn_check(&client, Check::named("api", "held"));
    let alone = spawn_check(&client, Check::named("api", "alone"));
    until("both reach the server", || {
        fake.calls()
            .iter()
            .filter(|c| matches!(c, Call::Check(_)))
            .count()
            == 5
    })
    .await;
    fake.open();
    assert!(outcome(held).await.expect("decided").allowed);
    assert!(outcome(alone).await.expect("decided").allowed);
    assert_eq!(
        fake.calls()
            .iter()
            .filter(|c| matches!(c, Call::Batch(_)))
            .count(),
        1,
        "one refused batch, then none: {:?}",
        fake.calls()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_resumes_after_the_back_off_once_a_proxy_stops_refusing_check_batch() {
    let fake = Fake::new(100, Duration::from_secs(60));
    // The back-off runs on the client's clock: the fake's, which the test
    // advances.
    let client = builder(&fake, 1)
        .await
        .clock(clock_of(&fake))
        .build()
        .expect("valid address");
    // What tonic makes of a proxy's 404 for a path it does not route.
    have_a_batch_refused(
        &fake,
        &client,
        Status::unimplemented("grpc-status header missing, mapped from HTTP status code 404"),
    )
    .await;
    fake.accept_batches();

    // Within the back-off, a check finding the slot busy still goes alone.
    fake.clock
        .advance(BATCH_REFUSAL_BACKOFF - Duration::from_millis(1));
    let held = occupy_the_slot_with(&fake, &client, "held").await;
    let alone = spawn_check(&client, Check::named("api", "alone"));
    until("the second check reaches the server too", || {
        fake.calls().contains(&Call::Check("alone".into()))
    })
    .await;
    assert_eq!(client.queued_checks(), 0);
    for outcome in release(&fake, held, vec![alone]).await {
        assert!(outcome.expect("decided").allowed);
    }

    // Once it has passed, checks queue behind a busy slot and leave as one
    // batch again.
    fake.clock.advance(Duration::from_millis(1));
    let busy = occupy_the_slot_with(&fake, &client, "busy").await;
    let waiting = queue(
        &client,
        [Check::named("api", "c"), Check::named("api", "d")],
    )
    .await;
    for outcome in release(&fake, busy, waiting).await {
        assert!(outcome.expect("decided").allowed);
    }
    let calls = fake.calls();
    assert_eq!(
        calls.last(),
        Some(&Call::Batch(vec!["c".into(), "d".into()])),
        "{calls:?}"
    );
    assert_eq!(
        calls.iter().filter(|c| matches!(c, Call::Batch(_))).count(),
        2,
        "the refused batch and the one after the back-off: {calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_callers_that_leave_from_the_middle_are_not_in_the_batch() {
    for _ in 0..3 {
        let fake = Fake::new(100, Duration::from_secs(60));
        let client = client(&fake, 1).await;
        let first = occupy_the_slot(&fake, &client).await;
        let mut waiting = queue(
            &client,
            keys("m", 5).into_iter().map(|k| Check::named("api", k)),
        )
        .await;
        for gone in [3, 1] {
            waiting.remove(gone).abort();
        }
        until("the two leave the queue", || client.queued_checks() == 3).await;
        for outcome in release(&fake, first, waiting).await {
            assert!(outcome.expect("decided").allowed);
        }
        assert_eq!(
            fake.calls(),
            vec![
                Call::Check("first".into()),
                Call::Batch(vec!["m0".into(), "m2".into(), "m4".into()]),
            ]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_max_delay_sends_the_queue_even_while_every_slot_is_busy() {
    let fake = Fake::new(100, Duration::from_secs(60));
    let addr = serve_tcp(&fake, None).await;
    let client = Client::builder(format!("http://{addr}"))
        .deadline(LONG)
        .coalescing(
            Coalescing::try_new(1, 1_000, DEFAULT_MAX_BATCH_BYTES)
                .expect("valid")
                .max_delay(Some(Duration::from_millis(20))),
        )
        .deny_cache(0)
        .build()
        .expect("valid address");
    let first = occupy_the_slot(&fake, &client).await;
    let waiting = vec![
        spawn_check(&client, Check::named("api", "late-a")),
        spawn_check(&client, Check::named("api", "late-b")),
    ];
    // The slot stays busy; the queue leaves on its own after the delay.
    until("the queue leaves", || fake.calls().len() >= 2).await;
    assert_eq!(client.queued_checks(), 0);
    for outcome in release(&fake, first, waiting).await {
        assert!(outcome.expect("decided").allowed);
    }
    let sent: usize = fake.calls()[1..]
        .iter()
        .map(|c| match c {
            Call::Batch(keys) => keys.len(),
            _ => 1,
        })
        .sum();
    assert_eq!(sent, 2, "each late check sent once: {:?}", fake.calls());
}

#[tokio::test]
async fn coalescing_bounds_are_validated_naming_the_setting() {
    let error = Coalescing::try_new(1, 1_001, 100).expect_err("too many items");
    assert_eq!(
        error.to_string(),
        "coalescing.max_batch_items: must be between 1 and 1000 (got 1001)"
    );
}

#[tokio::test]
async fn every_call_is_counted_by_its_method() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshots = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let fake = Fake::new(100, Duration::from_secs(60));
    let client = client(&fake, 1).await;

    let first = occupy_the_slot(&fake, &client).await;
    let waiting = queue(
        &client,
        keys("q", 3).into_iter().map(|k| Check::named("api", k)),
    )
    .await;
    for outcome in release(&fake, first, waiting).await {
        assert!(outcome.expect("decided").allowed);
    }
    assert_eq!(fake.calls().len(), 2, "{:?}", fake.calls());

    // A snapshot takes the counts out of the recorder: one for both.
    let snapshot = snapshots.snapshot().into_vec();
    let calls = |method: &str| -> u64 {
        snapshot
            .iter()
            .filter(|(key, ..)| {
                key.key().name() == "quotad_client_calls_total"
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == "method" && l.value() == method)
            })
            .map(|(.., value)| match value {
                metrics_util::debugging::DebugValue::Counter(n) => *n,
                other => panic!("a counter, not {other:?}"),
            })
            .sum()
    };
    assert_eq!(calls("check"), 1, "the first check went alone");
    assert_eq!(
        calls("check_batch"),
        1,
        "the three waiting left as one batch"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_quotad_decided_none_of_is_not_sent_again_check_by_check() {
    let fake = Fake::new(100, Duration::from_secs(60));
    let client = client(&fake, 1).await;
    let keys: Vec<String> = (0..5).map(|i| format!("down-{i}")).collect();
    for key in &keys {
        fake.take_down(key);
    }
    let open = client.with_failure_policy(FailurePolicy::FailOpen);
    let first = occupy_the_slot(&fake, &client).await;
    let waiting = queue(&open, keys.iter().map(|k| Check::named("api", k))).await;
    let outcomes = release(&fake, first, waiting).await;
    // An outage of quotad's store: each caller's failure policy, at once.
    for outcome in &outcomes {
        assert_eq!(
            outcome.as_ref().expect("fails open").reason,
            Reason::FailOpen
        );
    }
    assert_eq!(
        fake.calls(),
        vec![Call::Check("first".into()), Call::Batch(keys.clone()),],
        "nothing sent again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_max_resent_alone_undecided_checks_of_a_batch_are_sent_again() {
    let fake = Fake::new(100, Duration::from_secs(60));
    let client = client(&fake, 1).await;
    let down: Vec<String> = (0..MAX_RESENT_ALONE + 3)
        .map(|i| format!("down-{i}"))
        .collect();
    for key in &down {
        fake.take_down(key);
    }
    let open = client.with_failure_policy(FailurePolicy::FailOpen);
    let first = occupy_the_slot(&fake, &client).await;
    let mut waiting = queue(&open, [Check::named("api", "up")]).await;
    waiting.extend(queue(&open, down.iter().map(|k| Check::named("api", k))).await);
    let outcomes = release(&fake, first, waiting).await;
    let resent = fake
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Check(k) if k.starts_with("down-")))
        .count();
    assert_eq!(resent, MAX_RESENT_ALONE);
    assert!(outcomes[0].as_ref().expect("decided").allowed);
    for outcome in &outcomes[1..] {
        assert_eq!(
            outcome.as_ref().expect("fails open").reason,
            Reason::FailOpen
        );
    }
}
