//! Where the test run's cdylib is.

use std::path::PathBuf;

/// `target/<profile>/libtorch_arena.so`: an integration test runs from `target/<profile>/deps/`,
/// and cargo builds the cdylib before integration tests.
pub fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("the test executable has a folder");
    let candidates = [
        deps.parent().map(|p| p.join("libtorch_arena.so")),
        Some(deps.join("libtorch_arena.so")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("libtorch_arena.so not found next to {}", deps.display()))
}
