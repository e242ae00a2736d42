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
//! thread's stack, interned) and site (0 when not captured). The live table is per device and sharded by
//! pointer into [`SHARDS`] maps, each behind its own `parking_lot::Mutex`, with a multiplicative
//! hasher: threads freeing different pointers rarely meet on a lock. Per-site live bytes and
//! counts (for leak judgement) are touched only for allocations that have a site.
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

pub mod json;
pub mod leaks;
pub mod sites;
mod spin;

use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};

use once_cell::sync::OnceCell;
use parking_lot::Mutex;

use crate::allocator::MAX_DEVICES;
use crate::arena::{Layout, MAX_SMALL, MIN_BLOCK, SizeClasses};
use crate::config::{Config, SitesMode};
use crate::device::{DevPtr, StreamId};
use leaks::Point;
use sites::{Frame, Interner, SITES_NATIVE, SITES_PYTHON, Symbolizer};
use spin::SpinLock;

/// Live-table shards per device.
pub const SHARDS: usize = 64;
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// A shard of the live table, on its own cache line.
#[repr(align(64))]
#[derive(Default)]
struct Shard(SpinLock<PtrMap<DevPtr, Entry>>);

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
    site_live: Mutex<PtrMap<u32, SiteLive>>,
    boundaries: Mutex<VecDeque<Boundary>>,
    history: Mutex<VecDeque<HistEntry>>,
}

impl DeviceTrack {
    fn new() -> Self {
        DeviceTrack {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            site_live: Mutex::new(PtrMap::default()),
            boundaries: Mutex::new(VecDeque::new()),
            history: Mutex::new(VecDeque::new()),
        }
    }

    #[inline]
    fn shard(&self, ptr: DevPtr) -> &SpinLock<PtrMap<DevPtr, Entry>> {
        let h = (ptr >> 9).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        &self.shards[(h >> (64 - SHARDS.trailing_zeros())) as usize].0
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
            out.extend(s.0.lock().iter().map(|(&p, &e)| (p, e)));
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
/// ([`TAG_STACK`]).
#[derive(Default)]
struct Tags {
    ids: HashMap<String, u32>,
    names: Vec<String>,
}

thread_local! {
    /// This thread's number (0 = not yet given one).
    static THREAD: Cell<u32> = const { Cell::new(0) };
    /// Allocations this thread has seen while sampling sites (for `sites_every`).
    static SAMPLE: Cell<u64> = const { Cell::new(0) };
    /// This thread's pushed tags, innermost last, each with the id of the tracker it was
    /// pushed on (tests build many trackers in one process; a tracker sees only its own).
    /// Per thread, so two threads' blocks never swap labels; an allocation made on a thread
    /// with no tag pushed (an autograd worker) carries none.
    static TAG_STACK: std::cell::RefCell<Vec<(u64, u32)>> = const { std::cell::RefCell::new(Vec::new()) };
}
static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);
static NEXT_TRACKER: AtomicU64 = AtomicU64::new(1);

/// A small number for the calling thread (1, 2, ...; 0 while the thread is being torn down).
#[inline]
pub fn thread_number() -> u32 {
    THREAD
        .try_with(|t| {
            let n = t.get();
            if n != 0 {
                return n;
            }
            let n = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
            t.set(n);
            n
        })
        .unwrap_or(0)
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
    seq: AtomicU64,
    /// Serialises [`Tracker::step`] so boundaries are recorded in order.
    step_lock: Mutex<()>,
    /// This tracker's key in each thread's tag stack ([`TAG_STACK`]).
    id: u64,
    tags: Mutex<Tags>,
    settings: SiteSettings,
    interner: Interner,
    symbols: Symbolizer,
    classes: SizeClasses,
    /// Requests up to this size take slab slots (`slab_max_kb`), larger ones 512-byte blocks.
    slab_max: u64,
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
        let mut t = Self::build(true);
        t.slab_max = (conf.slab_max_kb << 10).min(MAX_SMALL);
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
            seq: AtomicU64::new(0),
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
            classes: SizeClasses::new(2 << 20),
            slab_max: MAX_SMALL,
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

    fn device_if_open(&self, device: i32) -> Option<&DeviceTrack> {
        self.devices.get(usize::try_from(device).ok()?)?.get()
    }

    /// The block size the arena gives a request of `size` bytes (> 0).
    #[inline]
    pub fn block_size(&self, size: u64) -> u64 {
        if size <= self.slab_max {
            self.classes.get(self.classes.index_of(size)).size
        } else {
            // Only sizes the arena accepted get here, but never wrap regardless.
            size.checked_next_multiple_of(MIN_BLOCK).unwrap_or(u64::MAX)
        }
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

    /// Advance the step; record every site's live bytes at this boundary. Returns the new step.
    pub fn step(&self) -> u64 {
        let _g = self.step_lock.lock();
        let new = self.step.fetch_add(1, Ordering::SeqCst) + 1;
        for d in self.devices.iter().filter_map(OnceCell::get) {
            let mut sites: Vec<(u32, SiteLive)> =
                d.site_live.lock().iter().map(|(&s, &l)| (s, l)).collect();
            sites.sort_unstable_by_key(|&(s, _)| s);
            let mut b = d.boundaries.lock();
            if b.len() == MAX_BOUNDARIES {
                b.pop_front();
            }
            b.push_back(Boundary { step: new, sites });
        }
        new
    }

    pub fn current_step(&self) -> u64 {
        self.step.load(Ordering::SeqCst)
    }

    /// Push `tag` on the calling thread's stack: this thread's new allocations carry it until
    /// it is popped.
    pub fn tag_push(&self, tag: &str) {
        let id = {
            let mut t = self.tags.lock();
            match t.ids.get(tag) {
                Some(&id) => id,
                None => {
                    t.names.push(tag.to_string());
                    let id = t.names.len() as u32;
                    t.ids.insert(tag.to_string(), id);
                    id
                }
            }
        };
        let me = self.id;
        let _ = TAG_STACK.try_with(|s| s.borrow_mut().push((me, id)));
    }

    /// Pop the calling thread's innermost tag; false when its stack is empty.
    pub fn tag_pop(&self) -> bool {
        let me = self.id;
        TAG_STACK
            .try_with(|s| {
                let mut s = s.borrow_mut();
                match s.iter().rposition(|&(t, _)| t == me) {
                    Some(i) => {
                        s.remove(i);
                        true
                    }
                    None => false,
                }
            })
            .unwrap_or(false)
    }

    /// The calling thread's innermost tag (0: none).
    #[inline]
    fn current_tag(&self) -> u32 {
        let me = self.id;
        TAG_STACK
            .try_with(|s| {
                s.borrow()
                    .iter()
                    .rev()
                    .find(|&&(t, _)| t == me)
                    .map_or(0, |&(_, id)| id)
            })
            .unwrap_or(0)
    }

    /// The name of tag `id` (None for 0).
    pub fn tag_name(&self, id: u32) -> Option<String> {
        let t = self.tags.lock();
        t.names.get((id as usize).checked_sub(1)?).cloned()
    }

    // ----- sites ------------------------------------------------------------------------------

    /// Change site capture: `mode`, one allocation in `every` (>= 1), requests of at least
    /// `min_bytes`.
    pub fn set_sites(&self, mode: SitesMode, every: u64, min_bytes: u64) {
        if !self.enabled {
            return;
        }
        self.settings.every.store(every.max(1), Ordering::Relaxed);
        self.settings.min_bytes.store(min_bytes, Ordering::Relaxed);
        self.settings.mode.store(mode_bits(mode), Ordering::Relaxed);
    }

    /// `(mode bits, every, min_bytes)`.
    pub fn sites_settings(&self) -> (u8, u64, u64) {
        (
            self.settings.mode.load(Ordering::Relaxed),
            self.settings.every.load(Ordering::Relaxed),
            self.settings.min_bytes.load(Ordering::Relaxed),
        )
    }

    /// The site of an allocation of `size` bytes about to be made (0: not captured). Call it with
    /// no arena or tracker lock held: it may take the GIL.
    #[inline]
    pub fn capture_site(&self, size: u64) -> u32 {
        let mode = self.settings.mode.load(Ordering::Relaxed);
        if mode == 0 {
            return 0;
        }
        self.capture_site_slow(size, mode)
    }

    #[inline(never)]
    fn capture_site_slow(&self, size: u64, mode: u8) -> u32 {
        if size < self.settings.min_bytes.load(Ordering::Relaxed) {
            return 0;
        }
        let every = self.settings.every.load(Ordering::Relaxed);
        if every > 1 {
            let n = SAMPLE
                .try_with(|c| {
                    let n = c.get();
                    c.set(n.wrapping_add(1));
                    n
                })
                .unwrap_or(1);
            if !n.is_multiple_of(every) {
                return 0;
            }
        }
        self.capture_now(mode)
    }

    /// The calling thread's stack as a site, under `mode`, with no sampling.
    fn capture_now(&self, mode: u8) -> u32 {
        let mut frames = Vec::new();
        if mode & SITES_NATIVE != 0 {
            sites::capture_native(&mut frames);
        }
        if mode & SITES_PYTHON != 0
            && let Some(id) = sites::capture_python(&frames, &self.interner)
        {
            return id;
        }
        self.interner.intern(&frames).0
    }

    /// The frames of site `id`.
    pub fn site_frames(&self, id: u32) -> Option<std::sync::Arc<[Frame]>> {
        self.interner.stack(id)
    }

    /// The frames of site `id` as text (leading torch-arena frames dropped). May take the GIL:
    /// call with no lock held.
    pub fn site_text(&self, id: u32) -> Vec<std::sync::Arc<sites::FrameText>> {
        self.interner
            .stack(id)
            .map(|f| self.symbols.resolve(&f))
            .unwrap_or_default()
    }

    // ----- the hooks --------------------------------------------------------------------------

    /// Whether history is on (the allocator then reads reserved bytes around each call).
    #[inline]
    pub fn history_enabled(&self) -> bool {
        self.history_on.load(Ordering::Relaxed)
    }

    /// A new live allocation: `ptr` for a request of `requested` bytes on `stream`, with `site`.
    /// `reserved` = the device's reserved bytes before the call and a way to read them after
    /// (given only while history is on).
    #[inline]
    pub fn on_alloc(
        &self,
        device: i32,
        ptr: DevPtr,
        requested: u64,
        stream: StreamId,
        site: u32,
        reserved: Option<(u64, &dyn Fn() -> u64)>,
    ) {
        if !self.enabled {
            return;
        }
        let Some(d) = self.device(device) else { return };
        let size = self.block_size(requested);
        let time_us = self.now_us();
        let e = Entry {
            size,
            requested,
            stream,
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            time_us,
            step: self.step.load(Ordering::Relaxed),
            thread: thread_number(),
            tag: self.current_tag(),
            site,
            recorded: false,
        };
        d.shard(ptr).lock().insert(ptr, e);
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

    /// Before the arena frees `ptr`: take its entry out of the live table (so that a new
    /// allocation at the same address, on another thread, is never removed by this free).
    #[inline]
    pub fn take(&self, device: i32, ptr: DevPtr) -> Option<Entry> {
        if !self.enabled {
            return None;
        }
        self.device_if_open(device)?.shard(ptr).lock().remove(&ptr)
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
            d.shard(ptr).lock().insert(ptr, e);
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
            if let Some(e) = d.shard(base).lock().get_mut(&base) {
                e.recorded = true;
                return;
            }
        }
    }

    /// The live entry at `ptr` on `device`.
    pub fn entry(&self, device: i32, ptr: DevPtr) -> Option<Entry> {
        self.device_if_open(device)?
            .shard(ptr)
            .lock()
            .get(&ptr)
            .copied()
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

    // ----- reports ----------------------------------------------------------------------------

    /// `"sites":{...}` for `ids` (sorted, 0 left out). Resolves frames: call with no lock held.
    fn sites_json(&self, out: &mut String, ids: impl IntoIterator<Item = u32>) {
        let mut ids: Vec<u32> = ids.into_iter().filter(|&s| s != 0).collect();
        ids.sort_unstable();
        ids.dedup();
        out.push_str("\"sites\":{");
        for (i, id) in ids.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "\"{id}\":");
            self.frames_json(*id, out);
        }
        out.push('}');
    }

    fn frames_json(&self, id: u32, out: &mut String) {
        match self.interner.stack(id) {
            Some(f) => self.symbols.json(&f, out),
            None => out.push_str("[]"),
        }
    }

    fn tag_json(&self, id: u32, out: &mut String) {
        match self.tag_name(id) {
            Some(t) => json::push_str(out, &t),
            None => out.push_str("null"),
        }
    }

    /// `torch_arena_live_json`: every live allocation of `device`, oldest first, and the frames
    /// of every site they name.
    pub fn live_json(&self, device: i32) -> String {
        let live = self.live(device);
        let mut out = String::with_capacity(128 + live.len() * 160);
        let _ = write!(
            out,
            "{{\"device\":{device},\"step\":{},\"allocations\":[",
            self.current_step()
        );
        for (i, (ptr, e)) in live.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                "{{\"ptr\":{ptr},\"size\":{},\"requested\":{},\"stream\":{},\"thread\":{},\
                 \"seq\":{},\"time_us\":{},\"step\":{},\"tag\":",
                e.size, e.requested, e.stream, e.thread, e.seq, e.time_us, e.step
            );
            self.tag_json(e.tag, &mut out);
            let _ = write!(out, ",\"site\":{}}}", e.site);
        }
        out.push_str("],");
        self.sites_json(&mut out, live.iter().map(|(_, e)| e.site));
        out.push('}');
        out
    }

    /// The per-site series at boundaries at or after `warmup`, and those boundaries' steps.
    fn series(&self, d: &DeviceTrack, warmup: u64) -> (Vec<u64>, PtrMap<u32, Vec<Point>>) {
        let b = d.boundaries.lock();
        let kept: Vec<&Boundary> = b.iter().filter(|x| x.step >= warmup).collect();
        let steps: Vec<u64> = kept.iter().map(|x| x.step).collect();
        let mut all: PtrMap<u32, Vec<Point>> = PtrMap::default();
        for (i, x) in kept.iter().enumerate() {
            for &(site, live) in &x.sites {
                let s = all.entry(site).or_insert_with(|| {
                    steps[..i]
                        .iter()
                        .map(|&step| Point {
                            step,
                            bytes: 0,
                            count: 0,
                        })
                        .collect()
                });
                s.push(Point {
                    step: x.step,
                    bytes: live.bytes,
                    count: live.count,
                });
            }
            // Sites absent at this boundary had nothing live.
            for s in all.values_mut() {
                if s.len() == i {
                    s.push(Point {
                        step: x.step,
                        bytes: 0,
                        count: 0,
                    });
                }
            }
        }
        (steps, all)
    }

    /// Growing sites of `device` after `warmup` steps (see [`leaks`]), strongest first.
    pub fn growing(&self, device: i32, warmup: u64) -> Vec<(u32, leaks::Growth)> {
        self.judged(device, warmup).growing
    }

    /// Every site of `device` judged over the boundaries at or after `warmup`.
    fn judged(&self, device: i32, warmup: u64) -> Judged {
        let Some(d) = self.device_if_open(device) else {
            return Judged::default();
        };
        let (steps, series) = self.series(d, warmup);
        let mut j = Judged {
            boundaries: steps.len() as u64,
            observed: match (steps.first(), steps.last()) {
                (Some(a), Some(b)) => b - a,
                _ => 0,
            },
            ..Judged::default()
        };
        for (&site, s) in &series {
            match leaks::verdict(s) {
                Some(leaks::Verdict::Growing(g)) => j.growing.push((site, g)),
                Some(leaks::Verdict::Plateaued(g)) => j.plateaued.push((site, g)),
                None => {}
            }
        }
        for v in [&mut j.growing, &mut j.plateaued] {
            v.sort_by(|a, b| {
                b.1.bytes_per_step
                    .total_cmp(&a.1.bytes_per_step)
                    .then(a.0.cmp(&b.0))
            });
        }
        j
    }

    /// `torch_arena_leaks_json`: growing sites after `warmup`, plateaued ones (grew, then
    /// stayed flat: not leaks), and (with `age_steps` > 0) live allocations at least that many
    /// steps old.
    pub fn leaks_json(&self, device: i32, warmup: u64, age_steps: u64) -> String {
        let now = self.current_step();
        let Judged {
            growing,
            plateaued,
            boundaries,
            observed,
        } = self.judged(device, warmup);
        let live = if growing.is_empty() && plateaued.is_empty() && age_steps == 0 {
            Vec::new()
        } else {
            self.live(device)
        };
        let mut out = String::with_capacity(1024);
        let _ = write!(
            out,
            "{{\"device\":{device},\"step\":{now},\"warmup\":{warmup},\"steps_observed\":{observed},\
             \"boundaries\":{boundaries},\"growing\":["
        );
        for (i, (site, g)) in growing.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let mine: Vec<&(DevPtr, Entry)> =
                live.iter().filter(|(_, e)| e.site == *site).collect();
            let (live_bytes, live_count) = (
                mine.iter().map(|(_, e)| e.size).sum::<u64>(),
                mine.len() as u64,
            );
            // Since when it grows: where its live bytes last stood lowest, not the birth step
            // of its oldest live allocation.
            let first_step = g.from_step;
            let newest: Vec<&&(DevPtr, Entry)> = mine.iter().rev().take(EXAMPLES).collect();
            let _ = write!(out, "{{\"site\":{site},\"frames\":");
            self.frames_json(*site, &mut out);
            let _ = write!(
                out,
                ",\"bytes_per_step\":{},\"count_per_step\":{},\"live_bytes\":{live_bytes},\
                 \"live_count\":{live_count},\"first_step\":{first_step},\"steps_grown\":{},\
                 \"example_sizes\":[{}],\"example_ptrs\":[{}],\"tags\":[",
                json::float(g.bytes_per_step),
                json::float(g.count_per_step),
                g.steps_grown,
                join(newest.iter().map(|(_, e)| e.size)),
                join(newest.iter().map(|(p, _)| *p)),
            );
            let mut tags: Vec<u32> = Vec::new();
            let mut seen = HashSet::new();
            for (_, e) in mine.iter().rev() {
                if e.tag != 0 && seen.insert(e.tag) {
                    tags.push(e.tag);
                    if tags.len() == MAX_TAGS {
                        break;
                    }
                }
            }
            for (j, t) in tags.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                self.tag_json(*t, &mut out);
            }
            out.push_str("]}");
        }
        out.push_str("],\"plateaued\":[");
        for (i, (site, g)) in plateaued.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let (live_bytes, live_count) = live
                .iter()
                .filter(|(_, e)| e.site == *site)
                .fold((0u64, 0u64), |(b, c), (_, e)| (b + e.size, c + 1));
            let _ = write!(out, "{{\"site\":{site},\"frames\":");
            self.frames_json(*site, &mut out);
            let _ = write!(
                out,
                ",\"bytes_per_step\":{},\"count_per_step\":{},\"first_step\":{},\
                 \"until_step\":{},\"live_bytes\":{live_bytes},\"live_count\":{live_count}}}",
                json::float(g.bytes_per_step),
                json::float(g.count_per_step),
                g.from_step,
                g.high_step,
            );
        }
        out.push_str("],\"old\":[");
        let old: Vec<&(DevPtr, Entry)> = if age_steps == 0 {
            Vec::new()
        } else {
            live.iter()
                .filter(|(_, e)| now.saturating_sub(e.step) >= age_steps)
                .collect()
        };
        for (i, (ptr, e)) in old.iter().take(MAX_OLD).enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                "{{\"ptr\":{ptr},\"size\":{},\"requested\":{},\"step\":{},\"age\":{},\"site\":{},\
                 \"frames\":",
                e.size,
                e.requested,
                e.step,
                now - e.step,
                e.site
            );
            self.frames_json(e.site, &mut out);
            out.push('}');
        }
        let _ = write!(out, "],\"old_count\":{}}}", old.len());
        out
    }

    /// `torch_arena_history_json`: the history ring of `device`, oldest first.
    pub fn history_json(&self, device: i32) -> String {
        let h = self.history(device);
        let mut out = String::with_capacity(64 + h.len() * 110);
        let _ = write!(out, "{{\"device\":{device},\"entries\":[");
        for (i, e) in h.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                "{{\"action\":\"{}\",\"addr\":{},\"size\":{},\"stream\":{},\"time_us\":{},\
                 \"site\":{}",
                e.action.as_str(),
                e.addr,
                e.size,
                e.stream,
                e.time_us,
                e.site
            );
            if e.pending {
                out.push_str(",\"pending\":true");
            }
            out.push('}');
        }
        out.push_str("],");
        self.sites_json(&mut out, h.iter().map(|e| e.site));
        out.push('}');
        out
    }
}

/// Sites judged over one window of boundaries.
#[derive(Default)]
struct Judged {
    growing: Vec<(u32, leaks::Growth)>,
    plateaued: Vec<(u32, leaks::Growth)>,
    /// Boundaries at or after the warmup.
    boundaries: u64,
    /// Steps between the first and the last of them.
    observed: u64,
}

fn join(v: impl Iterator<Item = u64>) -> String {
    let mut s = String::new();
    for (i, x) in v.enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{x}");
    }
    s
}

/// `torch_arena_layout_json`: `layout` (from [`crate::arena::Arena::layout`]) in the contract's
/// schema.
pub fn layout_json(device: i32, layout: &Layout) -> String {
    let mut out = String::with_capacity(256 + layout.segments.len() * 200);
    let _ = write!(
        out,
        "{{\"device\":{device},\"reserved\":{},\"allocated\":{},\"pooled\":{},\"segments\":[",
        layout.reserved, layout.allocated, layout.pooled
    );
    for (i, s) in layout.segments.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "{{\"address\":{},\"total_size\":{},\"stream\":{},\"segment_type\":\"{}\",\"blocks\":[",
            s.address,
            s.total_size,
            s.stream,
            if s.small { "small" } else { "large" }
        );
        for (j, b) in s.blocks.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                "{{\"address\":{},\"size\":{},\"requested_size\":{},\"state\":\"{}\"}}",
                b.address,
                b.size,
                b.requested,
                b.state.as_str()
            );
        }
        out.push_str("]}");
    }
    out.push_str("]}");
    out
}
