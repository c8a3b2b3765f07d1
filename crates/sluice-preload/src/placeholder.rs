//! Placeholder fds. Every service file gets a real local fd: a `memfd`
//! named `sluice-fd` whose contents describe the service file (a header
//! with its flags, inode number and server path) and whose own file offset *is* the
//! service file's position. The kernel thereby gives us unique fd numbers,
//! `dup`/`fork` sharing of the position, `FD_CLOEXEC`, and a way for an
//! `exec`ed program to find the service files it inherited.

use std::sync::Arc;

use libc::{c_int, c_void, off_t, size_t, ssize_t};

use crate::real::real;
use crate::state::{kept_flags, last_errno, with_tables, Errno, Open};

/// Name of the memfd, as `/proc/self/fd/N` shows it (`/memfd:NAME`).
const NAME: &str = "sluice-fd";
/// First line of the header: then `FLAGS INO` and the path.
const MAGIC: &str = "SLUICE-FD 2\n";
/// Largest header read back: magic, flags and a `PATH_BYTES_MAX` path.
const HEADER_BYTES_MAX: usize = 8192;

/// A new placeholder for a file opened with `flags`, its header not
/// written yet (`record`, once the server opened the file: a process out
/// of descriptors finds out before anything is made there).
pub fn create(flags: c_int) -> Result<c_int, Errno> {
    let cloexec = if flags & libc::O_CLOEXEC != 0 { libc::MFD_CLOEXEC } else { 0 };
    // SAFETY: a NUL-terminated name; memfd_create is not interposed.
    let fd = unsafe { libc::memfd_create(c"sluice-fd".as_ptr(), cloexec) };
    if fd < 0 {
        return Err(last_errno());
    }
    Ok(fd)
}

/// Write placeholder `fd`'s header: the server path, the open flags and
/// the file's inode number.
pub fn record(fd: c_int, path: &str, flags: c_int, ino: u64) -> Result<(), Errno> {
    let header = format!("{MAGIC}{} {ino}\n{path}", kept_flags(flags));
    let pwrite = real!(pwrite, fn(c_int, *const c_void, size_t, off_t) -> ssize_t);
    // SAFETY: writing `header`'s bytes to a placeholder we made.
    let n = unsafe { pwrite(fd, header.as_ptr().cast(), header.len(), 0) };
    if n != header.len() as ssize_t {
        return Err(last_errno());
    }
    Ok(())
}

pub fn close_real(fd: c_int) -> c_int {
    // SAFETY: closing an fd we own.
    unsafe { real!(close, fn(c_int) -> c_int)(fd) }
}

/// The placeholder's offset: the service file position.
pub fn position(fd: c_int) -> Result<u64, Errno> {
    seek(fd, 0, libc::SEEK_CUR)
}

/// `lseek` on the placeholder itself.
pub fn seek(fd: c_int, off: i64, whence: c_int) -> Result<u64, Errno> {
    // SAFETY: lseek on a placeholder fd has no memory effects.
    let r = unsafe { real!(lseek, fn(c_int, off_t, c_int) -> off_t)(fd, off, whence) };
    if r < 0 {
        return Err(last_errno());
    }
    Ok(r as u64)
}

/// Parse a header: (flags, inode number, server path).
fn parse(header: &[u8]) -> Option<(c_int, u64, String)> {
    let s = std::str::from_utf8(header).ok()?.strip_prefix(MAGIC)?;
    let (line, path) = s.split_once('\n')?;
    let (flags, ino) = line.split_once(' ')?;
    Some((flags.parse().ok()?, ino.parse().ok()?, path.to_string()))
}

/// The service file described by placeholder `fd`, if it is one.
fn read_header(fd: c_int) -> Option<(c_int, u64, String)> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    if !link.to_str()?.starts_with(&format!("/memfd:{NAME} ")) {
        return None;
    }
    let mut buf = vec![0u8; HEADER_BYTES_MAX];
    let pread = real!(pread, fn(c_int, *mut c_void, size_t, off_t) -> ssize_t);
    // SAFETY: reading into `buf`, which holds `buf.len()` bytes.
    let n = unsafe { pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    buf.truncate(usize::try_from(n).ok()?);
    parse(&buf)
}

/// At start-up: take over the placeholders this process inherited across
/// `exec`. Their server handles are opened on first use.
pub fn adopt_inherited() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return };
    let fds: Vec<c_int> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    for fd in fds {
        if let Some((flags, ino, path)) = read_header(fd) {
            let open = Arc::new(Open::new(path, flags, None, ino));
            // The process that exec'd, or its parent, may hold it still.
            open.set_shared();
            let _ = with_tables(|t| t.fds.insert(fd, open));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse_back() {
        assert_eq!(parse(b"SLUICE-FD 2\n1026 77\na/b c\nd"), Some((1026, 77, "a/b c\nd".into())));
        assert_eq!(parse(b"SLUICE-FD 1\n1026\na"), None, "another version");
        assert_eq!(parse(b"SLUICE-FD 2\n1\na"), None, "no inode number");
        assert_eq!(parse(b"SLUICE-FD 2\nx 1\na"), None);
    }
}
