//! `sluice serve`: run the I/O service in the foreground until SIGINT or
//! SIGTERM, then drain and print the per-application summary.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use sluice_server::{DeviceKind, Listen, Server, ServerConfig, QUEUE_DEPTH_DEFAULT};

#[derive(Args)]
pub struct ServeArgs {
    /// Directory to serve; clients cannot leave it.
    #[arg(long)]
    root: PathBuf,
    /// unix:PATH or tcp:HOST:PORT.
    #[arg(long)]
    listen: String,
    /// Scheduling policy.
    #[arg(long, default_value = "aioli")]
    policy: String,
    /// Open backing files with O_DIRECT.
    #[arg(long)]
    direct: bool,
    /// Schedule local clients' buffered writes instead of letting them
    /// write through the page cache themselves under write leases (the
    /// default where the server writes through the page cache: a
    /// buffered write only copies into it, and the device pays at
    /// write-back; leased writes reach no scheduler, and their bytes are
    /// counted as the clients report them).
    #[arg(long)]
    no_write_leases: bool,
    /// Write leases (the default; kept so that older command lines run).
    #[arg(long, hide = true, conflicts_with = "no_write_leases")]
    write_leases: bool,
    /// real, hdd7200 (an emulated 7200 rpm disk), or null (no device:
    /// every read and write completes at once, reads return zeros).
    #[arg(long, default_value = "real")]
    device: String,
    /// Service classes and the rules that put applications in them (a
    /// TOML file, docs/qos.md): rate limits, guarantees, weights. SIGHUP
    /// reads it again; a file that does not parse keeps the rules in force.
    #[arg(long, value_name = "FILE")]
    qos: Option<PathBuf>,
    /// With --device hdd7200: share one emulated disk, through FILE, with
    /// every server given the same FILE (forwarders in front of one shared
    /// directory, which share its disk); by default each server emulates
    /// a disk of its own.
    #[arg(long, value_name = "FILE")]
    device_shared: Option<PathBuf>,
    /// Most dispatches in flight to the device; the scheduler keeps as many
    /// busy as the learned device model gains from (the rest wait in it).
    #[arg(long, default_value_t = QUEUE_DEPTH_DEFAULT)]
    queue_depth: u32,
    /// Hand every dispatch to executor threads, never to io_uring from the
    /// event loop (which is the default where the kernel allows it).
    #[arg(long)]
    no_uring: bool,
    /// Submit dispatches through a kernel thread that polls io_uring's
    /// submission queue and sleeps after MS milliseconds (1..=1000)
    /// without one: the loop then makes no system call to submit, and the
    /// file system's submission work runs on that thread, one more core
    /// busy while dispatches come (off by default).
    #[arg(long, value_name = "MS")]
    sqpoll_idle_ms: Option<u32>,
    /// Start the device cost model from this file (`sluice calibrate
    /// --out`); it is refined from every dispatch either way.
    #[arg(long)]
    device_model: Option<PathBuf>,
    /// With --device hdd7200: start the device model from the learner's
    /// generic prior instead of the emulated disk's own figures, so that
    /// the scheduler must learn the disk from scratch.
    #[arg(long, conflicts_with = "device_model")]
    no_prior: bool,
    /// Which identities become nobody: root (uid 0 stated over TCP), all, none.
    #[arg(long, default_value = "root")]
    squash: String,
    /// Shared key file (mode 0600) that TCP clients and identity-forwarding
    /// mounts prove; created if missing. Default: $SLUICE_KEY_FILE, else
    /// $XDG_CONFIG_HOME/sluice/key, else ~/.config/sluice/key.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Connections at once; past it a new client's handshake is refused
    /// (EBUSY). The server's threads do not grow with it.
    #[arg(long, default_value_t = sluice_server::ServerLimits::default().clients_max)]
    clients_max: u32,
    /// Of --clients-max, the slots only root and the server's own user may
    /// take.
    #[arg(long, default_value_t = sluice_server::ServerLimits::default().clients_reserved)]
    clients_reserved: u32,
    /// Connections one user may hold at once (root and the server's user
    /// excepted); one more is refused (EBUSY). When the table is full, the
    /// idle connection silent longest of the user holding the most is
    /// closed for a newcomer of another user.
    #[arg(long, default_value_t = sluice_server::ServerLimits::default().conns_per_uid_max)]
    conns_per_uid_max: u32,
    /// Bytes one user's connections may hold together (admitted requests,
    /// unread replies, frames being received); past it that user waits.
    /// Root and the server's user excepted.
    #[arg(long, default_value_t = sluice_server::ServerLimits::default().uid_bytes_max)]
    uid_bytes_max: u64,
    /// Bytes the server holds for all clients together; past it every
    /// connection waits until bytes drain.
    #[arg(long, default_value_t = sluice_server::ServerLimits::default().held_bytes_max)]
    held_bytes_max: u64,
    /// Bytes a cache lease may cover: a local client's read whose range is
    /// in the page cache is answered "read it yourself" (the client reads
    /// from a descriptor the server lends it). 0 turns leases off. Never
    /// with --direct or an emulated --device.
    #[arg(long, default_value_t = sluice_server::ServerLimits::default().lease_bytes_max)]
    lease_bytes_max: u64,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics and a live
    /// dashboard at http://HOST:PORT/ (HOST:PORT or tcp:HOST:PORT; port 0
    /// picks a free one). Application names are visible there: bind a
    /// loopback or management address.
    #[arg(long)]
    metrics: Option<String>,
    /// Applications labelled in /metrics; the rest are summed as "(other)".
    #[arg(long, default_value_t = sluice_server::ServerLimits::default().metrics_apps_max)]
    metrics_apps_max: u32,
    /// Write a live Chrome/Perfetto trace (the shape of `sluice sim
    /// --trace`) to this file. SIGUSR1 pauses and resumes it.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Bytes the trace may grow to; past it tracing stops with a message.
    #[arg(long, default_value_t = sluice_server::ServerLimits::default().trace_bytes_max)]
    trace_bytes_max: u64,
    /// Parse and validate the configuration (the device model file
    /// included), print it and exit 0, without listening: for a service
    /// manager's unit or a configuration change.
    #[arg(long)]
    check: bool,
}

/// Set by the signal handler; polled by the main thread.
static STOP: AtomicBool = AtomicBool::new(false);
/// Set by SIGUSR1: toggle the live trace.
static TOGGLE_TRACE: AtomicBool = AtomicBool::new(false);
/// Set by SIGHUP: read the `--qos` file again.
static RELOAD_QOS: AtomicBool = AtomicBool::new(false);
/// How often the main thread looks at `STOP`.
const STOP_POLL_MS: u64 = 50;

extern "C" fn on_signal(sig: libc::c_int) {
    if sig == libc::SIGUSR1 {
        TOGGLE_TRACE.store(true, Ordering::SeqCst);
    } else if sig == libc::SIGHUP {
        RELOAD_QOS.store(true, Ordering::SeqCst);
    } else {
        STOP.store(true, Ordering::SeqCst);
    }
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let cfg = config(&a)?;
    if a.check {
        return check(&a, &cfg);
    }
    serve(&a, cfg)
}

/// The server's configuration from the command line.
fn config(a: &ServeArgs) -> anyhow::Result<ServerConfig> {
    let mut cfg = ServerConfig::new(&a.root, Listen::parse(&a.listen)?);
    cfg.policy = sluice_core::PolicyConfig::from_name(&a.policy).with_context(|| format!("unknown policy {:?} (known: {})", a.policy, sluice_core::POLICY_NAMES.join(", ")))?;
    cfg.direct = a.direct;
    cfg.write_leases = a.write_leases || !a.no_write_leases;
    cfg.device = DeviceKind::parse(&a.device)?;
    cfg.queue_depth = a.queue_depth;
    cfg.uring = !a.no_uring;
    cfg.sqpoll_idle_ms = a.sqpoll_idle_ms;
    cfg.no_prior = a.no_prior;
    cfg.device_shared = a.device_shared.clone();
    if let Some(q) = &a.qos {
        cfg.qos = Some(sluice_server::qos::QosRules::load(q).map_err(anyhow::Error::msg)?);
    }
    if let Some(p) = &a.device_model {
        cfg.device_model = Some(sluice_device::ModelFile::load(p)?.cost());
    }
    cfg.squash = sluice_server::Squash::parse(&a.squash)?;
    cfg.key_file = a.key_file.clone();
    cfg.limits.clients_max = a.clients_max;
    cfg.limits.clients_reserved = a.clients_reserved;
    cfg.limits.conns_per_uid_max = a.conns_per_uid_max;
    cfg.limits.uid_bytes_max = a.uid_bytes_max;
    cfg.limits.held_bytes_max = a.held_bytes_max;
    cfg.limits.lease_bytes_max = a.lease_bytes_max;
    cfg.metrics = a.metrics.clone();
    cfg.limits.metrics_apps_max = a.metrics_apps_max;
    cfg.trace = a.trace.clone();
    cfg.limits.trace_bytes_max = a.trace_bytes_max;
    Ok(cfg)
}

/// `--check`: what `Server::start` checks before it binds (the root a
/// directory, the bounds), then the configuration, one setting a line.
fn check(a: &ServeArgs, cfg: &ServerConfig) -> anyhow::Result<()> {
    cfg.validate()?;
    anyhow::ensure!(a.root.is_dir(), "--root {}: not a directory", a.root.display());
    let key = match &a.key_file {
        Some(k) if k.exists() => format!("{} (exists)", k.display()),
        Some(k) => format!("{} (created at start)", k.display()),
        None => "default ($SLUICE_KEY_FILE, else $XDG_CONFIG_HOME/sluice/key, else ~/.config/sluice/key)".to_string(),
    };
    println!("sluice: configuration ok (not listening: --check)");
    println!("root: {}", a.root.display());
    println!("listen: {}", a.listen);
    println!("policy: {}", a.policy);
    println!(
        "device: {}{}",
        a.device,
        a.device_model.as_ref().map_or(String::new(), |p| format!(", model from {}: {}", p.display(), cfg.device_model.expect("loaded with the path")))
    );
    println!("queue depth: {}", a.queue_depth);
    println!("direct: {}", if a.direct { "on" } else { "off" });
    println!("squash: {}", a.squash);
    println!("key file: {key}");
    println!("clients max: {} ({} kept for root and the server's user; {} a user)", a.clients_max, a.clients_reserved, a.conns_per_uid_max);
    println!("bytes held: {} a user, {} in all", a.uid_bytes_max, a.held_bytes_max);
    println!("metrics: {}", a.metrics.as_deref().unwrap_or("off"));
    println!("trace: {}", a.trace.as_ref().map_or("off".to_string(), |t| t.display().to_string()));
    Ok(())
}

/// SIGHUP: the `--qos` file again; a file that does not parse leaves the
/// rules in force, and says why.
fn reload_qos(a: &ServeArgs, server: &sluice_server::ServerHandle) {
    let Some(path) = &a.qos else {
        println!("sluice: SIGHUP: no --qos file to read");
        return;
    };
    match sluice_server::qos::QosRules::load(path) {
        Ok(r) => {
            println!("sluice: qos: read {}: {}", path.display(), r.summary());
            server.set_qos(Some(r));
        }
        Err(e) => println!("sluice: qos: {e}; keeping the rules in force"),
    }
}

fn serve(a: &ServeArgs, cfg: ServerConfig) -> anyhow::Result<()> {
    sluice_server::raise_fd_limit();
    install_signal_handlers();
    let mut server = Server::start(cfg)?;
    println!(
        "sluice: serving {} on {} (policy {}, queue depth {}, device {}, direct {}, io_uring {}{})",
        a.root.display(),
        server.addr(),
        a.policy,
        a.queue_depth,
        a.device,
        if a.direct { "on" } else { "off" },
        if server.uring() { "on" } else { "off" },
        match (a.sqpoll_idle_ms, server.sqpoll()) {
            (None, _) => "",
            (Some(_), true) => ", polled by a kernel thread",
            (Some(_), false) => ", not polled: the kernel refused SQPOLL",
        }
    );
    if let Some(m) = server.metrics_addr() {
        println!("sluice: metrics at http://{m}/metrics, dashboard at http://{m}/");
    }
    if let Some(t) = &a.trace {
        println!("sluice: tracing to {} (SIGUSR1 pauses and resumes)", t.display());
    }
    if let Some(q) = &a.qos {
        println!("sluice: service classes from {} (SIGHUP reads it again)", q.display());
    }
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(STOP_POLL_MS));
        if RELOAD_QOS.swap(false, Ordering::SeqCst) {
            reload_qos(a, &server);
        }
        if TOGGLE_TRACE.swap(false, Ordering::SeqCst) {
            let on = !server.tracing();
            if server.set_tracing(on) {
                println!("sluice: tracing {}", if on { "resumed" } else { "paused" });
            } else if a.trace.is_some() {
                println!("sluice: the trace is full (--trace-bytes-max); not resumed");
            }
        }
    }
    println!("sluice: draining");
    let summary = server.shutdown()?;
    print!("{}", sluice_server::summary_table(&summary.apps));
    let s = summary.scheduler;
    println!(
        "sluice: stopped cleanly: {} requests in {} dispatches ({} forced by expiry), nothing left in flight",
        s.completed_requests, s.completed_dispatches, s.expired_dispatches
    );
    if let Some(m) = summary.device_model {
        println!("sluice: device model learned: {}", m);
    }
    Ok(())
}
