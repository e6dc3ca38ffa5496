//! Hot reload of named policies from the config file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::common::{NOON_30, TestServer, check, eventually, named};
use quotad::{Config, FlagValues};
use quotad_core::FakeClock;
use tonic::Code;

/// How long a reload may take: a few polls of 20 ms, with room for a slow
/// machine.
const RELOAD_LIMIT: Duration = Duration::from_secs(10);

/// A config whose policy `api` counts `limit` a minute with `algorithm`,
/// polled every 20 ms.
fn config_text(algorithm: &str, limit: u64) -> String {
    format!(
        "[server]\nconfig_poll_interval = \"20ms\"\n\n[store]\nmax_key_bytes = 16\n\n[policies.api]\nalgorithm = \"{algorithm}\"\nlimit = {limit}\nwindow = \"1m\"\n"
    )
}

/// A test's config file, in a folder of its own.
struct ConfigFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl ConfigFile {
    fn new(algorithm: &str, limit: u64) -> ConfigFile {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = ConfigFile {
            path: dir.path().join("quotad.toml"),
            _dir: dir,
        };
        file.write(algorithm, limit);
        file
    }

    fn write(&self, algorithm: &str, limit: u64) {
        write_atomically(&self.path, &config_text(algorithm, limit));
    }
}

/// Replaces the file in one step, as a careful operator (or a ConfigMap
/// update) would.
pub(crate) fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write temp config");
    std::fs::rename(&tmp, path).expect("rename config into place");
}

async fn start(path: &Path) -> TestServer {
    let config = Config::load(Some(path), &FlagValues::default())
        .expect("valid config")
        .with_clock(Arc::new(FakeClock::new(NOON_30)));
    TestServer::start(config).await
}

async fn api_limit(server: &TestServer) -> Option<u64> {
    let (_, body) = server.get("/policies").await;
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    json["policies"]["api"]["limit"].as_u64()
}

async fn reloads(server: &TestServer, outcome: &str) -> f64 {
    server
        .metrics()
        .await
        .value("quotad_policy_reloads_total", &[("outcome", outcome)])
}

#[tokio::test]
async fn a_valid_change_applies_keeping_counts_and_an_invalid_one_keeps_the_old_policies() {
    let file = ConfigFile::new("fixed_window", 2);
    let server = start(&file.path).await;
    let mut client = server.client().await;
    assert!(check(&mut client, named("k", "api", None)).await.allowed);
    assert!(check(&mut client, named("k", "api", None)).await.allowed);
    assert!(!check(&mut client, named("k", "api", None)).await.allowed);

    file.write("fixed_window", 5);
    eventually(RELOAD_LIMIT, "the new limit is served", || async {
        api_limit(&server).await == Some(5)
    })
    .await;
    let after = check(&mut client, named("k", "api", None)).await;
    assert!(after.allowed);
    assert_eq!(after.limit, 5);
    assert_eq!(
        after.remaining, 2,
        "the 2 units spent before the reload still count"
    );
    assert_eq!(reloads(&server, "ok").await, 1.0);
    assert_eq!(reloads(&server, "error").await, 0.0);

    file.write("fixed_window", 0);
    eventually(RELOAD_LIMIT, "the invalid file is counted", || async {
        reloads(&server, "error").await == 1.0
    })
    .await;
    assert_eq!(
        api_limit(&server).await,
        Some(5),
        "the old policies are kept"
    );
    let kept = check(&mut client, named("k", "api", None)).await;
    assert!(kept.allowed);
    assert_eq!(kept.remaining, 1);
    assert_eq!(reloads(&server, "ok").await, 1.0);

    // A file that is not even TOML is rejected the same way.
    write_atomically(&file.path, "[policies.api\n");
    eventually(RELOAD_LIMIT, "the unparsable file is counted", || async {
        reloads(&server, "error").await == 2.0
    })
    .await;
    assert_eq!(api_limit(&server).await, Some(5));
}

#[tokio::test]
async fn a_changed_algorithm_starts_fresh_and_removed_and_added_policies_follow_the_file() {
    let file = ConfigFile::new("fixed_window", 3);
    let server = start(&file.path).await;
    let mut client = server.client().await;
    check(&mut client, named("k", "api", Some(3))).await;

    file.write("token_bucket", 3);
    eventually(RELOAD_LIMIT, "the reload lands", || async {
        reloads(&server, "ok").await == 1.0
    })
    .await;
    let fresh = check(&mut client, named("k", "api", None)).await;
    assert!(fresh.allowed);
    assert_eq!(fresh.remaining, 2, "a new algorithm starts the key fresh");

    let text = "[server]\nconfig_poll_interval = \"20ms\"\n\n[policies.other]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\n";
    write_atomically(&file.path, text);
    eventually(RELOAD_LIMIT, "the second reload lands", || async {
        reloads(&server, "ok").await == 2.0
    })
    .await;
    let gone = client
        .check(named("k", "api", None))
        .await
        .expect_err("api was removed");
    assert_eq!(gone.code(), Code::NotFound);
    assert!(check(&mut client, named("k", "other", None)).await.allowed);
}

#[tokio::test]
async fn settings_other_than_policies_wait_for_a_restart() {
    let file = ConfigFile::new("fixed_window", 2);
    let server = start(&file.path).await;
    let mut client = server.client().await;

    // max_key_bytes 16 -> 4 in the same file as a limit change.
    let text = config_text("fixed_window", 9).replace("max_key_bytes = 16", "max_key_bytes = 4");
    write_atomically(&file.path, &text);
    eventually(RELOAD_LIMIT, "the policy change lands", || async {
        api_limit(&server).await == Some(9)
    })
    .await;
    let long_key = check(&mut client, named("sixteen-bytes-ok", "api", None)).await;
    assert!(
        long_key.allowed,
        "max_key_bytes is still 16 until a restart"
    );
}

/// `store.on_error` waits for a restart, and so does the `on_error` of a
/// policy that takes it as its default: a reload that changes it keeps
/// named policies answering as inline ones do.
#[tokio::test]
async fn a_changed_store_on_error_waits_for_a_restart_for_named_policies_too() {
    let file = ConfigFile::new("fixed_window", 2);
    let server = start(&file.path).await;
    let on_error = || async {
        let (_, body) = server.get("/policies").await;
        let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        json["policies"]["api"]["on_error"]
            .as_str()
            .map(str::to_owned)
    };
    assert_eq!(on_error().await.as_deref(), Some("error"));

    let text =
        config_text("fixed_window", 9).replace("[store]\n", "[store]\non_error = \"fail_open\"\n");
    write_atomically(&file.path, &text);
    eventually(RELOAD_LIMIT, "the policy change lands", || async {
        api_limit(&server).await == Some(9)
    })
    .await;
    assert_eq!(
        on_error().await.as_deref(),
        Some("error"),
        "store.on_error is the running one"
    );
}
