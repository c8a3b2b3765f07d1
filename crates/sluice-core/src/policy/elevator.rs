//! `elevator`: per-file offset order, C-SCAN across files.
//!
//! The head sweeps each file upward from where the last dispatch ended,
//! merging contiguous requests, then moves to the next file by id and wraps
//! around to the lowest. It minimises seek distance on one spindle and
//! ignores who issued what: an application streaming ahead of the head keeps
//! it, so fairness comes only from the scheduler's expiry.
//!
//! Cost: O(log n) per request plus the files skipped on a wrap.
//! Guarantee: within one sweep, every request at or above the head is served
//! in offset order; every request is served within `request_expire_ns`.

use std::collections::BTreeSet;
use std::ops::Bound;

use super::{Pick, Policy};
use crate::store::{Entry, Slot, Store};
use crate::types::{Dispatch, FileId, Nanos, Op};

#[derive(Default)]
pub(crate) struct Elevator {
    /// Where the head is: the file and the offset after the last dispatch.
    cursor: Option<(FileId, u64)>,
    /// Files that may have eligible requests (cleaned lazily by `pick`).
    files: BTreeSet<FileId>,
}

/// The eligible request of `file` with the lowest offset at or above `offset`.
pub(crate) fn lowest_at_or_after(store: &Store, file: FileId, offset: u64) -> Option<Slot> {
    let r = store.first_at_or_after(file, Op::Read, offset);
    let w = store.first_at_or_after(file, Op::Write, offset);
    match (r, w) {
        (Some(r), Some(w)) => {
            let key = |s: Slot| (store.entry(s).req.offset, store.entry(s).seq);
            Some(if key(r) <= key(w) { r } else { w })
        }
        (r, w) => r.or(w),
    }
}

impl Policy for Elevator {
    fn enqueued(&mut self, store: &Store, slot: Slot, _now: Nanos) {
        self.files.insert(store.entry(slot).req.file);
    }

    fn pick(&mut self, store: &Store, _now: Nanos) -> Pick {
        let (mut file, mut offset) = self.cursor.unwrap_or((FileId(0), 0));
        for _ in 0..self.files.len() + 2 {
            if let Some(slot) = lowest_at_or_after(store, file, offset) {
                return Pick::Start { slot, limit: u64::MAX, backward: false };
            }
            if store.files.get(&file).is_none_or(|f| f.count() == 0) {
                self.files.remove(&file);
            }
            let next = self.files.range((Bound::Excluded(file), Bound::Unbounded)).next();
            match next.or_else(|| self.files.first()) {
                Some(&f) => (file, offset) = (f, 0),
                None => return Pick::Idle,
            }
        }
        unreachable!("a sweep over every file finds the queued request")
    }

    fn dispatched(&mut self, _store: &Store, d: &Dispatch, _members: &[Entry], _forced: bool, _now: Nanos) {
        self.cursor = Some((d.file, d.end()));
    }

    fn check(&self, store: &Store) {
        for f in store.files.iter().filter(|(_, q)| q.count() > 0).map(|(f, _)| f) {
            assert!(self.files.contains(&f), "elevator lost file {f:?}");
        }
    }
}
