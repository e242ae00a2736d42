//! The arena of one device: how bytes are handed out.
//!
//! - Requests ≤ 1 MiB take a slot of a size class (`size_class.rs`) in a slab (`slab.rs`) of
//!   whole 64 KiB chunks (from 64 KiB to 4 pages). Slabs of one stream pack next to each other in
//!   its small-pool heap, so slabs of different classes share physical pages; a page stays mapped
//!   while any slab on it lives. Each class fills its *current* slab, then the fullest partial
//!   slab, so emptier slabs drain and dissolve, and a page whose last slab dissolves goes idle.
//! - Larger requests take a 512-byte-granular block from a best-fit, coalescing heap of virtual
//!   addresses (`heap.rs`). Physical pages are mapped under a block only where none is mapped yet;
//!   any free physical page can back any new range (stitching), so free memory is never stranded
//!   by address-space fragmentation. Medium sizes pack next to each other instead of each rounding
//!   up to whole pages; freed blocks keep their pages mapped, so the next request of the same size
//!   reuses them with no driver call.
//! - At the limit, idle pages of a mapping that a live block pins (a mapping is unmapped only
//!   whole) are lent: mapped a second time where the request goes, held by a placeholder where
//!   they were until the borrowing mapping is unmapped (`handles.rs`, `lend_idle`).
//! - Each stream owns its heaps and slabs: memory freed on stream S is reused at once only by S.
//!   Physical pages move to another stream (or back to the driver) only once an event recorded on
//!   S after the free has completed. Frees of allocations used on other streams (`record_stream`)
//!   wait for events on those streams first.
//!
//! Files, one concern each (the types and the state behind each shard's lock are declared here,
//! the arena's public methods are in `api.rs`, and the rest is `impl Inner`):
//! - `shared.rs`: what the shards (one per stream) share: the limit's count, which shard serves
//!   a stream, the device's peaks;
//! - `alloc.rs`: the entry of every allocation: the state lookup, the size pre-check, one try;
//! - `ladder.rs`: the out-of-memory ladder, and reclaiming (`empty_cache`, `defragment`, memory
//!   fraction, decay);
//! - `small.rs`: size-class slabs; `large.rs`: block placement in a stream's address heap;
//! - `pages.rs`: regions, acquiring/mapping/unmapping pages (their records: `page_table.rs`);
//!   `idle.rs`: page users and the idle lists; `handles.rs`: the pool of physical handles and
//!   lending at the limit;
//! - `growth.rs`: how much a miss creates past what it needs (steps, spare pages, growth ahead),
//!   with the constants that size it; `growth_cost.rs`: its modelled cost against native's;
//! - `free.rs`: frees, pending frees (record_stream) and pointer lookups;
//! - `streams.rs`: the stream index and the retirement of idle streams;
//! - `capture.rs`: private pools (CUDA graph capture): their states, pinned pages, release, and
//!   what the arena must not do while a stream is captured (the pools' records: `pool.rs`);
//! - `accounting.rs`: every update of the statistics, derived statistics and summary extras;
//!   `check.rs`: consistency checks;
//! - `heap.rs` (with its `size_index.rs`), `slab.rs`, `size_class.rs`, `int_map.rs`, `layout.rs`:
//!   the data structures and the layout report those use (the other reports are
//!   `stats::report`'s).
//!
//! Invariants (each has a test):
//! 1. No two live allocations overlap; every live allocation lies in pages that stay mapped.
//! 2. A page freed on stream S is unmapped, remapped or released only after S's work queued
//!    before the free has completed.
//! 3. `stats` is exact: allocated = Σ live block sizes, requested = Σ live request sizes,
//!    reserved = physical bytes held.
//! 4. Nothing here scans all allocations: every operation is O(log n) in live allocations, but
//!    for the out-of-memory ladder's last resort (lending walks the free ranges and their pages)
//!    and the out-of-memory message.
//! 5. A physical page is mapped at two addresses only while lent, and then no block lies on it
//!    where it was lent from (a placeholder holds it there).
//! 6. The bytes all shards hold stay within the limit, and the device's statistics (3) hold for
//!    the sum of the shards', with peaks the highest totals at request boundaries.

mod accounting;
mod alloc;
mod api;
mod capture;
mod check;
mod free;
mod growth;
mod growth_cost;
mod handles;
mod heap;
mod idle;
mod int_map;
mod ladder;
mod large;
pub mod layout;
mod page_table;
mod pages;
#[cfg(test)]
mod peaks_model;
mod pool;
mod shared;
mod size_class;
mod size_index;
mod slab;
mod small;
mod streams;
mod views;

pub use crate::block::{Block, PoolId};
pub use crate::stats::report::*;
pub use crate::stats::summary::format_size;
pub use pool::PoolInfo;
pub use size_class::{CHUNK, MAX_SMALL, MIN_BLOCK, SizeClass, SizeClasses};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::Config;
use crate::device::{
    DevPtr, Device, DeviceError, DeviceInfo, EventHandle, PageHandle, Piece, StreamId,
};
use crate::error::{Error, PointerFault, Result};
use crate::ptr_table::{PtrTable, Vacant};
use crate::stats::{DeviceStats, Pool};
use heap::{Fit, Heap};
use int_map::IntMap;
use page_table::{Lend, PageRef, PageSlot, PieceKey, Region, Run, Split};
pub use shared::last_number;
use shared::{SHARDS, Shared};
use slab::Slab;

/// Fill-order buckets per class: a slab with `used` of `slots` sits in bucket `used * 8 / slots`.
const BUCKETS: usize = 8;
/// Virtual bytes reserved per VMM region (larger requests get a region of their own). Each region
/// keeps a page table entry per page, so this bounds host memory per region (16,384 entries).
const MAX_REGION: u64 = 32 << 30;
const NO_SLAB: u32 = u32::MAX;

/// One device's arena: a shard per stream (up to eight, then streams share them),
/// each with all its state behind its own lock, and what they share (`shared.rs`). Driver calls
/// happen under a shard's lock, but only on cache misses.
pub struct Arena {
    shards: Box<[Shard]>,
    shared: Arc<Shared>,
}

/// One shard, on cache lines of its own (two: adjacent-line prefetch pairs them), so that two
/// shards' locks never share one.
#[repr(align(128))]
struct Shard {
    inner: Mutex<Inner>,
}

/// A live block of the large pool.
#[derive(Clone, Copy, Debug)]
struct LargeBlock {
    len: u64,
    requested: u64,
    stream: u32,
    region: u32,
    /// Its node in its stream's large heap (what finishing its free gives back).
    node: u32,
    /// Freed by the client, waiting for events on the streams it was used on.
    pending: bool,
}

/// An unused entry of the live-block table links the next through its `node`.
impl Vacant for LargeBlock {
    fn vacant(next: u32) -> Self {
        LargeBlock {
            len: 0,
            requested: 0,
            stream: 0,
            region: 0,
            node: next,
            pending: false,
        }
    }
    fn next_vacant(&self) -> u32 {
        self.node
    }
}

#[derive(Debug, Default)]
struct ClassState {
    current: Option<u32>,
    buckets: [Vec<u32>; BUCKETS],
}

/// What one stream owns.
#[derive(Debug)]
struct StreamState {
    id: StreamId,
    small: Heap,
    large: Heap,
    classes: Vec<ClassState>,
    /// An event re-recorded on this stream whenever pages idle since `fence_seq` need proving safe.
    fence: Option<EventHandle>,
    fence_seq: u64,
    /// Every page this stream made idle at or before this stamp is no longer used by the GPU.
    safe_seq: u64,
    /// This stream's idle pages, oldest first (stamps rise from head to tail). Per stream, so a
    /// stream reuses its own idle pages before taking another's, and so the first page its fence
    /// does not cover ends the search: every later one is newer.
    idle_head: PageRef,
    idle_tail: PageRef,
    /// The regions this stream owns (a handful).
    regions: Vec<u32>,
    /// When this stream last made a request (`Inner::tick`).
    last_used: u64,
    /// A slot given back by a stream that went idle, waiting for reuse.
    retired: bool,
    /// The private pool (CUDA graph capture) this state belongs to, keyed by `(pool, id)`; `None`
    /// for a stream's general memory.
    pool: Option<PoolId>,
    /// A pool's state before its release: its pages stay mapped where they are (never on the
    /// idle list, never unmapped, stitched away or released) and it is never retired.
    pinned: bool,
    /// A pool's state that served an allocation while its stream was being captured (or when
    /// that could not be told): its memory may be in a graph, which may replay on any stream,
    /// so once released only a device-wide synchronisation proves its pages unused. A pool's
    /// state that never did (`use_mem_pool`, inductor's warm-up: a pool recording with no
    /// capture) holds stream-ordered memory, proven by its stream's fence like any other.
    captured: bool,
}

impl StreamState {
    /// The state of stream `id` (of private pool `pool`, if any) with `classes` size classes and
    /// nothing else yet: no heaps, regions or pages.
    fn new(id: StreamId, classes: usize, last_used: u64, pool: Option<PoolId>) -> StreamState {
        StreamState {
            id,
            small: Heap::new(),
            large: Heap::new(),
            classes: (0..classes).map(|_| ClassState::default()).collect(),
            fence: None,
            fence_seq: 0,
            safe_seq: 0,
            idle_head: PageRef::NONE,
            idle_tail: PageRef::NONE,
            regions: Vec::new(),
            last_used,
            retired: false,
            pool,
            pinned: pool.is_some(),
            captured: false,
        }
    }

    /// An empty slot: no heaps, no regions, no classes.
    fn retired() -> StreamState {
        StreamState {
            retired: true,
            ..StreamState::new(0, 0, 0, None)
        }
    }
}

/// An allocation freed by the client whose memory other streams may still use.
#[derive(Debug)]
struct Pending {
    ptr: u64,
    events: Vec<EventHandle>,
    /// Streams still to record an event on: they were being captured at the free (an event
    /// recorded there would be a graph node), so the record waits until they are not (as
    /// PyTorch defers it until no capture is under way); or a driver call failed while
    /// recording on them, and the record is tried again at the next poll.
    waiting: Vec<StreamId>,
}

/// Where a live allocation's metadata is.
#[derive(Clone, Copy, Debug)]
enum Found {
    Small { id: u32, slot: usize },
    Large,
}

impl Found {
    fn pool(self) -> Pool {
        match self {
            Found::Small { .. } => Pool::Small,
            Found::Large => Pool::Large,
        }
    }
}

/// The steps of the out-of-memory ladder, in order: each frees more than the one before.
#[derive(Clone, Copy)]
enum Escalation {
    /// Wait for every stream: pending frees finish and every idle page may move.
    SynchronizeAll,
    /// Release every cached page (and retire idle streams) to the driver.
    ReleaseCached,
}

/// How a handle created for a block's last run may also cover the free pages after it.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// A medium block: within the ramp, and at least this many pages with the run.
    Medium(u32),
    /// A large block that drifted or grows for layout (`Inner::large_step`): up to this many
    /// spare pages, within the budget of handles with spare pages.
    Spare(u32),
    /// A large block that grows ahead at a new peak (`Inner::ahead_spare`): up to this many spare
    /// pages, outside that budget.
    Ahead(u32),
}

/// What a handle created for a run (`Inner::acquire`) may cover past it, as `Inner::back_run`
/// sized it.
#[derive(Clone, Copy, Debug)]
struct Extra {
    /// Spare pages past the run, at most.
    spare: u32,
    /// The run could have had spare pages: what is created counts as grown in steps
    /// (`Inner::grown_pages`).
    stepping: bool,
    /// A handle with spare pages is recorded in `Inner::shared_handles`, within their budget
    /// (all but growth ahead, whose handles count as a large block's: `Inner::on_large_handle`).
    shared: bool,
    /// The run's first (last) page is a boundary page of its block, shared with a neighbour:
    /// created as a one-page handle of its own ([`LARGE_HANDLE_SHARE`]).
    first_apart: bool,
    last_apart: bool,
    /// Whole handles only (the small pool: its reserved bytes and segments move between the
    /// pools a handle at a time, `Inner::move_reserved`, so it maps no piece of one).
    whole: bool,
    /// Where an idle mapping would be moved, it may be mapped here as well (a view): a large-pool
    /// region of a stream that is not a private pool's, with `views:True` (views.rs).
    view: bool,
}

/// A large block's boundary pages that another block may come to share (it starts or ends
/// inside them), to be backed by one-page handles of their own when the block's handle would be
/// large ([`LARGE_HANDLE_SHARE`]; `Inner::back_run`).
#[derive(Clone, Copy, Debug, Default)]
struct Apart {
    first: Option<u32>,
    last: Option<u32>,
}

/// Why an attempt failed.
enum Miss {
    /// No physical memory within the limit: the caller may flush caches and retry.
    NoMemory,
    Device(DeviceError),
}

impl From<DeviceError> for Miss {
    fn from(e: DeviceError) -> Self {
        match e {
            DeviceError::OutOfMemory => Miss::NoMemory,
            e => Miss::Device(e),
        }
    }
}

struct Inner {
    dev: Arc<dyn Device>,
    info: DeviceInfo,
    page: u64,
    /// `log2(page)` where the page is a power of two (2 MiB on every CUDA GPU), else 0: a page
    /// index is then a shift, not a 64-bit division, on the hot path (`page_of`).
    page_shift: u32,
    vmm: bool,
    stitch: bool,
    release_idle: Option<Duration>,
    /// Most bytes of physical memory we may hold.
    limit: u64,
    /// The memory fraction the limit came from (1.0 unless one was set).
    fraction: f64,
    /// Virtual bytes reserved per VMM region.
    region_len: u64,
    classes: SizeClasses,
    /// Requests up to this size take slab slots; larger ones take heap blocks (`slab_max_kb`).
    slab_max: u64,
    streams: Vec<StreamState>,
    stream_index: IntMap<StreamId, u32>,
    /// The stream of the previous request and its index: a one-entry cache in front of
    /// `stream_index` (an `Option`, so no stream handle, `(void*)-1` included, is a sentinel).
    last_stream: Option<(StreamId, u32)>,
    /// Stream slots given back by streams that went idle and empty, for reuse.
    free_streams: Vec<u32>,
    /// Region slots given back (reservations freed), for reuse.
    free_regions: Vec<u32>,
    /// Requests served so far: the clock of `StreamState::last_used`.
    tick: u64,
    /// Blocks handed out so far (`Block::seq`).
    allocs: u64,
    regions: Vec<Region>,
    /// `(base, region)` sorted by base, for pointer lookup.
    region_by_addr: Vec<(u64, u32)>,
    slabs: Vec<Slab>,
    free_slab_ids: Vec<u32>,
    /// Live large blocks by address (an open-addressing table, at most half full: the hot path
    /// only ever asks for an exact address; an interior pointer, asked for by `record_stream` or
    /// `base_alloc` only, scans them).
    large: PtrTable<LargeBlock, 2>,
    /// Extra streams named by `record_stream`, per live allocation.
    recorded: IntMap<u64, Vec<StreamId>>,
    pending: VecDeque<Pending>,
    pending_ptrs: IntMap<u64, ()>,
    spare_events: Vec<EventHandle>,
    /// Physical handles created and mapped nowhere, whole, by their length in pages, with the
    /// time each became free: what may be released.
    pool: BTreeMap<u32, Vec<(PageHandle, Instant)>>,
    /// Pieces of split handles mapped nowhere, by their length in pages: usable anywhere, but
    /// released only once the whole handle is back (`Inner::pool_put` joins it into `pool`).
    parts: BTreeMap<u32, Vec<Run>>,
    /// Handles mapped (or pooled) in more than one piece (`Run`), by handle.
    split: IntMap<u64, Split>,
    /// Pages in `pool` and `parts`.
    pooled_pages: u64,
    /// Mappings of lent pages, by the address they are mapped at ([`Lend`]).
    lends: IntMap<u64, Lend>,
    /// Lent pieces acquired for a run and not yet mapped, by handle and offset.
    lending: HashMap<(u64, u32), Lend>,
    /// Every stream has been synchronised for the request being served (the out-of-memory
    /// ladder's first step, outside any capture): idle pages may be lent.
    lend_ok: bool,
    /// The driver refused a second mapping of lent pages once: no more lending.
    lend_refused: bool,
    /// Pages lent (mapped twice): counted in use where they were lent from and where they are.
    lent_pages: u64,
    /// `views:True`: at the limit, a moved idle mapping stays mapped where it was too (`views.rs`).
    views_on: bool,
    /// Pieces mapped at two or more places (views.rs): each piece's views, by their heads.
    views: HashMap<PieceKey, Vec<PageRef>>,
    /// Views acquired for a run and not yet mapped: by handle and offset, the view each copies.
    viewing: HashMap<(u64, u32), PageRef>,
    /// Pages mapped as views beyond each piece's first: what the page tables count twice.
    view_pages: u64,
    /// Handles created with spare pages (growth steps, `Inner::back_run`), mapped or pooled, by
    /// their length in pages; and their pages in all, at most 1/[`SPARE_LIMIT_SHARE`] of the limit.
    shared_handles: IntMap<u64, u32>,
    shared_pages: u64,
    /// Pages created in growth steps so far: a step's spare is at most 1/[`GROWTH_SHARE`] of it.
    grown_pages: u64,
    /// Lengths of large blocks (from [`MEDIUM_BYTES`]) that needed new pages, with where the last
    /// such block of each went and when (`tick`): what `Inner::drifted` compares a block that
    /// needs pages with. At most [`GROWN_LENGTHS_KEPT`], then forgotten all at once.
    grown_lengths: IntMap<u64, (u64, u64)>,
    /// The peak of `stats.requested_bytes` before the last `reset_peak_memory_stats`: with the
    /// stats' own peak, the most bytes ever requested at once (`Inner::requested_high`), kept
    /// off the malloc path.
    requested_high: u64,
    /// The bytes of the request being served (`Inner::malloc`): `count_growth` weighs what it
    /// does to the bytes requested, which count it only once it is served.
    serving: u64,
    /// Physical memory created so far, by what its request did to the bytes requested.
    growth: GrowthCounts,
    /// Modelled driver time of that growth, and what native's would have cost
    /// (`accounting.rs`): whether a block at a new peak grows ahead.
    growth_time: growth_cost::GrowthTime,
    /// Pages of the handles on all streams' idle lists.
    idle_len: u64,
    /// Pages of a large handle: 1/[`LARGE_HANDLE_SHARE`] of the limit, at least 2 (`large_pages`;
    /// set with the limit, read on the malloc path by `Inner::strands`).
    large_pages: u32,
    /// Handles on the idle lists of at least `large_pages` pages: none, and no placement needs to
    /// ask whether it would strand one (`Inner::guards_large_handles`).
    idle_large: u64,
    /// Most pages per physical handle created for large blocks (`handle_mb` over the page size;
    /// with `handle_mb:0`, as many as a handle holds).
    handle_pages: u32,
    /// The step in which the large pool grows ([`GROWTH_BYTES`] in pages).
    growth_pages: u32,
    /// The least a step covers ([`GROWTH_FLOOR_BYTES`] in pages, at least one).
    growth_floor_pages: u32,
    /// When the arena started: the origin of `PageSlot::idle_since`.
    epoch: Instant,
    seq: u64,
    stats: DeviceStats,
    /// Statistics (bits in the order of [`DeviceStats::currents`]) that may have risen since
    /// they were last published to the device's peaks (`shared::Peaks::request_ended`), so that
    /// the publication need not compare all 29: set by `accounting.rs` before a malloc while
    /// several shards serve (`malloc_raises`), where it counts a handle, and where it derives the
    /// inactive-split figures and one rises (on every path: the branch that raises them is
    /// there already).
    rising: u32,
    /// Pages holding live data per pool, for the inactive-split figures.
    in_use_pages: [u64; 3],
    /// Active bytes by where their blocks are (slabs: `Pool::Small`; the page heap:
    /// `Pool::Large`), for the inactive-split figures. The statistics count a block in the pool
    /// of its request's size instead (`accounting::counted_pool`), as PyTorch does.
    active_at: [i64; 3],
    partial_slabs: i64,
    /// Large-pool pages holding live data and free bytes.
    partial_pages: i64,
    nonempty_slab_bytes: u64,
    bad_frees: u64,
    last_decay: Instant,
    /// Private pools by id (`pool.rs`).
    pools: HashMap<PoolId, pool::PoolEntry>,
    /// The state of each `(pool, stream)` that allocated in a pool.
    pool_states: HashMap<(PoolId, StreamId), u32>,
    /// Pools between `begin_pool` and `end_pool`: while any is, a capture may be under way.
    recording_pools: u32,
    /// What this arena's shards share (`shared.rs`).
    shared: Arc<Shared>,
    /// This shard's index in its arena.
    shard: usize,
}

fn limit_for(total: u64, fraction: f64, page: u64) -> u64 {
    let bytes = (total as f64 * fraction.clamp(0.0, 1.0)) as u64;
    bytes / page * page
}

#[inline]
fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// An arena state that should be impossible, reported rather than panicked on.
fn internal(what: String) -> Error {
    Error::Device(DeviceError::Misuse(format!(
        "torch-arena internal error: {what}"
    )))
}

#[inline]
fn partial(used: u32, slots: u32) -> i64 {
    (used > 0 && used < slots) as i64
}

#[inline]
fn bucket_of(used: u32, slots: u32) -> u8 {
    ((used as u64 * BUCKETS as u64) / slots as u64).min(BUCKETS as u64 - 1) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `PageSlot`'s doc promises: one cache line per page visited.
    #[test]
    fn a_page_slot_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<PageSlot>(), 64);
        assert_eq!(std::mem::align_of::<PageSlot>(), 64);
    }

    /// A slot counts a page's covered bytes in 32 bits, so a page over 1 GiB (a `Config` built
    /// in code: the parser has the same bound) is refused by name.
    #[test]
    fn a_page_over_1_gib_is_refused() {
        use crate::device::sim::{SimConfig, SimDevice};
        let dev = Arc::new(SimDevice::new(SimConfig::new(16 << 30, 2 << 20, false)).unwrap());
        for mb in [0, 2048] {
            let conf = Config {
                page_size_mb: mb,
                ..Config::default()
            };
            let e = Arena::new(dev.clone(), &conf)
                .err()
                .expect("refused")
                .to_string();
            assert!(
                e.contains(&format!(
                    "page_size_mb:{mb} is out of range: expected 1 to 1024"
                )),
                "{e}"
            );
        }
    }
}
