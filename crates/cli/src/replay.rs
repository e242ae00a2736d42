//! `torch-arena replay`: settings, one trace under every setting (and the native emulation),
//! tables, JSON lines and plot panels. `demo` reuses all of it.

use std::path::Path;

use torch_arena::config::Config;

use crate::out::CliResult;
use crate::progress::stderr_is_terminal;
use crate::replay_run::{ReplaySettings, TraceInfo, TraceOutcome, conf_name, replay_trace};

use torch_arena_lab::replay::{OomReport, StepStats, Timing};
use torch_arena_lab::{Kind, live, plot};

use crate::args::{ReplayArgs, TraceArg, native_conf_arg, usage_of};
use crate::replay_json::{json_lines, json_load_error};
use crate::replay_plot::{overview_row, panel, plot_path_for, write_plot};
use crate::text::{
    fmt_bytes, fmt_count, fmt_frag, fmt_ns, fmt_secs, fragmentation, print_table, source_name, wrap,
};
use crate::usage::{EXIT_OOM, OVERVIEW_AFTER};

/// The table of one trace, the out-of-memory reports and notes on the trace's kind.
pub(crate) fn print_outcome(s: &ReplaySettings, o: &TraceOutcome) -> CliResult<()> {
    let i = &o.info;
    let seeded = if i.seeded > 0 {
        format!(
            " ({} seeding what was live before it began)",
            fmt_count(i.seeded as u64)
        )
    } else {
        String::new()
    };
    outln!(
        "{}: {}, {} trace, {} events{seeded}, device {}; simulated GPU of {}",
        i.name,
        source_name(i.source),
        i.kind.as_str(),
        fmt_count(i.events as u64),
        i.device,
        fmt_bytes(s.capacity)
    )?;
    outln!("  {}", timing_line(&s.timing))?;
    let mut rows = vec![
        [
            "allocator",
            "peak requested",
            "peak reserved",
            "fragmentation",
            "events",
            "host time/event",
            "driver calls",
            "driver time",
            "stall",
            "",
        ]
        .map(String::from)
        .to_vec(),
    ];
    let dash = || "–".to_string();
    if let Some(peak) = i.native_recorded {
        let calls = i.native_recorded_calls;
        rows.push(vec![
            "native (recorded, one step)".into(),
            fmt_bytes(i.peak_requested),
            fmt_bytes(peak),
            fmt_frag(fragmentation(peak, i.peak_requested)),
            fmt_count(i.events as u64),
            dash(),
            calls.map_or_else(dash, |c| format!("≥ {}", fmt_count(c.total()))),
            calls.map_or_else(dash, |c| fmt_secs(s.timing.costs.seconds(&c))),
            dash(),
            String::new(),
        ]);
    }
    let oom_note = |o: Option<&OomReport>| {
        o.map(|o| {
            let step = if s.timing.repeat > 1 {
                format!(" of step {}", o.step)
            } else {
                String::new()
            };
            format!("OOM at event {}{step}", fmt_count(o.event as u64))
        })
        .unwrap_or_default()
    };
    for e in &o.emulated {
        let r = &e.result;
        rows.push(vec![
            e.label(),
            fmt_bytes(r.peak_requested),
            fmt_bytes(r.peak_reserved),
            fmt_frag(fragmentation(r.peak_reserved, r.peak_requested)),
            fmt_count(r.events as u64),
            fmt_ns(e.elapsed.as_nanos() as f64 / r.events.max(1) as f64),
            fmt_count(r.driver_calls),
            fmt_secs(r.modelled_driver_s),
            fmt_secs(r.modelled_stall_s),
            oom_note(r.oom.as_ref()),
        ]);
    }
    for run in &o.runs {
        let label = format!("arena ({})", conf_name(&run.label));
        rows.push(match &run.outcome {
            Ok(r) => vec![
                label,
                fmt_bytes(r.peak_requested),
                fmt_bytes(r.peak_reserved),
                fmt_frag(r.fragmentation),
                fmt_count(r.events as u64),
                fmt_ns(r.elapsed.as_nanos() as f64 / r.events.max(1) as f64),
                fmt_count(r.driver_calls),
                fmt_secs(r.modelled_driver_s),
                fmt_secs(r.modelled_stall_s),
                oom_note(r.oom.as_ref()),
            ],
            Err(_) => {
                let mut row = vec![label];
                row.extend((0..8).map(|_| dash()));
                row.push("failed (see the error below)".into());
                row
            }
        });
    }
    print_table(&rows)?;
    if s.timing.repeat > 1 {
        print_steady_state(o)?;
    }
    for e in &o.emulated {
        let Some(n) = e.result.oom_event else {
            continue;
        };
        let what = e
            .oom_request
            .map(|(size, stream)| format!(": allocating {} on stream {stream}", fmt_bytes(size)))
            .unwrap_or_default();
        outln!()?;
        outln!(
            "  {} ran out of memory at event {} of {}{what}",
            e.label(),
            fmt_count(n as u64),
            fmt_count(i.events as u64)
        )?;
    }
    for run in &o.runs {
        match &run.outcome {
            Ok(r) => {
                if let Some(oom) = &r.oom {
                    outln!()?;
                    print_oom(&format!("arena ({})", conf_name(&run.label)), i, oom)?;
                }
            }
            Err(e) => errln!("torch-arena: {e}"),
        }
    }
    let note = match i.kind {
        Kind::Fresh => None,
        Kind::Partial => Some(
            "partial trace: some memory was reserved before recording began; the seeded \
             events allocate what was live then",
        ),
        Kind::Warm => Some(
            "warm trace: no segment events, so the native figure is what PyTorch had reserved \
             before the window began (partly inherited from earlier phases of the run)",
        ),
        Kind::StateOnly => {
            Some("state-only snapshot: replayed as the allocation of the blocks live at dump time")
        }
    };
    if let Some(n) = note {
        outln!()?;
        for line in wrap(&format!("note: {n}"), 94).lines() {
            outln!("  {line}")?;
        }
    }
    outln!()
}

/// The settings of the timing model, in one line. A replay step is one whole pass over the
/// trace (not a step of the training the trace may have recorded).
pub(crate) fn timing_line(t: &Timing) -> String {
    let passes = if t.repeat == 1 {
        "replayed once".to_string()
    } else {
        format!(
            "replayed {} times in a row (replay steps 1–{}, each the whole trace)",
            t.repeat, t.repeat
        )
    };
    format!(
        "{passes}; GPU lag {}; driver calls priced at {}",
        fmt_secs(t.gpu_lag_ns as f64 / 1e9),
        t.costs.source
    )
}

/// Per allocator: memory driver calls and modelled driver time in the last step, beside the first.
pub(crate) fn print_steady_state(o: &TraceOutcome) -> CliResult<()> {
    let mut rows = vec![
        [
            "allocator",
            "step 1: memory calls",
            "step 1: driver time",
            "last step: memory calls",
            "last step: driver time",
            "last step: stall",
        ]
        .map(String::from)
        .to_vec(),
    ];
    let mut row = |label: String, steps: &[StepStats]| {
        if let (Some(a), Some(z)) = (steps.first(), steps.last()) {
            rows.push(vec![
                label,
                fmt_count(a.calls.memory_calls()),
                fmt_secs(a.modelled_driver_s),
                fmt_count(z.calls.memory_calls()),
                fmt_secs(z.modelled_driver_s),
                fmt_secs(z.modelled_stall_s),
            ]);
        }
    };
    for e in &o.emulated {
        row(e.label(), &e.result.steps);
    }
    for run in &o.runs {
        if let Ok(r) = &run.outcome {
            row(format!("arena ({})", conf_name(&run.label)), &r.steps);
        }
    }
    outln!()?;
    outln!(
        "  steady state (memory calls: create, map, set access, unmap, release, reserve, alloc, free):"
    )?;
    print_table(&rows)
}

/// The report of an arena out-of-memory: the failing request, what was live, what was cached.
pub(crate) fn print_oom(who: &str, i: &TraceInfo, o: &OomReport) -> CliResult<()> {
    outln!(
        "  {who} ran out of memory at event {} of {}: allocating {} on stream {}",
        fmt_count(o.event as u64),
        fmt_count(i.events as u64),
        fmt_bytes(o.size),
        o.stream
    )?;
    outln!(
        "    live:     {} in {} allocations",
        fmt_bytes(o.live_bytes),
        fmt_count(o.live_count)
    )?;
    outln!(
        "    reserved: {}, of which cached (idle pages, usable by any request): {}",
        fmt_bytes(o.reserved),
        fmt_bytes(o.cached)
    )?;
    if !o.largest_live.is_empty() {
        outln!("    largest live allocations:")?;
        for (bytes, site) in &o.largest_live {
            let site = if site.is_empty() {
                "(unknown site)"
            } else {
                site
            };
            outln!("      {:>12}  {site}", fmt_bytes(*bytes))?;
        }
    }
    let mut lines = o.message.lines();
    if let Some(first) = lines.next() {
        outln!("    arena: {first}")?;
        for l in lines {
            outln!("           {l}")?;
        }
    }
    Ok(())
}

pub(crate) fn replay_command(a: ReplayArgs) -> CliResult<u8> {
    let mut s = ReplaySettings::new(Some(false));
    if let Some(c) = a.capacity {
        s.capacity = c;
    }
    for c in &a.confs {
        s.add_conf(c)?;
    }
    for c in &a.native_confs {
        s.native_confs.push(native_conf_arg(c)?);
    }
    s.set_timing(a.repeat, a.gpu_lag, a.driver_costs.as_deref())?;
    s.plot = a.plot;
    s.live = a.live.unwrap_or(0);
    s.native = a.native;
    s.backing = a.backing;
    s.check = a.check;
    s.json = a.json;
    s.progress = a.progress.choice().unwrap_or_else(stderr_is_terminal);
    if a.traces.is_empty() {
        return Err(format!(
            "replay: no trace given (a file, or e.g. synth:rmm-random:10000:64MiB)\n{}",
            usage_of("replay")
        ));
    }
    if s.confs.is_empty() {
        s.confs.push((String::new(), Config::default()));
    }
    s.check_plot()?;
    // Every argument is checked before any replay starts: a typo in the last file name should
    // not cost the time of replaying the others first.
    TraceArg::check_all(&a.traces)?;
    run_replays(&s, &a.traces)
}

/// Replay every trace, printing as each finishes; returns the exit status.
pub(crate) fn run_replays(s: &ReplaySettings, traces: &[TraceArg]) -> CliResult<u8> {
    let mut failed = false;
    let mut oom = false;
    let mut panels = Vec::new();
    let mut overview = Vec::new();
    let per_trace_plot = s.plot.as_deref().filter(|p| p.contains("{trace}"));
    for arg in traces {
        match replay_trace(s, arg) {
            Ok(o) => {
                if s.json {
                    for line in json_lines(s, &o) {
                        outln!("{line}")?;
                    }
                    for run in &o.runs {
                        if let Err(e) = &run.outcome {
                            errln!("torch-arena: {e}");
                        }
                    }
                } else {
                    print_outcome(s, &o)?;
                    if let Some((set, what)) = &o.live {
                        outln!("  live by site {what}:")?;
                        for line in live::render(set, s.live).lines() {
                            outln!("    {line}")?;
                        }
                        outln!()?;
                    }
                }
                failed |= o.runs.iter().any(|r| r.outcome.is_err());
                oom |= o.arena_oom();
                if s.plot.is_some() {
                    let p = panel(s, &o);
                    if let Some(pattern) = per_trace_plot {
                        if let Err(e) = write_plot(&plot_path_for(pattern, &o.info.name), &[p]) {
                            errln!("torch-arena: {e}");
                            failed = true;
                        }
                    } else {
                        panels.push(p);
                        overview.push(overview_row(&o));
                    }
                }
            }
            Err(e) => {
                errln!("torch-arena: {e}");
                if s.json {
                    outln!("{}", json_load_error(arg, &e))?;
                }
                failed = true;
            }
        }
    }
    if let Some(p) = &s.plot
        && per_trace_plot.is_none()
        && !panels.is_empty()
    {
        let written = if panels.len() > OVERVIEW_AFTER {
            // Many traces: one row each rather than a panel each stacked into one tall image.
            let title = format!(
                "{} traces: ours / native ({}), {} step{}, GPU lag {}, GPU {}",
                overview.len(),
                if s.native { "emulated" } else { "recorded" },
                s.timing.repeat,
                if s.timing.repeat == 1 { "" } else { "s" },
                fmt_secs(s.timing.gpu_lag_ns as f64 / 1e9),
                fmt_bytes(s.capacity)
            );
            plot::write_overview(Path::new(p), &title, &overview)
                .map_err(|e| e.to_string())
                .map(|()| {
                    errln!(
                        "torch-arena: overview of {} traces written to {p} (one panel per trace: \
                         put {{trace}} in the file name)",
                        overview.len()
                    )
                })
        } else {
            write_plot(Path::new(p), &panels)
        };
        if let Err(e) = written {
            errln!("torch-arena: {e}");
            failed = true;
        }
    }
    Ok(if failed {
        1
    } else if oom {
        EXIT_OOM
    } else {
        0
    })
}
