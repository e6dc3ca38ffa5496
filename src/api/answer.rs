//! What both APIs answer when the store failed, and what they count of
//! their calls to it: `quotad.v1` ([`super::quota`]) and Envoy RLS
//! ([`super::rls`]) share one store, one `on_error` and one set of
//! metrics, so they share these too.

use std::sync::OnceLock;

use metrics::Counter;
use quotad_core::{BatchMode, Decision, Policy, Reason};

use super::error::ServiceError;
use crate::backend::BackendError;
use crate::config::OnError;
use crate::log::Throttled;
use crate::metrics::Metrics;

/// `quotad_store_operations_total`, one handle per operation.
#[derive(Debug)]
pub(super) struct StoreOps {
    pub(super) check: Counter,
    pub(super) check_batch: Counter,
    pub(super) peek: Counter,
    pub(super) reset: Counter,
}

impl StoreOps {
    /// The counters of the backend `name`.
    pub(super) fn new(metrics: &Metrics, name: &'static str) -> Self {
        StoreOps {
            check: metrics.store_operation(name, "check"),
            check_batch: metrics.store_operation(name, "check_batch"),
            peek: metrics.store_operation(name, "peek"),
            reset: metrics.store_operation(name, "reset"),
        }
    }
}

/// What a check under `policy` answers when the backend failed: as
/// `on_error` says, a decision whose reason tells what happened, or the
/// error itself. Only an unavailable backend is subject to `on_error`;
/// answered item by item, an error (`on_error = error`, or a fault of the
/// backend) gives the item [`Reason::Unavailable`], since the call as a
/// whole cannot fail once other items are consumed.
pub(super) fn on_backend_error(
    error: &BackendError,
    on_error: OnError,
    policy: &Policy,
    answer: Answer,
) -> Result<Decision, ServiceError> {
    let reason = match (error, on_error, answer) {
        (BackendError::Unavailable(_), OnError::FailOpen, _) => Reason::FailOpen,
        // What the local fallback does not decide (a concurrency slot: its
        // holder renews and releases it in the store) fails closed.
        (BackendError::Unavailable(_), OnError::FailClosed | OnError::Local, _) => {
            Reason::FailClosed
        }
        // Never failed open or closed: a fault is not an outage. Alone, it
        // is the call's error; in an independent batch, whose other items
        // may be consumed, it is the item's.
        (_, _, Answer::PerItem) => Reason::Unavailable,
        (_, _, Answer::Whole) => return Err(error.clone().into()),
    };
    Ok(Decision {
        allowed: reason == Reason::FailOpen,
        limit: policy.capacity(),
        remaining: 0,
        retry_after_ms: 0,
        reset_after_ms: 0,
        reason,
    })
}

/// How a call answers a failed item: as the whole call's error (a lone
/// check, or an all-or-nothing batch), or item by item (an independent
/// batch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Answer {
    Whole,
    PerItem,
}

impl Answer {
    /// How a batch of `mode` answers a failed item.
    pub(super) fn of(mode: BatchMode) -> Self {
        match mode {
            BatchMode::Independent => Answer::PerItem,
            BatchMode::AllOrNothing => Answer::Whole,
        }
    }
}

/// Logs a failed call to the state store: at most one line per
/// [`LOG_INTERVAL`](crate::log::LOG_INTERVAL) for the whole process,
/// carrying how many failures went unlogged since the last line. Every
/// service calls it where the failure happens, once per call.
pub(super) fn store_failed(error: &BackendError) {
    static LOG: OnceLock<Throttled> = OnceLock::new();
    log_failure(LOG.get_or_init(Throttled::default), error);
}

fn log_failure(log: &Throttled, error: &BackendError) {
    // What the request asked for, not a failure of the store: the caller
    // is told (FAILED_PRECONDITION), and nothing is logged.
    if matches!(
        error,
        BackendError::CrossSlot | BackendError::TooManyAtomicItems { .. }
    ) {
        return;
    }
    if let Some(suppressed) = log.record() {
        tracing::warn!(
            error = %crate::log::Causes(error),
            suppressed,
            "state store call failed; on_error applies (one line per interval: suppressed counts the failures since the last line)"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use quotad_core::FakeClock;

    use super::*;
    use crate::log::LOG_INTERVAL;

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
        let down = BackendError::from(crate::backend::NotRun::Client(
            "connection refused".to_owned(),
        ));
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..50 {
                log_failure(&log, &down);
            }
            assert_eq!(lines.text().lines().count(), 1, "{}", lines.text());
            clock.advance(LOG_INTERVAL);
            log_failure(&log, &down);
        });
        let text = lines.text();
        let logged: Vec<&str> = text.lines().collect();
        assert_eq!(logged.len(), 2, "{text}");
        assert!(logged[0].contains("suppressed=0"), "{text}");
        assert!(logged[1].contains("suppressed=49"), "{text}");
        assert!(logged[1].contains("connection refused"), "{text}");
    }
}
