//! `sluice cluster`, `setstripe` and `getstripe` end to end: a real
//! cluster process on a temporary directory, a striped file written through
//! the library, its objects shown spread over the servers, and a clean
//! stop on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_cluster::StripedClient;

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// A `sluice cluster` process, killed when dropped.
struct Cluster {
    child: Option<Child>,
    addr: String,
    /// Kept open so the cluster's last lines do not hit a closed pipe.
    _stdout: Option<BufReader<std::process::ChildStdout>>,
}

impl Cluster {
    fn start(root: &std::path::Path, servers: u32) -> Cluster {
        let child = Command::new(SLUICE).args(["cluster", "--servers", &servers.to_string(), "--root"]).arg(root).stdout(Stdio::piped()).spawn().unwrap();
        let mut c = Cluster { child: Some(child), addr: String::new(), _stdout: None };
        let mut out = BufReader::new(c.child.as_mut().unwrap().stdout.take().unwrap());
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

    fn sluice(&self, args: &[&str]) -> (bool, String, String) {
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

#[test]
fn cluster_setstripe_getstripe_and_clean_stop() {
    let dir = tempfile::tempdir().unwrap();
    let mut cl = Cluster::start(dir.path(), 3);
    let (ok, _, err) = cl.sluice(&["setstripe", "-S", "64K", "-c", "-1", "-i", "1", "big.dat"]);
    assert!(ok, "setstripe failed: {err}");
    let (ok, _, err) = cl.sluice(&["setstripe", "-S", "1000", "bad.dat"]);
    assert!(!ok && err.contains("multiple of 512"), "{err}");
    let (ok, _, err) = cl.sluice(&["setstripe", "-c", "2", "big.dat"]);
    assert!(!ok && err.contains("exists"), "{err}");
    let c = StripedClient::connect(&cl.addr).unwrap();
    let f = c.open("big.dat", libc::O_RDWR).unwrap();
    c.pwrite(&f, &vec![9u8; 3 * 65536 + 100], 0).unwrap();
    c.close(f).unwrap();
    let (ok, out, err) = cl.sluice(&["getstripe", "big.dat"]);
    assert!(ok, "getstripe failed: {err}");
    assert!(out.contains("lmm_stripe_count:  3") && out.contains("lmm_stripe_size:   65536") && out.contains("lmm_stripe_offset: 1"), "{out}");
    // Objects 0, 1, 2 on servers 1, 2, 0; object 0 holds the last 100 bytes.
    let rows: Vec<Vec<&str>> = out.lines().filter(|l| l.starts_with('\t') && !l.contains("obdidx")).map(|l| l.trim().split('\t').collect()).collect();
    let got: Vec<(&str, &str, &str)> = rows.iter().map(|r| (r[0], r[1], r[2])).collect();
    assert_eq!(got, vec![("1", "0", "65636"), ("2", "1", "65536"), ("0", "2", "65536")], "{out}");
    // Directory defaults.
    assert!(cl.sluice(&["setstripe", "-c", "2", ""]).0);
    let (ok, out, _) = cl.sluice(&["getstripe", ""]);
    assert!(ok && out.contains("stripe_count:  2"), "{out}");
    // SIGTERM stops every role and removes the sockets.
    let mut child = cl.child.take().unwrap();
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluice cluster did not stop within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success());
    for s in ["meta.sock", "data-0.sock", "data-1.sock", "data-2.sock"] {
        assert!(!dir.path().join(s).exists(), "{s} left behind");
    }
}
