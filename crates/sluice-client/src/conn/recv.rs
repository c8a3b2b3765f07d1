//! The receiving side of a connection: the socket's `recvmsg` that keeps
//! the descriptors a frame carries (`Rx`), one reply frame read and checked
//! (`read_one`: the header through `sluice_proto::check_header`, a `Data`
//! payload straight into the caller's buffer), and the reply made owned
//! (`Reply`), a lent descriptor matched to its lease.

use super::*;

/// A reply, owned.
#[derive(Debug)]
pub(crate) enum Reply {
    HelloOk(HelloOk),
    Ok,
    Fd(u64, u64),
    Data(Vec<u8>),
    /// A `Data` reply already copied into the caller's buffer: its length.
    DataInto(usize),
    Count(u64),
    Stat(WireStat),
    Link(String),
    Text(String),
    Statfs(sluice_proto::WireStatfs),
    Dir(Vec<DirEntry>, bool),
    Stats(Vec<AppStats>),
    Challenge([u8; sluice_proto::AUTH_BYTES]),
    /// A cache lease: offset, bytes, how long it is good for, and the
    /// descriptor lent with it (the first lease of a handle).
    Lease(u64, u64, Duration, Option<OwnedFd>),
}

impl Reply {
    /// A short description for error messages: never the data itself.
    pub(crate) fn describe(&self) -> String {
        match self {
            Reply::HelloOk(_) => "HelloOk".into(),
            Reply::Ok => "Ok".into(),
            Reply::Fd(fd, ino) => format!("Fd({fd}, inode {ino})"),
            Reply::Data(d) => format!("Data({} bytes)", d.len()),
            Reply::DataInto(n) => format!("Data({n} bytes)"),
            Reply::Count(n) => format!("Count({n})"),
            Reply::Stat(_) => "Stat".into(),
            Reply::Link(_) => "Link".into(),
            Reply::Text(_) => "Text".into(),
            Reply::Statfs(_) => "Statfs".into(),
            Reply::Dir(e, _) => format!("Dir({} entries)", e.len()),
            Reply::Stats(a) => format!("Stats({} applications)", a.len()),
            Reply::Challenge(_) => "Challenge".into(),
            Reply::Lease(o, n, _, fd) => format!("Lease({o}+{n}{})", if fd.is_some() { ", lent" } else { "" }),
        }
    }
}

/// `r`, owned; a lease that says it lends a descriptor takes the next one
/// received (`lent`; `None` when the process had no descriptor free to
/// take it, and the lease is then used without one), or fails when none
/// came.
pub(super) fn owned(r: Response<'_>, lent: &mut VecDeque<Option<OwnedFd>>) -> io::Result<std::result::Result<Reply, (i32, String)>> {
    Ok(Ok(match r {
        Response::HelloOk(h) => Reply::HelloOk(h),
        Response::Ok => Reply::Ok,
        Response::Fd(fd, ino) => Reply::Fd(fd, ino),
        Response::Data(d) => Reply::Data(d.to_vec()),
        Response::Count(n) => Reply::Count(n),
        Response::Stat(s) => Reply::Stat(s),
        Response::Link(t) => Reply::Link(t),
        Response::Text(t) => Reply::Text(t),
        Response::Statfs(f) => Reply::Statfs(f),
        Response::Dir { entries, done } => Reply::Dir(entries, done),
        Response::Stats(a) => Reply::Stats(a),
        Response::Challenge { nonce } => Reply::Challenge(nonce),
        Response::Lease { offset, len, valid_us, lent: false } => Reply::Lease(offset, len, Duration::from_micros(u64::from(valid_us)), None),
        Response::Lease { offset, len, valid_us, lent: true } => {
            let fd = lent.pop_front().ok_or_else(|| io::Error::other("bad reply: a lease that lends a descriptor came without one"))?;
            Reply::Lease(offset, len, Duration::from_micros(u64::from(valid_us)), fd)
        }
        Response::Error { errno, message } => return Ok(Err((errno, message.to_string()))),
    }))
}

/// Descriptors one receive takes at most; the kernel hands over those of
/// one message per `recvmsg`, and the server attaches one per frame.
pub(super) const FDS_PER_RECEIVE_MAX: usize = 4;
/// A receive that took at least this long slept (a shorter one found its
/// bytes there): only those choose how the next receive waits.
pub(super) const SLEPT_MIN: Duration = Duration::from_micros(5);
/// After a wait this long the next receive sleeps in `poll` (`Rx::recv`).
pub(super) const POLL_AFTER_WAIT: Duration = Duration::from_micros(100);
/// A thread asleep on a post record wakes this often to look at the
/// socket for a server gone (`Conn::wait_posted`): how late a dead
/// server is noticed.
pub(super) const POST_CHECK: Duration = Duration::from_millis(50);
/// Descriptors received and not yet claimed by their lease reply. A
/// server that sends more is broken: the connection is dropped.
pub(super) const LENT_PENDING_MAX: usize = 64;

/// The receiving half of the socket: `read` is a `recvmsg` that keeps the
/// descriptors a frame carries (`SCM_RIGHTS`, Unix sockets), in order, for
/// the reply that says it lends one. The kernel delivers a message's
/// descriptors with its first byte, so they are queued before their frame
/// is parsed.
pub(crate) struct Rx {
    pub(super) stream: Stream,
    /// `None` for a message whose descriptor the kernel could not hand
    /// over (the process had none free: `MSG_CTRUNC` with nothing).
    pub(super) lent: VecDeque<Option<OwnedFd>>,
    /// How long a receive waits (the patience), for `poll`.
    pub(super) timeout_ms: libc::c_int,
    /// The last wait was long: wait in `poll` first (`recv`).
    pub(super) poll_first: bool,
}

impl Rx {
    pub(super) fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let fd: RawFd = match &self.stream {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(_) => return self.stream.read(buf),
        };
        // After a long wait, sleep in `poll`, not in `recvmsg`. A Unix
        // stream socket wakes every task asleep on the sender's socket when
        // the peer consumes what it sent (`unix_write_space`, "room to
        // write again"): a task blocked in `recvmsg` is woken by that too,
        // finds nothing and sleeps again, one wasted context switch per
        // request, since the server reads each request while its client
        // waits for the answer. `poll` waits for readability only. But on
        // an idle machine (a virtual one at least) that early wake-up is
        // what brings the client's CPU out of its idle state in time for
        // the answer: a lone client's round trip was 7-10 us slower with
        // `poll`. So a wait that took less than `POLL_AFTER_WAIT` (a quick
        // server, an idle machine) leaves the next one in `recvmsg`, and a
        // longer one (a loaded server: the wasted wake-up costs CPU that
        // others wait for; a slow device: the `poll` is noise beside it)
        // sends the next one through `poll`.
        let started = Instant::now();
        if self.poll_first {
            let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one live pollfd.
            match unsafe { libc::poll(&mut pfd, 1, self.timeout_ms) } {
                0 => return Err(io::Error::from(io::ErrorKind::TimedOut)),
                n if n < 0 => return Err(io::Error::last_os_error()),
                _ => {}
            }
        }
        let mut cmsg = [0u64; 2 + FDS_PER_RECEIVE_MAX];
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        // SAFETY: an all-zero msghdr is valid; the iovec and control
        // buffer are live for the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cmsg) as _;
        // SAFETY: msg points at live buffers.
        let r = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        let waited = started.elapsed();
        if waited >= SLEPT_MIN {
            self.poll_first = waited >= POLL_AFTER_WAIT;
        }
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut got = 0usize;
        // SAFETY: the kernel filled msg's control buffer; the macros walk
        // it within msg_controllen.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let n = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<libc::c_int>();
                    for i in 0..n {
                        let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>().add(i));
                        self.lent.push_back(Some(sluice_net::out_of_the_way(OwnedFd::from_raw_fd(raw))));
                        got += 1;
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            if got > 0 {
                return Err(io::Error::other("the server sent more descriptors in one message than its replies claim"));
            }
            // The process has no descriptor free: the kernel dropped the
            // one this message carried. Its reply goes on without it (it
            // used to break the connection, and the call waited out the
            // patience before failing).
            self.lent.push_back(None);
        }
        if self.lent.len() > LENT_PENDING_MAX {
            return Err(io::Error::other("the server sent more descriptors than its replies claim"));
        }
        Ok(r as usize)
    }
}

impl Read for Rx {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv(buf)
    }
}

pub(super) type Frame = (u64, std::result::Result<Reply, (i32, String)>);

/// Read one reply frame; a `Data` reply for `want` goes into `into`.
pub(super) fn read_one(input: &mut BufReader<Rx>, want: u64, into: Option<&mut [u8]>) -> io::Result<Frame> {
    let mut h = [0u8; HEADER_BYTES];
    input.read_exact(&mut h).map_err(|e| if e.kind() == io::ErrorKind::UnexpectedEof { io::Error::other("server closed the connection") } else { e })?;
    let bad = |e: String| io::Error::other(format!("bad reply: {e}"));
    let header = check_header(&h, FRAME_BYTES_MAX).map_err(|e| bad(e.to_string()))?.ok_or_else(|| bad("short header".into()))?;
    let n = header.body_len as usize;
    if let (true, Opcode::Data, Some(buf)) = (header.request_id == want, header.opcode, into) {
        if n <= buf.len() {
            input.read_exact(&mut buf[..n])?;
            return Ok((want, Ok(Reply::DataInto(n))));
        }
    }
    let mut body = vec![0u8; n];
    input.read_exact(&mut body)?;
    let resp = parse_response(&header, &body).map_err(|e| bad(e.to_string()))?;
    Ok((header.request_id, owned(resp, &mut input.get_mut().lent)?))
}
