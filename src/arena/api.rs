//! The arena's public methods: each takes the lock and calls into the concern that does the work
//! (`alloc.rs` for a request, `free.rs` for a free, `capture.rs` for the private pools, ...).

use super::growth::{GROWTH_BYTES, GROWTH_FLOOR_BYTES, large_pages};
use super::*;

/// Pause instructions a contended request spins for before it sleeps: about 95 µs on the
/// 2-vCPU EPYC VM (25 ns a pause there), some hundreds of the lock's hot sections, and two
/// driver calls that map pages (about 50 µs on the H200, `bench/costs/h200.txt`). Measured with
/// the pairs benchmark, total throughput against one thread's, medians of five interleaved runs
/// (BENCHMARKS.md, "Threads"): while the VM was loaded, 2 threads 0.79x with no spin, 0.87x
/// with 600 pauses, 0.89x with this; 4 threads 0.69x, 0.75x, 0.90x; 2 threads on one stream
/// 0.61x, 0.68x, 0.71x. While it was quiet the three budgets were alike (0.94-0.96x,
/// 0.94-0.98x, 0.80-0.82x).
const SPIN_PAUSES: u32 = 4000;

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
            growth_time: growth_cost::GrowthTime::new(),
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
            active_at: [0; 3],
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
        let mut g = self.lock_hot();
        g.malloc(size, stream, None)
    }

    /// Free `ptr`. `size`, when given, must equal the request; a mismatch is reported but the
    /// allocation is still freed (the pointer is what names it).
    pub fn free(&self, ptr: DevPtr, size: Option<u64>, _stream: StreamId) -> Result<()> {
        let mut g = self.lock_hot();
        g.poll_pending();
        let r = g.free(ptr, size);
        if r.is_err() {
            g.bad_frees += 1;
        }
        r
    }

    /// The lock, for a request, a free or a `record_stream`: spins up to [`SPIN_PAUSES`] pause
    /// instructions before it waits the way `parking_lot` does (spin a little, then sleep in the
    /// kernel).
    ///
    /// Why: the lock's hot sections take 100 to 300 ns, and two threads allocating at once
    /// meet at it often. Parked, a waiter costs two system calls and a wake-up of several
    /// microseconds, during which the holder takes the lock again and again (measured: 2 threads
    /// gave 0.6 to 0.8 times the throughput of one, 4 threads down to 0.4 times; `bench/threads`).
    /// Spinning, it takes the lock as soon as the holder lets go. A holder that is slow (a
    /// driver call, the out-of-memory ladder) outlasts the spin, and the waiter then sleeps.
    #[inline]
    pub(super) fn lock_hot(&self) -> parking_lot::MutexGuard<'_, Inner> {
        if let Some(g) = self.inner.try_lock() {
            return g;
        }
        self.lock_contended()
    }

    #[cold]
    fn lock_contended(&self) -> parking_lot::MutexGuard<'_, Inner> {
        // Bursts of pauses, doubling to 64, with one try between them: a waiter that reads
        // the lock after every pause takes its cache line from the holder, whose unlock then
        // waits for it (measured, 3 runs: 2 threads 0.85x of one thread's throughput where
        // bursts gave 0.9x).
        let (mut spent, mut burst) = (0, 1);
        while spent < SPIN_PAUSES {
            for _ in 0..burst {
                std::hint::spin_loop();
            }
            spent += burst;
            burst = (burst * 2).min(64);
            if let Some(g) = self.inner.try_lock() {
                return g;
            }
        }
        self.inner.lock()
    }

    /// Whether `ptr` lies in memory this arena manages.
    pub fn owns(&self, ptr: DevPtr) -> bool {
        self.inner.lock().region_of(ptr).is_some()
    }

    /// The allocation at `ptr` is also used on `stream`: its memory is not reused until the work
    /// queued on `stream` before its free has completed. Returns the allocation's base.
    pub fn record_stream(&self, ptr: DevPtr, stream: StreamId) -> Result<DevPtr> {
        let mut g = self.lock_hot();
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
        Ok(base)
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
        self.inner.lock().reset_peaks();
    }

    /// Where the physical pages are: in use, idle mapped, held unused, pooled (also in
    /// [`Arena::extras`], which costs more: it walks the slabs too). One visit per mapped handle
    /// and per unmapped page of every region, under the lock: for reports, not every malloc.
    pub fn pages(&self) -> PageCounts {
        self.inner.lock().page_counts()
    }

    /// `(limit, free)`: the bytes this arena may hold reserved (the device's capacity, or the
    /// memory fraction of it), and the device's free bytes as the driver reports them (0 where
    /// it cannot say). One driver call: for reports and the out-of-memory path.
    pub fn limits(&self) -> (u64, u64) {
        let g = self.inner.lock();
        let free = g.dev.mem_get_info().map_or(0, |(free, _)| free);
        (g.limit, free)
    }

    /// Physical memory created so far, by whether its request took the bytes requested to a new
    /// peak (also in [`Arena::extras`], which costs more: it walks the slabs).
    pub fn growth(&self) -> GrowthCounts {
        self.inner.lock().growth
    }

    pub fn reset_accumulated_stats(&self) {
        self.inner.lock().reset_accumulated();
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
