//! Sub-page slabs: slabs of different classes (one stream) share physical pages. A shared page
//! stays mapped while any slab on it lives, goes idle only when its last slab dissolves, moves to
//! another stream only after the owner's fence, and a failure while a slab is being created
//! leaves the arena exactly as it was.

use std::sync::Arc;

use torch_arena::arena::{Arena, CHUNK};
use torch_arena::config::Config;
use torch_arena::device::Device;
use torch_arena::device::sim::{SimCall, SimConfig, SimDevice};
use torch_arena::stats::Pool;

const PAGE: u64 = 2 << 20;

fn rig(capacity: u64) -> (Arc<SimDevice>, Arena) {
    let sim = Arc::new(SimDevice::new(SimConfig::new(capacity, PAGE, true)).unwrap());
    // Every slab class, up to 1 MiB (the default bound is 64 KiB: `slab_max_kb`).
    let conf = Config::parse("slab_max_kb:1024").unwrap();
    let arena = Arena::new(sim.clone() as Arc<dyn Device>, &conf).unwrap();
    (sim, arena)
}

fn fill(ptr: u64, len: u64, byte: u8) {
    unsafe { std::ptr::write_bytes(ptr as *mut u8, byte, len as usize) };
}

fn holds(ptr: u64, len: u64, byte: u8) -> bool {
    let s = unsafe { std::slice::from_raw_parts(ptr as *const u8, len as usize) };
    s.iter().all(|&b| b == byte)
}

fn small_reserved(a: &Arena) -> i64 {
    a.stats().reserved_bytes.pool(Pool::Small).current
}

#[test]
fn many_classes_share_one_page() {
    let (sim, arena) = rig(64 << 20);
    let sizes = [
        512u64, 1024, 2048, 4096, 5120, 8192, 12288, 16384, 20480, 24576,
    ];
    let ptrs: Vec<u64> = sizes.iter().map(|&s| arena.malloc(s, 0).unwrap()).collect();
    for (i, (&p, &s)) in ptrs.iter().zip(&sizes).enumerate() {
        fill(p, s, i as u8 + 1);
    }
    // Ten classes, ten slabs, one physical page between them.
    let x = arena.extras();
    let used: Vec<_> = x.classes.iter().filter(|c| c.slabs > 0).collect();
    assert_eq!(used.len(), sizes.len());
    assert!(used.iter().all(|c| c.slabs == 1 && c.used_slots == 1));
    assert_eq!(small_reserved(&arena), PAGE as i64);
    assert_eq!(sim.mapped_pages(), 1);
    assert_eq!(x.pages.in_use, 1);
    for (i, (&p, &s)) in ptrs.iter().zip(&sizes).enumerate() {
        assert!(holds(p, s, i as u8 + 1), "allocation {i} was overwritten");
        assert_eq!(p / PAGE, ptrs[0] / PAGE, "all on one page");
        assert_eq!(arena.base_alloc(p + s - 1).unwrap().0, p);
    }
    arena.check_consistency().unwrap();
    for (&p, &s) in ptrs.iter().zip(&sizes) {
        arena.free(p, Some(s), 0).unwrap();
        arena.check_consistency().unwrap();
    }
    assert_eq!(arena.stats().allocated_bytes.all().current, 0);
}

#[test]
fn a_shared_page_goes_idle_only_after_its_last_slab_dissolves() {
    let (sim, arena) = rig(64 << 20);
    // Two slabs of class 512 B (64 KiB, 128 slots each) and one of class 8 KiB, all on page 0.
    let a: Vec<u64> = (0..129).map(|_| arena.malloc(512, 0).unwrap()).collect();
    let b = arena.malloc(8192, 0).unwrap();
    fill(b, 8192, 0xbb);
    assert_eq!(small_reserved(&arena), PAGE as i64);
    assert_eq!(arena.extras().classes[0].slabs, 2);
    // The first 512 B slab is no longer current: emptying it dissolves it at once, but the page
    // keeps its other slabs, so it stays in use and mapped.
    for &p in &a[..128] {
        arena.free(p, Some(512), 0).unwrap();
    }
    assert_eq!(
        arena.extras().classes[0].slabs,
        1,
        "the empty slab dissolved"
    );
    assert_eq!(arena.extras().pages.idle_mapped, 0);
    assert_eq!(sim.mapped_pages(), 1);
    arena.check_consistency().unwrap();
    // Dissolving the other 512 B slab (defragment dissolves empty current slabs) still leaves
    // the 8 KiB slab on the page.
    arena.free(a[128], Some(512), 0).unwrap();
    let r = arena.defragment().unwrap();
    assert_eq!((r.slabs_released, r.pages_unmapped), (1, 0), "{r:?}");
    assert_eq!(small_reserved(&arena), PAGE as i64);
    assert!(
        holds(b, 8192, 0xbb),
        "a live slab's page was unmapped or reused"
    );
    arena.check_consistency().unwrap();
    // Its last slab gone, the page goes idle and a trim unmaps it.
    arena.free(b, Some(8192), 0).unwrap();
    let r = arena.defragment().unwrap();
    assert_eq!((r.slabs_released, r.pages_unmapped), (1, 1), "{r:?}");
    assert_eq!(small_reserved(&arena), 0);
    assert_eq!(sim.mapped_pages(), 0);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
    arena.check_consistency().unwrap();
}

#[test]
fn cross_stream_reuse_of_a_shared_page_waits_for_its_stream() {
    // Four pages. Stream 1: a 4 KiB slab (64 KiB) and a 512 KiB slab (one page of span, so it
    // straddles pages 0 and 1): page 0 is shared by two classes.
    let (sim, arena) = rig(8 << 20);
    let x = arena.malloc(4096, 1).unwrap();
    let y = arena.malloc(512 << 10, 1).unwrap();
    assert_eq!(x / PAGE, y / PAGE, "both slabs start on one page");
    assert_eq!(small_reserved(&arena), 2 * PAGE as i64);
    fill(x, 4096, 0x11);
    sim.launch(1, x, 4096);
    sim.launch(1, y, 512 << 10);
    // Freeing y empties its page-sized slab, which dissolves: page 1 goes idle, page 0 keeps x.
    arena.free(y, Some(512 << 10), 1).unwrap();
    assert_eq!(arena.extras().pages.idle_mapped, 1);
    arena.check_consistency().unwrap();
    // Stream 2 needs three pages: two new ones and stream 1's idle page 1, which it may take
    // only once stream 1's work is done. Page 0 (x still live) is never taken.
    let z = arena.malloc(6 << 20, 2).unwrap();
    let (submitted, completed) = sim.stream_progress(1);
    assert_eq!(
        submitted, completed,
        "took stream 1's page before its work finished"
    );
    fill(z, 6 << 20, 0x22);
    assert!(
        holds(x, 4096, 0x11),
        "the shared page under a live slab was remapped"
    );
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
    arena.check_consistency().unwrap();
    // Nothing else fits while x lives.
    assert!(arena.malloc(2 << 20, 2).is_err());
    assert!(holds(x, 4096, 0x11));
    arena.check_consistency().unwrap();
    // Once x is freed, the out-of-memory path dissolves its empty slab and takes the page.
    sim.launch(1, x, 4096);
    arena.free(x, Some(4096), 1).unwrap();
    let w = arena.malloc(2 << 20, 2).unwrap();
    let (submitted, completed) = sim.stream_progress(1);
    assert_eq!(submitted, completed);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
    arena.check_consistency().unwrap();
    arena.free(w, Some(2 << 20), 2).unwrap();
    arena.free(z, Some(6 << 20), 2).unwrap();
    arena.empty_cache().unwrap();
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
    arena.check_consistency().unwrap();
}

#[test]
fn a_failure_while_creating_a_slab_on_a_shared_page_changes_nothing() {
    let (sim, arena) = rig(64 << 20);
    let x = arena.malloc(4096, 0).unwrap();
    fill(x, 4096, 0x33);
    let before = arena.stats();
    // A 512 KiB slab spans a page from x's slab on: it needs a second page, whose map fails.
    sim.fail_nth(SimCall::Map, 1);
    assert!(arena.malloc(512 << 10, 0).is_err());
    arena.check_consistency().unwrap();
    let after = arena.stats();
    assert_eq!(after.allocated_bytes, before.allocated_bytes);
    assert_eq!(after.allocation, before.allocation);
    assert_eq!(
        after.reserved_bytes.pool(Pool::Small).current,
        before.reserved_bytes.pool(Pool::Small).current
    );
    assert!(holds(x, 4096, 0x33));
    // Page creation refused once: the out-of-memory path retries (and succeeds).
    sim.fail_nth(SimCall::Create, 1);
    let y = arena.malloc(512 << 10, 0).unwrap();
    arena.check_consistency().unwrap();
    assert!(holds(x, 4096, 0x33));
    arena.free(y, Some(512 << 10), 0).unwrap();
    // Random failures over many classes: every failure leaves the arena consistent.
    sim.fail_randomly(7, 3);
    let mut live = Vec::new();
    for i in 0..400u64 {
        let size = 512 + (i * 7919) % (300 << 10);
        if let Ok(p) = arena.malloc(size, i % 2) {
            live.push((p, size, i % 2));
        }
        arena.check_consistency().unwrap();
        if i % 3 == 0
            && let Some((p, s, st)) = live.pop()
        {
            arena.free(p, Some(s), st).unwrap();
        }
    }
    sim.stop_failing();
    assert!(holds(x, 4096, 0x33));
    for (p, s, st) in live {
        arena.free(p, Some(s), st).unwrap();
    }
    arena.free(x, Some(4096), 0).unwrap();
    arena.empty_cache().unwrap();
    arena.check_consistency().unwrap();
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
    assert_eq!(sim.mapped_pages(), 0);
    assert_eq!(sim.live_pages(), 0);
    assert!(sim.violations().is_empty(), "{:?}", sim.violations());
}

#[test]
fn the_chunk_is_the_slab_granule() {
    assert_eq!(CHUNK, 64 << 10);
}

#[test]
fn an_emptied_slab_of_large_slots_gives_its_stretch_of_the_pool_back() {
    // A 140 KiB request takes a slab of the 144 KiB class: 8 slots over 1.125 MiB of page 0.
    // Emptied, that slab dissolves although it is its class's current one (it spans over
    // `DISSOLVE_EMPTY_SPAN`, 1 MiB), so a 256 KiB class's slab, 2 MiB long, then fits on the
    // page: no driver call. Kept, it would push that slab across onto a new page.
    let (sim, arena) = rig(64 << 20);
    let a = arena.malloc(140 << 10, 0).unwrap();
    assert_eq!(small_reserved(&arena), PAGE as i64);
    arena.free(a, Some(140 << 10), 0).unwrap();
    assert!(
        arena.extras().classes.iter().all(|c| c.slabs == 0),
        "the empty slab dissolved"
    );
    let before = sim.counters();
    let b = arena.malloc(256 << 10, 0).unwrap();
    assert_eq!(sim.counters().since(&before).memory_calls(), 0);
    assert_eq!(b / PAGE, a / PAGE, "on the same page");
    // A slab of small slots stays when emptied, ready for its class: no churn for a class that
    // takes one slot and gives it back.
    let c = arena.malloc(4096, 0).unwrap();
    arena.free(c, Some(4096), 0).unwrap();
    assert_eq!(
        arena.extras().classes.iter().map(|c| c.slabs).sum::<u64>(),
        2
    );
    arena.check_consistency().unwrap();
}
