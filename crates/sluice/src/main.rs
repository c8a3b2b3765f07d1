//! The `sluice` command: argument parsing and glue. Each subcommand lives
//! in `cmd/<name>.rs` and calls into the library crates; errors become a
//! one-line message and exit status 1 here, in one place.

mod cmd;

use clap::{Parser, Subcommand};

/// A global I/O scheduling service for clusters.
#[derive(Parser)]
#[command(name = "sluice", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a benchmark or workload.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCmd),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Bench(c) => cmd::bench::run(c),
    };
    if let Err(e) = result {
        eprintln!("sluice: {e:#}");
        std::process::exit(1);
    }
}
