//! The smallest device each allocator needs: bytes judged at the limit.
//!
//! Peak reserved on a device with room to spare measures how much an allocator caches, not how
//! much it needs: PyTorch's native allocator caches freely there and gives cache back when memory
//! runs short. What a user wants to know is whether a workload fits on a smaller GPU. [`fit`]
//! answers it for one trace and one allocator (the arena under some settings, or native's
//! emulation under some `PYTORCH_CUDA_ALLOC_CONF`): the smallest simulated capacity at which the
//! whole replay (every step) runs with no out-of-memory, found by bisection, and what the last
//! step costs there (memory driver calls, modelled driver time and stall).
//!
//! The bisection keeps `lo` (known not to fit: below the peak of the bytes requested nothing
//! fits, since no allocator reserves less than it hands out) and `hi` (a replay at `hi` ran with
//! no out-of-memory), both multiples of the 2 MiB page, and stops when they are within
//! max(2 MiB, 0.25 % of `hi`). `hi` is the answer, so a replay at the reported capacity fits. An
//! allocator need not be monotone in capacity (a larger device can change a placement), so the
//! answer is *a* capacity that fits within the precision of one that did not, found the same way
//! for every allocator.

use super::native::{self, NativeOptions};
use super::replay::{ReplayOptions, StepStats, Timing, replay};
use crate::model::Trace;
use torch_arena::config::Config;
use torch_arena::error::Result;

/// Capacities are multiples of this (the CUDA page, the native allocator's large rounding).
pub const STEP: u64 = 2 << 20;
/// The bisection stops within max([`STEP`], `hi` / this) bytes (0.25 %).
pub const PRECISION_DIVISOR: u64 = 400;
/// No simulated device is larger: an allocator that does not fit here never fits (1 PiB).
pub const MAX_CAPACITY: u64 = 1 << 50;

/// One allocator under one setting.
#[derive(Clone, Debug)]
pub enum Allocator {
    /// The arena under `conf` (the device is forced to the simulated one of each capacity).
    Arena { conf: Config, label: String },
    /// PyTorch's native allocator emulated under `options` (its capacity is set per trial).
    Native {
        options: NativeOptions,
        label: String,
    },
}

impl Allocator {
    /// `"arena"` or `"native"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Allocator::Arena { .. } => "arena",
            Allocator::Native { .. } => "native",
        }
    }

    /// The settings as the user gave them (`""` for the defaults).
    pub fn label(&self) -> &str {
        match self {
            Allocator::Arena { label, .. } | Allocator::Native { label, .. } => label,
        }
    }
}

/// What one replay at one capacity gave.
#[derive(Clone, Debug)]
pub struct Trial {
    pub capacity: u64,
    pub fits: bool,
    /// The most bytes requested at once over the steps that ran (with `repeat` > 1, what one
    /// step leaves live adds up).
    pub peak_requested: u64,
    /// The last step's figures (the steady state, with `repeat` > 1).
    pub last_step: StepStats,
}

/// The smallest capacity one allocator needs for one trace.
#[derive(Clone, Debug)]
pub struct Fit {
    /// `"arena"` or `"native"`.
    pub allocator: &'static str,
    /// The settings as given (`""` = defaults).
    pub conf: String,
    /// The smallest capacity found to fit, `None` when even [`MAX_CAPACITY`] does not.
    pub min_capacity: Option<u64>,
    /// The replay at `min_capacity` (its last step is the steady-state cost there).
    pub at_min: Option<Trial>,
    /// Replays run by the bisection.
    pub trials: u32,
}

/// Replays `trace` under `allocator` on a device of `capacity` bytes with `timing`.
pub fn trial(
    trace: &Trace,
    allocator: &Allocator,
    capacity: u64,
    timing: &Timing,
) -> Result<Trial> {
    let (fits, peak_requested, steps) = match allocator {
        Allocator::Arena { conf, label } => {
            let opts = ReplayOptions {
                conf: conf.clone(),
                conf_label: label.clone(),
                timing: timing.clone(),
                ..ReplayOptions::new(capacity)
            };
            let r = replay(trace, &opts, &mut |_, _| {})?;
            (r.oom.is_none(), r.peak_requested, r.steps)
        }
        Allocator::Native { options, .. } => {
            let opts = NativeOptions {
                capacity,
                series_points: 0,
                ..options.clone()
            };
            let r = native::simulate_timed(trace, &opts, timing, &mut |_, _| {})?;
            (
                r.oom_event.is_none(),
                r.replay.peak_requested,
                r.replay.steps,
            )
        }
    };
    Ok(Trial {
        capacity,
        fits,
        peak_requested,
        last_step: steps.last().cloned().unwrap_or_default(),
    })
}

/// The smallest capacity at which `trace` replays under `allocator` with no out-of-memory (see
/// the module docs); `progress(trials)` after each replay.
pub fn fit(
    trace: &Trace,
    allocator: &Allocator,
    timing: &Timing,
    progress: &mut dyn FnMut(u32),
) -> Result<Fit> {
    let mut trials = 0u32;
    let mut run = |capacity: u64| -> Result<Trial> {
        let t = trial(trace, allocator, capacity, timing)?;
        trials += 1;
        progress(trials);
        Ok(t)
    };
    let peak = trace.peak_requested();
    // Below the requested peak nothing fits.
    let mut lo = round_down(peak.saturating_sub(1));
    // First guess: the requested peak plus an eighth (at least 64 MiB); then the gap doubles.
    let mut gap = round_up((peak / 8).max(64 << 20));
    let mut best = loop {
        let hi = lo.saturating_add(gap).min(MAX_CAPACITY);
        let t = run(hi)?;
        if t.fits {
            break t;
        }
        if hi >= MAX_CAPACITY {
            return Ok(Fit {
                allocator: allocator.kind(),
                conf: allocator.label().to_string(),
                min_capacity: None,
                at_min: None,
                trials,
            });
        }
        lo = hi;
        gap = gap.saturating_mul(2);
    };
    while best.capacity - lo > (best.capacity / PRECISION_DIVISOR).max(STEP) {
        let mid = round_down(lo + (best.capacity - lo) / 2).max(lo + STEP);
        if mid >= best.capacity {
            break;
        }
        let t = run(mid)?;
        if t.fits {
            best = t;
        } else {
            lo = mid;
        }
    }
    Ok(Fit {
        allocator: allocator.kind(),
        conf: allocator.label().to_string(),
        min_capacity: Some(best.capacity),
        at_min: Some(best),
        trials,
    })
}

fn round_down(bytes: u64) -> u64 {
    bytes / STEP * STEP
}

fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(STEP).saturating_mul(STEP)
}
