//! `auto` (policy/auto.rs): on a device model that the scheduler knows, it
//! serves a workload about as soon as the better of aioli and fifo-merge,
//! switching only when its replay of the recent requests says so, and the
//! same inputs give the same switches.
mod common;

use common::*;
use sluice_core::replay::{replay, Log, ReplayOptions, Stream};
use sluice_core::*;

/// A disk: 100 µs a dispatch, 100 MB/s, 8 ms a seek, one at a time.
const DISK: DeviceCost = DeviceCost { dispatch_ns: 100_000, byte_ps: 10_000, seek_ns: 8_000_000, parallelism: 1 };
/// Flash: 20 µs a dispatch, 2 GB/s, no seek, eight at once.
const FLASH: DeviceCost = DeviceCost { dispatch_ns: 20_000, byte_ps: 500, seek_ns: 0, parallelism: 8 };

/// Replay `streams` under `policy` on a device that takes exactly what
/// `cost` says (a seek where a dispatch does not continue the one
/// before), as many in flight as its parallelism, the scheduler told the
/// model; every invariant checked at the end.
fn run_on(policy: &str, streams: &[Stream], cost: Option<DeviceCost>) -> (Log, Stats, &'static str) {
    run_checked(policy, streams, cost, false)
}

/// `run_on`, with every invariant checked after every event when `checked`.
fn run_checked(policy: &str, streams: &[Stream], cost: Option<DeviceCost>, checked: bool) -> (Log, Stats, &'static str) {
    let model = cost.unwrap_or(FLASH);
    let depth = model.parallelism;
    let mut s = Scheduler::new(PolicyConfig::from_name(policy).expect("known policy"), Limits { dispatches_inflight_max: depth, ..Limits::default() });
    s.set_device_cost(cost);
    s.set_depth(depth);
    let log = replay(&mut s, streams, model.serving(), ReplayOptions { events_max: 100_000_000, check_invariants: checked, host: None }).expect("replay completes");
    assert!(s.is_empty(), "{policy}: not drained");
    s.check_invariants();
    (log, s.stats(), s.active_policy_name())
}

fn end(log: &Log) -> u64 {
    log.served.iter().map(|s| s.done_ns).max().expect("something was served")
}

/// The decomposition and a `cat` on the disk (aioli's ground), and
/// decompositions on flash, where fifo-merge serves some sooner.
fn cases() -> Vec<(&'static str, DeviceCost, Vec<Stream>)> {
    let flash_decomp = |procs, g, rounds| Decomp::new(procs, g, rounds).think(40_000, 20_000).streams();
    vec![
        ("disk: 16 x 4 KiB decomposition and a cat", DISK, {
            let mut v = Decomp::new(16, 4 * KIB, 1_000).streams();
            v.push(cat(3, 3, 64 * KIB, 1_000, 1_000_000, 0));
            v
        }),
        ("flash: 32 x 64 KiB", FLASH, flash_decomp(32, 64 * KIB, 600)),
        ("flash: 32 x 4 KiB", FLASH, flash_decomp(32, 4 * KIB, 2_000)),
        ("flash: 128 x 1 MiB", FLASH, flash_decomp(128, MIB, 40)),
        ("flash: 8 x 64 KiB", FLASH, flash_decomp(8, 64 * KIB, 3_000)),
    ]
}

#[test]
fn auto_ends_within_5_percent_of_the_better_of_aioli_and_fifo_merge() {
    for (name, cost, streams) in cases() {
        let t = |p| end(&run_on(p, &streams, Some(cost)).0);
        let (aioli, merge, auto) = (t("aioli"), t("fifo-merge"), t("auto"));
        let best = aioli.min(merge);
        assert!(auto * 100 <= best * 105, "{name}: auto {auto} ns, aioli {aioli}, fifo-merge {merge}");
    }
}

#[test]
fn auto_switches_where_fifo_merge_serves_sooner_and_counts_it() {
    let streams = Decomp::new(32, 4 * KIB, 2_000).think(40_000, 20_000).streams();
    let (aioli, merge) = (end(&run_on("aioli", &streams, Some(FLASH)).0), end(&run_on("fifo-merge", &streams, Some(FLASH)).0));
    assert!(merge * 100 < aioli * 90, "the case needs fifo-merge clearly ahead: {merge} against {aioli}");
    let (log, stats, active) = run_on("auto", &streams, Some(FLASH));
    assert_eq!(active, "fifo-merge");
    assert!(stats.policy_switches >= 1, "{stats:?}");
    assert!(end(&log) * 100 <= merge * 105);
}

#[test]
fn auto_keeps_aioli_on_a_disk() {
    let streams = cases().swap_remove(0).2;
    let (log, stats, active) = run_on("auto", &streams, Some(DISK));
    let (aioli_log, aioli_stats, _) = run_on("aioli", &streams, Some(DISK));
    assert_eq!((active, stats.policy_switches), ("aioli", 0));
    assert_eq!(log, aioli_log, "no switch: aioli's very schedule");
    assert_eq!(stats.windows, aioli_stats.windows, "aioli's windows are auto's while it chooses");
}

#[test]
fn without_a_device_model_auto_is_aioli() {
    let streams = Decomp::new(32, 4 * KIB, 2_000).think(40_000, 20_000).streams();
    let (log, stats, active) = run_on("auto", &streams, None);
    assert_eq!((active, stats.policy_switches), ("aioli", 0));
    assert_eq!(log, run_on("aioli", &streams, None).0);
}

#[test]
fn the_same_requests_make_the_same_switches() {
    let streams = Decomp::new(32, 64 * KIB, 600).think(40_000, 20_000).streams();
    let (a, sa, _) = run_on("auto", &streams, Some(FLASH));
    let (b, sb, _) = run_on("auto", &streams, Some(FLASH));
    assert!(sa.policy_switches > 0, "the case switches: {sa:?}");
    assert_eq!((a, sa), (b, sb));
}

#[test]
fn every_other_policy_counts_no_switch() {
    let streams = Decomp::new(8, 4 * KIB, 200).streams();
    for p in POLICY_NAMES.iter().filter(|&&p| p != "auto") {
        let (_, stats, active) = run_on(p, &streams, Some(FLASH));
        assert_eq!((stats.policy_switches, active), (0, *p));
    }
}

/// Both candidates see every request whichever chooses, so the
/// scheduler's and each candidate's invariants hold after every event,
/// across the switches.
#[test]
fn invariants_hold_across_switches() {
    let streams = Decomp::new(32, 64 * KIB, 200).think(40_000, 20_000).streams();
    let (_, stats, _) = run_checked("auto", &streams, Some(FLASH), true);
    assert!(stats.policy_switches >= 1, "the case switches: {stats:?}");
}
