//! The in-memory state store: one atomic transition per key.
//!
//! Individually thread-safe `get` and `set` do not make
//! `get -> decide -> set` atomic, so the store's contract is the transition
//! itself: [`MemoryStore::check`] locks the key's shard, decides, and writes
//! back before anyone else can see the key.

mod item;
mod memory;
mod shard;
#[cfg(feature = "snapshot")]
mod snapshot;

pub use item::{BatchMode, CheckItem, InvalidItem};
pub use memory::{MemoryStore, OnFull, StoreConfig, StoreConfigError};
pub use shard::ENTRY_BYTES;
#[cfg(feature = "snapshot")]
pub use snapshot::{
    Exported, LoadReport, NamespaceCounts, SNAPSHOT_VERSION, SnapshotError, SnapshotReader,
};
