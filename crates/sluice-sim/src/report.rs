//! What a simulation reports: per application completion time and
//! bandwidth per mode, makespan, Jain's fairness index, device counters,
//! and the engine's own cost. The JSON shape is `sluice bench`'s (see
//! `docs/sim.md`), so a simulated and a measured run compare field by
//! field; the table reads like the seed's evaluation tables.

use std::fmt::Write;

use serde::Serialize;

use crate::state::DevStats;
use crate::units::size;

const MIB: f64 = 1_048_576.0;

/// One application in one run.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct AppReport {
    pub name: String,
    pub procs: u64,
    pub bytes: u64,
    pub completion_s: f64,
    pub mib_s: f64,
    /// MPI-IO applications: the aggregators the run used (given, swept,
    /// or chosen by `k_bytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregators: Option<u64>,
}

impl AppReport {
    pub fn new(name: &str, procs: u64, bytes: u64, completion_s: f64) -> AppReport {
        let mib_s = if completion_s > 0.0 { bytes as f64 / MIB / completion_s } else { 0.0 };
        AppReport { name: name.to_string(), procs, bytes, completion_s, mib_s, aggregators: None }
    }
}

/// Device counters summed over the servers.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct DeviceReport {
    pub seeks_none: u64,
    pub seeks_near: u64,
    pub seeks_far: u64,
    pub dispatches: u64,
    pub requests: u64,
    pub requests_per_dispatch: f64,
    pub bytes: u64,
    pub busy_s: f64,
    pub cache_hits: u64,
    /// The most requests one server's backlog held at once (the largest
    /// over the servers; its bound is `backlog_max`).
    pub backlog_peak: u64,
    /// The scheduler's holds for missing pieces and windows for
    /// synchronous readers (aioli; 0 under other policies).
    pub holds: u64,
    pub windows: u64,
}

impl DeviceReport {
    pub(crate) fn add(&mut self, d: &DevStats, s: &sluice_core::Stats) {
        self.seeks_none += d.seeks_none;
        self.seeks_near += d.seeks_near;
        self.seeks_far += d.seeks_far;
        self.dispatches += s.dispatches;
        self.requests += s.dispatched_requests;
        self.requests_per_dispatch = if self.dispatches > 0 { self.requests as f64 / self.dispatches as f64 } else { 0.0 };
        self.bytes += d.bytes;
        self.busy_s += d.busy_ns as f64 / 1e9;
        self.cache_hits += d.cache_hits;
        self.backlog_peak = self.backlog_peak.max(d.backlog_peak);
        self.holds += s.holds;
        self.windows += s.windows;
    }
}

/// One mode (policy and cache) at one sweep point.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RunReport {
    pub mode: String,
    /// The sweep point, in bytes (`granularity`, as `sluice bench`).
    #[serde(rename = "granularity", skip_serializing_if = "Option::is_none")]
    pub granularity_bytes: Option<u64>,
    /// The point of an aggregator sweep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregators: Option<u64>,
    pub makespan_s: f64,
    pub jain: f64,
    pub events: u64,
    pub wall_s: f64,
    pub events_per_s: f64,
    /// High-water marks of pieces and messages in flight: the run's
    /// memory, bounded by what is in flight rather than by its length.
    pub pieces_peak: u64,
    pub messages_peak: u64,
    pub apps: Vec<AppReport>,
    pub device_stats: DeviceReport,
}

impl RunReport {
    pub(crate) fn new(mode: String, granularity_bytes: Option<u64>, makespan_s: f64, apps: Vec<AppReport>, events: u64, wall_s: f64, device_stats: DeviceReport) -> RunReport {
        let (pieces_peak, messages_peak) = (0, 0);
        let jain = jain(&apps.iter().map(|a| a.mib_s).collect::<Vec<_>>());
        let events_per_s = if wall_s > 0.0 { events as f64 / wall_s } else { 0.0 };
        RunReport { mode, granularity_bytes, aggregators: None, makespan_s, jain, events, wall_s, events_per_s, pieces_peak, messages_peak, apps, device_stats }
    }

    /// The application named `name`.
    pub fn app(&self, name: &str) -> Option<&AppReport> {
        self.apps.iter().find(|a| a.name == name)
    }
}

/// Jain's fairness index of `x`: (Σx)² / (n·Σx²), 1 when all are equal.
pub fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    if x.is_empty() || sq == 0.0 {
        return 1.0;
    }
    sum * sum / (x.len() as f64 * sq)
}

/// The whole report of `sluice sim`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Report {
    pub scenario: String,
    pub device: String,
    pub direct_io: bool,
    /// The scale factor applied to every application's bytes.
    pub scale: f64,
    pub seed: u64,
    pub runs: Vec<RunReport>,
}

impl Report {
    /// The same report with host timings zeroed: what determinism tests
    /// compare (everything else is a function of scenario and seed).
    pub fn without_host_timing(&self) -> Report {
        let mut r = self.clone();
        for run in &mut r.runs {
            (run.wall_s, run.events_per_s) = (0.0, 0.0);
        }
        r
    }

    /// The run of `mode` at sweep point `granularity`.
    pub fn run(&self, mode: &str, granularity: Option<u64>) -> Option<&RunReport> {
        self.runs.iter().find(|r| r.mode == mode && r.granularity_bytes == granularity)
    }

    /// A table per sweep point: one row per application with its completion
    /// time under each mode, then makespan, fairness and device rows.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let mut points: Vec<(Option<u64>, Option<u64>)> = self.runs.iter().map(|r| (r.granularity_bytes, r.aggregators)).collect();
        points.dedup();
        for (g, n) in points {
            let runs: Vec<&RunReport> = self.runs.iter().filter(|r| (r.granularity_bytes, r.aggregators) == (g, n)).collect();
            let title = match (g, n) {
                (Some(g), _) => format!("{} at granularity {}", self.scenario, size(g)),
                (None, Some(n)) => format!("{} with {n} aggregators", self.scenario),
                (None, None) => self.scenario.clone(),
            };
            table_one(&mut out, &title, &runs);
        }
        out
    }
}

/// How a summary row renders one run.
type Cell = fn(&RunReport) -> String;

fn table_one(out: &mut String, title: &str, runs: &[&RunReport]) {
    let width = runs[0].apps.iter().map(|a| a.name.len()).max().unwrap_or(0).max(24);
    let col = runs.iter().map(|r| r.mode.len()).max().unwrap_or(0).max(16);
    let _ = writeln!(out, "{title}: completion time (s)");
    let _ = write!(out, "{:<width$}", "Applications");
    runs.iter().for_each(|r| {
        let _ = write!(out, " {:>col$}", r.mode);
    });
    let _ = writeln!(out);
    for (i, a) in runs[0].apps.iter().enumerate() {
        let _ = write!(out, "{:<width$}", a.name);
        runs.iter().for_each(|r| {
            let _ = write!(out, " {:>col$}", secs(r.apps[i].completion_s));
        });
        let _ = writeln!(out);
    }
    let rows: [(&str, Cell); 6] = [
        ("makespan (s)", |r| secs(r.makespan_s)),
        ("Jain's index (MiB/s)", |r| format!("{:.3}", r.jain)),
        ("requests per dispatch", |r| format!("{:.2}", r.device_stats.requests_per_dispatch)),
        ("seeks none/near/far", |r| format!("{}/{}/{}", r.device_stats.seeks_none, r.device_stats.seeks_near, r.device_stats.seeks_far)),
        ("events", |r| r.events.to_string()),
        ("events/s (host)", |r| format!("{:.2}M", r.events_per_s / 1e6)),
    ];
    for (label, f) in rows {
        let _ = write!(out, "{label:<width$}");
        runs.iter().for_each(|r| {
            let _ = write!(out, " {:>col$}", f(r));
        });
        let _ = writeln!(out);
    }
    let _ = writeln!(out);
}

fn secs(s: f64) -> String {
    if s >= 100.0 {
        format!("{s:.0}")
    } else if s >= 10.0 {
        format!("{s:.1}")
    } else {
        format!("{s:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_by_hand() {
        assert_eq!(jain(&[5.0, 5.0, 5.0]), 1.0);
        // (1+3)^2 / (2 * (1+9)) = 16/20.
        assert!((jain(&[1.0, 3.0]) - 0.8).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
    }

}
