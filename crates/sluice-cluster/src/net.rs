//! Unix or TCP streams and listeners for the metadata role's protocol
//! (addresses `unix:PATH` and `tcp:HOST:PORT`, as the data servers take).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::Duration;

use sluice_server::Listen;

/// A connected metadata stream.
pub(crate) enum MetaStream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl MetaStream {
    /// Connect to `unix:PATH` or `tcp:HOST:PORT`.
    pub(crate) fn connect(addr: &str) -> io::Result<MetaStream> {
        if let Some(p) = addr.strip_prefix("unix:") {
            return UnixStream::connect(p).map(MetaStream::Unix);
        }
        if let Some(a) = addr.strip_prefix("tcp:") {
            let s = TcpStream::connect(a)?;
            s.set_nodelay(true)?;
            return Ok(MetaStream::Tcp(s));
        }
        Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad address {addr:?}: expected unix:PATH or tcp:HOST:PORT")))
    }

    pub(crate) fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            MetaStream::Unix(s) => s.set_read_timeout(t).and_then(|()| s.set_write_timeout(t)),
            MetaStream::Tcp(s) => s.set_read_timeout(t).and_then(|()| s.set_write_timeout(t)),
        }
    }

    pub(crate) fn try_clone(&self) -> io::Result<MetaStream> {
        match self {
            MetaStream::Unix(s) => s.try_clone().map(MetaStream::Unix),
            MetaStream::Tcp(s) => s.try_clone().map(MetaStream::Tcp),
        }
    }

    pub(crate) fn shutdown(&self) {
        let _ = match self {
            MetaStream::Unix(s) => s.shutdown(Shutdown::Both),
            MetaStream::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for MetaStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            MetaStream::Unix(s) => s.read(buf),
            MetaStream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for MetaStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            MetaStream::Unix(s) => s.write(buf),
            MetaStream::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            MetaStream::Unix(s) => s.flush(),
            MetaStream::Tcp(s) => s.flush(),
        }
    }
}

/// A bound metadata listener.
pub(crate) enum MetaListener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl MetaListener {
    /// Bind; a stale Unix socket file is replaced.
    pub(crate) fn bind(listen: &Listen) -> io::Result<MetaListener> {
        match listen {
            Listen::Unix(p) => {
                let _ = std::fs::remove_file(p);
                UnixListener::bind(p).map(|l| MetaListener::Unix(l, p.clone()))
            }
            Listen::Tcp(a) => TcpListener::bind(a.as_str()).map(MetaListener::Tcp),
        }
    }

    /// The address clients use (the real port when bound to port 0).
    pub(crate) fn addr(&self) -> String {
        match self {
            MetaListener::Unix(_, p) => format!("unix:{}", p.display()),
            MetaListener::Tcp(l) => l.local_addr().map_or_else(|_| "tcp:?".into(), |a| format!("tcp:{a}")),
        }
    }

    pub(crate) fn accept(&self) -> io::Result<MetaStream> {
        match self {
            MetaListener::Unix(l, _) => l.accept().map(|(s, _)| MetaStream::Unix(s)),
            MetaListener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                MetaStream::Tcp(s)
            }),
        }
    }
}
