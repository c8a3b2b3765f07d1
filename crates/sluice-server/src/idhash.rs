//! A hasher for the server's tables keyed by its own counters
//! (connection, request and dispatch ids): one multiply per key instead of
//! SipHash's rounds, which showed in the event loop's profile (about 3% of
//! its time on the null device). No client chooses these keys, so the
//! flooding SipHash guards against cannot happen here.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// An odd constant with well-mixed bits (2^64 / the golden ratio).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// Multiplicative hashing of integer keys.
#[derive(Clone, Copy, Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(K);
    }
}

/// A map keyed by one of the server's own ids.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_ids_spread_over_the_table() {
        let mut m: IdMap<u64, u64> = IdMap::default();
        for i in 0..10_000 {
            m.insert(i, i * 2);
        }
        assert!((0..10_000).all(|i| m[&i] == i * 2));
        let top: std::collections::HashSet<u64> = (0..256u64)
            .map(|i| {
                let mut h = IdHasher::default();
                h.write_u64(i);
                h.finish() >> 57
            })
            .collect();
        assert!(top.len() > 100, "the top bits (hashbrown's tags) differ: {}", top.len());
    }
}
