//! The interposed fd calls: open, close, read/write and their positional
//! and vectored forms, lseek, sync, truncate, dup and fcntl. Each export
//! routes to the server when the fd or path is a service one (see
//! [`crate::route`]) and otherwise calls libc's own function untouched.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use libc::{c_char, c_int, c_long, c_uint, c_void, iovec, mode_t, off_t, size_t, ssize_t};

use crate::placeholder;
use crate::real::real;
use crate::route::{service_fd, service_path};
use crate::state::{client, finish, last_errno, with_tables, Errno, Open};

/// Open server path `path` and give it a placeholder fd.
pub fn svc_open(path: &str, flags: c_int, mode: mode_t) -> Result<c_int, Errno> {
    let c = client()?;
    // The placeholder and the table's room first: a process out of
    // descriptors gets EMFILE before anything is made on the server (an
    // O_CREAT open created the file, then failed).
    if with_tables(|t| t.fds.len()) >= crate::state::FDS_MAX {
        return Err(Errno(libc::EMFILE));
    }
    let (fd, atomic) = match placeholder::create(flags) {
        // Out of descriptors: the lent ones go back (outside our guard:
        // the caller holds it), then once more.
        Err(Errno(libc::EMFILE)) if crate::state::shed_lent_inside() => placeholder::create(flags)?,
        other => other?,
    };
    let opened = c.open(path, flags & !libc::O_CLOEXEC, crate::state::masked(mode)).map_err(Errno::from).and_then(|h| {
        let ino = c.ino(h).unwrap_or(0);
        match placeholder::record(fd, path, flags, ino) {
            Ok(()) => Ok((h, ino)),
            Err(e) => {
                let _ = c.close(h);
                Err(e)
            }
        }
    });
    let (h, ino) = match opened {
        Ok(v) => v,
        Err(e) => {
            placeholder::close_real(fd);
            return Err(e);
        }
    };
    let open = Arc::new(Open::new(path.to_string(), flags, Some(h), ino, atomic));
    match with_tables(|t| t.fds.insert(fd, Arc::clone(&open))) {
        Ok(_) => {
            // `close(1); open(…)`: the standard stream follows its fd.
            crate::stdio::follow_std_fd(fd);
            Ok(fd)
        }
        Err(e) => {
            placeholder::close_real(fd);
            let _ = open.release();
            Err(e)
        }
    }
}

/// Drop `fd` from the table; the server handle closes with its last fd.
fn forget(fd: c_int) -> Result<(), Errno> {
    match with_tables(|t| t.fds.remove(&fd)).and_then(Arc::into_inner) {
        Some(open) => open.release(),
        None => Ok(()),
    }
}

/// Record that local fd `new` now refers to `open` (after a dup).
fn alias(new: c_int, open: Arc<Open>) -> Result<c_int, Errno> {
    match with_tables(|t| t.fds.insert(new, open)) {
        Ok(old) => {
            if let Some(o) = old.and_then(Arc::into_inner) {
                o.release()?;
            }
            Ok(new)
        }
        Err(e) => {
            placeholder::close_real(new);
            Err(e)
        }
    }
}

fn check_access(open: &Open, write: bool) -> Result<(), Errno> {
    let acc = open.flags() & libc::O_ACCMODE;
    let ok = if write { acc != libc::O_RDONLY } else { acc != libc::O_WRONLY };
    if ok {
        Ok(())
    } else {
        Err(Errno(libc::EBADF))
    }
}

fn svc_pread(open: &Open, buf: &mut [u8], at: u64) -> Result<usize, Errno> {
    check_access(open, false)?;
    let (c, h) = open.handle()?;
    Ok(c.pread(h, buf, at)?)
}

/// Write at `at`, or with `O_APPEND` at the file's end, as Linux's
/// `pwrite` does too; the offset written at and the count.
fn svc_pwrite_at(open: &Open, data: &[u8], at: u64) -> Result<(u64, usize), Errno> {
    check_access(open, true)?;
    let (c, h) = open.handle()?;
    // The server hands out the end: two processes appending at once never
    // write at one offset, as the kernel's inode lock ensures locally.
    let at = if open.flags() & libc::O_APPEND != 0 && !data.is_empty() { c.reserve(h, data.len() as u64)? } else { at };
    Ok((at, c.pwrite(h, data, at)?))
}

fn svc_pwrite(open: &Open, data: &[u8], at: u64) -> Result<usize, Errno> {
    Ok(svc_pwrite_at(open, data, at)?.1)
}

/// Read at the placeholder's offset and advance it.
pub fn svc_read(fd: c_int, open: &Open, buf: &mut [u8]) -> Result<usize, Errno> {
    let _held = open.position_lock(fd);
    let at = placeholder::position(fd)?;
    let n = svc_pread(open, buf, at)?;
    placeholder::seek(fd, (at + n as u64) as i64, libc::SEEK_SET)?;
    Ok(n)
}

/// Write at the position (at the end with O_APPEND) and advance it.
/// The range is taken by moving the placeholder's offset first (one
/// `lseek`, which the kernel makes atomic for every thread and process
/// sharing an `O_TMPFILE` placeholder), so no lock is held across the
/// round trip: a process stopped in the middle of a write (Ctrl-Z, a
/// debugger) held the others up for as long as it stayed stopped. A
/// memfd placeholder (where `/dev/shm` is missing) has no atomic
/// position, so there the `lseek` is made under the position lock
/// (`Open::range_lock`): two processes moving it at once could both take
/// one range, and one write was overwritten. That was so for every
/// placeholder before commit 035d35c: 1 or 2 of 1,200 lines lost in 7 of 60
/// runs of `subshells_writing_to_an_inherited_fd_lose_nothing`
/// (placeholder.rs has the kernel's side).
pub fn svc_write(fd: c_int, open: &Open, data: &[u8]) -> Result<usize, Errno> {
    check_access(open, true)?;
    if data.is_empty() {
        return Ok(0);
    }
    if open.flags() & libc::O_APPEND != 0 {
        // The server chooses where (`svc_pwrite_at`); the position follows.
        let (at, n) = svc_pwrite_at(open, data, 0)?;
        placeholder::seek(fd, (at + n as u64) as i64, libc::SEEK_SET)?;
        return Ok(n);
    }
    let len = data.len() as u64;
    let step = i64::try_from(len).map_err(|_| Errno(libc::EINVAL))?;
    let end = {
        let _held = open.range_lock(fd);
        placeholder::seek(fd, step, libc::SEEK_CUR)?
    };
    let at = end - len;
    let r = svc_pwrite_at(open, data, at).map(|(_, n)| n);
    let done = r.as_ref().map_or(0, |&n| n as u64);
    if done < len {
        // A short or failed write gives back what it did not write, unless
        // another writer moved the offset since (then its range follows).
        let _held = open.range_lock(fd);
        if placeholder::position(fd) == Ok(end) {
            let _ = placeholder::seek(fd, (at + done) as i64, libc::SEEK_SET);
        }
    }
    r
}

fn svc_size(open: &Open) -> Result<u64, Errno> {
    let (c, h) = open.handle()?;
    Ok(c.fstat(h)?.size)
}

pub fn svc_lseek(fd: c_int, open: &Open, off: i64, whence: c_int) -> Result<u64, Errno> {
    let beyond = |at: i64| at < 0 || at as u64 >= u64::MAX / 2;
    match whence {
        libc::SEEK_SET => placeholder::seek(fd, off, whence),
        libc::SEEK_CUR => {
            // A relative move of a memfd placeholder's offset is not
            // atomic: under the lock writes take there (`svc_write`).
            let _held = if off == 0 { None } else { open.range_lock(fd) };
            placeholder::seek(fd, off, whence)
        }
        libc::SEEK_END => {
            let at = (svc_size(open)? as i64).checked_add(off).filter(|a| !beyond(*a)).ok_or(Errno(libc::EINVAL))?;
            placeholder::seek(fd, at, libc::SEEK_SET)
        }
        libc::SEEK_DATA | libc::SEEK_HOLE => {
            let size = svc_size(open)? as i64;
            if off < 0 || off >= size {
                return Err(Errno(libc::ENXIO));
            }
            placeholder::seek(fd, if whence == libc::SEEK_DATA { off } else { size }, libc::SEEK_SET)
        }
        _ => Err(Errno(libc::EINVAL)),
    }
}

/// # Safety
/// `buf` holds `n` bytes (or `n` is 0).
unsafe fn bytes_mut<'a>(buf: *mut c_void, n: size_t) -> &'a mut [u8] {
    if n == 0 || buf.is_null() {
        return &mut [];
    }
    // SAFETY: the caller's buffer of `n` bytes, as read(2) requires.
    unsafe { std::slice::from_raw_parts_mut(buf.cast(), n) }
}

/// # Safety
/// `buf` holds `n` bytes (or `n` is 0).
unsafe fn bytes<'a>(buf: *const c_void, n: size_t) -> &'a [u8] {
    if n == 0 || buf.is_null() {
        return &[];
    }
    // SAFETY: the caller's buffer of `n` bytes, as write(2) requires.
    unsafe { std::slice::from_raw_parts(buf.cast(), n) }
}

/// # Safety
/// `iov` holds `cnt` valid iovecs.
unsafe fn iovecs<'a>(iov: *const iovec, cnt: c_int) -> Result<&'a [iovec], Errno> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(Errno(libc::EINVAL));
    }
    if cnt == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller's array of `cnt` iovecs, as readv(2) requires.
    Ok(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

fn gather(iov: &[iovec]) -> Vec<u8> {
    let mut v = Vec::with_capacity(iov.iter().map(|i| i.iov_len).sum());
    for i in iov {
        // SAFETY: each iovec describes a readable buffer of the caller.
        v.extend_from_slice(unsafe { bytes(i.iov_base, i.iov_len) });
    }
    v
}

fn scatter(iov: &[iovec], mut data: &[u8]) {
    for i in iov {
        let k = i.iov_len.min(data.len());
        // SAFETY: each iovec describes a writable buffer of the caller.
        let dst = unsafe { bytes_mut(i.iov_base, i.iov_len) };
        dst[..k].copy_from_slice(&data[..k]);
        data = &data[k..];
    }
}

/// `preadv`/`readv` through one server read; `at` None: the fd position.
fn svc_readv(fd: c_int, open: &Open, iov: &[iovec], at: Option<u64>) -> Result<usize, Errno> {
    let mut buf = vec![0u8; iov.iter().map(|i| i.iov_len).sum()];
    let n = match at {
        Some(at) => svc_pread(open, &mut buf, at)?,
        None => svc_read(fd, open, &mut buf)?,
    };
    scatter(iov, &buf[..n]);
    Ok(n)
}

fn svc_writev(fd: c_int, open: &Open, iov: &[iovec], at: Option<u64>) -> Result<usize, Errno> {
    let data = gather(iov);
    match at {
        Some(at) => svc_pwrite(open, &data, at),
        None => svc_write(fd, open, &data),
    }
}

fn offset(off: off_t) -> Result<u64, Errno> {
    u64::try_from(off).map_err(|_| Errno(libc::EINVAL))
}

// ---- open --------------------------------------------------------------

unsafe fn open_at(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> Option<c_int> {
    // SAFETY: `path` comes from the caller of open(2).
    let (_g, p) = unsafe { service_path(dirfd, path) }?;
    Some(finish(svc_open(&p, flags, mode), -1))
}

/// A local open that failed with EMFILE while the server's lent
/// descriptors were held is tried once more after giving them back: they
/// serve cache leases only, and must not cost the program its own files.
fn local_open(mut open: impl FnMut() -> c_int) -> c_int {
    let r = open();
    if r < 0 && last_errno().0 == libc::EMFILE && crate::state::shed_lent() {
        return open();
    }
    r
}

macro_rules! open_export {
    ($name:ident) => {
        /// Interposed `open` family: service paths open on the server.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
            // SAFETY: forwarding the caller's arguments.
            unsafe { open_at(libc::AT_FDCWD, path, flags, mode) }
                .unwrap_or_else(|| local_open(|| unsafe { real!($name, fn(*const c_char, c_int, mode_t) -> c_int)(path, flags, mode) }))
        }
    };
}
open_export!(open);
open_export!(open64);

macro_rules! openat_export {
    ($name:ident) => {
        /// Interposed `openat`: relative to a service directory fd too.
        #[no_mangle]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
            // SAFETY: forwarding the caller's arguments.
            unsafe { open_at(dirfd, path, flags, mode) }
                .unwrap_or_else(|| local_open(|| unsafe { real!($name, fn(c_int, *const c_char, c_int, mode_t) -> c_int)(dirfd, path, flags, mode) }))
        }
    };
}
openat_export!(openat);
openat_export!(openat64);

macro_rules! open2_export {
    ($name:ident) => {
        /// Interposed fortified `__open_2` (open without a mode).
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, flags: c_int) -> c_int {
            // SAFETY: forwarding the caller's arguments.
            unsafe { open_at(libc::AT_FDCWD, path, flags, 0) }.unwrap_or_else(|| unsafe { real!($name, fn(*const c_char, c_int) -> c_int)(path, flags) })
        }
    };
}
open2_export!(__open_2);
open2_export!(__open64_2);

macro_rules! openat2_export {
    ($name:ident) => {
        /// Interposed fortified `__openat_2`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
            // SAFETY: forwarding the caller's arguments.
            unsafe { open_at(dirfd, path, flags, 0) }.unwrap_or_else(|| unsafe { real!($name, fn(c_int, *const c_char, c_int) -> c_int)(dirfd, path, flags) })
        }
    };
}
openat2_export!(__openat_2);
openat2_export!(__openat64_2);

macro_rules! creat_export {
    ($name:ident) => {
        /// Interposed `creat`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: mode_t) -> c_int {
            let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
            // SAFETY: forwarding the caller's arguments.
            unsafe { open_at(libc::AT_FDCWD, path, flags, mode) }.unwrap_or_else(|| unsafe { real!($name, fn(*const c_char, mode_t) -> c_int)(path, mode) })
        }
    };
}
creat_export!(creat);
creat_export!(creat64);

// ---- close, dup --------------------------------------------------------

/// Close service fd `fd` (the guard held): the placeholder, then the
/// server handle if this was the file's last fd.
pub fn svc_close(fd: c_int) -> Result<c_int, Errno> {
    let r = placeholder::close_real(fd);
    let e = last_errno();
    let released = forget(fd);
    if r < 0 {
        return Err(e);
    }
    released.map(|()| 0)
}

/// Interposed `close`: the server handle closes with the file's last fd.
/// A child sharing its parent's memory (`clone(CLONE_VM)`) closes only
/// its own descriptor: the tables, and the handles, are the parent's.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if let Some((_g, open)) = service_fd(fd) {
        drop(open);
        if crate::state::owns_tables() {
            return finish(svc_close(fd), -1);
        }
    }
    // SAFETY: libc's close with the caller's argument.
    unsafe { real!(close, fn(c_int) -> c_int)(fd) }
}

/// Interposed `close_range`: service fds in the range are forgotten.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: libc's close_range with the caller's arguments.
    let r = unsafe { real!(close_range, fn(c_uint, c_uint, c_int) -> c_int)(first, last, flags) };
    if r == 0 && flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && crate::state::any_entries() && crate::state::owns_tables() {
        if let Some(_g) = crate::state::Guard::enter() {
            let gone: Vec<c_int> = with_tables(|t| t.fds.keys().copied().filter(|&fd| fd as c_uint >= first && fd as c_uint <= last).collect());
            for fd in gone {
                let _ = forget(fd);
            }
        }
    }
    r
}

/// Interposed `vfork`: a real `fork`. A `vfork` child runs in its
/// parent's memory until it execs, and what it does to its descriptors
/// meanwhile (Python's `subprocess` closes every one it does not pass on)
/// went through these hooks into the parent's tables: the parent's
/// service fds were forgotten and its server handles closed, and its
/// later writes landed in the local placeholder, acknowledged and lost.
/// POSIX lets `vfork` be `fork`; the child gets its own copy (the fork
/// handlers run), at the cost of copying the page tables.
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: fork has no preconditions; both processes return here.
    unsafe { libc::fork() }
}

/// Interposed `umask`: the mask is also kept for what the process
/// creates on the server (`state::masked`).
#[no_mangle]
pub unsafe extern "C" fn umask(mask: mode_t) -> mode_t {
    // SAFETY: libc's umask with the caller's argument.
    let old = unsafe { real!(umask, fn(mode_t) -> mode_t)(mask) };
    crate::state::set_umask(mask);
    old
}

/// Interposed `dup`.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: libc's dup with the caller's argument.
    let r = unsafe { real!(dup, fn(c_int) -> c_int)(fd) };
    match service_fd(fd) {
        Some((_g, open)) if r >= 0 => finish(alias(r, open), -1),
        _ => r,
    }
}

/// `dup2`/`dup3`: `new` now refers to whatever `old` does.
fn redirect(old: c_int, new: c_int, r: c_int) -> c_int {
    if r < 0 || old == new || !crate::state::any_entries() || !crate::state::owns_tables() {
        return r;
    }
    let Some(_g) = crate::state::Guard::enter() else { return r };
    let out = match crate::state::lookup(old) {
        Some(open) => finish(alias(new, open), -1),
        None => finish(forget(new).map(|()| r), -1),
    };
    crate::stdio::follow_std_fd(new);
    out
}

/// Interposed `dup2`.
#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: libc's dup2 with the caller's arguments.
    let r = unsafe { real!(dup2, fn(c_int, c_int) -> c_int)(old, new) };
    redirect(old, new, r)
}

/// Interposed `dup3`.
#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: libc's dup3 with the caller's arguments.
    let r = unsafe { real!(dup3, fn(c_int, c_int, c_int) -> c_int)(old, new, flags) };
    redirect(old, new, r)
}

fn svc_fcntl(fd: c_int, open: Arc<Open>, cmd: c_int, arg: c_long) -> Result<c_int, Errno> {
    const SETTABLE: c_int = libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT | libc::O_NOATIME | libc::O_ASYNC;
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC | libc::F_GETFD | libc::F_SETFD => {
            // SAFETY: fcntl on the placeholder, with an integer argument.
            let r = unsafe { real!(fcntl, fn(c_int, c_int, c_long) -> c_int)(fd, cmd, arg) };
            if r < 0 {
                return Err(last_errno());
            }
            if cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
                alias(r, open)
            } else {
                Ok(r)
            }
        }
        libc::F_GETFL => Ok(open.flags()),
        libc::F_SETFL => {
            let f = (open.flags() & !SETTABLE) | (arg as c_int & SETTABLE);
            open.flags.store(f, Ordering::Relaxed);
            Ok(0)
        }
        libc::F_GETLK | libc::F_SETLK | libc::F_SETLKW | libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW => Err(Errno(libc::ENOLCK)),
        _ => Err(Errno(libc::ENOTSUP)),
    }
}

macro_rules! fcntl_export {
    ($name:ident) => {
        /// Interposed `fcntl`: descriptor flags and dups for service fds;
        /// locks fail ENOLCK and other commands ENOTSUP.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, cmd: c_int, arg: c_long) -> c_int {
            if let Some((_g, open)) = service_fd(fd) {
                return finish(svc_fcntl(fd, open, cmd, arg), -1);
            }
            // SAFETY: libc's fcntl with the caller's arguments.
            unsafe { real!($name, fn(c_int, c_int, c_long) -> c_int)(fd, cmd, arg) }
        }
    };
}
fcntl_export!(fcntl);
fcntl_export!(fcntl64);

// ---- read, write -------------------------------------------------------

/// Interposed `read`.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if let Some((_g, open)) = service_fd(fd) {
        // SAFETY: the caller's buffer of `n` bytes.
        return finish(svc_read(fd, &open, unsafe { bytes_mut(buf, n) }).map(|n| n as ssize_t), -1);
    }
    // SAFETY: libc's read with the caller's arguments.
    unsafe { real!(read, fn(c_int, *mut c_void, size_t) -> ssize_t)(fd, buf, n) }
}

/// Interposed `write`.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if let Some((_g, open)) = service_fd(fd) {
        // SAFETY: the caller's buffer of `n` bytes.
        return finish(svc_write(fd, &open, unsafe { bytes(buf, n) }).map(|n| n as ssize_t), -1);
    }
    // SAFETY: libc's write with the caller's arguments.
    unsafe { real!(write, fn(c_int, *const c_void, size_t) -> ssize_t)(fd, buf, n) }
}

macro_rules! pread_export {
    ($name:ident) => {
        /// Interposed `pread`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut c_void, n: size_t, off: off_t) -> ssize_t {
            if let Some((_g, open)) = service_fd(fd) {
                // SAFETY: the caller's buffer of `n` bytes.
                let r = offset(off).and_then(|at| svc_pread(&open, unsafe { bytes_mut(buf, n) }, at));
                return finish(r.map(|n| n as ssize_t), -1);
            }
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real!($name, fn(c_int, *mut c_void, size_t, off_t) -> ssize_t)(fd, buf, n, off) }
        }
    };
}
pread_export!(pread);
pread_export!(pread64);

/// glibc's answer to a fortified call whose length passes its buffer.
fn chk_fail() -> ! {
    extern "C" {
        fn __chk_fail() -> !;
    }
    // SAFETY: glibc's fortify failure: prints and aborts.
    unsafe { __chk_fail() }
}

/// Interposed fortified `__read_chk` (`read` built with
/// `_FORTIFY_SOURCE` where the buffer's size is known): the size checked
/// as glibc does, then `read`. Without it a fortified program read a
/// service fd's local placeholder.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t {
    if n > buflen {
        chk_fail();
    }
    // SAFETY: the caller's arguments, checked.
    unsafe { read(fd, buf, n) }
}

macro_rules! pread_chk_export {
    ($name:ident, $plain:ident) => {
        /// Interposed fortified `pread` (see `__read_chk`).
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut c_void, n: size_t, off: off_t, buflen: size_t) -> ssize_t {
            if n > buflen {
                chk_fail();
            }
            // SAFETY: the caller's arguments, checked.
            unsafe { $plain(fd, buf, n, off) }
        }
    };
}
pread_chk_export!(__pread_chk, pread);
pread_chk_export!(__pread64_chk, pread64);

macro_rules! pwrite_export {
    ($name:ident) => {
        /// Interposed `pwrite`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *const c_void, n: size_t, off: off_t) -> ssize_t {
            if let Some((_g, open)) = service_fd(fd) {
                // SAFETY: the caller's buffer of `n` bytes.
                let r = offset(off).and_then(|at| svc_pwrite(&open, unsafe { bytes(buf, n) }, at));
                return finish(r.map(|n| n as ssize_t), -1);
            }
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real!($name, fn(c_int, *const c_void, size_t, off_t) -> ssize_t)(fd, buf, n, off) }
        }
    };
}
pwrite_export!(pwrite);
pwrite_export!(pwrite64);

/// Interposed `readv`.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let Some((_g, open)) = service_fd(fd) {
        // SAFETY: the caller's iovec array.
        let r = unsafe { iovecs(iov, cnt) }.and_then(|v| svc_readv(fd, &open, v, None));
        return finish(r.map(|n| n as ssize_t), -1);
    }
    // SAFETY: libc's readv with the caller's arguments.
    unsafe { real!(readv, fn(c_int, *const iovec, c_int) -> ssize_t)(fd, iov, cnt) }
}

/// Interposed `writev`.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if let Some((_g, open)) = service_fd(fd) {
        // SAFETY: the caller's iovec array.
        let r = unsafe { iovecs(iov, cnt) }.and_then(|v| svc_writev(fd, &open, v, None));
        return finish(r.map(|n| n as ssize_t), -1);
    }
    // SAFETY: libc's writev with the caller's arguments.
    unsafe { real!(writev, fn(c_int, *const iovec, c_int) -> ssize_t)(fd, iov, cnt) }
}

macro_rules! preadv_export {
    ($name:ident) => {
        /// Interposed `preadv`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t {
            if let Some((_g, open)) = service_fd(fd) {
                // SAFETY: the caller's iovec array.
                let r = unsafe { iovecs(iov, cnt) }.and_then(|v| svc_readv(fd, &open, v, Some(offset(off)?)));
                return finish(r.map(|n| n as ssize_t), -1);
            }
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real!($name, fn(c_int, *const iovec, c_int, off_t) -> ssize_t)(fd, iov, cnt, off) }
        }
    };
}
preadv_export!(preadv);
preadv_export!(preadv64);

macro_rules! pwritev_export {
    ($name:ident) => {
        /// Interposed `pwritev`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t) -> ssize_t {
            if let Some((_g, open)) = service_fd(fd) {
                // SAFETY: the caller's iovec array.
                let r = unsafe { iovecs(iov, cnt) }.and_then(|v| svc_writev(fd, &open, v, Some(offset(off)?)));
                return finish(r.map(|n| n as ssize_t), -1);
            }
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real!($name, fn(c_int, *const iovec, c_int, off_t) -> ssize_t)(fd, iov, cnt, off) }
        }
    };
}
pwritev_export!(pwritev);
pwritev_export!(pwritev64);

macro_rules! lseek_export {
    ($name:ident) => {
        /// Interposed `lseek` (also SEEK_DATA/SEEK_HOLE: one data extent).
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, off: off_t, whence: c_int) -> off_t {
            if let Some((_g, open)) = service_fd(fd) {
                return finish(svc_lseek(fd, &open, off, whence).map(|p| p as off_t), -1);
            }
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real!($name, fn(c_int, off_t, c_int) -> off_t)(fd, off, whence) }
        }
    };
}
lseek_export!(lseek);
lseek_export!(lseek64);

// ---- sync, truncate ----------------------------------------------------

/// Interposed `fsync`.
#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    if let Some((_g, open)) = service_fd(fd) {
        return finish(open.handle().and_then(|(c, h)| Ok(c.fsync(h)?)).map(|()| 0), -1);
    }
    // SAFETY: libc's fsync with the caller's argument.
    unsafe { real!(fsync, fn(c_int) -> c_int)(fd) }
}

/// Interposed `fdatasync`.
#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    if let Some((_g, open)) = service_fd(fd) {
        return finish(open.handle().and_then(|(c, h)| Ok(c.fdatasync(h)?)).map(|()| 0), -1);
    }
    // SAFETY: libc's fdatasync with the caller's argument.
    unsafe { real!(fdatasync, fn(c_int) -> c_int)(fd) }
}

fn svc_ftruncate(open: &Open, len: off_t) -> Result<c_int, Errno> {
    check_access(open, true).map_err(|_| Errno(libc::EINVAL))?;
    let len = offset(len)?;
    let (c, h) = open.handle()?;
    c.ftruncate(h, len)?;
    Ok(0)
}

macro_rules! ftruncate_export {
    ($name:ident) => {
        /// Interposed `ftruncate`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, len: off_t) -> c_int {
            if let Some((_g, open)) = service_fd(fd) {
                return finish(svc_ftruncate(&open, len), -1);
            }
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real!($name, fn(c_int, off_t) -> c_int)(fd, len) }
        }
    };
}
ftruncate_export!(ftruncate);
ftruncate_export!(ftruncate64);

fn svc_truncate(path: &str, len: off_t) -> Result<c_int, Errno> {
    let len = offset(len)?;
    let c = client()?;
    let h = c.open(path, libc::O_WRONLY, 0)?;
    let r = c.ftruncate(h, len);
    c.close(h)?;
    r?;
    Ok(0)
}

macro_rules! truncate_export {
    ($name:ident) => {
        /// Interposed `truncate`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, len: off_t) -> c_int {
            // SAFETY: the caller's path string.
            if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
                return finish(svc_truncate(&p, len), -1);
            }
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real!($name, fn(*const c_char, off_t) -> c_int)(path, len) }
        }
    };
}
truncate_export!(truncate);
truncate_export!(truncate64);

// ---- calls that would bypass the service: refused so callers fall back --

/// Interposed `copy_file_range`: EXDEV for service fds, so `cp` falls
/// back to read/write.
#[no_mangle]
pub unsafe extern "C" fn copy_file_range(fd_in: c_int, off_in: *mut i64, fd_out: c_int, off_out: *mut i64, len: size_t, flags: c_uint) -> ssize_t {
    if service_fd(fd_in).is_some() || service_fd(fd_out).is_some() {
        return finish(Err(Errno(libc::EXDEV)), -1);
    }
    // SAFETY: libc's function with the caller's arguments.
    unsafe { real!(copy_file_range, fn(c_int, *mut i64, c_int, *mut i64, size_t, c_uint) -> ssize_t)(fd_in, off_in, fd_out, off_out, len, flags) }
}

macro_rules! sendfile_export {
    ($name:ident) => {
        /// Interposed `sendfile`: EINVAL for service fds (callers fall
        /// back to read/write).
        #[no_mangle]
        pub unsafe extern "C" fn $name(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t {
            if service_fd(out).is_some() || service_fd(inp).is_some() {
                return finish(Err(Errno(libc::EINVAL)), -1);
            }
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real!($name, fn(c_int, c_int, *mut off_t, size_t) -> ssize_t)(out, inp, off, n) }
        }
    };
}
sendfile_export!(sendfile);
sendfile_export!(sendfile64);

macro_rules! mmap_export {
    ($name:ident) => {
        /// Interposed `mmap`: ENODEV for service fds (a mapping would show
        /// the placeholder, not the file).
        #[no_mangle]
        pub unsafe extern "C" fn $name(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
            if fd >= 0 && flags & libc::MAP_ANONYMOUS == 0 && service_fd(fd).is_some() {
                return finish(Err(Errno(libc::ENODEV)), libc::MAP_FAILED);
            }
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real!($name, fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void)(addr, len, prot, flags, fd, off) }
        }
    };
}
mmap_export!(mmap);
mmap_export!(mmap64);

// ---- space and sync hints ------------------------------------------------

/// `posix_fallocate` semantics on the server: the file grows to at least
/// `off + len` (blocks are not reserved: the server has no fallocate).
fn svc_fallocate(open: &Open, mode: c_int, off: off_t, len: off_t) -> Result<c_int, Errno> {
    if mode != 0 {
        return Err(Errno(libc::EOPNOTSUPP));
    }
    let end = offset(off)?.checked_add(u64::try_from(len).ok().filter(|&l| l > 0).ok_or(Errno(libc::EINVAL))?).ok_or(Errno(libc::EFBIG))?;
    check_access(open, true)?;
    let (c, h) = open.handle()?;
    if c.fstat(h)?.size < end {
        c.ftruncate(h, end)?;
    }
    Ok(0)
}

macro_rules! posix_fallocate_export {
    ($name:ident) => {
        /// Interposed `posix_fallocate` (returns the error, as POSIX says);
        /// without it the placeholder memfd would be filled instead.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, off: off_t, len: off_t) -> c_int {
            if let Some((_g, open)) = service_fd(fd) {
                return svc_fallocate(&open, 0, off, len).err().map_or(0, |e| e.0);
            }
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real!($name, fn(c_int, off_t, off_t) -> c_int)(fd, off, len) }
        }
    };
}
posix_fallocate_export!(posix_fallocate);
posix_fallocate_export!(posix_fallocate64);

macro_rules! fallocate_export {
    ($name:ident) => {
        /// Interposed `fallocate`: mode 0 grows the file; other modes
        /// (punching holes, zeroing ranges) fail EOPNOTSUPP.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, mode: c_int, off: off_t, len: off_t) -> c_int {
            if let Some((_g, open)) = service_fd(fd) {
                return finish(svc_fallocate(&open, mode, off, len), -1);
            }
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real!($name, fn(c_int, c_int, off_t, off_t) -> c_int)(fd, mode, off, len) }
        }
    };
}
fallocate_export!(fallocate);
fallocate_export!(fallocate64);

/// Interposed `sync_file_range`: a whole-file `fdatasync` on the server.
#[no_mangle]
pub unsafe extern "C" fn sync_file_range(fd: c_int, off: off_t, n: off_t, flags: c_uint) -> c_int {
    if let Some((_g, open)) = service_fd(fd) {
        return finish(open.handle().and_then(|(c, h)| Ok(c.fdatasync(h)?)).map(|()| 0), -1);
    }
    // SAFETY: libc's function with the caller's arguments.
    unsafe { real!(sync_file_range, fn(c_int, off_t, off_t, c_uint) -> c_int)(fd, off, n, flags) }
}

macro_rules! preadv2_export {
    ($name:ident, $svc:ident) => {
        /// Interposed `preadv2`/`pwritev2`: offset -1 means the file
        /// position; RWF_* flags are not supported (EOPNOTSUPP).
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t {
            if let Some((_g, open)) = service_fd(fd) {
                // SAFETY: the caller's iovec array.
                let r = unsafe { iovecs(iov, cnt) }.and_then(|v| {
                    if flags != 0 {
                        return Err(Errno(libc::EOPNOTSUPP));
                    }
                    $svc(fd, &open, v, if off == -1 { None } else { Some(offset(off)?) })
                });
                return finish(r.map(|n| n as ssize_t), -1);
            }
            // SAFETY: libc's function with the caller's arguments.
            unsafe { real!($name, fn(c_int, *const iovec, c_int, off_t, c_int) -> ssize_t)(fd, iov, cnt, off, flags) }
        }
    };
}
preadv2_export!(preadv2, svc_readv);
preadv2_export!(preadv64v2, svc_readv);
preadv2_export!(pwritev2, svc_writev);
preadv2_export!(pwritev64v2, svc_writev);
