//! `torch-arena convert`: any trace into torch-arena's trace format.

use std::path::{Path, PathBuf};

use torch_arena_lab::Trace;

use crate::out::CliResult;

use crate::args::{ArgCursor, Item, TraceArg};
use crate::text::{fmt_bytes, fmt_count};
use crate::usage::{CONVERT_SYNOPSIS, USAGE};

/// `torch-arena convert TRACE -o FILE`.
pub(crate) fn convert_command(args: &[String]) -> CliResult<u8> {
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
                    out!("{USAGE}")?;
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
    outln!(
        "wrote {}: the {} trace {input}, {} events ({} seeded), peak requested {}",
        out.display(),
        trace.kind.as_str(),
        fmt_count(trace.events.len() as u64),
        fmt_count(trace.seeded as u64),
        fmt_bytes(trace.peak_requested())
    )?;
    Ok(0)
}

/// Write `trace` in torch-arena's trace format.
pub(crate) fn write_trace(trace: &Trace, path: &Path) -> CliResult<()> {
    torch_arena_lab::format::write(trace, path).map_err(|e| e.to_string())
}
