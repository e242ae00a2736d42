//! One trace replayed under every setting: the settings of a `replay` (or `demo`) run, what is
//! known of the trace, and its outcome (each setting's replay and each emulation of the native
//! allocator), which the tables, JSON lines and plots then show.

use torch_arena::device::DriverCounters;
use torch_arena::device::costs::DriverCosts;
use torch_arena_lab::live::LiveSet;
use torch_arena_lab::replay as lib_replay;

use crate::args::TraceArg;
use crate::out::CliResult;
use crate::progress::{ProgressBar, stderr_is_terminal, with_spinner};
use crate::usage::DEFAULT_CAPACITY;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use torch_arena::config::{Config, DeviceKind};
use torch_arena_lab::native::{NativeOptions, NativeResult};
use torch_arena_lab::replay::{DEFAULT_GPU_LAG_NS, Point, ReplayOptions, ReplayResult, Timing};
use torch_arena_lab::{Kind, Source, Trace, live, native, plot};

/// Points kept per series for a plot.
pub(crate) const PLOT_POINTS: usize = 1200;

/// The settings of one `replay` (or the `demo` replay).
pub(crate) struct ReplaySettings {
    pub(crate) capacity: u64,
    /// Each setting of the sweep: (the text as written, "" = defaults; the parsed settings).
    pub(crate) confs: Vec<(String, Config)>,
    /// `--native`: emulate the native allocator under the settings the trace recorded.
    pub(crate) native: bool,
    /// `--native-conf SETTINGS` (repeatable): one more emulation under each, in
    /// `PYTORCH_CUDA_ALLOC_CONF` syntax, after the recorded settings' (with `--native`).
    pub(crate) native_confs: Vec<String>,
    pub(crate) backing: bool,
    pub(crate) check: bool,
    pub(crate) json: bool,
    pub(crate) plot: Option<String>,
    pub(crate) progress: bool,
    /// Steps, GPU lag, driver costs (`--repeat`, `--gpu-lag`, `--driver-costs`).
    pub(crate) timing: Timing,
    /// `--live[=N]`: the N largest sites of what is live at the peak, or at the first
    /// out-of-memory (0 = not shown).
    pub(crate) live: usize,
}

impl ReplaySettings {
    pub(crate) fn new(progress: Option<bool>) -> Self {
        ReplaySettings {
            capacity: DEFAULT_CAPACITY,
            confs: Vec::new(),
            native: false,
            native_confs: Vec::new(),
            backing: false,
            check: false,
            json: false,
            plot: None,
            progress: progress.unwrap_or_else(stderr_is_terminal),
            timing: Timing {
                gpu_lag_ns: DEFAULT_GPU_LAG_NS,
                ..Timing::default()
            },
            live: 0,
        }
    }

    /// `--repeat N`, `--gpu-lag DURATION` and `--driver-costs FILE`, where given (the first two
    /// checked by their value parsers; the costs file is read here).
    pub(crate) fn set_timing(
        &mut self,
        repeat: Option<u32>,
        gpu_lag_ns: Option<u64>,
        driver_costs: Option<&str>,
    ) -> CliResult<()> {
        if let Some(n) = repeat {
            self.timing.repeat = n;
        }
        if let Some(ns) = gpu_lag_ns {
            self.timing.gpu_lag_ns = ns;
        }
        if let Some(path) = driver_costs {
            self.timing.costs = DriverCosts::load(Path::new(path))?;
        }
        Ok(())
    }

    /// The timing of a run under `conf`: the costs file of its `driver_costs` key, if any.
    pub(crate) fn timing_for(&self, conf: &Config) -> CliResult<Timing> {
        timing_under(&self.timing, conf)
    }

    /// Parse one `--conf`; `sim_capacity_mb` is refused (replay sets it from `--capacity`).
    pub(crate) fn add_conf(&mut self, text: &str) -> CliResult<()> {
        let conf = Config::parse(text).map_err(|e| format!("--conf '{text}': {e}"))?;
        if conf.sim_capacity_mb != Config::default().sim_capacity_mb {
            return Err(format!(
                "--conf '{text}': sim_capacity_mb is set by --capacity in a replay; \
                 give --capacity {}MiB instead",
                conf.sim_capacity_mb
            ));
        }
        self.confs.push((text.trim().to_string(), conf));
        Ok(())
    }

    /// The settings a replay runs with: device sim, the capacity, backing if asked.
    pub(crate) fn effective(&self, conf: &Config) -> Config {
        let mut c = conf.clone();
        c.device = DeviceKind::Sim;
        c.sim_capacity_mb = self.capacity.div_ceil(1 << 20);
        c.sim_backing |= self.backing;
        c
    }

    /// Check the plot file name before any work: its extension, and that its folder exists.
    pub(crate) fn check_plot(&self) -> CliResult<()> {
        let Some(p) = &self.plot else { return Ok(()) };
        check_plot_file(p, &PathBuf::from(p.replace("{trace}", "x")))
    }
}

/// `timing` with the costs file of `conf`'s `driver_costs` key, if it has one.
pub(crate) fn timing_under(timing: &Timing, conf: &Config) -> CliResult<Timing> {
    let mut t = timing.clone();
    if let Some(path) = &conf.driver_costs {
        t.costs = DriverCosts::load(Path::new(path))?;
    }
    Ok(t)
}

pub(crate) fn conf_name(label: &str) -> &str {
    if label.is_empty() { "defaults" } else { label }
}

/// What the report needs of a trace once it is dropped.
#[derive(Clone, Debug)]
pub(crate) struct TraceInfo {
    pub(crate) name: String,
    /// The argument as given (path or synthetic spec).
    pub(crate) path: String,
    pub(crate) source: Source,
    pub(crate) kind: Kind,
    pub(crate) device: i32,
    pub(crate) events: usize,
    pub(crate) seeded: usize,
    pub(crate) peak_requested: u64,
    /// The native allocator's peak reserved, as the trace recorded it.
    pub(crate) native_recorded: Option<u64>,
    /// The native allocator's segment allocations and frees the trace recorded, at least (a
    /// segment event per allocator event is kept; several between two events count once), as
    /// driver calls: cudaMalloc as `cuMemAlloc`, cudaFree as `cuMemFree`.
    pub(crate) native_recorded_calls: Option<DriverCounters>,
}

/// What the reports need of `trace`, loaded from `arg`.
pub(crate) fn trace_info(arg: &TraceArg, trace: &Trace) -> TraceInfo {
    TraceInfo {
        name: arg.name(),
        path: arg.text(),
        source: trace.source,
        kind: trace.kind,
        device: trace.device,
        events: trace.events.len(),
        seeded: trace.seeded,
        peak_requested: trace.peak_requested(),
        native_recorded: trace.native.as_ref().map(|n| n.peak),
        native_recorded_calls: recorded_calls(trace),
    }
}

/// The native allocator's recorded segment events as driver calls, with the bytes they reserved
/// and released (see `TraceInfo::native_recorded_calls`); `None` when the trace has none.
pub(crate) fn recorded_calls(trace: &Trace) -> Option<DriverCounters> {
    let n = trace.native.as_ref().filter(|n| !n.changes.is_empty())?;
    let mut c = DriverCounters::default();
    let mut prev = n.initial;
    for &(_, bytes) in &n.changes {
        if bytes > prev {
            c.mem_alloc += 1;
            c.mem_alloc_bytes += bytes - prev;
        } else if bytes < prev {
            c.mem_free += 1;
            c.mem_free_bytes += prev - bytes;
        }
        prev = bytes;
    }
    Some(c)
}

/// The native allocator emulated on a trace.
#[derive(Clone, Debug)]
pub(crate) struct Emulated {
    /// The `--native-conf` settings as given; `None` for `--native` (the recorded settings).
    pub(crate) conf: Option<String>,
    /// The emulation's result (its replay figures through `Deref`).
    pub(crate) result: NativeResult,
    pub(crate) elapsed: Duration,
    /// Size and stream of the event that ran out of memory.
    pub(crate) oom_request: Option<(u64, u64)>,
    /// Peak requested bytes over the events it ran (up to an out-of-memory).
    pub(crate) peak_requested: u64,
}

/// One replay of a trace under one setting.
#[derive(Clone, Debug)]
pub(crate) struct Run {
    pub(crate) label: String,
    pub(crate) effective: Config,
    pub(crate) outcome: Result<ReplayResult, String>,
}

/// Everything done to one trace.
#[derive(Clone, Debug)]
pub(crate) struct TraceOutcome {
    pub(crate) info: TraceInfo,
    pub(crate) recorded_series: Option<Vec<Point>>,
    /// The native emulations: `--native`'s first, then one per `--native-conf`.
    pub(crate) emulated: Vec<Emulated>,
    pub(crate) runs: Vec<Run>,
    /// With `--live`: what was live, by site, at the peak or where the arena ran out (the first
    /// setting that did), and which of the two.
    pub(crate) live: Option<(LiveSet, String)>,
}

impl TraceOutcome {
    pub(crate) fn arena_oom(&self) -> bool {
        self.runs
            .iter()
            .any(|r| matches!(&r.outcome, Ok(res) if res.oom.is_some()))
    }
}

/// Load (or generate) one trace and replay it under every setting.
pub(crate) fn replay_trace(s: &ReplaySettings, arg: &TraceArg) -> CliResult<TraceOutcome> {
    let name = arg.name();
    let verb = match arg {
        TraceArg::File(_) | TraceArg::Embedded(..) => "loading",
        TraceArg::Synth(..) => "generating",
    };
    let trace = with_spinner(s.progress, verb, &name, || arg.load())?;
    let info = trace_info(arg, &trace);
    let points = if s.plot.is_some() { PLOT_POINTS } else { 0 };
    let recorded_series = if points > 0 && trace.native.is_some() {
        native::recorded_series(&trace, points)
    } else {
        None
    };
    let mut emulated = Vec::new();
    if s.native {
        // Under the settings the trace was recorded with, where it says (snapshots of torch ≥ 2.5).
        let recorded = trace.native.as_ref();
        let opts = NativeOptions {
            max_split_size: recorded.and_then(|n| n.max_split_size),
            expandable_segments: recorded.is_some_and(|n| n.expandable_segments),
            series_points: points,
            ..NativeOptions::new(s.capacity)
        };
        emulated.push(emulate(s, &trace, &name, None, &opts)?);
    }
    for text in &s.native_confs {
        let source = format!("--native-conf '{text}'");
        let mut opts = NativeOptions::with_conf(s.capacity, &source, text)
            .map_err(|e| format!("{name}: {e}"))?;
        opts.series_points = points;
        emulated.push(emulate(s, &trace, &name, Some(text), &opts)?);
    }
    let runs = s
        .confs
        .iter()
        .map(|(label, conf)| {
            let effective = s.effective(conf);
            let timing = match s.timing_for(conf) {
                Ok(t) => t,
                Err(e) => {
                    return Run {
                        label: label.clone(),
                        effective,
                        outcome: Err(format!("{name}: --conf '{label}': {e}")),
                    };
                }
            };
            let opts = ReplayOptions {
                capacity: s.capacity,
                conf: effective.clone(),
                conf_label: label.clone(),
                backing: effective.sim_backing,
                check: s.check,
                consistency_every: 1,
                series_points: points,
                timing,
            };
            let bar_label = if s.confs.len() > 1 {
                format!("{name} [{}]", conf_name(label))
            } else {
                name.clone()
            };
            let mut bar = ProgressBar::new(s.progress, bar_label);
            let outcome =
                lib_replay::replay(&trace, &opts, &mut |done, total| bar.update(done, total))
                    .map_err(|e| format!("{name}: replay with --conf '{label}' failed: {e}"));
            drop(bar);
            Run {
                label: label.clone(),
                effective,
                outcome,
            }
        })
        .collect::<Vec<Run>>();
    let live = if s.live > 0 {
        let oom = runs.iter().find_map(|r| match &r.outcome {
            Ok(res) => res.oom.as_ref().map(|o| (o.event, r.label.clone())),
            Err(_) => None,
        });
        let (at, what) = match oom {
            Some((event, label)) => (
                live::At::Before(event),
                format!(
                    "at the out-of-memory of event {event} ({})",
                    conf_name(&label)
                ),
            ),
            None => (live::At::Peak, "at the peak of requested bytes".to_string()),
        };
        Some((
            live::live_at(&trace, at).map_err(|e| format!("{name}: --live: {e}"))?,
            what,
        ))
    } else {
        None
    };
    Ok(TraceOutcome {
        info,
        recorded_series,
        emulated,
        runs,
        live,
    })
}

/// The native allocator emulated on `trace` under `opts` (`conf`: the `--native-conf` text).
fn emulate(
    s: &ReplaySettings,
    trace: &Trace,
    name: &str,
    conf: Option<&String>,
    opts: &NativeOptions,
) -> CliResult<Emulated> {
    let start = Instant::now();
    let what = emulation_label(conf.map(String::as_str));
    let mut bar = ProgressBar::new(s.progress, format!("{name} [{what}]"));
    let result = native::simulate_timed(trace, opts, &s.timing, &mut |d, t| bar.update(d, t))
        .map_err(|e| format!("{name}: the native emulation ({what}) failed: {e}"))?;
    drop(bar);
    let elapsed = start.elapsed();
    let oom_request = result
        .oom_event
        .and_then(|i| trace.events.get(i))
        .map(|e| (e.size, e.stream));
    Ok(Emulated {
        conf: conf.cloned(),
        peak_requested: result.peak_requested,
        result,
        elapsed,
        oom_request,
    })
}

/// How an emulation is named: `native (emulated)` for `--native` (`conf` None), `native
/// (SETTINGS)` for a `--native-conf` (`native (defaults)` for an empty one).
fn emulation_label(conf: Option<&str>) -> String {
    match conf {
        None => "native (emulated)".to_string(),
        Some(c) => format!("native ({})", conf_name(c)),
    }
}

impl Emulated {
    /// Its row label in tables, legends and out-of-memory lines ([`emulation_label`]).
    pub(crate) fn label(&self) -> String {
        emulation_label(self.conf.as_deref())
    }
}

/// `--plot` as given (`given`, named in errors) and the file it would write (`path`), checked
/// before any work: an extension the plot module writes, and a folder that exists.
pub(crate) fn check_plot_file(given: &str, path: &Path) -> CliResult<()> {
    plot::Format::from_path(path).map_err(|e| format!("--plot: {e}"))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        return Err(format!(
            "--plot '{given}': the folder '{}' does not exist",
            dir.display()
        ));
    }
    Ok(())
}
