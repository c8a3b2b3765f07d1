//! The shared-memory data path (issue 12): a local client's reads and
//! writes travel through a region the server maps for its connection;
//! the region's size and the total of all regions are bounded; a request
//! naming bytes outside its region is refused.

mod common;

use std::time::Duration;

use common::{pattern, raw_call as call, TestServer};
use sluice_client::{Client, ConnectOptions};
use sluice_proto::*;

const REGION: u64 = 16 << 20;

fn client(s: &TestServer, shm: bool) -> Client {
    Client::connect_with(&s.addr(), ConnectOptions { app: Some("shm".into()), shm, ..ConnectOptions::default() }).expect("client connects")
}

#[test]
fn reads_and_writes_through_the_region_match_the_file() {
    let s = TestServer::start(|_| {});
    let c = client(&s, true);
    assert_eq!(s.handle.shm_bytes(), REGION, "the client attached a region");
    let fd = c.open("f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let data = pattern(3 << 20, 11);
    // 1 MiB writes fit a slot (the region's path); the 3 MiB read below
    // does not (the socket's path): both are exercised.
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        assert_eq!(c.pwrite(fd, piece, (i << 20) as u64).unwrap(), piece.len());
    }
    assert_eq!(std::fs::read(s.path("f")).unwrap(), data, "the region's writes reached the file");
    let mut whole = vec![0u8; 3 << 20];
    assert_eq!(c.pread(fd, &mut whole, 0).unwrap(), 3 << 20);
    assert_eq!(whole, data, "a read larger than a slot (socket path)");
    for at in [0usize, 4096, (1 << 20) + 17, (3 << 20) - 100] {
        let mut buf = vec![0u8; 64 << 10];
        let n = c.pread(fd, &mut buf, at as u64).unwrap();
        assert_eq!(n, (64 << 10).min((3 << 20) - at), "short only at the end of the file");
        assert_eq!(&buf[..n], &data[at..at + n], "a read through a slot at {at}");
    }
    // Many in flight at once: more than the region's 16 slots.
    let tickets: Vec<_> = (0..24u64).map(|i| (i, c.submit_read(fd, 128 << 10, i * (128 << 10)).unwrap())).collect();
    for (i, t) in tickets {
        let mut buf = vec![0u8; 128 << 10];
        assert_eq!(c.wait_read(t, &mut buf).unwrap(), 128 << 10);
        let at = (i * (128 << 10)) as usize;
        assert_eq!(buf, data[at..at + (128 << 10)], "pipelined read {i}");
    }
    drop(c);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.handle.shm_bytes() > 0 {
        assert!(std::time::Instant::now() < deadline, "the region outlived its connection");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_client_without_shm_keeps_the_socket_path() {
    let s = TestServer::start(|_| {});
    std::fs::write(s.path("f"), pattern(1 << 20, 3)).unwrap();
    let c = client(&s, false);
    assert_eq!(s.handle.shm_bytes(), 0);
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), 1 << 20);
    assert_eq!(buf, pattern(1 << 20, 3));
}

#[test]
fn shm_bytes_max_at_n_and_n_plus_1() {
    // The client asks for REGION bytes: granted whole at N = REGION ...
    let s = TestServer::start(|c| c.limits.shm_bytes_max = REGION);
    let _c = client(&s, true);
    assert_eq!(s.handle.shm_bytes(), REGION);
    // ... and cut to the bound when it asks for one byte more than it.
    let s = TestServer::start(|c| c.limits.shm_bytes_max = REGION - 1);
    let c = client(&s, true);
    assert_eq!(s.handle.shm_bytes(), REGION - 1, "granted the bound, not the request");
    std::fs::write(s.path("f"), pattern(1 << 20, 4)).unwrap();
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), 1 << 20);
    assert_eq!(buf, pattern(1 << 20, 4));
}

#[test]
fn shm_total_bytes_max_at_n_and_n_plus_1() {
    let s = TestServer::start(|c| c.limits.shm_total_bytes_max = 2 * REGION);
    std::fs::write(s.path("f"), pattern(1 << 20, 5)).unwrap();
    let a = client(&s, true);
    let b = client(&s, true);
    assert_eq!(s.handle.shm_bytes(), 2 * REGION, "N regions' bytes are granted");
    let third = client(&s, true);
    assert_eq!(s.handle.shm_bytes(), 2 * REGION, "the N+1st region is refused");
    let fd = third.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    assert_eq!(third.pread(fd, &mut buf, 0).unwrap(), 1 << 20, "and that client keeps the socket path");
    assert_eq!(buf, pattern(1 << 20, 5));
    drop((a, b));
}

#[test]
fn a_range_outside_the_region_is_refused() {
    let s = TestServer::start(|_| {});
    std::fs::write(s.path("f"), pattern(8192, 6)).unwrap();
    let mut sock = common::raw_session(&s, "f");
    let none = call(&mut sock, 3, &Request::ReadShm { fd: 3, offset: 0, len: 100, at: 0 });
    assert!(none.contains("ShmAttach first"), "{none}");
    // A plain read() drops the descriptor the answer carries; the region
    // is still this connection's.
    assert_eq!(call(&mut sock, 4, &Request::ShmAttach { bytes: 4096 }), "Count(4096)");
    assert_eq!(call(&mut sock, 5, &Request::ReadShm { fd: 3, offset: 0, len: 4096, at: 0 }), "Count(4096)", "N: the whole region");
    let out = call(&mut sock, 6, &Request::ReadShm { fd: 3, offset: 0, len: 4096, at: 1 });
    assert!(out.contains(&format!("errno: {}", libc::EINVAL)) && out.contains("outside the shared region"), "N+1: {out}");
    let again = call(&mut sock, 7, &Request::ShmAttach { bytes: 4096 });
    assert!(again.contains(&format!("errno: {}", libc::EEXIST)), "{again}");
}

/// Under `--direct`, block-aligned requests in the region go to the device
/// straight from and into their slots; unaligned ones through the bounce
/// buffer. Both come back as written.
#[test]
fn direct_io_through_the_region_in_place_and_bounced() {
    let s = TestServer::start(|c| c.direct = true);
    let c = client(&s, true);
    assert_eq!(s.handle.shm_bytes(), REGION);
    let fd = c.open("f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let data = pattern(2 << 20, 21);
    assert_eq!(c.pwrite(fd, &data[..1 << 20], 0).unwrap(), 1 << 20, "aligned: in place");
    assert_eq!(c.pwrite(fd, &data[1 << 20..], 1 << 20).unwrap(), 1 << 20);
    let patch = pattern((100 << 10) + 3, 22);
    assert_eq!(c.pwrite(fd, &patch, 4096 + 17).unwrap(), patch.len(), "unaligned: bounced");
    let mut want = data.clone();
    want[4096 + 17..4096 + 17 + patch.len()].copy_from_slice(&patch);
    assert_eq!(std::fs::read(s.path("f")).unwrap(), want);
    for (at, len) in [(0usize, 1usize << 20), (1 << 20, 1 << 20), (4096 + 17, 200 << 10), ((2 << 20) - 8192, 64 << 10)] {
        let mut buf = vec![0u8; len];
        let n = c.pread(fd, &mut buf, at as u64).unwrap();
        assert_eq!(n, len.min((2 << 20) - at), "read at {at}");
        assert_eq!(&buf[..n], &want[at..at + n], "read at {at}");
    }
}
