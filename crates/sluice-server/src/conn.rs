//! One client connection as the event loop holds it: where its input
//! stands (between frames, inside a header, assembling a body), why it is
//! not being read (a metadata call, the partial-frame budget, its own
//! reply bytes), and its queue of replies not yet written.
//!
//! Nothing here blocks or owns a thread: the event loop drives it.
//!
//! Invariant: a connection holds at most `reply_bytes_max` bytes of
//! admitted reads and writes and of read replies not yet written to its
//! socket (a message larger than that is admitted alone); past it the
//! connection is not read until its replies drain. While it is not read it
//! holds at most one complete frame (`blocked`) and one read's worth of
//! unprocessed bytes (`stash`, at most `SCRATCH_BYTES`).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_core::AppId;
use sluice_net::PeerCred;
use sluice_proto::{encode_response_head, Header, HEADER_BYTES};

use crate::net::Stream;
use crate::ops::Session;
use crate::pending::{response, Out};
use crate::shm::Shm;
use crate::state::AppTable;
use crate::sync::lock;

/// Bytes one read of a connection between frames takes in (the event
/// loop's scratch buffer): many small frames per system call.
pub const SCRATCH_BYTES: usize = 64 << 10;
/// Send buffer asked for per connection, in bytes: a 1 MiB reply then
/// leaves in one or two `sendmsg`s. Capped by `net.core.wmem_max`.
pub const SEND_BUFFER_BYTES: usize = 4 << 20;
/// Reply frames gathered into one `sendmsg` (two iovecs each).
const REPLY_BATCH_MAX: usize = 64;

/// Where the handshake stands.
pub enum Phase {
    /// Waiting for the `Hello`.
    Hello,
    /// Challenged: waiting for the `Auth` that proves the key over this
    /// nonce and the `Hello` (kept to finish the handshake with).
    Auth {
        nonce: [u8; sluice_proto::AUTH_BYTES],
        hello: (Header, Vec<u8>),
    },
    Ready,
}

/// Where the input stands.
pub enum Rx {
    /// Between frames.
    Idle,
    /// `got` bytes of a header arrived.
    Head { raw: [u8; HEADER_BYTES], got: usize, started: Instant },
    /// The header arrived; its body is arriving. `held` bytes of the
    /// partial-frame budget are taken (`body.len()` ≤ `held`, `body`'s
    /// capacity is `held`); the frame is due by `started + allowed`.
    Body { header: Header, body: Vec<u8>, held: u64, started: Instant, allowed: Duration },
}

/// Why a connection is not read now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pause {
    /// One of its metadata calls runs on the pool (its session is there).
    Meta,
    /// The partial-frame budget is spent; since when.
    Budget(Instant),
    /// Its reply bytes are at `reply_bytes_max`: it resumes once this
    /// many more fit (or none are held).
    Bytes(u64),
    /// Its user's share (`uid_bytes_max`) or the server's budget
    /// (`held_bytes_max`) has no room: it resumes once this many bytes
    /// fit (`evloop/fair.rs`).
    Room(u64),
}

/// A reply frame being written: its encoded head, then its payload.
struct OutFrame {
    head: Vec<u8>,
    data: Vec<u8>,
    sent: usize,
    /// Bytes to give back to the connection's reply bytes once sent.
    counted: u64,
    /// A descriptor sent with the frame's first byte (`SCM_RIGHTS`).
    fd: Option<OwnedFd>,
}

pub struct Conn {
    pub id: u64,
    pub stream: Stream,
    pub peer: io::Result<Option<PeerCred>>,
    pub phase: Phase,
    /// Its session; `None` while a metadata call has it (or before the
    /// handshake).
    pub session: Option<Box<Session>>,
    pub app: Option<AppId>,
    pub rx: Rx,
    /// Bytes read but not yet taken in (the connection paused mid-read).
    pub stash: Vec<u8>,
    /// A whole frame waiting for reply bytes to drain.
    pub blocked: Option<(Header, Vec<u8>)>,
    pub pause: Option<Pause>,
    /// No more frames are read: end of stream, a protocol error, the drain.
    pub read_closed: bool,
    /// The socket failed or the client stopped reading: replies are dropped.
    pub broken: bool,
    /// Reads and writes admitted and not yet answered.
    pub inflight: u32,
    /// Whether its client sends one request at a time (`Solo`).
    pub solo: Solo,
    /// Bytes held against `reply_bytes_max`.
    pub held: u64,
    /// Its user (after squash), once the handshake is done, and the
    /// counter of that user's bytes (`None`: root or the server's user,
    /// who have no per-user share), which `take`, `give`, `uid_take` and
    /// `uid_give` keep.
    pub uid: Option<u32>,
    uid_held: Option<Arc<AtomicU64>>,
    out: VecDeque<OutFrame>,
    /// The last flush left bytes unsent; since when nothing moved.
    pub out_stalled: Option<Instant>,
    pub accepted: Instant,
    pub last_frame: Instant,
    /// The epoll events registered now (0: none, or not registered).
    pub interest: u32,
    pub registered: bool,
    /// Its shared-memory data region, once attached.
    pub shm: Option<Arc<Shm>>,
    /// Queued on the loop's list of connections to flush.
    pub dirty: bool,
    /// The budget came back: take in what waited at the end of the turn.
    pub resume_pending: bool,
    /// Its doorbell is on the loop's watched list (rung requests).
    pub watched: bool,
    /// The region's `leased_bytes` when last added to the application's
    /// bytes written (`Conn::fold_leased`).
    pub leased_seen: u64,
}

/// Answers over which `Solo` takes the most requests a client had in
/// flight.
pub const SOLO_ANSWERS: u32 = 32;

/// Whether a client sends one request at a time, waiting for each answer
/// (the most it had in flight over the last `SOLO_ANSWERS` answers and
/// since is one): the loop spins for such a client's next request once it
/// has answered it (`EventLoop::spin`). A client that keeps several in
/// flight is not spun for: its requests come in bursts that a sleep
/// gathers into one turn.
#[derive(Debug, Default)]
pub struct Solo {
    peak: u32,
    last_peak: u32,
    answers: u32,
}

impl Solo {
    /// A request was admitted and `inflight` are now in flight, or the
    /// client rang `inflight` at once.
    pub fn admitted(&mut self, inflight: u32) {
        self.peak = self.peak.max(inflight);
    }

    /// A request was answered: whether the client is solo.
    pub fn answered(&mut self) -> bool {
        self.answers += 1;
        if self.answers >= SOLO_ANSWERS {
            self.last_peak = self.peak;
            self.peak = 0;
            self.answers = 0;
        }
        self.last_peak.max(self.peak) <= 1
    }
}

impl Conn {
    pub fn new(id: u64, stream: Stream, now: Instant) -> Conn {
        let peer = stream.peer_cred();
        Conn {
            id,
            stream,
            peer,
            phase: Phase::Hello,
            session: None,
            app: None,
            rx: Rx::Idle,
            stash: Vec::new(),
            blocked: None,
            pause: None,
            read_closed: false,
            broken: false,
            inflight: 0,
            solo: Solo::default(),
            held: 0,
            uid: None,
            uid_held: None,
            out: VecDeque::new(),
            out_stalled: None,
            accepted: now,
            last_frame: now,
            interest: 0,
            registered: false,
            shm: None,
            dirty: false,
            resume_pending: false,
            watched: false,
            leased_seen: 0,
        }
    }

    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    pub fn ready(&self) -> bool {
        matches!(self.phase, Phase::Ready)
    }

    /// Whether the loop should read this connection now.
    pub fn wants_input(&self) -> bool {
        !self.read_closed && !self.broken && self.pause.is_none()
    }

    /// The epoll events to register.
    pub fn desired_interest(&self) -> u32 {
        let mut ev = 0;
        if self.wants_input() {
            ev |= libc::EPOLLIN as u32;
        }
        if !self.broken && self.out_stalled.is_some() {
            ev |= libc::EPOLLOUT as u32;
        }
        ev
    }

    /// Nothing more will happen on this connection: it can be dropped.
    pub fn finished(&self) -> bool {
        self.pause != Some(Pause::Meta) && (self.broken || (self.read_closed && self.inflight == 0 && self.out.is_empty() && self.blocked.is_none()))
    }

    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Take `n` reply bytes.
    pub fn take(&mut self, n: u64, total: &AtomicU64) {
        self.held += n;
        total.fetch_add(n, Ordering::Relaxed);
        self.uid_take(n);
    }

    /// Give `n` reply bytes back.
    pub fn give(&mut self, n: u64, total: &AtomicU64) {
        self.held -= n;
        total.fetch_sub(n, Ordering::Relaxed);
        self.uid_give(n);
    }

    /// The handshake named its user: from now on its bytes count in
    /// `counter` too (`None`: a privileged user, counted nowhere), the
    /// bytes it holds already included.
    pub fn join_user(&mut self, uid: u32, counter: Option<Arc<AtomicU64>>) {
        self.uid = Some(uid);
        self.uid_held = counter;
        self.uid_take(self.held);
    }

    /// `n` bytes against its user's share only (a frame being received).
    pub fn uid_take(&mut self, n: u64) {
        if let Some(u) = &self.uid_held {
            u.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn uid_give(&mut self, n: u64) {
        if let Some(u) = &self.uid_held {
            u.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// Its user's bytes now (`None`: no share, a privileged user or no
    /// handshake yet).
    pub fn uid_held(&self) -> Option<u64> {
        self.uid_held.as_ref().map(|u| u.load(Ordering::Relaxed))
    }

    /// Ready, and nothing in flight, unsent, waiting or half-received: it
    /// can be closed without losing anything acknowledged.
    pub fn idle(&self) -> bool {
        self.ready() && self.inflight == 0 && self.out.is_empty() && self.blocked.is_none() && self.pause.is_none() && matches!(self.rx, Rx::Idle)
    }

    /// Queue a reply; `counted`: payload bytes to give back once written.
    pub fn push(&mut self, wire_id: u64, out: Out, counted: u64, total: &AtomicU64) {
        self.push_with(wire_id, out, counted, total, None);
    }

    /// Queue a reply that carries descriptor `fd`. Every byte of it counts
    /// against `reply_bytes_max` until written: `counted` bytes were
    /// reserved for it at admission; the difference is taken or given back.
    pub fn push_with(&mut self, wire_id: u64, out: Out, counted: u64, total: &AtomicU64, fd: Option<OwnedFd>) {
        if self.broken {
            self.give(counted, total);
            return;
        }
        let mut head = Vec::with_capacity(32);
        encode_response_head(wire_id, &response(&out), &mut head);
        let data = match out {
            Out::Data(d) => d,
            _ => Vec::new(),
        };
        let bytes = (head.len() + data.len()) as u64;
        if bytes > counted {
            self.take(bytes - counted, total);
        } else {
            self.give(counted - bytes, total);
        }
        self.out.push_back(OutFrame { head, data, sent: 0, counted: bytes, fd });
    }

    /// Write what the socket takes without blocking. Sets `out_stalled`
    /// when bytes remain, `broken` when the socket failed.
    pub fn flush(&mut self, now: Instant, total: &AtomicU64) {
        while !self.out.is_empty() && !self.broken {
            let mut iov: Vec<libc::iovec> = Vec::with_capacity(REPLY_BATCH_MAX * 2);
            // A frame with a descriptor leaves alone, the descriptor on its
            // first byte; the frames before it go first.
            let first_fd = self.out.front().and_then(|f| f.fd.as_ref().filter(|_| f.sent == 0)).map(|fd| fd.as_raw_fd());
            let batch = if first_fd.is_some() { 1 } else { self.out.iter().take(REPLY_BATCH_MAX).take_while(|f| f.fd.is_none()).count().max(1) };
            for f in self.out.iter().take(batch) {
                let (h, d) = if f.sent < f.head.len() { (&f.head[f.sent..], &f.data[..]) } else { (&f.head[..0], &f.data[f.sent - f.head.len()..]) };
                for part in [h, d] {
                    if !part.is_empty() {
                        iov.push(libc::iovec { iov_base: part.as_ptr() as *mut libc::c_void, iov_len: part.len() });
                    }
                }
            }
            let mut cmsg = [0u64; 4];
            // SAFETY: an all-zero msghdr is valid; iov points at live
            // buffers owned by `self.out` for the call's duration; the
            // control buffer (aligned, 32 bytes) holds one descriptor's
            // CMSG_SPACE.
            let r = unsafe {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = iov.as_mut_ptr();
                msg.msg_iovlen = iov.len() as _;
                if let Some(fd) = first_fd {
                    let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
                    msg.msg_control = cmsg.as_mut_ptr().cast();
                    msg.msg_controllen = space as _;
                    let c = libc::CMSG_FIRSTHDR(&msg);
                    (*c).cmsg_level = libc::SOL_SOCKET;
                    (*c).cmsg_type = libc::SCM_RIGHTS;
                    (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
                }
                libc::sendmsg(self.fd(), &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => {
                        self.out_stalled.get_or_insert(now);
                        return;
                    }
                    _ => {
                        self.break_output(total);
                        return;
                    }
                }
            }
            let mut n = r as usize;
            self.out_stalled = None;
            while n > 0 {
                let f = self.out.front_mut().expect("bytes were sent from a queued frame");
                let left = f.head.len() + f.data.len() - f.sent;
                // Sent, the descriptor went with it: the server's copy closes.
                f.fd = None;
                if n < left {
                    f.sent += n;
                    break;
                }
                n -= left;
                let f = self.out.pop_front().expect("present");
                self.give(f.counted, total);
            }
        }
        if self.out.is_empty() {
            self.out_stalled = None;
        }
    }

    /// Add what the client reports it wrote itself under write leases
    /// since the last look (the doorbell's `leased_bytes`,
    /// `sluice_proto::post`) to its application's bytes written. A count
    /// that went down (a client writing its own word) adds nothing until
    /// it passes what was seen.
    pub fn fold_leased(&mut self, apps: &Mutex<AppTable>) {
        let (Some(shm), Some(app)) = (self.shm.as_ref(), self.app) else { return };
        let now = shm.leased_bytes();
        if now > self.leased_seen {
            lock(apps).record_leased_write(app, now - self.leased_seen);
            self.leased_seen = now;
        }
    }

    /// The client is gone or stopped reading: drop every queued reply.
    pub fn break_output(&mut self, total: &AtomicU64) {
        self.broken = true;
        self.read_closed = true;
        let counted: u64 = self.out.drain(..).map(|f| f.counted).sum();
        self.give(counted, total);
        self.out_stalled = None;
    }
}

#[cfg(test)]
mod tests {
    use super::{Solo, SOLO_ANSWERS};

    #[test]
    fn a_client_is_solo_until_it_has_two_in_flight_and_again_a_full_window_later() {
        let mut s = Solo::default();
        for _ in 0..3 * SOLO_ANSWERS {
            s.admitted(1);
            assert!(s.answered(), "one at a time");
        }
        // Two in flight: not solo for the rest of this window and the whole
        // next one (the peak of the window before counts).
        s.admitted(2);
        let mut solo = Vec::new();
        for _ in 0..2 * SOLO_ANSWERS + 1 {
            solo.push(s.answered());
            s.admitted(1);
        }
        let first = solo.iter().position(|&b| b).expect("solo again");
        assert!(first >= SOLO_ANSWERS as usize && first < 2 * SOLO_ANSWERS as usize, "solo again after one to two windows, at answer {first}");
        assert!(solo[first..].iter().all(|&b| b));
    }

    #[test]
    fn the_window_is_solo_answers_long_at_n_and_n_plus_one() {
        // A peak of two seen in the first answer of a window is forgotten
        // after this window and the next: 2N answers, not 2N - 1.
        let mut s = Solo::default();
        s.admitted(2);
        for k in 1..2 * SOLO_ANSWERS {
            assert!(!s.answered(), "answer {k}: the peak is still in the last window");
        }
        assert!(s.answered(), "answer 2N: both windows without it");
    }
}
