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
//! The region's last `POST_AREA_BYTES` hold post records, one a slot
//! (`sluice_proto::post`): the server answers a slot's `Count` there and
//! wakes the client with a futex, instead of sending a frame. The client
//! sleeps in one `futex` call where it would `poll` and `recvmsg` (and the
//! server saves its `sendmsg`): `Conn::wait_posted`. `SLUICE_POST=0`
//! keeps the answers on the socket.
//!
//! A request in a slot may also be left in the slot's post record,
//! its bit set on the region's doorbell, instead of being sent (a rung
//! request, protocol 8): while the server's loop watches the doorbell it
//! takes the request on its next turn, and the client makes no system
//! call to send it. An unwatched doorbell (the loop asleep, or watching
//! its bound of others) gets a `Nudge` frame after the bit is set
//! (`Conn::ring`). `SLUICE_RING=0` sends every request on the socket.
//!
//! A slot is free again once its request was answered. A request whose
//! ticket is dropped unanswered keeps its slot for the session's life: the
//! server may still write into it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes the client asks for: sixteen 1 MiB slots and the post area.
pub const REGION_BYTES: u64 = (16 << 20) + sluice_proto::POST_AREA_BYTES;
/// Bytes of one slot.
pub const SLOT_BYTES: usize = sluice_proto::SHM_SLOT_BYTES as usize;
/// Writes smaller than this go through the socket (one system call with
/// the header; the region would save nothing) unless the region rings
/// its requests: a rung write makes no system call at all (on 4 KiB x 32
/// O_DIRECT writes, 0.445 s against 0.708 s through the socket).
pub const WRITE_MIN_BYTES: usize = 16 << 10;
/// Environment variable: `0` keeps every request on the socket.
pub const SHM_ENV: &str = "SLUICE_SHM";
/// Environment variable: `0` has the region's requests answered on the
/// socket, not in post records.
pub const POST_ENV: &str = "SLUICE_POST";
/// Abandoned calls answered on the socket that a region keeps for its
/// connection between two requests (one per slot, at most 64).
const ON_SOCKET_MAX: usize = 64;

/// Environment variable: `0` sends the region's requests on the socket
/// instead of ringing them (they need posts).
pub const RING_ENV: &str = "SLUICE_RING";

/// A mapped region and which of its slots are taken (one bit each; at
/// most 64 slots).
pub(crate) struct Region {
    ptr: *mut u8,
    len: usize,
    slots: u32,
    taken: AtomicU64,
    /// Taken slots whose caller gave up before the answer (`Slot::abandon`):
    /// the server's until their post record says answered.
    abandoned: AtomicU64,
    /// The request id each abandoned slot's caller gave up (by slot; the
    /// client's own record, not the server's).
    abandoned_ids: [AtomicU64; 64],
    /// Abandoned calls whose answer the server sent on the socket (an
    /// error, or a lease with its descriptor), found when their slots were
    /// reclaimed: the connection drops those replies
    /// (`Conn::give_up_outside`). At most `ON_SOCKET_MAX`.
    on_socket: std::sync::Mutex<Vec<u64>>,
    /// `on_socket` may hold ids: read without its lock on every request.
    on_socket_any: std::sync::atomic::AtomicBool,
    /// Answers come in post records (the last `POST_AREA_BYTES`).
    posts: bool,
    /// Requests are rung on the doorbell, not sent (needs `posts`).
    ring: bool,
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
    /// Map `len` bytes of the memfd the server sent; with `posts`, its
    /// end holds post records (when there is room for a slot besides),
    /// and with `ring` as well, requests are rung on its doorbell.
    pub fn map(fd: &OwnedFd, len: u64, posts: bool, ring: bool) -> io::Result<Region> {
        let len = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a fresh shared mapping of the descriptor's first len bytes.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let area = sluice_proto::POST_AREA_BYTES as usize;
        let posts = posts && len >= area + SLOT_BYTES;
        let data = if posts { len - area } else { len };
        // At most 64 slots (one bit each), so a slot's index names its
        // post record (`POSTS_MAX` of them).
        let slots = (data / SLOT_BYTES).min(64).min(sluice_proto::POSTS_MAX as usize) as u32;
        Ok(Region {
            ptr: ptr.cast(),
            len,
            slots,
            taken: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            abandoned_ids: std::array::from_fn(|_| AtomicU64::new(0)),
            on_socket: std::sync::Mutex::new(Vec::new()),
            on_socket_any: std::sync::atomic::AtomicBool::new(false),
            posts,
            ring: posts && ring,
        })
    }

    /// Whether requests in this region's slots are rung, not sent.
    pub fn rings(&self) -> bool {
        self.ring
    }

    /// The doorbell's `mask`, `watched` and `leased_bytes` words
    /// (`sluice_proto::post`).
    pub fn doorbell(&self) -> (&AtomicU64, &AtomicU32, &AtomicU64) {
        use sluice_proto::post::{doorbell_at, LEASED_BYTES, MASK, WATCHED};
        assert!(self.posts, "a region with post records");
        // SAFETY: the doorbell is the post area's last record, inside the
        // mapping, 64-byte aligned, and only ever accessed atomically
        // (here and by the server).
        unsafe {
            let p = self.ptr.add(doorbell_at(self.len));
            (AtomicU64::from_ptr(p.add(MASK).cast()), AtomicU32::from_ptr(p.add(WATCHED).cast()), AtomicU64::from_ptr(p.add(LEASED_BYTES).cast()))
        }
    }

    /// Report `n` more bytes written by this client itself under a write
    /// lease (the doorbell's `leased_bytes`, which the server adds to the
    /// application's bytes written). Nothing without a post area.
    pub fn add_leased(&self, n: u64) {
        if self.posts {
            self.doorbell().2.fetch_add(n, Ordering::Relaxed);
        }
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
                if !self.reclaim() {
                    return None;
                }
                cur = self.taken.load(Ordering::Acquire);
                continue;
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

    /// Free the abandoned slots whose post record says the server answered
    /// (in the record, or on the socket): it no longer touches them. Says
    /// whether one was freed. Only when every slot is taken, so a region
    /// loses no slot for good to callers that died.
    fn reclaim(&self) -> bool {
        use sluice_proto::post::{POST_COUNTED, POST_ON_SOCKET};
        let mut freed = false;
        let mut left = self.abandoned.load(Ordering::Acquire);
        while left != 0 {
            let index = left.trailing_zeros();
            left &= left - 1;
            // Claimed first, then looked at: a state read before the claim
            // could be an earlier request's, the slot since freed, taken
            // and abandoned again by another thread.
            let bit = 1u64 << index;
            if self.abandoned.fetch_and(!bit, Ordering::AcqRel) & bit == 0 {
                continue;
            }
            let state = self.post_of(index).map(|p| p.state.load(Ordering::Acquire));
            if matches!(state, Some(POST_COUNTED | POST_ON_SOCKET)) {
                if state == Some(POST_ON_SOCKET) {
                    self.answered_on_socket(self.abandoned_ids[index as usize].load(Ordering::Acquire));
                }
                self.release(index);
                freed = true;
            } else {
                self.abandoned.fetch_or(bit, Ordering::AcqRel);
            }
        }
        freed
    }

    /// An abandoned call `id` was answered on the socket. Past
    /// `ON_SOCKET_MAX` not kept: its reply then stays with the connection
    /// until the connection goes, as an unclaimed one would.
    fn answered_on_socket(&self, id: u64) {
        let mut ids = crate::lock(&self.on_socket);
        if ids.len() < ON_SOCKET_MAX {
            ids.push(id);
        }
        self.on_socket_any.store(true, Ordering::Release);
    }

    /// The abandoned calls answered on the socket since last asked, for
    /// the connection to drop their replies.
    pub fn take_answered_on_socket(&self) -> Vec<u64> {
        if !self.on_socket_any.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut ids = crate::lock(&self.on_socket);
        self.on_socket_any.store(false, Ordering::Release);
        std::mem::take(&mut *ids)
    }

    /// Slot `index`'s post record, if the region has them.
    fn post_of(&self, index: u32) -> Option<Post<'_>> {
        use sluice_proto::post::{record_at, COUNT, ID, STATE};
        if !self.posts {
            return None;
        }
        let at = record_at(self.len, index);
        // SAFETY: the record lies inside the mapping (`map` left the post
        // area past the slots, and `index` < `POSTS_MAX`), is 64-byte
        // aligned in a page-aligned mapping, lives as long as the region,
        // and is only accessed atomically (here and by the server).
        unsafe {
            let p = self.ptr.add(at);
            Some(Post { state: AtomicU32::from_ptr(p.add(STATE).cast()), id: AtomicU64::from_ptr(p.add(ID).cast()), count: AtomicU64::from_ptr(p.add(COUNT).cast()) })
        }
    }
}

/// A slot's post record: the futex word and the answer.
pub(crate) struct Post<'a> {
    pub state: &'a AtomicU32,
    pub id: &'a AtomicU64,
    pub count: &'a AtomicU64,
}

impl Slot {
    /// Ready the slot's post record for the answer of a request about to
    /// be sent: the `post` that request names (`NO_POST` without posts).
    pub fn arm(&self) -> u32 {
        match self.post() {
            Some(p) => {
                p.state.store(sluice_proto::post::POST_PENDING, Ordering::Release);
                self.index
            }
            None => sluice_proto::NO_POST,
        }
    }

    /// The slot's post record, if the region has them.
    pub fn post(&self) -> Option<Post<'_>> {
        self.region.post_of(self.index)
    }

    /// Whether this slot's requests are rung, not sent.
    pub fn rings(&self) -> bool {
        self.region.ring
    }

    /// Write a request into the slot's post record (armed: `POST_PENDING`),
    /// before its bit is set on the doorbell.
    pub fn write_rung(&self, op: u32, id: u64, fd: u64, offset: u64, len: u32) {
        use sluice_proto::post::{record_at, AT, FD, ID, LEN, OFFSET, OP};
        assert!(self.region.ring, "a region that rings");
        let at = record_at(self.region.len, self.index);
        // SAFETY: as in `post`: the record is inside the mapping, aligned,
        // this slot's, and only accessed atomically.
        unsafe {
            let p = self.region.ptr.add(at);
            AtomicU32::from_ptr(p.add(OP).cast()).store(op, Ordering::Relaxed);
            AtomicU64::from_ptr(p.add(ID).cast()).store(id, Ordering::Relaxed);
            AtomicU64::from_ptr(p.add(FD).cast()).store(fd, Ordering::Relaxed);
            AtomicU64::from_ptr(p.add(OFFSET).cast()).store(offset, Ordering::Relaxed);
            AtomicU64::from_ptr(p.add(AT).cast()).store(self.at(), Ordering::Relaxed);
            AtomicU32::from_ptr(p.add(LEN).cast()).store(len, Ordering::Relaxed);
        }
    }

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

    /// Its caller gave up before the answer (`crate::abandon`): the server
    /// may still write into it, so it stays taken until its post record
    /// says answered (`Region::reclaim`). Without post records it stays
    /// taken as long as the region.
    pub fn abandon(self, id: u64) {
        self.region.abandoned_ids[self.index as usize].store(id, Ordering::Release);
        self.region.abandoned.fetch_or(1 << self.index, Ordering::AcqRel);
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

#[cfg(test)]
pub(crate) mod tests {
    use std::os::fd::FromRawFd;

    use super::*;

    /// A region of `slots` slots and a post area, on a fresh memfd.
    pub(crate) fn region(slots: usize) -> Arc<Region> {
        let len = slots * SLOT_BYTES + sluice_proto::POST_AREA_BYTES as usize;
        // SAFETY: a new memfd we own, sized before it is mapped.
        let fd = unsafe {
            let raw = libc::memfd_create(c"sluice-shm-test".as_ptr(), libc::MFD_CLOEXEC);
            assert!(raw >= 0);
            assert_eq!(libc::ftruncate(raw, len as libc::off_t), 0);
            OwnedFd::from_raw_fd(raw)
        };
        Arc::new(Region::map(&fd, len as u64, true, false).unwrap())
    }

    /// A slot given up before its answer is the server's until the post
    /// record says answered; then the next `take` finds it free again.
    #[test]
    fn an_abandoned_slot_comes_back_once_answered_and_not_before() {
        use sluice_proto::post::{POST_COUNTED, POST_ON_SOCKET};
        let r = region(2);
        let (a, b) = (r.take(4096).unwrap(), r.take(4096).unwrap());
        assert!(r.take(4096).is_none(), "two slots, both taken");
        let ia = a.index;
        a.arm();
        a.abandon(41);
        assert!(r.take(4096).is_none(), "pending: the server may still write into it");
        r.post_of(ia).unwrap().state.store(POST_COUNTED, Ordering::Release);
        let c = r.take(4096).expect("answered: free again");
        assert_eq!(c.index, ia);
        // An answer that went to the socket frees it too.
        let ib = b.index;
        assert!(r.take_answered_on_socket().is_empty(), "answered in the record: nothing for the connection");
        b.arm();
        b.abandon(42);
        // The server's record says another id: the client's own counts.
        r.post_of(ib).unwrap().id.store(7, Ordering::Relaxed);
        r.post_of(ib).unwrap().state.store(POST_ON_SOCKET, Ordering::Release);
        assert_eq!(r.take(4096).map(|s| s.index), Some(ib));
        assert_eq!(r.abandoned.load(Ordering::Acquire), 0);
        assert_eq!(r.take_answered_on_socket(), vec![42], "the connection is told to drop that reply");
        assert!(r.take_answered_on_socket().is_empty(), "once");
        c.release();
    }

    /// The server's side of an answer on the socket: slot `index`'s
    /// post record says so.
    pub(crate) fn answered_on_the_socket(r: &Region, index: u32) {
        use sluice_proto::post::POST_ON_SOCKET;
        r.post_of(index).unwrap().state.store(POST_ON_SOCKET, Ordering::Release);
    }

    /// The ids kept for the connection are bounded: N kept, one more not.
    #[test]
    fn answered_on_socket_bound_at_n_and_n_plus_one() {
        let r = region(1);
        for id in 0..ON_SOCKET_MAX as u64 {
            r.answered_on_socket(id);
        }
        assert_eq!(r.take_answered_on_socket().len(), ON_SOCKET_MAX);
        for id in 0..=ON_SOCKET_MAX as u64 {
            r.answered_on_socket(id);
        }
        let kept = r.take_answered_on_socket();
        assert_eq!(kept.len(), ON_SOCKET_MAX, "N+1: the last not kept");
        assert_eq!(kept.last(), Some(&(ON_SOCKET_MAX as u64 - 1)));
    }
}
