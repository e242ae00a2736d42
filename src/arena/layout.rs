//! A read-only picture of an arena's memory, for PyTorch-schema snapshots (`_snapshot()`'s
//! `segments`): segments of reserved memory and the blocks that tile them.
//!
//! - A **segment** is a maximal run of mapped pages inside one VMM region (or a whole plain
//!   `cuMemAlloc` segment), typed by the region's pool: `small` (slabs) or `large` (page ranges).
//! - Its **blocks** tile it contiguously, in address order: each live allocation (a slab slot or a
//!   large block) is `ActiveAllocated`, or `ActivePendingFree` when its free waits for other
//!   streams' events (`record_stream`); every gap between them is one `Inactive` block.
//! - Pages created but mapped nowhere (the page pool) have no address: they are counted in
//!   [`Layout::pooled`], so `sum(segment sizes) + pooled == reserved`.
//!
//! Built under the arena lock by one walk over the regions (reports only; never on the hot path).

use super::{Arena, Inner};
use crate::device::StreamId;
use crate::json;
use crate::stats::Pool;

/// The state of a block in a [`LayoutSegment`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    ActiveAllocated,
    ActivePendingFree,
    Inactive,
}

impl BlockState {
    /// PyTorch's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutBlock {
    pub address: u64,
    pub size: u64,
    /// Requested bytes (0 for inactive blocks).
    pub requested: u64,
    pub state: BlockState,
}

/// One segment: contiguous mapped memory of one stream and one pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutSegment {
    pub address: u64,
    pub total_size: u64,
    pub stream: StreamId,
    /// Small pool (slabs) or large pool (page ranges).
    pub small: bool,
    pub blocks: Vec<LayoutBlock>,
}

/// The whole arena.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Physical bytes held (`reserved_bytes.all.current`).
    pub reserved: u64,
    /// `allocated_bytes.all.current`.
    pub allocated: u64,
    /// Bytes of created pages mapped nowhere (the page pool).
    pub pooled: u64,
    /// Sorted by address.
    pub segments: Vec<LayoutSegment>,
}

impl Arena {
    /// The arena's segments and blocks, walked under its lock. O(regions' pages + live
    /// allocations): for reports only.
    pub fn layout(&self) -> Layout {
        let mut all = self.on(0, |g| g.layout());
        for i in self.used().skip(1) {
            let l = self.on(i, |g| g.layout());
            all.reserved += l.reserved;
            all.allocated += l.allocated;
            all.pooled += l.pooled;
            all.segments.extend(l.segments);
        }
        all.segments.sort_by_key(|s| s.address);
        all
    }
}

impl Inner {
    fn layout(&self) -> Layout {
        let mut segments = Vec::new();
        for (id, r) in self.regions.iter().enumerate() {
            if !r.live {
                continue;
            }
            let runs: Vec<(u64, u64)> = if r.plain {
                vec![(r.base, r.len)]
            } else {
                let mut runs = Vec::new();
                let mut start: Option<usize> = None;
                for (p, slot) in r.pages.iter().enumerate() {
                    match (slot.phys.is_some(), start) {
                        (true, None) => start = Some(p),
                        (false, Some(s)) => {
                            runs.push((r.base + s as u64 * self.page, (p - s) as u64 * self.page));
                            start = None;
                        }
                        _ => {}
                    }
                }
                if let Some(s) = start {
                    let n = r.pages.len() - s;
                    runs.push((r.base + s as u64 * self.page, n as u64 * self.page));
                }
                runs
            };
            if runs.is_empty() {
                continue;
            }
            // Live allocations of this region, in address order.
            let live: Vec<LayoutBlock> = match r.pool {
                Pool::Large => {
                    let mut v: Vec<LayoutBlock> = self
                        .large
                        .iter()
                        .filter(|&(addr, _)| addr >= r.base && addr < r.base + r.len)
                        .map(|(addr, b)| LayoutBlock {
                            address: addr,
                            size: b.len,
                            requested: b.requested,
                            state: if b.pending {
                                BlockState::ActivePendingFree
                            } else {
                                BlockState::ActiveAllocated
                            },
                        })
                        .collect();
                    v.sort_unstable_by_key(|b| b.address);
                    v
                }
                Pool::Small => {
                    let mut slabs: Vec<&super::Slab> = self
                        .slabs
                        .iter()
                        .filter(|s| s.slots > 0 && s.region == id as u32)
                        .collect();
                    slabs.sort_unstable_by_key(|s| s.base);
                    let mut v = Vec::new();
                    for s in slabs {
                        for slot in 0..s.slots as u64 {
                            let addr = s.base + slot * s.slot_size;
                            if let Some(i) = s.live_slot(addr) {
                                let pending = !self.pending_ptrs.is_empty()
                                    && self.pending_ptrs.contains_key(&addr);
                                v.push(LayoutBlock {
                                    address: addr,
                                    size: s.slot_size,
                                    requested: s.requested(i),
                                    state: if pending {
                                        BlockState::ActivePendingFree
                                    } else {
                                        BlockState::ActiveAllocated
                                    },
                                });
                            }
                        }
                    }
                    v
                }
            };
            let stream = self.streams[r.stream as usize].id;
            let mut li = 0;
            for (base, len) in runs {
                let end = base + len;
                let mut blocks = Vec::new();
                let mut at = base;
                while li < live.len() && live[li].address < end {
                    let b = live[li];
                    li += 1;
                    if b.address < base {
                        continue; // not in a mapped run: cannot happen (invariant 1)
                    }
                    if b.address > at {
                        blocks.push(inactive(at, b.address - at));
                    }
                    blocks.push(b);
                    at = b.address + b.size;
                }
                if at < end {
                    blocks.push(inactive(at, end - at));
                }
                segments.push(LayoutSegment {
                    address: base,
                    total_size: len,
                    stream,
                    small: r.pool == Pool::Small,
                    blocks,
                });
            }
        }
        segments.sort_unstable_by_key(|s| s.address);
        Layout {
            reserved: self.reserved(),
            allocated: self.stats.allocated_bytes.all().current as u64,
            pooled: self.pooled_pages * self.page,
            segments,
        }
    }
}

fn inactive(address: u64, size: u64) -> LayoutBlock {
    LayoutBlock {
        address,
        size,
        requested: 0,
        state: BlockState::Inactive,
    }
}

/// `torch_arena_layout_json`: `layout` (from [`crate::arena::Arena::layout`]) in the contract's
/// schema.
pub fn layout_json(device: i32, layout: &Layout) -> String {
    let segments = json::array(layout.segments.iter().map(|s| {
        let blocks = json::array(s.blocks.iter().map(|b| {
            json::Object::new()
                .num("address", b.address)
                .num("size", b.size)
                .num("requested_size", b.requested)
                .str("state", b.state.as_str())
                .finish()
        }));
        json::Object::new()
            .num("address", s.address)
            .num("total_size", s.total_size)
            .num("stream", s.stream)
            .str("segment_type", if s.small { "small" } else { "large" })
            .raw("blocks", &blocks)
            .finish()
    }));
    json::Object::new()
        .int("device", i64::from(device))
        .num("reserved", layout.reserved)
        .num("allocated", layout.allocated)
        .num("pooled", layout.pooled)
        .raw("segments", &segments)
        .finish()
}
