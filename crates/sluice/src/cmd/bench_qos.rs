//! `sluice bench qos`: arguments and output of the service-level
//! benchmark (`sluice_bench::qos`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use sluice_bench::qos::{qos, table, QosConfig};

use super::output::write_json;

#[derive(Args)]
pub struct QosBenchArgs {
    /// hdd7200 (the emulated disk) or real.
    #[arg(long, default_value = "hdd7200")]
    device: String,
    /// The server opens its files with O_DIRECT.
    #[arg(long)]
    direct: bool,
    /// Scheduling policy of the server.
    #[arg(long, default_value = "aioli")]
    policy: String,
    /// The limited class's rate, bytes/s.
    #[arg(long, default_value_t = 20_000_000)]
    rate: u64,
    /// The guaranteed class's minimum, bytes/s.
    #[arg(long, default_value_t = 20_000_000)]
    guarantee: u64,
    /// The classes' bucket depth in ms (`depth_ms`): how far ahead of its
    /// rate a class may be let in at once.
    #[arg(long, default_value_t = 20)]
    depth_ms: u64,
    /// Seconds each measured class runs for (sizes follow).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// What each user of the share setup is expected to get, bytes/s
    /// (its sizes follow).
    #[arg(long, default_value_t = 25_000_000)]
    share_rate: u64,
    /// The setups to run: limit, guarantee, share (the last runs a second
    /// user's processes: root only).
    #[arg(long, value_delimiter = ',', default_value = "limit,guarantee,share")]
    setups: Vec<String>,
    /// Directory for the files.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(a: QosBenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.rate > 0 && a.guarantee > 0 && a.seconds > 0.0 && a.seconds <= 600.0, "--rate and --guarantee above 0, --seconds in (0, 600]");
    // Removed however the command ends, a Ctrl-C included.
    let scratch = sluice_bench::scratch::Scratch::new(a.dir.join(format!("sluice-bench-qos-{}", std::process::id())));
    let root = scratch.path().to_path_buf();
    let cfg = QosConfig {
        device: a.device,
        direct: a.direct,
        policy: a.policy,
        rate_bytes_per_s: a.rate,
        guarantee_bytes_per_s: a.guarantee,
        depth_ms: a.depth_ms,
        seconds: a.seconds,
        share_bytes_per_s: a.share_rate,
        setups: a.setups,
        exe: std::env::current_exe().context("locating the sluice executable")?,
        root: root.clone(),
    };
    let report = qos(&cfg);
    drop(scratch);
    let report = report.map_err(|e| anyhow::anyhow!("qos: {e}"))?;
    print!("{}", table(&report));
    if let Some(path) = a.json {
        write_json(&path, &report)?;
        println!("json: {}", path.display());
    }
    Ok(())
}
