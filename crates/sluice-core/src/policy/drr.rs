//! `drr`: weighted deficit round-robin across applications (Shreedhar and
//! Varghese, SIGCOMM'95), the classic fair-share baseline.
//!
//! Applications with queued requests form a ring. Visiting an application
//! whose oldest request does not fit its deficit adds `quantum_bytes x
//! weight` to the deficit and moves on; one that fits is served, with
//! contiguous requests merged up to its deficit. Every member of a dispatch
//! is charged to its own application, so merged neighbours pay their share.
//! An application leaving the ring loses its deficit.
//!
//! Cost: O(1) amortised per request while requests fit a quantum.
//! Guarantee: over any interval in which applications stay backlogged, the
//! bytes they receive are proportional to their weights within one maximum
//! request size each.

use std::collections::{BTreeMap, VecDeque};

use super::{Pick, Policy};
use crate::store::{Entry, LazyFifo, Slot, Store};
use crate::types::{AppId, Dispatch, Nanos};

#[derive(Default)]
struct AppQ {
    fifo: LazyFifo,
    live: usize,
    deficit: i64,
    weight: u32,
    in_ring: bool,
    /// Its registration is gone (`forget_app`) while requests were
    /// queued: the record goes with the last of them.
    forgotten: bool,
}

pub(crate) struct Drr {
    quantum_bytes: u64,
    apps: BTreeMap<AppId, AppQ>,
    ring: VecDeque<AppId>,
}

impl Drr {
    pub fn new(quantum_bytes: u64) -> Drr {
        Drr { quantum_bytes, apps: BTreeMap::new(), ring: VecDeque::new() }
    }

    fn app(&mut self, app: AppId) -> &mut AppQ {
        self.apps.entry(app).or_insert_with(|| AppQ { weight: 1, ..AppQ::default() })
    }

    /// Drop `app`'s record and its place in the ring (where an
    /// application with nothing queued stays until `pick` passes it).
    fn remove(&mut self, app: AppId) {
        self.apps.remove(&app);
        self.ring.retain(|&a| a != app);
    }
}

impl Policy for Drr {
    fn quantum(&self, app: AppId) -> Option<u64> {
        self.apps.get(&app).map(|a| a.deficit.max(0) as u64)
    }

    fn enqueued(&mut self, store: &Store, slot: Slot, _now: Nanos) {
        let e = *store.entry(slot);
        let a = self.app(e.req.app);
        let live = a.live;
        a.fifo.push(&e, slot, store, live);
        a.live += 1;
        if !a.in_ring {
            a.in_ring = true;
            self.ring.push_back(e.req.app);
        }
    }

    fn pick(&mut self, store: &Store, _now: Nanos) -> Pick {
        loop {
            let id = *self.ring.front().expect("queued requests imply a backlogged application");
            let quantum = self.quantum_bytes as i64;
            let a = self.apps.get_mut(&id).expect("ring member has state");
            let Some(head) = a.fifo.front(store) else {
                a.in_ring = false;
                a.deficit = 0;
                self.ring.pop_front();
                continue;
            };
            let len = store.entry(head).req.len as i64;
            if len <= a.deficit {
                return Pick::Start { slot: head, limit: a.deficit as u64, backward: true };
            }
            // Add as many quanta as the head needs at once: the same as
            // visiting the ring that many times, without the walk.
            let rounds = ((len - a.deficit) + quantum * i64::from(a.weight) - 1) / (quantum * i64::from(a.weight));
            a.deficit += quantum * i64::from(a.weight);
            if rounds > 1 && self.ring.len() == 1 {
                a.deficit += (rounds - 1) * quantum * i64::from(a.weight);
            }
            self.ring.rotate_left(1);
        }
    }

    fn dispatched(&mut self, store: &Store, d: &Dispatch, _members: &[Entry], _forced: bool, _now: Nanos) {
        for m in &d.members {
            let a = self.app(m.app);
            a.live -= 1;
            let live = a.live;
            a.fifo.shrink(store, live);
            a.deficit -= m.len as i64;
            if live == 0 && a.forgotten {
                self.remove(m.app);
            }
        }
    }

    fn set_weight(&mut self, app: AppId, weight: u32) {
        let a = self.app(app);
        a.weight = weight;
        a.forgotten = false;
    }

    fn forget_app(&mut self, app: AppId) {
        match self.apps.get_mut(&app) {
            Some(a) if a.live == 0 => self.remove(app),
            Some(a) => a.forgotten = true,
            None => {}
        }
    }

    fn apps_tracked(&self) -> usize {
        self.apps.len()
    }

    fn check(&self, store: &Store) {
        let live: usize = self.apps.values().map(|a| a.live).sum();
        assert_eq!(live, store.queued, "drr live count");
        for (id, a) in &self.apps {
            assert!(a.fifo.len() <= 2 * a.live + 65, "drr fifo of {id:?} unbounded");
        }
    }
}
