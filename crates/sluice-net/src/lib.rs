//! # sluice-net: one stream type for Unix and TCP sockets (and the page-cache check that server and client share, `cache`)
//!
//! The server, the client and the cluster's metadata role all speak over
//! `unix:PATH` or `tcp:HOST:PORT`. This crate is the one place a connected
//! socket of either kind is wrapped (and where both servers bind theirs:
//! [`Listen`], [`Listener`]), so each of them calls the same methods
//! whatever the transport. It knows nothing of frames or requests (that is
//! `sluice-proto`'s job) and spawns no threads.
//!
//! ```no_run
//! use std::io::Write;
//! let mut s = sluice_net::Stream::connect("unix:/tmp/sluice.sock").expect("a listening server");
//! s.set_nodelay();
//! s.write_all(b"hello").unwrap();
//! ```

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

pub mod cache;
pub mod key;
mod listen;

pub use listen::{Listen, Listener};

/// Who is at the other end of a Unix socket, as the kernel recorded it at
/// `connect` (`SO_PEERCRED`, `SO_PEERGROUPS`): the client cannot claim it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups at connect time.
    pub groups: Vec<u32>,
}

/// `SO_PEERGROUPS` (Linux 4.13), spelled out where libc lacks it.
const SO_PEERGROUPS: libc::c_int = 59;
/// Most supplementary groups read from `SO_PEERGROUPS` (Linux's NGROUPS_MAX).
const PEER_GROUPS_MAX: usize = 65_536;

/// How long a TCP connection attempt to one address may take. A host that
/// drops the SYNs (down, or filtered) would otherwise hold the caller for
/// the kernel's SYN retries, about two minutes, whatever the caller's own
/// patience; with a lock held (a forwarder member's, a data server's slot)
/// every other caller would wait too.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connected socket.
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

/// Move a descriptor a library keeps to a number of at least
/// `min(512, RLIMIT_NOFILE / 2)` (close-on-exec), away from the numbers a
/// program picks itself: the interposer runs inside programs that do (a
/// shell's `exec 3>file` made its file take over the client's socket on
/// fd 3, and a reconnect then closed the shell's fd 3). Kept where it is
/// when no higher number is free.
pub fn out_of_the_way(fd: OwnedFd) -> OwnedFd {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills a valid struct.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { 1024 };
    let min = (soft / 2).clamp(10, 512) as libc::c_int;
    if fd.as_raw_fd() >= min {
        return fd;
    }
    // SAFETY: fcntl on a descriptor we own; a new one comes back.
    let r = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
    if r < 0 {
        return fd;
    }
    // SAFETY: a fresh descriptor we now own; the old one closes on drop.
    unsafe { OwnedFd::from_raw_fd(r) }
}

impl Stream {
    /// This stream on a descriptor `out_of_the_way`.
    pub fn out_of_the_way(self) -> Stream {
        match self {
            Stream::Unix(u) => Stream::Unix(UnixStream::from(out_of_the_way(OwnedFd::from(u)))),
            Stream::Tcp(t) => Stream::Tcp(TcpStream::from(out_of_the_way(OwnedFd::from(t)))),
        }
    }

    /// Connect to `unix:PATH` or `tcp:HOST:PORT` (TCP with Nagle off).
    /// Any other form is an `InvalidInput` error.
    pub fn connect(addr: &str) -> io::Result<Stream> {
        if let Some(p) = addr.strip_prefix("unix:") {
            return UnixStream::connect(p).map(Stream::Unix);
        }
        if let Some(a) = addr.strip_prefix("tcp:") {
            let s = Stream::Tcp(tcp_connect(a, CONNECT_TIMEOUT)?);
            s.set_nodelay();
            return Ok(s);
        }
        Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad address {addr:?}: expected unix:PATH or tcp:HOST:PORT")))
    }

    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    /// Shut down one or both directions; best effort (the peer may be gone).
    pub fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        };
    }

    /// The peer's credentials: `Some` on a Unix socket, `None` on TCP (the
    /// kernel does not know who is at a remote end).
    pub fn peer_cred(&self) -> io::Result<Option<PeerCred>> {
        let Stream::Unix(s) = self else { return Ok(None) };
        let fd = s.as_raw_fd();
        let mut c = libc::ucred { pid: 0, uid: 0, gid: 0 };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: c and len are valid out-pointers of the sizes given.
        if unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut c as *mut libc::ucred).cast(), &mut len) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut groups = vec![0u32; 64];
        loop {
            let mut len = (groups.len() * 4) as libc::socklen_t;
            // SAFETY: groups holds len bytes.
            let r = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, SO_PEERGROUPS, groups.as_mut_ptr().cast(), &mut len) };
            if r == 0 {
                groups.truncate(len as usize / 4);
                break;
            }
            let e = io::Error::last_os_error();
            // ERANGE: len now says how many bytes the groups need.
            if e.raw_os_error() == Some(libc::ERANGE) && (len as usize / 4) > groups.len() && (len as usize / 4) <= PEER_GROUPS_MAX {
                groups.resize(len as usize / 4, 0);
                continue;
            }
            return Err(e);
        }
        Ok(Some(PeerCred { pid: c.pid as u32, uid: c.uid, gid: c.gid, groups }))
    }

    /// A client's check of the server it reached, before it sends
    /// anything: on a Unix socket the kernel says which uid listens
    /// (`SO_PEERCRED`), and that must be root or `expected` (default: this
    /// process's effective uid). Anyone else bound the path (a socket in a
    /// directory others can write, after the server stopped) and would be
    /// served the client's requests and data: `PermissionDenied`. On TCP
    /// the kernel cannot say; the key proof, made both ways, covers it.
    pub fn check_server(&self, expected: Option<u32>) -> io::Result<()> {
        let Some(peer) = self.peer_cred()? else { return Ok(()) };
        // SAFETY: geteuid cannot fail.
        let expected = expected.unwrap_or_else(|| unsafe { libc::geteuid() });
        if peer.uid == 0 || peer.uid == expected {
            return Ok(());
        }
        let msg = format!("the server on this socket runs as uid {}, not root or uid {expected} (the owner expected): someone else may have bound the path", peer.uid);
        Err(io::Error::new(io::ErrorKind::PermissionDenied, msg))
    }

    /// Disable Nagle's algorithm on TCP; nothing to do on Unix sockets.
    pub fn set_nodelay(&self) {
        if let Stream::Tcp(s) = self {
            let _ = s.set_nodelay(true);
        }
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tcp(s) => s.set_write_timeout(t),
        }
    }

    /// Whether the peer has closed (or reset) the connection, seen without
    /// blocking and without consuming anything: a `recv(2)` peek that
    /// finds the end of the stream or an error. Bytes waiting, or none
    /// yet, is open.
    pub fn peer_closed(&self) -> bool {
        let mut byte = 0u8;
        // SAFETY: one byte of valid memory; MSG_PEEK leaves it queued.
        let r = unsafe { libc::recv(self.as_raw_fd(), std::ptr::from_mut(&mut byte).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        match r {
            0 => true,
            r if r > 0 => false,
            _ => !matches!(io::Error::last_os_error().raw_os_error(), Some(libc::EAGAIN | libc::EINTR)),
        }
    }

    /// `send(2)` without blocking (and without SIGPIPE): bytes sent.
    pub fn send_nonblocking(&self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for its length during the call.
        let r = unsafe { libc::send(self.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r as usize)
    }

    /// Ask for a send buffer of `bytes` (the kernel caps it at
    /// `net.core.wmem_max`); best effort.
    pub fn set_send_buffer(&self, bytes: usize) {
        let v = bytes as libc::c_int;
        // SAFETY: v is a valid c_int for the call's duration.
        unsafe { libc::setsockopt(self.as_raw_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF, (&v as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t) };
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tcp(s) => s.write_vectored(bufs),
        }
    }

    /// Sockets are unbuffered: nothing to flush.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Connect to `HOST:PORT`, each address it resolves to tried for at most
/// `timeout`; the last address's error if none answers.
fn tcp_connect(hostport: &str, timeout: Duration) -> io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{hostport} resolves to no address"));
    for a in hostport.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            // std's own timeout carries no errno: give it the kernel's, as
            // a blocking connect that timed out would have.
            Err(e) if e.kind() == io::ErrorKind::TimedOut && e.raw_os_error().is_none() => last = io::Error::from_raw_os_error(libc::ETIMEDOUT),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::os::unix::net::UnixListener;

    /// A listener whose queue is full drops the next SYN, as a host that
    /// is down or filtered does: the attempt ends at its timeout, not
    /// after the kernel's retries.
    #[test]
    fn a_tcp_connect_that_gets_no_answer_ends_at_its_timeout() {
        // SAFETY: plain socket calls on a descriptor we own.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
        assert!(fd >= 0);
        let listener = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(unsafe { libc::bind(fd, (&sa as *const libc::sockaddr_in).cast(), len) }, 0);
        assert_eq!(unsafe { libc::listen(fd, 0) }, 0);
        let mut got = sa;
        let mut got_len = len;
        assert_eq!(unsafe { libc::getsockname(fd, (&mut got as *mut libc::sockaddr_in).cast(), &mut got_len) }, 0);
        let addr = format!("127.0.0.1:{}", u16::from_be(got.sin_port));
        // Fill the accept queue (a backlog of 0 still takes one, and the
        // kernel may take one more); the attempts past it get no answer.
        let mut held = Vec::new();
        let t = std::time::Instant::now();
        let timeout = Duration::from_millis(300);
        let e = loop {
            match tcp_connect(&addr, timeout) {
                Ok(s) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() < 8, "the full queue kept answering");
        };
        assert_eq!((e.kind(), e.raw_os_error()), (io::ErrorKind::TimedOut, Some(libc::ETIMEDOUT)), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        drop(listener);
    }

    #[test]
    fn kept_descriptors_move_out_of_the_way_of_the_programs_numbers() {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit fills a valid struct.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        let min = (lim.rlim_cur / 2).clamp(10, 512) as i32;
        let low = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        assert!(low.as_raw_fd() < min, "a fresh descriptor is low: {}", low.as_raw_fd());
        let moved = out_of_the_way(low);
        assert!(moved.as_raw_fd() >= min, "{} < {min}", moved.as_raw_fd());
        // SAFETY: F_GETFD on a descriptor we own.
        assert_ne!(unsafe { libc::fcntl(moved.as_raw_fd(), libc::F_GETFD) } & libc::FD_CLOEXEC, 0, "close-on-exec");
        // One already at or past the bound stays where it is.
        let at = moved.as_raw_fd();
        assert_eq!(out_of_the_way(moved).as_raw_fd(), at);
    }

    #[test]
    fn a_closed_peer_is_seen_without_consuming_what_it_sent() {
        let tl = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = Stream::connect(&format!("tcp:{}", tl.local_addr().unwrap())).unwrap();
        let (mut server, _) = tl.accept().unwrap();
        assert!(!c.peer_closed(), "open, nothing sent");
        server.write_all(b"x").unwrap();
        drop(server);
        // A byte still queued: open, and the byte stays readable.
        std::thread::sleep(Duration::from_millis(50));
        assert!(!c.peer_closed(), "a byte waits before the end");
        let mut b = [0u8; 1];
        c.try_clone().unwrap().read_exact(&mut b).unwrap();
        assert_eq!(&b, b"x");
        assert!(c.peer_closed(), "the end of the stream follows the byte");
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = Stream::Unix(a);
        assert!(!a.peer_closed());
        drop(b);
        assert!(a.peer_closed(), "a Unix peer's close is seen at once");
    }

    #[test]
    fn both_transports_carry_bytes_both_ways() {
        let dir = std::env::temp_dir().join(format!("sluice-net-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("s.sock");
        let ul = UnixListener::bind(&sock).unwrap();
        let tl = TcpListener::bind("127.0.0.1:0").unwrap();
        let taddr = format!("tcp:{}", tl.local_addr().unwrap());
        for (addr, accept) in [
            (format!("unix:{}", sock.display()), Box::new(move || Stream::Unix(ul.accept().unwrap().0)) as Box<dyn FnOnce() -> Stream + Send>),
            (taddr, Box::new(move || Stream::Tcp(tl.accept().unwrap().0))),
        ] {
            let server = std::thread::spawn(move || {
                let mut s = accept();
                let mut buf = [0u8; 5];
                s.read_exact(&mut buf).unwrap();
                s.write_all(&buf).unwrap();
            });
            let mut c = Stream::connect(&addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            assert_eq!(c.write_vectored(&[IoSlice::new(b"he"), IoSlice::new(b"llo")]).unwrap(), 5, "{addr}: a small vectored write goes whole");
            let mut back = [0u8; 5];
            c.try_clone().unwrap().read_exact(&mut back).unwrap();
            assert_eq!(&back, b"hello", "{addr}");
            server.join().unwrap();
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_server_of_ones_own_uid_or_on_tcp_passes_the_check() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let a = Stream::Unix(a);
        // SAFETY: geteuid cannot fail.
        let euid = unsafe { libc::geteuid() };
        assert!(a.check_server(None).is_ok(), "one's own uid is the default owner expected");
        assert!(a.check_server(Some(euid)).is_ok());
        // A peer of another uid needs another process: tests/hostile.rs.
        let r = a.check_server(Some(euid.wrapping_add(1)));
        assert_eq!(r.is_ok(), euid == 0, "root is always trusted; anyone else only when expected: {r:?}");
        let tl = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = Stream::connect(&format!("tcp:{}", tl.local_addr().unwrap())).unwrap();
        assert!(c.check_server(Some(euid.wrapping_add(1))).is_ok(), "TCP: the key proof's business");
    }

    #[test]
    fn a_bad_address_is_invalid_input() {
        assert_eq!(Stream::connect("udp:1.2.3.4:5").err().unwrap().kind(), io::ErrorKind::InvalidInput);
        assert!(Stream::connect("unix:/nonexistent/sluice.sock").is_err());
    }
}
