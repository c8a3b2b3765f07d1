//! `sluice sim --validate --twins`: each workload runs twice, for real (the
//! bench's processes against a started server) and in the simulator (its
//! twin: the same applications, one server, the same policy and device
//! model), and the two makespans are compared.
//!
//! The twin of a run on this machine:
//! - one host: every process on its own node, linked to the server by a
//!   fast, short link (`ONE_HOST`: the Unix socket's round trip here is
//!   about 50 µs, and data moves by copies of several GB/s);
//! - requests cut at the client's 1 MiB shared-memory slot, each process
//!   synchronous, no think time, started when the real run's process
//!   started (each real run has its own twin);
//! - the device: the emulated 7200 rpm disk (the same model the server
//!   emulates), or for the real disk the model `sluice calibrate`
//!   measured, with its access and seek costs divided by the throughput
//!   gain it measured from one to P in flight, P the calibrated
//!   parallelism but at most the real server's queue depth, 8 (the twin's device has one
//!   channel, `channels = 1`, the real one serves several: this keeps the
//!   throughput, not the latency);
//! - the scheduler: weighing with the cost model the real run's server
//!   had learned by its end.
//!
//! Where the makespans differ, the report splits the gap: the device (the
//! real server's summed service time against the twin's, and their seek
//! counts), the schedule (dispatch counts that differ: the real server
//! learned its model while it ran, the twin has the end result from the
//! start), and the rest, which is time neither
//! device nor schedule explain: the per-request cost of the service
//! (network, server and client CPU on two shared cores).

use std::path::PathBuf;

use serde::Serialize;
use sluice_server::DeviceKind;
use sluice_sim::{AioliOverrides, App, Bounds, Client, Cluster, Network, OpName, ProfileFigures, Server};

use crate::calibrate::ModelFile;
use crate::workload::pattern::{AppSpec, Dir, Pattern};
use crate::workload::runner::{self, RunConfig};
use crate::workload::scenario::{self, Scenario};

/// The link of one host (see the module documentation).
const ONE_HOST: Network =
    Network { nic_bytes_per_s: 10_000_000_000, nic_latency_ns: 12_000, switch_bytes_per_s: 100_000_000_000, switch_latency_ns: 1_000, packet_bytes: 65_536, header_bytes: 64 };
/// The client cuts a request at its shared-memory slot.
const SLOT_BYTES: u64 = sluice_proto::SHM_SLOT_BYTES;
/// The error the issue accepts.
pub const TARGET: f64 = 0.05;
/// How far apart the twin's processes start when no real run says when
/// they did: the bench releases its workers from a barrier, but on two
/// cores ninety processes take milliseconds to all get running.
const START_JITTER_NS: u64 = 1_000_000;

/// One workload to validate.
#[derive(Clone, Debug)]
pub struct Workload {
    pub name: String,
    pub scenario: Scenario,
    pub device: DeviceKind,
    pub direct_io: bool,
}

/// The three validation workloads: mix10 on the emulated disk, the
/// decomposition with 64 KiB pieces on the real disk with O_DIRECT, and
/// interference (decomposition plus `cat`) on the emulated disk. `scale`
/// multiplies the sizes chosen to take seconds here.
pub fn workloads(scale: f64) -> Vec<Workload> {
    let k = 1024;
    vec![
        Workload { name: "mix10 (hdd7200)".into(), scenario: scenario::mix10(scale / 64.0), device: DeviceKind::Hdd7200, direct_io: false },
        Workload {
            name: "decomposition 64 KiB x 32 (O_DIRECT)".into(),
            scenario: scenario::decomposition(32, 64 * k, Dir::Read, scale / 16.0),
            device: DeviceKind::Real,
            direct_io: true,
        },
        Workload { name: "interference (hdd7200)".into(), scenario: scenario::interference(16, 32 * k, scale / 64.0), device: DeviceKind::Hdd7200, direct_io: false },
    ]
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    pub workloads: Vec<Workload>,
    pub policies: Vec<String>,
    /// Scratch directory for the real runs.
    pub root: PathBuf,
    /// The `sluice` executable the bench starts its workers with.
    pub exe: PathBuf,
    /// The real disk's model (`sluice calibrate --direct`), for workloads
    /// on the real disk.
    pub model: Option<ModelFile>,
    pub seed: u64,
    /// Real runs per workload; the row shows the median.
    pub runs: u32,
    pub progress: bool,
}

/// One workload under one policy.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub workload: String,
    pub policy: String,
    /// Medians: of the real runs, and of their twins (one per real run,
    /// started as it was).
    pub real_s: f64,
    pub sim_s: f64,
    /// The spread of each: (min, max).
    pub real_range_s: (f64, f64),
    pub sim_range_s: (f64, f64),
    /// Each real run's makespan beside its own twin's, in run order.
    pub pairs_s: Vec<(f64, f64)>,
    /// (sim - real) / real, of the medians: the figure judged against
    /// `TARGET`.
    pub error: f64,
    /// The median of each real run's error against its own twin. Where it
    /// is small and `error` is not, most twins follow their runs and the
    /// medians come from runs of different kinds (fifo's rotation under
    /// interference depends on the order in which processes arrive).
    pub pair_error: f64,
    /// The application with the largest error, and that error.
    pub worst_app: String,
    pub worst_app_error: f64,
    pub real_dispatches: Option<u64>,
    pub sim_dispatches: u64,
    pub real_device_busy_s: Option<f64>,
    pub sim_device_busy_s: f64,
    /// Dispatches that did not continue the previous one: the real
    /// server's count, and the twin's far and near seeks.
    pub real_seeks: Option<u64>,
    pub sim_seeks: u64,
    /// The scheduler's holds and windows (aioli's): real, and twin.
    pub real_holds_windows: Option<(u64, u64)>,
    pub sim_holds_windows: (u64, u64),
    /// The share of `error` the device's busy time explains (sim - real,
    /// over the real makespan; on a device that serves P dispatches at
    /// once, the real busy time over P); the rest is `error - device`.
    pub device: Option<f64>,
    /// Where the gap comes from, in words (empty when within `TARGET`).
    pub cause: String,
    /// The server CPU per request the twin was given (ns): the real
    /// server's process CPU over its requests, median of the runs; None
    /// where it could not be read (the twin's server then costs nothing).
    pub server_cpu_ns: Option<u64>,
    /// The CPU per request the twin's processes were given (ns): the
    /// workers' own CPU time over the requests, median of the runs.
    pub client_cpu_ns: Option<u64>,
    /// The time per request the hypervisor took from the real run's CPUs
    /// while they had work (ns: `steal` over the requests, median of the
    /// runs). The twin charges it on top of the server's and the
    /// processes' CPU, shared as theirs is.
    pub steal_ns: Option<u64>,
    /// The shared host's cores in the twin (this machine's).
    pub host_cores: u64,
    /// The twin's median makespan with CPU that costs nothing, as before
    /// the CPU was modelled (seconds).
    pub sim_free_cpu_s: f64,
    /// The twin's median makespan charging the CPU but not the steal, as
    /// the twin did before the steal was modelled (seconds).
    pub sim_no_steal_s: f64,
}

/// The whole report (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub target: f64,
    pub rows: Vec<Row>,
    /// The real disk's model the twins used (its calibration moves them
    /// most), and the throughput gain they were credited with.
    pub device_model: Option<crate::workload::report::DeviceModel>,
    pub device_gain: Option<f64>,
}

/// Dispatches the real run's server keeps in flight at most: its queue
/// depth (`sluice serve --queue-depth`; 1 on the emulated disk).
fn queue_depth(w: &Workload) -> u32 {
    match w.device {
        DeviceKind::Hdd7200 => 1,
        DeviceKind::Real | DeviceKind::Null => sluice_server::QUEUE_DEPTH_DEFAULT,
    }
}

/// The depth the twin's device is credited with: the calibrated
/// parallelism, but no more than the real server ever had in flight (a
/// device that gains up to 32 in flight serves a server that keeps 8 at
/// 8's throughput; the emulated disk, 1).
fn twin_depth(w: &Workload, m: &ModelFile) -> u32 {
    m.parallelism.clamp(1, queue_depth(w))
}

/// The simulated twin of `w` (see the module documentation).
pub fn twin(w: &Workload, model: Option<&ModelFile>) -> Result<sluice_sim::Scenario, String> {
    let procs: u64 = w.scenario.apps.iter().map(|a| u64::from(a.procs)).sum();
    let apps = w.scenario.apps.iter().map(twin_app).collect::<Result<Vec<_>, _>>()?;
    let (device, profile) = match w.device {
        DeviceKind::Hdd7200 => ("hdd7200".to_string(), None),
        DeviceKind::Null => return Err(format!("{}: the null device has no simulated twin", w.name)),
        DeviceKind::Real => {
            let m = model.ok_or_else(|| format!("{}: the real disk needs its calibrated model (sluice calibrate --direct)", w.name))?;
            let gain = m.gain_at(twin_depth(w, m));
            let per = |ns: u64| (ns as f64 / gain).round() as u64;
            (
                "profile".to_string(),
                Some(ProfileFigures { access_ns: per(m.dispatch_ns), bytes_per_s: m.bytes_per_s(), seek_ns: per(m.seek_ns), shared_ns: 0, shared_bytes_per_s: 0 }),
            )
        }
    };
    let sc = sluice_sim::Scenario {
        name: format!("twin of {}", w.name),
        description: "the simulated twin of a real run on this machine".into(),
        seed: 1,
        scale: 1.0,
        modes: vec!["fifo".into(), "aioli".into()],
        sweep_granularity_bytes: Vec::new(),
        sweep_aggregators: Vec::new(),
        network: ONE_HOST,
        cluster: Cluster { compute_nodes: procs.max(1), host_cores: 0, client_cpu_ns_per_request: 0 },
        server: Server {
            count: 1,
            device,
            hdd: None,
            profile,
            stripe_bytes: 1 << 40,
            stripe_count: 1,
            cache_bytes: 0,
            cache_block_bytes: 0,
            backlog_max: 1 << 20,
            cpu_ns_per_request: 0,
            scheduler_model: None,
            channels: 1,
            dispatches_inflight: 0,
        },
        forwarders: None,
        client: Client { fs_piece_bytes: SLOT_BYTES, pieces_inflight_max: 16, cb_buffer_bytes: 16 << 20, start_jitter_ns: START_JITTER_NS },
        apps,
        classes: Vec::new(),
        share: Vec::new(),
        bounds: Bounds::default(),
        aioli: AioliOverrides::default(),
    };
    sc.validate().map_err(|e| e.to_string())?;
    Ok(sc)
}

fn twin_app(a: &AppSpec) -> Result<App, String> {
    let pattern = match a.pattern {
        Pattern::Contiguous => sluice_sim::Pattern::Contiguous,
        Pattern::Strided => sluice_sim::Pattern::Strided,
        Pattern::Random => return Err(format!("{}: the simulator has no random pattern", a.name)),
    };
    if !a.shared_file || a.replay.is_some() {
        return Err(format!("{}: only shared-file pattern applications have a twin", a.name));
    }
    Ok(App::posix(a.name.clone(), u64::from(a.procs), if a.op == Dir::Write { OpName::Write } else { OpName::Read }, pattern, a.bytes(), a.granularity))
}

/// Run every workload for real and in the simulator.
pub fn run(cfg: &Config) -> Result<Report, String> {
    let mut rows = Vec::new();
    for w in &cfg.workloads {
        let sc = twin(w, cfg.model.as_ref())?;
        let root = cfg.root.join(w.name.replace(|c: char| !c.is_ascii_alphanumeric(), "-"));
        let run_cfg = RunConfig {
            direct_io: w.direct_io,
            queue_depth: Some(queue_depth(w)),
            write_leases: false,
            seed: cfg.seed,
            progress: cfg.progress,
            ..RunConfig::started(w.scenario.clone(), cfg.policies.clone(), w.device, root, cfg.exe.clone())
        };
        let mut real = Vec::new();
        for i in 0..cfg.runs.max(1) {
            if cfg.progress {
                eprintln!("validate: {} for real, run {} of {} ({})", w.name, i + 1, cfg.runs.max(1), cfg.policies.join(", "));
            }
            let r = runner::run(&run_cfg).map_err(|e| e.to_string());
            let _ = std::fs::remove_dir_all(&run_cfg.root);
            real.push(r?);
        }
        // The twin's device and scheduler costs are the real ones over
        // the throughput gain from one to P in flight (`ModelFile::gain_at`:
        // a device that serves 32 at once may serve them only five times
        // as fast as one; on the emulated disk, depth 1: no gain).
        let gain = cfg.model.as_ref().map_or(1.0, |m| m.gain_at(twin_depth(w, m)));
        // The real device's busy time sums overlapping dispatches; the
        // twin's device serves one at a time with the throughput of P.
        let parallel = f64::from(cfg.model.as_ref().map_or(1, |m| twin_depth(w, m)));
        let requests = requests_of(&w.scenario);
        for (i, policy) in cfg.policies.iter().enumerate() {
            let real_runs: Vec<_> = real.iter().map(|r| &r.runs[i]).collect();
            // The twin's server and processes cost what the real ones did
            // per request (the server's process CPU, and the rest of the
            // machine's, over the run; medians of the runs), on as many
            // shared cores as this machine has.
            let per_request = |s: f64| s * 1e9 / requests.max(1) as f64;
            // The server's CPU that requests queue for is its event loop's:
            // the executor threads' copies overlap the device's time.
            let cpu_ns = median_of(real_runs.iter().filter_map(|r| r.cpu.and_then(|c| c.server_loop_cpu_s.or(c.server_cpu_s))).map(per_request).collect());
            // The processes' CPU is what each worker measured of its own
            // (the machine's busy time less the server's counted anything
            // else that ran meanwhile: one validation charged mix10's
            // processes 1.2 ms a request that way, 13 times another's).
            let client_ns = median_of(real_runs.iter().filter_map(|r| r.cpu.and_then(client_cpu_s)).map(per_request).collect());
            // The time the hypervisor took from this machine's CPUs while
            // they had work (a vCPU woken for a request waits for the host
            // to run it): the twin's cores are unavailable for as long.
            let steal_ns = median_of(real_runs.iter().filter_map(|r| r.cpu.map(|c| c.steal_s)).map(per_request).collect());
            let (srv_ns, cli_ns) = with_steal(cpu_ns.unwrap_or(0.0), client_ns.unwrap_or(0.0), steal_ns.unwrap_or(0.0));
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
            // One twin per real run, its processes started when that
            // run's did (a FIFO server serves them in the order their
            // first requests arrived for the rest of the run), with the
            // cost model that run's server learned.
            let twin_runs = |cpu_ns: u64, client_ns: u64| -> Result<Vec<sluice_sim::RunReport>, String> {
                let mut sc = sc.clone();
                sc.server.cpu_ns_per_request = cpu_ns;
                sc.cluster.client_cpu_ns_per_request = client_ns;
                sc.cluster.host_cores = if cpu_ns + client_ns > 0 { cores } else { 0 };
                real_runs
                    .iter()
                    .zip(1..)
                    .map(|(run, seed)| {
                        let mut sc = sc.clone();
                        as_run(&mut sc, run, gain);
                        let opts = sluice_sim::RunOptions { modes: vec![policy.clone()], seed: Some(seed), ..sluice_sim::RunOptions::default() };
                        Ok(sluice_sim::run(&sc, &opts).map_err(|e| e.to_string())?.0.runs.remove(0))
                    })
                    .collect()
            };
            let (srv_cpu, cli_cpu) = (cpu_ns.map_or(0, |c| c.round() as u64), client_ns.map_or(0, |c| c.round() as u64));
            let (srv_all, cli_all) = (srv_ns.round() as u64, cli_ns.round() as u64);
            let sim = twin_runs(srv_all, cli_all)?;
            let free = twin_runs(0, 0)?;
            // Without steal to charge, the twin without it is `sim` itself.
            let no_steal = if (srv_all, cli_all) == (srv_cpu, cli_cpu) { None } else { Some(twin_runs(srv_cpu, cli_cpu)?) };
            let sim_runs: Vec<_> = sim.iter().collect();
            let r = median_by(&real_runs, |r| r.makespan_s);
            let s = median_by(&sim_runs, |s| s.makespan_s);
            if (&r.mode, &s.mode) != (policy, policy) {
                return Err(format!("{}: the real run ({}) and its twin ({}) are not both {policy}", w.name, r.mode, s.mode));
            }
            let ranges = (range(real_runs.iter().map(|r| r.makespan_s)), range(sim_runs.iter().map(|s| s.makespan_s)));
            let mut row = row(&w.name, r, s, ranges, parallel);
            row.server_cpu_ns = cpu_ns.map(|_| srv_cpu);
            row.client_cpu_ns = client_ns.map(|_| cli_cpu);
            row.steal_ns = steal_ns.map(|c| c.round() as u64);
            row.host_cores = cores;
            row.pairs_s = real_runs.iter().zip(&sim).map(|(r, s)| (r.makespan_s, s.makespan_s)).collect();
            row.pair_error = pair_error(&row.pairs_s).unwrap_or(row.error);
            row.sim_free_cpu_s = median_by(&free.iter().collect::<Vec<_>>(), |s| s.makespan_s).makespan_s;
            row.sim_no_steal_s = no_steal.map_or(s.makespan_s, |n| median_by(&n.iter().collect::<Vec<_>>(), |s| s.makespan_s).makespan_s);
            rows.push(row);
        }
    }
    let real = cfg.workloads.iter().find(|w| w.device == DeviceKind::Real);
    let device_gain = real.zip(cfg.model.as_ref()).map(|(w, m)| m.gain_at(twin_depth(w, m)));
    Ok(Report { target: TARGET, rows, device_model: cfg.model.as_ref().map(|m| m.cost().into()), device_gain })
}

/// Make the twin of `run`: its processes start when the real ones did
/// (its applications are the twin's, in the same order), and its
/// scheduler weighs with the cost model the real server had learned, its
/// costs divided by `gain` as the twin's device's are (1 on the emulated
/// disk).
fn as_run(sc: &mut sluice_sim::Scenario, run: &crate::workload::report::RunReport, gain: f64) {
    for (app, real) in sc.apps.iter_mut().zip(&run.apps) {
        if real.start_offsets_ns.len() as u64 == app.procs {
            app.start_offsets_ns = real.start_offsets_ns.clone();
        }
    }
    if let Some(m) = run.device_model {
        let per = |ns: u64| (ns as f64 / gain.max(1.0)).round() as u64;
        sc.server.scheduler_model = Some(sluice_sim::SchedulerModel { dispatch_ns: per(m.dispatch_ns), byte_ps: m.byte_ps, seek_ns: per(m.seek_ns), parallelism: None });
    }
}

/// The CPU per request the twin charges its server and its processes
/// (ns): what each used, and the time the hypervisor took (`steal`)
/// shared between them as their own CPU is (a core that is not running
/// is unavailable to whichever had work on it). Without CPU to share it
/// by, the steal goes nowhere: the twin then models no CPU.
fn with_steal(server_ns: f64, client_ns: f64, steal_ns: f64) -> (f64, f64) {
    let cpu = server_ns + client_ns;
    if cpu <= 0.0 {
        return (server_ns, client_ns);
    }
    (server_ns + steal_ns * server_ns / cpu, client_ns + steal_ns * client_ns / cpu)
}

/// Request messages the workload's processes send: each application
/// request, cut at the client's shared-memory slot.
/// The applications' processes' CPU seconds in a run: as the workers
/// measured them, else (a report without them) the machine's busy time
/// less the server process's.
fn client_cpu_s(c: crate::workload::cpu::CpuUse) -> Option<f64> {
    c.workers_cpu_s.or_else(|| Some((c.cpu_s - c.steal_s - c.server_cpu_s?).max(0.0)))
}

fn requests_of(sc: &Scenario) -> u64 {
    sc.apps.iter().map(|a| a.bytes().div_ceil(a.granularity.max(1)) * a.granularity.div_ceil(SLOT_BYTES).max(1)).sum()
}

/// The median of each (real, twin) pair's error; None without pairs.
fn pair_error(pairs: &[(f64, f64)]) -> Option<f64> {
    median_of(pairs.iter().map(|&(r, s)| (s - r) / r.max(1e-9)).collect())
}

/// The median of `xs` (the lower one of an even count); None if empty.
fn median_of(mut xs: Vec<f64>) -> Option<f64> {
    xs.sort_by(f64::total_cmp);
    (!xs.is_empty()).then(|| xs[(xs.len() - 1) / 2])
}

/// The element of `xs` with the median key (the lower one of an even
/// count).
fn median_by<'a, T>(xs: &[&'a T], key: impl Fn(&T) -> f64) -> &'a T {
    let mut sorted = xs.to_vec();
    sorted.sort_by(|a, b| key(a).total_cmp(&key(b)));
    sorted[(sorted.len() - 1) / 2]
}

fn range(xs: impl Iterator<Item = f64>) -> (f64, f64) {
    xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| (lo.min(x), hi.max(x)))
}

/// The row of the median real run `r` and twin run `s`, with the
/// ranges (real, twin) of their makespans.
fn row(workload: &str, r: &crate::workload::report::RunReport, s: &sluice_sim::RunReport, (real_range_s, sim_range_s): ((f64, f64), (f64, f64)), parallel: f64) -> Row {
    let error = (s.makespan_s - r.makespan_s) / r.makespan_s.max(1e-9);
    let (worst_app, worst_app_error) = r
        .apps
        .iter()
        .filter_map(|a| s.app(&a.name).map(|b| (a.name.clone(), (b.completion_s - a.completion_s) / a.completion_s.max(1e-9))))
        .fold((String::new(), 0.0f64), |best, x| if x.1.abs() > best.1.abs() { x } else { best });
    let sim_busy = s.device_stats.busy_s;
    let device = r.device_busy_s.map(|b| (sim_busy - b / parallel) / r.makespan_s.max(1e-9));
    let schedule = r.dispatches.map(|d| (s.device_stats.dispatches as f64 - d as f64) / (d.max(1) as f64));
    Row {
        workload: workload.into(),
        policy: r.mode.clone(),
        real_s: r.makespan_s,
        sim_s: s.makespan_s,
        real_range_s,
        sim_range_s,
        pairs_s: Vec::new(),
        error,
        pair_error: error,
        worst_app,
        worst_app_error,
        real_dispatches: r.dispatches,
        sim_dispatches: s.device_stats.dispatches,
        real_device_busy_s: r.device_busy_s,
        sim_device_busy_s: sim_busy,
        real_seeks: r.seeks,
        sim_seeks: s.device_stats.seeks_far + s.device_stats.seeks_near,
        real_holds_windows: r.holds.zip(r.windows),
        sim_holds_windows: (s.device_stats.holds, s.device_stats.windows),
        device,
        cause: cause(
            error,
            device,
            schedule,
            r.seeks.map(|real| (real, s.device_stats.seeks_far + s.device_stats.seeks_near)),
            r.holds.zip(r.windows).map(|real| (real, (s.device_stats.holds, s.device_stats.windows))),
        ),
        server_cpu_ns: None,
        client_cpu_ns: None,
        steal_ns: None,
        host_cores: 0,
        sim_free_cpu_s: s.makespan_s,
        sim_no_steal_s: s.makespan_s,
    }
}

/// Name the component the gap comes from: the device when its busy-time
/// difference explains most of the gap (with the seek counts, real and
/// twin, where they differ by more than a tenth), the schedule when the
/// dispatch counts, or the holds or windows (real, twin), differ by more
/// than a tenth, else the per-request costs the twin does not model.
pub fn cause(error: f64, device: Option<f64>, schedule: Option<f64>, seeks: Option<(u64, u64)>, holds_windows: Option<((u64, u64), (u64, u64))>) -> String {
    if error.abs() <= TARGET {
        return String::new();
    }
    let mut parts = Vec::new();
    if let Some(d) = device {
        if d.abs() >= error.abs() / 2.0 {
            let seeks = match seeks {
                Some((real, twin)) if real.abs_diff(twin) * 10 > real.max(twin) => format!(", {real} seeks real against {twin}"),
                _ => String::new(),
            };
            parts.push(format!("device ({:+.0}% of the makespan in service time{seeks})", d * 100.0));
        }
    }
    let apart = |(a, b): (u64, u64)| a.abs_diff(b) * 10 > a.max(b);
    let waits = holds_windows.filter(|&((rh, rw), (sh, sw))| apart((rh, sh)) || apart((rw, sw)));
    if schedule.is_some_and(|q| q.abs() > 0.1) || waits.is_some() {
        let mut what = Vec::new();
        if let Some(q) = schedule.filter(|q| q.abs() > 0.1) {
            what.push(format!("{:+.0}% dispatches", q * 100.0));
        }
        if let Some(((rh, rw), (sh, sw))) = waits {
            what.push(format!("holds {rh} real against {sh}, windows {rw} against {sw}"));
        }
        parts.push(format!("schedule ({})", what.join("; ")));
    }
    let rest = error - device.unwrap_or(0.0);
    if rest.abs() >= error.abs() / 2.0 || parts.is_empty() {
        // The twin already charges the CPU time the real server and
        // processes spent; what is left is waiting for it (wake-ups and
        // context switches on shared cores) or the network.
        let what = if rest < 0.0 {
            "the real run spends it outside the device, beyond the CPU time the twin charges: waits for a core, wake-ups, the network"
        } else {
            "the twin waits longer outside the device"
        };
        parts.push(format!("{:+.0}% not in device time ({what})", rest * 100.0));
    }
    parts.join("; ")
}

/// The report as a table.
pub fn table(r: &Report) -> String {
    let mut out = format!(
        "{:<38} {:<7} {:>21} {:>21} {:>8} {:>9} {:>19} {:>14} {:>14}  {}\n",
        "workload",
        "policy",
        "real (s): median, range",
        "sim (s): median, range",
        "error",
        "pair err",
        "cpu srv/cli/steal",
        "free cpu: err",
        "no steal: err",
        "where the gap comes from"
    );
    let cell = |m: f64, (lo, hi): (f64, f64)| format!("{m:.3} ({lo:.2}-{hi:.2})");
    for row in &r.rows {
        let within = if row.error.abs() <= r.target { "within 5%".to_string() } else { row.cause.clone() };
        let us = |c: Option<u64>| c.map_or("-".to_string(), |c| format!("{:.0}", c as f64 / 1e3));
        let cpu = format!("{}/{}/{} us", us(row.server_cpu_ns), us(row.client_cpu_ns), us(row.steal_ns));
        let free = (row.sim_free_cpu_s - row.real_s) / row.real_s.max(1e-9);
        let no_steal = (row.sim_no_steal_s - row.real_s) / row.real_s.max(1e-9);
        out += &format!(
            "{:<38} {:<7} {:>23} {:>22} {:>+7.1}% {:>+8.1}% {:>19} {:>+13.1}% {:>+13.1}%  {within}\n",
            row.workload,
            row.policy,
            cell(row.real_s, row.real_range_s),
            cell(row.sim_s, row.sim_range_s),
            row.error * 100.0,
            row.pair_error * 100.0,
            cpu,
            free * 100.0,
            no_steal * 100.0
        );
    }
    if let (Some(m), Some(g)) = (r.device_model, r.device_gain) {
        out += &format!("the real disk's model: {m}; the twin's disk serves at {g:.2}x one in flight\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The twin's processes cost what the workers measured of their own,
    /// whatever else kept the machine busy; a report without that figure
    /// falls back to the machine's busy time less the server's.
    #[test]
    fn the_processes_cpu_is_the_workers_own() {
        let c = crate::workload::cpu::CpuUse {
            cpu_s: 9.0,
            steal_s: 0.0,
            cpu_share: 0.5,
            server_cpu_s: Some(1.0),
            server_loop_cpu_s: None,
            server_us_per_request: None,
            workers_cpu_s: Some(0.25),
        };
        assert_eq!(client_cpu_s(c), Some(0.25));
        assert_eq!(client_cpu_s(crate::workload::cpu::CpuUse { workers_cpu_s: None, ..c }), Some(8.0));
        assert_eq!(client_cpu_s(crate::workload::cpu::CpuUse { workers_cpu_s: None, server_cpu_s: None, ..c }), None);
        assert_eq!(client_cpu_s(crate::workload::cpu::CpuUse { workers_cpu_s: None, cpu_s: 0.5, ..c }), Some(0.0));
        // Time the hypervisor took is no process's.
        assert_eq!(client_cpu_s(crate::workload::cpu::CpuUse { workers_cpu_s: None, steal_s: 3.0, ..c }), Some(5.0));
    }

    /// The time the hypervisor took goes to the server and the processes
    /// as their own CPU does; with no CPU measured it goes nowhere.
    #[test]
    fn steal_is_shared_as_the_cpu_is() {
        assert_eq!(with_steal(30.0, 10.0, 100.0), (105.0, 35.0));
        assert_eq!(with_steal(30.0, 10.0, 0.0), (30.0, 10.0));
        assert_eq!(with_steal(0.0, 20.0, 50.0), (0.0, 70.0));
        assert_eq!(with_steal(0.0, 0.0, 50.0), (0.0, 0.0));
    }

    /// Interference under fifo, as measured at commit 731bc7d (2026-11-25): two twins within 2% of their
    /// runs, one 23% off; the medians (9.76 real, 7.49 twin) are of
    /// different runs, the pairs' median error is that of the middle pair.
    #[test]
    fn the_pair_error_is_the_median_of_each_run_against_its_twin() {
        let pairs = [(11.456, 11.294), (7.618, 7.494), (9.760, 7.494)];
        let e = pair_error(&pairs).unwrap();
        assert!((e - (7.494 - 7.618) / 7.618).abs() < 1e-12, "{e}");
        let medians = (median_of(pairs.iter().map(|p| p.0).collect()).unwrap(), median_of(pairs.iter().map(|p| p.1).collect()).unwrap());
        assert!(((medians.1 - medians.0) / medians.0 + 0.232).abs() < 0.001, "{medians:?}");
        assert_eq!(pair_error(&[]), None);
    }

    #[test]
    fn every_workload_has_a_twin_that_the_simulator_accepts() {
        let model = ModelFile { dispatch_ns: 80_000, byte_ps: 800, seek_ns: 10_000, parallelism: 8, measured: None };
        for w in workloads(1.0) {
            let sc = twin(&w, Some(&model)).unwrap();
            assert_eq!(sc.apps.len(), w.scenario.apps.len());
            let bytes: u64 = sc.apps.iter().map(|a| a.bytes).sum();
            assert_eq!(bytes, w.scenario.apps.iter().map(AppSpec::bytes).sum::<u64>(), "{}: the twin moves the same bytes", w.name);
        }
        // The real disk needs its model.
        let direct = workloads(1.0).into_iter().find(|w| w.device == DeviceKind::Real).unwrap();
        assert!(twin(&direct, None).unwrap_err().contains("calibrate"));
        // Parallelism divides the latency, not the bandwidth: by the
        // parallelism where nothing was measured...
        let sc = twin(&direct, Some(&model)).unwrap();
        let p = sc.server.profile.unwrap();
        assert_eq!((p.access_ns, p.seek_ns, p.bytes_per_s), (10_000, 1_250, 1_250_000_000));
        // ... else by the throughput gain measured up to the parallelism
        // (deeper cells do not count).
        let cell = |depth, ops_per_s| crate::calibrate::DepthCell { depth, ops_per_s };
        let depth = vec![cell(1, 10_000.0), cell(2, 18_000.0), cell(4, 25_000.0), cell(8, 40_000.0), cell(16, 90_000.0)];
        let measured = crate::calibrate::Measured { root: "/".into(), direct: true, latency: Vec::new(), depth, at_depth: Vec::new(), ring: Vec::new() };
        let model = ModelFile { measured: Some(measured), ..model };
        let p = twin(&direct, Some(&model)).unwrap().server.profile.unwrap();
        assert_eq!((p.access_ns, p.seek_ns, p.bytes_per_s), (20_000, 2_500, 1_250_000_000));
        // A device calibrated to gain up to 16 in flight serves the real
        // server, which keeps at most its queue depth (8), at 8's gain.
        let deep = ModelFile { parallelism: 16, ..model.clone() };
        assert_eq!(twin(&direct, Some(&deep)).unwrap().server.profile.unwrap().access_ns, 20_000);
        assert_eq!(twin_depth(&direct, &deep), sluice_server::QUEUE_DEPTH_DEFAULT);
        // A gain under 1 (a device slower in parallel) counts as 1.
        let mut slower = model.clone();
        slower.measured.as_mut().unwrap().depth = vec![cell(1, 10_000.0), cell(8, 5_000.0)];
        assert_eq!(twin(&direct, Some(&slower)).unwrap().server.profile.unwrap().access_ns, 80_000);
    }

    #[test]
    fn each_twin_starts_and_weighs_as_its_real_run_did() {
        use crate::workload::report::{AppReport, DeviceModel, RunReport};
        let w = workloads(1.0).into_iter().find(|w| w.device == DeviceKind::Hdd7200 && w.scenario.apps.len() == 2).unwrap();
        let mut sc = twin(&w, None).unwrap();
        let app = |a: &AppSpec, starts: Vec<u64>| AppReport {
            name: a.name.clone(),
            procs: a.procs,
            bytes: a.bytes(),
            completion_s: 1.0,
            mib_s: 1.0,
            slowdown: None,
            requests_per_dispatch: None,
            start_offsets_ns: starts,
        };
        let (decomp, cat) = (&w.scenario.apps[0], &w.scenario.apps[1]);
        let starts: Vec<u64> = (0..u64::from(decomp.procs)).rev().map(|r| r * 1_000).collect();
        let run = RunReport {
            // A start list of the wrong length (a worker that reported
            // none) leaves the twin's jitter.
            apps: vec![app(decomp, starts.clone()), app(cat, vec![5, 6])],
            device_model: Some(DeviceModel { dispatch_ns: 40_000, byte_ps: 10_000, seek_ns: 6_000_000, parallelism: 8 }),
            ..RunReport::bare("aioli", 1.0)
        };
        // Divided by the device's gain (2), not by the learned depth (8).
        as_run(&mut sc, &run, 2.0);
        assert_eq!(sc.apps[0].start_offsets_ns, starts);
        assert!(sc.apps[1].start_offsets_ns.is_empty());
        assert_eq!(sc.server.scheduler_model, Some(sluice_sim::SchedulerModel { dispatch_ns: 20_000, byte_ps: 10_000, seek_ns: 3_000_000, parallelism: None }));
        sc.validate().unwrap();
    }

    #[test]
    fn the_table_names_the_disk_model_the_twins_used() {
        let model = crate::workload::report::DeviceModel { dispatch_ns: 47_000, byte_ps: 680, seek_ns: 0, parallelism: 32 };
        let with = table(&Report { target: TARGET, rows: Vec::new(), device_model: Some(model), device_gain: Some(2.87) });
        assert!(with.contains("the real disk's model: 47.0 us per dispatch") && with.contains("2.87x"), "{with}");
        let without = table(&Report { target: TARGET, rows: Vec::new(), device_model: None, device_gain: None });
        assert!(!without.contains("model"), "{without}");
    }

    #[test]
    fn the_cause_names_the_larger_share() {
        assert_eq!(cause(0.03, Some(0.5), Some(0.5), None, None), "");
        assert!(cause(-0.30, Some(-0.25), Some(0.0), None, None).starts_with("device (-25%"));
        let c = cause(-0.30, Some(0.0), Some(0.0), None, None);
        assert!(c.starts_with("-30% not in device time") && c.contains("CPU"), "{c}");
        assert!(cause(0.20, Some(0.02), Some(0.5), None, None).contains("schedule (+50% dispatches)"));
        // Seek counts are named when they differ by more than a tenth.
        assert_eq!(cause(-0.20, Some(-0.2), None, Some((100, 90)), None), "device (-20% of the makespan in service time)");
        assert_eq!(cause(-0.20, Some(-0.2), None, Some((100, 89)), None), "device (-20% of the makespan in service time, 100 seeks real against 89)");
        // So are the holds and windows, with the dispatch counts.
        assert_eq!(cause(-0.20, Some(-0.2), Some(0.0), None, Some(((90, 25), (100, 27)))), "device (-20% of the makespan in service time)");
        let c = cause(-0.20, Some(-0.2), Some(0.2), None, Some(((90, 25), (151, 29))));
        assert!(c.ends_with("schedule (+20% dispatches; holds 90 real against 151, windows 25 against 29)"), "{c}");
        let c = cause(-0.20, Some(-0.2), Some(0.0), None, Some(((90, 25), (90, 29))));
        assert!(c.ends_with("schedule (holds 90 real against 90, windows 25 against 29)"), "{c}");
    }
}
