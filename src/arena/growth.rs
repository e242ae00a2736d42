//! How much a miss creates, past the pages it needs: growth steps for medium blocks and the
//! small pool, spare pages for a large block that drifted or grows for layout, growth ahead at
//! a new peak while the arena's growth costs more than native's would, and what makes a handle
//! large. `pages.rs` asks (`use_range`, `back_run`); the constants and what they were measured
//! against are in `mod.rs`.

use super::*;

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
