//! Load generation for quotad, and the no-op gRPC server that is its floor.
//!
//! Performance is measured against the physical floor on the same machine in
//! the same run: the no-op server speaks the same `quotad.v1.Quota` API with
//! the same tonic settings as quotad, but answers every call at once with a
//! fixed allowed decision. The ratio quotad / no-op at the same concurrency
//! is what quotad's own work costs.
//!
//! - [`serve_noop`]: the no-op server on a listener the caller bound.
//! - [`run`]: the load generator's core. A [`LoadConfig`] says what to send
//!   (unary `Check` or `CheckBatch`, which keys, which policy), how hard
//!   (concurrency over a number of HTTP/2 connections, closed loop or paced
//!   at a fixed rate) and for how long; the [`Report`] holds throughput,
//!   latency percentiles, errors by gRPC code and the allowed and denied
//!   counts.
//! - The `loadgen` and `noop-server` binaries are thin command lines over
//!   these two; `scripts/bench.sh` puts them next to the real server.
//!
//! Layout: `noop` (the server), `config` (what a run does), `keys` (key
//! distributions), `load` (connections, workers, pacing), `report`
//! (tallies and percentiles).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use quotad_bench::{LoadConfig, Mode, PolicySpec};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let target = format!("http://{}", listener.local_addr()?);
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let server = tokio::spawn(quotad_bench::serve_noop(listener, async {
//!     let _ = stopped.await;
//! }));
//!
//! let mut config = LoadConfig::new(target, "fixed_window:100:60000".parse::<PolicySpec>()?);
//! config.mode = Mode::Batch { size: 10 };
//! config.duration = None;
//! config.requests = Some(20);
//! let report = quotad_bench::run(config).await?;
//! assert_eq!(report.requests, 20);
//! assert_eq!(report.decisions, 200);
//! assert_eq!(report.allowed, 200); // the no-op server allows everything
//!
//! let _ = stop.send(());
//! server.await??;
//! # Ok(())
//! # }
//! ```

mod config;
mod keys;
mod load;
mod noop;
mod report;

pub use config::{ConfigError, LoadConfig, MAX_DURATION, Mode, PolicySpec};
pub use keys::{KeyDistribution, ParseKeysError};
pub use load::{LoadError, run};
pub use noop::{NoopQuota, NoopRls, serve_noop, serve_noop_unix};
pub use report::{ClientCalls, Latency, LatencyOrigin, LeaseCounts, Report};
