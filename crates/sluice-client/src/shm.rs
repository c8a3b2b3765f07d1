//! The client's side of the shared-memory data path (same host only).
//!
//! Right after the handshake on a Unix socket the client asks for a region
//! (`ShmAttach`); the server answers with the bytes granted and the
//! region's memfd. The region is cut into `SLOT_BYTES` slots; a read or
//! write that fits one and finds one free travels through it (`ReadShm`,
//! `WriteShm`), so its data never crosses the socket: the server's `preadv`
//! fills the slot and the client copies it out once (a write: the client
//! copies in, the server's `pwritev` takes it from there). Anything else
//! keeps the socket path.
//!
//! A slot is free again once its request was answered. A request whose
//! ticket is dropped unanswered keeps its slot for the session's life: the
//! server may still write into it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes the client asks for: sixteen 1 MiB slots.
pub const REGION_BYTES: u64 = 16 << 20;
/// Bytes of one slot.
pub const SLOT_BYTES: usize = 1 << 20;
/// Writes smaller than this go through the socket (one system call with
/// the header; the region would save nothing).
pub const WRITE_MIN_BYTES: usize = 16 << 10;
/// Environment variable: `0` keeps every request on the socket.
pub const SHM_ENV: &str = "SLUICE_SHM";

/// A mapped region and which of its slots are taken (one bit each; at
/// most 64 slots).
pub(crate) struct Region {
    ptr: *mut u8,
    len: usize,
    slots: u32,
    taken: AtomicU64,
}

// SAFETY: the mapping lives until `Drop`; slots are handed out exclusively
// (an atomic bit each), and each is touched only by its holder and by the
// server for the holder's request.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

/// One taken slot.
pub(crate) struct Slot {
    pub region: Arc<Region>,
    pub index: u32,
}

impl Region {
    /// Map `len` bytes of the memfd the server sent.
    pub fn map(fd: &OwnedFd, len: u64) -> io::Result<Region> {
        let len = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a fresh shared mapping of the descriptor's first len bytes.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let slots = (len / SLOT_BYTES).min(64) as u32;
        Ok(Region { ptr: ptr.cast(), len, slots, taken: AtomicU64::new(0) })
    }

    /// A free slot for `len` bytes, if one fits and is free.
    pub fn take(self: &Arc<Region>, len: usize) -> Option<Slot> {
        if len > SLOT_BYTES || self.slots == 0 {
            return None;
        }
        let mut cur = self.taken.load(Ordering::Acquire);
        loop {
            let free = !cur & (u64::MAX >> (64 - self.slots));
            if free == 0 {
                return None;
            }
            let bit = free.trailing_zeros();
            match self.taken.compare_exchange_weak(cur, cur | 1 << bit, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(Slot { region: Arc::clone(self), index: bit }),
                Err(now) => cur = now,
            }
        }
    }

    fn release(&self, index: u32) {
        self.taken.fetch_and(!(1 << index), Ordering::AcqRel);
    }
}

impl Slot {
    /// Where the slot starts in the region.
    pub fn at(&self) -> u64 {
        u64::from(self.index) * SLOT_BYTES as u64
    }

    /// The slot's first `len` bytes (`len` ≤ `SLOT_BYTES`).
    fn bytes(&self, len: usize) -> *mut u8 {
        assert!(len <= SLOT_BYTES && self.at() as usize + len <= self.region.len, "inside the slot");
        // SAFETY: inside the mapping (asserted).
        unsafe { self.region.ptr.add(self.at() as usize) }
    }

    /// Copy a write's data in.
    pub fn fill(&self, data: &[u8]) {
        // SAFETY: the slot is ours and holds data.len() bytes (checked in
        // `bytes`); the server reads it only after the request is sent.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.bytes(data.len()), data.len()) };
    }

    /// The slot's first `len` bytes: a write's own data, which the server
    /// never read (it answered with a write lease).
    pub fn contents(&self, len: usize) -> &[u8] {
        // SAFETY: the slot is ours and holds len bytes (checked in
        // `bytes`); nobody writes it while we hold the slot.
        unsafe { std::slice::from_raw_parts(self.bytes(len), len) }
    }

    /// Copy a read's `n` bytes out, after its answer arrived.
    pub fn drain_into(&self, buf: &mut [u8], n: usize) {
        let n = n.min(buf.len());
        // SAFETY: the slot is ours, the server finished writing it (it
        // answered), and it holds n bytes (checked in `bytes`).
        unsafe { std::ptr::copy_nonoverlapping(self.bytes(n), buf.as_mut_ptr(), n) };
    }

    /// The request was answered: the slot is free.
    pub fn release(self) {
        self.region.release(self.index);
    }

    /// The request was never sent: the slot is free. (The `Slot` value
    /// itself is dropped with its ticket's failed construction.)
    pub fn release_unsent(&self) {
        self.region.release(self.index);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `map`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
