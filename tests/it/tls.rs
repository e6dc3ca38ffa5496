//! TLS and mTLS on the gRPC port, with certificates made for the test.

use std::path::Path;

use crate::common::{TestServer, named};
use crate::pki::{Names, Pki};
use quotad::{Config, FlagValues};
use quotad_proto::v1::quota_client::QuotaClient;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const POLICY: &str =
    "\n[policies.api]\nalgorithm = \"fixed_window\"\nlimit = 10\nwindow = \"1m\"\n";

/// A CA, a server certificate for `localhost` and a client certificate, as
/// PEM files in `dir/tls/` (quotad-client's TLS tests use them too).
pub(crate) fn write_pki(dir: &Path) {
    let pki = Pki::new(&dir.join("tls"));
    pki.server();
    pki.client("client", Names::dns("client"));
}

/// Starts a server whose config file names the TLS files by paths relative
/// to the file itself.
pub(crate) async fn start(dir: &Path, client_ca: bool) -> TestServer {
    let mut text = "[server.tls]\ncert = \"tls/server.pem\"\nkey = \"tls/server.key\"\n".to_owned();
    if client_ca {
        text.push_str("client_ca = \"tls/ca.pem\"\n");
    }
    text.push_str(POLICY);
    let path = dir.join("quotad.toml");
    std::fs::write(&path, text).expect("write config");
    let config = Config::load(Some(&path), &FlagValues::default()).expect("valid TLS config");
    TestServer::start(config).await
}

async fn check_over_tls(server: &TestServer, dir: &Path, identity: bool) -> Result<bool, String> {
    let read = |name: &str| std::fs::read(dir.join("tls").join(name)).expect("read PEM");
    let mut tls = ClientTlsConfig::new()
        .domain_name("localhost")
        .ca_certificate(Certificate::from_pem(read("ca.pem")));
    if identity {
        tls = tls.identity(Identity::from_pem(read("client.pem"), read("client.key")));
    }
    let endpoint = Endpoint::from_shared(format!("https://{}", server.grpc_addr))
        .expect("URI")
        .tls_config(tls)
        .expect("client TLS config");
    let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
    let response = QuotaClient::new(channel)
        .check(named("k", "api", None))
        .await
        .map_err(|e| e.to_string())?;
    Ok(response.into_inner().decision.is_some_and(|d| d.allowed))
}

async fn check_in_plaintext(server: &TestServer) -> bool {
    let Ok(channel) = Endpoint::from_shared(format!("http://{}", server.grpc_addr))
        .expect("URI")
        .connect()
        .await
    else {
        return false;
    };
    QuotaClient::new(channel)
        .check(named("k", "api", None))
        .await
        .is_ok()
}

#[tokio::test]
async fn tls_serves_clients_that_trust_the_server_and_refuses_plaintext() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_pki(dir.path());
    let server = start(dir.path(), false).await;
    assert_eq!(check_over_tls(&server, dir.path(), false).await, Ok(true));
    assert!(!check_in_plaintext(&server).await);
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_signed_by_the_client_ca() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_pki(dir.path());
    let server = start(dir.path(), true).await;
    assert_eq!(check_over_tls(&server, dir.path(), true).await, Ok(true));
    assert!(
        check_over_tls(&server, dir.path(), false).await.is_err(),
        "no client certificate"
    );
    assert!(!check_in_plaintext(&server).await);
}
