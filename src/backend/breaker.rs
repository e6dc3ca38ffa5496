//! The breaker of the local fallback (`on_error = "local"`): once the
//! store fails a call, no call is sent to it until a probe answers.
//!
//! - **Closed**: calls go to the store. An outage of a call opens it.
//! - **Open**: calls are decided locally at once, none is sent. After the
//!   back-off, the next call becomes the probe.
//! - **Half-open**: one call probes the store ([`super::Backend::probe`]);
//!   every other is decided locally meanwhile. The probe answering closes
//!   the breaker; failing (or given up by its caller) opens it again for
//!   twice the back-off, up to [`RETRY_MAX`].
//!
//! The back-off is the one the Redis connection waits between attempts to
//! connect in the background ([`Backoff`]: from [`RETRY_FIRST`], doubling
//! up to [`RETRY_MAX`]); it starts over once a call sent with the breaker
//! closed is answered.
//!
//! Time is the injected [`Clock`], so the state machine is tested with a
//! fake one.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quotad_core::Clock;

/// The first wait between attempts (to connect, to probe).
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(100);
/// The longest wait between attempts.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(5);

/// Waits between attempts: from `first`, doubled after each failure up to
/// `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    first: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// From [`RETRY_FIRST`] up to [`RETRY_MAX`].
    pub(crate) const DEFAULT: Backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);

    /// From `first`, doubling up to `max`.
    pub(crate) const fn new(first: Duration, max: Duration) -> Self {
        Backoff {
            first,
            max,
            next: first,
        }
    }

    /// The wait before the next attempt; the one after is twice as long.
    pub(crate) fn next(&mut self) -> Duration {
        let wait = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        wait
    }

    /// Starts over from the first wait.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

/// Where the breaker is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Calls go to the store.
    Closed,
    /// Calls are decided locally; none goes to the store.
    Open,
    /// One probe of the store is under way; other calls are decided
    /// locally.
    HalfOpen,
}

impl State {
    const ALL: [State; 3] = [State::Closed, State::Open, State::HalfOpen];

    /// The value of the `quotad_store_breaker_state` gauge: 0 closed, 1
    /// open, 2 half-open.
    pub fn gauge(self) -> u64 {
        match self {
            State::Closed => 0,
            State::Open => 1,
            State::HalfOpen => 2,
        }
    }

    /// The `to` label of a transition into this state.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }

    fn from_u8(value: u8) -> State {
        State::ALL
            .into_iter()
            .find(|s| s.gauge() == u64::from(value))
            .unwrap_or(State::Closed)
    }
}

/// What a call may do now ([`Breaker::admit`]).
#[derive(Debug)]
pub enum Admit {
    /// Go to the store.
    Send,
    /// Probe the store first; send the call only if the probe answers.
    Probe(Probe),
    /// Decide locally, at once.
    Local,
}

/// The breaker ([module docs](self)).
#[derive(Debug)]
pub struct Breaker {
    clock: Arc<dyn Clock>,
    /// The [`State`], as its gauge value: read without the lock on every
    /// call.
    state: AtomicU8,
    /// Whether the back-off has grown since a call last succeeded.
    grown: AtomicBool,
    inner: Mutex<Inner>,
    /// Transitions, by the state entered, in [`State::ALL`]'s order.
    transitions: [AtomicU64; 3],
}

#[derive(Debug)]
struct Inner {
    /// When an open breaker lets the next probe through, in clock ms.
    retry_at_ms: u64,
    backoff: Backoff,
}

impl Breaker {
    /// A closed breaker reading `clock`, waiting by `backoff` between
    /// probes.
    pub(crate) fn new(clock: Arc<dyn Clock>, backoff: Backoff) -> Self {
        Breaker {
            clock,
            state: AtomicU8::new(0),
            grown: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                retry_at_ms: 0,
                backoff,
            }),
            transitions: Default::default(),
        }
    }

    /// Where the breaker is now.
    pub fn state(&self) -> State {
        State::from_u8(self.state.load(Ordering::Acquire))
    }

    /// How many times the breaker entered `state` since start.
    pub fn transitions(&self, state: State) -> u64 {
        self.transitions[index(state)].load(Ordering::Relaxed)
    }

    /// What a call may do now: closed, go to the store; open, decide
    /// locally, unless the back-off has passed, when this call probes
    /// (the breaker is half-open until it settles); half-open, decide
    /// locally.
    pub fn admit(self: &Arc<Self>) -> Admit {
        if self.state() == State::Closed {
            return Admit::Send;
        }
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match self.state() {
            State::Closed => Admit::Send,
            State::Open if self.clock.now_ms() >= inner.retry_at_ms => {
                self.enter(State::HalfOpen);
                Admit::Probe(Probe {
                    breaker: Some(Arc::clone(self)),
                })
            }
            State::Open | State::HalfOpen => Admit::Local,
        }
    }

    /// A call sent with the breaker closed met an outage: the breaker
    /// opens for the first back-off (or the next, after a probe that
    /// failed before). Does nothing when it is not closed: a call sent
    /// before it opened tells nothing new.
    pub fn failed(&self) {
        if self.state() != State::Closed {
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if self.state() == State::Closed {
            self.open(&mut inner);
        }
    }

    /// A call sent with the breaker closed was answered: the back-off
    /// starts over.
    pub fn succeeded(&self) {
        if self.grown.load(Ordering::Relaxed) && self.state() == State::Closed {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            inner.backoff.reset();
            self.grown.store(false, Ordering::Relaxed);
        }
    }

    fn open(&self, inner: &mut Inner) {
        let wait = inner.backoff.next();
        self.grown.store(true, Ordering::Relaxed);
        let wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        inner.retry_at_ms = self.clock.now_ms().saturating_add(wait_ms);
        self.enter(State::Open);
    }

    fn settle(&self, answered: bool) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if self.state() != State::HalfOpen {
            return;
        }
        if answered {
            self.enter(State::Closed);
        } else {
            self.open(&mut inner);
        }
    }

    fn enter(&self, state: State) {
        let value = u8::try_from(state.gauge()).unwrap_or(0);
        self.state.store(value, Ordering::Release);
        self.transitions[index(state)].fetch_add(1, Ordering::Relaxed);
    }
}

fn index(state: State) -> usize {
    usize::try_from(state.gauge()).unwrap_or(0)
}

/// The one probe of a half-open breaker: settled by its outcome, or as
/// failed when dropped unsettled (its caller gave up on it).
#[derive(Debug)]
pub struct Probe {
    breaker: Option<Arc<Breaker>>,
}

impl Probe {
    /// The probe's outcome: answered closes the breaker, failed opens it
    /// again for a longer back-off.
    pub fn settle(mut self, answered: bool) {
        if let Some(breaker) = self.breaker.take() {
            breaker.settle(answered);
        }
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Some(breaker) = self.breaker.take() {
            breaker.settle(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use quotad_core::FakeClock;

    use super::*;

    fn breaker(clock: &Arc<FakeClock>) -> Arc<Breaker> {
        Arc::new(Breaker::new(
            Arc::clone(clock) as Arc<dyn Clock>,
            Backoff::new(Duration::from_millis(100), Duration::from_millis(400)),
        ))
    }

    fn probe(admit: Admit) -> Probe {
        match admit {
            Admit::Probe(probe) => probe,
            other => panic!("expected a probe, got {other:?}"),
        }
    }

    #[test]
    fn a_closed_breaker_sends_every_call_and_an_answer_keeps_it_closed() {
        let clock = Arc::new(FakeClock::new(1_000));
        let b = breaker(&clock);
        for _ in 0..3 {
            assert!(matches!(b.admit(), Admit::Send));
            b.succeeded();
        }
        assert_eq!(b.state(), State::Closed);
        assert_eq!(b.transitions(State::Open), 0);
    }

    #[test]
    fn an_outage_opens_it_and_calls_are_local_until_the_back_off_passes() {
        let clock = Arc::new(FakeClock::new(1_000));
        let b = breaker(&clock);
        b.failed();
        assert_eq!(b.state(), State::Open);
        assert!(matches!(b.admit(), Admit::Local));
        clock.advance(Duration::from_millis(99));
        assert!(
            matches!(b.admit(), Admit::Local),
            "1 ms before the back-off"
        );
        clock.advance(Duration::from_millis(1));
        let p = probe(b.admit());
        assert_eq!(b.state(), State::HalfOpen);
        p.settle(true);
        assert_eq!(b.state(), State::Closed);
        assert!(matches!(b.admit(), Admit::Send));
        assert_eq!(
            [State::Open, State::HalfOpen, State::Closed].map(|s| b.transitions(s)),
            [1, 1, 1]
        );
    }

    #[test]
    fn only_one_probe_runs_at_a_time_and_the_rest_are_local() {
        let clock = Arc::new(FakeClock::new(1_000));
        let b = breaker(&clock);
        b.failed();
        clock.advance(Duration::from_secs(1));
        let p = probe(b.admit());
        for _ in 0..5 {
            assert!(matches!(b.admit(), Admit::Local));
        }
        // A call sent before the breaker opened, failing now, changes
        // nothing.
        b.failed();
        assert_eq!(b.state(), State::HalfOpen);
        p.settle(true);
        assert_eq!(b.state(), State::Closed);
    }

    #[test]
    fn a_failed_probe_doubles_the_back_off_up_to_its_most() {
        let clock = Arc::new(FakeClock::new(1_000));
        let b = breaker(&clock);
        b.failed();
        clock.advance(Duration::from_millis(100));
        for wait in [200, 400, 400] {
            probe(b.admit()).settle(false);
            assert_eq!(b.state(), State::Open);
            clock.advance(Duration::from_millis(wait - 1));
            assert!(matches!(b.admit(), Admit::Local), "{wait} ms - 1");
            clock.advance(Duration::from_millis(1));
        }
        assert!(matches!(b.admit(), Admit::Probe(_)));
    }

    #[test]
    fn a_probe_given_up_by_its_caller_counts_as_failed() {
        let clock = Arc::new(FakeClock::new(1_000));
        let b = breaker(&clock);
        b.failed();
        clock.advance(Duration::from_millis(100));
        drop(probe(b.admit()));
        assert_eq!(b.state(), State::Open);
        clock.advance(Duration::from_millis(199));
        assert!(matches!(b.admit(), Admit::Local), "the back-off doubled");
    }

    #[test]
    fn the_back_off_starts_over_once_a_call_is_answered_after_closing() {
        let clock = Arc::new(FakeClock::new(1_000));
        let b = breaker(&clock);
        b.failed();
        clock.advance(Duration::from_secs(1));
        probe(b.admit()).settle(false);
        clock.advance(Duration::from_secs(1));
        probe(b.admit()).settle(true);
        // Closed without a call answered yet: the next outage waits on.
        b.failed();
        clock.advance(Duration::from_millis(399));
        assert!(
            matches!(b.admit(), Admit::Local),
            "still the grown back-off"
        );
        clock.advance(Duration::from_millis(1));
        probe(b.admit()).settle(true);
        b.succeeded();
        b.failed();
        clock.advance(Duration::from_millis(100));
        assert!(
            matches!(b.admit(), Admit::Probe(_)),
            "back to the first wait"
        );
    }

    #[test]
    fn backoff_doubles_from_its_first_wait_to_its_most_and_starts_over() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let waits: Vec<u128> = (0..4).map(|_| b.next().as_millis()).collect();
        assert_eq!(waits, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next(), Duration::from_millis(100));
    }
}
