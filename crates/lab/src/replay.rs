//! Replay a [`Trace`] through an allocator: the arena on a simulated device ([`SimArena`], under
//! the [`Checked`] adaptor) or PyTorch's native allocator emulated ([`super::native`]). One loop
//! ([`run`]) drives both through the plugin's own allocation interface,
//! [`Resource`] (`alloc`, `free`), and reads the simulated
//! machine through [`Replayed`] (driver calls, stalls, the clock), so both see the same events,
//! the same clock and the same steps.
//!
//! Each event is one `alloc` / `free`. Cost per event is the allocator's own plus O(1)
//! bookkeeping (a hash map from event id to handle, running sums, one bucket of the plot
//! series), so a replay measures the allocator, not the replayer. For the arena, with `check`,
//! every event is followed by a full consistency check (O(live)); with `backing`, allocations
//! carry a pattern that is verified on free ([`Checked`]).
//!
//! **Steps** (`repeat`): the trace is replayed `repeat` times in a row, one step per pass. What
//! is live at the end of a pass (parameters, optimizer state, the seeded live set) stays live:
//! later passes replay only the allocations the trace both makes and frees (and their frees).
//!
//! **GPU lag** (`gpu_lag_ns`): on a GPU the host runs ahead of the device, so a free reaches the
//! allocator while kernels queued before it still use the memory. At every free the replay
//! queues that use on the free's stream ([`Replayed::gpu_use`]), to finish `gpu_lag_ns` after the
//! free on the host clock. The clock is the trace's own (`time_us` of the events) where it has
//! one, else [`DEFAULT_EVENT_CLOCK_NS`] per event; a stall (a synchronising call that waits for
//! work not yet due) moves it on. A lag of 0 queues nothing: the replay is the same as without
//! the model.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::model::{Op, Trace};
use torch_arena::arena::{Arena, GrowthCounts};
use torch_arena::block::{Block, Request};
use torch_arena::config::Config;
use torch_arena::device::costs::DriverCosts;
use torch_arena::device::sim::{SimConfig, SimDevice};
use torch_arena::device::{DevPtr, Device, DriverCounters, StreamId};
use torch_arena::error::{Error, Result};
use torch_arena::resource::Resource;

/// The host time one event takes in a trace without timestamps: 10 µs, about what the host
/// spends between two allocations in an eager PyTorch training step (a few kernel launches of
/// ~5 µs each between allocations).
pub const DEFAULT_EVENT_CLOCK_NS: u64 = 10_000;

/// The default GPU lag: 2 ms (see `BENCHMARKS.md`, "The driver cost model"). An assumption: an
/// eager training loop that keeps its GPU busy queues kernels ahead of it, up to CUDA's launch
/// queue (about a thousand kernels, tens of ms); a launch-bound loop is barely ahead (~0). 2 ms
/// is a step of a few ms run mostly asynchronously, and short next to most steps.
pub const DEFAULT_GPU_LAG_NS: u64 = 2_000_000;
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
    /// The timing of the replay (steps, GPU lag, driver costs).
    pub timing: Timing,
}

/// How a replay is timed: passes over the trace, GPU lag, what driver calls cost. The same for
/// every policy of one comparison.
#[derive(Clone, Debug)]
pub struct Timing {
    /// Passes over the trace, one step each (at least 1).
    pub repeat: u32,
    /// GPU work finishes this long after it is queued, in nanoseconds of the host clock.
    pub gpu_lag_ns: u64,
    /// Host time per event of a trace without timestamps.
    pub event_clock_ns: u64,
    /// Latency of each driver call kind.
    pub costs: DriverCosts,
}

impl Default for Timing {
    /// One pass, no lag (today's replay), the default costs (measured on an H200).
    fn default() -> Self {
        Timing {
            repeat: 1,
            gpu_lag_ns: 0,
            event_clock_ns: DEFAULT_EVENT_CLOCK_NS,
            costs: DriverCosts::default(),
        }
    }
}

impl ReplayOptions {
    /// Default arena settings on a device of `capacity` bytes, no checks, no plot, one pass and
    /// no GPU lag.
    pub fn new(capacity: u64) -> Self {
        ReplayOptions {
            capacity,
            conf: Config::default(),
            conf_label: String::new(),
            backing: false,
            check: false,
            consistency_every: 1,
            series_points: 0,
            timing: Timing::default(),
        }
    }
}

/// Requested and reserved bytes after event `event`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub event: usize,
    pub requested: u64,
    pub reserved: u64,
    /// Modelled driver time so far, in nanoseconds (0 where not modelled).
    pub driver_ns: u64,
}

/// What was going on when an allocation failed.
#[derive(Clone, Debug)]
pub struct OomReport {
    /// Index of the failing event in `Trace::events`.
    pub event: usize,
    /// The step (pass over the trace, from 1) it failed in.
    pub step: u32,
    pub size: u64,
    pub stream: u64,
    pub live_bytes: u64,
    pub live_count: u64,
    pub reserved: u64,
    /// Cached bytes ([`Replayed::cached`]): for the arena, its idle and pooled pages, as its
    /// out-of-memory message counts them.
    pub cached: u64,
    /// The arena's own OOM message.
    pub message: String,
    /// The largest live allocations: (requested bytes, site text).
    pub largest_live: Vec<(u64, String)>,
}

/// What one step (one pass over the trace) cost.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepStats {
    /// Driver calls of the step, by kind.
    pub calls: DriverCounters,
    /// Σ calls × latency.
    pub modelled_driver_s: f64,
    /// Host time blocked waiting for the GPU in the step.
    pub modelled_stall_s: f64,
    pub peak_requested: u64,
    pub peak_reserved: u64,
    /// Physical memory created in the step, by whether its request took the bytes requested to
    /// a new peak (`None` where the policy does not count it).
    pub growth: Option<GrowthCounts>,
}

/// The outcome of one replay of one trace under one setting.
#[derive(Clone, Debug)]
pub struct ReplayResult {
    pub trace: String,
    pub conf: String,
    /// Events replayed, over every step (up to an out-of-memory).
    pub events: usize,
    pub peak_requested: u64,
    pub peak_reserved: u64,
    /// `peak_reserved / peak_requested - 1`.
    pub fragmentation: f64,
    /// The native allocator's peak reserved, from the trace's own segment events.
    pub native_peak_reserved: Option<u64>,
    pub oom: Option<OomReport>,
    pub elapsed: Duration,
    /// Every driver call of the replay (`calls.total()`).
    pub driver_calls: u64,
    /// The driver calls by kind.
    pub calls: DriverCounters,
    /// Physical memory created over the replay, by whether its request took the bytes requested
    /// to a new peak (`None` where the policy does not count it).
    pub growth: Option<GrowthCounts>,
    /// Σ calls × latency over the replay.
    pub modelled_driver_s: f64,
    /// Host time blocked waiting for the GPU over the replay.
    pub modelled_stall_s: f64,
    /// The GPU lag the replay modelled.
    pub gpu_lag_ns: u64,
    /// One entry per step (pass over the trace) that ran, the failing one included.
    pub steps: Vec<StepStats>,
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
    pub(crate) fn push(&mut self, event: usize, requested: u64, reserved: u64, driver_ns: u64) {
        if self.bucket == 0 {
            return;
        }
        let b = event / self.bucket;
        match self.points.last_mut() {
            Some(p) if p.event / self.bucket == b => {
                p.event = event;
                p.requested = p.requested.max(requested);
                p.reserved = p.reserved.max(reserved);
                p.driver_ns = p.driver_ns.max(driver_ns);
            }
            _ => self.points.push(Point {
                event,
                requested,
                reserved,
                driver_ns,
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
    /// Block bytes the allocator gave.
    block: u64,
    /// The block's number ([`Block::seq`]): what its pattern is made from.
    seq: u64,
}

/// The 64-bit word written at byte `off` of the allocation numbered `seq`.
#[inline]
fn pattern(seq: u64, off: u64) -> u64 {
    (seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ off).rotate_left(17) | 1
}

/// Offsets of the words written into an allocation: the first and the last 64 bytes.
fn pattern_offsets(size: u64) -> impl Iterator<Item = u64> {
    let words = size / 8;
    let head = words.min(8);
    let tail_start = words.saturating_sub(8).max(head);
    (0..head).chain(tail_start..words).map(|w| w * 8)
}

fn write_pattern(l: &Live) {
    for off in pattern_offsets(l.size) {
        // SAFETY: with backing, the simulated device maps host memory at every live allocation's
        // address, and [ptr, ptr + size) is live and ours.
        unsafe { std::ptr::write_unaligned((l.ptr + off) as *mut u64, pattern(l.seq, off)) };
    }
}

/// `event`: the last event checked before this one (for the message).
fn check_pattern(l: &Live, event: usize) -> Result<()> {
    for off in pattern_offsets(l.size) {
        // SAFETY: as in `write_pattern`.
        let v = unsafe { std::ptr::read_unaligned((l.ptr + off) as *const u64) };
        if v != pattern(l.seq, off) {
            return Err(Error::Trace(format!(
                "replay check failed after event {event}: allocation #{} at {:#x} ({} bytes) \
                 lost its pattern at offset {off}: another allocation overlaps it",
                l.seq, l.ptr, l.size
            )));
        }
    }
    Ok(())
}

/// How often (in events) `backing` verifies the pattern of every live allocation.
const FULL_PATTERN_CHECK_EVERY: usize = 4096;

/// What a replay reads of an allocator beyond [`Resource`]: the simulated machine under it
/// (driver calls, host time stalled, the GPU's clock) and the figures of its reports. Handles are
/// whatever the allocator hands out as [`Block::ptr`] (an address, or the native emulation's block
/// index); a failed allocation for lack of memory is `Err(Error::OutOfMemory(message))`.
/// Everything takes `&self`, as `Resource` does: a replay is one thread, and an implementation
/// keeps what it changes in cells.
pub trait Replayed: Resource {
    /// Called after every event with the replay's own figures, for checks.
    fn after_event(&self, _event: usize, _requested: u64) -> Result<()> {
        Ok(())
    }
    /// Allocated (block) bytes now.
    fn allocated(&self) -> u64;
    /// Cached bytes now: reserved and free for any request. PyTorch's meaning (reserved less
    /// allocated) unless the allocator knows better; the arena counts its idle and pooled pages
    /// ([`torch_arena::arena::PageCounts::cached_bytes`]), as its out-of-memory message does, not
    /// the pages it cannot move or the free space inside partially used ones.
    fn cached(&self) -> u64 {
        self.reserved().saturating_sub(self.allocated())
    }
    /// The most reserved since the last call (or the start); starts a new peak.
    fn take_peak_reserved(&self) -> u64;
    /// Driver calls so far, by kind.
    fn counters(&self) -> DriverCounters;
    /// Host time blocked waiting for the GPU so far, in nanoseconds.
    fn stall_ns(&self) -> u64;
    /// Physical memory created so far, by whether its request took the bytes requested to a new
    /// peak (`None`: not counted).
    fn growth(&self) -> Option<GrowthCounts> {
        None
    }
    /// The host clock is now `now_ns`: work due by then has finished.
    fn advance_to(&self, now_ns: u64);
    /// GPU work queued on `stream` before the free of `ptr` uses its `size` bytes until `due_ns`
    /// on the host clock.
    fn gpu_use(&self, ptr: DevPtr, size: u64, stream: StreamId, due_ns: u64);
    /// What [`Checked`] asks of the allocator after an event: its own figures against the
    /// replay's (`requested` bytes, `allocated` block bytes, `count` live allocations), and with
    /// `walk` its full internal consistency. Default: nothing to check.
    fn check(
        &self,
        _event: usize,
        _requested: u64,
        _allocated: u64,
        _count: usize,
        _walk: bool,
    ) -> Result<()> {
        Ok(())
    }
    /// Where GPU work of a stream other than `stream` may still use `[ptr, ptr + len)`, in words
    /// (for [`Checked`]: a block handed out there breaks stream safety). Default: none known.
    fn busy_elsewhere(&self, _ptr: DevPtr, _len: u64, _stream: StreamId) -> Vec<String> {
        Vec::new()
    }
}

/// One live allocation of the loop.
#[derive(Clone, Copy)]
struct Held {
    handle: u64,
    size: u64,
    site: u32,
}

/// Which events later passes replay: the allocations the trace makes after its seeds and
/// frees again, and those frees.
fn repeatable(trace: &Trace) -> Vec<bool> {
    let mut at: HashMap<u64, usize> = HashMap::new();
    let mut keep = vec![false; trace.events.len()];
    for (i, e) in trace.events.iter().enumerate() {
        match e.op {
            Op::Alloc => {
                if i >= trace.seeded {
                    at.insert(e.id, i);
                }
            }
            Op::Free => {
                if let Some(a) = at.remove(&e.id) {
                    keep[a] = true;
                    keep[i] = true;
                }
            }
        }
    }
    keep
}

/// The host clock of a trace: its timestamps where it has them, else a fixed time per event.
struct Clock {
    stamped: bool,
    per_event_ns: u64,
    now_ns: u64,
    last_us: Option<i64>,
}

impl Clock {
    fn new(trace: &Trace, per_event_ns: u64) -> Clock {
        Clock {
            stamped: trace.events.iter().any(|e| e.time_us != 0),
            per_event_ns,
            now_ns: 0,
            last_us: None,
        }
    }

    /// Moves on to event `time_us`: by its distance from the previous stamped event of the same
    /// pass (never backwards), or by one event's time. Events without a stamp (the seeded ones,
    /// time 0) take one event's time, so the gap between seeds and an epoch-based first stamp
    /// is not taken for a real one.
    fn tick(&mut self, time_us: i64) -> u64 {
        let stamp = (self.stamped && time_us != 0).then_some(time_us);
        let step = match (self.last_us, stamp) {
            (Some(last), Some(now)) => {
                (now.saturating_sub(last).max(0) as u64).saturating_mul(1000)
            }
            _ => self.per_event_ns,
        };
        if stamp.is_some() {
            self.last_us = stamp;
        }
        self.now_ns = self.now_ns.saturating_add(step);
        self.now_ns
    }

    /// A new pass begins: its first event comes one event's time after the last.
    fn new_pass(&mut self) {
        self.last_us = None;
    }
}

/// Replays `trace` through `policy` under `timing`. `progress(done, total)` is called about every
/// 1 % of the events and at the end. An out-of-memory ends the replay and is reported in the
/// result; `Err` is for a broken invariant or a failure other than out-of-memory.
pub fn run(
    trace: &Trace,
    policy: &dyn Replayed,
    timing: &Timing,
    series_points: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ReplayResult> {
    let repeat = timing.repeat.max(1) as usize;
    let keep = if repeat > 1 {
        repeatable(trace)
    } else {
        Vec::new()
    };
    let per_pass = keep.iter().filter(|&&k| k).count();
    let total = trace.events.len() + (repeat - 1) * per_pass;
    let tick = (total / 100).max(1);
    let mut live: HashMap<u64, Held> = HashMap::with_capacity(1024);
    let mut series = SeriesBuilder::new(total, series_points);
    let mut clock = Clock::new(trace, timing.event_clock_ns.max(1));
    let lag = timing.gpu_lag_ns;
    let mut requested = 0u64;
    let mut unmatched_frees = 0usize;
    let mut oom = None;
    let mut steps = Vec::with_capacity(repeat);
    let mut done = 0usize;
    let start = Instant::now();
    policy.take_peak_reserved();
    // Calls made while the policy was set up (before the first event) are not the trace's.
    let (calls_start, stall_start) = (policy.counters(), policy.stall_ns());
    let growth_start = policy.growth();
    'passes: for pass in 0..repeat {
        let calls_before = policy.counters();
        let stall_before = policy.stall_ns();
        let growth_before = policy.growth();
        let mut peak_requested = requested;
        clock.new_pass();
        for (i, e) in trace.events.iter().enumerate() {
            if pass > 0 && !keep[i] {
                continue;
            }
            let stall = policy.stall_ns();
            let now = clock.tick(e.time_us);
            if lag > 0 {
                policy.advance_to(now);
            }
            match e.op {
                Op::Alloc => {
                    let handle = if e.size == 0 {
                        // PyTorch hands out NULL for 0 bytes and never frees it.
                        0
                    } else {
                        match policy.alloc(&Request {
                            size: e.size,
                            stream: e.stream,
                            ..Request::default()
                        }) {
                            Ok(b) => b.ptr,
                            Err(Error::OutOfMemory(message)) => {
                                oom = Some(oom_report(
                                    trace,
                                    policy,
                                    &live,
                                    (i, pass as u32 + 1),
                                    e.size,
                                    e.stream,
                                    requested,
                                    message,
                                ));
                                steps.push(step_stats(
                                    policy,
                                    timing,
                                    &calls_before,
                                    stall_before,
                                    growth_before,
                                    peak_requested,
                                ));
                                break 'passes;
                            }
                            Err(other) => return Err(at_event(other, trace, i, pass)),
                        }
                    };
                    let held = Held {
                        handle,
                        size: e.size,
                        site: e.site,
                    };
                    if live.insert(e.id, held).is_some() {
                        return Err(Error::Trace(format!(
                            "{}: event {i} allocates id {} again while it is live",
                            trace.name, e.id
                        )));
                    }
                    requested = requested.saturating_add(e.size);
                    peak_requested = peak_requested.max(requested);
                }
                Op::Free => match live.remove(&e.id) {
                    None => unmatched_frees += 1,
                    Some(h) if h.size == 0 => {}
                    Some(h) => {
                        if lag > 0 {
                            policy.gpu_use(h.handle, h.size, e.stream, now.saturating_add(lag));
                        }
                        policy
                            .free(h.handle, h.size, e.stream)
                            .map_err(|err| at_event(err, trace, i, pass))?;
                        requested = requested.saturating_sub(h.size);
                    }
                },
            }
            policy
                .after_event(i, requested)
                .map_err(|err| at_event(err, trace, i, pass))?;
            // A stall moves the host clock on by the time it waited.
            clock.now_ns = clock
                .now_ns
                .saturating_add(policy.stall_ns().saturating_sub(stall));
            if series.enabled() {
                let driver = timing.costs.seconds(&policy.counters().since(&calls_start));
                series.push(done, requested, policy.reserved(), (driver * 1e9) as u64);
            }
            done += 1;
            if done.is_multiple_of(tick) {
                progress(done, total);
            }
        }
        steps.push(step_stats(
            policy,
            timing,
            &calls_before,
            stall_before,
            growth_before,
            peak_requested,
        ));
    }
    let elapsed = start.elapsed();
    progress(if oom.is_some() { done } else { total }, total);
    let calls = policy.counters().since(&calls_start);
    let peak_requested = steps.iter().map(|s| s.peak_requested).max().unwrap_or(0);
    let peak_reserved = steps.iter().map(|s| s.peak_reserved).max().unwrap_or(0);
    Ok(ReplayResult {
        trace: trace.name.clone(),
        conf: String::new(),
        events: done + usize::from(oom.is_some()),
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
        driver_calls: calls.total(),
        growth: since(policy.growth(), growth_start),
        modelled_driver_s: timing.costs.seconds(&calls),
        modelled_stall_s: policy.stall_ns().saturating_sub(stall_start) as f64 / 1e9,
        calls,
        gpu_lag_ns: lag,
        steps,
        series: series.finish(),
        unmatched_frees,
        live_at_end: live.len(),
    })
}

/// An error of event `i` in pass `pass`, with the event named.
fn at_event(err: Error, trace: &Trace, i: usize, pass: usize) -> Error {
    match err {
        Error::Trace(m) if m.contains("event ") => Error::Trace(m),
        other => Error::Trace(format!(
            "{}: event {i}{}: {other}",
            trace.name,
            if pass > 0 {
                format!(" (step {})", pass + 1)
            } else {
                String::new()
            }
        )),
    }
}

fn step_stats(
    policy: &dyn Replayed,
    timing: &Timing,
    calls_before: &DriverCounters,
    stall_before: u64,
    growth_before: Option<GrowthCounts>,
    peak_requested: u64,
) -> StepStats {
    let calls = policy.counters().since(calls_before);
    StepStats {
        growth: since(policy.growth(), growth_before),
        modelled_driver_s: timing.costs.seconds(&calls),
        modelled_stall_s: policy.stall_ns().saturating_sub(stall_before) as f64 / 1e9,
        calls,
        peak_requested,
        peak_reserved: policy.take_peak_reserved(),
    }
}

/// What was created between `before` and `now`, where the policy counts it.
fn since(now: Option<GrowthCounts>, before: Option<GrowthCounts>) -> Option<GrowthCounts> {
    Some(now?.since(&before.unwrap_or_default()))
}

/// The arena on a fresh simulated device: what [`replay`] drives, under [`Checked`].
pub struct SimArena {
    arena: Arena,
    sim: Arc<SimDevice>,
    trace: String,
}

impl SimArena {
    /// A fresh arena under `opts` on a fresh simulated device of `opts.capacity` bytes.
    pub fn new(opts: &ReplayOptions, trace: &Trace) -> Result<SimArena> {
        let mut sim = SimConfig::new(
            opts.capacity,
            opts.conf.sim_granularity_kb << 10,
            opts.backing,
        );
        sim.vmm = opts.conf.sim_vmm;
        let sim = Arc::new(SimDevice::new(sim)?);
        let dev: Arc<dyn Device> = sim.clone();
        let arena = Arena::new(dev, &opts.conf)?;
        Ok(SimArena {
            arena,
            sim,
            trace: trace.name.clone(),
        })
    }

    /// The simulated device under the arena.
    pub fn device(&self) -> &SimDevice {
        &self.sim
    }

    /// The arena.
    pub fn arena(&self) -> &Arena {
        &self.arena
    }
}

impl Resource for SimArena {
    #[inline]
    fn alloc(&self, req: &Request) -> Result<Block> {
        Resource::alloc(&self.arena, req)
    }

    #[inline]
    fn free(&self, ptr: DevPtr, size: u64, stream: StreamId) -> Result<()> {
        Resource::free(&self.arena, ptr, size, stream)
    }

    fn reserved(&self) -> u64 {
        Resource::reserved(&self.arena)
    }
}

impl Replayed for SimArena {
    fn allocated(&self) -> u64 {
        self.arena.stats().allocated_bytes.all().current.max(0) as u64
    }

    fn cached(&self) -> u64 {
        self.arena.pages().cached_bytes()
    }

    fn take_peak_reserved(&self) -> u64 {
        let peak = self.arena.stats().reserved_bytes.all().peak.max(0) as u64;
        self.arena.reset_peak_stats();
        peak
    }

    fn counters(&self) -> DriverCounters {
        self.sim.counters()
    }

    fn stall_ns(&self) -> u64 {
        self.sim.stall_ns()
    }

    fn growth(&self) -> Option<GrowthCounts> {
        Some(self.arena.growth())
    }

    fn advance_to(&self, now_ns: u64) {
        self.sim.advance_to(now_ns);
    }

    fn gpu_use(&self, ptr: DevPtr, size: u64, stream: StreamId, due_ns: u64) {
        self.sim.launch_until(stream, ptr, size, due_ns);
    }

    fn check(
        &self,
        i: usize,
        requested: u64,
        allocated: u64,
        count: usize,
        walk: bool,
    ) -> Result<()> {
        check_event(
            &self.trace,
            &self.arena,
            count,
            i,
            requested,
            allocated,
            walk,
        )?;
        let violations = self.sim.violations();
        if let Some(v) = violations.first() {
            return Err(Error::Trace(format!(
                "{}: replay check failed after event {i}: the simulated GPU saw {} \
                 stream-safety violation(s), the first: {v}",
                self.trace,
                violations.len()
            )));
        }
        Ok(())
    }

    fn busy_elsewhere(&self, ptr: DevPtr, len: u64, stream: StreamId) -> Vec<String> {
        self.sim
            .busy_overlapping(ptr, len)
            .into_iter()
            .filter(|&(s, _, _)| s != stream)
            .map(|(s, p, n)| format!("stream {s} may still use {p:#x}+{n}"))
            .collect()
    }
}

/// The replay's checks around an allocator ([`ReplayOptions::check`], [`ReplayOptions::backing`]),
/// as a layer of the allocation stack: it passes every call down and, with `check`, holds the
/// allocator's figures to the replay's after every event (its full consistency walk every
/// `consistency_every` events and at the end) and refuses a block handed out where another
/// stream's work may still run; with `backing` it writes a pattern into every block and checks it
/// at the free and every 4,096 events. Without either it only counts.
pub struct Checked<R> {
    inner: R,
    check: bool,
    backing: bool,
    consistency_every: usize,
    /// With `backing` or `check`: pointer → what the allocator handed out.
    live: RefCell<HashMap<u64, Live>>,
    /// Sum of live block sizes (with `check`).
    allocated: Cell<u64>,
    /// Live allocations the allocator holds (size 0 is NULL, not the allocator's).
    count: Cell<usize>,
    /// The trace's last event (for the last consistency walk).
    last_event: usize,
    /// The event most recently finished (`after_event`), for messages.
    last_checked: Cell<usize>,
}

impl<R: Replayed> Checked<R> {
    /// `inner` under the checks `opts` asks for, for a replay of `trace`.
    pub fn new(inner: R, opts: &ReplayOptions, trace: &Trace) -> Checked<R> {
        Checked {
            inner,
            check: opts.check,
            backing: opts.backing,
            consistency_every: opts.consistency_every.max(1),
            live: RefCell::new(HashMap::new()),
            allocated: Cell::new(0),
            count: Cell::new(0),
            last_event: trace.events.len().saturating_sub(1),
            last_checked: Cell::new(0),
        }
    }

    /// The allocator under the checks.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// With `backing`, every live allocation still holds its pattern.
    fn check_all_patterns(&self, event: usize) -> Result<()> {
        for l in self.live.borrow().values() {
            check_pattern(l, event)?;
        }
        Ok(())
    }
}

impl<R: Replayed> Resource for Checked<R> {
    fn alloc(&self, req: &Request) -> Result<Block> {
        let b = self.inner.alloc(req)?;
        self.count.set(self.count.get() + 1);
        if self.check || self.backing {
            let l = Live {
                ptr: b.ptr,
                size: req.size,
                block: b.size,
                seq: b.seq,
            };
            if self.check {
                self.allocated.set(self.allocated.get() + l.block);
                // With a GPU lag, a block must not be handed out while another stream's work
                // may still use it (invariant 2).
                let busy = self.inner.busy_elsewhere(b.ptr, req.size, req.stream);
                if !busy.is_empty() {
                    return Err(Error::Trace(format!(
                        "replay check failed: {} bytes at {:#x} handed out on stream {} while {}",
                        req.size,
                        b.ptr,
                        req.stream,
                        busy.join(", ")
                    )));
                }
            }
            if self.backing {
                write_pattern(&l);
            }
            self.live.borrow_mut().insert(b.ptr, l);
        }
        Ok(b)
    }

    fn free(&self, ptr: DevPtr, size: u64, stream: StreamId) -> Result<()> {
        if let Some(l) = self.live.borrow_mut().remove(&ptr) {
            if self.backing {
                check_pattern(&l, self.last_checked.get())?;
            }
            self.allocated.set(self.allocated.get() - l.block);
        }
        self.inner.free(ptr, size, stream)?;
        self.count.set(self.count.get() - 1);
        Ok(())
    }

    fn reserved(&self) -> u64 {
        self.inner.reserved()
    }
}

impl<R: Replayed> Replayed for Checked<R> {
    fn after_event(&self, i: usize, requested: u64) -> Result<()> {
        self.last_checked.set(i);
        if !self.check {
            return Ok(());
        }
        let every = self.consistency_every;
        let walk = i % every == every - 1 || i == self.last_event;
        self.inner
            .check(i, requested, self.allocated.get(), self.count.get(), walk)?;
        if self.backing && i % FULL_PATTERN_CHECK_EVERY == FULL_PATTERN_CHECK_EVERY - 1 {
            self.check_all_patterns(i)?;
        }
        Ok(())
    }

    fn allocated(&self) -> u64 {
        self.inner.allocated()
    }

    fn cached(&self) -> u64 {
        self.inner.cached()
    }

    fn take_peak_reserved(&self) -> u64 {
        self.inner.take_peak_reserved()
    }

    fn counters(&self) -> DriverCounters {
        self.inner.counters()
    }

    fn stall_ns(&self) -> u64 {
        self.inner.stall_ns()
    }

    fn growth(&self) -> Option<GrowthCounts> {
        self.inner.growth()
    }

    fn advance_to(&self, now_ns: u64) {
        self.inner.advance_to(now_ns);
    }

    fn gpu_use(&self, ptr: DevPtr, size: u64, stream: StreamId, due_ns: u64) {
        self.inner.gpu_use(ptr, size, stream, due_ns);
    }
}

/// Replay `trace` through the arena on a simulated device; `progress(done, total)` is called
/// about every 1 % of the events and at the end. An OOM ends the replay and is reported in the
/// result; `Err` is for settings that cannot be used, a device failure other than OOM, or (with
/// `check`) a broken invariant.
pub fn replay(
    trace: &Trace,
    opts: &ReplayOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ReplayResult> {
    let policy = Checked::new(SimArena::new(opts, trace)?, opts, trace);
    let mut r = run(trace, &policy, &opts.timing, opts.series_points, progress)?;
    if opts.backing {
        policy.check_all_patterns(trace.events.len())?;
    }
    r.conf = opts.conf_label.clone();
    Ok(r)
}

/// `check`: the arena's figures equal the replay's own, and its internal state is consistent.
fn check_event(
    trace: &str,
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
                trace
            )));
        }
    }
    if !walk {
        return Ok(());
    }
    arena.check_consistency().map_err(|m| {
        Error::Trace(format!(
            "{}: replay check failed after event {i}: {m}",
            trace
        ))
    })
}

#[allow(clippy::too_many_arguments)]
fn oom_report(
    trace: &Trace,
    policy: &dyn Replayed,
    live: &HashMap<u64, Held>,
    (event, step): (usize, u32),
    size: u64,
    stream: u64,
    live_bytes: u64,
    message: String,
) -> OomReport {
    let reserved = policy.reserved();
    let mut largest: Vec<(u64, u32)> = live.values().map(|l| (l.size, l.site)).collect();
    let n = largest.len().min(5);
    if n > 0 {
        largest.select_nth_unstable_by(n - 1, |a, b| b.0.cmp(&a.0));
    }
    largest.truncate(n);
    largest.sort_by_key(|l| std::cmp::Reverse(l.0));
    OomReport {
        event,
        step,
        size,
        stream,
        live_bytes,
        live_count: live.len() as u64,
        reserved,
        cached: policy.cached(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Event, Kind, Source};

    fn stamped(times: &[i64]) -> Trace {
        Trace {
            name: "t".into(),
            source: Source::Synthetic,
            kind: Kind::Partial,
            device: 0,
            seeded: 1,
            events: times
                .iter()
                .enumerate()
                .map(|(i, &t)| Event {
                    op: Op::Alloc,
                    id: i as u64,
                    size: 1,
                    stream: 0,
                    time_us: t,
                    site: 0,
                })
                .collect(),
            sites: vec![],
            native: None,
            steps: None,
        }
    }

    #[test]
    fn the_clock_follows_stamps_and_never_jumps_from_a_seed() {
        let base = 1_700_000_000_000_000; // µs since the epoch, as PyTorch stamps
        let t = stamped(&[0, base, base + 100, base + 50, base + 250]);
        let mut c = Clock::new(&t, 10_000);
        let ticks: Vec<u64> = t.events.iter().map(|e| c.tick(e.time_us)).collect();
        // The seed and the first stamp take one event's time; then the stamps' distances, and
        // a stamp that goes back takes none.
        assert_eq!(ticks, [10_000, 20_000, 120_000, 120_000, 320_000]);
        c.new_pass();
        assert_eq!(c.tick(base), 330_000);
        // Without stamps: one event's time each.
        let t = stamped(&[0, 0, 0]);
        let mut c = Clock::new(&t, 7);
        let ticks: Vec<u64> = t.events.iter().map(|e| c.tick(e.time_us)).collect();
        assert_eq!(ticks, [7, 14, 21]);
    }
}
