//! Regions, their page tables and the idle lists: which physical page backs which address, how
//! many blocks use it, and how pages are acquired (pool, idle pages proven safe, new pages),
//! mapped, unmapped and given back.

use super::growth::*;
use super::*;

/// Idle handles passed over per stream when looking for one small enough to stitch (a bound on
/// the work of one miss; the list is oldest first, so the search stops at the first the GPU may
/// still use anyway).
pub(super) const IDLE_SCAN: u32 = 64;

/// Size of the plain (non-VMM) segments that medium requests are packed into, as PyTorch does.
pub(super) const PLAIN_MEDIUM_SEGMENT: u64 = 20 << 20;

impl Inner {
    /// The index of the page `offset` bytes into a region.
    #[inline]
    pub(super) fn page_of(&self, offset: u64) -> u64 {
        if self.page_shift != 0 {
            offset >> self.page_shift
        } else {
            offset / self.page
        }
    }

    /// The most new pages a request of `size` bytes could need: a block of its rounded length,
    /// starting anywhere in a page, spans at most two pages more than the whole pages its length
    /// holds (saturating: a size no device holds asks for everything).
    pub(super) fn pages_for(&self, size: u64) -> u64 {
        let len = size.checked_next_multiple_of(MIN_BLOCK).unwrap_or(u64::MAX);
        self.page_of(len).saturating_add(2)
    }

    /// First and last page index of `[addr, addr + len)` in `region`.
    #[inline]
    pub(super) fn pages_of(&self, region: u32, addr: u64, len: u64) -> (u32, u32) {
        let base = self.regions[region as usize].base;
        (
            self.page_of(addr - base) as u32,
            self.page_of(addr + len - 1 - base) as u32,
        )
    }

    pub(super) fn add_region(
        &mut self,
        s: u32,
        pool: Pool,
        need: u64,
    ) -> std::result::Result<u32, Miss> {
        let (base, len, plain) = if self.vmm {
            let len = round_up(need, self.page).max(self.region_len);
            let base = self.dev.reserve(len, self.page)?;
            self.count_reservation();
            if base == 0 {
                let _ = self.dev.free_address(base, len);
                return Err(Miss::Device(address_zero("cuMemAddressReserve")));
            }
            (base, len, false)
        } else {
            let len = match pool {
                Pool::Small => round_up(need, self.page),
                Pool::Large if need < PLAIN_MEDIUM_SEGMENT / 2 => PLAIN_MEDIUM_SEGMENT,
                Pool::Large => round_up(need, self.page),
            };
            if !self.shared.try_reserve(len, self.limit) {
                return Err(Miss::NoMemory);
            }
            let base = match self.dev.alloc_plain(len) {
                Ok(base) => base,
                Err(e) => {
                    self.shared.unreserve(len);
                    return Err(e.into());
                }
            };
            if base == 0 {
                let _ = self.dev.free_plain(base);
                self.shared.unreserve(len);
                return Err(Miss::Device(address_zero("cuMemAlloc")));
            }
            self.count_created(pool, len);
            self.count_growth(len, true);
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
        let id = crate::slots::reuse_or_push(&mut self.regions, &mut self.free_regions, region);
        self.streams[s as usize].regions.push(id);
        let at = self.region_by_addr.partition_point(|&(b, _)| b < base);
        self.region_by_addr.insert(at, (base, id));
        self.heap(s, pool).add_region(base, len, id);
        Ok(id)
    }

    /// Count one more user on every page of `[addr, addr + len)`, then map physical pages where
    /// none is mapped yet. The users come first: a page in use is never reclaimed, so nothing
    /// taken to back this range can be one of its own pages. On failure nothing changes.
    pub(super) fn use_range(
        &mut self,
        region: u32,
        addr: u64,
        len: u64,
        anywhere: bool,
    ) -> std::result::Result<(), Miss> {
        // A view whose piece is in use elsewhere cannot serve here (views.rs).
        if !self.views.is_empty() {
            self.clear_blocked_views(region, addr, len)?;
        }
        if self.count_range(region, addr, len, true) {
            return Ok(()); // every page mapped already: the usual case, a freed block reused
        }
        if self.regions[region as usize].plain {
            return Ok(()); // no VMM: a plain segment is backed whole, with no page to map
        }
        let (first, last) = self.pages_of(region, addr, len);
        // Medium blocks grow the pool in steps (`back_run`): those PyTorch packs into 20 MiB
        // segments (under `FLOOR_BELOW_BYTES`) steps of at least GROWTH_FLOOR_BYTES, the rest
        // what the ramp allows. Larger ones map what they need, but for a block that drifted,
        // grows for layout or grows ahead (`large_step`): its handle also covers some pages
        // after it.
        let step = match len {
            l if l < FLOOR_BELOW_BYTES => Some(Step::Medium(self.growth_floor_pages)),
            l if l < MEDIUM_BYTES => Some(Step::Medium(0)),
            l => self.large_step(region, l, addr),
        };
        let base = self.regions[region as usize].base;
        let apart = Apart {
            first: (!(addr - base).is_multiple_of(self.page)).then_some(first),
            last: (!(addr + len - base).is_multiple_of(self.page)).then_some(last),
        };
        let n = last - first + 1;
        if let Err(e) = self.back_pages(region, first, n, anywhere, step, apart) {
            self.count_range(region, addr, len, false);
            return Err(e);
        }
        if len >= MEDIUM_BYTES {
            if self.grown_lengths.len() >= GROWN_LENGTHS_KEPT {
                self.grown_lengths.clear();
            }
            self.grown_lengths.insert(len, (addr, self.tick));
        }
        Ok(())
    }

    /// Add (or remove) one user and the covered bytes of `[addr, addr + len)` on its pages. Only
    /// the range's first and last page can be shared with other blocks, so only they keep a
    /// count of users and covered bytes; the pages between belong to this range alone and are
    /// counted in bulk, handle by handle (`count_interior`): the cost is independent of the
    /// block's size. Returns whether every page of the range is mapped.
    pub(super) fn count_range(&mut self, region: u32, addr: u64, len: u64, add: bool) -> bool {
        let (first, last) = self.pages_of(region, addr, len);
        let mut mapped = self.count_boundary(region, first, addr, len, add);
        if last != first {
            mapped &= self.count_boundary(region, last, addr, len, add);
        }
        if last > first + 1 {
            mapped &= self.count_interior(region, first + 1, last - 1, add);
        }
        mapped
    }

    /// One user more (or less) of page `p`, which `[addr, addr + len)` may cover in part.
    /// Returns whether the page is mapped. Inlined into `count_range`, its only caller: called,
    /// its entry and exit were a third of its 64 instructions (`bench/instructions
    /// full/1000/1/arena`: 2,146.5 instructions a pair called, 2,074.8 inlined).
    #[inline(always)]
    fn count_boundary(&mut self, region: u32, p: u32, addr: u64, len: u64, add: bool) -> bool {
        let page = self.page;
        let r = &mut self.regions[region as usize];
        let start = r.base + p as u64 * page;
        // At most a page, so at most 1 GiB (`Arena::new`).
        let overlap = ((addr + len).min(start + page) - addr.max(start)) as u32;
        let slot = &mut r.pages[p as usize];
        let was = slot.is_partial(page);
        if add {
            slot.covered += overlap;
            slot.users += 1;
        } else {
            slot.covered -= overlap;
            slot.users -= 1;
        }
        let (users, now) = (slot.users, slot.is_partial(page));
        let mapped = slot.phys.is_some();
        self.partial_pages += now as i64 - was as i64;
        match (add, users) {
            (true, 1) => self.page_now_used(region, p),
            (false, 0) => self.page_now_unused(region, p),
            _ => {}
        }
        mapped
    }

    /// Pages `a..=b` of `region` start (or stop) being used by the one block covering them
    /// whole: no per-page count is kept for them (a page is in use when it has users or lies
    /// inside a live block), only the region's and the handles' counts change, one visit per
    /// mapped handle (unmapped pages, met only before a miss maps them, one by one). Returns
    /// whether every page of `a..=b` is mapped.
    fn count_interior(&mut self, region: u32, a: u32, b: u32, add: bool) -> bool {
        let n = b - a + 1;
        let r = &mut self.regions[region as usize];
        let (pool, stream) = (r.pool, r.stream);
        if add {
            r.in_use += n;
            self.in_use_pages[pool as usize] += n as u64;
        } else {
            r.in_use -= n;
            self.in_use_pages[pool as usize] -= n as u64;
        }
        let pinned = self.streams[stream as usize].pinned;
        let mut mapped = true;
        let mut p = a;
        while p <= b {
            let slot = self.regions[region as usize].pages[p as usize];
            if slot.phys.is_none() {
                mapped = false;
                p += 1;
                continue;
            }
            let head = p - slot.hoff as u32;
            let pages = &mut self.regions[region as usize].pages;
            let end = (head + pages[head as usize].hlen as u32 - 1).min(b);
            let span = (end - p + 1) as u16;
            let h = &mut pages[head as usize];
            let at = PageRef { region, page: head };
            if add {
                h.busy += span;
                // (A pinned pool's unused handle is not on the idle list: pool.rs.)
                if h.busy == span && h.idle_stamp != 0 {
                    self.idle_unlink(at);
                }
            } else {
                h.busy -= span;
                if h.busy == 0 && !pinned {
                    self.idle_push(at);
                }
            }
            p = end + 1;
        }
        mapped
    }

    /// Map physical memory under every page of `first..first+n` of `region` that has none: each
    /// maximal run of unmapped pages gets handles that tile it exactly (one cuMemMap each) and one
    /// cuMemSetAccess (with a `step`, the last may cover spare pages past the range: `back_run`).
    /// The pages are already counted as used, so reclaiming cannot pick them. On
    /// failure every handle mapped here is unmapped again and pooled (one the driver refuses to
    /// unmap stays mapped, and goes idle when its users are uncounted).
    pub(super) fn back_pages(
        &mut self,
        region: u32,
        first: u32,
        n: u32,
        anywhere: bool,
        step: Option<Step>,
        apart: Apart,
    ) -> std::result::Result<(), Miss> {
        if self.regions[region as usize].plain {
            return Ok(());
        }
        let mut p = first;
        while p < first + n {
            let slot = &self.regions[region as usize].pages[p as usize];
            if slot.phys.is_some() {
                // Past the rest of this handle: one visit per handle, not per page.
                let head = &self.regions[region as usize].pages[(p - slot.hoff as u32) as usize];
                p += head.hlen as u32 - slot.hoff as u32;
                continue;
            }
            let start = p;
            while p < first + n
                && self.regions[region as usize].pages[p as usize]
                    .phys
                    .is_none()
            {
                p += 1;
            }
            // Runs mapped before a failure stay mapped: valid memory that goes idle when the
            // caller uncounts its users.
            let last = p == first + n;
            let run = p - start;
            self.back_run(region, start, run, anywhere, step.filter(|_| last), apart)?;
        }
        Ok(())
    }

    /// Map handles over the unmapped run `start..start+len` of `region`, granting access once.
    /// With a `step` (a medium block's last run, or a large block's with spare pages), growth
    /// comes in steps: when a handle must be created and the pages after the run are unmapped
    /// too, it also covers some of them (mapped, unused, ready for the next block placed
    /// there). A medium block's step goes up to [`GROWTH_BYTES`] in all, as PyTorch rounds
    /// medium requests up to 20 MiB segments, so one create serves several medium blocks; a
    /// large block's covers what [`Step::Spare`] says, for the next shift of its place.
    /// The small pool grows the same way, up to [`SMALL_GROWTH_PAGES`] at a time.
    fn back_run(
        &mut self,
        region: u32,
        start: u32,
        len: u32,
        anywhere: bool,
        step: Option<Step>,
        apart: Apart,
    ) -> std::result::Result<(), Miss> {
        let owner = self.regions[region as usize].stream;
        let pool = self.regions[region as usize].pool;
        let private = self.streams[owner as usize].pool.is_some();
        // A handle moves only whole, and stays where it is while any of its pages is in use: the
        // nearer the limit, the smaller the handles, so that memory stays free to move where
        // the next request needs it. At most 1/HEADROOM_SHARE of what the limit leaves.
        let headroom = (self.room() / self.page / HEADROOM_SHARE).clamp(1, u32::MAX as u64) as u32;
        // How far a step goes (`offered`: the free pages after the run it may cover; `scale`:
        // how many of them). The small pool's (a few pages, shared by slabs of every class)
        // scales with all that is held; a medium block's with the pages created in steps so far,
        // so that a few medium blocks beside large ones are not rounded up, but to at least
        // what its `Step::Medium` asks with the run, so that a small workload does not grow by
        // the page where PyTorch's first 20 MiB segment would serve it whole; a large block's
        // is what its `Step::Spare` says. Handles with spare pages hold at most their share of
        // the limit: spare pages join other blocks, and a handle whose pages serve several
        // blocks cannot move while any of them lives. A private pool (graph capture) keeps its
        // pages until it is released: no step.
        let large_handle = self.handle_pages.min(headroom);
        let (per_handle, offered, scale) = match (pool, step) {
            (Pool::Small, _) => (
                SMALL_GROWTH_PAGES,
                self.spare_after(region, start + len, len)
                    .min(SMALL_GROWTH_PAGES.saturating_sub(len)),
                self.small_step(),
            ),
            (Pool::Large, Some(Step::Medium(floor))) => (
                large_handle,
                self.spare_after(region, start + len, len),
                (self.grown_pages / GROWTH_SHARE).max(floor.saturating_sub(len) as u64),
            ),
            (Pool::Large, Some(Step::Spare(n) | Step::Ahead(n))) => (
                large_handle,
                self.spare_pages_after(region, start + len, n),
                n as u64,
            ),
            (Pool::Large, None) => (large_handle, 0, 0),
        };
        // Growth ahead is outside that budget: it comes only with a new peak, so its spare pages
        // are the next blocks' (a handle of it is pinned by its own block first, as any is), and
        // within the budget it would take the medium steps' share of it.
        let shared = !matches!(step, Some(Step::Ahead(_)));
        let budget = match shared {
            true => (self.limit / self.page / SPARE_LIMIT_SHARE)
                .saturating_sub(self.shared_pages + len as u64),
            false => u64::MAX,
        };
        let spare = match private {
            true => 0,
            false => (offered as u64).min(scale).min(budget) as u32,
        };
        // A boundary page goes apart only under a large handle: past the page itself, one
        // handle more costs a create and a map (and a grant's share) every time.
        let large = pool == Pool::Large && per_handle.min(len) >= self.large_pages;
        let extra = Extra {
            spare,
            stepping: offered > 0,
            shared,
            first_apart: large && apart.first == Some(start),
            last_apart: large && apart.last == Some(start + len - 1),
            whole: pool == Pool::Small,
            view: self.views_on && pool == Pool::Large && !private,
        };
        let handles = self.acquire(len, per_handle, anywhere, owner, extra)?;
        let (mapped, result) = self.map_runs(region, start, &handles);
        let end = start + len;
        // Every page of the run has a user already (its block or slab was counted first); the
        // spare pages past it have none.
        let mut at = start;
        for run in &handles[..mapped] {
            let head = &mut self.regions[region as usize].pages[at as usize];
            head.busy = ((at + run.k).min(end).saturating_sub(at)) as u16;
            at += run.k;
        }
        if pool == Pool::Small && mapped > 0 {
            self.move_reserved(Pool::Large, Pool::Small, (at - start) as u64, mapped as u64);
        }
        result
    }

    /// Map `runs` at consecutive pages of `region` from `start` (one cuMemMap each, one
    /// cuMemSetAccess) and enter them in its page table, each a mapping with no page in use.
    /// Returns how many were mapped: those after a failure go to the pool.
    pub(super) fn map_runs(
        &mut self,
        region: u32,
        start: u32,
        runs: &[Run],
    ) -> (usize, std::result::Result<(), Miss>) {
        let base = self.regions[region as usize].base;
        let pieces: Vec<Piece> = runs
            .iter()
            .map(|r| Piece {
                page: r.h,
                offset: r.off as u64 * self.page,
                size: r.k as u64 * self.page,
            })
            .collect();
        let (mapped, mut result) = match self.dev.map_run(base + start as u64 * self.page, &pieces)
        {
            Ok(()) => (runs.len(), Ok(())),
            Err(e) => (e.mapped.min(runs.len()), Err(Miss::Device(e.error))),
        };
        // A driver that refuses a second mapping of lent pages (CUDA allows it; a driver that
        // did not would refuse every time): no more lending here, and the request is short of
        // memory, as it would have been without lending.
        if let (Err(Miss::Device(e)), Some(run)) = (&result, runs.get(mapped))
            && self.lending.contains_key(&(run.h.0, run.off))
        {
            tracing::warn!(
                device = self.info.ordinal,
                error = %e,
                "the driver refused to map lent pages a second time: lending is off for this device"
            );
            self.lend_refused = true;
            result = Err(Miss::NoMemory);
        }
        for &run in &runs[mapped..] {
            self.put_back(run);
        }
        let mut at = start;
        for run in &runs[..mapped] {
            if let Some(lend) = self.lending.remove(&(run.h.0, run.off)) {
                self.lends.insert(base + at as u64 * self.page, lend);
            }
            self.view_mapped(*run, PageRef { region, page: at });
            let pages = &mut self.regions[region as usize].pages;
            for i in 0..run.k {
                let slot = &mut pages[(at + i) as usize];
                slot.phys = Some(run.h);
                slot.hoff = i as u16;
            }
            let head = &mut pages[at as usize];
            head.hlen = run.k as u16;
            head.hbase = run.off as u16;
            head.busy = 0;
            at += run.k;
        }
        (mapped, result)
    }

    /// Forget the mapping at `head..head+k` of `region` (after it was unmapped).
    fn clear_handle(&mut self, region: u32, head: u32, k: u32) {
        let pages = &mut self.regions[region as usize].pages;
        for i in head..head + k {
            let slot = &mut pages[i as usize];
            slot.phys = None;
            slot.hoff = 0;
            slot.hlen = 0;
            slot.hbase = 0;
            slot.busy = 0;
        }
    }

    /// Unmapped pieces of handles tiling `n` pages, in mapping order, each at most `per_handle`
    /// pages when created here; a handle created here may also cover up to `extra.spare` pages
    /// past the `n` (growth in steps, sized and budgeted by `back_run`: see [`Extra`]), mapped
    /// as a piece of its own. Pooled pieces that fit come first (largest first); then a larger
    /// pooled one, cut (no driver call: the rest stays pooled); then, with stitching or when
    /// `anywhere`, idle mappings proven safe: a small one mapped here as well (a view, `views.rs`),
    /// else one unmapped into the pool; then new handles within the limit; then, when `anywhere`,
    /// lent pages. On failure every piece taken goes back (to the pool, or where it is mapped).
    pub(super) fn acquire(
        &mut self,
        n: u32,
        per_handle: u32,
        anywhere: bool,
        own: u32,
        extra: Extra,
    ) -> std::result::Result<Vec<Run>, Miss> {
        let Extra {
            spare,
            stepping,
            shared,
            first_apart,
            last_apart,
            whole,
            view,
        } = extra;
        // While the limit leaves room for the whole request, a miss creates: an idle page moved
        // away is missed where it was, in every later step that repeats this one, and moving it
        // waits for the GPU to finish with it. Pages move (stitching) only when creating all of
        // it would pass the limit, and on the last-resort path.
        let grow = !anywhere && self.room() / self.page >= n as u64;
        let mut got: Vec<Run> = Vec::new();
        let mut have = 0u32;
        while have < n {
            let want = n - have;
            let pooled = match whole {
                true => self.pool_take_whole(want).map(|(h, k)| Run::whole(h, k)),
                false => self.pool_take(want),
            };
            if let Some(run) = pooled {
                got.push(run);
                have += run.k;
                continue;
            }
            // Pooled pieces left are all larger than what is needed: cut one (unmapped, it
            // costs nothing; the rest stays pooled for any other request).
            if !whole && let Some(run) = self.pool_cut(want) {
                got.push(run);
                have += run.k;
                continue;
            }
            if !grow && (self.stitch || anywhere) {
                // A small idle mapping is mapped here as well rather than moved (views.rs).
                if view {
                    match self.view_idle(want, anywhere, own) {
                        Ok(Some(run)) => {
                            got.push(run);
                            have += run.k;
                            continue;
                        }
                        Ok(None) => {}
                        Err(e) => return Err(self.give_back(got, e.into())),
                    }
                }
                match self.reclaim_idle_handle(want, anywhere, own) {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => return Err(self.give_back(got, e.into())),
                }
                // Whole handles only, and those pooled are all larger than what is needed:
                // give one back rather than grow beside it (re-cutting). On the last-resort
                // path this also makes room, once the limit is reached, for one that fits.
                if whole && let Some((h, k)) = self.pool_take_whole(u32::MAX) {
                    if let Err(e) = self.release_handle(h, k) {
                        return Err(self.give_back(got, Miss::Device(e)));
                    }
                    continue;
                }
            }
            let room = (self.room() / self.page) as u32;
            // A boundary page apart (`Extra`): the first alone, the rest but the last, then the
            // last with any spare pages past it.
            let k = match want {
                1 => (1 + spare).min(per_handle).min(room),
                _ if first_apart && have == 0 => 1,
                _ if last_apart => (want - 1).min(per_handle).min(room),
                _ => (want + spare).min(per_handle).min(room),
            };
            // Another shard may have taken the room since it was read: the reservation decides.
            if room > 0 && self.shared.try_reserve(k as u64 * self.page, self.limit) {
                match self.dev.create_page(k as u64 * self.page) {
                    Ok(h) => {
                        if stepping {
                            self.grown_pages += k as u64;
                        }
                        if k > want && shared {
                            self.shared_handles.insert(h.0, k);
                            self.shared_pages += k as u64;
                        }
                        self.count_created(Pool::Large, k as u64 * self.page);
                        self.count_growth(k as u64 * self.page, false);
                        got.push(Run::whole(h, k));
                        have += k;
                        continue;
                    }
                    Err(e) => {
                        self.shared.unreserve(k as u64 * self.page);
                        return Err(self.give_back(got, e.into()));
                    }
                }
            }
            if anywhere
                && !whole
                && let Some(run) = self.lend_idle(want)
            {
                got.push(run);
                have += run.k;
                continue;
            }
            return Err(self.give_back(got, Miss::NoMemory));
        }
        Ok(got)
    }

    pub(super) fn give_back(&mut self, runs: Vec<Run>, why: Miss) -> Miss {
        for run in runs {
            self.put_back(run);
        }
        why
    }

    /// An acquired piece not mapped after all: a lent one goes back to where it was lent from, a
    /// view stays where it is mapped, any other goes to the pool.
    fn put_back(&mut self, run: Run) {
        if self.view_not_made(run) {
            return;
        }
        match self.lending.remove(&(run.h.0, run.off)) {
            Some(lend) => self.unlend(lend),
            None => self.pool_put(run, Instant::now()),
        }
    }

    /// Unmap one idle mapping into the pool, taking it only once its stream is done with it
    /// (with `block`, waiting for the stream): stream `own`'s first, then other streams', each
    /// oldest first. Only a mapping of at most `want` pages is taken, unless `block` (the
    /// last-resort path; the caller cuts what is too large). A stream's first mapping its fence
    /// does not cover ends that stream's turn: the rest of its list is newer. Says whether one
    /// was unmapped.
    pub(super) fn reclaim_idle_handle(
        &mut self,
        want: u32,
        block: bool,
        own: u32,
    ) -> std::result::Result<bool, DeviceError> {
        let others = (0..self.streams.len() as u32).filter(|&s| s != own);
        for s in std::iter::once(own).chain(others) {
            let mut at = self.streams[s as usize].idle_head;
            // Bounded: a mapping too large is passed over, at most this many per stream.
            let mut looked = 0;
            while at != PageRef::NONE && looked < IDLE_SCAN {
                looked += 1;
                let slot = *self.slot(at);
                if !self.stream_done_with(s, slot.idle_stamp, block)? {
                    break;
                }
                // A piece taken as a view for this request stays mapped, and unmapping a view
                // whose piece is in use elsewhere would free nothing (views.rs).
                if (slot.hlen as u32 <= want || block)
                    && !self.view_in_flight(at)
                    && !self.view_blocked(at)
                {
                    if let Some(run) = self.unmap_idle(at)? {
                        self.pool_put(run, Instant::now());
                    }
                    return Ok(true);
                }
                at = slot.idle_next;
            }
        }
        Ok(false)
    }

    /// Unmap an idle mapping (`at` is its head); it is returned, mapped nowhere, unless its
    /// pages were lent (`lend_idle`): they go back to where they were lent from, and `None`; or
    /// unless it is a view whose piece stays mapped elsewhere (views.rs): `None`.
    pub(super) fn unmap_idle(
        &mut self,
        at: PageRef,
    ) -> std::result::Result<Option<Run>, DeviceError> {
        let region = &self.regions[at.region as usize];
        let va = region.base + at.page as u64 * self.page;
        let pool = region.pool;
        let slot = *self.slot(at);
        let k = slot.hlen as u32;
        let h = slot.phys.expect("an idle mapping is mapped");
        let piece = self.piece_at(at);
        self.dev.unmap(va, k as u64 * self.page)?;
        self.idle_unlink(at);
        self.clear_handle(at.region, at.page, k);
        if pool == Pool::Small {
            self.move_reserved(Pool::Small, Pool::Large, k as u64, 1);
        }
        if let Some(lend) = self.lends.remove(&va) {
            self.unlend(lend);
            return Ok(None);
        }
        if !self.views.is_empty() && self.view_unmapped(piece, at) {
            return Ok(None);
        }
        Ok(Some(Run {
            h,
            off: slot.hbase as u32,
            k,
        }))
    }

    /// Whether every page stream `s` made idle at or before `stamp` is no longer used by the GPU.
    /// Records the stream's fence event when needed; with `block`, waits for it.
    pub(super) fn stream_done_with(
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
        // Pools and capturing streams have their own rule (pool.rs).
        if let Some(done) = self.capture_fence(s, stamp, block)? {
            return Ok(done);
        }
        let st = &self.streams[s as usize];
        let event = match st.fence {
            Some(e) => e,
            None => {
                let e = self.take_event()?;
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

    /// Give back an empty region of its stream: the reservation (or plain segment) to the driver,
    /// its page table and chunk map to the allocator, its slot for reuse. On a driver error the
    /// region stays as it was.
    pub(super) fn drop_region(&mut self, id: u32) -> Result<()> {
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
    pub(super) fn forget_region(&mut self, id: u32) {
        let r = &mut self.regions[id as usize];
        r.live = false;
        r.pages = Vec::new();
        r.chunks = Vec::new();
        let base = r.base;
        if let Ok(at) = self.region_by_addr.binary_search(&(base, id)) {
            self.region_by_addr.remove(at);
        }
    }
}

/// A device that hands out address 0: no driver does, and the live-block table keeps 0 for
/// "empty" (`crate::ptr_table`), so the range is given back and the request fails.
fn address_zero(call: &str) -> DeviceError {
    DeviceError::Misuse(format!(
        "{call} returned address 0, which no CUDA driver hands out"
    ))
}
