//! The `sluice` command: argument parsing and glue. Each subcommand lives
//! in `cmd/<name>.rs` and calls into the library crates; errors become a
//! one-line message and exit status 1 here, in one place.

mod alloc;
mod cmd;

use clap::{CommandFactory, Parser, Subcommand};

/// A global I/O scheduling service for clusters.
#[derive(Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount a server's files with FUSE (until SIGINT, SIGTERM or fusermount3 -u).
    Mount(cmd::mount::MountArgs),
    /// Run a benchmark or workload.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCmd),
    /// Simulate a cluster running a scenario, under each policy.
    Sim(cmd::sim::SimArgs),
    /// Measure the device under a directory: its cost model, as TOML.
    Calibrate(cmd::calibrate::CalibrateArgs),
    /// Run the I/O service in front of a directory.
    Serve(cmd::serve::ServeArgs),
    /// Watch a live server: applications by throughput, latency, queue (its --metrics endpoint).
    Top(cmd::top::TopArgs),
    /// Replay a live trace (serve --trace) under other policies: what would have happened.
    WhatIf(cmd::whatif::WhatIfArgs),
    /// Copy a file into or out of the service (:path is on the server).
    Cp(cmd::cp::CpArgs),
    /// List a directory on the service (:DIR).
    Ls(cmd::ls::LsArgs),
    /// The service classes of a running server: list, stats, set FILE, rm CLASS, clear.
    Qos(cmd::qos::QosArgs),
    /// Run a command with its file calls under --prefix sent to the server (LD_PRELOAD).
    Run(cmd::run::RunArgs),
    /// Start a metadata role and N data servers on this machine (until SIGINT or SIGTERM).
    Cluster(cmd::cluster::ClusterArgs),
    /// Run a cluster's metadata role alone, for data servers started with `sluice serve`.
    Meta(cmd::cluster::MetaArgs),
    /// Set a new file's layout, or a directory's default layout, on a cluster.
    Setstripe(cmd::stripe::SetstripeArgs),
    /// Print a file's layout and where its objects are.
    Getstripe(cmd::stripe::GetstripeArgs),
    /// Distributed arrays stored as Zarr v3: collective write and read, info, ls, cat, verify.
    #[command(subcommand)]
    Array(cmd::array::ArrayCmd),
    /// Write the manual pages (sluice.1, sluice-serve.1, ...) into a directory.
    #[command(hide = true)]
    Man(cmd::man::ManArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Bench(c) => cmd::bench::run(c),
        Cmd::Mount(a) => cmd::mount::run(a),
        Cmd::Sim(a) => cmd::sim::run(a),
        Cmd::Serve(a) => cmd::serve::run(a),
        Cmd::Calibrate(a) => cmd::calibrate::run(a),
        Cmd::Top(a) => cmd::top::run(a),
        Cmd::WhatIf(a) => cmd::whatif::run(a),
        Cmd::Cp(a) => cmd::cp::run(a),
        Cmd::Array(c) => cmd::array::run(c),
        Cmd::Ls(a) => cmd::ls::run(a),
        Cmd::Qos(a) => cmd::qos::run(a),
        Cmd::Run(a) => cmd::run::run(a),
        Cmd::Cluster(a) => cmd::cluster::run(a),
        Cmd::Meta(a) => cmd::cluster::run_meta(a),
        Cmd::Setstripe(a) => cmd::stripe::set(a),
        Cmd::Getstripe(a) => cmd::stripe::get(a),
        Cmd::Man(a) => cmd::man::run(a, Cli::command()),
    };
    if let Err(e) = result {
        eprintln!("sluice: {e:#}");
        std::process::exit(1);
    }
}
