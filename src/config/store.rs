//! `[store]`, validated: where state lives, and the rules every backend
//! shares.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::num::NonZeroU32;

use quotad_core::{OnFull, StoreConfig, StoreConfigError};

use super::policies::{Invalid, OnError};
use super::redis::{RedisSettings, RedisTarget, RedisTls, redact};
use super::settings::{
    BackendKind, FallbackSection, OnBadSnapshot, RedisSection, SnapshotSection, StoreSection,
};
use super::tls::{TlsFileError, check_certificates, check_private_key, read_file};

/// Why a Redis URL is invalid, without the URL: a password written with
/// a character that ends the URL's authority (`#`, `/`, `?`, ...) is where
/// the URL stops making sense, so no part of it past the scheme is shown.
fn bad_url(url: &str, e: &redis::RedisError) -> String {
    let scheme = url
        .split_once("://")
        .map(|(scheme, _)| scheme)
        .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '+'));
    let reason = redact(&e.to_string());
    match scheme {
        Some(scheme) => format!(
            "not a valid {scheme}:// URL ({reason}); the URL is not shown, as it may hold a password (write '#', '/', '?', '@' and '%' in one as %23, %2F, %3F, %40 and %25)"
        ),
        None => format!(
            "not a valid Redis URL ({reason}): it must start with redis://, rediss:// or redis+unix://"
        ),
    }
}

/// The largest `store.max_key_bytes`: the request size bound grows 1,000
/// times with it (a full batch of the longest keys).
pub(crate) const MAX_KEY_BYTES: usize = 64 * 1024;

/// `[store]`: the backend with its own settings, and what every backend
/// shares.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct StoreSettings {
    /// `store.max_key_bytes`: the longest key accepted, in bytes.
    pub max_key_bytes: usize,
    /// `store.on_error`: what checks answer when the store fails, unless
    /// their policy says otherwise (inline policies always use this).
    pub on_error: OnError,
    /// `store.backend` and its settings.
    pub backend: BackendSettings,
    /// `[store.fallback]`: the local decisions of `on_error = "local"`.
    pub fallback: FallbackSettings,
}

/// `[store.fallback]`, validated.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct FallbackSettings {
    /// `store.fallback.replicas`: the divisor of every limit during an
    /// outage; required (checked with the policies) when a policy on
    /// Redis says `on_error = "local"`.
    pub replicas: Option<NonZeroU32>,
    /// `store.fallback.max_keys`: the local store's bound; new keys are
    /// denied past it.
    pub store: StoreConfig,
}

impl StoreSettings {
    /// The first `on_error = "local"` that cannot be honoured: on Redis it
    /// needs `store.fallback.replicas`, which is what keeps the fleet
    /// within the limit. `store.on_error` first, then the policies by name.
    pub(super) fn check_fallback(
        &self,
        policies: &std::collections::BTreeMap<String, super::PolicySettings>,
    ) -> Result<(), Invalid> {
        if !matches!(self.backend, BackendSettings::Redis(_)) || self.fallback.replicas.is_some() {
            return Ok(());
        }
        let message = "on_error = \"local\" on the Redis backend needs store.fallback.replicas: how many quotad replicas share the Redis, which divides every limit while it is down";
        if self.on_error == OnError::Local {
            return Err(invalid(&["store", "on_error"], message));
        }
        match policies.iter().find(|(_, p)| p.on_error == OnError::Local) {
            Some((name, _)) => Err(invalid(&["policies", name, "on_error"], message)),
            None => Ok(()),
        }
    }
}

/// The state backend, with the settings that apply to it.
#[derive(Clone, Debug, PartialEq)]
pub enum BackendSettings {
    /// The embedded sharded store.
    Memory(MemorySettings),
    /// Redis, standalone or Cluster: quotad replicas are stateless and
    /// share one budget.
    Redis(RedisSettings),
}

impl BackendSettings {
    /// As `store.backend` names it.
    pub fn name(&self) -> &'static str {
        match self {
            BackendSettings::Memory(_) => "memory",
            BackendSettings::Redis(_) => "redis",
        }
    }
}

/// The memory store's settings.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct MemorySettings {
    /// `store.max_keys`, `store.max_bytes`, `store.shards` and
    /// `store.on_full`, validated (the shards in use may be fewer than
    /// configured for a small `max_keys`).
    pub store: StoreConfig,
    /// `store.sweep_interval`: the time in which the incremental sweep
    /// visits every shard once, dropping state that has become fresh.
    pub sweep_interval: Duration,
    /// `[store.snapshot]`: keeping the state across restarts.
    pub snapshot: Option<SnapshotSettings>,
}

/// `[store.snapshot]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SnapshotSettings {
    /// `store.snapshot.path`: the file, resolved against the config file's
    /// folder.
    pub path: std::path::PathBuf,
    /// `store.snapshot.interval`: how often it is also written while
    /// serving; `None` for only on shutdown.
    pub interval: Option<Duration>,
    /// `store.snapshot.on_bad_file`.
    pub on_bad_file: OnBadSnapshot,
}

fn invalid(path: &[&str], message: impl Into<String>) -> Invalid {
    (
        path.iter().map(|s| (*s).to_owned()).collect(),
        message.into(),
    )
}

impl StoreSettings {
    pub(super) fn validate(
        section: StoreSection,
        base_dir: Option<&Path>,
    ) -> Result<Self, Invalid> {
        if !(1..=MAX_KEY_BYTES).contains(&section.max_key_bytes) {
            return Err(invalid(
                &["store", "max_key_bytes"],
                format!("max_key_bytes must be from 1 to {MAX_KEY_BYTES}"),
            ));
        }
        let backend = match section.backend {
            BackendKind::Memory => {
                let bytes = usize::try_from(section.max_bytes.as_u64()).unwrap_or(usize::MAX);
                let store = StoreConfig::try_new(section.max_keys, section.shards, section.on_full)
                    .and_then(|store| store.with_max_bytes(bytes))
                    .map_err(|e| {
                        let field = match e {
                            StoreConfigError::MaxKeysZero => "max_keys",
                            StoreConfigError::ShardsNotPowerOfTwo(_) => "shards",
                            StoreConfigError::MaxBytesTooSmall { .. } => "max_bytes",
                        };
                        invalid(&["store", field], e.to_string())
                    })?;
                if section.sweep_interval.is_zero() {
                    return Err(invalid(
                        &["store", "sweep_interval"],
                        "sweep_interval must be longer than zero",
                    ));
                }
                BackendSettings::Memory(MemorySettings {
                    store,
                    sweep_interval: section.sweep_interval,
                    snapshot: section
                        .snapshot
                        .map(|s| snapshot_settings(s, base_dir))
                        .transpose()?,
                })
            }
            BackendKind::Redis if section.snapshot.is_some() => {
                return Err(invalid(
                    &["store", "snapshot"],
                    "snapshots are of the memory store; Redis keeps the state of backend \"redis\"",
                ));
            }
            BackendKind::Redis => match section.redis {
                Some(redis) => BackendSettings::Redis(redis_settings(redis, base_dir)?),
                None => {
                    return Err(invalid(
                        &["store", "backend"],
                        "\"redis\" needs a [store.redis] section with url or cluster_nodes",
                    ));
                }
            },
        };
        Ok(StoreSettings {
            max_key_bytes: section.max_key_bytes,
            on_error: section.on_error,
            backend,
            fallback: fallback_settings(section.fallback)?,
        })
    }
}

/// The local fallback's store: the keys it may hold, in few shards (it
/// serves only during an outage), denying new keys when full, since
/// evicting one would hand its budget out again.
fn fallback_settings(section: Option<FallbackSection>) -> Result<FallbackSettings, Invalid> {
    let (replicas, max_keys) = match section {
        Some(s) => (s.replicas, s.max_keys),
        None => (None, FALLBACK_MAX_KEYS),
    };
    let replicas = match replicas {
        None => None,
        Some(n) => Some(NonZeroU32::new(n).ok_or_else(|| {
            invalid(
                &["store", "fallback", "replicas"],
                "replicas must be at least 1",
            )
        })?),
    };
    let store = StoreConfig::try_new(max_keys, FALLBACK_SHARDS, OnFull::Deny)
        .map_err(|e| invalid(&["store", "fallback", "max_keys"], e.to_string()))?;
    Ok(FallbackSettings { replicas, store })
}

/// `store.fallback.max_keys` when `[store.fallback]` is left out, as its
/// declared default.
const FALLBACK_MAX_KEYS: usize = 100_000;

/// Lock shards of the local fallback store.
const FALLBACK_SHARDS: usize = 16;

fn snapshot_settings(
    section: SnapshotSection,
    base_dir: Option<&Path>,
) -> Result<SnapshotSettings, Invalid> {
    let path = section.path.ok_or_else(|| {
        invalid(
            &["store", "snapshot", "path"],
            "path is required when [store.snapshot] is set",
        )
    })?;
    let path = match base_dir {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path,
    };
    Ok(SnapshotSettings {
        path,
        interval: (!section.interval.is_zero()).then_some(section.interval),
        on_bad_file: section.on_bad_file,
    })
}

fn redis_settings(
    section: RedisSection,
    base_dir: Option<&Path>,
) -> Result<RedisSettings, Invalid> {
    let check_url = |url: &str, field: &'static str| {
        redis::IntoConnectionInfo::into_connection_info(url)
            .map(|_| ())
            .map_err(|e| invalid(&["store", "redis", field], bad_url(url, &e)))
    };
    let target = match (section.url, section.cluster_nodes, section.sentinel_nodes) {
        (Some(url), None, Some(sentinels)) => {
            check_url(&url, "url")?;
            if sentinels.is_empty() {
                return Err(invalid(
                    &["store", "redis", "sentinel_nodes"],
                    "must name at least one sentinel",
                ));
            }
            for node in &sentinels {
                check_url(node, "sentinel_nodes")?;
            }
            RedisTarget::Sentinel {
                master: url,
                sentinels,
            }
        }
        (None, None, Some(_)) => {
            return Err(invalid(
                &["store", "redis", "url"],
                "with sentinel_nodes, url names the master set by its host and carries its password and database, e.g. redis://:secret@mymaster/0",
            ));
        }
        (_, Some(_), Some(_)) => {
            return Err(invalid(
                &["store", "redis"],
                "set cluster_nodes or sentinel_nodes, not both",
            ));
        }
        (Some(url), None, None) => {
            check_url(&url, "url")?;
            RedisTarget::Standalone(url)
        }
        (None, Some(nodes), None) if !nodes.is_empty() => {
            for node in &nodes {
                check_url(node, "cluster_nodes")?;
            }
            RedisTarget::Cluster(nodes)
        }
        (None, Some(_), None) => {
            return Err(invalid(
                &["store", "redis", "cluster_nodes"],
                "must name at least one node",
            ));
        }
        (Some(_), Some(_), None) => {
            return Err(invalid(
                &["store", "redis"],
                "set url or cluster_nodes, not both",
            ));
        }
        (None, None, None) => {
            return Err(invalid(
                &["store", "redis"],
                "set url (standalone), cluster_nodes (Redis Cluster), or url and sentinel_nodes (Redis Sentinel)",
            ));
        }
    };
    if section.timeout.is_zero() {
        return Err(invalid(
            &["store", "redis", "timeout"],
            "timeout must be longer than zero",
        ));
    }
    if section.reconnect_after_timeouts == 0 {
        return Err(invalid(
            &["store", "redis", "reconnect_after_timeouts"],
            "reconnect_after_timeouts must be at least 1",
        ));
    }
    if section.max_atomic_items < 4 {
        return Err(invalid(
            &["store", "redis", "max_atomic_items"],
            "max_atomic_items must be at least 4 (one sliding log)",
        ));
    }
    if section.key_prefix.is_empty()
        || section.key_prefix.contains(['{', '}', '|'])
        || section.key_prefix.chars().any(char::is_whitespace)
    {
        return Err(invalid(
            &["store", "redis", "key_prefix"],
            format!(
                "{:?}: must be non-empty, without braces, '|' or spaces (braces would change the Redis Cluster hash tag)",
                section.key_prefix
            ),
        ));
    }
    if section.overrides_poll_interval.is_zero() {
        return Err(invalid(
            &["store", "redis", "overrides_poll_interval"],
            "overrides_poll_interval must be longer than zero",
        ));
    }
    let mut settings = RedisSettings::new(target, section.timeout);
    settings.overrides_poll_interval = section.overrides_poll_interval;
    settings.reconnect_after_timeouts = section.reconnect_after_timeouts;
    settings.required_at_start = section.required_at_start;
    settings.key_prefix = section.key_prefix;
    settings.max_atomic_items = section.max_atomic_items as usize;
    settings.tls = redis_tls(section.tls_ca, section.tls_cert, section.tls_key, base_dir)?;
    let plain = match &settings.target {
        RedisTarget::Standalone(url) => (!url.starts_with("rediss://")).then_some("url"),
        RedisTarget::Cluster(nodes) => nodes
            .iter()
            .any(|n| !n.starts_with("rediss://"))
            .then_some("cluster_nodes"),
        RedisTarget::Sentinel { master, sentinels } => {
            if !master.starts_with("rediss://") {
                Some("url")
            } else {
                sentinels
                    .iter()
                    .any(|n| !n.starts_with("rediss://"))
                    .then_some("sentinel_nodes")
            }
        }
    };
    if let (true, Some(field)) = (settings.tls.is_set(), plain) {
        return Err(invalid(
            &["store", "redis", field],
            "tls_ca, tls_cert and tls_key are for TLS: write the URL as rediss://",
        ));
    }
    Ok(settings)
}

/// `store.redis.tls_*`: the paths resolved against the config file's
/// folder, and each file checked.
fn redis_tls(
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    base_dir: Option<&Path>,
) -> Result<RedisTls, Invalid> {
    let resolve = |path: PathBuf| match base_dir {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path,
    };
    let client = match (cert, key) {
        (Some(cert), Some(key)) => Some((resolve(cert), resolve(key))),
        (None, None) => None,
        (Some(_), None) => {
            return Err(invalid(
                &["store", "redis", "tls_key"],
                "tls_cert needs its private key in tls_key",
            ));
        }
        (None, Some(_)) => {
            return Err(invalid(
                &["store", "redis", "tls_cert"],
                "tls_key needs its certificate in tls_cert",
            ));
        }
    };
    let tls = RedisTls {
        ca: ca.map(resolve),
        client,
    };
    let checked = || -> Result<(), TlsFileError> {
        if let Some(ca) = &tls.ca {
            check_certificates(&read_file(ca, "tls_ca")?, "tls_ca", ca)?;
        }
        if let Some((cert, key)) = &tls.client {
            check_certificates(&read_file(cert, "tls_cert")?, "tls_cert", cert)?;
            check_private_key(&read_file(key, "tls_key")?, "tls_key", key)?;
        }
        Ok(())
    };
    checked().map_err(|e| invalid(&["store", "redis", e.field], e.message))?;
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use crate::Config;

    fn error_for(url: &str) -> String {
        let toml = format!("[store]\nbackend = \"redis\"\n\n[store.redis]\nurl = {url:?}\n");
        Config::from_toml(&toml)
            .expect_err("an invalid URL is a config error")
            .to_string()
    }

    #[test]
    fn an_invalid_redis_url_is_named_by_its_field_and_never_shown() {
        for c in ['#', '/', '?', '"', ' '] {
            let url = format!("redis://user:s3cr{c}et@h:6379/0");
            if redis::IntoConnectionInfo::into_connection_info(url.as_str()).is_ok() {
                continue;
            }
            let message = error_for(&url);
            assert!(message.contains("store.redis.url"), "{c:?}: {message}");
            assert!(!message.contains("s3cr"), "{c:?}: {message}");
            assert!(!message.contains("et@"), "{c:?}: {message}");
            assert!(message.contains("redis://"), "{c:?}: {message}");
        }
        let message = error_for("http://user:pw@h");
        assert!(!message.contains("pw"), "{message}");
    }

    const REDIS: &str =
        "[store]\nbackend = \"redis\"\n\n[store.redis]\nurl = \"redis://127.0.0.1:6379/\"\n";

    const LOCAL_POLICY: &str = "\n[policies.api]\nalgorithm = \"fixed_window\"\nlimit = 30\nwindow = \"1s\"\non_error = \"local\"\n";

    #[test]
    fn a_local_fallback_on_redis_needs_the_replica_count_and_the_error_names_the_policy() {
        let message = Config::from_toml(&format!("{REDIS}{LOCAL_POLICY}"))
            .expect_err("no replica count")
            .to_string();
        assert!(message.contains("policies.api.on_error"), "{message}");
        assert!(message.contains("store.fallback.replicas"), "{message}");
        let message =
            Config::from_toml(&REDIS.replace("[store]\n", "[store]\non_error = \"local\"\n"))
                .expect_err("no replica count")
                .to_string();
        assert!(message.contains("store.on_error"), "{message}");
        let config = Config::from_toml(&format!(
            "{REDIS}\n[store.fallback]\nreplicas = 3\n{LOCAL_POLICY}"
        ))
        .expect("valid");
        assert_eq!(config.store().fallback.replicas.map(|n| n.get()), Some(3));
        // The memory store never fails: nothing to fall back from.
        Config::from_toml(LOCAL_POLICY).expect("valid on the memory store");
    }

    #[test]
    fn a_replica_count_of_zero_is_refused() {
        let message = Config::from_toml(&format!("{REDIS}\n[store.fallback]\nreplicas = 0\n"))
            .expect_err("zero replicas")
            .to_string();
        assert!(message.contains("store.fallback.replicas"), "{message}");
    }

    #[test]
    fn every_character_that_ends_an_authority_makes_the_url_invalid_or_is_kept_out_of_errors() {
        // '#' and '?' end the authority before the '@': the host is then
        // "user" and the port "s3cr", which no Redis URL parser accepts.
        for c in ['#', '?'] {
            let url = format!("redis://user:s3cr{c}et@h:6379/0");
            assert!(
                redis::IntoConnectionInfo::into_connection_info(url.as_str()).is_err(),
                "{c:?}"
            );
            assert!(!error_for(&url).contains("s3cr"));
        }
    }
}
