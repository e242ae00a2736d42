//! A best-fit, coalescing allocator of virtual address ranges.
//!
//! It knows nothing of physical memory: it hands out `[addr, addr + len)` inside the regions it
//! was given and merges neighbours on free. Each stream owns two heaps (slab spans, page-granular;
//! large blocks, 512-byte granular), so a free range is reusable at once only by its own stream.
//!
//! Every range, free or handed out, is a node in its region's list, in address order (as
//! PyTorch's blocks link to their neighbours in a segment). A caller keeps the node of what it
//! was handed and frees by node, so a free finds the neighbours it merges with by following two
//! links: no lookup by address. Free nodes are also in `by_size`, which gives the best fit.
//!
//! Invariants: a region's nodes tile it in address order; no two free nodes of a region are
//! neighbours (they would have been merged); `by_size` holds exactly the free nodes. Every
//! operation is O(1) apart from `by_size` (O(log n) at worst: [`SizeIndex`]).

use super::int_map::IntMap;
use super::size_index::SizeIndex;

/// No node (the end of a region's list).
const NONE: u32 = u32::MAX;

/// A range of a region, free or handed out.
#[derive(Clone, Copy, Debug)]
struct Node {
    addr: u64,
    len: u64,
    region: u32,
    /// The nodes before and after this one in the region (`NONE` at either end).
    prev: u32,
    next: u32,
    free: bool,
}

/// A free range a request fits in: where it starts, its region, and its node (for `take`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fit {
    pub addr: u64,
    pub region: u32,
    pub node: u32,
}

#[derive(Debug, Default)]
pub struct Heap {
    nodes: Vec<Node>,
    /// Slots of `nodes` merged away, for reuse.
    spare: Vec<u32>,
    /// The first node of each region, by the region's base (a region's first node is never
    /// merged into another: it has nothing before it).
    firsts: IntMap<u64, u32>,
    /// `(len, addr, node)` of every free node: the first entry at or above a size is the best
    /// fit, lowest address first.
    by_size: SizeIndex,
}

impl Heap {
    pub fn new() -> Heap {
        Heap::default()
    }

    /// Add a whole region as free space.
    pub fn add_region(&mut self, base: u64, len: u64, region: u32) {
        let n = self.new_node(Node {
            addr: base,
            len,
            region,
            prev: NONE,
            next: NONE,
            free: true,
        });
        self.firsts.insert(base, n);
        self.by_size.insert((len, base, n));
    }

    /// Remove a region that is entirely free again (all of it one node). Returns false, and
    /// changes nothing, if part of it is still handed out.
    pub fn remove_region(&mut self, base: u64, len: u64) -> bool {
        let Some(&n) = self.firsts.get(&base) else {
            return false;
        };
        let node = self.nodes[n as usize];
        if !node.free || node.len != len {
            return false;
        }
        debug_assert!(node.next == NONE);
        self.by_size.remove(&(len, base, n));
        self.firsts.remove(&base);
        self.spare.push(n);
        true
    }

    /// Best fit: the smallest free range of at least `len` bytes, lowest address among equals.
    /// Takes `len` bytes from its start and returns them, their node the one to free them by.
    pub fn alloc(&mut self, len: u64) -> Option<Fit> {
        let (_, addr, node) = self.by_size.first_at_least(len)?;
        let region = self.take(node, len);
        Some(Fit { addr, region, node })
    }

    /// Calls `f` on the free ranges of at least `len` bytes (where, and how long), best fit
    /// first, until it returns false. For a caller that weighs more than size (the arena prefers
    /// ranges whose pages are mapped); it then `take`s (or `take_end`s) the one it chose.
    pub fn each_fit(&self, len: u64, mut f: impl FnMut(Fit, u64) -> bool) {
        self.by_size.each_at_least(len, |(free, addr, node)| {
            let region = self.nodes[node as usize].region;
            f(Fit { addr, region, node }, free)
        });
    }

    /// Take `len` bytes from the end of free node `n` (one `each_fit` offered): what is left of
    /// `n` stays free before a new node of those bytes, handed out. Returns where it is.
    pub fn take_end(&mut self, n: u32, len: u64) -> Fit {
        let node = self.takeable(n, len);
        let head = node.len - len;
        if head == 0 {
            self.take(n, len);
            return Fit {
                addr: node.addr,
                region: node.region,
                node: n,
            };
        }
        self.by_size.remove(&(node.len, node.addr, n));
        let taken = self.split(n, node, head, false);
        self.by_size.insert((head, node.addr, n));
        Fit {
            addr: node.addr + head,
            region: node.region,
            node: taken,
        }
    }

    /// Take `len` bytes from the start of free node `n` (one `each_fit` offered): `n` becomes
    /// those bytes, handed out, and what is left of it a new free node after it. Returns the
    /// region.
    pub fn take(&mut self, n: u32, len: u64) -> u32 {
        let node = self.takeable(n, len);
        self.by_size.remove(&(node.len, node.addr, n));
        if node.len > len {
            let rest = self.split(n, node, len, true);
            self.by_size.insert((node.len - len, node.addr + len, rest));
        }
        self.nodes[n as usize].free = false;
        node.region
    }

    /// Take `[addr, addr + len)` from inside free node `n`: what is left before and after it
    /// stays free. Returns the node of the range taken.
    pub fn take_range(&mut self, n: u32, addr: u64, len: u64) -> u32 {
        let node = self.nodes[n as usize];
        assert!(
            node.free && addr >= node.addr && addr + len <= node.addr + node.len,
            "taking {len} bytes at {addr:#x} from a node at {:#x} of {} that is {}",
            node.addr,
            node.len,
            if node.free { "free" } else { "handed out" }
        );
        let head = addr - node.addr;
        if head == 0 {
            self.take(n, len);
            return n;
        }
        // Split off the range (and what follows it) as a free node, then take its start.
        self.by_size.remove(&(node.len, node.addr, n));
        let rest = self.split(n, node, head, true);
        self.by_size.insert((head, node.addr, n));
        self.by_size.insert((node.len - head, addr, rest));
        self.take(rest, len);
        rest
    }

    /// Node `n`, which must be free and hold at least `len` bytes.
    #[inline]
    fn takeable(&self, n: u32, len: u64) -> Node {
        let node = self.nodes[n as usize];
        assert!(
            node.free && node.len >= len,
            "taking {len} bytes from a node of {} that is {}",
            node.len,
            if node.free { "free" } else { "handed out" }
        );
        node
    }

    /// Split node `n` (as it is now: `node`) after its first `head` bytes: `n` keeps them, and a
    /// new node linked in after it (free or handed out as `rest_free` says) gets the rest.
    /// Returns the new node. The size index is the caller's to update.
    #[inline]
    fn split(&mut self, n: u32, node: Node, head: u64, rest_free: bool) -> u32 {
        let rest = self.new_node(Node {
            addr: node.addr + head,
            len: node.len - head,
            region: node.region,
            prev: n,
            next: node.next,
            free: rest_free,
        });
        if node.next != NONE {
            self.nodes[node.next as usize].prev = rest;
        }
        self.nodes[n as usize].next = rest;
        self.nodes[n as usize].len = head;
        rest
    }

    /// Give back node `n` (what `alloc` or `take` handed out), merging it with free neighbours.
    /// The node before it absorbs it if free, and it absorbs the node after it if free.
    pub fn free(&mut self, n: u32) {
        let node = self.nodes[n as usize];
        assert!(!node.free, "node {n} at {:#x} freed twice", node.addr);
        let mut keep = n;
        let mut merged = Node { free: true, ..node };
        if node.prev != NONE && self.nodes[node.prev as usize].free {
            let prev = self.nodes[node.prev as usize];
            self.by_size.remove(&(prev.len, prev.addr, node.prev));
            merged.addr = prev.addr;
            merged.len += prev.len;
            merged.prev = prev.prev;
            self.spare.push(n);
            keep = node.prev;
        }
        if node.next != NONE && self.nodes[node.next as usize].free {
            let next = self.nodes[node.next as usize];
            self.by_size.remove(&(next.len, next.addr, node.next));
            merged.len += next.len;
            merged.next = next.next;
            self.spare.push(node.next);
        }
        if merged.next != NONE {
            self.nodes[merged.next as usize].prev = keep;
        }
        self.nodes[keep as usize] = merged;
        self.by_size.insert((merged.len, merged.addr, keep));
    }

    /// Number of free ranges.
    #[cfg(test)]
    pub fn free_blocks(&self) -> usize {
        self.by_size.len()
    }

    /// The module's invariants: each region's nodes tile it in address order, linked both ways,
    /// no two free nodes are neighbours, and `by_size` holds exactly the free nodes.
    #[cfg(test)]
    pub fn check(&self) -> Result<(), String> {
        let mut free = 0;
        let mut seen = 0;
        for (&base, &first) in &self.firsts {
            let mut n = first;
            let mut prev = NONE;
            let mut at = base;
            while n != NONE {
                let node = self.nodes[n as usize];
                if node.prev != prev || node.addr != at {
                    return Err(format!(
                        "node {n} at {:#x}: expected {at:#x} after {prev}",
                        node.addr
                    ));
                }
                if node.free {
                    free += 1;
                    if !self.by_size.contains(&(node.len, node.addr, n)) {
                        return Err(format!("free node {n} at {at:#x} has no size entry"));
                    }
                    if prev != NONE && self.nodes[prev as usize].free {
                        return Err(format!("free nodes {prev} and {n} at {at:#x} not merged"));
                    }
                }
                at += node.len;
                prev = n;
                n = node.next;
                seen += 1;
            }
        }
        if free != self.by_size.len() {
            return Err(format!("{free} free nodes, {} by size", self.by_size.len()));
        }
        if seen + self.spare.len() != self.nodes.len() {
            return Err(format!(
                "{seen} linked nodes and {} spare of {}",
                self.spare.len(),
                self.nodes.len()
            ));
        }
        Ok(())
    }

    fn new_node(&mut self, node: Node) -> u32 {
        crate::slots::reuse_or_push(&mut self.nodes, &mut self.spare, node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Random allocations (from the start or, `take_end`, the end of the best fit) and frees
        /// over two adjacent regions, against a model of which units are taken: the heap hands
        /// out only free units, best fit first, and keeps its invariants after every operation.
        #[test]
        fn it_keeps_its_invariants_and_fits_best(
            ops in proptest::collection::vec((0u8..3, 1u64..40, any::<prop::sample::Index>()), 1..300),
        ) {
            let mut h = Heap::new();
            h.add_region(0, 64, 0);
            h.add_region(64, 64, 1);
            let mut taken = [false; 128];
            let mut live: Vec<(Fit, u64)> = Vec::new();
            for (op, len, pick) in ops {
                if op > 0 || live.is_empty() {
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
                    let got = if op == 2 {
                        let mut first = None;
                        h.each_fit(len, |fit, free| {
                            first = Some((fit, free));
                            false
                        });
                        first.map(|(fit, _)| h.take_end(fit.node, len))
                    } else {
                        h.alloc(len)
                    };
                    let want = best.map(|(run, at)| if op == 2 { at + run - len } else { at });
                    prop_assert_eq!(got.map(|g| g.addr), want);
                    if let Some(fit) = got {
                        prop_assert_eq!(u64::from(fit.region), fit.addr / 64);
                        for u in fit.addr..fit.addr + len {
                            prop_assert!(!taken[u as usize], "unit {} handed out twice", u);
                            taken[u as usize] = true;
                        }
                        live.push((fit, len));
                    }
                } else {
                    let (fit, len) = live.swap_remove(pick.index(live.len()));
                    h.free(fit.node);
                    for u in fit.addr..fit.addr + len {
                        taken[u as usize] = false;
                    }
                }
                if let Err(e) = h.check() {
                    return Err(TestCaseError::fail(e));
                }
            }
            for (fit, _) in live {
                h.free(fit.node);
            }
            prop_assert!(h.check().is_ok());
            prop_assert_eq!(h.free_blocks(), 2);
            prop_assert!(h.remove_region(0, 64) && h.remove_region(64, 64));
        }
    }

    #[test]
    #[should_panic(expected = "freed twice")]
    fn a_node_freed_twice_is_caught() {
        let mut h = Heap::new();
        h.add_region(0, 100, 0);
        let a = h.alloc(10).unwrap();
        let _b = h.alloc(10).unwrap();
        h.free(a.node);
        h.free(a.node);
    }

    #[test]
    fn best_fit_and_coalescing() {
        let mut h = Heap::new();
        h.add_region(0, 100, 0);
        let a = h.alloc(10).unwrap();
        let b = h.alloc(20).unwrap();
        let c = h.alloc(30).unwrap();
        assert_eq!((a.addr, b.addr, c.addr), (0, 10, 30));
        h.free(b.node);
        // A 15-byte request takes the 20-byte hole, not the 40-byte tail.
        let d = h.alloc(15).unwrap();
        assert_eq!(d.addr, 10);
        h.free(d.node);
        h.free(a.node);
        h.free(c.node);
        assert_eq!(h.free_blocks(), 1);
        h.check().unwrap();
        assert!(h.remove_region(0, 100));
    }

    #[test]
    fn regions_never_merge() {
        let mut h = Heap::new();
        h.add_region(0, 50, 0);
        h.add_region(50, 50, 1);
        assert_eq!(h.free_blocks(), 2);
        assert!(h.alloc(60).is_none());
        let a = h.alloc(50).unwrap();
        h.free(a.node);
        assert_eq!(h.free_blocks(), 2);
        h.check().unwrap();
        assert!(!h.remove_region(0, 40), "a region is removed only whole");
        assert!(h.remove_region(0, 50) && h.remove_region(50, 50));
        assert_eq!(h.free_blocks(), 0);
    }
}
