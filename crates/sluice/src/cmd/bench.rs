//! `sluice bench …`: benchmarks and workloads.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::output::write_json;

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Cost of the scheduling core per request, for every policy.
    Scheduler(SchedulerArgs),
    /// The seed's decomposition: P processes read a shared file cyclically.
    Decomposition(super::workload::DecompositionArgs),
    /// The decomposition plus a `cat`-like sequential reader (seed Case 1).
    Interference(super::workload::InterferenceArgs),
    /// The seed's ten concurrent applications (Case 2).
    Mix10(super::workload::Mix10Args),
    /// Applications described in a TOML file.
    Custom(super::workload::CustomArgs),
    /// One rank of a workload (started by the commands above).
    #[command(hide = true)]
    Worker,
    /// The I/O service's overhead: 1 MiB sequential reads vs direct pread, 4 KiB round trip.
    Service(super::bench_service::ServiceArgs),
    /// Striping scale-out: one striped file read by several clients with 1, 2, 4 data servers.
    Scaleout(super::bench_scaleout::ScaleoutArgs),
    /// Forwarder sets: the decomposition on one server, and on N forwarders over one directory, one home per file and one per client.
    Forwarders(super::bench_forwarders::ForwardersArgs),
    /// Metadata operations per second of a cluster's store: embedded redb against etcd.
    Meta(super::bench_meta::MetaBenchArgs),
    /// Service classes on real processes: a rate-limited class beside others, a guaranteed one beside 32.
    Qos(super::bench_qos::QosBenchArgs),
    /// The default policy against fifo, fifo-merge and direct POSIX over every workload, judged against the default's ratio bound.
    Matrix(super::bench_matrix::MatrixArgs),
    /// What N idle connected clients cost the server (threads, memory), and a round trip meanwhile.
    Connections(super::bench_service::ConnectionsArgs),
    /// Collective array I/O (Zarr v3): independent, two-phase and server-directed over 1 and 4 data servers.
    Array(super::bench_array::ArrayBenchArgs),
}

#[derive(Args)]
pub struct SchedulerArgs {
    /// Requests admitted in total.
    #[arg(long, default_value_t = 100_000)]
    requests: u64,
    /// Queue depth kept while admitting.
    #[arg(long, default_value_t = 10_000)]
    queued: u64,
    /// Repetitions; the best is reported.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Comma-separated policies (default: all).
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(cmd: BenchCmd) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Scheduler(a) => scheduler(a),
        BenchCmd::Decomposition(a) => super::workload::decomposition(a),
        BenchCmd::Interference(a) => super::workload::interference(a),
        BenchCmd::Mix10(a) => super::workload::mix10(a),
        BenchCmd::Custom(a) => super::workload::custom(a),
        BenchCmd::Worker => super::workload::worker(),
        BenchCmd::Service(a) => super::bench_service::run(a),
        BenchCmd::Scaleout(a) => super::bench_scaleout::run(a),
        BenchCmd::Forwarders(a) => super::bench_forwarders::run(a),
        BenchCmd::Meta(a) => super::bench_meta::run(a),
        BenchCmd::Qos(a) => super::bench_qos::run(a),
        BenchCmd::Matrix(a) => super::bench_matrix::run(a),
        BenchCmd::Connections(a) => super::bench_service::connections(a),
        BenchCmd::Array(a) => super::bench_array::run(a),
    }
}

fn scheduler(a: SchedulerArgs) -> anyhow::Result<()> {
    let mut cfg = sluice_bench::scheduler::Config { requests: a.requests, queued: a.queued, rounds: a.rounds, ..Default::default() };
    if !a.policies.is_empty() {
        for p in &a.policies {
            anyhow::ensure!(sluice_core::PolicyConfig::from_name(p).is_some(), "unknown policy {p:?} (known: {})", sluice_core::POLICY_NAMES.join(", "));
        }
        cfg.policies = a.policies;
    }
    let report = sluice_bench::scheduler::run(&cfg);
    print!("{}", sluice_bench::scheduler::table(&report));
    if let Some(path) = a.json {
        write_json(&path, &report)?;
        println!("json: {}", path.display());
    }
    Ok(())
}
