//! Envoy's RLQS end to end, with simulated Envoys ([`SimEnvoy`]) that admit
//! locally exactly as Envoy's token bucket would: the fleet stays within the
//! policy in every window (two replicas on one Redis) and every interval (a
//! token bucket); a broken stream reopened; a bad report closing only its
//! stream, with nothing granted; bucket matching; and hot reload.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use quotad::{Config, FlagValues};
use quotad_proto::envoy::service::rate_limit_quota::v3 as pb;
use tonic::Code;

use crate::common::redis::RedisServer;
use crate::common::{TestServer, eventually, named, peek};
use crate::reload::write_atomically;
use crate::rlqs_envoy::{Seen, SimEnvoy, now_us};

/// Envoy's report interval in these tests (Envoy's is configurable; the
/// server renews assignments on its own timer whatever it is).
const REPORT_EVERY: Duration = Duration::from_secs(1);

struct Files {
    _dir: tempfile::TempDir,
    config: PathBuf,
    rules: PathBuf,
}

fn files(config: &str, rules: &str) -> Files {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = Files {
        config: dir.path().join("quotad.toml"),
        rules: dir.path().join("rlqs.toml"),
        _dir: dir,
    };
    std::fs::write(&files.rules, rules).expect("write rules");
    std::fs::write(&files.config, config).expect("write config");
    files
}

async fn start(path: &Path) -> TestServer {
    let config = Config::load(Some(path), &FlagValues::default()).expect("valid config");
    TestServer::start(config).await
}

fn bucket(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Runs `envoy` at `per_second` requests of `pairs` for `run`.
async fn drive(envoy: &SimEnvoy, pairs: &[(&str, &str)], per_second: u64, run: Duration) {
    let every = Duration::from_micros(1_000_000 / per_second);
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let end = tokio::time::Instant::now() + run;
    while tokio::time::Instant::now() < end {
        ticks.tick().await;
        envoy.request(pairs).await;
    }
}

/// Admissions (wall-clock microseconds) counted per window of `window_ms`,
/// aligned to the epoch as quotad's windows are.
fn per_window(admitted: &[u64], window_ms: u64) -> BTreeMap<u64, u64> {
    let mut windows = BTreeMap::new();
    for t in admitted {
        *windows.entry(t / 1_000 / window_ms).or_insert(0) += 1;
    }
    windows
}

const FLEET_LIMIT: u64 = 300;
const FLEET_WINDOW_MS: u64 = 3_000;

fn fleet_config(redis: &RedisServer, rules: &str) -> String {
    format!(
        r#"
[store]
backend = "redis"

[store.redis]
url = "{url}"

[rlqs]
rules = "{rules}"

[policies.api]
algorithm = "fixed_window"
limit = {FLEET_LIMIT}
window = "{FLEET_WINDOW_MS}ms"
"#,
        url = redis.url()
    )
}

const FLEET_RULES: &str = r#"
[defaults]
ttl = "1s"
margin = "300ms"
max_tokens = 60

[[bucket]]
domain = "edge"
match = { name = "api" }
policy = "api"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_envoys_on_two_replicas_on_redis_stay_within_every_window_as_demand_shifts() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = dir.path().join("rlqs.toml");
    std::fs::write(&rules, FLEET_RULES).expect("write rules");
    let config = dir.path().join("quotad.toml");
    std::fs::write(&config, fleet_config(&redis, &rules.display().to_string()))
        .expect("write config");
    let (a, b) = (start(&config).await, start(&config).await);
    let pairs = [("name", "api")];
    let e1 = SimEnvoy::start(a.channel().await, "edge", REPORT_EVERY).await;
    let e2 = SimEnvoy::start(a.channel().await, "edge", REPORT_EVERY).await;
    let mut e3 = SimEnvoy::start(b.channel().await, "edge", REPORT_EVERY).await;
    let phase = Duration::from_millis(4_500);
    let started = now_us();
    // First e1 wants far more than the rest; then e3 does. Midway, e3's
    // stream breaks and is reopened (Envoy keeps its buckets).
    tokio::join!(
        async {
            drive(&e1, &pairs, 250, phase).await;
            drive(&e1, &pairs, 20, phase).await;
        },
        drive(&e2, &pairs, 20, phase * 2),
        async {
            drive(&e3, &pairs, 10, phase).await;
            e3.break_stream();
            drive(&e3, &pairs, 250, Duration::from_millis(700)).await;
            e3.open().await;
            drive(&e3, &pairs, 250, phase - Duration::from_millis(700)).await;
        },
    );
    let mut all: Vec<u64> = [e1.admitted(), e2.admitted(), e3.admitted()].concat();
    all.sort_unstable();
    let windows = per_window(&all, FLEET_WINDOW_MS);
    eprintln!("admitted per {FLEET_WINDOW_MS} ms window (limit {FLEET_LIMIT}): {windows:?}");
    for (window, admitted) in &windows {
        assert!(
            *admitted <= FLEET_LIMIT,
            "window {window}: the fleet admitted {admitted}, more than {FLEET_LIMIT}: {windows:?}"
        );
    }
    // Whole windows inside the run, after the first assignments.
    let first = started / 1_000 / FLEET_WINDOW_MS + 1;
    let full: Vec<u64> = windows
        .range(first..windows.keys().next_back().copied().unwrap_or(first))
        .map(|(_, n)| *n)
        .collect();
    assert!(!full.is_empty(), "{windows:?}");
    for n in &full {
        assert!(
            *n >= FLEET_LIMIT / 4,
            "the fleet should use a good part of each window's budget: {windows:?}"
        );
    }
    // Demand shifted, and so did the shares: each Envoy admitted more in
    // its busy phase than in its quiet one.
    let split = started + u64::try_from(phase.as_micros()).expect("fits");
    let count = |v: &[u64], before: bool| v.iter().filter(|t| (**t < split) == before).count();
    let (e1_busy, e1_quiet) = (count(&e1.admitted(), true), count(&e1.admitted(), false));
    let (e3_quiet, e3_busy) = (count(&e3.admitted(), true), count(&e3.admitted(), false));
    eprintln!("e1 {e1_busy} busy, {e1_quiet} quiet; e3 {e3_quiet} quiet, {e3_busy} busy");
    assert!(e1_busy > e1_quiet, "e1: {e1_busy} busy, {e1_quiet} quiet");
    assert!(e3_busy > e3_quiet, "e3: {e3_busy} busy, {e3_quiet} quiet");
    // Every token bucket quotad sent is whole seconds and at least one token.
    for envoy in [&e1, &e2, &e3] {
        for (_, seen) in envoy.seen() {
            if let Seen::Bucket {
                max_tokens,
                tokens_per_fill,
                fill_interval_s,
                ttl_s,
            } = seen
            {
                assert!(max_tokens >= 1 && tokens_per_fill >= 1);
                assert!(fill_interval_s >= 1 && ttl_s >= 1);
            }
        }
        assert!(envoy.closed().is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_envoys_on_a_token_bucket_stay_within_its_burst_and_rate_in_every_interval() {
    token_bucket_fleet("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_envoys_on_two_replicas_on_redis_stay_within_a_token_buckets_bound() {
    let redis = RedisServer::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\n\n[store.redis]\nurl = \"{}\"\n\n",
        redis.url()
    );
    token_bucket_fleet(&store).await;
}

/// Three Envoys wanting more, then less, of a token bucket: on one server
/// with memory state, or (when `store` names a Redis) two on one replica
/// and one on another.
async fn token_bucket_fleet(store: &str) {
    const LIMIT: u64 = 100;
    // A lease holds its units for its whole life (ttl + margin = 1.3 s),
    // so a burst below limit x 1.3 s would cap the fleet's rate (docs/rlqs.md).
    const BURST: u64 = 150;
    let files = files(
        &format!(
            "{store}[rlqs]\nrules = \"rlqs.toml\"\n\n[policies.tb]\nalgorithm = \"token_bucket\"\nlimit = {LIMIT}\nwindow = \"1s\"\nburst = {BURST}\n"
        ),
        "[defaults]\nttl = \"1s\"\nmargin = \"300ms\"\nmax_tokens = 40\n\n[[bucket]]\ndomain = \"edge\"\npolicy = \"tb\"\n",
    );
    // Memory state is each replica's own: one server then.
    let a = start(&files.config).await;
    let b = if store.is_empty() {
        None
    } else {
        Some(start(&files.config).await)
    };
    let second = b.as_ref().unwrap_or(&a);
    let envoys = [
        SimEnvoy::start(a.channel().await, "edge", REPORT_EVERY).await,
        SimEnvoy::start(a.channel().await, "edge", REPORT_EVERY).await,
        SimEnvoy::start(second.channel().await, "edge", REPORT_EVERY).await,
    ];
    let pairs = [("route", "checkout")];
    let run = Duration::from_secs(4);
    tokio::join!(
        async {
            drive(&envoys[0], &pairs, 150, run / 2).await;
            drive(&envoys[0], &pairs, 20, run / 2).await;
        },
        drive(&envoys[1], &pairs, 60, run),
        async {
            drive(&envoys[2], &pairs, 20, run / 2).await;
            drive(&envoys[2], &pairs, 150, run / 2).await;
        },
    );
    let mut all: Vec<u64> = envoys.iter().flat_map(SimEnvoy::admitted).collect();
    all.sort_unstable();
    eprintln!("token bucket: {} admitted in 4 s", all.len());
    assert!(
        all.len() as u64 > LIMIT,
        "the fleet admitted only {}",
        all.len()
    );
    // In any interval [t_i, t_j], at most burst + limit x t: the token
    // bucket's own bound. Timestamps are taken just after each local
    // decision, so an interval may read up to 1 ms short.
    for i in 0..all.len() {
        for j in i..all.len() {
            let t = all[j] - all[i] + 1_000;
            let bound = BURST + LIMIT * t / 1_000_000;
            let n = (j - i + 1) as u64;
            assert!(
                n <= bound,
                "{n} admitted in {} us, more than burst + rate x t = {bound}",
                all[j] - all[i]
            );
        }
    }
}

const MATCH_CONFIG: &str = r#"
[rlqs]
rules = "rlqs.toml"

[policies.api]
algorithm = "fixed_window"
limit = 10
window = "1h"
"#;

/// `MATCH_CONFIG`'s window, which the tests below must not see roll over:
/// near a window's end quotad rightly cuts shorter assignments (a TTL of 1 s,
/// or a deny when under a second is left), which these tests do not expect.
const MATCH_WINDOW_MS: u64 = 3_600_000;

/// Starts a server on `MATCH_CONFIG`-based `files` once the current window
/// (aligned to the epoch, as quotad's are) has at least a minute left, so a
/// test never depends on where in the window it began.
async fn start_clear_of_window_end(files: &Files) -> TestServer {
    const NEED_MS: u64 = 60_000;
    let into = now_us() / 1_000 % MATCH_WINDOW_MS;
    if MATCH_WINDOW_MS - into < NEED_MS {
        tokio::time::sleep(Duration::from_millis(MATCH_WINDOW_MS - into + 50)).await;
    }
    start(&files.config).await
}

const MATCH_RULES: &str = r#"
[defaults]
ttl = "2s"
max_tokens = 4

[[bucket]]
domain = "edge"
match = { name = "api", tenant = "*" }
policy = "api"
key = "tenant:{tenant}"

[[bucket]]
domain = "edge"
match = { name = "open" }
blanket = "allow_all"

[unmatched]
blanket = "deny_all"
"#;

#[tokio::test]
async fn buckets_match_by_domain_and_pairs_and_share_a_key_whatever_their_order() {
    let files = files(MATCH_CONFIG, MATCH_RULES);
    let server = start_clear_of_window_end(&files).await;
    let envoy = SimEnvoy::start(server.channel().await, "edge", REPORT_EVERY).await;
    let other = SimEnvoy::start(server.channel().await, "core", REPORT_EVERY).await;
    let acme = [("name", "api"), ("tenant", "acme"), ("path", "/a")];
    let acme_again = [("path", "/b"), ("tenant", "acme"), ("name", "api")];
    for pairs in [
        &acme[..],
        &acme_again,
        &[("name", "open")],
        &[("name", "x")],
    ] {
        assert!(!envoy.request(pairs).await, "no assignment yet: denied");
    }
    assert!(!other.request(&[("name", "open")]).await);
    eventually(Duration::from_secs(5), "every bucket answered", || async {
        envoy.seen().len() >= 4 && !other.seen().is_empty()
    })
    .await;
    let seen = envoy.seen();
    let of = |pairs: &[(&str, &str)]| {
        seen.iter()
            .find(|(b, _)| *b == bucket(pairs))
            .map(|(_, s)| s.clone())
            .expect("answered")
    };
    assert_eq!(of(&[("name", "open")]), Seen::Allow);
    assert_eq!(of(&[("name", "x")]), Seen::Deny);
    // Another domain: the unmatched rule.
    assert_eq!(other.seen()[0].1, Seen::Deny);
    // Both acme buckets count under one key, tenant:acme, leased 4 units
    // each (their first reports ask for the most).
    for pairs in [&acme[..], &acme_again] {
        let Seen::Bucket {
            max_tokens, ttl_s, ..
        } = of(pairs)
        else {
            panic!("a token bucket for {pairs:?}")
        };
        assert!(max_tokens >= 1 && ttl_s == 2, "{:?}", of(pairs));
    }
    let mut client = server.client().await;
    let decision = peek(&mut client, named("tenant:acme", "api", None)).await;
    // The first lease got its most (4); the second a fair share of the 6
    // left between two holders (3): both charged to tenant:acme.
    assert_eq!(decision.remaining, 10 - 4 - 3);
}

#[tokio::test]
async fn a_bad_report_closes_only_its_stream_and_grants_nothing() {
    let files = files(MATCH_CONFIG, MATCH_RULES);
    let server = start_clear_of_window_end(&files).await;
    let good = SimEnvoy::start(server.channel().await, "edge", REPORT_EVERY).await;
    let bad = SimEnvoy::start(server.channel().await, "edge", REPORT_EVERY).await;
    let usage = |pairs: &[(&str, &str)], elapsed: Option<i64>| {
        pb::rate_limit_quota_usage_reports::BucketQuotaUsage {
            bucket_id: Some(pb::BucketId {
                bucket: pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            }),
            time_elapsed: elapsed.map(|seconds| prost_types::Duration { seconds, nanos: 0 }),
            num_requests_allowed: 0,
            num_requests_denied: 1,
        }
    };
    // A good bucket and a bad one in one message: nothing is granted.
    bad.send_raw(pb::RateLimitQuotaUsageReports {
        domain: "edge".to_owned(),
        bucket_quota_usages: vec![
            usage(&[("name", "api"), ("tenant", "zed")], Some(0)),
            usage(&[("name", "api"), ("tenant", "")], Some(0)),
        ],
    })
    .await;
    eventually(Duration::from_secs(5), "the bad stream closed", || async {
        bad.closed().is_some()
    })
    .await;
    let status = bad.closed().expect("closed");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status
            .message()
            .starts_with("bucket_quota_usages[1].bucket_id.bucket"),
        "{status:?}"
    );
    assert!(bad.seen().is_empty());
    let mut client = server.client().await;
    assert_eq!(
        peek(&mut client, named("tenant:zed", "api", None))
            .await
            .remaining,
        10,
        "nothing was leased for the good bucket of the bad message"
    );
    // Other refusals, each on a stream of its own.
    for (report, field) in [
        (
            pb::RateLimitQuotaUsageReports {
                domain: String::new(),
                bucket_quota_usages: vec![usage(&[("name", "api"), ("tenant", "t")], Some(0))],
            },
            "domain",
        ),
        (
            pb::RateLimitQuotaUsageReports {
                domain: "edge".to_owned(),
                bucket_quota_usages: vec![usage(&[("name", "api"), ("tenant", "t")], None)],
            },
            "bucket_quota_usages[0].time_elapsed",
        ),
        (
            pb::RateLimitQuotaUsageReports {
                domain: "edge".to_owned(),
                bucket_quota_usages: vec![usage(&[("name", "api"), ("tenant", "t")], Some(-1))],
            },
            "bucket_quota_usages[0].time_elapsed",
        ),
        (
            pb::RateLimitQuotaUsageReports {
                domain: "edge".to_owned(),
                bucket_quota_usages: vec![usage(&[], Some(0))],
            },
            "bucket_quota_usages[0].bucket_id.bucket",
        ),
    ] {
        let envoy = SimEnvoy::start(server.channel().await, "edge", REPORT_EVERY).await;
        envoy.send_raw(report).await;
        eventually(Duration::from_secs(5), "closed", || async {
            envoy.closed().is_some()
        })
        .await;
        let status = envoy.closed().expect("closed");
        assert_eq!(status.code(), Code::InvalidArgument, "{field}");
        assert!(status.message().starts_with(field), "{field}: {status:?}");
    }
    assert_eq!(
        peek(&mut client, named("tenant:t", "api", None))
            .await
            .remaining,
        10
    );
    // Each refusal is counted by method and code.
    let metrics = server.metrics().await;
    assert_eq!(
        metrics.value(
            "quotad_request_errors_total",
            &[
                ("method", "stream_rate_limit_quotas"),
                ("code", "InvalidArgument")
            ]
        ),
        5.0
    );
    // The other stream on the same connection goes on being answered.
    assert!(!good.request(&[("name", "api"), ("tenant", "ok")]).await);
    eventually(
        Duration::from_secs(5),
        "the good stream answered",
        || async { !good.seen().is_empty() },
    )
    .await;
    assert!(good.request(&[("name", "api"), ("tenant", "ok")]).await);
    assert!(good.closed().is_none());
}

#[tokio::test]
async fn a_closed_streams_assignments_keep_counting_until_they_end() {
    let files = files(
        MATCH_CONFIG,
        MATCH_RULES
            .replace("max_tokens = 4", "max_tokens = 10")
            .as_str(),
    );
    let server = start_clear_of_window_end(&files).await;
    let pairs = [("name", "api"), ("tenant", "solo")];
    let mut first = SimEnvoy::start(server.channel().await, "edge", REPORT_EVERY).await;
    first.request(&pairs).await;
    eventually(Duration::from_secs(5), "assigned", || async {
        !first.seen().is_empty()
    })
    .await;
    first.break_stream();
    // The whole window's budget is leased to the closed stream's Envoy,
    // which may still spend it: a new Envoy gets nothing.
    let second = SimEnvoy::start(server.channel().await, "edge", REPORT_EVERY).await;
    second.request(&pairs).await;
    eventually(Duration::from_secs(5), "assigned", || async {
        !second.seen().is_empty()
    })
    .await;
    assert_eq!(second.seen()[0].1, Seen::Deny);
    // The first Envoy still admits from what it holds.
    assert!(first.request(&pairs).await);
}

#[tokio::test]
async fn an_idle_bucket_is_abandoned_only_once_its_assignment_has_ended() {
    let files = files(MATCH_CONFIG, MATCH_RULES);
    let server = start_clear_of_window_end(&files).await;
    // Reports every 100 ms: six idle reports take 0.6 s, under the 2 s TTL.
    let envoy = SimEnvoy::start(server.channel().await, "edge", Duration::from_millis(100)).await;
    let pairs = [("name", "api"), ("tenant", "idle")];
    envoy.request(&pairs).await;
    eventually(Duration::from_secs(10), "abandoned", || async {
        envoy.seen().iter().any(|(_, s)| *s == Seen::Abandon)
    })
    .await;
    let (seen, at) = (envoy.seen(), envoy.seen_at());
    let abandon = seen
        .iter()
        .position(|(_, s)| *s == Seen::Abandon)
        .expect("abandoned");
    let Seen::Bucket { ttl_s, .. } = seen[abandon - 1].1 else {
        panic!("a lease before the abandon: {seen:?}")
    };
    let ttl_s = u64::try_from(ttl_s).expect("not negative");
    // quotad times the TTL from its send; the two messages' transit times
    // differ by well under 20 ms on loopback.
    assert!(
        at[abandon] + Duration::from_millis(20) >= at[abandon - 1] + Duration::from_secs(ttl_s),
        "abandoned {:?} after its last assignment of {ttl_s} s",
        at[abandon] - at[abandon - 1]
    );
    // Envoy forgot it: its next request starts it afresh.
    assert!(!envoy.request(&pairs).await);
    eventually(Duration::from_secs(5), "answered afresh", || async {
        envoy.seen().len() > abandon + 1
    })
    .await;
    assert!(envoy.request(&pairs).await, "{:?}", envoy.seen());
}

#[tokio::test]
async fn a_reloaded_rules_file_applies_to_the_next_assignment_and_a_broken_one_is_refused() {
    let config = format!("[server]\nconfig_poll_interval = \"20ms\"\n{MATCH_CONFIG}");
    let files = files(&config, MATCH_RULES);
    let server = start_clear_of_window_end(&files).await;
    let envoy = SimEnvoy::start(server.channel().await, "edge", REPORT_EVERY).await;
    let pairs = [("name", "x")];
    envoy.request(&pairs).await;
    eventually(Duration::from_secs(5), "answered", || async {
        !envoy.seen().is_empty()
    })
    .await;
    assert_eq!(envoy.seen()[0].1, Seen::Deny);
    // A broken file is refused: the rules in force stay.
    write_atomically(
        &files.rules,
        "[[bucket]]\ndomain = \"edge\"\npolicy = \"missing\"\n",
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    write_atomically(
        &files.rules,
        &MATCH_RULES.replace("blanket = \"deny_all\"", "blanket = \"allow_all\""),
    );
    // quotad renews the deny-all before its TTL ends: the renewal follows
    // the new rules.
    eventually(
        Duration::from_secs(10),
        "allowed after the reload",
        || async { envoy.seen().iter().any(|(_, s)| *s == Seen::Allow) },
    )
    .await;
    assert!(envoy.request(&pairs).await);
}

#[test]
fn validate_config_checks_the_bucket_rules_with_file_and_line() {
    let files = files(MATCH_CONFIG, MATCH_RULES);
    let ok =
        crate::common::binary::quotad(&["validate-config", &files.config.display().to_string()])
            .output()
            .expect("run validate-config");
    assert!(ok.status.success(), "{ok:?}");
    assert!(String::from_utf8_lossy(&ok.stdout).contains("2 RLQS bucket rules"));
    std::fs::write(
        &files.rules,
        MATCH_RULES.replace("policy = \"api\"", "policy = \"nope\""),
    )
    .expect("write");
    let bad =
        crate::common::binary::quotad(&["validate-config", &files.config.display().to_string()])
            .output()
            .expect("run validate-config");
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("rlqs.toml: bucket[0].policy: no policy is named \"nope\"")
            && err.contains("(line 9)"),
        "{err}"
    );
}
