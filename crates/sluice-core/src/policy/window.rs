//! `window`: Song et al.'s server-side coordination by time windows
//! ("Server-side I/O coordination for parallel file systems", SC'11).
//!
//! Requests are grouped by the window of width `window_ns` in which they
//! arrived. The oldest window is served first; inside it one application at
//! a time, in application order, each application's requests in file and
//! offset order, merged with whatever is contiguous. Every server sharing a
//! clock and the same rule serves the same application at the same time,
//! which is the point of the policy for striped files.
//!
//! Cost: O(log n) per request (one ordered index).
//! Guarantee: a request is served before every request of a later window.

use std::collections::BTreeMap;

use super::{Pick, Policy};
use crate::store::{op_index, Entry, Slot, Store};
use crate::types::{AppId, Dispatch, FileId, Nanos};

type Key = (u64, AppId, FileId, usize, u64, u64);

pub(crate) struct Window {
    window_ns: u64,
    index: BTreeMap<Key, Slot>,
}

impl Window {
    pub fn new(window_ns: u64) -> Window {
        Window { window_ns, index: BTreeMap::new() }
    }

    fn key(&self, e: &Entry) -> Key {
        let r = &e.req;
        (e.arrival / self.window_ns, r.app, r.file, op_index(r.op), r.offset, e.seq)
    }
}

impl Policy for Window {
    fn enqueued(&mut self, store: &Store, slot: Slot, _now: Nanos) {
        let key = self.key(store.entry(slot));
        self.index.insert(key, slot);
    }

    fn pick(&mut self, _store: &Store, _now: Nanos) -> Pick {
        let (_, &slot) = self.index.first_key_value().expect("queued requests are indexed");
        Pick::Start { slot, limit: u64::MAX, backward: false }
    }

    fn dispatched(&mut self, _store: &Store, _d: &Dispatch, members: &[Entry], _forced: bool, _now: Nanos) {
        for e in members {
            let removed = self.index.remove(&self.key(e));
            debug_assert!(removed.is_some(), "window index lost a member");
        }
    }

    fn check(&self, store: &Store) {
        assert_eq!(self.index.len(), store.queued, "window index size");
    }
}
