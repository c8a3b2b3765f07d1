//! Completion: the scheduler pass that hands out dispatches (`pump`:
//! carried out on the loop when that cannot block, else on the ring or by
//! a worker), and the way back. Every completion, whichever way it came
//! (on the loop, from the ring, from a worker) and every message answered
//! without a dispatch of its own (refused by the scheduler, a collective
//! that failed, an empty message), enters one queue, `EventLoop::completed`;
//! one function, `complete`, takes them out and one, `deliver`, answers
//! each message on its connection. `complete` runs only while no
//! connection is out of the table, so no answer finds its connection
//! missing but a closed one.

use std::time::Duration;

use super::queue::Completion;
use super::watched::SPIN_DISPATCH_NS;
use super::{EventLoop, Inline};
use crate::exec::{populated_already, settle_null, try_nowait, Job};
use crate::pending::{Delivery, Out};
use crate::ring::Reaped;

impl EventLoop {
    /// Deliver everything queued.
    pub(super) fn complete(&mut self) {
        while let Some(done) = self.completed.pop_front() {
            match done {
                Completion::Dispatch(job) => {
                    let mut replies = std::mem::take(&mut self.replies);
                    self.disp.done(job, self.now.ns, &mut replies);
                    for d in replies.drain(..) {
                        self.deliver(d);
                    }
                    self.replies = replies;
                }
                Completion::Answer(d) => self.deliver(d),
            }
        }
    }

    /// Queue an answered message on its connection (dropped when the
    /// connection is gone).
    fn deliver(&mut self, mut d: Delivery) {
        #[cfg(test)]
        let twice = self.mutated();
        let Some(c) = self.conns.get_mut(&d.conn) else { return };
        #[cfg(test)]
        if let Some(again) = twice {
            match again {
                // The planted fault: this answer is lost.
                false => return,
                true => c.push(d.wire_id, Out::Error(libc::EIO, "answered twice".into()), 0, &self.shared.reply_bytes),
            }
        }
        c.inflight -= 1;
        let solo = c.solo.answered();
        // A lease answered after its dispatch populated the page cache: the
        // handle's descriptor goes with its first lease, as in `lease`. A
        // handle closed meanwhile lends nothing (the client then reads
        // through the server).
        let mut lend = None;
        if let (Some(handle), Out::Lease(.., lent)) = (d.lend, &mut d.out) {
            lend = c.session.as_mut().and_then(|s| s.lend(handle).ok().flatten());
            *lent = lend.is_some();
        }
        match (d.post, d.out) {
            // Answered in the region: no frame. The connection is still
            // marked dirty so that a pause on its reply bytes is lifted.
            (Some((shm, k)), Out::Count(n)) if !c.broken => {
                c.give(d.reserved, &self.shared.reply_bytes);
                if c.watched && solo && c.inflight == 0 {
                    self.doorbells.posted = Some(std::sync::Arc::clone(&shm));
                }
                if shm.post(k, d.wire_id, Some(n)) {
                    self.wakes.push((shm, k));
                }
            }
            (post, out) => {
                c.push_with(d.wire_id, out, d.reserved, &self.shared.reply_bytes, lend);
                if let Some((shm, k)) = post {
                    if shm.post(k, d.wire_id, None) {
                        self.wakes.push((shm, k));
                    }
                }
            }
        }
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(d.conn);
        }
        if c.inflight == 0 && c.ready() {
            let idle = self.now.at + Duration::from_secs(self.shared.config.limits.idle_timeout_s);
            self.arm(idle);
        }
    }

    /// The planted fault for this answer (`queue::Mutation`): `false`,
    /// drop it; `true`, answer it twice; `None`, neither.
    #[cfg(test)]
    fn mutated(&mut self) -> Option<bool> {
        use super::queue::Mutation;
        let (m, n) = self.mutation;
        self.mutation.1 += 1;
        match m {
            Mutation::Drop(k) if k == n => Some(false),
            Mutation::Twice(k) if k == n => Some(true),
            _ => None,
        }
    }

    /// Take back finished jobs (workers, ring) and metadata calls.
    pub(super) fn take_back(&mut self) {
        let Some(w) = self.workers.as_ref() else { return };
        for job in w.done.try_iter() {
            self.exec_out -= 1;
            self.completed.push_back(Completion::Dispatch(job));
        }
        self.reap_ring();
        self.complete();
        let Some(w) = self.workers.as_ref() else { return };
        let meta: Vec<_> = w.meta_done.try_iter().collect();
        for m in meta {
            self.meta_out -= 1;
            let Some(mut c) = self.conns.remove(&m.conn) else { continue };
            c.session = Some(m.session);
            c.pause = None;
            c.push(m.wire_id, m.out, 0, &self.shared.reply_bytes);
            c.last_frame = self.now.at;
            if !self.stopping {
                self.resume(&mut c);
            }
            self.put_back(c);
        }
    }

    /// The ring's completions: done, or (short or failed) to a worker,
    /// which does it again, whole.
    fn reap_ring(&mut self) {
        let Some(ring) = self.ring.as_mut() else { return };
        let mut reaped = std::mem::take(&mut self.ring_reaped);
        ring.reap(&mut reaped);
        for r in reaped.drain(..) {
            self.exec_out -= 1;
            match r {
                Reaped::Done(mut job) => {
                    job.service_ns = self.now.ns.saturating_sub(job.started);
                    self.completed.push_back(Completion::Dispatch(job));
                }
                Reaped::Redo(job) => self.send_to_worker(job),
            }
        }
        self.ring_reaped = reaped;
    }

    /// One scheduler pass: every dispatch the policy allows now. The
    /// scheduler's wake-up time, if it asked to wait.
    pub(super) fn pump(&mut self) -> Option<u64> {
        // The clock is read again before the pass's first dispatch that
        // the loop times itself (on the loop, or on the ring), so that its
        // service time does not count the turn's input.
        let mut fresh = false;
        loop {
            match self.disp.next(self.now.ns) {
                Ok(job) => self.carry_out(job, &mut fresh),
                Err(wake) => {
                    if let Some(ring) = self.ring.as_mut() {
                        // One system call for the pass's submissions; on
                        // failure they stay queued (`timeout_ms`).
                        let _ = ring.flush();
                    }
                    return wake;
                }
            }
        }
    }

    /// Carry out `job` here when the null device or the page cache has it (reads to answer
    /// with leases: cached already, settled here; else populated by a
    /// worker, not the ring, whose reads move data), else on the ring,
    /// else by a worker.
    fn carry_out(&mut self, mut job: Job, fresh: &mut bool) {
        if !*fresh && (self.inline == Inline::PageCache || self.ring.is_some()) {
            self.now = self.shared.clock.read();
            *fresh = true;
        }
        if self.inline == Inline::Null {
            // No device, no time: the null device is not timed.
            settle_null(&mut job);
            job.started = self.now.ns;
            self.completed.push_back(Completion::Dispatch(job));
            return self.complete();
        }
        let populate = job.populate && self.inline == Inline::PageCache;
        if self.inline == Inline::PageCache && if populate { populated_already(&mut job) } else { try_nowait(&mut job) } {
            self.done_here(job);
            return;
        }
        if populate {
            return self.send_to_worker(job);
        }
        let job = match self.ring.as_mut() {
            Some(ring) => {
                job.started = self.now.ns;
                self.doorbells.spin_short = self.disp.predicted_ns(job.dispatch.len) <= SPIN_DISPATCH_NS;
                match ring.push(job) {
                    Ok(()) => {
                        self.exec_out += 1;
                        return;
                    }
                    Err(job) => job,
                }
            }
            None => job,
        };
        self.send_to_worker(job);
    }

    /// A dispatch carried out on the loop: timed by one clock reading,
    /// after which the turn's `now` is that reading.
    fn done_here(&mut self, mut job: Job) {
        let done = self.shared.clock.read();
        job.started = self.now.ns;
        job.service_ns = done.ns.saturating_sub(self.now.ns);
        self.now = done;
        self.completed.push_back(Completion::Dispatch(job));
        self.complete();
    }

    /// Hand `job` to an executor worker (all of them gone: fail it).
    fn send_to_worker(&mut self, job: Job) {
        let workers = self.workers.as_ref().expect("workers live while the loop runs");
        match workers.jobs.send(job) {
            Ok(()) => self.exec_out += 1,
            Err(e) => {
                let mut job = e.0;
                job.items.iter_mut().for_each(|it| it.result = Err(libc::EIO));
                self.completed.push_back(Completion::Dispatch(job));
                self.complete();
            }
        }
    }
}
