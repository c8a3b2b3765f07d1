//! `sluice bench array`: a 3-D BLOCK-distributed array written
//! and read collectively as Zarr v3 by N ranks, over 1 and 4 data servers
//! of a local cluster, by each strategy; a cost model with measured
//! parameters predicts each strategy's time and chooses one, and the table
//! says whether its choice was the fastest.
//!
//! The model is `sluice_zarr::model` (docs/arrays.md); its parameters are
//! measured before the runs through one data server of a fresh cluster.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail};
use clap::Args;
use serde::Serialize;
use serde_json::json;
use sluice_array::{Distribution, Dtype, Layout, Plan};
use sluice_core::PolicyConfig;
use sluice_launch::{LocalCluster, LocalClusterConfig};
use sluice_remote::Remote;
use sluice_zarr::collective::{self, pattern_local, ArraySpec, Strategy};
use sluice_zarr::model::{self, CalibrateOptions, Params};

use super::array::{DistArgs, Prepared};
use super::output::write_json;

#[derive(Args)]
pub struct ArrayBenchArgs {
    /// Array size relative to 512 MiB (float64, 512 x 512 x 256 at 1).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Ranks, spread over the three dimensions (BLOCK in each).
    #[arg(long, default_value_t = 8)]
    ranks: u64,
    /// Data-server counts, one cluster each.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 4])]
    servers: Vec<u32>,
    /// Strategies to run.
    #[arg(long, value_delimiter = ',', default_values_t = ["independent".to_string(), "two-phase".to_string(), "server-directed".to_string()])]
    strategies: Vec<String>,
    /// Scheduling policy of every data server.
    #[arg(long, default_value = "aioli")]
    policy: String,
    /// Server-directed: messages a rank keeps in flight (1 to 4).
    #[arg(long, default_value_t = 1)]
    group_window: usize,
    /// Directory for the clusters' files.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One strategy on one cluster.
#[derive(Serialize)]
struct Row {
    servers: u32,
    strategy: String,
    write_s: f64,
    read_s: f64,
    write_mib_s: f64,
    read_mib_s: f64,
    /// The model's time for one collective (write or read alike).
    predicted_s: f64,
    /// Requests per dispatch over the write and the read (from the data
    /// servers' schedulers).
    requests_per_dispatch: f64,
}

/// The model's parameters and its choice for one cluster.
#[derive(Serialize)]
struct Choice {
    servers: u32,
    params: Params,
    chosen: String,
    fastest_write: String,
    chosen_was_fastest: bool,
}

#[derive(Serialize)]
struct Report {
    scale: f64,
    shape: Vec<u64>,
    chunks: Vec<u64>,
    shards: Vec<u64>,
    ranks: u64,
    grid: Vec<u64>,
    array_bytes: u64,
    pieces: usize,
    policy: String,
    rows: Vec<Row>,
    model: Vec<Choice>,
}

/// The array at `scale`: 512 x 512 x 256 float64 at 1, each dimension
/// scaled by the cube root, kept a multiple of 8 (shards are a quarter of
/// the first two dimensions, chunks an eighth).
fn geometry(scale: f64) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let c = scale.cbrt();
    let dim = |n: f64| (((n * c) / 8.0).round().max(1.0) * 8.0) as u64;
    let shape = vec![dim(512.0), dim(512.0), dim(256.0)];
    let chunks = vec![shape[0] / 8, shape[1] / 8, shape[2]];
    let shards = vec![shape[0] / 4, shape[1] / 4, shape[2]];
    (shape, chunks, shards)
}

/// `ranks` as a 3-D grid, largest factors first.
fn grid(ranks: u64) -> Vec<u64> {
    let mut g = vec![1u64; 3];
    let mut n = ranks;
    let mut d = 0;
    let mut f = 2;
    while n > 1 {
        if n.is_multiple_of(f) {
            g[d % 3] *= f;
            d += 1;
            n /= f;
        } else {
            f += 1;
        }
    }
    g
}

fn cluster(root: &std::path::Path, servers: u32, policy: &str) -> anyhow::Result<LocalCluster> {
    let _ = std::fs::remove_dir_all(root);
    let mut cfg = LocalClusterConfig::new(root, servers);
    cfg.policy = PolicyConfig::from_name(policy).ok_or_else(|| anyhow!("unknown policy {policy:?}"))?;
    Ok(LocalCluster::start(cfg)?)
}

fn spec(scale: f64, name: &str) -> anyhow::Result<ArraySpec> {
    let (shape, chunks, shards) = geometry(scale);
    let layout = Layout::new(shape, Dtype::F64, chunks, Some(shards))?;
    Ok(ArraySpec { path: format!("bench/{name}"), layout, dims: vec!["z".into(), "y".into(), "x".into()], attributes: json!({}) })
}

fn dist_args(ranks: u64, strategy: &str, group_window: usize) -> DistArgs {
    DistArgs {
        grid: grid(ranks),
        ranks,
        dist: Vec::new(),
        strategy: strategy.to_string(),
        hosts: None,
        server_weights: Vec::new(),
        group_wait_ms: collective::GROUP_WAIT_MS_DEFAULT,
        group_window,
    }
}

pub fn run(a: ArrayBenchArgs) -> anyhow::Result<()> {
    if a.scale.is_nan() || a.scale <= 0.0 || a.ranks == 0 {
        bail!("--scale must be positive and --ranks at least 1");
    }
    // Removed however the command ends, a Ctrl-C included.
    let scratch = sluice_bench::scratch::Scratch::new(a.dir.join(format!("sluice-bench-array-{}", std::process::id())));
    run_in(&a, scratch.path())
}

fn run_in(a: &ArrayBenchArgs, scratch: &std::path::Path) -> anyhow::Result<()> {
    // The parameters, measured through one data server of a fresh cluster.
    let m = {
        let mut c = cluster(&scratch.join("calibrate"), 1, &a.policy)?;
        let m = model::calibrate(&c.addr(), "bench", CalibrateOptions::BENCH);
        c.shutdown()?;
        m?
    };
    println!(
        "model: {:.1} us per message, {:.2} us per piece, {:.2} us per dispatch, {:.3} ns per byte, copy {:.3} ns per byte",
        m.message_ns / 1e3,
        m.piece_ns / 1e3,
        m.dispatch_ns / 1e3,
        m.byte_ns,
        m.copy_byte_ns
    );
    let (mut rows, mut model) = (Vec::new(), Vec::new());
    let mut first: Option<(Vec<u64>, Plan, Distribution)> = None;
    for &servers in &a.servers {
        let mut predicted = Vec::new();
        for name in &a.strategies {
            let strategy = Strategy::parse(name)?;
            let root = scratch.join(format!("s{servers}-{name}"));
            let mut c = cluster(&root, servers, &a.policy)?;
            let addr = c.addr();
            let remote = Arc::new(Remote::connect(&addr)?);
            let p = Prepared::new(spec(a.scale, name)?, &dist_args(a.ranks, name, a.group_window), servers as usize, &[], &[])?;
            let locals: Vec<Vec<u8>> = (0..p.dist.ranks()).map(|r| pattern_local(&p.dist, Dtype::F64, r)).collect();
            collective::create(remote.clone(), &p.spec)?;
            let w = collective::write(&p.collective(&addr), &locals)?;
            let (back, r) = collective::read(&p.collective(&addr))?;
            if back != locals {
                bail!("{name} on {servers} servers: the data read back differs from what was written");
            }
            drop(remote);
            let summaries = c.shutdown()?;
            let (req, disp) = summaries.iter().fold((0, 0), |(q, d), s| (q + s.scheduler.dispatched_requests, d + s.scheduler.dispatches));
            let pw = model::predict(&p.shape(servers as usize), strategy, &m);
            predicted.push((name.clone(), pw, w.elapsed.as_secs_f64()));
            let mib = p.plan.bytes() as f64 / (1 << 20) as f64;
            rows.push(Row {
                servers,
                strategy: name.clone(),
                write_s: w.elapsed.as_secs_f64(),
                read_s: r.elapsed.as_secs_f64(),
                write_mib_s: mib / w.elapsed.as_secs_f64(),
                read_mib_s: mib / r.elapsed.as_secs_f64(),
                predicted_s: pw,
                requests_per_dispatch: req as f64 / disp.max(1) as f64,
            });
            if first.is_none() {
                first = Some((p.spec.layout.shape().to_vec(), p.plan.clone(), p.dist.clone()));
            }
            let _ = std::fs::remove_dir_all(&root);
        }
        let by = |f: fn(&(String, f64, f64)) -> f64| predicted.iter().min_by(|x, y| f(x).total_cmp(&f(y))).map(|x| x.0.clone()).unwrap_or_default();
        let (chosen, fastest) = (by(|x| x.1), by(|x| x.2));
        model.push(Choice { servers, params: m, chosen_was_fastest: chosen == fastest, chosen, fastest_write: fastest });
    }
    let (shape, plan, dist) = first.ok_or_else(|| anyhow!("no strategy ran"))?;
    let (_, chunks, shards) = geometry(a.scale);
    let report = Report {
        scale: a.scale,
        array_bytes: shape.iter().product::<u64>() * 8,
        shape,
        chunks,
        shards,
        ranks: a.ranks,
        grid: dist.grid().to_vec(),
        pieces: plan.pieces().len(),
        policy: a.policy.clone(),
        rows,
        model,
    };
    print!("{}", table(&report));
    if let Some(path) = &a.json {
        write_json(path, &report)?;
        println!("json: {}", path.display());
    }
    Ok(())
}

fn table(r: &Report) -> String {
    let mut out = format!(
        "array {:?} float64 ({} MiB), chunks {:?}, shards {:?}; {} ranks, grid {:?}, BLOCK; {} pieces; policy {}\n",
        r.shape,
        r.array_bytes >> 20,
        r.chunks,
        r.shards,
        r.ranks,
        r.grid,
        r.pieces,
        r.policy
    );
    out.push_str(&format!(
        "{:>7}  {:<16} {:>9} {:>11} {:>9} {:>11} {:>12} {:>9}\n",
        "servers", "strategy", "write s", "write MiB/s", "read s", "read MiB/s", "predicted s", "req/disp"
    ));
    for row in &r.rows {
        out.push_str(&format!(
            "{:>7}  {:<16} {:>9.3} {:>11.0} {:>9.3} {:>11.0} {:>12.3} {:>9.1}\n",
            row.servers, row.strategy, row.write_s, row.write_mib_s, row.read_s, row.read_mib_s, row.predicted_s, row.requests_per_dispatch
        ));
    }
    for m in &r.model {
        out.push_str(&format!(
            "{} server(s): the model chose {}; the fastest write was {} ({})\n",
            m.servers,
            m.chosen,
            m.fastest_write,
            if m.chosen_was_fastest { "the model was right" } else { "the model was wrong" }
        ));
    }
    out
}
