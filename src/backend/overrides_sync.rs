//! Keeping a replica's runtime overrides the same as the store's: read
//! once at start, then polled every `store.redis.overrides_poll_interval`.
//! A read that fails keeps the last set read, logs once until a read
//! succeeds again, and sets `quotad_overrides_in_sync` to 0.

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
    /// The version last read.
    known: Option<u64>,
}

impl<B: Backend> OverridesSync<B> {
    pub(crate) fn new(backend: Arc<B>, registry: Arc<PolicyRegistry>, timeout: Duration) -> Self {
        OverridesSync {
            backend,
            registry,
            timeout,
            known: None,
        }
    }

    /// One read: swaps in the store's overrides if they changed.
    pub(crate) async fn read(&mut self) {
        let deadline = Deadline::after(self.timeout);
        match self.backend.load_overrides(self.known, deadline).await {
            Ok(Some((version, pairs))) => {
                let entries: Vec<_> = pairs
                    .iter()
                    .filter_map(|(f, v)| from_store(f, v))
                    .map(Arc::new)
                    .collect();
                tracing::debug!(
                    version,
                    overrides = entries.len(),
                    "runtime overrides read from the store"
                );
                self.registry.set_runtime_overrides(entries);
                self.known = Some(version);
                self.recovered();
            }
            Ok(None) => self.recovered(),
            Err(error) => {
                if self.registry.in_sync() {
                    tracing::warn!(
                        error = %crate::Causes(&error),
                        "cannot read the runtime overrides from the store; serving the last set read until it answers"
                    );
                }
                self.registry.set_in_sync(false);
            }
        }
    }

    fn recovered(&self) {
        if !self.registry.in_sync() {
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
