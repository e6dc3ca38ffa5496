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

use super::RedisTls;
use crate::backend::{BackendError, NotRun, Shared};

/// The files' contents, as the client library takes them, read now (so a
/// certificate rotated since the configuration loaded is the one used).
pub(super) fn load(files: &RedisTls) -> Result<redis::TlsCertificates, BackendError> {
    let read = |path: &PathBuf, field: &'static str| {
        std::fs::read(path).map_err(|e| {
            BackendError::from(NotRun::TlsFile {
                field,
                path: path.clone(),
                source: Shared::new(e),
            })
        })
    };
    let client_tls = match &files.client {
        Some((cert, key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert, "tls_cert")?,
            client_key: read(key, "tls_key")?,
        }),
        None => None,
    };
    Ok(redis::TlsCertificates {
        client_tls,
        root_cert: files.ca.as_ref().map(|p| read(p, "tls_ca")).transpose()?,
    })
}
