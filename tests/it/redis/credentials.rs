//! Passwords in Redis URLs stay out of errors, logs and debug output.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quotad::Config;
use quotad::backend::redis::{RedisBackend, RedisSettings, RedisTarget};

use crate::common::redis::RedisServer;

/// A log sink the test can read back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("not poisoned").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("not poisoned")).into_owned()
    }
}

#[test]
fn a_password_in_a_redis_url_never_reaches_errors_or_logs() {
    const RIGHT: &str = "right-pw-7c1";
    const WRONG: &str = "wrong-pw-9f3";
    let redis = RedisServer::start_with_password(RIGHT);
    let logs = Captured::default();
    let sink = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || sink.clone())
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let url = |password: &str| format!("redis://:{password}@127.0.0.1:{}/", redis.port);
    let settings = |url: String| {
        let mut settings = RedisSettings::new(RedisTarget::Standalone(url), Duration::from_secs(2));
        // Refused at start, rather than retried in the background.
        settings.required_at_start = true;
        settings
    };
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            let error = RedisBackend::connect(&settings(url(WRONG)))
                .await
                .expect_err("a wrong password is refused");
            let text = quotad::Causes(&error).to_string();
            assert!(text.contains("authentication failed"), "{text}");
            assert!(!text.contains(WRONG), "{text}");
            // The right password connects, and the debug output hides it.
            let backend = RedisBackend::connect(&settings(url(RIGHT)))
                .await
                .expect("the right password is accepted");
            assert!(!format!("{backend:?}").contains(RIGHT));
        });
    });
    let logged = logs.text();
    assert!(logged.contains("cannot connect to redis"), "{logged}");
    assert!(
        !logged.contains(WRONG) && !logged.contains(RIGHT),
        "{logged}"
    );

    // A configuration holding the URL: its debug output and its errors.
    let config = Config::from_toml(&format!(
        "[store]\nbackend = \"redis\"\n[store.redis]\nurl = \"{}\"\n",
        url(RIGHT)
    ))
    .expect("valid");
    let shown = format!("{config:?}");
    assert!(shown.contains("redis://:***@127.0.0.1"), "{shown}");
    assert!(!shown.contains(RIGHT), "{shown}");
    let error = Config::from_toml(
        "[store]\nbackend = \"redis\"\n[store.redis]\ncluster_nodes = [\"redis://admin:pw-in-bad-url@127.0.0.1:notaport/\"]\n",
    )
    .expect_err("not a port")
    .to_string();
    assert!(error.starts_with("store.redis.cluster_nodes: "), "{error}");
    assert!(!error.contains("pw-in-bad-url"), "{error}");
}

#[test]
fn validate_config_never_prints_a_redis_url_whose_password_breaks_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Characters that end a URL's authority, written unencoded in the
    // password: the URL no longer parses, and its error must not show it.
    for c in ['#', '?'] {
        let url = format!("redis://user:s3cr{c}et@h:6379/0");
        let path = dir.path().join("quotad.toml");
        std::fs::write(
            &path,
            format!("[store]\nbackend = \"redis\"\n\n[store.redis]\nurl = {url:?}\n"),
        )
        .expect("write the config");
        let output = crate::common::binary::quotad(&["validate-config", &path.to_string_lossy()])
            .output()
            .expect("run quotad validate-config");
        assert_eq!(output.status.code(), Some(2), "{c:?}");
        let shown = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(shown.contains("store.redis.url"), "{c:?}: {shown}");
        assert!(
            !shown.contains("s3cr") && !shown.contains("et@"),
            "{c:?}: {shown}"
        );
    }
}
