//! How much a miss creates, past the pages it needs: growth steps for medium blocks and the
//! small pool, spare pages for a large block that drifted or grows for layout, growth ahead at
//! a new peak while the arena's growth costs more than native's would, and what makes a handle
//! large. `pages.rs` asks (`use_range`, `back_run`); the constants and what they were measured
//! against are in `mod.rs`.

use super::*;

/// Blocks under `MEDIUM_BYTES` (PyTorch's `kLargeBuffer`, the 20 MiB segment it packs 1–10 MiB
/// requests into) grow the arena in steps: where the addresses after a medium block's last new
/// run are free, the handle created for it also covers up to `GROWTH_BYTES` in all, so that the
/// next medium blocks placed there need no create. A step is at most 1/`GROWTH_SHARE` of the
/// pages created in steps so far, so that a workload that grows by few medium blocks (whatever
/// its large blocks) is not rounded up, and one that grows by many soon gets whole steps; what a
/// step leaves unused at the peak is at most one step. Handles created with spare pages hold at
/// most 1/`SPARE_LIMIT_SHARE` of the limit in all: such a handle may come to serve several blocks
/// and cannot move while any of them lives, and memory must stay free to move (the adversarial
/// trace runs out of memory when a quarter of the limit is in shared handles).
///
/// Whatever the ramp allows, the step of a block under `FLOOR_BELOW_BYTES` (PyTorch's
/// `kMinLargeAlloc`: it packs those into 20 MiB segments, and gives larger ones their size)
/// covers at least `GROWTH_FLOOR_BYTES`, block and spare together, within the same budget: a
/// workload that holds little would otherwise grow by the page where PyTorch's first segment
/// serves all its medium requests. 16 MiB was measured against 12, 14, 18 and 20 MiB on the
/// shared traces (BENCHMARKS.md, "Growth steps, measured").
pub(super) const MEDIUM_BYTES: u64 = 20 << 20;
pub(super) const GROWTH_BYTES: u64 = 64 << 20;
pub(super) const GROWTH_FLOOR_BYTES: u64 = 16 << 20;
pub(super) const FLOOR_BELOW_BYTES: u64 = 10 << 20;
pub(super) const GROWTH_SHARE: u64 = 12;
pub(super) const SPARE_LIMIT_SHARE: u64 = 8;
/// The small pool grows by up to this many pages at a time, within the same budget (a slab page
/// is shared by slabs of every class, so the next slabs soon need the next pages; one create for
/// four pages instead of four), and by at most 1/`SMALL_GROWTH_SHARE` of what is reserved (whole
/// steps once 2 GiB of 2 MiB pages is held): what a step leaves unused is then a small share of
/// what is held, and a workload that holds little grows by the page, as PyTorch's 2 MiB small
/// segments do. It steps only while the workload climbs (the request takes the bytes requested
/// to a new peak) or while the arena's growth costs more than native's would, as a large block
/// grows ahead (`Inner::small_step`): below the peak the small pool grows by the page, for the
/// step's unused pages would stay unused at the peak (five traces held 2 to 4 MiB over native's
/// peak so, two of which this keeps under it; BENCHMARKS.md, "Variants at 965c407").
pub(super) const SMALL_GROWTH_PAGES: u32 = 4;
pub(super) const SMALL_GROWTH_SHARE: u64 = 256;
/// A large block (from [`MEDIUM_BYTES`]) that needs new pages although a block of its length
/// needed them before, at least `DRIFT_AFTER_REQUESTS` requests ago and at a lower address, and
/// is gone from there, has *drifted*: the blocks before it took some of its old place, as they
/// do when blocks live across steps, so that each step starts from different free ranges. In a
/// workload whose shapes recur the drift goes on, by less each time, and each time the block
/// needs pages past those mapped before (the GPU suite's steps workload grew so in the fifth
/// pass of its cycle of shapes, on an H200 too). So the handle created for a drifted block also
/// covers up to 1/`DRIFT_SPARE_SHARE` of the block's length in free pages after it, within the
/// budget of handles with spare pages, and the next shifts land on mapped pages. A block that
/// grows again soon after its length did is taken for a run of blocks, as a model being built
/// or layers' outputs, and gets no spare. Measured at 1/2, 1/4, 1/8 and 1/16 and after 0, 2,000,
/// 5,000, 10,000 and 20,000 requests (BENCHMARKS.md, "Drift"): 1/8 is the least spare that
/// serves the steps workload's drift, and from 5,000 to 10,000 requests no shared trace crosses
/// a target.
pub(super) const DRIFT_AFTER_REQUESTS: u64 = 5_000;
pub(super) const DRIFT_SPARE_SHARE: u64 = 8;
/// A large block that needs new pages while the bytes requested stay under their peak so far
/// (it does not take them to a new one) grows the arena because of where blocks lie, not because
/// more is asked: blocks that live across steps land in different places from one step to the
/// next, so each step starts from different free ranges, and the highest block of a step lands
/// a little higher in one step than in another. Such growth comes back, a little further each
/// time. So its handle also covers up to 1/`LAYOUT_SPARE_SHARE` of the block's length in free
/// pages after it, as long as the bytes reserved stay within 1/`LAYOUT_HEADROOM_SHARE` of the peak
/// requested: the 5 % fragmentation the targets allow (PyTorch's allocator ran at 5.6 %
/// over the GPU suite's steps workload). Measured on perturbed orders of the GPU recordings at
/// 1/1, 1/2 and 1/4 of the length and 1/16, 1/20 and 1/24 of the peak (BENCHMARKS.md, "Nearby
/// orders"): 1/2 and 1/20 take the runs of one shape that grow after warm-up from 34 and 35 of
/// 40 to 12 and 6, with no shared trace crossing a target; the whole length costs two traces
/// their peak, and 1/16 two their fragmentation.
pub(super) const LAYOUT_SPARE_SHARE: u64 = 2;
pub(super) const LAYOUT_HEADROOM_SHARE: u64 = 20;
/// A large block that needs new pages for a new peak of the bytes requested, while the arena's
/// growth so far has cost more modelled driver time than PyTorch's allocator would have spent on
/// the same requests (`growth_cost::GrowthTime`), and whose own handle would cost more than a
/// cudaMalloc of it (under about 360 MiB at the H200's prices), *grows ahead*: its handle also
/// covers up to `AHEAD_BYTES` of free pages after it, and at most 1/`AHEAD_SHARE` of what is
/// reserved, for the next blocks of the climb. A climb to the peak (activations kept for
/// backward, a forward pass's outputs) then takes fewer, larger handles; what the last step
/// leaves unused at the peak is at most one spare, a share of what is held; and once the growth
/// costs less than native's, the arena grows by what is asked again and keeps the bytes.
/// Measured at 16 to 128 MiB and 1/32 to 1/256, with and without the share, and with blocks up
/// to 128 MiB, 360 MiB and any length (BENCHMARKS.md, "Growing ahead"): of the variants that
/// cost at most one shared trace its peak, 48 MiB and 1/128 put the most traces within every
/// target of the driver-call issue (81 of 142); a fixed 32 MiB puts 89 there but costs two
/// more their peak (Yiyi-philosophy `1.3b`, a second bolongcheng).
pub(super) const AHEAD_BYTES: u64 = 48 << 20;
pub(super) const AHEAD_SHARE: u64 = 128;
/// Lengths remembered for drift (`Inner::grown_lengths`): a bound on host memory (24 bytes each
/// and the table's overhead) whatever the number of distinct lengths a workload grows by.
pub(super) const GROWN_LENGTHS_KEPT: usize = 4_096;
/// A physical handle created for large blocks holds at most 1/`HEADROOM_SHARE` of what the limit
/// leaves (`Inner::back_run`).
pub(super) const HEADROOM_SHARE: u64 = 8;
/// A handle is *large* when it holds at least 1/`LARGE_HANDLE_SHARE` of the limit (2.5 GiB of
/// 80 GiB). A handle moves only whole, so one page of it in use keeps all of it where it is:
/// - a block that starts or ends inside a page it would share with a neighbour, and whose
///   handle would be large, gets that page as a handle of its own (`Inner::acquire`), so that
///   the neighbour holds one page, not the block's whole handle, once the block is freed;
/// - while the limit leaves room for a block, it is not placed on part of an idle large handle
///   when that would leave more of the handle unusable than the block uses, if another fit
///   exists (`Inner::place_large`, `Inner::place_medium`): it grows instead, and the handle
///   stays whole for a block of its size.
///
/// Without these, sungdk0822 `dmodel128_seqlen16384` (8 GiB blocks with 64 MiB ones between
/// them) ran out of memory on a 52 GiB device with 48.6 GiB requested, 7.9 GiB held unused in
/// handles its neighbours pinned; with them it fits in 48.7 GiB, and at 80 GiB it reserves that
/// instead of 56.5 GiB. Measured at 1/16, 1/32, 1/64 and 1/128 of the limit (BENCHMARKS.md,
/// "Large handles near the limit"): 1/16 and 1/32 move the same trace and no other; at 1/64
/// and 1/128 one more (`xl_fwd_cl2048` float32) reserves 120 MiB more, over native's peak.
pub(super) const LARGE_HANDLE_SHARE: u64 = 32;

/// Pages of a large handle under `limit` ([`LARGE_HANDLE_SHARE`]), at least 2.
pub(super) fn large_pages(limit: u64, page: u64) -> u32 {
    (limit / page / LARGE_HANDLE_SHARE).clamp(2, u32::MAX as u64) as u32
}

impl Inner {
    /// The step of the handle of a large block of `len` bytes at `addr` in `region` that needs
    /// new pages: the most of what its drift (`drifted`, [`DRIFT_SPARE_SHARE`]), growth for
    /// layout (`layout_spare`) and growth ahead (`ahead_spare`) allow; `None` for none.
    pub(super) fn large_step(&self, region: u32, len: u64, addr: u64) -> Option<Step> {
        let drift = match self.drifted(region, len, addr) {
            true => self.page_of(len) / DRIFT_SPARE_SHARE,
            false => 0,
        };
        let spare = drift.max(self.layout_spare(region, len, addr));
        let ahead = self.ahead_spare(len);
        let pages = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        match (spare, ahead) {
            (0, 0) => None,
            (spare, ahead) if ahead > spare => Some(Step::Ahead(pages(ahead))),
            (spare, _) => Some(Step::Spare(pages(spare))),
        }
    }

    /// Spare pages for a large block of `len` bytes that needs new pages for a new peak of the
    /// bytes requested while the arena's growth has cost more driver time than native's would
    /// have (`behind_native`): up to [`AHEAD_BYTES`], and 1/[`AHEAD_SHARE`] of what is
    /// reserved; 0 otherwise.
    fn ahead_spare(&self, len: u64) -> u64 {
        if self.under_peak(len) || !self.behind_native(len) {
            return 0;
        }
        AHEAD_BYTES.min(self.reserved() / AHEAD_SHARE) / self.page
    }

    /// Spare pages for a large block that needs new pages without taking the bytes requested
    /// to a new peak: up to 1/[`LAYOUT_SPARE_SHARE`] of its length, as long as the bytes
    /// reserved, its own new pages and the spare counted, stay within 1/[`LAYOUT_HEADROOM_SHARE`]
    /// of the peak requested. 0 for a block that takes them to a new peak (the arena grows for
    /// what is asked, as it must, and no more).
    fn layout_spare(&self, region: u32, len: u64, addr: u64) -> u64 {
        if !self.under_peak(len) {
            return 0;
        }
        let high = self.requested_high();
        let new = self.unmapped_pages(region, addr, len, u64::MAX) * self.page;
        let cap = high.saturating_add(high / LAYOUT_HEADROOM_SHARE);
        let room = cap.saturating_sub(self.reserved().saturating_add(new));
        room.min(len / LAYOUT_SPARE_SHARE) / self.page
    }

    /// The most bytes ever requested at once, whatever `reset_peak_memory_stats` reset.
    pub(super) fn requested_high(&self) -> u64 {
        let peak = self.stats.requested_bytes.all().peak.max(0) as u64;
        self.requested_high.max(peak)
    }

    /// Whether `bytes` more requested (by a request not counted yet) stay at or under the most
    /// ever requested: growth for them is growth for layout, not for a new peak.
    pub(super) fn under_peak(&self, bytes: u64) -> bool {
        let now = self.stats.requested_bytes.all().current.max(0) as u64;
        now.saturating_add(bytes) <= self.requested_high()
    }

    /// Whether a large block of `len` bytes placed at `addr` in `region`, which needs new pages,
    /// has drifted: a block of its length needed new pages before, at least
    /// [`DRIFT_AFTER_REQUESTS`] requests ago and lower down in the same region, and is no longer
    /// live where it was (`use_range`, [`DRIFT_SPARE_SHARE`]).
    fn drifted(&self, region: u32, len: u64, addr: u64) -> bool {
        let base = self.regions[region as usize].base;
        self.grown_lengths.get(&len).is_some_and(|&(at, tick)| {
            (base..addr).contains(&at)
                && self.tick - tick >= DRIFT_AFTER_REQUESTS
                && self.large.get(at).is_none_or(|b| b.len != len)
        })
    }

    /// How many spare pages a handle created for the small pool may cover (before the other
    /// bounds of `back_run`): 1/[`SMALL_GROWTH_SHARE`] of what is reserved while the request being
    /// served takes the bytes requested to a new peak or the arena's growth costs more than
    /// native's would (`behind_native`); none below the peak otherwise ([`SMALL_GROWTH_PAGES`]).
    pub(super) fn small_step(&self) -> u64 {
        if self.under_peak(self.serving) && !self.behind_native(self.page) {
            return 0;
        }
        self.reserved() / self.page / SMALL_GROWTH_SHARE
    }

    /// How many pages past `from` a handle created for a run of `len` pages may also cover: up
    /// to [`GROWTH_BYTES`] in all, only unmapped pages of the region (free addresses: a live
    /// block's pages are always mapped), and none when the run alone is that long.
    pub(super) fn spare_after(&self, region: u32, from: u32, len: u32) -> u32 {
        self.spare_pages_after(region, from, self.growth_pages.saturating_sub(len))
    }

    /// How many of the `want` pages from `from` on are unmapped, counting from `from` and
    /// stopping at the first mapped one.
    pub(super) fn spare_pages_after(&self, region: u32, from: u32, want: u32) -> u32 {
        let pages = &self.regions[region as usize].pages;
        pages
            .iter()
            .skip(from as usize)
            .take(want as usize)
            .take_while(|p| p.phys.is_none())
            .count() as u32
    }
}
