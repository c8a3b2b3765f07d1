//! `sluice sim` end to end: the binary on a shipped scenario, its table,
//! its JSON (the bench's shape plus seed/events/wall_s), its trace, and the
//! same seed giving the same simulated results.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

fn scenario(name: &str) -> String {
    format!("{}/../../scenarios/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The project's Python, with the darshan package (`make venv`).
fn venv_python() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(p.exists(), "{} is missing: run `make venv` (make test does)", p.display());
    p
}

/// A scratch directory removed even when the test fails.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn sim(dir: &Scratch, json: &str, extra: &[&str]) -> (String, Value) {
    let path = dir.0.join(json);
    let out =
        Command::new(SLUICE).args(["sim", &scenario("mix10.toml"), "--policy", "fifo", "--policy", "aioli", "--scale", "0.01", "--json"]).arg(&path).args(extra).output().unwrap();
    assert!(out.status.success(), "sluice sim failed: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8_lossy(&out.stdout).into_owned(), serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap())
}

/// Simulated results only: host timings differ between runs.
fn simulated(v: &Value) -> Vec<(String, f64, Vec<f64>)> {
    v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["mode"].as_str().unwrap().to_string(),
                r["makespan_s"].as_f64().unwrap(),
                r["apps"].as_array().unwrap().iter().map(|a| a["completion_s"].as_f64().unwrap()).collect(),
            )
        })
        .collect()
}

#[test]
fn mix10_table_json_trace_and_replay() {
    let dir = Scratch(std::env::temp_dir().join(format!("sluice-sim-cli-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let trace = dir.0.join("trace.json");
    let (table, a) = sim(&dir, "a.json", &["--trace", trace.to_str().unwrap()]);
    assert!(table.contains("makespan") && table.contains("read decompos."), "the seed-style table: {table}");
    for key in ["scenario", "seed", "runs"] {
        assert!(a.get(key).is_some(), "JSON lacks {key}");
    }
    let runs = a["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for r in runs {
        assert!(r["events"].as_u64().unwrap() > 0 && r["wall_s"].as_f64().is_some());
        assert_eq!(r["apps"].as_array().unwrap().len(), 10);
    }
    let (fifo, aioli) = (runs[0]["makespan_s"].as_f64().unwrap(), runs[1]["makespan_s"].as_f64().unwrap());
    assert!(aioli < fifo, "aioli's makespan {aioli} should beat fifo's {fifo}");
    let t: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = t.as_array().or_else(|| t["traceEvents"].as_array()).expect("trace events");
    assert!(events.len() > 10, "a trace with events");
    let (_, b) = sim(&dir, "b.json", &[]);
    assert_eq!(simulated(&a), simulated(&b), "same seed, same simulation");
}

/// `sluice calibrate` measures a real file on this machine's disk, writes
/// a model the simulator loads, and the simulated device follows it: a
/// model with a 10x larger access cost makes the same run slower.
#[test]
fn calibrate_writes_a_model_that_sim_loads() {
    let dir = Scratch(std::env::temp_dir().join(format!("sluice-calibrate-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let model = dir.0.join("model.toml");
    let out = Command::new(SLUICE).args(["calibrate", "--root"]).arg(&dir.0).args(["--cell-ms", "20", "--file-size", "64M", "--out"]).arg(&model).output().unwrap();
    assert!(out.status.success(), "sluice calibrate failed: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("model:") && stdout.contains("parallelism"), "{stdout}");
    let text = std::fs::read_to_string(&model).unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(&dir.0).unwrap().filter_map(|e| e.ok()).filter(|e| e.file_name() != "model.toml").collect();
    assert!(leftovers.is_empty(), "the scratch file was not removed: {leftovers:?}");
    for key in ["dispatch_ns", "byte_ps", "seek_ns", "parallelism", "[measured]"] {
        assert!(text.contains(key), "{key} missing from {text}");
    }
    let fast = dir.0.join("fast.toml");
    let slow = dir.0.join("slow.toml");
    std::fs::write(&fast, "dispatch_ns = 50000\nbyte_ps = 1000\nseek_ns = 0\nparallelism = 4\n").unwrap();
    std::fs::write(&slow, "dispatch_ns = 500000\nbyte_ps = 1000\nseek_ns = 0\nparallelism = 4\n").unwrap();
    let makespan = |m: &PathBuf, json: &str| {
        let (_, v) = sim(&dir, json, &["--device-model", m.to_str().unwrap()]);
        v["runs"][0]["makespan_s"].as_f64().unwrap()
    };
    let _ = makespan(&model, "calibrated.json");
    let (f, s) = (makespan(&fast, "fast.json"), makespan(&slow, "slow.json"));
    assert!(s > f, "a 10x access cost did not slow the simulated run: {s} vs {f}");
    // The larger reads at the server's queue depth are in the file, and a
    // model with a parallelism of four is simulated with four channels:
    // faster than the same model with one.
    assert!(text.contains("[[measured.at_depth]]"), "{text}");
    let serial = dir.0.join("serial.toml");
    std::fs::write(&serial, "dispatch_ns = 500000\nbyte_ps = 1000\nseek_ns = 0\nparallelism = 1\n").unwrap();
    let one = makespan(&serial, "serial.json");
    assert!(s < one, "four channels were no faster than one: {s} vs {one}");
    let bad = dir.0.join("bad.toml");
    std::fs::write(&bad, "dispatch_ns = 1\nbyte_ps = 1\nseek_ns = 1\nparallelism = 0\n").unwrap();
    let out = Command::new(SLUICE).args(["sim", &scenario("mix10.toml"), "--device-model"]).arg(&bad).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("parallelism"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn validate_twins_runs_each_workload_for_real_and_in_the_simulator() {
    // O_DIRECT needs a disk file system: /var/tmp, not a tmpfs /tmp.
    let dir = Scratch(PathBuf::from("/var/tmp").join(format!("sluice-validate-test-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let model = dir.0.join("model.toml");
    std::fs::write(&model, "dispatch_ns = 80000\nbyte_ps = 800\nseek_ns = 10000\nparallelism = 8\n").unwrap();
    let json = dir.0.join("validate.json");
    let scratch = dir.0.join("runs");
    std::fs::create_dir_all(&scratch).unwrap();
    let out = Command::new(SLUICE)
        .args(["sim", "--validate", "--twins", "--validate-scale", "0.05", "--validate-runs", "1", "--device-model"])
        .arg(&model)
        .arg("--dir")
        .arg(&scratch)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "sluice sim --validate --twins failed: {}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("mix10") && table.contains("interference") && table.contains("O_DIRECT") && table.contains("error"), "{table}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "three workloads under fifo and aioli");
    for r in rows {
        let (real, sim) = (r["real_s"].as_f64().unwrap(), r["sim_s"].as_f64().unwrap());
        assert!(real > 0.0 && sim > 0.0 && real.is_finite() && sim.is_finite(), "{r}");
        let error = r["error"].as_f64().unwrap();
        assert!((error - (sim - real) / real).abs() < 1e-9, "error is (sim - real) / real: {r}");
        // Every real run went through a server that counted its device.
        assert!(r["real_dispatches"].as_u64().unwrap() > 0 && r["sim_dispatches"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["cause"].as_str().unwrap().is_empty(), error.abs() <= 0.05, "a cause exactly when over 5%: {r}");
    }
    let left: Vec<_> = std::fs::read_dir(&scratch).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).collect();
    assert!(left.is_empty(), "the real runs' files were not removed: {left:?}");
}

/// `sluice sim --validate`: every policy predicted from every real run's
/// trace by what-if, against the median of the predicted policy's real
/// runs.
#[test]
fn validate_predicts_each_policy_from_each_real_runs_trace() {
    let dir = Scratch(PathBuf::from("/var/tmp").join(format!("sluice-predict-test-{}", std::process::id())));
    let scratch = dir.0.join("runs");
    std::fs::create_dir_all(&scratch).unwrap();
    let json = dir.0.join("predict.json");
    let out = Command::new(SLUICE)
        .args(["sim", "--validate", "--validate-scale", "0.1", "--validate-runs", "2", "--dir"])
        .arg(&scratch)
        .arg("--json")
        .arg(&json)
        // No host profile in this cache directory: the replays have none.
        .env("XDG_CACHE_HOME", &dir.0)
        // The Darshan workload's log is read by the project's Python.
        .env("SLUICE_PYTHON", venv_python())
        .output()
        .unwrap();
    assert!(out.status.success(), "sluice sim --validate failed: {}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("of 40 predictions within 10%"), "{table}");
    assert!(table.contains("of 20 real runs within 10% of the median of their policy's other runs"), "{table}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no host profile"), "the missing profile is said");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 20, "five workloads, fifo and aioli each predicted from traces of each");
    for w in ["decomposition 4 KiB", "decomposition 64 KiB", "interference", "mix10", "darshan ckpt-4ranks.darshan"] {
        assert_eq!(rows.iter().filter(|r| r["workload"].as_str().unwrap().starts_with(w)).count(), 4, "{w}");
    }
    // Each policy's real runs, each against the other (two runs).
    let spread = v["spread"].as_array().unwrap();
    assert_eq!(spread.len(), 10, "five workloads x two policies");
    assert!(spread.iter().all(|s| s["real_s"].as_array().unwrap().len() == 2 && s["errors"].as_array().unwrap().len() == 2), "{spread:?}");
    for r in rows {
        let (pred, real) = (r["predicted_s"].as_array().unwrap(), r["real_s"].as_array().unwrap());
        assert_eq!((pred.len(), real.len()), (2, 2), "one prediction per run's trace, against each real run: {r}");
        let median = r["real_median_s"].as_f64().unwrap();
        assert!(median > 0.0 && median.is_finite(), "{r}");
        for (p, e) in pred.iter().zip(r["errors"].as_array().unwrap()) {
            let (p, e) = (p.as_f64().unwrap(), e.as_f64().unwrap());
            assert!(p > 0.0 && (e - (p - median) / median).abs() < 1e-9, "error is (predicted - real) / real: {r}");
        }
    }
    // Under fifo and aioli the emulated disk's processes see what they did:
    // aioli predicted far faster than fifo from either policy's traces.
    let predicted = |w: &str, from: &str, to: &str| {
        let r = rows.iter().find(|r| r["workload"].as_str().unwrap().starts_with(w) && r["from"] == from && r["to"] == to).unwrap();
        r["predicted_s"].as_array().unwrap().iter().map(|p| p.as_f64().unwrap()).fold(0.0, f64::max)
    };
    for from in ["fifo", "aioli"] {
        assert!(predicted("interference", from, "aioli") * 3.0 < predicted("interference", from, "fifo"), "interference from {from} traces");
    }
    let left: Vec<_> = std::fs::read_dir(&scratch).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).collect();
    assert!(left.is_empty(), "the real runs' files and traces were not removed: {left:?}");
}

#[test]
fn validate_refuses_cache_modes_and_cleans_up_after_an_error() {
    let dir = Scratch(std::env::temp_dir().join(format!("sluice-validate-bad-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let out = Command::new(SLUICE).args(["sim", "--validate", "--policy", "aioli/aggregation", "--dir"]).arg(&dir.0).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("without a cache layer"), "{err}");
    let missing = dir.0.join("missing.toml");
    let out = Command::new(SLUICE).args(["sim", "--validate", "--twins", "--device-model"]).arg(&missing).arg("--dir").arg(&dir.0).output().unwrap();
    assert!(!out.status.success(), "a missing model file is an error");
    let out = Command::new(SLUICE).args(["sim", "--validate", "--device-model"]).arg(&missing).arg("--dir").arg(&dir.0).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--device-model is for --validate --twins"), "predictions take no model file: {err}");
    let left: Vec<_> = std::fs::read_dir(&dir.0).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).collect();
    assert!(left.is_empty(), "the scratch directory outlived the error: {left:?}");
    // A Darshan log the user names must be read: no run starts without it.
    let out = Command::new(SLUICE).args(["sim", "--validate", "--darshan"]).arg(dir.0.join("missing.darshan")).arg("--dir").arg(&dir.0).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("missing.darshan") && !err.contains("for real, run"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&dir.0).unwrap().filter_map(|e| e.ok()).map(|e| e.path()).collect();
    assert!(left.is_empty(), "the scratch directory outlived the error: {left:?}");
    let out = Command::new(SLUICE).args(["sim", "--validate", "--seed", "3"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("cannot be used with"), "--seed has no meaning for --validate");
}

/// `sluice sim --qos FILE`: the daemon's rules file in place of the
/// scenario's classes gives what the scenario's own classes give.
#[test]
fn sim_takes_the_daemons_rules_file() {
    let dir = Scratch(std::env::temp_dir().join(format!("sluice-sim-qos-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let text = std::fs::read_to_string(scenario("qos-limit.toml")).unwrap();
    // The scenario without its class.
    let mut in_class = false;
    let bare: String = text
        .lines()
        .filter(|l| {
            in_class = (in_class || *l == "[[class]]") && !l.is_empty();
            !in_class && !l.starts_with("class = ")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!bare.lines().any(|l| l == "[[class]]" || l.starts_with("class = ") || l.starts_with("rate_bytes_per_s")), "{bare}");
    std::fs::write(dir.0.join("bare.toml"), &bare).unwrap();
    std::fs::write(dir.0.join("rules.toml"), "[[class]]\nname = \"limited\"\nrate_bytes_per_s = 20000000\n[[rule]]\nclass = \"limited\"\napp = \"limited\"\n").unwrap();
    let limited = |file: &str, extra: &[&str]| {
        let path = dir.0.join(format!("{}.json", extra.len()));
        let out = Command::new(SLUICE).args(["sim", file, "--policy", "aioli", "--scale", "0.25", "--json"]).arg(&path).args(extra).output().unwrap();
        assert!(out.status.success(), "sluice sim failed: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        v["runs"][0]["apps"].as_array().unwrap().iter().find(|a| a["name"] == "limited").unwrap()["completion_s"].as_f64().unwrap()
    };
    let bare_path = dir.0.join("bare.toml");
    let (own, given, none) = (
        limited(&scenario("qos-limit.toml"), &[]),
        limited(bare_path.to_str().unwrap(), &["--qos", dir.0.join("rules.toml").to_str().unwrap()]),
        limited(bare_path.to_str().unwrap(), &[]),
    );
    assert_eq!(own, given, "the rules file places the application as the scenario's class does");
    assert_ne!(own, none, "and the class changes the run");
}

/// `--dispatches-inflight N` replaces the depth the scenario's servers
/// keep: on a device of eight channels, one in flight is another run.
#[test]
fn the_depth_in_flight_can_be_given() {
    let dir = Scratch(std::env::temp_dir().join(format!("sluice-sim-depth-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let text = std::fs::read_to_string(scenario("qos-share.toml")).unwrap();
    let parallel = text
        .replace("device = \"hdd7200\"", "device = \"profile\"\nchannels = 8")
        .replace("\n[client]", "\n[server.profile]\naccess_ns = 40000\nbytes_per_s = 1500000000\n\n[client]");
    assert_ne!(parallel, text);
    let file = dir.0.join("parallel.toml");
    std::fs::write(&file, parallel).unwrap();
    let makespan = |extra: &[&str]| {
        let path = dir.0.join(format!("d{}.json", extra.len()));
        let out = Command::new(SLUICE).args(["sim", file.to_str().unwrap(), "--scale", "0.1", "--json"]).arg(&path).args(extra).output().unwrap();
        assert!(out.status.success(), "sluice sim failed: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        v["runs"][0]["makespan_s"].as_f64().unwrap()
    };
    let (eight, one) = (makespan(&[]), makespan(&["--dispatches-inflight", "1"]));
    assert!(one > eight, "one dispatch in flight over eight channels is slower: {one} s against {eight} s");
}

/// A world of `LARGE_WORLD_PROCS` processes or more makes the binary
/// allocate from its huge-page arenas (`crates/sluice/src/alloc.rs`), two
/// worlds at once on two threads here; this test process keeps glibc's
/// allocator. The reports must be the same, host timings aside.
#[test]
fn a_large_world_gives_the_same_report_on_the_binarys_arenas() {
    let procs = sluice_sim::LARGE_WORLD_PROCS + 10;
    let dir = Scratch(std::env::temp_dir().join(format!("sluice-sim-large-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let path = dir.0.join("large.json");
    let out = Command::new(SLUICE).args(["sim", "--bench", "--bench-procs", &procs.to_string(), "--bench-requests", "2", "--jobs", "2", "--json"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "sluice sim failed: {}", String::from_utf8_lossy(&out.stderr));
    let binary: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let opts = sluice_sim::RunOptions { jobs: 1, ..Default::default() };
    let (report, _) = sluice_sim::run(&sluice_sim::bench_scenario(procs, 2), &opts).unwrap();
    let here = serde_json::to_value(&report).unwrap();
    let simulated = |v: &Value| {
        let mut v = v.clone();
        for r in v["runs"].as_array_mut().unwrap() {
            r.as_object_mut().unwrap().retain(|k, _| k != "wall_s" && k != "events_per_s");
        }
        v
    };
    assert_eq!(binary["runs"].as_array().map(Vec::len), Some(2));
    assert!(binary["runs"][1]["events"].as_u64().unwrap() > 2 * procs, "{}", binary["runs"][1]);
    assert_eq!(simulated(&binary), simulated(&here));
}
