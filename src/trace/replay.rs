//! Replay a [`Trace`] through the arena on a simulated device.
//!
//! Each event is one `Arena::malloc` / `Arena::free` on a fresh arena over a [`SimDevice`] of
//! `capacity` bytes. Cost per event is the arena's own plus O(1) bookkeeping (a hash map from
//! event id to pointer, running sums, one bucket of the plot series), so a replay measures the
//! arena, not the replayer. With `check`, every event is followed by a full consistency check of
//! the arena (O(live)); with `backing`, allocations carry a pattern that is verified on free.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Op, Trace};
use crate::arena::Arena;
use crate::config::Config;
use crate::device::Device;
use crate::device::sim::{SimConfig, SimDevice};
use crate::error::{Error, Result};

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
    /// With `check`: run the arena's full consistency walk (every block, O(live)) after every
    /// this-many events and at the end; 1 = every event. The stats check runs after every event
    /// regardless. Large traces use a sparser walk to keep the check linear in practice.
    pub consistency_every: usize,
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
    /// Frees of ids the trace never allocated (skipped; importers seed what they can).
    pub unmatched_frees: usize,
    /// Allocations still live at the end of the trace.
    pub live_at_end: usize,
}

/// Keeps at most `points` plot points: events are cut into equal buckets of consecutive indices
/// and each bucket keeps its largest requested and reserved figures, so every peak shows.
#[derive(Clone, Debug)]
pub(crate) struct SeriesBuilder {
    bucket: usize,
    points: Vec<Point>,
}

impl SeriesBuilder {
    /// A series over `events` events with at most `points` points (0 = none).
    pub(crate) fn new(events: usize, points: usize) -> Self {
        let bucket = if points == 0 {
            0
        } else {
            events.div_ceil(points).max(1)
        };
        SeriesBuilder {
            bucket,
            points: Vec::with_capacity(points.min(events)),
        }
    }

    /// Whether anything is being kept.
    pub(crate) fn enabled(&self) -> bool {
        self.bucket > 0
    }

    /// The figures after event `event` (events come in increasing order).
    #[inline]
    pub(crate) fn push(&mut self, event: usize, requested: u64, reserved: u64) {
        if self.bucket == 0 {
            return;
        }
        let b = event / self.bucket;
        match self.points.last_mut() {
            Some(p) if p.event / self.bucket == b => {
                p.event = event;
                p.requested = p.requested.max(requested);
                p.reserved = p.reserved.max(reserved);
            }
            _ => self.points.push(Point {
                event,
                requested,
                reserved,
            }),
        }
    }

    pub(crate) fn finish(self) -> Vec<Point> {
        self.points
    }
}

/// One live allocation of the replay.
#[derive(Clone, Copy)]
struct Live {
    ptr: u64,
    size: u64,
    /// Block bytes the arena gave (only known with `check`).
    block: u64,
    site: u32,
}

/// The 64-bit word written at byte `off` of the allocation with id `id`.
#[inline]
fn pattern(id: u64, off: u64) -> u64 {
    (id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ off).rotate_left(17) | 1
}

/// Offsets of the words written into an allocation: the first and the last 64 bytes.
fn pattern_offsets(size: u64) -> impl Iterator<Item = u64> {
    let words = size / 8;
    let head = words.min(8);
    let tail_start = words.saturating_sub(8).max(head);
    (0..head).chain(tail_start..words).map(|w| w * 8)
}

fn write_pattern(id: u64, l: &Live) {
    for off in pattern_offsets(l.size) {
        // SAFETY: with backing, the simulated device maps host memory at every live allocation's
        // address, and [ptr, ptr + size) is live and ours.
        unsafe { std::ptr::write_unaligned((l.ptr + off) as *mut u64, pattern(id, off)) };
    }
}

fn check_pattern(id: u64, l: &Live, event: usize) -> Result<()> {
    for off in pattern_offsets(l.size) {
        // SAFETY: as in `write_pattern`.
        let v = unsafe { std::ptr::read_unaligned((l.ptr + off) as *const u64) };
        if v != pattern(id, off) {
            return Err(Error::Trace(format!(
                "replay check failed after event {event}: allocation id {id} at {:#x} ({} bytes) \
                 lost its pattern at offset {off}: another allocation overlaps it",
                l.ptr, l.size
            )));
        }
    }
    Ok(())
}

/// How often (in events) `backing` verifies the pattern of every live allocation.
const FULL_PATTERN_CHECK_EVERY: usize = 4096;

/// Replay `trace`; `progress(done, total)` is called about every 1 % of the events and at the
/// end. An OOM ends the replay and is reported in the result; `Err` is for settings that cannot be
/// used, a device failure other than OOM, or (with `check`) a broken invariant.
pub fn replay(
    trace: &Trace,
    opts: &ReplayOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ReplayResult> {
    let mut sim = SimConfig::new(
        opts.capacity,
        opts.conf.sim_granularity_kb << 10,
        opts.backing,
    );
    sim.vmm = opts.conf.sim_vmm;
    let dev: Arc<dyn Device> = Arc::new(SimDevice::new(sim)?);
    let arena = Arena::new(dev.clone(), &opts.conf)?;
    let counters_before = dev.counters().total();

    let total = trace.events.len();
    let step = (total / 100).max(1);
    let mut live: HashMap<u64, Live> = HashMap::with_capacity(1024);
    let mut series = SeriesBuilder::new(total, opts.series_points);
    let (mut requested, mut peak_requested) = (0u64, 0u64);
    let mut allocated = 0u64;
    // Live allocations the arena holds (size 0 is NULL, not the arena's).
    let mut in_arena = 0usize;
    let mut unmatched_frees = 0usize;
    let mut oom = None;
    let start = Instant::now();
    for (i, e) in trace.events.iter().enumerate() {
        match e.op {
            Op::Alloc => {
                if e.size == 0 {
                    // PyTorch hands out NULL for 0 bytes and never frees it.
                    live.insert(
                        e.id,
                        Live {
                            ptr: 0,
                            size: 0,
                            block: 0,
                            site: e.site,
                        },
                    );
                } else {
                    match arena.malloc(e.size, e.stream) {
                        Ok(ptr) => {
                            let mut l = Live {
                                ptr,
                                size: e.size,
                                block: 0,
                                site: e.site,
                            };
                            if opts.check {
                                l.block = arena.base_alloc(ptr)?.1;
                                allocated += l.block;
                            }
                            if opts.backing {
                                write_pattern(e.id, &l);
                            }
                            if live.insert(e.id, l).is_some() {
                                return Err(Error::Trace(format!(
                                    "{}: event {i} allocates id {} again while it is live",
                                    trace.name, e.id
                                )));
                            }
                            requested += e.size;
                            in_arena += 1;
                            peak_requested = peak_requested.max(requested);
                        }
                        Err(Error::OutOfMemory(message)) => {
                            oom = Some(oom_report(
                                trace, &arena, &live, i, e.size, e.stream, requested, message,
                            ));
                            break;
                        }
                        Err(other) => return Err(other),
                    }
                }
            }
            Op::Free => match live.remove(&e.id) {
                None => unmatched_frees += 1,
                Some(l) if l.ptr == 0 => {}
                Some(l) => {
                    if opts.backing {
                        check_pattern(e.id, &l, i)?;
                    }
                    arena.free(l.ptr, Some(l.size), e.stream)?;
                    requested -= l.size;
                    allocated -= l.block;
                    in_arena -= 1;
                }
            },
        }
        if opts.check {
            let every = opts.consistency_every.max(1);
            let walk = i % every == every - 1 || i + 1 == total;
            check_event(trace, &arena, in_arena, i, requested, allocated, walk)?;
            if opts.backing && i % FULL_PATTERN_CHECK_EVERY == FULL_PATTERN_CHECK_EVERY - 1 {
                check_all_patterns(&live, i)?;
            }
        }
        if series.enabled() {
            let reserved = arena.stats().reserved_bytes.all().current.max(0) as u64;
            series.push(i, requested, reserved);
        }
        if i % step == step - 1 {
            progress(i + 1, total);
        }
    }
    if opts.backing {
        check_all_patterns(&live, total)?;
    }
    let elapsed = start.elapsed();
    progress(oom.as_ref().map_or(total, |o: &OomReport| o.event), total);
    let stats = arena.stats();
    let peak_reserved = stats.reserved_bytes.all().peak.max(0) as u64;
    Ok(ReplayResult {
        trace: trace.name.clone(),
        conf: opts.conf_label.clone(),
        events: total,
        peak_requested,
        peak_reserved,
        fragmentation: if peak_requested == 0 {
            0.0
        } else {
            peak_reserved as f64 / peak_requested as f64 - 1.0
        },
        native_peak_reserved: trace.native.as_ref().map(|n| n.peak),
        oom,
        elapsed,
        driver_calls: dev.counters().total() - counters_before,
        series: series.finish(),
        unmatched_frees,
        live_at_end: live.len(),
    })
}

/// `check`: the arena's figures equal the replay's own, and its internal state is consistent.
fn check_event(
    trace: &Trace,
    arena: &Arena,
    count: usize,
    i: usize,
    requested: u64,
    allocated: u64,
    walk: bool,
) -> Result<()> {
    let s = arena.stats();
    let count = count as i64;
    let checks = [
        (
            "requested_bytes",
            s.requested_bytes.all().current,
            requested as i64,
        ),
        (
            "allocated_bytes",
            s.allocated_bytes.all().current,
            allocated as i64,
        ),
        ("allocation", s.allocation.all().current, count),
    ];
    for (what, got, want) in checks {
        if got != want {
            return Err(Error::Trace(format!(
                "{}: replay check failed after event {i}: {what}.all.current is {got}, the live \
                 allocations sum to {want}",
                trace.name
            )));
        }
    }
    if !walk {
        return Ok(());
    }
    arena.check_consistency().map_err(|m| {
        Error::Trace(format!(
            "{}: replay check failed after event {i}: {m}",
            trace.name
        ))
    })
}

fn check_all_patterns(live: &HashMap<u64, Live>, event: usize) -> Result<()> {
    for (&id, l) in live {
        if l.ptr != 0 {
            check_pattern(id, l, event)?;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn oom_report(
    trace: &Trace,
    arena: &Arena,
    live: &HashMap<u64, Live>,
    event: usize,
    size: u64,
    stream: u64,
    live_bytes: u64,
    message: String,
) -> OomReport {
    let s = arena.stats();
    let reserved = s.reserved_bytes.all().current.max(0) as u64;
    let allocated = s.allocated_bytes.all().current.max(0) as u64;
    let mut largest: Vec<(u64, u32)> = live.values().map(|l| (l.size, l.site)).collect();
    let n = largest.len().min(5);
    if n > 0 {
        largest.select_nth_unstable_by(n - 1, |a, b| b.0.cmp(&a.0));
    }
    largest.truncate(n);
    largest.sort_by_key(|l| std::cmp::Reverse(l.0));
    OomReport {
        event,
        size,
        stream,
        live_bytes,
        live_count: live.len() as u64,
        reserved,
        cached: reserved.saturating_sub(allocated),
        message,
        largest_live: largest
            .into_iter()
            .map(|(size, site)| {
                let text = trace
                    .sites
                    .get(site as usize)
                    .cloned()
                    .unwrap_or_else(|| "unknown".to_string());
                (size, text)
            })
            .collect(),
    }
}
