//! The server's configuration: one TOML file, with flags and environment
//! variables replacing its values one by one, validated into a [`Config`]
//! before any port is bound.
//!
//! - [`settings`](self::settings): every setting, declared once (name, type,
//!   default, flag and environment variable, documentation, whether it
//!   reloads);
//! - `document`: the layers (declared defaults, the file, flags and
//!   environment) merged into one TOML table before the single
//!   deserialization, remembering where each value came from;
//! - `store`, `tls`, `policies`: the rules a value must follow beyond its
//!   type, and the validated types the server uses.
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
//! let quotad::config::BackendSettings::Memory(memory) = &config.store().backend else {
//!     panic!("the memory store is the default");
//! };
//! assert_eq!(memory.store.max_keys(), 10_000);
//! assert_eq!(config.policies()["login"].policy.limit(), 5);
//!
//! let error = quotad::Config::from_toml("[policies.login]\nalgorithm = \"fixed_window\"\nlimit = 0\nwindow = \"1m\"\n")
//!     .unwrap_err();
//! assert_eq!(error.to_string(), "policies.login.limit: limit must be at least 1 (line 3)");
//! # Ok::<(), quotad::ConfigError>(())
//! ```

mod auth;
mod document;
mod error;
mod flags;
mod limits;
pub(crate) mod overrides;
mod policies;
pub mod redis;
mod rlqs;
mod rls;
mod settings;
mod store;
mod tls;
mod transport;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use quotad_core::{Clock, SystemClock};
use serde::{Deserialize, Deserializer};

pub use auth::{AuthSettings, IdentityPattern};
pub use error::{ConfigError, Origin};
pub use flags::FlagValues;
pub use policies::{OnError, PolicySettings};
pub use rlqs::RlqsSettings;
pub use rls::{CountMode, ReferenceHeaders, ResponseHeaders, RlsSettings};
pub use settings::{LimitSettings, LogFormat, OnBadSnapshot, ResetAccess};
pub use store::{
    BackendSettings, FallbackSettings, MemorySettings, SnapshotSettings, StoreSettings,
};
pub use tls::{TlsFileError, TlsSettings};
pub use transport::{TransportSettings, largest_request_bytes};

use document::Layers;
use policies::{Invalid, RawPolicy};
use settings::{
    AuthSection, Kind, LogSection, Reload, RlqsSection, RlsSection, ServerSection, StoreSection,
    TlsSection, TransportSection,
};

/// A validated configuration. Build it with [`Config::load`] (file plus
/// flags) or [`Config::from_toml`]; every value in it is valid.
#[derive(Clone)]
pub struct Config {
    server: ServerSettings,
    transport: TransportSettings,
    auth: AuthSettings,
    log: LogSettings,
    store: StoreSettings,
    limits: LimitSettings,
    policies: BTreeMap<String, PolicySettings>,
    /// `[[overrides]]`.
    overrides: Vec<overrides::Override>,
    rls: RlsSettings,
    rlqs: RlqsSettings,
    /// The merged table validated, to tell which settings a reload changed.
    effective: toml::Table,
    source: Option<Source>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Config {
    /// The validated settings, never the text they came from: that may hold
    /// a password (a Redis URL), which the settings show as `***`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("server", &self.server)
            .field("store", &self.store)
            .field("limits", &self.limits)
            .field("policies", &self.policies)
            .field("path", &self.path())
            .finish_non_exhaustive()
    }
}

/// Where the configuration came from, so that policies can be reloaded
/// from the same file with the same flags.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Source {
    pub(crate) path: PathBuf,
    pub(crate) flags: FlagValues,
    /// The bytes validated, so a reload can tell whether the file changed
    /// since.
    pub(crate) contents: Vec<u8>,
}

/// `[server]`, validated: listeners, TLS, the config file poll and the
/// runtime.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ServerSettings {
    /// `server.grpc_addr`: the gRPC listen address, TCP or a unix socket.
    pub grpc_addr: ListenAddr,
    /// `server.unix_socket_mode`: the file mode of the gRPC unix socket.
    pub unix_socket_mode: u32,
    /// `server.admin_addr`: the admin HTTP listen address.
    pub admin_addr: SocketAddr,
    /// `[server.tls]`: TLS (and mTLS) for the gRPC port; plaintext if absent.
    pub tls: Option<TlsSettings>,
    /// `server.config_poll_interval`: how often the config file is re-read
    /// for policy changes; zero turns polling off (SIGHUP still reloads).
    pub config_poll_interval: Duration,
    /// `server.worker_threads`: async runtime threads; `None` is one per
    /// core.
    pub worker_threads: Option<usize>,
    /// `server.shutdown_delay`: how long to keep serving, not ready, after
    /// a shutdown is requested.
    pub shutdown_delay: Duration,
    /// `server.readiness_follows_store`: whether readiness requires the
    /// store to answer its probe.
    pub readiness_follows_store: bool,
}

/// `[log]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogSettings {
    /// `log.format`.
    pub format: LogFormat,
    /// `log.level`: a filter `tracing_subscriber::EnvFilter` accepts.
    pub level: String,
}

impl LogSettings {
    fn validate(section: LogSection) -> Result<Self, Invalid> {
        tracing_subscriber::EnvFilter::builder()
            .parse(&section.level)
            .map_err(|e| {
                (
                    vec!["log".to_owned(), "level".to_owned()],
                    format!(
                        "{:?} is not a log filter: {e} (write a level such as \"info\", or directives such as \"info,quotad=debug\")",
                        section.level
                    ),
                )
            })?;
        Ok(LogSettings {
            format: section.format,
            level: section.level,
        })
    }
}

/// The whole file as written, after the layers are merged.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    server: ServerSection,
    transport: TransportSection,
    // Every `[auth]` setting is optional, so no default creates the table.
    #[serde(default)]
    auth: AuthSection,
    log: LogSection,
    store: StoreSection,
    limits: LimitSettings,
    rls: RlsSection,
    // Its one setting is optional, so no default creates the table.
    #[serde(default)]
    rlqs: RlqsSection,
    #[serde(default)]
    policies: BTreeMap<String, RawPolicy>,
    #[serde(default)]
    overrides: Vec<overrides::RawOverride>,
}

/// Whether validating a configuration reads the files it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Files {
    /// Read and check them (loading a configuration to serve).
    Check,
    /// Leave them alone (a policy reload).
    Skip,
}

impl Default for Config {
    /// The configuration with no file and no flags.
    fn default() -> Self {
        Config::parse("", None, &FlagValues::default(), Files::Skip)
            .expect("the built-in defaults are a valid configuration")
    }
}

impl Config {
    /// Reads `path` (if any), applies `flags` and validates the result,
    /// TLS files included. Without a file, every setting not given as a flag
    /// takes its default.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the file or the field that is wrong.
    pub fn load(path: Option<&Path>, flags: &FlagValues) -> Result<Config, ConfigError> {
        match path {
            None => Config::parse("", None, flags, Files::Check),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                Config::parse(&text, Some(path), flags, Files::Check)
            }
        }
    }

    /// Validates a configuration given as TOML text, with no flags,
    /// TLS files included. Relative TLS paths are resolved against the
    /// working directory.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the field that is wrong.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, None, &FlagValues::default(), Files::Check)
    }

    /// Validates `text`, read from `path` when given (policies then reload
    /// from it), with `flags` applied, and reads the files it names
    /// when `files` says so. A policy reload skips them: it must not fail
    /// because a certificate is being rotated.
    pub(crate) fn parse(
        text: &str,
        path: Option<&Path>,
        flags: &FlagValues,
        files: Files,
    ) -> Result<Config, ConfigError> {
        let layers = Layers::merge(text, flags)?;
        let raw: RawConfig = layers.deserialize()?;
        let located = |(field, message): Invalid| {
            let path: Vec<&str> = field.iter().map(String::as_str).collect();
            ConfigError::Invalid {
                field: display_path(&path),
                message,
                origin: layers.origin_of(&path),
            }
        };
        let base_dir = path.and_then(Path::parent);
        let server = validate_server(raw.server, base_dir).map_err(located)?;
        if let (Files::Check, Some(tls)) = (files, &server.tls) {
            tls.check().map_err(|e| {
                let field = ["server", "tls", e.field].map(str::to_owned).to_vec();
                located((field, e.message))
            })?;
        }
        let store = StoreSettings::validate(raw.store, base_dir).map_err(located)?;
        let needed = transport::largest_request_bytes(store.max_key_bytes);
        let transport = TransportSettings::validate(raw.transport, needed).map_err(located)?;
        let mtls = server.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
        let auth = AuthSettings::validate(raw.auth, mtls).map_err(located)?;
        let log = LogSettings::validate(raw.log).map_err(located)?;
        let policies = policies::validate(raw.policies, store.on_error).map_err(located)?;
        let file_overrides =
            overrides::validate(raw.overrides, &policies, raw.limits.max_overrides)
                .map_err(located)?;
        store.check_fallback(&policies).map_err(located)?;
        // A relative rules folder from the file is the file's neighbour; one
        // from a flag or the environment is the working directory's.
        let rls_base = match layers.origin_of(&["rls", "config_dir"]) {
            Origin::File(_) => base_dir,
            Origin::Flag | Origin::Default => None,
        };
        let mut rls = RlsSettings::validate(raw.rls, rls_base).map_err(located)?;
        if files == Files::Check {
            rls.load_rules()?;
        }
        let rlqs_base = match layers.origin_of(&["rlqs", "rules"]) {
            Origin::File(_) => base_dir,
            Origin::Flag | Origin::Default => None,
        };
        let rlqs = RlqsSettings::validate(raw.rlqs, rlqs_base).map_err(located)?;
        Ok(Config {
            server,
            transport,
            auth,
            log,
            store,
            limits: raw.limits,
            policies,
            overrides: file_overrides,
            rls,
            rlqs,
            effective: layers.merged().clone(),
            source: path.map(|path| Source {
                path: path.to_owned(),
                flags: flags.clone(),
                contents: text.as_bytes().to_vec(),
            }),
            clock: Arc::new(SystemClock),
        })
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

    /// `[transport]`.
    pub fn transport(&self) -> &TransportSettings {
        &self.transport
    }

    /// `[auth]`.
    pub fn auth(&self) -> &AuthSettings {
        &self.auth
    }

    /// `[log]`.
    pub fn log(&self) -> &LogSettings {
        &self.log
    }

    /// `[store]`.
    pub fn store(&self) -> &StoreSettings {
        &self.store
    }

    /// `[limits]`.
    pub fn limits(&self) -> &LimitSettings {
        &self.limits
    }

    /// `[rls]`: Envoy's rate limit service.
    pub fn rls(&self) -> &RlsSettings {
        &self.rls
    }

    /// `[rlqs]`: Envoy's rate limit quota service.
    pub fn rlqs(&self) -> &RlqsSettings {
        &self.rlqs
    }

    /// `[[overrides]]`, in file order.
    pub(crate) fn overrides(&self) -> &[overrides::Override] {
        &self.overrides
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

    /// The settings that differ from `other` and take effect only on a
    /// restart (everything declared [`Reload::Restart`]), by path.
    pub fn restart_required_changes(&self, other: &Config) -> Vec<&'static str> {
        self.changed_settings(other, Reload::Restart)
    }

    /// The settings that differ from `other` and a reload applies
    /// (everything declared [`Reload::Live`] but the policies), by path.
    pub fn live_changes(&self, other: &Config) -> Vec<&'static str> {
        self.changed_settings(other, Reload::Live)
    }

    fn changed_settings(&self, other: &Config, reload: Reload) -> Vec<&'static str> {
        settings::all()
            .filter(|s| s.reload == reload && s.kind != Kind::Table)
            .filter(|s| lookup(&self.effective, s.path) != lookup(&other.effective, s.path))
            .map(|s| s.path)
            .collect()
    }
}

/// The value at a dotted path of a table.
fn lookup<'a>(table: &'a toml::Table, path: &str) -> Option<&'a toml::Value> {
    let mut keys = path.split('.');
    let mut value = table.get(keys.next()?)?;
    for key in keys {
        value = value.as_table()?.get(key)?;
    }
    Some(value)
}

/// A field path as written in messages: `policies."a:b"` for a key that is
/// not a bare TOML key.
fn display_path(path: &[&str]) -> String {
    path.iter()
        .map(|segment| {
            let bare = !segment.is_empty()
                && segment
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if bare {
                (*segment).to_owned()
            } else {
                format!("{segment:?}")
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn validate_server(
    section: ServerSection,
    base_dir: Option<&Path>,
) -> Result<ServerSettings, Invalid> {
    let invalid = |path: &[&str], message: String| {
        (
            path.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
            message,
        )
    };
    if section.worker_threads == Some(0) {
        return Err(invalid(
            &["server", "worker_threads"],
            "worker_threads must be at least 1 (leave it out for one per core)".to_owned(),
        ));
    }
    if let ListenAddr::Tcp(grpc) = section.grpc_addr
        && grpc == section.admin_addr
        && grpc.port() != 0
    {
        return Err(invalid(
            &["server", "admin_addr"],
            format!("must differ from server.grpc_addr ({grpc})"),
        ));
    }
    let unix_socket_mode = u32::from_str_radix(&section.unix_socket_mode, 8)
        .ok()
        .filter(|mode| *mode <= 0o777)
        .ok_or_else(|| {
            invalid(
                &["server", "unix_socket_mode"],
                format!(
                    "{:?} is not a file mode: write permission bits in octal, e.g. \"0660\"",
                    section.unix_socket_mode
                ),
            )
        })?;
    if matches!(section.grpc_addr, ListenAddr::Unix(_)) && section.tls.is_some() {
        return Err(invalid(
            &["server", "tls"],
            "TLS is for a TCP grpc_addr; a unix socket is guarded by its file mode (server.unix_socket_mode)".to_owned(),
        ));
    }
    let tls = section
        .tls
        .map(|tls| validate_tls(tls, base_dir))
        .transpose()
        .map_err(|(field, message)| invalid(&["server", "tls", field], message))?;
    Ok(ServerSettings {
        grpc_addr: section.grpc_addr,
        unix_socket_mode,
        admin_addr: section.admin_addr,
        tls,
        config_poll_interval: section.config_poll_interval,
        worker_threads: section.worker_threads,
        shutdown_delay: section.shutdown_delay,
        readiness_follows_store: section.readiness_follows_store,
    })
}

fn validate_tls(
    section: TlsSection,
    base_dir: Option<&Path>,
) -> Result<TlsSettings, (&'static str, String)> {
    let resolve = |p: PathBuf| match base_dir {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p,
    };
    let required = |value: Option<PathBuf>, field: &'static str| {
        value.map(resolve).ok_or_else(|| {
            (
                field,
                format!("{field} is required when [server.tls] is set"),
            )
        })
    };
    Ok(TlsSettings {
        cert: required(section.cert, "cert")?,
        key: required(section.key, "key")?,
        client_ca: section.client_ca.map(resolve),
    })
}

/// Where a server listens: a TCP address, or a unix socket's path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    /// `host:port`.
    Tcp(SocketAddr),
    /// `unix:///path/to.sock` (or `unix:path`).
    Unix(PathBuf),
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => write!(f, "{addr}"),
            ListenAddr::Unix(path) => write!(f, "unix://{}", path.display()),
        }
    }
}

impl std::str::FromStr for ListenAddr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if let Some(rest) = text.strip_prefix("unix:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(format!(
                    "{text:?}: a unix address needs a path, e.g. unix:///run/quotad/grpc.sock"
                ));
            }
            let path = PathBuf::from(path);
            let longest = crate::listen::UnixSocket::longest_path_bytes(&path);
            if longest > crate::listen::MAX_UNIX_PATH_BYTES {
                return Err(format!(
                    "{text:?}: a unix socket path (and the temporary name it is bound under first, \
                     {longest} bytes) must be at most {} bytes",
                    crate::listen::MAX_UNIX_PATH_BYTES
                ));
            }
            return Ok(ListenAddr::Unix(path));
        }
        text.parse().map(ListenAddr::Tcp).map_err(|e| {
            format!(
                "{text:?}: {e} (write host:port, e.g. 127.0.0.1:50051, or unix:///path/to.sock)"
            )
        })
    }
}

impl<'de> Deserialize<'de> for ListenAddr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// A duration written the human way: `"1m"`, `"500ms"`, `"1h 30m"`.
fn human_duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    deserializer.deserialize_any(HumanDuration)
}

/// A duration as written: text with its unit. A bare number is refused
/// with the way to write it (milliseconds or seconds? a reader of the file
/// could not tell either).
struct HumanDuration;

impl serde::de::Visitor<'_> for HumanDuration {
    type Value = Duration;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a duration written as text with its unit, e.g. \"1s\", \"1m\", \"500ms\"")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Duration, E> {
        humantime::parse_duration(text).map_err(|e| {
            E::custom(format!(
                "invalid duration {text:?}: {e} (write e.g. \"1s\", \"1m\", \"500ms\")"
            ))
        })
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "a duration is written as text with its unit: \"{n}ms\" or \"{n}s\", not {n}"
        )))
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "a duration is written as text with its unit: \"{n}ms\" or \"{n}s\", not {n}"
        )))
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<Duration, E> {
        Err(E::custom(format!(
            "a duration is written as text with its unit (e.g. \"1500ms\" for 1.5 s), not {n}"
        )))
    }
}

#[cfg(test)]
mod tests;
