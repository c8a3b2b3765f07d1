//! The metadata role as a service: a Unix or TCP listener, one thread per
//! connection (at most `META_CONNECTIONS_MAX`), each answering
//! `MetaRequest`s in order from the shared `MetaStore`.
//!
//! Connections are bounded in time too (`MetaTimeouts`): one that has not
//! sent its first request, or proven its key over TCP, within the
//! handshake time is closed; so is one idle between requests past the
//! idle time (clients reconnect, `sluice_remote::StripedClient`); a
//! frame once begun must arrive whole within the stall time, and a reply
//! must leave within it. A time bound closes a connection only between
//! requests: every well-formed request read whole is answered first.

use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sluice_metrics::{AtomicHistogram, Expo};
use sluice_net::Listen;

use crate::store::MetaStore;
use sluice_net::{Listener as MetaListener, Stream as MetaStream};
use sluice_remote::proto::{hex, meta_body_len, parse, refuse_sluice_hello, send, sluice_hello, unhex, MetaReply, MetaRequest, META_AUTH_CONTEXT, META_LENGTH_BYTES};
use sluice_remote::{Error, Result};

/// Connections the metadata role serves at once; one more is answered
/// EMFILE and closed. Each is one thread.
pub const META_CONNECTIONS_MAX: usize = 256;

/// How long a connection may keep its thread without progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaTimeouts {
    /// From the connection to its first request, and over TCP until the
    /// key is proven, at most this between requests.
    pub handshake: Duration,
    /// Between two requests of a connection in service.
    pub idle: Duration,
    /// From a frame's first byte to its last; and the longest a reply's
    /// write may block on a client that does not read.
    pub frame_stall: Duration,
}

impl Default for MetaTimeouts {
    fn default() -> MetaTimeouts {
        MetaTimeouts { handshake: Duration::from_secs(10), idle: Duration::from_secs(300), frame_stall: Duration::from_secs(10) }
    }
}

/// A body is read in pieces of at most this many bytes, so that a frame
/// that announces a large length holds only what actually came.
const FRAME_READ_BYTES: usize = 64 << 10;

/// The requests the metadata role answers, as metric labels.
const OPS: [&str; 9] = ["servers", "lookup", "create", "mkdir", "set_dir_default", "unlink", "readdir", "rename", "auth"];

fn op_index(r: &MetaRequest) -> usize {
    match r {
        MetaRequest::Servers => 0,
        MetaRequest::Lookup { .. } => 1,
        MetaRequest::Create { .. } => 2,
        MetaRequest::Mkdir { .. } => 3,
        MetaRequest::SetDirDefault { .. } => 4,
        MetaRequest::Unlink { .. } => 5,
        MetaRequest::Readdir { .. } => 6,
        MetaRequest::Rename { .. } => 7,
        MetaRequest::AuthStart | MetaRequest::Auth { .. } => 8,
    }
}

/// Per request kind: answered, errors, latency.
#[derive(Default)]
struct OpStats {
    requests: AtomicU64,
    errors: AtomicU64,
    latency: AtomicHistogram,
}

/// The role's counters (`sluice meta --metrics`).
struct Stats {
    ops: [OpStats; OPS.len()],
    /// Connections refused at `META_CONNECTIONS_MAX`.
    refused: AtomicU64,
    /// Connections closed by a `MetaTimeouts` bound.
    timed_out: AtomicU64,
}

impl Stats {
    fn record(&self, op: usize, ok: bool, since: std::time::Instant) {
        let s = &self.ops[op];
        let ns = since.elapsed().as_nanos() as u64;
        s.requests.fetch_add(1, Ordering::Relaxed);
        s.errors.fetch_add(u64::from(!ok), Ordering::Relaxed);
        s.latency.record(ns);
    }

    fn render(&self, connections: usize) -> String {
        let mut e = Expo::default();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        e.family("sluice_meta_requests_total", "counter", "Requests the metadata role answered, per kind");
        OPS.iter().zip(&self.ops).for_each(|(op, s)| e.sample("sluice_meta_requests_total", &[("op", op)], get(&s.requests)));
        e.family("sluice_meta_errors_total", "counter", "Requests answered with an error, per kind");
        OPS.iter().zip(&self.ops).for_each(|(op, s)| e.sample("sluice_meta_errors_total", &[("op", op)], get(&s.errors)));
        e.family("sluice_meta_request_seconds", "histogram", "From a request's arrival to its answer, per kind");
        for (op, s) in OPS.iter().zip(&self.ops) {
            s.latency.render(&mut e, "sluice_meta_request_seconds", ("op", op));
        }
        e.family("sluice_meta_connections", "gauge", "Connections served now");
        e.sample("sluice_meta_connections", &[], connections as f64);
        e.family("sluice_meta_connections_refused_total", "counter", "Connections refused at META_CONNECTIONS_MAX");
        e.sample("sluice_meta_connections_refused_total", &[], get(&self.refused));
        e.family("sluice_meta_connections_timed_out_total", "counter", "Connections closed by a time bound (handshake, idle, frame stall)");
        e.sample("sluice_meta_connections_timed_out_total", &[], get(&self.timed_out));
        e.out
    }
}

struct Shared {
    stats: Stats,
    /// The key TCP clients prove before any request (`sluice_net::key`).
    key: Option<[u8; sluice_net::key::KEY_BYTES]>,
    store: MetaStore,
    servers: Vec<String>,
    stopping: AtomicBool,
    conns: Mutex<Vec<(MetaStream, JoinHandle<()>)>>,
    timeouts: MetaTimeouts,
}

/// Starts the metadata role.
pub struct MetaServer;

/// A running metadata role; dropping it stops it.
pub struct MetaHandle {
    shared: Arc<Shared>,
    addr: String,
    /// The Unix socket file to remove at shutdown.
    socket: Option<std::path::PathBuf>,
    acceptor: Option<JoinHandle<()>>,
    metrics: Option<sluice_metrics::Endpoint>,
}

impl MetaServer {
    /// Serve `store` on Unix socket `socket`; `servers` are the data
    /// servers' addresses, in layout order.
    pub fn start(store: MetaStore, servers: Vec<String>, socket: &Path) -> Result<MetaHandle> {
        MetaServer::start_on(store, servers, &Listen::Unix(socket.to_path_buf()))
    }

    /// Serve `store` on `listen` (Unix socket or TCP; TCP port 0 picks a
    /// free port, see `MetaHandle::addr`). Over TCP every client proves
    /// the shared key first, from `key_file` or the default path (created
    /// when missing), as the data servers' clients do.
    pub fn start_on(store: MetaStore, servers: Vec<String>, listen: &Listen) -> Result<MetaHandle> {
        MetaServer::start_with_key(store, servers, listen, None)
    }

    /// `start_on` with an explicit key file.
    pub fn start_with_key(store: MetaStore, servers: Vec<String>, listen: &Listen, key_file: Option<&Path>) -> Result<MetaHandle> {
        MetaServer::start_with(store, servers, listen, key_file, MetaTimeouts::default())
    }

    /// `start_with_key` with explicit time bounds.
    pub fn start_with(store: MetaStore, servers: Vec<String>, listen: &Listen, key_file: Option<&Path>, timeouts: MetaTimeouts) -> Result<MetaHandle> {
        let key = match listen {
            Listen::Unix(_) => None,
            Listen::Tcp(_) => {
                let path = key_file
                    .map(Path::to_path_buf)
                    .or_else(sluice_net::key::default_path)
                    .ok_or_else(|| Error::invalid(format!("a TCP metadata role needs a key file: pass --key-file or set {}", sluice_net::key::KEY_ENV)))?;
                Some(sluice_net::key::load_or_create(&path).map_err(|e| Error::io("key file", &e))?.0)
            }
        };
        if servers.len() != store.servers() as usize {
            return Err(Error::invalid(format!("{} data server addresses for a store of {} servers", servers.len(), store.servers())));
        }
        let listener = MetaListener::bind(listen).map_err(|e| Error::io(&format!("bind {listen:?}"), &e))?;
        let (addr, socket) = (
            listener.addr(),
            match listen {
                Listen::Unix(p) => Some(p.clone()),
                Listen::Tcp(_) => None,
            },
        );
        let stats = Stats { ops: std::array::from_fn(|_| OpStats::default()), refused: AtomicU64::new(0), timed_out: AtomicU64::new(0) };
        let shared = Arc::new(Shared { stats, key, store, servers, stopping: AtomicBool::new(false), conns: Mutex::new(Vec::new()), timeouts });
        let s = shared.clone();
        let acceptor = std::thread::Builder::new().name("sluice-meta-accept".into()).spawn(move || accept_loop(&s, listener)).map_err(|e| Error::io("spawn", &e))?;
        Ok(MetaHandle { shared, addr, socket, acceptor: Some(acceptor), metrics: None })
    }
}

impl MetaHandle {
    /// The address clients use: `unix:SOCKET` or `tcp:HOST:PORT`.
    pub fn addr(&self) -> String {
        self.addr.clone()
    }

    /// Serve the role's metrics (Prometheus text at `/metrics`) on
    /// `addr` (`HOST:PORT`, port 0: any) until shutdown; the bound address.
    pub fn serve_metrics(&mut self, addr: &str) -> Result<std::net::SocketAddr> {
        let s = Arc::clone(&self.shared);
        let e = sluice_metrics::Endpoint::start(addr, move |path| {
            let conns = || s.conns.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|(_, t)| !t.is_finished()).count();
            (path == "/metrics").then(|| (sluice_metrics::TEXT_FORMAT, s.stats.render(conns())))
        })
        .map_err(|e| Error::io("metrics endpoint", &e))?;
        let bound = e.addr();
        self.metrics = Some(e);
        Ok(bound)
    }

    /// Stop accepting, close every connection, join every thread.
    pub fn shutdown(&mut self) {
        self.metrics = None;
        self.shared.stopping.store(true, Ordering::SeqCst);
        if let Some(a) = self.acceptor.take() {
            // Wake the blocking accept.
            let _ = MetaStream::connect(&self.addr);
            let _ = a.join();
        }
        if let Some(p) = self.socket.take() {
            let _ = std::fs::remove_file(p);
        }
        let conns: Vec<_> = self.shared.conns.lock().unwrap_or_else(|p| p.into_inner()).drain(..).collect();
        for (s, t) in conns {
            s.shutdown(std::net::Shutdown::Both);
            let _ = t.join();
        }
    }
}

impl Drop for MetaHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(shared: &Arc<Shared>, listener: MetaListener) {
    loop {
        let stream = listener.accept();
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else { continue };
        let mut conns = shared.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.retain(|(_, t)| !t.is_finished());
        if conns.len() >= META_CONNECTIONS_MAX {
            shared.stats.refused.fetch_add(1, Ordering::Relaxed);
            let msg = format!("the metadata role serves at most {META_CONNECTIONS_MAX} connections (META_CONNECTIONS_MAX)");
            let _ = send(&mut stream, &MetaReply::Error { errno: libc::EMFILE, message: msg });
            continue;
        }
        let (Ok(keep), s) = (stream.try_clone(), shared.clone()) else {
            continue;
        };
        let serve_then_close = move || {
            let end = stream.try_clone();
            serve(&s, stream);
            // The acceptor keeps a clone of the socket (to close it at
            // shutdown) until its next accept: the peer sees the end now.
            if let Ok(end) = end {
                end.shutdown(std::net::Shutdown::Both);
            }
        };
        if let Ok(t) = std::thread::Builder::new().name("sluice-meta-conn".into()).spawn(serve_then_close) {
            conns.push((keep, t));
        }
    }
}

fn serve(shared: &Shared, mut stream: MetaStream) {
    let mut first = true;
    // Over TCP (a key is set) nothing is answered before the key is proven.
    let mut nonce: Option<[u8; sluice_proto::AUTH_BYTES]> = None;
    let mut proven = shared.key.is_none();
    let t = shared.timeouts;
    if stream.set_write_timeout(Some(t.frame_stall.max(Duration::from_millis(1)))).is_err() {
        return;
    }
    loop {
        let wait = if first || !proven { t.handshake } else { t.idle };
        let body = match recv_within(&mut stream, wait, t.frame_stall) {
            Ok(Some(body)) => body,
            Ok(None) => return,
            Err(e) => {
                if matches!(e.kind(), std::io::ErrorKind::TimedOut) {
                    shared.stats.timed_out.fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
        };
        if std::mem::take(&mut first) {
            if let Some(request_id) = sluice_hello(&body) {
                let _ = refuse_sluice_hello(&mut stream, request_id);
                return;
            }
        }
        let Ok(req) = parse::<MetaRequest>(&body) else {
            return;
        };
        let (since, op) = (std::time::Instant::now(), op_index(&req));
        if !proven {
            match authenticate(shared, req, &mut nonce) {
                Ok(reply) => {
                    shared.stats.record(op, true, since);
                    proven = matches!(reply, MetaReply::Authenticated { .. });
                    if send(&mut stream, &reply).is_err() {
                        return;
                    }
                }
                Err(message) => {
                    shared.stats.record(op, false, since);
                    let _ = send(&mut stream, &MetaReply::Error { errno: libc::EACCES, message });
                    return;
                }
            }
            continue;
        }
        let reply = answer(shared, req).unwrap_or_else(|e| MetaReply::Error { errno: e.errno, message: e.message });
        shared.stats.record(op, !matches!(reply, MetaReply::Error { .. }), since);
        if send(&mut stream, &reply).is_err() {
            return;
        }
    }
}

/// Read one frame's body: wait at most `wait` for its first byte, then at
/// most `stall` for the rest. `Ok(None)` at a clean end of stream; the
/// kind `TimedOut` when either bound passed (nothing was read whole, so
/// nothing is left unanswered); `InvalidData` for a length past
/// `META_FRAME_BYTES_MAX`. The body grows as its bytes come
/// (`FRAME_READ_BYTES` at a time), not to the length announced.
fn recv_within(stream: &mut MetaStream, wait: Duration, stall: Duration) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::ErrorKind;
    let timed_out = |what: &str| std::io::Error::new(ErrorKind::TimedOut, what.to_string());
    let mut prefix = [0u8; META_LENGTH_BYTES];
    stream.set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
    let n = loop {
        match stream.read(&mut prefix[..1]) {
            Ok(n) => break n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Err(timed_out("no request in time")),
            Err(e) => return Err(e),
        }
    };
    if n == 0 {
        return Ok(None);
    }
    let deadline = Instant::now() + stall;
    let mut read_by = |buf: &mut [u8]| -> std::io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out("a frame stalled"));
            }
            stream.set_read_timeout(Some(left))?;
            match stream.read(&mut buf[done..]) {
                Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Err(timed_out("a frame stalled")),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    };
    read_by(&mut prefix[1..])?;
    // The prefix is decoded, and its bound checked, by the protocol crate.
    let len = meta_body_len(prefix).map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e.detail))?;
    let mut body = Vec::new();
    while body.len() < len {
        let at = body.len();
        body.resize((at + FRAME_READ_BYTES).min(len), 0);
        read_by(&mut body[at..])?;
    }
    Ok(Some(body))
}

/// The key proof of a TCP connection: `AuthStart` gets a fresh nonce,
/// `Auth` must carry its MAC, and is answered with the role's own proof
/// over the client's nonce; anything else is refused.
fn authenticate(shared: &Shared, req: MetaRequest, nonce: &mut Option<[u8; sluice_proto::AUTH_BYTES]>) -> std::result::Result<MetaReply, String> {
    let key = shared.key.expect("authentication only where a key is set");
    match (req, *nonce) {
        (MetaRequest::AuthStart, None) => {
            let n = sluice_net::key::random::<{ sluice_proto::AUTH_BYTES }>().map_err(|e| format!("getrandom: {e}"))?;
            *nonce = Some(n);
            Ok(MetaReply::Challenge { nonce: hex(&n) })
        }
        (MetaRequest::Auth { mac, nonce: theirs }, Some(n)) => match (unhex::<{ sluice_proto::AUTH_BYTES }>(&mac), unhex::<{ sluice_proto::AUTH_BYTES }>(&theirs)) {
            (Some(mac), Some(theirs)) if sluice_proto::auth_verify(&key, &n, META_AUTH_CONTEXT, &mac) => {
                Ok(MetaReply::Authenticated { proof: hex(&sluice_proto::proof_mac(&key, &theirs, &n, META_AUTH_CONTEXT)) })
            }
            _ => Err("authentication failed: the client's key is not this metadata role's".into()),
        },
        _ => Err("this metadata role listens on TCP: prove the shared key first (see --key-file)".into()),
    }
}

fn answer(shared: &Shared, req: MetaRequest) -> Result<MetaReply> {
    let store = &shared.store;
    Ok(match req {
        MetaRequest::AuthStart | MetaRequest::Auth { .. } => return Err(Error::invalid("already authenticated")),
        MetaRequest::Servers => MetaReply::Servers(shared.servers.clone()),
        MetaRequest::Lookup { path } => MetaReply::Entry(store.lookup(&path)?),
        MetaRequest::Create { path, layout, exclusive } => MetaReply::Entry(store.create(&path, layout, exclusive)?),
        MetaRequest::Mkdir { path } => MetaReply::Entry(store.mkdir(&path)?),
        MetaRequest::SetDirDefault { path, layout } => MetaReply::Entry(store.set_dir_default(&path, layout)?),
        MetaRequest::Unlink { path, expect } => MetaReply::Entry(store.remove(&path, expect)?),
        MetaRequest::Readdir { path } => MetaReply::Entries(store.readdir(&path)?),
        MetaRequest::Rename { from, to } => MetaReply::Renamed { replaced: store.rename(&from, &to)? },
    })
}
