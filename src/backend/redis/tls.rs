//! Redis over TLS (`rediss://`): the files a URL cannot name.
//!
//! A `rediss://` URL turns TLS on, with the server's certificate checked
//! against the system's roots and its host name. `store.redis.tls_ca`
//! replaces those roots with a CA of one's own, and `tls_cert` + `tls_key`
//! give quotad a client certificate for a Redis that requires one
//! (`tls-auth-clients yes`). rustls does the TLS, with the process-wide
//! ring provider the gRPC port uses too. The configuration checks the
//! files when it loads; they are read again when quotad connects.

use std::path::PathBuf;

use crate::backend::BackendError;

/// The certificate files for `rediss://`, their paths resolved against the
/// config file's folder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisTls {
    /// `store.redis.tls_ca`: PEM CA certificates the server's certificate
    /// must chain to, instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// `store.redis.tls_cert` and `tls_key`: quotad's client certificate
    /// chain and its private key, both PEM.
    pub client: Option<(PathBuf, PathBuf)>,
}

impl RedisTls {
    /// Whether any file is set.
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.client.is_some()
    }

    /// The files' contents, as the client library takes them, read now (so
    /// a certificate rotated since the configuration loaded is the one
    /// used).
    pub(super) fn load(&self) -> Result<redis::TlsCertificates, BackendError> {
        let read = |path: &PathBuf, field: &str| {
            std::fs::read(path).map_err(|e| {
                BackendError::Unavailable(format!(
                    "store.redis.{field}: cannot read {}: {e}",
                    path.display()
                ))
            })
        };
        let client_tls = match &self.client {
            Some((cert, key)) => Some(redis::ClientTlsConfig {
                client_cert: read(cert, "tls_cert")?,
                client_key: read(key, "tls_key")?,
            }),
            None => None,
        };
        Ok(redis::TlsCertificates {
            client_tls,
            root_cert: self.ca.as_ref().map(|p| read(p, "tls_ca")).transpose()?,
        })
    }
}
