//! Calls on names and attributes: sync and truncate, stat, links,
//! directories, renames, and the server's per-application statistics.

use super::*;

impl Client {
    /// Send `req` on `fd`'s server handle, answered `Ok`; asked again on a
    /// new connection if `idempotent`.
    pub(crate) fn fd_ok(&self, what: &str, idempotent: bool, fd: Fd, req: impl Fn(u64) -> Request<'static>) -> Result<()> {
        match self.on_fd(fd, idempotent, |s, server| s.conn.call(&req(server)))? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(what, &r)),
        }
    }

    /// Flush data and metadata to stable storage.
    pub fn fsync(&self, fd: Fd) -> Result<()> {
        self.fd_ok("fsync", false, fd, |fd| Request::Fsync { fd })
    }

    pub fn fdatasync(&self, fd: Fd) -> Result<()> {
        self.fd_ok("fdatasync", false, fd, |fd| Request::Fdatasync { fd })
    }

    pub fn ftruncate(&self, fd: Fd, len: u64) -> Result<()> {
        self.fd_ok("ftruncate", false, fd, |fd| Request::Ftruncate { fd, len })
    }

    pub fn stat(&self, path: &str) -> Result<Stat> {
        match self.with_session(true, |s| s.conn.call(&Request::Stat { path }))? {
            Reply::Stat(st) => Ok(st),
            r => Err(unexpected("stat", &r)),
        }
    }

    /// `stat` of a final symbolic link itself (`lstat(2)`): its kind is
    /// `S_IFLNK`.
    pub fn lstat(&self, path: &str) -> Result<Stat> {
        match self.with_session(true, |s| s.conn.call(&Request::Lstat { path }))? {
            Reply::Stat(st) => Ok(st),
            r => Err(unexpected("lstat", &r)),
        }
    }

    /// The target of the symbolic link at `path` (`readlink(2)`; EINVAL
    /// when it is not one).
    pub fn readlink(&self, path: &str) -> Result<String> {
        match self.with_session(true, |s| s.conn.call(&Request::Readlink { path }))? {
            Reply::Link(t) => Ok(t),
            r => Err(unexpected("readlink", &r)),
        }
    }

    /// An operator's command on the server's service classes (`list`,
    /// `stats`, `set` then a rules file's text, `rm CLASS`, `clear`;
    /// docs/qos.md): the server's answer, for a person. Only root or the
    /// server's own user on its host, or a client over TCP (which proved
    /// the key), may give one; anyone else gets EACCES. Not retried after
    /// a reconnection (a change might apply twice).
    pub fn qos(&self, command: &str) -> Result<String> {
        match self.with_session(false, |s| s.conn.call(&Request::Qos { command }))? {
            Reply::Text(t) => Ok(t),
            r => Err(unexpected("qos", &r)),
        }
    }

    /// The capacity and free space of the served file system that holds
    /// `path` (`statvfs(3)`).
    pub fn statfs(&self, path: &str) -> Result<Statfs> {
        match self.with_session(true, |s| s.conn.call(&Request::Statfs { path }))? {
            Reply::Statfs(f) => Ok(f),
            r => Err(unexpected("statfs", &r)),
        }
    }

    pub fn fstat(&self, fd: Fd) -> Result<Stat> {
        match self.on_fd(fd, true, |s, server| s.conn.call(&Request::Fstat { fd: server }))? {
            Reply::Stat(st) => Ok(st),
            r => Err(unexpected("fstat", &r)),
        }
    }

    /// Reserve `len` bytes at the end of `fd`'s file for an `O_APPEND`
    /// write: the offset where they start, which no other reservation on
    /// the server overlaps. The caller writes there. Not asked again after
    /// a broken connection (the first may have been made).
    pub fn reserve(&self, fd: Fd, len: u64) -> Result<u64> {
        match self.on_fd(fd, false, |s, server| s.conn.call(&Request::Reserve { fd: server, len }))? {
            Reply::Count(at) => Ok(at),
            r => Err(unexpected("reserve", &r)),
        }
    }

    pub fn unlink(&self, path: &str) -> Result<()> {
        self.ok("unlink", false, &Request::Unlink { path })
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.ok("rename", false, &Request::Rename { from, to })
    }

    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        self.ok("mkdir", false, &Request::Mkdir { path, mode })
    }

    /// Change `path`'s mode (`SETATTR_MODE_KEEP`: not) and times
    /// (nanoseconds since the epoch, or `SETATTR_TIME_OMIT` /
    /// `SETATTR_TIME_NOW`); `nofollow` acts on a final link itself.
    pub fn set_attr(&self, path: &str, mode: u32, atime_ns: i64, mtime_ns: i64, nofollow: bool) -> Result<()> {
        self.ok("setattr", true, &Request::SetAttr { fd: sluice_proto::SETATTR_BY_PATH, path, mode, atime_ns, mtime_ns, nofollow })
    }

    /// [`Client::set_attr`] on an open file (`fchmod`, `futimens`).
    pub fn fset_attr(&self, fd: Fd, mode: u32, atime_ns: i64, mtime_ns: i64) -> Result<()> {
        self.fd_ok("fsetattr", true, fd, |fd| Request::SetAttr { fd, path: "", mode, atime_ns, mtime_ns, nofollow: false })
    }

    /// A symbolic link at `path` holding `target` (`symlink(2)`).
    pub fn symlink(&self, target: &str, path: &str) -> Result<()> {
        self.ok("symlink", false, &Request::Symlink { target, path })
    }

    pub fn rmdir(&self, path: &str) -> Result<()> {
        self.ok("rmdir", false, &Request::Rmdir { path })
    }

    /// Every entry of directory `path` but `.` and `..`, sorted by name.
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        self.with_session(true, |s| {
            let mut all = Vec::new();
            loop {
                match s.conn.call(&Request::Readdir { path, start: all.len() as u32 })? {
                    Reply::Dir(entries, done) => {
                        let empty = entries.is_empty();
                        all.extend(entries);
                        if done || empty {
                            return Ok(all);
                        }
                    }
                    r => return Err(unexpected("readdir", &r)),
                }
            }
        })
    }

    /// Per-application counters of the server.
    pub fn server_stats(&self) -> Result<ServerStats> {
        match self.with_session(true, |s| s.conn.call(&Request::Stats))? {
            Reply::Stats(apps) => Ok(ServerStats { apps }),
            r => Err(unexpected("stats", &r)),
        }
    }
}
