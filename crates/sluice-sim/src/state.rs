//! What a run is made of: the world every event handler mutates —
//! applications, processes, pieces and messages in flight, the I/O
//! servers (each with its scheduler, device model, cache layer and
//! backlog) — and the few operations on it that every handler shares
//! (sending a message, naming a process to the scheduler).
//!
//! The crate reads one way: `engine`, `net`, `slab`, `scenario`,
//! `workload` and `units` are leaves; `trace` uses `units`; this module
//! uses them; the handlers (`client.rs` for processes and MPI-IO,
//! `server.rs` for cache layers, schedulers and devices) use this module;
//! `sim.rs` owns the loop, hands each event to its handler, and builds the
//! report (`report.rs`, which needs only this module's counters).

use std::collections::{HashMap, HashSet, VecDeque};

use sluice_core::{AppId, ClientId, DeviceCost, Dispatch, ErrorKind as CoreKind, Limits, PolicyConfig, Request, Scheduler};
use sluice_device::{Access, Channels, DeviceModel, Hdd, SeekKind, Ssd};

use crate::engine::{EventQueue, Rng, Time};
use crate::error::{Error, ErrorKind};
use crate::net::Net;
use crate::scenario::{Cache, Interface, Mode, Scenario, SchedulerModel};
use crate::slab::Slab;
use crate::trace::Trace;
use crate::workload::{Layout, TwoPhase};

/// Processes from which a world is large: its records no longer stay in
/// the caches. The event loop then prefetches what the coming events touch
/// (`World::prefetch_ahead`), the servers' schedulers prefetch inside their
/// own bookkeeping (`Scheduler::set_prefetch`), and the `sluice` binary
/// allocates from huge pages (`crates/sluice/src/alloc.rs`).
pub const LARGE_WORLD_PROCS: u64 = 50_000;

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
    /// A piece's request, delivered earlier, had its server CPU time
    /// (`cpu_ns_per_request`) and reaches the cache layer.
    Admit(u32),
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
    /// Server-directed: a process's list message (a bundle) to a server.
    ToServerList,
    /// Server-directed: the server's answer to a bundle.
    ListReply,
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
    /// Server-directed: the bundle (list message) it travels in.
    pub bundle: Option<u32>,
}

/// Server-directed: one process's list message to one server in one
/// round; its pieces are `World::bundle_pieces[id]`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Bundle {
    pub proc: u32,
    pub server: u32,
    /// Pieces not yet done on the device.
    pub left: u32,
    /// Data bytes of its pieces.
    pub bytes: u64,
    pub write: bool,
}

/// Server-directed: a round's messages a server holds for one
/// application until every expected one arrived.
#[derive(Clone, Debug, Default)]
pub(crate) struct Held {
    /// Processes that have pieces for this server in this round.
    pub expect: u32,
    pub bundles: Vec<u32>,
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
    /// A list call's blocks still to send after `[cursor, end)`: indices
    /// `block..block_end` of the rank's blocks (none for one block).
    pub block: u64,
    pub block_end: u64,
    /// Bytes of the current call, all blocks.
    pub req_bytes: u64,
}

/// Everything one run mutates.
pub(crate) struct World {
    pub q: EventQueue<Ev>,
    pub sc: Scenario,
    pub mode: Mode,
    pub net: Net,
    pub apps: Vec<AppRun>,
    pub procs: Vec<Proc>,
    /// The schedulers the processes send to: the servers, or with
    /// `[forwarders]` the forwarders.
    pub servers: Vec<ServerState>,
    /// With `[forwarders]`: the servers behind them, whose devices serve
    /// the forwarders' dispatches (their schedulers are unused).
    pub backend: Option<Vec<ServerState>>,
    pub pieces: Slab<Piece>,
    pub msgs: Slab<Msg>,
    /// Server-directed list messages in flight or held, and their pieces
    /// (indexed like the slab; emptied when a bundle is answered).
    pub bundles: Slab<Bundle>,
    pub bundle_pieces: Vec<Vec<u32>>,
    pub trace: Option<Trace>,
    pub compute_nodes: u32,
    /// When each of the host's cores is next free (`host_cores`; empty:
    /// every node has its own CPU).
    pub cores: Vec<Time>,
    /// Prefetch ahead of the events (`LARGE_WORLD_PROCS`).
    pub prefetch: bool,
}

impl World {
    /// Build the world for `sc` (already scaled and swept) in `mode`.
    pub fn new(sc: &Scenario, mode: &Mode, trace: Option<Trace>) -> Result<World, Error> {
        let schedulers = sc.forwarders.as_ref().map_or(sc.server.count, |f| f.count);
        let nodes = (sc.cluster.compute_nodes + schedulers) as usize;
        let procs_total = sc.procs_total();
        let own = (procs_total * sc.client.pieces_inflight_max) as usize;
        let aggs: u64 = sc.apps.iter().map(|a| a.procs * a.aggregators).sum();
        let servers = (0..schedulers).map(|_| ServerState::new(sc, mode)).collect::<Result<Vec<_>, _>>()?;
        let backend = match sc.forwarders {
            Some(_) => Some((0..sc.server.count).map(|_| ServerState::new(sc, mode)).collect::<Result<Vec<_>, _>>()?),
            None => None,
        };
        let mut w = World {
            q: EventQueue::new(sc.bounds.events_pending_max as usize),
            sc: sc.clone(),
            mode: mode.clone(),
            net: Net::new(&sc.network, nodes),
            apps: Vec::with_capacity(sc.apps.len()),
            procs: Vec::with_capacity(procs_total as usize),
            servers,
            backend,
            pieces: Slab::new(own + FILL_PIECES_MAX, "pieces"),
            msgs: Slab::new(own + FILL_PIECES_MAX + aggs as usize, "messages"),
            bundles: Slab::new((procs_total * sc.server.count) as usize, "list messages"),
            bundle_pieces: Vec::new(),
            trace,
            compute_nodes: sc.cluster.compute_nodes as u32,
            cores: vec![0; sc.cluster.host_cores as usize],
            prefetch: false,
        };
        w.set_prefetch(procs_total >= LARGE_WORLD_PROCS);
        w.build_apps()?;
        Ok(w)
    }

    /// Prefetch ahead of the events, and inside the servers' schedulers
    /// (`Scheduler::set_prefetch`), or neither. Either way the run is the
    /// same.
    pub fn set_prefetch(&mut self, on: bool) {
        self.prefetch = on;
        for srv in self.servers.iter_mut().chain(self.backend.iter_mut().flatten()) {
            srv.sched.set_prefetch(on);
        }
    }

    fn build_apps(&mut self) -> Result<(), Error> {
        let mut rng = Rng::new(self.sc.seed);
        let jitter = self.sc.client.start_jitter_ns;
        for (i, a) in self.sc.apps.clone().iter().enumerate() {
            let first = self.procs.len() as u32;
            let strided = a.pattern == crate::scenario::Pattern::Strided;
            let layout = Layout { bytes: a.bytes, procs: a.procs, granularity: a.granularity_bytes, strided, blocks: a.blocks_per_call };
            let two_phase = TwoPhase { bytes: a.bytes, aggregators: a.aggregators, cb_bytes: self.sc.client.cb_buffer_bytes };
            for rank in 0..a.procs {
                let node = (first as u64 + rank) % u64::from(self.compute_nodes);
                // The application's direction and file; a recorded
                // application's processes set theirs per request.
                let (write, file) = (a.op == crate::scenario::OpName::Write, i as u64 + 1);
                self.procs.push(Proc { app: i as u32, rank, node: node as u32, write, file, ..Proc::default() });
                let offset = match a.start_offsets_ns.get(rank as usize) {
                    Some(&measured) => measured,
                    None => rng.below(jitter + 1),
                };
                self.q.push(a.start_ns.saturating_add(offset), Ev::Start(first + rank as u32))?;
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

    /// Send a message of `bytes` from node `src` to node `dst` now. It
    /// enters the sender's NIC (hop 0) at once, without an event of its
    /// own: that link is the sending node's, and its head is at the NIC
    /// now. Only a message sent from the same node at the same nanosecond
    /// could be ordered differently than by an event (insertion order
    /// then, call order now); both are deterministic. This saves two of
    /// the about ten events a request takes.
    pub fn send(&mut self, kind: MsgKind, id: u32, src: u32, dst: u32, bytes: u64, now: Time) -> Result<(), Error> {
        if src == dst {
            let m = self.msgs.insert(Msg { kind, id, src, dst, bytes, hop: 0, tail_at: now })?;
            return self.q.push(now, Ev::Deliver(m));
        }
        let c = self.net.cross(now, now, 0, src as usize, dst as usize, bytes);
        let m = self.msgs.insert(Msg { kind, id, src, dst, bytes, hop: 1, tail_at: c.tail_at })?;
        self.q.push(c.head_at, Ev::Hop(m))
    }

    /// `cost` ns of CPU wanted from `at` on: when it is done. On the
    /// shared host, on the core free first (at or after `at`); else on the
    /// caller's own CPU, at once.
    pub fn cpu(&mut self, at: Time, cost: u64) -> Time {
        match self.cores.iter_mut().min() {
            Some(free) => {
                *free = (*free).max(at) + cost;
                *free
            }
            None => at + cost,
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

    /// The request piece `id` is to its server's scheduler.
    pub fn request(&self, id: u32, p: &Piece) -> Request {
        let (app, client) = self.ids(p);
        let op = if p.write { sluice_core::Op::Write } else { sluice_core::Op::Read };
        Request { id: sluice_core::RequestId(u64::from(id)), app, client, file: sluice_core::FileId(p.file), op, offset: p.offset, len: p.len }
    }
}

/// Device counters of one server.
#[derive(Clone, Copy, Debug, Default)]
pub struct DevStats {
    pub seeks_none: u64,
    pub seeks_near: u64,
    pub seeks_far: u64,
    pub busy_ns: u64,
    pub bytes: u64,
    pub cache_hits: u64,
    /// The most requests the server's backlog held at once (its bound is
    /// `backlog_max`).
    pub backlog_peak: u64,
}

/// The aggregation cache's blocks: present (FIFO-evicted) and being read.
#[derive(Default)]
pub(crate) struct Blocks {
    pub block: u64,
    /// Blocks kept present at most (`cache_bytes / block`; 0: none kept).
    pub max: usize,
    pub present: HashSet<(u64, u64)>,
    pub order: VecDeque<(u64, u64)>,
    pub filling: HashMap<(u64, u64), Vec<u32>>,
}

impl Blocks {
    /// Keep a block just read, evicting the oldest one when `max` are
    /// present already.
    pub fn keep(&mut self, key: (u64, u64)) {
        if self.max == 0 {
            return;
        }
        if self.order.len() >= self.max {
            let old = self.order.pop_front().expect("a full cache has blocks");
            self.present.remove(&old);
        }
        self.present.insert(key);
        self.order.push_back(key);
    }
}

pub(crate) struct ServerState {
    pub sched: Scheduler,
    pub dev: Box<dyn DeviceModel>,
    /// Dispatches in flight, in the order they left: each with when it
    /// left and when the device is done with it (at most `depth`).
    pub inflight: VecDeque<(Dispatch, Time, Time)>,
    /// Dispatches kept in flight (`Server::depth`).
    pub depth: usize,
    /// The device's channels (`Server::channels`) and the part of a
    /// dispatch they share: fixed nanoseconds and picoseconds per byte
    /// (`ProfileFigures::shared_ns`, else 0 and the device's transfer
    /// cost).
    pub channels: Channels,
    pub wake_at: Option<Time>,
    pub backlog: VecDeque<Request>,
    pub backlog_max: usize,
    pub dirty: u64,
    pub cache: Cache,
    pub cache_bytes: u64,
    pub blocks: Blocks,
    pub stats: DevStats,
    /// Server-directed rounds being gathered, per application.
    pub held: HashMap<u32, Held>,
    /// When the server's CPU is next free (`cpu_ns_per_request`).
    pub cpu_free_at: Time,
}

/// The device model a scenario names.
pub fn device(sc: &Scenario) -> Box<dyn DeviceModel> {
    let s = &sc.server;
    match (s.device.as_str(), &s.hdd, &s.profile) {
        ("hdd", Some(h), _) => {
            let mut d = Hdd::hdd7200();
            (d.seek_far_ns, d.seek_near_ns, d.near_bytes, d.rotation_ns, d.bytes_per_s) = (h.seek_far_ns, h.seek_near_ns, h.near_bytes, h.rotation_ns, h.bytes_per_s);
            Box::new(d)
        }
        ("profile", _, Some(p)) => Box::new(Ssd::calibrated(p.access_ns, p.bytes_per_s, p.seek_ns)),
        ("ssd", _, _) => Box::new(Ssd::sata()),
        _ => Box::new(Hdd::hdd7200()),
    }
}

impl ServerState {
    pub fn new(sc: &Scenario, mode: &Mode) -> Result<ServerState, Error> {
        let policy = match PolicyConfig::from_name(&mode.policy) {
            Some(PolicyConfig::Aioli(_)) => PolicyConfig::Aioli(sc.aioli.params_for(&sc.server.device)),
            Some(PolicyConfig::Auto(_)) => PolicyConfig::Auto(sc.aioli.params_for(&sc.server.device)),
            Some(p) => p,
            None => return Err(Error::new(ErrorKind::UnknownMode, mode.policy.clone())),
        };
        let depth = sc.server.depth();
        let limits = Limits { dispatches_inflight_max: depth, ..Limits::default() };
        let block = if sc.server.cache_block_bytes == 0 { sc.server.stripe_bytes } else { sc.server.cache_block_bytes };
        let dev = device(sc);
        let mut sched = Scheduler::new(policy, limits);
        // The simulator knows its device: the same numbers the daemon
        // learns reach the policies here exactly (its channels as the
        // parallelism). A scenario may hand it another (a real server's
        // learned model).
        let c = dev.cost_parts();
        let m = sc.server.scheduler_model.unwrap_or(SchedulerModel { dispatch_ns: c.access_ns, byte_ps: c.byte_ps, seek_ns: c.seek_ns, parallelism: None });
        sched.set_device_cost(Some(DeviceCost::new(m.dispatch_ns, m.byte_ps, m.seek_ns, m.parallelism.unwrap_or(sc.server.channels))));
        // The same service classes as a daemon given them (`--qos`).
        if !sc.classes.is_empty() {
            let specs: Vec<_> = sc.classes.iter().map(crate::scenario::SimClass::spec).collect();
            sched.set_qos(&specs, 0).map_err(|e| Error::new(ErrorKind::Invalid, e.to_string()))?;
            for (i, a) in sc.apps.iter().enumerate() {
                sched.set_app_class(AppId(i as u32 + 1), a.class.as_deref());
            }
        }
        // And the same sharing order.
        let order = sluice_core::ShareLevel::parse_order(&sc.share).map_err(|e| Error::new(ErrorKind::Invalid, e))?;
        if !order.is_empty() {
            for (i, a) in sc.apps.iter().enumerate() {
                let class = a.class.as_deref().unwrap_or(sluice_core::QOS_DEFAULT_CLASS);
                let keys = sluice_core::share::share_keys(&order, &a.name, a.job.as_deref(), a.user, a.user, class);
                sched.set_app_share(AppId(i as u32 + 1), &keys).map_err(|e| Error::new(ErrorKind::Invalid, format!("{e:?}")))?;
            }
        }
        let profile = sc.server.profile.as_ref().filter(|_| sc.server.device == "profile");
        let shared = match profile.filter(|p| p.shared_ns > 0 || p.shared_bytes_per_s > 0) {
            Some(p) => (p.shared_ns, p.shared_ps()),
            None => (0, c.byte_ps),
        };
        Ok(ServerState {
            sched,
            dev,
            inflight: VecDeque::with_capacity(depth as usize),
            depth: depth as usize,
            channels: Channels::new(sc.server.channels as usize, shared.0, shared.1),
            wake_at: None,
            backlog: VecDeque::new(),
            backlog_max: sc.server.backlog_max as usize,
            dirty: 0,
            cache: mode.cache,
            cache_bytes: sc.server.cache_bytes,
            blocks: Blocks { block, max: (sc.server.cache_bytes / block) as usize, ..Blocks::default() },
            stats: DevStats::default(),
            held: HashMap::new(),
            cpu_free_at: 0,
        })
    }

    /// Hand dispatch `d` to the device at `now`; when the device is done
    /// with it. The earliest free channel serves the part of the model's
    /// service time the channels overlap, then the shared part (the
    /// transfer, or `shared`) waits for the dispatches ahead of it. With
    /// one channel, kept busy one dispatch at a time, that is `now` plus
    /// the model's service time.
    pub fn serve(&mut self, d: &Dispatch, now: Time) -> Time {
        let a = Access { file: d.file.0, offset: d.offset, len: d.len };
        match self.dev.seek_kind(a) {
            SeekKind::None => self.stats.seeks_none += 1,
            SeekKind::Near => self.stats.seeks_near += 1,
            SeekKind::Far => self.stats.seeks_far += 1,
        }
        let ns = self.dev.service_ns(a).max(1);
        self.stats.busy_ns += ns;
        self.stats.bytes += d.len;
        self.channels.serve(now, ns, d.len)
    }

    pub fn wake_fired(&mut self, now: Time) {
        if self.wake_at == Some(now) {
            self.wake_at = None;
        }
    }

    /// Fail unless everything was served and the scheduler's own
    /// invariants hold.
    pub fn check_drained(&self) -> Result<(), Error> {
        self.sched.check_invariants();
        if !self.sched.is_empty() || !self.backlog.is_empty() || !self.inflight.is_empty() || self.dirty != 0 || !self.blocks.filling.is_empty() || !self.held.is_empty() {
            return Err(Error::new(ErrorKind::Stuck, format!("server not drained: {:?}", self.sched.stats())));
        }
        Ok(())
    }

    /// Admit `req`, or park it in the backlog when the scheduler is full.
    pub fn submit(&mut self, req: Request, now: Time) -> Result<(), Error> {
        if !self.backlog.is_empty() {
            return self.park(req);
        }
        match self.sched.enqueue(req, now) {
            Ok(()) => Ok(()),
            Err(e) if matches!(e.kind, CoreKind::QueueFull | CoreKind::QueueBytesFull) => self.park(req),
            Err(e) => Err(Error::new(ErrorKind::Scheduler, e.to_string())),
        }
    }

    fn park(&mut self, req: Request) -> Result<(), Error> {
        if self.backlog.len() >= self.backlog_max {
            return Err(Error::new(ErrorKind::Bound, format!("server backlog over backlog_max = {}", self.backlog_max)));
        }
        self.backlog.push_back(req);
        self.stats.backlog_peak = self.stats.backlog_peak.max(self.backlog.len() as u64);
        Ok(())
    }

    /// Move backlogged requests into the scheduler while it accepts them.
    pub fn drain_backlog(&mut self, now: Time) -> Result<(), Error> {
        while let Some(&req) = self.backlog.front() {
            match self.sched.enqueue(req, now) {
                Ok(()) => {
                    self.backlog.pop_front();
                }
                Err(e) if matches!(e.kind, CoreKind::QueueFull | CoreKind::QueueBytesFull) => return Ok(()),
                Err(e) => return Err(Error::new(ErrorKind::Scheduler, e.to_string())),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Blocks;

    #[test]
    fn the_aggregation_cache_keeps_max_blocks_and_evicts_the_oldest_past_it() {
        let mut b = Blocks { block: 4096, max: 3, ..Blocks::default() };
        for blk in 0..3 {
            b.keep((7, blk));
        }
        // N: all three present.
        assert_eq!((b.present.len(), b.order.len()), (3, 3));
        assert!((0..3).all(|blk| b.present.contains(&(7, blk))));
        // N + 1: the oldest goes, the newest is kept.
        b.keep((7, 3));
        assert_eq!((b.present.len(), b.order.len()), (3, 3));
        assert!(!b.present.contains(&(7, 0)) && b.present.contains(&(7, 3)));
        // No cache: nothing kept.
        let mut none = Blocks { block: 4096, max: 0, ..Blocks::default() };
        none.keep((7, 0));
        assert!(none.present.is_empty() && none.order.is_empty());
    }
}
