//! Placeholder fds. Every service file gets a real local fd: an unnamed
//! file in `/dev/shm` (`O_TMPFILE`), or a `memfd` named `sluice-fd` where
//! that cannot be made, whose contents describe the service file (a
//! header with its flags, inode number and server path) and whose own
//! file offset *is* the service file's position. The kernel thereby gives
//! us unique fd numbers, `dup`/`fork` sharing of the position,
//! `FD_CLOEXEC`, and a way for an `exec`ed program to find the service
//! files it inherited.
//!
//! Why `/dev/shm` first: a file opened by path has an atomic position, so
//! the kernel moves its offset for one `lseek(SEEK_CUR)` at a time,
//! whichever threads and processes share it, and writes take their range
//! that way (`io::svc_write`). A memfd has none, and kernels from 6.12 on
//! serialise `SEEK_CUR` only for files that have one: four processes
//! (or threads) each moving a shared memfd's offset 200,000 times by 13
//! bytes lost 3,860 to 37,395 of the moves on this machine's 6.18
//! kernel, an O_TMPFILE file in `/dev/shm` none. On a memfd, writes take
//! their range under the position lock instead.

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

/// Where placeholders are made first, and how their `/proc/self/fd`
/// links start.
const TMPFS: &std::ffi::CStr = c"/dev/shm";
const TMPFS_LINK: &str = "/dev/shm/#";

/// A new placeholder for a file opened with `flags`, its header not
/// written yet (`record`, once the server opened the file: a process out
/// of descriptors finds out before anything is made there), and whether
/// its position is atomic (module documentation).
pub fn create(flags: c_int) -> Result<(c_int, bool), Errno> {
    let cloexec = flags & libc::O_CLOEXEC;
    // SAFETY: a NUL-terminated path; the system call is not interposed.
    let fd = unsafe { libc::syscall(libc::SYS_openat, libc::AT_FDCWD, TMPFS.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | cloexec, 0o600) } as c_int;
    if fd >= 0 {
        return Ok((fd, true));
    }
    let e = last_errno();
    if e.0 == libc::EMFILE || e.0 == libc::ENFILE {
        return Err(e);
    }
    let cloexec = if cloexec != 0 { libc::MFD_CLOEXEC } else { 0 };
    // SAFETY: a NUL-terminated name; memfd_create is not interposed.
    let fd = unsafe { libc::memfd_create(c"sluice-fd".as_ptr(), cloexec) };
    if fd < 0 {
        return Err(last_errno());
    }
    Ok((fd, false))
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

/// The service file described by placeholder `fd`, if it is one, and
/// whether its position is atomic (an `O_TMPFILE` placeholder, not a
/// memfd). Another unnamed file in `/dev/shm` has no header to parse.
fn read_header(fd: c_int) -> Option<(c_int, u64, String, bool)> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let link = link.to_str()?;
    let atomic = link.starts_with(TMPFS_LINK);
    if !atomic && !link.starts_with(&format!("/memfd:{NAME} ")) {
        return None;
    }
    let mut buf = vec![0u8; HEADER_BYTES_MAX];
    let pread = real!(pread, fn(c_int, *mut c_void, size_t, off_t) -> ssize_t);
    // SAFETY: reading into `buf`, which holds `buf.len()` bytes.
    let n = unsafe { pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    buf.truncate(usize::try_from(n).ok()?);
    let (flags, ino, path) = parse(&buf)?;
    Some((flags, ino, path, atomic))
}

/// At start-up: take over the placeholders this process inherited across
/// `exec`. Their server handles are opened on first use.
pub fn adopt_inherited() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return };
    let fds: Vec<c_int> = dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    for fd in fds {
        if let Some((flags, ino, path, atomic)) = read_header(fd) {
            let open = Arc::new(Open::new(path, flags, None, ino, atomic));
            // The process that exec'd, or its parent, may hold it still.
            open.set_shared();
            let _ = with_tables(|t| t.fds.insert(fd, open));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes take their range with one `lseek(SEEK_CUR)` on the
    /// placeholder and no lock: that holds only if the kernel moves its
    /// offset atomically. Four threads moving one `O_TMPFILE` placeholder
    /// lose no move (a memfd lost thousands on this machine's kernel).
    #[test]
    fn a_placeholders_offset_moves_atomically() {
        let (fd, atomic) = create(0).expect("a placeholder");
        assert!(atomic, "/dev/shm takes O_TMPFILE here");
        const MOVES: i64 = 50_000;
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..MOVES).for_each(|_| assert!(seek(fd, 13, libc::SEEK_CUR).is_ok())));
            }
        });
        assert_eq!(position(fd), Ok(4 * MOVES as u64 * 13));
        close_real(fd);
    }

    #[test]
    fn headers_parse_back() {
        assert_eq!(parse(b"SLUICE-FD 2\n1026 77\na/b c\nd"), Some((1026, 77, "a/b c\nd".into())));
        assert_eq!(parse(b"SLUICE-FD 1\n1026\na"), None, "another version");
        assert_eq!(parse(b"SLUICE-FD 2\n1\na"), None, "no inode number");
        assert_eq!(parse(b"SLUICE-FD 2\nx 1\na"), None);
    }
}
