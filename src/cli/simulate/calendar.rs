//! `quotad simulate --calendar`: a monthly calendar quota in
//! America/New_York against a 30-day epoch-aligned window, both at the same
//! limit, under the same steady traffic, drawn as the units admitted so far
//! in each one's current window, day by day over three months.

use super::*;
use quotad_core::calendar::{Calendar, Period, Zone};

/// 2024-02-01 00:00 EST: February (29 days), March (31, with the clocks
/// springing forward) and April (30).
const START_MS: u64 = 1_706_763_600_000;
const DAYS: u64 = 90;
const DAY_MS: u64 = 86_400_000;
/// Units a month, and the traffic: 50 an hour, 1,200 a day.
const MONTHLY: u64 = 30_000;
const EVERY_MS: u64 = 72_000;

/// The admitted units in the current window at each hour, per policy.
pub(super) struct CalendarRun {
    pub(super) name: String,
    pub(super) points: Vec<(f64, f64)>,
    pub(super) resets: Vec<u64>,
}

/// Runs both policies over the same arrivals.
pub(super) fn runs() -> Vec<CalendarRun> {
    let zone = Zone::named("America/New_York").expect("a bundled zone");
    let month = Policy::calendar(
        Algorithm::FixedWindow,
        MONTHLY,
        Calendar::new(Period::Month, zone),
    )
    .expect("valid");
    let thirty = Policy::try_new(
        Algorithm::FixedWindow,
        MONTHLY,
        Duration::from_millis(30 * DAY_MS),
        None,
    )
    .expect("valid");
    [
        ("calendar month (America/New_York)", month),
        ("30-day window (epoch)", thirty),
    ]
    .into_iter()
    .map(|(name, policy)| {
        let (mut state, mut points, mut resets) = (None, Vec::new(), Vec::new());
        let mut last_start = None;
        let mut t = START_MS;
        while t < START_MS + DAYS * DAY_MS {
            let (s, d) = decide(&policy, state, t, NonZeroU64::MIN);
            state = s;
            let start = policy.window_bounds(t).0;
            if last_start.is_some_and(|l| l != start) {
                resets.push(start);
            }
            last_start = Some(start);
            let used = MONTHLY - d.remaining;
            if (t - START_MS).is_multiple_of(3_600_000) {
                points.push(((t - START_MS) as f64 / DAY_MS as f64, used as f64));
            }
            t += EVERY_MS;
        }
        CalendarRun {
            name: name.to_owned(),
            points,
            resets,
        }
    })
    .collect()
}

/// Draws the runs into `path`.
pub(super) fn draw(path: &Path, runs: &[CalendarRun]) -> Result<(), String> {
    let root = SVGBackend::new(path, (960, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{MONTHLY} a month, 1,200 offered a day, from 2024-02-01 in New York: units used in the current window"
            ),
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..DAYS as f64, 0f64..MONTHLY as f64 * 1.05)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("days since 2024-02-01 00:00 EST")
        .y_desc("units used")
        .draw()
        .map_err(|e| e.to_string())?;
    let colors = [RGBColor(31, 119, 180), RGBColor(214, 39, 40)];
    for (run, color) in runs.iter().zip(colors) {
        chart
            .draw_series(LineSeries::new(run.points.iter().copied(), color))
            .map_err(|e| e.to_string())?
            .label(run.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

/// The local start of each reset, for the summary.
pub(super) fn resets_text(run: &CalendarRun) -> String {
    let zone = Zone::named("America/New_York").expect("a bundled zone");
    run.resets
        .iter()
        .map(|&ms| zone.local(ms))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calendar_month_resets_at_new_york_midnight_of_each_first_and_the_window_every_30_days() {
        let runs = runs();
        // March 1st 00:00 EST, April 1st and May 1st 00:00 EDT.
        assert_eq!(
            runs[0].resets,
            [1_709_269_200_000, 1_711_944_000_000, 1_714_536_000_000]
        );
        // Epoch-aligned 30-day windows: multiples of 2,592,000,000 ms.
        assert!(!runs[1].resets.is_empty());
        assert!(runs[1].resets.iter().all(|r| r % (30 * DAY_MS) == 0));
        assert_ne!(runs[0].resets, runs[1].resets);
    }
}
