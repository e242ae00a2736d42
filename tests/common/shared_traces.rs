//! Where the shared PyTorch snapshots live (`../shared/traces`, see its INDEX.md), for the tests
//! that read them.

use std::path::{Path, PathBuf};

/// `$TORCH_ARENA_TRACES`, else `<CARGO_MANIFEST_DIR>/../shared/traces`. Fails, naming where it
/// looked, when neither holds `index.csv`: these tests must not pass by finding nothing.
pub fn traces_dir() -> PathBuf {
    let (dir, how) = match std::env::var_os("TORCH_ARENA_TRACES") {
        Some(d) => (PathBuf::from(d), "$TORCH_ARENA_TRACES"),
        None => (
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces"),
            "<CARGO_MANIFEST_DIR>/../shared/traces",
        ),
    };
    assert!(
        dir.join("index.csv").is_file(),
        "shared traces not found: looked for {} ({how}); set TORCH_ARENA_TRACES to the folder \
         holding the snapshot pickles and index.csv",
        dir.join("index.csv").display()
    );
    dir
}

/// The trace files `index.csv` lists, in its order (the first column of each row).
#[allow(dead_code)]
pub fn indexed_files(dir: &Path) -> Vec<PathBuf> {
    let index = std::fs::read_to_string(dir.join("index.csv")).expect("index.csv is readable");
    index
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').next())
        .filter(|f| !f.is_empty())
        .map(|f| dir.join(f))
        .collect()
}
