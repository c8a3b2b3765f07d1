//! Profiling entry point: one policy of the scheduler bench, one round.
fn main() {
    let policy = std::env::args().nth(1).unwrap_or_else(|| "aioli".into());
    let cfg = sluice_bench::scheduler::Config { rounds: 1, policies: vec![policy], ..Default::default() };
    print!("{}", sluice_bench::scheduler::table(&sluice_bench::scheduler::run(&cfg)));
}
