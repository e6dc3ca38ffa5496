//! quotad-client: a thin async client for quotad, and a tower layer that
//! rate-limits HTTP services through it.
//!
//! Every application replica that asks the same quotad shares one budget:
//! ten replicas with a limit of 100 admit 100, not 1,000.
//!
//! - [`Client`]: `check`, `check_batch`, `peek`, `reset`, with a per-call
//!   deadline and a [`FailurePolicy`] for when quotad cannot be reached;
//!   cheap to clone, reconnects by itself.
//! - [`RateLimitLayer`]: keys, prices and checks each HTTP request; answers
//!   `429` with `Retry-After` and `RateLimit` headers on denial.
//!
//! ```no_run
//! # async fn run() -> Result<(), quotad_client::Error> {
//! use quotad_client::{Check, Client};
//!
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! let decision = client.check(&Check::named("api", "user-42").cost(2)).await?;
//! assert!(decision.remaining <= decision.limit);
//! # Ok(())
//! # }
//! ```

mod client;
mod layer;

pub use client::{Check, Client, ClientBuilder, DEFAULT_DEADLINE, Error, FailurePolicy, PolicyRef};
pub use layer::{KeyExtractor, RateLimit, RateLimitLayer, retry_after_secs};
pub use quotad_core::{BatchMode, Decision, Reason};
