//! # sluice-sim: a discrete-event simulator of parallel I/O
//!
//! `sluice sim` runs a cluster — compute nodes, NICs and a
//! store-and-forward switch, I/O servers with a cache layer and a disk —
//! and the applications on it, in simulated time. Each I/O server owns a
//! [`sluice_core::Scheduler`]: the very policy code `sluice serve` runs,
//! driven with virtual `now` instead of a clock. The model follows
//! PIOsimHD (Kunkel 2009, seed `004_…`); the shipped scenarios mirror the
//! aIOLi evaluation (Lebre et al. 2006, seed `000_…`). See `docs/sim.md`.
//!
//! ```
//! let text = r#"
//! name = "two readers"
//! modes = ["fifo", "aioli"]
//! [network]
//! nic_bytes_per_s = 125_000_000
//! nic_latency_ns = 50_000
//! switch_bytes_per_s = 12_000_000_000
//! [cluster]
//! compute_nodes = 16
//! [server]
//! count = 1
//! device = "hdd7200"
//! [[app]]
//! name = "decomposition"
//! procs = 16
//! op = "read"
//! pattern = "strided"
//! bytes = 4_194_304
//! granularity_bytes = 8192
//! "#;
//! let sc = sluice_sim::Scenario::from_toml(text).unwrap();
//! let report = sluice_sim::run(&sc, &sluice_sim::RunOptions::default()).unwrap().0;
//! let (fifo, aioli) = (&report.runs[0], &report.runs[1]);
//! assert!(aioli.makespan_s < fifo.makespan_s);
//! ```
//!
//! Invariants: a run is a pure function of its scenario and seed (only
//! `wall_s` and `events_per_s` differ between two runs); every table is
//! bounded (events, pieces, messages, backlog, trace); a run that ends with
//! work left, or hits a bound, is an error that carries its seed.

mod client;
mod engine;
mod error;
mod net;
mod plot;
mod report;
mod scenario;
mod server;
mod sim;
mod slab;
mod state;
mod trace;
mod units;
pub mod whatif;
mod workload;

pub use engine::{EventQueue, Rng, Time};
pub use error::{Error, ErrorKind};
pub use plot::sweep_png;
pub use report::{jain, AppReport, DeviceReport, Report, RunReport};
pub use scenario::{
    AioliOverrides, App, Bounds, Cache, Client, Cluster, ForwarderSet, HddFigures, Home, Interface, Mode, Network, OpName, Pattern, ProfileFigures, Recorded, RecordedAccess, Scenario,
    SchedulerModel, Server, SimClass,
};
pub use scenario::{APPS_MAX, BLOCKS_PER_CALL_MAX, CHANNELS_MAX, HOST_CORES_MAX, NODES_MAX, PROCS_MAX, SIM_SERVERS_MAX, SWEEP_POINTS_MAX};
pub use state::{device, LARGE_WORLD_PROCS};
pub use trace::Trace;
pub use units::size;
pub use workload::{stripe_map, Layout, TwoPhase};

/// Command-line overrides of a scenario.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Modes to run (`policy` or `policy/cache`); empty: the scenario's.
    pub modes: Vec<String>,
    pub seed: Option<u64>,
    pub scale: Option<f64>,
    /// Record a Chrome/Perfetto trace.
    pub trace: bool,
    /// Runs (modes x sweep points) at once on host threads; 0 or 1: one
    /// after another. Each run is a world of its own, so the reports are
    /// the same either way, in the same order (only `wall_s` and
    /// `events_per_s`, the host's figures, differ); a traced run goes one
    /// at a time.
    pub jobs: usize,
}

/// Run every mode (and sweep point) of `sc`; returns the report and, when
/// asked, the trace of all runs.
pub fn run(sc: &Scenario, opts: &RunOptions) -> Result<(Report, Option<Trace>), Error> {
    let scale = opts.scale.unwrap_or(sc.scale);
    let base = prepare(sc, opts)?;
    let names = if opts.modes.is_empty() { &base.modes } else { &opts.modes };
    let modes = names.iter().map(|m| Mode::parse(m)).collect::<Result<Vec<_>, _>>()?;
    if let (None, Some(m)) = (&base.forwarders, modes.iter().find(|m| m.home == scenario::Home::Client)) {
        return Err(Error::new(ErrorKind::UnknownMode, format!("mode {:?}: a home per client needs [forwarders]", m.label())));
    }
    // Sweep points: (granularity, aggregators), at most one of them set.
    let points: Vec<(Option<u64>, Option<u64>)> = if !base.sweep_granularity_bytes.is_empty() {
        base.sweep_granularity_bytes.iter().map(|&g| (Some(g), None)).collect()
    } else if !base.sweep_aggregators.is_empty() {
        base.sweep_aggregators.iter().map(|&n| (None, Some(n))).collect()
    } else {
        vec![(None, None)]
    };
    let mut trace = opts.trace.then(|| Trace::new(base.bounds.trace_events_max));
    let scenarios: Vec<Scenario> = points
        .iter()
        .map(|&(g, n)| {
            let mut sc = base.clone();
            if let Some(g) = g {
                sc.apps.iter_mut().filter(|a| a.sweep).for_each(|a| a.granularity_bytes = g);
            }
            if let Some(n) = n {
                sc.apps.iter_mut().filter(|a| a.sweep).for_each(|a| a.aggregators = n);
            }
            sc
        })
        .collect();
    // Every run, in report order: (point, mode).
    let tasks: Vec<(usize, &Mode)> = (0..points.len()).flat_map(|p| modes.iter().map(move |m| (p, m))).collect();
    let one = |(p, m): (usize, &Mode), trace: Option<&mut Trace>| -> Result<RunReport, Error> {
        let mut r = sim::run_once(&scenarios[p], m, points[p].0, trace)?;
        r.aggregators = points[p].1;
        Ok(r)
    };
    let jobs = opts.jobs.clamp(1, tasks.len().max(1));
    let runs = if jobs == 1 || trace.is_some() {
        tasks.iter().map(|&t| one(t, trace.as_mut())).collect::<Result<Vec<_>, _>>()?
    } else {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let done: std::sync::Mutex<Vec<Option<Result<RunReport, Error>>>> = std::sync::Mutex::new(tasks.iter().map(|_| None).collect());
        std::thread::scope(|s| {
            for _ in 0..jobs {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&t) = tasks.get(i) else { break };
                    let r = one(t, None);
                    done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
                });
            }
        });
        done.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().map(|r| r.expect("every task ran")).collect::<Result<Vec<_>, _>>()?
    };
    let report = Report { scenario: base.name.clone(), device: device_name(&base), direct_io: false, scale, seed: base.seed, runs };
    Ok((report, trace))
}

/// Apply the overrides and the scale factor, then validate.
fn prepare(sc: &Scenario, opts: &RunOptions) -> Result<Scenario, Error> {
    let mut s = sc.clone();
    if let Some(seed) = opts.seed {
        s.seed = seed;
    }
    if let Some(scale) = opts.scale {
        s.scale = scale;
    }
    s.validate()?;
    for a in s.apps.iter_mut().filter(|a| a.recorded.is_none()) {
        a.bytes = ((a.bytes as f64 * s.scale).round() as u64).max(1);
    }
    // The seed's aggregator choice, on the scaled sizes: equal shares.
    for a in s.apps.iter_mut().filter(|a| a.k_bytes > 0) {
        let share = a.bytes.div_ceil(a.procs);
        a.aggregators = workload::choose_groups(&vec![share; a.procs as usize], a.k_bytes).len() as u64;
    }
    s.scale = 1.0;
    Ok(s)
}

fn device_name(sc: &Scenario) -> String {
    let s = &sc.server;
    let what = match (&s.hdd, &s.profile) {
        (Some(h), _) if s.device == "hdd" => {
            format!("hdd (far {} ms, near {} ms, {} MB/s)", h.seek_far_ns as f64 / 1e6, h.seek_near_ns as f64 / 1e6, h.bytes_per_s / 1_000_000)
        }
        (_, Some(p)) if s.device == "profile" => format!("profile ({} us, {} MB/s)", p.access_ns / 1000, p.bytes_per_s / 1_000_000),
        _ => s.device.clone(),
    };
    format!("simulated {what} x{}", s.count)
}

/// Events the speed benchmark may take per request before its run fails
/// at `events_max`: it takes about 6.1 (10,000 processes, 200 requests
/// each: 12.1 M events; 8.1 before a message crossed the receiver's NIC
/// with the switch, 10.5 before it crossed its sender's when sent).
pub const BENCH_EVENTS_PER_REQUEST_MAX: u64 = 32;

/// The speed benchmark's scenario: `procs` synchronous processes on
/// `procs / 10` nodes reading 64 KiB pieces of their own files, spread
/// over `procs / 100` SSD servers (files striped over all of them);
/// `requests` requests per process. Its event bound grows with its size
/// (`BENCH_EVENTS_PER_REQUEST_MAX` a request, at least the default): the
/// default 2 G events stopped 1,000,000 processes x 200 requests, which
/// need about 2.1 G, at 12.5 s of simulated time.
pub fn bench_scenario(procs: u64, requests: u64) -> Scenario {
    let nodes = (procs / 10).max(1);
    let servers = (procs / 100).clamp(1, scenario::SIM_SERVERS_MAX);
    let apps = (0..100u64.min(procs))
        .map(|i| App {
            think_ns: 100_000,
            ..App::posix(
                format!("bench-{i}"),
                procs / 100.min(procs) + u64::from(i < procs % 100.min(procs)),
                if i % 2 == 0 { OpName::Read } else { OpName::Write },
                if i % 3 == 0 { Pattern::Strided } else { Pattern::Contiguous },
                (procs / 100.min(procs) + 1) * requests * 65_536,
                65_536,
            )
        })
        .collect();
    Scenario {
        name: format!("bench-{procs}"),
        description: "speed benchmark".into(),
        seed: 1,
        scale: 1.0,
        modes: vec!["fifo".into(), "aioli".into()],
        sweep_granularity_bytes: Vec::new(),
        sweep_aggregators: Vec::new(),
        network: Network {
            nic_bytes_per_s: 125_000_000,
            nic_latency_ns: 50_000,
            switch_bytes_per_s: 1_000_000_000_000,
            switch_latency_ns: 0,
            packet_bytes: 1500,
            header_bytes: 128,
        },
        cluster: Cluster { compute_nodes: nodes, host_cores: 0, client_cpu_ns_per_request: 0 },
        server: Server {
            count: servers,
            device: "ssd".into(),
            hdd: None,
            profile: None,
            stripe_bytes: 1 << 20,
            stripe_count: servers,
            cache_bytes: 0,
            cache_block_bytes: 0,
            backlog_max: 1 << 20,
            cpu_ns_per_request: 0,
            scheduler_model: None,
            channels: 1,
            dispatches_inflight: 0,
        },
        forwarders: None,
        client: Client { fs_piece_bytes: 0, pieces_inflight_max: 16, cb_buffer_bytes: 16 << 20, start_jitter_ns: 1_000_000 },
        apps,
        classes: Vec::new(),
        share: Vec::new(),
        bounds: Bounds { events_max: Bounds::default().events_max.max(procs.saturating_mul(requests).saturating_mul(BENCH_EVENTS_PER_REQUEST_MAX)), ..Bounds::default() },
        aioli: AioliOverrides::default(),
    }
}
