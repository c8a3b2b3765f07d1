//! `sluice sim --validate`: does `sluice what-if` predict a policy before
//! anyone runs it? Each workload runs for real under every policy, `runs`
//! times, each started server writing its live trace. Then every trace is
//! replayed by what-if with its default options (the device the trace
//! names or the model learned from it, and the host profile measured once
//! by `sluice calibrate --host`), and each prediction of each policy is
//! compared with the median of that policy's real runs. Nothing of the
//! predicted run goes into its prediction: a trace of fifo predicts aioli,
//! and a trace of aioli predicts aioli only as well as another run of it
//! would.
//!
//! The real figure is the one what-if reports for a recording: first
//! arrival to last answer over all applications, read from each real run's
//! own trace, so that prediction and real run are timed alike.
//!
//! The report also measures the floor under any prediction: each real run
//! of a policy held against the median of that policy's other runs
//! (`Spread`). Where the runs of one policy do not agree within `TARGET`
//! among themselves, no prediction made before them can be sure to.

use std::path::PathBuf;

use serde::Serialize;
use sluice_server::DeviceKind;
use sluice_sim::whatif::{self, Device, Options, Recording};

use crate::median;
pub use crate::validate::Workload;
use crate::workload::pattern::Dir;
use crate::workload::runner::{self, RunConfig};
use crate::workload::scenario::{self, Scenario};

/// The error the issue accepts for a prediction.
pub const TARGET: f64 = 0.10;

/// The protocol's workloads, sized to take seconds here at `scale` 1: the
/// seed's decomposition (32 processes) with 4 KiB and 64 KiB pieces on
/// this disk with O_DIRECT, and on the emulated disk interference (16
/// readers and a sequential one) and mix10.
pub fn workloads(scale: f64) -> Vec<Workload> {
    let k = 1024;
    let real = |name: &str, sc: Scenario| Workload { name: name.into(), scenario: sc, device: DeviceKind::Real, direct_io: true };
    let hdd = |name: &str, sc: Scenario| Workload { name: name.into(), scenario: sc, device: DeviceKind::Hdd7200, direct_io: false };
    vec![
        real("decomposition 4 KiB x 32 (O_DIRECT)", scenario::decomposition(32, 4 * k, Dir::Read, scale / 32.0)),
        real("decomposition 64 KiB x 32 (O_DIRECT)", scenario::decomposition(32, 64 * k, Dir::Read, scale / 16.0)),
        hdd("interference (hdd7200)", scenario::interference(16, 32 * k, scale / 64.0)),
        hdd("mix10 (hdd7200)", scenario::mix10(scale / 64.0)),
    ]
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    pub workloads: Vec<Workload>,
    pub policies: Vec<String>,
    /// Scratch directory for the real runs and their traces.
    pub root: PathBuf,
    /// The `sluice` executable the bench starts its workers with.
    pub exe: PathBuf,
    /// Real runs per workload (each under every policy).
    pub runs: u32,
    /// The host profile the predictions use (`sluice calibrate --host`):
    /// its host, and its disk for the traces on the real device.
    pub host: Option<crate::host::HostProfile>,
    pub progress: bool,
}

/// The predictions of one policy from the traces of one policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub workload: String,
    /// The policy the traces recorded, and the one predicted.
    pub from: String,
    pub to: String,
    /// One prediction per trace, in run order (seconds).
    pub predicted_s: Vec<f64>,
    /// The predicted policy's real runs, and their median (seconds).
    pub real_s: Vec<f64>,
    pub real_median_s: f64,
    /// Each prediction's error against the median, (predicted - real) / real.
    pub errors: Vec<f64>,
    /// Predictions within `TARGET`.
    pub within: usize,
}

/// How well the real runs of one policy predict each other: the noise
/// floor of its rows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spread {
    pub workload: String,
    pub policy: String,
    /// The real runs, in run order (seconds).
    pub real_s: Vec<f64>,
    /// Each run against the median of the others, (run - median) /
    /// median; empty with a single run.
    pub errors: Vec<f64>,
    /// Runs within `TARGET` of the median of the others.
    pub within: usize,
}

/// The whole report (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub target: f64,
    pub rows: Vec<Row>,
    /// The real runs of each (workload, policy) against each other.
    pub spread: Vec<Spread>,
    /// What-if's device line for each workload (the first trace's).
    pub devices: Vec<(String, String)>,
}

/// The rows of one workload: for every pair of policies, each trace of
/// `from` predicting `to` against the median of `to`'s real runs.
/// `real[p][r]` is policy `p`'s real figure in run `r`, `predicted[p][r][q]`
/// what run `r`'s trace of `p` predicts for `q`.
pub fn rows(workload: &str, policies: &[String], real: &[Vec<f64>], predicted: &[Vec<Vec<f64>>]) -> Vec<Row> {
    let mut out = Vec::new();
    for (f, from) in policies.iter().enumerate() {
        for (t, to) in policies.iter().enumerate() {
            let real_median_s = median(&real[t]);
            let predicted_s: Vec<f64> = predicted[f].iter().map(|by| by[t]).collect();
            let errors: Vec<f64> = predicted_s.iter().map(|p| (p - real_median_s) / real_median_s).collect();
            let within = errors.iter().filter(|e| e.abs() <= TARGET).count();
            out.push(Row { workload: workload.into(), from: from.clone(), to: to.clone(), predicted_s, real_s: real[t].clone(), real_median_s, errors, within });
        }
    }
    out
}

/// The spread of one workload's real runs, a `Spread` per policy:
/// `real[p][r]` as for `rows`.
pub fn spread(workload: &str, policies: &[String], real: &[Vec<f64>]) -> Vec<Spread> {
    let spread_of = |policy: &String, runs: &Vec<f64>| {
        let errors: Vec<f64> = if runs.len() < 2 {
            Vec::new()
        } else {
            (0..runs.len())
                .map(|i| {
                    let others: Vec<f64> = runs.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, &x)| x).collect();
                    let m = median(&others);
                    (runs[i] - m) / m
                })
                .collect()
        };
        let within = errors.iter().filter(|e| e.abs() <= TARGET).count();
        Spread { workload: workload.into(), policy: policy.clone(), real_s: runs.clone(), errors, within }
    };
    policies.iter().zip(real).map(|(p, runs)| spread_of(p, runs)).collect()
}

/// Run the protocol.
pub fn run(cfg: &Config) -> Result<Report, String> {
    let (mut rows_out, mut spread_out, mut devices) = (Vec::new(), Vec::new(), Vec::new());
    let opts = cfg.host.as_ref().map_or(Options { device: Device::Auto, host: None, disk: None }, crate::host::HostProfile::whatif_options);
    for w in &cfg.workloads {
        let dir = cfg.root.join(w.name.replace(|c: char| !c.is_ascii_alphanumeric(), "-"));
        // real[p][r], predicted[p][r][q]
        let mut real = vec![Vec::new(); cfg.policies.len()];
        let mut predicted = vec![Vec::new(); cfg.policies.len()];
        for r in 0..cfg.runs.max(1) {
            if cfg.progress {
                eprintln!("validate: {} for real, run {} of {} ({})", w.name, r + 1, cfg.runs.max(1), cfg.policies.join(", "));
            }
            let traces = dir.join(format!("traces-{r}"));
            // As `sluice bench` runs them: write leases on, and writers
            // that went through the page cache fsync before they finish.
            let run_cfg = RunConfig {
                direct_io: w.direct_io,
                durable: true,
                progress: cfg.progress,
                trace_dir: Some(traces.clone()),
                ..RunConfig::started(w.scenario.clone(), cfg.policies.clone(), w.device, dir.join("data"), cfg.exe.clone())
            };
            let result = runner::run(&run_cfg).map_err(|e| e.to_string());
            let _ = std::fs::remove_dir_all(&run_cfg.root);
            result?;
            for (p, policy) in cfg.policies.iter().enumerate() {
                let path = traces.join(format!("{policy}.json"));
                let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                let rec = Recording::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
                let w_if = whatif::what_if(&rec, &cfg.policies, opts).map_err(|e| format!("{}: {e}", path.display()))?;
                let span = |name: &str| w_if.makespan_s.iter().find(|(n, _)| n == name).map(|x| x.1).ok_or_else(|| format!("what-if gave no {name}"));
                real[p].push(span("recorded")?);
                predicted[p].push(cfg.policies.iter().map(|q| span(q)).collect::<Result<Vec<_>, _>>()?);
                if r == 0 && p == 0 {
                    devices.push((w.name.clone(), w_if.device.clone()));
                }
            }
            let _ = std::fs::remove_dir_all(&traces);
        }
        rows_out.extend(rows(&w.name, &cfg.policies, &real, &predicted));
        spread_out.extend(spread(&w.name, &cfg.policies, &real));
    }
    Ok(Report { target: TARGET, rows: rows_out, spread: spread_out, devices })
}

/// The report as a table: a row per (workload, from, to).
pub fn table(r: &Report) -> String {
    let mut out = format!("{:<38} {:<6} {:<6} {:>10}  {:<28} {}\n", "workload", "trace", "policy", "real (s)", "predicted (s)", "error");
    for row in &r.rows {
        let pred = row.predicted_s.iter().map(|p| format!("{p:.3}")).collect::<Vec<_>>().join(" ");
        let err = row.errors.iter().map(|e| format!("{:+.1}%", e * 100.0)).collect::<Vec<_>>().join(" ");
        out += &format!("{:<38} {:<6} {:<6} {:>10.3}  {:<28} {}\n", row.workload, row.from, row.to, row.real_median_s, pred, err);
    }
    let (n, within) = r.rows.iter().fold((0, 0), |(n, w), row| (n + row.errors.len(), w + row.within));
    out += &format!("{within} of {n} predictions within {:.0}% of the median of the predicted policy's real runs\n", r.target * 100.0);
    if r.spread.iter().any(|s| !s.errors.is_empty()) {
        out += &format!("\nthe real runs against the median of the others (the floor under any prediction):\n{:<38} {:<6} {:<28} {}\n", "workload", "policy", "real (s)", "error");
        for s in &r.spread {
            let real = s.real_s.iter().map(|x| format!("{x:.3}")).collect::<Vec<_>>().join(" ");
            let err = s.errors.iter().map(|e| format!("{:+.1}%", e * 100.0)).collect::<Vec<_>>().join(" ");
            out += &format!("{:<38} {:<6} {:<28} {}\n", s.workload, s.policy, real, err);
        }
        let (n, within) = r.spread.iter().fold((0, 0), |(n, w), s| (n + s.errors.len(), w + s.within));
        out += &format!("{within} of {n} real runs within {:.0}% of the median of their policy's other runs\n", r.target * 100.0);
    }
    for (w, d) in &r.devices {
        out += &format!("{w}: {d}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_trace_predicts_every_policy_against_the_median_of_its_real_runs() {
        let policies = vec!["fifo".to_string(), "aioli".to_string()];
        // Three runs: fifo 10, 12, 11 s (median 11), aioli 1.0, 1.2, 1.1.
        let real = vec![vec![10.0, 12.0, 11.0], vec![1.0, 1.2, 1.1]];
        // Run r's fifo trace predicts (fifo, aioli); so does its aioli one.
        let predicted = vec![vec![vec![11.0, 1.1], vec![12.2, 1.0], vec![9.0, 1.32]], vec![vec![11.55, 1.1], vec![11.0, 1.2], vec![11.0, 1.0]]];
        let rows = rows("w", &policies, &real, &predicted);
        assert_eq!(rows.len(), 4, "fifo and aioli from traces of each");
        let find = |f: &str, t: &str| rows.iter().find(|r| r.from == f && r.to == t).unwrap();
        let ff = find("fifo", "fifo");
        assert_eq!((ff.real_median_s, ff.predicted_s.clone()), (11.0, vec![11.0, 12.2, 9.0]));
        let errs: Vec<i64> = ff.errors.iter().map(|e| (e * 1000.0).round() as i64).collect();
        assert_eq!(errs, [0, 109, -182]);
        assert_eq!(ff.within, 1, "+10.9% and -18.2% are over 10%");
        let fa = find("fifo", "aioli");
        assert_eq!((fa.real_median_s, fa.within), (1.1, 2), "1.32 is 20% over 1.1");
        let af = find("aioli", "fifo");
        assert_eq!(af.within, 3, "+5%, 0, 0");
        assert_eq!(find("aioli", "aioli").within, 3, "0, +9.1%, -9.1%");
        let t = table(&Report { target: TARGET, rows, spread: spread("w", &policies, &real), devices: vec![("w".into(), "the emulated 7200 rpm disk".into())] });
        assert!(t.contains("9 of 12 predictions within 10%"), "{t}");
        assert!(t.contains("2 of 6 real runs within 10% of the median of their policy's other runs"), "{t}");
    }

    #[test]
    fn each_real_run_is_held_against_the_median_of_the_others() {
        let policies = vec!["fifo".to_string(), "aioli".to_string()];
        // fifo: 10 against 11.5 (-13.0%), 12 against 10.5 (+14.3%), 11
        // against 11 (0); aioli: 1.0 against 1.15, 1.2 against 1.05, 1.1
        // against 1.1.
        let s = spread("w", &policies, &[vec![10.0, 12.0, 11.0], vec![1.0, 1.2, 1.1]]);
        let permille = |e: &[f64]| e.iter().map(|e| (e * 1000.0).round() as i64).collect::<Vec<_>>();
        assert_eq!(permille(&s[0].errors), [-130, 143, 0]);
        assert_eq!(permille(&s[1].errors), [-130, 143, 0]);
        assert_eq!((s[0].within, s[1].within), (1, 1));
        // One run has no others: nothing to hold it against.
        let one = spread("w", &policies[..1], &[vec![10.0]]);
        assert!(one[0].errors.is_empty() && one[0].within == 0);
        let t = table(&Report { target: TARGET, rows: Vec::new(), spread: one, devices: Vec::new() });
        assert!(!t.contains("real runs within"), "no floor from single runs: {t}");
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }
}
