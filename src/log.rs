//! Logs that an outage or an attack would repeat on every call: at most one
//! line per interval, carrying the count of the events kept quiet
//! ([`quotad_core::Throttle`]).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use quotad_core::{Clock, MonotonicClock, Throttle};

use crate::backend::BackendError;

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

/// Logs a failed call to the state store: at most one line per
/// [`LOG_INTERVAL`] for the whole process, carrying how many failures went
/// unlogged since the last line. Every service calls it where the failure
/// happens, once per call.
pub(crate) fn store_failed(error: &BackendError) {
    static LOG: OnceLock<Throttled> = OnceLock::new();
    LOG.get_or_init(Throttled::default).store_failed(error);
}

impl Throttled {
    fn store_failed(&self, error: &BackendError) {
        // What the request asked for, not a failure of the store: the
        // caller is told (FAILED_PRECONDITION), and nothing is logged.
        if matches!(
            error,
            BackendError::CrossSlot | BackendError::TooManyAtomicItems { .. }
        ) {
            return;
        }
        if let Some(suppressed) = self.record() {
            tracing::warn!(
                %error,
                suppressed,
                "state store call failed; on_error applies (one line per interval: suppressed counts the failures since the last line)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Mutex;

    use quotad_core::FakeClock;

    use super::*;

    /// A writer collecting the log output in memory.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("lines").extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().expect("lines").clone()).expect("UTF-8")
        }
    }

    #[test]
    fn an_outage_writes_one_line_per_interval_with_the_count_of_the_others() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let clock = Arc::new(FakeClock::new(1_700_000_000_000));
        let log = Throttled::new(LOG_INTERVAL, clock.clone());
        let down = BackendError::Unavailable("connection refused".to_owned());
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..50 {
                log.store_failed(&down);
            }
            assert_eq!(lines.text().lines().count(), 1, "{}", lines.text());
            clock.advance(LOG_INTERVAL);
            log.store_failed(&down);
        });
        let text = lines.text();
        let logged: Vec<&str> = text.lines().collect();
        assert_eq!(logged.len(), 2, "{text}");
        assert!(logged[0].contains("suppressed=0"), "{text}");
        assert!(logged[1].contains("suppressed=49"), "{text}");
        assert!(logged[1].contains("connection refused"), "{text}");
    }
}
