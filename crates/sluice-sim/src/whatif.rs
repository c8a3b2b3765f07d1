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
use sluice_core::replay::{replay, ReplayOptions, Stream};
use sluice_core::{AppId, ClientId, CostLearner, Dispatch, FileId, Limits, Observation, Op, PolicyConfig, Request, RequestId, Scheduler};
use sluice_device::{Access, DeviceModel, Hdd};

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
    /// The model learned from the trace's own dispatches.
    Recorded,
    /// The emulated 7200 rpm disk (`sluice serve --device hdd7200`).
    Hdd7200,
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

    fn name(&self, app: AppId) -> String {
        self.names.get(&app.0).cloned().unwrap_or_else(|| format!("app {}", app.0))
    }

    /// One stream per connection, times relative to the first arrival.
    fn streams(&self) -> Vec<Stream> {
        let t0 = self.requests[0].arrival;
        let mut by: HashMap<(AppId, ClientId), Vec<Rec>> = HashMap::new();
        for r in &self.requests {
            by.entry((r.req.app, r.req.client)).or_default().push(*r);
        }
        let mut keys: Vec<_> = by.keys().copied().collect();
        keys.sort();
        keys.into_iter()
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
                let thinks = (0..recs.len()).map(|i| if i >= depth { recs[i].arrival.saturating_sub(recs[i - depth].answer) } else { recs[i].arrival - recs[0].arrival }).collect();
                Stream { start_ns: recs[0].arrival - t0, think_ns: 0, jitter_ns: 0, depth, requests: recs.iter().map(|r| r.req).collect(), thinks }
            })
            .collect()
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

/// Replay `rec` under each of `policies` on `device`.
pub fn what_if(rec: &Recording, policies: &[String], device: Device) -> Result<WhatIf, Error> {
    let recorded: Vec<(Request, u64, u64)> = rec.requests.iter().map(|r| (r.req, r.arrival, r.answer)).collect();
    let (mut rows, span) = outcomes("recorded", rec, &recorded);
    let mut makespan = vec![("recorded".to_string(), span)];
    let learner = rec.learned();
    let (model, depth) = (learner.model(), learner.depth_cap().max(1));
    let streams = rec.streams();
    for p in policies {
        let config = PolicyConfig::from_name(p).ok_or_else(|| bad(format!("unknown policy {p:?} (known: {})", sluice_core::POLICY_NAMES.join(", "))))?;
        let limits = Limits { dispatches_inflight_max: if device == Device::Hdd7200 { 1 } else { depth }, ..Limits::default() }.clamped();
        let mut s = Scheduler::new(config, limits);
        let mut hdd = Hdd::hdd7200();
        let mut head: Option<(FileId, u64)> = None;
        let service = |d: &Dispatch| match device {
            Device::Hdd7200 => hdd.service_ns(Access { file: d.file.0, offset: d.offset, len: d.len }),
            Device::Recorded => {
                let seek = head != Some((d.file, d.offset));
                head = Some((d.file, d.end()));
                model.service_ns(d.len, seek)
            }
        };
        let log = replay(&mut s, &streams, service, ReplayOptions { events_max: EVENTS_MAX, check_invariants: false }).map_err(|e| bad(format!("replay under {p}: {e:?}")))?;
        let arrivals: HashMap<RequestId, u64> = log.arrivals.iter().copied().collect();
        let answered: Vec<(Request, u64, u64)> =
            log.served.iter().flat_map(|sv| sv.dispatch.members.iter().map(|m| (*m, arrivals[&m.id], sv.done_ns)).collect::<Vec<_>>()).collect();
        let (r, span) = outcomes(p, rec, &answered);
        rows.extend(r);
        makespan.push((p.clone(), span));
    }
    let device = match device {
        Device::Hdd7200 => "the emulated 7200 rpm disk".to_string(),
        Device::Recorded => format!(
            "as recorded: {:.1} us per dispatch, {:.3} ns per byte, seek {:.1} us, parallelism {} (from {} dispatches)",
            model.dispatch_ns as f64 / 1e3,
            model.byte_ps as f64 / 1e3,
            model.seek_ns as f64 / 1e3,
            model.parallelism,
            learner.observed()
        ),
    };
    Ok(WhatIf { device, streams: streams.len(), requests: rec.requests.len(), rows, makespan_s: makespan })
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
        s += &format!("makespan {p}: {m:.3} s\n");
    }
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
    fn a_trace_replays_under_each_policy_and_the_recording_comes_first() {
        let rec = Recording::parse(&trace()).unwrap();
        assert_eq!(rec.requests.len(), 40);
        let streams = rec.streams();
        assert_eq!(streams.len(), 2, "one stream per connection");
        assert!(streams.iter().all(|s| s.depth == 1 && s.requests.len() == 20), "synchronous streams keep their order");
        let w = what_if(&rec, &["fifo".into(), "aioli".into()], Device::Hdd7200).unwrap();
        assert_eq!(w.rows.len(), 6, "two applications x (recorded, fifo, aioli)");
        assert_eq!((w.rows[0].policy.as_str(), w.rows[0].app.as_str(), w.rows[0].requests, w.rows[0].bytes), ("recorded", "alpha", 20, 20 * 65536));
        assert!(w.rows.iter().all(|r| r.requests == 20), "every request is replayed once");
        let span = |p: &str| w.makespan_s.iter().find(|(n, _)| n == p).unwrap().1;
        assert!(span("aioli") < span("fifo"), "on a disk, two interleaved sequential readers favour aioli: {:?}", w.makespan_s);
        let learned = what_if(&rec, &["fifo".into()], Device::Recorded).unwrap();
        assert!(learned.device.contains("from 40 dispatches"), "{}", learned.device);
    }

    #[test]
    fn darshan_segments_become_one_stream_per_rank() {
        let dxt = r#"{"source":"darshan","exe":"/bin/ior -a POSIX","nprocs":2,"layer":"DXT_POSIX","files":["/f"],
            "segments":[[0,0,"w",0,1048576,0.001,0.011],[1,0,"w",1048576,1048576,0.001,0.012],[0,0,"w",2097152,1048576,0.012,0.02],[1,0,"r",0,1048576,0.013,0.03]],"zero_length":0}"#;
        let rec = Recording::from_darshan(dxt).unwrap();
        let streams = rec.streams();
        assert_eq!(streams.len(), 2, "one stream per rank");
        assert_eq!(streams[0].requests.iter().map(|r| r.offset).collect::<Vec<_>>(), [0, 2097152], "rank 0 keeps its order");
        assert_eq!(streams[0].thinks[1], 1_000_000, "rank 0 waited 1 ms after its first write was answered");
        let w = what_if(&rec, &["fifo".into()], Device::Recorded).unwrap();
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
        assert!(what_if(&Recording::parse(&trace()).unwrap(), &["nope".into()], Device::Recorded).is_err());
    }
}
