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
/// prefix itself); held across `fork` (`state::fork_prepare`), as the
/// other tables are.
pub(crate) static CWD: Mutex<Option<String>> = Mutex::new(None);

/// The service cwd, if the cwd is on the service (one atomic load when
/// it is not).
pub fn get() -> Option<String> {
    if !SET.load(Ordering::Acquire) {
        return None;
    }
    lock(&CWD).clone()
}

fn set(dir: Option<String>) {
    let env = {
        let mut c = lock(&CWD);
        SET.store(dir.is_some(), Ordering::Release);
        if *c == dir {
            return;
        }
        *c = dir.clone();
        dir
    };
    // Outside the lock (a fork meanwhile must not find it held), through
    // std, which orders its own environment reads with it; the cwd is
    // process-wide, as the environment is.
    match env {
        Some(d) => std::env::set_var(CWD_ENV, d),
        None => std::env::remove_var(CWD_ENV),
    }
}

/// Levels of removed directories above the kernel's cwd while the cwd is
/// on the service: a relative path that climbs out of the prefix finds
/// removed directories (ENOENT) for this many `..`, not the temporary
/// directory they were made in.
pub const NOWHERE_DEPTH: usize = 16;

/// Move the kernel's cwd into a fresh chain of empty directories and
/// remove them all: no relative path resolves there any more (ENOENT),
/// nothing can be made in it, and `..` leads only to removed directories
/// for `NOWHERE_DEPTH` levels.
fn kernel_cwd_nowhere() -> Result<(), Errno> {
    let base = std::env::var("TMPDIR").ok().filter(|t| t.starts_with('/')).unwrap_or_else(|| "/tmp".into());
    let Ok(tmpl) = CString::new(format!("{}/sluice-cwd-XXXXXX", base.trim_end_matches('/'))) else { return Ok(()) };
    let mut tmpl = tmpl.into_bytes_with_nul();
    // SAFETY: a writable NUL-terminated template.
    let d = unsafe { libc::mkdtemp(tmpl.as_mut_ptr().cast()) };
    if d.is_null() {
        // No room for the empty directories (a read-only or full TMPDIR):
        // the kernel's cwd stays where it was; the cwd on the service
        // still holds for every path the interposer sees.
        return Ok(());
    }
    let top = String::from_utf8_lossy(&tmpl[..tmpl.len() - 1]).into_owned();
    let mut chain = vec![top];
    for _ in 1..NOWHERE_DEPTH {
        let next = format!("{}/d", chain[chain.len() - 1]);
        let Ok(c) = CString::new(next.clone()) else { break };
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
            break;
        }
        chain.push(next);
    }
    let cs: Vec<CString> = chain.into_iter().filter_map(|p| CString::new(p).ok()).collect();
    let deepest = cs.last().expect("mkdtemp made the first");
    // SAFETY: NUL-terminated paths of the directories just made.
    let r = unsafe { real!(chdir, fn(*const c_char) -> c_int)(deepest.as_ptr()) };
    let e = last_errno();
    for c in cs.iter().rev() {
        // SAFETY: as above.
        unsafe { libc::rmdir(c.as_ptr()) };
    }
    if r < 0 {
        return Err(e);
    }
    Ok(())
}

/// `chdir` to server directory `dir`.
pub fn enter(dir: &str) -> Result<c_int, Errno> {
    let st = client()?.stat(dir)?;
    if st.mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(Errno(libc::ENOTDIR));
    }
    if !searchable(&st) {
        return Err(Errno(libc::EACCES));
    }
    if get().is_none() {
        kernel_cwd_nowhere()?;
    }
    set(Some(dir.trim_end_matches('/').to_string()).filter(|d| !d.is_empty()).or(Some(".".into())));
    Ok(0)
}

/// Whether this process may search directory `st` (`chdir` needs it), by
/// its mode bits as the kernel checks them without ACLs: root always, the
/// owner by the owner's bit, a member of its group by the group's.
fn searchable(st: &sluice_client::Stat) -> bool {
    // SAFETY: geteuid, getegid and getgroups have no preconditions; the
    // buffer holds the count asked.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 {
        return st.mode & 0o111 != 0;
    }
    if uid == st.uid {
        return st.mode & 0o100 != 0;
    }
    let mut groups = [0 as libc::gid_t; 256];
    // SAFETY: as above.
    let n = unsafe { libc::getgroups(groups.len() as c_int, groups.as_mut_ptr()) }.max(0) as usize;
    if gid == st.gid || groups[..n].contains(&st.gid) {
        return st.mode & 0o010 != 0;
    }
    st.mode & 0o001 != 0
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

/// The cwd on the service as a local path, PREFIX or PREFIX/dir
/// (`getcwd`); `None` while the cwd is local. The cwd is read first:
/// `config` itself asks libc's `getcwd` when it starts.
pub fn local_path() -> Option<String> {
    let dir = get()?;
    Some(path(&crate::state::config()?.prefix, &dir))
}

/// A relative local path `p` as seen from the cwd on the service, made
/// absolute (`chdir("..")` from the prefix's root goes to its local
/// parent); `None` while the cwd is local or for an absolute `p`.
pub fn absolute(p: &str) -> Option<String> {
    if p.starts_with('/') {
        return None;
    }
    Some(crate::path::join(&local_path()?, p))
}

/// The local path of server directory `dir` under `prefix`.
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
    if size == 0 {
        return Err(Errno(libc::EINVAL));
    }
    if size < bytes.len() {
        return Err(Errno(libc::ERANGE));
    }
    // SAFETY: the caller's buffer holds `size` >= `bytes.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().cast(), buf, bytes.len()) };
    Ok(buf)
}

/// An `execve` environment with `SLUICE_CWD` set to the service cwd or
/// removed: the caller's strings (borrowed: they outlive the call) and
/// the new one.
pub struct ExecEnv {
    ptrs: Vec<*const c_char>,
    _cwd: Option<CString>,
}

impl ExecEnv {
    /// The null-terminated array to pass.
    pub fn as_ptr(&self) -> *const *const c_char {
        self.ptrs.as_ptr()
    }
}

/// `envp` for an `execve` with `SLUICE_CWD` set to the service cwd, or
/// removed when the cwd is local; `None` (and nothing copied: every exec
/// of a shell comes here) when it needs no change.
///
/// # Safety
/// `envp` is null or a null-terminated array of NUL-terminated strings.
pub unsafe fn env_for_exec(envp: *const *const c_char) -> Option<ExecEnv> {
    let mut entries: Vec<*const c_char> = Vec::new();
    if !envp.is_null() {
        let mut i = 0;
        loop {
            // SAFETY: as required of the caller.
            let p = unsafe { *envp.add(i) };
            if p.is_null() {
                break;
            }
            entries.push(p);
            i += 1;
        }
    }
    // SAFETY: the caller's NUL-terminated strings.
    let ours = |p: &*const c_char| unsafe { CStr::from_ptr(*p) }.to_bytes().starts_with(b"SLUICE_CWD=");
    let cwd = get();
    if cwd.is_none() && !entries.iter().any(ours) {
        return None;
    }
    entries.retain(|p| !ours(p));
    let cwd = cwd.and_then(|d| CString::new(format!("{CWD_ENV}={d}")).ok());
    if let Some(c) = &cwd {
        entries.push(c.as_ptr());
    }
    entries.push(std::ptr::null());
    Some(ExecEnv { ptrs: entries, _cwd: cwd })
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
