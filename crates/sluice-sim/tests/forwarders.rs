//! Forwarder sets in the simulator: one home per file against a home per
//! process, the same policy code in every forwarder; and what a scenario
//! with forwarders may and may not ask.

mod common;

use common::{check, shipped};
use sluice_sim::{ErrorKind, ForwarderSet, Interface, RunOptions};

#[test]
fn one_home_per_file_aggregates_what_a_home_per_process_cannot() {
    for n in ["forwarders-64", "forwarders-1024"] {
        let sc = shipped(n);
        let r = check(&sc, 0.125, &["aioli", "aioli@client"]);
        let (file, client) = (r.run("aioli", None).unwrap(), r.run("aioli@client", None).unwrap());
        // Each file's 64 readers meet in one forwarder, whose scheduler
        // joins their pieces; a process's own forwarder sees one reader of
        // each file, nothing to join, and the disks seek between them.
        assert!(file.device_stats.requests_per_dispatch > 10.0 * client.device_stats.requests_per_dispatch, "{n}: {:?} against {:?}", file.device_stats, client.device_stats);
        assert!(file.makespan_s * 10.0 < client.makespan_s, "{n}: {} s against {} s", file.makespan_s, client.makespan_s);
        assert!(client.device_stats.seeks_far + client.device_stats.seeks_near > 10 * (file.device_stats.seeks_far + file.device_stats.seeks_near));
    }
}

#[test]
fn a_forwarder_run_is_deterministic() {
    let sc = shipped("forwarders-256");
    let a = check(&sc, 0.0625, &["aioli", "aioli@client"]);
    let b = check(&sc, 0.0625, &["aioli", "aioli@client"]);
    for (x, y) in a.runs.iter().zip(&b.runs) {
        assert_eq!((x.makespan_s, x.events, x.device_stats.dispatches), (y.makespan_s, y.events, y.device_stats.dispatches));
    }
}

#[test]
fn forwarder_scenarios_are_checked() {
    // A home per client needs forwarders.
    let plain = shipped("decomposition");
    let opts = RunOptions { modes: vec!["aioli@client".into()], ..RunOptions::default() };
    assert_eq!(sluice_sim::run(&plain, &opts).unwrap_err().kind, ErrorKind::UnknownMode);
    let opts = RunOptions { modes: vec!["aioli@elsewhere".into()], ..RunOptions::default() };
    assert_eq!(sluice_sim::run(&plain, &opts).unwrap_err().kind, ErrorKind::UnknownMode);
    // Bounds: 1..=SIM_SERVERS_MAX forwarders; posix requests only.
    let mut sc = shipped("forwarders-64");
    for (count, ok) in [(0, false), (1, true), (sluice_sim::SIM_SERVERS_MAX, true), (sluice_sim::SIM_SERVERS_MAX + 1, false)] {
        sc.forwarders = Some(ForwarderSet { count });
        assert_eq!(sc.validate().is_ok(), ok, "{count} forwarders");
    }
    sc.forwarders = Some(ForwarderSet { count: 4 });
    sc.apps[0].interface = Interface::Mpiio;
    assert!(sc.validate().unwrap_err().to_string().contains("posix requests only"));
}
