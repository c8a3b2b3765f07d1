//! End-to-end tests of `sluice serve`, `sluice cp` and `sluice ls` as real
//! processes: SIGTERM drains, a killed server fails requests in flight
//! instead of hanging, and the commands copy byte-identically and refuse
//! paths outside the root with a one-line reason.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sluice_client::{Client, ClientErrorKind, ConnectOptions};
use tempfile::TempDir;

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// A `sluice serve` process, killed when dropped.
struct Serve {
    child: Option<Child>,
    dir: TempDir,
    addr: String,
}

impl Serve {
    fn start(extra: &[&str]) -> Serve {
        let dir = tempfile::Builder::new().prefix("sluice-e2e-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let sock = dir.path().join("s.sock");
        let addr = format!("unix:{}", sock.display());
        let root = dir.path().join("root");
        let mut args = vec!["serve", "--root", root.to_str().unwrap(), "--listen", &addr];
        args.extend_from_slice(extra);
        let child = Command::new(SLUICE).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Client::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "sluice serve did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
        Serve { child: Some(child), dir, addr }
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
        Command::new(SLUICE).args(args).env("SLUICE_SERVER", &self.addr).current_dir(self.dir.path()).output().unwrap()
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
    let c = s.client("drainer");
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

#[test]
fn killed_server_fails_requests_in_flight_without_hanging() {
    let s = Serve::start(&["--device", "hdd7200"]);
    std::fs::write(s.root().join("f"), bytes(32 << 20, 2)).unwrap();
    let c = s.client("victim");
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let tickets: Vec<_> = (0..8u64).map(|i| c.submit_read(fd, 1 << 20, i * (4 << 20)).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(5));
    s.signal(libc::SIGKILL);
    let started = Instant::now();
    let results: Vec<_> = tickets.into_iter().map(|t| c.wait_read(t, &mut vec![0u8; 1 << 20])).collect();
    assert!(started.elapsed() < Duration::from_secs(5), "requests in flight must fail promptly");
    let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(!failed.is_empty(), "the server died with reads in flight");
    for e in failed {
        assert_eq!((e.kind, e.errno), (ClientErrorKind::Disconnected, libc::EIO), "{e}");
    }
    assert_eq!(c.stat("f").unwrap_err().errno, libc::EIO);
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
    // Issue 13: a destination `:/abs` was silently made relative.
    check_cmd(&s.cmd(&["cp", "in.dat", ":/abs.dat"]), false, "absolute paths are refused");
    assert!(!s.root().join("abs.dat").exists());
    check_cmd(&s.cmd(&["cp", "in.dat", ":"]), true, "");
    same_file(&src, &s.root().join("in.dat"));
    // Issue 13: striping commands pointed at a data server say so.
    check_cmd(&s.cmd(&["setstripe", "-S", "1M", "-c", "2", "x"]), false, "is a sluice data server, not a cluster's metadata role");
    check_cmd(&s.cmd(&["ls", ":.."]), false, "escapes the server root");
    check_cmd(&s.cmd(&["cp", "a", "b"]), false, "neither");
    let absent = Command::new(SLUICE).args(["ls", "--server", "unix:/nonexistent.sock", ":"]).output().unwrap();
    check_cmd(&absent, false, "cannot connect to sluice server at unix:/nonexistent.sock");
}
