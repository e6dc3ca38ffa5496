//! The in-memory backend: quotad-core's sharded [`MemoryStore`], the
//! background task that sweeps state that has become fresh, and its
//! [`snapshot`]s on disk.
//!
//! It never fails: every method answers from memory under one shard lock
//! (a batch locks its shards in ascending order), which is short enough to
//! take on an async worker thread.

use std::sync::Arc;
use std::time::Duration;

use quotad_core::{BatchMode, CheckItem, MemoryStore, Policy};
use tokio_util::sync::CancellationToken;

use super::{Backend, BackendError, BackendStats, Deadline, ItemResult};

pub mod snapshot;

impl Backend for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    // Answers at once, from memory: no deadline can pass meanwhile.
    async fn check_one(&self, item: &CheckItem<'_>, _: Deadline) -> ItemResult {
        Ok(MemoryStore::check_one(self, item))
    }

    async fn check(
        &self,
        items: &[CheckItem<'_>],
        mode: BatchMode,
        _: Deadline,
    ) -> Vec<ItemResult> {
        MemoryStore::check(self, items, mode)
            .into_iter()
            .map(Ok)
            .collect()
    }

    async fn peek(&self, item: &CheckItem<'_>, _: Deadline) -> ItemResult {
        Ok(MemoryStore::peek(self, item))
    }

    async fn reset(&self, name: &str, _policy: &Policy, key: &str) -> Result<(), BackendError> {
        MemoryStore::reset(self, name, key);
        Ok(())
    }

    fn spends_when_denied(&self) -> bool {
        true
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            live_keys: Some(self.live_keys() as u64),
            evictions: self.evictions(),
            reclaimed: self.reclaimed(),
            redis: None,
            capacity: Some(self.config().max_keys() as u64),
        }
    }
}

/// Runs the incremental sweep until `stop` is cancelled: one shard per
/// step, so every shard is visited once per `interval` and no step holds
/// more than one shard's lock.
pub(crate) async fn sweep(store: Arc<MemoryStore>, interval: Duration, stop: CancellationToken) {
    let shards = u32::try_from(store.config().shards()).unwrap_or(u32::MAX);
    let step = (interval / shards).max(Duration::from_millis(1));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + step, step);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {
                let dropped = store.sweep_step();
                if dropped > 0 {
                    tracing::trace!(dropped, "swept fresh state");
                }
            }
        }
    }
}
