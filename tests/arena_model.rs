//! Property tests of the arena against a simple model, on host-backed simulated devices.
//!
//! Random sequences of alloc / free / record_stream / launch / complete / trim / defragment over
//! three streams and two devices. After every step:
//! - live allocations never overlap, and each still holds the pattern written into it (every page
//!   of it, so a remap under a live block would show);
//! - a block handed out on stream T never overlaps memory another stream's uncompleted work uses;
//! - the sim device saw no unmap or release of memory a stream may still use;
//! - `allocation`, `active`, `requested_bytes` and `allocated_bytes` equal the model's figures and
//!   `reserved_bytes` equals the physical bytes the device holds for us;
//! - the arena's own consistency check passes.
//!
//! At the end everything is freed and trimmed: nothing may be held.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use torch_arena::arena::Arena;
use torch_arena::config::Config;
use torch_arena::device::sim::{SimConfig, SimDevice};
use torch_arena::device::{Device, StreamId};

const PAGE: u64 = 2 << 20;
const STREAMS: [StreamId; 3] = [0, 7, 9];

/// The block size a request should get, derived from the documented class spacing (not from the
/// arena's own table): 512-byte steps to 4 KiB, then 8 classes per doubling to 1 MiB; above that,
/// the request rounded up to 512 bytes.
fn expected_block(size: u64) -> u64 {
    if size > 1 << 20 {
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
enum Op {
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

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..4096,
        3 => 4096u64..(1 << 20) + 1,
        2 => (1u64 << 20)..(6 << 20),
        1 => (6u64 << 20)..(24 << 20),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0..2usize, 0..3usize, size_strategy()).prop_map(|(dev, stream, size)| Op::Alloc { dev, stream, size }),
        7 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => (any::<usize>(), 0..3usize).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, other)| Op::Launch { pick, other }),
        2 => (0..2usize, 0..3usize).prop_map(|(dev, stream)| Op::Complete { dev, stream }),
        1 => (0..2usize).prop_map(|dev| Op::Trim { dev }),
        1 => (0..2usize).prop_map(|dev| Op::Defragment { dev }),
    ]
}

struct Live {
    dev: usize,
    ptr: u64,
    size: u64,
    stream: StreamId,
    /// Streams allowed to use it: its own and those named by record_stream.
    users: Vec<StreamId>,
    pattern: u64,
}

struct Rig {
    sims: Vec<Arc<SimDevice>>,
    arenas: Vec<Arena>,
    live: Vec<Live>,
    next_pattern: u64,
}

impl Rig {
    fn new(capacity_mb: u64, conf: &Config) -> Rig {
        let mut sims = Vec::new();
        let mut arenas = Vec::new();
        for d in 0..2 {
            let mut c = SimConfig::new(capacity_mb << 20, PAGE, true);
            c.ordinal = d;
            let sim = Arc::new(SimDevice::new(c).unwrap());
            arenas.push(Arena::new(sim.clone() as Arc<dyn Device>, conf).unwrap());
            sims.push(sim);
        }
        Rig {
            sims,
            arenas,
            live: Vec::new(),
            next_pattern: 1,
        }
    }

    /// Offsets checked in an allocation: its first and last 8 bytes and one word in every page.
    fn probe_offsets(size: u64) -> Vec<u64> {
        let mut v = vec![0];
        let mut off = PAGE - 8;
        while off + 8 < size {
            v.push(off);
            off += PAGE;
        }
        if size >= 8 {
            v.push(size - 8);
        }
        v
    }

    fn write_pattern(l: &Live) {
        if l.size < 16 {
            unsafe { std::ptr::write_bytes(l.ptr as *mut u8, l.pattern as u8, l.size as usize) };
            return;
        }
        for off in Self::probe_offsets(l.size) {
            unsafe { std::ptr::write_unaligned((l.ptr + off) as *mut u64, l.pattern ^ off) };
        }
    }

    fn check_pattern(l: &Live) -> Result<(), String> {
        if l.size < 16 {
            for i in 0..l.size {
                let b = unsafe { *((l.ptr + i) as *const u8) };
                if b != l.pattern as u8 {
                    return Err(format!("byte {i} of {:#x} changed", l.ptr));
                }
            }
            return Ok(());
        }
        for off in Self::probe_offsets(l.size) {
            let v = unsafe { std::ptr::read_unaligned((l.ptr + off) as *const u64) };
            if v != l.pattern ^ off {
                return Err(format!(
                    "allocation {:#x}+{} lost its pattern at offset {off}",
                    l.ptr, l.size
                ));
            }
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Alloc { dev, stream, size } => {
                let stream = STREAMS[stream];
                let Ok(ptr) = self.arenas[dev].malloc(size, stream) else {
                    return Ok(());
                };
                if ptr % 512 != 0 {
                    return Err(format!("{ptr:#x} is not 512-byte aligned"));
                }
                let busy: Vec<_> = self.sims[dev]
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
                Self::write_pattern(&l);
                self.live.push(l);
            }
            Op::Free { pick } if !self.live.is_empty() => {
                let l = self.live.swap_remove(pick % self.live.len());
                Self::check_pattern(&l)?;
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
                self.sims[l.dev].launch(s, l.ptr, l.size);
            }
            Op::Complete { dev, stream } => self.sims[dev].complete(STREAMS[stream]),
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

    fn check(&self) -> Result<(), String> {
        for dev in 0..2 {
            let mut spans: BTreeMap<u64, u64> = BTreeMap::new();
            let (mut count, mut requested, mut allocated) = (0i64, 0i64, 0i64);
            for l in self.live.iter().filter(|l| l.dev == dev) {
                Self::check_pattern(l)?;
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
            let st = self.arenas[dev].stats();
            let got = (
                st.allocation.all().current,
                st.requested_bytes.all().current,
                st.allocated_bytes.all().current,
            );
            if got != (count, requested, allocated) {
                return Err(format!(
                    "device {dev}: stats (count, requested, allocated) = {got:?}, model {:?}",
                    (count, requested, allocated)
                ));
            }
            if st.active.all().current < count {
                return Err(format!(
                    "active {} below live count {count}",
                    st.active.all().current
                ));
            }
            let held = self.sims[dev].used_bytes() as i64;
            if st.reserved_bytes.all().current != held {
                return Err(format!(
                    "reserved_bytes {} but the device holds {held}",
                    st.reserved_bytes.all().current
                ));
            }
            if st.allocated_bytes.all().peak < allocated || st.reserved_bytes.all().peak < held {
                return Err("a peak is below the current value".into());
            }
            self.arenas[dev].check_consistency()?;
            let v = self.sims[dev].violations();
            if !v.is_empty() {
                return Err(format!("stream-safety violations: {v:?}"));
            }
        }
        Ok(())
    }

    /// Free everything, let the GPU finish, trim: nothing may be held afterwards.
    fn drain(&mut self) -> Result<(), String> {
        for l in std::mem::take(&mut self.live) {
            Self::check_pattern(&l)?;
            self.arenas[l.dev]
                .free(l.ptr, Some(l.size), l.stream)
                .map_err(|e| e.to_string())?;
        }
        for dev in 0..2 {
            self.sims[dev].complete_all();
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
            let sim = &self.sims[dev];
            if sim.live_pages() != 0 || sim.mapped_pages() != 0 || sim.used_bytes() != 0 {
                return Err(format!(
                    "device {dev}: {} pages, {} mapped, {} bytes still held after trim",
                    sim.live_pages(),
                    sim.mapped_pages(),
                    sim.used_bytes()
                ));
            }
        }
        self.check()
    }
}

fn run(ops: &[Op], capacity_mb: u64, conf: &Config) -> Result<(), String> {
    let mut rig = Rig::new(capacity_mb, conf);
    for (i, op) in ops.iter().enumerate() {
        rig.apply(op).map_err(|e| format!("step {i} {op:?}: {e}"))?;
        rig.check()
            .map_err(|e| format!("after step {i} {op:?}: {e}"))?;
    }
    rig.drain()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_every_invariant(ops in prop::collection::vec(op_strategy(), 1..160)) {
        run(&ops, 256, &Config::default()).map_err(TestCaseError::fail)?;
    }

    /// A tiny device: allocations fail with OOM, and the arena must stay exact through it.
    #[test]
    fn out_of_memory_keeps_every_invariant(ops in prop::collection::vec(op_strategy(), 1..120)) {
        run(&ops, 48, &Config::default()).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn without_stitching(ops in prop::collection::vec(op_strategy(), 1..120)) {
        let conf = Config { stitch: false, ..Config::default() };
        run(&ops, 96, &conf).map_err(TestCaseError::fail)?;
    }

    /// Driver calls fail at random (reserve, create, map): every failure leaves the arena
    /// consistent, and after draining no page, mapping or reservation beyond the arena's is left.
    #[test]
    fn random_driver_failures_leak_nothing(seed in any::<u64>(), ops in prop::collection::vec(op_strategy(), 1..120)) {
        let mut rig = Rig::new(128, &Config::default());
        for sim in &rig.sims {
            sim.fail_randomly(seed, 5);
        }
        for (i, op) in ops.iter().enumerate() {
            // Trim and defragment may fail when an unmap is refused; the rest must not.
            let r = rig.apply(op);
            if let Err(e) = r && !matches!(op, Op::Trim { .. } | Op::Defragment { .. }) {
                return Err(TestCaseError::fail(format!("step {i} {op:?}: {e}")));
            }
            rig.check().map_err(|e| TestCaseError::fail(format!("after step {i} {op:?}: {e}")))?;
        }
        for sim in &rig.sims {
            sim.stop_failing();
        }
        rig.drain().map_err(TestCaseError::fail)?;
    }
}

#[test]
fn memory_freed_on_one_stream_waits_for_it_before_another_stream_gets_it() {
    let mut c = SimConfig::new(8 << 20, PAGE, true);
    c.ordinal = 0;
    let sim = Arc::new(SimDevice::new(c).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    // Fill the device from stream 1, keep the GPU busy on all of it, free it all.
    let blocks: Vec<u64> = (0..4).map(|_| arena.malloc(2 << 20, 1).unwrap()).collect();
    for &b in &blocks {
        sim.launch(1, b, 2 << 20);
        arena.free(b, Some(2 << 20), 1).unwrap();
    }
    // Stream 1 reuses its own memory at once, with no synchronisation.
    let again = arena.malloc(2 << 20, 1).unwrap();
    assert!(blocks.contains(&again));
    assert_eq!(
        sim.stream_progress(1).1,
        0,
        "same-stream reuse must not wait for the GPU"
    );
    arena.free(again, Some(2 << 20), 1).unwrap();
    // Stream 2 gets it only after stream 1's work completed (the arena waits for it).
    let other = arena.malloc(8 << 20, 2).unwrap();
    let (submitted, completed) = sim.stream_progress(1);
    assert_eq!(
        submitted, completed,
        "cross-stream reuse before stream 1 finished"
    );
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
    arena.free(other, Some(8 << 20), 2).unwrap();
    arena.check_consistency().unwrap();
}

#[test]
fn record_stream_defers_reuse_until_the_other_stream_is_done() {
    let sim = Arc::new(SimDevice::new(SimConfig::new(64 << 20, PAGE, true)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let a = arena.malloc(4096, 1).unwrap();
    arena.record_stream(a, 2).unwrap();
    sim.launch(2, a, 4096);
    arena.free(a, Some(4096), 1).unwrap();
    // Still active (pending), no longer allocated.
    let st = arena.stats();
    assert_eq!(st.active.all().current, 1);
    assert_eq!(st.allocation.all().current, 0);
    let b = arena.malloc(4096, 1).unwrap();
    assert_ne!(a, b, "a block still used by stream 2 was reused");
    sim.complete(2);
    arena.free(b, Some(4096), 1).unwrap();
    assert_eq!(
        arena.stats().active.all().current,
        0,
        "the pending free finished once stream 2 completed"
    );
    arena.check_consistency().unwrap();
}

#[test]
fn stitching_reuses_pages_across_address_fragmentation() {
    // 16 MiB device. Allocate 8 × 2 MiB, free every other one: 8 MiB free in four 2 MiB holes.
    // An 8 MiB request fits no hole, but the freed pages back a new range: no OOM.
    let sim = Arc::new(SimDevice::new(SimConfig::new(16 << 20, PAGE, true)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let blocks: Vec<u64> = (0..8).map(|_| arena.malloc(2 << 20, 0).unwrap()).collect();
    for b in blocks.iter().step_by(2) {
        arena.free(*b, Some(2 << 20), 0).unwrap();
    }
    let big = arena
        .malloc(8 << 20, 0)
        .expect("stitched from four scattered pages");
    unsafe { std::ptr::write_bytes(big as *mut u8, 0xab, 8 << 20) };
    assert_eq!(arena.stats().reserved_bytes.all().current, 16 << 20);
    arena.check_consistency().unwrap();
}

#[test]
fn oom_message_names_every_figure() {
    let sim = Arc::new(SimDevice::new(SimConfig::new(8 << 20, PAGE, false)).unwrap());
    let arena = Arena::new(sim as Arc<dyn Device>, &Config::default()).unwrap();
    let a = arena.malloc(6 << 20, 0).unwrap();
    let err = arena.malloc(4 << 20, 0).unwrap_err().to_string();
    assert!(
        err.starts_with("CUDA out of memory. Tried to allocate 4.00 MiB."),
        "{err}"
    );
    for needle in [
        "total capacity of 8.00 MiB",
        "reserved",
        "allocated",
        "cached",
        "fragmentation",
    ] {
        assert!(err.contains(needle), "{needle:?} missing from: {err}");
    }
    assert_eq!(arena.stats().num_ooms, 1);
    arena.free(a, Some(6 << 20), 0).unwrap();
    // The process goes on: the same request now fits.
    arena.malloc(4 << 20, 0).unwrap();
}

#[test]
fn bad_frees_are_reported_and_change_nothing() {
    let sim = Arc::new(SimDevice::new(SimConfig::new(64 << 20, PAGE, false)).unwrap());
    let arena = Arena::new(sim as Arc<dyn Device>, &Config::default()).unwrap();
    let small = arena.malloc(1000, 0).unwrap();
    let large = arena.malloc(3 << 20, 0).unwrap();
    let before = arena.stats();
    let e = arena.free(0xdead_0000, Some(8), 0).unwrap_err().to_string();
    assert!(
        e.contains("0xdead0000") && e.contains("not allocated by torch-arena"),
        "{e}"
    );
    let e = arena.free(large + 4096, None, 0).unwrap_err().to_string();
    assert!(e.contains("inside the allocation"), "{e}");
    assert_eq!(arena.stats(), before, "a bad free changed the stats");
    arena.free(small, Some(1000), 0).unwrap();
    let e = arena.free(small, Some(1000), 0).unwrap_err().to_string();
    assert!(e.contains("double free"), "{e}");
    let e = arena.free(large, Some(5), 0).unwrap_err().to_string();
    assert!(
        e.contains("size mismatch") && e.contains("allocated with size 3145728"),
        "{e}"
    );
    assert_eq!(arena.stats().allocation.all().current, 0);
    assert_eq!(arena.extras().bad_frees, 4);
    arena.check_consistency().unwrap();
}

#[test]
fn slabs_drain_and_their_pages_return() {
    let sim = Arc::new(SimDevice::new(SimConfig::new(256 << 20, PAGE, false)).unwrap());
    let arena = Arena::new(sim as Arc<dyn Device>, &Config::default()).unwrap();
    // 4096 slots of 512 B per slab: fill 8 slabs, then free all but one allocation per slab
    // except the first; then allocate again: new allocations go to the fullest slabs.
    let ptrs: Vec<u64> = (0..8 * 4096)
        .map(|_| arena.malloc(512, 0).unwrap())
        .collect();
    assert_eq!(
        arena
            .stats()
            .segment
            .pool(torch_arena::stats::Pool::Small)
            .current,
        8
    );
    for (i, p) in ptrs.iter().enumerate() {
        if i >= 4096 && i % 4096 != 0 {
            arena.free(*p, Some(512), 0).unwrap();
        }
    }
    // Freeing the last allocation of each nearly empty slab dissolves it.
    for p in ptrs.iter().skip(4096).step_by(4096) {
        arena.free(*p, Some(512), 0).unwrap();
    }
    let report = arena.defragment().unwrap();
    assert_eq!(
        report.pages_unmapped, 7,
        "seven emptied slabs give their pages back: {report:?}"
    );
    let st = arena.stats();
    assert_eq!(st.segment.pool(torch_arena::stats::Pool::Small).current, 1);
    assert_eq!(
        st.inactive_split
            .pool(torch_arena::stats::Pool::Small)
            .current,
        0,
        "the one slab left is full"
    );
    arena.check_consistency().unwrap();
}

#[test]
fn fallback_without_vmm_uses_plain_segments() {
    let mut c = SimConfig::new(256 << 20, PAGE, true);
    c.vmm = false;
    let sim = Arc::new(SimDevice::new(c).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let a = arena.malloc(3 << 20, 0).unwrap();
    let b = arena.malloc(100, 0).unwrap();
    let c2 = arena.malloc(50 << 20, 0).unwrap();
    unsafe {
        std::ptr::write_bytes(a as *mut u8, 1, 3 << 20);
        std::ptr::write_bytes(c2 as *mut u8, 2, 50 << 20);
    }
    assert_eq!(sim.counters().mem_create, 0);
    for (p, s) in [(a, 3 << 20), (b, 100), (c2, 50 << 20)] {
        arena.free(p, Some(s), 0).unwrap();
    }
    arena.empty_cache().unwrap();
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
    assert_eq!(sim.live_plain(), 0);
    arena.check_consistency().unwrap();
}

#[test]
fn memory_fraction_caps_reserved() {
    let sim = Arc::new(SimDevice::new(SimConfig::new(64 << 20, PAGE, false)).unwrap());
    let arena = Arena::new(sim as Arc<dyn Device>, &Config::default()).unwrap();
    arena.set_memory_fraction(0.25).unwrap();
    let a = arena.malloc(16 << 20, 0).unwrap();
    assert!(arena.malloc(2 << 20, 0).is_err(), "the cap is 16 MiB");
    arena.free(a, Some(16 << 20), 0).unwrap();
    assert!(arena.stats().reserved_bytes.all().peak <= 16 << 20);
}

#[test]
fn idle_pages_are_released_after_the_configured_time() {
    let sim = Arc::new(SimDevice::new(SimConfig::new(64 << 20, PAGE, false)).unwrap());
    let conf = Config {
        release_idle_ms: 1,
        ..Config::default()
    };
    let arena = Arena::new(sim as Arc<dyn Device>, &conf).unwrap();
    let a = arena.malloc(8 << 20, 0).unwrap();
    arena.free(a, Some(8 << 20), 0).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    // Decay runs on the next free that leaves a page idle.
    let b = arena.malloc(3 << 20, 0).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    arena.free(b, Some(3 << 20), 0).unwrap();
    assert!(
        arena.stats().reserved_bytes.all().current < 8 << 20,
        "pages idle for longer than release_idle_ms were kept: {}",
        arena.stats().reserved_bytes.all().current
    );
    assert!(arena.stats().num_device_free > 0);
}
