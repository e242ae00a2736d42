//! The model's oracle under threads: 8 threads on 8 streams of one host-backed simulated device
//! (or two on each of 4 streams, in shards of their own), each running its own seeded sequence
//! of allocations, frees, `record_stream`s, GPU work and completions, and handing some of its
//! blocks to the next thread to free (a free on another thread and another stream, as autograd
//! frees what the forward pass allocated). The checks are
//! `common/model.rs`'s:
//! - every allocation still holds the pattern written into it (every page of it) when it is
//!   freed and at every round's end, so no two live allocations overlapped and nothing was
//!   remapped under a live one;
//! - a block handed out on stream T never overlaps memory another stream's uncompleted work
//!   uses, and the device saw no unmap or release of memory a stream may still use;
//! - at every round's end, with every thread stopped at a barrier: the live count, requested and
//!   allocated bytes equal the sum over all threads' live sets, reserved bytes equal what the
//!   device holds, and the arena's own consistency check passes;
//! - at the end, everything freed and trimmed: nothing is held.

use crate::model::{self, PAGE};
use torch_arena_lab::synth::SplitMix as Rng;

use std::sync::{Arc, Barrier, Mutex};

use torch_arena::arena::Arena;
use torch_arena::config::Config;
use torch_arena::device::StreamId;
use torch_arena::device::sim::{SimConfig, SimDevice};

const THREADS: usize = 8;

/// Sizes like `model::size_strategy`'s: small, medium, large, and lengths that repeat.
fn draw_size(rng: &mut Rng) -> u64 {
    match rng.index(13) {
        0..=3 => 1 + rng.below(4095),
        4..=6 => 4096 + rng.below(1 << 20),
        7..=8 => (1 << 20) + rng.below(5 << 20),
        9 => (6 << 20) + rng.below(18 << 20),
        _ => [(1u64 << 20) + 4096, 3 << 20, (5 << 20) + 512, (9 << 20) + 7][rng.index(4)],
    }
}

/// A random block of `mine`, taken out of it.
fn take_random(rng: &mut Rng, mine: &Mutex<Vec<model::Live>>) -> Option<model::Live> {
    let mut m = mine.lock().unwrap();
    if m.is_empty() {
        return None;
    }
    let i = rng.index(m.len());
    Some(m.swap_remove(i))
}

/// Thread `t`'s stream when the threads share `streams` streams.
fn stream_of(t: usize, streams: usize) -> StreamId {
    (t % streams) as StreamId + 1
}

/// One thread's ops for a round. `mine` is its live set, `inbox` the blocks other threads handed
/// it to free.
#[allow(clippy::too_many_arguments)]
fn round(
    t: usize,
    rng: &mut Rng,
    ops: usize,
    arena: &Arena,
    sim: &SimDevice,
    mine: &Mutex<Vec<model::Live>>,
    inboxes: &[Mutex<Vec<model::Live>>],
    pattern: &mut u64,
    streams: usize,
) -> Result<(), String> {
    let stream = stream_of(t, streams);
    for _ in 0..ops {
        match rng.index(20) {
            0..=8 => {
                let size = draw_size(rng);
                let Ok(ptr) = arena.malloc(size, stream) else {
                    continue; // out of memory: the figures are checked at the round's end
                };
                if ptr % 512 != 0 {
                    return Err(format!("{ptr:#x} is not 512-byte aligned"));
                }
                let busy: Vec<_> = sim
                    .busy_overlapping(ptr, size)
                    .into_iter()
                    .filter(|b| b.0 != stream)
                    .collect();
                if !busy.is_empty() {
                    return Err(format!(
                        "{ptr:#x}+{size} handed to stream {stream} while in use: {busy:?}"
                    ));
                }
                *pattern = pattern
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let l = model::Live {
                    dev: 0,
                    ptr,
                    size,
                    stream,
                    users: vec![stream],
                    pattern: *pattern,
                };
                l.write_pattern();
                mine.lock().unwrap().push(l);
            }
            9..=13 => {
                let Some(l) = take_random(rng, mine) else {
                    continue;
                };
                l.check_pattern()?;
                arena
                    .free(l.ptr, Some(l.size), l.stream)
                    .map_err(|e| format!("thread {t}: {e}"))?;
            }
            14 => {
                // Hand a block to the next thread, which frees it on its own thread.
                let Some(l) = take_random(rng, mine) else {
                    continue;
                };
                inboxes[(t + 1) % THREADS].lock().unwrap().push(l);
            }
            15 => {
                // Free what other threads handed over (allocated on their streams).
                let handed = std::mem::take(&mut *inboxes[t].lock().unwrap());
                for l in handed {
                    l.check_pattern()?;
                    arena
                        .free(l.ptr, Some(l.size), l.stream)
                        .map_err(|e| format!("thread {t}, a block of stream {}: {e}", l.stream))?;
                }
            }
            16 => {
                // The block is used on another thread's stream too, which gets work on it.
                let mut m = mine.lock().unwrap();
                if m.is_empty() {
                    continue;
                }
                let i = rng.index(m.len());
                let other = stream_of(rng.index(THREADS), streams);
                let l = &mut m[i];
                arena
                    .record_stream(l.ptr + l.size / 2, other)
                    .map_err(|e| format!("thread {t}: {e}"))?;
                if !l.users.contains(&other) {
                    l.users.push(other);
                }
                sim.launch(other, l.ptr, l.size);
            }
            17..=18 => {
                let m = mine.lock().unwrap();
                if let Some(l) = m.get(rng.index(m.len())) {
                    sim.launch(stream, l.ptr, l.size);
                }
            }
            _ => sim.complete(stream_of(rng.index(THREADS), streams)),
        }
    }
    Ok(())
}

/// With every thread stopped: the arena's figures against the union of the live sets.
fn check_figures(
    arena: &Arena,
    sim: &SimDevice,
    lives: &[Mutex<Vec<model::Live>>],
    inboxes: &[Mutex<Vec<model::Live>>],
) -> Result<(), String> {
    let sets: Vec<_> = lives
        .iter()
        .chain(inboxes)
        .map(|m| m.lock().unwrap())
        .collect();
    let live = sets.iter().flat_map(|set| set.iter());
    model::check_arena(arena, live, sim.used_bytes(), sim.violations())
}

/// `THREADS` threads on `streams` streams; where two share a stream, the second has a shard of
/// its own for it (as when two threads keep meeting at one stream's lock).
fn run(
    seed: u64,
    capacity_mb: u64,
    rounds: usize,
    ops: usize,
    streams: usize,
) -> Result<(), String> {
    let sim = Arc::new(SimDevice::new(SimConfig::new(capacity_mb << 20, PAGE, true)).unwrap());
    let arena = Arena::new(sim.clone(), &Config::default()).unwrap();
    let lives: Vec<Mutex<Vec<model::Live>>> = (0..THREADS).map(|_| Mutex::default()).collect();
    let inboxes: Vec<Mutex<Vec<model::Live>>> = (0..THREADS).map(|_| Mutex::default()).collect();
    let barrier = Barrier::new(THREADS);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let fail = |e: String| {
        failure.lock().unwrap().get_or_insert(e);
    };
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (arena, sim, lives, inboxes, barrier, fail, failure) =
                (&arena, &*sim, &lives, &inboxes, &barrier, &fail, &failure);
            scope.spawn(move || {
                let mut rng = Rng(seed ^ (t as u64 + 1).wrapping_mul(0xa076_1d64_78bd_642f));
                let mut pattern = seed.wrapping_add(t as u64) | 1;
                if t >= streams {
                    arena.take_own_shard(stream_of(t, streams));
                }
                for _ in 0..rounds {
                    if failure.lock().unwrap().is_none()
                        && let Err(e) = round(
                            t,
                            &mut rng,
                            ops,
                            arena,
                            sim,
                            &lives[t],
                            inboxes,
                            &mut pattern,
                            streams,
                        )
                    {
                        fail(format!("seed {seed}, thread {t}: {e}"));
                    }
                    barrier.wait();
                    if t == 0
                        && failure.lock().unwrap().is_none()
                        && let Err(e) = check_figures(arena, sim, lives, inboxes)
                    {
                        fail(format!("seed {seed}, after a round: {e}"));
                    }
                    barrier.wait();
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().unwrap() {
        return Err(e);
    }
    // Free everything, let the GPU finish, trim: nothing may be held.
    for set in lives.iter().chain(&inboxes) {
        for l in std::mem::take(&mut *set.lock().unwrap()) {
            l.check_pattern()?;
            arena
                .free(l.ptr, Some(l.size), l.stream)
                .map_err(|e| e.to_string())?;
        }
    }
    sim.complete_all();
    arena.empty_cache().map_err(|e| e.to_string())?;
    check_figures(&arena, &sim, &[], &[])?;
    if sim.used_bytes() != 0 || sim.mapped_pages() != 0 {
        return Err(format!(
            "after freeing everything and emptying the cache the device still holds {} bytes, {} pages mapped",
            sim.used_bytes(),
            sim.mapped_pages()
        ));
    }
    Ok(())
}

#[test]
fn eight_threads_on_eight_streams_keep_every_invariant() {
    for seed in [1, 2, 3] {
        run(seed, 512, 12, 150, THREADS).unwrap();
    }
}

/// A device small enough that threads run it out of memory often: the ladder (waiting for every
/// stream, moving idle pages, lending) runs while other threads allocate and free.
#[test]
fn eight_threads_at_the_limit_keep_every_invariant() {
    for seed in [11, 12, 13] {
        run(seed, 96, 12, 150, THREADS).unwrap();
    }
}

/// Two threads on each of four streams, each second one with a shard of its own for its stream
/// (`Arena::take_own_shard`): blocks of one stream in two shards, freed by either thread, handed
/// to threads of other streams, used on other streams.
#[test]
fn threads_sharing_streams_in_shards_of_their_own_keep_every_invariant() {
    for seed in [21, 22] {
        run(seed, 512, 12, 150, THREADS / 2).unwrap();
    }
    for seed in [31, 32] {
        run(seed, 96, 12, 150, THREADS / 2).unwrap();
    }
}
