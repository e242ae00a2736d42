//! Read any supported trace file, choosing the importer from its content.

use std::path::Path;

use super::Trace;
use crate::error::{Error, Result};

/// What `load` accepts, for error messages.
const ACCEPTED: &str = "accepted formats: a torch-arena trace (first line 'torch-arena-trace ...'), \
                        a PyTorch memory snapshot pickle from torch.cuda.memory._dump_snapshot() \
                        (protocol 2+: starts with byte 0x80), an RMM logging_resource_adaptor CSV log (header \
                        'Thread,Time,Action,Pointer,Size,Stream'); each may be gzip-compressed";

/// Load `path`: a torch-arena trace (`.gz` too), a PyTorch snapshot pickle (`.gz` too), or an RMM
/// CSV log. The format is decided by the content, not the name: gzip magic bytes → decompress
/// first; a pickle (`PROTO` opcode 0x80, or a protocol 0/1 dict or list ending in `STOP`) → PyTorch
/// snapshot; `Thread,Time,Action` → RMM CSV;
/// `torch-arena-trace` → our own format. Errors name the file and, for corrupt input, the byte
/// offset or line.
pub fn load(path: &Path) -> Result<Trace> {
    let name = path.display().to_string();
    let data = std::fs::read(path)
        .map_err(|e| Error::Trace(format!("cannot read trace file {name}: {e}")))?;
    let data = super::pickle::gunzip_if_gzip(&name, data)?;
    load_bytes(&name, path, &data)
}

/// Dispatch on decompressed content. `path` is what the torch-arena reader is handed.
fn load_bytes(name: &str, path: &Path, data: &[u8]) -> Result<Trace> {
    let text_start = data.strip_prefix(b"\xef\xbb\xbf").unwrap_or(data);
    if is_pickle(data) {
        super::torch_snapshot::from_bytes(name, data)
    } else if text_start.starts_with(b"Thread,Time,Action") {
        super::rmm::from_bytes(name, text_start)
    } else if text_start.starts_with(b"torch-arena-trace") {
        read_arena_trace(path)
    } else {
        let shown: String = data
            .iter()
            .take(16)
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(" ");
        Err(Error::Trace(format!(
            "{name}: not a trace format torch-arena knows (first bytes: {shown}); {ACCEPTED}"
        )))
    }
}

/// A pickle: protocol 2+ starts with `PROTO` (0x80); protocols 0 and 1 have no header, so accept
/// their usual first opcode for a dict or list (`(`, `}`, `]`) when the data ends with `STOP`.
fn is_pickle(data: &[u8]) -> bool {
    match data.first() {
        Some(0x80) => true,
        Some(b'(' | b'}' | b']') => data.last() == Some(&b'.'),
        _ => false,
    }
}

/// Our own text format, read by `format::read` (which decompresses by itself).
fn read_arena_trace(path: &Path) -> Result<Trace> {
    super::format::read(path)
}
