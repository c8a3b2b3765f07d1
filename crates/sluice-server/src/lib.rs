//! # sluice-server: the I/O service behind `sluice serve`
//!
//! An I/O forwarding daemon in front of one directory. Every connection's
//! reads and writes go into one [`sluice_core::Scheduler`], driven by a
//! single event-loop thread with a monotonic clock; each of the scheduler's
//! dispatches is one `preadv`/`pwritev` straight into or out of the
//! requests' buffers, on the loop itself when the page cache serves it
//! without blocking, otherwise on a small executor (`queue_depth` workers).
//!
//! ```no_run
//! use sluice_server::{Listen, Server, ServerConfig};
//!
//! let cfg = ServerConfig::new("/srv/data", Listen::parse("unix:/tmp/sluice.sock").unwrap());
//! let mut server = Server::start(cfg).unwrap();
//! println!("listening on {}", server.addr());
//! let summary = server.shutdown().unwrap(); // drain: finish in-flight, close
//! print!("{}", sluice_server::summary_table(&summary.apps));
//! ```
//!
//! Threads: one event loop (every connection, and the scheduler; it also
//! carries out dispatches the page cache can serve without blocking);
//! `queue_depth` executor workers; `META_THREADS` metadata workers. The
//! count does not grow with connections.
//!
//! Invariants: no path leaves the root (see [`root`]); the server never
//! panics on input, and a malformed frame closes only its connection;
//! every queue and table has a named bound ([`ServerLimits`], the core's
//! `Limits`) and going past one is an error reply, never a silent drop.

mod clock;
mod collective;
mod config;
mod conn;
mod disk;
mod dispatch;
mod error;
mod evloop;
mod exec;
pub mod ident;
mod idhash;
mod lease;
mod meta;
pub mod metrics;
mod net;
mod ops;
mod order;
mod pending;
pub mod qos;
mod ring;
pub mod root;
mod shared;
mod shm;
mod state;
mod storage;
mod sync;
pub mod trace;
mod view;
mod waker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use sluice_core::Scheduler;
use sluice_device::Hdd;
use sluice_proto::AppStats;

pub use config::{DeviceKind, Listen, ServerConfig, ServerLimits, StorageRef, DIRECT_ALIGN_BYTES, QUEUE_DEPTH_DEFAULT, QUEUE_DEPTH_MAX, SQPOLL_IDLE_MS_MAX};
pub use dispatch::requests_answered;
pub use error::{Error, ErrorKind, Result};
pub use ident::{Squash, ANON_ID};
pub use storage::{Storage, Syscalls};

pub use meta::META_THREADS;

use dispatch::Dispatcher;
use evloop::{EventLoop, Workers};
use exec::Executor;
use shared::Shared;
use sluice_net::Listener;
use sync::lock;
use waker::Waker;

/// Where the cost learner starts when no calibrated model is given: on the
/// emulated disk, the figures it emulates (the server knows that device
/// as the simulator knows its own), so its first decisions already see a
/// disk's seeks; elsewhere the learner's generic prior.
fn emulated_prior(device: DeviceKind) -> Option<sluice_core::DeviceCost> {
    (device == DeviceKind::Hdd7200).then(|| sluice_device::DeviceModel::cost_parts(&Hdd::hdd7200()).cost(1))
}

/// What the server did, returned by [`ServerHandle::shutdown`].
#[derive(Clone, Debug)]
pub struct Summary {
    pub apps: Vec<AppStats>,
    pub scheduler: sluice_core::Stats,
    /// The device cost model learned (or given and refined), if any.
    pub device_model: Option<sluice_core::DeviceCost>,
    /// Sum of the dispatches' service times (overlapping ones each count).
    pub device_busy_ns: u64,
    /// Dispatches that did not continue the previous one (a seek on a
    /// disk).
    pub device_seeks: u64,
}

/// The service. See the crate documentation.
pub struct Server;

/// A running server; dropping it drains it too.
pub struct ServerHandle {
    shared: Arc<Shared>,
    addr: String,
    waker: Arc<Waker>,
    event_loop: Option<JoinHandle<dispatch::Ended>>,
    workers: Vec<JoinHandle<()>>,
    socket_path: Option<std::path::PathBuf>,
    metrics: Option<metrics::Endpoint>,
    /// The live trace's switch and its full flag (`ServerConfig::trace`).
    tracing: Option<(Arc<AtomicBool>, Arc<AtomicBool>)>,
    /// Whether the event loop hands blocking dispatches to io_uring.
    uring: bool,
    /// Whether a kernel thread polls that ring's submissions.
    sqpoll: bool,
}

impl Server {
    /// Bind, spawn the threads and return once the server accepts.
    pub fn start(config: ServerConfig) -> Result<ServerHandle> {
        config.validate()?;
        let root = root::Root::open(&config.root)?;
        let key = load_key(&config)?;
        let (listener, addr, socket_path) = bind(&config.listen)?;
        let mut limits = config.sched_limits.clone();
        limits.dispatches_inflight_max = config.queue_depth;
        let limits = limits.clamped();
        let (policy, apps_max, prior) = (config.policy.clone(), limits.apps_max, config.device_model.or_else(|| emulated_prior(config.device).filter(|_| !config.no_prior)));
        let waker = Arc::new(Waker::new().map_err(|e| Error::io("eventfd", &e))?);
        let shared = Arc::new(Shared::new(config, root, key, apps_max));
        let (jobs, jobs_rx) = mpsc::channel();
        let (done, done_rx) = mpsc::channel();
        let (meta, meta_rx) = mpsc::channel();
        let (meta_done, meta_done_rx) = mpsc::channel();
        let mut workers = spawn_workers(&shared, jobs_rx, done, &waker)?;
        workers.extend(spawn_meta(&shared, meta_rx, meta_done, &waker)?);
        let loop_workers = Workers { jobs, done: done_rx, meta, meta_done: meta_done_rx };
        // The scheduler is built on the loop's thread: it is not `Send`.
        let (ready_tx, ready_rx) = mpsc::channel::<std::io::Result<(bool, bool)>>();
        let tracer = match &shared.config.trace {
            Some(p) => Some(trace::Tracer::start(p, shared.config.limits.trace_bytes_max, &trace_about(&shared.config))?),
            None => None,
        };
        let tracing = tracer.as_ref().map(trace::Tracer::switch);
        let (s, w, apps) = (Arc::clone(&shared), Arc::clone(&waker), Arc::clone(&shared.apps));
        let event_loop = spawn("sluice-loop", move || {
            // Before the ring exists: its kernel workers take this
            // thread's credentials.
            if let Err(e) = ident::drop_data_caps_on_thread() {
                let _ = ready_tx.send(Err(e));
                return dispatch::Ended::default();
            }
            let mut disp = Dispatcher::new(Scheduler::new(policy, limits), prior, apps, tracer);
            disp.set_qos(s.config.qos.clone(), s.clock.read().ns);
            match EventLoop::new(s, listener, w, disp, loop_workers) {
                Ok(l) => {
                    let _ = ready_tx.send(Ok(l.uses_ring()));
                    l.run()
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    dispatch::Ended::default()
                }
            }
        })?;
        let (uring, sqpoll) = match ready_rx.recv() {
            Ok(Ok(ring)) => ring,
            Ok(Err(e)) => return Err(Error::io("start the event loop", &e)),
            Err(_) => return Err(Error::new(ErrorKind::Io, libc::EIO, "the event loop failed to start")),
        };
        let mut handle = ServerHandle { shared, addr, waker, event_loop: Some(event_loop), workers, socket_path, metrics: None, tracing, uring, sqpoll };
        if let Some(m) = handle.shared.config.metrics.clone() {
            handle.metrics = Some(metrics::start(&handle.shared, &handle.waker, &m)?);
        }
        Ok(handle)
    }
}

/// The server's device and policy as the trace's JSON members, for
/// `sluice what-if` (`trace::Tracer::start`).
fn trace_about(c: &ServerConfig) -> String {
    format!(r#""device":"{}","direct":{},"queue_depth":{},"policy":"{}""#, c.device.name(), c.direct, c.queue_depth, c.policy.name())
}

fn spawn<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<JoinHandle<T>> {
    std::thread::Builder::new().name(name.into()).spawn(f).map_err(|e| Error::io("spawn thread", &e))
}

fn spawn_workers(shared: &Arc<Shared>, jobs: Receiver<exec::Job>, done: Sender<exec::Job>, waker: &Arc<Waker>) -> Result<Vec<JoinHandle<()>>> {
    let c = &shared.config;
    let device = if c.device == DeviceKind::Hdd7200 { Some(disk::Disk::new(c.device_shared.as_deref())?) } else { None };
    let storage = c.storage.as_ref().map_or_else(|| Arc::new(storage::Syscalls) as Arc<dyn storage::Storage>, |s| Arc::clone(&s.0));
    // Populating the page cache for lease answers: only through the page
    // cache of a real device, with the real system calls.
    let null = if c.storage.is_none() && !c.direct && c.device == DeviceKind::Real { std::fs::OpenOptions::new().write(true).open("/dev/null").ok() } else { None };
    let exec = Arc::new(Executor { storage, direct: c.direct, device, direct_writes: Arc::clone(&shared.direct_writes), null });
    let jobs = Arc::new(Mutex::new(jobs));
    (0..c.queue_depth)
        .map(|_| {
            let (exec, jobs, done, waker, clock) = (Arc::clone(&exec), Arc::clone(&jobs), done.clone(), Arc::clone(waker), shared.clock);
            spawn("sluice-exec", move || {
                // Only removes capabilities, which never fails.
                ident::drop_data_caps_on_thread().expect("drop CAP_FSETID and CAP_SYS_RESOURCE");
                exec::worker(exec, jobs, clock, done, waker)
            })
        })
        .collect()
}

fn spawn_meta(shared: &Arc<Shared>, jobs: Receiver<meta::MetaJob>, done: Sender<meta::MetaDone>, waker: &Arc<Waker>) -> Result<Vec<JoinHandle<()>>> {
    let jobs = Arc::new(Mutex::new(jobs));
    (0..META_THREADS)
        .map(|_| {
            let (shared, jobs, done, waker) = (Arc::clone(shared), Arc::clone(&jobs), done.clone(), Arc::clone(waker));
            spawn("sluice-meta", move || meta::worker(shared, jobs, done, waker))
        })
        .collect()
}

/// The shared key: created at the configured or default path when the
/// server listens on TCP (which refuses every client without it), read
/// when it exists otherwise. A key inside the served root is refused:
/// clients could read it through the server.
fn load_key(config: &ServerConfig) -> Result<Option<[u8; sluice_net::key::KEY_BYTES]>> {
    let tcp = matches!(config.listen, Listen::Tcp(_));
    let path = match config.key_file.clone().or_else(sluice_net::key::default_path) {
        Some(p) => p,
        None if tcp => return Err(Error::config(format!("a TCP server needs a key file: pass --key-file or set {}", sluice_net::key::KEY_ENV))),
        None => return Ok(None),
    };
    let key = if tcp || config.key_file.is_some() {
        sluice_net::key::load_or_create(&path).map(|(k, _)| k)
    } else {
        match sluice_net::key::load(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            other => other,
        }
    }
    .map_err(|e| Error::new(ErrorKind::Config, e.raw_os_error().unwrap_or(libc::EINVAL), e.to_string()))?;
    if let (Ok(k), Ok(r)) = (std::fs::canonicalize(&path), std::fs::canonicalize(&config.root)) {
        if k.starts_with(&r) {
            return Err(Error::config(format!("key file {} lies inside the served root {}: clients could read it", k.display(), r.display())));
        }
    }
    Ok(Some(key))
}

/// Bind the listener; a stale Unix socket (nobody answering) is replaced.
/// A Unix socket is made connectable by every local user (mode 0666): the
/// kernel tells the server who each peer is, and each request runs with
/// that peer's rights, so the socket's mode no longer guards anything.
fn bind(listen: &Listen) -> Result<(Listener, String, Option<std::path::PathBuf>)> {
    let l = Listener::bind(listen).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse | std::io::ErrorKind::AlreadyExists => Error::config(e.to_string()),
        _ => Error::io(&format!("bind {listen:?}"), &e),
    })?;
    if let Listen::Unix(path) = listen {
        // Anyone local may connect: who they are is the kernel's
        // SO_PEERCRED, checked per request (`ident.rs`).
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(|e| Error::io(&format!("chmod {}", path.display()), &e))?;
    }
    let path = match listen {
        Listen::Unix(p) => Some(p.clone()),
        Listen::Tcp(_) => None,
    };
    let addr = l.addr();
    Ok((l, addr, path))
}

impl ServerHandle {
    /// `unix:PATH` or `tcp:IP:PORT` (the bound port when 0 was asked for).
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether dispatches that would block go to the kernel through
    /// io_uring from the event loop (`ServerConfig::uring`, and the kernel
    /// allowed it) rather than to executor workers.
    pub fn uring(&self) -> bool {
        self.uring
    }

    /// Whether a kernel thread polls the ring's submission queue
    /// (`ServerConfig::sqpoll_idle_ms`, and the kernel allowed it).
    pub fn sqpoll(&self) -> bool {
        self.sqpoll
    }

    /// The metrics endpoint's address (`ServerConfig::metrics`), when one
    /// was asked for.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(|m| m.addr())
    }

    /// Pause (`false`) or resume (`true`) the live trace; false when the
    /// server has no trace, or its file reached `trace_bytes_max` (it
    /// records nothing more).
    pub fn set_tracing(&self, on: bool) -> bool {
        match &self.tracing {
            Some((switch, full)) if !full.load(Ordering::Relaxed) => {
                switch.store(on, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    /// Whether the live trace is recording.
    pub fn tracing(&self) -> bool {
        self.tracing.as_ref().is_some_and(|(t, _)| t.load(Ordering::Relaxed))
    }

    /// Replace the service classes and rules (`qos.rs`; None: none) while
    /// the server runs: the event loop applies them at its next turn (a
    /// request waiting in a class queue then enters the policy; none is
    /// lost or answered twice). Each change is counted in `/metrics`.
    pub fn set_qos(&self, rules: Option<qos::QosRules>) {
        *lock(&self.shared.qos_update) = Some(rules);
        self.shared.qos_pending.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Each service class's counters now (`default` last; empty without
    /// classes), asked of the event loop as a metrics scrape does.
    pub fn class_stats(&self) -> Vec<sluice_core::ClassStats> {
        self.shared.view.ask(&self.waker).map(|v| v.classes).unwrap_or_default()
    }

    /// Changes of the service classes applied since the start.
    pub fn qos_changes(&self) -> u64 {
        self.shared.qos_changes.load(Ordering::Relaxed)
    }

    /// Per-application counters so far.
    pub fn stats(&self) -> Vec<AppStats> {
        lock(&self.shared.apps).snapshot()
    }

    /// Distinct backing files open now (all connections together).
    pub fn files_open(&self) -> usize {
        lock(&self.shared.files).len()
    }

    /// Bytes held in partial frames now (bounded by `partial_bytes_max`).
    pub fn partial_bytes(&self) -> u64 {
        self.shared.partial_held.load(Ordering::Relaxed)
    }

    /// Bytes connections hold now in admitted requests and unsent replies
    /// (each connection at most `reply_bytes_max`).
    pub fn reply_bytes(&self) -> u64 {
        self.shared.reply_bytes.load(Ordering::Relaxed)
    }

    /// Bytes of the shared-memory regions mapped now (at most
    /// `shm_total_bytes_max`).
    pub fn shm_bytes(&self) -> u64 {
        self.shared.shm_bytes.load(Ordering::Relaxed)
    }

    /// Connections closed before their handshake to make room for newer
    /// ones since the start.
    pub fn handshakes_evicted(&self) -> u64 {
        self.shared.handshakes_evicted.load(Ordering::Relaxed)
    }

    /// Shared-memory regions refused at `shm_total_bytes_max` since the
    /// start: clients left on the socket path.
    pub fn shm_refused(&self) -> u64 {
        self.shared.shm_refused.load(Ordering::Relaxed)
    }

    /// Shared-memory regions granted smaller than asked since the start,
    /// the budget filling (`shm_taper_shares`).
    pub fn shm_tapered(&self) -> u64 {
        self.shared.shm_tapered.load(Ordering::Relaxed)
    }

    /// Requests taken from doorbells since the start (rung requests:
    /// `sluice_proto::post`), and `Nudge` frames received.
    pub fn rung_requests(&self) -> (u64, u64) {
        (self.shared.rung.load(Ordering::Relaxed), self.shared.nudges.load(Ordering::Relaxed))
    }

    /// Doorbells the event loop watches now (at most
    /// `doorbells_watched_max`).
    pub fn doorbells_watched(&self) -> usize {
        self.shared.doorbells_watched.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.shared.conns_open.load(Ordering::Relaxed)
    }

    /// Drain and stop: accept nothing new, stop reading at a frame
    /// boundary, finish and answer every admitted request, close every
    /// connection, check the scheduler's invariants. Idempotent.
    pub fn shutdown(&mut self) -> Result<Summary> {
        self.metrics = None;
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.waker.wake();
        let ended = match self.event_loop.take() {
            Some(l) => l.join().map_err(|_| Error::new(ErrorKind::Io, libc::EIO, "the event loop failed its shutdown checks"))?,
            None => dispatch::Ended::default(),
        };
        if let Some(p) = self.socket_path.take() {
            let _ = std::fs::remove_file(p);
        }
        self.workers.drain(..).for_each(|w| drop(w.join()));
        Ok(Summary { apps: self.stats(), scheduler: ended.scheduler, device_model: ended.device_model, device_busy_ns: ended.device_busy_ns, device_seeks: ended.device_seeks })
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// A server holds one descriptor per connection: raise the soft limit to
/// the hard one (best effort); the soft limit now.
pub fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 0;
        }
        if l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
        l.rlim_cur
    }
}

/// The per-application summary printed at shutdown.
pub fn summary_table(apps: &[AppStats]) -> String {
    let mut s = format!("{:<24} {:>10} {:>10} {:>7} {:>12} {:>12} {:>7} {:>10}\n", "app", "requests", "dispatches", "aggr", "read_bytes", "written", "errors", "p50_us<");
    for a in apps {
        s += &format!(
            "{:<24} {:>10} {:>10} {:>7.2} {:>12} {:>12} {:>7} {:>10}\n",
            a.name,
            a.requests,
            a.dispatches,
            a.aggregation_factor(),
            a.bytes_read,
            a.bytes_written,
            a.errors,
            median_bucket_us(a)
        );
    }
    s
}

/// Upper bound, in microseconds, of the histogram bucket holding the median.
pub fn median_bucket_us(a: &AppStats) -> u64 {
    let total: u64 = a.latency_us_log2.iter().sum();
    let mut seen = 0;
    for (i, n) in a.latency_us_log2.iter().enumerate() {
        seen += n;
        if total > 0 && seen * 2 >= total {
            return 2u64 << i;
        }
    }
    0
}
