//! Interposed directory streams. glibc's `opendir` opens and reads
//! directories with internal calls we cannot see, so for service
//! directories `opendir`/`fdopendir` return a `DIR *` of our own (a boxed
//! [`DirStream`] holding a snapshot of the listing), which `readdir`,
//! `readdir64`, `dirfd`, `rewinddir`, `telldir`, `seekdir` and `closedir`
//! recognise by address; every other `DIR *` goes to libc.

use std::ffi::CString;

use libc::{c_char, c_int, c_long, c_void};
use sluice_client::FileKind;

use crate::io::{svc_close, svc_open};
use crate::real::real;
use crate::route::{service_fd, service_path};
use crate::state::{any_entries, client, finish, with_tables, Errno, Guard};

/// One open service directory stream.
pub struct DirStream {
    /// Its service fd (closed by `closedir`).
    fd: c_int,
    /// Names and `d_type`s, `.` and `..` first.
    entries: Vec<(CString, u8)>,
    next: usize,
    /// The entry `readdir` returned last; valid until the next call.
    current: libc::dirent64,
}

fn d_type(k: FileKind) -> u8 {
    match k {
        FileKind::File => libc::DT_REG,
        FileKind::Dir => libc::DT_DIR,
        FileKind::Symlink => libc::DT_LNK,
        FileKind::Other => libc::DT_UNKNOWN,
    }
}

/// A stream over service fd `fd` (a directory opened on the server).
fn svc_fdopendir(fd: c_int, path: &str) -> Result<*mut c_void, Errno> {
    let listing = client()?.readdir(path)?;
    let mut entries = vec![(c".".to_owned(), libc::DT_DIR), (c"..".to_owned(), libc::DT_DIR)];
    entries.extend(listing.into_iter().filter_map(|e| Some((CString::new(e.name).ok()?, d_type(e.kind)))));
    // SAFETY: `dirent64` is plain old data; all-zero is a valid value.
    let current = unsafe { std::mem::zeroed() };
    let p = Box::into_raw(Box::new(DirStream { fd, entries, next: 0, current }));
    match with_tables(|t| t.dirs.insert(p as usize, ())) {
        Ok(_) => Ok(p.cast()),
        Err(e) => {
            // SAFETY: `p` came from Box::into_raw just above.
            drop(unsafe { Box::from_raw(p) });
            Err(e)
        }
    }
}

/// Our stream behind `dirp`, if it is one; the guard is held.
fn ours(dirp: *mut c_void) -> Option<(Guard, &'static mut DirStream)> {
    if dirp.is_null() || !any_entries() {
        return None;
    }
    let g = Guard::enter()?;
    with_tables(|t| t.dirs.get(&(dirp as usize)).is_some()).then(|| {
        // SAFETY: registered addresses are live boxed `DirStream`s; like a
        // libc DIR, one stream is not used by two threads at once.
        (g, unsafe { &mut *dirp.cast::<DirStream>() })
    })
}

/// Interposed `opendir`.
#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut c_void {
    // SAFETY: the caller's path string.
    if let Some((_g, p)) = unsafe { service_path(libc::AT_FDCWD, path) } {
        let r = svc_open(&p, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC, 0).and_then(|fd| {
            svc_fdopendir(fd, &p).inspect_err(|_| {
                let _ = svc_close(fd);
            })
        });
        return finish(r, std::ptr::null_mut());
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real!(opendir, fn(*const c_char) -> *mut c_void)(path) }
}

/// Interposed `fdopendir`.
#[no_mangle]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut c_void {
    if let Some((_g, open)) = service_fd(fd) {
        return finish(svc_fdopendir(fd, &open.path), std::ptr::null_mut());
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real!(fdopendir, fn(c_int) -> *mut c_void)(fd) }
}

fn next_entry(d: &mut DirStream) -> *mut c_void {
    let Some((name, kind)) = d.entries.get(d.next) else { return std::ptr::null_mut() };
    d.next += 1;
    let bytes = name.as_bytes_with_nul();
    let e = &mut d.current;
    e.d_ino = d.next as u64;
    e.d_off = d.next as i64;
    e.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
    e.d_type = *kind;
    let n = bytes.len().min(e.d_name.len());
    for (dst, src) in e.d_name[..n].iter_mut().zip(bytes) {
        *dst = *src as c_char;
    }
    e.d_name[n - 1] = 0;
    (e as *mut libc::dirent64).cast()
}

macro_rules! readdir_export {
    ($name:ident) => {
        /// Interposed `readdir` (the `dirent` and `dirent64` layouts agree
        /// on 64-bit Linux).
        #[no_mangle]
        pub unsafe extern "C" fn $name(dirp: *mut c_void) -> *mut c_void {
            if let Some((_g, d)) = ours(dirp) {
                return next_entry(d);
            }
            // SAFETY: forwarding the caller's argument.
            unsafe { real!($name, fn(*mut c_void) -> *mut c_void)(dirp) }
        }
    };
}
readdir_export!(readdir);
readdir_export!(readdir64);

/// Interposed `closedir`: closes the stream's service fd too.
#[no_mangle]
pub unsafe extern "C" fn closedir(dirp: *mut c_void) -> c_int {
    if let Some((_g, _)) = ours(dirp) {
        with_tables(|t| t.dirs.remove(&(dirp as usize)));
        // SAFETY: registered addresses came from Box::into_raw; it is
        // unregistered now, so this is its only release.
        let d = unsafe { Box::from_raw(dirp.cast::<DirStream>()) };
        return finish(svc_close(d.fd), -1);
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real!(closedir, fn(*mut c_void) -> c_int)(dirp) }
}

/// Interposed `dirfd`.
#[no_mangle]
pub unsafe extern "C" fn dirfd(dirp: *mut c_void) -> c_int {
    if let Some((_g, d)) = ours(dirp) {
        return d.fd;
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real!(dirfd, fn(*mut c_void) -> c_int)(dirp) }
}

/// Interposed `rewinddir`.
#[no_mangle]
pub unsafe extern "C" fn rewinddir(dirp: *mut c_void) {
    if let Some((_g, d)) = ours(dirp) {
        d.next = 0;
        return;
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real!(rewinddir, fn(*mut c_void) -> ())(dirp) }
}

/// Interposed `telldir`.
#[no_mangle]
pub unsafe extern "C" fn telldir(dirp: *mut c_void) -> c_long {
    if let Some((_g, d)) = ours(dirp) {
        return d.next as c_long;
    }
    // SAFETY: forwarding the caller's argument.
    unsafe { real!(telldir, fn(*mut c_void) -> c_long)(dirp) }
}

/// Interposed `seekdir`.
#[no_mangle]
pub unsafe extern "C" fn seekdir(dirp: *mut c_void, loc: c_long) {
    if let Some((_g, d)) = ours(dirp) {
        d.next = usize::try_from(loc).unwrap_or(0).min(d.entries.len());
        return;
    }
    // SAFETY: forwarding the caller's arguments.
    unsafe { real!(seekdir, fn(*mut c_void, c_long) -> ())(dirp, loc) }
}
