//! Private pools, for CUDA graph capture (`torch.cuda.graph`, `make_graphed_callables`), and
//! what the arena must not do while a stream is being captured.
//!
//! PyTorch's semantics (c10/cuda/CUDACachingAllocator.cpp, `beginAllocateToPool`,
//! `endAllocateToPool`, `releasePool` and Note [Interaction with CUDA graph capture]; the details
//! we rely on are listed in docs/cuda-graphs.md): between `begin_pool(id)` and `end_pool(id)`,
//! allocations whose stream the capture's filter accepts come from pool `id`; memory the pool
//! handed out, freed during capture or after, is reused only by that pool; several pools may
//! record at once; a pool id may be begun again by a later capture, which shares it (a use
//! count); `release_pool` drops one use, and once none is left the pool's memory returns to
//! general use as it becomes free.
//!
//! A pool here is a set of stream states keyed by `(pool, stream)` rather than by stream, so
//! within a pool, as in PyTorch's, a block freed on one stream is reused at once only on that
//! stream (a graph with several streams orders work per stream). Until the pool is released its
//! states are *pinned*: their mapped pages never join an idle list, so nothing that reclaims
//! memory (stitching, `empty_cache`, `defragment`, the memory fraction, decay, stream
//! retirement) can unmap, move or release them, and the states are never retired. Every replay
//! of the graph uses exactly those addresses.
//!
//! On release a pool's unused pages join its states' idle lists. A pool has no stream its
//! replays are ordered on (a graph may be replayed on any stream, and the graph itself may still
//! be running: PyTorch calls `releasePool` before destroying the graph), so no event proves its
//! pages unused: only a device-wide synchronisation after the release does. Until one happens
//! (`empty_cache`, the out-of-memory ladder), a released pool's pages stay where they are; after
//! it, they move or go back to the driver like any idle page, and an emptied state is retired.
//!
//! Capture safety: nothing stream-ordered is issued on a capturing stream (an event record there
//! becomes a node of the user's graph and can never be queried; synchronising it fails and
//! invalidates the capture), and the device is not synchronised while any stream may be
//! capturing. `stream_done_with` asks [`Inner::capture_fence`] first; `synchronize_all` falls
//! back to [`Inner::synchronize_outside_capture`].

use super::*;

/// The target of the private pools' log records, kept from before this code moved to this file: the
/// Python package hands it on as `record.target`, so it is part of the interface.
const LOG_TARGET: &str = "torch_arena::arena::pool";

impl Arena {
    /// `beginAllocateToPool(device, id, filter)`: pool `id` (created, or shared with the
    /// captures that already use it) serves the allocations the caller routes to it with
    /// [`Arena::malloc_pool`] until [`Arena::end_pool`]. Fails if `id` is already recording.
    pub fn begin_pool(&self, id: PoolId) -> Result<()> {
        self.every_shard(|g| g.begin_pool(id))
    }

    /// `endAllocateToPool(device, id)`: the capture ended; the pool keeps its memory.
    pub fn end_pool(&self, id: PoolId) -> Result<()> {
        self.every_shard(|g| g.end_pool(id))
    }

    /// A pool call on every shard, in order (each keeps its own record of the pool, and each
    /// sees the same calls, so the first to refuse one refuses it for all: none is changed).
    fn every_shard(&self, mut f: impl FnMut(&mut Inner) -> Result<()>) -> Result<()> {
        for (i, shard) in self.shards.iter().enumerate() {
            match i < self.used().end {
                true => self.on(i, &mut f)?,
                false => f(&mut shard.inner.lock())?,
            }
        }
        Ok(())
    }

    /// `releasePool(device, id)`: one use of pool `id` ends (a graph was reset or destroyed).
    /// With none left, the pool's memory returns to general use as it becomes free, once a
    /// device-wide synchronisation proves the graph no longer runs.
    pub fn release_pool(&self, id: PoolId) -> Result<()> {
        self.every_shard(|g| g.release_pool(id))
    }

    /// At least `size` (> 0) bytes of pool `id` for `stream`. A pool that is not recording
    /// (another thread ended it after the shim's filter accepted the stream: the capture ended
    /// first, so this allocation is not part of it) gives general memory.
    pub fn malloc_pool(&self, size: u64, stream: StreamId, id: PoolId) -> Result<DevPtr> {
        self.alloc_pool(size, stream, id).map(|b| b.ptr)
    }

    /// [`Arena::malloc_pool`], with the block's size and number ([`Block`]).
    pub fn alloc_pool(&self, size: u64, stream: StreamId, id: PoolId) -> Result<Block> {
        self.alloc_in(size, stream, Some(id))
    }

    /// What pool `id` holds; `None` for a pool this arena does not know (never begun, or
    /// released and wholly given back).
    pub fn pool_info(&self, id: PoolId) -> Option<PoolInfo> {
        let mut all: Option<PoolInfo> = None;
        for i in self.used() {
            let Some(info) = self.on(i, |g| g.pool_info(id)) else {
                continue;
            };
            match &mut all {
                None => all = Some(info),
                Some(all) => {
                    all.states += info.states;
                    all.mapped_pages += info.mapped_pages;
                    all.used_pages += info.used_pages;
                }
            }
        }
        all
    }

    /// The private pool whose memory holds `ptr`, if any (live or not).
    pub fn pool_of(&self, ptr: DevPtr) -> Option<PoolId> {
        self.find(|g| {
            let r = g.region_of(ptr)?;
            Some(g.streams[g.regions[r as usize].stream as usize].pool)
        })
        .flatten()
    }
}

impl Inner {
    /// The pool a request for `pool` takes memory from: `pool` while it records, else general
    /// memory (`None`; see [`Arena::malloc_pool`]).
    #[inline]
    pub(super) fn recording(&self, pool: Option<PoolId>) -> Option<PoolId> {
        let id = pool?;
        if self.pools.get(&id).is_some_and(|p| p.recording) {
            return pool;
        }
        tracing::debug!(
            target: LOG_TARGET,
            "allocation for private pool ({}, {}), which is not recording: general memory",
            id.0,
            id.1
        );
        None
    }

    /// What pool `id` holds in this shard.
    fn pool_info(&self, id: PoolId) -> Option<PoolInfo> {
        let p = self.pools.get(&id)?;
        let mut info = PoolInfo {
            use_count: p.use_count,
            recording: p.recording,
            released: p.released,
            states: p.states.len() as u32,
            ..PoolInfo::default()
        };
        for &s in &p.states {
            for &r in &self.streams[s as usize].regions {
                let r = &self.regions[r as usize];
                info.used_pages += r.in_use as u64;
                info.mapped_pages += if r.plain {
                    r.pages.len() as u64
                } else {
                    r.pages.iter().filter(|p| p.phys.is_some()).count() as u64
                };
            }
        }
        Some(info)
    }
}

impl Inner {
    pub(super) fn begin_pool(&mut self, id: PoolId) -> Result<()> {
        let entry = self.pools.entry(id).or_default();
        if entry.recording {
            return Err(pool_error(
                id,
                "is already recording (begin_allocate_to_pool twice)",
            ));
        }
        entry.recording = true;
        entry.use_count += 1;
        self.recording_pools += 1;
        if entry.released {
            // Begun again after its last release while some of its memory is still here: it
            // is a live pool again, and its cached pages are pinned again.
            entry.released = false;
            let states = entry.states.clone();
            for s in states {
                self.pin_state(s);
            }
        }
        Ok(())
    }

    pub(super) fn end_pool(&mut self, id: PoolId) -> Result<()> {
        match self.pools.get_mut(&id) {
            Some(p) if p.recording => {
                p.recording = false;
                self.recording_pools -= 1;
                // Frees deferred because their streams were capturing can go ahead now.
                self.poll_pending();
                Ok(())
            }
            _ => Err(pool_error(
                id,
                "is not recording (end_allocate_to_pool without begin)",
            )),
        }
    }

    pub(super) fn release_pool(&mut self, id: PoolId) -> Result<()> {
        let Some(p) = self.pools.get_mut(&id) else {
            return Err(pool_error(
                id,
                "does not exist (release_pool without begin)",
            ));
        };
        if p.use_count == 0 {
            return Err(pool_error(id, "was released already"));
        }
        p.use_count -= 1;
        if p.use_count > 0 {
            return Ok(());
        }
        if p.recording {
            p.recording = false;
            self.recording_pools -= 1;
        }
        p.released = true;
        let states = p.states.clone();
        for &s in &states {
            self.unpin_state(s);
        }
        // States that hold nothing go at once if nothing may still use their pages (a device
        // synchronisation since the release; usually not yet, so they go at the next one).
        // A driver error here only delays the retirement to the next reclaim.
        for s in states {
            if let Err(e) = self.retire_stream(s, false) {
                tracing::debug!(
                target: LOG_TARGET,
                "retiring a state of released pool ({}, {}): {e}",
                    id.0,
                    id.1
                );
            }
        }
        if self.pools.get(&id).is_some_and(|p| p.states.is_empty()) {
            self.pools.remove(&id);
        }
        Ok(())
    }

    /// The state of `stream` in pool `id`, created on first use.
    pub(super) fn pool_state(&mut self, id: PoolId, stream: StreamId) -> Result<u32> {
        self.tick += 1;
        if let Some(&s) = self.pool_states.get(&(id, stream)) {
            self.streams[s as usize].last_used = self.tick;
            return Ok(s);
        }
        if self.pools.get(&id).is_none_or(|p| p.released) {
            return Err(pool_error(id, "is not live"));
        }
        let s = self.add_state(stream, Some(id));
        self.pool_states.insert((id, stream), s);
        self.pools.get_mut(&id).expect("checked").states.push(s);
        Ok(s)
    }

    /// A retired pool state leaves its pool; a released pool with no state left is forgotten.
    pub(super) fn forget_pool_state(&mut self, id: PoolId, stream: StreamId, s: u32) {
        self.pool_states.remove(&(id, stream));
        if let Some(p) = self.pools.get_mut(&id) {
            p.states.retain(|&x| x != s);
            if p.released && p.states.is_empty() {
                self.pools.remove(&id);
            }
        }
    }

    /// Pin state `s`: its idle pages leave the idle list and stay mapped where they are.
    fn pin_state(&mut self, s: u32) {
        while self.streams[s as usize].idle_head != PageRef::NONE {
            let at = self.streams[s as usize].idle_head;
            self.idle_unlink(at);
        }
        self.streams[s as usize].pinned = true;
    }

    /// Unpin state `s`: its mapped handles with no page in use join its idle list (stamped now,
    /// so only a device synchronisation from now on proves them unused).
    fn unpin_state(&mut self, s: u32) {
        self.streams[s as usize].pinned = false;
        let regions = self.streams[s as usize].regions.clone();
        for r in regions {
            if self.regions[r as usize].plain {
                continue;
            }
            for p in 0..self.regions[r as usize].pages.len() as u32 {
                let slot = &self.regions[r as usize].pages[p as usize];
                let head = slot.phys.is_some() && slot.hoff == 0;
                if head && slot.busy == 0 && slot.idle_stamp == 0 {
                    self.idle_push(PageRef { region: r, page: p });
                }
            }
        }
    }

    /// Whether region `r` belongs to a pinned pool state (never given back).
    pub(super) fn region_pinned(&self, r: u32) -> bool {
        self.streams[self.regions[r as usize].stream as usize].pinned
    }

    /// `stream_done_with`'s answer where capture decides it, `None` where the ordinary fence
    /// applies: a page stamped `stamp` of state `s` is proven unused
    /// - if `s` is a pool's state that served a capture, only by a device-wide synchronisation
    ///   after its release (its graphs may replay on any stream): with `block`, one is made
    ///   unless a capture may be under way; a released state that never served one holds
    ///   stream-ordered memory, which the ordinary fence proves;
    /// - if `s`'s stream is being captured, only by a fence recorded before the capture began
    ///   (it is queried, never waited for: nothing new is recorded on a capturing stream).
    pub(super) fn capture_fence(
        &mut self,
        s: u32,
        stamp: u64,
        block: bool,
    ) -> std::result::Result<Option<bool>, DeviceError> {
        let st = &self.streams[s as usize];
        if stamp <= st.safe_seq {
            return Ok(Some(true));
        }
        if st.pool.is_some() && (st.pinned || st.captured) {
            if st.pinned || !block || self.capture_underway()? {
                return Ok(Some(false));
            }
            self.synchronize_device()?;
            return Ok(Some(stamp <= self.streams[s as usize].safe_seq));
        }
        if !self.dev.is_capturing(st.id)? {
            return Ok(None);
        }
        let st = &self.streams[s as usize];
        let done = match st.fence {
            Some(e) if st.fence_seq >= stamp => self.dev.query_event(e)?,
            _ => false,
        };
        let st = &mut self.streams[s as usize];
        if done {
            st.safe_seq = st.fence_seq;
        }
        Ok(Some(done && stamp <= st.safe_seq))
    }

    /// Whether a CUDA graph capture may be under way on this device: a pool is recording
    /// (PyTorch begins the pool before the capture and ends it after), or a stream this arena
    /// serves reports capturing (a capture PyTorch did not tell us about: `MemPool` mode).
    pub(super) fn capture_underway(&self) -> std::result::Result<bool, DeviceError> {
        if self.recording_pools > 0 {
            return Ok(true);
        }
        for st in self
            .streams
            .iter()
            .filter(|st| !st.retired && st.pool.is_none())
        {
            if self.dev.is_capturing(st.id)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A device-wide synchronisation, outside capture: every state's pages idle until now are
    /// proven unused and every pending free completes.
    pub(super) fn synchronize_device(&mut self) -> std::result::Result<(), DeviceError> {
        self.dev.synchronize()?;
        self.count_sync_all();
        // Pending frees first: the pages they make idle are covered too.
        self.finish_pending(true);
        let seq = self.seq;
        for st in &mut self.streams {
            st.safe_seq = seq;
        }
        Ok(())
    }

    /// `synchronize_all` while a capture may be under way, when the device may not be
    /// synchronised: each general stream that is not capturing is synchronised on its own (its
    /// idle pages are proven unused); capturing streams and pools are left as they are, and
    /// pending frees complete only as their events do.
    pub(super) fn synchronize_outside_capture(&mut self) -> Result<()> {
        let seq = self.seq;
        for s in 0..self.streams.len() {
            let st = &self.streams[s];
            // A released pool state that never served a capture is stream-ordered memory.
            let graphs = st.pool.is_some() && (st.pinned || st.captured);
            if st.retired || graphs || self.dev.is_capturing(st.id)? {
                continue;
            }
            self.dev.synchronize_stream(st.id)?;
            self.streams[s].safe_seq = seq;
        }
        // Only frees whose events completed: a capturing stream's work is not proven done.
        self.finish_pending(false);
        Ok(())
    }

    /// Record an event on each of `streams` for a pending free; a stream being captured is left
    /// in `waiting` (the record would become a graph node). A stream an event cannot be
    /// created or recorded for is synchronised instead. A stream none of this could be done for
    /// (a driver call failed: the capture query, the context switch around it, the record and
    /// the synchronisation) is left in `waiting` too, to be tried again at the next poll: the
    /// free has already happened for the caller, so nothing here may fail it half-way, and until
    /// an event or a synchronisation proves the stream done the memory stays pending.
    pub(super) fn record_frees(
        &mut self,
        streams: Vec<StreamId>,
        events: &mut Vec<EventHandle>,
        waiting: &mut Vec<StreamId>,
    ) {
        for s in streams {
            match self.dev.is_capturing(s) {
                Ok(false) => {}
                Ok(true) | Err(_) => {
                    waiting.push(s);
                    continue;
                }
            }
            let e = match self.take_event() {
                Ok(e) => e,
                Err(_) => {
                    // Without an event we cannot wait later: wait now.
                    if self.dev.synchronize_stream(s).is_err() {
                        waiting.push(s);
                    }
                    continue;
                }
            };
            if self.dev.record_event(e, s).is_err() {
                self.give_back_event(e);
                if self.dev.synchronize_stream(s).is_err() {
                    waiting.push(s);
                }
                continue;
            }
            events.push(e);
        }
    }

    /// For the out-of-memory message: released private pools with idle pages that no
    /// device-wide synchronisation since their release has proven unused, and those pages.
    /// Walks those states' idle lists, on the failure path only.
    pub(super) fn released_pool_pages(&self) -> (u64, u64) {
        let (mut pools, mut pages) = (std::collections::HashSet::new(), 0u64);
        for st in self
            .streams
            .iter()
            .filter(|st| !st.retired && !st.pinned && st.pool.is_some() && st.captured)
        {
            let mut at = st.idle_head;
            while at != PageRef::NONE {
                let slot = self.slot(at);
                if slot.idle_stamp > st.safe_seq {
                    pages += slot.hlen as u64;
                    pools.insert(st.pool);
                }
                at = slot.idle_next;
            }
        }
        (pools.len() as u64, pages)
    }

    /// For the out-of-memory message: live private pools, the pages they hold and of those the
    /// pages in no use, which nothing else may use (as PyTorch's message names memory "allocated
    /// in private pools (e.g., CUDA Graphs)"). O(pages of the live pools), on the failure path
    /// only.
    pub(super) fn pool_pages(&self) -> (u64, u64, u64) {
        let (mut pools, mut pages, mut unused) = (0u64, 0u64, 0u64);
        for p in self.pools.values().filter(|p| !p.released) {
            pools += 1;
            for &s in &p.states {
                for &r in &self.streams[s as usize].regions {
                    // Per handle: its pages, less those in use.
                    for slot in self.regions[r as usize].pages.iter().filter(|s| s.hlen > 0) {
                        pages += slot.hlen as u64;
                        unused += (slot.hlen - slot.busy) as u64;
                    }
                }
            }
        }
        (pools, pages, unused)
    }
}

/// A pool hook called out of order: the caller broke the contract.
fn pool_error(id: PoolId, what: &str) -> Error {
    Error::Device(DeviceError::Misuse(format!(
        "private pool ({}, {}) {what}",
        id.0, id.1
    )))
}
