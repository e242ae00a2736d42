//! Synthetic traces: a workload built against the native allocator's segment rules, and RMM's
//! random-allocation benchmark.

use crate::model::{Event, Op, Trace};

const MIB: u64 = 1 << 20;

/// Builds a trace from (op, id, size) steps on stream 0; event index = time.
struct Builder {
    events: Vec<Event>,
    next_id: u64,
}

impl Builder {
    fn new() -> Self {
        Builder {
            events: Vec::new(),
            next_id: 1,
        }
    }

    fn alloc(&mut self, size: u64) -> (u64, u64) {
        let id = self.next_id;
        self.next_id += 1;
        self.push(Op::Alloc, id, size);
        (id, size)
    }

    fn free(&mut self, (id, size): (u64, u64)) {
        self.push(Op::Free, id, size);
    }

    fn push(&mut self, op: Op, id: u64, size: u64) {
        let time_us = self.events.len() as i64;
        self.events.push(Event {
            op,
            id,
            size,
            stream: 0,
            time_us,
            site: 0,
        });
    }

    fn finish(self, name: String) -> Trace {
        Trace::synthetic(name, self.events, vec!["unknown".to_string()])
    }
}

/// A trace on which the native allocator's policy runs out of memory at `capacity` while the
/// arena fits.
///
/// The native allocator serves a 1–10 MiB request from a 20 MiB (`large_segment_size`) segment
/// and splits it, and it gives a segment back to the driver only when no block of it is live.
/// So:
/// 1. `n = capacity / 20 MiB` rounds of three 6 MiB tensors fill `n` segments (each segment:
///    6 + 6 + 6 MiB and a 2 MiB remainder): native reserves `20 n` MiB, more than
///    `capacity − 20 MiB`.
/// 2. The first and the third tensor of each segment are freed: `12 n` MiB are cached, but every
///    segment still holds its middle tensor, so none can be released; the free blocks (6 and
///    8 MiB) are too small for what comes next.
/// 3. 40 MiB tensors follow, as many as fit in 85 % of what is left (`capacity − 6 n` MiB
///    live-free), at least one. Native needs a new 40 MiB segment, the device has under 20 MiB
///    left, `release_cached_blocks` finds no unsplit segment: out of memory at the first one.
///    The arena builds large ranges from 2 MiB pages: the freed 6 MiB ranges give their pages
///    back to the pool, and stitching maps them into the new 40 MiB ranges.
/// 4. Everything is freed.
pub fn adversarial(capacity: u64) -> Trace {
    let n = (capacity / (20 * MIB)).max(1);
    // All segments are filled before any free: a 6 MiB block freed early would take the
    // next 6 MiB tensor (best fit) and the segments would not stay split.
    let mut b2 = Builder::new();
    let mut held = Vec::new();
    for _ in 0..n {
        held.push([b2.alloc(6 * MIB), b2.alloc(6 * MIB), b2.alloc(6 * MIB)]);
    }
    let mut middle = Vec::new();
    for t in held {
        b2.free(t[0]);
        b2.free(t[2]);
        middle.push(t[1]);
    }
    let free_for_big = capacity.saturating_sub(6 * MIB * n);
    let big = (free_for_big / 100 * 85 / (40 * MIB)).max(1);
    let bigs: Vec<_> = (0..big).map(|_| b2.alloc(40 * MIB)).collect();
    for t in bigs.into_iter().chain(middle) {
        b2.free(t);
    }
    b2.finish(format!("adversarial-{}MiB", capacity / MIB))
}

/// SplitMix64: a small, fast, deterministic generator (no crate needed), shared by the synthetic
/// traces and the benchmarks so a seed means the same sequence everywhere.
#[derive(Clone, Debug)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), without modulo bias worth speaking of (128-bit multiply).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// A position in a slice of `len` items (`below` as a `usize`).
    #[inline]
    pub fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }
}

/// RMM's `RANDOM_ALLOCATIONS_BENCH` workload (`cpp/benchmarks/random_allocations`): `2 n` steps;
/// each step allocates (size uniform in [1, `max_size`]) with probability 73 % while fewer than
/// `n` allocations were made and the live total stays under `max_usage` = 16,000 MiB, and
/// otherwise frees a uniformly random live allocation. Whatever is live at the end is freed.
/// Deterministic for a given `seed`.
pub fn rmm_random(n: usize, max_size: u64, seed: u64) -> Trace {
    const MAX_USAGE: u64 = 16_000 * MIB;
    let max_size = max_size.max(1);
    let mut rng = SplitMix(seed);
    let mut b = Builder::new();
    let mut live: Vec<(u64, u64)> = Vec::new();
    let (mut usage, mut made) = (0u64, 0usize);
    for _ in 0..2 * n {
        let size = 1 + rng.below(max_size);
        let want_alloc = rng.below(100) < 73;
        let can_alloc = made < n && usage + size <= MAX_USAGE;
        if (want_alloc || live.is_empty()) && can_alloc {
            live.push(b.alloc(size));
            usage += size;
            made += 1;
        } else if !live.is_empty() {
            let i = rng.index(live.len());
            let a = live.swap_remove(i);
            usage -= a.1;
            b.free(a);
        }
    }
    for a in live {
        b.free(a);
    }
    b.finish(format!("rmm-random-{n}x{max_size}-seed{seed}"))
}
