//! Command-line parsing: options and values, sizes and durations, and the traces named on
//! the command line (files, synthetic specs, the built-in demo trace).

use std::path::{Path, PathBuf};

use torch_arena_lab as tr;
use torch_arena_lab::Trace;
use torch_arena_lab::native::NativeOptions;
use torch_arena_lab::synth as lib_synth;

use crate::out::CliResult;
use crate::usage::DEFAULT_SEED;

/// One command-line item: an option (with a value given as `--opt=value`) or a positional.
pub(crate) enum Item {
    Opt(String, Option<String>),
    Positional(String),
}

/// A cursor over a command's arguments. `--opt value` and `--opt=value` both work; `--` ends the
/// options.
pub(crate) struct ArgCursor<'a> {
    pub(crate) args: &'a [String],
    pub(crate) pos: usize,
    pub(crate) only_positional: bool,
    /// The command, for messages ("replay").
    pub(crate) cmd: &'static str,
    pub(crate) synopsis: &'static str,
    /// The options of this command, for "did you mean" hints.
    pub(crate) known: &'static [&'static str],
}

impl<'a> ArgCursor<'a> {
    pub(crate) fn new(
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

    pub(crate) fn next_item(&mut self) -> Option<Item> {
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
    pub(crate) fn value(&mut self, name: &str, inline: Option<String>) -> CliResult<String> {
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
    pub(crate) fn flag(&self, name: &str, inline: Option<String>) -> CliResult<()> {
        match inline {
            None => Ok(()),
            Some(v) => Err(format!(
                "{}: {name} takes no value (given '{name}={v}')",
                self.cmd
            )),
        }
    }

    pub(crate) fn unknown(&self, name: &str) -> String {
        let hint = self
            .known
            .iter()
            .map(|k| (torch_arena::config::edit_distance(name, k), *k))
            .filter(|&(d, _)| d <= 2)
            .min_by_key(|&(d, _)| d)
            .map(|(_, k)| k)
            // A known option the name begins (`--native` for `--native-conf`).
            .or_else(|| {
                let starting: Vec<&str> = self
                    .known
                    .iter()
                    .copied()
                    .filter(|k| k.starts_with(name))
                    .collect();
                (name.len() > 2 && starting.len() == 1).then(|| starting[0])
            })
            .map(|k| format!(" (did you mean '{k}'?)"))
            .unwrap_or_default();
        format!(
            "{}: unknown option '{name}'{hint}\n{}\n(torch-arena help: every option)",
            self.cmd, self.synopsis
        )
    }
}

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

pub(crate) fn parse_capacity(text: &str) -> CliResult<u64> {
    let c = parse_size(text).map_err(|e| format!("--capacity: {e}"))?;
    if c == 0 {
        return Err("--capacity: must be more than 0 bytes".into());
    }
    Ok(c)
}

/// A whole number, `_` allowed as a separator (`100_000`).
pub(crate) fn parse_count(what: &str, text: &str) -> CliResult<u64> {
    text.replace('_', "")
        .parse()
        .map_err(|_| format!("{what}: '{text}' is not a whole number"))
}

/// Parse a duration such as `0`, `500us`, `5ms`, `1.5s` into nanoseconds.
pub(crate) fn parse_duration(what: &str, text: &str) -> CliResult<u64> {
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
    /// Check the argument before any work: a synthetic spec parses, a file exists and is a file.
    pub(crate) fn parse(text: &str) -> CliResult<TraceArg> {
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
