//! Deciding which calls go to the server: a local fd that is one of our
//! placeholders, or a path under the prefix (relative paths resolved
//! against the cwd or against a service directory fd).

use std::ffi::CStr;
use std::sync::Arc;

use libc::{c_char, c_int};

use crate::path;
use crate::state::{config, lookup, Guard, Open};

/// A service fd, with the guard held for the work on it; `None`: pass the
/// call through (not ours, or we are already inside the interposer).
pub fn service_fd(fd: c_int) -> Option<(Guard, Arc<Open>)> {
    if fd < 0 || !crate::state::any_entries() {
        return None;
    }
    let g = Guard::enter()?;
    let open = lookup(fd)?;
    Some((g, open))
}

/// The server path of C string `p` taken relative to `dirfd`, if it lies
/// under the prefix; the guard is held for the work on it.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
pub unsafe fn service_path(dirfd: c_int, p: *const c_char) -> Option<(Guard, String)> {
    config()?;
    if p.is_null() {
        return None;
    }
    let g = Guard::enter()?;
    // SAFETY: as required of our caller.
    let server = unsafe { resolve(dirfd, p) }?;
    Some((g, server))
}

/// The server path of `p` relative to `dirfd`, with the guard already held.
///
/// # Safety
/// `p` is null or a NUL-terminated string.
pub unsafe fn resolve(dirfd: c_int, p: *const c_char) -> Option<String> {
    let cfg = config()?;
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let p = unsafe { CStr::from_ptr(p) }.to_str().ok()?;
    if p.is_empty() {
        return None;
    }
    let server = if p.starts_with('/') {
        path::within(&cfg.prefix, &path::normalise(p))?
    } else if dirfd == libc::AT_FDCWD {
        match crate::cwd::local_path() {
            // The cwd is on the service: a path that climbs out of the
            // prefix reaches libc as given, against a removed directory
            // (ENOENT; `chdir` goes there, `cwd::absolute`).
            Some(cwd) => path::within(&cfg.prefix, &path::join(&cwd, p))?,
            None => path::within(&cfg.prefix, &path::join(std::env::current_dir().ok()?.to_str()?, p))?,
        }
    } else {
        path::server_join(&lookup(dirfd)?.path, p)?
    };
    Some(path::keep_trailing_slash(p, server))
}
