//! RLS rules from files: hot reload on change, an invalid version kept
//! out, and `validate-config` naming the file, field and line.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use quotad::Config;
use quotad_core::FakeClock;

use crate::common::process::run_within;
use crate::common::{NOON_30, TestServer, eventually};
use crate::reload::write_atomically;
use crate::rls::{ask, descriptor, request, rls_client, rls_toml, rules_dir};

const RELOAD_LIMIT: Duration = Duration::from_secs(10);

fn rule(limit: &str) -> String {
    format!(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: {limit}\n"
    )
}

#[tokio::test]
async fn rules_reload_when_a_file_changes_and_an_invalid_edit_keeps_them() {
    let dir = rules_dir(&[("api.yaml", &rule("3"))]);
    let file = dir.path().join("api.yaml");
    let toml = format!(
        "[server]\nconfig_poll_interval = \"20ms\"\n\n{}",
        rls_toml(&dir, "")
    );
    let config = Config::from_toml(&toml)
        .expect("valid config")
        .with_clock(Arc::new(FakeClock::new(NOON_30)));
    let server = TestServer::start(config).await;
    let mut client = rls_client(&server).await;
    let limit_of = |response: quotad_proto::envoy::service::ratelimit::v3::RateLimitResponse| {
        response.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
    };
    let alice = || request("api", vec![descriptor(&[("user", "alice")])]);
    let first = ask(&mut client, alice()).await;
    assert_eq!(
        (limit_of(first.clone()), first.statuses[0].limit_remaining),
        (Some(3), 2)
    );

    write_atomically(&file, &rule("10"));
    eventually(RELOAD_LIMIT, "the new limit applies", || {
        let mut client = client.clone();
        async move {
            let mut probe = request("api", vec![descriptor(&[("user", "bob")])]);
            probe.descriptors[0].hits_addend = Some(0);
            limit_of(ask(&mut client, probe).await) == Some(10)
        }
    })
    .await;
    // The rule kept its place, so alice's count carried over: 10 - 2.
    assert_eq!(
        ask(&mut client, alice()).await.statuses[0].limit_remaining,
        8
    );

    write_atomically(&file, &rule("ten"));
    eventually(RELOAD_LIMIT, "the invalid edit is counted", || async {
        server
            .metrics()
            .await
            .value("quotad_rls_reloads_total", &[("outcome", "error")])
            >= 1.0
    })
    .await;
    let kept = ask(&mut client, alice()).await;
    assert_eq!(
        (limit_of(kept.clone()), kept.statuses[0].limit_remaining),
        (Some(10), 7)
    );

    // A new file joins; a removed one leaves.
    std::fs::write(dir.path().join("web.yaml"), "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
        .expect("write a second file");
    write_atomically(&file, &rule("10"));
    eventually(RELOAD_LIMIT, "the web domain is served", || {
        let mut client = client.clone();
        async move {
            let web = request("web", vec![descriptor(&[("ip", "1")])]);
            ask(&mut client, web).await.statuses[0]
                .current_limit
                .is_some()
        }
    })
    .await;
    let metrics = server.metrics().await;
    assert_eq!(metrics.value("quotad_rls_rules", &[]), 2.0);
    assert!(metrics.value("quotad_rls_reloads_total", &[("outcome", "ok")]) >= 2.0);
}

#[test]
fn validate_config_names_the_rules_file_field_and_line() {
    let dir = rules_dir(&[
        ("a.yaml", &rule("5")),
        (
            "b.yaml",
            "domain: web\ndescriptors:\n  - key: ip\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
        ),
    ]);
    let toml = dir.path().join("quotad.toml");
    std::fs::write(&toml, "[rls]\nconfig_dir = \".\"\n").expect("write config");
    let mut command = Command::new(env!("CARGO_BIN_EXE_quotad"));
    command.args(["validate-config", &toml.to_string_lossy()]);
    command.env_remove("QUOTAD_RLS_CONFIG");
    let out = run_within(command, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(2), "{}", out.transcript());
    let file = dir.path().join("b.yaml");
    assert!(
        out.stderr.contains(&format!(
            "{}: descriptors[0].rate_limit.unit: invalid rate limit unit \"fortnight\"",
            file.display()
        )) && out.stderr.contains("(line 5, column 13)"),
        "{}",
        out.transcript()
    );

    // --rls-config checks another folder in its place.
    let good = rules_dir(&[("a.yaml", &rule("5"))]);
    let mut command = Command::new(env!("CARGO_BIN_EXE_quotad"));
    command.args([
        "validate-config",
        &toml.to_string_lossy(),
        "--rls-config",
        &good.path().to_string_lossy(),
    ]);
    let out = run_within(command, Duration::from_secs(30));
    assert!(out.status.success(), "{}", out.transcript());
    assert!(
        out.stdout.contains("1 RLS rule in 1 domain from"),
        "{}",
        out.transcript()
    );
}

/// `[limits]` is read as reloaded for the limits Envoy sends too: the
/// switch turned off in the config file refuses them without a restart.
#[tokio::test]
async fn a_reloaded_limits_section_bounds_the_limits_envoy_sends() {
    use quotad::FlagValues;
    use quotad_proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;

    let rules = rules_dir(&[("api.yaml", &rule("3"))]);
    let folder = tempfile::tempdir().expect("temp dir");
    let path = folder.path().join("quotad.toml");
    let text = |allow: bool| {
        format!(
            "[server]\nconfig_poll_interval = \"20ms\"\n\n[limits]\nallow_inline_policies = {allow}\n\n{}",
            rls_toml(&rules, "")
        )
    };
    write_atomically(&path, &text(true));
    let config = Config::load(Some(&path), &FlagValues::default())
        .expect("valid config")
        .with_clock(Arc::new(FakeClock::new(NOON_30)));
    let server = TestServer::start(config).await;
    let mut client = rls_client(&server).await;
    let sent = || {
        let mut d = descriptor(&[("user", "bob")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 100,
            unit: 2,
        });
        request("api", vec![d])
    };
    assert_eq!(
        ask(&mut client, sent()).await.statuses[0].limit_remaining,
        99
    );

    write_atomically(&path, &text(false));
    eventually(RELOAD_LIMIT, "sent limits are refused", || {
        let mut client = client.clone();
        async move {
            client
                .should_rate_limit(sent())
                .await
                .is_err_and(|s| s.code() == tonic::Code::FailedPrecondition)
        }
    })
    .await;
}
