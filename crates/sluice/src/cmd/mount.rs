//! `sluice mount`: the FUSE path.

use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct MountArgs {
    /// The server (default: $SLUICE_SERVER).
    #[arg(long)]
    server: Option<String>,
    /// One application id for every process using the mount (default: per
    /// process, from its SLUICE_APP, SLURM_JOB_ID or command name).
    #[arg(long)]
    app: Option<String>,
    /// Let other users use the mount (each checked as themselves).
    #[arg(long)]
    allow_other: bool,
    /// Serve the mount's metrics at http://HOST:PORT/metrics (port 0: any).
    #[arg(long)]
    metrics: Option<String>,
    /// Never let the kernel read cached files itself. By default (root,
    /// Linux 6.9+: FUSE passthrough) a buffered read-only open of a file
    /// wholly in the page cache is handed the file, and its reads reach
    /// neither the mount nor the scheduler until it is closed (a page
    /// evicted meanwhile is read from the device unscheduled); other opens
    /// of that file meanwhile (writers, O_DIRECT) still go through the
    /// mount.
    #[arg(long)]
    no_passthrough: bool,
    #[command(flatten)]
    patience: super::remote::Patience,
    /// Where to mount.
    mountpoint: PathBuf,
}

pub fn run(a: MountArgs) -> anyhow::Result<()> {
    a.patience.apply();
    let server = sluice_client::server_addr(a.server.as_deref()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut cfg = sluice_fuse::MountConfig::new(server, a.mountpoint);
    cfg.app = a.app;
    cfg.allow_other = a.allow_other;
    cfg.metrics = a.metrics;
    cfg.passthrough = !a.no_passthrough;
    sluice_fuse::mount(cfg).map_err(|e| anyhow::anyhow!("{e}"))
}
