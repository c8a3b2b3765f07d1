//! The connection's read half: the buffered socket, the replies read for
//! callers that have not come for them yet, and the calls given up.

use std::collections::{HashMap, HashSet};
use std::io::BufReader;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, MutexGuard};

use super::recv::Rx;
use crate::error::Result;

/// Calls given up (their callers gone) whose replies have not come yet.
/// One more means the server answers none of them: the connection is
/// broken instead, and the `Client` reconnects.
pub(super) const GIVEN_UP_MAX: usize = 1_024;

/// A reply as read: the reply, or the server's errno and message.
type Answer = std::result::Result<super::Reply, (i32, String)>;

pub(super) struct ReadSide {
    pub(super) input: BufReader<Rx>,
    pub(super) stash: HashMap<u64, Answer>,
    /// Requests whose caller gave up waiting: their replies are dropped
    /// when they come. At most `GIVEN_UP_MAX`.
    given_up: HashSet<u64>,
    pub(super) broken: Option<String>,
    /// The server's reason for closing (an error under request id 0, which
    /// no request has): replies to requests in flight may still come
    /// before the end, which then carries this reason.
    pub(super) closing: Option<String>,
}

impl ReadSide {
    pub(super) fn new(input: BufReader<Rx>) -> ReadSide {
        ReadSide { input, stash: HashMap::new(), given_up: HashSet::new(), broken: None, closing: None }
    }

    /// Keep a frame no caller is waiting for now (`sent_below`: the next
    /// request id). Request id 0 is never sent: an error under it is the
    /// server's reason for closing the connection (full, handshake or
    /// frame timed out); the end follows, after the replies to requests
    /// still in flight. A reply to a request never sent, which nothing
    /// would take, breaks the connection. A reply to a call given up is
    /// dropped. Any other waits in the stash.
    pub(super) fn file(&mut self, rid: u64, r: Answer, sent_below: u64) {
        match (rid, r) {
            (0, Err((_, why))) => self.closing = Some(why),
            (rid, _) if rid == 0 || rid >= sent_below => self.broken = Some(format!("the server answered request {rid}, which was never sent")),
            (rid, _) if self.given_up.remove(&rid) => {}
            (rid, r) => {
                self.stash.insert(rid, r);
            }
        }
    }

    /// The caller waiting for request `id` is gone: its reply will be
    /// dropped. Past `GIVEN_UP_MAX` such calls the connection breaks.
    pub(super) fn give_up(&mut self, id: u64) {
        if self.given_up.len() >= GIVEN_UP_MAX {
            self.broken.get_or_insert_with(|| format!("{GIVEN_UP_MAX} calls given up and still unanswered"));
            return;
        }
        self.given_up.insert(id);
    }
}

/// What callers left for the read side's holder without taking it: calls
/// given up while another caller held it (`acquire`), and a reason to
/// break the connection (a failed send or nudge, a soft timeout on a post
/// record). The holder applies them (`settle`) at each frame, after each
/// empty slice of its wait, and whenever it takes the read side.
#[derive(Default)]
pub(super) struct LeftOutside {
    inner: std::sync::Mutex<Outside>,
    /// Something is left: read without the lock at each `settle`.
    any: AtomicBool,
}

#[derive(Default)]
struct Outside {
    /// At most `GIVEN_UP_MAX`; one more breaks the connection.
    given_up: Vec<u64>,
    broken: Option<String>,
}

impl LeftOutside {
    /// Request `id`'s caller is gone without having held the read side.
    pub(super) fn give_up(&self, id: u64) {
        let mut o = crate::lock(&self.inner);
        if o.given_up.len() >= GIVEN_UP_MAX {
            o.broken.get_or_insert_with(|| format!("{GIVEN_UP_MAX} calls given up and still unanswered"));
        } else {
            o.given_up.push(id);
        }
        self.any.store(true, Ordering::Release);
    }

    /// The connection is broken (`why`), found by a caller that left
    /// without the read side.
    pub(super) fn break_with(&self, why: String) {
        crate::lock(&self.inner).broken.get_or_insert(why);
        self.any.store(true, Ordering::Release);
    }

    /// Apply what was left to the read side: a given-up call's reply,
    /// stashed already, is dropped; one still to come will be.
    pub(super) fn settle(&self, g: &mut ReadSide) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut o = crate::lock(&self.inner);
        for id in o.given_up.drain(..) {
            if g.stash.remove(&id).is_none() {
                g.give_up(id);
            }
        }
        if let Some(why) = o.broken.take() {
            g.broken.get_or_insert(why);
        }
        self.any.store(false, Ordering::Release);
    }
}

/// The read side, for the caller of request `id`. One that may go away
/// (`armed`: the mount's, on a hard connection) waits for it in slices of
/// `CHECK_EVERY`, running its check between them: killed while a live
/// caller holds the read side (waiting for a silent server, perhaps for
/// good), it leaves with EINTR, its call given up in `outside`. Others
/// wait until the holder is done, as long as that takes.
pub(super) fn acquire<'a>(read: &'a Mutex<ReadSide>, outside: &LeftOutside, id: u64, armed: bool) -> Result<MutexGuard<'a, ReadSide>> {
    if !armed {
        return Ok(read.lock());
    }
    loop {
        if let Some(g) = read.try_lock_for(crate::abandon::CHECK_EVERY) {
            return Ok(g);
        }
        if let Err(e) = crate::abandon::check("waiting for the connection") {
            outside.give_up(id);
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::os::unix::net::UnixStream;

    use super::*;

    fn read_side() -> (ReadSide, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let rx = Rx { stream: sluice_net::Stream::Unix(ours), lent: VecDeque::new(), timeout_ms: 1_000, poll_first: false };
        (ReadSide::new(BufReader::new(rx)), theirs)
    }

    #[test]
    fn a_given_up_reply_is_dropped_and_others_kept() {
        let (mut g, _peer) = read_side();
        g.give_up(3);
        g.file(3, Err((libc::EIO, "late".into())), 10);
        g.file(4, Err((libc::EIO, "kept".into())), 10);
        assert!(!g.stash.contains_key(&3) && g.stash.contains_key(&4));
        assert!(g.given_up.is_empty(), "the answered call leaves the set");
    }

    #[test]
    fn given_up_calls_bound_at_n_and_n_plus_one() {
        let (mut g, _peer) = read_side();
        for id in 1..=GIVEN_UP_MAX as u64 {
            g.give_up(id);
        }
        assert!(g.broken.is_none(), "N calls given up: the connection goes on");
        g.give_up(GIVEN_UP_MAX as u64 + 1);
        assert!(g.broken.as_deref().is_some_and(|w| w.contains("given up")), "N+1 breaks it: {:?}", g.broken);
    }

    /// Calls given up without the read side share the bound: N are
    /// settled as given up, one more breaks the connection. A reply
    /// stashed already is dropped instead.
    #[test]
    fn calls_given_up_outside_bound_at_n_and_n_plus_one() {
        let out = LeftOutside::default();
        let (mut g, _peer) = read_side();
        g.file(1, Err((libc::EIO, "came first".into())), 10);
        for id in 1..=GIVEN_UP_MAX as u64 {
            out.give_up(id);
        }
        out.settle(&mut g);
        assert!(g.broken.is_none(), "N calls given up: the connection goes on");
        assert!(g.stash.is_empty(), "the stashed reply of a call given up is dropped");
        assert_eq!(g.given_up.len(), GIVEN_UP_MAX - 1, "the others wait for their replies");
        let (mut g, _peer) = read_side();
        for id in 1..=GIVEN_UP_MAX as u64 {
            out.give_up(id);
        }
        assert!(crate::lock(&out.inner).broken.is_none(), "N kept outside");
        out.give_up(GIVEN_UP_MAX as u64 + 1);
        {
            let o = crate::lock(&out.inner);
            assert_eq!(o.given_up.len(), GIVEN_UP_MAX, "N+1 is not kept");
            assert!(o.broken.as_deref().is_some_and(|w| w.contains("given up")), "N+1 breaks it outside: {:?}", o.broken);
        }
        out.settle(&mut g);
        assert!(g.broken.as_deref().is_some_and(|w| w.contains("given up")), "N+1 breaks it: {:?}", g.broken);
        assert!(!out.any.load(Ordering::Acquire), "nothing left after a settle");
        let (mut g, _peer) = read_side();
        out.settle(&mut g);
        assert!(g.broken.is_none() && g.given_up.is_empty(), "settled once");
    }
}

#[cfg(test)]
mod queued {
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use sluice_proto::Request;

    use crate::abandon::Abandon;
    use crate::error::ClientErrorKind;

    /// Two callers of a killed job on one connection to a silent server:
    /// the one reading the socket leaves after a slice; the one queued
    /// behind it for the read side then leaves at once (it waited that
    /// long already), not after a slice of its own.
    #[test]
    fn callers_queued_for_the_read_side_leave_one_after_another() {
        let (c, _server, dir) = super::super::tests::by_hand();
        let c = Arc::new(c);
        let (tx, rx) = mpsc::channel();
        // Both start waiting together: the second waits a slice for the
        // read side.
        let start = Arc::new(std::sync::Barrier::new(2));
        for name in ["a", "b"] {
            let (c, tx, start) = (Arc::clone(&c), tx.clone(), Arc::clone(&start));
            std::thread::spawn(move || {
                let id = c.send(&Request::Stat { path: name }).unwrap();
                let _gone = Abandon::when(|_| true, 0);
                start.wait();
                let r = c.wait(id, None).map(|_| ()).map_err(|e| e.kind);
                let _ = tx.send((r, Instant::now()));
            });
        }
        let mut left = Vec::new();
        for _ in 0..2 {
            let (r, at) = rx.recv_timeout(Duration::from_secs(3)).expect("each caller gave up");
            assert_eq!(r, Err(ClientErrorKind::Interrupted));
            left.push(at);
        }
        // A slice apart would mean the second polled a slice of its own.
        let gap = left[1].duration_since(left[0]);
        assert!(gap < crate::abandon::CHECK_EVERY / 2, "the second left {gap:?} after the first");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A caller of a killed job queued behind a live caller that waits
    /// for a silent server (as long as it takes, on a hard connection):
    /// it leaves within a slice or two, not when the live one is
    /// answered. The live caller then gets its answer, and the gone
    /// one's, read on the way, is not kept.
    #[test]
    fn a_caller_gone_leaves_while_a_live_one_holds_the_read_side() {
        use crate::conn::Reply;
        use sluice_proto::Response;
        let (c, mut server, dir) = super::super::tests::by_hand();
        let c = Arc::new(c);
        let live = c.send(&Request::Stat { path: "live" }).unwrap();
        let gone = c.send(&Request::Stat { path: "gone" }).unwrap();
        let (tx, rx) = mpsc::channel();
        let (c1, tx1) = (Arc::clone(&c), tx.clone());
        std::thread::spawn(move || {
            let r = c1.wait(live, None).map(|r| matches!(r, Reply::Count(1))).map_err(|e| e.kind);
            let _ = tx1.send(("live", r, Duration::ZERO));
        });
        let held = Instant::now();
        while c.read.try_lock().is_some() {
            assert!(held.elapsed() < Duration::from_secs(5), "the live caller never took the read side");
            std::thread::sleep(Duration::from_millis(1));
        }
        let c2 = Arc::clone(&c);
        std::thread::spawn(move || {
            let _gone = Abandon::when(|_| true, 0);
            let asked = Instant::now();
            let r = c2.wait(gone, None).map(|_| true).map_err(|e| e.kind);
            let _ = tx.send(("gone", r, asked.elapsed()));
        });
        let (who, r, took) = rx.recv_timeout(Duration::from_secs(3)).expect("the gone caller left while the live one waited");
        assert_eq!((who, r), ("gone", Err(ClientErrorKind::Interrupted)));
        // A slice or two; the bound leaves room for a loaded machine.
        assert!(took < Duration::from_secs(1), "it left after {took:?}");
        assert!(rx.try_recv().is_err(), "the live caller still waits");
        super::super::tests::answer(&mut server, gone, &Response::Count(2));
        super::super::tests::answer(&mut server, live, &Response::Count(1));
        let (who, r, _) = rx.recv_timeout(Duration::from_secs(3)).expect("the live caller was answered");
        assert_eq!((who, r), ("live", Ok(true)));
        // The gone caller's reply, read by the live one on its way, is
        // not kept (dropped at that caller's next frame, or by the next
        // holder).
        let next = c.send(&Request::Stat { path: "next" }).unwrap();
        super::super::tests::answer(&mut server, next, &Response::Count(3));
        assert!(matches!(c.wait(next, None).unwrap(), Reply::Count(3)));
        assert_eq!(c.replies_stashed(), 0, "the gone caller's reply was kept");
        let _ = std::fs::remove_dir_all(dir);
    }
}
