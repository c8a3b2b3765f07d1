//! Cluster metadata on etcd: a real three-member etcd cluster
//! (`etcd-server`, installed by `make test`), two data servers and two
//! `sluice meta --store etcd://...` roles serving one namespace. During a
//! metadata-heavy run (directories, striped creates, renames, default
//! layouts) one etcd member is killed, then the role the client uses: the
//! run finishes through the other role and the namespace is intact.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_remote::{EntryKind, ErrorKind, LayoutRequest, StripedClient};
use tempfile::TempDir;

mod common;

use common::SLUICE;

/// Children killed when dropped.
struct Procs(Vec<Option<Child>>);

impl Procs {
    fn kill(&mut self, i: usize) {
        let mut c = self.0[i].take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in self.0.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    held.iter().map(|l| l.local_addr().unwrap().port()).collect()
}

/// A three-member etcd cluster on this machine: its processes and its
/// client endpoints (`127.0.0.1:PORT`).
fn etcd_cluster(dir: &Path) -> (Procs, Vec<String>) {
    let ports = free_ports(6);
    let peer = |i: usize| format!("http://127.0.0.1:{}", ports[3 + i]);
    let initial: Vec<String> = (0..3).map(|i| format!("m{i}={}", peer(i))).collect();
    let mut procs = Procs(Vec::new());
    for (i, port) in ports[..3].iter().enumerate() {
        let client = format!("http://127.0.0.1:{port}");
        let child = Command::new("etcd")
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(dir.join(format!("etcd-{i}")))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer(i), "--initial-advertise-peer-urls", &peer(i)])
            .args(["--initial-cluster", &initial.join(","), "--initial-cluster-token", "sluice-test", "--initial-cluster-state", "new"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd (apt install etcd-server; make test installs it)");
        procs.0.push(Some(child));
    }
    let endpoints: Vec<String> = ports[..3].iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ok = Command::new("etcdctl").env("ETCDCTL_API", "3").arg(format!("--endpoints={}", endpoints.join(","))).args(["endpoint", "health"]).output().unwrap();
        if ok.status.success() {
            break;
        }
        assert!(Instant::now() < deadline, "etcd did not become healthy: {}", String::from_utf8_lossy(&ok.stderr));
        std::thread::sleep(Duration::from_millis(200));
    }
    (procs, endpoints)
}

/// Start `sluice ARGS` and wait for its `export SLUICE_SERVER=` line.
fn start_role(args: &[String]) -> Child {
    let mut child = Command::new(SLUICE).args(args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        if line.starts_with("export SLUICE_SERVER=") {
            // Keep reading (and dropping) its output, so it never blocks.
            std::thread::spawn(move || for _ in out.lines() {});
            return child;
        }
        line.clear();
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("sluice {args:?} exited before serving");
}

fn data_servers(dir: &Path) -> (Procs, Vec<String>) {
    let mut procs = Procs(Vec::new());
    let mut addrs = Vec::new();
    for k in 0..2 {
        let root = dir.join(format!("data-{k}"));
        std::fs::create_dir_all(root.join("objects")).unwrap();
        let addr = format!("unix:{}", dir.join(format!("d{k}.sock")).display());
        let child = Command::new(SLUICE).args(["serve", "--root", root.to_str().unwrap(), "--listen", &addr]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        procs.0.push(Some(child));
        common::wait_for(|| sluice_client::Client::connect(&addr).is_ok(), "a data server");
        addrs.push(addr);
    }
    (procs, addrs)
}

/// A change retried while the role or the store it meets is failing
/// over: an error of the role's connection (EIO and the like) is tried
/// again; `done` says whether an answer after a retry means the first
/// try had done it (EEXIST of a mkdir, ENOENT of a rename's source).
fn retried<T>(what: &str, mut op: impl FnMut() -> sluice_remote::Result<T>, done: impl Fn(&sluice_remote::Error) -> bool) -> Option<T> {
    let mut tries = 0;
    loop {
        match op() {
            Ok(t) => return Some(t),
            Err(e) if tries > 0 && done(&e) => return None,
            Err(e) if tries < 20 && matches!(e.kind, ErrorKind::Meta | ErrorKind::Store) => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

#[test]
fn the_namespace_survives_an_etcd_member_and_a_metadata_role() {
    let dir: TempDir = tempfile::Builder::new().prefix("sluice-etcd-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (mut etcd, endpoints) = etcd_cluster(dir.path());
    let (_data, data) = data_servers(dir.path());
    let store = format!("etcd://{}", endpoints.join(","));
    let roles: Vec<PathBuf> = (0..2).map(|k| dir.path().join(format!("m{k}.sock"))).collect();
    let mut meta = Procs(Vec::new());
    for r in &roles {
        let mut args: Vec<String> = ["meta", "--store", &store, "--prefix", "test", "--listen", &format!("unix:{}", r.display())].map(String::from).to_vec();
        for d in &data {
            args.extend(["--data".to_string(), d.clone()]);
        }
        meta.0.push(Some(start_role(&args)));
    }
    let addr = roles.iter().map(|r| format!("unix:{}", r.display())).collect::<Vec<_>>().join(",");
    let c = StripedClient::connect(&addr).unwrap();
    assert_eq!(c.servers(), data.as_slice());
    const FILES: usize = 60;
    retried("mkdir run", || c.mkdir("run"), |e| e.errno == libc::EEXIST);
    for i in 0..FILES {
        if i == FILES / 3 {
            etcd.kill(0);
        }
        if i == 2 * FILES / 3 {
            meta.kill(0);
        }
        let d = format!("run/d{}", i % 5);
        if i < 5 {
            retried("mkdir", || c.mkdir(&d), |e| e.errno == libc::EEXIST);
            // setstripe on the directory: its files get 2 objects of 64 KiB.
            retried("setstripe", || c.set_dir_default(&d, LayoutRequest { stripe_bytes: 64 << 10, count: 2, start: -1 }), |_| false);
        }
        let (tmp, fin) = (format!("{d}/tmp-{i}"), format!("{d}/f-{i}"));
        let f = retried("create", || c.create(&tmp, LayoutRequest { stripe_bytes: 0, count: 0, start: -1 }), |_| false).unwrap();
        let data = vec![(i % 251) as u8 + 1; 96 << 10];
        c.pwrite(&f, &data, 0).unwrap();
        c.close(&f).unwrap();
        retried("rename", || c.rename(&tmp, &fin), |e| e.errno == libc::ENOENT && c.lookup(&fin).is_ok());
    }
    // The namespace, asked through the role left.
    let fresh = StripedClient::connect(&format!("unix:{}", roles[1].display())).unwrap();
    let mut names = Vec::new();
    for k in 0..5 {
        for (name, e) in fresh.readdir(&format!("run/d{k}")).unwrap() {
            assert_eq!(e.kind, EntryKind::File);
            let layout = e.layout.unwrap();
            assert_eq!((layout.stripe_bytes, layout.count), (64 << 10, 2), "{name} kept its directory's layout");
            names.push(format!("d{k}/{name}"));
        }
    }
    names.sort();
    let mut want: Vec<String> = (0..FILES).map(|i| format!("d{}/f-{i}", i % 5)).collect();
    want.sort();
    assert_eq!(names, want, "every file once, no temporary name left");
    for i in 0..FILES {
        let f = fresh.open(&format!("run/d{}/f-{i}", i % 5), libc::O_RDONLY).unwrap();
        let mut buf = vec![0u8; 96 << 10];
        assert_eq!(fresh.pread(&f, &mut buf, 0).unwrap(), 96 << 10);
        assert!(buf.iter().all(|&b| b == (i % 251) as u8 + 1), "file {i}'s data");
    }
    // File ids are unique across the two roles' creates.
    let mut ids: Vec<u64> = (0..FILES).map(|i| fresh.lookup(&format!("run/d{}/f-{i}", i % 5)).unwrap().id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), FILES);
}

#[test]
fn two_roles_on_one_store_see_each_others_changes_at_once() {
    let dir: TempDir = tempfile::Builder::new().prefix("sluice-etcd-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (_etcd, endpoints) = etcd_cluster(dir.path());
    let store = format!("etcd://{}", endpoints.join(","));
    // Two stores (as two roles hold them) racing on one directory.
    let a = sluice_meta::MetaStore::open_etcd(&store, "race", 1).unwrap();
    let b = sluice_meta::MetaStore::open_etcd(&store, "race", 1).unwrap();
    a.mkdir("d").unwrap();
    assert_eq!(b.lookup("d").unwrap().kind, EntryKind::Dir);
    let threads: Vec<_> = [a, b]
        .into_iter()
        .enumerate()
        .map(|(k, s)| {
            std::thread::spawn(move || {
                for i in 0..20 {
                    s.create(&format!("d/{k}-{i}"), LayoutRequest { stripe_bytes: 0, count: 0, start: -1 }, true).unwrap();
                }
                s
            })
        })
        .collect();
    let stores: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let list = stores[0].readdir("d").unwrap();
    assert_eq!(list.len(), 40);
    let mut ids: Vec<u64> = list.iter().map(|(_, e)| e.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 40, "no file id handed out twice");
    // An exclusive create of a name the other made: EEXIST; rmdir of a
    // directory the other filled: ENOTEMPTY.
    assert_eq!(stores[1].create("d/0-0", LayoutRequest { stripe_bytes: 0, count: 0, start: -1 }, true).unwrap_err().errno, libc::EEXIST);
    assert_eq!(stores[1].remove("d", Some(EntryKind::Dir)).unwrap_err().errno, libc::ENOTEMPTY);
    // A directory rename moves its subtree in one transaction, seen by
    // the other store; past the transaction's bound, nothing moves.
    stores[0].rename("d", "e").unwrap();
    assert_eq!(stores[1].readdir("e").unwrap().len(), 40);
    // The directory's count survived both stores' racing creates and
    // moved with it.
    assert_eq!(stores[1].lookup("e").unwrap().children, Some(40));
    assert_eq!(stores[1].lookup("d").unwrap_err().errno, libc::ENOENT);
    let wide = (0..70).map(|i| format!("w/{i}"));
    stores[0].mkdir("w").unwrap();
    for p in wide {
        stores[0].create(&p, LayoutRequest { stripe_bytes: 0, count: 0, start: -1 }, true).unwrap();
    }
    assert_eq!(stores[1].rename("w", "x").unwrap_err().errno, libc::EOVERFLOW);
    assert_eq!(stores[1].readdir("w").unwrap().len(), 70);
}

#[test]
fn the_metadata_benchmark_compares_redb_with_a_local_etcd() {
    let (out, v) = common::bench_json(&["meta", "--ops", "20", "--threads", "2", "--members", "1"], "meta.json");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{out}");
    assert_eq!(rows[0]["store"], "redb");
    assert!(rows[1]["store"].as_str().unwrap().starts_with("etcd"), "{out}");
    for r in rows {
        for k in ["create_per_s", "lookup_per_s", "rename_per_s", "unlink_per_s"] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{k}: {out}");
        }
    }
}
