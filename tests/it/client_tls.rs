//! quotad-client over TLS and mTLS against the real server's
//! `[server.tls]`, with certificates made for the test.
//!
//! A module of the root integration test binary (`tests/it`, declared as
//! `mod client_tls;`), using its `common` helpers.

use std::path::Path;
use std::time::Duration;

use quotad_client::{Check, Client, Error, TlsConfig};

use crate::common::TestServer;
use crate::tls::{start, write_pki};

fn client(server: &TestServer, dir: &Path, identity: bool) -> Client {
    let pki = dir.join("tls");
    let mut tls = TlsConfig::from_pem_files(pki.join("ca.pem")).expect("CA file");
    if identity {
        tls = tls
            .identity_from_pem_files(pki.join("client.pem"), pki.join("client.key"))
            .expect("identity files");
    }
    Client::builder(format!("https://localhost:{}", server.grpc_addr.port()))
        .deadline(Duration::from_secs(5))
        .tls(tls)
        .build()
        .expect("valid TLS settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_checks_over_tls_and_a_plaintext_client_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_pki(dir.path());
    let server = start(dir.path(), false).await;
    let decision = client(&server, dir.path(), false)
        .check(&Check::named("api", "alice"))
        .await
        .expect("decided over TLS");
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 9);

    let plaintext = Client::builder(format!("http://{}", server.grpc_addr))
        .deadline(Duration::from_secs(5))
        .build()
        .expect("valid address");
    let refused = plaintext.check(&Check::named("api", "alice")).await;
    assert!(matches!(refused, Err(Error::Unavailable(_))), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_checks_over_mtls_with_its_certificate_and_is_refused_without() {
    let dir = tempfile::tempdir().expect("temp dir");
    write_pki(dir.path());
    let server = start(dir.path(), true).await;
    let decision = client(&server, dir.path(), true)
        .check(&Check::named("api", "alice"))
        .await
        .expect("decided over mTLS");
    assert!(decision.allowed);
    let refused = client(&server, dir.path(), false)
        .check(&Check::named("api", "bob"))
        .await;
    assert!(matches!(refused, Err(Error::Unavailable(_))), "{refused:?}");
}
