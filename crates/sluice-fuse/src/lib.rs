//! # sluice-fuse: unmodified programs through a FUSE mount
//!
//! `sluice mount --server ADDR MOUNTPOINT` makes every file operation under
//! the mount point a request to a sluice server, so any program — static
//! binaries included — is scheduled globally without being changed.
//!
//! Concurrency: the kernel hands requests to a multi-threaded tokio runtime
//! (the `fuse3` crate), and each is carried out on the blocking pool with
//! the sluice client, which pipelines concurrent callers on one connection:
//! requests of many processes reach the server's scheduler at the same
//! time. Files are opened in direct-I/O mode, so the kernel neither caches
//! nor reshapes the data path and the scheduler sees the application's own
//! request sizes (up to `MAX_WRITE_BYTES` per request).
//!
//! Striped files: when the address is a cluster's metadata role (asked
//! once, at mount), every call goes through `sluice_remote::Remote` to
//! the striped client, so programs see each striped file as one file.
//!
//! Identity: each calling process (the pid in the FUSE request header) gets
//! its own connection, so the scheduler sees each process as a stream of
//! its own (`ClientId` = pid). The application id is `--app` when given,
//! else the client's one rule (`sluice_client::app_id`) applied to the
//! caller's environment, command name and session, read from `/proc/PID`.
//!
//! ```no_run
//! let cfg = sluice_fuse::MountConfig::new("unix:/run/sluice.sock", "/mnt/sluice");
//! sluice_fuse::mount(cfg).expect("mounted until SIGINT, SIGTERM or fusermount3 -u");
//! ```

mod conns;
mod fs;
mod stats;

use std::fmt;
use std::path::PathBuf;

pub use fs::{CONNECTIONS_MAX, HANDLES_MAX, MAX_WRITE_BYTES};

/// What to mount where.
#[derive(Clone, Debug)]
pub struct MountConfig {
    pub server: String,
    pub mountpoint: PathBuf,
    /// One application id for every caller, instead of per process.
    pub app: Option<String>,
    /// Let other users than the mounting one use the mount.
    pub allow_other: bool,
    /// Serve the mount's metrics (Prometheus text at `/metrics`) here:
    /// `HOST:PORT`; port 0 picks one (printed on stdout).
    pub metrics: Option<String>,
}

impl MountConfig {
    pub fn new(server: impl Into<String>, mountpoint: impl Into<PathBuf>) -> MountConfig {
        MountConfig { server: server.into(), mountpoint: mountpoint.into(), app: None, allow_other: false, metrics: None }
    }
}

/// Why mounting failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FuseErrorKind {
    /// The server could not be reached before mounting.
    Server,
    /// The mount itself failed (no /dev/fuse, not a directory, no rights).
    Mount,
    /// The runtime could not start.
    Runtime,
}

/// An error from the FUSE path.
#[derive(Debug)]
pub struct FuseError {
    pub kind: FuseErrorKind,
    pub message: String,
}

impl fmt::Display for FuseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for FuseError {}

fn error(kind: FuseErrorKind, message: String) -> FuseError {
    FuseError { kind, message }
}

/// Mount and serve until SIGINT, SIGTERM or an external unmount
/// (`fusermount3 -u`, `umount`); unmounts cleanly before returning.
pub fn mount(cfg: MountConfig) -> Result<(), FuseError> {
    // Fail early and clearly when the server is not there; learn whether
    // it is one server or a cluster.
    let kind = sluice_remote::Remote::connect(&cfg.server).map_err(|e| error(FuseErrorKind::Server, e.to_string()))?.kind();
    let _endpoint = match &cfg.metrics {
        Some(addr) => {
            let e = sluice_metrics::Endpoint::start(addr, |path| (path == "/metrics").then(|| (sluice_metrics::TEXT_FORMAT, stats::STATS.render())))
                .map_err(|e| error(FuseErrorKind::Runtime, e.to_string()))?;
            println!("sluice: mount metrics at http://{}/metrics", e.addr());
            Some(e)
        }
        None => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| error(FuseErrorKind::Runtime, format!("tokio runtime: {e}")))?;
    rt.block_on(serve(cfg, kind))
}

async fn serve(cfg: MountConfig, kind: sluice_remote::RemoteKind) -> Result<(), FuseError> {
    let mut opts = fuse3::MountOptions::default();
    // default_permissions: the kernel checks each caller against the mode
    // bits the server reports before a request reaches us (with
    // allow_other, other users are checked as themselves, not as the mount).
    opts.fs_name("sluice").allow_other(cfg.allow_other).default_permissions(true);
    let mountpoint = cfg.mountpoint.clone();
    let fs = fs::SluiceFs::new(cfg, kind);
    let session = fuse3::path::Session::new(opts);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mounted = if root { session.mount(fs, &mountpoint).await } else { session.mount_with_unprivileged(fs, &mountpoint).await };
    let mut handle = mounted.map_err(|e| error(FuseErrorKind::Mount, format!("mounting {}: {e}", mountpoint.display())))?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| error(FuseErrorKind::Runtime, format!("signal handler: {e}")))?;
    tokio::select! {
        res = &mut handle => return res.map_err(|e| error(FuseErrorKind::Mount, format!("serving {}: {e}", mountpoint.display()))),
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    handle.unmount().await.map_err(|e| error(FuseErrorKind::Mount, format!("unmounting {}: {e}", mountpoint.display())))
}
