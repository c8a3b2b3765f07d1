//! The connection: framed sends under a write lock, and replies matched to
//! request ids under a read lock. Whoever waits reads the socket itself
//! ("leader reads"), stashing replies meant for other waiters, so a lone
//! caller pays no thread hand-off and a reply's payload lands straight in
//! the caller's buffer.
//!
//! Invariant: once the connection breaks, every waiting and every later
//! call fails with `Disconnected` (EIO) on this connection (the `Client`
//! then reconnects). A server that stops answering is noticed within the
//! connection's `Patience::timeout`: a hard connection says so once on
//! stderr and keeps waiting, a soft one fails the call with ETIMEDOUT and
//! is abandoned (poisoned), so no late reply is ever matched to a new call.
//! A hard connection waiting for a caller that may go away (the mount's:
//! `crate::abandon`) gives the call up with EINTR once it is gone, and
//! drops the late reply when it comes (`ReadSide::give_up`).

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sluice_net::Stream;
use sluice_proto::{check_header, encode_request_head, parse_response, AppStats, DirEntry, HelloOk, Opcode, Request, Response, WireStat, FRAME_BYTES_MAX, HEADER_BYTES};

use crate::error::{ClientError, ClientErrorKind, Result};
use crate::lock;

mod patience;
mod read_side;
mod recv;

pub(crate) use patience::Patience;
use read_side::{LeftOutside, ReadSide};
pub(crate) use recv::Reply;
use recv::{read_one, Rx, POST_CHECK};

/// Bytes of the reply read buffer.
const READ_BUFFER_BYTES: usize = 64 << 10;
/// Write payloads up to this size are copied behind the header and sent
/// with one system call; larger ones are sent from the caller's buffer.
const SMALL_WRITE_BYTES: usize = 64 << 10;

pub(crate) struct Conn {
    addr: String,
    output: Mutex<Stream>,
    read: parking_lot::Mutex<ReadSide>,
    /// What callers that left without the read side left for it.
    outside: LeftOutside,
    id_next: AtomicU64,
    patience: std::sync::Arc<Patience>,
    /// The socket, on a Unix connection: looked at (never read) by a
    /// thread waiting on a post record, to notice the server gone.
    unix_fd: Option<RawFd>,
}

/// Open a socket to `addr` (`unix:PATH` or `tcp:HOST:PORT`), on a high
/// descriptor number (`sluice_net::out_of_the_way`).
fn dial(addr: &str) -> Result<Stream> {
    if !addr.starts_with("unix:") && !addr.starts_with("tcp:") {
        return Err(ClientError::invalid(format!("bad server address {addr:?}: expected unix:PATH or tcp:HOST:PORT")));
    }
    let s = Stream::connect(addr)
        .map_err(|e| ClientError::new(ClientErrorKind::Connect, e.raw_os_error().unwrap_or(libc::ECONNREFUSED), format!("cannot connect to sluice server at {addr}: {e}")))?;
    Ok(s.out_of_the_way())
}

impl Conn {
    pub(crate) fn open(addr: &str, patience: std::sync::Arc<Patience>) -> Result<Conn> {
        let s = dial(addr)?;
        let r = s
            .try_clone()
            .map(Stream::out_of_the_way)
            .map_err(|e| ClientError::new(ClientErrorKind::Connect, libc::EIO, format!("cannot connect to sluice server at {addr}: {e}")))?;
        // A frame that stalls half-way, or a send into a server that stopped
        // reading, breaks the connection after the same patience.
        let _ = s.set_write_timeout(Some(patience.timeout));
        let _ = r.set_read_timeout(Some(patience.timeout));
        let timeout_ms = patience.timeout.as_millis().clamp(1, libc::c_int::MAX as u128) as libc::c_int;
        let unix_fd = match &s {
            Stream::Unix(u) => Some(u.as_raw_fd()),
            Stream::Tcp(_) => None,
        };
        Ok(Conn {
            addr: addr.to_string(),
            output: Mutex::new(s),
            read: parking_lot::Mutex::new(ReadSide::new(BufReader::with_capacity(READ_BUFFER_BYTES, Rx { stream: r, lent: VecDeque::new(), timeout_ms, poll_first: false }))),
            outside: LeftOutside::default(),
            id_next: AtomicU64::new(1),
            patience,
            unix_fd,
        })
    }

    /// Wait for the next frame to start arriving: one receive into the
    /// read buffer (on a Unix socket, after a long wait, a `poll` for
    /// readability first: `Rx::recv` says why), bounded by the patience
    /// (the socket's receive timeout, or the `poll`'s). `Err` for a
    /// soft connection past its patience (which abandons the connection).
    fn await_frame(&self, g: &mut ReadSide, id: u64, queued: Duration) -> Result<()> {
        if !g.input.buffer().is_empty() {
            return Ok(());
        }
        if self.may_leave() {
            self.await_readable(g, id, queued)?;
        }
        loop {
            match g.input.fill_buf() {
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => self.out_of_patience(|why| {
                    g.broken.get_or_insert(why);
                })?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Bytes, end of stream or an error: `read_one` tells which.
                _ => {
                    self.patience.answered(&self.addr);
                    return Ok(());
                }
            }
        }
    }

    /// A hard connection's wait for request `id` on behalf of a caller
    /// that may go away (the mount's): the socket is polled in slices of
    /// `CHECK_EVERY`, the caller's check run between them, so a caller
    /// gone gives the call up (EINTR) however long the server stays
    /// silent; its reply, when it comes, is dropped (`ReadSide::give_up`).
    /// Only the thread holding the read side waits here; a caller that may
    /// go away waits for the read side in slices too (`read_side::acquire`).
    /// Returns once the socket has something (a frame, its end, an error).
    /// The check (a read of `/proc` for the mount) runs only after a slice
    /// without an answer, or at once when the call waited half a slice or
    /// more for the read side (`queued`): the callers of a killed job that
    /// waited in turn leave one after another without a slice each. The
    /// cost on a quick answer is this `poll(2)` before the receive.
    fn await_readable(&self, g: &mut ReadSide, id: u64, queued: Duration) -> Result<()> {
        let fd = g.input.get_ref().stream.as_raw_fd();
        let slice = crate::abandon::CHECK_EVERY;
        let mut since = Instant::now();
        let mut check_now = queued >= slice / 2;
        loop {
            if check_now {
                if let Err(e) = crate::abandon::check("waiting for an answer") {
                    g.give_up(id);
                    return Err(e);
                }
                // A break another caller found without the read side.
                self.outside.settle(g);
                if let Some(why) = &g.broken {
                    return Err(self.lost(why));
                }
            }
            let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one live pollfd; the descriptor lives as long as `g`.
            match unsafe { libc::poll(&mut pfd, 1, slice.as_millis() as libc::c_int) } {
                0 => check_now = true,
                // A signal with a handler: look again (and at the caller).
                n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => check_now = true,
                // Readable (the receive need not `poll` again), or an end
                // or an error that the receive will report.
                n => {
                    if n > 0 {
                        g.input.get_mut().poll_first = false;
                    }
                    return Ok(());
                }
            }
            if since.elapsed() >= self.patience.timeout {
                self.patience.warn(&self.addr);
                since = Instant::now();
            }
        }
    }

    /// The patience ran out waiting for a reply (the socket's receive
    /// timeout): a soft connection fails with ETIMEDOUT and is abandoned;
    /// a hard one says so (once per outage) and waits on.
    /// `broken` breaks the connection (the read side's, or what is left
    /// for it).
    fn out_of_patience(&self, broken: impl FnOnce(String)) -> Result<()> {
        if self.patience.soft {
            let why = format!("sluice server at {} did not answer within {:?} (soft)", self.addr, self.patience.timeout);
            broken(why.clone());
            return Err(ClientError::new(ClientErrorKind::Timeout, libc::ETIMEDOUT, why));
        }
        self.patience.warn(&self.addr);
        Ok(())
    }

    /// Refuse a server on a Unix socket that runs as neither root nor
    /// `expected` (default: this process's euid), before anything is sent.
    pub(crate) fn check_server(&self, expected: Option<u32>) -> Result<()> {
        lock(&self.output).check_server(expected).map_err(|e| {
            let errno = e.raw_os_error().unwrap_or(libc::EACCES);
            let hint = format!("pass --server-uid UID or set {}=UID to trust that user's server", crate::SERVER_UID_ENV);
            ClientError::new(ClientErrorKind::Connect, errno, format!("sluice server at {} is not trusted: {e}; {hint}", self.addr))
        })
    }

    /// Whether the connection is TCP (the server then wants the key).
    pub(crate) fn is_tcp(&self) -> bool {
        self.addr.starts_with("tcp:")
    }

    /// Whether this call's caller may go away while it waits on this
    /// connection (a hard one: a soft one gives up on its own).
    fn may_leave(&self) -> bool {
        !self.patience.soft && crate::abandon::armed()
    }

    fn lost(&self, why: &str) -> ClientError {
        ClientError::new(ClientErrorKind::Disconnected, libc::EIO, format!("connection to sluice server at {} lost: {why}", self.addr))
    }

    /// Send one request; its id, for `wait`. `data` is the trailing payload
    /// of a write, sent from the caller's buffer.
    pub(crate) fn send(&self, req: &Request<'_>) -> Result<u64> {
        let id = self.id_next.fetch_add(1, Ordering::Relaxed);
        let mut head = Vec::with_capacity(64);
        encode_request_head(id, req, &mut head).map_err(|e| ClientError::new(ClientErrorKind::Invalid, e.errno(), e.to_string()))?;
        let data: &[u8] = match req {
            Request::Write { data, .. } | Request::WriteList { data, .. } => data,
            _ => &[],
        };
        let mut out = lock(&self.output);
        let r = if data.len() <= SMALL_WRITE_BYTES {
            head.extend_from_slice(data);
            out.write_all(&head)
        } else {
            out.write_all(&head).and_then(|()| out.write_all(data))
        };
        drop(out);
        if let Err(e) = r {
            let mut g = match read_side::acquire(&self.read, &self.outside, id, self.may_leave()) {
                Ok(g) => g,
                Err(gone) => {
                    self.outside.break_with(e.to_string());
                    return Err(gone);
                }
            };
            self.outside.settle(&mut g);
            if g.broken.is_none() && g.closing.is_none() && matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) {
                // The server closed first, perhaps saying why (server
                // full): what it sent is still to be read.
                if let Ok((rid, r)) = read_one(&mut g.input, 0, None) {
                    g.file(rid, r, self.id_next.load(Ordering::Relaxed));
                }
            }
            let why = g.closing.take().unwrap_or_else(|| e.to_string());
            let why = g.broken.get_or_insert(why).clone();
            return Err(self.lost(&why));
        }
        Ok(id)
    }

    /// Leave `req` (a shared-memory request in `slot`, armed) in the
    /// slot's post record and ring the doorbell; nudge the server when it
    /// does not watch the doorbell now (`sluice_proto::post`). The id, as
    /// `send`'s.
    pub(crate) fn ring(&self, req: &Request<'_>, slot: &crate::shm::Slot) -> Result<u64> {
        use sluice_proto::post::{RUNG_READ, RUNG_READ_LEASE, RUNG_WRITE, RUNG_WRITE_LEASE};
        let (op, fd, offset, len) = match *req {
            Request::ReadShm { fd, offset, len, .. } => (RUNG_READ, fd, offset, len),
            Request::WriteShm { fd, offset, len, .. } => (RUNG_WRITE, fd, offset, len),
            Request::ReadLease { fd, offset, len, .. } => (RUNG_READ_LEASE, fd, offset, len),
            Request::WriteLease { fd, offset, len, .. } => (RUNG_WRITE_LEASE, fd, offset, len),
            _ => return self.send(req),
        };
        let id = self.id_next.fetch_add(1, Ordering::Relaxed);
        slot.write_rung(op, id, fd, offset, len);
        let (mask, watched, _) = slot.region.doorbell();
        // Sequentially consistent on both words, as the server's side: it
        // clears `watched` and then reads the mask before sleeping.
        mask.fetch_or(1 << slot.index, Ordering::SeqCst);
        if watched.load(Ordering::SeqCst) == 0 {
            let mut nudge = Vec::with_capacity(HEADER_BYTES);
            sluice_proto::encode_header(Opcode::Nudge, 0, 0, &mut nudge);
            if let Err(e) = lock(&self.output).write_all(&nudge) {
                let why = e.to_string();
                self.outside.break_with(why.clone());
                return Err(self.lost(&why));
            }
        }
        Ok(id)
    }

    /// Request `id`'s caller is gone, and the read side's holder is to
    /// drop its reply (stashed already, or still to come).
    pub(crate) fn give_up_outside(&self, id: u64) {
        self.outside.give_up(id);
    }

    /// Replies kept for callers that have not come for them yet.
    pub(crate) fn replies_stashed(&self) -> usize {
        let mut g = self.read.lock();
        self.outside.settle(&mut g);
        g.stash.len()
    }

    /// Wait for the reply to `id`. A `Data` reply that fits `into` is read
    /// straight into it (`Reply::DataInto`).
    pub(crate) fn wait(&self, id: u64, mut into: Option<&mut [u8]>) -> Result<Reply> {
        let asked = Instant::now();
        let mut g = read_side::acquire(&self.read, &self.outside, id, self.may_leave())?;
        let queued = asked.elapsed();
        loop {
            self.outside.settle(&mut g);
            if let Some(r) = g.stash.remove(&id) {
                return r.map_err(|(errno, m)| ClientError::new(ClientErrorKind::Server, errno, m));
            }
            if let Some(why) = &g.broken {
                return Err(self.lost(why));
            }
            self.await_frame(&mut g, id, queued)?;
            match read_one(&mut g.input, id, into.as_deref_mut()) {
                Ok((rid, r)) if rid == id => return r.map_err(|(errno, m)| ClientError::new(ClientErrorKind::Server, errno, m)),
                Ok((rid, r)) => g.file(rid, r, self.id_next.load(Ordering::Relaxed)),
                Err(e) => {
                    g.broken = Some(g.closing.take().unwrap_or_else(|| e.to_string()));
                }
            }
        }
    }

    /// Wait for the answer to `id`, sent through `slot` if any: in the
    /// slot's post record when the region has them (`wait_posted`), else on
    /// the socket (`wait`, a `Data` reply read into `into`).
    pub(crate) fn answer(&self, id: u64, slot: Option<&crate::shm::Slot>, into: Option<&mut [u8]>) -> Result<Reply> {
        match slot.and_then(|sl| sl.post()) {
            Some(post) => self.wait_posted(id, &post),
            None => self.wait(id, into),
        }
    }

    /// Wait for the answer to `id`, a request that named post record
    /// `post`: a `Count` there, or (the record says so) a frame on the
    /// socket. Sleeps on the record's futex word in slices of
    /// `POST_CHECK`, looking between them at the socket for a server gone
    /// (the server answers every such request in its record, or closes
    /// the connection) and at the patience, as `wait` does.
    fn wait_posted(&self, id: u64, post: &crate::shm::Post<'_>) -> Result<Reply> {
        use sluice_proto::post::{POST_COUNTED, POST_ON_SOCKET, POST_PENDING, POST_SLEEPING};
        let mut since = Instant::now();
        loop {
            match post.state.load(Ordering::Acquire) {
                POST_COUNTED => {
                    self.patience.answered(&self.addr);
                    let (rid, n) = (post.id.load(Ordering::Relaxed), post.count.load(Ordering::Relaxed));
                    if rid != id {
                        return Err(self.lost(&format!("post record answered request {rid}, not {id}")));
                    }
                    return Ok(Reply::Count(n));
                }
                POST_ON_SOCKET => return self.wait(id, None),
                POST_PENDING => {
                    let _ = post.state.compare_exchange(POST_PENDING, POST_SLEEPING, Ordering::AcqRel, Ordering::Acquire);
                }
                _ => {
                    let slice = POST_CHECK.min(self.patience.timeout);
                    let ts = libc::timespec { tv_sec: slice.as_secs() as libc::time_t, tv_nsec: slice.subsec_nanos() as libc::c_long };
                    // SAFETY: FUTEX_WAIT on a live, aligned word of the
                    // shared region (not PRIVATE: the waker is the server
                    // process), with a live timeout.
                    let r =
                        unsafe { libc::syscall(libc::SYS_futex, post.state.as_ptr(), libc::FUTEX_WAIT, POST_SLEEPING, &ts as *const libc::timespec, std::ptr::null::<u32>(), 0) };
                    if r == 0 || post.state.load(Ordering::Acquire) != POST_SLEEPING {
                        continue;
                    }
                    crate::abandon::check("waiting for an answer")?;
                    if let Some(why) = self.gone() {
                        // Not waiting for a thread that reads the socket:
                        // one that does sees the end itself, after the
                        // replies before it.
                        if let Some(mut g) = self.read.try_lock() {
                            g.broken.get_or_insert_with(|| why.clone());
                        }
                        return Err(self.lost(&why));
                    }
                    if since.elapsed() >= self.patience.timeout {
                        // Not waiting for the read side's holder either.
                        self.out_of_patience(|why| self.outside.break_with(why))?;
                        since = Instant::now();
                    }
                }
            }
        }
    }

    /// Why the connection is gone, if it is: another thread found it
    /// broken, or the server closed or reset it.
    fn gone(&self) -> Option<String> {
        if let Some(mut g) = self.read.try_lock() {
            self.outside.settle(&mut g);
            if let Some(why) = &g.broken {
                return Some(why.clone());
            }
        }
        let fd = self.unix_fd?;
        let mut pfd = libc::pollfd { fd, events: libc::POLLRDHUP, revents: 0 };
        // SAFETY: one live pollfd; the descriptor lives as long as `self`.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        (n > 0 && pfd.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0).then(|| "server closed the connection".to_string())
    }

    /// Ask for a shared-memory region (right after the handshake, with
    /// nothing else in flight): the answer's descriptor is the one `Rx`
    /// queued with it, the only one queued then. `None` when the server
    /// refused (the socket path stays).
    pub(crate) fn attach_shm(&self, bytes: u64, posts: bool, ring: bool) -> Result<Option<crate::shm::Region>> {
        match self.call(&Request::ShmAttach { bytes }) {
            Ok(Reply::Count(granted)) => {
                match self.read.lock().input.get_mut().lent.pop_front() {
                    Some(Some(fd)) => Ok(crate::shm::Region::map(&fd, granted, posts, ring).ok()),
                    // No descriptor free to take it: no region.
                    Some(None) => Ok(None),
                    None => Err(self.lost("shared-memory answer without its descriptor")),
                }
            }
            Ok(_) | Err(ClientError { kind: ClientErrorKind::Server, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Send and wait.
    pub(crate) fn call(&self, req: &Request<'_>) -> Result<Reply> {
        let id = self.send(req)?;
        self.wait(id, None)
    }
}

#[cfg(test)]
pub(crate) mod tests;
