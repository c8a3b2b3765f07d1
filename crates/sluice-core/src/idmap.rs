//! A map from the drivers' small integer ids (files, applications) to
//! the core's records.
//!
//! Drivers number files and applications from 1 up: the simulator one
//! per application, the daemon in the order it first sees them. Ids below
//! `DENSE_IDS` index a vector directly, so a lookup is one memory access at
//! an address known from the id, where a hash table reads its control
//! bytes, then its bucket, one after the other. At 10^4 servers of 10^6
//! simulated processes each of those is a cache miss: with the store's
//! file records here, `Scheduler::complete` went from 14% to 8% of
//! `sluice sim --bench --bench-procs 1000000 --policy fifo`; with aioli's
//! tables too, aioli's cost per request in `sluice bench scheduler` fell
//! by about a tenth (docs/results.md, 2026-11-25, commit 96c785c). Larger ids (a daemon
//! that has opened many files) go to a hash map. The vector grows to the
//! largest dense id seen, at most `DENSE_IDS` slots.

use std::collections::hash_map::Entry;
use std::hash::Hash;

use crate::hash::FxHashMap;
use crate::types::{AppId, FileId};

/// Ids below this are kept in the vector (its bound).
pub const DENSE_IDS: u64 = 4_096;

/// An id a driver hands out from 1 up.
pub(crate) trait Id: Copy + Eq + Hash {
    fn index(self) -> u64;
    fn from_index(i: u64) -> Self;
}

impl Id for FileId {
    fn index(self) -> u64 {
        self.0
    }
    fn from_index(i: u64) -> Self {
        FileId(i)
    }
}

impl Id for AppId {
    fn index(self) -> u64 {
        u64::from(self.0)
    }
    fn from_index(i: u64) -> Self {
        AppId(i as u32)
    }
}

pub(crate) struct IdMap<K, V> {
    dense: Vec<Option<V>>,
    sparse: FxHashMap<K, V>,
    /// Records present, dense and sparse.
    len: usize,
}

impl<K, V> Default for IdMap<K, V> {
    fn default() -> Self {
        IdMap { dense: Vec::new(), sparse: FxHashMap::default(), len: 0 }
    }
}

impl<K: Id, V> IdMap<K, V> {
    fn dense_index(k: K) -> Option<usize> {
        (k.index() < DENSE_IDS).then_some(k.index() as usize)
    }

    #[inline]
    pub fn get(&self, k: &K) -> Option<&V> {
        match Self::dense_index(*k) {
            Some(i) => self.dense.get(i).and_then(Option::as_ref),
            None => self.sparse.get(k),
        }
    }

    #[inline]
    pub fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        match Self::dense_index(*k) {
            Some(i) => self.dense.get_mut(i).and_then(Option::as_mut),
            None => self.sparse.get_mut(k),
        }
    }

    /// Start loading `k`'s slot, if it is a dense one already allocated
    /// (a sparse record's place is not known without a lookup).
    #[inline]
    pub fn prefetch(&self, k: &K) {
        if let Some(slot) = Self::dense_index(*k).and_then(|i| self.dense.get(i)) {
            crate::prefetch::prefetch(slot);
        }
    }

    pub fn contains_key(&self, k: &K) -> bool {
        self.get(k).is_some()
    }

    /// `k`'s record, made by `new` if it had none.
    #[inline]
    pub fn get_or_insert_with(&mut self, k: K, new: impl FnOnce() -> V) -> &mut V {
        match Self::dense_index(k) {
            // The common case, a record already there: one bounds check
            // and one test, no resize path.
            Some(i) if self.dense.get(i).is_some_and(Option::is_some) => self.dense[i].as_mut().expect("tested just above"),
            Some(i) => {
                if i >= self.dense.len() {
                    self.dense.resize_with(i + 1, || None);
                }
                let slot = &mut self.dense[i];
                self.len += usize::from(slot.is_none());
                slot.get_or_insert_with(new)
            }
            None => match self.sparse.entry(k) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => {
                    self.len += 1;
                    v.insert(new())
                }
            },
        }
    }

    pub fn remove(&mut self, k: &K) -> Option<V> {
        let v = match Self::dense_index(*k) {
            Some(i) => self.dense.get_mut(i).and_then(Option::take),
            None => self.sparse.remove(k),
        };
        self.len -= usize::from(v.is_some());
        v
    }

    /// Keep the records `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(K, &mut V) -> bool) {
        for (i, slot) in self.dense.iter_mut().enumerate() {
            if slot.as_mut().is_some_and(|v| !keep(K::from_index(i as u64), v)) {
                *slot = None;
                self.len -= 1;
            }
        }
        let before = self.sparse.len();
        self.sparse.retain(|&k, v| keep(k, v));
        self.len -= before - self.sparse.len();
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Every record, dense ones first by id, then the sparse ones in no
    /// particular order: no decision may depend on that order.
    pub fn iter(&self) -> impl Iterator<Item = (K, &V)> {
        let dense = self.dense.iter().enumerate().filter_map(|(i, v)| v.as_ref().map(|v| (K::from_index(i as u64), v)));
        dense.chain(self.sparse.iter().map(|(&k, v)| (k, v)))
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// Slots the vector holds (at most `DENSE_IDS`).
    pub fn dense_capacity_used(&self) -> usize {
        self.dense.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::FileQ;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn tagged(t: &mut IdMap<FileId, FileQ>, id: u64, tag: u64) {
        t.get_or_insert_with(FileId(id), FileQ::default).bytes = tag;
    }

    #[test]
    fn ids_below_the_bound_are_dense_and_the_bound_itself_is_not() {
        let mut t: IdMap<FileId, FileQ> = IdMap::default();
        tagged(&mut t, DENSE_IDS - 1, 7);
        assert_eq!((t.dense_capacity_used(), t.sparse.len(), t.len()), (DENSE_IDS as usize, 0, 1));
        tagged(&mut t, DENSE_IDS, 8);
        assert_eq!((t.dense_capacity_used(), t.sparse.len(), t.len()), (DENSE_IDS as usize, 1, 2));
        assert_eq!(t.get(&FileId(DENSE_IDS - 1)).map(|q| q.bytes), Some(7));
        assert_eq!(t.get(&FileId(DENSE_IDS)).map(|q| q.bytes), Some(8));
        assert!(t.remove(&FileId(DENSE_IDS)).is_some() && t.remove(&FileId(DENSE_IDS)).is_none());
        assert!(t.remove(&FileId(DENSE_IDS - 1)).is_some() && t.get(&FileId(DENSE_IDS - 1)).is_none());
        assert_eq!(t.len(), 0);
    }

    #[derive(Clone, Debug)]
    enum Step {
        Touch(u64, u64),
        Remove(u64),
        /// Keep the records tagged below this.
        Retain(u64),
    }

    fn id() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..8, Just(DENSE_IDS - 1), Just(DENSE_IDS), Just(DENSE_IDS + 1), Just(u64::MAX)]
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (id(), 0u64..100).prop_map(|(i, t)| Step::Touch(i, t)),
            2 => id().prop_map(Step::Remove),
            1 => (0u64..100).prop_map(Step::Retain),
        ]
    }

    proptest! {
        #[test]
        fn behaves_as_a_map(steps in prop::collection::vec(step(), 1..200)) {
            let mut t: IdMap<FileId, FileQ> = IdMap::default();
            let mut model: HashMap<u64, u64> = HashMap::new();
            for s in steps {
                match s {
                    Step::Touch(i, tag) => {
                        let q = t.get_or_insert_with(FileId(i), FileQ::default);
                        prop_assert_eq!(q.bytes, model.get(&i).copied().unwrap_or(0), "an existing record is kept, a new one is empty");
                        q.bytes = tag;
                        model.insert(i, tag);
                    }
                    Step::Remove(i) => prop_assert_eq!(t.remove(&FileId(i)).map(|q| q.bytes), model.remove(&i)),
                    Step::Retain(below) => {
                        t.retain(|_, q| q.bytes < below);
                        model.retain(|_, &mut tag| tag < below);
                    }
                }
                prop_assert_eq!(t.len(), model.len());
                let mut seen: Vec<(u64, u64)> = t.iter().map(|(f, q)| (f.0, q.bytes)).collect();
                seen.sort_unstable();
                let mut want: Vec<(u64, u64)> = model.iter().map(|(&i, &b)| (i, b)).collect();
                want.sort_unstable();
                prop_assert_eq!(seen, want);
                prop_assert!(t.dense_capacity_used() <= DENSE_IDS as usize);
            }
        }
    }
}
