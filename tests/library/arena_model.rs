//! Property tests of the arena against a simple model, on host-backed simulated devices.
//!
//! The model itself (the operations, their strategies, the checks after every step and the final
//! drain) lives in `common/model.rs`, shared with `arena_cuda_fake.rs`, which runs the same
//! sequences through `CudaDevice` over the fake driver. Here each device is a [`SimDevice`]:
//! - live allocations never overlap, and each still holds the pattern written into it (every page
//!   of it, so a remap under a live block would show);
//! - a block handed out on stream T never overlaps memory another stream's uncompleted work uses;
//! - the sim device saw no unmap or release of memory a stream may still use;
//! - `allocation`, `active`, `requested_bytes` and `allocated_bytes` equal the model's figures and
//!   `reserved_bytes` equals the physical bytes the device holds for us;
//! - the arena's own consistency check passes.
//!
//! At the end everything is freed and trimmed: nothing may be held.

use crate::model;

use std::sync::Arc;

use model::{PAGE, Rig, TestGpu, large_size_strategy, op_strategy, op_strategy_sized};
use proptest::prelude::*;
use torch_arena::arena::{Arena, Growth};
use torch_arena::config::Config;
use torch_arena::device::sim::{SimConfig, SimDevice};
use torch_arena::device::{Device, StreamId};
use torch_arena::stats::Pool;

/// A simulated device: everything forwards to [`SimDevice`], which checks stream safety itself
/// at every unmap and release.
struct SimGpu(Arc<SimDevice>);

impl TestGpu for SimGpu {
    fn device(&self) -> Arc<dyn Device> {
        self.0.clone() as Arc<dyn Device>
    }
    fn launch(&self, stream: StreamId, ptr: u64, len: u64) {
        self.0.launch(stream, ptr, len);
    }
    fn complete(&self, stream: StreamId) {
        self.0.complete(stream);
    }
    fn complete_all(&self) {
        self.0.complete_all();
    }
    fn busy_overlapping(&self, ptr: u64, len: u64) -> Vec<(StreamId, u64, u64)> {
        self.0.busy_overlapping(ptr, len)
    }
    fn violations(&self) -> Vec<String> {
        self.0.violations()
    }
    fn held_bytes(&self) -> u64 {
        self.0.used_bytes()
    }
    fn leaks(&self) -> Option<String> {
        let sim = &self.0;
        (sim.live_pages() != 0 || sim.mapped_pages() != 0 || sim.used_bytes() != 0).then(|| {
            format!(
                "{} pages, {} mapped, {} bytes still held",
                sim.live_pages(),
                sim.mapped_pages(),
                sim.used_bytes()
            )
        })
    }
    fn fail_randomly(&self, seed: u64, one_in: u64) {
        self.0.fail_randomly(seed, one_in);
    }
    fn stop_failing(&self) {
        self.0.stop_failing();
    }
}

/// Two host-backed simulated devices of `capacity_mb` MiB each, with an arena on each.
fn sim_rig(capacity_mb: u64, conf: &Config) -> Rig<SimGpu> {
    let gpus = (0..2)
        .map(|d| {
            let mut c = SimConfig::new(capacity_mb << 20, PAGE, true);
            c.ordinal = d;
            SimGpu(Arc::new(SimDevice::new(c).unwrap()))
        })
        .collect();
    Rig::new(gpus, conf)
}

fn run(ops: &[model::Op], capacity_mb: u64, conf: &Config) -> Result<(), String> {
    model::run(sim_rig(capacity_mb, conf), ops)
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

    /// Blocks of up to 160 MiB on a 640 MiB device: most are large handles (the limit's 1/32 is
    /// 20 MiB), so their boundary pages go apart and placement weighs stranding them, and the
    /// limit is reached often (stitching, the ladder, out of memory).
    #[test]
    fn large_handles_near_the_limit_keep_every_invariant(
        ops in prop::collection::vec(op_strategy_sized(large_size_strategy()), 1..120),
    ) {
        run(&ops, 640, &Config::default()).map_err(TestCaseError::fail)?;
    }

    /// Driver calls fail at random (reserve, create, map): every failure leaves the arena
    /// consistent, and after draining no page, mapping or reservation beyond the arena's is left.
    #[test]
    fn random_driver_failures_leak_nothing(seed in any::<u64>(), ops in prop::collection::vec(op_strategy(), 1..120)) {
        model::run_with_failures(sim_rig(128, &Config::default()), seed, &ops).map_err(TestCaseError::fail)?;
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

/// An 8 GiB device with a medium block first, so that what follows starts and ends inside
/// pages; then a 768 MiB block `b` (one handle, a large one: over 1/32 of the limit) and a
/// 64 MiB block `c` right after it, on `b`'s last page; then 7,000 MiB, which leaves about
/// 350 MiB under the limit. Returns the arena and `b`.
fn a_large_block_with_a_neighbour_on_its_last_page() -> (Arc<SimDevice>, Arena, u64) {
    let sim = Arc::new(SimDevice::new(SimConfig::new(8 << 30, PAGE, false)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let a = arena.malloc(8_519_680, 0).unwrap();
    let b = arena.malloc(768 << 20, 0).unwrap();
    let c = arena.malloc(64 << 20, 0).unwrap();
    assert_eq!(c, b + (768 << 20), "c right after b");
    assert_ne!(c % PAGE, 0, "c starts inside b's last page");
    assert_ne!(a % PAGE + 8_519_680, PAGE * 5, "b starts inside a page");
    arena.malloc(7_000 << 20, 0).unwrap();
    (sim, arena, b)
}

#[test]
fn a_large_blocks_handle_is_not_held_by_a_neighbour_on_its_boundary_page() {
    // The boundary page `b` shares with `c` is a handle of its own: once `b` is freed its handle
    // (380 pages: its first ones are the spare pages of the medium block's growth step) is idle,
    // not held by `c`, and a 1,000 MiB request, more than the limit leaves, moves it. Were the
    // page in `b`'s handle, `c` would hold all 768 MiB and the request would run out of memory
    // with 7.8 GiB requested of 8.
    let (_sim, arena, b) = a_large_block_with_a_neighbour_on_its_last_page();
    arena.free(b, Some(768 << 20), 0).unwrap();
    let pages = arena.extras().pages;
    assert!(pages.idle_mapped >= 380, "{pages:?}");
    assert!(pages.held < 8, "{pages:?}");
    let e = arena
        .malloc(1_000 << 20, 0)
        .expect("b's idle handle moves to the new block");
    assert_ne!(e, 0);
    let s = arena.stats();
    assert!(s.reserved_bytes.all().current <= 8 << 30);
    assert_eq!(
        arena.extras().pages.total() * PAGE,
        s.reserved_bytes.all().current as u64
    );
    arena.check_consistency().unwrap();
}

#[test]
fn a_block_is_not_placed_on_part_of_an_idle_large_handle_while_the_limit_leaves_room() {
    // With `b` freed, its range is the best fit for a 64 MiB block (and an 8 MiB one), and its
    // pages are mapped, but there the block would hold the rest of `b`'s 760 MiB handle, unusable
    // elsewhere and too short for a block of `b`'s size. While the limit leaves room, it goes to new pages instead,
    // and the 768 MiB block that comes back takes `b`'s place with no driver call.
    let sim = Arc::new(SimDevice::new(SimConfig::new(8 << 30, PAGE, false)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    arena.malloc(8_519_680, 0).unwrap();
    let b = arena.malloc(768 << 20, 0).unwrap();
    arena.malloc(64 << 20, 0).unwrap();
    arena.free(b, Some(768 << 20), 0).unwrap();
    let d = arena.malloc(64 << 20, 0).unwrap();
    assert!(!(b..b + (768 << 20)).contains(&d), "placed in b's range");
    // So does a medium block (under 20 MiB, placed by rules of its own).
    let m = arena.malloc(8 << 20, 0).unwrap();
    assert!(
        !(b..b + (768 << 20)).contains(&m),
        "medium block placed in b's range"
    );
    let creates = sim.counters().mem_create;
    assert_eq!(arena.malloc(768 << 20, 0).unwrap(), b);
    assert_eq!(sim.counters().mem_create, creates);
    arena.check_consistency().unwrap();
}

#[test]
fn pages_a_live_block_holds_unused_are_counted_and_named_when_memory_runs_out() {
    // A 100 MiB block's handle (under 1/32 of the limit: its last page is not apart) stays
    // mapped while the 64 MiB block after it lives on its last page: 50 pages held unused, which
    // the page counts and the out-of-memory message name, and which add up with the rest to
    // what is reserved.
    let sim = Arc::new(SimDevice::new(SimConfig::new(8 << 30, PAGE, false)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let b = arena.malloc((100 << 20) + 512, 0).unwrap();
    let c = arena.malloc(64 << 20, 0).unwrap();
    assert_eq!(c, b + (100 << 20) + 512);
    let before = arena.extras().pages;
    arena.free(b, Some((100 << 20) + 512), 0).unwrap();
    let pages = arena.extras().pages;
    assert_eq!(pages.held, before.held + 50, "{before:?} then {pages:?}");
    assert_eq!(pages.idle_mapped, before.idle_mapped);
    let reserved = arena.stats().reserved_bytes.all().current as u64;
    assert_eq!(pages.total() * PAGE, reserved);
    let e = arena.malloc(8 << 30, 0).unwrap_err().to_string();
    assert!(
        e.contains(
            "100.00 MiB unused in pages that cannot move (their handles also hold live allocations)"
        ),
        "{e}"
    );
    arena.check_consistency().unwrap();
}

#[test]
fn with_nothing_live_the_out_of_memory_message_calls_every_page_cached() {
    // Small tensors of many classes, all freed: the classes' current slabs stay, empty, each on
    // a page of the small pool (some of them handles of several pages). Nothing is live, so no
    // page "cannot move": a request for 1 PiB, refused before any driver call, reports every
    // reserved byte cached, not held "by live allocations" (issue 37, item 11).
    use torch_arena::stats::summary::format_size;
    let sim = Arc::new(SimDevice::new(SimConfig::new(16 << 30, PAGE, false)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let small: Vec<u64> = (0..20_000u64)
        .map(|i| arena.malloc(512 * (1 + i * 7919 % 2000), 1).unwrap())
        .collect();
    for p in small {
        arena.free(p, None, 1).unwrap();
    }
    let e = arena.malloc(1 << 50, 1).unwrap_err().to_string();
    let reserved = format_size(arena.stats().reserved_bytes.all().current as u64);
    assert!(
        e.contains(&format!("holds {reserved} reserved")) && e.contains("Live allocations: 0."),
        "{e}"
    );
    assert!(
        e.contains(&format!("(0 bytes requested), {reserved} cached")),
        "{e}"
    );
    assert!(
        e.contains(" 0 bytes unused in pages that cannot move"),
        "{e}"
    );
    let pages = arena.extras().pages;
    assert_eq!((pages.in_use, pages.held), (0, 0), "{pages:?}");
    arena.check_consistency().unwrap();

    // A freed block waiting for another stream (record_stream) is named as such.
    let b = arena.malloc(64 << 20, 1).unwrap();
    arena.record_stream(b, 2).unwrap();
    sim.launch(2, b, 64 << 20);
    arena.free(b, None, 1).unwrap();
    let e = arena.malloc(1 << 50, 1).unwrap_err().to_string();
    assert!(
        e.contains(
            "64.00 MiB in freed allocations waiting for the streams they were used on (record_stream)"
        ),
        "{e}"
    );
    arena.check_consistency().unwrap();
}

#[test]
fn medium_blocks_share_creates_whatever_the_large_blocks_hold() {
    // 1 GiB device: a 512 MiB block first (more than an eighth of the limit), then 3 MiB
    // blocks, each of 2 pages. Growth steps scale with what medium blocks needed, not with what
    // is held: once a few were created exactly, a create also covers the next ones.
    let sim = Arc::new(SimDevice::new(SimConfig::new(1 << 30, PAGE, false)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let big = arena.malloc(512 << 20, 0).unwrap();
    let before = sim.counters().mem_create;
    let medium: Vec<u64> = (0..40).map(|_| arena.malloc(3 << 20, 0).unwrap()).collect();
    let creates = sim.counters().mem_create - before;
    assert!(creates < 25, "40 medium blocks took {creates} creates");
    arena.check_consistency().unwrap();
    // Handles with spare pages hold at most an eighth of the limit (128 MiB): 240 MiB more of
    // medium blocks pass it, and from then on each block gets exactly its pages.
    let mut more: Vec<u64> = (0..80).map(|_| arena.malloc(3 << 20, 0).unwrap()).collect();
    for _ in 0..10 {
        let held = arena.stats().reserved_bytes.all().current;
        more.push(arena.malloc(3 << 20, 0).unwrap());
        let grew = arena.stats().reserved_bytes.all().current - held;
        assert!(
            grew <= 4 << 20,
            "a 3 MiB block grew the arena by {grew} bytes"
        );
    }
    arena.check_consistency().unwrap();
    free_all_and_trim(&arena, medium.into_iter().chain(more).chain([big]));
}

/// Free every block, trim, and check that nothing stays reserved: spare pages of growth steps
/// go back with the blocks that shared their handles.
fn free_all_and_trim(arena: &Arena, blocks: impl IntoIterator<Item = u64>) {
    for p in blocks {
        arena.free(p, None, 0).unwrap();
    }
    arena.empty_cache().unwrap();
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
    arena.check_consistency().unwrap();
}

/// Three `big` blocks side by side (the third keeps the second's range off the region's free
/// tail); the first is freed and a 2 MiB block comes. Taken from the freed range's start, it
/// would shift the range by 2 MiB: once the second block is freed too, the next `big` block
/// would straddle both blocks' pages and leave `big` - 2 MiB of mapped pages no block of its
/// size fits. Taken from its end, the range stays where the block that freed it was, and both
/// come back to their own pages with no driver call. A `big` block of at least 1/32 of the
/// limit has a large handle, which the 2 MiB block leaves whole (it goes to new pages), with the
/// same outcome. Returns the arena, empty.
fn a_2_mib_block_takes_the_end_of_a_freed_range(big: u64) -> Arena {
    let sim = Arc::new(SimDevice::new(SimConfig::new(80 << 30, PAGE, false)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let a = arena.malloc(big, 0).unwrap();
    let b = arena.malloc(big, 0).unwrap();
    let tail = arena.malloc(big, 0).unwrap();
    arena.free(a, None, 0).unwrap();
    let m = arena.malloc(2 << 20, 0).unwrap();
    // A large handle: at least 1/32 of the 80 GiB limit.
    let large_handle = big >= (80 << 30) / 32;
    if large_handle {
        assert!(
            !(a..a + big).contains(&m),
            "the 2 MiB block keeps off a's handle"
        );
    } else {
        assert_eq!(m, a + big - (2 << 20), "the 2 MiB block takes the end");
    }
    let held = arena.stats().reserved_bytes.all().current;
    arena.free(b, None, 0).unwrap();
    let before = sim.counters();
    let c = arena.malloc(big, 0).unwrap();
    arena.free(m, None, 0).unwrap();
    let d = arena.malloc(big, 0).unwrap();
    if large_handle {
        // The two freed ranges merged (nothing between them): each takes one, whichever.
        assert_eq!(
            (c.min(d), c.max(d)),
            (a.min(b), a.max(b)),
            "the blocks come back"
        );
    } else {
        assert_eq!((c, d), (b, a), "each block comes back to its own range");
    }
    assert_eq!(sim.counters().since(&before).memory_calls(), 0);
    assert_eq!(arena.stats().reserved_bytes.all().current, held);
    arena.check_consistency().unwrap();
    free_all_and_trim(&arena, [c, d, tail]);
    arena
}

#[test]
fn a_medium_block_in_a_freed_large_range_leaves_the_range_where_it_was() {
    // 4 GiB blocks: the freed range is over 2 GiB longer than the 2 MiB block (the rule's
    // threshold, `KEEP_RANGE_BYTES` in `src/arena/large.rs`), and its handle is a large one
    // (over 1/32 of the limit), which the block leaves whole.
    a_2_mib_block_takes_the_end_of_a_freed_range(4 << 30);
    // 2 GiB blocks: over 2 GiB of freed range, a handle under 1/32 of the limit: the end.
    a_2_mib_block_takes_the_end_of_a_freed_range((2 << 30) + (4 << 20));
}

#[test]
fn a_small_medium_block_in_a_freed_range_200_times_its_length_leaves_the_range_where_it_was() {
    // 512 MiB blocks, as silmont2000's `133f064` trace has them: the freed range is 510 MiB
    // longer than the 2 MiB block, far under 2 GiB, but over 200 times its length
    // (`KEEP_RANGE_TIMES`).
    const BIG: u64 = 512 << 20;
    let arena = a_2_mib_block_takes_the_end_of_a_freed_range(BIG);
    // A 3 MiB block is not 200 times shorter than that range: it takes the range's start.
    let a = arena.malloc(BIG, 0).unwrap();
    let b = arena.malloc(BIG, 0).unwrap();
    arena.free(a, None, 0).unwrap();
    let m = arena.malloc(3 << 20, 0).unwrap();
    assert_eq!(m, a, "a 3 MiB block takes the start");
    free_all_and_trim(&arena, [b, m]);
}

#[test]
fn a_medium_block_takes_a_growth_steps_spare_pages_before_a_range_a_large_block_left() {
    // Two 512 MiB blocks, then a 2 MiB block whose growth step (16 MiB, `GROWTH_FLOOR_BYTES`)
    // leaves 14 MiB of mapped spare pages after it. The first 512 MiB block is freed and a
    // second 2 MiB block comes. At the end of the freed range it would need no new page either,
    // but the range would then be too short for the 512 MiB block that comes back (sungdk0822
    // `dmodel16_seqlen4096` grew a seventh 512 MiB handle so): it takes the spare pages.
    const BIG: u64 = 512 << 20;
    const SMALL: u64 = 2 << 20;
    let sim = Arc::new(SimDevice::new(SimConfig::new(80 << 30, PAGE, false)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let a = arena.malloc(BIG, 0).unwrap();
    let b = arena.malloc(BIG, 0).unwrap();
    let m0 = arena.malloc(SMALL, 0).unwrap();
    assert_eq!(
        arena.stats().reserved_bytes.all().current,
        (2 * BIG + (16 << 20)) as i64,
        "the 2 MiB block grew by a 16 MiB step"
    );
    arena.free(a, None, 0).unwrap();
    let before = sim.counters();
    let m1 = arena.malloc(SMALL, 0).unwrap();
    assert_eq!(
        m1,
        m0 + SMALL,
        "the second 2 MiB block takes the step's spare pages"
    );
    let a2 = arena.malloc(BIG, 0).unwrap();
    assert_eq!(a2, a, "the 512 MiB block comes back to its own range");
    assert_eq!(sim.counters().since(&before).memory_calls(), 0);
    arena.check_consistency().unwrap();
    free_all_and_trim(&arena, [a2, b, m0, m1]);
}

/// A 128 MiB block at the top of what is mapped, freed and allocated again after blocks that
/// live on took the start of its place: each time it lands higher and needs pages past those
/// mapped. `gap` small requests come between its first growth and its return. Returns the
/// memory driver calls of its third coming (after a second, smaller shift) and the bytes
/// reserved after its second.
fn drift(gap: usize) -> (u64, i64) {
    const LEN: u64 = 128 << 20;
    let sim = Arc::new(SimDevice::new(SimConfig::new(80 << 30, PAGE, false)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let x = arena.malloc(LEN, 0).unwrap();
    arena.free(x, None, 0).unwrap();
    let s1 = arena.malloc(20 << 20, 0).unwrap();
    assert_eq!(
        s1, x,
        "the block that lives on takes the start of the freed range"
    );
    for _ in 0..gap {
        let p = arena.malloc(512, 0).unwrap();
        arena.free(p, None, 0).unwrap();
    }
    let y = arena.malloc(LEN, 0).unwrap();
    assert_eq!(y, x + (20 << 20), "it lands 20 MiB higher");
    let reserved = arena.stats().reserved_bytes.pool(Pool::Large).current;
    arena.free(y, None, 0).unwrap();
    let s2 = arena.malloc(10 << 20, 0).unwrap();
    assert_eq!(s2, y);
    let before = sim.counters();
    let z = arena.malloc(LEN, 0).unwrap();
    assert_eq!(z, y + (10 << 20), "and 10 MiB higher again");
    let calls = sim.counters().since(&before).memory_calls();
    arena.check_consistency().unwrap();
    free_all_and_trim(&arena, [s1, s2, z]);
    (calls, reserved)
}

#[test]
fn a_block_whose_place_drifts_between_steps_gets_spare_pages_and_stops_growing() {
    // Its length last grew the arena 5,000 requests before (`DRIFT_AFTER_REQUESTS` in
    // `src/arena/growth.rs`), and the block that did is gone: the handle created for its 20 MiB of
    // new pages also covers 1/8 of its length (16 MiB) after it, so the next shift, by 10 MiB,
    // lands on mapped pages: no driver call.
    let (calls, reserved) = drift(5_000);
    assert_eq!(reserved, (128 + 20 + 16) << 20);
    assert_eq!(calls, 0, "the second shift needed no new pages");
    // Soon after (a run of blocks of one length, as a model being built), no spare: each shift
    // maps what it needs, one handle (create, map, set access).
    let (calls, reserved) = drift(100);
    assert_eq!(reserved, (128 + 20) << 20);
    assert_eq!(calls, 3);
}

/// Growth for layout, not demand (`LAYOUT_SPARE_SHARE`, `LAYOUT_HEADROOM_SHARE` in
/// `src/arena/growth.rs`). A 1 GiB block lives throughout; blocks of 200, 100 and 200 MiB after it
/// take the bytes requested to their peak, 1,524 MiB, and the arena maps exactly that. With the
/// two 200 MiB blocks freed, a 250 MiB block fits neither the hole they left below the 100 MiB
/// one nor the mapped pages above it: it needs 50 MiB of new pages while 1,374 MiB are
/// requested, under the peak. Its handle also covers the free pages after it, as far as 5 % over
/// the peak requested allows (1,600 MiB reserved: 26 MiB more), so a 270 MiB block there next
/// needs no new page. The same after `reset_peak_memory_stats` between the peak and the growth:
/// the peak that counts is the most ever requested.
#[test]
fn a_block_that_grows_the_arena_below_the_peak_requested_gets_spare_pages_up_to_5_percent() {
    layout_spare(false);
    layout_spare(true);
}

fn layout_spare(reset_peaks: bool) {
    const MIB: u64 = 1 << 20;
    let sim = Arc::new(SimDevice::new(SimConfig::new(80 << 30, PAGE, false)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let reserved = || arena.stats().reserved_bytes.all().current as u64 / MIB;
    let model = arena.malloc(1024 * MIB, 0).unwrap();
    let p1 = arena.malloc(200 * MIB, 0).unwrap();
    let p2 = arena.malloc(100 * MIB, 0).unwrap();
    let p3 = arena.malloc(200 * MIB, 0).unwrap();
    assert_eq!(
        (p1, p2, p3),
        (model + 1024 * MIB, p1 + 200 * MIB, p2 + 100 * MIB)
    );
    assert_eq!(reserved(), 1524, "growth to a new peak maps what it needs");
    arena.free(p1, None, 0).unwrap();
    arena.free(p3, None, 0).unwrap();
    if reset_peaks {
        arena.reset_peak_stats();
    }
    let y = arena.malloc(250 * MIB, 0).unwrap();
    assert_eq!(y, p3, "it lands above the 100 MiB block");
    assert_eq!(reserved(), 1600, "50 MiB it needs and 26 MiB spare");
    arena.free(y, None, 0).unwrap();
    let before = sim.counters();
    let z = arena.malloc(270 * MIB, 0).unwrap();
    assert_eq!(z, y);
    assert_eq!(
        sim.counters().since(&before).memory_calls(),
        0,
        "on spare pages"
    );
    arena.check_consistency().unwrap();
    free_all_and_trim(&arena, [model, p2, z]);
}

/// Memory created is counted by what its request did to the bytes requested: growth to a new
/// peak (what any allocator must create) apart from growth below it (the memory was there, but
/// not where the request landed), and the peak that counts is the most ever requested, whatever
/// `reset_peak_memory_stats` reset. The layout of `layout_spare` above: a 250 MiB block that
/// needs pages while only 1,374 MiB of the 1,524 MiB peak is requested.
#[test]
fn memory_created_is_counted_by_whether_its_request_reached_a_new_peak() {
    for reset_peaks in [false, true] {
        const MIB: u64 = 1 << 20;
        let sim = Arc::new(SimDevice::new(SimConfig::new(80 << 30, PAGE, false)).unwrap());
        let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
        let grown = |handles, mib| Growth {
            handles,
            bytes: mib * MIB,
        };
        let model = arena.malloc(1024 * MIB, 0).unwrap();
        let p1 = arena.malloc(200 * MIB, 0).unwrap();
        let p2 = arena.malloc(100 * MIB, 0).unwrap();
        let p3 = arena.malloc(200 * MIB, 0).unwrap();
        let g = arena.growth();
        assert_eq!((g.at_peak, g.below_peak), (grown(4, 1524), grown(0, 0)));
        arena.free(p1, None, 0).unwrap();
        arena.free(p3, None, 0).unwrap();
        if reset_peaks {
            arena.reset_peak_stats();
        }
        let y = arena.malloc(250 * MIB, 0).unwrap();
        let g = arena.growth();
        assert_eq!(
            (g.at_peak, g.below_peak),
            (grown(4, 1524), grown(1, 76)),
            "50 MiB needed and 26 MiB of layout spare, below the peak (reset: {reset_peaks})"
        );
        assert_eq!(arena.extras().growth, g);
        arena.reset_accumulated_stats();
        assert_eq!(arena.growth(), g, "counted since the arena started");
        assert_eq!(
            sim.counters().mem_create,
            g.at_peak.handles + g.below_peak.handles
        );
        // A block that takes the bytes requested past the old peak counts as peak growth, even
        // where it also lands on pages created before.
        let big = arena.malloc(600 * MIB, 0).unwrap();
        let g2 = arena.growth().since(&g);
        assert_eq!(g2.below_peak, grown(0, 0));
        assert_eq!(g2.at_peak.handles, 1);
        arena.check_consistency().unwrap();
        free_all_and_trim(&arena, [model, p2, y, big]);
    }
}

/// A climb to the peak in blocks of 25 MiB (a forward pass keeping its outputs), on a fresh
/// arena: PyTorch would make one cudaMalloc per block, and a handle of 26 MiB costs more than
/// such a call (a create, a map and a grant: 50.4 µs against 41.3 at the H200's prices). So once
/// the climb's growth costs more than native's, each new handle also covers free pages after its
/// block, for the next blocks: up to 48 MiB, and at most 1/128 of what is reserved.
#[test]
fn a_climb_to_the_peak_grows_ahead_while_its_growth_costs_more_than_natives() {
    const MIB: u64 = 1 << 20;
    let sim = Arc::new(SimDevice::new(SimConfig::new(80 << 30, PAGE, false)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let blocks: Vec<u64> = (0..400)
        .map(|_| arena.malloc(25 * MIB, 0).unwrap())
        .collect();
    let creates = sim.counters().mem_create;
    // Without growth ahead, one handle per block (400); with it, 261: the spare grows with
    // what is held, so the first blocks still grow one by one.
    assert!(
        creates < 300,
        "400 blocks of 25 MiB climbing to the peak took {creates} creates"
    );
    let reserved = arena.stats().reserved_bytes.all().current as u64;
    let requested = 400 * 25 * MIB;
    assert!(
        reserved <= requested + 48 * MIB + PAGE,
        "{} MiB reserved for {} MiB requested: more than one step of 48 MiB ahead",
        reserved / MIB,
        requested / MIB
    );
    let g = arena.growth();
    assert_eq!(g.at_peak.handles, creates, "all of it for new peaks");
    arena.check_consistency().unwrap();
    free_all_and_trim(&arena, blocks);
}

/// The same climb after a 4 GiB block: a handle of 4 GiB costs less than a cudaMalloc of it
/// (the per-GiB terms: 163 µs against 261 µs), so the arena's growth is ahead of native's and
/// the next blocks grow by what they ask, one handle each, until the climb's extra cost per
/// block (about 9 µs) has used up that lead.
#[test]
fn growth_ahead_of_natives_in_cost_grows_by_what_is_asked() {
    const MIB: u64 = 1 << 20;
    let sim = Arc::new(SimDevice::new(SimConfig::new(80 << 30, PAGE, false)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let mut blocks = vec![arena.malloc(4096 * MIB, 0).unwrap()];
    // 26 MiB blocks end on a page boundary, so each needs whole pages of its own.
    for i in 1..=8u64 {
        blocks.push(arena.malloc(26 * MIB, 0).unwrap());
        let reserved = arena.stats().reserved_bytes.all().current as u64;
        assert_eq!(
            (sim.counters().mem_create, reserved),
            (1 + i, (4096 + 26 * i) * MIB),
            "block {i} of 26 MiB grew by more than it asked"
        );
    }
    // The lead is spent within a few dozen blocks: from then on the climb grows ahead.
    for _ in 0..40 {
        blocks.push(arena.malloc(26 * MIB, 0).unwrap());
    }
    let creates = sim.counters().mem_create;
    assert!(
        creates < 1 + 48,
        "the climb never grew ahead: {creates} creates for 49 blocks"
    );
    arena.check_consistency().unwrap();
    free_all_and_trim(&arena, blocks);
}

/// Growing ahead never costs a climb the memory it could have had: on a device of `cap`, blocks
/// of `block` bytes climb until the limit refuses one, and reach as many as fit: a handle's
/// spare pages come out of what the limit leaves (`Inner::acquire`), and the next block of the
/// climb lands on them.
#[test]
fn a_climb_to_the_limit_fits_as_many_blocks_with_growth_ahead() {
    const MIB: u64 = 1 << 20;
    for (cap, block) in [
        (1024 * MIB, 25 * MIB),
        (4096 * MIB, 25 * MIB),
        (8192 * MIB, 100 * MIB),
        (8192 * MIB, 130 * MIB),
    ] {
        let sim = Arc::new(SimDevice::new(SimConfig::new(cap, PAGE, false)).unwrap());
        let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
        let mut blocks = Vec::new();
        while let Ok(p) = arena.malloc(block, 0) {
            blocks.push(p);
            assert!(blocks.len() as u64 <= cap / block, "more blocks than fit");
        }
        assert_eq!(
            blocks.len() as u64,
            cap / block,
            "blocks of {} MiB on a device of {} MiB",
            block / MIB,
            cap / MIB
        );
        arena.check_consistency().unwrap();
        free_all_and_trim(&arena, blocks);
    }
}

/// `demo --model`'s training loop (its sequence length changes every step) over 40 steps: after
/// warm-up (steps 1 to 3) it grows only in step 7, and only for new peaks of the bytes
/// requested. Step 7 is the first whose sequence length is the longest, so an allocator that
/// holds no more than the earlier steps' peaks must grow there; nothing is created for layout.
#[test]
fn the_modelled_training_loop_grows_after_warm_up_only_for_a_new_peak() {
    use torch_arena::TorchArena;
    use torch_arena_lab::training::TrainingLoop;
    let arena = TorchArena::new(Config::parse("device:sim").unwrap());
    let mut workload = TrainingLoop::new(&arena).unwrap();
    let mut grew = Vec::new();
    for step in 1..=40 {
        let before = arena.growth(0).unwrap();
        workload.step(step).unwrap();
        let g = arena.growth(0).unwrap().since(&before);
        if step > 3 && g.at_peak.handles + g.below_peak.handles > 0 {
            grew.push((step, g.at_peak.handles, g.below_peak.handles));
        }
    }
    assert_eq!(
        grew,
        [(7, 4, 0)],
        "(step, handles for a new peak, for layout)"
    );
}

#[test]
fn a_small_workload_grows_in_steps_as_native_does() {
    // A workload that holds little: sixteen 2 MiB blocks on a fresh 80 GiB arena. PyTorch packs
    // requests under 10 MiB into 20 MiB segments, so it creates twice; the arena's first step
    // covers at least 16 MiB with its block, so it creates two handles too, not sixteen, and
    // holds no more than those 32 MiB.
    let sim = Arc::new(SimDevice::new(SimConfig::new(80 << 30, PAGE, false)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let blocks: Vec<u64> = (0..16).map(|_| arena.malloc(2 << 20, 0).unwrap()).collect();
    let creates = sim.counters().mem_create;
    assert!(creates <= 2, "16 blocks of 2 MiB took {creates} creates");
    let held = arena.stats().reserved_bytes.all().current;
    assert!(held <= 32 << 20, "16 blocks of 2 MiB hold {held} bytes");
    arena.check_consistency().unwrap();
    free_all_and_trim(&arena, blocks);
}

/// The small pool grows in steps (up to 4 pages a handle) while the workload climbs, and by the
/// page below the peak requested unless the arena's growth costs more than native's would
/// (`small_step` in `src/arena/growth.rs`). Each case first holds or frees large blocks, then asks
/// for 32 slab slots of 512 KiB (16 MiB): climbing beside a live 8 GiB block, the pool creates a
/// handle per step; below the peak that block left when freed (its handle cost less than native's
/// cudaMalloc, so the arena is ahead), one per page; below the peak of sixteen freed 100 MiB
/// blocks, each of whose handles cost more than a cudaMalloc, in steps again.
#[test]
fn the_small_pool_grows_in_steps_only_while_climbing_or_behind_native() {
    // Slabs of 512 KiB slots: above the default slab bound, so the bound is raised to 1 MiB.
    let conf = Config::parse("slab_max_kb:1024").unwrap();
    let slots = |large: u64, n: usize, keep: bool| {
        let sim = Arc::new(SimDevice::new(SimConfig::new(80 << 30, PAGE, false)).unwrap());
        let arena = Arena::new(sim.clone() as Arc<dyn Device>, &conf).unwrap();
        let big: Vec<u64> = (0..n).map(|_| arena.malloc(large, 0).unwrap()).collect();
        if !keep {
            for &b in &big {
                arena.free(b, Some(large), 0).unwrap();
            }
        }
        let before = sim.counters().mem_create;
        let small: Vec<u64> = (0..32)
            .map(|_| arena.malloc(512 << 10, 0).unwrap())
            .collect();
        let creates = sim.counters().mem_create - before;
        let held = arena.stats().reserved_bytes.pool(Pool::Small).current;
        arena.check_consistency().unwrap();
        for p in small {
            arena.free(p, Some(512 << 10), 0).unwrap();
        }
        if keep {
            for b in big {
                arena.free(b, Some(large), 0).unwrap();
            }
        }
        (creates, held)
    };
    let (climbing, _) = slots(8 << 30, 1, true);
    let (below, held) = slots(8 << 30, 1, false);
    let (behind, _) = slots(100 << 20, 16, false);
    assert!(
        climbing <= 3,
        "climbing: {climbing} creates for 16 MiB of slabs"
    );
    assert_eq!(
        below as i64 * (2 << 20),
        held,
        "below the peak: one create per page"
    );
    assert!(below >= 8, "below the peak: {below} creates");
    assert!(
        behind <= 3,
        "below the peak but behind native: {behind} creates"
    );
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

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Live large blocks are found by exact address on the hot path; an interior pointer (from
    /// `base_alloc`, `record_stream` or a bad free) must still name the block containing it,
    /// among many, and a pointer into a freed gap must name none.
    #[test]
    fn interior_pointers_find_their_large_block(
        sizes in prop::collection::vec(1u64..(12 << 20), 2..40),
        keep in prop::collection::vec(any::<bool>(), 40),
        probes in prop::collection::vec((any::<prop::sample::Index>(), 0u64..(1 << 30)), 1..60),
    ) {
        let sim = Arc::new(SimDevice::new(SimConfig::new(2 << 30, PAGE, false)).unwrap());
        let arena = Arena::new(sim as Arc<dyn Device>, &Config::default()).unwrap();
        let sizes: Vec<u64> = sizes.into_iter().map(|s| s + (1 << 20)).collect();
        let blocks: Vec<(u64, u64)> = sizes.iter().map(|&s| (arena.malloc(s, 0).unwrap(), s)).collect();
        let mut live = Vec::new();
        let mut gone = Vec::new();
        for (i, &(p, s)) in blocks.iter().enumerate() {
            if keep[i] {
                live.push((p, s));
            } else {
                arena.free(p, Some(s), 0).unwrap();
                gone.push((p, s));
            }
        }
        for (pick, off) in probes {
            if !live.is_empty() {
                let (p, s) = live[pick.index(live.len())];
                let at = p + off % s;
                let (base, len) = arena.base_alloc(at).unwrap();
                prop_assert_eq!(base, p);
                prop_assert!(len >= s);
                arena.record_stream(at, 7).unwrap();
                if at != p {
                    let e = arena.free(at, None, 0).unwrap_err().to_string();
                    prop_assert!(e.contains("inside the allocation"), "{}", e);
                }
            }
            if !gone.is_empty() {
                let (p, s) = gone[pick.index(gone.len())];
                let at = p + off % s;
                // Unless a live block now covers the freed range.
                if let Some(&(q, _)) = live.iter().find(|&&(q, t)| q <= at && at < q + t) {
                    prop_assert_eq!(arena.base_alloc(at).unwrap().0, q);
                } else {
                    prop_assert!(arena.base_alloc(at).is_err());
                }
            }
        }
        arena.check_consistency().unwrap();
    }
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

/// `memory_stats()` counts a request in PyTorch's pool by its size (`small_pool` up to 1 MiB)
/// wherever the arena placed it: with `slab_max_kb:64` a 512 KiB request takes a heap block of
/// large-pool pages and still counts as a small-pool allocation; its pages stay large-pool
/// reserved bytes, and the inactive split of the heap pages counts their free bytes.
#[test]
fn statistics_count_a_request_in_its_size_pool_wherever_it_is_placed() {
    let sim = Arc::new(SimDevice::new(SimConfig::new(256 << 20, PAGE, false)).unwrap());
    let conf = Config::parse("slab_max_kb:64").unwrap();
    let arena = Arena::new(sim as Arc<dyn Device>, &conf).unwrap();
    let mid = arena.malloc(512 << 10, 0).unwrap();
    let tiny = arena.malloc(1000, 0).unwrap();
    let big = arena.malloc((1 << 20) + 1, 0).unwrap();
    let st = arena.stats();
    assert_eq!(st.allocation.pool(Pool::Small).current, 2);
    assert_eq!(st.allocation.pool(Pool::Large).current, 1);
    assert_eq!(
        st.allocated_bytes.pool(Pool::Small).current,
        (512 << 10) + 1024,
        "the heap block is the request rounded to 512 bytes, the slab slot its class"
    );
    assert_eq!(
        st.requested_bytes.pool(Pool::Small).current,
        (512 << 10) + 1000
    );
    assert_eq!(st.active_bytes.pool(Pool::Large).current, (1 << 20) + 512);
    // The 512 KiB block and the 1 MiB + 1 block share the heap's pages: free bytes on them
    // count as the large pool's inactive split, by place.
    let heap_pages = st.reserved_bytes.pool(Pool::Large).current;
    assert!(heap_pages >= (3 << 20), "{heap_pages}");
    arena.free(mid, Some(512 << 10), 0).unwrap();
    let st = arena.stats();
    assert_eq!(st.allocation.pool(Pool::Small).current, 1);
    assert_eq!(st.active_bytes.pool(Pool::Small).current, 1024);
    assert_eq!(st.requested_bytes.pool(Pool::Small).current, 1000);
    arena.check_consistency().unwrap();
    arena.free(tiny, Some(1000), 0).unwrap();
    arena.free(big, Some((1 << 20) + 1), 0).unwrap();
    let st = arena.stats();
    for pool in [Pool::Small, Pool::Large] {
        assert_eq!(st.active_bytes.pool(pool).current, 0);
        assert_eq!(st.allocated_bytes.pool(pool).current, 0);
    }
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
    // Decay runs on the next free. (A small block, on pages of its own: a block placed in the
    // idle range would make its handle busy, and idle anew when freed.)
    let b = arena.malloc(1000, 0).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    arena.free(b, Some(1000), 0).unwrap();
    assert!(
        arena.stats().reserved_bytes.all().current < 8 << 20,
        "pages idle for longer than release_idle_ms were kept: {}",
        arena.stats().reserved_bytes.all().current
    );
    assert!(arena.stats().num_device_free > 0);
}

// ---- steady state: a repeated step makes no driver call once warm ------------------------------

/// One request of a step: its size, its stream (of two), and how many requests later in the same
/// step it is freed (past the step's end: freed at the end).
type StepRequest = (u64, u8, usize);

fn step_request() -> impl Strategy<Value = StepRequest> {
    let size = prop_oneof![
        4 => 1u64..(1 << 20),          // slab sizes
        3 => (1u64 << 20)..(20 << 20),  // medium
        1 => (20u64 << 20)..(300 << 20), // large
    ];
    (size, 0u8..2, 0usize..12)
}

/// Run `step` once on `arena`: every request in order, each freed `free_after` requests later,
/// the rest at the end.
fn run_step(arena: &Arena, step: &[StepRequest]) {
    let mut live: Vec<(usize, u64, u64)> = Vec::new(); // (free at, ptr, size)
    for (i, &(size, stream, free_after)) in step.iter().enumerate() {
        let ptr = arena.malloc(size, stream as StreamId + 1).unwrap();
        live.push((i + free_after, ptr, size));
        live.retain(|&(at, ptr, size)| {
            let due = at <= i;
            if due {
                arena.free(ptr, Some(size), 0).unwrap();
            }
            !due
        });
    }
    for (_, ptr, size) in live {
        arena.free(ptr, Some(size), 0).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// A training loop whose steps repeat the same requests: once the first two passes have
    /// warmed the arena, later passes make no memory driver call (create, map, set access,
    /// unmap, release, reserve), as a warm native allocator makes none.
    #[test]
    fn a_repeated_step_makes_no_driver_call_after_its_second_pass(
        step in prop::collection::vec(step_request(), 1..48)
    ) {
        let sim = Arc::new(SimDevice::new(SimConfig::new(64 << 30, PAGE, false)).unwrap());
        let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
        run_step(&arena, &step);
        run_step(&arena, &step);
        let warm = sim.counters();
        for pass in 3..=5 {
            run_step(&arena, &step);
            let now = sim.counters();
            prop_assert_eq!(
                now.memory_calls(),
                warm.memory_calls(),
                "pass {} made memory driver calls: {:?} after {:?}",
                pass,
                now,
                warm
            );
        }
        arena.check_consistency().map_err(TestCaseError::fail)?;
    }
}

/// A 1 GiB device: a 30 MiB block `x` (one handle, under 1/32 of the limit) and a 990 MiB block
/// `y` fill it but for 2 pages; `x` is freed and a 6 MiB block `s` lands on the start of its
/// pages (mapped already: no driver call), so `x`'s handle keeps 12 idle pages that only a block
/// of at most 24 MiB could use where they are. A 28 MiB request then fits nowhere as things
/// lie: the limit leaves 2 pages, and the idle ones cannot move, since `s` holds their mapping.
/// They are lent: mapped a second time where the request goes, and held by a placeholder where
/// they were. Returns the device, the arena and `(s, y, z)`.
fn idle_pages_a_live_block_pins() -> (Arc<SimDevice>, Arena, [u64; 3]) {
    let sim = Arc::new(SimDevice::new(SimConfig::new(1 << 30, PAGE, true)).unwrap());
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    let x = arena.malloc(30 << 20, 0).unwrap();
    let y = arena.malloc(990 << 20, 0).unwrap();
    arena.free(x, Some(30 << 20), 0).unwrap();
    let creates = sim.counters().mem_create;
    let s = arena.malloc(6 << 20, 0).unwrap();
    assert_eq!(s, x, "s lands on the start of x's pages");
    assert_eq!(sim.counters().mem_create, creates);
    // SAFETY: live blocks of the arena on a host-backed device.
    unsafe {
        std::ptr::write_bytes(s as *mut u8, 0x5a, 6 << 20);
        std::ptr::write_bytes(y as *mut u8, 0x7e, 990 << 20);
    }
    let before = sim.counters();
    let z = arena
        .malloc(28 << 20, 0)
        .expect("the pages s pins are lent to the new block");
    assert!(
        !(x..x + (30 << 20)).contains(&z),
        "z cannot fit where x was"
    );
    assert_eq!(
        sim.counters().mem_create_bytes - before.mem_create_bytes,
        2 * PAGE,
        "what is created is the 2 pages the limit left"
    );
    assert_eq!(arena.stats().reserved_bytes.all().current, 1 << 30);
    // SAFETY: as above; z is live.
    unsafe { std::ptr::write_bytes(z as *mut u8, 0x33, 28 << 20) };
    let holds = |ptr: u64, len: u64, byte: u8| {
        // SAFETY: live blocks on a host-backed device.
        let b = unsafe { std::slice::from_raw_parts(ptr as *const u8, len as usize) };
        b.iter().all(|&v| v == byte)
    };
    assert!(holds(s, 6 << 20, 0x5a), "s kept its bytes");
    assert!(holds(y, 990 << 20, 0x7e), "y kept its bytes");
    assert!(holds(z, 28 << 20, 0x33));
    arena.check_consistency().unwrap();
    let pages = arena.extras().pages;
    assert_eq!(
        pages.total() * PAGE,
        arena.stats().reserved_bytes.all().current as u64,
        "lent pages count once: {pages:?}"
    );
    (sim, arena, [s, y, z])
}

#[test]
fn idle_pages_a_live_block_pins_are_lent_at_the_limit() {
    let (sim, arena, [s, y, z]) = idle_pages_a_live_block_pins();
    // Freed, z's mapping goes idle; emptying the cache unmaps it and gives the pages back (and
    // releases the 2 pages created for z): a 24 MiB block then fits after s, where they are,
    // with no new memory.
    arena.free(z, Some(28 << 20), 0).unwrap();
    arena.empty_cache().unwrap();
    arena.check_consistency().unwrap();
    let pages = arena.extras().pages;
    assert_eq!(
        pages.held, 12,
        "x's idle pages are back where they were: {pages:?}"
    );
    let creates = sim.counters().mem_create;
    let w = arena.malloc(24 << 20, 0).unwrap();
    assert_eq!(w, s + (6 << 20), "w takes the pages after s");
    assert_eq!(sim.counters().mem_create, creates);
    arena.check_consistency().unwrap();
    for (p, n) in [(s, 6u64 << 20), (y, 990 << 20), (w, 24 << 20)] {
        arena.free(p, Some(n), 0).unwrap();
    }
    arena.empty_cache().unwrap();
    assert_eq!(sim.used_bytes(), 0);
    assert_eq!(sim.mapped_pages(), 0);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

#[test]
fn lent_pages_go_back_whatever_is_freed_first() {
    // Everything freed, then the cache emptied in one go: whether the borrowing mapping is
    // unmapped before or after the one its pages came from, nothing is left held or mapped.
    for order in [[2usize, 0, 1], [0, 1, 2]] {
        let (sim, arena, blocks) = idle_pages_a_live_block_pins();
        let sizes = [6u64 << 20, 990 << 20, 28 << 20];
        for i in order {
            arena.free(blocks[i], Some(sizes[i]), 0).unwrap();
            arena.check_consistency().unwrap();
        }
        arena.empty_cache().unwrap();
        arena.check_consistency().unwrap();
        assert_eq!(sim.used_bytes(), 0);
        assert_eq!(sim.mapped_pages(), 0);
        assert!(sim.violations().is_empty(), "{:?}", sim.violations());
    }
}

/// A driver that refused to map lent pages a second time: the request runs out of memory, as it
/// would have without lending (not a driver error), and lending is off from then on.
#[test]
fn a_refused_second_mapping_turns_lending_off() {
    let setup = || {
        let sim = Arc::new(SimDevice::new(SimConfig::new(1 << 30, PAGE, true)).unwrap());
        let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
        let x = arena.malloc(30 << 20, 0).unwrap();
        arena.malloc(990 << 20, 0).unwrap();
        arena.free(x, Some(30 << 20), 0).unwrap();
        arena.malloc(6 << 20, 0).unwrap();
        (sim, arena)
    };
    // The lent pages are the last piece the request maps: count its maps once.
    let (sim, arena) = setup();
    let before = sim.counters().mem_map;
    arena.malloc(28 << 20, 0).unwrap();
    let lent_map = sim.counters().mem_map - before;
    let (sim, arena) = setup();
    sim.fail_nth(torch_arena::device::sim::SimCall::Map, lent_map);
    let e = arena.malloc(28 << 20, 0).unwrap_err().to_string();
    assert!(e.contains("CUDA out of memory"), "{e}");
    arena.check_consistency().unwrap();
    // Lending stays off: the same request runs out of memory again with every map working.
    let e = arena.malloc(28 << 20, 0).unwrap_err().to_string();
    assert!(e.contains("CUDA out of memory"), "{e}");
    assert_eq!(arena.extras().pages.held, 12, "the pages were not lent");
    arena.check_consistency().unwrap();
}

/// Lending under random layouts: on a 64 MiB host-backed device, blocks of 1 to 24 MiB (512-byte
/// multiples, so they share pages) fill it until it runs out, a random half is freed, and larger
/// ones follow until it runs out again. Every live block keeps the bytes written into it, the
/// consistency check passes after every step, and everything drains to nothing. Over 100 seeds
/// lending must have happened in some (a layout that reaches it is not rare, and this test is
/// the property tests' only one that does).
#[test]
fn random_layouts_at_the_limit_lend_and_keep_every_block() {
    use torch_arena_lab::synth::SplitMix;
    let mut lent_in = 0;
    for seed in 0..100u64 {
        let mut rng = SplitMix(seed);
        let sim = Arc::new(SimDevice::new(SimConfig::new(64 << 20, PAGE, true)).unwrap());
        let arena = Arena::new(sim.clone() as Arc<dyn Device>, &Config::default()).unwrap();
        let mut live: Vec<(u64, u64, u8)> = Vec::new();
        let mut lent = 0;
        let mut fill = |arena: &Arena, live: &mut Vec<(u64, u64, u8)>, lo: u64, hi: u64| {
            let mut misses = 0;
            while misses < 3 {
                let size = (lo + SplitMix::below(&mut rng, hi - lo)) / 512 * 512 + 512;
                match arena.malloc(size, 0) {
                    Ok(p) => {
                        let byte = (live.len() % 251) as u8 + 1;
                        // SAFETY: a live block of a host-backed device.
                        unsafe { std::ptr::write_bytes(p as *mut u8, byte, size as usize) };
                        live.push((p, size, byte));
                    }
                    Err(_) => misses += 1,
                }
                arena.check_consistency().unwrap();
            }
        };
        fill(&arena, &mut live, 1 << 20, 8 << 20);
        let mut i = 0;
        live.retain(|&(p, size, _)| {
            i += 1;
            let keep = i % 2 == 0;
            if !keep {
                arena.free(p, Some(size), 0).unwrap();
            }
            keep
        });
        fill(&arena, &mut live, 4 << 20, 24 << 20);
        lent = lent.max(arena.lent_pages());
        for &(p, size, byte) in &live {
            // SAFETY: as above.
            let b = unsafe { std::slice::from_raw_parts(p as *const u8, size as usize) };
            assert!(
                b.iter().all(|&v| v == byte),
                "seed {seed}: a block lost its bytes"
            );
        }
        for (p, size, _) in live {
            arena.free(p, Some(size), 0).unwrap();
        }
        arena.empty_cache().unwrap();
        arena.check_consistency().unwrap();
        assert_eq!(sim.used_bytes(), 0, "seed {seed}");
        assert!(
            sim.violations().is_empty(),
            "seed {seed}: {:?}",
            sim.violations()
        );
        lent_in += (lent > 0) as u32;
    }
    assert!(lent_in >= 5, "lending happened in {lent_in} of 100 layouts");
}

/// One step of a loop at the limit for `views_repeat_a_step_at_the_limit_and_keep_every_block`:
/// allocations (`Some(size)`) and frees (`None`, of the oldest block of the step still live), the
/// live bytes within `cap`, every block of the step freed by its end.
fn a_step(seed: u64, cap: u64) -> Vec<Option<u64>> {
    use torch_arena_lab::synth::SplitMix;
    let mut rng = SplitMix(seed);
    let (mut ops, mut live, mut held) = (Vec::new(), std::collections::VecDeque::new(), 0u64);
    for _ in 0..60 {
        let size = ((1 << 20) + rng.below(7 << 20)) / 512 * 512 + 512;
        if held + size > cap || (!live.is_empty() && rng.below(3) == 0) {
            let s = live
                .pop_front()
                .expect("something is live when the step is full");
            held -= s;
            ops.push(None);
            continue;
        }
        held += size;
        live.push_back(size);
        ops.push(Some(size));
    }
    ops.extend(live.iter().map(|_| None));
    ops
}

/// Views under random steps at the limit: on a 48 MiB host-backed device holding 12 MiB of
/// long-lived blocks, the same step (blocks of 1 to 8 MiB, up to 34 MiB live at once) runs five
/// times. Every block keeps the bytes written into it until it is freed (a piece mapped at two
/// views is never under two live blocks), the consistency check (at most one view of a piece in
/// use, the pages counted once) passes after every request, and everything drains to nothing.
/// Over 20 seeds views must have been made in some, and the last three steps of all seeds must
/// make fewer memory driver calls with views than with `views:False`: the step finds the pages
/// it moved in the step before where it left them.
#[test]
fn views_repeat_a_step_at_the_limit_and_keep_every_block() {
    let mut calls = [0u64; 2];
    let mut viewed_in = 0;
    for seed in 0..20u64 {
        let step = a_step(seed, 34 << 20);
        for (i, views) in [true, false].into_iter().enumerate() {
            let sim = Arc::new(SimDevice::new(SimConfig::new(48 << 20, PAGE, true)).unwrap());
            let conf = Config {
                views,
                ..Config::default()
            };
            let arena = Arena::new(sim.clone() as Arc<dyn Device>, &conf).unwrap();
            let mut byte = 0u8;
            let mut write = |p: u64, size: u64| {
                byte = byte % 251 + 1;
                // SAFETY: a live block of a host-backed device.
                unsafe { std::ptr::write_bytes(p as *mut u8, byte, size as usize) };
                byte
            };
            // A byte every 4 KiB, and the last: two blocks over one physical page would both
            // have written all of it.
            let kept = |p: u64, size: u64, byte: u8| {
                // SAFETY: as above.
                let b = unsafe { std::slice::from_raw_parts(p as *const u8, size as usize) };
                b.iter().step_by(4096).chain(b.last()).all(|&v| v == byte)
            };
            let base: Vec<(u64, u64, u8)> = [5 << 20, 3 << 20, (4 << 20) + 512]
                .into_iter()
                .map(|size| {
                    let p = arena.malloc(size, 0).unwrap();
                    (p, size, write(p, size))
                })
                .collect();
            let mut viewed = 0;
            for pass in 0..5 {
                let before = sim.counters();
                let mut live = std::collections::VecDeque::new();
                for op in &step {
                    match *op {
                        Some(size) => match arena.malloc(size, 0) {
                            Ok(p) => live.push_back(Some((p, size, write(p, size)))),
                            Err(_) => live.push_back(None),
                        },
                        None => {
                            if let Some((p, size, b)) = live.pop_front().flatten() {
                                assert!(kept(p, size, b), "seed {seed}: a block lost its bytes");
                                arena.free(p, Some(size), 0).unwrap();
                            }
                        }
                    }
                    viewed = viewed.max(arena.view_pages());
                    arena.check_consistency().unwrap();
                }
                if pass >= 2 {
                    calls[i] += sim.counters().since(&before).memory_calls();
                }
            }
            for (p, size, b) in base {
                assert!(
                    kept(p, size, b),
                    "seed {seed}: a long-lived block lost its bytes"
                );
                arena.free(p, Some(size), 0).unwrap();
            }
            if !views {
                assert_eq!(viewed, 0, "views:False makes no view");
            }
            viewed_in += (viewed > 0) as u32;
            arena.empty_cache().unwrap();
            arena.check_consistency().unwrap();
            assert_eq!(arena.view_pages(), 0, "seed {seed}");
            assert_eq!(sim.used_bytes(), 0, "seed {seed}");
            assert!(
                sim.violations().is_empty(),
                "seed {seed}: {:?}",
                sim.violations()
            );
        }
    }
    assert!(viewed_in >= 3, "views were made in {viewed_in} of 20 steps");
    assert!(
        calls[0] < calls[1],
        "memory calls in steps 3 to 5: {} with views, {} without",
        calls[0],
        calls[1]
    );
}
