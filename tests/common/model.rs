//! The arena model shared by the property tests of every backend (`tests/library/arena_model.rs` on the
//! simulated device, `tests/arena_cuda_fake.rs` on `CudaDevice` over the fake driver).
//!
//! Random sequences of alloc / free / record_stream / launch / complete / trim / defragment over
//! three streams and two devices. After every step:
//! - live allocations never overlap, and each still holds the pattern written into it (every page
//!   of it, so a remap under a live block would show);
//! - a block handed out on stream T never overlaps memory another stream's uncompleted work uses;
//! - the backend saw no unmap or release of memory a stream may still use;
//! - `allocation`, `active`, `requested_bytes` and `allocated_bytes` equal the model's figures and
//!   `reserved_bytes` equals the physical bytes the device holds for us;
//! - the arena's own consistency check passes.
//!
//! At the end everything is freed and trimmed: nothing may be held.
//!
//! Use from a test binary with `#[path = "common/model.rs"] mod model;` and a [`TestGpu`] per
//! device.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use torch_arena::arena::Arena;
use torch_arena::config::Config;
use torch_arena::device::{Device, StreamId};

pub const PAGE: u64 = 2 << 20;
pub const STREAMS: [StreamId; 3] = [0, 7, 9];

/// One device of a backend, with what the model needs beyond the [`Device`] trait: queued "GPU
/// work" per stream, stream-safety checks, the bytes the driver holds for us, leak accounting and
/// failure injection.
pub trait TestGpu {
    /// The device the arena allocates from.
    fn device(&self) -> Arc<dyn Device>;
    /// Queues work on `stream` that uses `[ptr, ptr+len)` until the stream completes it.
    fn launch(&self, stream: StreamId, ptr: u64, len: u64);
    /// Completes all work queued on `stream` so far.
    fn complete(&self, stream: StreamId);
    /// Completes all work on every stream.
    fn complete_all(&self);
    /// `(stream, ptr, len)` of every uncompleted launch overlapping `[ptr, ptr+len)`.
    fn busy_overlapping(&self, ptr: u64, len: u64) -> Vec<(StreamId, u64, u64)>;
    /// Every stream-safety violation seen so far (memory unmapped, remapped or freed while a
    /// stream may still use it; a launch on unmapped memory).
    fn violations(&self) -> Vec<String>;
    /// Physical bytes the driver holds for this device.
    fn held_bytes(&self) -> u64;
    /// After draining every device: what is still held (pages, mappings, plain allocations), or
    /// `None` when nothing is.
    fn leaks(&self) -> Option<String>;
    /// Makes reserve / create / map calls fail at random, seeded by `seed`, about one in
    /// `one_in`.
    fn fail_randomly(&self, seed: u64, one_in: u64);
    /// Cancels every random failure.
    fn stop_failing(&self);
    /// Called before every step of a sequence (e.g. to arm the next random failures).
    fn before_step(&self) {}
}

/// The block size a request should get, derived from the documented class spacing (not from the
/// arena's own table): 512-byte steps to 4 KiB, then 8 classes per doubling up to the slab bound
/// (64 KiB by default, `slab_max_kb`); above that, the request rounded up to 512 bytes.
pub fn expected_block(size: u64) -> u64 {
    if size > 64 << 10 {
        return size.div_ceil(512) * 512;
    }
    if size <= 4096 {
        return size.div_ceil(512) * 512;
    }
    let mut base = 4096u64;
    while base * 2 < size {
        base *= 2;
    }
    let step = base / 8;
    base + (size - base).div_ceil(step) * step
}

#[derive(Clone, Debug)]
pub enum Op {
    Alloc {
        dev: usize,
        stream: usize,
        size: u64,
    },
    Free {
        pick: usize,
    },
    RecordStream {
        pick: usize,
        stream: usize,
    },
    Launch {
        pick: usize,
        other: bool,
    },
    Complete {
        dev: usize,
        stream: usize,
    },
    Trim {
        dev: usize,
    },
    Defragment {
        dev: usize,
    },
}

pub fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,
        3 => 4096u64..(1 << 20) + 1,
        2 => (1u64 << 20)..(6 << 20),
        1 => (6u64 << 20)..(24 << 20),
        // Tensor sizes repeat every training step: the same lengths freed and asked for again.
        3 => prop::sample::select(vec![(1u64 << 20) + 4096, 3 << 20, (5 << 20) + 512, (9 << 20) + 7]),
    ]
}

/// Sizes for a device of a few hundred MiB where large blocks are large handles (at least
/// 1/32 of the limit): the rules that keep a large handle movable (its boundary pages apart,
/// placement that does not strand it) act on most of them, and the limit is often reached.
pub fn large_size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => 1u64..(1 << 20) + 1,
        2 => (1u64 << 20)..(24 << 20),
        3 => (24u64 << 20)..(160 << 20),
        2 => prop::sample::select(vec![64u64 << 20, (100 << 20) + 512, (150 << 20) + 4096]),
    ]
}

pub fn op_strategy() -> impl Strategy<Value = Op> {
    op_strategy_sized(size_strategy())
}

/// [`op_strategy`] with allocation sizes drawn from `sizes`.
pub fn op_strategy_sized(sizes: impl Strategy<Value = u64>) -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0..2usize, 0..3usize, sizes).prop_map(|(dev, stream, size)| Op::Alloc { dev, stream, size }),
        7 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 0..3usize).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, other)| Op::Launch { pick, other }),
        2 => (0..2usize, 0..3usize).prop_map(|(dev, stream)| Op::Complete { dev, stream }),
        1 => (0..2usize).prop_map(|dev| Op::Trim { dev }),
        1 => (0..2usize).prop_map(|dev| Op::Defragment { dev }),
    ]
}

pub struct Live {
    pub dev: usize,
    pub ptr: u64,
    pub size: u64,
    pub stream: StreamId,
    /// Streams allowed to use it: its own and those named by record_stream.
    pub users: Vec<StreamId>,
    pub pattern: u64,
}

impl Live {
    /// Offsets checked in an allocation: its first and last 8 bytes and one word in every page,
    /// none overlapping another (a page's word within 8 bytes of the last word would be
    /// overwritten by it, and read back as lost).
    pub fn probe_offsets(size: u64) -> Vec<u64> {
        let mut v = vec![0];
        let mut off = PAGE - 8;
        while off + 16 <= size {
            v.push(off);
            off += PAGE;
        }
        if size >= 8 {
            v.push(size - 8);
        }
        v
    }

    pub fn write_pattern(&self) {
        if self.size < 16 {
            unsafe {
                std::ptr::write_bytes(self.ptr as *mut u8, self.pattern as u8, self.size as usize)
            };
            return;
        }
        for off in Self::probe_offsets(self.size) {
            unsafe { std::ptr::write_unaligned((self.ptr + off) as *mut u64, self.pattern ^ off) };
        }
    }

    pub fn check_pattern(&self) -> Result<(), String> {
        if self.size < 16 {
            for i in 0..self.size {
                let b = unsafe { *((self.ptr + i) as *const u8) };
                if b != self.pattern as u8 {
                    return Err(format!("byte {i} of {:#x} changed", self.ptr));
                }
            }
            return Ok(());
        }
        for off in Self::probe_offsets(self.size) {
            let v = unsafe { std::ptr::read_unaligned((self.ptr + off) as *const u64) };
            if v != self.pattern ^ off {
                return Err(format!(
                    "allocation {:#x}+{} lost its pattern at offset {off}",
                    self.ptr, self.size
                ));
            }
        }
        Ok(())
    }
}

/// Two devices of one backend, an arena on each, and the model's live allocations.
pub struct Rig<G: TestGpu> {
    pub gpus: Vec<G>,
    pub arenas: Vec<Arena>,
    pub live: Vec<Live>,
    pub next_pattern: u64,
}

impl<G: TestGpu> Rig<G> {
    /// An arena with the settings of `conf` on each of `gpus`.
    pub fn new(gpus: Vec<G>, conf: &Config) -> Rig<G> {
        let arenas = gpus
            .iter()
            .map(|g| Arena::new(g.device(), conf).unwrap())
            .collect();
        Rig {
            gpus,
            arenas,
            live: Vec::new(),
            next_pattern: 1,
        }
    }

    pub fn apply(&mut self, op: &Op) -> Result<(), String> {
        for g in &self.gpus {
            g.before_step();
        }
        match *op {
            Op::Alloc { dev, stream, size } => {
                let stream = STREAMS[stream];
                let Ok(ptr) = self.arenas[dev].malloc(size, stream) else {
                    return Ok(());
                };
                if ptr % 512 != 0 {
                    return Err(format!("{ptr:#x} is not 512-byte aligned"));
                }
                let busy: Vec<_> = self.gpus[dev]
                    .busy_overlapping(ptr, size)
                    .into_iter()
                    .filter(|b| b.0 != stream)
                    .collect();
                if !busy.is_empty() {
                    return Err(format!(
                        "{ptr:#x}+{size} handed to stream {stream} while in use: {busy:?}"
                    ));
                }
                let l = Live {
                    dev,
                    ptr,
                    size,
                    stream,
                    users: vec![stream],
                    pattern: self.next_pattern,
                };
                self.next_pattern = self
                    .next_pattern
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                l.write_pattern();
                self.live.push(l);
            }
            Op::Free { pick } if !self.live.is_empty() => {
                let l = self.live.swap_remove(pick % self.live.len());
                l.check_pattern()?;
                self.arenas[l.dev]
                    .free(l.ptr, Some(l.size), l.stream)
                    .map_err(|e| e.to_string())?;
            }
            Op::RecordStream { pick, stream } if !self.live.is_empty() => {
                let n = self.live.len();
                let l = &mut self.live[pick % n];
                let s = STREAMS[stream];
                self.arenas[l.dev]
                    .record_stream(l.ptr + l.size / 2, s)
                    .map_err(|e| e.to_string())?;
                if !l.users.contains(&s) {
                    l.users.push(s);
                }
            }
            Op::Launch { pick, other } if !self.live.is_empty() => {
                let n = self.live.len();
                let l = &self.live[pick % n];
                let s = if other {
                    *l.users.last().unwrap()
                } else {
                    l.stream
                };
                self.gpus[l.dev].launch(s, l.ptr, l.size);
            }
            Op::Complete { dev, stream } => self.gpus[dev].complete(STREAMS[stream]),
            Op::Trim { dev } => {
                self.arenas[dev].empty_cache().map_err(|e| e.to_string())?;
            }
            Op::Defragment { dev } => {
                self.arenas[dev].defragment().map_err(|e| e.to_string())?;
            }
            _ => {}
        }
        Ok(())
    }

    pub fn check(&self) -> Result<(), String> {
        for dev in 0..self.gpus.len() {
            let live = self.live.iter().filter(|l| l.dev == dev);
            let gpu = &self.gpus[dev];
            check_arena(&self.arenas[dev], live, gpu.held_bytes(), gpu.violations())
                .map_err(|e| format!("device {dev}: {e}"))?;
        }
        Ok(())
    }

    /// Free everything, let the GPU finish, trim: nothing may be held afterwards.
    pub fn drain(&mut self) -> Result<(), String> {
        for l in std::mem::take(&mut self.live) {
            l.check_pattern()?;
            self.arenas[l.dev]
                .free(l.ptr, Some(l.size), l.stream)
                .map_err(|e| e.to_string())?;
        }
        for dev in 0..self.gpus.len() {
            self.gpus[dev].complete_all();
            self.arenas[dev].empty_cache().map_err(|e| e.to_string())?;
            let st = self.arenas[dev].stats();
            for (name, v) in [
                ("allocation", st.allocation.all().current),
                ("active", st.active.all().current),
                ("allocated_bytes", st.allocated_bytes.all().current),
                ("reserved_bytes", st.reserved_bytes.all().current),
                (
                    "inactive_split_bytes",
                    st.inactive_split_bytes.all().current,
                ),
            ] {
                if v != 0 {
                    return Err(format!(
                        "device {dev}: {name} is {v} after freeing everything and trimming"
                    ));
                }
            }
        }
        // Leaks are checked once every device is drained: a backend may only be able to count
        // what is held across all its devices.
        for (dev, gpu) in self.gpus.iter().enumerate() {
            if let Some(leak) = gpu.leaks() {
                return Err(format!("device {dev}: {leak} after trim"));
            }
        }
        self.check()
    }
}

/// Runs `ops` on `rig`, checking every invariant after each step, then drains it.
pub fn run<G: TestGpu>(mut rig: Rig<G>, ops: &[Op]) -> Result<(), String> {
    for (i, op) in ops.iter().enumerate() {
        rig.apply(op).map_err(|e| format!("step {i} {op:?}: {e}"))?;
        rig.check()
            .map_err(|e| format!("after step {i} {op:?}: {e}"))?;
    }
    rig.drain()
}

/// Runs `ops` on `rig` while reserve, create and map calls fail at random (about one in five,
/// seeded by `seed`): every failure leaves the arena consistent, and after draining no page,
/// mapping or reservation beyond the arena's is left.
pub fn run_with_failures<G: TestGpu>(mut rig: Rig<G>, seed: u64, ops: &[Op]) -> Result<(), String> {
    for gpu in &rig.gpus {
        gpu.fail_randomly(seed, 5);
    }
    for (i, op) in ops.iter().enumerate() {
        // Trim and defragment may fail when an unmap is refused; the rest must not.
        let r = rig.apply(op);
        if let Err(e) = r
            && !matches!(op, Op::Trim { .. } | Op::Defragment { .. })
        {
            return Err(format!("step {i} {op:?}: {e}"));
        }
        rig.check()
            .map_err(|e| format!("after step {i} {op:?}: {e}"))?;
    }
    for gpu in &rig.gpus {
        gpu.stop_failing();
    }
    rig.drain()
}

/// One arena against the allocations the model holds live on it (`live`), the bytes its device
/// holds for it (`held`) and the stream-safety violations its device saw: every live allocation
/// still holds its pattern and none overlaps another; the live count, requested and allocated
/// bytes equal the model's; active is at least the live count; reserved bytes equal `held`; no
/// peak is below its current value; the pools sum to all; the arena's own consistency check
/// passes.
pub fn check_arena<'a>(
    arena: &Arena,
    live: impl IntoIterator<Item = &'a Live>,
    held: u64,
    violations: Vec<String>,
) -> Result<(), String> {
    let mut spans: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut count, mut requested, mut allocated) = (0i64, 0i64, 0i64);
    for l in live {
        l.check_pattern()?;
        spans.insert(l.ptr, l.size);
        count += 1;
        requested += l.size as i64;
        allocated += expected_block(l.size) as i64;
    }
    let mut end = 0;
    for (&p, &s) in &spans {
        if p < end {
            return Err(format!(
                "allocation {p:#x} overlaps the previous one (ends {end:#x})"
            ));
        }
        end = p + s;
    }
    let st = arena.stats();
    let got = (
        st.allocation.all().current,
        st.requested_bytes.all().current,
        st.allocated_bytes.all().current,
    );
    if got != (count, requested, allocated) {
        return Err(format!(
            "stats (count, requested, allocated) = {got:?}, model {:?}",
            (count, requested, allocated)
        ));
    }
    if st.active.all().current < count {
        return Err(format!(
            "active {} below live count {count}",
            st.active.all().current
        ));
    }
    let held = held as i64;
    if st.reserved_bytes.all().current != held {
        return Err(format!(
            "reserved_bytes {} but the device holds {held}",
            st.reserved_bytes.all().current
        ));
    }
    if st.allocated_bytes.all().peak < allocated || st.reserved_bytes.all().peak < held {
        return Err("a peak is below the current value".into());
    }
    pools_sum_to_all(&st)?;
    arena.check_consistency()?;
    if !violations.is_empty() {
        return Err(format!("stream-safety violations: {violations:?}"));
    }
    Ok(())
}

/// PyTorch's invariant of `memory_stats()`: every update of a pool's stat also updates the
/// aggregate (CUDACachingAllocator.cpp's `for_each_selected_stat_type`), so for every stat X
/// `X.all.{current,allocated,freed}` equal `X.small_pool.*` + `X.large_pool.*`; the pools'
/// peaks fall at different times, so `X.all.peak` is at most their sum and at least each.
pub fn pools_sum_to_all(st: &torch_arena::stats::DeviceStats) -> Result<(), String> {
    use torch_arena::stats::keys;
    for (key, all) in keys::flatten(st) {
        let Some((stat, field)) = key.split_once(".all.") else {
            continue;
        };
        let pool = |p: &str| keys::get(st, &format!("{stat}.{p}.{field}")).unwrap();
        let (small, large) = (pool("small_pool"), pool("large_pool"));
        let ok = match field {
            "peak" => all <= small + large && all >= small.max(large),
            _ => all == small + large,
        };
        if !ok {
            return Err(format!(
                "{key} = {all}, but small_pool {small} + large_pool {large} = {}",
                small + large
            ));
        }
    }
    Ok(())
}
