//! Command-line parsing: the commands and their options (clap, derived from the structs below),
//! the value parsers of sizes, durations and counts, and the traces named on the command line
//! (files, synthetic specs, the built-in demo trace).

use std::path::{Path, PathBuf};

use torch_arena_lab as tr;
use torch_arena_lab::Trace;
use torch_arena_lab::native::NativeOptions;
use torch_arena_lab::synth as lib_synth;

use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;

use crate::out::CliResult;
use crate::usage::{
    ABOUT, DEFAULT_SEED, DEMO_LONG_ABOUT, DIFF_AFTER_HELP, DIFF_JSON_HELP, DIFF_LONG_ABOUT,
    DIFF_PLOT_HELP, EXIT_STATUS_HELP, FIT_AFTER_HELP, LIVE_TOP_TEXT, MERGE_AFTER_HELP,
    REPLAY_AFTER_HELP, REPLAY_JSON_HELP, SYNTH_AFTER_HELP, TOP_AFTER_HELP, TRACE_FORMS_HELP,
};
use torch_arena_lab::diff::{By, Moment};

pub(crate) const SIZE_FORMS: &str = "a number and a unit: B, KiB, MiB, GiB, TiB (powers of 1024) or \
KB, MB, GB, TB (powers of 1000), e.g. 80GiB, 512MiB, 1.5GB";

/// Parse a byte size such as `80GiB`, `512 MiB`, `1.5GB` (units case-insensitive), rounded to
/// whole bytes.
pub(crate) fn parse_size(text: &str) -> CliResult<u64> {
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

/// A `--capacity`: a size of at least one byte.
pub(crate) fn parse_capacity(text: &str) -> CliResult<u64> {
    let c = parse_size(text)?;
    if c == 0 {
        return Err("must be more than 0 bytes".into());
    }
    Ok(c)
}

/// A whole number, `_` allowed as a separator (`100_000`).
pub(crate) fn parse_whole(text: &str) -> CliResult<u64> {
    text.replace('_', "")
        .parse()
        .map_err(|_| format!("'{text}' is not a whole number"))
}

/// [`parse_whole`], its error naming `what` (a field of a synthetic spec).
pub(crate) fn parse_count(what: &str, text: &str) -> CliResult<u64> {
    parse_whole(text).map_err(|e| format!("{what}: {e}"))
}

/// Parse a duration such as `0`, `500us`, `5ms`, `1.5s` into nanoseconds.
pub(crate) fn parse_duration(text: &str) -> CliResult<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    let bad = || {
        format!(
            "'{text}' is not a duration: expected 0 or a number and a unit: ns, us (or \
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
pub(crate) enum SynthSpec {
    Adversarial {
        capacity: u64,
    },
    RmmRandom {
        n: u64,
        max: u64,
        seed: u64,
    },
    /// A dynamic-shape workload (`torch_arena_lab::workloads`).
    Workload {
        kind: &'static str,
        steps: u32,
        seed: u64,
    },
}

pub(crate) const SYNTH_FORMS: &str = "synth:adversarial:CAPACITY, synth:rmm-random:N:MAX[:SEED] \
or synth:KIND[:STEPS[:SEED]] with KIND one of varlen-train, llm-serve, moe-train, \
two-stream-train (e.g. synth:adversarial:16GiB, synth:rmm-random:10000:64MiB:7, \
synth:llm-serve:4:1)";
/// Steps of a workload unless told.
const DEFAULT_WORKLOAD_STEPS: u32 = 3;

impl SynthSpec {
    /// Parse `synth:adversarial:CAPACITY` or `synth:rmm-random:N:MAX[:SEED]`.
    pub(crate) fn parse(text: &str) -> CliResult<SynthSpec> {
        SynthSpec::parse_spec(text).map_err(|e| format!("trace '{text}': {e}"))
    }

    /// [`SynthSpec::parse`], its error without the spec (clap's message names it).
    fn parse_spec(text: &str) -> CliResult<SynthSpec> {
        let parts: Vec<&str> = text.split(':').collect();
        let err = |why: String| format!("{why}; accepted: {SYNTH_FORMS}");
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
            ["synth", kind, rest @ ..] if tr::workloads::KINDS.contains(kind) => {
                if rest.len() > 2 {
                    return Err(err("wrong number of ':' fields".into()));
                }
                let kind = tr::workloads::KINDS
                    .iter()
                    .find(|k| *k == kind)
                    .copied()
                    .expect("checked above");
                let steps = match rest.first() {
                    Some(s) => parse_count("STEPS", s).map_err(err)?,
                    None => u64::from(DEFAULT_WORKLOAD_STEPS),
                };
                if !(1..=1_000).contains(&steps) {
                    return Err(err(format!("STEPS: {steps} must be from 1 to 1000")));
                }
                let seed = match rest.get(1) {
                    Some(s) => parse_count("SEED", s).map_err(err)?,
                    None => DEFAULT_SEED,
                };
                Ok(SynthSpec::Workload {
                    kind,
                    steps: steps as u32,
                    seed,
                })
            }
            ["synth", kind, ..] => Err(err(format!("unknown synthetic trace '{kind}'"))),
            _ => Err(err("not a synthetic trace".into())),
        }
    }

    pub(crate) fn checked_rmm(n: u64, max: u64, seed: u64) -> Result<SynthSpec, String> {
        if n == 0 {
            return Err("N must be at least 1".into());
        }
        if max == 0 {
            return Err("MAX must be at least 1 byte".into());
        }
        Ok(SynthSpec::RmmRandom { n, max, seed })
    }

    pub(crate) fn build(&self) -> Trace {
        match *self {
            SynthSpec::Adversarial { capacity } => lib_synth::adversarial(capacity),
            SynthSpec::RmmRandom { n, max, seed } => lib_synth::rmm_random(n as usize, max, seed),
            SynthSpec::Workload { kind, steps, seed } => {
                tr::workloads::build(kind, steps, seed).expect("a kind of KINDS")
            }
        }
    }
}

/// A `--native-conf` value (`replay`, `fit`), checked before any work: the settings as given,
/// trimmed.
pub(crate) fn native_conf_arg(text: &str) -> CliResult<String> {
    NativeOptions::with_conf(0, &format!("--native-conf '{text}'"), text)
        .map_err(|e| e.to_string())?;
    Ok(text.trim().to_string())
}

/// A trace argument of `replay`.
#[derive(Clone, Debug)]
pub(crate) enum TraceArg {
    File(PathBuf),
    Synth(SynthSpec, String),
    /// A trace file's bytes built into the command, and its name (the demo trace).
    Embedded(&'static [u8], &'static str),
}

impl TraceArg {
    /// A trace argument as clap reads it (a value parser): a synthetic spec must parse; a file
    /// is checked by [`TraceArg::check`] once every argument is read, so that every missing
    /// file is named at once.
    pub(crate) fn from_arg(text: &str) -> CliResult<TraceArg> {
        if text.starts_with("synth:") {
            return Ok(TraceArg::Synth(
                SynthSpec::parse_spec(text)?,
                text.to_string(),
            ));
        }
        Ok(TraceArg::File(PathBuf::from(text)))
    }

    /// Check the argument before any work: a file exists and is a file.
    pub(crate) fn check(&self) -> CliResult<()> {
        let TraceArg::File(path) = self else {
            return Ok(());
        };
        let text = path.display();
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => Err(format!(
                "cannot read trace '{text}': it is a directory (give the trace files in it)"
            )),
            Ok(_) => Ok(()),
            Err(e) => Err(format!("cannot read trace '{text}': {e}")),
        }
    }

    /// Every argument checked ([`TraceArg::check`]); the errors of all, one per line.
    pub(crate) fn check_all(traces: &[TraceArg]) -> CliResult<()> {
        let bad: Vec<String> = traces.iter().filter_map(|t| t.check().err()).collect();
        if bad.is_empty() {
            Ok(())
        } else {
            Err(bad.join("\ntorch-arena: "))
        }
    }

    /// The argument as given.
    pub(crate) fn text(&self) -> String {
        match self {
            TraceArg::File(p) => p.display().to_string(),
            TraceArg::Synth(_, t) => t.clone(),
            TraceArg::Embedded(_, name) => format!("(built in) {name}"),
        }
    }

    /// A short name for tables and plots: the file name, or the synthetic spec.
    pub(crate) fn name(&self) -> String {
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
    pub(crate) fn load(&self) -> CliResult<Trace> {
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
                    .and_then(|()| load_warning(&file).map_err(|e| format!("{name}: {e}")));
                let _ = std::fs::remove_dir_all(&dir);
                let mut t = loaded?;
                t.name = name.to_string();
                Ok(t)
            }
            TraceArg::File(p) => load_warning(p).map_err(|e| {
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

/// Loads a trace file; a warning about what the reader dropped (the end of a recording cut off
/// mid-line) goes to stderr.
fn load_warning(path: &Path) -> torch_arena::error::Result<Trace> {
    let (trace, warnings) = tr::load_with_warnings(path)?;
    for w in warnings {
        errln!("torch-arena: warning: {w}");
    }
    Ok(trace)
}

// ---------------------------------------------------------------------------------------------
// The command line, as clap reads it: every command, option and value; the checks that need
// more than one value (a trace without its file, `demo --model` with a replay option) are the
// commands' own.

/// `torch-arena`: its commands.
#[derive(Parser, Debug)]
#[command(
    name = "torch-arena",
    version,
    about = ABOUT,
    after_help = "TRACE forms, SIZE and exit status: torch-arena --help",
    after_long_help = TOP_AFTER_HELP,
    // An option given twice: the last one counts (`--capacity 1GiB --capacity 2GiB`), as
    // before clap; repeatable ones (`--conf`, `--native-conf`) collect every value.
    args_override_self = true,
    subcommand_required = true,
    // Help wrapped to the terminal, at most 100 columns (as the texts are).
    max_term_width = 100,
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: CliCommand,
}

#[derive(Subcommand, Debug)]
pub(crate) enum CliCommand {
    /// replay each trace under each setting; print per trace the peak requested and reserved
    /// bytes, fragmentation, speed and driver calls, and where memory ran out
    #[command(after_long_help = REPLAY_AFTER_HELP)]
    Replay(ReplayArgs),
    /// the smallest GPU on which each trace runs with no out-of-memory, for the arena and for
    /// PyTorch's native allocator under each of its settings, and what the last step costs there
    #[command(after_long_help = FIT_AFTER_HELP)]
    Fit(FitArgs),
    /// what grew and shrank between two traces (two runs, two snapshots) or two steps of one: by
    /// allocation site or file, with the totals, as text, JSON or a plot of both runs
    #[command(long_about = DIFF_LONG_ABOUT, after_long_help = DIFF_AFTER_HELP)]
    Diff(DiffArgs),
    /// write a synthetic trace in torch-arena's trace format
    #[command(after_long_help = SYNTH_AFTER_HELP)]
    Synth(SynthArgs),
    /// write any trace (a PyTorch snapshot, an RMM log, a synthetic trace) in torch-arena's trace
    /// format (gzipped if FILE ends in .gz)
    #[command(after_long_help = TRACE_FORMS_HELP)]
    Convert(ConvertArgs),
    /// replay the training-loop trace the project ships against the emulated native allocator,
    /// and explain the result
    #[command(long_about = DEMO_LONG_ABOUT, after_long_help = EXIT_STATUS_HELP)]
    Demo(DemoArgs),
    /// the table of every rank's report and their imbalance, from the per-rank JSON files of
    /// torch_arena.explain(json=True) or the leak report
    #[command(after_long_help = MERGE_AFTER_HELP)]
    Merge(MergeArgs),
    /// print a shell completion script for torch-arena (bash, zsh, fish, elvish, powershell),
    /// e.g. `torch-arena completions bash > ~/.local/share/bash-completion/completions/torch-arena`
    Completions {
        /// the shell the script is for
        #[arg(value_enum)]
        shell: Shell,
    },
    /// the version of torch-arena (also --version, -V)
    #[command(hide = true)]
    Version,
}

/// `--progress` / `--no-progress`: the last given counts.
#[derive(Args, Debug, Default)]
pub(crate) struct ProgressArgs {
    /// show progress on stderr even when it is not a terminal
    #[arg(long, overrides_with = "no_progress")]
    progress: bool,
    /// never show progress (default: shown when stderr is a terminal)
    #[arg(long, overrides_with = "progress")]
    no_progress: bool,
}

impl ProgressArgs {
    /// `Some(true)` for `--progress`, `Some(false)` for `--no-progress`, else `None`.
    pub(crate) fn choice(&self) -> Option<bool> {
        match (self.progress, self.no_progress) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct ReplayArgs {
    /// the traces to replay: files or synthetic specs (TRACE forms below)
    #[arg(value_name = "TRACE", value_parser = TraceArg::from_arg)]
    pub(crate) traces: Vec<TraceArg>,
    /// memory of the simulated GPU (default 80GiB)
    #[arg(long, value_name = "SIZE", value_parser = parse_capacity, allow_hyphen_values = true)]
    pub(crate) capacity: Option<u64>,
    /// arena settings in TORCH_ARENA_CONF syntax, e.g. stitch:False,page_size_mb:4; repeat for a
    /// sweep
    ///
    /// One replay per CONF (default: one, with the defaults). The device is always the simulated
    /// one with --capacity (so no sim_capacity_mb here)
    #[arg(long = "conf", value_name = "CONF", allow_hyphen_values = true)]
    pub(crate) confs: Vec<String>,
    /// also emulate PyTorch's native caching allocator on each trace
    ///
    /// Under the expandable_segments and max_split_size the snapshot recorded (torch >= 2.5), else
    /// PyTorch's defaults (no max_split_size, no expandable segments, 20 MiB large segments).
    /// What the native allocator recorded in the trace itself (PyTorch snapshots with segment
    /// events) is always shown
    #[arg(long)]
    pub(crate) native: bool,
    /// also emulate the native allocator under SETTINGS (PYTORCH_CUDA_ALLOC_CONF's grammar);
    /// repeat for more
    ///
    /// As for fit; an empty one is the defaults. One more row per setting in every table, one
    /// more line in plots. The JSON fields native_emulated_* and native_*
    /// describe the first emulation (--native's, else the first --native-conf); native_emulated
    /// lists them all
    #[arg(
        long = "native-conf",
        value_name = "SETTINGS",
        allow_hyphen_values = true
    )]
    pub(crate) native_confs: Vec<String>,
    /// replay each trace N times in a row, one step per pass (default 1)
    ///
    /// What is live at the end of a pass stays live, what a pass allocates and frees is allocated
    /// and freed again. Tables add a steady-state table (first and last step)
    #[arg(long, value_name = "N", value_parser = parse_repeat, allow_hyphen_values = true)]
    pub(crate) repeat: Option<u32>,
    /// GPU work finishes this long after the host queues it (0, 500us, 5ms; default 2ms)
    ///
    /// The default is BENCHMARKS.md's. Memory freed while earlier kernels still use it can leave its stream only
    /// once they finish; a synchronising call that waits for them is a host stall. The clock is
    /// the trace's timestamps, else 10 µs per event. 0 replays as if the GPU finished everything
    /// at once
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub(crate) gpu_lag: Option<u64>,
    /// latencies of the driver calls, one `NAME = MICROSECONDS` per line
    ///
    /// E.g. cuMemCreate = 7.6; `NAME per GiB = MICROSECONDS` adds a term per GiB for cuMemCreate, cuMemRelease,
    /// cuMemAlloc and cuMemFree. Unnamed calls keep the defaults, measured on an H200 (in a
    /// source checkout: bench/costs/h200.txt; the former A100 defaults: bench/costs/a100.txt).
    /// The conf key driver_costs:FILE does the same for one --conf of a sweep
    #[arg(long, value_name = "FILE", allow_hyphen_values = true)]
    pub(crate) driver_costs: Option<String>,
    /// back the simulated pages with host memory and check every live allocation's bytes (slow:
    /// for small traces)
    #[arg(long)]
    pub(crate) backing: bool,
    /// after every event, check that the stats are exact and that no live allocations overlap
    /// (slow)
    #[arg(long)]
    pub(crate) check: bool,
    /// after each trace, what was live by allocation site (the N largest, default 10)
    ///
    /// Per site: bytes, count, the largest sizes; at the peak of requested bytes, or just before the event where
    /// the arena ran out of memory; in --json, the fields live and live_at
    #[arg(
        long,
        value_name = "N",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = LIVE_TOP_TEXT,
        value_parser = parse_live,
    )]
    pub(crate) live: Option<usize>,
    /// print one JSON object per line per (trace, CONF) instead of tables
    #[arg(long, long_help = REPLAY_JSON_HELP)]
    pub(crate) json: bool,
    /// draw requested and reserved bytes over each trace into FILE (.svg or .png)
    ///
    /// With the capacity, the seeded part, out-of-memory markers and each allocator's modelled driver
    /// time (right axis): one panel per trace, stacked in one image; with {trace} in FILE, one
    /// file per trace, {trace} replaced by the trace's name. More than 6 traces in one FILE make
    /// an overview chart instead: per trace, ours / native peak reserved and modelled driver time
    #[arg(long, value_name = "FILE", allow_hyphen_values = true)]
    pub(crate) plot: Option<String>,
    #[command(flatten)]
    pub(crate) progress: ProgressArgs,
}

#[derive(Args, Debug)]
pub(crate) struct FitArgs {
    /// the traces to fit: files or synthetic specs (TRACE forms below)
    #[arg(value_name = "TRACE", value_parser = TraceArg::from_arg)]
    pub(crate) traces: Vec<TraceArg>,
    /// arena settings, as for replay; repeat for more (default: the defaults)
    #[arg(long = "conf", value_name = "CONF", allow_hyphen_values = true)]
    pub(crate) confs: Vec<String>,
    /// PyTorch's native allocator under SETTINGS, in PYTORCH_CUDA_ALLOC_CONF's grammar; repeat
    /// for more
    ///
    /// E.g. expandable_segments:True, max_split_size_mb:512, roundup_power2_divisions:[256:1,>:4],
    /// garbage_collection_threshold:0.8 with per_process_memory_fraction:0.9); repeat for more;
    /// an empty one is the defaults. Default: the defaults, expandable_segments:True, and the
    /// settings a snapshot recorded where it has them. Emulated: max_split_size_mb,
    /// max_non_split_rounding_mb, large_segment_size_mb, roundup_power2_divisions,
    /// garbage_collection_threshold, per_process_memory_fraction, expandable_segments;
    /// pinned-memory and locking settings are accepted and change nothing;
    /// backend:cudaMallocAsync is refused (not emulated)
    #[arg(
        long = "native-conf",
        value_name = "SETTINGS",
        allow_hyphen_values = true
    )]
    pub(crate) native_confs: Vec<String>,
    /// every one of N steps must run (default 1); the cost shown is the last step's
    #[arg(long, value_name = "N", value_parser = parse_repeat, allow_hyphen_values = true)]
    pub(crate) repeat: Option<u32>,
    /// as for replay, but the GPU lag defaults to 0
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub(crate) gpu_lag: Option<u64>,
    /// as for replay
    #[arg(long, value_name = "FILE", allow_hyphen_values = true)]
    pub(crate) driver_costs: Option<String>,
    /// traces fitted at once (default: one per core)
    #[arg(short, long, value_name = "N", value_parser = parse_jobs, allow_hyphen_values = true)]
    pub(crate) jobs: Option<usize>,
    /// per trace, the last step's modelled driver time over capacities near the minimums
    ///
    /// Devices from the least minimum to 10 % past the largest (12 capacities, each allocator replayed at each), with a dashed line
    /// where each starts to fit; up to 6 traces stack in one image, more make an overview (each
    /// minimum over the bytes requested, a dot per allocator); {trace} in FILE writes one file
    /// per trace
    #[arg(long, value_name = "FILE.svg", allow_hyphen_values = true)]
    pub(crate) plot: Option<String>,
    /// one JSON object per trace
    ///
    /// Fields: trace, path, source, kind, events, peak_requested_bytes (over
    /// every step), repeat, gpu_lag_us, best_native_bytes (the least of the native settings'
    /// minimums), and fit: one object per allocator and setting with allocator (arena or
    /// native), conf (as given, empty for the defaults), min_capacity_bytes (null: does not fit
    /// on any device up to 1 PiB), ratio_to_requested, saved_vs_best_native_bytes (positive:
    /// needs less), trials (replays the bisection ran) and last_step at the minimum
    /// (memory_driver_calls, driver_calls, driver_calls_by_kind, modelled_driver_s,
    /// modelled_stall_s). A trace that cannot be read gets {trace, path, error}
    #[arg(long)]
    pub(crate) json: bool,
    #[command(flatten)]
    pub(crate) progress: ProgressArgs,
}

/// `diff --by`: how rows are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ByArg {
    /// the allocation site (train.py:40 in step)
    Site,
    /// the site's source file (train.py)
    File,
    /// what the memory is (parameters, gradients, ...): of two explain reports (the default
    /// for them); no trace records it, so refused for traces with why
    Category,
    /// the nn.Module the memory belongs to: of two explain reports; no trace records it, so
    /// refused for traces with why
    Module,
}

impl ByArg {
    pub(crate) fn by(self) -> By {
        match self {
            ByArg::Site => By::Site,
            ByArg::File => By::File,
            ByArg::Category => By::Category,
            ByArg::Module => By::Module,
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct DiffArgs {
    /// A and B: two traces (files or synthetic specs, TRACE forms below), or one trace with
    /// --steps or two --at
    #[arg(value_name = "TRACE", value_parser = TraceArg::from_arg)]
    pub(crate) traces: Vec<TraceArg>,
    /// when each live set is taken: peak (default), start, end or event:N; once for both sides,
    /// or twice (A's, then B's)
    ///
    /// peak: after the event at which requested bytes were highest; start: the live set the
    /// recording began with (after its seeded events); end: after the last event; event:N: just
    /// before event N (counted from the first event, seeded ones included). With --steps each is
    /// taken within the step: its peak, its start, its end, N events into it
    #[arg(long = "at", value_name = "MOMENT", value_parser = parse_moment, allow_hyphen_values = true)]
    pub(crate) at: Vec<Moment>,
    /// compare step I with step J: of the one trace, or step I of A with step J of B
    ///
    /// Steps are numbered from 0 as the trace marks their ends: a PyTorch snapshot by the
    /// ProfilerStep or Optimizer.step ranges in its external_annotations, a synth:KIND workload by
    /// its own steps; step 0 runs from the first recorded event, and events after the last end
    /// are in no step. A torch-arena trace (format version 1) and an RMM log mark none: the
    /// command says so
    #[arg(long, num_args = 2, value_names = ["I", "J"], value_parser = parse_whole, allow_hyphen_values = true)]
    pub(crate) steps: Vec<u64>,
    /// group rows by site (default), file, category or module
    #[arg(long, value_enum, value_name = "GROUP")]
    pub(crate) by: Option<ByArg>,
    /// rows shown of what grew and of what shrank (default 10)
    #[arg(long, value_name = "N", value_parser = parse_top, allow_hyphen_values = true)]
    pub(crate) top: Option<usize>,
    /// print one JSON object instead of the tables
    #[arg(long, long_help = DIFF_JSON_HELP)]
    pub(crate) json: bool,
    /// draw both runs' requested bytes on one axis into FILE (.svg or .png)
    #[arg(long, value_name = "FILE", allow_hyphen_values = true, long_help = DIFF_PLOT_HELP)]
    pub(crate) plot: Option<String>,
}

/// `diff --at MOMENT`.
pub(crate) fn parse_moment(text: &str) -> CliResult<Moment> {
    Moment::parse(text)
}

/// Rows `diff` shows of each of grew and shrank unless told (`--top`).
pub(crate) const DEFAULT_TOP: usize = 10;

/// `diff --top N`: at least one row (at most 2^20 shown).
pub(crate) fn parse_top(text: &str) -> CliResult<usize> {
    match parse_whole(text)? {
        0 => Err("show at least 1 row".into()),
        n => Ok(n.min(1 << 20) as usize),
    }
}

#[derive(Args, Debug)]
pub(crate) struct SynthArgs {
    /// adversarial or rmm-random (or a synth:... spec, as replay takes)
    #[arg(value_name = "KIND")]
    pub(crate) kind: Option<String>,
    /// adversarial: the capacity at which the native allocator's policy runs out of memory while
    /// the arena fits (default 80GiB)
    #[arg(long, value_name = "SIZE", value_parser = parse_capacity, allow_hyphen_values = true)]
    pub(crate) capacity: Option<u64>,
    /// rmm-random: N allocations
    #[arg(long = "n", value_name = "N", value_parser = parse_whole, allow_hyphen_values = true)]
    pub(crate) n: Option<u64>,
    /// rmm-random: sizes uniform in [1, MAX]
    #[arg(long, value_name = "SIZE", value_parser = parse_size, allow_hyphen_values = true)]
    pub(crate) max: Option<u64>,
    /// rmm-random: the seed (default 1)
    #[arg(long, value_name = "S", value_parser = parse_whole, allow_hyphen_values = true)]
    pub(crate) seed: Option<u64>,
    /// where to write it, in torch-arena's trace format (gzipped if FILE ends in .gz)
    #[arg(short, long, value_name = "FILE", allow_hyphen_values = true)]
    pub(crate) output: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct MergeArgs {
    /// the per-rank JSON files, all of one kind: explain reports (torch_arena.explain(json=True)
    /// dumped) or leak reports (TORCH_ARENA_LEAK_REPORT's files, leak_report(format="json")
    /// dumped); each carries its "rank" and "world_size"
    #[arg(value_name = "FILE", required = true)]
    pub(crate) files: Vec<PathBuf>,
    /// the table as one JSON object, as explain(all_ranks=True, json=True) returns it
    ///
    /// Fields: kind (explain or leaks), world_size, columns, ranks (one object per rank: rank
    /// and each column), missing_ranks, stats (per column: max, max_rank, min, min_rank, mean,
    /// imbalance), imbalance (column, rank, ratio: the headline column's)
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct ConvertArgs {
    /// the trace to convert: a file or a synthetic spec (TRACE forms below)
    #[arg(value_name = "TRACE", value_parser = TraceArg::from_arg)]
    pub(crate) trace: Option<TraceArg>,
    /// where to write it, in torch-arena's trace format (gzipped if FILE ends in .gz)
    #[arg(short, long, value_name = "FILE", allow_hyphen_values = true)]
    pub(crate) output: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    /// run the modelled training loop itself through the arena and print per-step memory_stats
    /// figures and memory_summary
    ///
    /// Default 8 steps; CONF default device:sim; add trace:PATH to the CONF to record it
    #[arg(long)]
    pub(crate) model: bool,
    /// with --model: the steps to run (default 8); --steps implies --model
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32), allow_hyphen_values = true)]
    pub(crate) steps: Option<u32>,
    /// arena settings, as for replay (with --model, default device:sim)
    #[arg(long, value_name = "CONF", allow_hyphen_values = true)]
    pub(crate) conf: Option<String>,
    /// as for replay
    #[arg(long, value_name = "SIZE", value_parser = parse_capacity, allow_hyphen_values = true)]
    pub(crate) capacity: Option<u64>,
    /// as for replay (default 3: the table shows steady-state calls per step beside the native
    /// allocator's)
    #[arg(long, value_name = "N", value_parser = parse_repeat, allow_hyphen_values = true)]
    pub(crate) repeat: Option<u32>,
    /// as for replay
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, allow_hyphen_values = true)]
    pub(crate) gpu_lag: Option<u64>,
    /// as for replay
    #[arg(long, value_name = "FILE", allow_hyphen_values = true)]
    pub(crate) driver_costs: Option<String>,
    /// as for replay
    #[arg(long, value_name = "FILE", allow_hyphen_values = true)]
    pub(crate) plot: Option<String>,
    #[command(flatten)]
    pub(crate) progress: ProgressArgs,
    /// (a trace given to demo: refused, with the replay command that replays it)
    #[arg(hide = true, value_name = "TRACE")]
    pub(crate) unexpected: Vec<String>,
}

/// `--repeat N`: 1 to 1,000,000 passes.
pub(crate) fn parse_repeat(text: &str) -> CliResult<u32> {
    match parse_whole(text)? {
        n @ 1..=1_000_000 => Ok(n as u32),
        _ => Err("must be from 1 to 1000000 (passes over the trace)".into()),
    }
}

/// `-j, --jobs N`: 1 to 1024 worker threads.
pub(crate) fn parse_jobs(text: &str) -> CliResult<usize> {
    match parse_whole(text)? {
        n @ 1..=1024 => Ok(n as usize),
        _ => Err("must be from 1 to 1024 (worker threads)".into()),
    }
}

/// `--live=N`: at least one site (at most 2^20 shown).
pub(crate) fn parse_live(text: &str) -> CliResult<usize> {
    match parse_whole(text)? {
        0 => Err("show at least 1 site (--live=N, N >= 1)".into()),
        n => Ok(n.min(1 << 20) as usize),
    }
}

/// Parse the command line (without the program's name); clap's errors as they come.
pub(crate) fn parse_args(args: &[String]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("torch-arena".to_string()).chain(args.iter().cloned()))
}

/// The usage line of `sub` ("Usage: torch-arena replay [OPTIONS] [TRACE]..."), for the errors
/// the commands find themselves.
pub(crate) fn usage_of(sub: &str) -> String {
    let mut cmd = Cli::command();
    cmd.build();
    cmd.find_subcommand_mut(sub)
        .map(|c| c.render_usage().to_string())
        .unwrap_or_default()
}

/// The completion script of `shell`.
pub(crate) fn completions(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "torch-arena", &mut out);
    out
}
