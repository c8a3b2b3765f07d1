//! `sluice sim SCENARIO.toml`: run a scenario in the simulator, print the
//! per-application table per mode, write JSON, a trace and a sweep plot on
//! request.
//! `sluice sim --bench` measures the engine's speed instead, and
//! `sluice sim --validate` checks `sluice what-if`'s predictions against
//! real runs (`--twins`: real runs against simulated twins fitted to them).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::output::write_json;

#[derive(Args)]
pub struct SimArgs {
    /// Scenario file (see docs/sim.md and scenarios/).
    #[arg(required_unless_present_any = ["bench", "validate"])]
    scenario: Option<PathBuf>,
    /// Mode to run: a policy, or policy/cache (cache: none, write-behind,
    /// aggregation). Repeat for several; default: the scenario's modes.
    #[arg(long = "policy")]
    policies: Vec<String>,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a Chrome/Perfetto trace-event JSON here.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Write a PNG plot of the granularity sweep here (makespan against
    /// granularity per mode, log-log; the legend is printed).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Seed of the run (default: the scenario's).
    #[arg(long)]
    seed: Option<u64>,
    /// Multiply every application's bytes by this.
    #[arg(long)]
    scale: Option<f64>,
    /// Simulate the servers' device as this calibrated model (`sluice
    /// calibrate --out`) instead of the scenario's: on a device that gains
    /// from parallelism, with channels up to the server's queue depth
    /// (`sluice_bench::calibrate::sim_device`; `--validate` keeps one channel).
    #[arg(long)]
    device_model: Option<PathBuf>,
    /// Dispatches each server keeps in flight, in place of the scenario's
    /// (or the device model's): the depth a real server settled on (its
    /// live trace shows it), for a twin of that run.
    #[arg(long)]
    dispatches_inflight: Option<u32>,
    /// Replace the scenario's applications by a Darshan log's (its DXT
    /// records: one process per rank, each access in recorded order after
    /// its recorded think time), on the scenario's cluster. With
    /// --validate: the log of the Darshan workload, in place of the one
    /// built in (`crates/sluice/tests/data/ckpt-4ranks.darshan`).
    #[arg(long, conflicts_with_all = ["bench", "twins"])]
    darshan: Option<PathBuf>,
    /// The DXT layer of the log: DXT_POSIX (default when present) or DXT_MPIIO.
    #[arg(long, requires = "darshan")]
    layer: Option<String>,
    /// A rules file (`sluice serve --qos`'s: classes, rules, a sharing
    /// order) in place of the scenario's classes: its rules place each
    /// application by its name, its `user` (uid and gid) and its job.
    #[arg(long, conflicts_with = "bench")]
    qos: Option<PathBuf>,
    /// Measure simulated events per second on a synthetic scenario.
    #[arg(long)]
    bench: bool,
    /// Processes of the benchmark scenario.
    #[arg(long, default_value_t = 10_000)]
    bench_procs: u64,
    /// Requests per process of the benchmark scenario.
    #[arg(long, default_value_t = 200)]
    bench_requests: u64,
    /// Runs (policies x sweep points) simulated at once on host threads
    /// (default: one per core, at most 4, since each run holds a world of
    /// its own: about 4 GB at 1,000,000 processes; with --bench, 1, since its
    /// figure is one run's events per second). Reports are the same
    /// either way.
    #[arg(long)]
    jobs: Option<usize>,
    /// Check what-if's predictions: run five workloads for real under
    /// each policy with the server's live trace (the 4 KiB and 64 KiB
    /// decomposition on this disk with O_DIRECT; interference, mix10 and a
    /// Darshan log replayed by real processes on the emulated disk; the
    /// log is read with $SLUICE_PYTHON, which needs the darshan package;
    /// without it the built-in log's workload is left out),
    /// predict every policy from every trace with
    /// `sluice what-if`'s defaults (and the host profile of `sluice
    /// calibrate --host`), and print each prediction's error against the
    /// median of the predicted policy's real runs (default policies: fifo
    /// and aioli).
    #[arg(long, conflicts_with_all = ["bench", "scenario", "scale", "seed", "trace", "plot"])]
    validate: bool,
    /// With --validate: the older check instead, which fits a simulated
    /// twin to each real run (its start times, its CPU per request, the
    /// model its server learned) on three workloads (mix10 and
    /// interference on the emulated disk, the 64 KiB decomposition with
    /// O_DIRECT). The real disk's model comes from `--device-model`, else
    /// from a short `sluice calibrate --direct`.
    #[arg(long, requires = "validate")]
    twins: bool,
    /// Multiply the validation workloads' sizes by this.
    #[arg(long, default_value_t = 1.0, requires = "validate")]
    validate_scale: f64,
    /// Real runs of each validation workload (the median is compared).
    #[arg(long, default_value_t = 3, requires = "validate")]
    validate_runs: u32,
    /// Scratch directory of the validation's real runs (default /var/tmp;
    /// O_DIRECT needs a disk file system, not tmpfs).
    #[arg(long, requires = "validate")]
    dir: Option<PathBuf>,
}

fn validate(a: &SimArgs) -> anyhow::Result<()> {
    use sluice_bench::{calibrate, validate};
    let policies = if a.policies.is_empty() { vec!["fifo".into(), "aioli".into()] } else { a.policies.clone() };
    // The real server has no cache layers: plain policies only, checked
    // before anything runs.
    if let Some(bad) = policies.iter().find(|p| sluice_core::PolicyConfig::from_name(p).is_none()) {
        anyhow::bail!("--validate runs policies without a cache layer; {bad:?} is not one of {}", sluice_core::POLICY_NAMES.join(", "));
    }
    let exe = std::env::current_exe().context("locating the sluice executable")?;
    // Removed however the validation ends, a Ctrl-C included.
    let root = sluice_bench::scratch::Scratch::new(a.dir.clone().unwrap_or_else(|| PathBuf::from("/var/tmp")).join(format!("sluice-validate-{}", std::process::id())));
    std::fs::create_dir_all(root.path()).with_context(|| format!("creating {}", root.path().display()))?;
    if !a.twins {
        return predict(a, policies, exe, root.path());
    }
    let model = match &a.device_model {
        Some(p) => calibrate::ModelFile::load(p).map_err(anyhow::Error::msg)?,
        None => {
            eprintln!("validate: calibrating {} with O_DIRECT (sluice calibrate --direct --cell-ms 500)", root.path().display());
            let cfg = calibrate::CalibrateConfig { root: root.path().to_path_buf(), direct: true, file_bytes: 256 << 20, cell_ms: 500 };
            calibrate::run(&cfg).map_err(anyhow::Error::msg)?
        }
    };
    let cfg = validate::Config {
        workloads: validate::workloads(a.validate_scale),
        policies,
        root: root.path().to_path_buf(),
        exe,
        model: Some(model),
        seed: 1,
        runs: a.validate_runs,
        progress: true,
    };
    let report = validate::run(&cfg).map_err(anyhow::Error::msg)?;
    drop(root);
    print!("{}", validate::table(&report));
    if let Some(path) = &a.json {
        write_json(path, &report)?;
        println!("json: {}", path.display());
    }
    Ok(())
}

/// `--validate`: what-if's predictions against real runs
/// (`sluice_bench::predict`).
fn predict(a: &SimArgs, policies: Vec<String>, exe: PathBuf, root: &std::path::Path) -> anyhow::Result<()> {
    use sluice_bench::{host, predict};
    if a.device_model.is_some() {
        anyhow::bail!("--validate predicts with what-if's defaults (the device each trace names or implies); --device-model is for --validate --twins");
    }
    let host = host::load_default().map_err(anyhow::Error::msg)?;
    match &host {
        None => {
            eprintln!("validate: no host profile (run `sluice calibrate --host` once); the predictions replay without a host, and the real disk's traces on the model they imply")
        }
        Some(h) if h.disk.is_none() => {
            eprintln!("validate: the host profile has no disk (run `sluice calibrate --host` again); the real disk's traces replay on the model they imply")
        }
        Some(_) => {}
    }
    let mut workloads = predict::workloads(a.validate_scale);
    match darshan_workload(a, root) {
        Ok(w) => workloads.push(w),
        // The log the user named must be read; the built-in one only
        // where a Python with the darshan package is.
        Err(e) if a.darshan.is_some() => return Err(e),
        Err(e) => eprintln!("validate: no Darshan workload ({e:#})"),
    }
    let cfg = predict::Config { workloads, policies, root: root.to_path_buf(), exe, runs: a.validate_runs, host, progress: true };
    let report = predict::run(&cfg).map_err(anyhow::Error::msg)?;
    print!("{}", predict::table(&report));
    if let Some(path) = &a.json {
        write_json(path, &report)?;
        println!("json: {}", path.display());
    }
    Ok(())
}

/// The Darshan log `--validate` replays by default: four MPI ranks write
/// and read back a shared checkpoint (crates/sluice/tests/data/README.md).
const VALIDATE_DARSHAN: &[u8] = include_bytes!("../../tests/data/ckpt-4ranks.darshan");

/// `--validate`'s Darshan workload: the log's accesses replayed by real
/// processes (as `sluice bench custom --darshan LOG` does) on the emulated
/// disk. The log and its replay are written under `root`, which the
/// validation removes.
fn darshan_workload(a: &SimArgs, root: &std::path::Path) -> anyhow::Result<sluice_bench::predict::Workload> {
    use sluice_bench::workload::scenario::Scenario;
    let log = match &a.darshan {
        Some(p) => p.clone(),
        None => {
            let p = root.join("ckpt-4ranks.darshan");
            std::fs::write(&p, VALIDATE_DARSHAN).with_context(|| format!("writing {}", p.display()))?;
            p
        }
    };
    let replay = super::darshan::replay_log(&log, a.layer.as_deref())?;
    let path = root.join("darshan-replay.json");
    replay.save(&path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let app = sluice_bench::workload::pattern::AppSpec { replay: Some(path), ..replay.app_spec() };
    let file = log.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let name = format!("darshan {file} (hdd7200)");
    Ok(sluice_bench::predict::Workload { name: name.clone(), scenario: Scenario { name, apps: vec![app] }, device: sluice_server::DeviceKind::Hdd7200, direct_io: false })
}

/// A daemon's rules file on a scenario: its classes and sharing order
/// replace the scenario's, and its rules place each application as the
/// daemon would (name, `user` as uid and gid).
pub fn apply_qos(sc: &mut sluice_sim::Scenario, rules: &sluice_server::qos::QosRules) {
    sc.classes = rules
        .classes
        .iter()
        .map(|c| sluice_sim::SimClass {
            name: c.spec.name.clone(),
            rate_bytes_per_s: c.spec.rate_bytes_per_s,
            rate_requests_per_s: c.spec.rate_requests_per_s,
            guarantee_bytes_per_s: c.spec.guarantee_bytes_per_s,
            depth_ms: (c.spec.depth_ns > 0).then_some(c.spec.depth_ns / 1_000_000),
        })
        .collect();
    sc.share = rules.share.iter().map(|l| l.name().to_string()).collect();
    for app in &mut sc.apps {
        app.class = rules.class_for(&app.name, app.user, app.user).map(|c| c.spec.name.clone());
    }
}

pub fn run(a: SimArgs) -> anyhow::Result<()> {
    if a.validate {
        return validate(&a);
    }
    let scenario = match (&a.scenario, a.bench) {
        (_, true) => sluice_sim::bench_scenario(a.bench_procs, a.bench_requests),
        (Some(path), false) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            sluice_sim::Scenario::from_toml(&text).with_context(|| format!("in {}", path.display()))?
        }
        (None, false) => anyhow::bail!("a scenario file is required"),
    };
    let mut scenario = scenario;
    if let Some(log) = &a.darshan {
        let app = sluice_sim::whatif::Recording::darshan_app(&super::darshan::dxt_json(log, a.layer.as_deref())?)?;
        scenario.apps = vec![app];
        scenario.sweep_granularity_bytes.clear();
        scenario.sweep_aggregators.clear();
        scenario.name = format!("{} with {}", scenario.name, log.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()));
    }
    if let Some(p) = &a.qos {
        apply_qos(&mut scenario, &sluice_server::qos::QosRules::load(p).map_err(anyhow::Error::msg)?);
    }
    if let Some(p) = &a.device_model {
        let m = sluice_bench::calibrate::ModelFile::load(p).map_err(anyhow::Error::msg)?;
        let (profile, channels) = sluice_bench::calibrate::sim_device(&m);
        scenario.server.device = "profile".into();
        scenario.server.profile = Some(profile);
        (scenario.server.channels, scenario.server.dispatches_inflight) = (channels, 0);
    }
    if let Some(n) = a.dispatches_inflight {
        scenario.server.dispatches_inflight = n;
    }
    if scenario.procs_total() >= sluice_sim::LARGE_WORLD_PROCS {
        crate::alloc::huge_pages();
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let jobs = a.jobs.unwrap_or(if a.bench { 1 } else { cores.min(4) }).max(1);
    let opts = sluice_sim::RunOptions { modes: a.policies.clone(), seed: a.seed, scale: a.scale, trace: a.trace.is_some(), jobs };
    let (report, trace) = sluice_sim::run(&scenario, &opts)?;
    print!("{}", report.table());
    if a.bench {
        for r in &report.runs {
            // Requests a second do not depend on how many events the
            // engine takes per request, which has changed (docs/sim.md).
            let requests_per_s = if r.wall_s > 0.0 { r.device_stats.requests as f64 / r.wall_s } else { 0.0 };
            println!(
                "bench: {} processes, {} events in {:.3} s = {:.2} M events/s, {:.2} M requests/s ({})",
                a.bench_procs,
                r.events,
                r.wall_s,
                r.events_per_s / 1e6,
                requests_per_s / 1e6,
                r.mode
            );
        }
    }
    if let Some(path) = &a.json {
        write_json(path, &report)?;
        println!("json: {}", path.display());
    }
    if let Some(path) = &a.plot {
        let legend = sluice_sim::sweep_png(&report, path)?;
        println!("plot: {} ({legend})", path.display());
    }
    if let (Some(path), Some(t)) = (&a.trace, trace) {
        std::fs::write(path, t.to_json()).with_context(|| format!("writing {}", path.display()))?;
        if t.dropped() > 0 {
            eprintln!("sluice: trace kept its first events only; {} more dropped (trace_events_max)", t.dropped());
        }
        println!("trace: {}", path.display());
    }
    Ok(())
}
