//! `sluice bench matrix`: arguments and output of the default-policy
//! comparison (the work is in `sluice_bench::matrix`).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use super::output::write_json;

#[derive(Args)]
pub struct MatrixArgs {
    /// The smaller matrix at smaller sizes (under three minutes on two cores).
    #[arg(long)]
    quick: bool,
    /// The policy judged (default: the server's default, aioli).
    #[arg(long, default_value = sluice_bench::matrix::DEFAULT_POLICY)]
    policy: String,
    /// Scratch directory on the file system to measure (default: a new one under /var/tmp, removed after).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Runs per row; every mode is judged by its median makespan (1 to 15).
    #[arg(long, default_value_t = sluice_bench::matrix::RUNS_DEFAULT)]
    runs: u32,
    /// Only the rows whose workload contains this text (for example "64K x32" or "mix10").
    #[arg(long)]
    only: Option<String>,
    /// Run the decomposition rows as writes (each process writing its
    /// pieces of the shared file), and only those.
    #[arg(long)]
    write: bool,
    /// The started servers schedule every write (`sluice serve
    /// --no-write-leases`) instead of granting write leases.
    #[arg(long)]
    no_write_leases: bool,
    /// Write leases (the default; kept so that older command lines run).
    #[arg(long, hide = true, conflicts_with = "no_write_leases")]
    write_leases: bool,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(a: MatrixArgs) -> anyhow::Result<()> {
    anyhow::ensure!((1..=sluice_bench::matrix::RUNS_MAX).contains(&a.runs), "--runs {}: give 1 to {}", a.runs, sluice_bench::matrix::RUNS_MAX);
    // Removed however the command ends, a Ctrl-C included.
    let scratch = sluice_bench::scratch::Scratch::new(a.dir.unwrap_or_else(|| PathBuf::from("/var/tmp")).join(format!("sluice-bench-matrix-{}", std::process::id())));
    let root = scratch.path().to_path_buf();
    let exe = std::env::current_exe().context("locating the sluice executable")?;
    let mut cfg = sluice_bench::matrix::MatrixConfig::new(a.quick, exe, root.clone());
    cfg.default_policy = a.policy;
    cfg.runs = a.runs;
    cfg.only = a.only;
    cfg.write = a.write;
    cfg.write_leases = a.write_leases || !a.no_write_leases;
    // The rows through `sluice run` need the interposer; without it they
    // are left out (said on stderr).
    cfg.preload = match super::run::find_library(&cfg.exe, std::env::var_os(super::run::PRELOAD_ENV).map(PathBuf::from)) {
        Ok(lib) => Some(lib),
        Err(e) => {
            eprintln!("matrix: no rows through sluice run: {e}");
            None
        }
    };
    let report = sluice_bench::matrix::run(&cfg);
    drop(scratch);
    let report = report.map_err(|e| anyhow::anyhow!("{e}"))?;
    print!("{}", sluice_bench::matrix::table(&report));
    if let Some(path) = &a.json {
        write_json(path, &report)?;
        println!("json: {}", path.display());
    }
    Ok(())
}
