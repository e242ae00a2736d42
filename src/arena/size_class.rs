//! Size classes for requests of at most 1 MiB, and the slab geometry of each class.
//!
//! Spacing: 512 B steps up to 4 KiB (PyTorch's own rounding there, so no extra waste), then
//! 8 classes per doubling up to 1 MiB. A request just above a class boundary gets the next class,
//! so the worst internal waste is 1/9 ≈ 11.1 % above 4 KiB (e.g. 4097 B → 4608 B) and under
//! 512 B per request up to 4 KiB, where PyTorch rounds the same way. Every class is a multiple of
//! 512 B, so every slot is 512-byte aligned.
//!
//! A slab is `pages` contiguous physical pages carved into equal slots. The slab of each class
//! spans the fewest pages (1 to 4) that keep its tail (the bytes no slot fits in) under 1/16 of
//! the slab, so large classes do not lose a third of a page to the tail.

/// Largest request served from a size class; larger ones go to page ranges.
pub const MAX_SMALL: u64 = 1 << 20;

/// Smallest unit of every size and alignment handed out.
pub const MIN_BLOCK: u64 = 512;

const CLASSES_PER_DOUBLING: u64 = 8;
const MAX_SLAB_PAGES: u64 = 4;

/// One size class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeClass {
    /// Slot size in bytes (a multiple of 512).
    pub size: u64,
    /// Pages per slab.
    pub pages: u64,
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

/// The fewest pages (≤ 4) whose tail waste is under 1/16, else the best of 1..=4.
fn geometry(size: u64, page_size: u64) -> SizeClass {
    let waste = |pages: u64| (pages * page_size) % size;
    let pages = (1..=MAX_SLAB_PAGES)
        .find(|&p| p * page_size >= size && waste(p) * 16 < p * page_size)
        .unwrap_or_else(|| {
            (1..=MAX_SLAB_PAGES)
                .filter(|&p| p * page_size >= size)
                .min_by(|&a, &b| (waste(a) * b).cmp(&(waste(b) * a)))
                .expect("a 1 MiB class always fits in 4 pages")
        });
    SizeClass {
        size,
        pages,
        slots: ((pages * page_size) / size) as u32,
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
            let slab = c.pages * PAGE;
            assert!(
                (slab % c.size) * 8 <= slab,
                "class {} tail waste over 1/8",
                c.size
            );
            assert!(c.slots >= 2);
        }
    }
}
