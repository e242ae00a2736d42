//! Read any supported trace file, choosing the importer from its content.
//!
//! A gzip file is inflated as a stream under [`super::pickle::inflate_budget`]: the format is sniffed
//! from the first [`SNIFF_BYTES`] inflated bytes, so a stream that is not a trace is
//! refused after a few KB, and one that inflates beyond its budget is refused when it crosses it
//! (a 4 MB bomb after at most 264 MB, not 4 GiB). Our own text format is then parsed as a stream;
//! pickles and RMM logs are read whole (within the budget) and parsed from memory.

use std::io::{BufRead, BufReader, Cursor, Read};
use std::path::Path;

use crate::input::{open_sized, read_err};
use crate::model::Trace;
use crate::pickle::SNIFF_BYTES;
use torch_arena::error::{Error, Result};

/// What `load` accepts, for error messages.
const ACCEPTED: &str = "accepted formats: a torch-arena trace (first line 'torch-arena-trace ...'), \
                        a PyTorch memory snapshot pickle from torch.cuda.memory._dump_snapshot() \
                        (protocol 2+: starts with byte 0x80), an RMM logging_resource_adaptor CSV log (header \
                        'Thread,Time,Action,Pointer,Size,Stream'); each may be gzip-compressed";

/// Load `path`: a torch-arena trace (`.gz` too), a PyTorch snapshot pickle (`.gz` too), or an RMM
/// CSV log. The format is decided by the content, not the name: gzip magic bytes → inflate as a
/// stream first; a pickle (`PROTO` opcode 0x80, or a protocol 0/1 dict, list or global ending in
/// `STOP`) → PyTorch snapshot; `Thread,Time,Action` → RMM CSV; `torch-arena-trace` → our own
/// format. Errors name the file and, for corrupt input, the byte offset or line.
///
/// A `torch-arena-trace` recording that was cut off is read up to its last complete line, and a
/// warning saying what was dropped is logged ([`load_with_warnings`] returns it instead).
pub fn load(path: &Path) -> Result<Trace> {
    let (trace, warnings) = load_with_warnings(path)?;
    super::format::log_warnings(&warnings);
    Ok(trace)
}

/// [`load`], and the warnings about what a reader dropped (the incomplete end of a recording cut
/// off), for the caller to show.
pub fn load_with_warnings(path: &Path) -> Result<(Trace, Vec<String>)> {
    let name = path.display().to_string();
    let (mut input, most) = open_sized(path)?;
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    // A gzip stream cut short within its first bytes: keep what it held (a recording cut off
    // early is still read up to its last complete line), and hand the reader the same error.
    let mut cut = None;
    if let Err(e) = (&mut input).take(SNIFF_BYTES as u64).read_to_end(&mut head) {
        if e.kind() != std::io::ErrorKind::UnexpectedEof {
            return Err(read_err(&name, e));
        }
        cut = Some(e);
    }
    let text_start = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&head);
    if text_start.starts_with(b"torch-arena-trace") {
        let chained: Box<dyn BufRead> = match cut {
            Some(e) => Box::new(Cursor::new(head).chain(BufReader::new(Failing(Some(e))))),
            None => Box::new(Cursor::new(head).chain(input)),
        };
        return super::format::read_from(path, chained);
    }
    if let Some(e) = cut {
        return Err(read_err(&name, e));
    }
    let is_rmm = text_start.starts_with(b"Thread,Time,Action");
    if !is_rmm && !may_be_pickle(&head) {
        return Err(not_a_trace(&name, &head));
    }
    let mut data = head;
    // Reserve address space for the whole budget (pages are touched only as bytes arrive), so
    // growing never copies: a refused bomb costs the bytes it inflated, not twice as many.
    data.reserve((most.min(1 << 30) as usize).saturating_sub(data.len()));
    input
        .read_to_end(&mut data)
        .map_err(|e| read_err(&name, e))?;
    let trace = if is_rmm {
        let text_start = data.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&data);
        super::rmm::from_bytes(&name, text_start)
    } else if is_pickle(&data) {
        super::torch_snapshot::from_bytes(&name, &data)
    } else {
        Err(not_a_trace(&name, &data))
    };
    trace.map(|t| (t, Vec::new()))
}

/// A reader that fails once with the error it holds, then reads as empty.
struct Failing(Option<std::io::Error>);

impl Read for Failing {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        self.0.take().map_or(Ok(0), Err)
    }
}

fn not_a_trace(name: &str, data: &[u8]) -> Error {
    let shown: String = data
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    Error::Trace(format!(
        "{name}: not a trace format torch-arena knows (first bytes: {shown}); {ACCEPTED}"
    ))
}

/// From its first bytes, could this be a pickle? Protocol 2+ starts with `PROTO` (0x80);
/// protocols 0 and 1 have no header: their usual first opcodes for a snapshot are `(`, `}`, `]`
/// (a dict or list) or `c` (a GLOBAL, `collections.OrderedDict`, whose module name follows on
/// its own line).
fn may_be_pickle(head: &[u8]) -> bool {
    match head.first() {
        Some(0x80 | b'(' | b'}' | b']') => true,
        Some(b'c') => {
            let line = head[1..].split(|&b| b == b'\n').next().unwrap_or(&[]);
            line.len() < head.len() - 1
                && !line.is_empty()
                && line
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        }
        _ => false,
    }
}

/// A pickle: [`may_be_pickle`], and for protocols 0 and 1 the data ends with `STOP`.
fn is_pickle(data: &[u8]) -> bool {
    match data.first() {
        Some(0x80) => true,
        Some(_) => may_be_pickle(data) && data.last() == Some(&b'.'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_0_pickles_starting_with_a_global_are_pickles() {
        assert!(is_pickle(b"ccollections\nOrderedDict\np0\n(tRp1\n."));
        assert!(!is_pickle(b"cat and dog\n."));
        assert!(!is_pickle(b"c"));
        assert!(is_pickle(b"(dp0\n."));
    }
}
