//! A short real run of every `sluice bench` scenario: real worker
//! processes, a real in-process server per policy, real files in a
//! temporary directory on the root file system.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod common;

/// A scratch directory removed even when the test fails.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("sluice-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Run `sluice bench ARGS --root DIR --json FILE` and return the JSON.
fn bench(dir: &Path, args: &[&str]) -> Value {
    bench_env(dir, args, &[])
}

/// `bench` with `env` set for the command.
fn bench_env(dir: &Path, args: &[&str], env: &[(&str, &Path)]) -> Value {
    let json = dir.join("report.json");
    let root = dir.join("data");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice")).arg("bench").args(args).arg("--root").arg(&root).arg("--json").arg(&json).envs(env.iter().copied()).output().unwrap();
    assert!(out.status.success(), "sluice bench {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// `bench` with the started server's live trace (`SLUICE_BENCH_TRACE`):
/// the report, and the most requests one dispatch of the last policy
/// carried. The largest dispatch, not the mean, says how many requests
/// could reach the scheduler at once, whatever the machine's load.
fn bench_traced(dir: &Path, args: &[&str]) -> (Value, u64) {
    let traces = dir.join("traces");
    let v = bench_env(dir, args, &[("SLUICE_BENCH_TRACE", &traces)]);
    let policy = v["runs"].as_array().unwrap().last().unwrap()["mode"].as_str().unwrap().to_string();
    let t: Value = serde_json::from_str(&std::fs::read_to_string(traces.join(format!("{policy}.json"))).unwrap()).unwrap();
    let largest =
        t["traceEvents"].as_array().unwrap().iter().filter(|e| e["cat"] == "dispatch" && e["ph"] == "b").filter_map(|e| e["args"]["requests"].as_u64()).max().unwrap_or(0);
    (v, largest)
}

/// Every run has every application, each with positive time and bytes.
fn check_shape(v: &Value, modes: &[&str], apps: usize) {
    let runs = v["runs"].as_array().unwrap();
    let got: Vec<&str> = runs.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(got, modes);
    for r in runs {
        assert_eq!(r["apps"].as_array().unwrap().len(), apps);
        assert!(r["makespan_s"].as_f64().unwrap() > 0.0);
        // A service mode counts its dispatches and, of those, the seeks.
        if r["mode"] != "direct" {
            let (d, seeks) = (r["dispatches"].as_u64().unwrap(), r["seeks"].as_u64().unwrap());
            assert!(d > 0 && seeks >= 1 && seeks <= d, "{r}");
            assert!(r["holds"].as_u64().is_some() && r["windows"].as_u64().is_some(), "{r}");
            if r["mode"] == "fifo" {
                assert_eq!((r["holds"].as_u64(), r["windows"].as_u64()), (Some(0), Some(0)), "fifo neither holds nor opens windows: {r}");
            }
        } else {
            assert!(r.get("seeks").is_none(), "{r}");
        }
        // The workers' own CPU time: some, and no more than every process
        // busy on every core for the whole run.
        if let Some(w) = r.get("workers_cpu_s") {
            let procs: u64 = r["apps"].as_array().unwrap().iter().map(|a| a["procs"].as_u64().unwrap()).sum();
            let cores = std::thread::available_parallelism().unwrap().get() as f64;
            let w = w.as_f64().unwrap();
            assert!(w > 0.0 && w <= procs as f64 * cores * r["makespan_s"].as_f64().unwrap(), "{r}");
        } else {
            assert!(r.get("cpu_s").is_none(), "a run that read /proc has its workers' CPU too: {r}");
        }
        let jain = r["jain"].as_f64().unwrap();
        assert!(jain > 0.0 && jain <= 1.0 + 1e-9);
        for a in r["apps"].as_array().unwrap() {
            assert!(a["bytes"].as_u64().unwrap() > 0 && a["completion_s"].as_f64().unwrap() > 0.0, "{a}");
            // Each process's start, after the common release and before
            // its application finished.
            let starts = a["start_offsets_ns"].as_array().unwrap();
            assert_eq!(starts.len() as u64, a["procs"].as_u64().unwrap(), "{a}");
            let done_ns = a["completion_s"].as_f64().unwrap() * 1e9;
            assert!(starts.iter().all(|s| (s.as_u64().unwrap() as f64) < done_ns), "{a}");
        }
    }
}

fn rpd(v: &Value, mode: &str) -> f64 {
    let run = v["runs"].as_array().unwrap().iter().find(|r| r["mode"] == mode).unwrap();
    run["apps"][0]["requests_per_dispatch"].as_f64().unwrap()
}

#[test]
fn decomposition_direct_fifo_aioli_with_o_direct() {
    let s = Scratch::new("decomp");
    let v = bench(&s.0, &["decomposition", "--procs", "32", "--granularity", "4K", "--direct", "--scale", "0.002", "--policies", "direct,fifo,aioli"]);
    check_shape(&v, &["direct", "fifo", "aioli"], 1);
    assert_eq!(v["direct_io"], true);
    assert_eq!(rpd(&v, "fifo"), 1.0, "fifo sends every request alone");
    // How many pieces arrive together depends on the machine's load: idle,
    // six runs gave 2.2-27 requests per dispatch; beside the other tests
    // of this file, 1.43 once. Every dispatch alone (fifo's 1.0) would
    // mean no aggregation at all.
    assert!(rpd(&v, "aioli") > 1.2, "aioli aggregates the pieces of the 32 processes: {}", rpd(&v, "aioli"));
}

/// The mount carried at most 16 requests at once (its worker threads), so
/// 32 strided readers reached the scheduler 16 at a time and aggregated
/// 4-15 requests a dispatch instead of about 30: reads through the mount
/// on the emulated disk fell from 23-29 MiB/s to 1.5-10. A dispatch of
/// more than 16 requests is impossible with that bound.
#[test]
fn strided_readers_through_the_mount_reach_the_scheduler_together() {
    let s = Scratch::new("via-mount");
    let (v, largest) = bench_traced(
        &s.0,
        &["decomposition", "--procs", "32", "--granularity", "4K", "--direct", "--device", "hdd7200", "--scale", "0.001", "--policies", "aioli", "--via", "mount"],
    );
    check_shape(&v, &["aioli"], 1);
    assert_eq!(v["via"], "mount");
    assert!(largest > 16, "the 32 readers' requests reach the scheduler together through the mount: at most {largest} in a dispatch");
}

/// The kernel took a FUSE inode's lock for each direct write until the
/// mount answered it, so the writers of one shared file reached the
/// scheduler one at a time: exactly one request a dispatch under aioli.
/// With parallel direct writes they arrive together and are aggregated.
#[test]
fn strided_writers_through_the_mount_are_aggregated() {
    let s = Scratch::new("via-mount-write");
    let (v, largest) = bench_traced(
        &s.0,
        &["decomposition", "--write", "--procs", "32", "--granularity", "4K", "--direct", "--device", "hdd7200", "--scale", "0.0005", "--policies", "aioli", "--via", "mount"],
    );
    check_shape(&v, &["aioli"], 1);
    assert!(largest > 8, "the 32 writers' requests reach the scheduler together through the mount: at most {largest} in a dispatch");
}

/// The same processes under the interposer (`sluice run`): plain
/// `pread`s, every one scheduled.
#[test]
fn decomposition_through_the_interposer() {
    let s = Scratch::new("via-run");
    let v = bench(&s.0, &["decomposition", "--procs", "8", "--granularity", "4K", "--direct", "--scale", "0.0005", "--policies", "fifo,aioli", "--via", "run"]);
    check_shape(&v, &["fifo", "aioli"], 1);
    assert_eq!(v["via"], "run");
    assert_eq!(rpd(&v, "fifo"), 1.0, "fifo sends every request alone");
}

#[test]
fn decomposition_sweep_and_writes() {
    let s = Scratch::new("sweep");
    let v = bench(&s.0, &["decomposition", "--procs", "4", "--granularity", "8K,64K", "--write", "--scale", "0.0002", "--policies", "fifo,aioli"]);
    let gs: Vec<u64> = v["runs"].as_array().unwrap().iter().map(|r| r["granularity"].as_u64().unwrap()).collect();
    assert_eq!(gs, vec![8192, 8192, 65536, 65536]);
    assert_eq!(v["durable"], true, "buffered writes are timed until fsync'd");
    let v = bench(&s.0, &["decomposition", "--procs", "4", "--granularity", "8K", "--write", "--scale", "0.0002", "--policies", "aioli", "--no-fsync"]);
    assert_eq!(v["durable"], false);
    let v = bench(&s.0, &["decomposition", "--procs", "4", "--granularity", "8K", "--write", "--direct", "--scale", "0.0002", "--policies", "aioli"]);
    assert_eq!(v["durable"], false, "O_DIRECT writes are on the device already");
}

#[test]
fn interference_and_mix10_and_custom() {
    let s = Scratch::new("mix");
    let v = bench(&s.0, &["interference", "--procs", "4", "--granularity", "8K", "--scale", "0.0005", "--policies", "direct,aioli"]);
    check_shape(&v, &["direct", "aioli"], 2);
    let v = bench(&s.0, &["mix10", "--scale", "0.0005", "--policies", "fifo,aioli", "--device", "hdd7200"]);
    check_shape(&v, &["fifo", "aioli"], 10);
    assert_eq!(v["device"], "hdd7200");
    let toml = s.0.join("mine.toml");
    std::fs::write(&toml, "[[app]]\nname = \"ckpt\"\nprocs = 3\nop = \"write\"\npattern = \"random\"\nsize = 196608\ngranularity = 16384\nshared_file = false\n").unwrap();
    // Every write scheduled (`--no-write-leases`).
    let v = bench(&s.0, &["custom", toml.to_str().unwrap(), "--policies", "aioli,direct", "--no-write-leases"]);
    check_shape(&v, &["aioli", "direct"], 1);
    assert_eq!(v["runs"][0]["apps"][0]["bytes"], 3 * 196608);
    // With the started server's write leases (its default), the ranks
    // write through the page cache themselves: every byte, no dispatch.
    let v = bench(&s.0, &["custom", toml.to_str().unwrap(), "--policies", "aioli"]);
    assert_eq!((v["runs"][0]["apps"][0]["bytes"].as_u64(), v["runs"][0]["dispatches"].as_u64()), (Some(3 * 196608), Some(0)), "{v}");
}

#[test]
fn started_servers_write_their_trace_when_asked() {
    let s = Scratch::new("trace");
    let traces = s.0.join("traces");
    let json = s.0.join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "decomposition", "--procs", "4", "--granularity", "8K", "--scale", "0.0002", "--policies", "fifo,aioli", "--root"])
        .arg(s.0.join("data"))
        .arg("--json")
        .arg(&json)
        .env("SLUICE_BENCH_TRACE", &traces)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for (i, policy) in ["fifo", "aioli"].iter().enumerate() {
        let t: Value = serde_json::from_str(&std::fs::read_to_string(traces.join(format!("{policy}.json"))).unwrap()).unwrap();
        let dispatches = t["traceEvents"].as_array().unwrap().iter().filter(|e| e["cat"] == "dispatch" && e["ph"] == "b").count() as u64;
        assert_eq!(dispatches, v["runs"][i]["dispatches"].as_u64().unwrap(), "{policy}: every dispatch of the run is in its trace");
    }
}

#[test]
fn direct_mode_cannot_emulate_a_disk() {
    let s = Scratch::new("nodirect");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "mix10", "--scale", "0.0001", "--device", "hdd7200", "--policies", "direct,fifo", "--root"])
        .arg(&s.0)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot emulate a disk"));
}

#[test]
fn the_service_level_benchmark_reports_each_class_over_windows() {
    let (out, v) = common::bench_json(&["qos", "--device", "real", "--direct", "--seconds", "1.5", "--rate", "4000000", "--guarantee", "4000000"], "qos.json");
    assert!(out.contains("limited to the rate") && out.contains("guaranteed, beside 32 others"), "{out}");
    let lim = &v["limited"];
    assert!(!lim["bytes_per_s"].as_array().unwrap().is_empty(), "the limited class ran over a whole window: {out}");
    assert!(lim["mean"].as_f64().unwrap() > 0.0, "{out}");
    assert!(v["guaranteed"]["bytes_per_s"].is_array() && v["unguaranteed"]["bytes_per_s"].is_array(), "{out}");
    assert_eq!(v["config"]["rate_bytes_per_s"], 4_000_000);
}

/// A Ctrl-C in a terminal (SIGINT to the foreground process group, at its
/// default action) during a benchmark removes the scratch directory the
/// benchmark made, where no destructor runs, and the command still ends
/// as SIGINT ends it, its workers with it.
#[test]
fn a_ctrl_c_during_a_benchmark_removes_its_scratch_directory() {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::process::Stdio;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(["bench", "mix10", "--device", "hdd7200", "--scale", "0.015625", "--policies", "fifo"]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: signal and setpgid are async-signal-safe. A script's
    // background job inherits SIGINT ignored; a terminal's job does not.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::setpgid(0, 0);
            Ok(())
        })
    };
    let mut child = cmd.spawn().unwrap();
    let pgid = child.id() as libc::pid_t;
    let scratch = PathBuf::from(format!("/var/tmp/sluice-bench-{}", child.id()));
    // Until the run has written into its scratch directory, and a little
    // longer, so that its workers run.
    let t0 = std::time::Instant::now();
    while std::fs::read_dir(&scratch).map_or(true, |mut d| d.next().is_none()) {
        assert!(t0.elapsed().as_secs() < 60, "the benchmark made no scratch directory at {}", scratch.display());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // SAFETY: a signal to the child's own process group.
    assert_eq!(unsafe { libc::kill(-pgid, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    let left = scratch.exists();
    let _ = std::fs::remove_dir_all(&scratch);
    assert_eq!(status.signal(), Some(libc::SIGINT), "ended by SIGINT: {status:?}");
    assert!(!left, "{} outlived the Ctrl-C", scratch.display());
    // No process of the group is left (the workers died with it).
    let t1 = std::time::Instant::now();
    // SAFETY: signal 0 only asks whether the group has a process.
    while unsafe { libc::kill(-pgid, 0) } == 0 {
        assert!(t1.elapsed().as_secs() < 10, "a process of the benchmark's group outlived the Ctrl-C");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
