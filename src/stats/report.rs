//! Plain data the arena reports about itself: per-class occupancy, pages, and what a trim or a
//! defragment recovered. Filled by the arena (which re-exports these types), read by the summary
//! renderer and the C ABI; kept here so that stats imports nothing above it.

use crate::device::DriverCounters;

/// Occupancy of one size class.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassOccupancy {
    /// Slot size in bytes.
    pub size: u64,
    /// Slabs currently carved into this class. A slab spans whole 64 KiB chunks (its class's
    /// `span`, 64 KiB to 4 pages), and slabs of several classes may share one physical page.
    pub slabs: u64,
    /// Slots holding a live allocation.
    pub used_slots: u64,
    /// Slots in all slabs of this class.
    pub total_slots: u64,
}

/// Where the physical pages are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PageCounts {
    /// Bytes per physical page.
    pub page_size: u64,
    /// Pages mapped and holding at least one live (or pending) allocation.
    pub in_use: u64,
    /// Pages mapped but holding nothing: cached for exact-size reuse, or empty slabs.
    pub idle_mapped: u64,
    /// Pages mapped and holding nothing that cannot move: a physical handle is mapped and
    /// unmapped only whole, and other pages of theirs hold live allocations (or they belong to a
    /// private pool, which keeps its pages until it is released). Only a free of those
    /// allocations makes them usable elsewhere as they are; when memory runs out, the
    /// out-of-memory ladder may lend those outside a private pool (map them a second time where
    /// the request goes: ARCHITECTURE.md, "Lending at the limit").
    pub held: u64,
    /// Pages created but not mapped anywhere: ready to back any new range.
    pub pooled: u64,
}

impl PageCounts {
    /// Bytes cached: idle mapped pages and pooled (unmapped) pages, ready for any request. The
    /// one definition of "cached" that the out-of-memory message and the replay's report use.
    pub fn cached_bytes(&self) -> u64 {
        self.idle_mapped
            .saturating_add(self.pooled)
            .saturating_mul(self.page_size)
    }

    /// Every page reserved: with VMM, `reserved_bytes` is this many pages.
    pub fn total(&self) -> u64 {
        self.in_use
            .saturating_add(self.idle_mapped)
            .saturating_add(self.held)
            .saturating_add(self.pooled)
    }
}

impl std::ops::AddAssign for PageCounts {
    /// Sum the counts of an arena's shards (of one page size).
    fn add_assign(&mut self, p: PageCounts) {
        self.page_size = self.page_size.max(p.page_size);
        self.in_use += p.in_use;
        self.idle_mapped += p.idle_mapped;
        self.held += p.held;
        self.pooled += p.pooled;
    }
}

/// Physical memory created (a handle, or with no VMM a segment) for one kind of request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Growth {
    /// cuMemCreate (or cuMemAlloc) calls.
    pub handles: u64,
    pub bytes: u64,
}

/// What the arena created, by what the request it served did to the bytes requested: take them
/// to a new peak (growth a step needs, whatever the allocator), or not (the memory was there,
/// but not where the request landed: layout, or memory another stream or pool holds). Growth
/// after warm-up below the peak is what a steady state has to avoid (BENCHMARKS.md, "Nearby
/// orders"). The peak is the most ever requested at once, whatever `reset_peak_memory_stats`
/// reset. Counted since the arena started, as the driver calls are
/// (`reset_accumulated_memory_stats` leaves them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrowthCounts {
    /// For requests that took the bytes requested to a new peak.
    pub at_peak: Growth,
    /// For requests that left them at or under the peak so far.
    pub below_peak: Growth,
}

impl GrowthCounts {
    /// What was created between `before` and now (`self`).
    pub fn since(&self, before: &GrowthCounts) -> GrowthCounts {
        let d = |a: Growth, b: Growth| Growth {
            handles: a.handles.saturating_sub(b.handles),
            bytes: a.bytes.saturating_sub(b.bytes),
        };
        GrowthCounts {
            at_peak: d(self.at_peak, before.at_peak),
            below_peak: d(self.below_peak, before.below_peak),
        }
    }
}

impl std::ops::AddAssign for GrowthCounts {
    /// Sum the counts of an arena's shards.
    fn add_assign(&mut self, g: GrowthCounts) {
        for (a, b) in [
            (&mut self.at_peak, g.at_peak),
            (&mut self.below_peak, g.below_peak),
        ] {
            a.handles += b.handles;
            a.bytes += b.bytes;
        }
    }
}

/// Everything the torch-arena section of `memory_summary` shows beyond PyTorch's table.
#[derive(Clone, Debug, Default)]
pub struct ArenaExtras {
    pub device_name: String,
    /// Device memory in bytes.
    pub capacity: u64,
    /// Most bytes the arena may hold (capacity × memory fraction).
    pub limit: u64,
    /// Whether pages are VMM pages (false: plain cuMemAlloc segments).
    pub vmm: bool,
    pub classes: Vec<ClassOccupancy>,
    pub pages: PageCounts,
    pub driver: DriverCounters,
    /// Bad frees, double frees, size mismatches and unknown record_stream pointers seen.
    pub bad_frees: u64,
    /// Allocations freed whose events (record_stream) have not completed yet.
    pub pending_frees: u64,
    /// Physical memory created, by whether its request took the bytes requested to a new peak.
    pub growth: GrowthCounts,
    /// Times a thread took a shard of its own for a stream, having kept meeting another thread
    /// at that stream's shard (the device's count, not a shard's).
    pub own_shards: u64,
}

impl ArenaExtras {
    /// Add another shard's extras of the same device (its driver counters are the device's: the
    /// same counters, kept once).
    pub fn merge(&mut self, other: ArenaExtras) {
        for (a, b) in self.classes.iter_mut().zip(other.classes) {
            a.slabs += b.slabs;
            a.used_slots += b.used_slots;
            a.total_slots += b.total_slots;
        }
        self.pages += other.pages;
        self.bad_frees += other.bad_frees;
        self.pending_frees += other.pending_frees;
        self.growth += other.growth;
    }
}

/// What `defragment` or `empty_cache` recovered. `#[repr(C)]`: the C ABI's
/// `torch_arena_reclaim_report` is this very struct (`cpp_shim/torch_arena.h`); Python's ctypes
/// mirror in `_native.py` is the one other copy (another language), read field by field in
/// `tests/python/test_stats.py`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    /// Empty slabs dissolved into free pages.
    pub slabs_released: u64,
    /// Idle mapped pages unmapped into the page pool.
    pub pages_unmapped: u64,
    /// Pages released to the driver (cuMemRelease / cuMemFree).
    pub pages_released: u64,
    /// Bytes made available to any new range (unmapped pages).
    pub bytes_recovered: u64,
    /// Bytes given back to the driver.
    pub bytes_released: u64,
}

impl std::ops::AddAssign for ReclaimReport {
    /// Sum reports of several devices.
    fn add_assign(&mut self, r: ReclaimReport) {
        self.slabs_released += r.slabs_released;
        self.pages_unmapped += r.pages_unmapped;
        self.pages_released += r.pages_released;
        self.bytes_recovered += r.bytes_recovered;
        self.bytes_released += r.bytes_released;
    }
}
