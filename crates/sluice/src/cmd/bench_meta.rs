//! `sluice bench meta`: arguments and output of the metadata-store
//! benchmark (`sluice_bench::meta`).

use std::path::PathBuf;

use clap::Args;
use sluice_bench::meta::{meta, scratch_in, table, MetaConfig};

use super::output::write_json;

#[derive(Args)]
pub struct MetaBenchArgs {
    /// Files each thread creates, looks up, renames and removes.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    ops: u32,
    /// Threads working at once, each in its own directory.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    threads: u32,
    /// A running etcd cluster (`etcd://HOST:PORT,...`); by default one is
    /// started in the scratch directory (`etcd` must be installed).
    #[arg(long)]
    store: Option<String>,
    /// Members of the etcd cluster started here.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=7))]
    members: u32,
    /// Directory for the scratch files.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(a: MetaBenchArgs) -> anyhow::Result<()> {
    let cfg = MetaConfig { ops: a.ops, threads: a.threads, store: a.store, members: a.members };
    // Removed however the command ends, a Ctrl-C included.
    let scratch = sluice_bench::scratch::Scratch::new(scratch_in(&a.dir));
    std::fs::create_dir_all(scratch.path())?;
    let report = meta(&cfg, scratch.path());
    drop(scratch);
    let report = report.map_err(|e| anyhow::anyhow!("meta: {e}"))?;
    print!("{}", table(&report));
    if let Some(path) = a.json {
        write_json(&path, &report)?;
        println!("json: {}", path.display());
    }
    Ok(())
}
