//! The free blocks of a [`Heap`](super::heap::Heap) ordered by `(len, addr, node)`: exact best
//! fit without an ordered search over all of them.
//!
//! Blocks fall into bins by length, 32 per power of two (as TLSF maps sizes to its second-level
//! lists), and a two-level bitmap says which bins hold any. A bin keeps its few blocks sorted in
//! a vector; one that holds many (a hostile or a very regular workload: many free blocks of one
//! length) becomes an ordered set, so no operation costs more than O(log n) however the blocks
//! fall. The best fit for `len` is the first block at or above `(len, 0, 0)` in `len`'s own bin,
//! or else the first of the next bin that holds any: the order of the whole set is the bins'
//! order, each bin's own, which is what an ordered set of every block would give, lowest address
//! first among equal lengths.

use std::collections::BTreeSet;

/// `(len, addr, node)`, compared in that order (a free block's address is unique: the node only
/// rides along).
pub type Key = (u64, u64, u32);

/// Bins per power of two, as a shift.
const SUB_BITS: u32 = 5;
const SUBS: usize = 1 << SUB_BITS;
/// Lengths below `SUBS` get a bin each; every power of two from `SUBS` up gets `SUBS`.
const BINS: usize = (64 - SUB_BITS as usize + 1) * SUBS;
const WORDS: usize = BINS.div_ceil(64);
/// A bin holding more blocks than this becomes an ordered set; it turns back into a vector once
/// it holds a quarter of that (the gap keeps a bin near the limit from converting on every op).
const SPILL: usize = 128;

#[derive(Debug)]
enum Bin {
    Few(Vec<Key>),
    Many(BTreeSet<Key>),
}

impl Default for Bin {
    fn default() -> Bin {
        Bin::Few(Vec::new())
    }
}

impl Bin {
    fn is_empty(&self) -> bool {
        match self {
            Bin::Few(v) => v.is_empty(),
            Bin::Many(s) => s.is_empty(),
        }
    }

    /// Calls `f` on this bin's keys from `from` on, in order, while it returns true; returns
    /// false if `f` did.
    fn each_from(&self, from: Key, f: &mut impl FnMut(Key) -> bool) -> bool {
        match self {
            Bin::Few(v) => v[v.partition_point(|k| *k < from)..].iter().all(|&k| f(k)),
            Bin::Many(s) => s.range(from..).all(|&k| f(k)),
        }
    }

    fn insert(&mut self, key: Key) {
        match self {
            Bin::Few(v) => {
                let at = v.partition_point(|k| *k < key);
                debug_assert!(v.get(at) != Some(&key), "key inserted twice");
                v.insert(at, key);
                if v.len() > SPILL {
                    *self = Bin::Many(v.drain(..).collect());
                }
            }
            Bin::Many(s) => {
                s.insert(key);
            }
        }
    }

    fn remove(&mut self, key: &Key) -> bool {
        match self {
            Bin::Few(v) => match v.binary_search(key) {
                Ok(at) => {
                    v.remove(at);
                    true
                }
                Err(_) => false,
            },
            Bin::Many(s) => {
                let found = s.remove(key);
                if s.len() <= SPILL / 4 {
                    *self = Bin::Few(std::mem::take(s).into_iter().collect());
                }
                found
            }
        }
    }

    #[cfg(test)]
    fn contains(&self, key: &Key) -> bool {
        match self {
            Bin::Few(v) => v.binary_search(key).is_ok(),
            Bin::Many(s) => s.contains(key),
        }
    }
}

/// An ordered set of [`Key`]s that answers "the first `k` keys at or above `(len, 0, 0)`".
#[derive(Debug, Default)]
pub struct SizeIndex {
    /// Grown on demand up to the highest bin used (a heap of small blocks never allocates the
    /// bins of large lengths).
    bins: Vec<Bin>,
    /// Bit `b` of word `b / 64`: bin `b` holds a key.
    words: [u64; WORDS],
    /// Bit `w`: word `w` is not zero.
    summary: u64,
    len: usize,
}

/// The bin of a length: monotone in `len`, so every key of a bin orders before every key of a
/// higher one.
fn bin_of(len: u64) -> usize {
    if len < SUBS as u64 {
        return len as usize;
    }
    let top = 63 - len.leading_zeros(); // at least SUB_BITS
    let sub = (len >> (top - SUB_BITS)) as usize & (SUBS - 1);
    (top - SUB_BITS + 1) as usize * SUBS + sub
}

impl SizeIndex {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn insert(&mut self, key: Key) {
        let b = bin_of(key.0);
        if b >= self.bins.len() {
            self.bins.resize_with(b + 1, Bin::default);
        }
        self.bins[b].insert(key);
        self.words[b / 64] |= 1 << (b % 64);
        self.summary |= 1 << (b / 64);
        self.len += 1;
    }

    /// Removes `key`; false if it was not there.
    pub fn remove(&mut self, key: &Key) -> bool {
        let b = bin_of(key.0);
        let Some(bin) = self.bins.get_mut(b) else {
            return false;
        };
        if !bin.remove(key) {
            return false;
        }
        if bin.is_empty() {
            self.words[b / 64] &= !(1 << (b % 64));
            if self.words[b / 64] == 0 {
                self.summary &= !(1 << (b / 64));
            }
        }
        self.len -= 1;
        true
    }

    #[cfg(test)]
    pub fn contains(&self, key: &Key) -> bool {
        self.bins
            .get(bin_of(key.0))
            .is_some_and(|b| b.contains(key))
    }

    /// The first key at or above `(len, 0, 0)`: the smallest length of at least `len`, lowest
    /// address among equals.
    pub fn first_at_least(&self, len: u64) -> Option<Key> {
        let mut first = None;
        self.each_at_least(len, |k| {
            first = Some(k);
            false
        });
        first
    }

    /// Calls `f` on the keys at or above `(len, 0, 0)`, in order, until it returns false.
    pub fn each_at_least(&self, len: u64, mut f: impl FnMut(Key) -> bool) {
        let from = (len, 0, 0);
        let mut b = bin_of(len);
        if self.has(b) && !self.bins[b].each_from(from, &mut f) {
            return;
        }
        while let Some(next) = self.next_bin(b + 1) {
            if !self.bins[next].each_from(from, &mut f) {
                return;
            }
            b = next;
        }
    }

    fn has(&self, b: usize) -> bool {
        self.words[b / 64] & (1 << (b % 64)) != 0
    }

    /// The lowest bin at or above `b` that holds a key.
    fn next_bin(&self, b: usize) -> Option<usize> {
        if b >= BINS {
            return None;
        }
        let w = b / 64;
        let here = self.words[w] & (!0u64 << (b % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let above = if w + 1 >= 64 {
            0
        } else {
            self.summary & (!0u64 << (w + 1))
        };
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bins_cover_every_length_in_order() {
        for shift in 0..64u32 {
            let p = 1u64 << shift;
            for l in [p - 1, p, p + 1, p | (p >> 1), p | (p - 1)] {
                assert!(bin_of(l) <= bin_of(l.saturating_add(1)), "bin of {l}");
            }
        }
        assert_eq!(bin_of(u64::MAX), BINS - 1);
        for l in 0..(1 << 14) {
            assert!(
                bin_of(l) <= bin_of(l + 1),
                "bin of {} below bin of {l}",
                l + 1
            );
        }
    }

    #[test]
    fn a_crowded_bin_spills_to_a_set_and_comes_back() {
        let mut idx = SizeIndex::default();
        let n = SPILL as u64 * 2;
        for addr in (0..n).rev() {
            idx.insert((4096, addr, 0));
        }
        assert!(matches!(idx.bins[bin_of(4096)], Bin::Many(_)));
        assert_eq!(idx.first_at_least(1), Some((4096, 0, 0)));
        for addr in 0..n - 8 {
            assert!(idx.remove(&(4096, addr, 0)));
        }
        assert!(matches!(idx.bins[bin_of(4096)], Bin::Few(_)));
        let mut got = Vec::new();
        idx.each_at_least(4000, |k| {
            got.push(k);
            true
        });
        assert_eq!(got.len(), 8);
        assert_eq!(got[0], (4096, n - 8, 0));
        for addr in n - 8..n {
            assert!(idx.remove(&(4096, addr, 0)));
        }
        assert_eq!((idx.len(), idx.summary), (0, 0));
        assert_eq!(idx.first_at_least(0), None);
    }

    proptest! {
        #[test]
        fn bins_are_monotone(a in any::<u64>(), b in any::<u64>()) {
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert!(bin_of(lo) <= bin_of(hi));
            prop_assert!(bin_of(hi) < BINS);
        }

        /// Against an ordered set of the same keys: the same first keys for any length, through
        /// inserts and removes that push bins past the spill limit and back.
        #[test]
        fn it_orders_as_an_ordered_set_would(
            ops in proptest::collection::vec((0u8..5, any::<u64>(), 0u64..400, any::<prop::sample::Index>()), 600..1500),
            shift in 0u32..40,
            lengths in prop_oneof![Just(1u64), Just(150u64)],
        ) {
            let mut idx = SizeIndex::default();
            let mut model: BTreeSet<Key> = BTreeSet::new();
            let half = ops.len() / 2;
            for (i, (op, len, addr, pick)) in ops.into_iter().enumerate() {
                // Inserts outweigh removes in the first half, removes in the second: bins
                // spill to sets and come back.
                let op = match (i < half, op) {
                    (_, 4) => 4,
                    (true, 3) | (false, 1..=3) => 2,
                    _ => 0,
                };
                // With one length, its bin fills past `SPILL`; with 150, queries cross bins.
                let len = (len % lengths + 1) << shift;
                match op {
                    0 => {
                        let key = (len, addr, (addr % 3) as u32);
                        if model.insert(key) {
                            idx.insert(key);
                        }
                    }
                    2 if !model.is_empty() => {
                        let key = *model.iter().nth(pick.index(model.len())).unwrap();
                        model.remove(&key);
                        prop_assert!(idx.remove(&key));
                        prop_assert!(!idx.remove(&key));
                    }
                    _ => {
                        let want: Vec<Key> = model.range((len, 0, 0)..).take(8).copied().collect();
                        let mut got = Vec::new();
                        idx.each_at_least(len, |k| {
                            got.push(k);
                            got.len() < 8
                        });
                        prop_assert_eq!(got, want.clone());
                        prop_assert_eq!(idx.first_at_least(len), want.first().copied());
                    }
                }
                prop_assert_eq!(idx.len(), model.len());
            }
            for k in &model {
                prop_assert!(idx.contains(k));
            }
        }
    }
}
