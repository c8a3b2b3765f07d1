//! aioli on a disk whose cost model is wrong: with any one parameter off
//! by up to 10x either way (the fixed cost, the cost per byte, the seek
//! cost, the parallelism), the makespan of the seed's workloads on the
//! emulated 7200 rpm disk stays within `SLOWDOWN_MAX` of the makespan with
//! the true model. The learner's estimates move by less than that before
//! they settle, so a decision rule this robust cannot be fooled into a
//! larger loss by a model still learning.
//!
//! The model is given, not learned (replay, no learner): the policy's own
//! timing of the device (`policy/seen.rs`) is what must correct it.

mod common;

use common::*;
use proptest::prelude::*;
use sluice_core::replay::{replay, ReplayOptions, Stream};
use sluice_core::{DeviceCost, Limits, PolicyConfig, Scheduler};
use sluice_device::{DeviceModel, Hdd};

/// aioli's makespan with a wrong model over its makespan with the true
/// one, at most.
const SLOWDOWN_MAX: f64 = 1.2;

/// The emulated disk's own cost model, as the server gives its learner.
fn true_model() -> DeviceCost {
    let c = Hdd::hdd7200().cost_parts();
    DeviceCost::new(c.access_ns, c.byte_ps, c.seek_ns, 1)
}

/// The parameters a model has, by index.
const PARAMETERS: [&str; 4] = ["dispatch_ns", "byte_ps", "seek_ns", "parallelism"];

/// `m` with parameter `which` multiplied by `factor` (a zero part starts
/// from 50 us, the generic device's fixed cost; parallelism at least 1).
fn wrong(m: DeviceCost, which: usize, factor: f64) -> DeviceCost {
    let scale = |v: u64| ((if v == 0 { 50_000 } else { v }) as f64 * factor).round() as u64;
    match which {
        0 => DeviceCost { dispatch_ns: scale(m.dispatch_ns), ..m },
        1 => DeviceCost { byte_ps: scale(m.byte_ps).max(1), ..m },
        2 => DeviceCost { seek_ns: scale(m.seek_ns), ..m },
        _ => DeviceCost { parallelism: ((f64::from(m.parallelism) * factor).round() as u32).max(1), ..m },
    }
}

/// aioli's makespan over `streams` on the emulated disk, told `model`.
fn makespan(streams: &[Stream], model: DeviceCost) -> u64 {
    let limits = Limits { dispatches_inflight_max: 1, ..Limits::default() };
    let mut s = Scheduler::new(PolicyConfig::from_name("aioli").expect("known policy"), limits);
    s.set_device_cost(Some(model));
    let log = replay(&mut s, streams, hdd(), ReplayOptions::checked(10_000_000)).expect("replay completes");
    assert!(s.is_empty());
    log.end_ns
}

/// The seed's workloads, small, with the cats' think time `think_ns`: the
/// decomposition with 2 ms of arrival noise, two `cat`s of two files, the
/// decomposition beside a `cat`, and a small mix (a decomposition, a long
/// and a short `cat`, and a writer's pieces on a third file).
fn workloads(think_ns: u64) -> Vec<(&'static str, Vec<Stream>)> {
    let decomp = Decomp::new(32, 8 * KIB, 8).think(40_000, 2_000_000).streams();
    let cats = vec![cat(1, 1, 32 * KIB, 64, 0, think_ns), cat(2, 2, 32 * KIB, 64, 1_000, think_ns)];
    let mut interference = Decomp::new(16, 8 * KIB, 8).think(40_000, 1_000_000).streams();
    interference.push(cat(2, 2, 32 * KIB, 32, 1_000_000, think_ns));
    let mut mix = Decomp::new(8, 16 * KIB, 8).think(40_000, 1_000_000).streams();
    mix.push(cat(2, 2, 64 * KIB, 48, 1_000_000, think_ns));
    mix.push(cat(3, 3, 16 * KIB, 16, 2_000_000, think_ns));
    let writes = (0..32).map(|k| req(3_000_000 + k, 4, 0, 4, sluice_core::Op::Write, k * 32 * KIB, 32 * KIB)).collect();
    mix.push(sync_stream(500_000, think_ns, writes));
    vec![("decomposition", decomp), ("two cats", cats), ("interference", interference), ("mix", mix)]
}

#[test]
fn a_model_wrong_by_10x_in_one_parameter_costs_at_most_a_fifth() {
    let truth = true_model();
    let mut failures = Vec::new();
    for (name, streams) in workloads(30_000) {
        let base = makespan(&streams, truth);
        for (which, parameter) in PARAMETERS.iter().enumerate() {
            for factor in [0.1, 10.0] {
                let got = makespan(&streams, wrong(truth, which, factor));
                let ratio = got as f64 / base as f64;
                if ratio > SLOWDOWN_MAX {
                    failures.push(format!("{name}, {parameter} x{factor}: {ratio:.2}x ({got} ns against {base} ns)"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "aioli slowed by a wrong model:\n{}", failures.join("\n"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any factor up to 10x either way, any one parameter, any of the
    /// workloads, the cats thinking 10 us to 1 ms.
    #[test]
    fn any_error_up_to_10x_in_one_parameter_costs_at_most_a_fifth(
        which in 0..PARAMETERS.len(),
        log10 in -1.0f64..=1.0,
        workload in 0usize..4,
        think_ns in 10_000u64..1_000_000,
    ) {
        let (name, streams) = workloads(think_ns).swap_remove(workload);
        let truth = true_model();
        let factor = 10f64.powf(log10);
        let (base, got) = (makespan(&streams, truth), makespan(&streams, wrong(truth, which, factor)));
        let ratio = got as f64 / base as f64;
        prop_assert!(ratio <= SLOWDOWN_MAX, "{name}, {} x{factor:.2}: {ratio:.2}x ({got} ns against {base} ns)", PARAMETERS[which]);
    }
}
