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

use quotad_core::OnFull;
use serde::Deserialize;

use super::{OnError, human_duration};

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
        /// gRPC listen address
        grpc_addr: SocketAddr = Str("127.0.0.1:50051"), Restart;
        /// Admin HTTP listen address (/metrics, /healthz, /readyz, /policies)
        admin_addr: SocketAddr = Str("127.0.0.1:9464"), Restart;
        /// How often the config file is re-read for policy changes; 0s disables
        /// (SIGHUP still reloads)
        #[serde(deserialize_with = "human_duration")]
        config_poll_interval: Duration = Str("1s"), Restart;
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
    /// `[store]` as written: the state backend and its bounds.
    pub(crate) struct StoreSection at "store", flags "" {
        /// The state backend: memory or redis
        backend: BackendKind = Str("memory"), Restart;
        /// Most keys held by the memory store
        max_keys: usize = Int("1000000"), Restart;
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
        /// error, fail_open or fail_closed
        on_error: OnError = Str("error"), Restart;
        /// Redis, for backend redis (`[store.redis]`)
        redis: Option<RedisSection> = Table, Restart;
    }
}

section! {
    /// `[store.redis]` as written: where Redis is.
    pub(crate) struct RedisSection at "store.redis", flags "redis_" {
        /// Redis URL for backend redis, e.g. redis://127.0.0.1:6379/0
        url: Option<String> = Str, Restart;
        /// Redis Cluster seed nodes for backend redis, comma-separated URLs
        cluster_nodes: Option<Vec<String>> = List, Restart;
        /// Longest time one Redis call may take
        #[serde(deserialize_with = "human_duration")]
        timeout: Duration = Str("100ms"), Restart;
    }
}

section! {
    /// `[limits]`: what requests may ask for. Every value is valid as
    /// written.
    pub struct LimitSettings at "limits", flags "" {
        /// Whether requests may carry their own policy instead of naming a
        /// configured one
        allow_inline_policies: bool = Bool("true"), Live;
        /// Whether the Reset RPC is served
        ///
        /// Anyone who can call `Check` can call `Reset`; turn it off where
        /// clients are not trusted to leave their own budgets alone.
        allow_reset: bool = Bool("true"), Live;
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
        StoreSection::SETTINGS,
        RedisSection::SETTINGS,
        LimitSettings::SETTINGS,
        RlsSection::SETTINGS,
    ]
    .into_iter()
    .flatten()
}

/// The setting at `path`, if one is declared.
pub(crate) fn find(path: &str) -> Option<&'static Setting> {
    all().find(|s| s.path == path)
}
