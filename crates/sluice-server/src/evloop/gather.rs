//! Collectives on the loop (`collective.rs` keeps the table): a
//! participant's pieces are held until its group is complete; a complete
//! group waits, whole, for room in the scheduler's queue; a group past its
//! deadline, or at a stop, is answered with an error, none of it done.

use sluice_core::Op;

use super::queue::Completion;
use super::EventLoop;
use crate::collective::{Arrival, Joined};
use crate::pending::Pending;

impl EventLoop {
    /// Hold a participant's pieces with its group; a group complete now
    /// queues for the scheduler, its pieces in disk order, as the work of
    /// one application.
    pub(super) fn join(&mut self, arrival: Arrival<Pending>) {
        let op = arrival.op;
        match self.collectives.join(arrival, self.now.at) {
            Joined::Waiting(deadline) => self.arm(deadline),
            Joined::Complete { app, mut items } => {
                items.sort_unstable_by_key(|p| p.req.offset);
                for p in &mut items {
                    p.req.app = app;
                }
                if op == Op::Write {
                    self.ready_write_bytes += items.iter().map(|p| p.req.len).sum::<u64>();
                }
                self.ready.push_back(items);
                self.release_ready();
            }
        }
    }

    /// Admit complete collectives, oldest first, each whole and only when
    /// the scheduler's queue has room for all of it (its dispatches make
    /// room); one larger than the queue itself is refused (E2BIG).
    pub(super) fn release_ready(&mut self) {
        let (cap_requests, cap_bytes) = self.disp.capacity();
        while let Some(items) = self.ready.front() {
            let (n, bytes) = (items.len() as u64, items.iter().map(|p| p.req.len).sum::<u64>());
            let write_bytes = if items.first().is_some_and(|p| p.req.op == Op::Write) { bytes } else { 0 };
            if n > cap_requests || bytes > cap_bytes {
                let items = self.ready.pop_front().expect("looked at");
                self.ready_write_bytes -= write_bytes;
                let msg = format!("a collective of {n} pieces and {bytes} bytes exceeds the scheduler's queue ({cap_requests} requests, {cap_bytes} bytes)");
                self.answer_all(items, libc::E2BIG, &msg);
                continue;
            }
            let (room_requests, room_bytes) = self.disp.room();
            if n > room_requests || bytes > room_bytes {
                return;
            }
            let items = self.ready.pop_front().expect("looked at");
            self.ready_write_bytes -= write_bytes;
            let now = self.now.ns;
            for mut p in items {
                p.arrival_ns = now;
                if let Some(d) = self.disp.submit(p, now) {
                    self.completed.push_back(Completion::Answer(d));
                }
            }
        }
    }

    /// Answer every participant of each collective past its deadline (all
    /// of them, with `stopping`) with an error; none of it was carried out.
    pub(super) fn expire_collectives(&mut self, stopping: bool) {
        let now = (!stopping).then_some(self.now.at);
        for e in self.collectives.expire(now) {
            let (errno, msg) = match now {
                Some(_) => (libc::ETIMEDOUT, format!("collective {}: {} of {} participants arrived in time; nothing was done", e.id, e.arrived, e.participants)),
                None => (libc::ECANCELED, format!("collective {}: the server is stopping; nothing was done", e.id)),
            };
            self.answer_all(e.items, errno, &msg);
        }
    }

    /// Answer `items`, none of it done, with an error.
    fn answer_all(&mut self, items: Vec<Pending>, errno: i32, msg: &str) {
        for p in items {
            if let Some(d) = p.answer_with(Err((errno, msg.to_string()))) {
                self.completed.push_back(Completion::Answer(d));
            }
        }
    }
}
