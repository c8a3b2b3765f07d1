//! Dispatches the event loop hands to the kernel itself, through io_uring,
//! instead of to an executor worker.
//!
//! A dispatch that blocks (O_DIRECT, or a page-cache miss) went to a
//! worker thread: the loop woke the worker, the worker called `preadv`,
//! then woke the loop through the eventfd. On this project's VMs each of
//! those two wake-ups costs 10-20 µs of CPU, as much as the device's own
//! 4 KiB read, and a request that is not aggregated pays them in full. With
//! the ring the loop queues the `readv`/`writev` and goes on; the kernel
//! signals the completion on the loop's own eventfd (registered with the
//! ring), and the loop reaps it on its next turn.
//!
//! Only what one call does whole goes here (`exec::whole_iovecs`). An
//! O_DIRECT write of whole blocks from aligned slots comes too, holding a
//! share of the executor's `DirectOrder` from its submission to its
//! completion (`try_share`, never waiting: while a worker's
//! read-modify-write runs alone or waits to, such a write goes to a
//! worker instead). A
//! completion that moved fewer bytes than asked (the end of a file), or
//! failed, is handed to a worker, which does it again from the start with
//! the executor's own loop and error rules: the same bytes to the same
//! place, so nothing the client sees differs. Bound: at most `entries`
//! submissions in flight (the server's queue depth, which also bounds the
//! scheduler's dispatches in flight); a full ring refuses and the job goes
//! to a worker.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{opcode, types, IoUring};
use sluice_core::Op;

use std::sync::Arc;

use crate::exec::{settle_whole, whole_iovecs, Job};
use crate::order::DirectOrder;

/// A submitted job and the iovecs the kernel reads until it completes.
struct InFlight {
    job: Job,
    /// Kept alive (and unmoved: a boxed slice) while the kernel holds it.
    _iov: Box<[libc::iovec]>,
    /// An O_DIRECT write holding a share of `Ring::order`.
    shares: bool,
}

pub(crate) struct Ring {
    ring: IoUring,
    /// Indexed by the submission's user data.
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    /// Pushed since the last `flush`.
    unsubmitted: u32,
    /// The executor's order of O_DIRECT writes; `None`: the files are not
    /// opened with O_DIRECT.
    order: Option<Arc<DirectOrder>>,
    /// A kernel thread polls the submission queue (SQPOLL).
    sqpoll: bool,
}

/// Give back the share of `order` a write took when it was pushed
/// (`shares`).
fn give_back(order: Option<&DirectOrder>, shares: bool) {
    if let (true, Some(o)) = (shares, order) {
        o.unshare();
    }
}

/// What a reaped completion asks of the loop.
pub(crate) enum Reaped {
    /// Moved whole; results stored.
    Done(Job),
    /// Short or failed: give it to a worker to do again.
    Redo(Job),
}

impl Ring {
    /// A ring for at most `entries` dispatches in flight whose completions
    /// are signalled on `eventfd`. Fails where the kernel has no io_uring
    /// (or forbids it): the loop then uses the workers alone. `order`:
    /// the executor's order of O_DIRECT writes when the files are opened
    /// with O_DIRECT (`None`: they are not).
    /// `sqpoll_idle_ms`: submit through a kernel polling thread that
    /// sleeps after that long without a submission
    /// (`ServerConfig::sqpoll_idle_ms`); where the kernel refuses it, the
    /// ring is made without one (`Ring::sqpoll`).
    pub fn new(entries: u32, eventfd: RawFd, order: Option<Arc<DirectOrder>>, sqpoll_idle_ms: Option<u32>) -> io::Result<Ring> {
        let entries = entries.max(1);
        let polled = sqpoll_idle_ms.and_then(|ms| IoUring::builder().setup_sqpoll(ms).build(entries.next_power_of_two()).ok());
        let sqpoll = polled.is_some();
        let ring = match polled {
            Some(r) => r,
            None => IoUring::new(entries.next_power_of_two())?,
        };
        ring.submitter().register_eventfd(eventfd)?;
        Ok(Ring { ring, slots: (0..entries).map(|_| None).collect(), free: (0..entries as usize).rev().collect(), unsubmitted: 0, order, sqpoll })
    }

    /// Whether a kernel thread polls the submission queue.
    pub fn sqpoll(&self) -> bool {
        self.sqpoll
    }

    /// Queue `job` (submitted at the next `flush`), or give it back when it
    /// needs a worker or the ring is full.
    pub fn push(&mut self, mut job: Job) -> Result<(), Job> {
        let Some(&slot) = self.free.last() else { return Err(job) };
        let Some(iov) = whole_iovecs(&mut job, self.order.is_some()) else { return Err(job) };
        let shares = self.order.is_some() && job.dispatch.op == Op::Write;
        if shares && !self.order.as_ref().is_some_and(|o| o.try_share()) {
            return Err(job);
        }
        let iov = iov.into_boxed_slice();
        let d = &job.dispatch;
        let fd = types::Fd(job.items[0].file.fd.as_raw_fd());
        let entry = match d.op {
            Op::Read => opcode::Readv::new(fd, iov.as_ptr(), iov.len() as u32).offset(d.offset).build(),
            Op::Write => opcode::Writev::new(fd, iov.as_ptr(), iov.len() as u32).offset(d.offset).build(),
        }
        .user_data(slot as u64);
        // SAFETY: the iovecs and the buffers they point into live in the
        // slot (the job owns the buffers) until the completion is reaped;
        // the descriptor is held open by the job's file handle.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            give_back(self.order.as_deref(), shares);
            return Err(job);
        }
        self.free.pop();
        self.slots[slot] = Some(InFlight { job, _iov: iov, shares });
        self.unsubmitted += 1;
        Ok(())
    }

    /// Hand every queued submission to the kernel (one system call). On
    /// an error they stay queued and the next `flush` tries again
    /// (`pending`).
    pub fn flush(&mut self) -> io::Result<()> {
        if self.unsubmitted == 0 {
            return Ok(());
        }
        loop {
            match self.ring.submit() {
                Ok(_) => {
                    self.unsubmitted = 0;
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether queued submissions wait for a `flush` that failed.
    pub fn pending(&self) -> bool {
        self.unsubmitted > 0
    }

    /// Submissions in flight.
    pub fn inflight(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether the kernel has posted a completion not yet reaped (a look
    /// at the shared queue, no system call).
    pub fn completed(&mut self) -> bool {
        !self.ring.completion().is_empty()
    }

    /// Every completion the kernel has posted. A write's share is given
    /// back here, before a short one goes to a worker (which takes its
    /// own).
    pub fn reap(&mut self, out: &mut Vec<Reaped>) {
        let Ring { ring, slots, free, order, .. } = self;
        for c in ring.completion() {
            let (slot, res) = (c.user_data() as usize, c.result());
            let Some(f) = slots.get_mut(slot).and_then(Option::take) else { continue };
            free.push(slot);
            give_back(order.as_deref(), f.shares);
            let mut job = f.job;
            if res >= 0 && res as u64 == job.dispatch.len {
                settle_whole(&mut job);
                out.push(Reaped::Done(job));
            } else {
                out.push(Reaped::Redo(job));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use sluice_core::{AppId, ClientId, Dispatch, DispatchId, FileId, Request, RequestId};

    use super::*;
    use crate::config::DIRECT_ALIGN_BYTES;
    use crate::pending::{Buf, Pending, Reply};
    use crate::state::{FileTable, OpenFile};

    fn eventfd() -> OwnedFd {
        use std::os::fd::FromRawFd;
        // SAFETY: plain system call; the descriptor is owned from here on.
        unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)) }
    }

    fn open(path: &std::path::Path) -> Arc<OpenFile> {
        registered(std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).unwrap())
    }

    /// `f`, read-write, in a table of its own.
    fn registered(f: std::fs::File) -> Arc<OpenFile> {
        let table = Arc::new(Mutex::new(FileTable::new(16)));
        let fd = OwnedFd::from(f);
        let st = crate::state::stat_of(&fd).unwrap();
        Arc::new(OpenFile::register(fd, &st, libc::O_RDWR, &table).unwrap())
    }

    /// A dispatch of `pieces` (offset, length) of `file`, each its own
    /// request: reads into fresh buffers, writes of `fill`.
    fn job(file: &Arc<OpenFile>, op: Op, pieces: &[(u64, u64)], fill: u8) -> Job {
        let members: Vec<Request> = pieces
            .iter()
            .enumerate()
            .map(|(i, &(offset, len))| Request { id: RequestId(i as u64), app: AppId(1), client: ClientId(i as u32), file: FileId(1), op, offset, len })
            .collect();
        let (lo, hi) = (pieces.iter().map(|p| p.0).min().unwrap(), pieces.iter().map(|p| p.0 + p.1).max().unwrap());
        let items = members
            .iter()
            .map(|&req| Pending {
                req,
                file: Arc::clone(file),
                buf: match op {
                    Op::Read => Buf::Read(vec![0; req.len as usize]),
                    Op::Write => Buf::Write(Arc::new(vec![fill; req.len as usize]), 0, req.len as usize),
                },
                arrival_ns: 0,
                reply: Reply::Single(0, 0, 0, None),
                result: Err(0),
                lease_after: None,
                populated: false,
            })
            .collect();
        let dispatch = Dispatch { id: DispatchId(0), file: FileId(1), op, offset: lo, len: hi - lo, members };
        Job { dispatch, items, started: 0, service_ns: 0, populate: false }
    }

    /// A scratch directory, an eventfd, a ring of `entries` and file `f`
    /// there holding `content`; `None` where the kernel has no io_uring
    /// (the loop then uses its workers: nothing to test).
    fn setup(entries: u32, content: &[u8]) -> Option<(tempfile::TempDir, OwnedFd, Ring, Arc<OpenFile>)> {
        let dir = tempfile::tempdir().unwrap();
        let efd = eventfd();
        let Ok(ring) = Ring::new(entries, efd.as_raw_fd(), None, None) else {
            eprintln!("no io_uring here: the loop uses its workers; nothing to test");
            return None;
        };
        std::fs::write(dir.path().join("f"), content).unwrap();
        let f = open(&dir.path().join("f"));
        Some((dir, efd, ring, f))
    }

    /// Reap until `n` completions came (or fail after 10 s).
    fn reap_n(ring: &mut Ring, n: usize) -> Vec<Reaped> {
        let (mut out, until) = (Vec::new(), Instant::now() + Duration::from_secs(10));
        while out.len() < n {
            assert!(Instant::now() < until, "completions did not come");
            ring.reap(&mut out);
            std::thread::sleep(Duration::from_millis(1));
        }
        out
    }

    #[test]
    fn a_write_and_a_read_move_whole_through_the_ring() {
        let Some((dir, efd, mut ring, f)) = setup(4, &[]) else { return };
        assert!(ring.push(job(&f, Op::Write, &[(0, 100), (100, 28)], 7)).is_ok());
        ring.flush().unwrap();
        let Reaped::Done(w) = reap_n(&mut ring, 1).pop().unwrap() else { panic!("a whole write is done") };
        assert_eq!(w.items.iter().map(|it| it.result).collect::<Vec<_>>(), [Ok(100), Ok(28)]);
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), vec![7u8; 128]);
        assert!(ring.push(job(&f, Op::Read, &[(0, 64), (64, 64)], 0)).is_ok());
        ring.flush().unwrap();
        let Reaped::Done(mut r) = reap_n(&mut ring, 1).pop().unwrap() else { panic!("a whole read is done") };
        for it in &mut r.items {
            assert_eq!((it.result, it.buf.read_buf().to_vec()), (Ok(64), vec![7u8; 64]));
        }
        let mut buf = [0u8; 8];
        // SAFETY: reading a counter from our own eventfd.
        let n = unsafe { libc::read(efd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        assert_eq!(n, 8, "completions are signalled on the registered eventfd");
    }

    #[test]
    fn a_short_read_goes_back_untouched_for_a_worker_to_redo() {
        let Some((_dir, _efd, mut ring, f)) = setup(4, &[1u8; 10]) else { return };
        assert!(ring.push(job(&f, Op::Read, &[(0, 8), (8, 8)], 0)).is_ok());
        ring.flush().unwrap();
        let Reaped::Redo(j) = reap_n(&mut ring, 1).pop().unwrap() else { panic!("10 of 16 bytes is short") };
        assert!(j.items.iter().all(|it| it.result == Err(0)), "nothing settled: the worker answers");
    }

    #[test]
    fn the_ring_holds_at_most_its_entries_in_flight() {
        let Some((_dir, _efd, mut ring, f)) = setup(2, &[1u8; 4096]) else { return };
        for k in 0..2 {
            assert!(ring.push(job(&f, Op::Read, &[(k * 512, 512)], 0)).is_ok(), "entry {} of 2", k + 1);
        }
        assert!(ring.push(job(&f, Op::Read, &[(1024, 512)], 0)).is_err(), "a third is refused: it goes to a worker");
        assert_eq!(ring.inflight(), 2);
        ring.flush().unwrap();
        assert!(!ring.pending());
        assert!(reap_n(&mut ring, 2).iter().all(|r| matches!(r, Reaped::Done(_))));
        assert_eq!(ring.inflight(), 0);
        assert!(ring.push(job(&f, Op::Read, &[(1024, 512)], 0)).is_ok(), "room again once reaped");
        ring.flush().unwrap();
        reap_n(&mut ring, 1);
    }

    #[test]
    fn what_one_call_cannot_do_whole_is_refused() {
        let Some((_dir, efd, mut ring, f)) = setup(4, &[]) else { return };
        assert!(ring.push(job(&f, Op::Read, &[(0, 100), (50, 100)], 0)).is_err(), "overlapping reads share a temporary buffer");
        assert!(ring.push(job(&f, Op::Read, &[(0, 100), (200, 100)], 0)).is_err(), "a gap is not one transfer");
        let order = Arc::new(DirectOrder::default());
        let Ok(mut direct) = Ring::new(4, efd.as_raw_fd(), Some(Arc::clone(&order)), None) else { return };
        assert!(direct.push(unaligned_write(&f, &[(0, 4096)], 1)).is_err(), "an unaligned buffer needs a bounce buffer");
        assert!(direct.push(aligned_write(&f, &[(0, 4096), (4096, 2048)], 1)).is_err(), "a part block reads back its edge");
        assert!(direct.push(job(&f, Op::Read, &[(0, 100)], 0)).is_err(), "an unaligned O_DIRECT read needs a bounce buffer");
        assert_eq!((ring.inflight(), direct.inflight(), order.shares()), (0, 0, 0));
    }

    /// A write of `pieces` of `fill` from one block-aligned buffer (as a
    /// shared-memory slot is), each its own request.
    fn aligned_write(file: &Arc<OpenFile>, pieces: &[(u64, u64)], fill: u8) -> Job {
        let mut j = job(file, Op::Write, pieces, fill);
        let total: usize = pieces.iter().map(|p| p.1 as usize).sum();
        let body = Arc::new(vec![fill; total + 2 * DIRECT_ALIGN_BYTES]);
        let mut at = body.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
        for (it, &(_, len)) in j.items.iter_mut().zip(pieces) {
            it.buf = Buf::Write(Arc::clone(&body), at, len as usize);
            at += len as usize;
        }
        j
    }

    /// `aligned_write`'s pieces one byte past a block boundary: never
    /// aligned, where `job`'s heap buffer is now and then (the bounce
    /// buffer test pushed one through once, in `make test`).
    fn unaligned_write(file: &Arc<OpenFile>, pieces: &[(u64, u64)], fill: u8) -> Job {
        let mut j = aligned_write(file, pieces, fill);
        for it in &mut j.items {
            if let Buf::Write(_, at, _) = &mut it.buf {
                *at += 1;
            }
        }
        j
    }

    /// The ring of a server with `--direct` on file `f` opened O_DIRECT in
    /// /var/tmp (a disk; tmpfs has no O_DIRECT); `None` where that or
    /// io_uring is missing.
    fn direct_setup(order: &Arc<DirectOrder>) -> Option<(tempfile::TempDir, OwnedFd, Ring, Arc<OpenFile>)> {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let efd = eventfd();
        let Ok(ring) = Ring::new(4, efd.as_raw_fd(), Some(Arc::clone(order)), None) else {
            eprintln!("no io_uring here: nothing to test");
            return None;
        };
        use std::os::unix::fs::OpenOptionsExt;
        let Ok(file) = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).custom_flags(libc::O_DIRECT).open(dir.path().join("f")) else {
            eprintln!("no O_DIRECT on {}: nothing to test", dir.path().display());
            return None;
        };
        Some((dir, efd, ring, registered(file)))
    }

    #[test]
    fn an_o_direct_write_of_whole_blocks_holds_a_share_until_reaped() {
        let order = Arc::new(DirectOrder::default());
        let Some((dir, _efd, mut ring, f)) = direct_setup(&order) else { return };
        assert!(ring.push(aligned_write(&f, &[(0, 4096), (4096, 8192)], 3)).is_ok(), "whole blocks from aligned slots");
        assert!(ring.push(aligned_write(&f, &[(16384, 4096)], 4)).is_ok());
        assert_eq!(order.shares(), 2, "one share a write in flight");
        ring.flush().unwrap();
        let done = reap_n(&mut ring, 2);
        assert!(done.iter().all(|r| matches!(r, Reaped::Done(_))));
        assert_eq!(order.shares(), 0, "given back when reaped");
        let mut want = vec![3u8; 12288];
        want.extend(vec![0u8; 4096]);
        want.extend(vec![4u8; 4096]);
        assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), want);
    }

    #[test]
    fn an_o_direct_write_goes_to_a_worker_while_one_runs_alone_or_waits_to() {
        let order = Arc::new(DirectOrder::default());
        let Some((_dir, _efd, mut ring, f)) = direct_setup(&order) else { return };
        {
            let _alone = order.alone();
            assert!(ring.push(aligned_write(&f, &[(0, 4096)], 1)).is_err(), "a read-modify-write runs alone");
        }
        assert!(ring.push(aligned_write(&f, &[(0, 4096)], 1)).is_ok(), "free again");
        // A worker's read-modify-write now waits for the ring's share; no
        // further share is handed out meanwhile, and it runs once reaped.
        let waiter = {
            let order = Arc::clone(&order);
            std::thread::spawn(move || drop(order.alone()))
        };
        let until = Instant::now() + Duration::from_secs(10);
        while order.waiting_alone() == 0 {
            assert!(Instant::now() < until, "the worker never waited");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(ring.push(aligned_write(&f, &[(4096, 4096)], 2)).is_err(), "a waiting worker stops new shares");
        ring.flush().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "the write is done but not reaped: its share is still held");
        reap_n(&mut ring, 1);
        waiter.join().unwrap();
        assert_eq!(order.shares(), 0);
        assert!(ring.push(aligned_write(&f, &[(4096, 4096)], 2)).is_ok(), "the worker is done: shares again");
        ring.flush().unwrap();
        reap_n(&mut ring, 1);
    }
}
