//! The large pool: 512-byte-granular blocks of a stream's address heap, placed among the best
//! fits by size where the fewest pages need mapping.

use super::growth::*;
use super::*;

/// Free blocks a large request weighs: the best fits by size, of which it takes the one needing
/// the fewest newly mapped pages (a map costs tens of microseconds; reading a page slot does not),
/// while the limit leaves room for the block.
pub(super) const PLACEMENT_CANDIDATES: usize = 8;

/// Free blocks a large request weighs when the limit leaves less room than the block: pages it
/// lacks would then be moved from elsewhere (unmapped, mapped again: tens of microseconds of
/// driver time each, and the place they left misses them in the next step that repeats this
/// one), so a fit whose pages are all mapped is worth looking further for. Chosen on the tune
/// half of the shared traces (`scripts/fit-summary`'s halves) at each trace's own minimum over
/// five steps: fifth-step memory calls of that half 31,621 at 8, 17,416 at 16, 9,397 at 32,
/// 11,558 at 64, and from 128 on 11,012, the same as weighing every fit; on the held-out half
/// 40,768 at 8 and 12,148 at 128. Away from the limit nothing changes (the search stops at the
/// first fit needing no new page, and instructions per pair of the pairs benchmark are the same).
pub(super) const LIMIT_PLACEMENT_CANDIDATES: usize = 128;

/// How much longer than a medium block a free range must be for the block to take its end
/// (`place_large`). Measured on the shared traces, the recording of the GPU suite's steps
/// workload and `demo-train` at 20 MiB, 64, 256, 512 MiB, 1, 1.5, 2, 3 and 4 GiB (BENCHMARKS.md,
/// "Policy variants at a40ef95"). Below 1 GiB the rule also moves medium blocks in ranges of a
/// few dozen MiB: at every smaller threshold tried the steps recording grew again in its second
/// pass, and at 256 MiB and less traces near the fragmentation target tipped over it. At 1 GiB
/// the recording's cycle of shapes grows once more, in its third pass (step 29), than it did on
/// the GPU; from 1.5 GiB on it makes the GPU's calls in the GPU's steps, with the shared traces'
/// counts unchanged.
///
/// Or, for the smallest medium blocks, at least `KEEP_RANGE_TIMES` times the block's length,
/// whichever is less: a 2 MiB block in a 512 MiB range a large block left is the straddle this
/// rule is for (silmont2000 `133f064` reserved 512 MiB more than native's emulation before it),
/// but such a range is far under 2 GiB longer. Measured at 128 to 300 times on the same traces
/// (BENCHMARKS.md, "The end rule for small blocks"): from 150 to 254 times the trace reserves what
/// native's emulation does and no trace crosses a target; at 128 one goes over 5 %
/// fragmentation, and from 300 on the rule misses the 2 MiB blocks of that trace.
const KEEP_RANGE_BYTES: u64 = 2 << 30;
const KEEP_RANGE_TIMES: u64 = 200;

impl Inner {
    pub(super) fn alloc_large(
        &mut self,
        size: u64,
        s: u32,
        anywhere: bool,
    ) -> std::result::Result<(DevPtr, u64), Miss> {
        let len = round_up(size, MIN_BLOCK);
        let Fit { addr, region, node } = self.take_va(s, Pool::Large, len)?;
        if let Err(e) = self.use_range(region, addr, len, anywhere) {
            self.streams[s as usize].large.free(node);
            return Err(e);
        }
        let block = LargeBlock {
            len,
            requested: size,
            stream: s,
            region,
            node,
            pending: false,
        };
        // No region starts at address 0 (`add_region`), the one key the table refuses, and no
        // live block starts where this one does.
        let inserted = self.large.insert(addr, block);
        debug_assert!(
            matches!(inserted, Ok(None)),
            "block at {addr:#x} already live"
        );
        self.count_alloc(Pool::Large, size, len);
        Ok((addr, len))
    }

    /// Addresses for `len` bytes from stream `s`'s heap of `pool`, reserving a new region (or, with
    /// no VMM, allocating a new plain segment) when none fits.
    pub(super) fn take_va(
        &mut self,
        s: u32,
        pool: Pool,
        len: u64,
    ) -> std::result::Result<Fit, Miss> {
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
    /// fewest pages mapped (a freed block of the same size needs none). While the limit leaves
    /// room for the block, a place that would strand part of an idle large handle (`strands`)
    /// comes after every other. Medium blocks have rules of their own (`place_medium`).
    pub(super) fn place_large(&mut self, s: u32, len: u64) -> Option<Fit> {
        if len < MEDIUM_BYTES {
            return self.place_medium(s, len);
        }
        let guard = self.guards_large_handles(len);
        let candidates = self.placement_candidates(len);
        // (strands, pages to map) of the best so far.
        let mut best: Option<((bool, u64), Fit)> = None;
        let mut seen = 0;
        self.streams[s as usize].large.each_fit(len, |fit, _| {
            seen += 1;
            let strands = guard && self.strands(fit.region, fit.addr, len);
            // Pages to map that would still beat the best so far (none: it cannot).
            let limit = match best {
                None => u64::MAX,
                Some(((b, _), _)) if b && !strands => u64::MAX,
                Some(((b, missing), _)) if b == strands => missing,
                Some(_) => 0,
            };
            let missing = self.unmapped_pages(fit.region, fit.addr, len, limit);
            if missing < limit {
                best = Some(((strands, missing), fit));
            }
            best.is_some_and(|b| b.0 != (false, 0)) && seen < candidates
        });
        let (_, fit) = best?;
        self.streams[s as usize].large.take(fit.node, len);
        Some(fit)
    }

    /// A medium block (under [`MEDIUM_BYTES`]) for stream `s`, among the same best fits, each
    /// weighed where the block would go in it:
    /// - In a free range longer than the block by at least [`KEEP_RANGE_BYTES`] or
    ///   [`KEEP_RANGE_TIMES`] its length, other than its region's last (the addresses growth
    ///   takes), it goes to the range's end where the pages there are mapped, not to its start.
    ///   Such a range is most often what a large block left, and that block comes back. From the
    ///   start, the medium block would shift the range: once the next block is freed too, the two
    ///   merge, and the large block straddles both blocks' pages, leaving mapped pages that no
    ///   block of its size fits.
    /// - Of the places needing the fewest new pages, one on pages created for medium blocks (a
    ///   growth step's) comes before one in such a range on a large block's pages: at its end the
    ///   block still takes from the range, and medium blocks gathering there leave it too short
    ///   for the large block that comes back (sungdk0822 `dmodel16_seqlen4096` grew a seventh
    ///   512 MiB handle so, where native holds six).
    ///
    /// - As for large blocks, while the limit leaves room for the block, a place that would
    ///   strand part of an idle large handle (`strands`) comes after every other.
    ///
    /// PyTorch keeps the two apart by packing medium requests into segments of their own.
    fn place_medium(&mut self, s: u32, len: u64) -> Option<Fit> {
        let keep = KEEP_RANGE_BYTES.min(len.saturating_mul(KEEP_RANGE_TIMES));
        let guard = self.guards_large_handles(len);
        let candidates = self.placement_candidates(len);
        // (strands, new pages, on a large block's pages in a long range), the fit, whether at
        // its end.
        let mut best: Option<((bool, u64, bool), Fit, bool)> = None;
        let mut seen = 0;
        self.streams[s as usize].large.each_fit(len, |fit, free| {
            let r = &self.regions[fit.region as usize];
            // `free >= len`: `each_fit` offers ranges that fit.
            let long = free - len >= keep;
            let last = fit.addr + free == r.base + r.len;
            let end = fit.addr + free - len;
            let at_end = long && !last && self.unmapped_pages(fit.region, end, len, 1) == 0;
            let at = if at_end { end } else { fit.addr };
            seen += 1;
            let strands = guard && self.strands(fit.region, at, len);
            // Pages to map past which it cannot beat the best so far.
            let limit = match best {
                Some(((b, missing, _), ..)) if b == strands => missing + 1,
                Some(((false, ..), ..)) => 0,
                _ => u64::MAX,
            };
            let missing = match at_end {
                true => 0, // checked just above
                false => self.unmapped_pages(fit.region, at, len, limit),
            };
            if missing < limit {
                let large = long && missing == 0 && self.on_large_handle(fit.region, at, len);
                let key = (strands, missing, large);
                if best.is_none_or(|b| key < b.0) {
                    best = Some((key, fit, at_end));
                }
            }
            best.is_some_and(|b| b.0 != (false, 0, false)) && seen < candidates
        });
        let (_, fit, at_end) = best?;
        if at_end {
            return Some(self.streams[s as usize].large.take_end(fit.node, len));
        }
        self.streams[s as usize].large.take(fit.node, len);
        Some(fit)
    }

    /// Whether a handle created for a large block (not a growth step's: `shared_handles`) backs
    /// a page of `[addr, addr + len)`. One visit per handle.
    fn on_large_handle(&self, region: u32, addr: u64, len: u64) -> bool {
        let r = &self.regions[region as usize];
        let first = self.page_of(addr - r.base) as usize;
        let last = self.page_of(addr + len - 1 - r.base) as usize;
        let mut p = first;
        while p <= last {
            let slot = &r.pages[p];
            // Every page of a mapped handle names it; its head page holds its length.
            let Some(h) = slot.phys else {
                p += 1;
                continue;
            };
            if !self.shared_handles.contains_key(&h.0) {
                return true;
            }
            p += (r.pages[p - slot.hoff as usize].hlen - slot.hoff) as usize;
        }
        false
    }

    /// How many of the best fits by size a block of `len` bytes weighs: more where the limit
    /// leaves less room than the block ([`LIMIT_PLACEMENT_CANDIDATES`]).
    fn placement_candidates(&self, len: u64) -> usize {
        match self.room_for(len) {
            true => PLACEMENT_CANDIDATES,
            false => LIMIT_PLACEMENT_CANDIDATES,
        }
    }

    /// Whether the limit leaves room to create `len` bytes more.
    fn room_for(&self, len: u64) -> bool {
        self.room() >= len
    }

    /// Whether placing a block of `len` bytes weighs `strands`: only while an idle large handle
    /// exists at all (a counter, so that the malloc path pays for the check only then), and while
    /// the limit leaves room for the block (else it takes what is there).
    fn guards_large_handles(&self, len: u64) -> bool {
        self.idle_large > 0 && self.room_for(len)
    }

    /// Whether a block at `[addr, addr + len)` of `region` would strand part of an idle large
    /// handle: cover some of its pages, so that the rest (more than the block's own length) can
    /// neither move nor serve a block of the handle's size while the block lives
    /// ([`LARGE_HANDLE_SHARE`]). Only the block's first and last pages can lie in a handle it
    /// does not cover whole.
    fn strands(&self, region: u32, addr: u64, len: u64) -> bool {
        let r = &self.regions[region as usize];
        let (first, last) = self.pages_of(region, addr, len);
        let (first, last) = (first as usize, last as usize);
        let large = self.large_pages as usize;
        let mut stranded = 0;
        let mut seen_head = None;
        for p in [first, last] {
            let slot = &r.pages[p];
            if slot.phys.is_none() {
                continue;
            }
            let head = p - slot.hoff as usize;
            let h = &r.pages[head];
            if h.busy != 0 || h.hlen as usize <= large || seen_head == Some(head) {
                continue; // pinned already, small, or counted
            }
            seen_head = Some(head);
            let end = head + h.hlen as usize - 1;
            let covered = end.min(last) + 1 - head.max(first);
            stranded += h.hlen as usize - covered;
        }
        stranded >= large && stranded as u64 * self.page > len
    }

    /// Pages of `[addr, addr + len)` with nothing mapped (or a blocked view), counting no further
    /// than `limit`. One visit per mapped handle, so a range that is all mapped costs what its
    /// handles number.
    pub(super) fn unmapped_pages(&self, region: u32, addr: u64, len: u64, limit: u64) -> u64 {
        let r = &self.regions[region as usize];
        let first = self.page_of(addr - r.base) as usize;
        let last = self.page_of(addr + len - 1 - r.base) as usize;
        // Asked once: views exist only at the limit, with `views:True` (views.rs).
        let views = !self.views.is_empty();
        let mut missing = 0;
        let mut p = first;
        while p <= last && missing < limit {
            let slot = &r.pages[p];
            if slot.phys.is_some() {
                let head = p - slot.hoff as usize;
                let span = (r.pages[head].hlen - slot.hoff) as usize;
                if views && self.view_blocked(PageRef::at(region, head)) {
                    missing += span.min(last + 1 - p) as u64;
                }
                p += span;
            } else {
                missing += 1;
                p += 1;
            }
        }
        missing
    }

    pub(super) fn heap(&mut self, s: u32, pool: Pool) -> &mut Heap {
        let st = &mut self.streams[s as usize];
        match pool {
            Pool::Small => &mut st.small,
            Pool::Large => &mut st.large,
        }
    }

    pub(super) fn finish_large(&mut self, ptr: u64) {
        let block = self.large.remove(ptr).expect("live block");
        self.count_range(block.region, ptr, block.len, false);
        self.streams[block.stream as usize].large.free(block.node);
        self.count_inactive(Pool::Large, block.requested, block.len as i64);
    }
}
