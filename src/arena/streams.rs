//! Streams: the index from a stream handle to its state, and the retirement of streams that
//! hold nothing, which gives their regions back.

use super::*;

/// Streams kept without question, on the device. Past this many, a new stream first retires
/// streams that hold nothing and made no request in the last [`STREAM_IDLE_REQUESTS`] requests
/// (their idle pages go to the pool, their reservations and page tables are given back). A
/// shard, which serves one stream in [`SHARDS`] and sees about that share of the requests, keeps
/// that share of both.
pub(super) const STREAMS_KEPT: usize = 16;
pub(super) const STREAM_IDLE_REQUESTS: u64 = 256;
const SHARD_STREAMS_KEPT: usize = STREAMS_KEPT.div_ceil(SHARDS);
const SHARD_IDLE_REQUESTS: u64 = STREAM_IDLE_REQUESTS / SHARDS as u64;
/// Driver events kept for reuse (stream fences, pending frees' events); past this many, an event
/// given back is destroyed. A retired stream gives its fence back, so without a bound (or without
/// reuse) every short-lived stream would leave an event in the driver (issue 37, item 3).
pub(super) const SPARE_EVENTS_KEPT: usize = 64;

impl Inner {
    /// Index of stream `id`, created on first use (in a slot a retired stream gave back, if any).
    #[inline]
    pub(super) fn stream(&mut self, id: StreamId) -> Result<u32> {
        self.tick += 1;
        if let Some((last, s)) = self.last_stream
            && last == id
        {
            self.streams[s as usize].last_used = self.tick;
            return Ok(s);
        }
        let s = match self.stream_index.get(&id) {
            Some(&s) => s,
            None => self.new_stream(id)?,
        };
        self.streams[s as usize].last_used = self.tick;
        self.last_stream = Some((id, s));
        Ok(s)
    }

    /// A stream seen for the first time. Past this shard's share of [`STREAMS_KEPT`] streams,
    /// streams that hold nothing and were not used in its share of the last
    /// [`STREAM_IDLE_REQUESTS`] requests are retired first, so host memory and address space do
    /// not grow with the number of streams ever seen.
    #[cold]
    pub(super) fn new_stream(&mut self, id: StreamId) -> Result<u32> {
        if self.stream_index.len() >= SHARD_STREAMS_KEPT {
            let before = self.tick.saturating_sub(SHARD_IDLE_REQUESTS);
            self.retire_idle_streams(false, before)?;
        }
        let s = self.add_state(id, None);
        self.stream_index.insert(id, s);
        Ok(s)
    }

    /// A new state for stream `id` (of private pool `pool`, if any), in a free slot if there is
    /// one. Indexing it is the caller's business.
    pub(super) fn add_state(&mut self, id: StreamId, pool: Option<PoolId>) -> u32 {
        let state = StreamState::new(id, self.classes.len(), self.tick, pool);
        match self.free_streams.pop() {
            Some(s) => {
                self.streams[s as usize] = state;
                s
            }
            None => {
                self.streams.push(state);
                (self.streams.len() - 1) as u32
            }
        }
    }

    /// The state serving a request of `stream`: its general state, or with `pool` its state in
    /// that private pool.
    pub(super) fn state_for(&mut self, stream: StreamId, pool: Option<PoolId>) -> Result<u32> {
        match pool {
            None => self.stream(stream),
            Some(p) => self.pool_state(p, stream),
        }
    }

    /// Retire every stream that holds no live, pending or cached-in-use memory and was last used
    /// before request `before`: its empty current slabs dissolve, its idle pages go to the pool
    /// (only once its fence proves the GPU done with them; with `block`, waiting for it), and its
    /// reservations, page tables and heaps are given back. A stream still in use, or whose idle
    /// pages the GPU may still read, is left as it is.
    pub(super) fn retire_idle_streams(&mut self, block: bool, before: u64) -> Result<u64> {
        let mut retired = 0;
        for s in 0..self.streams.len() as u32 {
            let st = &self.streams[s as usize];
            if st.retired || st.last_used > before {
                continue;
            }
            if self.retire_stream(s, block)? {
                retired += 1;
            }
        }
        Ok(retired)
    }

    /// Retire stream `s` if it holds nothing; whether it was retired.
    pub(super) fn retire_stream(&mut self, s: u32, block: bool) -> Result<bool> {
        // A pool's memory stays until the pool is released (its graphs may replay).
        if self.streams[s as usize].pinned {
            return Ok(false);
        }
        let holds = |g: &Self| {
            g.streams[s as usize]
                .regions
                .iter()
                .any(|&r| g.regions[r as usize].in_use > 0)
        };
        if holds(self) && !self.streams[s as usize].regions.is_empty() {
            // Only empty current slabs may still hold pages: dissolve them and look again.
            for ci in 0..self.streams[s as usize].classes.len() {
                let cs = &mut self.streams[s as usize].classes[ci];
                if let Some(id) = cs.current
                    && self.slabs[id as usize].is_empty()
                {
                    cs.current = None;
                    self.dissolve_slab(id);
                }
            }
            if holds(self) {
                return Ok(false);
            }
        }
        let tail = self.streams[s as usize].idle_tail;
        if tail != PageRef::NONE {
            let stamp = self.slot(tail).idle_stamp;
            if !self.stream_done_with(s, stamp, block)? {
                return Ok(false);
            }
        }
        let now = Instant::now();
        while self.streams[s as usize].idle_head != PageRef::NONE {
            if let Some(run) = self.unmap_idle(self.streams[s as usize].idle_head)? {
                self.pool_put(run, now);
            }
        }
        while let Some(&r) = self.streams[s as usize].regions.last() {
            self.drop_region(r)?;
        }
        let st = &mut self.streams[s as usize];
        let fence = st.fence.take();
        let (id, pool) = (st.id, st.pool);
        if let Some(e) = fence {
            self.give_back_event(e);
        }
        let st = &mut self.streams[s as usize];
        *st = StreamState::retired();
        match pool {
            Some(p) => self.forget_pool_state(p, id, s),
            None => {
                self.stream_index.remove(&id);
            }
        }
        if self.last_stream.is_some_and(|(_, i)| i == s) {
            self.last_stream = None;
        }
        self.free_streams.push(s);
        tracing::debug!(
            device = self.info.ordinal,
            stream = id,
            "idle stream retired"
        );
        Ok(true)
    }

    /// An event for a fence or a pending free: a spare one if any, else a new one.
    pub(super) fn take_event(&mut self) -> std::result::Result<EventHandle, DeviceError> {
        match self.spare_events.pop() {
            Some(e) => Ok(e),
            None => self.dev.create_event(),
        }
    }

    /// Event `e` is no longer used: kept for reuse, or destroyed past [`SPARE_EVENTS_KEPT`], so
    /// what the driver holds for events is bounded whatever the number of streams ever seen.
    pub(super) fn give_back_event(&mut self, e: EventHandle) {
        if self.spare_events.len() < SPARE_EVENTS_KEPT {
            self.spare_events.push(e);
        } else if let Err(err) = self.dev.destroy_event(e) {
            tracing::debug!(device = self.info.ordinal, error = %err, "cuEventDestroy failed");
        }
    }
}
