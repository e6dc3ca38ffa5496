//! The RSS plot: one panel per phase, the samples and the ±10% band
//! around the reference sample (the first after warm-up).

use std::path::Path;

use plotters::prelude::*;

use super::verdict::RSS_TOLERANCE;
use super::{Backend, PhaseReport};

/// Writes an SVG of every phase's RSS samples to `path`.
pub(super) fn rss_svg(reports: &[PhaseReport], path: &Path) -> anyhow::Result<()> {
    draw(reports, path).map_err(|e| anyhow::anyhow!("cannot draw {}: {e}", path.display()))
}

fn draw(reports: &[PhaseReport], path: &Path) -> Result<(), String> {
    const PANEL_HEIGHT: u32 = 220;
    let sample_color = RGBColor(31, 119, 180);
    let band_color = RGBColor(214, 39, 40);
    let warmup_color = RGBColor(150, 150, 150);
    let height = PANEL_HEIGHT * reports.len().max(1) as u32;
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mib = |kib: u64| kib as f64 / 1_024.0;
    for (panel, report) in root
        .split_evenly((reports.len().max(1), 1))
        .iter()
        .zip(reports)
    {
        let points: Vec<(f64, f64)> = report
            .rss
            .iter()
            .map(|s| (s.at_s, mib(s.rss_kib)))
            .collect();
        let x_end = report.seconds.max(1.0);
        let top = points.iter().map(|p| p.1).fold(0.0, f64::max) * 1.25 + 1.0;
        let backend = match report.backend {
            Backend::Memory => "memory store",
            Backend::Redis => "Redis (restarted once)",
        };
        let verdict = if report.verdict.passed() {
            "pass"
        } else {
            "FAIL"
        };
        let caption = format!("quotad RSS, {backend}: {verdict}");
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 15))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..x_end, 0.0..top)
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc("seconds into the phase")
            .y_desc("RSS (MiB)")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .light_line_style(WHITE)
            .draw()
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(report.warmup_s, 0.0), (report.warmup_s, top)],
                4,
                4,
                warmup_color.stroke_width(1),
            ))
            .map_err(|e| e.to_string())?;
        if let Some((reference, _, _)) = report.verdict.rss_range_kib {
            for factor in [1.0 - RSS_TOLERANCE, 1.0 + RSS_TOLERANCE] {
                let y = mib(reference) * factor;
                chart
                    .draw_series(DashedLineSeries::new(
                        vec![(report.warmup_s, y), (x_end, y)],
                        6,
                        4,
                        band_color.stroke_width(1),
                    ))
                    .map_err(|e| e.to_string())?;
            }
        }
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                sample_color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(
                points
                    .iter()
                    .map(|&p| Circle::new(p, 3, sample_color.filled())),
            )
            .map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}
