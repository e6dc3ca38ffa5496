//! Why a store call failed, typed by what it means for the count.
//!
//! A failed call is one of three things, and the type says which:
//! - it **certainly did not run** ([`NotRun`]): never sent, or refused
//!   before it counted anything (not connected, connection refused, the
//!   connection being made again, the breaker open, the deadline passed
//!   before sending, a script Redis refused past its deadline, an error
//!   code Redis answered instead of running it);
//! - it **may have run** ([`MayHaveRun`]): sent, then no reply in time or
//!   the connection broke; the store may have counted it;
//! - it hit a **bug** ([`Fault`]): corrupt state or a reply of the wrong
//!   shape.
//!
//! The first two are [`Outage`]s, answered by the policy's `on_error`
//! alike; the local fallback tells them apart ([`super::fallback`]).
//!
//! Each error's text is its own part only, its cause its `source()`: a
//! chain printer ([`crate::log::Causes`], `anyhow`'s `{:#}`) says each cause
//! once.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use redis::RedisError;
use thiserror::Error;

/// A source error shared by every copy of the error it caused (a batch's
/// failure is cloned into each of its items). Two are equal when they are
/// one error or say the same.
#[derive(Debug)]
pub struct Shared<E>(Arc<E>);

impl<E> Shared<E> {
    /// `error`, shared.
    pub fn new(error: E) -> Self {
        Shared(Arc::new(error))
    }

    /// The error itself.
    pub fn get(&self) -> &E {
        &self.0
    }
}

impl<E> Clone for Shared<E> {
    fn clone(&self) -> Self {
        Shared(Arc::clone(&self.0))
    }
}

impl<E: fmt::Display> fmt::Display for Shared<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<E: std::error::Error> std::error::Error for Shared<E> {
    /// The error's source, left out when the error's text already ends
    /// with it (the Redis library prints an I/O error and keeps it as its
    /// source too): a chain then says it once.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let source = self.0.source()?;
        if self.0.to_string().ends_with(&source.to_string()) {
            source.source()
        } else {
            Some(source)
        }
    }
}

impl<E: fmt::Display> PartialEq for Shared<E> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl<E: fmt::Display> Eq for Shared<E> {}

/// How long a call waited before quotad gave up on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waited {
    /// The wait.
    pub after: Duration,
    /// Whether it ended at the caller's deadline (not the store's own
    /// timeout).
    pub callers: bool,
}

impl fmt::Display for Waited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.callers {
            write!(
                f,
                "redis did not answer within the caller's deadline ({:?})",
                self.after
            )
        } else {
            write!(f, "redis did not answer within {:?}", self.after)
        }
    }
}

/// The store could not be reached, or did not answer in time: the
/// policy's `on_error` decides what the call answers.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Outage {
    /// Nothing was counted, nor will be.
    #[error(transparent)]
    NotRun(#[from] NotRun),
    /// The call was sent and its answer lost: the store may have counted
    /// it.
    #[error(transparent)]
    MayHaveRun(#[from] MayHaveRun),
}

impl Outage {
    /// Whether the store may have counted the call.
    pub fn may_have_run(&self) -> bool {
        matches!(self, Outage::MayHaveRun(_))
    }

    /// Whether the outage says the store is down or stalled, not only that
    /// this one call could not be decided: the caller's own deadline ran
    /// out (a 2 ms `grpc-timeout` does it against a healthy store), a
    /// script reached Redis past its deadline, or Redis refused this call
    /// alone (its clock outside a calendar item's periods, an ACL on the
    /// key) say nothing about the next call. The local fallback's breaker
    /// opens only on these.
    pub fn store_down(&self) -> bool {
        match self {
            Outage::NotRun(NotRun::NotSent(waited))
            | Outage::MayHaveRun(MayHaveRun::NoReply(waited)) => !waited.callers,
            Outage::NotRun(NotRun::RefusedLate(_)) => false,
            Outage::NotRun(NotRun::Answered(error)) => {
                !matches!(error.get().code(), Some("QUOTAD_CLOCK" | "NOPERM"))
            }
            _ => true,
        }
    }
}

/// Why a call certainly did not run.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum NotRun {
    /// No connection has been made since start.
    #[error("redis: not connected yet")]
    NotConnected,
    /// The connection is being made again (the last one broke or went
    /// silent).
    #[error("redis: reconnecting")]
    Reconnecting,
    /// No connection: making one failed, or it failed before the call was
    /// sent (refused, reset, a TLS or credentials failure, no sentinel
    /// naming a primary).
    #[error("redis")]
    Connection(#[source] Shared<RedisError>),
    /// The client for the configured target could not be made (a URL or
    /// certificate it cannot use); the text has passwords redacted, so the
    /// library's error is not kept as a source.
    #[error("redis: {0}")]
    Client(String),
    /// A connection attempt did not finish within its bound.
    #[error("redis did not answer within {0:?}")]
    ConnectTimedOut(Duration),
    /// The call's deadline passed before it was sent (waiting for a
    /// connection, or for the server's clock).
    #[error("{0}")]
    NotSent(Waited),
    /// Redis answered an error instead of running the call (out of memory,
    /// a replica, loading, credentials refused, ...).
    #[error("redis")]
    Answered(#[source] Shared<RedisError>),
    /// The script reached Redis past its deadline (in Redis's clock) and
    /// refused to run: `what` names it.
    #[error("redis ran the {0} past its deadline and refused it")]
    RefusedLate(&'static str),
    /// The Cluster primary of the call's slot cannot be reached; one call
    /// tries it again every `every`.
    #[error("redis cluster: no connection to the primary {node}; tried again every {every:?}")]
    Unreachable {
        /// The primary's `host:port`.
        node: String,
        /// How often a call tries it.
        every: Duration,
    },
    /// The Cluster's slot map names no primary that answers.
    #[error("redis cluster: no primary in the slot map")]
    NoPrimary,
    /// The local fallback's breaker is open: no call goes to the store
    /// until a probe answers.
    #[error("the store's breaker is open: no call is sent until a probe answers")]
    BreakerOpen,
    /// A TLS file of `store.redis.*` could not be read.
    #[error("store.redis.{field}: cannot read {}", path.display())]
    TlsFile {
        /// The setting, e.g. `tls_ca`.
        field: &'static str,
        /// Its path.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: Shared<std::io::Error>,
    },
    /// `store.redis.url` names no master set the sentinels could know.
    #[error("store.redis.url: with sentinel_nodes, its host names the master set, not {0}")]
    SentinelUrl(String),
}

/// Why a call may have run.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum MayHaveRun {
    /// Sent, and no reply in time.
    #[error("{0}")]
    NoReply(Waited),
    /// Sent, and the connection broke (or the client library gave up on
    /// it) before the reply.
    #[error("redis")]
    Broken(#[source] Shared<RedisError>),
}

/// The store answered something quotad cannot use: a bug or corrupt
/// state, never an outage.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Fault {
    /// A key holds state the script cannot read (named by policy and a
    /// hash of its key, never the key).
    #[error("{0}")]
    Corrupt(String),
    /// A reply of the wrong shape, described.
    #[error("{0}")]
    Reply(String),
    /// An error from Redis that no outage explains (a script error).
    #[error("redis")]
    Redis(#[source] Shared<RedisError>),
    /// A broken invariant of quotad's own, described (a task that ended
    /// without an answer, a state the store cannot hold).
    #[error("{0}")]
    Bug(String),
}

impl From<String> for Fault {
    fn from(message: String) -> Self {
        Fault::Bug(message)
    }
}

impl From<&str> for Fault {
    fn from(message: &str) -> Self {
        Fault::Bug(message.to_owned())
    }
}
