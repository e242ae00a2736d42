//! Read any supported trace file, choosing the importer from its content.

use std::path::Path;

use super::Trace;
use crate::error::Result;

/// Load `path`: a torch-arena trace (`.gz` too), a PyTorch snapshot pickle (`.gz` too), or an RMM
/// CSV log. Errors name the file and, for corrupt input, the byte offset or line.
pub fn load(path: &Path) -> Result<Trace> {
    let _ = path;
    todo!("importer dispatch")
}
