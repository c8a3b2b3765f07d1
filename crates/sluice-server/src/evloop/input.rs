//! Input: accept connections, receive their bytes, cut them into frames,
//! and hold a body that goes on past one read within the partial-frame
//! budget (`budget.rs`). Whole frames go on to `EventLoop::frame`
//! (`handshake.rs`).
//!
//! Bounds: `READS_PER_WAKE` reads of one connection per turn; a body is
//! allocated as it arrives, in chunks of at most `BODY_CHUNK_BYTES`; a body
//! that finds the budget spent waits, unread, until bytes drain; the table
//! holds at most twice `clients_max` connections.

use std::borrow::Cow;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sluice_net::Listener;
use sluice_proto::{check_header, Header, Opcode, HEADER_BYTES};

use super::fair::send_reason;
use super::poll::TOKEN_LISTENER;
use super::{EventLoop, Flow, BODY_CHUNK_BYTES};
use crate::config::FRAME_RATE_MIN_BYTES_PER_MS;
use crate::conn::{Conn, Pause, Phase, Rx, SCRATCH_BYTES, SEND_BUFFER_BYTES};

/// Reads of one connection per wake-up, so one busy client cannot keep
/// the loop from the others (level-triggered: the rest comes next turn).
const READS_PER_WAKE: usize = 16;
/// After a failed `accept` (out of descriptors), the listener rests this
/// long instead of waking the loop at once again.
const ACCEPT_REST: Duration = Duration::from_millis(100);

impl EventLoop {
    pub(super) fn accept_all(&mut self) {
        let Some(listener) = self.listener.take() else { return };
        self.accept_from(&listener);
        self.listener = Some(listener);
        self.complete();
    }

    fn accept_from(&mut self, listener: &Listener) {
        loop {
            let stream = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // Out of descriptors or memory: rest instead of spinning.
                    self.poll.delete(listener.fd(), TOKEN_LISTENER);
                    self.accept_rest_until = Some(self.now.at + ACCEPT_REST);
                    return;
                }
            };
            let fd = stream.as_raw_fd();
            // SAFETY: plain fcntl on a descriptor we own.
            unsafe { libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK) };
            stream.set_nodelay();
            stream.set_send_buffer(SEND_BUFFER_BYTES);
            let clients_max = self.shared.config.limits.clients_max as usize;
            if self.conns.len() >= 2 * clients_max && !self.evict_oldest_handshake(clients_max) {
                // The table holds at most twice `clients_max`: the clients
                // served and as many more connecting. Past that, the socket
                // that has waited longest for its handshake gives way (a
                // peer that connects and says nothing holds no slot for
                // long); where none waits, the new one is told so at once
                // (if its buffer takes it) and closed.
                send_reason(&stream, libc::EBUSY, &format!("server full (clients_max = {clients_max}, and as many more connecting)"));
                continue;
            }
            let id = self.conn_next;
            self.conn_next += 1;
            let mut c = Conn::new(id, stream, self.now.at);
            if self.poll.add(fd, libc::EPOLLIN as u32, id).is_err() {
                continue;
            }
            c.registered = true;
            c.interest = libc::EPOLLIN as u32;
            if let Err(e) = &c.peer {
                let msg = format!("cannot tell who the peer is (SO_PEERCRED): {e}");
                self.fail(&mut c, 0, libc::EACCES, msg);
                self.dirty_mark(&mut c);
            }
            self.arm(self.now.at + Duration::from_millis(self.shared.config.limits.handshake_timeout_ms));
            self.conns.insert(id, c);
            self.shared.conns_open.store(self.conns.len(), Ordering::Relaxed);
        }
    }

    /// Close the connection that has waited longest for its handshake,
    /// telling it why; `false` when every connection has done its own.
    fn evict_oldest_handshake(&mut self, clients_max: usize) -> bool {
        let Some(oldest) = self.conns.values().filter(|c| !matches!(c.phase, Phase::Ready)).map(|c| c.id).min() else { return false };
        if let Some(c) = self.conns.get(&oldest) {
            let msg = format!("handshake not done before newer connections came (clients_max = {clients_max}, and as many more connecting)");
            send_reason(&c.stream, libc::EBUSY, &msg);
        }
        self.shared.handshakes_evicted.fetch_add(1, Ordering::Relaxed);
        self.remove(oldest);
        true
    }

    pub(super) fn on_conn(&mut self, id: u64, flags: u32) {
        let Some(mut c) = self.conns.remove(&id) else { return };
        if flags & (libc::EPOLLOUT as u32) != 0 {
            c.out_stalled = None;
        }
        if c.wants_input() {
            self.read_conn(&mut c);
        } else if flags & ((libc::EPOLLHUP | libc::EPOLLERR) as u32) != 0 {
            // Gone while not being read: nothing can reach it any more.
            c.break_output(&self.shared.reply_bytes);
        }
        self.put_back(c);
    }

    /// Read until the socket would block, the connection pauses, or its
    /// share of this wake-up is used.
    pub(super) fn read_conn(&mut self, c: &mut Conn) {
        for _ in 0..READS_PER_WAKE {
            if !c.wants_input() {
                return;
            }
            let more = if matches!(c.rx, Rx::Body { .. }) { self.read_body(c) } else { self.read_frames(c) };
            if !more {
                return;
            }
        }
    }

    /// Between frames or inside a header: read into the scratch buffer and
    /// take in every frame there. `false` when there is nothing more to
    /// read now.
    fn read_frames(&mut self, c: &mut Conn) -> bool {
        // Whole frames in the read need no budget; a partial one at its
        // end reserves its body, or waits in the stash (at most this read).
        let room = SCRATCH_BYTES;
        let mut scratch = std::mem::take(&mut self.scratch);
        let got = recv(c.fd(), &mut scratch[..room]);
        let more = match got {
            Recv::Blocked => false,
            Recv::Closed => {
                self.end_of_stream(c);
                false
            }
            Recv::Got(n) => {
                let used = self.feed(c, &scratch[..n]);
                if used < n {
                    c.stash.extend_from_slice(&scratch[used..n]);
                }
                n == room
            }
            Recv::Failed => {
                c.break_output(&self.shared.reply_bytes);
                false
            }
        };
        self.scratch = scratch;
        more
    }

    /// The client closed its side: inside a frame that is an error;
    /// between frames, replies still go out.
    fn end_of_stream(&mut self, c: &mut Conn) {
        match &c.rx {
            Rx::Idle => {}
            Rx::Head { .. } => self.fail(c, 0, libc::EPROTO, "truncated frame header".into()),
            Rx::Body { header, .. } => {
                let (id, n) = (header.request_id, header.body_len);
                self.fail(c, id, libc::EPROTO, format!("truncated frame body: the connection closed before its {n} bytes arrived"));
            }
        }
        self.abandon_frame(c);
        c.read_closed = true;
    }

    /// Take in the frames in `bytes`; how many bytes were taken (the rest
    /// waits in the stash while the connection is paused).
    pub(super) fn feed(&mut self, c: &mut Conn, bytes: &[u8]) -> usize {
        let mut i = 0;
        while i < bytes.len() && c.wants_input() {
            let Some((raw, started, from_head)) = self.take_header(c, bytes, &mut i) else { return i };
            c.rx = Rx::Idle;
            let frame_start = i - HEADER_BYTES.min(i);
            let Some(header) = self.check_header(c, &raw) else { return bytes.len() };
            let n = header.body_len as usize;
            if bytes.len() - i >= n {
                let body = &bytes[i..i + n];
                i += n;
                match self.frame(c, header, Cow::Borrowed(body)) {
                    Flow::Next => continue,
                    Flow::Paused => return i,
                    Flow::Close => return bytes.len(),
                }
            }
            // The body goes on past this read: hold it as it arrives.
            return match self.begin_body(c, header, started, &bytes[i..]) {
                true => bytes.len(),
                false if from_head => {
                    // Not now: keep the frame's bytes (the header too).
                    c.stash.extend_from_slice(&raw);
                    i
                }
                false => frame_start,
            };
        }
        i
    }

    /// The header at `bytes[*i..]`, finishing one begun in an earlier read:
    /// its bytes, when it started, and whether it had begun before; `None`
    /// (every byte taken, `*i` at the end) when it is still incomplete.
    fn take_header(&mut self, c: &mut Conn, bytes: &[u8], i: &mut usize) -> Option<([u8; HEADER_BYTES], Instant, bool)> {
        match &mut c.rx {
            Rx::Head { raw, got, started } => {
                let n = (HEADER_BYTES - *got).min(bytes.len() - *i);
                raw[*got..*got + n].copy_from_slice(&bytes[*i..*i + n]);
                *got += n;
                *i += n;
                (*got == HEADER_BYTES).then_some((*raw, *started, true))
            }
            Rx::Idle if bytes.len() - *i < HEADER_BYTES => {
                let mut raw = [0u8; HEADER_BYTES];
                let n = bytes.len() - *i;
                raw[..n].copy_from_slice(&bytes[*i..]);
                *i = bytes.len();
                c.rx = Rx::Head { raw, got: n, started: self.now.at };
                self.arm(self.now.at + Duration::from_millis(self.shared.config.limits.frame_stall_ms));
                None
            }
            Rx::Idle => {
                let raw: [u8; HEADER_BYTES] = bytes[*i..*i + HEADER_BYTES].try_into().expect("a whole header");
                *i += HEADER_BYTES;
                Some((raw, self.now.at, false))
            }
            Rx::Body { .. } => unreachable!("bodies are read by read_body"),
        }
    }

    /// Check a whole header; `None` when it was refused (answered, and the
    /// connection reads no more). Before the handshake is done, only a
    /// handshake's size: a peer that proved nothing reserves no large body.
    fn check_header(&mut self, c: &mut Conn, raw: &[u8; HEADER_BYTES]) -> Option<Header> {
        let frame_max = match c.phase {
            Phase::Ready => self.shared.config.limits.frame_bytes_max,
            _ => sluice_proto::HANDSHAKE_FRAME_BYTES_MAX.min(self.shared.config.limits.frame_bytes_max),
        };
        match check_header(raw, frame_max) {
            Ok(Some(h)) => Some(h),
            Ok(None) => unreachable!("a whole header"),
            Err(e) => {
                self.fail(c, sluice_proto::request_id_of(raw), e.errno(), e.to_string());
                None
            }
        }
    }

    /// A body that goes on past this read, `tail` its first bytes: reserve
    /// it whole and start it (`true`), or pause the connection until its
    /// reply bytes drain or the budget has room (`false`).
    fn begin_body(&mut self, c: &mut Conn, header: Header, started: Instant, tail: &[u8]) -> bool {
        let n = header.body_len as usize;
        let wait_for_bytes = matches!(header.opcode, Opcode::Write | Opcode::WriteList | Opcode::WriteListGroup)
            && c.held > 0
            && c.held + u64::from(header.body_len) > self.shared.config.limits.reply_bytes_max;
        if wait_for_bytes {
            c.pause = Some(Pause::Bytes(u64::from(header.body_len)));
            return false;
        }
        if n as u64 > self.room(c) {
            self.starve(c, n as u64);
            return false;
        }
        if !self.budget.take(n as u64) {
            c.pause = Some(Pause::Budget(self.now.at));
            self.budget.wait(c.id);
            return false;
        }
        // The whole body is reserved now, allocated a chunk at a time.
        c.uid_take(n as u64);
        let mut body = Vec::with_capacity(n.min(BODY_CHUNK_BYTES).max(tail.len()));
        body.extend_from_slice(tail);
        self.allocated(body.capacity() as i64);
        let allowed = Duration::from_millis(self.shared.config.limits.frame_stall_ms + n as u64 / FRAME_RATE_MIN_BYTES_PER_MS);
        c.rx = Rx::Body { header, body, held: n as u64, started, allowed };
        self.arm(started + allowed);
        true
    }

    /// Inside a body: receive straight into it, chunk by chunk, each taken
    /// from the budget first. `false` when there is nothing more to read now.
    fn read_body(&mut self, c: &mut Conn) -> bool {
        let fd = c.fd();
        let Rx::Body { header, body, .. } = &mut c.rx else { return false };
        let (n, len) = (header.body_len as usize, body.len());
        let mut grown = 0;
        if len == body.capacity() && len < n {
            // The next chunk (its bytes were reserved with the header).
            let before = body.capacity();
            body.reserve_exact((n - len).min(BODY_CHUNK_BYTES));
            grown = body.capacity() - before;
        }
        let cap = body.capacity().min(n);
        // SAFETY: the spare capacity [len, cap) is allocated; recv
        // initialises the bytes it reports, and only those are kept.
        let got = if len < cap { unsafe { recv_raw(fd, body.as_mut_ptr().add(len), cap - len) } } else { Recv::Got(0) };
        if let Recv::Got(r) = got {
            // SAFETY: recv initialised the r bytes after len.
            unsafe { body.set_len(len + r) };
        }
        let whole = body.len() >= n;
        self.allocated(grown as i64);
        match got {
            Recv::Closed => {
                self.end_of_stream(c);
                return false;
            }
            Recv::Blocked => return false,
            Recv::Failed => {
                c.break_output(&self.shared.reply_bytes);
                return false;
            }
            Recv::Got(_) if !whole => return true,
            Recv::Got(_) => {}
        }
        let Rx::Body { header, body, held, .. } = std::mem::replace(&mut c.rx, Rx::Idle) else { unreachable!() };
        self.allocated(-(body.capacity() as i64));
        self.give_budget(held);
        c.uid_give(held);
        matches!(self.frame(c, header, Cow::Owned(body)), Flow::Next)
    }

    /// After a pause: the frame that waited, then the stash.
    pub(super) fn resume(&mut self, c: &mut Conn) {
        if let Some((h, body)) = c.blocked.take() {
            if let Flow::Paused | Flow::Close = self.frame(c, h, Cow::Owned(body)) {
                return;
            }
        }
        let stash = std::mem::take(&mut c.stash);
        if !stash.is_empty() && c.wants_input() {
            let used = self.feed(c, &stash);
            c.stash.extend_from_slice(&stash[used..]);
        } else {
            c.stash = stash;
        }
        // Requests rung while it was paused (an unwatched doorbell's
        // client nudged once for them).
        self.take_rung(c);
    }

    /// Give back the budget of a partial frame (closed, timed out, drained).
    pub(super) fn abandon_frame(&mut self, c: &mut Conn) {
        if let Rx::Body { held, body, .. } = std::mem::replace(&mut c.rx, Rx::Idle) {
            self.allocated(-(body.capacity() as i64));
            self.give_budget(held);
            c.uid_give(held);
        }
        c.stash = Vec::new();
    }

    /// Bytes allocated by bodies in progress changed by `delta`.
    fn allocated(&mut self, delta: i64) {
        let now = self.budget.allocate(delta);
        self.shared.partial_held.store(now, Ordering::Relaxed);
    }

    fn give_budget(&mut self, n: u64) {
        if !self.budget.give(n) {
            return;
        }
        // Connections waiting for the budget try again at the end of the
        // turn (`flush_dirty`), when no connection is out of the table;
        // until then they stay paused, so nothing overtakes their stash.
        for id in self.budget.take_waiting() {
            match self.conns.remove(&id) {
                Some(mut c) => {
                    c.resume_pending = true;
                    self.dirty_mark(&mut c);
                    self.conns.insert(id, c);
                }
                // Out of the table while the loop works on it (a removed
                // connection leaves this list in `remove`): it waits on.
                None => self.budget.wait(id),
            }
        }
    }
}

/// What a receive without blocking found.
enum Recv {
    Got(usize),
    /// End of stream.
    Closed,
    /// Nothing now.
    Blocked,
    Failed,
}

/// Receive into `buf` without blocking.
fn recv(fd: RawFd, buf: &mut [u8]) -> Recv {
    // SAFETY: buf is valid for its length during the call.
    unsafe { recv_raw(fd, buf.as_mut_ptr(), buf.len()) }
}

/// Receive at most `len` bytes at `buf` without blocking.
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes.
unsafe fn recv_raw(fd: RawFd, buf: *mut u8, len: usize) -> Recv {
    loop {
        // SAFETY: the caller passes `len` writable bytes at `buf`.
        let r = unsafe { libc::recv(fd, buf.cast(), len, libc::MSG_DONTWAIT) };
        match r {
            0 => return Recv::Closed,
            n if n > 0 => return Recv::Got(n as usize),
            _ => match io::Error::last_os_error().kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Recv::Blocked,
                _ => return Recv::Failed,
            },
        }
    }
}
