//! `torch-arena fit`: the smallest simulated device on which each trace replays with no
//! out-of-memory, for the arena under each `--conf` and PyTorch's native allocator under each
//! `--native-conf` (`torch_arena_lab::fit`), with what the last step costs there. Traces run
//! in parallel, one worker per core; results print in the order the traces were given.

use std::sync::{Mutex, mpsc};
use std::time::Duration;

use serde::Serialize;

use torch_arena::config::Config;
use torch_arena_lab::Trace;
use torch_arena_lab::native::NativeOptions;
use torch_arena_lab::replay::Timing;

use crate::fit_plot;
use crate::out::CliResult;

use crate::args::{FitArgs, TraceArg, native_conf_arg, usage_of};
use crate::json::{CallsByKind, LoadError, to_line};
use crate::progress::{ProgressBar, stderr_is_terminal};
use crate::replay_run::{ReplaySettings, TraceInfo, conf_name, timing_under, trace_info};
use crate::text::{fmt_bytes, fmt_count, fmt_secs, print_table, source_key, source_name};

pub(crate) use torch_arena_lab::fit::Fit;
use torch_arena_lab::fit::{self as lib_fit, Allocator};

/// The settings of one `fit`.
struct FitSettings {
    /// Arena settings: (as written, parsed); default one with the defaults.
    confs: Vec<(String, Config)>,
    /// Native settings as written; default: defaults and `expandable_segments:True`, plus what
    /// each snapshot recorded.
    native_confs: Vec<String>,
    native_given: bool,
    timing: Timing,
    json: bool,
    progress: bool,
    jobs: usize,
    /// `--plot FILE.svg`: each allocator's last-step cost over capacities near the limit.
    plot: Option<String>,
    /// The plot draws curves (panels), not only the minimums (`fit_plot::draws_curves`).
    curves: bool,
}

/// What `fit` found for one trace.
struct TraceFit {
    info: TraceInfo,
    fits: Vec<Fit>,
    /// With `--plot`: what the trace's panel shows.
    plot: Option<fit_plot::TracePlot>,
}

/// The native settings compared when none is given.
const DEFAULT_NATIVE_CONFS: [&str; 2] = ["", "expandable_segments:True"];

pub(crate) fn fit_command(a: FitArgs) -> CliResult<u8> {
    let mut replay = ReplaySettings::new(Some(false));
    // Bytes at the limit, as the GPU would finish everything at once unless told.
    replay.timing.gpu_lag_ns = 0;
    for c in &a.confs {
        replay.add_conf(c)?;
    }
    let mut native_confs = a
        .native_confs
        .iter()
        .map(|c| native_conf_arg(c))
        .collect::<CliResult<Vec<_>>>()?;
    replay.set_timing(a.repeat, a.gpu_lag, a.driver_costs.as_deref())?;
    if let Some(p) = &a.plot {
        fit_plot::check_plot_path(p)?;
    }
    if a.traces.is_empty() {
        return Err(format!(
            "fit: no trace given (a file, or e.g. synth:rmm-random:10000:64MiB)\n{}",
            usage_of("fit")
        ));
    }
    if replay.confs.is_empty() {
        replay.confs.push((String::new(), Config::default()));
    }
    let native_given = !native_confs.is_empty();
    if !native_given {
        native_confs = DEFAULT_NATIVE_CONFS.iter().map(|c| c.to_string()).collect();
    }
    TraceArg::check_all(&a.traces)?;
    let traces = a.traces;
    let (json, jobs, plot) = (a.json, a.jobs, a.plot);
    let progress = a.progress.choice();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let s = FitSettings {
        confs: replay.confs,
        native_confs,
        native_given,
        timing: replay.timing,
        json,
        progress: progress.unwrap_or_else(stderr_is_terminal),
        jobs: jobs.unwrap_or(cores).min(traces.len()).max(1),
        curves: plot
            .as_deref()
            .is_some_and(|p| fit_plot::draws_curves(p, traces.len())),
        plot,
    };
    run_fits(&s, &traces)
}

/// The allocators fitted on `trace`: the arena under each `--conf`, then native under each
/// native setting and, unless settings were given, under what the snapshot recorded.
fn allocators(s: &FitSettings, trace: &Trace) -> Vec<Allocator> {
    let mut out: Vec<Allocator> = s
        .confs
        .iter()
        .map(|(label, conf)| Allocator::Arena {
            conf: conf.clone(),
            label: label.clone(),
        })
        .collect();
    let mut natives = s.native_confs.clone();
    let recorded = trace.native.as_ref().and_then(|n| n.conf.clone());
    if let Some(r) = recorded.filter(|r| !s.native_given && !natives.contains(r)) {
        natives.push(r);
    }
    for label in natives {
        // Checked when given; a recorded one PyTorch accepted may still name a key the lab
        // refuses (a newer torch's): skipped, as the settings of no emulation.
        if let Ok(options) = NativeOptions::with_conf(0, "--native-conf", &label) {
            out.push(Allocator::Native { options, label });
        }
    }
    out
}

/// Fit every trace on `s.jobs` workers; print each trace's result in the order given.
fn run_fits(s: &FitSettings, traces: &[TraceArg]) -> CliResult<u8> {
    let n = traces.len();
    // With --plot, each allocator's curve is one more unit.
    let per_trace = (s.confs.len() + s.native_confs.len()) * (1 + s.curves as usize);
    let mut plots = Vec::new();
    let results: Mutex<Vec<Option<CliResult<TraceFit>>>> =
        Mutex::new((0..n).map(|_| None).collect());
    let next = Mutex::new(0usize);
    let (tx, rx) = mpsc::channel::<()>();
    let mut failed = false;
    let mut write_error = None;
    std::thread::scope(|scope| {
        for _ in 0..s.jobs {
            let tx = tx.clone();
            let (results, next) = (&results, &next);
            scope.spawn(move || {
                loop {
                    let i = {
                        let mut g = next.lock().unwrap_or_else(|p| p.into_inner());
                        let i = *g;
                        *g += 1;
                        i
                    };
                    let Some(arg) = traces.get(i) else { break };
                    let r = fit_trace(s, arg, &tx);
                    results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
                    let _ = tx.send(());
                }
            });
        }
        drop(tx);
        // Progress: one unit per allocator fitted (a trace that fails to load counts whole).
        let mut bar = ProgressBar::new(s.progress, format!("fit: {n} trace(s)")).counting("fits");
        let total = n * per_trace;
        let (mut done, mut printed) = (0usize, 0usize);
        loop {
            let got = rx.recv_timeout(Duration::from_millis(200));
            if got.is_ok() {
                done += 1;
            }
            bar.update(done.min(total), total.max(1));
            // Print finished traces in order as soon as every earlier one is out.
            loop {
                let ready = results.lock().unwrap_or_else(|p| p.into_inner())[printed].take();
                match ready {
                    Some(r) => {
                        if let Ok(TraceFit { plot: Some(p), .. }) = &r {
                            plots.push(p.clone());
                        }
                        match bar.suspend(|| print_trace_fit(s, &traces[printed], r)) {
                            Ok(f) => failed |= f,
                            Err(e) => {
                                write_error = Some(e);
                                break;
                            }
                        }
                        printed += 1;
                        if printed == n {
                            break;
                        }
                    }
                    None => break,
                }
            }
            let disconnected = matches!(got, Err(mpsc::RecvTimeoutError::Disconnected));
            if printed == n || write_error.is_some() || disconnected {
                break;
            }
        }
        // Output is gone: the workers stop at their next trace.
        if write_error.is_some() {
            *next.lock().unwrap_or_else(|p| p.into_inner()) = n;
        }
    });
    if let Some(e) = write_error {
        return Err(e);
    }
    if let Some(path) = &s.plot {
        fit_plot::write_plots(path, &plots)?;
        if !s.json {
            errln!("fit: wrote {path}");
        }
    }
    Ok(if failed { 1 } else { 0 })
}

/// Load one trace and fit every allocator on it; one message on `tick` per allocator done.
fn fit_trace(s: &FitSettings, arg: &TraceArg, tick: &mpsc::Sender<()>) -> CliResult<TraceFit> {
    let trace = arg.load()?;
    let mut fits = Vec::new();
    let allocs = allocators(s, &trace);
    for a in &allocs {
        fits.push(fit_one(&s.timing, &trace, a).map_err(|e| format!("{}: {e}", arg.name()))?);
        let _ = tick.send(());
    }
    let mut t = TraceFit {
        info: trace_info(arg, &trace),
        fits,
        plot: None,
    };
    if s.plot.is_some() {
        let curves = fit_plot::curves(&s.timing, &trace, &allocs, &t.fits, s.curves)
            .map_err(|e| format!("{}: --plot: {e}", arg.name()))?;
        if s.curves {
            for _ in &allocs {
                let _ = tick.send(());
            }
        }
        t.plot = Some(fit_plot::TracePlot {
            name: t.info.name.clone(),
            peak_requested: peak_requested(&t),
            curves,
        });
    }
    Ok(t)
}

/// The most bytes requested at once over every step, as the replays that fit saw it (the trace's
/// one-pass peak when none did).
fn peak_requested(t: &TraceFit) -> u64 {
    t.fits
        .iter()
        .filter_map(|f| f.at_min.as_ref().map(|a| a.peak_requested))
        .max()
        .unwrap_or(t.info.peak_requested)
}

/// The least capacity among the native settings that fit, if any did.
pub(crate) fn best_native(fits: &[Fit]) -> Option<u64> {
    fits.iter()
        .filter(|f| f.allocator == "native")
        .filter_map(|f| f.min_capacity)
        .min()
}

/// Print one trace's result (table or JSON line); returns whether the trace failed, or the error
/// writing to stdout.
fn print_trace_fit(s: &FitSettings, arg: &TraceArg, r: CliResult<TraceFit>) -> CliResult<bool> {
    let t = match r {
        Ok(t) => t,
        Err(e) => {
            if s.json {
                outln!(
                    "{}",
                    to_line(&LoadError {
                        trace: &arg.name(),
                        path: &arg.text(),
                        error: &e,
                    })
                )?;
            } else {
                errln!("torch-arena: {e}");
            }
            return Ok(true);
        }
    };
    let peak = peak_requested(&t);
    if s.json {
        outln!("{}", fit_json(s, &t, best_native(&t.fits)))?;
        return Ok(false);
    }
    outln!(
        "{}: {}, {} events; peak requested {}",
        t.info.name,
        source_name(t.info.source),
        fmt_count(t.info.events as u64),
        fmt_bytes(peak)
    )?;
    outln!(
        "  the smallest device on which {} with no out-of-memory (GPU lag {}), and the last step's cost there",
        match s.timing.repeat {
            1 => "one step runs".to_string(),
            n => format!("all {n} steps run"),
        },
        fmt_secs(s.timing.gpu_lag_ns as f64 / 1e9)
    )?;
    print_table(&fit_rows(&t.fits, peak))?;
    outln!("  (vs best native: bytes the setting needs less than the best native setting)")?;
    outln!()?;
    Ok(false)
}

/// The table of `fits` (header first): per allocator and setting, the minimum, its ratio to
/// `peak` requested, what it saves or needs beside the best native setting, and the last step's
/// cost there. `fit` and `demo` print it.
pub(crate) fn fit_rows(fits: &[Fit], peak: u64) -> Vec<Vec<String>> {
    let best = best_native(fits);
    let mut rows = vec![vec![
        "allocator".to_string(),
        "min capacity".into(),
        "x requested".into(),
        "vs best native".into(),
        "memory calls".into(),
        "driver time".into(),
        "stall".into(),
        "settings".into(),
    ]];
    for f in fits {
        let step = f.at_min.as_ref().map(|a| &a.last_step);
        rows.push(vec![
            f.allocator.to_string(),
            f.min_capacity.map_or("does not fit".into(), fmt_bytes),
            f.min_capacity.map_or("–".into(), |c| {
                format!("{:.3}", c as f64 / peak.max(1) as f64)
            }),
            match (f.min_capacity, best) {
                (Some(c), Some(b)) => signed_bytes(b as i64 - c as i64),
                (Some(_), None) => "native never fits".into(),
                _ => "–".into(),
            },
            step.map_or("–".into(), |st| fmt_count(st.calls.memory_calls())),
            step.map_or("–".into(), |st| fmt_secs(st.modelled_driver_s)),
            step.map_or("–".into(), |st| fmt_secs(st.modelled_stall_s)),
            conf_name(&f.conf).to_string(),
        ]);
    }
    rows
}

/// The arena under `conf` and native under its defaults and `expandable_segments:True` (and what
/// the trace recorded), fitted on `trace` with `timing`: what `demo` leads with.
pub(crate) fn fit_default_settings(
    trace: &Trace,
    conf: &(String, Config),
    timing: &Timing,
) -> CliResult<Vec<Fit>> {
    let s = FitSettings {
        confs: vec![conf.clone()],
        native_confs: DEFAULT_NATIVE_CONFS.iter().map(|c| c.to_string()).collect(),
        native_given: false,
        timing: timing.clone(),
        json: false,
        progress: false,
        jobs: 1,
        plot: None,
        curves: false,
    };
    allocators(&s, trace)
        .iter()
        .map(|a| fit_one(&s.timing, trace, a))
        .collect()
}

/// One allocator fitted on `trace` with `timing` (an arena setting's `driver_costs` file, if it
/// names one); errors name the allocator and setting.
fn fit_one(timing: &Timing, trace: &Trace, a: &Allocator) -> CliResult<Fit> {
    let timing = match a {
        Allocator::Arena { conf, .. } => timing_under(timing, conf)?,
        Allocator::Native { .. } => timing.clone(),
    };
    lib_fit::fit(trace, a, &timing, &mut |_| {})
        .map_err(|e| format!("{} {}: {e}", a.kind(), conf_name(a.label())))
}

/// `+1.25 GiB` less than the best native (saved), `-300.00 MiB` more, `0 B` the same.
fn signed_bytes(saved: i64) -> String {
    match saved {
        0 => "0 B".into(),
        s if s > 0 => format!("saves {}", fmt_bytes(s as u64)),
        s => format!("needs {} more", fmt_bytes(s.unsigned_abs())),
    }
}

/// One line of `fit --json` (see `fit --help`).
#[derive(Serialize)]
struct FitLine<'a> {
    trace: &'a str,
    path: &'a str,
    source: String,
    kind: &'a str,
    events: u64,
    peak_requested_bytes: u64,
    repeat: u64,
    gpu_lag_us: f64,
    best_native_bytes: Option<u64>,
    fit: Vec<FitJson<'a>>,
}

/// One allocator and setting fitted.
#[derive(Serialize)]
struct FitJson<'a> {
    allocator: &'a str,
    conf: &'a str,
    min_capacity_bytes: Option<u64>,
    ratio_to_requested: Option<f64>,
    saved_vs_best_native_bytes: Option<i64>,
    trials: u64,
    last_step: Option<LastStep>,
}

/// The last step at the minimum capacity.
#[derive(Serialize)]
struct LastStep {
    memory_driver_calls: u64,
    driver_calls: u64,
    driver_calls_by_kind: CallsByKind,
    modelled_driver_s: f64,
    modelled_stall_s: f64,
}

/// One trace's JSON line.
fn fit_json(s: &FitSettings, t: &TraceFit, best: Option<u64>) -> String {
    let peak = peak_requested(t);
    let fit = t
        .fits
        .iter()
        .map(|f| FitJson {
            allocator: f.allocator,
            conf: &f.conf,
            min_capacity_bytes: f.min_capacity,
            ratio_to_requested: f.min_capacity.map(|c| c as f64 / peak.max(1) as f64),
            saved_vs_best_native_bytes: f.min_capacity.zip(best).map(|(c, b)| b as i64 - c as i64),
            trials: f.trials as u64,
            last_step: f.at_min.as_ref().map(|a| LastStep {
                memory_driver_calls: a.last_step.calls.memory_calls(),
                driver_calls: a.last_step.calls.total(),
                driver_calls_by_kind: CallsByKind(a.last_step.calls),
                modelled_driver_s: a.last_step.modelled_driver_s,
                modelled_stall_s: a.last_step.modelled_stall_s,
            }),
        })
        .collect();
    to_line(&FitLine {
        trace: &t.info.name,
        path: &t.info.path,
        source: source_key(t.info.source),
        kind: t.info.kind.as_str(),
        events: t.info.events as u64,
        peak_requested_bytes: peak,
        repeat: u64::from(s.timing.repeat),
        gpu_lag_us: s.timing.gpu_lag_ns as f64 / 1e3,
        best_native_bytes: best,
        fit,
    })
}
