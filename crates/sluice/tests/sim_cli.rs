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
