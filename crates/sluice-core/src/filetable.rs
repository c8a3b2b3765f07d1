//! The store's per-file records, by file id.
//!
//! Drivers number files from 1 up: the simulator one per application, the
//! daemon in the order it first opens them. Ids below `DENSE_IDS` index a
//! vector directly, so a lookup is one memory access at an address known
//! from the id, where a hash table reads its control bytes, then its
//! bucket, one after the other. At 10^4 servers of 10^6 simulated
//! processes those two were a fifth of the run, each a cache miss
//! (`sluice sim --bench --bench-procs 1000000`). Larger ids (a daemon that
//! has opened many files) go to a hash map. The vector grows to the
//! largest dense id seen, at most `DENSE_IDS` slots.

use std::collections::hash_map::Entry;

use crate::hash::FxHashMap;
use crate::store::FileQ;
use crate::types::FileId;

/// File ids below this are kept in the vector (its bound).
pub const DENSE_IDS: u64 = 4_096;

#[derive(Default)]
pub(crate) struct FileTable {
    dense: Vec<Option<FileQ>>,
    sparse: FxHashMap<FileId, FileQ>,
    /// Records present, dense and sparse.
    len: usize,
}

impl FileTable {
    fn dense_index(file: FileId) -> Option<usize> {
        (file.0 < DENSE_IDS).then_some(file.0 as usize)
    }

    pub fn get(&self, file: &FileId) -> Option<&FileQ> {
        match Self::dense_index(*file) {
            Some(i) => self.dense.get(i).and_then(Option::as_ref),
            None => self.sparse.get(file),
        }
    }

    pub fn get_mut(&mut self, file: &FileId) -> Option<&mut FileQ> {
        match Self::dense_index(*file) {
            Some(i) => self.dense.get_mut(i).and_then(Option::as_mut),
            None => self.sparse.get_mut(file),
        }
    }

    /// `file`'s record, a new empty one if it had none.
    pub fn get_or_default(&mut self, file: FileId) -> &mut FileQ {
        match Self::dense_index(file) {
            Some(i) => {
                if i >= self.dense.len() {
                    self.dense.resize_with(i + 1, || None);
                }
                let slot = &mut self.dense[i];
                self.len += usize::from(slot.is_none());
                slot.get_or_insert_with(FileQ::default)
            }
            None => match self.sparse.entry(file) {
                Entry::Occupied(o) => o.into_mut(),
                Entry::Vacant(v) => {
                    self.len += 1;
                    v.insert(FileQ::default())
                }
            },
        }
    }

    pub fn remove(&mut self, file: &FileId) -> Option<FileQ> {
        let q = match Self::dense_index(*file) {
            Some(i) => self.dense.get_mut(i).and_then(Option::take),
            None => self.sparse.remove(file),
        };
        self.len -= usize::from(q.is_some());
        q
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Every record, dense ones first by id, then the sparse ones in no
    /// particular order (for checks only: no decision may depend on it).
    pub fn iter(&self) -> impl Iterator<Item = (FileId, &FileQ)> {
        let dense = self.dense.iter().enumerate().filter_map(|(i, q)| q.as_ref().map(|q| (FileId(i as u64), q)));
        dense.chain(self.sparse.iter().map(|(&f, q)| (f, q)))
    }

    /// Slots the vector holds (at most `DENSE_IDS`).
    pub fn dense_capacity_used(&self) -> usize {
        self.dense.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn tagged(t: &mut FileTable, id: u64, tag: u64) {
        t.get_or_default(FileId(id)).bytes = tag;
    }

    #[test]
    fn ids_below_the_bound_are_dense_and_the_bound_itself_is_not() {
        let mut t = FileTable::default();
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
    }

    fn id() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..8, Just(DENSE_IDS - 1), Just(DENSE_IDS), Just(DENSE_IDS + 1), Just(u64::MAX)]
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![(id(), any::<u64>()).prop_map(|(i, t)| Step::Touch(i, t)), id().prop_map(Step::Remove)]
    }

    proptest! {
        #[test]
        fn behaves_as_a_map(steps in prop::collection::vec(step(), 1..200)) {
            let mut t = FileTable::default();
            let mut model: HashMap<u64, u64> = HashMap::new();
            for s in steps {
                match s {
                    Step::Touch(i, tag) => {
                        let q = t.get_or_default(FileId(i));
                        prop_assert_eq!(q.bytes, model.get(&i).copied().unwrap_or(0), "an existing record is kept, a new one is empty");
                        q.bytes = tag;
                        model.insert(i, tag);
                    }
                    Step::Remove(i) => prop_assert_eq!(t.remove(&FileId(i)).map(|q| q.bytes), model.remove(&i)),
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
