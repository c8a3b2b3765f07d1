//! A hash table whose lookup reads one place in memory.
//!
//! `std`'s table (hashbrown) reads a group of control bytes first, then the
//! bucket they point to: two cache misses, one after the other, when the
//! table is cold. Aioli's per-server tables (streams, recent pieces) are
//! cold at 10^4 servers of 10^6 simulated processes, and their probes were
//! a seventh of the simulator's time there (docs/results.md, 2026-12-07).
//! Here a key is stored in its slot, next to its value, and the slots are
//! probed linearly from the one the key's hash names: a lookup reads that
//! slot's line (and the next when the key was pushed along), and
//! [`FlatMap::prefetch`] can start loading it from the key alone, before
//! the lookup.
//!
//! The table fills at most half its slots (it doubles past that), so a
//! probe run stays short, for a key that is absent too: a lookup that
//! finds its key reads 1.5 slots on average, one that finds nothing 2.5
//! (most of aioli's lookups of recent pieces find nothing). At three
//! quarters full those are 2.5 and 8.5 slots: with the stream table that
//! full, `sluice bench scheduler` took 5.5% longer than with `std`'s
//! tables, against 3.7% with every table at half (medians of 20
//! alternating runs, 2026-12-07): most of the recent pieces' lookups find
//! nothing, and their frequent sweeps (`retain`) read every slot. At 10^6
//! processes the same tables took 6-13% off aioli's world. The size is
//! bounded by the owner's bound on entries (`streams_max`,
//! `RECENT_PIECES_MAX`): at most four times that many slots.
//!
//! The hash is fixed and can be inverted: a client that chose its offsets
//! could put all of a server's recent pieces in one probe run (at most
//! `RECENT_PIECES_MAX` long). `std`'s tables with the core's fixed hasher
//! had the same exposure.
//!
//! One key value marks an empty slot (`FlatKey::EMPTY`); an entry with
//! that key lives beside the slots. No decision may depend on the order of
//! `retain`'s visits (none does: it only filters).

use crate::types::FileId;

/// A key the table can hold.
pub(crate) trait FlatKey: Copy + Eq {
    /// Marks an empty slot. A real key equal to it is kept aside.
    const EMPTY: Self;
    /// A hash whose high bits are well mixed (they pick the slot).
    fn hash(&self) -> u64;
}

/// Fibonacci hashing's multiplier (2^64 / the golden ratio, odd).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl FlatKey for u64 {
    const EMPTY: u64 = u64::MAX;
    #[inline]
    fn hash(&self) -> u64 {
        self.wrapping_mul(GOLDEN)
    }
}

impl FlatKey for (FileId, u64) {
    const EMPTY: (FileId, u64) = (FileId(u64::MAX), u64::MAX);
    #[inline]
    fn hash(&self) -> u64 {
        (self.0 .0.wrapping_mul(GOLDEN).rotate_left(32) ^ self.1).wrapping_mul(GOLDEN)
    }
}

struct Slot<K, V> {
    key: K,
    val: V,
}

/// The smallest table allocated (slots).
const SLOTS_MIN: usize = 8;

pub(crate) struct FlatMap<K, V> {
    /// Empty, or a power of two of slots.
    slots: Vec<Slot<K, V>>,
    /// Entries in `slots` (the aside one not counted).
    used: usize,
    /// The entry whose key is `K::EMPTY`.
    aside: Option<V>,
}

impl<K: FlatKey, V: Default> Default for FlatMap<K, V> {
    fn default() -> Self {
        FlatMap { slots: Vec::new(), used: 0, aside: None }
    }
}

impl<K: FlatKey, V: Default> FlatMap<K, V> {
    pub fn len(&self) -> usize {
        self.used + usize::from(self.aside.is_some())
    }

    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The slot `k`'s probe starts at (the table is not empty).
    #[inline]
    fn home(&self, k: &K) -> usize {
        let bits = self.slots.len().trailing_zeros();
        (k.hash() >> (64 - bits)) as usize
    }

    /// Where `k` is, or the empty slot that ends its probe run.
    #[inline]
    fn find(&self, k: &K) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = self.home(k);
        loop {
            let s = &self.slots[i].key;
            if *s == *k || *s == K::EMPTY {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// Start loading the slot `k`'s lookup reads first. A hint only.
    #[inline]
    pub fn prefetch(&self, k: &K) {
        if !self.slots.is_empty() {
            crate::prefetch::prefetch(&self.slots[self.home(k)]);
        }
    }

    #[inline]
    pub fn get(&self, k: &K) -> Option<&V> {
        if *k == K::EMPTY {
            return self.aside.as_ref();
        }
        if self.slots.is_empty() {
            return None;
        }
        let s = &self.slots[self.find(k)];
        (s.key == *k).then_some(&s.val)
    }

    pub fn contains_key(&self, k: &K) -> bool {
        self.get(k).is_some()
    }

    /// `k`'s value, a default one inserted if it had none.
    #[inline]
    pub fn entry_or_default(&mut self, k: K) -> &mut V {
        if k == K::EMPTY {
            return self.aside.get_or_insert_with(V::default);
        }
        if !self.slots.is_empty() {
            let i = self.find(&k);
            if self.slots[i].key == k {
                return &mut self.slots[i].val;
            }
        }
        self.reserve_one();
        let i = self.find(&k);
        self.slots[i] = Slot { key: k, val: V::default() };
        self.used += 1;
        &mut self.slots[i].val
    }

    pub fn insert(&mut self, k: K, v: V) {
        *self.entry_or_default(k) = v;
    }

    /// Keep only the entries `keep` accepts, in place; the table keeps
    /// its size.
    ///
    /// One pass from a slot that is empty now, so that no probe run
    /// crosses where the pass starts: an entry dropped empties its slot;
    /// one kept moves to the first free slot from its home, if that comes
    /// before its own. Every slot behind the pass is final, so every run
    /// stays unbroken.
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &V) -> bool) {
        if self.aside.as_ref().is_some_and(|v| !keep(&K::EMPTY, v)) {
            self.aside = None;
        }
        let n = self.slots.len();
        // At most half the slots are used: there is an empty one.
        let Some(start) = self.slots.iter().position(|s| s.key == K::EMPTY) else { return };
        for j in 1..n {
            let i = (start + j) & (n - 1);
            let s = &self.slots[i];
            if s.key == K::EMPTY {
                continue;
            }
            if keep(&s.key, &s.val) {
                // Stops at this very slot unless a free one comes first.
                let to = self.find(&s.key);
                if to != i {
                    self.slots.swap(to, i);
                }
            } else {
                self.slots[i] = Slot { key: K::EMPTY, val: V::default() };
                self.used -= 1;
            }
        }
    }

    pub fn clear(&mut self) {
        for s in &mut self.slots {
            *s = Slot { key: K::EMPTY, val: V::default() };
        }
        (self.used, self.aside) = (0, None);
    }

    #[cfg(test)]
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.aside.iter().chain(self.slots.iter().filter(|s| s.key != K::EMPTY).map(|s| &s.val))
    }

    fn empty_slots(n: usize) -> Vec<Slot<K, V>> {
        (0..n).map(|_| Slot { key: K::EMPTY, val: V::default() }).collect()
    }

    /// Room for one more entry within half the slots.
    fn reserve_one(&mut self) {
        let n = self.slots.len();
        if 2 * (self.used + 1) <= n {
            return;
        }
        let old = std::mem::replace(&mut self.slots, Self::empty_slots((2 * n).max(SLOTS_MIN)));
        self.used = 0;
        for s in old.into_iter().filter(|s| s.key != K::EMPTY) {
            self.place(s);
        }
    }

    /// Put an entry whose key is absent (there is room).
    fn place(&mut self, s: Slot<K, V>) {
        let i = self.find(&s.key);
        self.slots[i] = s;
        self.used += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Step {
        Insert(u64, u64),
        Bump(u64),
        Retain(u64),
    }

    /// The key whose hash is `h`: the multiplier is odd, so it has an
    /// inverse modulo 2^64 (Newton's iteration doubles the bits each step).
    fn with_hash(h: u64) -> u64 {
        let mut inv = GOLDEN;
        for _ in 0..6 {
            inv = inv.wrapping_mul(2u64.wrapping_sub(GOLDEN.wrapping_mul(inv)));
        }
        h.wrapping_mul(inv)
    }

    /// Keys that all start their probe at slot 0, whatever the size.
    fn colliding() -> impl Iterator<Item = u64> {
        (0u64..16).map(with_hash)
    }

    /// Few distinct keys (so that steps meet the same ones), the empty
    /// marker, and keys that share a home slot at every size.
    fn key() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..64, Just(u64::MAX), (0u64..16).prop_map(with_hash)]
    }

    #[test]
    fn colliding_keys_share_slot_zero_and_still_resolve() {
        let mut m: FlatMap<u64, u64> = FlatMap::default();
        for k in colliding() {
            assert!(k.hash() < 16, "the inverse gives back the hash asked for");
            m.insert(k, k);
            assert_eq!(m.home(&k), 0);
        }
        assert!(colliding().all(|k| m.get(&k) == Some(&k)));
        m.retain(|k, _| *k != with_hash(3));
        assert!(colliding().all(|k| m.get(&k) == (k != with_hash(3)).then_some(&k)));
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (key(), 0u64..100).prop_map(|(k, v)| Step::Insert(k, v)),
            2 => key().prop_map(Step::Bump),
            1 => (0u64..100).prop_map(Step::Retain),
        ]
    }

    proptest! {
        #[test]
        fn behaves_as_a_map(steps in prop::collection::vec(step(), 1..300)) {
            let mut t: FlatMap<u64, u64> = FlatMap::default();
            let mut model: HashMap<u64, u64> = HashMap::new();
            for s in steps {
                match s {
                    Step::Insert(k, v) => {
                        t.insert(k, v);
                        model.insert(k, v);
                    }
                    Step::Bump(k) => {
                        *t.entry_or_default(k) += 1;
                        *model.entry(k).or_default() += 1;
                    }
                    Step::Retain(below) => {
                        t.retain(|_, &v| v < below);
                        model.retain(|_, &mut v| v < below);
                    }
                }
                prop_assert_eq!(t.len(), model.len());
                prop_assert!(2 * t.used <= t.capacity(), "over half full");
                for k in (0u64..64).chain([u64::MAX]).chain(colliding()) {
                    prop_assert_eq!(t.get(&k), model.get(&k));
                }
            }
        }
    }

    #[test]
    fn inserts_finds_and_overwrites() {
        let mut m: FlatMap<u64, u32> = FlatMap::default();
        assert_eq!(m.get(&5), None);
        for k in 0..1_000u64 {
            m.insert(k * 7, k as u32);
        }
        assert_eq!(m.len(), 1_000);
        assert!((0..1_000u64).all(|k| m.get(&(k * 7)) == Some(&(k as u32))));
        assert_eq!(m.get(&1), None);
        m.insert(7, 99);
        *m.entry_or_default(14) += 1;
        assert_eq!((m.get(&7), m.get(&14), m.len()), (Some(&99), Some(&3), 1_000));
    }

    #[test]
    fn the_empty_marker_is_a_key_like_any_other() {
        let mut m: FlatMap<u64, u32> = FlatMap::default();
        assert!(!m.contains_key(&u64::MAX));
        m.insert(u64::MAX, 4);
        m.insert(3, 5);
        assert_eq!((m.get(&u64::MAX), m.get(&3), m.len()), (Some(&4), Some(&5), 2));
        m.retain(|k, _| *k != u64::MAX);
        assert_eq!((m.get(&u64::MAX), m.get(&3), m.len()), (None, Some(&5), 1));
        let mut r: FlatMap<(FileId, u64), u8> = FlatMap::default();
        r.insert(<(FileId, u64)>::EMPTY, 1);
        r.insert((FileId(u64::MAX), 0), 2);
        assert_eq!((r.get(&<(FileId, u64)>::EMPTY), r.get(&(FileId(u64::MAX), 0)), r.len()), (Some(&1), Some(&2), 2));
    }

    #[test]
    fn fills_half_its_slots_at_n_and_doubles_at_n_plus_one() {
        let mut m: FlatMap<u64, u8> = FlatMap::default();
        assert_eq!(m.capacity(), 0);
        m.insert(0, 0);
        assert_eq!(m.capacity(), SLOTS_MIN);
        for k in 1..4 {
            m.insert(k, 0);
        }
        // 4 of 8 slots: the bound.
        assert_eq!((m.len(), m.capacity()), (4, 8));
        m.insert(4, 0);
        assert_eq!((m.len(), m.capacity()), (5, 16));
        for k in 5..8 {
            m.insert(k, 0);
        }
        assert_eq!((m.len(), m.capacity()), (8, 16));
        m.insert(8, 0);
        assert_eq!((m.len(), m.capacity()), (9, 32));
        assert!((0..9).all(|k| m.contains_key(&k)));
    }

    #[test]
    fn probe_runs_wrap_around_the_end() {
        // Key 0's home is slot 0; three keys whose home is the last slot
        // of an 8-slot table take slots 7, 1 and 2.
        let mut m: FlatMap<u64, u64> = FlatMap::default();
        m.insert(0, 0);
        let last: Vec<u64> = (1..u64::MAX).filter(|k| m.home(k) == 7).take(3).collect();
        for &k in &last {
            m.insert(k, k);
        }
        assert_eq!(m.capacity(), 8, "four entries fit in eight slots");
        assert!(last.iter().all(|k| m.get(k) == Some(k)));
        let at = |m: &FlatMap<u64, u64>| m.slots.iter().map(|s| s.key).collect::<Vec<_>>();
        assert_eq!(at(&m)[..3], [0, last[1], last[2]]);
        assert_eq!(at(&m)[7], last[0]);
        // Taking out the first of the run moves the others back over the
        // end, and all stay found.
        m.retain(|&k, _| k != last[0]);
        assert_eq!((at(&m)[7], at(&m)[1], at(&m)[2]), (last[1], last[2], <u64 as FlatKey>::EMPTY));
        assert!(last[1..].iter().all(|k| m.get(k) == Some(k)) && m.get(&last[0]).is_none() && m.get(&0) == Some(&0));
    }

    #[test]
    fn retain_keeps_exactly_the_accepted_entries_and_its_size() {
        let mut m: FlatMap<(FileId, u64), u64> = FlatMap::default();
        for i in 0..500u64 {
            m.insert((FileId(i % 3), i << 16), i);
        }
        let cap = m.capacity();
        m.retain(|_, v| v % 2 == 0);
        assert_eq!((m.len(), m.capacity()), (250, cap));
        assert!((0..500u64).all(|i| m.get(&(FileId(i % 3), i << 16)).copied() == (i % 2 == 0).then_some(i)));
        assert_eq!(m.values().count(), 250);
        m.clear();
        assert_eq!((m.len(), m.values().count()), (0, 0));
        assert_eq!(m.get(&(FileId(0), 0)), None);
    }
}
