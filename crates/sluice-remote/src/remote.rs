//! `Remote`: whatever a sluice address names — one server, a cluster's
//! metadata role (or several sharing one store), or a forwarder set
//! (`forward.rs`) — behind one set of calls shaped like the single-server
//! client's (`u64` handles, `Stat`, `DirEntry`, errors with an errno).
//! The FUSE mount, the interposer and the `cp`/`ls` commands use it, so
//! unmodified programs see a striped file as one file.
//!
//! Which one an address is, is asked, not configured: `connect` says
//! `Hello` in the data protocol; a metadata role answers with errno
//! `CLUSTER_ERRNO`, and the connection is made again as a `StripedClient`.
//! An address list (`a,b`) asks its first member that answers: a list of
//! metadata roles is one cluster, a list of servers a forwarder set.
//!
//! A cluster's open files live in a table of at most `REMOTE_FILES_MAX`
//! entries (one more `open` fails with ENFILE); a handle is a number that
//! is never reused by this `Remote`. An open directory (`O_RDONLY`, as
//! `open(dir)` and `fstat`/`fchdir` want) is a handle too; reading it is
//! EISDIR. Sequential readers get a read-ahead window of one stripe row
//! (`ahead`), so a reader limited to 1 MiB requests (the FUSE mount) still
//! keeps every data server busy.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use sluice_client::{Client, ClientError, ClientErrorKind, ConnectOptions, DirEntry, Fd, FileKind, Group, Stat, Statfs};
use sluice_stripe::{file_size, Layout, LayoutRequest};

use crate::ahead::{Budget, OpenFile, READ_AHEAD_TOTAL_MAX};
use crate::client::StripedClient;
use crate::error::{Error, ErrorKind};
use crate::forward::{address_set, Forwarders};
use crate::proto::CLUSTER_ERRNO;
use sluice_proto::meta::{Entry, EntryKind};

/// Open files (and directories) of one cluster `Remote` at once.
pub const REMOTE_FILES_MAX: usize = 65_536;
/// Largest `st_blksize` reported for a striped file: one full stripe row
/// (a read of it reaches every server at once), at most this.
pub const STRIPED_BLKSIZE_MAX: u64 = 16 << 20;

/// A collective list message in flight ([`Remote::submit_list_group`]).
pub struct GroupTicket {
    /// A cluster file's object client (`None`: the one server's).
    client: Option<Arc<Client>>,
    ticket: sluice_client::ListTicket,
    write: bool,
    /// A cluster file written: its read-ahead is stale once the answer came.
    written: Option<Arc<OpenFile>>,
}

/// The result type of `Remote`: the single-server client's error.
pub type RemoteResult<T> = std::result::Result<T, ClientError>;

/// Which kind of address a `Remote` talks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteKind {
    /// One `sluice serve`.
    Server,
    /// A cluster: a metadata role and its data servers.
    Cluster,
    /// Several servers over one shared root, one home per file
    /// (`forward`): an address list `a,b,c`.
    Forwarders,
}

/// A connection to one sluice address.
pub enum Remote {
    Server(Client),
    Cluster(Cluster),
    Forwarders(Forwarders),
}

/// A cluster connection and its open-file table.
pub struct Cluster {
    client: StripedClient,
    files: Mutex<Files>,
    files_max: usize,
    /// Read-ahead bytes held by all open files (see `ahead`).
    ahead: Budget,
}

struct Files {
    open: HashMap<u64, Handle>,
    next: u64,
    /// Each open file's write generation, shared by its handles
    /// (`ahead::OpenFile::changed`), by file id. An entry outlives its
    /// last handle until the table reaches `files_max`, when dead ones
    /// are dropped: at most `files_max` + 1 entries.
    generations: HashMap<u64, Weak<AtomicU64>>,
}

/// An open file stays alive while a call uses it, even if another thread
/// closes its handle meanwhile (the `Arc`).
#[derive(Clone)]
enum Handle {
    File(Arc<OpenFile>),
    Dir(Stat),
}

/// A cluster error as the client library's: same errno and message.
impl From<Error> for ClientError {
    fn from(e: Error) -> ClientError {
        let kind = match e.kind {
            ErrorKind::Invalid => ClientErrorKind::Invalid,
            ErrorKind::DataServer | ErrorKind::Meta if e.errno == libc::ECONNREFUSED => ClientErrorKind::Connect,
            ErrorKind::DataServer | ErrorKind::Meta if e.errno == libc::EIO => ClientErrorKind::Disconnected,
            _ => ClientErrorKind::Server,
        };
        ClientError { kind, errno: e.errno, message: e.message }
    }
}

fn err(errno: i32, message: impl Into<String>) -> ClientError {
    ClientError { kind: ClientErrorKind::Server, errno, message: message.into() }
}

/// The stat of a striped file from its objects' stats (object order):
/// the size by `file_size`, blocks summed, the latest times, object 0's
/// permissions and owner, the file id as inode number.
pub fn file_stat(id: u64, layout: &Layout, objects: &[Stat]) -> Stat {
    let sizes: Vec<u64> = objects.iter().map(|s| s.size).collect();
    let first = objects.first().copied().unwrap_or_default();
    let row = layout.stripe_bytes.saturating_mul(u64::from(layout.count));
    Stat {
        size: file_size(layout, &sizes),
        mode: libc::S_IFREG | (first.mode & 0o7777),
        nlink: 1,
        uid: first.uid,
        gid: first.gid,
        ino: id,
        blocks: objects.iter().map(|s| s.blocks).sum(),
        blksize: row.clamp(4096, STRIPED_BLKSIZE_MAX) as u32,
        atime_ns: objects.iter().map(|s| s.atime_ns).max().unwrap_or(0),
        mtime_ns: objects.iter().map(|s| s.mtime_ns).max().unwrap_or(0),
        ctime_ns: objects.iter().map(|s| s.ctime_ns).max().unwrap_or(0),
    }
}

/// The stat of a namespace directory: owned by the caller, 0755, its
/// entry's change time, an inode number from its path (high bit set, so
/// never a file id).
fn dir_stat(path: &str, e: &Entry) -> Stat {
    // FNV-1a: stable across runs and processes.
    let path = crate::entry::normalize(path).unwrap_or_default();
    let hash = path.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    // SAFETY: geteuid/getegid have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    Stat {
        size: 4096,
        mode: libc::S_IFDIR | 0o755,
        nlink: 2,
        uid,
        gid,
        ino: hash | 1 << 63,
        blocks: 8,
        blksize: 4096,
        atime_ns: e.mtime_ns,
        mtime_ns: e.mtime_ns,
        ctime_ns: e.mtime_ns,
    }
}

impl Remote {
    /// Connect to `addr` (`unix:PATH` or `tcp:HOST:PORT`) with default
    /// options, whichever kind it is.
    pub fn connect(addr: &str) -> RemoteResult<Remote> {
        Remote::connect_with(addr, ConnectOptions::default())
    }

    /// Connect, asking the address which kind it is.
    pub fn connect_with(addr: &str, opts: ConnectOptions) -> RemoteResult<Remote> {
        if let Some(members) = address_set(addr) {
            // A list of metadata roles (sharing one store) is one cluster;
            // a list of servers is a forwarder set. The first member that
            // answers says which.
            // A bare probe: no shared-memory region is set up for it.
            let probe = ConnectOptions { shm: false, leases: false, post: false, ring: false, ..opts.clone() };
            for m in &members {
                match Client::connect_with(m, probe.clone()) {
                    Err(e) if e.errno == CLUSTER_ERRNO => return Remote::connect_as(addr, RemoteKind::Cluster, opts),
                    Ok(_) => break,
                    Err(_) => {}
                }
            }
            return Remote::connect_as(addr, RemoteKind::Forwarders, opts);
        }
        match Client::connect_with(addr, opts.clone()) {
            Ok(c) => Ok(Remote::Server(c)),
            Err(e) if e.errno == CLUSTER_ERRNO => Remote::connect_as(addr, RemoteKind::Cluster, opts),
            Err(e) => Err(e),
        }
    }

    /// Connect to an address of known kind (saves the question when many
    /// connections go to one address, as the FUSE mount makes).
    pub fn connect_as(addr: &str, kind: RemoteKind, opts: ConnectOptions) -> RemoteResult<Remote> {
        match kind {
            RemoteKind::Server => Ok(Remote::Server(Client::connect_with(addr, opts)?)),
            RemoteKind::Cluster => Ok(Remote::Cluster(Cluster::new(StripedClient::connect_with(addr, opts)?))),
            RemoteKind::Forwarders => Ok(Remote::Forwarders(Forwarders::connect(&address_set(addr).unwrap_or_else(|| vec![addr.to_string()]), opts)?)),
        }
    }

    /// The application id the servers know this connection by: the one
    /// given in the options, else this process's (`default_app`), on
    /// every data server of a cluster alike.
    pub fn app(&self) -> String {
        match self {
            Remote::Server(c) => c.app().to_string(),
            Remote::Cluster(c) => c.client.app(),
            Remote::Forwarders(f) => f.app().to_string(),
        }
    }

    pub fn kind(&self) -> RemoteKind {
        match self {
            Remote::Server(_) => RemoteKind::Server,
            Remote::Cluster(_) => RemoteKind::Cluster,
            Remote::Forwarders(_) => RemoteKind::Forwarders,
        }
    }

    /// Note when the next read or write leaves (`Client::mark_next_send`),
    /// on every connection a forwarder set has open; a cluster's are not
    /// marked.
    pub fn mark_next_send(&self) {
        match self {
            Remote::Server(c) => c.mark_next_send(),
            Remote::Cluster(_) => {}
            Remote::Forwarders(f) => f.connected().iter().for_each(|c| c.mark_next_send()),
        }
    }

    /// When the marked request left (`Client::marked_send`).
    pub fn marked_send(&self) -> Option<std::time::Instant> {
        match self {
            Remote::Server(c) => c.marked_send(),
            Remote::Cluster(_) => None,
            Remote::Forwarders(f) => f.connected().iter().filter_map(|c| c.marked_send()).min(),
        }
    }

    /// Read all of `buf` from `offset` (fewer bytes only at end of file)
    /// with several requests in flight: one server gets `chunk`-byte reads
    /// all submitted before the first is waited for; a cluster's striped
    /// read already keeps every data server busy.
    pub fn read_pipelined(&self, fd: Fd, buf: &mut [u8], offset: u64, chunk: usize) -> RemoteResult<usize> {
        let c = match self {
            Remote::Server(c) => c,
            Remote::Forwarders(f) => return f.on_fd(fd, true, |c, fd| read_pipelined_on(c, fd, buf, offset, chunk)),
            Remote::Cluster(_) => {
                let mut n = 0;
                while n < buf.len() {
                    let got = self.pread(fd, &mut buf[n..], offset + n as u64)?;
                    if got == 0 {
                        break;
                    }
                    n += got;
                }
                return Ok(n);
            }
        };
        read_pipelined_on(c, fd, buf, offset, chunk)
    }

    /// Write all of `data` at `offset` with several requests in flight
    /// (as [`Remote::read_pipelined`]).
    pub fn write_pipelined(&self, fd: Fd, data: &[u8], offset: u64, chunk: usize) -> RemoteResult<()> {
        match self {
            Remote::Server(c) => write_pipelined_on(c, fd, data, offset, chunk),
            Remote::Forwarders(f) => f.on_fd(fd, true, |c, fd| write_pipelined_on(c, fd, data, offset, chunk)),
            Remote::Cluster(_) => self.pwrite(fd, data, offset).map(|_| ()),
        }
    }
    /// Open `path` with `open(2)` flags.
    pub fn open(&self, path: &str, flags: i32, mode: u32) -> RemoteResult<Fd> {
        match self {
            Remote::Server(c) => c.open(path, flags, mode),
            Remote::Forwarders(f) => f.open(path, flags, mode),
            Remote::Cluster(k) => k.open(path, flags),
        }
    }

    /// Create `path` for writing, emptied, as one object on data server
    /// `server` of a cluster (taken modulo the servers), so that it can
    /// be the file of a server-directed collective (which needs a file of
    /// one object) and the files of an array spread over the servers; on
    /// one server, create it. A cluster file that exists keeps its layout.
    pub fn create_on(&self, path: &str, server: usize, mode: u32) -> RemoteResult<Fd> {
        if let Remote::Cluster(k) = self {
            let start = (server % k.client.servers().len().max(1)) as i32;
            match k.client.create(path, LayoutRequest { stripe_bytes: 0, count: 1, start }).map_err(ClientError::from) {
                Ok(f) => k.client.close(&f)?,
                Err(e) if e.posix_errno() == libc::EEXIST => {}
                Err(e) => return Err(e),
            }
        }
        self.open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, mode)
    }

    /// Data servers behind this connection: 1 for one server.
    pub fn servers(&self) -> usize {
        match self {
            Remote::Server(_) => 1,
            Remote::Cluster(k) => k.client.servers().len(),
            Remote::Forwarders(_) => 1,
        }
    }

    pub fn close(&self, fd: Fd) -> RemoteResult<()> {
        match self {
            Remote::Server(c) => c.close(fd),
            Remote::Forwarders(f) => f.close(fd),
            Remote::Cluster(k) => {
                let h = k.files().open.remove(&fd.0).ok_or_else(|| bad_fd(fd))?;
                match h {
                    Handle::File(f) => {
                        f.invalidate(&k.ahead);
                        Ok(k.client.close(&f.file)?)
                    }
                    Handle::Dir(_) => Ok(()),
                }
            }
        }
    }

    /// Read up to `buf.len()` bytes at `offset`; fewer only at end of file.
    pub fn pread(&self, fd: Fd, buf: &mut [u8], offset: u64) -> RemoteResult<usize> {
        match self {
            Remote::Server(c) => c.pread(fd, buf, offset),
            Remote::Forwarders(f) => f.on_fd(fd, true, |c, fd| c.pread(fd, buf, offset)),
            Remote::Cluster(k) => Ok(k.file(fd)?.pread(&k.client, &k.ahead, buf, offset)?),
        }
    }

    /// The file itself for FUSE passthrough (`Client::passthrough_file`);
    /// never for a cluster's striped files (no one file holds them).
    pub fn passthrough_file(&self, fd: Fd, size: u64, prime: bool) -> RemoteResult<sluice_client::Passthrough> {
        match self {
            Remote::Server(c) => Ok(c.passthrough_file(fd, size, prime)?),
            Remote::Forwarders(f) => f.on_fd(fd, true, |c, fd| c.passthrough_file(fd, size, prime)),
            Remote::Cluster(_) => Ok(sluice_client::Passthrough::Unsuitable),
        }
    }

    /// As `pread`, from a live cache lease only (`Client::pread_leased`);
    /// `None` when there is none (always, for a cluster).
    pub fn pread_leased(&self, fd: Fd, buf: &mut [u8], offset: u64) -> Option<RemoteResult<usize>> {
        match self {
            Remote::Server(c) => c.pread_leased(fd, buf, offset),
            Remote::Forwarders(f) => f.on_fd(fd, false, |c, fd| Ok(c.pread_leased(fd, buf, offset))).unwrap_or_else(|e| Some(Err(e))),
            Remote::Cluster(_) => None,
        }
    }

    /// Write all of `data` at `offset`.
    pub fn pwrite(&self, fd: Fd, data: &[u8], offset: u64) -> RemoteResult<usize> {
        match self {
            Remote::Server(c) => c.pwrite(fd, data, offset),
            Remote::Forwarders(f) => f.on_fd(fd, true, |c, fd| c.pwrite(fd, data, offset)),
            Remote::Cluster(k) => k.changing(fd, |f| k.client.pwrite(f, data, offset)),
        }
    }

    /// List I/O read (SFIO's mread): every `(offset, len)` piece, back to
    /// back, into `buf`, in one message per server.
    pub fn read_list(&self, fd: Fd, pieces: &[(u64, u64)], buf: &mut [u8]) -> RemoteResult<usize> {
        match self {
            Remote::Server(c) => c.read_list(fd, pieces, buf),
            Remote::Forwarders(f) => f.on_fd(fd, true, |c, fd| c.read_list(fd, pieces, buf)),
            Remote::Cluster(k) => Ok(k.client.read_list(&k.file(fd)?.file, pieces, buf)?),
        }
    }

    /// List I/O write (SFIO's mwrite): `data` holds the pieces back to back.
    pub fn write_list(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8]) -> RemoteResult<usize> {
        match self {
            Remote::Server(c) => c.write_list(fd, pieces, data),
            Remote::Forwarders(f) => f.on_fd(fd, true, |c, fd| c.write_list(fd, pieces, data)),
            Remote::Cluster(k) => k.changing(fd, |f| k.client.write_list(f, pieces, data)),
        }
    }

    /// Start a list message of a server-directed collective (a write when
    /// `data` is given, else a read); finish it with
    /// [`Remote::wait_list_group`]. One thread may keep several in flight
    /// (Panda's overlap: the server has the next group while it serves
    /// this one). On a cluster the file must have one object.
    pub fn submit_list_group(&self, fd: Fd, pieces: &[(u64, u64)], data: Option<&[u8]>, group: Group) -> RemoteResult<GroupTicket> {
        let (client, fd, written) = match self {
            Remote::Server(_) => (None, fd, None),
            Remote::Forwarders(f) => {
                let (c, ofd) = f.client_of(fd)?;
                (Some(c), ofd, None)
            }
            Remote::Cluster(k) => {
                let f = k.file(fd)?;
                if data.is_some() {
                    f.invalidate(&k.ahead);
                }
                let (c, ofd) = k.client.sole_object_client(&f.file)?;
                (Some(c), ofd, data.is_some().then_some(f))
            }
        };
        let c: &Client = match (&client, self) {
            (Some(c), _) => c,
            (None, Remote::Server(c)) => c,
            (None, Remote::Cluster(_) | Remote::Forwarders(_)) => unreachable!("a cluster's or a forwarder set's file has its own client"),
        };
        let ticket = match data {
            Some(d) => c.submit_write_list_group(fd, pieces, d, group)?,
            None => c.submit_read_list_group(fd, pieces, group)?,
        };
        Ok(GroupTicket { client, ticket, write: data.is_some(), written })
    }

    /// The answer of a submitted collective message: the bytes written, or
    /// read into `buf` (pass an empty `buf` for a write).
    pub fn wait_list_group(&self, t: GroupTicket, buf: &mut [u8]) -> RemoteResult<usize> {
        let c: &Client = match (&t.client, self) {
            (Some(c), _) => c,
            (None, Remote::Server(c)) => c,
            (None, Remote::Cluster(_) | Remote::Forwarders(_)) => return Err(err(libc::EINVAL, "a ticket of another connection")),
        };
        let r = if t.write { c.wait_write_list(t.ticket) } else { c.wait_read_list(t.ticket, buf) };
        if let (Some(f), Remote::Cluster(k)) = (&t.written, self) {
            f.changed(&k.ahead);
        }
        r
    }

    /// `read_list` as one participant of a server-directed collective
    /// (`Client::read_list_group`); on a cluster, the file must have one
    /// object.
    pub fn read_list_group(&self, fd: Fd, pieces: &[(u64, u64)], buf: &mut [u8], group: Group) -> RemoteResult<usize> {
        match self {
            Remote::Server(c) => c.read_list_group(fd, pieces, buf, group),
            Remote::Forwarders(f) => f.on_fd(fd, false, |c, fd| c.read_list_group(fd, pieces, buf, group)),
            Remote::Cluster(k) => Ok(k.client.read_list_group(&k.file(fd)?.file, pieces, buf, group)?),
        }
    }

    /// `write_list` as one participant of a server-directed collective.
    pub fn write_list_group(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8], group: Group) -> RemoteResult<usize> {
        match self {
            Remote::Server(c) => c.write_list_group(fd, pieces, data, group),
            Remote::Forwarders(f) => f.on_fd(fd, false, |c, fd| c.write_list_group(fd, pieces, data, group)),
            Remote::Cluster(k) => k.changing(fd, |f| k.client.write_list_group(f, pieces, data, group)),
        }
    }

    /// `fd`'s file's striping, `(stripe_bytes, count)`: byte `o` is in
    /// object `(o / stripe_bytes) % count`, each object on its own data
    /// server. None on one server or for a file of one object.
    pub fn stripe(&self, fd: Fd) -> RemoteResult<Option<(u64, u32)>> {
        match self {
            Remote::Server(_) | Remote::Forwarders(_) => Ok(None),
            Remote::Cluster(k) => {
                let l = k.file(fd)?.file.layout;
                Ok((l.count > 1).then_some((l.stripe_bytes, l.count)))
            }
        }
    }

    /// The objects (data servers' shares) of `fd`'s file that `pieces`
    /// touch: `[0]` on one server (`[]` for no pieces, as on a cluster).
    pub fn objects_touched(&self, fd: Fd, pieces: &[(u64, u64)]) -> RemoteResult<Vec<u32>> {
        match self {
            Remote::Server(_) | Remote::Forwarders(_) => Ok(if pieces.iter().any(|p| p.1 > 0) { vec![0] } else { Vec::new() }),
            Remote::Cluster(k) => Ok(k.client.objects_touched(&k.file(fd)?.file, pieces)?),
        }
    }

    /// A server-directed collective's message on any file: on one server
    /// (or a cluster file of one object) the group of `participants[0]`; on
    /// a striped file one group per object touched, of `participants[k]`
    /// for object `k` (`StripedClient::list_group_striped`). A write with
    /// `data`; a read into `buf` otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn list_group_any(&self, fd: Fd, pieces: &[(u64, u64)], data: Option<&[u8]>, buf: &mut [u8], id: u64, participants: &[u32], wait_ms: u32) -> RemoteResult<usize> {
        let one = |n: &[u32]| -> RemoteResult<Group> {
            match n {
                [p] => Ok(Group { id, participants: *p, wait_ms }),
                _ => Err(err(libc::EINVAL, "one server: one participant count per group")),
            }
        };
        match (self, data) {
            (Remote::Server(c), Some(d)) => c.write_list_group(fd, pieces, d, one(participants)?),
            (Remote::Server(c), None) => c.read_list_group(fd, pieces, buf, one(participants)?),
            (Remote::Forwarders(f), Some(d)) => f.on_fd(fd, false, |c, fd| c.write_list_group(fd, pieces, d, one(participants)?)),
            (Remote::Forwarders(f), None) => f.on_fd(fd, false, |c, fd| c.read_list_group(fd, pieces, buf, one(participants)?)),
            (Remote::Cluster(k), Some(d)) => k.changing(fd, |f| k.client.list_group_striped(f, pieces, Some(d), &mut [], id, participants, wait_ms)),
            (Remote::Cluster(k), None) => Ok(k.client.list_group_striped(&k.file(fd)?.file, pieces, None, buf, id, participants, wait_ms)?),
        }
    }

    /// Give back the descriptors the server lent (`Client::shed_lent`).
    pub fn shed_lent(&self) {
        match self {
            Remote::Server(c) => c.shed_lent(),
            Remote::Forwarders(f) => f.connected().iter().for_each(|c| c.shed_lent()),
            Remote::Cluster(_) => {}
        }
    }

    /// The inode number of `fd`'s file when it was opened (a cluster
    /// file's id): a later open of its path that finds another number
    /// found another file.
    pub fn ino(&self, fd: Fd) -> RemoteResult<u64> {
        match self {
            Remote::Server(c) => c.ino(fd),
            Remote::Forwarders(f) => f.ino(fd),
            Remote::Cluster(k) => match k.handle(fd)? {
                Handle::File(f) => Ok(f.file.id),
                Handle::Dir(st) => Ok(st.ino),
            },
        }
    }

    /// Where an `O_APPEND` write of `len` bytes goes. One server hands
    /// out disjoint ranges at the end (`Client::reserve`); a cluster has
    /// no such reservation yet and answers the file's size, so appends
    /// from two clients at once may overlap there.
    pub fn reserve(&self, fd: Fd, len: u64) -> RemoteResult<u64> {
        match self {
            Remote::Server(c) => Ok(c.reserve(fd, len)?),
            Remote::Forwarders(f) => f.on_fd(fd, false, |c, fd| c.reserve(fd, len)),
            Remote::Cluster(_) => Ok(self.fstat(fd)?.size),
        }
    }

    pub fn fstat(&self, fd: Fd) -> RemoteResult<Stat> {
        match self {
            Remote::Server(c) => c.fstat(fd),
            Remote::Forwarders(f) => f.on_fd(fd, true, |c, fd| c.fstat(fd)),
            Remote::Cluster(k) => match k.handle(fd)? {
                Handle::File(f) => Ok(file_stat(f.file.id, &f.file.layout, &k.client.object_fstats(&f.file)?)),
                Handle::Dir(st) => Ok(st),
            },
        }
    }

    pub fn stat(&self, path: &str) -> RemoteResult<Stat> {
        match self {
            Remote::Server(c) => c.stat(path),
            Remote::Forwarders(f) => f.on_path(path, true, |c| c.stat(path)),
            Remote::Cluster(k) => {
                let e = k.client.lookup(path)?;
                match (e.kind, e.layout) {
                    (EntryKind::File, Some(layout)) => Ok(file_stat(e.id, &layout, &k.client.object_stats(&e)?)),
                    _ => Ok(dir_stat(path, &e)),
                }
            }
        }
    }

    /// `stat` of a final symbolic link itself. A cluster's namespace has
    /// no links: its `stat`.
    pub fn lstat(&self, path: &str) -> RemoteResult<Stat> {
        match self {
            Remote::Server(c) => c.lstat(path),
            Remote::Forwarders(f) => f.on_path(path, true, |c| c.lstat(path)),
            Remote::Cluster(_) => self.stat(path),
        }
    }

    /// The capacity and free space of what `path` is served from: its
    /// server's file system, or the sum of a cluster's data servers.
    pub fn statfs(&self, path: &str) -> RemoteResult<Statfs> {
        match self {
            Remote::Server(c) => c.statfs(path),
            Remote::Forwarders(f) => f.on_path(path, true, |c| c.statfs(path)),
            Remote::Cluster(k) => {
                k.client.lookup(path)?;
                Ok(k.client.statfs()?)
            }
        }
    }

    /// The target of the symbolic link at `path` (EINVAL where it is not
    /// one: always, on a cluster).
    pub fn readlink(&self, path: &str) -> RemoteResult<String> {
        match self {
            Remote::Server(c) => c.readlink(path),
            Remote::Forwarders(f) => f.on_path(path, true, |c| c.readlink(path)),
            Remote::Cluster(_) => {
                self.stat(path)?;
                Err(err(libc::EINVAL, format!("{path:?} is not a symbolic link (a cluster's namespace has none)")))
            }
        }
    }

    pub fn ftruncate(&self, fd: Fd, len: u64) -> RemoteResult<()> {
        match self {
            Remote::Server(c) => c.ftruncate(fd, len),
            Remote::Forwarders(f) => f.on_fd(fd, true, |c, fd| c.ftruncate(fd, len)),
            Remote::Cluster(k) => k.changing(fd, |f| k.client.ftruncate(f, len)),
        }
    }

    pub fn fsync(&self, fd: Fd) -> RemoteResult<()> {
        match self {
            Remote::Server(c) => c.fsync(fd),
            Remote::Forwarders(f) => f.on_fd(fd, true, |c, fd| c.fsync(fd)),
            Remote::Cluster(k) => Ok(k.client.fsync(&k.file(fd)?.file)?),
        }
    }

    /// `fdatasync`; on a cluster a full `fsync` of every object.
    pub fn fdatasync(&self, fd: Fd) -> RemoteResult<()> {
        match self {
            Remote::Server(c) => c.fdatasync(fd),
            Remote::Forwarders(f) => f.on_fd(fd, true, |c, fd| c.fdatasync(fd)),
            Remote::Cluster(k) => Ok(k.client.fsync(&k.file(fd)?.file)?),
        }
    }

    /// Create a directory; on a cluster `mode` is not kept (0755).
    pub fn mkdir(&self, path: &str, mode: u32) -> RemoteResult<()> {
        match self {
            Remote::Server(c) => c.mkdir(path, mode),
            Remote::Forwarders(f) => f.on_path(path, false, |c| c.mkdir(path, mode)),
            Remote::Cluster(k) => k.client.mkdir(path).map(drop).map_err(ClientError::from),
        }
    }

    /// Change a file's mode and times ([`Client::set_attr`]); a cluster
    /// keeps neither (accepted and ignored).
    pub fn set_attr(&self, path: &str, mode: u32, atime_ns: i64, mtime_ns: i64, nofollow: bool) -> RemoteResult<()> {
        match self {
            Remote::Server(c) => c.set_attr(path, mode, atime_ns, mtime_ns, nofollow),
            Remote::Forwarders(f) => f.on_path(path, true, |c| c.set_attr(path, mode, atime_ns, mtime_ns, nofollow)),
            Remote::Cluster(_) => Ok(()),
        }
    }

    /// [`Remote::set_attr`] on an open file.
    pub fn fset_attr(&self, fd: Fd, mode: u32, atime_ns: i64, mtime_ns: i64) -> RemoteResult<()> {
        match self {
            Remote::Server(c) => c.fset_attr(fd, mode, atime_ns, mtime_ns),
            Remote::Forwarders(f) => f.on_fd(fd, true, |c, fd| c.fset_attr(fd, mode, atime_ns, mtime_ns)),
            Remote::Cluster(_) => Ok(()),
        }
    }

    /// A symbolic link at `path` holding `target`; a cluster's namespace
    /// has no links (ENOTSUP).
    pub fn symlink(&self, target: &str, path: &str) -> RemoteResult<()> {
        match self {
            Remote::Server(c) => Ok(c.symlink(target, path)?),
            Remote::Forwarders(f) => f.on_path(path, false, |c| c.symlink(target, path)),
            Remote::Cluster(_) => Err(ClientError::new(ClientErrorKind::Server, libc::ENOTSUP, "a cluster's namespace has no symbolic links")),
        }
    }

    pub fn rmdir(&self, path: &str) -> RemoteResult<()> {
        match self {
            Remote::Server(c) => c.rmdir(path),
            Remote::Forwarders(f) => f.on_path(path, false, |c| c.rmdir(path)),
            Remote::Cluster(k) => Ok(k.client.remove(path, Some(EntryKind::Dir))?),
        }
    }

    pub fn unlink(&self, path: &str) -> RemoteResult<()> {
        match self {
            Remote::Server(c) => c.unlink(path),
            Remote::Forwarders(f) => f.on_path(path, false, |c| c.unlink(path)),
            Remote::Cluster(k) => Ok(k.client.remove(path, Some(EntryKind::File))?),
        }
    }

    pub fn rename(&self, from: &str, to: &str) -> RemoteResult<()> {
        match self {
            Remote::Server(c) => c.rename(from, to),
            Remote::Forwarders(f) => f.on_path(from, false, |c| c.rename(from, to)),
            Remote::Cluster(k) => Ok(k.client.rename(from, to)?),
        }
    }

    /// Every entry of directory `path` but `.` and `..`, sorted by name.
    pub fn readdir(&self, path: &str) -> RemoteResult<Vec<DirEntry>> {
        match self {
            Remote::Server(c) => c.readdir(path),
            Remote::Forwarders(f) => f.on_path(path, true, |c| c.readdir(path)),
            Remote::Cluster(k) => {
                let list = k.client.readdir(path)?;
                let kind = |e: &Entry| {
                    if e.kind == EntryKind::Dir {
                        FileKind::Dir
                    } else {
                        FileKind::File
                    }
                };
                Ok(list.into_iter().map(|(name, e)| DirEntry { kind: kind(&e), name }).collect())
            }
        }
    }
}

/// Submit one request per piece, in order, until one fails: the tickets
/// sent (each to be waited for: it holds its reply, and its slot of the
/// shared region, until then) and the failure, if any.
fn submit_each<P, T>(pieces: impl Iterator<Item = P>, mut submit: impl FnMut(usize, P) -> RemoteResult<T>) -> (Vec<T>, RemoteResult<()>) {
    let mut sent = Vec::new();
    for (i, p) in pieces.enumerate() {
        match submit(i, p) {
            Ok(t) => sent.push(t),
            Err(e) => return (sent, Err(e)),
        }
    }
    (sent, Ok(()))
}

/// `Remote::read_pipelined` on one server. Every read sent is waited for,
/// even after an error: the first error wins.
fn read_pipelined_on(c: &Client, fd: Fd, buf: &mut [u8], offset: u64, chunk: usize) -> RemoteResult<usize> {
    let chunk = chunk.max(1);
    let (tickets, mut first) = submit_each(buf.chunks(chunk), |i, ch| c.submit_read(fd, ch.len(), offset + (i * chunk) as u64));
    let (mut total, mut short) = (0, false);
    for (t, ch) in tickets.into_iter().zip(buf.chunks_mut(chunk)) {
        match c.wait_read(t, ch) {
            Ok(n) if !short => {
                total += n;
                short = n < ch.len();
            }
            Ok(_) => {}
            Err(e) if first.is_ok() => first = Err(e),
            Err(_) => {}
        }
    }
    first.map(|()| total)
}

/// `Remote::write_pipelined` on one server. Every write sent is waited
/// for, even after an error: the first error wins.
fn write_pipelined_on(c: &Client, fd: Fd, data: &[u8], offset: u64, chunk: usize) -> RemoteResult<()> {
    let chunk = chunk.max(1);
    let (tickets, mut first) = submit_each(data.chunks(chunk), |i, ch| c.submit_write(fd, ch, offset + (i * chunk) as u64));
    for t in tickets {
        if let (Err(e), Ok(())) = (c.wait_write(t), &first) {
            first = Err(e);
        }
    }
    first
}

fn bad_fd(fd: Fd) -> ClientError {
    err(libc::EBADF, format!("handle {} is not open", fd.0))
}

impl Cluster {
    fn new(client: StripedClient) -> Cluster {
        let files = Files { open: HashMap::new(), next: 1, generations: HashMap::new() };
        Cluster { client, files: Mutex::new(files), files_max: REMOTE_FILES_MAX, ahead: Budget::new(READ_AHEAD_TOTAL_MAX) }
    }

    /// `op`, a write or truncate of `fd`'s file: its read-ahead windows,
    /// on every handle of the file, are not served once it returned
    /// (`OpenFile::changed`), whether it succeeded or not.
    fn changing<T>(&self, fd: Fd, op: impl FnOnce(&crate::client::StripedFile) -> crate::error::Result<T>) -> RemoteResult<T> {
        let f = self.file(fd)?;
        f.invalidate(&self.ahead);
        let r = op(&f.file);
        f.changed(&self.ahead);
        Ok(r?)
    }

    /// An open file with the write generation its other handles share.
    fn open_file(&self, file: crate::client::StripedFile) -> Handle {
        let mut files = self.files();
        let live = files.generations.get(&file.id).and_then(Weak::upgrade);
        let generation = live.unwrap_or_else(|| {
            if files.generations.len() >= self.files_max {
                files.generations.retain(|_, g| g.strong_count() > 0);
            }
            let g = Arc::new(AtomicU64::new(0));
            files.generations.insert(file.id, Arc::downgrade(&g));
            g
        });
        Handle::File(Arc::new(OpenFile::new(file, generation)))
    }

    /// Write generations kept now (tests).
    pub fn generations_kept(&self) -> usize {
        self.files().generations.len()
    }

    /// The striped client underneath (layouts, list I/O, `getstripe`).
    pub fn striped(&self) -> &StripedClient {
        &self.client
    }

    /// Lower the open-file bound (tests).
    pub fn set_files_max(&mut self, n: usize) {
        self.files_max = n.min(REMOTE_FILES_MAX);
    }

    /// Lower the read-ahead bound (tests).
    pub fn set_read_ahead_max(&mut self, n: usize) {
        self.ahead = Budget::new(n.min(READ_AHEAD_TOTAL_MAX));
    }

    /// Read-ahead bytes held now.
    pub fn read_ahead_bytes(&self) -> usize {
        self.ahead.used()
    }

    fn files(&self) -> MutexGuard<'_, Files> {
        self.files.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn handle(&self, fd: Fd) -> RemoteResult<Handle> {
        self.files().open.get(&fd.0).cloned().ok_or_else(|| bad_fd(fd))
    }

    /// The open file behind `fd`; a directory handle is EISDIR.
    fn file(&self, fd: Fd) -> RemoteResult<Arc<OpenFile>> {
        match self.handle(fd)? {
            Handle::File(f) => Ok(f),
            Handle::Dir(_) => Err(err(libc::EISDIR, format!("handle {} is a directory", fd.0))),
        }
    }

    fn too_many_files(&self) -> ClientError {
        err(libc::ENFILE, format!("{} files open on this cluster connection (REMOTE_FILES_MAX)", self.files_max))
    }

    fn open(&self, path: &str, flags: i32) -> RemoteResult<Fd> {
        if self.files().open.len() >= self.files_max {
            return Err(self.too_many_files());
        }
        let handle = if flags & libc::O_CREAT != 0 {
            self.open_file(self.client.open(path, flags)?)
        } else {
            let e = self.client.lookup(path)?;
            match e.kind {
                EntryKind::Dir if flags & libc::O_ACCMODE == libc::O_RDONLY => Handle::Dir(dir_stat(path, &e)),
                EntryKind::Dir => return Err(err(libc::EISDIR, format!("{path:?} is a directory"))),
                EntryKind::File if flags & libc::O_DIRECTORY != 0 => return Err(err(libc::ENOTDIR, format!("{path:?} is not a directory"))),
                EntryKind::File => self.open_file(self.client.open_entry(path, &e, flags)?),
            }
        };
        let mut files = self.files();
        if files.open.len() >= self.files_max {
            drop(files);
            if let Handle::File(f) = &handle {
                let _ = self.client.close(&f.file);
            }
            return Err(self.too_many_files());
        }
        let fd = files.next;
        files.next += 1;
        files.open.insert(fd, handle);
        Ok(Fd(fd))
    }
}
