//! `[[overrides]]`: overrides of named policies kept in the config file
//! (for people who keep them in git), hot-reloaded with the policies, and
//! the override type the admin API writes too (`crate::registry` applies
//! both).
//!
//! ```toml
//! [[overrides]]
//! policy = "api"
//! prefix = "tenant:acme:"     # or key = "tenant:acme:42"
//! limit = 1000
//! window = "1m"               # default: the policy's
//! burst = 2000                # buckets only; default: limit
//! expires_at = "2027-01-01T00:00:00Z"   # default: never
//! ```
//!
//! For the same policy and key (or prefix), a runtime override (the admin
//! API) wins over the file's.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use quotad_core::Policy;
use serde::{Deserialize, Serialize};

use super::PolicySettings;
use super::policies::Invalid;

/// What an override applies to under its policy.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Scope {
    /// Exactly this key.
    Key(String),
    /// Every key that starts with this (non-empty) prefix.
    Prefix(String),
}

impl Scope {
    /// `key "K"` or `prefix "P"`, for logs and errors.
    pub(crate) fn describe(&self) -> String {
        match self {
            Scope::Key(k) => format!("key {k:?}"),
            Scope::Prefix(p) => format!("prefix {p:?}"),
        }
    }
}

/// Where an override was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Source {
    /// The config file's `[[overrides]]`.
    File,
    /// The admin API (`quotad override set`).
    Runtime,
}

impl Source {
    /// Its `source` label in `quotad_overrides`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Source::File => "file",
            Source::Runtime => "runtime",
        }
    }
}

/// One override as written: the numbers replace the policy's; a missing
/// window is the policy's, a missing burst is the override's limit (as a
/// policy's burst defaults to its limit).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Override {
    pub(crate) policy: String,
    pub(crate) scope: Scope,
    pub(crate) limit: u64,
    pub(crate) window_ms: Option<u64>,
    pub(crate) burst: Option<u64>,
    /// When it stops being in force, in ms since the Unix epoch.
    pub(crate) expires_at_ms: Option<u64>,
    pub(crate) source: Source,
    /// Who wrote it (the caller's identity, or the file).
    pub(crate) set_by: String,
    /// When it was written, in ms since the Unix epoch.
    pub(crate) set_at_ms: u64,
}

/// Why an override cannot apply to its policy: the field and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub(crate) struct InvalidOverride {
    pub(crate) field: &'static str,
    pub(crate) message: String,
}

impl InvalidOverride {
    fn new(field: &'static str, message: impl Into<String>) -> Self {
        InvalidOverride {
            field,
            message: message.into(),
        }
    }
}

impl Override {
    /// The policy its keys are counted by, given the named policy `base`:
    /// `base`'s algorithm with the override's numbers.
    ///
    /// # Errors
    ///
    /// The field that breaks a rule of [`Policy::try_new`] (`limit`,
    /// `window_ms` or `burst`), or an empty key or prefix.
    pub(crate) fn effective(&self, base: &Policy) -> Result<Policy, InvalidOverride> {
        match &self.scope {
            Scope::Key(k) if k.is_empty() => {
                return Err(InvalidOverride::new("key", "must not be empty"));
            }
            Scope::Prefix(p) if p.is_empty() => {
                return Err(InvalidOverride::new(
                    "prefix",
                    "must not be empty (an override for every key is the policy itself)",
                ));
            }
            Scope::Key(_) | Scope::Prefix(_) => {}
        }
        let made = if let Some(calendar) = base.calendar_period() {
            // A calendar policy's windows are its local periods: only its
            // limit can be overridden, and the count stays the period's.
            if self.window_ms.is_some() {
                return Err(InvalidOverride::new(
                    "window_ms",
                    "a calendar policy's windows are its periods: override its limit only",
                ));
            }
            if self.burst.is_some() {
                return Err(InvalidOverride::new(
                    "burst",
                    "a calendar policy has no burst: override its limit only",
                ));
            }
            Policy::calendar(base.algorithm(), self.limit, calendar)
        } else {
            let window_ms = self.window_ms.unwrap_or_else(|| base.window_ms());
            if window_ms == 0 {
                return Err(InvalidOverride::new("window_ms", "must be at least 1"));
            }
            let window = Duration::from_millis(window_ms);
            Policy::try_new(base.algorithm(), self.limit, window, self.burst)
        };
        made.map_err(|e| {
            use quotad_core::PolicyError as E;
            let field = match e {
                E::BurstZero | E::BurstNotApplicable(_) | E::BurstWindowTooLarge { .. } => "burst",
                E::WindowTooShort | E::WindowNotWholeMillis(_) | E::SlotTtl(_) => "window_ms",
                _ => "limit",
            };
            InvalidOverride::new(field, e.to_string())
        })
    }

    /// Its numbers and expiry, for audit lines: `limit=100 window=1000ms
    /// burst=- expires_at=-`.
    pub(crate) fn numbers(&self) -> String {
        let opt =
            |v: Option<u64>, unit: &str| v.map_or_else(|| "-".to_owned(), |v| format!("{v}{unit}"));
        format!(
            "limit={} window={} burst={} expires_at={}",
            self.limit,
            opt(self.window_ms, "ms"),
            opt(self.burst, ""),
            opt(self.expires_at_ms, ""),
        )
    }

    /// Whether it is in force at `now_ms`.
    pub(crate) fn live_at(&self, now_ms: u64) -> bool {
        self.expires_at_ms.is_none_or(|at| now_ms < at)
    }
}

/// `[[overrides]]` entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOverride {
    policy: String,
    key: Option<String>,
    prefix: Option<String>,
    limit: u64,
    #[serde(default, deserialize_with = "super::policies::some_duration")]
    window: Option<Duration>,
    burst: Option<u64>,
    /// RFC 3339, e.g. `2027-01-01T00:00:00Z`.
    expires_at: Option<String>,
}

/// Validates the file's overrides against its policies, at most
/// `max_per_policy` per policy. Errors name `overrides.N.field`.
pub(super) fn validate(
    raw: Vec<RawOverride>,
    policies: &BTreeMap<String, PolicySettings>,
    max_per_policy: u64,
) -> Result<Vec<Override>, Invalid> {
    let mut seen = BTreeSet::new();
    let mut per_policy: BTreeMap<String, u64> = BTreeMap::new();
    let mut out = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        let at = |field: &str| vec!["overrides".to_owned(), i.to_string(), field.to_owned()];
        let Some(settings) = policies.get(&r.policy) else {
            return Err((at("policy"), format!("no policy named {:?}", r.policy)));
        };
        let scope = match (r.key, r.prefix) {
            (Some(k), None) => Scope::Key(k),
            (None, Some(p)) => Scope::Prefix(p),
            _ => {
                return Err((
                    vec!["overrides".to_owned(), i.to_string()],
                    "give exactly one of key and prefix".to_owned(),
                ));
            }
        };
        let window_ms = r
            .window
            .map(|w| u64::try_from(w.as_millis()).unwrap_or(u64::MAX));
        let expires_at_ms = r
            .expires_at
            .map(|text| {
                humantime::parse_rfc3339_weak(&text)
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .and_then(|d| u64::try_from(d.as_millis()).ok())
                    .ok_or_else(|| {
                        (
                            at("expires_at"),
                            format!("{text:?}: not an RFC 3339 time such as 2027-01-01T00:00:00Z"),
                        )
                    })
            })
            .transpose()?;
        let entry = Override {
            policy: r.policy,
            scope,
            limit: r.limit,
            window_ms,
            burst: r.burst,
            expires_at_ms,
            source: Source::File,
            set_by: "config file".to_owned(),
            set_at_ms: 0,
        };
        entry.effective(&settings.policy).map_err(|e| {
            let field = match e.field {
                "window_ms" => "window",
                other => other,
            };
            (at(field), e.message)
        })?;
        if !seen.insert((entry.policy.clone(), entry.scope.clone())) {
            return Err((
                vec!["overrides".to_owned(), i.to_string()],
                format!(
                    "a second override of policy {:?} for {}",
                    entry.policy,
                    entry.scope.describe()
                ),
            ));
        }
        let n = per_policy.entry(entry.policy.clone()).or_default();
        *n += 1;
        if *n > max_per_policy {
            return Err((
                vec!["overrides".to_owned(), i.to_string()],
                format!(
                    "policy {:?} has more than limits.max_overrides ({max_per_policy}) overrides",
                    entry.policy
                ),
            ));
        }
        out.push(entry);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const API: &str = "[policies.api]\nalgorithm = \"token_bucket\"\nlimit = 10\nwindow = \"1s\"\n";

    fn error(overrides: &str) -> String {
        Config::from_toml(&format!("{API}{overrides}"))
            .expect_err("invalid")
            .to_string()
    }

    #[test]
    fn an_override_of_a_calendar_policy_keeps_its_periods_and_changes_its_limit_only() {
        let config = Config::from_toml(
            "[policies.daily]\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"day\"\ntime_zone = \"America/New_York\"\n\n[[overrides]]\npolicy = \"daily\"\nkey = \"big\"\nlimit = 5000\n",
        )
        .expect("valid");
        let base = config.policies()["daily"].policy;
        let entry = &config.overrides()[0];
        let effective = entry.effective(&base).expect("a limit override");
        assert_eq!(effective.limit(), 5000);
        assert_eq!(effective.calendar_period(), base.calendar_period());
        // The same windows, so the same state: the count is kept.
        assert_eq!(
            effective.window_bounds(1_700_000_000_000),
            base.window_bounds(1_700_000_000_000)
        );
        for (extra, field) in [
            ("window = \"1h\"\n", "overrides.0.window"),
            ("burst = 9\n", "overrides.0.burst"),
        ] {
            let text = format!(
                "[policies.daily]\nalgorithm = \"fixed_window\"\nlimit = 1000\nperiod = \"day\"\n\n[[overrides]]\npolicy = \"daily\"\nkey = \"big\"\nlimit = 5000\n{extra}"
            );
            let error = Config::from_toml(&text).expect_err("refused").to_string();
            assert!(error.contains(field), "{field}: {error}");
        }
    }

    #[test]
    fn file_overrides_are_validated_with_the_field_and_line() {
        let ok = Config::from_toml(&format!(
            "{API}[[overrides]]\npolicy = \"api\"\nprefix = \"t:\"\nlimit = 50\nburst = 80\nexpires_at = \"2027-01-01T00:00:00Z\"\n"
        ))
        .expect("valid");
        let entry = &ok.overrides()[0];
        assert_eq!((entry.limit, entry.burst), (50, Some(80)));
        assert_eq!(entry.expires_at_ms, Some(1_798_761_600_000));
        assert_eq!(
            error("[[overrides]]\npolicy = \"nope\"\nkey = \"k\"\nlimit = 5\n"),
            "overrides.0.policy: no policy named \"nope\" (line 6)"
        );
        assert_eq!(
            error(
                "[[overrides]]\npolicy = \"api\"\nkey = \"k\"\nlimit = 5\n[[overrides]]\npolicy = \"api\"\nprefix = \"\"\nlimit = 5\n"
            ),
            "overrides.1.prefix: must not be empty (an override for every key is the policy itself) (line 11)"
        );
        assert_eq!(
            error("[[overrides]]\npolicy = \"api\"\nkey = \"k\"\nlimit = 0\n"),
            "overrides.0.limit: limit must be at least 1 (line 8)"
        );
        assert!(
            error("[[overrides]]\npolicy = \"api\"\nkey = \"k\"\nprefix = \"p\"\nlimit = 5\n")
                .starts_with("overrides.0: give exactly one of key and prefix"),
        );
        assert!(
            error(
                "[[overrides]]\npolicy = \"api\"\nkey = \"k\"\nlimit = 5\nexpires_at = \"soon\"\n"
            )
            .starts_with("overrides.0.expires_at: \"soon\": not an RFC 3339 time"),
        );
        assert!(
            error("[[overrides]]\npolicy = \"api\"\nkey = \"k\"\nlimit = 5\n[[overrides]]\npolicy = \"api\"\nkey = \"k\"\nlimit = 6\n")
                .starts_with("overrides.1: a second override of policy \"api\" for key \"k\""),
        );
        assert!(
            error("[[overrides]]\npolicy = \"api\"\nkey = \"k\"\nlimit = 5\nlimt = 6\n")
                .contains("limt"),
        );
    }
}
