//! https:// with and without a client certificate.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use quotad_client::{Check, Client, Error, FailurePolicy, Reason, TlsConfig};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, date_time_ymd,
};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::fake::{Call, Fake, serve_tcp};

/// A CA and the certificates it signed, as PEM.
struct Pki {
    ca: String,
    server: (String, String),
    /// The server's name, valid only in 2000.
    expired_server: (String, String),
    client: (String, String),
}

fn pki(ca_name: &str) -> Pki {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.distinguished_name.push(DnType::CommonName, ca_name);
    let ca =
        CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA");
    let leaf = |name: &str, purpose: ExtendedKeyUsagePurpose, expired: bool| {
        let key = KeyPair::generate().expect("leaf key");
        let mut params = CertificateParams::new(vec![name.to_owned()]).expect("leaf params");
        params.extended_key_usages = vec![purpose];
        if expired {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        }
        let cert = params.signed_by(&key, &ca).expect("leaf certificate");
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        server: leaf("quotad.test", ExtendedKeyUsagePurpose::ServerAuth, false),
        expired_server: leaf("quotad.test", ExtendedKeyUsagePurpose::ServerAuth, true),
        client: leaf("app", ExtendedKeyUsagePurpose::ClientAuth, false),
        ca: ca.pem(),
    }
}

fn server_tls(pki: &Pki, require_client_cert: bool) -> ServerTlsConfig {
    let (cert, key) = &pki.server;
    let tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    if require_client_cert {
        tls.client_ca_root(Certificate::from_pem(&pki.ca))
    } else {
        tls
    }
}

fn client(address: String, tls: TlsConfig) -> Client {
    Client::builder(address)
        .deadline(Duration::from_secs(5))
        .tls(tls)
        .build()
        .expect("valid TLS settings")
}

#[tokio::test]
async fn checks_travel_over_tls_to_a_server_whose_ca_the_client_trusts() {
    let pki = pki("quotad test CA");
    let fake = Fake::new(10, Duration::from_secs(60));
    let addr = serve_tcp(&fake, Some(server_tls(&pki, false))).await;

    // By IP, so the certificate's name is given.
    let tls = TlsConfig::new(pki.ca.clone()).server_name("quotad.test");
    let decision = client(format!("https://{addr}"), tls)
        .check(&Check::named("api", "alice"))
        .await
        .expect("decided over TLS");
    assert_eq!(decision.reason, Reason::WithinLimit);
    assert_eq!(fake.calls(), vec![Call::Check("alice".into())]);

    let plaintext = Client::builder(format!("http://{addr}"))
        .deadline(Duration::from_secs(5))
        .build()
        .expect("valid address");
    assert!(matches!(
        plaintext.check(&Check::named("api", "bob")).await,
        Err(Error::Unavailable(_))
    ));
}

#[tokio::test]
async fn a_server_signed_by_another_ca_or_under_another_name_is_refused() {
    let pki = pki("quotad test CA");
    let stranger = pki_stranger();
    let fake = Fake::new(10, Duration::from_secs(60));
    let addr = serve_tcp(&fake, Some(server_tls(&pki, false))).await;

    let other_ca = TlsConfig::new(stranger).server_name("quotad.test");
    let wrong_name = TlsConfig::new(pki.ca.clone()).server_name("other.test");
    for tls in [other_ca, wrong_name] {
        let result = client(format!("https://{addr}"), tls)
            .check(&Check::named("api", "alice"))
            .await;
        assert!(matches!(result, Err(Error::Unavailable(_))), "{result:?}");
    }
    assert!(fake.calls().is_empty(), "no request reached the server");
}

fn pki_stranger() -> String {
    pki("another CA").ca
}

/// Log lines written while it is the thread's subscriber.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Captures this thread's log lines until the guard is dropped.
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(logs.clone())
            .with_ansi(false)
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("no writer panicked")).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("no writer panicked")
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

// A current-thread runtime: the client logs on the test's thread, where
// the capturing subscriber is the default.
#[tokio::test(flavor = "current_thread")]
async fn a_certificate_failure_gets_the_failure_policy_and_the_log_names_its_cause() {
    let pki = pki("quotad test CA");
    let fake = Fake::new(10, Duration::from_secs(60));
    let addr = serve_tcp(&fake, Some(server_tls(&pki, false))).await;
    let (cert, key) = &pki.expired_server;
    let expired = serve_tcp(
        &fake,
        Some(ServerTlsConfig::new().identity(Identity::from_pem(cert, key))),
    )
    .await;
    let trusted = || TlsConfig::new(pki.ca.clone()).server_name("quotad.test");
    let https = |addr| format!("https://{addr}");
    for (address, tls, cause) in [
        (
            https(addr),
            Some(TlsConfig::new(pki_stranger()).server_name("quotad.test")),
            "UnknownIssuer",
        ),
        (
            https(addr),
            Some(TlsConfig::new(pki.ca.clone()).server_name("other.test")),
            "not valid for name \"other.test\"",
        ),
        (https(expired), Some(trusted()), "certificate expired"),
        // Plaintext to the TLS port: the status says only "transport
        // error"; the log carries what broke beneath it.
        (format!("http://{addr}"), None, "cause=transport error: "),
    ] {
        let (logs, _default) = Logs::capture();
        let mut builder = Client::builder(address)
            .deadline(Duration::from_secs(5))
            .on_unavailable(FailurePolicy::FailOpen);
        if let Some(tls) = tls {
            builder = builder.tls(tls);
        }
        let decision = builder
            .build()
            .expect("valid settings")
            .check(&Check::named("api", "alice"))
            .await
            .expect("the failure policy answers");
        assert_eq!(decision.reason, Reason::FailOpen);
        let text = logs.text();
        assert!(
            text.contains("quotad unavailable") && text.contains(cause),
            "{cause}: {text}"
        );
    }

    // The control: the same server and CA, with the right name, decide.
    let decision = client(format!("https://{addr}"), trusted())
        .check(&Check::named("api", "alice"))
        .await
        .expect("decided over TLS");
    assert_eq!(decision.reason, Reason::WithinLimit);
    assert_eq!(fake.calls(), vec![Call::Check("alice".into())]);
}

#[tokio::test]
async fn mtls_works_with_a_client_certificate_and_is_refused_without_one() {
    let pki = pki("quotad test CA");
    let fake = Fake::new(10, Duration::from_secs(60));
    let addr = serve_tcp(&fake, Some(server_tls(&pki, true))).await;
    let (cert, key) = pki.client.clone();

    let with_identity = TlsConfig::new(pki.ca.clone())
        .identity(cert, key)
        .server_name("quotad.test");
    let decision = client(format!("https://{addr}"), with_identity)
        .check(&Check::named("api", "alice"))
        .await
        .expect("decided over mTLS");
    assert!(decision.allowed);

    let without = TlsConfig::new(pki.ca.clone()).server_name("quotad.test");
    let result = client(format!("https://{addr}"), without)
        .check(&Check::named("api", "bob"))
        .await;
    assert!(matches!(result, Err(Error::Unavailable(_))), "{result:?}");
    assert_eq!(fake.calls(), vec![Call::Check("alice".into())]);
}

#[tokio::test]
async fn tls_settings_are_read_from_pem_files() {
    let pki = pki("quotad test CA");
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = &pki.client;
    for (name, pem) in [
        ("ca.pem", &pki.ca),
        ("client.pem", cert),
        ("client.key", key),
    ] {
        std::fs::write(dir.path().join(name), pem).expect("write PEM");
    }
    let fake = Fake::new(10, Duration::from_secs(60));
    let addr = serve_tcp(&fake, Some(server_tls(&pki, true))).await;
    let tls = TlsConfig::from_pem_files(dir.path().join("ca.pem"))
        .expect("CA file")
        .identity_from_pem_files(dir.path().join("client.pem"), dir.path().join("client.key"))
        .expect("identity files")
        .server_name("quotad.test");
    let decision = client(format!("https://{addr}"), tls)
        .check(&Check::named("api", "alice"))
        .await
        .expect("decided over mTLS");
    assert!(decision.allowed);
}

#[tokio::test]
async fn an_unusable_client_key_is_refused_when_the_client_is_built() {
    let pki = pki("quotad test CA");
    let (cert, _) = pki.client.clone();
    let tls = TlsConfig::new(pki.ca.clone()).identity(cert, "not a key");
    let error = Client::builder("https://127.0.0.1:1")
        .tls(tls)
        .build()
        .expect_err("the key is not PEM");
    assert!(
        matches!(&error, Error::InvalidAddress(m) if m.contains("tls")),
        "{error}"
    );
}
