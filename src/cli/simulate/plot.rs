//! The SVG plots: offered and admitted units within the last window, one
//! panel per algorithm.

use super::*;

/// The within-the-last-window count of `instants` (sorted) as a step line
/// from 0 to `end`, in seconds: it rises when a request arrives and falls a
/// window later, when it leaves.
pub(super) fn step_line(instants: &[u64], window: u64, end: u64) -> Vec<(f64, f64)> {
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
pub(super) fn draw(path: &Path, scenario: &Scenario, runs: &[Run]) -> Result<(), String> {
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
