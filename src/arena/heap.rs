//! A best-fit, coalescing allocator of virtual address ranges.
//!
//! It knows nothing of physical memory: it hands out `[addr, addr + len)` inside the regions it
//! was given and merges neighbours on free. Each stream owns two heaps (slab spans, page-granular;
//! large blocks, 512-byte granular), so a free range is reusable at once only by its own stream.
//!
//! Invariants: free blocks never overlap; two free blocks that touch in the same region are always
//! merged; `by_size`, `by_addr` and `by_end` hold the same blocks. Every operation is O(log n)
//! (one ordered set, by size; the address maps are hash maps).

use std::collections::hash_map::Entry;

use super::IntMap;
use super::size_index::SizeIndex;

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
    by_size: SizeIndex,
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
        let (_, addr, _) = self.by_size.first_at_least(len)?;
        Some((addr, self.take(addr, len)))
    }

    /// Calls `f` on the free blocks of at least `len` bytes, best fit first, `(addr, region)`,
    /// until it returns false. For a caller that weighs more than size (the arena prefers blocks
    /// whose pages are mapped).
    pub fn each_fit(&self, len: u64, mut f: impl FnMut(u64, u32) -> bool) {
        self.by_size
            .each_at_least(len, |(_, addr, region)| f(addr, region));
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
    /// A block merged into the one before it keeps that block's start entry (its length
    /// rewritten); one merged with the block after it takes over that block's end entry.
    pub fn free(&mut self, addr: u64, len: u64, region: u32) {
        let mut start = addr;
        let mut stop = addr + len;
        // The block ending at `addr`, whose start becomes ours.
        let before = match self.by_end.get(&addr) {
            Some(&prev) => match self.by_addr.get(&prev) {
                Some(b) if b.region == region => Some((prev, b.len)),
                _ => None,
            },
            None => None,
        };
        if let Some((prev, prev_len)) = before {
            self.by_end.remove(&addr);
            self.by_size.remove(&(prev_len, prev, region));
            start = prev;
        }
        // The block starting at our end, whose end becomes ours.
        let after = match self.by_addr.entry(stop) {
            Entry::Occupied(e) if e.get().region == region => Some(e.remove().len),
            _ => None,
        };
        if let Some(next_len) = after {
            self.by_size.remove(&(next_len, stop, region));
            stop += next_len;
            *self
                .by_end
                .get_mut(&stop)
                .expect("a free block has an end entry") = start;
        } else {
            self.by_end.insert(stop, start);
        }
        let merged = FreeBlock {
            len: stop - start,
            region,
        };
        if before.is_some() {
            *self
                .by_addr
                .get_mut(&start)
                .expect("the block before is free") = merged;
        } else {
            self.by_addr.insert(start, merged);
        }
        self.by_size.insert((merged.len, start, region));
    }

    /// Number of free blocks.
    #[cfg(test)]
    pub fn free_blocks(&self) -> usize {
        self.by_addr.len()
    }

    /// The module's invariants: the three indexes hold the same blocks, and no two free blocks
    /// of one region touch (they would have been merged).
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        if self.by_end.len() != self.by_addr.len() || self.by_size.len() != self.by_addr.len() {
            return Err(format!(
                "{} by address, {} by end, {} by size",
                self.by_addr.len(),
                self.by_end.len(),
                self.by_size.len()
            ));
        }
        for (&addr, b) in &self.by_addr {
            if self.by_end.get(&(addr + b.len)) != Some(&addr) {
                return Err(format!("block {addr:#x}+{:#x} has no end entry", b.len));
            }
            if !self.by_size.contains(&(b.len, addr, b.region)) {
                return Err(format!("block {addr:#x}+{:#x} has no size entry", b.len));
            }
            if let Some(next) = self.by_addr.get(&(addr + b.len))
                && next.region == b.region
            {
                return Err(format!("blocks at {addr:#x} and after it were not merged"));
            }
        }
        Ok(())
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
    use proptest::prelude::*;

    proptest! {
        /// Random allocations and frees over two adjacent regions, against a model of which
        /// units are taken: the heap hands out only free units, best fit first, and keeps its
        /// invariants after every operation.
        #[test]
        fn it_keeps_its_invariants_and_fits_best(
            ops in proptest::collection::vec((any::<bool>(), 1u64..40, any::<prop::sample::Index>()), 1..300),
        ) {
            let mut h = Heap::new();
            h.add_region(0, 64, 0);
            h.add_region(64, 64, 1);
            let mut taken = [false; 128];
            let mut live: Vec<(u64, u64, u32)> = Vec::new();
            for (alloc, len, pick) in ops {
                if alloc || live.is_empty() {
                    // The best fit the model sees: the smallest free run (within one region)
                    // of at least `len`, lowest address among equals.
                    let mut best: Option<(u64, u64)> = None;
                    let mut i = 0u64;
                    while i < 128 {
                        if taken[i as usize] {
                            i += 1;
                            continue;
                        }
                        let mut j = i;
                        while j < 128 && !taken[j as usize] && j / 64 == i / 64 {
                            j += 1;
                        }
                        let run = j - i;
                        if run >= len && best.is_none_or(|(l, _)| run < l) {
                            best = Some((run, i));
                        }
                        i = j;
                    }
                    let got = h.alloc(len);
                    prop_assert_eq!(got.map(|g| g.0), best.map(|b| b.1));
                    if let Some((addr, region)) = got {
                        prop_assert_eq!(u64::from(region), addr / 64);
                        for u in addr..addr + len {
                            prop_assert!(!taken[u as usize], "unit {} handed out twice", u);
                            taken[u as usize] = true;
                        }
                        live.push((addr, len, region));
                    }
                } else {
                    let (addr, len, region) = live.swap_remove(pick.index(live.len()));
                    h.free(addr, len, region);
                    for u in addr..addr + len {
                        taken[u as usize] = false;
                    }
                }
                if let Err(e) = h.check() {
                    return Err(TestCaseError::fail(e));
                }
            }
            for (addr, len, region) in live {
                h.free(addr, len, region);
            }
            prop_assert_eq!(h.free_blocks(), 2);
            prop_assert!(h.remove_region(0, 64) && h.remove_region(64, 64));
        }
    }

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
