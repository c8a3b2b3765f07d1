//! Recorded workloads replayed: `sluice what-if` on a trace recorded by a
//! real `sluice serve --trace` (emulated 7200 rpm disk, fifo) while two real
//! clients read their own files in turn (every recorded request replayed
//! once, the fifo replay near the recorded run, aioli sooner); Darshan logs
//! (pydarshan's IOR log and one made here) through `what-if`, `sim
//! --darshan` and `bench custom --darshan`, checked against the logs' own
//! POSIX counters; and SIGUSR1 pausing the live trace of `sluice serve`.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::SLUICE;
use sluice_client::{Client, ConnectOptions};

const READS: u64 = 30;
const PIECE: usize = 64 << 10;

/// The recorded run of `a_recorded_trace_replays_under_other_policies` is
/// compared with its replay, so it runs alone: beside this file's other
/// tests (Python, real processes) on two cores, the emulated disk's
/// service times grew and the recorded run took 1.06 s against its
/// replay's 0.39 s (0.9 s for the whole test when alone). The others run
/// side by side.
static ALONE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    ALONE.write().unwrap_or_else(|e| e.into_inner())
}

fn beside() -> std::sync::RwLockReadGuard<'static, ()> {
    ALONE.read().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn a_recorded_trace_replays_under_other_policies() {
    let _alone = alone();
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
    // The default device is the one the trace names (the emulated disk);
    // no host profile in this test's cache directory: no host.
    let out = Command::new(SLUICE)
        .args(["what-if", trace.to_str().unwrap(), "--policy", "fifo", "--policy", "aioli", "--json", json.to_str().unwrap()])
        .env("XDG_CACHE_HOME", dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let w: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let device = w["device"].as_str().unwrap();
    assert!(device.starts_with("the emulated 7200 rpm disk, and the server's "), "the trace says its server's device: {device}");
    assert!(device.contains("us over its model a dispatch"), "and what its server spent around each dispatch: {device}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("host: none"));
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
    // The daemon's rules file, given to the replays: reader-a limited.
    let rate = (READS * PIECE as u64) / 2;
    let rules = dir.path().join("qos.toml");
    std::fs::write(&rules, format!("[[class]]\nname = \"slow\"\nrate_bytes_per_s = {rate}\n[[rule]]\nclass = \"slow\"\napp = \"reader-a\"\n")).unwrap();
    let limited = dir.path().join("q.json");
    let out = Command::new(SLUICE)
        .args(["what-if", trace.to_str().unwrap(), "--policy", "aioli", "--qos", rules.to_str().unwrap(), "--json", limited.to_str().unwrap()])
        .env("XDG_CACHE_HOME", dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let q: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&limited).unwrap()).unwrap();
    let rows = q["rows"].as_array().unwrap();
    let qspan = |app: &str| rows.iter().find(|r| r["policy"] == "aioli" && r["app"] == app).unwrap()["span_s"].as_f64().unwrap();
    // Its bytes at half their size a second: about 2 s less one bucket.
    assert!(qspan("reader-a") > 1.5 && qspan("reader-a") > 3.0 * aioli, "reader-a limited to {rate} B/s: {:.3} s (unlimited {aioli:.3} s)", qspan("reader-a"));
    assert!(qspan("reader-b") < 0.5 * qspan("reader-a"), "reader-b is not limited: {:.3} s", qspan("reader-b"));
    // A bad trace is one line.
    let out = Command::new(SLUICE).args(["what-if", json.to_str().unwrap()]).env("XDG_CACHE_HOME", dir.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.lines().count() == 1 && err.contains("cannot replay the trace"), "{err}");
}

/// `sluice calibrate --host` measures this machine with real processes
/// against a null-device server and saves a profile where `what-if` finds
/// it; a profile that no calibration could write is refused in one line.
#[test]
fn the_host_is_calibrated_once_and_what_if_replays_with_it() {
    let _beside = beside();
    let dir = tempfile::tempdir().unwrap();
    // The disk under the scratch directory, in short cells.
    let root = dir.path().to_str().unwrap();
    let out = Command::new(SLUICE).args(["calibrate", "--host", "--root", root, "--cell-ms", "20"]).env("XDG_CACHE_HOME", dir.path()).env("TMPDIR", dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let saved = dir.path().join("sluice/host.toml");
    let text = std::fs::read_to_string(&saved).expect("the profile is saved in the cache directory");
    // The profile keeps the disk where O_DIRECT works there, and says why not elsewhere.
    let direct = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().write(true).create(true).custom_flags(libc::O_DIRECT).open(dir.path().join("probe")).is_ok()
    };
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    match direct {
        true => assert!(text.contains("[disk]") && text.contains("[[disk.measured.ring]]") && said.contains("disk under"), "{text}\n{said}"),
        false => assert!(!text.contains("[disk]") && said.contains("disk: not measured"), "{text}\n{said}"),
    }
    let cores = std::thread::available_parallelism().unwrap().get();
    assert!(text.contains(&format!("cores = {cores}")), "{text}");
    let ns = |key: &str| -> u64 { text.lines().find_map(|l| l.strip_prefix(&format!("{key} = "))).unwrap().parse().unwrap() };
    let (server_ns, client_ns) = (ns("server_ns"), ns("client_ns"));
    assert!(server_ns > 0 && client_ns > 0, "an answer costs the loop and the process some CPU: {text}");
    // Any trace shows which host the replay used.
    let trace = dir.path().join("t.json");
    std::fs::write(&trace, tiny_trace()).unwrap();
    let run = |extra: &[&str]| Command::new(SLUICE).args(["what-if", trace.to_str().unwrap(), "--policy", "fifo"]).args(extra).env("XDG_CACHE_HOME", dir.path()).output().unwrap();
    let out = run(&[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let us = |n: u64| n as f64 / 1e3;
    let said = format!("host {cores} cores, an answer {:.1} us of the server's loop and {:.1} us of a process", us(server_ns), us(client_ns));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&said), "{}", String::from_utf8_lossy(&out.stdout));
    std::fs::write(dir.path().join("bad.toml"), "cores = 0\nserver_ns = 5\nclient_ns = 5\n").unwrap();
    let out = run(&["--host", dir.path().join("bad.toml").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.lines().count() == 1 && err.contains("outside"), "{err}");
}

/// Two requests of one process, in the shape `sluice serve --trace` writes.
fn tiny_trace() -> String {
    let ev = [
        r#"{"name":"read 4 KiB","ph":"b","cat":"request","id":"r1","pid":1001,"tid":1,"ts":0,"args":{"file":1,"client":1,"offset":0,"len":4096}}"#,
        r#"{"name":"read 4 KiB","ph":"e","cat":"request","id":"r1","pid":1001,"tid":1,"ts":100}"#,
        r#"{"name":"read 4 KiB","ph":"b","cat":"request","id":"r2","pid":1001,"tid":1,"ts":150,"args":{"file":1,"client":1,"offset":4096,"len":4096}}"#,
        r#"{"name":"read 4 KiB","ph":"e","cat":"request","id":"r2","pid":1001,"tid":1,"ts":250}"#,
    ];
    format!(r#"{{"traceEvents":[{}]}}"#, ev.join(","))
}

/// The project venv's Python (`make venv`), which has pydarshan.
fn venv_python() -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(p.exists(), "{} is missing: run `make venv` (make test does)", p.display());
    p
}

/// A real Darshan log: IOR writing and reading an HDF5 file from 4 ranks
/// (with DXT tracing), as shipped with pydarshan's examples
/// (`darshan/examples/example_logs/ior_hdf5_example.darshan`, recorded by
/// the Darshan developers on NERSC's Cori).
fn ior_log(python: &std::path::Path) -> String {
    let out = Command::new(python)
        .args(["-c", "import os, darshan.examples.example_logs as e; print(os.path.join(os.path.dirname(e.__file__), 'ior_hdf5_example.darshan'))"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn a_darshan_dxt_log_replays_under_other_policies() {
    let _beside = beside();
    let python = venv_python();
    let log = ior_log(&python);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("w.json");
    let run = |extra: &[&str]| {
        Command::new(SLUICE).args(["what-if", &log, "--policy", "fifo", "--policy", "aioli", "--device", "hdd7200"]).args(extra).env("SLUICE_PYTHON", &python).output().unwrap()
    };
    let out = run(&["--json", json.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("a Darshan log's processes had no sluice server"), "no host for a Darshan log unless asked");
    let w: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(w["streams"], 4, "one stream per rank");
    // The log's own POSIX counters (darshan-util's accounting, not DXT):
    // operations and bytes read plus written.
    let counters = Command::new(&python)
        .args(["-c", "import sys, darshan; d = darshan.DarshanReport(sys.argv[1], read_all=True).records['POSIX'].to_df()['counters']; print(int(d['POSIX_READS'].sum() + d['POSIX_WRITES'].sum()), int(d['POSIX_BYTES_READ'].sum() + d['POSIX_BYTES_WRITTEN'].sum()))", &log])
        .output()
        .unwrap();
    let counters = String::from_utf8(counters.stdout).unwrap();
    let (ops, bytes) = counters.trim().split_once(' ').map(|(a, b)| (a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap())).expect("two counters");
    assert_eq!(w["requests"], ops);
    for policy in ["recorded", "fifo", "aioli"] {
        let r = w["rows"].as_array().unwrap().iter().find(|r| r["policy"] == policy).unwrap();
        assert_eq!((r["app"].as_str(), r["requests"].as_u64(), r["bytes"].as_u64()), (Some("ior"), Some(ops), Some(bytes)), "{policy}: every access of the log, once");
    }
    let mpiio = run(&["--layer", "DXT_MPIIO"]);
    assert!(mpiio.status.success() && String::from_utf8_lossy(&mpiio.stdout).contains("in 4 streams"), "the MPI-IO layer replays too");
    // Without the package: one clear line.
    let out = Command::new(SLUICE).args(["what-if", &log]).env("SLUICE_PYTHON", "/usr/bin/env").output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).lines().count() == 1);
}

/// The log's own POSIX counters: (operations, bytes), reads plus writes.
fn log_counters(python: &std::path::Path, log: &str) -> (u64, u64) {
    let out = Command::new(python)
        .args(["-c", "import sys, darshan; d = darshan.DarshanReport(sys.argv[1], read_all=True).records['POSIX'].to_df()['counters']; print(int(d['POSIX_READS'].sum() + d['POSIX_WRITES'].sum()), int(d['POSIX_BYTES_READ'].sum() + d['POSIX_BYTES_WRITTEN'].sum()))", log])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    text.trim().split_once(' ').map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())).expect("two counters")
}

#[test]
fn bench_custom_replays_a_darshan_log_with_real_processes() {
    let _beside = beside();
    let python = venv_python();
    let log = ior_log(&python);
    let (ops, bytes) = log_counters(&python, &log);
    // Against a running server with metrics: the server counts exactly the
    // log's accesses for the application (the files are made before, as
    // another application).
    let s = common::MetricsServe::start();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let root = dir.path().join("scratch");
    let out = Command::new(SLUICE)
        .args(["bench", "custom", "--darshan", &log, "--server", &s.addr, "--policies", "aioli", "--root", root.to_str().unwrap(), "--json", json.to_str().unwrap()])
        .env("SLUICE_PYTHON", &python)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let app = &r["runs"][0]["apps"][0];
    assert_eq!((app["name"].as_str(), app["procs"].as_u64(), app["bytes"].as_u64()), (Some("ior"), Some(4), Some(bytes)), "one process per rank, every byte");
    let metrics = sluice_server::metrics::get(&s.metrics, "/metrics", Duration::from_secs(10)).unwrap();
    let sum =
        |name: &str| -> f64 { metrics.lines().filter(|l| l.starts_with(&format!("{name}{{app=\"ior\""))).map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap()).sum() };
    assert_eq!((sum("sluice_app_requests_total") as u64, sum("sluice_app_bytes_total") as u64), (ops, bytes), "the server saw exactly the log's accesses");
    // And with servers it starts itself, against direct POSIX.
    let out = Command::new(SLUICE)
        .args(["bench", "custom", "--darshan", &log, "--policies", "direct,fifo,aioli", "--json", json.to_str().unwrap()])
        .env("SLUICE_PYTHON", &python)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let modes: Vec<&str> = r["runs"].as_array().unwrap().iter().map(|m| m["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["direct", "fifo", "aioli"]);
    assert!(r["runs"].as_array().unwrap().iter().all(|m| m["apps"][0]["bytes"].as_u64() == Some(bytes) && m["makespan_s"].as_f64().unwrap() > 0.0));
}

#[test]
fn sim_replays_a_darshan_log_on_a_scenarios_cluster() {
    let _beside = beside();
    let python = venv_python();
    let log = ior_log(&python);
    let (ops, bytes) = log_counters(&python, &log);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let scenario = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/live-twin.toml");
    let out = Command::new(SLUICE).arg("sim").arg(&scenario).args(["--darshan", &log, "--json", json.to_str().unwrap()]).env("SLUICE_PYTHON", &python).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "the scenario's modes, fifo and aioli");
    for run in runs {
        let d = &run["device_stats"];
        // live-twin sends each access whole (1 MiB pieces; IOR's are 256 KiB).
        assert_eq!(d["requests"].as_u64(), Some(ops), "{}: the device served each access of the log once", run["mode"]);
        // Under fifo every access is its own dispatch; aggregation may serve
        // ranks' overlapping metadata reads in one (fewer bytes).
        let served = d["bytes"].as_u64().unwrap();
        assert!(if run["mode"] == "fifo" { served == bytes } else { served <= bytes && served > bytes * 99 / 100 }, "{}: {served} of {bytes} bytes", run["mode"]);
        assert_eq!(run["apps"][0]["name"], "ior");
    }
}

/// The log made here (tests/data/README.md): 4 ranks, MPI-IO collective
/// writes and POSIX reads.
fn ckpt_log() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ckpt-4ranks.darshan").to_str().unwrap().to_string()
}

#[test]
fn the_log_made_here_round_trips_through_what_if_sim_and_bench() {
    let _beside = beside();
    let python = venv_python();
    let log = ckpt_log();
    let (ops, bytes) = log_counters(&python, &log);
    assert_eq!((ops, bytes), (41, 4_194_344), "the log's own POSIX counters");
    let dir = tempfile::tempdir().unwrap();
    let json = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    let run = |args: &[&str]| {
        let out = Command::new(SLUICE).args(args).env("SLUICE_PYTHON", &python).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let load = |n: &str| -> serde_json::Value { serde_json::from_str(&std::fs::read_to_string(json(n)).unwrap()).unwrap() };
    run(&["what-if", &log, "--device", "hdd7200", "--json", &json("w.json")]);
    let w = load("w.json");
    assert_eq!((w["requests"].as_u64(), w["streams"].as_u64()), (Some(ops), Some(4)));
    let scenario = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/live-twin.toml");
    run(&["sim", scenario.to_str().unwrap(), "--darshan", &log, "--policy", "fifo", "--json", &json("s.json")]);
    let s = load("s.json");
    assert_eq!((s["runs"][0]["device_stats"]["requests"].as_u64(), s["runs"][0]["device_stats"]["bytes"].as_u64()), (Some(ops), Some(bytes)));
    run(&["bench", "custom", "--darshan", &log, "--policies", "direct,aioli", "--json", &json("b.json")]);
    let b = load("b.json");
    assert!(b["runs"].as_array().unwrap().iter().all(|r| r["apps"][0]["procs"] == 4 && r["apps"][0]["bytes"].as_u64() == Some(bytes)));
}

#[test]
fn sigusr1_pauses_and_resumes_the_live_trace_of_sluice_serve() {
    let _beside = beside();
    use std::io::{BufRead, BufReader};
    let dir = tempfile::Builder::new().prefix("sluice-usr1-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::create_dir(dir.path().join("root")).unwrap();
    let addr = format!("unix:{}", dir.path().join("s.sock").display());
    let trace = dir.path().join("t.json");
    let mut serve = Command::new(SLUICE)
        // Writes scheduled (no write leases), so that each is traced.
        .args(["serve", "--root", dir.path().join("root").to_str().unwrap(), "--listen", &addr, "--trace", trace.to_str().unwrap(), "--no-write-leases"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(serve.stdout.take().unwrap());
    let mut expect = |what: &str| {
        let mut line = String::new();
        while out.read_line(&mut line).unwrap() > 0 {
            if line.contains(what) {
                return;
            }
            line.clear();
        }
        panic!("sluice serve never said {what:?}");
    };
    expect("tracing to");
    let c = Client::connect_with(&addr, ConnectOptions { app: Some("usr1".into()), ..ConnectOptions::default() }).unwrap();
    let fd = c.open("f", libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
    let write = |n: u64| (0..n).for_each(|i| assert_eq!(c.pwrite(fd, b"0123456789", i * 10).unwrap(), 10));
    let signal = |sig| {
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(serve.id() as i32, sig) }, 0);
    };
    write(3);
    signal(libc::SIGUSR1);
    expect("tracing paused");
    write(4);
    signal(libc::SIGUSR1);
    expect("tracing resumed");
    write(2);
    drop(c);
    signal(libc::SIGINT);
    assert!(serve.wait().unwrap().success());
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let traced = doc["traceEvents"].as_array().unwrap().iter().filter(|e| e["cat"] == "request" && e["ph"] == "b").count();
    assert_eq!(traced, 5, "3 before the pause and 2 after it");
}
