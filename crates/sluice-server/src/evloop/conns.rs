//! The connection table: a connection is taken out while a stage works on
//! it and put back after (`put_back`, which then delivers what was
//! answered meanwhile); connections with something to write are listed
//! (`dirty`) and flushed at the end of the turn, which also resumes those
//! whose pause ended.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::EventLoop;
use crate::conn::{Conn, Pause, Phase};
use crate::pending::Out;
use crate::sync::lock;

impl EventLoop {
    /// Drop connection `id`: its partial frame's budget, its reply bytes,
    /// its application's connection.
    pub(super) fn remove(&mut self, id: u64) {
        let Some(mut c) = self.conns.remove(&id) else { return };
        if matches!(c.phase, Phase::Ready) {
            self.ready_conns -= 1;
        }
        c.fold_leased(&self.shared.apps);
        if c.registered {
            self.poll.delete(c.fd(), id);
        }
        self.abandon_frame(&mut c);
        let held = c.held;
        c.give(held, &self.shared.reply_bytes);
        if let Some(uid) = c.uid {
            self.uids.leave(uid);
        }
        if matches!(c.pause, Some(Pause::Room(_))) {
            self.starved.retain(|&s| s != id);
        }
        if let Some(app) = c.app {
            if lock(&self.shared.apps).disconnect(app, self.now.ns) {
                self.disp.forget(app);
            }
        }
        self.budget.forget(id);
        if c.watched {
            let n = self.doorbells.forget(id);
            self.shared.doorbells_watched.store(n, Ordering::Relaxed);
        }
        self.shared.conns_open.store(self.conns.len(), Ordering::Relaxed);
    }

    /// Reinsert a connection taken out of the table, deliver what was
    /// answered meanwhile, and look at it at the end of the turn.
    pub(super) fn put_back(&mut self, mut c: Conn) {
        let id = c.id;
        self.dirty_mark(&mut c);
        self.conns.insert(id, c);
        self.complete();
    }

    pub(super) fn dirty_mark(&mut self, c: &mut Conn) {
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(c.id);
        }
    }

    /// Answer `msg` and read no more from `c`.
    pub(super) fn fail(&mut self, c: &mut Conn, wire_id: u64, errno: i32, msg: String) {
        c.push(wire_id, Out::Error(errno, msg), 0, &self.shared.reply_bytes);
        self.abandon_frame(c);
        c.read_closed = true;
    }

    /// Write replies, fix epoll interest, drop finished connections, then
    /// wake the clients asleep on post records answered this turn.
    pub(super) fn flush_dirty(&mut self) {
        let now = self.now.at;
        for id in std::mem::take(&mut self.dirty) {
            let Some(c) = self.conns.get_mut(&id) else { continue };
            c.dirty = false;
            c.flush(now, &self.shared.reply_bytes);
            let stalled = c.out_stalled.is_some();
            if c.finished() {
                self.remove(id);
                continue;
            }
            self.update_interest(id);
            if stalled {
                self.arm(now + Duration::from_secs(self.shared.config.limits.write_timeout_s));
            }
            self.resume_if_drained(id);
        }
        self.wake_starved();
        for (shm, k) in self.wakes.drain(..) {
            shm.wake(k);
        }
    }

    /// Bytes `c` may still take: what its user's share and the server's
    /// budget both leave (`fair::room`).
    pub(super) fn room(&self, c: &Conn) -> u64 {
        let l = &self.shared.config.limits;
        let all = self.shared.reply_bytes.load(Ordering::Relaxed) + self.budget.held();
        super::fair::room(c.uid_held(), l.uid_bytes_max, all, l.held_bytes_max)
    }

    /// Pause `c` until `need` bytes fit its room (`wake_starved`).
    pub(super) fn starve(&mut self, c: &mut Conn, need: u64) {
        c.pause = Some(Pause::Room(need));
        if !self.starved.contains(&c.id) {
            self.starved.push(c.id);
        }
    }

    /// Resume the starved connections whose bytes now fit, in the order
    /// they came; the rest wait on.
    fn wake_starved(&mut self) {
        if self.starved.is_empty() {
            return;
        }
        for id in std::mem::take(&mut self.starved) {
            let fits = match self.conns.get(&id).map(|c| (c.pause, c)) {
                Some((Some(Pause::Room(need)), c)) => need <= self.room(c),
                _ => continue,
            };
            if !fits {
                self.starved.push(id);
                continue;
            }
            let mut c = self.conns.remove(&id).expect("present");
            c.pause = None;
            if !self.stopping {
                self.resume(&mut c);
            }
            self.put_back(c);
        }
    }

    /// Replies drained below the bound, or the budget came back: take in
    /// what waited, then read again.
    fn resume_if_drained(&mut self, id: u64) {
        let max = self.shared.config.limits.reply_bytes_max;
        let resumable = self.conns.get(&id).is_some_and(|c| c.resume_pending || matches!(c.pause, Some(Pause::Bytes(need)) if c.held == 0 || c.held + need <= max));
        if !resumable {
            return;
        }
        let mut c = self.conns.remove(&id).expect("present");
        c.resume_pending = false;
        if matches!(c.pause, Some(Pause::Bytes(_) | Pause::Budget(_))) {
            c.pause = None;
        }
        if c.pause.is_none() && !self.stopping {
            self.resume(&mut c);
        }
        self.put_back(c);
    }

    fn update_interest(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let want = c.desired_interest();
        if c.broken && c.registered {
            self.poll.delete(c.fd(), id);
            c.registered = false;
            return;
        }
        if c.registered && want != c.interest && self.poll.modify(c.fd(), want, id).is_ok() {
            c.interest = want;
        }
    }
}
