//! `torch-arena replay`: settings, one trace under every setting (and the native emulation),
//! tables, JSON lines and plot panels. `demo` reuses all of it.

use crate::*;

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

    /// `--repeat N`, `--gpu-lag DURATION` or `--driver-costs FILE`.
    pub(crate) fn timing_option(&mut self, name: &str, value: &str) -> CliResult<()> {
        match name {
            "--repeat" => {
                let n = parse_count("--repeat", value)?;
                if !(1..=1_000_000).contains(&n) {
                    return Err(format!(
                        "--repeat: '{value}' must be from 1 to 1000000 (passes over the trace)"
                    ));
                }
                self.timing.repeat = n as u32;
            }
            "--gpu-lag" => self.timing.gpu_lag_ns = parse_duration("--gpu-lag", value)?,
            _ => self.timing.costs = DriverCosts::load(Path::new(value))?,
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
        let path = PathBuf::from(p.replace("{trace}", "x"));
        plot::Format::from_path(&path).map_err(|e| format!("--plot: {e}"))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.is_dir()
        {
            return Err(format!(
                "--plot '{p}': the folder '{}' does not exist",
                dir.display()
            ));
        }
        Ok(())
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

pub(crate) fn replay_command(args: &[String]) -> CliResult<u8> {
    let mut cur = ArgCursor::new(args, "replay", REPLAY_SYNOPSIS, REPLAY_OPTIONS);
    let mut progress = None;
    let mut s = ReplaySettings::new(Some(false));
    let mut trace_texts = Vec::new();
    while let Some(item) = cur.next_item() {
        let (name, inline) = match item {
            Item::Positional(p) => {
                trace_texts.push(p);
                continue;
            }
            Item::Opt(n, v) => (n, v),
        };
        match name.as_str() {
            "--capacity" => s.capacity = parse_capacity(&cur.value(&name, inline)?)?,
            "--conf" => s.add_conf(&cur.value(&name, inline)?)?,
            "--native-conf" => s
                .native_confs
                .push(native_conf_arg(&cur.value(&name, inline)?)?),
            "--plot" => s.plot = Some(cur.value(&name, inline)?),
            "--repeat" | "--gpu-lag" | "--driver-costs" => {
                let v = cur.value(&name, inline)?;
                s.timing_option(&name, &v)?;
            }
            "--live" => {
                s.live = match inline {
                    None => LIVE_TOP,
                    Some(v) => match parse_count("--live", &v)? {
                        0 => return Err("--live: show at least 1 site (--live=N, N >= 1)".into()),
                        n => n.min(1 << 20) as usize,
                    },
                };
            }
            "--native" | "--backing" | "--check" | "--json" | "--progress" | "--no-progress" => {
                cur.flag(&name, inline)?;
                match name.as_str() {
                    "--native" => s.native = true,
                    "--backing" => s.backing = true,
                    "--check" => s.check = true,
                    "--json" => s.json = true,
                    "--progress" => progress = Some(true),
                    _ => progress = Some(false),
                }
            }
            "-h" | "--help" => return out!("{USAGE}").map(|()| 0),
            _ => return Err(cur.unknown(&name)),
        }
    }
    s.progress = progress.unwrap_or_else(stderr_is_terminal);
    if trace_texts.is_empty() {
        return Err(format!(
            "replay: no trace given (a file, or e.g. synth:rmm-random:10000:64MiB)\n{REPLAY_SYNOPSIS}"
        ));
    }
    if s.confs.is_empty() {
        s.confs.push((String::new(), Config::default()));
    }
    s.check_plot()?;
    // Every argument is checked before any replay starts: a typo in the last file name should
    // not cost the time of replaying the others first.
    let mut traces = Vec::new();
    let mut bad = Vec::new();
    for t in &trace_texts {
        match TraceArg::parse(t) {
            Ok(a) => traces.push(a),
            Err(e) => bad.push(e),
        }
    }
    if !bad.is_empty() {
        return Err(bad.join("\ntorch-arena: "));
    }
    run_replays(&s, &traces)
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
