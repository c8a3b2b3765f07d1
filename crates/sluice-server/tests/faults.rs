//! Storage faults in the middle of an aggregate: a `Storage`
//! that moves part of an aggregated dispatch and then fails. The members it
//! wrote (or read) whole are answered with their bytes; the members the
//! error cut or never reached get its errno; no byte that was not written
//! is acknowledged.

mod common;

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{pattern, TestServer};
use sluice_client::{Client, ConnectOptions};
use sluice_core::{Op, PolicyConfig};
use sluice_server::{Storage, StorageRef, Syscalls};

const PIECE: usize = 4096;
const PLUG_AT: u64 = 1 << 20;

/// Call 1 (the plug): held 1 s, so the others queue behind it and are
/// aggregated; call 2 (the aggregate): moves only its first `PIECE` bytes;
/// call 3: fails with `errno`. Later calls go through.
struct Faulty {
    calls: AtomicUsize,
    errno: i32,
}

impl Storage for Faulty {
    fn transfer_once(&self, fd: RawFd, op: Op, iov: &[libc::iovec], offset: u64) -> Result<usize, i32> {
        match self.calls.fetch_add(1, Ordering::SeqCst) {
            0 => {
                std::thread::sleep(Duration::from_millis(1_000));
                Syscalls.transfer_once(fd, op, iov, offset)
            }
            1 => {
                // The first piece only: a short transfer, as a full disk gives.
                let first = libc::iovec { iov_base: iov[0].iov_base, iov_len: iov[0].iov_len.min(PIECE) };
                Syscalls.transfer_once(fd, op, &[first], offset)
            }
            2 => Err(self.errno),
            _ => Syscalls.transfer_once(fd, op, iov, offset),
        }
    }
}

fn server(errno: i32) -> TestServer {
    TestServer::start(move |c| {
        c.queue_depth = 1;
        c.policy = PolicyConfig::from_name("fifo-merge").unwrap();
        c.storage = Some(StorageRef(Arc::new(Faulty { calls: AtomicUsize::new(0), errno })));
    })
}

fn client(s: &TestServer, app: &str) -> Client {
    // Leases and shared memory off: every byte goes through the dispatch.
    Client::connect_with(&s.addr(), ConnectOptions { app: Some(app.into()), leases: false, shm: false, ..ConnectOptions::default() }).unwrap()
}

#[test]
fn enospc_mid_aggregate_fails_exactly_the_writes_it_cut() {
    let s = server(libc::ENOSPC);
    let plug = client(&s, "plug");
    let fd = plug.open("f", libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
    let p = std::thread::spawn(move || plug.pwrite(fd, &pattern(PIECE, 9), PLUG_AT).map(|_| ()));
    std::thread::sleep(Duration::from_millis(50));
    // Three writers of contiguous pieces, queued behind the plug: one
    // aggregate of three members.
    let writers: Vec<_> = (0..3u64)
        .map(|k| {
            let c = client(&s, &format!("w{k}"));
            let fd = c.open("f", libc::O_RDWR, 0).unwrap();
            std::thread::spawn(move || c.pwrite(fd, &pattern(PIECE, k), k * PIECE as u64).map_err(|e| e.errno))
        })
        .collect();
    p.join().unwrap().unwrap();
    let results: Vec<Result<usize, i32>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    assert_eq!(results, [Ok(PIECE), Err(libc::ENOSPC), Err(libc::ENOSPC)], "the written member is acknowledged, the cut ones get ENOSPC");
    let on_disk = std::fs::read(s.path("f")).unwrap();
    assert_eq!(&on_disk[..PIECE], &pattern(PIECE, 0)[..], "what was acknowledged is there");
}

#[test]
fn eio_mid_aggregate_fails_exactly_the_reads_it_cut() {
    let s = server(libc::EIO);
    let data = pattern(3 * PIECE, 5);
    let mut file = data.clone();
    file.resize(PLUG_AT as usize + PIECE, 0);
    std::fs::write(s.path("f"), &file).unwrap();
    let plug = client(&s, "plug");
    let fd = plug.open("f", libc::O_RDONLY, 0).unwrap();
    let p = std::thread::spawn(move || {
        let mut b = vec![0u8; PIECE];
        plug.pread(fd, &mut b, PLUG_AT).map(|_| ())
    });
    std::thread::sleep(Duration::from_millis(50));
    let readers: Vec<_> = (0..3u64)
        .map(|k| {
            let c = client(&s, &format!("r{k}"));
            let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
            std::thread::spawn(move || {
                let mut b = vec![0u8; PIECE];
                c.pread(fd, &mut b, k * PIECE as u64).map(|n| b[..n].to_vec()).map_err(|e| e.errno)
            })
        })
        .collect();
    p.join().unwrap().unwrap();
    let results: Vec<Result<Vec<u8>, i32>> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    assert_eq!(results[0].as_deref(), Ok(&data[..PIECE]), "the member read whole gets its bytes");
    assert_eq!((results[1].as_ref().err(), results[2].as_ref().err()), (Some(&libc::EIO), Some(&libc::EIO)), "the cut members get EIO");
}
