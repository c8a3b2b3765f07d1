//! `sluice bench service`: arguments and output of the service-overhead
//! benchmark (`sluice_bench::service`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use sluice_bench::service::{self as bench, ServiceBenchConfig};

use super::output::write_json;

#[derive(Args)]
pub struct ServiceArgs {
    /// Directory for the test file (the file system to measure).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Test file size in MiB.
    #[arg(long, default_value_t = 256)]
    size_mib: u64,
    /// Requests in flight for the pipelined pass.
    #[arg(long, default_value_t = 4)]
    window: usize,
    /// Repetitions; the best pass counts.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Blocking 4 KiB reads timed for the round trip.
    #[arg(long, default_value_t = 20_000)]
    rtt_requests: u32,
    /// O_DIRECT on both the server and the direct baseline.
    #[arg(long)]
    direct: bool,
    /// Serve metrics and scrape them every second during the run.
    #[arg(long)]
    metrics: bool,
    /// Record the live trace during the run.
    #[arg(long)]
    trace: bool,
    /// The server's device: real, hdd7200, or null (no device: what the
    /// server itself costs per request).
    #[arg(long, default_value = "real")]
    device: String,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(a: ServiceArgs) -> anyhow::Result<()> {
    let cfg = ServiceBenchConfig {
        dir: a.dir,
        file_bytes: a.size_mib << 20,
        window: a.window,
        rounds: a.rounds,
        rtt_requests: a.rtt_requests,
        direct: a.direct,
        metrics: a.metrics,
        trace: a.trace,
        device: sluice_server::DeviceKind::parse(&a.device)?,
        ..ServiceBenchConfig::default()
    };
    let report = bench::run(&cfg)?;
    print!("{}", bench::table(&report));
    if let Some(path) = a.json {
        write_json(&path, &report)?;
        println!("json: {}", path.display());
    }
    Ok(())
}

#[derive(Args)]
pub struct ConnectionsArgs {
    /// Idle connections held open.
    #[arg(long, default_value_t = 1000)]
    count: u32,
    /// Blocking 4 KiB reads timed while they are open.
    #[arg(long, default_value_t = 5_000)]
    rtt_requests: u32,
    /// Then this many more connections each stall in one write's body,
    /// and the server's added memory is checked against its budget for
    /// partial frames (the probe: 60 writes of 64 MiB, 16 MiB sent each).
    #[arg(long, default_value_t = 0)]
    stalled_writes: u32,
    /// Body of each stalled write, MiB (at most the frame bound, 64 MiB
    /// of data).
    #[arg(long, default_value_t = 64)]
    stalled_body_mib: u32,
    /// Of which each sends this much, MiB.
    #[arg(long, default_value_t = 16)]
    stalled_sent_mib: u32,
    /// Scratch directory.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// `sluice bench connections`.
pub fn connections(a: ConnectionsArgs) -> anyhow::Result<()> {
    use sluice_bench::connections::{run, table, ConnectionsBenchConfig};
    let exe = std::env::current_exe().context("the path of this sluice binary")?;
    let r = run(&ConnectionsBenchConfig {
        dir: a.dir,
        count: a.count,
        rtt_requests: a.rtt_requests,
        server_exe: Some(exe),
        stalled_writes: a.stalled_writes,
        stalled_body_mib: a.stalled_body_mib,
        stalled_sent_mib: a.stalled_sent_mib,
    })?;
    print!("{}", table(&r));
    if let Some(path) = &a.json {
        write_json(path, &r)?;
        println!("json: {}", path.display());
    }
    Ok(())
}
