//! Host memory per short-lived stream on the CUDA path (issue 37, item 3): an arena on the real
//! driver-facing device, [`CudaDevice`], over the fake driver (`fixtures/fakecuda.c`), at 8 GiB,
//! serving 10,000 streams that each live for a few requests (one with a `record_stream` onto
//! another short-lived stream, so pending frees' events churn too).
//!
//! What a stream leaves behind once retired is measured two deterministic ways: the events the
//! driver still holds for the arena (each is driver host memory; the arena used to give a retired
//! stream's fence back to a spare list that nothing took from, one event per stream for the
//! process's life, and the heap holes those pinned grew RSS by a page table per stream), and the
//! bytes this process's Rust heap holds (a counting global allocator: this binary has one test,
//! so nothing else allocates meanwhile). Both must level off, whatever the number of streams.

#[path = "fixtures/fakecuda.rs"]
mod fakecuda;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use torch_arena::arena::Arena;
use torch_arena::config::Config;
use torch_arena::device::Device;
use torch_arena::device::cuda::CudaDevice;

/// The system allocator, counting the bytes it holds.
struct Counting;
static HELD: AtomicI64 = AtomicI64::new(0);

// SAFETY: forwards to `System` unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        HELD.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        HELD.fetch_add(l.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        HELD.fetch_sub(l.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        HELD.fetch_add(n as i64 - l.size() as i64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const STREAMS: u64 = 10_000;
/// Streams served before the first measurement: by then the arena keeps as many streams as it
/// ever will (those used in its last 256 requests), so what follows must add nothing.
const WARM: u64 = 2_000;

/// Stream `i`'s requests: a slab block, a medium block, and a large one also used on the next
/// stream id (recorded, so its free waits on an event), all freed.
fn serve(arena: &Arena, i: u64) {
    let s = 0x10_0000 + 2 * i;
    let small = arena.malloc(1000, s).unwrap();
    let medium = arena.malloc(3 << 20, s).unwrap();
    let large = arena.malloc(24 << 20, s).unwrap();
    arena.record_stream(large, s + 1).unwrap();
    arena.free(large, Some(24 << 20), s).unwrap();
    arena.free(medium, Some(3 << 20), s).unwrap();
    arena.free(small, Some(1000), s).unwrap();
}

#[test]
fn retired_streams_leave_no_host_memory_behind_on_an_8_gib_device() {
    let (_g, fake) = fakecuda::session();
    fake.set_capacity(8 << 30);
    let dev = Arc::new(CudaDevice::open(0).unwrap());
    let arena = Arena::new(dev as Arc<dyn Device>, &Config::default()).unwrap();

    for i in 0..WARM {
        serve(&arena, i);
    }
    let (events_warm, heap_warm) = (fake.live("events"), HELD.load(Ordering::Relaxed));
    for i in WARM..STREAMS {
        serve(&arena, i);
    }
    let (events, heap) = (fake.live("events"), HELD.load(Ordering::Relaxed));
    arena.check_consistency().unwrap();

    // A fence per kept stream and a bounded spare list; one per stream ever seen is the leak.
    assert!(
        events <= 256,
        "{events} driver events held after {STREAMS} short-lived streams ({events_warm} after \
         {WARM}): events of retired streams are not reused or destroyed"
    );
    // The heap holds what the kept streams hold (their page tables scale with the capacity); the
    // 8,000 streams served since the warm-up add nothing but noise.
    assert!(
        heap <= heap_warm + (256 << 10),
        "the Rust heap grew from {heap_warm} to {heap} bytes over {} short-lived streams",
        STREAMS - WARM
    );

    // And `empty_cache` gives back what the kept streams held.
    arena.empty_cache().unwrap();
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
    for what in ["handles", "mappings", "bytes"] {
        assert_eq!(fake.live(what), 0, "{what} left after empty_cache");
    }
    drop(arena);
}
