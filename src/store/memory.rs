//! The in-memory backend: quotad-core's sharded [`MemoryStore`], plus the
//! background task that sweeps state that has become fresh.
//!
//! It never fails: every method answers from memory under one shard lock
//! (a batch locks its shards in ascending order), which is short enough to
//! take on an async worker thread.

use std::sync::Arc;
use std::time::Duration;

use quotad_core::{BatchMode, CheckItem, Clock, Decision, MemoryStore, StoreConfig};
use tokio_util::sync::CancellationToken;

use super::{StateStore, StoreError, StoreStats};

/// The memory backend.
#[derive(Debug)]
pub struct MemoryBackend {
    store: MemoryStore,
}

impl MemoryBackend {
    /// An empty store with `config`'s bounds, reading time from `clock`.
    pub fn new(config: StoreConfig, clock: Arc<dyn Clock>) -> Self {
        MemoryBackend {
            store: MemoryStore::new(config, clock),
        }
    }

    /// Runs the incremental sweep until `stop` is cancelled: one shard per
    /// step, so every shard is visited once per `sweep_interval` and no
    /// step holds more than one shard's lock.
    pub(crate) async fn sweep(self: Arc<Self>, sweep_interval: Duration, stop: CancellationToken) {
        let shards = u32::try_from(self.store.config().shards()).unwrap_or(u32::MAX);
        let step = (sweep_interval / shards).max(Duration::from_millis(1));
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + step, step);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticks.tick() => {
                    let dropped = self.store.sweep_step();
                    if dropped > 0 {
                        tracing::trace!(dropped, "swept fresh state");
                    }
                }
            }
        }
    }
}

impl StateStore for MemoryBackend {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn check_one(&self, item: &CheckItem<'_>) -> Result<Decision, StoreError> {
        Ok(self.store.check_one(item))
    }

    async fn check(
        &self,
        items: &[CheckItem<'_>],
        mode: BatchMode,
    ) -> Result<Vec<Decision>, StoreError> {
        Ok(self.store.check(items, mode))
    }

    async fn peek(&self, item: &CheckItem<'_>) -> Result<Decision, StoreError> {
        Ok(self.store.peek(item))
    }

    async fn reset(&self, name: &str, key: &str) -> Result<(), StoreError> {
        self.store.reset(name, key);
        Ok(())
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            live_keys: Some(self.store.live_keys() as u64),
            evictions: self.store.evictions(),
            reclaimed: self.store.reclaimed(),
        }
    }
}
