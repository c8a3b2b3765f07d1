//! Shared-memory data regions (the same-host data path).
//!
//! A client on the same host asks for a region (`ShmAttach`); the server
//! creates a memfd of the size granted, maps it, and sends the descriptor
//! back with the answer (`SCM_RIGHTS`). From then on `ReadShm` lands a
//! read's data in the region straight from `preadv`, and `WriteShm` takes
//! a write's data from it, so the socket carries only small descriptors.
//! The region belongs to one connection; nobody else sees it. A client
//! that scribbles over a region while a request uses it only spoils its
//! own data.
//!
//! A request may name a post record (`post`, protocol 7): its `Count` is
//! then written into the record at the region's end and the client woken
//! on it (a futex), instead of a reply frame: no socket buffer, no
//! `sendmsg`, and the client sleeps in one `futex` call instead of `poll`
//! and `recvmsg` (`post`).
//!
//! A client may also leave such a request in its post record and ring
//! the region's doorbell (a rung request, protocol 8): the event loop
//! looks at the doorbells of the connections it watches on every turn,
//! so the request costs no `sendmsg` and no `recvmsg` while the server is
//! awake (`doorbell`, `rung_request`; `sluice_proto::post`).
//!
//! Bounds: `shm_bytes_max` per region (a larger request is granted that
//! much) and `shm_total_bytes_max` over all regions: a region takes at
//! most `1 / shm_taper_shares` of what is left, in whole slots, at least
//! `SHM_REGION_MIN` (`taper`), and once less than that is left `ShmAttach`
//! is refused with ENOMEM and the client keeps the socket path.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use sluice_proto::SHM_SLOT_BYTES;

/// The smallest region granted while the budget fills: one slot and the
/// post area, enough for a client with one request at a time to keep
/// every same-host path (slots, posted answers, rung requests, and the
/// doorbell that counts its leased writes). Tapered grants are whole
/// slots and the post area, so none of a region is left over.
pub const SHM_REGION_MIN: u64 = SHM_SLOT_BYTES + sluice_proto::POST_AREA_BYTES;

/// What to grant a client asking for `want` bytes (already at most
/// `shm_bytes_max`) when `left` bytes of the budget are left: `want`, or
/// no more than `left / shares` rounded down to whole slots plus the post
/// area, and not less than `SHM_REGION_MIN` (or `want`, if that is
/// smaller). `None` when even that does not fit in `left`.
pub fn taper(want: u64, left: u64, shares: u32) -> Option<u64> {
    let share = left / u64::from(shares.max(1));
    let slots = share.saturating_sub(sluice_proto::POST_AREA_BYTES) / SHM_SLOT_BYTES;
    let shaped = (slots * SHM_SLOT_BYTES + sluice_proto::POST_AREA_BYTES).max(SHM_REGION_MIN);
    let grant = if share >= want { want } else { shaped.min(want) };
    (grant <= left).then_some(grant)
}

/// One mapped region.
pub struct Shm {
    ptr: *mut u8,
    len: usize,
    /// Bytes of all regions together, this one's given back on drop.
    total: Arc<AtomicU64>,
}

// SAFETY: the mapping is plain shared memory, valid until `Drop`; every
// access goes through `bytes`/`bytes_mut` over ranges checked at
// admission, and requests using a region hold an `Arc` to it.
unsafe impl Send for Shm {}
// SAFETY: as above; concurrent requests use disjoint ranges by the
// client's allocation, and overlapping ones only race on the client's own
// data, as two concurrent `pread`s into one buffer would.
unsafe impl Sync for Shm {}

impl Shm {
    /// A region of `len` bytes, counted in `total` (which must have room:
    /// the caller checked); the region and the descriptor to send.
    pub fn create(len: usize, total: &Arc<AtomicU64>) -> io::Result<(Shm, OwnedFd)> {
        // SAFETY: a NUL-terminated name; the descriptor is owned from here on.
        let fd = unsafe { libc::memfd_create(c"sluice-shm".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain system calls on the descriptor we own.
        if unsafe { libc::ftruncate64(fd.as_raw_fd(), len as libc::off64_t) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // Sealed at this size before the client sees it: a client that
        // shrank it would make the server's own copies fault (SIGBUS).
        // SAFETY: plain fcntl on the descriptor we own.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh shared mapping of the whole memfd.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        total.fetch_add(len as u64, Ordering::Relaxed);
        Ok((Shm { ptr: ptr.cast(), len, total: Arc::clone(total) }, fd))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes at `[at, at + len)`, which admission checked lie inside.
    pub fn bytes(&self, at: usize, len: usize) -> &[u8] {
        assert!(at + len <= self.len, "a checked range");
        // SAFETY: inside the live mapping (asserted).
        unsafe { std::slice::from_raw_parts(self.ptr.add(at), len) }
    }

    /// The bytes at `[at, at + len)` to fill, which admission checked lie inside.
    #[allow(clippy::mut_from_ref)]
    pub fn bytes_mut(&self, at: usize, len: usize) -> &mut [u8] {
        assert!(at + len <= self.len, "a checked range");
        // SAFETY: inside the live mapping (asserted); the range is this
        // request's (see the `Sync` note).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), len) }
    }
}

impl Shm {
    /// Whether the region has a post area (`POST_AREA_BYTES` at its end).
    pub fn posts(&self) -> bool {
        self.len as u64 >= sluice_proto::POST_AREA_BYTES
    }

    /// The bytes the client reports it wrote itself under write leases
    /// (the doorbell's `leased_bytes`; 0 without a post area).
    pub fn leased_bytes(&self) -> u64 {
        if !self.posts() {
            return 0;
        }
        self.doorbell().2.load(Ordering::Relaxed)
    }

    /// Answer in post record `k` (below `POSTS_MAX`, on a region with a
    /// post area): request `id` moved `count` bytes, or (`None`) its answer
    /// is on the socket. True when the client sleeps on the record: it
    /// wants a `wake`.
    #[must_use]
    pub fn post(&self, k: u32, id: u64, count: Option<u64>) -> bool {
        use sluice_proto::post::*;
        let (state, rid, n) = self.record(k);
        rid.store(id, Ordering::Relaxed);
        n.store(count.unwrap_or(0), Ordering::Relaxed);
        state.swap(if count.is_some() { POST_COUNTED } else { POST_ON_SOCKET }, Ordering::Release) == POST_SLEEPING
    }

    /// Wake the client asleep on post record `k` (after `post` said so).
    pub fn wake(&self, k: u32) {
        let (state, _, _) = self.record(k);
        // SAFETY: FUTEX_WAKE on a live, aligned word of shared memory (not
        // PRIVATE: the waiter is another process).
        unsafe { libc::syscall(libc::SYS_futex, state.as_ptr(), libc::FUTEX_WAKE, 1, std::ptr::null::<libc::timespec>(), std::ptr::null::<u32>(), 0) };
    }

    /// Post record `k`'s state, id and count words.
    fn record(&self, k: u32) -> (&AtomicU32, &AtomicU64, &AtomicU64) {
        use sluice_proto::post::{record_at, COUNT, ID, STATE};
        assert!(self.posts() && k < sluice_proto::POSTS_MAX, "a checked post record");
        let at = record_at(self.len, k);
        // SAFETY: the record lies inside the live mapping (asserted), is
        // 64-byte aligned (the mapping is page-aligned), and is only ever
        // accessed atomically, here and by the client.
        unsafe {
            let p = self.ptr.add(at);
            (AtomicU32::from_ptr(p.add(STATE).cast()), AtomicU64::from_ptr(p.add(ID).cast()), AtomicU64::from_ptr(p.add(COUNT).cast()))
        }
    }
}

/// A request left in a post record (`Shm::rung_request`), as the client
/// wrote it: checked like a frame's fields before use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rung {
    pub op: u32,
    pub id: u64,
    pub fd: u64,
    pub offset: u64,
    pub at: u64,
    pub len: u32,
}

impl Shm {
    /// The doorbell's `mask`, `watched` and `leased_bytes` words (a region
    /// with a post area).
    fn doorbell(&self) -> (&AtomicU64, &AtomicU32, &AtomicU64) {
        use sluice_proto::post::{doorbell_at, LEASED_BYTES, MASK, WATCHED};
        assert!(self.posts(), "a region with a post area");
        // SAFETY: the doorbell lies inside the live mapping (the area's
        // last record), is 64-byte aligned, and is only ever accessed
        // atomically, here and by the client.
        unsafe {
            let p = self.ptr.add(doorbell_at(self.len));
            (AtomicU64::from_ptr(p.add(MASK).cast()), AtomicU32::from_ptr(p.add(WATCHED).cast()), AtomicU64::from_ptr(p.add(LEASED_BYTES).cast()))
        }
    }

    /// Tell the client whether the loop looks at its doorbell on every
    /// turn (no `Nudge` needed). Sequentially consistent: see `rung`.
    pub fn set_watched(&self, on: bool) {
        self.doorbell().1.store(u32::from(on), Ordering::SeqCst);
    }

    /// Whether requests wait behind the doorbell. After `set_watched(false)`
    /// either this sees a client's bit or that client sees 0 and nudges
    /// (both sides sequentially consistent).
    pub fn rung(&self) -> bool {
        self.doorbell().0.load(Ordering::SeqCst) != 0
    }

    /// Take the doorbell's bits (one per post record holding a request).
    pub fn take_rung(&self) -> u64 {
        let mask = self.doorbell().0;
        if mask.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        mask.swap(0, Ordering::SeqCst)
    }

    /// Put back bits taken and not served (the connection paused).
    pub fn ring_again(&self, bits: u64) {
        self.doorbell().0.fetch_or(bits, Ordering::SeqCst);
    }

    /// The request in post record `k` (below `POSTS_MAX`), after its bit
    /// was taken: the client wrote it before ringing.
    pub fn rung_request(&self, k: u32) -> Rung {
        use sluice_proto::post::{record_at, AT, FD, ID, LEN, OFFSET, OP};
        assert!(self.posts() && k < sluice_proto::POSTS_MAX, "a checked post record");
        let at = record_at(self.len, k);
        // SAFETY: the record lies inside the live mapping (asserted), is
        // 64-byte aligned, and is only ever accessed atomically.
        unsafe {
            let p = self.ptr.add(at);
            let u32_at = |o: usize| AtomicU32::from_ptr(p.add(o).cast()).load(Ordering::Relaxed);
            let u64_at = |o: usize| AtomicU64::from_ptr(p.add(o).cast()).load(Ordering::Relaxed);
            Rung { op: u32_at(OP), id: u64_at(ID), fd: u64_at(FD), offset: u64_at(OFFSET), at: u64_at(AT), len: u32_at(LEN) }
        }
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `create`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
        self.total.fetch_sub(self.len as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REGION: u64 = (16 << 20) + sluice_proto::POST_AREA_BYTES;

    #[test]
    fn a_region_takes_a_share_of_what_is_left_in_whole_slots() {
        assert_eq!(taper(REGION, 4 * REGION, 2), Some(REGION), "the share holds the request");
        // Half of what is left is 8 MiB and 2 KiB: the post area and 7 slots.
        assert_eq!(taper(REGION, REGION, 2), Some((7 << 20) + sluice_proto::POST_AREA_BYTES), "half of what is left, whole slots");
        assert_eq!(taper(REGION, 3 << 20, 2), Some(SHM_REGION_MIN), "1.5 MiB: one slot");
        // The smallest region at N and N+1 bytes short.
        assert_eq!(taper(REGION, SHM_REGION_MIN, 2), Some(SHM_REGION_MIN));
        assert_eq!(taper(REGION, SHM_REGION_MIN - 1, 2), None);
        // A request below the smallest region is granted as asked.
        assert_eq!(taper(100, 100, 128), Some(100));
        assert_eq!(taper(100, 99, 128), None);
        // One share: as asked while it fits, then what is left.
        assert_eq!(taper(REGION, REGION, 1), Some(REGION));
        assert_eq!(taper(REGION, REGION - 1, 1), Some((15 << 20) + sluice_proto::POST_AREA_BYTES));
    }

    #[test]
    fn the_default_budget_gives_128_whole_regions_then_about_470_smaller() {
        let (mut left, mut whole, mut smaller) = (4u64 << 30, 0, 0);
        while let Some(g) = taper(REGION, left, 128) {
            assert!(g >= SHM_REGION_MIN && (g - sluice_proto::POST_AREA_BYTES).is_multiple_of(SHM_SLOT_BYTES), "{g}");
            if g == REGION {
                assert_eq!(smaller, 0, "whole regions come first");
                whole += 1;
            } else {
                smaller += 1;
            }
            left -= g;
        }
        assert_eq!(whole, 128);
        assert!((400..=550).contains(&smaller), "{smaller}");
        assert!(left < SHM_REGION_MIN);
    }
}
