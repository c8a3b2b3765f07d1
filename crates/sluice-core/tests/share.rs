//! Composite sharing in the core (`Scheduler::set_app_share`): two users,
//! one running one job and the other four, get equal shares with users
//! then jobs; the applications' own shares without; the levels' bound at N
//! and N+1; a path changed while requests wait loses none.

mod common;

use common::{hdd, req, sync_stream, KIB};
use sluice_core::replay::{replay, Log, ReplayOptions, Stream};
use sluice_core::*;

/// `streams` synchronous readers of application `app`, each reading its
/// own file in `g` pieces, `count` each.
fn readers(app: u32, streams: u32, g: u64, count: u64) -> Vec<Stream> {
    (0..streams)
        .map(|s| {
            let file = u64::from(app) * 100 + u64::from(s);
            let id0 = file * 1_000_000;
            let reqs = (0..count).map(|k| req(id0 + k, app, s, file, Op::Read, k * g, g)).collect();
            sync_stream(u64::from(s) * 1_000, 20_000, reqs)
        })
        .collect()
}

/// Bytes each application moved by `until`.
fn bytes_by(log: &Log, app: u32, until: Nanos) -> u64 {
    log.served.iter().filter(|s| s.at_ns < until).flat_map(|s| s.dispatch.members.iter()).filter(|m| m.app == AppId(app)).map(|m| m.len).sum()
}

/// User 10 runs job 1 (application 1); user 20 runs jobs 2-5 (one
/// application each); 4 readers each, of 256 KiB pieces, on the emulated
/// disk. The two users' bytes while both ran.
fn two_users(policy: &str, shared: bool) -> (u64, u64) {
    let mut s = Scheduler::new(PolicyConfig::from_name(policy).unwrap(), Limits { dispatches_inflight_max: 1, ..Limits::default() });
    // As the daemon on the emulated disk: the policy knows it seeks.
    s.set_device_cost(Some(cost::DISK));
    if shared {
        s.set_app_share(AppId(1), &[10, 1]).unwrap();
        for j in 2..6u32 {
            s.set_app_share(AppId(j), &[20, u64::from(j)]).unwrap();
        }
    }
    let mut streams = readers(1, 4, 256 * KIB, 400);
    for j in 2..6 {
        streams.extend(readers(j, 4, 256 * KIB, 100));
    }
    let log = replay(&mut s, &streams, hdd(), ReplayOptions::checked(50_000_000)).unwrap();
    s.check_invariants();
    let until = (1..6).map(|a| common::completion_of(&log, a)).min().unwrap();
    let a = bytes_by(&log, 1, until);
    let b: u64 = (2..6).map(|j| bytes_by(&log, j, until)).sum();
    (a, b)
}

#[test]
fn users_then_jobs_give_two_users_equal_shares() {
    let (a, b) = two_users("aioli", true);
    let ratio = a as f64 / b as f64;
    assert!((0.9..=1.1).contains(&ratio), "one-job user {a} against four-job user {b} bytes: {ratio:.3}");
    // Without sharing each job is an application with its own turns: the
    // four-job user takes about four fifths.
    let (a, b) = two_users("aioli", false);
    let ratio = a as f64 / b as f64;
    assert!(ratio < 0.5, "without sharing: {a} against {b} bytes ({ratio:.3})");
}

#[test]
fn within_a_user_its_jobs_share_equally() {
    let mut s = Scheduler::new(PolicyConfig::from_name("aioli").unwrap(), Limits { dispatches_inflight_max: 1, ..Limits::default() });
    s.set_device_cost(Some(cost::DISK));
    // One user; job 1 has one application of 8 readers, job 2 two
    // applications of 4 each.
    s.set_app_share(AppId(1), &[10, 1]).unwrap();
    s.set_app_share(AppId(2), &[10, 2]).unwrap();
    s.set_app_share(AppId(3), &[10, 2]).unwrap();
    let mut streams = readers(1, 8, 256 * KIB, 200);
    streams.extend(readers(2, 4, 256 * KIB, 200));
    streams.extend(readers(3, 4, 256 * KIB, 200));
    let log = replay(&mut s, &streams, hdd(), ReplayOptions::checked(50_000_000)).unwrap();
    s.check_invariants();
    let until = (1..4).map(|a| common::completion_of(&log, a)).min().unwrap();
    let (j1, j2) = (bytes_by(&log, 1, until), bytes_by(&log, 2, until) + bytes_by(&log, 3, until));
    let ratio = j1 as f64 / j2 as f64;
    assert!((0.9..=1.1).contains(&ratio), "job 1 {j1} against job 2 {j2} bytes: {ratio:.3}");
}

#[test]
fn share_levels_bound_at_n_and_n_plus_one() {
    let mut s = common::scheduler("aioli");
    let keys = [1u64, 2, 3, 4];
    s.set_app_share(AppId(1), &keys[..SHARE_LEVELS_MAX]).unwrap();
    let e = s.set_app_share(AppId(1), &keys[..SHARE_LEVELS_MAX + 1]).unwrap_err();
    assert_eq!((e.kind, e.limit), (ErrorKind::InvalidRequest, SHARE_LEVELS_MAX as u64));
    s.set_app_share(AppId(1), &[]).unwrap();
    s.check_invariants();
}

#[test]
fn paths_changed_while_requests_wait_lose_none_and_stay_deterministic() {
    let run = || {
        let mut s = common::scheduler("aioli");
        let mut served = Vec::new();
        let mut id = 0u64;
        for round in 0..50u64 {
            for app in 1..5u32 {
                id += 1;
                s.enqueue(req(id, app, 0, u64::from(app), Op::Read, round * 4 * KIB, 4 * KIB), round * 1_000).unwrap();
            }
            // Move applications between users and off any path as they run.
            let app = AppId((round % 4) as u32 + 1);
            let keys: &[u64] = match round % 3 {
                0 => &[10, 1],
                1 => &[20],
                _ => &[],
            };
            s.set_app_share(app, keys).unwrap();
            s.check_invariants();
            let mut now = round * 1_000 + 500;
            while let Decision::Dispatch(d) = s.next(now) {
                served.extend(d.members.iter().map(|m| m.id));
                now += 100;
                s.complete(d.id, now).unwrap();
            }
        }
        let mut now = 1_000_000;
        loop {
            match s.next(now) {
                Decision::Dispatch(d) => {
                    served.extend(d.members.iter().map(|m| m.id));
                    now += 100;
                    s.complete(d.id, now).unwrap();
                }
                Decision::WaitUntil(t) => now = t,
                Decision::Idle => break,
            }
        }
        s.check_invariants();
        served
    };
    let served = run();
    let mut ids = served.clone();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!((served.len(), ids.len()), (200, 200), "every request served once");
    assert_eq!(served, run(), "two runs dispatch in the same order");
}
