//! Chrome/Perfetto trace-event JSON (`--trace PATH`): one track per
//! process (its application requests, and its concurrent pieces as async
//! slices, which the viewer lays out on separate tracks) and one per
//! device (its dispatches), grouped per run. Open the file in `ui.perfetto.dev` or
//! `chrome://tracing`. Bounded by `trace_events_max`: past it, events are
//! counted but not kept, and the file says so in its metadata.

use serde::Serialize;
use sluice_core::{Dispatch, Op};

use crate::engine::Time;

#[derive(Clone, Debug, Serialize)]
struct Event {
    name: String,
    ph: &'static str,
    pid: u32,
    tid: u32,
    ts: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<serde_json::Value>,
}

/// A trace being recorded.
#[derive(Clone, Debug)]
pub struct Trace {
    events: Vec<Event>,
    max: usize,
    dropped: u64,
    runs: u32,
    pid_procs: u32,
}

impl Trace {
    /// An empty trace keeping at most `max` events.
    pub fn new(max: u64) -> Trace {
        Trace { events: Vec::new(), max: max as usize, dropped: 0, runs: 0, pid_procs: 1 }
    }

    /// Events not kept because the bound was reached.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// A trace for the next run, on its own two tracks groups.
    pub(crate) fn for_run(&self, label: &str, granularity: Option<u64>) -> Trace {
        let pid = 2 * self.runs + 1;
        let mut t = Trace { events: Vec::new(), max: self.max.saturating_sub(self.events.len()), dropped: 0, runs: 0, pid_procs: pid };
        let at = granularity.map(|g| format!(" @ {}", crate::units::size(g))).unwrap_or_default();
        t.meta(pid, &format!("{label}{at}: processes"));
        t.meta(pid + 1, &format!("{label}{at}: devices"));
        t
    }

    /// Append a run's trace.
    pub(crate) fn absorb(&mut self, other: Trace) {
        self.events.extend(other.events);
        self.dropped += other.dropped;
        self.runs += 1;
    }

    fn meta(&mut self, pid: u32, name: &str) {
        let args = serde_json::json!({ "name": name });
        self.events.push(Event { name: "process_name".into(), ph: "M", pid, tid: 0, ts: 0.0, dur: None, cat: None, id: None, args: Some(args) });
    }

    fn push(&mut self, e: Event) {
        if self.events.len() >= self.max {
            self.dropped += 1;
        } else {
            self.events.push(e);
        }
    }

    /// Process `p` had an application request in flight over `[start, end)`.
    pub(crate) fn process_span(&mut self, p: u32, start: Time, end: Time, op: Op, bytes: u64) {
        let name = format!("{} {}", if op == Op::Read { "read" } else { "write" }, crate::units::size(bytes));
        let (ts, dur) = (start as f64 / 1e3, (end - start) as f64 / 1e3);
        self.push(Event { name, ph: "X", pid: self.pid_procs, tid: p, ts, dur: Some(dur), cat: None, id: None, args: None });
    }

    /// A piece of process `p`'s request was in flight over `[start, end)`
    /// (sent to `server`, answered): an async slice, so pieces in flight
    /// together land on separate tracks.
    pub(crate) fn piece_span(&mut self, p: u32, piece: u32, start: Time, end: Time, server: u32, bytes: u64) {
        if self.events.len() + 2 > self.max {
            self.dropped += 2;
            return;
        }
        let name = format!("piece {} @ server {server}", crate::units::size(bytes));
        let id = Some(format!("{}.{p}.{piece}.{start}", self.pid_procs));
        for (ph, at) in [("b", start), ("e", end)] {
            let ev = Event { name: name.clone(), ph, pid: self.pid_procs, tid: p, ts: at as f64 / 1e3, dur: None, cat: Some("piece"), id: id.clone(), args: None };
            self.push(ev);
        }
    }

    /// Server `s`'s device served `d` over `[start, end)`. A device of
    /// one channel gets complete spans on the server's track; one of
    /// several, whose dispatches overlap, async slices, which the viewer
    /// puts side by side.
    pub(crate) fn device_span(&mut self, s: u32, start: Time, end: Time, d: &Dispatch, overlapping: bool) {
        let name = format!("{} {} x{}", if d.op == Op::Read { "read" } else { "write" }, crate::units::size(d.len), d.members.len());
        let args = serde_json::json!({ "file": d.file.0, "offset": d.offset, "len": d.len, "requests": d.members.len() });
        let (ts, dur) = (start as f64 / 1e3, (end - start) as f64 / 1e3);
        let pid = self.pid_procs + 1;
        if !overlapping {
            self.push(Event { name, ph: "X", pid, tid: s, ts, dur: Some(dur), cat: None, id: None, args: Some(args) });
            return;
        }
        if self.events.len() + 2 > self.max {
            self.dropped += 2;
            return;
        }
        let id = Some(format!("{pid}.{s}.{}", d.id.0));
        self.push(Event { name: name.clone(), ph: "b", pid, tid: s, ts, dur: None, cat: Some("dispatch"), id: id.clone(), args: Some(args) });
        self.push(Event { name, ph: "e", pid, tid: s, ts: end as f64 / 1e3, dur: None, cat: Some("dispatch"), id, args: None });
    }

    /// The trace-event JSON document.
    pub fn to_json(&self) -> String {
        let doc = serde_json::json!({
            "traceEvents": self.events,
            "displayTimeUnit": "ms",
            "otherData": { "events_dropped": self.dropped, "trace_events_max": self.max },
        });
        doc.to_string()
    }
}
