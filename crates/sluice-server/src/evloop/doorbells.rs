//! Doorbells: requests a client rings in its shared region's post records
//! (`sluice_proto::post`) instead of sending them. The loop looks at the
//! watched doorbells every turn, and at none while asleep (their clients
//! then nudge); before a sleep with short dispatches on the ring, or with
//! a client that sends one request at a time just answered, it spins a
//! little instead, while spinning pays.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sluice_proto::{check_header, encode_request, Request, HEADER_BYTES, NO_POST, POSTS_MAX};

use super::watched::{SPIN, SPIN_IDLE, SPIN_IDLE_QUICK};
use super::{EventLoop, Flow};
use crate::conn::{Conn, Phase};
use crate::pending::Out;
use crate::shm::Shm;

impl EventLoop {
    /// Before a sleep: look at the ring's completions and the watched
    /// doorbells for a while, and say whether one came. A completion seen
    /// here costs the loop no sleep and no wake-up (two context switches,
    /// 20-40 us on the 2-core VM, as long as a 4 KiB O_DIRECT read), and a
    /// rung request no `Nudge`. Two cases, each with its own credit
    /// (`SpinCredit`: spun only while spinning pays):
    /// - dispatches on the ring, the last one short (`SPIN_DISPATCH_NS`: a
    ///   longer one would mostly be spun for in vain, taking a core from
    ///   the clients): up to `SPIN`, paid by anything seen;
    /// - nothing on the ring, and the turn answered the last request of a
    ///   client that sends one at a time (`Conn::solo`) in its post
    ///   record: up to `SPIN_IDLE`, for that client's next request. Only
    ///   that request pays, and only if it took `SPIN_IDLE_QUICK` or more
    ///   to come: where another client's comes first the spin ends,
    ///   unpaid, so that many clients (a FUSE daemon's threads) do not
    ///   keep the loop spinning between them, and a client whose next
    ///   request was ready at once is one that pipelines.
    ///
    /// Sockets are not looked at while spinning: an unwatched client's
    /// request waits at most the spin. This spin reads the clock on every
    /// pass: it waits on it.
    pub(super) fn spin(&mut self) -> bool {
        let inflight = self.ring.as_ref().map_or(0, |r| r.inflight());
        let posted = self.doorbells.posted.take();
        let d = &mut self.doorbells;
        // `own`: the one client whose request alone pays (the idle spin).
        let (span, credit, own) = match (inflight > 0, posted) {
            (true, _) if d.spin_short => (SPIN, &mut d.spin_credit, None),
            (false, Some(shm)) => (SPIN_IDLE, &mut d.idle_credit, Some(shm)),
            _ => return false,
        };
        if !credit.may_spin() {
            return false;
        }
        let start = std::time::Instant::now();
        let until = start + span;
        let mut ring = self.ring.as_mut();
        loop {
            if own.as_ref().is_some_and(|shm| shm.rung()) {
                // At once: the client had it ready (it keeps several in
                // flight and the loop answers each as it comes); a sleep
                // would have gathered them into one turn.
                credit.paid(start.elapsed() >= SPIN_IDLE_QUICK);
                return true;
            }
            if ring.as_mut().is_some_and(|r| r.completed()) || d.watched.iter().any(|(_, shm)| shm.rung()) {
                credit.paid(own.is_none());
                return true;
            }
            if std::time::Instant::now() >= until {
                credit.paid(false);
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// Whether the loop may take `c`'s rung requests now: a ready
    /// connection with a post area, taking input, nothing blocked.
    fn rings(&self, c: &Conn) -> bool {
        !self.stopping && matches!(c.phase, Phase::Ready) && c.wants_input() && c.blocked.is_none() && c.shm.as_ref().is_some_and(|s| s.posts())
    }

    /// Take the requests rung on `c`'s doorbell, each as if its frame had
    /// come on the socket (parsed and checked the same way), answered in
    /// its own record (or on the socket, as a sent one would be). Stops
    /// where the connection pauses; the bits not taken ring again (a
    /// paused connection is looked at again when it resumes).
    pub(super) fn take_rung(&mut self, c: &mut Conn) -> Flow {
        if !self.rings(c) {
            return Flow::Next;
        }
        let shm = Arc::clone(c.shm.as_ref().expect("rings() checked"));
        let mut bits = shm.take_rung();
        // Several rung at once: the client has them in flight together,
        // whether or not the device answers each before the next is taken
        // (the null device and the page cache answer on the loop).
        c.solo.admitted(bits.count_ones());
        while bits != 0 {
            let k = bits.trailing_zeros();
            bits &= bits - 1;
            // The doorbell's own bit names no record.
            let Some((id, req)) = (k < POSTS_MAX).then(|| self.rung_request(c, &shm, k)).flatten() else { continue };
            let mut wire = Vec::with_capacity(HEADER_BYTES + 32);
            encode_request(id, &req, &mut wire).expect("a shared-memory request always encodes");
            let h = check_header(&wire, u32::MAX).ok().flatten().expect("a header just encoded");
            wire.drain(..HEADER_BYTES);
            match self.frame(c, h, std::borrow::Cow::Owned(wire)) {
                Flow::Next => {}
                Flow::Paused => {
                    shm.ring_again(bits);
                    return Flow::Paused;
                }
                Flow::Close => return Flow::Close,
            }
        }
        Flow::Next
    }

    /// The request rung in post record `k`, with its id; `None` (answered
    /// with an error) when the record names no operation.
    fn rung_request(&mut self, c: &mut Conn, shm: &Shm, k: u32) -> Option<(u64, Request<'static>)> {
        use sluice_proto::post::{RUNG_READ, RUNG_READ_LEASE, RUNG_WRITE, RUNG_WRITE_LEASE};
        let r = shm.rung_request(k);
        self.shared.rung.fetch_add(1, Ordering::Relaxed);
        let (fd, offset, len, at, post) = (r.fd, r.offset, r.len, r.at, k);
        let req = match r.op {
            RUNG_READ => Request::ReadShm { fd, offset, len, at, post },
            RUNG_WRITE => Request::WriteShm { fd, offset, len, at, post },
            RUNG_READ_LEASE => Request::ReadLease { fd, offset, len, at, post },
            RUNG_WRITE_LEASE => Request::WriteLease { fd, offset, len, at, post },
            op => {
                let msg = format!("post record {k} rings with operation {op}, not one of {RUNG_READ}..={RUNG_WRITE_LEASE}");
                self.error_on_socket(c, r.id, k, libc::EINVAL, msg);
                return None;
            }
        };
        Some((r.id, req))
    }

    /// A `Nudge`: watch `c`'s doorbell from now on if there is room, and
    /// take what it rang.
    pub(super) fn nudged(&mut self, c: &mut Conn) -> Flow {
        self.shared.nudges.fetch_add(1, Ordering::Relaxed);
        let Some(shm) = c.shm.as_ref().filter(|s| s.posts()) else { return Flow::Next };
        if !c.watched && !self.stopping {
            let max = self.shared.config.limits.doorbells_watched_max as usize;
            if let Some(n) = self.doorbells.watch(c.id, shm, max) {
                c.watched = true;
                self.shared.doorbells_watched.store(n, Ordering::Relaxed);
            }
        }
        self.take_rung(c)
    }

    /// Every turn: take the requests rung on the watched doorbells.
    pub(super) fn scan_doorbells(&mut self) {
        for i in 0..self.doorbells.watched.len() {
            let (id, ref shm) = self.doorbells.watched[i];
            if !shm.rung() || !self.conns.get(&id).is_some_and(|c| self.rings(c)) {
                continue;
            }
            let mut c = self.conns.remove(&id).expect("present");
            self.take_rung(&mut c);
            self.put_back(c);
        }
        self.complete();
    }

    /// Before sleeping: mark the watched doorbells unwatched, then look at
    /// them once more. False (and watched again) when one was rung
    /// meanwhile: the loop must not sleep. A client that rings after
    /// this sees its doorbell unwatched and nudges.
    pub(super) fn unwatch(&self) -> bool {
        self.doorbells.set_watched(false);
        let rung = self.doorbells.watched.iter().any(|(id, shm)| shm.rung() && self.conns.get(id).is_some_and(|c| self.rings(c)));
        if rung {
            self.doorbells.set_watched(true);
        }
        !rung
    }

    /// A request that named post record `post` is answered on the
    /// socket: say so in the record, so that its client reads the socket.
    pub(super) fn post_on_socket(&mut self, c: &Conn, post: u32, id: u64) {
        if post == NO_POST {
            return;
        }
        if let Some(shm) = c.shm.as_ref().filter(|s| s.posts()) {
            if shm.post(post, id, None) {
                self.wakes.push((Arc::clone(shm), post));
            }
        }
    }

    /// Answer request `id` with an error on the socket, its post record
    /// (if it named one) saying so.
    pub(super) fn error_on_socket(&mut self, c: &mut Conn, id: u64, post: u32, errno: i32, msg: String) {
        c.push(id, Out::Error(errno, msg), 0, &self.shared.reply_bytes);
        self.post_on_socket(c, post, id);
    }
}
