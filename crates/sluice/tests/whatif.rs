//! `sluice what-if` on a trace recorded by a real `sluice serve --trace`
//! (emulated 7200 rpm disk, fifo) while two real clients read their own
//! files in turn: every recorded request is replayed once, the fifo replay
//! lands near the recorded run, and aioli would have finished sooner.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::SLUICE;
use sluice_client::{Client, ConnectOptions};

const READS: u64 = 30;
const PIECE: usize = 64 << 10;

#[test]
fn a_recorded_trace_replays_under_other_policies() {
    let dir = tempfile::Builder::new().prefix("sluice-whatif-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    for f in ["a", "b"] {
        std::fs::write(root.join(f), vec![1u8; READS as usize * PIECE]).unwrap();
    }
    let addr = format!("unix:{}", dir.path().join("s.sock").display());
    let trace = dir.path().join("live.json");
    let mut serve = Command::new(SLUICE)
        .args(["serve", "--root", root.to_str().unwrap(), "--listen", &addr, "--device", "hdd7200", "--queue-depth", "1", "--policy", "fifo", "--trace", trace.to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Client::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "sluice serve did not come up");
        std::thread::sleep(Duration::from_millis(10));
    }
    let readers: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|f| {
            let c = Client::connect_with(&addr, ConnectOptions { app: Some(format!("reader-{f}")), leases: false, ..ConnectOptions::default() }).unwrap();
            std::thread::spawn(move || {
                let fd = c.open(f, libc::O_RDONLY, 0).unwrap();
                let mut buf = vec![0u8; PIECE];
                for k in 0..READS {
                    assert_eq!(c.pread(fd, &mut buf, k * PIECE as u64).unwrap(), PIECE);
                }
            })
        })
        .collect();
    readers.into_iter().for_each(|r| r.join().unwrap());
    // SIGINT drains the server and closes the trace document.
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(serve.id() as i32, libc::SIGINT) }, 0);
    assert!(serve.wait().unwrap().success());
    let json = dir.path().join("w.json");
    let out = Command::new(SLUICE).args(["what-if", trace.to_str().unwrap(), "--device", "hdd7200", "--policy", "fifo", "--policy", "aioli", "--json", json.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let w: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = w["rows"].as_array().unwrap();
    for policy in ["recorded", "fifo", "aioli"] {
        for app in ["reader-a", "reader-b"] {
            let r = rows.iter().find(|r| r["policy"] == policy && r["app"] == app).unwrap_or_else(|| panic!("a row for {app} under {policy}"));
            assert_eq!((r["requests"].as_u64(), r["bytes"].as_u64()), (Some(READS), Some(READS * PIECE as u64)), "{policy} {app}: every request once");
        }
    }
    let span = |p: &str, app: &str| rows.iter().find(|r| r["policy"] == p && r["app"] == app).unwrap()["span_s"].as_f64().unwrap();
    let (recorded, fifo, aioli) = (span("recorded", "reader-a"), span("fifo", "reader-a"), span("aioli", "reader-a"));
    assert!((fifo - recorded).abs() <= 0.25 * recorded, "the fifo replay lands near the recorded fifo run: {fifo:.3} s vs {recorded:.3} s");
    assert!(aioli < 0.8 * fifo, "two alternating readers on a disk: aioli {aioli:.3} s vs fifo {fifo:.3} s");
    // A bad trace is one line.
    let out = Command::new(SLUICE).args(["what-if", json.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.lines().count() == 1 && err.contains("cannot replay the trace"), "{err}");
}
