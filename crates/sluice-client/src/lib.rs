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
//! `Client`'s methods live by concern: `session` (dialling, recovery),
//! `io` (handles, reads and writes), `lent` (lent descriptors and leases),
//! `readahead`, `passthrough`, `list` (list I/O), `namespace` (names and
//! attributes), `posix` (file positions) and `env` (environment and
//! identity); `conn` is one connection (its receiving side in
//! `conn/recv.rs`) and `shm` the shared-memory data path.
//!
//! Invariant: no call waits on a silent server longer than `timeout`
//! without saying so (hard) or failing (soft); a write is never sent twice.

mod abandon;
mod conn;
mod env;
mod error;
mod ids;
mod io;
mod lent;
mod list;
mod namespace;
mod passthrough;
mod posix;
mod readahead;
mod session;
mod shm;

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

pub use abandon::{sleep as abandonable_sleep, Abandon, CHECK_EVERY as ABANDON_CHECK_EVERY};
pub use env::{app_id, default_app, own_cred, server_addr};
pub use error::{ClientError, ClientErrorKind, Result};
pub use ids::ThreadIds;
pub use lent::lent_held;
pub use passthrough::Passthrough;
pub use sluice_proto::{
    AppStats, Cred, DirEntry, FileKind, Group, WireStat as Stat, WireStatfs as Statfs, CRED_GROUPS_MAX, SETATTR_MODE_KEEP, SETATTR_TIME_NOW, SETATTR_TIME_OMIT,
};

use conn::{Conn, Patience, Reply};
use lent::local_pread;
use session::{data_into, send_in, unexpected, REOPEN_FLAGS_DROPPED};
use sluice_proto::{auth_mac, encode_request, Hello, Request, HEADER_BYTES, IO_BYTES_MAX, LEASE_ONLY_AT, NO_POST, VERSION};

/// Environment variable naming the server address.
pub const SERVER_ENV: &str = "SLUICE_SERVER";
/// Environment variable naming the application.
pub const APP_ENV: &str = "SLUICE_APP";
/// Environment variable: the local directory that stands for the server
/// root under the interposer (`sluice run --prefix`).
pub const PREFIX_ENV: &str = "SLUICE_PREFIX";
/// Environment variable: seconds before a silent server is reported (or,
/// soft, fails the call).
pub const TIMEOUT_ENV: &str = "SLUICE_TIMEOUT";
/// Environment variable: `1` makes clients soft (ETIMEDOUT at the timeout).
pub const SOFT_ENV: &str = "SLUICE_SOFT";
/// Environment variable: `0` turns cache leases off (every read goes
/// through the server).
pub const LEASES_ENV: &str = "SLUICE_LEASES";
/// Environment variable: the uid a server on a Unix socket may run as
/// besides root (default: this process's effective uid); a server of any
/// other uid is refused before anything is sent (`sluice_net::Stream::check_server`).
pub const SERVER_UID_ENV: &str = "SLUICE_SERVER_UID";
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
    /// As `Off`, and a silent server fails the call with ETIMEDOUT at
    /// `timeout` (the connection is abandoned): a member of a forwarder
    /// set, whose caller then moves the file to another member.
    Failover,
}

impl Recovery {
    /// Whether a broken connection is dialled again (`Hard`, `Soft`).
    pub fn reconnects(self) -> bool {
        matches!(self, Recovery::Hard | Recovery::Soft)
    }
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
    /// The uid a server on a Unix socket may run as besides root; `None`:
    /// `SLUICE_SERVER_UID`, else this process's effective uid. A server of
    /// another uid is refused (EACCES) before the client sends anything.
    pub server_uid: Option<u32>,
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
            server_uid: std::env::var(SERVER_UID_ENV).ok().and_then(|v| v.trim().parse().ok()),
            recovery: if soft { Recovery::Soft } else { Recovery::Hard },
            timeout: Duration::from_secs(timeout_s),
            shm: std::env::var(shm::SHM_ENV).map_or(true, |v| v != "0"),
            leases: std::env::var(LEASES_ENV).map_or(true, |v| v != "0"),
            post: std::env::var(shm::POST_ENV).map_or(true, |v| v != "0"),
            ring: std::env::var(shm::RING_ENV).map_or(true, |v| v != "0"),
        }
    }
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
