//! `TORCH_ARENA_CONF`: every setting of torch-arena, its default, and the parser for PyTorch's
//! `PYTORCH_CUDA_ALLOC_CONF` grammar.
//!
//! This module owns the [`Config`] struct (`settings.rs`: read by the arena, the devices and the
//! allocator), the single table of accepted keys (`keys.rs`, [`accepted_keys`], which drives the
//! parser, the error messages, [`Config`]'s `Display` and the README), the parser (`grammar.rs`),
//! and, here, the parse of a whole text into a [`Config`].
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
//! Every error is an [`Error::Config`](crate::Error::Config) whose text starts with where the text
//! came from (`TORCH_ARENA_CONF: ...`) and names the key, the value and the accepted forms. Parsing
//! is all or nothing: on an error no setting is applied.

use std::fmt;

use crate::error::Result;

mod grammar;
mod keys;
mod settings;

use grammar::{Parser, suggest, tokenize};
pub use grammar::{Value, edit_distance, entries};
use keys::KEY_DEFS;
pub use keys::{
    CUDA_GRANULARITY_MB, ENV_VAR, MAX_PAGE_SIZE_MB, MAX_SIM_CAPACITY_MB, accepted_keys, clip,
    show_fraction,
};
pub use settings::{Config, DeviceKind, SitesMode};

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
        conf.check_cpu_tensors().map_err(|m| parser.err(m))?;
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

impl Config {
    /// `cpu_tensors:True` puts CPU tensors, which the program reads and writes, in the simulated
    /// device's memory: that memory must exist (`sim_backing:True`) and be the simulated
    /// device's (`device:sim`; on a GPU a CPU tensor cannot live in device memory).
    fn check_cpu_tensors(&self) -> std::result::Result<(), String> {
        if !self.cpu_tensors {
            return Ok(());
        }
        let mut missing = Vec::new();
        if self.device != DeviceKind::Sim {
            missing.push("device:sim");
        }
        if !self.sim_backing {
            missing.push("sim_backing:True");
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(format!(
            "cpu_tensors:True needs device:sim and sim_backing:True, and this configuration lacks \
             {}: CPU tensors are put in the simulated device's memory, which the program reads \
             and writes, so it must be the simulated device's and backed by host memory; add {}, \
             or drop cpu_tensors",
            missing.join(" and "),
            missing.join(",")
        ))
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
