//! Shared helpers of the simulator's tests: load a shipped scenario,
//! scale it, run it, and look runs up by mode. Each test binary uses a
//! subset of them.
#![allow(dead_code)]

use sluice_sim::{Report, RunOptions, Scenario};

/// A shipped scenario file, by name.
pub fn shipped(name: &str) -> Scenario {
    let path = format!("{}/../../scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Scenario::from_toml(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Run `sc` at `scale` in `modes`; panics with the error (and its seed).
pub fn check(sc: &Scenario, scale: f64, modes: &[&str]) -> Report {
    let opts = RunOptions { modes: modes.iter().map(|m| m.to_string()).collect(), scale: Some(scale), ..RunOptions::default() };
    match sluice_sim::run(sc, &opts) {
        Ok((report, _)) => report,
        Err(e) => panic!("{}: {e}", sc.name),
    }
}

/// Makespan of `mode` at sweep point `g`.
pub fn makespan(r: &Report, mode: &str, g: Option<u64>) -> f64 {
    r.run(mode, g).unwrap_or_else(|| panic!("no run {mode} at {g:?}")).makespan_s
}
