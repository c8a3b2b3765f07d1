//! How dispatches reach the backing files: the `Storage` interface, the
//! real system calls behind it, and the stand-in tests inject faults with
//! (`ServerConfig::storage`).

use std::io;
use std::os::fd::RawFd;

use sluice_core::Op;

/// Most iovecs per system call (Linux's `IOV_MAX`).
pub const IOV_MAX: usize = 1024;

/// How dispatches reach the backing files: the system calls, or a
/// stand-in that tests use to inject faults (`ServerConfig::storage`).
pub trait Storage: Send + Sync {
    /// One vectored read or write at `offset` (`preadv`/`pwritev`): the
    /// bytes moved (0 at end of file for a read), or an errno.
    fn transfer_once(&self, fd: RawFd, op: Op, iov: &[libc::iovec], offset: u64) -> Result<usize, i32>;
}

/// The real thing: `preadv64`/`pwritev64`.
pub struct Syscalls;

impl Storage for Syscalls {
    fn transfer_once(&self, fd: RawFd, op: Op, iov: &[libc::iovec], offset: u64) -> Result<usize, i32> {
        let n = iov.len().min(IOV_MAX) as libc::c_int;
        // SAFETY: every iovec points into a live buffer of its length, owned
        // by the job for the duration of the call.
        let r = unsafe {
            match op {
                Op::Read => libc::preadv64(fd, iov.as_ptr(), n, offset as libc::off64_t),
                Op::Write => libc::pwritev64(fd, iov.as_ptr(), n, offset as libc::off64_t),
            }
        };
        if r < 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
        }
        Ok(r as usize)
    }
}
