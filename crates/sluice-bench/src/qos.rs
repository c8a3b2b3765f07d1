//! The service-level benchmark (`sluice bench qos`): real processes on a
//! started server with service classes (`sluice serve --qos`), each
//! application's bytes sampled every 100 ms on the server.
//!
//! - **Limit.** 8 processes of application `limited`, in a class limited
//!   to `rate` bytes/s, read their own files in 256 KiB requests beside 8
//!   processes of `others` (no class). The figure: the limited class's
//!   rate over every 1 s window (sliding by 100 ms) while it ran, against
//!   `rate`; and what `others` got meanwhile.
//! - **Guarantee.** 2 processes of `gold`, in a class guaranteed
//!   `guarantee` bytes/s, read beside 32 processes of `crowd`; once with
//!   the class and once without. The figure: gold's rate over every 1 s
//!   window while it ran.
//! - **Share.** Two users read beside each other: one (the benchmark's
//!   own uid) runs one job (`slurm-1`, 4 processes), the other (uid
//!   `SHARE_UID`, nobody) four (`slurm-2` to `slurm-5`, 4 processes
//!   each); once with the sharing order `share = ["user", "job"]` and once
//!   without. The figure: each user's rate while both ran, and their
//!   ratio over every 1 s window.

use std::path::PathBuf;

use serde::Serialize;
use sluice_server::qos::QosRules;
use sluice_server::DeviceKind;

use crate::workload::pattern::{AppSpec, Dir, Pattern};
use crate::workload::report::RunReport;
use crate::workload::runner::{run, RunConfig};
use crate::workload::scenario::Scenario;
use crate::workload::WorkloadError;

const MIB: u64 = 1 << 20;
/// Sampling period of the server's counters.
const SAMPLE_MS: u64 = 100;
/// Bytes per request.
const REQUEST_BYTES: u64 = 256 << 10;
/// The second user of the share setup (nobody on Debian).
pub const SHARE_UID: u32 = 65_534;
/// Which setups run, by name.
pub const SETUPS: [&str; 3] = ["limit", "guarantee", "share"];

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct QosConfig {
    /// `hdd7200` or `real`.
    pub device: String,
    pub direct: bool,
    pub policy: String,
    pub rate_bytes_per_s: u64,
    pub guarantee_bytes_per_s: u64,
    /// The classes' bucket depth, ms (`depth_ms` in the rules file).
    pub depth_ms: u64,
    /// Seconds each measured class should run for (sizes follow).
    pub seconds: f64,
    /// What each user of the share setup is expected to get, bytes/s
    /// (its sizes follow).
    pub share_bytes_per_s: u64,
    /// The setups to run (`SETUPS`).
    pub setups: Vec<String>,
    #[serde(skip)]
    pub exe: PathBuf,
    #[serde(skip)]
    pub root: PathBuf,
}

/// One class's rate over 1 s windows.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Windows {
    /// Bytes/s of each 1 s window (sliding by the sampling period).
    pub bytes_per_s: Vec<f64>,
    pub min: f64,
    pub max: f64,
    /// Its bytes over its whole run (from its first byte to its end).
    pub mean: f64,
    /// What the other application moved per second meanwhile.
    pub others_bytes_per_s: f64,
}

/// Two users' rates while both ran.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Shares {
    /// The user with one job, and the user with four, bytes/s.
    pub one_job: f64,
    pub four_jobs: f64,
    /// `one_job / four_jobs` over every 1 s window (sliding by the
    /// sampling period) while both ran.
    pub ratios: Vec<f64>,
    /// Seconds both ran.
    pub span_s: f64,
    /// When each user's last application was done (s from the start),
    /// and the bytes each moved: its mean rate over its whole run, the
    /// figure `sluice sim` predicts (`scenarios/qos-share.toml`).
    pub one_job_done_s: f64,
    pub four_jobs_done_s: f64,
    pub one_job_bytes: u64,
    pub four_jobs_bytes: u64,
}

/// The report `--json` writes (a setup not run: its default, empty).
#[derive(Clone, Debug, Serialize)]
pub struct QosReport {
    pub config: QosConfig,
    pub limited: Windows,
    pub guaranteed: Windows,
    /// The same run without the class.
    pub unguaranteed: Windows,
    /// With the sharing order users then jobs, and without.
    pub shared: Shares,
    pub unshared: Shares,
}

fn app(name: &str, procs: u32, bytes_each: u64) -> AppSpec {
    let size = bytes_each / REQUEST_BYTES * REQUEST_BYTES;
    AppSpec { name: name.into(), procs, op: Dir::Read, pattern: Pattern::Contiguous, size, granularity: REQUEST_BYTES, shared_file: false, weight: 1, replay: None, uid: None }
}

fn rules(text: &str) -> Result<QosRules, WorkloadError> {
    QosRules::parse(text).map_err(|e| WorkloadError::usage(format!("qos rules: {e}")))
}

/// `app`'s 1 s windows from `run`'s samples, while it was moving bytes
/// (from its first byte to the last sample before it was done), and
/// `other`'s mean rate over the same span.
pub fn windows(run: &RunReport, app: &str, other: &str) -> Windows {
    let bytes = |i: usize, name: &str| run.samples[i].1.iter().find(|(n, _)| n == name).map_or(0, |(_, b)| *b);
    let n = run.samples.len();
    let total = (0..n).map(|i| bytes(i, app)).max().unwrap_or(0);
    let first = (0..n).find(|&i| bytes(i, app) > 0).map_or(0, |i| i.saturating_sub(1));
    let last = (0..n).rfind(|&i| bytes(i, app) < total).unwrap_or(0);
    // The first sample that saw it done: its whole run, for the mean.
    let done = (last + 1).min(n.saturating_sub(1));
    let run_s = (run.samples.get(done).map_or(0.0, |s| s.0) - run.samples.get(first).map_or(0.0, |s| s.0)).max(1e-9);
    let mean = (bytes(done, app).saturating_sub(bytes(first, app))) as f64 / run_s;
    let per = (1000 / SAMPLE_MS) as usize;
    let mut w = Vec::new();
    let mut i = first;
    while i + per <= last {
        let dt = run.samples[i + per].0 - run.samples[i].0;
        w.push((bytes(i + per, app) - bytes(i, app)) as f64 / dt.max(1e-9));
        i += 1;
    }
    let span = (run.samples.get(last).map_or(0.0, |s| s.0) - run.samples.get(first).map_or(0.0, |s| s.0)).max(1e-9);
    let others = (bytes(last, other).saturating_sub(bytes(first, other))) as f64 / span;
    let min = w.iter().copied().fold(f64::INFINITY, f64::min);
    let max = w.iter().copied().fold(0.0, f64::max);
    Windows { min: if w.is_empty() { 0.0 } else { min }, max, mean, bytes_per_s: w, others_bytes_per_s: others }
}

/// The rates of the applications `a` and those of `b`, summed, while
/// every one of them was moving bytes (from the last first byte to the
/// last sample before the first of them was done).
pub fn shares(run: &RunReport, a: &[&str], b: &[&str]) -> Shares {
    let bytes = |i: usize, names: &[&str]| -> u64 { run.samples[i].1.iter().filter(|(n, _)| names.contains(&n.as_str())).map(|(_, b)| *b).sum() };
    let one = |i: usize, name: &str| run.samples[i].1.iter().find(|(n, _)| n == name).map_or(0, |(_, b)| *b);
    let n = run.samples.len();
    let all: Vec<&str> = a.iter().chain(b).copied().collect();
    let total = |name: &str| (0..n).map(|i| one(i, name)).max().unwrap_or(0);
    let first = all.iter().map(|&x| (0..n).find(|&i| one(i, x) > 0).unwrap_or(n)).max().unwrap_or(0).saturating_sub(1);
    let last = all.iter().map(|&x| (0..n).rfind(|&i| one(i, x) < total(x)).unwrap_or(0)).min().unwrap_or(0);
    if last <= first {
        return Shares::default();
    }
    let dt = |i: usize, j: usize| (run.samples[j].0 - run.samples[i].0).max(1e-9);
    let rate = |names: &[&str], i: usize, j: usize| (bytes(j, names) - bytes(i, names)) as f64 / dt(i, j);
    let per = (1000 / SAMPLE_MS) as usize;
    let ratios = (first..(last + 1).saturating_sub(per)).map(|i| rate(a, i, i + per) / rate(b, i, i + per).max(1e-9)).collect();
    Shares { one_job: rate(a, first, last), four_jobs: rate(b, first, last), ratios, span_s: dt(first, last), ..Shares::default() }
}

/// The share setup, with the sharing order users then jobs or without.
fn share_run(cfg: &QosConfig, shared: bool) -> Result<Shares, WorkloadError> {
    let per_user = cfg.share_bytes_per_s as f64 * cfg.seconds;
    let mut apps = vec![app("slurm-1", 4, (per_user / 4.0) as u64)];
    for j in 2..6 {
        apps.push(AppSpec { uid: Some(SHARE_UID), ..app(&format!("slurm-{j}"), 4, (per_user / 16.0) as u64) });
    }
    let qos = if shared { Some(rules("share = [\"user\", \"job\"]\n")?) } else { None };
    let run = one(cfg, apps, qos, if shared { "share" } else { "no-share" })?;
    let (a, b) = (["slurm-1"], ["slurm-2", "slurm-3", "slurm-4", "slurm-5"]);
    let done =
        |names: &[&str]| run.apps.iter().filter(|x| names.contains(&x.name.as_str())).map(|x| (x.completion_s, x.bytes)).fold((0.0f64, 0), |(t, b), (c, n)| (t.max(c), b + n));
    let ((ta, ba), (tb, bb)) = (done(&a), done(&b));
    Ok(Shares { one_job_done_s: ta, four_jobs_done_s: tb, one_job_bytes: ba, four_jobs_bytes: bb, ..shares(&run, &a, &b) })
}

fn one(cfg: &QosConfig, apps: Vec<AppSpec>, qos: Option<QosRules>, label: &str) -> Result<RunReport, WorkloadError> {
    let device = DeviceKind::parse(&cfg.device).map_err(|e| WorkloadError::usage(e.to_string()))?;
    let scenario = Scenario { name: label.into(), apps };
    let rc = RunConfig {
        direct_io: cfg.direct,
        progress: true,
        qos,
        sample_ms: SAMPLE_MS,
        ..RunConfig::started(scenario, vec![cfg.policy.clone()], device, cfg.root.join(label), cfg.exe.clone())
    };
    Ok(run(&rc)?.runs.remove(0))
}

/// Run the setups `cfg.setups` names.
pub fn qos(cfg: &QosConfig) -> Result<QosReport, WorkloadError> {
    if let Some(s) = cfg.setups.iter().find(|s| !SETUPS.contains(&s.as_str())) {
        return Err(WorkloadError::usage(format!("no setup {s:?} (one of {})", SETUPS.join(", "))));
    }
    let runs = |name: &str| cfg.setups.iter().any(|s| s == name);
    let (r, g, secs) = (cfg.rate_bytes_per_s, cfg.guarantee_bytes_per_s, cfg.seconds);
    let mut report = QosReport {
        config: cfg.clone(),
        limited: Windows::default(),
        guaranteed: Windows::default(),
        unguaranteed: Windows::default(),
        shared: Shares::default(),
        unshared: Shares::default(),
    };
    if runs("limit") {
        // The limited class: `secs` at its rate; the others twice as long
        // at four times it, so they outlast it.
        let limited_each = (r as f64 * secs / 8.0) as u64;
        let limit_rules =
            rules(&format!("[[class]]\nname = \"limited\"\nrate_bytes_per_s = {r}\ndepth_ms = {}\n[[rule]]\nclass = \"limited\"\napp = \"limited\"\n", cfg.depth_ms))?;
        let limit = one(cfg, vec![app("limited", 8, limited_each.max(MIB)), app("others", 8, (8.0 * r as f64 * secs / 8.0) as u64)], Some(limit_rules), "limit")?;
        report.limited = windows(&limit, "limited", "others");
    }
    if runs("guarantee") {
        let gold_each = (g as f64 * secs / 2.0) as u64;
        let crowd = app("crowd", 32, (4.0 * g as f64 * secs / 32.0) as u64);
        let gold_rules = rules(&format!("[[class]]\nname = \"gold\"\nguarantee_bytes_per_s = {g}\ndepth_ms = {}\n[[rule]]\nclass = \"gold\"\napp = \"gold\"\n", cfg.depth_ms))?;
        let with = one(cfg, vec![app("gold", 2, gold_each.max(MIB)), crowd.clone()], Some(gold_rules), "guarantee")?;
        let without = one(cfg, vec![app("gold", 2, gold_each.max(MIB)), crowd], None, "no-guarantee")?;
        (report.guaranteed, report.unguaranteed) = (windows(&with, "gold", "crowd"), windows(&without, "gold", "crowd"));
    }
    if runs("share") {
        if unsafe { libc::geteuid() } != 0 {
            return Err(WorkloadError::usage(format!(
                "the share setup runs a second user's processes (uid {SHARE_UID}): run it as root, or leave it out (--setups limit,guarantee)"
            )));
        }
        report.shared = share_run(cfg, true)?;
        report.unshared = share_run(cfg, false)?;
    }
    Ok(report)
}

/// The table `sluice bench qos` prints.
pub fn table(r: &QosReport) -> String {
    let c = &r.config;
    let mb = |x: f64| x / 1e6;
    let mut out = format!("service classes, {} on {}{}, 1 s windows sliding by {SAMPLE_MS} ms (MB/s)\n", c.policy, c.device, if c.direct { " O_DIRECT" } else { "" });
    out += &format!("{:<40} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10}\n", "class", "target", "min", "max", "mean", "windows", "others");
    let row = |name: &str, target: f64, w: &Windows| {
        format!("{name:<40} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8} {:>10.1}\n", mb(target), mb(w.min), mb(w.max), mb(w.mean), w.bytes_per_s.len(), mb(w.others_bytes_per_s))
    };
    let runs = |name: &str| c.setups.iter().any(|s| s == name);
    if runs("limit") {
        out += &row("limited to the rate, beside 8 others", c.rate_bytes_per_s as f64, &r.limited);
    }
    if runs("guarantee") {
        out += &row("guaranteed, beside 32 others", c.guarantee_bytes_per_s as f64, &r.guaranteed);
        out += &row("the same without its class", c.guarantee_bytes_per_s as f64, &r.unguaranteed);
    }
    if runs("limit") {
        let err = |w: &Windows, t: f64| w.bytes_per_s.iter().map(|b| (b - t).abs() / t).fold(0.0, f64::max);
        out += &format!(
            "limited: worst window {:+.1}% off the rate\n",
            100.0 * err(&r.limited, c.rate_bytes_per_s as f64) * if r.limited.max - c.rate_bytes_per_s as f64 >= c.rate_bytes_per_s as f64 - r.limited.min { 1.0 } else { -1.0 }
        );
    }
    if runs("share") {
        out += &format!(
            "\ntwo users while both ran (MB/s): one runs 1 job, the other 4 (4 processes each); then each user's run\n{:<40} {:>8} {:>8} {:>8} {:>10} {:>10} {:>8} {:>12} {:>12}\n",
            "sharing", "1 job", "4 jobs", "ratio", "ratio min", "ratio max", "seconds", "1 job done", "4 jobs done"
        );
        for (name, s) in [("users, then jobs (share = [user, job])", &r.shared), ("none (each job an application)", &r.unshared)] {
            let (lo, hi) = s.ratios.iter().fold((f64::INFINITY, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
            out += &format!(
                "{name:<40} {:>8.1} {:>8.1} {:>8.3} {:>10.3} {:>10.3} {:>8.1} {:>12} {:>12}\n",
                mb(s.one_job),
                mb(s.four_jobs),
                s.one_job / s.four_jobs.max(1e-9),
                if s.ratios.is_empty() { 0.0 } else { lo },
                hi,
                s.span_s,
                format!("{:.2} s", s.one_job_done_s),
                format!("{:.2} s", s.four_jobs_done_s)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_slide_over_the_run_of_the_class() {
        let mut run = RunReport::bare("aioli", 3.0);
        // 10 MB/s for 2 s, then done; the other at 50 MB/s throughout.
        run.samples = (0..=30).map(|i| (i as f64 * 0.1, vec![("a".to_string(), (i.min(20) * 1_000_000) as u64), ("b".to_string(), (i * 5_000_000) as u64)])).collect();
        let w = windows(&run, "a", "b");
        assert!(!w.bytes_per_s.is_empty());
        assert!(w.bytes_per_s.iter().all(|&b| (b - 10e6).abs() < 1.0), "{:?}", w.bytes_per_s);
        assert!((w.others_bytes_per_s - 50e6).abs() < 1.0, "{}", w.others_bytes_per_s);
    }
}
