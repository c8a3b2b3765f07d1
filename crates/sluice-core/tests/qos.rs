//! Service classes in the core: a rate-limited class stays at its rate
//! while another uses the rest; a guaranteed class gets its guarantee
//! against 32 others; a new set of classes lets every waiting request in,
//! each served once; the bounds at N and N+1; determinism.

mod common;

use common::{flat, req, sync_stream, KIB, MIB};
use sluice_core::replay::{replay, Log, ReplayOptions, Stream};
use sluice_core::*;

const SEC: u64 = 1_000_000_000;

fn sched(policy: &str, limits: Limits) -> Scheduler {
    Scheduler::new(PolicyConfig::from_name(policy).unwrap(), Limits { dispatches_inflight_max: 1, ..limits })
}

/// `streams` synchronous readers of application `app`, each reading its
/// own region of file `app` in `g` pieces, `count` each.
fn readers(app: u32, streams: u32, g: u64, count: u64, id0: u64) -> Vec<Stream> {
    (0..streams)
        .map(|s| {
            let base = u64::from(s) * count * g;
            let reqs = (0..count).map(|k| req(id0 + u64::from(s) * count + k, app, s, u64::from(app), Op::Read, base + k * g, g)).collect();
            sync_stream(u64::from(s) * 1_000, 10_000, reqs)
        })
        .collect()
}

/// Bytes of `app` dispatched in each whole second of `[from, to)`.
fn per_second(log: &Log, app: u32, from: u64, to: u64) -> Vec<u64> {
    let mut out = vec![0u64; ((to - from) / SEC) as usize];
    for s in &log.served {
        let bytes: u64 = s.dispatch.members.iter().filter(|m| m.app == AppId(app)).map(|m| m.len).sum();
        if s.at_ns >= from && s.at_ns < from + out.len() as u64 * SEC {
            out[((s.at_ns - from) / SEC) as usize] += bytes;
        }
    }
    out
}

fn class(name: &str) -> ClassSpec {
    ClassSpec { name: name.into(), ..ClassSpec::default() }
}

#[test]
fn a_limited_class_keeps_its_rate_in_every_second_and_the_others_use_the_rest() {
    let rate = 20_000_000u64;
    for policy in ["fifo", "aioli"] {
        let mut s = sched(policy, Limits::default());
        s.set_qos(&[ClassSpec { rate_bytes_per_s: Some(rate), ..class("limited") }], 0).unwrap();
        assert!(s.set_app_class(AppId(1), Some("limited")));
        // 8 limited readers of 64 KiB (about 4 s at the rate), 8 others
        // that outlast them.
        let mut streams = readers(1, 8, 64 * KIB, 160, 0);
        streams.extend(readers(2, 8, 64 * KIB, 1_000, 1 << 20));
        // About 131 MB/s of device.
        let log = replay(&mut s, &streams, flat(500_000, 0), ReplayOptions::checked(50_000_000)).unwrap();
        s.check_invariants();
        let end1 = common::completion_of(&log, 1);
        let windows = per_second(&log, 1, 0, end1);
        assert!(windows.len() >= 3, "{policy}: the limited class ran {end1} ns");
        for (k, &b) in windows.iter().enumerate() {
            let err = (b as f64 - rate as f64) / rate as f64;
            assert!(err.abs() <= 0.05, "{policy}: second {k}: {b} bytes against {rate} ({:+.1}%)", err * 100.0);
        }
        // The other class had the device's rest meanwhile.
        let other = per_second(&log, 2, 0, end1);
        assert!(other.iter().all(|&b| b > 4 * rate), "{policy}: {other:?}");
        let stats = s.class_stats();
        assert_eq!(stats[0].name, "limited");
        assert_eq!(stats[0].admitted_bytes, 8 * 160 * 64 * KIB);
        assert_eq!((stats[0].held, stats[1].name.as_str()), (0, QOS_DEFAULT_CLASS));
    }
}

#[test]
fn a_guaranteed_class_gets_its_guarantee_against_32_others() {
    // One dispatch a millisecond, 64 KiB each: 65.5 MB/s of device. The
    // guaranteed reader alone would get 1/33 of it (2 MB/s).
    let guarantee = 16_000_000u64;
    // Enough for several seconds even at several times its guarantee.
    let mut streams = readers(1, 1, 64 * KIB, 4_000, 0);
    for a in 2..=33 {
        streams.extend(readers(a, 1, 64 * KIB, 400, u64::from(a) << 20));
    }
    let run = |with: bool| {
        let mut s = sched("aioli", Limits::default());
        if with {
            s.set_qos(&[ClassSpec { guarantee_bytes_per_s: Some(guarantee), ..class("gold") }], 0).unwrap();
            s.set_app_class(AppId(1), Some("gold"));
        }
        let log = replay(&mut s, &streams, flat(1_000_000, 0), ReplayOptions::checked(50_000_000)).unwrap();
        s.check_invariants();
        let end = common::completion_of(&log, 1);
        (per_second(&log, 1, 0, end), end)
    };
    let (with, _) = run(true);
    assert!(!with.is_empty(), "{with:?}");
    for (k, &b) in with.iter().enumerate() {
        assert!(b as f64 >= 0.95 * guarantee as f64, "second {k}: {b} bytes against a guarantee of {guarantee}: {with:?}");
    }
    let (without, _) = run(false);
    // While the others all run (their 838 MB take over 10 s).
    assert!(without.len() > 4 && without[..4].iter().all(|&b| (b as f64) < 0.5 * guarantee as f64), "without it the reader gets its fair share only: {without:?}");
}

#[test]
fn a_new_set_of_classes_lets_every_waiting_request_in_and_each_is_served_once() {
    // fifo keeps a limited class's requests in the class queue; aioli
    // paces the class itself, with every request in the policy.
    for policy in ["fifo", "aioli"] {
        new_set_of_classes(policy);
    }
}

fn new_set_of_classes(policy: &str) {
    let paced = policy == "aioli";
    let mut s = sched(policy, Limits::default());
    // 1 KB/s: after the first request the class is in debt for a long time.
    s.set_qos(&[ClassSpec { rate_bytes_per_s: Some(1_000), ..class("slow") }], 0).unwrap();
    s.set_app_class(AppId(1), Some("slow"));
    for i in 0..100u64 {
        s.enqueue(req(i, 1, 0, 1, Op::Read, i * 4 * KIB, 4 * KIB), 0).unwrap();
    }
    assert_eq!(s.stats().qos_held, if paced { 0 } else { 99 });
    assert!(!s.is_empty());
    // Only the first may go; the class waits about four seconds.
    let mut now = 0;
    let mut served = std::collections::BTreeSet::new();
    match s.next(now) {
        Decision::Dispatch(d) => {
            d.members.iter().for_each(|m| assert!(served.insert(m.id)));
            s.complete(d.id, now + 10).unwrap();
            now += 10;
        }
        d => panic!("{d:?}"),
    }
    // It waits for its tokens (4 s) or the expiry bound, whichever first.
    let wait = s.next(now);
    assert_eq!(wait, Decision::WaitUntil(Limits::default().request_expire_ns), "{policy}: {wait:?}");
    assert_eq!(s.stats().qos_held, if paced { 0 } else { 99 });
    // The operator drops the limit: everything waiting goes now.
    s.set_qos(&[], now).unwrap();
    assert_eq!(s.stats().qos_held, 0);
    loop {
        match s.next(now) {
            Decision::Dispatch(d) => {
                d.members.iter().for_each(|m| assert!(served.insert(m.id), "{:?} answered twice", m.id));
                now += 100;
                s.complete(d.id, now).unwrap();
            }
            Decision::WaitUntil(t) => now = t,
            Decision::Idle => break,
        }
        s.check_invariants();
    }
    assert_eq!(served.len(), 100, "every request once");
    assert!(s.is_empty());
}

#[test]
fn classes_and_class_queues_are_bounded() {
    let specs: Vec<ClassSpec> = (0..QOS_CLASSES_MAX - 1).map(|i| class(&format!("c{i}"))).collect();
    let mut s = sched("aioli", Limits::default());
    s.set_qos(&specs, 0).unwrap();
    let mut more = specs.clone();
    more.push(class("one-more"));
    assert!(s.set_qos(&more, 0).unwrap_err().to_string().contains("QOS_CLASSES_MAX"));
    for bad in [ClassSpec { rate_bytes_per_s: Some(0), ..class("zero") }, class(QOS_DEFAULT_CLASS), class(""), ClassSpec { depth_ns: QOS_DEPTH_NS_MAX + 1, ..class("deep") }] {
        assert!(s.set_qos(std::slice::from_ref(&bad), 0).is_err(), "{bad:?}");
    }
    assert!(s.set_qos(&[class("a"), class("a")], 0).is_err(), "a name twice");
    assert!(!s.set_app_class(AppId(1), Some("no-such-class")));
    // Requests waiting in a class queue count against the queue's bound.
    let mut s = sched("aioli", Limits { queued_requests_max: 10, ..Limits::default() });
    s.set_qos(&[ClassSpec { rate_requests_per_s: Some(1), depth_ns: 1, ..class("trickle") }], 0).unwrap();
    s.set_app_class(AppId(1), Some("trickle"));
    for i in 0..10u64 {
        s.enqueue(req(i, 1, 0, 1, Op::Read, i * MIB, 4 * KIB), 0).unwrap();
    }
    assert_eq!(s.room().0, 0);
    assert_eq!(s.enqueue(req(10, 1, 0, 1, Op::Read, 10 * MIB, 4 * KIB), 0).unwrap_err().kind, ErrorKind::QueueFull);
    s.check_invariants();
}

#[test]
fn a_request_never_waits_in_its_class_past_the_expiry_bound() {
    let expire = Limits::default().request_expire_ns;
    let mut s = sched("fifo", Limits::default());
    s.set_qos(&[ClassSpec { rate_bytes_per_s: Some(1), ..class("starved") }], 0).unwrap();
    s.set_app_class(AppId(1), Some("starved"));
    s.enqueue(req(0, 1, 0, 1, Op::Read, 0, 4 * KIB), 0).unwrap();
    s.enqueue(req(1, 1, 0, 1, Op::Read, 4 * KIB, 4 * KIB), 0).unwrap();
    let Decision::Dispatch(d) = s.next(0) else { panic!() };
    s.complete(d.id, 1).unwrap();
    match s.next(1) {
        Decision::WaitUntil(t) => assert_eq!(t, expire, "woken at the expiry bound, not in hours"),
        d => panic!("{d:?}"),
    }
    assert!(matches!(s.next(expire), Decision::Dispatch(_)));
    assert_eq!(s.class_stats()[0].expired, 1);
}

#[test]
fn classes_are_deterministic() {
    let streams: Vec<Stream> = readers(1, 4, 64 * KIB, 50, 0).into_iter().chain(readers(2, 4, 64 * KIB, 200, 1 << 20)).collect();
    let run = || {
        let mut s = sched("aioli", Limits::default());
        s.set_qos(&[ClassSpec { rate_bytes_per_s: Some(10_000_000), guarantee_bytes_per_s: Some(5_000_000), ..class("x") }], 0).unwrap();
        s.set_app_class(AppId(1), Some("x"));
        replay(&mut s, &streams, flat(100_000, 0), ReplayOptions::checked(10_000_000)).unwrap()
    };
    assert_eq!(run(), run());
}

/// On the emulated 7200 rpm disk, as `sluice bench qos` runs it: aIOLi
/// paces the classes itself (bursts with its readers' windows), so a
/// limited class keeps its rate in every second, and a guaranteed class
/// gets at least its guarantee, where each request alone would cost a
/// seek.
#[test]
fn on_a_seeking_disk_a_paced_limit_keeps_its_rate_and_a_guarantee_is_met() {
    let rate = 20_000_000u64;
    let mut s = sched("aioli", Limits::default());
    s.set_device_cost(Some(cost::DISK));
    s.set_qos(&[ClassSpec { rate_bytes_per_s: Some(rate), ..class("limited") }], 0).unwrap();
    s.set_app_class(AppId(1), Some("limited"));
    let mut streams = readers(1, 8, 256 * KIB, 50, 0);
    streams.extend(readers(2, 8, 256 * KIB, 400, 1 << 20));
    let log = replay(&mut s, &streams, common::hdd(), ReplayOptions::checked(50_000_000)).unwrap();
    s.check_invariants();
    let end = common::completion_of(&log, 1);
    let limited = per_second(&log, 1, 0, end);
    assert!(limited.len() >= 4, "{limited:?}");
    for (k, &b) in limited.iter().enumerate() {
        let err = (b as f64 - rate as f64) / rate as f64;
        assert!(err.abs() <= 0.05, "second {k}: {b} bytes against {rate} ({:+.1}%): {limited:?}", err * 100.0);
    }
    assert!(per_second(&log, 2, 0, end).iter().all(|&b| b > 0), "the others go on meanwhile");

    let guarantee = 20_000_000u64;
    let mut s = sched("aioli", Limits::default());
    s.set_device_cost(Some(cost::DISK));
    s.set_qos(&[ClassSpec { guarantee_bytes_per_s: Some(guarantee), ..class("gold") }], 0).unwrap();
    s.set_app_class(AppId(1), Some("gold"));
    let mut streams = readers(1, 2, 256 * KIB, 400, 0);
    for a in 2..=33 {
        streams.extend(readers(a, 1, 256 * KIB, 100, u64::from(a) << 20));
    }
    let log = replay(&mut s, &streams, common::hdd(), ReplayOptions::checked(50_000_000)).unwrap();
    s.check_invariants();
    let end = common::completion_of(&log, 1);
    let gold = per_second(&log, 1, 0, end);
    assert!(gold.len() >= 2, "{gold:?}");
    assert!(gold.iter().all(|&b| b >= guarantee), "every second at least {guarantee}: {gold:?}");
}
