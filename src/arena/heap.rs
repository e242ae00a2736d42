//! A best-fit, coalescing allocator of virtual address ranges.
//!
//! It knows nothing of physical memory: it hands out `[addr, addr + len)` inside the regions it
//! was given and merges neighbours on free. Each stream owns two heaps (slab spans, page-granular;
//! large blocks, 512-byte granular), so a free range is reusable at once only by its own stream.
//!
//! Invariants: free blocks never overlap; two free blocks that touch in the same region are always
//! merged; `by_size`, `by_addr` and `by_end` hold the same blocks. Every operation is O(log n)
//! (one ordered set, by size; the address maps are hash maps).

use std::collections::BTreeSet;

use super::IntMap;

/// A free range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FreeBlock {
    len: u64,
    region: u32,
}

#[derive(Debug, Default)]
pub struct Heap {
    /// Free blocks by start address, and the start of each by its end: a free finds both
    /// neighbours it may merge with in two hash lookups (boundary tags), no ordered search.
    by_addr: IntMap<u64, FreeBlock>,
    by_end: IntMap<u64, u64>,
    /// `(len, addr, region)`: the first entry at or above a size is the best fit, lowest address
    /// first (the region rides along so that a candidate needs no second lookup).
    by_size: BTreeSet<(u64, u64, u32)>,
}

impl Heap {
    pub fn new() -> Heap {
        Heap::default()
    }

    /// Add a whole region as free space.
    pub fn add_region(&mut self, base: u64, len: u64, region: u32) {
        self.insert(base, FreeBlock { len, region });
    }

    /// Remove a region that is entirely free again (all of it one block). Returns false, and
    /// changes nothing, if part of it is still allocated.
    pub fn remove_region(&mut self, base: u64, len: u64) -> bool {
        match self.by_addr.get(&base) {
            Some(b) if b.len == len => {
                self.remove(base);
                true
            }
            _ => false,
        }
    }

    /// Best fit: the smallest free block of at least `len` bytes, lowest address among equals.
    /// Returns the address and region of the `len` bytes taken from its start.
    pub fn alloc(&mut self, len: u64) -> Option<(u64, u32)> {
        let &(_, addr, _) = self.by_size.range((len, 0, 0)..).next()?;
        Some((addr, self.take(addr, len)))
    }

    /// Up to `k` free blocks of at least `len` bytes, best fit first: `(addr, region)`. For a
    /// caller that weighs more than size (the arena prefers blocks whose pages are mapped).
    pub fn candidates(&self, len: u64, k: usize) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.by_size
            .range((len, 0, 0)..)
            .take(k)
            .map(|&(_, addr, region)| (addr, region))
    }

    /// Take `len` bytes from the start of the free block at `addr` (one `candidates` returned).
    /// Returns its region.
    pub fn take(&mut self, addr: u64, len: u64) -> u32 {
        let block = self.by_addr.remove(&addr).expect("heap block exists");
        assert!(
            block.len >= len,
            "taking {len} bytes from a free block of {}",
            block.len
        );
        self.by_size.remove(&(block.len, addr, block.region));
        let end = addr + block.len;
        if block.len > len {
            // The rest keeps the block's end: its `by_end` entry is updated in place.
            let rest = FreeBlock {
                len: block.len - len,
                region: block.region,
            };
            self.by_addr.insert(addr + len, rest);
            self.by_end.insert(end, addr + len);
            self.by_size.insert((rest.len, addr + len, rest.region));
        } else {
            self.by_end.remove(&end);
        }
        block.region
    }

    /// Give back `[addr, addr + len)` of `region`, merging with free neighbours in that region.
    pub fn free(&mut self, addr: u64, len: u64, region: u32) {
        let end = addr + len;
        let mut start = addr;
        if let Some(&prev) = self.by_end.get(&addr)
            && self.by_addr[&prev].region == region
        {
            self.remove(prev);
            start = prev;
        }
        let mut stop = end;
        if let Some(&b) = self.by_addr.get(&end)
            && b.region == region
        {
            self.remove(end);
            stop = end + b.len;
        }
        self.insert(
            start,
            FreeBlock {
                len: stop - start,
                region,
            },
        );
    }

    /// Number of free blocks.
    #[cfg(test)]
    pub fn free_blocks(&self) -> usize {
        self.by_addr.len()
    }

    fn insert(&mut self, addr: u64, b: FreeBlock) {
        self.by_addr.insert(addr, b);
        self.by_end.insert(addr + b.len, addr);
        self.by_size.insert((b.len, addr, b.region));
    }

    fn remove(&mut self, addr: u64) -> FreeBlock {
        let b = self.by_addr.remove(&addr).expect("heap block exists");
        self.by_end.remove(&(addr + b.len));
        self.by_size.remove(&(b.len, addr, b.region));
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_and_coalescing() {
        let mut h = Heap::new();
        h.add_region(0, 100, 0);
        let a = h.alloc(10).unwrap().0;
        let b = h.alloc(20).unwrap().0;
        let c = h.alloc(30).unwrap().0;
        assert_eq!((a, b, c), (0, 10, 30));
        h.free(b, 20, 0);
        // A 15-byte request takes the 20-byte hole, not the 40-byte tail.
        assert_eq!(h.alloc(15).unwrap().0, 10);
        h.free(10, 15, 0);
        h.free(a, 10, 0);
        h.free(c, 30, 0);
        assert_eq!(h.free_blocks(), 1);
        assert!(h.remove_region(0, 100));
    }

    #[test]
    fn regions_never_merge() {
        let mut h = Heap::new();
        h.add_region(0, 50, 0);
        h.add_region(50, 50, 1);
        assert_eq!(h.free_blocks(), 2);
        assert!(h.alloc(60).is_none());
        let (a, r) = h.alloc(50).unwrap();
        h.free(a, 50, r);
        assert_eq!(h.free_blocks(), 2);
    }
}
