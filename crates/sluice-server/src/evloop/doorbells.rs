//! Doorbells: requests a client rings in its shared region's post records
//! (`sluice_proto::post`) instead of sending them. The loop looks at the
//! watched doorbells every turn, and at none while asleep (their clients
//! then nudge); before a sleep with short dispatches on the ring it spins
//! a little instead, while spinning pays.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sluice_proto::{check_header, encode_request, Request, HEADER_BYTES, NO_POST, POSTS_MAX};

use super::{EventLoop, Flow};
use crate::conn::{Conn, Phase};
use crate::pending::Out;
use crate::shm::Shm;

/// How long the loop spins before sleeping while dispatches are on the
/// ring (`EventLoop::spin`): about one 4 KiB O_DIRECT read on the 2-core VM.
const SPIN: Duration = Duration::from_micros(50);
/// The longest dispatch (as the learned model predicts its service) that
/// the loop spins for: twice `SPIN`.
pub const SPIN_DISPATCH_NS: u64 = 100_000;
/// Spins that saw nothing before the loop stops spinning, and the sleeps
/// after which it tries again.
const SPIN_CREDIT_MAX: u32 = 4;
const SPIN_RETRY: u32 = 64;

/// Whether the loop spins before a sleep (`EventLoop::spin`): credit for
/// spins that saw something, at most `SPIN_CREDIT_MAX`; at none, one try
/// every `SPIN_RETRY` sleeps.
#[derive(Debug)]
struct SpinCredit {
    credit: u32,
    skipped: u32,
}

impl Default for SpinCredit {
    fn default() -> SpinCredit {
        SpinCredit { credit: SPIN_CREDIT_MAX, skipped: 0 }
    }
}

impl SpinCredit {
    /// Whether this sleep may be spun for.
    fn may_spin(&mut self) -> bool {
        if self.credit > 0 {
            return true;
        }
        self.skipped += 1;
        if self.skipped < SPIN_RETRY {
            return false;
        }
        self.skipped = 0;
        true
    }

    /// A spin saw something (`true`) or spun for nothing.
    fn paid(&mut self, saw: bool) {
        self.credit = if saw { (self.credit + 1).min(SPIN_CREDIT_MAX) } else { self.credit.saturating_sub(1) };
    }
}

/// The watched doorbells, and whether spinning pays.
#[derive(Default)]
pub struct Doorbells {
    /// Connections whose doorbells the loop looks at on every turn (rung
    /// requests; at most `doorbells_watched_max`), with their regions, so
    /// that a turn looks at each doorbell without finding its connection.
    watched: Vec<(u64, Arc<Shm>)>,
    spin_credit: SpinCredit,
    /// The last dispatch put on the ring is one the learned model expects
    /// back within `SPIN_DISPATCH_NS`.
    pub spin_short: bool,
}

impl Doorbells {
    pub fn any(&self) -> bool {
        !self.watched.is_empty()
    }

    /// Mark every watched doorbell watched or not.
    pub fn set_watched(&self, on: bool) {
        for (_, shm) in &self.watched {
            shm.set_watched(on);
        }
    }

    /// Watch connection `id`'s doorbell if fewer than `max` are; whether
    /// it is watched now. The count watched.
    fn watch(&mut self, id: u64, shm: &Arc<Shm>, max: usize) -> Option<usize> {
        if self.watched.len() >= max {
            return None;
        }
        shm.set_watched(true);
        self.watched.push((id, Arc::clone(shm)));
        Some(self.watched.len())
    }

    /// Connection `id` is gone; the count watched.
    pub fn forget(&mut self, id: u64) -> usize {
        self.watched.retain(|(w, _)| *w != id);
        self.watched.len()
    }

    /// Watch none any more (the drain); the connections that were.
    pub fn unwatch_all(&mut self) -> Vec<u64> {
        self.set_watched(false);
        std::mem::take(&mut self.watched).into_iter().map(|(id, _)| id).collect()
    }
}

impl EventLoop {
    /// Before sleeping while dispatches are on the ring: look at its
    /// completions and the watched doorbells for up to `SPIN`, and say
    /// whether one came. A completion seen here costs the loop no sleep
    /// and no wake-up (two context switches, 20-40 us on the 2-core VM,
    /// as long as a 4 KiB O_DIRECT read), and a rung request no `Nudge`.
    /// Only for short dispatches (`SPIN_DISPATCH_NS`: a longer one would
    /// mostly be spun for in vain, taking a core from the clients), and
    /// only while spinning pays (`SpinCredit`). Sockets are not looked at
    /// while spinning: an unwatched client's request waits at most `SPIN`.
    /// This spin reads the clock on every pass: it waits on it.
    pub(super) fn spin(&mut self) -> bool {
        let Some(ring) = self.ring.as_mut() else { return false };
        let d = &mut self.doorbells;
        if ring.inflight() == 0 || !d.spin_short || !d.spin_credit.may_spin() {
            return false;
        }
        let until = std::time::Instant::now() + SPIN;
        loop {
            if ring.completed() || d.watched.iter().any(|(_, shm)| shm.rung()) {
                d.spin_credit.paid(true);
                return true;
            }
            if std::time::Instant::now() >= until {
                d.spin_credit.paid(false);
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

#[cfg(test)]
mod tests {
    use super::{SpinCredit, SPIN_CREDIT_MAX, SPIN_RETRY};

    #[test]
    fn spinning_stops_after_spin_credit_max_vain_spins_and_retries_every_spin_retry_sleeps() {
        let mut s = SpinCredit::default();
        // N vain spins are allowed; after them, none ...
        for _ in 0..SPIN_CREDIT_MAX {
            assert!(s.may_spin());
            s.paid(false);
        }
        // ... for SPIN_RETRY - 1 sleeps, then one try.
        for _ in 0..SPIN_RETRY - 1 {
            assert!(!s.may_spin());
        }
        assert!(s.may_spin(), "the retry");
        // A spin that saw something earns the next one back.
        s.paid(true);
        assert!(s.may_spin());
        s.paid(false);
        assert!(!s.may_spin(), "credit spent again");
        // Credit is bounded: any number of good spins buys SPIN_CREDIT_MAX vain ones.
        let mut s = SpinCredit::default();
        for _ in 0..100 {
            s.paid(true);
        }
        for _ in 0..SPIN_CREDIT_MAX {
            assert!(s.may_spin());
            s.paid(false);
        }
        assert!(!s.may_spin());
    }
}
