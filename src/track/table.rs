//! One shard of the live table: pointer → [`Entry`], open addressing with linear probing.
//!
//! Why not `std::collections::HashMap`: the table is touched twice per malloc+free pair, and its
//! cost is where its bytes sit, not the hashing. Here the keys live in an array of their own
//! (eight bytes a slot, so a probe walks one cache line) and the entries in a parallel array,
//! read only once the key matched. A remove shifts the rest of its cluster back (backward-shift
//! deletion), so there are no tombstones to pile up under churn and no rebuild to clear them:
//! a table rebuilds only when it doubles or halves.
//!
//! Keys are pointers an allocator handed out: never 0, which marks an empty slot.
//! [`Table::insert`] ignores key 0 and lookups of it find nothing.
//!
//! Growth: the table doubles when live keys pass half its slots and halves when they fall under
//! an eighth (so a peak's memory comes back). Each rebuild is linear in the slots and happens at
//! most once per that many inserts or removes: amortised constant.

use super::Entry;
use crate::device::DevPtr;

const EMPTY: DevPtr = 0;
/// Slots of a new (or fully shrunk) table.
const MIN_SLOTS: usize = 16;

/// A pointer → entry map (one shard's).
pub(super) struct Table {
    keys: Box<[DevPtr]>,
    entries: Box<[Entry]>,
    /// Live keys.
    live: usize,
}

impl Default for Table {
    fn default() -> Self {
        Table::with_slots(MIN_SLOTS)
    }
}

const BLANK: Entry = Entry {
    size: 0,
    requested: 0,
    stream: 0,
    seq: 0,
    time_us: 0,
    step: 0,
    thread: 0,
    tag: 0,
    site: 0,
    recorded: false,
};

/// The first slot of `key`'s probe path in a table of `mask + 1` slots. Pointers are at least
/// 512-byte aligned, so the low bits are dropped first; the multiply spreads the rest and the
/// top half of the product (the bits the shard choice does not use) picks the slot.
#[inline]
fn home(key: DevPtr, mask: usize) -> usize {
    let h = (key >> 9).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((h >> 32) as usize ^ (h >> 11) as usize) & mask
}

impl Table {
    fn with_slots(slots: usize) -> Self {
        debug_assert!(slots.is_power_of_two());
        Table {
            keys: vec![EMPTY; slots].into_boxed_slice(),
            entries: vec![BLANK; slots].into_boxed_slice(),
            live: 0,
        }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.keys.len() - 1
    }

    /// Live keys.
    pub(super) fn len(&self) -> usize {
        self.live
    }

    /// The slot holding `key`, if any.
    #[inline]
    fn find(&self, key: DevPtr) -> Option<usize> {
        if key == EMPTY {
            return None;
        }
        let mask = self.mask();
        let mut i = home(key, mask);
        // At most half the slots are live (the table doubles first), so an empty slot ends
        // every probe path.
        loop {
            match self.keys[i] {
                k if k == key => return Some(i),
                EMPTY => return None,
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Put `e` at `key`, replacing (and returning) what was there.
    #[inline]
    pub(super) fn insert(&mut self, key: DevPtr, e: Entry) -> Option<Entry> {
        if key == EMPTY {
            return None;
        }
        let mask = self.mask();
        let mut i = home(key, mask);
        loop {
            match self.keys[i] {
                k if k == key => return Some(std::mem::replace(&mut self.entries[i], e)),
                EMPTY => break,
                _ => i = (i + 1) & mask,
            }
        }
        self.keys[i] = key;
        self.entries[i] = e;
        self.live += 1;
        if self.live * 2 > self.keys.len() {
            self.rebuild(self.keys.len() * 2);
        }
        None
    }

    /// Take `key` out.
    #[inline]
    pub(super) fn remove(&mut self, key: DevPtr) -> Option<Entry> {
        let mut hole = self.find(key)?;
        let e = self.entries[hole];
        let mask = self.mask();
        // Backward shift: walk the rest of the cluster; a key whose probe path runs through the
        // hole (its home is not in the cyclic range after the hole up to where it sits) moves
        // into it, and its old slot becomes the hole.
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let k = self.keys[j];
            if k == EMPTY {
                break;
            }
            let h = home(k, mask);
            if (j.wrapping_sub(h) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.keys[hole] = k;
                self.entries[hole] = self.entries[j];
                hole = j;
            }
        }
        self.keys[hole] = EMPTY;
        self.live -= 1;
        if self.keys.len() > MIN_SLOTS && self.live * 8 < self.keys.len() {
            self.rebuild(self.keys.len() / 2);
        }
        Some(e)
    }

    #[inline]
    pub(super) fn get(&self, key: DevPtr) -> Option<&Entry> {
        self.find(key).map(|i| &self.entries[i])
    }

    #[inline]
    pub(super) fn get_mut(&mut self, key: DevPtr) -> Option<&mut Entry> {
        self.find(key).map(|i| &mut self.entries[i])
    }

    /// Every live key and its entry, in slot order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (DevPtr, &Entry)> {
        self.keys
            .iter()
            .zip(self.entries.iter())
            .filter(|(k, _)| **k != EMPTY)
            .map(|(k, e)| (*k, e))
    }

    /// Move every live key into a table of `slots` slots.
    #[cold]
    fn rebuild(&mut self, slots: usize) {
        let old = std::mem::replace(self, Table::with_slots(slots));
        let mask = self.mask();
        for (k, e) in old.keys.iter().zip(old.entries.iter()) {
            if *k == EMPTY {
                continue;
            }
            let mut i = home(*k, mask);
            while self.keys[i] != EMPTY {
                i = (i + 1) & mask;
            }
            self.keys[i] = *k;
            self.entries[i] = *e;
        }
        self.live = old.live;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn entry(seq: u64) -> Entry {
        Entry { seq, ..BLANK }
    }

    #[test]
    fn zero_is_never_a_key() {
        let mut t = Table::default();
        assert_eq!(t.insert(0, entry(1)), None);
        assert_eq!(t.len(), 0);
        t.insert(512, entry(3));
        assert!(t.remove(512).is_some());
        // The slot 512 left is empty again: looking up 0 must not find it.
        assert_eq!(t.remove(0), None);
        assert_eq!(t.get(0), None);
    }

    #[test]
    fn it_grows_and_gives_memory_back() {
        let mut t = Table::default();
        for i in 1..=100_000u64 {
            t.insert(i << 9, entry(i));
        }
        assert_eq!(t.len(), 100_000);
        assert!(t.keys.len() >= 200_000);
        for i in 1..=100_000u64 {
            assert_eq!(t.remove(i << 9).map(|e| e.seq), Some(i));
        }
        assert_eq!(t.len(), 0);
        assert!(t.keys.len() <= 4 * MIN_SLOTS, "{} slots left", t.keys.len());
    }

    #[test]
    fn churn_at_a_steady_size_leaves_no_debris() {
        // Every key ever removed must be gone from its probe path, and a steady live count must
        // keep a steady size: a removal leaves nothing behind that an insert has to step over.
        let mut t = Table::default();
        for i in 0..200_000u64 {
            t.insert((i + 1) << 9, entry(i));
            if i >= 7 {
                assert_eq!(t.remove((i - 6) << 9).map(|e| e.seq), Some(i - 7));
                assert_eq!(t.get((i - 6) << 9), None);
            }
        }
        assert_eq!(t.len(), 7);
        assert_eq!(t.keys.len(), MIN_SLOTS);
        assert_eq!(t.keys.iter().filter(|&&k| k != EMPTY).count(), 7);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u64),
        Remove(u64),
        Mark(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct keys, so inserts replace, removes hit and miss, and tombstones recur.
        let key = (0u64..64).prop_map(|k| k << 9);
        prop_oneof![
            (key.clone(), any::<u64>()).prop_map(|(k, s)| Op::Insert(k, s)),
            key.clone().prop_map(Op::Remove),
            key.prop_map(Op::Mark),
        ]
    }

    proptest! {
        #[test]
        fn it_behaves_as_a_map(ops in proptest::collection::vec(op(), 1..2000)) {
            let mut t = Table::default();
            let mut m: HashMap<u64, Entry> = HashMap::new();
            for o in ops {
                match o {
                    Op::Insert(k, s) => {
                        let want = if k != 0 { m.insert(k, entry(s)) } else { None };
                        prop_assert_eq!(t.insert(k, entry(s)), want);
                    }
                    Op::Remove(k) => prop_assert_eq!(t.remove(k), m.remove(&k)),
                    Op::Mark(k) => {
                        if let Some(e) = t.get_mut(k) {
                            e.recorded = true;
                        }
                        if let Some(e) = m.get_mut(&k) {
                            e.recorded = true;
                        }
                    }
                }
                prop_assert_eq!(t.len(), m.len());
                prop_assert!(t.len() * 2 <= t.keys.len());
                for (k, _) in m.iter() {
                    prop_assert!(t.get(*k).is_some());
                }
            }
            let mut got: Vec<(u64, Entry)> = t.iter().map(|(k, e)| (k, *e)).collect();
            got.sort_by_key(|(k, _)| *k);
            let mut want: Vec<(u64, Entry)> = m.into_iter().collect();
            want.sort_by_key(|(k, _)| *k);
            prop_assert_eq!(got, want);
        }
    }
}
