//! A request after the handshake: decoded and admitted by the pure
//! functions of `admission.rs`, then carried out here. A read or write
//! becomes one core request per non-empty piece (`Pending`), which enters
//! the scheduler, or its collective (`gather.rs`); metadata calls run on
//! the loop or go to the metadata pool; leases and regions: `leases.rs`.

use std::borrow::Cow;
use std::sync::Arc;

use sluice_core::{Op, Request as CoreRequest, RequestId};
use sluice_proto::{parse_request, Header, Request, NO_POST};

use super::admission::{admit, decode, Admission, Asked, Io, Seen};
use super::queue::Completion;
use super::{EventLoop, Flow};
use crate::collective::Arrival;
use crate::conn::{Conn, Pause};
use crate::meta::MetaJob;
use crate::pending::{Buf, LeaseAfter, ListInner, ListState, Out, Pending, Reply};
use crate::shm::Shm;
use crate::state::OpenFile;
use crate::sync::lock;

/// Where an admitted message's data is.
enum Place {
    /// A read: its reply carries the data.
    Reply,
    /// A write: its frame body, from this offset.
    Body(Arc<Vec<u8>>, usize),
    /// The connection's shared region, from this offset.
    Shm(Arc<Shm>, u64),
}

/// A read or write message admission let in.
struct Admitted {
    wire_id: u64,
    io: Io,
    file: Arc<OpenFile>,
    place: Place,
    total: u64,
    /// Reply bytes taken for it (`Admission::Schedule`).
    reserved: u64,
    /// The post record to answer in.
    post: Option<(Arc<Shm>, u32)>,
}

impl EventLoop {
    /// A frame after the handshake.
    pub(super) fn request(&mut self, c: &mut Conn, h: Header, body: Cow<'_, [u8]>) -> Flow {
        let id = h.request_id;
        let asked = match parse_request(&h, &body) {
            Ok(req) => decode(req, body.len()),
            Err(e) => return self.refuse(c, id, e.errno(), e.to_string()),
        };
        match asked {
            Asked::Io(io) => self.io(c, h, body, io),
            Asked::Lease { io, len, only } => self.lease_or_io(c, h, body, io, len, only),
            Asked::Attach(bytes) => {
                if let Err((errno, msg)) = self.attach(c, id, bytes) {
                    c.push(id, Out::Error(errno, msg), 0, &self.shared.reply_bytes);
                }
                Flow::Next
            }
            Asked::Nudge => self.nudged(c),
            Asked::Inline => self.inline(c, &h, &body),
            Asked::Pool => self.pool(c, h, body),
            Asked::Close(errno, msg) => self.refuse(c, id, errno, msg),
        }
    }

    /// A read or write: admitted, waiting, or refused (`admission::admit`).
    fn io(&mut self, c: &mut Conn, h: Header, body: Cow<'_, [u8]>, io: Io) -> Flow {
        let l = &self.shared.config.limits;
        let session = c.session.as_ref().expect("a ready connection holds its session");
        let file = session.file(io.fd).map_err(|e| (e.errno, e.message)).map(Arc::clone);
        let seen = Seen {
            held: c.held,
            reply_bytes_max: l.reply_bytes_max,
            room: self.room(c),
            inflight: c.inflight,
            inflight_max: l.inflight_per_connection_max,
            region: c.shm.as_ref().map(|s| (s.len() as u64, s.posts())),
            file: file.as_ref().map(|f| (f.id, f.access)).map_err(Clone::clone),
            collectives: &self.collectives,
            ready: (self.ready.len(), self.ready_write_bytes),
        };
        match admit(&io, &seen) {
            Admission::Wait { need } => {
                c.blocked = Some((h, body.into_owned()));
                c.pause = Some(Pause::Bytes(need));
                Flow::Paused
            }
            Admission::Starve { need } => {
                c.blocked = Some((h, body.into_owned()));
                self.starve(c, need);
                Flow::Paused
            }
            Admission::Refuse { errno, msg } => {
                self.error_on_socket(c, h.request_id, io.post(), errno, msg);
                Flow::Next
            }
            Admission::Schedule { total, reserved, .. } => {
                let place = match (io.shm_at, io.data_at) {
                    (Some((at, _)), _) => Place::Shm(Arc::clone(c.shm.as_ref().expect("admitted with a region")), at),
                    (None, Some(at)) => Place::Body(Arc::new(body.into_owned()), at),
                    (None, None) => Place::Reply,
                };
                let post = match &place {
                    Place::Shm(shm, _) if io.post() != NO_POST => Some((Arc::clone(shm), io.post())),
                    _ => None,
                };
                let file = file.expect("admitted with its file");
                self.enter(c, Admitted { wire_id: h.request_id, io, file, place, total, reserved, post });
                Flow::Next
            }
        }
    }

    /// A `ReadLease` or `WriteLease`: a lease now if one can be granted,
    /// else the read or write (a `WriteLease` without its data is refused).
    fn lease_or_io(&mut self, c: &mut Conn, h: Header, body: Cow<'_, [u8]>, mut io: Io, len: u32, only: bool) -> Flow {
        let id = h.request_id;
        if self.lease(c, id, io.fd, io.pieces[0].0, len, io.op) {
            self.post_on_socket(c, io.post(), id);
            return Flow::Next;
        }
        if only {
            let (errno, msg) = if self.grants_write_leases(c) {
                (libc::EAGAIN, "no write lease for this handle: send the write")
            } else {
                (libc::EOPNOTSUPP, "this server grants no write leases: send the write")
            };
            self.error_on_socket(c, id, io.post(), errno, msg.into());
            return Flow::Next;
        }
        // Not granted now: answered with a lease once its dispatch has
        // brought the range into the page cache.
        io.lease_after = io.op == Op::Read && self.leases_here(c) && u64::from(len) >= crate::lease::SHORT_BYTES_MIN;
        self.io(c, h, body, io)
    }

    /// A metadata call that runs on the loop (`ops::runs_inline`).
    fn inline(&mut self, c: &mut Conn, h: &Header, body: &[u8]) -> Flow {
        let Ok(req) = parse_request(h, body) else { unreachable!("parsed before") };
        if matches!(req, Request::Stats) {
            c.fold_leased(&self.shared.apps);
            self.fold_leased_all();
        }
        if let Request::Qos { command } = req {
            // Root or the server's own user on this host; over TCP, a
            // client that proved the key (every TCP client has).
            let allowed = match c.peer.as_ref().ok().and_then(|p| p.as_ref()) {
                Some(p) => self.privileged(p.uid),
                None => true,
            };
            let out = if allowed {
                self.qos_command(command)
            } else {
                Err((libc::EACCES, "only root or the server's user on its host, or a key holder over TCP, may change service classes".to_string()))
            };
            c.push(h.request_id, out.map_or_else(|(e, m)| Out::Error(e, m), Out::Text), 0, &self.shared.reply_bytes);
            return Flow::Next;
        }
        let session = c.session.as_mut().expect("a ready connection holds its session");
        let out = session.metadata(&self.shared, req).unwrap_or_else(|e| Out::Error(e.errno, e.message));
        c.push(h.request_id, out, 0, &self.shared.reply_bytes);
        Flow::Next
    }

    /// A metadata call that may block: to the pool, with the session; the
    /// connection is not read until it comes back.
    fn pool(&mut self, c: &mut Conn, h: Header, body: Cow<'_, [u8]>) -> Flow {
        let session = c.session.take().expect("a ready connection holds its session");
        let job = MetaJob { conn: c.id, session, header: h, body: body.into_owned() };
        let workers = self.workers.as_ref().expect("workers live while the loop runs");
        if let Err(e) = workers.meta.send(job) {
            c.session = Some(e.0.session);
            return self.refuse(c, h.request_id, libc::EIO, "the metadata pool is gone".into());
        }
        self.meta_out += 1;
        c.pause = Some(Pause::Meta);
        Flow::Paused
    }

    /// Enter an admitted message: one core request per non-empty piece,
    /// into the scheduler, or held with its collective until the group is
    /// complete (`gather.rs`). A message with no byte is answered at once.
    fn enter(&mut self, c: &mut Conn, a: Admitted) {
        c.take(a.reserved, &self.shared.reply_bytes);
        c.inflight += 1;
        c.solo.admitted(c.inflight);
        let live = a.io.pieces.iter().filter(|p| p.1 > 0).count();
        let list = (a.io.list || a.io.group.is_some() || live == 0).then(|| {
            let bytes = if a.io.op == Op::Read { vec![0u8; a.total as usize] } else { Vec::new() };
            let inner = ListInner { remaining: live, data: bytes, bytes: 0, error: None };
            // Shared-memory messages, like writes, answer with a count.
            let counts = a.io.op == Op::Write || matches!(a.place, Place::Shm(..));
            Arc::new(ListState { conn: c.id, wire_id: a.wire_id, counts, reserved: a.reserved, post: a.post.clone(), inner: std::sync::Mutex::new(inner) })
        });
        if live == 0 {
            let list = list.as_ref().expect("built for an empty message");
            let d = list.reply_now(&mut lock(&list.inner));
            self.completed.push_back(Completion::Answer(d));
        }
        let Some(group) = a.io.group else {
            // Straight into the scheduler, no list of them built.
            for piece in live_pieces(&a.io.pieces) {
                let p = self.pending(c, &a, piece, list.as_ref());
                if let Some(d) = self.disp.submit(p, self.now.ns) {
                    self.completed.push_back(Completion::Answer(d));
                }
            }
            return;
        };
        let items = live_pieces(&a.io.pieces).map(|piece| self.pending(c, &a, piece, list.as_ref())).collect();
        let bytes = if a.io.op == Op::Write { a.total } else { 0 };
        let app = c.session.as_ref().expect("a ready connection holds its session").app;
        self.join(Arrival { key: (a.file.id, group.id), group, op: a.io.op, app, items, bytes });
    }

    /// The core request of one piece (`pos`: where its bytes lie in the
    /// message's data).
    fn pending(&mut self, c: &Conn, a: &Admitted, (pos, offset, len): (usize, u64, u64), list: Option<&Arc<ListState>>) -> Pending {
        let id = RequestId(self.request_next);
        self.request_next += 1;
        let session = c.session.as_ref().expect("a ready connection holds its session");
        let op = a.io.op;
        let req = CoreRequest { id, app: session.app, client: session.client, file: a.file.id, op, offset, len };
        let buf = match &a.place {
            Place::Body(body, at) => Buf::Write(Arc::clone(body), at + pos, len as usize),
            Place::Shm(shm, at) => Buf::Shm(Arc::clone(shm), *at as usize + pos, len as usize, op == Op::Write),
            Place::Reply => Buf::Read(vec![0u8; len as usize]),
        };
        let reply = match list {
            Some(l) => Reply::Piece(Arc::clone(l), pos),
            None => Reply::Single(c.id, a.wire_id, a.reserved, a.post.clone()),
        };
        // Only for what `lease` would lease: a read-only handle of a
        // regular file (`lease_after` says the rest).
        let f = &a.file;
        let lease_after = (a.io.lease_after && op == Op::Read && list.is_none() && f.regular && f.access == libc::O_RDONLY)
            .then_some(LeaseAfter { handle: a.io.fd, valid_us: self.shared.config.limits.lease_valid_us });
        Pending { req, file: Arc::clone(f), buf, arrival_ns: self.now.ns, reply, result: Ok(0), lease_after, populated: false }
    }
}

/// The non-empty pieces of a message: where each one's bytes lie in its
/// data, its offset in the file, its length.
fn live_pieces(pieces: &[(u64, u64)]) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
    pieces
        .iter()
        .scan(0usize, |at, &(offset, len)| {
            let piece = (*at, offset, len);
            *at += len as usize;
            Some(piece)
        })
        .filter(|p| p.2 > 0)
}

#[cfg(test)]
mod tests {
    use super::live_pieces;

    #[test]
    fn empty_pieces_are_skipped_but_keep_their_place() {
        assert_eq!(live_pieces(&[(10, 4), (0, 0), (20, 2)]).collect::<Vec<_>>(), vec![(0, 10, 4), (4, 20, 2)]);
        assert_eq!(live_pieces(&[(0, 0)]).count(), 0);
    }
}
