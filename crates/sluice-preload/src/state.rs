//! Process-wide state of the interposer: the configuration read from the
//! environment, the reentrancy guard, the connection (one per process,
//! made again in a forked child), the bounded tables of service fds,
//! directory streams and stdio streams, and the one place where a client
//! error becomes an errno value.

use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use libc::c_int;
use sluice_client::{lock, ClientError, ConnectOptions, Fd, ThreadIds};
use sluice_remote::Remote;

use crate::path;

/// Service fds one process may hold at once; one more open fails EMFILE.
pub const FDS_MAX: usize = 4096;
/// Service directory streams (`opendir`) open at once; past it EMFILE.
pub const DIRS_MAX: usize = 1024;
/// Service stdio streams (`fopen`) open at once; past it EMFILE.
pub const FILES_MAX: usize = 1024;

pub use sluice_client::PREFIX_ENV;

/// What `sluice run` passed in the environment.
#[derive(Debug)]
pub struct Config {
    /// Normalised absolute prefix, e.g. `/sluice`.
    pub prefix: String,
    /// `SLUICE_SERVER`, if set.
    pub server: Option<String>,
}

static CONFIG: OnceLock<Option<Config>> = OnceLock::new();

/// The configuration, `None` when `SLUICE_PREFIX` is unset: then every
/// call passes straight through.
pub fn config() -> Option<&'static Config> {
    CONFIG
        .get_or_init(|| {
            let raw = std::env::var(PREFIX_ENV).ok().filter(|p| !p.is_empty())?;
            let cwd = std::env::current_dir().ok().and_then(|d| d.to_str().map(str::to_string)).unwrap_or_else(|| "/".into());
            let server = std::env::var(sluice_client::SERVER_ENV).ok().filter(|s| !s.is_empty());
            Some(Config { prefix: path::join(&cwd, &raw), server })
        })
        .as_ref()
}

thread_local! {
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Held while the interposer works on a call: every libc call made
/// meanwhile on this thread (by the client library, by std) goes straight
/// to libc.
pub struct Guard(());

impl Guard {
    /// `None` when this thread is already inside the interposer (or its
    /// thread-locals are gone): the caller must pass through.
    pub fn enter() -> Option<Guard> {
        BUSY.try_with(|b| {
            if b.get() {
                None
            } else {
                b.set(true);
                Some(Guard(()))
            }
        })
        .ok()
        .flatten()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = BUSY.try_with(|b| b.set(false));
    }
}

/// A POSIX error number for the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub c_int);

/// Client errors as errno: the client's one conversion
/// (`ClientError::posix_errno`).
impl From<ClientError> for Errno {
    fn from(e: ClientError) -> Errno {
        Errno(e.posix_errno())
    }
}

/// `Ok(v)` gives `v`; `Err(e)` sets errno and gives `fail`.
pub fn finish<T>(r: Result<T, Errno>, fail: T) -> T {
    match r {
        Ok(v) => v,
        Err(Errno(n)) => {
            // SAFETY: __errno_location points at this thread's errno.
            unsafe { *libc::__errno_location() = n };
            fail
        }
    }
}

/// The last OS error as an `Errno`, after a real libc call failed.
pub fn last_errno() -> Errno {
    Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
}

/// Incremented in every forked child: connections and server handles of
/// an older generation belong to the parent.
static GENERATION: AtomicU32 = AtomicU32::new(1);
/// The connection of this generation, and the ids of the thread that
/// made it (the server took its identity from them).
static SESSION: Mutex<Option<(u32, Arc<Remote>, ThreadIds)>> = Mutex::new(None);

static WARNED: AtomicBool = AtomicBool::new(false);

pub fn generation() -> u32 {
    GENERATION.load(Ordering::Acquire)
}

/// Connections this process made before its credentials changed, by
/// generation: the files it opened on them stay open there as the old
/// identity (as a kernel fd keeps the rights checked at its open), while
/// everything new goes through a connection made as the new one. At
/// most `KEPT_MAX`; past it the oldest is closed, and its files are
/// reopened by path as the new identity when next used.
static KEPT: Mutex<Vec<(u32, Arc<Remote>)>> = Mutex::new(Vec::new());
pub const KEPT_MAX: usize = 8;

/// The process's credentials changed (`setuid`, `seteuid`, `setgroups`
/// and the rest succeeded): the server took its identity from the socket
/// when it connected, so the next call connects anew, as the process is
/// now. Before, a program that dropped root kept root's rights on the
/// server.
pub fn credentials_changed() {
    let mut s = lock(&SESSION);
    if let Some((g, c, _)) = s.take() {
        keep_bounded(&mut lock(&KEPT), (g, c), KEPT_MAX);
    }
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Push `item`, dropping the oldest first when `v` holds `max` already.
fn keep_bounded<T>(v: &mut Vec<T>, item: T, max: usize) {
    if v.len() >= max {
        v.remove(0);
    }
    v.push(item);
}

/// A process out of descriptors: give back those the server lent (they
/// serve cache leases only), so a retry can succeed; whether any were
/// held. Not from inside the interposer, which may hold these locks.
pub fn shed_lent() -> bool {
    let Some(_g) = Guard::enter() else { return false };
    shed_lent_inside()
}

/// [`shed_lent`] from inside the interposer (the guard held, none of the
/// state's locks).
pub fn shed_lent_inside() -> bool {
    if sluice_client::lent_held() == 0 {
        return false;
    }
    let mut all: Vec<Arc<Remote>> = lock(&SESSION).iter().map(|(_, c, _)| Arc::clone(c)).collect();
    all.extend(lock(&KEPT).iter().map(|(_, c)| Arc::clone(c)));
    for c in all {
        c.shed_lent();
    }
    true
}

/// The connection of generation `g` (masked as in [`pack`]) if this
/// process still holds it.
fn session_of(g: u32) -> Option<Arc<Remote>> {
    if let Some((sg, c, _)) = lock(&SESSION).as_ref() {
        if sg & 0xffff == g {
            return Some(Arc::clone(c));
        }
    }
    lock(&KEPT).iter().find(|(kg, _)| kg & 0xffff == g).map(|(_, c)| Arc::clone(c))
}

/// This process's connection, made on first use (again after fork). When
/// the server cannot be reached, one line goes to stderr and the call
/// fails; the next call tries again.
pub fn client() -> Result<Arc<Remote>, Errno> {
    let mut gen = generation();
    let changed = match lock(&SESSION).as_ref() {
        Some((g, c, ids)) if *g == gen => {
            if ids.still() {
                return Ok(Arc::clone(c));
            }
            true
        }
        _ => false,
    };
    if changed {
        // The thread's credentials changed without libc's wrappers (raw
        // system calls, as Go programs and static helpers make them): as
        // after `setuid`, files opened before stay open as the old
        // identity, and everything new goes through a new connection.
        credentials_changed();
        gen = generation();
    }
    let Some(addr) = config().and_then(|c| c.server.as_deref()) else {
        warn_once("sluice: no server given: set SLUICE_SERVER (sluice run --server ADDR)");
        return Err(Errno(libc::ECONNREFUSED));
    };
    match Remote::connect_with(addr, ConnectOptions::default()) {
        Ok(c) => {
            let c = Arc::new(c);
            *lock(&SESSION) = Some((gen, Arc::clone(&c), ThreadIds::now()));
            Ok(c)
        }
        Err(e) => {
            warn_once(&format!("sluice: cannot reach server at {addr}: {e}"));
            Err(Errno::from(e))
        }
    }
}

fn warn_once(line: &str) {
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!("{line}");
    }
}

/// Open file flags that matter after `open` (creation flags dropped).
pub fn kept_flags(flags: c_int) -> c_int {
    flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOCTTY)
}

/// One open service file, shared by every fd `dup`ed from it.
#[derive(Debug)]
pub struct Open {
    /// Server path.
    pub path: String,
    /// Access mode and status flags (`F_GETFL`).
    pub flags: AtomicI32,
    /// Server handle and its generation, packed by [`pack`]; 0 = none.
    handle: AtomicU64,
    /// The pid of the process whose thread holds the position now, 0 when
    /// none (`Open::position_lock`).
    pos_owner: AtomicI32,
    /// The file's inode number when it was opened (0: unknown): a reopen
    /// by path in a forked child or after `exec` that finds another file
    /// fails with ESTALE instead of using it.
    ino: u64,
    /// Another process may hold this open file too: it was open across a
    /// `fork` (in the parent and the child) or inherited across `exec`.
    /// Its position is then held across processes as well.
    shared: AtomicBool,
    /// The placeholder's offset moves atomically (an `O_TMPFILE` one, not
    /// a memfd: placeholder.rs), so a write takes its range without a lock.
    atomic_pos: bool,
}

/// The position of an open file held (`Open::position_lock`); with the
/// placeholder whose record lock is held too, for a shared file.
pub struct PositionGuard<'a>(&'a AtomicI32, Option<c_int>);

impl Drop for PositionGuard<'_> {
    fn drop(&mut self) {
        if let Some(fd) = self.1 {
            let _ = record_lock(fd, libc::F_UNLCK);
        }
        self.0.store(0, Ordering::Release);
    }
}

/// Set (`F_WRLCK`, waiting) or clear (`F_UNLCK`) a POSIX record lock on
/// the first byte of a placeholder. Such locks belong to a process, so
/// they order processes that share one open file (threads are ordered by
/// `pos_owner`), and the kernel drops them when the process dies.
fn record_lock(fd: c_int, kind: c_int) -> Result<(), Errno> {
    // SAFETY: an all-zero flock is valid; the fields that matter are set.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    (l.l_type, l.l_whence, l.l_start, l.l_len) = (kind as libc::c_short, libc::SEEK_SET as libc::c_short, 0, 1);
    let cmd = if kind == libc::F_UNLCK { libc::F_SETLK } else { libc::F_SETLKW };
    loop {
        // SAFETY: fcntl with a valid flock on an fd we were handed.
        if unsafe { crate::real::real!(fcntl, fn(c_int, c_int, *mut libc::flock) -> c_int)(fd, cmd, &mut l) } == 0 {
            return Ok(());
        }
        let e = last_errno();
        if e.0 != libc::EINTR {
            return Err(e);
        }
    }
}

/// Bits of a server handle kept in [`Open`]; the generation takes the rest.
const HANDLE_BITS: u32 = 48;

fn pack(gen: u32, fd: Fd) -> u64 {
    (u64::from(gen & 0xffff) << HANDLE_BITS) | ((fd.0 + 1) & ((1 << HANDLE_BITS) - 1))
}

fn unpack(v: u64) -> Option<(u32, Fd)> {
    (v != 0).then(|| ((v >> HANDLE_BITS) as u32, Fd((v & ((1 << HANDLE_BITS) - 1)) - 1)))
}

impl Open {
    pub fn new(path: String, flags: c_int, handle: Option<Fd>, ino: u64, atomic_pos: bool) -> Open {
        let h = handle.map_or(0, |fd| pack(generation(), fd));
        Open { path, flags: AtomicI32::new(kept_flags(flags)), handle: AtomicU64::new(h), pos_owner: AtomicI32::new(0), ino, shared: AtomicBool::new(false), atomic_pos }
    }

    /// What a relative move of the position needs: nothing where the
    /// placeholder's offset moves atomically, else the position lock.
    pub fn range_lock(&self, fd: c_int) -> Option<PositionGuard<'_>> {
        (!self.atomic_pos).then(|| self.position_lock(fd))
    }

    /// Another process may hold this open file (`Open::shared`).
    pub fn set_shared(&self) {
        self.shared.store(true, Ordering::Release);
    }

    /// Hold this file's position for one read that reads it, moves data
    /// and sets it, as the kernel's `f_pos` lock does for a file that
    /// threads share, so two never read the same bytes (writes take their
    /// range with one `lseek` instead, under this lock only on a memfd
    /// placeholder: `io::svc_write`, `range_lock`). Between threads,
    /// `pos_owner` (a lock a thread held when its process forked is taken
    /// over by the child, where that thread does not exist); between
    /// processes that share the file (`shared`), a record lock on the
    /// placeholder `fd` as well, which the kernel's lock on the one open
    /// file description stands for locally.
    pub fn position_lock(&self, fd: c_int) -> PositionGuard<'_> {
        let mut g = self.thread_lock();
        if self.shared.load(Ordering::Acquire) && record_lock(fd, libc::F_WRLCK).is_ok() {
            g.1 = Some(fd);
        }
        g
    }

    fn thread_lock(&self) -> PositionGuard<'_> {
        // This process's pid without a system call on every read and write:
        // `OWNER_PID` is set at start and in each forked child.
        let me = OWNER_PID.load(Ordering::Acquire);
        let mut spins = 0u32;
        loop {
            match self.pos_owner.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return PositionGuard(&self.pos_owner, None),
                Err(owner) if owner != me => {
                    // Held when this process was forked: no thread here
                    // will give it back.
                    if self.pos_owner.compare_exchange(owner, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                        return PositionGuard(&self.pos_owner, None);
                    }
                }
                Err(_) => {
                    // Another thread of this process reads at the position:
                    // a round trip, usually; a server that is
                    // down can make it seconds, so the waits grow to 1 ms.
                    spins = spins.saturating_add(1);
                    if spins < 64 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(std::time::Duration::from_micros(u64::from((spins - 63).min(50)) * 20));
                    }
                }
            }
        }
    }

    pub fn flags(&self) -> c_int {
        self.flags.load(Ordering::Relaxed)
    }

    /// The connection and this file's handle on it; reopened by path in a
    /// forked child or after exec (without O_CREAT/O_TRUNC).
    pub fn handle(&self) -> Result<(Arc<Remote>, Fd), Errno> {
        let c = client()?;
        let gen = generation() & 0xffff;
        let seen = self.handle.load(Ordering::Acquire);
        if let Some((g, fd)) = unpack(seen) {
            if g == gen {
                return Ok((c, fd));
            }
            // Opened before the credentials changed: still open there.
            if let Some(old) = session_of(g) {
                return Ok((old, fd));
            }
        }
        // O_APPEND stays: the client then takes no write lease for it, so
        // its appends reach the server, which keeps their ranges.
        let fd = c.open(&self.path, self.flags() & !libc::O_DIRECT, 0)?;
        if self.ino != 0 && c.ino(fd).is_ok_and(|now| now != self.ino) {
            // The path names another file now (replaced by a rename, or
            // removed and made anew): this fd's file is gone, as an NFS
            // client would say, rather than the other file written.
            let _ = c.close(fd);
            return Err(Errno(libc::ESTALE));
        }
        match self.handle.compare_exchange(seen, pack(gen, fd), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok((c, fd)),
            Err(now) => {
                let _ = c.close(fd);
                let (_, theirs) = unpack(now).ok_or(Errno(libc::EBADF))?;
                Ok((c, theirs))
            }
        }
    }

    /// Close the server handle if this process opened it.
    pub fn release(&self) -> Result<(), Errno> {
        let v = self.handle.swap(0, Ordering::AcqRel);
        match unpack(v).and_then(|(g, fd)| Some((session_of(g)?, fd))) {
            Some((c, fd)) => Ok(c.close(fd)?),
            None => Ok(()),
        }
    }
}

/// A map with a named bound: inserting past it fails with EMFILE.
pub struct Bounded<K, V> {
    map: HashMap<K, V>,
    max: usize,
}

impl<K: Eq + Hash, V> Bounded<K, V> {
    pub fn new(max: usize) -> Bounded<K, V> {
        Bounded { map: HashMap::new(), max }
    }

    /// Insert or replace; a new key past the bound is refused.
    pub fn insert(&mut self, k: K, v: V) -> Result<Option<V>, Errno> {
        if self.map.len() >= self.max && !self.map.contains_key(&k) {
            return Err(Errno(libc::EMFILE));
        }
        Ok(self.map.insert(k, v))
    }

    pub fn get(&self, k: &K) -> Option<&V> {
        self.map.get(k)
    }

    pub fn remove(&mut self, k: &K) -> Option<V> {
        self.map.remove(k)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.map.keys()
    }
}

/// Every table of the interposer, under one lock.
pub struct Tables {
    /// Local fd (a placeholder) -> service file.
    pub fds: Bounded<c_int, Arc<Open>>,
    /// Addresses of our `DIR` streams.
    pub dirs: Bounded<usize, ()>,
    /// Our stdio `FILE` streams -> their service fd.
    pub files: Bounded<usize, c_int>,
}

static TABLES: Mutex<Option<Tables>> = Mutex::new(None);
/// Entries in all tables: 0 lets every fd call skip the lock.
static ENTRIES: AtomicUsize = AtomicUsize::new(0);

/// Whether any table has an entry (cheap; a hint, checked under the lock).
pub fn any_entries() -> bool {
    ENTRIES.load(Ordering::Relaxed) != 0
}

/// Run `f` on the tables, under their lock.
pub fn with_tables<R>(f: impl FnOnce(&mut Tables) -> R) -> R {
    let mut g = lock(&TABLES);
    let t = g.get_or_insert_with(|| Tables { fds: Bounded::new(FDS_MAX), dirs: Bounded::new(DIRS_MAX), files: Bounded::new(FILES_MAX) });
    let r = f(t);
    let n = t.fds.len() + t.dirs.len() + t.files.len();
    if ENTRIES.load(Ordering::Relaxed) != n {
        ENTRIES.store(n, Ordering::Relaxed);
    }
    r
}

/// The service file behind local fd `fd`, if any.
pub fn lookup(fd: c_int) -> Option<Arc<Open>> {
    if fd < 0 || !any_entries() {
        return None;
    }
    with_tables(|t| t.fds.get(&fd).cloned())
}

/// The session, table, kept-connection and cwd locks, as held across
/// `fork`.
type HeldLocks =
    (MutexGuard<'static, Option<(u32, Arc<Remote>, ThreadIds)>>, MutexGuard<'static, Option<Tables>>, MutexGuard<'static, Vec<(u32, Arc<Remote>)>>, MutexGuard<'static, Option<String>>);

/// Locks held across `fork` so the child never inherits one mid-update.
struct ForkLocks(UnsafeCell<Option<HeldLocks>>);

// SAFETY: only touched by the atfork handlers, which run on the forking
// thread, one fork at a time (the prepare handler holds the four locks).
unsafe impl Sync for ForkLocks {}

static FORK_LOCKS: ForkLocks = ForkLocks(UnsafeCell::new(None));

extern "C" fn fork_prepare() {
    // The order every path takes them in: SESSION, TABLES, KEPT, CWD.
    let s = lock(&SESSION);
    let t = lock(&TABLES);
    let k = lock(&KEPT);
    let c = lock(&crate::cwd::CWD);
    // SAFETY: see `ForkLocks`.
    unsafe { *FORK_LOCKS.0.get() = Some((s, t, k, c)) };
}

/// Mark every open file of the tables held across `fork` shared: parent
/// and child now both hold them.
fn share_held_files() {
    // SAFETY: see `ForkLocks`.
    if let Some(t) = unsafe { &*FORK_LOCKS.0.get() }.as_ref().and_then(|(_, t, _, _)| t.as_ref()) {
        for open in t.fds.map.values() {
            open.set_shared();
        }
    }
}

extern "C" fn fork_parent() {
    share_held_files();
    // SAFETY: see `ForkLocks`; dropping the guards unlocks.
    unsafe { *FORK_LOCKS.0.get() = None };
}

/// The process whose memory holds these tables: set when the library
/// starts and in each forked child. A child that shares its parent's
/// memory (`vfork`, `clone(CLONE_VM)`) is another process with the
/// parent's tables: it must not change them (`owns_tables`).
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

/// Whether the calling process is the one the tables describe (a system
/// call: only on paths that close service fds).
pub fn owns_tables() -> bool {
    // SAFETY: getpid has no preconditions.
    OWNER_PID.load(Ordering::Acquire) == unsafe { libc::getpid() }
}

extern "C" fn fork_child() {
    // SAFETY: getpid has no preconditions.
    OWNER_PID.store(unsafe { libc::getpid() }, Ordering::Release);
    GENERATION.fetch_add(1, Ordering::AcqRel);
    share_held_files();
    // The parent's connections are the parent's: never dropped here, whose
    // drop would close descriptor numbers the child may have closed and
    // reused since (a child that closed every fd, then connected, got the
    // same numbers, and the old connection's drop closed its new socket:
    // EIO for good, and `mpirun` from a service directory failed).
    // SAFETY: see `ForkLocks`; the child is single-threaded here.
    if let Some((s, _, k, _)) = unsafe { (*FORK_LOCKS.0.get()).as_mut() } {
        std::mem::forget(s.take());
        std::mem::forget(std::mem::take(&mut **k));
    }
    // SAFETY: see `ForkLocks`; the child is single-threaded here.
    unsafe { *FORK_LOCKS.0.get() = None };
}

/// The process's file mode creation mask, applied to what it creates on
/// the server (the kernel applies it to local files only): read when the
/// library starts, kept by the interposed `umask`.
static UMASK: AtomicU32 = AtomicU32::new(0o022);

/// Read the mask (from the constructor: one thread, so the two calls
/// cannot race another thread's `umask`).
pub fn read_umask() {
    // SAFETY: umask has no preconditions; the second call restores it.
    let m = unsafe {
        let m = libc::umask(0);
        libc::umask(m);
        m
    };
    set_umask(m);
}

/// Record the mask a `umask` call set.
pub fn set_umask(m: libc::mode_t) {
    UMASK.store(m & 0o777, Ordering::Release);
}

/// `mode` with the process's mask applied.
pub fn masked(mode: libc::mode_t) -> libc::mode_t {
    mode & !UMASK.load(Ordering::Acquire)
}

/// Register the fork handlers (once, from the library constructor).
pub fn install_fork_handlers() {
    // SAFETY: getpid has no preconditions.
    OWNER_PID.store(unsafe { libc::getpid() }, Ordering::Release);
    // SAFETY: three valid `extern "C" fn()` handlers.
    unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_connections_are_kept_at_most_kept_max() {
        let mut v = Vec::new();
        for i in 0..KEPT_MAX {
            keep_bounded(&mut v, i, KEPT_MAX);
        }
        assert_eq!(v, (0..KEPT_MAX).collect::<Vec<_>>(), "N kept");
        keep_bounded(&mut v, KEPT_MAX, KEPT_MAX);
        assert_eq!(v, (1..=KEPT_MAX).collect::<Vec<_>>(), "N+1: the oldest goes");
    }

    #[test]
    fn tables_refuse_a_new_entry_past_their_bound() {
        for max in [FDS_MAX, DIRS_MAX, FILES_MAX] {
            let mut t: Bounded<usize, ()> = Bounded::new(max);
            for k in 0..max {
                assert_eq!(t.insert(k, ()), Ok(None));
            }
            assert_eq!(t.insert(max, ()), Err(Errno(libc::EMFILE)));
            assert_eq!(t.insert(0, ()), Ok(Some(())), "replacing stays allowed at the bound");
            t.remove(&0);
            assert_eq!(t.insert(max, ()), Ok(None));
        }
    }

    #[test]
    fn handles_round_trip_through_their_packing() {
        for (gen, fd) in [(1, 0), (2, 41), (0xffff, (1 << HANDLE_BITS) - 2)] {
            assert_eq!(unpack(pack(gen, Fd(fd))), Some((gen, Fd(fd))));
        }
        assert_eq!(unpack(0), None);
    }

    #[test]
    fn client_errors_become_errno() {
        use sluice_client::ClientErrorKind;
        let e = ClientError { kind: ClientErrorKind::Connect, errno: libc::ENOENT, message: String::new() };
        assert_eq!(Errno::from(e), Errno(libc::ECONNREFUSED));
        let e = ClientError { kind: ClientErrorKind::Server, errno: libc::ENOSPC, message: String::new() };
        assert_eq!(Errno::from(e), Errno(libc::ENOSPC));
        let e = ClientError { kind: ClientErrorKind::Protocol, errno: 0, message: String::new() };
        assert_eq!(Errno::from(e), Errno(libc::EIO));
    }
}
