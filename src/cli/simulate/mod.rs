//! `quotad simulate`: every algorithm on the same synthetic traffic,
//! in-process, on a [`FakeClock`]; no server and no network.
//!
//! Three scenarios, each against a policy of [`LIMIT`] per [`WINDOW_MS`]
//! under all five algorithms:
//!
//! - `steady`: twice the limit, evenly spaced;
//! - `bursty`: bursts of random size at random intervals (seeded);
//! - `boundary`: the boundary attack, `limit` requests just before a window
//!   edge and `limit` right after it.
//!
//! For each it writes an SVG plot (offered and admitted requests within the
//! last window, over time, one panel per algorithm) and one CSV row per
//! decision. It then measures how often the sliding window counter decides
//! differently from the exact sliding log on the same random traffic, and
//! prints a table. Output is the same for the same `--seed`.
//!
//! Two parts are not specific to this command: [`Trailing`] (units within
//! the last window, the quantity a limit bounds) and `accuracy::poisson` (seeded
//! arrivals); a load generator could use them as they are.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::Write;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use plotters::prelude::*;
use quotad_core::{
    Algorithm, CheckItem, FakeClock, MemoryStore, OnFull, Policy, StoreConfig, decide,
};
use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution as _, Exp};

use super::Failure;

mod accuracy;
mod calendar;
mod plot;

use accuracy::{MIXES, compare};

/// Requests admitted per window in the three scenarios.
pub(crate) const LIMIT: u64 = 10;
/// The scenarios' window.
pub(crate) const WINDOW_MS: u64 = 1_000;
/// How long each scenario runs.
const SCENARIO_MS: u64 = 4_000;
/// The simulated clock starts here, on a window edge (2026-01-01T00:00:00Z),
/// because windows are aligned to the epoch.
const EPOCH_MS: u64 = 1_767_225_600_000;
/// The window edge the boundary attack straddles, from the start.
const ATTACK_EDGE_MS: u64 = 2_000;
/// The attack's first burst starts this long before the edge.
const ATTACK_LEAD_MS: u64 = 50;

/// The policy of the accuracy comparison: a typical API limit.
const ACCURACY_LIMIT: u64 = 100;
const ACCURACY_WINDOW_MS: u64 = 60_000;

/// The CSV written next to the plots.
pub(crate) const CSV_FILE: &str = "simulate.csv";
/// The CSV's header line.
pub(crate) const CSV_HEADER: &str =
    "scenario,algorithm,t_ms,allowed,admitted_in_window,offered_in_window";

/// `quotad simulate`.
#[derive(Debug, clap::Args)]
pub(crate) struct SimulateArgs {
    /// Directory for the plots (steady.svg, bursty.svg, boundary.svg) and
    /// simulate.csv; created if missing
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Seed of the random traffic (bursty scenario, accuracy comparison)
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// Keys per traffic mix in the accuracy comparison
    #[arg(long, value_name = "N", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..=100_000))]
    keys: u64,
    /// Windows (of 1 minute) each key's traffic lasts in the accuracy
    /// comparison
    #[arg(long, value_name = "N", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    windows: u64,
    /// Draw only calendar.svg: a monthly calendar quota in New York against
    /// a 30-day window over three months (the other outputs are left as
    /// they are)
    #[arg(long)]
    calendar: bool,
}

/// Runs the scenarios, writes the plots and the CSV into `--out`, and
/// prints the summaries.
///
/// # Errors
///
/// [`Failure::Failed`] when a file cannot be written or a plot drawn.
pub(crate) fn simulate(args: SimulateArgs, mut out: impl Write) -> Result<(), Failure> {
    std::fs::create_dir_all(&args.out).map_err(|e| cannot_write(&args.out, &e))?;
    if args.calendar {
        let runs = calendar::runs();
        let path = args.out.join("calendar.svg");
        calendar::draw(&path, &runs)
            .map_err(|e| Failure::Failed(format!("cannot draw {}: {e}", path.display())))?;
        for run in &runs {
            writeln!(
                out,
                "{}: resets at {}",
                run.name,
                calendar::resets_text(run)
            )?;
        }
        writeln!(out, "\nwrote {}", path.display())?;
        return Ok(());
    }
    let scenarios = scenarios(args.seed);
    let mut csv = String::from(CSV_HEADER);
    csv.push('\n');
    writeln!(
        out,
        "quotad simulate: every algorithm at {LIMIT} per {}, in-process (seed {})\n",
        human_ms(WINDOW_MS),
        args.seed
    )?;
    writeln!(
        out,
        "{:<9} {:<15} {:>8} {:>9} {:>22}",
        "scenario",
        "algorithm",
        "offered",
        "admitted",
        format!("most in any {}", human_ms(WINDOW_MS))
    )?;
    for scenario in &scenarios {
        let runs: Vec<Run> = Algorithm::RATES
            .iter()
            .map(|&algorithm| Run::new(scenario, algorithm))
            .collect();
        for run in &runs {
            writeln!(
                out,
                "{:<9} {:<15} {:>8} {:>9} {:>22}",
                scenario.name,
                run.algorithm.as_str(),
                run.rows.len(),
                run.admitted(),
                run.most_in_a_window()
            )?;
            for row in &run.rows {
                let _ = writeln!(
                    csv,
                    "{},{},{},{},{},{}",
                    scenario.name,
                    run.algorithm.as_str(),
                    row.t_ms,
                    row.allowed,
                    row.admitted_in_window,
                    row.offered_in_window
                );
            }
        }
        let path = args.out.join(format!("{}.svg", scenario.name));
        plot::draw(&path, scenario, &runs)
            .map_err(|e| Failure::Failed(format!("cannot draw {}: {e}", path.display())))?;
    }
    let csv_path = args.out.join(CSV_FILE);
    std::fs::write(&csv_path, csv).map_err(|e| cannot_write(&csv_path, &e))?;

    writeln!(
        out,
        "\nsliding_window vs sliding_log at {ACCURACY_LIMIT} per {}: Poisson arrivals, \
         {} keys per mix, {} each",
        human_ms(ACCURACY_WINDOW_MS),
        args.keys,
        human_ms(args.windows * ACCURACY_WINDOW_MS)
    )?;
    writeln!(
        out,
        "each decision of the counter (on its own history, as in production) against the exact rule on the same history\n"
    )?;
    writeln!(
        out,
        "{:<26} {:>9} {:>8} {:>9} {:>9} {:>9} {:>10} {:>8}",
        "rate / limit", "requests", "differ", "share", "too many", "too few", "admitted", "most"
    )?;
    for (index, mix) in MIXES.iter().enumerate() {
        let tally = compare(*mix, args.seed, index as u64 + 1, args.keys, args.windows);
        writeln!(
            out,
            "{:<26} {:>9} {:>8} {:>8.4}% {:>9} {:>9} {:>+9.2}% {:>8}",
            mix.label(),
            tally.requests,
            tally.differ(),
            tally.share_percent(),
            tally.counter_more,
            tally.counter_less,
            tally.admitted_vs_exact_percent(),
            tally.counter_most
        )?;
    }
    writeln!(
        out,
        "\ntoo many: admitted although the last {w} already held {ACCURACY_LIMIT}; \
         too few: denied although it had room;\n\
         admitted: the counter's admissions against the exact sliding log's on the same arrivals; \
         most: the most the counter admitted in any {w}",
        w = human_ms(ACCURACY_WINDOW_MS)
    )?;
    writeln!(
        out,
        "\nwrote {}, {}, {} and {}",
        args.out.join("steady.svg").display(),
        args.out.join("bursty.svg").display(),
        args.out.join("boundary.svg").display(),
        csv_path.display()
    )?;
    Ok(())
}

fn cannot_write(path: &Path, error: &std::io::Error) -> Failure {
    Failure::Failed(format!("cannot write {}: {error}", path.display()))
}

/// `1s`, `1m`: the windows are whole seconds.
fn human_ms(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// One synthetic traffic pattern: request instants in ms from the start.
#[derive(Debug)]
pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    title: String,
    arrivals: Vec<u64>,
}

/// The three scenarios; only `bursty` depends on the seed.
pub(crate) fn scenarios(seed: u64) -> Vec<Scenario> {
    let steady_gap = WINDOW_MS / (2 * LIMIT);
    let steady = Scenario {
        name: "steady",
        title: format!(
            "steady over the limit: one request every {steady_gap} ms (2 x the limit of {LIMIT} per {})",
            human_ms(WINDOW_MS)
        ),
        arrivals: (0..SCENARIO_MS).step_by(steady_gap as usize).collect(),
    };

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let gaps = Exp::new(1.0 / 700.0).expect("a positive rate");
    let mut bursty = Vec::new();
    let mut at = 0.0_f64;
    loop {
        at += gaps.sample(&mut rng);
        let start = at as u64;
        if start >= SCENARIO_MS {
            break;
        }
        let size: u64 = rng.random_range(3..=15);
        bursty.extend(
            (0..size)
                .map(|i| start + 2 * i)
                .filter(|&t| t < SCENARIO_MS),
        );
    }
    let bursty = Scenario {
        name: "bursty",
        title: format!(
            "bursty: bursts of 3 to 15 requests, 2 ms apart, about every 0.7 s (seed {seed}); limit {LIMIT} per {}",
            human_ms(WINDOW_MS)
        ),
        arrivals: bursty,
    };

    let before = ATTACK_EDGE_MS - ATTACK_LEAD_MS;
    let boundary = Scenario {
        name: "boundary",
        title: format!(
            "boundary attack: {LIMIT} requests {ATTACK_LEAD_MS} ms before the window edge at {}, {LIMIT} right after it",
            human_ms(ATTACK_EDGE_MS)
        ),
        arrivals: (before..before + LIMIT)
            .chain(ATTACK_EDGE_MS..ATTACK_EDGE_MS + LIMIT)
            .collect(),
    };
    vec![steady, bursty, boundary]
}

/// The scenarios' policy under `algorithm`: [`LIMIT`] per [`WINDOW_MS`],
/// bucket capacity = limit.
fn scenario_policy(algorithm: Algorithm) -> Policy {
    Policy::try_new(algorithm, LIMIT, Duration::from_millis(WINDOW_MS), None)
        .expect("the scenario policy is within every bound")
}

/// One decision of a scenario run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) t_ms: u64,
    pub(crate) allowed: bool,
    /// Requests admitted within the last window, `(t - window, t]`, this
    /// one included.
    pub(crate) admitted_in_window: u64,
    /// Requests offered within the last window, this one included.
    pub(crate) offered_in_window: u64,
}

/// A scenario decided by one algorithm.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) algorithm: Algorithm,
    pub(crate) rows: Vec<Row>,
}

impl Run {
    /// Decides every request of `scenario` through a [`MemoryStore`] whose
    /// clock is set to each request's instant: the server's path, minus
    /// the network.
    pub(crate) fn new(scenario: &Scenario, algorithm: Algorithm) -> Self {
        let clock = Arc::new(FakeClock::new(EPOCH_MS));
        let config = StoreConfig::try_new(1_024, 1, OnFull::Deny)
            .expect("one shard of 1,024 keys is a valid store");
        let store = MemoryStore::new(config, clock.clone());
        let item = CheckItem::new(algorithm.as_str(), scenario_policy(algorithm), "client", 1)
            .expect("a cost of 1 on a non-empty key and name is valid");
        let mut admitted = Trailing::new(WINDOW_MS);
        let mut offered = Trailing::new(WINDOW_MS);
        let rows = scenario
            .arrivals
            .iter()
            .map(|&t_ms| {
                clock.set(EPOCH_MS + t_ms);
                let allowed = store.check_one(&item).allowed;
                Row {
                    t_ms,
                    allowed,
                    admitted_in_window: admitted.record(t_ms, u64::from(allowed)),
                    offered_in_window: offered.record(t_ms, 1),
                }
            })
            .collect();
        Run { algorithm, rows }
    }

    fn admitted(&self) -> usize {
        self.rows.iter().filter(|r| r.allowed).count()
    }

    /// The most requests admitted in any window-long interval.
    pub(crate) fn most_in_a_window(&self) -> u64 {
        self.rows
            .iter()
            .map(|r| r.admitted_in_window)
            .max()
            .unwrap_or(0)
    }
}

/// Units counted within the last window, `(t - window, t]`: what a limit
/// of so many per window bounds, whatever the algorithm. Instants must not
/// decrease.
#[derive(Debug)]
pub(crate) struct Trailing {
    window: u64,
    /// `(instant, units)`, oldest first.
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

impl Trailing {
    pub(crate) fn new(window: u64) -> Self {
        Trailing {
            window,
            entries: VecDeque::new(),
            total: 0,
        }
    }

    /// Counts `units` at `t` and returns the total within the window ending
    /// at `t`.
    pub(crate) fn record(&mut self, t: u64, units: u64) -> u64 {
        while let Some(&(at, n)) = self.entries.front() {
            if at + self.window > t {
                break;
            }
            self.entries.pop_front();
            self.total -= n;
        }
        if units > 0 {
            self.entries.push_back((t, units));
            self.total += units;
        }
        self.total
    }
}

#[cfg(test)]
mod tests;
