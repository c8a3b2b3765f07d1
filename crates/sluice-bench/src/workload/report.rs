//! The report of a workload run: a table for people, JSON for machines.
//! The JSON shape is documented in `docs/bench.md` and shared with
//! `sluice sim`.

use serde::Serialize;

/// One application in one run.
#[derive(Clone, Debug, Serialize)]
pub struct AppReport {
    pub name: String,
    pub procs: u32,
    pub bytes: u64,
    pub completion_s: f64,
    pub mib_s: f64,
    /// Completion here over completion when run alone (`--alone`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slowdown: Option<f64>,
    /// Requests per device operation, from the server's counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests_per_dispatch: Option<f64>,
    /// Each rank's start after the runner's `go` to all (ns), in rank
    /// order: the order in which they reach the server (`sluice sim
    /// --validate` starts its twin's processes so).
    pub start_offsets_ns: Vec<u64>,
}

/// One mode (direct, or a policy) over the whole scenario.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub mode: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub granularity: Option<u64>,
    pub makespan_s: f64,
    pub jain: f64,
    pub apps: Vec<AppReport>,
    /// The device cost model the server learned during the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_model: Option<DeviceModel>,
    /// The server's device: dispatches, and the sum of their service
    /// times in seconds (overlapping ones each count). None for `direct`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dispatches: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_busy_s: Option<f64>,
    /// Of those dispatches, the ones that did not continue the previous
    /// one (a seek on a disk). None for `direct`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seeks: Option<u64>,
    /// The scheduler's holds for missing pieces and windows for
    /// synchronous readers (aioli's). None for `direct`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub windows: Option<u64>,
    /// CPU used from the start until the last process finished: the
    /// whole machine's, the started server's and the workers' own
    /// (`cpu_s`, `cpu_share`, `server_cpu_s`, `workers_cpu_s`). None
    /// where `/proc` cannot be read.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<super::cpu::CpuUse>,
    /// With `RunConfig::sample_ms`: each application's bytes moved so far
    /// (read and written), every `sample_ms` from the start, as the
    /// started server counted them: `(seconds, [(application, bytes)])`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub samples: Samples,
}

#[cfg(test)]
impl RunReport {
    /// A run of `mode` with only its makespan (tests).
    pub(crate) fn bare(mode: &str, makespan_s: f64) -> RunReport {
        RunReport {
            mode: mode.into(),
            granularity: None,
            makespan_s,
            jain: 1.0,
            apps: Vec::new(),
            device_model: None,
            dispatches: None,
            device_busy_s: None,
            seeks: None,
            holds: None,
            windows: None,
            cpu: None,
            samples: Vec::new(),
        }
    }
}

/// Each application's bytes at instants of a run: `(seconds, [(application, bytes)])`.
pub type Samples = Vec<(f64, Vec<(String, u64)>)>;

/// A device cost model (`sluice_core::DeviceCost`), as reported.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct DeviceModel {
    pub dispatch_ns: u64,
    pub byte_ps: u64,
    pub seek_ns: u64,
    pub parallelism: u32,
}

impl From<sluice_core::DeviceCost> for DeviceModel {
    fn from(c: sluice_core::DeviceCost) -> DeviceModel {
        DeviceModel { dispatch_ns: c.dispatch_ns, byte_ps: c.byte_ps, seek_ns: c.seek_ns, parallelism: c.parallelism }
    }
}

impl std::fmt::Display for DeviceModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        sluice_core::DeviceCost::new(self.dispatch_ns, self.byte_ps, self.seek_ns, self.parallelism).fmt(f)
    }
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub scenario: String,
    pub device: String,
    pub direct_io: bool,
    /// Whether the page cache was dropped before every run.
    pub caches_dropped: bool,
    pub scale: f64,
    /// The path the processes' I/O took to the servers (`library`, `run`
    /// or `mount`); the direct mode's never goes through one.
    pub via: String,
    /// Writes through a page cache were made durable (`fsync`) before
    /// each process finished: the times include the flush.
    pub durable: bool,
    pub runs: Vec<RunReport>,
}

/// Jain's fairness index of `xs`: 1 when all equal, 1/n when one takes all.
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if sq == 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * sq)
}

/// The seed's table: one row per application, completion time per mode,
/// then makespan and fairness.
pub fn table(r: &Report) -> String {
    let mut out = format!(
        "{} on {} ({}, page cache {}, scale {}, servers reached via {}{})\n",
        r.scenario,
        r.device,
        if r.direct_io { "O_DIRECT" } else { "buffered" },
        if r.caches_dropped { "dropped before each run" } else { "NOT dropped" },
        r.scale,
        r.via,
        if r.durable { "; buffered writes timed until fsync'd" } else { "" }
    );
    let mut groups: Vec<Option<u64>> = r.runs.iter().map(|x| x.granularity).collect();
    groups.dedup();
    for g in groups {
        let runs: Vec<&RunReport> = r.runs.iter().filter(|x| x.granularity == g).collect();
        if let Some(g) = g {
            out += &format!("granularity {} KiB\n", g / 1024);
        }
        out += &format!("{:<22} {:>6} {:>10}", "application", "procs", "MiB");
        for run in &runs {
            out += &format!(" {:>12}", format!("{} s", run.mode));
        }
        out += "\n";
        for (i, a) in runs[0].apps.iter().enumerate() {
            out += &format!("{:<22} {:>6} {:>10.1}", a.name, a.procs, a.bytes as f64 / 1048576.0);
            for run in &runs {
                out += &format!(" {:>12.3}", run.apps[i].completion_s);
            }
            out += "\n";
        }
        out += &format!("{:<40}", "makespan (s)");
        for run in &runs {
            out += &format!(" {:>12.3}", run.makespan_s);
        }
        out += &format!("\n{:<40}", "Jain's index over app MiB/s");
        for run in &runs {
            out += &format!(" {:>12.3}", run.jain);
        }
        out += &format!("\n{:<40}", "requests per device op");
        for run in &runs {
            let rpd: Vec<f64> = run.apps.iter().filter_map(|a| a.requests_per_dispatch).collect();
            let cell = if rpd.is_empty() { "-".to_string() } else { format!("{:.1}", rpd.iter().sum::<f64>() / rpd.len() as f64) };
            out += &format!(" {cell:>12}");
        }
        out += &format!("\n{:<40}", "CPU s, all processes (% of cores)");
        for run in &runs {
            let cell = run.cpu.map_or("-".to_string(), |c| format!("{:.2} ({:.0}%)", c.cpu_s, c.cpu_share * 100.0));
            out += &format!(" {cell:>12}");
        }
        out += &format!("\n{:<40}", "of which stolen by the hypervisor");
        for run in &runs {
            let cell = run.cpu.map_or("-".to_string(), |c| format!("{:.2}", c.steal_s));
            out += &format!(" {cell:>12}");
        }
        out += &format!("\n{:<40}", "CPU s of the server");
        for run in &runs {
            let cell = run.cpu.and_then(|c| c.server_cpu_s).map_or("-".to_string(), |s| format!("{s:.2}"));
            out += &format!(" {cell:>12}");
        }
        out += &format!("\n{:<40}", "CPU us of the server per request");
        for run in &runs {
            let cell = run.cpu.and_then(|c| c.server_us_per_request).map_or("-".to_string(), |s| format!("{s:.1}"));
            out += &format!(" {cell:>12}");
        }
        out += "\n";
        for run in runs.iter().filter(|r| r.device_model.is_some()) {
            out += &format!("device model learned under {}: {}\n", run.mode, run.device_model.expect("filtered"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_bounds() {
        assert!((jain(&[3.0, 3.0, 3.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert!((jain(&[1.0, 2.0]) - 0.9).abs() < 1e-12);
    }
}
