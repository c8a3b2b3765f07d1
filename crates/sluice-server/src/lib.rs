//! # sluice-server: the I/O service behind `sluice serve`
//!
//! An I/O forwarding daemon in front of one directory. Every connection's
//! reads and writes go into one [`sluice_core::Scheduler`], driven by a
//! single dispatcher thread with a monotonic clock; the scheduler's
//! dispatches run on a small executor (`queue_depth` workers), each one
//! `preadv`/`pwritev` straight into or out of the requests' buffers.
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
//! Threads: one acceptor; per connection a reader (decodes, admits,
//! runs metadata calls) and a writer (batches replies); one dispatcher
//! (owns the scheduler); `queue_depth` executor workers.
//!
//! Invariants: no path leaves the root (see [`root`]); the server never
//! panics on input, and a malformed frame closes only its connection;
//! every queue and table has a named bound ([`ServerLimits`], the core's
//! `Limits`) and going past one is an error reply, never a silent drop.

pub mod bench;
pub mod bench_conns;
mod config;
mod conn;
mod dispatch;
mod error;
mod exec;
pub mod ident;
mod intake;
mod net;
mod ops;
mod pending;
pub mod root;
mod state;

use std::collections::HashMap;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use sluice_core::Scheduler;
use sluice_device::Hdd;
use sluice_proto::AppStats;

pub use config::{DeviceKind, Listen, ServerConfig, ServerLimits, DIRECT_ALIGN_BYTES, QUEUE_DEPTH_DEFAULT, QUEUE_DEPTH_MAX};
pub use error::{Error, ErrorKind, Result};
pub use ident::{Squash, ANON_ID};

use dispatch::{Dispatcher, Event};
use exec::Executor;
use net::{Listener, Stream};
use state::{lock, AppTable, Clock, FileTable};

/// State every server thread shares.
pub(crate) struct Shared {
    pub config: ServerConfig,
    pub root: root::Root,
    pub clock: Clock,
    pub files: Arc<Mutex<FileTable>>,
    pub apps: Arc<Mutex<AppTable>>,
    pub events: Sender<Event>,
    pub request_next: AtomicU64,
    /// Open connections (a clone of each stream, for the drain).
    pub conns: Mutex<HashMap<u64, Stream>>,
    pub threads: Mutex<Vec<JoinHandle<()>>>,
    pub stopping: AtomicBool,
    /// The shared key connections prove (see `ident`); `None`: no
    /// connection can prove one, so TCP is refused.
    pub key: Option<[u8; sluice_net::key::KEY_BYTES]>,
    /// The server's effective uid: 0 takes callers' identities.
    pub server_uid: u32,
    /// Bytes held in partial frames, all connections together.
    pub partial: intake::PartialBudget,
    /// Bytes connections hold in admitted requests and unsent replies,
    /// all together (each is bounded by `reply_bytes_max`).
    pub reply_bytes: Arc<AtomicU64>,
}

/// What the server did, returned by [`ServerHandle::shutdown`].
#[derive(Clone, Debug)]
pub struct Summary {
    pub apps: Vec<AppStats>,
    pub scheduler: sluice_core::Stats,
    /// The device cost model learned (or given and refined), if any.
    pub device_model: Option<sluice_core::DeviceCost>,
}

/// The service. See the crate documentation.
pub struct Server;

/// A running server; dropping it drains it too.
pub struct ServerHandle {
    shared: Arc<Shared>,
    addr: String,
    acceptor: Option<JoinHandle<()>>,
    dispatcher: Option<JoinHandle<(sluice_core::Stats, Option<sluice_core::DeviceCost>)>>,
    workers: Vec<JoinHandle<()>>,
    socket_path: Option<std::path::PathBuf>,
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
        let (policy, apps_max, prior) = (config.policy.clone(), limits.apps_max, config.device_model);
        let (events, events_rx) = mpsc::channel();
        let (jobs, jobs_rx) = mpsc::channel();
        let clock = Clock::new();
        let shared = Arc::new(Shared {
            root,
            clock,
            files: Arc::new(Mutex::new(FileTable::new(config.limits.files_open_max))),
            apps: Arc::new(Mutex::new(AppTable::new(apps_max))),
            events,
            request_next: AtomicU64::new(0),
            conns: Mutex::new(HashMap::new()),
            threads: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            key,
            server_uid: ident::server_uid(),
            partial: intake::PartialBudget::new(config.limits.partial_bytes_max),
            reply_bytes: Arc::new(AtomicU64::new(0)),
            config,
        });
        let workers = spawn_workers(&shared, jobs_rx)?;
        let apps = Arc::clone(&shared.apps);
        // The scheduler is built on its own thread: it is not `Send`.
        let dispatcher = spawn("sluice-dispatch", move || Dispatcher::new(Scheduler::new(policy, limits), prior, events_rx, jobs, apps, clock).run())?;
        let s = Arc::clone(&shared);
        let acceptor = spawn("sluice-accept", move || accept_loop(s, listener))?;
        Ok(ServerHandle { shared, addr, acceptor: Some(acceptor), dispatcher: Some(dispatcher), workers, socket_path })
    }
}

fn spawn<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<JoinHandle<T>> {
    std::thread::Builder::new().name(name.into()).spawn(f).map_err(|e| Error::io("spawn thread", &e))
}

fn spawn_workers(shared: &Arc<Shared>, jobs: mpsc::Receiver<exec::Job>) -> Result<Vec<JoinHandle<()>>> {
    let c = &shared.config;
    let device = (c.device == DeviceKind::Hdd7200).then(|| Mutex::new(Hdd::hdd7200()));
    let exec = Arc::new(Executor { direct: c.direct, device, direct_writes: Mutex::new(()) });
    let jobs = Arc::new(Mutex::new(jobs));
    (0..c.queue_depth)
        .map(|_| {
            let (exec, jobs, events, apps, clock) = (Arc::clone(&exec), Arc::clone(&jobs), shared.events.clone(), Arc::clone(&shared.apps), shared.clock);
            spawn("sluice-exec", move || {
                exec::worker(exec, jobs, clock, move |job| {
                    let (id, service) = (job.dispatch.id, clock.now().saturating_sub(job.started));
                    let answered = dispatch::answer_job(&apps, job, clock.now());
                    let _ = events.send(Event::Done(id, answered, service));
                })
            })
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
    match listen {
        Listen::Unix(path) => {
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                use std::os::unix::fs::FileTypeExt;
                if !meta.file_type().is_socket() {
                    return Err(Error::config(format!("{} exists and is not a socket", path.display())));
                }
                if UnixStream::connect(path).is_ok() {
                    return Err(Error::config(format!("{} is in use by a running server", path.display())));
                }
                let _ = std::fs::remove_file(path);
            }
            let l = UnixListener::bind(path).map_err(|e| Error::io(&format!("bind {}", path.display()), &e))?;
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(|e| Error::io(&format!("chmod {}", path.display()), &e))?;
            Ok((Listener::Unix(l), format!("unix:{}", path.display()), Some(path.clone())))
        }
        Listen::Tcp(a) => {
            let l = std::net::TcpListener::bind(a.as_str()).map_err(|e| Error::io(&format!("bind {a}"), &e))?;
            let local = l.local_addr().map_err(|e| Error::io("local_addr", &e))?;
            Ok((Listener::Tcp(l), format!("tcp:{local}"), None))
        }
    }
}

/// Milliseconds the acceptor waits between checks of the stop flag.
const ACCEPT_POLL_MS: i32 = 50;

fn accept_loop(shared: Arc<Shared>, listener: Listener) {
    if listener.set_nonblocking().is_err() {
        return;
    }
    let mut conn_next = 0u64;
    while !shared.stopping.load(Ordering::SeqCst) {
        let mut pfd = libc::pollfd { fd: listener.fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) } <= 0 {
            continue;
        }
        let Ok(stream) = listener.accept() else { continue };
        conn_next += 1;
        let (s, id) = (Arc::clone(&shared), conn_next);
        let t = std::thread::Builder::new().name("sluice-conn".into()).stack_size(256 << 10).spawn(move || conn::serve(s, stream, id));
        let mut threads = lock(&shared.threads);
        threads.retain(|h| !h.is_finished());
        if let Ok(t) = t {
            threads.push(t);
        }
    }
}

impl ServerHandle {
    /// `unix:PATH` or `tcp:IP:PORT` (the bound port when 0 was asked for).
    pub fn addr(&self) -> &str {
        &self.addr
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
        self.shared.partial.held()
    }

    /// Bytes connections hold now in admitted requests and unsent replies
    /// (each connection at most `reply_bytes_max`).
    pub fn reply_bytes(&self) -> u64 {
        self.shared.reply_bytes.load(Ordering::Relaxed)
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        lock(&self.shared.conns).len()
    }

    /// Drain and stop: accept nothing new, stop reading at a frame
    /// boundary, finish and answer every admitted request, close every
    /// connection, check the scheduler's invariants. Idempotent.
    pub fn shutdown(&mut self) -> Result<Summary> {
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        if let Some(p) = self.socket_path.take() {
            let _ = std::fs::remove_file(p);
        }
        lock(&self.shared.conns).values().for_each(|s| s.shutdown(std::net::Shutdown::Read));
        let conns: Vec<_> = lock(&self.shared.threads).drain(..).collect();
        conns.into_iter().for_each(|t| drop(t.join()));
        let _ = self.shared.events.send(Event::Stop);
        let (scheduler, device_model) = match self.dispatcher.take() {
            Some(d) => d.join().map_err(|_| Error::new(ErrorKind::Io, libc::EIO, "dispatcher failed its shutdown checks"))?,
            None => (sluice_core::Stats::default(), None),
        };
        self.workers.drain(..).for_each(|w| drop(w.join()));
        Ok(Summary { apps: self.stats(), scheduler, device_model })
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        let _ = self.shutdown();
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
