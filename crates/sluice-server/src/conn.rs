//! One client connection: a reader thread that decodes frames and admits
//! requests, and a writer thread that sends replies in batches.
//!
//! Reads and writes go to the dispatcher; metadata operations (open, stat,
//! fsync, ...) run right here on the reader thread, in arrival order. A
//! malformed frame gets an error reply and closes this connection only.
//!
//! Invariant: every admitted read or write is answered exactly once (by the
//! dispatcher), and a request is admitted only when its whole frame
//! arrived; on drain the reader stops at a frame boundary, so nothing
//! unread is ever acknowledged.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_core::{AppId, ClientId, Op, Request as CoreRequest, RequestId};
use sluice_net::PeerCred;
use sluice_proto::{auth_verify, encode_response_head, parse_request, Header, HelloOk, Opcode, Request, AUTH_BYTES, IO_BYTES_MAX, VERSION};

use crate::dispatch::Event;
use crate::error::{Error, ErrorKind, Result};
use crate::ident::{self, Identity};
use crate::intake::{FrameRead, Input, Intake};
use crate::net::{write_all_parts, Stream};

use crate::pending::{response, Buf, ConnBytes, ListInner, ListState, Out, Pending, Reply, ReplyTo, WriteSide};
use crate::state::{lock, OpenFile};
use crate::Shared;

/// Read buffer of a connection, in bytes: many small frames per syscall.
const READ_BUFFER_BYTES: usize = 64 << 10;
/// Send buffer asked for per connection, in bytes: a 1 MiB reply then
/// leaves in one or two `writev`s instead of five 208 KiB rounds, each a
/// wake-up of the writer and the client. Capped by `net.core.wmem_max`.
const SEND_BUFFER_BYTES: usize = 4 << 20;
/// Replies coalesced into one `writev`.
const REPLY_BATCH_MAX: usize = 64;

/// What the reader does after a frame.
enum Flow {
    Continue,
    Close,
}

/// The reader side of one connection.
pub(crate) struct Conn {
    pub(crate) shared: Arc<Shared>,
    pub(crate) reply: ReplyTo,
    /// Open file handles, bounded by `fds_per_connection_max`.
    pub(crate) files: HashMap<u64, Arc<OpenFile>>,
    pub(crate) fd_next: u64,
    app: AppId,
    client: ClientId,
    /// Who this connection acts for; this thread runs as them.
    pub(crate) ident: Identity,
}

/// Serve one accepted connection until it closes or the server drains.
pub fn serve(shared: Arc<Shared>, stream: Stream, conn_id: u64) {
    let (Ok(write_half), Ok(registry_half)) = (stream.try_clone(), stream.try_clone()) else { return };
    stream.set_nodelay();
    let _ = stream.set_write_timeout(Some(std::time::Duration::from_secs(shared.config.limits.write_timeout_s)));
    stream.set_send_buffer(SEND_BUFFER_BYTES);
    // Every connection is registered, refused ones too, so the drain can
    // stop a reader blocked before its handshake.
    let admitted = {
        let mut conns = lock(&shared.conns);
        let ok = conns.len() < shared.config.limits.clients_max as usize;
        conns.insert(conn_id, registry_half);
        ok
    };
    let (tx, rx) = mpsc::channel();
    let out = Arc::new(Mutex::new(WriteSide { stream: write_half, leftover: Vec::new(), broken: false }));
    let writer_out = Arc::clone(&out);
    let bytes = Arc::new(ConnBytes::new(shared.config.limits.reply_bytes_max, Arc::clone(&shared.reply_bytes)));
    let writer_bytes = Arc::clone(&bytes);
    let writer = std::thread::Builder::new().name("sluice-writer".into()).stack_size(256 << 10).spawn(move || writer(writer_out, rx, writer_bytes));
    let reply = ReplyTo { tx, inflight: Arc::new(AtomicU32::new(0)), out, bytes };
    let peer = stream.peer_cred();
    let mut input = Input::new(stream, READ_BUFFER_BYTES);
    let hello = match peer {
        _ if shared.stopping.load(Ordering::SeqCst) => None,
        Ok(peer) => handshake(&shared, &mut input, &reply, admitted, peer.as_ref()),
        Err(e) => {
            let _ = reply.tx.send((0, Out::Error(libc::EACCES, format!("cannot tell who the peer is (SO_PEERCRED): {e}"))));
            None
        }
    };
    if let Some((app, client, ident)) = hello {
        let mut conn = Conn { shared: Arc::clone(&shared), reply, files: HashMap::new(), fd_next: 3, app, client, ident };
        conn.run(&mut input);
        drop(conn);
        if lock(&shared.apps).disconnect(app, shared.clock.now()) {
            let _ = shared.events.send(Event::Forget(app));
        }
    } else {
        drop(reply);
    }
    lock(&shared.conns).remove(&conn_id);
    drop(input);
    if let Ok(w) = writer {
        let _ = w.join();
    }
}

/// The first frame must be a `Hello`; answer it. Where the identity needs
/// the key (`ident::needs_key`), a `Challenge` and its `Auth` come between.
/// On success this thread runs as the connection's identity. `None` closes.
fn handshake(shared: &Shared, input: &mut Input, reply: &ReplyTo, admitted: bool, peer: Option<&PeerCred>) -> Option<(AppId, ClientId, Identity)> {
    let fail = |id: u64, errno: i32, msg: String| {
        let _ = reply.tx.send((id, Out::Error(errno, msg)));
        None
    };
    let deadline = Instant::now() + Duration::from_millis(shared.config.limits.handshake_timeout_ms);
    let (h, body) = match read_handshake_frame(shared, input, deadline) {
        FrameRead::Frame(h, b) => (h, b),
        FrameRead::Eof => return None,
        FrameRead::Bad(id, errno, msg) => return fail(id, errno, msg),
    };
    let hello = match parse_request(&h, &body) {
        Ok(Request::Hello(hello)) => hello,
        Ok(_) => return fail(h.request_id, libc::EPROTO, "the first frame must be a Hello".into()),
        Err(e) => return fail(h.request_id, e.errno(), e.to_string()),
    };
    if !admitted {
        return fail(h.request_id, libc::EBUSY, format!("server full (clients_max = {})", shared.config.limits.clients_max));
    }
    let weight_max = shared.config.sched_limits.weight_max;
    if hello.weight == 0 || hello.weight > weight_max {
        return fail(h.request_id, libc::EINVAL, format!("weight {} outside 1..={weight_max}", hello.weight));
    }
    // After a challenge, the answer goes to the `Auth` frame's request id.
    let mut answer_id = h.request_id;
    if ident::needs_key(peer, hello.cred.as_ref()) {
        match prove_key(shared, input, reply, (h.request_id, &body), deadline) {
            Ok(id) => answer_id = id,
            Err((id, e)) => return fail(id, e.errno, e.message),
        }
    }
    let identity = match ident::identify(peer, hello.cred.as_ref(), shared.config.squash, shared.server_uid) {
        Ok(i) => i,
        Err(e) => return fail(answer_id, e.errno, e.message),
    };
    if let Err(e) = ident::take_on_thread(&identity.cred, shared.server_uid) {
        return fail(answer_id, e.errno, e.message);
    }
    let name = if hello.app.is_empty() { "anonymous" } else { hello.app };
    let app = match lock(&shared.apps).connect(name, hello.weight, shared.clock.now()) {
        Ok(app) => app,
        Err(e) => return fail(answer_id, e.errno, e.message),
    };
    let _ = shared.events.send(Event::Weight(app, hello.weight));
    let ok = HelloOk {
        version: VERSION,
        frame_bytes_max: shared.config.limits.frame_bytes_max,
        io_bytes_max: IO_BYTES_MAX,
        inflight_per_connection_max: shared.config.limits.inflight_per_connection_max,
    };
    let _ = reply.tx.send((answer_id, Out::HelloOk(ok)));
    Some((app, ClientId(hello.client_id), identity))
}

/// Send a fresh nonce and check the client's `Auth` against the key and
/// the `Hello` body it sent. The `Auth` frame's request id, which the
/// handshake's answer carries; on failure, the id to answer and why.
fn prove_key(shared: &Shared, input: &mut Input, reply: &ReplyTo, (hello_id, hello_body): (u64, &[u8]), deadline: Instant) -> std::result::Result<u64, (u64, Error)> {
    let denied = |msg: &str| Error::new(ErrorKind::Invalid, libc::EACCES, msg);
    let key = shared.key.ok_or_else(|| (hello_id, denied("this server has no key: it accepts no TCP clients and no forwarded identities (see --key-file)")))?;
    let nonce = sluice_net::key::random::<AUTH_BYTES>().map_err(|e| (hello_id, Error::io("getrandom", &e)))?;
    let _ = reply.tx.send((hello_id, Out::Challenge(nonce)));
    let (h, body) = match read_handshake_frame(shared, input, deadline) {
        FrameRead::Frame(h, b) => (h, b),
        FrameRead::Eof => return Err((hello_id, denied("connection closed before it proved the key"))),
        FrameRead::Bad(id, errno, msg) => return Err((id, Error::new(ErrorKind::Invalid, errno, msg))),
    };
    let id = h.request_id;
    match parse_request(&h, &body) {
        Ok(Request::Auth { mac }) if auth_verify(&key, &nonce, hello_body, &mac) => Ok(id),
        Ok(Request::Auth { .. }) => Err((id, denied("authentication failed: the client's key is not this server's"))),
        Ok(_) => Err((id, denied("this server needs the key proven (an Auth frame) before any request"))),
        Err(e) => Err((id, Error::new(ErrorKind::Invalid, e.errno(), e.to_string()))),
    }
}

/// The server's frame intake for one connection.
fn intake(shared: &Shared) -> Intake<'_> {
    let l = &shared.config.limits;
    Intake { frame_bytes_max: l.frame_bytes_max, frame_stall_ms: l.frame_stall_ms, budget: &shared.partial, stopping: &shared.stopping }
}

/// A frame of the handshake, due by `deadline`: a client that says
/// nothing in time is told so and closed.
fn read_handshake_frame(shared: &Shared, input: &mut Input, deadline: Instant) -> FrameRead {
    match intake(shared).read_frame(input, &|| Some(deadline)) {
        FrameRead::Eof if Instant::now() >= deadline => {
            FrameRead::Bad(0, libc::ETIMEDOUT, format!("handshake not completed in time (handshake_timeout_ms = {})", shared.config.limits.handshake_timeout_ms))
        }
        other => other,
    }
}

/// How one read or write message is admitted.
struct IoPlan {
    id: u64,
    fd: u64,
    pieces: Vec<(u64, u64)>,
    op: Op,
    /// Write data: the frame body and where the pieces' bytes start in it.
    body: Option<(Arc<Vec<u8>>, usize)>,
    list: bool,
}

impl Conn {
    fn run(&mut self, input: &mut Input) {
        let idle = Duration::from_secs(self.shared.config.limits.idle_timeout_s);
        let mut last = Instant::now();
        loop {
            // Idle only with nothing in flight: a client waiting on its
            // replies is not idle.
            let inflight = &self.reply.inflight;
            let waiting = || (inflight.load(Ordering::Acquire) == 0).then(|| last + idle);
            let frame = intake(&self.shared).read_frame(input, &waiting);
            last = Instant::now();
            let flow = match frame {
                FrameRead::Frame(h, body) => self.frame(h, body),
                FrameRead::Eof => Flow::Close,
                FrameRead::Bad(id, errno, msg) => {
                    self.send(id, Out::Error(errno, msg));
                    Flow::Close
                }
            };
            if let Flow::Close = flow {
                return;
            }
        }
    }

    fn send(&self, id: u64, out: Out) {
        let _ = self.reply.tx.send((id, out));
    }

    fn frame(&mut self, h: Header, body: Vec<u8>) -> Flow {
        let id = h.request_id;
        let req = match parse_request(&h, &body) {
            Ok(r) => r,
            Err(e) => {
                self.send(id, Out::Error(e.errno(), e.to_string()));
                return Flow::Close;
            }
        };
        let (list, op) = (matches!(h.opcode, Opcode::ReadList | Opcode::WriteList), if matches!(h.opcode, Opcode::Write | Opcode::WriteList) { Op::Write } else { Op::Read });
        let plan = match req {
            Request::Hello(_) => {
                self.send(id, Out::Error(libc::EPROTO, "handshake already done".into()));
                return Flow::Close;
            }
            Request::Read { fd, offset, len } => IoPlan { id, fd, pieces: vec![(offset, u64::from(len))], op, body: None, list },
            Request::ReadList { fd, pieces } => IoPlan { id, fd, pieces, op, body: None, list },
            Request::Write { fd, offset, data } => {
                let at = body.len() - data.len();
                IoPlan { id, fd, pieces: vec![(offset, data.len() as u64)], op, body: Some((Arc::new(body), at)), list }
            }
            Request::WriteList { fd, pieces, data } => {
                let at = body.len() - data.len();
                IoPlan { id, fd, pieces, op, body: Some((Arc::new(body), at)), list }
            }
            other => {
                let out = self.metadata(other).unwrap_or_else(|e| Out::Error(e.errno, e.message));
                self.send(id, out);
                return Flow::Continue;
            }
        };
        if let Err(e) = self.admit(plan) {
            self.send(id, Out::Error(e.errno, e.message));
        }
        Flow::Continue
    }

    pub(crate) fn file(&self, fd: u64) -> Result<&Arc<OpenFile>> {
        self.files.get(&fd).ok_or_else(|| Error::new(crate::ErrorKind::Invalid, libc::EBADF, format!("bad file handle {fd}")))
    }

    /// Admit a read or write message: one core request per non-empty piece.
    fn admit(&mut self, plan: IoPlan) -> Result<()> {
        let max = self.shared.config.limits.inflight_per_connection_max;
        if self.reply.inflight.load(Ordering::Acquire) >= max {
            return Err(Error::limit(libc::EAGAIN, format!("too many requests in flight on this connection (inflight_per_connection_max = {max})")));
        }
        let file = Arc::clone(self.file(plan.fd)?);
        let need = if plan.op == Op::Write { libc::O_WRONLY } else { libc::O_RDONLY };
        if file.access != libc::O_RDWR && file.access != need {
            return Err(Error::new(
                crate::ErrorKind::Invalid,
                libc::EBADF,
                format!("file handle {} is not open for {}", plan.fd, if plan.op == Op::Write { "writing" } else { "reading" }),
            ));
        }
        let total: u64 = plan.pieces.iter().map(|p| p.1).sum();
        // Past `reply_bytes_max` this waits: the connection is not read
        // until its replies drain.
        if !self.reply.bytes.take(total, &self.shared.stopping) {
            return Err(Error::new(ErrorKind::Io, libc::ECONNRESET, "the connection's writer is gone or the server stops"));
        }
        self.reply.inflight.fetch_add(1, Ordering::AcqRel);
        let live: Vec<(usize, u64, u64)> = plan
            .pieces
            .iter()
            .scan(0usize, |pos, &(o, l)| {
                let at = *pos;
                *pos += l as usize;
                Some((at, o, l))
            })
            .filter(|p| p.2 > 0)
            .collect();
        let list = (plan.list || live.is_empty()).then(|| {
            let data = if plan.op == Op::Read { vec![0u8; total as usize] } else { Vec::new() };
            let inner = ListInner { remaining: live.len(), data, bytes: 0, error: None };
            Arc::new(ListState { reply: self.reply.clone(), wire_id: plan.id, write: plan.op == Op::Write, reserved: total, inner: std::sync::Mutex::new(inner) })
        });
        if live.is_empty() {
            let list = list.expect("built for an empty message");
            list.reply_now(&mut lock(&list.inner));
            return Ok(());
        }
        let now = self.shared.clock.now();
        let items = live
            .into_iter()
            .map(|(pos, offset, len)| {
                let id = RequestId(self.shared.request_next.fetch_add(1, Ordering::Relaxed));
                let req = CoreRequest { id, app: self.app, client: self.client, file: file.id, op: plan.op, offset, len };
                let buf = match &plan.body {
                    Some((body, at)) => Buf::Write(Arc::clone(body), at + pos, len as usize),
                    None => Buf::Read(vec![0u8; len as usize]),
                };
                let reply = match &list {
                    Some(l) => Reply::Piece(Arc::clone(l), pos),
                    None => Reply::Single(self.reply.clone(), plan.id, len),
                };
                Pending { req, file: Arc::clone(&file), buf, arrival_ns: now, reply, result: Ok(0) }
            })
            .collect();
        let _ = self.shared.events.send(Event::Submit(items));
        Ok(())
    }
}

/// Send replies until every sender is gone; coalesce what is ready into
/// one `writev`. Payloads are written from their buffers, never copied.
/// A worker's partly sent frame (`leftover`) goes out first. A read's
/// bytes go back to the connection's `ConnBytes` once written; when the
/// writer ends, a reader waiting for them is woken.
fn writer(out: Arc<Mutex<WriteSide>>, rx: Receiver<(u64, Out)>, bytes: Arc<ConnBytes>) {
    let mut batch = Vec::with_capacity(REPLY_BATCH_MAX);
    let mut heads = Vec::new();
    while let Ok(first) = rx.recv() {
        batch.push(first);
        while batch.len() < REPLY_BATCH_MAX {
            match rx.try_recv() {
                Ok(x) => batch.push(x),
                Err(_) => break,
            }
        }
        batch.retain(|(_, o)| !matches!(o, Out::Flush));
        heads.clear();
        let mut spans = Vec::with_capacity(batch.len());
        for (id, o) in &batch {
            let start = heads.len();
            encode_response_head(*id, &response(o), &mut heads);
            spans.push(start..heads.len());
        }
        let data: u64 = batch.iter().map(|(_, o)| if let Out::Data(d) = o { d.len() as u64 } else { 0 }).sum();
        let mut w = lock(&out);
        let leftover = std::mem::take(&mut w.leftover);
        let mut parts: Vec<&[u8]> = Vec::with_capacity(batch.len() * 2 + 1);
        parts.push(&leftover);
        for ((_, o), span) in batch.iter().zip(&spans) {
            parts.push(&heads[span.clone()]);
            if let Out::Data(d) = o {
                parts.push(d);
            }
        }
        if w.broken || write_all_parts(&mut w.stream, &parts).is_err() {
            w.broken = true;
            break;
        }
        drop(w);
        batch.clear();
        bytes.give(data);
    }
    bytes.close();
}
