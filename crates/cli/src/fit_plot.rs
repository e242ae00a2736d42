//! `fit --plot FILE.svg`: what each allocator's last step costs on devices a little above the
//! smallest each needs, drawn with `plotters` (SVG).
//!
//! Per trace, the capacity runs from the least minimum any allocator needs to 10 % past the
//! largest (at least 5 % past the least): at [`CURVE_POINTS`] capacities each allocator's trace
//! is replayed once more, and its last step's modelled driver time is drawn where it fits (no
//! point where it runs out of memory), with a dashed line at its minimum. Up to
//! [`PANELS_MAX`] traces stack in one image; past that (without `{trace}` in FILE, which writes
//! one file per trace) the image is an overview instead: per trace, each allocator's minimum
//! over the bytes requested, a dot per allocator.

use std::path::Path;

use plotters::prelude::*;
use torch_arena_lab::Trace;
use torch_arena_lab::fit::Fit;
use torch_arena_lab::replay::Timing;

use crate::out::CliResult;
use crate::replay_run::conf_name;
use crate::text::fmt_bytes;

use torch_arena_lab::fit::{self as lib_fit, Allocator};

/// Capacities each allocator is replayed at, per trace.
pub(crate) const CURVE_POINTS: usize = 12;
/// Traces drawn as panels of one image; more make an overview.
const PANELS_MAX: usize = 6;
const WIDTH: u32 = 960;
const PANEL_H: u32 = 420;

/// One allocator's costs over the capacities of a trace's plot.
#[derive(Clone, Debug)]
pub(crate) struct Curve {
    /// "arena (defaults)", "native (expandable_segments:True)", ...
    pub(crate) label: String,
    pub(crate) min_capacity: Option<u64>,
    /// (capacity, the last step's modelled driver seconds where the replay fit).
    pub(crate) points: Vec<(u64, Option<f64>)>,
}

/// What one trace's panel shows.
#[derive(Clone, Debug)]
pub(crate) struct TracePlot {
    pub(crate) name: String,
    pub(crate) peak_requested: u64,
    pub(crate) curves: Vec<Curve>,
}

/// The capacities a trace is drawn over, given each allocator's minimum (`None`: no point).
fn capacities(mins: &[u64]) -> Option<Vec<u64>> {
    let lo = *mins.iter().min()?;
    let hi = mins.iter().max()?.saturating_add(mins.iter().max()? / 10);
    let hi = hi.max(lo.saturating_add(lo / 20)).max(lo + (2 << 20));
    let n = CURVE_POINTS as u64;
    Some((0..n).map(|i| lo + (hi - lo) * i / (n - 1)).collect())
}

/// Whether a plot of `traces` traces to `path` draws curves (panels), not only the minimums
/// (the overview).
pub(crate) fn draws_curves(path: &str, traces: usize) -> bool {
    path.contains("{trace}") || traces <= PANELS_MAX
}

/// The curves of one trace: each allocator replayed at every capacity of the plot (with
/// `sample` false, only each allocator's minimum, for the overview).
pub(crate) fn curves(
    timing: &Timing,
    trace: &Trace,
    allocators: &[Allocator],
    fits: &[Fit],
    sample: bool,
) -> CliResult<Vec<Curve>> {
    let mins: Vec<u64> = fits.iter().filter_map(|f| f.min_capacity).collect();
    let caps = match capacities(&mins) {
        Some(c) if sample => c,
        _ => Vec::new(),
    };
    allocators
        .iter()
        .zip(fits)
        .map(|(a, f)| {
            let points = caps
                .iter()
                .map(|&c| {
                    let t = lib_fit::trial(trace, a, c, timing).map_err(|e| e.to_string())?;
                    Ok((c, t.fits.then_some(t.last_step.modelled_driver_s)))
                })
                .collect::<CliResult<Vec<_>>>()?;
            Ok(Curve {
                label: format!("{} ({})", f.allocator, conf_name(&f.conf)),
                min_capacity: f.min_capacity,
                points,
            })
        })
        .collect()
}

/// Checks `--plot FILE` before any work: SVG only.
pub(crate) fn check_plot_path(path: &str) -> CliResult<()> {
    if path.to_ascii_lowercase().ends_with(".svg") {
        Ok(())
    } else {
        Err(format!(
            "fit --plot: '{path}' must end in .svg (the fit plot is SVG only; `replay --plot` \
             also writes PNG)"
        ))
    }
}

/// Write the plots of `traces` to `path` (`{trace}` in it: one file per trace).
pub(crate) fn write_plots(path: &str, traces: &[TracePlot]) -> CliResult<()> {
    if path.contains("{trace}") {
        for t in traces {
            let file = path.replace("{trace}", &file_safe(&t.name));
            write_svg(&file, |area| panels(area, std::slice::from_ref(t)), 1)?;
        }
        return Ok(());
    }
    if !draws_curves(path, traces.len()) {
        let h = (120 + 22 * traces.len()).min(30_000) as u32;
        return write_svg(path, |area| overview(area, traces), h.div_ceil(PANEL_H));
    }
    write_svg(
        path,
        |area| panels(area, traces),
        traces.len().max(1) as u32,
    )
}

fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_' => c,
            _ => '_',
        })
        .collect()
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

/// Render with `draw` into an SVG of `rows` panel heights and write it atomically.
fn write_svg(
    path: &str,
    draw: impl FnOnce(&Area<'_>) -> Result<(), String>,
    rows: u32,
) -> CliResult<()> {
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (WIDTH, PANEL_H * rows.max(1))).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        draw(&root)?;
        root.present().map_err(|e| e.to_string())?;
    }
    torch_arena::atomic_file::write(Path::new(path), |w| w.write_all(svg.as_bytes()))
        .map_err(|e| format!("fit --plot: cannot write '{path}': {e}"))
}

const GIB_F: f64 = (1u64 << 30) as f64;

fn palette(i: usize) -> RGBColor {
    const P: [RGBColor; 7] = [
        RGBColor(0x1f, 0x77, 0xb4),
        RGBColor(0xff, 0x7f, 0x0e),
        RGBColor(0x2c, 0xa0, 0x2c),
        RGBColor(0xd6, 0x27, 0x28),
        RGBColor(0x94, 0x67, 0xbd),
        RGBColor(0x8c, 0x56, 0x4b),
        RGBColor(0xe3, 0x77, 0xc2),
    ];
    P[i % P.len()]
}

/// One panel per trace, stacked.
fn panels(root: &Area<'_>, traces: &[TracePlot]) -> Result<(), String> {
    let areas = root.split_evenly((traces.len().max(1), 1));
    for (t, area) in traces.iter().zip(&areas) {
        panel(area, t).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn panel(area: &Area<'_>, t: &TracePlot) -> Result<(), Box<dyn std::error::Error>> {
    let xs: Vec<f64> = t
        .curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.0 as f64 / GIB_F))
        .collect();
    let (x0, x1) = match (
        xs.iter().copied().reduce(f64::min),
        xs.iter().copied().reduce(f64::max),
    ) {
        (Some(a), Some(b)) if b > a => (a, b),
        _ => {
            area.titled(&format!("{}: nothing fits", t.name), ("sans-serif", 16))?;
            return Ok(());
        }
    };
    let y1 = t
        .curves
        .iter()
        .flat_map(|c| c.points.iter().filter_map(|p| p.1))
        .fold(0.0f64, f64::max)
        .max(1e-5)
        * 1e3
        * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "{} (peak requested {})",
                t.name,
                fmt_bytes(t.peak_requested)
            ),
            ("sans-serif", 15),
        )
        .margin(10)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, 0.0..y1)?;
    chart
        .configure_mesh()
        .x_desc("device capacity (GiB)")
        .y_desc("last step: modelled driver time (ms)")
        .x_label_formatter(&|v| format!("{v:.2}"))
        .draw()?;
    for (i, c) in t.curves.iter().enumerate() {
        let color = palette(i);
        // Runs of capacities where the replay fit: a gap where it ran out of memory.
        let mut run: Vec<(f64, f64)> = Vec::new();
        let mut runs = Vec::new();
        for &(cap, cost) in &c.points {
            match cost {
                Some(s) => run.push((cap as f64 / GIB_F, s * 1e3)),
                None if !run.is_empty() => runs.push(std::mem::take(&mut run)),
                None => {}
            }
        }
        if !run.is_empty() {
            runs.push(run);
        }
        let label = match c.min_capacity {
            Some(m) => format!("{}: fits from {}", c.label, fmt_bytes(m)),
            None => format!("{}: does not fit", c.label),
        };
        for (k, r) in runs.iter().enumerate() {
            let s = chart.draw_series(LineSeries::new(r.iter().copied(), color.stroke_width(2)))?;
            if k == 0 {
                s.label(label.clone()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            }
            chart.draw_series(r.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        if runs.is_empty() {
            // Still in the legend: it fits nowhere on this axis.
            chart
                .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
                .label(label)
                .legend(move |(x, y)| Circle::new((x + 9, y), 3, color.filled()));
        }
        if let Some(m) = c.min_capacity {
            let x = m as f64 / GIB_F;
            chart.draw_series(DashedLineSeries::new(
                vec![(x, 0.0), (x, y1)],
                4,
                4,
                color.stroke_width(1),
            ))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()?;
    Ok(())
}

/// Many traces: per trace (a row), each allocator's minimum over the bytes requested.
fn overview(root: &Area<'_>, traces: &[TracePlot]) -> Result<(), String> {
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let labels: Vec<String> = traces
            .first()
            .map(|t| t.curves.iter().map(|c| c.label.clone()).collect())
            .unwrap_or_default();
        let ratios = |c: &Curve, t: &TracePlot| {
            c.min_capacity
                .map(|m| m as f64 / t.peak_requested.max(1) as f64)
        };
        let x1 = traces
            .iter()
            .flat_map(|t| t.curves.iter().filter_map(|c| ratios(c, t)))
            .fold(1.0f64, f64::max)
            .min(3.0)
            * 1.01;
        let n = traces.len();
        let mut chart = ChartBuilder::on(root)
            .caption(
                format!("smallest device each allocator needs, over peak requested ({n} traces)"),
                ("sans-serif", 16),
            )
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(40)
            .build_cartesian_2d(1.0..x1, 0.0..n as f64)?;
        chart
            .configure_mesh()
            .x_desc("min capacity / peak requested")
            .y_desc("trace (in the order given)")
            .y_labels(n.min(20))
            .y_label_formatter(&|v| format!("{}", *v as usize + 1))
            .draw()?;
        for (i, label) in labels.iter().enumerate() {
            let color = palette(i);
            let pts: Vec<(f64, f64)> = traces
                .iter()
                .enumerate()
                .filter_map(|(row, t)| {
                    let c = t.curves.iter().find(|c| &c.label == label)?;
                    Some((ratios(c, t)?.min(x1), row as f64 + 0.5))
                })
                .collect();
            chart
                .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?
                .label(label.clone())
                .legend(move |(x, y)| Circle::new((x + 9, y), 3, color.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()?;
        Ok(())
    };
    draw().map_err(|e| e.to_string())
}
