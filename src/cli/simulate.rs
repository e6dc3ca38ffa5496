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
//! the last window, the quantity a limit bounds) and [`poisson`] (seeded
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
}

/// Runs the scenarios, writes the plots and the CSV into `--out`, and
/// prints the summaries.
///
/// # Errors
///
/// [`Failure::Failed`] when a file cannot be written or a plot drawn.
pub(crate) fn simulate(args: SimulateArgs, mut out: impl Write) -> Result<(), Failure> {
    std::fs::create_dir_all(&args.out).map_err(|e| cannot_write(&args.out, &e))?;
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
        let runs: Vec<Run> = Algorithm::ALL
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
        plot(&path, scenario, &runs)
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

/// The within-the-last-window count of `instants` (sorted) as a step line
/// from 0 to `end`, in seconds: it rises when a request arrives and falls a
/// window later, when it leaves.
fn step_line(instants: &[u64], window: u64, end: u64) -> Vec<(f64, f64)> {
    let seconds = |ms: u64| ms as f64 / 1_000.0;
    let mut points = vec![(0.0, 0.0)];
    let (mut enter, mut leave, mut count) = (0, 0, 0_u64);
    loop {
        let next_enter = instants.get(enter).copied();
        let next_leave = instants.get(leave).map(|t| t + window);
        let at = match (next_enter, next_leave) {
            (Some(a), Some(b)) => a.min(b),
            (None, Some(b)) => b,
            _ => break,
        };
        if at >= end {
            break;
        }
        let before = count;
        while instants.get(leave).is_some_and(|t| t + window == at) {
            leave += 1;
            count -= 1;
        }
        while instants.get(enter) == Some(&at) {
            enter += 1;
            count += 1;
        }
        points.push((seconds(at), before as f64));
        points.push((seconds(at), count as f64));
    }
    points.push((seconds(end), count as f64));
    points
}

/// One SVG: the scenario's title and a legend, then one panel per
/// algorithm with the requests offered and admitted within the last window,
/// and the limit.
fn plot(path: &Path, scenario: &Scenario, runs: &[Run]) -> Result<(), String> {
    const PANEL_HEIGHT: u32 = 190;
    const HEADER_HEIGHT: u32 = 62;
    let offered_color = RGBColor(150, 150, 150);
    let admitted_color = RGBColor(31, 119, 180);
    let limit_color = RGBColor(214, 39, 40);
    let height = HEADER_HEIGHT + PANEL_HEIGHT * runs.len() as u32;
    let root = SVGBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (header, body) = root.split_vertically(HEADER_HEIGHT);
    let legend = header
        .titled(&scenario.title, ("sans-serif", 17))
        .map_err(|e| e.to_string())?;
    let entries = [
        ("offered".to_owned(), offered_color, 24),
        ("admitted".to_owned(), admitted_color, 24),
        (
            format!("limit: {LIMIT} per {}", human_ms(WINDOW_MS)),
            limit_color,
            10,
        ),
    ];
    for (index, (label, color, dash)) in entries.into_iter().enumerate() {
        let x = 260 + 160 * index as i32;
        for start in (x..x + 24).step_by(14) {
            let line = vec![(start, 12), ((start + dash).min(x + 24), 12)];
            legend
                .draw(&PathElement::new(line, color.stroke_width(2)))
                .map_err(|e| e.to_string())?;
        }
        legend
            .draw(&Text::new(label, (x + 32, 5), ("sans-serif", 13)))
            .map_err(|e| e.to_string())?;
    }
    let offered_line = step_line(&scenario.arrivals, WINDOW_MS, SCENARIO_MS);
    let most_offered = offered_line.iter().map(|p| p.1).fold(0.0, f64::max);
    let y_top = most_offered.max(2.0 * LIMIT as f64) + 2.0;
    let x_end = SCENARIO_MS as f64 / 1_000.0;
    for (panel, run) in body.split_evenly((runs.len(), 1)).iter().zip(runs) {
        let admitted: Vec<u64> = run
            .rows
            .iter()
            .filter(|r| r.allowed)
            .map(|r| r.t_ms)
            .collect();
        let caption = format!(
            "{}: admitted {} of {}, at most {} in any {} (limit {LIMIT})",
            run.algorithm.as_str(),
            run.admitted(),
            run.rows.len(),
            run.most_in_a_window(),
            human_ms(WINDOW_MS)
        );
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 14))
            .margin(6)
            .x_label_area_size(30)
            .y_label_area_size(46)
            .build_cartesian_2d(0.0..x_end, 0.0..y_top)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("time (s); vertical lines are window edges")
            .y_desc(format!("in the last {}", human_ms(WINDOW_MS)))
            .x_labels(SCENARIO_MS as usize / WINDOW_MS as usize + 1)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_labels(5)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .light_line_style(WHITE)
            .draw()
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(LineSeries::new(
                offered_line.iter().copied(),
                offered_color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(LineSeries::new(
                step_line(&admitted, WINDOW_MS, SCENARIO_MS),
                admitted_color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, LIMIT as f64), (x_end, LIMIT as f64)],
                6,
                4,
                limit_color.stroke_width(1),
            ))
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

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
    fn label(self) -> String {
        match self {
            Mix::Uniform(m) => format!("{m} x limit, every key"),
            Mix::Spread => "1/100 .. 10 x, log-uniform".to_owned(),
        }
    }
}

/// The traffic mixes of the accuracy table.
const MIXES: [Mix; 7] = [
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

    fn share_percent(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        100.0 * self.differ() as f64 / self.requests as f64
    }

    /// Admitted by the counter relative to the exact log, in percent.
    fn admitted_vs_exact_percent(&self) -> f64 {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the command into a fresh directory and returns it with stdout.
    fn run_command(seed: u64) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut out = Vec::new();
        simulate(
            SimulateArgs {
                out: dir.path().to_owned(),
                seed,
                keys: 5,
                windows: 3,
            },
            &mut out,
        )
        .expect("the simulation runs");
        (dir, String::from_utf8(out).expect("utf-8 output"))
    }

    /// The CSV rows of one scenario and algorithm, parsed.
    fn rows(csv: &str, scenario: &str, algorithm: Algorithm) -> Vec<Row> {
        csv.lines()
            .skip(1)
            .map(|line| line.split(',').collect::<Vec<_>>())
            .filter(|f| f[0] == scenario && f[1] == algorithm.as_str())
            .map(|f| Row {
                t_ms: f[2].parse().expect("t_ms"),
                allowed: f[3].parse().expect("allowed"),
                admitted_in_window: f[4].parse().expect("admitted_in_window"),
                offered_in_window: f[5].parse().expect("offered_in_window"),
            })
            .collect()
    }

    /// The most admitted in any window-long interval, recomputed from the
    /// rows' instants alone (not from the CSV's own column).
    fn most_in_any_window(rows: &[Row]) -> u64 {
        let admitted: Vec<u64> = rows.iter().filter(|r| r.allowed).map(|r| r.t_ms).collect();
        admitted
            .iter()
            .map(|&end| {
                admitted
                    .iter()
                    .filter(|&&t| t <= end && t + WINDOW_MS > end)
                    .count() as u64
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn the_csv_shows_the_fixed_window_admitting_twice_the_limit_across_the_boundary() {
        let (dir, _) = run_command(1);
        let csv = std::fs::read_to_string(dir.path().join(CSV_FILE)).expect("the CSV");
        assert_eq!(csv.lines().next(), Some(CSV_HEADER));
        let fixed = rows(&csv, "boundary", Algorithm::FixedWindow);
        assert_eq!(fixed.len(), 2 * LIMIT as usize);
        assert!(
            fixed.iter().all(|r| r.allowed),
            "every attack request passes"
        );
        assert_eq!(most_in_any_window(&fixed), 2 * LIMIT);
        assert_eq!(
            fixed.last().map(|r| r.admitted_in_window),
            Some(2 * LIMIT),
            "the CSV's own column agrees"
        );
        // Every algorithm but the fixed window holds the attack to the limit.
        for algorithm in Algorithm::ALL {
            if algorithm != Algorithm::FixedWindow {
                let rows = rows(&csv, "boundary", algorithm);
                assert_eq!(most_in_any_window(&rows), LIMIT, "{algorithm:?}");
            }
        }
    }

    #[test]
    fn the_csv_shows_the_sliding_log_never_above_the_limit_in_any_window() {
        for seed in [1, 2, 3, 42] {
            let (dir, _) = run_command(seed);
            let csv = std::fs::read_to_string(dir.path().join(CSV_FILE)).expect("the CSV");
            for scenario in ["steady", "bursty", "boundary"] {
                let log = rows(&csv, scenario, Algorithm::SlidingLog);
                assert!(!log.is_empty(), "{scenario}");
                assert!(
                    log.iter().any(|r| !r.allowed),
                    "{scenario} goes over the limit"
                );
                assert_eq!(most_in_any_window(&log), LIMIT, "{scenario}, seed {seed}");
                assert!(log.iter().all(|r| r.admitted_in_window <= LIMIT));
            }
        }
    }

    #[test]
    fn the_steady_scenario_offers_twice_the_limit_and_the_windows_admit_the_limit() {
        let (dir, _) = run_command(1);
        let csv = std::fs::read_to_string(dir.path().join(CSV_FILE)).expect("the CSV");
        let fixed = rows(&csv, "steady", Algorithm::FixedWindow);
        assert_eq!(fixed.len() as u64, 2 * LIMIT * SCENARIO_MS / WINDOW_MS);
        // Requests are evenly spaced, so the fixed window admits exactly
        // its limit in each of the four windows.
        let admitted = fixed.iter().filter(|r| r.allowed).count() as u64;
        assert_eq!(admitted, LIMIT * SCENARIO_MS / WINDOW_MS);
    }

    #[test]
    fn the_same_seed_writes_the_same_files_and_a_new_seed_new_bursts() {
        let (a, out_a) = run_command(7);
        let (b, out_b) = run_command(7);
        let (c, _) = run_command(8);
        let read = |dir: &tempfile::TempDir, name: &str| {
            std::fs::read(dir.path().join(name)).expect("a written file")
        };
        for name in ["steady.svg", "bursty.svg", "boundary.svg", CSV_FILE] {
            assert_eq!(read(&a, name), read(&b, name), "{name}");
        }
        assert_eq!(
            out_a.replace(&a.path().display().to_string(), "DIR"),
            out_b.replace(&b.path().display().to_string(), "DIR")
        );
        assert_ne!(read(&a, "bursty.svg"), read(&c, "bursty.svg"));
        assert_eq!(read(&a, "boundary.svg"), read(&c, "boundary.svg"));
    }

    #[test]
    fn each_plot_has_a_panel_per_algorithm() {
        let (dir, _) = run_command(1);
        let svg = std::fs::read_to_string(dir.path().join("boundary.svg")).expect("the plot");
        for algorithm in Algorithm::ALL {
            assert!(
                svg.contains(&format!("{}: admitted", algorithm.as_str())),
                "{algorithm:?}"
            );
        }
        assert!(svg.contains("fixed_window: admitted 20 of 20, at most 20 in any 1s"));
    }

    #[test]
    fn the_trailing_count_excludes_what_left_exactly_one_window_ago() {
        let mut trailing = Trailing::new(1_000);
        assert_eq!(trailing.record(0, 1), 1);
        assert_eq!(trailing.record(999, 1), 2);
        assert_eq!(trailing.record(1_000, 0), 1);
        assert_eq!(trailing.record(1_999, 3), 3);
    }

    #[test]
    fn the_step_line_rises_on_arrival_and_falls_a_window_later() {
        let line = step_line(&[100, 100, 600], 1_000, 2_000);
        assert_eq!(
            line,
            vec![
                (0.0, 0.0),
                (0.1, 0.0),
                (0.1, 2.0),
                (0.6, 2.0),
                (0.6, 3.0),
                (1.1, 3.0),
                (1.1, 1.0),
                (1.6, 1.0),
                (1.6, 0.0),
                (2.0, 0.0),
            ]
        );
    }

    #[test]
    fn counter_and_log_agree_far_under_the_limit() {
        let tally = compare(Mix::Uniform(0.2), 1, 1, 20, 3);
        assert!(tally.requests > 500);
        assert_eq!(tally.differ(), 0);
        assert_eq!(tally.exact_admitted, tally.requests);
    }

    #[test]
    fn the_counter_errs_on_some_decisions_near_the_limit_and_passes_it_by_little() {
        let tally = compare(Mix::Uniform(2.0), 1, 1, 20, 5);
        assert!(
            tally.counter_more > 0 && tally.counter_less > 0,
            "{tally:?}"
        );
        // Errors go both ways, so the totals stay close to the exact log's.
        assert!(
            tally.counter_admitted.abs_diff(tally.exact_admitted) < tally.exact_admitted / 20,
            "{tally:?}"
        );
        assert!(tally.counter_most > ACCURACY_LIMIT, "{tally:?}");
        assert!(tally.counter_most <= ACCURACY_LIMIT * 3 / 2, "{tally:?}");
    }

    #[test]
    fn the_exact_rule_predicts_every_decision_of_quotads_sliding_log() {
        // The rule the counter is judged by is the sliding log's: replay
        // the log on its own history and compare each decision.
        let exact = Policy::try_new(
            Algorithm::SlidingLog,
            ACCURACY_LIMIT,
            Duration::from_millis(ACCURACY_WINDOW_MS),
            None,
        )
        .expect("valid");
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let arrivals = poisson(
            &mut rng,
            3.0 * ACCURACY_LIMIT as f64 / ACCURACY_WINDOW_MS as f64,
            EPOCH_MS,
            5 * ACCURACY_WINDOW_MS,
        );
        let mut state = None;
        let mut counted = Trailing::new(ACCURACY_WINDOW_MS);
        let mut denied = 0;
        for t in arrivals {
            let rule = counted.record(t, 0) < ACCURACY_LIMIT;
            let (next, decision) = decide(&exact, state.take(), t, NonZeroU64::MIN);
            state = next;
            assert_eq!(decision.allowed, rule, "at {t}");
            counted.record(t, u64::from(decision.allowed));
            denied += u64::from(!decision.allowed);
        }
        assert!(denied > 0);
    }
}
