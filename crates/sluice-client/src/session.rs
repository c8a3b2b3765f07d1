//! Sessions and recovery: dialling and proving the key, the current
//! session, and, when the connection breaks, dialling again and reopening
//! every handle by its path (an NFS hard mount's behaviour; the crate
//! documentation has the rules).

use super::*;

/// Dial `addr` and perform the handshake as `opts` says, proving the key
/// when the server asks: session number `gen`. The server is checked
/// first: on a Unix socket its uid before anything is sent
/// (`sluice_net::Stream::check_server`), on TCP its own proof of the key
/// before its `HelloOk` is believed (`prove_key`).
fn open_session(addr: &str, opts: &ConnectOptions, patience: &Arc<Patience>, gen: u64) -> Result<Session> {
    let conn = Conn::open(addr, Arc::clone(patience))?;
    conn.check_server(opts.server_uid)?;
    let app = opts.app.as_deref().unwrap_or("");
    let cred = opts.cred.clone().or_else(|| conn.is_tcp().then(own_cred));
    let hello = Request::Hello(Hello { version: VERSION, app, weight: opts.weight, client_id: opts.client_id.unwrap_or_else(std::process::id), cred });
    let refused = |e: ClientError| match e.kind {
        ClientErrorKind::Disconnected | ClientErrorKind::Timeout => e,
        _ => ClientError::new(ClientErrorKind::Connect, e.errno, format!("sluice server at {addr} refused the connection: {}", e.message)),
    };
    let ok = match conn.call(&hello).map_err(refused)? {
        // Every sluice server challenges a TCP client: one that does not
        // cannot prove it holds the key.
        Reply::HelloOk(_) if conn.is_tcp() => return Err(impostor(addr, "it answered without asking for the key, which a sluice server on TCP always does")),
        Reply::HelloOk(ok) => ok,
        Reply::Challenge(nonce) => {
            let key = load_key(addr, opts.key_file.as_deref())?;
            let proof = Proof::new(&key, &hello, nonce)?;
            match conn.call(&Request::Auth { mac: proof.mac, nonce: proof.mine }).map_err(refused)? {
                Reply::HelloOk(ok) if ok.proof.is_some_and(|p| proof.checks(&key, &p)) => ok,
                Reply::HelloOk(_) => return Err(impostor(addr, "its answer does not prove it holds the key")),
                r => return Err(unexpected("auth", &r)),
            }
        }
        r => return Err(unexpected("hello", &r)),
    };
    let shm = if opts.shm && addr.starts_with("unix:") { conn.attach_shm(shm::REGION_BYTES, opts.post, opts.ring)?.map(Arc::new) } else { None };
    Ok(Session { conn, gen, io_bytes_max: ok.io_bytes_max.min(IO_BYTES_MAX) as usize, shm, write_leases_refused: AtomicBool::new(false) })
}

/// A server that did not prove the key: nothing it says is believed.
fn impostor(addr: &str, why: &str) -> ClientError {
    ClientError::new(ClientErrorKind::Connect, libc::EACCES, format!("sluice server at {addr} is not trusted: {why} (another program may hold its address)"))
}

/// The key of the key file, for a server's challenge.
fn load_key(addr: &str, key_file: Option<&std::path::Path>) -> Result<[u8; sluice_net::key::KEY_BYTES]> {
    let denied = |why: String| ClientError::new(ClientErrorKind::Connect, libc::EACCES, format!("sluice server at {addr} wants its key proven: {why}"));
    let path =
        key_file.map(std::path::Path::to_path_buf).or_else(sluice_net::key::default_path).ok_or_else(|| denied(format!("no key file (set {})", sluice_net::key::KEY_ENV)))?;
    sluice_net::key::load(&path).map_err(|e| denied(e.to_string()))
}

/// Both sides of the key proof for a server's challenge: the `Auth` MAC
/// (the key over the server's nonce and the `Hello` body as sent), and the
/// client's own fresh nonce, which the server's `HelloOk` must prove the
/// key over (`sluice_proto::proof_mac`).
struct Proof {
    mac: [u8; sluice_proto::AUTH_BYTES],
    mine: [u8; sluice_proto::AUTH_BYTES],
    theirs: [u8; sluice_proto::AUTH_BYTES],
    hello_body: Vec<u8>,
}

impl Proof {
    fn new(key: &[u8], hello: &Request<'_>, theirs: [u8; sluice_proto::AUTH_BYTES]) -> Result<Proof> {
        let mut frame = Vec::new();
        encode_request(0, hello, &mut frame).map_err(|e| ClientError::invalid(e.to_string()))?;
        let hello_body = frame.split_off(HEADER_BYTES);
        let mine = sluice_net::key::random::<{ sluice_proto::AUTH_BYTES }>().map_err(|e| ClientError::new(ClientErrorKind::Connect, libc::EIO, format!("getrandom: {e}")))?;
        Ok(Proof { mac: auth_mac(key, &theirs, &hello_body), mine, theirs, hello_body })
    }

    /// Whether the server's `proof` shows it holds `key`.
    fn checks(&self, key: &[u8], proof: &[u8; sluice_proto::AUTH_BYTES]) -> bool {
        sluice_proto::proof_verify(key, &self.mine, &self.theirs, &self.hello_body, proof)
    }
}

/// Whether `e`, met while reconnecting, means the server is not there
/// (yet): keep trying. Anything else is the server's answer.
fn is_outage(e: &ClientError) -> bool {
    match e.kind {
        ClientErrorKind::Disconnected | ClientErrorKind::Timeout => true,
        ClientErrorKind::Connect => {
            [libc::ECONNREFUSED, libc::ENOENT, libc::EAGAIN, libc::ECONNRESET, libc::ETIMEDOUT, libc::EHOSTUNREACH, libc::ENETUNREACH, libc::EPIPE].contains(&e.errno)
        }
        _ => false,
    }
}

/// Flags a reopen after a reconnection uses: the file exists (or is gone),
/// so nothing is created or truncated again.
pub(crate) const REOPEN_FLAGS_DROPPED: i32 = libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC;

pub(crate) fn unexpected(what: &str, r: &Reply) -> ClientError {
    ClientError::new(ClientErrorKind::Protocol, libc::EPROTO, format!("unexpected reply to {what}: {}", r.describe()))
}

/// The byte count of a data reply to `what`, copied into `buf` when
/// another waiter received it for us (`Data`) rather than this one
/// (`DataInto`): both happen when threads share the connection.
pub(crate) fn data_into(what: &str, r: Reply, buf: &mut [u8]) -> Result<usize> {
    match r {
        Reply::DataInto(n) => Ok(n),
        Reply::Data(d) if d.len() <= buf.len() => {
            buf[..d.len()].copy_from_slice(&d);
            Ok(d.len())
        }
        r => Err(unexpected(what, &r)),
    }
}

/// Send `req` on `s`; a slot it would have used is free again when the
/// send failed (the server never saw the request).
pub(crate) fn send_in(s: &Session, req: &Request<'_>, slot: Option<&shm::Slot>) -> Result<u64> {
    // Calls given up whose answers came on the socket, found when their
    // slots were reclaimed (taking this one, perhaps): their replies are
    // dropped.
    if let Some(sl) = slot {
        for id in sl.region.take_answered_on_socket() {
            s.conn.give_up_outside(id);
        }
    }
    let sent = match slot {
        Some(sl) if sl.rings() => s.conn.ring(req, sl),
        _ => s.conn.send(req),
    };
    sent.inspect_err(|_| {
        if let Some(sl) = slot {
            sl.release_unsent();
        }
    })
}

impl Client {
    /// Connect with the default options.
    pub fn connect(addr: &str) -> Result<Client> {
        Client::connect_with(addr, ConnectOptions::default())
    }

    /// Connect and perform the handshake, proving the key when the server
    /// asks for it.
    pub fn connect_with(addr: &str, mut opts: ConnectOptions) -> Result<Client> {
        let app = opts.app.take().unwrap_or_else(default_app);
        opts.app = Some(app.clone());
        let patience = Arc::new(Patience { timeout: opts.timeout, soft: matches!(opts.recovery, Recovery::Soft | Recovery::Failover), warned: AtomicBool::new(false) });
        let session = open_session(addr, &opts, &patience, 0)?;
        Ok(Client {
            addr: addr.to_string(),
            opts,
            app,
            patience,
            session: RwLock::new(Arc::new(session)),
            handles: Mutex::new(HashMap::new()),
            fd_next: AtomicU64::new(1),
            recovering: Mutex::new(None),
            reconnects: AtomicU64::new(0),
            mark: SendMark::default(),
        })
    }

    /// Remember when the next read or write this client sends leaves
    /// (`marked_send`): a benchmark's record of when a process first
    /// reached the server, closer to it than a clock read before the call.
    pub fn mark_next_send(&self) {
        *lock(&self.mark.at) = None;
        self.mark.armed.store(true, Ordering::Release);
    }

    /// When the read or write `mark_next_send` asked about left (just
    /// before its message was encoded and written); None before that.
    pub fn marked_send(&self) -> Option<Instant> {
        *lock(&self.mark.at)
    }

    pub(crate) fn note_send(&self) {
        if self.mark.armed.load(Ordering::Relaxed) && self.mark.armed.swap(false, Ordering::AcqRel) {
            *lock(&self.mark.at) = Some(Instant::now());
        }
    }

    /// How many times this client reconnected after a break.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// Replies read off the current connection that no one has taken yet:
    /// each belongs to a ticket not waited on so far. Zero between calls
    /// of a caller that waits on every ticket it submits.
    pub fn replies_unclaimed(&self) -> usize {
        self.current().conn.replies_stashed()
    }

    pub(crate) fn current(&self) -> Arc<Session> {
        Arc::clone(&self.session.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The server handle of `fd` on session `s`. A handle already moved to
    /// a newer session means `s` is outdated: `Disconnected`, so the
    /// caller retries on the current one.
    pub(crate) fn server_fd(&self, s: &Session, fd: Fd) -> Result<u64> {
        let h = lock(&self.handles);
        let h = h.get(&fd.0).ok_or_else(|| bad_handle(fd))?;
        if let Some(e) = &h.dead {
            return Err(e.clone());
        }
        match h.gen.cmp(&s.gen) {
            std::cmp::Ordering::Equal => Ok(h.server),
            std::cmp::Ordering::Greater => Err(ClientError::new(ClientErrorKind::Disconnected, libc::EIO, "connection replaced")),
            std::cmp::Ordering::Less => Err(ClientError::new(ClientErrorKind::Stale, libc::ESTALE, format!("file handle {} was not reopened", fd.0))),
        }
    }

    /// Run `f` on the current session; after a break, reconnect and, when
    /// `idempotent`, run it again (at most `RETRIES_MAX` times).
    pub(crate) fn with_session<T>(&self, idempotent: bool, mut f: impl FnMut(&Arc<Session>) -> Result<T>) -> Result<T> {
        let mut tries = 0;
        loop {
            let s = self.current();
            match f(&s) {
                Err(e) if e.kind == ClientErrorKind::Disconnected && self.opts.recovery.reconnects() => {
                    self.recover(&s)?;
                    if !idempotent || tries >= RETRIES_MAX {
                        return Err(e);
                    }
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    /// Replace the broken session `failed` with a new one and reopen every
    /// handle on it, unless another thread already did. Waits for the
    /// server as `opts.recovery` says.
    pub(crate) fn recover(&self, failed: &Session) -> Result<()> {
        if !self.opts.recovery.reconnects() {
            return Ok(());
        }
        let mut gave_up = lock(&self.recovering);
        if self.current().gen != failed.gen {
            return Ok(());
        }
        let timed_out = || ClientError::new(ClientErrorKind::Timeout, libc::ETIMEDOUT, format!("sluice server at {} not responding for {:?}", self.addr, self.opts.timeout));
        if matches!(*gave_up, Some((gen, at)) if gen == failed.gen && at.elapsed() < self.opts.timeout) {
            return Err(timed_out());
        }
        let started = Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            match open_session(&self.addr, &self.opts, &self.patience, failed.gen + 1).and_then(|s| self.reopen_all(s)) {
                Ok(()) => {
                    self.patience.answered(&self.addr);
                    self.reconnects.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                // The server answered and refused us: not an outage.
                Err(e) if !is_outage(&e) => return Err(e),
                Err(e) => {
                    if started.elapsed() >= self.opts.timeout {
                        if self.opts.recovery == Recovery::Soft {
                            *gave_up = Some((failed.gen, Instant::now()));
                            return Err(ClientError::new(ClientErrorKind::Timeout, libc::ETIMEDOUT, format!("{}: {}", timed_out().message, e.message)));
                        }
                        self.patience.warn(&self.addr);
                    }
                    abandon::sleep(pause, "waiting for the server")?;
                    pause = (pause * 2).min(RECONNECT_PAUSE_MAX);
                }
            }
        }
    }

    /// Reopen every live handle on `s` by path, then make `s` current. A
    /// path that no longer opens makes its handle dead (ESTALE for a
    /// missing file, the server's errno otherwise).
    pub(crate) fn reopen_all(&self, s: Session) -> Result<()> {
        let todo: Vec<(u64, String, i32, u64)> = lock(&self.handles).iter().filter(|(_, h)| h.dead.is_none()).map(|(&fd, h)| (fd, h.path.clone(), h.flags, h.ino)).collect();
        let mut reopened = Vec::with_capacity(todo.len());
        for (fd, path, flags, ino) in todo {
            let r = match s.conn.call(&Request::Open { path: &path, flags: flags & !REOPEN_FLAGS_DROPPED, mode: 0 }) {
                Ok(Reply::Fd(server, now)) if now == ino => Ok(server),
                Ok(Reply::Fd(server, _)) => {
                    // Another file took the path (replaced, or removed and
                    // made anew): reading or writing it would reach the
                    // wrong file.
                    let _ = s.conn.call(&Request::Close { fd: server });
                    Err(ClientError::new(ClientErrorKind::Stale, libc::ESTALE, format!("{path}: another file since the server restarted")))
                }
                Ok(r) => Err(unexpected("reopen", &r)),
                // The connection failed, or the caller recovering for
                // everyone is gone (`crate::abandon`): not the handle's
                // fault; this session is dropped and another call recovers.
                Err(e) if matches!(e.kind, ClientErrorKind::Disconnected | ClientErrorKind::Timeout | ClientErrorKind::Interrupted) => return Err(e),
                Err(e) if e.errno == libc::ENOENT => Err(ClientError::new(ClientErrorKind::Stale, libc::ESTALE, format!("{path}: gone since the server restarted"))),
                Err(e) => Err(e),
            };
            reopened.push((fd, r));
        }
        let gen = s.gen;
        let mut handles = lock(&self.handles);
        for (fd, r) in reopened {
            if let Some(h) = handles.get_mut(&fd) {
                (h.lent, h.lease, h.leases_off) = (None, None, false);
                // A lease asked for on the broken connection: its slot went
                // with that connection's region.
                h.ahead = None;
                match r {
                    Ok(server) => (h.server, h.gen) = (server, gen),
                    Err(e) => h.dead = Some(e),
                }
            }
        }
        *self.session.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(s);
        Ok(())
    }

    /// The application id this client declared.
    pub fn app(&self) -> &str {
        &self.app
    }

    pub(crate) fn ok(&self, what: &str, idempotent: bool, req: &Request<'_>) -> Result<()> {
        match self.with_session(idempotent, |s| s.conn.call(req))? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(what, &r)),
        }
    }

    /// Run `f` with `fd`'s server handle on the current session.
    pub(crate) fn on_fd<T>(&self, fd: Fd, idempotent: bool, mut f: impl FnMut(&Arc<Session>, u64) -> Result<T>) -> Result<T> {
        self.with_session(idempotent, |s| f(s, self.server_fd(s, fd)?))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use sluice_proto::{Request, Response};

    use super::send_in;
    use crate::conn::tests::{answer, by_hand};
    use crate::Session;

    /// A killed caller's shared-memory call whose answer the server sent
    /// on the socket (an error): a live call reads that reply on its way
    /// and keeps it; once the slot is reclaimed, the next request through
    /// a slot has the connection drop it. Before, it stayed until the
    /// connection went.
    #[test]
    fn a_given_up_calls_answer_on_the_socket_goes_once_its_slot_is_reclaimed() {
        let (conn, mut server, dir) = by_hand();
        let region = crate::shm::tests::region(1);
        let s = Session { conn, gen: 1, io_bytes_max: 1 << 20, shm: Some(Arc::clone(&region)), write_leases_refused: AtomicBool::new(false) };
        let slot = region.take(4096).unwrap();
        let read = |sl: &crate::shm::Slot| Request::ReadShm { fd: 1, offset: 0, len: 4096, at: sl.at(), post: sl.arm() };
        let given_up = send_in(&s, &read(&slot), Some(&slot)).unwrap();
        let index = slot.index;
        slot.abandon(given_up);
        crate::shm::tests::answered_on_the_socket(&region, index);
        answer(&mut server, given_up, &Response::Error { errno: libc::EIO, message: "late" });
        let live = send_in(&s, &Request::Stat { path: "x" }, None).unwrap();
        answer(&mut server, live, &Response::Count(1));
        s.conn.wait(live, None).unwrap();
        assert_eq!(s.conn.replies_stashed(), 1, "kept for a caller that is gone");
        // The region's only slot: taking it reclaims the abandoned one.
        let next = region.take(4096).expect("reclaimed, since answered");
        send_in(&s, &read(&next), Some(&next)).unwrap();
        assert_eq!(s.conn.replies_stashed(), 0, "the gone caller's reply was kept");
        next.release();
        let _ = std::fs::remove_dir_all(dir);
    }
}
