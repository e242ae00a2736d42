//! Private pools (CUDA graph capture) on the arena over the sim device, which models capture:
//! unit scenarios for each PyTorch semantic, and a property test mixing pool and general
//! traffic under the overlap oracle.

use std::sync::Arc;

use torch_arena::arena::Arena;
use torch_arena::config::Config;
use torch_arena::device::Device;
use torch_arena::device::sim::{SimConfig, SimDevice};

const MIB: u64 = 1 << 20;
const PAGE: u64 = 2 * MIB;

fn rig(capacity_mb: u64) -> (Arc<SimDevice>, Arena) {
    rig_with(capacity_mb, &Config::default())
}

fn rig_with(capacity_mb: u64, conf: &Config) -> (Arc<SimDevice>, Arena) {
    let dev = Arc::new(SimDevice::new(SimConfig::new(capacity_mb * MIB, PAGE, true)).unwrap());
    let arena = Arena::new(dev.clone() as Arc<dyn Device>, conf).unwrap();
    (dev, arena)
}

#[test]
fn a_released_pool_gives_everything_back_at_empty_cache() {
    let (dev, arena) = rig(256);
    let pool = (2, 0);
    arena.begin_pool(pool).unwrap();
    dev.begin_capture(7).unwrap();
    let a = arena.malloc_pool(5 * MIB, 7, pool).unwrap();
    let b = arena.malloc_pool(4096, 7, pool).unwrap();
    arena.free(b, None, 7).unwrap();
    let g = dev.end_capture(7).unwrap();
    arena.end_pool(pool).unwrap();
    arena.release_pool(pool).unwrap();
    dev.destroy_graph(g);
    arena.free(a, None, 7).unwrap();
    arena.empty_cache().unwrap();
    arena.check_consistency().unwrap();
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
    assert_eq!(arena.pool_info(pool), None);
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
}

// ---------------------------------------------------------------------------------------------
// The property test: random pool and general traffic, captures, replays, releases and reclaims,
// on host-backed sim pages, under an overlap oracle.

use proptest::prelude::*;
use std::collections::HashMap;

use torch_arena::device::StreamId;

/// Streams 1..=4; 0 is left to PyTorch's legacy default stream, which cannot capture.
const STREAMS: u64 = 4;
const POOLS: u64 = 3;

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        size: u64,
        stream: u64,
    },
    Free {
        pick: usize,
    },
    /// A kernel over a live block on its stream (captured if the stream is capturing).
    Launch {
        pick: usize,
    },
    /// `torch.cuda.graph` enter: begin the pool (shared if it is live), then the capture.
    Begin {
        pool: u64,
        stream: u64,
    },
    End {
        pick: usize,
    },
    Replay {
        pick: usize,
        stream: u64,
    },
    /// A graph's reset: release its pool, then destroy it.
    Release {
        pick: usize,
    },
    Complete {
        stream: u64,
    },
    EmptyCache,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let stream = 1..=STREAMS;
    prop_oneof![
        6 => (prop_oneof![1u64..4096, 4096u64..(1 << 20), (1u64 << 20)..(12 << 20)], stream.clone())
            .prop_map(|(size, stream)| Op::Alloc { size, stream }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        2 => any::<usize>().prop_map(|pick| Op::Launch { pick }),
        1 => (0..POOLS, stream.clone()).prop_map(|(pool, stream)| Op::Begin { pool, stream }),
        1 => any::<usize>().prop_map(|pick| Op::End { pick }),
        1 => (any::<usize>(), stream.clone()).prop_map(|(pick, stream)| Op::Replay { pick, stream }),
        1 => any::<usize>().prop_map(|pick| Op::Release { pick }),
        1 => stream.prop_map(|stream| Op::Complete { stream }),
        1 => Just(Op::EmptyCache),
    ]
}

#[derive(Clone, Debug)]
struct Block {
    ptr: u64,
    size: u64,
    stream: StreamId,
    tag: u64,
    /// The pool it came from (pool index), or None.
    pool: Option<u64>,
    /// Captures (by pool) whose kernels used this block though it is not of their pool (a
    /// graph's static input): the user keeps it alive while a graph of that pool lives, as
    /// PyTorch requires.
    input_of: Vec<u64>,
    /// Streams a graph using this block as an input was replayed on: its free names them with
    /// record_stream, as PyTorch requires of a tensor used on another stream.
    used_on: Vec<StreamId>,
}

fn pool_id(p: u64) -> (u64, u64) {
    (p + 1, 0)
}

struct Model {
    dev: Arc<SimDevice>,
    arena: Arena,
    live: Vec<Block>,
    /// Pool memory freed while its pool lives: a replay may still use it.
    shadow: Vec<Block>,
    /// Recording captures: stream -> pool.
    capturing: HashMap<StreamId, u64>,
    /// Graphs captured and not reset: (graph, pool).
    graphs: Vec<(u64, u64)>,
    /// Uses of each pool (captures begun and not released).
    uses: HashMap<u64, u32>,
    tag: u64,
}

fn overlaps(a: &Block, ptr: u64, size: u64) -> bool {
    a.ptr < ptr + size && ptr < a.ptr + a.size
}

fn write(b: &Block) {
    // SAFETY: host-backed sim memory of a live block, device VA == host VA.
    unsafe {
        std::ptr::write_unaligned(b.ptr as *mut u64, b.tag);
        if b.size >= 16 {
            std::ptr::write_unaligned((b.ptr + b.size - 8) as *mut u64, !b.tag);
        }
    }
}

fn intact(b: &Block) -> bool {
    // SAFETY: as in `write`; the memory stays mapped while the block (or its pool) lives.
    unsafe {
        std::ptr::read_unaligned(b.ptr as *const u64) == b.tag
            && (b.size < 16
                || std::ptr::read_unaligned((b.ptr + b.size - 8) as *const u64) == !b.tag)
    }
}

impl Model {
    fn new(conf: &Config) -> Model {
        let (dev, arena) = rig_with(192, conf);
        Model {
            dev,
            arena,
            live: Vec::new(),
            shadow: Vec::new(),
            capturing: HashMap::new(),
            graphs: Vec::new(),
            uses: HashMap::new(),
            tag: 1,
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Alloc { size, stream } => {
                let size = size.max(8);
                let pool = self.capturing.get(&stream).copied();
                let r = match pool {
                    Some(p) => self.arena.malloc_pool(size, stream, pool_id(p)),
                    None => self.arena.malloc(size, stream),
                };
                let ptr = match r {
                    Ok(p) => p,
                    Err(torch_arena::error::Error::OutOfMemory(_)) => return Ok(()),
                    Err(e) => return Err(format!("alloc({size}) on {stream}: {e}")),
                };
                if self.arena.pool_of(ptr) != pool.map(pool_id) {
                    return Err(format!(
                        "{ptr:#x} ({size} bytes on stream {stream}) is in pool {:?}, expected {:?}",
                        self.arena.pool_of(ptr),
                        pool.map(pool_id)
                    ));
                }
                for b in &self.live {
                    if overlaps(b, ptr, size) {
                        return Err(format!("{ptr:#x}+{size} overlaps live {b:?}"));
                    }
                }
                for b in &self.shadow {
                    if overlaps(b, ptr, size) && pool != b.pool {
                        return Err(format!(
                            "{ptr:#x}+{size} (pool {pool:?}) takes memory of pool {:?} that a \
                             replay may still use: {b:?}",
                            b.pool
                        ));
                    }
                }
                self.shadow.retain(|b| !overlaps(b, ptr, size));
                if pool.is_none() {
                    // General memory: no other stream's unfinished work (replays included) on it.
                    let busy = self.dev.busy_overlapping(ptr, size);
                    if let Some(u) = busy.iter().find(|u| u.0 != stream) {
                        return Err(format!(
                            "{ptr:#x}+{size} on stream {stream} overlaps unfinished work {u:?}"
                        ));
                    }
                }
                self.tag += 1;
                let b = Block {
                    ptr,
                    size,
                    stream,
                    tag: self.tag,
                    pool,
                    input_of: Vec::new(),
                    used_on: Vec::new(),
                };
                write(&b);
                self.live.push(b);
            }
            Op::Free { pick } => {
                if self.live.is_empty() {
                    return Ok(());
                }
                let at = pick % self.live.len();
                let graph_input = self.live[at].input_of.iter().any(|&p| {
                    self.uses.get(&p).is_some_and(|&u| u > 0)
                        || self.capturing.values().any(|&c| c == p)
                });
                if graph_input {
                    return self.check();
                }
                let b = self.live.swap_remove(at);
                for &r in &b.used_on {
                    self.arena
                        .record_stream(b.ptr, r)
                        .map_err(|e| e.to_string())?;
                }
                self.arena
                    .free(b.ptr, Some(b.size), b.stream)
                    .map_err(|e| e.to_string())?;
                // Graph memory while a graph of its pool may replay.
                if b.pool
                    .is_some_and(|p| self.uses.get(&p).is_some_and(|&u| u > 0))
                {
                    self.shadow.push(b);
                }
            }
            Op::Launch { pick } => {
                let n = self.live.len().max(1);
                if let Some(b) = self.live.get_mut(pick % n) {
                    if let Some(&p) = self.capturing.get(&b.stream)
                        && b.pool != Some(p)
                    {
                        b.input_of.push(p);
                    }
                    self.dev.launch(b.stream, b.ptr, b.size);
                }
            }
            Op::Begin { pool, stream } => {
                let recording = self.capturing.values().any(|&p| p == pool);
                if recording || self.capturing.contains_key(&stream) {
                    return Ok(());
                }
                // A pool id is shared only while live; once released it is not begun again
                // (PyTorch's ids are fresh per graph), except by a shared handle we model here.
                self.arena
                    .begin_pool(pool_id(pool))
                    .map_err(|e| e.to_string())?;
                self.dev.begin_capture(stream).map_err(|e| e.to_string())?;
                self.capturing.insert(stream, pool);
                *self.uses.entry(pool).or_default() += 1;
            }
            Op::End { pick } => {
                let mut streams: Vec<_> = self.capturing.keys().copied().collect();
                if streams.is_empty() {
                    return Ok(());
                }
                streams.sort_unstable();
                let s = streams[pick % streams.len()];
                let pool = self.capturing.remove(&s).expect("listed");
                let g = self.dev.end_capture(s).map_err(|e| e.to_string())?;
                self.arena
                    .end_pool(pool_id(pool))
                    .map_err(|e| e.to_string())?;
                self.graphs.push((g, pool));
            }
            Op::Replay { pick, stream } => {
                if self.graphs.is_empty() || self.capturing.contains_key(&stream) {
                    return Ok(());
                }
                let (g, pool) = self.graphs[pick % self.graphs.len()];
                self.dev.replay(g, stream);
                for b in self.live.iter_mut().filter(|b| b.input_of.contains(&pool)) {
                    if !b.used_on.contains(&stream) {
                        b.used_on.push(stream);
                    }
                }
            }
            Op::Release { pick } => {
                if self.graphs.is_empty() {
                    return Ok(());
                }
                let (g, pool) = self.graphs.remove(pick % self.graphs.len());
                // CUDAGraph::reset: releasePool, then the graph is destroyed (it may still run).
                self.arena
                    .release_pool(pool_id(pool))
                    .map_err(|e| e.to_string())?;
                self.dev.destroy_graph(g);
                let uses = self.uses.get_mut(&pool).expect("begun");
                *uses -= 1;
                if *uses == 0 {
                    self.shadow.retain(|b| b.pool != Some(pool));
                }
            }
            Op::Complete { stream } => self.dev.complete(stream),
            Op::EmptyCache => {
                self.arena.empty_cache().map_err(|e| e.to_string())?;
            }
        }
        self.check()
    }

    fn check(&self) -> Result<(), String> {
        for b in self.live.iter().chain(&self.shadow) {
            if !self.dev.is_mapped(b.ptr, b.size) {
                return Err(format!("the memory of {b:?} is no longer mapped"));
            }
            if !intact(b) {
                return Err(format!("the bytes of {b:?} changed"));
            }
        }
        let v = self.dev.violations();
        if !v.is_empty() {
            return Err(format!("device violations: {v:?}"));
        }
        self.arena.check_consistency()?;
        let reserved = self.arena.stats().reserved_bytes.all().current as u64;
        if reserved != self.dev.used_bytes() {
            return Err(format!(
                "reserved_bytes {reserved} but the device holds {}",
                self.dev.used_bytes()
            ));
        }
        Ok(())
    }

    /// End every capture, reset every graph, free everything, let the GPU finish, empty the
    /// cache: nothing may be held.
    fn drain(mut self) -> Result<(), String> {
        let streams: Vec<_> = self.capturing.keys().copied().collect();
        for s in streams {
            self.apply(&Op::End { pick: 0 })?;
            let _ = s;
        }
        while !self.graphs.is_empty() {
            self.apply(&Op::Release { pick: 0 })?;
        }
        while !self.live.is_empty() {
            self.apply(&Op::Free { pick: 0 })?;
        }
        self.dev.complete_all();
        self.arena.empty_cache().map_err(|e| e.to_string())?;
        self.check()?;
        for p in 0..POOLS {
            if let Some(info) = self.arena.pool_info(pool_id(p)) {
                return Err(format!("pool {p} still here after its release: {info:?}"));
            }
        }
        let reserved = self.arena.stats().reserved_bytes.all().current;
        if reserved != 0 {
            return Err(format!("{reserved} bytes reserved after draining"));
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Pool and general traffic mixed with captures (several pools, pools shared by later
    /// captures), replays on any stream, releases while replays may run, and empty_cache: live
    /// blocks never overlap and keep their bytes; memory a pool handed out is taken by nothing
    /// else until its last release; no general block lands on another stream's unfinished work;
    /// nothing a live graph uses is unmapped or released and nothing stream-ordered reaches a
    /// capturing stream (the sim's violations); the arena stays consistent and gives
    /// everything back at the end.
    #[test]
    fn pools_and_general_traffic_never_overlap(ops in prop::collection::vec(op_strategy(), 1..200)) {
        let mut m = Model::new(&Config::default());
        for (i, op) in ops.iter().enumerate() {
            let before = (m.dev.counters(), m.dev.mapped_pages(), m.live.len(), m.shadow.len());
            m.apply(op).map_err(|e| TestCaseError::fail(format!("op {i} {op:?}: {e}; before {before:?} after {:?}", (m.dev.counters(), m.dev.mapped_pages(), m.live.len(), m.shadow.len()))))?;
        }
        m.drain().map_err(TestCaseError::fail)?;
    }

    /// The same with physical handles of 4 pages (`handle_mb:8`), which large blocks map whole.
    #[test]
    fn pools_with_multi_page_handles_never_overlap(ops in prop::collection::vec(op_strategy(), 1..160)) {
        let conf = Config::parse("handle_mb:8").unwrap();
        let mut m = Model::new(&conf);
        for (i, op) in ops.iter().enumerate() {
            m.apply(op).map_err(|e| TestCaseError::fail(format!("op {i} {op:?}: {e}")))?;
        }
        m.drain().map_err(TestCaseError::fail)?;
    }
}

/// A filter that accepted just before another thread ended the pool: the allocation is not part
/// of the capture (it ended first) and gets general memory, not an error.
#[test]
fn an_allocation_routed_to_an_ended_pool_gets_general_memory() {
    let (_dev, arena) = rig(64);
    let pool = (3, 0);
    arena.begin_pool(pool).unwrap();
    let a = arena.malloc_pool(4096, 5, pool).unwrap();
    assert_eq!(arena.pool_of(a), Some(pool));
    arena.end_pool(pool).unwrap();
    let b = arena.malloc_pool(4096, 5, pool).unwrap();
    assert_eq!(arena.pool_of(b), None);
    assert!(
        arena.begin_pool(pool).is_ok(),
        "a later capture may share the pool"
    );
    assert!(arena.begin_pool(pool).is_err(), "but not while it records");
    arena.end_pool(pool).unwrap();
    arena.release_pool(pool).unwrap();
    arena.release_pool(pool).unwrap();
    assert!(
        arena.release_pool(pool).is_err(),
        "released more often than begun"
    );
    arena.free(a, None, 5).unwrap();
    arena.free(b, None, 5).unwrap();
    arena.empty_cache().unwrap();
    assert_eq!(arena.pool_info(pool), None);
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
}

/// A private pool keeps its pages until it is released, so it grows by exactly what its blocks
/// need: no growth steps, even after general traffic made steps large.
#[test]
fn a_private_pool_grows_by_exactly_what_it_needs() {
    let (dev, arena) = rig(2048);
    // General medium traffic first: enough growth in steps that a step would be many pages.
    let general: Vec<u64> = (0..60).map(|_| arena.malloc(3 * MIB, 0).unwrap()).collect();
    let pool = (4, 0);
    arena.begin_pool(pool).unwrap();
    dev.begin_capture(9).unwrap();
    // 5 MiB blocks of 3 pages each, and small requests: their slabs' pages.
    let pooled: Vec<u64> = (0..6)
        .flat_map(|_| {
            [
                arena.malloc_pool(5 * MIB, 9, pool).unwrap(),
                arena.malloc_pool(4096, 9, pool).unwrap(),
            ]
        })
        .collect();
    let info = arena.pool_info(pool).unwrap();
    assert_eq!(
        info.mapped_pages, info.used_pages,
        "a private pool maps no page it does not use: {info:?}"
    );
    let g = dev.end_capture(9).unwrap();
    arena.end_pool(pool).unwrap();
    for p in pooled {
        arena.free(p, None, 9).unwrap();
    }
    arena.release_pool(pool).unwrap();
    dev.destroy_graph(g);
    for p in general {
        arena.free(p, None, 0).unwrap();
    }
    arena.empty_cache().unwrap();
    arena.check_consistency().unwrap();
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
}

/// Pools released while another pool records: their pages wait for a device-wide
/// synchronisation, which may not run during the capture. General memory idle on a stream that
/// is not capturing needs none (that stream is synchronised on its own) and is used; the
/// out-of-memory message names the released pools' bytes apart from what is cached, and what
/// frees them; once the capture ends they are used (issue 37, item 4).
#[test]
fn released_pools_wait_for_the_capture_and_the_message_says_so() {
    use torch_arena::stats::summary::format_size;
    let (dev, arena) = rig(4096);
    // 1 GiB of general memory on stream 1, used by work still queued there, then freed.
    let general = arena.malloc(1 << 30, 1).unwrap();
    dev.launch(1, general, 1 << 30);
    arena.free(general, None, 1).unwrap();
    // 100 graphs of 24 MiB each, captured on stream 7, released and destroyed.
    for i in 1..=100u64 {
        let pool = (i, 0);
        arena.begin_pool(pool).unwrap();
        dev.begin_capture(7).unwrap();
        let a = arena.malloc_pool(24 * MIB, 7, pool).unwrap();
        arena.free(a, None, 7).unwrap();
        let g = dev.end_capture(7).unwrap();
        arena.end_pool(pool).unwrap();
        arena.release_pool(pool).unwrap();
        dev.destroy_graph(g);
    }
    // Another capture is under way on stream 8.
    let other = (1000, 0);
    arena.begin_pool(other).unwrap();
    dev.begin_capture(8).unwrap();
    // 1.5 GiB on stream 2: the free device and stream 1's idle gigabyte (synchronised alone).
    let big = arena.malloc(3 << 29, 2).unwrap();
    // 1 GiB more: only the released pools' 2.34 GiB would do, and no synchronisation may prove
    // them unused now.
    let e = arena.malloc(1 << 30, 2).unwrap_err().to_string();
    let released = format_size(100 * 24 * MIB);
    assert!(
        e.contains(&format!(
            "{released} in 100 released private pool(s) (CUDA graphs) awaiting a synchronisation"
        )),
        "{e}"
    );
    assert!(
        e.contains("none may run while a CUDA graph capture is under way"),
        "{e}"
    );
    assert!(
        e.contains("cached (0 bytes in idle mapped pages"),
        "the released pools' pages are not cached: {e}"
    );
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    // The capture ends: the same request synchronises the device and gets their pages.
    let g = dev.end_capture(8).unwrap();
    arena.end_pool(other).unwrap();
    let more = arena.malloc(1 << 30, 2).unwrap();
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    arena.free(more, None, 2).unwrap();
    arena.free(big, None, 2).unwrap();
    arena.release_pool(other).unwrap();
    dev.destroy_graph(g);
    arena.empty_cache().unwrap();
    arena.check_consistency().unwrap();
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
}

/// A pool that recorded with no capture (`use_mem_pool`, inductor's warm-up) holds
/// stream-ordered memory: once released, its stream's fence proves its pages unused, with no
/// device-wide synchronisation, so they serve other streams while another pool records.
#[test]
fn a_released_pool_that_never_captured_is_usable_during_another_capture() {
    let (dev, arena) = rig(1024);
    let pool = (5, 0);
    arena.begin_pool(pool).unwrap();
    let blocks: Vec<u64> = (0..3)
        .map(|_| arena.malloc_pool(200 * MIB, 3, pool).unwrap())
        .collect();
    for &b in &blocks {
        dev.launch(3, b, 200 * MIB);
    }
    for b in blocks {
        arena.free(b, None, 3).unwrap();
    }
    arena.end_pool(pool).unwrap();
    arena.release_pool(pool).unwrap();
    // A capture into another pool is under way on stream 8.
    let other = (6, 0);
    arena.begin_pool(other).unwrap();
    dev.begin_capture(8).unwrap();
    // 700 MiB on stream 2: only with the released pool's 600 MiB (stream 3 synchronised alone).
    let big = arena.malloc(700 * MIB, 2).unwrap();
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    // What it needed left the pool: stream 3's shard gave its cache back to the driver when
    // stream 2's ran out (streams have shards of their own; with them the pool, empty, is gone).
    let left = arena.pool_info(pool).map_or(0, |p| p.mapped_pages);
    assert!(
        left <= 300 - 138,
        "{left} of the pool's 300 pages still mapped"
    );
    // A pool that did serve a capture still waits for the device-wide synchronisation.
    let captured = (7, 0);
    arena.begin_pool(captured).unwrap();
    dev.begin_capture(9).unwrap();
    let c = arena.malloc_pool(200 * MIB, 9, captured).unwrap();
    arena.free(c, None, 9).unwrap();
    let g = dev.end_capture(9).unwrap();
    arena.end_pool(captured).unwrap();
    arena.release_pool(captured).unwrap();
    arena.free(big, None, 2).unwrap();
    let e = arena.malloc(900 * MIB, 2).unwrap_err().to_string();
    assert!(
        e.contains("200.00 MiB in 1 released private pool(s) (CUDA graphs) awaiting"),
        "{e}"
    );
    let g8 = dev.end_capture(8).unwrap();
    arena.end_pool(other).unwrap();
    arena.release_pool(other).unwrap();
    let again = arena.malloc(900 * MIB, 2).unwrap();
    assert!(dev.violations().is_empty(), "{:?}", dev.violations());
    arena.free(again, None, 2).unwrap();
    dev.destroy_graph(g);
    dev.destroy_graph(g8);
    arena.empty_cache().unwrap();
    arena.check_consistency().unwrap();
    assert_eq!(arena.stats().reserved_bytes.all().current, 0);
}
