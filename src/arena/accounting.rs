//! Derived figures: reserved bytes, pages moving between pools, inactive-split counters, and
//! the extras the summary shows.

use super::*;

impl Inner {
    pub(super) fn reserved(&self) -> u64 {
        self.stats.reserved_bytes.all().current as u64
    }

    /// Pages mapped under slabs count as small-pool segments, all others as large: a page moving
    /// between them moves between the pools, but the device-wide totals (`all`) are unchanged, so
    /// one page created counts as one segment allocated however often it moves.
    pub(super) fn move_reserved(&mut self, from: Pool, to: Pool, pages: u64, handles: u64) {
        let bytes = (pages * self.page) as i64;
        self.stats.segment.transfer(from, to, handles as i64);
        self.stats.reserved_bytes.transfer(from, to, bytes);
    }

    /// Count `bytes` of physical memory just created (one handle or plain segment) for the request
    /// being served (`Inner::serving`).
    pub(super) fn count_growth(&mut self, bytes: u64) {
        let request = self.serving;
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

    /// Free bytes held inside pages (or slabs) that also hold live data, and how many such units.
    pub(super) fn update_inactive_split(&mut self, pool: Pool) {
        let (bytes, count) = match pool {
            Pool::Small => (
                self.nonempty_slab_bytes as i64 - self.stats.active_bytes.pool(Pool::Small).current,
                self.partial_slabs,
            ),
            Pool::Large => {
                let held = (self.in_use_pages[Pool::Large as usize] * self.page) as i64;
                let free = held - self.stats.active_bytes.pool(Pool::Large).current;
                (free, self.partial_pages)
            }
        };
        set_stat(&mut self.stats.inactive_split_bytes, pool, bytes);
        set_stat(&mut self.stats.inactive_split, pool, count);
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
        let plain_idle: u64 = self
            .regions
            .iter()
            .filter(|r| r.plain && r.live)
            .map(|r| r.pages.len() as u64 - r.in_use as u64)
            .sum();
        ArenaExtras {
            device_name: self.info.name.clone(),
            capacity: self.info.total_bytes,
            limit: self.limit,
            vmm: self.vmm,
            classes,
            pages: PageCounts {
                page_size: self.page,
                in_use: self.in_use_pages[1] + self.in_use_pages[2],
                idle_mapped: self.idle_len + plain_idle,
                pooled: self.pooled_pages,
            },
            driver: self.dev.counters(),
            bad_frees: self.bad_frees,
            pending_frees: self.pending.len() as u64,
            growth: self.growth,
        }
    }
}
