//! Per-worker tallies and the report they add up to.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use tonic::Code;

/// The longest latency the histograms resolve; longer ones are recorded as
/// this (requests time out well before).
const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// What one request came to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    /// Answered with this many allowed and denied decisions.
    Decided { allowed: u64, denied: u64 },
    /// Failed with a gRPC status.
    Failed(Code),
    /// Answered, but with a different number of decisions than items asked.
    Malformed,
}

/// One worker's counts and latencies; workers tally alone and the tallies
/// are added up at the end, so the hot path shares nothing.
#[derive(Debug)]
pub(crate) struct Tally {
    latency_ns: Histogram<u64>,
    /// The requests answered with decisions only: what a server that sheds
    /// load keeps for the calls it accepts.
    decided_ns: Histogram<u64>,
    /// Open loop only: how late each measured request was sent.
    send_lag_ns: Option<Histogram<u64>>,
    requests: u64,
    allowed: u64,
    denied: u64,
    errors: [u64; 17],
    malformed: u64,
    pub(crate) warmup: u64,
    pub(crate) missed: u64,
    last_done: Option<Instant>,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3)
        .expect("1 ns to 60 s with 3 significant figures are valid bounds")
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos())
        .unwrap_or(u64::MAX)
        .max(1)
}

impl Tally {
    /// An empty tally; `open_loop` also tracks how late requests are sent.
    pub(crate) fn new(open_loop: bool) -> Self {
        Self {
            latency_ns: histogram(),
            decided_ns: histogram(),
            send_lag_ns: open_loop.then(histogram),
            requests: 0,
            allowed: 0,
            denied: 0,
            errors: [0; 17],
            malformed: 0,
            warmup: 0,
            missed: 0,
            last_done: None,
        }
    }

    /// Counts a measured request that took `latency` and finished at `done`.
    pub(crate) fn record(&mut self, latency: Duration, done: Instant, outcome: Outcome) {
        self.latency_ns.saturating_record(nanos(latency));
        self.requests += 1;
        self.last_done = Some(self.last_done.map_or(done, |last| last.max(done)));
        match outcome {
            Outcome::Decided { allowed, denied } => {
                self.decided_ns.saturating_record(nanos(latency));
                self.allowed += allowed;
                self.denied += denied;
            }
            Outcome::Failed(code) => {
                let slot = usize::try_from(code as i32).unwrap_or(usize::MAX);
                match self.errors.get_mut(slot) {
                    Some(count) => *count += 1,
                    None => self.errors[Code::Unknown as usize] += 1,
                }
            }
            Outcome::Malformed => self.malformed += 1,
        }
    }

    /// Counts how late an open-loop request was sent: the part of its
    /// latency spent before it left the load generator.
    pub(crate) fn record_send_lag(&mut self, lag: Duration) {
        if let Some(h) = &mut self.send_lag_ns {
            h.saturating_record(nanos(lag));
        }
    }

    /// Adds `other` into this tally.
    pub(crate) fn merge(&mut self, other: &Self) {
        self.latency_ns
            .add(&other.latency_ns)
            .expect("tallies share their histogram bounds");
        self.decided_ns
            .add(&other.decided_ns)
            .expect("tallies share their histogram bounds");
        match (&mut self.send_lag_ns, &other.send_lag_ns) {
            (Some(mine), Some(theirs)) => mine
                .add(theirs)
                .expect("tallies share their histogram bounds"),
            (mine @ None, Some(theirs)) => *mine = Some(theirs.clone()),
            (_, None) => {}
        }
        self.requests += other.requests;
        self.allowed += other.allowed;
        self.denied += other.denied;
        for (mine, theirs) in self.errors.iter_mut().zip(other.errors) {
            *mine += theirs;
        }
        self.malformed += other.malformed;
        self.warmup += other.warmup;
        self.missed += other.missed;
        self.last_done = match (self.last_done, other.last_done) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    pub(crate) fn last_done(&self) -> Option<Instant> {
        self.last_done
    }
}

/// Where latencies are measured from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencyOrigin {
    /// From the moment the request was sent (closed loop).
    Send,
    /// From the moment the schedule said to send it (open loop, `rate`): a
    /// request that waited for a free worker counts the wait. A request
    /// the pacer released early counts from its actual send.
    ScheduledSend,
}

/// Latency percentiles of the measured requests, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Latency {
    /// The fastest request.
    pub min_us: f64,
    /// The mean.
    pub mean_us: f64,
    /// The median.
    pub p50_us: f64,
    /// The 90th percentile.
    pub p90_us: f64,
    /// The 99th percentile.
    pub p99_us: f64,
    /// The 99.9th percentile.
    pub p999_us: f64,
    /// The slowest request.
    pub max_us: f64,
}

impl Latency {
    fn from_histogram(h: &Histogram<u64>) -> Self {
        #[allow(clippy::cast_precision_loss)]
        let us = |ns: u64| ns as f64 / 1_000.0;
        if h.is_empty() {
            return Self {
                min_us: 0.0,
                mean_us: 0.0,
                p50_us: 0.0,
                p90_us: 0.0,
                p99_us: 0.0,
                p999_us: 0.0,
                max_us: 0.0,
            };
        }
        Self {
            min_us: us(h.min()),
            mean_us: h.mean() / 1_000.0,
            p50_us: us(h.value_at_quantile(0.50)),
            p90_us: us(h.value_at_quantile(0.90)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// The outcome of a load run, counting only the measured phase (after the
/// warmup).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// `unary` or `batch:B`.
    pub mode: String,
    /// Items per request (1 for unary).
    pub batch_size: usize,
    /// Requests in flight at once (closed loop) or at most (open loop).
    pub concurrency: usize,
    /// HTTP/2 connections used.
    pub connections: usize,
    /// The key distribution, as written on the command line.
    pub keys: String,
    /// The prefix of every key.
    pub key_prefix: String,
    /// The policy, a name or `ALGORITHM:LIMIT:WINDOW_MS[:BURST]`.
    pub policy: String,
    /// The scheduled request rate per second, for an open-loop run.
    pub target_rate: Option<f64>,
    /// Seconds from the end of the warmup to the last answer.
    pub elapsed_secs: f64,
    /// Requests answered or failed.
    pub requests: u64,
    /// Decisions received: one per unary request, one per item of a batch.
    pub decisions: u64,
    /// Allowed decisions.
    pub allowed: u64,
    /// Denied decisions.
    pub denied: u64,
    /// Requests that failed, all codes together.
    pub errors: u64,
    /// Failed requests by gRPC code (`UNAVAILABLE`, ...), plus
    /// `MALFORMED_RESPONSE` for answers with the wrong number of decisions.
    pub errors_by_code: BTreeMap<String, u64>,
    /// `requests / elapsed_secs`.
    pub requests_per_sec: f64,
    /// `decisions / elapsed_secs`.
    pub decisions_per_sec: f64,
    /// Where latencies are measured from.
    pub latency_from: LatencyOrigin,
    /// Latency percentiles of every measured request, failed ones included.
    pub latency: Latency,
    /// Latency percentiles of the measured requests answered with
    /// decisions, failed ones (shed ones among them) left out.
    pub decided_latency: Latency,
    /// Open loop only: how late requests left the load generator after
    /// their scheduled time (waiting for a free worker, the pacer's timer
    /// slack, the generator's own CPU). Included in `latency`; when it is
    /// close to `latency`, the generator, not the server, is the limit.
    pub send_lag: Option<Latency>,
    /// Requests sent during the warmup, not counted above.
    pub warmup_requests: u64,
    /// Open loop only: scheduled requests never sent because the run's
    /// drain time ran out (the server could not keep up with the rate).
    pub missed: u64,
    /// `client` mode: the calls quotad-client made, when the caller of
    /// [`crate::run`] counted them ([`ClientCalls`]).
    pub client_calls: Option<ClientCalls>,
    /// `client` mode with leases on: what the clients' leases did over the
    /// whole run, warmup included.
    pub leases: Option<LeaseCounts>,
    /// The load generator's own CPU time (user + system, every thread) from
    /// the first request to the last answer, warmup included: what the
    /// client side paid, for comparing client settings on one machine.
    /// `None` where the process CPU clock cannot be read.
    pub loadgen_cpu_secs: Option<f64>,
    /// `loadgen_cpu_secs` per decision of the whole run (warmup included,
    /// as the CPU time is), in microseconds. It holds the load
    /// generator's own work (drawing keys, timing, tallying) next to the
    /// client's, the same in every mode.
    pub loadgen_cpu_us_per_decision: Option<f64>,
}

/// What the leases of a run's clients did, summed over the clients, from
/// [`quotad_client::Client::lease_stats`] read after the last answer (before
/// the clients return what they hold).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LeaseCounts {
    /// Checks admitted locally from a held lease, without a call.
    pub local_admissions: u64,
    /// Leases granted to a key that held none.
    pub acquired: u64,
    /// Leases granted in exchange for a settled one.
    pub renewed: u64,
    /// Leases given back with nothing asked in exchange.
    pub returned: u64,
    /// Answers `direct`: the key is checked call by call for a while.
    pub direct: u64,
    /// Lease calls that failed.
    pub failed: u64,
    /// `local_admissions / (requests + warmup_requests)`: the share of the
    /// run's decisions made without a call.
    pub local_share: f64,
}

impl LeaseCounts {
    /// The counts of `stats`, summed over the clients, for the run `report`
    /// is about.
    pub fn new(stats: &[quotad_client::LeaseStats], report: &Report) -> Self {
        let sum = |f: fn(&quotad_client::LeaseStats) -> u64| stats.iter().map(f).sum::<u64>();
        let local_admissions = sum(|s| s.local_admissions);
        let decisions = (report.requests + report.warmup_requests)
            * u64::try_from(report.batch_size).unwrap_or(1);
        // Counts stay far below 2^53, where u64 -> f64 is exact.
        #[allow(clippy::cast_precision_loss)]
        let local_share = if decisions > 0 {
            local_admissions as f64 / decisions as f64
        } else {
            0.0
        };
        Self {
            local_admissions,
            acquired: sum(|s| s.acquired),
            renewed: sum(|s| s.renewed),
            returned: sum(|s| s.returned),
            direct: sum(|s| s.direct),
            failed: sum(|s| s.failed),
            local_share,
        }
    }
}

/// The calls quotad-client made over a whole run, warmup included, from
/// its `quotad_client_calls_total` and `quotad_client_local_denials_total`
/// counters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ClientCalls {
    /// `Check` calls sent.
    pub checks: u64,
    /// `CheckBatch` calls sent.
    pub batches: u64,
    /// `Lease` calls sent (acquisitions, renewals and returns).
    pub leases: u64,
    /// Checks the deny cache answered without a call.
    pub local_denials: u64,
    /// Calls per decision: `(checks + batches + leases) / (requests +
    /// warmup_requests)`, as the counters span the warmup too.
    pub calls_per_decision: f64,
}

impl ClientCalls {
    /// The counts of the run `report` is about.
    pub fn new(
        checks: u64,
        batches: u64,
        leases: u64,
        local_denials: u64,
        report: &Report,
    ) -> Self {
        let decisions = report.requests + report.warmup_requests;
        // Counts stay far below 2^53, where u64 -> f64 is exact.
        #[allow(clippy::cast_precision_loss)]
        let calls_per_decision = if decisions > 0 {
            (checks + batches + leases) as f64 / decisions as f64
        } else {
            0.0
        };
        Self {
            checks,
            batches,
            leases,
            local_denials,
            calls_per_decision,
        }
    }
}

/// What the report says about the run itself, besides the tallies.
#[derive(Debug)]
pub(crate) struct RunInfo {
    pub(crate) mode: crate::Mode,
    pub(crate) concurrency: usize,
    pub(crate) connections: usize,
    pub(crate) keys: String,
    pub(crate) key_prefix: String,
    pub(crate) policy: String,
    pub(crate) target_rate: Option<f64>,
    pub(crate) measure_start: Instant,
    /// The load generator's CPU time over the run, when it could be read.
    pub(crate) loadgen_cpu: Option<Duration>,
    /// What the clients' leases did, with leases on.
    pub(crate) lease_stats: Option<Vec<quotad_client::LeaseStats>>,
}

impl Report {
    pub(crate) fn new(info: RunInfo, tally: &Tally) -> Self {
        let elapsed = tally.last_done().map_or(Duration::ZERO, |done| {
            done.saturating_duration_since(info.measure_start)
        });
        let elapsed_secs = elapsed.as_secs_f64();
        let errors_by_code: BTreeMap<String, u64> = tally
            .errors
            .iter()
            .enumerate()
            .filter(|(_, count)| **count > 0)
            .map(|(code, count)| {
                let code = Code::from_i32(i32::try_from(code).unwrap_or(2));
                (quotad_proto::convert::code_name(code).to_owned(), *count)
            })
            .chain(
                (tally.malformed > 0).then(|| ("MALFORMED_RESPONSE".to_owned(), tally.malformed)),
            )
            .collect();
        let errors = errors_by_code.values().sum();
        let decisions = tally.allowed + tally.denied;
        let per_sec = |count: u64| {
            if elapsed_secs > 0.0 {
                // Counts stay far below 2^53, where u64 -> f64 is exact.
                #[allow(clippy::cast_precision_loss)]
                let count = count as f64;
                count / elapsed_secs
            } else {
                0.0
            }
        };
        let latency = Latency::from_histogram(&tally.latency_ns);
        let decided_latency = Latency::from_histogram(&tally.decided_ns);
        let send_lag = tally.send_lag_ns.as_ref().map(Latency::from_histogram);
        let whole_run_decisions =
            (tally.requests + tally.warmup) * u64::try_from(info.mode.items()).unwrap_or(1);
        let loadgen_cpu_us_per_decision = info.loadgen_cpu.and_then(|cpu| {
            // Counts stay far below 2^53, where u64 -> f64 is exact.
            #[allow(clippy::cast_precision_loss)]
            let decisions = whole_run_decisions as f64;
            (whole_run_decisions > 0).then(|| cpu.as_secs_f64() * 1e6 / decisions)
        });
        let mut report = Self {
            mode: info.mode.to_string(),
            batch_size: info.mode.items(),
            concurrency: info.concurrency,
            connections: info.connections,
            keys: info.keys,
            key_prefix: info.key_prefix,
            policy: info.policy,
            target_rate: info.target_rate,
            elapsed_secs,
            requests: tally.requests,
            decisions,
            allowed: tally.allowed,
            denied: tally.denied,
            errors,
            errors_by_code,
            requests_per_sec: per_sec(tally.requests),
            decisions_per_sec: per_sec(decisions),
            latency_from: if info.target_rate.is_some() {
                LatencyOrigin::ScheduledSend
            } else {
                LatencyOrigin::Send
            },
            latency,
            decided_latency,
            send_lag,
            warmup_requests: tally.warmup,
            missed: tally.missed,
            client_calls: None,
            leases: None,
            loadgen_cpu_secs: info.loadgen_cpu.map(|cpu| cpu.as_secs_f64()),
            loadgen_cpu_us_per_decision,
        };
        if let Some(stats) = &info.lease_stats {
            report.leases = Some(LeaseCounts::new(stats, &report));
        }
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(start: Instant) -> RunInfo {
        RunInfo {
            mode: crate::Mode::Batch { size: 2 },
            concurrency: 2,
            connections: 1,
            keys: "hot".to_owned(),
            key_prefix: "t:".to_owned(),
            policy: "api".to_owned(),
            target_rate: None,
            measure_start: start,
            loadgen_cpu: None,
            lease_stats: None,
        }
    }

    #[test]
    fn merged_tallies_count_decisions_and_errors_by_code() {
        let start = Instant::now();
        let mut a = Tally::new(false);
        a.record(
            Duration::from_micros(100),
            start + Duration::from_millis(500),
            Outcome::Decided {
                allowed: 2,
                denied: 0,
            },
        );
        a.record(
            Duration::from_micros(300),
            start + Duration::from_millis(900),
            Outcome::Failed(Code::NotFound),
        );
        let mut b = Tally::new(false);
        b.record(
            Duration::from_micros(200),
            start + Duration::from_secs(1),
            Outcome::Decided {
                allowed: 1,
                denied: 1,
            },
        );
        b.record(
            Duration::from_micros(200),
            start + Duration::from_millis(10),
            Outcome::Malformed,
        );
        a.merge(&b);
        let report = Report::new(info(start), &a);
        assert_eq!(report.requests, 4);
        assert_eq!(report.decisions, 4);
        assert_eq!((report.allowed, report.denied), (3, 1));
        assert_eq!(report.errors, 2);
        assert_eq!(report.errors_by_code.get("NOT_FOUND"), Some(&1));
        assert_eq!(report.errors_by_code.get("MALFORMED_RESPONSE"), Some(&1));
        assert!((report.elapsed_secs - 1.0).abs() < 1e-9);
        assert!((report.requests_per_sec - 4.0).abs() < 1e-9);
        assert!((report.latency.p50_us - 200.0).abs() < 1.0);
        assert!((report.latency.max_us - 300.0).abs() < 1.0);
        // The failed 300 us call is not a decided one.
        assert!((report.decided_latency.max_us - 200.0).abs() < 1.0);
        assert!((report.decided_latency.min_us - 100.0).abs() < 1.0);
    }

    #[test]
    fn an_empty_run_reports_zeroes() {
        let start = Instant::now();
        let report = Report::new(info(start), &Tally::new(false));
        assert_eq!(report.requests, 0);
        assert!(report.requests_per_sec.abs() < f64::EPSILON);
        assert!(report.latency.p99_us.abs() < f64::EPSILON);
    }
}
