//! Derived figures: reserved bytes, pages moving between pools, inactive-split counters, the
//! modelled cost of the growth so far against native's (`growth_cost::GrowthTime`), and the extras
//! the summary shows.

use super::*;
use crate::sizing as native;
use crate::stats::{all_mask, place, with_pool};

impl Inner {
    pub(super) fn reserved(&self) -> u64 {
        self.stats.reserved_bytes.all().current as u64
    }

    /// What the limit leaves to create: the bytes every shard holds count.
    #[inline]
    pub(super) fn room(&self) -> u64 {
        self.limit.saturating_sub(self.shared.reserved())
    }

    /// Where the physical pages are: in use, idle mapped, held unused, pooled ([`PageCounts`]).
    /// Walks the regions (`held_pages`): for reports.
    pub(super) fn page_counts(&self) -> PageCounts {
        let plain_idle: u64 = self
            .regions
            .iter()
            .filter(|r| r.plain && r.live)
            .map(|r| r.pages.len() as u64 - r.in_use as u64)
            .sum();
        PageCounts {
            page_size: self.page,
            // Lent pages are in use where they were lent from and count once, where they are.
            in_use: (self.in_use_pages[Pool::Small as usize]
                + self.in_use_pages[Pool::Large as usize])
                .saturating_sub(self.lent_pages),
            // A piece mapped at several views is idle at all but at most one of them, and held
            // once (views.rs).
            idle_mapped: self.idle_len.saturating_sub(self.view_pages) + plain_idle,
            held: self.held_pages(),
            pooled: self.pooled_pages,
        }
    }

    /// Mapped VMM pages that hold nothing and cannot move ([`PageCounts::held`]): the unused pages
    /// of handles that are not idle. One visit per handle and per unmapped page: for reports.
    pub(super) fn held_pages(&self) -> u64 {
        self.held_pages_where(|_| true)
    }

    /// [`Self::held_pages`] less those of live private pools (pinned: they hold their pages
    /// until released, whatever is allocated; the out-of-memory message names them apart).
    pub(super) fn held_pages_outside_pools(&self) -> u64 {
        self.held_pages_where(|r| !self.region_pinned(r))
    }

    fn held_pages_where(&self, keep: impl Fn(u32) -> bool) -> u64 {
        let mut held = 0;
        for (id, r) in self.regions.iter().enumerate() {
            if !r.live || r.plain || !keep(id as u32) {
                continue;
            }
            let mut p = 0;
            while p < r.pages.len() {
                let head = &r.pages[p];
                if head.phys.is_none() {
                    p += 1;
                    continue;
                }
                if head.idle_stamp == 0 {
                    held += (head.hlen - head.busy) as u64;
                }
                p += head.hlen.max(1) as usize;
            }
        }
        held
    }

    // -----------------------------------------------------------------------------------------
    // Every update of `stats` goes through these (tests/layering.rs holds the other files to it).

    /// A new live allocation of a `block`-byte block for a request of `size` bytes, placed
    /// `at` (a slab slot or a heap block).
    #[inline]
    pub(super) fn count_alloc(&mut self, at: Pool, size: u64, block: u64) {
        let pool = counted_pool(size);
        let st = &mut self.stats;
        st.allocation.increase(pool, 1);
        st.active.increase(pool, 1);
        st.allocated_bytes.increase(pool, block as i64);
        st.active_bytes.increase(pool, block as i64);
        st.requested_bytes.increase(pool, size as i64);
        self.active_at[at as usize] += block as i64;
        self.update_inactive_split(at);
    }

    /// A request for `size` bytes is about to be served while several shards serve: the counts
    /// [`Inner::count_alloc`] raises for it may rise (`Inner::rising`). Said here, before the
    /// request, rather than in `count_alloc`: one shard serving alone publishes nothing, and
    /// marking them on its every request cost it 3 to 5 % of its pairs per second through the
    /// C ABI (alternated runs of `bench/abi-threads`' harness, three sets of 4 to 6 rounds) for
    /// 4.5 instructions a pair: where its hot code lay in the instruction cache, it seems
    /// (cachegrind counted six times the misses there).
    pub(super) fn malloc_raises(&mut self, size: u64) {
        const RAISED: u32 = all_mask(&[
            place::ALLOCATION,
            place::ACTIVE,
            place::ALLOCATED_BYTES,
            place::ACTIVE_BYTES,
            place::REQUESTED_BYTES,
        ]);
        self.rising |= with_pool(RAISED, counted_pool(size));
    }

    /// A live allocation freed: its `block` bytes, for a request of `requested` bytes.
    #[inline]
    pub(super) fn count_free(&mut self, requested: u64, block: u64) {
        let pool = counted_pool(requested);
        let st = &mut self.stats;
        st.allocation.decrease(pool, 1);
        st.allocated_bytes.decrease(pool, block as i64);
        st.requested_bytes.decrease(pool, requested as i64);
    }

    /// A block or slab slot of `bytes`, placed `at`, for a request of `requested` bytes, no
    /// longer active (its memory free for reuse).
    #[inline]
    pub(super) fn count_inactive(&mut self, at: Pool, requested: u64, bytes: i64) {
        let pool = counted_pool(requested);
        self.stats.active.decrease(pool, 1);
        self.stats.active_bytes.decrease(pool, bytes);
        self.active_at[at as usize] -= bytes;
    }

    /// One handle (or plain segment) of `bytes` created by the driver.
    pub(super) fn count_created(&mut self, pool: Pool, bytes: u64) {
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, bytes as i64);
        self.stats.num_device_alloc += 1;
        self.rising |= with_pool(SEGMENTS, pool);
    }

    /// One handle (or plain segment) of `bytes` given back to the driver.
    pub(super) fn count_released(&mut self, pool: Pool, bytes: u64) {
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, bytes as i64);
        self.stats.num_device_free += 1;
    }

    /// One pooled handle of `bytes` handed to another shard (no driver call: `Inner::give_handles`).
    pub(super) fn count_given(&mut self, bytes: u64) {
        self.stats.segment.give(Pool::Large, 1);
        self.stats.reserved_bytes.give(Pool::Large, bytes as i64);
    }

    /// One handle of `bytes` another shard handed over (`Inner::take_handles`).
    pub(super) fn count_taken(&mut self, bytes: u64) {
        self.stats.segment.increase(Pool::Large, 1);
        self.stats
            .reserved_bytes
            .increase(Pool::Large, bytes as i64);
        self.rising |= with_pool(SEGMENTS, Pool::Large);
    }

    /// A request that ran out of memory.
    pub(super) fn count_oom(&mut self) {
        self.stats.num_ooms += 1;
    }

    /// A request retried after waiting for every stream (PyTorch's `num_alloc_retries`).
    pub(super) fn count_retry(&mut self) {
        self.stats.num_alloc_retries += 1;
    }

    /// A synchronisation of every stream (PyTorch's `num_sync_all_streams`).
    pub(super) fn count_sync_all(&mut self) {
        self.stats.num_sync_all_streams += 1;
    }

    /// `reset_peak_memory_stats`: every peak back to its current value; the most bytes ever
    /// requested at once is kept (`requested_high`) for the growth rules, which must not forget
    /// it.
    pub(super) fn reset_peaks(&mut self) {
        self.requested_high = self.requested_high();
        self.stats.reset_peak();
    }

    /// `reset_accumulated_memory_stats`: the allocated and freed totals and the scalar counters
    /// back to zero.
    pub(super) fn reset_accumulated(&mut self) {
        self.stats.reset_accumulated();
    }

    /// Pages mapped under slabs count as small-pool segments, all others as large: a page moving
    /// between them moves its allocation from one pool to the other; the device-wide row (`all`)
    /// stays the pools' sum and counts one page created once ([`crate::stats::StatArray::transfer`]).
    pub(super) fn move_reserved(&mut self, from: Pool, to: Pool, pages: u64, handles: u64) {
        let bytes = (pages * self.page) as i64;
        self.stats.segment.transfer(from, to, handles as i64);
        self.stats.reserved_bytes.transfer(from, to, bytes);
        self.rising |= with_pool(SEGMENTS, to);
    }

    /// Count `bytes` of physical memory just created (one handle, or a plain segment with
    /// `plain`) for the request being served (`Inner::serving`), and price it ([`GrowthTime`]).
    pub(super) fn count_growth(&mut self, bytes: u64, plain: bool) {
        let request = self.serving;
        let t = &mut self.growth_time;
        t.ours_us += match plain {
            true => t.prices.malloc_us(bytes),
            false => t.prices.handle_us(bytes),
        };
        // Within the limit (`within_reach`), so the rounding cannot wrap.
        let segment = native::allocation_size(native::round_size(request), native::LARGE_SEGMENT);
        t.native_us += if request < native::MIN_LARGE_ALLOC {
            bytes as f64 / segment as f64 * t.prices.malloc_us(segment)
        } else if t.counted_request != self.tick {
            t.counted_request = self.tick;
            t.prices.malloc_us(segment)
        } else {
            0.0
        };
        let below_peak = self.under_peak(request);
        let g = match below_peak {
            true => &mut self.growth.below_peak,
            false => &mut self.growth.at_peak,
        };
        g.handles += 1;
        g.bytes += bytes;
        tracing::debug!(
            device = self.info.ordinal,
            bytes,
            request,
            below_peak,
            "physical memory created ({})",
            match below_peak {
                true => "the bytes requested stay under their peak: layout",
                false => "the bytes requested reach a new peak",
            }
        );
    }

    /// Count a cuMemAddressReserve in the growth's modelled time.
    pub(super) fn count_reservation(&mut self) {
        let t = &mut self.growth_time;
        t.ours_us += t.prices.call_us("cuMemAddressReserve", 0);
    }

    /// Whether the arena's growth so far cost more modelled driver time than native's would
    /// have, and a handle of `len` bytes costs more than a cudaMalloc of them: a large block
    /// growing for a new peak then grows ahead (`Inner::ahead_spare`).
    pub(super) fn behind_native(&self, len: u64) -> bool {
        let t = &self.growth_time;
        t.ours_us > t.native_us && t.prices.handle_us(len) > t.prices.malloc_us(len)
    }

    /// Free bytes held inside pages (or slabs) that also hold live data, and how many such units.
    /// Inlined: called on every malloc and free, and left out of line once it marked rises
    /// (`bench/instructions full/1000/1/arena`: 2,074.8 instructions a pair called, 2,059.8
    /// inlined).
    #[inline(always)]
    pub(super) fn update_inactive_split(&mut self, pool: Pool) {
        // A rise is marked here, in the branch that raises it, with a constant for each pool:
        // the publication compared the six with what it had published, about 70 instructions a
        // pair with two shards serving (`bench/instructions full/1000/2/arena`).
        const BYTES: u32 = all_mask(&[place::INACTIVE_SPLIT_BYTES]);
        const COUNT: u32 = all_mask(&[place::INACTIVE_SPLIT]);
        let (bytes, count, marks) = match pool {
            Pool::Small => (
                self.nonempty_slab_bytes as i64 - self.active_at[Pool::Small as usize],
                self.partial_slabs,
                const { [with_pool(BYTES, Pool::Small), with_pool(COUNT, Pool::Small)] },
            ),
            Pool::Large => {
                let held = (self.in_use_pages[Pool::Large as usize] * self.page) as i64;
                let free = held - self.active_at[Pool::Large as usize];
                (
                    free,
                    self.partial_pages,
                    const { [with_pool(BYTES, Pool::Large), with_pool(COUNT, Pool::Large)] },
                )
            }
        };
        let rising = &mut self.rising;
        let st = &mut self.stats;
        set_stat(&mut st.inactive_split_bytes, pool, bytes, rising, marks[0]);
        set_stat(&mut st.inactive_split, pool, count, rising, marks[1]);
    }

    pub(super) fn extras(&self) -> ArenaExtras {
        let mut classes: Vec<ClassOccupancy> = self
            .classes
            .iter()
            .map(|c| ClassOccupancy {
                size: c.size,
                ..Default::default()
            })
            .collect();
        let mut dead = vec![false; self.slabs.len()];
        for &id in &self.free_slab_ids {
            dead[id as usize] = true;
        }
        for (slab, _) in self.slabs.iter().zip(&dead).filter(|(_, d)| !**d) {
            let c = &mut classes[slab.class as usize];
            c.slabs += 1;
            c.used_slots += slab.used as u64;
            c.total_slots += slab.slots as u64;
        }
        ArenaExtras {
            device_name: self.info.name.clone(),
            capacity: self.info.total_bytes,
            limit: self.limit,
            vmm: self.vmm,
            classes,
            pages: self.page_counts(),
            driver: self.dev.counters(),
            bad_frees: self.bad_frees,
            pending_frees: self.pending.len() as u64,
            growth: self.growth,
            own_shards: self.shared.own_shards(),
        }
    }
}

/// The pool whose statistics count a request of `size` bytes: PyTorch's, by the request's
/// size (`kSmallSize`), wherever the arena placed it. Requests of 64 KiB to 1 MiB take heap
/// blocks by default (`slab_max_kb`) and still count as `small_pool`, as in `memory_stats()`;
/// reserved bytes and segments stay counted by where the pages are.
#[inline]
pub(super) fn counted_pool(size: u64) -> Pool {
    match size <= native::SMALL_SIZE {
        true => Pool::Small,
        false => Pool::Large,
    }
}

/// Set a derived statistic's current value, keeping peak and totals in step; a rise marks
/// `marks` (its `all` and `pool` statistics) in `rising`.
#[inline]
fn set_stat(
    arr: &mut crate::stats::StatArray,
    pool: Pool,
    value: i64,
    rising: &mut u32,
    marks: u32,
) {
    let delta = value - arr.pool(pool).current;
    if delta > 0 {
        arr.increase(pool, delta);
        *rising |= marks;
    } else if delta < 0 {
        arr.decrease(pool, -delta);
    }
}

/// The statistics a handle created or moved changes.
const SEGMENTS: u32 = all_mask(&[place::SEGMENT, place::RESERVED_BYTES]);
