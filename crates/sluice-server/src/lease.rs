//! Cache leases: a read whose range is already in the page cache needs no
//! device, so there is nothing to schedule, and going through the server
//! would only add a copy (file → shared region → caller's buffer) and a
//! round trip. For such a read (`ReadLease`, sent by a client on this
//! host) the server answers `Lease`: "read `[offset, offset + len)`
//! yourself, from this descriptor, within `valid_us`". The range may
//! reach `lease_bytes_max` past the request when that much is cached, so
//! a sequential reader asks once per lease, not once per read (and, from
//! the middle of each lease on, for the next one ahead: the client's
//! `lease_ahead`, since the check costs about 8 µs per MiB here).
//!
//! What a lease may and may not do:
//! - The descriptor lent is a duplicate of the one the server opened for
//!   the caller's own `open`, as the caller, beneath the root: only a
//!   read-only handle of a regular file is ever lent, so the caller can do
//!   with it nothing it could not do with its own `open(2)` of that file.
//! - The page cache is coherent across descriptors, so a lease never
//!   returns stale data: a write completed through the server is seen by a
//!   later leased read, like any two `pread`s of one file.
//! - A page evicted between the check and the client's read is read from
//!   the device without the scheduler: `valid_us` keeps that window short.
//!   (The FUSE mount, by default, hands the kernel this descriptor for a
//!   whole open of a file all cached at open time; its window is the open:
//!   docs/fuse.md.)
//! - O_DIRECT servers (`--direct`) never lease: their reads do not go
//!   through the page cache. Nor does a server on an emulated device
//!   (`--device hdd7200`), whose cost must be paid by every read.
//!
//! Write leases (`WriteLease`, granted unless the server was started with
//! `--no-write-leases`) are the same for a writable handle: "write to this
//! file yourself", over the whole file, for `write_lease_valid_us` (1 s).
//! They need no check: on a server writing through the page cache a
//! buffered write only copies into it, and what the device pays comes
//! with the kernel's write-back (`EventLoop::lease`). The client asks for
//! one without the write's data (`LEASE_ONLY_AT`), so a granted lease
//! costs it no copy into the shared region.
//!
//! A `ReadLease` of at least `SHORT_BYTES_MIN` whose range is not cached
//! is scheduled as a read that, once its dispatch has brought the range
//! into the page cache without copying it (`exec::populate`), is answered
//! with a lease too (`pending::LeaseAfter`): the device's work is still
//! the scheduler's, and the client copies the data once.
//!
//! The check is `cachestat(2)` (Linux 6.5): one system call, no copy.
//! Where the kernel lacks it, no lease is granted and reads take the
//! scheduled path.

use std::os::fd::RawFd;

use sluice_net::cache::all_cached;

/// The lease for a read of `len` bytes at `offset` of `fd`: `(bytes from
/// `offset` the client may read itself, bytes of them inside the file)`.
/// The first is at least the request and reaches as far past it, up to
/// `ahead_max`, as the pages are cached (in steps: below); when everything
/// cached reaches the end of the file it covers the whole span, so a read that crosses the end is read (short)
/// by the client as well: the file's size is the kernel's to apply.
/// `None`: read it through the scheduler (not all cached, at or past end
/// of file, or the kernel cannot tell).
pub(crate) fn grant(fd: RawFd, offset: u64, len: u64, ahead_max: u64) -> Option<(u64, u64)> {
    if len == 0 || ahead_max == 0 {
        return None;
    }
    let size = crate::root::fstat(fd).ok()?.size;
    if offset >= size {
        return None;
    }
    let end = offset.saturating_add(len).min(size);
    if !all_cached(fd, offset, end - offset)? {
        return None;
    }
    let span = offset.saturating_add(len.max(ahead_max)) - offset;
    let further = offset.saturating_add(span).min(size);
    // Past the request, the cached prefix of the span, in steps that grow
    // fourfold from `AHEAD_PROBE_BYTES`: `cachestat`'s cost grows with the
    // cached pages it counts (about 8 µs per MiB here), and behind a
    // strided or partly cached read the span is rarely all cached, so one
    // look at all of it (as before) cost a 4 KiB x 32 strided reader's
    // server 25 µs per read, for no lease. The steps cost at most twice
    // the prefix they find.
    let (mut reach, mut step) = (end, AHEAD_PROBE_BYTES);
    while reach < further {
        let to = reach.saturating_add(step).min(further);
        if all_cached(fd, reach, to - reach) != Some(true) {
            return Some((reach - offset, reach - offset));
        }
        (reach, step) = (to, step.saturating_mul(4));
    }
    Some((if further == size { span } else { further - offset }, further - offset))
}

/// What `grant` found cached lately, per file: the last lease granted on
/// it, from its request's offset. A read of another handle of the same
/// file inside that range, within `fresh` of the look, is granted the
/// rest of it without looking again. `cachestat` counts every page of the
/// span it looks at (about 8 µs per MiB here), and the processes of a
/// strided application ask for leases over the same stretch of the file
/// one after another: 128 of them reading every 128th 4 KiB page had the
/// loop count about 21 MiB of pages per lease, a fifth of its time. Pages
/// may leave the cache after the look, as they may during any lease (a
/// local read of one then goes to the device, unscheduled, and is still
/// right); `fresh` is half a lease's validity. At most `max` files; a full
/// table drops its stale entries, then everything.
pub(crate) struct Verified {
    files: std::collections::HashMap<sluice_core::FileId, Extent>,
    max: usize,
}

#[derive(Clone, Copy, Debug)]
struct Extent {
    start: u64,
    granted_end: u64,
    in_file_end: u64,
    at: std::time::Instant,
}

/// Files `Verified` remembers a range of.
pub(crate) const VERIFIED_FILES_MAX: usize = 1_024;

impl Verified {
    pub fn new(max: usize) -> Verified {
        Verified { files: std::collections::HashMap::new(), max }
    }

    /// `grant`'s answer for a read of `len` bytes at `offset` of `file`,
    /// from a look taken less than `fresh` ago, if one covers the read.
    /// As `grant`, a look that reached the end of the file grants the
    /// whole span (`len.max(ahead_max)`).
    pub fn lookup(&self, file: sluice_core::FileId, offset: u64, len: u64, ahead_max: u64, now: std::time::Instant, fresh: std::time::Duration) -> Option<(u64, u64)> {
        let e = self.files.get(&file)?;
        let covered = e.start <= offset && offset < e.in_file_end && offset.saturating_add(len) <= e.granted_end;
        if !covered || now.saturating_duration_since(e.at) > fresh {
            return None;
        }
        let granted = if e.granted_end > e.in_file_end { len.max(ahead_max) } else { e.granted_end - offset };
        Some((granted, e.in_file_end - offset))
    }

    /// `grant` answered `(granted, in_file)` for a read at `offset`.
    pub fn record(&mut self, file: sluice_core::FileId, offset: u64, (granted, in_file): (u64, u64), now: std::time::Instant, fresh: std::time::Duration) {
        if !self.files.contains_key(&file) && self.files.len() >= self.max {
            self.files.retain(|_, e| now.saturating_duration_since(e.at) <= fresh);
            if self.files.len() >= self.max {
                self.files.clear();
            }
        }
        let e = Extent { start: offset, granted_end: offset.saturating_add(granted), in_file_end: offset.saturating_add(in_file), at: now };
        self.files.insert(file, e);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.files.len()
    }
}

/// The first step of `grant`'s look past the request.
const AHEAD_PROBE_BYTES: u64 = 256 << 10;

/// A lease that covers only its request is granted for requests of at
/// least this many bytes (the copy through the server it saves is then
/// worth the client's own `pread`); a smaller cached read that nothing
/// cached follows is read by the server, which costs the same one round
/// trip, except the handle's first lease, which lends the descriptor.
pub(crate) const SHORT_BYTES_MIN: u64 = 256 << 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verified_covers_reads_inside_a_fresh_look_and_holds_at_most_max_files() {
        use sluice_core::FileId;
        use std::time::{Duration, Instant};
        let (t0, fresh) = (Instant::now(), Duration::from_millis(5));
        let mut v = Verified::new(2);
        // A lease of 1 MiB from 4 KiB, all of it in the file.
        v.record(FileId(1), 4096, (1 << 20, 1 << 20), t0, fresh);
        assert_eq!(v.lookup(FileId(1), 8192, 4096, 1 << 30, t0, fresh), Some(((1 << 20) - 4096, (1 << 20) - 4096)));
        assert_eq!(v.lookup(FileId(1), 0, 4096, 1 << 30, t0, fresh), None, "before the look");
        assert_eq!(v.lookup(FileId(1), 1 << 20, 8192, 1 << 30, t0, fresh), None, "past its end");
        assert_eq!(v.lookup(FileId(1), 8 << 20, 4096, 1 << 30, t0, fresh), None, "far past its end");
        assert_eq!(v.lookup(FileId(2), 8192, 4096, 1 << 30, t0, fresh), None, "another file");
        assert_eq!(v.lookup(FileId(1), 8192, 4096, 1 << 30, t0 + Duration::from_millis(6), fresh), None, "stale");
        // A look that reached the end of a 64 KiB file: the whole span.
        v.record(FileId(1), 0, (32 << 20, 64 << 10), t0, fresh);
        assert_eq!(v.lookup(FileId(1), 4096, 100, 32 << 20, t0, fresh), Some((32 << 20, (64 << 10) - 4096)));
        // N files fit; the N+1st, with all fresh, empties the table first.
        v.record(FileId(2), 0, (4096, 4096), t0, fresh);
        assert_eq!(v.len(), 2);
        v.record(FileId(3), 0, (4096, 4096), t0, fresh);
        assert_eq!(v.len(), 1);
        assert!(v.lookup(FileId(3), 0, 4096, 1 << 30, t0, fresh).is_some());
        // A stale entry makes room by itself.
        v.record(FileId(4), 0, (4096, 4096), t0 + Duration::from_millis(6), fresh);
        v.record(FileId(5), 0, (4096, 4096), t0 + Duration::from_millis(6), fresh);
        assert_eq!(v.len(), 2, "file 3's stale entry went, 4 and 5 stay");
    }
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_file_just_written_is_cached_and_leased_up_to_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![7u8; 3 << 20]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let fd = f.as_raw_fd();
        if all_cached(fd, 0, 4096).is_none() {
            eprintln!("no cachestat on this kernel: nothing to test");
            return;
        }
        // Within the file: the request, extended ahead to the bound.
        assert_eq!(grant(fd, 0, 4096, 1 << 20), Some((1 << 20, 1 << 20)));
        // Cached to the end of the file: the whole span, of which 8 KiB
        // are in the file.
        assert_eq!(grant(fd, (3 << 20) - 8192, 4096, 1 << 20), Some((1 << 20, 8192)));
        // A request larger than the bound gets the request.
        assert_eq!(grant(fd, 0, 2 << 20, 1 << 20), Some((2 << 20, 2 << 20)));
        // At or past the end: nothing to lease.
        assert_eq!(grant(fd, 3 << 20, 4096, 1 << 20), None);
        // Leases off.
        assert_eq!(grant(fd, 0, 4096, 0), None);
    }

    #[test]
    fn pages_dropped_from_the_cache_are_not_leased() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        let fd = f.as_raw_fd();
        if all_cached(fd, 0, 4096).is_none() {
            eprintln!("no cachestat on this kernel: nothing to test");
            return;
        }
        // SAFETY: plain advice on a descriptor we hold; clean pages go.
        assert_eq!(unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
        if all_cached(fd, 0, 1 << 20) == Some(true) {
            eprintln!("the file system keeps its pages (tmpfs?): nothing to test");
            return;
        }
        assert_eq!(grant(fd, 0, 4096, 1 << 20), None);
        // Read one page back, without read-ahead: that page is leased,
        // and nothing past it.
        // SAFETY: as above.
        assert_eq!(unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_RANDOM) }, 0);
        let mut b = [0u8; 4096];
        // SAFETY: b is valid for 4096 bytes.
        assert_eq!(unsafe { libc::pread(fd, b.as_mut_ptr().cast(), 4096, 0) }, 4096);
        assert_eq!(grant(fd, 0, 4096, 1 << 20), Some((4096, 4096)));
        assert_eq!(grant(fd, 0, 8192, 1 << 20), None);
    }
}
