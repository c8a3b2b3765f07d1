//! Path escapes are refused; malformed frames get an error reply and close
//! only their connection; every server bound holds at N and refuses N+1.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::{pattern, TestServer};
use sluice_client::{Client, ClientErrorKind, ConnectOptions};
use sluice_proto::*;
use sluice_server::DeviceKind;

fn check_escape(c: &Client, path: &str) {
    let e = c.open(path, libc::O_RDONLY, 0).expect_err(path);
    assert_eq!(e.errno, libc::EACCES, "{path}: {e}");
    assert!(e.message.contains("escapes the server root") || e.message.contains("absolute paths are refused"), "{path}: {e}");
}

#[test]
fn paths_never_leave_the_root() {
    let s = TestServer::start(|_| {});
    std::fs::create_dir(s.path("sub")).unwrap();
    std::fs::write(s.path("sub/in.txt"), b"inside").unwrap();
    std::os::unix::fs::symlink("/etc", s.path("abs_link")).unwrap();
    std::os::unix::fs::symlink("../..", s.path("sub/up_link")).unwrap();
    std::os::unix::fs::symlink("in.txt", s.path("sub/ok_link")).unwrap();
    let c = s.client("escape");
    for p in ["../outside", "/etc/passwd", "sub/../../x", "abs_link/passwd", "sub/up_link/etc/passwd", "abs_link"] {
        check_escape(&c, p);
    }
    for (what, e) in [
        ("stat", c.stat("../x").unwrap_err()),
        ("unlink", c.unlink("abs_link/passwd").unwrap_err()),
        ("mkdir", c.mkdir("/tmp/evil", 0o755).unwrap_err()),
        ("rename", c.rename("sub/in.txt", "../stolen").unwrap_err()),
        ("readdir", c.readdir("sub/up_link").unwrap_err()),
        ("rmdir", c.rmdir("..").unwrap_err()),
    ] {
        assert!(e.errno == libc::EACCES || e.errno == libc::EINVAL, "{what}: {e}");
    }
    let fd = c.open("sub/./../sub/ok_link", libc::O_RDONLY, 0).expect("symlinks inside the root are followed");
    let mut buf = [0u8; 6];
    assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), 6);
    assert_eq!(&buf, b"inside");
}

#[test]
fn fifos_sockets_and_devices_are_refused_without_waiting() {
    let s = TestServer::start(|_| {});
    let fifo = s.path("ff");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid path string.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o666) }, 0);
    let _sock = std::os::unix::net::UnixListener::bind(s.path("sock")).unwrap();
    std::os::unix::fs::symlink("/dev/null", s.path("null_link")).unwrap();
    std::fs::write(s.path("plain"), b"plain").unwrap();
    let c = s.client("fifo");
    // More opens of the FIFO than the server has metadata workers: before,
    // each one waited for a writer, and every client's metadata after them.
    for flags in [libc::O_RDONLY, libc::O_RDONLY, libc::O_RDONLY, libc::O_RDONLY, libc::O_RDONLY, libc::O_RDWR, libc::O_WRONLY] {
        let e = c.open("ff", flags, 0).expect_err("a FIFO is refused");
        assert_eq!(e.errno, libc::ENXIO, "{e}");
        assert!(e.message.contains("FIFO") || flags == libc::O_WRONLY, "{e}");
    }
    let e = c.open("sock", libc::O_RDONLY, 0).expect_err("a socket is refused");
    assert_eq!(e.errno, libc::ENXIO, "{e}");
    // A device reached by a symlink inside the root is refused too (the
    // link leaves the root here, and that is refused first).
    assert!(c.open("null_link", libc::O_RDONLY, 0).is_err());
    // The server still answers: metadata and data.
    assert_eq!(c.stat("plain").unwrap().size, 5);
    let fd = c.open("plain", libc::O_RDONLY, 0).unwrap();
    let mut buf = [0u8; 5];
    assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), 5);
    assert_eq!(&buf, b"plain");
    // The regular file's handle waits as a blocking one does: O_NONBLOCK
    // was cleared (a read of a file the kernel has to fetch is not EAGAIN).
    c.close(fd).unwrap();
}

/// Connect a raw socket and complete the handshake.
fn raw(s: &TestServer) -> UnixStream {
    let mut sock = UnixStream::connect(s.addr().strip_prefix("unix:").unwrap()).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = Vec::new();
    encode_request(0, &Request::Hello(Hello { version: VERSION, app: "raw", weight: 1, client_id: 0, cred: None }), &mut hello).unwrap();
    sock.write_all(&hello).unwrap();
    let (h, _) = read_reply(&mut sock).expect("hello reply");
    assert_eq!(h.opcode, Opcode::HelloOk);
    sock
}

fn read_reply(sock: &mut UnixStream) -> Option<(Header, Vec<u8>)> {
    let mut h = [0u8; HEADER_BYTES];
    sock.read_exact(&mut h).ok()?;
    let h = check_header(&h, FRAME_BYTES_MAX).unwrap().unwrap();
    let mut body = vec![0u8; h.body_len as usize];
    sock.read_exact(&mut body).unwrap();
    Some((h, body))
}

/// A raw connection (handshake done) with `path` open read-only: the
/// socket and the server's handle.
fn raw_with_file(s: &TestServer, path: &str) -> (UnixStream, u64) {
    let mut sock = raw(s);
    let mut open = Vec::new();
    encode_request(1, &Request::Open { path, flags: libc::O_RDONLY, mode: 0 }, &mut open).unwrap();
    sock.write_all(&open).unwrap();
    let (h, body) = read_reply(&mut sock).unwrap();
    let Response::Fd(fd, _) = parse_response(&h, &body).unwrap() else { panic!("no fd") };
    (sock, fd)
}

/// Send `bytes`; expect an error reply with `errno`, then end of stream.
fn check_refused(s: &TestServer, bytes: &[u8], half_close: bool, errno: i32) {
    let mut sock = raw(s);
    sock.write_all(bytes).unwrap();
    if half_close {
        sock.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let (h, body) = read_reply(&mut sock).expect("an error reply");
    match parse_response(&h, &body).unwrap() {
        Response::Error { errno: e, message } => assert_eq!(e, errno, "{message}"),
        other => panic!("expected an error, got {other:?}"),
    }
    let mut rest = Vec::new();
    assert_eq!(sock.read_to_end(&mut rest).unwrap(), 0, "the connection is closed after a malformed frame");
}

#[test]
fn malformed_frames_close_only_their_connection() {
    let s = TestServer::start(|c| c.limits.frame_bytes_max = 1 << 20);
    let bystander = s.client("bystander");
    let fd = bystander.open("b", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let mut h = Vec::new();
    encode_header(Opcode::Stats, 1, 0, &mut h);
    let mut huge = h.clone();
    huge[..4].copy_from_slice(&(2u32 << 20).to_le_bytes());
    check_refused(&s, &huge, false, libc::EMSGSIZE);
    let mut unknown = h.clone();
    unknown[4] = 0x70;
    check_refused(&s, &unknown, false, libc::ENOSYS);
    check_refused(&s, &h[..7], true, libc::EPROTO);
    let mut short_body = Vec::new();
    encode_header(Opcode::Read, 2, 3, &mut short_body);
    short_body.extend_from_slice(&[1, 2, 3]);
    check_refused(&s, &short_body, false, libc::EPROTO);
    // Regression: a body cut short by a half-close is answered too.
    let mut cut = Vec::new();
    encode_header(Opcode::Read, 4, 100, &mut cut);
    cut.extend_from_slice(&[0; 10]);
    check_refused(&s, &cut, true, libc::EPROTO);
    let mut response_as_request = Vec::new();
    encode_response(3, &Response::Ok, &mut response_as_request);
    check_refused(&s, &response_as_request, false, libc::ENOSYS);
    assert_eq!(bystander.pwrite(fd, b"still here", 0).unwrap(), 10);
}

/// Random bytes on fresh connections (before and after the handshake)
/// never bring the server down.
#[test]
fn server_survives_random_bytes() {
    let s = TestServer::start(|_| {});
    let path = s.addr().strip_prefix("unix:").unwrap().to_string();
    for seed in 0..200u64 {
        let mut sock = if seed % 2 == 0 { UnixStream::connect(&path).unwrap() } else { raw(&s) };
        sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = sock.write_all(&pattern(1 + (seed as usize * 37) % 300, seed));
        let _ = sock.shutdown(std::net::Shutdown::Write);
        let mut sink = Vec::new();
        let _ = sock.read_to_end(&mut sink);
    }
    let c = s.client("after");
    let fd = c.open("ok", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, b"fine", 0).unwrap(), 4);
}

#[test]
fn clients_max_at_n_and_n_plus_1() {
    let s = TestServer::start(|c| c.limits.clients_max = 3);
    let held: Vec<Client> = (0..3).map(|i| s.client(&format!("c{i}"))).collect();
    let e = Client::connect(&s.addr()).err().expect("the fourth client is refused");
    assert_eq!(e.kind, ClientErrorKind::Connect);
    assert!(e.message.contains("clients_max = 3"), "{e}");
    drop(held);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.handle.connections() > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    Client::connect(&s.addr()).expect("room again once the others left");
}

#[test]
fn before_the_handshake_frames_are_bounded_at_n_and_n_plus_1() {
    let s = TestServer::start(|_| {});
    let first_frame = |body_len: u32| {
        let mut sock = UnixStream::connect(s.addr().strip_prefix("unix:").unwrap()).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut h = Vec::new();
        encode_header(Opcode::Hello, 1, body_len, &mut h);
        sock.write_all(&h).unwrap();
        // At the bound the server waits for the body: send it (zeros, a
        // Hello it cannot parse); past it, nothing follows the header.
        if HEADER_BYTES as u32 + body_len <= HANDSHAKE_FRAME_BYTES_MAX {
            sock.write_all(&vec![0u8; body_len as usize]).unwrap();
        }
        let (h, body) = read_reply(&mut sock).expect("an error reply");
        let Response::Error { errno, message } = parse_response(&h, &body).unwrap() else { panic!("an error") };
        let mut rest = Vec::new();
        assert_eq!(sock.read_to_end(&mut rest).unwrap(), 0, "closed after the refusal");
        (errno, message.to_string())
    };
    let n = HANDSHAKE_FRAME_BYTES_MAX - HEADER_BYTES as u32;
    let (errno, message) = first_frame(n);
    assert!(errno != libc::EMSGSIZE && !message.contains("frame_bytes_max"), "a frame of exactly the bound is read: {errno} {message}");
    // One byte more, or 32 MiB (under frame_bytes_max, which a client may
    // send once it is known): refused at the header, no body reserved.
    for len in [n + 1, 32 << 20] {
        let (errno, message) = first_frame(len);
        assert_eq!(errno, libc::EMSGSIZE, "{message}");
    }
    // A client that completes its handshake still sends large frames.
    let c = s.client("after");
    let fd = c.open("big", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, &vec![1u8; 1 << 20], 0).unwrap(), 1 << 20);
}

#[test]
fn a_write_past_the_largest_file_offset_is_efbig_and_the_connection_stays() {
    let s = TestServer::start(|_| {});
    let c = s.client("far");
    let fd = c.open("f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    // Before: the frame was refused and the connection closed ("connection
    // lost", EIO). At the bound a write is the kernel's to judge; one past
    // it never leaves the client.
    for offset in [u64::MAX - 1, i64::MAX as u64] {
        let e = c.pwrite(fd, b"xy", offset).unwrap_err();
        assert_eq!(e.errno, libc::EFBIG, "{e}");
    }
    assert_eq!(c.pwrite(fd, b"ok", 0).unwrap(), 2);
    assert_eq!(c.reconnects(), 0, "the connection stayed");
}

#[test]
fn frame_bytes_max_at_n_and_n_plus_1() {
    let max = 4096u32;
    let s = TestServer::start(|c| c.limits.frame_bytes_max = max);
    // No shared region: the writes travel in frames (a region's slot would
    // carry them, rung, whatever their size).
    let c = Client::connect_with(&s.addr(), ConnectOptions { app: Some("frames".into()), shm: false, ..ConnectOptions::default() }).unwrap();
    let fd = c.open("f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let fits = max as usize - HEADER_BYTES - 16;
    assert_eq!(c.pwrite(fd, &vec![7u8; fits], 0).unwrap(), fits, "a frame of exactly frame_bytes_max");
    let e = c.pwrite(fd, &vec![7u8; fits + 1], 0).unwrap_err();
    assert_eq!((e.kind, e.errno), (ClientErrorKind::Server, libc::EMSGSIZE), "{e}");
    assert!(e.message.contains("frame_bytes_max"), "{e}");
    // The server closed the offending connection: the client's next call
    // runs on a new one (transparent recovery).
    assert_eq!(c.reconnects(), 0);
    c.stat("f").unwrap();
    assert_eq!(c.reconnects(), 1, "the offending connection was closed");
}

#[test]
fn inflight_per_connection_max_at_n_and_n_plus_1() {
    let s = TestServer::start(|c| {
        c.limits.inflight_per_connection_max = 4;
        c.device = DeviceKind::Hdd7200;
    });
    std::fs::write(s.path("f"), pattern(1 << 20, 1)).unwrap();
    let c = s.client("inflight");
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    for n in [4usize, 5] {
        let tickets: Vec<_> = (0..n).map(|i| c.submit_read(fd, 4096, (i as u64) * (256 << 10)).unwrap()).collect();
        let results: Vec<_> = tickets.into_iter().map(|t| c.wait_read(t, &mut [0u8; 4096])).collect();
        let refused: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        if n == 4 {
            assert!(refused.is_empty(), "{refused:?}");
        } else {
            assert_eq!(refused.len(), 1, "{results:?}");
            assert_eq!(refused[0].errno, libc::EAGAIN);
            assert!(refused[0].message.contains("inflight_per_connection_max = 4"));
        }
    }
}

#[test]
fn fds_per_connection_max_at_n_and_n_plus_1() {
    let s = TestServer::start(|c| c.limits.fds_per_connection_max = 3);
    let c = s.client("fds");
    let fds: Vec<_> = (0..3).map(|i| c.open(&format!("f{i}"), libc::O_RDWR | libc::O_CREAT, 0o644).unwrap()).collect();
    let e = c.open("f3", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap_err();
    assert_eq!(e.errno, libc::EMFILE, "{e}");
    c.close(fds[0]).unwrap();
    c.open("f3", libc::O_RDWR | libc::O_CREAT, 0o644).expect("a slot again after close");
}

#[test]
fn files_open_max_at_n_and_n_plus_1() {
    let s = TestServer::start(|c| c.limits.files_open_max = 2);
    let (a, b) = (s.client("a"), s.client("b"));
    a.open("x", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    b.open("y", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    b.open("x", libc::O_RDONLY, 0).expect("an already open file shares its slot");
    assert_eq!(s.handle.files_open(), 2);
    assert_eq!(a.open("z", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap_err().errno, libc::ENFILE);
}

#[test]
fn apps_max_at_n_and_n_plus_1() {
    let s = TestServer::start(|c| c.sched_limits.apps_max = 2);
    let held = (s.client("a1"), s.client("a2"), s.client("a1"));
    let a3 = || Client::connect_with(&s.addr(), ConnectOptions { app: Some("a3".into()), ..ConnectOptions::default() });
    let e = a3().err().unwrap();
    assert!(e.message.contains("apps_max = 2"), "{e}");
    // Regression: the bound counts applications connected at once, not ever.
    drop(held.1);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let c = loop {
        match a3() {
            Ok(c) => break c,
            Err(e) => assert!(std::time::Instant::now() < deadline, "a3 still refused after a2 left: {e}"),
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    drop((c, held.0, held.2));
}

/// Regression: 20 `sluice cp` runs used to leave 21 entries, and after
/// `apps_max` distinct names every new application was refused for good.
#[test]
fn five_thousand_short_lived_applications_are_all_admitted() {
    let s = TestServer::start(|_| {});
    for i in 0..5_000 {
        let c = Client::connect_with(&s.addr(), ConnectOptions { app: Some(format!("short-{i}")), ..ConnectOptions::default() })
            .unwrap_or_else(|e| panic!("application {i} refused: {e}"));
        drop(c);
    }
}

/// Regression: paths longer than PATH_BYTES_MAX were cut by the encoder, so
/// unlink/mkdir/rename acted on a shorter name.
#[test]
fn long_paths_are_enametoolong_and_touch_nothing() {
    let s = TestServer::start(|_| {});
    let c = s.client("long");
    let short = "d".repeat(200);
    c.mkdir(&short, 0o755).unwrap();
    // PATH_BYTES_MAX + 1 bytes whose first PATH_BYTES_MAX would name `short/...`.
    let long = format!("{short}/{}", "x".repeat(PATH_BYTES_MAX - short.len()));
    for (what, e) in [
        ("unlink", c.unlink(&long).unwrap_err()),
        ("mkdir", c.mkdir(&long, 0o755).unwrap_err()),
        ("rmdir", c.rmdir(&long).unwrap_err()),
        ("rename", c.rename(&short, &long).unwrap_err()),
        ("open", c.open(&long, libc::O_CREAT | libc::O_WRONLY, 0o644).unwrap_err()),
        ("stat", c.stat(&long).unwrap_err()),
    ] {
        assert_eq!(e.errno, libc::ENAMETOOLONG, "{what}: {e}");
    }
    assert!(s.path(&short).is_dir(), "nothing was renamed or removed");
    assert_eq!(std::fs::read_dir(s.path(&short)).unwrap().count(), 0, "nothing was created");
    // A peer that sends one anyway gets ENAMETOOLONG from the server.
    let mut sock = raw(&s);
    let mut frame = Vec::new();
    encode_request(5, &Request::Unlink { path: &short }, &mut frame).unwrap();
    let extra = PATH_BYTES_MAX + 1 - short.len();
    frame[HEADER_BYTES..HEADER_BYTES + 2].copy_from_slice(&((PATH_BYTES_MAX + 1) as u16).to_le_bytes());
    frame.extend(std::iter::repeat_n(b'x', extra));
    let body_len = (frame.len() - HEADER_BYTES) as u32;
    frame[..4].copy_from_slice(&body_len.to_le_bytes());
    sock.write_all(&frame).unwrap();
    let (h, body) = read_reply(&mut sock).expect("an error reply");
    assert!(matches!(parse_response(&h, &body).unwrap(), Response::Error { errno: libc::ENAMETOOLONG, .. }));
    assert!(s.path(&short).is_dir());
}

#[test]
fn dir_entries_max_at_n_and_n_plus_1() {
    let s = TestServer::start(|c| c.limits.dir_entries_max = 5);
    std::fs::create_dir(s.path("d")).unwrap();
    for i in 0..5 {
        std::fs::write(s.path(&format!("d/{i}")), b"").unwrap();
    }
    let c = s.client("dirs");
    assert_eq!(c.readdir("d").unwrap().len(), 5);
    std::fs::write(s.path("d/5"), b"").unwrap();
    assert_eq!(c.readdir("d").unwrap_err().errno, libc::E2BIG);
}

#[test]
fn bad_weight_is_refused_at_handshake() {
    let s = TestServer::start(|_| {});
    // weight_max (64) is accepted, 65 is not; 0 is the background class.
    let e = Client::connect_with(&s.addr(), ConnectOptions { weight: 65, ..ConnectOptions::default() }).err().unwrap();
    assert_eq!(e.kind, ClientErrorKind::Connect);
    assert!(e.message.contains("weight 65"), "{e}");
    for w in [0, 64] {
        let c = Client::connect_with(&s.addr(), ConnectOptions { weight: w, ..ConnectOptions::default() }).unwrap();
        c.server_stats().unwrap();
    }
}

#[test]
fn absent_server_is_a_clear_error() {
    let e = Client::connect("unix:/nonexistent/sluice.sock").err().unwrap();
    assert_eq!(e.kind, ClientErrorKind::Connect);
    assert!(e.message.starts_with("cannot connect to sluice server at unix:/nonexistent/sluice.sock"), "{e}");
}

#[test]
fn listen_refuses_a_path_that_is_not_a_socket_and_replaces_a_stale_one() {
    let dir = common::temp_dir();
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"keep me").unwrap();
    let cfg = sluice_server::ServerConfig::new(dir.path(), sluice_server::Listen::Unix(file.clone()));
    let e = sluice_server::Server::start(cfg).err().expect("refused");
    assert!(e.message.contains("is not a socket"), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
    let sock = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    let cfg = sluice_server::ServerConfig::new(dir.path(), sluice_server::Listen::Unix(sock));
    let mut h = sluice_server::Server::start(cfg).expect("a stale socket is replaced");
    Client::connect(h.addr()).unwrap();
    h.shutdown().unwrap();
}

#[test]
fn tcp_listener_on_loopback_serves() {
    let root = common::temp_dir();
    let mut cfg = sluice_server::ServerConfig::new(root.path(), sluice_server::Listen::parse("tcp:127.0.0.1:0").unwrap());
    // Root over TCP would be nobody (root squash) and could not write the
    // 0700 temporary root; the key comes from the default path.
    cfg.squash = sluice_server::Squash::None;
    let mut h = sluice_server::Server::start(cfg).unwrap();
    assert!(h.addr().starts_with("tcp:127.0.0.1:"), "{}", h.addr());
    let c = Client::connect(h.addr()).unwrap();
    let fd = c.open("t", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, b"over tcp", 0).unwrap(), 8);
    drop(c);
    h.shutdown().unwrap();
    assert_eq!(std::fs::read(root.path().join("t")).unwrap(), b"over tcp");
}

/// A drain does not wait for clients that connected but never said hello,
/// admitted or over `clients_max`.
#[test]
fn shutdown_does_not_wait_for_silent_connections() {
    let mut s = TestServer::start(|c| c.limits.clients_max = 1);
    let path = s.addr().strip_prefix("unix:").unwrap().to_string();
    let silent: Vec<_> = (0..3).map(|_| UnixStream::connect(&path).unwrap()).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.handle.connections() < 3 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let started = std::time::Instant::now();
    s.handle.shutdown().unwrap();
    assert!(started.elapsed() < Duration::from_secs(2), "drain took {:?}", started.elapsed());
    drop(silent);
}

/// The connection table holds `clients_max` connections and as many more
/// waiting for their handshake (N), each to be told at its Hello that the
/// server is full; one more (N+1) is told at once and closed, and the
/// table does not grow.
#[test]
fn past_twice_clients_max_the_oldest_handshake_gives_way() {
    let s = TestServer::start(|c| c.limits.clients_max = 2);
    let served: Vec<Client> = (0..2).map(|i| s.client(&format!("c{i}"))).collect();
    let mut waiting: Vec<UnixStream> = (0..2).map(|_| connect_raw(&s)).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.handle.connections() < 4 {
        assert!(std::time::Instant::now() < deadline, "the waiting sockets were not kept: {}", s.handle.connections());
        std::thread::sleep(Duration::from_millis(5));
    }
    // N: twice clients_max in the table. N + 1: the socket that has waited
    // longest for its handshake is told why and closed; the table stays.
    let _newest = connect_raw(&s);
    expect_error_then_close(&mut waiting[0], libc::EBUSY, "handshake not done");
    // The newest goes in just after the oldest was told.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.handle.connections() != 4 {
        assert!(std::time::Instant::now() < deadline && s.handle.connections() <= 4, "{} connections", s.handle.connections());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(s.handle.handshakes_evicted(), 1);
    // With clients_max served, a client is refused at its handshake.
    let e = Client::connect(&s.addr()).err().expect("a client past the bound is refused");
    assert!(e.message.contains("server full"), "{e}");
    served[0].stat("").unwrap();
}

/// The audit's lockout: sockets that connect and say nothing (over TCP,
/// without the key) took the admission slots, and every client was
/// refused "server full" until they timed out. Now only a finished
/// handshake takes a slot, and silent sockets give way to newer ones.
#[test]
fn silent_sockets_do_not_lock_clients_out() {
    let s = TestServer::start(|c| c.limits.clients_max = 2);
    let _silent: Vec<UnixStream> = (0..8).map(|_| connect_raw(&s)).collect();
    let a = s.client("a");
    let b = s.client("b");
    a.stat("").unwrap();
    b.stat("").unwrap();
    let e = Client::connect(&s.addr()).err().expect("a third client is past clients_max");
    assert!(e.message.contains("server full"), "{e}");
    assert!(s.handle.connections() <= 4, "{} connections", s.handle.connections());
}

/// The server's reason for closing `sock` (an `Error` with `errno` whose
/// message contains `says`), then the end of the stream.
fn expect_error_then_close(sock: &mut UnixStream, errno: i32, says: &str) {
    let (h, body) = read_reply(sock).expect("the reason before the close");
    match parse_response(&h, &body).unwrap() {
        Response::Error { errno: e, message } => {
            assert_eq!(e, errno, "{message}");
            assert!(message.contains(says), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let mut rest = Vec::new();
    assert_eq!(sock.read_to_end(&mut rest).unwrap(), 0, "closed");
}

/// A raw Unix connection to `s`, with a 10 s read timeout.
fn connect_raw(s: &TestServer) -> UnixStream {
    let sock = UnixStream::connect(s.addr().strip_prefix("unix:").unwrap()).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    sock
}

/// Regression: 1,024 silent sockets locked everyone out. A socket that says
/// nothing is told so and closed after `handshake_timeout_ms`.
#[test]
fn handshake_timeout_frees_the_slots_of_silent_sockets() {
    let s = TestServer::start(|c| {
        c.limits.clients_max = 2;
        c.limits.handshake_timeout_ms = 400;
    });
    let silent: Vec<_> = (0..2).map(|_| connect_raw(&s)).collect();
    let started = std::time::Instant::now();
    for mut sock in silent {
        let (h, body) = read_reply(&mut sock).expect("an error reply before the close");
        assert!(matches!(parse_response(&h, &body).unwrap(), Response::Error { errno: libc::ETIMEDOUT, .. }));
        let mut rest = Vec::new();
        assert_eq!(sock.read_to_end(&mut rest).unwrap(), 0, "closed");
    }
    assert!(started.elapsed() >= Duration::from_millis(350), "not before the timeout: {:?}", started.elapsed());
    // A client that says Hello within the timeout is served (N), whatever
    // the silent ones did.
    let c = s.client("after-the-silent-ones");
    c.stat("").unwrap();
}

/// An established connection silent for `idle_timeout_s` with nothing in
/// flight is closed; the client reconnects on its next call unharmed.
#[test]
fn idle_timeout_closes_a_silent_connection_and_the_client_recovers() {
    let s = TestServer::start(|c| c.limits.idle_timeout_s = 1);
    std::fs::write(s.path("f"), b"kept open").unwrap();
    let c = s.client("idle");
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    c.stat("f").unwrap();
    assert_eq!(c.reconnects(), 0, "busy within the timeout: kept");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.handle.connections() > 0 {
        assert!(std::time::Instant::now() < deadline, "the idle connection was not closed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut buf = [0u8; 9];
    assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), 9, "the handle was reopened");
    assert_eq!((&buf, c.reconnects()), (b"kept open", 1));
}

/// The header of a write whose body trickles in, then stops.
fn stalled_write(s: &TestServer, body_len: usize, sent: usize) -> UnixStream {
    let mut sock = raw(s);
    let mut frame = Vec::new();
    encode_header(Opcode::Write, 9, body_len as u32, &mut frame);
    frame.extend_from_slice(&3u64.to_le_bytes()); // fd
    frame.extend_from_slice(&0u64.to_le_bytes()); // offset
    frame.resize(HEADER_BYTES + sent, 0x5A);
    sock.write_all(&frame).unwrap();
    sock
}

/// Wait until the server holds `want` bytes in partial frames.
fn wait_partial(s: &TestServer, ok: impl Fn(u64) -> bool, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ok(s.handle.partial_bytes()) {
        assert!(std::time::Instant::now() < deadline, "{what}: partial bytes {}", s.handle.partial_bytes());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Regression: a header announcing 64 MiB made the server allocate 64 MiB at
/// once, and a stalled body pinned it forever.
#[test]
fn a_body_is_held_as_it_arrives_and_a_stalled_one_times_out() {
    let s = TestServer::start(|c| {
        c.limits.frame_bytes_max = 8 << 20;
        c.limits.frame_stall_ms = 500;
    });
    let mut sock = stalled_write(&s, (8 << 20) - 64, (2 << 20) + 4096);
    // Three 1 MiB chunks taken (two filled, one filling), not eight.
    wait_partial(&s, |b| b == 3 << 20, "held as it arrives");
    // 500 ms, plus 8 s for 8 MiB at the 1 MiB/s rate floor: then
    // ETIMEDOUT and closed.
    let (h, body) = read_reply(&mut sock).expect("an error reply");
    match parse_response(&h, &body).unwrap() {
        Response::Error { errno, message } => assert_eq!(errno, libc::ETIMEDOUT, "{message}"),
        other => panic!("{other:?}"),
    }
    wait_partial(&s, |b| b == 0, "given back");
}

/// A header cut short: nothing before `frame_stall_ms`, then ETIMEDOUT
/// and the connection closed.
#[test]
fn a_stalled_frame_header_times_out() {
    let s = TestServer::start(|c| c.limits.frame_stall_ms = 600);
    let mut sock = raw(&s);
    let mut frame = Vec::new();
    encode_request(1, &Request::Stat { path: "" }, &mut frame).unwrap();
    sock.write_all(&frame[..HEADER_BYTES - 1]).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut b = [0u8; 1];
    let early = sock.read(&mut b).unwrap_err();
    assert!(matches!(early.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "an answer before the stall time: {early}");
    sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    expect_error_then_close(&mut sock, libc::ETIMEDOUT, "header stalled");
}

/// Regression: 60 stalled 16 MiB bodies pinned 1 GB. Each body reserves its
/// length from the server-wide budget when its header arrives (allocating
/// as bytes come): N bodies fit; the N+1st is not read until one drains;
/// whole small frames need no budget and are served meanwhile.
#[test]
fn partial_bytes_max_at_n_and_n_plus_1() {
    let s = TestServer::start(|c| {
        c.limits.frame_bytes_max = 2 << 20;
        c.limits.partial_bytes_max = 4 << 20;
    });
    let body_len = (2 << 20) - 64;
    let a = stalled_write(&s, body_len, (3 << 20) / 2);
    wait_partial(&s, |b| b == body_len as u64, "a's body allocated as it arrived");
    let b = stalled_write(&s, body_len, (3 << 20) / 2);
    wait_partial(&s, |h| h == 2 * body_len as u64, "b's too: the budget is spent (N)");
    // (Less than a socket buffer, so this write does not block while the
    // server leaves it unread.)
    let mut third = stalled_write(&s, body_len, 32 << 10);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(s.handle.partial_bytes(), 2 * body_len as u64, "the N+1st body is not taken in");
    let c = s.client("bystander");
    let fd = c.open("f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, &[2u8; 4096], 0).unwrap(), 4096, "a whole small frame is served meanwhile");
    drop(a);
    wait_partial(&s, |h| h == body_len as u64 + (1 << 20), "a's bytes drained: the third body is taken in (its first chunk)");
    // The rest of the third body arrives: its write is answered (bad
    // handle here, but answered, and its budget given back).
    third.write_all(&vec![0x5A; body_len - (32 << 10)]).unwrap();
    let (h, body) = read_reply(&mut third).expect("the third write is answered");
    assert!(matches!(parse_response(&h, &body).unwrap(), Response::Error { errno: libc::EBADF, .. }));
    drop(b);
    wait_partial(&s, |h| h == 0, "all given back");
}

/// Regression: a client that did not read its replies grew the server to
/// 2.45 GB. Now its connection stops being read at `reply_bytes_max`, and
/// every reply still arrives once it reads.
#[test]
fn a_client_that_does_not_read_its_replies_holds_at_most_reply_bytes_max() {
    let max = 4u64 << 20;
    let s = TestServer::start(|c| {
        c.limits.reply_bytes_max = max;
        c.limits.frame_bytes_max = 2 << 20;
    });
    std::fs::write(s.path("f"), pattern(1 << 20, 3)).unwrap();
    let (mut sock, fd) = raw_with_file(&s, "f");
    // 64 reads of 1 MiB, sent by a thread (the server stops reading them
    // past the bound), replies left unread for a while.
    let requests = 64u64;
    let mut sender = sock.try_clone().unwrap();
    let send = std::thread::spawn(move || {
        for i in 0..requests {
            let mut f = Vec::new();
            encode_request(10 + i, &Request::Read { fd, offset: 0, len: 1 << 20 }, &mut f).unwrap();
            sender.write_all(&f).unwrap();
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut peak = 0;
    // Each 1 MiB read reserves its data and its reply frame: three fit.
    while std::time::Instant::now() < deadline && peak < max - (1 << 20) {
        peak = peak.max(s.handle.reply_bytes());
        assert!(s.handle.reply_bytes() <= max, "{} > reply_bytes_max", s.handle.reply_bytes());
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(s.handle.reply_bytes() <= max, "held {} with nobody reading", s.handle.reply_bytes());
    assert!(peak >= max - (1 << 20), "the bound was reached ({peak}): the check would prove nothing");
    // Backpressure, not loss: every reply arrives, whole.
    for _ in 0..requests {
        let (h, body) = read_reply(&mut sock).expect("a reply");
        assert!(matches!(parse_response(&h, &body).unwrap(), Response::Data(d) if d.len() == 1 << 20));
    }
    send.join().unwrap();
    drop(sock);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.handle.reply_bytes() > 0 {
        assert!(std::time::Instant::now() < deadline, "{} bytes never given back", s.handle.reply_bytes());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The event loop reads many frames per system call; a metadata call
/// pauses its connection until it is answered, so frames pipelined behind
/// it (here a read of the file it opens, and a close) see its effect.
#[test]
fn pipelined_frames_behind_a_metadata_call_see_its_effect() {
    let s = TestServer::start(|_| {});
    std::fs::write(s.path("f"), b"pipelined").unwrap();
    let mut sock = raw(&s);
    let mut frames = Vec::new();
    encode_request(1, &Request::Open { path: "f", flags: libc::O_RDONLY, mode: 0 }, &mut frames).unwrap();
    encode_request(2, &Request::Read { fd: 3, offset: 0, len: 9 }, &mut frames).unwrap();
    encode_request(3, &Request::Stat { path: "f" }, &mut frames).unwrap();
    encode_request(4, &Request::Close { fd: 3 }, &mut frames).unwrap();
    encode_request(5, &Request::Read { fd: 3, offset: 0, len: 9 }, &mut frames).unwrap();
    sock.write_all(&frames).unwrap();
    let mut got = std::collections::HashMap::new();
    for _ in 0..5 {
        let (h, body) = read_reply(&mut sock).expect("a reply to every frame");
        got.insert(h.request_id, format!("{:?}", parse_response(&h, &body).unwrap()));
    }
    assert!(got[&1].starts_with("Fd(3, "), "{}", got[&1]);
    assert!(got[&2].contains("Data([112, 105, 112"), "the read behind the open found its handle: {}", got[&2]);
    assert!(got[&3].starts_with("Stat("), "{}", got[&3]);
    assert_eq!(got[&4], "Ok");
    assert!(got[&5].contains(&format!("errno: {}", libc::EBADF)), "the read behind the close did not: {}", got[&5]);
}

/// A client that stops reading its replies for longer than
/// `write_timeout_s` loses its connection and its queued replies; the
/// server gives their bytes back and serves everybody else meanwhile.
#[test]
fn write_timeout_drops_a_client_that_does_not_read() {
    let s = TestServer::start(|c| c.limits.write_timeout_s = 1);
    std::fs::write(s.path("f"), pattern(1 << 20, 5)).unwrap();
    let (mut sock, fd) = raw_with_file(&s, "f");
    let mut reads = Vec::new();
    for i in 0..32u64 {
        encode_request(10 + i, &Request::Read { fd, offset: 0, len: 1 << 20 }, &mut reads).unwrap();
    }
    sock.write_all(&reads).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.handle.reply_bytes() == 0 {
        assert!(std::time::Instant::now() < deadline, "the replies never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    let other = s.client("reader");
    let ofd = other.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(other.pread(ofd, &mut buf, 0).unwrap(), 4096, "others are served while it does not read");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.handle.reply_bytes() > 0 || s.handle.connections() > 1 {
        assert!(std::time::Instant::now() < deadline, "still holding {} bytes, {} connections", s.handle.reply_bytes(), s.handle.connections());
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(sock);
}

/// Replies of every kind count against `reply_bytes_max`: a client that
/// pipelines `Stats` requests (each answer far larger than its request)
/// and reads none of them stops being read once the bound is passed, and
/// every answer still arrives when it reads.
#[test]
fn unread_metadata_replies_are_bounded_too() {
    let max = 64u64 << 10;
    let s = TestServer::start(|c| c.limits.reply_bytes_max = max);
    let _apps: Vec<_> = (0..40).map(|i| s.client(&format!("application-with-a-long-name-{i}"))).collect();
    let mut sock = raw(&s);
    let requests = 2000u64;
    let mut frames = Vec::new();
    for i in 0..requests {
        encode_request(100 + i, &Request::Stats, &mut frames).unwrap();
    }
    let mut sender = sock.try_clone().unwrap();
    let send = std::thread::spawn(move || sender.write_all(&frames).unwrap());
    std::thread::sleep(Duration::from_millis(500));
    let held = s.handle.reply_bytes();
    // One answer is about 40 x 300 bytes: 2,000 of them would be 24 MB.
    assert!(held > 0 && held <= max + (64 << 10), "held {held} with the client not reading");
    for _ in 0..requests {
        let (h, body) = read_reply(&mut sock).expect("every answer arrives");
        assert!(matches!(parse_response(&h, &body).unwrap(), Response::Stats(_)));
    }
    send.join().unwrap();
}
