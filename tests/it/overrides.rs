//! Runtime overrides (`quotad.v1.Overrides`) and `quotad.v1.Explain`
//! against a real server: precedence, expiry, counts kept across a change,
//! bad input, access, metrics, and the CLI with its audit log line.

use std::sync::Arc;
use std::time::Duration;

use quotad_core::FakeClock;
use quotad_proto::v1 as pb;
use quotad_proto::v1::explain_client::ExplainClient;
use quotad_proto::v1::overrides_client::OverridesClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::common::binary::{Server, quotad};
use crate::common::{NOON_30, TestServer, check, named};

/// `api`: 3 a minute (fixed window); `bucket`: a token bucket of 10 a second.
const POLICIES: &str = r#"
[policies.api]
algorithm = "fixed_window"
limit = 3
window = "1m"

[policies.bucket]
algorithm = "token_bucket"
limit = 10
window = "1s"
"#;

fn key(k: &str) -> Option<pb::OverrideScope> {
    Some(pb::OverrideScope {
        scope: Some(pb::override_scope::Scope::Key(k.to_owned())),
    })
}

fn prefix(p: &str) -> Option<pb::OverrideScope> {
    Some(pb::OverrideScope {
        scope: Some(pb::override_scope::Scope::Prefix(p.to_owned())),
    })
}

fn set(policy: &str, scope: Option<pb::OverrideScope>, limit: u64) -> pb::SetOverrideRequest {
    pb::SetOverrideRequest {
        policy: policy.to_owned(),
        scope,
        limit,
        window_ms: None,
        burst: None,
        expires_at_ms: None,
    }
}

struct Admin {
    server: TestServer,
    clock: Arc<FakeClock>,
    overrides: OverridesClient<Channel>,
    explain: ExplainClient<Channel>,
    quota: quotad_proto::v1::quota_client::QuotaClient<Channel>,
}

async fn start(extra: &str) -> Admin {
    let clock = Arc::new(FakeClock::new(NOON_30));
    let server = TestServer::start_toml(&format!("{extra}\n{POLICIES}"), clock.clone()).await;
    let channel = server.channel().await;
    Admin {
        overrides: OverridesClient::new(channel.clone()),
        explain: ExplainClient::new(channel),
        quota: server.client().await,
        server,
        clock,
    }
}

impl Admin {
    async fn set(&mut self, request: pb::SetOverrideRequest) -> pb::SetOverrideResponse {
        self.overrides
            .set_override(request)
            .await
            .expect("override set")
            .into_inner()
    }

    /// How many unit checks of `k` under `policy` are allowed, of `n`.
    async fn admitted(&mut self, policy: &str, k: &str, n: usize) -> usize {
        let mut allowed = 0;
        for _ in 0..n {
            if check(&mut self.quota, named(k, policy, None)).await.allowed {
                allowed += 1;
            }
        }
        allowed
    }

    async fn list(&mut self) -> Vec<pb::OverrideEntry> {
        self.overrides
            .list_overrides(pb::ListOverridesRequest::default())
            .await
            .expect("listed")
            .into_inner()
            .overrides
    }

    async fn explain(&mut self, policy: &str, k: &str) -> pb::ExplainResponse {
        self.explain
            .explain(pb::ExplainRequest {
                policy: policy.to_owned(),
                key: k.to_owned(),
            })
            .await
            .expect("explained")
            .into_inner()
    }
}

#[tokio::test]
async fn the_exact_key_wins_then_the_longest_prefix_then_the_policy() {
    let mut admin = start("").await;
    admin.set(set("api", prefix("tenant:"), 5)).await;
    admin.set(set("api", prefix("tenant:acme"), 7)).await;
    admin.set(set("api", key("tenant:acme:vip"), 9)).await;
    assert_eq!(admin.admitted("api", "tenant:acme:vip", 12).await, 9);
    assert_eq!(admin.admitted("api", "tenant:acme:2", 12).await, 7);
    assert_eq!(admin.admitted("api", "tenant:globex", 12).await, 5);
    assert_eq!(admin.admitted("api", "user:1", 12).await, 3, "the policy");
    // Another policy's keys are untouched by api's overrides.
    assert_eq!(admin.admitted("bucket", "tenant:acme:vip", 12).await, 10);
    // A batch resolves each item's key on its own.
    let decisions = crate::common::check_batch(
        &mut admin.quota,
        vec![
            named("tenant:new", "api", Some(5)),
            named("other", "api", Some(4)),
        ],
        pb::BatchMode::Independent,
    )
    .await;
    assert!(decisions[0].allowed && decisions[0].limit == 5);
    assert!(!decisions[1].allowed && decisions[1].limit == 3);
}

#[tokio::test]
async fn changing_an_override_keeps_the_keys_count_and_removing_it_restores_the_policy() {
    let mut admin = start("").await;
    assert_eq!(admin.admitted("api", "k", 5).await, 3);
    admin.set(set("api", key("k"), 5)).await;
    assert_eq!(
        admin.admitted("api", "k", 5).await,
        2,
        "5 less the 3 counted"
    );
    let previous = admin.set(set("api", key("k"), 10)).await.previous;
    assert_eq!(previous.map(|p| p.limit), Some(5));
    assert_eq!(
        admin.admitted("api", "k", 10).await,
        5,
        "10 less the 5 counted"
    );
    let removed = admin
        .overrides
        .remove_override(pb::RemoveOverrideRequest {
            policy: "api".to_owned(),
            scope: key("k"),
        })
        .await
        .expect("removed")
        .into_inner();
    assert!(removed.removed);
    assert_eq!(
        admin.admitted("api", "k", 1).await,
        0,
        "10 counted, limit 3"
    );
    // The next window starts afresh under the policy.
    admin.clock.advance(Duration::from_secs(30));
    assert_eq!(admin.admitted("api", "k", 5).await, 3);
    assert!(admin.list().await.is_empty());
}

#[tokio::test]
async fn an_expired_override_gives_way_and_is_not_counted_in_force() {
    let mut admin = start("").await;
    let mut request = set("api", prefix("t:"), 6);
    request.expires_at_ms = Some(NOON_30 + 10_000);
    admin.set(request).await;
    let metrics = admin.server.metrics().await;
    assert_eq!(
        metrics.value(
            "quotad_overrides",
            &[("policy", "api"), ("source", "runtime")]
        ),
        1.0
    );
    assert_eq!(admin.admitted("api", "t:1", 8).await, 6);
    admin.clock.advance(Duration::from_millis(9_999));
    assert_eq!(
        admin
            .explain("api", "t:1")
            .await
            .active_override
            .map(|o| o.limit),
        Some(6)
    );
    admin.clock.advance(Duration::from_millis(1));
    let explained = admin.explain("api", "t:1").await;
    assert_eq!(explained.active_override, None, "expired");
    assert_eq!(explained.in_force.map(|p| p.limit), Some(3));
    assert_eq!(admin.admitted("api", "t:2", 5).await, 3);
    assert!(
        admin.list().await.is_empty(),
        "an expired override is not listed"
    );
    let metrics = admin.server.metrics().await;
    assert_eq!(
        metrics.value(
            "quotad_overrides",
            &[("policy", "api"), ("source", "runtime")]
        ),
        0.0
    );
}

#[tokio::test]
async fn bad_overrides_are_invalid_argument_naming_the_field_and_change_nothing() {
    let mut admin = start("").await;
    let mut past = set("api", key("k"), 5);
    past.expires_at_ms = Some(NOON_30);
    let mut burst = set("api", key("k"), 5);
    burst.burst = Some(7);
    let mut window = set("bucket", key("k"), 5);
    window.window_ms = Some(0);
    // Past year 9999 the CLI could not print it; 10 years is the bound.
    let mut far = set("api", key("k"), 5);
    far.expires_at_ms = Some(NOON_30 + 11 * 366 * 86_400_000);
    let cases = [
        (far, "expires_at_ms"),
        (set("api\nquotad::audit forged", key("k"), 5), "policy"),
        (set("nope", key("k"), 5), "policy"),
        (set("", key("k"), 5), "policy"),
        (set("api", None, 5), "scope"),
        (set("api", prefix(""), 5), "scope.prefix"),
        (set("api", key(""), 5), "scope.key"),
        (set("api", key("k"), 0), "limit"),
        (set("api", key("k"), 1 << 54), "limit"),
        (past, "expires_at_ms"),
        (burst, "burst"),
        (window, "window_ms"),
    ];
    for (request, field) in cases {
        let status = admin
            .overrides
            .set_override(request.clone())
            .await
            .expect_err("refused");
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{request:?}: {status:?}"
        );
        assert!(
            status.message().starts_with(&format!("{field}: ")),
            "{field}: {}",
            status.message()
        );
    }
    assert!(admin.list().await.is_empty(), "nothing was created");
    assert_eq!(admin.admitted("api", "k", 5).await, 3);
}

#[tokio::test]
async fn a_policy_holds_at_most_max_overrides() {
    let mut admin = start("[limits]\nmax_overrides = 2\n").await;
    admin.set(set("api", key("a"), 5)).await;
    admin.set(set("api", prefix("b"), 5)).await;
    // Replacing one is not one more.
    admin.set(set("api", key("a"), 6)).await;
    let status = admin
        .overrides
        .set_override(set("api", key("c"), 5))
        .await
        .expect_err("over the bound");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("limits.max_overrides"),
        "{}",
        status.message()
    );
    admin.set(set("bucket", key("c"), 5)).await;
    assert_eq!(admin.list().await.len(), 3);
}

#[tokio::test]
async fn explain_shows_the_state_in_force_and_consumes_nothing() {
    let mut admin = start("").await;
    admin.set(set("api", prefix("t:"), 5)).await;
    assert_eq!(admin.admitted("api", "t:1", 2).await, 2);
    for _ in 0..3 {
        let explained = admin.explain("api", "t:1").await;
        let state = explained.state.expect("a state");
        assert_eq!((state.limit, state.remaining, explained.used), (5, 3, 2));
        assert_eq!(explained.configured.map(|p| p.limit), Some(3));
        assert_eq!(explained.in_force.map(|p| p.limit), Some(5));
        let active = explained.active_override.expect("the prefix's");
        assert_eq!(
            active.scope.and_then(|s| s.scope),
            Some(pb::override_scope::Scope::Prefix("t:".to_owned()))
        );
        // NOON_30 is 30 s into its minute: the window resets at the minute.
        assert_eq!(explained.now_ms, NOON_30);
        assert_eq!(state.reset_after_ms, 30_000);
        assert_eq!(explained.reset_at_ms, NOON_30 + 30_000);
        assert_eq!(
            (explained.window_start_ms, explained.window_end_ms),
            (NOON_30 - 30_000, NOON_30 + 30_000)
        );
    }
    assert_eq!(
        admin.admitted("api", "t:1", 5).await,
        3,
        "explain took nothing"
    );
    // A fresh key: the whole limit, and nothing created by asking.
    let fresh = admin.explain("bucket", "new").await;
    assert_eq!(fresh.used, 0);
    assert_eq!(fresh.state.map(|s| s.reset_after_ms), Some(0));
    assert_eq!(admin.admitted("bucket", "new", 12).await, 10);
    let unknown = admin
        .explain
        .explain(pb::ExplainRequest {
            policy: "nope".to_owned(),
            key: "k".to_owned(),
        })
        .await
        .expect_err("unknown policy");
    assert_eq!(unknown.code(), Code::NotFound);
    let empty = admin
        .explain
        .explain(pb::ExplainRequest {
            policy: "api".to_owned(),
            key: String::new(),
        })
        .await
        .expect_err("empty key");
    assert_eq!(empty.code(), Code::InvalidArgument);
    assert!(empty.message().starts_with("key: "), "{}", empty.message());
}

#[tokio::test]
async fn allow_overrides_nobody_refuses_every_override_call_and_changes_nothing() {
    let mut admin =
        start("[limits]\nallow_overrides = \"nobody\"\nallow_reset = \"nobody\"\n").await;
    let status = admin
        .overrides
        .set_override(set("api", key("k"), 50))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status
            .message()
            .contains("limits.allow_overrides = \"nobody\""),
        "{}",
        status.message()
    );
    let listed = admin
        .overrides
        .list_overrides(pb::ListOverridesRequest::default())
        .await
        .expect_err("refused");
    assert_eq!(listed.code(), Code::PermissionDenied);
    let explained = admin
        .explain
        .explain(pb::ExplainRequest {
            policy: "api".to_owned(),
            key: "k".to_owned(),
        })
        .await
        .expect_err("gated like Reset");
    assert_eq!(explained.code(), Code::PermissionDenied);
    assert!(
        explained.message().contains("limits.allow_reset"),
        "{}",
        explained.message()
    );
    assert_eq!(admin.admitted("api", "k", 5).await, 3);
}

/// The CLI against the real binary: `override set|ls|rm` and `explain`,
/// and the audit line each change logs with the caller.
#[test]
fn the_cli_sets_lists_explains_and_removes_and_each_change_is_logged_with_the_caller() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("quotad.toml");
    std::fs::write(
        &config,
        format!("[server]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\n{POLICIES}"),
    )
    .expect("write config");
    let server = Server::spawn(&["serve", "--config", &config.to_string_lossy()]);
    let (grpc, _) = server.addresses();
    let addr = grpc.to_string();
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--addr", &addr]);
        let output = quotad(&all).output().expect("run quotad");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let err = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.code(), text, err)
    };
    let (code, out, err) = run(&[
        "override", "set", "--policy", "api", "--prefix", "tenant:", "--limit", "30",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out.trim(),
        "set policy api prefix \"tenant:\": limit 30 per the policy's window (was none)"
    );
    let audit = audit_line(&server, "override set");
    assert!(
        audit.contains("caller=127.0.0.1:")
            && audit.contains("policy=api")
            && audit.contains("scope=prefix \"tenant:\"")
            && audit.contains("old=none")
            && audit.contains("new=limit=30 window=- burst=- expires_at=-"),
        "{audit}"
    );
    let (code, out, err) = run(&[
        "override", "set", "--policy", "api", "--prefix", "tenant:", "--limit", "40", "--window",
        "2m",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("(was limit 30 per the policy's window)"),
        "{out}"
    );
    let audit = audit_line(&server, "override set");
    assert!(
        audit.contains("old=limit=30 window=-") && audit.contains("new=limit=40 window=120000ms"),
        "{audit}"
    );
    let (code, out, _) = run(&["override", "ls"]);
    assert_eq!(code, Some(0));
    assert!(
        out.starts_with(
            "policy api prefix \"tenant:\": limit 40 per 2m (runtime, set by 127.0.0.1:"
        ),
        "{out}"
    );
    let (code, out, err) = run(&["explain", "--policy", "api", "--key", "tenant:acme"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("override in force: prefix \"tenant:\", limit 40 per 2m"),
        "{out}"
    );
    assert!(out.contains("counted as fixed_window 40 per 2m"), "{out}");
    assert!(out.contains(": 0 of 40 counted, 40 left"), "{out}");
    let (code, _, err) = run(&[
        "override", "set", "--policy", "api", "--key", "k", "--limit", "0",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("INVALID_ARGUMENT") && err.contains("limit: "),
        "{err}"
    );
    let (code, out, _) = run(&["override", "rm", "--policy", "api", "--prefix", "tenant:"]);
    assert_eq!(code, Some(0));
    assert!(
        out.starts_with("removed policy api prefix \"tenant:\""),
        "{out}"
    );
    let audit = audit_line(&server, "override removed");
    assert!(
        audit.contains("old=limit=40") && audit.contains("new=\"none\""),
        "{audit}"
    );
    let (_, out, _) = run(&["override", "ls"]);
    assert_eq!(out.trim(), "no overrides");
}

/// The next log line of `server` that is an audit line saying `what`.
fn audit_line(server: &Server, what: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = server.lines.recv_timeout(left).expect("an audit line");
        if line.contains("quotad::audit") && line.contains(what) {
            return line;
        }
    }
}

/// The memory store keeps its runtime overrides in its snapshot: a
/// graceful restart serves the same overrides, and the counts under them.
#[tokio::test]
async fn runtime_overrides_survive_a_restart_in_the_memory_stores_snapshot() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("quotad.snapshot");
    let extra = format!("[store.snapshot]\npath = {path:?}\n");
    let mut admin = start(&extra).await;
    admin.set(set("api", prefix("t:"), 6)).await;
    let mut expiring = set("bucket", key("b"), 20);
    expiring.expires_at_ms = Some(NOON_30 + 60_000);
    admin.set(expiring).await;
    assert_eq!(admin.admitted("api", "t:1", 4).await, 4);
    let before = admin.list().await;
    admin
        .server
        .shutdown()
        .await
        .expect("a clean stop writes the snapshot");

    let mut admin = start(&extra).await;
    assert_eq!(
        admin.list().await,
        before,
        "the same overrides, who and when included"
    );
    assert_eq!(
        admin.admitted("api", "t:1", 4).await,
        2,
        "6 less the 4 counted"
    );
    assert_eq!(
        admin.explain("bucket", "b").await.in_force.map(|p| p.limit),
        Some(20)
    );
}

/// `[[overrides]]` reload with the policies; a runtime override of the same
/// policy and prefix wins over the file's until it is removed.
#[tokio::test]
async fn file_overrides_reload_with_the_policies_and_a_runtime_one_wins_over_them() {
    use crate::reload::write_atomically;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("quotad.toml");
    let text = |limit: u64| {
        format!(
            "[server]\nconfig_poll_interval = \"20ms\"\n{POLICIES}\n[[overrides]]\npolicy = \"api\"\nprefix = \"t:\"\nlimit = {limit}\n"
        )
    };
    write_atomically(&path, &text(5));
    let clock = Arc::new(FakeClock::new(NOON_30));
    let config = quotad::Config::load(Some(&path), &quotad::FlagValues::default())
        .expect("valid config")
        .with_clock(clock.clone());
    let server = TestServer::start(config).await;
    let channel = server.channel().await;
    let mut admin = Admin {
        overrides: OverridesClient::new(channel.clone()),
        explain: ExplainClient::new(channel),
        quota: server.client().await,
        server,
        clock,
    };
    let listed = admin.list().await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].source(), pb::OverrideSource::File);
    assert_eq!(admin.admitted("api", "t:1", 8).await, 5);
    write_atomically(&path, &text(7));
    crate::common::eventually(Duration::from_secs(10), "the file's new override", || {
        let mut explain = admin.explain.clone();
        async move {
            explain
                .explain(pb::ExplainRequest {
                    policy: "api".to_owned(),
                    key: "t:2".to_owned(),
                })
                .await
                .is_ok_and(|r| r.into_inner().in_force.is_some_and(|p| p.limit == 7))
        }
    })
    .await;
    assert_eq!(
        admin.admitted("api", "t:1", 8).await,
        2,
        "7 less the 5 counted"
    );
    let metrics = admin.server.metrics().await;
    assert_eq!(
        metrics.value("quotad_overrides", &[("policy", "api"), ("source", "file")]),
        1.0
    );
    // Runtime wins for the same prefix, and a reload does not undo it.
    admin.set(set("api", prefix("t:"), 20)).await;
    assert_eq!(
        admin.explain("api", "t:3").await.in_force.map(|p| p.limit),
        Some(20)
    );
    write_atomically(&path, &text(9));
    crate::common::eventually(Duration::from_secs(10), "the reload", || {
        let server = &admin.server;
        async move {
            server
                .metrics()
                .await
                .value("quotad_policy_reloads_total", &[("outcome", "ok")])
                >= 2.0
        }
    })
    .await;
    let listed = admin.list().await;
    assert_eq!(listed.len(), 1, "one override in force for the prefix");
    assert_eq!(
        (listed[0].limit, listed[0].source()),
        (20, pb::OverrideSource::Runtime)
    );
    admin
        .overrides
        .remove_override(pb::RemoveOverrideRequest {
            policy: "api".to_owned(),
            scope: prefix("t:"),
        })
        .await
        .expect("removed");
    assert_eq!(
        admin.explain("api", "t:3").await.in_force.map(|p| p.limit),
        Some(9)
    );
    // A bad file keeps what is in force.
    write_atomically(&path, &text(0));
    crate::common::eventually(Duration::from_secs(10), "the rejected reload", || {
        let server = &admin.server;
        async move {
            server
                .metrics()
                .await
                .value("quotad_policy_reloads_total", &[("outcome", "error")])
                >= 1.0
        }
    })
    .await;
    assert_eq!(
        admin.explain("api", "t:3").await.in_force.map(|p| p.limit),
        Some(9)
    );
}

/// With mTLS, `[auth] overrides` admits only its identities to the
/// override methods, and the override records who set it; Explain follows
/// `[auth] reset`.
#[tokio::test]
async fn the_overrides_allowlist_admits_only_its_identities_and_records_who_set_it() {
    use crate::pki::{Names, Pki};
    const OPS: &str = "spiffe://example.org/ops/alice";
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = Pki::new(&dir.path().join("tls"));
    let (server_cert, server_key) = pki.server();
    let path = dir.path().join("quotad.toml");
    std::fs::write(
        &path,
        format!(
            "[server.tls]\ncert = {server_cert:?}\nkey = {server_key:?}\nclient_ca = {ca:?}\n\n\
             [auth]\noverrides = [\"spiffe://example.org/ops/*\"]\nreset = [\"spiffe://example.org/ops/*\"]\n{POLICIES}",
            ca = pki.ca()
        ),
    )
    .expect("write the config");
    let config =
        quotad::Config::load(Some(&path), &quotad::FlagValues::default()).expect("valid config");
    let server = TestServer::start(config).await;
    let channel = |file: &str, names: Names<'_>| {
        let (client_cert, client_key) = pki.client(file, names);
        let tls = quotad_client::TlsConfig::from_pem_files(pki.ca())
            .expect("CA")
            .identity_from_pem_files(client_cert, client_key)
            .expect("client identity")
            .server_name("localhost");
        quotad_client::Client::builder(format!("https://127.0.0.1:{}", server.grpc_addr.port()))
            .tls(tls)
            .channel()
            .expect("a channel")
    };
    let ops = channel("ops", Names::uri(OPS));
    let app = channel("app", Names::dns("app.internal"));
    let refused = OverridesClient::new(app.clone())
        .set_override(set("api", key("k"), 50))
        .await
        .expect_err("app may not");
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        refused.message().contains("auth.overrides"),
        "{}",
        refused.message()
    );
    let explain = ExplainClient::new(app)
        .explain(pb::ExplainRequest {
            policy: "api".to_owned(),
            key: "k".to_owned(),
        })
        .await
        .expect_err("app may not");
    assert_eq!(explain.code(), Code::PermissionDenied);
    let mut by_ops = OverridesClient::new(ops.clone());
    assert!(
        by_ops
            .list_overrides(pb::ListOverridesRequest::default())
            .await
            .expect("listed")
            .into_inner()
            .overrides
            .is_empty(),
        "the refused call changed nothing"
    );
    by_ops
        .set_override(set("api", key("k"), 50))
        .await
        .expect("ops may");
    let listed = by_ops
        .list_overrides(pb::ListOverridesRequest::default())
        .await
        .expect("listed")
        .into_inner()
        .overrides;
    assert!(listed[0].set_by.starts_with(OPS), "{}", listed[0].set_by);
    let explained = ExplainClient::new(ops)
        .explain(pb::ExplainRequest {
            policy: "api".to_owned(),
            key: "k".to_owned(),
        })
        .await
        .expect("ops may explain")
        .into_inner();
    assert_eq!(explained.in_force.map(|p| p.limit), Some(50));
}

#[tokio::test]
async fn override_numbers_past_the_limits_bounds_are_invalid_argument_naming_the_field() {
    let mut admin = start(
        "[limits]\nmax_inline_limit = 1000\nmax_inline_window = \"1h\"\nmax_inline_log_limit = 50\n\
         [policies.log]\nalgorithm = \"sliding_log\"\nlimit = 10\nwindow = \"2h\"\n",
    )
    .await;
    let mut too_long = set("api", key("k"), 10);
    too_long.window_ms = Some(3_600_001);
    let mut burst = set("bucket", key("k"), 10);
    burst.burst = Some(1_001);
    for (request, field, setting) in [
        (
            set("api", key("k"), 1_001),
            "limit",
            "limits.max_inline_limit",
        ),
        (too_long, "window_ms", "limits.max_inline_window"),
        (burst, "burst", "limits.max_inline_limit"),
        (
            set("log", key("k"), 51),
            "limit",
            "limits.max_inline_log_limit",
        ),
    ] {
        let refused = admin
            .overrides
            .set_override(request)
            .await
            .expect_err("past a bound");
        assert_eq!(refused.code(), Code::InvalidArgument, "{field}");
        assert!(
            refused.message().starts_with(&format!("{field}:"))
                && refused.message().contains(setting),
            "{field}: {}",
            refused.message()
        );
    }
    assert!(admin.list().await.is_empty(), "nothing stored");
    assert_eq!(admin.admitted("api", "k", 5).await, 3);
    // At the bounds, and a window left to the policy's, are accepted.
    let mut at = set("api", key("k"), 1_000);
    at.window_ms = Some(3_600_000);
    admin.set(at).await;
    // The log's own window (2h) is past max_inline_window: left out, it
    // is the policy's, and not checked.
    let mut left_out = set("log", key("d"), 50);
    left_out.window_ms = None;
    admin.set(left_out).await;
    assert_eq!(admin.list().await.len(), 2);
}

#[tokio::test]
async fn an_expired_override_is_purged_and_no_longer_counts_towards_max_overrides() {
    let mut admin = start("[limits]\nmax_overrides = 1\n").await;
    let mut brief = set("api", key("brief"), 10);
    brief.expires_at_ms = Some(NOON_30 + 1_000);
    admin.set(brief).await;
    let full = admin
        .overrides
        .set_override(set("api", key("other"), 10))
        .await
        .expect_err("the policy is full");
    assert_eq!(full.code(), Code::InvalidArgument);
    admin.clock.advance(Duration::from_millis(1_000));
    admin.set(set("api", key("other"), 10)).await;
    let listed = admin.list().await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].scope, key("other"));
}
