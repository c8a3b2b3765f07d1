//! # sluice-client: the blocking client of the sluice I/O service
//!
//! Used by `sluice cp`/`ls`, the FUSE mount, the interposer, the bench and
//! the Python binding. Every call blocks until its reply, and any number of
//! threads may share one [`Client`]; to keep several requests in flight from
//! one thread, [`Client::submit_read`] / [`Client::submit_write`] return a
//! [`Ticket`] to [`Client::wait_read`] / [`Client::wait_write`] on later.
//!
//! ```no_run
//! use sluice_client::{Client, ConnectOptions};
//!
//! let c = Client::connect("unix:/tmp/sluice.sock").unwrap();
//! let fd = c.open("data/big.dat", libc::O_RDONLY, 0).unwrap();
//! let mut buf = vec![0u8; 1 << 20];
//! let n = c.pread(fd, &mut buf, 0).unwrap();
//! // Four reads in flight at once.
//! let t: Vec<_> = (0..4).map(|i| c.submit_read(fd, 1 << 20, i << 20).unwrap()).collect();
//! for t in t { c.wait_read(t, &mut buf).unwrap(); }
//! c.close(fd).unwrap();
//! # let _ = (n, ConnectOptions::default());
//! ```
//!
//! The server address comes from `--server ADDR` or `SLUICE_SERVER`
//! ([`server_addr`]). The application id comes from `SLUICE_APP`, else
//! `slurm-$SLURM_JOB_ID`, else `PROGRAM-SESSIONID` ([`default_app`]).
//!
//! Recovery, as an NFS hard mount (`ConnectOptions::recovery`): when the
//! connection breaks (the server died or restarted), the client dials
//! again, proves its identity again and reopens every open handle by its
//! path with the same flags; positions are the client's and survive. A
//! request in flight then fails with EIO (a write may or may not have
//! happened; an acknowledged one is on disk), except reads, stats and
//! directory listings, which are retried. A handle whose path no longer
//! opens fails with ESTALE. A server that does not answer within
//! `timeout` (default 30 s, `SLUICE_TIMEOUT`) is reported once on stderr,
//! "server X not responding, still trying", and waited for; a soft client
//! (`SLUICE_SOFT=1`) fails the call with ETIMEDOUT instead.
//!
//! Cache leases (`ConnectOptions::leases`, server side in
//! `sluice-server/src/lease.rs`): a read of a read-only handle asks
//! `ReadLease`; when its range is in the server's page cache the answer is
//! "read it yourself" with the file's descriptor (lent once per handle and
//! connection) and a range that may reach ahead of the request. Later reads
//! inside a live lease are `pread`s on that descriptor with no message at
//! all; the rest go to the server as before. The page cache is coherent
//! across descriptors, so a leased read sees every completed write.
//! Writes of a writable handle (without O_APPEND) ask `WriteLease`
//! likewise, without their data (protocol 12), which a server writing
//! through the page cache answers with a write lease over the whole file
//! (1 s by default): the client then writes that write, and later ones
//! while the lease lives, through the lent descriptor itself. A handle
//! refused asks no more; a session whose server grants none at all
//! (`--direct`, an emulated device, `--no-write-leases`) asks no more.
//!
//! Invariant: no call waits on a silent server longer than `timeout`
//! without saying so (hard) or failing (soft); a write is never sent twice.

mod abandon;
mod conn;
mod error;
mod shm;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

pub use abandon::{Abandon, CHECK_EVERY as ABANDON_CHECK_EVERY};
pub use error::{ClientError, ClientErrorKind, Result};
pub use sluice_proto::{AppStats, Cred, DirEntry, FileKind, Group, WireStat as Stat, CRED_GROUPS_MAX, SETATTR_MODE_KEEP, SETATTR_TIME_NOW, SETATTR_TIME_OMIT};

use conn::{Conn, Patience, Reply};
use sluice_proto::{auth_mac, encode_request, Hello, Request, HEADER_BYTES, IO_BYTES_MAX, LEASE_ONLY_AT, NO_POST, VERSION};

/// Environment variable naming the server address.
pub const SERVER_ENV: &str = "SLUICE_SERVER";
/// Environment variable naming the application.
pub const APP_ENV: &str = "SLUICE_APP";
/// Environment variable: seconds before a silent server is reported (or,
/// soft, fails the call).
pub const TIMEOUT_ENV: &str = "SLUICE_TIMEOUT";
/// Environment variable: `1` makes clients soft (ETIMEDOUT at the timeout).
pub const SOFT_ENV: &str = "SLUICE_SOFT";
/// Environment variable: `0` turns cache leases off (every read goes
/// through the server).
pub const LEASES_ENV: &str = "SLUICE_LEASES";
/// Environment variable: the application's QoS weight (default 1; 0 is
/// the background class, served when the device has nothing else to do).
pub const WEIGHT_ENV: &str = "SLUICE_WEIGHT";
/// Seconds a silent server is waited for before it is reported (hard) or
/// the call fails (soft), as NFS's default `timeo` order of magnitude.
pub const TIMEOUT_S_DEFAULT: u64 = 30;
/// Most times one idempotent call is retried over reconnections before
/// its error is returned: a server that dies at every attempt is not
/// retried forever by one call.
const RETRIES_MAX: u32 = 8;
/// Longest pause between two reconnection attempts.
const RECONNECT_PAUSE_MAX: Duration = Duration::from_secs(1);

/// A file handle on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fd(pub u64);

/// A request in flight, to be waited on once.
#[must_use = "a submitted request must be waited on"]
pub struct Ticket {
    id: u64,
    session: Arc<Session>,
    /// A read is submitted again on a new connection if this one breaks.
    read: Option<(Fd, usize, u64)>,
    /// The shared-memory slot its data travels through, if any.
    slot: Option<shm::Slot>,
    /// A read inside a live cache lease: done with `pread` on this lent
    /// descriptor at wait time, no message sent (`id` is 0).
    local: Option<Arc<Lent>>,
    /// A write done inside a live write lease when submitted (`id` is 0).
    done: Option<usize>,
}

/// A list read or write in flight ([`Client::submit_read_list`],
/// [`Client::submit_write_list`]).
pub struct ListTicket {
    id: u64,
    session: Arc<Session>,
    fd: Fd,
    /// A read's pieces, to send it again on a new connection (never for a
    /// collective's: sent again, it would count twice in its group).
    pieces: Option<Vec<(u64, u64)>>,
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Ticket({} on connection {})", self.id, self.session.gen)
    }
}

/// What a client does when its connection breaks or its server is silent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// Reconnect and reopen handles for as long as it takes (an NFS hard
    /// mount); report a silent server once after `timeout`.
    Hard,
    /// As `Hard`, but fail the call with ETIMEDOUT after `timeout`.
    Soft,
    /// Never reconnect: every call after a break fails with EIO at once
    /// (the cluster's data connections, which report a dead data server).
    Off,
}

/// How to identify this client to the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Application id; `None`: [`default_app`].
    pub app: Option<String>,
    /// QoS weight: 1 = default (or `SLUICE_WEIGHT`), 0 = background.
    pub weight: u32,
    /// Distinguishes the processes of one application; `None`: the pid.
    pub client_id: Option<u32>,
    /// The identity to act for, forwarded (a mount's caller). `None`: over
    /// a Unix socket the kernel tells the server who this process is; over
    /// TCP this process states its own effective ids ([`own_cred`]). A
    /// forwarded identity needs the key unless this process is root.
    pub cred: Option<Cred>,
    /// The key file to prove when the server asks; `None`:
    /// `sluice_net::key::default_path()`.
    pub key_file: Option<std::path::PathBuf>,
    /// After a break or a silence: default `Hard`, `Soft` when
    /// `SLUICE_SOFT=1`.
    pub recovery: Recovery,
    /// Patience with a silent server: default `SLUICE_TIMEOUT` seconds, else
    /// [`TIMEOUT_S_DEFAULT`].
    pub timeout: Duration,
    /// Use a shared-memory data region on a Unix socket (`shm.rs`):
    /// default on, off when `SLUICE_SHM=0`.
    pub shm: bool,
    /// Ask for cache leases on reads of read-only handles (needs `shm`):
    /// default on, off when `SLUICE_LEASES=0`.
    pub leases: bool,
    /// Have the shared region's requests answered in its post records
    /// (needs `shm`; `shm.rs`): default on, off when `SLUICE_POST=0`.
    pub post: bool,
    /// Ring the shared region's requests on its doorbell instead of
    /// sending them (needs `post`; `shm.rs`): default on, off when
    /// `SLUICE_RING=0`.
    pub ring: bool,
}

impl Default for ConnectOptions {
    fn default() -> ConnectOptions {
        let soft = std::env::var(SOFT_ENV).is_ok_and(|v| v == "1");
        let timeout_s = std::env::var(TIMEOUT_ENV).ok().and_then(|v| v.parse::<u64>().ok()).filter(|&t| t > 0).unwrap_or(TIMEOUT_S_DEFAULT);
        ConnectOptions {
            app: None,
            weight: std::env::var(WEIGHT_ENV).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(1),
            client_id: None,
            cred: None,
            key_file: None,
            recovery: if soft { Recovery::Soft } else { Recovery::Hard },
            timeout: Duration::from_secs(timeout_s),
            shm: std::env::var(shm::SHM_ENV).map_or(true, |v| v != "0"),
            leases: std::env::var(LEASES_ENV).map_or(true, |v| v != "0"),
            post: std::env::var(shm::POST_ENV).map_or(true, |v| v != "0"),
            ring: std::env::var(shm::RING_ENV).map_or(true, |v| v != "0"),
        }
    }
}

/// This process's effective uid, gid and supplementary groups.
pub fn own_cred() -> Cred {
    // SAFETY: geteuid/getegid cannot fail; getgroups fills at most n.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut groups = vec![0 as libc::gid_t; sluice_proto::CRED_GROUPS_MAX];
    // SAFETY: groups holds CRED_GROUPS_MAX entries.
    let n = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
    groups.truncate(n.max(0) as usize);
    Cred { uid, gid, groups }
}

/// Per-application counters of the whole server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerStats {
    pub apps: Vec<AppStats>,
}

impl ServerStats {
    /// The counters of application `name`.
    pub fn app(&self, name: &str) -> Option<&AppStats> {
        self.apps.iter().find(|a| a.name == name)
    }
}

/// Origin of an `lseek`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Whence {
    Set,
    Cur,
    End,
}

/// The server address: `explicit` (from `--server`), else `SLUICE_SERVER`.
pub fn server_addr(explicit: Option<&str>) -> Result<String> {
    if let Some(a) = explicit {
        return Ok(a.to_string());
    }
    std::env::var(SERVER_ENV).map_err(|_| ClientError::invalid(format!("no sluice server given: pass --server ADDR or set {SERVER_ENV}")))
}

/// The application a process belongs to, from its environment (`var`),
/// its command name and its session: the one rule every access path uses
/// (the library and the interposer for themselves, the mount for each
/// caller), so one program started one way is one application whichever
/// way it reaches sluice. In order:
/// 1. `SLUICE_APP`, as given;
/// 2. the batch job: `slurm-$SLURM_JOB_ID`;
/// 3. the MPI job, so that every rank of one `mpirun` is one application:
///    `mpi-$PMIX_NAMESPACE` (OpenMPI, any PMIx launcher), else
///    `mpi-$OMPI_MCA_ess_base_jobid`;
/// 4. the command name and the session id (`cat-4242`): two shells'
///    programs are two applications.
pub fn app_id(var: impl Fn(&str) -> Option<String>, command: &str, session: i32) -> String {
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    if let Some(a) = set(APP_ENV) {
        return a;
    }
    if let Some(j) = set("SLURM_JOB_ID") {
        return format!("slurm-{j}");
    }
    if let Some(ns) = set("PMIX_NAMESPACE").or_else(|| set("OMPI_MCA_ess_base_jobid")) {
        return format!("mpi-{ns}");
    }
    format!("{}-{session}", if command.is_empty() { "unknown" } else { command })
}

/// This process's application (`app_id` of its own environment, command
/// name and session).
pub fn default_app() -> String {
    let command = std::fs::read_to_string("/proc/self/comm")
        .map(|c| c.trim().to_string())
        .ok()
        .or_else(|| std::env::args().next().and_then(|a| std::path::Path::new(&a).file_name().map(|f| f.to_string_lossy().into_owned())))
        .unwrap_or_default();
    // SAFETY: getsid(0) only reads the caller's session id.
    let sid = unsafe { libc::getsid(0) };
    app_id(|k| std::env::var(k).ok(), &command, sid)
}

/// Dial `addr` and perform the handshake as `opts` says, proving the key
/// when the server asks: session number `gen`.
fn open_session(addr: &str, opts: &ConnectOptions, patience: &Arc<Patience>, gen: u64) -> Result<Session> {
    let conn = Conn::open(addr, Arc::clone(patience))?;
    let app = opts.app.as_deref().unwrap_or("");
    let cred = opts.cred.clone().or_else(|| conn.is_tcp().then(own_cred));
    let hello = Request::Hello(Hello { version: VERSION, app, weight: opts.weight, client_id: opts.client_id.unwrap_or_else(std::process::id), cred });
    let refused = |e: ClientError| match e.kind {
        ClientErrorKind::Disconnected | ClientErrorKind::Timeout => e,
        _ => ClientError::new(ClientErrorKind::Connect, e.errno, format!("sluice server at {addr} refused the connection: {}", e.message)),
    };
    let ok = match conn.call(&hello).map_err(refused)? {
        Reply::HelloOk(ok) => ok,
        Reply::Challenge(nonce) => {
            let mac = prove_key(addr, &hello, &nonce, opts.key_file.as_deref())?;
            match conn.call(&Request::Auth { mac }).map_err(refused)? {
                Reply::HelloOk(ok) => ok,
                r => return Err(unexpected("auth", &r)),
            }
        }
        r => return Err(unexpected("hello", &r)),
    };
    let shm = if opts.shm && addr.starts_with("unix:") { conn.attach_shm(shm::REGION_BYTES, opts.post, opts.ring)?.map(Arc::new) } else { None };
    Ok(Session { conn, gen, io_bytes_max: ok.io_bytes_max.min(IO_BYTES_MAX) as usize, shm, write_leases_refused: AtomicBool::new(false) })
}

/// The `Auth` MAC for a server's challenge: the key file's key over the
/// nonce and the `Hello` body as sent.
fn prove_key(addr: &str, hello: &Request<'_>, nonce: &[u8; sluice_proto::AUTH_BYTES], key_file: Option<&std::path::Path>) -> Result<[u8; sluice_proto::AUTH_BYTES]> {
    let denied = |why: String| ClientError::new(ClientErrorKind::Connect, libc::EACCES, format!("sluice server at {addr} wants its key proven: {why}"));
    let path =
        key_file.map(std::path::Path::to_path_buf).or_else(sluice_net::key::default_path).ok_or_else(|| denied(format!("no key file (set {})", sluice_net::key::KEY_ENV)))?;
    let key = sluice_net::key::load(&path).map_err(|e| denied(e.to_string()))?;
    let mut frame = Vec::new();
    encode_request(0, hello, &mut frame).map_err(|e| ClientError::invalid(e.to_string()))?;
    Ok(auth_mac(&key, nonce, &frame[HEADER_BYTES..]))
}

/// Where `read`/`write` are, per handle.
#[derive(Clone, Copy)]
struct Position {
    at: u64,
    append: bool,
}

/// One connection and its generation. After a break the client opens a
/// new session and reopens every handle on it.
struct Session {
    conn: Conn,
    gen: u64,
    io_bytes_max: usize,
    /// The shared-memory data region, when the server granted one.
    shm: Option<Arc<shm::Region>>,
    /// The server said it grants no write leases at all (EOPNOTSUPP to
    /// one asked for): this session asks no more.
    write_leases_refused: AtomicBool,
}

/// An open file as the caller knows it: a stable handle whose server
/// handle changes with each reconnection.
struct Handle {
    /// The server's handle on session `gen`.
    server: u64,
    gen: u64,
    path: String,
    flags: i32,
    /// The file's inode number when it was opened: a reopen by path that
    /// finds another file makes the handle dead (ESTALE).
    ino: u64,
    pos: Position,
    /// Why the handle is dead since a reconnection (ESTALE: its path is
    /// gone, or names another file now).
    dead: Option<ClientError>,
    /// The descriptor the server lent for cache leases on session `gen`.
    lent: Option<Arc<Lent>>,
    /// The live lease: `[start, end)` until `until`.
    lease: Option<(u64, u64, Instant)>,
    /// No more leases for this handle: its lent descriptor was found
    /// closed or replaced under the client (see `Lent::intact`).
    leases_off: bool,
    /// The lease after the live one, asked for ahead (at most one): its
    /// offset and the read in flight (`Client::lease_ahead`).
    ahead: Option<(u64, Ticket)>,
    /// Where the last blocking `pread` of it ended: a read that starts
    /// there is sequential (`Client::lease_ahead`).
    read_end: u64,
}

/// A descriptor the server lent, and the file it was lent for.
struct Lent {
    file: std::fs::File,
    /// `(st_dev, st_ino)` when it arrived.
    key: (u64, u64),
}

/// `(st_dev, st_ino)` of an open file.
fn file_key(f: &std::fs::File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    f.metadata().ok().map(|m| (m.dev(), m.ino()))
}

/// Lent descriptors this process holds (every client together).
static LENT_HELD: AtomicUsize = AtomicUsize::new(0);

/// The most lent descriptors a process holds: a quarter of its descriptor
/// limit (at least 16). Each handle that takes leases holds one, and
/// under the interposer each service file holds a placeholder too: with
/// no bound, a process under `ulimit -n 1024` ran out of descriptors at
/// 509 open files. Past it a handle takes no leases (its reads and writes
/// go through the server).
fn lent_max() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills a valid struct.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { 1024 };
    usize::try_from(soft / 4).unwrap_or(usize::MAX).max(16)
}

/// Count one more in `held` unless it holds `max` already.
fn take_one(held: &AtomicUsize, max: usize) -> bool {
    if held.fetch_add(1, Ordering::AcqRel) >= max {
        held.fetch_sub(1, Ordering::AcqRel);
        return false;
    }
    true
}

/// Lent descriptors this process holds now (every client together).
pub fn lent_held() -> usize {
    LENT_HELD.load(Ordering::Acquire)
}

impl Lent {
    /// Keep a lent descriptor, unless the process holds `lent_max` already.
    fn new(fd: OwnedFd) -> Option<Lent> {
        if !take_one(&LENT_HELD, lent_max()) {
            return None;
        }
        let file = std::fs::File::from(fd);
        match file_key(&file) {
            Some(key) => Some(Lent { key, file }),
            None => {
                LENT_HELD.fetch_sub(1, Ordering::AcqRel);
                None
            }
        }
    }

    /// Whether the descriptor still refers to the file it was lent for. A
    /// program that closes descriptors it does not own (and, under the
    /// interposer, then opens another file on the same number) must not
    /// make a leased read return another file's bytes: one `fstat` per
    /// leased read rules it out.
    fn intact(&self) -> bool {
        file_key(&self.file) == Some(self.key)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        LENT_HELD.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `pwrite` all of `data` on a lent descriptor (checked `intact` by the
/// caller, as for reads), and report the bytes in the session's region
/// (`shm::Region::add_leased`), which the server counts as written.
fn local_pwrite(lent: &Lent, data: &[u8], offset: u64, region: Option<&Arc<shm::Region>>) -> Result<usize> {
    use std::os::unix::fs::FileExt;
    lent.file.write_all_at(data, offset).map_err(|e| ClientError::new(ClientErrorKind::Server, e.raw_os_error().unwrap_or(libc::EIO), format!("leased write: {e}")))?;
    if let Some(r) = region {
        r.add_leased(data.len() as u64);
    }
    Ok(data.len())
}

/// `pread` on a lent descriptor until `buf` is full or end of file.
fn local_pread(lent: &Lent, buf: &mut [u8], offset: u64) -> Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut at = 0;
    while at < buf.len() {
        match lent.file.read_at(&mut buf[at..], offset + at as u64) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ClientError::new(ClientErrorKind::Server, e.raw_os_error().unwrap_or(libc::EIO), format!("leased read: {e}"))),
        }
    }
    Ok(at)
}

/// What [`Client::passthrough_file`] found.
#[derive(Debug)]
pub enum Passthrough {
    /// The file itself, every page of it cached now.
    File(std::fs::File),
    /// The server lent the file, but not all of it is cached.
    NotCached,
    /// No descriptor lent: the server lends none (another host, O_DIRECT,
    /// an emulated device), the first bytes were not cached, or no prime
    /// was asked for.
    NotLent,
    /// Not a candidate: leases off, not a read-only handle, an empty file,
    /// or a lent descriptor that no longer is the file.
    Unsuitable,
}

/// A connection to a sluice server. See the crate documentation.
pub struct Client {
    addr: String,
    opts: ConnectOptions,
    app: String,
    patience: Arc<Patience>,
    session: RwLock<Arc<Session>>,
    handles: Mutex<HashMap<u64, Handle>>,
    fd_next: AtomicU64,
    /// One reconnection at a time; holds the session generation a soft
    /// recovery last gave up on, and when, so the other calls waiting on
    /// that dead session fail at once instead of each waiting `timeout`.
    recovering: Mutex<Option<(u64, Instant)>>,
    reconnects: AtomicU64,
    mark: SendMark,
}

/// When a read or write left, for a caller that asked
/// (`Client::mark_next_send`).
#[derive(Default)]
struct SendMark {
    armed: AtomicBool,
    at: Mutex<Option<Instant>>,
}

/// Lock `m`, using the data of a mutex poisoned by a panicking thread as
/// it is: every table it guards stays consistent between statements, so a
/// panic elsewhere must not take the client (or the process that
/// preloads it) down with it. The one such helper of the client side.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn bad_handle(fd: Fd) -> ClientError {
    ClientError::new(ClientErrorKind::Invalid, libc::EBADF, format!("bad file handle {}", fd.0))
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
const REOPEN_FLAGS_DROPPED: i32 = libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC;

fn unexpected(what: &str, r: &Reply) -> ClientError {
    ClientError::new(ClientErrorKind::Protocol, libc::EPROTO, format!("unexpected reply to {what}: {}", r.describe()))
}

/// The byte count of a data reply to `what`, copied into `buf` when
/// another waiter received it for us (`Data`) rather than this one
/// (`DataInto`): both happen when threads share the connection.
fn data_into(what: &str, r: Reply, buf: &mut [u8]) -> Result<usize> {
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
fn send_in(s: &Session, req: &Request<'_>, slot: Option<&shm::Slot>) -> Result<u64> {
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
        let patience = Arc::new(Patience { timeout: opts.timeout, soft: opts.recovery == Recovery::Soft, warned: AtomicBool::new(false) });
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

    fn note_send(&self) {
        if self.mark.armed.load(Ordering::Relaxed) && self.mark.armed.swap(false, Ordering::AcqRel) {
            *lock(&self.mark.at) = Some(Instant::now());
        }
    }

    /// How many times this client reconnected after a break.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    fn current(&self) -> Arc<Session> {
        Arc::clone(&self.session.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The server handle of `fd` on session `s`. A handle already moved to
    /// a newer session means `s` is outdated: `Disconnected`, so the
    /// caller retries on the current one.
    fn server_fd(&self, s: &Session, fd: Fd) -> Result<u64> {
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
    fn with_session<T>(&self, idempotent: bool, mut f: impl FnMut(&Arc<Session>) -> Result<T>) -> Result<T> {
        let mut tries = 0;
        loop {
            let s = self.current();
            match f(&s) {
                Err(e) if e.kind == ClientErrorKind::Disconnected && self.opts.recovery != Recovery::Off => {
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
    fn recover(&self, failed: &Session) -> Result<()> {
        if self.opts.recovery == Recovery::Off {
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
    fn reopen_all(&self, s: Session) -> Result<()> {
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
                Err(e) if e.kind == ClientErrorKind::Disconnected || e.kind == ClientErrorKind::Timeout => return Err(e),
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

    fn ok(&self, what: &str, idempotent: bool, req: &Request<'_>) -> Result<()> {
        match self.with_session(idempotent, |s| s.conn.call(req))? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(what, &r)),
        }
    }

    /// Run `f` with `fd`'s server handle on the current session.
    fn on_fd<T>(&self, fd: Fd, idempotent: bool, mut f: impl FnMut(&Arc<Session>, u64) -> Result<T>) -> Result<T> {
        self.with_session(idempotent, |s| f(s, self.server_fd(s, fd)?))
    }

    /// Open `path` (relative to the server root) with `open(2)` flags. The
    /// handle survives server restarts (reopened by path).
    pub fn open(&self, path: &str, flags: i32, mode: u32) -> Result<Fd> {
        // Not retried: a create may have happened before the break.
        let (server, gen, ino) = self.with_session(flags & REOPEN_FLAGS_DROPPED == 0, |s| match s.conn.call(&Request::Open { path, flags, mode })? {
            Reply::Fd(fd, ino) => Ok((fd, s.gen, ino)),
            r => Err(unexpected("open", &r)),
        })?;
        let fd = self.fd_next.fetch_add(1, Ordering::Relaxed);
        let pos = Position { at: 0, append: flags & libc::O_APPEND != 0 };
        let h = Handle { server, gen, path: path.to_string(), flags, ino, pos, dead: None, lent: None, lease: None, leases_off: false, ahead: None, read_end: 0 };
        lock(&self.handles).insert(fd, h);
        Ok(Fd(fd))
    }

    /// Give back every descriptor the server lent this client (each closes
    /// once no read in flight uses it); its handles take no more leases.
    /// For a process out of descriptors (`lent_held`).
    pub fn shed_lent(&self) {
        for h in lock(&self.handles).values_mut() {
            if h.lent.is_some() {
                (h.lent, h.lease, h.leases_off) = (None, None, true);
            }
        }
    }

    /// The inode number of `fd`'s file as the server opened it.
    pub fn ino(&self, fd: Fd) -> Result<u64> {
        lock(&self.handles).get(&fd.0).map(|h| h.ino).ok_or_else(|| bad_handle(fd))
    }

    pub fn close(&self, fd: Fd) -> Result<()> {
        let mut h = lock(&self.handles).remove(&fd.0).ok_or_else(|| bad_handle(fd))?;
        if let Some((_, t)) = h.ahead.take() {
            // Answered before the close, so its slot is free again.
            let _ = self.wait_discard(t);
        }
        if h.dead.is_some() {
            return Ok(());
        }
        let s = self.current();
        if s.gen != h.gen {
            return Ok(()); // Its server handle died with its connection.
        }
        match s.conn.call(&Request::Close { fd: h.server }) {
            Ok(_) => Ok(()),
            // The connection broke: the server closed it with the rest.
            Err(e) if e.kind == ClientErrorKind::Disconnected => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Start a read of `len` bytes at `offset` (at most the server's
    /// `io_bytes_max`); finish it with [`Client::wait_read`].
    pub fn submit_read(&self, fd: Fd, len: usize, offset: u64) -> Result<Ticket> {
        self.on_fd(fd, true, |s, server| {
            if len > s.io_bytes_max {
                return Err(ClientError::invalid(format!("read of {len} bytes exceeds io_bytes_max ({})", s.io_bytes_max)));
            }
            let (local, lease_ok) = self.leased(fd, s.gen, offset, len, false);
            if local.is_some() {
                return Ok(Ticket { id: 0, session: Arc::clone(s), read: Some((fd, len, offset)), slot: None, local, done: None });
            }
            let slot = s.shm.as_ref().and_then(|r| r.take(len));
            let req = match &slot {
                Some(sl) if lease_ok => Request::ReadLease { fd: server, offset, len: len as u32, at: sl.at(), post: sl.arm() },
                Some(sl) => Request::ReadShm { fd: server, offset, len: len as u32, at: sl.at(), post: sl.arm() },
                None => Request::Read { fd: server, offset, len: len as u32 },
            };
            self.note_send();
            let id = send_in(s, &req, slot.as_ref())?;
            // The session the request went out on, exactly: ids restart
            // with each connection.
            Ok(Ticket { id, session: Arc::clone(s), read: Some((fd, len, offset)), slot, local: None, done: None })
        })
    }

    /// For a read (or, with `write`, a write) of `fd` on session `gen`: the
    /// lent descriptor when a live lease covers it, and whether to ask for
    /// a lease otherwise (leases on; a read-only handle for a read, a
    /// writable one without O_APPEND for a write: a handle's leases are
    /// all of its one kind, so a read of a read-write handle never uses
    /// a write lease).
    fn leased(&self, fd: Fd, gen: u64, offset: u64, len: usize, write: bool) -> (Option<Arc<Lent>>, bool) {
        if !self.opts.leases {
            return (None, false);
        }
        let mut h = lock(&self.handles);
        let Some(h) = h.get_mut(&fd.0) else { return (None, false) };
        let kind = if write { h.flags & libc::O_ACCMODE != libc::O_RDONLY && h.flags & libc::O_APPEND == 0 } else { h.flags & libc::O_ACCMODE == libc::O_RDONLY };
        if !kind {
            return (None, false);
        }
        // A handle not lent a descriptor yet asks no lease while the
        // process holds `lent_max`: the server would lend it one.
        let ok = !h.leases_off && (h.lent.is_some() || lent_held() < lent_max());
        let live = match (&h.lent, h.lease) {
            (Some(file), Some((start, end, until))) if h.gen == gen && offset >= start && offset.saturating_add(len as u64) <= end && Instant::now() < until => {
                Some(Arc::clone(file))
            }
            _ => None,
        };
        match live {
            Some(f) if !f.intact() => {
                (h.lent, h.lease, h.leases_off) = (None, None, true);
                (None, false)
            }
            live => (live, ok),
        }
    }

    /// Keep the lease the server answered for `fd` on session `gen` (with
    /// the descriptor it lent, the first time); the descriptor to read
    /// from, or `None` when the lent one is not known here (another
    /// thread's reply that carried it is not taken in yet).
    fn keep_lease(&self, fd: Fd, gen: u64, start: u64, len: u64, valid: Duration, lent: Option<OwnedFd>) -> Option<Arc<Lent>> {
        let offered = lent.is_some();
        let lent = lent.and_then(Lent::new).map(Arc::new);
        let mut h = lock(&self.handles);
        let Some(h) = h.get_mut(&fd.0).filter(|h| h.gen == gen) else { return lent };
        if offered && lent.is_none() {
            // Not kept (`lent_max`): this handle asks no more leases.
            (h.lent, h.lease, h.leases_off) = (None, None, true);
            return None;
        }
        if let Some(f) = &lent {
            h.lent = Some(Arc::clone(f));
        }
        let file = h.lent.clone()?;
        if !file.intact() {
            (h.lent, h.lease, h.leases_off) = (None, None, true);
            return None;
        }
        h.lease = Some((start, start.saturating_add(len), Instant::now() + valid));
        Some(file)
    }

    /// Bytes read into `buf` (fewer than asked at end of file). A read
    /// whose connection broke is sent again on the next one.
    pub fn wait_read(&self, mut t: Ticket, buf: &mut [u8]) -> Result<usize> {
        let want = t.read.map_or(buf.len(), |r| r.1.min(buf.len()));
        if let (Some(file), Some((_, _, offset))) = (t.local.take(), t.read) {
            return local_pread(&file, &mut buf[..want], offset);
        }
        let slot = t.slot.take();
        let r = t.session.conn.answer(t.id, slot.as_ref(), if slot.is_some() { None } else { Some(&mut *buf) });
        // Answered (data or error): the slot is done with; the server
        // wrote the data into it before answering.
        let r = match (slot, r) {
            (Some(sl), Ok(Reply::Count(n))) => {
                sl.drain_into(buf, n as usize);
                sl.release();
                Ok(Reply::DataInto((n as usize).min(buf.len())))
            }
            (Some(sl), Ok(Reply::Lease(start, len, valid, lent))) => {
                sl.release();
                let (fd, _, offset) = t.read.expect("a read ticket");
                match self.keep_lease(fd, t.session.gen, start, len, valid, lent) {
                    Some(file) => return local_pread(&file, &mut buf[..want], offset),
                    // Rare (threads racing on a handle's first lease): ask
                    // again without a lease.
                    None => return self.read_socket(fd, &mut buf[..want], offset),
                }
            }
            // Any other answer: the server is done with the slot too.
            (Some(sl), r @ (Ok(_) | Err(ClientError { kind: ClientErrorKind::Server, .. }))) => {
                sl.release();
                r
            }
            (_, r) => r,
        };
        match r {
            Err(e) if e.kind == ClientErrorKind::Disconnected && self.opts.recovery != Recovery::Off => {
                self.recover(&t.session)?;
                let Some((fd, _, offset)) = t.read else { return Err(e) };
                self.read_socket(fd, &mut buf[..want], offset)
            }
            r => data_into("read", r?, buf),
        }
    }

    /// A plain `Read` of `buf.len()` bytes at `offset`, its data through
    /// the socket (retried after a break).
    fn read_socket(&self, fd: Fd, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.on_fd(fd, true, |s, server| {
            let id = s.conn.send(&Request::Read { fd: server, offset, len: buf.len() as u32 })?;
            data_into("read", s.conn.wait(id, Some(buf))?, buf)
        })
    }

    /// Write all of `data` at `offset` through the lent descriptor when a
    /// write lease covers it, or when one asked for now is granted; `None`:
    /// the server is to write it (this handle, or this server, grants no
    /// write lease). The lease is asked without the data (`WriteLease` at
    /// `LEASE_ONLY_AT`, protocol 12): a granted one then costs no copy
    /// into the shared region, and covers the whole file for the time the
    /// server gives. A refusal makes the handle ask no more; a server that
    /// grants none at all (EOPNOTSUPP) makes the session ask no more.
    fn write_leased(&self, fd: Fd, data: &[u8], offset: u64) -> Result<Option<usize>> {
        let s = self.current();
        let (local, ask) = self.leased(fd, s.gen, offset, data.len(), true);
        if let Some(file) = local {
            return local_pwrite(&file, data, offset, s.shm.as_ref()).map(Some);
        }
        // Without a region the client could not report what it writes
        // (its doorbell's `leased_bytes`): it asks for no write lease.
        if !ask || data.is_empty() || s.shm.is_none() || s.write_leases_refused.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX).min(IO_BYTES_MAX);
        // Asking changes nothing on disk: asked again after a break.
        let granted = self.on_fd(fd, true, |s, server| {
            self.note_send();
            match s.conn.call(&Request::WriteLease { fd: server, offset, len, at: LEASE_ONLY_AT, post: NO_POST }) {
                Ok(Reply::Lease(start, span, valid, lent)) => Ok(Some((s.gen, start, span, valid, lent))),
                Ok(_) => Ok(None),
                Err(e) if e.kind == ClientErrorKind::Server => {
                    if e.errno == libc::EOPNOTSUPP {
                        s.write_leases_refused.store(true, Ordering::Relaxed);
                    }
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        })?;
        match granted {
            Some((gen, start, span, valid, lent)) => match self.keep_lease(fd, gen, start, span, valid, lent) {
                Some(file) => local_pwrite(&file, data, offset, self.current().shm.as_ref()).map(Some),
                // Rare (threads racing on a handle's first lease): the
                // server writes this one.
                None => Ok(None),
            },
            None => {
                if let Some(h) = lock(&self.handles).get_mut(&fd.0) {
                    h.leases_off = true;
                }
                Ok(None)
            }
        }
    }

    /// Start a write; finish it with [`Client::wait_write`]. Under a write
    /// lease (`write_leased`) it is done here, and the ticket only says so.
    pub fn submit_write(&self, fd: Fd, data: &[u8], offset: u64) -> Result<Ticket> {
        writable_range(offset, data.len())?;
        let s = self.current();
        if data.len() > s.io_bytes_max {
            return Err(ClientError::invalid(format!("write of {} bytes exceeds io_bytes_max ({})", data.len(), s.io_bytes_max)));
        }
        if let Some(n) = self.write_leased(fd, data, offset)? {
            return Ok(Ticket { id: 0, session: self.current(), read: None, slot: None, local: None, done: Some(n) });
        }
        self.on_fd(fd, false, |s, server| {
            // A small write rides the socket with its header, unless the
            // region rings its requests (then it costs no send at all).
            let small = data.len() < shm::WRITE_MIN_BYTES && !s.shm.as_ref().is_some_and(|r| r.rings());
            let slot = if small { None } else { s.shm.as_ref().and_then(|r| r.take(data.len())) };
            let req = match &slot {
                Some(sl) => {
                    sl.fill(data);
                    Request::WriteShm { fd: server, offset, len: data.len() as u32, at: sl.at(), post: sl.arm() }
                }
                None => Request::Write { fd: server, offset, data },
            };
            self.note_send();
            let id = send_in(s, &req, slot.as_ref())?;
            Ok(Ticket { id, session: Arc::clone(s), read: None, slot, local: None, done: None })
        })
    }

    /// Bytes written; acknowledged only after the server's system call
    /// returned. A write whose connection broke fails with EIO (it may or
    /// may not have reached the disk) and is never sent twice.
    pub fn wait_write(&self, mut t: Ticket) -> Result<usize> {
        if let Some(n) = t.done {
            return Ok(n);
        }
        let r = t.session.conn.answer(t.id, t.slot.as_ref(), None);
        if let (Some(sl), Ok(_) | Err(ClientError { kind: ClientErrorKind::Server, .. })) = (t.slot.take(), &r) {
            sl.release();
        }
        self.written("write", &t.session, r)
    }

    /// The count a write's answer carries. A write whose connection broke
    /// is not sent again (it may have been carried out): the session
    /// reconnects for later calls and the write fails.
    fn written(&self, what: &str, session: &Session, r: Result<Reply>) -> Result<usize> {
        match r {
            Ok(Reply::Count(n)) => Ok(n as usize),
            Ok(r) => Err(unexpected(what, &r)),
            Err(e) => {
                if e.kind == ClientErrorKind::Disconnected {
                    self.recover(session)?;
                }
                Err(e)
            }
        }
    }

    fn io_bytes_max(&self) -> usize {
        self.current().io_bytes_max.max(1)
    }

    /// Read up to `buf.len()` bytes at `offset`; large reads are split (at
    /// the shared region's slot size, else at `io_bytes_max`) and
    /// pipelined. Inside a live cache lease, one local `pread`.
    pub fn pread(&self, fd: Fd, buf: &mut [u8], offset: u64) -> Result<usize> {
        if let Some(r) = self.pread_leased(fd, buf, offset) {
            self.lease_ahead(fd, offset, buf.len());
            return r;
        }
        match self.take_ahead(fd, offset, buf.len()) {
            Some(Ok(t)) => {
                if let Some(r) = self.wait_ahead(t, buf) {
                    return r;
                }
            }
            Some(Err(t)) => {
                let _ = self.wait_discard(t);
            }
            None => {}
        }
        // With a shared region, pieces of a slot each: every piece can
        // travel through the region or be answered with a lease.
        let chunk = if self.current().shm.is_some() { shm::SLOT_BYTES } else { self.io_bytes_max() };
        let mut tickets: Vec<(usize, Ticket)> = Vec::new();
        for at in (0..buf.len()).step_by(chunk) {
            match self.submit_read(fd, chunk.min(buf.len() - at), offset + at as u64) {
                Ok(t) => tickets.push((at, t)),
                Err(e) => {
                    // Those already sent are waited on (each holds its
                    // slot until answered), then the failure is told.
                    for (_, t) in tickets {
                        let _ = self.wait_discard(t);
                    }
                    return Err(e);
                }
            }
        }
        let mut total = 0;
        let mut short = false;
        let mut failed = None;
        // Every ticket is waited on, even after a failure: each holds its
        // slot of the shared region until answered.
        for (at, t) in tickets {
            let end = (at + chunk).min(buf.len());
            match self.wait_read(t, &mut buf[at..end]) {
                Ok(n) if !short => {
                    total += n;
                    short = n < end - at;
                }
                Ok(_) => {}
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        failed.map_or(Ok(total), Err)
    }

    /// Ask for the lease after the live one once a sequential reader is
    /// past its middle: the server's check of the next range
    /// (`cachestat`, about 8 µs per MiB on the 2-core VM, 16% of a 20 GB/s
    /// copy) then runs while this reader copies, instead of while it
    /// waits. One at a time per handle; only from the blocking `pread`.
    /// Only for a read that continued the one before: where the cached
    /// run ends the read ahead reaches the device, a whole slot of it,
    /// which a strided reader does not want and its next read then waits
    /// for (a 4 KiB x 32 strided decomposition of cold data through
    /// read-only handles ran 2-3x slower than with leases off).
    fn lease_ahead(&self, fd: Fd, offset: u64, len: usize) {
        let next = {
            let mut handles = lock(&self.handles);
            let Some(h) = handles.get_mut(&fd.0) else { return };
            let sequential = std::mem::replace(&mut h.read_end, offset.saturating_add(len as u64)) == offset;
            let Some((start, end, _)) = h.lease else { return };
            if !sequential || h.ahead.is_some() || h.leases_off || offset.saturating_add(len as u64) <= start + (end - start) / 2 {
                return;
            }
            end
        };
        let Ok(t) = self.submit_read(fd, shm::SLOT_BYTES, next) else { return };
        if t.local.is_some() {
            // Covered already: a local ticket sent nothing.
            return;
        }
        if t.slot.is_none() {
            // No slot free: it went as a plain read; take its answer.
            let _ = self.wait_discard(t);
            return;
        }
        let extra = {
            let mut handles = lock(&self.handles);
            match handles.get_mut(&fd.0) {
                Some(h) if h.ahead.is_none() => {
                    h.ahead = Some((next, t));
                    None
                }
                _ => Some(t),
            }
        };
        if let Some(t) = extra {
            // Another thread asked first, or the handle closed meanwhile.
            let _ = self.wait_discard(t);
        }
    }

    /// The lease asked for ahead on `fd`: `Ok` when it starts at `offset`
    /// and covers a read of `len` (at most a slot), `Err` when the reader
    /// went elsewhere (to be waited for and dropped, freeing its slot).
    /// (Also where this read ends: `Handle::read_end`.)
    fn take_ahead(&self, fd: Fd, offset: u64, len: usize) -> Option<std::result::Result<Ticket, Ticket>> {
        let mut handles = lock(&self.handles);
        let h = handles.get_mut(&fd.0)?;
        h.read_end = offset.saturating_add(len as u64);
        let (at, _) = h.ahead.as_ref()?;
        let usable = *at == offset && len <= shm::SLOT_BYTES;
        let (_, t) = h.ahead.take().expect("looked at");
        Some(if usable { Ok(t) } else { Err(t) })
    }

    /// The answer to a lease asked ahead (`lease_ahead`), used only when it
    /// is a lease: a lease is read from the page cache when it is used,
    /// but data was read when the server answered, perhaps long before,
    /// and a write acknowledged since (to any client) would not be in it.
    /// `None` (data, or anything else): dropped, and the caller reads
    /// afresh. Before, the data was served: a reader got the bytes a write
    /// had replaced, or the end of a file another client had since grown.
    fn wait_ahead(&self, mut t: Ticket, buf: &mut [u8]) -> Option<Result<usize>> {
        let want = t.read.map_or(buf.len(), |r| r.1.min(buf.len()));
        let slot = t.slot.take()?;
        match t.session.conn.answer(t.id, Some(&slot), None) {
            Ok(Reply::Lease(start, len, valid, lent)) => {
                slot.release();
                let (fd, _, offset) = t.read?;
                let file = self.keep_lease(fd, t.session.gen, start, len, valid, lent)?;
                Some(local_pread(&file, &mut buf[..want], offset))
            }
            // Answered otherwise: the server is done with the slot.
            Ok(_) | Err(ClientError { kind: ClientErrorKind::Server, .. }) => {
                slot.release();
                None
            }
            Err(_) => None,
        }
    }

    /// Wait for a read nobody wants any more, so that its slot is freed.
    fn wait_discard(&self, t: Ticket) -> Result<usize> {
        let len = t.read.map_or(0, |r| r.1);
        let mut scratch = vec![0u8; len];
        self.wait_read(t, &mut scratch)
    }

    /// The file behind read-only handle `fd` itself, when every page of it
    /// is in the page cache now: a duplicate of the descriptor the server
    /// lent for cache leases. When none was lent yet and `prime` is set, it
    /// is asked for first, with a read of the file's first bytes (which the
    /// server answers with a lease only if they are cached and it lends at
    /// all). The FUSE mount hands the file to the kernel (passthrough).
    /// `size`: the file's size, as the caller's `fstat` just found it.
    pub fn passthrough_file(&self, fd: Fd, size: u64, prime: bool) -> Result<Passthrough> {
        use std::os::fd::AsRawFd;
        if !self.opts.leases {
            return Ok(Passthrough::Unsuitable);
        }
        let lent = || -> Option<Option<Arc<Lent>>> {
            let h = lock(&self.handles);
            let h = h.get(&fd.0).filter(|h| h.flags & libc::O_ACCMODE == libc::O_RDONLY && !h.leases_off && h.dead.is_none())?;
            Some(h.lent.clone())
        };
        if lent().is_none() {
            return Ok(Passthrough::Unsuitable);
        }
        if size == 0 {
            return Ok(Passthrough::Unsuitable);
        }
        if lent().flatten().is_none() {
            if !prime {
                return Ok(Passthrough::NotLent);
            }
            let mut first = vec![0u8; size.min(4096) as usize];
            self.pread(fd, &mut first, 0)?;
        }
        let Some(l) = lent().flatten() else { return Ok(Passthrough::NotLent) };
        if !l.intact() {
            return Ok(Passthrough::Unsuitable);
        }
        match sluice_net::cache::all_cached(l.file.as_raw_fd(), 0, size) {
            Some(true) => Ok(Passthrough::File(
                l.file.try_clone().map_err(|e| ClientError::new(ClientErrorKind::Server, e.raw_os_error().unwrap_or(libc::EIO), format!("passthrough: {e}")))?,
            )),
            _ => Ok(Passthrough::NotCached),
        }
    }

    /// Read from the page cache under a live cache lease that covers
    /// `[offset, offset + buf.len())`, without any message and without
    /// waiting for the server; `None` when no live lease covers it (then
    /// [`Client::pread`], which may be answered with a new one). For
    /// callers that must not block, such as the FUSE mount's async threads.
    pub fn pread_leased(&self, fd: Fd, buf: &mut [u8], offset: u64) -> Option<Result<usize>> {
        let gen = self.current().gen;
        let (file, _) = self.leased(fd, gen, offset, buf.len(), false);
        file.map(|f| local_pread(&f, buf, offset))
    }

    /// Write all of `data` at `offset`; large writes are split and pipelined.
    /// Under a write lease (held, or asked for by the first piece:
    /// `submit_write`), each piece is a local `pwrite`.
    pub fn pwrite(&self, fd: Fd, data: &[u8], offset: u64) -> Result<usize> {
        writable_range(offset, data.len())?;
        self.pwrite_chunks(fd, data, offset)
    }

    /// `pwrite` through the server: `io_bytes_max` pieces, pipelined.
    fn pwrite_chunks(&self, fd: Fd, data: &[u8], offset: u64) -> Result<usize> {
        let chunk = self.io_bytes_max();
        let mut tickets: Vec<Ticket> = Vec::new();
        for (i, c) in data.chunks(chunk).enumerate() {
            match self.submit_write(fd, c, offset + (i * chunk) as u64) {
                Ok(t) => tickets.push(t),
                Err(e) => {
                    // As in `pread`: the writes already sent are waited on.
                    for t in tickets {
                        let _ = self.wait_write(t);
                    }
                    return Err(e);
                }
            }
        }
        // Every ticket is waited on, even after a failure (see `pread`).
        let results: Vec<Result<usize>> = tickets.into_iter().map(|t| self.wait_write(t)).collect();
        results.into_iter().sum()
    }

    /// SFIO's mread: read every `(offset, len)` piece, back to back, into
    /// `buf` with one message. Bytes past end of file read as zeros. The
    /// leading pieces that cache leases cover are read through the lent
    /// descriptor instead (as `write_list` does with write leases).
    pub fn read_list(&self, fd: Fd, pieces: &[(u64, u64)], buf: &mut [u8]) -> Result<usize> {
        self.read_list_in(fd, pieces, buf, None)
    }

    /// SFIO's mwrite: `data` holds the pieces back to back.
    pub fn write_list(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8]) -> Result<usize> {
        self.write_list_in(fd, pieces, data, None)
    }

    /// Start a list read ([`Client::read_list`]); finish it with
    /// [`Client::wait_read_list`]. One thread may keep several in flight,
    /// on one server or many (the striped client does).
    pub fn submit_read_list(&self, fd: Fd, pieces: &[(u64, u64)]) -> Result<ListTicket> {
        self.submit_read_list_in(fd, pieces, None)
    }

    /// [`Client::submit_read_list`] as one participant of a
    /// server-directed collective ([`Client::read_list_group`]).
    pub fn submit_read_list_group(&self, fd: Fd, pieces: &[(u64, u64)], group: Group) -> Result<ListTicket> {
        self.submit_read_list_in(fd, pieces, Some(group))
    }

    fn submit_read_list_in(&self, fd: Fd, pieces: &[(u64, u64)], group: Option<Group>) -> Result<ListTicket> {
        self.on_fd(fd, group.is_none(), |s, server| {
            let id = s.conn.send(&Request::ReadList { fd: server, pieces: pieces.to_vec(), group })?;
            let again = group.is_none().then(|| pieces.to_vec());
            Ok(ListTicket { id, session: Arc::clone(s), fd, pieces: again })
        })
    }

    /// The bytes of a submitted list read, back to back in `buf`. A read
    /// whose connection broke is sent again on the next one.
    pub fn wait_read_list(&self, t: ListTicket, buf: &mut [u8]) -> Result<usize> {
        match t.session.conn.wait(t.id, Some(&mut *buf)) {
            Err(e) if e.kind == ClientErrorKind::Disconnected && self.opts.recovery != Recovery::Off => {
                self.recover(&t.session)?;
                match t.pieces {
                    Some(pieces) => self.read_list(t.fd, &pieces, buf),
                    None => Err(e),
                }
            }
            r => data_into("read list", r?, buf),
        }
    }

    /// Start an `fstat`; finish it with [`Client::wait_fstat`] (so one
    /// thread can ask every object of a striped file at once).
    pub fn submit_fstat(&self, fd: Fd) -> Result<ListTicket> {
        self.on_fd(fd, true, |s, server| {
            let id = s.conn.send(&Request::Fstat { fd: server })?;
            Ok(ListTicket { id, session: Arc::clone(s), fd, pieces: None })
        })
    }

    /// The answer of a submitted `fstat` (asked again on a new connection
    /// if this one broke).
    pub fn wait_fstat(&self, t: ListTicket) -> Result<Stat> {
        match t.session.conn.wait(t.id, None) {
            Ok(Reply::Stat(st)) => Ok(st),
            Ok(r) => Err(unexpected("fstat", &r)),
            Err(e) if e.kind == ClientErrorKind::Disconnected && self.opts.recovery != Recovery::Off => {
                self.recover(&t.session)?;
                self.fstat(t.fd)
            }
            Err(e) => Err(e),
        }
    }

    /// Start a list write ([`Client::write_list`]); finish it with
    /// [`Client::wait_write_list`].
    pub fn submit_write_list(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8]) -> Result<ListTicket> {
        self.submit_write_list_in(fd, pieces, data, None)
    }

    /// [`Client::submit_write_list`] as one participant of a
    /// server-directed collective ([`Client::write_list_group`]).
    pub fn submit_write_list_group(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8], group: Group) -> Result<ListTicket> {
        self.submit_write_list_in(fd, pieces, data, Some(group))
    }

    fn submit_write_list_in(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8], group: Option<Group>) -> Result<ListTicket> {
        self.on_fd(fd, false, |s, server| {
            let id = s.conn.send(&Request::WriteList { fd: server, pieces: pieces.to_vec(), data, group })?;
            Ok(ListTicket { id, session: Arc::clone(s), fd, pieces: None })
        })
    }

    /// The bytes a submitted list write wrote. A write whose connection
    /// broke is not sent again (it may have been carried out): EIO.
    pub fn wait_write_list(&self, t: ListTicket) -> Result<usize> {
        self.written("write list", &t.session, t.session.conn.wait(t.id, None))
    }

    /// `read_list` as one participant of a server-directed collective: the
    /// server holds it until all `group.participants` messages of
    /// `group.id` on this file have come, then serves them together in
    /// disk order. ETIMEDOUT if they do not all come within the wait.
    pub fn read_list_group(&self, fd: Fd, pieces: &[(u64, u64)], buf: &mut [u8], group: Group) -> Result<usize> {
        self.read_list_in(fd, pieces, buf, Some(group))
    }

    /// `write_list` as one participant of a server-directed collective;
    /// nothing of the group is written unless all participants come.
    pub fn write_list_group(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8], group: Group) -> Result<usize> {
        self.write_list_in(fd, pieces, data, Some(group))
    }

    fn read_list_in(&self, fd: Fd, pieces: &[(u64, u64)], buf: &mut [u8], group: Option<Group>) -> Result<usize> {
        let total: u64 = pieces.iter().map(|p| p.1).sum();
        if total > buf.len() as u64 {
            return Err(ClientError::invalid(format!("buffer of {} bytes cannot hold {total} bytes of pieces", buf.len())));
        }
        let (done, rest) = if group.is_none() { self.read_list_leased(fd, pieces, buf)? } else { (0, 0) };
        if rest == pieces.len() {
            return Ok(done);
        }
        let (pieces, buf) = (&pieces[rest..], &mut buf[done..]);
        // A collective's read is not sent again after a break: it would
        // count twice in its group.
        self.on_fd(fd, group.is_none(), |s, server| {
            let id = s.conn.send(&Request::ReadList { fd: server, pieces: pieces.to_vec(), group })?;
            let r = s.conn.wait(id, Some(&mut *buf))?;
            data_into("read list", r, buf)
        })
        .map(|n| done + n)
    }

    /// The leading pieces of a list read that cache leases cover, read
    /// through the lent descriptor: each inside a live lease locally, else
    /// (one that fits a slot) with `pread`, whose answer brings a lease for
    /// those after it when their range is cached. Such a try follows only
    /// the call's start or a piece read under a lease: where the data is
    /// not cached, the rest go as one list message, not one request a
    /// piece. Bytes past end of file read as zeros, as the list message's
    /// do. `(bytes of buf filled, pieces done)`.
    fn read_list_leased(&self, fd: Fd, pieces: &[(u64, u64)], buf: &mut [u8]) -> Result<(usize, usize)> {
        let s = self.current();
        let (mut at, mut may_ask) = (0usize, true);
        for (i, &(offset, len)) in pieces.iter().enumerate() {
            let Some(part) = buf.get_mut(at..at.saturating_add(len as usize)) else { return Ok((at, i)) };
            let n = match self.leased(fd, s.gen, offset, part.len(), false) {
                (Some(file), _) => {
                    may_ask = true;
                    local_pread(&file, part, offset)?
                }
                (None, true) if may_ask && s.shm.is_some() && part.len() <= shm::SLOT_BYTES => {
                    may_ask = false;
                    self.pread(fd, part, offset)?
                }
                _ => return Ok((at, i)),
            };
            part[n..].fill(0);
            at += part.len();
        }
        Ok((at, pieces.len()))
    }

    fn write_list_in(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8], group: Option<Group>) -> Result<usize> {
        let (done, at, rest) = if group.is_none() { self.write_list_leased(fd, pieces, data)? } else { (0, 0, 0) };
        if rest == pieces.len() {
            return Ok(done);
        }
        let (pieces, data) = (&pieces[rest..], &data[at..]);
        let req = |server| Request::WriteList { fd: server, pieces: pieces.to_vec(), data, group };
        match self.on_fd(fd, false, |s, server| s.conn.call(&req(server)))? {
            Reply::Count(n) => Ok(done + n as usize),
            r => Err(unexpected("write list", &r)),
        }
    }

    /// The leading pieces of a list write that write leases cover, written
    /// through the lent descriptor (`write_leased`: the first asks for the
    /// lease, which covers the whole file). `(bytes written, bytes of data
    /// used, pieces done)`; the rest go as one list message.
    fn write_list_leased(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8]) -> Result<(usize, usize, usize)> {
        let (mut done, mut at) = (0usize, 0usize);
        for (i, &(offset, len)) in pieces.iter().enumerate() {
            let Some(part) = data.get(at..at.saturating_add(len as usize)) else { return Ok((done, at, i)) };
            match self.write_leased(fd, part, offset)? {
                Some(n) => done += n,
                None => return Ok((done, at, i)),
            }
            at += part.len();
        }
        Ok((done, at, pieces.len()))
    }

    /// Send `req` on `fd`'s server handle, answered `Ok`; asked again on a
    /// new connection if `idempotent`.
    fn fd_ok(&self, what: &str, idempotent: bool, fd: Fd, req: impl Fn(u64) -> Request<'static>) -> Result<()> {
        match self.on_fd(fd, idempotent, |s, server| s.conn.call(&req(server)))? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(what, &r)),
        }
    }

    /// Flush data and metadata to stable storage.
    pub fn fsync(&self, fd: Fd) -> Result<()> {
        self.fd_ok("fsync", false, fd, |fd| Request::Fsync { fd })
    }

    pub fn fdatasync(&self, fd: Fd) -> Result<()> {
        self.fd_ok("fdatasync", false, fd, |fd| Request::Fdatasync { fd })
    }

    pub fn ftruncate(&self, fd: Fd, len: u64) -> Result<()> {
        self.fd_ok("ftruncate", false, fd, |fd| Request::Ftruncate { fd, len })
    }

    pub fn stat(&self, path: &str) -> Result<Stat> {
        match self.with_session(true, |s| s.conn.call(&Request::Stat { path }))? {
            Reply::Stat(st) => Ok(st),
            r => Err(unexpected("stat", &r)),
        }
    }

    /// `stat` of a final symbolic link itself (`lstat(2)`): its kind is
    /// `S_IFLNK`.
    pub fn lstat(&self, path: &str) -> Result<Stat> {
        match self.with_session(true, |s| s.conn.call(&Request::Lstat { path }))? {
            Reply::Stat(st) => Ok(st),
            r => Err(unexpected("lstat", &r)),
        }
    }

    /// The target of the symbolic link at `path` (`readlink(2)`; EINVAL
    /// when it is not one).
    pub fn readlink(&self, path: &str) -> Result<String> {
        match self.with_session(true, |s| s.conn.call(&Request::Readlink { path }))? {
            Reply::Link(t) => Ok(t),
            r => Err(unexpected("readlink", &r)),
        }
    }

    pub fn fstat(&self, fd: Fd) -> Result<Stat> {
        match self.on_fd(fd, true, |s, server| s.conn.call(&Request::Fstat { fd: server }))? {
            Reply::Stat(st) => Ok(st),
            r => Err(unexpected("fstat", &r)),
        }
    }

    /// Reserve `len` bytes at the end of `fd`'s file for an `O_APPEND`
    /// write: the offset where they start, which no other reservation on
    /// the server overlaps. The caller writes there. Not asked again after
    /// a broken connection (the first may have been made).
    pub fn reserve(&self, fd: Fd, len: u64) -> Result<u64> {
        match self.on_fd(fd, false, |s, server| s.conn.call(&Request::Reserve { fd: server, len }))? {
            Reply::Count(at) => Ok(at),
            r => Err(unexpected("reserve", &r)),
        }
    }

    pub fn unlink(&self, path: &str) -> Result<()> {
        self.ok("unlink", false, &Request::Unlink { path })
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.ok("rename", false, &Request::Rename { from, to })
    }

    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        self.ok("mkdir", false, &Request::Mkdir { path, mode })
    }

    /// Change `path`'s mode (`SETATTR_MODE_KEEP`: not) and times
    /// (nanoseconds since the epoch, or `SETATTR_TIME_OMIT` /
    /// `SETATTR_TIME_NOW`); `nofollow` acts on a final link itself.
    pub fn set_attr(&self, path: &str, mode: u32, atime_ns: i64, mtime_ns: i64, nofollow: bool) -> Result<()> {
        self.ok("setattr", true, &Request::SetAttr { fd: sluice_proto::SETATTR_BY_PATH, path, mode, atime_ns, mtime_ns, nofollow })
    }

    /// [`Client::set_attr`] on an open file (`fchmod`, `futimens`).
    pub fn fset_attr(&self, fd: Fd, mode: u32, atime_ns: i64, mtime_ns: i64) -> Result<()> {
        self.fd_ok("fsetattr", true, fd, |fd| Request::SetAttr { fd, path: "", mode, atime_ns, mtime_ns, nofollow: false })
    }

    /// A symbolic link at `path` holding `target` (`symlink(2)`).
    pub fn symlink(&self, target: &str, path: &str) -> Result<()> {
        self.ok("symlink", false, &Request::Symlink { target, path })
    }

    pub fn rmdir(&self, path: &str) -> Result<()> {
        self.ok("rmdir", false, &Request::Rmdir { path })
    }

    /// Every entry of directory `path` but `.` and `..`, sorted by name.
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        self.with_session(true, |s| {
            let mut all = Vec::new();
            loop {
                match s.conn.call(&Request::Readdir { path, start: all.len() as u32 })? {
                    Reply::Dir(entries, done) => {
                        let empty = entries.is_empty();
                        all.extend(entries);
                        if done || empty {
                            return Ok(all);
                        }
                    }
                    r => return Err(unexpected("readdir", &r)),
                }
            }
        })
    }

    /// Per-application counters of the server.
    pub fn server_stats(&self) -> Result<ServerStats> {
        match self.with_session(true, |s| s.conn.call(&Request::Stats))? {
            Reply::Stats(apps) => Ok(ServerStats { apps }),
            r => Err(unexpected("stats", &r)),
        }
    }

    fn position(&self, fd: Fd) -> Result<Position> {
        lock(&self.handles).get(&fd.0).map(|h| h.pos).ok_or_else(|| bad_handle(fd))
    }

    fn set_position(&self, fd: Fd, at: u64) {
        if let Some(h) = lock(&self.handles).get_mut(&fd.0) {
            h.pos.at = at;
        }
    }

    /// Read at the file position and advance it.
    pub fn read(&self, fd: Fd, buf: &mut [u8]) -> Result<usize> {
        let at = self.position(fd)?.at;
        let n = self.pread(fd, buf, at)?;
        self.set_position(fd, at + n as u64);
        Ok(n)
    }

    /// Write at the file position (at the end with `O_APPEND`: the server
    /// hands it out, [`Client::reserve`]) and advance it.
    pub fn write(&self, fd: Fd, data: &[u8]) -> Result<usize> {
        let p = self.position(fd)?;
        let at = if p.append && !data.is_empty() { self.reserve(fd, data.len() as u64)? } else { p.at };
        let n = self.pwrite(fd, data, at)?;
        self.set_position(fd, at + n as u64);
        Ok(n)
    }

    /// Move the file position; the new position.
    pub fn lseek(&self, fd: Fd, offset: i64, whence: Whence) -> Result<u64> {
        let base = match whence {
            Whence::Set => 0,
            Whence::Cur => self.position(fd)?.at as i64,
            Whence::End => self.fstat(fd)?.size as i64,
        };
        let at = base.checked_add(offset).filter(|&a| a >= 0).ok_or_else(|| ClientError::invalid("lseek to a negative position"))?;
        self.position(fd)?;
        self.set_position(fd, at as u64);
        Ok(at as u64)
    }
}

/// `EFBIG` for a write that would end past the largest file offset
/// (`off_t`'s, 2^63 - 1), as `pwrite(2)` says, before anything is sent: the
/// server refused such a frame and closed the connection, and the caller
/// saw "connection lost" (EIO).
fn writable_range(offset: u64, len: usize) -> Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= i64::MAX as u64 => Ok(()),
        _ => Err(ClientError::new(ClientErrorKind::Invalid, libc::EFBIG, format!("a write of {len} bytes at offset {offset} ends past the largest file offset (2^63 - 1)"))),
    }
}

#[cfg(test)]
mod app_id_tests {
    use super::app_id;

    #[test]
    fn app_id_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        assert_eq!(app_id(env(&[("SLUICE_APP", "climate"), ("SLURM_JOB_ID", "7"), ("PMIX_NAMESPACE", "ns")]), "cat", 42), "climate");
        assert_eq!(app_id(env(&[("SLURM_JOB_ID", "7"), ("PMIX_NAMESPACE", "ns")]), "cat", 42), "slurm-7");
        assert_eq!(app_id(env(&[("PMIX_NAMESPACE", "prterun-h-1234@1"), ("OMPI_MCA_ess_base_jobid", "9")]), "python3", 42), "mpi-prterun-h-1234@1");
        assert_eq!(app_id(env(&[("OMPI_MCA_ess_base_jobid", "9")]), "python3", 42), "mpi-9");
        assert_eq!(app_id(env(&[("SLUICE_APP", "")]), "cat", 42), "cat-42", "an empty value is not set");
        assert_eq!(app_id(env(&[]), "", 7), "unknown-7");
    }
}

#[cfg(test)]
mod lent_tests {
    use super::*;

    #[test]
    fn lent_descriptors_bound_at_n_and_n_plus_one() {
        let held = AtomicUsize::new(0);
        for _ in 0..16 {
            assert!(take_one(&held, 16));
        }
        assert!(!take_one(&held, 16), "N+1 refused");
        assert_eq!(held.load(Ordering::Acquire), 16, "a refusal takes nothing");
        held.fetch_sub(1, Ordering::AcqRel);
        assert!(take_one(&held, 16), "one given back makes room");
        assert!(lent_max() >= 16);
    }
}
