//! Regions, their page tables and the idle lists: which physical page backs which address, how
//! many blocks use it, and how pages are acquired (pool, idle pages proven safe, new pages),
//! mapped, unmapped and given back.

use super::*;

impl Inner {
    /// First and last page index of `[addr, addr + len)` in `region`.
    #[inline]
    pub(super) fn pages_of(&self, region: u32, addr: u64, len: u64) -> (u32, u32) {
        let base = self.regions[region as usize].base;
        (
            ((addr - base) / self.page) as u32,
            ((addr + len - 1 - base) / self.page) as u32,
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
    pub(super) fn use_range(
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
    pub(super) fn count_range(&mut self, region: u32, addr: u64, len: u64, add: bool) {
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
    pub(super) fn back_pages(
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
    pub(super) fn acquire(
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

    pub(super) fn give_back(&mut self, pages: Vec<PageHandle>, why: Miss) -> Miss {
        let now = Instant::now();
        self.pool.extend(pages.into_iter().map(|p| (p, now)));
        why
    }

    /// Unmap idle pages until `out` holds `n` pages: stream `own`'s first, then other streams',
    /// each oldest first, taking a page only once its stream is done with it (with `block`,
    /// waiting for the stream). A stream's first page its fence does not cover ends that stream's
    /// turn: the rest of its list is newer.
    pub(super) fn reclaim_idle_pages(
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
    pub(super) fn unmap_idle(
        &mut self,
        at: PageRef,
    ) -> std::result::Result<PageHandle, DeviceError> {
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
    pub(super) fn page_is_partial(&self, region: u32, p: u32) -> bool {
        let slot = &self.regions[region as usize].pages[p as usize];
        slot.users > 0 && slot.covered < self.page
    }

    /// One more user of a page. A page going from idle to used leaves the idle list.
    pub(super) fn page_user_added(&mut self, region: u32, p: u32) {
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
    pub(super) fn page_user_removed(&mut self, region: u32, p: u32) {
        let r = &mut self.regions[region as usize];
        let slot = &mut r.pages[p as usize];
        slot.users -= 1;
        if slot.users == 0 {
            let mapped = slot.phys.is_some();
            r.in_use -= 1;
            self.in_use_pages[r.pool as usize] -= 1;
            // A pinned pool's pages stay off the idle list: nothing may take them (pool.rs).
            if mapped && !self.streams[r.stream as usize].pinned {
                self.idle_push(PageRef { region, page: p });
            }
        }
    }

    #[inline]
    pub(super) fn slot(&self, at: PageRef) -> &PageSlot {
        &self.regions[at.region as usize].pages[at.page as usize]
    }

    #[inline]
    pub(super) fn slot_mut(&mut self, at: PageRef) -> &mut PageSlot {
        &mut self.regions[at.region as usize].pages[at.page as usize]
    }

    /// Append a mapped, unused page to the idle list with a new stamp (newest last).
    pub(super) fn idle_push(&mut self, at: PageRef) {
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
    pub(super) fn idle_unlink(&mut self, at: PageRef) {
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
