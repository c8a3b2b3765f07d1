//! `sluice cluster`: a metadata role and N data servers on one machine, in
//! the foreground, until SIGINT or SIGTERM; then every role stops. And
//! `sluice meta`: the metadata role alone, over separately started data
//! servers.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use sluice_launch::{LocalCluster, LocalClusterConfig};
use sluice_server::DeviceKind;

#[derive(Args)]
pub struct ClusterArgs {
    /// Data servers to start (each serves ROOT/data-<i>/ on ROOT/data-<i>.sock).
    #[arg(long, default_value_t = 2)]
    servers: u32,
    /// Directory holding the metadata database and the data servers' directories.
    #[arg(long)]
    root: PathBuf,
    /// Scheduling policy of every data server.
    #[arg(long, default_value = "aioli")]
    policy: String,
    /// real, or hdd7200 (each data server emulates its own 7200 rpm disk).
    #[arg(long, default_value = "real")]
    device: String,
    /// Open backing files with O_DIRECT.
    #[arg(long)]
    direct: bool,
}

/// Set by the signal handler; polled by the main thread.
static STOP: AtomicBool = AtomicBool::new(false);
/// How often the main thread looks at `STOP`.
const STOP_POLL_MS: u64 = 50;

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

pub fn run(a: ClusterArgs) -> anyhow::Result<()> {
    let mut cfg = LocalClusterConfig::new(&a.root, a.servers);
    cfg.policy = sluice_core::PolicyConfig::from_name(&a.policy).with_context(|| format!("unknown policy {:?} (known: {})", a.policy, sluice_core::POLICY_NAMES.join(", ")))?;
    cfg.device = DeviceKind::parse(&a.device)?;
    cfg.direct = a.direct;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe.
        unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
    let mut cluster = LocalCluster::start(cfg).context("cluster")?;
    for i in 0..a.servers {
        println!("sluice: data server {i}: {} on {}", cluster.data_root(i).display(), cluster.data_addr(i));
    }
    println!("sluice: cluster of {} data servers ready (policy {}, device {})", a.servers, a.policy, a.device);
    println!("export SLUICE_SERVER={}", cluster.addr());
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(STOP_POLL_MS));
    }
    println!("sluice: stopping the cluster");
    let summaries = cluster.shutdown()?;
    let requests: u64 = summaries.iter().map(|s| s.scheduler.completed_requests).sum();
    println!("sluice: stopped cleanly: {} data servers, {requests} requests served", summaries.len());
    Ok(())
}

#[derive(Args)]
pub struct MetaArgs {
    /// The metadata database (created when missing), for a role alone on
    /// its machine.
    #[arg(long, required_unless_present = "store", conflicts_with = "store")]
    db: Option<PathBuf>,
    /// Keep the namespace in an etcd cluster instead,
    /// `etcd://HOST:PORT,HOST:PORT,...`; several `sluice meta` may serve
    /// one store (clients list them all: `unix:/a.sock,unix:/b.sock`).
    #[arg(long)]
    store: Option<String>,
    /// With --store: the key prefix of this cluster's namespace in etcd.
    #[arg(long, default_value = "sluice", requires = "store")]
    prefix: String,
    /// unix:PATH or tcp:HOST:PORT.
    #[arg(long)]
    listen: String,
    /// A data server's address, in layout order (repeat for each; each serves a root with an objects/ directory).
    #[arg(long = "data", required = true)]
    data: Vec<String>,
    /// Shared key file (mode 0600) TCP clients prove; created if missing.
    /// Default: $SLUICE_KEY_FILE, else $XDG_CONFIG_HOME/sluice/key, else
    /// ~/.config/sluice/key.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Serve the role's metrics at http://HOST:PORT/metrics (port 0: any).
    #[arg(long)]
    metrics: Option<String>,
}

/// `sluice meta`: the metadata role alone, for clusters whose data servers
/// run as separate `sluice serve` processes (on other hosts).
pub fn run_meta(a: MetaArgs) -> anyhow::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: as in `run`.
        unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
    let servers = a.data.len() as u32;
    let store = match (&a.db, &a.store) {
        (Some(db), _) => sluice_meta::MetaStore::open(db, servers)?,
        (None, Some(etcd)) => sluice_meta::MetaStore::open_etcd(etcd, &a.prefix, servers)?,
        (None, None) => anyhow::bail!("give --db FILE or --store etcd://..."),
    };
    let listen = sluice_server::Listen::parse(&a.listen)?;
    let mut meta = sluice_meta::MetaServer::start_with_key(store, a.data.clone(), &listen, a.key_file.as_deref())?;
    println!("sluice: metadata role for {} data servers on {}", a.data.len(), meta.addr());
    match (&a.store, &a.db) {
        (Some(etcd), _) => println!("sluice: namespace in {etcd}, key prefix {}", a.prefix),
        (None, Some(db)) => println!("sluice: namespace in {}", db.display()),
        (None, None) => {}
    }
    if let Some(m) = &a.metrics {
        println!("sluice: metadata metrics at http://{}/metrics", meta.serve_metrics(m)?);
    }
    println!("export SLUICE_SERVER={}", meta.addr());
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(STOP_POLL_MS));
    }
    meta.shutdown();
    println!("sluice: metadata role stopped");
    Ok(())
}
