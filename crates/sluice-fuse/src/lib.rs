//! # sluice-fuse: unmodified programs through a FUSE mount
//!
//! `sluice mount --server ADDR MOUNTPOINT` makes every file operation under
//! the mount point a request to a sluice server, so any program — static
//! binaries included — is scheduled globally without being changed.
//!
//! Concurrency: `THREADS` worker threads of the `fuser` session each read
//! requests from their own clone of the FUSE device and carry them out
//! with the sluice client, which pipelines concurrent callers on one
//! connection: requests of many processes reach the server's scheduler at
//! the same time. Files are opened in direct-I/O mode, so the kernel
//! neither caches nor reshapes the data path and the scheduler sees the
//! application's own request sizes (up to `MAX_WRITE_BYTES` per request);
//! except, with `passthrough` (the default), a buffered read-only open of
//! a file wholly in the page cache, which the kernel may read itself
//! (`fs.rs`).
//!
//! Why `fuser` (not `fuse3`, used before): it lets an open hand the kernel
//! a backing file (`FUSE_DEV_IOC_BACKING_OPEN`, Linux 6.9+), the only way
//! a cached read through a mount avoids two copies and a round trip to
//! this process; `fuse3` 0.10 has no such call.
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

pub use fs::{CONNECTIONS_MAX, HANDLES_MAX, INODES_MAX, MAX_WRITE_BYTES, THREADS};

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
    /// Let the kernel read files wholly in the page cache itself (FUSE
    /// passthrough; needs root and Linux 6.9+, else unused). Default on:
    /// other opens of such a file meanwhile (writers, O_DIRECT) still send
    /// their I/O through the mount (`fs.rs`).
    pub passthrough: bool,
}

impl MountConfig {
    pub fn new(server: impl Into<String>, mountpoint: impl Into<PathBuf>) -> MountConfig {
        MountConfig { server: server.into(), mountpoint: mountpoint.into(), app: None, allow_other: false, metrics: None, passthrough: true }
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
    // SIGINT and SIGTERM are blocked in every thread, before any starts
    // (the client's, the metrics endpoint's, the session's), and taken
    // by `serve` alone.
    // SAFETY: plain libc signal-set calls on a local set.
    let signals = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
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
    serve(cfg, kind, &signals)
}

/// Mount, then wait for one of `signals` or for the session to end (an
/// external unmount); unmount.
fn serve(cfg: MountConfig, kind: sluice_remote::RemoteKind, signals: &libc::sigset_t) -> Result<(), FuseError> {
    let mut config = fuser::Config::default();
    // default_permissions: the kernel checks each caller against the mode
    // bits the server reports before a request reaches us (with
    // allow_other, other users are checked as themselves, not as the mount).
    config.mount_options = vec![fuser::MountOption::FSName("sluice".into()), fuser::MountOption::Subtype("sluice".into()), fuser::MountOption::DefaultPermissions];
    if cfg.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.n_threads = Some(fs::THREADS);
    config.clone_fd = true;
    let mountpoint = cfg.mountpoint.clone();
    let fs = fs::SluiceFs::new(cfg, kind);
    let session = fuser::spawn_mount(fs, &mountpoint, &config).map_err(|e| error(FuseErrorKind::Mount, format!("mounting {}: {e}", mountpoint.display())))?;
    let timeout = libc::timespec { tv_sec: 0, tv_nsec: 200_000_000 };
    loop {
        if session.guard.is_finished() {
            return session.join().map_err(|e| error(FuseErrorKind::Mount, format!("serving {}: {e}", mountpoint.display())));
        }
        // SAFETY: signals and timeout are valid; no siginfo is asked for.
        let sig = unsafe { libc::sigtimedwait(signals, std::ptr::null_mut(), &timeout) };
        if sig == libc::SIGINT || sig == libc::SIGTERM {
            break;
        }
    }
    match session.umount_and_join() {
        // Unmounted from outside (`fusermount3 -u`) just before the signal.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
        r => r.map_err(|e| error(FuseErrorKind::Mount, format!("unmounting {}: {e}", mountpoint.display()))),
    }
}
