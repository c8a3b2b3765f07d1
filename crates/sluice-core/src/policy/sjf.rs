//! `sjf`: the file queue with the fewest queued bytes first (AGIOS's SJF).
//!
//! Short jobs finish first, which minimises mean completion time when
//! applications work on separate files; a large file waits while small ones
//! keep arriving, so its bound is the scheduler's expiry. Inside the chosen
//! file the lowest offset goes first, with contiguous requests merged.
//!
//! Cost: O(log f) per request for the ordered (bytes, file) index.
//! Guarantee: every request is served within `request_expire_ns`.

use std::collections::BTreeSet;

use super::elevator::lowest_at_or_after;
use super::{Pick, Policy};
use crate::hash::FxHashMap;
use crate::store::{Entry, Slot, Store};
use crate::types::{Dispatch, FileId, Nanos};

#[derive(Default)]
pub(crate) struct Sjf {
    by_bytes: BTreeSet<(u64, FileId)>,
    bytes: FxHashMap<FileId, u64>,
}

impl Sjf {
    fn adjust(&mut self, file: FileId, add: u64, sub: u64) {
        let old = self.bytes.get(&file).copied().unwrap_or(0);
        let new = old + add - sub;
        if old > 0 {
            self.by_bytes.remove(&(old, file));
        }
        if new > 0 {
            self.by_bytes.insert((new, file));
            self.bytes.insert(file, new);
        } else {
            self.bytes.remove(&file);
        }
    }
}

impl Policy for Sjf {
    fn enqueued(&mut self, store: &Store, slot: Slot, _now: Nanos) {
        let r = store.entry(slot).req;
        self.adjust(r.file, r.len, 0);
    }

    fn pick(&mut self, store: &Store, _now: Nanos) -> Pick {
        let &(_, file) = self.by_bytes.first().expect("queued requests imply a file");
        let slot = lowest_at_or_after(store, file, 0).expect("indexed file has a request");
        Pick::Start { slot, limit: u64::MAX, backward: false }
    }

    fn dispatched(&mut self, _store: &Store, d: &Dispatch, _members: &[Entry], _forced: bool, _now: Nanos) {
        let bytes: u64 = d.members.iter().map(|m| m.len).sum();
        self.adjust(d.file, 0, bytes);
    }

    fn check(&self, store: &Store) {
        for (f, q) in store.files.iter().filter(|(_, q)| q.count() > 0) {
            assert_eq!(self.bytes.get(&f).copied(), Some(q.bytes), "sjf bytes of {f:?}");
        }
        assert_eq!(self.bytes.len(), self.by_bytes.len(), "sjf index sizes");
    }
}
