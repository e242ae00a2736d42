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
/// The longest burst of pauses between two tries of a contended lock (`Arena::lock_contended`).
const MAX_BURST: u32 = 2048;

impl Inner {
    /// One shard's state on `dev` with the settings of `conf`, sharing `shared` with the others.
    fn new(
        dev: Arc<dyn Device>,
        conf: &Config,
        shared: Arc<Shared>,
        shard: usize,
    ) -> Result<Inner> {
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
            views_on: conf.views,
            views: HashMap::new(),
            viewing: HashMap::new(),
            view_pages: 0,
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
            rising: 0,
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
            shared,
            shard,
        };
        Ok(inner)
    }
}

impl Arena {
    /// An arena on `dev` with the settings of `conf`.
    pub fn new(dev: Arc<dyn Device>, conf: &Config) -> Result<Arena> {
        let shared = Arc::new(Shared::new());
        let shards = (0..SHARDS)
            .map(|i| {
                Inner::new(dev.clone(), conf, shared.clone(), i).map(|inner| Shard {
                    inner: Mutex::new(inner),
                })
            })
            .collect::<Result<Vec<_>>>()?
            .into_boxed_slice();
        Ok(Arena { shards, shared })
    }

    /// Run `f` on shard `i`'s state under its lock, keeping the device's statistics
    /// (`shared.rs`): while only one shard has served, its own statistics are the device's; once
    /// a second one has, what `f` changes in the shard's goes to the device's peaks as well.
    #[inline]
    pub(super) fn on<R>(&self, i: usize, f: impl FnOnce(&mut Inner) -> R) -> R {
        self.on_locked(i, self.lock_hot(i), f)
    }

    /// [`Arena::on`] for a request or a free on `stream`: where it finds the shard locked, that
    /// is counted towards giving this thread a shard of its own for `stream` (`lock_contended`).
    #[inline]
    fn serve<R>(&self, i: usize, stream: StreamId, f: impl FnOnce(&mut Inner) -> R) -> R {
        self.on_locked(i, self.lock_req(i, stream), f)
    }

    #[inline]
    fn on_locked<R>(
        &self,
        i: usize,
        mut g: parking_lot::MutexGuard<'_, Inner>,
        f: impl FnOnce(&mut Inner) -> R,
    ) -> R {
        if !self.shared.multi() {
            if i != 0 {
                return self.first_on(i, g, f);
            }
            return f(&mut g);
        }
        counted(&self.shared, i, &mut g, f)
    }

    /// The first request of a shard other than shard 0 (the one every stream went to before):
    /// from now on the device's peaks are kept across shards, starting from shard 0's.
    #[cold]
    fn first_on<R>(
        &self,
        i: usize,
        g: parking_lot::MutexGuard<'_, Inner>,
        f: impl FnOnce(&mut Inner) -> R,
    ) -> R {
        drop(g);
        self.go_multi(&self.shards[0].inner.lock());
        let mut g = self.lock_hot(i);
        counted(&self.shared, i, &mut g, f)
    }

    /// The shards that may have served, shard 0 first: every shard once a second one has, else
    /// shard 0 alone (no other has state).
    pub(super) fn used(&self) -> std::ops::Range<usize> {
        match self.shared.multi() {
            true => 0..self.shards.len(),
            false => 0..1,
        }
    }

    /// At least `size` (> 0) bytes, 512-byte aligned, usable on `stream` at once.
    pub fn malloc(&self, size: u64, stream: StreamId) -> Result<DevPtr> {
        self.alloc(size, stream).map(|b| b.ptr)
    }

    /// [`Arena::malloc`], with what a layer above needs to know of the block without asking
    /// again: its size and its number ([`Block`]).
    #[inline]
    pub fn alloc(&self, size: u64, stream: StreamId) -> Result<Block> {
        // One shard serving (a stream alone, the usual case): what one lock did, no more.
        if self.shared.alone(stream) {
            let mut g = self.lock_req(0, stream);
            // A second shard starts serving under shard 0's lock (`first_on`): still one.
            if !self.shared.multi() {
                return g.malloc(size, stream, None);
            }
        }
        self.alloc_sharded(size, stream)
    }

    /// [`Arena::alloc`] once more than one shard may serve: kept out of line, so that the one
    /// shard's path is inlined into its caller as it was with one lock.
    #[inline(never)]
    fn alloc_sharded(&self, size: u64, stream: StreamId) -> Result<Block> {
        self.alloc_in(size, stream, None)
    }

    /// A request of `stream` (in private pool `pool`, if any) on its shard. When that shard runs
    /// out, the others' cached memory comes to it (`short_of_memory`).
    pub(super) fn alloc_in(
        &self,
        size: u64,
        stream: StreamId,
        pool: Option<PoolId>,
    ) -> Result<Block> {
        let i = self.shared.shard_of(stream);
        // With other shards in use, their cached pages come before this one's go to the driver.
        let release = !self.shared.multi();
        let first = self.serve(i, stream, |g| g.malloc_counted(size, stream, pool, release))?;
        match first {
            Some(b) => Ok(b),
            None => self.short_of_memory(i, size, stream, pool),
        }
    }

    /// Shard `i` could not serve the request even after its own out-of-memory ladder: the other
    /// shards' cached pages come to it (unmapped there, mapped here: no handle created or
    /// released), and it tries once more; then what they still cache goes back to the driver,
    /// and it tries a last time, or fails.
    #[cold]
    fn short_of_memory(
        &self,
        i: usize,
        size: u64,
        stream: StreamId,
        pool: Option<PoolId>,
    ) -> Result<Block> {
        if !self.shared.multi() {
            return Err(self.on(i, |g| g.out_of_memory(size)));
        }
        // A thread with a shard of its own for the stream goes back to the stream's shard: there
        // the other threads' freed memory, and the idle pages their live blocks pin, are its
        // too, as when they shared it from the start (`route::go_home`).
        if crate::route::own_offset(stream) != 0 {
            crate::route::go_home(stream);
            return self.alloc_in(size, stream, pool);
        }
        // First what the request could need (`pages_for`), then all: moving every cached page
        // at each shortage made two streams trading memory at the limit move all of it back and
        // forth (`synth:two-stream-train`).
        let need = self.on(i, |g| g.pages_for(size));
        for want in [need, u64::MAX] {
            // A shard that gave less than asked gave all it could: then there is no more to ask
            // for (nor a device-wide synchronisation to run for it).
            let (mut moved, mut more) = (false, false);
            for j in self.used().filter(|&j| j != i) {
                let handles = self.on(j, |g| g.give_handles(want))?;
                more |= handles.iter().map(|&(_, k)| k as u64).sum::<u64>() >= want;
                if !handles.is_empty() {
                    moved = true;
                    self.on(i, |g| g.take_handles(handles));
                }
            }
            if moved && let Some(b) = self.on(i, |g| g.malloc_counted(size, stream, pool, false))? {
                return Ok(b);
            }
            if !more {
                break;
            }
        }
        // The whole ladder now: this shard's own cache may go to the driver too.
        if let Some(b) = self.on(i, |g| g.malloc_counted(size, stream, pool, true))? {
            return Ok(b);
        }
        let mut released = 0;
        for j in self.used().filter(|&j| j != i) {
            released += self.on(j, |g| g.reclaim(true))?.bytes_released;
        }
        if released > 0
            && let Some(b) = self.on(i, |g| g.malloc_counted(size, stream, pool, true))?
        {
            return Ok(b);
        }
        // The message speaks of the device: every shard's memory.
        let mut figures = super::ladder::OomFigures::default();
        for j in self.used() {
            figures += self.on(j, |g| g.oom_figures());
        }
        Err(self.on(i, |g| {
            g.count_oom();
            Error::OutOfMemory(g.oom_text(size, &figures))
        }))
    }

    /// Free `ptr`. `size`, when given, must equal the request; a mismatch is reported but the
    /// allocation is still freed (the pointer is what names it). `stream` is the one the
    /// allocation was made on (what PyTorch passes): its shard is asked first.
    #[inline]
    pub fn free(&self, ptr: DevPtr, size: Option<u64>, stream: StreamId) -> Result<()> {
        if self.shared.alone(stream) {
            let mut g = self.lock_req(0, stream);
            if !self.shared.multi() {
                g.poll_pending();
                let r = g.free(ptr, size);
                if r.is_err() {
                    g.bad_frees += 1;
                }
                return r;
            }
        }
        self.free_sharded(ptr, size, stream)
    }

    /// [`Arena::free`] once more than one shard may serve (out of line, as `alloc_sharded`).
    #[inline(never)]
    fn free_sharded(&self, ptr: DevPtr, size: Option<u64>, stream: StreamId) -> Result<()> {
        let i = self.shared.shard_of(stream);
        let r = self.serve(i, stream, |g| {
            g.poll_pending();
            g.free(ptr, size)
        });
        match r {
            Err(Error::BadPointer(PointerFault::Unknown, _)) if self.shared.multi() => {
                self.free_elsewhere(i, ptr, size, r)
            }
            r => {
                if r.is_err() {
                    self.on(i, |g| g.bad_frees += 1);
                }
                r
            }
        }
    }

    /// A pointer shard `i` does not know: freed by the shard whose memory holds it, if any; else
    /// the error `unknown` (shard `i`'s).
    #[cold]
    fn free_elsewhere(
        &self,
        i: usize,
        ptr: DevPtr,
        size: Option<u64>,
        unknown: Result<()>,
    ) -> Result<()> {
        for j in self.used().filter(|&j| j != i) {
            let r = self.on(j, |g| {
                g.region_of(ptr)?;
                g.poll_pending();
                let r = g.free(ptr, size);
                if r.is_err() {
                    g.bad_frees += 1;
                }
                Some(r)
            });
            if let Some(r) = r {
                return r;
            }
        }
        self.on(i, |g| g.bad_frees += 1);
        unknown
    }

    /// The lock of shard `i`, for a request, a free or a `record_stream`: spins up to
    /// [`SPIN_PAUSES`] pause instructions before it waits the way `parking_lot` does (spin a
    /// little, then sleep in the kernel).
    ///
    /// Why: the lock's hot sections take 100 to 300 ns, and two threads allocating at once
    /// meet at it often. Parked, a waiter costs two system calls and a wake-up of several
    /// microseconds, during which the holder takes the lock again and again (measured: 2 threads
    /// gave 0.6 to 0.8 times the throughput of one, 4 threads down to 0.4 times; `bench/threads`).
    /// Spinning, it takes the lock as soon as the holder lets go. A holder that is slow (a
    /// driver call, the out-of-memory ladder) outlasts the spin, and the waiter then sleeps.
    #[inline]
    pub(super) fn lock_hot(&self, i: usize) -> parking_lot::MutexGuard<'_, Inner> {
        if let Some(g) = self.shards[i].inner.try_lock() {
            return g;
        }
        self.lock_contended(i)
    }

    /// [`Arena::lock_hot`] for a request or a free on `stream`. A thread that keeps finding its
    /// shard locked by another thread's requests on the same stream takes a shard of its own for
    /// that stream (`route::contended`): threads on one stream that allocate at once would
    /// otherwise run one at a time however many cores they have (the threads issue). Its next
    /// requests go there; this one is served where it is.
    #[inline]
    fn lock_req(&self, i: usize, stream: StreamId) -> parking_lot::MutexGuard<'_, Inner> {
        if let Some(g) = self.shards[i].inner.try_lock() {
            return g;
        }
        self.lock_contended_req(i, stream)
    }

    /// [`Arena::lock_req`] once the shard was found locked: the meeting counted, out of line.
    #[cold]
    fn lock_contended_req(&self, i: usize, stream: StreamId) -> parking_lot::MutexGuard<'_, Inner> {
        let g = self.lock_contended(i);
        if crate::route::contended(stream) {
            self.steered(i, &g);
        }
        g
    }

    /// This thread's requests on a stream go to another shard from now on. If one shard was
    /// serving alone (`g` is then shard 0's), that ends here, as in `first_on`.
    #[cold]
    fn steered(&self, i: usize, g: &Inner) {
        self.shared.note_own_shard();
        if i == 0 {
            self.go_multi(g);
        }
    }

    /// If one shard was serving alone, from this request on the device's peaks are kept across
    /// shards, starting from shard 0's statistics (`first`, under its lock).
    fn go_multi(&self, first: &Inner) {
        if !self.shared.multi() {
            self.shared.go_multi(&first.stats, first.allocs);
        }
    }

    /// From now on every allocation and free takes the next number of `numbers` while it holds
    /// its shard's lock, and [`super::last_number`] tells the thread that made it which: the
    /// order the arena did them in, for a trace recorder that writes no line under a lock of its
    /// own (`crate::record`). A free of an address and the allocation that reuses it are done
    /// under one shard's lock, so they are numbered in that order. An arena already numbering
    /// them keeps its first count.
    pub fn number_operations(&self, numbers: Arc<AtomicU64>) {
        self.shared.number_operations(numbers);
    }

    /// This thread's requests and frees on `stream` go to a shard of their own from now on, as
    /// when it keeps finding the stream's shard locked by another thread's requests
    /// (`lock_req`); for tests, which cannot make threads meet at will.
    #[doc(hidden)]
    pub fn take_own_shard(&self, stream: StreamId) {
        let g = self.lock_hot(0);
        crate::route::steer(stream);
        self.steered(0, &g);
    }

    #[cold]
    fn lock_contended(&self, i: usize) -> parking_lot::MutexGuard<'_, Inner> {
        let lock = &self.shards[i].inner;
        // Bursts of pauses, doubling, with one try between them: a waiter that reads the lock
        // after every pause takes its cache line from the holder, whose unlock then waits for
        // it (measured, 3 runs: 2 threads 0.85x of one thread's throughput where bursts gave
        // 0.9x). Up to MAX_BURST: a waiter that has failed seven tries (about 3 us) is in
        // sustained contention, two threads on one stream, and each time it wins, the shard's
        // state moves to its core and the other's next request misses on it; trying less often
        // lets each holder run longer turns (2 threads on one stream through the C ABI, six
        // alternated rounds, the three in the VM's quick state: 1.72-1.84 M pairs per second
        // where bursts of at most 64 pauses made 1.52-1.58 M).
        let (mut spent, mut burst) = (0, 1);
        while spent < SPIN_PAUSES {
            for _ in 0..burst {
                std::hint::spin_loop();
            }
            spent += burst;
            burst = (burst * 2).min(MAX_BURST);
            if let Some(g) = lock.try_lock() {
                return g;
            }
        }
        lock.lock()
    }

    /// The first shard (in order) for which `f` says something, under its lock.
    pub(super) fn find<R>(&self, mut f: impl FnMut(&mut Inner) -> Option<R>) -> Option<R> {
        self.used().find_map(|i| self.on(i, &mut f))
    }

    /// Whether `ptr` lies in memory this arena manages.
    pub fn owns(&self, ptr: DevPtr) -> bool {
        self.find(|g| g.region_of(ptr)).is_some()
    }

    /// The allocation at `ptr` is also used on `stream`: its memory is not reused until the work
    /// queued on `stream` before its free has completed. Returns the allocation's base.
    pub fn record_stream(&self, ptr: DevPtr, stream: StreamId) -> Result<DevPtr> {
        let found = self.find(|g| {
            let (base, owner) = g.live_allocation(ptr)?;
            if g.streams[owner as usize].id != stream {
                let list = g.recorded.entry(base).or_default();
                if !list.contains(&stream) {
                    list.push(stream);
                }
            }
            Some(base)
        });
        found.ok_or_else(|| {
            self.on(0, |g| g.bad_frees += 1);
            Error::BadPointer(
                PointerFault::Unknown,
                format!(
                    "record_stream: pointer {ptr:#x} is not inside a live torch-arena allocation"
                ),
            )
        })
    }

    /// The live allocation containing `ptr`: its base pointer and block size.
    pub fn base_alloc(&self, ptr: DevPtr) -> Result<(DevPtr, u64)> {
        self.find(|g| {
            let (base, _) = g.live_allocation(ptr)?;
            Some((base, g.block_len(base)))
        })
        .ok_or_else(|| {
            Error::BadPointer(
                PointerFault::Unknown,
                format!("base_alloc: pointer {ptr:#x} is not inside a live torch-arena allocation"),
            )
        })
    }

    /// `empty_cache`: wait for every stream, then give every cached page back to the driver.
    pub fn empty_cache(&self) -> Result<ReclaimReport> {
        self.reclaim(true)
    }

    /// Wait for every stream, then return empty slabs and cached ranges to the page pool (pages
    /// stay created, ready to back any new range). Says what was recovered.
    pub fn defragment(&self) -> Result<ReclaimReport> {
        self.reclaim(false)
    }

    fn reclaim(&self, release: bool) -> Result<ReclaimReport> {
        let mut report = ReclaimReport::default();
        for i in self.used() {
            report += self.on(i, |g| g.reclaim(release))?;
        }
        Ok(report)
    }

    /// Cap physical memory at `fraction` of the device. Cached pages above the new cap are
    /// released (pooled pages first, then idle mapped pages oldest first, once the GPU is done
    /// with them, waiting for it if need be); live memory is never touched, so reserved memory can
    /// stay above the cap only by what live allocations hold.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        // Every shard takes the new limit before any trims, so that none creates past it.
        for shard in self.shards.iter() {
            let mut g = shard.inner.lock();
            g.fraction = fraction;
            g.limit = limit_for(g.info.total_bytes, fraction, g.page);
            g.large_pages = large_pages(g.limit, g.page);
            g.idle_large = g.count_idle_large();
        }
        for i in self.used() {
            self.on(i, |g| g.trim_to_limit())?;
        }
        Ok(())
    }

    pub fn stats(&self) -> DeviceStats {
        if !self.shared.multi() {
            return self.shards[0].inner.lock().stats.clone();
        }
        // Every shard locked, so that no request is under way (`shared::Peaks::peaks`).
        let shards = self.lock_all();
        let mut stats = DeviceStats::new();
        for g in &shards {
            stats.fold(&g.stats);
        }
        stats.set_peaks(&self.shared.peaks.peaks());
        stats
    }

    /// Every shard's lock, in order (the lock order; `ARCHITECTURE.md`).
    fn lock_all(&self) -> Vec<parking_lot::MutexGuard<'_, Inner>> {
        self.shards.iter().map(|s| s.inner.lock()).collect()
    }

    pub fn reset_peak_stats(&self) {
        let mut shards = self.lock_all();
        for g in shards.iter_mut() {
            g.reset_peaks();
        }
        if self.shared.multi() {
            let currents: Vec<_> = shards.iter().map(|g| g.stats.currents()).collect();
            self.shared.peaks.reset(&currents);
        }
    }

    /// Where the physical pages are: in use, idle mapped, held unused, pooled (also in
    /// [`Arena::extras`], which costs more: it walks the slabs too). One visit per mapped handle
    /// and per unmapped page of every region, under the lock: for reports, not every malloc.
    pub fn pages(&self) -> PageCounts {
        let mut pages = PageCounts::default();
        for i in self.used() {
            pages += self.on(i, |g| g.page_counts());
        }
        pages
    }

    /// `(limit, free)`: the bytes this arena may hold reserved (the device's capacity, or the
    /// memory fraction of it), and the device's free bytes as the driver reports them (0 where
    /// it cannot say). One driver call: for reports and the out-of-memory path.
    pub fn limits(&self) -> (u64, u64) {
        let g = self.shards[0].inner.lock();
        let free = g.dev.mem_get_info().map_or(0, |(free, _)| free);
        (g.limit, free)
    }

    /// Physical memory created so far, by whether its request took the bytes requested to a new
    /// peak (also in [`Arena::extras`], which costs more: it walks the slabs).
    pub fn growth(&self) -> GrowthCounts {
        let mut growth = GrowthCounts::default();
        for i in self.used() {
            growth += self.on(i, |g| g.growth);
        }
        growth
    }

    pub fn reset_accumulated_stats(&self) {
        for mut g in self.lock_all() {
            g.reset_accumulated();
        }
    }

    /// Pages lent now: idle pages of a mapping a live block pins, mapped a second time where a
    /// request at the limit needed them (`Inner::lend_idle`).
    pub fn lent_pages(&self) -> u64 {
        self.used().map(|i| self.on(i, |g| g.lent_pages)).sum()
    }

    /// Pages mapped now as views past their pieces' first: pieces moved at the limit and kept
    /// mapped where they were too (`views.rs`).
    pub fn view_pages(&self) -> u64 {
        self.used().map(|i| self.on(i, |g| g.view_pages)).sum()
    }

    pub fn extras(&self) -> ArenaExtras {
        let mut extras = self.on(0, |g| g.extras());
        for i in self.used().skip(1) {
            extras.merge(self.on(i, |g| g.extras()));
        }
        extras
    }

    /// Before `fork()` (`crate::fork`): takes every shard's lock in order, then the device's
    /// locks.
    pub fn fork_prepare(&self) {
        let guards = self.lock_all();
        guards[0].dev.fork_prepare();
        for g in guards {
            std::mem::forget(g);
        }
    }

    /// After `fork()`, in the parent (`child` false) or the child: gives back what
    /// [`Arena::fork_prepare`] took.
    ///
    /// # Safety
    /// Once after each `fork_prepare`, on the same thread.
    pub unsafe fn fork_release(&self, child: bool) {
        // SAFETY: this thread holds every shard's lock (the caller's contract), so their state
        // is ours to read, and they are given back after the device's.
        unsafe {
            (*self.shards[0].inner.data_ptr()).dev.fork_release(child);
            for shard in self.shards.iter().rev() {
                crate::fork::release(&shard.inner, child);
            }
        }
    }

    pub fn device(&self) -> Arc<dyn Device> {
        self.shards[0].inner.lock().dev.clone()
    }

    /// Check every internal invariant, walking all state (tests only: O(everything)).
    pub fn check_consistency(&self) -> std::result::Result<(), String> {
        let mut held = 0;
        for (i, shard) in self.shards.iter().enumerate() {
            let g = shard.inner.lock();
            g.check_consistency()
                .map_err(|e| format!("shard {i}: {e}"))?;
            held += g.reserved();
        }
        let counted = self.shared.reserved();
        let limit = self.shards[0].inner.lock().limit;
        if counted > limit {
            return Err(format!(
                "the shards hold {counted} bytes, over the limit of {limit}"
            ));
        }
        if held != counted {
            return Err(format!(
                "the shards hold {held} bytes, the limit counts {counted}"
            ));
        }
        if self.shared.multi() {
            let stats = self.stats();
            for (k, (c, p)) in stats.currents().iter().zip(stats.peaks()).enumerate() {
                if *c > p {
                    return Err(format!(
                        "statistic {k}: the device's current value {c} is over its peak {p}"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Run `f` on shard `i`'s state `g` once several shards serve: what it changed in the shard's
/// statistics goes to the device's peaks (`shared::Peaks`).
fn counted<R>(shared: &Shared, i: usize, g: &mut Inner, f: impl FnOnce(&mut Inner) -> R) -> R {
    let r = f(g);
    shared
        .peaks
        .request_ended(i, &g.stats, std::mem::take(&mut g.rising));
    r
}
