//! The forwarder-set benchmark (`sluice bench forwarders`): the seed's
//! decomposition (P processes read one shared file in strided pieces) on
//! one server, on a set of N forwarders over the same directory with one
//! home per file, and on the same set with a home per client (what a
//! static map of compute nodes to forwarders does). With the emulated
//! disk the forwarders share one disk (`sluice serve --device-shared`),
//! as forwarders over one file system share its disks. Each run takes
//! the three setups in a rotated order; the report gives each setup's
//! median, least and greatest bandwidth and requests per dispatch.

use std::path::PathBuf;

use serde::Serialize;
use sluice_server::DeviceKind;

use crate::matrix::run_order;
use crate::workload::pattern::Dir;
use crate::workload::runner::{run, RunConfig, Via};
use crate::workload::scenario;
use crate::workload::WorkloadError;

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct ForwardersConfig {
    pub procs: u32,
    pub granularity: u64,
    pub scale: f64,
    /// Forwarders in the set.
    pub set: u32,
    pub policy: String,
    /// `hdd7200` or `real`.
    pub device: String,
    pub direct_io: bool,
    pub runs: u32,
    /// `library` or `run` (the interposer, as `sluice run`).
    pub via: String,
    #[serde(skip)]
    pub preload: Option<PathBuf>,
    #[serde(skip)]
    pub exe: PathBuf,
    #[serde(skip)]
    pub root: PathBuf,
}

/// One setup over every run.
#[derive(Clone, Debug, Serialize)]
pub struct Setup {
    /// `one server`, `set, home per file`, `set, home per client`.
    pub name: String,
    pub forwarders: u32,
    pub home_per_client: bool,
    pub mib_s: Vec<f64>,
    pub requests_per_dispatch: Vec<f64>,
    pub seeks: Vec<u64>,
}

/// The report `--json` writes.
#[derive(Clone, Debug, Serialize)]
pub struct ForwardersReport {
    pub config: ForwardersConfig,
    pub setups: Vec<Setup>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Run every setup `cfg.runs` times.
pub fn forwarders(cfg: &ForwardersConfig) -> Result<ForwardersReport, WorkloadError> {
    let mut setups = vec![
        Setup { name: "one server".into(), forwarders: 1, home_per_client: false, mib_s: vec![], requests_per_dispatch: vec![], seeks: vec![] },
        Setup { name: "set, home per file".into(), forwarders: cfg.set, home_per_client: false, mib_s: vec![], requests_per_dispatch: vec![], seeks: vec![] },
        Setup { name: "set, home per client".into(), forwarders: cfg.set, home_per_client: true, mib_s: vec![], requests_per_dispatch: vec![], seeks: vec![] },
    ];
    let device = DeviceKind::parse(&cfg.device).map_err(|e| WorkloadError::usage(e.to_string()))?;
    let scenario = scenario::decomposition(cfg.procs, cfg.granularity, Dir::Read, cfg.scale);
    let via = match (cfg.via.as_str(), &cfg.preload) {
        ("run", Some(lib)) => Via::Run(lib.clone()),
        ("run", None) => return Err(WorkloadError::usage("--via run needs the interposer library".into())),
        _ => Via::Library,
    };
    let names: Vec<String> = (0..setups.len()).map(|i| i.to_string()).collect();
    for r in 0..cfg.runs.max(1) as usize {
        for i in run_order(&names, r).iter().map(|s| s.parse::<usize>().expect("an index")) {
            let s = &mut setups[i];
            let base = RunConfig::started(scenario.clone(), vec![cfg.policy.clone()], device, cfg.root.clone(), cfg.exe.clone());
            let rc = RunConfig {
                direct_io: cfg.direct_io,
                scale: cfg.scale,
                granularity: Some(cfg.granularity),
                via: via.clone(),
                forwarders: s.forwarders,
                home_per_client: s.home_per_client,
                ..base
            };
            let report = run(&rc)?;
            let one = &report.runs[0];
            s.mib_s.push(one.apps.iter().map(|a| a.mib_s).sum());
            s.requests_per_dispatch.push(one.apps.iter().filter_map(|a| a.requests_per_dispatch).sum());
            s.seeks.push(one.seeks.unwrap_or(0));
        }
    }
    Ok(ForwardersReport { config: cfg.clone(), setups })
}

/// The table `sluice bench forwarders` prints.
pub fn table(r: &ForwardersReport) -> String {
    let c = &r.config;
    let mut out = format!(
        "{} processes read one file in {} B strided pieces, {} forwarders, {} on {}{}, {} runs (median [least, greatest])\n",
        c.procs,
        c.granularity,
        c.set,
        c.policy,
        if c.device == "hdd7200" { "one shared emulated disk" } else { "the real disk" },
        if c.direct_io { " (O_DIRECT)" } else { "" },
        c.runs
    );
    out += &format!("{:<22} {:>26} {:>24} {:>10} {:>12}\n", "setup", "MiB/s", "requests per dispatch", "seeks", "vs one");
    let base = r.setups.first().map_or(1.0, |s| median(&s.mib_s));
    for s in &r.setups {
        let range = |v: &[f64], p: usize| {
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(0.0, f64::max);
            format!("{:.*} [{:.*}, {:.*}]", p, median(v), p, lo, p, hi)
        };
        let seeks: Vec<f64> = s.seeks.iter().map(|&x| x as f64).collect();
        out += &format!(
            "{:<22} {:>26} {:>24} {:>10.0} {:>11.2}x\n",
            s.name,
            range(&s.mib_s, 1),
            range(&s.requests_per_dispatch, 1),
            median(&seeks),
            median(&s.mib_s) / base.max(1e-9)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_gives_each_setup_against_one_server() {
        let cfg = ForwardersConfig {
            procs: 32,
            granularity: 4096,
            scale: 1.0,
            set: 4,
            policy: "aioli".into(),
            device: "hdd7200".into(),
            direct_io: false,
            runs: 2,
            via: "library".into(),
            preload: None,
            exe: PathBuf::new(),
            root: PathBuf::new(),
        };
        let s = |name: &str, mib: [f64; 2], rpd: [f64; 2]| Setup {
            name: name.into(),
            forwarders: 4,
            home_per_client: false,
            mib_s: mib.to_vec(),
            requests_per_dispatch: rpd.to_vec(),
            seeks: vec![1, 3],
        };
        let r = ForwardersReport {
            config: cfg,
            setups: vec![s("one server", [60.0, 70.0], [31.0, 32.0]), s("set, home per file", [64.0, 66.0], [30.0, 31.0]), s("set, home per client", [0.5, 0.7], [1.5, 1.5])],
        };
        let t = table(&r);
        assert!(t.contains("one shared emulated disk"), "{t}");
        assert!(t.contains("65.0 [60.0, 70.0]") && t.contains("1.00x"), "{t}");
        assert!(t.contains("0.6 [0.5, 0.7]") && t.contains("0.01x"), "{t}");
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    }
}
