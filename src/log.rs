//! Logs that an outage or an attack would repeat on every call: at most one
//! line per interval, carrying the count of the events kept quiet
//! ([`quotad_core::Throttle`]).

use std::sync::Arc;
use std::time::Duration;

use quotad_core::{Clock, MonotonicClock, Throttle};

/// Logs of a command-line tool (the client commands, the bench binaries)
/// on stderr: `RUST_LOG` filters, `default` without it (e.g. `warn`);
/// colours only on a terminal.
pub fn init_tool_logs(default: &str) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// How often a repeated warning is written, at most.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// One kind of repeated event, logged at most once per interval.
#[derive(Debug)]
pub(crate) struct Throttled {
    throttle: Throttle,
    clock: Arc<dyn Clock>,
}

impl Default for Throttled {
    /// Once per [`LOG_INTERVAL`] on a monotonic clock (a wall clock set
    /// back would silence the log for as long).
    fn default() -> Self {
        Throttled::new(LOG_INTERVAL, Arc::new(MonotonicClock::new()))
    }
}

impl Throttled {
    pub(crate) fn new(interval: Duration, clock: Arc<dyn Clock>) -> Self {
        Throttled {
            throttle: Throttle::new(interval),
            clock,
        }
    }

    /// Records one event: `Some(suppressed)` when it should be logged, with
    /// the number of events kept quiet since the last line.
    pub(crate) fn record(&self) -> Option<u64> {
        self.throttle.record(self.clock.now_ms())
    }
}
