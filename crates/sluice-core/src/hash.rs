//! A small deterministic hasher for the core's lookup tables.
//!
//! `std`'s default hasher is randomly seeded; the core must behave the same
//! on every run, so its maps use this multiplicative hash instead. No
//! decision ever depends on a map's iteration order.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Fx-style hasher: one multiply and rotate per word.
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, i: u64) {
        self.hash = (self.hash.rotate_left(5) ^ i).wrapping_mul(SEED);
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    /// A multiply only carries upward, so the low bits (which the table
    /// indexes buckets by) would depend only on the key's low bits; the
    /// final fold brings the well-mixed high half down.
    fn finish(&self) -> u64 {
        let h = self.hash;
        (h ^ (h >> 32)).wrapping_mul(SEED) ^ (h >> 29)
    }
}

/// A `HashMap` with the deterministic hasher.
pub type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// A `HashSet` with the deterministic hasher.
pub type FxHashSet<K> = HashSet<K, BuildHasherDefault<FxHasher>>;
