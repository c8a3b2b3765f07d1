//! Shared helpers for the core's tests: building requests and streams,
//! device service models, and one `run` entry point over the replay driver.
#![allow(dead_code)]

use sluice_core::replay::{replay, Log, ReplayOptions, Stream};
use sluice_core::*;
use sluice_device::{Access, DeviceModel, Hdd};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;

pub fn req(id: u64, app: u32, client: u32, file: u64, op: Op, offset: u64, len: u64) -> Request {
    Request { id: RequestId(id), app: AppId(app), client: ClientId(client), file: FileId(file), op, offset, len }
}

/// A synchronous stream (one request outstanding) with the given think time.
pub fn sync_stream(start_ns: u64, think_ns: u64, requests: Vec<Request>) -> Stream {
    Stream { start_ns, think_ns, jitter_ns: think_ns / 2, depth: 1, requests, thinks: Vec::new() }
}

/// The seed's decomposition: `procs` processes of application `app` read
/// file `file` cyclically with granularity `g` (process i takes pieces i,
/// i + P, i + 2P, …), `rounds` pieces each. Ids start at `id0`. Each think
/// time varies by up to `jitter_ns` (compute and network noise).
pub struct Decomp {
    pub app: u32,
    pub file: u64,
    pub procs: u32,
    pub g: u64,
    pub rounds: u64,
    pub id0: u64,
    pub think_ns: u64,
    pub jitter_ns: u64,
}

impl Decomp {
    /// `procs` processes, granularity `g`, `rounds` pieces each, on file 1
    /// of application 1, 40 µs think time without jitter.
    pub fn new(procs: u32, g: u64, rounds: u64) -> Decomp {
        Decomp { app: 1, file: 1, procs, g, rounds, id0: 0, think_ns: 40_000, jitter_ns: 0 }
    }

    pub fn think(self, think_ns: u64, jitter_ns: u64) -> Decomp {
        Decomp { think_ns, jitter_ns, ..self }
    }

    pub fn streams(&self) -> Vec<Stream> {
        (0..self.procs)
            .map(|p| {
                let reqs = (0..self.rounds)
                    .map(|k| {
                        let piece = k * u64::from(self.procs) + u64::from(p);
                        req(self.id0 + piece, self.app, p, self.file, Op::Read, piece * self.g, self.g)
                    })
                    .collect();
                Stream { start_ns: u64::from(p) * 1_000, think_ns: self.think_ns, jitter_ns: self.jitter_ns, depth: 1, requests: reqs, thinks: Vec::new() }
            })
            .collect()
    }
}

/// A `cat`: one process reading `file` sequentially in `g` pieces.
pub fn cat(app: u32, file: u64, g: u64, count: u64, id0: u64, think_ns: u64) -> Stream {
    let reqs = (0..count).map(|k| req(id0 + k, app, 0, file, Op::Read, k * g, g)).collect();
    sync_stream(0, think_ns, reqs)
}

/// A busy application (2): one process reading file 2 in `count` 32 KiB
/// pieces with eight in flight, so it always has requests queued. Ids
/// start at `id0`.
pub fn busy(count: u64, id0: u64) -> Stream {
    Stream { depth: 8, ..cat(2, 2, 32 * KIB, count, id0, 0) }
}

/// A device whose every dispatch costs `per_dispatch_ns + len * ns_per_byte`.
pub fn flat(per_dispatch_ns: u64, ns_per_kib: u64) -> impl FnMut(&Dispatch) -> Nanos {
    move |d| per_dispatch_ns + d.len / KIB * ns_per_kib
}

/// The emulated 7200 rpm disk.
pub fn hdd() -> impl FnMut(&Dispatch) -> Nanos {
    let mut disk = Hdd::hdd7200();
    move |d| disk.service_ns(Access { file: d.file.0, offset: d.offset, len: d.len })
}

pub fn scheduler(policy: &str) -> Scheduler {
    Scheduler::new(PolicyConfig::from_name(policy).expect("known policy"), Limits::default())
}

/// Replay `streams` under `policy` with one dispatch in flight, checking
/// invariants after every event.
pub fn run(policy: &str, streams: &[Stream], service: impl FnMut(&Dispatch) -> Nanos) -> Log {
    let limits = Limits { dispatches_inflight_max: 1, ..Limits::default() };
    let mut s = Scheduler::new(PolicyConfig::from_name(policy).expect("known policy"), limits);
    let log = replay(&mut s, streams, service, ReplayOptions::checked(10_000_000)).expect("replay completes");
    assert!(s.is_empty(), "{policy}: scheduler not drained");
    s.check_invariants();
    log
}

/// Requests per dispatch over a log.
pub fn requests_per_dispatch(log: &Log) -> f64 {
    let reqs: usize = log.served.iter().map(|s| s.dispatch.members.len()).sum();
    reqs as f64 / log.served.len() as f64
}

/// Number of dispatches that needed a head movement between files or a
/// jump within a file.
pub fn seeks(log: &Log) -> usize {
    let mut order = log.served.clone();
    order.sort_by_key(|s| s.at_ns);
    order.windows(2).filter(|w| w[0].dispatch.file != w[1].dispatch.file || w[0].dispatch.end() != w[1].dispatch.offset).count()
}

/// When the last request of `app` completed.
pub fn completion_of(log: &Log, app: u32) -> Nanos {
    log.served.iter().filter(|s| s.dispatch.members.iter().any(|m| m.app == AppId(app))).map(|s| s.done_ns).max().unwrap_or(0)
}

/// Drive `s` one dispatch at a time, each completing 1 µs after it left,
/// until it is idle (a window or a hold is waited out), checking
/// invariants; returns its turns: each run of consecutive dispatches of
/// one application, with their bytes.
pub fn drain_turns(s: &mut Scheduler, mut now: Nanos) -> Vec<(u32, u64)> {
    let mut turns: Vec<(u32, u64)> = Vec::new();
    loop {
        let d = match s.next(now) {
            Decision::Dispatch(d) => d,
            Decision::WaitUntil(t) => {
                now = t;
                continue;
            }
            Decision::Idle => break,
        };
        let app = d.members[0].app.0;
        match turns.last_mut() {
            Some((a, bytes)) if *a == app => *bytes += d.len,
            _ => turns.push((app, d.len)),
        }
        now += 1_000;
        s.complete(d.id, now).unwrap();
        s.check_invariants();
    }
    assert!(s.is_empty(), "idle with requests queued");
    turns
}
