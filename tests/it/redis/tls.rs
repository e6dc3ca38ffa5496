//! Redis over TLS: `rediss://` with quotad's own CA file, a client
//! certificate for a Redis that requires one, and the configuration errors
//! that name their field. The certificates are made by the test.

use quotad::Config;
use quotad_proto::v1 as pb;

use crate::common::redis::RedisServer;
use crate::common::{TestServer, check, named};
use crate::pki::{Names, Pki};

fn config(url: &str, tls: &str) -> Result<Config, String> {
    Config::from_toml(&format!(
        r#"
[store]
backend = "redis"

[store.redis]
url = {url:?}
timeout = "2s"
{tls}

[policies.api]
algorithm = "token_bucket"
limit = 10
window = "1m"
"#
    ))
    .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_ca_file_decides_over_tls() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let pki = Pki::new(dir.path());
    let (cert, key) = pki.server();
    let (redis, tls_port) = RedisServer::start_tls(&cert, &key, None);
    let url = format!("rediss://localhost:{tls_port}/");
    let tls = format!("tls_ca = {:?}", pki.ca());
    let server = TestServer::start(config(&url, &tls).expect("valid")).await;
    let mut client = server.client().await;
    for remaining in [9, 8] {
        let d = check(&mut client, named("alice", "api", None)).await;
        assert_eq!(
            (d.reason(), d.remaining),
            (pb::Reason::WithinLimit, remaining)
        );
    }
    // The state is in the Redis behind the TLS port.
    let stored = redis.cli(&["--scan", "--pattern", "*alice*"]);
    assert!(stored.contains("{alice}"), "{stored}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_requires_client_certificates_takes_quotads() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let pki = Pki::new(dir.path());
    let (cert, key) = pki.server();
    let (client_cert, client_key) = pki.client("quotad", Names::dns("quotad"));
    let (_redis, tls_port) = RedisServer::start_tls(&cert, &key, Some(&pki.ca()));
    let url = format!("rediss://localhost:{tls_port}/");
    let with_cert = format!(
        "tls_ca = {:?}\ntls_cert = {client_cert:?}\ntls_key = {client_key:?}",
        pki.ca()
    );
    let server = TestServer::start(config(&url, &with_cert).expect("valid")).await;
    let mut client = server.client().await;
    let d = check(&mut client, named("bob", "api", None)).await;
    assert_eq!(d.reason(), pb::Reason::WithinLimit);

    // Without a client certificate the handshake is refused: a quotad
    // that requires Redis at start does not start.
    let without = format!("tls_ca = {:?}\nrequired_at_start = true", pki.ca());
    let mut refused = TestServer::start(config(&url, &without).expect("valid")).await;
    let error = refused.join().await.expect_err("no certificate, no Redis");
    let error = quotad::Causes(&error).to_string();
    assert!(error.contains("CertificateRequired"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_another_ca_is_refused() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let pki = Pki::new(&dir.path().join("redis"));
    let other = Pki::new(&dir.path().join("other"));
    let (cert, key) = pki.server();
    let (_redis, tls_port) = RedisServer::start_tls(&cert, &key, None);
    let url = format!("rediss://localhost:{tls_port}/");
    let tls = format!("tls_ca = {:?}\nrequired_at_start = true", other.ca());
    let mut server = TestServer::start(config(&url, &tls).expect("valid")).await;
    let error = server
        .join()
        .await
        .expect_err("an unknown CA is not trusted");
    let error = quotad::Causes(&error).to_string();
    assert!(
        error.contains("redis") && error.contains("certificate"),
        "{error}"
    );
}

#[test]
fn tls_settings_that_cannot_work_are_config_errors_naming_the_field() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let pki = Pki::new(dir.path());
    let (cert, key) = pki.server();
    let ca = format!("tls_ca = {:?}", pki.ca());
    let error = config("redis://localhost:1/", &ca).expect_err("TLS files, plain URL");
    assert!(
        error.starts_with("store.redis.url: ") && error.contains("rediss://"),
        "{error}"
    );
    let error = config("rediss://localhost:1/", &format!("tls_cert = {cert:?}"))
        .expect_err("a certificate without its key");
    assert!(error.starts_with("store.redis.tls_key: "), "{error}");
    let error = config("rediss://localhost:1/", &format!("tls_key = {key:?}"))
        .expect_err("a key without its certificate");
    assert!(error.starts_with("store.redis.tls_cert: "), "{error}");
    let error = config("rediss://localhost:1/", "tls_ca = \"/nonexistent/ca.pem\"")
        .expect_err("a missing CA file");
    assert!(
        error.starts_with("store.redis.tls_ca: cannot read /nonexistent/ca.pem"),
        "{error}"
    );
    let error = config("rediss://localhost:1/", &format!("tls_ca = {key:?}"))
        .expect_err("a key is not a CA certificate");
    assert!(error.starts_with("store.redis.tls_ca: "), "{error}");
    // A password in the URL never reaches an error.
    let error = config("redis://:hunter2@localhost:1/", &ca).expect_err("plain URL");
    assert!(!error.contains("hunter2"), "{error}");
}
