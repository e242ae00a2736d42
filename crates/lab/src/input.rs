//! Opening a trace file: plain, or inflated on the fly (under the budget `pickle::inflate_budget`
//! sets) when it starts with the gzip magic bytes, whatever its name. Every reader of the lab
//! opens files here.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use torch_arena::error::{Error, Result};

use crate::pickle::{self, Inflate};

/// Opens `path` for reading: plain, or inflated under the budget when it starts with the gzip
/// magic bytes (`1f 8b`).
pub(crate) fn open(path: &Path) -> Result<Box<dyn BufRead>> {
    open_sized(path).map(|(r, _)| r)
}

/// [`open`], and the most bytes the reader can yield: the file's size, or its inflate budget.
pub(crate) fn open_sized(path: &Path) -> Result<(Box<dyn BufRead>, u64)> {
    let name = path.display().to_string();
    let file = File::open(path)
        .map_err(|e| Error::Trace(format!("cannot read trace file {name}: {e}")))?;
    let compressed = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut raw = BufReader::with_capacity(1 << 16, file);
    let head = raw
        .fill_buf()
        .map_err(|e| Error::Trace(format!("cannot read trace file {name}: {e}")))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok((
            Box::new(BufReader::with_capacity(
                1 << 16,
                Inflate::new(&name, raw, compressed),
            )),
            pickle::inflate_budget(compressed),
        ))
    } else {
        Ok((Box::new(raw), compressed))
    }
}

pub(crate) fn read_err(name: &str, e: std::io::Error) -> Error {
    let m = e.to_string();
    if m.starts_with(name) {
        Error::Trace(m)
    } else {
        Error::Trace(format!("cannot read trace file {name}: {m}"))
    }
}
