//! Where the real PyTorch snapshots live (`traces/snapshots/` in this repository, see its INDEX.md
//! and NOTICE), for the tests that read them.

use std::path::{Path, PathBuf};

/// `$TORCH_ARENA_TRACES` when set (another corpus of the same layout), else the repository's
/// `traces/snapshots`. Fails, naming where it looked, when the folder lacks `index.csv`: these tests
/// must not pass by finding nothing.
pub fn traces_dir() -> PathBuf {
    let (dir, how) = match std::env::var_os("TORCH_ARENA_TRACES") {
        Some(d) => (PathBuf::from(d), "$TORCH_ARENA_TRACES"),
        None => (
            Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/snapshots"),
            "the repository's traces/snapshots",
        ),
    };
    assert!(
        dir.join("index.csv").is_file(),
        "real-trace corpus not found: looked for {} ({how}); it ships with the repository, or set \
         TORCH_ARENA_TRACES to a folder holding snapshot pickles and their index.csv",
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
