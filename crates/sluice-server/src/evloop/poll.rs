//! The loop's readiness interface: one epoll set, level-triggered, with a
//! token per registered descriptor (the listener, the waker, then one per
//! connection). Every epoll call of the server goes through here.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Events taken per `epoll_wait`.
pub const EVENTS_MAX: usize = 256;

pub const TOKEN_LISTENER: u64 = 0;
pub const TOKEN_WAKER: u64 = 1;
/// The first connection's token; connections count up from here.
pub const FIRST_CONN: u64 = 2;

/// An epoll set and the buffer its events land in.
pub struct Poll {
    epoll: OwnedFd,
    events: Vec<libc::epoll_event>,
}

impl Poll {
    pub fn new() -> io::Result<Poll> {
        // SAFETY: plain system call; the descriptor is owned from here on.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Poll { epoll, events: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_MAX] })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: ev is a valid epoll_event for the call.
        if unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watch `fd` for `events` under `token`.
    pub fn add(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, token)
    }

    /// Watch `fd` for `events` instead.
    pub fn modify(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, token)
    }

    /// Stop watching `fd` (an error, a descriptor not watched, is ignored).
    pub fn delete(&self, fd: RawFd, token: u64) {
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, 0, token);
    }

    /// Wait at most `timeout_ms` (-1: for ever) for events: how many
    /// descriptors are ready (at most `EVENTS_MAX`; each is `event(i)`).
    pub fn wait(&mut self, timeout_ms: libc::c_int) -> usize {
        // SAFETY: events has room for EVENTS_MAX entries.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), self.events.as_mut_ptr(), EVENTS_MAX as libc::c_int, timeout_ms) };
        n.max(0) as usize
    }

    /// The `i`th ready descriptor of the last `wait`: its token and events.
    pub fn event(&self, i: usize) -> (u64, u32) {
        let ev = self.events[i];
        (ev.u64, ev.events)
    }
}
