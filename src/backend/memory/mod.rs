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

use super::{
    AcquireResult, Backend, BackendError, BackendStats, Deadline, ItemResult, LeaseItem,
    LeaseResult, SlotItem, SlotResult,
};
use crate::config::{Config, MemorySettings};
use crate::metrics::Metrics;
use crate::registry::PolicyRegistry;
use crate::tasks::Tasks;

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

    async fn lease(&self, item: &LeaseItem<'_>, _: Deadline) -> LeaseResult {
        Ok(MemoryStore::lease(
            self,
            item.name,
            item.key,
            &item.policy,
            &item.terms,
            &item.ask,
        ))
    }

    async fn acquire(&self, item: &CheckItem<'_>, _: Deadline) -> AcquireResult {
        Ok(MemoryStore::acquire(self, item))
    }

    async fn renew(&self, slot: &SlotItem<'_>, _: Deadline) -> SlotResult {
        MemoryStore::renew(self, slot.name, slot.key, &slot.policy, slot.id)
            .map_err(|e| BackendError::Internal(e.to_string().into()))
    }

    async fn release(&self, slot: &SlotItem<'_>, _: Deadline) -> SlotResult {
        MemoryStore::release(self, slot.name, slot.key, &slot.policy, slot.id)
            .map_err(|e| BackendError::Internal(e.to_string().into()))
    }

    async fn reset(
        &self,
        name: &str,
        _policy: &Policy,
        key: &str,
        _: Deadline,
    ) -> Result<(), BackendError> {
        MemoryStore::reset(self, name, key);
        Ok(())
    }

    fn spends_when_denied(&self) -> bool {
        true
    }

    // No other replica: runtime overrides live in the registry, and go
    // into the snapshot.
    crate::backend::keeps_no_overrides!();

    fn stats(&self) -> BackendStats {
        BackendStats {
            live_keys: Some(self.live_keys() as u64),
            evictions: self.evictions(),
            reclaimed: self.reclaimed(),
            capacity: Some(self.config().max_keys() as u64),
            figures: Vec::new(),
            slots_held: Some(self.slots_held()),
            slots_expired: self.slots_expired(),
            breaker_state: None,
        }
    }
}

/// Why the memory store could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Its snapshot could not be read.
    #[error(transparent)]
    Load(#[from] snapshot::LoadError),
    /// Its first snapshot could not be written.
    #[error(transparent)]
    Write(#[from] snapshot::WriteError),
}

/// The memory store of `settings`, loaded from its snapshot when it has
/// one, with its background tasks (the sweep, periodic snapshots) started.
///
/// # Errors
///
/// [`StartError::Load`] for a snapshot that cannot be read under
/// `on_bad_file = "refuse"`, [`StartError::Write`] when the first
/// snapshot cannot be written (a folder quotad cannot write to stops it
/// here, not at the next restart with every budget lost).
pub(crate) async fn start(
    settings: &MemorySettings,
    config: &Config,
    registry: &Arc<PolicyRegistry>,
    metrics: &Arc<Metrics>,
    tasks: &mut Tasks,
) -> Result<Arc<MemoryStore>, StartError> {
    let clock = Arc::clone(config.clock());
    let store = match &settings.snapshot {
        Some(snapshot) => snapshot::load(snapshot, settings.store, clock, registry, metrics)?,
        None => MemoryStore::new(settings.store, clock),
    };
    let store = Arc::new(store);
    if let Some(snapshot) = &settings.snapshot {
        snapshot::remove_leftovers(&snapshot.path);
        snapshot::write_now(
            &store,
            &snapshot.path,
            registry,
            metrics,
            snapshot::When::Start,
        )
        .await?;
        if let Some(interval) = snapshot.interval {
            let (store, path) = (Arc::clone(&store), snapshot.path.clone());
            let (registry, metrics) = (Arc::clone(registry), Arc::clone(metrics));
            tasks.spawn(move |stop| {
                snapshot::periodic(store, path, interval, registry, metrics, stop)
            });
        }
    }
    let (swept, interval) = (Arc::clone(&store), settings.sweep_interval);
    tasks.spawn(|stop| sweep(swept, interval, stop));
    Ok(store)
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
