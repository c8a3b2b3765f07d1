//! The live trace: `sluice serve --trace PATH` writes every
//! dispatch and every request it carried as Chrome/Perfetto trace-event
//! JSON, the document shape `sluice sim --trace` writes, so a real run and
//! its simulated twin open side by side in `ui.perfetto.dev`.
//!
//! Tracks: one process per application (pid `PID_APP_BASE` + its id,
//! named after it), each request an async slice from arrival to answer on
//! the thread of its connection; process 2, "live: device", each dispatch
//! an async slice over its system call, with its file, offset, length and
//! members in `args` (async, because a connection may have several
//! requests in flight and the device serves several dispatches at once).
//!
//! The dispatcher appends each finished dispatch to a bounded queue
//! (`QUEUE_MAX`; a full queue drops the record and counts it: tracing never
//! slows the loop down) that a writer thread empties every `FLUSH_EVERY`. The writer stops at
//! `trace_bytes_max` bytes, closes the document and says so on stderr; the
//! document is closed at shutdown too. `ServerHandle::set_tracing` pauses
//! and resumes recording (`sluice serve`: SIGUSR1).

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use sluice_core::{AppId, Op};

use crate::error::{Error, Result};
use crate::sync::lock;

/// Dispatch records waiting for the writer; past it they are dropped (and
/// counted in the document's `otherData.records_dropped`). 65,536: 20 ms
/// of 3 million dispatches a second.
pub const QUEUE_MAX: usize = 65_536;
/// How often the writer takes the queued records: the loop never wakes it
/// (a wake-up per dispatch would be a thread hand-off per dispatch).
pub const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_millis(20);
/// Members of a dispatch listed in its `args` (all are counted).
pub const ARGS_MEMBERS_MAX: usize = 16;

/// One request inside a traced dispatch.
#[derive(Clone, Copy, Debug)]
pub struct Member {
    pub app: AppId,
    /// The issuing connection (one stream of requests, `sluice what-if`).
    pub client: u32,
    pub id: u64,
    pub offset: u64,
    pub len: u64,
    pub arrival_ns: u64,
}

/// What the writer receives.
pub enum Record {
    /// An application's name, for its track.
    App(AppId, String),
    /// A finished dispatch: its system call ran over `[started, started +
    /// service)`, its members were answered at `answered` (server clock,
    /// ns).
    Dispatch { id: u64, op: Op, file: u64, offset: u64, len: u64, started: u64, service: u64, answered: u64, members: Vec<Member> },
}

/// Records waiting for the writer, shared with it.
struct Queue {
    records: Mutex<Vec<Record>>,
    /// The tracer is gone: drain, close the document, end.
    closed: AtomicBool,
}

impl Queue {
    /// Append `r` unless `max` records wait already (false then).
    fn push(&self, r: Record, max: usize) -> bool {
        let mut q = lock(&self.records);
        let room = q.len() < max;
        if room {
            q.push(r);
        }
        room
    }
}

/// The dispatcher's side.
pub struct Tracer {
    queue: Arc<Queue>,
    on: Arc<AtomicBool>,
    /// Set by the writer when the file reached `trace_bytes_max`.
    full: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    writer: Option<JoinHandle<()>>,
}

impl Tracer {
    /// Create `path` and start the writer. `about` is the server's device
    /// and policy, as JSON members (`"device":"hdd7200",...`): they go in
    /// the device process's metadata, where `sluice what-if` reads which
    /// device to replay on.
    pub fn start(path: &Path, bytes_max: u64, about: &str) -> Result<Tracer> {
        let f = File::create(path).map_err(|e| Error::io(&format!("create the trace {}", path.display()), &e))?;
        let queue = Arc::new(Queue { records: Mutex::new(Vec::new()), closed: AtomicBool::new(false) });
        let on = Arc::new(AtomicBool::new(true));
        let full = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicU64::new(0));
        let (q, o, fu, d, p) = (Arc::clone(&queue), Arc::clone(&on), Arc::clone(&full), Arc::clone(&dropped), path.to_path_buf());
        let about = about.to_string();
        let writer = std::thread::Builder::new()
            .name("sluice-trace".into())
            .spawn(move || write(q, BufWriter::new(f), p, bytes_max, &about, o, fu, d))
            .map_err(|e| Error::io("spawn thread", &e))?;
        Ok(Tracer { queue, on, full, dropped, writer: Some(writer) })
    }

    /// The switch `ServerHandle::set_tracing` turns, and the flag that
    /// says the file is full (then the switch stays off).
    pub fn switch(&self) -> (Arc<AtomicBool>, Arc<AtomicBool>) {
        (Arc::clone(&self.on), Arc::clone(&self.full))
    }

    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Queue a record (no wake-up: the writer looks every `FLUSH_EVERY`);
    /// dropped and counted when `QUEUE_MAX` wait already.
    pub fn send(&self, r: Record) {
        if !self.queue.push(r, QUEUE_MAX) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Tracer {
    /// Close the document: the writer drains the queue and ends.
    fn drop(&mut self) {
        self.queue.closed.store(true, Ordering::SeqCst);
        if let Some(w) = self.writer.take() {
            w.thread().unpark();
            let _ = w.join();
        }
    }
}

fn op_name(op: Op) -> &'static str {
    if op == Op::Read {
        "read"
    } else {
        "write"
    }
}

/// `4 KiB`, `1 MiB`, `100 B`: the sizes `sluice sim --trace` names slices with.
fn size(b: u64) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// A JSON string literal (quotes included).
fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// Application `a` is process `PID_APP_BASE + a`.
pub const PID_APP_BASE: u32 = 1_000;
const PID_DEVICE: u32 = 2;

/// Append the events of one record to `out`, each a JSON object after
/// ",\n" (the writer reuses `out`: no allocation per event).
fn events(r: &Record, out: &mut String) {
    match r {
        Record::App(app, name) => {
            let _ = write!(out, ",\n{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"ts\":0,\"args\":{{\"name\":{}}}}}", PID_APP_BASE + app.0, json_str(name));
        }
        Record::Dispatch { id, op, file, offset, len, started, service, answered, members } => {
            let (opn, n) = (op_name(*op), members.len());
            let (b, e) = (*started as f64 / 1e3, (started + service) as f64 / 1e3);
            let _ = write!(out, ",\n{{\"name\":\"{opn} {} x{n}\",\"ph\":\"b\",\"cat\":\"dispatch\",\"id\":\"d{id}\",\"pid\":{PID_DEVICE},\"tid\":0,\"ts\":{b},\"args\":{{\"file\":{file},\"offset\":{offset},\"len\":{len},\"requests\":{n},\"members\":[", size(*len));
            for (k, m) in members.iter().take(ARGS_MEMBERS_MAX).enumerate() {
                let _ = write!(out, "{}[{},{},{}]", if k > 0 { "," } else { "" }, m.app.0, m.offset, m.len);
            }
            let _ = write!(out, "]}}}},\n{{\"name\":\"{opn} {} x{n}\",\"ph\":\"e\",\"cat\":\"dispatch\",\"id\":\"d{id}\",\"pid\":{PID_DEVICE},\"tid\":0,\"ts\":{e}}}", size(*len));
            let end = *answered as f64 / 1e3;
            for m in members {
                let (b, wait) = (m.arrival_ns as f64 / 1e3, started.saturating_sub(m.arrival_ns) as f64 / 1e3);
                let (name, pid, rid, tid) = (size(m.len), PID_APP_BASE + m.app.0, m.id, m.client);
                let _ = write!(
                    out,
                    ",\n{{\"name\":\"{opn} {name}\",\"ph\":\"b\",\"cat\":\"request\",\"id\":\"r{rid}\",\"pid\":{pid},\"tid\":{tid},\"ts\":{b},\"args\":{{\"file\":{file},\"client\":{tid},\"offset\":{},\"len\":{},\"dispatch\":{id},\"wait_us\":{wait}}}}}",
                    m.offset, m.len
                );
                let _ = write!(out, ",\n{{\"name\":\"{opn} {name}\",\"ph\":\"e\",\"cat\":\"request\",\"id\":\"r{rid}\",\"pid\":{pid},\"tid\":{tid},\"ts\":{end}}}");
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn write(queue: Arc<Queue>, mut f: BufWriter<File>, path: PathBuf, bytes_max: u64, about: &str, on: Arc<AtomicBool>, full_flag: Arc<AtomicBool>, dropped: Arc<AtomicU64>) {
    let sep = if about.is_empty() { "" } else { "," };
    let head = format!(
        r#"{{"traceEvents":[
{{"name":"process_name","ph":"M","pid":{PID_DEVICE},"tid":0,"ts":0,"args":{{"name":"live: device"{sep}{about}}}}},
{{"name":"thread_name","ph":"M","pid":{PID_DEVICE},"tid":0,"ts":0,"args":{{"name":"dispatches"}}}}"#
    );
    let mut written = head.len() as u64;
    let mut ok = f.write_all(head.as_bytes()).is_ok();
    let (mut full, mut kept, mut past) = (false, 0u64, 0u64);
    let (mut buf, mut batch) = (String::new(), Vec::new());
    loop {
        let closed = queue.closed.load(Ordering::SeqCst);
        std::mem::swap(&mut batch, &mut *lock(&queue.records));
        for r in batch.drain(..) {
            if full || !ok {
                past += 1;
                continue;
            }
            buf.clear();
            events(&r, &mut buf);
            let bytes = buf.len() as u64;
            // Keep room for the closing part (under 200 bytes).
            if written + bytes + 200 > bytes_max {
                full = true;
                full_flag.store(true, Ordering::Relaxed);
                on.store(false, Ordering::Relaxed);
                eprintln!("sluice: the trace {} reached {} bytes (trace_bytes_max {bytes_max}): tracing stopped, the file is complete up to here", path.display(), written);
                past += 1;
                continue;
            }
            ok &= f.write_all(buf.as_bytes()).is_ok();
            written += bytes;
            kept += 1;
        }
        if closed {
            break;
        }
        std::thread::park_timeout(FLUSH_EVERY);
    }
    let tail = format!(
        "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"source\":\"sluice serve\",\"records\":{kept},\"records_dropped\":{},\"records_past_bound\":{past},\"trace_bytes_max\":{bytes_max}}}}}\n",
        dropped.load(Ordering::Relaxed)
    );
    let _ = f.write_all(tail.as_bytes()).and_then(|()| f.flush());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dispatch(id: u64, members: usize) -> Record {
        let members = (0..members as u64).map(|k| Member { app: AppId(1), client: 3, id: id * 100 + k, offset: k * 4096, len: 4096, arrival_ns: 1_000 }).collect();
        Record::Dispatch { id, op: Op::Read, file: 1, offset: 0, len: 4096 * 3, started: 2_000, service: 3_000, answered: 6_000, members }
    }

    fn read(path: &Path) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("the trace is one JSON document")
    }

    #[test]
    fn a_trace_is_valid_json_with_both_tracks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.json");
        let t = Tracer::start(&p, 1 << 20, r#""device":"hdd7200""#).unwrap();
        t.send(Record::App(AppId(1), "app \"one\"".into()));
        t.send(dispatch(7, 3));
        drop(t);
        let v = read(&p);
        let ev = v["traceEvents"].as_array().unwrap();
        let names: Vec<&str> = ev.iter().filter(|e| e["ph"] == "M").map(|e| e["args"]["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"live: device") && names.contains(&"app \"one\""), "{names:?}");
        let device = ev.iter().find(|e| e["args"]["name"] == "live: device").unwrap();
        assert_eq!(device["args"]["device"], "hdd7200", "the server's device, for what-if");
        assert!(
            ev.iter().filter(|e| e["cat"] == "request").all(|e| e["pid"] == PID_APP_BASE + 1 && e["tid"] == 3),
            "requests on their application's process, their connection's thread"
        );
        let d = ev.iter().find(|e| e["cat"] == "dispatch" && e["ph"] == "b").unwrap();
        assert_eq!((d["name"].as_str().unwrap(), d["args"]["requests"].as_u64().unwrap(), d["ts"].as_f64().unwrap()), ("read 12 KiB x3", 3, 2.0));
        assert_eq!(ev.iter().filter(|e| e["cat"] == "request").count(), 6, "one begin and one end per member");
        assert_eq!(v["otherData"]["records"], 2);
    }

    #[test]
    fn the_queue_takes_n_records_and_refuses_the_n_plus_first() {
        let q = Queue { records: Mutex::new(Vec::new()), closed: AtomicBool::new(false) };
        assert!((0..4).all(|i| q.push(dispatch(i, 1), 4)), "N records wait");
        assert!(!q.push(dispatch(4, 1), 4), "the N+1st is refused (and counted by the tracer)");
    }

    #[test]
    fn the_size_bound_stops_tracing_and_keeps_the_file_valid() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.json");
        let bound = 4_000;
        let t = Tracer::start(&p, bound, "").unwrap();
        let (on, full) = t.switch();
        for i in 0..100 {
            t.send(dispatch(i, 2));
        }
        drop(t);
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len <= bound, "{len} bytes over the bound {bound}");
        let v = read(&p);
        let kept = v["otherData"]["records"].as_u64().unwrap();
        assert!(kept > 0 && kept < 100 && v["otherData"]["records_past_bound"].as_u64().unwrap() == 100 - kept, "{}", v["otherData"]);
        assert!(!on.load(Ordering::Relaxed) && full.load(Ordering::Relaxed), "recording is switched off at the bound, and the file says full");
    }
}
