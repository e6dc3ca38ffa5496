//! Every setting, declared once.
//!
//! Each `section!` below declares one TOML table. A setting's one line gives
//! its name, type, kind and default (as TOML), its documentation (which is
//! also the help of its flag) and whether it reloads; from it come the
//! field of the section's struct, the command-line flag (`--` + the
//! section's flag prefix + the name, `_` as `-`), the environment variable
//! (`QUOTAD_` + the flag in upper snake case), the default that fills a file
//! that leaves it out, and whether a changed value waits for a restart.
//!
//! Named policies (`[policies.NAME]`) are not settings: they are data, they
//! always reload, and they have no flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytesize::ByteSize;
use quotad_core::OnFull;
use serde::Deserialize;

use super::{ListenAddr, OnError, human_duration};

/// How a flag's text becomes a TOML value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A string: text, an address, a path, a duration (`"1m"`), a name.
    Str,
    /// An integer.
    Int,
    /// `true` or `false`.
    Bool,
    /// A list of strings; the flag takes them comma-separated.
    List,
    /// A table of settings of its own (`[server.tls]`); no flag.
    Table,
}

/// Whether a changed value takes effect on reload or only on a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reload {
    /// Applied by a reload, with the policies.
    Live,
    /// Logged as needing a restart when it changes.
    Restart,
}

/// One declared setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Setting {
    /// Its path in the file, such as `store.max_keys`.
    pub(crate) path: &'static str,
    /// The flag's name with `_` for `-`, such as `redis_timeout`.
    flag: &'static str,
    /// Its documentation, line by line; the first paragraph is the flag's
    /// help.
    doc: &'static [&'static str],
    pub(crate) kind: Kind,
    /// The default as TOML value text (`"1m"` for a string, `64` for an
    /// integer); `None` when leaving it out means something (no TLS, one
    /// worker per core).
    pub(crate) default: Option<&'static str>,
    pub(crate) reload: Reload,
}

impl Setting {
    /// The first paragraph of its documentation, on one line.
    pub(crate) fn help(&self) -> String {
        self.doc
            .iter()
            .map(|line| line.trim())
            .take_while(|line| !line.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The command-line flag, without `--`.
    pub(crate) fn flag(&self) -> String {
        self.flag.replace('_', "-")
    }

    /// The environment variable.
    pub(crate) fn env(&self) -> String {
        format!("QUOTAD_{}", self.flag.to_ascii_uppercase())
    }

    /// Its path, split into table keys.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &'static str> {
        self.path.split('.')
    }
}

/// Declares a section struct and its settings. Each field:
/// `/// doc` `name: Type = Kind(default) | Kind, Live | Restart;`
/// with optional `#[serde(...)]` attributes passed through, and an optional
/// `, flag "name"` before the `;` for a flag other than prefix + name.
macro_rules! section {
    (
        $(#[doc = $sdoc:literal])*
        $vis:vis struct $name:ident at $path:literal, flags $prefix:literal {
            $(
                #[doc = $doc:literal]
                $(#[doc = $more:literal])*
                $(#[serde($($serde:tt)*)])*
                $field:ident: $ty:ty = $kind:ident $(($default:literal))?, $reload:ident
                $(, flag $flag:literal)?;
            )*
        }
    ) => {
        $(#[doc = $sdoc])*
        #[derive(Clone, Debug, PartialEq, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[non_exhaustive]
        $vis struct $name {
            $(
                #[doc = concat!("`", $path, ".", stringify!($field), "`: ", $doc, ".")]
                $(#[doc = $more])*
                $(#[serde($($serde)*)])*
                $vis $field: $ty,
            )*
        }

        impl $name {
            /// The settings of this section, in declaration order.
            pub(crate) const SETTINGS: &'static [Setting] = &[$(
                Setting {
                    path: concat!($path, ".", stringify!($field)),
                    flag: section!(@flag $prefix, $field $(, $flag)?),
                    doc: &[$doc $(, $more)*],
                    kind: Kind::$kind,
                    default: section!(@default $($default)?),
                    reload: Reload::$reload,
                },
            )*];
        }
    };
    (@flag $prefix:literal, $field:ident) => { concat!($prefix, stringify!($field)) };
    (@flag $prefix:literal, $field:ident, $flag:literal) => { $flag };
    (@default) => { None };
    (@default $default:literal) => { Some($default) };
}

section! {
    /// `[server]` as written: listeners, the config file poll and the
    /// runtime.
    pub(crate) struct ServerSection at "server", flags "" {
        /// gRPC listen address: host:port, or unix:///path/to.sock for a unix
        /// socket
        grpc_addr: ListenAddr = Str("127.0.0.1:50051"), Restart;
        /// Admin HTTP listen address (/metrics, /healthz, /readyz, /policies)
        admin_addr: SocketAddr = Str("127.0.0.1:9464"), Restart;
        /// How often the config file is re-read for policy changes; 0s disables
        /// (SIGHUP still reloads)
        #[serde(deserialize_with = "human_duration")]
        config_poll_interval: Duration = Str("1s"), Restart;
        /// File mode of the gRPC unix socket (grpc_addr = unix:...), in octal
        ///
        /// Connecting needs write permission: 0660 admits the socket's owner
        /// and group, 0600 the owner only.
        unix_socket_mode: String = Str("0660"), Restart;
        /// How long quotad keeps serving after SIGTERM while reporting not
        /// ready, before it drains
        ///
        /// Readiness (`/readyz`, gRPC health) turns NOT_SERVING at once, so
        /// load balancers stop sending new calls before connections close.
        #[serde(deserialize_with = "human_duration")]
        shutdown_delay: Duration = Str("0s"), Restart;
        /// Whether readiness also requires the state store to answer a probe
        ///
        /// Off by default: a fail-open deployment wants traffic while Redis is
        /// down, and an outage would otherwise take every replica out of
        /// service at once.
        readiness_follows_store: bool = Bool("false"), Restart;
        /// Async runtime worker threads [default: one per core]
        ///
        /// A sidecar, or a box shared with its clients, wants fewer.
        worker_threads: Option<usize> = Int, Restart;
        /// TLS for the gRPC port (`[server.tls]`); plaintext when absent
        tls: Option<TlsSection> = Table, Restart;
    }
}

section! {
    /// `[server.tls]` as written: the certificate files of the gRPC port.
    pub(crate) struct TlsSection at "server.tls", flags "tls_" {
        /// PEM certificate chain for TLS on the gRPC port
        cert: Option<PathBuf> = Str, Restart;
        /// PEM private key for TLS on the gRPC port
        key: Option<PathBuf> = Str, Restart;
        /// PEM CA certificates that client certificates must chain to (mTLS)
        client_ca: Option<PathBuf> = Str, Restart;
    }
}

section! {
    /// `[transport]` as written: the bounds every connection to either port
    /// lives within.
    pub(crate) struct TransportSection at "transport", flags "" {
        /// Most calls in progress at once on one gRPC connection (HTTP/2
        /// streams; the client queues the rest)
        max_concurrent_streams: u32 = Int("200"), Restart;
        /// Most streams a gRPC client may open and reset before quotad has
        /// accepted them; past it the connection is closed (HTTP/2 reset
        /// flood)
        max_pending_reset_streams: usize = Int("20"), Restart;
        /// Most open connections on the gRPC port (and on the admin port, up
        /// to 1,024 there); a connection past it is closed at once
        max_connections: usize = Int("10000"), Restart;
        /// Longest time a gRPC call may run; past it the call ends with
        /// CANCELLED
        #[serde(deserialize_with = "human_duration")]
        request_timeout: Duration = Str("5s"), Restart;
        /// Largest gRPC request message, in bytes [default: a full CheckBatch
        /// at store.max_key_bytes]
        ///
        /// Larger messages are refused with RESOURCE_EXHAUSTED before they are
        /// read. The default is computed: 1,000 items, each with a key of
        /// `store.max_key_bytes`, the longest policy name and the largest
        /// cost.
        max_message_bytes: Option<usize> = Int, Restart;
        /// Longest time an admin HTTP client may take to send a request's
        /// headers; past it the connection is closed
        #[serde(deserialize_with = "human_duration")]
        admin_header_timeout: Duration = Str("5s"), Restart;
        /// Longest time a new connection may stay silent before its first
        /// byte (a TLS hello or the HTTP/2 preface); past it it is closed
        ///
        /// A connection holds one of `max_connections` from the moment it is
        /// accepted: without this, sockets that never speak could hold them all.
        #[serde(deserialize_with = "human_duration")]
        handshake_timeout: Duration = Str("5s"), Restart;
        /// Age after which a gRPC connection is asked to go away (clients
        /// reconnect); 0s never
        ///
        /// Bounds how long any one client can hold a connection, and spreads
        /// clients over replicas that joined later.
        #[serde(deserialize_with = "human_duration")]
        max_connection_age: Duration = Str("30m"), Restart;
        /// Longest time a shutdown waits for calls in flight (and the admin
        /// port's requests) to finish; past it the connections are closed
        ///
        /// Streams such as gRPC health's Watch never finish by themselves;
        /// termination grace periods must cover shutdown_delay + drain_timeout
        /// + the snapshot write.
        #[serde(deserialize_with = "human_duration")]
        drain_timeout: Duration = Str("10s"), Restart;
        /// Most gRPC calls in progress at once on the whole server; a call
        /// past it is refused at once with UNAVAILABLE; 0: no bound
        ///
        /// Bounds the calls a slow store holds (each waits up to
        /// store.redis.timeout): past it they fail fast to their client's
        /// failure policy instead of piling up. Size it above the peak rate
        /// times store.redis.timeout (1024: 10,240 calls/s at 100 ms), or a
        /// stall sheds calls that on_error would have answered. It does not
        /// bound queueing when quotad's CPU is the limit: those calls wait
        /// before they reach it (measured, BENCHMARKS.md). gRPC health and
        /// reflection are never refused.
        max_in_flight: usize = Int("1024"), Restart;
    }
}

section! {
    /// `[auth]` as written: who may call each gRPC method, by the identity
    /// in the client's certificate (mTLS). A method left out is open to
    /// every client that passed mTLS.
    pub(crate) struct AuthSection at "auth", flags "auth_" {
        /// Client identities that may call Check, CheckBatch and Lease
        /// [default: every client that passed mTLS]
        ///
        /// An identity is a URI or DNS name in the certificate's subject
        /// alternative names, or its common name when it has neither; a
        /// pattern matches exactly, or by prefix when it ends in `*`.
        check: Option<Vec<String>> = List, Restart;
        /// Client identities that may call Peek [default: every client that
        /// passed mTLS]
        peek: Option<Vec<String>> = List, Restart;
        /// Client identities that may call Reset [default: every client that
        /// passed mTLS]
        reset: Option<Vec<String>> = List, Restart;
        /// Client identities that may set, remove and list overrides
        /// [default: every client that passed mTLS]
        overrides: Option<Vec<String>> = List, Restart;
        /// Client identities that may call Envoy's ShouldRateLimit
        /// [default: every client that passed mTLS]
        should_rate_limit: Option<Vec<String>> = List, Restart;
        /// Client identities that may call Envoy's StreamRateLimitQuotas
        /// (RLQS) [default: every client that passed mTLS]
        rate_limit_quotas: Option<Vec<String>> = List, Restart;
    }
}

impl Default for AuthSection {
    /// No allowlist: every client that passed mTLS may call every method.
    fn default() -> Self {
        AuthSection {
            check: None,
            peek: None,
            reset: None,
            overrides: None,
            should_rate_limit: None,
            rate_limit_quotas: None,
        }
    }
}

section! {
    /// `[log]`: what the server logs, and how. Every value is checked when
    /// the configuration loads.
    pub(crate) struct LogSection at "log", flags "log_" {
        /// Log line format on stderr: text or json (one JSON object a line)
        format: LogFormat = Str("text"), Restart;
        /// Log filter: a level (error, warn, info, debug, trace) or
        /// tracing-subscriber directives such as "info,quotad=debug"
        level: String = Str("info"), Restart;
    }
}

/// `log.format`: how log lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line, for log collectors.
    Json,
}

section! {
    /// `[store]` as written: the state backend and its bounds.
    pub(crate) struct StoreSection at "store", flags "" {
        /// The state backend: memory or redis
        backend: BackendKind = Str("memory"), Restart;
        /// Most keys held by the memory store
        max_keys: usize = Int("1000000"), Restart;
        /// Most bytes the memory store's state may take (e.g. "512MiB")
        ///
        /// Counts what each key really costs: its table slot, a key longer
        /// than the inline 24 bytes, and a sliding log's entries; `on_full`
        /// applies when either bound is reached.
        max_bytes: ByteSize = Str("512MiB"), Restart;
        /// Memory store lock shards, a power of two
        shards: usize = Int("64"), Restart;
        /// What the memory store does with new keys when full: deny or evict
        on_full: OnFull = Str("deny"), Restart;
        /// Longest accepted key, in bytes
        max_key_bytes: usize = Int("256"), Restart;
        /// Time for the background sweep to visit every memory store shard
        #[serde(deserialize_with = "human_duration")]
        sweep_interval: Duration = Str("10s"), Restart;
        /// What checks answer when the store fails, unless their policy says:
        /// error, fail_open, fail_closed or local
        ///
        /// local: each replica decides alone from its own memory, with the
        /// limit divided by store.fallback.replicas (docs/redis.md).
        on_error: OnError = Str("error"), Restart;
        /// Redis, for backend redis (`[store.redis]`)
        redis: Option<RedisSection> = Table, Restart;
        /// Snapshots of the memory store (`[store.snapshot]`); none when absent
        snapshot: Option<SnapshotSection> = Table, Restart;
        /// The local fallback of on_error = "local" (`[store.fallback]`)
        fallback: Option<FallbackSection> = Table, Restart;
    }
}

section! {
    /// `[store.fallback]` as written: how replicas decide alone while
    /// Redis is down, for policies with `on_error = "local"`.
    pub(crate) struct FallbackSection at "store.fallback", flags "fallback_" {
        /// How many quotad replicas share the Redis: during an outage each decides with limit / replicas
        ///
        /// Required when a policy (or store.on_error) says local on the
        /// Redis backend. Count every replica that can take traffic at once
        /// (in Kubernetes, the HPA's maximum): a count too low lets the
        /// fleet admit more than the limit during an outage, one too high
        /// only admits less. A limit below the count gives a share of 0:
        /// every local decision denies.
        replicas: Option<u32> = Int, Restart;
        /// Most keys the local fallback holds during an outage; new keys are then denied
        ///
        /// Kept when Redis answers again, each key swept once its state is
        /// fresh (a store that flaps within a window finds the share already
        /// spent). 100,000 keys are about 10 MB (sliding logs more).
        max_keys: usize = Int("100000"), Restart;
    }
}

section! {
    /// `[store.snapshot]` as written: where the memory store keeps its state
    /// across restarts.
    pub(crate) struct SnapshotSection at "store.snapshot", flags "snapshot_" {
        /// File the memory store is written to on shutdown and loaded from on start
        path: Option<PathBuf> = Str, Restart;
        /// How often the memory store is also written while serving; 0s: only on shutdown
        ///
        /// A crash or an OOM kill loses at most this much counting. Writing
        /// 1M keys takes about 0.1 s (0.4 s for sliding logs) and 35 MB
        /// (BENCHMARKS.md), so every 30 s costs under 1.5% of one core.
        #[serde(deserialize_with = "human_duration")]
        interval: Duration = Str("30s"), Restart;
        /// What a snapshot that cannot be read does at start: start_empty or refuse
        on_bad_file: OnBadSnapshot = Str("start_empty"), Restart;
    }
}

/// `limits.allow_reset`: who may call Reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetAccess {
    /// Callers on this machine (loopback, the unix socket) and clients
    /// with a verified mTLS certificate.
    Local,
    /// Every caller that reaches the port (and passes `[auth]`).
    Anyone,
    /// No caller: Reset answers PERMISSION_DENIED.
    Nobody,
}

impl ResetAccess {
    /// As written in the config.
    pub fn name(self) -> &'static str {
        match self {
            ResetAccess::Local => "local",
            ResetAccess::Anyone => "anyone",
            ResetAccess::Nobody => "nobody",
        }
    }
}

impl<'de> Deserialize<'de> for ResetAccess {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Access;
        impl serde::de::Visitor<'_> for Access {
            type Value = ResetAccess;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("\"local\", \"anyone\" or \"nobody\"")
            }
            fn visit_bool<E: serde::de::Error>(self, open: bool) -> Result<ResetAccess, E> {
                Ok(if open {
                    ResetAccess::Anyone
                } else {
                    ResetAccess::Nobody
                })
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<ResetAccess, E> {
                match text {
                    "local" => Ok(ResetAccess::Local),
                    "anyone" | "true" => Ok(ResetAccess::Anyone),
                    "nobody" | "false" => Ok(ResetAccess::Nobody),
                    other => Err(E::invalid_value(serde::de::Unexpected::Str(other), &self)),
                }
            }
        }
        deserializer.deserialize_any(Access)
    }
}

/// `store.snapshot.on_bad_file`: what a snapshot that cannot be read (truncated,
/// corrupt, of another version, unreadable) does at start. A missing file
/// is no snapshot yet, not a bad one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBadSnapshot {
    /// Start with an empty store, logging an error and counting it in
    /// `quotad_snapshot_load_failures_total`: every key starts fresh, as
    /// without snapshots, and the next snapshot replaces the bad file.
    StartEmpty,
    /// Refuse to start (exit code 2), naming the file and the problem.
    Refuse,
}

section! {
    /// `[store.redis]` as written: where Redis is.
    pub(crate) struct RedisSection at "store.redis", flags "redis_" {
        /// Redis URL for backend redis, e.g. redis://127.0.0.1:6379/0
        url: Option<String> = Str, Restart;
        /// Redis Cluster seed nodes for backend redis, comma-separated URLs
        cluster_nodes: Option<Vec<String>> = List, Restart;
        /// Redis Sentinel addresses, comma-separated URLs: the master is the one they name
        ///
        /// With them, `url` names the master set by its host and carries the
        /// master's password and database (`redis://:secret@mymaster/0`);
        /// a user and password in these URLs authenticate to the sentinels.
        /// rediss:// URLs use TLS (store.redis.tls_* apply to both).
        sentinel_nodes: Option<Vec<String>> = List, Restart;
        /// Longest time one Redis call may take
        #[serde(deserialize_with = "human_duration")]
        timeout: Duration = Str("100ms"), Restart;
        /// Timeouts with requests waiting and no reply after which a Redis connection (standalone, or a Cluster primary's) is replaced
        reconnect_after_timeouts: u32 = Int("3"), Restart;
        /// The first part of every key quotad writes in Redis
        key_prefix: String = Str("quotad"), Restart;
        /// Whether quotad refuses to start (exit 1) when Redis cannot be reached
        ///
        /// false: quotad starts and serves, each check answering its
        /// policy's on_error, reports not ready while
        /// server.readiness_follows_store is on, and connects in the
        /// background, the way Kubernetes and Compose start services
        /// together.
        required_at_start: bool = Bool("false"), Restart;
        /// Most items an ALL_OR_NOTHING batch may hold on Redis, a sliding log or a slot acquire counting as 4; larger ones are refused
        ///
        /// Such a batch is one atomic script, and Redis serves no other
        /// client while it runs: 64 units took up to 2.7 ms of Redis time
        /// in the worst cases measured (BENCHMARKS.md). Independent
        /// batches are split into scripts of 64 units instead, whatever
        /// their size.
        max_atomic_items: u32 = Int("64"), Restart;
        /// How often each replica reads the runtime overrides other replicas wrote to Redis
        ///
        /// A change made through one replica is in force on every other
        /// within about this (plus one call); a replica that cannot read
        /// them keeps the last set it read and reports
        /// quotad_overrides_in_sync 0.
        #[serde(deserialize_with = "human_duration")]
        overrides_poll_interval: Duration = Str("1s"), Restart;
        /// PEM CA certificates a rediss:// server must chain to [default: the system's roots]
        tls_ca: Option<PathBuf> = Str, Restart;
        /// PEM client certificate chain for rediss://, for a Redis that requires one
        tls_cert: Option<PathBuf> = Str, Restart;
        /// PEM private key of tls_cert
        tls_key: Option<PathBuf> = Str, Restart;
    }
}

section! {
    /// `[limits]`: what requests may ask for. Every value is valid as
    /// written.
    pub struct LimitSettings at "limits", flags "" {
        /// Whether requests may carry their own policy instead of naming a
        /// configured one (an inline policy, or the limit Envoy sends on a
        /// descriptor)
        allow_inline_policies: bool = Bool("true"), Live;
        /// Who may call the Reset RPC: local (callers on this machine, over
        /// loopback or the unix socket, and clients with a verified mTLS
        /// certificate), anyone, or nobody
        ///
        /// Reset erases a key's budget. By default a caller quotad cannot
        /// identify (plaintext, from another host) is refused with
        /// PERMISSION_DENIED; `[auth] reset` narrows it to certain
        /// identities. `true` and `false`, from older configs, mean anyone
        /// and nobody.
        allow_reset: ResetAccess = Str("local"), Live;
        /// Who may change overrides (quotad.v1.Overrides SetOverride and
        /// RemoveOverride; ListOverrides too): local, anyone or nobody, as
        /// allow_reset
        ///
        /// An override changes what every replica admits for a key, so a
        /// caller quotad cannot identify is refused by default; `[auth]
        /// overrides` narrows it to certain identities.
        allow_overrides: ResetAccess = Str("local"), Live;
        /// Most overrides one policy may have (file and runtime together)
        ///
        /// A key's prefix override is found by one walk down a trie of the
        /// policy's prefixes (at most the key's length in steps), so this
        /// bounds the memory the overrides hold and the work each change
        /// and each read of the store's set does.
        max_overrides: u64 = Int("10000"), Live;
        /// Longest window an inline policy (or a limit Envoy sends) may ask for
        ///
        /// A key's state lives about one window after its last use, so this
        /// bounds how long a caller can make quotad hold state.
        #[serde(deserialize_with = "human_duration")]
        max_inline_window: Duration = Str("1d"), Live;
        /// Largest limit (and burst) an inline policy (or a limit Envoy sends) may ask for
        max_inline_limit: u64 = Int("1000000"), Live;
        /// Largest limit an inline sliding_log policy may ask for
        ///
        /// A sliding log keeps up to `limit` entries of 16 bytes per key, so
        /// this bounds the memory one key of a caller's choosing can take.
        max_inline_log_limit: u64 = Int("100"), Live;
        /// Most units one lease of an inline policy may get (its
        /// inline_terms.max_units); 0 refuses every inline lease
        ///
        /// A holder that crashes strands its lease's units until the lease
        /// ends: with `lease_max_ttl`, this bounds what one caller of its own
        /// choosing can hold back from a key.
        lease_max_units: u64 = Int("1000"), Live;
        /// Longest lease an inline policy may ask for (its
        /// inline_terms.max_ttl_ms)
        #[serde(deserialize_with = "human_duration")]
        lease_max_ttl: Duration = Str("10s"), Live;
    }
}

section! {
    /// `[rls]` as written: Envoy's rate limit service (RLS v3) on the gRPC
    /// port, and the envoyproxy/ratelimit YAML rules it answers by.
    pub(crate) struct RlsSection at "rls", flags "rls_" {
        /// Folder of envoyproxy/ratelimit YAML rule files (*.yaml, *.yml), or
        /// one file; without it every RLS descriptor answers OK
        ///
        /// The files reload when they change (polled every
        /// server.config_poll_interval) and on SIGHUP.
        config_dir: Option<PathBuf> = Str, Restart, flag "rls_config";
        /// Whether files naming the same domain are merged (the reference's
        /// MERGE_DOMAIN_CONFIG); otherwise a domain in two files is an error
        merge_domains: bool = Bool("false"), Restart;
        /// How the descriptors of one request count: all_or_nothing (when one
        /// is over its limit, none is counted) or reference (each counted on
        /// its own, denied hits included)
        count_mode: CountMode = Str("all_or_nothing"), Restart;
        /// Rate-limit headers added to responses, comma-separated: reference
        /// (limit_header, remaining_header, reset_header), draft (IETF
        /// RateLimit and RateLimit-Policy); none when absent
        response_headers: Option<Vec<HeaderStyle>> = List, Restart;
        /// The reference's limit header (LIMIT_LIMIT_HEADER)
        limit_header: String = Str("RateLimit-Limit"), Restart;
        /// The reference's remaining header (LIMIT_REMAINING_HEADER)
        remaining_header: String = Str("RateLimit-Remaining"), Restart;
        /// The reference's reset header, in seconds (LIMIT_RESET_HEADER)
        reset_header: String = Str("RateLimit-Reset"), Restart;
        /// Answer OK whatever the limits say, still counting (the reference's
        /// SHADOW_MODE); denials it lets through are counted in metrics
        shadow_mode: bool = Bool("false"), Restart;
        /// Treat every rule as quota_mode: over the limit only when every
        /// descriptor of the request is (the reference's QUOTA_MODE)
        quota_mode: bool = Bool("false"), Restart;
    }
}

section! {
    /// `[rlqs]` as written: Envoy's rate limit quota service (RLQS) on the
    /// gRPC port, and the TOML bucket rules it assigns quota by.
    pub(crate) struct RlqsSection at "rlqs", flags "rlqs_" {
        /// TOML file of RLQS bucket rules (domain and BucketId pairs to a
        /// named policy and key); without it every RLQS bucket is denied
        ///
        /// The file reloads when it changes (polled every
        /// server.config_poll_interval) and on SIGHUP; docs/rlqs.md has the
        /// format.
        rules: Option<PathBuf> = Str, Restart;
    }
}

impl Default for RlqsSection {
    /// No bucket rules: every RLQS bucket is denied.
    fn default() -> Self {
        RlqsSection { rules: None }
    }
}

/// `rls.count_mode`: how the descriptors of one `ShouldRateLimit` count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CountMode {
    /// When any enforced descriptor is over its limit, no descriptor of
    /// the request is counted; denied hits are never counted.
    #[default]
    AllOrNothing,
    /// envoyproxy/ratelimit's counting: each descriptor on its own, and a
    /// denied hit spends what is left of the budget.
    Reference,
}

/// A kind of rate-limit response headers (`rls.response_headers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HeaderStyle {
    /// The reference's `RateLimit-Limit`, `-Remaining` and `-Reset`.
    Reference,
    /// The IETF draft's `RateLimit` and `RateLimit-Policy` fields.
    Draft,
}

/// `store.backend`: where state lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BackendKind {
    /// The embedded sharded store.
    Memory,
    /// Redis, standalone or Cluster (`[store.redis]`).
    Redis,
}

/// Every declared setting; tables of settings are listed too (kind
/// [`Kind::Table`]), with their members after them.
pub(crate) fn all() -> impl Iterator<Item = &'static Setting> {
    [
        ServerSection::SETTINGS,
        TlsSection::SETTINGS,
        TransportSection::SETTINGS,
        AuthSection::SETTINGS,
        LogSection::SETTINGS,
        StoreSection::SETTINGS,
        RedisSection::SETTINGS,
        SnapshotSection::SETTINGS,
        FallbackSection::SETTINGS,
        LimitSettings::SETTINGS,
        RlsSection::SETTINGS,
        RlqsSection::SETTINGS,
    ]
    .into_iter()
    .flatten()
}

/// The setting at `path`, if one is declared.
pub(crate) fn find(path: &str) -> Option<&'static Setting> {
    all().find(|s| s.path == path)
}
