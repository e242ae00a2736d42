//! Consistency checks for tests: every invariant recomputed from all state (O(everything)).

use super::*;

impl Inner {
    pub(super) fn check_consistency(&self) -> std::result::Result<(), String> {
        // Pages: users match live blocks and slabs (a large block counts on its first and last
        // page only, its pages between are in use as its own); idle list matches mapped unused
        // pages.
        let mut users: HashMap<(u32, u32), u32> = HashMap::new();
        let mut interior: std::collections::HashSet<(u32, u32)> = Default::default();
        // A placeholder over lent pages (`Inner::lend_idle`) counts as a block where they were
        // lent from.
        let held: Vec<(u64, u32, u64)> = self
            .large
            .iter()
            .map(|(addr, b)| (addr, b.region, b.len))
            .chain(
                self.lends
                    .values()
                    .map(|l| (l.addr, l.region, l.k as u64 * self.page)),
            )
            .collect();
        let lent: u64 = self.lends.values().map(|l| l.k as u64).sum();
        if lent != self.lent_pages || !self.lending.is_empty() {
            return Err(format!(
                "{lent} pages lent, {} counted, {} lent but not mapped",
                self.lent_pages,
                self.lending.len()
            ));
        }
        for (addr, region, len) in held {
            let (first, last) = self.pages_of(region, addr, len);
            *users.entry((region, first)).or_default() += 1;
            if last != first {
                *users.entry((region, last)).or_default() += 1;
            }
            for p in first + 1..last {
                if !interior.insert((region, p)) {
                    return Err(format!("region {region} page {p}: inside two live blocks"));
                }
            }
        }
        for &(region, p) in &interior {
            if users.contains_key(&(region, p)) {
                return Err(format!(
                    "region {region} page {p}: inside a live block and touched by another"
                ));
            }
        }
        let dead: std::collections::HashSet<u32> = self.free_slab_ids.iter().copied().collect();
        let mut allocated = [0i64; 3];
        let mut requested = [0i64; 3];
        for (id, slab) in self.slabs.iter().enumerate() {
            if dead.contains(&(id as u32)) {
                continue;
            }
            let (first, last) = self.pages_of(slab.region, slab.base, slab.span);
            for p in first..=last {
                *users.entry((slab.region, p)).or_default() += 1;
            }
        }
        self.check_slab_map(&dead)?;
        self.check_stream_regions()?;
        for (ri, r) in self.regions.iter().enumerate().filter(|(_, r)| r.live) {
            for (pi, slot) in r.pages.iter().enumerate() {
                let want = users.get(&(ri as u32, pi as u32)).copied().unwrap_or(0);
                if slot.users != want {
                    return Err(format!(
                        "region {ri} page {pi}: {} users recorded, {want} found",
                        slot.users
                    ));
                }
                let used = want > 0 || interior.contains(&(ri as u32, pi as u32));
                if used && !r.plain && slot.phys.is_none() {
                    return Err(format!("region {ri} page {pi} is used but not mapped"));
                }
            }
            let in_use = (0..r.pages.len() as u32)
                .filter(|&p| {
                    users.contains_key(&(ri as u32, p)) || interior.contains(&(ri as u32, p))
                })
                .count() as u32;
            if r.in_use != in_use {
                return Err(format!(
                    "region {ri}: {} pages counted in use, {in_use} found",
                    r.in_use
                ));
            }
            if !r.plain {
                self.check_handles(ri, &interior)?;
            }
        }
        // Statistics count a block in its request's pool (`counted_pool`); `active_at` by where
        // it is, pending frees included.
        let mut active_at = [0i64; 3];
        for (_, b) in self.large.iter() {
            active_at[Pool::Large as usize] += b.len as i64;
            if !b.pending {
                let i = accounting::counted_pool(b.requested) as usize;
                allocated[i] += b.len as i64;
                requested[i] += b.requested as i64;
            }
        }
        for (id, slab) in self.slabs.iter().enumerate() {
            if dead.contains(&(id as u32)) {
                continue;
            }
            for slot in 0..slab.slots as usize {
                let ptr = slab.base + slot as u64 * slab.slot_size;
                if slab.live_slot(ptr).is_none() {
                    continue;
                }
                active_at[Pool::Small as usize] += slab.slot_size as i64;
                if !self.pending_ptrs.contains_key(&ptr) {
                    let i = accounting::counted_pool(slab.requested(slot)) as usize;
                    allocated[i] += slab.slot_size as i64;
                    requested[i] += slab.requested(slot) as i64;
                }
            }
        }
        if active_at != self.active_at {
            return Err(format!(
                "active bytes by place (slabs, heap) counted {:?} but live and pending blocks sum to {:?}",
                &self.active_at[1..],
                &active_at[1..]
            ));
        }
        for pool in [Pool::Small, Pool::Large] {
            let i = pool as usize;
            if self.stats.allocated_bytes.pool(pool).current != allocated[i] {
                return Err(format!(
                    "{pool:?}: allocated_bytes {} but live blocks sum to {}",
                    self.stats.allocated_bytes.pool(pool).current,
                    allocated[i]
                ));
            }
            if self.stats.requested_bytes.pool(pool).current != requested[i] {
                return Err(format!(
                    "{pool:?}: requested_bytes {} but live requests sum to {}",
                    self.stats.requested_bytes.pool(pool).current,
                    requested[i]
                ));
            }
        }
        // The idle list: linked both ways, stamps rising from head to tail, length as counted,
        // and holding exactly the pages marked idle (checked page by page above).
        let (mut n, mut idle_pages) = (0u64, 0u64);
        for (si, st) in self.streams.iter().enumerate() {
            let (mut at, mut prev, mut last) = (st.idle_head, PageRef::NONE, 0u64);
            while at != PageRef::NONE {
                let slot = self.slot(at);
                if slot.idle_prev != prev
                    || slot.idle_stamp <= last
                    || self.regions[at.region as usize].stream != si as u32
                {
                    return Err(format!("stream {si}'s idle list broken at {at:?}"));
                }
                (prev, last, n) = (at, slot.idle_stamp, n + 1);
                idle_pages += slot.hlen as u64;
                at = slot.idle_next;
            }
            if prev != st.idle_tail {
                return Err(format!("stream {si}'s idle list tail is wrong"));
            }
        }
        let marked = self
            .regions
            .iter()
            .filter(|r| r.live)
            .flat_map(|r| &r.pages)
            .filter(|s| s.idle_stamp != 0)
            .count() as u64;
        let idle_large = self.count_idle_large();
        if self.idle_large != idle_large {
            return Err(format!(
                "{} idle large handles counted, {idle_large} on the idle lists",
                self.idle_large
            ));
        }
        if idle_pages != self.idle_len || n != marked {
            return Err(format!(
                "idle lists hold {n} handles of {idle_pages} pages, {} pages counted, {marked} \
                 handles marked idle",
                self.idle_len
            ));
        }
        let pooled: u64 = self
            .pool
            .iter()
            .map(|(&k, list)| k as u64 * list.len() as u64)
            .sum::<u64>()
            + self
                .parts
                .iter()
                .map(|(&k, list)| k as u64 * list.len() as u64)
                .sum::<u64>();
        if pooled != self.pooled_pages
            || self.pool.values().any(|l| l.is_empty())
            || self.parts.values().any(|l| l.is_empty())
        {
            return Err(format!(
                "the pool holds {pooled} pages, {} counted",
                self.pooled_pages
            ));
        }
        self.check_pieces()?;
        self.check_views()?;
        let shared: u64 = self.shared_handles.values().map(|&k| k as u64).sum();
        if shared != self.shared_pages || shared * self.page > self.reserved() {
            return Err(format!(
                "handles with spare pages hold {shared} pages, {} counted, {} bytes reserved",
                self.shared_pages,
                self.reserved()
            ));
        }
        let partial = self
            .regions
            .iter()
            .filter(|r| r.live && r.pool == Pool::Large)
            .flat_map(|r| &r.pages)
            .filter(|s| s.is_partial(self.page))
            .count() as i64;
        if partial != self.partial_pages {
            return Err(format!(
                "{} partial pages counted, {partial} found",
                self.partial_pages
            ));
        }
        // Reserved = physical pages held.
        let mapped: u64 = self
            .regions
            .iter()
            .filter(|r| r.live && !r.plain)
            .flat_map(|r| &r.pages)
            .filter(|s| s.phys.is_some())
            .count() as u64;
        let plain: u64 = self
            .regions
            .iter()
            .filter(|r| r.live && r.plain)
            .map(|r| r.len)
            .sum();
        // Lent pages are mapped twice (`Inner::lend_idle`), a view's piece at each view (views.rs).
        let held =
            (mapped + self.pooled_pages - self.lent_pages - self.view_pages) * self.page + plain;
        if self.reserved() != held {
            return Err(format!(
                "reserved_bytes {} but {} bytes of pages are held",
                self.reserved(),
                held
            ));
        }
        if self.reserved() > self.limit {
            return Err(format!(
                "reserved_bytes {} over the limit {}",
                self.reserved(),
                self.limit
            ));
        }
        // Every page held is in use, idle, held unused (`held_pages`) or pooled.
        if plain == 0 {
            let pages = self.page_counts();
            if pages.total() * self.page != self.reserved() {
                return Err(format!(
                    "{pages:?} make {} pages, but {} bytes are reserved",
                    pages.total(),
                    self.reserved()
                ));
            }
        }
        Ok(())
    }

    /// Every live region is listed by its stream, which is not retired; every listed region is
    /// live and owned by the stream listing it; retired slots hold nothing and are not indexed.
    pub(super) fn check_stream_regions(&self) -> std::result::Result<(), String> {
        for (si, st) in self.streams.iter().enumerate() {
            if st.retired {
                if !st.regions.is_empty() || st.idle_head != PageRef::NONE {
                    return Err(format!(
                        "retired stream slot {si} still holds regions or pages"
                    ));
                }
                if self.stream_index.values().any(|&s| s as usize == si) {
                    return Err(format!("retired stream slot {si} is still indexed"));
                }
                continue;
            }
            let indexed = match st.pool {
                Some(p) => self.pool_states.get(&(p, st.id)),
                None => self.stream_index.get(&st.id),
            };
            if indexed != Some(&(si as u32)) {
                return Err(format!("stream slot {si} ({:#x}) is not indexed", st.id));
            }
            for &r in &st.regions {
                let reg = &self.regions[r as usize];
                if !reg.live || reg.stream != si as u32 {
                    return Err(format!(
                        "stream {si} lists region {r}, which is not its own"
                    ));
                }
            }
        }
        for (ri, r) in self.regions.iter().enumerate().filter(|(_, r)| r.live) {
            let st = &self.streams[r.stream as usize];
            if st.retired || !st.regions.contains(&(ri as u32)) {
                return Err(format!(
                    "region {ri} is not listed by its stream {}",
                    r.stream
                ));
            }
        }
        Ok(())
    }

    /// Every handle is held exactly once: a handle not split is mapped whole or pooled whole; the
    /// pieces of a split handle (mapped, or pooled in `parts` as its record says) tile it with no
    /// overlap and no gap, and not all of them are pooled (it would be whole again).
    fn check_pieces(&self) -> std::result::Result<(), String> {
        let mut pieces: std::collections::HashMap<u64, Vec<(u32, u32, bool)>> = Default::default();
        for (ri, r) in self
            .regions
            .iter()
            .enumerate()
            .filter(|(_, r)| r.live && !r.plain)
        {
            let mut p = 0;
            while p < r.pages.len() {
                let head = &r.pages[p];
                let va = r.base + p as u64 * self.page;
                match head.phys {
                    // A mapping of lent pages maps a piece mapped where it was lent from too, and a
                    // view past its piece's first one a piece mapped at that one.
                    Some(_)
                        if head.hlen > 0
                            && (self.lends.contains_key(&va)
                                || self.is_extra_view(PageRef::at(ri as u32, p))) =>
                    {
                        p += head.hlen as usize;
                    }
                    Some(h) if head.hlen > 0 => {
                        let piece = (head.hbase as u32, head.hlen as u32, false);
                        pieces.entry(h.0).or_default().push(piece);
                        p += head.hlen as usize;
                    }
                    _ => p += 1,
                }
            }
        }
        for (&k, list) in &self.pool {
            for &(h, _) in list {
                pieces.entry(h.0).or_default().push((0, k, true));
            }
        }
        for list in self.parts.values() {
            for run in list {
                pieces
                    .entry(run.h.0)
                    .or_default()
                    .push((run.off, run.k, true));
            }
        }
        for (h, mut list) in pieces {
            list.sort_unstable();
            let Some(split) = self.split.get(&h) else {
                if list.len() != 1 || list[0].0 != 0 {
                    return Err(format!("handle {h:#x}, not split, is held as {list:?}"));
                }
                continue;
            };
            let mut end = 0;
            for &(off, k, _) in &list {
                if off != end {
                    return Err(format!(
                        "handle {h:#x} of {} pages: pieces {list:?} do not tile it",
                        split.pages
                    ));
                }
                end = off + k;
            }
            let mut pooled: Vec<(u32, u32)> = list
                .iter()
                .filter(|p| p.2)
                .map(|&(off, k, _)| (off, k))
                .collect();
            let mut recorded = split.pooled.clone();
            pooled.sort_unstable();
            recorded.sort_unstable();
            if end != split.pages || pooled != recorded || pooled.len() == list.len() {
                return Err(format!(
                    "handle {h:#x} of {} pages: held as {list:?}, recorded pooled {recorded:?}",
                    split.pages
                ));
            }
        }
        Ok(())
    }

    /// The handles mapped in region `ri` tile its mapped pages: each starts at a head page whose
    /// length covers pages naming the same handle with rising indices; a head's busy count is
    /// its pages in use; a handle is marked idle exactly when none of its pages is in use.
    fn check_handles(
        &self,
        ri: usize,
        interior: &std::collections::HashSet<(u32, u32)>,
    ) -> std::result::Result<(), String> {
        let pages = &self.regions[ri].pages;
        let mut p = 0;
        while p < pages.len() {
            let head = &pages[p];
            let Some(h) = head.phys else {
                if head.hlen != 0 || head.idle_stamp != 0 || head.busy != 0 {
                    return Err(format!(
                        "region {ri} page {p}: unmapped but marked as a handle"
                    ));
                }
                p += 1;
                continue;
            };
            let k = head.hlen as usize;
            if k == 0 || head.hoff != 0 || p + k > pages.len() {
                return Err(format!(
                    "region {ri} page {p}: mapped, but not the head of a handle (hlen {k}, hoff {})",
                    head.hoff
                ));
            }
            let mut busy = 0;
            for (i, slot) in pages[p..p + k].iter().enumerate() {
                if slot.phys != Some(h) || slot.hoff as usize != i {
                    return Err(format!(
                        "region {ri} page {}: not page {i} of the handle at page {p}",
                        p + i
                    ));
                }
                if i > 0 && (slot.hlen != 0 || slot.idle_stamp != 0) {
                    return Err(format!(
                        "region {ri} page {}: inside a handle, marked as a head",
                        p + i
                    ));
                }
                busy += (slot.users > 0 || interior.contains(&(ri as u32, (p + i) as u32))) as u16;
            }
            if head.busy != busy {
                return Err(format!(
                    "region {ri} handle at page {p}: busy {} but {busy} pages in use",
                    head.busy
                ));
            }
            // A pinned pool's unused handles stay off the idle list (pool.rs).
            let pinned = self.streams[self.regions[ri].stream as usize].pinned;
            if (busy == 0 && !pinned) != (head.idle_stamp != 0) {
                return Err(format!(
                    "region {ri} handle at page {p}: idle list out of step"
                ));
            }
            p += k;
        }
        Ok(())
    }

    /// The chunk map and the live slabs agree: every chunk of a live slab maps to it, every
    /// mapped chunk lies inside the live slab it names (so slabs never overlap), slab geometry
    /// matches its class, and the bytes of non-empty slabs are as counted.
    pub(super) fn check_slab_map(
        &self,
        dead: &std::collections::HashSet<u32>,
    ) -> std::result::Result<(), String> {
        let mut nonempty = 0u64;
        for (id, slab) in self.slabs.iter().enumerate() {
            if dead.contains(&(id as u32)) {
                continue;
            }
            let class = self.classes.get(slab.class as usize);
            let r = &self.regions[slab.region as usize];
            if !r.live || r.pool != Pool::Small || r.stream != slab.stream {
                return Err(format!(
                    "slab {id} lies in region {} of another kind",
                    slab.region
                ));
            }
            if slab.span != class.span
                || slab.slots != class.slots
                || slab.slot_size != class.size
                || !(slab.base - r.base).is_multiple_of(CHUNK)
                || slab.base + slab.span > r.base + r.len
            {
                return Err(format!(
                    "slab {id} at {:#x}: geometry out of step",
                    slab.base
                ));
            }
            let c0 = ((slab.base - r.base) / CHUNK) as usize;
            for c in c0..c0 + (slab.span / CHUNK) as usize {
                if r.chunks.get(c) != Some(&(id as u32)) {
                    return Err(format!(
                        "slab {id}: chunk {c} of region {} maps to {:?}",
                        slab.region,
                        r.chunks.get(c)
                    ));
                }
            }
            if slab.used > 0 {
                nonempty += slab.span;
            }
        }
        for (ri, r) in self.regions.iter().enumerate().filter(|(_, r)| r.live) {
            if r.pool != Pool::Small && !r.chunks.is_empty() {
                return Err(format!("large-pool region {ri} has a chunk map"));
            }
            for (c, &id) in r
                .chunks
                .iter()
                .enumerate()
                .filter(|(_, id)| **id != NO_SLAB)
            {
                let addr = r.base + c as u64 * CHUNK;
                let ok = self.slabs.get(id as usize).is_some_and(|slab| {
                    !dead.contains(&id)
                        && slab.region == ri as u32
                        && slab.base <= addr
                        && addr < slab.base + slab.span
                });
                if !ok {
                    return Err(format!(
                        "region {ri} chunk {c} maps to slab {id}, which is not there"
                    ));
                }
            }
        }
        if nonempty != self.nonempty_slab_bytes {
            return Err(format!(
                "non-empty slabs span {nonempty} bytes, {} counted",
                self.nonempty_slab_bytes
            ));
        }
        Ok(())
    }
}
