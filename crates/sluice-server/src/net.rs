//! Unix and TCP streams and listeners behind one type, plus a vectored
//! write-everything helper for replies.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

/// A connected client.
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    /// Stop reading: a blocked `read` returns 0. Used by the drain.
    pub fn shutdown_read(&self) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Read),
            Stream::Tcp(s) => s.shutdown(Shutdown::Read),
        };
    }

    /// `send(2)` without blocking (and without SIGPIPE): bytes sent.
    pub fn send_nonblocking(&self, buf: &[u8]) -> io::Result<usize> {
        let fd = match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        };
        // SAFETY: buf is valid for its length during the call.
        let r = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r as usize)
    }

    /// Ask for a send buffer of `bytes` (the kernel caps it at
    /// `net.core.wmem_max`); best effort.
    pub fn set_send_buffer(&self, bytes: usize) {
        let fd = match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        };
        let v = bytes as libc::c_int;
        // SAFETY: v is a valid c_int for the call's duration.
        unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, (&v as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>() as libc::socklen_t) };
    }

    pub fn set_write_timeout(&self, t: Duration) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(Some(t)),
            Stream::Tcp(s) => {
                s.set_nodelay(true)?;
                s.set_write_timeout(Some(t))
            }
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

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The listening socket.
pub enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    pub fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            Listener::Unix(l) => Stream::Unix(l.accept()?.0),
            Listener::Tcp(l) => Stream::Tcp(l.accept()?.0),
        })
    }

    pub fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Unix(l) => l.set_nonblocking(true),
            Listener::Tcp(l) => l.set_nonblocking(true),
        }
    }

    pub fn fd(&self) -> RawFd {
        match self {
            Listener::Unix(l) => l.as_raw_fd(),
            Listener::Tcp(l) => l.as_raw_fd(),
        }
    }
}

/// Write every byte of `parts`, in order, with as few `writev` calls as
/// the kernel allows.
pub fn write_all_parts(w: &mut impl Write, parts: &[&[u8]]) -> io::Result<()> {
    const IOV_BATCH: usize = 64;
    let (mut i, mut off) = (0usize, 0usize);
    while i < parts.len() {
        let mut iov = Vec::with_capacity(IOV_BATCH);
        iov.push(IoSlice::new(&parts[i][off..]));
        iov.extend(parts[i + 1..].iter().take(IOV_BATCH - 1).map(|p| IoSlice::new(p)));
        let mut n = match w.write_vectored(&iov) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while i < parts.len() && n >= parts[i].len() - off {
            n -= parts[i].len() - off;
            i += 1;
            off = 0;
        }
        off += n;
    }
    Ok(())
}
