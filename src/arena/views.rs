//! Views: at the limit, a piece moved where a request needs it stays mapped where it was too.
//!
//! Near its smallest device a step of a training loop fits only if pages move: an idle mapping is
//! unmapped and mapped where a block goes. The place it left misses it when the next step comes
//! back there, and moves another, every step (`stitch`). CUDA maps one physical piece at several
//! addresses, so instead the moved piece is mapped a second time and stays where it was: one
//! piece, two *views*. At most one view of a piece is in use at a time. While one is, the others
//! are *blocked*: placement counts their pages as missing (`Inner::unmapped_pages`), and a block
//! placed over one unmaps it first (`Inner::clear_blocked_views`). While none is, every view is
//! an idle mapping, usable at no cost. A step that repeats then finds a piece wherever it used
//! it, and moving it is no driver call, as long as its views are not in use at once.
//!
//! What this does not do is reserve the places: no placeholder holds a blocked view in its
//! heap (one that did, tried before, changed where the next blocks went, so that every step
//! placed them at fresh addresses and made new views there). Placement is what it is without
//! views, except that a blocked view's pages count as missing, as the moved pages did.
//!
//! Bounds: views are made only of whole idle mappings of at most [`VIEW_PIECE_PAGES`] pages, in
//! large-pool regions of one stream that is not a private pool's, at most [`VIEWS_PER_PIECE`]
//! per piece, and only where the mapping would otherwise have been moved (`Inner::acquire`,
//! stitching or the out-of-memory ladder): a device with room never makes one.
//!
//! Off by default (`views:False`). On the shared traces at each one's smallest device views cut
//! the fifth step's memory calls by two fifths with the same bytes, but an idle view also shows placement
//! mapped pages that the device does not hold twice: on the demo trace at its five-step minimum
//! the fifth step goes from no memory call to 44, and `synth:two-stream-train`'s from 54 to 67
//! (BENCHMARKS.md, "Views").

use super::pages::IDLE_SCAN;
use super::*;

/// Pages of the largest idle mapping that is viewed rather than moved. A piece viewed in two
/// places and then used in part at one holds its other pages unused there (they cannot move while
/// that view is in use), where a moved one would have been cut to what the block needs. Chosen on
/// the tune half of the shared traces (`scripts/fit-summary`'s halves) by the fifth step's memory
/// calls at each trace's own minimum (`torch-arena fit traces/snapshots/*.pickle* --conf
/// views:True --native-conf '' --native-conf expandable_segments:True --native-conf
/// max_split_size_mb:512 --repeat 5`, on a build before reclaiming passed over blocked views):
/// 11,012 without views; 7,945 at 1 page, 6,403 at 4, 7,834 at 16, 6,193 at 64, and 6,082 with no
/// bound, where the tune half's minimums rose by 8 MiB in all (every bound up to 64 lowered them).
pub(super) const VIEW_PIECE_PAGES: u16 = 64;

/// Views of one piece at most: a bound on the address space and host memory one piece takes.
/// Measured as above at 64 pages: 8,018 memory calls with 2, 6,193 with 4, 6,481 with 8.
pub(super) const VIEWS_PER_PIECE: usize = 4;

impl Inner {
    /// The piece the mapping headed at `at` maps.
    pub(super) fn piece_at(&self, at: PageRef) -> PieceKey {
        let s = self.slot(at);
        PieceKey {
            h: s.phys.expect("a mapping's head is mapped").0,
            base: s.hbase,
            len: s.hlen,
        }
    }

    /// Whether the mapping headed at `at` is a view whose piece another view is using.
    pub(super) fn view_blocked(&self, at: PageRef) -> bool {
        if self.views.is_empty() {
            return false;
        }
        let Some(views) = self.views.get(&self.piece_at(at)) else {
            return false;
        };
        views.iter().any(|&v| v != at && self.slot(v).busy > 0)
    }

    /// Before `[addr, addr + len)` of `region` is counted as used by a block: unmap each blocked
    /// view on its pages, and every view of a piece after its first there (a piece serves one
    /// place at a time). They are idle (only one view of a piece is in use), so unmapping them
    /// frees nothing; the pages they covered are then backed as any missing page is. Out of line
    /// and cold: the malloc path pays only for asking whether any view exists.
    #[cold]
    #[inline(never)]
    pub(super) fn clear_blocked_views(
        &mut self,
        region: u32,
        addr: u64,
        len: u64,
    ) -> std::result::Result<(), Miss> {
        let (first, last) = self.pages_of(region, addr, len);
        let mut seen: Vec<PieceKey> = Vec::new();
        let mut p = first;
        while p <= last {
            let slot = self.regions[region as usize].pages[p as usize];
            if slot.phys.is_none() {
                p += 1;
                continue;
            }
            let head = p - slot.hoff as u32;
            let at = PageRef { region, page: head };
            let next = head + self.slot(at).hlen as u32;
            let piece = self.piece_at(at);
            if self.views.contains_key(&piece) {
                if self.view_blocked(at) || seen.contains(&piece) {
                    debug_assert_eq!(self.slot(at).busy, 0, "a blocked view is idle");
                    self.unmap_idle(at).map_err(Miss::Device)?;
                } else {
                    seen.push(piece);
                }
            }
            p = next;
        }
        Ok(())
    }

    /// A piece to map where stream `own`'s request goes (a run `Extra::view` allows), leaving it
    /// mapped where it is: the oldest idle mapping of that stream of at most `want` (and
    /// [`VIEW_PIECE_PAGES`]) pages in a large-pool region, not blocked, not borrowing lent pages,
    /// not taken already, with fewer than [`VIEWS_PER_PIECE`] views, and which the stream is done
    /// with (with `block`, waiting for it, as the out-of-memory ladder does). `None`: the caller
    /// moves one as before.
    pub(super) fn view_idle(
        &mut self,
        want: u32,
        block: bool,
        own: u32,
    ) -> std::result::Result<Option<Run>, DeviceError> {
        let mut at = self.streams[own as usize].idle_head;
        let mut looked = 0;
        while at != PageRef::NONE && looked < IDLE_SCAN {
            looked += 1;
            let slot = *self.slot(at);
            let r = &self.regions[at.region as usize];
            let va = r.base + at.page as u64 * self.page;
            let fits = slot.hlen as u32 <= want && slot.hlen <= VIEW_PIECE_PAGES;
            if !fits || r.pool != Pool::Large || self.lends.contains_key(&va) {
                at = slot.idle_next;
                continue;
            }
            let piece = self.piece_at(at);
            let views = self.views.get(&piece).map_or(1, |v| v.len());
            if views >= VIEWS_PER_PIECE || self.view_blocked(at) || self.view_in_flight(at) {
                at = slot.idle_next;
                continue;
            }
            // Stamps rise along the list: once the stream may still use one, it may use the rest.
            if !self.stream_done_with(own, slot.idle_stamp, block)? {
                break;
            }
            self.viewing.insert((piece.h, piece.base as u32), at);
            return Ok(Some(Run {
                h: PageHandle(piece.h),
                off: piece.base as u32,
                k: piece.len as u32,
            }));
        }
        Ok(None)
    }

    /// `run` was mapped with its head at `at`: a piece taken as a view is entered beside the view
    /// it copies.
    pub(super) fn view_mapped(&mut self, run: Run, at: PageRef) {
        if self.viewing.is_empty() {
            return;
        }
        if let Some(from) = self.viewing.remove(&(run.h.0, run.off)) {
            let piece = PieceKey {
                h: run.h.0,
                base: run.off as u16,
                len: run.k as u16,
            };
            self.views
                .entry(piece)
                .or_insert_with(|| vec![from])
                .push(at);
            self.view_pages += run.k as u64;
        }
    }

    /// Whether the piece of the mapping headed at `at` was taken as a view for the request being
    /// served and is not mapped there yet: no view of it may be unmapped meanwhile (its piece
    /// would go to the pool while it is being mapped elsewhere).
    pub(super) fn view_in_flight(&self, at: PageRef) -> bool {
        if self.viewing.is_empty() {
            return false;
        }
        let piece = self.piece_at(at);
        self.viewing.contains_key(&(piece.h, piece.base as u32))
    }

    /// A piece taken as a view and not mapped after all: it stays where it is. Whether `run` was.
    pub(super) fn view_not_made(&mut self, run: Run) -> bool {
        !self.viewing.is_empty() && self.viewing.remove(&(run.h.0, run.off)).is_some()
    }

    /// The mapping of `piece` headed at `at` was unmapped: whether other views of the piece stay
    /// mapped (then it is not pooled: its pages are still held).
    pub(super) fn view_unmapped(&mut self, piece: PieceKey, at: PageRef) -> bool {
        let Some(views) = self.views.get_mut(&piece) else {
            return false;
        };
        views.retain(|&v| v != at);
        if views.len() < 2 {
            self.views.remove(&piece);
        }
        self.view_pages -= piece.len as u64;
        true
    }

    /// The views' own invariants (`check_consistency`): every view of a piece maps it, at most
    /// one is in use, none is in flight, and the pages counted twice are the views past each
    /// piece's first.
    pub(super) fn check_views(&self) -> std::result::Result<(), String> {
        if !self.viewing.is_empty() {
            return Err(format!(
                "{} views acquired but not mapped",
                self.viewing.len()
            ));
        }
        let mut extra = 0u64;
        for (piece, views) in &self.views {
            if views.len() < 2 || views.len() > VIEWS_PER_PIECE {
                return Err(format!("piece {piece:?} listed with {} views", views.len()));
            }
            for &v in views {
                let r = &self.regions[v.region as usize];
                let s = &r.pages[v.page as usize];
                if !r.live || s.phys.is_none() || s.hoff != 0 || self.piece_at(v) != *piece {
                    return Err(format!("view {v:?} of piece {piece:?} does not map it"));
                }
            }
            if views.iter().filter(|&&v| self.slot(v).busy > 0).count() > 1 {
                return Err(format!("piece {piece:?} is in use at two views"));
            }
            extra += (views.len() as u64 - 1) * piece.len as u64;
        }
        if extra != self.view_pages {
            return Err(format!(
                "{extra} pages mapped as extra views, {} counted",
                self.view_pages
            ));
        }
        Ok(())
    }

    /// Whether the mapping headed at `at` is a view after its piece's first (what the page
    /// tables hold twice).
    pub(super) fn is_extra_view(&self, at: PageRef) -> bool {
        !self.views.is_empty()
            && self
                .views
                .get(&self.piece_at(at))
                .is_some_and(|v| v[0] != at)
    }
}
