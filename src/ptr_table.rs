//! A pointer → value map: open addressing with linear probing. The tracker's live table (one
//! per shard) and the arena's live large blocks are each one of these.
//!
//! Why not `std::collections::HashMap`: the live tables are touched twice per malloc+free pair,
//! and what that costs follows how often a probe goes past its home slot (measured: a lower load
//! factor made tracked pairs cheaper; mispredicted probe-loop branches are the likely reason),
//! not the hashing. So the probed array holds only keys and value numbers (16 bytes a slot) and
//! stays at most 1/`GROW` full, where nearly every insert and lookup ends at its home slot; the
//! values sit densely in a second array, with freed numbers reused last-in first-out through a
//! list threaded through the unused values themselves ([`Vacant`]: a separate free-list array
//! was one more cache line that every operation wrote, and with four threads it bounced between
//! cores). A remove shifts the rest of its cluster back (backward-shift deletion): no tombstones
//! pile up under churn, and nothing but 16-byte slots ever moves. Memory per live key: `GROW` to
//! `4 * GROW` slots and its value. BENCHMARKS.md ("Tracking cost") has the tracker's load factors
//! measured; the arena's table is at most half full (`GROW` 2), as its live set may run to
//! millions of blocks.
//!
//! Keys are pointers an allocator handed out: never 0, which marks an empty slot.
//! [`PtrTable::insert`] refuses key 0 and lookups of it find nothing.
//!
//! Growth: the table doubles when live keys pass 1/`GROW` of its slots and halves when they
//! fall under 1/(4 × `GROW`) (so a peak's memory comes back); each rebuild also packs the
//! values densely again. A rebuild is linear in the slots and happens at most once per that
//! many inserts or removes: amortised constant. Value numbers are `u32` (`u32::MAX` ends the
//! free list): 2^32 live keys in one table would need 128 GiB of slots first.

/// A key: a device pointer.
type DevPtr = u64;

/// A value the table can keep in its dense array: an unused one holds the number of the next
/// unused value (the free list), and is never handed out.
pub(crate) trait Vacant: Copy {
    /// An unused value linking to value number `next`.
    fn vacant(next: u32) -> Self;
    /// The link of an unused value.
    fn next_vacant(&self) -> u32;
}

const EMPTY: DevPtr = 0;
/// Slots of a new (or fully shrunk) table.
const MIN_SLOTS: usize = 16;

/// A probed slot: a key and the number of its entry.
#[derive(Clone, Copy)]
struct Slot {
    key: DevPtr,
    idx: u32,
}

const FREE_SLOT: Slot = Slot { key: EMPTY, idx: 0 };

/// A pointer → `V` map that keeps at most 1/`GROW` of its slots live.
pub(crate) struct PtrTable<V, const GROW: usize> {
    /// A power of two of them, at most 1/`GROW` live.
    slots: Box<[Slot]>,
    /// Indexed by `Slot::idx`. An unused one links the free list ([`Vacant`]).
    entries: Vec<V>,
    /// The first unused entry number ([`NONE`]: none), reused last-in first-out.
    free: u32,
    /// Live keys.
    live: u32,
}

/// The end of the free list.
const NONE: u32 = u32::MAX;

impl<V: Vacant, const GROW: usize> Default for PtrTable<V, GROW> {
    fn default() -> Self {
        PtrTable::with_slots(MIN_SLOTS)
    }
}

/// The first slot of `key`'s probe path in a table of `mask + 1` slots. Pointers are at least
/// 512-byte aligned, so the low bits are dropped first; the multiply spreads the rest and the
/// product's middle bits (not the top ones, which pick the tracker's shard) pick the slot.
#[inline]
fn home(key: DevPtr, mask: usize) -> usize {
    let h = (key >> 9).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((h >> 32) as usize ^ (h >> 11) as usize) & mask
}

impl<V: Vacant, const GROW: usize> PtrTable<V, GROW> {
    /// The table halves once live keys * `SHRINK` fall under its slots.
    const SHRINK: usize = 4 * GROW;

    fn with_slots(slots: usize) -> Self {
        PtrTable {
            slots: vec![FREE_SLOT; slots].into_boxed_slice(),
            entries: Vec::new(),
            free: NONE,
            live: 0,
        }
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// Live keys.
    pub(crate) fn len(&self) -> usize {
        self.live as usize
    }

    /// Walk `key`'s probe path: `Ok(slot)` holding it, or `Err(slot)`, the empty slot that
    /// ends the path (where it would go). At most 1/`GROW` of the slots are live, so an empty
    /// slot ends every path.
    #[inline]
    fn probe(&self, key: DevPtr) -> Result<usize, usize> {
        let mask = self.mask();
        let mut i = home(key, mask);
        loop {
            match self.slots[i].key {
                k if k == key => return Ok(i),
                EMPTY => return Err(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The slot holding `key`, if any.
    #[inline]
    fn find(&self, key: DevPtr) -> Option<usize> {
        if key == EMPTY {
            return None;
        }
        self.probe(key).ok()
    }

    /// Put `e` at `key`, replacing (and returning) what was there. Key 0 is refused: `Err(e)`.
    #[inline]
    pub(crate) fn insert(&mut self, key: DevPtr, e: V) -> Result<Option<V>, V> {
        if key == EMPTY {
            return Err(e);
        }
        let i = match self.probe(key) {
            Ok(i) => {
                let idx = self.slots[i].idx as usize;
                return Ok(Some(std::mem::replace(&mut self.entries[idx], e)));
            }
            Err(i) => i,
        };
        let idx = if self.free != NONE {
            let idx = self.free;
            self.free = self.entries[idx as usize].next_vacant();
            self.entries[idx as usize] = e;
            idx
        } else {
            self.entries.push(e);
            (self.entries.len() - 1) as u32
        };
        self.slots[i] = Slot { key, idx };
        self.live += 1;
        if self.live as usize * GROW > self.slots.len() {
            self.rebuild(self.slots.len() * 2);
        }
        Ok(None)
    }

    /// Take `key` out.
    #[inline]
    pub(crate) fn remove(&mut self, key: DevPtr) -> Option<V> {
        let mut hole = self.find(key)?;
        let idx = self.slots[hole].idx;
        let e = std::mem::replace(&mut self.entries[idx as usize], V::vacant(self.free));
        self.free = idx;
        let mask = self.mask();
        // Backward shift: walk the rest of the cluster; a key whose probe path runs through the
        // hole (its home is not in the cyclic range after the hole up to where it sits) moves
        // into it, and its old slot becomes the hole.
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let k = self.slots[j].key;
            if k == EMPTY {
                break;
            }
            let h = home(k, mask);
            if (j.wrapping_sub(h) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[j];
                hole = j;
            }
        }
        self.slots[hole].key = EMPTY;
        self.live -= 1;
        if self.slots.len() > MIN_SLOTS && (self.live as usize) * Self::SHRINK < self.slots.len() {
            self.rebuild(self.slots.len() / 2);
        }
        Some(e)
    }

    #[inline]
    pub(crate) fn get(&self, key: DevPtr) -> Option<&V> {
        self.find(key)
            .map(|i| &self.entries[self.slots[i].idx as usize])
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, key: DevPtr) -> Option<&mut V> {
        let i = self.find(key)?;
        Some(&mut self.entries[self.slots[i].idx as usize])
    }

    /// Every live key and its value, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (DevPtr, &V)> {
        self.slots
            .iter()
            .filter(|s| s.key != EMPTY)
            .map(|s| (s.key, &self.entries[s.idx as usize]))
    }

    /// Move every live key into a table of `slots` slots, and their entries into a dense array.
    #[cold]
    fn rebuild(&mut self, slots: usize) {
        let old = std::mem::replace(self, PtrTable::with_slots(slots));
        let mask = self.mask();
        self.entries.reserve(old.live as usize);
        for s in old.slots.iter() {
            if s.key == EMPTY {
                continue;
            }
            let mut i = home(s.key, mask);
            while self.slots[i].key != EMPTY {
                i = (i + 1) & mask;
            }
            self.slots[i] = Slot {
                key: s.key,
                idx: self.entries.len() as u32,
            };
            self.entries.push(old.entries[s.idx as usize]);
        }
        self.live = old.live;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A value: a number, and a mark the proptest sets in place.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    struct Entry {
        seq: u64,
        recorded: bool,
    }

    impl Vacant for Entry {
        fn vacant(next: u32) -> Self {
            Entry {
                seq: next.into(),
                recorded: false,
            }
        }
        fn next_vacant(&self) -> u32 {
            self.seq as u32
        }
    }

    /// As the tracker's: at most an eighth full.
    type Table = PtrTable<Entry, 8>;
    const GROW: usize = 8;
    const SHRINK: usize = Table::SHRINK;

    fn entry(seq: u64) -> Entry {
        Entry {
            seq,
            recorded: false,
        }
    }

    #[test]
    fn zero_is_never_a_key() {
        let mut t = Table::default();
        assert_eq!(t.insert(0, entry(1)), Err(entry(1)));
        assert_eq!(t.len(), 0);
        assert_eq!(t.insert(512, entry(3)), Ok(None));
        assert!(t.remove(512).is_some());
        // The slot 512 left is empty again: looking up 0 must not find it.
        assert_eq!(t.remove(0), None);
        assert_eq!(t.get(0), None);
    }

    #[test]
    fn it_grows_and_gives_memory_back() {
        let mut t = Table::default();
        for i in 1..=100_000u64 {
            assert_eq!(t.insert(i << 9, entry(i)), Ok(None));
        }
        assert_eq!(t.len(), 100_000);
        // What the module promises: 8 to 32 slots per live key (at most an eighth full, halved
        // below a thirty-second), and one entry each.
        assert!((8 * 100_000..=32 * 100_000).contains(&t.slots.len()));
        assert_eq!(t.entries.len(), 100_000);
        for i in 1..=100_000u64 {
            assert_eq!(t.remove(i << 9).map(|e| e.seq), Some(i));
            if t.slots.len() > MIN_SLOTS {
                assert!(
                    t.len() * SHRINK >= t.slots.len(),
                    "{} live in {}",
                    t.len(),
                    t.slots.len()
                );
            }
        }
        assert_eq!(t.len(), 0);
        assert!(
            t.slots.len() <= 4 * MIN_SLOTS,
            "{} slots left",
            t.slots.len()
        );
    }

    #[test]
    fn a_rebuild_packs_the_entries() {
        let mut t = Table::default();
        for i in 1..=10_000u64 {
            assert_eq!(t.insert(i << 9, entry(i)), Ok(None));
        }
        for i in 1..=9_990u64 {
            t.remove(i << 9);
        }
        assert_eq!(t.len(), 10);
        assert!(
            t.entries.len() <= 4 * MIN_SLOTS,
            "{} entries kept",
            t.entries.len()
        );
        for i in 9_991..=10_000u64 {
            assert_eq!(t.get(i << 9).map(|e| e.seq), Some(i));
        }
    }

    #[test]
    fn churn_at_a_steady_size_leaves_no_debris() {
        // Every key ever removed must be gone from its probe path, and a steady live count must
        // keep a steady size: a removal leaves nothing behind that an insert has to step over.
        let mut t = Table::default();
        for i in 0..200_000u64 {
            assert_eq!(t.insert((i + 1) << 9, entry(i)), Ok(None));
            if i >= 7 {
                assert_eq!(t.remove((i - 6) << 9).map(|e| e.seq), Some(i - 7));
                assert_eq!(t.get((i - 6) << 9), None);
            }
        }
        assert_eq!(t.len(), 7);
        // At most 8 live at once: the slots stay at the size 8 live keys need, and entry numbers
        // are reused rather than appended.
        assert_eq!(t.slots.len(), (8 * GROW).next_power_of_two());
        assert!(t.entries.len() <= 8, "{} entries", t.entries.len());
        assert_eq!(t.slots.iter().filter(|s| s.key != EMPTY).count(), 7);
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

    /// Runs `ops` on a table keeping 1/`G` of its slots live and on a `HashMap`: the same answers
    /// throughout, and the same contents at the end.
    fn behaves_as_a_map<const G: usize>(ops: Vec<Op>) -> Result<(), TestCaseError> {
        let mut t = PtrTable::<Entry, G>::default();
        let mut m: HashMap<u64, Entry> = HashMap::new();
        for o in ops {
            match o {
                Op::Insert(k, s) => {
                    let want = if k != 0 {
                        Ok(m.insert(k, entry(s)))
                    } else {
                        Err(entry(s))
                    };
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
            prop_assert!(t.len() * G <= t.slots.len());
            for (k, _) in m.iter() {
                prop_assert!(t.get(*k).is_some());
            }
        }
        let mut got: Vec<(u64, Entry)> = t.iter().map(|(k, e)| (k, *e)).collect();
        got.sort_by_key(|(k, _)| *k);
        let mut want: Vec<(u64, Entry)> = m.into_iter().collect();
        want.sort_by_key(|(k, _)| *k);
        prop_assert_eq!(got, want);
        Ok(())
    }

    proptest! {
        /// The tracker's shards.
        #[test]
        fn an_eighth_full_table_behaves_as_a_map(ops in proptest::collection::vec(op(), 1..2000)) {
            behaves_as_a_map::<8>(ops)?;
        }

        /// The arena's live large blocks: half full, so clusters run longer and backward shifts
        /// move more.
        #[test]
        fn a_half_full_table_behaves_as_a_map(ops in proptest::collection::vec(op(), 1..2000)) {
            behaves_as_a_map::<2>(ops)?;
        }
    }
}
