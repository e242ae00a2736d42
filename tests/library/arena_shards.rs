//! The arena's shards (one per stream: `src/arena/shared.rs`): what they must share stays
//! device-wide — the limit, the statistics with their peaks, block numbers, cached memory when
//! a stream runs out, the out-of-memory message — and a stream alone behaves as with one lock.

use std::sync::{Arc, Barrier};

use torch_arena::arena::Arena;
use torch_arena::config::Config;
use torch_arena::device::Device;
use torch_arena::device::sim::{SimConfig, SimDevice};
use torch_arena::stats::DeviceStats;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 2 * MIB;

fn rig(capacity_mb: u64) -> (Arc<SimDevice>, Arena) {
    let dev = Arc::new(SimDevice::new(SimConfig::new(capacity_mb * MIB, PAGE, false)).unwrap());
    let arena = Arena::new(dev.clone() as Arc<dyn Device>, &Config::default()).unwrap();
    (dev, arena)
}

fn allocated(s: &DeviceStats) -> (i64, i64) {
    let a = s.allocated_bytes.all();
    (a.current, a.peak)
}

/// Two streams, each in a shard of its own, that never hold memory at the same time: the
/// device's peak is the most held at once (100 MiB), not the sum of each stream's own peak.
#[test]
fn the_peak_is_the_devices_not_the_sum_of_the_streams() {
    let (_dev, arena) = rig(1024);
    let a = arena.malloc(100 * MIB, 1).unwrap();
    arena.free(a, None, 1).unwrap();
    let b = arena.malloc(60 * MIB, 2).unwrap();
    let c = arena.malloc(40 * MIB, 2).unwrap();
    assert_eq!(
        allocated(&arena.stats()),
        (100 * MIB as i64, 100 * MIB as i64)
    );
    let d = arena.malloc(10 * MIB, 1).unwrap();
    assert_eq!(
        allocated(&arena.stats()),
        (110 * MIB as i64, 110 * MIB as i64)
    );
    arena.free(b, None, 2).unwrap();
    arena.reset_peak_stats();
    assert_eq!(
        allocated(&arena.stats()),
        (50 * MIB as i64, 50 * MIB as i64)
    );
    for p in [(c, 2), (d, 1)] {
        arena.free(p.0, None, p.1).unwrap();
    }
    let s = arena.stats();
    assert_eq!(allocated(&s), (0, 50 * MIB as i64));
    assert_eq!(s.allocation.all().current, 0);
    assert_eq!(s.allocation.all().allocated, 4);
    assert_eq!(s.allocation.all().freed, 4);
    arena.check_consistency().unwrap();
}

/// Threads on their own streams raise and lower their bytes in turns, a barrier between turns:
/// after each turn the device's peak is the highest total any turn ended with, exactly.
#[test]
fn peaks_are_exact_while_threads_allocate_at_once() {
    const THREADS: usize = 4;
    const TURNS: usize = 40;
    let (_dev, arena) = rig(4096);
    let barrier = Barrier::new(THREADS + 1);
    // Thread t holds (t + turn) % 5 + 1 blocks of 8 MiB after turn `turn`.
    let held = |t: usize, turn: usize| ((t + turn * 3) % 5 + 1) as i64 * 8 * MIB as i64;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (arena, barrier) = (&arena, &barrier);
            s.spawn(move || {
                let stream = t as u64 + 1;
                let mut mine = Vec::new();
                for turn in 0..TURNS {
                    let want = (held(t, turn) / (8 * MIB as i64)) as usize;
                    while mine.len() < want {
                        mine.push(arena.malloc(8 * MIB, stream).unwrap());
                    }
                    while mine.len() > want {
                        arena.free(mine.pop().unwrap(), None, stream).unwrap();
                    }
                    barrier.wait(); // the turn is done
                    barrier.wait(); // the figures are read
                }
                for p in mine {
                    arena.free(p, None, stream).unwrap();
                }
            });
        }
        let mut peak = 0;
        for turn in 0..TURNS {
            barrier.wait();
            let total: i64 = (0..THREADS).map(|t| held(t, turn)).sum();
            // Within a turn each thread's bytes only rise or only fall, so the highest total
            // of the turn is at most its end (rising) or the last turn's (falling) with each
            // thread's rise: bounded by the sum of each thread's larger end.
            let bound: i64 = (0..THREADS)
                .map(|t| held(t, turn).max(if turn > 0 { held(t, turn - 1) } else { 0 }))
                .sum();
            let (current, p) = allocated(&arena.stats());
            assert_eq!(current, total, "turn {turn}");
            assert!(
                p >= total && p >= peak,
                "turn {turn}: peak {p} under {total} or {peak}"
            );
            assert!(
                p <= peak.max(bound),
                "turn {turn}: peak {p} over {}",
                peak.max(bound)
            );
            peak = p;
            barrier.wait();
        }
    });
    arena.check_consistency().unwrap();
}

/// A stream that runs out takes the pages another stream caches: whole handles move (unmapped
/// there, mapped here) and none is released to make room; the limit holds throughout, and the
/// statistics count the moved handle once.
#[test]
fn a_stream_that_runs_out_takes_what_another_caches() {
    let (dev, arena) = rig(256);
    let a = arena.malloc(200 * MIB, 1).unwrap();
    arena.free(a, None, 1).unwrap();
    let created = arena.stats().reserved_bytes.all().allocated;
    let b = arena.malloc(200 * MIB, 2).unwrap();
    assert!(dev.peak_used() <= 256 * MIB);
    let s = arena.stats();
    assert_eq!(
        s.reserved_bytes.all().current,
        200 * MIB as i64,
        "stream 1's pages moved"
    );
    assert_eq!(s.num_ooms, 0);
    // What the second request created within the room and gave back when it did not fit (its
    // first try, before the move) counts as created and freed; the moved handle, once.
    let r = s.reserved_bytes.all();
    assert_eq!(r.allocated - r.freed, r.current);
    assert!(r.allocated >= created);
    assert_eq!(
        s.num_device_alloc - s.num_device_free,
        (dev.counters().mem_create - dev.counters().mem_release) as i64
    );
    arena.free(b, None, 2).unwrap();
    arena.check_consistency().unwrap();
    arena.empty_cache().unwrap();
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
    assert_eq!(dev.used_bytes(), 0);
}

/// A stream short of memory takes from another's cache what its request could need, not all of
/// it: the rest stays mapped there (two streams that trade memory at the limit each step moved
/// all of it back and forth: 1,314 memory calls in the fifth step of `synth:two-stream-train`
/// at its smallest device, 54 since).
#[test]
fn a_stream_that_runs_out_takes_only_what_it_needs() {
    let (dev, arena) = rig(256);
    let mine: Vec<_> = (0..6).map(|_| arena.malloc(40 * MIB, 1).unwrap()).collect();
    for &p in &mine {
        arena.free(p, None, 1).unwrap();
    }
    let cached = arena.extras().pages.idle_mapped;
    assert!(cached * PAGE >= 240 * MIB, "stream 1 caches its 240 MiB");
    // Stream 2 asks for more than the limit leaves (16 MiB): about 24 MiB must come from
    // stream 1, in whole handles, at least the 22 pages the request could span (handles were
    // created at up to 1/8 of the headroom, so a few more may come).
    let unmaps = dev.counters().mem_unmap;
    let b = arena.malloc(40 * MIB, 2).unwrap();
    assert!(dev.peak_used() <= 256 * MIB);
    // Moving all of it unmapped stream 1's 20 mappings; what the request needs, 3.
    let unmapped = dev.counters().mem_unmap - unmaps;
    assert!(
        unmapped <= 10,
        "{unmapped} mappings unmapped for one request of 40 MiB"
    );
    let left = arena.extras().pages.idle_mapped;
    assert!(
        left * PAGE >= 120 * MIB,
        "stream 1 caches {} MiB of its 240 after a request of 40 MiB",
        left * PAGE / MIB
    );
    arena.free(b, None, 2).unwrap();
    assert_eq!(arena.stats().num_ooms, 0);
    arena.check_consistency().unwrap();
}

/// Out of memory with memory on several streams: the message counts the device's, not the
/// stream's shard's.
#[test]
fn the_out_of_memory_message_speaks_of_the_device() {
    let (_dev, arena) = rig(256);
    let a = arena.malloc(100 * MIB, 1).unwrap();
    let b = arena.malloc(100 * MIB, 2).unwrap();
    let e = arena.malloc(100 * MIB, 3).unwrap_err().to_string();
    assert!(
        e.contains("torch-arena holds 200.00 MiB reserved: 200.00 MiB allocated"),
        "{e}"
    );
    assert!(e.contains("Live allocations: 2."), "{e}");
    assert_eq!(arena.stats().num_ooms, 1);
    arena.free(a, None, 1).unwrap();
    arena.free(b, None, 2).unwrap();
    arena.check_consistency().unwrap();
}

/// Block numbers stay unique once several shards number them, and a stream's are in order.
#[test]
fn block_numbers_are_unique_across_streams() {
    let (_dev, arena) = rig(1024);
    let first: Vec<_> = (0..5).map(|_| arena.alloc(MIB, 1).unwrap()).collect();
    let mut seqs: Vec<u64> = first.iter().map(|b| b.seq).collect();
    assert_eq!(
        seqs,
        vec![1, 2, 3, 4, 5],
        "one stream numbers as one lock did"
    );
    let mut last = [0u64; 4];
    for i in 0..40u64 {
        let stream = i % 4 + 1;
        let b = arena.alloc(MIB, stream).unwrap();
        assert!(
            b.seq > last[stream as usize - 1],
            "stream {stream} out of order"
        );
        last[stream as usize - 1] = b.seq;
        seqs.push(b.seq);
    }
    let n = seqs.len();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), n, "a block number handed out twice");
}

/// Two threads on one stream, the second with a shard of its own for it (as when the two keep
/// meeting at the stream's lock): each thread's blocks come from its shard, either thread frees
/// the other's, and the device's figures count both.
#[test]
fn a_thread_with_a_shard_of_its_own_shares_its_stream_correctly() {
    let (_dev, arena) = rig(1024);
    let before = arena.alloc(4 * MIB, 1).unwrap();
    // Blocks numbered once several shards serve: a shard's are `SHARDS` apart, so two shards'
    // differ modulo 8 (`Inner::seq_of`).
    let (theirs, mine) = std::thread::scope(|s| {
        s.spawn(|| {
            arena.take_own_shard(1);
            let mine: Vec<_> = (0..3).map(|_| arena.alloc(4 * MIB, 1).unwrap()).collect();
            // This thread frees a block the other allocated on the stream's shard.
            arena.free(before.ptr, None, 1).unwrap();
            let theirs = arena.alloc(4 * MIB, 1).unwrap();
            (theirs, mine)
        })
        .join()
        .unwrap()
    });
    let home = arena.alloc(4 * MIB, 1).unwrap();
    assert_eq!(arena.extras().own_shards, 1);
    let shard = |b: &torch_arena::arena::Block| b.seq % 8;
    assert!(mine.iter().all(|b| shard(b) == shard(&mine[0])));
    assert_eq!(shard(&theirs), shard(&mine[0]));
    assert_ne!(
        shard(&home),
        shard(&mine[0]),
        "this thread still has the stream's shard"
    );
    let s = arena.stats();
    assert_eq!(s.allocation.all().current, 5);
    assert_eq!(allocated(&s).0, 20 * MIB as i64);
    arena.check_consistency().unwrap();
    // This thread frees the other's blocks; nothing is left.
    for b in mine.iter().chain([&theirs, &home]) {
        arena.free(b.ptr, None, 1).unwrap();
    }
    let s = arena.stats();
    assert_eq!((s.allocation.all().current, allocated(&s).0), (0, 0));
    assert_eq!(s.allocation.all().freed, 6);
    arena.check_consistency().unwrap();
    arena.empty_cache().unwrap();
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
}

/// Two threads that take turns on one stream, as PyTorch's main thread (forward) and autograd
/// thread (backward) do, never meet at its shard's lock: they keep sharing it, and each reuses
/// what the other freed.
#[test]
fn threads_that_take_turns_on_a_stream_share_its_shard() {
    let (dev, arena) = rig(1024);
    let (turn, done) = (Barrier::new(2), Barrier::new(2));
    let mut seqs = Vec::new();
    std::thread::scope(|s| {
        let (arena, turn, done) = (&arena, &turn, &done);
        // "Backward": frees what "forward" allocated, allocates its own, frees it.
        s.spawn(move || {
            for _ in 0..50 {
                turn.wait();
                for _ in 0..100 {
                    let b = arena.alloc(3 * MIB, 1).unwrap();
                    arena.free(b.ptr, None, 1).unwrap();
                }
                done.wait();
            }
        });
        for _ in 0..50 {
            let blocks: Vec<_> = (0..20).map(|_| arena.alloc(3 * MIB, 1).unwrap()).collect();
            seqs.extend(blocks.iter().map(|b| b.seq));
            for b in blocks {
                arena.free(b.ptr, None, 1).unwrap();
            }
            turn.wait();
            done.wait();
        }
    });
    assert_eq!(arena.extras().own_shards, 0);
    // One shard numbered every block: "forward"'s are its first 20 of each 120.
    let expected: Vec<u64> = (0..50u64)
        .flat_map(|step| (1..=20).map(move |k| step * 120 + k))
        .collect();
    assert_eq!(seqs, expected);
    // Memory freed by either is reused by both: created once, in the first step.
    assert!(dev.counters().mem_create <= 10, "{:?}", dev.counters());
    arena.check_consistency().unwrap();
}

/// A thread with a shard of its own that runs out of memory goes back to its stream's shard,
/// where the memory the other thread freed on the stream is: at the limit the two serve as if
/// they had shared the shard throughout.
#[test]
fn a_thread_whose_own_shard_runs_out_goes_back_to_its_streams() {
    let (_dev, arena) = rig(256);
    // 240 of 256 MiB; freed blocks between live ones, whose pages stay in handles the live
    // blocks pin.
    let blocks: Vec<_> = (0..6).map(|_| arena.alloc(40 * MIB, 1).unwrap()).collect();
    for b in blocks.iter().step_by(2) {
        arena.free(b.ptr, None, 1).unwrap();
    }
    let theirs = std::thread::scope(|s| {
        s.spawn(|| {
            arena.take_own_shard(1);
            // The first runs out on its own shard; it and the next (which would fit there)
            // are served on the stream's.
            let theirs = arena.alloc(40 * MIB, 1).unwrap();
            let next = arena.alloc(MIB, 1).unwrap();
            (theirs, next)
        })
        .join()
        .unwrap()
    });
    let home = arena.alloc(MIB, 1).unwrap();
    assert_eq!(
        theirs.0.seq % 8,
        home.seq % 8,
        "served on the stream's shard"
    );
    assert_eq!(theirs.1.seq % 8, home.seq % 8, "and stays there");
    assert_eq!(arena.stats().num_ooms, 0);
    for b in blocks
        .iter()
        .skip(1)
        .step_by(2)
        .chain([&theirs.0, &theirs.1, &home])
    {
        arena.free(b.ptr, None, 1).unwrap();
    }
    arena.check_consistency().unwrap();
}

/// Eight streams allocate at once on a device they overfill: the bytes all shards hold never
/// pass the limit (here a memory fraction, which the device would not enforce by itself).
#[test]
fn the_limit_holds_for_all_shards_at_once() {
    let (dev, arena) = rig(1024);
    arena.set_memory_fraction(0.25).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let arena = &arena;
            s.spawn(move || {
                let mut mine = Vec::new();
                for i in 0..400u64 {
                    if let Ok(p) = arena.malloc((i % 7 + 1) * 3 * MIB, t + 1) {
                        mine.push(p);
                    }
                    if mine.len() > 3 {
                        arena.free(mine.remove(0), None, t + 1).unwrap();
                    }
                }
                for p in mine {
                    arena.free(p, None, t + 1).unwrap();
                }
            });
        }
    });
    assert!(
        dev.peak_used() <= 256 * MIB,
        "{} bytes held at once",
        dev.peak_used()
    );
    arena.check_consistency().unwrap();
}
