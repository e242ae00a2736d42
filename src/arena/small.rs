//! The small pool: size-class slots in slabs of whole 64 KiB chunks, the current slab of each
//! class, and the fill-order buckets that let lightly used slabs drain and dissolve.

use super::*;

/// The current slab of a class stays when its last slot is freed, ready for the class's next
/// request, unless it spans this much or more: classes of large slots (from 128 KiB) have slabs
/// of 1 to 3 MiB, and kept empty they hold long stretches of the small pool that slabs of other
/// classes then cannot use (from 2 MiB, a page, they dissolved before). The GPU suite's steps
/// workload grew the small pool in its 25th step so (on the H200, 2026-11-27), holding 16 MiB
/// with under 6 MiB allocated; at 2 MiB (a page, as before) the lab makes the same growth from
/// the run's recording, at 1 MiB none, and no shared trace's counts move (BENCHMARKS.md, "Nearby
/// orders").
pub(super) const DISSOLVE_EMPTY_SPAN: u64 = 1 << 20;

impl Inner {
    pub(super) fn alloc_small(
        &mut self,
        size: u64,
        s: u32,
        anywhere: bool,
    ) -> std::result::Result<(DevPtr, u64), Miss> {
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
        Ok((ptr, slot))
    }

    /// The current slab of class `ci` is full (or absent): make the fullest partial slab current,
    /// or carve a new one.
    pub(super) fn next_slab(
        &mut self,
        s: u32,
        ci: usize,
        anywhere: bool,
    ) -> std::result::Result<u32, Miss> {
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
    pub(super) fn set_current(&mut self, s: u32, ci: usize, id: u32) {
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

    pub(super) fn create_slab(
        &mut self,
        s: u32,
        ci: usize,
        anywhere: bool,
    ) -> std::result::Result<u32, Miss> {
        let class = *self.classes.get(ci);
        let span = class.span;
        let at = self.take_va(s, Pool::Small, span)?;
        let (addr, region) = (at.addr, at.region);
        let (first, last) = self.pages_of(region, addr, span);
        // Count the pages as used first, so that backing them cannot reclaim one of them. Pages
        // shared with live slabs are mapped already and just gain a user.
        for p in first..=last {
            self.page_user_added(region, p);
        }
        if let Err(e) = self.back_pages(
            region,
            first,
            last - first + 1,
            anywhere,
            None,
            Apart::default(),
        ) {
            for p in first..=last {
                self.page_user_removed(region, p);
            }
            self.streams[s as usize].small.free(at.node);
            return Err(e);
        }
        let slab = Slab::new(at, span, ci as u16, class.size, class.slots, s);
        let id = crate::slots::reuse_or_push(&mut self.slabs, &mut self.free_slab_ids, slab);
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

    /// An empty, non-current slab gives its chunks back; a page it shared with no other live
    /// slab goes idle.
    pub(super) fn dissolve_slab(&mut self, id: u32) {
        let slab = &self.slabs[id as usize];
        debug_assert!(slab.is_empty() && slab.bucket.is_none());
        let (region, base, span, s, node) =
            (slab.region, slab.base, slab.span, slab.stream, slab.node);
        let r = &mut self.regions[region as usize];
        let c0 = ((base - r.base) / CHUNK) as usize;
        r.chunks[c0..c0 + (span / CHUNK) as usize].fill(NO_SLAB);
        let (first, last) = self.pages_of(region, base, span);
        for p in first..=last {
            self.page_user_removed(region, p);
        }
        self.streams[s as usize].small.free(node);
        self.slabs[id as usize].slots = 0;
        self.free_slab_ids.push(id);
    }

    pub(super) fn finish_small(&mut self, id: u32, slot: usize) {
        let slab = &mut self.slabs[id as usize];
        let (used, slots) = (slab.used, slab.slots);
        let requested = slab.give_back(slot);
        let size = slab.slot_size as i64;
        let (s, ci) = (slab.stream, slab.class as usize);
        self.partial_slabs += partial(used - 1, slots) - partial(used, slots);
        self.count_inactive(Pool::Small, requested, size);
        let is_current = self.streams[s as usize].classes[ci].current == Some(id);
        if used == 1 {
            self.nonempty_slab_bytes -= self.slabs[id as usize].span;
        }
        if is_current {
            // An emptied current slab that long holds stretches of the pool other classes need.
            if used == 1 && self.slabs[id as usize].span >= DISSOLVE_EMPTY_SPAN {
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

    pub(super) fn bucket_insert(&mut self, id: u32) {
        let slab = &self.slabs[id as usize];
        let b = bucket_of(slab.used, slab.slots);
        let list = &mut self.streams[slab.stream as usize].classes[slab.class as usize].buckets
            [b as usize];
        list.push(id);
        let at = (list.len() - 1) as u32;
        self.slabs[id as usize].bucket = Some((b, at));
    }

    pub(super) fn bucket_remove(&mut self, id: u32) {
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
}
