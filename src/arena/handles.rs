//! The pool of physical handles a stream gave back: put, taken whole or cut into pieces with no
//! driver call, joined back into a whole handle, released to the driver; and, at the limit,
//! idle pages that other pages of their mapping pin, lent to back a range elsewhere.

use super::*;

impl Inner {
    /// At the limit, once every stream is synchronised (`lend_ok`): up to `want` idle pages of a
    /// mapping that live blocks elsewhere on it pin, lent to back a range elsewhere. A mapping
    /// moves only whole and cannot be unmapped in part, so without this such pages serve only
    /// blocks that fit where they are; CUDA maps a piece of a handle at any address, also while
    /// another piece of it, or the same piece, is mapped elsewhere, and the pages stay held
    /// where they were by a placeholder in their stream's heap (so that nothing is placed on
    /// them there) until the mapping that borrowed them is unmapped (`unlend`). Only whole
    /// pages inside free address ranges of the large heaps of streams that are not pinned
    /// (private pools keep theirs). O(free ranges + their pages): the out-of-memory path only.
    pub(super) fn lend_idle(&mut self, want: u32) -> Option<Run> {
        if !self.lend_ok || self.lend_refused || want == 0 {
            return None;
        }
        let page = self.page;
        for s in 0..self.streams.len() as u32 {
            let st = &self.streams[s as usize];
            if st.retired || st.pinned || st.pool.is_some() {
                continue;
            }
            let mut ranges = Vec::new();
            st.large.each_fit(page, |fit, free| {
                ranges.push((fit, free));
                true
            });
            for (fit, free) in ranges {
                let r = &self.regions[fit.region as usize];
                if r.plain || !r.live {
                    continue;
                }
                let first = (fit.addr - r.base).div_ceil(page) as u32;
                let end = ((fit.addr + free - r.base) / page) as u32;
                let mut p = first;
                while p < end {
                    let slot = r.pages[p as usize];
                    let Some(h) = slot.phys else {
                        p += 1;
                        continue;
                    };
                    let head = p - slot.hoff as u32;
                    let hd = r.pages[head as usize];
                    let stop = (head + hd.hlen as u32).min(end);
                    // An idle mapping moves whole (stitching): only a busy one lends.
                    if hd.busy == 0 {
                        p = stop;
                        continue;
                    }
                    let k = (stop - p).min(want);
                    let run = Run {
                        h,
                        off: hd.hbase as u32 + (p - head),
                        k,
                    };
                    let addr = r.base + p as u64 * page;
                    let len = k as u64 * page;
                    let node = self.streams[s as usize]
                        .large
                        .take_range(fit.node, addr, len);
                    let region = fit.region;
                    self.count_range(region, addr, len, true);
                    self.lent_pages += k as u64;
                    let lend = Lend {
                        region,
                        stream: s,
                        addr,
                        k,
                        node,
                    };
                    self.lending.insert((h.0, run.off), lend);
                    return Some(run);
                }
            }
        }
        None
    }

    /// Give lent pages back to where they were lent from: their placeholder leaves the heap and
    /// their users there (a mapping left with no page in use goes idle).
    pub(super) fn unlend(&mut self, lend: Lend) {
        self.count_range(lend.region, lend.addr, lend.k as u64 * self.page, false);
        self.streams[lend.stream as usize].large.free(lend.node);
        self.lent_pages -= lend.k as u64;
    }

    /// For a shard that ran out: whole pooled handles of at least `want` pages in all (all of
    /// them if there are fewer), for `take_handles` there (no driver call: CUDA handles belong to
    /// the device, not to a shard). Pooled handles go first; then idle mappings this shard's
    /// streams are proven done with are unmapped (waiting for them, as the out-of-memory ladder
    /// does), oldest first, until enough whole handles are pooled. Pieces of handles still
    /// mapped in part stay.
    pub(super) fn give_handles(&mut self, want: u64) -> Result<Vec<(PageHandle, u32)>> {
        let mut out = Vec::new();
        let mut given = 0u64;
        self.give_pooled(&mut out, &mut given, want);
        if given < want {
            // Whole pooled handles are given as soon as an unmap completes one.
            self.unmap_idle_until(|g| {
                g.give_pooled(&mut out, &mut given, want);
                given >= want
            })?;
        }
        Ok(out)
    }

    /// Whole pooled handles, largest first, into `out` while `given` (pages) is under `want`.
    fn give_pooled(&mut self, out: &mut Vec<(PageHandle, u32)>, given: &mut u64, want: u64) {
        while *given < want {
            let Some((h, k)) = self.pool_take_whole(u32::MAX) else {
                break;
            };
            if let Some(k) = self.shared_handles.remove(&h.0) {
                self.shared_pages -= k as u64;
            }
            self.count_given(k as u64 * self.page);
            out.push((h, k));
            *given += k as u64;
        }
    }

    /// Handles another shard gave (`give_handles`), into this shard's pool.
    pub(super) fn take_handles(&mut self, handles: Vec<(PageHandle, u32)>) {
        let now = Instant::now();
        for (h, k) in handles {
            self.count_taken(k as u64 * self.page);
            self.pool_put(Run::whole(h, k), now);
        }
    }

    /// Put an unmapped piece in the pool. A whole handle goes to `pool`; a piece of a split
    /// handle to `parts`, unless it is the last one missing, when the handle is whole again.
    pub(super) fn pool_put(&mut self, run: Run, when: Instant) {
        self.pooled_pages += run.k as u64;
        let Some(split) = self.split.get_mut(&run.h.0) else {
            debug_assert_eq!(run.off, 0, "a piece of a handle not split");
            self.pool.entry(run.k).or_default().push((run.h, when));
            return;
        };
        split.pooled.push((run.off, run.k));
        if split.pooled_pages() < split.pages {
            self.parts.entry(run.k).or_default().push(run);
            return;
        }
        let split = self.split.remove(&run.h.0).expect("found above");
        for &(off, k) in split.pooled.iter().filter(|&&(off, _)| off != run.off) {
            let list = self.parts.get_mut(&k).expect("a pooled piece is listed");
            let at = list
                .iter()
                .position(|r| r.h == run.h && r.off == off)
                .expect("a pooled piece is listed");
            list.swap_remove(at);
            if list.is_empty() {
                self.parts.remove(&k);
            }
        }
        self.pool
            .entry(split.pages)
            .or_default()
            .push((run.h, when));
    }

    /// The largest pooled piece of at most `want` pages (a piece of a split handle before a
    /// whole handle of the same length, so that whole ones stay whole for release).
    pub(super) fn pool_take(&mut self, want: u32) -> Option<Run> {
        let whole = self.pool.range(..=want).next_back().map(|(&k, _)| k);
        let part = self.parts.range(..=want).next_back().map(|(&k, _)| k);
        match (whole, part) {
            (Some(w), p) if p.is_none_or(|p| w > p) => {
                self.pool_take_whole(w).map(|(h, k)| Run::whole(h, k))
            }
            (_, Some(p)) => Some(self.take_part(p)),
            _ => None,
        }
    }

    /// The largest whole pooled handle of at most `want` pages: what may be released.
    pub(super) fn pool_take_whole(&mut self, want: u32) -> Option<(PageHandle, u32)> {
        let (&k, list) = self.pool.range_mut(..=want).next_back()?;
        let (h, _) = list.pop().expect("no empty lists are kept");
        if list.is_empty() {
            self.pool.remove(&k);
        }
        self.pooled_pages -= k as u64;
        Some((h, k))
    }

    /// A pooled piece of `k` pages of a split handle, out of the pool.
    pub(super) fn take_part(&mut self, k: u32) -> Run {
        let list = self.parts.get_mut(&k).expect("a listed length");
        let run = list.pop().expect("no empty lists are kept");
        if list.is_empty() {
            self.parts.remove(&k);
        }
        let split = self
            .split
            .get_mut(&run.h.0)
            .expect("a part is of a split handle");
        let at = split
            .pooled
            .iter()
            .position(|&(off, _)| off == run.off)
            .expect("a pooled piece is recorded");
        split.pooled.swap_remove(at);
        self.pooled_pages -= k as u64;
        run
    }

    /// `want` pages cut from the smallest pooled piece or handle longer than that; the rest
    /// stays pooled. No driver call: the pieces are unmapped.
    pub(super) fn pool_cut(&mut self, want: u32) -> Option<Run> {
        let above = want.checked_add(1)?;
        let whole = self.pool.range(above..).next().map(|(&k, _)| k);
        let part = self.parts.range(above..).next().map(|(&k, _)| k);
        let run = match (whole, part) {
            (Some(w), p) if p.is_none_or(|p| w < p) => {
                let (h, k) = self.pool_take_whole(w)?;
                self.split.insert(
                    h.0,
                    Split {
                        pages: k,
                        pooled: Vec::new(),
                    },
                );
                Run::whole(h, k)
            }
            (_, Some(p)) => self.take_part(p),
            _ => return None,
        };
        self.pool_put(
            Run {
                h: run.h,
                off: run.off + want,
                k: run.k - want,
            },
            Instant::now(),
        );
        Some(Run { k: want, ..run })
    }

    /// Give back an unmapped piece: released when it is a whole handle or the last piece of
    /// one missing from the pool (with the rest), pooled otherwise.
    pub(super) fn release_run(&mut self, run: Run) -> std::result::Result<(), DeviceError> {
        let Some(pages) = self.split.get(&run.h.0).map(|s| s.pages) else {
            return self.release_handle(run.h, run.k);
        };
        self.pool_put(run, Instant::now());
        if self.split.contains_key(&run.h.0) {
            return Ok(());
        }
        let list = self.pool.get_mut(&pages).expect("just joined");
        let at = list
            .iter()
            .position(|&(h, _)| h == run.h)
            .expect("just joined");
        list.swap_remove(at);
        if list.is_empty() {
            self.pool.remove(&pages);
        }
        self.pooled_pages -= pages as u64;
        self.release_handle(run.h, pages)
    }
}
