//! The software model (seed `004_…`, "Software Modell"): applications of
//! processes on compute nodes.
//!
//! - A **POSIX** process is synchronous: it issues one application request,
//!   waits for all of it, thinks for `think_ns`, issues the next. The file
//!   system splits the request into pieces of at most `fs_piece_bytes`
//!   (and at stripe boundaries) and sends up to `pieces_inflight_max` of
//!   them in parallel: the seed's read(4MB) split by the file system.
//! - An **MPI-IO** application runs ROMIO's two-phase collective: per
//!   round, each of its aggregators accesses one contiguous collective
//!   buffer, and the data is exchanged with every process over the
//!   network (after the read, before the write). A round ends when every
//!   process has its data (reads) or every aggregator wrote (writes); the
//!   next starts after the think time.

use sluice_core::Op;

use crate::engine::Time;
use crate::error::Error;
use crate::scenario::Interface;
use crate::state::{Ev, MsgKind, Piece, World};
use crate::workload::{stripe_map, TwoPhase};

impl World {
    pub(crate) fn proc_start(&mut self, p: u32, now: Time) -> Result<(), Error> {
        let a = self.procs[p as usize].app as usize;
        self.apps[a].started += 1;
        match self.apps[a].interface {
            Interface::Posix if self.think_before(p) > 0 => self.q.push(now + self.think_before(p), Ev::Ready(p)),
            Interface::Posix => self.proc_ready(p, now),
            Interface::Mpiio | Interface::ServerDirected if self.apps[a].started == self.apps[a].procs => self.round_begin(a as u32, now),
            Interface::Mpiio | Interface::ServerDirected => Ok(()),
        }
    }

    /// The think time before process `p`'s next request: its recorded
    /// one, else its application's (none before the first).
    fn think_before(&self, p: u32) -> u64 {
        let pr = &self.procs[p as usize];
        let app = &self.apps[pr.app as usize];
        match &app.recorded {
            Some(r) => r.ranks.get(pr.rank as usize).and_then(|v| v.get(pr.next as usize)).map_or(0, |a| a.think_ns),
            None if pr.next == 0 => 0,
            None => app.think_ns,
        }
    }

    /// A POSIX process issues its next request, or finishes.
    pub(crate) fn proc_ready(&mut self, p: u32, now: Time) -> Result<(), Error> {
        let pr = self.procs[p as usize];
        let app = &mut self.apps[pr.app as usize];
        let next = match &app.recorded {
            Some(r) => r.ranks.get(pr.rank as usize).and_then(|v| v.get(pr.next as usize)).map(|a| (a.offset, a.len, a.write, (app.file << 20) | u64::from(a.file), (0, 0))),
            None => (pr.next < app.layout.requests(pr.rank)).then(|| {
                let (first, count) = app.layout.call(pr.rank, pr.next);
                let (off, len) = app.layout.request(pr.rank, first);
                (off, len, app.write, app.file, (first + 1, first + count))
            }),
        };
        let Some((off, len, write, file, blocks)) = next else {
            app.finished += 1;
            if app.finished == app.procs {
                app.done_at = Some(now);
            }
            return Ok(());
        };
        let layout = app.layout;
        let pr = &mut self.procs[p as usize];
        (pr.write, pr.file) = (write, file);
        let more: u64 = (blocks.0..blocks.1).map(|b| layout.request(pr.rank, b).1).sum();
        self.begin_call(p, off, len, blocks, len + more, now)
    }

    /// Start a request of one contiguous range.
    fn begin_request(&mut self, p: u32, off: u64, len: u64, now: Time) -> Result<(), Error> {
        self.begin_call(p, off, len, (0, 0), len, now)
    }

    /// Start a call: the range `[off, off + len)`, then (a list call) the
    /// rank's blocks `blocks.0..blocks.1`, `bytes` in all.
    fn begin_call(&mut self, p: u32, off: u64, len: u64, blocks: (u64, u64), bytes: u64, now: Time) -> Result<(), Error> {
        let pr = &mut self.procs[p as usize];
        pr.next += 1;
        (pr.start, pr.cursor, pr.end, pr.req_at) = (off, off, off + len, now);
        (pr.block, pr.block_end, pr.req_bytes) = (blocks.0, blocks.1, bytes);
        self.pump(p, now)
    }

    /// Send pieces of the current request while the slot table allows,
    /// moving on to a list call's next block when one is sent whole.
    fn pump(&mut self, p: u32, now: Time) -> Result<(), Error> {
        let max = self.sc.client.pieces_inflight_max as u32;
        loop {
            let pr = &mut self.procs[p as usize];
            if pr.inflight >= max {
                return Ok(());
            }
            if pr.cursor >= pr.end {
                if pr.block >= pr.block_end {
                    return Ok(());
                }
                let (off, len) = self.apps[pr.app as usize].layout.request(pr.rank, pr.block);
                pr.block += 1;
                (pr.cursor, pr.end) = (off, off + len);
            }
            self.send_piece(p, now)?;
        }
    }

    fn send_piece(&mut self, p: u32, now: Time) -> Result<(), Error> {
        let pr = self.procs[p as usize];
        let srv = &self.sc.server;
        let (server, local, room) = match &self.sc.forwarders {
            // The forwarder sees the file whole; its dispatch goes to the
            // server holding the file.
            Some(f) => (forwarder_of(self.mode.home, pr.file, p, f.count), pr.cursor, u64::MAX),
            None => stripe_map(pr.cursor, srv.stripe_bytes, srv.stripe_count, pr.file % srv.count, srv.count),
        };
        let piece_max = match self.sc.client.fs_piece_bytes {
            0 => u64::MAX,
            n => n,
        };
        let len = (pr.end - pr.cursor).min(room).min(piece_max);
        let piece = Piece { proc: p, app: pr.app, server: server as u32, file: pr.file, write: pr.write, offset: local, len, sent_at: now, ..Piece::default() };
        let id = self.pieces.insert(piece)?;
        let pr = &mut self.procs[p as usize];
        pr.cursor += len;
        pr.inflight += 1;
        let node = pr.node;
        let bytes = self.net.wire_bytes(if piece.write { len } else { 0 });
        // The process's own CPU for the request, before it leaves.
        let cost = self.sc.cluster.client_cpu_ns_per_request;
        let at = if cost == 0 { now } else { self.cpu(now, cost) };
        self.send(MsgKind::ToServer, id, node, self.server_node(server as u32), bytes, at)
    }

    /// A piece's reply reached its process.
    pub(crate) fn reply_arrive(&mut self, id: u32, now: Time) -> Result<(), Error> {
        let piece = self.pieces.remove(id);
        let p = piece.proc;
        if let Some(t) = self.trace.as_mut() {
            t.piece_span(p, id, piece.sent_at, now, piece.server, piece.len);
        }
        self.procs[p as usize].inflight -= 1;
        self.pump(p, now)?;
        let pr = self.procs[p as usize];
        if pr.inflight > 0 || pr.cursor < pr.end || pr.block < pr.block_end {
            return Ok(());
        }
        self.request_done(p, now)
    }

    fn request_done(&mut self, p: u32, now: Time) -> Result<(), Error> {
        let pr = self.procs[p as usize];
        let app = &self.apps[pr.app as usize];
        let (interface, write) = (app.interface, app.write);
        let think = self.think_before(p);
        if let Some(t) = self.trace.as_mut() {
            let op = if pr.write { Op::Write } else { Op::Read };
            t.process_span(p, pr.req_at, now, op, pr.req_bytes);
        }
        match interface {
            Interface::Posix if think > 0 => self.q.push(now + think, Ev::Ready(p)),
            Interface::Posix => self.proc_ready(p, now),
            Interface::Mpiio if write => self.round_part_done(pr.app, now),
            Interface::Mpiio => self.scatter(p, now),
            Interface::ServerDirected => unreachable!("server-directed calls finish in list_reply_arrive"),
        }
    }

    /// Start two-phase (or server-directed) round `apps[a].round`, or
    /// finish the application.
    pub(crate) fn round_begin(&mut self, a: u32, now: Time) -> Result<(), Error> {
        if self.apps[a as usize].interface == Interface::ServerDirected {
            return self.directed_round_begin(a, now);
        }
        let app = &mut self.apps[a as usize];
        let tp = app.two_phase;
        if app.round >= tp.rounds() {
            app.done_at = Some(now);
            return Ok(());
        }
        let (round, first, procs, write) = (app.round, app.first, app.procs, app.write);
        app.pending = if write { tp.active(round) } else { procs };
        for q in first..first + procs as u32 {
            self.procs[q as usize].recv = 0;
        }
        for ag in 0..tp.aggregators {
            let (off, len) = tp.part(round, ag);
            if len == 0 {
                continue;
            }
            let agg = first + tp.rank(ag, procs) as u32;
            if write {
                self.gather(first, procs, agg, len, now)?;
            } else {
                self.begin_request(agg, off, len, now)?;
            }
        }
        Ok(())
    }

    /// Two-phase write: every process sends its share to aggregator `agg`.
    fn gather(&mut self, first: u32, procs: u64, agg: u32, len: u64, now: Time) -> Result<(), Error> {
        let bytes = TwoPhase::exchange_bytes(len, procs);
        let dst = self.procs[agg as usize].node;
        for q in first..first + procs as u32 {
            self.send(MsgKind::ToAgg, agg, self.procs[q as usize].node, dst, bytes, now)?;
        }
        Ok(())
    }

    /// Two-phase read: aggregator `p` sends each process its share.
    fn scatter(&mut self, p: u32, now: Time) -> Result<(), Error> {
        let pr = self.procs[p as usize];
        let app = &self.apps[pr.app as usize];
        let (first, procs) = (app.first, app.procs);
        let bytes = TwoPhase::exchange_bytes(pr.end - pr.start, procs);
        for q in first..first + procs as u32 {
            self.send(MsgKind::ToProc, q, pr.node, self.procs[q as usize].node, bytes, now)?;
        }
        Ok(())
    }

    pub(crate) fn exchange_to_proc(&mut self, q: u32, now: Time) -> Result<(), Error> {
        let a = self.procs[q as usize].app;
        self.procs[q as usize].recv += 1;
        let app = &self.apps[a as usize];
        if self.procs[q as usize].recv == app.two_phase.active(app.round) {
            return self.round_part_done(a, now);
        }
        Ok(())
    }

    pub(crate) fn exchange_to_agg(&mut self, agg: u32, now: Time) -> Result<(), Error> {
        let pr = &mut self.procs[agg as usize];
        pr.recv += 1;
        let app = &self.apps[pr.app as usize];
        if pr.recv < app.procs {
            return Ok(());
        }
        pr.recv = 0;
        let ag = (0..app.two_phase.aggregators).find(|&g| app.first + app.two_phase.rank(g, app.procs) as u32 == agg).expect("an aggregator");
        let (off, len) = app.two_phase.part(app.round, ag);
        self.begin_request(agg, off, len, now)
    }

    /// Server-directed round: every process with a call left sends each
    /// server one list message of its pieces there; each server learns
    /// first how many messages of the round to wait for.
    fn directed_round_begin(&mut self, a: u32, now: Time) -> Result<(), Error> {
        let app = &self.apps[a as usize];
        let (first, procs, layout, round, write, file) = (app.first, app.procs, app.layout, app.round, app.write, app.file);
        let (stripe_bytes, stripe_count, servers) = (self.sc.server.stripe_bytes, self.sc.server.stripe_count, self.sc.server.count);
        let mut bundles: Vec<(u32, u32)> = Vec::new();
        let mut active = 0;
        for rank in 0..procs {
            if round >= layout.requests(rank) {
                continue;
            }
            active += 1;
            let p = first + rank as u32;
            let (b0, count) = layout.call(rank, round);
            let mut mine: Vec<(u32, u32)> = Vec::new(); // (server, bundle)
            for blk in b0..b0 + count {
                let (mut off, len) = layout.request(rank, blk);
                let end = off + len;
                while off < end {
                    let (server, local, room) = stripe_map(off, stripe_bytes, stripe_count, file % servers, servers);
                    let n = (end - off).min(room);
                    let b = match mine.iter().find(|(s, _)| *s == server as u32) {
                        Some(&(_, b)) => b,
                        None => {
                            let b = self.bundles.insert(crate::state::Bundle { proc: p, server: server as u32, write, ..Default::default() })?;
                            if self.bundle_pieces.len() <= b as usize {
                                self.bundle_pieces.resize_with(b as usize + 1, Vec::new);
                            }
                            mine.push((server as u32, b));
                            b
                        }
                    };
                    let piece = Piece { proc: p, app: a, server: server as u32, file, write, offset: local, len: n, sent_at: now, bundle: Some(b), ..Piece::default() };
                    let id = self.pieces.insert(piece)?;
                    self.bundle_pieces[b as usize].push(id);
                    let bd = self.bundles.get_mut(b);
                    (bd.left, bd.bytes) = (bd.left + 1, bd.bytes + n);
                    off += n;
                }
            }
            let call_bytes = mine.iter().map(|&(_, b)| self.bundles.get(b).bytes).sum();
            let pr = &mut self.procs[p as usize];
            (pr.inflight, pr.req_at, pr.req_bytes, pr.next, pr.write, pr.file) = (mine.len() as u32, now, call_bytes, pr.next + 1, write, file);
            bundles.extend(mine);
        }
        if active == 0 {
            self.apps[a as usize].done_at = Some(now);
            return Ok(());
        }
        self.apps[a as usize].pending = active;
        for &(server, _) in &bundles {
            self.servers[server as usize].held.entry(a).or_default().expect += 1;
        }
        for (server, b) in bundles {
            let bd = *self.bundles.get(b);
            // A list message names each piece (offset and length, 16 bytes).
            let bytes = self.net.wire_bytes(if write { bd.bytes } else { 0 }) + 16 * self.bundle_pieces[b as usize].len() as u64;
            let node = self.procs[bd.proc as usize].node;
            self.send(MsgKind::ToServerList, b, node, self.server_node(server), bytes, now)?;
        }
        Ok(())
    }

    /// A server answered one of a process's list messages.
    pub(crate) fn list_reply_arrive(&mut self, b: u32, now: Time) -> Result<(), Error> {
        let bd = self.bundles.remove(b);
        for id in std::mem::take(&mut self.bundle_pieces[b as usize]) {
            self.pieces.remove(id);
        }
        let pr = &mut self.procs[bd.proc as usize];
        pr.inflight -= 1;
        if pr.inflight > 0 {
            return Ok(());
        }
        let (app, req_at, bytes) = (pr.app, pr.req_at, pr.req_bytes);
        if let Some(t) = self.trace.as_mut() {
            t.process_span(bd.proc, req_at, now, if bd.write { Op::Write } else { Op::Read }, bytes);
        }
        self.round_part_done(app, now)
    }

    /// One process (reads) or aggregator (writes) finished its round.
    fn round_part_done(&mut self, a: u32, now: Time) -> Result<(), Error> {
        let app = &mut self.apps[a as usize];
        app.pending -= 1;
        if app.pending > 0 {
            return Ok(());
        }
        app.round += 1;
        self.q.push(now + app.think_ns, Ev::Round(a))
    }
}

/// The forwarder of a request for `file` from process `proc`: by a hash
/// of the file or of the process (`Home`), uniform over `count`.
pub(crate) fn forwarder_of(home: crate::scenario::Home, file: u64, proc: u32, count: u64) -> u64 {
    let key = match home {
        crate::scenario::Home::File => file,
        crate::scenario::Home::Client => u64::from(proc) | 1 << 40,
    };
    // splitmix64's finaliser: nearby keys land apart.
    let mut x = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) % count.max(1)
}
