//! The metadata role's listener (addresses `unix:PATH` and `tcp:HOST:PORT`,
//! as the data servers take); connected streams are `sluice_net::Stream`.

use std::io;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::time::Duration;

use sluice_server::Listen;

/// A connected metadata stream: the workspace's one socket type.
pub(crate) use sluice_net::Stream as MetaStream;

/// Read and write timeouts on a metadata stream.
pub(crate) fn set_timeouts(s: &MetaStream, t: Option<Duration>) -> io::Result<()> {
    s.set_read_timeout(t)?;
    s.set_write_timeout(t)
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
                let s = MetaStream::Tcp(s);
                s.set_nodelay();
                s
            }),
        }
    }
}
