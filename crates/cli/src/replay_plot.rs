//! `replay --plot`: a panel per trace (requested and reserved bytes over the events, driver
//! time, capacity, OOMs) and the overview row of a sweep.

use std::path::{Path, PathBuf};

use torch_arena::device::costs::DriverCosts;
use torch_arena_lab::plot;
use torch_arena_lab::replay::Point;

use crate::out::CliResult;

use torch_arena_lab::plot::{Line, Mark, OverviewRow, Panel, Style, TimeLine, XAxis};

use crate::replay_run::{ReplaySettings, TraceOutcome, conf_name};
use crate::text::{fmt_bytes, fmt_count, fmt_secs, source_name};

/// The plot panel of one trace: requested bytes once, then each allocator's reserved bytes.
pub(crate) fn panel(s: &ReplaySettings, o: &TraceOutcome) -> Panel {
    let i = &o.info;
    let pts = |p: &[Point], reserved: bool| -> Vec<(u64, u64)> {
        p.iter()
            .map(|p| {
                (
                    p.event as u64,
                    if reserved { p.reserved } else { p.requested },
                )
            })
            .collect()
    };
    let mut lines = Vec::new();
    let requested = o
        .runs
        .iter()
        .filter_map(|r| r.outcome.as_ref().ok())
        .map(|r| &r.series)
        .chain(o.emulated.iter().map(|e| &e.result.series))
        .chain(o.recorded_series.as_ref())
        .find(|s| !s.is_empty());
    if let Some(series) = requested {
        lines.push(Line {
            label: "requested".into(),
            style: Style::Requested,
            points: pts(series, false),
        });
    }
    if let Some(series) = &o.recorded_series {
        lines.push(Line {
            label: "native (recorded) reserved".into(),
            style: Style::NativeRecorded,
            points: pts(series, true),
        });
    }
    for e in &o.emulated {
        lines.push(Line {
            label: format!("{} reserved", e.label()),
            style: Style::NativeEmulated,
            points: pts(&e.result.series, true),
        });
    }
    for (n, run) in o.runs.iter().enumerate() {
        if let Ok(r) = &run.outcome {
            lines.push(Line {
                label: format!("arena ({}) reserved", conf_name(&run.label)),
                style: Style::Arena(n),
                points: pts(&r.series, true),
            });
        }
    }
    // Out-of-memory markers, at the position of the failing event in the replay (which counts
    // every step's events).
    let mut marks = Vec::new();
    let mut times = Vec::new();
    let mut subtitle = Vec::new();
    let time_points = |p: &[Point]| -> Vec<(u64, f64)> {
        p.iter()
            .map(|p| (p.event as u64, p.driver_ns as f64 / 1e9))
            .collect()
    };
    for e in &o.emulated {
        let r = &e.result;
        if r.oom.is_some() {
            marks.push(Mark {
                event: r.events.saturating_sub(1) as u64,
                label: format!("OOM: {}", e.label()),
                style: Style::NativeEmulated,
            });
        }
        if !r.series.is_empty() {
            times.push(TimeLine {
                label: format!("driver time, {}", e.label()),
                style: Style::NativeEmulated,
                points: time_points(&r.series),
            });
        }
        subtitle.push(format!("{} {}", e.label(), fmt_secs(r.modelled_driver_s)));
    }
    for (n, run) in o.runs.iter().enumerate() {
        if let Ok(r) = &run.outcome {
            let who = format!("arena ({})", conf_name(&run.label));
            if r.oom.is_some() {
                marks.push(Mark {
                    event: r.events.saturating_sub(1) as u64,
                    label: format!("OOM: {who}"),
                    style: Style::Arena(n),
                });
            }
            if !r.series.is_empty() {
                times.push(TimeLine {
                    label: format!("driver time, {who}"),
                    style: Style::Arena(n),
                    points: time_points(&r.series),
                });
            }
            subtitle.push(format!("{who} {}", fmt_secs(r.modelled_driver_s)));
        }
    }
    let t = &s.timing;
    let subtitle = format!(
        "modelled driver time: {}; {} step{}, GPU lag {}",
        if subtitle.is_empty() {
            "–".to_string()
        } else {
            subtitle.join(", ")
        },
        t.repeat,
        if t.repeat == 1 { "" } else { "s" },
        fmt_secs(t.gpu_lag_ns as f64 / 1e9)
    );
    Panel {
        title: format!(
            "{}: {} {}, {} events, GPU {}",
            i.name,
            i.kind.as_str(),
            source_name(i.source),
            fmt_count(i.events as u64),
            fmt_bytes(s.capacity)
        ),
        subtitle,
        events: i.events as u64,
        lines,
        capacity: Some(s.capacity),
        seeded: i.seeded as u64,
        marks,
        times,
        x_axis: XAxis::Events,
    }
}

/// One row of the overview chart of a sweep: ours (the first setting) against native (emulated
/// where it ran, else recorded).
pub(crate) fn overview_row(o: &TraceOutcome) -> OverviewRow {
    let i = &o.info;
    let ours = o.runs.first().and_then(|r| r.outcome.as_ref().ok());
    let em = o.emulated.first().map(|e| &e.result);
    let native_reserved = em.map(|r| r.peak_reserved).or(i.native_recorded);
    let native_driver = em.map(|r| r.modelled_driver_s).or(i
        .native_recorded_calls
        .map(|c| DriverCosts::default().seconds(&c)));
    let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
    let mut note = Vec::new();
    if ours.is_some_and(|r| r.oom.is_some()) {
        note.push("OOM: arena");
    }
    if em.is_some_and(|r| r.oom.is_some()) {
        note.push("OOM: native");
    }
    OverviewRow {
        name: i.name.clone(),
        reserved_ratio: ours
            .zip(native_reserved)
            .and_then(|(r, n)| ratio(r.peak_reserved as f64, n as f64)),
        driver_ratio: ours
            .zip(native_driver)
            .and_then(|(r, n)| ratio(r.modelled_driver_s, n)),
        note: note.join(", "),
    }
}

/// `{trace}` in a plot file name replaced by the trace's name, made safe for a file name.
pub(crate) fn plot_path_for(pattern: &str, trace_name: &str) -> PathBuf {
    let safe: String = trace_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    PathBuf::from(pattern.replace("{trace}", &safe))
}

pub(crate) fn write_plot(path: &Path, panels: &[Panel]) -> CliResult<()> {
    plot::write(path, panels).map_err(|e| e.to_string())?;
    errln!("torch-arena: plot written to {}", path.display());
    Ok(())
}
