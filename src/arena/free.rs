//! Frees and pending frees (record_stream), and the lookups that find a pointer's region, slab
//! or block.

use super::*;

impl Inner {
    pub(super) fn free(&mut self, ptr: u64, size: Option<u64>) -> Result<()> {
        let region = self.region_of(ptr).ok_or_else(|| {
            Error::BadPointer(
                PointerFault::Unknown,
                format!(
                    "free: pointer {ptr:#x} was not allocated by torch-arena on device {}",
                    self.info.ordinal
                ),
            )
        })?;
        if !self.pending_ptrs.is_empty() && self.pending_ptrs.contains_key(&ptr) {
            return Err(self.double_free(ptr));
        }
        let (found, requested, block) = match self.regions[region as usize].pool {
            Pool::Small => {
                let (id, slot) = self
                    .small_slot(region, ptr)
                    .ok_or_else(|| self.not_live(ptr))?;
                let slab = &self.slabs[id as usize];
                (
                    Found::Small { id, slot },
                    slab.requested(slot),
                    slab.slot_size,
                )
            }
            Pool::Large => {
                let b = self.large.get(ptr).ok_or_else(|| self.not_live(ptr))?;
                (Found::Large, b.requested, b.len)
            }
        };
        self.count_free(requested, block);
        self.shared.number_this();
        let extra = if self.recorded.is_empty() {
            None
        } else {
            self.recorded.remove(&ptr)
        };
        // Nothing after this point may fail: the statistics above already count the block as
        // freed, and PyTorch does not retry a free (a driver fault leaves it pending instead).
        match extra {
            Some(streams) => self.defer_free(ptr, found, streams),
            None => self.finish_free(ptr, found),
        }
        match size {
            Some(size) if size != requested => Err(Error::BadPointer(
                PointerFault::SizeMismatch,
                format!(
                    "free: size mismatch for pointer {ptr:#x}: freed with size {size}, allocated with size \
                 {requested} (the allocation was freed)"
                ),
            )),
            _ => Ok(()),
        }
    }

    pub(super) fn not_live(&self, ptr: u64) -> Error {
        match self.live_allocation(ptr) {
            Some((base, _)) => Error::BadPointer(
                PointerFault::Interior,
                format!(
                    "free: pointer {ptr:#x} points inside the allocation at {base:#x}; free the base pointer"
                ),
            ),
            None => self.double_free(ptr),
        }
    }

    pub(super) fn double_free(&self, ptr: u64) -> Error {
        Error::BadPointer(
            PointerFault::Freed,
            format!(
                "free: pointer {ptr:#x} is not a live allocation (double free, or freed before it was returned)"
            ),
        )
    }

    /// Record an event on each stream the allocation was used on; reuse waits for them. Never
    /// fails: a stream that could not be recorded on (capturing, or a driver fault) is waited
    /// for at the next poll.
    pub(super) fn defer_free(&mut self, ptr: u64, found: Found, streams: Vec<StreamId>) {
        let mut events = Vec::with_capacity(streams.len());
        let mut waiting = Vec::new();
        self.record_frees(streams, &mut events, &mut waiting);
        if events.is_empty() && waiting.is_empty() {
            self.finish_free(ptr, found);
        } else {
            if matches!(found, Found::Large) {
                self.large.get_mut(ptr).expect("live").pending = true;
            }
            self.pending_ptrs.insert(ptr, ());
            self.pending.push_back(Pending {
                ptr,
                events,
                waiting,
            });
        }
    }

    /// Finish pending frees whose events have completed, oldest first.
    /// A failed query counts as "not yet": reusing memory early would be unsafe, and a device-wide
    /// synchronisation (`synchronize_all`) finishes everything anyway.
    #[inline]
    pub(super) fn poll_pending(&mut self) {
        if !self.pending.is_empty() {
            self.finish_pending(false);
        }
    }

    /// Finish pending frees, oldest first: those whose events completed, or all with `all_done`
    /// (after the whole device was synchronised).
    pub(super) fn finish_pending(&mut self, all_done: bool) {
        while let Some(front) = self.pending.front() {
            if !all_done && !front.waiting.is_empty() {
                // Streams that were capturing at the free, or that a driver fault kept us from
                // recording on: record on them now if we can (else again at the next poll).
                let streams = std::mem::take(&mut self.pending[0].waiting);
                let (mut events, mut waiting) = (Vec::new(), Vec::new());
                self.record_frees(streams, &mut events, &mut waiting);
                let p = &mut self.pending[0];
                p.events.extend(events);
                p.waiting = waiting;
                if !p.waiting.is_empty() {
                    break;
                }
            }
            let front = &self.pending[0];
            let done = all_done
                || front
                    .events
                    .iter()
                    .all(|&e| self.dev.query_event(e).unwrap_or(false));
            if !done {
                break;
            }
            let p = self.pending.pop_front().expect("front exists");
            for e in p.events {
                self.give_back_event(e);
            }
            self.pending_ptrs.remove(&p.ptr);
            let found = self
                .locate(p.ptr)
                .expect("a pending allocation is still ours");
            self.finish_free(p.ptr, found);
        }
    }

    /// The memory of `ptr` becomes reusable by its stream.
    pub(super) fn finish_free(&mut self, ptr: u64, found: Found) {
        match found {
            Found::Small { id, slot } => self.finish_small(id, slot),
            Found::Large => self.finish_large(ptr),
        }
        self.update_inactive_split(found.pool());
        if self.release_idle.is_some() {
            self.maybe_decay();
        }
    }

    #[inline]
    pub(super) fn region_of(&self, ptr: u64) -> Option<u32> {
        let at = self.region_by_addr.partition_point(|&(b, _)| b <= ptr);
        let (_, id) = *self.region_by_addr.get(at.checked_sub(1)?)?;
        let r = &self.regions[id as usize];
        (r.live && ptr < r.base + r.len).then_some(id)
    }

    /// The live allocation starting at `ptr`.
    pub(super) fn locate(&self, ptr: u64) -> Option<Found> {
        let region = self.region_of(ptr)?;
        match self.regions[region as usize].pool {
            Pool::Small => self
                .small_slot(region, ptr)
                .map(|(id, slot)| Found::Small { id, slot }),
            Pool::Large => self.large.get(ptr).is_some().then_some(Found::Large),
        }
    }

    /// The slab holding `ptr` of small-pool `region`, if any: one chunk-map read.
    #[inline]
    pub(super) fn slab_at(&self, region: u32, ptr: u64) -> Option<u32> {
        let r = &self.regions[region as usize];
        let id = *r.chunks.get(((ptr - r.base) / CHUNK) as usize)?;
        (id != NO_SLAB).then_some(id)
    }

    /// The live slab slot starting at `ptr`.
    #[inline]
    pub(super) fn small_slot(&self, region: u32, ptr: u64) -> Option<(u32, usize)> {
        let id = self.slab_at(region, ptr)?;
        Some((id, self.slabs[id as usize].live_slot(ptr)?))
    }

    /// The live allocation containing `ptr` (base pointer and owning stream index), including
    /// those freed but pending.
    pub(super) fn live_allocation(&self, ptr: u64) -> Option<(u64, u32)> {
        let region = self.region_of(ptr)?;
        match self.regions[region as usize].pool {
            Pool::Small => {
                let id = self.slab_at(region, ptr)?;
                let slab = &self.slabs[id as usize];
                let slot = slab.slot_containing(ptr)?;
                let base = slab.base + slot as u64 * slab.slot_size;
                slab.live_slot(base)?;
                Some((base, slab.stream))
            }
            Pool::Large => {
                // Exact first (what PyTorch passes); an interior pointer scans the live blocks.
                if let Some(b) = self.large.get(ptr) {
                    return Some((ptr, b.stream));
                }
                self.large
                    .iter()
                    .find(|&(base, b)| base < ptr && ptr < base + b.len)
                    .map(|(base, b)| (base, b.stream))
            }
        }
    }

    /// Block size of the live allocation at `base`.
    pub(super) fn block_len(&self, base: u64) -> u64 {
        match self.large.get(base) {
            Some(b) => b.len,
            None => {
                let region = self.region_of(base).expect("ours");
                let (id, _) = self.small_slot(region, base).expect("live");
                self.slabs[id as usize].slot_size
            }
        }
    }
}
