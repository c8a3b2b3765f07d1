//! Listening: where (`Listen`, an address to bind) and the bound socket
//! (`Listener`), for the data server and the metadata role alike.

use std::io;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use crate::Stream;

/// Where a server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    /// `HOST:PORT`; port 0 picks a free one (see [`Listener::addr`]).
    Tcp(String),
}

impl Listen {
    /// Parse `unix:PATH` or `tcp:HOST:PORT`.
    pub fn parse(s: &str) -> io::Result<Listen> {
        if let Some(p) = s.strip_prefix("unix:").filter(|p| !p.is_empty()) {
            return Ok(Listen::Unix(PathBuf::from(p)));
        }
        if let Some(a) = s.strip_prefix("tcp:").filter(|a| a.contains(':')) {
            return Ok(Listen::Tcp(a.to_string()));
        }
        Err(io::Error::new(io::ErrorKind::InvalidInput, format!("bad address {s:?}: expected unix:PATH or tcp:HOST:PORT")))
    }
}

/// A bound listening socket.
pub enum Listener {
    /// The socket and the path it was bound at.
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    /// Bind `listen`. A stale Unix socket at the path (nobody accepts on
    /// it) is replaced; a live one (`AddrInUse`) or a path that is not a
    /// socket (`AlreadyExists`) is refused, so a second server never steals
    /// a running one's address or removes someone's file.
    pub fn bind(listen: &Listen) -> io::Result<Listener> {
        match listen {
            Listen::Unix(p) => {
                if let Ok(meta) = std::fs::symlink_metadata(p) {
                    use std::os::unix::fs::FileTypeExt;
                    if !meta.file_type().is_socket() {
                        return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{} exists and is not a socket", p.display())));
                    }
                    if std::os::unix::net::UnixStream::connect(p).is_ok() {
                        return Err(io::Error::new(io::ErrorKind::AddrInUse, format!("{} is in use by a running server", p.display())));
                    }
                    let _ = std::fs::remove_file(p);
                }
                UnixListener::bind(p).map(|l| Listener::Unix(l, p.clone()))
            }
            Listen::Tcp(a) => TcpListener::bind(a.as_str()).map(Listener::Tcp),
        }
    }

    /// The address clients use (the real port when bound to port 0).
    pub fn addr(&self) -> String {
        match self {
            Listener::Unix(_, p) => format!("unix:{}", p.display()),
            Listener::Tcp(l) => l.local_addr().map_or_else(|_| "tcp:?".into(), |a| format!("tcp:{a}")),
        }
    }

    /// The next connection (TCP ones with `TCP_NODELAY`).
    pub fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            Listener::Unix(l, _) => Stream::Unix(l.accept()?.0),
            Listener::Tcp(l) => {
                let s = Stream::Tcp(l.accept()?.0);
                s.set_nodelay();
                s
            }
        })
    }

    pub fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Unix(l, _) => l.set_nonblocking(true),
            Listener::Tcp(l) => l.set_nonblocking(true),
        }
    }

    pub fn fd(&self) -> RawFd {
        match self {
            Listener::Unix(l, _) => l.as_raw_fd(),
            Listener::Tcp(l) => l.as_raw_fd(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_or_are_refused_with_the_grammar() {
        assert_eq!(Listen::parse("unix:/tmp/s").unwrap(), Listen::Unix("/tmp/s".into()));
        assert_eq!(Listen::parse("tcp:127.0.0.1:0").unwrap(), Listen::Tcp("127.0.0.1:0".into()));
        for bad in ["unix:", "tcp:host", "/tmp/s", ""] {
            assert!(Listen::parse(bad).unwrap_err().to_string().contains("expected unix:PATH"), "{bad}");
        }
    }

    #[test]
    fn bind_replaces_a_stale_socket_and_refuses_a_live_one_or_a_file() {
        let dir = std::env::temp_dir().join(format!("sluice-net-listen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = Listen::Unix(dir.join("s.sock"));
        let live = Listener::bind(&sock).unwrap();
        assert_eq!(Listener::bind(&sock).err().unwrap().kind(), io::ErrorKind::AddrInUse);
        drop(live);
        Listener::bind(&sock).expect("a stale socket is replaced");
        std::fs::write(dir.join("f"), b"mine").unwrap();
        assert_eq!(Listener::bind(&Listen::Unix(dir.join("f"))).err().unwrap().kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"mine");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
