//! SVG charts (plotters, SVG backend only): latency percentiles against offered load, and the
//! latency distribution function of every level.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::prelude::*;

use crate::report::Report;

/// File names written into the SVG directory.
pub const LATENCY_VS_LOAD: &str = "latency_vs_load.svg";
pub const LATENCY_CDF: &str = "latency_cdf.svg";

const SIZE: (u32, u32) = (900, 560);
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Writes both charts into `dir` (created if missing) and returns their paths.
pub fn write_charts(report: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let sweep = dir.join(LATENCY_VS_LOAD);
    latency_vs_load(report, &sweep).with_context(|| format!("writing {}", sweep.display()))?;
    let cdf = dir.join(LATENCY_CDF);
    latency_cdf(report, &cdf).with_context(|| format!("writing {}", cdf.display()))?;
    Ok(vec![sweep, cdf])
}

/// A range that is never empty, padded a little so points are not on the frame.
fn padded(min: f64, max: f64, floor_zero: bool) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (min, max);
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        lo = if lo.is_finite() { lo - 1.0 } else { 0.0 };
        hi = lo + 2.0;
    }
    let pad = (hi - lo) * 0.05;
    let lo = if floor_zero {
        (lo - pad).max(0.0)
    } else {
        lo - pad
    };
    lo..hi + pad
}

fn latency_vs_load(report: &Report, path: &Path) -> Result<()> {
    let x_desc = if report.mode == "open" {
        "offered load (requests/s)"
    } else {
        "concurrency (clients)"
    };
    type Pick = fn(&crate::stats::Percentiles) -> f64;
    let series: [(&str, Pick); 5] = [
        ("p50", |p| p.p50),
        ("p90", |p| p.p90),
        ("p99", |p| p.p99),
        ("p99.9", |p| p.p99_9),
        ("max", |p| p.max),
    ];
    let points: Vec<(f64, crate::stats::Percentiles)> = report
        .levels
        .iter()
        .filter_map(|l| l.latency_ms.map(|p| (l.load.x(), p)))
        .collect();
    let xs = points.iter().map(|(x, _)| *x);
    let x_range = padded(
        xs.clone().fold(f64::INFINITY, f64::min),
        xs.fold(f64::NEG_INFINITY, f64::max),
        true,
    );
    let y_max = points.iter().map(|(_, p)| p.max).fold(0.0, f64::max);
    let y_range = padded(0.0, y_max, true);

    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Latency against offered load", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x_range, y_range)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("latency (ms)")
        .draw()?;
    for (i, (name, pick)) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let line: Vec<(f64, f64)> = points.iter().map(|(x, p)| (*x, pick(p))).collect();
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(line.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn latency_cdf(report: &Report, path: &Path) -> Result<()> {
    let x_max = report
        .levels
        .iter()
        .flat_map(|l| l.latency_cdf_ms.iter().map(|p| p[0]))
        .fold(0.0, f64::max);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Latency distribution", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(padded(0.0, x_max, true), 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("latency (ms)")
        .y_desc("fraction of completed requests")
        .draw()?;
    for (i, level) in report.levels.iter().enumerate() {
        if level.latency_cdf_ms.is_empty() {
            continue;
        }
        let color = PALETTE[i % PALETTE.len()];
        let name = match (level.load.rate_rps, level.load.concurrency) {
            (Some(rate), _) => format!("{rate} req/s"),
            (_, Some(c)) => format!("c = {c}"),
            _ => format!("level {i}"),
        };
        // A step function: the fraction stays until the next recorded latency.
        let mut steps = Vec::with_capacity(level.latency_cdf_ms.len() * 2 + 1);
        let mut previous_fraction = 0.0;
        for p in &level.latency_cdf_ms {
            steps.push((p[0], previous_fraction));
            steps.push((p[0], p[1]));
            previous_fraction = p[1];
        }
        chart
            .draw_series(LineSeries::new(steps, color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
