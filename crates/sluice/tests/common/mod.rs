//! Helpers shared by the end-to-end tests: the binaries under test,
//! waiting for a condition, running shell commands, and FUSE mounts that
//! are undone even when a test fails.

#![allow(dead_code)] // Each test binary uses its own subset.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// The newest `libsluice_preload.so` of this build profile.
pub fn preload_library() -> PathBuf {
    let bin = Path::new(SLUICE).parent().unwrap();
    let found = [bin.join("libsluice_preload.so"), bin.join("deps/libsluice_preload.so")].into_iter().filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p))).max();
    found.map(|(_, p)| p).expect("libsluice_preload.so is not built: run `cargo build -p sluice-preload` (make test builds it)")
}

/// Deterministic test bytes (xorshift): `len` bytes seeded by `seed`.
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Poll `ok` every 20 ms; fail the test after 10 s.
pub fn wait_for(mut ok: impl FnMut() -> bool, what: &str) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn is_mounted(p: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(p.to_str().unwrap()))
}

pub fn sh(cmd: &str) -> Output {
    Command::new("sh").args(["-c", cmd]).output().unwrap()
}

/// Run `cmd` with `sh -c`; fail the test with its stderr if it fails.
pub fn ok(cmd: &str) {
    let out = sh(cmd);
    assert!(out.status.success(), "`{cmd}` failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Two listings of `f_frsize f_blocks f_bfree f_files f_namemax`, a line
/// per file system call: sizes and limits equal, free blocks within 1%
/// (other processes write meanwhile).
pub fn same_statfs(via: &str, plain: &str) {
    let rows = |s: &str| s.lines().map(|l| l.split_whitespace().map(|v| v.parse::<u64>().unwrap()).collect::<Vec<u64>>()).collect::<Vec<_>>();
    let (via, plain) = (rows(via), rows(plain));
    assert!(!plain.is_empty() && via.len() == plain.len(), "statfs lines: {via:?} against {plain:?}");
    for (v, p) in via.iter().zip(&plain) {
        assert_eq!((v[0], v[1], v[3], v[4]), (p[0], p[1], p[3], p[4]), "block size, blocks, files, name limit: {v:?} against {p:?}");
        assert!(v[2].abs_diff(p[2]) <= p[2] / 100 + 16, "free blocks {} against {}", v[2], p[2]);
    }
}

pub fn same(a: &Path, b: &Path) {
    assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap(), "{} differs from {}", a.display(), b.display());
}

/// A `sluice mount` process; unmounted and killed when dropped.
pub struct Mount {
    pub point: PathBuf,
    pub child: Option<Child>,
}

impl Mount {
    /// Mount `addr` (a server or a cluster) on `point` and wait for it.
    pub fn start(addr: &str, point: &Path) -> Mount {
        std::fs::create_dir_all(point).unwrap();
        let child = Command::new(SLUICE).args(["mount", "--server", addr]).arg(point).stderr(Stdio::null()).spawn().unwrap();
        let m = Mount { point: point.to_path_buf(), child: Some(child) };
        wait_for(|| is_mounted(point), "the mount");
        m
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("umount").arg("-l").arg(&self.point).stderr(Stdio::null()).status();
    }
}

/// `sluice bench ARGS --dir SCRATCH --json SCRATCH/NAME`: asserts that it
/// succeeded and that the scratch directory holds nothing but the JSON
/// afterwards (the benchmark removed its files); returns stdout and the
/// JSON.
pub fn bench_json(args: &[&str], name: &str) -> (String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join(name);
    let o = Command::new(SLUICE).arg("bench").args(args).arg("--dir").arg(dir.path()).arg("--json").arg(&json).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, [std::ffi::OsString::from(name)], "the benchmark's scratch files are removed");
    (String::from_utf8_lossy(&o.stdout).into_owned(), v)
}

/// `sluice serve --metrics 127.0.0.1:0`, killed on drop.
pub struct MetricsServe {
    child: Child,
    /// The data socket (`unix:PATH`) and the metrics endpoint (`IP:PORT`).
    pub addr: String,
    pub metrics: String,
    _dir: tempfile::TempDir,
}

impl MetricsServe {
    pub fn start() -> MetricsServe {
        let dir = tempfile::Builder::new().prefix("sluice-top-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        std::fs::create_dir(dir.path().join("root")).unwrap();
        let addr = format!("unix:{}", dir.path().join("s.sock").display());
        let root = dir.path().join("root");
        let mut child = Command::new(SLUICE)
            // Every write scheduled (no write leases): the tests count
            // requests, latencies and dispatches.
            .args(["serve", "--root", root.to_str().unwrap(), "--listen", &addr, "--metrics", "127.0.0.1:0", "--no-write-leases"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut metrics = None;
        let mut line = String::new();
        while metrics.is_none() && out.read_line(&mut line).unwrap() > 0 {
            metrics = line.split("http://").nth(1).and_then(|r| r.split('/').next()).map(String::from);
            line.clear();
        }
        let metrics = metrics.expect("sluice serve prints its metrics address");
        MetricsServe { child, addr, metrics, _dir: dir }
    }

    /// The directory it serves.
    pub fn root(&self) -> PathBuf {
        self._dir.path().join("root")
    }

    /// Run `sluice ARGS` against it: (success, stdout, stderr).
    pub fn sluice(&self, args: &[&str]) -> (bool, String, String) {
        let o = Command::new(SLUICE).args(args).env("SLUICE_SERVER", &self.addr).output().unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

impl Drop for MetricsServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Applications writing 64 KiB pieces until dropped.
pub struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    pub fn start(addr: &str, apps: &[&str]) -> Load {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = apps
            .iter()
            .map(|app| {
                let c =
                    sluice_client::Client::connect_with(addr, sluice_client::ConnectOptions { app: Some(app.to_string()), ..sluice_client::ConnectOptions::default() }).unwrap();
                let (stop, name) = (std::sync::Arc::clone(&stop), app.to_string());
                std::thread::spawn(move || {
                    let fd = c.open(&name, libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
                    let data = vec![7u8; 64 << 10];
                    let mut i = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        c.pwrite(fd, &data, (i % 64) * (64 << 10)).unwrap();
                        i += 1;
                    }
                })
            })
            .collect();
        Load { stop, threads }
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.threads.drain(..).for_each(|t| t.join().unwrap());
    }
}

/// A `sluice cluster` process, killed when dropped.
pub struct Cluster {
    pub child: Option<Child>,
    pub addr: String,
    /// Kept open so the cluster's last lines do not hit a closed pipe.
    _stdout: Option<std::io::BufReader<std::process::ChildStdout>>,
}

impl Cluster {
    pub fn start(root: &std::path::Path, servers: u32) -> Cluster {
        let child = Command::new(SLUICE).args(["cluster", "--servers", &servers.to_string(), "--root"]).arg(root).stdout(Stdio::piped()).spawn().unwrap();
        let mut c = Cluster { child: Some(child), addr: String::new(), _stdout: None };
        let mut out = std::io::BufReader::new(c.child.as_mut().unwrap().stdout.take().unwrap());
        let mut line = String::new();
        while out.read_line(&mut line).unwrap() > 0 {
            if let Some(a) = line.trim_end().strip_prefix("export SLUICE_SERVER=") {
                c.addr = a.to_string();
                break;
            }
            line.clear();
        }
        c._stdout = Some(out);
        assert!(c.addr.starts_with("unix:"), "sluice cluster printed no address");
        c
    }

    pub fn sluice(&self, args: &[&str]) -> (bool, String, String) {
        let o = Command::new(SLUICE).args(args).env("SLUICE_SERVER", &self.addr).output().unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
