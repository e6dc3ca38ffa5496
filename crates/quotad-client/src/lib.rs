//! quotad-client: a thin async client for quotad, and (with the `http`
//! feature) a tower layer that rate-limits HTTP services through it.
//!
//! Every application replica that asks the same quotad shares one budget:
//! ten replicas with a limit of 100 admit 100, not 1,000.
//!
//! - [`Client`]: `check`, `check_batch`, `peek`, `reset`, with a per-call
//!   deadline and a [`FailurePolicy`] for when quotad cannot be reached;
//!   cheap to clone, reconnects by itself. Addresses are `http://host:port`,
//!   `https://host:port` (with a [`TlsConfig`]: a CA, optionally a client
//!   certificate for mTLS) or `unix:///path/to.sock`.
//! - Calls per decision are kept low where exactness allows: concurrent
//!   checks leave together as one `CheckBatch` while the client's in-flight
//!   slots are busy ([`Coalescing`]; a lone check is sent at once), and a
//!   `LIMIT_EXCEEDED` denial is answered locally until its retry time
//!   ([`ClientBuilder::deny_cache`]).
//! - Leases ([`ClientBuilder::leases`], off by default): the client holds
//!   shares of a key's budget that quotad charged when it granted them,
//!   and admits with them locally, without a call, until their units or
//!   time run out ([`Client::lease_stats`], [`Client::shutdown`]).
//! - Concurrency limits: [`Client::acquire`] holds a slot of a concurrency
//!   policy in a [`SlotGuard`] that renews it in the background and
//!   releases it when dropped (on panic and cancellation too).
//! - `RateLimitLayer` (feature `http`): keys, prices and checks each HTTP
//!   request; answers `429` with `Retry-After` and `RateLimit` headers on
//!   denial.
//!
//! Layout, each module importing only those listed before it: `request`
//! (checks, failure policies, errors), `transport` (addresses, TLS and
//! keepalive), `deny_cache`, `lease` (lease settings, the table of leases
//! held and the local spend), `queue` (the coalescing settings and state),
//! `shared` (what clones share, and how a call goes out), `coalesce`
//! (batches: what leaves when, what an answer means), `lessee` (acquiring,
//! renewing and returning leases), `client` (the handle), `slot`
//! (concurrency slots: [`Client::acquire`] and its guard), `builder` (its
//! settings, and how it connects) and `layer` (the HTTP layer).
//!
//! Features: `tls` (default) brings rustls with the ring provider for
//! `https://` addresses; `http` brings the tower layer and its axum, `http`
//! and `ipnet` dependencies; `otel` (off by default: it adds the
//! OpenTelemetry API crate) sends the caller's OpenTelemetry context with
//! each call (`traceparent`, through the application's global propagator;
//! the current `tracing` span's when bridged by `tracing-opentelemetry`),
//! so quotad's spans join the caller's trace. A check that waits to leave
//! in a coalesced batch carries none: the batch is sent by a task of its
//! own.
//!
//! A client is made once and cloned freely; it connects on first use. When
//! quotad cannot be reached, the failure policy answers within the deadline
//! (nothing listens on port 1 here):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), quotad_client::Error> {
//! use std::time::Duration;
//! use quotad_client::{Check, Client, FailurePolicy, Reason};
//!
//! let client = Client::builder("http://127.0.0.1:1")
//!     .deadline(Duration::from_millis(200))
//!     .on_unavailable(FailurePolicy::FailOpen)
//!     .build()?;
//! let decision = client.check(&Check::named("api", "user-42").cost(2)).await?;
//! assert!(decision.allowed);
//! assert_eq!(decision.reason, Reason::FailOpen);
//! # Ok(())
//! # }
//! ```

mod builder;
mod client;
mod coalesce;
mod deny_cache;
#[cfg(feature = "http")]
mod layer;
mod lease;
mod lessee;
mod queue;
mod request;
mod shared;
mod slot;
mod transport;

pub use builder::ClientBuilder;
pub use client::{Client, OUTAGE_LOG_INTERVAL};
pub use coalesce::{BATCH_REFUSAL_BACKOFF, MAX_RESENT_ALONE};
pub use deny_cache::DEFAULT_DENY_CACHE_CAPACITY;
#[cfg(feature = "http")]
pub use layer::{
    ConcurrencyLayer, ConcurrencyLimit, IpPrefixes, KeyExtractor, PrefixError, RateLimit,
    RateLimitLayer, SlotBody, retry_after_secs,
};
pub use lease::{
    DEFAULT_DIRECT_BACKOFF, DEFAULT_LEASE_MARGIN, DEFAULT_MAX_LEASED_KEYS, LeaseOptions,
    LeaseOptionsError, LeaseStats, MAX_LEASE_WANT, NOT_LEASABLE_RECHECK,
};
pub use queue::{Coalescing, CoalescingError, DEFAULT_MAX_BATCH_BYTES, DEFAULT_MAX_IN_FLIGHT};
pub use quotad_core::{BatchMode, Clock, Decision, LeaseTerms, Reason};
pub use request::{Check, DEFAULT_DEADLINE, Error, FailurePolicy, PolicyRef};
pub use slot::{Acquired, SlotGuard};
pub use transport::{
    DEFAULT_KEEPALIVE_INTERVAL, DEFAULT_KEEPALIVE_TIMEOUT, Keepalive, KeepaliveError, TlsConfig,
};
