//! The server's configuration: one TOML file, overridden by flags and
//! environment variables, validated into a [`Config`] before any port is
//! bound.
//!
//! Every key has a default, so no file at all is a valid configuration
//! (the in-memory store on `127.0.0.1:50051` and `127.0.0.1:9464`, no named
//! policies). Each validation error names the field's path and, when the
//! value came from the file, its line:
//! `policies.login.limit: limit must be at least 1 (line 12)`.
//!
//! ```
//! let config = quotad::Config::from_toml(r#"
//!     [store]
//!     max_keys = 10000
//!
//!     [policies.login]
//!     algorithm = "fixed_window"
//!     limit = 5
//!     window = "1m"
//! "#)?;
//! assert_eq!(config.store().max_keys, 10_000);
//! assert_eq!(config.policies()["login"].policy.limit(), 5);
//!
//! let error = quotad::Config::from_toml("[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 0\nwindow = \"1m\"\n")
//!     .unwrap_err();
//! assert_eq!(error.to_string(), "policies.login.limit: limit must be at least 1 (line 3)");
//! # Ok::<(), quotad::ConfigError>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use quotad_core::{Clock, OnFull, Policy, StoreConfig, StoreConfigError, SystemClock};
use serde::Deserialize;
use thiserror::Error;

use crate::policy::{PolicyField, policy_error_field, validate_policy_name};
use crate::store::redis::{RedisSettings, RedisTarget};

/// Default gRPC listen address.
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:50051";
/// Default admin (HTTP: metrics, health, policies) listen address.
pub const DEFAULT_ADMIN_ADDR: &str = "127.0.0.1:9464";
/// Default bound on keys held by the memory store.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;
/// Default number of memory-store shards.
pub const DEFAULT_SHARDS: usize = 64;
/// Default longest accepted key, in bytes.
pub const DEFAULT_MAX_KEY_BYTES: usize = 256;
/// Default time for the incremental sweep to visit every shard once.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(10);
/// Default interval at which the config file is re-read for policy changes.
pub const DEFAULT_CONFIG_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Default longest time one Redis call may take.
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_millis(100);

/// A validated configuration. Build it with [`Config::load`] (file plus
/// overrides) or [`Config::from_toml`]; every value in it is valid.
#[derive(Clone, Debug)]
pub struct Config {
    server: ServerSettings,
    store: StoreSettings,
    limits: LimitSettings,
    policies: BTreeMap<String, PolicySettings>,
    source: Option<Source>,
    clock: Arc<dyn Clock>,
}

/// Where the configuration came from, so that policies can be reloaded
/// from the same file with the same overrides.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Source {
    pub(crate) path: PathBuf,
    pub(crate) overrides: Overrides,
    /// The bytes validated, so a reload can tell whether the file changed
    /// since.
    pub(crate) contents: Vec<u8>,
}

/// `[server]`: listeners and the config file poll.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ServerSettings {
    /// `server.grpc_addr`: the gRPC listen address.
    pub grpc_addr: SocketAddr,
    /// `server.admin_addr`: the admin HTTP listen address.
    pub admin_addr: SocketAddr,
    /// `[server.tls]`: TLS (and mTLS) for the gRPC port; plaintext if absent.
    pub tls: Option<TlsSettings>,
    /// `server.config_poll_interval`: how often the config file is re-read
    /// for policy changes; zero turns polling off (SIGHUP still reloads).
    pub config_poll_interval: Duration,
    /// `server.worker_threads`: async runtime threads; `None` is one per
    /// core. A sidecar, or a box shared with its clients, wants fewer.
    pub worker_threads: Option<usize>,
}

/// `[server.tls]`: the certificate files, read and checked at load time.
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
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    client_ca_pem: Option<Vec<u8>>,
}

impl fmt::Debug for TlsSettings {
    // The key's bytes stay out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("client_ca", &self.client_ca)
            .finish_non_exhaustive()
    }
}

impl TlsSettings {
    /// The tonic server TLS configuration for these files.
    pub fn server_tls_config(&self) -> tonic::transport::ServerTlsConfig {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        // tonic's server uses the process-wide rustls provider, and rustls
        // cannot pick one by itself once another dependency enables a second
        // (aws-lc-rs). Installing ring, the one tonic is built with, keeps
        // that from turning into a panic; a provider already installed wins.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
            .timeout(Duration::from_secs(10));
        if let Some(ca) = &self.client_ca_pem {
            tls = tls.client_ca_root(Certificate::from_pem(ca));
        }
        tls
    }
}

/// The state backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// The embedded sharded store (quotad-core's `MemoryStore`).
    #[default]
    Memory,
    /// Redis, standalone or Cluster (`[store.redis]`): quotad replicas are
    /// stateless and share one budget.
    Redis,
}

/// What a check answers when the store fails (Redis down or too slow).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// The call fails with gRPC `UNAVAILABLE`; the client's own failure
    /// policy decides.
    #[default]
    Error,
    /// Admit, with reason `FAIL_OPEN`; nothing is counted.
    FailOpen,
    /// Deny, with reason `FAIL_CLOSED`.
    FailClosed,
}

impl OnError {
    /// The snake_case name used in the config file.
    pub fn as_str(self) -> &'static str {
        match self {
            OnError::Error => "error",
            OnError::FailOpen => "fail_open",
            OnError::FailClosed => "fail_closed",
        }
    }
}

/// `[policies.NAME]`: a named policy, and what its checks answer when the
/// store fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicySettings {
    /// The validated policy.
    pub policy: Policy,
    /// `policies.NAME.on_error`, or `store.on_error` when not set.
    pub on_error: OnError,
}

/// What the memory store does with a new key when it is full.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum OnFullSetting {
    /// Deny new keys (reason `CAPACITY`); existing keys go on.
    #[default]
    Deny,
    /// Evict the live key closest to fresh; its budget starts over.
    Evict,
}

impl From<OnFullSetting> for OnFull {
    fn from(value: OnFullSetting) -> Self {
        match value {
            OnFullSetting::Deny => OnFull::Deny,
            OnFullSetting::Evict => OnFull::Evict,
        }
    }
}

/// `[store]`: the state backend and its bounds.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StoreSettings {
    /// `store.backend`.
    pub backend: Backend,
    /// `store.max_keys`: the most keys held at once.
    pub max_keys: usize,
    /// `store.shards`: lock shards, a power of two.
    pub shards: usize,
    /// `store.on_full`: `deny` or `evict`.
    pub on_full: OnFullSetting,
    /// `store.max_key_bytes`: the longest key accepted, in bytes.
    pub max_key_bytes: usize,
    /// `store.sweep_interval`: the time in which the incremental sweep
    /// visits every shard once, dropping state that has become fresh.
    pub sweep_interval: Duration,
    /// `store.on_error`: what checks answer when the store fails, unless
    /// their policy says otherwise (inline policies always use this).
    pub on_error: OnError,
    /// `[store.redis]`: set when `store.backend = "redis"`.
    pub redis: Option<RedisSettings>,
    memory: StoreConfig,
}

impl StoreSettings {
    /// The memory store's validated configuration.
    pub fn memory_config(&self) -> StoreConfig {
        self.memory
    }
}

/// `[limits]`: what requests may ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LimitSettings {
    /// `limits.allow_inline_policies`: whether requests may carry their own
    /// policy instead of naming a configured one.
    pub allow_inline_policies: bool,
    /// `limits.allow_reset`: whether `Reset` is served. Anyone who can call
    /// `Check` can call `Reset`; turn it off where clients are not trusted
    /// to leave their own budgets alone.
    pub allow_reset: bool,
}

/// Settings given as flags or environment variables; each one set replaces
/// the file's value. Their names and the environment variables are the
/// command line reference.
#[derive(Clone, Debug, Default, PartialEq, clap::Args)]
pub struct Overrides {
    /// gRPC listen address [default: 127.0.0.1:50051]
    #[arg(long, env = "QUOTAD_GRPC_ADDR", value_name = "ADDR")]
    pub grpc_addr: Option<SocketAddr>,
    /// Admin HTTP listen address (/metrics, /healthz, /readyz, /policies) [default: 127.0.0.1:9464]
    #[arg(long, env = "QUOTAD_ADMIN_ADDR", value_name = "ADDR")]
    pub admin_addr: Option<SocketAddr>,
    /// PEM certificate chain for TLS on the gRPC port
    #[arg(long, env = "QUOTAD_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for TLS on the gRPC port
    #[arg(long, env = "QUOTAD_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates that client certificates must chain to (mTLS)
    #[arg(long, env = "QUOTAD_TLS_CLIENT_CA", value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Async runtime worker threads [default: one per core]
    #[arg(long, env = "QUOTAD_WORKER_THREADS", value_name = "N")]
    pub worker_threads: Option<usize>,
    /// How often the config file is re-read for policy changes; 0s disables [default: 1s]
    #[arg(long, env = "QUOTAD_CONFIG_POLL_INTERVAL", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub config_poll_interval: Option<Duration>,
    /// Most keys held by the memory store [default: 1000000]
    #[arg(long, env = "QUOTAD_MAX_KEYS", value_name = "N")]
    pub max_keys: Option<usize>,
    /// Memory store shards, a power of two [default: 64]
    #[arg(long, env = "QUOTAD_SHARDS", value_name = "N")]
    pub shards: Option<usize>,
    /// What to do with new keys when the store is full [default: deny]
    #[arg(long, env = "QUOTAD_ON_FULL", value_enum)]
    pub on_full: Option<OnFullSetting>,
    /// Longest accepted key, in bytes [default: 256]
    #[arg(long, env = "QUOTAD_MAX_KEY_BYTES", value_name = "N")]
    pub max_key_bytes: Option<usize>,
    /// Time for the background sweep to visit every shard [default: 10s]
    #[arg(long, env = "QUOTAD_SWEEP_INTERVAL", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub sweep_interval: Option<Duration>,
    /// Whether requests may carry inline policies [default: true]
    #[arg(long, env = "QUOTAD_ALLOW_INLINE_POLICIES", value_name = "BOOL")]
    pub allow_inline_policies: Option<bool>,
    /// Whether the Reset RPC is served [default: true]
    #[arg(long, env = "QUOTAD_ALLOW_RESET", value_name = "BOOL")]
    pub allow_reset: Option<bool>,
    /// The state backend [default: memory]
    #[arg(long, env = "QUOTAD_BACKEND", value_enum)]
    pub backend: Option<Backend>,
    /// Redis URL for backend redis, e.g. redis://127.0.0.1:6379/0
    #[arg(long, env = "QUOTAD_REDIS_URL", value_name = "URL")]
    pub redis_url: Option<String>,
    /// Redis Cluster seed nodes for backend redis, comma-separated URLs
    #[arg(
        long,
        env = "QUOTAD_REDIS_CLUSTER_NODES",
        value_name = "URLS",
        value_delimiter = ','
    )]
    pub redis_cluster_nodes: Option<Vec<String>>,
    /// Longest time one Redis call may take [default: 100ms]
    #[arg(long, env = "QUOTAD_REDIS_TIMEOUT", value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub redis_timeout: Option<Duration>,
    /// What checks answer when the store fails, unless their policy says [default: error]
    #[arg(long, env = "QUOTAD_ON_ERROR", value_enum)]
    pub on_error: Option<OnError>,
}

/// A configuration that cannot be used. The message names the field.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("invalid TOML: {message}{}", line_suffix(*line))]
    Syntax {
        /// The parser's message.
        message: String,
        /// The line of the error, 1-based.
        line: Option<usize>,
    },
    /// A value is missing, of the wrong type, or breaks a rule.
    #[error("{field}: {message}{}", origin)]
    Invalid {
        /// The field's path, such as `policies.login.limit`.
        field: String,
        /// What is wrong.
        message: String,
        /// Where the value came from.
        origin: Origin,
    },
}

impl ConfigError {
    /// The path of the offending field, when one is known.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// Where an invalid value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The config file, at this 1-based line when known.
    File(Option<usize>),
    /// A command-line flag or environment variable.
    Override,
    /// A default combined with other values.
    Default,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(line) => f.write_str(&line_suffix(*line)),
            Origin::Override => f.write_str(" (from a flag or environment variable)"),
            Origin::Default => Ok(()),
        }
    }
}

fn line_suffix(line: Option<usize>) -> String {
    line.map(|l| format!(" (line {l})")).unwrap_or_default()
}

impl Default for Config {
    /// The configuration with no file and no overrides.
    fn default() -> Self {
        Config::parse("", None, &Overrides::default())
            .expect("the built-in defaults are a valid configuration")
    }
}

impl Config {
    /// Reads `path` (if any), applies `overrides` and validates the result.
    /// Without a file, every setting not overridden takes its default.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the file or the field that is wrong. TLS
    /// files are read and parsed here too, so a configuration that loads
    /// can be served.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        match path {
            None => Config::parse("", None, overrides),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                Config::parse(&text, Some(path), overrides)
            }
        }
    }

    /// Validates a configuration given as TOML text, with no overrides.
    /// Relative TLS paths are resolved against the working directory.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field that is wrong.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, None, &Overrides::default())
    }

    /// Validates `text`, read from `path` when given (policies then reload
    /// from it), with `overrides` applied.
    pub(crate) fn parse(
        text: &str,
        path: Option<&Path>,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let document = Document::parse(text)?;
        let mut raw = document.deserialize()?;
        let overridden = raw.apply(overrides);
        let base_dir = path.and_then(Path::parent);
        let locate = |field: &[&str]| {
            if overridden.iter().any(|o| o.as_slice() == field) {
                Origin::Override
            } else {
                Origin::File(document.line_of(field))
            }
        };
        let mut config = raw.validate(base_dir, &locate)?;
        config.source = path.map(|path| Source {
            path: path.to_owned(),
            overrides: overrides.clone(),
            contents: text.as_bytes().to_vec(),
        });
        Ok(config)
    }

    /// Replaces the clock every decision reads; for tests and simulations
    /// that drive time by hand.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// `[server]`.
    pub fn server(&self) -> &ServerSettings {
        &self.server
    }

    /// `[store]`.
    pub fn store(&self) -> &StoreSettings {
        &self.store
    }

    /// `[limits]`.
    pub fn limits(&self) -> &LimitSettings {
        &self.limits
    }

    /// `[policies.NAME]`, by name.
    pub fn policies(&self) -> &BTreeMap<String, PolicySettings> {
        &self.policies
    }

    /// The file the configuration was read from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.source.as_ref().map(|s| s.path.as_path())
    }

    pub(crate) fn source(&self) -> Option<&Source> {
        self.source.as_ref()
    }

    /// The clock decisions read.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The settings that differ from `other` and only take effect on a
    /// restart (everything except policies), by field path.
    pub fn restart_required_changes(&self, other: &Config) -> Vec<&'static str> {
        let (a, b) = (
            (&self.server, &self.store, &self.limits),
            (&other.server, &other.store, &other.limits),
        );
        [
            ("server.grpc_addr", a.0.grpc_addr != b.0.grpc_addr),
            ("server.admin_addr", a.0.admin_addr != b.0.admin_addr),
            ("server.tls", a.0.tls != b.0.tls),
            (
                "server.config_poll_interval",
                a.0.config_poll_interval != b.0.config_poll_interval,
            ),
            (
                "server.worker_threads",
                a.0.worker_threads != b.0.worker_threads,
            ),
            ("store.backend", a.1.backend != b.1.backend),
            ("store.max_keys", a.1.max_keys != b.1.max_keys),
            ("store.shards", a.1.shards != b.1.shards),
            ("store.on_full", a.1.on_full != b.1.on_full),
            (
                "store.max_key_bytes",
                a.1.max_key_bytes != b.1.max_key_bytes,
            ),
            (
                "store.sweep_interval",
                a.1.sweep_interval != b.1.sweep_interval,
            ),
            ("store.on_error", a.1.on_error != b.1.on_error),
            ("store.redis", a.1.redis != b.1.redis),
            (
                "limits.allow_inline_policies",
                a.2.allow_inline_policies != b.2.allow_inline_policies,
            ),
            ("limits.allow_reset", a.2.allow_reset != b.2.allow_reset),
        ]
        .into_iter()
        .filter_map(|(field, changed)| changed.then_some(field))
        .collect()
    }
}

/// The TOML text with its parse tree, kept to find the line of a field.
struct Document<'a> {
    text: &'a str,
    tree: toml::de::DeValue<'a>,
}

impl<'a> Document<'a> {
    fn parse(text: &'a str) -> Result<Self, ConfigError> {
        let tree = toml::de::DeTable::parse(text).map_err(|e| syntax_error(text, &e))?;
        Ok(Document {
            text,
            tree: toml::de::DeValue::Table(tree.into_inner()),
        })
    }

    /// Deserializes the file, naming the path of the first field that is
    /// missing, unknown or of the wrong type.
    fn deserialize(&self) -> Result<RawConfig, ConfigError> {
        let deserializer =
            toml::Deserializer::parse(self.text).map_err(|e| syntax_error(self.text, &e))?;
        serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let field = match e.path().to_string() {
                root if root == "." => "(top level)".to_owned(),
                field => field,
            };
            let inner = e.into_inner();
            ConfigError::Invalid {
                field,
                message: inner.message().to_owned(),
                origin: Origin::File(inner.span().map(|span| line_at(self.text, span.start))),
            }
        })
    }

    /// The line of the value at `path`, or of its nearest enclosing table
    /// that is in the file.
    fn line_of(&self, path: &[&str]) -> Option<usize> {
        let mut node = &self.tree;
        let mut found = None;
        for segment in path {
            match node.get(*segment) {
                Some(value) => {
                    found = Some(value.span().start);
                    node = value.get_ref();
                }
                None => break,
            }
        }
        found.map(|offset| line_at(self.text, offset))
    }
}

fn syntax_error(text: &str, error: &toml::de::Error) -> ConfigError {
    ConfigError::Syntax {
        message: error.message().to_owned(),
        line: error.span().map(|span| line_at(text, span.start)),
    }
}

/// The 1-based line holding byte `offset` of `text`.
fn line_at(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// A duration written the human way: `"1m"`, `"500ms"`, `"1h 30m"`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(try_from = "String")]
struct HumanDuration(Duration);

impl TryFrom<String> for HumanDuration {
    type Error = String;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        humantime::parse_duration(&value)
            .map(HumanDuration)
            .map_err(|e| {
                format!("invalid duration {value:?}: {e} (write e.g. \"1s\", \"1m\", \"500ms\")")
            })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    policies: BTreeMap<String, RawPolicy>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    grpc_addr: Option<SocketAddr>,
    admin_addr: Option<SocketAddr>,
    tls: Option<RawTls>,
    config_poll_interval: Option<HumanDuration>,
    worker_threads: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    backend: Option<Backend>,
    max_keys: Option<usize>,
    shards: Option<usize>,
    on_full: Option<OnFullSetting>,
    max_key_bytes: Option<usize>,
    sweep_interval: Option<HumanDuration>,
    on_error: Option<OnError>,
    redis: Option<RawRedis>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedis {
    url: Option<String>,
    cluster_nodes: Option<Vec<String>>,
    timeout: Option<HumanDuration>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    allow_inline_policies: Option<bool>,
    allow_reset: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    algorithm: String,
    limit: u64,
    window: HumanDuration,
    burst: Option<u64>,
    on_error: Option<OnError>,
}

impl RawConfig {
    /// Writes the overrides over the file's values; returns the paths of
    /// the fields replaced, so their errors say where they came from.
    fn apply(&mut self, o: &Overrides) -> Vec<Vec<&'static str>> {
        let mut replaced = Vec::new();
        fn set<T: Clone>(
            slot: &mut Option<T>,
            value: &Option<T>,
            path: &[&'static str],
            replaced: &mut Vec<Vec<&'static str>>,
        ) {
            if let Some(value) = value {
                *slot = Some(value.clone());
                replaced.push(path.to_vec());
            }
        }
        let s = &mut self.server;
        set(
            &mut s.grpc_addr,
            &o.grpc_addr,
            &["server", "grpc_addr"],
            &mut replaced,
        );
        set(
            &mut s.admin_addr,
            &o.admin_addr,
            &["server", "admin_addr"],
            &mut replaced,
        );
        set(
            &mut s.worker_threads,
            &o.worker_threads,
            &["server", "worker_threads"],
            &mut replaced,
        );
        let poll = o.config_poll_interval.map(HumanDuration);
        set(
            &mut s.config_poll_interval,
            &poll,
            &["server", "config_poll_interval"],
            &mut replaced,
        );
        if o.tls_cert.is_some() || o.tls_key.is_some() || o.tls_client_ca.is_some() {
            let tls = s.tls.get_or_insert_with(RawTls::default);
            set(
                &mut tls.cert,
                &o.tls_cert,
                &["server", "tls", "cert"],
                &mut replaced,
            );
            set(
                &mut tls.key,
                &o.tls_key,
                &["server", "tls", "key"],
                &mut replaced,
            );
            set(
                &mut tls.client_ca,
                &o.tls_client_ca,
                &["server", "tls", "client_ca"],
                &mut replaced,
            );
        }
        let st = &mut self.store;
        set(
            &mut st.max_keys,
            &o.max_keys,
            &["store", "max_keys"],
            &mut replaced,
        );
        set(
            &mut st.shards,
            &o.shards,
            &["store", "shards"],
            &mut replaced,
        );
        set(
            &mut st.on_full,
            &o.on_full,
            &["store", "on_full"],
            &mut replaced,
        );
        set(
            &mut st.max_key_bytes,
            &o.max_key_bytes,
            &["store", "max_key_bytes"],
            &mut replaced,
        );
        let sweep = o.sweep_interval.map(HumanDuration);
        set(
            &mut st.sweep_interval,
            &sweep,
            &["store", "sweep_interval"],
            &mut replaced,
        );
        set(
            &mut self.limits.allow_inline_policies,
            &o.allow_inline_policies,
            &["limits", "allow_inline_policies"],
            &mut replaced,
        );
        set(
            &mut self.limits.allow_reset,
            &o.allow_reset,
            &["limits", "allow_reset"],
            &mut replaced,
        );
        let st = &mut self.store;
        set(
            &mut st.backend,
            &o.backend,
            &["store", "backend"],
            &mut replaced,
        );
        set(
            &mut st.on_error,
            &o.on_error,
            &["store", "on_error"],
            &mut replaced,
        );
        if o.redis_url.is_some() || o.redis_cluster_nodes.is_some() || o.redis_timeout.is_some() {
            let redis = st.redis.get_or_insert_with(RawRedis::default);
            set(
                &mut redis.url,
                &o.redis_url,
                &["store", "redis", "url"],
                &mut replaced,
            );
            set(
                &mut redis.cluster_nodes,
                &o.redis_cluster_nodes,
                &["store", "redis", "cluster_nodes"],
                &mut replaced,
            );
            let timeout = o.redis_timeout.map(HumanDuration);
            set(
                &mut redis.timeout,
                &timeout,
                &["store", "redis", "timeout"],
                &mut replaced,
            );
        }
        replaced
    }

    fn validate(
        self,
        base_dir: Option<&Path>,
        locate: &dyn Fn(&[&str]) -> Origin,
    ) -> Result<Config, ConfigError> {
        let invalid = |path: &[&str], message: String| ConfigError::Invalid {
            field: path.join("."),
            message,
            origin: locate(path),
        };

        let server = ServerSettings {
            grpc_addr: self
                .server
                .grpc_addr
                .unwrap_or_else(|| default_addr(DEFAULT_GRPC_ADDR)),
            admin_addr: self
                .server
                .admin_addr
                .unwrap_or_else(|| default_addr(DEFAULT_ADMIN_ADDR)),
            tls: self
                .server
                .tls
                .map(|tls| tls.validate(base_dir, &invalid))
                .transpose()?,
            config_poll_interval: self
                .server
                .config_poll_interval
                .map_or(DEFAULT_CONFIG_POLL_INTERVAL, |d| d.0),
            worker_threads: self.server.worker_threads,
        };
        if server.worker_threads == Some(0) {
            return Err(invalid(
                &["server", "worker_threads"],
                "worker_threads must be at least 1 (leave it out for one per core)".to_owned(),
            ));
        }
        if server.grpc_addr == server.admin_addr && server.grpc_addr.port() != 0 {
            return Err(invalid(
                &["server", "admin_addr"],
                format!("must differ from server.grpc_addr ({})", server.grpc_addr),
            ));
        }

        let st = self.store;
        let max_keys = st.max_keys.unwrap_or(DEFAULT_MAX_KEYS);
        let shards = st.shards.unwrap_or(DEFAULT_SHARDS);
        let on_full = st.on_full.unwrap_or_default();
        let memory = StoreConfig::try_new(max_keys, shards, on_full.into()).map_err(|e| {
            let field = match e {
                StoreConfigError::MaxKeysZero => "max_keys",
                StoreConfigError::ShardsNotPowerOfTwo(_) => "shards",
                StoreConfigError::MaxBytesTooSmall { .. } => "max_bytes",
            };
            invalid(&["store", field], e.to_string())
        })?;
        let max_key_bytes = st.max_key_bytes.unwrap_or(DEFAULT_MAX_KEY_BYTES);
        if max_key_bytes == 0 {
            return Err(invalid(
                &["store", "max_key_bytes"],
                "max_key_bytes must be at least 1".to_owned(),
            ));
        }
        let sweep_interval = st.sweep_interval.map_or(DEFAULT_SWEEP_INTERVAL, |d| d.0);
        if sweep_interval.is_zero() {
            return Err(invalid(
                &["store", "sweep_interval"],
                "sweep_interval must be longer than zero".to_owned(),
            ));
        }
        let backend = st.backend.unwrap_or_default();
        let redis = match (backend, st.redis) {
            (Backend::Redis, Some(raw)) => Some(raw.validate(&invalid)?),
            (Backend::Redis, None) => {
                return Err(invalid(
                    &["store", "backend"],
                    "\"redis\" needs a [store.redis] section with url or cluster_nodes".to_owned(),
                ));
            }
            (Backend::Memory, _) => None,
        };
        let on_error = st.on_error.unwrap_or_default();
        let store = StoreSettings {
            backend,
            max_keys,
            shards,
            on_full,
            max_key_bytes,
            sweep_interval,
            on_error,
            redis,
            memory,
        };

        let limits = LimitSettings {
            allow_inline_policies: self.limits.allow_inline_policies.unwrap_or(true),
            allow_reset: self.limits.allow_reset.unwrap_or(true),
        };

        let mut policies = BTreeMap::new();
        for (name, raw) in self.policies {
            if let Err(message) = validate_policy_name(&name) {
                return Err(ConfigError::Invalid {
                    field: format!("policies.{name:?}"),
                    message: format!("policy name {message}"),
                    origin: locate(&["policies", &name]),
                });
            }
            let on_error = raw.on_error.unwrap_or(on_error);
            let policy = raw.validate(&name, &invalid)?;
            policies.insert(name, PolicySettings { policy, on_error });
        }

        Ok(Config {
            server,
            store,
            limits,
            policies,
            source: None,
            clock: Arc::new(SystemClock),
        })
    }
}

fn default_addr(addr: &str) -> SocketAddr {
    addr.parse()
        .expect("the default addresses are valid socket addresses")
}

impl RawTls {
    fn validate(
        self,
        base_dir: Option<&Path>,
        invalid: &dyn Fn(&[&str], String) -> ConfigError,
    ) -> Result<TlsSettings, ConfigError> {
        let resolve = |p: PathBuf| match base_dir {
            Some(dir) if p.is_relative() => dir.join(p),
            _ => p,
        };
        let required = |value: Option<PathBuf>, field: &'static str| {
            value.map(resolve).ok_or_else(|| {
                invalid(
                    &["server", "tls", field],
                    format!("{field} is required when [server.tls] is set"),
                )
            })
        };
        let cert = required(self.cert, "cert")?;
        let key = required(self.key, "key")?;
        let client_ca = self.client_ca.map(resolve);
        let read = |path: &Path, field: &'static str| {
            std::fs::read(path).map_err(|e| {
                invalid(
                    &["server", "tls", field],
                    format!("cannot read {}: {e}", path.display()),
                )
            })
        };
        let tls = TlsSettings {
            cert_pem: read(&cert, "cert")?,
            key_pem: read(&key, "key")?,
            client_ca_pem: client_ca
                .as_deref()
                .map(|p| read(p, "client_ca"))
                .transpose()?,
            cert,
            key,
            client_ca,
        };
        // tonic parses the PEM files when the TLS config is applied; doing
        // it here turns a bad file into a config error before binding.
        tonic::transport::Server::builder()
            .tls_config(tls.server_tls_config())
            .map_err(|e| {
                invalid(
                    &["server", "tls"],
                    format!("the certificate, key or client CA cannot be used: {e}"),
                )
            })?;
        Ok(tls)
    }
}

impl RawRedis {
    fn validate(
        self,
        invalid: &dyn Fn(&[&str], String) -> ConfigError,
    ) -> Result<RedisSettings, ConfigError> {
        let check_url = |url: &str, field: &'static str| {
            redis::IntoConnectionInfo::into_connection_info(url)
                .map(|_| ())
                .map_err(|e| invalid(&["store", "redis", field], format!("{url:?}: {e}")))
        };
        let target = match (self.url, self.cluster_nodes) {
            (Some(url), None) => {
                check_url(&url, "url")?;
                RedisTarget::Standalone(url)
            }
            (None, Some(nodes)) if !nodes.is_empty() => {
                for node in &nodes {
                    check_url(node, "cluster_nodes")?;
                }
                RedisTarget::Cluster(nodes)
            }
            (None, Some(_)) => {
                return Err(invalid(
                    &["store", "redis", "cluster_nodes"],
                    "must name at least one node".to_owned(),
                ));
            }
            (Some(_), Some(_)) => {
                return Err(invalid(
                    &["store", "redis"],
                    "set url or cluster_nodes, not both".to_owned(),
                ));
            }
            (None, None) => {
                return Err(invalid(
                    &["store", "redis"],
                    "set url (standalone) or cluster_nodes (Redis Cluster)".to_owned(),
                ));
            }
        };
        let timeout = self.timeout.map_or(DEFAULT_REDIS_TIMEOUT, |t| t.0);
        if timeout.is_zero() {
            return Err(invalid(
                &["store", "redis", "timeout"],
                "timeout must be longer than zero".to_owned(),
            ));
        }
        Ok(RedisSettings { target, timeout })
    }
}

impl RawPolicy {
    fn validate(
        self,
        name: &str,
        invalid: &dyn Fn(&[&str], String) -> ConfigError,
    ) -> Result<Policy, ConfigError> {
        let field = |f: PolicyField| ["policies", name, f.config_name()];
        let algorithm = self
            .algorithm
            .parse()
            .map_err(|e: quotad_core::UnknownAlgorithm| {
                invalid(&field(PolicyField::Algorithm), e.to_string())
            })?;
        Policy::try_new(algorithm, self.limit, self.window.0, self.burst)
            .map_err(|e| invalid(&field(policy_error_field(&e)), e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        match Config::from_toml(text) {
            Ok(_) => panic!("expected an error for:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn no_file_gives_the_documented_defaults() {
        let config = Config::default();
        assert_eq!(config.server().grpc_addr.to_string(), "127.0.0.1:50051");
        assert_eq!(config.server().admin_addr.to_string(), "127.0.0.1:9464");
        assert!(config.server().tls.is_none());
        assert_eq!(config.server().config_poll_interval, Duration::from_secs(1));
        assert_eq!(config.store().backend, Backend::Memory);
        assert_eq!(config.store().max_keys, 1_000_000);
        assert_eq!(config.store().shards, 64);
        assert_eq!(config.store().on_full, OnFullSetting::Deny);
        assert_eq!(config.store().max_key_bytes, 256);
        assert_eq!(config.store().sweep_interval, Duration::from_secs(10));
        assert!(config.limits().allow_inline_policies);
        assert!(config.policies().is_empty());
    }

    #[test]
    fn reads_every_section() {
        let config = Config::from_toml(
            r#"
            [server]
            grpc_addr = "0.0.0.0:7000"
            admin_addr = "0.0.0.0:7001"
            config_poll_interval = "0s"

            [store]
            backend = "memory"
            max_keys = 5000
            shards = 16
            on_full = "evict"
            max_key_bytes = 64
            sweep_interval = "2s"

            [limits]
            allow_inline_policies = false

            [policies.api]
            algorithm = "token_bucket"
            limit = 100
            window = "1m"
            burst = 20
            "#,
        )
        .expect("valid");
        assert_eq!(config.server().grpc_addr.port(), 7000);
        assert_eq!(config.server().config_poll_interval, Duration::ZERO);
        assert_eq!(config.store().on_full, OnFullSetting::Evict);
        assert_eq!(config.store().memory_config().on_full(), OnFull::Evict);
        assert_eq!(config.store().max_key_bytes, 64);
        assert!(!config.limits().allow_inline_policies);
        let api = config.policies()["api"].policy;
        assert_eq!(api.window_ms(), 60_000);
        assert_eq!(api.burst(), 20);
    }

    #[test]
    fn names_the_policy_field_and_line_of_a_broken_rule() {
        let text = "\n[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 0\nwindow = \"1m\"\n";
        assert_eq!(
            error(text),
            "policies.login.limit: limit must be at least 1 (line 4)"
        );
        let text = "[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\nburst = 3\n";
        assert_eq!(
            error(text),
            "policies.login.burst: burst applies only to token_bucket and leaky_bucket, not fixed_window (line 5)"
        );
        let text = "[policies.login]\nalgorithm = \"fixed\"\nlimit = 5\nwindow = \"1m\"\n";
        assert!(error(text).starts_with("policies.login.algorithm: unknown algorithm \"fixed\""));
        let text = "[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"0s\"\n";
        assert_eq!(
            error(text),
            "policies.login.window: window must be at least 1 ms (line 4)"
        );
        let text = "[policies.log]\nalgorithm = \"sliding_log\"\nlimit = 10001\nwindow = \"1s\"\n";
        assert!(
            error(text).starts_with("policies.log.limit: sliding_log limit must be at most 10000")
        );
    }

    #[test]
    fn names_the_field_of_a_type_or_parse_error() {
        let text = "[policies.login]\nalgorithm = \"fixed_window\"\nlimit = -1\nwindow = \"1m\"\n";
        let message = error(text);
        assert!(message.starts_with("policies.login.limit: "), "{message}");
        assert!(message.ends_with("(line 3)"), "{message}");

        let text =
            "[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"a minute\"\n";
        let message = error(text);
        assert!(
            message.starts_with("policies.login.window: invalid duration"),
            "{message}"
        );
        assert!(message.ends_with("(line 4)"), "{message}");

        let message = error("[server]\ngrpc_addr = \"localhost\"\n");
        assert!(message.starts_with("server.grpc_addr: "), "{message}");

        let message = error("[store]\non_full = \"drop\"\n");
        assert!(
            message.starts_with("store.on_full: unknown variant `drop`"),
            "{message}"
        );

        let message = error("[store]\nbackend = \"memcached\"\n");
        assert!(
            message.starts_with("store.backend: unknown variant `memcached`"),
            "{message}"
        );

        let message = error("[store]\nbackend = \"redis\"\n");
        assert_eq!(
            message,
            "store.backend: \"redis\" needs a [store.redis] section with url or cluster_nodes (line 2)"
        );

        let message = error("[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 5\n");
        assert!(
            message.starts_with("policies.login: missing field `window`"),
            "{message}"
        );
    }

    #[test]
    fn rejects_unknown_fields_everywhere() {
        for (text, field) in [
            ("colour = 1\n", "colour: unknown field `colour`"),
            (
                "[server]\ngrpc_adr = \"127.0.0.1:1\"\n",
                "server.grpc_adr: unknown field `grpc_adr`",
            ),
            (
                "[store]\nmax_key = 5\n",
                "store.max_key: unknown field `max_key`",
            ),
            (
                "[limits]\ninline = true\n",
                "limits.inline: unknown field `inline`",
            ),
            (
                "[server.tls]\ncrt = \"a\"\n",
                "server.tls.crt: unknown field `crt`",
            ),
            (
                "[policies.a]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\nlimti = 2\n",
                "policies.a.limti: unknown field `limti`",
            ),
        ] {
            let message = error(text);
            assert!(message.starts_with(field), "{message}");
        }
    }

    #[test]
    fn validates_store_settings() {
        assert_eq!(
            error("[store]\nmax_keys = 0\n"),
            "store.max_keys: max_keys must be at least 1 (line 2)"
        );
        assert_eq!(
            error("[store]\nshards = 3\n"),
            "store.shards: shards must be a power of two from 1 to 65536 (got 3) (line 2)"
        );
        assert!(error("[store]\nshards = 131072\n").starts_with(
            "store.shards: shards must be a power of two from 1 to 65536 (got 131072)"
        ));
        assert_eq!(
            error("[store]\nmax_key_bytes = 0\n"),
            "store.max_key_bytes: max_key_bytes must be at least 1 (line 2)"
        );
        assert_eq!(
            error("[store]\nsweep_interval = \"0s\"\n"),
            "store.sweep_interval: sweep_interval must be longer than zero (line 2)"
        );
    }

    #[test]
    fn worker_threads_default_to_one_per_core_and_must_be_positive() {
        assert_eq!(Config::default().server().worker_threads, None);
        let config = Config::from_toml("[server]\nworker_threads = 1\n").expect("valid");
        assert_eq!(config.server().worker_threads, Some(1));
        assert_eq!(
            error("[server]\nworker_threads = 0\n"),
            "server.worker_threads: worker_threads must be at least 1 (leave it out for one per core) (line 2)"
        );
    }

    #[test]
    fn rejects_policy_names_outside_the_allowed_alphabet() {
        let message =
            error("[policies.\"a:b\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\n");
        assert!(
            message.starts_with("policies.\"a:b\": policy name must be"),
            "{message}"
        );
        let long = "x".repeat(65);
        let message = error(&format!(
            "[policies.{long}]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\n"
        ));
        assert!(message.contains("policy name must be"), "{message}");
        assert!(
            Config::from_toml(&format!(
                "[policies.\"{}\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\n",
                "A-z_0.9".repeat(9).chars().take(64).collect::<String>()
            ))
            .is_ok()
        );
    }

    #[test]
    fn reports_syntax_errors_with_their_line() {
        let message = error("[store]\nmax_keys = = 3\n");
        assert!(message.starts_with("invalid TOML: "), "{message}");
        assert!(message.ends_with("(line 2)"), "{message}");
    }

    #[test]
    fn overrides_replace_file_values_and_say_so_in_errors() {
        let overrides = Overrides {
            max_keys: Some(7_000),
            on_full: Some(OnFullSetting::Evict),
            allow_inline_policies: Some(false),
            ..Overrides::default()
        };
        let config = Config::parse("[store]\nmax_keys = 5\n", None, &overrides).expect("valid");
        assert_eq!(config.store().max_keys, 7_000);
        assert_eq!(config.store().on_full, OnFullSetting::Evict);
        assert!(!config.limits().allow_inline_policies);

        let overrides = Overrides {
            shards: Some(6),
            ..Overrides::default()
        };
        let message = match Config::parse("[store]\nshards = 8\n", None, &overrides) {
            Ok(_) => panic!("6 shards is invalid"),
            Err(e) => e.to_string(),
        };
        assert_eq!(
            message,
            "store.shards: shards must be a power of two from 1 to 65536 (got 6) (from a flag or environment variable)"
        );
    }

    #[test]
    fn tls_needs_readable_files() {
        let message = error(
            "[server.tls]\ncert = \"/nonexistent/cert.pem\"\nkey = \"/nonexistent/key.pem\"\n",
        );
        assert!(
            message.starts_with("server.tls.cert: cannot read /nonexistent/cert.pem"),
            "{message}"
        );
        assert!(message.ends_with("(line 2)"), "{message}");
        let message = error("[server.tls]\ncert = \"/nonexistent/cert.pem\"\n");
        assert!(
            message.starts_with("server.tls.key: key is required"),
            "{message}"
        );
    }

    #[test]
    fn tls_rejects_files_that_are_not_pem() {
        let dir = tempfile::tempdir().expect("temp dir");
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        std::fs::write(&cert, "not a certificate").expect("write");
        std::fs::write(&key, "not a key").expect("write");
        let text = format!("[server.tls]\ncert = {:?}\nkey = {:?}\n", cert, key);
        let message = error(&text);
        assert!(
            message.starts_with("server.tls: the certificate, key or client CA cannot be used"),
            "{message}"
        );
    }

    #[test]
    fn lists_settings_that_need_a_restart() {
        let a = Config::from_toml("[store]\nmax_keys = 10\n").expect("valid");
        let b =
            Config::from_toml("[store]\nmax_keys = 20\n[limits]\nallow_inline_policies = false\n")
                .expect("valid");
        assert_eq!(
            a.restart_required_changes(&b),
            vec!["store.max_keys", "limits.allow_inline_policies"]
        );
        assert!(a.restart_required_changes(&a.clone()).is_empty());
    }
}
