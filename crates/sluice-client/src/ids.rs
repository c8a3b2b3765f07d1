//! The calling thread's credentials as the server sees a Unix peer's:
//! read once when a connection is made, and checked again cheaply before
//! later calls (`ThreadIds::still`), so that a program that changes its
//! identity by any means is served as its new self (the interposer
//! reconnects when the check fails).

/// Groups read on the stack when the credentials are checked; a process
/// in more is read on the heap.
const GROUPS_ON_STACK: usize = 256;

/// A thread's effective uid and gid and its groups: what the server takes
/// as a Unix peer's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadIds {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
}

impl ThreadIds {
    /// The calling thread's.
    pub fn now() -> ThreadIds {
        // SAFETY: getgroups(0, NULL) only counts.
        let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) }.max(0) as usize;
        let mut groups = vec![0; n];
        // SAFETY: `groups` has room for n entries.
        let got = unsafe { libc::getgroups(n as libc::c_int, groups.as_mut_ptr()) };
        groups.truncate(got.max(0) as usize);
        // SAFETY: geteuid and getegid have no preconditions.
        ThreadIds { uid: unsafe { libc::geteuid() }, gid: unsafe { libc::getegid() }, groups }
    }

    /// Whether the calling thread's ids are still these: three system
    /// calls and no allocation (for up to `GROUPS_ON_STACK` groups). They
    /// answer for the thread, so a change made with raw `setresuid`,
    /// `setresgid` or `setgroups` system calls, which libc's wrappers
    /// (which the interposer wraps) never see, is seen here.
    pub fn still(&self) -> bool {
        // SAFETY: geteuid and getegid have no preconditions.
        if unsafe { libc::geteuid() } != self.uid || unsafe { libc::getegid() } != self.gid {
            return false;
        }
        let mut buf = [0 as libc::gid_t; GROUPS_ON_STACK];
        // SAFETY: `buf` has room for GROUPS_ON_STACK entries.
        match unsafe { libc::getgroups(GROUPS_ON_STACK as libc::c_int, buf.as_mut_ptr()) } {
            n if n >= 0 => buf[..n as usize] == self.groups[..],
            _ => ThreadIds::now().groups == self.groups,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ids_read_now_are_still_the_thread_s() {
        let ids = ThreadIds::now();
        assert!(ids.still());
        let other = ThreadIds { uid: ids.uid.wrapping_add(1), ..ids.clone() };
        assert!(!other.still(), "another uid");
        let fewer = ThreadIds { groups: ids.groups.iter().copied().chain([u32::MAX - 7]).collect(), ..ids };
        assert!(!fewer.still(), "another group list");
    }
}
