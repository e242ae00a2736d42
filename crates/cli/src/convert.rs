//! `torch-arena convert`: any trace into torch-arena's trace format.

use std::path::Path;

use torch_arena_lab::Trace;

use crate::out::CliResult;

use crate::args::{ConvertArgs, usage_of};
use crate::text::{fmt_bytes, fmt_count};

/// `torch-arena convert TRACE -o FILE`.
pub(crate) fn convert_command(a: ConvertArgs) -> CliResult<u8> {
    let Some(input) = a.trace else {
        return Err(format!("convert: which trace?\n{}", usage_of("convert")));
    };
    let Some(out) = a.output else {
        return Err(format!(
            "convert: -o FILE is required (where to write the trace)\n{}",
            usage_of("convert")
        ));
    };
    input.check()?;
    let trace = input.load()?;
    write_trace(&trace, &out)?;
    outln!(
        "wrote {}: the {} trace {}, {} events ({} seeded), peak requested {}",
        out.display(),
        trace.kind.as_str(),
        input.text(),
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
