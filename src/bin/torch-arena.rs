//! The `torch-arena` command: replay allocation traces through the arena on a simulated GPU and
//! compare it with PyTorch's native caching allocator.
//!
//! - `replay TRACE...`: load each trace (ours, a PyTorch snapshot, an RMM log, or a synthetic
//!   `synth:` spec), replay it under every `--conf`, optionally emulate the native allocator
//!   (`--native`), and print a table per trace (or JSON lines with `--json`), the report of any
//!   out-of-memory, and a plot (`--plot`).
//! - `synth KIND -o FILE`: write a synthetic trace.
//! - `demo`: replay the training-loop trace the project ships and explain the result;
//!   `demo --model` runs the modelled training loop directly (how that trace is recorded).
//!
//! Exit status: 0 when everything ran, 1 for bad usage, unreadable traces or unusable settings,
//! 2 when a replay ran out of memory.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use torch_arena::TorchArena;
use torch_arena::config::{Config, DeviceKind};
use torch_arena::device::DriverCounters;
use torch_arena::device::costs::DriverCosts;
use torch_arena::trace::native::{self, NativeOptions, NativeResult};
use torch_arena::trace::plot::{self, Line, Panel, Style};
use torch_arena::trace::replay::{
    self, DEFAULT_GPU_LAG_NS, OomReport, Point, ReplayOptions, ReplayResult, StepStats, Timing,
};
use torch_arena::trace::training::TrainingLoop;
use torch_arena::trace::{self as tr, Kind, Source, Trace, synth};

const USAGE: &str = "\
usage: torch-arena <command> [options]

Replays GPU allocation traces through torch-arena on a simulated GPU (no GPU needed) and
compares it with PyTorch's native caching allocator.

commands:
  replay TRACE... [options]   replay each trace under each setting; print per trace the peak
                              requested and reserved bytes, fragmentation, speed and driver
                              calls, and where memory ran out
  synth KIND [options] -o FILE
                              write a synthetic trace in torch-arena's trace format
  convert TRACE -o FILE       write any trace (a PyTorch snapshot, an RMM log, a synthetic
                              trace) in torch-arena's trace format (gzipped if FILE ends in .gz)
  demo [options]              replay the training-loop trace the project ships against the
                              emulated native allocator, and explain the result
  help                        this text (also -h, --help, and COMMAND --help)
  --version                   the version of torch-arena

TRACE is a file or a synthetic trace:
  FILE                        a torch-arena trace (.trace, .trace.gz), a PyTorch snapshot from
                              torch.cuda.memory._dump_snapshot (.pickle, .pickle.gz) or an RMM
                              logging_resource_adaptor CSV log; the format is read from the content
  synth:adversarial:CAPACITY  a trace on which the native allocator's policy runs out of memory
                              at CAPACITY while the arena fits
  synth:rmm-random:N:MAX[:SEED]
                              RMM's random-allocations benchmark: N allocations of sizes uniform
                              in [1, MAX], 73 % of steps allocate (SEED default 1)

replay options:
  --capacity SIZE   memory of the simulated GPU (default 80GiB)
  --conf CONF       arena settings in TORCH_ARENA_CONF syntax, e.g. stitch:False,page_size_mb:4;
                    repeat for a sweep: one replay per CONF (default: one, with the defaults).
                    The device is always the simulated one with --capacity (so no
                    sim_capacity_mb here)
  --native          also emulate PyTorch's native caching allocator on each trace, under the
                    expandable_segments and max_split_size the snapshot recorded (torch >= 2.5),
                    else PyTorch's defaults (no max_split_size, no expandable segments, 20 MiB
                    large segments). What the native allocator recorded in the trace itself
                    (PyTorch snapshots with segment events) is always shown
  --repeat N        replay each trace N times in a row, one step per pass: what is live at the
                    end of a pass stays live, what a pass allocates and frees is allocated and
                    freed again (default 1). Tables add a steady-state table (first and last step)
  --gpu-lag DURATION
                    GPU work finishes this long after the host queues it (0, 500us, 5ms; default
                    2ms, see BENCHMARKS.md): memory freed while earlier kernels still use it can
                    leave its stream only once they finish; a synchronising call that waits for
                    them is a host stall. The clock is the trace's timestamps, else 10 µs per
                    event. 0 replays as if the GPU finished everything at once
  --driver-costs FILE
                    latencies of the driver calls, one `NAME = MICROSECONDS` per line (e.g.
                    cuMemCreate = 7.6); unnamed calls keep the A100 defaults. The conf key
                    driver_costs:FILE does the same for one --conf of a sweep
  --backing         back the simulated pages with host memory and check every live
                    allocation's bytes (slow: for small traces)
  --check           after every event, check that the stats are exact and that no live
                    allocations overlap (slow)
  --json            print one JSON object per line per (trace, CONF) instead of tables:
                    trace, path, source, kind, device, events, seeded_events, capacity_bytes,
                    conf, conf_effective, backing, check, events_replayed,
                    peak_requested_bytes, peak_reserved_bytes, native_peak_reserved_bytes
                    (recorded in the trace), fragmentation (reserved / requested - 1),
                    oom_event, oom (the report: event, size_bytes, stream, live_bytes,
                    live_count, reserved_bytes, cached_bytes, message, largest_live),
                    native_emulated_peak_reserved_bytes, native_emulated_oom_event,
                    native_emulated_fragmentation, native_emulated_elapsed_s, elapsed_s,
                    ns_per_event, events_per_s, driver_calls, driver_calls_by_kind (CUDA driver
                    API name -> count; they add up to driver_calls), modelled_driver_s (calls
                    x latency), modelled_stall_s (host blocked waiting for the GPU), steps (one
                    object per step: driver_calls, driver_calls_by_kind, modelled_driver_s,
                    modelled_stall_s, peak_requested_bytes, peak_reserved_bytes), gpu_lag_us,
                    repeat, driver_costs (where the latencies came from), native_driver_calls,
                    native_driver_calls_by_kind, native_modelled_driver_s,
                    native_modelled_stall_s, native_driver_calls_from (emulated with --native,
                    else recorded: the snapshot's segment events, at least one call each),
                    native_steps (as steps, for the emulation), error; null where unknown. A
                    trace that cannot be read gets {trace, path, error}
  --plot FILE       draw requested and reserved bytes over each trace into FILE (.svg or .png):
                    one panel per trace, stacked in one image; with {trace} in FILE, one file
                    per trace, {trace} replaced by the trace's name
  --progress        show progress on stderr even when it is not a terminal
  --no-progress     never show progress (default: shown when stderr is a terminal)

synth:
  synth adversarial [--capacity SIZE] -o FILE        (default capacity 80GiB)
  synth rmm-random --n N --max SIZE [--seed S] -o FILE
                    -o, --output FILE: where to write it, in torch-arena's trace format;
                    `replay synth:...` replays the same trace without a file

demo options:
  (none)            replay the demo trace built into the command (traces/demo-train.trace.gz,
                    made by scripts/make-demo-trace; set TORCH_ARENA_DEMO_TRACE to use another
                    trace) with the native allocator emulated beside the arena
  --capacity SIZE, --conf CONF, --plot FILE, --gpu-lag DURATION, --driver-costs FILE,
  --progress, --no-progress
                    as for replay
  --repeat N        as for replay (default 3: the table shows steady-state calls per step
                    beside the native allocator's)
  --model [--steps N] [--conf CONF]
                    run the modelled training loop itself through the arena and print per-step
                    memory_stats figures and memory_summary (default 8 steps; CONF default
                    device:sim; add trace:PATH to record it). --steps implies --model

SIZE is a number and a unit: B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers
of 1000), e.g. 80GiB, 512MiB, 1.5GB.

exit status:
  0   everything ran and nothing ran out of memory
  1   bad usage, a trace that cannot be read, or a setting that cannot be used (the message
      names which); the other traces are still replayed
  2   an arena replay ran out of memory (its report says where; the other replays still
      ran). The emulated native allocator running out is a result, not a failure
";

const REPLAY_SYNOPSIS: &str = "usage: torch-arena replay TRACE... [--capacity SIZE] [--conf CONF]... \
[--repeat N] [--gpu-lag DURATION] [--driver-costs FILE] [--native] [--backing] [--check] [--json] [--plot FILE] [--progress | --no-progress]";
const SYNTH_SYNOPSIS: &str = "usage: torch-arena synth adversarial [--capacity SIZE] -o FILE\n       \
torch-arena synth rmm-random --n N --max SIZE [--seed S] -o FILE";
const CONVERT_SYNOPSIS: &str = "usage: torch-arena convert TRACE -o FILE";
const DEMO_SYNOPSIS: &str = "usage: torch-arena demo [--capacity SIZE] [--conf CONF] [--plot FILE] \
[--repeat N] [--gpu-lag DURATION] [--driver-costs FILE] [--progress | --no-progress]\n       torch-arena demo --model [--steps N] [--conf CONF]";

/// Exit status when a replay ran out of memory.
const EXIT_OOM: u8 = 2;
/// Default simulated capacity.
const DEFAULT_CAPACITY: u64 = 80 << 30;
/// Points kept per series for a plot.
const PLOT_POINTS: usize = 1200;
/// Default seed of `synth:rmm-random`.
const DEFAULT_SEED: u64 = 1;
/// Passes over the demo trace unless `--repeat` says otherwise.
const DEMO_REPEAT: u32 = 3;
/// Where the shipped demo trace lives, relative to the source tree.
const DEMO_TRACE_REL: &str = "traces/demo-train.trace.gz";
/// The demo trace, built into the command so that `torch-arena demo` works from an installed
/// wheel anywhere (`scripts/make-demo-trace` rewrites the file; rebuild to embed the new one).
const DEMO_TRACE: &[u8] = include_bytes!("../../traces/demo-train.trace.gz");
/// Its name in tables and plots.
const DEMO_TRACE_NAME: &str = "demo-train.trace.gz";

/// A failure: the message (without the `torch-arena: ` prefix), printed on stderr, exit 1.
type CliResult<T> = Result<T, String>;

fn main() -> ExitCode {
    // `torch-arena replay ... | head` should end quietly, as other commands do, rather than
    // panic on the closed pipe.
    // SAFETY: setting a signal's disposition to the default at start-up, before any thread.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("replay") => replay_command(&args[1..]),
        Some("synth") => synth_command(&args[1..]),
        Some("convert") => convert_command(&args[1..]),
        Some("demo") => demo_command(&args[1..]),
        None | Some("help" | "-h" | "--help") => {
            print!("{USAGE}");
            Ok(0)
        }
        Some("--version" | "-V" | "version") => {
            println!("torch-arena {}", env!("CARGO_PKG_VERSION"));
            Ok(0)
        }
        Some(other) => Err(format!(
            "unknown command '{other}'; commands: replay, synth, convert, demo, help\n\n{USAGE}"
        )),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("torch-arena: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Command-line parsing

/// One command-line item: an option (with a value given as `--opt=value`) or a positional.
enum Item {
    Opt(String, Option<String>),
    Positional(String),
}

/// A cursor over a command's arguments. `--opt value` and `--opt=value` both work; `--` ends the
/// options.
struct ArgCursor<'a> {
    args: &'a [String],
    pos: usize,
    only_positional: bool,
    /// The command, for messages ("replay").
    cmd: &'static str,
    synopsis: &'static str,
    /// The options of this command, for "did you mean" hints.
    known: &'static [&'static str],
}

impl<'a> ArgCursor<'a> {
    fn new(
        args: &'a [String],
        cmd: &'static str,
        synopsis: &'static str,
        known: &'static [&'static str],
    ) -> Self {
        ArgCursor {
            args,
            pos: 0,
            only_positional: false,
            cmd,
            synopsis,
            known,
        }
    }

    fn next_item(&mut self) -> Option<Item> {
        let a = self.args.get(self.pos)?.clone();
        self.pos += 1;
        if self.only_positional || a == "-" || !a.starts_with('-') {
            return Some(Item::Positional(a));
        }
        if a == "--" {
            self.only_positional = true;
            return self.next_item();
        }
        match a.split_once('=') {
            Some((name, value)) if name.starts_with("--") => {
                Some(Item::Opt(name.to_string(), Some(value.to_string())))
            }
            _ => Some(Item::Opt(a, None)),
        }
    }

    /// The value of option `name`: the `=value` part or the next argument.
    fn value(&mut self, name: &str, inline: Option<String>) -> CliResult<String> {
        if let Some(v) = inline {
            return Ok(v);
        }
        match self.args.get(self.pos) {
            Some(v) => {
                self.pos += 1;
                Ok(v.clone())
            }
            None => Err(format!(
                "{}: {name} needs a value\n{}",
                self.cmd, self.synopsis
            )),
        }
    }

    /// An option that takes no value must not have been given `=value`.
    fn flag(&self, name: &str, inline: Option<String>) -> CliResult<()> {
        match inline {
            None => Ok(()),
            Some(v) => Err(format!(
                "{}: {name} takes no value (given '{name}={v}')",
                self.cmd
            )),
        }
    }

    fn unknown(&self, name: &str) -> String {
        let hint = self
            .known
            .iter()
            .map(|k| (torch_arena::config::edit_distance(name, k), *k))
            .filter(|&(d, _)| d <= 2)
            .min_by_key(|&(d, _)| d)
            .map(|(_, k)| format!(" (did you mean '{k}'?)"))
            .unwrap_or_default();
        format!(
            "{}: unknown option '{name}'{hint}\n{}\n(torch-arena help: every option)",
            self.cmd, self.synopsis
        )
    }
}

const SIZE_FORMS: &str = "a number and a unit: B, KiB, MiB, GiB, TiB (powers of 1024) or \
KB, MB, GB, TB (powers of 1000), e.g. 80GiB, 512MiB, 1.5GB";

/// Parse a byte size such as `80GiB`, `512 MiB`, `1.5GB` (units case-insensitive), rounded to
/// whole bytes.
fn parse_size(text: &str) -> CliResult<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    let bad = |why: &str| format!("'{text}' is not a size{why}: expected {SIZE_FORMS}");
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1
    {
        return Err(bad(""));
    }
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "" => return Err(bad(" (no unit)")),
        _ => return Err(bad(&format!(" (unknown unit '{unit}')"))),
    };
    // Whole numbers exactly; fractions through f64 (exact to well below a byte at these sizes).
    let value = match num.parse::<u64>() {
        Ok(n) => n.checked_mul(mult),
        Err(_) => {
            let v = num.parse::<f64>().map_err(|_| bad(""))? * mult as f64;
            (v.is_finite() && v < u64::MAX as f64).then(|| v.round() as u64)
        }
    };
    value.ok_or_else(|| bad(" (too large)"))
}

fn parse_capacity(text: &str) -> CliResult<u64> {
    let c = parse_size(text).map_err(|e| format!("--capacity: {e}"))?;
    if c == 0 {
        return Err("--capacity: must be more than 0 bytes".into());
    }
    Ok(c)
}

/// A whole number, `_` allowed as a separator (`100_000`).
fn parse_count(what: &str, text: &str) -> CliResult<u64> {
    text.replace('_', "")
        .parse()
        .map_err(|_| format!("{what}: '{text}' is not a whole number"))
}

/// Parse a duration such as `0`, `500us`, `5ms`, `1.5s` into nanoseconds.
fn parse_duration(what: &str, text: &str) -> CliResult<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    let bad = || {
        format!(
            "{what}: '{text}' is not a duration: expected 0 or a number and a unit: ns, us (or \
             µs), ms, s, e.g. 500us, 5ms"
        )
    };
    let mult = match unit {
        "" if num.parse::<f64>() == Ok(0.0) => 1.0,
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return Err(bad()),
    };
    let v = num.parse::<f64>().map_err(|_| bad())? * mult;
    if !v.is_finite() || !(0.0..=3.6e12).contains(&v) {
        return Err(format!("{}; at most an hour", bad()));
    }
    Ok(v.round() as u64)
}

// ---------------------------------------------------------------------------------------------
// Traces named on the command line

/// A synthetic trace, as `synth:KIND:...` or the `synth` command describes it.
#[derive(Clone, Debug, PartialEq)]
enum SynthSpec {
    Adversarial { capacity: u64 },
    RmmRandom { n: u64, max: u64, seed: u64 },
}

const SYNTH_FORMS: &str = "synth:adversarial:CAPACITY or synth:rmm-random:N:MAX[:SEED] \
(e.g. synth:adversarial:16GiB, synth:rmm-random:10000:64MiB:7)";

impl SynthSpec {
    /// Parse `synth:adversarial:CAPACITY` or `synth:rmm-random:N:MAX[:SEED]`.
    fn parse(text: &str) -> CliResult<SynthSpec> {
        let parts: Vec<&str> = text.split(':').collect();
        let err = |why: String| format!("trace '{text}': {why}; accepted: {SYNTH_FORMS}");
        match parts.as_slice() {
            ["synth", "adversarial", cap] => {
                let capacity = parse_size(cap).map_err(err)?;
                if capacity == 0 {
                    return Err(err("the capacity must be more than 0".into()));
                }
                Ok(SynthSpec::Adversarial { capacity })
            }
            ["synth", "rmm-random", n, max, rest @ ..] if rest.len() <= 1 => {
                let n = parse_count("N", n).map_err(err)?;
                let max = parse_size(max).map_err(|e| err(format!("MAX: {e}")))?;
                let seed = match rest {
                    [s] => parse_count("SEED", s).map_err(err)?,
                    _ => DEFAULT_SEED,
                };
                SynthSpec::checked_rmm(n, max, seed).map_err(err)
            }
            ["synth", "adversarial" | "rmm-random", ..] => {
                Err(err("wrong number of ':' fields".into()))
            }
            ["synth", kind, ..] => Err(err(format!("unknown synthetic trace '{kind}'"))),
            _ => Err(err("not a synthetic trace".into())),
        }
    }

    fn checked_rmm(n: u64, max: u64, seed: u64) -> Result<SynthSpec, String> {
        if n == 0 {
            return Err("N must be at least 1".into());
        }
        if max == 0 {
            return Err("MAX must be at least 1 byte".into());
        }
        Ok(SynthSpec::RmmRandom { n, max, seed })
    }

    fn build(&self) -> Trace {
        match *self {
            SynthSpec::Adversarial { capacity } => synth::adversarial(capacity),
            SynthSpec::RmmRandom { n, max, seed } => synth::rmm_random(n as usize, max, seed),
        }
    }
}

/// A trace argument of `replay`.
#[derive(Clone, Debug)]
enum TraceArg {
    File(PathBuf),
    Synth(SynthSpec, String),
    /// A trace file's bytes built into the command, and its name (the demo trace).
    Embedded(&'static [u8], &'static str),
}

impl TraceArg {
    /// Check the argument before any work: a synthetic spec parses, a file exists and is a file.
    fn parse(text: &str) -> CliResult<TraceArg> {
        if text.starts_with("synth:") {
            return Ok(TraceArg::Synth(SynthSpec::parse(text)?, text.to_string()));
        }
        let path = PathBuf::from(text);
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => Err(format!(
                "cannot read trace '{text}': it is a directory (give the trace files in it)"
            )),
            Ok(_) => Ok(TraceArg::File(path)),
            Err(e) => Err(format!("cannot read trace '{text}': {e}")),
        }
    }

    /// The argument as given.
    fn text(&self) -> String {
        match self {
            TraceArg::File(p) => p.display().to_string(),
            TraceArg::Synth(_, t) => t.clone(),
            TraceArg::Embedded(_, name) => format!("(built in) {name}"),
        }
    }

    /// A short name for tables and plots: the file name, or the synthetic spec.
    fn name(&self) -> String {
        match self {
            TraceArg::File(p) => p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.display().to_string()),
            TraceArg::Synth(_, t) => t.clone(),
            TraceArg::Embedded(_, name) => name.to_string(),
        }
    }

    /// Load or generate the trace; errors name the file.
    fn load(&self) -> CliResult<Trace> {
        match self {
            TraceArg::Synth(spec, _) => Ok(spec.build()),
            TraceArg::Embedded(bytes, name) => {
                // The readers take a file: write the bytes to a private temporary one.
                let dir = std::env::temp_dir().join(format!(
                    "torch-arena-{}-{}",
                    std::process::id(),
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos())
                ));
                let file = dir.join(name);
                let loaded = std::fs::create_dir(&dir)
                    .and_then(|()| std::fs::write(&file, bytes))
                    .map_err(|e| format!("{name}: cannot write it to {}: {e}", dir.display()))
                    .and_then(|()| tr::load(&file).map_err(|e| format!("{name}: {e}")));
                let _ = std::fs::remove_dir_all(&dir);
                let mut t = loaded?;
                t.name = name.to_string();
                Ok(t)
            }
            TraceArg::File(p) => tr::load(p).map_err(|e| {
                let m = e.to_string();
                let shown = p.display().to_string();
                if m.contains(&shown) {
                    m
                } else {
                    format!("{shown}: {m}")
                }
            }),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Progress on stderr

/// Whether progress goes to stderr.
fn stderr_is_terminal() -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(2) == 1 }
}

/// A `\r`-redrawn progress line: trace name, bar, percent, events per second. Drawn only after
/// the work has taken a moment, at most ten times a second, and erased when dropped.
struct ProgressBar {
    enabled: bool,
    label: String,
    start: Instant,
    last: Option<Instant>,
    width: usize,
}

impl ProgressBar {
    fn new(enabled: bool, label: String) -> Self {
        ProgressBar {
            enabled,
            label: shorten(&label, 48),
            start: Instant::now(),
            last: None,
            width: 0,
        }
    }

    fn update(&mut self, done: usize, total: usize) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        let since_start = now - self.start;
        if since_start < Duration::from_millis(250)
            || self
                .last
                .is_some_and(|l| now - l < Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(now);
        let frac = if total == 0 {
            1.0
        } else {
            (done as f64 / total as f64).min(1.0)
        };
        const BAR: usize = 24;
        let filled = (frac * BAR as f64).round() as usize;
        let rate = done as f64 / since_start.as_secs_f64().max(1e-9);
        let line = format!(
            "{} [{}{}] {:>5.1} %  {} events/s",
            self.label,
            "#".repeat(filled),
            "-".repeat(BAR - filled),
            frac * 100.0,
            fmt_rate(rate)
        );
        let pad = self.width.saturating_sub(line.chars().count());
        self.width = self.width.max(line.chars().count());
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{line}{}", " ".repeat(pad));
        let _ = err.flush();
    }
}

impl Drop for ProgressBar {
    fn drop(&mut self) {
        if self.width > 0 {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{}\r", " ".repeat(self.width));
            let _ = err.flush();
        }
    }
}

/// Run `f`; if it takes longer than a moment and progress is on, show "`what` NAME… 1.2 s" on
/// stderr meanwhile (erased at the end).
fn with_spinner<T: Send>(enabled: bool, what: &str, name: &str, f: impl FnOnce() -> T) -> T {
    if !enabled {
        return f();
    }
    let (tx, rx) = mpsc::channel::<()>();
    let name = shorten(name, 60);
    std::thread::scope(|s| {
        s.spawn(move || {
            let start = Instant::now();
            let mut width = 0;
            while let Err(mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(Duration::from_millis(200))
            {
                if start.elapsed() < Duration::from_millis(400) {
                    continue;
                }
                let line = format!("{what} {name}… {:.1} s", start.elapsed().as_secs_f64());
                width = width.max(line.chars().count());
                let _ = write!(std::io::stderr(), "\r{line}");
                let _ = std::io::stderr().flush();
            }
            if width > 0 {
                let _ = write!(std::io::stderr(), "\r{}\r", " ".repeat(width));
                let _ = std::io::stderr().flush();
            }
        });
        let out = f();
        drop(tx);
        out
    })
}

fn shorten(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let tail: String = s.chars().skip(n - (max - 1)).collect();
    format!("…{tail}")
}

// ---------------------------------------------------------------------------------------------
// Formatting

fn fmt_bytes(b: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (u, name) in UNITS {
        if b >= u {
            return format!("{:.2} {name}", b as f64 / u as f64);
        }
    }
    format!("{b} B")
}

/// 1234567 -> "1,234,567".
fn fmt_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn fmt_rate(per_s: f64) -> String {
    if per_s >= 1e6 {
        format!("{:.2}M", per_s / 1e6)
    } else if per_s >= 1e3 {
        format!("{:.1}k", per_s / 1e3)
    } else {
        format!("{per_s:.0}")
    }
}

/// Seconds as `0 s`, `12.3 µs`, `4.56 ms`, `1.23 s`.
fn fmt_secs(s: f64) -> String {
    if s == 0.0 {
        "0 s".into()
    } else if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{s:.2} s")
    }
}

fn fmt_ns(ns: f64) -> String {
    if !ns.is_finite() {
        "–".into()
    } else if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{:.1} ms", ns / 1e6)
    }
}

/// `reserved / requested - 1` as a percentage ("–" when nothing was requested).
fn fragmentation(reserved: u64, requested: u64) -> f64 {
    if requested == 0 {
        f64::NAN
    } else {
        reserved as f64 / requested as f64 - 1.0
    }
}

fn fmt_frag(f: f64) -> String {
    if f.is_finite() {
        format!("{:.1} %", f * 100.0)
    } else {
        "–".into()
    }
}

fn source_name(s: Source) -> String {
    match s {
        Source::Arena(v) => format!("torch-arena trace v{v}"),
        Source::TorchSnapshot => "PyTorch snapshot".into(),
        Source::RmmCsv => "RMM log".into(),
        Source::Synthetic => "synthetic".into(),
    }
}

fn source_key(s: Source) -> String {
    match s {
        Source::Arena(v) => format!("arena-v{v}"),
        Source::TorchSnapshot => "torch-snapshot".into(),
        Source::RmmCsv => "rmm-csv".into(),
        Source::Synthetic => "synthetic".into(),
    }
}

/// Break `text` into lines of at most `width` characters, at ASCII spaces only: a no-break space
/// (U+00A0) holds a figure and its unit together and is printed as a plain space.
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut col = 0;
    for word in text.split([' ', '\n']).filter(|w| !w.is_empty()) {
        let len = word.chars().count();
        if col > 0 && col + 1 + len > width {
            out.push('\n');
            col = 0;
        } else if col > 0 {
            out.push(' ');
            col += 1;
        }
        out.push_str(&word.replace('\u{a0}', " "));
        col += len;
    }
    out
}

/// `s` with its spaces made no-break, for [`wrap`].
fn nb(s: String) -> String {
    s.replace(' ', "\u{a0}")
}

/// Print `rows` as a table: first row the header, first column left-aligned, the others
/// right-aligned except the last (a free-text note).
fn print_table(rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let mut line = String::from("  ");
        for (c, cell) in row.iter().enumerate() {
            let pad = widths[c] - cell.chars().count();
            if c == 0 || c == cols - 1 {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
            line.push_str("  ");
        }
        println!("{}", line.trim_end());
        if i == 0 {
            let total: usize = widths.iter().sum::<usize>() + 2 * cols;
            println!("  {}", "-".repeat(total.saturating_sub(2)));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// JSON, written by hand

/// `s` as a JSON string literal, quotes included (the library's one escaper).
fn json_string(s: &str) -> String {
    torch_arena::track::json::string(s)
}

/// A JSON object built field by field, in order.
struct JsonObject(String);

impl JsonObject {
    fn new() -> Self {
        JsonObject(String::from("{"))
    }

    fn raw(&mut self, key: &str, value: &str) -> &mut Self {
        if self.0.len() > 1 {
            self.0.push_str(", ");
        }
        self.0.push_str(&json_string(key));
        self.0.push_str(": ");
        self.0.push_str(value);
        self
    }

    fn str(&mut self, key: &str, value: &str) -> &mut Self {
        self.raw(key, &json_string(value))
    }

    fn num(&mut self, key: &str, value: u64) -> &mut Self {
        self.raw(key, &value.to_string())
    }

    fn opt_num(&mut self, key: &str, value: Option<u64>) -> &mut Self {
        match value {
            Some(v) => self.num(key, v),
            None => self.raw(key, "null"),
        }
    }

    /// A float; `null` when not finite (JSON has no NaN or infinity).
    fn float(&mut self, key: &str, value: f64) -> &mut Self {
        if value.is_finite() {
            self.raw(key, &format!("{value}"))
        } else {
            self.raw(key, "null")
        }
    }

    fn opt_float(&mut self, key: &str, value: Option<f64>) -> &mut Self {
        self.float(key, value.unwrap_or(f64::NAN))
    }

    fn bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.raw(key, if value { "true" } else { "false" })
    }

    fn finish(&mut self) -> String {
        let mut s = std::mem::take(&mut self.0);
        s.push('}');
        s
    }
}

/// Driver calls by kind as a JSON object: CUDA driver API name → count.
fn calls_json(c: &DriverCounters) -> String {
    let mut j = JsonObject::new();
    for (name, n) in c.entries() {
        j.num(name, n);
    }
    j.finish()
}

/// Steps as a JSON array (see `--json`).
fn steps_json(steps: &[StepStats]) -> String {
    let items: Vec<String> = steps
        .iter()
        .map(|st| {
            JsonObject::new()
                .num("driver_calls", st.calls.total())
                .raw("driver_calls_by_kind", &calls_json(&st.calls))
                .float("modelled_driver_s", st.modelled_driver_s)
                .float("modelled_stall_s", st.modelled_stall_s)
                .num("peak_requested_bytes", st.peak_requested)
                .num("peak_reserved_bytes", st.peak_reserved)
                .finish()
        })
        .collect();
    format!("[{}]", items.join(", "))
}

fn oom_json(o: &OomReport) -> String {
    let largest: Vec<String> = o
        .largest_live
        .iter()
        .map(|(bytes, site)| {
            JsonObject::new()
                .num("bytes", *bytes)
                .str("site", site)
                .finish()
        })
        .collect();
    JsonObject::new()
        .num("event", o.event as u64)
        .num("size_bytes", o.size)
        .num("stream", o.stream)
        .num("live_bytes", o.live_bytes)
        .num("live_count", o.live_count)
        .num("reserved_bytes", o.reserved)
        .num("cached_bytes", o.cached)
        .str("message", &o.message)
        .raw("largest_live", &format!("[{}]", largest.join(", ")))
        .finish()
}

// ---------------------------------------------------------------------------------------------
// Replay

/// The settings of one `replay` (or the `demo` replay).
struct ReplaySettings {
    capacity: u64,
    /// Each setting of the sweep: (the text as written, "" = defaults; the parsed settings).
    confs: Vec<(String, Config)>,
    native: bool,
    backing: bool,
    check: bool,
    json: bool,
    plot: Option<String>,
    progress: bool,
    /// Steps, GPU lag, driver costs (`--repeat`, `--gpu-lag`, `--driver-costs`).
    timing: Timing,
}

impl ReplaySettings {
    fn new(progress: Option<bool>) -> Self {
        ReplaySettings {
            capacity: DEFAULT_CAPACITY,
            confs: Vec::new(),
            native: false,
            backing: false,
            check: false,
            json: false,
            plot: None,
            progress: progress.unwrap_or_else(stderr_is_terminal),
            timing: Timing {
                gpu_lag_ns: DEFAULT_GPU_LAG_NS,
                ..Timing::default()
            },
        }
    }

    /// `--repeat N`, `--gpu-lag DURATION` or `--driver-costs FILE`.
    fn timing_option(&mut self, name: &str, value: &str) -> CliResult<()> {
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
    fn timing_for(&self, conf: &Config) -> CliResult<Timing> {
        let mut t = self.timing.clone();
        if let Some(path) = &conf.driver_costs {
            t.costs = DriverCosts::load(Path::new(path))?;
        }
        Ok(t)
    }

    /// Parse one `--conf`; `sim_capacity_mb` is refused (replay sets it from `--capacity`).
    fn add_conf(&mut self, text: &str) -> CliResult<()> {
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
    fn effective(&self, conf: &Config) -> Config {
        let mut c = conf.clone();
        c.device = DeviceKind::Sim;
        c.sim_capacity_mb = self.capacity.div_ceil(1 << 20);
        c.sim_backing |= self.backing;
        c
    }

    /// Check the plot file name before any work: its extension, and that its folder exists.
    fn check_plot(&self) -> CliResult<()> {
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

fn conf_name(label: &str) -> &str {
    if label.is_empty() { "defaults" } else { label }
}

/// What the report needs of a trace once it is dropped.
#[derive(Clone, Debug)]
struct TraceInfo {
    name: String,
    /// The argument as given (path or synthetic spec).
    path: String,
    source: Source,
    kind: Kind,
    device: i32,
    events: usize,
    seeded: usize,
    peak_requested: u64,
    /// The native allocator's peak reserved, as the trace recorded it.
    native_recorded: Option<u64>,
    /// The native allocator's segment allocations and frees the trace recorded, at least (a
    /// segment event per allocator event is kept; several between two events count once), as
    /// driver calls: cudaMalloc as `cuMemAlloc`, cudaFree as `cuMemFree`.
    native_recorded_calls: Option<DriverCounters>,
}

/// The native allocator's recorded segment events as driver calls (see
/// `TraceInfo::native_recorded_calls`); `None` when the trace has none.
fn recorded_calls(trace: &Trace) -> Option<DriverCounters> {
    let n = trace.native.as_ref().filter(|n| !n.changes.is_empty())?;
    let mut c = DriverCounters::default();
    let mut prev = n.initial;
    for &(_, bytes) in &n.changes {
        if bytes > prev {
            c.mem_alloc += 1;
        } else if bytes < prev {
            c.mem_free += 1;
        }
        prev = bytes;
    }
    Some(c)
}

/// The native allocator emulated on a trace.
#[derive(Clone, Debug)]
struct Emulated {
    /// The emulation's result (its replay figures through `Deref`).
    result: NativeResult,
    elapsed: Duration,
    /// Size and stream of the event that ran out of memory.
    oom_request: Option<(u64, u64)>,
    /// Peak requested bytes over the events it ran (up to an out-of-memory).
    peak_requested: u64,
}

/// One replay of a trace under one setting.
#[derive(Clone, Debug)]
struct Run {
    label: String,
    effective: Config,
    outcome: Result<ReplayResult, String>,
}

/// Everything done to one trace.
#[derive(Clone, Debug)]
struct TraceOutcome {
    info: TraceInfo,
    recorded_series: Option<Vec<Point>>,
    emulated: Option<Emulated>,
    runs: Vec<Run>,
}

impl TraceOutcome {
    fn arena_oom(&self) -> bool {
        self.runs
            .iter()
            .any(|r| matches!(&r.outcome, Ok(res) if res.oom.is_some()))
    }
}

/// Load (or generate) one trace and replay it under every setting.
fn replay_trace(s: &ReplaySettings, arg: &TraceArg) -> CliResult<TraceOutcome> {
    let name = arg.name();
    let verb = match arg {
        TraceArg::File(_) | TraceArg::Embedded(..) => "loading",
        TraceArg::Synth(..) => "generating",
    };
    let trace = with_spinner(s.progress, verb, &name, || arg.load())?;
    let info = TraceInfo {
        name: name.clone(),
        path: arg.text(),
        source: trace.source,
        kind: trace.kind,
        device: trace.device,
        events: trace.events.len(),
        seeded: trace.seeded,
        peak_requested: trace.peak_requested(),
        native_recorded: trace.native.as_ref().map(|n| n.peak),
        native_recorded_calls: recorded_calls(&trace),
    };
    let points = if s.plot.is_some() { PLOT_POINTS } else { 0 };
    let recorded_series = if points > 0 && trace.native.is_some() {
        native::recorded_series(&trace, points)
    } else {
        None
    };
    let emulated = if s.native {
        // Under the settings the trace was recorded with, where it says (snapshots of torch ≥ 2.5).
        let recorded = trace.native.as_ref();
        let opts = NativeOptions {
            max_split_size: recorded.and_then(|n| n.max_split_size),
            expandable_segments: recorded.is_some_and(|n| n.expandable_segments),
            series_points: points,
            ..NativeOptions::new(s.capacity)
        };
        let start = Instant::now();
        let mut bar = ProgressBar::new(s.progress, format!("{name} [native, emulated]"));
        let result = native::simulate_timed(&trace, &opts, &s.timing, &mut |d, t| bar.update(d, t))
            .map_err(|e| format!("{name}: the native emulation failed: {e}"))?;
        drop(bar);
        let elapsed = start.elapsed();
        let oom_request = result
            .oom_event
            .and_then(|i| trace.events.get(i))
            .map(|e| (e.size, e.stream));
        Some(Emulated {
            peak_requested: result.peak_requested,
            result,
            elapsed,
            oom_request,
        })
    } else {
        None
    };
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
            let outcome = replay::replay(&trace, &opts, &mut |done, total| bar.update(done, total))
                .map_err(|e| format!("{name}: replay with --conf '{label}' failed: {e}"));
            drop(bar);
            Run {
                label: label.clone(),
                effective,
                outcome,
            }
        })
        .collect();
    Ok(TraceOutcome {
        info,
        recorded_series,
        emulated,
        runs,
    })
}

/// The table of one trace, the out-of-memory reports and notes on the trace's kind.
fn print_outcome(s: &ReplaySettings, o: &TraceOutcome) {
    let i = &o.info;
    let seeded = if i.seeded > 0 {
        format!(
            " ({} seeding what was live before it began)",
            fmt_count(i.seeded as u64)
        )
    } else {
        String::new()
    };
    println!(
        "{}: {}, {} trace, {} events{seeded}, device {}; simulated GPU of {}",
        i.name,
        source_name(i.source),
        i.kind.as_str(),
        fmt_count(i.events as u64),
        i.device,
        fmt_bytes(s.capacity)
    );
    println!("  {}", timing_line(&s.timing));
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
    if let Some(e) = &o.emulated {
        let r = &e.result;
        rows.push(vec![
            "native (emulated)".into(),
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
    print_table(&rows);
    if s.timing.repeat > 1 {
        print_steady_state(o);
    }
    if let Some(e) = &o.emulated
        && let Some(n) = e.result.oom_event
    {
        let what = e
            .oom_request
            .map(|(size, stream)| format!(": allocating {} on stream {stream}", fmt_bytes(size)))
            .unwrap_or_default();
        println!();
        println!(
            "  native (emulated) ran out of memory at event {} of {}{what}",
            fmt_count(n as u64),
            fmt_count(i.events as u64)
        );
    }
    for run in &o.runs {
        match &run.outcome {
            Ok(r) => {
                if let Some(oom) = &r.oom {
                    println!();
                    print_oom(&format!("arena ({})", conf_name(&run.label)), i, oom);
                }
            }
            Err(e) => eprintln!("torch-arena: {e}"),
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
        println!();
        for line in wrap(&format!("note: {n}"), 94).lines() {
            println!("  {line}");
        }
    }
    println!();
}

/// The settings of the timing model, in one line.
fn timing_line(t: &Timing) -> String {
    format!(
        "{} step{} of the trace; GPU lag {}; driver calls priced at {}",
        t.repeat,
        if t.repeat == 1 { "" } else { "s" },
        fmt_secs(t.gpu_lag_ns as f64 / 1e9),
        t.costs.source
    )
}

/// Per allocator: memory driver calls and modelled driver time in the last step, beside the first.
fn print_steady_state(o: &TraceOutcome) {
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
    if let Some(e) = &o.emulated {
        row("native (emulated)".into(), &e.result.steps);
    }
    for run in &o.runs {
        if let Ok(r) = &run.outcome {
            row(format!("arena ({})", conf_name(&run.label)), &r.steps);
        }
    }
    println!();
    println!(
        "  steady state (memory calls: create, map, set access, unmap, release, reserve, alloc, free):"
    );
    print_table(&rows);
}

/// The report of an arena out-of-memory: the failing request, what was live, what was cached.
fn print_oom(who: &str, i: &TraceInfo, o: &OomReport) {
    println!(
        "  {who} ran out of memory at event {} of {}: allocating {} on stream {}",
        fmt_count(o.event as u64),
        fmt_count(i.events as u64),
        fmt_bytes(o.size),
        o.stream
    );
    println!(
        "    live:     {} in {} allocations",
        fmt_bytes(o.live_bytes),
        fmt_count(o.live_count)
    );
    println!(
        "    reserved: {}, of which cached (reserved, not allocated): {}",
        fmt_bytes(o.reserved),
        fmt_bytes(o.cached)
    );
    if !o.largest_live.is_empty() {
        println!("    largest live allocations:");
        for (bytes, site) in &o.largest_live {
            let site = if site.is_empty() {
                "(unknown site)"
            } else {
                site
            };
            println!("      {:>12}  {site}", fmt_bytes(*bytes));
        }
    }
    let mut lines = o.message.lines();
    if let Some(first) = lines.next() {
        println!("    arena: {first}");
        for l in lines {
            println!("           {l}");
        }
    }
}

/// One JSON object per setting of the trace (see the field list in the report of `--json`).
fn json_lines(s: &ReplaySettings, o: &TraceOutcome) -> Vec<String> {
    let i = &o.info;
    o.runs
        .iter()
        .map(|run| {
            let mut j = JsonObject::new();
            j.str("trace", &i.name)
                .str("path", &i.path)
                .str("source", &source_key(i.source))
                .str("kind", i.kind.as_str())
                .raw("device", &i.device.to_string())
                .num("events", i.events as u64)
                .num("seeded_events", i.seeded as u64)
                .num("capacity_bytes", s.capacity)
                .str("conf", &run.label)
                .str("conf_effective", &run.effective.to_string())
                .bool("backing", run.effective.sim_backing)
                .bool("check", s.check);
            match &run.outcome {
                Ok(r) => {
                    j.num("events_replayed", r.events as u64)
                        .num("peak_requested_bytes", r.peak_requested)
                        .num("peak_reserved_bytes", r.peak_reserved)
                        .opt_num(
                            "native_peak_reserved_bytes",
                            r.native_peak_reserved.or(i.native_recorded),
                        )
                        .float("fragmentation", r.fragmentation)
                        .opt_num("oom_event", r.oom.as_ref().map(|o| o.event as u64))
                        .raw(
                            "oom",
                            &r.oom
                                .as_ref()
                                .map(oom_json)
                                .unwrap_or_else(|| "null".into()),
                        );
                }
                Err(_) => {
                    j.raw("events_replayed", "null")
                        .raw("peak_requested_bytes", "null")
                        .raw("peak_reserved_bytes", "null")
                        .opt_num("native_peak_reserved_bytes", i.native_recorded)
                        .raw("fragmentation", "null")
                        .raw("oom_event", "null")
                        .raw("oom", "null");
                }
            }
            let em = o.emulated.as_ref();
            j.opt_num(
                "native_emulated_peak_reserved_bytes",
                em.map(|e| e.result.peak_reserved),
            )
            .opt_num(
                "native_emulated_oom_event",
                em.and_then(|e| e.result.oom_event.map(|n| n as u64)),
            )
            .opt_float(
                "native_emulated_fragmentation",
                em.map(|e| fragmentation(e.result.peak_reserved, e.peak_requested)),
            )
            .opt_float(
                "native_emulated_elapsed_s",
                em.map(|e| e.elapsed.as_secs_f64()),
            );
            match &run.outcome {
                Ok(r) => {
                    let secs = r.elapsed.as_secs_f64();
                    j.float("elapsed_s", secs)
                        .float("ns_per_event", secs * 1e9 / r.events.max(1) as f64)
                        .float(
                            "events_per_s",
                            if secs > 0.0 {
                                r.events as f64 / secs
                            } else {
                                f64::NAN
                            },
                        )
                        .num("driver_calls", r.driver_calls)
                        .raw("driver_calls_by_kind", &calls_json(&r.calls))
                        .float("modelled_driver_s", r.modelled_driver_s)
                        .float("modelled_stall_s", r.modelled_stall_s)
                        .raw("steps", &steps_json(&r.steps));
                }
                Err(_) => {
                    j.raw("elapsed_s", "null")
                        .raw("ns_per_event", "null")
                        .raw("events_per_s", "null")
                        .raw("driver_calls", "null")
                        .raw("driver_calls_by_kind", "null")
                        .raw("modelled_driver_s", "null")
                        .raw("modelled_stall_s", "null")
                        .raw("steps", "null");
                }
            }
            let t = &s.timing;
            j.float("gpu_lag_us", t.gpu_lag_ns as f64 / 1e3)
                .num("repeat", u64::from(t.repeat))
                .str("driver_costs", &t.costs.source);
            // The native allocator's calls: emulated where it ran, else the recorded segment
            // events (one step: the trace's own).
            let recorded = i.native_recorded_calls;
            let native_calls = em.map(|e| e.result.calls).or(recorded);
            j.opt_num("native_driver_calls", native_calls.map(|c| c.total()))
                .raw(
                    "native_driver_calls_by_kind",
                    &native_calls.map_or_else(|| "null".into(), |c| calls_json(&c)),
                )
                .opt_float(
                    "native_modelled_driver_s",
                    em.map(|e| e.result.modelled_driver_s)
                        .or(recorded.map(|c| t.costs.seconds(&c))),
                )
                .opt_float(
                    "native_modelled_stall_s",
                    em.map(|e| e.result.modelled_stall_s),
                )
                .str(
                    "native_driver_calls_from",
                    match (em, recorded) {
                        (Some(_), _) => "emulated",
                        (None, Some(_)) => "recorded",
                        (None, None) => "",
                    },
                )
                .raw(
                    "native_steps",
                    &em.map_or_else(|| "null".into(), |e| steps_json(&e.result.steps)),
                );
            match &run.outcome {
                Ok(_) => j.raw("error", "null"),
                Err(e) => j.str("error", e),
            };
            j.finish()
        })
        .collect()
}

/// The JSON line of a trace that could not be loaded.
fn json_load_error(arg: &TraceArg, error: &str) -> String {
    JsonObject::new()
        .str("trace", &arg.name())
        .str("path", &arg.text())
        .str("error", error)
        .finish()
}

/// The plot panel of one trace: requested bytes once, then each allocator's reserved bytes.
fn panel(s: &ReplaySettings, o: &TraceOutcome) -> Panel {
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
        .chain(o.emulated.as_ref().map(|e| &e.result.series))
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
    if let Some(e) = &o.emulated {
        lines.push(Line {
            label: "native (emulated) reserved".into(),
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
    Panel {
        title: format!(
            "{}: {} {}, {} events, GPU {}",
            i.name,
            i.kind.as_str(),
            source_name(i.source),
            fmt_count(i.events as u64),
            fmt_bytes(s.capacity)
        ),
        events: i.events as u64,
        lines,
    }
}

/// `{trace}` in a plot file name replaced by the trace's name, made safe for a file name.
fn plot_path_for(pattern: &str, trace_name: &str) -> PathBuf {
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

fn write_plot(path: &Path, panels: &[Panel]) -> CliResult<()> {
    plot::write(path, panels).map_err(|e| e.to_string())?;
    eprintln!("torch-arena: plot written to {}", path.display());
    Ok(())
}

const REPLAY_OPTIONS: &[&str] = &[
    "--capacity",
    "--conf",
    "--repeat",
    "--gpu-lag",
    "--driver-costs",
    "--native",
    "--backing",
    "--check",
    "--json",
    "--plot",
    "--progress",
    "--no-progress",
    "--help",
];

fn replay_command(args: &[String]) -> CliResult<u8> {
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
            "--plot" => s.plot = Some(cur.value(&name, inline)?),
            "--repeat" | "--gpu-lag" | "--driver-costs" => {
                let v = cur.value(&name, inline)?;
                s.timing_option(&name, &v)?;
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
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(0);
            }
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
fn run_replays(s: &ReplaySettings, traces: &[TraceArg]) -> CliResult<u8> {
    let mut failed = false;
    let mut oom = false;
    let mut panels = Vec::new();
    let per_trace_plot = s.plot.as_deref().filter(|p| p.contains("{trace}"));
    for arg in traces {
        match replay_trace(s, arg) {
            Ok(o) => {
                if s.json {
                    for line in json_lines(s, &o) {
                        println!("{line}");
                    }
                    for run in &o.runs {
                        if let Err(e) = &run.outcome {
                            eprintln!("torch-arena: {e}");
                        }
                    }
                } else {
                    print_outcome(s, &o);
                }
                failed |= o.runs.iter().any(|r| r.outcome.is_err());
                oom |= o.arena_oom();
                if s.plot.is_some() {
                    let p = panel(s, &o);
                    if let Some(pattern) = per_trace_plot {
                        if let Err(e) = write_plot(&plot_path_for(pattern, &o.info.name), &[p]) {
                            eprintln!("torch-arena: {e}");
                            failed = true;
                        }
                    } else {
                        panels.push(p);
                    }
                }
            }
            Err(e) => {
                eprintln!("torch-arena: {e}");
                if s.json {
                    println!("{}", json_load_error(arg, &e));
                }
                failed = true;
            }
        }
    }
    if let Some(p) = &s.plot
        && per_trace_plot.is_none()
        && !panels.is_empty()
        && let Err(e) = write_plot(Path::new(p), &panels)
    {
        eprintln!("torch-arena: {e}");
        failed = true;
    }
    Ok(if failed {
        1
    } else if oom {
        EXIT_OOM
    } else {
        0
    })
}

// ---------------------------------------------------------------------------------------------
// synth

const SYNTH_OPTIONS: &[&str] = &[
    "--capacity",
    "--n",
    "--max",
    "--seed",
    "--output",
    "-o",
    "--help",
];

fn synth_command(args: &[String]) -> CliResult<u8> {
    let mut cur = ArgCursor::new(args, "synth", SYNTH_SYNOPSIS, SYNTH_OPTIONS);
    let mut kind: Option<String> = None;
    let (mut capacity, mut n, mut max, mut seed, mut out) = (None, None, None, None, None);
    while let Some(item) = cur.next_item() {
        let (name, inline) = match item {
            Item::Positional(p) if kind.is_none() => {
                kind = Some(p);
                continue;
            }
            Item::Positional(p) => {
                return Err(format!(
                    "synth: unexpected argument '{p}' (one KIND only)\n{SYNTH_SYNOPSIS}"
                ));
            }
            Item::Opt(n, v) => (n, v),
        };
        match name.as_str() {
            "--capacity" => capacity = Some(parse_capacity(&cur.value(&name, inline)?)?),
            "--n" => n = Some(parse_count("--n", &cur.value(&name, inline)?)?),
            "--max" => {
                max = Some(
                    parse_size(&cur.value(&name, inline)?).map_err(|e| format!("--max: {e}"))?,
                )
            }
            "--seed" => seed = Some(parse_count("--seed", &cur.value(&name, inline)?)?),
            "-o" | "--output" => out = Some(PathBuf::from(cur.value(&name, inline)?)),
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(0);
            }
            _ => return Err(cur.unknown(&name)),
        }
    }
    let Some(kind) = kind else {
        return Err(format!(
            "synth: which trace? KIND is adversarial or rmm-random\n{SYNTH_SYNOPSIS}"
        ));
    };
    let spec = match kind.as_str() {
        "adversarial" => {
            if n.is_some() || max.is_some() || seed.is_some() {
                return Err("synth adversarial takes --capacity only (--n, --max and --seed are for rmm-random)".into());
            }
            SynthSpec::Adversarial {
                capacity: capacity.unwrap_or(DEFAULT_CAPACITY),
            }
        }
        "rmm-random" => {
            if capacity.is_some() {
                return Err("synth rmm-random takes --n, --max and --seed (--capacity is for adversarial; give it to replay)".into());
            }
            let (Some(n), Some(max)) = (n, max) else {
                return Err(format!(
                    "synth rmm-random needs --n N and --max SIZE\n{SYNTH_SYNOPSIS}"
                ));
            };
            SynthSpec::checked_rmm(n, max, seed.unwrap_or(DEFAULT_SEED))
                .map_err(|e| format!("synth rmm-random: {e}"))?
        }
        spec if spec.starts_with("synth:") => SynthSpec::parse(spec)?,
        other => {
            return Err(format!(
                "synth: unknown KIND '{other}'; accepted: adversarial, rmm-random\n{SYNTH_SYNOPSIS}"
            ));
        }
    };
    let Some(out) = out else {
        return Err(format!(
            "synth: -o FILE is required (where to write the trace)\n{SYNTH_SYNOPSIS}"
        ));
    };
    let trace = spec.build();
    write_trace(&trace, &out)?;
    println!(
        "wrote {}: {} events, peak requested {}",
        out.display(),
        fmt_count(trace.events.len() as u64),
        fmt_bytes(trace.peak_requested())
    );
    Ok(0)
}

/// `torch-arena convert TRACE -o FILE`.
fn convert_command(args: &[String]) -> CliResult<u8> {
    let mut cur = ArgCursor::new(args, "convert", CONVERT_SYNOPSIS, &["-o", "--output"]);
    let (mut input, mut out) = (None, None);
    while let Some(item) = cur.next_item() {
        match item {
            Item::Positional(p) if input.is_none() => input = Some(p),
            Item::Positional(p) => {
                return Err(format!(
                    "convert: unexpected argument '{p}' (one TRACE only)\n{CONVERT_SYNOPSIS}"
                ));
            }
            Item::Opt(name, inline) => match name.as_str() {
                "-o" | "--output" => out = Some(PathBuf::from(cur.value(&name, inline)?)),
                "-h" | "--help" => {
                    print!("{USAGE}");
                    return Ok(0);
                }
                _ => return Err(cur.unknown(&name)),
            },
        }
    }
    let Some(input) = input else {
        return Err(format!("convert: which trace?\n{CONVERT_SYNOPSIS}"));
    };
    let Some(out) = out else {
        return Err(format!(
            "convert: -o FILE is required (where to write the trace)\n{CONVERT_SYNOPSIS}"
        ));
    };
    let trace = TraceArg::parse(&input)?.load()?;
    write_trace(&trace, &out)?;
    println!(
        "wrote {}: the {} trace {input}, {} events ({} seeded), peak requested {}",
        out.display(),
        trace.kind.as_str(),
        fmt_count(trace.events.len() as u64),
        fmt_count(trace.seeded as u64),
        fmt_bytes(trace.peak_requested())
    );
    Ok(0)
}

/// Write `trace` in torch-arena's trace format.
fn write_trace(trace: &Trace, path: &Path) -> CliResult<()> {
    torch_arena::trace::format::write(trace, path).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------------
// demo

const DEMO_OPTIONS: &[&str] = &[
    "--model",
    "--steps",
    "--conf",
    "--capacity",
    "--repeat",
    "--gpu-lag",
    "--driver-costs",
    "--plot",
    "--progress",
    "--no-progress",
    "--help",
];

fn demo_command(args: &[String]) -> CliResult<u8> {
    let mut cur = ArgCursor::new(args, "demo", DEMO_SYNOPSIS, DEMO_OPTIONS);
    let mut model = false;
    let mut steps: Option<u32> = None;
    let mut conf: Option<String> = None;
    let mut capacity: Option<u64> = None;
    let mut plot_file: Option<String> = None;
    let mut progress = None;
    let mut timing: Vec<(String, String)> = Vec::new();
    while let Some(item) = cur.next_item() {
        let (name, inline) = match item {
            Item::Positional(p) => {
                return Err(format!(
                    "demo: unexpected argument '{p}' (to replay a trace of your own: torch-arena replay {p})\n{DEMO_SYNOPSIS}"
                ));
            }
            Item::Opt(n, v) => (n, v),
        };
        match name.as_str() {
            "--model" => {
                cur.flag(&name, inline)?;
                model = true;
            }
            "--progress" | "--no-progress" => {
                cur.flag(&name, inline)?;
                progress = Some(name == "--progress");
            }
            "--steps" => {
                let v = cur.value(&name, inline)?;
                steps = Some(
                    v.parse()
                        .map_err(|_| format!("--steps: '{v}' is not a whole number"))?,
                );
            }
            "--conf" => conf = Some(cur.value(&name, inline)?),
            "--capacity" => capacity = Some(parse_capacity(&cur.value(&name, inline)?)?),
            "--plot" => plot_file = Some(cur.value(&name, inline)?),
            "--repeat" | "--gpu-lag" | "--driver-costs" => {
                let v = cur.value(&name, inline)?;
                timing.push((name, v));
            }
            "-h" | "--help" => {
                print!("{USAGE}");
                return Ok(0);
            }
            _ => return Err(cur.unknown(&name)),
        }
    }
    if model || steps.is_some() {
        if capacity.is_some() || plot_file.is_some() || !timing.is_empty() {
            return Err(
                "demo --model runs the loop itself: --capacity, --plot, --repeat, --gpu-lag and \
                 --driver-costs are for the trace replay (for the model, set the capacity with \
                 --conf device:sim,sim_capacity_mb:N)"
                    .into(),
            );
        }
        return model_demo(steps.unwrap_or(8), conf.as_deref().unwrap_or("device:sim"));
    }
    let mut s = ReplaySettings::new(progress);
    s.native = true;
    s.capacity = capacity.unwrap_or(DEFAULT_CAPACITY);
    // Three passes by default, so the table shows a warm step beside the first.
    s.timing.repeat = DEMO_REPEAT;
    for (name, v) in &timing {
        s.timing_option(name, v)?;
    }
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
    println!("{}", wrap(&intro, 96));
    println!();
    print_outcome(&s, &o);
    if let Some(Ok(r)) = o.runs.first().map(|r| &r.outcome) {
        println!("torch-arena in memory_summary terms:");
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
                "Modelled driver time (A100 latencies), host stall",
                format!(
                    "{}, {}",
                    fmt_secs(r.modelled_driver_s),
                    fmt_secs(r.modelled_stall_s)
                ),
            ),
            (
                "Memory driver calls per step, steady state",
                steady_calls(&r.steps),
            ),
            (
                "  the same for native (emulated)",
                o.emulated
                    .as_ref()
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
            println!("  {k:<50} {v:>22}");
        }
        println!();
        println!("{}", wrap(&demo_reading(&s, &o, r), 96));
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
fn steady_calls(steps: &[StepStats]) -> String {
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
fn demo_reading(s: &ReplaySettings, o: &TraceOutcome, r: &ReplayResult) -> String {
    let nbb = |b| nb(fmt_bytes(b));
    let nbf = |f| nb(fmt_frag(f));
    let nbc = |n| nb(fmt_count(n));
    let req = r.peak_requested;
    let mut t = format!(
        "Reading: at its peak the run had {} of tensors live. ",
        nbb(req)
    );
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
    if let Some(e) = &o.emulated {
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
                 more than requested): torch-arena needs {} {word} ({:.1}\u{a0}% of the native \
                 figure). ",
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
fn model_demo(steps: u32, conf_text: &str) -> CliResult<u8> {
    let conf = Config::parse(conf_text).map_err(|e| format!("--conf: {e}"))?;
    if conf.device != DeviceKind::Sim {
        return Err("demo runs on the simulated GPU: use --conf device:sim,...".into());
    }
    let arena = TorchArena::new(conf.clone());
    println!("torch-arena demo: a transformer training loop modelled on a simulated GPU ({conf})");
    println!();
    println!(
        " step | live tensors | allocated  | peak alloc | reserved   | peak resv  | frag   | time/op  \
         | mem calls | driver time"
    );
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
    for step in 1..=steps {
        let t = Instant::now();
        let before = counters()?;
        let ops = workload.step(step).map_err(|e| e.to_string())?;
        let calls = counters()?.since(&before);
        let s = arena.stats(0).map_err(|e| e.to_string())?;
        let frag =
            1.0 - s.requested_bytes.all().peak as f64 / s.reserved_bytes.all().peak.max(1) as f64;
        println!(
            " {step:>4} | {:>12} | {:>10} | {:>10} | {:>10} | {:>10} | {:>5.1}% | {:>5} ns | {:>9} | {:>11}",
            s.allocation.all().current,
            mib(s.allocated_bytes.all().current),
            mib(s.allocated_bytes.all().peak),
            mib(s.reserved_bytes.all().current),
            mib(s.reserved_bytes.all().peak),
            frag * 100.0,
            t.elapsed().as_nanos() / ops.max(1) as u128,
            fmt_count(calls.memory_calls()),
            fmt_secs(costs.seconds(&calls)),
        );
    }
    println!();
    println!(
        "mem calls: memory driver calls of the step (create, map, set access, unmap, release, \
         reserve); driver time: all its calls priced at the A100 latencies (BENCHMARKS.md). A \
         warm native allocator makes no memory call in a step that repeats its shapes."
    );
    println!();
    print!("{}", arena.summary(0, false).map_err(|e| e.to_string())?);
    println!("{steps} steps in {:.2} s", started.elapsed().as_secs_f64());
    Ok(0)
}

fn mib(bytes: i64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("80GiB"), Ok(80 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512 mib"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("3KB"), Ok(3000));
        assert_eq!(parse_size("7B"), Ok(7));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert_eq!(parse_size("1TB"), Ok(1_000_000_000_000));
        assert_eq!(parse_size("0.5KiB"), Ok(512));
        for bad in [
            "80",
            "80GiG",
            "GiB",
            "",
            "1..5GB",
            ".5GB",
            "5.GB",
            "-1GiB",
            "99999999TiB",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(
                e.contains("KiB, MiB, GiB, TiB") && e.contains("KB, MB, GB, TB"),
                "{e}"
            );
            assert!(e.contains(&format!("'{bad}'")), "{e}");
        }
        assert!(
            parse_size("80GiG")
                .unwrap_err()
                .contains("unknown unit 'GiG'")
        );
        assert!(parse_size("80").unwrap_err().contains("no unit"));
        assert!(parse_capacity("0GiB").unwrap_err().contains("more than 0"));
    }

    #[test]
    fn synth_specs() {
        assert_eq!(
            SynthSpec::parse("synth:adversarial:16GiB"),
            Ok(SynthSpec::Adversarial { capacity: 16 << 30 })
        );
        assert_eq!(
            SynthSpec::parse("synth:rmm-random:10_000:64MiB"),
            Ok(SynthSpec::RmmRandom {
                n: 10_000,
                max: 64 << 20,
                seed: DEFAULT_SEED
            })
        );
        assert_eq!(
            SynthSpec::parse("synth:rmm-random:5:1KiB:9"),
            Ok(SynthSpec::RmmRandom {
                n: 5,
                max: 1024,
                seed: 9
            })
        );
        for (bad, says) in [
            ("synth:foo:1", "unknown synthetic trace 'foo'"),
            ("synth:adversarial", "wrong number"),
            ("synth:rmm-random:10:1MiB:1:2", "wrong number"),
            ("synth:rmm-random:x:1MiB", "'x' is not a whole number"),
            ("synth:rmm-random:10:64", "no unit"),
            ("synth:rmm-random:0:1MiB", "N must be at least 1"),
            ("synth:adversarial:0B", "more than 0"),
        ] {
            let e = SynthSpec::parse(bad).unwrap_err();
            assert!(e.contains(says) && e.contains(SYNTH_FORMS), "{bad}: {e}");
        }
    }

    #[test]
    fn trace_args_are_checked_up_front() {
        let e = TraceArg::parse("/nonexistent/x.pickle").unwrap_err();
        assert!(e.contains("'/nonexistent/x.pickle'"), "{e}");
        let e = TraceArg::parse("/").unwrap_err();
        assert!(e.contains("directory"), "{e}");
        let a = TraceArg::parse("synth:rmm-random:10:1MiB").unwrap();
        assert_eq!(a.name(), "synth:rmm-random:10:1MiB");
        let f = TraceArg::File(PathBuf::from("a/b/run.pickle.gz"));
        assert_eq!(f.name(), "run.pickle.gz");
        assert_eq!(f.text(), "a/b/run.pickle.gz");
    }

    #[test]
    fn options_hint_and_values() {
        let args: Vec<String> = ["--capacty", "1GiB"].map(String::from).to_vec();
        let cur = ArgCursor::new(&args, "replay", REPLAY_SYNOPSIS, REPLAY_OPTIONS);
        let e = cur.unknown("--capacty");
        assert!(e.contains("did you mean '--capacity'?"), "{e}");
        assert!(e.contains(REPLAY_SYNOPSIS));
        let args: Vec<String> = ["--conf=stitch:False", "--", "--x"]
            .map(String::from)
            .to_vec();
        let mut cur = ArgCursor::new(&args, "replay", REPLAY_SYNOPSIS, REPLAY_OPTIONS);
        match cur.next_item() {
            Some(Item::Opt(n, v)) => {
                assert_eq!(n, "--conf");
                assert_eq!(cur.value(&n, v).unwrap(), "stitch:False");
            }
            _ => panic!("expected an option"),
        }
        assert!(matches!(cur.next_item(), Some(Item::Positional(p)) if p == "--x"));
        assert!(cur.next_item().is_none());
    }

    #[test]
    fn confs_are_forced_to_the_sim_device() {
        let mut s = ReplaySettings::new(Some(false));
        s.capacity = 3 << 30;
        s.backing = true;
        s.add_conf(" stitch:False ").unwrap();
        assert_eq!(s.confs[0].0, "stitch:False");
        let e = s.effective(&s.confs[0].1);
        assert_eq!(e.device, DeviceKind::Sim);
        assert_eq!(e.sim_capacity_mb, 3072);
        assert!(e.sim_backing && !e.stitch);
        let err = s.add_conf("sim_capacity_mb:1024").unwrap_err();
        assert!(err.contains("--capacity 1024MiB"), "{err}");
        let err = s.add_conf("stich:False").unwrap_err();
        assert!(
            err.contains("--conf 'stich:False'") && err.contains("stitch"),
            "{err}"
        );
    }

    #[test]
    fn formatting() {
        assert_eq!(fmt_count(0), "0");
        assert_eq!(fmt_count(1234567), "1,234,567");
        assert_eq!(fmt_count(100), "100");
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(3 << 29), "1.50 GiB");
        assert_eq!(fmt_ns(850.0), "850 ns");
        assert_eq!(fmt_ns(1500.0), "1.5 µs");
        assert_eq!(fmt_frag(0.019), "1.9 %");
        assert_eq!(fmt_frag(fragmentation(1, 0)), "–");
        assert_eq!(wrap("aa bb cc", 5), "aa bb\ncc");
        assert_eq!(wrap(&format!("a {}", nb("1.0 %".into())), 4), "a\n1.0 %");
        assert_eq!(shorten("abcdef", 4), "…def");
        assert_eq!(
            plot_path_for("out/{trace}.svg", "a b/c.pickle"),
            PathBuf::from("out/a_b_c.pickle.svg")
        );
    }

    // A tiny JSON reader, enough to check that the lines parse and hold the right values.
    #[derive(Debug, PartialEq)]
    enum J {
        Null,
        Bool(bool),
        Num(f64),
        Str(String),
        Arr(Vec<J>),
        Obj(Vec<(String, J)>),
    }

    impl J {
        fn get(&self, k: &str) -> &J {
            match self {
                J::Obj(f) => {
                    &f.iter()
                        .find(|(n, _)| n == k)
                        .unwrap_or_else(|| panic!("no {k}"))
                        .1
                }
                _ => panic!("not an object"),
            }
        }
    }

    struct Reader<'a> {
        s: &'a [u8],
        i: usize,
    }

    impl Reader<'_> {
        fn ws(&mut self) {
            while self.i < self.s.len() && b" \t\r\n".contains(&self.s[self.i]) {
                self.i += 1;
            }
        }
        fn eat(&mut self, c: u8) {
            self.ws();
            assert_eq!(self.s[self.i] as char, c as char, "at {}", self.i);
            self.i += 1;
        }
        fn value(&mut self) -> J {
            self.ws();
            match self.s[self.i] {
                b'{' => {
                    self.i += 1;
                    let mut f = Vec::new();
                    self.ws();
                    if self.s[self.i] == b'}' {
                        self.i += 1;
                        return J::Obj(f);
                    }
                    loop {
                        self.ws();
                        let J::Str(k) = self.value() else {
                            panic!("key")
                        };
                        self.eat(b':');
                        let v = self.value();
                        assert!(f.iter().all(|(n, _)| *n != k), "duplicate key {k}");
                        f.push((k, v));
                        self.ws();
                        self.i += 1;
                        match self.s[self.i - 1] {
                            b',' => continue,
                            b'}' => return J::Obj(f),
                            c => panic!("unexpected {}", c as char),
                        }
                    }
                }
                b'[' => {
                    self.i += 1;
                    let mut a = Vec::new();
                    self.ws();
                    if self.s[self.i] == b']' {
                        self.i += 1;
                        return J::Arr(a);
                    }
                    loop {
                        a.push(self.value());
                        self.ws();
                        self.i += 1;
                        match self.s[self.i - 1] {
                            b',' => continue,
                            b']' => return J::Arr(a),
                            c => panic!("unexpected {}", c as char),
                        }
                    }
                }
                b'"' => {
                    self.i += 1;
                    let mut out = String::new();
                    loop {
                        let c = self.s[self.i];
                        self.i += 1;
                        match c {
                            b'"' => return J::Str(out),
                            b'\\' => {
                                let e = self.s[self.i];
                                self.i += 1;
                                out.push(match e {
                                    b'"' => '"',
                                    b'\\' => '\\',
                                    b'/' => '/',
                                    b'n' => '\n',
                                    b'r' => '\r',
                                    b't' => '\t',
                                    b'b' => '\u{8}',
                                    b'f' => '\u{c}',
                                    b'u' => {
                                        let h = std::str::from_utf8(&self.s[self.i..self.i + 4])
                                            .unwrap();
                                        self.i += 4;
                                        char::from_u32(u32::from_str_radix(h, 16).unwrap()).unwrap()
                                    }
                                    _ => panic!("bad escape"),
                                });
                            }
                            c if c < 0x20 => panic!("raw control character in a string"),
                            _ => {
                                // Copy one UTF-8 character.
                                let start = self.i - 1;
                                let len = match c {
                                    0..0x80 => 1,
                                    0xC0..0xE0 => 2,
                                    0xE0..0xF0 => 3,
                                    _ => 4,
                                };
                                out.push_str(
                                    std::str::from_utf8(&self.s[start..start + len]).unwrap(),
                                );
                                self.i = start + len;
                            }
                        }
                    }
                }
                b't' => {
                    assert_eq!(&self.s[self.i..self.i + 4], b"true");
                    self.i += 4;
                    J::Bool(true)
                }
                b'f' => {
                    assert_eq!(&self.s[self.i..self.i + 5], b"false");
                    self.i += 5;
                    J::Bool(false)
                }
                b'n' => {
                    assert_eq!(&self.s[self.i..self.i + 4], b"null");
                    self.i += 4;
                    J::Null
                }
                _ => {
                    let start = self.i;
                    while self.i < self.s.len() && b"-+.eE0123456789".contains(&self.s[self.i]) {
                        self.i += 1;
                    }
                    let t = std::str::from_utf8(&self.s[start..self.i]).unwrap();
                    J::Num(t.parse().unwrap_or_else(|_| panic!("bad number '{t}'")))
                }
            }
        }
    }

    fn parse_json(s: &str) -> J {
        let mut r = Reader {
            s: s.as_bytes(),
            i: 0,
        };
        let v = r.value();
        r.ws();
        assert_eq!(r.i, s.len(), "trailing text");
        v
    }

    #[test]
    fn json_escapes() {
        assert_eq!(
            json_string("a\"b\\c\nd\u{1}é"),
            "\"a\\\"b\\\\c\\nd\\u0001é\""
        );
        let line = JsonObject::new()
            .str("k\"", "v\t\u{7f}\u{1f}")
            .float("nan", f64::NAN)
            .float("x", 0.25)
            .opt_num("none", None)
            .finish();
        assert_eq!(
            line,
            "{\"k\\\"\": \"v\\t\u{7f}\\u001f\", \"nan\": null, \"x\": 0.25, \"none\": null}"
        );
        let v = parse_json(&line);
        assert_eq!(*v.get("k\""), J::Str("v\t\u{7f}\u{1f}".into()));
    }

    fn outcome(oom: bool, error: bool) -> TraceOutcome {
        let result = ReplayResult {
            trace: "t".into(),
            conf: "stitch:False".into(),
            events: 10,
            peak_requested: 100 << 20,
            peak_reserved: 110 << 20,
            fragmentation: 0.1,
            native_peak_reserved: Some(120 << 20),
            oom: oom.then(|| OomReport {
                event: 7,
                size: 64 << 20,
                stream: 3,
                live_bytes: 90 << 20,
                live_count: 4,
                reserved: 110 << 20,
                cached: 20 << 20,
                message: "CUDA out of memory. Tried to allocate 64.00 MiB\n\"quoted\"".into(),
                step: 1,
                largest_live: vec![
                    (50 << 20, "train.py:40 in \"step\"".into()),
                    (1, String::new()),
                ],
            }),
            elapsed: Duration::from_millis(2),
            driver_calls: 17,
            calls: DriverCounters {
                mem_create: 10,
                mem_map: 7,
                ..Default::default()
            },
            modelled_driver_s: 0.5,
            modelled_stall_s: 0.25,
            gpu_lag_ns: 2_000_000,
            steps: vec![StepStats::default()],
            unmatched_frees: 0,
            live_at_end: 4,
            series: vec![
                Point {
                    event: 0,
                    requested: 0,
                    reserved: 0,
                },
                Point {
                    event: 9,
                    requested: 100 << 20,
                    reserved: 110 << 20,
                },
            ],
        };
        TraceOutcome {
            info: TraceInfo {
                name: "run \"1\".pickle".into(),
                path: "dir/run \"1\".pickle".into(),
                source: Source::TorchSnapshot,
                kind: Kind::Warm,
                device: 0,
                events: 10,
                seeded: 2,
                peak_requested: 100 << 20,
                native_recorded: Some(120 << 20),
                native_recorded_calls: None,
            },
            recorded_series: Some(vec![Point {
                event: 0,
                requested: 0,
                reserved: 120 << 20,
            }]),
            emulated: Some(Emulated {
                result: NativeResult {
                    replay: ReplayResult {
                        peak_reserved: 130 << 20,
                        series: vec![],
                        native_peak_reserved: None,
                        oom: None,
                        driver_calls: 7,
                        calls: DriverCounters {
                            mem_alloc: 7,
                            ..Default::default()
                        },
                        ..result.clone()
                    },
                    peak_allocated: 100 << 20,
                    oom_event: None,
                    segments_created: 7,
                    segments_released: 0,
                    alloc_retries: 0,
                    final_reserved: 130 << 20,
                },
                elapsed: Duration::from_millis(1),
                oom_request: None,
                peak_requested: 100 << 20,
            }),
            runs: vec![Run {
                label: "stitch:False".into(),
                effective: Config::default(),
                outcome: if error {
                    Err("boom \"x\"".into())
                } else {
                    Ok(result)
                },
            }],
        }
    }

    /// The fields `scripts/bench-traces` and BENCHMARKS.md rely on.
    const FIELDS: &[&str] = &[
        "trace",
        "path",
        "source",
        "kind",
        "device",
        "events",
        "seeded_events",
        "capacity_bytes",
        "conf",
        "conf_effective",
        "backing",
        "check",
        "events_replayed",
        "peak_requested_bytes",
        "peak_reserved_bytes",
        "native_peak_reserved_bytes",
        "fragmentation",
        "oom_event",
        "oom",
        "native_emulated_peak_reserved_bytes",
        "native_emulated_oom_event",
        "native_emulated_fragmentation",
        "native_emulated_elapsed_s",
        "elapsed_s",
        "ns_per_event",
        "events_per_s",
        "driver_calls",
        "driver_calls_by_kind",
        "modelled_driver_s",
        "modelled_stall_s",
        "steps",
        "gpu_lag_us",
        "repeat",
        "driver_costs",
        "native_driver_calls",
        "native_driver_calls_by_kind",
        "native_modelled_driver_s",
        "native_modelled_stall_s",
        "native_driver_calls_from",
        "native_steps",
        "error",
    ];

    #[test]
    fn json_lines_parse_back() {
        let s = ReplaySettings::new(Some(false));
        for (oom, error) in [(false, false), (true, false), (false, true)] {
            let lines = json_lines(&s, &outcome(oom, error));
            assert_eq!(lines.len(), 1);
            assert!(!lines[0].contains('\n'));
            let v = parse_json(&lines[0]);
            let J::Obj(fields) = &v else { panic!() };
            let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(names, FIELDS);
            assert_eq!(*v.get("trace"), J::Str("run \"1\".pickle".into()));
            assert_eq!(*v.get("kind"), J::Str("warm".into()));
            assert_eq!(*v.get("seeded_events"), J::Num(2.0));
            assert_eq!(
                *v.get("native_peak_reserved_bytes"),
                J::Num((120u64 << 20) as f64)
            );
            assert_eq!(
                *v.get("native_emulated_peak_reserved_bytes"),
                J::Num((130u64 << 20) as f64)
            );
            assert_eq!(*v.get("native_emulated_oom_event"), J::Null);
            assert_eq!(*v.get("gpu_lag_us"), J::Num(2000.0));
            assert_eq!(*v.get("native_driver_calls"), J::Num(7.0));
            assert_eq!(
                *v.get("native_driver_calls_from"),
                J::Str("emulated".into())
            );
            assert_eq!(
                *v.get("native_driver_calls_by_kind").get("cuMemAlloc"),
                J::Num(7.0)
            );
            if error {
                assert_eq!(*v.get("error"), J::Str("boom \"x\"".into()));
                assert_eq!(*v.get("peak_reserved_bytes"), J::Null);
            } else {
                assert_eq!(*v.get("error"), J::Null);
                assert_eq!(*v.get("peak_reserved_bytes"), J::Num((110u64 << 20) as f64));
                assert_eq!(*v.get("fragmentation"), J::Num(0.1));
                assert_eq!(*v.get("driver_calls"), J::Num(17.0));
                assert_eq!(*v.get("ns_per_event"), J::Num(200_000.0));
                assert_eq!(*v.get("modelled_driver_s"), J::Num(0.5));
                let k = v.get("driver_calls_by_kind");
                assert_eq!(*k.get("cuMemCreate"), J::Num(10.0));
                assert_eq!(*k.get("cuMemMap"), J::Num(7.0));
                let J::Arr(steps) = v.get("steps") else {
                    panic!()
                };
                assert_eq!(steps.len(), 1);
                assert_eq!(*steps[0].get("peak_reserved_bytes"), J::Num(0.0));
            }
            if oom {
                assert_eq!(*v.get("oom_event"), J::Num(7.0));
                let o = v.get("oom");
                assert_eq!(*o.get("stream"), J::Num(3.0));
                assert!(matches!(o.get("message"), J::Str(m) if m.contains("\n\"quoted\"")));
                let J::Arr(l) = o.get("largest_live") else {
                    panic!()
                };
                assert_eq!(*l[0].get("site"), J::Str("train.py:40 in \"step\"".into()));
            } else {
                assert_eq!(*v.get("oom_event"), J::Null);
                assert_eq!(*v.get("oom"), J::Null);
            }
        }
        let e = json_load_error(&TraceArg::File("x\\y.pickle".into()), "bad\nfile");
        let v = parse_json(&e);
        assert_eq!(*v.get("path"), J::Str("x\\y.pickle".into()));
        assert_eq!(*v.get("error"), J::Str("bad\nfile".into()));
    }

    #[test]
    fn plot_panel_has_every_allocator() {
        let mut s = ReplaySettings::new(Some(false));
        s.plot = Some("x.svg".into());
        let p = panel(&s, &outcome(false, false));
        let labels: Vec<&str> = p.lines.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "requested",
                "native (recorded) reserved",
                "native (emulated) reserved",
                "arena (stitch:False) reserved"
            ]
        );
        assert_eq!(p.lines[0].points, [(0, 0), (9, 100 << 20)]);
        assert_eq!(p.lines[3].points, [(0, 0), (9, 110 << 20)]);
        assert_eq!(p.events, 10);
    }

    #[test]
    fn demo_reading_compares_with_native() {
        let s = ReplaySettings::new(Some(false));
        let o = outcome(false, false);
        let Ok(r) = &o.runs[0].outcome else { panic!() };
        let t = demo_reading(&s, &o, r).replace('\u{a0}', " ");
        assert!(t.contains("100.00 MiB of tensors live"), "{t}");
        assert!(
            t.contains("torch-arena needs 20.00 MiB less (15.4 % of the native figure)"),
            "{t}"
        );
        let o = outcome(true, false);
        let Ok(r) = &o.runs[0].outcome else { panic!() };
        assert!(demo_reading(&s, &o, r).contains("ran out of memory at event 7"));
    }
}
