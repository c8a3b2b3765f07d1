//! Wakes the event loop from another thread: an eventfd in its epoll set,
//! which the ring also signals its completions on.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Wakes the loop from another thread (an eventfd in the loop's epoll set).
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    pub fn new() -> io::Result<Waker> {
        // SAFETY: plain system call; the descriptor is owned from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        Ok(Waker { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    pub fn wake(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub fn drain(&self) {
        let mut n = 0u64;
        // SAFETY: reads 8 bytes into a live u64.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }
}

impl Waker {
    /// The eventfd, for the loop's epoll set and the ring.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
