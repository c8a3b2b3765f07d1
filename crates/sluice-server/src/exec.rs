//! The executor: worker threads that carry out dispatches against the
//! backing files.
//!
//! One aggregated dispatch is one `preadv`/`pwritev` whose iovecs point
//! straight into the member requests' buffers (scatter for reads, gather
//! for writes); only a dispatch with more than `IOV_MAX` members, or with
//! read members that overlap each other, takes more than one call or a
//! temporary buffer. With `--direct` the transfer goes through an aligned
//! bounce buffer, and unaligned writes read-modify-write their edge
//! blocks. With `--device hdd7200` the worker holds the emulated disk for
//! the modelled service time, so dispatches are served one at a time as on
//! a single-head disk.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_core::{Dispatch, Op};

use crate::clock::Clock;
use crate::config::DIRECT_ALIGN_BYTES;
use crate::disk::Disk;
use crate::order::DirectOrder;
use crate::pending::{Buf, Pending};
use crate::storage::{Storage, IOV_MAX};
use crate::sync::lock;
use crate::waker::Waker;

/// A dispatch and its members, in the dispatch's member order.
pub struct Job {
    pub dispatch: Dispatch,
    pub items: Vec<Pending>,
    /// When a worker took it up (the server's clock; 0 before).
    pub started: u64,
    /// From `started` to the system call's return: what the cost learner
    /// sees.
    pub service_ns: u64,
    /// Every member is a read to be answered with a lease
    /// (`Pending::lease_after`): the dispatch only brings its range into
    /// the page cache (`populate`), where the executor can.
    pub populate: bool,
}

/// How the workers reach the backing store.
pub struct Executor {
    /// The calls that move the data (`Syscalls` unless a test injects).
    pub storage: Arc<dyn Storage>,
    pub direct: bool,
    /// The emulated disk, held for the whole service time of a dispatch.
    pub device: Option<Disk>,
    /// Orders `--direct` writes (`direct_write`, and the event loop's
    /// ring, which holds a share for each whole-block write it submits).
    pub direct_writes: Arc<DirectOrder>,
    /// `/dev/null`, open for writing, where the server populates the page
    /// cache for lease answers (`populate`): a real device through the
    /// page cache, with the real system calls. `None`: every read moves
    /// its data.
    pub null: Option<std::fs::File>,
}

impl Executor {
    /// Carry out `job`, storing each member's result in it.
    pub fn run(&self, job: &mut Job) {
        let d = &job.dispatch;
        let fd = job.items[0].file.fd.as_raw_fd();
        if let (true, Some(null)) = (job.populate, &self.null) {
            let (done, err) = populate(null.as_raw_fd(), fd, d.offset, d.len);
            settle(d, &mut job.items, done, err);
            mark_populated(&mut job.items);
            return;
        }
        // The modelled time starts when the emulated arm is ours: time spent
        // waiting for it must not count, or two dispatches would overlap.
        let guard = self.device.as_ref().map(Disk::hold);
        let started = Instant::now();
        let st = &*self.storage;
        let whole = |r: io::Result<u64>| match r {
            Ok(n) => (n, None),
            Err(e) => (0, Some(e.raw_os_error().unwrap_or(libc::EIO))),
        };
        let (done, err) = match (d.op, self.direct) {
            (Op::Read, false) => read_members(st, fd, d, &mut job.items),
            (Op::Write, false) => write_members(st, fd, d, &job.items),
            (Op::Read, true) => whole(direct_read(st, fd, d, &mut job.items)),
            (Op::Write, true) => whole(direct_write(st, fd, d, &mut job.items, &self.direct_writes)),
        };
        if let Some(mut disk) = guard {
            let ns = disk.service_ns(d.file.0, fd, d.offset, d.len);
            let left = Duration::from_nanos(ns).saturating_sub(started.elapsed());
            std::thread::sleep(left);
        }
        settle(d, &mut job.items, done, err);
    }
}

/// Record each member's outcome. `done` bytes from the dispatch's start
/// were moved; then `err` stopped it (none: the end of the file, for a
/// read). A member wholly inside `done` succeeded; one the error cut (or
/// never reached) gets the error, so a write is never acknowledged for a
/// byte that was not written; a read past the end of the file is short.
fn settle(d: &Dispatch, items: &mut [Pending], done: u64, err: Option<i32>) {
    let end = d.offset + done;
    for it in items.iter_mut() {
        let whole = it.req.end() <= end;
        it.result = match err {
            Some(e) if !whole => Err(e),
            _ => {
                let got = end.saturating_sub(it.req.offset).min(it.req.len);
                if let Buf::Read(b) = &mut it.buf {
                    b.truncate(got as usize);
                }
                Ok(got)
            }
        };
    }
}

/// Whether members tile the range exactly (no overlap), so their buffers
/// can be the iovecs.
fn tiles(d: &Dispatch) -> bool {
    let mut at = d.offset;
    for m in &d.members {
        if m.offset != at {
            return false;
        }
        at = m.end();
    }
    at == d.end()
}

fn read_members(st: &dyn Storage, fd: RawFd, d: &Dispatch, items: &mut [Pending]) -> (u64, Option<i32>) {
    if !tiles(d) {
        let mut tmp = vec![0u8; d.len as usize];
        let (done, err) = transfer_partial(st, fd, Op::Read, &mut [iov_mut(&mut tmp)], d.offset);
        for it in items.iter_mut() {
            let from = (it.req.offset - d.offset) as usize;
            let b = it.buf.read_buf();
            let n = b.len();
            b.copy_from_slice(&tmp[from..from + n]);
        }
        return (done, err);
    }
    let mut iov: Vec<libc::iovec> = items.iter_mut().map(|it| iov_mut(it.buf.read_buf())).collect();
    transfer_partial(st, fd, Op::Read, &mut iov, d.offset)
}

fn write_members(st: &dyn Storage, fd: RawFd, d: &Dispatch, items: &[Pending]) -> (u64, Option<i32>) {
    let mut iov: Vec<libc::iovec> = items.iter().map(|it| iov_const(it.buf.data())).collect();
    transfer_partial(st, fd, Op::Write, &mut iov, d.offset)
}

fn iov_mut(b: &mut [u8]) -> libc::iovec {
    libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }
}

fn iov_const(b: &[u8]) -> libc::iovec {
    // The kernel only reads through a write's iovecs.
    libc::iovec { iov_base: b.as_ptr() as *mut libc::c_void, iov_len: b.len() }
}

/// `preadv`/`pwritev` until every iovec is done, or (reads) end of file,
/// or an error: the bytes moved, and the error that stopped it. One call
/// when the dispatch has at most `IOV_MAX` members.
///
/// A read that returns less than it asked for and ends off a block
/// boundary met the end of the file, and the transfer ends there, as a
/// `pread` would. Asking again for the rest would be wrong with O_DIRECT:
/// the rest starts at the unaligned end of file, which the kernel refuses
/// (`EINVAL`) once another client grew the file. A short read that ends
/// on a boundary is asked again: it may be an I/O error met part way (the
/// kernel returns the bytes before the failed page or block, and the
/// error on the next call), which must not pass for the end of the file.
fn transfer_partial(st: &dyn Storage, fd: RawFd, op: Op, iov: &mut [libc::iovec], offset: u64) -> (u64, Option<i32>) {
    let (mut i, mut done) = (0usize, 0u64);
    while i < iov.len() {
        let n = iov.len().min(i + IOV_MAX);
        match st.transfer_once(fd, op, &iov[i..n], offset + done) {
            Err(libc::EINTR) => continue,
            Err(e) => return (done, Some(e)),
            Ok(0) if op == Op::Write => return (done, Some(libc::EIO)),
            Ok(0) => return (done, None),
            Ok(r) if op == Op::Read && !(offset + done + r as u64).is_multiple_of(DIRECT_ALIGN_BYTES as u64) && r < iov[i..n].iter().map(|v| v.iov_len).sum() => {
                return (done + r as u64, None)
            }
            Ok(r) => {
                done += r as u64;
                i = advance(iov, i, r);
            }
        }
    }
    (done, None)
}

/// `transfer_partial`, all or nothing (the O_DIRECT paths, whose bounce
/// buffers do not map bytes to members one to one).
fn transfer(st: &dyn Storage, fd: RawFd, op: Op, iov: &mut [libc::iovec], offset: u64) -> io::Result<u64> {
    match transfer_partial(st, fd, op, iov, offset) {
        (_, Some(e)) => Err(io::Error::from_raw_os_error(e)),
        (done, None) => Ok(done),
    }
}

/// Consume `n` bytes from `iov[i..]`; the index of the first unfinished one.
fn advance(iov: &mut [libc::iovec], mut i: usize, mut n: usize) -> usize {
    while i < iov.len() && n >= iov[i].iov_len {
        n -= iov[i].iov_len;
        i += 1;
    }
    if n > 0 {
        let v = &mut iov[i];
        // SAFETY: n < iov_len, so the pointer stays inside the buffer.
        v.iov_base = unsafe { v.iov_base.cast::<u8>().add(n).cast() };
        v.iov_len -= n;
    }
    i
}

/// A zeroed buffer aligned for O_DIRECT.
struct Aligned {
    ptr: *mut u8,
    layout: Layout,
}

impl Aligned {
    fn new(len: usize) -> io::Result<Aligned> {
        let layout = Layout::from_size_align(len.max(DIRECT_ALIGN_BYTES), DIRECT_ALIGN_BYTES).map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::from_raw_os_error(libc::ENOMEM));
        }
        Ok(Aligned { ptr, layout })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of layout.size() bytes we own.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `new`.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

fn align_down(x: u64) -> u64 {
    x / DIRECT_ALIGN_BYTES as u64 * DIRECT_ALIGN_BYTES as u64
}

fn align_up(x: u64) -> u64 {
    align_down(x + DIRECT_ALIGN_BYTES as u64 - 1)
}

/// Whether the members' own buffers can take an O_DIRECT transfer: they
/// tile the range, it starts on a block, and every buffer starts on a
/// block and is a whole number of blocks long (shared-memory slots of
/// aligned requests are). The device then transfers straight into or out
/// of them, without a bounce buffer.
fn direct_in_place(d: &Dispatch, items: &mut [Pending], op: Op) -> bool {
    let a = DIRECT_ALIGN_BYTES;
    tiles(d)
        && d.offset.is_multiple_of(a as u64)
        && items.len() <= IOV_MAX
        && items.iter_mut().all(|it| {
            let (ptr, len) = match op {
                Op::Read => {
                    let b = it.buf.read_buf();
                    (b.as_ptr() as usize, b.len())
                }
                Op::Write => {
                    let b = it.buf.data();
                    (b.as_ptr() as usize, b.len())
                }
            };
            len > 0 && ptr.is_multiple_of(a) && len.is_multiple_of(a)
        })
}

fn direct_read(st: &dyn Storage, fd: RawFd, d: &Dispatch, items: &mut [Pending]) -> io::Result<u64> {
    if direct_in_place(d, items, Op::Read) {
        let mut iov: Vec<libc::iovec> = items.iter_mut().map(|it| iov_mut(it.buf.read_buf())).collect();
        return transfer(st, fd, Op::Read, &mut iov, d.offset);
    }
    let (lo, hi) = (align_down(d.offset), align_up(d.end()));
    let mut bounce = Aligned::new((hi - lo) as usize)?;
    let got = transfer(st, fd, Op::Read, &mut [iov_mut(&mut bounce.bytes()[..(hi - lo) as usize])], lo)?;
    let b = bounce.bytes();
    for it in items.iter_mut() {
        let dst = it.buf.read_buf();
        let from = (it.req.offset - lo) as usize;
        let n = dst.len().min(b.len() - from);
        dst[..n].copy_from_slice(&b[from..from + n]);
    }
    Ok((lo + got).saturating_sub(d.offset).min(d.len))
}

fn file_size(fd: RawFd) -> io::Result<u64> {
    // SAFETY: an all-zero stat is valid, and fstat fills it.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    if unsafe { libc::fstat64(fd, &mut st) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_size as u64)
}

/// An O_DIRECT write: straight from the members' buffers when they are
/// aligned blocks, else through an aligned bounce buffer. A range of
/// whole blocks (both ends aligned) reads no edge back and fixes no size:
/// it holds `order` shared; any other holds it alone (`Executor`).
fn direct_write(st: &dyn Storage, fd: RawFd, d: &Dispatch, items: &mut [Pending], order: &DirectOrder) -> io::Result<u64> {
    let blocks = d.offset.is_multiple_of(DIRECT_ALIGN_BYTES as u64) && d.end().is_multiple_of(DIRECT_ALIGN_BYTES as u64);
    let (_shared, _alone) = if blocks { (Some(order.shared()), None) } else { (None, Some(order.alone())) };
    if direct_in_place(d, items, Op::Write) {
        // Whole blocks: no edge to read back, no size to fix up.
        let mut iov: Vec<libc::iovec> = items.iter().map(|it| iov_const(it.buf.data())).collect();
        transfer(st, fd, Op::Write, &mut iov, d.offset)?;
        return Ok(d.len);
    }
    let (lo, hi) = (align_down(d.offset), align_up(d.end()));
    let size_before = file_size(fd)?;
    let mut bounce = Aligned::new((hi - lo) as usize)?;
    let blk = DIRECT_ALIGN_BYTES as u64;
    let b = &mut bounce.bytes()[..(hi - lo) as usize];
    if d.offset != lo {
        transfer(st, fd, Op::Read, &mut [iov_mut(&mut b[..blk as usize])], lo)?;
    }
    if d.end() != hi && (hi - blk >= lo + blk || d.offset == lo) {
        let at = (hi - blk - lo) as usize;
        transfer(st, fd, Op::Read, &mut [iov_mut(&mut b[at..])], hi - blk)?;
    }
    for it in items {
        let from = (it.req.offset - lo) as usize;
        let data = it.buf.data();
        b[from..from + data.len()].copy_from_slice(data);
    }
    transfer(st, fd, Op::Write, &mut [iov_mut(b)], lo)?;
    let size_after = size_before.max(d.end());
    if hi > size_after {
        // SAFETY: plain system call on a descriptor we hold.
        if unsafe { libc::ftruncate64(fd, size_after as libc::off64_t) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(d.len)
}

/// Run jobs from `jobs` until the channel closes, handing each back to the
/// event loop (`done`, then a wake-up through `waker`).
pub fn worker(exec: Arc<Executor>, jobs: Arc<Mutex<Receiver<Job>>>, clock: Clock, done: Sender<Job>, waker: Arc<Waker>) {
    if exec.device.is_some() {
        exact_sleeps();
    }
    loop {
        let next = lock(&jobs).recv();
        let Ok(mut job) = next else { return };
        job.started = clock.now();
        exec.run(&mut job);
        job.service_ns = clock.now().saturating_sub(job.started);
        if done.send(job).is_err() {
            return;
        }
        waker.wake();
    }
}

/// Let this thread's sleeps end when asked: the kernel's default timer
/// slack (50 µs) made every emulated access about 68 µs longer than its
/// modelled time on the 2-core VM (25 µs with a slack of 1 ns, the wake-up
/// itself), 20% of a 32 KiB read's 330 µs.
fn exact_sleeps() {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and changes
    // only this thread's timer slack; a failure leaves the default.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
}

/// The iovecs of a job one vectored call moves whole, straight between
/// the members' buffers and the file (`try_nowait` on the loop, and the
/// asynchronous `readv`/`writev` of `ring.rs`), or `None` when it needs an
/// executor worker: more than `IOV_MAX` members, members that do not tile
/// the range (overlapping reads share a temporary buffer), or, under
/// O_DIRECT, anything but a transfer straight between block-aligned slots
/// and whole blocks of the file (a bounce buffer, or a write that may
/// read-modify-write its edge blocks). An O_DIRECT write returned here
/// still needs a share of `Executor::direct_writes` before it starts.
pub fn whole_iovecs(job: &mut Job, direct: bool) -> Option<Vec<libc::iovec>> {
    let d = &job.dispatch;
    if d.members.len() > IOV_MAX || !tiles(d) {
        return None;
    }
    if direct && !direct_in_place(d, &mut job.items, d.op) {
        return None;
    }
    Some(match d.op {
        Op::Read => job.items.iter_mut().map(|it| iov_mut(it.buf.read_buf())).collect(),
        Op::Write => job.items.iter().map(|it| iov_const(it.buf.data())).collect(),
    })
}

/// Bring `len` bytes of `fd` from `offset` into the page cache without
/// copying them anywhere: `sendfile` to `/dev/null` (`null`), which reads
/// the pages as a `pread` would (waiting for the device) and hands them to
/// a sink that drops them. About 30 µs per cached MiB here, against about
/// 50 for a `preadv` into a warm buffer, and no page of a client's region
/// touched. `(bytes brought in, error)`: short at the end of the file.
pub fn populate(null: RawFd, fd: RawFd, offset: u64, len: u64) -> (u64, Option<i32>) {
    let mut done = 0u64;
    while done < len {
        let mut off = (offset + done) as libc::off64_t;
        // SAFETY: plain system call on two descriptors the caller holds;
        // `off` is a live local.
        let r = unsafe { libc::sendfile64(null, fd, &mut off, (len - done).min(1 << 30) as usize) };
        match r {
            0 => break,
            n if n > 0 => done += n as u64,
            _ => match io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) {
                libc::EINTR => {}
                e => return (done, Some(e)),
            },
        }
    }
    (done, None)
}

/// A populating job whose range is all in the page cache already (what
/// a lease is granted on, `lease::grant`, looking no further): settled
/// here (`true`), else left for a worker (`false`, nothing changed; a
/// range at or past the end of the file too, whose `populate` is empty).
pub fn populated_already(job: &mut Job) -> bool {
    let d = &job.dispatch;
    let Some((_, in_file)) = crate::lease::grant(job.items[0].file.fd.as_raw_fd(), d.offset, d.len, d.len) else { return false };
    settle(d, &mut job.items, in_file, None);
    mark_populated(&mut job.items);
    true
}

/// Members that succeeded are answered with their lease.
fn mark_populated(items: &mut [Pending]) {
    for it in items.iter_mut() {
        it.populated = it.result.is_ok();
    }
}

/// Settle a job on the null device (`DeviceKind::Null`), touching no
/// file: every member moved its whole length; a read into the shared
/// region finds zeros there (a read into its own buffer has them already).
pub fn settle_null(job: &mut Job) {
    for it in job.items.iter_mut() {
        if let Buf::Shm(_, _, _, false) = it.buf {
            it.buf.read_buf().fill(0);
        }
    }
    settle_whole(job);
}

/// Settle a job whose whole range was moved by one call (`ring.rs`).
pub fn settle_whole(job: &mut Job) {
    let len = job.dispatch.len;
    settle(&job.dispatch, &mut job.items, len, None);
}

/// Carry out a page-cache job on the calling thread if it can be done
/// without blocking: one `preadv2`/`pwritev2` with `RWF_NOWAIT`, which the
/// kernel refuses (`EAGAIN`) when the data is not in the page cache or the
/// write would wait. `true`: done, results stored; `false`: nothing
/// observable happened (a partial transfer is repeated whole by the
/// executor: the same bytes, to the same place), hand it to a worker.
pub fn try_nowait(job: &mut Job) -> bool {
    let Some(iov) = whole_iovecs(job, false) else { return false };
    let d = &job.dispatch;
    let fd = job.items[0].file.fd.as_raw_fd();
    // SAFETY: every iovec points into a live buffer of this job; the
    // kernel only reads a write's iovecs.
    let r = unsafe {
        match d.op {
            Op::Read => libc::preadv2(fd, iov.as_ptr(), iov.len() as libc::c_int, d.offset as libc::off64_t, libc::RWF_NOWAIT),
            Op::Write => libc::pwritev2(fd, iov.as_ptr(), iov.len() as libc::c_int, d.offset as libc::off64_t, libc::RWF_NOWAIT),
        }
    };
    // A short read may be the end of the file or a page not cached: only
    // a whole transfer is taken as done.
    if r < 0 || r as u64 != d.len {
        return false;
    }
    settle(d, &mut job.items, d.len, None);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn populate_brings_a_range_in_short_at_the_end_of_the_file_and_reports_errors() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::File::create(&path).unwrap().write_all(&vec![3u8; 3 << 20]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null").unwrap();
        assert_eq!(populate(null.as_raw_fd(), f.as_raw_fd(), 0, 1 << 20), (1 << 20, None));
        assert_eq!(populate(null.as_raw_fd(), f.as_raw_fd(), 2 << 20, 2 << 20), (1 << 20, None), "short at the end of the file");
        assert_eq!(populate(null.as_raw_fd(), f.as_raw_fd(), 4 << 20, 4096), (0, None), "past the end: nothing");
        if sluice_net::cache::all_cached(f.as_raw_fd(), 0, 4096).is_some() {
            assert_eq!(sluice_net::cache::all_cached(f.as_raw_fd(), 0, 3 << 20), Some(true), "in the page cache");
        }
        // A descriptor not open for reading: the error, nothing counted.
        let w = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let (n, err) = populate(null.as_raw_fd(), w.as_raw_fd(), 0, 4096);
        assert_eq!((n, err), (0, Some(libc::EBADF)));
    }

    #[test]
    fn an_emulating_worker_asks_for_exact_sleeps() {
        let slack = || {
            // SAFETY: PR_GET_TIMERSLACK reads this thread's slack.
            unsafe { libc::prctl(libc::PR_GET_TIMERSLACK) }
        };
        // The slack a thread inherits (50 us unless its parent changed
        // it), then 1 ns.
        let (before, after) = std::thread::spawn(move || {
            let before = slack();
            exact_sleeps();
            (before, slack())
        })
        .join()
        .unwrap();
        assert!(before >= 1, "{before}");
        assert_eq!(after, 1);
    }
}
