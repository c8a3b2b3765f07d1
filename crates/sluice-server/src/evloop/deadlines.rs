//! Deadlines (`ServerLimits`): `handshake_timeout_ms` before the
//! handshake, `idle_timeout_s` between frames with nothing in flight,
//! `frame_stall_ms` plus one millisecond per `FRAME_RATE_MIN_BYTES_PER_MS`
//! once a frame started (time spent waiting for the budget not counted),
//! `write_timeout_s` for a reply queue that does not move, and each
//! collective's wait. They are checked by a sweep over the connections at
//! the earliest one due (`next_sweep`), which also bounds the loop's sleep.

use std::time::{Duration, Instant};

use super::poll::TOKEN_LISTENER;
use super::EventLoop;
use crate::config::ServerLimits;
use crate::conn::{Conn, Rx};
use crate::ring::Ring;

/// The time limits, as durations.
struct Limits {
    handshake: Duration,
    idle: Duration,
    stall: Duration,
    write: Duration,
}

impl Limits {
    fn of(l: &ServerLimits) -> Limits {
        Limits {
            handshake: Duration::from_millis(l.handshake_timeout_ms),
            idle: Duration::from_secs(l.idle_timeout_s),
            stall: Duration::from_millis(l.frame_stall_ms),
            write: Duration::from_secs(l.write_timeout_s),
        }
    }
}

/// Keep the sooner of `due` and `t` in `due`.
fn sooner(due: &mut Option<Instant>, t: Instant) {
    *due = Some(due.map_or(t, |d| d.min(t)));
}

fn ms_until(t: Instant, now: Instant) -> i64 {
    let d = t.saturating_duration_since(now);
    (d.as_micros().div_ceil(1000)) as i64
}

impl EventLoop {
    /// A deadline falls due at `deadline`: sweep then at the latest.
    pub(super) fn arm(&mut self, deadline: Instant) {
        self.next_sweep = Some(self.next_sweep.map_or(deadline, |t| t.min(deadline)));
    }

    /// How long `epoll_wait` may sleep: until the scheduler's wake-up, the
    /// next deadline, the listener's rest, or for ever (from the turn's
    /// `now`, which the turn's work has made a little stale: the sleep
    /// ends that much late, at most a turn's length).
    pub(super) fn timeout_ms(&self, wake_at: Option<u64>) -> libc::c_int {
        let now = self.now;
        let mut t: Option<i64> = wake_at.map(|w| (w.saturating_sub(now.ns)).div_ceil(1_000_000) as i64);
        for d in [self.next_sweep, self.accept_rest_until].into_iter().flatten() {
            let ms = ms_until(d, now.at);
            t = Some(t.map_or(ms, |x| x.min(ms)));
        }
        if !self.dirty.is_empty() {
            // Connections changed after the turn's flush: look again now.
            return 0;
        }
        if self.ring.as_ref().is_some_and(Ring::pending) {
            // Submissions the kernel did not take yet: try again soon.
            t = Some(t.map_or(1, |x| x.min(1)));
        }
        if self.stopping {
            // Draining: look again often (executors and pool wake us too).
            t = Some(t.map_or(10, |x| x.min(10)));
        }
        t.map_or(-1, |x| x.clamp(0, i32::MAX as i64) as libc::c_int)
    }

    /// The end of a turn: the listener's rest, and the sweep when due.
    pub(super) fn deadlines(&mut self) {
        if self.accept_rest_until.is_some_and(|t| self.now.at >= t) {
            self.accept_rest_until = None;
            if let Some(l) = &self.listener {
                let _ = self.poll.add(l.fd(), libc::EPOLLIN as u32, TOKEN_LISTENER);
            }
        }
        if self.next_sweep.is_some_and(|t| self.now.at >= t) {
            self.sweep();
            self.flush_dirty();
        }
    }

    /// Enforce every connection's deadline; find the next one.
    fn sweep(&mut self) {
        // First, so that a connection whose last message expired here gets
        // its idle deadline from the loop below.
        self.expire_collectives(false);
        self.complete();
        let limits = Limits::of(&self.shared.config.limits);
        let mut next: Option<Instant> = None;
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            let mut c = self.conns.remove(&id).expect("listed");
            if let Some(d) = self.enforce(&mut c, &limits) {
                sooner(&mut next, d);
            }
            self.put_back(c);
        }
        if let Some(d) = self.collectives.next_deadline() {
            sooner(&mut next, d);
        }
        self.next_sweep = next;
    }

    /// Enforce `c`'s deadlines: a stalled reply queue is dropped, a
    /// stalled frame or handshake answered `ETIMEDOUT`, an idle connection
    /// closed without a word (clients reconnect). Its next deadline.
    fn enforce(&mut self, c: &mut Conn, l: &Limits) -> Option<Instant> {
        let now = self.now.at;
        let mut due: Option<Instant> = None;
        if let Some(since) = c.out_stalled {
            if now >= since + l.write {
                c.break_output(&self.shared.reply_bytes);
            } else {
                sooner(&mut due, since + l.write);
            }
        }
        if c.read_closed || c.broken {
            return due;
        }
        let frame_limit = self.shared.config.limits.frame_stall_ms;
        let late = match &c.rx {
            Rx::Head { started, .. } => now >= *started + l.stall,
            Rx::Body { started, allowed, .. } => now >= *started + *allowed,
            Rx::Idle => false,
        };
        if late && c.wants_input() && pending(c.fd()) {
            // Bytes of the frame wait in the socket although no wake-up
            // said so: epoll has been seen not to report a readable Unix
            // socket (the loop's simulated-I/O test, a client mid-body).
            // What the client sent in time counts: read it, and judge
            // the frame on it below (still partial: stalled). The loop
            // turns again at once, for what the read admitted.
            self.read_conn(c);
            due = Some(now);
        }
        match &c.rx {
            Rx::Head { started, .. } if now >= *started + l.stall => self.fail(c, 0, libc::ETIMEDOUT, format!("frame header stalled (frame_stall_ms = {frame_limit})")),
            Rx::Head { started, .. } => sooner(&mut due, *started + l.stall),
            Rx::Body { header, body, started, allowed, .. } if now >= *started + *allowed => {
                let (wid, n, got) = (header.request_id, header.body_len, body.len());
                self.fail(c, wid, libc::ETIMEDOUT, format!("frame body stalled: {got} of {n} bytes in time (frame_stall_ms = {frame_limit}, then 1 MiB/s)"));
            }
            Rx::Body { started, allowed, .. } => sooner(&mut due, *started + *allowed),
            Rx::Idle if c.inflight == 0 && c.ready() && c.pause.is_none() && c.stash.is_empty() && c.blocked.is_none() => {
                if now >= c.last_frame + l.idle {
                    c.read_closed = true;
                } else {
                    sooner(&mut due, c.last_frame + l.idle);
                }
            }
            Rx::Idle => {}
        }
        if c.pause.is_some() || c.resume_pending {
            // Looked at again while paused: when the pause ends the idle or
            // stall deadline applies again.
            sooner(&mut due, now + l.stall.min(l.idle));
        }
        if !c.ready() && !c.read_closed {
            if now >= c.accepted + l.handshake {
                let msg = format!("handshake not completed in time (handshake_timeout_ms = {})", self.shared.config.limits.handshake_timeout_ms);
                self.fail(c, 0, libc::ETIMEDOUT, msg);
            } else {
                sooner(&mut due, c.accepted + l.handshake);
            }
        }
        due
    }
}

/// Whether bytes wait to be read on socket `fd`.
fn pending(fd: std::os::fd::RawFd) -> bool {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through a live pointer.
    (unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) }) == 0 && n > 0
}
