//! Where quotad is and how to reach it: `http://`, `https://` (TLS, mTLS)
//! and `unix://` addresses, turned into one tonic [`Endpoint`].

use std::path::Path;
use std::time::Duration;
use std::{fmt, io};

use thiserror::Error as ThisError;
use tonic::transport::Endpoint;

use crate::request::Error;

/// The default time without a frame from quotad after which the client
/// pings the connection (HTTP/2 `PING`), busy or idle.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// The default time a ping may go unanswered before the connection is
/// dropped and the next call connects again.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// TCP keepalive on the socket under HTTP/2: the first probe after this
/// much idle time, then one every [`TCP_KEEPALIVE_PROBE_INTERVAL`], and the
/// kernel drops the connection after [`TCP_KEEPALIVE_RETRIES`] unanswered.
/// It keeps NAT and conntrack entries of an idle connection alive; the
/// HTTP/2 pings are what find a connection that stopped answering.
const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const TCP_KEEPALIVE_PROBE_INTERVAL: Duration = Duration::from_secs(5);
const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// How the client finds a connection that stopped answering (a network
/// partition, a blackholed route, a replaced pod behind the same address):
/// after `interval` without a frame from quotad it sends an HTTP/2 ping,
/// busy or idle, and drops the connection when no answer comes within
/// `timeout`; the next call connects again. Without it such a connection
/// would time out every call until the kernel gave up on it (about 15
/// minutes on Linux).
///
/// [`Keepalive::default`]: [`DEFAULT_KEEPALIVE_INTERVAL`] and
/// [`DEFAULT_KEEPALIVE_TIMEOUT`], so a silent connection is gone within
/// 15 s. quotad accepts pings at any rate; a proxy in between that limits
/// them (gRPC's C core refuses pings more often than every 5 minutes by
/// default) needs a longer interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    interval: Duration,
    timeout: Duration,
}

/// A keepalive setting out of range; the message names the setting.
#[derive(Clone, Copy, Debug, ThisError, PartialEq, Eq)]
pub enum KeepaliveError {
    /// A ping interval under a millisecond.
    #[error("keepalive.interval: must be at least 1 ms")]
    Interval,
    /// A ping timeout under a millisecond.
    #[error("keepalive.timeout: must be at least 1 ms")]
    Timeout,
}

impl Default for Keepalive {
    fn default() -> Self {
        Self {
            interval: DEFAULT_KEEPALIVE_INTERVAL,
            timeout: DEFAULT_KEEPALIVE_TIMEOUT,
        }
    }
}

impl Keepalive {
    /// Pings after `interval` without a frame from quotad, and drops the
    /// connection when a ping is not answered within `timeout`.
    ///
    /// # Errors
    ///
    /// [`KeepaliveError`] when either is under a millisecond.
    pub fn try_new(interval: Duration, timeout: Duration) -> Result<Self, KeepaliveError> {
        if interval < Duration::from_millis(1) {
            return Err(KeepaliveError::Interval);
        }
        if timeout < Duration::from_millis(1) {
            return Err(KeepaliveError::Timeout);
        }
        Ok(Self { interval, timeout })
    }

    /// The time without a frame from quotad after which the client pings.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// How long a ping may go unanswered.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// TLS settings for an `https://` address: the CA that signed quotad's
/// certificate, and optionally a client certificate (mTLS) and the name to
/// expect in quotad's certificate.
///
/// rustls with the ring provider does the work (the `tls` feature, on by
/// default).
///
/// ```no_run
/// # fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use quotad_client::{Client, TlsConfig};
///
/// let tls = TlsConfig::from_pem_files("/etc/quotad/ca.pem")?
///     .identity_from_pem_files("/etc/app/client.pem", "/etc/app/client.key")?
///     .server_name("quotad.internal");
/// let client = Client::builder("https://10.0.0.7:50051").tls(tls).build()?;
/// # let _ = client;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TlsConfig {
    // Read only where TLS is compiled in; without it, `https://` is refused.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    server_name: Option<String>,
}

impl fmt::Debug for TlsConfig {
    // The private key stays out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("client_identity", &self.identity.is_some())
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TlsConfig {
    /// Trusts the CA certificates in `ca_pem` (PEM), and only them, to sign
    /// quotad's certificate.
    pub fn new(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            ca_pem: ca_pem.into(),
            identity: None,
            server_name: None,
        }
    }

    /// [`TlsConfig::new`] with the CA read from a PEM file.
    ///
    /// # Errors
    ///
    /// The I/O error, its message naming the setting (`tls.ca`) and the
    /// file.
    pub fn from_pem_files(ca: impl AsRef<Path>) -> io::Result<Self> {
        Ok(Self::new(read("tls.ca", ca.as_ref())?))
    }

    /// Presents this client certificate chain and private key (PEM) to
    /// quotad: mTLS, for servers that authorize callers by identity.
    #[must_use]
    pub fn identity(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// [`TlsConfig::identity`] read from PEM files.
    ///
    /// # Errors
    ///
    /// The I/O error, its message naming the setting (`tls.cert`,
    /// `tls.key`) and the file.
    pub fn identity_from_pem_files(
        self,
        cert: impl AsRef<Path>,
        key: impl AsRef<Path>,
    ) -> io::Result<Self> {
        let cert = read("tls.cert", cert.as_ref())?;
        let key = read("tls.key", key.as_ref())?;
        Ok(self.identity(cert, key))
    }

    /// Expects `name` in quotad's certificate instead of the address's host
    /// (for an address by IP, or a name the certificate does not carry).
    #[must_use]
    pub fn server_name(mut self, name: impl Into<String>) -> Self {
        self.server_name = Some(name.into());
        self
    }
}

fn read(field: &str, path: &Path) -> io::Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{field}: {}: {e}", path.display())))
}

/// The endpoint for `address`, with TLS when the address is `https://`.
pub(crate) fn endpoint(
    address: &str,
    tls: Option<&TlsConfig>,
    connect_timeout: Duration,
    keepalive: Keepalive,
) -> Result<Endpoint, Error> {
    let invalid = |why: &str| Error::InvalidAddress(format!("{address}: {why}"));
    let scheme = address.split_once(':').map_or("", |(scheme, _)| scheme);
    let secure = match scheme {
        "http" => false,
        "https" => true,
        "unix" => {
            let path = address
                .strip_prefix("unix://")
                .or_else(|| address.strip_prefix("unix:"))
                .unwrap_or_default();
            if path.is_empty() {
                return Err(invalid(
                    "a unix address needs a socket path (unix:///path/to.sock)",
                ));
            }
            if tls.is_some() {
                return Err(invalid(
                    "tls: TLS is for https:// addresses, not unix sockets",
                ));
            }
            false
        }
        _ => {
            return Err(invalid(
                "expected http://host:port, https://host:port or unix:///path/to.sock",
            ));
        }
    };
    let endpoint = Endpoint::from_shared(address.to_owned())
        .map_err(|e| invalid(&e.to_string()))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(keepalive.interval)
        .keep_alive_timeout(keepalive.timeout)
        .keep_alive_while_idle(true)
        .tcp_keepalive(Some(TCP_KEEPALIVE_IDLE))
        .tcp_keepalive_interval(Some(TCP_KEEPALIVE_PROBE_INTERVAL))
        .tcp_keepalive_retries(Some(TCP_KEEPALIVE_RETRIES));
    match (secure, tls) {
        (false, None) => Ok(endpoint),
        (false, Some(_)) => Err(invalid("tls: TLS settings need an https:// address")),
        (true, None) => Err(invalid(
            "tls: an https:// address needs a CA to trust (ClientBuilder::tls)",
        )),
        (true, Some(tls)) => with_tls(endpoint, tls).map_err(|why| invalid(&why)),
    }
}

/// Puts the caller's OpenTelemetry context into a call's metadata
/// (feature `otel`): [`opentelemetry::Context::current`], which holds the
/// current `tracing` span's when the application bridges them with
/// `tracing-opentelemetry`, injected by the application's global text map
/// propagator (`opentelemetry::global::set_text_map_propagator`, e.g. W3C
/// trace context, which quotad reads). With no propagator set, or no span
/// current, nothing is added. Without the feature this does nothing.
#[cfg(feature = "otel")]
pub(crate) fn propagate(metadata: &mut tonic::metadata::MetadataMap) {
    struct Injector<'a>(&'a mut tonic::metadata::MetadataMap);

    impl opentelemetry::propagation::Injector for Injector<'_> {
        fn set(&mut self, key: &str, value: String) {
            // A propagator's header names and values are ASCII; one that is
            // not cannot be sent and is left out.
            if let (Ok(key), Ok(value)) = (
                tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
                tonic::metadata::MetadataValue::try_from(value),
            ) {
                self.0.insert(key, value);
            }
        }
    }

    let cx = opentelemetry::Context::current();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&cx, &mut Injector(metadata));
    });
}

/// Without the `otel` feature, calls carry no trace context.
#[cfg(not(feature = "otel"))]
pub(crate) fn propagate(_metadata: &mut tonic::metadata::MetadataMap) {}

#[cfg(feature = "tls")]
fn with_tls(endpoint: Endpoint, tls: &TlsConfig) -> Result<Endpoint, String> {
    use crate::request::source_chain;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};

    // tonic skips certificates it cannot parse, which would turn a bad CA
    // file into a handshake failure at the first call; refuse it here.
    let cas = CertificateDer::pem_slice_iter(&tls.ca_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("tls.ca: not a PEM certificate: {e}"))?;
    if cas.is_empty() {
        return Err("tls.ca: no PEM certificate found".to_owned());
    }
    // A PEM block whose contents are not a certificate would be skipped too.
    let mut roots = rustls::RootCertStore::empty();
    let (_, unusable) = roots.add_parsable_certificates(cas);
    if unusable > 0 {
        return Err(format!(
            "tls.ca: {unusable} of the PEM certificates cannot be used as a CA"
        ));
    }
    let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(Identity::from_pem(cert, key));
    }
    if let Some(name) = &tls.server_name {
        config = config.domain_name(name.clone());
    }
    endpoint
        .tls_config(config)
        .map_err(|e| format!("tls: {}", source_chain(&e)))
}

#[cfg(not(feature = "tls"))]
fn with_tls(_endpoint: Endpoint, _tls: &TlsConfig) -> Result<Endpoint, String> {
    Err("tls: this build of quotad-client has no TLS support (enable the `tls` feature)".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(1);

    fn error(address: &str, tls: Option<&TlsConfig>) -> String {
        match endpoint(address, tls, TIMEOUT, Keepalive::default()) {
            Ok(_) => panic!("{address} should be refused"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn plain_and_unix_addresses_make_endpoints() {
        for address in [
            "http://127.0.0.1:50051",
            "http://[::1]:50051",
            "unix:///run/quotad.sock",
            "unix:quotad.sock",
        ] {
            assert!(
                endpoint(address, None, TIMEOUT, Keepalive::default()).is_ok(),
                "{address}"
            );
        }
    }

    #[test]
    fn endpoints_keep_tcp_connections_alive() {
        let endpoint = endpoint(
            "http://127.0.0.1:50051",
            None,
            TIMEOUT,
            Keepalive::default(),
        )
        .expect("valid address");
        assert_eq!(endpoint.get_tcp_keepalive(), Some(TCP_KEEPALIVE_IDLE));
        assert_eq!(
            endpoint.get_tcp_keepalive_interval(),
            Some(TCP_KEEPALIVE_PROBE_INTERVAL)
        );
        assert_eq!(
            endpoint.get_tcp_keepalive_retries(),
            Some(TCP_KEEPALIVE_RETRIES)
        );
    }

    #[test]
    fn keepalive_settings_under_a_millisecond_are_refused_naming_the_setting() {
        let ms = Duration::from_millis(1);
        assert_eq!(
            Keepalive::try_new(ms, ms).map(|k| (k.interval(), k.timeout())),
            Ok((ms, ms))
        );
        for (result, field) in [
            (Keepalive::try_new(Duration::ZERO, ms), "interval"),
            (
                Keepalive::try_new(Duration::from_micros(999), ms),
                "interval",
            ),
            (Keepalive::try_new(ms, Duration::ZERO), "timeout"),
        ] {
            let message = result.expect_err("out of range").to_string();
            assert!(
                message.starts_with(&format!("keepalive.{field}: ")),
                "{message}"
            );
        }
    }

    #[test]
    fn unknown_schemes_and_empty_socket_paths_are_refused_naming_the_address() {
        assert!(error("127.0.0.1:50051", None).contains("127.0.0.1:50051: expected http://"));
        assert!(error("ftp://host:1", None).contains("expected http://"));
        assert!(error("unix://", None).contains("needs a socket path"));
    }

    #[test]
    fn tls_settings_must_match_the_scheme() {
        let tls = TlsConfig::new("not used");
        assert!(error("https://localhost:1", None).contains("needs a CA to trust"));
        assert!(error("http://localhost:1", Some(&tls)).contains("need an https:// address"));
        assert!(error("unix:///run/q.sock", Some(&tls)).contains("not unix sockets"));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_ca_without_a_certificate_is_refused_before_any_connection() {
        let message = error("https://localhost:1", Some(&TlsConfig::new("garbage")));
        assert!(message.contains("tls.ca: no PEM certificate"), "{message}");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn https_without_the_tls_feature_is_refused_saying_so() {
        let message = error("https://localhost:1", Some(&TlsConfig::new("ca")));
        assert!(message.contains("enable the `tls` feature"), "{message}");
    }

    #[test]
    fn unreadable_files_are_named() {
        let missing = TlsConfig::from_pem_files("/nonexistent/ca.pem")
            .expect_err("no such file")
            .to_string();
        assert!(missing.contains("tls.ca: /nonexistent/ca.pem"), "{missing}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_ca_that_is_no_certificate_is_refused_saying_so() {
        let garbled = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let message = error(
            "https://localhost:1",
            Some(&TlsConfig::new(garbled.as_bytes().to_vec())),
        );
        assert!(message.contains("cannot be used as a CA"), "{message}");
    }

    #[test]
    fn the_private_key_is_not_printed() {
        let tls = TlsConfig::new("ca").identity("cert", "SECRET KEY");
        assert!(!format!("{tls:?}").contains("SECRET"));
    }
}
