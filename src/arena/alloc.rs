//! The entry of every allocation, the fast path: find the stream's state, check the size against
//! what the limit could ever give, and try the size class or the large heap once. Only a miss
//! there goes on to the out-of-memory ladder (`ladder.rs`).

use super::*;

impl Inner {
    /// A request of `stream` (in private pool `pool`, if any) on the only shard serving: the
    /// block, or the out-of-memory error (counted) when even the out-of-memory ladder found none.
    #[inline]
    pub(super) fn malloc(
        &mut self,
        size: u64,
        stream: StreamId,
        pool: Option<PoolId>,
    ) -> Result<Block> {
        match self.try_malloc(size, stream, pool, true)? {
            Some(b) => Ok(b),
            None => Err(self.out_of_memory(size)),
        }
    }

    /// [`Inner::try_malloc`] while several shards serve: what it may raise is said first, for
    /// the device's peaks ([`Inner::malloc_raises`]).
    pub(super) fn malloc_counted(
        &mut self,
        size: u64,
        stream: StreamId,
        pool: Option<PoolId>,
        release: bool,
    ) -> Result<Option<Block>> {
        self.malloc_raises(size);
        self.try_malloc(size, stream, pool, release)
    }

    /// A request of `stream` (in private pool `pool`, if any): the block, or `None` when even the
    /// out-of-memory ladder found no memory (nothing counted yet: the arena may free memory
    /// elsewhere and ask again, or count it with `out_of_memory`). With `release` false the
    /// ladder stops before giving this shard's cache back to the driver (other shards' cached
    /// pages may come first: `Arena::short_of_memory`).
    #[inline]
    pub(super) fn try_malloc(
        &mut self,
        size: u64,
        stream: StreamId,
        pool: Option<PoolId>,
        release: bool,
    ) -> Result<Option<Block>> {
        let pool = self.recording(pool);
        self.poll_pending();
        self.lend_ok = false;
        let s = self.state_for(stream, pool)?;
        if pool.is_some() && !self.streams[s as usize].captured {
            // Whether a graph may use this state's memory (pool.rs, `capture_fence`); a failed
            // query counts as yes.
            self.streams[s as usize].captured = self.dev.is_capturing(stream).unwrap_or(true);
        }
        // A request the limit cannot give even with every cached page moved fails here, before
        // any driver call or host allocation proportional to it.
        if !self.within_reach(size) {
            // Empty slabs kept for their size class hold pages no live allocation needs: let
            // them go (host only, no driver call) and look again.
            if self.dissolve_empty_slabs() == 0 || !self.within_reach(size) {
                return Ok(None);
            }
        }
        let created = self.stats.num_device_alloc;
        self.serving = size;
        match self.try_alloc(size, s, false) {
            Ok(b) => Ok(Some(self.block(b))),
            Err(Miss::Device(e)) => Err(e.into()),
            Err(Miss::NoMemory) => self.escalate(size, stream, pool, created, release),
        }
    }

    /// Whether a request of `size` bytes could be met within the limit if every cached page were
    /// moved to it. Pages holding live data cannot move; a large block may share at most its first
    /// and last page with them, so this errs on the side of trying by at most two pages. Small
    /// requests always may (a slab slot may be free already).
    #[inline]
    pub(super) fn within_reach(&self, size: u64) -> bool {
        if size <= self.slab_max {
            return true;
        }
        let Some(len) = size.checked_next_multiple_of(MIN_BLOCK) else {
            return false;
        };
        // Lent pages are in use twice, where they were lent from and where they are.
        let pinned = (self.in_use_pages[Pool::Small as usize]
            + self.in_use_pages[Pool::Large as usize])
            .saturating_sub(self.lent_pages);
        // Shifts where the page is a power of two (`page_of`): no division on every request.
        let budget = self.page_of(self.limit).saturating_sub(pinned);
        // Only pages holding live data can be shared, and only the block's first and last
        // (`len` is at least MIN_BLOCK: `len - 1` cannot wrap).
        (self.page_of(len - 1) + 1).saturating_sub(pinned.min(2)) <= budget
    }

    /// The out-of-memory error for a request of `size` bytes, counted.
    pub(super) fn out_of_memory(&mut self, size: u64) -> Error {
        self.count_oom();
        Error::OutOfMemory(self.oom_message(size))
    }

    pub(super) fn try_alloc(
        &mut self,
        size: u64,
        s: u32,
        anywhere: bool,
    ) -> std::result::Result<(DevPtr, u64), Miss> {
        if size <= self.slab_max {
            self.alloc_small(size, s, anywhere)
        } else {
            self.alloc_large(size, s, anywhere)
        }
    }

    /// The block handed out at `ptr` (of `size` bytes), numbered.
    #[inline]
    pub(super) fn block(&mut self, (ptr, size): (DevPtr, u64)) -> Block {
        self.allocs += 1;
        self.shared.number_this();
        Block {
            ptr,
            size,
            seq: self.seq_of(self.allocs),
        }
    }

    /// The number of this shard's `n`th block: `n` while one shard serves; once several do,
    /// unique on the device, from where shard 0 had got to, shard by shard in turn (so blocks
    /// of one shard are in order, and of several nearly so).
    #[inline]
    fn seq_of(&self, n: u64) -> u64 {
        if !self.shared.multi() {
            return n;
        }
        let base = self.shared.seq_base();
        let from = if self.shard == 0 { base } else { 0 };
        base + 1 + (n - 1 - from) * SHARDS as u64 + self.shard as u64
    }
}
