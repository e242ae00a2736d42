//! A slab: `span` contiguous bytes (whole 64 KiB chunks, possibly sharing pages with other slabs of
//! the same stream) carved into equal slots of one size class.
//!
//! Metadata is out of band (never in device memory): a bitmap of free slots with a summary word
//! so the first free slot is found in two `trailing_zeros`, and the requested size of each live
//! slot (for `requested_bytes` and to catch size mismatches on free).

use super::heap::Fit;

/// Slots per summary bit: one bitmap word.
const WORD: usize = 64;

#[derive(Debug)]
pub struct Slab {
    /// First byte of the slab (chunk aligned).
    pub base: u64,
    pub class: u16,
    /// Index of the owning stream in the arena's stream table.
    pub stream: u32,
    /// Region of the slab, and its length in bytes (a multiple of the chunk).
    pub region: u32,
    pub span: u64,
    /// Its node in its stream's small heap (what dissolving it frees).
    pub node: u32,
    pub slot_size: u64,
    pub slots: u32,
    pub used: u32,
    /// Position in the class's fill-order bucket: `(bucket, index)`; `None` when not in a bucket
    /// (the class's current slab, or a full one).
    pub bucket: Option<(u8, u32)>,
    /// Bit set = slot free.
    free: Vec<u64>,
    /// Bit w set = `free[w] != 0`. Slabs have at most 4096 slots (64 words), so one word suffices.
    summary: u64,
    /// Requested bytes per slot (0 = free).
    requested: Vec<u32>,
}

impl Slab {
    /// A slab of `slots` slots of `slot_size` bytes over `span` bytes at `at`.
    pub fn new(at: Fit, span: u64, class: u16, slot_size: u64, slots: u32, stream: u32) -> Slab {
        let Fit {
            addr: base,
            region,
            node,
        } = at;
        let words = (slots as usize).div_ceil(WORD);
        assert!(words <= 64, "a slab has at most 4096 slots");
        let mut free = vec![u64::MAX; words];
        let tail = slots as usize % WORD;
        if tail != 0 {
            free[words - 1] = (1u64 << tail) - 1;
        }
        let summary = if words == 64 {
            u64::MAX
        } else {
            (1u64 << words) - 1
        };
        Slab {
            base,
            class,
            stream,
            region,
            span,
            node,
            slot_size,
            slots,
            used: 0,
            bucket: None,
            free,
            summary,
            requested: vec![0; slots as usize],
        }
    }

    #[inline]
    pub fn is_full(&self) -> bool {
        self.used == self.slots
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// Take the lowest free slot; its address. The slab must not be full.
    #[inline]
    pub fn take(&mut self, requested: u64) -> u64 {
        let w = self.summary.trailing_zeros() as usize;
        let b = self.free[w].trailing_zeros() as usize;
        self.free[w] &= !(1u64 << b);
        if self.free[w] == 0 {
            self.summary &= !(1u64 << w);
        }
        let slot = w * WORD + b;
        self.requested[slot] = requested as u32;
        self.used += 1;
        self.base + slot as u64 * self.slot_size
    }

    /// The slot index of `ptr` if it is the start of a live slot.
    #[inline]
    pub fn live_slot(&self, ptr: u64) -> Option<usize> {
        let off = ptr.checked_sub(self.base)?;
        if off % self.slot_size != 0 {
            return None;
        }
        let slot = (off / self.slot_size) as usize;
        if slot >= self.slots as usize || self.free[slot / WORD] & (1u64 << (slot % WORD)) != 0 {
            return None;
        }
        Some(slot)
    }

    /// The slot containing `ptr` (live or not), if inside the slab's slots.
    pub fn slot_containing(&self, ptr: u64) -> Option<usize> {
        let slot = (ptr.checked_sub(self.base)? / self.slot_size) as usize;
        (slot < self.slots as usize).then_some(slot)
    }

    #[inline]
    pub fn requested(&self, slot: usize) -> u64 {
        self.requested[slot] as u64
    }

    /// Return a live slot. Returns its requested size.
    #[inline]
    pub fn give_back(&mut self, slot: usize) -> u64 {
        self.free[slot / WORD] |= 1u64 << (slot % WORD);
        self.summary |= 1u64 << (slot / WORD);
        self.used -= 1;
        std::mem::take(&mut self.requested[slot]) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fit(addr: u64) -> Fit {
        Fit {
            addr,
            region: 0,
            node: 0,
        }
    }

    #[test]
    fn take_and_give_back_every_slot() {
        let mut s = Slab::new(fit(1 << 21), 2 << 20, 0, 512, 4096, 0);
        let mut seen = std::collections::HashSet::new();
        for i in 0..4096 {
            let p = s.take(100 + i);
            assert!(seen.insert(p));
            assert_eq!(p % 512, 0);
        }
        assert!(s.is_full());
        let p = (1 << 21) + 512 * 77;
        let slot = s.live_slot(p).unwrap();
        assert_eq!(s.give_back(slot), 177);
        assert!(s.live_slot(p).is_none(), "a freed slot is not live");
        assert_eq!(s.take(5), p, "the lowest free slot is reused");
    }

    #[test]
    fn odd_slot_counts_never_hand_out_past_the_end() {
        let mut s = Slab::new(fit(0), 2 << 20, 0, 2304, 910, 0);
        for _ in 0..910 {
            let p = s.take(1);
            assert!(p + 2304 <= 910 * 2304);
        }
        assert!(s.is_full());
    }
}
