//! The interposed metadata calls: the stat family (new glibc `stat`,
//! `fstatat`, `statx`…, and the `__xstat` variants programs built against
//! glibc < 2.33 call), access, unlink, rename, mkdir, rmdir, and the
//! permission/time setters, which the server does not have and which are
//! accepted and ignored for service paths.

use libc::{c_char, c_int, c_uint, mode_t, size_t, ssize_t};
use sluice_client::{Stat, SETATTR_MODE_KEEP, SETATTR_TIME_NOW, SETATTR_TIME_OMIT};

use crate::real::{real, try_real};
use crate::route::{resolve, service_fd, service_path};
use crate::state::{client, finish, Errno, Open};

/// `st_dev` of every service file: the server has no device numbers.
pub const SERVICE_DEV_MINOR: u32 = 0x51;

fn split_ns(ns: i64) -> (i64, i64) {
    (ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000))
}

fn to_stat(s: &Stat) -> libc::stat {
    // SAFETY: `stat` is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    st.st_dev = libc::makedev(0, SERVICE_DEV_MINOR);
    st.st_ino = s.ino;
    st.st_mode = s.mode;
    st.st_nlink = s.nlink.into();
    st.st_uid = s.uid;
    st.st_gid = s.gid;
    st.st_size = s.size as i64;
    st.st_blksize = s.blksize.into();
    st.st_blocks = s.blocks as i64;
    (st.st_atime, st.st_atime_nsec) = split_ns(s.atime_ns);
    (st.st_mtime, st.st_mtime_nsec) = split_ns(s.mtime_ns);
    (st.st_ctime, st.st_ctime_nsec) = split_ns(s.ctime_ns);
    st
}

fn ts(ns: i64) -> libc::statx_timestamp {
    let (s, n) = split_ns(ns);
    // SAFETY: plain old data; all-zero is valid.
    let mut t: libc::statx_timestamp = unsafe { std::mem::zeroed() };
    t.tv_sec = s;
    t.tv_nsec = n as u32;
    t
}

fn to_statx(s: &Stat) -> libc::statx {
    // SAFETY: `statx` is plain old data; all-zero is a valid value.
    let mut x: libc::statx = unsafe { std::mem::zeroed() };
    x.stx_mask = libc::STATX_BASIC_STATS;
    x.stx_blksize = s.blksize;
    x.stx_nlink = s.nlink;
    x.stx_uid = s.uid;
    x.stx_gid = s.gid;
    x.stx_mode = s.mode as u16;
    x.stx_ino = s.ino;
    x.stx_size = s.size;
    x.stx_blocks = s.blocks;
    x.stx_atime = ts(s.atime_ns);
    x.stx_mtime = ts(s.mtime_ns);
    x.stx_ctime = ts(s.ctime_ns);
    x.stx_dev_minor = SERVICE_DEV_MINOR;
    x
}

fn path_stat(path: &str) -> Result<Stat, Errno> {
    Ok(client()?.stat(path)?)
}

fn fd_stat(open: &Open) -> Result<Stat, Errno> {
    let (c, h) = open.handle()?;
    Ok(c.fstat(h)?)
}

/// Where a stat call is aimed, if at the service.
enum Target {
    Path(String),
    Fd(std::sync::Arc<Open>),
}

/// Route `(dirfd, path, flags)` of `fstatat`/`statx`: `AT_EMPTY_PATH`
/// with an empty path means the fd itself.
///
/// # Safety
/// `path` is null or NUL-terminated.
unsafe fn target_at(dirfd: c_int, path: *const c_char, flags: c_int) -> Option<(crate::state::Guard, Target)> {
    // SAFETY: `path` is null or NUL-terminated, per the caller.
    let empty = path.is_null() || unsafe { *path } == 0;
    if empty && flags & libc::AT_EMPTY_PATH != 0 {
        let (g, open) = service_fd(dirfd)?;
        return Some((g, Target::Fd(open)));
    }
    // SAFETY: as above.
    let (g, p) = unsafe { service_path(dirfd, path) }?;
    Some((g, Target::Path(p)))
}

/// The stat `t` names; a path's final symbolic link itself with
/// `AT_SYMLINK_NOFOLLOW` (`lstat`), as the server sees it: before, `lstat`
/// followed it, and `shutil.rmtree` of a link to a directory emptied the
/// directory instead of refusing.
fn stat_of(t: &Target, flags: c_int) -> Result<Stat, Errno> {
    match t {
        Target::Path(p) if flags & libc::AT_SYMLINK_NOFOLLOW != 0 => Ok(client()?.lstat(p)?),
        Target::Path(p) => path_stat(p),
        Target::Fd(o) => fd_stat(o),
    }
}

/// # Safety
/// `out` points at writable storage for a `T`.
unsafe fn store<T>(r: Result<T, Errno>, out: *mut T) -> c_int {
    finish(
        r.map(|v| {
            // SAFETY: the caller's output buffer.
            unsafe { out.write(v) };
            0
        }),
        -1,
    )
}

/// libc's `fstatat`, or `__fxstatat` on glibc < 2.33.
unsafe fn real_fstatat(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
    if let Some(f) = try_real!(fstatat, fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int) {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { f(dirfd, path, buf, flags) };
    }
    // SAFETY: the pre-2.33 entry point, version 1 = the kernel layout.
    unsafe { real!(__fxstatat64, fn(c_int, c_int, *const c_char, *mut libc::stat, c_int) -> c_int)(1, dirfd, path, buf, flags) }
}

/// libc's `fstat`, or `__fxstat` on glibc < 2.33.
unsafe fn real_fstat(fd: c_int, buf: *mut libc::stat) -> c_int {
    if let Some(f) = try_real!(fstat, fn(c_int, *mut libc::stat) -> c_int) {
        // SAFETY: forwarding the caller's arguments.
        return unsafe { f(fd, buf) };
    }
    // SAFETY: the pre-2.33 entry point, version 1 = the kernel layout.
    unsafe { real!(__fxstat64, fn(c_int, c_int, *mut libc::stat) -> c_int)(1, fd, buf) }
}

/// `fstatat` semantics for every path-based stat export.
unsafe fn do_fstatat(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
    // SAFETY: the caller's path string and buffer.
    unsafe {
        match target_at(dirfd, path, flags) {
            Some((_g, t)) => store(stat_of(&t, flags).map(|s| to_stat(&s)), buf),
            None => real_fstatat(dirfd, path, buf, flags),
        }
    }
}

unsafe fn do_fstat(fd: c_int, buf: *mut libc::stat) -> c_int {
    match service_fd(fd) {
        // SAFETY: the caller's buffer.
        Some((_g, open)) => unsafe { store(fd_stat(&open).map(|s| to_stat(&s)), buf) },
        // SAFETY: forwarding the caller's arguments.
        None => unsafe { real_fstat(fd, buf) },
    }
}

macro_rules! stat_exports {
    ($($name:ident => $flags:expr),*) => {$(
        /// Interposed `stat`/`lstat`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, buf: *mut libc::stat) -> c_int {
            // SAFETY: forwarding the caller's arguments.
            unsafe { do_fstatat(libc::AT_FDCWD, path, buf, $flags) }
        }
    )*};
}
stat_exports!(stat => 0, stat64 => 0, lstat => libc::AT_SYMLINK_NOFOLLOW, lstat64 => libc::AT_SYMLINK_NOFOLLOW);

macro_rules! xstat_exports {
    ($($name:ident => $flags:expr),*) => {$(
        /// Interposed pre-2.33 `__xstat`/`__lxstat`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(_ver: c_int, path: *const c_char, buf: *mut libc::stat) -> c_int {
            // SAFETY: forwarding the caller's arguments.
            unsafe { do_fstatat(libc::AT_FDCWD, path, buf, $flags) }
        }
    )*};
}
xstat_exports!(__xstat => 0, __xstat64 => 0, __lxstat => libc::AT_SYMLINK_NOFOLLOW, __lxstat64 => libc::AT_SYMLINK_NOFOLLOW);

macro_rules! fstat_exports {
    ($($name:ident),*) => {$(
        /// Interposed `fstat`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut libc::stat) -> c_int {
            // SAFETY: forwarding the caller's arguments.
            unsafe { do_fstat(fd, buf) }
        }
    )*};
}
fstat_exports!(fstat, fstat64);

macro_rules! fxstat_exports {
    ($($name:ident),*) => {$(
        /// Interposed pre-2.33 `__fxstat`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(_ver: c_int, fd: c_int, buf: *mut libc::stat) -> c_int {
            // SAFETY: forwarding the caller's arguments.
            unsafe { do_fstat(fd, buf) }
        }
    )*};
}
fxstat_exports!(__fxstat, __fxstat64);

macro_rules! fstatat_exports {
    ($($name:ident),*) => {$(
        /// Interposed `fstatat`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
            // SAFETY: forwarding the caller's arguments.
            unsafe { do_fstatat(dirfd, path, buf, flags) }
        }
    )*};
}
fstatat_exports!(fstatat, fstatat64, newfstatat);

macro_rules! fxstatat_exports {
    ($($name:ident),*) => {$(
        /// Interposed pre-2.33 `__fxstatat`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(_ver: c_int, dirfd: c_int, path: *const c_char, buf: *mut libc::stat, flags: c_int) -> c_int {
            // SAFETY: forwarding the caller's arguments.
            unsafe { do_fstatat(dirfd, path, buf, flags) }
        }
    )*};
}
fxstatat_exports!(__fxstatat, __fxstatat64);

/// Interposed `statx` (glibc 2.28+).
#[no_mangle]
pub unsafe extern "C" fn statx(dirfd: c_int, path: *const c_char, flags: c_int, mask: c_uint, buf: *mut libc::statx) -> c_int {
    // SAFETY: the caller's path string and buffer.
    unsafe {
        if let Some((_g, t)) = target_at(dirfd, path, flags) {
            return store(stat_of(&t, flags).map(|s| to_statx(&s)), buf);
        }
        match try_real!(statx, fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int) {
            Some(f) => f(dirfd, path, flags, mask, buf),
            None => finish(Err(Errno(libc::ENOSYS)), -1),
        }
    }
}

/// `readlink(2)` of a service path into the caller's buffer: the target,
/// cut at the buffer's length, not NUL-terminated.
fn svc_readlink(path: &str, buf: *mut c_char, len: size_t) -> Result<ssize_t, Errno> {
    let target = client()?.readlink(path)?;
    let n = target.len().min(len);
    // SAFETY: the caller's buffer of `len` bytes; `n` fits in it.
    unsafe { std::ptr::copy_nonoverlapping(target.as_ptr(), buf.cast::<u8>(), n) };
    Ok(n as ssize_t)
}

/// Interposed `readlink`.
#[no_mangle]
pub unsafe extern "C" fn readlink(path: *const c_char, buf: *mut c_char, len: size_t) -> ssize_t {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
        return finish(svc_readlink(&p, buf, len), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(readlink, fn(*const c_char, *mut c_char, size_t) -> ssize_t)(path, buf, len) }
}

/// Interposed `readlinkat`.
#[no_mangle]
pub unsafe extern "C" fn readlinkat(dirfd: c_int, path: *const c_char, buf: *mut c_char, len: size_t) -> ssize_t {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(dirfd, path) } {
        return finish(svc_readlink(&p, buf, len), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(readlinkat, fn(c_int, *const c_char, *mut c_char, size_t) -> ssize_t)(dirfd, path, buf, len) }
}

fn svc_access(path: &str, mode: c_int) -> Result<c_int, Errno> {
    let s = path_stat(path)?;
    let any_x = s.mode & 0o111 != 0 || s.mode & libc::S_IFMT == libc::S_IFDIR;
    if mode & libc::X_OK != 0 && !any_x {
        return Err(Errno(libc::EACCES));
    }
    Ok(0)
}

macro_rules! access_exports {
    ($($name:ident),*) => {$(
        /// Interposed `access`, and `euidaccess` and `eaccess`, whose
        /// glibc versions reach the kernel through an internal `stat`,
        /// unseen (`sort` checks its inputs with `euidaccess`, and `sort
        /// /sluice/f` failed with "cannot read"): existence (and an execute
        /// bit for X_OK); the server checks the other permissions when the
        /// file is opened.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: c_int) -> c_int {
            // SAFETY: the caller's path string.
            if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
                return finish(svc_access(&p, mode), -1);
            }
            // SAFETY: forwarding the caller's arguments.
            unsafe { real!($name, fn(*const c_char, c_int) -> c_int)(path, mode) }
        }
    )*};
}
access_exports!(access, euidaccess, eaccess);

/// Interposed `faccessat`.
#[no_mangle]
pub unsafe extern "C" fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(dirfd, path) } {
        return finish(svc_access(&p, mode), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(faccessat, fn(c_int, *const c_char, c_int, c_int) -> c_int)(dirfd, path, mode, flags) }
}

fn svc_unlink(path: &str, flags: c_int) -> Result<c_int, Errno> {
    let c = client()?;
    if flags & libc::AT_REMOVEDIR != 0 {
        c.rmdir(path)?;
    } else {
        c.unlink(path)?;
    }
    Ok(0)
}

/// Interposed `unlink`.
#[no_mangle]
pub unsafe extern "C" fn unlink(path: *const c_char) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
        return finish(svc_unlink(&p, 0), -1);
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real!(unlink, fn(*const c_char) -> c_int)(path) }
}

/// Interposed `unlinkat`.
#[no_mangle]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(dirfd, path) } {
        return finish(svc_unlink(&p, flags), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(unlinkat, fn(c_int, *const c_char, c_int) -> c_int)(dirfd, path, flags) }
}

/// Interposed `rmdir`.
#[no_mangle]
pub unsafe extern "C" fn rmdir(path: *const c_char) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
        return finish(svc_unlink(&p, libc::AT_REMOVEDIR), -1);
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real!(rmdir, fn(*const c_char) -> c_int)(path) }
}

fn svc_mkdir(path: &str, mode: mode_t) -> Result<c_int, Errno> {
    // The prefix itself is the server's root, which always exists: POSIX
    // says EEXIST, and `mkdir -p`-style callers (fio) rely on it.
    if path == "." {
        return Err(Errno(libc::EEXIST));
    }
    client()?.mkdir(path, crate::state::masked(mode))?;
    Ok(0)
}

fn svc_symlink(target: *const c_char, link: &str) -> Result<c_int, Errno> {
    if target.is_null() {
        return Err(Errno(libc::EFAULT));
    }
    // SAFETY: the caller's NUL-terminated target string.
    let t = unsafe { std::ffi::CStr::from_ptr(target) }.to_str().map_err(|_| Errno(libc::EINVAL))?;
    if t.is_empty() {
        return Err(Errno(libc::ENOENT));
    }
    let prefix = &crate::state::config().ok_or(Errno(libc::ENOENT))?.prefix;
    client()?.symlink(&crate::path::link_text(prefix, link, t), link)?;
    Ok(0)
}

/// Interposed `symlink`: a link on the server (`ln -s`). An absolute
/// target under the prefix is stored relative to the link's directory
/// (`path::link_text`).
#[no_mangle]
pub unsafe extern "C" fn symlink(target: *const c_char, path: *const c_char) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
        return finish(svc_symlink(target, &p), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(symlink, fn(*const c_char, *const c_char) -> c_int)(target, path) }
}

/// Interposed `symlinkat`.
#[no_mangle]
pub unsafe extern "C" fn symlinkat(target: *const c_char, dirfd: c_int, path: *const c_char) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(dirfd, path) } {
        return finish(svc_symlink(target, &p), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(symlinkat, fn(*const c_char, c_int, *const c_char) -> c_int)(target, dirfd, path) }
}

/// Interposed `chdir`: into the prefix, the cwd is kept by the
/// interposer (`cwd`); elsewhere libc's, and the cwd is local again.
#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
        return finish(crate::cwd::enter(&p), -1);
    }
    // From a cwd on the service, a relative path out of the prefix is
    // made absolute (the kernel's cwd is a removed directory).
    // SAFETY: the caller's path string.
    let out = (!path.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(path) }.to_str().ok().and_then(crate::cwd::absolute)).flatten();
    let r = match out.and_then(|a| std::ffi::CString::new(a).ok()) {
        // SAFETY: a NUL-terminated path.
        Some(a) => unsafe { real!(chdir, fn(*const c_char) -> c_int)(a.as_ptr()) },
        // SAFETY: forwarding the caller's arguments.
        None => unsafe { real!(chdir, fn(*const c_char) -> c_int)(path) },
    };
    if r == 0 {
        crate::cwd::left();
    }
    r
}

/// Interposed `fchdir`: a service directory's fd moves the cwd there.
#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    if let Some((_g, open)) = service_fd(fd) {
        return finish(crate::cwd::enter(&open.path), -1);
    }
    // SAFETY: forwarding the caller's argument.
    let r = unsafe { real!(fchdir, fn(c_int) -> c_int)(fd) };
    if r == 0 {
        crate::cwd::left();
    }
    r
}

/// Interposed `getcwd`: the service cwd as a path under the prefix.
#[no_mangle]
pub unsafe extern "C" fn getcwd(buf: *mut c_char, size: size_t) -> *mut c_char {
    if let Some(cwd) = crate::cwd::local_path() {
        // SAFETY: the caller's buffer of `size` bytes, or null.
        return finish(unsafe { crate::cwd::fill(&cwd, buf, size) }, std::ptr::null_mut());
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(getcwd, fn(*mut c_char, size_t) -> *mut c_char)(buf, size) }
}

/// Interposed `get_current_dir_name` (malloc'd, as glibc's).
#[no_mangle]
pub unsafe extern "C" fn get_current_dir_name() -> *mut c_char {
    if let Some(cwd) = crate::cwd::local_path() {
        // SAFETY: a new buffer.
        return finish(unsafe { crate::cwd::fill(&cwd, std::ptr::null_mut(), 0) }, std::ptr::null_mut());
    }
    // SAFETY: no arguments.
    unsafe { real!(get_current_dir_name, fn() -> *mut c_char)() }
}

/// Interposed `execve`: the program gets `SLUICE_CWD` while the cwd is
/// on the service (a shell passes its own environment, not `environ`,
/// which `set` keeps up to date for the other `exec` calls), and loses a
/// stale one otherwise.
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    let exec = real!(execve, fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int);
    // SAFETY: the caller's environment array.
    match unsafe { crate::cwd::env_for_exec(envp) } {
        // SAFETY: a null-terminated array of strings that outlive the call
        // (which does not return on success).
        Some(env) => unsafe { exec(path, argv, env.as_ptr()) },
        // SAFETY: forwarding the caller's arguments.
        None => unsafe { exec(path, argv, envp) },
    }
}

/// Interposed `remove`: `unlink`, or `rmdir` for a directory (glibc's
/// calls `unlink` internally: the file stayed and the call failed with
/// ENOENT).
#[no_mangle]
pub unsafe extern "C" fn remove(path: *const c_char) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
        let r = match svc_unlink(&p, 0) {
            Err(Errno(libc::EISDIR)) => svc_unlink(&p, libc::AT_REMOVEDIR),
            other => other,
        };
        return finish(r, -1);
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real!(remove, fn(*const c_char) -> c_int)(path) }
}

/// Interposed `mkdir`.
#[no_mangle]
pub unsafe extern "C" fn mkdir(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
        return finish(svc_mkdir(&p, mode), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(mkdir, fn(*const c_char, mode_t) -> c_int)(path, mode) }
}

/// Interposed `mkdirat`.
#[no_mangle]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(dirfd, path) } {
        return finish(svc_mkdir(&p, mode), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(mkdirat, fn(c_int, *const c_char, mode_t) -> c_int)(dirfd, path, mode) }
}

/// Route a rename: both sides on the service, neither, or EXDEV.
/// `flags` are `renameat2`'s: `RENAME_NOREPLACE` is checked with a stat
/// of the target first (not atomic against another client creating it
/// meanwhile); any other flag is EINVAL, which makes coreutils fall back
/// to a plain rename.
///
/// # Safety
/// Both paths are null or NUL-terminated.
unsafe fn rename_at(od: c_int, old: *const c_char, nd: c_int, new: *const c_char, flags: c_uint) -> Option<c_int> {
    crate::state::config()?;
    let _g = crate::state::Guard::enter()?;
    // SAFETY: the caller's path strings.
    let (from, to) = unsafe { (resolve(od, old), resolve(nd, new)) };
    // SAFETY: `new` is the caller's NUL-terminated path (resolve read it).
    let to_dir = !new.is_null() && unsafe { std::ffi::CStr::from_ptr(new) }.to_bytes().ends_with(b"/");
    let rename = |f: &str, t: &str| -> Result<(), Errno> {
        let c = client()?;
        // "x/" names a directory: normalising drops the slash, so check.
        if to_dir && c.stat(f)?.mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(Errno(libc::ENOTDIR));
        }
        match flags {
            0 => {}
            libc::RENAME_NOREPLACE => match c.stat(t) {
                Ok(_) => return Err(Errno(libc::EEXIST)),
                Err(e) if e.errno == libc::ENOENT => {}
                Err(e) => return Err(e.into()),
            },
            _ => return Err(Errno(libc::EINVAL)),
        }
        Ok(c.rename(f, t)?)
    };
    match (from, to) {
        (None, None) => None,
        (Some(f), Some(t)) => Some(finish(rename(&f, &t).map(|()| 0), -1)),
        _ => Some(finish(Err(Errno(libc::EXDEV)), -1)),
    }
}

/// Interposed `rename`.
#[no_mangle]
pub unsafe extern "C" fn rename(old: *const c_char, new: *const c_char) -> c_int {
    // SAFETY: the caller's path strings.
    unsafe { rename_at(libc::AT_FDCWD, old, libc::AT_FDCWD, new, 0) }.unwrap_or_else(|| unsafe { real!(rename, fn(*const c_char, *const c_char) -> c_int)(old, new) })
}

/// Interposed `renameat`.
#[no_mangle]
pub unsafe extern "C" fn renameat(od: c_int, old: *const c_char, nd: c_int, new: *const c_char) -> c_int {
    // SAFETY: the caller's path strings.
    unsafe { rename_at(od, old, nd, new, 0) }.unwrap_or_else(|| unsafe { real!(renameat, fn(c_int, *const c_char, c_int, *const c_char) -> c_int)(od, old, nd, new) })
}

/// Interposed `renameat2` (what `mv` calls first, with `RENAME_NOREPLACE`).
#[no_mangle]
pub unsafe extern "C" fn renameat2(od: c_int, old: *const c_char, nd: c_int, new: *const c_char, flags: c_uint) -> c_int {
    // SAFETY: the caller's path strings.
    unsafe { rename_at(od, old, nd, new, flags) }
        .unwrap_or_else(|| unsafe { real!(renameat2, fn(c_int, *const c_char, c_int, *const c_char, c_uint) -> c_int)(od, old, nd, new, flags) })
}

macro_rules! ignored_owner_setters {
    ($($name:ident($($a:ident: $t:ty),*) at $dirfd:expr, $path:ident, $flags:expr;)*) => {$(
        /// Interposed; for service paths accepted and ignored (the server
        /// has no call to change owners), once the path is found: a final
        /// link itself with `AT_SYMLINK_NOFOLLOW` (`lchown`, which `cp -a`
        /// of a dangling link needs).
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            // SAFETY: the caller's path string.
            if let Some((_g, t)) = unsafe { target_at($dirfd, $path, $flags) } {
                return finish(stat_of(&t, $flags).map(|_| 0), -1);
            }
            // SAFETY: forwarding the caller's arguments.
            unsafe { real!($name, fn($($t),*) -> c_int)($($a),*) }
        }
    )*};
}
ignored_owner_setters! {
    chown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) at libc::AT_FDCWD, path, 0;
    lchown(path: *const c_char, uid: libc::uid_t, gid: libc::gid_t) at libc::AT_FDCWD, path, libc::AT_SYMLINK_NOFOLLOW;
    fchownat(dirfd: c_int, path: *const c_char, uid: libc::uid_t, gid: libc::gid_t, flags: c_int) at dirfd, path, flags;
}

/// `utimensat`'s two times as `SetAttr` takes them (null: both now).
///
/// # Safety
/// `t` is null or points at two timespecs.
unsafe fn times_of_timespecs(t: *const libc::timespec) -> Result<(i64, i64), Errno> {
    if t.is_null() {
        return Ok((SETATTR_TIME_NOW, SETATTR_TIME_NOW));
    }
    let one = |ts: &libc::timespec| match ts.tv_nsec {
        libc::UTIME_NOW => Ok(SETATTR_TIME_NOW),
        libc::UTIME_OMIT => Ok(SETATTR_TIME_OMIT),
        ns if (0..1_000_000_000).contains(&ns) => ts.tv_sec.checked_mul(1_000_000_000).and_then(|s| s.checked_add(ns)).filter(|&v| v < SETATTR_TIME_NOW).ok_or(Errno(libc::EINVAL)),
        _ => Err(Errno(libc::EINVAL)),
    };
    // SAFETY: as required of the caller.
    let (a, m) = unsafe { (&*t, &*t.add(1)) };
    Ok((one(a)?, one(m)?))
}

/// `utimes`' two times (null: both now).
///
/// # Safety
/// `t` is null or points at two timevals.
unsafe fn times_of_timevals(t: *const libc::timeval) -> Result<(i64, i64), Errno> {
    if t.is_null() {
        return Ok((SETATTR_TIME_NOW, SETATTR_TIME_NOW));
    }
    let one = |tv: &libc::timeval| {
        if !(0..1_000_000).contains(&tv.tv_usec) {
            return Err(Errno(libc::EINVAL));
        }
        tv.tv_sec.checked_mul(1_000_000_000).and_then(|s| s.checked_add(tv.tv_usec * 1000)).filter(|&v| v < SETATTR_TIME_NOW).ok_or(Errno(libc::EINVAL))
    };
    // SAFETY: as required of the caller.
    let (a, m) = unsafe { (&*t, &*t.add(1)) };
    Ok((one(a)?, one(m)?))
}

fn svc_set_attr(path: &str, mode: u32, times: Result<(i64, i64), Errno>, nofollow: bool) -> Result<c_int, Errno> {
    let (a, m) = times?;
    client()?.set_attr(path, mode, a, m, nofollow)?;
    Ok(0)
}

fn svc_fset_attr(open: &Open, mode: u32, times: Result<(i64, i64), Errno>) -> Result<c_int, Errno> {
    let (a, m) = times?;
    let (c, h) = open.handle()?;
    c.fset_attr(h, mode, a, m)?;
    Ok(0)
}

/// Interposed `chmod`: the server changes the mode (as the caller).
#[no_mangle]
pub unsafe extern "C" fn chmod(path: *const c_char, mode: mode_t) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
        return finish(svc_set_attr(&p, mode & 0o7777, Ok((SETATTR_TIME_OMIT, SETATTR_TIME_OMIT)), false), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(chmod, fn(*const c_char, mode_t) -> c_int)(path, mode) }
}

/// Interposed `fchmodat`.
#[no_mangle]
pub unsafe extern "C" fn fchmodat(dirfd: c_int, path: *const c_char, mode: mode_t, flags: c_int) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(dirfd, path) } {
        let nofollow = flags & libc::AT_SYMLINK_NOFOLLOW != 0;
        return finish(svc_set_attr(&p, mode & 0o7777, Ok((SETATTR_TIME_OMIT, SETATTR_TIME_OMIT)), nofollow), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(fchmodat, fn(c_int, *const c_char, mode_t, c_int) -> c_int)(dirfd, path, mode, flags) }
}

/// Interposed `utimensat` (`touch`, `cp -p`, `tar`): the server sets the
/// times.
#[no_mangle]
pub unsafe extern "C" fn utimensat(dirfd: c_int, path: *const c_char, times: *const libc::timespec, flags: c_int) -> c_int {
    if path.is_null() {
        // glibc's futimens: utimensat(fd, NULL, …).
        if let Some((_g, open)) = service_fd(dirfd) {
            // SAFETY: the caller's times.
            return finish(svc_fset_attr(&open, SETATTR_MODE_KEEP, unsafe { times_of_timespecs(times) }), -1);
        }
    }
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(dirfd, path) } {
        let nofollow = flags & libc::AT_SYMLINK_NOFOLLOW != 0;
        // SAFETY: the caller's times.
        return finish(svc_set_attr(&p, SETATTR_MODE_KEEP, unsafe { times_of_timespecs(times) }, nofollow), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(utimensat, fn(c_int, *const c_char, *const libc::timespec, c_int) -> c_int)(dirfd, path, times, flags) }
}

/// Interposed `utimes`.
#[no_mangle]
pub unsafe extern "C" fn utimes(path: *const c_char, times: *const libc::timeval) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
        // SAFETY: the caller's times.
        return finish(svc_set_attr(&p, SETATTR_MODE_KEEP, unsafe { times_of_timevals(times) }, false), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(utimes, fn(*const c_char, *const libc::timeval) -> c_int)(path, times) }
}

/// Interposed `lutimes` (a final link itself).
#[no_mangle]
pub unsafe extern "C" fn lutimes(path: *const c_char, times: *const libc::timeval) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
        // SAFETY: the caller's times.
        return finish(svc_set_attr(&p, SETATTR_MODE_KEEP, unsafe { times_of_timevals(times) }, true), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(lutimes, fn(*const c_char, *const libc::timeval) -> c_int)(path, times) }
}

/// Interposed `utime` (whole seconds; null: now). `bzip2` and `unzip`
/// set times with it.
#[no_mangle]
pub unsafe extern "C" fn utime(path: *const c_char, times: *const libc::utimbuf) -> c_int {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
        let t = if times.is_null() {
            Ok((SETATTR_TIME_NOW, SETATTR_TIME_NOW))
        } else {
            // SAFETY: the caller's utimbuf.
            let u = unsafe { &*times };
            u.actime.checked_mul(1_000_000_000).zip(u.modtime.checked_mul(1_000_000_000)).ok_or(Errno(libc::EINVAL))
        };
        return finish(svc_set_attr(&p, SETATTR_MODE_KEEP, t, false), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(utime, fn(*const c_char, *const libc::utimbuf) -> c_int)(path, times) }
}

/// Interposed `fchmod` (`sed -i` and `install` give their new file its
/// mode with it).
#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: mode_t) -> c_int {
    if let Some((_g, open)) = service_fd(fd) {
        return finish(svc_fset_attr(&open, mode & 0o7777, Ok((SETATTR_TIME_OMIT, SETATTR_TIME_OMIT))), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(fchmod, fn(c_int, mode_t) -> c_int)(fd, mode) }
}

/// Interposed `futimens`.
#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    if let Some((_g, open)) = service_fd(fd) {
        // SAFETY: the caller's times.
        return finish(svc_fset_attr(&open, SETATTR_MODE_KEEP, unsafe { times_of_timespecs(times) }), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(futimens, fn(c_int, *const libc::timespec) -> c_int)(fd, times) }
}

/// Interposed `futimes`.
#[no_mangle]
pub unsafe extern "C" fn futimes(fd: c_int, times: *const libc::timeval) -> c_int {
    if let Some((_g, open)) = service_fd(fd) {
        // SAFETY: the caller's times.
        return finish(svc_fset_attr(&open, SETATTR_MODE_KEEP, unsafe { times_of_timevals(times) }), -1);
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(futimes, fn(c_int, *const libc::timeval) -> c_int)(fd, times) }
}

macro_rules! ignored_fd_setters {
    ($($name:ident($fd:ident: c_int $(, $a:ident: $t:ty)*);)*) => {$(
        /// Interposed; for service fds accepted and ignored.
        #[no_mangle]
        pub unsafe extern "C" fn $name($fd: c_int $(, $a: $t)*) -> c_int {
            if service_fd($fd).is_some() {
                return 0;
            }
            // SAFETY: forwarding the caller's arguments.
            unsafe { real!($name, fn(c_int $(, $t)*) -> c_int)($fd $(, $a)*) }
        }
    )*};
}
ignored_fd_setters! {
    fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t);
}

macro_rules! xattr_path_exports {
    ($($name:ident($($a:ident: $t:ty),*) -> $r:ty;)*) => {$(
        /// Interposed; service files have no extended attributes
        /// (ENOTSUP, which `ls` and `cp` read as "no ACL", and `cp -p`
        /// then sets the mode itself).
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char $(, $a: $t)*) -> $r {
            // SAFETY: the caller's path string.
            if unsafe { service_path(libc::AT_FDCWD, path) }.is_some() {
                return finish(Err(Errno(libc::ENOTSUP)), -1);
            }
            // SAFETY: forwarding the caller's arguments.
            unsafe { real!($name, fn(*const c_char $(, $t)*) -> $r)(path $(, $a)*) }
        }
    )*};
}
xattr_path_exports! {
    getxattr(name: *const c_char, value: *mut libc::c_void, size: libc::size_t) -> libc::ssize_t;
    lgetxattr(name: *const c_char, value: *mut libc::c_void, size: libc::size_t) -> libc::ssize_t;
    listxattr(list: *mut c_char, size: libc::size_t) -> libc::ssize_t;
    llistxattr(list: *mut c_char, size: libc::size_t) -> libc::ssize_t;
    setxattr(name: *const c_char, value: *const libc::c_void, size: libc::size_t, flags: c_int) -> c_int;
    lsetxattr(name: *const c_char, value: *const libc::c_void, size: libc::size_t, flags: c_int) -> c_int;
    removexattr(name: *const c_char) -> c_int;
    lremovexattr(name: *const c_char) -> c_int;
}

macro_rules! xattr_fd_exports {
    ($($name:ident($($a:ident: $t:ty),*) -> $r:ty;)*) => {$(
        /// Interposed; service fds have no extended attributes (ENOTSUP;
        /// a set used to land on the placeholder and succeed, so `cp -p`
        /// took the mode as copied with the ACL and never set it).
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int $(, $a: $t)*) -> $r {
            if service_fd(fd).is_some() {
                return finish(Err(Errno(libc::ENOTSUP)), -1);
            }
            // SAFETY: forwarding the caller's arguments.
            unsafe { real!($name, fn(c_int $(, $t)*) -> $r)(fd $(, $a)*) }
        }
    )*};
}
xattr_fd_exports! {
    fgetxattr(name: *const c_char, value: *mut libc::c_void, size: libc::size_t) -> libc::ssize_t;
    flistxattr(list: *mut c_char, size: libc::size_t) -> libc::ssize_t;
    fsetxattr(name: *const c_char, value: *const libc::c_void, size: libc::size_t, flags: c_int) -> c_int;
    fremovexattr(name: *const c_char) -> c_int;
}

/// `f_type` of a service path: FUSE's, as the mount reports it, so a
/// program that picks a driver by file system type (ROMIO does) takes the
/// plain POSIX one on either path.
const SERVICE_FS_TYPE: i64 = 0x6573_5546;

/// The served file system's figures for a service path or descriptor.
fn svc_statfs(path: &str) -> Result<sluice_client::Statfs, Errno> {
    Ok(client()?.statfs(path)?)
}

fn to_statfs(f: &sluice_client::Statfs) -> libc::statfs {
    // SAFETY: an all-zero statfs is a valid value (spare fields stay 0).
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    s.f_type = SERVICE_FS_TYPE as _;
    s.f_bsize = f.io_bytes as _;
    s.f_frsize = f.block_bytes as _;
    s.f_blocks = f.blocks as _;
    s.f_bfree = f.blocks_free as _;
    s.f_bavail = f.blocks_avail as _;
    s.f_files = f.files as _;
    s.f_ffree = f.files_free as _;
    s.f_namelen = f.name_max as _;
    s
}

fn to_statvfs(f: &sluice_client::Statfs) -> libc::statvfs {
    // SAFETY: an all-zero statvfs is a valid value.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    s.f_bsize = f.io_bytes as _;
    s.f_frsize = f.block_bytes as _;
    s.f_blocks = f.blocks as _;
    s.f_bfree = f.blocks_free as _;
    s.f_bavail = f.blocks_avail as _;
    s.f_files = f.files as _;
    s.f_ffree = f.files_free as _;
    s.f_favail = f.files_free as _;
    s.f_namemax = f.name_max as _;
    s
}

/// On the 64-bit targets sluice builds for, the `64` variants of these
/// structures are the same structures.
const _: () = assert!(std::mem::size_of::<libc::statfs>() == std::mem::size_of::<libc::statfs64>());
const _: () = assert!(std::mem::size_of::<libc::statvfs>() == std::mem::size_of::<libc::statvfs64>());

macro_rules! statfs_path_exports {
    ($($name:ident($buf:ty) => $conv:ident;)*) => {$(
        /// Interposed: a service path answers with the served file
        /// system's figures.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, buf: *mut $buf) -> c_int {
            // SAFETY: the caller's path string.
            match unsafe { service_path(libc::AT_FDCWD, path) } {
                // SAFETY: the caller's buffer, of the structure's size.
                Some((_g, p)) => unsafe { store(svc_statfs(&p).map(|f| $conv(&f)), buf.cast()) },
                // SAFETY: forwarding the caller's arguments.
                None => unsafe { real!($name, fn(*const c_char, *mut $buf) -> c_int)(path, buf) },
            }
        }
    )*};
}
statfs_path_exports! {
    statfs(libc::statfs) => to_statfs;
    statfs64(libc::statfs64) => to_statfs;
    statvfs(libc::statvfs) => to_statvfs;
    statvfs64(libc::statvfs64) => to_statvfs;
}

macro_rules! statfs_fd_exports {
    ($($name:ident($buf:ty) => $conv:ident;)*) => {$(
        /// Interposed: a service descriptor answers with the served file
        /// system's figures.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fd: c_int, buf: *mut $buf) -> c_int {
            match service_fd(fd) {
                // SAFETY: the caller's buffer, of the structure's size.
                Some((_g, open)) => unsafe { store(svc_statfs(&open.path).map(|f| $conv(&f)), buf.cast()) },
                // SAFETY: forwarding the caller's arguments.
                None => unsafe { real!($name, fn(c_int, *mut $buf) -> c_int)(fd, buf) },
            }
        }
    )*};
}
statfs_fd_exports! {
    fstatfs(libc::statfs) => to_statfs;
    fstatfs64(libc::statfs64) => to_statfs;
    fstatvfs(libc::statvfs) => to_statvfs;
    fstatvfs64(libc::statvfs64) => to_statvfs;
}
