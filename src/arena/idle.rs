//! Users of pages and the idle lists: a mapping whose pages all lose their users joins its
//! stream's idle list (oldest first, intrusive through the page slots), and leaves it when a
//! page of it is used again.

use super::*;

impl Inner {
    /// One more user of a page. A handle whose first page in use this is leaves the idle list.
    pub(super) fn page_user_added(&mut self, region: u32, p: u32) {
        let slot = &mut self.regions[region as usize].pages[p as usize];
        slot.users += 1;
        if slot.users == 1 {
            self.page_now_used(region, p);
        }
    }

    /// Page `p` has just gained its first user.
    pub(super) fn page_now_used(&mut self, region: u32, p: u32) {
        let r = &mut self.regions[region as usize];
        r.in_use += 1;
        self.in_use_pages[r.pool as usize] += 1;
        let slot = &r.pages[p as usize];
        if slot.phys.is_some() {
            let head = p - slot.hoff as u32;
            let h = &mut r.pages[head as usize];
            h.busy += 1;
            // (A pinned pool's unused handle is not on the idle list: pool.rs.)
            if h.busy == 1 && h.idle_stamp != 0 {
                self.idle_unlink(PageRef { region, page: head });
            }
        }
    }

    /// One user less. A mapped handle none of whose pages is used joins the idle list (newest
    /// last).
    pub(super) fn page_user_removed(&mut self, region: u32, p: u32) {
        let slot = &mut self.regions[region as usize].pages[p as usize];
        slot.users -= 1;
        if slot.users == 0 {
            self.page_now_unused(region, p);
        }
    }

    /// Page `p` has just lost its last user.
    pub(super) fn page_now_unused(&mut self, region: u32, p: u32) {
        let r = &mut self.regions[region as usize];
        r.in_use -= 1;
        self.in_use_pages[r.pool as usize] -= 1;
        let slot = &r.pages[p as usize];
        if slot.phys.is_some() {
            let head = p - slot.hoff as u32;
            let h = &mut r.pages[head as usize];
            h.busy -= 1;
            // A pinned pool's handles stay off the idle list: nothing may take them (pool.rs).
            if h.busy == 0 && !self.streams[r.stream as usize].pinned {
                self.idle_push(PageRef { region, page: head });
            }
        }
    }

    #[inline]
    pub(super) fn slot(&self, at: PageRef) -> &PageSlot {
        &self.regions[at.region as usize].pages[at.page as usize]
    }

    #[inline]
    pub(super) fn slot_mut(&mut self, at: PageRef) -> &mut PageSlot {
        &mut self.regions[at.region as usize].pages[at.page as usize]
    }

    /// Append a mapped, unused page to the idle list with a new stamp (newest last).
    pub(super) fn idle_push(&mut self, at: PageRef) {
        self.seq += 1;
        let owner = self.regions[at.region as usize].stream as usize;
        let (seq, tail) = (self.seq, self.streams[owner].idle_tail);
        let since = match self.release_idle {
            Some(_) => self.epoch.elapsed().as_nanos() as u64,
            None => 0,
        };
        let slot = self.slot_mut(at);
        debug_assert!(slot.idle_stamp == 0 && slot.phys.is_some() && slot.hlen > 0);
        slot.idle_stamp = seq;
        slot.idle_since = since;
        slot.idle_prev = tail;
        slot.idle_next = PageRef::NONE;
        let pages = slot.hlen as u64;
        if tail == PageRef::NONE {
            self.streams[owner].idle_head = at;
        } else {
            self.slot_mut(tail).idle_next = at;
        }
        self.streams[owner].idle_tail = at;
        self.idle_len += pages;
        self.idle_large += (pages >= self.large_pages as u64) as u64;
    }

    /// Take a page off the idle list.
    pub(super) fn idle_unlink(&mut self, at: PageRef) {
        let owner = self.regions[at.region as usize].stream as usize;
        let slot = self.slot_mut(at);
        debug_assert!(slot.idle_stamp != 0);
        let (prev, next) = (slot.idle_prev, slot.idle_next);
        let pages = slot.hlen as u64;
        slot.idle_stamp = 0;
        slot.idle_prev = PageRef::NONE;
        slot.idle_next = PageRef::NONE;
        match prev {
            PageRef::NONE => self.streams[owner].idle_head = next,
            p => self.slot_mut(p).idle_next = next,
        }
        match next {
            PageRef::NONE => self.streams[owner].idle_tail = prev,
            n => self.slot_mut(n).idle_prev = prev,
        }
        self.idle_len -= pages;
        self.idle_large -= (pages >= self.large_pages as u64) as u64;
    }

    /// Handles of at least `large_pages` pages on the idle lists, counted by walking them (when
    /// the limit, and with it `large_pages`, changes; and by the consistency check).
    pub(super) fn count_idle_large(&self) -> u64 {
        let mut n = 0;
        for st in &self.streams {
            let mut at = st.idle_head;
            while at != PageRef::NONE {
                let slot = self.slot(at);
                n += (slot.hlen as u32 >= self.large_pages) as u64;
                at = slot.idle_next;
            }
        }
        n
    }
}
