//! `quotad simulate`: what the plots and figures in the docs rest on.

use super::accuracy::{Mix, poisson};
use super::plot::step_line;
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
            calendar: false,
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
    for algorithm in Algorithm::RATES {
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
    for algorithm in Algorithm::RATES {
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

#[test]
fn the_calendar_drawing_is_written_alone() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut out = Vec::new();
    simulate(
        SimulateArgs {
            out: dir.path().to_owned(),
            seed: 1,
            keys: 5,
            windows: 3,
            calendar: true,
        },
        &mut out,
    )
    .expect("the simulation runs");
    let text = String::from_utf8(out).expect("utf-8 output");
    assert!(
        text.contains("2024-03-01T00:00:00-05:00[America/New_York]")
            && text.contains("2024-04-01T00:00:00-04:00[America/New_York]"),
        "{text}"
    );
    let svg = std::fs::read_to_string(dir.path().join("calendar.svg")).expect("drawn");
    assert!(svg.contains("calendar month (America/New_York)"));
    // Only the calendar drawing: the other outputs are not touched.
    assert!(!dir.path().join("steady.svg").exists());
    assert!(!dir.path().join(CSV_FILE).exists());
}
