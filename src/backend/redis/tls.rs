//! Redis over TLS (`rediss://`): the files a URL cannot name.
//!
//! A `rediss://` URL turns TLS on, with the server's certificate checked
//! against the system's roots and its host name. `store.redis.tls_ca`
//! replaces those roots with a CA of one's own, and `tls_cert` + `tls_key`
//! give quotad a client certificate for a Redis that requires one
//! (`tls-auth-clients yes`). rustls does the TLS, with the process-wide
//! ring provider the gRPC port uses too.

use std::fmt;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::backend::BackendError;

/// The certificate files for `rediss://`, their paths resolved against the
/// config file's folder.
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisTls {
    /// `store.redis.tls_ca`: PEM CA certificates the server's certificate
    /// must chain to, instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// `store.redis.tls_cert` and `tls_key`: quotad's client certificate
    /// chain and its private key, both PEM.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca)
            .field("client", &self.client)
            .finish()
    }
}

/// A TLS file that cannot be used: its setting (`tls_ca`, `tls_cert`,
/// `tls_key`) and why.
#[derive(Debug, PartialEq, Eq)]
pub struct TlsFileError {
    /// The setting under `[store.redis]`.
    pub field: &'static str,
    /// What is wrong with the file.
    pub message: String,
}

fn read(path: &Path, field: &'static str) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|e| TlsFileError {
        field,
        message: format!("cannot read {}: {e}", path.display()),
    })
}

fn certificates(path: &Path, field: &'static str) -> Result<Vec<u8>, TlsFileError> {
    let pem = read(path, field)?;
    let count = CertificateDer::pem_slice_iter(&pem)
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
    Ok(pem)
}

impl RedisTls {
    /// Whether any file is set.
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.client.is_some()
    }

    /// Reads the files and checks that each holds what it should: at least
    /// one certificate, a private key.
    ///
    /// # Errors
    ///
    /// [`TlsFileError`] naming the setting whose file cannot be used.
    pub fn check(&self) -> Result<(), TlsFileError> {
        self.certificates().map(drop)
    }

    /// The files' contents, as the client library takes them.
    fn certificates(&self) -> Result<redis::TlsCertificates, TlsFileError> {
        let root_cert = self
            .ca
            .as_deref()
            .map(|p| certificates(p, "tls_ca"))
            .transpose()?;
        let client_tls = match &self.client {
            Some((cert, key)) => {
                let client_cert = certificates(cert, "tls_cert")?;
                let client_key = read(key, "tls_key")?;
                PrivateKeyDer::from_pem_slice(&client_key).map_err(|e| TlsFileError {
                    field: "tls_key",
                    message: format!("{}: not a PEM private key: {e}", key.display()),
                })?;
                Some(redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                })
            }
            None => None,
        };
        Ok(redis::TlsCertificates {
            client_tls,
            root_cert,
        })
    }

    /// The files' contents for connecting, read now (so a certificate
    /// rotated since the configuration loaded is the one used).
    pub(super) fn load(&self) -> Result<redis::TlsCertificates, BackendError> {
        self.certificates().map_err(|e| {
            BackendError::Unavailable(format!("store.redis.{}: {}", e.field, e.message))
        })
    }
}
