//! Every PyTorch snapshot in the repository's `traces/snapshots` replays through the arena on a
//! simulated 80 GiB GPU with exact stats after every event, a full consistency walk every few hundred events, and,
//! on traces whose peak fits in 2 GiB, host-backed pages whose contents are checked (so two live
//! allocations that overlapped would corrupt each other's bytes and fail the replay).

use crate::snapshots;

use std::time::Instant;

use torch_arena::Config;
use torch_arena_lab::{self as trace, replay};

const GIB: u64 = 1 << 30;
/// Consistency walks are O(live blocks); every 256th event keeps the debug build quick.
const WALK_EVERY: usize = 256;
/// Peak requested bytes up to which pages are backed by host memory.
const BACKED_UP_TO: u64 = 2 * GIB;

/// One line of the result table, or why the trace failed.
fn replay_one(path: &std::path::Path) -> Result<String, String> {
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let t = trace::load(path).map_err(|e| format!("{name}: load failed: {e}"))?;
    let backing = t.peak_requested() <= BACKED_UP_TO;
    let opts = replay::ReplayOptions {
        capacity: 80 * GIB,
        conf: Config::default(),
        conf_label: String::new(),
        backing,
        check: true,
        consistency_every: WALK_EVERY,
        series_points: 0,
        timing: Default::default(),
    };
    let r = replay::replay(&t, &opts, &mut |_, _| {}).map_err(|e| format!("{name}: {e}"))?;
    if let Some(oom) = &r.oom {
        return Err(format!(
            "{name}: out of memory at event {} on 80 GiB: {}",
            oom.event, oom.message
        ));
    }
    if r.unmatched_frees != 0 {
        return Err(format!(
            "{name}: {} frees of ids never allocated (the importer should have seeded them)",
            r.unmatched_frees
        ));
    }
    if r.peak_requested != t.peak_requested() {
        return Err(format!(
            "{name}: replay peak requested {} != the trace's own {}",
            r.peak_requested,
            t.peak_requested()
        ));
    }
    Ok(format!(
        "{name}: {} events, peak requested {} MiB, reserved {} MiB, native {} MiB{}",
        r.events,
        r.peak_requested >> 20,
        r.peak_reserved >> 20,
        r.native_peak_reserved
            .map_or("?".to_string(), |n| (n >> 20).to_string()),
        if backing { ", host-backed" } else { "" }
    ))
}

#[test]
fn every_real_trace_replays_with_exact_stats_and_no_overlap() {
    let dir = snapshots::traces_dir();
    let files = snapshots::indexed_files(&dir);
    assert!(files.len() >= 100, "index.csv lists {} files", files.len());
    let start = Instant::now();
    // Two workers: CI has two cores, and every trace replays on its own arena.
    let (mut lines, mut failures) = (Vec::new(), Vec::new());
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let files = &files;
                s.spawn(move || {
                    files
                        .iter()
                        .skip(w)
                        .step_by(2)
                        .map(|f| replay_one(f))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for w in workers {
            for r in w.join().expect("worker panicked") {
                match r {
                    Ok(l) => lines.push(l),
                    Err(e) => failures.push(e),
                }
            }
        }
    });
    for l in &lines {
        println!("{l}");
    }
    println!(
        "replayed {} real traces in {:.1} s",
        lines.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(lines.len(), files.len());
}
