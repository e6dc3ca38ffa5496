//! The shared conformance cases (`tests/clients/cases.json`, described in
//! `tests/clients/README.md`) run through this client and its HTTP layer,
//! each against a server of its own: a real `quotad` binary
//! (`$QUOTAD_BIN`, else `target/debug/quotad`; `cargo build --bin quotad`
//! first), a closed port or a stalled one. A case answered differently
//! fails naming the case and the step; every case is run, and all the
//! failures are reported together.

use std::convert::Infallible;
use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use http::{Request, Response};
use quotad_client::{
    BatchMode, Check, Client, Decision, Error, FailurePolicy, KeyExtractor, LeaseOptions,
    PolicyRef, RateLimitLayer, Reason,
};
use quotad_core::{Algorithm, Policy};
use serde_json::Value;
use tower::{Layer as _, ServiceExt as _};

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(REPO).join(rel)
}

fn quotad_binary() -> PathBuf {
    let path = std::env::var_os("QUOTAD_BIN")
        .map_or_else(|| repo_path("target/debug/quotad"), PathBuf::from);
    assert!(
        path.is_file(),
        "no quotad binary at {}: run `cargo build --bin quotad` (scripts/test.sh does), or set QUOTAD_BIN",
        path.display()
    );
    path
}

/// A running `quotad serve` with the cases' config, stopped when dropped.
struct Quotad {
    child: Child,
    addr: SocketAddr,
}

impl Quotad {
    fn start() -> Self {
        let mut command = Command::new(quotad_binary());
        command
            .arg("serve")
            .arg("-c")
            .arg(repo_path("tests/clients/quotad.toml"))
            .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env("RUST_LOG", "info");
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("QUOTAD_") {
                command.env_remove(name);
            }
        }
        let mut child = command.spawn().expect("spawn quotad");
        let stderr = child.stderr.take().expect("piped stderr");
        // Owned by the guard from here on: a panic below still stops it.
        let mut server = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx
                .recv_timeout(left)
                .expect("quotad logs that it is serving within 20 s");
            if line.contains("quotad serving") {
                let addr = line
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("grpc_addr="))
                    .and_then(|a| a.parse().ok())
                    .unwrap_or_else(|| panic!("no grpc_addr in {line:?}"));
                // Keep draining so quotad never blocks on a full pipe.
                std::thread::spawn(move || while rx.recv().is_ok() {});
                server.addr = addr;
                return server;
            }
        }
    }
}

impl Drop for Quotad {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a case runs against, kept alive for the case.
enum Server {
    Real(Quotad),
    /// Bound and never listened on: connecting is refused, and the port
    /// stays taken for the case.
    Closed {
        _held: tokio::net::TcpSocket,
        addr: SocketAddr,
    },
    /// Accepts and never sends a byte; the accepted sockets are held.
    Stalled(tokio::task::JoinHandle<()>, SocketAddr),
}

impl Server {
    async fn start(kind: &str) -> Self {
        match kind {
            "real" => Server::Real(
                tokio::task::spawn_blocking(Quotad::start)
                    .await
                    .expect("start"),
            ),
            "closed" => {
                let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
                socket
                    .bind("127.0.0.1:0".parse().expect("an address"))
                    .expect("bind");
                let addr = socket.local_addr().expect("address");
                Server::Closed {
                    _held: socket,
                    addr,
                }
            }
            "stalled" => {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                let addr = listener.local_addr().expect("address");
                let task = tokio::spawn(async move {
                    let mut held = Vec::new();
                    while let Ok((stream, _)) = listener.accept().await {
                        held.push(stream);
                    }
                });
                Server::Stalled(task, addr)
            }
            other => panic!("unknown server kind {other:?}"),
        }
    }

    fn address(&self) -> String {
        let addr = match self {
            Server::Real(q) => q.addr,
            Server::Closed { addr, .. } | Server::Stalled(_, addr) => *addr,
        };
        format!("http://{addr}")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Server::Stalled(task, _) = self {
            task.abort();
        }
    }
}

/// What a step got: decisions, success, or an error's code and message.
#[derive(Debug)]
enum Got {
    One(Decision),
    Many(Vec<Decision>),
    Ok,
    Failed { code: String, message: String },
}

fn failed(error: &Error) -> Got {
    match error {
        // The client's unavailable error, whatever the transport's code.
        Error::Unavailable(status) => Got::Failed {
            code: "UNAVAILABLE".to_owned(),
            message: status.message().to_owned(),
        },
        Error::Rejected(status) => Got::Failed {
            code: code_name(status.code()),
            message: status.message().to_owned(),
        },
        other => Got::Failed {
            code: "INTERNAL".to_owned(),
            message: other.to_string(),
        },
    }
}

fn code_name(code: tonic::Code) -> String {
    // tonic's Debug is CamelCase (InvalidArgument); the cases use gRPC's names.
    let camel = format!("{code:?}");
    let mut out = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

fn reason_name(reason: Reason) -> String {
    reason.as_str().to_ascii_uppercase()
}

fn failure_policy(name: &str) -> FailurePolicy {
    match name {
        "fail_open" => FailurePolicy::FailOpen,
        "fail_closed" => FailurePolicy::FailClosed,
        "error" => FailurePolicy::Error,
        other => panic!("unknown on_unavailable {other:?}"),
    }
}

fn client_for(case: &Value, address: &str) -> Client {
    let settings = &case["client"];
    let mut builder = Client::builder(address.to_owned());
    if let Some(ms) = settings["deadline_ms"].as_u64() {
        builder = builder.deadline(Duration::from_millis(ms));
    }
    if let Some(policy) = settings["on_unavailable"].as_str() {
        builder = builder.on_unavailable(failure_policy(policy));
    }
    if settings["deny_cache"] == Value::Bool(false) {
        builder = builder.deny_cache(0);
    }
    if settings["leases"] == Value::Bool(true) {
        // The `leased` policy grants at most 4 units a lease.
        builder = builder.leases(LeaseOptions::try_new(LEASE_WANT).expect("a valid want"));
    }
    builder.build().expect("a valid address")
}

/// The units a leasing client of a case asks for (tests/clients/README.md).
const LEASE_WANT: u64 = 4;

fn algorithm(name: &str) -> Algorithm {
    Algorithm::ALL
        .into_iter()
        .find(|a| a.as_str() == name)
        .unwrap_or_else(|| panic!("unknown algorithm {name:?}"))
}

/// The policy of a step, or the error the client's own validation gives.
fn policy(spec: &Value) -> Result<PolicyRef, Got> {
    if let Some(name) = spec["name"].as_str() {
        return Ok(PolicyRef::Named(name.to_owned()));
    }
    let inline = &spec["inline"];
    let number = |field: &str| {
        inline[field]
            .as_u64()
            .unwrap_or_else(|| panic!("inline.{field}: a number"))
    };
    Policy::try_new(
        algorithm(inline["algorithm"].as_str().expect("inline.algorithm")),
        number("limit"),
        Duration::from_millis(number("window_ms")),
        inline["burst"].as_u64(),
    )
    .map(PolicyRef::Inline)
    .map_err(|e| Got::Failed {
        code: "INVALID_ARGUMENT".to_owned(),
        message: e.to_string(),
    })
}

fn check_of(prefix: &str, item: &Value) -> Result<Check, Got> {
    let key = prefixed(prefix, item["key"].as_str().expect("a key"));
    let cost = item["cost"].as_u64().unwrap_or(1);
    Ok(match policy(&item["policy"])? {
        PolicyRef::Named(name) => Check::named(name, key),
        PolicyRef::Inline(p) => Check::inline(p, key),
    }
    .cost(cost))
}

fn prefixed(prefix: &str, key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("{prefix}{key}")
    }
}

fn batch_mode(name: Option<&str>) -> BatchMode {
    match name.unwrap_or("independent") {
        "independent" => BatchMode::Independent,
        "all_or_nothing" => BatchMode::AllOrNothing,
        other => panic!("unknown batch mode {other:?}"),
    }
}

async fn run_step(target: &Client, prefix: &str, step: &Value) -> Got {
    let call = step["call"].as_str().expect("a call");
    let outcome = async {
        match call {
            "check" => {
                let check = check_of(prefix, step)?;
                Ok(target
                    .check(&check)
                    .await
                    .map_or_else(|e| failed(&e), Got::One))
            }
            "peek" => {
                let check = check_of(prefix, step)?;
                Ok(target
                    .peek(&check)
                    .await
                    .map_or_else(|e| failed(&e), Got::One))
            }
            "reset" => {
                let key = prefixed(prefix, step["key"].as_str().expect("a key"));
                let policy = policy(&step["policy"])?;
                Ok(target
                    .reset(&policy, &key)
                    .await
                    .map_or_else(|e| failed(&e), |()| Got::Ok))
            }
            "check_batch" => {
                let items = step["items"]
                    .as_array()
                    .expect("items")
                    .iter()
                    .map(|item| check_of(prefix, item))
                    .collect::<Result<Vec<_>, _>>()?;
                let mode = batch_mode(step["mode"].as_str());
                Ok(target
                    .check_batch(&items, mode)
                    .await
                    .map_or_else(|e| failed(&e), Got::Many))
            }
            "close" => {
                target.shutdown().await;
                Ok(Got::Ok)
            }
            other => panic!("unknown call {other:?}"),
        }
    };
    outcome.await.unwrap_or_else(|refused: Got| refused)
}

fn matches_number(want: &Value, value: u64) -> bool {
    match want {
        Value::Object(range) => {
            let min = range["min"].as_u64().expect("min");
            let max = range["max"].as_u64().expect("max");
            (min..=max).contains(&value)
        }
        exact => exact.as_u64() == Some(value),
    }
}

fn compare_decision(want: &Value, d: &Decision) -> Result<(), String> {
    let fields: [(&str, Value, bool); 6] = [
        ("allowed", Value::Bool(d.allowed), false),
        ("limit", d.limit.into(), true),
        ("remaining", d.remaining.into(), true),
        ("retry_after_ms", d.retry_after_ms.into(), true),
        ("reset_after_ms", d.reset_after_ms.into(), true),
        ("reason", Value::String(reason_name(d.reason)), false),
    ];
    for (name, value, numeric) in fields {
        let Some(expected) = want.get(name) else {
            continue;
        };
        let ok = if numeric {
            matches_number(expected, value.as_u64().expect("a number"))
        } else {
            expected == &value
        };
        if !ok {
            return Err(format!("{name} is {value}, expected {expected} ({d:?})"));
        }
    }
    Ok(())
}

/// The field quotad named in a refusal: it words one as `<field>: <what is
/// wrong>`, the field a path such as `cost`, `inline_policy.limit` or
/// `items[3].key`.
fn field_of(message: &str) -> Option<&str> {
    let (field, _) = message.split_once(": ")?;
    let part = |p: &str| {
        let name = p.split_once('[').map_or(p, |(name, index)| {
            if index
                .strip_suffix(']')
                .is_some_and(|i| i.parse::<u64>().is_ok())
            {
                name
            } else {
                ""
            }
        });
        name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    field.split('.').all(part).then_some(field)
}

fn compare(want: &Value, got: &Got, elapsed: Duration) -> Result<(), String> {
    if let Some(within) = want["within_ms"].as_u64()
        && elapsed > Duration::from_millis(within)
    {
        return Err(format!(
            "answered in {} ms, expected within {within}",
            elapsed.as_millis()
        ));
    }
    if let Some(error) = want.get("error") {
        let Got::Failed { code, message } = got else {
            return Err(format!("expected the error {error}, got {got:?}"));
        };
        if error["code"].as_str() != Some(code) {
            return Err(format!("expected the error {error}, got {code}: {message}"));
        }
        let part = error["message_contains"].as_str().unwrap_or("");
        if !message.contains(part) {
            return Err(format!(
                "expected {part:?} in the message, got {code}: {message}"
            ));
        }
        if let Some(field) = error.get("field") {
            let named = field_of(message);
            if field.as_str() != named {
                return Err(format!(
                    "expected the field {field}, got {named:?} in {code}: {message}"
                ));
            }
        }
        return Ok(());
    }
    match got {
        Got::Failed { code, message } => Err(format!("expected {want}, got {code}: {message}")),
        Got::Ok if want["ok"] == Value::Bool(true) || want.is_null() => Ok(()),
        Got::Many(decisions) => {
            let expected = want["decisions"].as_array().expect("decisions expected");
            if expected.len() != decisions.len() {
                return Err(format!(
                    "expected {} decisions, got {decisions:?}",
                    expected.len()
                ));
            }
            for (i, (e, d)) in expected.iter().zip(decisions).enumerate() {
                compare_decision(e, d).map_err(|m| format!("decision {i}: {m}"))?;
            }
            Ok(())
        }
        Got::One(d) => compare_decision(want, d),
        Got::Ok => Err(format!("expected {want}, got success")),
    }
}

async fn run_steps(case: &Value, address: &str, prefix: &str) -> Result<(), String> {
    let client = client_for(case, address);
    // Another replica of the application, set up as the client under test.
    let peer = client_for(case, address);
    let other = Client::builder(address.to_owned())
        .deadline(Duration::from_secs(2))
        .deny_cache(0)
        .build()
        .expect("a valid address");
    let mut allowed_total = 0;
    for (index, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
        let call = step["call"].as_str().expect("a call");
        if call == "sleep" {
            tokio::time::sleep(Duration::from_millis(step["ms"].as_u64().expect("ms"))).await;
            continue;
        }
        if call == "await_leases" {
            await_leases(&client, step)
                .await
                .map_err(|m| format!("step {index} ({call}): {m}"))?;
            continue;
        }
        let targets: Vec<&Client> = match step["via"].as_str() {
            None => vec![&client],
            Some("other") => vec![&other],
            Some("peer") => vec![&peer],
            Some("both") => vec![&client, &peer],
            Some(via) => panic!("unknown via {via:?}"),
        };
        let pause = step["pause_ms"].as_u64().map(Duration::from_millis);
        let at = |n: u64, m: String| format!("step {index} ({call}, repeat {}): {m}", n + 1);
        let repeat = step["repeat"].as_u64().unwrap_or(1);
        let concurrently = step["concurrently"] == Value::Bool(true);
        // Concurrently: every repeat through every target at once, as
        // concurrent callers; else one after another, each repeat through
        // each target in turn.
        let mut calls = tokio::task::JoinSet::new();
        for n in 0..repeat {
            if n > 0
                && !concurrently
                && let Some(pause) = pause
            {
                tokio::time::sleep(pause).await;
            }
            for target in &targets {
                let (client, prefix, owned) = ((*target).clone(), prefix.to_owned(), step.clone());
                let one = async move {
                    let start = Instant::now();
                    let got = run_step(&client, &prefix, &owned).await;
                    (n, got, start.elapsed())
                };
                if concurrently {
                    calls.spawn(one);
                } else {
                    tally(step, &[one.await], &mut allowed_total, &at)?;
                }
            }
        }
        tally(step, &calls.join_all().await, &mut allowed_total, &at)?;
        if let Some(want) = step["expect"].get("allowed_total")
            && !matches_number(want, allowed_total)
        {
            return Err(format!(
                "step {index} ({call}): {allowed_total} checks allowed so far, expected {want}"
            ));
        }
    }
    Ok(())
}

/// Polls the client's lease stats until every field the step names has its
/// value (a background lease call has landed), for at most `within_ms`.
async fn await_leases(client: &Client, step: &Value) -> Result<(), String> {
    let want = step["expect"].as_object().expect("lease stats expected");
    let within = Duration::from_millis(step["within_ms"].as_u64().expect("within_ms"));
    let start = Instant::now();
    loop {
        let s = client.lease_stats();
        let mismatch = want.iter().find(|(name, value)| {
            let got = match name.as_str() {
                "acquired" => s.acquired,
                "renewed" => s.renewed,
                "not_leasable" => s.not_leasable,
                "failed" => s.failed,
                "held" => s.held,
                other => panic!("unknown lease stat {other:?}"),
            };
            value.as_u64() != Some(got)
        });
        if mismatch.is_none() {
            return Ok(());
        }
        if start.elapsed() > within {
            return Err(format!(
                "lease stats {s:?} after {} ms, expected {}",
                within.as_millis(),
                step["expect"]
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Compares each outcome of a step with its expectation, and counts the
/// checks allowed.
fn tally(
    step: &Value,
    outcomes: &[(u64, Got, Duration)],
    allowed_total: &mut u64,
    at: &impl Fn(u64, String) -> String,
) -> Result<(), String> {
    for (n, got, elapsed) in outcomes {
        if step["call"] == "check" && matches!(got, Got::One(d) if d.allowed) {
            *allowed_total += 1;
        }
        compare(&step["expect"], got, *elapsed).map_err(|m| at(*n, m))?;
    }
    Ok(())
}

fn key_extractor(spec: &Value) -> KeyExtractor {
    if let Some(name) = spec["header"].as_str() {
        return KeyExtractor::Header(name.parse().expect("a header name"));
    }
    if spec["peer_ip"] == Value::Bool(true) {
        return KeyExtractor::PeerIp;
    }
    if let Some(trusted) = spec["forwarded_for"]["trusted"].as_array() {
        return KeyExtractor::ForwardedFor {
            trusted: trusted
                .iter()
                .map(|n| n.as_str().expect("a CIDR").parse().expect("a valid CIDR"))
                .collect(),
        };
    }
    panic!("unknown key spec {spec}")
}

fn header_matches(want: &Value, value: Option<&str>) -> bool {
    match (want, value) {
        (Value::String(s), v) if s == "absent" => v.is_none(),
        (Value::String(s), v) if s == "present" => v.is_some(),
        (Value::String(s), v) => v == Some(s.as_str()),
        (Value::Object(o), Some(v)) if o.contains_key("prefix") || o.contains_key("params") => {
            let prefix = o
                .get("prefix")
                .map_or("", |p| p.as_str().expect("a prefix"));
            v.starts_with(prefix)
                && o.get("params")
                    .into_iter()
                    .flat_map(|p| p.as_object().expect("params"))
                    .all(|(name, want)| param(v, name).is_some_and(|n| matches_number(want, n)))
        }
        (Value::Object(_), Some(v)) => v.parse().is_ok_and(|n| matches_number(want, n)),
        (Value::Object(_), None) => false,
        _ => panic!("unknown header expectation {want}"),
    }
}

/// The whole-number parameter `name` of a structured field such as
/// `"login";r=2;t=1200`.
fn param(value: &str, name: &str) -> Option<u64> {
    value
        .split(';')
        .skip(1)
        .find_map(|p| p.trim().strip_prefix(name)?.strip_prefix('='))
        .and_then(|n| n.parse().ok())
}

async fn run_http(case: &Value, address: &str, prefix: &str) -> Result<(), String> {
    let http = &case["http"];
    let client = client_for(case, address);
    let mut layer = RateLimitLayer::new(
        client,
        http["policy"].as_str().expect("a policy"),
        key_extractor(&http["key"]),
    );
    if let Some(cost) = http["cost"].as_u64() {
        layer = layer.cost(move |_| cost);
    }
    let app = tower::service_fn(|_request: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::from("hello\n")))
    });
    let service = layer.layer(app);
    let key_header = http["key"]["header"].as_str();
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("an address");
    for (i, request) in http["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .enumerate()
    {
        let mut builder = Request::builder().uri(request["path"].as_str().unwrap_or("/"));
        for (name, value) in request["headers"].as_object().into_iter().flatten() {
            let value = value.as_str().expect("a header value");
            let value = if Some(name.as_str()) == key_header {
                prefixed(prefix, value)
            } else {
                value.to_owned()
            };
            builder = builder.header(name, value);
        }
        let mut req = builder.body(()).expect("a request");
        req.extensions_mut().insert(ConnectInfo(peer));
        let response = service.clone().oneshot(req).await.expect("infallible");
        let status = u64::from(response.status().as_u16());
        if request["expect_status"].as_u64() != Some(status) {
            return Err(format!(
                "request {i}: status {status}, expected {} (headers {:?})",
                request["expect_status"],
                response.headers()
            ));
        }
        for (name, want) in request["expect_headers"].as_object().into_iter().flatten() {
            let value = response
                .headers()
                .get(name)
                .map(|v| v.to_str().expect("a text header"));
            if !header_matches(want, value) {
                return Err(format!(
                    "request {i}: header {name} is {value:?}, expected {want}"
                ));
            }
        }
    }
    Ok(())
}

/// The fields this driver knows, by where they appear; a field added to the
/// format fails the driver until it is taught it.
const KNOWN: &[(&str, &[&str])] = &[
    ("case", &["name", "server", "client", "steps", "http"]),
    (
        "client",
        &["deadline_ms", "on_unavailable", "deny_cache", "leases"],
    ),
    (
        "step",
        &[
            "call",
            "key",
            "cost",
            "policy",
            "items",
            "mode",
            "via",
            "ms",
            "repeat",
            "pause_ms",
            "concurrently",
            "expect",
            "within_ms",
        ],
    ),
    ("item", &["key", "cost", "policy"]),
    (
        "expect",
        &[
            "allowed",
            "limit",
            "remaining",
            "retry_after_ms",
            "reset_after_ms",
            "reason",
            "error",
            "decisions",
            "ok",
            "within_ms",
            "allowed_total",
            // await_leases: the lease stats to wait for.
            "acquired",
            "renewed",
            "not_leasable",
            "failed",
            "held",
        ],
    ),
    ("error", &["code", "message_contains", "field"]),
    ("header", &["prefix", "params", "min", "max"]),
    ("http", &["policy", "key", "cost", "requests"]),
    (
        "request",
        &["path", "headers", "expect_status", "expect_headers"],
    ),
];

fn known_fields(kind: &str, value: &Value) -> Result<(), String> {
    let (_, fields) = KNOWN
        .iter()
        .find(|(k, _)| *k == kind)
        .expect("a kind of object");
    let unknown: Vec<&String> = value
        .as_object()
        .into_iter()
        .flatten()
        .map(|(name, _)| name)
        .filter(|name| !fields.contains(&name.as_str()))
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{kind} fields this driver does not know: {unknown:?}"
        ))
    }
}

fn only_known_fields(case: &Value) -> Result<(), String> {
    known_fields("case", case)?;
    known_fields("client", &case["client"])?;
    for step in case["steps"].as_array().into_iter().flatten() {
        known_fields("step", step)?;
        for item in step["items"].as_array().into_iter().flatten() {
            known_fields("item", item)?;
        }
        known_fields("expect", &step["expect"])?;
        known_fields("error", &step["expect"]["error"])?;
        for d in step["expect"]["decisions"].as_array().into_iter().flatten() {
            known_fields("expect", d)?;
        }
    }
    known_fields("http", &case["http"])?;
    for request in case["http"]["requests"].as_array().into_iter().flatten() {
        known_fields("request", request)?;
        for (_, want) in request["expect_headers"].as_object().into_iter().flatten() {
            known_fields("header", want)?;
        }
    }
    Ok(())
}

async fn run_case(case: &Value, run: usize) -> Result<(), String> {
    only_known_fields(case)?;
    let server = Server::start(case["server"].as_str().expect("a server kind")).await;
    let address = server.address();
    let prefix = format!("rs-{}-{run}:", std::process::id());
    run_steps(case, &address, &prefix).await?;
    if !case["http"].is_null() {
        run_http(case, &address, &prefix).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shared_conformance_case_gets_the_answers_it_expects() {
    let text = std::fs::read_to_string(repo_path("tests/clients/cases.json"))
        .expect("tests/clients/cases.json is readable");
    let suite: Value = serde_json::from_str(&text).expect("cases.json is JSON");
    assert_eq!(suite["version"], 1, "a case file this driver knows");
    let cases = suite["cases"].as_array().expect("cases");
    assert!(!cases.is_empty(), "the file has cases");
    let mut failures = Vec::new();
    for (run, case) in cases.iter().enumerate() {
        let name = case["name"].as_str().expect("a name");
        if let Err(why) = run_case(case, run).await {
            failures.push(format!("case {name:?}: {why}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
