//! The served directory: every path a client names is resolved beneath it,
//! and only there.
//!
//! Paths are relative to the root. An absolute path is refused outright;
//! the rest is resolved by `openat2(2)` with `RESOLVE_BENEATH`, so neither
//! `..` nor a symlink (relative or absolute) can leave the root, and no
//! check-then-use race exists. Where `openat2` is missing (Linux < 5.6,
//! seccomp), the fallback walks the path one component at a time with
//! `O_NOFOLLOW` and refuses every symlink and every `..`: stricter, never
//! looser. Operations on a name (unlink, mkdir, rename, rmdir) open the
//! parent that way and act on the last component with the `*at` calls.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use sluice_proto::{DirEntry, FileKind, WireStat};

use crate::error::{Error, ErrorKind, Result};

/// The root directory, opened once.
pub struct Root {
    dir: OwnedFd,
    openat2_missing: AtomicBool,
}

fn escape(path: &str, why: &str) -> Error {
    Error::new(ErrorKind::PathEscape, libc::EACCES, format!("{path}: {why}"))
}

fn cstring(path: &str) -> Result<CString> {
    CString::new(path).map_err(|_| Error::invalid(format!("{path:?}: path contains a NUL byte")))
}

fn cvt(r: libc::c_int, what: &str) -> Result<libc::c_int> {
    if r < 0 {
        return Err(Error::io(what, &io::Error::last_os_error()));
    }
    Ok(r)
}

impl Root {
    /// Open `dir` as the root.
    pub fn open(dir: &Path) -> Result<Root> {
        let f = File::open(dir).map_err(|e| Error::new(ErrorKind::Config, e.raw_os_error().unwrap_or(libc::EIO), format!("root {}: {e}", dir.display())))?;
        if !f.metadata().map(|m| m.is_dir()).unwrap_or(false) {
            return Err(Error::config(format!("root {} is not a directory", dir.display())));
        }
        Ok(Root { dir: OwnedFd::from(f), openat2_missing: AtomicBool::new(false) })
    }

    /// Refuse what no resolution may accept, with a clear reason.
    fn precheck(path: &str) -> Result<&str> {
        if path.starts_with('/') {
            return Err(escape(path, "absolute paths are refused; paths are relative to the server root"));
        }
        let mut depth = 0i64;
        for c in path.split('/') {
            match c {
                "" | "." => {}
                ".." => depth -= 1,
                _ => depth += 1,
            }
            if depth < 0 {
                return Err(escape(path, "path escapes the server root"));
            }
        }
        Ok(if path.is_empty() { "." } else { path })
    }

    /// Open `path` beneath the root with `open(2)` flags and mode.
    pub fn open_beneath(&self, path: &str, flags: i32, mode: u32) -> Result<OwnedFd> {
        let rel = Root::precheck(path)?;
        if !self.openat2_missing.load(Ordering::Relaxed) {
            match self.openat2(rel, flags, mode) {
                Err(e) if e.errno == libc::ENOSYS => {
                    self.openat2_missing.store(true, Ordering::Relaxed);
                }
                Err(e) if e.errno == libc::EXDEV => return Err(escape(path, "path escapes the server root")),
                other => return other.map_err(|e| Error::new(e.kind, e.errno, format!("{path}: {}", e.message))),
            }
        }
        self.open_walk(rel, flags, mode).map_err(|e| Error::new(e.kind, e.errno, format!("{path}: {}", e.message)))
    }

    fn openat2(&self, rel: &str, flags: i32, mode: u32) -> Result<OwnedFd> {
        let c = cstring(rel)?;
        // SAFETY: open_how is a plain C struct; all-zero is a valid value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC) as u64;
        // O_TMPFILE includes O_DIRECTORY's bit: test it whole, or every
        // O_DIRECTORY open with a mode would be EINVAL.
        let creates = flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE;
        how.mode = if creates { u64::from(mode & 0o7777) } else { 0 };
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: c and how outlive the call; the size is how's size.
        let r = unsafe { libc::syscall(libc::SYS_openat2, self.dir.as_raw_fd(), c.as_ptr(), &how as *const libc::open_how, std::mem::size_of::<libc::open_how>()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(Error::new(ErrorKind::Io, e.raw_os_error().unwrap_or(libc::EIO), e.to_string()));
        }
        // SAFETY: the kernel returned a fresh descriptor we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
    }

    /// The fallback: one component at a time, no symlinks, no `..`.
    fn open_walk(&self, rel: &str, flags: i32, mode: u32) -> Result<OwnedFd> {
        let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
        if comps.contains(&"..") {
            return Err(escape(rel, "`..` is refused where openat2 is unavailable"));
        }
        let dup = |fd: RawFd| -> Result<OwnedFd> {
            // SAFETY: fcntl(F_DUPFD_CLOEXEC) on a descriptor we hold.
            let r = cvt(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) }, "dup")?;
            // SAFETY: a fresh descriptor.
            Ok(unsafe { OwnedFd::from_raw_fd(r) })
        };
        let mut cur = dup(self.dir.as_raw_fd())?;
        for (i, comp) in comps.iter().enumerate() {
            let last = i + 1 == comps.len();
            let f = if last { flags | libc::O_NOFOLLOW } else { libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW };
            let c = cstring(comp)?;
            // SAFETY: c outlives the call.
            let r = unsafe { libc::openat(cur.as_raw_fd(), c.as_ptr(), f | libc::O_CLOEXEC, mode & 0o7777) };
            let r = cvt(r, "open").map_err(|e| if e.errno == libc::ELOOP { escape(rel, "symlinks are refused where openat2 is unavailable") } else { e })?;
            // SAFETY: a fresh descriptor.
            cur = unsafe { OwnedFd::from_raw_fd(r) };
        }
        if comps.is_empty() {
            let c = cstring(".")?;
            // SAFETY: c outlives the call.
            let r = cvt(unsafe { libc::openat(cur.as_raw_fd(), c.as_ptr(), flags | libc::O_CLOEXEC, mode & 0o7777) }, "open")?;
            // SAFETY: a fresh descriptor.
            cur = unsafe { OwnedFd::from_raw_fd(r) };
        }
        Ok(cur)
    }

    /// The parent directory of `path` (opened beneath the root) and the
    /// last component, which must be a plain name.
    fn parent(&self, path: &str) -> Result<(OwnedFd, CString)> {
        let trimmed = path.trim_end_matches('/');
        let (dir, name) = match trimmed.rfind('/') {
            Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
            None => ("", trimmed),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(Error::invalid(format!("{path:?}: not a name inside the root")));
        }
        Root::precheck(path)?;
        let fd = self.open_beneath(if dir.is_empty() { "." } else { dir }, libc::O_PATH | libc::O_DIRECTORY, 0)?;
        Ok((fd, cstring(name)?))
    }

    pub fn stat(&self, path: &str) -> Result<WireStat> {
        self.stat_opened(path, libc::O_PATH)
    }

    /// `stat` of a final symbolic link itself, as `lstat(2)` (links
    /// before it are followed, beneath the root, as for `stat`).
    pub fn lstat(&self, path: &str) -> Result<WireStat> {
        self.stat_opened(path, libc::O_PATH | libc::O_NOFOLLOW)
    }

    fn stat_opened(&self, path: &str, flags: i32) -> Result<WireStat> {
        let fd = self.open_beneath(path, flags, 0)?;
        fstat(fd.as_raw_fd()).map_err(|e| Error::new(e.kind, e.errno, format!("{path}: {}", e.message)))
    }

    /// The capacity and free space of the file system holding `path`, as
    /// `statvfs(3)` gives them.
    pub fn statfs(&self, path: &str) -> Result<sluice_proto::WireStatfs> {
        let fd = self.open_beneath(path, libc::O_PATH, 0)?;
        // SAFETY: an all-zero statvfs is a valid value to be overwritten.
        let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: fstatvfs on a descriptor we hold, into a struct we own.
        if unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut v) } != 0 {
            let e = io::Error::last_os_error();
            return Err(Error::new(ErrorKind::Io, e.raw_os_error().unwrap_or(libc::EIO), format!("{path}: statfs: {e}")));
        }
        let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
        Ok(sluice_proto::WireStatfs {
            block_bytes: clamp(v.f_frsize as u64),
            io_bytes: clamp(v.f_bsize as u64),
            blocks: v.f_blocks as u64,
            blocks_free: v.f_bfree as u64,
            blocks_avail: v.f_bavail as u64,
            files: v.f_files as u64,
            files_free: v.f_ffree as u64,
            name_max: clamp(v.f_namemax as u64),
        })
    }

    /// The target of the symbolic link at `path`, as `readlink(2)` gives
    /// it (the text; what it names is the caller's to resolve). EINVAL
    /// when `path` is not a link.
    pub fn readlink(&self, path: &str) -> Result<String> {
        let fd = self.open_beneath(path, libc::O_PATH | libc::O_NOFOLLOW, 0)?;
        let mut buf = vec![0u8; sluice_proto::PATH_BYTES_MAX + 1];
        // SAFETY: readlinkat of the O_PATH link itself (empty path) into a
        // buffer of its length.
        let n = unsafe { libc::readlinkat(fd.as_raw_fd(), c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            let errno = match e.raw_os_error() {
                // An empty path names the descriptor: ENOENT there means
                // it is not a link.
                Some(libc::ENOENT) => libc::EINVAL,
                other => other.unwrap_or(libc::EIO),
            };
            return Err(Error::new(ErrorKind::Io, errno, format!("{path}: not a symbolic link or unreadable: {e}")));
        }
        let n = n as usize;
        if n > sluice_proto::PATH_BYTES_MAX {
            return Err(Error::new(ErrorKind::Io, libc::ENAMETOOLONG, format!("{path}: link target longer than PATH_BYTES_MAX")));
        }
        buf.truncate(n);
        String::from_utf8(buf).map_err(|_| Error::new(ErrorKind::Io, libc::EILSEQ, format!("{path}: link target is not UTF-8")))
    }

    pub fn unlink(&self, path: &str) -> Result<()> {
        if path.ends_with('/') {
            // `file/` names a directory, which unlink never removes.
            let st = self.stat(path)?;
            let errno = if st.mode & libc::S_IFMT == libc::S_IFDIR { libc::EISDIR } else { libc::ENOTDIR };
            return Err(Error::new(ErrorKind::Io, errno, format!("{path}: unlink of a name with a trailing slash")));
        }
        let (dir, name) = self.parent(path)?;
        // SAFETY: name outlives the call.
        cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) }, path).map(drop)
    }

    pub fn rmdir(&self, path: &str) -> Result<()> {
        let (dir, name) = self.parent(path)?;
        // SAFETY: name outlives the call.
        cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) }, path).map(drop)
    }

    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        let (dir, name) = self.parent(path)?;
        // SAFETY: name outlives the call.
        cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), (mode & 0o7777) as libc::mode_t) }, path).map(drop)
    }

    /// Change `path`'s mode (`SETATTR_MODE_KEEP`: not) and times (see
    /// `times`). Following links: the path is opened beneath the root
    /// (`O_PATH`) and changed through `/proc/self/fd` (a link out of the
    /// root is refused, as for an open); `nofollow`: a final link itself,
    /// by its directory and name (its mode cannot change: EOPNOTSUPP).
    pub fn set_attr(&self, path: &str, mode: u32, times: Option<[libc::timespec; 2]>, nofollow: bool) -> Result<()> {
        if nofollow {
            let (dir, name) = self.parent(path)?;
            if mode != sluice_proto::SETATTR_MODE_KEEP {
                // SAFETY: name outlives the call.
                cvt(unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode & 0o7777, libc::AT_SYMLINK_NOFOLLOW) }, path)?;
            }
            if let Some(t) = times {
                // SAFETY: name and the two timespecs outlive the call.
                cvt(unsafe { libc::utimensat(dir.as_raw_fd(), name.as_ptr(), t.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) }, path)?;
            }
            return Ok(());
        }
        let fd = self.open_beneath(path, libc::O_PATH, 0)?;
        let proc = cstring(&format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        if mode != sluice_proto::SETATTR_MODE_KEEP {
            // SAFETY: a NUL-terminated path naming our own descriptor.
            cvt(unsafe { libc::chmod(proc.as_ptr(), mode & 0o7777) }, path)?;
        }
        if let Some(t) = times {
            // SAFETY: as above; the two timespecs outlive the call.
            cvt(unsafe { libc::utimensat(libc::AT_FDCWD, proc.as_ptr(), t.as_ptr(), 0) }, path)?;
        }
        Ok(())
    }

    /// A symbolic link at `path` holding `target` as given (what it names
    /// is resolved, beneath the root, only when a path through it is
    /// opened).
    pub fn symlink(&self, target: &str, path: &str) -> Result<()> {
        if path.ends_with('/') {
            // As symlink(2): a new name with a trailing slash would have to
            // be a directory.
            return Err(Error::new(ErrorKind::Io, libc::ENOENT, format!("{path}: a link cannot be made at a name with a trailing slash")));
        }
        let (dir, name) = self.parent(path)?;
        let t = std::ffi::CString::new(target).map_err(|_| Error::invalid("link target holds a NUL byte"))?;
        // SAFETY: both strings outlive the call.
        cvt(unsafe { libc::symlinkat(t.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }, path).map(drop)
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let (fdir, fname) = self.parent(from)?;
        let (tdir, tname) = self.parent(to)?;
        // SAFETY: both names outlive the call.
        let r = unsafe { libc::renameat(fdir.as_raw_fd(), fname.as_ptr(), tdir.as_raw_fd(), tname.as_ptr()) };
        cvt(r, &format!("rename {from} -> {to}")).map(drop)
    }

    /// Entries of directory `path`, sorted by name, from index `start`, at
    /// most `page` of them; `done` when the page reaches the end.
    pub fn readdir(&self, path: &str, start: u32, page: usize, entries_max: u32) -> Result<(Vec<DirEntry>, bool)> {
        let fd = self.open_beneath(path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let mut all = list_dir(fd, entries_max).map_err(|e| Error::new(e.kind, e.errno, format!("{path}: {}", e.message)))?;
        all.sort_by(|a, b| a.name.cmp(&b.name));
        let total = all.len();
        let start = (start as usize).min(total);
        let end = (start + page).min(total);
        Ok((all.drain(start..end).collect(), end == total))
    }
}

fn kind_of(d_type: u8) -> FileKind {
    match d_type {
        libc::DT_REG => FileKind::File,
        libc::DT_DIR => FileKind::Dir,
        libc::DT_LNK => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

/// Read every entry but `.` and `..`; more than `entries_max` is an error.
fn list_dir(fd: OwnedFd, entries_max: u32) -> Result<Vec<DirEntry>> {
    use std::os::fd::IntoRawFd;
    // SAFETY: fdopendir takes ownership of the descriptor on success.
    let dir = unsafe { libc::fdopendir(fd.into_raw_fd()) };
    if dir.is_null() {
        return Err(Error::io("opendir", &io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    let result = loop {
        // SAFETY: dir is a valid DIR* until closedir below.
        let ent = unsafe { libc::readdir64(dir) };
        if ent.is_null() {
            break Ok(());
        }
        // SAFETY: readdir64 returned a valid entry whose d_name is NUL-terminated.
        let (name, d_type) = unsafe { (std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()), (*ent).d_type) };
        let name = name.to_string_lossy();
        if name == "." || name == ".." {
            continue;
        }
        if out.len() >= entries_max as usize {
            break Err(Error::limit(libc::E2BIG, format!("directory has more than dir_entries_max ({entries_max}) entries")));
        }
        out.push(DirEntry { name: name.into_owned(), kind: kind_of(d_type) });
    };
    // SAFETY: dir came from fdopendir and is closed once.
    unsafe { libc::closedir(dir) };
    result.map(|()| out)
}

/// `fstat(2)` as a wire record.
pub fn fstat(fd: RawFd) -> Result<WireStat> {
    // SAFETY: an all-zero stat is valid, and fstat fills it.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    cvt(unsafe { libc::fstat64(fd, &mut st) }, "fstat")?;
    let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
    Ok(WireStat {
        size: st.st_size as u64,
        mode: st.st_mode,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        ino: st.st_ino,
        blocks: st.st_blocks as u64,
        blksize: st.st_blksize as u32,
        atime_ns: ns(st.st_atime, st.st_atime_nsec),
        mtime_ns: ns(st.st_mtime, st.st_mtime_nsec),
        ctime_ns: ns(st.st_ctime, st.st_ctime_nsec),
    })
}
