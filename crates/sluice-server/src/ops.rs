//! A connection's session (its open files and who it acts for) and its
//! metadata operations: open/close, fsync, truncate, stat, and the
//! namespace calls. The calls that may block (everything that takes a
//! path, and the syncs) run on the metadata pool (`meta.rs`) as the
//! caller; `close`, `fstat` and `stats` run on the event loop. A
//! connection is not read while one of its metadata calls runs, so its
//! calls happen in arrival order. All paths go through
//! [`crate::root::Root`], so none leaves the root.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use sluice_core::{AppId, ClientId};

use sluice_proto::{Request, DIR_ENTRIES_MAX};

use crate::error::{Error, ErrorKind, Result};
use crate::ident::Identity;
use crate::pending::Out;
use crate::root::fstat;
use crate::shared::Shared;
use crate::state::OpenFile;
use crate::sync::lock;

/// Open flags a client may pass; the rest (`O_APPEND`, `O_DIRECT`,
/// `O_ASYNC`, ...) are dropped: the server positions every write itself
/// and decides about O_DIRECT.
const OPEN_FLAGS_ALLOWED: i32 = libc::O_ACCMODE | libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_DIRECTORY | libc::O_NOFOLLOW;

fn check(r: libc::c_int, what: &str) -> Result<()> {
    if r < 0 {
        return Err(Error::io(what, &std::io::Error::last_os_error()));
    }
    Ok(())
}

/// What a connection's requests act on and as whom.
pub(crate) struct Session {
    /// Open file handles, bounded by `fds_per_connection_max`.
    pub files: HashMap<u64, Arc<OpenFile>>,
    pub fd_next: u64,
    /// Handles whose descriptor this connection was lent (`lease.rs`).
    pub lent: std::collections::HashSet<u64>,
    pub app: AppId,
    pub client: ClientId,
    /// Who this connection acts for.
    pub ident: Identity,
}

/// Whether `req` runs on the event loop: it takes no path, cannot block,
/// and needs no identity.
pub(crate) fn runs_inline(req: &Request<'_>) -> bool {
    matches!(req, Request::Close { .. } | Request::Fstat { .. } | Request::Stats | Request::Qos { .. })
}

impl Session {
    pub(crate) fn new(app: AppId, client: ClientId, ident: Identity) -> Session {
        Session { files: HashMap::new(), fd_next: 3, lent: std::collections::HashSet::new(), app, client, ident }
    }

    pub(crate) fn file(&self, fd: u64) -> Result<&Arc<OpenFile>> {
        self.files.get(&fd).ok_or_else(|| Error::new(ErrorKind::Invalid, libc::EBADF, format!("bad file handle {fd}")))
    }

    /// The descriptor to send with a lease on handle `fd`: a duplicate the
    /// first time (the handle is then marked lent), `None` once lent.
    /// `Err`: a bad handle, or no duplicate to be had.
    pub(crate) fn lend(&mut self, fd: u64) -> std::result::Result<Option<std::os::fd::OwnedFd>, ()> {
        if self.lent.contains(&fd) {
            return Ok(None);
        }
        let dup = self.files.get(&fd).ok_or(())?.fd.try_clone().map_err(|_| ())?;
        self.lent.insert(fd);
        Ok(Some(dup))
    }

    /// Run one metadata request (on the pool, as the caller, unless
    /// `runs_inline`).
    pub(crate) fn metadata(&mut self, shared: &Shared, req: Request<'_>) -> Result<Out> {
        let root = &shared.root;
        Ok(match req {
            Request::Open { path, flags, mode } => {
                let (fd, ino) = self.open(shared, path, flags, mode)?;
                Out::Fd(fd, ino)
            }
            Request::Close { fd } => {
                self.files.remove(&fd).ok_or_else(|| Error::new(ErrorKind::Invalid, libc::EBADF, format!("bad file handle {fd}")))?;
                self.lent.remove(&fd);
                Out::Ok
            }
            Request::Fsync { fd } => {
                // SAFETY: plain system call on a descriptor we hold.
                check(unsafe { libc::fsync(self.file(fd)?.fd.as_raw_fd()) }, "fsync")?;
                Out::Ok
            }
            Request::Fdatasync { fd } => {
                // SAFETY: plain system call on a descriptor we hold.
                check(unsafe { libc::fdatasync(self.file(fd)?.fd.as_raw_fd()) }, "fdatasync")?;
                Out::Ok
            }
            Request::Ftruncate { fd, len } => {
                let len = i64::try_from(len).map_err(|_| Error::invalid("length too large"))?;
                let _alone = size_change_alone(shared);
                let file = self.file(fd)?;
                // SAFETY: plain system call on a descriptor we hold.
                check(unsafe { libc::ftruncate64(file.fd.as_raw_fd(), len) }, "ftruncate")?;
                file.resized();
                Out::Ok
            }
            Request::Reserve { fd, len } => {
                let file = self.file(fd)?;
                if file.access == libc::O_RDONLY {
                    return Err(Error::new(ErrorKind::Invalid, libc::EBADF, format!("file handle {fd} is not open for writing")));
                }
                // With `--direct` a write that reads back an edge block
                // leaves the file a block long for a moment: the size is
                // read once no such write is in flight.
                let _alone = size_change_alone(shared);
                Out::Count(file.reserve(len)?)
            }
            Request::Stat { path } => Out::Stat(root.stat(path)?),
            Request::Lstat { path } => Out::Stat(root.lstat(path)?),
            Request::Readlink { path } => Out::Link(root.readlink(path)?),
            Request::Statfs { path } => Out::Statfs(root.statfs(path)?),
            Request::Fstat { fd } => Out::Stat(fstat(self.file(fd)?.fd.as_raw_fd())?),
            Request::Unlink { path } => root.unlink(path).map(|()| Out::Ok)?,
            Request::Rename { from, to } => root.rename(from, to).map(|()| Out::Ok)?,
            Request::Symlink { target, path } => root.symlink(target, path).map(|()| Out::Ok)?,
            Request::SetAttr { fd, path, mode, atime_ns, mtime_ns, nofollow } => {
                self.set_attr(root, fd, path, mode, times(atime_ns, mtime_ns), nofollow)?;
                Out::Ok
            }
            Request::Mkdir { path, mode } => root.mkdir(path, crate::ident::create_mode(&self.ident, mode)).map(|()| Out::Ok)?,
            Request::Rmdir { path } => root.rmdir(path).map(|()| Out::Ok)?,
            Request::Readdir { path, start } => {
                let (entries, done) = root.readdir(path, start, DIR_ENTRIES_MAX, shared.config.limits.dir_entries_max)?;
                Out::Dir(entries, done)
            }
            Request::Stats => Out::Stats(lock(&shared.apps).snapshot()),
            _ => return Err(Error::invalid("not a metadata request")),
        })
    }

    /// `SetAttr`: by path, or on handle `fd`.
    fn set_attr(&self, root: &crate::root::Root, fd: u64, path: &str, mode: u32, t: Option<[libc::timespec; 2]>, nofollow: bool) -> Result<()> {
        if fd == sluice_proto::SETATTR_BY_PATH {
            return root.set_attr(path, mode, t, nofollow);
        }
        let raw = self.file(fd)?.fd.as_raw_fd();
        if mode != sluice_proto::SETATTR_MODE_KEEP {
            // SAFETY: plain system call on a descriptor we hold.
            check(unsafe { libc::fchmod(raw, mode & 0o7777) }, "fchmod")?;
        }
        if let Some(t) = t {
            // SAFETY: as above; the timespecs outlive the call.
            check(unsafe { libc::futimens(raw, t.as_ptr()) }, "futimens")?;
        }
        Ok(())
    }

    /// Open `path`: the handle and the file's inode number.
    fn open(&mut self, shared: &Shared, path: &str, flags: i32, mode: u32) -> Result<(u64, u64)> {
        let max = shared.config.limits.fds_per_connection_max;
        if self.files.len() >= max as usize {
            return Err(Error::limit(libc::EMFILE, format!("too many open files on this connection (fds_per_connection_max = {max})")));
        }
        let mode = crate::ident::create_mode(&self.ident, mode);
        let mut f = flags & OPEN_FLAGS_ALLOWED;
        if shared.config.direct && f & libc::O_DIRECTORY == 0 {
            f |= libc::O_DIRECT;
        }
        // Unaligned O_DIRECT writes read their edge blocks back, so a
        // write-only handle is opened read-write where permissions allow;
        // the handle's `access` still forbids client reads through it.
        let rw = (f & libc::O_DIRECT != 0 && f & libc::O_ACCMODE == libc::O_WRONLY).then_some((f & !libc::O_ACCMODE) | libc::O_RDWR);
        // O_NONBLOCK: opening a FIFO must not wait for its other end (it
        // would hold a metadata worker until someone opened it); the kind
        // is checked on the descriptor, and the flag cleared again.
        let nb = libc::O_NONBLOCK | libc::O_NOCTTY;
        let _alone = (f & libc::O_TRUNC != 0).then(|| size_change_alone(shared));
        let opened = match rw.map(|rw| shared.root.open_beneath(path, rw | nb, mode)) {
            Some(Err(e)) if e.errno == libc::EACCES && e.kind == ErrorKind::Io => None,
            other => other,
        };
        let fd = opened.unwrap_or_else(|| shared.root.open_beneath(path, f | nb, mode)).map_err(|e| match e.errno {
            libc::EINVAL if f & libc::O_DIRECT != 0 => Error::new(e.kind, e.errno, format!("{}: the backing file system refuses O_DIRECT (--direct)", e.message)),
            _ => e,
        })?;
        let (fd, st) = regular_or_directory(fd, path)?;
        let file = OpenFile::register(fd, &st, flags & libc::O_ACCMODE, &shared.files)?;
        if f & libc::O_TRUNC != 0 {
            file.resized();
        }
        let handle = self.fd_next;
        self.fd_next += 1;
        self.files.insert(handle, Arc::new(file));
        Ok((handle, st.st_ino))
    }
}

/// `SetAttr`'s times as `utimensat` takes them; `None` when both are left.
fn times(atime_ns: i64, mtime_ns: i64) -> Option<[libc::timespec; 2]> {
    let one = |ns: i64| match ns {
        sluice_proto::SETATTR_TIME_OMIT => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        sluice_proto::SETATTR_TIME_NOW => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        ns => libc::timespec { tv_sec: ns.div_euclid(1_000_000_000), tv_nsec: ns.rem_euclid(1_000_000_000) },
    };
    (atime_ns != sluice_proto::SETATTR_TIME_OMIT || mtime_ns != sluice_proto::SETATTR_TIME_OMIT).then(|| [one(atime_ns), one(mtime_ns)])
}

/// With `--direct`, a change of a file's size (`ftruncate`, an open with
/// `O_TRUNC`) waits for the O_DIRECT writes in flight and runs alone, as
/// a write that reads back an edge block does (`exec::direct_write`):
/// such a write reads the size, writes whole blocks and cuts the file back
/// to the size it read, so a truncate between the two came undone (its
/// bytes back, or an acknowledged extension cut off).
fn size_change_alone(shared: &Shared) -> Option<crate::order::AloneGuard<'_>> {
    shared.config.direct.then(|| shared.direct_writes.alone())
}

/// Keep `fd` only if it is a regular file or a directory, with
/// `O_NONBLOCK` cleared (io_uring would answer `EAGAIN` on it instead of
/// waiting). A FIFO, socket or device node is refused: its reads wait on
/// another party, not on a device, and one held by the server's threads
/// would stall every client behind it. Its `fstat` comes back too, for
/// the open file table.
fn regular_or_directory(fd: OwnedFd, path: &str) -> Result<(OwnedFd, libc::stat64)> {
    let st = crate::state::stat_of(&fd)?;
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFREG && kind != libc::S_IFDIR {
        let what = match kind {
            libc::S_IFIFO => "a FIFO",
            libc::S_IFSOCK => "a socket",
            libc::S_IFCHR | libc::S_IFBLK => "a device node",
            _ => "not a regular file",
        };
        return Err(Error::new(ErrorKind::Invalid, libc::ENXIO, format!("{path}: {what}; sluice serves regular files and directories")));
    }
    // SAFETY: fcntl on a descriptor we hold.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(Error::io("fcntl", &std::io::Error::last_os_error()));
    }
    Ok((fd, st))
}
