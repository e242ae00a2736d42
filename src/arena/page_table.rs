//! The page table's records: a [`Region`] of reserved addresses and its [`PageSlot`]s, the
//! mappings ([`Run`]) of physical handles over them, handles split into pieces ([`Split`]) and
//! pieces lent at the limit ([`Lend`]). Plain data; what the arena does with them is in
//! `pages.rs`.

use crate::device::PageHandle;
use crate::stats::Pool;

/// One reservation of virtual addresses (or, without VMM, one plain segment), owned by one stream.
#[derive(Debug)]
pub(super) struct Region {
    pub(super) base: u64,
    pub(super) len: u64,
    pub(super) stream: u32,
    pub(super) pool: Pool,
    /// A plain cuMemAlloc segment: always backed, released only whole.
    pub(super) plain: bool,
    pub(super) pages: Vec<PageSlot>,
    /// Small pool only: the slab holding each 64 KiB chunk (`NO_SLAB` for none), indexed by
    /// `(addr - base) / CHUNK`. Grown lazily to the highest chunk a slab has used, so it costs
    /// 4 bytes per 64 KiB of the small pool's address high-water mark (64 B per 2 MiB page).
    pub(super) chunks: Vec<u32>,
    /// Pages with at least one user.
    pub(super) in_use: u32,
    /// False once released (plain segments given back); its index stays reserved.
    pub(super) live: bool,
}

/// One page of a region's address space. Physical memory comes in *handles* of one or more
/// pages (one cuMemCreate each), mapped at consecutive pages whole or in pieces (cuMemMap maps
/// any page-aligned piece of a handle, and cuMemUnmap takes whole mappings). A *mapping* (one
/// [`Run`]) is the unit that goes idle, moves and is unmapped: every page of it names its
/// handle, with its index in the mapping, and the mapping's first page (its *head*) holds what
/// concerns it as a whole — its length, where it starts in its handle, how many of its pages
/// are in use, and its place on the idle list. A piece is mapped twice only while it is lent
/// ([`Lend`]); a page table never shows the same physical page twice otherwise.
///
/// 64 bytes, aligned to 64: a visit to a page reads one cache line. Page tables run to tens of
/// millions of slots with a million blocks live, and a malloc+free pair visits a block's two
/// boundary pages and its handles' heads in slots nowhere near each other, so at 72 bytes each
/// visit read two lines (a test holds the size).
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
pub(super) struct PageSlot {
    /// The physical handle mapped over this page (VMM only).
    pub(super) phys: Option<PageHandle>,
    /// This page's index in its mapping (0 on the head page).
    pub(super) hoff: u16,
    /// On a head page: the pages of its mapping (0 elsewhere, and when unmapped).
    pub(super) hlen: u16,
    /// On a head page: the mapping's first page in its handle (`Run::off`).
    pub(super) hbase: u16,
    /// On a head page: pages of its mapping with at least one user. The mapping is idle (on its
    /// stream's idle list) exactly when this is 0.
    pub(super) busy: u16,
    /// Live blocks or slabs touching this page.
    pub(super) users: u32,
    /// Bytes of live large blocks inside this page (a page is at most 1 GiB: `page_size_mb`'s
    /// bound).
    pub(super) covered: u32,
    /// On the head of a mapped, unused handle: when it went idle, as a sequence number (0 = not
    /// idle). Its stream's fence must have passed this stamp before the handle moves.
    pub(super) idle_stamp: u64,
    /// Nanoseconds since the arena started when it went idle (tracked only with
    /// `release_idle_ms`).
    pub(super) idle_since: u64,
    /// Neighbours in the idle list (oldest first), an intrusive list so that a page joins or
    /// leaves it in O(1): a large block touches dozens of pages on every alloc and free.
    pub(super) idle_prev: PageRef,
    pub(super) idle_next: PageRef,
}

/// `k` pages of physical handle `h` from its page `off` on: what one mapping maps, or a piece
/// of a split handle in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Run {
    pub(super) h: PageHandle,
    pub(super) off: u32,
    pub(super) k: u32,
}

impl Run {
    pub(super) fn whole(h: PageHandle, k: u32) -> Run {
        Run { h, off: 0, k }
    }
}

/// Idle pages of a mapping that other pages of it pin, lent at the limit to back a range
/// elsewhere (`Inner::lend_idle`): the same physical pages are then mapped twice, and at their
/// own address they are held by a placeholder taken from their stream's heap, so that no block
/// is placed on them there until the mapping that borrowed them is unmapped (`Inner::unlend`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Lend {
    /// Where the pages are lent from: their region, stream, address and count.
    pub(super) region: u32,
    pub(super) stream: u32,
    pub(super) addr: u64,
    pub(super) k: u32,
    /// The placeholder's node in the stream's large heap.
    pub(super) node: u32,
}

/// A handle split into pieces: its length, and its pieces in the pool (`Inner::parts`) with
/// their pages. Once every page is back in the pool the pieces join into the whole handle again.
#[derive(Clone, Debug, Default)]
pub(super) struct Split {
    pub(super) pages: u32,
    pub(super) pooled: Vec<(u32, u32)>,
}

impl Split {
    pub(super) fn pooled_pages(&self) -> u32 {
        self.pooled.iter().map(|&(_, k)| k).sum()
    }
}

/// A physical piece as its mappings name it: the handle, its first page in it and its pages
/// (`views.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct PieceKey {
    pub(super) h: u64,
    pub(super) base: u16,
    pub(super) len: u16,
}

/// A page of a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct PageRef {
    pub(super) region: u32,
    pub(super) page: u32,
}

impl PageRef {
    pub(super) const NONE: PageRef = PageRef {
        region: u32::MAX,
        page: u32::MAX,
    };

    /// Page `page` of region `region`.
    pub(super) fn at(region: u32, page: usize) -> PageRef {
        PageRef {
            region,
            page: page as u32,
        }
    }
}

impl PageSlot {
    /// Holding live data and free bytes: free space no one else can use (the large pool's
    /// inactive split).
    #[inline]
    pub(super) fn is_partial(&self, page: u64) -> bool {
        self.users > 0 && u64::from(self.covered) < page
    }
}

impl Default for PageSlot {
    fn default() -> Self {
        PageSlot {
            phys: None,
            hoff: 0,
            hlen: 0,
            hbase: 0,
            busy: 0,
            users: 0,
            covered: 0,
            idle_stamp: 0,
            idle_since: 0,
            idle_prev: PageRef::NONE,
            idle_next: PageRef::NONE,
        }
    }
}
