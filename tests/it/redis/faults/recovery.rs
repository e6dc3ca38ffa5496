//! A standalone connection that stops answering, or that cannot be made
//! within a caller's deadline, is made again in bounded time; a failure of
//! an old connection never replaces the new one.

use std::time::Duration;

use quotad_proto::v1::quota_client::QuotaClient;
use tonic::transport::Channel;

use super::{Answer, ask, ask_within, attempts, stall_config};
use crate::common::redis::{BlackholeProxy, RedisServer};
use crate::common::{TestServer, eventually};

/// Redis behind a proxy, and quotad on the proxy with `settings` in
/// `[store.redis]` and a `timeout`, its first check of `key` decided.
async fn behind_a_proxy(
    settings: &str,
    timeout: &str,
    key: &str,
) -> (
    RedisServer,
    BlackholeProxy,
    TestServer,
    QuotaClient<Channel>,
) {
    let redis = RedisServer::start();
    let proxy = BlackholeProxy::start(redis.port).await;
    let target = format!("url = {:?}\n{settings}", proxy.url());
    let server = TestServer::start(stall_config(&target, timeout)).await;
    let client = server.client().await;
    until_decided(
        &client,
        key,
        Duration::from_millis(50),
        Duration::from_secs(5),
        "the first check",
    )
    .await;
    (redis, proxy, server, client)
}

/// Checks with a short client deadline until one is decided, for at most
/// `limit`.
async fn until_decided(
    client: &QuotaClient<Channel>,
    key: &str,
    deadline: Duration,
    limit: Duration,
    what: &str,
) {
    eventually(limit, what, || {
        let mut client = client.clone();
        async move {
            matches!(
                ask_within(&mut client, key, "err", Some(deadline)).await,
                Answer::Decided(_)
            )
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_connection_is_replaced_although_every_caller_gives_up_before_the_timeout() {
    // Envoy's defaults: a 20 ms deadline on every call, under quotad's
    // 100 ms store timeout, so no call ever waits the store's timeout.
    let (_redis, proxy, server, client) = behind_a_proxy("", "100ms", "env").await;
    let short = Duration::from_millis(20);

    proxy.blackhole();
    let mut c = client.clone();
    assert!(matches!(
        ask_within(&mut c, "env", "closed", Some(short)).await,
        Answer::Failed(_)
    ));
    // Requests have waited 3 x 100 ms with no reply: the connection is
    // replaced, and checks are decided again over the new one.
    until_decided(
        &client,
        "env",
        short,
        Duration::from_secs(10),
        "checks are decided again with 20 ms deadlines",
    )
    .await;
    assert_eq!(
        attempts(&server).await.0,
        2.0,
        "connected at start, and once more after the blackhole"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_slower_to_make_than_any_callers_deadline_is_made_all_the_same() {
    let (_redis, proxy, server, client) = behind_a_proxy("", "2s", "slow").await;
    let short = Duration::from_millis(50);

    // From now on a connection takes 400 ms to make (a far region, a slow
    // handshake), eight times the callers' deadline; the open one closes.
    proxy.delay_new_connections(Duration::from_millis(400));
    proxy.close_all();
    until_decided(
        &client,
        "slow",
        short,
        Duration::from_secs(10),
        "checks are decided again although every caller gives up after 50 ms",
    )
    .await;
    let (ok, error) = attempts(&server).await;
    assert_eq!(ok, 2.0, "the start, and the one attempt after the close");
    assert_eq!(error, 0.0, "no attempt died with the call that started it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_failure_of_an_old_connection_leaves_the_new_one_alone() {
    // A 2 s timeout, replaced after 2 s of silence.
    let (_redis, proxy, server, mut client) =
        behind_a_proxy("reconnect_after_timeouts = 1", "2s", "old").await;

    proxy.blackhole();
    // Two calls that wait out the store's 2 s on the silent connection, the
    // second sent 600 ms after the first.
    let mut first_client = client.clone();
    let first = tokio::spawn(async move { ask(&mut first_client, "old", "closed").await });
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut second_client = client.clone();
    let second = tokio::spawn(async move { ask(&mut second_client, "old", "closed").await });
    // The first times out after 2 s of silence: the connection is
    // replaced, and the new one decides the checks.
    assert_eq!(
        first.await.expect("the first call"),
        Answer::Failed("FailClosed".to_owned())
    );
    let short = Duration::from_millis(50);
    until_decided(
        &client,
        "old",
        short,
        Duration::from_secs(5),
        "a new connection",
    )
    .await;
    // The old connection now fails while the second call still waits on
    // it: its error must not replace the new connection.
    proxy.close_blackholed();
    assert_eq!(
        second.await.expect("the second call"),
        Answer::Failed("FailClosed".to_owned())
    );
    for _ in 0..5 {
        assert!(matches!(
            ask_within(&mut client, "old", "err", Some(Duration::from_secs(1))).await,
            Answer::Decided(_)
        ));
    }
    assert_eq!(
        attempts(&server).await.0,
        2.0,
        "the start and the replacement, and no third connection"
    );
}
