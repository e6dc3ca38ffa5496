//! Authorization per method by the client certificate's identity (mTLS):
//! allowlists in `[auth]`, PERMISSION_DENIED naming the method and the
//! identity, nothing touched by a denied call.

use std::path::Path;
use std::time::Duration;

use quotad::Config;
use quotad_client::{Check, Client, Error, PolicyRef, TlsConfig};
use tonic::Code;

use crate::common::TestServer;
use crate::pki::{Names, Pki};

/// Three clients: an operator (URI SAN), an application (DNS SAN) and a
/// legacy client whose certificate has only a common name.
const OPS: &str = "spiffe://example.org/ops/alice";
const APP: &str = "app.internal";
const LEGACY: &str = "legacy-client";

async fn start(dir: &Path, pki: &Pki, auth: &str) -> TestServer {
    let (cert, key) = pki.server();
    let toml = format!(
        "[server.tls]\ncert = {cert:?}\nkey = {key:?}\nclient_ca = {ca:?}\n\n\
         [auth]\n{auth}\n\n\
         [policies.api]\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n",
        ca = pki.ca()
    );
    let path = dir.join("quotad.toml");
    std::fs::write(&path, toml).expect("write the config");
    let config = Config::load(Some(&path), &quotad::FlagValues::default()).expect("valid config");
    TestServer::start(config).await
}

fn client(server: &TestServer, pki: &Pki, file: &str, names: Names<'_>) -> Client {
    let (cert, key) = pki.client(file, names);
    let tls = TlsConfig::from_pem_files(pki.ca())
        .expect("CA")
        .identity_from_pem_files(cert, key)
        .expect("client identity")
        .server_name("localhost");
    Client::builder(format!("https://127.0.0.1:{}", server.grpc_addr.port()))
        .tls(tls)
        .deadline(Duration::from_secs(5))
        .deny_cache(0)
        .build()
        .expect("a client")
}

fn denied(result: Result<impl std::fmt::Debug, Error>) -> String {
    match result {
        Err(Error::Rejected(status)) if status.code() == Code::PermissionDenied => {
            status.message().to_owned()
        }
        other => panic!("expected PERMISSION_DENIED, got {other:?}"),
    }
}

#[tokio::test]
async fn each_method_admits_only_the_identities_on_its_allowlist() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = Pki::new(&dir.path().join("tls"));
    let server = start(
        dir.path(),
        &pki,
        "reset = [\"spiffe://example.org/ops/*\"]\n\
         peek = [\"spiffe://example.org/ops/*\", \"app.internal\"]",
    )
    .await;
    let ops = client(&server, &pki, "ops", Names::uri(OPS));
    let app = client(&server, &pki, "app", Names::dns(APP));
    let legacy = client(&server, &pki, "legacy", Names::common_name(LEGACY));
    let api = PolicyRef::Named("api".to_owned());
    let check = Check::named("api", "user-1");

    // Check has no allowlist: every client that passed mTLS may call it.
    for client in [&ops, &app, &legacy] {
        assert!(client.check(&check).await.expect("check is open").allowed);
    }

    // Reset: operators only. The denial names the method and the identity,
    // and touches nothing.
    let message = denied(app.reset(&api, "user-1").await);
    assert!(
        message.contains("/quotad.v1.Quota/Reset")
            && message.contains(APP)
            && message.contains("auth.reset"),
        "{message}"
    );
    assert_eq!(ops.peek(&check).await.expect("peek").remaining, 7);
    let message = denied(legacy.reset(&api, "user-1").await);
    assert!(
        message.contains(LEGACY),
        "the common name is the identity: {message}"
    );
    ops.reset(&api, "user-1")
        .await
        .expect("operators may reset");
    assert_eq!(ops.peek(&check).await.expect("peek").remaining, 10);

    // Peek: operators and the application, not the legacy client.
    assert!(app.peek(&check).await.is_ok());
    denied(legacy.peek(&check).await);

    let metrics = server.metrics().await;
    let count = |method| metrics.value("quotad_auth_denied_total", &[("method", method)]);
    assert_eq!((count("reset"), count("peek")), (2.0, 1.0));
}

#[tokio::test]
async fn an_empty_allowlist_closes_a_method_to_everyone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = Pki::new(&dir.path().join("tls"));
    let server = start(dir.path(), &pki, "reset = []\ncheck = [\"*\"]").await;
    let ops = client(&server, &pki, "ops", Names::uri(OPS));
    assert!(ops.check(&Check::named("api", "k")).await.is_ok());
    denied(ops.reset(&PolicyRef::Named("api".to_owned()), "k").await);
}
