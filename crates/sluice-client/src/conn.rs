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
use read_side::ReadSide;
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
    read: Mutex<ReadSide>,
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
            read: Mutex::new(ReadSide::new(BufReader::with_capacity(READ_BUFFER_BYTES, Rx { stream: r, lent: VecDeque::new(), timeout_ms, poll_first: false }))),
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
        if !self.patience.soft && crate::abandon::armed() {
            self.await_readable(g, id, queued)?;
        }
        loop {
            match g.input.fill_buf() {
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => self.out_of_patience(g)?,
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
    /// Only the thread holding the read side waits here: one blocked on
    /// the lock behind a live caller's wait leaves when that wait ends.
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
    fn out_of_patience(&self, g: &mut ReadSide) -> Result<()> {
        if self.patience.soft {
            let why = format!("sluice server at {} did not answer within {:?} (soft)", self.addr, self.patience.timeout);
            g.broken.get_or_insert_with(|| why.clone());
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
            let mut g = lock(&self.read);
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
                lock(&self.read).broken.get_or_insert(why.clone());
                return Err(self.lost(&why));
            }
        }
        Ok(id)
    }

    /// Replies kept for callers that have not come for them yet.
    pub(crate) fn replies_stashed(&self) -> usize {
        lock(&self.read).stash.len()
    }

    /// Wait for the reply to `id`. A `Data` reply that fits `into` is read
    /// straight into it (`Reply::DataInto`).
    pub(crate) fn wait(&self, id: u64, mut into: Option<&mut [u8]>) -> Result<Reply> {
        let asked = Instant::now();
        let mut g = lock(&self.read);
        let queued = asked.elapsed();
        loop {
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
                        // Not waiting for a thread that reads the socket.
                        if let Ok(mut g) = self.read.try_lock() {
                            g.broken.get_or_insert_with(|| why.clone());
                        }
                        return Err(self.lost(&why));
                    }
                    if since.elapsed() >= self.patience.timeout {
                        self.out_of_patience(&mut lock(&self.read))?;
                        since = Instant::now();
                    }
                }
            }
        }
    }

    /// Why the connection is gone, if it is: another thread found it
    /// broken, or the server closed or reset it.
    fn gone(&self) -> Option<String> {
        if let Ok(g) = self.read.try_lock() {
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
                match lock(&self.read).input.get_mut().lent.pop_front() {
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
mod tests {
    use super::recv::LENT_PENDING_MAX;
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::AtomicBool;

    /// Send one byte with `fd` attached, as the server sends a lease.
    fn send_fd(s: &UnixStream, fd: RawFd) {
        let mut cmsg = [0u64; 4];
        let byte = [0u8; 1];
        let mut iov = libc::iovec { iov_base: byte.as_ptr() as *mut _, iov_len: 1 };
        // SAFETY: an all-zero msghdr is valid; buffers live for the call;
        // the control message is built within `cmsg`.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cmsg.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), fd);
            assert_eq!(libc::sendmsg(s.as_raw_fd(), &msg, 0), 1);
        }
    }

    /// A connection to a socket the test answers by hand: the client side,
    /// and the server's end.
    pub(in crate::conn) fn by_hand() -> (Conn, UnixStream, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("sluice-conn-{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let patience = std::sync::Arc::new(Patience { timeout: Duration::from_secs(10), soft: false, warned: AtomicBool::new(false) });
        let c = Conn::open(&format!("unix:{}", path.display()), patience).unwrap();
        let (server, _) = l.accept().unwrap();
        (c, server, dir)
    }

    fn answer(server: &mut UnixStream, id: u64, resp: &sluice_proto::Response<'_>) {
        use std::io::Write;
        let mut out = Vec::new();
        sluice_proto::encode_response(id, resp, &mut out);
        server.write_all(&out).unwrap();
    }

    /// Request id 0 is never sent: an error under it is the server's
    /// reason for closing. Replies to requests in flight that follow it
    /// still reach their callers; the others are told the reason.
    #[test]
    fn the_servers_reason_for_closing_reaches_the_caller() {
        let (c, mut server, dir) = by_hand();
        let answered = c.send(&Request::Stat { path: "a" }).unwrap();
        let id = c.send(&Request::Stat { path: "" }).unwrap();
        answer(&mut server, 0, &sluice_proto::Response::Error { errno: libc::EBUSY, message: "server full (clients_max = 2)" });
        answer(&mut server, answered, &sluice_proto::Response::Count(7));
        drop(server);
        assert!(matches!(c.wait(answered, None).unwrap(), Reply::Count(7)), "a reply after the reason is delivered");
        let e = c.wait(id, None).unwrap_err();
        assert_eq!(e.kind, ClientErrorKind::Disconnected);
        assert!(e.message.contains("server full (clients_max = 2)"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A caller gone while a hard connection waits for a silent server:
    /// the call fails with EINTR within a slice, the reply that comes
    /// later is dropped, and the connection goes on.
    #[test]
    fn a_caller_gone_gives_its_wait_up_and_its_late_reply_is_dropped() {
        let (c, mut server, dir) = by_hand();
        let c = std::sync::Arc::new(c);
        let given_up = c.send(&Request::Stat { path: "a" }).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::sync::Arc::clone(&c);
        std::thread::spawn(move || {
            let _gone = crate::abandon::Abandon::when(|_| true, 0);
            let _ = tx.send(waiter.wait(given_up, None).map(|_| ()));
        });
        // Polled with a bound: a wait that never gives up fails the test.
        let e = rx.recv_timeout(Duration::from_secs(2)).expect("the wait gave up within a slice").unwrap_err();
        assert_eq!((e.kind, e.errno), (ClientErrorKind::Interrupted, libc::EINTR), "{e}");
        let next = c.send(&Request::Stat { path: "b" }).unwrap();
        answer(&mut server, given_up, &sluice_proto::Response::Count(1));
        answer(&mut server, next, &sluice_proto::Response::Count(2));
        assert!(matches!(c.wait(next, None).unwrap(), Reply::Count(2)));
        assert!(lock(&c.read).stash.is_empty(), "the late reply was kept");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A reply to a request never sent would sit in the stash for good:
    /// it breaks the connection instead; replies to requests sent wait
    /// there for their caller.
    #[test]
    fn a_reply_to_a_request_never_sent_breaks_the_connection() {
        let (c, mut server, dir) = by_hand();
        let first = c.send(&Request::Stat { path: "a" }).unwrap();
        let second = c.send(&Request::Stat { path: "b" }).unwrap();
        answer(&mut server, second, &sluice_proto::Response::Count(2));
        answer(&mut server, first, &sluice_proto::Response::Count(1));
        assert!(matches!(c.wait(first, None).unwrap(), Reply::Count(1)), "the later reply was stashed on the way");
        assert!(matches!(c.wait(second, None).unwrap(), Reply::Count(2)));
        let third = c.send(&Request::Stat { path: "c" }).unwrap();
        answer(&mut server, third + 5, &sluice_proto::Response::Count(9));
        let e = c.wait(third, None).unwrap_err();
        assert!(e.message.contains("never sent"), "{e}");
        assert!(lock(&c.read).stash.is_empty());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn lent_pending_max_at_n_and_n_plus_1() {
        let (server, client) = UnixStream::pair().unwrap();
        let mut rx = Rx { stream: Stream::Unix(client), lent: VecDeque::new(), timeout_ms: 5_000, poll_first: false };
        let null = std::fs::File::open("/dev/null").unwrap();
        let mut b = [0u8; 16];
        for _ in 0..LENT_PENDING_MAX {
            send_fd(&server, null.as_raw_fd());
        }
        // One message's descriptors per receive.
        for _ in 0..LENT_PENDING_MAX {
            assert_eq!(rx.recv(&mut b).unwrap(), 1);
        }
        assert_eq!(rx.lent.len(), LENT_PENDING_MAX, "N descriptors held for their replies");
        send_fd(&server, null.as_raw_fd());
        let e = rx.recv(&mut b).unwrap_err();
        assert!(e.to_string().contains("more descriptors"), "N+1 breaks the connection: {e}");
        // A claimed one makes room again.
        rx.lent.pop_front();
        rx.lent.pop_front();
        send_fd(&server, null.as_raw_fd());
        assert_eq!(rx.recv(&mut b).unwrap(), 1);
    }

    /// A process with no descriptor free: the kernel drops the one a
    /// message carries, and its reply goes on without it (the connection
    /// broke before, and the call waited out the patience).
    #[test]
    fn a_descriptor_dropped_for_want_of_room_leaves_a_hole_not_a_broken_connection() {
        // Lowering the descriptor limit would fail other tests' opens on
        // the harness's threads: the body runs alone, in a child process
        // of this binary.
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "conn::tests::descriptor_hole_alone", "--test-threads=1", "--nocapture"])
            .env("SLUICE_TEST_DESCRIPTOR_HOLE", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains("HOLE-OK"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    }

    /// The body of the test above; does nothing unless that test runs it.
    #[test]
    fn descriptor_hole_alone() {
        if std::env::var_os("SLUICE_TEST_DESCRIPTOR_HOLE").is_none() {
            return;
        }
        let (server, client) = UnixStream::pair().unwrap();
        let mut rx = Rx { stream: Stream::Unix(client), lent: VecDeque::new(), timeout_ms: 5_000, poll_first: false };
        let null = std::fs::File::open("/dev/null").unwrap();
        send_fd(&server, null.as_raw_fd());
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit/setrlimit on valid structs; the limit goes back.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
        // The lowest free descriptor's number as the limit: none is free.
        let lowest = std::fs::File::open("/dev/null").unwrap();
        let low = libc::rlimit { rlim_cur: lowest.as_raw_fd() as libc::rlim_t, rlim_max: lim.rlim_max };
        drop(lowest);
        // SAFETY: as above.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) };
        let mut b = [0u8; 16];
        let r = rx.recv(&mut b);
        // SAFETY: as above.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
        assert_eq!(r.unwrap(), 1);
        assert!(matches!(rx.lent.pop_front(), Some(None)), "a hole where the descriptor was");
        println!("HOLE-OK");
    }

    #[test]
    fn a_long_wait_sends_the_next_through_poll_which_keeps_the_patience() {
        use std::io::Write;
        let (mut server, client) = UnixStream::pair().unwrap();
        let mut rx = Rx { stream: Stream::Unix(client), lent: VecDeque::new(), timeout_ms: 50, poll_first: false };
        let mut b = [0u8; 16];
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            server.write_all(b"x").unwrap();
            server
        });
        assert_eq!(rx.recv(&mut b).unwrap(), 1);
        assert!(rx.poll_first, "a 20 ms wait is past POLL_AFTER_WAIT");
        let _server = late.join().unwrap();
        // Nothing comes: the poll gives up at the patience, as the
        // socket's receive timeout does for `recvmsg`.
        let t0 = Instant::now();
        let e = rx.recv(&mut b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() >= Duration::from_millis(45), "waited {:?}", t0.elapsed());
    }
}
