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
//! Invariant: a call never hangs on a dead server; when the connection
//! breaks, every request in flight fails with kind `Disconnected`, errno EIO.

mod conn;
mod error;

use std::collections::HashMap;
use std::sync::Mutex;

pub use error::{ClientError, ClientErrorKind, Result};
pub use sluice_proto::{AppStats, Cred, DirEntry, FileKind, WireStat as Stat, CRED_GROUPS_MAX};

use conn::{Conn, Reply};
use sluice_proto::{auth_mac, encode_request, Hello, Request, HEADER_BYTES, IO_BYTES_MAX, VERSION};

/// Environment variable naming the server address.
pub const SERVER_ENV: &str = "SLUICE_SERVER";
/// Environment variable naming the application.
pub const APP_ENV: &str = "SLUICE_APP";

/// A file handle on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fd(pub u64);

/// A request in flight, to be waited on once.
#[derive(Debug)]
#[must_use = "a submitted request must be waited on"]
pub struct Ticket(u64);

/// How to identify this client to the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Application id; `None`: [`default_app`].
    pub app: Option<String>,
    /// QoS weight, 1 = default.
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
}

impl Default for ConnectOptions {
    fn default() -> ConnectOptions {
        ConnectOptions { app: None, weight: 1, client_id: None, cred: None, key_file: None }
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

/// `SLUICE_APP`, else `slurm-$SLURM_JOB_ID`, else program name and session id.
pub fn default_app() -> String {
    if let Ok(a) = std::env::var(APP_ENV) {
        if !a.is_empty() {
            return a;
        }
    }
    if let Ok(j) = std::env::var("SLURM_JOB_ID") {
        if !j.is_empty() {
            return format!("slurm-{j}");
        }
    }
    let prog = std::env::args().next().and_then(|a| std::path::Path::new(&a).file_name().map(|f| f.to_string_lossy().into_owned())).unwrap_or_else(|| "unknown".into());
    // SAFETY: getsid(0) only reads the caller's session id.
    let sid = unsafe { libc::getsid(0) };
    format!("{prog}-{sid}")
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

/// A connection to a sluice server. See the crate documentation.
pub struct Client {
    /// Boxed: keeps `Client` small enough to sit in enums by value.
    conn: Box<Conn>,
    app: String,
    io_bytes_max: usize,
    positions: Mutex<HashMap<u64, Position>>,
}

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

impl Client {
    /// Connect with the default options.
    pub fn connect(addr: &str) -> Result<Client> {
        Client::connect_with(addr, ConnectOptions::default())
    }

    /// Connect and perform the handshake, proving the key when the server
    /// asks for it.
    pub fn connect_with(addr: &str, opts: ConnectOptions) -> Result<Client> {
        let conn = Box::new(Conn::open(addr)?);
        let app = opts.app.unwrap_or_else(default_app);
        let cred = opts.cred.clone().or_else(|| conn.is_tcp().then(own_cred));
        let hello = Request::Hello(Hello { version: VERSION, app: &app, weight: opts.weight, client_id: opts.client_id.unwrap_or_else(std::process::id), cred });
        let refused = |e: ClientError| ClientError::new(ClientErrorKind::Connect, e.errno, format!("sluice server at {addr} refused the connection: {}", e.message));
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
        let io_bytes_max = ok.io_bytes_max.min(IO_BYTES_MAX) as usize;
        Ok(Client { conn, app, io_bytes_max, positions: Mutex::new(HashMap::new()) })
    }

    /// The application id this client declared.
    pub fn app(&self) -> &str {
        &self.app
    }

    fn ok(&self, what: &str, req: &Request<'_>) -> Result<()> {
        match self.conn.call(req)? {
            Reply::Ok => Ok(()),
            r => Err(unexpected(what, &r)),
        }
    }

    /// Open `path` (relative to the server root) with `open(2)` flags.
    pub fn open(&self, path: &str, flags: i32, mode: u32) -> Result<Fd> {
        match self.conn.call(&Request::Open { path, flags, mode })? {
            Reply::Fd(fd) => {
                let p = Position { at: 0, append: flags & libc::O_APPEND != 0 };
                self.positions.lock().unwrap_or_else(|p| p.into_inner()).insert(fd, p);
                Ok(Fd(fd))
            }
            r => Err(unexpected("open", &r)),
        }
    }

    pub fn close(&self, fd: Fd) -> Result<()> {
        self.positions.lock().unwrap_or_else(|p| p.into_inner()).remove(&fd.0);
        self.ok("close", &Request::Close { fd: fd.0 })
    }

    /// Start a read of `len` bytes at `offset` (at most the server's
    /// `io_bytes_max`); finish it with [`Client::wait_read`].
    pub fn submit_read(&self, fd: Fd, len: usize, offset: u64) -> Result<Ticket> {
        if len > self.io_bytes_max {
            return Err(ClientError::invalid(format!("read of {len} bytes exceeds io_bytes_max ({})", self.io_bytes_max)));
        }
        Ok(Ticket(self.conn.send(&Request::Read { fd: fd.0, offset, len: len as u32 })?))
    }

    /// Bytes read into `buf` (fewer than asked at end of file).
    pub fn wait_read(&self, t: Ticket, buf: &mut [u8]) -> Result<usize> {
        let r = self.conn.wait(t.0, Some(buf))?;
        data_into("read", r, buf)
    }

    /// Start a write; finish it with [`Client::wait_write`].
    pub fn submit_write(&self, fd: Fd, data: &[u8], offset: u64) -> Result<Ticket> {
        if data.len() > self.io_bytes_max {
            return Err(ClientError::invalid(format!("write of {} bytes exceeds io_bytes_max ({})", data.len(), self.io_bytes_max)));
        }
        Ok(Ticket(self.conn.send(&Request::Write { fd: fd.0, offset, data })?))
    }

    /// Bytes written; acknowledged only after the server's system call
    /// returned.
    pub fn wait_write(&self, t: Ticket) -> Result<usize> {
        match self.conn.wait(t.0, None)? {
            Reply::Count(n) => Ok(n as usize),
            r => Err(unexpected("write", &r)),
        }
    }

    /// Read up to `buf.len()` bytes at `offset`; large reads are split at
    /// `io_bytes_max` and pipelined.
    pub fn pread(&self, fd: Fd, buf: &mut [u8], offset: u64) -> Result<usize> {
        let chunk = self.io_bytes_max.max(1);
        let tickets: Vec<(usize, Ticket)> =
            (0..buf.len()).step_by(chunk).map(|at| Ok((at, self.submit_read(fd, chunk.min(buf.len() - at), offset + at as u64)?))).collect::<Result<_>>()?;
        let mut total = 0;
        let mut short = false;
        for (at, t) in tickets {
            let end = (at + chunk).min(buf.len());
            let n = self.wait_read(t, &mut buf[at..end])?;
            if !short {
                total += n;
                short = n < end - at;
            }
        }
        Ok(total)
    }

    /// Write all of `data` at `offset`; large writes are split and pipelined.
    pub fn pwrite(&self, fd: Fd, data: &[u8], offset: u64) -> Result<usize> {
        let chunk = self.io_bytes_max.max(1);
        let tickets: Vec<Ticket> = data.chunks(chunk).enumerate().map(|(i, c)| self.submit_write(fd, c, offset + (i * chunk) as u64)).collect::<Result<_>>()?;
        tickets.into_iter().map(|t| self.wait_write(t)).sum()
    }

    /// SFIO's mread: read every `(offset, len)` piece, back to back, into
    /// `buf` with one message. Bytes past end of file read as zeros.
    pub fn read_list(&self, fd: Fd, pieces: &[(u64, u64)], buf: &mut [u8]) -> Result<usize> {
        let total: u64 = pieces.iter().map(|p| p.1).sum();
        if total > buf.len() as u64 {
            return Err(ClientError::invalid(format!("buffer of {} bytes cannot hold {total} bytes of pieces", buf.len())));
        }
        let id = self.conn.send(&Request::ReadList { fd: fd.0, pieces: pieces.to_vec() })?;
        let r = self.conn.wait(id, Some(buf))?;
        data_into("read list", r, buf)
    }

    /// SFIO's mwrite: `data` holds the pieces back to back.
    pub fn write_list(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8]) -> Result<usize> {
        match self.conn.call(&Request::WriteList { fd: fd.0, pieces: pieces.to_vec(), data })? {
            Reply::Count(n) => Ok(n as usize),
            r => Err(unexpected("write list", &r)),
        }
    }

    /// Flush data and metadata to stable storage.
    pub fn fsync(&self, fd: Fd) -> Result<()> {
        self.ok("fsync", &Request::Fsync { fd: fd.0 })
    }

    pub fn fdatasync(&self, fd: Fd) -> Result<()> {
        self.ok("fdatasync", &Request::Fdatasync { fd: fd.0 })
    }

    pub fn ftruncate(&self, fd: Fd, len: u64) -> Result<()> {
        self.ok("ftruncate", &Request::Ftruncate { fd: fd.0, len })
    }

    fn stat_reply(&self, what: &str, req: &Request<'_>) -> Result<Stat> {
        match self.conn.call(req)? {
            Reply::Stat(s) => Ok(s),
            r => Err(unexpected(what, &r)),
        }
    }

    pub fn stat(&self, path: &str) -> Result<Stat> {
        self.stat_reply("stat", &Request::Stat { path })
    }

    pub fn fstat(&self, fd: Fd) -> Result<Stat> {
        self.stat_reply("fstat", &Request::Fstat { fd: fd.0 })
    }

    pub fn unlink(&self, path: &str) -> Result<()> {
        self.ok("unlink", &Request::Unlink { path })
    }

    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        self.ok("rename", &Request::Rename { from, to })
    }

    pub fn mkdir(&self, path: &str, mode: u32) -> Result<()> {
        self.ok("mkdir", &Request::Mkdir { path, mode })
    }

    pub fn rmdir(&self, path: &str) -> Result<()> {
        self.ok("rmdir", &Request::Rmdir { path })
    }

    /// Every entry of directory `path` but `.` and `..`, sorted by name.
    pub fn readdir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let mut all = Vec::new();
        loop {
            match self.conn.call(&Request::Readdir { path, start: all.len() as u32 })? {
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
    }

    /// Per-application counters of the server.
    pub fn server_stats(&self) -> Result<ServerStats> {
        match self.conn.call(&Request::Stats)? {
            Reply::Stats(apps) => Ok(ServerStats { apps }),
            r => Err(unexpected("stats", &r)),
        }
    }

    fn position(&self, fd: Fd) -> Result<Position> {
        let p = self.positions.lock().unwrap_or_else(|p| p.into_inner()).get(&fd.0).copied();
        p.ok_or_else(|| ClientError::new(ClientErrorKind::Invalid, libc::EBADF, format!("bad file handle {}", fd.0)))
    }

    fn set_position(&self, fd: Fd, at: u64) {
        if let Some(p) = self.positions.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&fd.0) {
            p.at = at;
        }
    }

    /// Read at the file position and advance it.
    pub fn read(&self, fd: Fd, buf: &mut [u8]) -> Result<usize> {
        let at = self.position(fd)?.at;
        let n = self.pread(fd, buf, at)?;
        self.set_position(fd, at + n as u64);
        Ok(n)
    }

    /// Write at the file position (at the end with `O_APPEND`, which this
    /// client emulates: not atomic against other writers) and advance it.
    pub fn write(&self, fd: Fd, data: &[u8]) -> Result<usize> {
        let p = self.position(fd)?;
        let at = if p.append { self.fstat(fd)?.size } else { p.at };
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
