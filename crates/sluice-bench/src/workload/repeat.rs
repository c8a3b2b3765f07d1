//! `--runs N` on the workloads: the same scenario N times, the modes'
//! order changing from run to run as the matrix's does
//! (`matrix::run_order`), and a summary a verdict "in N of N runs" can be
//! read from: each mode's makespans, and the judged policy against every
//! other mode run by run (its speed-up in the same run, the worst of
//! them, and in how many runs it was the slower).

use serde::Serialize;

use super::report::Report;

/// Most runs one command may ask for.
pub const RUNS_MAX: u32 = 100;

/// One mode's makespans over the runs.
#[derive(Clone, Debug, Serialize)]
pub struct ModeRuns {
    pub mode: String,
    /// In run order (s).
    pub makespan_s: Vec<f64>,
    pub min_s: f64,
    pub median_s: f64,
    pub max_s: f64,
}

/// The judged policy against one other mode, run by run.
#[derive(Clone, Debug, Serialize)]
pub struct Versus {
    pub other: String,
    /// The other's makespan over the judged policy's, each run (> 1: the
    /// judged policy was faster).
    pub speedup: Vec<f64>,
    pub speedup_min: f64,
    pub speedup_median: f64,
    /// Runs where the judged policy was the slower.
    pub runs_slower: usize,
}

/// Every run, and the summary.
#[derive(Clone, Debug, Serialize)]
pub struct Repeated {
    pub judged: String,
    pub runs: Vec<Report>,
    pub modes: Vec<ModeRuns>,
    pub versus: Vec<Versus>,
}

/// The makespan of `mode` in each report (the first scenario group).
fn makespans(runs: &[Report], mode: &str) -> Vec<f64> {
    runs.iter().filter_map(|r| r.runs.iter().find(|x| x.mode == mode).map(|x| x.makespan_s)).collect()
}

/// Summarise `runs` (each with every mode once), judging `judged`.
pub fn summarise(runs: Vec<Report>, judged: &str) -> Repeated {
    let modes: Vec<String> = runs.first().map(|r| r.runs.iter().map(|x| x.mode.clone()).collect()).unwrap_or_default();
    let mut sorted_modes = modes.clone();
    sorted_modes.sort();
    let mode_runs = sorted_modes
        .iter()
        .map(|m| {
            let v = makespans(&runs, m);
            let (min_s, max_s) = (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max));
            ModeRuns { mode: m.clone(), median_s: crate::median(&v), makespan_s: v, min_s, max_s }
        })
        .collect();
    let mine = makespans(&runs, judged);
    let versus = sorted_modes
        .iter()
        .filter(|m| *m != judged)
        .map(|m| {
            let speedup: Vec<f64> = makespans(&runs, m).iter().zip(&mine).map(|(o, j)| o / j.max(1e-12)).collect();
            Versus {
                other: m.clone(),
                speedup_min: speedup.iter().copied().fold(f64::INFINITY, f64::min),
                speedup_median: crate::median(&speedup),
                runs_slower: speedup.iter().filter(|&&s| s < 1.0).count(),
                speedup,
            }
        })
        .collect();
    Repeated { judged: judged.to_string(), runs, modes: mode_runs, versus }
}

/// The summary as a table.
pub fn table(r: &Repeated) -> String {
    let n = r.runs.len();
    let mut out = format!("{n} runs, the modes' order changing from run to run\n{:<14} {:>10} {:>10} {:>10}\n", "mode", "min s", "median s", "max s");
    for m in &r.modes {
        out += &format!("{:<14} {:>10.3} {:>10.3} {:>10.3}\n", m.mode, m.min_s, m.median_s, m.max_s);
    }
    for v in &r.versus {
        out += &format!(
            "{} against {}: {:.2}x faster at the median, {:.2}x in its worst run, slower in {} of {n} runs\n",
            r.judged, v.other, v.speedup_median, v.speedup_min, v.runs_slower
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::report::RunReport;

    fn report(times: &[(&str, f64)]) -> Report {
        let runs = times.iter().map(|&(mode, t)| RunReport::bare(mode, t)).collect();
        Report { scenario: "s".into(), device: "hdd7200".into(), direct_io: true, caches_dropped: true, scale: 1.0, via: "library".into(), durable: false, runs }
    }

    #[test]
    fn speedups_are_paired_run_by_run() {
        let runs = vec![report(&[("fifo", 20.0), ("aioli", 0.5)]), report(&[("aioli", 2.0), ("fifo", 1.0)]), report(&[("fifo", 10.0), ("aioli", 1.0)])];
        let r = summarise(runs, "aioli");
        assert_eq!(r.modes.iter().map(|m| m.mode.as_str()).collect::<Vec<_>>(), ["aioli", "fifo"]);
        assert_eq!(r.modes[1].makespan_s, [20.0, 1.0, 10.0]);
        assert_eq!((r.modes[1].min_s, r.modes[1].median_s, r.modes[1].max_s), (1.0, 10.0, 20.0));
        let v = &r.versus[0];
        assert_eq!(v.speedup, [40.0, 0.5, 10.0]);
        assert_eq!((v.speedup_min, v.speedup_median, v.runs_slower), (0.5, 10.0, 1));
        assert!(table(&r).contains("slower in 1 of 3 runs"), "{}", table(&r));
    }
}
