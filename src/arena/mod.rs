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
//! - Each stream owns its heaps and slabs: memory freed on stream S is reused at once only by S.
//!   Physical pages move to another stream (or back to the driver) only once an event recorded on
//!   S after the free has completed. Frees of allocations used on other streams (`record_stream`)
//!   wait for events on those streams first.
//!
//! Invariants (each has a test):
//! 1. No two live allocations overlap; every live allocation lies in pages that stay mapped.
//! 2. A page freed on stream S is unmapped, remapped or released only after S's work queued
//!    before the free has completed.
//! 3. `stats` is exact: allocated = Σ live block sizes, requested = Σ live request sizes,
//!    reserved = physical bytes held.
//! 4. Nothing here scans all allocations: every operation is O(log n) in live allocations.

mod heap;
mod layout;
mod report;
mod size_class;
mod slab;

pub use layout::{BlockState, Layout, LayoutBlock, LayoutSegment};
pub use report::*;
pub use size_class::{CHUNK, MAX_SMALL, MIN_BLOCK, SizeClass, SizeClasses};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::config::Config;
use crate::device::{DevPtr, Device, DeviceError, DeviceInfo, EventHandle, PageHandle, StreamId};
use crate::error::{Error, PointerFault, Result};
use crate::stats::{DeviceStats, Pool};
use heap::Heap;
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
/// Streams kept without question. Past this many, a new stream first retires streams that hold
/// nothing and made no request in the last [`STREAM_IDLE_REQUESTS`] requests (their idle pages go
/// to the pool, their reservations and page tables are given back).
const STREAMS_KEPT: usize = 16;
const STREAM_IDLE_REQUESTS: u64 = 256;

/// One device's arena. All state sits behind one lock; driver calls happen under it, but only on
/// cache misses.
pub struct Arena {
    inner: Mutex<Inner>,
}

/// A live block of the large pool.
#[derive(Clone, Copy, Debug)]
struct LargeBlock {
    len: u64,
    requested: u64,
    stream: u32,
    region: u32,
    /// Freed by the client, waiting for events on the streams it was used on.
    pending: bool,
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

#[derive(Clone, Copy, Debug)]
struct PageSlot {
    /// The physical page mapped here (VMM only).
    phys: Option<PageHandle>,
    /// Live blocks or slabs touching this page.
    users: u32,
    /// Bytes of live large blocks inside this page.
    covered: u64,
    /// While the page is mapped and unused: when it went idle, as a sequence number (0 = not
    /// idle). Its stream's fence must have passed this stamp before the page moves.
    idle_stamp: u64,
    /// Nanoseconds since the arena started when it went idle (tracked only with
    /// `release_idle_ms`).
    idle_since: u64,
    /// Neighbours in the idle list (oldest first), an intrusive list so that a page joins or
    /// leaves it in O(1): a large block touches dozens of pages on every alloc and free.
    idle_prev: PageRef,
    idle_next: PageRef,
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

impl Default for PageSlot {
    fn default() -> Self {
        PageSlot {
            phys: None,
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
}

impl StreamState {
    /// An empty slot: no heaps, no regions, no classes.
    fn retired() -> StreamState {
        StreamState {
            id: 0,
            small: Heap::new(),
            large: Heap::new(),
            classes: Vec::new(),
            fence: None,
            fence_seq: 0,
            safe_seq: 0,
            idle_head: PageRef::NONE,
            idle_tail: PageRef::NONE,
            regions: Vec::new(),
            last_used: 0,
            retired: true,
        }
    }
}

/// An allocation freed by the client whose memory other streams may still use.
#[derive(Debug)]
struct Pending {
    ptr: u64,
    events: Vec<EventHandle>,
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
    regions: Vec<Region>,
    /// `(base, region)` sorted by base, for pointer lookup.
    region_by_addr: Vec<(u64, u32)>,
    slabs: Vec<Slab>,
    free_slab_ids: Vec<u32>,
    large: BTreeMap<u64, LargeBlock>,
    /// Extra streams named by `record_stream`, per live allocation.
    recorded: IntMap<u64, Vec<StreamId>>,
    pending: VecDeque<Pending>,
    pending_ptrs: IntMap<u64, ()>,
    spare_events: Vec<EventHandle>,
    /// Physical pages created and mapped nowhere, with the time they became free.
    pool: Vec<(PageHandle, Instant)>,
    /// Mapped pages with no user, oldest first.
    /// Pages on all streams' idle lists.
    idle_len: u64,
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
}

impl Arena {
    /// An arena on `dev` with the settings of `conf`.
    pub fn new(dev: Arc<dyn Device>, conf: &Config) -> Result<Arena> {
        let info = dev.info().clone();
        let page = conf.page_size_mb << 20;
        if page == 0 || !page.is_multiple_of(info.granularity) {
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
            regions: Vec::new(),
            region_by_addr: Vec::new(),
            slabs: Vec::new(),
            free_slab_ids: Vec::new(),
            large: BTreeMap::new(),
            recorded: IntMap::default(),
            pending: VecDeque::new(),
            pending_ptrs: IntMap::default(),
            spare_events: Vec::new(),
            pool: Vec::new(),
            idle_len: 0,
            epoch: now,
            seq: 0,
            stats: DeviceStats::new(),
            in_use_pages: [0; 3],
            partial_slabs: 0,
            partial_pages: 0,
            nonempty_slab_bytes: 0,
            bad_frees: 0,
            last_decay: now,
        };
        Ok(Arena {
            inner: Mutex::new(inner),
        })
    }

    /// At least `size` (> 0) bytes, 512-byte aligned, usable on `stream` at once.
    pub fn malloc(&self, size: u64, stream: StreamId) -> Result<DevPtr> {
        let mut g = self.inner.lock();
        g.malloc(size, stream)
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
        g.trim_to_limit()
    }

    pub fn stats(&self) -> DeviceStats {
        self.inner.lock().stats.clone()
    }

    pub fn reset_peak_stats(&self) {
        self.inner.lock().stats.reset_peak();
    }

    pub fn reset_accumulated_stats(&self) {
        self.inner.lock().stats.reset_accumulated();
    }

    pub fn extras(&self) -> ArenaExtras {
        self.inner.lock().extras()
    }

    /// The device this arena allocates from.
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

impl Inner {
    // ----- allocation -------------------------------------------------------------------------

    fn malloc(&mut self, size: u64, stream: StreamId) -> Result<DevPtr> {
        if !self.pending.is_empty() {
            self.poll_pending();
        }
        let s = self.stream(stream)?;
        // A request the limit cannot give even with every cached page moved fails here, before
        // any driver call or host allocation proportional to it.
        if !self.within_reach(size) {
            return Err(self.out_of_memory(size));
        }
        let created = self.stats.num_device_alloc;
        match self.try_alloc(size, s, false) {
            Ok(p) => return Ok(p),
            Err(Miss::Device(e)) => return Err(e.into()),
            Err(Miss::NoMemory) => {}
        }
        // The escalation ladder: each step frees more, then the request is tried again.
        for step in [Escalation::SynchronizeAll, Escalation::ReleaseCached] {
            match step {
                // Wait for every stream so pending frees finish and every idle page is safe to
                // move, then take pages from anywhere.
                Escalation::SynchronizeAll => {
                    self.stats.num_alloc_retries += 1;
                    tracing::debug!(
                        device = self.info.ordinal,
                        size,
                        "allocation retried after waiting for every stream (pages moved from anywhere)"
                    );
                    self.synchronize_all()?;
                }
                // The driver may refuse pages we are allowed (another process holds them, or the
                // address space is spent): give back what we cache, idle streams included.
                Escalation::ReleaseCached => {
                    self.reclaim(true)?;
                }
            }
            // Releasing may have retired this very stream (it held nothing): look it up again.
            let s = self.stream(stream)?;
            match self.try_alloc(size, s, true) {
                Ok(p) => return Ok(p),
                Err(Miss::Device(e)) => return Err(e.into()),
                Err(Miss::NoMemory) => {}
            }
        }
        // Pages created for this request and left in the pool go back: a failed request holds
        // nothing it took for itself.
        let mine = (self.stats.num_device_alloc - created).max(0) as usize;
        for _ in 0..mine.min(self.pool.len()) {
            let (page, _) = self.pool.pop().expect("counted");
            if self.release_page(page).is_err() {
                break;
            }
        }
        Err(self.out_of_memory(size))
    }

    /// Whether a request of `size` bytes could be met within the limit if every cached page were
    /// moved to it. Pages holding live data cannot move; a large block may share at most its first
    /// and last page with them, so this errs on the side of trying by at most two pages. Small
    /// requests always may (a slab slot may be free already).
    fn within_reach(&self, size: u64) -> bool {
        if size <= self.slab_max {
            return true;
        }
        let Some(len) = size.checked_next_multiple_of(MIN_BLOCK) else {
            return false;
        };
        let pinned =
            self.in_use_pages[Pool::Small as usize] + self.in_use_pages[Pool::Large as usize];
        let budget = (self.limit / self.page).saturating_sub(pinned);
        // Only pages holding live data can be shared, and only the block's first and last.
        len.div_ceil(self.page).saturating_sub(pinned.min(2)) <= budget
    }

    /// The out-of-memory error for a request of `size` bytes, counted.
    fn out_of_memory(&mut self, size: u64) -> Error {
        self.stats.num_ooms += 1;
        Error::OutOfMemory(self.oom_message(size))
    }

    fn try_alloc(
        &mut self,
        size: u64,
        s: u32,
        anywhere: bool,
    ) -> std::result::Result<DevPtr, Miss> {
        if size <= self.slab_max {
            self.alloc_small(size, s, anywhere)
        } else {
            self.alloc_large(size, s, anywhere)
        }
    }

    fn alloc_small(
        &mut self,
        size: u64,
        s: u32,
        anywhere: bool,
    ) -> std::result::Result<DevPtr, Miss> {
        let ci = self.classes.index_of(size);
        let slab_id = match self.streams[s as usize].classes[ci].current {
            Some(id) if !self.slabs[id as usize].is_full() => id,
            _ => self.next_slab(s, ci, anywhere)?,
        };
        let slab = &mut self.slabs[slab_id as usize];
        let was = (slab.used, slab.slots);
        let ptr = slab.take(size);
        let slot = slab.slot_size;
        if was.0 == 0 {
            self.nonempty_slab_bytes += slab.span;
        }
        self.partial_slabs += partial(was.0 + 1, was.1) - partial(was.0, was.1);
        self.count_alloc(Pool::Small, size, slot);
        Ok(ptr)
    }

    /// A new live allocation of a `block`-byte block for a request of `size` bytes.
    #[inline]
    fn count_alloc(&mut self, pool: Pool, size: u64, block: u64) {
        let st = &mut self.stats;
        st.allocation.increase(pool, 1);
        st.active.increase(pool, 1);
        st.allocated_bytes.increase(pool, block as i64);
        st.active_bytes.increase(pool, block as i64);
        st.requested_bytes.increase(pool, size as i64);
        self.update_inactive_split(pool);
    }

    /// The current slab of class `ci` is full (or absent): make the fullest partial slab current,
    /// or carve a new one.
    fn next_slab(&mut self, s: u32, ci: usize, anywhere: bool) -> std::result::Result<u32, Miss> {
        let cs = &mut self.streams[s as usize].classes[ci];
        if let Some(id) = cs.buckets.iter_mut().rev().find_map(|b| b.pop()) {
            self.slabs[id as usize].bucket = None;
            self.set_current(s, ci, id);
            return Ok(id);
        }
        let id = self.create_slab(s, ci, anywhere)?;
        self.set_current(s, ci, id);
        Ok(id)
    }

    /// Make `id` the current slab of its class; the previous current slab, unless full, joins
    /// the fill-order buckets (or dissolves if empty).
    fn set_current(&mut self, s: u32, ci: usize, id: u32) {
        let old = self.streams[s as usize].classes[ci].current.replace(id);
        if let Some(old) = old.filter(|&o| o != id) {
            let slab = &self.slabs[old as usize];
            if slab.is_empty() {
                self.dissolve_slab(old);
            } else if !slab.is_full() {
                self.bucket_insert(old);
            }
        }
    }

    fn create_slab(&mut self, s: u32, ci: usize, anywhere: bool) -> std::result::Result<u32, Miss> {
        let class = *self.classes.get(ci);
        let span = class.span;
        let (addr, region) = self.take_va(s, Pool::Small, span)?;
        let (first, last) = self.pages_of(region, addr, span);
        // Count the pages as used first, so that backing them cannot reclaim one of them. Pages
        // shared with live slabs are mapped already and just gain a user.
        for p in first..=last {
            self.page_user_added(region, p);
        }
        if let Err(e) = self.back_pages(region, first, last - first + 1, anywhere) {
            for p in first..=last {
                self.page_user_removed(region, p);
            }
            self.streams[s as usize].small.free(addr, span, region);
            return Err(e);
        }
        let slab = Slab::new(addr, ci as u16, class.size, class.slots, s, region, span);
        let id = match self.free_slab_ids.pop() {
            Some(id) => {
                self.slabs[id as usize] = slab;
                id
            }
            None => {
                self.slabs.push(slab);
                (self.slabs.len() - 1) as u32
            }
        };
        let r = &mut self.regions[region as usize];
        let c0 = ((addr - r.base) / CHUNK) as usize;
        let c1 = c0 + (span / CHUNK) as usize;
        if r.chunks.len() < c1 {
            // Grow to the next power of two (at most the region), so growth is amortised O(1).
            let want = c1.next_power_of_two().min((r.len / CHUNK) as usize).max(c1);
            r.chunks.resize(want, NO_SLAB);
        }
        r.chunks[c0..c1].fill(id);
        Ok(id)
    }

    /// First and last page index of `[addr, addr + len)` in `region`.
    #[inline]
    fn pages_of(&self, region: u32, addr: u64, len: u64) -> (u32, u32) {
        let base = self.regions[region as usize].base;
        (
            ((addr - base) / self.page) as u32,
            ((addr + len - 1 - base) / self.page) as u32,
        )
    }

    /// An empty, non-current slab gives its chunks back; a page it shared with no other live
    /// slab goes idle.
    fn dissolve_slab(&mut self, id: u32) {
        let slab = &self.slabs[id as usize];
        debug_assert!(slab.is_empty() && slab.bucket.is_none());
        let (region, base, span, s) = (slab.region, slab.base, slab.span, slab.stream);
        let r = &mut self.regions[region as usize];
        let c0 = ((base - r.base) / CHUNK) as usize;
        r.chunks[c0..c0 + (span / CHUNK) as usize].fill(NO_SLAB);
        let (first, last) = self.pages_of(region, base, span);
        for p in first..=last {
            self.page_user_removed(region, p);
        }
        self.streams[s as usize].small.free(base, span, region);
        self.slabs[id as usize].slots = 0;
        self.free_slab_ids.push(id);
    }

    fn alloc_large(
        &mut self,
        size: u64,
        s: u32,
        anywhere: bool,
    ) -> std::result::Result<DevPtr, Miss> {
        let len = round_up(size, MIN_BLOCK);
        let (addr, region) = self.take_va(s, Pool::Large, len)?;
        if let Err(e) = self.use_range(region, addr, len, anywhere) {
            self.streams[s as usize].large.free(addr, len, region);
            return Err(e);
        }
        self.large.insert(
            addr,
            LargeBlock {
                len,
                requested: size,
                stream: s,
                region,
                pending: false,
            },
        );
        self.count_alloc(Pool::Large, size, len);
        Ok(addr)
    }

    /// Addresses for `len` bytes from stream `s`'s heap of `pool`, reserving a new region (or, with
    /// no VMM, allocating a new plain segment) when none fits.
    fn take_va(&mut self, s: u32, pool: Pool, len: u64) -> std::result::Result<(u64, u32), Miss> {
        let hit = if pool == Pool::Large && self.vmm {
            self.place_large(s, len)
        } else {
            self.heap(s, pool).alloc(len)
        };
        if let Some(hit) = hit {
            return Ok(hit);
        }
        self.add_region(s, pool, len)?;
        Ok(self
            .heap(s, pool)
            .alloc(len)
            .expect("a new region fits the request"))
    }

    /// A large block for stream `s`: among the best fits by size, the one whose range needs the
    /// fewest pages mapped (a freed block of the same size needs none).
    fn place_large(&mut self, s: u32, len: u64) -> Option<(u64, u32)> {
        let mut fits = [(0u64, 0u32); PLACEMENT_CANDIDATES];
        let mut n = 0;
        for c in self.streams[s as usize]
            .large
            .candidates(len, PLACEMENT_CANDIDATES)
        {
            fits[n] = c;
            n += 1;
        }
        let mut best: Option<(u64, u64, u32)> = None;
        for &(addr, region) in &fits[..n] {
            let limit = best.map_or(u64::MAX, |b| b.0);
            let missing = self.unmapped_pages(region, addr, len, limit);
            if missing < limit {
                best = Some((missing, addr, region));
                if missing == 0 {
                    break;
                }
            }
        }
        let (_, addr, region) = best?;
        self.streams[s as usize].large.take(addr, len);
        Some((addr, region))
    }

    /// Pages of `[addr, addr + len)` with nothing mapped, counting no further than `limit`.
    fn unmapped_pages(&self, region: u32, addr: u64, len: u64, limit: u64) -> u64 {
        let r = &self.regions[region as usize];
        let first = ((addr - r.base) / self.page) as usize;
        let last = ((addr + len - 1 - r.base) / self.page) as usize;
        let mut missing = 0;
        for slot in &r.pages[first..=last] {
            missing += slot.phys.is_none() as u64;
            if missing >= limit {
                break;
            }
        }
        missing
    }

    fn heap(&mut self, s: u32, pool: Pool) -> &mut Heap {
        let st = &mut self.streams[s as usize];
        match pool {
            Pool::Small => &mut st.small,
            Pool::Large => &mut st.large,
        }
    }

    fn add_region(&mut self, s: u32, pool: Pool, need: u64) -> std::result::Result<u32, Miss> {
        let (base, len, plain) = if self.vmm {
            let len = round_up(need, self.page).max(self.region_len);
            (self.dev.reserve(len, self.page)?, len, false)
        } else {
            let len = match pool {
                Pool::Small => round_up(need, self.page),
                Pool::Large if need < PLAIN_MEDIUM_SEGMENT / 2 => PLAIN_MEDIUM_SEGMENT,
                Pool::Large => round_up(need, self.page),
            };
            if self.reserved() + len > self.limit {
                return Err(Miss::NoMemory);
            }
            let base = self.dev.alloc_plain(len)?;
            self.stats.segment.increase(pool, 1);
            self.stats.reserved_bytes.increase(pool, len as i64);
            self.stats.num_device_alloc += 1;
            (base, len, true)
        };
        let region = Region {
            base,
            len,
            stream: s,
            pool,
            plain,
            pages: vec![PageSlot::default(); (len / self.page) as usize],
            chunks: Vec::new(),
            in_use: 0,
            live: true,
        };
        let id = match self.free_regions.pop() {
            Some(id) => {
                self.regions[id as usize] = region;
                id
            }
            None => {
                self.regions.push(region);
                (self.regions.len() - 1) as u32
            }
        };
        self.streams[s as usize].regions.push(id);
        let at = self.region_by_addr.partition_point(|&(b, _)| b < base);
        self.region_by_addr.insert(at, (base, id));
        self.heap(s, pool).add_region(base, len, id);
        Ok(id)
    }

    /// Count one more user on every page of `[addr, addr + len)`, then map physical pages where
    /// none is mapped yet. The users come first: a page in use is never reclaimed, so nothing
    /// taken to back this range can be one of its own pages. On failure nothing changes.
    fn use_range(
        &mut self,
        region: u32,
        addr: u64,
        len: u64,
        anywhere: bool,
    ) -> std::result::Result<(), Miss> {
        let base = self.regions[region as usize].base;
        let first = ((addr - base) / self.page) as u32;
        let last = ((addr + len - 1 - base) / self.page) as u32;
        self.count_range(region, addr, len, true);
        if let Err(e) = self.back_pages(region, first, last - first + 1, anywhere) {
            self.count_range(region, addr, len, false);
            return Err(e);
        }
        Ok(())
    }

    /// Add (or remove) one user and the covered bytes of `[addr, addr + len)` on its pages.
    fn count_range(&mut self, region: u32, addr: u64, len: u64, add: bool) {
        let base = self.regions[region as usize].base;
        let first = ((addr - base) / self.page) as u32;
        let last = ((addr + len - 1 - base) / self.page) as u32;
        for p in first..=last {
            let start = base + p as u64 * self.page;
            let overlap = (addr + len).min(start + self.page) - addr.max(start);
            let was = self.page_is_partial(region, p);
            let slot = &mut self.regions[region as usize].pages[p as usize];
            if add {
                slot.covered += overlap;
                self.page_user_added(region, p);
            } else {
                slot.covered -= overlap;
                self.page_user_removed(region, p);
            }
            self.partial_pages += self.page_is_partial(region, p) as i64 - was as i64;
        }
    }

    /// Map a physical page under every page of `first..first+n` of `region` that has none. The
    /// pages are already counted as used, so reclaiming cannot pick them. On failure every page
    /// mapped here is unmapped again (one the driver refuses to unmap stays mapped, and goes idle
    /// when its users are uncounted).
    fn back_pages(
        &mut self,
        region: u32,
        first: u32,
        n: u32,
        anywhere: bool,
    ) -> std::result::Result<(), Miss> {
        if self.regions[region as usize].plain {
            return Ok(());
        }
        let missing: Vec<u32> = (first..first + n)
            .filter(|&p| {
                self.regions[region as usize].pages[p as usize]
                    .phys
                    .is_none()
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let owner = self.regions[region as usize].stream;
        let pages = self.acquire(missing.len(), anywhere, owner)?;
        let pool = self.regions[region as usize].pool;
        let base = self.regions[region as usize].base;
        for (i, (&p, &phys)) in missing.iter().zip(&pages).enumerate() {
            if let Err(e) = self.dev.map(base + p as u64 * self.page, self.page, phys) {
                let now = Instant::now();
                for &q in &missing[..i] {
                    if self
                        .dev
                        .unmap(base + q as u64 * self.page, self.page)
                        .is_ok()
                    {
                        let slot = &mut self.regions[region as usize].pages[q as usize];
                        let page = slot.phys.take().expect("mapped just now");
                        self.pool.push((page, now));
                        if pool == Pool::Small {
                            self.move_reserved(Pool::Small, Pool::Large, 1);
                        }
                    }
                }
                self.pool.extend(pages[i..].iter().map(|&h| (h, now)));
                return Err(Miss::Device(e));
            }
            self.regions[region as usize].pages[p as usize].phys = Some(phys);
            if pool == Pool::Small {
                self.move_reserved(Pool::Large, Pool::Small, 1);
            }
        }
        Ok(())
    }

    /// `n` unmapped physical pages: from the pool, then (with stitching, or when `anywhere`) idle
    /// pages proven safe, then new pages within the limit. On failure every page taken goes back
    /// to the pool.
    fn acquire(
        &mut self,
        n: usize,
        anywhere: bool,
        own: u32,
    ) -> std::result::Result<Vec<PageHandle>, Miss> {
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            if let Some((page, _)) = self.pool.pop() {
                got.push(page);
                continue;
            }
            if self.stitch || anywhere {
                let before = got.len();
                if let Err(e) = self.reclaim_idle_pages(n, anywhere, own, &mut got) {
                    return Err(self.give_back(got, e.into()));
                }
                if got.len() > before {
                    continue;
                }
            }
            if self.reserved() + self.page <= self.limit {
                match self.dev.create_page(self.page) {
                    Ok(page) => {
                        self.stats.segment.increase(Pool::Large, 1);
                        self.stats
                            .reserved_bytes
                            .increase(Pool::Large, self.page as i64);
                        self.stats.num_device_alloc += 1;
                        got.push(page);
                        continue;
                    }
                    Err(e) => return Err(self.give_back(got, e.into())),
                }
            }
            return Err(self.give_back(got, Miss::NoMemory));
        }
        Ok(got)
    }

    fn give_back(&mut self, pages: Vec<PageHandle>, why: Miss) -> Miss {
        let now = Instant::now();
        self.pool.extend(pages.into_iter().map(|p| (p, now)));
        why
    }

    /// Unmap idle pages until `out` holds `n` pages: stream `own`'s first, then other streams',
    /// each oldest first, taking a page only once its stream is done with it (with `block`,
    /// waiting for the stream). A stream's first page its fence does not cover ends that stream's
    /// turn: the rest of its list is newer.
    fn reclaim_idle_pages(
        &mut self,
        n: usize,
        block: bool,
        own: u32,
        out: &mut Vec<PageHandle>,
    ) -> std::result::Result<(), DeviceError> {
        let others = (0..self.streams.len() as u32).filter(|&s| s != own);
        for s in std::iter::once(own).chain(others) {
            while out.len() < n {
                let at = self.streams[s as usize].idle_head;
                if at == PageRef::NONE
                    || !self.stream_done_with(s, self.slot(at).idle_stamp, block)?
                {
                    break;
                }
                out.push(self.unmap_idle(at)?);
            }
            if out.len() == n {
                break;
            }
        }
        Ok(())
    }

    /// Unmap an idle page; its physical page is returned, mapped nowhere.
    fn unmap_idle(&mut self, at: PageRef) -> std::result::Result<PageHandle, DeviceError> {
        let region = &self.regions[at.region as usize];
        let va = region.base + at.page as u64 * self.page;
        let pool = region.pool;
        self.dev.unmap(va, self.page)?;
        self.idle_unlink(at);
        let phys = self
            .slot_mut(at)
            .phys
            .take()
            .expect("an idle page is mapped");
        if pool == Pool::Small {
            self.move_reserved(Pool::Small, Pool::Large, 1);
        }
        Ok(phys)
    }

    /// Whether every page stream `s` made idle at or before `stamp` is no longer used by the GPU.
    /// Records the stream's fence event when needed; with `block`, waits for it.
    fn stream_done_with(
        &mut self,
        s: u32,
        stamp: u64,
        block: bool,
    ) -> std::result::Result<bool, DeviceError> {
        let seq = self.seq;
        let st = &self.streams[s as usize];
        if stamp <= st.safe_seq {
            return Ok(true);
        }
        let event = match st.fence {
            Some(e) => e,
            None => {
                let e = self.dev.create_event()?;
                self.streams[s as usize].fence = Some(e);
                self.streams[s as usize].fence_seq = 0;
                e
            }
        };
        let st = &mut self.streams[s as usize];
        if st.fence_seq < stamp {
            self.dev.record_event(event, st.id)?;
            st.fence_seq = seq;
        }
        let done = if block {
            self.dev.synchronize_event(event)?;
            true
        } else {
            self.dev.query_event(event)?
        };
        let st = &mut self.streams[s as usize];
        if done {
            st.safe_seq = st.fence_seq;
        }
        Ok(done && stamp <= st.safe_seq)
    }

    /// A page holding live data and free bytes: free space no one else can use.
    #[inline]
    fn page_is_partial(&self, region: u32, p: u32) -> bool {
        let slot = &self.regions[region as usize].pages[p as usize];
        slot.users > 0 && slot.covered < self.page
    }

    /// One more user of a page. A page going from idle to used leaves the idle list.
    fn page_user_added(&mut self, region: u32, p: u32) {
        let r = &mut self.regions[region as usize];
        let slot = &mut r.pages[p as usize];
        slot.users += 1;
        if slot.users == 1 {
            let idle = slot.idle_stamp != 0;
            r.in_use += 1;
            self.in_use_pages[r.pool as usize] += 1;
            if idle {
                self.idle_unlink(PageRef { region, page: p });
            }
        }
    }

    /// One user less. A mapped page with no user joins the idle list (newest last).
    fn page_user_removed(&mut self, region: u32, p: u32) {
        let r = &mut self.regions[region as usize];
        let slot = &mut r.pages[p as usize];
        slot.users -= 1;
        if slot.users == 0 {
            let mapped = slot.phys.is_some();
            r.in_use -= 1;
            self.in_use_pages[r.pool as usize] -= 1;
            if mapped {
                self.idle_push(PageRef { region, page: p });
            }
        }
    }

    // ----- the idle list ----------------------------------------------------------------------

    #[inline]
    fn slot(&self, at: PageRef) -> &PageSlot {
        &self.regions[at.region as usize].pages[at.page as usize]
    }

    #[inline]
    fn slot_mut(&mut self, at: PageRef) -> &mut PageSlot {
        &mut self.regions[at.region as usize].pages[at.page as usize]
    }

    /// Append a mapped, unused page to the idle list with a new stamp (newest last).
    fn idle_push(&mut self, at: PageRef) {
        self.seq += 1;
        let owner = self.regions[at.region as usize].stream as usize;
        let (seq, tail) = (self.seq, self.streams[owner].idle_tail);
        let since = match self.release_idle {
            Some(_) => self.epoch.elapsed().as_nanos() as u64,
            None => 0,
        };
        let slot = self.slot_mut(at);
        debug_assert!(slot.idle_stamp == 0 && slot.phys.is_some());
        slot.idle_stamp = seq;
        slot.idle_since = since;
        slot.idle_prev = tail;
        slot.idle_next = PageRef::NONE;
        if tail == PageRef::NONE {
            self.streams[owner].idle_head = at;
        } else {
            self.slot_mut(tail).idle_next = at;
        }
        self.streams[owner].idle_tail = at;
        self.idle_len += 1;
    }

    /// Take a page off the idle list.
    fn idle_unlink(&mut self, at: PageRef) {
        let owner = self.regions[at.region as usize].stream as usize;
        let slot = self.slot_mut(at);
        debug_assert!(slot.idle_stamp != 0);
        let (prev, next) = (slot.idle_prev, slot.idle_next);
        slot.idle_stamp = 0;
        slot.idle_prev = PageRef::NONE;
        slot.idle_next = PageRef::NONE;
        match prev {
            PageRef::NONE => self.streams[owner].idle_head = next,
            p => self.slot_mut(p).idle_next = next,
        }
        match next {
            PageRef::NONE => self.streams[owner].idle_tail = prev,
            n => self.slot_mut(n).idle_prev = prev,
        }
        self.idle_len -= 1;
    }

    // ----- free -------------------------------------------------------------------------------

    fn free(&mut self, ptr: u64, size: Option<u64>) -> Result<()> {
        let region = self.region_of(ptr).ok_or_else(|| {
            Error::BadPointer(
                PointerFault::Unknown,
                format!(
                    "free: pointer {ptr:#x} was not allocated by torch-arena on device {}",
                    self.info.ordinal
                ),
            )
        })?;
        if !self.pending_ptrs.is_empty() && self.pending_ptrs.contains_key(&ptr) {
            return Err(self.double_free(ptr));
        }
        let (found, requested, block) = match self.regions[region as usize].pool {
            Pool::Small => {
                let (id, slot) = self
                    .small_slot(region, ptr)
                    .ok_or_else(|| self.not_live(ptr))?;
                let slab = &self.slabs[id as usize];
                (
                    Found::Small { id, slot },
                    slab.requested(slot),
                    slab.slot_size,
                )
            }
            Pool::Large => {
                let b = self.large.get(&ptr).ok_or_else(|| self.not_live(ptr))?;
                (Found::Large, b.requested, b.len)
            }
        };
        let pool = found.pool();
        let st = &mut self.stats;
        st.allocation.decrease(pool, 1);
        st.allocated_bytes.decrease(pool, block as i64);
        st.requested_bytes.decrease(pool, requested as i64);
        let extra = if self.recorded.is_empty() {
            None
        } else {
            self.recorded.remove(&ptr)
        };
        match extra {
            Some(streams) => self.defer_free(ptr, found, streams)?,
            None => self.finish_free(ptr, found),
        }
        match size {
            Some(size) if size != requested => Err(Error::BadPointer(
                PointerFault::SizeMismatch,
                format!(
                    "free: size mismatch for pointer {ptr:#x}: freed with size {size}, allocated with size \
                 {requested} (the allocation was freed)"
                ),
            )),
            _ => Ok(()),
        }
    }

    fn not_live(&self, ptr: u64) -> Error {
        match self.live_allocation(ptr) {
            Some((base, _)) => Error::BadPointer(
                PointerFault::Interior,
                format!(
                    "free: pointer {ptr:#x} points inside the allocation at {base:#x}; free the base pointer"
                ),
            ),
            None => self.double_free(ptr),
        }
    }

    fn double_free(&self, ptr: u64) -> Error {
        Error::BadPointer(
            PointerFault::Freed,
            format!(
                "free: pointer {ptr:#x} is not a live allocation (double free, or freed before it was returned)"
            ),
        )
    }

    /// Record an event on each stream the allocation was used on; reuse waits for them.
    fn defer_free(&mut self, ptr: u64, found: Found, streams: Vec<StreamId>) -> Result<()> {
        let mut events = Vec::with_capacity(streams.len());
        for s in streams {
            let e = match self.spare_events.pop() {
                Some(e) => e,
                None => match self.dev.create_event() {
                    Ok(e) => e,
                    Err(err) => {
                        // Without an event we cannot wait later: wait now.
                        self.dev.synchronize_stream(s)?;
                        let _ = err;
                        continue;
                    }
                },
            };
            if self.dev.record_event(e, s).is_err() {
                self.spare_events.push(e);
                self.dev.synchronize_stream(s)?;
                continue;
            }
            events.push(e);
        }
        if events.is_empty() {
            self.finish_free(ptr, found);
        } else {
            if matches!(found, Found::Large) {
                self.large.get_mut(&ptr).expect("live").pending = true;
            }
            self.pending_ptrs.insert(ptr, ());
            self.pending.push_back(Pending { ptr, events });
        }
        Ok(())
    }

    /// Finish pending frees whose events have completed, oldest first.
    /// A failed query counts as "not yet": reusing memory early would be unsafe, and a device-wide
    /// synchronisation (`synchronize_all`) finishes everything anyway.
    fn poll_pending(&mut self) {
        self.finish_pending(false);
    }

    /// Finish pending frees, oldest first: those whose events completed, or all with `all_done`
    /// (after the whole device was synchronised).
    fn finish_pending(&mut self, all_done: bool) {
        while let Some(front) = self.pending.front() {
            let done = all_done
                || front
                    .events
                    .iter()
                    .all(|&e| self.dev.query_event(e).unwrap_or(false));
            if !done {
                break;
            }
            let p = self.pending.pop_front().expect("front exists");
            self.spare_events.extend(p.events);
            self.pending_ptrs.remove(&p.ptr);
            let found = self
                .locate(p.ptr)
                .expect("a pending allocation is still ours");
            self.finish_free(p.ptr, found);
        }
    }

    /// The memory of `ptr` becomes reusable by its stream.
    fn finish_free(&mut self, ptr: u64, found: Found) {
        match found {
            Found::Small { id, slot } => self.finish_small(id, slot),
            Found::Large => self.finish_large(ptr),
        }
        self.update_inactive_split(found.pool());
        if self.release_idle.is_some() {
            self.maybe_decay();
        }
    }

    fn finish_small(&mut self, id: u32, slot: usize) {
        let slab = &mut self.slabs[id as usize];
        let (used, slots) = (slab.used, slab.slots);
        slab.give_back(slot);
        let size = slab.slot_size as i64;
        let (s, ci) = (slab.stream, slab.class as usize);
        self.partial_slabs += partial(used - 1, slots) - partial(used, slots);
        self.stats.active.decrease(Pool::Small, 1);
        self.stats.active_bytes.decrease(Pool::Small, size);
        let is_current = self.streams[s as usize].classes[ci].current == Some(id);
        if used == 1 {
            self.nonempty_slab_bytes -= self.slabs[id as usize].span;
        }
        if is_current {
            // An emptied current slab of a page or more dissolves too: kept, it would hold a
            // whole page for a class that may not come back.
            if used == 1 && self.slabs[id as usize].span >= self.page {
                self.streams[s as usize].classes[ci].current = None;
                self.dissolve_slab(id);
            }
            return;
        }
        if used == 1 {
            self.bucket_remove(id);
            self.dissolve_slab(id);
        } else if used == slots {
            self.bucket_insert(id);
        } else {
            let b = bucket_of(used - 1, slots);
            if self.slabs[id as usize].bucket.map(|(old, _)| old) != Some(b) {
                self.bucket_remove(id);
                self.bucket_insert(id);
            }
        }
    }

    fn finish_large(&mut self, ptr: u64) {
        let block = self.large.remove(&ptr).expect("live block");
        self.count_range(block.region, ptr, block.len, false);
        self.streams[block.stream as usize]
            .large
            .free(ptr, block.len, block.region);
        self.stats.active.decrease(Pool::Large, 1);
        self.stats
            .active_bytes
            .decrease(Pool::Large, block.len as i64);
    }

    fn bucket_insert(&mut self, id: u32) {
        let slab = &self.slabs[id as usize];
        let b = bucket_of(slab.used, slab.slots);
        let list = &mut self.streams[slab.stream as usize].classes[slab.class as usize].buckets
            [b as usize];
        list.push(id);
        let at = (list.len() - 1) as u32;
        self.slabs[id as usize].bucket = Some((b, at));
    }

    fn bucket_remove(&mut self, id: u32) {
        let slab = &self.slabs[id as usize];
        let Some((b, at)) = slab.bucket else { return };
        let list = &mut self.streams[slab.stream as usize].classes[slab.class as usize].buckets
            [b as usize];
        list.swap_remove(at as usize);
        if let Some(&moved) = list.get(at as usize) {
            self.slabs[moved as usize].bucket = Some((b, at));
        }
        self.slabs[id as usize].bucket = None;
    }

    // ----- lookups ----------------------------------------------------------------------------

    /// Index of stream `id`, created on first use (in a slot a retired stream gave back, if any).
    #[inline]
    fn stream(&mut self, id: StreamId) -> Result<u32> {
        self.tick += 1;
        if let Some((last, s)) = self.last_stream
            && last == id
        {
            self.streams[s as usize].last_used = self.tick;
            return Ok(s);
        }
        let s = match self.stream_index.get(&id) {
            Some(&s) => s,
            None => self.new_stream(id)?,
        };
        self.streams[s as usize].last_used = self.tick;
        self.last_stream = Some((id, s));
        Ok(s)
    }

    /// A stream seen for the first time. Past [`STREAMS_KEPT`] streams, streams that hold nothing
    /// and were not used in the last [`STREAM_IDLE_REQUESTS`] requests are retired first, so host
    /// memory and address space do not grow with the number of streams ever seen.
    #[cold]
    fn new_stream(&mut self, id: StreamId) -> Result<u32> {
        if self.stream_index.len() >= STREAMS_KEPT {
            let before = self.tick.saturating_sub(STREAM_IDLE_REQUESTS);
            self.retire_idle_streams(false, before)?;
        }
        let state = StreamState {
            id,
            small: Heap::new(),
            large: Heap::new(),
            classes: (0..self.classes.len())
                .map(|_| ClassState::default())
                .collect(),
            fence: None,
            fence_seq: 0,
            safe_seq: 0,
            idle_head: PageRef::NONE,
            idle_tail: PageRef::NONE,
            regions: Vec::new(),
            last_used: self.tick,
            retired: false,
        };
        let s = match self.free_streams.pop() {
            Some(s) => {
                self.streams[s as usize] = state;
                s
            }
            None => {
                self.streams.push(state);
                (self.streams.len() - 1) as u32
            }
        };
        self.stream_index.insert(id, s);
        Ok(s)
    }

    /// Retire every stream that holds no live, pending or cached-in-use memory and was last used
    /// before request `before`: its empty current slabs dissolve, its idle pages go to the pool
    /// (only once its fence proves the GPU done with them; with `block`, waiting for it), and its
    /// reservations, page tables and heaps are given back. A stream still in use, or whose idle
    /// pages the GPU may still read, is left as it is.
    fn retire_idle_streams(&mut self, block: bool, before: u64) -> Result<u64> {
        let mut retired = 0;
        for s in 0..self.streams.len() as u32 {
            let st = &self.streams[s as usize];
            if st.retired || st.last_used > before {
                continue;
            }
            if self.retire_stream(s, block)? {
                retired += 1;
            }
        }
        Ok(retired)
    }

    /// Retire stream `s` if it holds nothing; whether it was retired.
    fn retire_stream(&mut self, s: u32, block: bool) -> Result<bool> {
        let holds = |g: &Self| {
            g.streams[s as usize]
                .regions
                .iter()
                .any(|&r| g.regions[r as usize].in_use > 0)
        };
        if holds(self) && !self.streams[s as usize].regions.is_empty() {
            // Only empty current slabs may still hold pages: dissolve them and look again.
            for ci in 0..self.streams[s as usize].classes.len() {
                let cs = &mut self.streams[s as usize].classes[ci];
                if let Some(id) = cs.current
                    && self.slabs[id as usize].is_empty()
                {
                    cs.current = None;
                    self.dissolve_slab(id);
                }
            }
            if holds(self) {
                return Ok(false);
            }
        }
        let tail = self.streams[s as usize].idle_tail;
        if tail != PageRef::NONE {
            let stamp = self.slot(tail).idle_stamp;
            if !self.stream_done_with(s, stamp, block)? {
                return Ok(false);
            }
        }
        let now = Instant::now();
        while self.streams[s as usize].idle_head != PageRef::NONE {
            let page = self.unmap_idle(self.streams[s as usize].idle_head)?;
            self.pool.push((page, now));
        }
        while let Some(&r) = self.streams[s as usize].regions.last() {
            self.drop_region(r)?;
        }
        let st = &mut self.streams[s as usize];
        if let Some(e) = st.fence.take() {
            self.spare_events.push(e);
        }
        let id = st.id;
        *st = StreamState::retired();
        self.stream_index.remove(&id);
        if self.last_stream.is_some_and(|(_, i)| i == s) {
            self.last_stream = None;
        }
        self.free_streams.push(s);
        tracing::debug!(
            device = self.info.ordinal,
            stream = id,
            "idle stream retired"
        );
        Ok(true)
    }

    /// Give back an empty region of its stream: the reservation (or plain segment) to the driver,
    /// its page table and chunk map to the allocator, its slot for reuse. On a driver error the
    /// region stays as it was.
    fn drop_region(&mut self, id: u32) -> Result<()> {
        let r = &self.regions[id as usize];
        debug_assert!(r.in_use == 0 && r.pages.iter().all(|p| p.phys.is_none() || r.plain));
        let (base, len, s, pool, plain) = (r.base, r.len, r.stream, r.pool, r.plain);
        if plain {
            self.release_plain(id)?;
            if self.regions[id as usize].live {
                return Err(internal(format!(
                    "region {id} of stream {s} could not be given back: it still holds blocks"
                )));
            }
        } else {
            if !self.heap(s, pool).remove_region(base, len) {
                return Err(internal(format!(
                    "region {id} of stream {s} is not wholly free in its heap"
                )));
            }
            if let Err(e) = self.dev.free_address(base, len) {
                self.heap(s, pool).add_region(base, len, id);
                return Err(e.into());
            }
            self.forget_region(id);
            self.streams[s as usize].regions.retain(|&r| r != id);
            self.free_regions.push(id);
        }
        Ok(())
    }

    /// Mark region `id` gone: no pages, no chunk map, not found by address.
    fn forget_region(&mut self, id: u32) {
        let r = &mut self.regions[id as usize];
        r.live = false;
        r.pages = Vec::new();
        r.chunks = Vec::new();
        let base = r.base;
        if let Ok(at) = self.region_by_addr.binary_search(&(base, id)) {
            self.region_by_addr.remove(at);
        }
    }

    #[inline]
    fn region_of(&self, ptr: u64) -> Option<u32> {
        let at = self.region_by_addr.partition_point(|&(b, _)| b <= ptr);
        let (_, id) = *self.region_by_addr.get(at.checked_sub(1)?)?;
        let r = &self.regions[id as usize];
        (r.live && ptr < r.base + r.len).then_some(id)
    }

    /// The live allocation starting at `ptr`.
    fn locate(&self, ptr: u64) -> Option<Found> {
        let region = self.region_of(ptr)?;
        match self.regions[region as usize].pool {
            Pool::Small => self
                .small_slot(region, ptr)
                .map(|(id, slot)| Found::Small { id, slot }),
            Pool::Large => self.large.contains_key(&ptr).then_some(Found::Large),
        }
    }

    /// The slab holding `ptr` of small-pool `region`, if any: one chunk-map read.
    #[inline]
    fn slab_at(&self, region: u32, ptr: u64) -> Option<u32> {
        let r = &self.regions[region as usize];
        let id = *r.chunks.get(((ptr - r.base) / CHUNK) as usize)?;
        (id != NO_SLAB).then_some(id)
    }

    /// The live slab slot starting at `ptr`.
    #[inline]
    fn small_slot(&self, region: u32, ptr: u64) -> Option<(u32, usize)> {
        let id = self.slab_at(region, ptr)?;
        Some((id, self.slabs[id as usize].live_slot(ptr)?))
    }

    /// The live allocation containing `ptr` (base pointer and owning stream index), including
    /// those freed but pending.
    fn live_allocation(&self, ptr: u64) -> Option<(u64, u32)> {
        let region = self.region_of(ptr)?;
        match self.regions[region as usize].pool {
            Pool::Small => {
                let id = self.slab_at(region, ptr)?;
                let slab = &self.slabs[id as usize];
                let slot = slab.slot_containing(ptr)?;
                let base = slab.base + slot as u64 * slab.slot_size;
                slab.live_slot(base)?;
                Some((base, slab.stream))
            }
            Pool::Large => {
                let (&base, b) = self.large.range(..=ptr).next_back()?;
                (ptr < base + b.len).then_some((base, b.stream))
            }
        }
    }

    /// Block size of the live allocation at `base`.
    fn block_len(&self, base: u64) -> u64 {
        match self.large.get(&base) {
            Some(b) => b.len,
            None => {
                let region = self.region_of(base).expect("ours");
                let (id, _) = self.small_slot(region, base).expect("live");
                self.slabs[id as usize].slot_size
            }
        }
    }

    // ----- reclaiming -------------------------------------------------------------------------

    fn synchronize_all(&mut self) -> Result<()> {
        self.dev.synchronize()?;
        self.stats.num_sync_all_streams += 1;
        let seq = self.seq;
        for st in &mut self.streams {
            st.safe_seq = seq;
        }
        self.finish_pending(true);
        Ok(())
    }

    /// Wait for all streams; dissolve empty current slabs; unmap every idle page into the pool;
    /// with `release`, give the pool (and idle plain segments) back to the driver.
    fn reclaim(&mut self, release: bool) -> Result<ReclaimReport> {
        self.synchronize_all()?;
        let mut report = ReclaimReport::default();
        for s in 0..self.streams.len() {
            // A retired stream's slot has no classes.
            for ci in 0..self.streams[s].classes.len() {
                let cs = &mut self.streams[s].classes[ci];
                if let Some(id) = cs.current
                    && self.slabs[id as usize].is_empty()
                {
                    cs.current = None;
                    self.dissolve_slab(id);
                    report.slabs_released += 1;
                }
            }
        }
        while let Some(at) = self
            .streams
            .iter()
            .map(|st| st.idle_head)
            .find(|&h| h != PageRef::NONE)
        {
            let page = self.unmap_idle(at)?;
            self.pool.push((page, Instant::now()));
            report.pages_unmapped += 1;
            report.bytes_recovered += self.page;
        }
        if release {
            while let Some((page, _)) = self.pool.pop() {
                self.release_page(page)?;
                report.pages_released += 1;
                report.bytes_released += self.page;
            }
            for id in 0..self.regions.len() as u32 {
                let r = &self.regions[id as usize];
                if r.plain && r.live && r.in_use == 0 {
                    report.pages_released += r.len / self.page;
                    report.bytes_released += r.len;
                    self.release_plain(id)?;
                }
            }
            // Streams left holding nothing give back their reservations and page tables too
            // (their idle pages were unmapped above).
            self.retire_idle_streams(true, u64::MAX)?;
        }
        self.update_inactive_split(Pool::Small);
        self.update_inactive_split(Pool::Large);
        Ok(report)
    }

    /// Give a pooled page back to the driver. If the driver refuses, the page stays in the pool
    /// (still counted as reserved) so a later trim can try again.
    fn release_page(&mut self, page: PageHandle) -> Result<()> {
        if let Err(e) = self.dev.release_page(page) {
            self.pool.push((page, Instant::now()));
            return Err(e.into());
        }
        self.stats.segment.decrease(Pool::Large, 1);
        self.stats
            .reserved_bytes
            .decrease(Pool::Large, self.page as i64);
        self.stats.num_device_free += 1;
        Ok(())
    }

    /// Give a plain segment with no live block back to the driver. If the driver refuses, the
    /// segment stays whole in its stream's heap, still counted, so a later trim can try again.
    fn release_plain(&mut self, id: u32) -> Result<()> {
        let (base, len, s, pool) = {
            let r = &self.regions[id as usize];
            (r.base, r.len, r.stream, r.pool)
        };
        if !self.heap(s, pool).remove_region(base, len) {
            return Ok(());
        }
        if let Err(e) = self.dev.free_plain(base) {
            self.heap(s, pool).add_region(base, len, id);
            return Err(e.into());
        }
        self.forget_region(id);
        self.streams[s as usize].regions.retain(|&r| r != id);
        self.free_regions.push(id);
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, len as i64);
        self.stats.num_device_free += 1;
        Ok(())
    }

    /// Release cached pages until reserved memory is within the limit: the pool first, then idle
    /// mapped pages (each once its stream is done with it, waiting if need be), then empty plain
    /// segments.
    fn trim_to_limit(&mut self) -> Result<()> {
        while self.reserved() > self.limit {
            if let Some((page, _)) = self.pool.pop() {
                self.release_page(page)?;
                continue;
            }
            let idle = (0..self.streams.len() as u32)
                .find(|&s| self.streams[s as usize].idle_head != PageRef::NONE);
            if let Some(s) = idle {
                let at = self.streams[s as usize].idle_head;
                self.stream_done_with(s, self.slot(at).idle_stamp, true)?;
                let page = self.unmap_idle(at)?;
                self.release_page(page)?;
                continue;
            }
            let empty = (0..self.regions.len() as u32).find(|&r| {
                let r = &self.regions[r as usize];
                r.plain && r.live && r.in_use == 0
            });
            match empty {
                Some(r) => {
                    self.release_plain(r)?;
                    if self.regions[r as usize].live {
                        break;
                    }
                }
                None => break,
            }
        }
        self.update_inactive_split(Pool::Small);
        self.update_inactive_split(Pool::Large);
        Ok(())
    }

    /// Release pages idle longer than `release_idle_ms`, if their streams are done with them.
    fn maybe_decay(&mut self) {
        let Some(after) = self.release_idle else {
            return;
        };
        let now = Instant::now();
        if now.duration_since(self.last_decay) < after / 4 {
            return;
        }
        self.last_decay = now;
        let cutoff = (now.duration_since(self.epoch).saturating_sub(after)).as_nanos() as u64;
        for s in 0..self.streams.len() as u32 {
            loop {
                let at = self.streams[s as usize].idle_head;
                if at == PageRef::NONE || self.slot(at).idle_since > cutoff {
                    break;
                }
                // Oldest first: once the stream may still use one, it may use the rest.
                if !matches!(
                    self.stream_done_with(s, self.slot(at).idle_stamp, false),
                    Ok(true)
                ) {
                    break;
                }
                let Ok(page) = self.unmap_idle(at) else { break };
                // A refused release keeps the page in the pool.
                let _ = self.release_page(page);
            }
        }
        let (old, keep): (Vec<_>, Vec<_>) = self
            .pool
            .drain(..)
            .partition(|(_, t)| now.duration_since(*t) >= after);
        self.pool = keep;
        for (page, _) in old {
            // A refused release keeps the page in the pool.
            let _ = self.release_page(page);
        }
    }

    // ----- accounting -------------------------------------------------------------------------

    fn reserved(&self) -> u64 {
        self.stats.reserved_bytes.all().current as u64
    }

    /// Pages mapped under slabs count as small-pool segments, all others as large: a page moving
    /// between them moves between the pools, but the device-wide totals (`all`) are unchanged, so
    /// one page created counts as one segment allocated however often it moves.
    fn move_reserved(&mut self, from: Pool, to: Pool, pages: u64) {
        let bytes = (pages * self.page) as i64;
        self.stats.segment.transfer(from, to, pages as i64);
        self.stats.reserved_bytes.transfer(from, to, bytes);
    }

    /// Free bytes held inside pages (or slabs) that also hold live data, and how many such units.
    fn update_inactive_split(&mut self, pool: Pool) {
        let (bytes, count) = match pool {
            Pool::Small => (
                self.nonempty_slab_bytes as i64 - self.stats.active_bytes.pool(Pool::Small).current,
                self.partial_slabs,
            ),
            Pool::Large => {
                let held = (self.in_use_pages[Pool::Large as usize] * self.page) as i64;
                let free = held - self.stats.active_bytes.pool(Pool::Large).current;
                (free, self.partial_pages)
            }
        };
        set_stat(&mut self.stats.inactive_split_bytes, pool, bytes);
        set_stat(&mut self.stats.inactive_split, pool, count);
    }

    fn extras(&self) -> ArenaExtras {
        let mut classes: Vec<ClassOccupancy> = self
            .classes
            .iter()
            .map(|c| ClassOccupancy {
                size: c.size,
                ..Default::default()
            })
            .collect();
        let mut dead = vec![false; self.slabs.len()];
        for &id in &self.free_slab_ids {
            dead[id as usize] = true;
        }
        for (slab, _) in self.slabs.iter().zip(&dead).filter(|(_, d)| !**d) {
            let c = &mut classes[slab.class as usize];
            c.slabs += 1;
            c.used_slots += slab.used as u64;
            c.total_slots += slab.slots as u64;
        }
        let plain_idle: u64 = self
            .regions
            .iter()
            .filter(|r| r.plain && r.live)
            .map(|r| r.pages.len() as u64 - r.in_use as u64)
            .sum();
        ArenaExtras {
            device_name: self.info.name.clone(),
            capacity: self.info.total_bytes,
            limit: self.limit,
            vmm: self.vmm,
            classes,
            pages: PageCounts {
                page_size: self.page,
                in_use: self.in_use_pages[1] + self.in_use_pages[2],
                idle_mapped: self.idle_len + plain_idle,
                pooled: self.pool.len() as u64,
            },
            driver: self.dev.counters(),
            bad_frees: self.bad_frees,
            pending_frees: self.pending.len() as u64,
        }
    }

    fn oom_message(&self, size: u64) -> String {
        let (free, total) = self
            .dev
            .mem_get_info()
            .unwrap_or((0, self.info.total_bytes));
        let s = &self.stats;
        let reserved = s.reserved_bytes.all().current as u64;
        let allocated = s.allocated_bytes.all().current as u64;
        let idle = self.idle_len * self.page;
        let pooled = self.pool.len() as u64 * self.page;
        let split = s.inactive_split_bytes.all().current.max(0) as u64;
        let allowed = if self.fraction < 1.0 {
            format!(
                " Of the allowed {} (memory fraction),",
                format_size(self.limit)
            )
        } else {
            String::new()
        };
        format!(
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is \
             free.{allowed} torch-arena holds {} reserved: {} allocated to live tensors ({} requested), \
             {} cached ({} in idle mapped pages, {} in unmapped pages) and {} free inside partially \
             used pages ({:.1}% fragmentation). Live allocations: {}.",
            format_size(size),
            self.info.ordinal,
            format_size(total),
            format_size(free),
            format_size(reserved),
            format_size(allocated),
            format_size(s.requested_bytes.all().current as u64),
            format_size(idle + pooled),
            format_size(idle),
            format_size(pooled),
            format_size(split),
            if reserved > 0 {
                split as f64 * 100.0 / reserved as f64
            } else {
                0.0
            },
            s.allocation.all().current,
        )
    }

    // ----- checking ---------------------------------------------------------------------------

    fn check_consistency(&self) -> std::result::Result<(), String> {
        // Pages: users match live blocks and slabs; idle list matches mapped unused pages.
        let mut users: HashMap<(u32, u32), u32> = HashMap::new();
        for (&addr, b) in &self.large {
            let base = self.regions[b.region as usize].base;
            for p in (addr - base) / self.page..=(addr + b.len - 1 - base) / self.page {
                *users.entry((b.region, p as u32)).or_default() += 1;
            }
        }
        let dead: std::collections::HashSet<u32> = self.free_slab_ids.iter().copied().collect();
        let mut allocated = [0i64; 3];
        let mut requested = [0i64; 3];
        for (id, slab) in self.slabs.iter().enumerate() {
            if dead.contains(&(id as u32)) {
                continue;
            }
            let (first, last) = self.pages_of(slab.region, slab.base, slab.span);
            for p in first..=last {
                *users.entry((slab.region, p)).or_default() += 1;
            }
        }
        self.check_slab_map(&dead)?;
        self.check_stream_regions()?;
        for (ri, r) in self.regions.iter().enumerate().filter(|(_, r)| r.live) {
            for (pi, slot) in r.pages.iter().enumerate() {
                let want = users.get(&(ri as u32, pi as u32)).copied().unwrap_or(0);
                if slot.users != want {
                    return Err(format!(
                        "region {ri} page {pi}: {} users recorded, {want} found",
                        slot.users
                    ));
                }
                if want > 0 && !r.plain && slot.phys.is_none() {
                    return Err(format!("region {ri} page {pi} is used but not mapped"));
                }
                let idle = !r.plain && want == 0 && slot.phys.is_some();
                if idle != (slot.idle_stamp != 0) {
                    return Err(format!("region {ri} page {pi}: idle list out of step"));
                }
            }
        }
        for b in self.large.values().filter(|b| !b.pending) {
            allocated[2] += b.len as i64;
            requested[2] += b.requested as i64;
        }
        for (id, slab) in self.slabs.iter().enumerate() {
            if dead.contains(&(id as u32)) {
                continue;
            }
            for slot in 0..slab.slots as usize {
                let ptr = slab.base + slot as u64 * slab.slot_size;
                if slab.live_slot(ptr).is_some() && !self.pending_ptrs.contains_key(&ptr) {
                    allocated[1] += slab.slot_size as i64;
                    requested[1] += slab.requested(slot) as i64;
                }
            }
        }
        for pool in [Pool::Small, Pool::Large] {
            let i = pool as usize;
            if self.stats.allocated_bytes.pool(pool).current != allocated[i] {
                return Err(format!(
                    "{pool:?}: allocated_bytes {} but live blocks sum to {}",
                    self.stats.allocated_bytes.pool(pool).current,
                    allocated[i]
                ));
            }
            if self.stats.requested_bytes.pool(pool).current != requested[i] {
                return Err(format!(
                    "{pool:?}: requested_bytes {} but live requests sum to {}",
                    self.stats.requested_bytes.pool(pool).current,
                    requested[i]
                ));
            }
        }
        // The idle list: linked both ways, stamps rising from head to tail, length as counted,
        // and holding exactly the pages marked idle (checked page by page above).
        let mut n = 0u64;
        for (si, st) in self.streams.iter().enumerate() {
            let (mut at, mut prev, mut last) = (st.idle_head, PageRef::NONE, 0u64);
            while at != PageRef::NONE {
                let slot = self.slot(at);
                if slot.idle_prev != prev
                    || slot.idle_stamp <= last
                    || self.regions[at.region as usize].stream != si as u32
                {
                    return Err(format!("stream {si}'s idle list broken at {at:?}"));
                }
                (prev, last, n) = (at, slot.idle_stamp, n + 1);
                at = slot.idle_next;
            }
            if prev != st.idle_tail {
                return Err(format!("stream {si}'s idle list tail is wrong"));
            }
        }
        let marked = self
            .regions
            .iter()
            .filter(|r| r.live)
            .flat_map(|r| &r.pages)
            .filter(|s| s.idle_stamp != 0)
            .count() as u64;
        if n != self.idle_len || n != marked {
            return Err(format!(
                "idle list holds {n} pages, counts {}, {marked} pages are marked idle",
                self.idle_len
            ));
        }
        let partial = self
            .regions
            .iter()
            .filter(|r| r.live && r.pool == Pool::Large)
            .flat_map(|r| &r.pages)
            .filter(|s| s.users > 0 && s.covered < self.page)
            .count() as i64;
        if partial != self.partial_pages {
            return Err(format!(
                "{} partial pages counted, {partial} found",
                self.partial_pages
            ));
        }
        // Reserved = physical pages held.
        let mapped: u64 = self
            .regions
            .iter()
            .filter(|r| r.live && !r.plain)
            .flat_map(|r| &r.pages)
            .filter(|s| s.phys.is_some())
            .count() as u64;
        let plain: u64 = self
            .regions
            .iter()
            .filter(|r| r.live && r.plain)
            .map(|r| r.len)
            .sum();
        let held = (mapped + self.pool.len() as u64) * self.page + plain;
        if self.reserved() != held {
            return Err(format!(
                "reserved_bytes {} but {} bytes of pages are held",
                self.reserved(),
                held
            ));
        }
        if self.reserved() > self.limit {
            return Err(format!(
                "reserved_bytes {} over the limit {}",
                self.reserved(),
                self.limit
            ));
        }
        Ok(())
    }

    /// Every live region is listed by its stream, which is not retired; every listed region is
    /// live and owned by the stream listing it; retired slots hold nothing and are not indexed.
    fn check_stream_regions(&self) -> std::result::Result<(), String> {
        for (si, st) in self.streams.iter().enumerate() {
            if st.retired {
                if !st.regions.is_empty() || st.idle_head != PageRef::NONE {
                    return Err(format!(
                        "retired stream slot {si} still holds regions or pages"
                    ));
                }
                if self.stream_index.values().any(|&s| s as usize == si) {
                    return Err(format!("retired stream slot {si} is still indexed"));
                }
                continue;
            }
            if self.stream_index.get(&st.id) != Some(&(si as u32)) {
                return Err(format!("stream slot {si} ({:#x}) is not indexed", st.id));
            }
            for &r in &st.regions {
                let reg = &self.regions[r as usize];
                if !reg.live || reg.stream != si as u32 {
                    return Err(format!(
                        "stream {si} lists region {r}, which is not its own"
                    ));
                }
            }
        }
        for (ri, r) in self.regions.iter().enumerate().filter(|(_, r)| r.live) {
            let st = &self.streams[r.stream as usize];
            if st.retired || !st.regions.contains(&(ri as u32)) {
                return Err(format!(
                    "region {ri} is not listed by its stream {}",
                    r.stream
                ));
            }
        }
        Ok(())
    }

    /// The chunk map and the live slabs agree: every chunk of a live slab maps to it, every
    /// mapped chunk lies inside the live slab it names (so slabs never overlap), slab geometry
    /// matches its class, and the bytes of non-empty slabs are as counted.
    fn check_slab_map(
        &self,
        dead: &std::collections::HashSet<u32>,
    ) -> std::result::Result<(), String> {
        let mut nonempty = 0u64;
        for (id, slab) in self.slabs.iter().enumerate() {
            if dead.contains(&(id as u32)) {
                continue;
            }
            let class = self.classes.get(slab.class as usize);
            let r = &self.regions[slab.region as usize];
            if !r.live || r.pool != Pool::Small || r.stream != slab.stream {
                return Err(format!(
                    "slab {id} lies in region {} of another kind",
                    slab.region
                ));
            }
            if slab.span != class.span
                || slab.slots != class.slots
                || slab.slot_size != class.size
                || !(slab.base - r.base).is_multiple_of(CHUNK)
                || slab.base + slab.span > r.base + r.len
            {
                return Err(format!(
                    "slab {id} at {:#x}: geometry out of step",
                    slab.base
                ));
            }
            let c0 = ((slab.base - r.base) / CHUNK) as usize;
            for c in c0..c0 + (slab.span / CHUNK) as usize {
                if r.chunks.get(c) != Some(&(id as u32)) {
                    return Err(format!(
                        "slab {id}: chunk {c} of region {} maps to {:?}",
                        slab.region,
                        r.chunks.get(c)
                    ));
                }
            }
            if slab.used > 0 {
                nonempty += slab.span;
            }
        }
        for (ri, r) in self.regions.iter().enumerate().filter(|(_, r)| r.live) {
            if r.pool != Pool::Small && !r.chunks.is_empty() {
                return Err(format!("large-pool region {ri} has a chunk map"));
            }
            for (c, &id) in r
                .chunks
                .iter()
                .enumerate()
                .filter(|(_, id)| **id != NO_SLAB)
            {
                let addr = r.base + c as u64 * CHUNK;
                let ok = self.slabs.get(id as usize).is_some_and(|slab| {
                    !dead.contains(&id)
                        && slab.region == ri as u32
                        && slab.base <= addr
                        && addr < slab.base + slab.span
                });
                if !ok {
                    return Err(format!(
                        "region {ri} chunk {c} maps to slab {id}, which is not there"
                    ));
                }
            }
        }
        if nonempty != self.nonempty_slab_bytes {
            return Err(format!(
                "non-empty slabs span {nonempty} bytes, {} counted",
                self.nonempty_slab_bytes
            ));
        }
        Ok(())
    }
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

/// PyTorch's `format_size`: "512 bytes", "1.50 KiB", "20.00 MiB", "3.25 GiB".
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2} {}", UNITS[i])
}
