//! The I/O servers (seed `004_…`, "Server: Cache Layer, I/O Subsystem"):
//! each owns one [`sluice_core::Scheduler`] — the policy code the daemon
//! runs — a cache layer and a device model from `sluice-device`.
//!
//! The device serves one dispatch at a time (one disk arm). When it is
//! free the server asks its scheduler `next(now)`: a dispatch is served
//! for `service_ns` of the device model; `WaitUntil(t)` schedules a wake-up
//! at `t` (and any arrival or completion polls again earlier); `Idle`
//! waits for an arrival or completion.
//!
//! Cache layers: `none` passes every piece to the scheduler and replies
//! when the device is done; `write-behind` acknowledges writes on arrival
//! while the dirty bytes fit in `cache_bytes`; `aggregation` is
//! write-behind plus a block cache: a read fetches the whole
//! `cache_block_bytes` blocks it touches, once, and every piece of a block
//! is answered from it (PIOsimHD's AggregationCache). Requests the
//! scheduler refuses because its queue is full wait in a bounded backlog
//! (the nfsd threads' socket backlog).

use std::collections::{HashMap, HashSet, VecDeque};

use sluice_core::{Decision, DeviceCost, Dispatch, ErrorKind as CoreKind, FileId, Limits, Op, PolicyConfig, Request, RequestId, Scheduler};
use sluice_device::{Access, DeviceModel, Hdd, SeekKind, Ssd};

use crate::engine::Time;
use crate::error::{Error, ErrorKind};
use crate::scenario::{Cache, Mode, Scenario};
use crate::sim::{Ev, MsgKind, Piece, World};

/// Device counters of one server.
#[derive(Clone, Copy, Debug, Default)]
pub struct DevStats {
    pub seeks_none: u64,
    pub seeks_near: u64,
    pub seeks_far: u64,
    pub busy_ns: u64,
    pub bytes: u64,
    pub cache_hits: u64,
}

/// The aggregation cache's blocks: present (FIFO-evicted) and being read.
#[derive(Default)]
struct Blocks {
    block: u64,
    max: usize,
    present: HashSet<(u64, u64)>,
    order: VecDeque<(u64, u64)>,
    filling: HashMap<(u64, u64), Vec<u32>>,
}

pub(crate) struct ServerState {
    pub sched: Scheduler,
    dev: Box<dyn DeviceModel>,
    busy: Option<(Dispatch, Time)>,
    wake_at: Option<Time>,
    backlog: VecDeque<Request>,
    backlog_max: usize,
    dirty: u64,
    cache: Cache,
    cache_bytes: u64,
    blocks: Blocks,
    pub stats: DevStats,
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
            Some(p) => p,
            None => return Err(Error::new(ErrorKind::UnknownMode, mode.policy.clone())),
        };
        let limits = Limits { dispatches_inflight_max: 1, ..Limits::default() };
        let block = if sc.server.cache_block_bytes == 0 { sc.server.stripe_bytes } else { sc.server.cache_block_bytes };
        let dev = device(sc);
        let mut sched = Scheduler::new(policy, limits);
        // The simulator knows its device: the same numbers the daemon
        // learns reach the policies here exactly (one dispatch at a time).
        let c = dev.cost_parts();
        sched.set_device_cost(Some(DeviceCost::new(c.access_ns, c.byte_ps, c.seek_ns, 1)));
        Ok(ServerState {
            sched,
            dev,
            busy: None,
            wake_at: None,
            backlog: VecDeque::new(),
            backlog_max: sc.server.backlog_max as usize,
            dirty: 0,
            cache: mode.cache,
            cache_bytes: sc.server.cache_bytes,
            blocks: Blocks { block, max: (sc.server.cache_bytes / block) as usize, ..Blocks::default() },
            stats: DevStats::default(),
        })
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
        if !self.sched.is_empty() || !self.backlog.is_empty() || self.busy.is_some() || self.dirty != 0 || !self.blocks.filling.is_empty() {
            return Err(Error::new(ErrorKind::Stuck, format!("server not drained: {:?}", self.sched.stats())));
        }
        Ok(())
    }

    /// Admit `req`, or park it in the backlog when the scheduler is full.
    fn submit(&mut self, req: Request, now: Time) -> Result<(), Error> {
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
        Ok(())
    }

    /// Move backlogged requests into the scheduler while it accepts them.
    fn drain_backlog(&mut self, now: Time) -> Result<(), Error> {
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

impl World {
    /// A piece's request reached its server: through the cache layer.
    pub(crate) fn server_arrive(&mut self, id: u32, now: Time) -> Result<(), Error> {
        let piece = *self.pieces.get(id);
        let s = piece.server;
        let srv = &mut self.servers[s as usize];
        if piece.write && srv.cache != Cache::None && srv.dirty + piece.len <= srv.cache_bytes {
            // The process gets its answer now; a copy marked acked goes to
            // the device and is freed when written.
            srv.dirty += piece.len;
            let copy = self.pieces.insert(Piece { acked: true, ..piece })?;
            self.reply(id, now)?;
            return self.submit(copy, now);
        } else if !piece.write && srv.cache == Cache::Aggregation {
            return self.aggregated_read(id, now);
        }
        self.submit(id, now)
    }

    fn submit(&mut self, id: u32, now: Time) -> Result<(), Error> {
        let p = *self.pieces.get(id);
        let (app, client) = self.ids(&p);
        let op = if p.write { Op::Write } else { Op::Read };
        let req = Request { id: RequestId(u64::from(id)), app, client, file: FileId(p.file), op, offset: p.offset, len: p.len };
        self.servers[p.server as usize].submit(req, now)?;
        self.poll(p.server, now)
    }

    /// Ask server `s`'s scheduler what to do, if its device is free.
    pub(crate) fn poll(&mut self, s: u32, now: Time) -> Result<(), Error> {
        let srv = &mut self.servers[s as usize];
        if srv.busy.is_some() {
            return Ok(());
        }
        match srv.sched.next(now) {
            Decision::Dispatch(d) => {
                let a = Access { file: d.file.0, offset: d.offset, len: d.len };
                match srv.dev.seek_kind(a) {
                    SeekKind::None => srv.stats.seeks_none += 1,
                    SeekKind::Near => srv.stats.seeks_near += 1,
                    SeekKind::Far => srv.stats.seeks_far += 1,
                }
                let ns = srv.dev.service_ns(a).max(1);
                srv.stats.busy_ns += ns;
                srv.stats.bytes += d.len;
                srv.busy = Some((d, now));
                self.q.push(now + ns, Ev::DevDone(s))
            }
            Decision::WaitUntil(t) if srv.wake_at.is_none_or(|w| w > t) => {
                srv.wake_at = Some(t);
                self.q.push(t, Ev::Wake(s))
            }
            Decision::WaitUntil(_) | Decision::Idle => Ok(()),
        }
    }

    pub(crate) fn device_done(&mut self, s: u32, now: Time) -> Result<(), Error> {
        let srv = &mut self.servers[s as usize];
        let (d, start) = srv.busy.take().expect("a completion has a dispatch");
        srv.sched.complete(d.id, now).map_err(|e| Error::new(ErrorKind::Scheduler, e.to_string()))?;
        srv.drain_backlog(now)?;
        if let Some(t) = self.trace.as_mut() {
            t.device_span(s, start, now, &d);
        }
        for m in &d.members {
            self.piece_done(m.id.0 as u32, now)?;
        }
        self.poll(s, now)
    }

    fn piece_done(&mut self, id: u32, now: Time) -> Result<(), Error> {
        let p = *self.pieces.get(id);
        if p.fill {
            self.pieces.remove(id);
            return self.block_filled(p, now);
        }
        if p.acked {
            self.servers[p.server as usize].dirty -= p.len;
            self.pieces.remove(id);
            return Ok(());
        }
        self.reply(id, now)
    }

    /// Send piece `id`'s answer to its process.
    fn reply(&mut self, id: u32, now: Time) -> Result<(), Error> {
        let p = *self.pieces.get(id);
        let bytes = self.net.wire_bytes(if p.write { 0 } else { p.len });
        let dst = self.procs[p.proc as usize].node;
        self.send(MsgKind::Reply, id, self.server_node(p.server), dst, bytes, now)
    }

    /// Aggregation cache: answer from present blocks, wait on blocks being
    /// read, and read the missing ones whole.
    fn aggregated_read(&mut self, id: u32, now: Time) -> Result<(), Error> {
        let p = *self.pieces.get(id);
        let b = self.servers[p.server as usize].blocks.block;
        let mut missing = 0;
        for blk in p.offset / b..=(p.offset + p.len - 1) / b {
            let blocks = &mut self.servers[p.server as usize].blocks;
            let key = (p.file, blk);
            if blocks.present.contains(&key) {
                continue;
            }
            missing += 1;
            if let Some(w) = blocks.filling.get_mut(&key) {
                w.push(id);
                continue;
            }
            blocks.filling.insert(key, vec![id]);
            let fill = Piece { fill: true, offset: blk * b, len: b, acked: false, missing: 0, ..p };
            let f = self.pieces.insert(fill)?;
            self.submit(f, now)?;
        }
        self.pieces.get_mut(id).missing = missing;
        let srv = &mut self.servers[p.server as usize];
        if missing == 0 {
            srv.stats.cache_hits += 1;
            return self.reply(id, now);
        }
        Ok(())
    }

    fn block_filled(&mut self, fill: Piece, now: Time) -> Result<(), Error> {
        let blocks = &mut self.servers[fill.server as usize].blocks;
        let key = (fill.file, fill.offset / blocks.block);
        let waiters = blocks.filling.remove(&key).expect("a fill has waiters");
        if blocks.max > 0 {
            if blocks.order.len() >= blocks.max {
                let old = blocks.order.pop_front().expect("a full cache has blocks");
                blocks.present.remove(&old);
            }
            blocks.present.insert(key);
            blocks.order.push_back(key);
        }
        for w in waiters {
            let piece = self.pieces.get_mut(w);
            piece.missing -= 1;
            if piece.missing == 0 {
                self.reply(w, now)?;
            }
        }
        Ok(())
    }
}
