//! One run: the world (network, servers, processes) and its event loop.
//!
//! Components never call each other across time: a component that needs
//! another one later schedules an event. Each event is handled by one
//! short method in `client.rs` (processes, MPI-IO) or `server.rs` (cache
//! layer, scheduler, device); this file owns the loop, the messages and
//! the bounds.

use std::time::Instant;

use sluice_core::{AppId, ClientId};

use crate::engine::{EventQueue, Rng, Time};
use crate::error::{Error, ErrorKind};
use crate::net::{Net, HOPS};
use crate::report::{AppReport, RunReport};
use crate::scenario::{Interface, Mode, Scenario};
use crate::server::ServerState;
use crate::slab::Slab;
use crate::trace::Trace;
use crate::workload::{Layout, TwoPhase};

/// Pieces of cache fills and backlogged requests a run may hold beyond
/// the processes' own pieces in flight.
const FILL_PIECES_MAX: usize = 1 << 20;

/// An event: which component, which record.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Ev {
    /// A process starts (after its application's start and jitter).
    Start(u32),
    /// A process finished thinking and issues its next request.
    Ready(u32),
    /// An MPI-IO application starts its next collective round.
    Round(u32),
    /// A message's head reaches its next hop.
    Hop(u32),
    /// A message's tail reached its destination.
    Deliver(u32),
    /// A server's device finished its dispatch.
    DevDone(u32),
    /// A server's scheduler asked to be polled again (`WaitUntil`).
    Wake(u32),
}

/// What a message carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum MsgKind {
    /// A piece's request to its server.
    #[default]
    ToServer,
    /// The server's answer to a piece.
    Reply,
    /// Two-phase read: an aggregator's data for a process.
    ToProc,
    /// Two-phase write: a process's data for an aggregator.
    ToAgg,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Msg {
    pub kind: MsgKind,
    /// The piece (requests, replies) or the receiving process.
    pub id: u32,
    pub src: u32,
    pub dst: u32,
    pub bytes: u64,
    pub hop: u8,
    pub tail_at: Time,
}

/// One access sent to one server: a piece of an application request, or
/// (with `fill`) an aggregation-cache block read.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Piece {
    pub proc: u32,
    pub app: u32,
    pub server: u32,
    pub file: u64,
    pub write: bool,
    pub fill: bool,
    /// Offset in the server's local object.
    pub offset: u64,
    pub len: u64,
    /// Write-behind acknowledged it on arrival.
    pub acked: bool,
    /// Aggregation cache blocks still being read for it.
    pub missing: u32,
    /// When its process sent it (for the trace).
    pub sent_at: Time,
}

/// One application during a run.
pub(crate) struct AppRun {
    pub name: String,
    pub procs: u64,
    pub first: u32,
    pub write: bool,
    pub interface: Interface,
    pub layout: Layout,
    pub two_phase: TwoPhase,
    pub think_ns: u64,
    pub start_ns: u64,
    pub file: u64,
    /// Recorded accesses replayed instead of the layout.
    pub recorded: Option<std::sync::Arc<crate::scenario::Recorded>>,
    pub started: u64,
    pub finished: u64,
    pub round: u64,
    pub pending: u64,
    pub done_at: Option<Time>,
}

/// One process during a run. Its current request is `[cursor, end)` of
/// the application's file still to send, with `inflight` pieces out.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Proc {
    pub app: u32,
    pub rank: u64,
    pub node: u32,
    pub next: u64,
    pub start: u64,
    pub cursor: u64,
    pub end: u64,
    pub inflight: u32,
    pub req_at: Time,
    /// The current request's direction and file.
    pub write: bool,
    pub file: u64,
    /// Two-phase messages received in the current round.
    pub recv: u64,
}

/// Everything one run mutates.
pub(crate) struct World {
    pub q: EventQueue<Ev>,
    pub sc: Scenario,
    pub mode: Mode,
    pub net: Net,
    pub apps: Vec<AppRun>,
    pub procs: Vec<Proc>,
    pub servers: Vec<ServerState>,
    pub pieces: Slab<Piece>,
    pub msgs: Slab<Msg>,
    pub trace: Option<Trace>,
    pub compute_nodes: u32,
}

impl World {
    /// Build the world for `sc` (already scaled and swept) in `mode`.
    pub fn new(sc: &Scenario, mode: &Mode, trace: Option<Trace>) -> Result<World, Error> {
        let nodes = (sc.cluster.compute_nodes + sc.server.count) as usize;
        let procs_total: u64 = sc.apps.iter().map(|a| a.procs).sum();
        let own = (procs_total * sc.client.pieces_inflight_max) as usize;
        let aggs: u64 = sc.apps.iter().map(|a| a.procs * a.aggregators).sum();
        let servers = (0..sc.server.count).map(|_| ServerState::new(sc, mode)).collect::<Result<Vec<_>, _>>()?;
        let mut w = World {
            q: EventQueue::new(sc.bounds.events_pending_max as usize),
            sc: sc.clone(),
            mode: mode.clone(),
            net: Net::new(&sc.network, nodes),
            apps: Vec::with_capacity(sc.apps.len()),
            procs: Vec::with_capacity(procs_total as usize),
            servers,
            pieces: Slab::new(own + FILL_PIECES_MAX, "pieces"),
            msgs: Slab::new(own + FILL_PIECES_MAX + aggs as usize, "messages"),
            trace,
            compute_nodes: sc.cluster.compute_nodes as u32,
        };
        w.build_apps()?;
        Ok(w)
    }

    fn build_apps(&mut self) -> Result<(), Error> {
        let mut rng = Rng::new(self.sc.seed);
        let jitter = self.sc.client.start_jitter_ns;
        for (i, a) in self.sc.apps.clone().iter().enumerate() {
            let first = self.procs.len() as u32;
            let layout = Layout { bytes: a.bytes, procs: a.procs, granularity: a.granularity_bytes, strided: a.pattern == crate::scenario::Pattern::Strided };
            let two_phase = TwoPhase { bytes: a.bytes, aggregators: a.aggregators, cb_bytes: self.sc.client.cb_buffer_bytes };
            for rank in 0..a.procs {
                let node = (first as u64 + rank) % u64::from(self.compute_nodes);
                // The application's direction and file; a recorded
                // application's processes set theirs per request.
                let (write, file) = (a.op == crate::scenario::OpName::Write, i as u64 + 1);
                self.procs.push(Proc { app: i as u32, rank, node: node as u32, write, file, ..Proc::default() });
                self.q.push(a.start_ns + rng.below(jitter + 1), Ev::Start(first + rank as u32))?;
            }
            self.apps.push(AppRun {
                name: a.name.clone(),
                procs: a.procs,
                first,
                write: a.op == crate::scenario::OpName::Write,
                interface: a.interface,
                layout,
                two_phase,
                think_ns: a.think_ns,
                start_ns: a.start_ns,
                file: i as u64 + 1,
                recorded: a.recorded.clone(),
                started: 0,
                finished: 0,
                round: 0,
                pending: 0,
                done_at: None,
            });
        }
        Ok(())
    }

    /// Run until no event is left; fail on a bound or on unfinished work.
    pub fn run(&mut self) -> Result<(), Error> {
        let (events_max, sim_max) = (self.sc.bounds.events_max, self.sc.bounds.sim_ns_max);
        while let Some((now, ev)) = self.q.pop() {
            if self.q.popped() > events_max || now > sim_max {
                return Err(Error::new(ErrorKind::Bound, format!("events_max {events_max} or sim_ns_max {sim_max} reached at t = {now} ns")));
            }
            self.handle(now, ev)?;
        }
        self.check_finished()
    }

    fn handle(&mut self, now: Time, ev: Ev) -> Result<(), Error> {
        match ev {
            Ev::Start(p) => self.proc_start(p, now),
            Ev::Ready(p) => self.proc_ready(p, now),
            Ev::Round(a) => self.round_begin(a, now),
            Ev::Hop(m) => self.hop(m, now),
            Ev::Deliver(m) => self.deliver(m, now),
            Ev::DevDone(s) => self.device_done(s, now),
            Ev::Wake(s) => {
                self.servers[s as usize].wake_fired(now);
                self.poll(s, now)
            }
        }
    }

    fn check_finished(&self) -> Result<(), Error> {
        if let Some(a) = self.apps.iter().find(|a| a.done_at.is_none()) {
            return Err(Error::new(ErrorKind::Stuck, format!("no event left but application {:?} unfinished", a.name)));
        }
        for s in &self.servers {
            s.check_drained()?;
        }
        if self.pieces.live() != 0 || self.msgs.live() != 0 {
            return Err(Error::new(ErrorKind::Stuck, format!("{} pieces, {} messages left", self.pieces.live(), self.msgs.live())));
        }
        Ok(())
    }

    /// Send a message of `bytes` from node `src` to node `dst` now.
    pub fn send(&mut self, kind: MsgKind, id: u32, src: u32, dst: u32, bytes: u64, now: Time) -> Result<(), Error> {
        let m = self.msgs.insert(Msg { kind, id, src, dst, bytes, hop: 0, tail_at: now })?;
        if src == dst {
            return self.q.push(now, Ev::Deliver(m));
        }
        self.q.push(now, Ev::Hop(m))
    }

    fn hop(&mut self, m: u32, now: Time) -> Result<(), Error> {
        let msg = *self.msgs.get(m);
        let c = self.net.cross(now, msg.tail_at, msg.hop, msg.src as usize, msg.dst as usize, msg.bytes);
        let rec = self.msgs.get_mut(m);
        rec.hop += 1;
        rec.tail_at = c.tail_at;
        if rec.hop == HOPS {
            self.q.push(c.tail_at, Ev::Deliver(m))
        } else {
            self.q.push(c.head_at, Ev::Hop(m))
        }
    }

    fn deliver(&mut self, m: u32, now: Time) -> Result<(), Error> {
        let msg = self.msgs.remove(m);
        match msg.kind {
            MsgKind::ToServer => self.server_arrive(msg.id, now),
            MsgKind::Reply => self.reply_arrive(msg.id, now),
            MsgKind::ToProc => self.exchange_to_proc(msg.id, now),
            MsgKind::ToAgg => self.exchange_to_agg(msg.id, now),
        }
    }

    /// The node a server runs on.
    pub fn server_node(&self, s: u32) -> u32 {
        self.compute_nodes + s
    }

    /// The scheduler's names for a process.
    pub fn ids(&self, p: &Piece) -> (AppId, ClientId) {
        (AppId(p.app + 1), ClientId(p.proc))
    }

    /// The per-run report.
    pub fn report(&self, wall_s: f64, granularity: Option<u64>) -> RunReport {
        let apps: Vec<AppReport> = self
            .apps
            .iter()
            .map(|a| {
                let t = (a.done_at.unwrap_or(0).saturating_sub(a.start_ns)) as f64 / 1e9;
                AppReport::new(&a.name, a.procs, a.layout.bytes, t)
            })
            .collect();
        let mut devices = crate::report::DeviceReport::default();
        for s in &self.servers {
            devices.add(&s.stats, &s.sched.stats());
        }
        let makespan = self.apps.iter().filter_map(|a| a.done_at).max().unwrap_or(0) as f64 / 1e9;
        let mut r = RunReport::new(self.mode.label(), granularity, makespan, apps, self.q.popped(), wall_s, devices);
        (r.pieces_peak, r.messages_peak) = (self.pieces.capacity_used() as u64, self.msgs.capacity_used() as u64);
        r
    }
}

/// Run `sc` once in `mode`; the scenario is already scaled and swept.
pub(crate) fn run_once(sc: &Scenario, mode: &Mode, granularity: Option<u64>, trace: Option<&mut Trace>) -> Result<RunReport, Error> {
    let t0 = Instant::now();
    let mut w = World::new(sc, mode, trace.as_ref().map(|t| t.for_run(&mode.label(), granularity)))?;
    w.run().map_err(|e| e.with_seed(sc.seed))?;
    let report = w.report(t0.elapsed().as_secs_f64(), granularity);
    if let (Some(t), Some(mine)) = (trace, w.trace.take()) {
        t.absorb(mine);
    }
    Ok(report)
}
