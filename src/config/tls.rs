//! `[server.tls]`: the files, checked when the configuration loads and read
//! again when the server starts, never by a policy reload (so a reload
//! during a certificate rotation is not refused).

use std::fmt;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// The certificate files of the gRPC port, their paths resolved against
/// the config file's folder.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsSettings {
    /// `server.tls.cert`: PEM certificate chain.
    pub cert: PathBuf,
    /// `server.tls.key`: PEM private key.
    pub key: PathBuf,
    /// `server.tls.client_ca`: PEM CA certificates; when set, clients must
    /// present a certificate signed by one of them (mTLS).
    pub client_ca: Option<PathBuf>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("client_ca", &self.client_ca)
            .finish()
    }
}

/// A TLS file that cannot be used: which one (`cert`, `key`,
/// `client_ca`), and why.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct TlsFileError {
    pub(crate) field: &'static str,
    pub(crate) message: String,
}

/// The PEM contents of the files.
struct Pem {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// Reads a TLS file, for the setting `field`.
pub(super) fn read_file(path: &Path, field: &'static str) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|e| TlsFileError {
        field,
        message: format!("cannot read {}: {e}", path.display()),
    })
}

/// Checks that `pem`, read from `path` for `field`, holds at least one PEM
/// certificate and nothing else that fails to parse.
pub(super) fn check_certificates(
    pem: &[u8],
    field: &'static str,
    path: &Path,
) -> Result<(), TlsFileError> {
    let count = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsFileError {
            field,
            message: format!("{}: not PEM certificates: {e}", path.display()),
        })?
        .len();
    if count == 0 {
        return Err(TlsFileError {
            field,
            message: format!("{}: holds no PEM certificate", path.display()),
        });
    }
    Ok(())
}

/// Checks that `pem`, read from `path` for `field`, holds a PEM private key.
pub(super) fn check_private_key(
    pem: &[u8],
    field: &'static str,
    path: &Path,
) -> Result<(), TlsFileError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| TlsFileError {
        field,
        message: format!("{}: not a PEM private key: {e}", path.display()),
    })?;
    Ok(())
}

impl TlsSettings {
    fn read(&self) -> Result<Pem, TlsFileError> {
        Ok(Pem {
            cert: read_file(&self.cert, "cert")?,
            key: read_file(&self.key, "key")?,
            client_ca: self
                .client_ca
                .as_deref()
                .map(|p| read_file(p, "client_ca"))
                .transpose()?,
        })
    }

    /// Reads the files and checks that each holds what it should: at least
    /// one certificate, a private key, at least one CA certificate.
    pub(crate) fn check(&self) -> Result<(), TlsFileError> {
        let pem = self.read()?;
        check_certificates(&pem.cert, "cert", &self.cert)?;
        check_private_key(&pem.key, "key", &self.key)?;
        if let (Some(ca), Some(path)) = (&pem.client_ca, &self.client_ca) {
            check_certificates(ca, "client_ca", path)?;
        }
        Ok(())
    }

    /// Reads the files into the tonic server TLS configuration. tonic takes
    /// the process-wide rustls provider when it applies it
    /// ([`crate::install_crypto_provider`]).
    pub(crate) fn server_config(&self) -> Result<ServerTlsConfig, TlsFileError> {
        let pem = self.read()?;
        let mut tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(pem.cert, pem.key))
            .timeout(std::time::Duration::from_secs(10));
        if let Some(ca) = pem.client_ca {
            tls = tls.client_ca_root(Certificate::from_pem(ca));
        }
        Ok(tls)
    }
}
