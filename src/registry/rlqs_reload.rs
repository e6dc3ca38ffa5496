//! Hot reload of the bucket rules: the file is polled every
//! `server.config_poll_interval` and reloaded once it changed and held
//! still for one more poll; SIGHUP reloads at once (the same watch as the
//! named policies). An invalid version keeps the rules in force.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::PolicyRegistry;
use super::reload::watch;
use crate::config::Config;
use crate::policy::rlqs::{BucketRules, RlqsConfigError, RlqsRegistry};
use crate::tasks::Tasks;

/// The rules at start, read from `rlqs.rules` (checked against the named
/// policies in force), and the task that reloads them.
///
/// # Errors
///
/// The [`RlqsConfigError`] of a file that cannot be used.
pub(crate) fn start(
    config: &Config,
    policies: &Arc<PolicyRegistry>,
    tasks: &mut Tasks,
) -> Result<Arc<RlqsRegistry>, RlqsConfigError> {
    let Some(path) = config.rlqs().rules.clone() else {
        tracing::info!("no RLQS bucket rules (rlqs.rules): every bucket is denied");
        return Ok(Arc::new(RlqsRegistry::new(BucketRules::default())));
    };
    let text = BucketRules::read(&path)?;
    let set = policies.snapshot();
    let rules = BucketRules::parse(&path, &text, |name| is_rate(&set, name))?;
    let registry = Arc::new(RlqsRegistry::new(rules));
    let reloader = Reloader {
        path,
        initial: text,
        registry: Arc::clone(&registry),
        policies: Arc::clone(policies),
    };
    let poll = config.server().config_poll_interval;
    tasks.spawn(|stop| reloader.run(poll, stop));
    Ok(registry)
}

#[derive(Debug)]
struct Reloader {
    path: PathBuf,
    initial: String,
    registry: Arc<RlqsRegistry>,
    policies: Arc<PolicyRegistry>,
}

impl Reloader {
    async fn run(self, poll: Duration, stop: CancellationToken) {
        let initial: Result<String, RlqsConfigError> = Ok(self.initial.clone());
        let path = self.path.clone();
        let read = move || {
            let path = path.clone();
            async move {
                tokio::task::spawn_blocking(move || BucketRules::read(&path))
                    .await
                    .unwrap_or_else(|e| {
                        Err(RlqsConfigError::new(&PathBuf::new(), "", e.to_string()))
                    })
            }
        };
        let label = format!("RLQS bucket rules from {}", self.path.display());
        let this = &self;
        let reload = move |now: &Result<String, RlqsConfigError>| {
            let now = now.clone();
            async move { this.apply(&now) }
        };
        watch(&label, initial, read, reload, poll, stop).await;
    }

    /// Swaps in the rules of `text` if they are valid; logs the outcome.
    fn apply(&self, text: &Result<String, RlqsConfigError>) {
        let set = self.policies.snapshot();
        let parsed = text
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|text| BucketRules::parse(&self.path, text, |name| is_rate(&set, name)));
        match parsed {
            Ok(rules) => {
                tracing::info!(path = %self.path.display(), rules = rules.rules().len(), "RLQS bucket rules reloaded");
                self.registry.replace(rules);
            }
            Err(error) => tracing::warn!(
                path = %self.path.display(),
                field = error.field(),
                line = error.line(),
                %error,
                "RLQS bucket rules reload rejected; keeping the current rules"
            ),
        }
    }
}

/// Whether `name` is a rate policy of `set`: assignments are leases, which
/// a concurrency policy does not give.
fn is_rate(set: &super::PolicySet, name: &str) -> bool {
    set.get(name)
        .is_some_and(|(_, named)| named.settings.policy.algorithm().is_rate())
}
