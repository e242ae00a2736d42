//! Size classes for requests of at most 1 MiB, and the slab geometry of each class.
//!
//! Spacing: 512 B steps up to 4 KiB (PyTorch's own rounding there, so no extra waste), then
//! 8 classes per doubling up to 1 MiB. A request just above a class boundary gets the next class,
//! so the worst internal waste is 1/9 ≈ 11.1 % above 4 KiB (e.g. 4097 B → 4608 B) and under
//! 512 B per request up to 4 KiB, where PyTorch rounds the same way. Every class is a multiple of
//! 512 B, so every slot is 512-byte aligned.
//!
//! A slab is a run of contiguous 64 KiB *chunks* carved into equal slots. Slabs need not fill a
//! page: several slabs (of different classes, one stream) share a physical page, which stays
//! mapped while any of them lives. The slab of each class spans at least `min(page, 8 slots)` and
//! then the fewest chunks (up to 4 pages) that keep its tail (the bytes no slot fits in) under
//! 1/16 of the slab. So a class with a handful of live tensors holds 64 KiB, not a whole 2 MiB
//! page, while a class of 256 KiB or more still gets a slab of about a page (8 slots), so it does
//! not create and dissolve slabs on every few allocations.

/// Largest request served from a size class; larger ones go to page ranges.
pub const MAX_SMALL: u64 = 1 << 20;

/// Smallest unit of every size and alignment handed out.
pub const MIN_BLOCK: u64 = 512;

/// Granule of slab spans and of the arena's slab lookup map (one entry per chunk).
pub const CHUNK: u64 = 64 << 10;

const CLASSES_PER_DOUBLING: u64 = 8;
const MAX_SLAB_PAGES: u64 = 4;
/// A slab holds at least this many slots, unless that would exceed a page.
const MIN_SLOTS: u64 = 8;

/// One size class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeClass {
    /// Slot size in bytes (a multiple of 512).
    pub size: u64,
    /// Bytes per slab: a multiple of [`CHUNK`], at most 4 pages.
    pub span: u64,
    /// Slots per slab.
    pub slots: u32,
}

/// The class table for one page size, with an O(1) lookup from request size to class.
#[derive(Clone, Debug)]
pub struct SizeClasses {
    classes: Vec<SizeClass>,
    /// `lookup[(size - 1) / 512]` = class index; 2048 entries cover 1 MiB.
    lookup: Vec<u8>,
}

impl SizeClasses {
    pub fn new(page_size: u64) -> SizeClasses {
        let mut sizes: Vec<u64> = (1..=8).map(|i| i * MIN_BLOCK).collect();
        let mut base = 4096;
        while base < MAX_SMALL {
            let step = base / CLASSES_PER_DOUBLING;
            for i in 1..=CLASSES_PER_DOUBLING {
                sizes.push(base + i * step);
            }
            base *= 2;
        }
        let classes: Vec<SizeClass> = sizes
            .into_iter()
            .map(|size| geometry(size, page_size))
            .collect();
        let mut lookup = Vec::with_capacity((MAX_SMALL / MIN_BLOCK) as usize);
        let mut c = 0usize;
        for unit in 1..=(MAX_SMALL / MIN_BLOCK) {
            let need = unit * MIN_BLOCK;
            while classes[c].size < need {
                c += 1;
            }
            lookup.push(c as u8);
        }
        SizeClasses { classes, lookup }
    }

    /// The class index for a request of `size` bytes (1 ..= MAX_SMALL).
    #[inline]
    pub fn index_of(&self, size: u64) -> usize {
        debug_assert!(size > 0 && size <= MAX_SMALL);
        self.lookup[((size - 1) / MIN_BLOCK) as usize] as usize
    }

    #[inline]
    pub fn get(&self, index: usize) -> &SizeClass {
        &self.classes[index]
    }

    pub fn len(&self) -> usize {
        self.classes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &SizeClass> {
        self.classes.iter()
    }
}

/// From `min(page, MIN_SLOTS slots)` up, the fewest chunks (≤ 4 pages) whose tail waste is
/// under 1/16, else the best of those.
fn geometry(size: u64, page_size: u64) -> SizeClass {
    debug_assert!(page_size.is_multiple_of(CHUNK));
    let waste = |chunks: u64| (chunks * CHUNK) % size;
    let least = (MIN_SLOTS * size).min(page_size).div_ceil(CHUNK).max(1);
    let most = MAX_SLAB_PAGES * page_size / CHUNK;
    let chunks = (least..=most)
        .find(|&c| c * CHUNK >= size && waste(c) * 16 < c * CHUNK)
        .unwrap_or_else(|| {
            (least..=most)
                .filter(|&c| c * CHUNK >= size)
                .min_by(|&a, &b| (waste(a) * b).cmp(&(waste(b) * a)))
                .expect("a 1 MiB class always fits in 4 pages")
        });
    SizeClass {
        size,
        span: chunks * CHUNK,
        slots: ((chunks * CHUNK) / size) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 2 << 20;

    #[test]
    fn every_size_maps_to_the_smallest_class_that_fits() {
        let sc = SizeClasses::new(PAGE);
        for size in (1..=MAX_SMALL)
            .step_by(97)
            .chain([1, 512, 513, 2048, 2049, MAX_SMALL])
        {
            let c = sc.index_of(size);
            assert!(sc.get(c).size >= size, "class too small for {size}");
            if c > 0 {
                assert!(sc.get(c - 1).size < size, "a smaller class fits {size}");
            }
        }
    }

    #[test]
    fn waste_is_bounded_as_documented() {
        let sc = SizeClasses::new(PAGE);
        for size in 4097..=MAX_SMALL {
            let class = sc.get(sc.index_of(size)).size;
            assert!(
                (class - size) * 9 <= class,
                "{size} -> {class} wastes more than 1/9"
            );
        }
        for c in sc.iter() {
            assert_eq!(c.size % MIN_BLOCK, 0);
            let slab = c.span;
            assert!(
                (slab % c.size) * 16 < slab,
                "class {} tail waste over 1/16",
                c.size
            );
            assert!(slab.is_multiple_of(CHUNK) && slab <= 4 * PAGE);
            assert!(c.slots >= 2 && c.slots <= 4096);
            assert!(
                c.slots as u64 >= MIN_SLOTS || slab >= PAGE,
                "class {} has {} slots in a sub-page slab",
                c.size,
                c.slots
            );
        }
    }
}
