//! `quotad.v1.Leases` end to end: leases acquired, renewed with what was
//! spent and returned, seen by `Check` as budget already charged; direct
//! answers near exhaustion; refusals that name their field and change
//! nothing; reloads of lease settings; and many holders at once never
//! admitting more than the limit.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quotad::{Config, FlagValues};
use quotad_core::FakeClock;
use quotad_proto::v1 as pb;
use quotad_proto::v1::leases_client::LeasesClient;
use quotad_proto::v1::quota_client::QuotaClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::common::binary::quotad;
use crate::common::{NOON_30, TestServer, check, eventually, health_status, named, peek};
use crate::reload::write_atomically;

/// `api` leases up to 40 units (none below 10) for up to 10 s; `plain` has
/// no lease settings. Inline lease terms may ask for at most 50 units and
/// 5 s.
const CONFIG: &str = r#"
[store]
max_key_bytes = 16

[limits]
lease_max_units = 50
lease_max_ttl = "5s"

[policies.api]
algorithm = "fixed_window"
limit = 100
window = "1m"
lease = { max_units = 40, min_units = 10, max_ttl = "10s" }

[policies.plain]
algorithm = "fixed_window"
limit = 100
window = "1m"
"#;

async fn start(toml: &str) -> (Arc<FakeClock>, TestServer) {
    let clock = Arc::new(FakeClock::new(NOON_30));
    let server = TestServer::start_toml(toml, clock.clone()).await;
    (clock, server)
}

async fn clients(server: &TestServer) -> (LeasesClient<Channel>, QuotaClient<Channel>) {
    let channel = server.channel().await;
    (
        LeasesClient::new(channel.clone()),
        QuotaClient::new(channel),
    )
}

/// A lease request of `key` under the named `policy`: settle `settle`
/// (a lease id and what was spent of it), then ask for `want` units.
fn ask(key: &str, policy: &str, want: u64, settle: Option<(&str, u64)>) -> pb::LeaseRequest {
    pb::LeaseRequest {
        key: key.to_owned(),
        policy: Some(pb::lease_request::Policy::PolicyName(policy.to_owned())),
        inline_terms: None,
        want,
        settle: settle.map(|(lease_id, spent)| pb::LeaseSettle {
            lease_id: lease_id.to_owned(),
            spent,
        }),
    }
}

/// A lease request under an inline fixed window of 100 a minute.
fn ask_inline(key: &str, terms: Option<pb::LeaseTerms>) -> pb::LeaseRequest {
    pb::LeaseRequest {
        policy: Some(pb::lease_request::Policy::InlinePolicy(inline_policy())),
        inline_terms: terms,
        ..ask(key, "unused", 10, None)
    }
}

fn inline_policy() -> pb::Policy {
    crate::common::policy(pb::Algorithm::FixedWindow, 100, 60_000, None)
}

fn terms(max_units: u64, min_units: u64, max_ttl_ms: u64) -> pb::LeaseTerms {
    pb::LeaseTerms {
        max_units,
        min_units,
        max_ttl_ms,
    }
}

async fn lease(client: &mut LeasesClient<Channel>, request: pb::LeaseRequest) -> pb::LeaseResponse {
    client
        .lease(request)
        .await
        .expect("the lease request is answered")
        .into_inner()
}

/// What `Peek` says is left of `key` under `policy`.
async fn left(quota: &mut QuotaClient<Channel>, key: &str, policy: &str) -> u64 {
    peek(quota, named(key, policy, None)).await.remaining
}

fn settled(response: &pb::LeaseResponse) -> pb::Settled {
    pb::Settled::try_from(response.settled).expect("a known Settled value")
}

#[tokio::test]
async fn a_lease_is_acquired_renewed_and_returned_and_checks_see_the_budget_net_of_it() {
    let (clock, server) = start(CONFIG).await;
    let (mut leases, mut quota) = clients(&server).await;

    let first = lease(&mut leases, ask("u", "api", 30, None)).await;
    let held = first.lease.clone().expect("far from the limit: a lease");
    assert_eq!((held.units, held.ttl_ms), (30, 10_000));
    assert_eq!(held.lease_id.len(), 32, "{}", held.lease_id);
    assert!(!first.direct);
    assert_eq!(settled(&first), pb::Settled::Unspecified);
    assert_eq!((first.remaining, first.limit), (70, 100));
    assert_eq!(
        left(&mut quota, "u", "api").await,
        70,
        "charged when granted"
    );

    // Renew: 10 of the 30 were spent, 20 go back, 30 more are charged.
    let renewed = lease(&mut leases, ask("u", "api", 30, Some((&held.lease_id, 10)))).await;
    assert_eq!(settled(&renewed), pb::Settled::Returned);
    assert_eq!(renewed.returned, 20);
    let second = renewed.lease.clone().expect("a new lease");
    assert_eq!(second.units, 30);
    assert_ne!(second.lease_id, held.lease_id);
    assert_eq!(renewed.remaining, 60);
    assert_eq!(left(&mut quota, "u", "api").await, 60);

    // Return: 25 spent, 5 back, nothing asked for.
    let returned = lease(
        &mut leases,
        ask("u", "api", 0, Some((&second.lease_id, 25))),
    )
    .await;
    assert_eq!(settled(&returned), pb::Settled::Returned);
    assert_eq!(returned.returned, 5);
    assert!(returned.lease.is_none() && !returned.direct);
    assert_eq!(returned.remaining, 65);
    let decision = check(&mut quota, named("u", "api", None)).await;
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 64, "a check counts on the same state");

    // A lease settled once is gone: settling it again is NOT_FOUND and
    // changes nothing.
    let again = leases
        .lease(ask("u", "api", 10, Some((&second.lease_id, 0))))
        .await
        .expect_err("already returned");
    assert_eq!(again.code(), Code::NotFound);
    assert!(
        again.message().starts_with("settle.lease_id: "),
        "{}",
        again.message()
    );
    assert_eq!(left(&mut quota, "u", "api").await, 64);

    // A lease whose time is up settles as ended: its unspent units were
    // lost when it ended, and are not counted back.
    let third = lease(&mut leases, ask("u", "api", 40, None))
        .await
        .lease
        .expect("a lease");
    assert_eq!(third.units, 40);
    clock.advance(Duration::from_secs(11));
    let ended = lease(&mut leases, ask("u", "api", 0, Some((&third.lease_id, 0)))).await;
    assert_eq!(settled(&ended), pb::Settled::Ended);
    assert_eq!(ended.returned, 0);
    assert_eq!(left(&mut quota, "u", "api").await, 24);

    let metrics = server.metrics().await;
    let leases_of = |outcome: &str| {
        metrics.value(
            "quotad_leases_total",
            &[("policy", "api"), ("outcome", outcome)],
        )
    };
    assert_eq!(leases_of("granted"), 3.0);
    assert_eq!(leases_of("returned"), 2.0);
    assert_eq!(leases_of("ended"), 1.0);
    assert_eq!(leases_of("refused"), 1.0, "the second settle of one lease");
    let units = |name: &str| metrics.value(name, &[("policy", "api")]);
    assert_eq!(units("quotad_lease_units_granted_total"), 100.0);
    assert_eq!(units("quotad_lease_units_returned_total"), 25.0);
    assert!(
        metrics
            .series("quotad_leases_total")
            .iter()
            .all(|(labels, _)| !labels.values().any(|v| v == "u")),
        "no key in any label"
    );
    assert_eq!(
        metrics.value(
            "quotad_store_operations_total",
            &[("backend", "memory"), ("op", "lease")]
        ),
        6.0
    );
}

#[tokio::test]
async fn near_exhaustion_the_answer_is_direct_and_checks_decide_the_rest_exactly() {
    let (_clock, server) = start(CONFIG).await;
    let (mut leases, mut quota) = clients(&server).await;
    // Each lease is a fair share of what is free: 100, then 60 over two
    // holders, then 30 over three.
    let mut held = Vec::new();
    for units in [40, 30, 10] {
        let response = lease(&mut leases, ask("v", "api", 40, None)).await;
        let granted = response.lease.expect("a lease");
        assert_eq!(granted.units, units);
        held.push(granted);
    }
    // 20 free over four holders is 5, below min_units: direct.
    let direct = lease(&mut leases, ask("v", "api", 40, None)).await;
    assert!(direct.direct);
    assert!(direct.lease.is_none());
    assert_eq!(direct.remaining, 20);

    let mut admitted = 0;
    for _ in 0..25 {
        admitted += u64::from(check(&mut quota, named("v", "api", None)).await.allowed);
    }
    assert_eq!(admitted, 20, "direct checks decide what is left, exactly");
    assert_eq!(left(&mut quota, "v", "api").await, 0);

    // A holder returns its 10 unspent units: checks admit exactly those.
    let back = lease(
        &mut leases,
        ask("v", "api", 0, Some((&held[2].lease_id, 0))),
    )
    .await;
    assert_eq!(back.returned, 10);
    let mut admitted = 0;
    for _ in 0..15 {
        admitted += u64::from(check(&mut quota, named("v", "api", None)).await.allowed);
    }
    assert_eq!(admitted, 10);
    let metrics = server.metrics().await;
    assert_eq!(
        metrics.value(
            "quotad_leases_total",
            &[("policy", "api"), ("outcome", "direct")]
        ),
        1.0
    );
}

#[tokio::test]
async fn refused_lease_requests_name_their_field_and_change_nothing() {
    let (_clock, server) = start(CONFIG).await;
    let (mut leases, mut quota) = clients(&server).await;
    let held = lease(&mut leases, ask("k", "api", 30, None))
        .await
        .lease
        .expect("a lease");
    let before = left(&mut quota, "k", "api").await;
    assert_eq!(before, 70);

    // Well formed, but never granted; its end is still to come.
    let unknown = format!("{:016x}{:016x}", 12_345_u64, NOON_30 + 5_000);
    let too_long_key = "k".repeat(17);
    let cases: Vec<(pb::LeaseRequest, Code, &str)> = vec![
        (
            ask("k", "api", 10, Some((&unknown, 0))),
            Code::NotFound,
            "settle.lease_id: ",
        ),
        (
            ask("k", "api", 10, Some(("not-a-lease-id", 0))),
            Code::InvalidArgument,
            "settle.lease_id: ",
        ),
        (
            ask("k", "api", 10, Some((&held.lease_id.to_uppercase(), 0))),
            Code::InvalidArgument,
            "settle.lease_id: ",
        ),
        (
            ask("k", "api", 10, Some((&held.lease_id, 31))),
            Code::InvalidArgument,
            "settle.spent: must be at most the lease's 30 units (got 31)",
        ),
        (
            ask("k", "plain", 10, None),
            Code::InvalidArgument,
            "policy_name: policy \"plain\" has no lease settings",
        ),
        (ask("k", "nope", 10, None), Code::NotFound, "policy_name: "),
        (
            ask("k", "api", (1 << 53) + 1, None),
            Code::InvalidArgument,
            "want: ",
        ),
        (ask("", "api", 10, None), Code::InvalidArgument, "key: "),
        (
            ask(&too_long_key, "api", 10, None),
            Code::InvalidArgument,
            "key: must be at most 16 bytes",
        ),
        (
            pb::LeaseRequest {
                policy: None,
                ..ask("k", "api", 10, None)
            },
            Code::InvalidArgument,
            "policy: ",
        ),
        (
            ask_inline("k", None),
            Code::InvalidArgument,
            "inline_terms: ",
        ),
        (
            ask_inline("k", Some(terms(51, 1, 1_000))),
            Code::InvalidArgument,
            "inline_terms.max_units: must be at most 50 for an inline policy (limits.lease_max_units)",
        ),
        (
            ask_inline("k", Some(terms(10, 1, 5_001))),
            Code::InvalidArgument,
            "inline_terms.max_ttl_ms: must be at most 5000 for an inline policy (limits.lease_max_ttl)",
        ),
        (
            ask_inline("k", Some(terms(10, 11, 1_000))),
            Code::InvalidArgument,
            "inline_terms.min_units: ",
        ),
        (
            ask_inline("k", Some(terms(0, 1, 1_000))),
            Code::InvalidArgument,
            "inline_terms.max_units: ",
        ),
    ];
    for (request, code, message) in cases {
        let status = leases.lease(request).await.expect_err(message);
        assert_eq!(status.code(), code, "{}", status.message());
        assert!(
            status.message().starts_with(message),
            "expected {message:?}, got {:?}",
            status.message()
        );
    }
    assert_eq!(
        left(&mut quota, "k", "api").await,
        before,
        "nothing consumed"
    );
    assert_eq!(server.metrics().await.live_keys(), 1.0, "nothing created");
    // The lease reported overspent is still held, and settles as usual.
    let back = lease(&mut leases, ask("k", "api", 0, Some((&held.lease_id, 30)))).await;
    assert_eq!(settled(&back), pb::Settled::Returned);

    // Inline terms within the bounds lease from the inline policy's own
    // state, counted under `inline`.
    let inline = lease(&mut leases, ask_inline("k", Some(terms(50, 1, 5_000)))).await;
    let granted = inline.lease.expect("an inline lease");
    assert_eq!((granted.units, granted.ttl_ms), (10, 5_000));
    let metrics = server.metrics().await;
    assert_eq!(
        metrics.value(
            "quotad_leases_total",
            &[("policy", "inline"), ("outcome", "granted")]
        ),
        1.0
    );
    assert_eq!(
        metrics.value(
            "quotad_leases_total",
            &[("policy", "api"), ("outcome", "refused")]
        ),
        2.0,
        "the unknown and the overspent lease; the others never reached the store"
    );
}

/// A config file with `api` leasing as `lease` says (nothing: no leases),
/// polled every 20 ms.
fn reloadable(lease: &str) -> String {
    format!(
        "[server]\nconfig_poll_interval = \"20ms\"\n\n[policies.api]\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"\n{lease}\n"
    )
}

#[tokio::test]
async fn a_reload_adds_changes_and_removes_lease_settings_and_an_invalid_one_keeps_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("quotad.toml");
    std::fs::write(&path, reloadable("")).expect("write config");
    let config = Config::load(Some(&path), &FlagValues::default())
        .expect("valid config")
        .with_clock(Arc::new(FakeClock::new(NOON_30)));
    let server = TestServer::start(config).await;
    let (mut leases, _quota) = clients(&server).await;
    let refused = leases
        .lease(ask("r", "api", 10, None))
        .await
        .expect_err("no lease settings yet");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().starts_with("policy_name: "),
        "{}",
        refused.message()
    );

    let limit = Duration::from_secs(10);
    write_atomically(
        &path,
        &reloadable("lease = { max_units = 20, max_ttl = \"5s\" }"),
    );
    eventually(limit, "the lease settings are served", || {
        let mut leases = leases.clone();
        async move { leases.lease(ask("r", "api", 50, None)).await.is_ok() }
    })
    .await;
    let granted = lease(&mut leases, ask("r", "api", 50, None))
        .await
        .lease
        .expect("a lease once reloaded");
    assert_eq!((granted.units, granted.ttl_ms), (20, 5_000));
    let (_, body) = server.get("/policies").await;
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        json["policies"]["api"]["lease"],
        serde_json::json!({"max_units": 20, "min_units": 1, "max_ttl_ms": 5_000})
    );

    // An invalid lease table keeps the running settings.
    write_atomically(
        &path,
        &reloadable("lease = { max_units = 0, max_ttl = \"5s\" }"),
    );
    eventually(limit, "the invalid file is counted", || async {
        server
            .metrics()
            .await
            .value("quotad_policy_reloads_total", &[("outcome", "error")])
            == 1.0
    })
    .await;
    let kept = lease(
        &mut leases,
        ask("r", "api", 50, Some((&granted.lease_id, 20))),
    )
    .await;
    assert_eq!(kept.lease.expect("still leasing").units, 20);

    // Removed: the policy answers every lease request as having none.
    write_atomically(&path, &reloadable(""));
    eventually(limit, "the lease settings are gone", || {
        let mut leases = leases.clone();
        async move {
            leases
                .lease(ask("r", "api", 10, None))
                .await
                .is_err_and(|s| s.code() == Code::InvalidArgument)
        }
    })
    .await;
}

/// Eight holders lease and spend one key's budget at once, renewing with
/// what they spent, while two more clients check directly; demand exceeds
/// the limit. What all of them admit adds up to the limit exactly, never
/// more, in each of five windows.
#[tokio::test]
async fn concurrent_holders_and_direct_checks_admit_exactly_the_limit_and_never_more() {
    const LIMIT: u64 = 1_000;
    let toml = format!(
        "[policies.shared]\nalgorithm = \"fixed_window\"\nlimit = {LIMIT}\nwindow = \"1m\"\nlease = {{ max_units = 50, min_units = 5, max_ttl = \"10s\" }}\n"
    );
    let (clock, server) = start(&toml).await;
    let channel = server.channel().await;
    for round in 0..5_u64 {
        let mut tasks = Vec::new();
        for holder in 0..8_u64 {
            let mut leases = LeasesClient::new(channel.clone());
            let mut quota = QuotaClient::new(channel.clone());
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0_u64;
                let mut held: Option<pb::Lease> = None;
                for step in 0..10_000_u64 {
                    // Spends all or nearly all of what it holds, never more:
                    // some units go back on each renewal.
                    let settle = held.take().map(|l| {
                        let spent = l.units.saturating_sub((holder + round + step) % 4);
                        admitted += spent;
                        (l.lease_id, spent)
                    });
                    let request = ask(
                        "hot",
                        "shared",
                        50,
                        settle.as_ref().map(|(id, spent)| (id.as_str(), *spent)),
                    );
                    let answer = leases.lease(request).await.expect("answered").into_inner();
                    if let Some(granted) = answer.lease {
                        held = Some(granted);
                        continue;
                    }
                    assert!(answer.direct, "asked for units: a lease or direct");
                    if check(&mut quota, named("hot", "shared", None))
                        .await
                        .allowed
                    {
                        admitted += 1;
                    } else {
                        // Nothing held, nothing left: done.
                        return admitted;
                    }
                }
                panic!("holder {holder} never ran out")
            }));
        }
        for _ in 0..2 {
            let mut quota = QuotaClient::new(channel.clone());
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                while check(&mut quota, named("hot", "shared", None))
                    .await
                    .allowed
                {
                    admitted += 1;
                }
                admitted
            }));
        }
        let mut total = 0;
        for task in tasks {
            total += task.await.expect("no task panics");
        }
        assert!(total <= LIMIT, "round {round}: {total} admitted of {LIMIT}");
        assert_eq!(total, LIMIT, "round {round}: demand exceeds the limit");
        let mut quota = QuotaClient::new(channel.clone());
        assert_eq!(left(&mut quota, "hot", "shared").await, 0);
        // The next window: a fresh budget, and every lease of this one over.
        clock.advance(Duration::from_secs(60));
    }
    // Leases did the bulk of the work, units went back on renewal, and the
    // end of each budget was answered direct.
    let metrics = server.metrics().await;
    let count = |name: &str, labels: &[(&str, &str)]| metrics.value(name, labels);
    let shared = |outcome| {
        count(
            "quotad_leases_total",
            &[("policy", "shared"), ("outcome", outcome)],
        )
    };
    assert!(shared("granted") >= 5.0 * 8.0, "{}", metrics.text);
    assert!(shared("direct") >= 5.0, "{}", metrics.text);
    assert!(
        count("quotad_lease_units_returned_total", &[("policy", "shared")]) > 0.0,
        "{}",
        metrics.text
    );
    assert_eq!(shared("refused"), 0.0);
}

#[tokio::test]
async fn health_and_reflection_list_the_leases_service() {
    let (_clock, server) = start(CONFIG).await;
    let name = "quotad.v1.Leases";
    assert_eq!(
        health_status(&server, name).await,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let services = crate::decisions::reflection_v1(&server).await;
    assert!(services.contains(&name.to_owned()), "{services:?}");
}

fn validate(path: &Path) -> (Option<i32>, String) {
    let output = quotad(&["validate-config", &path.to_string_lossy()])
        .output()
        .expect("run quotad");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn validate_config_names_the_file_field_and_line_of_bad_lease_settings() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("leases.toml");
    for (lease, says) in [
        (
            "lease = { max_units = 10, min_units = 20, max_ttl = \"1s\" }",
            "policies.api.lease.min_units: lease.min_units must be from 1 to lease.max_units (10), got 20 (line 5)",
        ),
        (
            "lease = { max_units = 10, max_ttl = \"0s\" }",
            "policies.api.lease.max_ttl: lease.max_ttl must be from 1ms to 1d (line 5)",
        ),
    ] {
        let text = format!(
            "[policies.api]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n{lease}\n"
        );
        std::fs::write(&path, text).expect("write config");
        let (code, stderr) = validate(&path);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(
            stderr.contains(&path.to_string_lossy().into_owned()),
            "{stderr}"
        );
        assert!(stderr.contains(says), "expected {says:?} in {stderr}");
    }
    std::fs::write(&path, "[limits]\nlease_max_ttl = \"soon\"\n").expect("write config");
    let (code, stderr) = validate(&path);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("limits.lease_max_ttl: invalid duration"),
        "{stderr}"
    );
    assert!(stderr.contains("(line 2)"), "{stderr}");
}
