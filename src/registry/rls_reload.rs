//! Hot reload of the RLS rules: the files are polled every
//! `server.config_poll_interval` and reloaded once they changed and held
//! still for one more poll; SIGHUP reloads at once (the same watch as the
//! named policies). A folder is re-listed on every poll, so added and
//! removed files count as changes, and a Kubernetes ConfigMap update (a
//! swapped symlink) is followed.
//!
//! A new version is loaded in full before it replaces the rules in force;
//! if any file is invalid the current rules stay, a warning names the file,
//! field and line, and `quotad_rls_reloads_total{outcome="error"}` counts
//! it. State is kept per rule namespace, so a rule whose place in its file
//! stays the same keeps its counts across a reload.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::reload::watch;
use super::{RlsRegistry, RlsSet};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::policy::rls::{LoadOptions, RlsConfigError, RlsRules};
use crate::tasks::Tasks;

/// The RLS rules in force at start (those `config` was validated with),
/// and the task that reloads them when `rls.config_dir` is set.
///
/// # Errors
///
/// The [`RlsConfigError`] of rules that cannot be loaded (only when the
/// configuration was validated without reading its files).
pub(crate) fn start(
    config: &Config,
    metrics: &Arc<Metrics>,
    tasks: &mut Tasks,
) -> Result<Arc<RlsRegistry>, RlsConfigError> {
    let settings = config.rls();
    let loaded = settings.loaded()?;
    let rules = loaded
        .as_ref()
        .map_or_else(|| Arc::new(RlsRules::default()), |l| Arc::clone(&l.rules));
    metrics.rls_rules(rules.rule_count());
    let registry = Arc::new(RlsRegistry::new(RlsSet::new(rules, metrics)));
    match (&settings.config_dir, loaded) {
        (Some(dir), Some(loaded)) => {
            tracing::info!(
                path = %dir.display(),
                rules = loaded.rules.rule_count(),
                domains = loaded.rules.domains().count(),
                "RLS rules loaded"
            );
            let reloader = RlsReloader {
                path: dir.clone(),
                initial: loaded.sources.clone(),
                options: settings.load,
                registry: Arc::clone(&registry),
                metrics: Arc::clone(metrics),
            };
            let poll = config.server().config_poll_interval;
            tasks.spawn(|stop| reloader.run(poll, stop));
        }
        _ => tracing::info!("no RLS rules (rls.config_dir): every descriptor answers OK"),
    }
    Ok(registry)
}

/// The files as last read: `(file, text)` in load order, or why they could
/// not be read.
type Sources = Result<Vec<(PathBuf, String)>, RlsConfigError>;

/// Reloads the RLS rules from `rls.config_dir`.
#[derive(Debug)]
struct RlsReloader {
    path: PathBuf,
    /// The texts the rules in force were loaded from.
    initial: Vec<(PathBuf, String)>,
    options: LoadOptions,
    registry: Arc<RlsRegistry>,
    metrics: Arc<Metrics>,
}

impl RlsReloader {
    /// Watches for SIGHUP and file changes until `stop` is cancelled.
    async fn run(self, poll: Duration, stop: CancellationToken) {
        // The texts the rules in force came from, not a fresh read: a
        // change made between loading and now must still count as one.
        let initial: Sources = Ok(self.initial.clone());
        let path = self.path.clone();
        let read = move || {
            let path = path.clone();
            async move { read_sources(path).await }
        };
        let label = format!("RLS rules from {}", self.path.display());
        let this = &self;
        let reload = move |now: &Sources| {
            let now = now.clone();
            async move { this.reload(&now).await }
        };
        watch(&label, initial, read, reload, poll, stop).await;
    }

    /// Loads `sources` and, if every file is valid, swaps the rules in;
    /// logs and counts the outcome.
    async fn reload(&self, sources: &Sources) {
        match self.apply(sources).await {
            Ok(0) => {
                tracing::warn!(path = %self.path.display(), "RLS rules reloaded, and there are none: every descriptor answers OK");
                self.metrics.rls_reload(true, 0);
            }
            Ok(rules) => {
                tracing::info!(path = %self.path.display(), rules, "RLS rules reloaded");
                self.metrics.rls_reload(true, rules);
            }
            Err(error) => {
                tracing::warn!(
                    path = %self.path.display(),
                    file = %error.file().display(),
                    field = error.field(),
                    line = error.line(),
                    %error,
                    "RLS rules reload rejected; keeping the current rules"
                );
                let in_force = self.registry.snapshot().rules().rule_count();
                self.metrics.rls_reload(false, in_force);
            }
        }
    }

    /// Loads `sources` (off the async workers: a large file takes a while
    /// to parse) and swaps them in: the number of rules now in force, or
    /// why nothing changed.
    async fn apply(&self, sources: &Sources) -> Result<usize, RlsConfigError> {
        let texts = sources.as_ref().map_err(Clone::clone)?.clone();
        let options = self.options;
        let rules = tokio::task::spawn_blocking(move || {
            RlsRules::from_sources(
                texts.iter().map(|(f, t)| (f.as_path(), t.as_str())),
                options,
            )
        })
        .await
        .map_err(|join| failed("loading", &join))??;
        let count = rules.rule_count();
        self.registry
            .replace(RlsSet::new(Arc::new(rules), &self.metrics));
        Ok(count)
    }
}

/// A reload whose blocking task failed.
fn failed(doing: &str, join: &tokio::task::JoinError) -> RlsConfigError {
    RlsConfigError::new(
        std::path::Path::new(""),
        "",
        format!("{doing} the rules failed: {join}"),
    )
}

async fn read_sources(path: PathBuf) -> Sources {
    match tokio::task::spawn_blocking(move || RlsRules::read_sources(&path)).await {
        Ok(sources) => sources,
        Err(join) => Err(failed("reading", &join)),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[tokio::test]
    async fn an_invalid_version_names_its_file_and_line_and_keeps_the_rules_in_force() {
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let source = |text: &str| vec![(PathBuf::from("rules/edge.yaml"), text.to_owned())];
        let valid = "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 5}\n";
        let rules = RlsRules::from_sources(
            [(Path::new("rules/edge.yaml"), valid)],
            LoadOptions::default(),
        )
        .expect("valid");
        let registry = Arc::new(RlsRegistry::new(RlsSet::new(Arc::new(rules), &metrics)));
        let reloader = RlsReloader {
            path: PathBuf::from("rules"),
            initial: source(valid),
            options: LoadOptions::default(),
            registry: Arc::clone(&registry),
            metrics: Arc::clone(&metrics),
        };

        let broken = valid.replace("second", "fortnight");
        let error = reloader
            .apply(&Ok(source(&broken)))
            .await
            .expect_err("invalid unit");
        assert_eq!(error.file(), Path::new("rules/edge.yaml"));
        assert_eq!(
            (error.field(), error.line()),
            ("descriptors[0].rate_limit.unit", Some(4))
        );
        reloader.reload(&Ok(source(&broken))).await;
        assert!(
            metrics
                .render()
                .contains(r#"quotad_rls_reloads_total{outcome="error"} 1"#)
        );
        assert_eq!(registry.snapshot().rules().rules("edge").len(), 1);

        let two = format!(
            "{valid}  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: 1}}\n"
        );
        assert_eq!(reloader.apply(&Ok(source(&two))).await, Ok(2));
        assert_eq!(registry.snapshot().rules().rules("edge").len(), 2);
    }
}
