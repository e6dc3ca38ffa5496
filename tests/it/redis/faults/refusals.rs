//! Redis refusing a call: a server that cannot replicate or persist its
//! writes is an outage for `on_error`, and unreadable state under one key
//! fails only that key's items.

use std::time::Duration;

use quotad_proto::v1 as pb;
use quotad_proto::v1::quota_client::QuotaClient;
use tonic::Code;
use tonic::transport::Channel;

use super::{Answer, POLICIES, ask, stall_config};
use crate::common::redis::RedisServer;
use crate::common::{TestServer, check, eventually, inline, named, policy};

/// The decisions of an independent batch of `items`.
async fn independent(
    client: &mut QuotaClient<Channel>,
    items: Vec<pb::CheckRequest>,
) -> Vec<pb::Decision> {
    let batch = pb::CheckBatchRequest {
        items,
        mode: pb::BatchMode::Independent.into(),
    };
    client
        .check_batch(batch)
        .await
        .expect("an independent batch answers per item")
        .into_inner()
        .decisions
}

/// Each policy's answer once Redis refuses writes: its `on_error`.
async fn every_policy_gets_its_on_error(server: &TestServer, key: &str) {
    let mut client = server.client().await;
    for (policy, answer) in POLICIES
        .iter()
        .zip(["Unavailable", "FailOpen", "FailClosed"])
    {
        assert_eq!(
            ask(&mut client, key, policy).await,
            Answer::Failed(answer.to_owned()),
            "{policy}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_without_the_replicas_it_requires_is_an_outage() {
    let redis = RedisServer::start();
    let server = TestServer::start(stall_config(&format!("url = {:?}", redis.url()), "1s")).await;
    let mut client = server.client().await;
    assert!(matches!(
        ask(&mut client, "norep", "err").await,
        Answer::Decided(_)
    ));
    redis.config_set("min-replicas-to-write", "1");
    every_policy_gets_its_on_error(&server, "norep").await;
    redis.config_set("min-replicas-to-write", "0");
    assert!(matches!(
        ask(&mut client, "norep", "err").await,
        Answer::Decided(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_cannot_persist_is_an_outage() {
    let redis = RedisServer::start();
    let server = TestServer::start(stall_config(&format!("url = {:?}", redis.url()), "1s")).await;
    let mut client = server.client().await;
    assert!(matches!(
        ask(&mut client, "misconf", "err").await,
        Answer::Decided(_)
    ));
    redis.fail_persistence();
    every_policy_gets_its_on_error(&server, "misconf").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_state_under_one_key_fails_only_that_keys_items() {
    let redis = RedisServer::start();
    let server = TestServer::start(stall_config(&format!("url = {:?}", redis.url()), "1s")).await;
    let mut client = server.client().await;
    // A key whose name is a secret, its state overwritten with garbage.
    let secret = "api-key-7f3a";
    assert!(matches!(
        ask(&mut client, secret, "open").await,
        Answer::Decided(_)
    ));
    let stored = redis.cli(&["--scan", "--pattern", &format!("*{secret}*")]);
    let stored = stored.trim();
    assert_eq!(redis.cli(&["set", stored, "garbage"]).trim(), "OK");

    // Batches of 3 (one script) and of 150 (three scripts of up to 64):
    // the unreadable key's item fails, every other item is decided.
    for size in [3, 150] {
        let items: Vec<pb::CheckRequest> = (0..size)
            .map(|i| {
                if i == 1 {
                    named(secret, "open", None)
                } else {
                    named(&format!("fine-{size}-{i}"), "open", None)
                }
            })
            .collect();
        let decisions = independent(&mut client, items).await;
        for (i, d) in decisions.iter().enumerate() {
            if i == 1 {
                assert_eq!(
                    (d.allowed, d.reason()),
                    (false, pb::Reason::Unavailable),
                    "unreadable state is never failed open"
                );
            } else {
                assert_eq!(
                    (d.allowed, d.reason()),
                    (true, pb::Reason::WithinLimit),
                    "item {i} of {size}"
                );
            }
        }
    }
    // Alone, it is INTERNAL, and the message names its policy, not the key.
    let status = client
        .check(named(secret, "open", None))
        .await
        .expect_err("unreadable state is not a decision");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(!status.message().contains(secret), "{status:?}");
    assert!(status.message().contains("open"), "{status:?}");
    let metrics = server.metrics().await;
    assert_eq!(metrics.value("quotad_redis_corrupt_state_total", &[]), 3.0);
    // All-or-nothing is decided whole: the batch fails.
    let all = pb::CheckBatchRequest {
        items: vec![named(secret, "open", None), named("fine-all", "open", None)],
        mode: pb::BatchMode::AllOrNothing.into(),
    };
    let status = client
        .check_batch(all)
        .await
        .expect_err("an all-or-nothing batch with unreadable state fails whole");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(!status.message().contains(secret), "{status:?}");
    eventually(
        Duration::from_secs(1),
        "nothing of the batch counted",
        || async {
            redis
                .cli(&["--scan", "--pattern", "*fine-all*"])
                .trim()
                .is_empty()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_member_that_is_not_quotads_fails_only_the_item_that_reads_it() {
    let redis = RedisServer::start();
    let server = TestServer::start(stall_config(&format!("url = {:?}", redis.url()), "1s")).await;
    let mut client = server.client().await;
    let log = policy(pb::Algorithm::SlidingLog, 3, 86_400_000, None);
    let on_log = |cost| inline("log-secret", log.clone(), Some(cost));
    // Three entries, in three milliseconds.
    for _ in 0..3 {
        assert!(check(&mut client, on_log(1)).await.allowed);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let key = redis.cli(&["--scan", "--pattern", "*log-secret*"]);
    let key = key.trim();
    let members = redis.cli(&["zrange", key, "0", "-1"]);
    let members: Vec<&str> = members.lines().collect();
    assert_eq!(members.len(), 3, "{members:?}");
    // The middle entry, which a check reads only to say how long a denied
    // cost of 2 waits (the load reads the first and the last), is garbage.
    redis.cli(&["zrem", key, members[1]]);
    redis.cli(&["zadd", key, "1", "garbage"]);

    // A cost of 1 is denied without reading it: decided.
    let one = check(&mut client, on_log(1)).await;
    assert_eq!(
        (one.allowed, one.reason()),
        (false, pb::Reason::LimitExceeded)
    );
    // Each decision of an independent batch of `items`: allowed, reason.
    let mut answers = async |items: Vec<pb::CheckRequest>| {
        independent(&mut client, items)
            .await
            .iter()
            .map(|d| (d.allowed, d.reason()))
            .collect::<Vec<_>>()
    };
    // A cost of 2 reads it: that item fails, the batch's others are decided.
    assert_eq!(
        answers(vec![on_log(2), named("fine-log", "open", None), on_log(1)]).await,
        [
            (false, pb::Reason::Unavailable),
            (true, pb::Reason::WithinLimit),
            (false, pb::Reason::LimitExceeded),
        ]
    );
    // With no other item on the key, the key is left as it was.
    assert_eq!(
        answers(vec![on_log(2), named("fine-log-2", "open", None)]).await,
        [
            (false, pb::Reason::Unavailable),
            (true, pb::Reason::WithinLimit)
        ]
    );
    assert_eq!(redis.cli(&["zcard", key]).trim(), "3");
    // Alone, and all or nothing: the call fails, INTERNAL, counting nothing.
    let status = client
        .check(on_log(2))
        .await
        .expect_err("an unreadable member is not a decision");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    let all = pb::CheckBatchRequest {
        items: vec![named("fine-log-all", "open", None), on_log(2)],
        mode: pb::BatchMode::AllOrNothing.into(),
    };
    let status = client.check_batch(all).await.expect_err("decided whole");
    assert_eq!(status.code(), Code::Internal, "{status:?}");
    assert!(
        redis
            .cli(&["--scan", "--pattern", "*fine-log-all*"])
            .trim()
            .is_empty(),
        "nothing of the refused batch counted"
    );
}
