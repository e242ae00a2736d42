//! `torch-arena demo`: the built-in demo trace replayed beside the native emulation, with a
//! reading, and `demo --model`: the modelled training loop run through the arena.

use std::path::PathBuf;
use std::time::Instant;

use torch_arena::TorchArena;
use torch_arena::device::DriverCounters;
use torch_arena::device::costs::DriverCosts;
use torch_arena_lab::fit::Fit;
use torch_arena_lab::training::TrainingLoop;

use crate::out::CliResult;
use crate::progress::with_spinner;
use crate::replay::print_outcome;

use torch_arena::config::{Config, DeviceKind};
use torch_arena_lab::replay::{ReplayResult, StepStats, Timing};

use crate::args::{DemoArgs, TraceArg, usage_of};
use crate::fit::{best_native, fit_default_settings, fit_rows};
use crate::replay_plot::{panel, plot_path_for, write_plot};
use crate::replay_run::{ReplaySettings, TraceOutcome, replay_trace};
use crate::text::{
    fmt_bytes, fmt_count, fmt_frag, fmt_ns, fmt_secs, fragmentation, nb, print_table, wrap,
};
use crate::usage::{DEFAULT_CAPACITY, DEMO_REPEAT, EXIT_OOM};

/// Where the shipped demo trace lives, relative to the source tree.
pub(crate) const DEMO_TRACE_REL: &str = "traces/demo-train.trace.gz";
/// The demo trace, built into the command so that `torch-arena demo` works from an installed
/// wheel anywhere (`scripts/make-demo-trace` rewrites the file; rebuild to embed the new one).
pub(crate) const DEMO_TRACE: &[u8] = include_bytes!("../../../traces/demo-train.trace.gz");
/// Its name in tables and plots.
pub(crate) const DEMO_TRACE_NAME: &str = "demo-train.trace.gz";

pub(crate) fn demo_command(a: DemoArgs) -> CliResult<u8> {
    if let Some(p) = a.unexpected.first() {
        return Err(format!(
            "demo: unexpected argument '{p}' (to replay a trace of your own: torch-arena replay {p})\n{}",
            usage_of("demo")
        ));
    }
    let timing_given = a.repeat.is_some() || a.gpu_lag.is_some() || a.driver_costs.is_some();
    if a.model || a.steps.is_some() {
        if a.capacity.is_some() || a.plot.is_some() || timing_given {
            return Err(
                "demo --model runs the loop itself: --capacity, --plot, --repeat, --gpu-lag and \
                 --driver-costs are for the trace replay (for the model, set the capacity with \
                 --conf device:sim,sim_capacity_mb:N)"
                    .into(),
            );
        }
        return model_demo(
            a.steps.unwrap_or(8),
            a.conf.as_deref().unwrap_or("device:sim"),
        );
    }
    let progress = a.progress.choice();
    let (capacity, plot_file, conf) = (a.capacity, a.plot, a.conf);
    let mut s = ReplaySettings::new(progress);
    s.native = true;
    s.capacity = capacity.unwrap_or(DEFAULT_CAPACITY);
    // Three passes by default, so the table shows a warm step beside the first.
    s.timing.repeat = DEMO_REPEAT;
    s.set_timing(a.repeat, a.gpu_lag, a.driver_costs.as_deref())?;
    s.plot = plot_file;
    s.add_conf(conf.as_deref().unwrap_or(""))?;
    s.check_plot()?;
    let from_env = std::env::var_os("TORCH_ARENA_DEMO_TRACE").filter(|p| !p.is_empty());
    let arg = match &from_env {
        Some(p) => {
            let path = PathBuf::from(p);
            if !path.is_file() {
                return Err(format!(
                    "demo: TORCH_ARENA_DEMO_TRACE names '{}', which does not exist.\n  \
                     Unset it to replay the trace built into torch-arena, make one from a source \
                     checkout with: scripts/make-demo-trace\n  \
                     (it records `torch-arena demo --model --steps 12` through the trace:PATH \
                     recorder),\n  or run the modelled loop directly: torch-arena demo --model",
                    path.display()
                ));
            }
            TraceArg::File(path)
        }
        None => TraceArg::Embedded(DEMO_TRACE, DEMO_TRACE_NAME),
    };
    let path = PathBuf::from(arg.text());
    let o = replay_trace(&s, &arg)?;
    let intro = if from_env.is_some() {
        format!(
            "torch-arena demo: replaying {} (from TORCH_ARENA_DEMO_TRACE), {} allocation events, \
             on a simulated {} GPU, beside PyTorch's native caching allocator emulated on the same \
             events.",
            path.display(),
            fmt_count(o.info.events as u64),
            fmt_bytes(s.capacity)
        )
    } else {
        format!(
            "torch-arena demo: replaying the demo trace built into torch-arena ({DEMO_TRACE_REL}), \
             12 training steps of a GPT-style model \
             (12 layers of width 768, batch 8, a sequence length that changes every step, Adam) \
             recorded through the plugin's trace recorder: {} allocations and frees, on a \
             simulated {} GPU, beside PyTorch's native caching allocator emulated on the same \
             events.",
            fmt_count(o.info.events as u64),
            fmt_bytes(s.capacity)
        )
    };
    outln!("{}", wrap(&intro, 96))?;
    outln!()?;
    // Bytes at the limit first: what each allocator needs, not what it caches with room to spare.
    let fit_timing = Timing {
        gpu_lag_ns: 0,
        ..s.timing.clone()
    };
    let trace = with_spinner(s.progress, "fitting", &o.info.name, || arg.load())?;
    let fits = with_spinner(s.progress, "fitting", &o.info.name, || {
        fit_default_settings(&trace, &s.confs[0], &fit_timing)
    })?;
    drop(trace);
    outln!(
        "The smallest GPU on which all {} replay steps run with no out-of-memory, for each \
         allocator (torch-arena fit, GPU lag 0):",
        s.timing.repeat
    )?;
    print_table(&fit_rows(&fits, o.info.peak_requested))?;
    outln!()?;
    outln!(
        "The same steps on a simulated {} GPU, where memory is plentiful:",
        fmt_bytes(s.capacity)
    )?;
    print_outcome(&s, &o)?;
    if let Some(Ok(r)) = o.runs.first().map(|r| &r.outcome) {
        outln!("torch-arena in memory_summary terms:")?;
        let rows = [
            ("Requested memory, peak", fmt_bytes(r.peak_requested)),
            ("GPU reserved memory, peak", fmt_bytes(r.peak_reserved)),
            (
                "Reserved beyond requested, at the peaks",
                fmt_bytes(r.peak_reserved.saturating_sub(r.peak_requested)),
            ),
            (
                "Driver calls (page create, map, unmap, release)",
                fmt_count(r.driver_calls),
            ),
            (
                "Modelled driver time (H200 latencies), host stall",
                format!(
                    "{}, {}",
                    fmt_secs(r.modelled_driver_s),
                    fmt_secs(r.modelled_stall_s)
                ),
            ),
            (
                "Memory driver calls in the last replay step",
                steady_calls(&r.steps),
            ),
            (
                "  the same for native (emulated)",
                o.emulated
                    .first()
                    .map_or_else(|| "–".into(), |e| steady_calls(&e.result.steps)),
            ),
            (
                "Replay time",
                format!(
                    "{:.3} s ({} per event)",
                    r.elapsed.as_secs_f64(),
                    fmt_ns(r.elapsed.as_nanos() as f64 / r.events.max(1) as f64)
                ),
            ),
        ];
        for (k, v) in rows {
            outln!("  {k:<50} {v:>22}")?;
        }
        outln!()?;
        outln!("{}", wrap(&demo_reading(&s, &o, r, &fits), 96))?;
    }
    if let Some(p) = &s.plot {
        let file = plot_path_for(p, &o.info.name);
        write_plot(&file, &[panel(&s, &o)])?;
    }
    Ok(if o.runs.iter().any(|r| r.outcome.is_err()) {
        1
    } else if o.arena_oom() {
        EXIT_OOM
    } else {
        0
    })
}

/// Memory driver calls of the last step, and its modelled driver time.
pub(crate) fn steady_calls(steps: &[StepStats]) -> String {
    steps.last().map_or_else(
        || "–".into(),
        |z| {
            format!(
                "{} ({}, step {})",
                fmt_count(z.calls.memory_calls()),
                fmt_secs(z.modelled_driver_s),
                steps.len()
            )
        },
    )
}

/// A paragraph that reads the demo's table for a person.
pub(crate) fn demo_reading(
    s: &ReplaySettings,
    o: &TraceOutcome,
    r: &ReplayResult,
    fits: &[Fit],
) -> String {
    let nbb = |b| nb(fmt_bytes(b));
    let nbf = |f| nb(fmt_frag(f));
    let nbc = |n| nb(fmt_count(n));
    let req = r.peak_requested;
    let mut t = format!(
        "Reading: at its peak the run had {} of tensors live. ",
        nbb(req)
    );
    let arena_min = fits
        .iter()
        .find(|f| f.allocator == "arena")
        .and_then(|f| f.min_capacity);
    if let (Some(a), Some(b)) = (arena_min, best_native(fits)) {
        let best = fits
            .iter()
            .find(|f| f.allocator == "native" && f.min_capacity == Some(b))
            .map_or(String::new(), |f| match f.conf.as_str() {
                "" => "its defaults".to_string(),
                c => c.to_string(),
            });
        let (diff, word) = if a <= b {
            (b - a, "less")
        } else {
            (a - b, "more")
        };
        t += &format!(
            "The smallest GPU it runs on is what decides whether a workload fits: torch-arena \
             needs {}, PyTorch's native allocator at best {} (with {best}), so \
             torch-arena needs {} {word}. ",
            nbb(a),
            nbb(b),
            nbb(diff)
        );
    }
    t += &format!("On the {} GPU: ", nbb(s.capacity));
    if let Some(oom) = &r.oom {
        t += &format!(
            "torch-arena ran out of memory at event {} on this {} GPU (the report above says \
             what was live and cached). ",
            nbc(oom.event as u64),
            nbb(s.capacity)
        );
    } else {
        t += &format!(
            "torch-arena reserved {}, {} more than that. ",
            nbb(r.peak_reserved),
            nbf(r.fragmentation)
        );
    }
    if let Some(e) = o.emulated.first() {
        let nat = e.result.peak_reserved;
        if let Some(n) = e.result.oom_event {
            t += &format!(
                "PyTorch's native allocator, emulated on the same events, ran out of memory at \
                 event {} on this {} GPU. ",
                nbc(n as u64),
                nbb(s.capacity)
            );
        } else if r.oom.is_none() {
            let ours = r.peak_reserved;
            let (diff, word) = if ours <= nat {
                (nat - ours, "less")
            } else {
                (ours - nat, "more")
            };
            t += &format!(
                "PyTorch's native allocator, emulated on the same events, would reserve {} ({} \
                 more than requested) and torch-arena {} {word} ({:.1}\u{a0}% of the native \
                 figure): what \
                 each keeps cached while memory is plentiful, not what each needs (native gives \
                 its cache back when memory runs short). ",
                nbb(nat),
                nbf(fragmentation(nat, req)),
                nbb(diff),
                100.0 * diff as f64 / nat.max(1) as f64
            );
        }
    }
    t += "Driver calls count the simulated page creations, maps and unmaps: on a GPU each costs \
          tens of microseconds, so fewer is better. Times per event are the allocators' host \
          bookkeeping on the simulated device, not GPU time.";
    t
}

/// `torch-arena demo --model`: the modelled training loop, run through the arena directly.
pub(crate) fn model_demo(steps: u32, conf_text: &str) -> CliResult<u8> {
    let conf = Config::parse(conf_text).map_err(|e| format!("--conf: {e}"))?;
    if conf.device != DeviceKind::Sim {
        return Err("demo runs on the simulated GPU: use --conf device:sim,...".into());
    }
    let arena = TorchArena::new(conf.clone());
    outln!("torch-arena demo: a transformer training loop modelled on a simulated GPU ({conf})")?;
    outln!()?;
    outln!(
        " step | live tensors |   allocated |  peak alloc |    reserved |   peak resv |   frag | \
         time/op | mem calls | driver time | created for: peak / layout"
    )?;
    let started = Instant::now();
    let mut workload = TrainingLoop::new(&arena).map_err(|e| e.to_string())?;
    let costs = DriverCosts::default();
    let counters = || -> CliResult<DriverCounters> {
        Ok(arena
            .arena(0)
            .map_err(|e| e.to_string())?
            .device()
            .counters())
    };
    let growth = || arena.growth(0).map_err(|e| e.to_string());
    for step in 1..=steps {
        let t = Instant::now();
        let before = counters()?;
        let grown_before = growth()?;
        let ops = workload.step(step).map_err(|e| e.to_string())?;
        let calls = counters()?.since(&before);
        let grown = growth()?.since(&grown_before);
        let s = arena.stats(0).map_err(|e| e.to_string())?;
        let frag =
            1.0 - s.requested_bytes.all().peak as f64 / s.reserved_bytes.all().peak.max(1) as f64;
        outln!(
            " {step:>4} | {:>12} | {:>11} | {:>11} | {:>11} | {:>11} | {:>5.1}% | {:>7} | {:>9} | {:>11} | {:>26}",
            s.allocation.all().current,
            bytes(s.allocated_bytes.all().current),
            bytes(s.allocated_bytes.all().peak),
            bytes(s.reserved_bytes.all().current),
            bytes(s.reserved_bytes.all().peak),
            frag * 100.0,
            fmt_ns(t.elapsed().as_nanos() as f64 / ops.max(1) as f64),
            fmt_count(calls.memory_calls()),
            fmt_secs(costs.seconds(&calls)),
            format!(
                "{} / {}",
                fmt_count(grown.at_peak.handles),
                fmt_count(grown.below_peak.handles)
            ),
        )?;
    }
    outln!()?;
    outln!(
        "mem calls: memory driver calls of the step (create, map, set access, unmap, release, \
         reserve); driver time: all its calls priced at the H200's measured latencies \
         (BENCHMARKS.md); created for: physical handles the step created for requests that \
         took the bytes requested to a new peak (growth any allocator needs there) / for \
         requests under the peak so far (layout). A warm native allocator makes no memory call \
         in a step that repeats its shapes."
    )?;
    outln!()?;
    out!("{}", arena.summary(0, false).map_err(|e| e.to_string())?)?;
    outln!(
        "{steps} step{} in {:.2} s",
        if steps == 1 { "" } else { "s" },
        started.elapsed().as_secs_f64()
    )?;
    Ok(0)
}

/// A memory_stats figure for the table: at most 11 characters (`1023.99 GiB`) whatever the size,
/// so the columns stay aligned.
pub(crate) fn bytes(n: i64) -> String {
    fmt_bytes(u64::try_from(n).unwrap_or(0))
}
