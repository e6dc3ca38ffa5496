//! Logs that an outage or an attack would repeat on every call: at most one
//! line per interval, carrying the count of the events kept quiet
//! ([`quotad_core::Throttle`]); and an error written with its causes, each
//! once ([`Causes`]).

use std::error::Error;
use std::fmt;
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

/// An event formatter that adds the trace id to the lines written inside
/// an exported span ([`crate::trace`]): a `trace_id` member first in a
/// JSON line, ` trace_id=<32 hex digits>` at the end of a text line. Other
/// lines are `F`'s own, unchanged. A line that carries it is formatted
/// without ANSI colours.
///
/// The current span is the process's global subscriber's, which the
/// server installs; under a scoped subscriber no line carries a trace id.
#[derive(Debug)]
pub struct WithTraceId<F> {
    inner: F,
    json: bool,
}

impl<F> WithTraceId<F> {
    /// `inner`'s lines, JSON objects when `json`, with trace ids.
    pub fn new(inner: F, json: bool) -> Self {
        WithTraceId { inner, json }
    }
}

impl<S, N, F> tracing_subscriber::fmt::FormatEvent<S, N> for WithTraceId<F>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
    F: tracing_subscriber::fmt::FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let Some(trace_id) = crate::trace::current_trace_id() else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner.format_event(
            ctx,
            tracing_subscriber::fmt::format::Writer::new(&mut line),
            event,
        )?;
        let body = line.strip_suffix('\n').unwrap_or(&line);
        match body.strip_prefix('{') {
            Some(rest) if self.json => writeln!(writer, "{{\"trace_id\":\"{trace_id}\",{rest}"),
            _ => writeln!(writer, "{body} trace_id={trace_id}"),
        }
    }
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

/// An error and its causes, outermost first, joined by `: `, each said
/// once: a cause whose text already ends the text of the error it caused
/// is left out, since an error that prints its source (as some libraries'
/// do) would otherwise repeat it.
#[derive(Clone, Copy, Debug)]
pub struct Causes<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut said = self.0.to_string();
        f.write_str(&said)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            let text = error.to_string();
            if !said.ends_with(&text) {
                write!(f, ": {text}")?;
            }
            said = text;
            cause = error.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error with a message and, perhaps, a source.
    #[derive(Debug)]
    struct Link(String, Option<Box<Link>>);

    impl fmt::Display for Link {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl Error for Link {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|l| l as &(dyn Error + 'static))
        }
    }

    fn link(text: &str, source: Option<Link>) -> Link {
        Link(text.to_owned(), source.map(Box::new))
    }

    #[test]
    fn an_error_is_written_with_each_cause_once() {
        let refused = || link("Connection refused (os error 111)", None);
        let chain = link("cannot connect", Some(link("redis", Some(refused()))));
        assert_eq!(
            Causes(&chain).to_string(),
            "cannot connect: redis: Connection refused (os error 111)"
        );
        // A wrapper that prints its source too does not repeat it.
        let repeating = link(
            "state store: Connection refused (os error 111)",
            Some(refused()),
        );
        assert_eq!(
            Causes(&repeating).to_string(),
            "state store: Connection refused (os error 111)"
        );
    }
}
