//! Shared setup for the integration tests: a real server on `127.0.0.1:0`
//! (both listeners), a gRPC client, a tiny HTTP client for the admin port,
//! and a Prometheus text parser.

pub(crate) mod binary;
pub(crate) mod process;
pub(crate) mod redis;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quotad::{Config, Listeners};
use quotad_core::Clock;
use quotad_proto::v1 as pb;
use quotad_proto::v1::quota_client::QuotaClient;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

/// 2026-01-01 12:00:30 UTC: 30 s into a minute.
pub(crate) const NOON_30: u64 = 1_767_268_830_000;

/// A policy `api`: a fixed window of 3 a minute (at [`NOON_30`], with 30 s
/// left).
pub(crate) const API_3_A_MINUTE: &str = r#"
[policies.api]
algorithm = "fixed_window"
limit = 3
window = "1m"
"#;

/// A server started by [`TestServer::start`]; stopped on drop.
pub(crate) struct TestServer {
    pub(crate) grpc_addr: SocketAddr,
    pub(crate) admin_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    join: Option<JoinHandle<Result<(), quotad::Error>>>,
}

impl TestServer {
    /// Starts `quotad::run` with `config` on two fresh loopback ports.
    pub(crate) async fn start(config: Config) -> TestServer {
        let grpc = TcpListener::bind("127.0.0.1:0").await.expect("bind gRPC");
        let grpc_addr = grpc.local_addr().expect("gRPC address");
        let listeners = Listeners {
            grpc: grpc.into(),
            admin: TcpListener::bind("127.0.0.1:0").await.expect("bind admin"),
        };
        let admin_addr = listeners.admin.local_addr().expect("admin address");
        let (stop, stopped) = oneshot::channel::<()>();
        let join = tokio::spawn(quotad::run(config, listeners, async {
            let _ = stopped.await;
        }));
        TestServer {
            grpc_addr,
            admin_addr,
            stop: Some(stop),
            join: Some(join),
        }
    }

    /// Starts a server from TOML text, with decisions read from `clock`.
    pub(crate) async fn start_toml(toml: &str, clock: Arc<dyn Clock>) -> TestServer {
        let config = Config::from_toml(toml)
            .expect("valid test config")
            .with_clock(clock);
        TestServer::start(config).await
    }

    /// A client on a new connection.
    pub(crate) async fn client(&self) -> QuotaClient<Channel> {
        QuotaClient::new(self.channel().await)
    }

    /// A new connection to the gRPC port.
    pub(crate) async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.grpc_addr))
            .expect("valid URI")
            .connect()
            .await
            .expect("connect to the test server")
    }

    /// GETs `path` from the admin port: (status, body).
    pub(crate) async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.admin_addr, path).await
    }

    /// Waits (at most 10 s) until `/readyz` answers `status`. 200 once the
    /// server has started: start contacts the store, so a test that stops
    /// the store must wait for it first.
    pub(crate) async fn readyz_turns(&self, status: u16) {
        eventually(
            Duration::from_secs(10),
            &format!("/readyz answers {status}"),
            || async { self.get("/readyz").await.0 == status },
        )
        .await;
    }

    /// The current `/metrics`, parsed.
    pub(crate) async fn metrics(&self) -> Metrics {
        let (status, body) = self.get("/metrics").await;
        assert_eq!(status, 200, "GET /metrics");
        Metrics::parse(&body)
    }

    /// Waits (at most 10 s) until a script that reached Redis past its
    /// deadline has refused to run: a stall's queued calls took nothing.
    pub(crate) async fn late_script_refused(&self) {
        eventually(Duration::from_secs(10), "a late script refused", || async {
            self.metrics()
                .await
                .value("quotad_redis_late_scripts_total", &[("outcome", "refused")])
                >= 1.0
        })
        .await;
    }

    /// Asks the server to shut down, without waiting.
    pub(crate) fn trigger_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Whether `run` has returned.
    pub(crate) fn has_stopped(&self) -> bool {
        self.join.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Shuts down and returns what `run` returned (within 10 s).
    pub(crate) async fn shutdown(mut self) -> Result<(), quotad::Error> {
        self.trigger_shutdown();
        self.join().await
    }

    /// Waits (at most 10 s) for `run` to return.
    pub(crate) async fn join(&mut self) -> Result<(), quotad::Error> {
        let join = self.join.take().expect("joined once");
        tokio::time::timeout(Duration::from_secs(10), join)
            .await
            .expect("the server stops within 10 s")
            .expect("the server task does not panic")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.trigger_shutdown();
    }
}

/// Sends `count` concurrent checks of `key` under `policy`, spread over
/// `clients` in turn; how many were admitted.
pub(crate) async fn admitted(
    clients: &[quotad_client::Client],
    policy: &str,
    key: &str,
    count: usize,
) -> usize {
    let calls: Vec<_> = (0..count)
        .map(|i| {
            let client = clients[i % clients.len()].clone();
            let check = quotad_client::Check::named(policy, key);
            tokio::spawn(async move { client.check(&check).await })
        })
        .collect();
    let mut admitted = 0;
    for call in calls {
        let decision = call.await.expect("no panic").expect("quotad answers");
        admitted += usize::from(decision.allowed);
    }
    admitted
}

/// A minimal HTTP/1.1 GET: (status, body). Handles chunked bodies.
pub(crate) async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr)
        .await
        .expect("connect to the admin port");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send request");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read response");
    let raw = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("headers end");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let chunked = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("chunk size line");
        let size = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}

/// Parsed Prometheus text exposition.
#[derive(Debug)]
pub(crate) struct Metrics {
    pub(crate) text: String,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Metrics {
    pub(crate) fn parse(text: &str) -> Metrics {
        let samples = text
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').expect("sample value");
                let value: f64 = value.parse().expect("numeric sample");
                let (name, labels) = match series.split_once('{') {
                    None => (series.to_owned(), BTreeMap::new()),
                    Some((name, labels)) => {
                        let labels = labels.trim_end_matches('}');
                        let labels = labels
                            .split("\",")
                            .filter(|pair| !pair.is_empty())
                            .map(|pair| {
                                let (k, v) = pair.split_once("=\"").expect("label pair");
                                (k.to_owned(), v.trim_end_matches('"').to_owned())
                            })
                            .collect();
                        (name.to_owned(), labels)
                    }
                };
                (name, labels, value)
            })
            .collect();
        Metrics {
            text: text.to_owned(),
            samples,
        }
    }

    /// The value of the series `name` with exactly `labels`, if exported.
    pub(crate) fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .iter()
            .find(|(n, l, _)| n == name && *l == wanted)
            .map(|(_, _, v)| *v)
    }

    /// Like [`Metrics::get`], but 0 for a series not exported yet.
    pub(crate) fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    /// Every series named `name`, with its labels.
    pub(crate) fn series(&self, name: &str) -> Vec<(&BTreeMap<String, String>, f64)> {
        self.samples
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, l, v)| (l, *v))
            .collect()
    }

    pub(crate) fn live_keys(&self) -> f64 {
        self.get("quotad_live_keys", &[])
            .expect("quotad_live_keys is exported")
    }
}

/// A Check request under a named policy.
pub(crate) fn named(key: &str, policy: &str, cost: Option<u64>) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.to_owned(),
        cost,
        policy: Some(pb::check_request::Policy::PolicyName(policy.to_owned())),
    }
}

/// A Check request with an inline policy.
pub(crate) fn inline(key: &str, policy: pb::Policy, cost: Option<u64>) -> pb::CheckRequest {
    pb::CheckRequest {
        key: key.to_owned(),
        cost,
        policy: Some(pb::check_request::Policy::InlinePolicy(policy)),
    }
}

/// An inline policy.
pub(crate) fn policy(
    algorithm: pb::Algorithm,
    limit: u64,
    window_ms: u64,
    burst: Option<u64>,
) -> pb::Policy {
    pb::Policy {
        algorithm: algorithm.into(),
        limit,
        window_ms,
        burst,
        ..Default::default()
    }
}

/// Checks `request` and returns its decision.
pub(crate) async fn check(
    client: &mut QuotaClient<Channel>,
    request: pb::CheckRequest,
) -> pb::Decision {
    client
        .check(request)
        .await
        .expect("check succeeds")
        .into_inner()
        .decision
        .expect("a decision")
}

/// Checks a batch of `items` in `mode` and returns its decisions.
pub(crate) async fn check_batch(
    client: &mut QuotaClient<Channel>,
    items: Vec<pb::CheckRequest>,
    mode: pb::BatchMode,
) -> Vec<pb::Decision> {
    client
        .check_batch(pb::CheckBatchRequest {
            items,
            mode: mode.into(),
        })
        .await
        .expect("the batch is answered")
        .into_inner()
        .decisions
}

/// Peeks `request` and returns its decision.
pub(crate) async fn peek(
    client: &mut QuotaClient<Channel>,
    request: pb::CheckRequest,
) -> pb::Decision {
    client
        .peek(request)
        .await
        .expect("peek succeeds")
        .into_inner()
        .decision
        .expect("a decision")
}

/// The gRPC health status of `service` (`""`: the server as a whole).
pub(crate) async fn health_status(server: &TestServer, service: &str) -> i32 {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    HealthClient::new(server.channel().await)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .expect("health check")
        .into_inner()
        .status
}

/// Polls `condition` every 20 ms until it holds, for at most `limit`.
pub(crate) async fn eventually<F, Fut>(limit: Duration, what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
