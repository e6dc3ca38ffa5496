//! The Redis settings of `[store.redis]` as the backend takes them: where
//! Redis is, how long a call may take, and the files TLS needs.

use std::path::PathBuf;
use std::time::Duration;

/// The most units an all-or-nothing batch holds by default, and a script
/// at most (`store.redis.max_atomic_items`).
pub const DEFAULT_MAX_ATOMIC_ITEMS: usize = 64;

/// Timeouts of silence (requests waiting, no reply) after which a
/// connection is replaced, unless `store.redis.reconnect_after_timeouts`
/// says.
pub const DEFAULT_RECONNECT_AFTER_TIMEOUTS: u32 = 3;

/// Where Redis is and how long a call may take. (`Debug` shows no
/// password: [`RedisTarget`]'s hides it.)
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisSettings {
    /// A standalone server (`redis://host:port/db`), or the seed nodes of a
    /// Cluster.
    pub target: RedisTarget,
    /// The longest one call may take, reconnecting included; past it the
    /// policy's `on_error` applies.
    pub timeout: Duration,
    /// How many timeouts requests may wait on a connection with no reply
    /// before it is dropped and made again (a standalone server's; a
    /// Cluster makes its whole connection again for a silent primary). The
    /// connection's `TCP_USER_TIMEOUT` is that silence, at least 2 s.
    pub reconnect_after_timeouts: u32,
    /// `store.redis.required_at_start`: refuse to start without Redis
    /// rather than connect in the background.
    pub required_at_start: bool,
    /// The first part of every key quotad writes.
    pub key_prefix: String,
    /// The most items of an all-or-nothing batch, one script, a sliding log
    /// or a slot acquire counting as 4; larger batches are refused
    /// (`BackendError::TooManyAtomicItems`).
    pub max_atomic_items: usize,
    /// Certificate files for `rediss://` URLs.
    pub tls: RedisTls,
    /// `store.redis.overrides_poll_interval`: how often the runtime
    /// overrides are read back.
    pub overrides_poll_interval: Duration,
}

impl RedisSettings {
    /// Settings for `target` with a call timeout and the defaults for the
    /// rest.
    pub fn new(target: RedisTarget, timeout: Duration) -> Self {
        RedisSettings {
            target,
            timeout,
            reconnect_after_timeouts: DEFAULT_RECONNECT_AFTER_TIMEOUTS,
            required_at_start: false,
            key_prefix: "quotad".to_owned(),
            max_atomic_items: DEFAULT_MAX_ATOMIC_ITEMS,
            tls: RedisTls::default(),
            overrides_poll_interval: Duration::from_secs(1),
        }
    }
}

/// A standalone Redis, a Redis Cluster, or a master found through Redis
/// Sentinel.
#[derive(Clone, PartialEq, Eq)]
pub enum RedisTarget {
    /// One server (or a proxy) at this URL.
    Standalone(String),
    /// A Cluster, found through these seed node URLs.
    Cluster(Vec<String>),
    /// A master found through Redis Sentinel: `master` is the URL whose
    /// host names the master set and which carries the master's
    /// credentials and database; `sentinels` are the sentinels' URLs.
    Sentinel {
        /// `store.redis.url`.
        master: String,
        /// `store.redis.sentinel_nodes`.
        sentinels: Vec<String>,
    },
}

/// Where Redis is, passwords left out: the URL, or the Cluster's seed
/// nodes.
impl std::fmt::Display for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Standalone(url) => f.write_str(&redact(url)),
            RedisTarget::Cluster(nodes) => {
                let nodes: Vec<String> = nodes.iter().map(|n| redact(n)).collect();
                write!(f, "the Redis Cluster of {}", nodes.join(", "))
            }
            RedisTarget::Sentinel { master, sentinels } => {
                let sentinels: Vec<String> = sentinels.iter().map(|n| redact(n)).collect();
                write!(
                    f,
                    "{} through the Redis Sentinels {}",
                    redact(master),
                    sentinels.join(", ")
                )
            }
        }
    }
}

impl std::fmt::Debug for RedisTarget {
    /// URLs with their passwords replaced by `***`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RedisTarget::Standalone(url) => {
                f.debug_tuple("Standalone").field(&redact(url)).finish()
            }
            RedisTarget::Cluster(nodes) => f
                .debug_tuple("Cluster")
                .field(&nodes.iter().map(|n| redact(n)).collect::<Vec<_>>())
                .finish(),
            RedisTarget::Sentinel { master, sentinels } => f
                .debug_struct("Sentinel")
                .field("master", &redact(master))
                .field(
                    "sentinels",
                    &sentinels.iter().map(|n| redact(n)).collect::<Vec<_>>(),
                )
                .finish(),
        }
    }
}

/// `text` with the password of every URL in it replaced by `***`
/// (`redis://user:secret@host` becomes `redis://user:***@host`).
///
/// Everything from `://` to the last `@` before the next URL or the end
/// of the line is the user information: a password may hold `#`, `/`, `?`,
/// `"`, `@` or spaces, written as they are (an invalid URL, then, whose
/// error must not show it either). Text without an `@` after `://` is kept.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = [tail.find("://"), tail.find('\n')]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(tail.len());
        let segment = &tail[..end];
        match segment.rfind('@') {
            Some(userinfo_end) => {
                let userinfo = &segment[..userinfo_end];
                match userinfo.find(':') {
                    // A user name has no ':' (and no '/', or it was a path).
                    Some(colon) if !userinfo[..colon].contains('/') => {
                        out.push_str(&userinfo[..colon]);
                        out.push_str(":***");
                    }
                    // `redis://secret@host`: a password alone.
                    _ if !userinfo.is_empty() => out.push_str("***"),
                    _ => {}
                }
                out.push_str(&segment[userinfo_end..]);
            }
            None => out.push_str(segment),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    redact_query(&out)
}

/// `text` with the values of `pass=` and `password=` query parameters
/// (`redis+unix:///run/redis.sock?pass=secret`) replaced by `***`.
fn redact_query(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(['?', '&']) {
        let (head, tail) = rest.split_at(at + 1);
        out.push_str(head);
        let key = ["pass=", "password="]
            .into_iter()
            .find(|k| tail.len() >= k.len() && tail[..k.len()].eq_ignore_ascii_case(k));
        match key {
            Some(key) => {
                out.push_str(&tail[..key.len()]);
                out.push_str("***");
                let value = &tail[key.len()..];
                let end = value
                    .find(|c: char| c == '&' || c == '"' || c.is_whitespace())
                    .unwrap_or(value.len());
                rest = &value[end..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

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
}
