//! Cache leases: a local client's read of a range already in
//! the page cache is answered "read it yourself" with a descriptor lent
//! once per handle and connection; reads inside the lease send nothing.
//! Never for a writable handle, an O_DIRECT server, an emulated device, or
//! with leases off; an uncached range is scheduled as before.

mod common;

use std::io::Write;
use std::os::fd::AsRawFd;

use common::{pattern, raw_call as call, within_5s, TestServer};
use sluice_client::{Client, ConnectOptions};
use sluice_proto::*;
use sluice_server::DeviceKind;

fn client(s: &TestServer, app: &str, leases: bool) -> Client {
    Client::connect_with(&s.addr(), ConnectOptions { app: Some(app.into()), leases, ..ConnectOptions::default() }).expect("client connects")
}

/// `(scheduled read requests, bytes leased)` of `app`.
fn counts(c: &Client, app: &str) -> (u64, u64) {
    let st = c.server_stats().unwrap();
    let a = st.app(app).expect("the app is known");
    (a.requests, a.bytes_leased)
}

/// Whether this kernel tells what is cached (`cachestat`, Linux 6.5).
fn kernel_has_cachestat() -> bool {
    let f = std::fs::File::open("/proc/self/exe").unwrap();
    let range = [0u64, 4096];
    let mut out = [0u64; 5];
    // SAFETY: range and out are valid for the call.
    let r = unsafe { libc::syscall(451, f.as_raw_fd(), range.as_ptr(), out.as_mut_ptr(), 0u32) };
    r == 0
}

#[test]
fn a_cached_range_is_leased_and_reads_inside_it_send_nothing() {
    if !kernel_has_cachestat() {
        eprintln!("no cachestat on this kernel: leases are never granted, nothing to test");
        return;
    }
    let s = TestServer::start(|_| {});
    let data = pattern(4 << 20, 21);
    std::fs::write(s.path("f"), &data).unwrap();
    let c = client(&s, "lessee", true);
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), 1 << 20);
    assert_eq!(buf, data[..1 << 20]);
    let (requests, leased) = counts(&c, "lessee");
    assert_eq!(requests, 0, "a cached read is not scheduled");
    assert_eq!(leased, 4 << 20, "the lease reaches ahead to the end of the file (within lease_bytes_max)");
    // Inside the lease: no message at all, data still right, short at the end.
    for at in [4096usize, (1 << 20) + 17, (4 << 20) - 100] {
        let n = c.pread(fd, &mut buf, at as u64).unwrap();
        assert_eq!(n, (1 << 20).min((4 << 20) - at));
        assert_eq!(&buf[..n], &data[at..at + n], "leased read at {at}");
    }
    let tickets: Vec<_> = (0..4u64).map(|i| c.submit_read(fd, 1 << 20, i << 20).unwrap()).collect();
    for (i, t) in tickets.into_iter().enumerate() {
        assert_eq!(c.wait_read(t, &mut buf).unwrap(), 1 << 20);
        assert_eq!(buf, data[i << 20..(i + 1) << 20], "pipelined leased read {i}");
    }
    assert_eq!(counts(&c, "lessee"), (0, 4 << 20), "nothing more was asked of the server");
    // Past the end of the file: the server answers (no lease there).
    assert_eq!(c.pread(fd, &mut buf, 4 << 20).unwrap(), 0);
}

#[test]
fn lease_bytes_max_at_n_and_n_plus_1() {
    if !kernel_has_cachestat() {
        eprintln!("no cachestat on this kernel: nothing to test");
        return;
    }
    let n: u64 = 2 << 20;
    let s = TestServer::start(|c| c.limits.lease_bytes_max = n);
    std::fs::write(s.path("f"), pattern(8 << 20, 2)).unwrap();
    let c = client(&s, "bound", true);
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 64 << 10];
    c.pread(fd, &mut buf, 0).unwrap();
    assert_eq!(counts(&c, "bound"), (0, n), "a lease covers lease_bytes_max");
    // The last byte of the lease is inside it, the next one is not. The
    // read of byte N-1 is past the lease's middle but does not continue
    // the read before, so it asks for no lease ahead (`Client::lease_ahead`:
    // only sequential readers do).
    c.pread(fd, &mut buf[..1], n - 1).unwrap();
    assert_eq!(counts(&c, "bound"), (0, n), "byte N-1 is read under the lease, and nothing is asked ahead");
    // A read reaching byte N from N-1 asks again.
    c.pread(fd, &mut buf[..2], n - 1).unwrap();
    assert_eq!(counts(&c, "bound").1, 2 * n, "a read reaching byte N asks again (and gets a new lease)");
}

/// Keep only `[from, to)` of `path` in the page cache: the whole file
/// written back and dropped, then that range read without read-ahead.
/// False where the file system keeps its pages (tmpfs).
fn cache_only(path: &std::path::Path, from: u64, to: u64) -> bool {
    let f = std::fs::File::open(path).unwrap();
    f.sync_all().unwrap();
    let fd = f.as_raw_fd();
    // SAFETY: plain advice and a read into a buffer of the right length,
    // on a descriptor we hold.
    unsafe {
        assert_eq!(libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED), 0);
        assert_eq!(libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_RANDOM), 0);
        let mut b = vec![0u8; (to - from) as usize];
        assert_eq!(libc::pread(fd, b.as_mut_ptr().cast(), b.len(), from as libc::off_t), b.len() as isize);
    }
    sluice_net::cache::all_cached(fd, to, 4096) == Some(false)
}

/// A small read whose pages are cached but nothing past them (a strided
/// reader of cold data) is read by the server, but for the handle's first
/// (which lends the descriptor): a lease of just the request would cost
/// the same round trip and a `pread` more. A lease
/// reaches only as far as the pages are cached, and a large read gets
/// one even when it is all the lease covers.
#[test]
fn a_lease_covers_the_cached_prefix_and_a_short_one_is_not_given_for_a_small_read() {
    if !kernel_has_cachestat() {
        eprintln!("no cachestat on this kernel: nothing to test");
        return;
    }
    let s = TestServer::start(|_| {});
    let data = pattern(8 << 20, 9);
    std::fs::write(s.path("f"), &data).unwrap();
    let c = client(&s, "strided", true);
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 512 << 10];
    if !cache_only(&s.path("f"), 1 << 20, (1 << 20) + 4096) {
        eprintln!("the file system keeps its pages: nothing to test");
        return;
    }
    // The handle's first lease lends the descriptor: granted even when
    // it is just the request (the FUSE mount asks for the descriptor so).
    assert_eq!(c.pread(fd, &mut buf[..4096], 1 << 20).unwrap(), 4096);
    assert_eq!(buf[..4096], data[1 << 20..(1 << 20) + 4096]);
    assert_eq!(counts(&c, "strided"), (0, 4096), "the first: leased, lending the descriptor");
    // The next such read (the reader's next stride): read by the server.
    let at = (1 << 20) + (128 << 10);
    assert!(cache_only(&s.path("f"), at, at + 4096));
    assert_eq!(c.pread(fd, &mut buf[..4096], at).unwrap(), 4096);
    assert_eq!(buf[..4096], data[at as usize..at as usize + 4096]);
    assert_eq!(counts(&c, "strided"), (1, 4096), "scheduled, not leased");
    // 512 KiB cached from 2 MiB: a 4 KiB read there is leased up to the
    // first look past it that finds a page missing (the request, then
    // 256 KiB), and reads inside it send nothing.
    assert!(cache_only(&s.path("f"), 2 << 20, (2 << 20) + (512 << 10)));
    assert_eq!(c.pread(fd, &mut buf[..4096], 2 << 20).unwrap(), 4096);
    assert_eq!(counts(&c, "strided"), (1, 2 * 4096 + (256 << 10)));
    assert_eq!(c.pread(fd, &mut buf[..4096], (2 << 20) + (128 << 10)).unwrap(), 4096);
    assert_eq!(buf[..4096], data[(2 << 20) + (128 << 10)..(2 << 20) + (132 << 10)]);
    assert_eq!(counts(&c, "strided"), (1, 2 * 4096 + (256 << 10)), "inside the lease: nothing sent");
    // A 512 KiB read of exactly what is cached: leased, though the lease
    // is just the request.
    assert_eq!(c.pread(fd, &mut buf, 2 << 20).unwrap(), 512 << 10);
    assert_eq!(buf, data[2 << 20..(2 << 20) + (512 << 10)]);
    assert_eq!(counts(&c, "strided"), (1, 2 * 4096 + (256 << 10) + (512 << 10)));
}

#[test]
fn a_sequential_reader_gets_each_next_lease_ahead_and_wastes_none() {
    if !kernel_has_cachestat() {
        eprintln!("no cachestat on this kernel: nothing to test");
        return;
    }
    // Leases of 2 MiB over an 8 MiB file read in 1 MiB reads: each lease
    // is asked for while the one before is being read, taken when the
    // reader reaches it, and together they cover the file once.
    let s = TestServer::start(|c| c.limits.lease_bytes_max = 2 << 20);
    let data = pattern(8 << 20, 5);
    std::fs::write(s.path("f"), &data).unwrap();
    let c = client(&s, "seq", true);
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..8usize {
        assert_eq!(c.pread(fd, &mut buf, (i << 20) as u64).unwrap(), 1 << 20);
        assert_eq!(buf, data[i << 20..(i + 1) << 20], "read {i}");
    }
    assert_eq!(c.pread(fd, &mut buf, 8 << 20).unwrap(), 0, "end of file");
    // One scheduled request: the read asked ahead at the end of the file
    // (nothing cached there to lease), answered with a lease once its
    // dispatch had populated the page cache (with nothing: it is past the
    // end), under which the last read reads the end of the file itself.
    assert_eq!(counts(&c, "seq"), (1, 8 << 20), "no lease granted twice, nothing else scheduled");
    c.close(fd).unwrap();
}

/// A lease asked ahead (`Client::lease_ahead`) that the server answered
/// with data, its range not all cached, is what the file held then: a
/// write acknowledged before the reader reaches that range must be seen,
/// as must a file grown since past an end of file the answer said.
#[test]
fn data_asked_ahead_is_not_served_after_a_write_acknowledged_since() {
    if !kernel_has_cachestat() {
        eprintln!("no cachestat on this kernel: nothing to test");
        return;
    }
    let s = TestServer::start(|_| {});
    std::fs::write(s.path("f"), vec![b'o'; 4 << 20]).unwrap();
    if !cache_only(&s.path("f"), 0, 2 << 20) {
        eprintln!("the file system keeps its pages: nothing to test");
        return;
    }
    let reader = client(&s, "reader", true);
    let writer = client(&s, "writer", true);
    let fd = reader.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 256 << 10];
    for i in 0..6u64 {
        assert_eq!(reader.pread(fd, &mut buf, i * (256 << 10)).unwrap(), 256 << 10);
    }
    let w = writer.open("f", libc::O_WRONLY, 0).unwrap();
    assert_eq!(writer.pwrite(w, &vec![b'B'; 3 << 20], 1 << 20).unwrap(), 3 << 20);
    assert_eq!(reader.pread(fd, &mut buf, 6 * (256 << 10)).unwrap(), 256 << 10);
    let old = buf.iter().filter(|&&b| b == b'o').count();
    assert_eq!(old, 0, "{old} bytes from before the acknowledged write");
    // Growth: a file read to its end, the end asked ahead, then grown.
    let s = TestServer::start(|c| c.limits.lease_bytes_max = 2 << 20);
    std::fs::write(s.path("g"), vec![b'o'; 4 << 20]).unwrap();
    let reader = client(&s, "reader", true);
    let writer = client(&s, "writer", true);
    let fd = reader.open("g", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..4u64 {
        assert_eq!(reader.pread(fd, &mut buf, i << 20).unwrap(), 1 << 20);
    }
    let w = writer.open("g", libc::O_WRONLY, 0).unwrap();
    assert_eq!(writer.pwrite(w, &vec![b'B'; 1 << 20], 4 << 20).unwrap(), 1 << 20);
    assert_eq!(reader.pread(fd, &mut buf, 4 << 20).unwrap(), 1 << 20, "the end of file asked ahead is past");
    assert!(buf.iter().all(|&b| b == b'B'));
}

#[test]
fn a_leased_read_sees_a_write_completed_through_the_server() {
    let s = TestServer::start(|_| {});
    std::fs::write(s.path("f"), pattern(2 << 20, 1)).unwrap();
    let reader = client(&s, "reader", true);
    let writer = client(&s, "writer", true);
    let rfd = reader.open("f", libc::O_RDONLY, 0).unwrap();
    let wfd = writer.open("f", libc::O_RDWR, 0).unwrap();
    let mut buf = vec![0u8; 256 << 10];
    reader.pread(rfd, &mut buf, 0).unwrap();
    assert_eq!(buf, pattern(2 << 20, 1)[..256 << 10]);
    let fresh = pattern(256 << 10, 99);
    assert_eq!(writer.pwrite(wfd, &fresh, 4096).unwrap(), fresh.len());
    // Within the lease taken before the write (valid 10 ms): still the
    // page cache, which the write updated.
    reader.pread(rfd, &mut buf, 4096).unwrap();
    assert_eq!(buf, fresh, "the leased read sees the completed write");
}

#[test]
fn no_lease_for_writable_handles_direct_servers_emulated_devices_or_leases_off() {
    type Tweak = Box<dyn Fn(&mut sluice_server::ServerConfig)>;
    let cases: [(&str, Tweak, i32, bool); 5] = [
        ("rdwr", Box::new(|_| {}), libc::O_RDWR, true),
        ("direct", Box::new(|c| c.direct = true), libc::O_RDONLY, true),
        ("hdd", Box::new(|c| c.device = DeviceKind::Hdd7200), libc::O_RDONLY, true),
        ("off", Box::new(|c| c.limits.lease_bytes_max = 0), libc::O_RDONLY, true),
        ("client-off", Box::new(|_| {}), libc::O_RDONLY, false),
    ];
    for (name, tweak, flags, leases) in cases {
        let s = TestServer::start(tweak);
        let data = pattern(1 << 20, 7);
        std::fs::write(s.path("f"), &data).unwrap();
        let c = client(&s, name, leases);
        let fd = c.open("f", flags, 0).unwrap();
        let mut buf = vec![0u8; 256 << 10];
        for i in 0..2u64 {
            assert_eq!(c.pread(fd, &mut buf, i * (256 << 10)).unwrap(), 256 << 10);
            assert_eq!(buf, data[(i as usize) * (256 << 10)..(i as usize + 1) * (256 << 10)], "{name}: read {i}");
        }
        assert_eq!(counts(&c, name), (2, 0), "{name}: both reads scheduled, nothing leased");
    }
}

/// Write leases (the default of a server writing through the page
/// cache): a writable handle's write asks for a lease (without its data)
/// and is written by the client itself, through the lent descriptor; the
/// lease covers the whole file, so writes anywhere in it send nothing
/// while it lives; every byte lands; reads of that read-write handle stay
/// scheduled; a large write asks once, whole.
#[test]
fn a_writable_handle_writes_under_a_write_lease() {
    use std::os::unix::fs::FileExt;
    let s = TestServer::start(|_| {});
    let c = client(&s, "wl", true);
    let fd = c.open("f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let (a, b, far) = (pattern(256 << 10, 3), pattern(256 << 10, 4), pattern(4096, 6));
    assert_eq!(c.pwrite(fd, &a, 0).unwrap(), a.len());
    assert_eq!(counts(&c, "wl"), (0, 256 << 10), "leased (the asking write counted), not scheduled");
    assert_eq!(c.pwrite(fd, &b, 1 << 20).unwrap(), b.len());
    assert_eq!(c.pwrite(fd, &far, 100 << 20).unwrap(), far.len());
    assert_eq!(counts(&c, "wl"), (0, 256 << 10), "the lease covers the whole file: nothing sent");
    let on_disk = std::fs::File::open(s.path("f")).unwrap();
    assert_eq!(on_disk.metadata().unwrap().len(), (100 << 20) + 4096);
    let mut got = vec![0u8; (1 << 20) + (256 << 10)];
    on_disk.read_exact_at(&mut got, 0).unwrap();
    assert_eq!((&got[..256 << 10], &got[1 << 20..]), (&a[..], &b[..]));
    assert!(got[256 << 10..1 << 20].iter().all(|&x| x == 0), "the hole between");
    let mut tail = vec![0u8; 4096];
    on_disk.read_exact_at(&mut tail, 100 << 20).unwrap();
    assert_eq!(tail, far, "the write 100 MiB on");
    let mut buf = vec![0u8; 256 << 10];
    assert_eq!(c.pread(fd, &mut buf, 1 << 20).unwrap(), buf.len());
    assert_eq!((buf.as_slice(), counts(&c, "wl").0), (&b[..], 1), "a read of a read-write handle is scheduled");
    let g = c.open("g", libc::O_WRONLY | libc::O_CREAT, 0o644).unwrap();
    let big = pattern(4 << 20, 5);
    assert_eq!(c.pwrite(g, &big, 0).unwrap(), big.len());
    assert_eq!(counts(&c, "wl"), (1, (256 << 10) + (4 << 20)), "one lease for the 4 MiB write, asked once");
    assert_eq!(std::fs::read(s.path("g")).unwrap(), big);
    // The client reports what it wrote itself; `Stats` counts it written.
    let st = c.server_stats().unwrap();
    assert_eq!(st.app("wl").unwrap().bytes_written, (a.len() + b.len() + far.len() + big.len()) as u64, "leased writes are counted as written");
}

/// A write lease lasts `write_lease_valid_us`: writes inside it ask for
/// nothing, and the first write after it asks again.
#[test]
fn a_write_lease_lasts_write_lease_valid_us() {
    let s = TestServer::start(|c| c.limits.write_lease_valid_us = 300_000);
    let c = client(&s, "timed", true);
    let fd = c.open("f", libc::O_WRONLY | libc::O_CREAT, 0o644).unwrap();
    let t0 = std::time::Instant::now();
    assert_eq!(c.pwrite(fd, &pattern(4096, 1), 0).unwrap(), 4096);
    assert_eq!(c.pwrite(fd, &pattern(8192, 2), 4096).unwrap(), 8192);
    // (A machine so slow that two writes took most of the lease checks
    // only what follows.)
    let inside = t0.elapsed() < std::time::Duration::from_millis(250);
    if inside {
        assert_eq!(counts(&c, "timed"), (0, 4096), "inside the lease: asked once");
    }
    std::thread::sleep(std::time::Duration::from_millis(350));
    assert_eq!(c.pwrite(fd, &pattern(16384, 3), 65536).unwrap(), 16384);
    let leased = counts(&c, "timed").1;
    assert!(leased >= 4096 + 16384, "past the lease: asked again ({leased})");
    if inside {
        assert_eq!(leased, 4096 + 16384, "past the lease: asked again");
    }
    assert_eq!(c.server_stats().unwrap().app("timed").unwrap().bytes_written, 4096 + 8192 + 16384);
}

/// On the wire: a `WriteLease` at `LEASE_ONLY_AT` carries no data. Granted,
/// it is a lease over the whole file for `write_lease_valid_us`, lending
/// the descriptor; refused, an error says why (EAGAIN for a handle that
/// takes none, EOPNOTSUPP where the server grants none) and nothing is
/// written.
#[test]
fn a_write_lease_asked_without_data_on_the_wire() {
    let probe = |fd: u64| Request::WriteLease { fd, offset: 4096, len: 8192, at: LEASE_ONLY_AT, post: NO_POST };
    let s = TestServer::start(|_| {});
    std::fs::write(s.path("f"), b"keep").unwrap();
    let mut sock = common::raw_session(&s, "f");
    let ro = call(&mut sock, 3, &probe(3));
    assert!(ro.starts_with("Error") && ro.contains(&format!("{}", libc::EAGAIN)), "a read-only handle takes no write lease: {ro}");
    let fd = call(&mut sock, 4, &Request::Open { path: "f", flags: libc::O_WRONLY, mode: 0 });
    assert!(fd.starts_with("Fd(4, "), "{fd}");
    let granted = call(&mut sock, 5, &probe(4));
    assert!(granted.contains(&format!("Lease {{ offset: 0, len: {}, valid_us: 1000000, lent: true }}", u64::MAX)), "{granted}");
    let again = call(&mut sock, 6, &probe(4));
    assert!(again.contains("lent: false"), "{again}");
    // Data at `LEASE_ONLY_AT` is refused for any other request.
    let bad = call(&mut sock, 7, &Request::WriteShm { fd: 4, offset: 0, len: 8192, at: LEASE_ONLY_AT, post: NO_POST });
    assert!(bad.starts_with("Error"), "{bad}");
    let s2 = TestServer::start(|c| c.direct = true);
    std::fs::write(s2.path("f"), b"keep").unwrap();
    let mut sock = common::raw_session(&s2, "f");
    let fd = call(&mut sock, 3, &Request::Open { path: "f", flags: libc::O_WRONLY, mode: 0 });
    assert!(fd.starts_with("Fd(4, "), "{fd}");
    let refused = call(&mut sock, 4, &probe(4));
    assert!(refused.starts_with("Error") && refused.contains(&format!("{}", libc::EOPNOTSUPP)), "an O_DIRECT server grants none: {refused}");
    assert_eq!(std::fs::read(s2.path("f")).unwrap(), b"keep", "nothing written");
}

/// Leased writes reach the application's bytes written as the client
/// reports them: at the next lease, at `Stats`, at a metrics scrape and
/// when the connection closes; a scheduled write is counted as before.
#[test]
fn leased_writes_are_counted_as_their_client_reports_them() {
    let s = TestServer::start(|_| {});
    let written = |app: &str| s.handle.stats().iter().find(|a| a.name == app).map_or(0, |a| a.bytes_written);
    let c = client(&s, "rep", true);
    let fd = c.open("f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    for k in 0..8u64 {
        assert_eq!(c.pwrite(fd, &pattern(64 << 10, k), k * (64 << 10)).unwrap(), 64 << 10);
    }
    assert_eq!(counts(&c, "rep").0, 0, "nothing scheduled");
    assert_eq!(c.server_stats().unwrap().app("rep").unwrap().bytes_written, 8 * (64 << 10), "counted at Stats");
    assert_eq!(c.pwrite(fd, &pattern(4096, 9), 1 << 20).unwrap(), 4096);
    drop(c);
    within_5s("counted when the connection closes", || written("rep") == 8 * (64 << 10) + 4096);
    // Without write leases, the same writes are scheduled and counted once.
    let s2 = TestServer::start(|c| c.write_leases = false);
    let c2 = client(&s2, "sched", true);
    let fd = c2.open("f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    assert_eq!(c2.pwrite(fd, &pattern(64 << 10, 1), 0).unwrap(), 64 << 10);
    let st = c2.server_stats().unwrap();
    assert_eq!((st.app("sched").unwrap().requests, st.app("sched").unwrap().bytes_written), (1, 64 << 10));
}

/// A list write takes write leases too: its first piece asks (with
/// `pwrite`), the lease then covers the others, and nothing is scheduled;
/// on a server without write leases the first piece is scheduled alone
/// and the rest go as one list message (three requests in the scheduler,
/// one per piece, as for one list message).
#[test]
fn a_list_write_takes_write_leases_where_the_server_grants_them() {
    for (grants, want) in [(true, (0, 64 << 10)), (false, (3, 0))] {
        let s = TestServer::start(|c| c.write_leases = grants);
        let c = client(&s, "list", true);
        let fd = c.open("f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
        let data = pattern(3 * (64 << 10), 11);
        let pieces = [(0u64, 64u64 << 10), (1 << 20, 64 << 10), (3 << 20, 64 << 10)];
        assert_eq!(c.write_list(fd, &pieces, &data).unwrap(), data.len());
        assert_eq!(counts(&c, "list"), want, "write leases granted: {grants}");
        let on_disk = std::fs::read(s.path("f")).unwrap();
        for (k, &(o, n)) in pieces.iter().enumerate() {
            let (o, n) = (o as usize, n as usize);
            assert_eq!(&on_disk[o..o + n], &data[k * n..(k + 1) * n], "piece {k}, write leases {grants}");
        }
    }
}

/// A list read takes cache leases as `pread` does: its pieces in a cached
/// range are read through the lent descriptor (bytes past the end of the
/// file as zeros, as the list message reads them), and nothing is
/// scheduled. Where its first try finds the range uncached, the pieces
/// after it go to the server as one list message: the same range, cached
/// by then, is not asked for again piece by piece.
#[test]
fn a_list_read_takes_cache_leases_and_sends_the_rest_when_uncached() {
    if !kernel_has_cachestat() {
        eprintln!("no cachestat on this kernel: nothing to test");
        return;
    }
    let s = TestServer::start(|_| {});
    let data = pattern(4 << 20, 13);
    std::fs::write(s.path("f"), &data).unwrap();
    let c = client(&s, "listed", true);
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let pieces = [(0u64, 64u64 << 10), (1 << 20, 64 << 10), ((3 << 20) + 100, 64 << 10), ((4 << 20) - 10, 20)];
    let total: u64 = pieces.iter().map(|p| p.1).sum();
    let mut buf = vec![0xeeu8; total as usize];
    assert_eq!(c.read_list(fd, &pieces, &mut buf).unwrap(), total as usize);
    let mut at = 0;
    for &(o, n) in &pieces {
        let (o, n) = (o as usize, n as usize);
        let inside = n.min(data.len().saturating_sub(o));
        assert_eq!(&buf[at..at + inside], &data[o..o + inside], "piece at {o}");
        assert!(buf[at + inside..at + n].iter().all(|&b| b == 0), "past the end of the file, zeros (piece at {o})");
        at += n;
    }
    let (requests, leased) = counts(&c, "listed");
    assert_eq!(requests, 0, "a cached list read is not scheduled");
    assert!(leased > 0);

    // Uncached: the first piece's try is scheduled and brings no lease;
    // the second piece (the same range, cached by the first) goes in the
    // list message, not through a lease.
    {
        std::fs::write(s.path("g"), &data).unwrap();
        let f = std::fs::File::open(s.path("g")).unwrap();
        f.sync_all().unwrap();
        // SAFETY: plain advice on a descriptor we hold; clean pages go.
        assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
    }
    let c = client(&s, "cold-list", true);
    let fd = c.open("g", libc::O_RDONLY, 0).unwrap();
    let pieces = [(4096u64, 4096u64), (4096, 4096), (2 << 20, 4096)];
    let mut buf = vec![0u8; 3 * 4096];
    assert_eq!(c.read_list(fd, &pieces, &mut buf).unwrap(), buf.len());
    for (k, &(o, n)) in pieces.iter().enumerate() {
        assert_eq!(&buf[k * 4096..(k + 1) * 4096], &data[o as usize..(o + n) as usize], "piece {k}");
    }
    assert_eq!(counts(&c, "cold-list"), (3, 0), "every piece scheduled, none leased");
}

/// No write lease unless the server grants them (`--write-leases`), and
/// then not for an O_APPEND handle (a `pwrite` there ignores its offset),
/// on an O_DIRECT server or an emulated device (which must see every
/// write), or with leases off on either side: the writes are scheduled,
/// and land.
#[test]
fn no_write_lease_for_append_direct_servers_emulated_devices_or_leases_off() {
    type Tweak = Box<dyn Fn(&mut sluice_server::ServerConfig)>;
    let cases: [(&str, Tweak, i32, bool); 6] = [
        ("server-off", Box::new(|c| c.write_leases = false), libc::O_WRONLY, true),
        ("append", Box::new(|c| c.write_leases = true), libc::O_WRONLY | libc::O_APPEND, true),
        ("direct", Box::new(|c| (c.write_leases, c.direct) = (true, true)), libc::O_WRONLY, true),
        ("hdd", Box::new(|c| (c.write_leases, c.device) = (true, DeviceKind::Hdd7200)), libc::O_WRONLY, true),
        ("off", Box::new(|c| (c.write_leases, c.limits.lease_bytes_max) = (true, 0)), libc::O_WRONLY, true),
        ("client-off", Box::new(|c| c.write_leases = true), libc::O_WRONLY, false),
    ];
    for (name, tweak, flags, leases) in cases {
        let s = TestServer::start(tweak);
        std::fs::write(s.path("f"), b"").unwrap();
        let c = client(&s, name, leases);
        let fd = c.open("f", flags, 0).unwrap();
        let data = pattern(512 << 10, 8);
        for i in 0..2usize {
            let part = &data[i * (256 << 10)..(i + 1) * (256 << 10)];
            assert_eq!(c.pwrite(fd, part, (i * (256 << 10)) as u64).unwrap(), part.len(), "{name}: write {i}");
        }
        assert_eq!(counts(&c, name), (2, 0), "{name}: both writes scheduled, nothing leased");
        assert_eq!(std::fs::read(s.path("f")).unwrap(), data, "{name}");
    }
}

#[test]
fn an_uncached_range_is_scheduled_then_leased_once_cached() {
    if !kernel_has_cachestat() {
        eprintln!("no cachestat on this kernel: nothing to test");
        return;
    }
    // Leases good for 500 ms, so that the second read below falls inside
    // the first one's on any machine.
    let s = TestServer::start(|c| c.limits.lease_valid_us = 500_000);
    let data = pattern(1 << 20, 5);
    {
        let mut f = std::fs::File::create(s.path("f")).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
        // SAFETY: plain advice on a descriptor we hold; clean pages go.
        assert_eq!(unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
    }
    let c = client(&s, "cold", true);
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), 1 << 20);
    assert_eq!(buf, data);
    let (requests, leased) = counts(&c, "cold");
    assert_eq!((requests, leased), (1, 0), "the uncached read went through the scheduler");
    // Its dispatch brought the pages into the page cache and answered with
    // a lease (the client read them itself): the same read inside it sends
    // nothing.
    buf.fill(0);
    assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), 1 << 20);
    assert_eq!(buf, data);
    assert_eq!(counts(&c, "cold"), (1, 0), "inside the lease the scheduled read was answered with: nothing sent");
    // Once that lease is over, the range is cached: leased at once. (Read
    // through the page cache here first: the host may have dropped pages
    // in the 600 ms, which is not the server's doing; in `make test` this
    // read went through the scheduler twice in about fifty runs.)
    std::thread::sleep(std::time::Duration::from_millis(600));
    assert_eq!(std::fs::read(s.path("f")).unwrap(), data);
    buf.fill(0);
    assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), 1 << 20);
    assert_eq!(buf, data);
    assert_eq!(counts(&c, "cold"), (1, 1 << 20), "now cached: leased");
}

/// On the wire: the first lease of a handle says it lends the descriptor,
/// later ones do not; a new handle is lent again; a `ReadLease` without a
/// region is refused like a `ReadShm`.
#[test]
fn the_descriptor_is_lent_once_per_handle_on_the_wire() {
    if !kernel_has_cachestat() {
        eprintln!("no cachestat on this kernel: nothing to test");
        return;
    }
    let s = TestServer::start(|_| {});
    std::fs::write(s.path("f"), pattern(64 << 10, 6)).unwrap();
    let mut sock = common::raw_session(&s, "f");
    let none = call(&mut sock, 3, &Request::ReadLease { fd: 3, offset: 0, len: 100, at: 0, post: NO_POST });
    // Cached to the end of the file: the lease spans lease_bytes_max.
    assert!(none.contains("Lease { offset: 0, len: 33554432, valid_us: 10000, lent: true }"), "{none}");
    let again = call(&mut sock, 4, &Request::ReadLease { fd: 3, offset: 4096, len: 100, at: 0, post: NO_POST });
    assert!(again.contains("Lease { offset: 4096, len: 33554432, valid_us: 10000, lent: false }"), "{again}");
    let fd = call(&mut sock, 5, &Request::Open { path: "f", flags: libc::O_RDONLY, mode: 0 });
    assert!(fd.starts_with("Fd(4, "), "{fd}");
    let other = call(&mut sock, 6, &Request::ReadLease { fd: 4, offset: 0, len: 100, at: 0, post: NO_POST });
    assert!(other.contains("lent: true"), "a new handle is lent its own descriptor: {other}");
    assert_eq!(call(&mut sock, 7, &Request::Close { fd: 3 }), "Ok");
    let closed = call(&mut sock, 8, &Request::ReadLease { fd: 3, offset: 0, len: 100, at: 0, post: NO_POST });
    assert!(closed.starts_with("Error"), "a closed handle is not leased: {closed}");
    // Past the end of the file there is nothing to lease: scheduled, and
    // without a region that is refused.
    let past = call(&mut sock, 9, &Request::ReadLease { fd: 4, offset: 1 << 20, len: 100, at: 0, post: NO_POST });
    assert!(past.contains("ShmAttach first"), "{past}");
}

/// A program that closes a descriptor it does not own and opens another
/// file on its number (an interposed program can) must not make a leased
/// read return that file's bytes: the client checks the descriptor still
/// is the file it was lent for, and otherwise reads through the server.
#[test]
fn a_lent_descriptor_replaced_under_the_client_is_not_read() {
    if !kernel_has_cachestat() {
        eprintln!("no cachestat on this kernel: nothing to test");
        return;
    }
    let s = TestServer::start(|_| {});
    let data = pattern(2 << 20, 31);
    std::fs::write(s.path("f"), &data).unwrap();
    std::fs::write(s.path("g"), pattern(2 << 20, 32)).unwrap();
    let c = client(&s, "clobbered", true);
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    // The server is in this process: its own descriptor on f is open now;
    // the lent one is the one that appears with the lease.
    let target = std::fs::canonicalize(s.path("f")).unwrap();
    let on_f = || -> Vec<i32> {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| {
                let e = e.ok()?;
                (std::fs::read_link(e.path()).ok()? == target).then(|| e.file_name().to_str()?.parse().ok())?
            })
            .collect()
    };
    let before = on_f();
    let mut buf = vec![0u8; 64 << 10];
    c.pread(fd, &mut buf, 0).unwrap();
    assert_eq!(counts(&c, "clobbered"), (0, 2 << 20), "leased");
    let lent: Vec<i32> = on_f().into_iter().filter(|f| !before.contains(f)).collect();
    assert_eq!(lent.len(), 1, "one descriptor was lent: {lent:?}");
    let other = std::fs::File::open(s.path("g")).unwrap();
    // SAFETY: replaces the lent descriptor's number with another file, as
    // a careless program would.
    assert_eq!(unsafe { libc::dup2(other.as_raw_fd(), lent[0]) }, lent[0]);
    assert_eq!(c.pread(fd, &mut buf, 4096).unwrap(), 64 << 10);
    assert_eq!(buf, data[4096..4096 + (64 << 10)], "f's bytes, not g's");
    assert_eq!(counts(&c, "clobbered"), (1, 2 << 20), "read through the server, no more leases");
}
