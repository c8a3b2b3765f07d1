//! `sluice bench forwarders`: arguments and output of the forwarder-set
//! benchmark (`sluice_bench::forwarders`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use sluice_bench::forwarders::{forwarders, table, ForwardersConfig};

use super::output::write_json;
use super::size::parse_size_positive as parse_size;

#[derive(Args)]
pub struct ForwardersArgs {
    /// Processes reading the one file.
    #[arg(long, default_value_t = 32)]
    procs: u32,
    /// Bytes per read (K, M, G, T).
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    granularity: u64,
    /// Multiply the seed's sizes by this.
    #[arg(long, default_value_t = 0.00390625)]
    scale: f64,
    /// Forwarders in the set.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..=64))]
    set: u32,
    /// Scheduling policy of every server.
    #[arg(long, default_value = "aioli")]
    policy: String,
    /// hdd7200 (one emulated disk shared by the forwarders) or real.
    #[arg(long, default_value = "hdd7200")]
    device: String,
    /// Open the files with O_DIRECT in the servers.
    #[arg(long)]
    direct: bool,
    /// Runs of the three setups, each in a rotated order.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=99))]
    runs: u32,
    /// The processes' path: `library` or `run` (plain POSIX calls under
    /// the interposer, as `sluice run`).
    #[arg(long, default_value = "library", value_parser = ["library", "run"])]
    via: String,
    /// Directory for the file.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(a: ForwardersArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("locating the sluice executable")?;
    let preload = if a.via == "run" { Some(super::run::find_library(&exe, std::env::var_os(super::run::PRELOAD_ENV).map(PathBuf::from))?) } else { None };
    // Removed however the command ends, a Ctrl-C included.
    let scratch = sluice_bench::scratch::Scratch::new(a.dir.join(format!("sluice-forwarders-{}", std::process::id())));
    let root = scratch.path().to_path_buf();
    let cfg = ForwardersConfig {
        procs: a.procs,
        granularity: a.granularity,
        scale: a.scale,
        set: a.set,
        policy: a.policy,
        device: a.device,
        direct_io: a.direct,
        runs: a.runs,
        via: a.via,
        preload,
        exe,
        root: root.clone(),
    };
    let report = forwarders(&cfg);
    drop(scratch);
    let report = report.map_err(|e| anyhow::anyhow!("forwarders: {e}"))?;
    print!("{}", table(&report));
    if let Some(path) = a.json {
        write_json(&path, &report)?;
        println!("json: {}", path.display());
    }
    Ok(())
}
