//! `torch-arena synth`: write a synthetic trace.

use std::path::PathBuf;

use crate::convert::write_trace;
use crate::out::CliResult;

use crate::args::{ArgCursor, Item, SynthSpec, parse_capacity, parse_count, parse_size};
use crate::text::{fmt_bytes, fmt_count};
use crate::usage::{DEFAULT_CAPACITY, DEFAULT_SEED, SYNTH_SYNOPSIS, USAGE};

pub(crate) const SYNTH_OPTIONS: &[&str] = &[
    "--capacity",
    "--n",
    "--max",
    "--seed",
    "--output",
    "-o",
    "--help",
];

pub(crate) fn synth_command(args: &[String]) -> CliResult<u8> {
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
                return out!("{USAGE}").map(|()| 0);
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
    outln!(
        "wrote {}: {} events, peak requested {}",
        out.display(),
        fmt_count(trace.events.len() as u64),
        fmt_bytes(trace.peak_requested())
    )?;
    Ok(0)
}
