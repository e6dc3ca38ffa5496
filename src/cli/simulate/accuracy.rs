//! How often the sliding window counter decides differently from the
//! exact sliding log on the same random traffic.

use super::*;

/// How fast each key of a traffic mix sends, relative to its limit.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mix {
    /// Every key at this multiple of the limit.
    Uniform(f64),
    /// Each key at a multiple drawn log-uniformly from 1/100 to 10:
    /// most keys well under their limit, some far over it.
    Spread,
}

impl Mix {
    pub(crate) fn label(self) -> String {
        match self {
            Mix::Uniform(m) => format!("{m} x limit, every key"),
            Mix::Spread => "1/100 .. 10 x, log-uniform".to_owned(),
        }
    }
}

/// The traffic mixes of the accuracy table.
pub(super) const MIXES: [Mix; 7] = [
    Mix::Uniform(0.5),
    Mix::Uniform(0.9),
    Mix::Uniform(1.0),
    Mix::Uniform(1.1),
    Mix::Uniform(2.0),
    Mix::Uniform(5.0),
    Mix::Spread,
];

/// Counts of the accuracy comparison.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) requests: u64,
    /// The counter admits where the exact rule denies: the last window
    /// already held the limit.
    pub(crate) counter_more: u64,
    /// The counter denies where the exact rule admits.
    pub(crate) counter_less: u64,
    /// Admitted by the counter.
    pub(crate) counter_admitted: u64,
    /// The most the counter admitted in any window-long interval.
    pub(crate) counter_most: u64,
    /// Admitted by the exact sliding log on the same arrivals.
    pub(crate) exact_admitted: u64,
}

impl Tally {
    pub(crate) fn differ(&self) -> u64 {
        self.counter_more + self.counter_less
    }

    pub(crate) fn share_percent(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        100.0 * self.differ() as f64 / self.requests as f64
    }

    /// Admitted by the counter relative to the exact log, in percent.
    pub(crate) fn admitted_vs_exact_percent(&self) -> f64 {
        if self.exact_admitted == 0 {
            return 0.0;
        }
        100.0 * (self.counter_admitted as f64 - self.exact_admitted as f64)
            / self.exact_admitted as f64
    }
}

/// Poisson arrivals at `per_ms` requests per millisecond over
/// `[0, duration_ms)`, as whole-millisecond instants from `start_ms`.
pub(crate) fn poisson(
    rng: &mut ChaCha8Rng,
    per_ms: f64,
    start_ms: u64,
    duration_ms: u64,
) -> Vec<u64> {
    let gaps = Exp::new(per_ms).expect("a positive, finite rate");
    let mut arrivals = Vec::new();
    let mut at = gaps.sample(rng);
    while at < duration_ms as f64 {
        arrivals.push(start_ms + at as u64);
        at += gaps.sample(rng);
    }
    arrivals
}

/// The sliding window counter against the exact sliding log, on `keys`
/// keys of Poisson traffic from `mix` (stream `stream` of `seed`).
pub(crate) fn compare(mix: Mix, seed: u64, stream: u64, keys: u64, windows: u64) -> Tally {
    let window = Duration::from_millis(ACCURACY_WINDOW_MS);
    let counter = Policy::try_new(Algorithm::SlidingWindow, ACCURACY_LIMIT, window, None)
        .expect("the accuracy policy is within every bound");
    let exact = Policy::try_new(Algorithm::SlidingLog, ACCURACY_LIMIT, window, None)
        .expect("the accuracy policy is within every bound");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    let mut tally = Tally::default();
    for _ in 0..keys {
        let multiple = match mix {
            Mix::Uniform(m) => m,
            Mix::Spread => 10_f64.powf(rng.random_range(-2.0..1.0)),
        };
        let per_ms = multiple * ACCURACY_LIMIT as f64 / ACCURACY_WINDOW_MS as f64;
        let arrivals = poisson(&mut rng, per_ms, EPOCH_MS, windows * ACCURACY_WINDOW_MS);
        compare_key(&arrivals, &counter, &exact, &mut tally);
    }
    tally
}

/// One key's traffic, decided by the counter as it runs in production (on
/// its own admissions) and judged at each request by the exact rule on the
/// same history: admit when the last window holds at most `limit - cost`.
/// The exact sliding log runs alongside on the same arrivals, for totals.
fn compare_key(arrivals: &[u64], counter: &Policy, exact: &Policy, tally: &mut Tally) {
    let one = NonZeroU64::MIN;
    let limit = exact.limit();
    let mut counter_state = None;
    let mut counted = Trailing::new(counter.window_ms());
    let mut exact_state = None;
    for &t in arrivals {
        let (state, decision) = decide(counter, counter_state.take(), t, one);
        counter_state = state;
        let exact_says = counted.record(t, 0) < limit;
        match (decision.allowed, exact_says) {
            (true, false) => tally.counter_more += 1,
            (false, true) => tally.counter_less += 1,
            _ => {}
        }
        let in_window = counted.record(t, u64::from(decision.allowed));
        tally.counter_most = tally.counter_most.max(in_window);
        tally.counter_admitted += u64::from(decision.allowed);

        let (state, decision) = decide(exact, exact_state.take(), t, one);
        exact_state = state;
        tally.exact_admitted += u64::from(decision.allowed);
        tally.requests += 1;
    }
}
