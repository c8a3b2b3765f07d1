//! Runs a scenario: prepares the files, then for each mode starts the
//! server (unless direct or external), the worker processes, a common
//! start, and collects completion times.

use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sluice_server::{DeviceKind, Listen, Server, ServerConfig};

use super::cpu::{CpuSample, CpuUse};
use super::pattern::AppSpec;
use super::replay::ReplayLog;
use super::report::{jain, AppReport, Report, RunReport};
use super::scenario::Scenario;
use super::worker::{monotonic_ns, Target, WorkerResult, WorkerSpec, SPEC_ENV};
use super::WorkloadError;

/// How long workers may take to open their files and say `ready`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Chunk used to fill files before timing.
const FILL_CHUNK_BYTES: usize = 1 << 20;

/// What to run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub scenario: Scenario,
    /// `direct` and/or policy names.
    pub modes: Vec<String>,
    pub direct_io: bool,
    pub device: DeviceKind,
    /// Scratch directory holding the files (and the server's root).
    pub root: PathBuf,
    /// An external server: no server is started, files are made through it.
    pub server: Option<String>,
    pub queue_depth: Option<u32>,
    /// The started servers hand blocking dispatches to io_uring
    /// (`ServerConfig::uring`).
    pub uring: bool,
    /// ... through a kernel polling thread (`ServerConfig::sqpoll_idle_ms`).
    pub sqpoll_idle_ms: Option<u32>,
    /// The started servers grant write leases (`ServerConfig::write_leases`):
    /// buffered writes are then made by the ranks themselves.
    pub write_leases: bool,
    /// Also run every application alone, for slowdowns.
    pub alone: bool,
    pub seed: u64,
    /// The `sluice` executable to start workers with.
    pub exe: PathBuf,
    pub scale: f64,
    /// Set on runs of a granularity sweep.
    pub granularity: Option<u64>,
    pub progress: bool,
    /// The path the ranks' I/O takes to a started server (`Via`).
    pub via: Via,
    /// The started servers learn the emulated disk from scratch
    /// (`ServerConfig::no_prior`).
    pub no_prior: bool,
    /// Ranks that write through a page cache (`direct_io` off) `fsync`
    /// before they report, so the makespan is the time to durable data
    /// (`RunConfig::fsyncs`).
    pub durable: bool,
    /// Servers started per policy over the one root, reached as a
    /// forwarder set (`sluice_remote::Forwarders`); with an emulated disk
    /// they share one (`ServerConfig::device_shared`). 1: one server.
    pub forwarders: u32,
    /// The ranks pick a forwarder by client, not by file (`SLUICE_HOME=client`).
    pub home_per_client: bool,
    /// Service classes of the started servers (`sluice serve --qos`).
    pub qos: Option<sluice_server::qos::QosRules>,
    /// Sample each application's bytes on the started server every this
    /// many milliseconds during the run (`RunReport::samples`); 0: never.
    pub sample_ms: u64,
    /// Each started server writes its live trace to DIR/POLICY.json
    /// (`sluice serve --trace`); else `SLUICE_BENCH_TRACE=DIR` does.
    pub trace_dir: Option<PathBuf>,
}

impl RunConfig {
    /// A run of `scenario` in `modes` on servers started over `root` with
    /// `device`, workers started from `exe`; everything else as a
    /// benchmark usually runs: the client library, one server, no service
    /// classes, io_uring and write leases on, one dispatch in flight on the
    /// emulated disk, seed 1, unscaled, no progress bar, no `fsync`.
    pub fn started(scenario: Scenario, modes: Vec<String>, device: DeviceKind, root: PathBuf, exe: PathBuf) -> RunConfig {
        RunConfig {
            scenario,
            modes,
            direct_io: false,
            device,
            root,
            server: None,
            queue_depth: (device == DeviceKind::Hdd7200).then_some(1),
            uring: true,
            sqpoll_idle_ms: None,
            write_leases: true,
            alone: false,
            seed: 1,
            exe,
            scale: 1.0,
            granularity: None,
            progress: false,
            via: Via::Library,
            no_prior: false,
            durable: false,
            forwarders: 1,
            home_per_client: false,
            qos: None,
            sample_ms: 0,
            trace_dir: None,
        }
    }

    /// Whether the ranks' writes are followed by an `fsync`: asked for,
    /// and not O_DIRECT (whose writes are on the device already).
    fn fsyncs(&self) -> bool {
        self.durable && !self.direct_io
    }
}

/// The path a rank's I/O takes to the service: the path of a program
/// written for sluice, or one of the two that unmodified programs take.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Via {
    /// The client library, called by the rank itself.
    #[default]
    Library,
    /// Plain `pread`/`pwrite` under the interposer (`sluice run`): the
    /// preload library at this path.
    Run(PathBuf),
    /// Plain `pread`/`pwrite` on a real FUSE mount of the started server
    /// (`sluice mount`, started as a child process).
    Mount,
}

impl Via {
    /// The name `--via` takes.
    pub fn name(&self) -> &'static str {
        match self {
            Via::Library => "library",
            Via::Run(_) => "run",
            Via::Mount => "mount",
        }
    }
}

/// Run every mode over the scenario.
pub fn run(cfg: &RunConfig) -> Result<Report, WorkloadError> {
    if cfg.device == DeviceKind::Hdd7200 && cfg.modes.iter().any(|m| m == "direct") {
        return Err(WorkloadError::usage("the direct mode cannot emulate a disk: with --device hdd7200, fifo is the no-scheduler baseline".into()));
    }
    prepare(cfg)?;
    let mut runs = Vec::new();
    let mut caches_dropped = true;
    for mode in &cfg.modes {
        caches_dropped &= drop_caches();
        let mut run = run_mode(cfg, mode, &cfg.scenario.apps)?;
        if cfg.alone {
            for (i, app) in cfg.scenario.apps.iter().enumerate() {
                caches_dropped &= drop_caches();
                let alone = run_mode(cfg, mode, std::slice::from_ref(app))?;
                run.apps[i].slowdown = Some(run.apps[i].completion_s / alone.apps[0].completion_s.max(1e-9));
            }
        }
        runs.push(run);
    }
    let device = match cfg.device {
        DeviceKind::Real => "real",
        DeviceKind::Hdd7200 => "hdd7200",
        DeviceKind::Null => "null",
    };
    Ok(Report {
        scenario: cfg.scenario.name.clone(),
        device: device.into(),
        direct_io: cfg.direct_io,
        caches_dropped,
        scale: cfg.scale,
        via: cfg.via.name().into(),
        durable: cfg.fsyncs(),
        runs,
    })
}

/// Create and fill every file (before any timing).
fn prepare(cfg: &RunConfig) -> Result<(), WorkloadError> {
    std::fs::create_dir_all(&cfg.root).map_err(|e| WorkloadError::io(format!("create {}", cfg.root.display()), e))?;
    let chunk: Vec<u8> = (0..FILL_CHUNK_BYTES).map(|i| (i % 251) as u8).collect();
    for app in &cfg.scenario.apps {
        if let Some(log) = &app.replay {
            // A recorded log's files: sparse, at the size its accesses reach.
            for (name, size) in ReplayLog::load(log)?.files {
                match &cfg.server {
                    None => size_local(&cfg.root.join(&name), size)?,
                    Some(addr) => size_remote(addr, &name, size)?,
                }
            }
            continue;
        }
        for (name, size) in app.files() {
            match &cfg.server {
                None => fill_local(&cfg.root.join(&name), size, &chunk)?,
                Some(addr) => fill_remote(addr, &name, size, &chunk)?,
            }
        }
    }
    Ok(())
}

fn size_local(path: &Path, size: u64) -> Result<(), WorkloadError> {
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(|e| WorkloadError::io(format!("create {}", path.display()), e))?;
    f.set_len(size).map_err(|e| WorkloadError::io(format!("size {}", path.display()), e))
}

fn size_remote(addr: &str, name: &str, size: u64) -> Result<(), WorkloadError> {
    let c = sluice_remote::Remote::connect(addr).map_err(WorkloadError::client)?;
    let fd = c.open(name, libc::O_RDWR | libc::O_CREAT, 0o644).map_err(WorkloadError::client)?;
    c.ftruncate(fd, size).map_err(WorkloadError::client)?;
    c.close(fd).map_err(WorkloadError::client)
}

fn fill_local(path: &Path, size: u64, chunk: &[u8]) -> Result<(), WorkloadError> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() == size) {
        return Ok(());
    }
    let err = |e| WorkloadError::io(format!("fill {}", path.display()), e);
    let mut f = std::fs::File::create(path).map_err(err)?;
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).map_err(err)?;
        left -= n as u64;
    }
    f.sync_all().map_err(err)
}

fn fill_remote(addr: &str, name: &str, size: u64, chunk: &[u8]) -> Result<(), WorkloadError> {
    let c = sluice_remote::Remote::connect(addr).map_err(WorkloadError::client)?;
    let fd = c.open(name, libc::O_RDWR | libc::O_CREAT, 0o644).map_err(WorkloadError::client)?;
    let mut at = 0;
    while at < size {
        let n = (size - at).min(chunk.len() as u64) as usize;
        c.pwrite(fd, &chunk[..n], at).map_err(WorkloadError::client)?;
        at += n as u64;
    }
    c.fsync(fd).map_err(WorkloadError::client)?;
    c.close(fd).map_err(WorkloadError::client)
}

/// Drop the page cache (needs root); says whether it could.
fn drop_caches() -> bool {
    // SAFETY: sync() has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

/// One mode over `apps`, all started together.
fn run_mode(cfg: &RunConfig, mode: &str, apps: &[AppSpec]) -> Result<RunReport, WorkloadError> {
    let mut servers = Vec::new();
    let mut mounted = None;
    let target = match (mode, &cfg.server) {
        ("direct", _) => Target::Direct { root: cfg.root.clone(), direct_io: cfg.direct_io },
        (_, Some(addr)) => via_target(cfg, addr, mode, &mut mounted)?,
        (policy, None) => {
            servers = start_servers(cfg, policy)?;
            let addr = servers.iter().map(|s| s.addr().to_string()).collect::<Vec<_>>().join(",");
            via_target(cfg, &addr, policy, &mut mounted)?
        }
    };
    let label = mode.to_string();
    let (timed, samples) = match servers.first().filter(|_| cfg.sample_ms > 0) {
        Some(first) => sampled(cfg.sample_ms, first, || run_workers(cfg, apps, &target, &label)),
        None => (run_workers(cfg, apps, &target, &label), Vec::new()),
    };
    drop(mounted);
    let started = !servers.is_empty();
    let stats = started.then(|| summed_stats(servers.iter().map(|s| s.stats())));
    let (mut device_model, mut dispatches, mut device_busy_s, mut seeks) = (None, None, None, None);
    let (mut holds, mut windows) = (None, None);
    for mut s in servers {
        let summary = s.shutdown().map_err(|e| WorkloadError::usage(format!("server shutdown: {e}")))?;
        device_model = device_model.or(summary.device_model.map(Into::into));
        let add = |x: Option<u64>, y: u64| Some(x.unwrap_or(0) + y);
        dispatches = add(dispatches, summary.scheduler.dispatches);
        device_busy_s = Some(device_busy_s.unwrap_or(0.0) + summary.device_busy_ns as f64 / 1e9);
        seeks = add(seeks, summary.device_seeks);
        (holds, windows) = (add(holds, summary.scheduler.holds), add(windows, summary.scheduler.windows));
    }
    let Timed { done: times, starts, mut cpu } = timed?;
    if let (Some(c), false) = (&mut cpu, started) {
        (c.server_cpu_s, c.server_loop_cpu_s) = (None, None);
    }
    let apps: Vec<AppReport> = apps
        .iter()
        .zip(times)
        .zip(starts)
        .map(|((a, t), start_offsets_ns)| {
            let rpd = stats.as_ref().and_then(|st| st.iter().find(|s| s.name == a.name)).filter(|s| s.dispatches > 0);
            AppReport {
                name: a.name.clone(),
                procs: a.procs,
                bytes: a.bytes(),
                completion_s: t,
                mib_s: a.bytes() as f64 / 1048576.0 / t.max(1e-9),
                slowdown: None,
                requests_per_dispatch: rpd.map(|s| s.requests as f64 / s.dispatches as f64),
                start_offsets_ns,
            }
        })
        .collect();
    let makespan_s = apps.iter().map(|a| a.completion_s).fold(0.0, f64::max);
    let jain = jain(&apps.iter().map(|a| a.mib_s).collect::<Vec<_>>());
    Ok(RunReport { mode: mode.into(), granularity: cfg.granularity, makespan_s, jain, apps, device_model, dispatches, device_busy_s, seeks, holds, windows, cpu, samples })
}

/// Run `work`, sampling `server`'s per-application bytes every `every_ms`
/// meanwhile (at most one sample a millisecond apart; the first at the
/// start).
fn sampled<T: Send>(every_ms: u64, server: &sluice_server::ServerHandle, work: impl FnOnce() -> T + Send) -> (T, super::report::Samples) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let t0 = Instant::now();
            let mut out = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let now = server.stats().into_iter().map(|a| (a.name, a.bytes_read + a.bytes_written)).collect();
                out.push((t0.elapsed().as_secs_f64(), now));
                std::thread::sleep(Duration::from_millis(every_ms.max(1)));
            }
            out
        });
        let r = work();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (r, sampler.join().unwrap_or_default())
    })
}

/// The target of the ranks for a server at `addr`, as `cfg.via` says; a
/// mount is started into `mounted` (and stopped when it is dropped).
fn via_target(cfg: &RunConfig, addr: &str, mode: &str, mounted: &mut Option<super::mount::Mounted>) -> Result<Target, WorkloadError> {
    Ok(match &cfg.via {
        Via::Library => Target::Service { addr: addr.to_string() },
        Via::Run(lib) => Target::Preload { addr: addr.to_string(), lib: lib.clone(), prefix: PathBuf::from(PRELOAD_PREFIX), direct_io: cfg.direct_io },
        Via::Mount => {
            let dir = std::env::temp_dir().join(format!("sluice-bench-mnt-{}-{mode}", std::process::id()));
            let m = super::mount::Mounted::start(&cfg.exe, addr, &dir)?;
            let root = m.dir().to_path_buf();
            *mounted = Some(m);
            Target::Direct { root, direct_io: cfg.direct_io }
        }
    })
}

/// Where the ranks under the interposer see the server's root.
const PRELOAD_PREFIX: &str = "/sluice-bench";

/// Each application's counters summed over the servers that served it.
fn summed_stats(per_server: impl Iterator<Item = Vec<sluice_client::AppStats>>) -> Vec<sluice_client::AppStats> {
    let mut out: Vec<sluice_client::AppStats> = Vec::new();
    for a in per_server.flatten() {
        match out.iter_mut().find(|o| o.name == a.name) {
            Some(o) => {
                o.requests += a.requests;
                o.dispatches += a.dispatches;
                o.bytes_read += a.bytes_read;
                o.bytes_written += a.bytes_written;
            }
            None => out.push(a),
        }
    }
    out
}

/// The servers of one policy: one, or `cfg.forwarders` over the one root
/// (sharing one emulated disk when the device is emulated).
fn start_servers(cfg: &RunConfig, policy: &str) -> Result<Vec<sluice_server::ServerHandle>, WorkloadError> {
    let n = cfg.forwarders.max(1);
    let disk = (n > 1 && cfg.device == DeviceKind::Hdd7200).then(|| std::env::temp_dir().join(format!("sluice-bench-{}-{policy}.disk", std::process::id())));
    let servers = (0..n).map(|k| start_server(cfg, policy, (n > 1).then_some(k), disk.as_deref())).collect();
    if let Some(d) = &disk {
        // Each server holds the file open; its name is no longer needed.
        let _ = std::fs::remove_file(d);
    }
    servers
}

fn start_server(cfg: &RunConfig, policy: &str, forwarder: Option<u32>, disk: Option<&Path>) -> Result<sluice_server::ServerHandle, WorkloadError> {
    let config = sluice_core::PolicyConfig::from_name(policy)
        .ok_or_else(|| WorkloadError::usage(format!("unknown mode {policy:?} (direct or one of {})", sluice_core::POLICY_NAMES.join(", "))))?;
    let which = forwarder.map_or(String::new(), |k| format!("-f{k}"));
    let sock = std::env::temp_dir().join(format!("sluice-bench-{}-{policy}{which}.sock", std::process::id()));
    let mut sc = ServerConfig::new(&cfg.root, Listen::Unix(sock));
    sc.device_shared = disk.map(Path::to_path_buf);
    sc.qos = cfg.qos.clone();
    sc.policy = config;
    sc.direct = cfg.direct_io;
    sc.device = cfg.device;
    sc.uring = cfg.uring;
    sc.sqpoll_idle_ms = cfg.sqpoll_idle_ms;
    sc.write_leases = cfg.write_leases;
    sc.no_prior = cfg.no_prior;
    if let Some(q) = cfg.queue_depth {
        sc.queue_depth = q;
    }
    // `trace_dir`, or as a debugging aid `SLUICE_BENCH_TRACE=DIR`: every
    // started server writes its live trace to DIR/POLICY.json (docs/bench.md).
    if let Some(dir) = cfg.trace_dir.clone().or_else(|| std::env::var_os("SLUICE_BENCH_TRACE").map(std::path::PathBuf::from)) {
        std::fs::create_dir_all(&dir).map_err(|e| WorkloadError::io(format!("trace directory {}", dir.display()), e))?;
        sc.trace = Some(dir.join(format!("{policy}{which}.json")));
    }
    Server::start(sc).map_err(|e| WorkloadError::usage(format!("starting the {policy} server: {e}")))
}

/// Kills every worker still running when dropped (error paths included).
struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

enum Event {
    Ready,
    Done(usize, Instant, WorkerResult),
    Failed(usize, String),
}

/// What `run_workers` measured.
struct Timed {
    /// Each application's completion time (s).
    done: Vec<f64>,
    /// Each application's ranks' starts after the `go` (ns).
    starts: Vec<Vec<u64>>,
    /// CPU used from the start until the last worker finished.
    cpu: Option<CpuUse>,
}

/// Start one worker per rank, release them together, and return what
/// each application took and when each rank started.
fn run_workers(cfg: &RunConfig, apps: &[AppSpec], target: &Target, label: &str) -> Result<Timed, WorkloadError> {
    let (tx, rx) = mpsc::channel();
    let mut workers = Workers(Vec::new());
    let mut stdins: Vec<ChildStdin> = Vec::new();
    let mut owner = Vec::new();
    for (ai, app) in apps.iter().enumerate() {
        for rank in 0..app.procs {
            let spec = WorkerSpec { app: app.clone(), rank, seed: cfg.seed, target: target.clone(), durable: cfg.fsyncs() };
            let mut cmd = Command::new(&cfg.exe);
            cmd.args(["bench", "worker"]).env(SPEC_ENV, serde_json::to_string(&spec).expect("spec serialises"));
            // The mount and the interposer name a process's application
            // by the client's one rule, which reads SLUICE_APP first.
            cmd.env(sluice_client::APP_ENV, &app.name);
            if cfg.home_per_client {
                cmd.env(sluice_remote::HOME_ENV, "client");
            }
            if let Some(uid) = app.uid {
                std::os::unix::process::CommandExt::uid(&mut cmd, uid);
                std::os::unix::process::CommandExt::gid(&mut cmd, uid);
            }
            if let Target::Preload { addr, lib, prefix, .. } = target {
                cmd.env("LD_PRELOAD", lib).env(sluice_client::SERVER_ENV, addr).env(sluice_client::PREFIX_ENV, prefix);
            }
            let mut child =
                cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| WorkloadError::io(format!("start worker {}", cfg.exe.display()), e))?;
            stdins.push(child.stdin.take().expect("piped"));
            watch(owner.len(), child.stdout.take().expect("piped"), child.stderr.take().expect("piped"), tx.clone());
            owner.push(ai);
            workers.0.push(child);
        }
    }
    drop(tx);
    let n = owner.len();
    for _ in 0..n {
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(Event::Ready) => {}
            Ok(Event::Failed(w, msg)) => return Err(WorkloadError::usage(format!("worker {w} failed before the start: {msg}"))),
            Ok(Event::Done(..)) | Err(_) => return Err(WorkloadError::usage("workers did not get ready in time".into())),
        }
    }
    let cpu0 = CpuSample::now();
    let t0 = Instant::now();
    let t0_ns = monotonic_ns();
    for s in &mut stdins {
        s.write_all(b"go\n").map_err(|e| WorkloadError::io("start signal".into(), e))?;
    }
    drop(stdins);
    let mut done = vec![0.0f64; apps.len()];
    let mut moved = vec![0u64; apps.len()];
    let mut starts: Vec<Vec<u64>> = apps.iter().map(|a| vec![0; a.procs as usize]).collect();
    let first_worker: Vec<usize> = apps.iter().scan(0, |n, a| Some(std::mem::replace(n, *n + a.procs as usize))).collect();
    let mut cpu = None;
    let mut workers_cpu_ns = 0u64;
    for finished in 1..=n {
        match rx.recv() {
            Ok(Event::Done(w, at, r)) => {
                done[owner[w]] = done[owner[w]].max((at - t0).as_secs_f64());
                moved[owner[w]] += r.bytes;
                starts[owner[w]][w - first_worker[owner[w]]] = r.start_ns.saturating_sub(t0_ns);
                workers_cpu_ns += r.cpu_ns;
            }
            Ok(Event::Failed(w, msg)) => return Err(WorkloadError::usage(format!("worker {w} ({}) failed: {msg}", apps[owner[w]].name))),
            Ok(Event::Ready) | Err(_) => return Err(WorkloadError::usage("a worker vanished".into())),
        }
        if finished == n {
            cpu = cpu0.zip(CpuSample::now()).map(|(a, b)| CpuUse { workers_cpu_s: Some(workers_cpu_ns as f64 / 1e9), ..a.until(&b) });
        }
        if cfg.progress && std::io::stderr().is_terminal() {
            eprint!("\r  {label:<12} [{:<30}] {finished}/{n} processes done", "#".repeat(finished * 30 / n));
        }
    }
    if cfg.progress {
        eprintln!("\r  {label:<12} [{}] {n}/{n} processes done in {:.2} s", "#".repeat(30), t0.elapsed().as_secs_f64());
    }
    for (a, m) in apps.iter().zip(&moved) {
        if *m != a.bytes() {
            return Err(WorkloadError::usage(format!("{} moved {m} bytes, expected {}", a.name, a.bytes())));
        }
    }
    Ok(Timed { done, starts, cpu })
}

/// A thread per worker turning its output into events.
fn watch(w: usize, stdout: impl Read + Send + 'static, mut stderr: impl Read + Send + 'static, tx: mpsc::Sender<Event>) {
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let failed = |stderr: &mut dyn Read| {
            let mut msg = String::new();
            let _ = stderr.read_to_string(&mut msg);
            Event::Failed(w, msg.trim().to_string())
        };
        match lines.next() {
            Some(Ok(l)) if l == "ready" => {
                let _ = tx.send(Event::Ready);
            }
            _ => {
                let _ = tx.send(failed(&mut stderr));
                return;
            }
        }
        let ev = match lines.next() {
            Some(Ok(l)) => match serde_json::from_str::<WorkerResult>(&l) {
                Ok(r) => Event::Done(w, Instant::now(), r),
                Err(_) => failed(&mut stderr),
            },
            _ => failed(&mut stderr),
        };
        let _ = tx.send(ev);
    });
}
