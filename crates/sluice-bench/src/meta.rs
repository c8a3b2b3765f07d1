//! The metadata benchmark (`sluice bench meta`): operations per second of
//! the cluster's metadata store, embedded redb against etcd, on the
//! store itself (what every metadata role does per request, without the
//! socket). Each of `threads` threads creates `ops` files in its own
//! directory, looks each up, renames each, and removes each; a phase's
//! figure is all threads' operations over its wall time. Without a
//! running etcd (`--store`), a local cluster of `members` etcd processes
//! is started in the scratch directory and stopped after.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_meta::MetaStore;
use sluice_stripe::LayoutRequest;

use crate::workload::WorkloadError;

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct MetaConfig {
    /// Files per thread.
    pub ops: u32,
    pub threads: u32,
    /// A running etcd (`etcd://...`), else started here.
    pub store: Option<String>,
    /// Members of the etcd cluster started here.
    pub members: u32,
}

/// One store's figures.
#[derive(Clone, Debug, Serialize)]
pub struct MetaRow {
    pub store: String,
    pub create_per_s: f64,
    pub lookup_per_s: f64,
    pub rename_per_s: f64,
    pub unlink_per_s: f64,
}

/// The report `--json` writes.
#[derive(Clone, Debug, Serialize)]
pub struct MetaReport {
    pub config: MetaConfig,
    pub rows: Vec<MetaRow>,
}

/// etcd processes started for the run, killed when dropped.
struct LocalEtcd(Vec<Child>);

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn start_etcd(dir: &Path, members: u32) -> Result<(LocalEtcd, String), WorkloadError> {
    let n = members.max(1) as usize;
    let held: Vec<std::net::TcpListener> =
        (0..2 * n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>().map_err(|e| WorkloadError::io("free ports".into(), e))?;
    let ports: Vec<u16> = held.iter().map(|l| l.local_addr().map_or(0, |a| a.port())).collect();
    drop(held);
    let peer = |i: usize| format!("http://127.0.0.1:{}", ports[n + i]);
    let initial: Vec<String> = (0..n).map(|i| format!("m{i}={}", peer(i))).collect();
    let mut procs = LocalEtcd(Vec::new());
    for (i, port) in ports[..n].iter().enumerate() {
        let client = format!("http://127.0.0.1:{port}");
        let child = Command::new("etcd")
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(dir.join(format!("etcd-{i}")))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client, "--listen-peer-urls", &peer(i), "--initial-advertise-peer-urls", &peer(i)])
            .args(["--initial-cluster", &initial.join(","), "--initial-cluster-state", "new"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| WorkloadError::io("start etcd (is etcd-server installed?)".into(), e))?;
        procs.0.push(child);
    }
    let store = format!("etcd://{}", (0..n).map(|i| format!("127.0.0.1:{}", ports[i])).collect::<Vec<_>>().join(","));
    Ok((procs, store))
}

/// Run `phase(thread, i)` for every thread's `ops` items at once: the
/// operations per second over the wall time.
fn timed(store: &Arc<MetaStore>, cfg: &MetaConfig, phase: fn(&MetaStore, u32, u32) -> sluice_remote::Result<()>) -> Result<f64, WorkloadError> {
    let t0 = Instant::now();
    let threads: Vec<_> = (0..cfg.threads)
        .map(|t| {
            let (s, ops) = (Arc::clone(store), cfg.ops);
            std::thread::spawn(move || (0..ops).try_for_each(|i| phase(&s, t, i)))
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| WorkloadError::usage("a benchmark thread panicked".into()))?.map_err(|e| WorkloadError::usage(format!("metadata store: {e}")))?;
    }
    Ok(f64::from(cfg.ops * cfg.threads) / t0.elapsed().as_secs_f64().max(1e-9))
}

/// Files of one benchmark directory: a directory holds at most
/// `META_DIR_ENTRIES_MAX` entries, so a thread's files are spread over
/// subdirectories of this many.
const FILES_PER_DIR: u32 = sluice_meta::META_DIR_ENTRIES_MAX as u32;

/// Thread `t`'s file `i`, named with `prefix` (`f` or `g`).
fn file(t: u32, i: u32, prefix: &str) -> String {
    format!("t{t}/d{}/{prefix}{i}", i / FILES_PER_DIR)
}

fn row(name: &str, store: MetaStore, cfg: &MetaConfig) -> Result<MetaRow, WorkloadError> {
    let s = Arc::new(store);
    let failed = |e: sluice_remote::Error| WorkloadError::usage(format!("metadata store: {e}"));
    for t in 0..cfg.threads {
        s.mkdir(&format!("t{t}")).map_err(failed)?;
        for d in 0..cfg.ops.div_ceil(FILES_PER_DIR) {
            s.mkdir(&format!("t{t}/d{d}")).map_err(failed)?;
        }
    }
    Ok(MetaRow {
        store: name.into(),
        create_per_s: timed(&s, cfg, |s, t, i| s.create(&file(t, i, "f"), LayoutRequest { stripe_bytes: 0, count: 0, start: -1 }, true).map(drop))?,
        lookup_per_s: timed(&s, cfg, |s, t, i| s.lookup(&file(t, i, "f")).map(drop))?,
        rename_per_s: timed(&s, cfg, |s, t, i| s.rename(&file(t, i, "f"), &file(t, i, "g")).map(drop))?,
        unlink_per_s: timed(&s, cfg, |s, t, i| s.unlink(&file(t, i, "g")).map(drop))?,
    })
}

/// Run both stores in `scratch`.
pub fn meta(cfg: &MetaConfig, scratch: &Path) -> Result<MetaReport, WorkloadError> {
    let redb = MetaStore::open(&scratch.join("bench.redb"), 1).map_err(|e| WorkloadError::usage(format!("redb: {e}")))?;
    let mut rows = vec![row("redb", redb, cfg)?];
    let (_local, endpoints) = match &cfg.store {
        Some(s) => (None, s.clone()),
        None => {
            let (p, s) = start_etcd(scratch, cfg.members)?;
            (Some(p), s)
        }
    };
    // A started cluster needs a moment to elect a leader; opening retries.
    let prefix = format!("sluice-bench-{}", std::process::id());
    let deadline = Instant::now() + Duration::from_secs(30);
    let etcd = loop {
        match MetaStore::open_etcd(&endpoints, &prefix, 1) {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => return Err(WorkloadError::usage(format!("etcd at {endpoints}: {e}"))),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let label = if cfg.store.is_some() { "etcd".to_string() } else { format!("etcd, {} local members", cfg.members) };
    rows.push(row(&label, etcd, cfg)?);
    Ok(MetaReport { config: cfg.clone(), rows })
}

/// The scratch directory `sluice bench meta` uses under `dir`.
pub fn scratch_in(dir: &Path) -> PathBuf {
    dir.join(format!("sluice-bench-meta-{}", std::process::id()))
}

/// The table `sluice bench meta` prints.
pub fn table(r: &MetaReport) -> String {
    let c = &r.config;
    let mut out = format!("metadata operations per second, {} threads x {} files each\n", c.threads, c.ops);
    out += &format!("{:<28} {:>10} {:>10} {:>10} {:>10}\n", "store", "create", "lookup", "rename", "unlink");
    for row in &r.rows {
        out += &format!("{:<28} {:>10.0} {:>10.0} {:>10.0} {:>10.0}\n", row.store, row.create_per_s, row.lookup_per_s, row.rename_per_s, row.unlink_per_s);
    }
    out
}
