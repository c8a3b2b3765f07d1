//! The connection's unit tests, against a socket answered by hand.

use super::recv::LENT_PENDING_MAX;
use super::*;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;

/// Send one byte with `fd` attached, as the server sends a lease.
fn send_fd(s: &UnixStream, fd: RawFd) {
    let mut cmsg = [0u64; 4];
    let byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_ptr() as *mut _, iov_len: 1 };
    // SAFETY: an all-zero msghdr is valid; buffers live for the call;
    // the control message is built within `cmsg`.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), fd);
        assert_eq!(libc::sendmsg(s.as_raw_fd(), &msg, 0), 1);
    }
}

/// A connection to a socket the test answers by hand: the client side,
/// and the server's end.
pub(crate) fn by_hand() -> (Conn, UnixStream, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("sluice-conn-{}-{:?}", std::process::id(), std::thread::current().id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("s.sock");
    let _ = std::fs::remove_file(&path);
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let patience = std::sync::Arc::new(Patience { timeout: Duration::from_secs(10), soft: false, warned: AtomicBool::new(false) });
    let c = Conn::open(&format!("unix:{}", path.display()), patience).unwrap();
    let (server, _) = l.accept().unwrap();
    (c, server, dir)
}

pub(crate) fn answer(server: &mut UnixStream, id: u64, resp: &sluice_proto::Response<'_>) {
    use std::io::Write;
    let mut out = Vec::new();
    sluice_proto::encode_response(id, resp, &mut out);
    server.write_all(&out).unwrap();
}

/// Request id 0 is never sent: an error under it is the server's
/// reason for closing. Replies to requests in flight that follow it
/// still reach their callers; the others are told the reason.
#[test]
fn the_servers_reason_for_closing_reaches_the_caller() {
    let (c, mut server, dir) = by_hand();
    let answered = c.send(&Request::Stat { path: "a" }).unwrap();
    let id = c.send(&Request::Stat { path: "" }).unwrap();
    answer(&mut server, 0, &sluice_proto::Response::Error { errno: libc::EBUSY, message: "server full (clients_max = 2)" });
    answer(&mut server, answered, &sluice_proto::Response::Count(7));
    drop(server);
    assert!(matches!(c.wait(answered, None).unwrap(), Reply::Count(7)), "a reply after the reason is delivered");
    let e = c.wait(id, None).unwrap_err();
    assert_eq!(e.kind, ClientErrorKind::Disconnected);
    assert!(e.message.contains("server full (clients_max = 2)"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A caller gone while a hard connection waits for a silent server:
/// the call fails with EINTR within a slice, the reply that comes
/// later is dropped, and the connection goes on.
#[test]
fn a_caller_gone_gives_its_wait_up_and_its_late_reply_is_dropped() {
    let (c, mut server, dir) = by_hand();
    let c = std::sync::Arc::new(c);
    let given_up = c.send(&Request::Stat { path: "a" }).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::sync::Arc::clone(&c);
    std::thread::spawn(move || {
        let _gone = crate::abandon::Abandon::when(|_| true, 0);
        let _ = tx.send(waiter.wait(given_up, None).map(|_| ()));
    });
    // Polled with a bound: a wait that never gives up fails the test.
    let e = rx.recv_timeout(Duration::from_secs(2)).expect("the wait gave up within a slice").unwrap_err();
    assert_eq!((e.kind, e.errno), (ClientErrorKind::Interrupted, libc::EINTR), "{e}");
    let next = c.send(&Request::Stat { path: "b" }).unwrap();
    answer(&mut server, given_up, &sluice_proto::Response::Count(1));
    answer(&mut server, next, &sluice_proto::Response::Count(2));
    assert!(matches!(c.wait(next, None).unwrap(), Reply::Count(2)));
    assert!(c.read.lock().stash.is_empty(), "the late reply was kept");
    let _ = std::fs::remove_dir_all(dir);
}

/// A reply to a request never sent would sit in the stash for good:
/// it breaks the connection instead; replies to requests sent wait
/// there for their caller.
#[test]
fn a_reply_to_a_request_never_sent_breaks_the_connection() {
    let (c, mut server, dir) = by_hand();
    let first = c.send(&Request::Stat { path: "a" }).unwrap();
    let second = c.send(&Request::Stat { path: "b" }).unwrap();
    answer(&mut server, second, &sluice_proto::Response::Count(2));
    answer(&mut server, first, &sluice_proto::Response::Count(1));
    assert!(matches!(c.wait(first, None).unwrap(), Reply::Count(1)), "the later reply was stashed on the way");
    assert!(matches!(c.wait(second, None).unwrap(), Reply::Count(2)));
    let third = c.send(&Request::Stat { path: "c" }).unwrap();
    answer(&mut server, third + 5, &sluice_proto::Response::Count(9));
    let e = c.wait(third, None).unwrap_err();
    assert!(e.message.contains("never sent"), "{e}");
    assert!(c.read.lock().stash.is_empty());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn lent_pending_max_at_n_and_n_plus_1() {
    let (server, client) = UnixStream::pair().unwrap();
    let mut rx = Rx { stream: Stream::Unix(client), lent: VecDeque::new(), timeout_ms: 5_000, poll_first: false };
    let null = std::fs::File::open("/dev/null").unwrap();
    let mut b = [0u8; 16];
    for _ in 0..LENT_PENDING_MAX {
        send_fd(&server, null.as_raw_fd());
    }
    // One message's descriptors per receive.
    for _ in 0..LENT_PENDING_MAX {
        assert_eq!(rx.recv(&mut b).unwrap(), 1);
    }
    assert_eq!(rx.lent.len(), LENT_PENDING_MAX, "N descriptors held for their replies");
    send_fd(&server, null.as_raw_fd());
    let e = rx.recv(&mut b).unwrap_err();
    assert!(e.to_string().contains("more descriptors"), "N+1 breaks the connection: {e}");
    // A claimed one makes room again.
    rx.lent.pop_front();
    rx.lent.pop_front();
    send_fd(&server, null.as_raw_fd());
    assert_eq!(rx.recv(&mut b).unwrap(), 1);
}

/// A process with no descriptor free: the kernel drops the one a
/// message carries, and its reply goes on without it (the connection
/// broke before, and the call waited out the patience).
#[test]
fn a_descriptor_dropped_for_want_of_room_leaves_a_hole_not_a_broken_connection() {
    // Lowering the descriptor limit would fail other tests' opens on
    // the harness's threads: the body runs alone, in a child process
    // of this binary.
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "conn::tests::descriptor_hole_alone", "--test-threads=1", "--nocapture"])
        .env("SLUICE_TEST_DESCRIPTOR_HOLE", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("HOLE-OK"), "{text}{}", String::from_utf8_lossy(&out.stderr));
}

/// The body of the test above; does nothing unless that test runs it.
#[test]
fn descriptor_hole_alone() {
    if std::env::var_os("SLUICE_TEST_DESCRIPTOR_HOLE").is_none() {
        return;
    }
    let (server, client) = UnixStream::pair().unwrap();
    let mut rx = Rx { stream: Stream::Unix(client), lent: VecDeque::new(), timeout_ms: 5_000, poll_first: false };
    let null = std::fs::File::open("/dev/null").unwrap();
    send_fd(&server, null.as_raw_fd());
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on valid structs; the limit goes back.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    // The lowest free descriptor's number as the limit: none is free.
    let lowest = std::fs::File::open("/dev/null").unwrap();
    let low = libc::rlimit { rlim_cur: lowest.as_raw_fd() as libc::rlim_t, rlim_max: lim.rlim_max };
    drop(lowest);
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) };
    let mut b = [0u8; 16];
    let r = rx.recv(&mut b);
    // SAFETY: as above.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(r.unwrap(), 1);
    assert!(matches!(rx.lent.pop_front(), Some(None)), "a hole where the descriptor was");
    println!("HOLE-OK");
}

#[test]
fn a_long_wait_sends_the_next_through_poll_which_keeps_the_patience() {
    use std::io::Write;
    let (mut server, client) = UnixStream::pair().unwrap();
    let mut rx = Rx { stream: Stream::Unix(client), lent: VecDeque::new(), timeout_ms: 50, poll_first: false };
    let mut b = [0u8; 16];
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        server.write_all(b"x").unwrap();
        server
    });
    assert_eq!(rx.recv(&mut b).unwrap(), 1);
    assert!(rx.poll_first, "a 20 ms wait is past POLL_AFTER_WAIT");
    let _server = late.join().unwrap();
    // Nothing comes: the poll gives up at the patience, as the
    // socket's receive timeout does for `recvmsg`.
    let t0 = Instant::now();
    let e = rx.recv(&mut b).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    assert!(t0.elapsed() >= Duration::from_millis(45), "waited {:?}", t0.elapsed());
}
