//! `sluice bench decomposition|interference|mix10|custom|worker`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use sluice_bench::workload::pattern::Dir;
use sluice_bench::workload::replay::ReplayLog;
use sluice_bench::workload::report::{table, Report};
use sluice_bench::workload::runner::{run, RunConfig, Via};
use sluice_bench::workload::scenario::{self, Scenario};
use sluice_server::DeviceKind;

use super::output::write_json;

/// Options shared by every workload.
#[derive(Args)]
pub struct Common {
    /// Modes to compare: `direct` (no service) and/or policy names.
    /// Default: direct,fifo,aioli (fifo,aioli with --device hdd7200).
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Open the backing files with O_DIRECT (in the direct mode and in the server).
    #[arg(long)]
    direct: bool,
    /// `real`, or `hdd7200` for the server's emulated rotating disk.
    #[arg(long, default_value = "real")]
    device: String,
    /// Multiply every size by this (the seed's sizes at 1.0).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Scratch directory (default: a new one under /var/tmp, removed after).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Use this running server instead of starting one per policy.
    #[arg(long)]
    server: Option<String>,
    /// Dispatches in flight in the started servers (default: the server's;
    /// 1 with --device hdd7200, since the emulated disk has one arm and a
    /// second dispatch would be chosen long before the arm is free).
    #[arg(long)]
    queue_depth: Option<u32>,
    /// The started servers hand every dispatch to executor threads, never
    /// to io_uring (to compare).
    #[arg(long)]
    no_uring: bool,
    /// The started servers submit through a kernel polling thread that
    /// sleeps after MS milliseconds without a submission (`sluice serve
    /// --sqpoll-idle-ms`).
    #[arg(long, value_name = "MS")]
    sqpoll_idle_ms: Option<u32>,
    /// The started servers schedule every write (`sluice serve
    /// --no-write-leases`) instead of letting the processes make their
    /// buffered writes themselves under write leases.
    #[arg(long)]
    no_write_leases: bool,
    /// Write leases (the default; kept so that older command lines run).
    #[arg(long, hide = true, conflicts_with = "no_write_leases")]
    write_leases: bool,
    /// Also run each application alone, to report slowdowns.
    #[arg(long)]
    alone: bool,
    /// Seed of the random patterns.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The path the processes' I/O takes to each started server:
    /// `library` (the client library), `run` (plain POSIX calls under the
    /// interposer, as `sluice run` runs programs) or `mount` (plain POSIX
    /// calls on a real FUSE mount of the server, as `sluice mount`).
    #[arg(long, default_value = "library", value_parser = ["library", "run", "mount"])]
    via: String,
    /// With --device hdd7200: the started servers learn the emulated disk
    /// from scratch (`sluice serve --no-prior`).
    #[arg(long)]
    no_prior: bool,
    /// Time buffered writes only until they are in the page cache: by
    /// default each process that wrote without O_DIRECT calls `fsync`
    /// before it finishes, so the times include putting the data on the
    /// device.
    #[arg(long)]
    no_fsync: bool,
    /// Start N servers per policy over the one scratch directory and reach
    /// them as a forwarder set (one home per file); with --device hdd7200
    /// they share one emulated disk.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    forwarders: u32,
    /// With --forwarders: what picks a process's forwarder, `file` (its
    /// home, the default) or `client` (a home per process, to compare).
    #[arg(long, default_value = "file", value_parser = ["file", "client"])]
    home: String,
    /// Run the whole comparison this many times, the modes' order changing
    /// from run to run, and summarise: each mode's makespans, and the
    /// judged policy (the last of --policies) against every other mode run
    /// by run. One scenario only (no granularity sweep).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(sluice_bench::workload::repeat::RUNS_MAX)))]
    runs: u32,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
pub struct DecompositionArgs {
    /// Processes (ranks).
    #[arg(long, default_value_t = 32)]
    procs: u32,
    /// Granularity, or a comma-separated list for a sweep (bytes, or with
    /// K, M, G, T: binary units; 4K, 128KiB, 1M…).
    #[arg(long, value_delimiter = ',', default_value = "4K")]
    granularity: Vec<String>,
    /// Write instead of read.
    #[arg(long)]
    write: bool,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
pub struct InterferenceArgs {
    #[arg(long, default_value_t = 32)]
    procs: u32,
    #[arg(long, default_value = "8K")]
    granularity: String,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
pub struct Mix10Args {
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
pub struct CustomArgs {
    /// A TOML file of `[[app]]` tables (see docs/bench.md).
    #[arg(required_unless_present = "darshan", conflicts_with = "darshan")]
    file: Option<PathBuf>,
    /// Replay a Darshan log's DXT records instead: one process per rank,
    /// each access in recorded order after its recorded think time.
    #[arg(long)]
    darshan: Option<PathBuf>,
    /// The DXT layer to replay: DXT_POSIX (default when present) or DXT_MPIIO.
    #[arg(long, requires = "darshan")]
    layer: Option<String>,
    #[command(flatten)]
    common: Common,
}

pub fn decomposition(a: DecompositionArgs) -> anyhow::Result<()> {
    let op = if a.write { Dir::Write } else { Dir::Read };
    let sizes = a.granularity.iter().map(|g| super::size::parse_size_positive(g).map_err(anyhow::Error::msg)).collect::<anyhow::Result<Vec<_>>>()?;
    let sweep = sizes.len() > 1;
    let scenarios = sizes.iter().map(|&g| (scenario::decomposition(a.procs, g, op, a.common.scale), sweep.then_some(g))).collect();
    execute(&a.common, scenarios)
}

pub fn interference(a: InterferenceArgs) -> anyhow::Result<()> {
    let g = super::size::parse_size_positive(&a.granularity).map_err(anyhow::Error::msg)?;
    execute(&a.common, vec![(scenario::interference(a.procs, g, a.common.scale), None)])
}

pub fn mix10(a: Mix10Args) -> anyhow::Result<()> {
    execute(&a.common, vec![(scenario::mix10(a.common.scale), None)])
}

pub fn custom(a: CustomArgs) -> anyhow::Result<()> {
    if let Some(log) = &a.darshan {
        return darshan(log, a.layer.as_deref(), &a.common);
    }
    let file = a.file.as_ref().expect("clap requires the file without --darshan");
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let s = scenario::custom(&text, a.common.scale).map_err(anyhow::Error::msg)?;
    execute(&a.common, vec![(s, None)])
}

/// A Darshan log replayed by real processes: its accesses as a
/// `ReplayLog` in the scratch directory, one application of one process
/// per rank.
fn darshan(log: &std::path::Path, layer: Option<&str>, c: &Common) -> anyhow::Result<()> {
    if c.scale != 1.0 {
        anyhow::bail!("--scale does not apply to a recorded log");
    }
    let replay = super::darshan::replay_log(log, layer)?;
    let app = replay.app_spec();
    let name = format!("darshan {}", log.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()));
    execute_with(c, vec![(Scenario { name, apps: vec![app] }, None)], Some(replay))
}

pub fn worker() -> anyhow::Result<()> {
    sluice_bench::workload::worker::run_worker().map_err(|e| anyhow::anyhow!("{e}"))
}

fn execute(c: &Common, scenarios: Vec<(Scenario, Option<u64>)>) -> anyhow::Result<()> {
    execute_with(c, scenarios, None)
}

/// `replay`: a recorded log the scenarios' single application replays; it
/// is written into the scratch directory, where the workers read it.
fn execute_with(c: &Common, mut scenarios: Vec<(Scenario, Option<u64>)>, replay: Option<ReplayLog>) -> anyhow::Result<()> {
    let device = DeviceKind::parse(&c.device).map_err(|e| anyhow::anyhow!("{e}"))?;
    let modes = match (&c.policies[..], device) {
        ([], DeviceKind::Hdd7200) => vec!["fifo".to_string(), "aioli".to_string()],
        ([], DeviceKind::Real) => vec!["direct".to_string(), "fifo".to_string(), "aioli".to_string()],
        (p, _) => p.to_vec(),
    };
    let made = c.root.is_none().then(|| std::path::Path::new("/var/tmp").join(format!("sluice-bench-{}", std::process::id())));
    // Removed however the command ends, a Ctrl-C included.
    let _scratch = made.clone().map(sluice_bench::scratch::Scratch::new);
    let root = c.root.clone().or(made).expect("one of the two is set");
    if let Some(r) = replay {
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let path = root.join("darshan-replay.json");
        r.save(&path).map_err(|e| anyhow::anyhow!("{e}"))?;
        scenarios.iter_mut().flat_map(|(s, _)| s.apps.iter_mut()).for_each(|a| a.replay = Some(path.clone()));
    }
    let exe = std::env::current_exe().context("locating the sluice executable")?;
    let via = match c.via.as_str() {
        "run" => Via::Run(super::run::find_library(&exe, std::env::var_os(super::run::PRELOAD_ENV).map(PathBuf::from))?),
        "mount" => Via::Mount,
        _ => Via::Library,
    };
    if c.runs > 1 {
        anyhow::ensure!(scenarios.len() == 1, "--runs takes one scenario: give one granularity");
        let (scenario, granularity) = scenarios.pop().expect("one scenario");
        let judged = modes.last().cloned().unwrap_or_default();
        let mut reports = Vec::new();
        for r in 0..c.runs as usize {
            eprintln!("run {} of {}", r + 1, c.runs);
            let cfg = run_config(c, scenario.clone(), granularity, (&root, &exe), &sluice_bench::matrix::run_order(&modes, r), &via, device);
            reports.push(run(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?);
        }
        let repeated = sluice_bench::workload::repeat::summarise(reports, &judged);
        print!("{}", table(&repeated.runs[0]));
        print!("{}", sluice_bench::workload::repeat::table(&repeated));
        if let Some(path) = &c.json {
            write_json(path, &repeated)?;
            println!("json: {}", path.display());
        }
        return Ok(());
    }
    let mut report: Option<Report> = None;
    for (scenario, granularity) in scenarios {
        let cfg = run_config(c, scenario, granularity, (&root, &exe), &modes, &via, device);
        let r = run(&cfg).map_err(|e| anyhow::anyhow!("{e}"))?;
        match &mut report {
            None => report = Some(r),
            Some(all) => {
                all.runs.extend(r.runs);
                all.caches_dropped &= r.caches_dropped;
            }
        }
    }
    let report = report.expect("at least one scenario");
    print!("{}", table(&report));
    if let Some(path) = &c.json {
        write_json(path, &report)?;
        println!("json: {}", path.display());
    }
    Ok(())
}

/// The runner's configuration for one scenario.
fn run_config(c: &Common, scenario: Scenario, granularity: Option<u64>, at: (&std::path::Path, &std::path::Path), modes: &[String], via: &Via, device: DeviceKind) -> RunConfig {
    let (root, exe) = at;
    RunConfig {
        scenario,
        modes: modes.to_vec(),
        direct_io: c.direct,
        device,
        root: root.to_path_buf(),
        server: c.server.clone(),
        queue_depth: c.queue_depth.or((device == DeviceKind::Hdd7200 && !c.no_prior).then_some(1)),
        uring: !c.no_uring,
        sqpoll_idle_ms: c.sqpoll_idle_ms,
        write_leases: c.write_leases || !c.no_write_leases,
        alone: c.alone,
        seed: c.seed,
        exe: exe.to_path_buf(),
        scale: c.scale,
        granularity,
        progress: true,
        via: via.clone(),
        no_prior: c.no_prior,
        durable: !c.no_fsync,
        forwarders: c.forwarders,
        home_per_client: c.home == "client",
        qos: None,
        sample_ms: 0,
        trace_dir: None,
    }
}
