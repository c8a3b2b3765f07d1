//! `fifo` and `fifo-merge`: arrival order.
//!
//! `fifo` is what a server without a scheduler does: each request goes to
//! the device alone, in the order it arrived. `fifo-merge` (AGIOS's TO-agg)
//! keeps arrival order for the head but lets the head's aggregate absorb
//! every queued request contiguous with it, above and below.
//!
//! Cost: O(1) amortised per request (the store's arrival FIFO).
//! Guarantee: a request waits for exactly the requests that arrived before it.

use super::{Pick, Policy};
use crate::store::{Entry, Slot, Store};
use crate::types::{Dispatch, Nanos};

pub(crate) struct Fifo {
    merge: bool,
}

impl Fifo {
    pub fn new(merge: bool) -> Fifo {
        Fifo { merge }
    }
}

impl Policy for Fifo {
    fn merges(&self) -> bool {
        self.merge
    }

    fn arrival_order(&self) -> bool {
        true
    }

    fn enqueued(&mut self, _store: &Store, _slot: Slot, _now: Nanos) {}

    fn pick(&mut self, _store: &Store, _now: Nanos) -> Pick {
        unreachable!("arrival-order policies are served from the store's arrival FIFO")
    }

    fn dispatched(&mut self, _store: &Store, _d: &Dispatch, _members: &[Entry], _forced: bool, _now: Nanos) {}
}
