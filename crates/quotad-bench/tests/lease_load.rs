//! `Mode::Client` with leases on, against an in-process quotad whose policy
//! has lease settings, and against the no-op server, which serves no
//! `Leases`: far from the limit most decisions are local; at the limit the
//! run admits exactly the budget; without a lease service every check is
//! sent. No timing is asserted.

use std::time::Duration;

use quotad::{Config, Listeners};
use quotad_bench::{KeyDistribution, LoadConfig, Mode, PolicySpec, Report};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

const CONFIG: &str = r#"
[policies.far]
algorithm = "fixed_window"
limit = 1000000000000
window = "1m"
lease = { max_units = 100, min_units = 10, max_ttl = "10s" }

[policies.near]
algorithm = "sliding_log"
limit = 500
window = "1d"
lease = { max_units = 100, min_units = 50, max_ttl = "10s" }
"#;

fn lease_mode(want: u64) -> Mode {
    Mode::Client {
        coalescing: false,
        deny_cache: false,
        lease_want: Some(want),
    }
}

/// Runs `configure`d load against an in-process quotad serving `CONFIG`.
async fn run_against_quotad(configure: impl FnOnce(&mut LoadConfig)) -> Report {
    let config = Config::from_toml(CONFIG).expect("valid config");
    let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind grpc");
    let addr = grpc.local_addr().expect("bound address");
    let listeners = Listeners {
        grpc: grpc.into(),
        admin: TcpListener::bind("127.0.0.1:0").await.expect("bind admin"),
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(quotad::run(config, listeners, async {
        let _ = stopped.await;
    }));
    let mut load = LoadConfig::new(
        format!("http://{addr}"),
        PolicySpec::Named("far".to_owned()),
    );
    load.duration = None;
    configure(&mut load);
    let report = quotad_bench::run(load).await.expect("the run completes");
    stop.send(()).expect("quotad is still running");
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("quotad stops once the load generator is done")
        .expect("the server task does not panic")
        .expect("quotad stops cleanly");
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_from_the_limit_most_decisions_are_local() {
    let report = run_against_quotad(|c| {
        c.mode = lease_mode(100);
        c.concurrency = 8;
        c.keys = KeyDistribution::Hot;
        c.requests = Some(5_000);
    })
    .await;
    assert_eq!(report.errors, 0, "{:?}", report.errors_by_code);
    assert_eq!(report.allowed, 5_000);
    let leases = report.leases.expect("leases are counted with leases on");
    assert!(leases.acquired >= 1, "{leases:?}");
    // The first checks go out while the first lease is acquired; after
    // that, one lease call per 50 units at most (renewed at half spent).
    assert!(leases.local_admissions >= 4_000, "{leases:?}");
    assert!(report.loadgen_cpu_us_per_decision.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_limit_exactly_the_budget_is_admitted() {
    let report = run_against_quotad(|c| {
        c.mode = lease_mode(100);
        c.policy = PolicySpec::Named("near".to_owned());
        c.concurrency = 16;
        c.keys = KeyDistribution::Hot;
        c.requests = Some(3_000);
    })
    .await;
    assert_eq!(report.errors, 0, "{:?}", report.errors_by_code);
    assert_eq!(report.allowed, 500, "{report:?}");
    assert_eq!(report.denied, 2_500);
    let leases = report.leases.expect("leases are counted with leases on");
    assert!(leases.local_admissions > 0, "{leases:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_lease_service_every_check_is_sent() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("bound address");
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(quotad_bench::serve_noop(listener, async {
        let _ = stopped.await;
    }));
    let mut config = LoadConfig::new(
        format!("http://{addr}"),
        PolicySpec::Named("api".to_owned()),
    );
    config.mode = lease_mode(100);
    config.duration = None;
    config.requests = Some(1_000);
    let report = quotad_bench::run(config).await.expect("the run completes");
    stop.send(()).expect("the server is still running");
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops")
        .expect("the server task does not panic")
        .expect("the server stops cleanly");
    assert_eq!(report.errors, 0, "{:?}", report.errors_by_code);
    assert_eq!(report.allowed, 1_000);
    let leases = report.leases.expect("leases are counted with leases on");
    assert_eq!(leases.local_admissions, 0, "{leases:?}");
    assert_eq!(leases.acquired, 0, "{leases:?}");
}
