//! "What would have happened": replay a live trace (`sluice serve --trace`)
//! or a Darshan log's DXT records under other policies (`sluice what-if`).
//!
//! The trace holds every request a server answered: its application, its
//! connection (one stream), file, offset, length, arrival and answer, and
//! every dispatch with its system call's time. Each connection becomes a
//! [`Stream`] that keeps its requests' order, its concurrency (the most it
//! had in flight) and its think times (the gap between an answer and the
//! request it let go). The streams are replayed by the core's deterministic
//! driver (`sluice_core::replay`) through each policy, on a device that
//! behaves as the recorded one did: a [`CostLearner`] fitted to the
//! recorded dispatches (fixed cost, cost per byte, seek cost, parallelism),
//! or the emulated 7200 rpm disk. The recorded run itself is the first row,
//! so the table reads "what happened, and what would have".
//!
//! Bounds: a trace file of at most `TRACE_FILE_BYTES_MAX`, at most `REQUESTS_MAX` requests are read from a trace (more is
//! an error, not a silent cut); streams are at most `STREAM_DEPTH_MAX` deep.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sluice_core::replay::{replay_observed, Host, HostQueue, ReplayOptions, Stream};
use sluice_core::{AppId, ClientId, CostLearner, Dispatch, FileId, Limits, Observation, Op, PolicyConfig, Request, RequestId, Scheduler};
use sluice_device::{Access, Channels, DeviceModel, Hdd, Ssd};

use crate::error::{Error, ErrorKind};

/// Application `a`'s requests are on process `PID_APP_BASE + a` of a live
/// trace (`sluice_server::trace`, which this crate does not depend on).
const PID_APP_BASE: u32 = 1_000;
/// Bytes of a trace file `sluice what-if` reads (a live trace stops at
/// `trace_bytes_max`, 256 MiB by default).
pub const TRACE_FILE_BYTES_MAX: u64 = 1 << 30;
/// Requests a trace may hold for a replay.
pub const REQUESTS_MAX: usize = 4_000_000;
/// Requests one replayed stream keeps in flight, at most.
pub const STREAM_DEPTH_MAX: usize = 64;
/// Events one replay may take (a policy that never finishes is an error).
const EVENTS_MAX: u64 = 200_000_000;

/// How the replayed device serves a dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The device the trace says its server had: the emulated disk when
    /// it ran on one (`sluice serve --device hdd7200`), else `Recorded`.
    Auto,
    /// The model learned from the trace's own dispatches.
    Recorded,
    /// The emulated 7200 rpm disk (`sluice serve --device hdd7200`).
    Hdd7200,
    /// The disk `Options::disk` describes, as `sluice calibrate` measured
    /// it (`sluice calibrate --host` keeps one in the host profile).
    Calibrated,
}

/// A calibrated disk as what-if serves it: the model `sluice calibrate`
/// fitted (fixed cost, bandwidth, seek) on `channels` channels that share
/// the part of each dispatch measured at the server's queue depth
/// (`sluice_device::Channels`; `sluice_bench::calibrate::sim_device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Disk {
    pub figures: crate::ProfileFigures,
    pub channels: u32,
    /// CPU of the server's loop a dispatch costs (`Host::dispatch_ns`).
    pub dispatch_cpu_ns: u64,
}

/// The queue depth of a recording server whose trace does not say it
/// (`sluice serve`'s default, `sluice_server::QUEUE_DEPTH_DEFAULT`).
const SERVER_DEPTH_DEFAULT: u32 = 8;

/// How a what-if replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub device: Device,
    /// The host the recorded processes and their server shared (`None`:
    /// an answer lets its process go at once). The recorded think times
    /// are taken net of what this host would have delayed each answer, and
    /// the replay adds what it delays under the other policy.
    pub host: Option<Host>,
    /// The recording machine's disk as calibrated, for traces of a server
    /// on the real device with O_DIRECT (`Device::Auto` serves them on it).
    pub disk: Option<Disk>,
}

/// Service classes and a sharing order for the replays (`sluice what-if
/// --qos`): the classes, and each recorded application's class and path
/// of share groups, by name.
#[derive(Clone, Debug, Default)]
pub struct QosPlan {
    pub classes: Vec<sluice_core::ClassSpec>,
    pub apps: HashMap<String, (Option<String>, Vec<u64>)>,
}

/// One request as recorded.
#[derive(Clone, Copy, Debug)]
struct Rec {
    req: Request,
    arrival: u64,
    answer: u64,
}

/// A trace read back.
#[derive(Debug, Default)]
pub struct Recording {
    names: HashMap<u32, String>,
    requests: Vec<Rec>,
    /// Dispatches: `(start, end, file, offset, len)`, ns.
    dispatches: Vec<(u64, u64, u64, u64, u64)>,
    /// The device the recording server named (`real`, `hdd7200`, `null`),
    /// where the trace says.
    server_device: Option<String>,
    /// Whether the recording server read and wrote with O_DIRECT, and its
    /// queue depth, where the trace says.
    server_direct: Option<bool>,
    server_depth: Option<u32>,
}

#[derive(Deserialize)]
struct Doc {
    #[serde(rename = "traceEvents")]
    events: Vec<Ev>,
}

#[derive(Deserialize)]
struct Ev {
    name: String,
    ph: String,
    #[serde(default)]
    cat: Option<String>,
    #[serde(default)]
    id: Option<String>,
    pid: u32,
    ts: f64,
    #[serde(default)]
    args: Option<serde_json::Value>,
}

fn bad(m: impl Into<String>) -> Error {
    Error::new(ErrorKind::Trace, m.into())
}

impl Recording {
    /// Parse a live trace's JSON.
    pub fn parse(json: &str) -> Result<Recording, Error> {
        let doc: Doc = serde_json::from_str(json).map_err(|e| bad(format!("not a trace-event JSON document: {e}")))?;
        let mut rec = Recording::default();
        let mut open: HashMap<String, (Request, u64)> = HashMap::new();
        let mut dispatch_open: HashMap<String, (u64, u64, u64, u64)> = HashMap::new();
        let ns = |ts: f64| (ts * 1e3).round().max(0.0) as u64;
        for e in doc.events {
            let arg = |k: &str| e.args.as_ref().and_then(|a| a.get(k)).and_then(serde_json::Value::as_u64);
            match (e.ph.as_str(), e.cat.as_deref()) {
                ("M", _) if e.name == "process_name" && e.pid < PID_APP_BASE => {
                    if let Some(d) = e.args.as_ref().and_then(|a| a.get("device")).and_then(|v| v.as_str()) {
                        rec.server_device = Some(d.to_string());
                    }
                    rec.server_direct = e.args.as_ref().and_then(|a| a.get("direct")).and_then(serde_json::Value::as_bool);
                    rec.server_depth = arg("queue_depth").map(|d| d.clamp(1, u64::from(sluice_core::cost::DEPTH_MAX)) as u32);
                }
                ("M", _) if e.name == "process_name" && e.pid >= PID_APP_BASE => {
                    if let Some(n) = e.args.as_ref().and_then(|a| a.get("name")).and_then(|v| v.as_str()) {
                        rec.names.insert(e.pid - PID_APP_BASE, n.to_string());
                    }
                }
                ("b", Some("request")) => {
                    let id = e.id.clone().ok_or_else(|| bad("a request without an id"))?;
                    let op = if e.name.starts_with("write") { Op::Write } else { Op::Read };
                    let (Some(file), Some(client), Some(offset), Some(len)) = (arg("file"), arg("client"), arg("offset"), arg("len")) else {
                        return Err(bad(format!("request {id} lacks file, client, offset or len (a trace from before sluice recorded them?)")));
                    };
                    let rid = id.trim_start_matches('r').parse().map_err(|_| bad(format!("request id {id:?}")))?;
                    let app = e
                        .pid
                        .checked_sub(PID_APP_BASE)
                        .ok_or_else(|| bad(format!("request {id} on process {}, not an application's (a trace from before sluice gave each application its process?)", e.pid)))?;
                    let req = Request { id: RequestId(rid), app: AppId(app), client: ClientId(client as u32), file: FileId(file), op, offset, len: len.max(1) };
                    open.insert(id, (req, ns(e.ts)));
                }
                ("e", Some("request")) => {
                    let id = e.id.clone().unwrap_or_default();
                    if let Some((req, arrival)) = open.remove(&id) {
                        if rec.requests.len() >= REQUESTS_MAX {
                            return Err(bad(format!("the trace holds more than {REQUESTS_MAX} requests")));
                        }
                        rec.requests.push(Rec { req, arrival, answer: ns(e.ts).max(arrival) });
                    }
                }
                ("b", Some("dispatch")) => {
                    let (file, offset, len) = (arg("file").unwrap_or(0), arg("offset").unwrap_or(0), arg("len").unwrap_or(0));
                    dispatch_open.insert(e.id.clone().unwrap_or_default(), (ns(e.ts), file, offset, len));
                }
                ("e", Some("dispatch")) => {
                    if let Some((start, file, offset, len)) = dispatch_open.remove(&e.id.clone().unwrap_or_default()) {
                        rec.dispatches.push((start, ns(e.ts).max(start), file, offset, len));
                    }
                }
                _ => {}
            }
        }
        if rec.requests.is_empty() {
            return Err(bad("the trace holds no request (record one with `sluice serve --trace PATH`)"));
        }
        rec.requests.sort_by_key(|r| (r.arrival, r.req.id));
        rec.dispatches.sort_unstable();
        Ok(rec)
    }

    /// A Darshan log's DXT segments, as `scripts/darshan-dxt.py` prints
    /// them: one application (the log's executable), one stream per rank,
    /// each access a request from its start to its end. A Darshan log
    /// records no dispatches, so the recorded device is learned from the
    /// accesses themselves (each one a dispatch of its own).
    pub fn from_darshan(json: &str) -> Result<Recording, Error> {
        #[derive(Deserialize)]
        struct Dxt {
            exe: String,
            segments: Vec<(u32, u64, String, u64, u64, f64, f64)>,
        }
        let d: Dxt = serde_json::from_str(json).map_err(|e| bad(format!("not the DXT JSON of scripts/darshan-dxt.py: {e}")))?;
        if d.segments.len() > REQUESTS_MAX {
            return Err(bad(format!("the log holds more than {REQUESTS_MAX} accesses")));
        }
        let exe = d.exe.split_whitespace().next().unwrap_or("").rsplit('/').next().unwrap_or("");
        let mut rec = Recording::default();
        rec.names.insert(1, if exe.is_empty() { "darshan".into() } else { exe.to_string() });
        let ns = |s: f64| (s * 1e9).round().max(0.0) as u64;
        for (k, (rank, file, op, offset, len, start, end)) in d.segments.into_iter().enumerate() {
            let op = if op == "w" { Op::Write } else { Op::Read };
            let req = Request { id: RequestId(k as u64 + 1), app: AppId(1), client: ClientId(rank), file: FileId(file + 1), op, offset, len: len.max(1) };
            let (a, b) = (ns(start), ns(end).max(ns(start)));
            rec.requests.push(Rec { req, arrival: a, answer: b });
            rec.dispatches.push((a, b, file + 1, offset, len));
        }
        if rec.requests.is_empty() {
            return Err(bad("the log's DXT records hold no access"));
        }
        rec.requests.sort_by_key(|r| (r.arrival, r.req.id));
        rec.dispatches.sort_unstable();
        Ok(rec)
    }

    /// The log's application for the simulator (`sluice sim SCENARIO
    /// --darshan LOG`): one POSIX process per rank replaying its
    /// accesses, each after its recorded think time (its first one after
    /// the log's first access).
    pub fn darshan_app(json: &str) -> Result<crate::App, Error> {
        let rec = Recording::from_darshan(json)?;
        let t0 = rec.requests[0].arrival;
        let ranks = rec.requests.iter().map(|r| r.req.client.0).max().unwrap_or(0) as usize + 1;
        if ranks as u64 > crate::PROCS_MAX {
            return Err(bad(format!("the log has {ranks} ranks (the simulator takes {})", crate::PROCS_MAX)));
        }
        let mut per: Vec<Vec<Rec>> = vec![Vec::new(); ranks];
        rec.requests.iter().for_each(|r| per[r.req.client.0 as usize].push(*r));
        let recorded = crate::Recorded {
            ranks: per
                .iter()
                .map(|v| {
                    v.iter()
                        .enumerate()
                        .map(|(k, r)| {
                            let think_ns = if k == 0 { r.arrival - t0 } else { r.arrival.saturating_sub(v[k - 1].answer) };
                            crate::RecordedAccess { write: r.req.op == Op::Write, file: (r.req.file.0 - 1) as u32, offset: r.req.offset, len: r.req.len, think_ns }
                        })
                        .collect()
                })
                .collect(),
        };
        let bytes = rec.requests.iter().map(|r| r.req.len).sum();
        let len_max = rec.requests.iter().map(|r| r.req.len).max().unwrap_or(1);
        Ok(crate::App {
            recorded: Some(std::sync::Arc::new(recorded)),
            ..crate::App::posix(rec.name(AppId(1)), ranks as u64, crate::OpName::Read, crate::Pattern::Contiguous, bytes, len_max)
        })
    }

    /// The device cost model the recorded dispatches imply.
    pub fn learned(&self) -> CostLearner {
        let mut l = CostLearner::new(None);
        let mut ends: Vec<u64> = Vec::new();
        let mut head: Option<(u64, u64)> = None;
        for &(start, end, file, offset, len) in &self.dispatches {
            ends.retain(|&e| e > start);
            ends.push(end);
            let seek = head != Some((file, offset));
            head = Some((file, offset + len));
            l.observe(Observation { len, seek, depth: ends.len() as u32, latency_ns: end - start });
        }
        l
    }

    /// What the recording server spent on each dispatch of its emulated
    /// disk beyond the disk's model (see [`Handoff`]); nothing unless the
    /// trace names `hdd7200` as its device.
    pub fn handoff(&self) -> Handoff {
        if self.server_device.as_deref() != Some("hdd7200") {
            return Handoff::default();
        }
        let mut hdd = Hdd::hdd7200();
        let over: Vec<u64> = self.dispatches.iter().map(|&(start, end, file, offset, len)| (end - start).saturating_sub(hdd.service_ns(Access { file, offset, len }))).collect();
        // The latest answer of the requests that arrived before each time:
        // work was waiting at a dispatch's end when a request that came
        // before it was answered after the next dispatch's end.
        let mut answered_by: Vec<(u64, u64)> = Vec::with_capacity(self.requests.len());
        for r in &self.requests {
            let latest = answered_by.last().map_or(0, |&(_, a)| a).max(r.answer);
            answered_by.push((r.arrival, latest));
        }
        let gaps: Vec<u64> = self
            .dispatches
            .windows(2)
            .filter(|w| {
                let (end, next_end) = (w[0].1, w[1].1);
                let k = answered_by.partition_point(|&(arrival, _)| arrival < end);
                w[1].0 >= end && k > 0 && answered_by[k - 1].1 >= next_end
            })
            .map(|w| w[1].0 - w[0].1)
            .collect();
        let over_ns = median(over);
        let gap_ns = if gaps.len() >= HANDOFF_GAPS_MIN { median(gaps) } else { over_ns };
        Handoff { over_ns, gap_ns }
    }

    /// The recorded applications' names.
    pub fn app_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.names.values().cloned().collect();
        names.sort();
        names
    }

    fn name(&self, app: AppId) -> String {
        self.names.get(&app.0).cloned().unwrap_or_else(|| format!("app {}", app.0))
    }

    /// When each answered request let its process go on `host`: the
    /// answers given at one instant (one dispatch's) sent together, each
    /// process then queued for a core. By request id.
    fn released(&self, host: Option<Host>) -> HashMap<RequestId, u64> {
        let mut order: Vec<&Rec> = self.requests.iter().collect();
        order.sort_by_key(|r| (r.answer, r.req.id));
        let Some(mut q) = host.map(HostQueue::new) else {
            return order.into_iter().map(|r| (r.req.id, r.answer)).collect();
        };
        let mut out = HashMap::with_capacity(order.len());
        for batch in order.chunk_by(|a, b| a.answer == b.answer) {
            let sent = q.answered(batch[0].answer, batch.len());
            out.extend(batch.iter().map(|r| (r.req.id, q.go(sent))));
        }
        out
    }

    /// One stream per connection, times relative to the first arrival.
    /// A think time is the gap from when the process was let go (its
    /// answer, past the `host`'s queue) to its next request.
    fn streams(&self, host: Option<Host>) -> Vec<Stream> {
        let released = self.released(host);
        let t0 = self.requests[0].arrival;
        let mut by: HashMap<(AppId, ClientId), Vec<Rec>> = HashMap::new();
        for r in &self.requests {
            by.entry((r.req.app, r.req.client)).or_default().push(*r);
        }
        // In the order the server took their first requests: processes
        // whose first requests one pass of the loop read share an arrival
        // time, and the request ids keep the order it queued them in.
        let mut keys: Vec<_> = by.keys().copied().collect();
        keys.sort_by_key(|k| (by[k][0].arrival, by[k][0].req.id));
        let mut streams: Vec<Stream> = keys
            .into_iter()
            .map(|k| {
                let recs = &by[&k];
                // Concurrency: the most requests in flight at once.
                let mut edges: Vec<(u64, i32)> = recs.iter().flat_map(|r| [(r.arrival, 1), (r.answer, -1)]).collect();
                edges.sort();
                let depth = edges.iter().scan(0i32, |n, (_, d)| {
                    *n += d;
                    Some(*n)
                });
                let depth = (depth.max().unwrap_or(1).max(1) as usize).min(STREAM_DEPTH_MAX);
                // Request k left after request k - depth was answered (exact
                // for synchronous streams; for deeper ones an approximation:
                // the replay hands each think time to the next issue).
                let thinks = (0..recs.len())
                    .map(|i| if i >= depth { recs[i].arrival.saturating_sub(released[&recs[i - depth].req.id]) } else { recs[i].arrival - recs[0].arrival })
                    .collect();
                Stream { start_ns: recs[0].arrival - t0, think_ns: 0, jitter_ns: 0, depth, requests: recs.iter().map(|r| r.req).collect(), thinks }
            })
            .collect();
        quiet_noise(&mut streams);
        streams
    }
}

/// The recording server's own cost around each dispatch of its emulated
/// disk, which the disk's model leaves out: `over_ns` beyond the model's
/// service time (the worker's sleep and wake-up; the median over the
/// trace's dispatches), and `gap_ns` from one dispatch's end to the next
/// one's start while requests wait (the loop taking the completion,
/// answering, dispatching again; the median over such pairs). Each is
/// 20-65 us on the 2-core VM. They matter beyond their size under fifo on
/// a seeking disk: a request that continues the one before is served in
/// 41 us by the model, and its process and the one served before it
/// come back in the order the gap between their answers keeps. With the
/// model's 41 us alone, 32 strided readers' rotation lost its
/// continuations within a few rounds in the replay (19 of 4,096 requests
/// continued) where the recorded run kept them (725); with the recorded
/// cost around each dispatch the replay kept them too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handoff {
    pub over_ns: u64,
    pub gap_ns: u64,
}

/// Back-to-back dispatches a trace must show for their gap to be taken;
/// with fewer (an aioli run, whose processes send the next round after an
/// aggregate's answer) the gap is taken as the cost over the model, which
/// it matches in fifo traces (gaps 25.6-40.0 us, over 33.8-44.9 us).
const HANDOFF_GAPS_MIN: usize = 32;

/// Replays per policy: the recorded start order, and `REPLAYS - 1` more
/// with the processes started together in other orders. The table shows
/// the replay of the median makespan. Fifteen, not the five of before:
/// the median of a few draws moves with the draws (two hashes of fifteen
/// put one trace's fifo at 19.96 and 20.95 s).
pub const REPLAYS: usize = 15;
/// Streams whose recorded starts follow each other this closely started
/// together (32 fio jobs forked at once: within 0.9-6.6 ms, up to 2.9 ms
/// between one and the next, in 18 recorded runs).
const TOGETHER_NS: u64 = 5_000_000;

/// `streams` for replay `r`: as recorded for 0; else each group of
/// streams of one program that started together dealt out in another
/// order (a hash of `r`): the group's start times, earliest first, go to
/// its members in the new order, and streams that start at the same
/// instant are replayed in it too (the replay takes equal times in the
/// streams' order). `program[i]` is
/// stream `i`'s program: its application's name without a trailing
/// `-NUMBER` (`sluice run` names each process of an unmodified program
/// `PROGRAM-SESSION`). Which of the processes of one program launched
/// together starts first is chance, and on a seeking disk it sets the
/// order the requests reach the disk in for the rest of the run: under
/// aioli how a round's pieces fall into aggregates (32 strided fio
/// readers on the emulated disk took 0.116-0.205 s over 18 runs, and the
/// replays of one trace all landed in the mode of that trace's start
/// order); under fifo the rotation of the processes, and with it how many
/// requests continue the one before (32 strided 4 KiB readers: 21 s with
/// none, 13 s from an aioli trace whose first requests 25 processes sent
/// within one pass of the server's loop, so that their recorded order,
/// kept at equal times, was the ranks' own). The median of several orders
/// lands where most runs do. Different programs keep their recorded
/// order: dealing the starts of mix10's ten applications among all 94
/// processes made every fifo replay 14.6-15.2 s where the recorded order
/// gave 12.3-12.8 s and the real runs 12.4-12.8.
fn perturbed(streams: &[Stream], program: &[&str], r: u64) -> Vec<Stream> {
    if r == 0 {
        return streams.to_vec();
    }
    let mut by_start: Vec<usize> = (0..streams.len()).collect();
    by_start.sort_by_key(|&i| (program[i], streams[i].start_ns, i));
    let groups = by_start.chunk_by(|&a, &b| program[a] == program[b] && streams[b].start_ns - streams[a].start_ns <= TOGETHER_NS);
    // Each stream's new start and its place among equal starts.
    let mut at: Vec<(u64, usize)> = (0..streams.len()).map(|i| (streams[i].start_ns, i)).collect();
    for g in groups {
        // Each member moves up to `DEAL_POSITIONS` places from its
        // recorded one: its place plus a uniform draw (a hash of (r, k)).
        let mut keyed: Vec<(u64, usize)> = g
            .iter()
            .enumerate()
            .map(|(k, &m)| {
                let h = (r.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9)).wrapping_mul(0x94D0_49BB_1331_11EB);
                ((k as u64) * DEAL_SCALE + (h >> 11) % (DEAL_POSITIONS * DEAL_SCALE), m)
            })
            .collect();
        keyed.sort_unstable();
        for (&slot, &(_, m)) in g.iter().zip(&keyed) {
            at[m] = (streams[slot].start_ns, slot);
        }
    }
    let mut order: Vec<usize> = (0..streams.len()).collect();
    order.sort_by_key(|&i| at[i]);
    order.into_iter().map(|i| Stream { start_ns: at[i].0, ..streams[i].clone() }).collect()
}

/// How far from its recorded place a dealt process may start: a uniform
/// draw over this many places is added to its place, and the group is
/// taken in that order. Processes of one program started together arrive
/// mostly in the order they were launched, a few places apart: in 12
/// recorded runs of 32 processes (fifo and aioli, the seed's
/// decomposition and mix10 on the emulated disk), 1-19 of 31 neighbours
/// in arrival order were neighbours in rank, against 1 expected of a
/// uniform order. Dealt uniformly, every fifo replay of mix10 lost the
/// ranks' neighbourhood (a far seek where the run had a near one) and
/// predicted 12.6-13.9 s against real runs of 10.2-13.4 s; six places
/// was chosen on those development traces (three and sixteen places, and
/// a uniform order, were tried) and then checked on traces recorded
/// after (docs/results.md).
const DEAL_POSITIONS: u64 = 6;
/// Fixed-point steps per place of the draw.
const DEAL_SCALE: u64 = 1 << 16;

/// An application's program: its name without a trailing `-NUMBER`.
fn program_of(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((p, n)) if !p.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => p,
        _ => name,
    }
}

/// A think this many times the usual one, and `NOISE_OVER_NS` longer, is
/// the host's noise, not the program's.
const NOISE_TIMES: u64 = 4;
const NOISE_OVER_NS: u64 = 200_000;

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Replace the host's noise in recorded think times by the usual think.
/// A process that the machine did not run for a millisecond (another
/// process took its core, a timer, the page cache's write-back) shows a
/// long think at one request. Such noise comes per second of a run, not
/// per request: a fifo run of 10 s on a seeking disk holds fifty times
/// the noise of the 0.2 s aioli run of the same requests, and replayed
/// under aioli each stray millisecond makes one process miss its
/// aggregate and the disk a rotation. A think is noise when it is over
/// `NOISE_TIMES` times the usual one, and over it by `NOISE_OVER_NS`, where
/// the usual one is the larger of the stream's median think and the
/// median of every stream's think at the same request index (so that the
/// work every rank of a program does at the same point, such as fio's
/// pause after its first read or a compute phase between I/O phases, is
/// kept). The first think of a stream (its start) is never noise.
fn quiet_noise(streams: &mut [Stream]) {
    let longest = streams.iter().map(|s| s.thinks.len()).max().unwrap_or(0);
    let at_index: Vec<u64> = (0..longest).map(|k| median(streams.iter().filter(|s| k >= s.depth).filter_map(|s| s.thinks.get(k).copied()).collect())).collect();
    for s in streams.iter_mut() {
        let own = median(s.thinks.iter().skip(s.depth).copied().collect());
        for (k, t) in s.thinks.iter_mut().enumerate().skip(s.depth) {
            let usual = own.max(at_index[k]);
            if *t > usual.saturating_mul(NOISE_TIMES) && *t - usual > NOISE_OVER_NS {
                *t = usual;
            }
        }
    }
}

/// One application under one policy.
#[derive(Clone, Debug, Serialize)]
pub struct AppOutcome {
    pub policy: String,
    pub app: String,
    pub requests: u64,
    pub bytes: u64,
    /// First arrival to last answer, seconds.
    pub span_s: f64,
    pub mb_s: f64,
    pub mean_latency_ms: f64,
    pub p99_latency_ms: f64,
}

/// Every row of a what-if, the recorded run first.
#[derive(Clone, Debug, Serialize)]
pub struct WhatIf {
    pub device: String,
    pub streams: usize,
    pub requests: usize,
    pub rows: Vec<AppOutcome>,
    /// Per policy (the recorded run first): first arrival to last answer.
    pub makespan_s: Vec<(String, f64)>,
    /// Per replayed policy: the shortest and longest makespan over the
    /// start orders tried (`REPLAYS`, near the recorded one). On a seeking
    /// disk the order the processes started in holds for the whole run;
    /// real runs spread more widely than one trace's orders do (fifo on
    /// mix10 from four traces: 9.46-11.04, 10.18-11.71, 11.92-13.15 and
    /// 13.63-14.53 s; three real runs 10.08-14.04 s).
    pub makespan_range_s: Vec<(String, f64, f64)>,
    /// Per policy (the recorded run first): the device's dispatches, in
    /// the replay of the median makespan. How many requests each one took
    /// (`requests / dispatches`) is the aggregation a prediction rests
    /// on. A Darshan log records no dispatches: each access counts as one.
    pub dispatches: Vec<(String, u64)>,
    /// Per policy, likewise: the dispatches in flight on average (their
    /// summed durations over the time from the first one's start to the
    /// last one's end). On a device that gains from depth, two runs of
    /// one policy can differ by this more than by anything else (4 KiB
    /// O_DIRECT fifo on the 2-core VM: about 1 in flight in its slow
    /// runs, 1.5-1.7 in its fast ones).
    pub inflight: Vec<(String, f64)>,
}

/// Dispatches in flight on average over `spans` (start, end): their
/// summed durations over first start to last end; 0 for none.
fn mean_inflight(spans: impl Iterator<Item = (u64, u64)> + Clone) -> f64 {
    let (first, last) = spans.clone().fold((u64::MAX, 0), |(a, b), (s, e)| (a.min(s), b.max(e)));
    let busy: u64 = spans.map(|(s, e)| e.saturating_sub(s)).sum();
    if last > first {
        busy as f64 / (last - first) as f64
    } else {
        0.0
    }
}

fn outcomes(policy: &str, rec: &Recording, answered: &[(Request, u64, u64)]) -> (Vec<AppOutcome>, f64) {
    let mut by: HashMap<AppId, Vec<&(Request, u64, u64)>> = HashMap::new();
    answered.iter().for_each(|a| by.entry(a.0.app).or_default().push(a));
    let mut apps: Vec<AppId> = by.keys().copied().collect();
    apps.sort();
    let t0 = answered.iter().map(|a| a.1).min().unwrap_or(0);
    let t1 = answered.iter().map(|a| a.2).max().unwrap_or(0);
    let rows = apps
        .into_iter()
        .map(|app| {
            let v = &by[&app];
            let (first, last) = (v.iter().map(|a| a.1).min().unwrap_or(0), v.iter().map(|a| a.2).max().unwrap_or(0));
            let bytes: u64 = v.iter().map(|a| a.0.len).sum();
            let mut lat: Vec<u64> = v.iter().map(|a| a.2 - a.1).collect();
            lat.sort_unstable();
            let span = (last - first) as f64 / 1e9;
            AppOutcome {
                policy: policy.to_string(),
                app: rec.name(app),
                requests: v.len() as u64,
                bytes,
                span_s: span,
                mb_s: if span > 0.0 { bytes as f64 / span / 1e6 } else { 0.0 },
                mean_latency_ms: lat.iter().sum::<u64>() as f64 / lat.len() as f64 / 1e6,
                p99_latency_ms: lat[((lat.len() * 99).div_ceil(100)).clamp(1, lat.len()) - 1] as f64 / 1e6,
            }
        })
        .collect();
    (rows, (t1 - t0) as f64 / 1e9)
}

/// Replay `rec` under each of `policies` as `opts` say.
pub fn what_if(rec: &Recording, policies: &[String], opts: Options) -> Result<WhatIf, Error> {
    what_if_with(rec, policies, opts, None)
}

/// `what_if`, every replay's scheduler given `qos`'s classes and paths.
pub fn what_if_with(rec: &Recording, policies: &[String], opts: Options, qos: Option<&QosPlan>) -> Result<WhatIf, Error> {
    let recorded: Vec<(Request, u64, u64)> = rec.requests.iter().map(|r| (r.req, r.arrival, r.answer)).collect();
    let (mut rows, span) = outcomes("recorded", rec, &recorded);
    let mut makespan = vec![("recorded".to_string(), span)];
    let mut dispatches = vec![("recorded".to_string(), rec.dispatches.len() as u64)];
    let mut inflight = vec![("recorded".to_string(), mean_inflight(rec.dispatches.iter().map(|d| (d.0, d.1))))];
    let mut range: Vec<(String, f64, f64)> = Vec::with_capacity(policies.len());
    let learner = rec.learned();
    let model = learner.model();
    let direct_disk = rec.server_device.as_deref() == Some("real") && rec.server_direct == Some(true);
    let device = match opts.device {
        Device::Auto if rec.server_device.as_deref() == Some("hdd7200") => Device::Hdd7200,
        Device::Auto if direct_disk && opts.disk.is_some() => Device::Calibrated,
        Device::Auto => Device::Recorded,
        d => d,
    };
    let disk = match (device, opts.disk) {
        (Device::Calibrated, None) => return Err(bad("no calibrated disk to replay on (`sluice calibrate --host` measures this machine's)")),
        (_, d) => d,
    };
    let emulated = device == Device::Hdd7200;
    // Only the calibrated disk's dispatches cost the loop a kernel path
    // (the emulated disk's costs are its `Handoff`).
    let host = opts.host.map(|h| Host { dispatch_ns: if device == Device::Calibrated { disk.map_or(0, |k| k.dispatch_cpu_ns) } else { 0 }, ..h });
    let opts = Options { host, ..opts };
    let streams = rec.streams(opts.host);
    let handoff = if emulated { rec.handoff() } else { Handoff::default() };
    // The emulated disk's own figures, as the daemon's prior on it.
    let device_cost = if emulated { DeviceModel::cost_parts(&Hdd::hdd7200()).cost(1) } else { model };
    let names: Vec<String> = streams.iter().map(|s| s.requests.first().map_or_else(String::new, |q| rec.name(q.app))).collect();
    let programs: Vec<&str> = names.iter().map(|n| program_of(n)).collect();
    for p in policies {
        let config = PolicyConfig::from_name(p).ok_or_else(|| bad(format!("unknown policy {p:?} (known: {})", sluice_core::POLICY_NAMES.join(", "))))?;
        // The recording server kept its queue depth's worth at most, and
        // (but for the emulated disk, whose server keeps one) as many as
        // its learner found the device gains from.
        let depth = if emulated { 1 } else { rec.server_depth.unwrap_or(SERVER_DEPTH_DEFAULT) };
        let limits = Limits { dispatches_inflight_max: depth, ..Limits::default() }.clamped();
        let mut outs = Vec::with_capacity(REPLAYS);
        for r in 0..REPLAYS as u64 {
            // One copy of the streams at a time.
            let streams = perturbed(&streams, &programs, r);
            let mut s = Scheduler::new(config.clone(), limits.clone());
            // The policy knows the device's costs as the daemon's did: the
            // emulated disk's own figures, or what its learner learned from
            // the dispatches so far, from the same generic prior (the
            // learner runs in the replay's loop and sets the depth too).
            let mut online = CostLearner::new(None);
            match emulated {
                true => s.set_device_cost(Some(device_cost)),
                false => {
                    s.set_device_cost(Some(online.model()));
                    s.set_depth(online.depth_cap());
                }
            }
            if let Some(q) = qos {
                s.set_qos(&q.classes, 0).map_err(|e| bad(format!("classes: {e}")))?;
                for (&id, name) in &rec.names {
                    let Some((class, keys)) = q.apps.get(name) else { continue };
                    s.set_app_class(AppId(id), class.as_deref());
                    s.set_app_share(AppId(id), keys).map_err(|e| bad(format!("share: {e:?}")))?;
                }
            }
            let mut hdd = Hdd::hdd7200();
            let mut head: Option<(FileId, u64)> = None;
            // When the emulated disk's worker next takes a dispatch.
            let mut free_at = 0u64;
            // When each of the learned device's channels is next free: a
            // device of parallelism 1 serves one dispatch at a time, however
            // many the learner keeps in flight.
            let mut channels = vec![0u64; model.parallelism.max(1) as usize];
            let mut calibrated = disk.filter(|_| device == Device::Calibrated).map(|k| {
                let f = k.figures;
                (Ssd::calibrated(f.access_ns, f.bytes_per_s, f.seek_ns), Channels::new(k.channels as usize, f.shared_ns, f.shared_ps()))
            });
            let service = |now: u64, d: &Dispatch| {
                if emulated {
                    let begin = now.max(free_at);
                    let done = begin + handoff.over_ns + hdd.service_ns(Access { file: d.file.0, offset: d.offset, len: d.len });
                    free_at = done + handoff.gap_ns;
                    return done - now;
                }
                if let Some((dev, ch)) = calibrated.as_mut() {
                    let ns = dev.service_ns(Access { file: d.file.0, offset: d.offset, len: d.len }).max(1);
                    return ch.serve(now, ns, d.len) - now;
                }
                let seek = head != Some((d.file, d.offset));
                head = Some((d.file, d.end()));
                let c = (0..channels.len()).min_by_key(|&c| (channels[c], c)).expect("a device has a channel");
                let done = now.max(channels[c]) + model.service_ns(d.len, seek);
                channels[c] = done;
                done - now
            };
            let learn = |s: &mut Scheduler, o: Observation| {
                if !emulated {
                    s.learn(&mut online, o);
                }
            };
            let log = replay_observed(&mut s, &streams, service, ReplayOptions { host: opts.host, ..ReplayOptions::plain(EVENTS_MAX) }, learn)
                .map_err(|e| bad(format!("replay under {p}: {e:?}")))?;
            let arrivals: HashMap<RequestId, u64> = log.arrivals.iter().copied().collect();
            let answered: Vec<(Request, u64, u64)> =
                log.served.iter().flat_map(|sv| sv.dispatch.members.iter().map(|m| (*m, arrivals[&m.id], sv.done_ns)).collect::<Vec<_>>()).collect();
            let (r, span) = outcomes(p, rec, &answered);
            outs.push((r, span, log.served.len() as u64, mean_inflight(log.served.iter().map(|sv| (sv.at_ns, sv.done_ns)))));
        }
        // The replay of the median makespan (the first of equals).
        let mut order: Vec<usize> = (0..outs.len()).collect();
        order.sort_by(|&a, &b| outs[a].1.total_cmp(&outs[b].1).then(a.cmp(&b)));
        range.push((p.clone(), outs[order[0]].1, outs[order[order.len() - 1]].1));
        let (r, span, n, depth) = outs.swap_remove(order[order.len() / 2]);
        rows.extend(r);
        makespan.push((p.clone(), span));
        dispatches.push((p.clone(), n));
        inflight.push((p.clone(), depth));
    }
    let mut device = match device {
        Device::Hdd7200 => format!(
            "the emulated 7200 rpm disk, and the server's {:.1} us over its model a dispatch and {:.1} us between dispatches (as recorded)",
            handoff.over_ns as f64 / 1e3,
            handoff.gap_ns as f64 / 1e3
        ),
        Device::Calibrated => {
            let k = disk.expect("a calibrated disk");
            let f = k.figures;
            format!(
                "as calibrated: {:.1} us per dispatch, {:.0} MB/s, seek {:.1} us, {} channels sharing {:.1} us + bytes at {:.0} MB/s, {:.1} us of the loop a dispatch; the server's learner in the loop",
                f.access_ns as f64 / 1e3,
                f.bytes_per_s as f64 / 1e6,
                f.seek_ns as f64 / 1e3,
                k.channels,
                f.shared_ns as f64 / 1e3,
                f.shared_bytes_per_s as f64 / 1e6,
                k.dispatch_cpu_ns as f64 / 1e3
            )
        }
        _ => format!(
            "as recorded: {:.1} us per dispatch, {:.3} ns per byte, seek {:.1} us, parallelism {} (from {} dispatches)",
            model.dispatch_ns as f64 / 1e3,
            model.byte_ps as f64 / 1e3,
            model.seek_ns as f64 / 1e3,
            model.parallelism,
            learner.observed()
        ),
    };
    if let Some(h) = opts.host {
        device += &format!("; host {} cores, an answer {:.1} us of the server's loop and {:.1} us of a process", h.cores, h.server_ns as f64 / 1e3, h.client_ns as f64 / 1e3);
    }
    Ok(WhatIf { device, streams: streams.len(), requests: rec.requests.len(), rows, makespan_s: makespan, makespan_range_s: range, dispatches, inflight })
}

/// The what-if as a table.
pub fn table(w: &WhatIf) -> String {
    let mut s = format!("{} requests in {} streams; device {}\n", w.requests, w.streams, w.device);
    s += &format!("{:<10} {:<24} {:>9} {:>10} {:>9} {:>9} {:>10} {:>10}\n", "policy", "application", "requests", "MiB", "span s", "MB/s", "mean ms", "p99 ms");
    for r in &w.rows {
        s += &format!(
            "{:<10} {:<24} {:>9} {:>10.1} {:>9.3} {:>9.1} {:>10.3} {:>10.3}\n",
            r.policy,
            r.app,
            r.requests,
            r.bytes as f64 / f64::from(1u32 << 20),
            r.span_s,
            r.mb_s,
            r.mean_latency_ms,
            r.p99_latency_ms
        );
    }
    for (p, m) in &w.makespan_s {
        match w.makespan_range_s.iter().find(|(q, ..)| q == p) {
            Some((_, lo, hi)) => s += &format!("makespan {p}: {m:.3} s (start orders {lo:.3}-{hi:.3} s)\n"),
            None => s += &format!("makespan {p}: {m:.3} s\n"),
        }
    }
    let per = |n: u64| if n == 0 { "-".to_string() } else { format!("{n} ({:.1} requests each)", w.requests as f64 / n as f64) };
    s += &format!("dispatches: {}\n", w.dispatches.iter().map(|(p, n)| format!("{p} {}", per(*n))).collect::<Vec<_>>().join(", "));
    s += &format!("in flight on average: {}\n", w.inflight.iter().map(|(p, d)| format!("{p} {d:.2}")).collect::<Vec<_>>().join(", "));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A two-application trace in the shape `sluice serve --trace` writes.
    fn trace() -> String {
        let mut ev = vec![
            r#"{"name":"process_name","ph":"M","pid":1001,"tid":0,"ts":0,"args":{"name":"alpha"}}"#.to_string(),
            r#"{"name":"process_name","ph":"M","pid":1002,"tid":0,"ts":0,"args":{"name":"beta"}}"#.to_string(),
        ];
        // Each app: one synchronous stream of 20 x 64 KiB reads of its own
        // file, 10 us apart after each answer; dispatches take 100 us.
        let mut t = 0.0;
        for k in 0..20u64 {
            for app in [1u64, 2] {
                let id = k * 2 + app;
                let (b, e) = (t, t + 100.0);
                ev.push(format!(r#"{{"name":"read 64 KiB","ph":"b","cat":"request","id":"r{id}","pid":{},"tid":{app},"ts":{b},"args":{{"file":{app},"client":{app},"offset":{},"len":65536}}}}"#, 1000 + app, k * 65536));
                ev.push(format!(r#"{{"name":"read 64 KiB","ph":"e","cat":"request","id":"r{id}","pid":{},"tid":{app},"ts":{e}}}"#, 1000 + app));
                ev.push(format!(
                    r#"{{"name":"read 64 KiB x1","ph":"b","cat":"dispatch","id":"d{id}","pid":2,"tid":0,"ts":{b},"args":{{"file":{app},"offset":{},"len":65536,"requests":1}}}}"#,
                    k * 65536
                ));
                ev.push(format!(r#"{{"name":"read 64 KiB x1","ph":"e","cat":"dispatch","id":"d{id}","pid":2,"tid":0,"ts":{e}}}"#));
                t += 100.0;
            }
            t += 10.0;
        }
        format!(r#"{{"traceEvents":[{}]}}"#, ev.join(","))
    }

    #[test]
    fn the_mean_in_flight_is_busy_time_over_the_span() {
        assert_eq!(mean_inflight([(0, 10), (5, 15), (20, 30)].into_iter()), 30.0 / 30.0);
        assert_eq!(mean_inflight([(0, 10), (0, 10)].into_iter()), 2.0);
        assert_eq!(mean_inflight(std::iter::empty()), 0.0);
        assert_eq!(mean_inflight([(7, 7)].into_iter()), 0.0);
    }

    #[test]
    fn a_trace_replays_under_each_policy_and_the_recording_comes_first() {
        let rec = Recording::parse(&trace()).unwrap();
        assert_eq!(rec.requests.len(), 40);
        let streams = rec.streams(None);
        assert_eq!(streams.len(), 2, "one stream per connection");
        assert!(streams.iter().all(|s| s.depth == 1 && s.requests.len() == 20), "synchronous streams keep their order");
        let w = what_if(&rec, &["fifo".into(), "aioli".into()], Options { device: Device::Hdd7200, host: None, disk: None }).unwrap();
        assert_eq!(w.rows.len(), 6, "two applications x (recorded, fifo, aioli)");
        assert_eq!((w.rows[0].policy.as_str(), w.rows[0].app.as_str(), w.rows[0].requests, w.rows[0].bytes), ("recorded", "alpha", 20, 20 * 65536));
        assert!(w.rows.iter().all(|r| r.requests == 20), "every request is replayed once");
        let span = |p: &str| w.makespan_s.iter().find(|(n, _)| n == p).unwrap().1;
        assert!(span("aioli") < span("fifo"), "on a disk, two interleaved sequential readers favour aioli: {:?}", w.makespan_s);
        // Each replayed policy's range over the start orders holds its
        // median; the recording has none.
        assert_eq!(w.makespan_range_s.iter().map(|r| r.0.as_str()).collect::<Vec<_>>(), ["fifo", "aioli"]);
        assert!(w.makespan_range_s.iter().all(|(p, lo, hi)| *lo <= span(p) && span(p) <= *hi), "{:?} {:?}", w.makespan_range_s, w.makespan_s);
        assert!(table(&w).contains("(start orders "), "{}", table(&w));
        // fifo takes each request alone, as the recorded server did.
        let dispatches: Vec<(&str, u64)> = w.dispatches.iter().map(|(p, n)| (p.as_str(), *n)).collect();
        assert_eq!(&dispatches[..2], [("recorded", 40), ("fifo", 40)]);
        assert!(dispatches[2].0 == "aioli" && (1..=40).contains(&dispatches[2].1), "{dispatches:?}");
        assert!(table(&w).contains("dispatches: recorded 40 (1.0 requests each), fifo 40 (1.0 requests each)"), "{}", table(&w));
        // The recording's dispatches ran one at a time, back to back but
        // for the 10 us after every second one: 4,000 of 4,190 us busy.
        let recorded_depth = w.inflight[0].1;
        assert!(w.inflight[0].0 == "recorded" && (recorded_depth - 4_000.0 / 4_190.0).abs() < 1e-9, "{:?}", w.inflight);
        // The emulated disk's server keeps one in flight.
        assert!(w.inflight[1..].iter().all(|(_, d)| *d > 0.0 && *d <= 1.0 + 1e-9), "{:?}", w.inflight);
        let learned = what_if(&rec, &["fifo".into()], Options { device: Device::Recorded, host: None, disk: None }).unwrap();
        assert!(learned.device.contains("from 40 dispatches") && learned.device.contains("parallelism 1"), "{}", learned.device);
    }

    #[test]
    fn a_learned_device_of_parallelism_one_serves_one_dispatch_at_a_time() {
        // Two processes, each sending its next read the moment it is
        // answered; the server served them one at a time, 100 us each: the
        // other process's request waited meanwhile.
        let mut ev = Vec::new();
        for k in 0..40u64 {
            let (c, j) = (k % 2 + 1, k / 2);
            let (b, e) = (k as f64 * 100.0, (k + 1) as f64 * 100.0);
            served(&mut ev, Served { id: k, client: c, file: c, offset: j * 65536, len: 65536, arrival: if j == 0 { 0.0 } else { b - 100.0 }, start: b, end: e });
        }
        let rec = Recording::parse(&trace_doc("real", &ev)).unwrap();
        let w = what_if(&rec, &["fifo".into()], Options { device: Device::Auto, host: None, disk: None }).unwrap();
        assert!(w.device.contains("parallelism 1"), "{}", w.device);
        // The replay keeps two dispatches in flight while the learner would
        // probe a depth above the one it knows; the device still serves
        // them one after another: 4 ms, not 2.
        let fifo = w.makespan_s.iter().find(|(p, _)| p == "fifo").unwrap().1;
        assert!((fifo - 0.004).abs() < 0.004 * 0.05, "fifo {fifo} s on a device of parallelism 1");
    }

    /// A disk of `channels` channels taking 100 us a dispatch, all of it
    /// shared with `shared_ns` = 100 us, or none of it with 0.
    fn disk(channels: u32, shared_ns: u64, dispatch_cpu_ns: u64) -> Disk {
        let figures = crate::ProfileFigures { access_ns: 100_000, bytes_per_s: u64::MAX / 2, seek_ns: 0, shared_ns, shared_bytes_per_s: 0 };
        Disk { figures, channels, dispatch_cpu_ns }
    }

    #[test]
    fn a_trace_of_the_real_disk_with_o_direct_replays_on_the_calibrated_disk() {
        // 32 processes, 16 reads each, answered at once: the recording says
        // little of the device (a recorded model would serve it in 10 us).
        let mut ev = Vec::new();
        for k in 0..512u64 {
            let (c, j) = (k % 32 + 1, k / 32);
            let b = k as f64 * 10.0;
            served(&mut ev, Served { id: k, client: c, file: 1, offset: (j * 32 + c) * 4096, len: 4096, arrival: b, start: b, end: b + 10.0 });
        }
        let doc = |direct: bool| {
            let meta = format!(r#"{{"name":"process_name","ph":"M","pid":2,"tid":0,"ts":0,"args":{{"name":"live: device","device":"real","direct":{direct},"queue_depth":8}}}}"#);
            format!(r#"{{"traceEvents":[{meta},{}]}}"#, ev.join(","))
        };
        let span = |w: &WhatIf| w.makespan_s.iter().find(|(p, _)| p == "fifo").unwrap().1;
        let run = |t: &str, d: Option<Disk>| what_if(&Recording::parse(t).unwrap(), &["fifo".into()], Options { device: Device::Auto, host: None, disk: d }).unwrap();
        // One channel: one read after another, 512 x 100 us.
        let one = run(&doc(true), Some(disk(1, 0, 0)));
        assert!(one.device.starts_with("as calibrated") && one.device.contains("learner in the loop"), "{}", one.device);
        assert!((span(&one) - 0.0512).abs() < 0.0512 * 0.02, "{} s on one channel", span(&one));
        // Eight channels sharing nothing: the learner in the loop keeps two
        // in flight from its prior (it probes deeper every 1,024 dispatches).
        let eight = run(&doc(true), Some(disk(8, 0, 0)));
        assert!(span(&eight) < span(&one) / 1.8, "{} s on eight channels against {} on one", span(&eight), span(&one));
        // Eight channels sharing it all serve as one.
        let shared = run(&doc(true), Some(disk(8, 100_000, 0)));
        assert!((span(&shared) - span(&one)).abs() < span(&one) * 0.02, "{} s sharing everything", span(&shared));
        // Without O_DIRECT (the page cache in the way), or without a disk,
        // the recorded model serves.
        assert!(run(&doc(false), Some(disk(1, 0, 0))).device.starts_with("as recorded"));
        assert!(run(&doc(true), None).device.starts_with("as recorded"));
        // Asked for by name without a disk: refused.
        let e = what_if(&Recording::parse(&doc(true)).unwrap(), &["fifo".into()], Options { device: Device::Calibrated, host: None, disk: None }).unwrap_err();
        assert!(e.to_string().contains("calibrate --host"), "{e}");
    }

    #[test]
    fn each_dispatch_of_the_calibrated_disk_costs_the_servers_loop() {
        // Eight processes, 16 reads each, on eight free channels. With 300
        // us of the loop a dispatch beside its 10 us an answer, the loop is
        // what the replay waits for: 310 us a read, where the device serves
        // one every 50 us (two in flight, the learner's prior).
        let mut ev = Vec::new();
        for k in 0..128u64 {
            let (c, j) = (k % 8 + 1, k / 8);
            let b = j as f64 * 110.0;
            served(&mut ev, Served { id: k, client: c, file: 1, offset: k * 4096, len: 4096, arrival: b, start: b, end: b + 100.0 });
        }
        let meta = r#"{"name":"process_name","ph":"M","pid":2,"tid":0,"ts":0,"args":{"name":"live: device","device":"real","direct":true,"queue_depth":8}}"#;
        let rec = Recording::parse(&format!(r#"{{"traceEvents":[{meta},{}]}}"#, ev.join(","))).unwrap();
        let host = Some(Host { cores: 2, server_ns: 10_000, client_ns: 0, dispatch_ns: 0 });
        let span = |cpu: u64| {
            let w = what_if(&rec, &["fifo".into()], Options { device: Device::Auto, host, disk: Some(disk(8, 0, cpu)) }).unwrap();
            w.makespan_s.iter().find(|(p, _)| p == "fifo").unwrap().1
        };
        let (free, costly) = (span(0), span(300_000));
        // The loop's work is a floor; it idles a little between processes.
        let work = 128.0 * 310e-6;
        assert!(costly >= work * 0.99 && costly < work * 1.3, "{costly} s with 300 us of the loop a dispatch ({work} s of work)");
        assert!(free < costly / 2.0, "{free} s without it");
    }

    #[test]
    fn auto_replays_on_the_device_the_trace_names() {
        let named = trace().replacen("[", r#"[{"name":"process_name","ph":"M","pid":2,"tid":0,"ts":0,"args":{"name":"live: device","device":"hdd7200","direct":true}},"#, 1);
        let auto = |t: &str| what_if(&Recording::parse(t).unwrap(), &["fifo".into()], Options { device: Device::Auto, host: None, disk: None }).unwrap().device;
        assert!(auto(&named).starts_with("the emulated 7200 rpm disk"), "{}", auto(&named));
        assert!(auto(&trace()).starts_with("as recorded"), "a trace that names no device: the model its dispatches imply");
    }

    /// A trace of the emulated disk: `n` 4 KiB reads of one file in
    /// order, from one process that sent them all at 0; each
    /// dispatch takes the disk's model plus `over` us and the next starts
    /// `gap` us after it ended.
    fn hdd_trace(n: u64, over: f64, gap: f64) -> String {
        let (mut ev, mut t) = (Vec::new(), 0.0);
        for k in 0..n {
            let model = if k == 0 { 9_000.0 + 4_170.0 + 40.96 } else { 40.96 };
            let e = t + model + over;
            served(&mut ev, Served { id: k, client: 1, file: 1, offset: k * 4096, len: 4096, arrival: 0.0, start: t, end: e });
            t = e + gap;
        }
        trace_doc("hdd7200", &ev)
    }

    /// One read as a live trace has it: its request (arrival, answer at
    /// the dispatch's end) and its dispatch alone (start, end), in us.
    struct Served {
        id: u64,
        client: u64,
        file: u64,
        offset: u64,
        len: u64,
        arrival: f64,
        start: f64,
        end: f64,
    }

    fn served(ev: &mut Vec<String>, r: Served) {
        let Served { id, client, file, offset, len, arrival, start, end } = r;
        let kib = len / 1024;
        ev.push(format!(
            r#"{{"name":"read {kib} KiB","ph":"b","cat":"request","id":"r{id}","pid":1001,"tid":{client},"ts":{arrival},"args":{{"file":{file},"client":{client},"offset":{offset},"len":{len}}}}}"#
        ));
        ev.push(format!(r#"{{"name":"read {kib} KiB","ph":"e","cat":"request","id":"r{id}","pid":1001,"tid":{client},"ts":{end}}}"#));
        ev.push(format!(
            r#"{{"name":"read {kib} KiB x1","ph":"b","cat":"dispatch","id":"d{id}","pid":2,"tid":0,"ts":{start},"args":{{"file":{file},"offset":{offset},"len":{len},"requests":1}}}}"#
        ));
        ev.push(format!(r#"{{"name":"read {kib} KiB x1","ph":"e","cat":"dispatch","id":"d{id}","pid":2,"tid":0,"ts":{end}}}"#));
    }

    /// A live trace of a server on `device` holding `events`.
    fn trace_doc(device: &str, events: &[String]) -> String {
        let meta = format!(r#"{{"name":"process_name","ph":"M","pid":2,"tid":0,"ts":0,"args":{{"name":"live: device","device":"{device}"}}}}"#);
        format!(r#"{{"traceEvents":[{meta},{}]}}"#, events.join(","))
    }

    #[test]
    fn the_emulated_disks_server_costs_are_taken_from_the_trace() {
        // 40 back-to-back dispatches: 30 us over the model, 20 us apart.
        let rec = Recording::parse(&hdd_trace(40, 30.0, 20.0)).unwrap();
        assert_eq!(rec.handoff(), Handoff { over_ns: 30_000, gap_ns: 20_000 });
        // Exactly HANDOFF_GAPS_MIN back-to-back pairs: their gap is taken.
        let at = Recording::parse(&hdd_trace(HANDOFF_GAPS_MIN as u64 + 1, 30.0, 20.0)).unwrap();
        assert_eq!(at.handoff(), Handoff { over_ns: 30_000, gap_ns: 20_000 }, "32 gaps");
        // One fewer: the gap is taken as the cost over the model.
        let few = Recording::parse(&hdd_trace(HANDOFF_GAPS_MIN as u64, 30.0, 20.0)).unwrap();
        assert_eq!(few.handoff(), Handoff { over_ns: 30_000, gap_ns: 30_000 }, "31 gaps");
        // A trace of another device: nothing.
        let other = hdd_trace(40, 30.0, 20.0).replace(r#""device":"hdd7200""#, r#""device":"real""#);
        assert_eq!(Recording::parse(&other).unwrap().handoff(), Handoff::default());
        // The replay pays them: fifo serves the 40 in order, each 50 us
        // over the model but the last one's gap, which the makespan ends
        // before; the table says so.
        let w = what_if(&rec, &["fifo".into()], Options { device: Device::Auto, host: None, disk: None }).unwrap();
        let fifo = w.makespan_s.iter().find(|(p, _)| p == "fifo").unwrap().1;
        let model = (9_000.0 + 4_170.0 + 40.0 * 40.96) / 1e6;
        assert!((fifo - (model + 40.0 * 30e-6 + 39.0 * 20e-6)).abs() < 2e-6, "fifo {fifo} s against the model's {model} s");
        assert!(w.device.contains("30.0 us over its model a dispatch and 20.0 us between dispatches"), "{}", w.device);
    }

    fn stream(thinks: Vec<u64>) -> Stream {
        Stream { start_ns: 0, think_ns: 0, jitter_ns: 0, depth: 1, requests: Vec::new(), thinks }
    }

    #[test]
    fn a_stray_long_think_is_noise_and_one_every_stream_has_is_kept() {
        const US: u64 = 1_000;
        // Five processes think 100 us between requests; all five pause
        // 2 ms after their second request (the program's own work); one is
        // held up 3 ms once (the host's noise), another only 350 us (under
        // the bound: kept).
        let mut s: Vec<Stream> = (0..5).map(|_| stream(vec![0, 100 * US, 2_000 * US, 100 * US, 100 * US, 100 * US])).collect();
        s[0].thinks[4] = 3_000 * US;
        s[1].thinks[4] = 350 * US;
        s[2].thinks[0] = 9_000 * US;
        quiet_noise(&mut s);
        assert_eq!(s[0].thinks, [0, 100 * US, 2_000 * US, 100 * US, 100 * US, 100 * US], "the stray 3 ms is replayed as the usual think");
        assert_eq!(s[1].thinks[4], 350 * US, "3.5x the usual think is not noise");
        assert_eq!(s[2].thinks[0], 9_000 * US, "a start is never noise");
        assert!(s.iter().all(|st| st.thinks[2] == 2_000 * US), "a pause every process makes at one point is the program's");
    }

    #[test]
    fn processes_started_together_are_dealt_their_starts_in_other_orders() {
        const MS: u64 = 1_000_000;
        // Four started together (gaps of 2-3 ms chain them), then one
        // 5.1 ms after the last of them: a later phase. Stream i is known
        // by its second think, 100 + i.
        let starts = [0, 2 * MS, 4 * MS + MS / 2, 7 * MS + MS / 2, 12 * MS + 600_000];
        let streams: Vec<Stream> = starts.iter().enumerate().map(|(i, &t)| Stream { start_ns: t, ..stream(vec![0, 100 + i as u64]) }).collect();
        let programs = ["fio"; 5];
        // Each stream's start, by stream, and the order they are replayed in.
        let got = |programs: &[&str], r: u64| {
            let out = perturbed(&streams, programs, r);
            let mut by = [0u64; 5];
            out.iter().for_each(|s| by[(s.thinks[1] - 100) as usize] = s.start_ns);
            assert!(out.windows(2).all(|w| w[0].start_ns <= w[1].start_ns), "replay {r}: in start order");
            (by, out.iter().map(|s| s.thinks[1] - 100).collect::<Vec<_>>())
        };
        assert_eq!(got(&programs, 0).0, starts, "replay 0 is the recording");
        let mut orders = std::collections::HashSet::new();
        for r in 1..REPLAYS as u64 {
            let (g, _) = got(&programs, r);
            let mut together = g[..4].to_vec();
            together.sort_unstable();
            assert_eq!(together, starts[..4], "replay {r}: the same start times, dealt out");
            assert_eq!(g[4], starts[4], "replay {r}: a stream that started apart keeps its start");
            orders.insert(g);
        }
        assert!(orders.len() > 1, "the replays try other orders: {orders:?}");
        // Two programs started together keep their own starts.
        let two = ["fio", "fio", "cat", "fio", "fio"];
        for r in 1..REPLAYS as u64 {
            assert_eq!(got(&two, r).0[2], starts[2], "replay {r}: the other program keeps its start");
        }
        assert_eq!((program_of("fio-13105"), program_of("read-decomp-2g"), program_of("cat"), program_of("x-")), ("fio", "read-decomp-2g", "cat", "x-"));
    }

    #[test]
    fn processes_that_started_at_one_instant_are_replayed_in_other_orders() {
        // Four first requests read in one pass of the loop: one arrival
        // time. The replay takes equal times in the streams' order, so
        // the order itself is dealt.
        let streams: Vec<Stream> = (0..4).map(|i| Stream { start_ns: 0, ..stream(vec![0, 100 + i]) }).collect();
        let order = |r: u64| perturbed(&streams, &["fio"; 4], r).iter().map(|s| s.thinks[1] - 100).collect::<Vec<_>>();
        assert_eq!(order(0), [0, 1, 2, 3], "replay 0 keeps the recorded order");
        let orders: std::collections::HashSet<_> = (1..REPLAYS as u64).map(order).collect();
        assert!(orders.iter().any(|o| *o != [0, 1, 2, 3]), "the replays try other orders: {orders:?}");
        assert!(orders.iter().all(|o| o.iter().copied().collect::<std::collections::HashSet<_>>().len() == 4), "each stream once: {orders:?}");
    }

    #[test]
    fn the_host_queue_is_taken_out_of_recorded_thinks() {
        // The two applications' requests are answered 100 us apart: with
        // one core at 30 us an answer, each process goes on 30 us after its
        // answer, and 30 us of its recorded think were the host's.
        let rec = Recording::parse(&trace()).unwrap();
        let plain = rec.streams(None);
        let hosted = rec.streams(Some(Host { cores: 1, server_ns: 10_000, client_ns: 20_000, dispatch_ns: 0 }));
        assert_eq!(plain[0].thinks[1], 110_000, "alpha's second request came 110 us after its first was answered");
        assert_eq!(hosted[0].thinks[1], 80_000, "of which 30 us were the host's");
    }

    #[test]
    fn darshan_segments_become_one_stream_per_rank() {
        let dxt = r#"{"source":"darshan","exe":"/bin/ior -a POSIX","nprocs":2,"layer":"DXT_POSIX","files":["/f"],
            "segments":[[0,0,"w",0,1048576,0.001,0.011],[1,0,"w",1048576,1048576,0.001,0.012],[0,0,"w",2097152,1048576,0.012,0.02],[1,0,"r",0,1048576,0.013,0.03]],"zero_length":0}"#;
        let rec = Recording::from_darshan(dxt).unwrap();
        let streams = rec.streams(None);
        assert_eq!(streams.len(), 2, "one stream per rank");
        assert_eq!(streams[0].requests.iter().map(|r| r.offset).collect::<Vec<_>>(), [0, 2097152], "rank 0 keeps its order");
        assert_eq!(streams[0].thinks[1], 1_000_000, "rank 0 waited 1 ms after its first write was answered");
        let w = what_if(&rec, &["fifo".into()], Options { device: Device::Recorded, host: None, disk: None }).unwrap();
        assert_eq!((w.rows[0].app.as_str(), w.rows[0].requests, w.rows[1].requests), ("ior", 4, 4));
        assert!(Recording::from_darshan("{}").is_err());
    }

    #[test]
    fn a_darshan_log_runs_in_the_simulator_with_its_own_accesses() {
        let dxt = r#"{"exe":"/bin/ior","segments":[[0,0,"w",0,1048576,0.0,0.01],[1,0,"w",1048576,1048576,0.0,0.01],[0,0,"r",0,1048576,0.02,0.03],[1,1,"r",0,4096,0.5,0.51]]}"#;
        let app = Recording::darshan_app(dxt).unwrap();
        assert_eq!((app.name.as_str(), app.procs, app.bytes), ("ior", 2, 3 * 1048576 + 4096));
        let r = app.recorded.as_ref().unwrap();
        assert_eq!(r.ranks[1][1].think_ns, 490_000_000, "rank 1 waited 0.49 s after its write");
        assert!(r.ranks[1][1].file == 1 && !r.ranks[1][1].write && r.ranks[0][0].write);
        let mut sc = crate::Scenario::from_toml(include_str!("../../../scenarios/live-twin.toml")).unwrap();
        sc.apps = vec![app];
        let (report, _) = crate::run(&sc, &crate::RunOptions { modes: vec!["fifo".into(), "aioli".into()], seed: None, scale: None, trace: false, jobs: 1 }).unwrap();
        for run in &report.runs {
            let (a, d) = (&run.apps[0], &run.device_stats);
            assert_eq!((d.requests, d.bytes), (4, 3 * 1048576 + 4096), "{}: the device served every recorded access once", run.mode);
            assert!(a.completion_s > 0.5 && a.completion_s < 1.0, "{}: the 0.49 s think time is kept: {}", run.mode, a.completion_s);
        }
    }

    #[test]
    fn bad_traces_are_refused_with_a_reason() {
        assert!(Recording::parse("{}").unwrap_err().to_string().contains("not a trace-event JSON"));
        assert!(Recording::parse(r#"{"traceEvents":[]}"#).unwrap_err().to_string().contains("no request"));
        let old = r#"{"traceEvents":[{"name":"read 4 KiB","ph":"b","cat":"request","id":"r1","pid":1001,"tid":1,"ts":0,"args":{"offset":0,"len":4096}}]}"#;
        assert!(Recording::parse(old).unwrap_err().to_string().contains("lacks file, client"));
        assert!(what_if(&Recording::parse(&trace()).unwrap(), &["nope".into()], Options { device: Device::Recorded, host: None, disk: None }).is_err());
    }
}
