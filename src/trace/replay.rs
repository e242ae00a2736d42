//! Replay a [`Trace`] through the arena on a simulated device. (Skeleton: the API the CLI codes
//! against; the body is being written.)

use std::time::Duration;

use super::Trace;
use crate::config::Config;
use crate::error::Result;

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    /// Bytes of the simulated device.
    pub capacity: u64,
    /// Arena settings (the device is forced to `sim` with `capacity`).
    pub conf: Config,
    /// The settings as the user wrote them, for reports ("" = defaults).
    pub conf_label: String,
    /// Back pages with host memory and check every live allocation's bytes (slow; small traces).
    pub backing: bool,
    /// After every event, check that stats are exact and that no live allocations overlap.
    pub check: bool,
    /// How many points of (requested, reserved) to keep for a plot (0 = none).
    pub series_points: usize,
}

/// Requested and reserved bytes after event `event`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub event: usize,
    pub requested: u64,
    pub reserved: u64,
}

/// What was going on when an allocation failed.
#[derive(Clone, Debug)]
pub struct OomReport {
    /// Index of the failing event in `Trace::events`.
    pub event: usize,
    pub size: u64,
    pub stream: u64,
    pub live_bytes: u64,
    pub live_count: u64,
    pub reserved: u64,
    /// Reserved but not allocated (cached) bytes.
    pub cached: u64,
    /// The arena's own OOM message.
    pub message: String,
    /// The largest live allocations: (requested bytes, site text).
    pub largest_live: Vec<(u64, String)>,
}

/// The outcome of one replay of one trace under one setting.
#[derive(Clone, Debug)]
pub struct ReplayResult {
    pub trace: String,
    pub conf: String,
    pub events: usize,
    pub peak_requested: u64,
    pub peak_reserved: u64,
    /// `peak_reserved / peak_requested - 1`.
    pub fragmentation: f64,
    /// The native allocator's peak reserved, from the trace's own segment events.
    pub native_peak_reserved: Option<u64>,
    pub oom: Option<OomReport>,
    pub elapsed: Duration,
    pub driver_calls: u64,
    pub series: Vec<Point>,
}

/// Replay `trace`; `progress(done, total)` is called now and then. An OOM ends the replay and is
/// reported in the result; `Err` is for settings that cannot be used.
pub fn replay(
    trace: &Trace,
    opts: &ReplayOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ReplayResult> {
    let _ = (trace, opts, progress);
    todo!("replay")
}
