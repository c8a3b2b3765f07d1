//! The shared-memory data path: a local client's reads and
//! writes travel through a region the server maps for its connection;
//! the region's size and the total of all regions are bounded; a request
//! naming bytes outside its region is refused.

mod common;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use common::{pattern, raw_call as call, within_5s, TestServer};
use sluice_client::{Client, ConnectOptions};
use sluice_proto::*;

const REGION: u64 = (16 << 20) + POST_AREA_BYTES;

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
    within_5s("the region outlived its connection", || s.handle.shm_bytes() == 0);
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
    // One share: each region as asked while the budget holds it.
    let s = TestServer::start(|c| (c.limits.shm_total_bytes_max, c.limits.shm_taper_shares) = (2 * REGION, 1));
    std::fs::write(s.path("f"), pattern(1 << 20, 5)).unwrap();
    let a = client(&s, true);
    let b = client(&s, true);
    assert_eq!(s.handle.shm_bytes(), 2 * REGION, "N regions' bytes are granted");
    assert_eq!(s.handle.shm_refused(), 0);
    let third = client(&s, true);
    assert_eq!(s.handle.shm_bytes(), 2 * REGION, "the N+1st region is refused");
    assert_eq!(s.handle.shm_refused(), 1, "and counted");
    let fd = third.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    assert_eq!(third.pread(fd, &mut buf, 0).unwrap(), 1 << 20, "and that client keeps the socket path");
    assert_eq!(buf, pattern(1 << 20, 5));
    drop((a, b));
}

/// As the budget fills, regions shrink (a share of what is left, whole
/// 1 MiB slots and the post area), down to one slot; then `ShmAttach` is
/// refused. Every client, whole region or one slot, reads and writes
/// through it correctly; the smaller grants are counted.
#[test]
fn regions_shrink_as_the_budget_fills_and_every_size_works() {
    let s = TestServer::start(|c| (c.limits.shm_total_bytes_max, c.limits.shm_taper_shares) = (4 * REGION, 2));
    let data = pattern(2 << 20, 9);
    std::fs::write(s.path("f"), &data).unwrap();
    let (mut clients, mut grants) = (Vec::new(), Vec::new());
    while s.handle.shm_refused() == 0 {
        let before = s.handle.shm_bytes();
        clients.push(client(&s, true));
        grants.push(s.handle.shm_bytes() - before);
        assert!(clients.len() < 64, "the budget runs out: {grants:?}");
    }
    assert_eq!(grants.pop(), Some(0), "the last was refused");
    assert_eq!(&grants[..3], &[REGION; 3], "whole regions while the share holds them: {grants:?}");
    assert!(grants[3..].windows(2).all(|w| w[0] >= w[1]), "then smaller: {grants:?}");
    assert_eq!(grants.last(), Some(&((1 << 20) + POST_AREA_BYTES)), "down to one slot: {grants:?}");
    assert!(grants.iter().all(|g| (g - POST_AREA_BYTES).is_multiple_of(1 << 20)), "whole slots: {grants:?}");
    assert_eq!(s.handle.shm_tapered(), grants.len() as u64 - 3, "the smaller grants are counted");
    assert!(4 * REGION - s.handle.shm_bytes() < (1 << 20) + POST_AREA_BYTES, "refused only once less than one slot is left");
    // Every client, whatever its region, moves the right bytes through it
    // (256 KiB pieces fit any slot; several in flight take every slot).
    for (k, c) in clients.iter().enumerate() {
        let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
        let tickets: Vec<_> = (0..8u64).map(|i| c.submit_read(fd, 256 << 10, i * (256 << 10)).unwrap()).collect();
        for (i, t) in tickets.into_iter().enumerate() {
            let mut buf = vec![0u8; 256 << 10];
            assert_eq!(c.wait_read(t, &mut buf).unwrap(), 256 << 10);
            assert_eq!(buf, data[i << 18..(i + 1) << 18], "client {k} (region of {} bytes), read {i}", grants.get(k).unwrap_or(&0));
        }
        let w = c.open(&format!("w{k}"), libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
        assert_eq!(c.pwrite(w, &data[..1 << 20], 0).unwrap(), 1 << 20);
        assert_eq!(std::fs::read(s.path(&format!("w{k}"))).unwrap(), data[..1 << 20], "client {k}'s write");
    }
}

#[test]
fn a_range_outside_the_region_is_refused() {
    let s = TestServer::start(|_| {});
    std::fs::write(s.path("f"), pattern(8192, 6)).unwrap();
    let mut sock = common::raw_session(&s, "f");
    let none = call(&mut sock, 3, &Request::ReadShm { fd: 3, offset: 0, len: 100, at: 0, post: NO_POST });
    assert!(none.contains("ShmAttach first"), "{none}");
    // A plain read() drops the descriptor the answer carries; the region
    // is still this connection's.
    assert_eq!(call(&mut sock, 4, &Request::ShmAttach { bytes: 4096 }), "Count(4096)");
    assert_eq!(call(&mut sock, 5, &Request::ReadShm { fd: 3, offset: 0, len: 4096, at: 0, post: NO_POST }), "Count(4096)", "N: the whole region");
    let out = call(&mut sock, 6, &Request::ReadShm { fd: 3, offset: 0, len: 4096, at: 1, post: NO_POST });
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

// ---- posted answers (protocol 7) ----------------------------------------

/// `ShmAttach` on a raw connection, keeping the descriptor the answer
/// carries: the bytes granted and the region, mapped.
fn attach(sock: &mut std::os::unix::net::UnixStream, id: u64, bytes: u64) -> (u64, *mut u8) {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let mut f = Vec::new();
    encode_request(id, &Request::ShmAttach { bytes }, &mut f).unwrap();
    sock.write_all(&f).unwrap();
    // The answer is a header and a u64, sent at once with the descriptor.
    let mut buf = [0u8; 256];
    let mut cmsg = [0u64; 8];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: an all-zero msghdr is valid; it points at live buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cmsg) as _;
    // SAFETY: msg points at live buffers.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    assert!(n as usize >= HEADER_BYTES + 8, "the whole answer in one receive ({n} bytes)");
    let h = check_header(&buf[..HEADER_BYTES], FRAME_BYTES_MAX).unwrap().unwrap();
    assert_eq!(h.request_id, id);
    let granted = match parse_response(&h, &buf[HEADER_BYTES..n as usize]).unwrap() {
        Response::Count(g) => g,
        other => panic!("ShmAttach answered {other:?}"),
    };
    // SAFETY: the kernel filled the control buffer; one SCM_RIGHTS message.
    let fd = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        assert!(!c.is_null() && (*c).cmsg_type == libc::SCM_RIGHTS, "the region's descriptor came");
        std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>())
    };
    // SAFETY: a fresh shared mapping of the memfd's granted bytes; the
    // descriptor is closed after (the mapping keeps the region).
    let p = unsafe {
        let p = libc::mmap(std::ptr::null_mut(), granted as usize, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
        libc::close(fd);
        assert_ne!(p, libc::MAP_FAILED);
        p.cast::<u8>()
    };
    (granted, p)
}

/// Post record `k` of a mapped region of `len` bytes: state, id, count.
fn record(region: *mut u8, len: u64, k: u32) -> (&'static AtomicU32, &'static AtomicU64, &'static AtomicU64) {
    let at = (len - POST_AREA_BYTES + u64::from(k) * POST_RECORD_BYTES) as usize;
    // SAFETY: inside the mapping, aligned, never unmapped in the test.
    unsafe {
        let p = region.add(at);
        (AtomicU32::from_ptr(p.add(post::STATE).cast()), AtomicU64::from_ptr(p.add(post::ID).cast()), AtomicU64::from_ptr(p.add(post::COUNT).cast()))
    }
}

/// Sleep on a post record as a client does, at most 10 s: whether the
/// server woke it (or had answered before the sleep began).
fn sleep_on(state: &AtomicU32) -> bool {
    let ts = libc::timespec { tv_sec: 10, tv_nsec: 0 };
    loop {
        // SAFETY: FUTEX_WAIT on a live, aligned word of the shared region.
        let r = unsafe { libc::syscall(libc::SYS_futex, state.as_ptr(), libc::FUTEX_WAIT, post::POST_SLEEPING, &ts as *const libc::timespec, std::ptr::null::<u32>(), 0) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        if r == 0 || errno == Some(libc::EAGAIN) {
            return true;
        }
        if errno == Some(libc::ETIMEDOUT) {
            return false;
        }
    }
}

/// A read that names a post record is answered there, and the client
/// asleep on it is woken; no frame comes for it on the socket.
#[test]
fn a_posted_answer_lands_in_its_record_and_wakes_the_sleeper() {
    // The emulated disk holds each read for milliseconds: the test is
    // asleep on the record well before the answer.
    let s = TestServer::start(|c| c.device = sluice_server::DeviceKind::Hdd7200);
    let data = pattern(1 << 20, 31);
    std::fs::write(s.path("f"), &data).unwrap();
    let mut sock = common::raw_session(&s, "f");
    let (len, region) = attach(&mut sock, 3, REGION);
    assert_eq!(len, REGION);
    for (id, k, offset) in [(4u64, 0u32, 0u64), (5, 7, 8192), (6, POSTS_MAX - 1, 65536)] {
        let (state, rid, count) = record(region, len, k);
        state.store(post::POST_SLEEPING, Ordering::SeqCst);
        let mut f = Vec::new();
        encode_request(id, &Request::ReadShm { fd: 3, offset, len: 4096, at: 1 << 20, post: k }, &mut f).unwrap();
        std::io::Write::write_all(&mut sock, &f).unwrap();
        assert!(sleep_on(state), "request {id}: the server never woke its record {k}");
        assert_eq!(state.load(Ordering::SeqCst), post::POST_COUNTED, "request {id}");
        assert_eq!((rid.load(Ordering::SeqCst), count.load(Ordering::SeqCst)), (id, 4096), "record {k} names its request and count");
        // SAFETY: inside the mapping; the server is done with the range.
        let got = unsafe { std::slice::from_raw_parts(region.add(1 << 20), 4096) };
        assert_eq!(got, &data[offset as usize..offset as usize + 4096], "request {id}'s data in the region");
    }
    // The next frame on the socket answers the next request: none came
    // for the posted ones.
    assert_eq!(call(&mut sock, 9, &Request::ReadShm { fd: 3, offset: 0, len: 100, at: 0, post: NO_POST }), "Count(100)");
}

/// An answer that is not a count (here an error) comes on the socket;
/// the record says so, and wakes the sleeper to read it there.
#[test]
fn an_error_is_posted_as_on_the_socket() {
    let s = TestServer::start(|_| {});
    std::fs::write(s.path("f"), pattern(8192, 32)).unwrap();
    let mut sock = common::raw_session(&s, "f");
    let (len, region) = attach(&mut sock, 3, REGION);
    let (state, rid, _) = record(region, len, 2);
    state.store(post::POST_PENDING, Ordering::SeqCst);
    let out = call(&mut sock, 4, &Request::ReadShm { fd: 99, offset: 0, len: 100, at: 0, post: 2 });
    assert!(out.contains(&format!("errno: {}", libc::EBADF)), "{out}");
    assert_eq!((state.load(Ordering::SeqCst), rid.load(Ordering::SeqCst)), (post::POST_ON_SOCKET, 4), "the record points at the socket");
}

/// A region holds post records only when it has room for the area:
/// `POST_AREA_BYTES` does, one byte less does not (refused, on the socket).
#[test]
fn a_post_needs_a_region_with_room_for_the_area() {
    let s = TestServer::start(|_| {});
    std::fs::write(s.path("f"), pattern(8192, 33)).unwrap();
    for (bytes, ok) in [(POST_AREA_BYTES, true), (POST_AREA_BYTES - 1, false)] {
        let mut sock = common::raw_session(&s, "f");
        let (len, region) = attach(&mut sock, 3, bytes);
        assert_eq!(len, bytes);
        if ok {
            let (state, rid, count) = record(region, len, 0);
            state.store(post::POST_SLEEPING, Ordering::SeqCst);
            let mut f = Vec::new();
            encode_request(4, &Request::ReadShm { fd: 3, offset: 0, len: 64, at: 64, post: 0 }, &mut f).unwrap();
            std::io::Write::write_all(&mut sock, &f).unwrap();
            assert!(sleep_on(state), "{bytes} bytes: never woken");
            assert_eq!((state.load(Ordering::SeqCst), rid.load(Ordering::SeqCst), count.load(Ordering::SeqCst)), (post::POST_COUNTED, 4, 64), "{bytes} bytes");
        } else {
            let out = call(&mut sock, 4, &Request::ReadShm { fd: 3, offset: 0, len: 64, at: 64, post: 0 });
            assert!(out.contains(&format!("errno: {}", libc::EINVAL)) && out.contains("too small for a post area"), "{bytes} bytes: {out}");
        }
    }
}

/// Reads and writes through the region give the same bytes with posted
/// answers and with the socket's (`ConnectOptions::post`).
#[test]
fn posted_and_socket_answers_carry_the_same_bytes() {
    let s = TestServer::start(|_| {});
    let data = pattern(2 << 20, 34);
    for post in [true, false] {
        let c = Client::connect_with(&s.addr(), ConnectOptions { app: Some("post".into()), post, leases: false, ..ConnectOptions::default() }).unwrap();
        let name = format!("f{post}");
        let fd = c.open(&name, libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
        for (i, piece) in data.chunks(256 << 10).enumerate() {
            assert_eq!(c.pwrite(fd, piece, (i * (256 << 10)) as u64).unwrap(), piece.len(), "post {post}: write {i}");
        }
        let tickets: Vec<_> = (0..20u64).map(|i| (i, c.submit_read(fd, 100 << 10, i * (100 << 10)).unwrap())).collect();
        for (i, t) in tickets {
            let mut buf = vec![0u8; 100 << 10];
            let n = c.wait_read(t, &mut buf).unwrap();
            let at = (i * (100 << 10)) as usize;
            assert_eq!(&buf[..n], &data[at..(at + (100 << 10)).min(data.len())], "post {post}: read {i}");
        }
        assert_eq!(std::fs::read(s.path(&name)).unwrap(), data, "post {post}");
    }
}

/// A stand-in server on a fresh socket: it answers the handshake, the
/// region (a memfd of the bytes asked) and any open, then takes one read
/// and never answers it. With `close` it then closes the connection (a
/// server gone); without, it holds it open (a hung one) until the client
/// leaves. Returns the address and the directory holding the socket.
fn silent_server(close: bool) -> (String, tempfile::TempDir) {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    let dir = tempfile::Builder::new().prefix("sluice-fake-").tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        let (mut sock, _) = listener.accept().unwrap();
        loop {
            let mut h = [0u8; HEADER_BYTES];
            if sock.read_exact(&mut h).is_err() {
                return;
            }
            let h = check_header(&h, FRAME_BYTES_MAX).unwrap().unwrap();
            let mut body = vec![0u8; h.body_len as usize];
            sock.read_exact(&mut body).unwrap();
            let mut out = Vec::new();
            match parse_request(&h, &body).unwrap() {
                Request::Hello(_) => {
                    let ok = HelloOk { version: VERSION, frame_bytes_max: FRAME_BYTES_MAX, io_bytes_max: IO_BYTES_MAX, inflight_per_connection_max: 64, proof: None };
                    encode_response(h.request_id, &Response::HelloOk(ok), &mut out);
                }
                Request::ShmAttach { bytes } => {
                    // SAFETY: plain system calls on a fresh memfd.
                    let fd = unsafe {
                        let fd = libc::memfd_create(c"fake".as_ptr(), libc::MFD_CLOEXEC);
                        assert!(fd >= 0 && libc::ftruncate(fd, bytes as libc::off_t) == 0);
                        fd
                    };
                    encode_response(h.request_id, &Response::Count(bytes), &mut out);
                    let mut iov = libc::iovec { iov_base: out.as_mut_ptr().cast(), iov_len: out.len() };
                    let mut cmsg = [0u64; 4];
                    // SAFETY: a msghdr over live buffers carrying one
                    // descriptor (SCM_RIGHTS).
                    unsafe {
                        let mut msg: libc::msghdr = std::mem::zeroed();
                        msg.msg_iov = &mut iov;
                        msg.msg_iovlen = 1;
                        msg.msg_control = cmsg.as_mut_ptr().cast();
                        msg.msg_controllen = libc::CMSG_SPACE(4) as _;
                        let c = libc::CMSG_FIRSTHDR(&msg);
                        (*c).cmsg_level = libc::SOL_SOCKET;
                        (*c).cmsg_type = libc::SCM_RIGHTS;
                        (*c).cmsg_len = libc::CMSG_LEN(4) as _;
                        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), fd);
                        assert_eq!(libc::sendmsg(sock.as_raw_fd(), &msg, 0), out.len() as isize);
                        libc::close(fd);
                    }
                    continue;
                }
                Request::Open { .. } => encode_response(h.request_id, &Response::Fd(3, 1), &mut out),
                Request::ReadShm { post, .. } | Request::ReadLease { post, .. } => {
                    assert_ne!(post, NO_POST, "the client named a post record");
                    if close {
                        return;
                    }
                    // Hung: hold the connection until the client leaves.
                    let mut rest = Vec::new();
                    let _ = sock.read_to_end(&mut rest);
                    return;
                }
                other => panic!("the stand-in does not answer {other:?}"),
            }
            sock.write_all(&out).unwrap();
        }
    });
    (format!("unix:{}", path.display()), dir)
}

/// A client asleep on a post record notices a server that went away (the
/// record is never written) and fails with a clear error, not a hang.
#[test]
fn a_client_waiting_on_a_post_notices_the_server_gone() {
    let (addr, _dir) = silent_server(true);
    let c = Client::connect_with(&addr, ConnectOptions { app: Some("gone".into()), recovery: sluice_client::Recovery::Off, ..ConnectOptions::default() }).unwrap();
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 4096];
    let e = c.pread(fd, &mut buf, 0).unwrap_err();
    assert_eq!(e.kind, sluice_client::ClientErrorKind::Disconnected, "{e}");
    assert!(e.to_string().contains("closed the connection"), "{e}");
}

/// A client asleep on a post record of a server that never answers gives
/// up after its patience (soft), as it does on the socket.
#[test]
fn a_soft_client_waiting_on_a_post_gives_up_after_its_patience() {
    let (addr, _dir) = silent_server(false);
    let opts = ConnectOptions { app: Some("hung".into()), recovery: sluice_client::Recovery::Soft, timeout: Duration::from_millis(300), ..ConnectOptions::default() };
    let c = Client::connect_with(&addr, opts).unwrap();
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 4096];
    let e = c.pread(fd, &mut buf, 0).unwrap_err();
    assert_eq!((e.kind, e.errno), (sluice_client::ClientErrorKind::Timeout, libc::ETIMEDOUT), "{e}");
}

/// The doorbell of a mapped region of `len` bytes: mask and watched.
fn doorbell(region: *mut u8, len: u64) -> (&'static AtomicU64, &'static AtomicU32) {
    let at = (len - POST_RECORD_BYTES) as usize;
    // SAFETY: the area's last record, inside the mapping, aligned.
    unsafe {
        let p = region.add(at);
        (AtomicU64::from_ptr(p.add(post::MASK).cast()), AtomicU32::from_ptr(p.add(post::WATCHED).cast()))
    }
}

/// Leave a request in post record `k` as a client does (state sleeping,
/// so that the answer wakes `sleep_on`) and set its bit on the doorbell.
#[allow(clippy::too_many_arguments)]
fn ring_raw(region: *mut u8, len: u64, k: u32, op: u32, id: u64, fd: u64, offset: u64, at: u64, n: u32) {
    let base = (len - POST_AREA_BYTES + u64::from(k) * POST_RECORD_BYTES) as usize;
    // SAFETY: inside the mapping, aligned, only accessed atomically.
    unsafe {
        let p = region.add(base);
        AtomicU32::from_ptr(p.add(post::OP).cast()).store(op, Ordering::Relaxed);
        AtomicU64::from_ptr(p.add(post::ID).cast()).store(id, Ordering::Relaxed);
        AtomicU64::from_ptr(p.add(post::FD).cast()).store(fd, Ordering::Relaxed);
        AtomicU64::from_ptr(p.add(post::OFFSET).cast()).store(offset, Ordering::Relaxed);
        AtomicU64::from_ptr(p.add(post::AT).cast()).store(at, Ordering::Relaxed);
        AtomicU32::from_ptr(p.add(post::LEN).cast()).store(n, Ordering::Relaxed);
    }
    record(region, len, k).0.store(post::POST_SLEEPING, Ordering::SeqCst);
    doorbell(region, len).0.fetch_or(1 << k, Ordering::SeqCst);
}

fn nudge(sock: &mut std::os::unix::net::UnixStream) {
    let mut f = Vec::new();
    encode_request(0, &Request::Nudge, &mut f).unwrap();
    std::io::Write::write_all(sock, &f).unwrap();
}

/// A rung request (protocol 8) is taken after its client's nudge and
/// answered in its record; the nudge puts the doorbell on the watched
/// list, so a later one is taken on any turn of the loop without a nudge
/// (here the turn a socket frame wakes). A nudge without a region is
/// ignored, and so is the doorbell's own bit.
#[test]
fn a_rung_request_is_answered_in_its_record() {
    let s = TestServer::start(|c| c.device = sluice_server::DeviceKind::Hdd7200);
    let data = pattern(1 << 20, 41);
    std::fs::write(s.path("f"), &data).unwrap();
    let mut sock = common::raw_session(&s, "f");
    nudge(&mut sock);
    assert_eq!(call(&mut sock, 2, &Request::Fstat { fd: 3 }).split('(').next(), Some("Stat"), "a nudge without a region has no answer");
    let (len, region) = attach(&mut sock, 3, REGION);
    let (mask, watched) = doorbell(region, len);
    assert_eq!(watched.load(Ordering::SeqCst), 0, "unwatched before the first nudge");
    ring_raw(region, len, 5, post::RUNG_READ, 40, 3, 8192, 1 << 20, 4096);
    mask.fetch_or(1 << POSTS_MAX, Ordering::SeqCst);
    nudge(&mut sock);
    let (state, rid, count) = record(region, len, 5);
    assert!(sleep_on(state), "the rung read was never answered");
    assert_eq!((state.load(Ordering::SeqCst), rid.load(Ordering::SeqCst), count.load(Ordering::SeqCst)), (post::POST_COUNTED, 40, 4096));
    // SAFETY: inside the mapping; the server is done with the range.
    let got = unsafe { std::slice::from_raw_parts(region.add(1 << 20), 4096) };
    assert_eq!(got, &data[8192..8192 + 4096]);
    assert_eq!(mask.load(Ordering::SeqCst), 0, "the doorbell's bits were taken, its own bit too");
    assert_eq!((s.handle.rung_requests(), s.handle.doorbells_watched()), ((1, 2), 1));
    // Watched now: ring without a nudge; a frame wakes the loop, whose
    // turn takes the rung read too.
    ring_raw(region, len, 6, post::RUNG_READ, 41, 3, 0, 2 << 20, 100);
    assert_eq!(call(&mut sock, 42, &Request::ReadShm { fd: 3, offset: 0, len: 10, at: 0, post: NO_POST }), "Count(10)");
    let (state, rid, count) = record(region, len, 6);
    assert!(sleep_on(state), "the rung read behind a watched doorbell was never taken");
    assert_eq!((state.load(Ordering::SeqCst), rid.load(Ordering::SeqCst), count.load(Ordering::SeqCst)), (post::POST_COUNTED, 41, 100));
    assert_eq!(s.handle.rung_requests(), (2, 2), "taken without a nudge");
}

/// A rung request the server cannot carry out is answered on the socket,
/// the record saying so, like a sent one: an unknown operation (EINVAL),
/// an unknown handle (EBADF), a range outside the region (EINVAL). The
/// connection goes on.
#[test]
fn a_bad_rung_request_is_answered_on_the_socket() {
    let s = TestServer::start(|_| {});
    std::fs::write(s.path("f"), pattern(8192, 42)).unwrap();
    let mut sock = common::raw_session(&s, "f");
    let (len, region) = attach(&mut sock, 3, REGION);
    for (k, (op, fd, at, errno)) in [(9, 3, 0, libc::EINVAL), (post::RUNG_READ, 99, 0, libc::EBADF), (post::RUNG_WRITE, 3, len, libc::EINVAL)].into_iter().enumerate() {
        let (k, id) = (k as u32, 50 + k as u64);
        ring_raw(region, len, k, op, id, fd, 0, at, 100);
        nudge(&mut sock);
        let (h, body) = common::raw_reply(&mut sock);
        let out = format!("{:?}", parse_response(&h, &body).unwrap());
        assert_eq!(h.request_id, id, "{out}");
        assert!(out.contains(&format!("errno: {errno}")), "record {k}: {out}");
        let (state, rid, _) = record(region, len, k);
        assert_eq!((state.load(Ordering::SeqCst), rid.load(Ordering::SeqCst)), (post::POST_ON_SOCKET, id), "record {k} points at the socket");
    }
    assert_eq!(call(&mut sock, 60, &Request::ReadShm { fd: 3, offset: 0, len: 10, at: 0, post: NO_POST }), "Count(10)");
}

/// `doorbells_watched_max` at N and N+1: with room for two, both clients'
/// doorbells are watched; with room for one, the second client's is not,
/// and its rung requests are still served, each after its nudge.
#[test]
fn doorbells_watched_max_at_n_and_n_plus_1() {
    for (max, watched) in [(2u32, 2usize), (1, 1)] {
        let s = TestServer::start(|c| c.limits.doorbells_watched_max = max);
        let data = pattern(256 << 10, 43);
        std::fs::write(s.path("f"), &data).unwrap();
        // Leases off: every read is a request (a lease would serve the
        // later ones locally).
        let clients: Vec<Client> =
            (0..2).map(|i| Client::connect_with(&s.addr(), ConnectOptions { app: Some(format!("c{i}")), leases: false, ..ConnectOptions::default() }).unwrap()).collect();
        for (i, c) in clients.iter().enumerate() {
            let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
            for r in 0..3u64 {
                let mut buf = vec![0u8; 4096];
                assert_eq!(c.pread(fd, &mut buf, r * 8192).unwrap(), 4096);
                assert_eq!(buf, data[(r * 8192) as usize..(r * 8192) as usize + 4096], "max {max}, client {i}, read {r}");
            }
        }
        assert_eq!(s.handle.doorbells_watched(), watched, "max {max}");
        let (rung, nudges) = s.handle.rung_requests();
        assert_eq!(rung, 6, "max {max}: every read was rung");
        if max == 1 {
            assert!(nudges >= 4, "max {max}: the unwatched client nudged for each of its three reads, the other at least once: {nudges}");
        }
    }
}

/// Rung requests (protocol 8): a client's slot-sized reads and writes
/// (small writes too) are left in their post records and rung on the
/// region's doorbell, never sent; the first one nudges, which puts the
/// doorbell on the loop's watched list. The bytes are the socket path's (`ConnectOptions::ring`
/// off), and a closed connection leaves the list.
#[test]
fn rung_and_sent_requests_carry_the_same_bytes() {
    // Writes rung or sent, not leased.
    let s = TestServer::start(|c| c.write_leases = false);
    let data = pattern(1 << 20, 23);
    let piece = pattern(32 << 10, 5);
    for ring in [true, false] {
        let name = format!("f{ring}");
        std::fs::write(s.path(&name), &data).unwrap();
        let before = s.handle.rung_requests().0;
        let c = Client::connect_with(&s.addr(), ConnectOptions { app: Some("ring".into()), ring, ..ConnectOptions::default() }).unwrap();
        let fd = c.open(&name, libc::O_RDWR, 0).unwrap();
        for (i, at) in [0usize, 4096, 100_000, (1 << 20) - 4096].into_iter().enumerate() {
            let mut buf = vec![0u8; 64 << 10];
            let n = c.pread(fd, &mut buf, at as u64).unwrap();
            assert_eq!(&buf[..n], &data[at..at + n], "ring {ring}: read {i}");
        }
        assert_eq!(c.pwrite(fd, &piece, 8192).unwrap(), piece.len());
        // A write under `WRITE_MIN_BYTES`: rung too (it would ride the
        // socket with its header otherwise).
        assert_eq!(c.pwrite(fd, &piece[..4096], 200_000).unwrap(), 4096);
        let file = std::fs::read(s.path(&name)).unwrap();
        assert_eq!(&file[8192..8192 + piece.len()], &piece[..], "ring {ring}");
        assert_eq!(&file[200_000..204_096], &piece[..4096], "ring {ring}: the small write");
        assert_eq!(s.handle.rung_requests().0 - before, if ring { 6 } else { 0 }, "ring {ring}: four reads and two writes");
        assert_eq!(s.handle.doorbells_watched(), usize::from(ring));
        drop(c);
        within_5s("a closed connection's doorbell stays watched", || s.handle.doorbells_watched() == 0);
    }
}

/// Many clients ringing at once while the loop falls asleep and wakes
/// between their requests: every read is answered with its bytes (a
/// request rung just as the loop went to sleep, unseen and un-nudged,
/// would hang here).
#[test]
fn rung_requests_from_busy_clients_are_all_answered() {
    let s = TestServer::start(|_| {});
    let data = std::sync::Arc::new(pattern(1 << 20, 44));
    std::fs::write(s.path("f"), &*data).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    for t in 0..4u64 {
        let (addr, data, tx) = (s.addr(), std::sync::Arc::clone(&data), tx.clone());
        std::thread::spawn(move || {
            let c = Client::connect_with(&addr, ConnectOptions { app: Some(format!("busy{t}")), leases: false, ..ConnectOptions::default() }).unwrap();
            let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
            let mut x = t + 1;
            for i in 0..300 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let at = ((x >> 33) % 250) * 4096;
                let mut buf = vec![0u8; 4096];
                assert_eq!(c.pread(fd, &mut buf, at).unwrap(), 4096);
                assert_eq!(buf, data[at as usize..at as usize + 4096], "thread {t}, read {i}");
                if i % 50 == 0 {
                    // Let the loop fall asleep now and then.
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            tx.send(t).unwrap();
        });
    }
    drop(tx);
    for _ in 0..4 {
        rx.recv_timeout(Duration::from_secs(60)).expect("a client thread failed, or hung for 60 s on a rung read never answered");
    }
    assert_eq!(s.handle.rung_requests().0, 1200);
}
