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
//!
//! Redis before 7.0 wraps an error that a command raised inside a script:
//! `ERR Error running script (call to f_...): @user_script:1:
//! @user_script: 1: -READONLY You can't write against a read only
//! replica.` The code inside is read out and sorted as if Redis had answered
//! it directly, so a failover or a full disk is an outage on every version.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::backend::{BackendError, Fault, MayHaveRun, NotRun, Shared};

/// The code the script answers when a key holds state it cannot read.
pub(super) const CORRUPT: &str = "QUOTAD_CORRUPT";

/// The code of the error the rate script raises when Redis's clock is
/// outside every calendar period quotad sent (`quota.lua`).
pub(super) const CLOCK: &str = "QUOTAD_CLOCK";

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
    let code = match (e.code(), e.detail()) {
        (Some("ERR"), Some(detail)) => wrapped_code(detail).or(e.code()),
        (code, _) => code,
    };
    classify_parts(e.kind(), code, io_kind)
}

/// The code of an error a command raised inside a script, as Redis before
/// 7.0 reports it (after `ERR`): `Error running script (...): @user_script:1:
/// @user_script: 1: -READONLY ...` or `...: @user_script:1: WRONGTYPE ...`.
pub(super) fn wrapped_code(detail: &str) -> Option<&str> {
    let rest = detail.strip_prefix("Error running script")?;
    rest.split(": ").skip(1).find_map(|part| {
        let part = part.strip_prefix('-').unwrap_or(part);
        let code = part.split(' ').next()?;
        (code.len() >= 2 && code.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'))
            .then_some(code)
    })
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
            // The script found Redis's clock outside the calendar periods
            // quotad sent (the clocks apart by more than a period): this
            // call cannot be decided now, which on_error answers.
            CLOCK => return Class::Outage { replace: false },
            // A failover behind the same name: this connection now reaches
            // a replica. A new one finds the primary.
            "READONLY" => return Class::Outage { replace: true },
            // Credentials refused or missing: a new connection authenticates
            // again (the password may have been set since we connected).
            "NOAUTH" | "WRONGPASS" => return Class::Outage { replace: true },
            // The server is there but cannot serve this call now: out of
            // memory, without the replicas min-replicas-to-write asks for,
            // unable to persist (a failed RDB or AOF write), ...
            "OOM" | "NOREPLICAS" | "MISCONF" | "NOPERM" | "LOADING" | "MASTERDOWN"
            | "CLUSTERDOWN" | "TRYAGAIN" | "BUSY" | "MOVED" | "ASK" => {
                return Class::Outage { replace: false };
            }
            _ => {}
        }
    }
    match kind {
        ErrorKind::Io => Class::Outage {
            replace: io != Some(std::io::ErrorKind::TimedOut),
        },
        ErrorKind::AuthenticationFailed => Class::Outage { replace: true },
        // The sentinels name no primary that answers as one (a failover in
        // progress, or the primary down before one starts): an outage; a
        // new connection asks them again.
        ErrorKind::MasterNameNotFoundBySentinel | ErrorKind::NoValidReplicasFoundBySentinel => {
            Class::Outage { replace: true }
        }
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

/// The backend error for `e`, already classified as `class`, met by a call
/// that was sent: an outage without a reply (the connection broke, or the
/// client library gave up waiting) may have run; one Redis answered, or a
/// connection refused before the call went out, did not.
pub(super) fn to_backend_error(class: Class, e: &RedisError) -> BackendError {
    match class {
        Class::Outage { .. } => {
            let shared = Shared::new(e.clone());
            if e.is_connection_refusal() || e.kind() == ErrorKind::ClusterConnectionNotFound {
                NotRun::Connection(shared).into()
            } else if e.is_io_error() || e.is_timeout() {
                MayHaveRun::Broken(shared).into()
            } else {
                NotRun::Answered(shared).into()
            }
        }
        Class::CrossSlot => BackendError::CrossSlot,
        Class::Corrupt => {
            Fault::Corrupt(format!("redis holds state quotad cannot read: {e}")).into()
        }
        Class::Internal => Fault::Redis(Shared::new(e.clone())).into(),
    }
}

/// The backend error for `e`, met while making a connection: no call was
/// sent on it.
pub(super) fn connect_error(e: &RedisError) -> BackendError {
    match classify(e) {
        Class::Outage { .. } => NotRun::Connection(Shared::new(e.clone())).into(),
        class => to_backend_error(class, e),
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
                Some("NOREPLICAS"),
                None,
                Class::Outage { replace: false },
            ),
            (
                extension,
                Some("MISCONF"),
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
            (
                extension,
                Some(CLOCK),
                None,
                Class::Outage { replace: false },
            ),
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
            (
                ErrorKind::MasterNameNotFoundBySentinel,
                None,
                None,
                Class::Outage { replace: true },
            ),
            (
                ErrorKind::NoValidReplicasFoundBySentinel,
                None,
                None,
                Class::Outage { replace: true },
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
    fn codes_wrapped_by_redis_before_7_are_sorted_as_the_codes_themselves() {
        let wrapped = |inner: &str| {
            format!(
                "Error running script (call to f_1e84a64d649a247ba53ce64b0be7bbedd64fe1b4): @user_script:28: {inner}"
            )
        };
        let cases = [
            (
                "@user_script: 28: -READONLY You can't write against a read only replica.",
                Some("READONLY"),
            ),
            (
                "@user_script: 28: -OOM command not allowed when used memory > 'maxmemory'.",
                Some("OOM"),
            ),
            (
                "@user_script: 28: -MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
                Some("MISCONF"),
            ),
            (
                "@user_script: 28: -NOREPLICAS Not enough good replicas to write.",
                Some("NOREPLICAS"),
            ),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                Some("WRONGTYPE"),
            ),
            ("attempt to compare nil with number", None),
        ];
        for (inner, code) in cases {
            assert_eq!(wrapped_code(&wrapped(inner)), code, "{inner}");
        }
        assert_eq!(
            wrapped_code("READONLY You can't write"),
            None,
            "not wrapped"
        );
        let response = ErrorKind::Server(ServerErrorKind::ResponseError);
        for (inner, class) in [
            (cases[0].0, Class::Outage { replace: true }),
            (cases[1].0, Class::Outage { replace: false }),
            (cases[2].0, Class::Outage { replace: false }),
            (cases[3].0, Class::Outage { replace: false }),
            (cases[4].0, Class::Corrupt),
            (cases[5].0, Class::Internal),
        ] {
            let e = RedisError::from((
                response,
                "An error was signalled by the server",
                wrapped(inner),
            ));
            let code = e.detail().and_then(wrapped_code).or(e.code());
            assert_eq!(classify_parts(e.kind(), code, None), class, "{inner}");
        }
    }

    #[test]
    fn a_sent_call_that_lost_its_connection_may_have_run_and_one_redis_refused_did_not() {
        use crate::backend::Outage;
        let outage = |e: &RedisError| match to_backend_error(classify(e), e) {
            BackendError::Unavailable(outage) => outage,
            other => panic!("not an outage: {other:?}"),
        };
        let reset = RedisError::from(std::io::Error::from(Io::ConnectionReset));
        assert!(matches!(
            outage(&reset),
            Outage::MayHaveRun(MayHaveRun::Broken(_))
        ));
        let refused = RedisError::from(std::io::Error::from(Io::ConnectionRefused));
        assert!(matches!(
            outage(&refused),
            Outage::NotRun(NotRun::Connection(_))
        ));
        let replica = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "You can't write against a read only replica",
        ));
        assert!(
            matches!(outage(&replica), Outage::NotRun(NotRun::Answered(_))),
            "{replica:?}"
        );
        // Making a connection sends no call: a reset then did not run.
        assert!(matches!(
            connect_error(&reset),
            BackendError::Unavailable(Outage::NotRun(NotRun::Connection(_)))
        ));
        let bug = RedisError::from((ErrorKind::Parse, "bad"));
        assert!(matches!(
            to_backend_error(classify(&bug), &bug),
            BackendError::Internal(Fault::Redis(_))
        ));
    }

    #[test]
    fn a_store_error_says_each_cause_once() {
        let refused = RedisError::from(std::io::Error::from(Io::ConnectionRefused));
        let error = to_backend_error(classify(&refused), &refused);
        assert_eq!(error.to_string(), "state store unavailable", "its own part");
        let text = crate::log::Causes(&error).to_string();
        assert_eq!(text, "state store unavailable: redis: connection refused");
        // A printer that leaves no repeat out (anyhow's `{:#}`) says each
        // cause once too.
        let mut chain = vec![error.to_string()];
        let mut cause = std::error::Error::source(&error);
        while let Some(e) = cause {
            chain.push(e.to_string());
            cause = e.source();
        }
        assert_eq!(chain.join(": "), text);
    }

    #[test]
    fn a_refused_connection_is_an_outage_that_replaces_the_connection() {
        let refused = RedisError::from(std::io::Error::from(Io::ConnectionRefused));
        assert_eq!(classify(&refused), Class::Outage { replace: true });
    }
}
