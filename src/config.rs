//! `TORCH_ARENA_CONF`: every setting of torch-arena, its default, and the parser for PyTorch's
//! `PYTORCH_CUDA_ALLOC_CONF` grammar.
//!
//! This file owns the [`Config`] struct (read by the arena, the devices and the allocator), the
//! single table of accepted keys ([`accepted_keys`], which drives the parser, the error messages,
//! [`Config`]'s `Display` and the README), and the parser itself.
//!
//! # Grammar
//!
//! The same as PyTorch's `ConfigTokenizer` (`c10/core/AllocatorConfig.h`):
//!
//! ```text
//! conf  := "" | entry ("," entry)* [","]
//! entry := KEY ":" value
//! value := WORD | "[" [item ("," item)*] "]"
//! item  := WORD [":" WORD]
//! ```
//!
//! `,` `:` `[` `]` are single-character tokens; every other run of characters is a word; whitespace
//! is dropped wherever it appears (also inside a word, as PyTorch does). Booleans are exactly `True`
//! or `False`. An empty (or all-blank) string gives the defaults; one trailing comma is accepted.
//! No key takes a list yet, but lists are tokenized so that a list given to a scalar key is reported
//! as such, and unbalanced brackets are reported as such.
//!
//! Every error is an [`Error::Config`] whose text starts with where the text came from
//! (`TORCH_ARENA_CONF: ...`) and names the key, the value and the accepted forms. Parsing is all or
//! nothing: on an error no setting is applied.

use std::fmt;

use crate::error::{Error, Result};

/// Which device implementation backs the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cuda,
    Sim,
}

impl DeviceKind {
    /// The spelling in `TORCH_ARENA_CONF` (`cuda` or `sim`).
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cuda => "cuda",
            DeviceKind::Sim => "sim",
        }
    }
}

/// Which allocation sites are captured (`sites:none|python|native|all`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SitesMode {
    None,
    Python,
    Native,
    All,
}

impl SitesMode {
    /// The spelling in `TORCH_ARENA_CONF` and `torch_arena_set_sites`.
    pub fn as_str(self) -> &'static str {
        match self {
            SitesMode::None => "none",
            SitesMode::Python => "python",
            SitesMode::Native => "native",
            SitesMode::All => "all",
        }
    }

    /// `none`, `python`, `native` or `all`.
    pub fn parse(v: &str) -> Option<SitesMode> {
        Some(match v {
            "none" => SitesMode::None,
            "python" => SitesMode::Python,
            "native" => SitesMode::Native,
            "all" => SitesMode::All,
            _ => return None,
        })
    }
}

/// Every setting, with its default.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `device:cuda|sim` (default cuda).
    pub device: DeviceKind,
    /// `sim_capacity_mb:N`: capacity of each simulated device in MiB (default 81920 = 80 GiB).
    pub sim_capacity_mb: u64,
    /// `sim_backing:True|False`: back simulated pages with host memory (default False).
    pub sim_backing: bool,
    /// `sim_granularity_kb:N`: simulated allocation granularity in KiB, a power of two (default 2048).
    pub sim_granularity_kb: u64,
    /// `sim_vmm:True|False`: whether the simulated device supports VMM (default True).
    pub sim_vmm: bool,
    /// `sim_devices:N`: number of simulated devices (default 1).
    pub sim_devices: u32,
    /// `page_size_mb:N`: physical page size in MiB, a multiple of the granularity (default 2).
    /// The multiple-of-granularity check happens when the arena is created, not here.
    pub page_size_mb: u64,
    /// `handle_mb:N`: largest physical handle created for large blocks, in whole pages (rounded
    /// down, at least one); 0 (the default): one handle per contiguous run mapped.
    pub handle_mb: u64,
    /// `stitch:True|False`: move idle mapped pages to where they are needed when creating new ones
    /// would pass the limit; with False, only on the out-of-memory path (default True).
    pub stitch: bool,
    /// `release_idle_ms:N`: release cached pages idle longer than N ms to the driver; 0 = never.
    pub release_idle_ms: u64,
    /// `memory_fraction:F`: cap on reserved bytes as a fraction of device memory, in (0, 1].
    pub memory_fraction: f64,
    /// `slab_max_kb:N`: largest request served from size-class slabs, in KiB; larger requests
    /// take 512-byte-granular blocks of the page heap (default 1024 = PyTorch's small pool).
    pub slab_max_kb: u64,
    /// `trace:PATH`: record every alloc and free to this file (`{rank}`, `{pid}` expanded by the
    /// Python package); `None` = no recording.
    pub trace: Option<String>,
    /// `driver_costs:PATH`: latencies of the driver calls for the lab's cost model
    /// (`torch-arena replay`; see `src/device/costs.rs`); `None` = the defaults, measured on an
    /// H200.
    pub driver_costs: Option<String>,
    /// `sites:none|python|native|all|auto`: which allocation sites are captured; `None` = `auto`
    /// (not given: see [`Config::effective_sites`]).
    pub sites: Option<SitesMode>,
    /// `sites_every:N`: capture the site of one allocation in N (default 1).
    pub sites_every: u64,
    /// `sites_min_kb:N`: capture sites only for requests of at least N KiB (default 0).
    pub sites_min_kb: u64,
    /// `leaks:True|False`: the Python layer prints a leak report at exit (default False).
    pub leaks: bool,
    /// `leak_warmup:N`: steps ignored before growth counts (default 2).
    pub leak_warmup: u64,
    /// `leak_age:N`: also report live allocations older than N steps; 0 = off (default 0).
    pub leak_age: u64,
}

impl Config {
    /// The site mode in effect: `sites` when given, else `python` with `leaks:True`, else `none`.
    pub fn effective_sites(&self) -> SitesMode {
        match self.sites {
            Some(m) => m,
            None if self.leaks => SitesMode::Python,
            None => SitesMode::None,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            device: DeviceKind::Cuda,
            sim_capacity_mb: 80 * 1024,
            sim_backing: false,
            sim_granularity_kb: 2048,
            sim_vmm: true,
            sim_devices: 1,
            page_size_mb: 2,
            handle_mb: 0,
            stitch: true,
            release_idle_ms: 0,
            memory_fraction: 1.0,
            slab_max_kb: 1024,
            trace: None,
            driver_costs: None,
            sites: None,
            sites_every: 1,
            sites_min_kb: 0,
            leaks: false,
            leak_warmup: 2,
            leak_age: 0,
        }
    }
}

/// Where `Config::parse` says its text came from.
pub const ENV_VAR: &str = "TORCH_ARENA_CONF";

/// One accepted key: its name, its one-line help (with the default), how to apply a value and how
/// to print the current one back.
struct KeyDef {
    name: &'static str,
    help: &'static str,
    /// The accepted forms of a value, as error messages name them ("True or False").
    forms: &'static str,
    /// Applies a scalar value; `None` if the value is not one of the accepted forms.
    set: fn(&mut Config, &str) -> Option<()>,
    /// The value of this key in `conf`, in a form `set` accepts.
    show: fn(&Config) -> String,
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "True" => Some(true),
        "False" => Some(false),
        _ => None,
    }
}

fn show_bool(b: bool) -> String {
    if b { "True" } else { "False" }.to_string()
}

/// A plain decimal integer: digits only (no sign, no underscores, no exponent).
/// Largest simulated device: 1 PiB, so capacities in bytes never wrap.
pub const MAX_SIM_CAPACITY_MB: u64 = 1 << 30;
/// Largest physical page: 1 GiB.
pub const MAX_PAGE_SIZE_MB: u64 = 1024;
/// CUDA's allocation granularity for device memory on every NVIDIA GPU that supports VMM.
pub const CUDA_GRANULARITY_MB: u64 = 2;
/// Longest piece of user text an error message repeats.
const ECHO_MAX: usize = 80;

/// `text` as an error message repeats it: at most [`ECHO_MAX`] bytes, then how long it was.
pub fn clip(text: &str) -> String {
    if text.len() <= ECHO_MAX {
        return text.to_string();
    }
    let mut n = ECHO_MAX;
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    format!("{}... ({} bytes in all)", &text[..n], text.len())
}

/// A fraction as a person reads it: `0.25`, `1`, and `1e-300` rather than 300 digits.
pub fn show_fraction(f: f64) -> String {
    let plain = f.to_string();
    if plain.len() <= 12 {
        plain
    } else {
        format!("{f:e}")
    }
}

fn parse_uint(v: &str) -> Option<u64> {
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

/// The keys, in the order they are listed and printed. Keys are defined here and nowhere else.
const KEY_DEFS: [KeyDef; 20] = [
    KeyDef {
        name: "device",
        help: "device implementation: cuda (the GPU, through the CUDA driver) or sim (a simulated \
               GPU) (default cuda)",
        forms: "cuda or sim",
        set: |c, v| {
            c.device = match v {
                "cuda" => DeviceKind::Cuda,
                "sim" => DeviceKind::Sim,
                _ => return None,
            };
            Some(())
        },
        show: |c| c.device.as_str().to_string(),
    },
    KeyDef {
        name: "sim_capacity_mb",
        help: "capacity of each simulated device in MiB, an integer from 1 to 1073741824 \
               (1 PiB) (default 81920)",
        forms: "an integer from 1 to 1073741824 (MiB)",
        set: |c, v| {
            c.sim_capacity_mb =
                parse_uint(v).filter(|&n| (1..=MAX_SIM_CAPACITY_MB).contains(&n))?;
            Some(())
        },
        show: |c| c.sim_capacity_mb.to_string(),
    },
    KeyDef {
        name: "sim_backing",
        help: "back simulated pages with host memory, True or False (default False)",
        forms: "True or False",
        set: |c, v| {
            c.sim_backing = parse_bool(v)?;
            Some(())
        },
        show: |c| show_bool(c.sim_backing),
    },
    KeyDef {
        name: "sim_granularity_kb",
        help: "simulated allocation granularity in KiB, a power of two >= 4 (default 2048)",
        forms: "a power of two >= 4 (KiB), such as 4, 64 or 2048",
        set: |c, v| {
            c.sim_granularity_kb = parse_uint(v).filter(|&n| n >= 4 && n.is_power_of_two())?;
            Some(())
        },
        show: |c| c.sim_granularity_kb.to_string(),
    },
    KeyDef {
        name: "sim_vmm",
        help: "whether the simulated device supports VMM, True or False (default True)",
        forms: "True or False",
        set: |c, v| {
            c.sim_vmm = parse_bool(v)?;
            Some(())
        },
        show: |c| show_bool(c.sim_vmm),
    },
    KeyDef {
        name: "sim_devices",
        help: "number of simulated devices, an integer from 1 to 64 (default 1)",
        forms: "an integer from 1 to 64",
        set: |c, v| {
            c.sim_devices = parse_uint(v).filter(|n| (1..=64).contains(n))? as u32;
            Some(())
        },
        show: |c| c.sim_devices.to_string(),
    },
    KeyDef {
        name: "page_size_mb",
        help: "physical page size in MiB, an integer from 1 to 1024 and a multiple of the \
               device's granularity: 2 MiB on every CUDA GPU, sim_granularity_kb on the \
               simulated one (default 2)",
        forms: "an integer from 1 to 1024 (MiB), a multiple of the granularity (2 on CUDA GPUs)",
        set: |c, v| {
            c.page_size_mb = parse_uint(v).filter(|&n| (1..=MAX_PAGE_SIZE_MB).contains(&n))?;
            Some(())
        },
        show: |c| c.page_size_mb.to_string(),
    },
    KeyDef {
        name: "handle_mb",
        help: "largest physical handle in MiB created for large blocks (one cuMemCreate and one \
               cuMemMap each), an integer from 1 to 1024, in whole pages (rounded down, at least \
               one page), or 0 for one handle per contiguous run of pages mapped: larger handles \
               mean fewer driver calls, smaller ones let freed memory move between ranges more \
               finely without releasing it (default 0)",
        forms: "0, or an integer from 1 to 1024 (MiB)",
        set: |c, v| {
            c.handle_mb = parse_uint(v).filter(|&n| n <= MAX_PAGE_SIZE_MB)?;
            Some(())
        },
        show: |c| c.handle_mb.to_string(),
    },
    KeyDef {
        name: "stitch",
        help: "move idle mapped pages to where they are needed when creating new ones would \
               pass the memory limit (with False, only on the out-of-memory path), True or False \
               (default True)",
        forms: "True or False",
        set: |c, v| {
            c.stitch = parse_bool(v)?;
            Some(())
        },
        show: |c| show_bool(c.stitch),
    },
    KeyDef {
        name: "release_idle_ms",
        help: "release cached pages idle longer than this many ms to the driver, an integer >= 0; \
               0 = never (default 0)",
        forms: "an integer >= 0 (milliseconds; 0 = never)",
        set: |c, v| {
            c.release_idle_ms = parse_uint(v)?;
            Some(())
        },
        show: |c| c.release_idle_ms.to_string(),
    },
    KeyDef {
        name: "memory_fraction",
        help: "cap on reserved bytes as a fraction of device memory, a number in (0, 1] \
               (default 1)",
        forms: "a number in (0, 1], such as 0.5",
        set: |c, v| {
            // Decimal notation only: Rust's float syntax less its words (inf, nan).
            let numeric = v
                .bytes()
                .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b));
            c.memory_fraction = v
                .parse::<f64>()
                .ok()
                .filter(|f| numeric && *f > 0.0 && *f <= 1.0)?;
            Some(())
        },
        show: |c| show_fraction(c.memory_fraction),
    },
    KeyDef {
        name: "slab_max_kb",
        help: "largest request served from size-class slabs in KiB, a power of two from 4 to \
               1024; larger ones take 512-byte blocks of the page heap (default 1024)",
        forms: "a power of two from 4 to 1024 (KiB)",
        set: |c, v| {
            c.slab_max_kb =
                parse_uint(v).filter(|&n| (4..=1024).contains(&n) && n.is_power_of_two())?;
            Some(())
        },
        show: |c| c.slab_max_kb.to_string(),
    },
    KeyDef {
        name: "trace",
        help: "record every alloc and free of this process to this file, in the torch-arena-trace \
               format; {rank} and {pid} are replaced (default: no recording)",
        forms: "a file path without ',', ':', '[' or ']', such as /tmp/run-{rank}.trace",
        set: |c, v| {
            c.trace = Some(v.to_string()).filter(|p| !p.is_empty());
            c.trace.as_ref().map(|_| ())
        },
        show: |c| c.trace.clone().unwrap_or_default(),
    },
    KeyDef {
        name: "driver_costs",
        help: "torch-arena replay only: a file of driver call latencies (NAME = MICROSECONDS per \
               line) that prices the simulated device's calls (default: the figures measured \
               on an H200)",
        forms: "a file path without ',', ':', '[' or ']'",
        set: |c, v| {
            c.driver_costs = Some(v.to_string()).filter(|p| !p.is_empty());
            c.driver_costs.as_ref().map(|_| ())
        },
        show: |c| c.driver_costs.clone().unwrap_or_default(),
    },
    KeyDef {
        name: "sites",
        help: "allocation sites to capture: none, python (Python file, line and function), \
               native (instruction pointers, symbolised in reports), all, or auto (python with \
               leaks:True, else none) (default auto)",
        forms: "none, python, native, all or auto",
        set: |c, v| {
            c.sites = match v {
                "auto" => None,
                v => Some(SitesMode::parse(v)?),
            };
            Some(())
        },
        show: |c| c.sites.map_or("auto", SitesMode::as_str).to_string(),
    },
    KeyDef {
        name: "sites_every",
        help: "capture the site of one allocation in N, an integer >= 1 (default 1)",
        forms: "an integer >= 1",
        set: |c, v| {
            c.sites_every = parse_uint(v).filter(|&n| n >= 1)?;
            Some(())
        },
        show: |c| c.sites_every.to_string(),
    },
    KeyDef {
        name: "sites_min_kb",
        help: "capture sites only for requests of at least this many KiB, an integer >= 0 \
               (default 0)",
        forms: "an integer >= 0 (KiB)",
        set: |c, v| {
            c.sites_min_kb = parse_uint(v)?;
            Some(())
        },
        show: |c| c.sites_min_kb.to_string(),
    },
    KeyDef {
        name: "leaks",
        help: "print a leak report (sites that grow from step to step) at exit, True or False \
               (default False)",
        forms: "True or False",
        set: |c, v| {
            c.leaks = parse_bool(v)?;
            Some(())
        },
        show: |c| show_bool(c.leaks),
    },
    KeyDef {
        name: "leak_warmup",
        help: "steps ignored before growth counts as a leak, an integer >= 0 (default 2)",
        forms: "an integer >= 0 (steps)",
        set: |c, v| {
            c.leak_warmup = parse_uint(v)?;
            Some(())
        },
        show: |c| c.leak_warmup.to_string(),
    },
    KeyDef {
        name: "leak_age",
        help: "also report live allocations older than this many steps, an integer >= 0; 0 = off \
               (default 0)",
        forms: "an integer >= 0 (steps; 0 = off)",
        set: |c, v| {
            c.leak_age = parse_uint(v)?;
            Some(())
        },
        show: |c| c.leak_age.to_string(),
    },
];

static ACCEPTED_KEYS: [(&str, &str); KEY_DEFS.len()] = {
    let mut out = [("", ""); KEY_DEFS.len()];
    let mut i = 0;
    while i < KEY_DEFS.len() {
        out[i] = (KEY_DEFS[i].name, KEY_DEFS[i].help);
        i += 1;
    }
    out
};

/// Every key `TORCH_ARENA_CONF` accepts, in order, with a one-line description that ends with the
/// default, e.g. `("stitch", "move idle mapped pages ..., True or False (default True)")`.
/// This is the table the parser checks keys against; the README prints it.
pub fn accepted_keys() -> &'static [(&'static str, &'static str)] {
    &ACCEPTED_KEYS
}

/// A token of the grammar: one of `, : [ ]`, or a word (whitespace already dropped).
#[derive(Clone, Debug, PartialEq)]
enum Token {
    Comma,
    Colon,
    Open,
    Close,
    Word(String),
}

impl Token {
    fn text(&self) -> &str {
        match self {
            Token::Comma => ",",
            Token::Colon => ":",
            Token::Open => "[",
            Token::Close => "]",
            Token::Word(w) => w,
        }
    }
}

/// PyTorch's `ConfigTokenizer`: separators are tokens of their own, whitespace vanishes.
fn tokenize(text: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut word = String::new();
    for ch in text.chars() {
        let sep = match ch {
            ',' => Some(Token::Comma),
            ':' => Some(Token::Colon),
            '[' => Some(Token::Open),
            ']' => Some(Token::Close),
            _ => None,
        };
        match sep {
            Some(t) => {
                if !word.is_empty() {
                    out.push(Token::Word(std::mem::take(&mut word)));
                }
                out.push(t);
            }
            None if ch.is_whitespace() => {}
            None => word.push(ch),
        }
    }
    if !word.is_empty() {
        out.push(Token::Word(word));
    }
    out
}

/// A parsed value: a word, or a list as written (`[a:b,c:d]`, whitespace dropped).
/// A value as written: one word, or a bracketed list kept as its text (`[a:b,c:d]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Scalar(String),
    List(String),
}

impl Value {
    pub fn text(&self) -> &str {
        match self {
            Value::Scalar(s) | Value::List(s) => s,
        }
    }
}

/// The parser: tokens in, `(key, value)` entries out, with errors that say where they came from.
struct Parser<'a> {
    source: &'a str,
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, msg: impl fmt::Display) -> Error {
        Error::Config(format!("{}: {msg}", self.source))
    }

    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn entries(&mut self) -> Result<Vec<(String, Value)>> {
        let mut out = Vec::new();
        while self.peek().is_some() {
            let key = match self.next() {
                Some(Token::Word(k)) => k,
                Some(Token::Comma) => {
                    return Err(self.err(format_args!(
                        "empty entry: expected key:value before ','{}",
                        after_key(out.last())
                    )));
                }
                Some(Token::Colon) => {
                    return Err(self.err(format_args!(
                        "missing key before ':'{}; expected key:value",
                        after_key(out.last())
                    )));
                }
                Some(Token::Close) => {
                    return Err(self.err(format_args!(
                        "unbalanced brackets: ']' without a matching '['{}",
                        after_key(out.last())
                    )));
                }
                Some(Token::Open) => {
                    return Err(self.err(format_args!(
                        "unexpected '[' where a key was expected{}; lists are only values, as in \
                         key:[a:b,c:d]",
                        after_key(out.last())
                    )));
                }
                None => unreachable!("peeked"),
            };
            match self.next() {
                Some(Token::Colon) => {}
                Some(t) => {
                    return Err(self.err(format_args!(
                        "missing ':' after key '{key}' (found '{}'); expected {key}:value",
                        t.text()
                    )));
                }
                None => {
                    return Err(self.err(format_args!(
                        "missing ':' after key '{key}'; expected {key}:value"
                    )));
                }
            }
            let value = match self.next() {
                Some(Token::Word(w)) => Value::Scalar(w),
                Some(Token::Open) => Value::List(self.list(&key)?),
                Some(Token::Close) => {
                    return Err(self.err(format_args!(
                        "unbalanced brackets: ']' without a matching '[' in the value of key '{key}'"
                    )));
                }
                Some(Token::Comma) | None => {
                    return Err(self.err(format_args!(
                        "missing value after '{key}:'; expected {key}:value"
                    )));
                }
                Some(Token::Colon) => {
                    return Err(self.err(format_args!(
                        "missing value between '{key}:' and ':'; expected {key}:value"
                    )));
                }
            };
            match self.next() {
                None | Some(Token::Comma) => {}
                Some(Token::Close) => {
                    return Err(self.err(format_args!(
                        "unbalanced brackets: ']' without a matching '[' after the value '{}' of \
                         key '{key}'",
                        value.text()
                    )));
                }
                Some(t) => {
                    return Err(self.err(format_args!(
                        "unexpected '{}' after the value '{}' of key '{key}'; entries are \
                         separated by ',' as in key:value,key:value",
                        t.text(),
                        value.text()
                    )));
                }
            }
            out.push((key, value));
        }
        Ok(out)
    }

    /// The rest of a list after its `[`: `item (, item)* ]`, returned as written.
    fn list(&mut self, key: &str) -> Result<String> {
        let mut text = String::from("[");
        loop {
            match self.next() {
                Some(Token::Close) => {
                    text.push(']');
                    return Ok(text);
                }
                Some(Token::Open) => {
                    return Err(self.err(format_args!(
                        "unbalanced brackets: nested '[' in the value of key '{key}' ('{text}['); \
                         lists are flat, as in {key}:[a:b,c:d]"
                    )));
                }
                Some(t) => text.push_str(t.text()),
                None => {
                    return Err(self.err(format_args!(
                        "unbalanced brackets: '[' opened in the value of key '{key}' ('{text}') is \
                         never closed; expected {key}:[a:b,c:d]"
                    )));
                }
            }
        }
    }
}

/// ` (after key:value)` naming the last good entry, to place an error that has no key of its own.
fn after_key(last: Option<&(String, Value)>) -> String {
    match last {
        Some((k, v)) => format!(" (after {}:{})", clip(k), clip(v.text())),
        None => String::new(),
    }
}

/// Levenshtein distance, for "did you mean" suggestions (here and in the `torch-arena` command).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let sub = diag + usize::from(ca != cb);
            diag = row[j + 1];
            row[j + 1] = sub.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// The accepted key closest to `key`, if it is close enough to be a typo.
fn suggest(key: &str) -> Option<&'static str> {
    let lower = key.to_ascii_lowercase();
    KEY_DEFS
        .iter()
        .map(|k| (edit_distance(&lower, k.name), k.name))
        .filter(|&(d, name)| d <= 3 && d * 3 <= name.len().max(lower.len()))
        .min_by_key(|&(d, _)| d)
        .map(|(_, name)| name)
}

/// The `key:value` entries of settings text in `PYTORCH_CUDA_ALLOC_CONF`'s grammar (the module
/// docs), in order, unchecked against any key table: for other settings written in the same
/// grammar (the native emulation's `--native-conf`). Errors start with `source: `.
pub fn entries(source: &str, text: &str) -> Result<Vec<(String, Value)>> {
    Parser {
        source,
        tokens: tokenize(text),
        pos: 0,
    }
    .entries()
}

impl Config {
    /// Parse `TORCH_ARENA_CONF` text. Empty or blank text gives [`Config::default`]; keys not given
    /// keep their defaults. Errors start with `TORCH_ARENA_CONF: `.
    pub fn parse(text: &str) -> Result<Config> {
        Self::parse_from(ENV_VAR, text)
    }

    /// Parse settings text that came from `source` (a name put at the start of every error, such as
    /// `TORCH_ARENA_CONF` or `torch_arena.configure()`).
    pub fn parse_from(source: &str, text: &str) -> Result<Config> {
        let mut parser = Parser {
            source,
            tokens: tokenize(text),
            pos: 0,
        };
        let entries = parser.entries()?;
        let mut conf = Config::default();
        let mut seen: Vec<(&str, &str)> = Vec::new();
        for (key, value) in &entries {
            let Some(def) = KEY_DEFS.iter().find(|d| d.name == key) else {
                let hint = suggest(key)
                    .map(|s| format!(" (did you mean '{s}'?)"))
                    .unwrap_or_default();
                let names: Vec<&str> = KEY_DEFS.iter().map(|d| d.name).collect();
                return Err(parser.err(format_args!(
                    "unknown key '{}'{hint}; accepted keys: {}",
                    clip(key),
                    names.join(", ")
                )));
            };
            if let Some((_, first)) = seen.iter().find(|(k, _)| *k == key) {
                return Err(parser.err(format_args!(
                    "duplicate key '{key}': given as '{}' and again as '{}'; give each key once",
                    clip(first),
                    clip(value.text())
                )));
            }
            seen.push((key, value.text()));
            match value {
                Value::Scalar(v) => (def.set)(&mut conf, v).ok_or_else(|| {
                    parser.err(format_args!(
                        "bad value '{}' for key '{key}': expected {}",
                        clip(v),
                        def.forms
                    ))
                })?,
                Value::List(v) => {
                    return Err(parser.err(format_args!(
                        "bad value '{}' for key '{key}': '{key}' takes a single value, not a \
                         list; expected {}",
                        clip(v),
                        def.forms
                    )));
                }
            }
        }
        conf.check_page_size().map_err(|m| parser.err(m))?;
        Ok(conf)
    }

    /// The page size must be a multiple of the device's granularity, known from the settings
    /// alone: 2 MiB on CUDA GPUs, `sim_granularity_kb` on the simulated one. Checked here so a
    /// bad value fails when the allocator is installed, not at the first allocation.
    fn check_page_size(&self) -> std::result::Result<(), String> {
        let (granularity_kb, what) = match self.device {
            DeviceKind::Cuda => (
                CUDA_GRANULARITY_MB << 10,
                "CUDA GPUs allocate in 2 MiB units",
            ),
            DeviceKind::Sim => (
                self.sim_granularity_kb,
                "the simulated device's granularity is sim_granularity_kb",
            ),
        };
        if !(self.page_size_mb << 10).is_multiple_of(granularity_kb) {
            return Err(format!(
                "page_size_mb:{} is not a multiple of the allocation granularity ({granularity_kb} \
                 KiB: {what}); use a multiple of {} MiB",
                self.page_size_mb,
                granularity_kb.div_ceil(1024)
            ));
        }
        Ok(())
    }
}

/// Every key, in [`accepted_keys`] order, as `key:value,key:value`: text that [`Config::parse`]
/// reads back to an equal `Config`.
impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, def) in KEY_DEFS.iter().enumerate() {
            let value = (def.show)(self);
            if value.is_empty() {
                continue; // unset optional key (trace): nothing to print back
            }
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{}:{}", def.name, value)?;
        }
        Ok(())
    }
}

impl Config {
    /// The simulated device `ordinal` these settings describe (`sim_capacity_mb`,
    /// `sim_granularity_kb`, `sim_backing`, `sim_vmm`).
    pub fn sim_config(&self, ordinal: i32) -> crate::device::sim::SimConfig {
        crate::device::sim::SimConfig {
            ordinal,
            // At most 1 PiB (the parser's bound), so this cannot wrap.
            capacity: self.sim_capacity_mb.saturating_mul(1 << 20),
            granularity: self.sim_granularity_kb << 10,
            backing: self.sim_backing,
            vmm: self.sim_vmm,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_matches_pytorch() {
        let t = tokenize(" a : [b:1, c] ,d e:Tr ue ");
        let words: Vec<&str> = t.iter().map(Token::text).collect();
        assert_eq!(
            words,
            [
                "a", ":", "[", "b", ":", "1", ",", "c", "]", ",", "de", ":", "True"
            ]
        );
    }

    #[test]
    fn edit_distance_basics() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("sim_capacty_mb", "sim_capacity_mb"), 1);
        assert_eq!(suggest("Stitch"), Some("stitch"));
        assert_eq!(suggest("zzz"), None);
    }
}
