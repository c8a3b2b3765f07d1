//! Property tests run against every policy: random applications, files,
//! offsets, lengths and ops, arriving over time from synchronous and
//! asynchronous streams, served by a device with random service times.

mod common;
use common::*;
use proptest::prelude::*;
use sluice_core::replay::{replay, Log, ReplayOptions, Stream};
use sluice_core::*;
use std::collections::HashMap;

const EXPIRE_NS: u64 = 5_000_000;
const SERVICE_NS_MAX: u64 = 200_000;

/// A small world so that overlaps and contiguity are frequent. Its three
/// files sit on both sides of the store's dense id bound, so both of its
/// tables serve every policy.
fn arb_request(id: u64) -> impl Strategy<Value = Request> {
    const FILES: [u64; 3] = [1, FILE_IDS_DENSE - 1, FILE_IDS_DENSE];
    (0u32..4, 0u32..3, 0usize..3, any::<bool>(), 0u64..24, 1u64..5).prop_map(move |(app, client, file, write, block, blocks)| {
        let op = if write { Op::Write } else { Op::Read };
        req(id, app, client, FILES[file], op, block * 1024, blocks * 1024)
    })
}

fn arb_stream(first_id: u64) -> impl Strategy<Value = Stream> {
    (0u64..2_000_000, 0u64..100_000, 0u64..50_000, 1usize..4, 1usize..12).prop_flat_map(move |(start_ns, think_ns, jitter_ns, depth, n)| {
        let reqs: Vec<_> = (0..n as u64).map(|k| arb_request(first_id + k)).collect();
        reqs.prop_map(move |requests| Stream { start_ns, think_ns, jitter_ns, depth, requests, thinks: Vec::new() })
    })
}

/// Streams, the device's seed, the dispatches in flight, and the QoS
/// weights of applications 0-3 (0: the background class).
type World = (Vec<Stream>, u64, u32, [u32; 4]);

fn arb_world() -> impl Strategy<Value = World> {
    let streams = (1usize..6).prop_flat_map(|n| (0..n).map(|i| arb_stream(i as u64 * 100)).collect::<Vec<_>>());
    (streams, any::<u64>(), 1u32..4, [0u32..4, 0u32..4, 0u32..4, 0u32..4])
}

fn run_world(policy: &str, (streams, seed, depth, weights): &World) -> Log {
    let (seed, depth) = (*seed, *depth);
    let limits = Limits { dispatches_inflight_max: depth, request_expire_ns: EXPIRE_NS, dispatch_bytes_max: 6 * 1024, ..Limits::default() };
    let mut s = Scheduler::new(PolicyConfig::from_name(policy).unwrap(), limits);
    for (app, &w) in weights.iter().enumerate() {
        s.set_app_weight(AppId(app as u32), w).unwrap();
    }
    let mut rng = seed | 1;
    let service = move |_: &Dispatch| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        1 + rng % SERVICE_NS_MAX
    };
    let log = replay(&mut s, streams, service, ReplayOptions::checked(1_000_000)).expect("replay completes");
    assert!(s.is_empty(), "{policy}: not drained");
    s.check_invariants();
    log
}

/// Every property, checked on one log. `weights`: of applications 0-3.
fn check(policy: &str, streams: &[Stream], weights: &[u32; 4], log: &Log) {
    let background = |r: &Request| weights[r.app.0 as usize] == 0;
    let all: HashMap<RequestId, Request> = streams.iter().flat_map(|s| s.requests.iter().map(|r| (r.id, *r))).collect();
    let arrival: HashMap<RequestId, u64> = log.arrivals.iter().copied().collect();
    let arrival_rank: HashMap<RequestId, usize> = log.arrivals.iter().enumerate().map(|(i, (id, _))| (*id, i)).collect();
    let mut served: HashMap<RequestId, (u64, u64)> = HashMap::new();
    for sv in &log.served {
        let d = &sv.dispatch;
        assert!(!d.members.is_empty());
        let mut end = d.offset;
        for m in &d.members {
            assert_eq!(all[&m.id], *m, "{policy}: member altered");
            assert!(m.file == d.file && m.op == d.op, "{policy}: mixed file or op in {d:?}");
            assert!(m.offset <= end, "{policy}: gap in aggregate {d:?}");
            if d.op == Op::Write {
                assert!(m.offset == end || end == d.offset, "{policy}: overlapping writes merged {d:?}");
            }
            end = end.max(m.end());
            assert!(served.insert(m.id, (sv.at_ns, sv.done_ns)).is_none(), "{policy}: {:?} dispatched twice", m.id);
        }
        assert_eq!(end, d.end(), "{policy}: aggregate range {d:?}");
        assert!(d.members.len() == 1 || d.len <= 6 * 1024, "{policy}: aggregate over dispatch_bytes_max");
    }
    assert_eq!(served.len(), all.len(), "{policy}: requests lost");
    // Overlapping pairs with a write: the later arrival starts after the
    // earlier one completed.
    let ids: Vec<_> = all.keys().copied().collect();
    for a in &ids {
        for b in &ids {
            let (ra, rb) = (all[a], all[b]);
            // A background request takes its place in the order when it is
            // let in; between two of them arrival order holds.
            let comparable = background(&ra) == background(&rb);
            if comparable && arrival_rank[a] < arrival_rank[b] && ra.overlaps(&rb) && (ra.op == Op::Write || rb.op == Op::Write) {
                assert!(served[b].0 >= served[a].1, "{policy}: {b:?} started before earlier overlapping {a:?} completed");
            }
        }
    }
    // Starvation bound: expiry plus the device time every other request
    // could take, plus the longest hold or window; for a background
    // request, one grace per request ahead of it in the class as well.
    let holds = AioliParams::default().hold_ns_max + AioliParams::default().sync_window_ns_max;
    let bound = EXPIRE_NS + all.len() as u64 * SERVICE_NS_MAX + holds;
    let grace = Limits::default().background_grace_ns;
    let background_n = all.values().filter(|r| background(r)).count() as u64;
    for (id, (at, _)) in &served {
        let bound = if background(&all[id]) { bound + background_n * (grace + bound) } else { bound };
        assert!(at - arrival[id] <= bound, "{policy}: {id:?} waited {} ns > {bound}", at - arrival[id]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_policy_keeps_every_invariant(world in arb_world()) {
        for policy in POLICY_NAMES {
            let log = run_world(policy, &world);
            check(policy, &world.0, &world.3, &log);
        }
    }

    #[test]
    fn every_policy_is_deterministic(world in arb_world()) {
        for policy in POLICY_NAMES {
            prop_assert_eq!(run_world(policy, &world), run_world(policy, &world));
        }
    }
}
