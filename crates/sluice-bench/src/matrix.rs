//! `sluice bench matrix`: the comparison the default policy is
//! judged by, in one command.
//!
//! Rows: the seed's decomposition (4 KiB, 64 KiB, 1 MiB pieces x 8, 32,
//! 128 processes) on the real disk with O_DIRECT and through the page
//! cache; interference (the decomposition plus a `cat`); the seed's ten
//! applications on the emulated 7200 rpm disk; and the simulator's
//! benchmark scenario. Each row runs `direct` (no service; real device
//! only), `fifo`, `fifo-merge` and the default policy, and reports the
//! default's makespan over the best of fifo and fifo-merge (the
//! target: at most 1.05) and, on the real device, its speed-up over
//! direct POSIX. `quick` runs a smaller matrix at smaller sizes (under
//! three minutes on two cores). `write` runs the decomposition rows as
//! writes instead (the same pieces, each process writing its own), and
//! only those: the other workloads have their reads built in.
//!
//! Each row runs `runs` times (default 3), the modes' order rotating every
//! second run and reversed in between (each pair of runs puts every mode
//! before every other once), and is judged by each mode's median makespan: on
//! a shared machine two runs of one mode differ by tens of percent, and a
//! single run judged rows by that noise. The larger pieces get larger
//! files, so that no row lasts only a few hundredths of a second.
//!
//! Two further verdicts say how far a ratio over the target is the
//! machine's noise. **Judged alike**: the same rule applied to each of
//! fifo, fifo-merge and the default in turn, each against the better of
//! the other two; a mode that behaves like another is over 1.05 by chance
//! in about as many rows as the default (the better of two noisy medians
//! is the luckier one). **Paired**: a run runs every mode back to back,
//! so the default's makespan over the best baseline's *in the same run*
//! cancels what drifts between runs (a disk that gets faster over
//! minutes), and a one-sided sign test over the runs gives the chance of
//! the default being slower in that many runs if it were no slower.
//!
//! ```no_run
//! let cfg = sluice_bench::matrix::MatrixConfig::new(true, "/usr/bin/sluice".into(), "/var/tmp/m".into());
//! let report = sluice_bench::matrix::run(&cfg).unwrap();
//! print!("{}", sluice_bench::matrix::table(&report));
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;
use sluice_server::DeviceKind;

use crate::median;
use crate::workload::pattern::Dir;
use crate::workload::runner::{run as run_workload, RunConfig, Via};
use crate::workload::scenario::{self, Scenario};
use crate::workload::WorkloadError;

/// The policy `sluice serve` uses unless told otherwise.
pub const DEFAULT_POLICY: &str = "aioli";
/// The baselines the default is held against.
const BASELINES: [&str; 2] = ["fifo", "fifo-merge"];
/// The bound on the default's makespan over the best baseline.
pub const DEFAULT_RATIO_MAX: f64 = 1.05;

/// What to run.
#[derive(Clone, Debug)]
pub struct MatrixConfig {
    pub quick: bool,
    /// The `sluice` executable that workers are started from.
    pub exe: PathBuf,
    /// Scratch directory (the real device's file system).
    pub root: PathBuf,
    /// The policy judged; `DEFAULT_POLICY` unless told.
    pub default_policy: String,
    /// Runs of every row; modes are judged by their median makespan.
    pub runs: u32,
    /// Only the rows whose workload contains this text.
    pub only: Option<String>,
    /// The decomposition rows as writes, and no other rows.
    pub write: bool,
    /// The started servers grant write leases (`ServerConfig::write_leases`,
    /// the servers' default).
    pub write_leases: bool,
    pub progress: bool,
    /// The interposer library, for the rows through `sluice run` (none
    /// without it).
    pub preload: Option<PathBuf>,
}

/// Runs per row unless told.
pub const RUNS_DEFAULT: u32 = 3;
/// At most this many runs per row (the full matrix takes minutes a run).
pub const RUNS_MAX: u32 = 15;

impl MatrixConfig {
    pub fn new(quick: bool, exe: PathBuf, root: PathBuf) -> MatrixConfig {
        MatrixConfig { quick, exe, root, default_policy: DEFAULT_POLICY.into(), runs: RUNS_DEFAULT, only: None, write: false, write_leases: true, progress: true, preload: None }
    }
}

/// One row: a workload on a device, each mode's makespan.
#[derive(Clone, Debug, Serialize)]
pub struct MatrixRow {
    pub workload: String,
    pub device: String,
    pub direct_io: bool,
    /// Median makespan in seconds per mode (`direct`, `fifo`, `fifo-merge`, the default).
    pub makespan_s: BTreeMap<String, f64>,
    /// Every run's makespan per mode, in run order.
    pub runs_s: BTreeMap<String, Vec<f64>>,
    /// Which of fifo and fifo-merge was faster.
    pub best_baseline: String,
    /// The default's makespan over the best baseline's (target <= 1.05).
    pub default_over_best: f64,
    /// Every run of the default was slower than every run of the best
    /// baseline: a loss the runs' own spread does not cover.
    pub slower_in_every_run: bool,
    /// Run by run: the default's makespan over the best baseline's in
    /// the same run, the median of those ratios, how many runs the
    /// default was slower, and the one-sided sign test's p-value for that
    /// many (the chance of at least that many if the default were no
    /// slower). Absent for a single run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paired: Option<Paired>,
    /// The target's rule applied to each of fifo, fifo-merge and the
    /// default alike: its median makespan over the better of the other
    /// two's (the noise floor of the verdict; module documentation).
    pub judged_alike: BTreeMap<String, f64>,
    /// Direct POSIX's makespan over the default's (> 1: the default wins).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speedup_over_direct: Option<f64>,
    /// mix10: applications slower under the default than under fifo.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub apps_slower_than_fifo: Option<usize>,
}

/// The default against the best baseline, run by run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Paired {
    pub ratio_median: f64,
    pub runs_slower: usize,
    pub runs: usize,
    pub p_slower: f64,
}

/// A row whose paired sign test gives at most this p-value is a loss
/// that the runs' noise does not explain (marked `*`).
pub const PAIRED_P_MAX: f64 = 0.05;

/// The whole matrix.
#[derive(Clone, Debug, Serialize)]
pub struct MatrixReport {
    pub quick: bool,
    /// The decomposition rows were writes (`MatrixConfig::write`).
    pub write: bool,
    /// The servers granted write leases (`MatrixConfig::write_leases`).
    pub write_leases: bool,
    pub default_policy: String,
    pub runs: u32,
    pub rows: Vec<MatrixRow>,
    /// Rows whose `default_over_best` exceeds `DEFAULT_RATIO_MAX`.
    pub rows_over_target: usize,
    /// Of those, the rows `slower_in_every_run`.
    pub rows_over_in_every_run: usize,
    /// Rows over 1.05 for each of fifo, fifo-merge and the default when
    /// each is judged alike (`rows[].judged_alike`).
    pub rows_over_if_judged_alike: BTreeMap<String, usize>,
    /// Rows where the paired sign test finds the default slower
    /// (`p_slower` at most `PAIRED_P_MAX`).
    pub rows_slower_paired: usize,
}

/// One workload row to run.
struct Cell {
    label: String,
    scenario: Scenario,
    device: DeviceKind,
    direct_io: bool,
    scale: f64,
    /// The path the processes take to the servers.
    via: Via,
}

/// The file for `g`-byte pieces, as a fraction of the seed's 4 GiB: 128
/// MiB of 4 KiB pieces already take 0.3-1 s here, while 64 KiB and 1 MiB
/// pieces read that in under 0.1 s, so they get four times as much (a
/// quarter of that in the quick matrix).
fn decomposition_scale(quick: bool, g: u64) -> f64 {
    let full = if g >= 64 << 10 { 1.0 / 8.0 } else { 1.0 / 32.0 };
    if quick {
        full / 4.0
    } else {
        full
    }
}

/// The shared-file strided rows (4 KiB pieces, 32 processes, O_DIRECT)
/// through the two paths unmodified programs take: a real FUSE mount of
/// each started server, and the interposer (`preload`, when the library
/// was found); on the real disk and, through the mount, on the emulated
/// disk (16 MiB: fifo alone takes about 21 s there; 4 MiB when quick).
fn unmodified_cells(quick: bool, op: Dir, what: &str, preload: Option<&PathBuf>) -> Vec<Cell> {
    let g = 4u64 << 10;
    let scale = decomposition_scale(quick, g);
    let mut vias = vec![Via::Mount];
    vias.extend(preload.map(|lib| Via::Run(lib.clone())));
    let mut out: Vec<Cell> = vias
        .into_iter()
        .map(|via| Cell {
            label: format!("{what} 4K x32 via {}", via.name()),
            scenario: scenario::decomposition(32, g, op, scale),
            device: DeviceKind::Real,
            direct_io: true,
            scale,
            via,
        })
        .collect();
    let hscale = if quick { 1.0 / 1024.0 } else { 1.0 / 256.0 };
    out.push(Cell {
        label: format!("{what} 4K x32 via mount (hdd7200)"),
        scenario: scenario::decomposition(32, g, op, hscale),
        device: DeviceKind::Hdd7200,
        direct_io: true,
        scale: hscale,
        via: Via::Mount,
    });
    out
}

fn cells(quick: bool, write: bool, preload: Option<&PathBuf>) -> Vec<Cell> {
    let procs: &[u32] = if quick { &[8, 32] } else { &[8, 32, 128] };
    let (op, what) = if write { (Dir::Write, "decomposition write") } else { (Dir::Read, "decomposition") };
    let mut out = Vec::new();
    for direct_io in [true, false] {
        for g in [4u64 << 10, 64 << 10, 1 << 20] {
            let scale = decomposition_scale(quick, g);
            for &p in procs {
                // The quick matrix keeps the page-cache rows at 32 processes.
                if quick && !direct_io && p != 32 {
                    continue;
                }
                let label = format!("{what} {}K x{p}", g >> 10);
                out.push(Cell { label, scenario: scenario::decomposition(p, g, op, scale), device: DeviceKind::Real, direct_io, scale, via: Via::Library });
            }
        }
    }
    out.extend(unmodified_cells(quick, op, what, preload));
    if write {
        return out;
    }
    let (ip, iscale) = if quick { (8, 1.0 / 64.0) } else { (32, 1.0 / 32.0) };
    out.push(Cell {
        label: format!("interference 8K x{ip}"),
        scenario: scenario::interference(ip, 8 << 10, iscale),
        device: DeviceKind::Real,
        direct_io: true,
        scale: iscale,
        via: Via::Library,
    });
    let mscale = if quick { 1.0 / 256.0 } else { 1.0 / 64.0 };
    out.push(Cell { label: "mix10".into(), scenario: scenario::mix10(mscale), device: DeviceKind::Hdd7200, direct_io: false, scale: mscale, via: Via::Library });
    out
}

fn modes(cfg: &MatrixConfig, device: DeviceKind) -> Vec<String> {
    let direct = (device == DeviceKind::Real).then_some("direct");
    direct.into_iter().chain(BASELINES).chain([cfg.default_policy.as_str()]).map(String::from).collect()
}

/// Judge one row from its makespans (and, for mix10, per-app times).
fn judge(cfg: &MatrixConfig, label: String, device: DeviceKind, direct_io: bool, runs_s: BTreeMap<String, Vec<f64>>, slower: Option<usize>) -> MatrixRow {
    let makespan_s: BTreeMap<String, f64> = runs_s.iter().map(|(m, v)| (m.clone(), median(v))).collect();
    let (best_baseline, best) =
        BASELINES.iter().filter_map(|b| makespan_s.get(*b).map(|&m| (b.to_string(), m))).fold((String::new(), f64::MAX), |a, b| if b.1 < a.1 { b } else { a });
    let default = makespan_s.get(&cfg.default_policy).copied().unwrap_or(f64::NAN);
    let runs = |m: &str| runs_s.get(m).map(Vec::as_slice).unwrap_or_default();
    let fastest_default = runs(&cfg.default_policy).iter().copied().fold(f64::INFINITY, f64::min);
    let slowest_best = runs(&best_baseline).iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let slower_in_every_run = !runs(&cfg.default_policy).is_empty() && fastest_default > slowest_best;
    let paired = paired(runs(&cfg.default_policy), runs(&best_baseline));
    let judged_alike = judged_alike(&makespan_s, &cfg.default_policy);
    let device = match device {
        DeviceKind::Real => "real",
        DeviceKind::Hdd7200 => "hdd7200",
        DeviceKind::Null => "null",
    };
    MatrixRow {
        workload: label,
        device: device.into(),
        direct_io,
        speedup_over_direct: makespan_s.get("direct").map(|d| d / default),
        default_over_best: default / best,
        slower_in_every_run,
        paired,
        judged_alike,
        best_baseline,
        makespan_s,
        runs_s,
        apps_slower_than_fifo: slower,
    }
}

/// The default's runs against the best baseline's, pair by pair (run
/// `i` of each); `None` unless both have the same two or more runs.
fn paired(default: &[f64], best: &[f64]) -> Option<Paired> {
    if default.len() != best.len() || default.len() < 2 {
        return None;
    }
    let ratios: Vec<f64> = default.iter().zip(best).map(|(d, b)| d / b).collect();
    let runs_slower = ratios.iter().filter(|&&r| r > 1.0).count();
    Some(Paired { ratio_median: median(&ratios), runs_slower, runs: ratios.len(), p_slower: sign_test_p(runs_slower, ratios.len()) })
}

/// The chance of at least `k` heads in `n` fair coin tosses: the
/// one-sided sign test's p-value.
fn sign_test_p(k: usize, n: usize) -> f64 {
    let mut choose = 1.0f64;
    let mut tail = 0.0f64;
    for j in 0..=n {
        if j >= k {
            tail += choose;
        }
        choose = choose * (n - j) as f64 / (j + 1) as f64;
    }
    tail / 2f64.powi(n as i32)
}

/// Each of the baselines and the default judged by the target's rule
/// against the better of the other two (`MatrixRow::judged_alike`).
fn judged_alike(makespan_s: &BTreeMap<String, f64>, default: &str) -> BTreeMap<String, f64> {
    let judged: Vec<&str> = BASELINES.iter().copied().chain([default]).collect();
    judged
        .iter()
        .filter_map(|&m| {
            let own = *makespan_s.get(m)?;
            let best = judged.iter().filter(|&&o| o != m).filter_map(|o| makespan_s.get(*o)).copied().fold(f64::INFINITY, f64::min);
            best.is_finite().then(|| (m.to_string(), own / best))
        })
        .collect()
}

/// The modes' order in run `r` of a row: rotated by `r / 2`, and every
/// odd run the even run before it reversed. Over each pair of runs every
/// mode runs before every other once and every mode's positions sum to
/// the same, so a drift within a run (the first mode after the files
/// were made runs about 2% faster, averaged over four 9-run
/// matrices of 2026-12-01 and 2026-12-02) favours no mode over a whole number of pairs. Plain
/// rotation ran the default after fifo-merge in 7 of 9 runs.
pub fn run_order(modes: &[String], r: usize) -> Vec<String> {
    let mut m = modes.to_vec();
    let n = m.len().max(1);
    m.rotate_left((r / 2) % n);
    if r % 2 == 1 {
        m.reverse();
    }
    m
}

fn run_cell(cfg: &MatrixConfig, cell: Cell, index: usize) -> Result<MatrixRow, WorkloadError> {
    let root = cfg.root.join(format!("cell-{index}"));
    let mut rc = RunConfig {
        direct_io: cell.direct_io,
        write_leases: cfg.write_leases,
        scale: cell.scale,
        via: cell.via,
        durable: true,
        ..RunConfig::started(cell.scenario, Vec::new(), cell.device, root, cfg.exe.clone())
    };
    let modes = modes(cfg, cell.device);
    let mut runs_s: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    // Per mode, per application: every run's completion time.
    let mut apps_s: BTreeMap<String, Vec<Vec<f64>>> = BTreeMap::new();
    // The files are made by the first run and kept by the others.
    let mut result = Ok(());
    for r in 0..cfg.runs.max(1) as usize {
        rc.modes = run_order(&modes, r);
        match run_workload(&rc) {
            Ok(report) => {
                for run in report.runs {
                    runs_s.entry(run.mode.clone()).or_default().push(run.makespan_s);
                    let per_app = apps_s.entry(run.mode).or_insert_with(|| vec![Vec::new(); run.apps.len()]);
                    per_app.iter_mut().zip(&run.apps).for_each(|(v, a)| v.push(a.completion_s));
                }
            }
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&rc.root);
    result?;
    let slower = (cell.device == DeviceKind::Hdd7200).then(|| {
        let by_mode = |m: &str| apps_s.get(m).map(|v| v.iter().map(|t| median(t)).collect::<Vec<_>>()).unwrap_or_default();
        by_mode(&cfg.default_policy).iter().zip(by_mode("fifo")).filter(|(d, f)| *d > f).count()
    });
    Ok(judge(cfg, cell.label, cell.device, cell.direct_io, runs_s, slower))
}

/// The simulator's benchmark scenario (SSD servers) under each policy.
fn sim_row(cfg: &MatrixConfig) -> Result<MatrixRow, WorkloadError> {
    let (procs, requests) = if cfg.quick { (1_000, 50) } else { (10_000, 200) };
    let sc = sluice_sim::bench_scenario(procs, requests);
    let modes: Vec<String> = BASELINES.iter().map(|s| s.to_string()).chain([cfg.default_policy.clone()]).collect();
    let opts = sluice_sim::RunOptions { modes, seed: Some(1), scale: None, trace: false, jobs: 1 };
    let (report, _) = sluice_sim::run(&sc, &opts).map_err(|e| WorkloadError::usage(format!("sim: {e}")))?;
    // Deterministic: one run says it all.
    let runs_s = report.runs.iter().map(|r| (r.mode.clone(), vec![r.makespan_s])).collect();
    let mut row = judge(cfg, format!("sim --bench ({procs} procs)"), DeviceKind::Real, false, runs_s, None);
    row.device = "sim".into();
    Ok(row)
}

/// Run every row. See the module documentation.
pub fn run(cfg: &MatrixConfig) -> Result<MatrixReport, WorkloadError> {
    let wanted = |label: &str| cfg.only.as_deref().is_none_or(|o| label.contains(o));
    let cells: Vec<Cell> = cells(cfg.quick, cfg.write, cfg.preload.as_ref()).into_iter().filter(|c| wanted(&c.label)).collect();
    let sim = !cfg.write && wanted("sim --bench");
    if cells.is_empty() && !sim {
        return Err(WorkloadError::usage(format!("no row's workload contains {:?}", cfg.only.as_deref().unwrap_or(""))));
    }
    std::fs::create_dir_all(&cfg.root).map_err(|e| WorkloadError::io(format!("create {}", cfg.root.display()), e))?;
    let total = cells.len() + usize::from(sim);
    let mut rows = Vec::with_capacity(total);
    for (i, cell) in cells.into_iter().enumerate() {
        if cfg.progress {
            eprintln!("matrix: [{}/{total}] {}{}", i + 1, cell.label, if cell.direct_io { " O_DIRECT" } else { "" });
        }
        rows.push(run_cell(cfg, cell, i)?);
    }
    if sim {
        if cfg.progress {
            eprintln!("matrix: [{total}/{total}] sim --bench");
        }
        rows.push(sim_row(cfg)?);
    }
    // A ratio that is not a number (a mode missing) counts as over.
    let over = |r: &&MatrixRow| r.default_over_best.is_nan() || r.default_over_best > DEFAULT_RATIO_MAX;
    let rows_over_target = rows.iter().filter(over).count();
    let rows_over_in_every_run = rows.iter().filter(over).filter(|r| r.slower_in_every_run).count();
    let (rows_over_if_judged_alike, rows_slower_paired) = noise_verdicts(&rows);
    Ok(MatrixReport {
        quick: cfg.quick,
        write: cfg.write,
        write_leases: cfg.write_leases,
        default_policy: cfg.default_policy.clone(),
        runs: cfg.runs.max(1),
        rows,
        rows_over_target,
        rows_over_in_every_run,
        rows_over_if_judged_alike,
        rows_slower_paired,
    })
}

/// The report's counts of the judged-alike and paired verdicts.
fn noise_verdicts(rows: &[MatrixRow]) -> (BTreeMap<String, usize>, usize) {
    let mut alike: BTreeMap<String, usize> = BTreeMap::new();
    for row in rows {
        for (m, &ratio) in &row.judged_alike {
            *alike.entry(m.clone()).or_default() += usize::from(ratio > DEFAULT_RATIO_MAX);
        }
    }
    let paired = rows.iter().filter(|r| r.paired.is_some_and(|p| p.p_slower <= PAIRED_P_MAX)).count();
    (alike, paired)
}

/// One line per row: each mode's makespan, then the verdicts.
pub fn table(r: &MatrixReport) -> String {
    let d = &r.default_policy;
    let mut out = format!(
        "{:<30} {:<8} {:>6} {:>9} {:>9} {:>10} {:>9} {:>10} {:>12} {:>10}\n",
        "workload",
        "device",
        "odirect",
        "direct s",
        "fifo s",
        "f-merge s",
        &format!("{d} s"),
        &format!("{d}/best"),
        "paired",
        "vs direct"
    );
    let cell = |row: &MatrixRow, m: &str| row.makespan_s.get(m).map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into());
    for row in &r.rows {
        out += &format!(
            "{:<30} {:<8} {:>6} {:>9} {:>9} {:>10} {:>9} {:>9.2}{:<2} {:>12} {:>9}\n",
            row.workload,
            row.device,
            if row.direct_io { "yes" } else { "no" },
            cell(row, "direct"),
            cell(row, "fifo"),
            cell(row, "fifo-merge"),
            cell(row, d),
            row.default_over_best,
            match (row.default_over_best <= DEFAULT_RATIO_MAX, row.slower_in_every_run) {
                (true, _) => "",
                (false, false) => "!",
                (false, true) => "!!",
            },
            paired_cell(row.paired),
            row.speedup_over_direct.map(|s| format!("{s:.2}x")).unwrap_or_else(|| "-".into()),
        );
        if let Some(n) = row.apps_slower_than_fifo {
            out += &format!("{:<30} {n} application(s) slower under {d} than under fifo\n", "");
        }
    }
    out += &format!("makespans are medians of {} run(s) per row (the simulator's row: one, it is deterministic)\n", r.runs);
    out += &format!("rows where {d} is over {DEFAULT_RATIO_MAX}x the best of fifo and fifo-merge (marked !): {} of {}\n", r.rows_over_target, r.rows.len());
    out += &format!("of them, slower than that baseline in every run (marked !!): {}\n", r.rows_over_in_every_run);
    let alike: Vec<String> = r.rows_over_if_judged_alike.iter().map(|(m, n)| format!("{m} {n}")).collect();
    out += &format!("the same rule applied to each mode against the better of the other two, rows over {DEFAULT_RATIO_MAX}x: {}\n", alike.join(", "));
    if r.runs > 1 {
        out += &format!(
            "paired: {d}'s makespan over that baseline's in the same run (median ratio, runs slower); rows slower by a sign test at p <= {PAIRED_P_MAX} (marked *): {}\n",
            r.rows_slower_paired
        );
    }
    out
}

/// `1.07 6/9`, with `*` where the sign test finds the default slower.
fn paired_cell(p: Option<Paired>) -> String {
    match p {
        None => "-".into(),
        Some(p) => format!("{:.2} {}/{}{}", p.ratio_median, p.runs_slower, p.runs, if p.p_slower <= PAIRED_P_MAX { "*" } else { " " }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> MatrixConfig {
        MatrixConfig::new(true, PathBuf::from("/nonexistent/sluice"), PathBuf::from("/nonexistent"))
    }

    #[test]
    fn a_row_is_judged_against_the_better_baseline_and_direct() {
        let m: BTreeMap<String, f64> = [("direct", 1.0), ("fifo", 4.0), ("fifo-merge", 2.0), ("aioli", 2.1)].map(|(k, v)| (k.to_string(), v)).into();
        let runs: BTreeMap<String, Vec<f64>> = m.into_iter().map(|(k, v)| (k, vec![v])).collect();
        let row = judge(&cfg(), "w".into(), DeviceKind::Real, true, runs, None);
        assert_eq!(row.best_baseline, "fifo-merge");
        assert!((row.default_over_best - 1.05).abs() < 1e-12, "at the target");
        assert!((row.speedup_over_direct.unwrap() - 1.0 / 2.1).abs() < 1e-12);
        let report = MatrixReport {
            quick: true,
            write: false,
            write_leases: false,
            default_policy: "aioli".into(),
            runs: 1,
            rows_over_target: 0,
            rows_over_in_every_run: 0,
            rows_over_if_judged_alike: BTreeMap::new(),
            rows_slower_paired: 0,
            rows: vec![row],
        };
        let t = table(&report);
        assert!(t.contains("1.05 ") && !t.contains("1.05!"), "1.05 is within the target: {t}");
    }

    /// A row over the target is marked `!!` only when every run of the
    /// default was slower than every run of the better baseline.
    #[test]
    fn a_loss_beyond_the_runs_spread_is_marked_apart() {
        let row = |aioli: [f64; 3]| {
            let runs: BTreeMap<String, Vec<f64>> =
                [("fifo", vec![3.0, 3.0, 3.0]), ("fifo-merge", vec![1.0, 1.2, 1.1]), ("aioli", aioli.to_vec())].map(|(k, v)| (k.to_string(), v)).into();
            judge(&cfg(), "w".into(), DeviceKind::Real, true, runs, None)
        };
        // Median 1.3 against 1.1, but one run at 1.15 is within the
        // baseline's 1.0-1.2: over the target, not in every run.
        let (spread, every) = (row([1.3, 1.15, 1.4]), row([1.3, 1.21, 1.4]));
        assert!(spread.default_over_best > DEFAULT_RATIO_MAX && !spread.slower_in_every_run);
        assert!(every.slower_in_every_run, "1.21 is past the baseline's slowest run, 1.2");
        let report = MatrixReport {
            quick: true,
            write: false,
            write_leases: false,
            default_policy: "aioli".into(),
            runs: 3,
            rows_over_target: 2,
            rows_over_in_every_run: 1,
            rows_over_if_judged_alike: BTreeMap::new(),
            rows_slower_paired: 0,
            rows: vec![spread, every],
        };
        let t = table(&report);
        assert_eq!((t.matches("1.18! ").count(), t.matches("1.18!!").count()), (1, 1), "{t}");
        assert!(t.contains("(marked !!): 1"), "{t}");
    }

    #[test]
    fn the_quick_matrix_covers_every_workload_and_the_full_one_128_processes() {
        let lib = PathBuf::from("/lib/libsluice_preload.so");
        let quick = cells(true, false, Some(&lib));
        assert!(["decomposition 4K x32", "decomposition 1024K x8", "interference", "mix10"].iter().all(|w| quick.iter().any(|c| c.label.starts_with(w))));
        assert!(quick.iter().any(|c| !c.direct_io) && quick.iter().any(|c| c.direct_io));
        let full = cells(false, false, Some(&lib));
        assert_eq!(full.iter().filter(|c| c.label.starts_with("decomposition") && c.via == Via::Library).count(), 18, "3 sizes x 3 process counts x 2 I/O modes");
        let unmodified: Vec<(&str, DeviceKind)> = full.iter().filter(|c| c.via != Via::Library).map(|c| (c.label.as_str(), c.device)).collect();
        assert_eq!(
            unmodified,
            [
                ("decomposition 4K x32 via mount", DeviceKind::Real),
                ("decomposition 4K x32 via run", DeviceKind::Real),
                ("decomposition 4K x32 via mount (hdd7200)", DeviceKind::Hdd7200)
            ],
            "the strided rows through the paths unmodified programs take"
        );
        assert!(cells(false, false, None).iter().all(|c| c.via.name() != "run"), "no interposer rows without its library");
        assert!(full.iter().all(|c| c.scenario.apps.iter().any(|a| a.op == Dir::Read)), "reads");
        assert!(full.iter().any(|c| c.label == "decomposition 4K x128"));
        assert_eq!(modes(&cfg(), DeviceKind::Hdd7200), ["fifo", "fifo-merge", "aioli"], "no direct mode on the emulated disk");
        let size = |c: &Cell| c.scenario.apps[0].files().iter().map(|f| f.1).sum::<u64>();
        let file = |g: &str| size(full.iter().find(|c| c.label == format!("decomposition {g} x8")).unwrap());
        assert_eq!((file("4K"), file("64K"), file("1024K")), (128 << 20, 512 << 20, 512 << 20), "larger pieces, larger files");
    }

    #[test]
    fn the_write_matrix_is_the_decomposition_rows_as_writes() {
        for quick in [true, false] {
            let (reads, writes) = (cells(quick, false, None), cells(quick, true, None));
            let decomposition = reads.iter().filter(|c| c.label.starts_with("decomposition")).count();
            assert_eq!(writes.len(), decomposition, "no interference or mix10 row");
            for (r, w) in reads.iter().zip(&writes) {
                assert_eq!(w.label, r.label.replacen("decomposition", "decomposition write", 1));
                assert_eq!((w.direct_io, w.scale, w.scenario.apps.len()), (r.direct_io, r.scale, 1));
                assert_eq!((w.scenario.apps[0].op, w.scenario.apps[0].size), (Dir::Write, r.scenario.apps[0].size));
            }
        }
        let mut c = cfg();
        c.write = true;
        c.only = Some("sim --bench".into());
        assert!(run(&c).is_err(), "no simulator row among the writes");
    }

    #[test]
    fn a_row_is_judged_by_each_modes_median_over_runs() {
        let runs: BTreeMap<String, Vec<f64>> =
            [("fifo", vec![1.0, 9.0, 1.2]), ("fifo-merge", vec![2.0, 2.0]), ("aioli", vec![1.1, 1.3, 5.0, 1.2])].map(|(k, v)| (k.to_string(), v)).into();
        let row = judge(&cfg(), "w".into(), DeviceKind::Real, true, runs, None);
        assert_eq!(row.makespan_s["fifo"], 1.2, "one slow run does not move the median");
        assert_eq!(row.makespan_s["aioli"], 1.25, "an even count takes the middle two");
        assert_eq!(row.best_baseline, "fifo");
        assert!((row.default_over_best - 1.25 / 1.2).abs() < 1e-12);
        assert_eq!(row.runs_s["fifo"], [1.0, 9.0, 1.2], "every run is kept, in order");
        assert!(median(&[]).is_nan());
    }

    fn row_of(runs: &[(&str, &[f64])]) -> MatrixRow {
        let runs: BTreeMap<String, Vec<f64>> = runs.iter().map(|(k, v)| (k.to_string(), v.to_vec())).collect();
        judge(&cfg(), "w".into(), DeviceKind::Real, true, runs, None)
    }

    #[test]
    fn the_sign_test_counts_the_tail_of_fair_tosses() {
        let check = |k, n, expected: f64| assert!((sign_test_p(k, n) - expected).abs() < 1e-12, "{k} of {n}: {} not {expected}", sign_test_p(k, n));
        check(0, 9, 1.0);
        check(9, 9, 1.0 / 512.0);
        check(8, 9, 10.0 / 512.0);
        check(7, 9, 46.0 / 512.0);
        check(2, 3, 0.5);
        check(3, 3, 0.125);
        check(4, 3, 0.0);
    }

    /// A disk that gets faster over the runs puts the default over the
    /// target by medians alone; run by run it is as often faster as
    /// slower, and the sign test does not call it a loss.
    #[test]
    fn pairs_cancel_a_drift_that_medians_do_not() {
        let row = row_of(&[
            ("fifo", &[1.40, 1.30, 0.72, 0.70, 0.70, 0.60, 0.58]),
            ("fifo-merge", &[1.50, 1.35, 1.00, 0.80, 0.75, 0.70, 0.65]),
            ("aioli", &[1.35, 1.40, 1.10, 0.85, 0.68, 0.57, 0.60]),
        ]);
        assert_eq!(row.best_baseline, "fifo");
        assert!(row.default_over_best > DEFAULT_RATIO_MAX, "medians: {}", row.default_over_best);
        let p = row.paired.expect("seven runs each");
        assert_eq!((p.runs_slower, p.runs), (4, 7));
        assert!(p.p_slower > PAIRED_P_MAX, "{p:?}");
        assert!((p.ratio_median - 0.60 / 0.58).abs() < 1e-12, "the middle of seven ratios: {p:?}");
    }

    /// A small loss in every run is found by the pairs though it stays
    /// under the target, and the table marks it `*`.
    #[test]
    fn a_loss_in_every_pair_is_marked_whatever_its_size() {
        let base = [0.9, 1.0, 1.1, 1.0, 0.95, 1.05, 1.2, 0.8, 1.0];
        let slower: Vec<f64> = base.iter().map(|b| b * 1.02).collect();
        let row = row_of(&[("fifo", &base), ("fifo-merge", &[2.0; 9]), ("aioli", &slower)]);
        assert!(row.default_over_best <= DEFAULT_RATIO_MAX);
        let p = row.paired.expect("nine runs each");
        assert_eq!((p.runs_slower, p.runs), (9, 9));
        assert!((p.ratio_median - 1.02).abs() < 1e-9 && p.p_slower <= PAIRED_P_MAX, "{p:?}");
        let rows = vec![row];
        let (alike, paired) = noise_verdicts(&rows);
        assert_eq!(paired, 1);
        let report = MatrixReport {
            quick: true,
            write: false,
            write_leases: true,
            default_policy: "aioli".into(),
            runs: 9,
            rows_over_target: 0,
            rows_over_in_every_run: 0,
            rows_over_if_judged_alike: alike,
            rows_slower_paired: paired,
            rows,
        };
        let t = table(&report);
        assert!(t.contains("1.02 9/9*"), "{t}");
        assert!(t.contains("(marked *): 1"), "{t}");
        assert!(row_of(&[("fifo", &[1.0]), ("fifo-merge", &[1.0]), ("aioli", &[1.0])]).paired.is_none(), "one run has no pairs");
        assert!(row_of(&[("fifo", &[1.0, 1.0]), ("fifo-merge", &[1.0]), ("aioli", &[1.0])]).paired.is_none(), "runs missing");
    }

    /// Every mode judged by the target's rule against the better of the
    /// other two: two modes that behave alike are over it by their noise.
    #[test]
    fn each_mode_is_judged_alike_against_the_other_two() {
        let row = row_of(&[("direct", &[0.5]), ("fifo", &[1.0]), ("fifo-merge", &[1.1]), ("aioli", &[1.2])]);
        let expected: BTreeMap<String, f64> = [("aioli", 1.2 / 1.0), ("fifo", 1.0 / 1.1), ("fifo-merge", 1.1 / 1.0)].map(|(k, v)| (k.to_string(), v)).into();
        assert_eq!(row.judged_alike.keys().collect::<Vec<_>>(), expected.keys().collect::<Vec<_>>(), "direct is not judged");
        for (m, v) in &expected {
            assert!((row.judged_alike[m] - v).abs() < 1e-12, "{m}: {}", row.judged_alike[m]);
        }
        let (alike, _) = noise_verdicts(&[row]);
        assert_eq!(alike, [("aioli", 1), ("fifo", 0), ("fifo-merge", 1)].map(|(k, v)| (k.to_string(), v)).into());
    }

    #[test]
    fn runs_in_pairs_balance_the_modes_order() {
        let m: Vec<String> = ["direct", "fifo", "fifo-merge", "aioli"].map(String::from).into();
        assert_eq!(run_order(&m, 0), m);
        assert_eq!(run_order(&m, 1), ["aioli", "fifo-merge", "fifo", "direct"]);
        assert_eq!(run_order(&m, 2), ["fifo", "fifo-merge", "aioli", "direct"]);
        assert_eq!(run_order(&m, 9), run_order(&m, 1), "four pairs, then it starts over");
        assert!(run_order(&[], 3).is_empty());
        for pairs in 1..=4 {
            let orders: Vec<Vec<String>> = (0..2 * pairs).map(|r| run_order(&m, r)).collect();
            let pos = |o: &Vec<String>, x: &String| o.iter().position(|y| y == x).unwrap();
            // Every mode's positions sum to the same over whole pairs.
            let sums: Vec<usize> = m.iter().map(|x| orders.iter().map(|o| pos(o, x)).sum()).collect();
            assert!(sums.iter().all(|&s| s == 3 * pairs), "{sums:?}");
            // Every mode runs before every other in half the runs.
            for a in &m {
                for b in m.iter().filter(|b| *b != a) {
                    assert_eq!(orders.iter().filter(|o| pos(o, a) < pos(o, b)).count(), pairs, "{a} before {b}");
                }
            }
        }
    }
}
