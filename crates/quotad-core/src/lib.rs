//! quotad-core: exact rate-limit algorithms and the sharded in-memory store
//! behind the quotad service.
//!
//! Everything here is plain, synchronous Rust with no I/O: the server, the
//! Redis backend and the benchmarks build on it.
//!
//! - [`policy`]: a validated [`Policy`] (`limit` per `window`, `burst`) and
//!   its [`Algorithm`];
//! - [`algorithm`]: the five rate algorithms and the concurrency limit
//!   (slots acquired, renewed and released: [`MemoryStore::acquire`]) as pure transitions, [`decide`] and
//!   [`peek`], over a key's [`State`];
//! - [`calendar`]: a [`Calendar`] period (day, week, month, year) of an
//!   IANA time zone, for fixed windows that reset at local midnight;
//! - [`decision`]: the [`Decision`] a check returns, and its [`Reason`];
//! - [`clock`]: [`SystemClock`] and the [`FakeClock`] tests drive by hand;
//! - [`store`]: [`MemoryStore`], one atomic transition per key, sharded and
//!   bounded by keys and bytes; with the `snapshot` feature (on by
//!   default), [`MemoryStore::export`] and [`SnapshotReader`] write it to
//!   and load it from a versioned, checksummed stream;
//! - [`assignment`]: Envoy quota assignments (RLQS) cut from leases, as
//!   token buckets Envoy enforces without admitting more than the lease;
//! - [`throttle`]: [`Throttle`], one log line per interval with the count of
//!   the events it kept quiet.
//!
//! All arithmetic is in exact integers bounded by 2^53 (so a Lua script on
//! Redis computes the same numbers); time is whole milliseconds since the
//! Unix epoch, and windows are aligned to it, or to a calendar's local
//! periods.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use quotad_core::{Algorithm, CheckItem, FakeClock, MemoryStore, OnFull, Policy, Reason, StoreConfig};
//!
//! let clock = Arc::new(FakeClock::new(1_700_000_000_000));
//! let store = MemoryStore::new(StoreConfig::try_new(10_000, 16, OnFull::Deny)?, clock.clone());
//! let policy = Policy::try_new(Algorithm::SlidingWindow, 10, Duration::from_secs(60), None)?;
//! let item = CheckItem::new("api", policy, "user-42", 1)?;
//! for _ in 0..10 {
//!     assert!(store.check_one(&item).allowed);
//! }
//! let denied = store.check_one(&item);
//! assert_eq!(denied.reason, Reason::LimitExceeded);
//! assert!(denied.retry_after_ms > 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod algorithm;
pub mod assignment;
pub mod calendar;
pub mod clock;
pub mod decision;
pub mod grant;
pub mod policy;
pub mod policy_ref;
pub mod store;
pub mod throttle;

pub use algorithm::{Log, Spend, State, decide, decide_spending, peek};
pub use assignment::{AssignmentTerms, AssignmentTermsError, EnvoyBucket};
pub use calendar::{Calendar, CalendarError, Period, Zone, tzdb_version};
pub use clock::{Clock, FakeClock, MonotonicClock, SystemClock};
pub use decision::{Decision, Reason};
pub use grant::{
    Acquired, Grant, LeaseAnswer, LeaseAsk, LeaseError, LeaseOutcome, LeaseTerms, LeaseTermsError,
    Ledger, MAX_GRANTS_PER_KEY, Settle, Settled, SlotAnswer, SlotError,
};
pub use policy::{
    Algorithm, CONCURRENCY_MAX_LIMIT, MAX_EXACT, MAX_SLOT_TTL, Policy, PolicyError,
    SLIDING_LOG_MAX_LIMIT, UnknownAlgorithm,
};
pub use policy_ref::PolicyRef;
pub use store::{
    BatchMode, CheckItem, ENTRY_BYTES, InvalidItem, MemoryStore, OnFull, StoreConfig,
    StoreConfigError,
};
#[cfg(feature = "snapshot")]
pub use store::{
    Exported, LoadReport, NamespaceCounts, SNAPSHOT_VERSION, SnapshotError, SnapshotReader,
};
pub use throttle::Throttle;
