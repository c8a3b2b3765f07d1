//! `Remote` on a real local cluster and a real single server: the address
//! says which it is, and POSIX-shaped calls (open flags, stat, readdir,
//! rename, unlink/rmdir rules, open directories) behave alike on both.
//! Plus the namespace's rename rules and bound, on the store itself.

use sluice_client::{ClientErrorKind, Fd, FileKind};
use sluice_launch::*;
use sluice_meta::*;
use sluice_remote::*;

fn cluster(servers: u32) -> (tempfile::TempDir, LocalCluster) {
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(LocalClusterConfig::new(dir.path(), servers)).unwrap();
    (dir, c)
}

fn errno<T: std::fmt::Debug>(r: RemoteResult<T>) -> i32 {
    r.expect_err("the call must fail").errno
}

#[test]
fn the_address_says_whether_it_is_a_server_or_a_cluster() {
    let (dir, cl) = cluster(2);
    assert_eq!(Remote::connect(&cl.addr()).unwrap().kind(), RemoteKind::Cluster);
    assert_eq!(Remote::connect(&cl.data_addr(0)).unwrap().kind(), RemoteKind::Server);
    // The single-server client alone gets a clear refusal, not garbage.
    let e = sluice_client::Client::connect(&cl.addr()).err().unwrap();
    assert_eq!((e.kind, e.errno), (ClientErrorKind::Connect, CLUSTER_ERRNO));
    assert!(e.message.contains("metadata role"), "{e}");
    // Nobody at the address: a connect error, either way.
    let gone = format!("unix:{}", dir.path().join("nobody.sock").display());
    assert_eq!(Remote::connect(&gone).err().unwrap().kind, ClientErrorKind::Connect);
}

#[test]
fn files_on_a_cluster_read_write_stat_and_list_like_files() {
    let (_dir, cl) = cluster(3);
    let r = Remote::connect(&cl.addr()).unwrap();
    let Remote::Cluster(k) = &r else { panic!("a cluster") };
    k.striped().set_dir_default("", LayoutRequest { stripe_bytes: 4096, count: -1, start: 0 }).unwrap();
    r.mkdir("d", 0o755).unwrap();
    let fd = r.open("d/f", libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o644).unwrap();
    assert_eq!(errno(r.open("d/f", libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o644)), libc::EEXIST);
    let data: Vec<u8> = (0..50_000u32).map(|i| (i * 7 + i / 4096) as u8).collect();
    assert_eq!(r.pwrite(fd, &data, 1000).unwrap(), data.len());
    let st = r.fstat(fd).unwrap();
    assert_eq!((st.size, st.mode & libc::S_IFMT, st.blksize), (51_000, libc::S_IFREG, 3 * 4096));
    assert_eq!(r.stat("d/f").unwrap().size, 51_000);
    let mut back = vec![1u8; 60_000];
    assert_eq!(r.pread(fd, &mut back, 0).unwrap(), 51_000, "short only at end of file");
    assert!(back[..1000].iter().all(|&b| b == 0), "the hole reads as zeros");
    assert_eq!(&back[1000..51_000], &data[..]);
    r.ftruncate(fd, 5000).unwrap();
    assert_eq!(r.fstat(fd).unwrap().size, 5000);
    r.fsync(fd).unwrap();
    r.close(fd).unwrap();
    assert_eq!(errno(r.close(fd)), libc::EBADF);
    // O_TRUNC empties every object.
    let fd = r.open("d/f", libc::O_WRONLY | libc::O_TRUNC, 0).unwrap();
    assert_eq!(r.fstat(fd).unwrap().size, 0);
    r.close(fd).unwrap();

    let st = r.stat("d").unwrap();
    assert_eq!((st.mode & libc::S_IFMT, st.size), (libc::S_IFDIR, 4096));
    assert!(st.mtime_ns > 0, "a directory records when its names changed");
    assert_ne!(st.ino, r.stat("").unwrap().ino);
    let list = r.readdir("d").unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!((list[0].name.as_str(), list[0].kind), ("f", FileKind::File));
    assert_eq!(r.readdir("").unwrap()[0].kind, FileKind::Dir);
    // "." is the root, as the FUSE mount and the interposer name it.
    assert_eq!(r.readdir(".").unwrap().len(), 1);
    assert_eq!(r.stat(".").unwrap().ino, r.stat("/").unwrap().ino);
    assert_eq!(r.stat("./d/./f").unwrap().size, 0);
}

#[test]
fn directories_open_read_only_and_posix_errors_hold_on_a_cluster() {
    let (_dir, cl) = cluster(2);
    let r = Remote::connect(&cl.addr()).unwrap();
    r.mkdir("d", 0o755).unwrap();
    let f = r.open("d/f", libc::O_WRONLY | libc::O_CREAT, 0o644).unwrap();
    r.close(f).unwrap();

    let d = r.open("d", libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
    assert_eq!(r.fstat(d).unwrap().mode & libc::S_IFMT, libc::S_IFDIR);
    assert_eq!(errno(r.pread(d, &mut [0u8; 8], 0)), libc::EISDIR);
    r.close(d).unwrap();
    assert_eq!(errno(r.open("d", libc::O_WRONLY, 0)), libc::EISDIR);
    assert_eq!(errno(r.open("d/f", libc::O_RDONLY | libc::O_DIRECTORY, 0)), libc::ENOTDIR);
    assert_eq!(errno(r.open("nope", libc::O_RDONLY, 0)), libc::ENOENT);
    assert_eq!(errno(r.mkdir("d", 0o755)), libc::EEXIST);
    assert_eq!(errno(r.unlink("d")), libc::EISDIR);
    assert_eq!(errno(r.rmdir("d/f")), libc::ENOTDIR);
    assert_eq!(errno(r.rmdir("d")), libc::ENOTEMPTY);
    assert_eq!(errno(r.stat("d/f/x")), libc::ENOENT);
    r.unlink("d/f").unwrap();
    r.rmdir("d").unwrap();
    assert!(r.readdir("").unwrap().is_empty());
}

#[test]
fn rename_moves_names_not_data_and_replaces_like_posix() {
    let (_dir, cl) = cluster(2);
    let r = Remote::connect(&cl.addr()).unwrap();
    let write = |path: &str, byte: u8| {
        let fd = r.open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644).unwrap();
        r.pwrite(fd, &vec![byte; 3 << 20], 0).unwrap();
        r.close(fd).unwrap();
    };
    let first = |path: &str| {
        let fd = r.open(path, libc::O_RDONLY, 0).unwrap();
        let mut b = [0u8; 1];
        r.pread(fd, &mut b, (3 << 20) - 1).unwrap();
        r.close(fd).unwrap();
        b[0]
    };
    r.mkdir("a", 0o755).unwrap();
    r.mkdir("a/b", 0o755).unwrap();
    write("a/b/f", 1);
    write("g", 2);
    // A file replaces a file; the replaced file's objects are removed.
    let Remote::Cluster(k) = &r else { panic!("a cluster") };
    let (old, _) = k.striped().objects("g").unwrap();
    r.rename("a/b/f", "g").unwrap();
    assert_eq!(first("g"), 1);
    assert_eq!(errno(r.stat("a/b/f")), libc::ENOENT);
    let orphan = cl.data_root(old.layout.unwrap().server_of(0)).join(format!("objects/{:016x}", old.id));
    assert!(!orphan.exists(), "the replaced file's object {} is gone", orphan.display());
    // A directory moves with its subtree.
    write("a/b/h", 3);
    r.rename("a", "z").unwrap();
    assert_eq!(first("z/b/h"), 3);
    assert_eq!(errno(r.stat("a")), libc::ENOENT);
    assert_eq!(r.readdir("z/b").unwrap().len(), 1);
    // rename(2)'s refusals.
    assert_eq!(errno(r.rename("z", "z/b/inside")), libc::EINVAL);
    assert_eq!(errno(r.rename("g", "z")), libc::EISDIR);
    assert_eq!(errno(r.rename("z", "g")), libc::ENOTDIR);
    r.mkdir("e", 0o755).unwrap();
    assert_eq!(errno(r.rename("e", "z")), libc::ENOTEMPTY);
    r.rename("z/b", "e").unwrap();
    assert_eq!(first("e/h"), 3, "a directory replaces an empty directory");
    assert_eq!(errno(r.rename("missing", "x")), libc::ENOENT);
    assert_eq!(errno(r.rename("g", "no/such/dir")), libc::ENOENT);
    r.rename("g", "g").unwrap();
    assert_eq!(first("g"), 1);
}

#[test]
fn rename_bound_at_n_and_n_plus_one() {
    let dir = tempfile::tempdir().unwrap();
    let n = 6;
    let store = MetaStore::open(&dir.path().join("m.redb"), 1).unwrap().with_rename_entries_max(n);
    store.mkdir("d").unwrap();
    for i in 0..n - 1 {
        store.create(&format!("d/f{i}"), LayoutRequest::default(), true).unwrap();
    }
    // The directory and its n - 1 entries: n moves, allowed.
    store.rename("d", "e").unwrap();
    store.create("e/one-more", LayoutRequest::default(), true).unwrap();
    let e = store.rename("e", "d").unwrap_err();
    assert_eq!((e.kind, e.errno), (ErrorKind::Limit, libc::EOVERFLOW));
    assert_eq!(store.readdir("e").unwrap().len(), n, "nothing moved");
    assert!(store.lookup("d").is_err());
}

#[test]
fn names_and_the_paths_a_rename_makes_are_bounded_at_n_and_n_plus_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(&dir.path().join("m.redb"), 1).unwrap();
    // A name of NAME_MAX bytes is taken; one more is ENAMETOOLONG.
    let name = "n".repeat(META_NAME_BYTES_MAX);
    store.mkdir(&name).unwrap();
    let e = store.mkdir(&format!("{name}x")).unwrap_err();
    assert_eq!((e.kind, e.errno), (ErrorKind::Limit, libc::ENAMETOOLONG), "{e}");
    // A rename that would make a path under the directory one byte past
    // META_PATH_BYTES_MAX is refused and moves nothing; at the bound it
    // goes through. (Before, such paths were made, and every call on them
    // was ENAMETOOLONG: the files could not be read or removed.)
    let seg = "s".repeat(200);
    let deep: Vec<String> = (0..20).map(|_| seg.clone()).collect();
    let mut path = String::from("p");
    store.mkdir(&path).unwrap();
    for s in &deep {
        path = format!("{path}/{s}");
        store.mkdir(&path).unwrap();
    }
    // "p/<20 x 200>/f" is 1 + 20 * 201 + 2 = 4,023 bytes; renaming "p"
    // to a name of L bytes makes it 4,022 + L.
    store.create(&format!("{path}/f"), LayoutRequest::default(), true).unwrap();
    let deepest = path.len() + 2;
    let fits = META_PATH_BYTES_MAX - (deepest - 1);
    assert!(fits <= META_NAME_BYTES_MAX, "the test's sizes: {fits}");
    let e = store.rename("p", &"q".repeat(fits + 1)).unwrap_err();
    assert_eq!((e.kind, e.errno), (ErrorKind::Limit, libc::ENAMETOOLONG), "{e}");
    assert!(store.lookup(&format!("{path}/f")).is_ok(), "nothing moved");
    store.rename("p", &"q".repeat(fits)).unwrap();
    let moved = format!("{}{}", "q".repeat(fits), &path[1..]);
    assert_eq!(format!("{moved}/f").len(), META_PATH_BYTES_MAX);
    assert!(store.lookup(&format!("{moved}/f")).is_ok());
}

#[test]
fn a_damaged_or_emptied_metadata_database_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.redb");
    {
        let store = MetaStore::open(&db, 1).unwrap();
        for i in 0..200 {
            store.create(&format!("f{i}"), LayoutRequest::default(), true).unwrap();
        }
    }
    let whole = std::fs::read(&db).unwrap();
    // Cut short (a copy that ran out of space): refused, not a panic.
    std::fs::write(&db, &whole[..whole.len() / 2]).unwrap();
    let e = MetaStore::open(&db, 1).err().expect("a truncated database is refused");
    assert_eq!(e.kind, ErrorKind::Store, "{e}");
    // Emptied: refused too, not taken for a new namespace (its data
    // servers still hold the old one's objects).
    std::fs::write(&db, b"").unwrap();
    let e = MetaStore::open(&db, 1).err().expect("an empty database file is refused");
    assert!(e.message.contains("empty"), "{e}");
    // A path with no file is a new namespace.
    MetaStore::open(&dir.path().join("new.redb"), 1).unwrap();
}

#[test]
fn a_full_directory_is_still_not_empty() {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(&dir.path().join("m.redb"), 1).unwrap().with_dir_entries_max(2);
    store.mkdir("d").unwrap();
    for i in 0..2 {
        store.create(&format!("d/f{i}"), LayoutRequest::default(), true).unwrap();
    }
    assert_eq!(store.create("d/f2", LayoutRequest::default(), true).unwrap_err().errno, libc::ENOSPC);
    assert_eq!(store.unlink("d").unwrap_err().errno, libc::ENOTEMPTY);
}

#[test]
fn open_files_bound_at_n_and_n_plus_one() {
    let (_dir, cl) = cluster(1);
    let mut r = Remote::connect(&cl.addr()).unwrap();
    let Remote::Cluster(k) = &mut r else { panic!("a cluster") };
    k.set_files_max(3);
    let fds: Vec<Fd> = (0..3).map(|i| r.open(&format!("f{i}"), libc::O_RDWR | libc::O_CREAT, 0o644).unwrap()).collect();
    assert_eq!(errno(r.open("f9", libc::O_RDWR | libc::O_CREAT, 0o644)), libc::ENFILE);
    r.close(fds[0]).unwrap();
    let again = r.open("f9", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    assert!(!fds.contains(&again), "handles are not reused");
}

/// Requests the data servers of `cl` served for application `app`.
fn server_requests(cl: &LocalCluster, servers: u32, app: &str) -> u64 {
    (0..servers).map(|i| sluice_client::Client::connect(&cl.data_addr(i)).unwrap().server_stats().unwrap().app(app).map_or(0, |a| a.requests)).sum()
}

#[test]
fn sequential_small_reads_come_from_one_stripe_row_read_ahead() {
    let (_dir, cl) = cluster(3);
    let opts = sluice_client::ConnectOptions { app: Some("ra".into()), ..Default::default() };
    let r = Remote::connect_with(&cl.addr(), opts).unwrap();
    let Remote::Cluster(k) = &r else { panic!("a cluster") };
    k.striped().set_dir_default("", LayoutRequest { stripe_bytes: 4096, count: -1, start: 0 }).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let w = r.open("f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    r.pwrite(w, &data, 0).unwrap();
    let before = server_requests(&cl, 3, "ra");
    let fd = r.open("f", libc::O_RDWR, 0).unwrap();
    let mut back = Vec::new();
    let mut buf = [0u8; 1000];
    loop {
        let n = r.pread(fd, &mut buf, back.len() as u64).unwrap();
        if n == 0 {
            break;
        }
        back.extend_from_slice(&buf[..n]);
        if back.len() == 1000 {
            assert_eq!(k.read_ahead_bytes(), 3 * 4096, "one stripe row held after the first read");
        }
    }
    assert_eq!(back, data);
    // 101 reads; without read-ahead each costs 3 fstats and 1-2 reads.
    let served = server_requests(&cl, 3, "ra") - before;
    assert!(served < 150, "{served} data-server requests for 101 sequential reads");
    // A write through the handle drops the window; the reader sees it.
    r.pwrite(fd, b"XYZ", 1).unwrap();
    let mut three = [0u8; 3];
    assert_eq!(r.pread(fd, &mut three, 1).unwrap(), 3);
    assert_eq!(&three, b"XYZ");
    // A random read does not fill a window.
    assert_eq!(r.pread(fd, &mut buf, 50_000).unwrap(), 1000);
    assert_eq!(k.read_ahead_bytes(), 0);
    r.close(fd).unwrap();
    r.close(w).unwrap();
}

/// A read-ahead window is one stripe row, at most `READ_AHEAD_BYTES_MAX`:
/// a row of exactly that many bytes is held whole (N), a longer one only
/// up to it (N and more), and the reads past the window still read right.
#[test]
fn a_read_ahead_window_is_a_row_of_at_most_its_bound() {
    let (_dir, cl) = cluster(3);
    let r = Remote::connect(&cl.addr()).unwrap();
    let Remote::Cluster(k) = &r else { panic!("a cluster") };
    let max = READ_AHEAD_BYTES_MAX as usize;
    let data: Vec<u8> = (0..2 * max as u32).map(|i| (i % 253) as u8).collect();
    for (name, count) in [("row-at-the-bound", 2), ("row-over-the-bound", 3)] {
        // Stripes of half the bound: a row of 2 is the bound, of 3 more.
        k.striped().set_dir_default("", LayoutRequest { stripe_bytes: READ_AHEAD_BYTES_MAX / 2, count, start: 0 }).unwrap();
        let w = r.open(name, libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
        r.pwrite(w, &data, 0).unwrap();
        r.close(w).unwrap();
        let fd = r.open(name, libc::O_RDONLY, 0).unwrap();
        let mut back = vec![0u8; data.len()];
        for (i, piece) in back.chunks_mut(1 << 20).enumerate() {
            assert_eq!(r.pread(fd, piece, (i << 20) as u64).unwrap(), piece.len());
            if i == 0 {
                assert_eq!(k.read_ahead_bytes(), max, "{name}: the window after the first read");
            }
        }
        assert!(back == data, "{name}: read back differs");
        r.close(fd).unwrap();
        assert_eq!(k.read_ahead_bytes(), 0);
    }
}

#[test]
fn another_clients_write_is_seen_once_the_window_expires() {
    let (_dir, cl) = cluster(2);
    let r = Remote::connect(&cl.addr()).unwrap();
    let other = Remote::connect(&cl.addr()).unwrap();
    let w = other.open("f", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    other.pwrite(w, &[1u8; 8192], 0).unwrap();
    let fd = r.open("f", libc::O_RDONLY, 0).unwrap();
    let mut b = [0u8; 100];
    r.pread(fd, &mut b, 0).unwrap();
    other.pwrite(w, &[2u8; 100], 100).unwrap();
    std::thread::sleep(READ_AHEAD_TTL + std::time::Duration::from_millis(50));
    assert_eq!(r.pread(fd, &mut b, 100).unwrap(), 100);
    assert_eq!(b, [2u8; 100], "a window older than READ_AHEAD_TTL is not served");
}

/// The audit's case: one process, one mount (one `Remote`), two handles.
/// A write and `fsync` through one, then a read through the other that
/// its window would have answered: the new bytes, not the window's.
#[test]
fn a_write_through_another_handle_of_this_remote_is_seen_at_once() {
    let (_dir, cl) = cluster(2);
    let r = Remote::connect(&cl.addr()).unwrap();
    let Remote::Cluster(k) = &r else { panic!("a cluster") };
    let w = r.open("f", libc::O_WRONLY | libc::O_CREAT, 0o644).unwrap();
    r.pwrite(w, &[b'A'; 65_536], 0).unwrap();
    let fd = r.open("f", libc::O_RDONLY, 0).unwrap();
    let mut b = [0u8; 4096];
    assert_eq!(r.pread(fd, &mut b, 0).unwrap(), 4096);
    assert!(k.read_ahead_bytes() > 0, "the reader holds a window");
    r.pwrite(w, &[b'B'; 65_536], 0).unwrap();
    r.fsync(w).unwrap();
    assert_eq!(r.pread(fd, &mut b, 4096).unwrap(), 4096);
    assert!(b.iter().all(|&c| c == b'B'), "the window filled before the write is not served: {} old bytes", b.iter().filter(|&&c| c == b'A').count());
    // A truncate through the other handle too.
    assert_eq!(r.pread(fd, &mut b, 8192).unwrap(), 4096);
    r.ftruncate(w, 10_000).unwrap();
    assert_eq!(r.pread(fd, &mut b, 12_288).unwrap(), 0, "past the truncated end");
    // Every handle of the file shares one generation: one entry.
    assert_eq!(k.generations_kept(), 1);
    r.close(fd).unwrap();
    r.close(w).unwrap();
}

#[test]
fn write_generations_are_bounded_by_the_open_files_bound() {
    let (_dir, cl) = cluster(1);
    let mut r = Remote::connect(&cl.addr()).unwrap();
    let Remote::Cluster(k) = &mut r else { panic!("a cluster") };
    k.set_files_max(3);
    // Each file opened and closed: its entry stays until the table is
    // full (N = 3), then the dead ones go before the next is added.
    for i in 0..3 {
        let fd = r.open(&format!("f{i}"), libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
        r.close(fd).unwrap();
    }
    let Remote::Cluster(k) = &r else { panic!("a cluster") };
    assert_eq!(k.generations_kept(), 3);
    let fd = r.open("f3", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    assert_eq!(k.generations_kept(), 1, "N + 1: the dead entries dropped, the live one added");
    r.close(fd).unwrap();
}

#[test]
fn read_ahead_bound_at_n_and_n_plus_one() {
    let (_dir, cl) = cluster(2);
    let mut r = Remote::connect(&cl.addr()).unwrap();
    let row = 2 << 20; // the root default: 1 MiB stripes, here over 2 servers
    let Remote::Cluster(k) = &mut r else { panic!("a cluster") };
    k.striped().set_dir_default("", LayoutRequest { stripe_bytes: 1 << 20, count: -1, start: 0 }).unwrap();
    k.set_read_ahead_max(row);
    for name in ["a", "b"] {
        let fd = r.open(name, libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
        r.pwrite(fd, &vec![7u8; 3 << 20], 0).unwrap();
        r.close(fd).unwrap();
    }
    let Remote::Cluster(k) = &r else { panic!("a cluster") };
    let (a, b) = (r.open("a", libc::O_RDONLY, 0).unwrap(), r.open("b", libc::O_RDONLY, 0).unwrap());
    let mut buf = vec![0u8; 4096];
    r.pread(a, &mut buf, 0).unwrap();
    assert_eq!(k.read_ahead_bytes(), row, "N bytes: held");
    r.pread(b, &mut buf, 0).unwrap();
    assert_eq!(k.read_ahead_bytes(), row, "N + row bytes: refused, b reads without read-ahead");
    assert_eq!(buf, vec![7u8; 4096]);
    r.close(a).unwrap();
    assert_eq!(k.read_ahead_bytes(), 0, "close gives the window back");
    r.pread(b, &mut buf, 4096).unwrap();
    assert_eq!(k.read_ahead_bytes(), row);
    // End of file from a window: short, then 0.
    let mut big = vec![0u8; 1 << 20];
    let (mut at, mut total) = (8192u64, 8192usize);
    loop {
        let n = r.pread(b, &mut big, at).unwrap();
        if n == 0 {
            break;
        }
        (at, total) = (at + n as u64, total + n);
    }
    assert_eq!(total, 3 << 20);
}
