//! Allocation cost: malloc+free pairs over the size mix of real PyTorch traces.
//!
//! For each configuration (size mix, live allocations, threads) one arena over an accounting-only
//! simulated device is filled with `live` allocations, then batches of pairs run: each pair
//! allocates a new size drawn from the mix and frees a random live allocation of the same thread,
//! which the new one replaces. Every thread has its own stream and its own live set; all threads
//! share one `Arena`. The same sizes and victims (same seeds) then run through the system
//! `malloc`/`free` (memory never touched) in the same run, for a side-by-side ratio, and through
//! no allocator at all (the harness's own cost). Each side of each configuration runs in a fresh
//! child process of this binary, so none inherits another's heap state or resident memory.
//!
//! Sizes and victims of a batch are drawn before the batch is timed; the harness prefetches the
//! live-set entry it will replace a few pairs ahead, so what is timed is the allocator plus a
//! loop whose own cost the `harness` column (no allocator at all) shows.
//!
//! Per batch the figure is wall time / pairs (all threads together: the throughput cost) and wall
//! time / pairs per thread (per-thread latency); the table gives the median and p10/p90 over the
//! measured batches (nearest rank).
//!
//! Run it with `bench/run` (it writes the size histogram first), or
//! `TORCH_ARENA_SIZE_MIX=FILE cargo bench --bench pairs`. Results go to
//! `bench/results/pairs-<UTC date>-<commit>.json`.
//!
//! Knobs (environment): `TORCH_ARENA_BENCH_ONLY=substring` runs only the configurations whose
//! label contains it (the JSON is then named `...-partial.json`); `TORCH_ARENA_BENCH_SCALE=F`
//! multiplies the pairs per batch (for profiling); `TORCH_ARENA_BENCH_SKIP=system` (or `arena`)
//! skips that side (for profiling one alone); `TORCH_ARENA_BENCH_NO_JSON=1` writes no
//! JSON. `TORCH_ARENA_BENCH_CHILD=MIX/LIVE/THREADS/SIDE` (e.g. `full/1000/1/arena`, SIDE one of
//! arena, system, harness, or by hand `shards` and `shards-stats` (see [`Shards`]) and
//! `arena-one-stream` (the arena side with every thread on stream 1: `bench/threads`) runs one side
//! of one configuration in this process and prints its
//! figures, which is what the parent does in each child; run the bench binary that way under
//! `perf record` to profile a single configuration. The child also prints `PAIRS n`, the pairs
//! it ran after filling (warm-up included): `bench/instructions` runs it under cachegrind at two
//! scales and divides the difference in instructions by the difference in pairs.
//!
//! After the pairs, a last child (`TORCH_ARENA_BENCH_CHILD=latency`) times dependent loads
//! through random cycles over working sets of 1 MiB to 1 GiB: the machine's cache-miss cost by
//! the size of the structure missed into, printed and kept in the JSON
//! (`memory_latency_ns`). It is what separates the 1M-live rows from the 1k ones, and it
//! differs between the VMs the results were taken on.
//!
//! Tracking (`src/track`): `TORCH_ARENA_BENCH_TRACK=off,default,python,native` (any of them, comma
//! separated) adds, per configuration, one side per mode that runs the same pairs through the
//! whole `TorchArena` (tracker included) on an equal simulated device: `off` with
//! `Tracker::disabled()` (the allocator layer without tracking), `default` (live table, no
//! sites), `python` (`sites:python`; in this process there is no Python interpreter, so it
//! measures only the check that skips capture), `native` (`sites:native`, a backtrace per
//! allocation). Those runs write `bench/results/pairs-track-<date>-<commit>.json`; SIDE in
//! `TORCH_ARENA_BENCH_CHILD` is then `track-MODE`.

use std::fmt::Write as _;
use std::hint::black_box;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use torch_arena::arena::{Arena, Block};
use torch_arena::device::sim::{SimConfig, SimDevice};
use torch_arena::device::{Device, DriverCounters};
use torch_arena::resource::{Request, Resource, Tracked};
use torch_arena::track::Tracker;
use torch_arena::{Config, TorchArena};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// Sim device granularity (and the arena's default page).
const GRANULARITY: u64 = 2 * MIB;
const WARMUP_BATCHES: usize = 2;
const MEASURED_BATCHES: usize = 15;
const SEED: u64 = 0x7a11_0c8e_b0a7_5eed;
/// The harness prefetches the live-set entry of the pair this many pairs ahead, so that its own
/// cache miss on a large live-set array stays off the measured path (the allocator's metadata is
/// not prefetched).
const PREFETCH_AHEAD: usize = 8;

#[inline(always)]
fn prefetch<T>(p: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it never faults, whatever the address.
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (p as *const T).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

// ----- size mix ---------------------------------------------------------------------------------

/// A histogram of request sizes, drawn from by cumulative count.
#[derive(Clone)]
struct Mix {
    name: &'static str,
    /// The `#` lines of the histogram file (what it was built from).
    notes: Vec<String>,
    sizes: Vec<u64>,
    /// `cum[i]` = counts of sizes[..=i].
    cum: Vec<u64>,
}

impl Mix {
    fn load(path: &Path) -> Result<Mix, String> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "cannot read the size mix {}: {e}.\nRun `bench/run` (it writes target/size-mix.tsv \
                 from traces/snapshots with scripts/size-mix), or point TORCH_ARENA_SIZE_MIX at a \
                 `size<TAB>count` file.",
                path.display()
            )
        })?;
        let mut pairs = Vec::new();
        let mut notes = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if let Some(note) = line.strip_prefix('#') {
                notes.push(note.trim().to_string());
                continue;
            }
            if line.is_empty() {
                continue;
            }
            let mut it = line.split_whitespace();
            let parse = |f: Option<&str>| f.and_then(|v| v.parse::<u64>().ok());
            match (parse(it.next()), parse(it.next())) {
                (Some(size), Some(count)) if size >= 1 => pairs.push((size, count)),
                _ => {
                    return Err(format!(
                        "{}:{}: expected `size<TAB>count`, got {line:?}",
                        path.display(),
                        n + 1
                    ));
                }
            }
        }
        let mut mix = Mix::from_pairs("full", pairs)
            .ok_or_else(|| format!("{}: no sizes in the size mix", path.display()))?;
        mix.notes = notes;
        Ok(mix)
    }

    fn from_pairs(name: &'static str, mut pairs: Vec<(u64, u64)>) -> Option<Mix> {
        pairs.retain(|&(_, c)| c > 0);
        pairs.sort_unstable();
        if pairs.is_empty() {
            return None;
        }
        let mut total = 0;
        let (sizes, cum) = pairs
            .into_iter()
            .map(|(s, c)| {
                total += c;
                (s, total)
            })
            .unzip();
        Some(Mix {
            name,
            notes: Vec::new(),
            sizes,
            cum,
        })
    }

    fn restrict(&self, name: &'static str, keep: impl Fn(u64) -> bool) -> Option<Mix> {
        let mut prev = 0;
        let pairs = self
            .sizes
            .iter()
            .zip(&self.cum)
            .map(|(&s, &c)| {
                let count = c - prev;
                prev = c;
                (s, count)
            })
            .filter(|&(s, _)| keep(s))
            .collect();
        Mix::from_pairs(name, pairs)
    }

    fn total(&self) -> u64 {
        *self.cum.last().expect("non-empty")
    }

    fn mean(&self) -> f64 {
        let mut prev = 0;
        let mut sum = 0.0;
        for (&s, &c) in self.sizes.iter().zip(&self.cum) {
            sum += s as f64 * (c - prev) as f64;
            prev = c;
        }
        sum / self.total() as f64
    }

    fn std_dev(&self) -> f64 {
        let mean = self.mean();
        let mut prev = 0;
        let mut sum = 0.0;
        for (&s, &c) in self.sizes.iter().zip(&self.cum) {
            sum += (s as f64 - mean).powi(2) * (c - prev) as f64;
            prev = c;
        }
        (sum / self.total() as f64).sqrt()
    }

    #[inline]
    fn draw(&self, rng: &mut SplitMix) -> u64 {
        let x = rng.below(self.total());
        self.sizes[self.cum.partition_point(|&c| c <= x)]
    }
}

/// SplitMix64, the library's (the synthetic traces draw from the same generator).
use torch_arena_lab::synth::SplitMix;

// ----- allocators under test --------------------------------------------------------------------

/// Each side is a [`Resource`], the crate's allocation interface: the arena itself, the whole
/// allocator layer, the tracker's layer around a pointer counter, glibc, or nothing.
#[inline]
fn alloc_one<R: Resource>(a: &R, size: u64, stream: u64) -> Result<u64, String> {
    let req = Request {
        size,
        stream,
        ..Request::default()
    };
    a.alloc(&req)
        .map(|b| b.ptr)
        .map_err(|e| format!("alloc({size}) failed: {e}"))
}

#[inline]
fn free_one<R: Resource>(a: &R, ptr: u64, size: u64, stream: u64) {
    if let Err(e) = a.free(ptr, size, stream) {
        panic!("free({ptr:#x}, {size}) failed: {e}");
    }
}

/// The whole allocator layer (device 0, the tracker included), as the C exports call it.
struct TrackedAlloc(TorchArena);

impl Resource for TrackedAlloc {
    #[inline]
    fn alloc(&self, req: &Request) -> torch_arena::Result<Block> {
        let ptr = self.0.malloc(req.size as usize, 0, req.stream)?;
        Ok(Block {
            ptr,
            size: req.size,
            seq: 0,
        })
    }

    #[inline]
    fn free(&self, ptr: u64, size: u64, stream: u64) -> torch_arena::Result<()> {
        self.0.free(ptr, size as usize, 0, stream)
    }

    fn reserved(&self) -> u64 {
        self.0
            .stats(0)
            .map_or(0, |s| s.reserved_bytes.all().current as u64)
    }
}

/// Fake 512-byte-aligned pointers from a counter: under [`Tracked`], what the live table costs by
/// itself (SIDE `tracker-only`, by hand only).
#[derive(Default)]
struct Counter(std::sync::atomic::AtomicU64);

impl Resource for Counter {
    #[inline]
    fn alloc(&self, req: &Request) -> torch_arena::Result<Block> {
        let seq = self.0.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(Block {
            ptr: seq << 9,
            size: req.size.next_multiple_of(512),
            seq,
        })
    }

    #[inline]
    fn free(&self, _ptr: u64, _size: u64, _stream: u64) -> torch_arena::Result<()> {
        Ok(())
    }

    fn reserved(&self) -> u64 {
        0
    }
}

/// One `Arena` per thread (thread `t` allocates on stream `t + 1`), each on its own simulated
/// device: what per-stream locking could reach at best, with nothing shared between streams (by
/// hand only, SIDE `shards`). With `shared_stats` (SIDE `shards-stats`), every malloc and free
/// also updates one block of counters behind one lock, with exact peaks, as device-wide
/// statistics shared by the streams would have to be (invariant 3): what that sharing costs.
/// BENCHMARKS.md, "Targets", has the figures.
struct Shards {
    arenas: Vec<Arena>,
    stats: Mutex<SharedStats>,
    shared_stats: bool,
}

/// Eight statistics' current, peak and count: the stand-in for `DeviceStats` in [`Shards`].
#[derive(Default)]
struct SharedStats {
    current: [i64; 8],
    peak: [i64; 8],
    count: [i64; 8],
}

impl Shards {
    fn arena(&self, stream: u64) -> &Arena {
        &self.arenas[(stream - 1) as usize]
    }

    fn count(&self, bytes: i64) {
        if !self.shared_stats {
            return;
        }
        let mut g = self.stats.lock().unwrap();
        for i in 0..8 {
            g.current[i] += bytes;
            g.peak[i] = g.peak[i].max(g.current[i]);
            g.count[i] += 1;
        }
    }
}

impl Resource for Shards {
    #[inline]
    fn alloc(&self, req: &Request) -> torch_arena::Result<Block> {
        let b = Resource::alloc(self.arena(req.stream), req)?;
        self.count(b.size as i64);
        Ok(b)
    }

    #[inline]
    fn free(&self, ptr: u64, size: u64, stream: u64) -> torch_arena::Result<()> {
        self.count(-(size as i64));
        Resource::free(self.arena(stream), ptr, size, stream)
    }

    fn reserved(&self) -> u64 {
        self.arenas
            .iter()
            .map(|a| a.stats().reserved_bytes.all().current as u64)
            .sum()
    }
}

/// The tracking modes `TORCH_ARENA_BENCH_TRACK` accepts.
const TRACK_MODES: [&str; 4] = ["off", "default", "python", "native"];

/// The tracking modes asked for (in `TRACK_MODES` order).
fn track_modes() -> Vec<&'static str> {
    let asked = std::env::var("TORCH_ARENA_BENCH_TRACK").unwrap_or_default();
    let asked: Vec<&str> = asked
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .collect();
    for m in &asked {
        if !TRACK_MODES.contains(m) {
            eprintln!(
                "pairs: TORCH_ARENA_BENCH_TRACK: unknown mode {m:?}; expected off, default, python or native"
            );
            std::process::exit(2);
        }
    }
    TRACK_MODES
        .into_iter()
        .filter(|m| asked.contains(m))
        .collect()
}

/// glibc malloc/free. The memory is never touched.
struct SystemAlloc;

impl Resource for SystemAlloc {
    #[inline]
    fn alloc(&self, req: &Request) -> torch_arena::Result<Block> {
        let size = req.size;
        // SAFETY: plain malloc; the pointer is only passed back to free.
        let p = unsafe { libc::malloc(size as usize) };
        if p.is_null() {
            let errno = std::io::Error::last_os_error();
            let maps = std::fs::read_to_string("/proc/self/maps").map_or_else(
                |_| "an unknown number of".into(),
                |m| m.lines().count().to_string(),
            );
            let limit = std::fs::read_to_string("/proc/sys/vm/max_map_count").unwrap_or_default();
            let vm = read_field("/proc/self/status", "VmSize").unwrap_or_default();
            return Err(torch_arena::Error::OutOfMemory(format!(
                "malloc({size}) returned NULL ({errno}) with {maps} mappings in the process \
                 (vm.max_map_count {}) and VmSize {vm}",
                limit.trim()
            )));
        }
        Ok(Block {
            ptr: p as u64,
            size,
            seq: 0,
        })
    }

    #[inline]
    fn free(&self, ptr: u64, _size: u64, _stream: u64) -> torch_arena::Result<()> {
        // SAFETY: `ptr` came from malloc above and is freed once.
        unsafe { libc::free(ptr as *mut libc::c_void) };
        Ok(())
    }

    fn reserved(&self) -> u64 {
        0
    }
}

/// No allocator at all: measures the harness itself (drawing nothing, only the live-set array
/// accesses and the loop), so its share of each figure is known.
struct NullAlloc;

impl Resource for NullAlloc {
    #[inline]
    fn alloc(&self, req: &Request) -> torch_arena::Result<Block> {
        Ok(Block {
            ptr: black_box(req.size),
            size: req.size,
            seq: 0,
        })
    }

    #[inline]
    fn free(&self, ptr: u64, _size: u64, _stream: u64) -> torch_arena::Result<()> {
        black_box(ptr);
        Ok(())
    }

    fn reserved(&self) -> u64 {
        0
    }
}

// ----- one measurement --------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Plan<'a> {
    mix: &'a Mix,
    live: usize,
    threads: usize,
    /// Every thread allocates on stream 1 (PyTorch's main and autograd threads on one device's
    /// current stream), not each on its own.
    one_stream: bool,
    pairs: usize,
    warmup: usize,
    batches: usize,
}

struct Measured {
    /// Wall time of each measured batch.
    batches: Vec<Duration>,
    fill: Duration,
    teardown: Duration,
    /// Change of the probe over the measured batches.
    probed: u64,
}

/// Fill, then time batches of pairs. On an allocation failure, everything allocated is freed
/// and the reason is returned.
/// `probe` is read just before the first and just after the last measured batch (driver calls).
/// `free_all`: free the live set one by one at the end (glibc; the others are simply dropped).
fn run<A: Resource + Sync>(
    a: &A,
    p: Plan,
    probe: &dyn Fn() -> u64,
    free_all: bool,
) -> Result<Measured, String> {
    let per_thread = p.live / p.threads;
    let barrier = Barrier::new(p.threads + 1);
    let failed = AtomicBool::new(false);
    let reason: Mutex<Option<String>> = Mutex::new(None);
    let fail = |why: String| {
        let mut r = reason.lock().unwrap();
        if r.is_none() {
            *r = Some(why);
        }
        failed.store(true, Ordering::SeqCst);
    };
    let rounds = p.warmup + p.batches;
    let mut times = Vec::with_capacity(rounds);
    let mut fill = Duration::ZERO;
    let mut teardown = Duration::ZERO;
    let mut probed = (0, 0);
    std::thread::scope(|scope| {
        for t in 0..p.threads {
            let (barrier, failed, fail) = (&barrier, &failed, &fail);
            scope.spawn(move || {
                let stream = if p.one_stream { 1 } else { t as u64 + 1 };
                let mut rng = SplitMix(SEED ^ (t as u64 + 1).wrapping_mul(0xa076_1d64_78bd_642f));
                let mut live: Vec<(u64, u64)> = Vec::with_capacity(per_thread);
                barrier.wait();
                for _ in 0..per_thread {
                    let size = p.mix.draw(&mut rng);
                    match alloc_one(a, size, stream) {
                        Ok(ptr) => live.push((ptr, size)),
                        Err(e) => {
                            fail(format!(
                                "{e} while filling, {} live in this thread",
                                live.len()
                            ));
                            break;
                        }
                    }
                }
                barrier.wait();
                let mut sizes = vec![0u64; p.pairs];
                let mut victims = vec![0u32; p.pairs];
                for _ in 0..rounds {
                    if failed.load(Ordering::SeqCst) {
                        break;
                    }
                    for (s, v) in sizes.iter_mut().zip(victims.iter_mut()) {
                        *s = p.mix.draw(&mut rng);
                        *v = rng.below(per_thread as u64) as u32;
                    }
                    barrier.wait();
                    for (i, (&size, &victim)) in sizes.iter().zip(&victims).enumerate() {
                        if let Some(&ahead) = victims.get(i + PREFETCH_AHEAD) {
                            prefetch(&live[ahead as usize]);
                        }
                        match alloc_one(a, black_box(size), stream) {
                            Ok(ptr) => {
                                let slot = &mut live[victim as usize];
                                let (old, old_size) = std::mem::replace(slot, (ptr, size));
                                free_one(a, black_box(old), old_size, stream);
                            }
                            Err(e) => {
                                fail(format!(
                                    "{e} during the pairs, {} live in this thread",
                                    live.len()
                                ));
                                break;
                            }
                        }
                    }
                    barrier.wait();
                }
                barrier.wait();
                if free_all {
                    for (ptr, size) in live.drain(..) {
                        free_one(a, ptr, size, stream);
                    }
                }
                barrier.wait();
            });
        }
        barrier.wait();
        let t0 = Instant::now();
        barrier.wait();
        fill = t0.elapsed();
        for round in 0..rounds {
            if failed.load(Ordering::SeqCst) {
                break;
            }
            if round == p.warmup {
                probed.0 = probe();
            }
            barrier.wait();
            let t = Instant::now();
            barrier.wait();
            times.push(t.elapsed());
        }
        probed.1 = probe();
        barrier.wait();
        let t = Instant::now();
        barrier.wait();
        teardown = t.elapsed();
    });
    if let Some(why) = reason.into_inner().unwrap() {
        return Err(why);
    }
    Ok(Measured {
        batches: times.split_off(p.warmup),
        fill,
        teardown,
        probed: probed.1 - probed.0,
    })
}

// ----- statistics -------------------------------------------------------------------------------

#[derive(Clone, Copy, Default)]
struct Spread {
    median: f64,
    p10: f64,
    p90: f64,
}

/// Nearest-rank percentiles of `ns` (must be non-empty).
fn spread(mut ns: Vec<f64>) -> Spread {
    ns.sort_by(f64::total_cmp);
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q).round() as usize];
    Spread {
        median: at(0.5),
        p10: at(0.1),
        p90: at(0.9),
    }
}

/// ns per pair over all threads (throughput cost) and per thread (latency).
fn figures(m: &Measured, p: &Plan) -> (Spread, Spread) {
    let ns = |d: &Duration, n: usize| d.as_nanos() as f64 / n as f64;
    let total = p.pairs * p.threads;
    (
        spread(m.batches.iter().map(|d| ns(d, total)).collect()),
        spread(m.batches.iter().map(|d| ns(d, p.pairs)).collect()),
    )
}

// ----- configurations ---------------------------------------------------------------------------

/// What one side (the arena, the system malloc, or the harness alone) measured in one
/// configuration, in the child process that ran it.
#[derive(Clone, Copy, Default)]
struct Side {
    pair: Spread,
    latency: Spread,
    fill_s: f64,
    /// Arena: dropping it (and the device) with everything live. System: freeing the live set.
    end_s: f64,
    /// cuMemMap + cuMemUnmap calls per pair over the measured batches (arena only).
    maps_per_pair: f64,
    pages_created: u64,
    reserved_end: i64,
    allocated_peak: i64,
    /// Peak resident memory of the child process.
    max_rss_kb: i64,
}

impl Side {
    fn encode(&self) -> String {
        let s = |x: &Spread| format!("{} {} {}", x.median, x.p10, x.p90);
        format!(
            "{} {} {} {} {} {} {} {} {}",
            s(&self.pair),
            s(&self.latency),
            self.fill_s,
            self.end_s,
            self.maps_per_pair,
            self.pages_created,
            self.reserved_end,
            self.allocated_peak,
            self.max_rss_kb
        )
    }

    fn decode(text: &str) -> Option<Side> {
        let v: Vec<f64> = text
            .split_whitespace()
            .map(|t| t.parse().ok())
            .collect::<Option<_>>()?;
        let sp = |i: usize| Spread {
            median: v[i],
            p10: v[i + 1],
            p90: v[i + 2],
        };
        (v.len() == 13).then(|| Side {
            pair: sp(0),
            latency: sp(3),
            fill_s: v[6],
            end_s: v[7],
            maps_per_pair: v[8],
            pages_created: v[9] as u64,
            reserved_end: v[10] as i64,
            allocated_peak: v[11] as i64,
            max_rss_kb: v[12] as i64,
        })
    }
}

struct Row {
    label: String,
    mix: &'static str,
    live: usize,
    threads: usize,
    pairs: usize,
    live_bytes_mean: f64,
    capacity: u64,
    arena: Result<Side, String>,
    system: Result<Side, String>,
    /// The harness alone (no allocator).
    harness: Result<Side, String>,
    /// `TORCH_ARENA_BENCH_TRACK`: the whole allocator layer per tracking mode.
    track: Vec<(&'static str, Result<Side, String>)>,
}

fn pairs_for(live: usize, scale: f64) -> usize {
    let base = if live >= 1_000_000 { 5_000 } else { 10_000 };
    ((base as f64 * scale) as usize).max(100)
}

/// Sim device capacity: 1.5 x the live set plus 64 GiB. The live set drifts as pairs replace its
/// members (one 8 GiB request in a hundred makes a 1k live set swing by tens of GiB), so "the
/// live set" is its expected size plus 8 standard deviations. The device is accounting-only, so
/// a generous capacity costs nothing, and the arena reuses idle pages before it creates new ones,
/// so the headroom does not change its hot path.
fn capacity_for(mix: &Mix, live: usize) -> u64 {
    let swing = 8.0 * mix.std_dev() * (live as f64).sqrt();
    let bytes = 1.5 * (live as f64 * mix.mean() + swing);
    (bytes as u64 + 64 * GIB).div_ceil(GRANULARITY) * GRANULARITY
}

/// An `Arena` with default settings on an accounting-only simulated device sized for `live`
/// allocations of `mix` (the arena side, and each of [`Shards`]).
fn sim_arena(mix: &Mix, live: usize) -> Result<(Arc<SimDevice>, Arena), String> {
    let dev = Arc::new(
        SimDevice::new(SimConfig::new(capacity_for(mix, live), GRANULARITY, false))
            .map_err(|e| format!("sim device: {e}"))?,
    );
    let arena = Arena::new(dev.clone() as Arc<dyn Device>, &Config::default())
        .map_err(|e| format!("arena: {e}"))?;
    Ok((dev, arena))
}

fn plan(mix: &Mix, live: usize, threads: usize, scale: f64) -> Plan<'_> {
    Plan {
        mix,
        live,
        threads,
        one_stream: false,
        pairs: pairs_for(live, scale),
        warmup: WARMUP_BATCHES,
        batches: MEASURED_BATCHES,
    }
}

fn max_rss_kb() -> i64 {
    // SAFETY: getrusage fills the struct we pass.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u.ru_maxrss
    }
}

/// Measure one side of one configuration (in a child process).
fn measure_side(
    mix: &Mix,
    live: usize,
    threads: usize,
    scale: f64,
    side: &str,
) -> Result<Side, String> {
    let mut plan = plan(mix, live, threads, scale);
    plan.one_stream = side == "arena-one-stream";
    let mut out = match side {
        "arena" | "arena-one-stream" => {
            let (dev, arena) = sim_arena(mix, live)?;
            let maps = || {
                let c: DriverCounters = dev.counters();
                c.mem_map + c.mem_unmap
            };
            let m = run(&arena, plan, &maps, false)?;
            let stats = arena.stats();
            let (pair, latency) = figures(&m, &plan);
            let mut side = Side {
                pair,
                latency,
                fill_s: m.fill.as_secs_f64(),
                maps_per_pair: m.probed as f64 / (plan.batches * plan.pairs * plan.threads) as f64,
                pages_created: dev.counters().mem_create,
                reserved_end: stats.reserved_bytes.all().current,
                allocated_peak: stats.allocated_bytes.all().peak,
                ..Side::default()
            };
            let t = Instant::now();
            drop(arena);
            drop(dev);
            side.end_s = t.elapsed().as_secs_f64();
            side
        }
        "shards" | "shards-stats" => {
            let arenas = (0..threads)
                .map(|_| Ok(sim_arena(mix, live)?.1))
                .collect::<Result<Vec<Arena>, String>>()?;
            let shards = Shards {
                arenas,
                stats: Mutex::new(SharedStats::default()),
                shared_stats: side == "shards-stats",
            };
            let m = run(&shards, plan, &|| 0, false)?;
            let (pair, latency) = figures(&m, &plan);
            Side {
                pair,
                latency,
                fill_s: m.fill.as_secs_f64(),
                ..Side::default()
            }
        }
        track if track.starts_with("track-") => {
            let mode = &track["track-".len()..];
            let sites = match mode {
                "off" | "default" => "none",
                "python" | "native" => mode,
                other => return Err(format!("unknown tracking mode {other:?}")),
            };
            let conf = Config::parse(&format!(
                "device:sim,sim_capacity_mb:{},sim_granularity_kb:{},sites:{sites}",
                capacity_for(mix, live) / MIB,
                GRANULARITY >> 10
            ))
            .map_err(|e| e.to_string())?;
            let tracker = if mode == "off" {
                Tracker::disabled()
            } else {
                Tracker::new(&conf)
            };
            let a = TrackedAlloc(TorchArena::with_tracker(conf, tracker));
            let m = run(&a, plan, &|| 0, false)?;
            let stats = a.0.stats(0).map_err(|e| e.to_string())?;
            let (pair, latency) = figures(&m, &plan);
            let mut side = Side {
                pair,
                latency,
                fill_s: m.fill.as_secs_f64(),
                reserved_end: stats.reserved_bytes.all().current,
                allocated_peak: stats.allocated_bytes.all().peak,
                ..Side::default()
            };
            let t = Instant::now();
            drop(a);
            side.end_s = t.elapsed().as_secs_f64();
            side
        }
        "tracker-only" => {
            let tracker = Tracker::new(&Config::default());
            let t = Tracked {
                inner: Counter::default(),
                tracker: &tracker,
                device: 0,
            };
            let m = run(&t, plan, &|| 0, false)?;
            let (pair, latency) = figures(&m, &plan);
            Side {
                pair,
                latency,
                ..Side::default()
            }
        }
        "system" => {
            let m = run(&SystemAlloc, plan, &|| 0, true)?;
            let (pair, latency) = figures(&m, &plan);
            Side {
                pair,
                latency,
                fill_s: m.fill.as_secs_f64(),
                end_s: m.teardown.as_secs_f64(),
                ..Side::default()
            }
        }
        "harness" => {
            let m = run(&NullAlloc, plan, &|| 0, false)?;
            let (pair, latency) = figures(&m, &plan);
            Side {
                pair,
                latency,
                ..Side::default()
            }
        }
        other => return Err(format!("unknown side {other:?}")),
    };
    out.max_rss_kb = max_rss_kb();
    Ok(out)
}

const CHILD_ENV: &str = "TORCH_ARENA_BENCH_CHILD";

/// This very binary: /proc/self/exe names it even if cargo rebuilds or removes the file while
/// the benchmark runs; elsewhere, the path it was started from.
fn this_exe() -> Result<PathBuf, String> {
    if Path::new("/proc/self/exe").exists() {
        Ok(PathBuf::from("/proc/self/exe"))
    } else {
        std::env::current_exe().map_err(|e| format!("current_exe: {e}"))
    }
}

/// Working sets of the memory-latency probe, in MiB.
const LATENCY_MIB: [usize; 6] = [1, 4, 16, 64, 256, 1024];

/// Dependent loads timed per working set.
const LATENCY_LOADS: usize = 2_000_000;

/// Nanoseconds per load when each load's address comes from the one before, through a random
/// cycle over every 64-byte line of `mib` MiB: what one cache (and TLB) miss into a structure
/// of that size costs on this machine. At 1M live allocations the arena's own tables are tens
/// of MiB to GiB, so this is the floor under what a pair can cost there (BENCHMARKS.md,
/// "Targets"), and it differs between the VMs the runs were taken on.
fn chase_ns(mib: usize) -> f64 {
    const LINE: usize = 8; // u64s per 64-byte line
    let lines = (mib << 20) / 64;
    let mut next = vec![0u64; lines * LINE];
    // Sattolo's shuffle: one cycle through every line, so no load is served by a short loop.
    let mut order: Vec<usize> = (0..lines).collect();
    let mut rng = SplitMix(SEED);
    for i in (1..lines).rev() {
        order.swap(i, rng.index(i));
    }
    for i in 0..lines {
        next[order[i] * LINE] = (order[(i + 1) % lines] * LINE) as u64;
    }
    let mut at = 0usize;
    let start = Instant::now();
    for _ in 0..LATENCY_LOADS {
        at = next[at] as usize;
    }
    let ns = start.elapsed().as_nanos() as f64 / LATENCY_LOADS as f64;
    black_box(at);
    ns
}

/// The latency probe in a fresh child (`TORCH_ARENA_BENCH_CHILD=latency`): `(MiB, ns)` per
/// working set.
fn spawn_latency() -> Result<Vec<(usize, f64)>, String> {
    let out = Command::new(this_exe()?)
        .env(CHILD_ENV, "latency")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start the child: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("LATENCY "))
        .ok_or_else(|| format!("the latency child printed no result ({})", out.status))?;
    line.split_whitespace()
        .map(|f| {
            let (mib, ns) = f.split_once(':')?;
            Some((mib.parse().ok()?, ns.parse().ok()?))
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| format!("unreadable latency result {line:?}"))
}

/// Run one side of one configuration in a fresh process, so that no side inherits another's
/// heap state (glibc's adaptive mmap threshold, fragmentation) or its resident memory.
fn spawn_side(mix: &Mix, live: usize, threads: usize, side: &str) -> Result<Side, String> {
    let out = Command::new(this_exe()?)
        .env(CHILD_ENV, format!("{}/{live}/{threads}/{side}", mix.name))
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start the child: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().rev().find(|l| l.starts_with("RESULT "));
    match last.and_then(|l| l.strip_prefix("RESULT ")) {
        Some(r) if r.starts_with("ok ") => {
            Side::decode(&r[3..]).ok_or_else(|| format!("unreadable child result {r:?}"))
        }
        Some(r) => Err(r.strip_prefix("err ").unwrap_or(r).to_string()),
        None => Err(format!("the child process died ({})", out.status)),
    }
}

fn child_main(spec: &str, mixes: &[&Mix], scale: f64) -> ! {
    if spec == "latency" {
        let figures: Vec<String> = LATENCY_MIB
            .iter()
            .map(|&mib| format!("{mib}:{:.1}", chase_ns(mib)))
            .collect();
        println!("LATENCY {}", figures.join(" "));
        std::process::exit(0);
    }
    let parts: Vec<&str> = spec.split('/').collect();
    let result = (|| {
        let [name, live, threads, side] = parts[..] else {
            return Err(format!("bad {CHILD_ENV} {spec:?}"));
        };
        let mix = mixes
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| format!("no mix {name:?}"))?;
        let live: usize = live.parse().map_err(|_| format!("bad live {live:?}"))?;
        let threads: usize = threads
            .parse()
            .map_err(|_| format!("bad threads {threads:?}"))?;
        let plan = plan(mix, live, threads, scale);
        let pairs = plan.pairs * plan.threads * (plan.warmup + plan.batches);
        Ok((measure_side(mix, live, threads, scale, side)?, pairs))
    })();
    match result {
        Ok((side, pairs)) => {
            // The pairs run after filling, warm-up included: what `bench/instructions` divides by.
            println!("PAIRS {pairs}");
            println!("RESULT ok {}", side.encode());
        }
        Err(e) => println!("RESULT err {}", e.replace('\n', " ")),
    }
    std::process::exit(0);
}

fn measure(mix: &Mix, live: usize, threads: usize, scale: f64, skip: &str) -> Row {
    let label = format!("{}/{}/{}t", mix.name, live, threads);
    let side = |name: &str| {
        if skip == name {
            return Err(format!("not run (TORCH_ARENA_BENCH_SKIP={name})"));
        }
        eprintln!("  {label} {name}: running");
        let r = spawn_side(mix, live, threads, name);
        if let Ok(s) = &r {
            eprintln!(
                "  {label} {name}: fill {:.2} s, end {:.2} s, max RSS {:.2} GiB",
                s.fill_s,
                s.end_s,
                s.max_rss_kb as f64 / (1 << 20) as f64
            );
        }
        r
    };
    let arena = side("arena");
    let system = side("system");
    let harness = side("harness");
    let track = track_modes()
        .into_iter()
        .map(|m| (m, side(&format!("track-{m}"))))
        .collect();
    Row {
        label,
        mix: mix.name,
        live,
        threads,
        pairs: pairs_for(live, scale),
        live_bytes_mean: live as f64 * mix.mean(),
        capacity: capacity_for(mix, live),
        arena,
        system,
        harness,
        track,
    }
}

const COLUMNS: [(&str, usize); 11] = [
    ("mix/live/threads", 22),
    ("arena p50", 9),
    ("p10-p90", 13),
    ("lat p50", 8),
    ("system p50", 10),
    ("p10-p90", 13),
    ("lat p50", 8),
    ("sys/arena", 9),
    ("harness", 7),
    ("fill s", 7),
    ("maps/pair", 9),
];

fn line(cells: &[String]) -> String {
    let mut out = String::new();
    for (i, (cell, (_, w))) in cells.iter().zip(COLUMNS).enumerate() {
        if i == 0 {
            let _ = write!(out, "{cell:<w$}");
        } else {
            let _ = write!(out, " {cell:>w$}");
        }
    }
    out
}

fn header() -> String {
    line(&COLUMNS.map(|(h, _)| h.to_string()))
}

fn table_line(r: &Row) -> String {
    let ns = |v: f64| format!("{v:.0}");
    let range = |s: &Spread| format!("{:.0}-{:.0}", s.p10, s.p90);
    let lat = |s: &Spread| {
        if r.threads > 1 {
            ns(s.median)
        } else {
            "-".to_string()
        }
    };
    let dash = || "-".to_string();
    let (a, ar, al, fill, maps) = match &r.arena {
        Ok(a) => (
            ns(a.pair.median),
            range(&a.pair),
            lat(&a.latency),
            format!("{:.2}", a.fill_s),
            format!("{:.3}", a.maps_per_pair),
        ),
        Err(_) => ("failed".into(), dash(), dash(), dash(), dash()),
    };
    let (s, sr, sl) = match &r.system {
        Ok(s) => (ns(s.pair.median), range(&s.pair), lat(&s.latency)),
        Err(_) => ("n/a".into(), dash(), dash()),
    };
    let ratio = match (&r.arena, &r.system) {
        (Ok(a), Ok(s)) => format!("{:.2}", s.pair.median / a.pair.median),
        _ => dash(),
    };
    line(&[
        r.label.clone(),
        a,
        ar,
        al,
        s,
        sr,
        sl,
        ratio,
        r.harness
            .as_ref()
            .map_or_else(|_| dash(), |h| ns(h.pair.median)),
        fill,
        maps,
    ])
}

/// The tracking sides of a row, one line: ns/pair per mode and the difference from `off`.
fn track_line(r: &Row) -> Option<String> {
    if r.track.is_empty() {
        return None;
    }
    let off = r
        .track
        .iter()
        .find(|(m, _)| *m == "off")
        .and_then(|(_, s)| s.as_ref().ok())
        .map(|s| s.pair.median);
    let cells: Vec<String> = r
        .track
        .iter()
        .map(|(m, s)| match s {
            Ok(s) => match off {
                Some(o) if *m != "off" => format!(
                    "{m} {:.0} ns ({:+.0}; p10-p90 {:.0}-{:.0})",
                    s.pair.median,
                    s.pair.median - o,
                    s.pair.p10,
                    s.pair.p90
                ),
                _ => format!(
                    "{m} {:.0} ns (p10-p90 {:.0}-{:.0})",
                    s.pair.median, s.pair.p10, s.pair.p90
                ),
            },
            Err(e) => format!("{m} failed: {e}"),
        })
        .collect();
    Some(format!("    {} tracking: {}", r.label, cells.join(", ")))
}

/// `s` as a JSON string literal (the library's escaper).
fn esc(s: &str) -> String {
    torch_arena::json::string(s)
}

fn spread_json(s: &Spread) -> String {
    format!(
        "{{\"median\": {:.1}, \"p10\": {:.1}, \"p90\": {:.1}}}",
        s.median, s.p10, s.p90
    )
}

fn side_json(r: &Result<Side, String>, arena: bool) -> String {
    let s = match r {
        Ok(s) => s,
        Err(e) => return format!("{{\"unavailable\": {}}}", esc(e)),
    };
    let mut o = format!(
        "{{\"ns_per_pair\": {}, \"per_thread_latency_ns\": {}, \"fill_s\": {:.3}, \
         \"max_rss_bytes\": {}",
        spread_json(&s.pair),
        spread_json(&s.latency),
        s.fill_s,
        s.max_rss_kb * 1024
    );
    if arena {
        let _ = write!(
            o,
            ", \"drop_s\": {:.3}, \"map_unmap_calls_per_pair\": {:.4}, \"pages_created\": {}, \
             \"reserved_bytes_end\": {}, \"allocated_bytes_peak\": {}",
            s.end_s, s.maps_per_pair, s.pages_created, s.reserved_end, s.allocated_peak
        );
    } else {
        let _ = write!(o, ", \"free_all_s\": {:.3}", s.end_s);
    }
    o.push('}');
    o
}

fn row_json(r: &Row) -> String {
    let ratio = match (&r.arena, &r.system) {
        (Ok(a), Ok(s)) => format!("{:.3}", s.pair.median / a.pair.median),
        _ => "null".into(),
    };
    let harness = match &r.harness {
        Ok(h) => spread_json(&h.pair),
        Err(e) => format!("{{\"unavailable\": {}}}", esc(e)),
    };
    let track = if r.track.is_empty() {
        String::new()
    } else {
        let sides: Vec<String> = r
            .track
            .iter()
            .map(|(m, s)| format!("{}: {}", esc(m), side_json(s, false)))
            .collect();
        format!(", \"tracking\": {{{}}}", sides.join(", "))
    };
    format!(
        "    {{\"config\": {}, \"mix\": {}, \"live\": {}, \"threads\": {}, \
         \"pairs_per_thread_per_batch\": {}, \"live_bytes_expected\": {:.0}, \
         \"sim_capacity_bytes\": {}, \"arena\": {}, \"system_malloc\": {}, \
         \"system_over_arena_median\": {ratio}, \"harness_ns_per_pair\": {harness}{track}}}",
        esc(&r.label),
        esc(r.mix),
        r.live,
        r.threads,
        r.pairs,
        r.live_bytes_mean,
        r.capacity,
        side_json(&r.arena, true),
        side_json(&r.system, false),
    )
}

fn sh(cmd: &str, args: &[&str], dir: &Path) -> Option<String> {
    let out = Command::new(cmd)
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn commit(dir: &Path) -> String {
    match sh("git", &["rev-parse", "--short", "HEAD"], dir) {
        Some(c) => {
            let dirty = sh("git", &["status", "--porcelain"], dir).is_some_and(|s| !s.is_empty());
            if dirty { format!("{c}-dirty") } else { c }
        }
        None => "unknown".into(),
    }
}

fn read_field(path: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// UTC `YYYY-MM-DD` and `YYYY-MM-DDTHH:MM:SSZ` for the current time.
fn utc_now() -> (String, String) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil-from-days (Howard Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    let date = format!("{y:04}-{m:02}-{d:02}");
    let stamp = format!(
        "{date}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    (date, stamp)
}

fn machine_json(dir: &Path) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let nproc = sh("nproc", &[], dir).unwrap_or_else(|| "unknown".into());
    let cpu = read_field("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown".into());
    let mem_kb = read_field("/proc/meminfo", "MemTotal")
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc = sh(&rustc, &["--version"], dir).unwrap_or_else(|| "unknown".into());
    let kernel = sh("uname", &["-r"], dir).unwrap_or_else(|| "unknown".into());
    // SAFETY: returns a static NUL-terminated string.
    let glibc = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) }
        .to_string_lossy()
        .into_owned();
    let max_map = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!(
        "{{\"hostname\": {}, \"nproc\": {}, \"cpu_model\": {}, \"memory_total_bytes\": {}, \
         \"rustc\": {}, \"kernel\": {}, \"glibc\": {}, \"vm_max_map_count\": {}}}",
        esc(&host),
        nproc
            .parse::<u64>()
            .map_or_else(|_| esc(&nproc), |n| n.to_string()),
        esc(&cpu),
        mem_kb * 1024,
        esc(&rustc),
        esc(&kernel),
        esc(&glibc),
        esc(&max_map)
    )
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mix_path = std::env::var_os("TORCH_ARENA_SIZE_MIX")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/size-mix.tsv"));
    let full = match Mix::load(&mix_path) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("pairs: {e}");
            std::process::exit(2);
        }
    };
    let only = std::env::var("TORCH_ARENA_BENCH_ONLY").ok();
    let scale: f64 = std::env::var("TORCH_ARENA_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let small = full
        .restrict("slab<=1MiB", |s| s <= MIB)
        .expect("the mix has sizes <= 1 MiB");
    let large = full
        .restrict("page>1MiB", |s| s > MIB)
        .expect("the mix has sizes > 1 MiB");
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child_main(&spec, &[&full, &small, &large], scale);
    }
    let skip = std::env::var("TORCH_ARENA_BENCH_SKIP").unwrap_or_default();

    let mut configs: Vec<(&Mix, usize, usize)> = Vec::new();
    for live in [1_000, 10_000, 100_000, 1_000_000] {
        for threads in [1, 4] {
            configs.push((&full, live, threads));
        }
    }
    for mix in [&small, &large] {
        for live in [1_000, 1_000_000] {
            configs.push((mix, live, 1));
        }
    }
    let configs: Vec<_> = configs
        .into_iter()
        .filter(|(m, l, t)| {
            only.as_deref()
                .is_none_or(|o| format!("{}/{}/{}t", m.name, l, t).contains(o))
        })
        .collect();

    let (date, stamp) = utc_now();
    // Both read when the benchmark starts, right after cargo built it from this tree.
    let commit = commit(&root);
    let dirty: Vec<String> = sh("git", &["status", "--porcelain"], &root)
        .unwrap_or_default()
        .lines()
        .map(|l| esc(l.trim()))
        .collect();
    if dirty
        .iter()
        .any(|l| l.contains(" src/") || l.contains(" cpp_shim/"))
    {
        println!("note: uncommitted changes under src/: the figures are of the working tree");
    }
    println!(
        "pairs: malloc+free pairs, size mix {} ({} sizes, {} distinct, mean {:.1} MiB; \
         <= 1 MiB: {:.1}% of requests), commit {commit}",
        mix_path.display(),
        full.total(),
        full.sizes.len(),
        full.mean() / MIB as f64,
        small.total() as f64 * 100.0 / full.total() as f64
    );
    println!(
        "{WARMUP_BATCHES} warm-up + {MEASURED_BATCHES} measured batches per configuration; \
         ns/pair = batch wall time / pairs of all threads; lat = per-thread latency (4 threads); \
         harness = the loop with no allocator; maps/pair = sim cuMemMap+cuMemUnmap per pair"
    );
    println!("{}", header());
    let started = Instant::now();
    let mut rows = Vec::new();
    for (mix, live, threads) in configs {
        let row = measure(mix, live, threads, scale, &skip);
        println!("{}", table_line(&row));
        if let Some(t) = track_line(&row) {
            println!("{t}");
        }
        for (who, e) in [
            ("arena", row.arena.as_ref().err()),
            ("system malloc", row.system.as_ref().err()),
            ("harness", row.harness.as_ref().err()),
        ] {
            if let Some(e) = e {
                println!("    {}: {who} unavailable: {e}", row.label);
            }
        }
        let _ = std::io::stdout().flush();
        rows.push(row);
    }
    let latency = spawn_latency();
    match &latency {
        Ok(l) => println!(
            "memory latency (ns per dependent load, by working set): {}",
            l.iter()
                .map(|(mib, ns)| format!("{mib} MiB {ns:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Err(e) => println!("memory latency unavailable: {e}"),
    }
    let total = started.elapsed();
    println!("total {:.1} s", total.as_secs_f64());

    if std::env::var_os("TORCH_ARENA_BENCH_NO_JSON").is_some() {
        return;
    }
    let partial = only.is_some() || scale != 1.0 || !skip.is_empty();
    let short = commit.trim_end_matches("-dirty");
    let dir = root.join("bench/results");
    // Never overwrite an earlier run: the second run of a day and commit gets `-2`, and so on.
    let tracking = !track_modes().is_empty();
    let stem = if tracking {
        format!("pairs-track-{date}-{short}")
    } else {
        format!(
            "pairs-{date}-{short}{}",
            if partial { "-partial" } else { "" }
        )
    };
    let name = (1..)
        .map(|n| match n {
            1 => format!("{stem}.json"),
            n => format!("{stem}-{n}.json"),
        })
        .find(|n| !dir.join(n).exists())
        .expect("some name is free");
    let mut json = String::new();
    let _ = writeln!(json, "{{");
    let _ = writeln!(json, "  \"benchmark\": \"pairs\",");
    let _ = writeln!(json, "  \"commit\": {},", esc(&commit));
    let _ = writeln!(json, "  \"dirty_files\": [{}],", dirty.join(", "));
    let _ = writeln!(json, "  \"date\": {},", esc(&stamp));
    let _ = writeln!(json, "  \"machine\": {},", machine_json(&root));
    let _ = writeln!(
        json,
        "  \"memory_latency_ns\": {},",
        match &latency {
            Ok(l) => format!(
                "{{\"what\": \"ns per dependent load through a random cycle over every 64-byte line \
                 of a working set, by its size in MiB\", {}}}",
                l.iter()
                    .map(|(mib, ns)| format!("\"{mib}\": {ns:.1}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Err(_) => "null".to_string(),
        }
    );
    let _ = writeln!(
        json,
        "  \"settings\": {{\"arena_config\": \"defaults (Config::default(): page_size_mb 2, stitch \
         True, release_idle_ms 0, memory_fraction 1.0)\", \"device\": \"SimDevice, backing false, \
         granularity {GRANULARITY}, capacity = 1.5 x (live x mean size + 8 x std dev x sqrt(live)) + \
         64 GiB\", \"size_mix\": \
         {}, \"size_mix_notes\": [{}], \"size_mix_requests\": {}, \"size_mix_distinct\": {}, \"size_mix_mean_bytes\": {:.0}, \
         \"warmup_batches\": {WARMUP_BATCHES}, \"measured_batches\": {MEASURED_BATCHES}, \
         \"pairs_scale\": {scale}, \"seed\": {SEED}, \"percentiles\": \"nearest rank over measured \
         batches\", \"pair\": \"malloc a size drawn from the mix, then free a uniformly random \
         live allocation of the same thread (replaced by the new one); each thread its own \
         stream (index + 1) and live set of live/threads\", \"ns_per_pair\": \"batch wall time / \
         pairs of all threads\", \"per_thread_latency_ns\": \"batch wall time / pairs per \
         thread\", \"system_malloc\": \"glibc malloc/free, same sizes and victims, memory never \
         touched\", \"harness\": \"sizes and victims drawn before each timed batch; the live-set \
         entry of the pair {PREFETCH_AHEAD} ahead is prefetched; harness_ns_per_pair = the same \
         loop with no allocator\", \"isolation\": \"each side of each configuration runs in a \
         fresh child process\", \"tracking\": {}, \"total_s\": {:.1}}},",
        esc(&mix_path.display().to_string()),
        full.notes
            .iter()
            .map(|n| esc(n))
            .collect::<Vec<_>>()
            .join(", "),
        full.total(),
        full.sizes.len(),
        full.mean(),
        if tracking {
            esc(&format!(
                "TORCH_ARENA_BENCH_TRACK={}: each mode runs the pairs through TorchArena::malloc/free \
                 (device 0, sim device of the same capacity and granularity); off = \
                 Tracker::disabled(), default = live table only, python = sites:python with no \
                 Python interpreter in the process (measures the skip only), native = \
                 sites:native (libc backtrace per allocation); ns_per_pair as for the arena; \
                 partial run: {partial}",
                track_modes().join(",")
            ))
        } else {
            "null".to_string()
        },
        total.as_secs_f64()
    );
    let _ = writeln!(json, "  \"rows\": [");
    let body: Vec<String> = rows.iter().map(row_json).collect();
    let _ = writeln!(json, "{}", body.join(",\n"));
    let _ = writeln!(json, "  ]");
    let _ = writeln!(json, "}}");
    if let Err(e) =
        std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(dir.join(&name), json))
    {
        eprintln!("pairs: cannot write {}: {e}", dir.join(&name).display());
        std::process::exit(1);
    }
    println!("results: {}", dir.join(&name).display());
}
