//! `[rls]`, validated: Envoy's rate limit service and its rules.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::policies::Invalid;
use super::settings::{HeaderStyle, RlsSection};
use crate::policy::rls::{LoadOptions, RlsConfigError, RlsRules};

pub use super::settings::CountMode;

/// `[rls]`: where the rules are and how `ShouldRateLimit` answers.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RlsSettings {
    /// `rls.config_dir`: the folder (or file) of YAML rules, resolved
    /// against the config file's folder when the file gave it; `None`
    /// serves no rules (every descriptor answers OK).
    pub config_dir: Option<PathBuf>,
    /// `rls.merge_domains`, as the loader takes it.
    pub load: LoadOptions,
    /// `rls.count_mode`.
    pub count_mode: CountMode,
    /// `rls.response_headers` and the reference's header names.
    pub headers: ResponseHeaders,
    /// `rls.shadow_mode`: every request answers OK.
    pub shadow_mode: bool,
    /// `rls.quota_mode`: every rule is a quota-mode rule.
    pub quota_mode: bool,
    /// The rules as loaded when the configuration was validated with its
    /// files, so the server starts with exactly what was checked.
    loaded: Option<Arc<Loaded>>,
}

/// Rules and the file texts they were loaded from.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) rules: Arc<RlsRules>,
    /// `(file, text)` in load order, for the reload to tell changes from.
    pub(crate) sources: Vec<(PathBuf, String)>,
}

impl Loaded {
    fn read(dir: &Path, options: LoadOptions) -> Result<Loaded, RlsConfigError> {
        let sources = RlsRules::read_sources(dir)?;
        let rules = RlsRules::from_sources(
            sources.iter().map(|(f, t)| (f.as_path(), t.as_str())),
            options,
        )?;
        Ok(Loaded {
            rules: Arc::new(rules),
            sources,
        })
    }
}

/// The rate-limit headers `ShouldRateLimit` adds to responses.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResponseHeaders {
    /// The reference's three headers, by these names.
    pub reference: Option<ReferenceHeaders>,
    /// The IETF draft's `RateLimit` and `RateLimit-Policy`.
    pub draft: bool,
}

/// The names of the reference's headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReferenceHeaders {
    /// The limit: requests per unit.
    pub limit: String,
    /// What remains of it.
    pub remaining: String,
    /// Seconds until the window resets.
    pub reset: String,
}

impl ResponseHeaders {
    /// Whether any header is added.
    pub fn any(&self) -> bool {
        self.reference.is_some() || self.draft
    }
}

impl RlsSettings {
    /// Validates `[rls]`; `base_dir` resolves a relative `config_dir` from
    /// the file.
    pub(super) fn validate(
        section: RlsSection,
        base_dir: Option<&Path>,
    ) -> Result<RlsSettings, Invalid> {
        let field = |name: &str| vec!["rls".to_owned(), name.to_owned()];
        for (name, value) in [
            ("limit_header", &section.limit_header),
            ("remaining_header", &section.remaining_header),
            ("reset_header", &section.reset_header),
        ] {
            if let Err(message) = header_name(value) {
                return Err((field(name), message));
            }
        }
        if section
            .config_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err((
                field("config_dir"),
                "must name a folder or a file (leave it out to serve no rules)".to_owned(),
            ));
        }
        let styles = section.response_headers.unwrap_or_default();
        let headers = ResponseHeaders {
            reference: styles
                .contains(&HeaderStyle::Reference)
                .then_some(ReferenceHeaders {
                    limit: section.limit_header,
                    remaining: section.remaining_header,
                    reset: section.reset_header,
                }),
            draft: styles.contains(&HeaderStyle::Draft),
        };
        // `components` drops `.` segments, so errors name `rules/a.yaml`
        // rather than `rules/./a.yaml`.
        let config_dir = section.config_dir.map(|dir| match base_dir {
            Some(base) if dir.is_relative() => base.join(dir).components().collect(),
            _ => dir,
        });
        Ok(RlsSettings {
            config_dir,
            load: LoadOptions {
                merge_domains: section.merge_domains,
            },
            count_mode: section.count_mode,
            headers,
            shadow_mode: section.shadow_mode,
            quota_mode: section.quota_mode,
            loaded: None,
        })
    }

    /// Loads the rules from `config_dir`, keeping them for the server.
    pub(super) fn load_rules(&mut self) -> Result<(), RlsConfigError> {
        if let Some(dir) = &self.config_dir {
            self.loaded = Some(Arc::new(Loaded::read(dir, self.load)?));
        }
        Ok(())
    }

    /// The rules to start with: those checked with the configuration, or
    /// read now when it was validated without its files.
    ///
    /// # Errors
    ///
    /// The [`RlsConfigError`] of rules that cannot be used.
    pub fn rules(&self) -> Result<Arc<RlsRules>, RlsConfigError> {
        Ok(match self.loaded()? {
            Some(loaded) => Arc::clone(&loaded.rules),
            None => Arc::new(RlsRules::default()),
        })
    }

    /// What [`RlsSettings::rules`] loads, with the texts; `None` without
    /// `config_dir`.
    pub(crate) fn loaded(&self) -> Result<Option<Arc<Loaded>>, RlsConfigError> {
        match (&self.loaded, &self.config_dir) {
            (Some(loaded), _) => Ok(Some(Arc::clone(loaded))),
            (None, Some(dir)) => Ok(Some(Arc::new(Loaded::read(dir, self.load)?))),
            (None, None) => Ok(None),
        }
    }
}

/// Checks an HTTP header name: one or more token characters (RFC 9110).
fn header_name(name: &str) -> Result<(), String> {
    http::HeaderName::from_bytes(name.as_bytes())
        .map(drop)
        .map_err(|_| {
            format!("{name:?} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_are_http_tokens() {
        assert!(header_name("RateLimit-Limit").is_ok());
        assert!(header_name("x_rate.limit").is_ok());
        for bad in ["", "Rate Limit", "a:b", "ä"] {
            assert!(header_name(bad).is_err(), "{bad:?}");
        }
    }
}
