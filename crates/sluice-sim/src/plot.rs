//! A PNG plot of a granularity sweep: makespan against granularity per
//! mode, both axes logarithmic — the seed's slide-21 figure. Drawn with
//! `plotters`' bitmap backend and no font: [`sweep_png`] returns the
//! legend (axes, grid and colours) as text for the caller to print.

use std::path::Path;

use plotters::prelude::*;

use crate::error::{Error, ErrorKind};
use crate::report::Report;
use crate::units::size;

/// Plot width and height in pixels.
const PLOT_PX: (u32, u32) = (800, 600);
/// Colours of the modes, in the order they were run.
const PALETTE: [(RGBColor, &str); 6] = [(RED, "red"), (BLUE, "blue"), (GREEN, "green"), (MAGENTA, "magenta"), (CYAN, "cyan"), (BLACK, "black")];

fn out(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Output, e.to_string())
}

/// Write the sweep of `report` to `path`; the legend comes back as text.
pub fn sweep_png(report: &Report, path: &Path) -> Result<String, Error> {
    // The sweep's x: granularity, else the aggregator count.
    let by_aggregators = report.runs.iter().all(|r| r.granularity_bytes.is_none());
    let x_of = |r: &crate::RunReport| if by_aggregators { r.aggregators } else { r.granularity_bytes };
    let mut points: Vec<u64> = report.runs.iter().filter_map(x_of).collect();
    points.sort_unstable();
    points.dedup();
    let mut modes: Vec<&str> = Vec::new();
    report.runs.iter().for_each(|r| {
        if !modes.contains(&r.mode.as_str()) {
            modes.push(&r.mode);
        }
    });
    if points.len() < 2 || modes.len() > PALETTE.len() {
        return Err(Error::new(ErrorKind::Output, format!("a plot needs a sweep of 2+ points and at most {} modes", PALETTE.len())));
    }
    let times: Vec<f64> = report.runs.iter().map(|r| r.makespan_s.max(1e-6)).collect();
    let (lo, hi) = times.iter().fold((f64::MAX, 0f64), |(l, h), &t| (l.min(t), h.max(t)));
    let (y0, y1) = (10f64.powf(lo.log10().floor()), 10f64.powf(hi.log10().ceil()));
    let (x0, x1) = (points[0] as f64, *points.last().expect("2+ points") as f64);
    let root = BitMapBackend::new(path, PLOT_PX).into_drawing_area();
    root.fill(&WHITE).map_err(out)?;
    let mut chart = ChartBuilder::on(&root).margin(24).build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale()).map_err(out)?;
    let grid = RGBColor(200, 200, 200);
    for &g in &points {
        chart.draw_series(LineSeries::new([(g as f64, y0), (g as f64, y1)], grid)).map_err(out)?;
    }
    let decades: Vec<f64> = std::iter::successors(Some(y0), |d| Some(d * 10.0)).take_while(|d| *d <= y1).collect();
    for &d in &decades {
        chart.draw_series(LineSeries::new([(x0, d), (x1, d)], grid)).map_err(out)?;
    }
    let mut legend = Vec::new();
    for (i, mode) in modes.iter().enumerate() {
        let (color, name) = PALETTE[i];
        let series: Vec<(f64, f64)> = report.runs.iter().filter(|r| r.mode == *mode).filter_map(|r| Some((x_of(r)? as f64, r.makespan_s.max(1e-6)))).collect();
        chart.draw_series(LineSeries::new(series.clone(), color.stroke_width(2))).map_err(out)?;
        chart.draw_series(series.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(out)?;
        legend.push(format!("{name} = {mode}"));
    }
    root.present().map_err(out)?;
    let ticks: Vec<String> = points.iter().map(|&g| if by_aggregators { g.to_string() } else { size(g) }).collect();
    Ok(format!(
        "x: {}, log scale, grid at {}; y: makespan, log scale, grid at {} s; {}",
        if by_aggregators { "aggregators" } else { "granularity" },
        ticks.join(", "),
        decades.iter().map(|d| format!("{d}")).collect::<Vec<_>>().join(", "),
        legend.join(", ")
    ))
}
