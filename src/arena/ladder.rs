//! The out-of-memory ladder: the escalation steps a request takes when its first try fails
//! (synchronise every stream, release what is cached), and what is reclaimed on the way and on
//! request (`empty_cache`, `defragment`, a lowered memory fraction, idle-page decay). The fast
//! path that comes first is `alloc.rs`.

use super::*;

impl Inner {
    /// The out-of-memory ladder, for a request the first try could not serve: each step frees
    /// more (wait for every stream, then give back what is cached) and the request is tried
    /// again; a request that still fails gives back the pages created for it since `created`
    /// (`num_device_alloc` when it began) and is `None`.
    pub(super) fn escalate(
        &mut self,
        size: u64,
        stream: StreamId,
        pool: Option<PoolId>,
        created: i64,
        release: bool,
    ) -> Result<Option<Block>> {
        // The escalation ladder: each step frees more, then the request is tried again.
        let steps = [Escalation::SynchronizeAll, Escalation::ReleaseCached];
        for step in steps.into_iter().take(if release { 2 } else { 1 }) {
            match step {
                // Wait for every stream so pending frees finish and every idle page is safe to
                // move, then take pages from anywhere.
                Escalation::SynchronizeAll => {
                    self.count_retry();
                    tracing::debug!(
                        device = self.info.ordinal,
                        size,
                        "allocation retried after waiting for every stream (pages moved from anywhere)"
                    );
                    // Every idle page is now safe to use anywhere, so pages may be lent.
                    self.lend_ok = self.synchronize_all()?;
                }
                // The driver may refuse pages we are allowed (another process holds them, or the
                // address space is spent): give back what we cache, idle streams included.
                Escalation::ReleaseCached => {
                    self.reclaim(true)?;
                }
            }
            // Releasing may have retired this very stream (it held nothing): look it up again.
            let s = self.state_for(stream, pool)?;
            match self.try_alloc(size, s, true) {
                Ok(b) => return Ok(Some(self.block(b))),
                Err(Miss::Device(e)) => return Err(e.into()),
                Err(Miss::NoMemory) => {}
            }
        }
        // Pages created for this request and left in the pool go back: a failed request holds
        // nothing it took for itself.
        let mut mine = (self.stats.num_device_alloc - created).max(0);
        while mine > 0 {
            let Some((h, k)) = self.pool_take_whole(u32::MAX) else {
                break;
            };
            if self.release_handle(h, k).is_err() {
                break;
            }
            mine -= 1;
        }
        Ok(None)
    }

    /// Whether the whole device was synchronised (not during a capture).
    pub(super) fn synchronize_all(&mut self) -> Result<bool> {
        // No device-wide synchronisation while a CUDA graph capture may be under way (pool.rs).
        if self.capture_underway()? {
            self.synchronize_outside_capture()?;
            return Ok(false);
        }
        self.synchronize_device()?;
        Ok(true)
    }

    /// Dissolve every empty current slab (the others are dissolved as they empty): their pages
    /// go idle once nothing else is on them. Host only. Returns how many.
    pub(super) fn dissolve_empty_slabs(&mut self) -> u64 {
        let mut n = 0;
        for s in 0..self.streams.len() {
            // A retired stream's slot has no classes.
            for ci in 0..self.streams[s].classes.len() {
                let cs = &mut self.streams[s].classes[ci];
                if let Some(id) = cs.current
                    && self.slabs[id as usize].is_empty()
                {
                    cs.current = None;
                    self.dissolve_slab(id);
                    n += 1;
                }
            }
        }
        n
    }

    /// Wait for all streams; dissolve empty current slabs; unmap every idle page into the pool;
    /// with `release`, give the pool (and idle plain segments) back to the driver.
    pub(super) fn reclaim(&mut self, release: bool) -> Result<ReclaimReport> {
        let mut report = self.unmap_idle_until(|_| false)?;
        if release {
            while let Some((h, k)) = self.pool_take_whole(u32::MAX) {
                self.release_handle(h, k)?;
                report.pages_released += k as u64;
                report.bytes_released += k as u64 * self.page;
            }
            for id in 0..self.regions.len() as u32 {
                let r = &self.regions[id as usize];
                if r.plain && r.live && r.in_use == 0 && !self.region_pinned(id) {
                    report.pages_released += r.len / self.page;
                    report.bytes_released += r.len;
                    self.release_plain(id)?;
                }
            }
            // Streams left holding nothing give back their reservations and page tables too
            // (their idle pages were unmapped above).
            self.retire_idle_streams(true, u64::MAX)?;
        }
        Ok(report)
    }

    /// Wait for all streams; dissolve empty current slabs; unmap idle pages into the pool, oldest
    /// first on each stream, until `enough` says so after an unmap (never: every idle page).
    /// The inactive-split figures follow the slabs dissolved.
    pub(super) fn unmap_idle_until(
        &mut self,
        mut enough: impl FnMut(&mut Inner) -> bool,
    ) -> Result<ReclaimReport> {
        let whole = self.synchronize_all()?;
        let synced = self.seq;
        let mut report = ReclaimReport {
            slabs_released: self.dissolve_empty_slabs(),
            ..ReclaimReport::default()
        };
        // Every idle page is proven unused after a device-wide synchronisation; during a capture
        // only those of the streams synchronised (pool.rs). Pages of the empty slabs dissolved
        // just now are too: nothing can have used them since.
        let mut safe = synced;
        'rounds: loop {
            if whole {
                let now = self.seq;
                for st in self.streams.iter_mut().filter(|st| st.safe_seq == safe) {
                    st.safe_seq = now;
                }
                safe = now;
            }
            while let Some(at) = self
                .streams
                .iter()
                .map(|st| (st.idle_head, st.safe_seq))
                .find(|&(h, safe)| h != PageRef::NONE && self.slot(h).idle_stamp <= safe)
                .map(|(h, _)| h)
            {
                if let Some(run) = self.unmap_idle(at)? {
                    self.pool_put(run, Instant::now());
                    report.pages_unmapped += run.k as u64;
                    report.bytes_recovered += run.k as u64 * self.page;
                    if enough(self) {
                        break 'rounds;
                    }
                }
            }
            // Unmapping a mapping of lent pages gave them back where they were lent from
            // (`unlend`), where a mapping may now be idle with a new stamp. Nothing can have used
            // its pages since the synchronisation (they held no block there, and the mapping
            // that borrowed them was proven done before it was unmapped), and nothing else was
            // freed since (the lock is held): once more round, with every stamp so far safe.
            if !whole || self.seq == safe {
                break;
            }
        }
        self.update_inactive_split(Pool::Small);
        self.update_inactive_split(Pool::Large);
        Ok(report)
    }

    /// Give an unmapped handle of `k` pages back to the driver. If the driver refuses, it goes
    /// to the pool (still counted as reserved) so a later trim can try again.
    pub(super) fn release_handle(
        &mut self,
        h: PageHandle,
        k: u32,
    ) -> std::result::Result<(), DeviceError> {
        if let Err(e) = self.dev.release_page(h) {
            self.pool_put(Run::whole(h, k), Instant::now());
            return Err(e);
        }
        if let Some(k) = self.shared_handles.remove(&h.0) {
            self.shared_pages -= k as u64;
        }
        self.shared.unreserve(k as u64 * self.page);
        self.count_released(Pool::Large, k as u64 * self.page);
        Ok(())
    }

    /// Give a plain segment with no live block back to the driver. If the driver refuses, the
    /// segment stays whole in its stream's heap, still counted, so a later trim can try again.
    pub(super) fn release_plain(&mut self, id: u32) -> Result<()> {
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
        self.shared.unreserve(len);
        self.count_released(pool, len);
        Ok(())
    }

    /// Release this shard's cached pages until the memory all shards hold is within the limit:
    /// the pool first, then idle mapped pages (each once its stream is done with it, waiting if
    /// need be), then empty plain segments.
    pub(super) fn trim_to_limit(&mut self) -> Result<()> {
        while self.shared.reserved() > self.limit {
            if let Some((h, k)) = self.pool_take_whole(u32::MAX) {
                self.release_handle(h, k)?;
                continue;
            }
            let idle = (0..self.streams.len() as u32)
                .find(|&s| self.streams[s as usize].idle_head != PageRef::NONE);
            if let Some(s) = idle {
                let at = self.streams[s as usize].idle_head;
                if !self.stream_done_with(s, self.slot(at).idle_stamp, true)? {
                    break; // a stream being captured (pool.rs): nothing proves it done
                }
                if let Some(run) = self.unmap_idle(at)? {
                    self.release_run(run)?;
                }
                continue;
            }
            let empty = (0..self.regions.len() as u32).find(|&id| {
                let r = &self.regions[id as usize];
                r.plain && r.live && r.in_use == 0 && !self.region_pinned(id)
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
    pub(super) fn maybe_decay(&mut self) {
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
                let Ok(run) = self.unmap_idle(at) else {
                    break;
                };
                // A refused release keeps the handle in the pool.
                if let Some(run) = run {
                    let _ = self.release_run(run);
                }
            }
        }
        let mut old = Vec::new();
        for (&k, list) in self.pool.iter_mut() {
            list.retain(|&(h, t)| {
                let stale = now.duration_since(t) >= after;
                if stale {
                    old.push((h, k));
                }
                !stale
            });
        }
        self.pool.retain(|_, list| !list.is_empty());
        for &(_, k) in &old {
            self.pooled_pages -= k as u64;
        }
        for (h, k) in old {
            // A refused release keeps the handle in the pool.
            let _ = self.release_handle(h, k);
        }
    }

    /// The out-of-memory message: what the device has, and where every reserved byte is, each
    /// kind named with what would free it. O(pages), on the failure path only.
    pub(super) fn oom_message(&self, size: u64) -> String {
        self.oom_text(size, &self.oom_figures())
    }

    /// What the out-of-memory message says of this shard's memory (`OomFigures`).
    pub(super) fn oom_figures(&self) -> OomFigures {
        let s = &self.stats;
        let allocated = s.allocated_bytes.all().current as u64;
        // Idle mapped and pooled pages, as `pages()` and the replay count them (`cached_bytes`).
        let pages = self.page_counts();
        // Idle pages of released private pools that no synchronisation has proven unused yet
        // are not usable: they are not "cached" (pool.rs, `released_pool_pages`).
        let (released_pools, released) = self.released_pool_pages();
        let released = released * self.page;
        let (pools, pool_pages, pool_unused) = self.pool_pages();
        OomFigures {
            reserved: s.reserved_bytes.all().current as u64,
            allocated,
            requested: s.requested_bytes.all().current as u64,
            // Freed, but waiting for the streams they were used on (record_stream).
            pending: (s.active_bytes.all().current as u64).saturating_sub(allocated),
            released_pools,
            released,
            idle: (pages.idle_mapped * self.page).saturating_sub(released),
            pooled: pages.pooled * self.page,
            // Held pages of live private pools are reported with the pools (`pool_oom_note`).
            held: self.held_pages_outside_pools() * self.page,
            split: s.inactive_split_bytes.all().current.max(0) as u64,
            live: s.allocation.all().current,
            pools,
            pool_bytes: pool_pages * self.page,
            pool_unused: pool_unused * self.page,
        }
    }

    /// The out-of-memory message for a request of `size` bytes, of memory `f` (this shard's, or
    /// every shard's added up).
    pub(super) fn oom_text(&self, size: u64, f: &OomFigures) -> String {
        let (free, total) = self
            .dev
            .mem_get_info()
            .unwrap_or((0, self.info.total_bytes));
        let OomFigures {
            reserved,
            allocated,
            requested,
            pending,
            released_pools,
            released,
            idle,
            pooled,
            held,
            split,
            live,
            ..
        } = *f;
        let allowed = if self.fraction < 1.0 {
            format!(
                " Of the allowed {} (memory fraction),",
                format_size(self.limit)
            )
        } else {
            String::new()
        };
        let holders = if pending > 0 {
            "live allocations or freed ones still waiting"
        } else {
            "live allocations"
        };
        let pending = if pending > 0 {
            format!(
                "{} in freed allocations waiting for the streams they were used on \
                 (record_stream), ",
                format_size(pending)
            )
        } else {
            String::new()
        };
        let released = if released > 0 {
            let frees = if self.recording_pools > 0 {
                format!(
                    "none may run while a CUDA graph capture is under way ({} private pool(s) \
                     recording): once the capture ends, the next allocation that needs it, \
                     torch.cuda.synchronize() or empty_cache() makes it usable",
                    self.recording_pools
                )
            } else {
                "torch.cuda.synchronize() or empty_cache() makes it usable".to_string()
            };
            format!(
                "{} in {released_pools} released private pool(s) (CUDA graphs) awaiting a \
                 synchronisation (a graph may still be replaying on any stream until a \
                 device-wide synchronisation proves it done; {frees}), ",
                format_size(released)
            )
        } else {
            String::new()
        };
        format!(
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is \
             free.{allowed} torch-arena holds {} reserved: {} allocated to live tensors ({} requested), \
             {pending}{} cached ({} in idle mapped pages, {} in unmapped pages), {released}{} unused \
             in pages that cannot move (their handles also hold {holders}) and {} free inside \
             partially used pages ({:.1}% fragmentation). Live allocations: {}.{}",
            format_size(size),
            self.info.ordinal,
            format_size(total),
            format_size(free),
            format_size(reserved),
            format_size(allocated),
            format_size(requested),
            format_size(idle + pooled),
            format_size(idle),
            format_size(pooled),
            format_size(held),
            format_size(split),
            if reserved > 0 {
                split as f64 * 100.0 / reserved as f64
            } else {
                0.0
            },
            live,
            pool_oom_note(f),
        )
    }
}

/// What an out-of-memory message says of the memory of one shard, or of several added up.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct OomFigures {
    reserved: u64,
    allocated: u64,
    requested: u64,
    pending: u64,
    released_pools: u64,
    released: u64,
    idle: u64,
    pooled: u64,
    held: u64,
    split: u64,
    live: i64,
    /// Live private pools (every shard knows every pool: the most, not the sum), the bytes
    /// their pages hold, and of those the bytes no block uses.
    pools: u64,
    pool_bytes: u64,
    pool_unused: u64,
}

impl std::ops::AddAssign for OomFigures {
    fn add_assign(&mut self, o: OomFigures) {
        self.reserved += o.reserved;
        self.allocated += o.allocated;
        self.requested += o.requested;
        self.pending += o.pending;
        self.released_pools += o.released_pools;
        self.released += o.released;
        self.idle += o.idle;
        self.pooled += o.pooled;
        self.held += o.held;
        self.split += o.split;
        self.live += o.live;
        self.pools = self.pools.max(o.pools);
        self.pool_bytes += o.pool_bytes;
        self.pool_unused += o.pool_unused;
    }
}

/// The private pools' part of the out-of-memory message.
fn pool_oom_note(f: &OomFigures) -> String {
    if f.pool_bytes == 0 {
        return String::new();
    }
    format!(
        " Of the reserved memory, {} is held by {} private pool(s) (CUDA graphs), {} of it \
         free but kept for the graphs' replays until they are reset.",
        format_size(f.pool_bytes),
        f.pools,
        format_size(f.pool_unused),
    )
}
