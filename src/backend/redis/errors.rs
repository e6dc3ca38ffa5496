//! What a Redis error means for a check: every error Redis or the client
//! can raise is sorted here on purpose, in one table.
//!
//! - An **outage** (the server is down, unreachable, loading, out of memory,
//!   refusing our credentials, failing over) is [`BackendError::Unavailable`]:
//!   the policy's `on_error` decides. Some outages also mean the connection
//!   itself must be replaced (it points at a replica, or is broken).
//! - **Corrupt state** (a value under one of quotad's keys that the script
//!   cannot read) is [`BackendError::Internal`] and counted: failing open on
//!   it would hide it forever.
//! - Anything else (a script error, a reply of the wrong shape) is a bug:
//!   [`BackendError::Internal`].

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::backend::BackendError;

/// The code the script answers when a key holds state it cannot read.
pub(super) const CORRUPT: &str = "QUOTAD_CORRUPT";

/// How quotad treats one error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    /// Redis is unavailable; `replace` when the connection must be dropped
    /// and made again (broken, or pointing at a node that is no longer the
    /// primary).
    Outage { replace: bool },
    /// An all-or-nothing batch over keys in different Cluster slots.
    CrossSlot,
    /// A key holds state the script cannot read.
    Corrupt,
    /// A bug: an error no outage explains.
    Internal,
}

/// Sorts an error by its kind and server code.
pub(super) fn classify(e: &RedisError) -> Class {
    let io_kind = e.is_io_error().then(|| {
        if e.is_connection_refusal() {
            std::io::ErrorKind::ConnectionRefused
        } else if e.is_timeout() {
            std::io::ErrorKind::TimedOut
        } else {
            std::io::ErrorKind::Other
        }
    });
    classify_parts(e.kind(), e.code(), io_kind)
}

/// The table itself: `kind` and `code` as the client reports them.
pub(super) fn classify_parts(
    kind: ErrorKind,
    code: Option<&str>,
    io: Option<std::io::ErrorKind>,
) -> Class {
    if let Some(code) = code {
        match code {
            CORRUPT | "WRONGTYPE" => return Class::Corrupt,
            "CROSSSLOT" => return Class::CrossSlot,
            // A failover behind the same name: this connection now reaches
            // a replica. A new one finds the primary.
            "READONLY" => return Class::Outage { replace: true },
            // Credentials refused or missing: a new connection authenticates
            // again (the password may have been set since we connected).
            "NOAUTH" | "WRONGPASS" => return Class::Outage { replace: true },
            // The server is there but cannot serve this call now.
            "OOM" | "NOPERM" | "LOADING" | "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN" | "BUSY"
            | "MOVED" | "ASK" => return Class::Outage { replace: false },
            _ => {}
        }
    }
    match kind {
        ErrorKind::Io => Class::Outage {
            replace: io != Some(std::io::ErrorKind::TimedOut),
        },
        ErrorKind::AuthenticationFailed => Class::Outage { replace: true },
        ErrorKind::ClusterConnectionNotFound => Class::Outage { replace: false },
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::NoPerm,
        ) => Class::Outage { replace: false },
        ErrorKind::Server(ServerErrorKind::ReadOnly) => Class::Outage { replace: true },
        ErrorKind::Server(ServerErrorKind::CrossSlot) => Class::CrossSlot,
        _ => Class::Internal,
    }
}

/// The backend error for `e`, already classified as `class`.
pub(super) fn to_backend_error(class: Class, e: &RedisError) -> BackendError {
    match class {
        Class::Outage { .. } => BackendError::Unavailable(format!("redis: {e}")),
        Class::CrossSlot => BackendError::CrossSlot,
        Class::Corrupt => {
            BackendError::Internal(format!("redis holds state quotad cannot read: {e}"))
        }
        Class::Internal => BackendError::Internal(format!("redis: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use std::io::ErrorKind as Io;

    use super::*;

    #[test]
    fn every_outage_code_is_subject_to_on_error_and_corrupt_state_is_internal() {
        let extension = ErrorKind::Extension;
        let response = ErrorKind::Server(ServerErrorKind::ResponseError);
        let table: &[(ErrorKind, Option<&str>, Option<Io>, Class)] = &[
            (
                response,
                Some("OOM"),
                None,
                Class::Outage { replace: false },
            ),
            (
                extension,
                Some("NOAUTH"),
                None,
                Class::Outage { replace: true },
            ),
            (
                extension,
                Some("WRONGPASS"),
                None,
                Class::Outage { replace: true },
            ),
            (
                ErrorKind::AuthenticationFailed,
                None,
                None,
                Class::Outage { replace: true },
            ),
            (
                ErrorKind::Server(ServerErrorKind::NoPerm),
                Some("NOPERM"),
                None,
                Class::Outage { replace: false },
            ),
            (
                ErrorKind::Server(ServerErrorKind::BusyLoading),
                Some("LOADING"),
                None,
                Class::Outage { replace: false },
            ),
            (
                ErrorKind::Server(ServerErrorKind::MasterDown),
                Some("MASTERDOWN"),
                None,
                Class::Outage { replace: false },
            ),
            (
                ErrorKind::Server(ServerErrorKind::ClusterDown),
                Some("CLUSTERDOWN"),
                None,
                Class::Outage { replace: false },
            ),
            (
                ErrorKind::Server(ServerErrorKind::TryAgain),
                Some("TRYAGAIN"),
                None,
                Class::Outage { replace: false },
            ),
            (
                extension,
                Some("BUSY"),
                None,
                Class::Outage { replace: false },
            ),
            (
                ErrorKind::Server(ServerErrorKind::ReadOnly),
                Some("READONLY"),
                None,
                Class::Outage { replace: true },
            ),
            (
                ErrorKind::Server(ServerErrorKind::CrossSlot),
                Some("CROSSSLOT"),
                None,
                Class::CrossSlot,
            ),
            (extension, Some(CORRUPT), None, Class::Corrupt),
            (extension, Some("WRONGTYPE"), None, Class::Corrupt),
            (
                ErrorKind::Io,
                None,
                Some(Io::ConnectionRefused),
                Class::Outage { replace: true },
            ),
            (
                ErrorKind::Io,
                None,
                Some(Io::Other),
                Class::Outage { replace: true },
            ),
            (
                ErrorKind::Io,
                None,
                Some(Io::TimedOut),
                Class::Outage { replace: false },
            ),
            (
                ErrorKind::ClusterConnectionNotFound,
                None,
                None,
                Class::Outage { replace: false },
            ),
            // A script error or a reply quotad cannot read is a bug.
            (response, Some("ERR"), None, Class::Internal),
            (ErrorKind::Parse, None, None, Class::Internal),
            (ErrorKind::UnexpectedReturnType, None, None, Class::Internal),
            (
                ErrorKind::Server(ServerErrorKind::NoScript),
                Some("NOSCRIPT"),
                None,
                Class::Internal,
            ),
        ];
        for &(kind, code, io, expected) in table {
            assert_eq!(
                classify_parts(kind, code, io),
                expected,
                "{kind:?} {code:?} {io:?}"
            );
        }
    }

    #[test]
    fn a_refused_connection_is_an_outage_that_replaces_the_connection() {
        let refused = RedisError::from(std::io::Error::from(Io::ConnectionRefused));
        assert_eq!(classify(&refused), Class::Outage { replace: true });
    }
}
