//! End-to-end tests of `sluice serve`, `sluice cp` and `sluice ls` as real
//! processes: SIGTERM drains; a killed or restarted server is recovered
//! from as an NFS hard mount would (reads retried, writes in flight EIO,
//! handles reopened, ESTALE for vanished files), a soft client times out
//! instead of hanging, a stopped server is reported once; and the commands
//! copy byte-identically and refuse paths outside the root with a one-line
//! reason.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sluice_client::{Client, ClientErrorKind, ConnectOptions, Recovery, Whence};
use tempfile::TempDir;

mod common;

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// A `sluice serve` process, killed when dropped.
struct Serve {
    child: Option<Child>,
    dir: TempDir,
    addr: String,
    args: Vec<String>,
}

impl Serve {
    fn start(extra: &[&str]) -> Serve {
        let dir = tempfile::Builder::new().prefix("sluice-e2e-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let sock = dir.path().join("s.sock");
        let addr = format!("unix:{}", sock.display());
        let root = dir.path().join("root");
        let mut args: Vec<String> = ["serve", "--root", root.to_str().unwrap(), "--listen", &addr].map(String::from).to_vec();
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut s = Serve { child: None, dir, addr, args };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        self.child = Some(Command::new(SLUICE).args(&self.args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Client::connect(&self.addr).is_err() {
            assert!(Instant::now() < deadline, "sluice serve did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL the server (nothing drained).
    fn kill(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn client(&self, app: &str) -> Client {
        Client::connect_with(&self.addr, ConnectOptions { app: Some(app.into()), ..ConnectOptions::default() }).unwrap()
    }

    fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: signalling our own child process by its pid.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    fn wait(&mut self) -> Output {
        self.child.take().unwrap().wait_with_output().unwrap()
    }

    fn cmd(&self, args: &[&str]) -> Output {
        self.cmd_env(args, &[])
    }

    fn cmd_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        Command::new(SLUICE).args(args).env("SLUICE_SERVER", &self.addr).envs(env.iter().copied()).current_dir(self.dir.path()).output().unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8).collect()
}

#[test]
fn sigterm_drains_in_flight_requests_and_prints_the_summary() {
    let mut s = Serve::start(&["--device", "hdd7200"]);
    // Far-apart reads on the emulated disk: ~14 ms each, ~170 ms in all, so
    // the drain (which starts within 50 ms of the signal) overlaps them.
    let f = std::fs::File::create(s.root().join("f")).unwrap();
    f.set_len(64 << 20).unwrap();
    let piece = |i: u64| bytes(64 << 10, i as u8);
    for i in 0..12u64 {
        std::os::unix::fs::FileExt::write_all_at(&f, &piece(i), i * (5 << 20)).unwrap();
    }
    // No recovery: the last check is that the drain closed the connection.
    let c = Client::connect_with(&s.addr, ConnectOptions { app: Some("drainer".into()), recovery: Recovery::Off, ..ConnectOptions::default() }).unwrap();
    let fd = c.open("f", libc::O_RDWR, 0).unwrap();
    let reads: Vec<_> = (0..12u64).map(|i| (i, c.submit_read(fd, 64 << 10, i * (5 << 20)).unwrap())).collect();
    let write = c.submit_write(fd, &[0xAB; 4096], 63 << 20).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    s.signal(libc::SIGTERM);
    for (i, t) in reads {
        let mut buf = vec![0u8; 64 << 10];
        assert_eq!(c.wait_read(t, &mut buf).expect("admitted reads finish during the drain"), 64 << 10);
        assert!(buf == piece(i), "read {i}");
    }
    assert_eq!(c.wait_write(write).expect("admitted writes finish during the drain"), 4096);
    let out = s.wait();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("draining") && stdout.contains("drainer") && stdout.contains("stopped cleanly: 13 requests"), "{stdout}");
    assert_eq!(c.stat("f").unwrap_err().kind, ClientErrorKind::Disconnected, "the connection is closed after the drain");
    assert_eq!(&std::fs::read(s.root().join("f")).unwrap()[63 << 20..(63 << 20) + 4096], &[0xAB; 4096]);
}

/// A client that gives up: `Soft` with a 1 s timeout.
fn soft(app: &str) -> ConnectOptions {
    ConnectOptions { app: Some(app.into()), recovery: Recovery::Soft, timeout: Duration::from_secs(1), ..ConnectOptions::default() }
}

#[test]
fn killed_server_fails_a_soft_clients_reads_with_etimedout_not_a_hang() {
    let mut s = Serve::start(&["--device", "hdd7200"]);
    std::fs::write(s.root().join("f"), bytes(32 << 20, 2)).unwrap();
    let c = Client::connect_with(&s.addr, soft("victim")).unwrap();
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let tickets: Vec<_> = (0..8u64).map(|i| c.submit_read(fd, 1 << 20, i * (4 << 20)).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(5));
    s.kill();
    let started = Instant::now();
    let results: Vec<_> = tickets.into_iter().map(|t| c.wait_read(t, &mut vec![0u8; 1 << 20])).collect();
    assert!(started.elapsed() < Duration::from_secs(8), "a soft client gives up after its timeout: {:?}", started.elapsed());
    let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(!failed.is_empty(), "the server died with reads in flight");
    for e in failed {
        assert_eq!((e.kind, e.errno), (ClientErrorKind::Timeout, libc::ETIMEDOUT), "{e}");
    }
    assert_eq!(c.stat("f").unwrap_err().errno, libc::ETIMEDOUT);
}

/// Regression: processes running when the server restarted got EIO forever.
#[test]
fn a_restarted_server_is_reconnected_reads_retried_writes_failed_handles_reopened() {
    let mut s = Serve::start(&["--device", "hdd7200"]);
    let data = bytes(16 << 20, 5);
    std::fs::write(s.root().join("f"), &data).unwrap();
    let c = s.client("survivor");
    let fd = c.open("f", libc::O_RDWR, 0).unwrap();
    assert_eq!(c.lseek(fd, 1000, Whence::Set).unwrap(), 1000);
    // Far-apart work on the emulated disk, so some is in flight at the kill.
    let reads: Vec<_> = (0..4u64).map(|i| c.submit_read(fd, 1 << 20, i * (4 << 20)).unwrap()).collect();
    let write = c.submit_write(fd, &[0xCD; 4096], 15 << 20).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    s.kill();
    std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            s.spawn();
        });
        for (i, t) in reads.into_iter().enumerate() {
            let mut buf = vec![0u8; 1 << 20];
            assert_eq!(c.wait_read(t, &mut buf).expect("reads are retried on the new connection"), 1 << 20);
            let at = i * (4 << 20);
            assert!(buf == data[at..at + (1 << 20)], "read {i}");
        }
        match c.wait_write(write) {
            Ok(n) => assert_eq!(n, 4096, "acknowledged before the kill"),
            Err(e) => assert_eq!((e.kind, e.errno), (ClientErrorKind::Disconnected, libc::EIO), "a write in flight is EIO, never resent: {e}"),
        }
    });
    assert_eq!(c.reconnects(), 1);
    // The held handle was reopened by path; its position is the client's.
    let mut buf = [0u8; 10];
    assert_eq!(c.read(fd, &mut buf).unwrap(), 10);
    assert_eq!(&buf, &data[1000..1010]);
    assert_eq!(c.pwrite(fd, b"after", 0).unwrap(), 5, "writes work again");
    assert_eq!(&std::fs::read(s.root().join("f")).unwrap()[..5], b"after");
}

#[test]
fn a_file_gone_or_replaced_across_a_restart_is_estale_and_others_still_work() {
    let mut s = Serve::start(&[]);
    std::fs::write(s.root().join("gone"), b"x").unwrap();
    std::fs::write(s.root().join("kept"), b"kept").unwrap();
    std::fs::write(s.root().join("replaced"), b"mine").unwrap();
    let c = s.client("stale");
    let (gone, kept) = (c.open("gone", libc::O_RDONLY, 0).unwrap(), c.open("kept", libc::O_RDONLY, 0).unwrap());
    let replaced = c.open("replaced", libc::O_RDWR, 0).unwrap();
    s.kill();
    std::fs::remove_file(s.root().join("gone")).unwrap();
    // Another file takes the path: reopened by path, the handle would
    // read and write it (it did, before the inode number was checked).
    std::fs::write(s.root().join("other"), b"theirs").unwrap();
    std::fs::rename(s.root().join("other"), s.root().join("replaced")).unwrap();
    s.spawn();
    let e = c.pread(gone, &mut [0u8; 1], 0).unwrap_err();
    assert_eq!((e.kind, e.errno), (ClientErrorKind::Stale, libc::ESTALE), "{e}");
    let e = c.pwrite(replaced, b"MINE", 0).unwrap_err();
    assert_eq!((e.kind, e.errno), (ClientErrorKind::Stale, libc::ESTALE), "{e}");
    assert_eq!(std::fs::read(s.root().join("replaced")).unwrap(), b"theirs");
    let mut buf = [0u8; 4];
    assert_eq!(c.pread(kept, &mut buf, 0).unwrap(), 4);
    assert_eq!(&buf, b"kept");
    c.close(gone).unwrap();
}

/// Regression: a SIGSTOPped server hung every client with no message.
#[test]
fn a_stopped_server_is_reported_once_then_ok_and_a_soft_client_times_out() {
    let s = Serve::start(&[]);
    std::fs::write(s.root().join("x"), b"x").unwrap();
    s.signal(libc::SIGSTOP);
    let soft_ls = s.cmd_env(&["ls", ":"], &[("SLUICE_TIMEOUT", "1"), ("SLUICE_SOFT", "1")]);
    assert!(!soft_ls.status.success());
    assert!(String::from_utf8_lossy(&soft_ls.stderr).contains("Connection timed out") || String::from_utf8_lossy(&soft_ls.stderr).contains("did not answer"), "{soft_ls:?}");
    let hard = Command::new(SLUICE).args(["ls", ":"]).env("SLUICE_SERVER", &s.addr).env("SLUICE_TIMEOUT", "1").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    s.signal(libc::SIGCONT);
    let out = hard.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "x\n");
    assert_eq!(err.matches("not responding, still trying").count(), 1, "said once: {err}");
    assert!(err.contains(&format!("server {} OK", s.addr)), "{err}");
}

fn check_cmd(out: &Output, ok: bool, stderr_has: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.success(), ok, "{err}");
    assert!(err.contains(stderr_has), "stderr {err:?} lacks {stderr_has:?}");
    assert!(err.lines().count() <= 1, "one-line reason: {err:?}");
}

fn same_file(a: &Path, b: &Path) {
    assert!(std::fs::read(a).unwrap() == std::fs::read(b).unwrap(), "{} and {} differ", a.display(), b.display());
}

#[test]
fn cp_and_ls_copy_byte_identically_and_refuse_escapes() {
    let s = Serve::start(&["--direct"]);
    let src = s.dir.path().join("in.dat");
    std::fs::write(&src, bytes((9 << 20) + 12_345, 3)).unwrap();
    std::fs::create_dir(s.root().join("data")).unwrap();
    check_cmd(&s.cmd(&["cp", "in.dat", ":data/in.dat"]), true, "");
    same_file(&src, &s.root().join("data/in.dat"));
    check_cmd(&s.cmd(&["cp", ":data/in.dat", "out.dat"]), true, "");
    same_file(&src, &s.dir.path().join("out.dat"));
    let ls = s.cmd(&["ls", ":data"]);
    check_cmd(&ls, true, "");
    assert_eq!(String::from_utf8_lossy(&ls.stdout), "in.dat\n");
    check_cmd(&s.cmd(&["cp", ":../outside", "x"]), false, "sluice: cp: ../outside: path escapes the server root");
    check_cmd(&s.cmd(&["cp", ":/etc/passwd", "x"]), false, "absolute paths are refused");
    // Regression: a destination `:/abs` was silently made relative.
    check_cmd(&s.cmd(&["cp", "in.dat", ":/abs.dat"]), false, "absolute paths are refused");
    assert!(!s.root().join("abs.dat").exists());
    check_cmd(&s.cmd(&["cp", "in.dat", ":"]), true, "");
    same_file(&src, &s.root().join("in.dat"));
    // Regression: striping commands pointed at a data server say so.
    check_cmd(&s.cmd(&["setstripe", "-S", "1M", "-c", "2", "x"]), false, "is a sluice data server, not a cluster's metadata role");
    check_cmd(&s.cmd(&["ls", ":.."]), false, "escapes the server root");
    check_cmd(&s.cmd(&["cp", "a", "b"]), false, "neither");
    let absent = Command::new(SLUICE).args(["ls", "--server", "unix:/nonexistent.sock", ":"]).output().unwrap();
    check_cmd(&absent, false, "cannot connect to sluice server at unix:/nonexistent.sock");
}

/// A pipelined read or write (what `sluice cp` and `sluice array migrate`
/// use) whose later pieces the server refuses (more in flight than a
/// connection may have) returns the refusal only after every piece it sent
/// was answered: none is left for the connection to keep for good, and the
/// next call on it works.
#[test]
fn a_refused_pipelined_call_leaves_no_reply_behind() {
    let root = tempfile::Builder::new().prefix("sluice-pipelined-").tempdir().unwrap();
    let sock = root.path().join("s.sock");
    std::fs::write(root.path().join("f"), bytes(1 << 20, 5)).unwrap();
    let mut cfg = sluice_server::ServerConfig::new(root.path(), sluice_server::Listen::Unix(sock.clone()));
    cfg.limits.inflight_per_connection_max = 4;
    // Each piece holds the emulated disk for milliseconds: the first four
    // are still in flight when the others arrive.
    cfg.device = sluice_server::DeviceKind::Hdd7200;
    let server = sluice_server::Server::start(cfg).unwrap();
    // Answers on the socket (no shared region): the ones not waited for
    // would stay there.
    let opts = ConnectOptions { shm: false, ..ConnectOptions::default() };
    let remote = sluice_remote::Remote::connect_with(&format!("unix:{}", sock.display()), opts).unwrap();
    let sluice_remote::Remote::Server(c) = &remote else { panic!("one server") };
    let fd = remote.open("f", libc::O_RDWR, 0).unwrap();
    let mut buf = vec![0u8; 16 * 4096];
    let e = remote.read_pipelined(fd, &mut buf, 0, 4096).unwrap_err();
    assert_eq!(e.errno, libc::EAGAIN, "{e}");
    let e = remote.write_pipelined(fd, &buf, 0, 4096).unwrap_err();
    assert_eq!(e.errno, libc::EAGAIN, "{e}");
    let mut one = vec![0u8; 4096];
    assert_eq!(remote.read_pipelined(fd, &mut one, 8192, 4096).unwrap(), 4096);
    assert_eq!(one, bytes(1 << 20, 5)[8192..12_288]);
    assert_eq!(c.replies_unclaimed(), 0, "replies of pieces the calls never waited for");
    drop(remote);
    drop(server);
}

/// The stalled-writes probe: 60 connections each send 16 MiB of a 64 MiB write and
/// stall. Before the budget this added 1 GB to the server; now at most
/// `partial_bytes_max` (512 MiB by default) plus the chunks in flight.
/// Measured by `sluice bench connections --stalled-writes`, on a `sluice
/// serve` child.
#[test]
fn sixty_stalled_64_mib_writes_add_at_most_the_partial_budget_to_rss() {
    let (out, v) = common::bench_json(&["connections", "--count", "1", "--rtt-requests", "10", "--stalled-writes", "60"], "stall.json");
    assert!(out.contains("60 stalled writes (16 MiB of 64 MiB sent each)"), "{out}");
    let (grown, budget) = (v["stalled_rss_added_mib"].as_f64().unwrap(), v["partial_budget_mib"].as_f64().unwrap());
    assert_eq!(budget, 512.0, "{v}");
    // Slack: one 1 MiB chunk being filled per connection, and the stashes.
    assert!(grown <= budget + 60.0, "RSS grew by {grown} MiB, over the {budget} MiB budget");
    // Each body reserves its 64 MiB when its header arrives: eight fit the
    // budget, and each holds the 16 MiB it received (128 MiB).
    assert!(grown >= 96.0, "the probe did not load the server ({grown} MiB): the check would prove nothing");
}

/// `sluice bench service` measures the IPC floor in the same run and
/// reports the service's ratio to it (the service's measuring stick).
#[test]
fn bench_service_reports_the_floor_and_the_ratio_to_it() {
    let (out, v) = common::bench_json(&["service", "--size-mib", "4", "--rounds", "1", "--rtt-requests", "300"], "svc.json");
    assert!(out.contains("IPC floor, same bytes"));
    let (rtt, floor, ratio) = (v["rtt_4k_us"].as_f64().unwrap(), v["floor_4k_us"].as_f64().unwrap(), v["rtt_ratio_to_floor"].as_f64().unwrap());
    assert!(floor > 0.0 && rtt > 0.0, "{v}");
    assert!((ratio - rtt / floor).abs() < 1e-9, "{v}");
}

/// `sluice bench matrix --quick`: every workload row, each judged, JSON
/// as docs/bench.md says, scratch removed (the default policy's yardstick).
#[test]
fn bench_matrix_quick_judges_every_row_and_writes_json() {
    let (out, v) = common::bench_json(&["matrix", "--quick"], "m.json");
    assert!(out.contains("rows where aioli is over 1.05x"));
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 15, "12 library rows and 3 through the mount or the interposer: {v}");
    let via: Vec<&str> = rows.iter().filter_map(|r| r["workload"].as_str()).filter(|w| w.contains(" via ")).collect();
    assert_eq!(via, ["decomposition 4K x32 via mount", "decomposition 4K x32 via run", "decomposition 4K x32 via mount (hdd7200)"], "{v}");
    for r in rows {
        let m = r["makespan_s"].as_object().unwrap();
        assert!(["fifo", "fifo-merge", "aioli"].iter().all(|k| m[*k].as_f64().unwrap() > 0.0), "{r}");
        assert_eq!(m.contains_key("direct"), r["device"] == "real", "{r}");
        assert!(r["default_over_best"].as_f64().unwrap() > 0.0);
    }
    assert!(rows.iter().any(|r| r["workload"] == "mix10" && r["apps_slower_than_fifo"].is_u64()));
    let over = rows.iter().filter(|r| r["default_over_best"].as_f64().unwrap() > 1.05).count();
    assert_eq!(v["rows_over_target"].as_u64().unwrap() as usize, over);
    let every = rows.iter().filter(|r| r["default_over_best"].as_f64().unwrap() > 1.05 && r["slower_in_every_run"].as_bool().unwrap()).count();
    assert_eq!(v["rows_over_in_every_run"].as_u64().unwrap() as usize, every);
}

/// `sluice bench connections`: the server's threads and memory for idle
/// clients (the event loop keeps them flat as connections grow).
#[test]
fn bench_connections_reports_threads_and_memory_per_idle_client() {
    let (_, v) = common::bench_json(&["connections", "--count", "50", "--rtt-requests", "100"], "c.json");
    let (idle, connected) = (v["threads_idle"].as_u64().unwrap(), v["threads_connected"].as_u64().unwrap());
    assert!(connected >= idle, "{v}");
    assert!(v["rtt_4k_us"].as_f64().unwrap() > 0.0 && v["count"] == 50, "{v}");
}

/// `sluice qos` changes a running server's service classes: set, list,
/// stats, rm, clear; a file that does not parse is refused and the
/// classes in force stay.
#[test]
fn sluice_qos_changes_a_running_servers_classes() {
    let s = Serve::start(&[]);
    let file = s.dir.path().join("qos.toml");
    std::fs::write(&file, "[[class]]\nname = \"ckpt\"\nrate_bytes_per_s = 2000000000\n\n[[class]]\nname = \"gold\"\nguarantee_bytes_per_s = 100000000\nweight = 4\n\n[[rule]]\nclass = \"ckpt\"\napp = \"ckpt-*\"\n").unwrap();
    let ok = |args: &[&str]| {
        let o = s.cmd(args);
        let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
        assert!(o.status.success(), "{args:?}: {err}");
        out
    };
    assert!(ok(&["qos", "list"]).contains("no service classes"));
    assert!(ok(&["qos", "set", file.to_str().unwrap()]).contains("2 classes, 1 rules"));
    let listed = ok(&["qos", "list"]);
    assert!(listed.contains("name = \"ckpt\"") && listed.contains("weight = 4") && listed.contains("app = \"ckpt-*\""), "{listed}");
    // What `list` prints is a rules file that `set` takes back.
    std::fs::write(&file, &listed).unwrap();
    assert!(ok(&["qos", "set", file.to_str().unwrap()]).contains("2 classes, 1 rules"));
    let stats = ok(&["qos", "stats"]);
    assert!(stats.contains("ckpt") && stats.contains("gold") && stats.contains("default") && stats.contains("changes since the start: 2"), "{stats}");
    // A bad file: refused, the classes in force kept.
    std::fs::write(&file, "[[class]]\nname = \"x\"\nrate = 5\n").unwrap();
    let o = s.cmd(&["qos", "set", file.to_str().unwrap()]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("the ones in force kept"), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(ok(&["qos", "list"]).contains("name = \"gold\""));
    assert!(ok(&["qos", "rm", "ckpt"]).contains("removed"));
    let listed = ok(&["qos", "list"]);
    assert!(!listed.contains("ckpt") && listed.contains("gold"), "{listed}");
    let o = s.cmd(&["qos", "rm", "nothing"]);
    assert!(!o.status.success());
    assert!(ok(&["qos", "clear"]).contains("no service classes"));
    assert!(ok(&["qos", "stats"]).contains("(no service classes)"));
    // A sharing order: listed as given, kept when its last class goes.
    std::fs::write(&file, "share = [\"user\", \"job\"]\n[[class]]\nname = \"gold\"\nguarantee_bytes_per_s = 1000000\n").unwrap();
    assert!(ok(&["qos", "set", file.to_str().unwrap()]).contains("1 classes, 0 rules, sharing by user then job"));
    assert!(ok(&["qos", "rm", "gold"]).contains("removed"));
    let listed = ok(&["qos", "list"]);
    assert!(listed.starts_with("share = [\"user\", \"job\"]") && !listed.contains("gold"), "{listed}");
    std::fs::write(&file, "share = [\"user\", \"planet\"]\n").unwrap();
    let o = s.cmd(&["qos", "set", file.to_str().unwrap()]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("no level \"planet\""), "{}", String::from_utf8_lossy(&o.stderr));
}
