//! The hash map the arena keys by integers (pointers, stream ids, page numbers).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A multiplicative hasher for integer keys (pointers, stream ids): no DoS concern here, and
/// SipHash would be most of the cost of a lookup.
#[derive(Default, Clone, Copy)]
pub(super) struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (n ^ (n >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(super) type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;
