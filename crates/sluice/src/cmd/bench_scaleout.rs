//! `sluice bench scaleout`: arguments and output of the striping scale-out
//! benchmark (`sluice_bench::scaleout`).

use std::path::PathBuf;

use clap::Args;
use sluice_bench::scaleout::{scaleout, table, ScaleoutConfig};

use super::output::write_json;
use super::size::parse_size_positive as parse_size;

#[derive(Args)]
pub struct ScaleoutArgs {
    /// Comma-separated data-server counts, one run each; the first is the
    /// speed-up's base.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 2, 4])]
    servers: Vec<u32>,
    /// Clients reading at once, each its contiguous share.
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Requests each client keeps outstanding (1: one after another).
    #[arg(long, default_value_t = 1)]
    inflight: u32,
    /// File size (bytes, or with K, M, G, T: binary units).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    file: u64,
    /// Bytes per client request (K, M, G, T).
    #[arg(long, default_value = "32M", value_parser = parse_size)]
    request: u64,
    /// Stripe size (K, M, G, T).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    stripe: u64,
    /// Scheduling policy of every data server.
    #[arg(long, default_value = "aioli")]
    policy: String,
    /// Device of every data server: hdd7200 (emulated 7200 rpm disk) or real.
    #[arg(long, default_value = "hdd7200")]
    device: String,
    /// Directory for the clusters' files.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(a: ScaleoutArgs) -> anyhow::Result<()> {
    let cfg = ScaleoutConfig {
        servers: a.servers,
        clients: a.clients,
        inflight: a.inflight,
        file_bytes: a.file,
        request_bytes: a.request,
        stripe_bytes: a.stripe,
        policy: a.policy,
        device: a.device,
    };
    // Removed however the command ends, a Ctrl-C included.
    let scratch = sluice_bench::scratch::Scratch::new(a.dir.join(format!("sluice-scaleout-{}", std::process::id())));
    std::fs::create_dir_all(scratch.path())?;
    let report = scaleout(&cfg, scratch.path());
    drop(scratch);
    let report = report.map_err(|e| anyhow::anyhow!("scaleout: {e}"))?;
    print!("{}", table(&report));
    if let Some(path) = a.json {
        write_json(&path, &report)?;
        println!("json: {}", path.display());
    }
    Ok(())
}
