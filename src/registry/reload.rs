//! Hot reload of named policies, on SIGHUP and when the config file
//! changes.
//!
//! The file is re-read every `server.config_poll_interval` (1 s by default)
//! and reloaded once its bytes differ from the last version seen *and* have
//! stayed the same for one more poll, so a file caught half-written is not
//! loaded. Polling the contents (rather than watching inotify events or
//! trusting the mtime alone) also follows a Kubernetes ConfigMap update,
//! which swaps a symlink to a new directory instead of writing the file,
//! and catches two writes within the mtime's granularity. SIGHUP reloads at
//! once.
//!
//! Policies and `[limits]` reload. The new file is validated in full; if
//! anything in it is invalid the current policies stay, a warning is logged
//! and `quotad_policy_reloads_total{outcome="error"}` counts it. A valid
//! file replaces the policy set and its limits atomically (`outcome="ok"`);
//! other settings that differ from the running ones are logged as needing
//! a restart (a policy that takes `store.on_error` as its default keeps the
//! running one).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{PolicyRegistry, PolicySet};
use crate::config::{Config, Files, FlagValues, PolicySettings};
use crate::metrics::Metrics;

/// The contents of the file as last read, or why it could not be read.
type Contents = Result<Vec<u8>, String>;

/// Reloads named policies from the file the server was started with.
#[derive(Debug)]
pub(crate) struct Reloader {
    path: PathBuf,
    flags: FlagValues,
    initial: Vec<u8>,
    running: Config,
    /// The configuration whose live settings are in force: the running one
    /// until a reload applies another.
    applied: std::sync::Mutex<Config>,
    registry: Arc<PolicyRegistry>,
    metrics: Arc<Metrics>,
}

impl Reloader {
    /// A reloader for `config`'s file; `None` when it was not read from one.
    pub(crate) fn new(
        config: &Config,
        registry: Arc<PolicyRegistry>,
        metrics: Arc<Metrics>,
    ) -> Option<Self> {
        let source = config.source()?;
        Some(Reloader {
            path: source.path.clone(),
            flags: source.flags.clone(),
            initial: source.contents.clone(),
            running: config.clone(),
            applied: std::sync::Mutex::new(config.clone()),
            registry,
            metrics,
        })
    }

    /// Watches for SIGHUP and file changes until `stop` is cancelled.
    pub(crate) async fn run(self, poll: Duration, stop: CancellationToken) {
        // The version the server started with, not a fresh read: a change
        // made between loading and now must still count as a change.
        let initial: Contents = Ok(self.initial.clone());
        let path = self.path.clone();
        let read = move || {
            let path = path.clone();
            async move { tokio::fs::read(&path).await.map_err(|e| e.to_string()) }
        };
        let label = format!("policies from {}", self.path.display());
        watch(
            &label,
            initial,
            read,
            |now| {
                self.reload(now);
                std::future::ready(())
            },
            poll,
            stop,
        )
        .await;
    }

    /// Validates `contents` as a whole config and, if valid, swaps in its
    /// policies.
    fn reload(&self, contents: &Contents) {
        let path = self.path.display();
        let parse = |flags: &FlagValues| {
            contents
                .as_ref()
                .map_err(|e| format!("cannot read: {e}"))
                .and_then(|bytes| {
                    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
                    Config::parse(text, Some(&self.path), flags, Files::Skip)
                        .map_err(|e| e.to_string())
                })
        };
        let reject = |error: String| {
            tracing::warn!(path = %path, %error, "config reload rejected; keeping the current policies");
            self.metrics.policy_reload(false);
        };
        let new = match parse(&self.flags) {
            Ok(new) => new,
            Err(error) => return reject(error),
        };
        let restart = self.running.restart_required_changes(&new);
        for field in &restart {
            tracing::warn!(path = %path, field, "changed setting takes effect only after a restart");
        }
        // A policy without its own on_error takes store.on_error's, which
        // only a restart changes: the file is read again with the running
        // one, so that named and inline policies keep answering alike.
        let new = if restart.contains(&"store.on_error") {
            let running = self.running.store().on_error.as_str();
            match parse(&self.flags.clone().with("store.on_error", running)) {
                Ok(new) => new,
                Err(error) => return reject(error),
            }
        } else {
            new
        };
        let mut applied = self
            .applied
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let settings = applied.live_changes(&new);
        let (old, current) = (self.registry.snapshot().policies(), new.policies());
        let added = names_where(current, |name, _| !old.contains_key(name));
        let removed = names_where(&old, |name, _| !current.contains_key(name));
        let changed = names_where(&old, |name, p| current.get(name).is_some_and(|q| q != p));
        self.registry.replace_with_file(
            PolicySet::new(new.policies(), new.limits(), &self.metrics),
            new.overrides(),
        );
        self.metrics.policy_reload(true);
        tracing::info!(path = %path, ?added, ?removed, ?changed, ?settings, "policies reloaded");
        *applied = new;
    }
}

/// The names in `policies` for which `pick` holds, for the reload log.
fn names_where(
    policies: &BTreeMap<String, PolicySettings>,
    pick: impl Fn(&str, &PolicySettings) -> bool,
) -> Vec<&str> {
    policies
        .iter()
        .filter(|(name, policy)| pick(name, policy))
        .map(|(name, _)| name.as_str())
        .collect()
}

/// Calls (and awaits) `reload` with what `read` returns: on SIGHUP at once, and when a
/// poll every `poll` finds it different from the last version seen *and*
/// the same on the next poll (so a file caught half-written is not
/// loaded). Runs until `stop` is cancelled; `what` names what is reloaded
/// in the log.
pub(super) async fn watch<T, R, Fut, L, LFut>(
    what: &str,
    initial: T,
    read: R,
    reload: L,
    poll: Duration,
    stop: CancellationToken,
) where
    T: PartialEq,
    R: Fn() -> Fut,
    Fut: Future<Output = T>,
    L: Fn(&T) -> LFut,
    LFut: Future<Output = ()>,
{
    let mut last_seen = initial;
    let mut pending: Option<T> = None;
    let mut hangup = hangup_signal();
    let mut ticks = (!poll.is_zero()).then(|| {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + poll, poll);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = next_hangup(&mut hangup) => {
                tracing::info!(what, "SIGHUP: reloading");
                last_seen = read().await;
                pending = None;
                reload(&last_seen).await;
            }
            () = next_tick(&mut ticks) => {
                let now = read().await;
                if now == last_seen {
                    pending = None;
                } else if pending.as_ref() == Some(&now) {
                    reload(&now).await;
                    last_seen = now;
                    pending = None;
                } else {
                    pending = Some(now);
                }
            }
        }
    }
}

#[cfg(unix)]
type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangup = Option<std::convert::Infallible>;

fn hangup_signal() -> Hangup {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::hangup()) {
            Ok(signal) => Some(signal),
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGHUP; policies reload on file change only");
                None
            }
        }
    }
    #[cfg(not(unix))]
    None
}

async fn next_hangup(hangup: &mut Hangup) {
    match hangup {
        #[cfg(unix)]
        Some(signal) => {
            if signal.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
        #[cfg(not(unix))]
        Some(never) => match *never {},
        None => std::future::pending().await,
    }
}

async fn next_tick(ticks: &mut Option<tokio::time::Interval>) {
    match ticks {
        Some(ticks) => {
            ticks.tick().await;
        }
        None => std::future::pending().await,
    }
}
