//! Page-cache residency of an open file, by `cachestat(2)` (Linux 6.5):
//! one system call, no copy. The server's cache leases ask it for the
//! range a reader wants; the mount asks it for a whole file before handing
//! the kernel the file itself (FUSE passthrough). Where the kernel lacks
//! it, the answer is "cannot tell" and callers take the scheduled path.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};

/// `cachestat(2)`: the same number on every architecture (the generic
/// table and x86_64 agree from 451 on).
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Set once the kernel said it has no `cachestat`.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);

fn page_bytes() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// Whether every page of `[off, off + len)` (`len > 0`) is in the page
/// cache; `None` when the kernel cannot say.
pub fn all_cached(fd: RawFd, off: u64, len: u64) -> Option<bool> {
    if UNSUPPORTED.load(Ordering::Relaxed) {
        return None;
    }
    let page = page_bytes();
    let pages = (off + len).div_ceil(page) - off / page;
    let range = CachestatRange { off, len };
    let mut cs = Cachestat::default();
    // SAFETY: range and cs are valid for the call; the kernel writes only cs.
    let r = unsafe { libc::syscall(SYS_CACHESTAT, fd, &range as *const CachestatRange, &mut cs as *mut Cachestat, 0u32) };
    if r < 0 {
        if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            UNSUPPORTED.store(true, Ordering::Relaxed);
        }
        return None;
    }
    Some(cs.nr_cache >= pages)
}
