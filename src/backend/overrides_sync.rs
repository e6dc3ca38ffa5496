//! Keeping a replica's runtime overrides the same as the store's: read
//! once at start, then polled every `store.redis.overrides_poll_interval`.
//! A read that fails keeps the last set read, logs once until a read
//! succeeds again, and sets `quotad_overrides_in_sync` to 0; until the
//! first read succeeds (quotad may start before Redis answers) the replica
//! is out of sync, and the first answer is applied at once.
//!
//! A set is read whenever its version differs from the one held (a
//! smaller count in the same epoch is the store gone back, and is
//! followed), and applied unless this replica applied a change of its own
//! while the read was under way (the read may answer the hash from before
//! the write, and must not undo it here; the next poll reads again).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Backend, Deadline};
use crate::registry::PolicyRegistry;
use crate::registry::overrides::from_store;

/// Reads the store's overrides into `registry` until `stop`.
pub(crate) struct OverridesSync<B> {
    backend: Arc<B>,
    registry: Arc<PolicyRegistry>,
    /// The longest one read may take.
    timeout: Duration,
    /// Whether the last read failed (and was logged).
    failing: bool,
}

impl<B: Backend> OverridesSync<B> {
    pub(crate) fn new(backend: Arc<B>, registry: Arc<PolicyRegistry>, timeout: Duration) -> Self {
        // Nothing is read yet: out of sync until the store first answers.
        registry.set_in_sync(false);
        OverridesSync {
            backend,
            registry,
            timeout,
            failing: false,
        }
    }

    /// One read: swaps in the store's overrides if they changed.
    pub(crate) async fn read(&mut self) {
        let deadline = Deadline::after(self.timeout);
        let start = self.registry.poll_start();
        match self.backend.load_overrides(start.known, deadline).await {
            Ok(Some((version, pairs))) => {
                let entries: Vec<_> = pairs
                    .iter()
                    .filter_map(|(f, v)| from_store(f, v))
                    .map(Arc::new)
                    .collect();
                let count = entries.len();
                let applied = self.registry.set_stored_overrides(version, entries, start);
                tracing::debug!(
                    epoch = version.0,
                    version = version.1,
                    overrides = count,
                    applied,
                    "runtime overrides read from the store"
                );
                self.recovered();
            }
            Ok(None) => self.recovered(),
            Err(error) => {
                if !self.failing {
                    self.failing = true;
                    tracing::warn!(
                        error = %crate::log::Causes(&error),
                        "cannot read the runtime overrides from the store; serving the last set read until it answers"
                    );
                }
                self.registry.set_in_sync(false);
            }
        }
    }

    fn recovered(&mut self) {
        if self.failing {
            self.failing = false;
            tracing::info!("runtime overrides read from the store again");
        }
        self.registry.set_in_sync(true);
    }

    /// Reads every `interval` until `stop`.
    pub(crate) async fn run(mut self, interval: Duration, stop: CancellationToken) {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => self.read().await,
            }
        }
    }
}
