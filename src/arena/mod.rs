//! The arena of one device: how bytes are handed out.
//!
//! - Requests ≤ 1 MiB take a slot of a size class ([`size_class`]) in a slab ([`slab`]) of
//!   whole 64 KiB chunks (from 64 KiB to 4 pages). Slabs of one stream pack next to each other in
//!   its small-pool heap, so slabs of different classes share physical pages; a page stays mapped
//!   while any slab on it lives. Each class fills its *current* slab, then the fullest partial
//!   slab, so emptier slabs drain and dissolve, and a page whose last slab dissolves goes idle.
//! - Larger requests take a 512-byte-granular block from a best-fit, coalescing heap of virtual
//!   addresses ([`heap`]). Physical pages are mapped under a block only where none is mapped yet;
//!   any free physical page can back any new range (stitching), so free memory is never stranded
//!   by address-space fragmentation. Medium sizes pack next to each other instead of each rounding
//!   up to whole pages; freed blocks keep their pages mapped, so the next request of the same size
//!   reuses them with no driver call.
//! - At the limit, idle pages of a mapping that a live block pins (a mapping is unmapped only
//!   whole) are lent: mapped a second time where the request goes, held by a placeholder where
//!   they were until the borrowing mapping is unmapped (`pages.rs`, `lend_idle`).
//! - Each stream owns its heaps and slabs: memory freed on stream S is reused at once only by S.
//!   Physical pages move to another stream (or back to the driver) only once an event recorded on
//!   S after the free has completed. Frees of allocations used on other streams (`record_stream`)
//!   wait for events on those streams first.
//!
//! Files, one concern each (all `impl Inner`, the state behind the arena's lock, declared here):
//! - `ladder.rs`: the entry of every allocation, the size pre-check and the out-of-memory ladder,
//!   and reclaiming (`empty_cache`, `defragment`, memory fraction, decay);
//! - `small.rs`: size-class slabs; `large.rs`: block placement in a stream's address heap;
//! - `pages.rs`: regions, page tables, idle lists, acquiring/mapping/unmapping pages;
//! - `growth.rs`: how much a miss creates past what it needs (steps, spare pages, growth ahead);
//! - `free.rs`: frees, pending frees (record_stream) and pointer lookups;
//! - `streams.rs`: the stream index and the retirement of idle streams;
//! - `pool.rs`: private pools (CUDA graph capture): their states, pinned pages, release, and
//!   what the arena must not do while a stream is captured;
//! - `accounting.rs`: derived statistics and summary extras; `check.rs`: consistency checks;
//! - `heap.rs` (with its `size_index.rs`), `slab.rs`, `size_class.rs`, `layout.rs`: the data
//!   structures and the layout report those use (the other reports are `stats::report`'s).
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

mod accounting;
mod check;
mod free;
mod growth;
mod heap;
mod ladder;
mod large;
mod layout;
mod pages;
mod pool;
mod size_class;
mod size_index;
mod slab;
mod small;
mod streams;

pub use crate::stats::report::*;
pub use crate::stats::summary::format_size;
pub use layout::{BlockState, Layout, LayoutBlock, LayoutSegment, layout_json};
pub use pool::{PoolId, PoolInfo};
pub use size_class::{CHUNK, MAX_SMALL, MIN_BLOCK, SizeClass, SizeClasses};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
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
use slab::Slab;

/// Fill-order buckets per class: a slab with `used` of `slots` sits in bucket `used * 8 / slots`.
const BUCKETS: usize = 8;
/// Free blocks a large request weighs: the best fits by size, of which it takes the one needing
/// the fewest newly mapped pages (a map costs tens of microseconds; reading a page slot does not).
const PLACEMENT_CANDIDATES: usize = 8;
/// Size of the plain (non-VMM) segments that medium requests are packed into, as PyTorch does.
const PLAIN_MEDIUM_SEGMENT: u64 = 20 << 20;
/// Virtual bytes reserved per VMM region (larger requests get a region of their own). Each region
/// keeps a page table entry per page, so this bounds host memory per region (16,384 entries).
const MAX_REGION: u64 = 32 << 30;
const NO_SLAB: u32 = u32::MAX;
/// Blocks under `MEDIUM_BYTES` (PyTorch's `kLargeBuffer`, the 20 MiB segment it packs 1–10 MiB
/// requests into) grow the arena in steps: where the addresses after a medium block's last new
/// run are free, the handle created for it also covers up to `GROWTH_BYTES` in all, so that the
/// next medium blocks placed there need no create. A step is at most 1/`GROWTH_SHARE` of the
/// pages created in steps so far, so that a workload that grows by few medium blocks (whatever
/// its large blocks) is not rounded up, and one that grows by many soon gets whole steps; what a
/// step leaves unused at the peak is at most one step. Handles created with spare pages hold at
/// most 1/`SPARE_LIMIT_SHARE` of the limit in all: such a handle may come to serve several blocks
/// and cannot move while any of them lives, and memory must stay free to move (the adversarial
/// trace runs out of memory when a quarter of the limit is in shared handles).
///
/// Whatever the ramp allows, the step of a block under `FLOOR_BELOW_BYTES` (PyTorch's
/// `kMinLargeAlloc`: it packs those into 20 MiB segments, and gives larger ones their size)
/// covers at least `GROWTH_FLOOR_BYTES`, block and spare together, within the same budget: a
/// workload that holds little would otherwise grow by the page where PyTorch's first segment
/// serves all its medium requests. 16 MiB was measured against 12, 14, 18 and 20 MiB on the
/// shared traces (BENCHMARKS.md, "Growth steps, measured").
const MEDIUM_BYTES: u64 = 20 << 20;
const GROWTH_BYTES: u64 = 64 << 20;
const GROWTH_FLOOR_BYTES: u64 = 16 << 20;
const FLOOR_BELOW_BYTES: u64 = 10 << 20;
const GROWTH_SHARE: u64 = 12;
const SPARE_LIMIT_SHARE: u64 = 8;
/// The small pool grows by up to this many pages at a time, within the same budget (a slab page
/// is shared by slabs of every class, so the next slabs soon need the next pages; one create for
/// four pages instead of four), and by at most 1/`SMALL_GROWTH_SHARE` of what is reserved (whole
/// steps once 2 GiB of 2 MiB pages is held): what a step leaves unused is then a small share of
/// what is held, and a workload that holds little grows by the page, as PyTorch's 2 MiB small
/// segments do. It steps only while the workload climbs (the request takes the bytes requested
/// to a new peak) or while the arena's growth costs more than native's would, as a large block
/// grows ahead (`Inner::small_step`): below the peak the small pool grows by the page, for the
/// step's unused pages would stay unused at the peak (five traces held 2 to 4 MiB over native's
/// peak so, two of which this keeps under it; BENCHMARKS.md, "Variants at 965c407").
const SMALL_GROWTH_PAGES: u32 = 4;
const SMALL_GROWTH_SHARE: u64 = 256;
/// The current slab of a class stays when its last slot is freed, ready for the class's next
/// request, unless it spans this much or more: classes of large slots (from 128 KiB) have slabs
/// of 1 to 3 MiB, and kept empty they hold long stretches of the small pool that slabs of other
/// classes then cannot use (from 2 MiB, a page, they dissolved before). The GPU suite's steps
/// workload grew the small pool in its 25th step so (on the H200, 2026-11-27), holding 16 MiB
/// with under 6 MiB allocated; at 2 MiB (a page, as before) the lab makes the same growth from
/// the run's recording, at 1 MiB none, and no shared trace's counts move (BENCHMARKS.md, "Nearby
/// orders").
const DISSOLVE_EMPTY_SPAN: u64 = 1 << 20;
/// A large block (from [`MEDIUM_BYTES`]) that needs new pages although a block of its length
/// needed them before, at least `DRIFT_AFTER_REQUESTS` requests ago and at a lower address, and
/// is gone from there, has *drifted*: the blocks before it took some of its old place, as they
/// do when blocks live across steps, so that each step starts from different free ranges. In a
/// workload whose shapes recur the drift goes on, by less each time, and each time the block
/// needs pages past those mapped before (the GPU suite's steps workload grew so in the fifth
/// pass of its cycle of shapes, on an H200 too). So the handle created for a drifted block also
/// covers up to 1/`DRIFT_SPARE_SHARE` of the block's length in free pages after it, within the
/// budget of handles with spare pages, and the next shifts land on mapped pages. A block that
/// grows again soon after its length did is taken for a run of blocks, as a model being built
/// or layers' outputs, and gets no spare. Measured at 1/2, 1/4, 1/8 and 1/16 and after 0, 2,000,
/// 5,000, 10,000 and 20,000 requests (BENCHMARKS.md, "Drift"): 1/8 is the least spare that
/// serves the steps workload's drift, and from 5,000 to 10,000 requests no shared trace crosses
/// a target.
const DRIFT_AFTER_REQUESTS: u64 = 5_000;
const DRIFT_SPARE_SHARE: u64 = 8;
/// A large block that needs new pages while the bytes requested stay under their peak so far
/// (it does not take them to a new one) grows the arena because of where blocks lie, not because
/// more is asked: blocks that live across steps land in different places from one step to the
/// next, so each step starts from different free ranges, and the highest block of a step lands
/// a little higher in one step than in another. Such growth comes back, a little further each
/// time. So its handle also covers up to 1/`LAYOUT_SPARE_SHARE` of the block's length in free
/// pages after it, as long as the bytes reserved stay within 1/`LAYOUT_HEADROOM_SHARE` of the peak
/// requested: the 5 % fragmentation the targets allow (PyTorch's allocator ran at 5.6 %
/// over the GPU suite's steps workload). Measured on perturbed orders of the GPU recordings at
/// 1/1, 1/2 and 1/4 of the length and 1/16, 1/20 and 1/24 of the peak (BENCHMARKS.md, "Nearby
/// orders"): 1/2 and 1/20 take the runs of one shape that grow after warm-up from 34 and 35 of
/// 40 to 12 and 6, with no shared trace crossing a target; the whole length costs two traces
/// their peak, and 1/16 two their fragmentation.
const LAYOUT_SPARE_SHARE: u64 = 2;
const LAYOUT_HEADROOM_SHARE: u64 = 20;
/// A large block that needs new pages for a new peak of the bytes requested, while the arena's
/// growth so far has cost more modelled driver time than PyTorch's allocator would have spent on
/// the same requests (`accounting::GrowthTime`), and whose own handle would cost more than a
/// cudaMalloc of it (under about 360 MiB at the H200's prices), *grows ahead*: its handle also
/// covers up to `AHEAD_BYTES` of free pages after it, and at most 1/`AHEAD_SHARE` of what is
/// reserved, for the next blocks of the climb. A climb to the peak (activations kept for
/// backward, a forward pass's outputs) then takes fewer, larger handles; what the last step
/// leaves unused at the peak is at most one spare, a share of what is held; and once the growth
/// costs less than native's, the arena grows by what is asked again and keeps the bytes.
/// Measured at 16 to 128 MiB and 1/32 to 1/256, with and without the share, and with blocks up
/// to 128 MiB, 360 MiB and any length (BENCHMARKS.md, "Growing ahead"): of the variants that
/// cost at most one shared trace its peak, 48 MiB and 1/128 put the most traces within every
/// target of the driver-call issue (81 of 142); a fixed 32 MiB puts 89 there but costs two
/// more their peak (Yiyi-philosophy `1.3b`, a second bolongcheng).
const AHEAD_BYTES: u64 = 48 << 20;
const AHEAD_SHARE: u64 = 128;
/// Lengths remembered for drift (`Inner::grown_lengths`): a bound on host memory (24 bytes each
/// and the table's overhead) whatever the number of distinct lengths a workload grows by.
const GROWN_LENGTHS_KEPT: usize = 4_096;
/// A physical handle created for large blocks holds at most 1/`HEADROOM_SHARE` of what the limit
/// leaves (`Inner::back_run`).
const HEADROOM_SHARE: u64 = 8;
/// A handle is *large* when it holds at least 1/`LARGE_HANDLE_SHARE` of the limit (2.5 GiB of
/// 80 GiB). A handle moves only whole, so one page of it in use keeps all of it where it is:
/// - a block that starts or ends inside a page it would share with a neighbour, and whose
///   handle would be large, gets that page as a handle of its own (`Inner::acquire`), so that
///   the neighbour holds one page, not the block's whole handle, once the block is freed;
/// - while the limit leaves room for a block, it is not placed on part of an idle large handle
///   when that would leave more of the handle unusable than the block uses, if another fit
///   exists (`Inner::place_large`, `Inner::place_medium`): it grows instead, and the handle
///   stays whole for a block of its size.
///
/// Without these, sungdk0822 `dmodel128_seqlen16384` (8 GiB blocks with 64 MiB ones between
/// them) ran out of memory on a 52 GiB device with 48.6 GiB requested, 7.9 GiB held unused in
/// handles its neighbours pinned; with them it fits in 48.7 GiB, and at 80 GiB it reserves that
/// instead of 56.5 GiB. Measured at 1/16, 1/32, 1/64 and 1/128 of the limit (BENCHMARKS.md,
/// "Large handles near the limit"): 1/16 and 1/32 move the same trace and no other; at 1/64
/// and 1/128 one more (`xl_fwd_cl2048` float32) reserves 120 MiB more, over native's peak.
const LARGE_HANDLE_SHARE: u64 = 32;

/// Pages of a large handle under `limit` ([`LARGE_HANDLE_SHARE`]), at least 2.
fn large_pages(limit: u64, page: u64) -> u32 {
    (limit / page / LARGE_HANDLE_SHARE).clamp(2, u32::MAX as u64) as u32
}
/// Streams kept without question. Past this many, a new stream first retires streams that hold
/// nothing and made no request in the last [`STREAM_IDLE_REQUESTS`] requests (their idle pages go
/// to the pool, their reservations and page tables are given back).
const STREAMS_KEPT: usize = 16;
const STREAM_IDLE_REQUESTS: u64 = 256;
/// Driver events kept for reuse (stream fences, pending frees' events); past this many, an event
/// given back is destroyed. A retired stream gives its fence back, so without a bound (or without
/// reuse) every short-lived stream would leave an event in the driver (issue 37, item 3).
const SPARE_EVENTS_KEPT: usize = 64;
/// Idle handles passed over per stream when looking for one small enough to stitch (a bound on
/// the work of one miss; the list is oldest first, so the search stops at the first the GPU may
/// still use anyway).
const IDLE_SCAN: u32 = 64;

/// One device's arena. All state sits behind one lock; driver calls happen under it, but only on
/// cache misses.
pub struct Arena {
    inner: Mutex<Inner>,
}

/// A block handed out by [`Arena::alloc`]: where, how large (the size class or the 512-byte
/// rounding of the request), and its number among this arena's allocations (rising in the order
/// the arena's lock handed blocks out, so a layer above can order allocations without a counter
/// of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    pub ptr: DevPtr,
    pub size: u64,
    pub seq: u64,
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

/// One reservation of virtual addresses (or, without VMM, one plain segment), owned by one stream.
#[derive(Debug)]
struct Region {
    base: u64,
    len: u64,
    stream: u32,
    pool: Pool,
    /// A plain cuMemAlloc segment: always backed, released only whole.
    plain: bool,
    pages: Vec<PageSlot>,
    /// Small pool only: the slab holding each 64 KiB chunk (`NO_SLAB` for none), indexed by
    /// `(addr - base) / CHUNK`. Grown lazily to the highest chunk a slab has used, so it costs
    /// 4 bytes per 64 KiB of the small pool's address high-water mark (64 B per 2 MiB page).
    chunks: Vec<u32>,
    /// Pages with at least one user.
    in_use: u32,
    /// False once released (plain segments given back); its index stays reserved.
    live: bool,
}

/// One page of a region's address space. Physical memory comes in *handles* of one or more
/// pages (one cuMemCreate each), mapped at consecutive pages whole or in pieces (cuMemMap maps
/// any page-aligned piece of a handle, and cuMemUnmap takes whole mappings). A *mapping* (one
/// [`Run`]) is the unit that goes idle, moves and is unmapped: every page of it names its
/// handle, with its index in the mapping, and the mapping's first page (its *head*) holds what
/// concerns it as a whole — its length, where it starts in its handle, how many of its pages
/// are in use, and its place on the idle list. A piece is mapped twice only while it is lent
/// ([`Lend`]); a page table never shows the same physical page twice otherwise.
///
/// 64 bytes, aligned to 64: a visit to a page reads one cache line. Page tables run to tens of
/// millions of slots with a million blocks live, and a malloc+free pair visits a block's two
/// boundary pages and its handles' heads in slots nowhere near each other, so at 72 bytes each
/// visit read two lines (a test holds the size).
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
struct PageSlot {
    /// The physical handle mapped over this page (VMM only).
    phys: Option<PageHandle>,
    /// This page's index in its mapping (0 on the head page).
    hoff: u16,
    /// On a head page: the pages of its mapping (0 elsewhere, and when unmapped).
    hlen: u16,
    /// On a head page: the mapping's first page in its handle (`Run::off`).
    hbase: u16,
    /// On a head page: pages of its mapping with at least one user. The mapping is idle (on its
    /// stream's idle list) exactly when this is 0.
    busy: u16,
    /// Live blocks or slabs touching this page.
    users: u32,
    /// Bytes of live large blocks inside this page (a page is at most 1 GiB: `page_size_mb`'s
    /// bound).
    covered: u32,
    /// On the head of a mapped, unused handle: when it went idle, as a sequence number (0 = not
    /// idle). Its stream's fence must have passed this stamp before the handle moves.
    idle_stamp: u64,
    /// Nanoseconds since the arena started when it went idle (tracked only with
    /// `release_idle_ms`).
    idle_since: u64,
    /// Neighbours in the idle list (oldest first), an intrusive list so that a page joins or
    /// leaves it in O(1): a large block touches dozens of pages on every alloc and free.
    idle_prev: PageRef,
    idle_next: PageRef,
}

/// `k` pages of physical handle `h` from its page `off` on: what one mapping maps, or a piece
/// of a split handle in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    h: PageHandle,
    off: u32,
    k: u32,
}

impl Run {
    fn whole(h: PageHandle, k: u32) -> Run {
        Run { h, off: 0, k }
    }
}

/// Idle pages of a mapping that other pages of it pin, lent at the limit to back a range
/// elsewhere (`Inner::lend_idle`): the same physical pages are then mapped twice, and at their
/// own address they are held by a placeholder taken from their stream's heap, so that no block
/// is placed on them there until the mapping that borrowed them is unmapped (`Inner::unlend`).
#[derive(Clone, Copy, Debug)]
struct Lend {
    /// Where the pages are lent from: their region, stream, address and count.
    region: u32,
    stream: u32,
    addr: u64,
    k: u32,
    /// The placeholder's node in the stream's large heap.
    node: u32,
}

/// A handle split into pieces: its length, and its pieces in the pool (`Inner::parts`) with
/// their pages. Once every page is back in the pool the pieces join into the whole handle again.
#[derive(Clone, Debug, Default)]
struct Split {
    pages: u32,
    pooled: Vec<(u32, u32)>,
}

impl Split {
    fn pooled_pages(&self) -> u32 {
        self.pooled.iter().map(|&(_, k)| k).sum()
    }
}

/// A page of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PageRef {
    region: u32,
    page: u32,
}

impl PageRef {
    const NONE: PageRef = PageRef {
        region: u32::MAX,
        page: u32::MAX,
    };
}

impl PageSlot {
    /// Holding live data and free bytes: free space no one else can use (the large pool's
    /// inactive split).
    #[inline]
    fn is_partial(&self, page: u64) -> bool {
        self.users > 0 && u64::from(self.covered) < page
    }
}

impl Default for PageSlot {
    fn default() -> Self {
        PageSlot {
            phys: None,
            hoff: 0,
            hlen: 0,
            hbase: 0,
            busy: 0,
            users: 0,
            covered: 0,
            idle_stamp: 0,
            idle_since: 0,
            idle_prev: PageRef::NONE,
            idle_next: PageRef::NONE,
        }
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

/// A multiplicative hasher for integer keys (pointers, stream ids): no DoS concern here, and
/// SipHash would be most of the cost of a lookup.
#[derive(Default, Clone, Copy)]
struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n ^ (n >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

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
    growth_time: accounting::GrowthTime,
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
    /// Pages holding live data per pool, for the inactive-split figures.
    in_use_pages: [u64; 3],
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
}

impl Arena {
    /// An arena on `dev` with the settings of `conf`.
    pub fn new(dev: Arc<dyn Device>, conf: &Config) -> Result<Arena> {
        let info = dev.info().clone();
        if !(1..=crate::config::MAX_PAGE_SIZE_MB).contains(&conf.page_size_mb) {
            return Err(Error::Config(format!(
                "TORCH_ARENA_CONF: page_size_mb:{} is out of range: expected 1 to {}",
                conf.page_size_mb,
                crate::config::MAX_PAGE_SIZE_MB
            )));
        }
        let page = conf.page_size_mb << 20;
        if !page.is_multiple_of(info.granularity) {
            return Err(Error::Config(format!(
                "TORCH_ARENA_CONF: page_size_mb:{} is not a multiple of device {}'s allocation \
                 granularity ({} KiB): use a multiple of {} KiB",
                conf.page_size_mb,
                info.ordinal,
                info.granularity >> 10,
                info.granularity >> 10
            )));
        }
        let limit = limit_for(info.total_bytes, conf.memory_fraction, page);
        let region_len = round_up(info.total_bytes.min(MAX_REGION), page).max(page);
        let now = Instant::now();
        let inner = Inner {
            vmm: info.vmm,
            info,
            dev,
            page,
            page_shift: if page.is_power_of_two() {
                page.trailing_zeros()
            } else {
                0
            },
            stitch: conf.stitch,
            release_idle: (conf.release_idle_ms > 0)
                .then(|| Duration::from_millis(conf.release_idle_ms)),
            limit,
            fraction: conf.memory_fraction,
            region_len,
            classes: SizeClasses::new(page),
            slab_max: (conf.slab_max_kb << 10).min(MAX_SMALL),
            streams: Vec::new(),
            stream_index: IntMap::default(),
            last_stream: None,
            free_streams: Vec::new(),
            free_regions: Vec::new(),
            tick: 0,
            allocs: 0,
            regions: Vec::new(),
            region_by_addr: Vec::new(),
            slabs: Vec::new(),
            free_slab_ids: Vec::new(),
            large: PtrTable::default(),
            recorded: IntMap::default(),
            pending: VecDeque::new(),
            pending_ptrs: IntMap::default(),
            spare_events: Vec::new(),
            pool: BTreeMap::new(),
            parts: BTreeMap::new(),
            split: IntMap::default(),
            pooled_pages: 0,
            lends: IntMap::default(),
            lending: HashMap::new(),
            lend_ok: false,
            lend_refused: false,
            lent_pages: 0,
            shared_handles: IntMap::default(),
            shared_pages: 0,
            grown_pages: 0,
            grown_lengths: IntMap::default(),
            requested_high: 0,
            serving: 0,
            growth: GrowthCounts::default(),
            growth_time: accounting::GrowthTime::new(),
            idle_len: 0,
            large_pages: large_pages(limit, page),
            idle_large: 0,
            // At most 1 GiB over at least 2 MiB (the parser's bounds): fits a u16. A head page
            // counts its handle's pages in a u16, so that bounds a handle sized to its run.
            handle_pages: match conf.handle_mb {
                0 => u16::MAX as u32,
                mb => ((mb << 20) / page).clamp(1, u16::MAX as u64) as u32,
            },
            growth_pages: (GROWTH_BYTES / page).clamp(1, u16::MAX as u64) as u32,
            growth_floor_pages: (GROWTH_FLOOR_BYTES / page).clamp(1, u16::MAX as u64) as u32,
            epoch: now,
            seq: 0,
            stats: DeviceStats::new(),
            in_use_pages: [0; 3],
            partial_slabs: 0,
            partial_pages: 0,
            nonempty_slab_bytes: 0,
            bad_frees: 0,
            last_decay: now,
            pools: HashMap::new(),
            pool_states: HashMap::new(),
            recording_pools: 0,
        };
        Ok(Arena {
            inner: Mutex::new(inner),
        })
    }

    /// At least `size` (> 0) bytes, 512-byte aligned, usable on `stream` at once.
    pub fn malloc(&self, size: u64, stream: StreamId) -> Result<DevPtr> {
        self.alloc(size, stream).map(|b| b.ptr)
    }

    /// [`Arena::malloc`], with what a layer above needs to know of the block without asking
    /// again: its size and its number ([`Block`]).
    pub fn alloc(&self, size: u64, stream: StreamId) -> Result<Block> {
        let mut g = self.inner.lock();
        g.malloc(size, stream, None)
    }

    /// Free `ptr`. `size`, when given, must equal the request; a mismatch is reported but the
    /// allocation is still freed (the pointer is what names it).
    pub fn free(&self, ptr: DevPtr, size: Option<u64>, _stream: StreamId) -> Result<()> {
        let mut g = self.inner.lock();
        g.poll_pending();
        let r = g.free(ptr, size);
        if r.is_err() {
            g.bad_frees += 1;
        }
        r
    }

    /// Whether `ptr` lies in memory this arena manages.
    pub fn owns(&self, ptr: DevPtr) -> bool {
        self.inner.lock().region_of(ptr).is_some()
    }

    /// The allocation at `ptr` is also used on `stream`: its memory is not reused until the work
    /// queued on `stream` before its free has completed.
    pub fn record_stream(&self, ptr: DevPtr, stream: StreamId) -> Result<()> {
        let mut g = self.inner.lock();
        let (base, owner) = g.live_allocation(ptr).ok_or_else(|| {
            g.bad_frees += 1;
            Error::BadPointer(
                PointerFault::Unknown,
                format!(
                    "record_stream: pointer {ptr:#x} is not inside a live torch-arena allocation"
                ),
            )
        })?;
        if g.streams[owner as usize].id != stream {
            let list = g.recorded.entry(base).or_default();
            if !list.contains(&stream) {
                list.push(stream);
            }
        }
        Ok(())
    }

    /// The live allocation containing `ptr`: its base pointer and block size.
    pub fn base_alloc(&self, ptr: DevPtr) -> Result<(DevPtr, u64)> {
        let g = self.inner.lock();
        let (base, _) = g.live_allocation(ptr).ok_or_else(|| {
            Error::BadPointer(
                PointerFault::Unknown,
                format!("base_alloc: pointer {ptr:#x} is not inside a live torch-arena allocation"),
            )
        })?;
        Ok((base, g.block_len(base)))
    }

    /// `empty_cache`: wait for every stream, then give every cached page back to the driver.
    pub fn empty_cache(&self) -> Result<ReclaimReport> {
        let mut g = self.inner.lock();
        g.reclaim(true)
    }

    /// Wait for every stream, then return empty slabs and cached ranges to the page pool (pages
    /// stay created, ready to back any new range). Says what was recovered.
    pub fn defragment(&self) -> Result<ReclaimReport> {
        let mut g = self.inner.lock();
        g.reclaim(false)
    }

    /// Cap physical memory at `fraction` of the device. Cached pages above the new cap are
    /// released (pooled pages first, then idle mapped pages oldest first, once the GPU is done
    /// with them, waiting for it if need be); live memory is never touched, so reserved memory can
    /// stay above the cap only by what live allocations hold.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        let mut g = self.inner.lock();
        g.fraction = fraction;
        g.limit = limit_for(g.info.total_bytes, fraction, g.page);
        g.large_pages = large_pages(g.limit, g.page);
        g.idle_large = g.count_idle_large();
        g.trim_to_limit()
    }

    pub fn stats(&self) -> DeviceStats {
        self.inner.lock().stats.clone()
    }

    pub fn reset_peak_stats(&self) {
        let mut g = self.inner.lock();
        g.requested_high = g.requested_high();
        g.stats.reset_peak();
    }

    /// Where the physical pages are: in use, idle mapped, held unused, pooled (also in
    /// [`Arena::extras`], which costs more: it walks the slabs too). One visit per mapped handle
    /// and per unmapped page of every region, under the lock: for reports, not every malloc.
    pub fn pages(&self) -> PageCounts {
        self.inner.lock().page_counts()
    }

    /// Physical memory created so far, by whether its request took the bytes requested to a new
    /// peak (also in [`Arena::extras`], which costs more: it walks the slabs).
    pub fn growth(&self) -> GrowthCounts {
        self.inner.lock().growth
    }

    pub fn reset_accumulated_stats(&self) {
        self.inner.lock().stats.reset_accumulated();
    }

    /// Pages lent now: idle pages of a mapping a live block pins, mapped a second time where a
    /// request at the limit needed them (`Inner::lend_idle`).
    pub fn lent_pages(&self) -> u64 {
        self.inner.lock().lent_pages
    }

    pub fn extras(&self) -> ArenaExtras {
        self.inner.lock().extras()
    }

    /// The device this arena allocates from.
    /// Before `fork()` (`crate::fork`): takes the arena's lock, then its device's locks.
    pub fn fork_prepare(&self) {
        let g = self.inner.lock();
        g.dev.fork_prepare();
        std::mem::forget(g);
    }

    /// After `fork()`, in the parent (`child` false) or the child: gives back what
    /// [`Arena::fork_prepare`] took.
    ///
    /// # Safety
    /// Once after each `fork_prepare`, on the same thread.
    pub unsafe fn fork_release(&self, child: bool) {
        // SAFETY: this thread holds the lock (the caller's contract), so the state is ours to
        // read, and it is given back after the device's.
        unsafe {
            (*self.inner.data_ptr()).dev.fork_release(child);
            crate::fork::release(&self.inner, child);
        }
    }

    pub fn device(&self) -> Arc<dyn Device> {
        self.inner.lock().dev.clone()
    }

    /// Check every internal invariant, walking all state (tests only: O(everything)).
    pub fn check_consistency(&self) -> std::result::Result<(), String> {
        self.inner.lock().check_consistency()
    }
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

/// Set a derived statistic's current value, keeping peak and totals in step.
fn set_stat(arr: &mut crate::stats::StatArray, pool: Pool, value: i64) {
    let delta = value - arr.pool(pool).current;
    if delta > 0 {
        arr.increase(pool, delta);
    } else if delta < 0 {
        arr.decrease(pool, -delta);
    }
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
