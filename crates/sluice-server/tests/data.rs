//! Data written through the service equals the backing file, and the
//! reverse, with and without O_DIRECT, aligned and unaligned; list I/O,
//! file positions, pipelining, concurrent applications, metadata calls.

mod common;

use common::{pattern, TestServer};
use sluice_client::{Client, FileKind, Whence};
use sluice_server::{DeviceKind, ServerConfig};

const RW_CREATE: i32 = libc::O_RDWR | libc::O_CREAT;

/// Offsets and lengths that hit every alignment case of a 4 KiB block.
const CASES: [(u64, usize); 6] = [(0, 4096), (4096, 1 << 20), (1, 4095), (4095, 2), (12_345, 100_000), (8192, 5000)];

/// Write through the service, compare with the backing file; write the
/// backing file, compare with a read through the service.
fn check_round_trips(s: &TestServer) {
    let c = s.client("rt");
    let fd = c.open("rt.dat", RW_CREATE, 0o644).unwrap();
    let mut expected = vec![0u8; 2 << 20];
    for (i, &(off, len)) in CASES.iter().enumerate() {
        let data = pattern(len, i as u64);
        assert_eq!(c.pwrite(fd, &data, off).unwrap(), len);
        expected[off as usize..off as usize + len].copy_from_slice(&data);
        let end = CASES[..=i].iter().map(|&(o, l)| o as usize + l).max().unwrap();
        assert_eq!(std::fs::read(s.path("rt.dat")).unwrap(), &expected[..end], "after writing case {i} through the service");
    }
    let direct = pattern(3 << 20, 99);
    std::fs::write(s.path("direct.dat"), &direct).unwrap();
    let fd2 = c.open("direct.dat", libc::O_RDONLY, 0).unwrap();
    for &(off, len) in &CASES {
        let mut buf = vec![0u8; len];
        assert_eq!(c.pread(fd2, &mut buf, off).unwrap(), len);
        assert_eq!(buf, &direct[off as usize..off as usize + len], "read of {len} at {off}");
    }
    let mut tail = vec![0u8; 10_000];
    assert_eq!(c.pread(fd2, &mut tail, (3 << 20) - 100).unwrap(), 100, "short read at end of file");
    assert_eq!(&tail[..100], &direct[(3 << 20) - 100..]);
    c.close(fd).unwrap();
    c.close(fd2).unwrap();
}

#[test]
fn round_trip_buffered() {
    check_round_trips(&TestServer::start(|_| {}));
}

#[test]
fn round_trip_direct() {
    check_round_trips(&TestServer::start(|c: &mut ServerConfig| c.direct = true));
}

#[test]
fn list_io_round_trips_and_zero_fills_past_eof() {
    for direct in [false, true] {
        let s = TestServer::start(|c| c.direct = direct);
        let c = s.client("list");
        let fd = c.open("l.dat", RW_CREATE, 0o644).unwrap();
        let pieces = [(0u64, 10u64), (4096, 4096), (100, 7), (20_000, 3)];
        let data = pattern(10 + 4096 + 7 + 3, 5);
        assert_eq!(c.write_list(fd, &pieces, &data).unwrap(), data.len());
        let file = std::fs::read(s.path("l.dat")).unwrap();
        let mut at = 0;
        for &(o, l) in &pieces {
            assert_eq!(&file[o as usize..(o + l) as usize], &data[at..at + l as usize], "piece at {o} (direct {direct})");
            at += l as usize;
        }
        let mut back = vec![0u8; data.len() + 5];
        let read_pieces = [pieces[0], pieces[1], pieces[2], pieces[3], (20_003, 5)];
        assert_eq!(c.read_list(fd, &read_pieces, &mut back).unwrap(), data.len() + 5);
        assert_eq!(&back[..data.len()], &data[..]);
        assert_eq!(&back[data.len()..], &[0u8; 5], "past end of file reads as zeros");
    }
}

#[test]
fn file_position_api_reads_writes_and_seeks() {
    let s = TestServer::start(|_| {});
    let c = s.client("pos");
    let fd = c.open("p.dat", RW_CREATE, 0o644).unwrap();
    assert_eq!(c.write(fd, b"hello ").unwrap(), 6);
    assert_eq!(c.write(fd, b"world").unwrap(), 5);
    assert_eq!(c.lseek(fd, 0, Whence::Set).unwrap(), 0);
    let mut buf = [0u8; 5];
    assert_eq!(c.read(fd, &mut buf).unwrap(), 5);
    assert_eq!(&buf, b"hello");
    assert_eq!(c.lseek(fd, 1, Whence::Cur).unwrap(), 6);
    assert_eq!(c.read(fd, &mut buf).unwrap(), 5);
    assert_eq!(&buf, b"world");
    assert_eq!(c.lseek(fd, -2, Whence::End).unwrap(), 9);
    assert!(c.lseek(fd, -100, Whence::Cur).is_err());
    let app = c.open("p.dat", libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
    c.write(app, b"!").unwrap();
    assert_eq!(std::fs::read(s.path("p.dat")).unwrap(), b"hello world!");
}

#[test]
fn many_requests_in_flight_on_one_connection() {
    let s = TestServer::start(|_| {});
    // Leases off: every read goes to the server and is counted there.
    let opts = sluice_client::ConnectOptions { app: Some("pipe".into()), leases: false, ..Default::default() };
    let c = sluice_client::Client::connect_with(&s.addr(), opts).unwrap();
    let data = pattern(64 * 4096, 3);
    std::fs::write(s.path("f"), &data).unwrap();
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let tickets: Vec<_> = (0..64u64).rev().map(|i| (i, c.submit_read(fd, 4096, i * 4096).unwrap())).collect();
    for (i, t) in tickets {
        let mut buf = vec![0u8; 4096];
        assert_eq!(c.wait_read(t, &mut buf).unwrap(), 4096);
        assert_eq!(buf, &data[i as usize * 4096..(i as usize + 1) * 4096]);
    }
    let stats = c.server_stats().unwrap();
    let app = stats.app("pipe").expect("app counted");
    assert_eq!(app.requests, 64);
    assert!(app.dispatches <= 64 && app.dispatches > 0);
}

/// `open(dir, O_RDONLY | O_DIRECTORY, mode)` as libc callers make it (a
/// mode is passed even without O_CREAT): a handle whose fstat is the
/// directory's.
#[test]
fn directories_open_with_o_directory_and_any_mode() {
    let s = TestServer::start(|_| {});
    let c = s.client("dirs");
    std::fs::create_dir(s.path("d")).unwrap();
    let fd = c.open("d", libc::O_RDONLY | libc::O_DIRECTORY, 0o777).unwrap();
    assert_eq!(c.fstat(fd).unwrap().mode & libc::S_IFMT, libc::S_IFDIR);
    c.close(fd).unwrap();
    std::fs::write(s.path("f"), b"x").unwrap();
    assert_eq!(c.open("f", libc::O_RDONLY | libc::O_DIRECTORY, 0o777).unwrap_err().errno, libc::ENOTDIR);
}

/// Threads sharing one connection, each with list reads in flight: a reply
/// may be received by another thread's wait, and must still reach its
/// caller's buffer intact.
#[test]
fn threads_sharing_a_connection_get_their_own_list_reads() {
    let s = TestServer::start(|_| {});
    let c = s.client("shared");
    let data = pattern(8 << 20, 11);
    std::fs::write(s.path("f"), &data).unwrap();
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let (c, data) = (&c, &data);
            sc.spawn(move || {
                let mut buf = vec![0u8; 256 << 10];
                for round in 0..16u64 {
                    let at = ((t * 16 + round) % 32) * (256 << 10);
                    let half = 128 << 10;
                    let pieces = [(at + half, half), (at, half)];
                    assert_eq!(c.read_list(fd, &pieces, &mut buf).unwrap(), 256 << 10);
                    let at = at as usize;
                    assert!(buf[..half as usize] == data[at + half as usize..at + 2 * half as usize], "thread {t} round {round}");
                    assert!(buf[half as usize..] == data[at..at + half as usize], "thread {t} round {round}");
                }
            });
        }
    });
}

/// Several applications write their own files and read each other's, all
/// at once; each one's data is intact and each is counted separately.
#[test]
fn concurrent_clients_of_different_applications() {
    // Every write scheduled, each a request: no write leases.
    let s = TestServer::start(|c| (c.device, c.write_leases) = (DeviceKind::Real, false));
    let addr = s.addr();
    let threads: Vec<_> = (0..4u64)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let opts = sluice_client::ConnectOptions { app: Some(format!("app{i}")), weight: 1 + i as u32, client_id: Some(i as u32), ..Default::default() };
                let c = Client::connect_with(&addr, opts).unwrap();
                let fd = c.open(&format!("f{i}"), RW_CREATE, 0o644).unwrap();
                for k in 0..32u64 {
                    c.pwrite(fd, &pattern(8192, i * 100 + k), k * 8192).unwrap();
                }
                c.fsync(fd).unwrap();
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let c = s.client("checker");
    for i in 0..4u64 {
        let fd = c.open(&format!("f{i}"), libc::O_RDONLY, 0).unwrap();
        let mut buf = vec![0u8; 32 * 8192];
        assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), buf.len());
        let expected: Vec<u8> = (0..32).flat_map(|k| pattern(8192, i * 100 + k)).collect();
        assert_eq!(buf, expected, "file of app{i}");
    }
    let stats = s.handle.stats();
    for i in 0..4 {
        let a = stats.iter().find(|a| a.name == format!("app{i}")).unwrap();
        assert_eq!((a.requests, a.bytes_written, a.weight), (32, 32 * 8192, 1 + i as u32));
        assert_eq!(a.latency_us_log2.iter().sum::<u64>(), 32);
    }
}

#[test]
fn metadata_operations() {
    let s = TestServer::start(|_| {});
    let c = s.client("meta");
    c.mkdir("d", 0o755).unwrap();
    c.mkdir("d/e", 0o755).unwrap();
    let fd = c.open("d/x", RW_CREATE, 0o600).unwrap();
    c.pwrite(fd, b"abcdef", 0).unwrap();
    c.fdatasync(fd).unwrap();
    c.ftruncate(fd, 3).unwrap();
    assert_eq!(c.fstat(fd).unwrap().size, 3);
    assert_eq!(c.stat("d/x").unwrap().mode & 0o777, 0o600);
    c.rename("d/x", "d/y").unwrap();
    let names: Vec<_> = c.readdir("d").unwrap().into_iter().map(|e| (e.name, e.kind)).collect();
    assert_eq!(names, vec![("e".to_string(), FileKind::Dir), ("y".to_string(), FileKind::File)]);
    assert_eq!(c.stat("d/x").unwrap_err().errno, libc::ENOENT);
    c.unlink("d/y").unwrap();
    c.rmdir("d/e").unwrap();
    assert_eq!(c.rmdir("d/missing").unwrap_err().errno, libc::ENOENT);
    assert_eq!(c.readdir("").unwrap().len(), 1, "the root lists d");
    c.close(fd).unwrap();
    assert_eq!(c.close(fd).unwrap_err().errno, libc::EBADF);
    let ro = c.open("ro", RW_CREATE, 0o644).and_then(|f| c.close(f)).and_then(|()| c.open("ro", libc::O_RDONLY, 0)).unwrap();
    assert_eq!(c.pwrite(ro, b"x", 0).unwrap_err().errno, libc::EBADF, "no writes through a read-only handle");
}

#[test]
fn readdir_pages_through_large_directories() {
    let s = TestServer::start(|_| {});
    for i in 0..(sluice_proto::DIR_ENTRIES_MAX + 5) {
        std::fs::write(s.path(&format!("f{i:05}")), b"").unwrap();
    }
    let names = s.client("ls").readdir(".").unwrap();
    assert_eq!(names.len(), sluice_proto::DIR_ENTRIES_MAX + 5);
    assert!(names.windows(2).all(|w| w[0].name < w[1].name));
}

#[test]
fn direct_unaligned_writes_through_a_write_only_handle() {
    let s = TestServer::start(|c| c.direct = true);
    let c = s.client("wo");
    let fd = c.open("w.dat", libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644).unwrap();
    let data = pattern(10_000, 8);
    assert_eq!(c.pwrite(fd, &data, 0).unwrap(), 10_000);
    assert_eq!(c.pwrite(fd, &data[..77], 5_003).unwrap(), 77);
    let mut expected = data.clone();
    expected[5_003..5_080].copy_from_slice(&data[..77]);
    assert_eq!(std::fs::read(s.path("w.dat")).unwrap(), expected, "size and bytes exact after read-modify-write");
    assert_eq!(c.pread(fd, &mut [0u8; 10], 0).unwrap_err().errno, libc::EBADF, "still no reads through a write-only handle");
}

/// On the emulated disk, contiguous requests that queue behind a slow
/// dispatch are aggregated into few device operations, each one `preadv`
/// scattering into the members' buffers.
#[test]
fn queued_contiguous_reads_are_aggregated_on_the_emulated_disk() {
    let s = TestServer::start(|c| c.device = DeviceKind::Hdd7200);
    let data = pattern(32 * 4096, 4);
    std::fs::write(s.path("agg"), &data).unwrap();
    let c = s.client("agg");
    let fd = c.open("agg", libc::O_RDONLY, 0).unwrap();
    let started = std::time::Instant::now();
    let tickets: Vec<_> = (0..32u64).map(|i| (i, c.submit_read(fd, 4096, i * 4096).unwrap())).collect();
    for (i, t) in tickets {
        let mut buf = vec![0u8; 4096];
        assert_eq!(c.wait_read(t, &mut buf).unwrap(), 4096);
        assert_eq!(buf, &data[i as usize * 4096..(i as usize + 1) * 4096], "member {i}");
    }
    let far_seek_ns = 9_000_000 + 4_170_000;
    assert!(started.elapsed().as_nanos() as u64 >= far_seek_ns, "the first access pays a modelled far seek");
    let a = c.server_stats().unwrap().app("agg").unwrap().clone();
    assert_eq!(a.requests, 32);
    assert!(a.dispatches <= 8 && a.aggregation_factor() >= 4.0, "{a:?}");
}

#[test]
fn a_marked_send_is_the_next_read_or_write_only() {
    // Writes sent, not leased (a write inside a lease sends nothing).
    let s = TestServer::start(|c| c.write_leases = false);
    let c = s.client("mark");
    let fd = c.open("m.dat", RW_CREATE, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, &pattern(4096, 1), 0).unwrap(), 4096);
    // Nothing marked: no time, whatever is sent.
    assert!(c.marked_send().is_none());
    c.mark_next_send();
    assert!(c.marked_send().is_none(), "marked, not yet sent");
    let before = std::time::Instant::now();
    let mut buf = vec![0u8; 4096];
    assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), 4096);
    let after = std::time::Instant::now();
    let at = c.marked_send().expect("the read was sent");
    assert!(before <= at && at <= after);
    // Later requests leave the mark as it was; a new mark starts afresh.
    assert_eq!(c.pwrite(fd, &pattern(4096, 2), 4096).unwrap(), 4096);
    assert_eq!(c.marked_send(), Some(at));
    c.mark_next_send();
    assert!(c.marked_send().is_none());
    assert_eq!(c.pwrite(fd, &pattern(4096, 3), 8192).unwrap(), 4096);
    assert!(c.marked_send().is_some_and(|t| t > at), "a write is marked too");
}

/// `Reserve` hands out disjoint ranges at a file's end, to any client:
/// the first at the size, the next past the last reserved (not yet
/// written) one; once they are written, a truncate or an `O_TRUNC` open
/// starts again at the new size; a read-only handle and a range past the
/// largest write are refused. Then eight threads of two clients append 200 records each
/// (reserve, then write there) and every record lands whole, once.
#[test]
fn reservations_at_the_end_never_overlap() {
    for direct in [false, true] {
        let s = TestServer::start(|c| c.direct = direct);
        let (a, b) = (s.client("append-a"), s.client("append-b"));
        std::fs::write(s.path("log"), b"0123456789").unwrap();
        let append = libc::O_WRONLY | libc::O_APPEND;
        let (fa, fb) = (a.open("log", append, 0).unwrap(), b.open("log", append, 0).unwrap());
        assert_eq!(a.reserve(fa, 5).unwrap(), 10);
        assert_eq!(b.reserve(fb, 7).unwrap(), 15, "past a range reserved and not yet written");
        assert_eq!(a.reserve(fa, 1).unwrap(), 22);
        b.pwrite(fb, b"1234567", 15).unwrap();
        a.pwrite(fa, b"12345", 10).unwrap();
        a.pwrite(fa, b"1", 22).unwrap();
        b.ftruncate(fb, 3).unwrap();
        assert_eq!(a.reserve(fa, 4).unwrap(), 3, "a truncate starts again at the new size");
        a.pwrite(fa, b"abcd", 3).unwrap();
        let ft = b.open("log", libc::O_WRONLY | libc::O_TRUNC, 0).unwrap();
        assert_eq!(a.reserve(fa, 2).unwrap(), 0, "so does an O_TRUNC open");
        a.pwrite(fa, b"xy", 0).unwrap();
        let ro = a.open("log", libc::O_RDONLY, 0).unwrap();
        assert_eq!(a.reserve(ro, 1).unwrap_err().errno, libc::EBADF);
        assert_eq!(a.reserve(fa, 0x7fff_f001).unwrap_err().errno, libc::EINVAL, "past the largest write");
        a.close(ro).unwrap();
        b.close(ft).unwrap();
        b.ftruncate(fb, 0).unwrap();
        std::thread::scope(|scope| {
            for t in 0..8u8 {
                let (c, fd) = if t % 2 == 0 { (&a, fa) } else { (&b, fb) };
                scope.spawn(move || {
                    for i in 0..200u32 {
                        let rec = format!("{t}:{i:05}|").into_bytes();
                        let at = c.reserve(fd, rec.len() as u64).unwrap();
                        assert_eq!(c.pwrite(fd, &rec, at).unwrap(), rec.len());
                    }
                });
            }
        });
        let log = String::from_utf8(std::fs::read(s.path("log")).unwrap()).unwrap();
        let mut recs: Vec<&str> = log.split_terminator('|').collect();
        assert_eq!(recs.len(), 1600, "direct = {direct}");
        recs.sort_unstable();
        recs.dedup();
        assert_eq!(recs.len(), 1600, "every record once (direct = {direct})");
        assert!(recs.iter().all(|r| r.len() == 7), "every record whole (direct = {direct})");
    }
}

/// `Symlink` makes a link beneath the root holding its target as given;
/// a link whose target leads out of the root is made but never followed
/// (opens and stats through it are refused), a link path that escapes
/// the root is refused, and an existing name is EEXIST.
#[test]
fn symlinks_are_made_beneath_the_root_and_never_lead_out() {
    let s = TestServer::start(|_| {});
    let c = s.client("links");
    c.mkdir("d", 0o755).unwrap();
    std::fs::write(s.path("a"), b"data").unwrap();
    c.symlink("../a", "d/l").unwrap();
    assert_eq!(c.readlink("d/l").unwrap(), "../a");
    assert_eq!(std::fs::read_link(s.path("d/l")).unwrap().to_str(), Some("../a"));
    let fd = c.open("d/l", libc::O_RDONLY, 0).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), 4);
    c.close(fd).unwrap();
    assert_eq!(c.symlink("x", "d/l").unwrap_err().errno, libc::EEXIST);
    c.symlink("/etc/passwd", "out").unwrap();
    assert_eq!(c.readlink("out").unwrap(), "/etc/passwd");
    assert_eq!(c.open("out", libc::O_RDONLY, 0).unwrap_err().errno, libc::EACCES, "a link out of the root is never followed");
    assert!(c.stat("out").is_err());
    assert_eq!(c.symlink("a", "../escape").unwrap_err().errno, libc::EACCES);
    assert!(!s.path("../escape").exists());
}

/// `SetAttr` changes a file's mode and times by path (following links
/// beneath the root), by handle, and on a final link itself; a link out
/// of the root is refused as an open through it is; omitted times stay.
#[test]
fn set_attr_changes_modes_and_times_beneath_the_root() {
    use sluice_client::{SETATTR_MODE_KEEP as KEEP, SETATTR_TIME_NOW as NOW, SETATTR_TIME_OMIT as OMIT};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let s = TestServer::start(|_| {});
    let c = s.client("setattr");
    std::fs::write(s.path("f"), b"x").unwrap();
    std::fs::set_permissions(s.path("f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let meta = |p: &str| std::fs::symlink_metadata(s.path(p)).unwrap();
    c.set_attr("f", 0o750, OMIT, OMIT, false).unwrap();
    assert_eq!(meta("f").mode() & 0o7777, 0o750);
    let before = meta("f").atime();
    c.set_attr("f", KEEP, OMIT, 1_500_000_000_123_456_789, false).unwrap();
    assert_eq!((meta("f").mtime(), meta("f").mtime_nsec(), meta("f").mode() & 0o7777), (1_500_000_000, 123_456_789, 0o750));
    assert_eq!(meta("f").atime(), before, "an omitted time stays");
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    c.fset_attr(fd, 0o644, 1_000_000_000, OMIT).unwrap();
    assert_eq!((meta("f").mode() & 0o7777, meta("f").atime()), (0o644, 1));
    c.fset_attr(fd, KEEP, NOW, NOW).unwrap();
    assert!(meta("f").mtime() > 1_500_000_000, "now");
    c.close(fd).unwrap();
    c.symlink("f", "l").unwrap();
    c.set_attr("l", 0o600, OMIT, OMIT, false).unwrap();
    assert_eq!(meta("f").mode() & 0o7777, 0o600, "through the link");
    c.set_attr("l", KEEP, OMIT, 2_000_000_000_000_000_000, true).unwrap();
    assert_eq!((meta("l").mtime(), meta("f").mtime() == 2_000_000_000), (2_000_000_000, false), "the link itself");
    c.symlink("/etc/hostname", "out").unwrap();
    assert_eq!(c.set_attr("out", 0o777, OMIT, OMIT, false).unwrap_err().errno, libc::EACCES, "never through a link out of the root");
    assert_eq!(c.set_attr("missing", 0o777, OMIT, OMIT, false).unwrap_err().errno, libc::ENOENT);
    assert_eq!(c.set_attr("../f", 0o777, OMIT, OMIT, false).unwrap_err().errno, libc::EACCES);
}

/// A truncate between a `Reserve` and its write: an append reserved after
/// the truncate keeps clear of the range still to be written (it was
/// handed offset 0 and half of it was overwritten, as a log rotated with
/// copytruncate under `>>` writers would be); once the range is written,
/// a truncate starts appends at the new size again.
#[test]
fn an_append_after_a_truncate_keeps_clear_of_one_not_yet_written() {
    let s = TestServer::start(|_| {});
    let (a, b, t) = (s.client("a"), s.client("b"), s.client("t"));
    std::fs::write(s.path("log"), b"01234567").unwrap();
    // O_APPEND, as the interposer and the mount open them: the client
    // takes no write lease for such a handle, so the server writes it.
    let append = libc::O_WRONLY | libc::O_APPEND;
    let (fa, fb, ft) = (a.open("log", append, 0).unwrap(), b.open("log", append, 0).unwrap(), t.open("log", libc::O_WRONLY, 0).unwrap());
    let at_a = a.reserve(fa, 8).unwrap();
    assert_eq!(at_a, 8);
    t.ftruncate(ft, 0).unwrap();
    let at_b = b.reserve(fb, 16).unwrap();
    assert!(at_b >= at_a + 8, "B's append at {at_b} lands on A's unwritten range at {at_a}");
    b.pwrite(fb, b"BBBBBBBBBBBBBBB\n", at_b).unwrap();
    a.pwrite(fa, b"AAAAAAA\n", at_a).unwrap();
    let log = std::fs::read(s.path("log")).unwrap();
    assert_eq!(&log[at_a as usize..at_a as usize + 8], b"AAAAAAA\n");
    assert_eq!(&log[at_b as usize..], b"BBBBBBBBBBBBBBB\n", "both acknowledged appends whole");
    t.ftruncate(ft, 0).unwrap();
    assert_eq!(a.reserve(fa, 4).unwrap(), 0, "everything written: appends start at the new size");
}

#[test]
fn the_null_device_answers_at_once_and_touches_no_file() {
    let s = TestServer::start(|c| c.device = DeviceKind::Null);
    let before = pattern(1 << 20, 7);
    std::fs::write(s.path("n.dat"), &before).unwrap();
    let c = s.client("null");
    let fd = c.open("n.dat", libc::O_RDWR, 0).unwrap();
    for (off, len) in [(12_345u64, 100_000usize), (0, 4096), (10 << 20, 4096)] {
        let mut buf = vec![1u8; len];
        assert_eq!(c.pread(fd, &mut buf, off).unwrap(), len, "the asked length, past the end of the file too");
        assert!(buf.iter().all(|&b| b == 0), "zeros at {off}");
    }
    assert_eq!(c.pwrite(fd, &pattern(5000, 1), 0).unwrap(), 5000, "a write reports its length");
    assert_eq!(std::fs::read(s.path("n.dat")).unwrap(), before, "no byte of the file changed");
}
