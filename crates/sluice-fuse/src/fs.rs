//! The file system: every FUSE operation becomes one sluice client call,
//! made on one of the session's `THREADS` worker threads (each reading its
//! own clone of the FUSE device), so that concurrent requests stay
//! concurrent. Errors become errno values in exactly one place, `errno`.
//!
//! The kernel names files by inode number, the server by path: `Inodes`
//! keeps the map, bounded, and follows renames and removals.
//!
//! Passthrough (on by default; `sluice mount --no-passthrough` turns it
//! off; Linux 6.9+, root): a read-only open of a file that is wholly in
//! the page cache gets the file itself as its FUSE backing file (the
//! descriptor the server lent for cache leases), and the kernel serves its
//! reads from the page cache without asking the mount. Nothing is left to
//! schedule for such a file, as for a cache lease; unlike a lease (10 ms),
//! it lasts until the file is closed: a page evicted in the meantime is
//! read from the device unscheduled.
//!
//! The kernel keeps one I/O mode per inode: while a passthrough open
//! lasts, every other open of the inode must name the same backing file,
//! or it fails. `IoModes` keeps each inode's mode, and every open is
//! decided under its lock:
//! - the inode has a backing file: a read-only open of the still wholly
//!   cached file shares it; any other open (a writer, O_DIRECT, a file no
//!   longer all cached) names it too but with `FOPEN_DIRECT_IO`, which the
//!   kernel lets override passthrough, so its reads and writes still come
//!   to the mount and the scheduler (a *shared* open);
//! - the inode has plain opens (the mount's path): no backing file is
//!   registered until they are closed, so a cached read-only open then
//!   takes the mount's path too;
//! - neither: a cached read-only open registers the backing file.
//!
//! The kernel drops an inode's backing file when its last passthrough open
//! is released, before the release reaches the mount, so the mount never
//! names a stale one.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::hash::{Hash, Hasher};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use sluice_client::{Abandon, ClientError, Fd, FileKind, Passthrough, Stat};
use sluice_remote::{Remote, RemoteKind};

use crate::conns::{Caller, Conns, CONNECTIONS_MAX as CONNS_MAX};
use crate::stats::STATS;
use crate::MountConfig;

/// Connections kept at once (re-exported for the docs and tests).
pub const CONNECTIONS_MAX: usize = CONNS_MAX;
/// Open files at once; `open` past it fails with ENFILE.
pub const HANDLES_MAX: usize = 65_536;
/// Inode numbers the kernel may hold at once (files it looked up and has
/// not forgotten); a lookup past it fails with ENFILE.
pub const INODES_MAX: usize = 1 << 20;
/// Largest read or write the kernel sends in one request: 1 MiB, the
/// sequential size the benchmarks use.
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
/// Worker threads of the session: requests in progress at once. Each
/// caller blocks one thread for as long as the server takes, so this must
/// exceed the processes of a node that share a file, or the scheduler
/// never sees their requests together: at 16, 32 strided readers reached
/// the server at most 16 at a time and aggregated 4-14 requests a
/// dispatch instead of about 30. An idle thread costs a stack and a
/// receive buffer whose untouched pages are never resident; the kernel
/// wakes one thread per request.
pub const THREADS: usize = 128;
/// How every open but a passthrough one is answered. Direct I/O: the
/// kernel neither caches nor reshapes the data path, so the scheduler
/// sees the application's own request sizes. Parallel direct writes: the
/// kernel otherwise takes the inode's lock for each write until the mount
/// answers it, so the writers of one file reached the server one at a
/// time and were never aggregated; with the flag it takes the lock
/// shared for a write inside the file (appends and writes past the end
/// still go one at a time).
const DIRECT: FopenFlags = FopenFlags::FOPEN_DIRECT_IO.union(FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES);
/// How long the kernel may cache names and attributes. Short: other
/// clients of the server change files too.
const TTL: Duration = Duration::from_millis(200);

struct Handle {
    client: Arc<Remote>,
    fd: Fd,
    ino: u64,
    /// A passthrough or shared open (it holds the inode's backing file,
    /// `InodeIo`), else a plain one.
    backed: bool,
}

/// One inode's I/O mode as the kernel sees it (module documentation):
/// its backing file while passthrough or shared opens hold it (`held` of
/// them), else the count of plain opens.
struct InodeIo<B> {
    backing: Option<Arc<B>>,
    held: u32,
    plain: u32,
}

/// How an open was answered.
#[derive(Debug, PartialEq)]
enum OpenMode<B> {
    /// The mount's path, `FOPEN_DIRECT_IO`.
    Plain,
    /// The kernel reads the backing file itself.
    Passthrough(Arc<B>),
    /// Names the inode's backing file, but `FOPEN_DIRECT_IO` sends its
    /// reads and writes to the mount.
    Shared(Arc<B>),
}

impl<B> OpenMode<B> {
    /// Whether the open holds the inode's backing file.
    fn backed(&self) -> bool {
        !matches!(self, OpenMode::Plain)
    }
}

/// Every open inode's I/O mode. An entry lives while an open holds it, so
/// the table is bounded by the open handles (`HANDLES_MAX`); the backing
/// file goes with the last open that held it. `B` is the kernel's backing
/// file id (a plain number in the tests).
struct IoModes<B> {
    by_ino: HashMap<u64, InodeIo<B>>,
}

impl<B> IoModes<B> {
    fn new() -> IoModes<B> {
        IoModes { by_ino: HashMap::new() }
    }

    /// Decide how the kernel opens `ino`, given the cached file `F` when
    /// this open could pass through; `register` hands it to the kernel as
    /// a backing file (its error: no passthrough for this open).
    fn open<F, E>(&mut self, ino: u64, cached: Option<F>, register: impl FnOnce(F) -> Result<B, E>) -> (OpenMode<B>, Option<E>) {
        let io = self.by_ino.entry(ino).or_insert(InodeIo { backing: None, held: 0, plain: 0 });
        if let Some(id) = &io.backing {
            io.held += 1;
            return (if cached.is_some() { OpenMode::Passthrough(Arc::clone(id)) } else { OpenMode::Shared(Arc::clone(id)) }, None);
        }
        let mut refused = None;
        if let (0, Some(file)) = (io.plain, cached) {
            match register(file) {
                Ok(id) => {
                    let id = Arc::new(id);
                    (io.backing, io.held) = (Some(Arc::clone(&id)), 1);
                    return (OpenMode::Passthrough(id), None);
                }
                Err(e) => refused = Some(e),
            }
        }
        io.plain += 1;
        (OpenMode::Plain, refused)
    }

    /// An open of `ino` is over (`backed`: it held the backing file): its
    /// part of the inode's mode goes. The last holder lets the mount's id
    /// for the backing file go (the kernel dropped its own at the last
    /// passthrough release, before the release reached the mount).
    fn close(&mut self, ino: u64, backed: bool) {
        let Some(io) = self.by_ino.get_mut(&ino) else { return };
        if backed {
            io.held = io.held.saturating_sub(1);
            if io.held == 0 {
                io.backing = None;
            }
        } else {
            io.plain = io.plain.saturating_sub(1);
        }
        if io.plain == 0 && io.held == 0 {
            self.by_ino.remove(&ino);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_ino.len()
    }
}

/// Whether the server lends descriptors, as far as the mount has seen:
/// until it has, an open asks for one with a read of the file's first
/// bytes; after `PRIME_MISSES_MAX` such reads got none (a server with
/// O_DIRECT or an emulated device, or on another host), only one open in
/// `PRIME_RETRY_EVERY` asks, so that opens do not each cost a read.
const LENDS_UNKNOWN: u8 = 0;
const LENDS_YES: u8 = 1;
const LENDS_NO: u8 = 2;
const PRIME_MISSES_MAX: u32 = 4;
const PRIME_RETRY_EVERY: u64 = 1_024;

/// One inode number the kernel holds: its server path (None once removed
/// or replaced by a rename) and the kernel's lookup count.
struct Node {
    path: Option<String>,
    lookups: u64,
}

/// Inode numbers and server paths, both ways. The root is inode 1, path
/// "."; others are numbered from 2 as first looked up, and dropped when
/// the kernel forgets them.
pub(crate) struct Inodes {
    by_ino: HashMap<u64, Node>,
    by_path: HashMap<String, u64>,
    next: u64,
    max: usize,
}

impl Inodes {
    pub(crate) fn new(max: usize) -> Inodes {
        let mut by_ino = HashMap::new();
        by_ino.insert(1, Node { path: Some(".".into()), lookups: 1 });
        Inodes { by_ino, by_path: HashMap::from([(".".to_string(), 1)]), next: 2, max }
    }

    fn path(&self, ino: u64) -> Result<String, Errno> {
        self.by_ino.get(&ino).and_then(|n| n.path.clone()).ok_or(Errno::ENOENT)
    }

    /// The kernel got `path`'s inode number once more (a lookup, create,
    /// mkdir): the number, new or known.
    pub(crate) fn remember(&mut self, path: &str) -> Result<u64, Errno> {
        if let Some(&ino) = self.by_path.get(path) {
            self.by_ino.get_mut(&ino).expect("both maps agree").lookups += 1;
            return Ok(ino);
        }
        if self.by_ino.len() >= self.max {
            return Err(Errno::ENFILE);
        }
        let ino = self.next;
        self.next += 1;
        self.by_ino.insert(ino, Node { path: Some(path.to_string()), lookups: 1 });
        self.by_path.insert(path.to_string(), ino);
        Ok(ino)
    }

    /// The number readdir shows for `path`: its own when known, else one
    /// derived from the path (never 0, which readdir callers skip; never
    /// one of ours, which stay far below 2^63).
    fn shown(&self, path: &str) -> u64 {
        self.by_path.get(path).copied().unwrap_or_else(|| {
            let mut h = DefaultHasher::new();
            path.hash(&mut h);
            h.finish() | 1 << 63
        })
    }

    /// The kernel forgot `n` lookups of `ino`.
    pub(crate) fn forget(&mut self, ino: u64, n: u64) {
        if ino == 1 {
            return;
        }
        let Some(node) = self.by_ino.get_mut(&ino) else { return };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 {
            let node = self.by_ino.remove(&ino).expect("present");
            if let Some(p) = node.path {
                self.by_path.remove(&p);
            }
        }
    }

    /// `path` was removed: its inode number no longer names it.
    pub(crate) fn removed(&mut self, path: &str) {
        if let Some(ino) = self.by_path.remove(path) {
            if let Some(n) = self.by_ino.get_mut(&ino) {
                n.path = None;
            }
        }
    }

    /// `from` was renamed `to` (what was at `to` is gone): `from` and
    /// everything beneath it move.
    pub(crate) fn renamed(&mut self, from: &str, to: &str) {
        self.removed(to);
        let under = format!("{from}/");
        let moved: Vec<(String, u64)> = self.by_path.iter().filter(|(p, _)| *p == from || p.starts_with(&under)).map(|(p, &i)| (p.clone(), i)).collect();
        for (old, ino) in moved {
            let new = format!("{to}{}", &old[from.len()..]);
            self.by_path.remove(&old);
            self.by_path.insert(new.clone(), ino);
            self.by_ino.get_mut(&ino).expect("both maps agree").path = Some(new);
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_ino.len()
    }
}

/// A directory's entries as one `opendir` saw them (`.`, `..`, then the
/// listing): inode number, kind, name.
type Listing = Vec<(u64, FileType, String)>;

pub(crate) struct SluiceFs {
    conns: Conns,
    handles: Mutex<HashMap<u64, Handle>>,
    handles_max: usize,
    /// Open directories: each handle's listing, taken at its first
    /// `readdir` (again at a rewind), so a program that removes entries as
    /// it reads sees each entry once, as on a local file system. Before,
    /// every `readdir` listed anew and resumed by index, and a
    /// readdir-and-unlink loop over 1,000 files skipped 183. At most
    /// `handles_max` open directories (one more is ENFILE).
    listings: Mutex<HashMap<u64, Option<Arc<Listing>>>>,
    fh_next: AtomicU64,
    inodes: Mutex<Inodes>,
    /// Passthrough wanted and possible: set at init, cleared for good when
    /// the kernel refuses a backing file (not root).
    passthrough: AtomicBool,
    /// Each open inode's I/O mode (module documentation).
    io: Mutex<IoModes<BackingId>>,
    lends: AtomicU8,
    prime_misses: AtomicU32,
    opens: AtomicU64,
}

/// Client errors as errno values: the client's one conversion.
fn errno(e: ClientError) -> Errno {
    Errno::from_i32(e.posix_errno())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `name` inside the server path `dir`.
fn join(dir: &str, name: &OsStr) -> Result<String, Errno> {
    let name = std::str::from_utf8(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(Errno::EINVAL);
    }
    Ok(if dir == "." { name.to_string() } else { format!("{dir}/{name}") })
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn attr(ino: u64, st: &Stat) -> FileAttr {
    let kind = match st.mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        _ => FileType::RegularFile,
    };
    FileAttr {
        ino: INodeNo(ino),
        size: st.size,
        blocks: st.blocks,
        atime: time(st.atime_ns),
        mtime: time(st.mtime_ns),
        ctime: time(st.ctime_ns),
        crtime: time(st.mtime_ns),
        kind,
        perm: (st.mode & 0o7777) as u16,
        nlink: st.nlink,
        uid: st.uid,
        gid: st.gid,
        rdev: 0,
        blksize: st.blksize,
        flags: 0,
    }
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        _ => FileType::RegularFile,
    }
}

/// Give up the calls made for the caller of `req` once it is dying
/// (`sluice_client::Abandon`): a process killed while the server is dead
/// exits at once, while the mount keeps waiting for the server for every
/// other caller.
fn watch(req: &Request) -> Abandon {
    Abandon::when(caller_dying, req.pid())
}

/// Whether thread `tid` is gone or has a fatal signal pending. The kernel
/// marks a thread whose process is being killed (SIGKILL, or any signal
/// whose default action ends it) with SIGKILL in its pending set; a
/// caller in a FUSE request cannot run its handlers, so nothing else ends
/// the wait. fuser answers `FUSE_INTERRUPT` itself (ENOSYS, after which
/// the kernel sends no more), so the mount looks for itself.
fn caller_dying(tid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{tid}/status")) else { return true };
    let kill_bit = 1u64 << (libc::SIGKILL - 1);
    status
        .lines()
        .filter_map(|l| l.strip_prefix("SigPnd:").or_else(|| l.strip_prefix("ShdPnd:")))
        .any(|hex| u64::from_str_radix(hex.trim(), 16).is_ok_and(|set| set & kill_bit != 0))
}

/// Count a client call and its failure.
fn counted<T>(r: Result<T, Errno>) -> Result<T, Errno> {
    STATS.calls.fetch_add(1, Ordering::Relaxed);
    if r.is_err() {
        STATS.errors.fetch_add(1, Ordering::Relaxed);
    }
    r
}

impl SluiceFs {
    pub fn new(cfg: MountConfig, kind: RemoteKind) -> SluiceFs {
        SluiceFs {
            passthrough: AtomicBool::new(cfg.passthrough),
            conns: Conns::new(cfg.server, kind, cfg.app),
            handles: Mutex::new(HashMap::new()),
            handles_max: HANDLES_MAX,
            listings: Mutex::new(HashMap::new()),
            fh_next: AtomicU64::new(1),
            inodes: Mutex::new(Inodes::new(INODES_MAX)),
            io: Mutex::new(IoModes::new()),
            lends: AtomicU8::new(LENDS_UNKNOWN),
            prime_misses: AtomicU32::new(0),
            opens: AtomicU64::new(0),
        }
    }

    fn client(&self, req: &Request) -> Result<Arc<Remote>, Errno> {
        let caller = Caller { pid: req.pid(), uid: req.uid(), gid: req.gid() };
        self.conns.get(caller).map_err(|e| {
            self.conns.drop_conn(caller);
            errno(e)
        })
    }

    fn path(&self, ino: INodeNo) -> Result<String, Errno> {
        lock(&self.inodes).path(ino.0)
    }

    fn handle(&self, fh: FileHandle) -> Result<(Arc<Remote>, Fd), Errno> {
        lock(&self.handles).get(&fh.0).map(|h| (Arc::clone(&h.client), h.fd)).ok_or(Errno::EBADF)
    }

    fn add_handle(&self, client: Arc<Remote>, fd: Fd, ino: u64, backed: bool) -> Result<u64, Errno> {
        let mut h = lock(&self.handles);
        if h.len() >= self.handles_max {
            drop(h);
            let _ = client.close(fd);
            self.close_mode(ino, backed);
            return Err(Errno::ENFILE);
        }
        let fh = self.fh_next.fetch_add(1, Ordering::Relaxed);
        h.insert(fh, Handle { client, fd, ino, backed });
        STATS.handles_open.store(h.len() as u64, Ordering::Relaxed);
        Ok(fh)
    }

    /// The file to hand the kernel for a passthrough open, when passthrough
    /// is on and the file is wholly cached now (the server lends it).
    fn cached_file(&self, c: &Remote, fd: Fd, size: u64) -> Option<std::fs::File> {
        if !self.passthrough.load(Ordering::Relaxed) {
            return None;
        }
        let lends = self.lends.load(Ordering::Relaxed);
        let prime = lends != LENDS_NO || self.opens.fetch_add(1, Ordering::Relaxed).is_multiple_of(PRIME_RETRY_EVERY);
        match c.passthrough_file(fd, size, prime) {
            Ok(Passthrough::File(f)) => {
                self.lends.store(LENDS_YES, Ordering::Relaxed);
                Some(f)
            }
            Ok(Passthrough::NotLent) if prime && lends == LENDS_UNKNOWN => {
                if self.prime_misses.fetch_add(1, Ordering::Relaxed) + 1 >= PRIME_MISSES_MAX {
                    self.lends.store(LENDS_NO, Ordering::Relaxed);
                }
                None
            }
            _ => None,
        }
    }

    /// Decide how the kernel opens `ino` (`IoModes::open`), under the one
    /// lock, so two opens of one inode never disagree.
    fn open_mode(&self, ino: u64, cached: Option<std::fs::File>, register: impl FnOnce(std::fs::File) -> std::io::Result<BackingId>) -> OpenMode<BackingId> {
        let (mode, refused) = lock(&self.io).open(ino, cached, register);
        // Not root (CAP_SYS_ADMIN): no open will get a backing file.
        if refused.is_some_and(|e| e.raw_os_error() == Some(libc::EPERM)) {
            self.passthrough.store(false, Ordering::Relaxed);
        }
        mode
    }

    fn close_mode(&self, ino: u64, backed: bool) {
        lock(&self.io).close(ino, backed);
    }

    /// `path`'s attributes, and the inode number the kernel now holds once
    /// more. A symbolic link is one (`lstat`): the kernel follows it with
    /// `readlink`, as on any file system. (Before, the server followed it
    /// and the mount showed the target: `rm -rf` and `shutil.rmtree` went
    /// into a link to a directory and emptied the directory.)
    fn entry(&self, c: &Remote, path: &str) -> Result<FileAttr, Errno> {
        let st = counted(c.lstat(path).map_err(errno))?;
        let ino = lock(&self.inodes).remember(path)?;
        Ok(attr(ino, &st))
    }

    fn do_getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>) -> Result<FileAttr, Errno> {
        let st = match fh {
            Some(fh) => {
                let (c, fd) = self.handle(fh)?;
                counted(c.fstat(fd).map_err(errno))?
            }
            None => {
                let by_path = self.path(ino).and_then(|path| counted(self.client(req)?.lstat(&path).map_err(errno)));
                match by_path {
                    // Unlinked (or renamed over) while open: the kernel
                    // sends `fstat` without a handle, so ask one of the
                    // inode's (Python's `tempfile.TemporaryFile` then
                    // `os.fstat` failed with ENOENT).
                    Err(e) if e == Errno::ENOENT => match self.handle_of(ino.0) {
                        Some((c, fd)) => counted(c.fstat(fd).map_err(errno))?,
                        None => return Err(e),
                    },
                    other => other?,
                }
            }
        };
        Ok(attr(ino.0, &st))
    }

    /// An open handle of inode `ino`, if any (a scan: only where its path
    /// is gone).
    fn handle_of(&self, ino: u64) -> Option<(Arc<Remote>, Fd)> {
        lock(&self.handles).values().find(|h| h.ino == ino).map(|h| (Arc::clone(&h.client), h.fd))
    }

    /// Open `path` and learn its attributes; the fd and what was learnt.
    fn open_path(&self, c: &Remote, path: &str, flags: i32, mode: u32) -> Result<(Fd, Stat), Errno> {
        counted(
            (|| {
                let fd = c.open(path, flags, mode)?;
                match c.fstat(fd) {
                    Ok(st) => Ok((fd, st)),
                    Err(e) => {
                        let _ = c.close(fd);
                        Err(e)
                    }
                }
            })()
            .map_err(errno),
        )
    }

    fn do_read(&self, fh: FileHandle, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let since = Instant::now();
        let (c, fd) = self.handle(fh)?;
        let mut buf = vec![0u8; size as usize];
        // Inside a cache lease the read is a `pread` from the page cache.
        let n = match c.pread_leased(fd, &mut buf, offset) {
            Some(r) => {
                STATS.leased_reads.fetch_add(1, Ordering::Relaxed);
                r.map_err(errno)?
            }
            None => counted(c.pread(fd, &mut buf, offset).map_err(errno))?,
        };
        buf.truncate(n);
        STATS.data(false, n, since);
        Ok(buf)
    }

    /// `chmod` and `utimensat` through the mount: the server changes the
    /// mode and times (as the caller). They used to be accepted and
    /// ignored, so `sed -i` and `install -m 755` left files 0600.
    fn do_chattr(&self, req: &Request, ino: INodeNo, mode: Option<u32>, atime: Option<TimeOrNow>, mtime: Option<TimeOrNow>, fh: Option<FileHandle>) -> Result<(), Errno> {
        if mode.is_none() && atime.is_none() && mtime.is_none() {
            return Ok(());
        }
        let ns = |t: Option<TimeOrNow>| match t {
            None => Ok(sluice_client::SETATTR_TIME_OMIT),
            Some(TimeOrNow::Now) => Ok(sluice_client::SETATTR_TIME_NOW),
            Some(TimeOrNow::SpecificTime(t)) => {
                let d = t.duration_since(UNIX_EPOCH).map_err(|_| Errno::EINVAL)?;
                i64::try_from(d.as_nanos()).ok().filter(|&v| v < sluice_client::SETATTR_TIME_NOW).ok_or(Errno::EINVAL)
            }
        };
        let (m, a, t) = (mode.map_or(sluice_client::SETATTR_MODE_KEEP, |m| m & 0o7777), ns(atime)?, ns(mtime)?);
        match fh {
            Some(fh) => {
                let (c, fd) = self.handle(fh)?;
                counted(c.fset_attr(fd, m, a, t).map_err(errno))
            }
            // The kernel resolved any link: the inode is the object itself.
            None => {
                let (c, path) = (self.client(req)?, self.path(ino)?);
                counted(c.set_attr(&path, m, a, t, true).map_err(errno))
            }
        }
    }

    fn do_setattr(&self, req: &Request, ino: INodeNo, size: Option<u64>, fh: Option<FileHandle>) -> Result<FileAttr, Errno> {
        if let Some(size) = size {
            match fh {
                Some(fh) => {
                    let (c, fd) = self.handle(fh)?;
                    counted(c.ftruncate(fd, size).map_err(errno))?;
                }
                None => {
                    let (c, path) = (self.client(req)?, self.path(ino)?);
                    counted(
                        (|| {
                            let fd = c.open(&path, libc::O_WRONLY, 0)?;
                            let r = c.ftruncate(fd, size);
                            let _ = c.close(fd);
                            r
                        })()
                        .map_err(errno),
                    )?;
                }
            }
        }
        self.do_getattr(req, ino, fh)
    }

    /// Unlink a file or (`dir`) remove a directory; its inode number no
    /// longer names it.
    fn remove(&self, req: &Request, parent: INodeNo, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let (c, path) = (self.client(req)?, join(&self.path(parent)?, name)?);
        counted(if dir { c.rmdir(&path) } else { c.unlink(&path) }.map_err(errno))?;
        lock(&self.inodes).removed(&path);
        Ok(())
    }

    /// The directory `ino`'s entries now.
    fn list(&self, req: &Request, ino: INodeNo) -> Result<Listing, Errno> {
        let (c, dir) = (self.client(req)?, self.path(ino)?);
        let list = counted(c.readdir(&dir).map_err(errno))?;
        let inodes = lock(&self.inodes);
        let parent = if dir == "." { 1 } else { inodes.shown(dir.rsplit_once('/').map_or(".", |(p, _)| p)) };
        let dots = [(ino.0, FileType::Directory, ".".to_string()), (parent, FileType::Directory, "..".to_string())];
        Ok(dots
            .into_iter()
            .chain(list.into_iter().map(|e| {
                let path = if dir == "." { e.name.clone() } else { format!("{dir}/{}", e.name) };
                (inodes.shown(&path), kind(e.kind), e.name)
            }))
            .collect())
    }

    /// A handle for a directory being opened, its listing not yet taken.
    fn add_listing(&self) -> Result<u64, Errno> {
        let mut l = lock(&self.listings);
        if l.len() >= self.handles_max {
            return Err(Errno::ENFILE);
        }
        let fh = self.fh_next.fetch_add(1, Ordering::Relaxed);
        l.insert(fh, None);
        Ok(fh)
    }

    fn do_readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, reply: &mut ReplyDirectory) -> Result<(), Errno> {
        let taken = lock(&self.listings).get(&fh.0).cloned().flatten();
        let listing = match taken {
            Some(l) if offset > 0 => l,
            _ => {
                let l = Arc::new(self.list(req, ino)?);
                if let Some(slot) = lock(&self.listings).get_mut(&fh.0) {
                    *slot = Some(Arc::clone(&l));
                }
                l
            }
        };
        for (i, (n, k, name)) in listing.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*n), i as u64 + 1, *k, name) {
                break;
            }
        }
        Ok(())
    }
}

impl Filesystem for SluiceFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE_BYTES);
        // Passthrough needs the kernel's consent at init; a kernel without
        // it refuses, and every open then takes the server path.
        if self.passthrough.load(Ordering::Relaxed) && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok() {
            // 2: the server's files may lie on a stacked file system
            // (overlayfs in a container).
            let _ = config.set_max_stack_depth(2);
        } else {
            self.passthrough.store(false, Ordering::Relaxed);
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _abandon = watch(req);
        let r = (|| {
            let (c, path) = (self.client(req)?, join(&self.path(parent)?, name)?);
            self.entry(&c, &path)
        })();
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        lock(&self.inodes).forget(ino.0, nlookup);
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let _abandon = watch(req);
        let r = (|| {
            let (c, path) = (self.client(req)?, self.path(ino)?);
            counted(c.readlink(&path).map_err(errno))
        })();
        match r {
            Ok(target) => reply.data(target.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _abandon = watch(req);
        match self.do_getattr(req, ino, fh) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    /// Only the size is forwarded (truncate). Mode, owner and times are not
    /// part of the protocol; they are accepted and left unchanged, as
    /// documented in docs/fuse.md, so `cp -p` and `tar x` do not fail.
    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _abandon = watch(req);
        let r = self.do_chattr(req, ino, mode, atime, mtime, fh).and_then(|()| self.do_setattr(req, ino, size, fh));
        match r {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        let _abandon = watch(req);
        let r = (|| {
            let (c, path) = (self.client(req)?, join(&self.path(parent)?, name)?);
            counted(c.mkdir(&path, mode & 0o7777).map_err(errno))?;
            self.entry(&c, &path)
        })();
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    /// `ln -s`: the target is stored as given; the kernel follows it (a
    /// relative one within the mount, an absolute one on this host).
    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &std::path::Path, reply: ReplyEntry) {
        let _abandon = watch(req);
        let r = (|| {
            let (c, path) = (self.client(req)?, join(&self.path(parent)?, link_name)?);
            let target = target.to_str().ok_or(Errno::EINVAL)?;
            counted(c.symlink(target, &path).map_err(errno))?;
            self.entry(&c, &path)
        })();
        match r {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _abandon = watch(req);
        match self.remove(req, parent, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _abandon = watch(req);
        match self.remove(req, parent, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(&self, req: &Request, parent: INodeNo, name: &OsStr, newparent: INodeNo, newname: &OsStr, flags: RenameFlags, reply: ReplyEmpty) {
        let _abandon = watch(req);
        let r = (|| {
            // RENAME_NOREPLACE and RENAME_EXCHANGE are not in the protocol.
            if !flags.is_empty() {
                return Err(Errno::EINVAL);
            }
            let c = self.client(req)?;
            let (from, to) = (join(&self.path(parent)?, name)?, join(&self.path(newparent)?, newname)?);
            counted(c.rename(&from, &to).map_err(errno))?;
            lock(&self.inodes).renamed(&from, &to);
            Ok(())
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _abandon = watch(req);
        let flags = flags.0 & !(libc::O_CREAT | libc::O_EXCL);
        let r = (|| {
            let (c, path) = (self.client(req)?, self.path(ino)?);
            let (fd, st) = self.open_path(&c, &path, flags, 0)?;
            // Only a buffered read-only open may read the page cache itself
            // (module documentation); O_DIRECT asked for the device.
            let cached = if flags & libc::O_ACCMODE == libc::O_RDONLY && flags & libc::O_DIRECT == 0 { self.cached_file(&c, fd, st.size) } else { None };
            let mode = self.open_mode(ino.0, cached, |f| reply.open_backing(&f));
            let fh = self.add_handle(c, fd, ino.0, mode.backed())?;
            Ok((fh, mode))
        })();
        match r {
            Ok((fh, OpenMode::Passthrough(id))) => {
                STATS.passthrough_opens.fetch_add(1, Ordering::Relaxed);
                reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
            }
            Ok((fh, OpenMode::Shared(id))) => {
                STATS.shared_opens.fetch_add(1, Ordering::Relaxed);
                reply.opened_passthrough(FileHandle(fh), DIRECT, &id);
            }
            // Direct I/O: the kernel neither caches nor reshapes the data
            // path; the scheduler sees the application's own sizes.
            Ok((fh, OpenMode::Plain)) => reply.opened(FileHandle(fh), DIRECT),
            Err(e) => reply.error(e),
        }
    }

    fn create(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, flags: i32, reply: ReplyCreate) {
        let _abandon = watch(req);
        let r = (|| {
            let (c, path) = (self.client(req)?, join(&self.path(parent)?, name)?);
            let (fd, st) = self.open_path(&c, &path, flags | libc::O_CREAT, mode & 0o7777)?;
            let ino = match lock(&self.inodes).remember(&path) {
                Ok(ino) => ino,
                Err(e) => {
                    let _ = c.close(fd);
                    return Err(e);
                }
            };
            // The file may exist, and passthrough opens may hold it.
            let mode = self.open_mode(ino, None, |f| reply.open_backing(&f));
            let fh = self.add_handle(c, fd, ino, mode.backed())?;
            Ok((fh, attr(ino, &st), mode))
        })();
        match r {
            Ok((fh, a, OpenMode::Shared(id))) => {
                STATS.shared_opens.fetch_add(1, Ordering::Relaxed);
                reply.created_passthrough(&TTL, &a, Generation(0), FileHandle(fh), DIRECT, &id);
            }
            Ok((fh, a, _)) => reply.created(&TTL, &a, Generation(0), FileHandle(fh), DIRECT),
            Err(e) => reply.error(e),
        }
    }

    fn read(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, size: u32, _flags: OpenFlags, _lock: Option<LockOwner>, reply: ReplyData) {
        let _abandon = watch(req);
        match self.do_read(fh, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(&self, req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, data: &[u8], _wf: WriteFlags, flags: OpenFlags, _lock: Option<LockOwner>, reply: ReplyWrite) {
        let _abandon = watch(req);
        let since = Instant::now();
        // O_APPEND is the file system's to honour (the kernel's offset is
        // its own idea of the size, stale when another mount or client
        // appended): the server hands out the end.
        let append = flags.0 & libc::O_APPEND != 0 && !data.is_empty();
        let write = |c: &Remote, fd: Fd| {
            let at = if append { c.reserve(fd, data.len() as u64)? } else { offset };
            c.pwrite(fd, data, at)
        };
        let r = self.handle(fh).and_then(|(c, fd)| counted(write(&c, fd).map_err(errno)));
        match r {
            Ok(n) => {
                STATS.data(true, n, since);
                reply.written(n as u32)
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock: LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(&self, req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, _lock: Option<LockOwner>, _flush: bool, reply: ReplyEmpty) {
        let _abandon = watch(req);
        let h = {
            let mut all = lock(&self.handles);
            let h = all.remove(&fh.0);
            STATS.handles_open.store(all.len() as u64, Ordering::Relaxed);
            h
        };
        if let Some(h) = &h {
            self.close_mode(h.ino, h.backed);
        }
        match h.map(|h| counted(h.client.close(h.fd).map_err(errno))) {
            Some(Ok(())) => reply.ok(),
            Some(Err(e)) => reply.error(e),
            None => reply.error(Errno::EBADF),
        }
    }

    fn fsync(&self, req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let _abandon = watch(req);
        let r = self.handle(fh).and_then(|(c, fd)| counted(if datasync { c.fdatasync(fd) } else { c.fsync(fd) }.map_err(errno)));
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.add_listing() {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let _abandon = watch(req);
        match self.do_readdir(req, ino, fh, offset, &mut reply) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        lock(&self.listings).remove(&fh.0);
        reply.ok();
    }

    /// The served file system's figures (a cluster's: summed over its data
    /// servers), so `df` and programs that check for free space see them.
    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        let _abandon = watch(req);
        let r = (|| {
            let (c, path) = (self.client(req)?, self.path(ino)?);
            counted(c.statfs(&path).map_err(errno))
        })();
        match r {
            Ok(f) => reply.statfs(f.blocks, f.blocks_free, f.blocks_avail, f.files, f.files_free, f.io_bytes, f.name_max, f.block_bytes),
            Err(e) => reply.error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_server::{Listen, Server, ServerConfig};

    /// An in-process server on a temporary directory, stopped on drop.
    struct Served(sluice_server::ServerHandle, std::path::PathBuf);

    impl Drop for Served {
        fn drop(&mut self) {
            let _ = self.0.shutdown();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }

    fn served(name: &str) -> Served {
        let dir = std::env::temp_dir().join(format!("sluice-fuse-unit-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), b"x").unwrap();
        let h = Server::start(ServerConfig::new(&dir, Listen::Unix(dir.join("s.sock")))).unwrap();
        Served(h, dir)
    }

    /// The kernel's rule, as the mount keeps it: once an inode has a
    /// backing file every open names it (cached read-only opens pass
    /// through, the rest share it); while plain opens last none is
    /// registered; the last close of either kind leaves no entry behind.
    #[test]
    fn io_modes_follow_the_kernels_one_mode_per_inode() {
        let mut m: IoModes<u32> = IoModes::new();
        let never = |_: ()| -> Result<u32, ()> { panic!("no backing file may be registered now") };
        // A cached read-only open registers the backing file.
        let (a, _) = m.open(7, Some(()), |()| Ok::<_, ()>(70));
        assert_eq!(a, OpenMode::Passthrough(Arc::new(70)));
        // A second cached one shares it; a writer (not cached) names it too.
        assert_eq!(m.open(7, Some(()), never).0, OpenMode::Passthrough(Arc::new(70)));
        assert_eq!(m.open(7, None, never).0, OpenMode::Shared(Arc::new(70)));
        for _ in 0..3 {
            m.close(7, true);
        }
        assert_eq!(m.len(), 0, "the last holder took the entry");
        // A plain open first: a cached open meanwhile is plain too.
        assert_eq!(m.open(8, None, never).0, OpenMode::Plain);
        assert_eq!(m.open(8, Some(()), never).0, OpenMode::Plain);
        m.close(8, false);
        assert_eq!(m.open(8, Some(()), never).0, OpenMode::Plain, "one plain open is still there");
        m.close(8, false);
        m.close(8, false);
        assert_eq!(m.len(), 0);
        // Once the plain opens are gone, a backing file again.
        assert_eq!(m.open(8, Some(()), |()| Ok::<_, ()>(80)).0, OpenMode::Passthrough(Arc::new(80)));
        // A refused registration: a plain open, and the refusal reported.
        let (mode, refused) = m.open(9, Some(()), |()| Err::<u32, _>("EPERM"));
        assert_eq!((mode, refused), (OpenMode::Plain, Some("EPERM")));
        // A close the table never saw (none) changes nothing.
        m.close(10, true);
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn connections_table_holds_at_most_connections_max() {
        let s = served("conns");
        let conns = Conns::new(s.0.addr().to_string(), RemoteKind::Server, Some("bound-test".into()));
        for pid in 0..CONNECTIONS_MAX as u32 {
            conns.get(Caller { pid, uid: 0, gid: 0 }).unwrap();
        }
        assert_eq!(conns.len(), CONNECTIONS_MAX, "N connections kept");
        conns.get(Caller { pid: CONNECTIONS_MAX as u32, uid: 0, gid: 0 }).unwrap();
        assert_eq!(conns.len(), CONNECTIONS_MAX, "the N+1st evicts the least recently used");
    }

    #[test]
    fn open_handles_past_the_bound_are_refused_with_enfile() {
        let s = served("handles");
        let mut fs = SluiceFs::new(MountConfig::new(s.0.addr().to_string(), "/unused"), RemoteKind::Server);
        fs.handles_max = 2;
        let c = Arc::new(Remote::connect(s.0.addr()).unwrap());
        for _ in 0..2 {
            let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
            fs.add_handle(Arc::clone(&c), fd, 2, false).unwrap();
        }
        let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
        assert_eq!(fs.add_handle(Arc::clone(&c), fd, 2, false).err(), Some(Errno::ENFILE));
    }

    #[test]
    fn open_directories_past_the_bound_are_refused_with_enfile() {
        let s = served("listings");
        let mut fs = SluiceFs::new(MountConfig::new(s.0.addr().to_string(), "/unused"), RemoteKind::Server);
        fs.handles_max = 2;
        let a = fs.add_listing().unwrap();
        fs.add_listing().unwrap();
        assert_eq!(fs.add_listing().err(), Some(Errno::ENFILE), "N + 1");
        lock(&fs.listings).remove(&a);
        fs.add_listing().unwrap();
    }

    #[test]
    fn inode_table_holds_at_most_its_bound_and_frees_what_the_kernel_forgets() {
        // The root counts: N - 1 more fit, the Nth lookup of a new path fails.
        let mut t = Inodes::new(3);
        let a = t.remember("a").unwrap();
        let b = t.remember("b").unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t.remember("c"), Err(Errno::ENFILE));
        // A known path is not a new entry.
        assert_eq!(t.remember("a"), Ok(a));
        t.forget(a, 1);
        assert_eq!(t.path(a).unwrap(), "a", "one lookup left");
        t.forget(a, 1);
        assert_eq!(t.path(a), Err(Errno::ENOENT));
        let c = t.remember("c").unwrap();
        assert_ne!(c, b);
        t.forget(1, 10);
        assert_eq!(t.path(1).unwrap(), ".", "the root is never forgotten");
    }

    #[test]
    fn renames_move_everything_beneath_and_removals_detach() {
        let mut t = Inodes::new(16);
        let (d, f, g) = (t.remember("d").unwrap(), t.remember("d/f").unwrap(), t.remember("d2").unwrap());
        let other = t.remember("dx").unwrap();
        t.renamed("d", "d2");
        assert_eq!((t.path(d).unwrap(), t.path(f).unwrap()), ("d2".to_string(), "d2/f".to_string()));
        assert_eq!(t.path(g), Err(Errno::ENOENT), "the replaced target no longer names a file");
        assert_eq!(t.path(other).unwrap(), "dx", "a sibling sharing the prefix stays");
        t.removed("d2/f");
        assert_eq!(t.path(f), Err(Errno::ENOENT));
        assert_ne!(t.shown("d2/f"), 0);
        assert!(t.shown("never") >= 1 << 63);
    }

    #[test]
    fn names_that_could_escape_are_refused() {
        for bad in ["..", ".", "", "a/b"] {
            assert_eq!(join("d", OsStr::new(bad)), Err(Errno::EINVAL), "{bad:?}");
        }
        assert_eq!(join(".", OsStr::new("x")).unwrap(), "x");
        assert_eq!(join("d", OsStr::new("x")).unwrap(), "d/x");
    }
}
