//! Interposed stdio. glibc's `fopen` opens files with internal calls we
//! cannot see, so for service paths `fopen`/`fdopen` return a stream made
//! with `fopencookie` whose read/write/seek/close callbacks are our own
//! fd calls: every stdio function (`fread`, `fwrite`, `fgets`, `fprintf`,
//! `fseek`, `ftell`, `fflush`, `fclose`…) then works unchanged. `fileno`
//! gives the stream's service fd.

use std::sync::atomic::{AtomicPtr, Ordering};

use libc::{c_char, c_int, c_void, size_t, ssize_t, FILE};

use crate::io::{close, lseek64, read, svc_close, svc_open, write};
use crate::mode::mode_flags;
use crate::real::real;
use crate::route::{service_fd, service_path};
use crate::state::{any_entries, finish, with_tables, Errno, Guard, FILES_MAX};

/// glibc's `cookie_io_functions_t` (not in the libc crate).
#[repr(C)]
struct CookieFunctions {
    read: extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t,
    write: extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t,
    seek: extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int,
    close: extern "C" fn(*mut c_void) -> c_int,
}

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, funcs: CookieFunctions) -> *mut FILE;
    // glibc's standard streams: assignable, and what `getchar`, `printf`,
    // `fread(…, stdin)` and the rest use.
    static mut stdin: *mut FILE;
    static mut stdout: *mut FILE;
    static mut stderr: *mut FILE;
}

fn fd_of(cookie: *mut c_void) -> c_int {
    cookie as usize as c_int
}

extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: stdio hands us its buffer of `n` bytes.
    unsafe { read(fd_of(cookie), buf.cast(), n) }
}

extern "C" fn cookie_write(cookie: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    // SAFETY: stdio hands us its buffer of `n` bytes.
    let r = unsafe { write(fd_of(cookie), buf.cast(), n) };
    r.max(0)
}

extern "C" fn cookie_seek(cookie: *mut c_void, off: *mut i64, whence: c_int) -> c_int {
    // SAFETY: stdio passes a valid pointer to the offset.
    unsafe {
        let r = lseek64(fd_of(cookie), *off, whence);
        if r < 0 {
            return -1;
        }
        *off = r;
    }
    0
}

extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    // SAFETY: the stream owns its fd; stdio closes it once.
    unsafe { close(fd_of(cookie)) }
}

/// A stdio stream over service fd `fd`, registered for `fileno`.
fn stream(fd: c_int, mode: *const c_char) -> Result<*mut FILE, Errno> {
    if with_tables(|t| t.files.len()) >= FILES_MAX {
        return Err(Errno(libc::EMFILE));
    }
    let funcs = CookieFunctions { read: cookie_read, write: cookie_write, seek: cookie_seek, close: cookie_close };
    // SAFETY: `mode` is the caller's mode string; the cookie is the fd.
    let f = unsafe { fopencookie(fd as usize as *mut c_void, mode, funcs) };
    if f.is_null() {
        return Err(crate::state::last_errno());
    }
    // Only a race past the check above can fail here; `fileno` of that
    // stream then answers -1, as for any cookie stream.
    let _ = with_tables(|t| t.files.insert(f as usize, fd));
    Ok(f)
}

/// Standard streams whose fd was inherited as a service file (`prog <
/// PREFIX/in > PREFIX/out` in a shell): glibc's own streams would read
/// and write the placeholder with internal calls, so each becomes a cookie
/// stream over its service fd (stderr unbuffered, as usual). Called once,
/// from the constructor, before `main`.
pub fn adopt_std_streams() {
    for fd in 0..=2 {
        follow_std_fd(fd);
    }
}

/// glibc's own standard streams, kept while a cookie stream stands in.
static ORIGINAL: [AtomicPtr<FILE>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];
/// The cookie stream over each standard fd, made once and reused.
static COOKIE: [AtomicPtr<FILE>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];

/// Standard fd `fd` (0, 1 or 2) may refer to something else now (the
/// constructor, a `dup2` or `dup3` onto it, an open that took its
/// number): its glibc stream follows. While it is a service fd the
/// global `stdin`, `stdout` or `stderr` is a cookie stream over it, whose
/// reads and writes go through the interposer (glibc's own stream uses
/// internal calls that would reach the placeholder: `echo hello >
/// /sluice/f` in bash, whose builtins print through `stdout`, left the
/// file empty); once it is not, glibc's stream is back. What a program
/// left in a stream's buffer across the change goes where the fd points
/// when it is flushed, as with glibc's streams.
pub fn follow_std_fd(fd: c_int) {
    if !(0..=2).contains(&fd) {
        return;
    }
    let i = fd as usize;
    let service = crate::state::lookup(fd).is_some();
    // SAFETY: the globals are glibc's assignable standard stream pointers;
    // a program that swaps them while another thread prints races as it
    // would with `freopen`.
    unsafe {
        let global: *mut *mut FILE = match fd {
            0 => &raw mut stdin,
            1 => &raw mut stdout,
            _ => &raw mut stderr,
        };
        let cur = *global;
        let cookie = COOKIE[i].load(Ordering::Acquire);
        if service {
            if !cookie.is_null() && cur == cookie {
                return;
            }
            let f = if cookie.is_null() {
                let mode = if fd == 0 { c"r" } else { c"w" };
                let Ok(f) = stream(fd, mode.as_ptr()) else { return };
                if fd == 2 {
                    libc::setvbuf(f, std::ptr::null_mut(), libc::_IONBF, 0);
                }
                COOKIE[i].store(f, Ordering::Release);
                f
            } else {
                cookie
            };
            ORIGINAL[i].store(cur, Ordering::Release);
            *global = f;
        } else if !cookie.is_null() && cur == cookie {
            let original = ORIGINAL[i].load(Ordering::Acquire);
            if !original.is_null() {
                *global = original;
            }
        }
    }
}

unsafe fn svc_fopen(p: &str, mode: *const c_char) -> Result<*mut FILE, Errno> {
    // SAFETY: `mode` is the caller's NUL-terminated mode string.
    let flags = mode_flags(unsafe { std::ffi::CStr::from_ptr(mode) }.to_bytes()).ok_or(Errno(libc::EINVAL))?;
    let fd = svc_open(p, flags, 0o666)?;
    stream(fd, mode).inspect_err(|_| {
        let _ = svc_close(fd);
    })
}

macro_rules! fopen_export {
    ($name:ident) => {
        /// Interposed `fopen`.
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: *const c_char) -> *mut FILE {
            // SAFETY: the caller's path string.
            if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
                // SAFETY: the caller's mode string.
                return finish(unsafe { svc_fopen(&p, mode) }, std::ptr::null_mut());
            }
            // SAFETY: forwarding the caller's arguments.
            unsafe { real!($name, fn(*const c_char, *const c_char) -> *mut FILE)(path, mode) }
        }
    };
}
fopen_export!(fopen);
fopen_export!(fopen64);

/// Interposed `fdopen`: a service fd becomes a cookie stream.
#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    if service_fd(fd).is_some() {
        return finish(stream(fd, mode), std::ptr::null_mut());
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(fdopen, fn(c_int, *const c_char) -> *mut FILE)(fd, mode) }
}

extern "C" {
    // glibc's <stdio_ext.h>: drop what a stream holds in its buffer.
    fn __fpurge(f: *mut FILE);
}

/// Which standard stream `f` is (glibc's own, or the cookie standing in
/// for it): its fd.
fn standard_fd(f: *mut FILE) -> Option<c_int> {
    if f.is_null() {
        return None;
    }
    // SAFETY: reading glibc's standard stream pointers.
    let current = unsafe { [stdin, stdout, stderr] };
    (0..3).find(|&i| f == current[i] || f == ORIGINAL[i].load(Ordering::Acquire) || f == COOKIE[i].load(Ordering::Acquire)).map(|i| i as c_int)
}

/// `freopen` onto a service path: the new file is opened, put in place
/// of the stream's fd (a standard stream then becomes a cookie stream
/// over it, `follow_std_fd`) and the stream's buffer and flags are
/// cleared, as glibc's `freopen` does. Only a standard stream or one of
/// ours can be pointed at a service file: glibc's own streams read and
/// write their fd with internal calls.
unsafe fn svc_freopen(p: &str, mode: *const c_char, f: *mut FILE, fd: c_int) -> Result<*mut FILE, Errno> {
    // SAFETY: `mode` is the caller's NUL-terminated mode string.
    let flags = mode_flags(unsafe { std::ffi::CStr::from_ptr(mode) }.to_bytes()).ok_or(Errno(libc::EINVAL))?;
    // SAFETY: the caller's stream; what it buffered goes where it was going.
    unsafe { libc::fflush(f) };
    let new = {
        let _g = Guard::enter().ok_or(Errno(libc::EAGAIN))?;
        svc_open(p, flags, 0o666)?
    };
    // SAFETY: our own dup2 and close keep the tables and the standard
    // streams right.
    let r = unsafe { crate::io::dup2(new, fd) };
    let e = crate::state::last_errno();
    // SAFETY: as above.
    unsafe { close(new) };
    if r < 0 {
        return Err(e);
    }
    // A standard stream is now the cookie over `fd`.
    let now = match standard_fd(f) {
        // SAFETY: reading glibc's standard stream pointers.
        Some(i) => unsafe { [stdin, stdout, stderr][i as usize] },
        None => f,
    };
    // SAFETY: a valid stream.
    unsafe {
        __fpurge(now);
        libc::clearerr(now);
    }
    Ok(now)
}

macro_rules! freopen_export {
    ($name:ident) => {
        /// Interposed `freopen`: `uniq PREFIX/f` reopens `stdin` on its
        /// input, and glibc's own opened it with internal calls (ENOENT).
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, mode: *const c_char, f: *mut FILE) -> *mut FILE {
            let real = || unsafe { real!($name, fn(*const c_char, *const c_char, *mut FILE) -> *mut FILE)(path, mode, f) };
            let (ours, std) = (our_fd(f), standard_fd(f));
            // SAFETY: the caller's path string (null: a change of mode).
            let svc = if path.is_null() { None } else { unsafe { service_path(libc::AT_FDCWD, path) }.map(|(_g, p)| p) };
            match (svc, ours.or(std)) {
                // SAFETY: the caller's mode string and stream.
                (Some(p), Some(fd)) => finish(unsafe { svc_freopen(&p, mode, f, fd) }, std::ptr::null_mut()),
                (Some(_), None) => finish(Err(Errno(libc::ENOTSUP)), std::ptr::null_mut()),
                (None, Some(fd)) if ours.is_some() && !path.is_null() && std.is_some() => {
                    // A standard stream leaves its service file for a
                    // local one: glibc's own stream is back, on its fd,
                    // and glibc reopens it.
                    // SAFETY: flushing the cookie stream, then our close.
                    unsafe {
                        libc::fflush(f);
                        close(fd);
                    }
                    follow_std_fd(fd);
                    let original = ORIGINAL[fd as usize].load(Ordering::Acquire);
                    // SAFETY: glibc's own standard stream.
                    unsafe { real!($name, fn(*const c_char, *const c_char, *mut FILE) -> *mut FILE)(path, mode, original) }
                }
                // Ours (a cookie stream, which glibc's `freopen` does not
                // take: it crashed) onto a local path: closed, as a failed
                // `freopen` closes its stream, and ENOTSUP; with no path
                // (a change of mode), kept as it is.
                (None, Some(_)) if ours.is_some() && path.is_null() => f,
                (None, Some(_)) if ours.is_some() => {
                    // SAFETY: our interposed fclose on the caller's stream.
                    unsafe { fclose(f) };
                    finish(Err(Errno(libc::ENOTSUP)), std::ptr::null_mut())
                }
                _ => real(),
            }
        }
    };
}
freopen_export!(freopen);
freopen_export!(freopen64);

fn our_fd(f: *mut FILE) -> Option<c_int> {
    if f.is_null() || !any_entries() {
        return None;
    }
    let _g = Guard::enter()?;
    with_tables(|t| t.files.get(&(f as usize)).copied())
}

macro_rules! fileno_export {
    ($name:ident) => {
        /// Interposed `fileno`: a cookie stream's service fd.
        #[no_mangle]
        pub unsafe extern "C" fn $name(f: *mut FILE) -> c_int {
            if let Some(fd) = our_fd(f) {
                return fd;
            }
            // SAFETY: forwarding the caller's argument.
            unsafe { real!($name, fn(*mut FILE) -> c_int)(f) }
        }
    };
}
fileno_export!(fileno);
fileno_export!(fileno_unlocked);

/// Interposed `fclose`: forgets the stream, then libc closes it (which
/// calls our close callback).
#[no_mangle]
pub unsafe extern "C" fn fclose(f: *mut FILE) -> c_int {
    if our_fd(f).is_some() {
        if let Some(_g) = Guard::enter() {
            with_tables(|t| t.files.remove(&(f as usize)));
        }
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real!(fclose, fn(*mut FILE) -> c_int)(f) }
}
