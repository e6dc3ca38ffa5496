//! Calendar quotas through gRPC: named and inline policies over local days
//! and months, the exact reset at local midnight, bad input refused naming
//! the field (nothing created), config errors naming file, field and line,
//! and a daily quota that survives a restart (snapshot) and Redis.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use quotad::{Config, FlagValues};
use quotad_core::FakeClock;
use quotad_proto::v1 as pb;
use tonic::Code;

use crate::common::redis::RedisServer;
use crate::common::{TestServer, check, check_batch, inline, named, peek};

const HOUR: u64 = 3_600_000;
const MINUTE: u64 = 60_000;
/// 2024-03-10 01:00 EST (06:00 UTC): New York's 23-hour day.
const NY_SPRING_1AM: u64 = 1_710_050_400_000;
/// 2024-03-11 00:00 EDT (04:00 UTC): its end.
const NY_SPRING_END: u64 = 1_710_129_600_000;

const POLICIES: &str = r#"
[policies.daily]
algorithm = "fixed_window"
limit = 3
period = "day"
time_zone = "America/New_York"

[policies.monthly]
algorithm = "fixed_window"
limit = 100
period = "month"
time_zone = "Asia/Kathmandu"

[policies.weekly]
algorithm = "fixed_window"
limit = 2
period = "week"
week_start = "sunday"
time_zone = "Europe/Berlin"
"#;

fn daily_inline() -> pb::Policy {
    pb::Policy {
        algorithm: pb::Algorithm::FixedWindow.into(),
        limit: 3,
        period: "day".to_owned(),
        time_zone: "America/New_York".to_owned(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_named_daily_quota_resets_at_new_york_midnight_on_the_23_hour_day() {
    let clock = Arc::new(FakeClock::new(NY_SPRING_1AM));
    let server = TestServer::start_toml(POLICIES, clock.clone()).await;
    let mut client = server.client().await;
    for remaining in [2, 1, 0] {
        let d = check(&mut client, named("alice", "daily", None)).await;
        assert!(d.allowed);
        assert_eq!(d.remaining, remaining);
        assert_eq!(d.reset_after_ms, NY_SPRING_END - NY_SPRING_1AM);
    }
    clock.advance(Duration::from_millis(HOUR));
    let denied = check(&mut client, named("alice", "daily", None)).await;
    assert_eq!(denied.reason(), pb::Reason::LimitExceeded);
    // 22 hours to local midnight: the day has 23.
    assert_eq!(denied.retry_after_ms, 21 * HOUR);
    clock.set(NY_SPRING_END - 1);
    assert!(
        !peek(&mut client, named("alice", "daily", None))
            .await
            .allowed
    );
    clock.set(NY_SPRING_END);
    let next = check(&mut client, named("alice", "daily", None)).await;
    assert!(next.allowed);
    assert_eq!(next.remaining, 2);
    assert_eq!(next.reset_after_ms, 24 * HOUR);
    // The admin endpoint lists the period with the policy.
    let (status, body) = server.get("/policies").await;
    assert_eq!(status, 200);
    assert!(
        body.contains(r#""period":"day@America/New_York""#),
        "{body}"
    );
    assert!(
        body.contains(r#""period":"week:sunday@Europe/Berlin""#),
        "{body}"
    );
}

#[tokio::test]
async fn an_inline_daily_quota_decides_as_the_named_one_with_its_own_budget() {
    let clock = Arc::new(FakeClock::new(NY_SPRING_1AM));
    let server = TestServer::start_toml(POLICIES, clock.clone()).await;
    let mut client = server.client().await;
    let items = vec![
        named("bob", "daily", Some(2)),
        inline("bob", daily_inline(), Some(2)),
    ];
    let decisions = check_batch(&mut client, items, pb::BatchMode::AllOrNothing).await;
    for d in &decisions {
        assert!(d.allowed && d.remaining == 1, "{d:?}");
        assert_eq!(d.reset_after_ms, NY_SPRING_END - NY_SPRING_1AM);
    }
    // Another zone is another inline policy, with a budget of its own.
    let berlin = pb::Policy {
        time_zone: "Europe/Berlin".to_owned(),
        ..daily_inline()
    };
    let d = check(&mut client, inline("bob", berlin, Some(3))).await;
    assert!(d.allowed && d.remaining == 0);
    // 2024-03-10 07:00 CET; Berlin's midnight is 17 hours on.
    assert_eq!(d.reset_after_ms, 17 * HOUR);
    let d = check(&mut client, inline("bob", daily_inline(), Some(2))).await;
    assert_eq!(d.reason(), pb::Reason::LimitExceeded);
}

#[tokio::test]
async fn months_and_weeks_reset_at_their_local_starts() {
    // 2024-02-29 12:00 UTC: Kathmandu's March starts 2024-02-29 18:15 UTC.
    let at = 1_709_208_000_000;
    let clock = Arc::new(FakeClock::new(at));
    let server = TestServer::start_toml(POLICIES, clock.clone()).await;
    let mut client = server.client().await;
    let d = check(&mut client, named("carol", "monthly", Some(100))).await;
    assert!(d.allowed);
    assert_eq!(d.reset_after_ms, 6 * HOUR + 15 * MINUTE);
    // Thursday; Berlin's week from Sunday ends 2024-03-03 00:00 CET.
    let d = check(&mut client, named("carol", "weekly", None)).await;
    assert_eq!(d.reset_after_ms, 2 * 24 * HOUR + 11 * HOUR);
    clock.advance(Duration::from_millis(6 * HOUR + 15 * MINUTE));
    let d = check(&mut client, named("carol", "monthly", None)).await;
    assert!(d.allowed && d.remaining == 99, "{d:?}");
    // March has 31 days.
    assert_eq!(d.reset_after_ms, 31 * 24 * HOUR);
}

#[tokio::test]
async fn a_bad_inline_calendar_is_invalid_argument_naming_the_field_and_creates_nothing() {
    let clock = Arc::new(FakeClock::new(NY_SPRING_1AM));
    let server = TestServer::start_toml(POLICIES, clock.clone()).await;
    let mut client = server.client().await;
    let cases = [
        (
            pb::Policy {
                time_zone: "Mars/Olympus_Mons".to_owned(),
                ..daily_inline()
            },
            "inline_policy.time_zone",
        ),
        (
            pb::Policy {
                period: "fortnight".to_owned(),
                ..daily_inline()
            },
            "inline_policy.period",
        ),
        (
            pb::Policy {
                window_ms: 86_400_000,
                ..daily_inline()
            },
            "inline_policy.period",
        ),
        (
            pb::Policy {
                algorithm: pb::Algorithm::SlidingWindow.into(),
                ..daily_inline()
            },
            "inline_policy.period",
        ),
        (
            pb::Policy {
                week_start: "sunday".to_owned(),
                ..daily_inline()
            },
            "inline_policy.week_start",
        ),
        (
            pb::Policy {
                period: String::new(),
                window_ms: 1_000,
                ..daily_inline()
            },
            "inline_policy.time_zone",
        ),
    ];
    for (policy, field) in cases {
        let status = client
            .check(inline("dave", policy.clone(), None))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument, "{policy:?}");
        assert!(
            status.message().starts_with(&format!("{field}:")),
            "{field}: {}",
            status.message()
        );
    }
    // Nothing was created: the valid policy's budget is whole.
    let d = peek(&mut client, inline("dave", daily_inline(), None)).await;
    assert_eq!(d.remaining, 3);
    assert_eq!(server.metrics().await.live_keys(), 0.0);
}

/// The error of loading `text` as the config file `path`.
fn load_error(path: &Path, text: &str) -> String {
    std::fs::write(path, text).expect("write the config");
    Config::load(Some(path), &FlagValues::default())
        .expect_err("refused")
        .to_string()
}

#[test]
fn a_bad_calendar_in_the_config_names_the_file_the_field_and_the_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("quotad.toml");
    let head = "[policies.daily]\nalgorithm = \"fixed_window\"\nlimit = 3\n";
    let cases = [
        (
            "period = \"day\"\ntime_zone = \"Mars/Olympus_Mons\"\n",
            "policies.daily.time_zone",
            5,
            "unknown time zone \"Mars/Olympus_Mons\"",
        ),
        (
            "period = \"day\"\nwindow = \"1d\"\n",
            "policies.daily.period",
            4,
            "either window",
        ),
        (
            "period = \"day\"\nweek_start = \"sunday\"\n",
            "policies.daily.week_start",
            5,
            "only with period = \"week\"",
        ),
        (
            "window = \"1d\"\ntime_zone = \"UTC\"\n",
            "policies.daily.time_zone",
            5,
            "only with a period",
        ),
        (
            "period = \"fortnight\"\n",
            "policies.daily.period",
            4,
            "unknown period",
        ),
    ];
    for (tail, field, line, message) in cases {
        let error = load_error(&path, &format!("{head}{tail}"));
        assert!(error.contains(field), "{field}: {error}");
        assert!(error.contains(&format!("line {line}")), "{line}: {error}");
        assert!(error.contains(message), "{message}: {error}");
    }
    let error = load_error(
        &path,
        "[policies.daily]\nalgorithm = \"token_bucket\"\nlimit = 3\nperiod = \"day\"\n",
    );
    // The binary names the file, and exits 2 before binding anything.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_quotad"))
        .arg("validate-config")
        .arg(&path)
        .output()
        .expect("run quotad");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "invalid config {}: policies.daily.period",
            path.display()
        )),
        "{stderr}"
    );
    assert!(
        error.contains("policies.daily.period")
            && error.contains("period applies only to fixed_window, not token_bucket")
            && error.contains("line 4"),
        "{error}"
    );
}

#[tokio::test]
async fn a_daily_quota_is_the_same_after_a_restart_and_resets_at_local_midnight() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("quotad.snapshot");
    let toml = format!("[store.snapshot]\npath = {path:?}\n{POLICIES}");
    let clock = Arc::new(FakeClock::new(NY_SPRING_1AM));
    let server = TestServer::start_toml(&toml, clock.clone()).await;
    let mut client = server.client().await;
    assert!(
        check(&mut client, named("erin", "daily", Some(2)))
            .await
            .allowed
    );
    assert!(
        check(&mut client, inline("erin", daily_inline(), Some(1)))
            .await
            .allowed
    );
    server
        .shutdown()
        .await
        .expect("a clean stop writes the snapshot");

    clock.advance(Duration::from_millis(2 * HOUR));
    let server = TestServer::start_toml(&toml, clock.clone()).await;
    let mut client = server.client().await;
    let named_after = peek(&mut client, named("erin", "daily", None)).await;
    assert_eq!(named_after.remaining, 1, "2 of 3 spent before the restart");
    assert_eq!(
        named_after.reset_after_ms,
        NY_SPRING_END - NY_SPRING_1AM - 2 * HOUR
    );
    let inline_after = peek(&mut client, inline("erin", daily_inline(), None)).await;
    assert_eq!(inline_after.remaining, 2);
    clock.set(NY_SPRING_END);
    let fresh = peek(&mut client, named("erin", "daily", None)).await;
    assert_eq!(fresh.remaining, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daily_quota_on_redis_is_one_budget_across_replicas_until_local_midnight() {
    let redis = RedisServer::start();
    let toml = format!(
        "[store]\nbackend = \"redis\"\n\n[store.redis]\nurl = {:?}\n{POLICIES}",
        redis.url()
    );
    tokio::time::sleep(wait_clear_of_period_ends(&[new_york_day()], 5 * MINUTE)).await;
    let one = TestServer::start(Config::from_toml(&toml).expect("valid")).await;
    let two = TestServer::start(Config::from_toml(&toml).expect("valid")).await;
    let (mut a, mut b) = (one.client().await, two.client().await);
    let first = check(&mut a, named("frank", "daily", Some(2))).await;
    assert!(first.allowed && first.remaining == 1);
    let second = check(&mut b, inline("frank", daily_inline(), Some(3))).await;
    assert!(
        second.allowed && second.remaining == 0,
        "inline has its own"
    );
    let third = check(&mut b, named("frank", "daily", Some(2))).await;
    assert_eq!(third.reason(), pb::Reason::LimitExceeded);
    // By Redis's clock, which is this host's: the wait is to the next New
    // York midnight, from an instant between the two readings.
    let zone = quotad_core::Zone::named("America/New_York").expect("zone");
    let calendar = quotad_core::Calendar::new(quotad_core::Period::Day, zone);
    let before = now_ms();
    let d = check(&mut a, named("frank", "daily", Some(2))).await;
    let after = now_ms();
    assert!(!d.allowed);
    assert!(
        (before..=after).any(|t| t + d.retry_after_ms == calendar.bounds(t).1),
        "{d:?}"
    );
}

fn now_ms() -> u64 {
    use quotad_core::Clock;
    quotad_core::SystemClock.now_ms()
}

/// How long to wait, on the real clock, until no period of `calendars`
/// ends within the next `need_ms`: a test on the real clock that waits this
/// long first does not depend on the hour it runs at.
pub(crate) fn wait_clear_of_period_ends(
    calendars: &[quotad_core::Calendar],
    need_ms: u64,
) -> Duration {
    let now = now_ms();
    let wait = calendars
        .iter()
        .map(|c| c.bounds(now).1 - now)
        .filter(|left| *left < need_ms)
        .max()
        .map_or(0, |left| left + 50);
    Duration::from_millis(wait)
}

/// Whether `stdout` prints the end of `calendar`'s period of `before` as
/// the CLI does: from its own reading of the clock a little after quotad's,
/// so late by at most the run (`before..=after`).
fn prints_the_end_of(
    stdout: &str,
    calendar: &quotad_core::Calendar,
    before: u64,
    after: u64,
) -> bool {
    let end = calendar.bounds(before).1;
    (0..=after - before).any(|late| stdout.contains(&calendar.local(end + late)))
}

/// The day of `zone`.
fn day_in(zone: &str) -> quotad_core::Calendar {
    quotad_core::Calendar::new(
        quotad_core::Period::Day,
        quotad_core::Zone::named(zone).expect("zone"),
    )
}

/// New York's day, by which `POLICIES`' "daily" counts.
fn new_york_day() -> quotad_core::Calendar {
    quotad_core::Calendar::new(
        quotad_core::Period::Day,
        quotad_core::Zone::named("America/New_York").expect("zone"),
    )
}

const ENVOY_RULES: &str = r#"
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 2}
    metadata: {quotad: {period: day, time_zone: America/New_York}}
  - key: burst
    rate_limit: {unit: second, requests_per_unit: 1}
    metadata: {quotad: {window: 30s}}
"#;

#[tokio::test]
async fn an_envoy_rule_counts_per_new_york_day_and_another_per_30_seconds() {
    use crate::rls::{ask, descriptor, is_ok, request, rls_client, rls_toml, rules_dir};

    let dir = rules_dir(&[("api.yaml", ENVOY_RULES)]);
    // 01:00:00 EST, the start of a 30-second window of the epoch.
    let clock = Arc::new(FakeClock::new(NY_SPRING_1AM));
    let config = Config::from_toml(&rls_toml(&dir, ""))
        .expect("valid config")
        .with_clock(clock.clone());
    let server = TestServer::start(config).await;
    let mut client = rls_client(&server).await;
    let tenant = || request("api", vec![descriptor(&[("tenant", "acme")])]);
    assert!(is_ok(&ask(&mut client, tenant()).await));
    let second = ask(&mut client, tenant()).await;
    assert!(is_ok(&second));
    let over = ask(&mut client, tenant()).await;
    assert!(!is_ok(&over));
    // 22 hours to New York's midnight, on the 23-hour day.
    let reset = over.statuses[0]
        .duration_until_reset
        .expect("a reset")
        .seconds;
    assert_eq!(u64::try_from(reset).expect("positive") * 1_000, 22 * HOUR);
    clock.set(NY_SPRING_END);
    assert!(is_ok(&ask(&mut client, tenant()).await));

    // One per 30 s: the second is refused until the window's end.
    let burst = || request("api", vec![descriptor(&[("burst", "b")])]);
    assert!(is_ok(&ask(&mut client, burst()).await));
    let over = ask(&mut client, burst()).await;
    assert!(!is_ok(&over));
    let reset = over.statuses[0]
        .duration_until_reset
        .expect("a reset")
        .seconds;
    assert_eq!(reset, 30, "{over:?}");
    clock.advance(Duration::from_secs(30));
    assert!(is_ok(&ask(&mut client, burst()).await));
}

/// Runs the built binary with `args`, unaffected by QUOTAD_* variables.
fn quotad_cli<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_quotad"));
    command.args(args).env_remove("RUST_LOG");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("QUOTAD_") {
            command.env_remove(name);
        }
    }
    command.output().expect("run quotad")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_peek_print_the_reset_as_a_local_time() {
    // The real clock: the CLI adds the reset to its own wall clock.
    let server = TestServer::start(Config::from_toml(POLICIES).expect("valid")).await;
    let addr = server.grpc_addr.to_string();
    let (kathmandu, ny) = (day_in("Asia/Kathmandu"), new_york_day());
    tokio::time::sleep(wait_clear_of_period_ends(&[kathmandu, ny], 5 * MINUTE)).await;
    let inline_args = [
        "--algorithm",
        "fixed_window",
        "--limit",
        "5",
        "--period",
        "day",
        "--time-zone",
        "Asia/Kathmandu",
    ];
    let args = |verb: &str| {
        let mut args = vec![verb, "--addr", &addr, "--key", "k"];
        args.extend(inline_args);
        args.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let check_args = args("check");
    let before = now_ms();
    let out = tokio::task::spawn_blocking(move || quotad_cli(&check_args))
        .await
        .expect("ran");
    let after = now_ms();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}{:?}", out.stderr);
    // Kathmandu's next midnight, printed in its offset and name.
    assert!(
        stdout.starts_with("#1  allowed  remaining 4/5  reset in "),
        "{stdout}"
    );
    assert!(
        prints_the_end_of(&stdout, &kathmandu, before, after),
        "{stdout}"
    );
    assert!(
        kathmandu
            .local(kathmandu.bounds(before).1)
            .contains("T00:00:00+05:45[Asia/Kathmandu]")
    );
    // A named policy's reset in the zone asked for.
    let mut client = server.client().await;
    assert!(check(&mut client, named("k", "daily", None)).await.allowed);
    let peek_args: Vec<String> = [
        "peek",
        "--addr",
        &addr,
        "--key",
        "k",
        "--policy",
        "daily",
        "--time-zone",
        "America/New_York",
    ]
    .map(str::to_owned)
    .to_vec();
    let before = now_ms();
    let out = tokio::task::spawn_blocking(move || quotad_cli(&peek_args))
        .await
        .expect("ran");
    let after = now_ms();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    // One spent: the peek prints New York's next midnight.
    assert!(
        stdout.starts_with("peek  would be allowed  remaining 2/3"),
        "{stdout}"
    );
    assert!(prints_the_end_of(&stdout, &ny, before, after), "{stdout}");
    let bad = quotad_cli(&[
        "check",
        "--addr",
        "127.0.0.1:1",
        "--key",
        "k",
        "--algorithm",
        "fixed_window",
        "--limit",
        "5",
        "--period",
        "day",
        "--time-zone",
        "Mars/Olympus",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--time-zone: unknown time zone"));
}

/// `quotad check` or `peek` of `policy` at `addr`, without `--time-zone`:
/// its stdout.
async fn cli_of_named(verb: &str, addr: &str, policy: &str) -> String {
    cli_of_named_with_stderr(verb, addr, policy).await.0
}

/// As [`cli_of_named`]: its stdout and stderr.
async fn cli_of_named_with_stderr(verb: &str, addr: &str, policy: &str) -> (String, String) {
    let args: Vec<String> = [verb, "--addr", addr, "--key", "k", "--policy", policy]
        .map(str::to_owned)
        .to_vec();
    let out = tokio::task::spawn_blocking(move || quotad_cli(&args))
        .await
        .expect("ran");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    (stdout, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_and_peek_print_a_named_policys_reset_in_its_own_zone_unasked() {
    let server = TestServer::start(Config::from_toml(POLICIES).expect("valid")).await;
    let addr = server.grpc_addr.to_string();
    let ny = new_york_day();
    tokio::time::sleep(wait_clear_of_period_ends(&[ny], 5 * MINUTE)).await;
    // The CLI asks quotad (Explain) for the policy in force: New York's day,
    // Kathmandu's month.
    let before = now_ms();
    let stdout = cli_of_named("check", &addr, "daily").await;
    let after = now_ms();
    assert!(
        stdout.starts_with("#1  allowed  remaining 2/3  reset in "),
        "{stdout}"
    );
    // New York's next midnight.
    assert!(prints_the_end_of(&stdout, &ny, before, after), "{stdout}");
    assert!(ny.local(ny.bounds(before).1).contains("T00:00:00"));
    // A peek prints the reset too, once something is counted.
    cli_of_named("check", &addr, "monthly").await;
    let month = quotad_core::Calendar::new(
        quotad_core::Period::Month,
        quotad_core::Zone::named("Asia/Kathmandu").expect("zone"),
    );
    let before = now_ms();
    let stdout = cli_of_named("peek", &addr, "monthly").await;
    let after = now_ms();
    assert!(
        prints_the_end_of(&stdout, &month, before, after),
        "{stdout}"
    );
    assert!(
        month
            .local(month.bounds(before).1)
            .contains("-01T00:00:00+05:45[Asia/Kathmandu]")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_explain_refuses_gets_the_reset_as_a_wait_and_a_hint_naming_time_zone() {
    let toml = format!("[limits]\nallow_reset = \"nobody\"\n{POLICIES}");
    let server = TestServer::start(Config::from_toml(&toml).expect("valid")).await;
    let addr = server.grpc_addr.to_string();
    let (stdout, stderr) = cli_of_named_with_stderr("check", &addr, "daily").await;
    assert!(
        stdout.starts_with("#1  allowed  remaining 2/3  reset in "),
        "{stdout}"
    );
    // Which zone (if any) the policy counts in is not known: no instant.
    assert!(!stdout.contains(" resets "), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("--time-zone") && stderr.contains("limits.allow_reset"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_with_different_zones_share_one_budget() {
    // Mid-rollout: one replica counts "daily" in New York, the other in
    // Tokyo. One key in Redis, so together they admit 3, not 3 each.
    let redis = RedisServer::start();
    let tokyo_day = day_in("Asia/Tokyo");
    // A midnight of either zone between the checks would begin a new count.
    tokio::time::sleep(wait_clear_of_period_ends(
        &[new_york_day(), tokyo_day],
        5 * MINUTE,
    ))
    .await;
    let in_zone = |zone: &str| {
        let policies = POLICIES.replacen("America/New_York", zone, 1);
        format!(
            "[store]\nbackend = \"redis\"\n\n[store.redis]\nurl = {:?}\n{policies}",
            redis.url()
        )
    };
    let new_york =
        TestServer::start(Config::from_toml(&in_zone("America/New_York")).expect("valid")).await;
    let tokyo = TestServer::start(Config::from_toml(&in_zone("Asia/Tokyo")).expect("valid")).await;
    let (mut a, mut b) = (new_york.client().await, tokyo.client().await);
    let first = check(&mut a, named("gina", "daily", Some(2))).await;
    assert!(first.allowed && first.remaining == 1, "{first:?}");
    let second = check(&mut b, named("gina", "daily", Some(1))).await;
    assert!(second.allowed && second.remaining == 0, "{second:?}");
    let before = now_ms();
    let denied = check(&mut b, named("gina", "daily", None)).await;
    let after = now_ms();
    assert_eq!(denied.reason(), pb::Reason::LimitExceeded);
    // Tokyo honours the New York day the count was begun in, to its end.
    let ny = new_york_day();
    assert!(
        (before..=after).any(|t| t + denied.retry_after_ms == ny.bounds(t).1),
        "{denied:?}"
    );
    assert!(!check(&mut a, named("gina", "daily", None)).await.allowed);
}
