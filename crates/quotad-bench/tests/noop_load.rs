//! The load generator against the in-process no-op server: counts are
//! exact and nothing fails. No timing is asserted.

use std::time::Duration;

use quotad_bench::{KeyDistribution, LatencyOrigin, LoadConfig, Mode, PolicySpec, Report};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// Starts the no-op server on 127.0.0.1:0, runs `configure`d load against
/// it, stops the server and returns the report.
async fn run_against_noop(configure: impl FnOnce(&mut LoadConfig)) -> Report {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("bound address");
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(quotad_bench::serve_noop(listener, async {
        let _ = stopped.await;
    }));

    let mut config = LoadConfig::new(
        format!("http://{addr}"),
        PolicySpec::Named("api".to_owned()),
    );
    config.duration = None;
    configure(&mut config);
    let report = quotad_bench::run(config).await.expect("the run completes");

    stop.send(()).expect("the server is still running");
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops once the load generator has closed its connections")
        .expect("the server task does not panic")
        .expect("the server stops cleanly");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_every_unary_request_as_one_allowed_decision() {
    let report = run_against_noop(|c| {
        c.requests = Some(2_000);
        c.concurrency = 8;
        c.connections = 2;
        c.keys = KeyDistribution::Zipf {
            keys: 1_000,
            exponent: 1.0,
        };
    })
    .await;
    assert_eq!(report.requests, 2_000);
    assert_eq!(report.errors, 0, "{:?}", report.errors_by_code);
    assert_eq!(report.decisions, 2_000);
    assert_eq!(report.allowed, 2_000);
    assert_eq!(report.denied, 0);
    assert_eq!(report.latency_from, LatencyOrigin::Send);
    assert_eq!(report.send_lag, None);
    assert!(report.latency.p50_us > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_every_batch_item_as_a_decision() {
    let report = run_against_noop(|c| {
        c.requests = Some(50);
        c.concurrency = 4;
        c.mode = Mode::Batch { size: 100 };
        c.keys = KeyDistribution::Uniform { keys: 500 };
        c.policy = "fixed_window:10:60000"
            .parse()
            .expect("valid inline policy");
    })
    .await;
    assert_eq!(report.requests, 50);
    assert_eq!(report.errors, 0, "{:?}", report.errors_by_code);
    assert_eq!(report.decisions, 5_000);
    assert_eq!(report.allowed, 5_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_loop_run_sends_exactly_the_requests_asked_for() {
    let report = run_against_noop(|c| {
        c.requests = Some(300);
        c.rate = Some(2_000.0);
        c.concurrency = 4;
    })
    .await;
    assert_eq!(report.requests, 300);
    assert_eq!(report.errors, 0, "{:?}", report.errors_by_code);
    assert_eq!(report.allowed, 300);
    assert_eq!(report.missed, 0);
    assert_eq!(report.latency_from, LatencyOrigin::ScheduledSend);
    assert!(report.send_lag.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmup_traffic_is_left_out_of_the_counts() {
    let report = run_against_noop(|c| {
        c.requests = Some(100);
        c.warmup = Duration::from_millis(200);
        c.concurrency = 2;
    })
    .await;
    assert_eq!(report.requests, 100);
    assert_eq!(report.allowed, 100);
    assert!(report.warmup_requests > 0);
}

#[tokio::test]
async fn an_unreachable_target_is_an_error_not_a_report() {
    // Bind and drop, so the port is (almost certainly) closed.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("bound address");
    let mut config = LoadConfig::new(
        format!("http://{addr}"),
        PolicySpec::Named("api".to_owned()),
    );
    config.duration = None;
    config.requests = Some(1);
    assert!(matches!(
        quotad_bench::run(config).await,
        Err(quotad_bench::LoadError::Connect { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_every_descriptor_of_a_should_rate_limit_as_one_decision() {
    let report = run_against_noop(|c| {
        c.requests = Some(300);
        c.concurrency = 4;
        c.mode = Mode::Rls { descriptors: 3 };
        c.keys = KeyDistribution::Uniform { keys: 100 };
    })
    .await;
    assert_eq!(report.requests, 300);
    assert_eq!(report.errors, 0, "{:?}", report.errors_by_code);
    assert_eq!(report.decisions, 900);
    assert_eq!(report.allowed, 900);
    assert_eq!(report.mode, "rls:3");
}
