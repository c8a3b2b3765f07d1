//! O_DIRECT writes side by side (`--direct`, `Executor::direct_writes`):
//! writes of whole blocks run at once on the executor's workers; a write
//! that reads back an edge block or fixes the file's size runs alone. A
//! `Storage` that holds every write for a while counts how many overlap.

mod common;

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{pattern, TestServer};
use sluice_client::{Client, ConnectOptions};
use sluice_core::{Op, PolicyConfig};
use sluice_server::{Storage, StorageRef, Syscalls};

const BLOCK: u64 = 4096;

/// Holds each write 40 ms and records the most writes in flight at once.
#[derive(Default)]
struct Overlap {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Storage for Overlap {
    fn transfer_once(&self, fd: RawFd, op: Op, iov: &[libc::iovec], offset: u64) -> Result<usize, i32> {
        if op != Op::Write {
            return Syscalls.transfer_once(fd, op, iov, offset);
        }
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(40));
        let r = Syscalls.transfer_once(fd, op, iov, offset);
        self.now.fetch_sub(1, Ordering::SeqCst);
        r
    }
}

/// Four clients each write one piece of `len` bytes at `offset(k)` at
/// once; the most writes the storage saw in flight together, and the
/// file's bytes checked against the pieces.
fn overlap(len: usize, offset: impl Fn(u64) -> u64) -> usize {
    let storage = Arc::new(Overlap::default());
    let s = TestServer::start({
        let storage = Arc::clone(&storage);
        move |c| {
            c.direct = true;
            c.queue_depth = 4;
            c.policy = PolicyConfig::from_name("fifo").unwrap();
            c.storage = Some(StorageRef(storage));
        }
    });
    std::fs::write(s.path("f"), vec![7u8; 64 << 10]).unwrap();
    // Every client connected and its file open first; then all write at once.
    let start = Arc::new(std::sync::Barrier::new(4));
    let clients: Vec<_> = (0..4u64)
        .map(|k| {
            let c = Client::connect_with(&s.addr(), ConnectOptions { app: Some(format!("w{k}")), leases: false, ..ConnectOptions::default() }).unwrap();
            let fd = c.open("f", libc::O_RDWR, 0).unwrap();
            (k, c, fd)
        })
        .collect();
    let writers: Vec<_> = clients
        .into_iter()
        .map(|(k, c, fd)| {
            let (start, at) = (Arc::clone(&start), offset(k));
            std::thread::spawn(move || {
                start.wait();
                c.pwrite(fd, &pattern(len, k), at).unwrap()
            })
        })
        .collect();
    for w in writers {
        assert_eq!(w.join().unwrap(), len);
    }
    let file = std::fs::read(s.path("f")).unwrap();
    for k in 0..4u64 {
        let at = offset(k) as usize;
        assert_eq!(&file[at..at + len], &pattern(len, k)[..], "piece {k}");
    }
    assert_eq!(file.len(), 64 << 10, "no write changed the size");
    storage.most.load(Ordering::SeqCst)
}

#[test]
fn writes_of_whole_blocks_run_side_by_side() {
    // Block-aligned at both ends (through the socket, so through a bounce
    // buffer): no edge read back, no size fixed, so they overlap.
    assert!(overlap(BLOCK as usize, |k| 2 * k * BLOCK) >= 2, "whole-block writes waited for each other");
}

#[test]
fn a_write_that_reads_back_an_edge_block_runs_alone() {
    // 100 bytes inside a block: each reads its block back and writes it
    // whole, so no other write may run meanwhile.
    assert_eq!(overlap(100, |k| 2 * k * BLOCK + 100), 1, "edge writes overlapped");
}

#[test]
fn whole_blocks_through_the_ring_and_part_blocks_growing_the_file_keep_every_byte() {
    // The real disk: the event loop's io_uring takes the whole-block
    // writes from shared-memory slots (each holding a share of the
    // order), the workers the 100-byte ones, which read their block back
    // and fix the file's size while they run alone. Five writers grow one
    // file block by block; a size fixed from a stale length would cut
    // off a block another writer had been told was written.
    let s = TestServer::start(|c| {
        c.direct = true;
        c.queue_depth = 4;
    });
    if !s.handle.uring() {
        eprintln!("no io_uring here: the workers carry out every write");
    }
    std::fs::File::create(s.path("g")).unwrap();
    const BLOCKS: u64 = 256;
    const WRITERS: u64 = 5;
    let part = |b: u64| (b * BLOCK + 100, pattern(100, b));
    let whole = |b: u64| (b * BLOCK, pattern(BLOCK as usize, b));
    let writers: Vec<_> = (0..WRITERS)
        .map(|k| {
            let c = s.client(&format!("w{k}"));
            let fd = c.open("g", libc::O_RDWR, 0).unwrap();
            std::thread::spawn(move || {
                for b in (k..BLOCKS).step_by(WRITERS as usize) {
                    let (at, data) = if k == WRITERS - 1 { part(b) } else { whole(b) };
                    assert_eq!(c.pwrite(fd, &data, at).unwrap(), data.len(), "block {b}");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let file = std::fs::read(s.path("g")).unwrap();
    assert_eq!(file.len() as u64, BLOCKS * BLOCK, "the last block is a whole one");
    for b in 0..BLOCKS {
        let got = &file[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize];
        if b % WRITERS == WRITERS - 1 {
            let (_, data) = part(b);
            assert!(got[..100].iter().chain(&got[200..]).all(|&x| x == 0), "block {b} outside its 100 bytes");
            assert_eq!(&got[100..200], &data[..], "block {b}'s 100 bytes");
        } else {
            assert_eq!(got, &whole(b).1[..], "block {b}");
        }
    }
}

#[test]
fn a_ring_polled_by_a_kernel_thread_keeps_every_byte() {
    // `sqpoll_idle_ms`: the ring's submissions are taken by the kernel's
    // polling thread instead of an `io_uring_enter` from the loop. Four
    // writers fill a file block by block through it, idling past the
    // thread's 1 ms now and then (so it sleeps and must be woken), and
    // read every block back.
    let s = TestServer::start(|c| {
        c.direct = true;
        c.queue_depth = 4;
        c.sqpoll_idle_ms = Some(1);
    });
    assert!(s.handle.uring() && s.handle.sqpoll(), "this kernel (6.x, root) allows io_uring with SQPOLL");
    std::fs::File::create(s.path("p")).unwrap();
    const BLOCKS: u64 = 128;
    const WRITERS: u64 = 4;
    let writers: Vec<_> = (0..WRITERS)
        .map(|k| {
            let c = s.client(&format!("w{k}"));
            let fd = c.open("p", libc::O_RDWR, 0).unwrap();
            std::thread::spawn(move || {
                for b in (k..BLOCKS).step_by(WRITERS as usize) {
                    if b % 16 == k {
                        std::thread::sleep(Duration::from_millis(3));
                    }
                    assert_eq!(c.pwrite(fd, &pattern(BLOCK as usize, b), b * BLOCK).unwrap(), BLOCK as usize, "block {b}");
                }
                for b in (k..BLOCKS).step_by(WRITERS as usize) {
                    let mut got = vec![0u8; BLOCK as usize];
                    assert_eq!(c.pread(fd, &mut got, b * BLOCK).unwrap(), BLOCK as usize);
                    assert_eq!(got, pattern(BLOCK as usize, b), "block {b} read back");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let file = std::fs::read(s.path("p")).unwrap();
    assert_eq!(file.len() as u64, BLOCKS * BLOCK);
    for b in 0..BLOCKS {
        assert_eq!(&file[(b * BLOCK) as usize..((b + 1) * BLOCK) as usize], &pattern(BLOCK as usize, b)[..], "block {b} on disk");
    }
}

/// Reads as the kernel does them with O_DIRECT while another client
/// changes the file's size: the first read at offset 0 ends at byte 5,000
/// (the end of the file then), and a read at an unaligned offset is
/// `EINVAL` (the file has grown since).
struct ShortThenGrown;

const SHORT_AT: usize = 5_000;

impl Storage for ShortThenGrown {
    fn transfer_once(&self, fd: RawFd, op: Op, iov: &[libc::iovec], offset: u64) -> Result<usize, i32> {
        if op == Op::Read && !offset.is_multiple_of(BLOCK) {
            return Err(libc::EINVAL);
        }
        let r = Syscalls.transfer_once(fd, op, iov, offset)?;
        Ok(if op == Op::Read && offset == 0 { r.min(SHORT_AT) } else { r })
    }
}

#[test]
fn a_short_direct_read_is_the_end_of_the_file_not_a_second_unaligned_read() {
    let s = TestServer::start(|c| {
        c.direct = true;
        c.storage = Some(StorageRef(Arc::new(ShortThenGrown)));
    });
    std::fs::write(s.path("f"), pattern(3 * BLOCK as usize, 9)).unwrap();
    let c = Client::connect_with(&s.addr(), ConnectOptions { app: Some("reader".into()), leases: false, ..ConnectOptions::default() }).unwrap();
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    // Aligned (in place) and unaligned (bounce buffer) reads alike get the
    // bytes up to where the file ended, not EINVAL.
    for (len, at) in [(2 * BLOCK as usize, 0u64), (8_000, 0)] {
        let mut buf = vec![0u8; len];
        assert_eq!(c.pread(fd, &mut buf, at).unwrap(), SHORT_AT, "{len} bytes at {at}");
        assert_eq!(&buf[..SHORT_AT], &pattern(3 * BLOCK as usize, 9)[..SHORT_AT]);
    }
}

/// Holds every write 300 ms, and says when one started.
#[derive(Default)]
struct SlowWrites {
    writing: std::sync::atomic::AtomicBool,
}

impl Storage for SlowWrites {
    fn transfer_once(&self, fd: RawFd, op: Op, iov: &[libc::iovec], offset: u64) -> Result<usize, i32> {
        if op == Op::Write {
            self.writing.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(300));
        }
        Syscalls.transfer_once(fd, op, iov, offset)
    }
}

#[test]
fn a_truncate_during_a_write_that_reads_back_its_edges_is_not_undone() {
    for by_open in [false, true] {
        truncate_during_an_edge_write(by_open);
    }
}

/// One write that reads back its edge blocks, and a truncate to 0 (by
/// `ftruncate`, or by an open with `O_TRUNC`) while it writes.
fn truncate_during_an_edge_write(by_open: bool) {
    let storage = Arc::new(SlowWrites::default());
    let s = TestServer::start({
        let storage = Arc::clone(&storage);
        move |c| {
            c.direct = true;
            c.storage = Some(StorageRef(storage));
        }
    });
    std::fs::write(s.path("f"), vec![b'O'; 4 * BLOCK as usize]).unwrap();
    let connect = |app: &str| Client::connect_with(&s.addr(), ConnectOptions { app: Some(app.into()), leases: false, ..ConnectOptions::default() }).unwrap();
    let (a, b) = (connect("writer"), connect("truncater"));
    let fa = a.open("f", libc::O_RDWR, 0).unwrap();
    // 100 bytes inside block 1: read back blocks 1's edges, write it whole.
    let w = std::thread::spawn(move || a.pwrite(fa, &[b'x'; 100], 6_000).unwrap());
    while !storage.writing.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // The write has read the block and the size; the truncate comes now.
    if by_open {
        b.open("f", libc::O_RDWR | libc::O_TRUNC, 0).unwrap();
    } else {
        let fb = b.open("f", libc::O_RDWR, 0).unwrap();
        b.ftruncate(fb, 0).unwrap();
    }
    assert_eq!(w.join().unwrap(), 100);
    let file = std::fs::read(s.path("f")).unwrap();
    // Either order of the two is fine; a mix of them is not: no byte of
    // what the truncate removed may come back.
    let stale = file.iter().filter(|&&c| c == b'O').count();
    assert_eq!(stale, 0, "O_TRUNC {by_open}: {} bytes after the truncate, {stale} of them the truncated 'O'", file.len());
    let write_then_truncate = file.is_empty();
    let truncate_then_write = file.len() == 6_100 && file[..6_000].iter().all(|&c| c == 0) && file[6_000..].iter().all(|&c| c == b'x');
    assert!(write_then_truncate || truncate_then_write, "O_TRUNC {by_open}: {} bytes", file.len());
}
