//! The track layer: who holds what.
//!
//! [`Tracker`] wraps the arenas the way an RMM resource adaptor wraps a memory resource: the
//! allocator ([`crate::allocator::TorchArena`]) calls it around every arena malloc and free; the
//! arena knows nothing of it.
//!
//! # What is kept, always (cheap)
//!
//! Per live allocation an [`Entry`]: block size (rounded as the arena rounds), requested size,
//! stream, thread (a small per-thread number from a thread-local), sequence number (a global
//! counter), time (µs since the tracker started, from `CLOCK_MONOTONIC_COARSE`: a vDSO read of a
//! clock with the resolution of a kernel tick), step, tag (the innermost tag of the allocating
//! thread's stack, interned) and site (0 when not captured). The live table is per device and
//! split into [`SHARDS`] open-addressing tables (`crate::ptr_table`), each behind its own spin
//! lock: [`GROUPS`] groups, one per stream in order of first use as the arena's shards are
//! (`crate::route`), each split by pointer in two. A thread allocating and freeing on its own
//! stream therefore writes only its group's locks and tables: split by pointer alone, every
//! thread wrote every shard, and each request waited for cache lines another core had written
//! (4 threads through the C ABI: 1.23x one thread's pairs per second before, 1.56x after,
//! BENCHMARKS.md, "Threads"). PyTorch frees on the allocation's stream; a free given another stream, and a
//! lookup by pointer alone (`record_stream`, [`Tracker::entry`]), look in every group. Per-site
//! live bytes and counts (for leak judgement) are touched only for allocations that have a
//! site.
//!
//! # Steps
//!
//! [`Tracker::step`] advances the step and records, per device, every site's live bytes and
//! count at that boundary into a ring of the last [`MAX_BOUNDARIES`]. [`leaks`] judges the
//! series.
//!
//! # Sites
//!
//! [`sites`]: captured in the allocator before the arena lock is taken, and never while a tracker
//! lock is held (capturing Python frames takes the GIL).
//!
//! # Locks
//!
//! Tracker locks (shards, per-site counters, boundaries, history, tags, interner) are leaves:
//! nothing else is locked while one is held, and none is held while the GIL is requested. The
//! only nesting is GIL → interner (inside [`sites::capture_python`]).
//!
//! # History
//!
//! An optional bounded ring per device (`torch_arena_history_enable`): `alloc`,
//! `free_requested`, `free_completed` (emitted at the free; `"pending":true` when the allocation
//! was used on other streams through `record_stream`, whose memory becomes reusable only once
//! those streams' events complete, later), and `segment_map` / `segment_unmap` when the device's
//! reserved bytes changed across that malloc or free (`addr` = the allocation's address for a
//! map, 0 for an unmap; `size` = the change). Reserved bytes change elsewhere too (`empty_cache`,
//! idle-page release): those changes are not in the ring.
//! Entries are stamped at microsecond resolution ([`Tracker::precise_us`]; the live table keeps
//! the coarse clock). `free_requested` / `free_completed` carry the free's own site (its stack,
//! captured at the free, for allocations whose site was captured, while capture is on), else
//! the allocation's.

mod attribution;
pub mod leaks;
mod report;
pub mod sites;
mod spin;

use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};

use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use crate::block::Block;
use crate::config::{Config, SitesMode};
use crate::device::{DevPtr, MAX_DEVICES, StreamId};
use crate::json;
use crate::ptr_table::{PtrTable, Vacant};
use crate::route::Router;
use leaks::Point;
use sites::{Frame, Interner, SITES_NATIVE, SITES_PYTHON, Symbolizer};
use spin::SpinLock;

/// One shard of the live table: at most an eighth full (`ptr_table`'s module doc says why).
type Table = PtrTable<Entry, 8>;

/// Live-table groups per device: stream `i` in order of first use goes to group `i % GROUPS`,
/// as it goes to the arena's shard `i % 8`.
pub const GROUPS: usize = crate::route::MIN_PARTS;
/// Live-table shards per group, by pointer: two threads on one stream meet on one lock half
/// as often.
const PER_GROUP: usize = 2;
/// Live-table shards per device.
pub const SHARDS: usize = GROUPS * PER_GROUP;
/// Step boundaries kept per device.
pub const MAX_BOUNDARIES: usize = 256;
/// History entries kept when `torch_arena_history_enable` is given 0.
pub const DEFAULT_HISTORY: u64 = 100_000;
/// Most allocations listed under "old" in the leak report (the count says how many there were).
pub const MAX_OLD: usize = 1000;
/// Example sizes and pointers per growing site.
const EXAMPLES: usize = 5;
/// Distinct tags listed per growing site.
const MAX_TAGS: usize = 8;

/// A multiplicative hasher for pointer keys: pointers are 512-byte aligned, so the low bits are
/// dropped first and the product folded, giving both hashbrown's bucket bits (low) and control
/// bits (high) variety. No DoS concern: keys are our own pointers.
#[derive(Default, Clone, Copy)]
struct PtrHasher(u64);

impl Hasher for PtrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        let x = (n >> 9).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 32);
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.write_u64((n as u64) << 9);
    }
}

type PtrMap<K, V> = HashMap<K, V, BuildHasherDefault<PtrHasher>>;

/// One live allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// Block size (the request rounded as the arena rounds it).
    pub size: u64,
    pub requested: u64,
    pub stream: StreamId,
    pub seq: u64,
    pub time_us: u64,
    pub step: u64,
    pub thread: u32,
    /// Interned tag id (0 = none).
    pub tag: u32,
    /// Site id (0 = not captured).
    pub site: u32,
    /// `record_stream` named another stream for it.
    pub recorded: bool,
}

/// An unused entry of the live table links the next through its `seq`.
impl Vacant for Entry {
    fn vacant(next: u32) -> Self {
        Entry {
            seq: next.into(),
            ..Entry::default()
        }
    }
    fn next_vacant(&self) -> u32 {
        self.seq as u32
    }
}

/// A shard of the live table, on its own cache line.
#[repr(align(64))]
#[derive(Default)]
struct Shard(SpinLock<Table>);

/// Live bytes and count of one site.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SiteLive {
    bytes: u64,
    count: u64,
}

/// Every site's live bytes and count at one step boundary.
struct Boundary {
    step: u64,
    sites: Vec<(u32, SiteLive)>,
}

/// What a history entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentMap,
    SegmentUnmap,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentMap => "segment_map",
            Action::SegmentUnmap => "segment_unmap",
        }
    }
}

/// One history entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistEntry {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: StreamId,
    pub time_us: u64,
    pub site: u32,
    /// `free_completed` of an allocation used on other streams: its memory is reusable only once
    /// their events complete.
    pub pending: bool,
}

/// The tracking state of one device.
struct DeviceTrack {
    shards: Box<[Shard]>,
    router: Router,
    site_live: Mutex<PtrMap<u32, SiteLive>>,
    boundaries: Mutex<VecDeque<Boundary>>,
    history: Mutex<VecDeque<HistEntry>>,
}

impl DeviceTrack {
    fn new() -> Self {
        DeviceTrack {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            router: Router::new(),
            site_live: Mutex::new(PtrMap::default()),
            boundaries: Mutex::new(VecDeque::new()),
            history: Mutex::new(VecDeque::new()),
        }
    }

    /// The shard for `ptr` allocated on `stream`.
    #[inline]
    fn shard(&self, stream: StreamId, ptr: DevPtr) -> &SpinLock<Table> {
        // The first stream (the usual one) first: one comparison.
        // A thread with a part of its own for the stream (`route::contended`, found at the
        // arena's lock) has its own group too.
        let group = match self.router.first(stream) {
            true => crate::route::own_offset(stream),
            false => self.router.part(stream, GROUPS),
        };
        &self.shards[group * PER_GROUP + Self::within(ptr)].0
    }

    /// Which of its group's shards holds `ptr`.
    #[inline]
    fn within(ptr: DevPtr) -> usize {
        let h = (ptr >> 9).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> (64 - PER_GROUP.trailing_zeros())) as usize
    }

    /// The shards that may hold `ptr` whatever its stream: one in each group.
    fn each_for(&self, ptr: DevPtr) -> impl Iterator<Item = &SpinLock<Table>> {
        let within = Self::within(ptr);
        (0..GROUPS).map(move |g| &self.shards[g * PER_GROUP + within].0)
    }

    /// Take `ptr`'s entry out: from its stream's shard, else (a free given another stream than
    /// the allocation's, or a pointer that is not live) from whichever shard holds it.
    #[inline]
    fn remove(&self, stream: StreamId, ptr: DevPtr) -> Option<Entry> {
        let shard = self.shard(stream, ptr);
        let found = shard.lock().remove(ptr);
        if found.is_some() {
            return found;
        }
        self.remove_anywhere(shard, ptr)
    }

    #[cold]
    fn remove_anywhere(&self, tried: &SpinLock<Table>, ptr: DevPtr) -> Option<Entry> {
        self.each_for(ptr)
            .filter(|s| !std::ptr::eq(*s, tried))
            .find_map(|s| s.lock().remove(ptr))
    }

    fn site_add(&self, site: u32, bytes: u64, add: bool) {
        let mut g = self.site_live.lock();
        if add {
            let s = g.entry(site).or_default();
            s.bytes += bytes;
            s.count += 1;
        } else if let Some(s) = g.get_mut(&site) {
            s.bytes = s.bytes.saturating_sub(bytes);
            s.count = s.count.saturating_sub(1);
            if s.count == 0 {
                g.remove(&site);
            }
        }
    }

    /// Every live entry, oldest first.
    fn entries(&self) -> Vec<(DevPtr, Entry)> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            let t = s.0.lock();
            out.reserve(t.len());
            out.extend(t.iter().map(|(p, &e)| (p, e)));
        }
        out.sort_unstable_by_key(|(_, e)| e.seq);
        out
    }
}

/// Site capture settings, changeable at run time.
struct SiteSettings {
    /// [`SITES_PYTHON`] | [`SITES_NATIVE`].
    mode: AtomicU8,
    every: AtomicU64,
    min_bytes: AtomicU64,
}

/// Interned tags: id - 1 indexes `names`. The stacks of pushed tags are per thread
/// ([`Here::tags`]).
#[derive(Default)]
struct Tags {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

/// What the tracker keeps per thread, in one thread-local: in the cdylib PyTorch loads each
/// thread-local is found by a call (`__tls_get_addr`, about 11 instructions), and every
/// allocation reads both the thread's number and its tags.
struct Here {
    /// This thread's number (0 = not yet given one).
    number: Cell<u32>,
    /// Allocations this thread has seen while sampling sites (for `sites_every`).
    sample: Cell<u64>,
    /// This thread's pushed tags, innermost last, each with the id of the tracker it was
    /// pushed on (tests build many trackers in one process; a tracker sees only its own).
    /// Per thread, so two threads' blocks never swap labels; an allocation made on a thread
    /// with no tag pushed (an autograd worker) carries none.
    tags: std::cell::RefCell<Vec<(u64, u32)>>,
}

thread_local! {
    static HERE: Here = const {
        Here {
            number: Cell::new(0),
            sample: Cell::new(0),
            tags: std::cell::RefCell::new(Vec::new()),
        }
    };
}
static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);

impl Here {
    /// This thread's number, given at its first call.
    #[inline]
    fn number(&self) -> u32 {
        let n = self.number.get();
        if n != 0 {
            return n;
        }
        let n = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
        self.number.set(n);
        n
    }

    /// The innermost tag tracker `me` pushed on this thread (0: none).
    #[inline]
    fn tag(&self, me: u64) -> u32 {
        self.tags.try_borrow().map_or(0, |s| {
            s.iter()
                .rev()
                .find(|&&(t, _)| t == me)
                .map_or(0, |&(_, id)| id)
        })
    }
}
static NEXT_TRACKER: AtomicU64 = AtomicU64::new(1);

/// A small number for the calling thread (1, 2, ...; 0 while the thread is being torn down).
#[inline]
pub fn thread_number() -> u32 {
    HERE.try_with(Here::number).unwrap_or(0)
}

/// Microseconds of `CLOCK_MONOTONIC_COARSE`.
#[inline]
fn coarse_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec; the coarse clock exists on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

/// The tracker of one allocator: live tables per device, steps, tags, sites, history.
pub struct Tracker {
    enabled: bool,
    devices: Box<[OnceCell<DeviceTrack>]>,
    step: AtomicU64,
    /// Serialises [`Tracker::step`] so boundaries are recorded in order.
    step_lock: Mutex<()>,
    /// This tracker's key in each thread's tag stack ([`Here::tags`]).
    id: u64,
    tags: Mutex<Tags>,
    settings: SiteSettings,
    interner: Interner,
    symbols: Symbolizer,
    epoch_us: u64,
    history_on: AtomicBool,
    history_cap: AtomicU64,
}

/// The bits of a `sites` mode.
pub fn mode_bits(m: SitesMode) -> u8 {
    match m {
        SitesMode::None => 0,
        SitesMode::Python => SITES_PYTHON,
        SitesMode::Native => SITES_NATIVE,
        SitesMode::All => SITES_PYTHON | SITES_NATIVE,
    }
}

impl Tracker {
    /// A tracker with the site settings of `conf` (`sites`, `sites_every`, `sites_min_kb`;
    /// `leaks:True` alone means Python sites).
    pub fn new(conf: &Config) -> Self {
        let t = Self::build(true);
        t.settings
            .mode
            .store(mode_bits(conf.effective_sites()), Ordering::Relaxed);
        t.settings
            .every
            .store(conf.sites_every.max(1), Ordering::Relaxed);
        t.settings
            .min_bytes
            .store(conf.sites_min_kb.saturating_mul(1024), Ordering::Relaxed);
        t
    }

    /// A tracker that records nothing (for measuring tracking's cost: every hook returns at
    /// once, every report is empty).
    pub fn disabled() -> Self {
        Self::build(false)
    }

    fn build(enabled: bool) -> Self {
        Tracker {
            enabled,
            devices: (0..MAX_DEVICES).map(|_| OnceCell::new()).collect(),
            step: AtomicU64::new(0),
            step_lock: Mutex::new(()),
            id: NEXT_TRACKER.fetch_add(1, Ordering::Relaxed),
            tags: Mutex::new(Tags::default()),
            settings: SiteSettings {
                mode: AtomicU8::new(0),
                every: AtomicU64::new(1),
                min_bytes: AtomicU64::new(0),
            },
            interner: Interner::default(),
            symbols: Symbolizer::default(),
            epoch_us: coarse_us(),
            history_on: AtomicBool::new(false),
            history_cap: AtomicU64::new(DEFAULT_HISTORY),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    #[inline]
    fn device(&self, device: i32) -> Option<&DeviceTrack> {
        let slot = self.devices.get(usize::try_from(device).ok()?)?;
        Some(slot.get_or_init(DeviceTrack::new))
    }

    #[inline]
    fn device_if_open(&self, device: i32) -> Option<&DeviceTrack> {
        self.devices.get(usize::try_from(device).ok()?)?.get()
    }

    /// Microseconds since this tracker started (coarse clock: a few ms resolution).
    #[inline]
    pub fn now_us(&self) -> u64 {
        coarse_us().saturating_sub(self.epoch_us)
    }

    /// Microseconds since the tracker started, at microsecond resolution (`CLOCK_MONOTONIC`:
    /// the history ring's clock, read only while it records).
    pub fn precise_us(&self) -> u64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec; CLOCK_MONOTONIC exists on every Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        (ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000).saturating_sub(self.epoch_us)
    }

    // ----- steps and tags ---------------------------------------------------------------------

    /// Whether history is on (the allocator then reads reserved bytes around each call).
    #[inline]
    /// Makes the tracking state of `device` (the process-wide allocator does it when it opens the
    /// device's arena, under [`crate::fork::OPENING`], so no fork child finds it half made).
    pub fn open_device(&self, device: i32) {
        let _ = self.device(device);
    }

    // ----- fork (crate::fork) -------------------------------------------------------------------

    /// Before `fork()`: takes every lock of the tracker (the step lock, which is held while the
    /// site table and boundaries are, first; the others are leaves), and the site tables' and
    /// the symbol cache's.
    pub fn fork_prepare(&self) {
        crate::fork::hold(&self.step_lock);
        crate::fork::hold(&self.tags);
        for d in self.devices.iter().filter_map(OnceCell::get) {
            crate::fork::hold(&d.site_live);
            crate::fork::hold(&d.boundaries);
            crate::fork::hold(&d.history);
            for s in d.shards.iter() {
                s.0.hold();
            }
        }
        self.interner.fork_prepare();
        self.symbols.fork_prepare();
        sites::fork_prepare();
    }

    /// After `fork()`, in the parent (`child` false) or the child: gives back what
    /// [`Tracker::fork_prepare`] took.
    ///
    /// # Safety
    /// Once after each [`Tracker::fork_prepare`], on the same thread.
    pub unsafe fn fork_release(&self, child: bool) {
        // SAFETY: each was held by `fork_prepare` on this thread (the caller's contract).
        unsafe {
            sites::fork_release(child);
            self.symbols.fork_release(child);
            self.interner.fork_release(child);
            for d in self.devices.iter().filter_map(OnceCell::get) {
                for s in d.shards.iter() {
                    s.0.release();
                }
                crate::fork::release(&d.history, child);
                crate::fork::release(&d.boundaries, child);
                crate::fork::release(&d.site_live, child);
            }
            crate::fork::release(&self.tags, child);
            crate::fork::release(&self.step_lock, child);
        }
    }

    pub fn history_enabled(&self) -> bool {
        self.history_on.load(Ordering::Relaxed)
    }

    /// A new live allocation: `block` (as the arena handed it out: its size and number) for a
    /// request of `requested` bytes on `stream`, with `site`. `reserved` = the device's reserved
    /// bytes before the call and a way to read them after (given only while history is on).
    #[inline]
    pub fn on_alloc(
        &self,
        device: i32,
        block: Block,
        requested: u64,
        stream: StreamId,
        site: u32,
        reserved: Option<(u64, &dyn Fn() -> u64)>,
    ) {
        if !self.enabled {
            return;
        }
        let Some(d) = self.device(device) else { return };
        let Block { ptr, size, seq } = block;
        let time_us = self.now_us();
        let (thread, tag) = self.thread_and_tag();
        let e = Entry {
            size,
            requested,
            stream,
            seq,
            time_us,
            step: self.step.load(Ordering::Relaxed),
            thread,
            tag,
            site,
            recorded: false,
        };
        // An allocator never hands out address 0, the one key the table refuses.
        let _ = d.shard(stream, ptr).lock().insert(ptr, e);
        if site != 0 {
            d.site_add(site, size, true);
        }
        if let Some((before, after)) = reserved {
            let after = after();
            // The history's clock has microsecond resolution (the live table's is coarse).
            let time_us = self.precise_us();
            let mut h = Vec::with_capacity(2);
            if after > before {
                h.push(HistEntry {
                    action: Action::SegmentMap,
                    addr: ptr,
                    size: after - before,
                    stream,
                    time_us,
                    site,
                    pending: false,
                });
            }
            h.push(HistEntry {
                action: Action::Alloc,
                addr: ptr,
                size,
                stream,
                time_us,
                site,
                pending: false,
            });
            self.push_history(d, &h);
        }
    }

    /// Before the arena frees `ptr`, given `stream` (the allocation's, as PyTorch passes it):
    /// take its entry out of the live table (so that a new allocation at the same address, on
    /// another thread, is never removed by this free).
    #[inline]
    pub fn take(&self, device: i32, ptr: DevPtr, stream: StreamId) -> Option<Entry> {
        if !self.enabled {
            return None;
        }
        self.device_if_open(device)?.remove(stream, ptr)
    }

    /// After the arena's free of `ptr`: `freed` says whether the arena freed it (a size mismatch
    /// frees; an unknown pointer or a double free does not, and the entry goes back).
    #[inline]
    pub fn on_free(
        &self,
        device: i32,
        ptr: DevPtr,
        taken: Option<Entry>,
        freed: bool,
        stream: StreamId,
        reserved: Option<(u64, &dyn Fn() -> u64)>,
    ) {
        let Some(e) = taken else { return };
        let Some(d) = self.device_if_open(device) else {
            return;
        };
        if !freed {
            let _ = d.shard(e.stream, ptr).lock().insert(ptr, e);
            return;
        }
        if e.site != 0 {
            d.site_add(e.site, e.size, false);
        }
        if let Some((before, after)) = reserved {
            let after = after();
            let time_us = self.precise_us();
            // The free's own stack for an allocation whose site was captured (its sampling
            // decision stands for the free; no lock of ours is held here, so taking the GIL is
            // allowed), else the allocation's.
            let mode = self.settings.mode.load(Ordering::Relaxed);
            let site = match (e.site, mode) {
                (0, _) | (_, 0) => e.site,
                _ => match self.capture_now(mode) {
                    0 => e.site,
                    s => s,
                },
            };
            let base = HistEntry {
                action: Action::FreeRequested,
                addr: ptr,
                size: e.size,
                stream,
                time_us,
                site,
                pending: false,
            };
            let mut h = vec![
                base,
                HistEntry {
                    action: Action::FreeCompleted,
                    pending: e.recorded,
                    ..base
                },
            ];
            if after < before {
                h.push(HistEntry {
                    action: Action::SegmentUnmap,
                    addr: 0,
                    size: before - after,
                    site: 0,
                    ..base
                });
            }
            self.push_history(d, &h);
        }
    }

    /// `record_stream` named another stream for the allocation at `base`.
    pub fn note_record_stream(&self, base: DevPtr) {
        if !self.enabled {
            return;
        }
        for d in self.devices.iter().filter_map(OnceCell::get) {
            for shard in d.each_for(base) {
                if let Some(e) = shard.lock().get_mut(base) {
                    e.recorded = true;
                    return;
                }
            }
        }
    }

    /// The live entry at `ptr` on `device`.
    pub fn entry(&self, device: i32, ptr: DevPtr) -> Option<Entry> {
        self.device_if_open(device)?
            .each_for(ptr)
            .find_map(|s| s.lock().get(ptr).copied())
    }

    /// Every live allocation of `device`, oldest first.
    pub fn live(&self, device: i32) -> Vec<(DevPtr, Entry)> {
        self.device_if_open(device)
            .map(DeviceTrack::entries)
            .unwrap_or_default()
    }

    /// Live bytes and count of `site` on `device`.
    pub fn site_live(&self, device: i32, site: u32) -> (u64, u64) {
        self.device_if_open(device)
            .and_then(|d| d.site_live.lock().get(&site).map(|s| (s.bytes, s.count)))
            .unwrap_or((0, 0))
    }

    // ----- history ----------------------------------------------------------------------------

    /// Start (clearing it) or stop the history ring; `max_entries` 0 = [`DEFAULT_HISTORY`].
    pub fn history_enable(&self, enabled: bool, max_entries: u64) {
        if !self.enabled {
            return;
        }
        let cap = if max_entries == 0 {
            DEFAULT_HISTORY
        } else {
            max_entries
        };
        self.history_cap.store(cap, Ordering::Relaxed);
        if enabled {
            for d in self.devices.iter().filter_map(OnceCell::get) {
                d.history.lock().clear();
            }
        }
        self.history_on.store(enabled, Ordering::SeqCst);
    }

    fn push_history(&self, d: &DeviceTrack, entries: &[HistEntry]) {
        let cap = self.history_cap.load(Ordering::Relaxed).max(1) as usize;
        let mut h = d.history.lock();
        for e in entries {
            while h.len() >= cap {
                h.pop_front();
            }
            h.push_back(*e);
        }
    }

    /// The history of `device`, oldest first.
    pub fn history(&self, device: i32) -> Vec<HistEntry> {
        self.device_if_open(device)
            .map(|d| d.history.lock().iter().copied().collect())
            .unwrap_or_default()
    }
}
