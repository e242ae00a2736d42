//! PyTorch's native caching allocator, emulated on a trace (rules from
//! `reference/pytorch-pluggable-allocator.md` §6). (Skeleton: the API; the body is being written.)

use super::Trace;
use super::replay::Point;

/// The native allocator's settings that matter for a replay.
#[derive(Clone, Debug)]
pub struct NativeOptions {
    pub capacity: u64,
    /// `max_split_size_mb` in bytes (`None` = unlimited).
    pub max_split_size: Option<u64>,
    pub expandable_segments: bool,
    /// `large_segment_size_mb` in bytes (default 20 MiB).
    pub large_segment_size: u64,
    pub series_points: usize,
}

/// What the emulated native allocator did.
#[derive(Clone, Debug)]
pub struct NativeResult {
    pub peak_reserved: u64,
    pub peak_allocated: u64,
    /// Index of the event that ran out of memory, if any.
    pub oom_event: Option<usize>,
    pub series: Vec<Point>,
}

/// Emulate the native allocator on `trace`.
pub fn simulate(trace: &Trace, opts: &NativeOptions) -> NativeResult {
    let _ = (trace, opts);
    todo!("native emulation")
}

/// The native reserved bytes the trace itself recorded, as plot points (`None` if not recorded).
pub fn recorded_series(trace: &Trace, points: usize) -> Option<Vec<Point>> {
    let _ = (trace, points);
    todo!("recorded series")
}
