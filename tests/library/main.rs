//! The pure-library tests, one binary with a module per area (ripgrep's layout): they share no
//! process-wide state, so one process runs them all, and the crate links into one test binary
//! instead of twelve. Tests that touch process-wide state (the C ABI's instance, the log, the
//! fake libcuda, environment variables, child processes) keep binaries of their own in `tests/`.
//! Helpers live in `tests/common/`.

#[path = "../common/model.rs"]
mod model;
#[path = "../common/python_pickle.rs"]
mod python_pickle;
#[path = "../common/snapshots.rs"]
mod snapshots;

mod arena_model;
mod arena_shards;
mod arena_threads;
mod config;
mod fit;
mod graph_pools;
mod native_settings;
mod sim_device;
mod stats_summary;
mod subpage_slabs;
mod trace_format;
mod trace_import;
mod trace_replay;
mod trace_sites;
mod trace_snapshots;
mod track;
mod workloads;
