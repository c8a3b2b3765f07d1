//! The handshake: every whole frame comes here first (`frame`), which
//! holds it back while the connection's reply bytes are at their bound
//! and otherwise passes it on by the connection's phase: a `Hello`, the
//! `Auth` that answers a key challenge, or (once ready) a request
//! (`request.rs`).
//!
//! Bound: at most `clients_max` connections finish their handshake; one
//! more is refused `EBUSY`.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sluice_core::ClientId;
use sluice_proto::{auth_verify, parse_request, proof_mac, Header, HelloOk, Request, IO_BYTES_MAX, VERSION};

use super::{fair, EventLoop, Flow};
use crate::conn::{Conn, Pause, Phase};
use crate::ident;
use crate::ops::Session;
use crate::pending::Out;
use crate::sync::lock;

impl EventLoop {
    /// A whole frame, by the connection's phase.
    pub(super) fn frame(&mut self, c: &mut Conn, h: Header, body: Cow<'_, [u8]>) -> Flow {
        c.last_frame = self.now.at;
        // Replies of every kind count against `reply_bytes_max`: past it
        // no frame is taken in until they drain (a client pipelining
        // requests whose answers it does not read holds no more).
        if c.held > self.shared.config.limits.reply_bytes_max {
            c.blocked = Some((h, body.into_owned()));
            c.pause = Some(Pause::Bytes(0));
            return Flow::Paused;
        }
        // Nothing at all is taken in while the user's share or the
        // server's budget is spent (a metadata reply takes bytes too).
        if self.room(c) == 0 {
            c.blocked = Some((h, body.into_owned()));
            self.starve(c, 1);
            return Flow::Paused;
        }
        match c.phase {
            Phase::Hello => self.hello(c, h, body),
            Phase::Auth { .. } => self.auth(c, h, &body),
            Phase::Ready => self.request(c, h, body),
        }
    }

    /// Answer an error and close.
    pub(super) fn refuse(&mut self, c: &mut Conn, wire_id: u64, errno: i32, msg: String) -> Flow {
        self.fail(c, wire_id, errno, msg);
        Flow::Close
    }

    /// Why a handshake cannot finish now: `clients_max` connections have
    /// finished theirs (a first look, before the identity is known; the
    /// fair placement comes at `welcome`).
    fn full(&self) -> Option<String> {
        let max = self.shared.config.limits.clients_max;
        (self.ready_conns >= max as usize && self.uids.busiest(0, |u| self.privileged(u)).is_none()).then(|| format!("server full (clients_max = {max})"))
    }

    /// Root and the server's own user: no per-user limits, and the
    /// reserved slots.
    pub(super) fn privileged(&self, uid: u32) -> bool {
        uid == 0 || uid == self.shared.server_uid
    }

    /// A slot for a newcomer of `uid` (`fair::place`): free, taken from the
    /// busiest user's idle connection that has been silent longest, or
    /// refused with the reason.
    fn seat(&mut self, uid: u32) -> Result<(), String> {
        let l = &self.shared.config.limits;
        let privileged = self.privileged(uid);
        let mine = self.uids.conns(uid);
        let t = fair::Table { ready: self.ready_conns, clients_max: l.clients_max, clients_reserved: l.clients_reserved, conns_per_uid_max: l.conns_per_uid_max, mine, privileged };
        match fair::place(&t) {
            fair::Place::Free => Ok(()),
            fair::Place::Refuse(msg) => {
                self.shared.uid_refused.fetch_add(1, Ordering::Relaxed);
                Err(msg)
            }
            fair::Place::Evict => {
                let than = if privileged { 0 } else { mine + 1 };
                let victim = self
                    .uids
                    .busiest(than, |u| self.privileged(u))
                    .and_then(|busy| self.conns.values().filter(|c| c.uid == Some(busy) && c.idle()).min_by_key(|c| (c.last_frame, c.id)).map(|c| c.id));
                let Some(victim) = victim else { return Err(fair::full(&t)) };
                if let Some(c) = self.conns.get(&victim) {
                    let msg = format!("closed, idle, to make room for another user (this user held the most connections; clients_max = {})", l.clients_max);
                    fair::send_reason(&c.stream, libc::EBUSY, &msg);
                }
                self.shared.conns_evicted.fetch_add(1, Ordering::Relaxed);
                self.remove(victim);
                Ok(())
            }
        }
    }

    /// The first frame must be a `Hello`; where the identity needs the key
    /// (`ident::needs_key`), a `Challenge` and its `Auth` come between.
    fn hello(&mut self, c: &mut Conn, h: Header, body: Cow<'_, [u8]>) -> Flow {
        let id = h.request_id;
        let hello = match parse_request(&h, &body) {
            Ok(Request::Hello(hello)) => hello,
            Ok(_) => return self.refuse(c, id, libc::EPROTO, "the first frame must be a Hello".into()),
            Err(e) => return self.refuse(c, id, e.errno(), e.to_string()),
        };
        if let Some(msg) = self.full() {
            return self.refuse(c, id, libc::EBUSY, msg);
        }
        let weight_max = self.shared.config.sched_limits.weight_max;
        if hello.weight > weight_max {
            let msg = format!("weight {} outside 0..={weight_max} (0: background)", hello.weight);
            return self.refuse(c, id, libc::EINVAL, msg);
        }
        let peer = c.peer.as_ref().ok().and_then(|p| p.as_ref());
        if ident::needs_key(peer, hello.cred.as_ref()) {
            if self.shared.key.is_none() {
                return self.refuse(c, id, libc::EACCES, "this server has no key: it accepts no TCP clients and no forwarded identities (see --key-file)".into());
            }
            let nonce = match sluice_net::key::random::<{ sluice_proto::AUTH_BYTES }>() {
                Ok(n) => n,
                Err(e) => return self.refuse(c, id, libc::EIO, format!("getrandom: {e}")),
            };
            c.push(id, Out::Challenge(nonce), 0, &self.shared.reply_bytes);
            c.phase = Phase::Auth { nonce, hello: (h, body.into_owned()) };
            return Flow::Next;
        }
        self.welcome(c, id, h, &body, None)
    }

    /// The `Auth` after a challenge: proven, the handshake completes and is
    /// answered on the `Auth` frame's request id, with the server's own
    /// proof of the key over the client's nonce (the client believes
    /// nothing before it checked that).
    fn auth(&mut self, c: &mut Conn, h: Header, body: &[u8]) -> Flow {
        let Phase::Auth { nonce, hello } = std::mem::replace(&mut c.phase, Phase::Hello) else { unreachable!() };
        let id = h.request_id;
        let key = self.shared.key.expect("challenged only with a key");
        match parse_request(&h, body) {
            Ok(Request::Auth { mac, nonce: theirs }) if auth_verify(&key, &nonce, &hello.1, &mac) => {
                let proof = proof_mac(&key, &theirs, &nonce, &hello.1);
                self.welcome(c, id, hello.0, &hello.1, Some(proof))
            }
            Ok(Request::Auth { .. }) => self.refuse(c, id, libc::EACCES, "authentication failed: the client's key is not this server's".into()),
            Ok(_) => self.refuse(c, id, libc::EACCES, "this server needs the key proven (an Auth frame) before any request".into()),
            Err(e) => self.refuse(c, id, e.errno(), e.to_string()),
        }
    }

    /// Complete the handshake of `hello` (already checked), answering on
    /// `answer_id`, with `proof` of the key when it answers an `Auth`.
    fn welcome(&mut self, c: &mut Conn, answer_id: u64, h: Header, body: &[u8], proof: Option<[u8; sluice_proto::AUTH_BYTES]>) -> Flow {
        let Ok(Request::Hello(hello)) = parse_request(&h, body) else { unreachable!("parsed before") };
        let peer = c.peer.as_ref().ok().and_then(|p| p.as_ref());
        let identity = match ident::identify(peer, hello.cred.as_ref(), self.shared.config.squash, self.shared.server_uid) {
            Ok(i) => i,
            Err(e) => return self.refuse(c, answer_id, e.errno, e.message),
        };
        let uid = identity.cred.uid;
        if let Err(msg) = self.seat(uid) {
            return self.refuse(c, answer_id, libc::EBUSY, msg);
        }
        let name = if hello.app.is_empty() { "anonymous" } else { hello.app };
        let connected = lock(&self.shared.apps).connect(name, hello.weight, self.now.ns);
        let app = match connected {
            Ok(app) => app,
            Err(e) => return self.refuse(c, answer_id, e.errno, e.message),
        };
        self.disp.classify(app, name, uid, identity.cred.gid, Some(hello.weight));
        c.app = Some(app);
        c.session = Some(Box::new(Session::new(app, ClientId(hello.client_id), identity)));
        c.phase = Phase::Ready;
        self.ready_conns += 1;
        let counter = self.uids.join(uid);
        c.join_user(uid, (!self.privileged(uid)).then_some(counter));
        let l = &self.shared.config.limits;
        let ok = HelloOk { version: VERSION, frame_bytes_max: l.frame_bytes_max, io_bytes_max: IO_BYTES_MAX, inflight_per_connection_max: l.inflight_per_connection_max, proof };
        c.push(answer_id, Out::HelloOk(ok), 0, &self.shared.reply_bytes);
        self.arm(self.now.at + Duration::from_secs(l.idle_timeout_s));
        Flow::Next
    }
}
