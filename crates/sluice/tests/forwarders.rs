//! A forwarder set end to end: four `sluice serve` processes over one
//! root, reached through one address list. Every client sends a file's
//! requests to the file's home; a forwarder killed mid-run leaves the set
//! and unmodified programs under `sluice run` finish, with every byte
//! they wrote and fsync'd on disk; a silent one is left after the
//! client's timeout; the open-handle table is bounded.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_client::{Client, ClientErrorKind, ConnectOptions, Fd};
use sluice_remote::{Forwarders, Home, Remote, RETIRED_MAX};
use tempfile::TempDir;

mod common;

use common::{preload_library, SLUICE};

/// `n` `sluice serve` processes over one root, killed when dropped.
struct Set {
    dir: TempDir,
    children: Vec<Option<Child>>,
    addrs: Vec<String>,
}

impl Set {
    fn start(n: usize, extra: &[&str]) -> Set {
        let dir = tempfile::Builder::new().prefix("sluice-fwd-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let mut set = Set { children: Vec::new(), addrs: Vec::new(), dir };
        for k in 0..n {
            let addr = format!("unix:{}", set.dir.path().join(format!("f{k}.sock")).display());
            let root = set.dir.path().join("root");
            let child =
                Command::new(SLUICE).args(["serve", "--root", root.to_str().unwrap(), "--listen", &addr]).args(extra).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
            set.children.push(Some(child));
            let deadline = Instant::now() + Duration::from_secs(10);
            while Client::connect(&addr).is_err() {
                assert!(Instant::now() < deadline, "sluice serve {k} did not come up");
                std::thread::sleep(Duration::from_millis(10));
            }
            set.addrs.push(addr);
        }
        set
    }

    fn addr(&self) -> String {
        self.addrs.join(",")
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn index(&self, addr: &str) -> usize {
        self.addrs.iter().position(|a| a == addr).unwrap()
    }

    fn kill(&mut self, k: usize) {
        let mut c = self.children[k].take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    fn signal(&self, k: usize, sig: i32) {
        let pid = self.children[k].as_ref().unwrap().id() as i32;
        // SAFETY: signalling our own child process by its pid.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        // kill returns before a stop takes effect: a request sent at once
        // could still be answered. Wait until every thread is stopped.
        if sig == libc::SIGSTOP {
            let deadline = Instant::now() + Duration::from_secs(5);
            let stopped = || {
                std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
                    tasks
                        .flatten()
                        .all(|t| std::fs::read_to_string(t.path().join("stat")).is_ok_and(|st| st.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('T'))))
                })
            };
            while !stopped() {
                assert!(Instant::now() < deadline, "server {k} did not stop");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Requests application `app` made on forwarder `k`.
    fn requests(&self, k: usize, app: &str) -> u64 {
        let c = Client::connect(&self.addrs[k]).unwrap();
        c.server_stats().unwrap().app(app).map_or(0, |a| a.requests)
    }
}

impl Drop for Set {
    fn drop(&mut self) {
        for c in self.children.iter_mut().flatten() {
            // A stopped one must be woken to die cleanly.
            // SAFETY: signalling our own child process by its pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn opts(app: &str, client: u32) -> ConnectOptions {
    ConnectOptions { app: Some(app.into()), client_id: Some(client), ..ConnectOptions::default() }
}

fn set_of(r: &Remote) -> &Forwarders {
    match r {
        Remote::Forwarders(f) => f,
        _ => panic!("an address list is a forwarder set"),
    }
}

#[test]
fn every_client_of_a_file_reaches_its_home_and_only_it() {
    // Every read and write is a request: no lease lets a client do one itself.
    let set = Set::start(4, &["--no-write-leases"]);
    let opts = |app: &str, client| ConnectOptions { leases: false, ..opts(app, client) };
    let mut homes = std::collections::HashSet::new();
    for i in 0..8 {
        let (path, app) = (format!("f{i}.dat"), format!("homed-{i}"));
        // Two processes of one application, different clients.
        let a = Remote::connect_with(&set.addr(), opts(&app, 1)).unwrap();
        let b = Remote::connect_with(&set.addr(), opts(&app, 2)).unwrap();
        let home = set_of(&a).home_addr(&path).unwrap();
        assert_eq!(home, set_of(&b).home_addr(&format!("/./{path}")).unwrap(), "one home whatever the spelling");
        homes.insert(home.clone());
        let fa = a.open(&path, libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
        let fb = b.open(&path, libc::O_RDWR, 0).unwrap();
        a.pwrite(fa, &[1u8; 4096], 0).unwrap();
        b.pwrite(fb, &[2u8; 4096], 4096).unwrap();
        let mut buf = vec![0u8; 8192];
        assert_eq!(a.pread(fa, &mut buf, 0).unwrap(), 8192);
        assert!(buf[..4096].iter().all(|&x| x == 1) && buf[4096..].iter().all(|&x| x == 2));
        let per: Vec<u64> = (0..4).map(|k| set.requests(k, &app)).collect();
        let at = set.index(&home);
        assert!(per[at] >= 3, "the home served them: {per:?}");
        assert_eq!(per.iter().sum::<u64>(), per[at], "no other forwarder saw the file: {per:?}");
        a.close(fa).unwrap();
        b.close(fb).unwrap();
    }
    assert!(homes.len() >= 2, "eight files all on one forwarder: {homes:?}");
    // A home per client puts one file's clients on their own forwarders.
    let by_client: std::collections::HashSet<String> =
        (0..16).map(|c| Forwarders::connect_homed(&set.addrs, opts("by-client", c), Home::Client).unwrap().home_addr("f0.dat").unwrap()).collect();
    assert!(by_client.len() >= 2, "{by_client:?}");
}

#[test]
fn the_open_handle_table_is_bounded() {
    let set = Set::start(2, &[]);
    let mut f = Forwarders::connect_homed(&set.addrs, opts("bound", 1), Home::File).unwrap();
    f.set_files_max(2);
    let r = Remote::Forwarders(f);
    let a = r.open("a", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let _b = r.open("b", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let e = r.open("c", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap_err();
    assert_eq!(e.errno, libc::ENFILE, "{e}");
    r.close(a).unwrap();
    r.open("c", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    assert_eq!(r.close(Fd(999)).unwrap_err().errno, libc::EBADF);
}

#[test]
fn a_dead_member_is_passed_over_and_a_silent_one_is_left() {
    let mut set = Set::start(3, &[]);
    let mut addrs = set.addrs.clone();
    addrs.push(format!("unix:{}", set.dir.path().join("never.sock").display()));
    // A member that never answers: its files live on the others.
    let f = Forwarders::connect_homed(&addrs, opts("silent", 1), Home::File).unwrap();
    let homes: Vec<String> = (0..32).map(|i| f.home_addr(&format!("g{i}")).unwrap()).collect();
    assert!(!homes.contains(&addrs[3]), "a dead member is no home");
    assert!(!f.live().contains(&addrs[3]));
    // A home that stops answering: after the timeout the call goes on
    // at the next home.
    std::fs::write(set.root().join("s.dat"), vec![7u8; 8192]).unwrap();
    // (Soft, and no leases: every read asks the server.)
    let o = ConnectOptions { timeout: Duration::from_secs(1), recovery: sluice_client::Recovery::Soft, leases: false, ..opts("silent", 2) };
    let r = Remote::Forwarders(Forwarders::connect_homed(&set.addrs, o, Home::File).unwrap());
    let fd = r.open("s.dat", libc::O_RDONLY, 0).unwrap();
    let home = set.index(&set_of(&r).home_addr("s.dat").unwrap());
    set.signal(home, libc::SIGSTOP);
    let t = Instant::now();
    let mut buf = vec![0u8; 8192];
    assert_eq!(r.pread(fd, &mut buf, 0).unwrap(), 8192);
    assert!(buf.iter().all(|&x| x == 7));
    assert!(t.elapsed() >= Duration::from_millis(900), "left before its timeout: {:?}", t.elapsed());
    assert_eq!(set_of(&r).failovers(), 1);
    assert_ne!(set.index(&set_of(&r).home_addr("s.dat").unwrap()), home);
    set.signal(home, libc::SIGCONT);
    set.kill(home);
    // With every member gone, a soft set fails at its timeout.
    for k in 0..3 {
        if k != home {
            set.kill(k);
        }
    }
    let t = Instant::now();
    let e = r.stat("s.dat").unwrap_err();
    assert_eq!(e.kind, ClientErrorKind::Timeout, "{e}");
    assert!(e.message.contains("no member of the forwarder set"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// An open file that moves to another member keeps its handle on the
/// former home until it is closed, at most `RETIRED_MAX` of them: after N
/// moves it holds N, after N+1 still N (the oldest closed).
#[test]
fn an_open_file_keeps_at_most_retired_max_former_homes() {
    let n = RETIRED_MAX;
    let mut set = Set::start(n + 2, &[]);
    std::fs::write(set.root().join("m.dat"), vec![9u8; 4096]).unwrap();
    let o = ConnectOptions { leases: false, ..opts("moves", 1) };
    let r = Remote::Forwarders(Forwarders::connect_homed(&set.addrs, o, Home::File).unwrap());
    let fd = r.open("m.dat", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 4096];
    for moved in 1..=n + 1 {
        let home = set.index(&set_of(&r).home_addr("m.dat").unwrap());
        set.kill(home);
        assert_eq!(r.pread(fd, &mut buf, 0).unwrap(), 4096, "read after move {moved}");
        assert!(buf.iter().all(|&x| x == 9));
        assert_eq!(set_of(&r).retired_handles(fd).unwrap(), moved.min(n), "after {moved} moves");
    }
    r.close(fd).unwrap();
}

/// Each writer: `BLOCKS` blocks of 64 KiB into one shared file, block `b`
/// of rank `r` at `(b * RANKS + r) * 64 KiB`, each `fsync`ed, then a line
/// `synced b SECONDS` (monotonic).
const WRITER: &str = r#"
import os, sys, time
path, rank, ranks, blocks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
for b in range(blocks):
    block = bytes([(b * ranks + rank) % 251 + 1]) * 65536
    os.pwrite(fd, block, (b * ranks + rank) * 65536)
    os.fsync(fd)
    print("synced", b, time.monotonic(), flush=True)
    time.sleep(0.02)
os.close(fd)
"#;

#[test]
fn a_killed_forwarder_fails_over_and_every_fsynced_byte_is_on_disk() {
    const RANKS: usize = 4;
    const BLOCKS: usize = 60;
    let mut set = Set::start(4, &[]);
    let prefix = set.dir.path().join("svc");
    let probe = Forwarders::connect_homed(&set.addrs, opts("probe", 1), Home::File).unwrap();
    let home = set.index(&probe.home_addr("shared.dat").unwrap());
    drop(probe);
    let synced: Arc<Mutex<Vec<Vec<f64>>>> = Arc::new(Mutex::new(vec![Vec::new(); RANKS]));
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for rank in 0..RANKS {
        let mut c = Command::new("timeout")
            .arg("60")
            .arg(SLUICE)
            .args(["run", "--server", &set.addr(), "--prefix", prefix.to_str().unwrap(), "--app", "failover", "--", "python3", "-c", WRITER])
            .arg(format!("{}/shared.dat", prefix.display()))
            .args([rank.to_string(), RANKS.to_string(), BLOCKS.to_string()])
            .env("SLUICE_PRELOAD", preload_library())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(c.stdout.take().unwrap());
        let s = Arc::clone(&synced);
        readers.push(std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let t: f64 = line.split_whitespace().nth(2).and_then(|t| t.parse().ok()).unwrap();
                s.lock().unwrap()[rank].push(t);
            }
        }));
        writers.push(c);
    }
    // Kill the file's home once every writer has fsync'd a quarter.
    common::wait_for(|| synced.lock().unwrap().iter().all(|v| v.len() >= BLOCKS / 4), "writers to sync a quarter");
    let before: Vec<usize> = synced.lock().unwrap().iter().map(Vec::len).collect();
    // SAFETY: clock_gettime into a local timespec.
    let killed_at = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
        ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
    };
    set.kill(home);
    for (rank, c) in writers.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "writer {rank} failed after the kill: {err}");
        assert!(err.contains("left the set"), "writer {rank} did not say the forwarder left: {err}");
    }
    readers.into_iter().for_each(|t| t.join().unwrap());
    let synced = synced.lock().unwrap();
    // Failover time: from the kill to each writer's first block fsync'd
    // after it (the writers pause 20 ms between blocks).
    let mut worst: f64 = 0.0;
    for v in synced.iter() {
        assert_eq!(v.len(), BLOCKS);
        let next = v.iter().position(|&t| t > killed_at).unwrap();
        worst = worst.max(v[next] - killed_at);
    }
    eprintln!("failover: {:.3} s (blocks synced before the kill: {before:?})", worst);
    assert!(worst <= 2.0, "failover took {worst:.3} s");
    let data = std::fs::read(set.root().join("shared.dat")).unwrap();
    assert_eq!(data.len(), RANKS * BLOCKS * 65536);
    for (i, block) in data.chunks(65536).enumerate() {
        assert!(block.iter().all(|&x| x == (i % 251) as u8 + 1), "block {i} is not what was written");
    }
}

#[test]
fn the_benchmark_shows_what_a_home_per_client_loses() {
    let (out, v) = common::bench_json(&["forwarders", "--runs", "1", "--procs", "8", "--scale", "0.00025"], "fwd.json");
    let setups = v["setups"].as_array().unwrap();
    let names: Vec<&str> = setups.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["one server", "set, home per file", "set, home per client"], "{out}");
    let rpd = |i: usize| setups[i]["requests_per_dispatch"][0].as_f64().unwrap();
    // One file, one home: its eight readers meet in one scheduler; with a
    // home per client they are split over the set and interleave on the
    // shared disk.
    assert!(rpd(1) > 2.0 * rpd(2), "per file {} against per client {}: {out}", rpd(1), rpd(2));
    assert!(setups[2]["seeks"][0].as_u64().unwrap() > setups[1]["seeks"][0].as_u64().unwrap(), "{out}");
}
