//! A working directory on the service. The kernel's cwd must be a local
//! directory, so `chdir` into the prefix is kept here instead: relative
//! paths resolve against it (`route::resolve`), `getcwd` answers it, and
//! it reaches programs this process `exec`s through `SLUICE_CWD`.
//! Meanwhile the kernel's cwd is an empty directory removed at once, so a
//! relative path that climbs out of the prefix, or a program that is not
//! preloaded, fails with ENOENT instead of landing in the directory the
//! program was in before. coreutils' `mkdir -p` walks down with `chdir`,
//! and a shell's `cd PREFIX/dir` is one.

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use libc::{c_char, c_int};
use sluice_client::lock;

use crate::real::real;
use crate::state::{client, last_errno, Errno};

/// The environment variable that carries the service cwd across `exec`.
pub const CWD_ENV: &str = "SLUICE_CWD";

static SET: AtomicBool = AtomicBool::new(false);
/// The server path of the cwd while it is on the service (`"."`: the
/// prefix itself).
static CWD: Mutex<Option<String>> = Mutex::new(None);

/// The service cwd, if the cwd is on the service (one atomic load when
/// it is not).
pub fn get() -> Option<String> {
    if !SET.load(Ordering::Acquire) {
        return None;
    }
    lock(&CWD).clone()
}

fn set(dir: Option<String>) {
    let mut c = lock(&CWD);
    SET.store(dir.is_some(), Ordering::Release);
    // Through std, which orders its own environment reads with it; the cwd
    // is process-wide, as the environment is.
    match &dir {
        Some(d) => std::env::set_var(CWD_ENV, d),
        None => std::env::remove_var(CWD_ENV),
    }
    *c = dir;
}

/// Move the kernel's cwd into a fresh empty directory and remove it: no
/// relative path resolves there any more (ENOENT), and nothing can be
/// made in it.
fn kernel_cwd_nowhere() -> Result<(), Errno> {
    let mut tmpl = *b"/tmp/sluice-cwd-XXXXXX\0";
    // SAFETY: a writable NUL-terminated template.
    let d = unsafe { libc::mkdtemp(tmpl.as_mut_ptr().cast()) };
    if d.is_null() {
        return Err(last_errno());
    }
    // SAFETY: the directory mkdtemp just made, by its NUL-terminated path.
    unsafe {
        let r = real!(chdir, fn(*const c_char) -> c_int)(d);
        let e = last_errno();
        libc::rmdir(d);
        if r < 0 {
            return Err(e);
        }
    }
    Ok(())
}

/// `chdir` to server directory `dir`.
pub fn enter(dir: &str) -> Result<c_int, Errno> {
    let st = client()?.stat(dir)?;
    if st.mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(Errno(libc::ENOTDIR));
    }
    if get().is_none() {
        kernel_cwd_nowhere()?;
    }
    set(Some(dir.trim_end_matches('/').to_string()).filter(|d| !d.is_empty()).or(Some(".".into())));
    Ok(0)
}

/// The cwd is local again (a real `chdir` or `fchdir` succeeded).
pub fn left() {
    if SET.load(Ordering::Acquire) {
        set(None);
    }
}

/// At start-up: a cwd on the service inherited across `exec`, taken only
/// if the kernel's cwd is still a removed directory (a program between
/// may have moved it).
pub fn adopt_inherited() {
    let Ok(dir) = std::env::var(CWD_ENV) else { return };
    let removed = std::env::current_dir().is_err_and(|e| e.raw_os_error() == Some(libc::ENOENT));
    if removed && !dir.is_empty() && !dir.starts_with('/') {
        set(Some(dir));
    } else {
        set(None);
    }
}

/// `getcwd` while the cwd is on the service: PREFIX or PREFIX/dir.
pub fn path(prefix: &str, dir: &str) -> String {
    if dir == "." {
        prefix.to_string()
    } else if prefix == "/" {
        format!("/{dir}")
    } else {
        format!("{prefix}/{dir}")
    }
}

/// Copy `s` into the caller's `getcwd` buffer (or a new one when `buf` is
/// null, as glibc allows).
///
/// # Safety
/// `buf` is null or holds `size` bytes.
pub unsafe fn fill(s: &str, buf: *mut c_char, size: usize) -> Result<*mut c_char, Errno> {
    let c = CString::new(s).map_err(|_| Errno(libc::ENOENT))?;
    let bytes = c.as_bytes_with_nul();
    if buf.is_null() {
        let want = if size == 0 { bytes.len() } else { size };
        if want < bytes.len() {
            return Err(Errno(libc::ERANGE));
        }
        // SAFETY: malloc of `want` bytes, freed by the caller as glibc's.
        let p = unsafe { libc::malloc(want) }.cast::<c_char>();
        if p.is_null() {
            return Err(Errno(libc::ENOMEM));
        }
        // SAFETY: `p` holds `want` >= `bytes.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().cast(), p, bytes.len()) };
        return Ok(p);
    }
    if size < bytes.len() {
        return Err(Errno(libc::ERANGE));
    }
    // SAFETY: the caller's buffer holds `size` >= `bytes.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().cast(), buf, bytes.len()) };
    Ok(buf)
}

/// `envp` for an `execve` with `SLUICE_CWD` set to the service cwd, or
/// removed when the cwd is local; `None` when it needs no change.
///
/// # Safety
/// `envp` is null or a null-terminated array of NUL-terminated strings.
pub unsafe fn env_for_exec(envp: *const *const c_char) -> Option<Vec<CString>> {
    let mut out = Vec::new();
    let mut had = false;
    if !envp.is_null() {
        let mut i = 0;
        loop {
            // SAFETY: as required of the caller.
            let p = unsafe { *envp.add(i) };
            if p.is_null() {
                break;
            }
            // SAFETY: as above.
            let s = unsafe { CStr::from_ptr(p) };
            if s.to_bytes().starts_with(b"SLUICE_CWD=") {
                had = true;
            } else {
                out.push(s.to_owned());
            }
            i += 1;
        }
    }
    let cwd = get();
    if cwd.is_none() && !had {
        return None;
    }
    if let Some(d) = cwd {
        out.push(CString::new(format!("{CWD_ENV}={d}")).ok()?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getcwd_paths() {
        assert_eq!(path("/sluice", "."), "/sluice");
        assert_eq!(path("/sluice", "a/b"), "/sluice/a/b");
        assert_eq!(path("/", "a"), "/a");
    }
}
