//! Where rate-limit state lives: the one [`Backend`] trait and its two
//! implementations.
//!
//! The contract is the transition, never `get` and `set`: each method
//! performs the whole read -> decide -> write of its keys atomically, so
//! concurrent callers can never both spend the last unit. The services are
//! generic over the backend type, chosen once in [`crate::run`]; calls are
//! statically dispatched, with no per-call boxing.
//!
//! - [`memory`]: the embedded default, quotad-core's sharded
//!   [`MemoryStore`](quotad_core::MemoryStore), and its background sweep.
//! - [`redis`]: Redis standalone or Cluster, one Lua script per transition,
//!   Redis server time.
//! - [`fallback`]: around Redis, the local decisions of
//!   `on_error = "local"` while it is down.

pub mod breaker;
mod error;
pub mod fallback;
/// The override methods of a [`Backend`] that keeps none: a store in
/// this process (it has no other replica; its runtime overrides live in
/// the registry and go into its snapshot) and test stores. Written out by
/// each, since the trait has no default: a wrapper that forgot them would
/// drop every override.
macro_rules! keeps_no_overrides {
    () => {
        async fn write_override(
            &self,
            _: &$crate::backend::OverrideWrite<'_>,
            _: $crate::backend::Deadline,
        ) -> Result<$crate::backend::OverrideWritten, $crate::backend::OverrideWriteError> {
            Ok($crate::backend::OverrideWritten::default())
        }

        async fn load_overrides(
            &self,
            _: Option<$crate::backend::OverridesVersion>,
            _: $crate::backend::Deadline,
        ) -> Result<Option<$crate::backend::StoredOverrides>, $crate::backend::BackendError> {
            Ok(None)
        }
    };
}

/// The override methods of a wrapper [`Backend`], passed to the store in
/// its field `$inner`: overrides are the store's, whatever the wrapper
/// does to checks.
macro_rules! passes_overrides_to {
    ($inner:ident) => {
        async fn write_override(
            &self,
            write: &$crate::backend::OverrideWrite<'_>,
            deadline: $crate::backend::Deadline,
        ) -> Result<$crate::backend::OverrideWritten, $crate::backend::OverrideWriteError> {
            self.$inner.write_override(write, deadline).await
        }

        async fn load_overrides(
            &self,
            known: Option<$crate::backend::OverridesVersion>,
            deadline: $crate::backend::Deadline,
        ) -> Result<Option<$crate::backend::StoredOverrides>, $crate::backend::BackendError> {
            self.$inner.load_overrides(known, deadline).await
        }
    };
}

pub(crate) use overrides_sync::OverridesSync;
pub(crate) use {keeps_no_overrides, passes_overrides_to};

pub mod memory;
mod overrides_sync;
pub mod redis;
pub mod traced;

// What a backend reports is the metrics' vocabulary: the exporter renders
// it, and the backends fill it in.
pub use crate::metrics::{BackendStats, Figure};

use std::future::Future;
use std::time::{Duration, Instant};

use quotad_core::{
    Acquired, BatchMode, CheckItem, Decision, LeaseAsk, LeaseError, LeaseOutcome, LeaseTerms,
    Policy, SlotAnswer, SlotError,
};
use thiserror::Error;

pub use error::{Fault, MayHaveRun, NotRun, Outage, Shared, Waited};

/// When the caller of a store call stops waiting for its answer.
///
/// Past it the call is answered as failed, so the store must not count it
/// later: the Redis backend makes it the script's deadline when it is
/// earlier than `store.redis.timeout` (the earlier of the two always
/// applies). The API gives each call the earliest of the request's own
/// deadline (gRPC `grpc-timeout`) and `transport.request_timeout`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deadline(Option<Instant>);

impl Deadline {
    /// No deadline of the caller's: only the store's own timeout applies.
    pub const NONE: Deadline = Deadline(None);

    /// A deadline at `instant`.
    pub fn at(instant: Instant) -> Self {
        Deadline(Some(instant))
    }

    /// A deadline `after` from now; none if that is past what an `Instant`
    /// can hold.
    pub fn after(after: Duration) -> Self {
        Deadline(Instant::now().checked_add(after))
    }

    /// The instant, if there is one.
    pub fn instant(self) -> Option<Instant> {
        self.0
    }

    /// The earlier of two deadlines.
    #[must_use]
    pub fn min(self, other: Deadline) -> Deadline {
        match (self.0, other.0) {
            (Some(a), Some(b)) => Deadline(Some(a.min(b))),
            (a, b) => Deadline(a.or(b)),
        }
    }
}

/// A backend that could not make a decision. A denial is never an error.
///
/// Its text is its own part only; the cause is its source, so a chain
/// printer ([`crate::log::Causes`], `anyhow`'s `{:#}`) writes each cause once:
/// `state store unavailable: redis: Connection refused (os error 111)`.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum BackendError {
    /// The backend cannot be reached or did not answer in time. The
    /// policy's `on_error` decides what the check answers.
    #[error("state store unavailable")]
    Unavailable(#[source] Outage),
    /// An all-or-nothing batch whose keys live in different Redis Cluster
    /// slots: it cannot be one atomic script.
    #[error(
        "the keys of an ALL_OR_NOTHING batch must share a Redis Cluster slot; keys under one rate-limit key share it already, and other keys can be co-located with a common hash tag, e.g. {{team-7}}alice and {{team-7}}bob"
    )]
    CrossSlot,
    /// An all-or-nothing batch larger than the backend decides in one step:
    /// on Redis it is one script, and Redis serves no one else while it
    /// runs (`store.redis.max_atomic_items`).
    #[error(
        "an ALL_OR_NOTHING batch on Redis holds at most {max} items, a sliding log or an acquire counting as 4 (got {got}): it runs as one script, during which Redis serves no one else; send fewer items, or raise store.redis.max_atomic_items"
    )]
    TooManyAtomicItems {
        /// `store.redis.max_atomic_items`.
        max: usize,
        /// The batch's items, a sliding log or a slot acquire counting as 4.
        got: usize,
    },
    /// The backend answered something quotad cannot use (a bug, not an
    /// outage).
    #[error("state store error")]
    Internal(#[source] Fault),
}

impl BackendError {
    /// A reply of the wrong shape, as `description` says: a bug.
    pub fn bad_reply(description: String) -> Self {
        BackendError::Internal(Fault::Reply(description))
    }
}

impl From<NotRun> for BackendError {
    fn from(cause: NotRun) -> Self {
        BackendError::Unavailable(Outage::NotRun(cause))
    }
}

impl From<MayHaveRun> for BackendError {
    fn from(cause: MayHaveRun) -> Self {
        BackendError::Unavailable(Outage::MayHaveRun(cause))
    }
}

impl From<Fault> for BackendError {
    fn from(cause: Fault) -> Self {
        BackendError::Internal(cause)
    }
}

/// One item's answer: its decision, or why the backend could not make it.
pub type ItemResult = Result<Decision, BackendError>;

/// The version of a store's runtime overrides: the history they belong
/// to (an epoch, fixed when the store first keeps one) and how many
/// changes that history has seen (which goes back only when the store
/// does: restored from an older copy, or failed over with writes lost).
pub type OverridesVersion = (u64, u64);

/// The runtime overrides a store keeps: their version and the (field,
/// value) pairs ([`Backend::load_overrides`]).
pub type StoredOverrides = (OverridesVersion, Vec<(String, String)>);

/// One change of a runtime override ([`Backend::write_override`]).
#[derive(Clone, Copy, Debug)]
pub struct OverrideWrite<'a> {
    /// The override's field: its policy and scope.
    pub field: &'a str,
    /// Its new value, or `None` to remove it.
    pub value: Option<&'a str>,
    /// What the field of every override of the same policy starts with.
    pub policy_fields: &'a str,
    /// How many runtime overrides the policy may have in the store (a set
    /// of a new one past it is refused). The store purges those expired
    /// by its own clock.
    pub room: u64,
}

/// What a change of a runtime override did in the store.
#[derive(Clone, Debug, Default)]
pub struct OverrideWritten {
    /// The store's version after it; `None` for a store in this process,
    /// which keeps none (the registry is then the only copy, and checks
    /// `limits.max_overrides` itself).
    pub version: Option<OverridesVersion>,
    /// The value it replaced or removed, if one was in force.
    pub previous: Option<String>,
}

/// Why a change of a runtime override did not certainly happen.
#[derive(Debug, thiserror::Error)]
pub enum OverrideWriteError {
    /// The policy has `room` runtime overrides in the store already.
    #[error("the store holds {0} runtime overrides of the policy already")]
    Full(u64),
    /// The store did not apply it.
    #[error(transparent)]
    NotApplied(BackendError),
    /// It was sent but no answer came: it may or may not have been applied.
    #[error("{}: the change may have been applied; List to see", crate::log::Causes(.0))]
    Unknown(BackendError),
}

/// One lease request: settle a lease of `(name, key)` and grant another.
#[derive(Clone, Copy, Debug)]
pub struct LeaseItem<'a> {
    /// The policy namespace (a named policy's name, or the inline one's).
    pub name: &'a str,
    /// The key.
    pub key: &'a str,
    /// The policy counting the key.
    pub policy: Policy,
    /// How the policy hands out leases.
    pub terms: LeaseTerms,
    /// What is settled and asked for.
    pub ask: LeaseAsk,
}

/// A lease request's answer: the outcome, or the caller's error
/// ([`LeaseError`]: nothing changed); a backend failure is the outer error.
pub type LeaseResult = Result<Result<LeaseOutcome, LeaseError>, BackendError>;

/// A renew or release of one concurrency slot: the slot `id` of `(name,
/// key)` under the concurrency policy `policy`.
#[derive(Clone, Copy, Debug)]
pub struct SlotItem<'a> {
    /// The policy namespace (a named policy's name, or the inline one's).
    pub name: &'a str,
    /// The key.
    pub key: &'a str,
    /// The concurrency policy.
    pub policy: Policy,
    /// The slot's id.
    pub id: u64,
}

/// An acquire's answer, or the caller's error ([`SlotError`]: nothing
/// changed); a backend failure is the outer error.
pub type AcquireResult = Result<Result<Acquired, SlotError>, BackendError>;

/// A renew's or release's answer; a backend failure is the error.
pub type SlotResult = Result<SlotAnswer, BackendError>;

/// What a backend can promise, before it is asked, about deciding a batch
/// all or nothing ([`Backend::atomicity`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Atomicity {
    /// `check` in all-or-nothing mode decides the batch as one atomic
    /// transition.
    Atomic,
    /// Atomic only when the keys live together (on a Redis Cluster, in one
    /// slot); otherwise `check` refuses it with [`BackendError::CrossSlot`].
    /// A caller that can do without atomicity decides the items one by one.
    IfColocated,
    /// Larger than one transition holds (on Redis,
    /// `store.redis.max_atomic_items`): `check` refuses it with
    /// [`BackendError::TooManyAtomicItems`].
    TooLarge,
}

/// An owner of rate-limit state: one atomic transition per call.
///
/// State is keyed by `(item.name(), item.key())`: the same key under two
/// policy names has two independent states.
pub trait Backend: Send + Sync + 'static {
    /// The backend's name, for the `backend` metric label.
    fn name(&self) -> &'static str;

    /// Decides one item and, when allowed, consumes its cost, answering by
    /// `deadline` at the latest.
    ///
    /// # Errors
    ///
    /// [`BackendError`] when the backend fails or cannot answer by
    /// `deadline`; nothing is consumed then, nor later.
    fn check_one(
        &self,
        item: &CheckItem<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = ItemResult> + Send;

    /// Decides a batch, independently or all-or-nothing: one result per
    /// item, in order.
    ///
    /// Each failed item has consumed nothing, and an item that was decided
    /// keeps its decision whatever happened to the others (a Redis Cluster
    /// node that is down fails only its own items). An all-or-nothing batch
    /// is one atomic transition: its items are all decided or all failed.
    /// An item not decided by `deadline` fails, and is never counted later.
    fn check(
        &self,
        items: &[CheckItem<'_>],
        mode: BatchMode,
        deadline: Deadline,
    ) -> impl Future<Output = Vec<ItemResult>> + Send;

    /// What `check_one` would decide, consuming and creating nothing.
    ///
    /// # Errors
    ///
    /// [`BackendError`] when the backend fails or cannot answer by
    /// `deadline`.
    fn peek(
        &self,
        item: &CheckItem<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = ItemResult> + Send;

    /// What `peek` would answer for each of `items`, consuming and creating
    /// nothing: one result per item, in order, each looked at on its own
    /// (a key named twice is answered twice from the same state). The
    /// default peeks at each, all at once; a backend that can look at
    /// several in one call (a standalone Redis, by script) does.
    fn peek_each(
        &self,
        items: &[CheckItem<'_>],
        deadline: Deadline,
    ) -> impl Future<Output = Vec<ItemResult>> + Send {
        futures_util::future::join_all(items.iter().map(move |item| self.peek(item, deadline)))
    }

    /// Forgets the state of `key` under the policy namespace `name`, as
    /// counted under `policy` (a backend that binds state to the counting
    /// parameters forgets the state those parameters give meaning to).
    ///
    /// # Errors
    ///
    /// [`BackendError`] when the backend fails or cannot answer by
    /// `deadline`; the state is not forgotten later then.
    fn reset(
        &self,
        name: &str,
        policy: &Policy,
        key: &str,
        deadline: Deadline,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Settles the lease `item.ask` names and grants a new one, in one
    /// atomic transition with the key's state (quotad-core's grant
    /// ledger: [`quotad_core::MemoryStore::lease`] is the reference).
    ///
    /// # Errors
    ///
    /// [`BackendError`] when the backend fails or cannot answer by
    /// `deadline`: nothing is granted or returned then, nor later. The
    /// inner [`LeaseError`] is the caller's (an unknown or overspent
    /// lease), and changes nothing either.
    fn lease(
        &self,
        item: &LeaseItem<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = LeaseResult> + Send;

    /// Acquires a slot of a concurrency limit (`item` made by
    /// [`CheckItem::acquire`]), atomically with the key's other slots
    /// ([`quotad_core::MemoryStore::acquire`] is the reference).
    ///
    /// # Errors
    ///
    /// [`BackendError`] when the backend fails or cannot answer by
    /// `deadline`: nothing is taken then, nor later.
    fn acquire(
        &self,
        item: &CheckItem<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = AcquireResult> + Send;

    /// Renews a live slot to `slot_ttl` from now.
    ///
    /// # Errors
    ///
    /// [`BackendError`] when the backend fails or cannot answer by
    /// `deadline`: the slot is not renewed then, nor later.
    fn renew(
        &self,
        slot: &SlotItem<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = SlotResult> + Send;

    /// Releases a slot, idempotently: only the slot with this id, if live.
    ///
    /// # Errors
    ///
    /// [`BackendError`] when the backend fails or cannot answer by
    /// `deadline`; the slot then ends by its TTL if no later release comes.
    fn release(
        &self,
        slot: &SlotItem<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = SlotResult> + Send;

    /// Changes a runtime override where every replica on this store reads
    /// it, in one atomic step: checks the policy's room (for a new one),
    /// writes or removes it, purges expired ones, advances the version and
    /// answers the value it replaced. A store in this process keeps
    /// nothing (it has no other replica, and its overrides go into its
    /// snapshot); a wrapper passes it on. No default: a wrapper that
    /// forgot would drop every override.
    ///
    /// # Errors
    ///
    /// [`OverrideWriteError`]: the policy is full, the store did not apply
    /// it, or the answer did not come (it may have been applied).
    fn write_override(
        &self,
        write: &OverrideWrite<'_>,
        deadline: Deadline,
    ) -> impl Future<Output = Result<OverrideWritten, OverrideWriteError>> + Send;

    /// The runtime overrides the store keeps, as (field, value) pairs, and
    /// their version, unless it is `known` (the same epoch and count: then
    /// `None`, cheaply; a smaller count is the store gone back, and is
    /// answered). `None` too for
    /// a store that keeps none (the memory store).
    ///
    /// # Errors
    ///
    /// [`BackendError`] when the store cannot answer by `deadline`.
    fn load_overrides(
        &self,
        known: Option<OverridesVersion>,
        deadline: Deadline,
    ) -> impl Future<Output = Result<Option<StoredOverrides>, BackendError>> + Send;

    /// Counts for the metrics, the backend's own [`Figure`]s included;
    /// cheap enough to call on every scrape.
    fn stats(&self) -> BackendStats;

    /// Whether the store can serve now, by the cheapest call that proves
    /// it (for Redis, a round trip). Readiness follows it when
    /// `server.readiness_follows_store` is on. The default is always
    /// healthy: a store in this process cannot be unreachable.
    ///
    /// # Errors
    ///
    /// [`BackendError`] when the store cannot serve.
    fn probe(&self) -> impl Future<Output = Result<(), BackendError>> + Send {
        std::future::ready(Ok(()))
    }

    /// Whether a denied item marked [`Spend::Always`](quotad_core::Spend)
    /// spends what is left of its budget in the same atomic transition (in
    /// `check_one` and independent `check`). A backend that answers `false`
    /// treats every item as [`Spend::WhenAdmitted`](quotad_core::Spend);
    /// callers that need the spending then spend by a second check of what
    /// the denial reported left, which is safe (it never admits more than
    /// the limit) but not atomic with the denial.
    fn spends_when_denied(&self) -> bool {
        false
    }

    /// Whether `items` can be decided here as one all-or-nothing batch,
    /// by their size and by where their keys live. Asked of no items, it
    /// says the most the backend ever promises. The default is always
    /// atomic: one process holds every key.
    fn atomicity<'i>(&self, items: impl IntoIterator<Item = CheckItem<'i>>) -> Atomicity {
        let _ = items;
        Atomicity::Atomic
    }
}
