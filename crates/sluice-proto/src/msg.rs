//! Message bodies: the second decoding step (parse a complete, checked
//! frame) and encoding. Bodies borrow from the frame buffer, so a 1 MiB
//! payload is never copied by the codec.

use crate::error::{ProtoError, ProtoErrorKind};
use crate::frame::{encode_header, Header, Opcode};
use crate::wire::{put_checked, put_i32, put_i64, put_str, put_u16, put_u32, put_u64, Rd};
use crate::{
    APP_NAME_BYTES_MAX, AUTH_BYTES, CRED_GROUPS_MAX, DIR_ENTRIES_MAX, GROUP_PARTICIPANTS_MAX, HEADER_BYTES, IO_BYTES_MAX, LATENCY_BUCKETS, LEASE_ONLY_AT, LIST_PIECES_MAX, MAGIC,
    MESSAGE_BYTES_MAX, NO_POST, PATH_BYTES_MAX, POSTS_MAX, STATS_APPS_MAX, VERSION,
};

/// A caller's identity: user, group and supplementary groups, as the
/// kernel would check them (AUTH_SYS).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// At most [`CRED_GROUPS_MAX`].
    pub groups: Vec<u32>,
}

/// The client's handshake: who is asking, and with which QoS weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello<'a> {
    pub version: u16,
    /// Application id (the unit of fairness).
    pub app: &'a str,
    /// QoS weight, 1 = default.
    pub weight: u32,
    /// Distinguishes the processes of one application (default: the pid).
    pub client_id: u32,
    /// The identity the requests run as, when the client states one: over
    /// TCP, or a mount forwarding its callers' identities. The server
    /// believes it only from a connection that proved the key (or from a
    /// local root peer); a Unix peer without it is who `SO_PEERCRED` says.
    pub cred: Option<Cred>,
}

/// The server's handshake answer: its version and the bounds it enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloOk {
    pub version: u16,
    pub frame_bytes_max: u32,
    pub io_bytes_max: u32,
    pub inflight_per_connection_max: u32,
    /// The server's proof of the key, when this answers an `Auth`: the MAC
    /// of [`crate::proof_mac`] over the client's nonce. `None` otherwise
    /// (the field is then absent from the wire).
    pub proof: Option<[u8; AUTH_BYTES]>,
}

/// One participant's tag in a server-directed collective (Panda): the
/// server holds the list messages of group `id` on one file until
/// `participants` of them have arrived, then runs them together, in disk
/// order, as one application's work. If they have not all arrived after
/// `wait_ms` (clamped by the server), every one that did is answered
/// `ETIMEDOUT` and none is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Group {
    pub id: u64,
    pub participants: u32,
    pub wait_ms: u32,
}

/// `SetAttr::fd` for a change by path.
pub const SETATTR_BY_PATH: u64 = u64::MAX;
/// `SetAttr::mode` that leaves the mode as it is.
pub const SETATTR_MODE_KEEP: u32 = u32::MAX;
/// A `SetAttr` time left as it is (`UTIME_OMIT`).
pub const SETATTR_TIME_OMIT: i64 = i64::MAX;
/// A `SetAttr` time set to the server's clock (`UTIME_NOW`).
pub const SETATTR_TIME_NOW: i64 = i64::MAX - 1;

/// A request, borrowing strings and data from the frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Hello(Hello<'a>),
    Open {
        path: &'a str,
        flags: i32,
        mode: u32,
    },
    Close {
        fd: u64,
    },
    Read {
        fd: u64,
        offset: u64,
        len: u32,
    },
    Write {
        fd: u64,
        offset: u64,
        data: &'a [u8],
    },
    /// SFIO's mread: many `(offset, len)` pieces, answered by one `Data`
    /// holding the pieces back to back. With a group, one participant of a
    /// server-directed collective (opcode `ReadListGroup`).
    ReadList {
        fd: u64,
        pieces: Vec<(u64, u64)>,
        group: Option<Group>,
    },
    /// SFIO's mwrite: `data` holds the pieces back to back. With a group,
    /// one participant of a collective (opcode `WriteListGroup`).
    WriteList {
        fd: u64,
        pieces: Vec<(u64, u64)>,
        data: &'a [u8],
        group: Option<Group>,
    },
    Fsync {
        fd: u64,
    },
    Fdatasync {
        fd: u64,
    },
    Ftruncate {
        fd: u64,
        len: u64,
    },
    Stat {
        path: &'a str,
    },
    /// `Stat` of a symbolic link itself (`lstat(2)`).
    Lstat {
        path: &'a str,
    },
    /// The target of the symbolic link at `path`.
    Readlink {
        path: &'a str,
    },
    /// The capacity and free space of the file system holding `path`.
    Statfs {
        path: &'a str,
    },
    /// An operator's command on the service classes (at most
    /// `QOS_TEXT_BYTES_MAX` bytes).
    Qos {
        command: &'a str,
    },
    Fstat {
        fd: u64,
    },
    /// Reserve `len` bytes at the end of the file: answered `Count` with
    /// the offset where they start, which the caller then writes
    /// (`O_APPEND`). The server hands out disjoint ranges: a reservation
    /// starts at the file's size or past the last one, whichever is
    /// further, so appends from many clients never overlap.
    Reserve {
        fd: u64,
        len: u64,
    },
    /// Make a symbolic link at `path` whose text is `target` (stored as
    /// given, as `symlink(2)` does; the server never follows a link out of
    /// its root).
    Symlink {
        target: &'a str,
        path: &'a str,
    },
    /// Change the mode (`chmod`) and/or the times (`utimensat`) of the
    /// file of handle `fd`, or of `path` when `fd` is [`SETATTR_BY_PATH`].
    /// `mode` [`SETATTR_MODE_KEEP`] leaves the mode; a time
    /// [`SETATTR_TIME_OMIT`] leaves it, [`SETATTR_TIME_NOW`] sets the
    /// server's clock; `nofollow` acts on a final symbolic link itself.
    SetAttr {
        fd: u64,
        path: &'a str,
        mode: u32,
        atime_ns: i64,
        mtime_ns: i64,
        nofollow: bool,
    },
    Unlink {
        path: &'a str,
    },
    Rename {
        from: &'a str,
        to: &'a str,
    },
    Mkdir {
        path: &'a str,
        mode: u32,
    },
    Rmdir {
        path: &'a str,
    },
    /// Entries of a directory from index `start` on (sorted by name).
    Readdir {
        path: &'a str,
        start: u32,
    },
    /// Per-application counters.
    Stats,
    /// Requests wait in this connection's post records: look at its
    /// doorbell (`crate::post`). No body and no answer.
    Nudge,
    /// The answer to a `Challenge`: HMAC-SHA256 under the shared key of the
    /// challenge's nonce and the `Hello` body (see [`crate::auth_mac`]),
    /// and the client's own fresh nonce, which the server's `HelloOk` must
    /// prove the key over in turn (see [`crate::proof_mac`]).
    Auth {
        mac: [u8; AUTH_BYTES],
        nonce: [u8; AUTH_BYTES],
    },
    /// Ask for a shared-memory region of about `bytes` for this
    /// connection's data (same host only). The answer is `Count` with the
    /// bytes granted and the region's memfd attached (`SCM_RIGHTS`).
    ShmAttach {
        bytes: u64,
    },
    /// Read `len` bytes at `offset` into the region at `at`; answered
    /// `Count` (bytes read), the data only in the region: on the socket,
    /// or in the region's post record `post` (`crate::post`), unless the
    /// answer is an error.
    ReadShm {
        fd: u64,
        offset: u64,
        len: u32,
        at: u64,
        /// The post record to answer in, or `NO_POST` (the socket).
        post: u32,
    },
    /// Write the region's `len` bytes at `at` to `offset`; answered `Count`.
    WriteShm {
        fd: u64,
        offset: u64,
        len: u32,
        at: u64,
        /// The post record to answer in, or `NO_POST` (the socket).
        post: u32,
    },
    /// As `ReadShm`, but the server may answer `Lease` instead of reading:
    /// the range is in the page cache and the client reads it itself.
    ReadLease {
        fd: u64,
        offset: u64,
        len: u32,
        at: u64,
        /// The post record to answer in, or `NO_POST` (the socket).
        post: u32,
    },
    /// As `WriteShm`, but the server may answer `Lease` instead of
    /// writing: the client writes the range itself (buffered, so nothing
    /// to schedule before the kernel's write-back).
    WriteLease {
        fd: u64,
        offset: u64,
        len: u32,
        at: u64,
        /// The post record to answer in, or `NO_POST` (the socket).
        post: u32,
    },
}

/// File metadata, as `stat(2)` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireStat {
    pub size: u64,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub ino: u64,
    pub blocks: u64,
    pub blksize: u32,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

/// A file system's capacity and free space, as `statvfs(3)` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireStatfs {
    /// The unit of the block counts (`f_frsize`).
    pub block_bytes: u32,
    /// The preferred I/O size (`f_bsize`).
    pub io_bytes: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    /// Free blocks an unprivileged user may take (`f_bavail`).
    pub blocks_avail: u64,
    pub files: u64,
    pub files_free: u64,
    /// Longest file name (`f_namemax`).
    pub name_max: u32,
}

/// A directory entry's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    Other = 0,
    File = 1,
    Dir = 2,
    Symlink = 3,
}

/// One directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub kind: FileKind,
}

/// Counters of one application, since the server started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppStats {
    pub name: String,
    pub weight: u32,
    /// Read and write requests completed (list I/O counts each piece).
    pub requests: u64,
    /// Dispatches (device operations) that carried at least one of them.
    pub dispatches: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Bytes the server let the application read from the page cache
    /// itself (cache leases): not in `bytes_read` nor in `requests`.
    pub bytes_leased: u64,
    /// Requests that completed with an error.
    pub errors: u64,
    /// Request latency, arrival to completion: see [`LATENCY_BUCKETS`].
    pub latency_us_log2: [u64; LATENCY_BUCKETS],
}

impl AppStats {
    /// Requests per dispatch: how many of this application's requests one
    /// device operation served on average (1.0 = no aggregation).
    pub fn aggregation_factor(&self) -> f64 {
        if self.dispatches == 0 {
            return 0.0;
        }
        self.requests as f64 / self.dispatches as f64
    }
}

/// A response, borrowing data from the frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response<'a> {
    HelloOk(HelloOk),
    Ok,
    /// A handle valid on this connection, and the file's inode number
    /// (so a client that opens the path again can tell the file was
    /// replaced meanwhile).
    Fd(u64, u64),
    Data(&'a [u8]),
    /// Bytes written.
    Count(u64),
    Stat(WireStat),
    /// A symbolic link's target (at most `PATH_BYTES_MAX` bytes).
    Link(String),
    /// Text for a person (at most `QOS_TEXT_BYTES_MAX` bytes; longer is cut).
    Text(String),
    Statfs(WireStatfs),
    Dir {
        entries: Vec<DirEntry>,
        done: bool,
    },
    Stats(Vec<AppStats>),
    /// The server wants the key proven before `HelloOk`: answer `Auth`.
    Challenge {
        nonce: [u8; AUTH_BYTES],
    },
    /// The answer to `ReadLease` when the range is in the page cache: the
    /// client may read `[offset, offset + len)` of the file itself, from
    /// the descriptor the server lent it, for `valid_us` microseconds.
    /// `len` covers at least the request (clipped at end of file) and may
    /// reach further ahead. `lent`: this frame carries the descriptor
    /// (`SCM_RIGHTS`), the first lease of a handle on a connection.
    Lease {
        offset: u64,
        len: u64,
        valid_us: u32,
        lent: bool,
    },
    Error {
        errno: i32,
        message: &'a str,
    },
}

fn too_large(what: &str, n: u64, max: u64) -> ProtoError {
    ProtoError::new(ProtoErrorKind::TooLarge, format!("{what}: {n} > {max}"))
}

fn invalid(what: &str) -> ProtoError {
    ProtoError::new(ProtoErrorKind::Invalid, what.to_string())
}

/// Pieces of a list message: each within `u64`, the total within
/// [`IO_BYTES_MAX`].
fn parse_pieces(r: &mut Rd<'_>) -> Result<(Vec<(u64, u64)>, u64), ProtoError> {
    let n = r.count(LIST_PIECES_MAX, 16, "pieces")?;
    let mut pieces = Vec::with_capacity(n);
    let mut total = 0u64;
    for _ in 0..n {
        let (off, len) = (r.u64("piece offset")?, r.u64("piece length")?);
        off.checked_add(len).ok_or_else(|| invalid("piece offset + length overflows"))?;
        total = total.saturating_add(len);
        if total > u64::from(IO_BYTES_MAX) {
            return Err(too_large("list bytes", total, u64::from(IO_BYTES_MAX)));
        }
        pieces.push((off, len));
    }
    Ok((pieces, total))
}

fn parse_hello<'a>(r: &mut Rd<'a>) -> Result<Hello<'a>, ProtoError> {
    let magic = r.u32("magic")?;
    if magic != MAGIC {
        return Err(ProtoError::new(ProtoErrorKind::BadMagic, format!("0x{magic:08x}")));
    }
    let version = r.u16("version")?;
    if version != VERSION {
        return Err(ProtoError::new(ProtoErrorKind::BadVersion, format!("{version} (this side speaks {VERSION})")));
    }
    let (weight, client_id, app) = (r.u32("weight")?, r.u32("client id")?, r.str(APP_NAME_BYTES_MAX, "app")?);
    let cred = match r.u8("cred flag")? {
        0 => None,
        1 => {
            let (uid, gid) = (r.u32("uid")?, r.u32("gid")?);
            let n = r.count(CRED_GROUPS_MAX, 4, "groups")?;
            let groups = (0..n).map(|_| r.u32("group")).collect::<Result<Vec<_>, _>>()?;
            Some(Cred { uid, gid, groups })
        }
        _ => return Err(invalid("cred flag not 0 or 1")),
    };
    Ok(Hello { version, weight, client_id, app, cred })
}

fn parse_data_request<'a>(op: Opcode, r: &mut Rd<'a>) -> Result<Request<'a>, ProtoError> {
    let fd = r.u64("fd")?;
    Ok(match op {
        Opcode::Read => {
            let (offset, len) = (r.u64("offset")?, r.u32("len")?);
            if len > IO_BYTES_MAX {
                return Err(too_large("read length", u64::from(len), u64::from(IO_BYTES_MAX)));
            }
            offset.checked_add(u64::from(len)).ok_or_else(|| invalid("offset + length overflows"))?;
            Request::Read { fd, offset, len }
        }
        Opcode::Write => {
            let offset = r.u64("offset")?;
            let data = r.rest();
            offset.checked_add(data.len() as u64).ok_or_else(|| invalid("offset + length overflows"))?;
            if data.len() > IO_BYTES_MAX as usize {
                return Err(too_large("write length", data.len() as u64, u64::from(IO_BYTES_MAX)));
            }
            Request::Write { fd, offset, data }
        }
        Opcode::ReadList => Request::ReadList { fd, pieces: parse_pieces(r)?.0, group: None },
        Opcode::ReadListGroup => {
            let group = Some(parse_group(r)?);
            Request::ReadList { fd, pieces: parse_pieces(r)?.0, group }
        }
        _ => {
            let group = if op == Opcode::WriteListGroup { Some(parse_group(r)?) } else { None };
            let (pieces, total) = parse_pieces(r)?;
            let data = r.rest();
            if data.len() as u64 != total {
                return Err(invalid("write list: data length differs from the pieces' total"));
            }
            Request::WriteList { fd, pieces, data, group }
        }
    })
}

/// Step two: parse the body of a request frame whose header passed
/// [`crate::check_header`]. `body` must be exactly `h.body_len` bytes.
pub fn parse_request<'a>(h: &Header, body: &'a [u8]) -> Result<Request<'a>, ProtoError> {
    if body.len() != h.body_len as usize {
        return Err(ProtoError::new(ProtoErrorKind::Truncated, "body shorter than its header says"));
    }
    let mut r = Rd::new(body);
    let req = match h.opcode {
        Opcode::Hello => Request::Hello(parse_hello(&mut r)?),
        Opcode::Open => Request::Open { flags: r.i32("flags")?, mode: r.u32("mode")?, path: r.path("path")? },
        Opcode::Close => Request::Close { fd: r.u64("fd")? },
        Opcode::Read | Opcode::Write | Opcode::ReadList | Opcode::WriteList | Opcode::ReadListGroup | Opcode::WriteListGroup => parse_data_request(h.opcode, &mut r)?,
        Opcode::Fsync => Request::Fsync { fd: r.u64("fd")? },
        Opcode::Fdatasync => Request::Fdatasync { fd: r.u64("fd")? },
        Opcode::Ftruncate => Request::Ftruncate { fd: r.u64("fd")?, len: r.u64("len")? },
        Opcode::Stat => Request::Stat { path: r.path("path")? },
        Opcode::Lstat => Request::Lstat { path: r.path("path")? },
        Opcode::Statfs => Request::Statfs { path: r.path("path")? },
        Opcode::Readlink => Request::Readlink { path: r.path("path")? },
        Opcode::Qos => Request::Qos { command: r.str(crate::QOS_TEXT_BYTES_MAX, "qos command")? },
        Opcode::Fstat => Request::Fstat { fd: r.u64("fd")? },
        Opcode::Reserve => Request::Reserve { fd: r.u64("fd")?, len: r.u64("len")? },
        Opcode::Unlink => Request::Unlink { path: r.path("path")? },
        Opcode::Rename => Request::Rename { from: r.path("from")?, to: r.path("to")? },
        Opcode::Symlink => Request::Symlink { target: r.path("target")?, path: r.path("path")? },
        Opcode::SetAttr => Request::SetAttr {
            fd: r.u64("fd")?,
            mode: r.u32("mode")?,
            atime_ns: r.i64("atime")?,
            mtime_ns: r.i64("mtime")?,
            nofollow: r.u32("flags")? & 1 != 0,
            path: r.path("path")?,
        },
        Opcode::Mkdir => Request::Mkdir { mode: r.u32("mode")?, path: r.path("path")? },
        Opcode::Rmdir => Request::Rmdir { path: r.path("path")? },
        Opcode::Readdir => Request::Readdir { start: r.u32("start")?, path: r.path("path")? },
        Opcode::Stats => Request::Stats,
        Opcode::Nudge => Request::Nudge,
        Opcode::Auth => Request::Auth { mac: r.array("mac")?, nonce: r.array("nonce")? },
        Opcode::ShmAttach => Request::ShmAttach { bytes: r.u64("bytes")? },
        Opcode::ReadShm | Opcode::WriteShm | Opcode::ReadLease | Opcode::WriteLease => {
            let (fd, offset, len, at, post) = (r.u64("fd")?, r.u64("offset")?, r.u32("len")?, r.u64("at")?, r.u32("post")?);
            if len > IO_BYTES_MAX {
                return Err(too_large("shared-memory transfer length", u64::from(len), u64::from(IO_BYTES_MAX)));
            }
            offset.checked_add(u64::from(len)).ok_or_else(|| invalid("offset + length overflows"))?;
            // A `WriteLease` at `LEASE_ONLY_AT` carries no data: no range
            // of the region to check.
            if !(h.opcode == Opcode::WriteLease && at == LEASE_ONLY_AT) {
                at.checked_add(u64::from(len)).ok_or_else(|| invalid("region offset + length overflows"))?;
            }
            if post != NO_POST && post >= POSTS_MAX {
                return Err(invalid(&format!("post record {post} past the region's {POSTS_MAX}")));
            }
            match h.opcode {
                Opcode::ReadShm => Request::ReadShm { fd, offset, len, at, post },
                Opcode::WriteShm => Request::WriteShm { fd, offset, len, at, post },
                Opcode::WriteLease => Request::WriteLease { fd, offset, len, at, post },
                _ => Request::ReadLease { fd, offset, len, at, post },
            }
        }
        other => return Err(ProtoError::new(ProtoErrorKind::UnknownOpcode, format!("{other:?} is not a request"))),
    };
    r.finish("request")?;
    Ok(req)
}

fn put_group(out: &mut Vec<u8>, group: Option<Group>) {
    if let Some(g) = group {
        put_u64(out, g.id);
        put_u32(out, g.participants);
        put_u32(out, g.wait_ms);
    }
}

fn parse_group(r: &mut Rd<'_>) -> Result<Group, ProtoError> {
    let (id, participants, wait_ms) = (r.u64("group id")?, r.u32("participants")?, r.u32("wait ms")?);
    if participants == 0 || wait_ms == 0 {
        return Err(invalid("a group needs at least one participant and a wait of at least 1 ms"));
    }
    if participants > GROUP_PARTICIPANTS_MAX {
        return Err(too_large("group participants", u64::from(participants), u64::from(GROUP_PARTICIPANTS_MAX)));
    }
    Ok(Group { id, participants, wait_ms })
}

fn put_pieces(out: &mut Vec<u8>, pieces: &[(u64, u64)]) {
    put_u32(out, pieces.len() as u32);
    for &(o, l) in pieces {
        put_u64(out, o);
        put_u64(out, l);
    }
}

fn put_hello(out: &mut Vec<u8>, h: &Hello<'_>) -> Result<(Opcode, usize), ProtoError> {
    put_u32(out, MAGIC);
    put_u16(out, h.version);
    put_u32(out, h.weight);
    put_u32(out, h.client_id);
    put_checked(out, h.app, APP_NAME_BYTES_MAX, ProtoErrorKind::TooLarge, "app")?;
    match &h.cred {
        None => out.push(0),
        Some(c) => {
            if c.groups.len() > CRED_GROUPS_MAX {
                return Err(too_large("groups", c.groups.len() as u64, CRED_GROUPS_MAX as u64));
            }
            out.push(1);
            put_u32(out, c.uid);
            put_u32(out, c.gid);
            put_u32(out, c.groups.len() as u32);
            c.groups.iter().for_each(|&g| put_u32(out, g));
        }
    }
    Ok((Opcode::Hello, 0))
}

fn put_path(out: &mut Vec<u8>, path: &str) -> Result<(), ProtoError> {
    put_checked(out, path, PATH_BYTES_MAX, ProtoErrorKind::NameTooLong, "path")
}

fn request_fields(req: &Request<'_>, out: &mut Vec<u8>) -> Result<(Opcode, usize), ProtoError> {
    Ok(match *req {
        Request::Hello(ref h) => return put_hello(out, h),
        Request::Open { path, flags, mode } => {
            put_i32(out, flags);
            put_u32(out, mode);
            put_path(out, path)?;
            (Opcode::Open, 0)
        }
        Request::Close { fd } => fd_only(Opcode::Close, fd, out),
        Request::Read { fd, offset, len } => {
            put_u64(out, fd);
            put_u64(out, offset);
            put_u32(out, len);
            (Opcode::Read, 0)
        }
        Request::Write { fd, offset, data } => {
            put_u64(out, fd);
            put_u64(out, offset);
            (Opcode::Write, data.len())
        }
        Request::ReadList { fd, ref pieces, group } => {
            put_u64(out, fd);
            put_group(out, group);
            put_pieces(out, pieces);
            (if group.is_some() { Opcode::ReadListGroup } else { Opcode::ReadList }, 0)
        }
        Request::WriteList { fd, ref pieces, data, group } => {
            put_u64(out, fd);
            put_group(out, group);
            put_pieces(out, pieces);
            (if group.is_some() { Opcode::WriteListGroup } else { Opcode::WriteList }, data.len())
        }
        Request::Auth { mac, nonce } => {
            out.extend_from_slice(&mac);
            out.extend_from_slice(&nonce);
            (Opcode::Auth, 0)
        }
        Request::ShmAttach { bytes } => fd_only(Opcode::ShmAttach, bytes, out),
        Request::ReadShm { fd, offset, len, at, post }
        | Request::WriteShm { fd, offset, len, at, post }
        | Request::ReadLease { fd, offset, len, at, post }
        | Request::WriteLease { fd, offset, len, at, post } => {
            put_u64(out, fd);
            put_u64(out, offset);
            put_u32(out, len);
            put_u64(out, at);
            put_u32(out, post);
            let op = match req {
                Request::ReadShm { .. } => Opcode::ReadShm,
                Request::WriteShm { .. } => Opcode::WriteShm,
                Request::WriteLease { .. } => Opcode::WriteLease,
                _ => Opcode::ReadLease,
            };
            (op, 0)
        }
        _ => return metadata_fields(req, out),
    })
}

fn fd_only(op: Opcode, fd: u64, out: &mut Vec<u8>) -> (Opcode, usize) {
    put_u64(out, fd);
    (op, 0)
}

fn path_only(op: Opcode, path: &str, out: &mut Vec<u8>) -> Result<(Opcode, usize), ProtoError> {
    put_path(out, path)?;
    Ok((op, 0))
}

fn metadata_fields(req: &Request<'_>, out: &mut Vec<u8>) -> Result<(Opcode, usize), ProtoError> {
    Ok(match *req {
        Request::Fsync { fd } => fd_only(Opcode::Fsync, fd, out),
        Request::Fdatasync { fd } => fd_only(Opcode::Fdatasync, fd, out),
        Request::Ftruncate { fd, len } => {
            put_u64(out, fd);
            put_u64(out, len);
            (Opcode::Ftruncate, 0)
        }
        Request::Stat { path } => return path_only(Opcode::Stat, path, out),
        Request::Lstat { path } => return path_only(Opcode::Lstat, path, out),
        Request::Statfs { path } => return path_only(Opcode::Statfs, path, out),
        Request::Readlink { path } => return path_only(Opcode::Readlink, path, out),
        Request::Qos { command } => {
            put_checked(out, command, crate::QOS_TEXT_BYTES_MAX, ProtoErrorKind::TooLarge, "qos command")?;
            (Opcode::Qos, 0)
        }
        Request::Fstat { fd } => fd_only(Opcode::Fstat, fd, out),
        Request::Reserve { fd, len } => {
            put_u64(out, fd);
            put_u64(out, len);
            (Opcode::Reserve, 0)
        }
        Request::Unlink { path } => return path_only(Opcode::Unlink, path, out),
        Request::Rename { from, to } => {
            put_path(out, from)?;
            put_path(out, to)?;
            (Opcode::Rename, 0)
        }
        Request::SetAttr { fd, path, mode, atime_ns, mtime_ns, nofollow } => {
            put_u64(out, fd);
            put_u32(out, mode);
            put_i64(out, atime_ns);
            put_i64(out, mtime_ns);
            put_u32(out, u32::from(nofollow));
            return path_only(Opcode::SetAttr, path, out);
        }
        Request::Symlink { target, path } => {
            put_path(out, target)?;
            put_path(out, path)?;
            (Opcode::Symlink, 0)
        }
        Request::Mkdir { path, mode } => {
            put_u32(out, mode);
            return path_only(Opcode::Mkdir, path, out);
        }
        Request::Rmdir { path } => return path_only(Opcode::Rmdir, path, out),
        Request::Readdir { path, start } => {
            put_u32(out, start);
            return path_only(Opcode::Readdir, path, out);
        }
        Request::Nudge => (Opcode::Nudge, 0),
        _ => (Opcode::Stats, 0),
    })
}

/// Append the header and fixed fields of `req`, but not its trailing data
/// (the payload of `Write` / `WriteList`), which the caller sends next,
/// e.g. with a vectored write. The header counts the data. A path longer
/// than [`PATH_BYTES_MAX`] is `NameTooLong` (and an app name or group list
/// past its bound `TooLarge`); `out` is then left as it was.
pub fn encode_request_head(request_id: u64, req: &Request<'_>, out: &mut Vec<u8>) -> Result<(), ProtoError> {
    let start = out.len();
    encode_header(Opcode::Ok, request_id, 0, out);
    match request_fields(req, out) {
        Ok((op, data_len)) => {
            patch_header(out, start, op, data_len);
            Ok(())
        }
        Err(e) => {
            out.truncate(start);
            Err(e)
        }
    }
}

/// Append the whole frame of `req` (errors as [`encode_request_head`]).
pub fn encode_request(request_id: u64, req: &Request<'_>, out: &mut Vec<u8>) -> Result<(), ProtoError> {
    encode_request_head(request_id, req, out)?;
    match req {
        Request::Write { data, .. } | Request::WriteList { data, .. } => out.extend_from_slice(data),
        _ => {}
    }
    Ok(())
}

fn patch_header(out: &mut [u8], start: usize, op: Opcode, data_len: usize) {
    let body_len = (out.len() - start - HEADER_BYTES + data_len) as u32;
    out[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
    out[start + 4..start + 6].copy_from_slice(&(op as u16).to_le_bytes());
}

fn put_stat(out: &mut Vec<u8>, s: &WireStat) {
    put_u64(out, s.size);
    put_u32(out, s.mode);
    put_u32(out, s.nlink);
    put_u32(out, s.uid);
    put_u32(out, s.gid);
    put_u64(out, s.ino);
    put_u64(out, s.blocks);
    put_u32(out, s.blksize);
    put_i64(out, s.atime_ns);
    put_i64(out, s.mtime_ns);
    put_i64(out, s.ctime_ns);
}

fn put_app(out: &mut Vec<u8>, a: &AppStats) {
    put_str(out, &a.name, APP_NAME_BYTES_MAX);
    put_u32(out, a.weight);
    for v in [a.requests, a.dispatches, a.bytes_read, a.bytes_written, a.bytes_leased, a.errors] {
        put_u64(out, v);
    }
    for &v in &a.latency_us_log2 {
        put_u64(out, v);
    }
}

fn response_fields(resp: &Response<'_>, out: &mut Vec<u8>) -> (Opcode, usize) {
    match resp {
        Response::HelloOk(h) => {
            put_u16(out, h.version);
            put_u32(out, h.frame_bytes_max);
            put_u32(out, h.io_bytes_max);
            put_u32(out, h.inflight_per_connection_max);
            if let Some(p) = &h.proof {
                out.extend_from_slice(p);
            }
            (Opcode::HelloOk, 0)
        }
        Response::Ok => (Opcode::Ok, 0),
        Response::Fd(fd, ino) => {
            put_u64(out, *fd);
            put_u64(out, *ino);
            (Opcode::Fd, 0)
        }
        Response::Data(d) => (Opcode::Data, d.len()),
        Response::Count(n) => fd_only(Opcode::Count, *n, out),
        Response::Stat(s) => {
            put_stat(out, s);
            (Opcode::StatOk, 0)
        }
        Response::Link(target) => {
            put_str(out, target, PATH_BYTES_MAX);
            (Opcode::Link, 0)
        }
        Response::Text(text) => {
            put_str(out, text, crate::QOS_TEXT_BYTES_MAX);
            (Opcode::Text, 0)
        }
        Response::Statfs(f) => {
            put_u32(out, f.block_bytes);
            put_u32(out, f.io_bytes);
            for v in [f.blocks, f.blocks_free, f.blocks_avail, f.files, f.files_free] {
                put_u64(out, v);
            }
            put_u32(out, f.name_max);
            (Opcode::StatfsOk, 0)
        }
        Response::Dir { entries, done } => {
            out.push(u8::from(*done));
            put_u32(out, entries.len().min(DIR_ENTRIES_MAX) as u32);
            for e in entries.iter().take(DIR_ENTRIES_MAX) {
                out.push(e.kind as u8);
                put_str(out, &e.name, PATH_BYTES_MAX);
            }
            (Opcode::Dir, 0)
        }
        Response::Stats(apps) => {
            put_u32(out, apps.len().min(STATS_APPS_MAX) as u32);
            apps.iter().take(STATS_APPS_MAX).for_each(|a| put_app(out, a));
            (Opcode::StatsOk, 0)
        }
        Response::Lease { offset, len, valid_us, lent } => {
            put_u64(out, *offset);
            put_u64(out, *len);
            put_u32(out, *valid_us);
            out.push(u8::from(*lent));
            (Opcode::Lease, 0)
        }
        Response::Challenge { nonce } => {
            out.extend_from_slice(nonce);
            (Opcode::Challenge, 0)
        }
        Response::Error { errno, message } => {
            put_i32(out, *errno);
            put_str(out, message, MESSAGE_BYTES_MAX);
            (Opcode::Error, 0)
        }
    }
}

/// Append the header and fixed fields of `resp`, but not the payload of a
/// `Data` response, which the caller sends next. The header counts it.
pub fn encode_response_head(request_id: u64, resp: &Response<'_>, out: &mut Vec<u8>) {
    let start = out.len();
    encode_header(Opcode::Ok, request_id, 0, out);
    let (op, data_len) = response_fields(resp, out);
    patch_header(out, start, op, data_len);
}

/// Append the whole frame of `resp`.
pub fn encode_response(request_id: u64, resp: &Response<'_>, out: &mut Vec<u8>) {
    encode_response_head(request_id, resp, out);
    if let Response::Data(d) = resp {
        out.extend_from_slice(d);
    }
}

fn parse_stat(r: &mut Rd<'_>) -> Result<WireStat, ProtoError> {
    Ok(WireStat {
        size: r.u64("size")?,
        mode: r.u32("mode")?,
        nlink: r.u32("nlink")?,
        uid: r.u32("uid")?,
        gid: r.u32("gid")?,
        ino: r.u64("ino")?,
        blocks: r.u64("blocks")?,
        blksize: r.u32("blksize")?,
        atime_ns: r.i64("atime")?,
        mtime_ns: r.i64("mtime")?,
        ctime_ns: r.i64("ctime")?,
    })
}

fn parse_dir(r: &mut Rd<'_>) -> Result<Response<'static>, ProtoError> {
    let done = match r.u8("done")? {
        0 => false,
        1 => true,
        _ => return Err(invalid("done flag not 0 or 1")),
    };
    let n = r.count(DIR_ENTRIES_MAX, 3, "entries")?;
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let kind = match r.u8("kind")? {
            1 => FileKind::File,
            2 => FileKind::Dir,
            3 => FileKind::Symlink,
            _ => FileKind::Other,
        };
        entries.push(DirEntry { kind, name: r.str(PATH_BYTES_MAX, "name")?.to_string() });
    }
    Ok(Response::Dir { entries, done })
}

fn parse_apps(r: &mut Rd<'_>) -> Result<Vec<AppStats>, ProtoError> {
    let n = r.count(STATS_APPS_MAX, 2 + 4 + 8 * (6 + LATENCY_BUCKETS), "apps")?;
    let mut apps = Vec::with_capacity(n);
    for _ in 0..n {
        let (name, weight) = (r.str(APP_NAME_BYTES_MAX, "app")?.to_string(), r.u32("weight")?);
        let mut v = [0u64; 6];
        for x in &mut v {
            *x = r.u64("counter")?;
        }
        let mut latency_us_log2 = [0u64; LATENCY_BUCKETS];
        for x in &mut latency_us_log2 {
            *x = r.u64("latency bucket")?;
        }
        let [requests, dispatches, bytes_read, bytes_written, bytes_leased, errors] = v;
        apps.push(AppStats { name, weight, requests, dispatches, bytes_read, bytes_written, bytes_leased, errors, latency_us_log2 });
    }
    Ok(apps)
}

/// Step two on the client side: parse the body of a response frame whose
/// header passed [`crate::check_header`].
pub fn parse_response<'a>(h: &Header, body: &'a [u8]) -> Result<Response<'a>, ProtoError> {
    if body.len() != h.body_len as usize {
        return Err(ProtoError::new(ProtoErrorKind::Truncated, "body shorter than its header says"));
    }
    let mut r = Rd::new(body);
    let resp = match h.opcode {
        Opcode::HelloOk => Response::HelloOk(HelloOk {
            version: r.u16("version")?,
            frame_bytes_max: r.u32("frame_bytes_max")?,
            io_bytes_max: r.u32("io_bytes_max")?,
            inflight_per_connection_max: r.u32("inflight_per_connection_max")?,
            proof: match r.remaining() {
                0 => None,
                _ => Some(r.array("proof")?),
            },
        }),
        Opcode::Ok => Response::Ok,
        Opcode::Fd => Response::Fd(r.u64("fd")?, r.u64("ino")?),
        Opcode::Data => Response::Data(r.rest()),
        Opcode::Count => Response::Count(r.u64("count")?),
        Opcode::StatOk => Response::Stat(parse_stat(&mut r)?),
        Opcode::Link => Response::Link(r.str(PATH_BYTES_MAX, "link target")?.to_string()),
        Opcode::Text => Response::Text(r.str(crate::QOS_TEXT_BYTES_MAX, "text")?.to_string()),
        Opcode::StatfsOk => Response::Statfs(WireStatfs {
            block_bytes: r.u32("block_bytes")?,
            io_bytes: r.u32("io_bytes")?,
            blocks: r.u64("blocks")?,
            blocks_free: r.u64("blocks_free")?,
            blocks_avail: r.u64("blocks_avail")?,
            files: r.u64("files")?,
            files_free: r.u64("files_free")?,
            name_max: r.u32("name_max")?,
        }),
        Opcode::Dir => parse_dir(&mut r)?,
        Opcode::StatsOk => Response::Stats(parse_apps(&mut r)?),
        Opcode::Challenge => Response::Challenge { nonce: r.array("nonce")? },
        Opcode::Lease => {
            let (offset, len, valid_us) = (r.u64("offset")?, r.u64("len")?, r.u32("valid_us")?);
            offset.checked_add(len).ok_or_else(|| invalid("lease offset + length overflows"))?;
            let lent = match r.u8("lent flag")? {
                0 => false,
                1 => true,
                _ => return Err(invalid("lent flag not 0 or 1")),
            };
            Response::Lease { offset, len, valid_us, lent }
        }
        Opcode::Error => Response::Error { errno: r.i32("errno")?, message: r.str(MESSAGE_BYTES_MAX, "message")? },
        other => return Err(ProtoError::new(ProtoErrorKind::UnknownOpcode, format!("{other:?} is not a response"))),
    };
    r.finish("response")?;
    Ok(resp)
}
