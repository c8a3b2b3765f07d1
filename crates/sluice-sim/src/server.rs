//! The I/O servers (seed `004_…`, "Server: Cache Layer, I/O Subsystem"):
//! each owns one [`sluice_core::Scheduler`] — the policy code the daemon
//! runs — a cache layer and a device model from `sluice-device`.
//!
//! The device serves one dispatch at a time (one disk arm), or with
//! `channels` several: each dispatch pays its fixed and seek cost on a
//! channel of its own while the transfers share the bandwidth, one at a
//! time (`ServerState::serve`). While fewer than `dispatches_inflight` are
//! in flight the server asks its scheduler `next(now)`: a dispatch goes to
//! the device; `WaitUntil(t)` schedules a wake-up at `t` (and any arrival
//! or completion polls again earlier); `Idle` waits for an arrival or
//! completion.
//!
//! Cache layers: `none` passes every piece to the scheduler and replies
//! when the device is done; `write-behind` acknowledges writes on arrival
//! while the dirty bytes fit in `cache_bytes`; `aggregation` is
//! write-behind plus a block cache: a read fetches the whole
//! `cache_block_bytes` blocks it touches, once, and every piece of a block
//! is answered from it (PIOsimHD's AggregationCache). Requests the
//! scheduler refuses because its queue is full wait in a bounded backlog
//! (the nfsd threads' socket backlog).

use sluice_core::Decision;

use crate::engine::Time;
use crate::error::{Error, ErrorKind};
use crate::scenario::Cache;
use crate::state::{Ev, MsgKind, Piece, World};

impl World {
    /// A piece's request reached its server: it waits for the server's
    /// CPU when requests cost some (`cpu_ns_per_request`), one at a time
    /// (and for a core of the shared host, with `host_cores`).
    pub(crate) fn server_cpu(&mut self, id: u32, now: Time) -> Result<(), Error> {
        let cpu = self.sc.server.cpu_ns_per_request;
        if cpu == 0 {
            return self.server_arrive(id, now);
        }
        let s = self.pieces.get(id).server as usize;
        let start = self.servers[s].cpu_free_at.max(now);
        let at = self.cpu(start, cpu);
        self.servers[s].cpu_free_at = at;
        self.q.push(at, Ev::Admit(id))
    }

    /// A piece's request reached its server's cache layer.
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

    /// Server-directed: a process's list message arrived; once every
    /// expected one of its round is here, the round's pieces go to the
    /// scheduler together, in offset order.
    pub(crate) fn list_arrive(&mut self, b: u32, now: Time) -> Result<(), Error> {
        let s = self.bundles.get(b).server;
        let app = self.pieces.get(self.bundle_pieces[b as usize][0]).app;
        let held = self.servers[s as usize].held.get_mut(&app).expect("a round announced at its start");
        held.bundles.push(b);
        if held.bundles.len() < held.expect as usize {
            return Ok(());
        }
        let held = self.servers[s as usize].held.remove(&app).expect("present");
        let mut ids: Vec<u32> = held.bundles.iter().flat_map(|&b| self.bundle_pieces[b as usize].iter().copied()).collect();
        ids.sort_by_key(|&id| (self.pieces.get(id).offset, id));
        for id in ids {
            self.enqueue(id, now)?;
        }
        self.poll(s, now)
    }

    fn submit(&mut self, id: u32, now: Time) -> Result<(), Error> {
        let s = self.enqueue(id, now)?;
        self.poll(s, now)
    }

    /// Hand piece `id` to its server's scheduler (or backlog); its server.
    fn enqueue(&mut self, id: u32, now: Time) -> Result<u32, Error> {
        let p = *self.pieces.get(id);
        let req = self.request(id, &p);
        self.servers[p.server as usize].submit(req, now)?;
        Ok(p.server)
    }

    /// Ask server `s`'s scheduler what to do while it has room for
    /// another dispatch in flight.
    pub(crate) fn poll(&mut self, s: u32, now: Time) -> Result<(), Error> {
        loop {
            let srv = &mut self.servers[s as usize];
            if srv.inflight.len() >= srv.depth {
                return Ok(());
            }
            match srv.sched.next(now) {
                Decision::Dispatch(d) => {
                    // Behind forwarders, the server holding the file serves it.
                    let done = match self.backend.as_mut() {
                        Some(b) => {
                            let k = (d.file.0 % b.len() as u64) as usize;
                            b[k].serve(&d, now)
                        }
                        None => srv.serve(&d, now),
                    };
                    srv.inflight.push_back((d, now, done));
                    self.q.push(done, Ev::DevDone(s))?;
                }
                Decision::WaitUntil(t) if srv.wake_at.is_none_or(|w| w > t) => {
                    srv.wake_at = Some(t);
                    return self.q.push(t, Ev::Wake(s));
                }
                Decision::WaitUntil(_) | Decision::Idle => return Ok(()),
            }
        }
    }

    pub(crate) fn device_done(&mut self, s: u32, now: Time) -> Result<(), Error> {
        let srv = &mut self.servers[s as usize];
        // On its own device, dispatches finish in the order they left
        // (each one's shared part starts after the one before it ended),
        // one per event; behind forwarders, on several devices, in the
        // order of their devices' answers.
        let at = srv.inflight.iter().position(|x| x.2 == now).expect("a completion has a dispatch");
        let (d, start, done) = srv.inflight.remove(at).expect("present");
        debug_assert!(at == 0 || self.backend.is_some(), "a server's own device finishes dispatches in the order they left");
        debug_assert_eq!(done, now);
        let overlapping = srv.channels.count() > 1;
        // Start loading the members' pieces before the scheduler's
        // bookkeeping, so that their misses overlap its own (at 10^6
        // processes each piece is a cache miss): `sluice sim --bench
        // --bench-procs 1000000 --bench-requests 10`, three runs each
        // alternating, aioli 47.3-53.5 s (median 48.8) against 52.4-55.4
        // (53.1). Also loading the members' processes once the pieces are
        // in gained nothing more (49.4-51.0 s).
        if self.prefetch {
            for m in &d.members {
                if let Some(p) = self.pieces.peek(m.id.0 as u32) {
                    crate::engine::prefetch(p);
                }
            }
        }
        let srv = &mut self.servers[s as usize];
        srv.sched.complete(d.id, now).map_err(|e| Error::new(ErrorKind::Scheduler, e.to_string()))?;
        srv.drain_backlog(now)?;
        if let Some(t) = self.trace.as_mut() {
            t.device_span(s, start, now, &d, overlapping);
        }
        for m in &d.members {
            self.piece_done(m.id.0 as u32, now)?;
        }
        self.servers[s as usize].sched.recycle(d);
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
        if let Some(b) = p.bundle {
            let bd = self.bundles.get_mut(b);
            bd.left -= 1;
            if bd.left > 0 {
                return Ok(());
            }
            let bd = *bd;
            let bytes = self.net.wire_bytes(if bd.write { 0 } else { bd.bytes });
            let dst = self.procs[bd.proc as usize].node;
            return self.send(MsgKind::ListReply, b, self.server_node(bd.server), dst, bytes, now);
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
        blocks.keep(key);
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
