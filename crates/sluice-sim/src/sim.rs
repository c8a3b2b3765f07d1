//! One run: the event loop over the world of `state.rs`.
//!
//! Components never call each other across time: a component that needs
//! another one later schedules an event. Each event is handled by one
//! short method in `client.rs` (processes, MPI-IO) or `server.rs` (cache
//! layer, scheduler, device), or here (a message crossing a hop of the
//! network, or delivered); this file owns the loop, the bounds, the end
//! of run check and the report.

use std::time::Instant;

use crate::engine::Time;
use crate::error::{Error, ErrorKind};
use crate::net::{HOPS, SWITCH};
use crate::report::{AppReport, RunReport};
use crate::scenario::{Mode, Scenario};
use crate::state::{Ev, MsgKind, World};
use crate::trace::Trace;

impl World {
    /// Run until no event is left; fail on a bound or on unfinished work.
    pub fn run(&mut self) -> Result<(), Error> {
        let (events_max, sim_max) = (self.sc.bounds.events_max, self.sc.bounds.sim_ns_max);
        while let Some((now, ev)) = self.q.pop() {
            if self.q.popped() > events_max || now > sim_max {
                return Err(Error::new(ErrorKind::Bound, format!("events_max {events_max} or sim_ns_max {sim_max} reached at t = {now} ns")));
            }
            if self.prefetch {
                self.prefetch_ahead();
            }
            self.handle(now, ev)?;
        }
        self.check_finished()
    }

    /// Start loading what the events after this one will touch. At
    /// 10^5-10^6 processes every event reaches records that are far apart
    /// in memory (its message, piece, process, server, the server's
    /// scheduler tables), each a cache miss; those misses overlap instead
    /// of coming one after another. A chain of records is loaded in
    /// stages, each reading only what an earlier stage loaded: `FAR`
    /// events ahead the event's own record; `MID` ahead (it has arrived)
    /// the records it names (a message's piece, and for a request the
    /// server, named by the message's destination); `STEP` ahead the
    /// server's policy record (for a request, or a device that finishes);
    /// `NEAR` ahead the next (the piece's process for a reply; for a
    /// request the scheduler's records of its application, stream, file
    /// and neighbouring pieces, `Scheduler::prefetch_arrival`; for a
    /// device that finishes, what the next pick reads first,
    /// `Scheduler::prefetch_next`).
    /// Only for worlds of `LARGE_WORLD_PROCS` processes or more: in
    /// smaller ones the records stay in the caches and the look-ahead is
    /// pure cost (`sluice sim --bench`: 10,000 processes about 5-8% slower
    /// with it, 100,000 about 11% faster, 1,000,000 15-45% faster). Kept
    /// out of line: inlined into the loop, it slowed the loop by about 4%
    /// even where it is off.
    #[inline(never)]
    fn prefetch_ahead(&self) {
        fn prefetch_some<T>(r: Option<&T>) {
            if let Some(r) = r {
                crate::engine::prefetch(r);
            }
        }
        const NEAR: usize = 2;
        const STEP: usize = 3;
        const MID: usize = 5;
        const FAR: usize = 9;
        if let Some(ev) = self.q.peek_ahead(FAR) {
            match *ev {
                Ev::Hop(m) | Ev::Deliver(m) => prefetch_some(self.msgs.peek(m)),
                Ev::Start(p) | Ev::Ready(p) => prefetch_some(self.procs.get(p as usize)),
                Ev::DevDone(s) | Ev::Wake(s) => prefetch_some(self.servers.get(s as usize)),
                Ev::Admit(id) => prefetch_some(self.pieces.peek(id)),
                Ev::Round(_) => {}
            }
        }
        if let Some(&Ev::Hop(m) | &Ev::Deliver(m)) = self.q.peek_ahead(MID) {
            if let Some(msg) = self.msgs.peek(m) {
                if msg.hop == HOPS {
                    prefetch_some(self.pieces.peek(msg.id));
                    if msg.kind == MsgKind::ToServer {
                        prefetch_some(self.server_at(msg.dst));
                    }
                } else {
                    // A hop event crosses the switch and the receiver's NIC.
                    self.net.prefetch(SWITCH + 1, msg.src as usize, msg.dst as usize);
                }
            }
        }
        match self.q.peek_ahead(STEP) {
            Some(&Ev::Deliver(m)) => {
                if let Some(msg) = self.msgs.peek(m).filter(|msg| msg.kind == MsgKind::ToServer) {
                    if let Some(srv) = self.server_at(msg.dst) {
                        srv.sched.prefetch_policy();
                    }
                }
            }
            Some(&Ev::DevDone(s)) => {
                if let Some(srv) = self.servers.get(s as usize) {
                    srv.sched.prefetch_policy();
                }
            }
            _ => {}
        }
        match self.q.peek_ahead(NEAR) {
            Some(&Ev::DevDone(s)) => {
                if let Some(srv) = self.servers.get(s as usize) {
                    srv.sched.prefetch_next();
                }
            }
            Some(&Ev::Deliver(m)) => self.prefetch_delivery(m),
            _ => {}
        }
    }

    /// A message will be delivered in a few events: its piece's server
    /// (a request) or process (a reply).
    #[inline]
    fn prefetch_delivery(&self, m: u32) {
        let Some(msg) = self.msgs.peek(m) else { return };
        let Some(piece) = self.pieces.peek(msg.id) else { return };
        match msg.kind {
            MsgKind::ToServer => {
                if let Some(srv) = self.servers.get(piece.server as usize) {
                    srv.sched.prefetch_arrival(&self.request(msg.id, piece));
                }
            }
            MsgKind::Reply => {
                if let Some(p) = self.procs.get(piece.proc as usize) {
                    crate::engine::prefetch(p);
                }
            }
            _ => {}
        }
    }

    /// The scheduler running on node `node`, if one does.
    fn server_at(&self, node: u32) -> Option<&crate::state::ServerState> {
        node.checked_sub(self.compute_nodes).and_then(|s| self.servers.get(s as usize))
    }

    fn handle(&mut self, now: Time, ev: Ev) -> Result<(), Error> {
        match ev {
            Ev::Start(p) => self.proc_start(p, now),
            Ev::Ready(p) => self.proc_ready(p, now),
            Ev::Round(a) => self.round_begin(a, now),
            Ev::Hop(m) => self.hop(m, now),
            Ev::Deliver(m) => self.deliver(m, now),
            Ev::DevDone(s) => self.device_done(s, now),
            Ev::Admit(id) => self.server_arrive(id, now),
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
        if self.pieces.live() != 0 || self.msgs.live() != 0 || self.bundles.live() != 0 {
            return Err(Error::new(ErrorKind::Stuck, format!("{} pieces, {} messages, {} list messages left", self.pieces.live(), self.msgs.live(), self.bundles.live())));
        }
        Ok(())
    }

    /// A message's head reached the switch: it crosses the switch, then
    /// the receiver's NIC, and is delivered when its tail is through.
    ///
    /// The receiver's NIC is crossed now, not at an event of its own when
    /// the head reaches it: every message reaches a receiving NIC through
    /// the switch, and the switch lets heads out in the order it takes
    /// them in (a message starts on it after the one before ended, so its
    /// head leaves no earlier than that one's), so each receiving NIC sees
    /// its messages in this order either way, with the same times. Only
    /// the `Deliver` is pushed earlier, which orders it differently among
    /// events of the same nanosecond pushed in between; both orders are
    /// deterministic.
    fn hop(&mut self, m: u32, now: Time) -> Result<(), Error> {
        let msg = *self.msgs.get(m);
        let (src, dst) = (msg.src as usize, msg.dst as usize);
        let sw = self.net.cross(now, msg.tail_at, SWITCH, src, dst, msg.bytes);
        let c = self.net.cross(sw.head_at, sw.tail_at, SWITCH + 1, src, dst, msg.bytes);
        let rec = self.msgs.get_mut(m);
        rec.hop = HOPS;
        rec.tail_at = c.tail_at;
        self.q.push(c.tail_at, Ev::Deliver(m))
    }

    fn deliver(&mut self, m: u32, now: Time) -> Result<(), Error> {
        let msg = self.msgs.remove(m);
        match msg.kind {
            MsgKind::ToServer => self.server_cpu(msg.id, now),
            MsgKind::Reply => self.reply_arrive(msg.id, now),
            MsgKind::ToProc => self.exchange_to_proc(msg.id, now),
            MsgKind::ToAgg => self.exchange_to_agg(msg.id, now),
            MsgKind::ToServerList => self.list_arrive(msg.id, now),
            MsgKind::ListReply => self.list_reply_arrive(msg.id, now),
        }
    }

    /// The per-run report.
    pub fn report(&self, wall_s: f64, granularity: Option<u64>) -> RunReport {
        let apps: Vec<AppReport> = self
            .apps
            .iter()
            .map(|a| {
                let t = (a.done_at.unwrap_or(0).saturating_sub(a.start_ns)) as f64 / 1e9;
                let mut r = AppReport::new(&a.name, a.procs, a.layout.bytes, t);
                r.aggregators = (a.interface == crate::scenario::Interface::Mpiio).then_some(a.two_phase.aggregators);
                r
            })
            .collect();
        let mut devices = crate::report::DeviceReport::default();
        for s in &self.servers {
            devices.add(&s.stats, &s.sched.stats());
        }
        for b in self.backend.iter().flatten() {
            devices.add(&b.stats, &sluice_core::Stats::default());
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

#[cfg(test)]
mod tests {
    use crate::scenario::Mode;
    use crate::state::World;

    /// The look-ahead is a hint to the processor: a world run with it gives
    /// the report it gives without, event for event.
    #[test]
    fn prefetching_changes_no_result() {
        let sc = crate::bench_scenario(2_000, 5);
        for policy in ["fifo", "aioli"] {
            let mode = Mode::parse(policy).unwrap();
            let report = |prefetch: bool| {
                let mut w = World::new(&sc, &mode, None).unwrap();
                w.set_prefetch(prefetch);
                w.run().unwrap();
                let mut r = w.report(0.0, None);
                (r.wall_s, r.events_per_s) = (0.0, 0.0);
                r
            };
            let (off, on) = (report(false), report(true));
            assert!(off.events > 10_000 && off.device_stats.requests >= 10_000, "{policy}: {off:?}");
            assert_eq!(off, on, "{policy}");
        }
    }
}
