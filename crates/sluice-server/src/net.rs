//! The listener (Unix or TCP) and a vectored write-everything helper for
//! replies; the connected stream type is `sluice_net::Stream`.

use std::io::{self, IoSlice, Write};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;

/// A connected client: the workspace's one socket type.
pub use sluice_net::Stream;

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
