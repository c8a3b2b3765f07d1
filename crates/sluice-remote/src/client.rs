//! `StripedClient`: a striped file's reads and writes as list I/O on its
//! objects. A request is cut at stripe boundaries, grouped per object
//! (= per data server), cut into messages within the wire bounds, and the
//! per-server messages go out in parallel, one thread per server, each
//! with its own connection; the pieces are then reassembled in the
//! caller's buffer.
//!
//! Failure model: a data server that is down or dies makes the calls that
//! need it fail at once with kind `DataServer` naming it (errno EIO, or
//! ECONNREFUSED/ENOENT when it never answered); files whose objects lie
//! elsewhere are unaffected. Its connection is dropped, so the next
//! `open` reconnects, and a file opened again after the server restarted
//! reads and writes normally.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_client::{Client, ClientError, ClientErrorKind, ConnectOptions, Fd, Group, Stat, Statfs};
use sluice_stripe::{chunk, file_size, group, object_size_for, Layout, LayoutRequest, ObjectList};

use crate::error::{Error, ErrorKind, Result};
use crate::proto::{recv, send, MetaReply, MetaRequest};
use sluice_net::Stream as MetaStream;
use sluice_proto::meta::{Entry, EntryKind};

/// Directory of the objects on every data server; object `k` of file `id`
/// is `objects/<id as 16 hex digits>` on server `layout.server_of(k)`.
pub const OBJECTS_DIR: &str = "objects";
/// Pieces per list-I/O message (the wire protocol's `LIST_PIECES_MAX`).
pub const STRIPED_LIST_PIECES_MAX: usize = 4096;
/// Bytes per list-I/O message: 8 MiB, well under every server's
/// `io_bytes_max` (64 MiB by default), and large enough that one message
/// per server carries a 1 MiB-per-server request whole.
pub const STRIPED_LIST_BYTES_MAX: u64 = 8 << 20;
/// List messages in flight on one data-server connection at once: with
/// `STRIPED_LIST_BYTES_MAX` each, 32 MiB, well under a server's
/// `reply_bytes_max` (128 MiB), so the server never stops reading a
/// connection whose client is busy sending.
pub const MESSAGES_IN_FLIGHT_MAX: usize = 4;
/// Seconds a metadata call may wait for its reply before failing.
pub const META_TIMEOUT_S: u64 = 10;

/// A connection to a cluster: the metadata role plus lazily opened data
/// server connections. Threads may share it.
pub struct StripedClient {
    /// The connection to the metadata role, opened again when the role
    /// closed it (it closes idle connections, `sluice_meta::MetaTimeouts`).
    meta: Mutex<MetaStream>,
    /// The metadata roles of the cluster (several share one etcd store),
    /// and the one the connection goes to now.
    addrs: Vec<String>,
    at: std::sync::atomic::AtomicUsize,
    servers: Vec<String>,
    data: Vec<Mutex<Option<Arc<Client>>>>,
    opts: ConnectOptions,
}

/// An open striped file.
pub struct StripedFile {
    pub path: String,
    pub id: u64,
    pub layout: Layout,
    /// Object `k`'s data-server connection and handle.
    objects: Vec<(Arc<Client>, Fd)>,
}

/// Where one object of a file lives (`getstripe`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub object: u32,
    pub server: u32,
    pub addr: String,
    pub path: String,
    /// Its size, or the error of the server holding it.
    pub size: std::result::Result<u64, String>,
}

/// The figures of several file systems as one: block counts in the first
/// one's unit (each converted through bytes), the smallest name limit.
pub fn sum_statfs(each: &[Statfs]) -> Statfs {
    let unit = each.first().map_or(4096, |f| u64::from(f.block_bytes.max(1)));
    let blocks = |f: &Statfs, n: u64| (u128::from(n) * u128::from(f.block_bytes) / u128::from(unit)).min(u128::from(u64::MAX)) as u64;
    let mut out = Statfs { block_bytes: unit as u32, io_bytes: each.first().map_or(4096, |f| f.io_bytes), name_max: u32::MAX, ..Statfs::default() };
    for f in each {
        out.blocks = out.blocks.saturating_add(blocks(f, f.blocks));
        out.blocks_free = out.blocks_free.saturating_add(blocks(f, f.blocks_free));
        out.blocks_avail = out.blocks_avail.saturating_add(blocks(f, f.blocks_avail));
        out.files = out.files.saturating_add(f.files);
        out.files_free = out.files_free.saturating_add(f.files_free);
        out.name_max = out.name_max.min(f.name_max);
    }
    if each.is_empty() {
        out.name_max = 255;
    }
    out
}

/// `each(0..n)`, one thread per index (none for a single one), results in
/// index order.
fn in_parallel<T: Send>(n: usize, each: impl Fn(usize) -> T + Sync) -> Vec<T> {
    if n == 1 {
        return vec![each(0)];
    }
    std::thread::scope(|s| {
        let each = &each;
        let threads: Vec<_> = (0..n).map(|i| s.spawn(move || each(i))).collect();
        threads.into_iter().map(|t| t.join().expect("object thread panicked")).collect()
    })
}

/// The object path of file `id`.
pub fn object_path(id: u64) -> String {
    format!("{OBJECTS_DIR}/{id:016x}")
}

fn meta_error(errno: i32, message: String) -> Error {
    let kind = match errno {
        libc::ENOENT => ErrorKind::NotFound,
        libc::EEXIST | libc::ENOTEMPTY => ErrorKind::Exists,
        libc::ENOTDIR => ErrorKind::NotDir,
        libc::EISDIR => ErrorKind::IsDir,
        libc::EINVAL => ErrorKind::Invalid,
        libc::EMFILE | libc::ENAMETOOLONG | libc::EOVERFLOW | libc::ENOSPC => ErrorKind::Limit,
        _ => ErrorKind::Meta,
    };
    Error::new(kind, errno, message)
}

/// How an exchange with the metadata role failed: the connection was
/// found closed (no reply came), the role answered an error, or the
/// connection failed otherwise (a timeout, a frame that does not parse),
/// after which a late reply could be taken for the next request's.
enum Exchange {
    Closed(Error),
    Failed(Error),
    Broken(Error),
}

impl Exchange {
    fn into_error(self) -> Error {
        match self {
            Exchange::Closed(e) | Exchange::Failed(e) | Exchange::Broken(e) => e,
        }
    }
}

/// Send `req` and read its reply on `s`.
fn exchange(s: &mut MetaStream, req: &MetaRequest) -> std::result::Result<MetaReply, Exchange> {
    let closed = |e: &Error| matches!(e.errno, libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN);
    if let Err(e) = send(&mut *s, req) {
        // The role may have refused the connection (and closed it) before
        // our request went out: its reason is still in the socket.
        if let Ok(Some(MetaReply::Error { errno, message })) = recv::<MetaReply>(&mut *s) {
            return Err(Exchange::Failed(meta_error(errno, message)));
        }
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        let err = Error::new(ErrorKind::Meta, errno, format!("metadata role: {e}"));
        return Err(if closed(&err) { Exchange::Closed(err) } else { Exchange::Broken(err) });
    }
    match recv::<MetaReply>(&mut *s) {
        Ok(Some(MetaReply::Error { errno, message })) => Err(Exchange::Failed(meta_error(errno, message))),
        Ok(Some(r)) => Ok(r),
        Ok(None) => Err(Exchange::Closed(Error::new(ErrorKind::Meta, libc::EIO, "the metadata role closed the connection"))),
        Err(e) if closed(&e) => Err(Exchange::Closed(e)),
        Err(e) => Err(Exchange::Broken(e)),
    }
}

/// A new connection to the metadata role at `addr`, its key proven over
/// TCP (`AuthStart`, the `Challenge`, then the MAC,
/// `sluice_proto::auth_mac`).
/// The first of `addrs`, from `start` on, whose role answers; the last
/// error when none does.
fn meta_connect_any(addrs: &[String], start: usize, opts: &ConnectOptions) -> Result<(usize, MetaStream)> {
    let mut last = Error::invalid("no metadata role address given");
    for i in 0..addrs.len() {
        let k = (start + i) % addrs.len();
        match meta_connect(&addrs[k], opts) {
            Ok(s) => return Ok((k, s)),
            Err(e) if e.errno == libc::EACCES => return Err(e),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn meta_connect(addr: &str, opts: &ConnectOptions) -> Result<MetaStream> {
    let mut stream = MetaStream::connect(addr)
        .map(MetaStream::out_of_the_way)
        .map_err(|e| Error::new(ErrorKind::Meta, e.raw_os_error().unwrap_or(libc::EINVAL), format!("no sluice metadata role at {addr}: {e}")))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(META_TIMEOUT_S)))
        .and_then(|()| stream.set_write_timeout(Some(Duration::from_secs(META_TIMEOUT_S))))
        .map_err(|e| Error::io("metadata socket", &e))?;
    if !addr.starts_with("tcp:") {
        // The role on a Unix socket: root's or the expected owner's, checked
        // before anything is sent (as a data server's, `sluice_client`).
        stream.check_server(opts.server_uid).map_err(|e| {
            let hint = format!("pass --server-uid UID or set {}=UID to trust that user's role", sluice_client::SERVER_UID_ENV);
            Error::new(ErrorKind::Meta, libc::EACCES, format!("metadata role at {addr} is not trusted: {e}; {hint}"))
        })?;
        return Ok(stream);
    }
    let denied = |why: String| Error::new(ErrorKind::Meta, libc::EACCES, format!("metadata role at {addr} wants its key proven: {why}"));
    let unexpected = |r: MetaReply| Error::new(ErrorKind::Meta, libc::EPROTO, format!("unexpected metadata reply {r:?}"));
    let nonce = match exchange(&mut stream, &MetaRequest::AuthStart).map_err(Exchange::into_error)? {
        MetaReply::Challenge { nonce } => crate::proto::unhex::<{ sluice_proto::AUTH_BYTES }>(&nonce).ok_or_else(|| denied("a malformed challenge".into()))?,
        r => return Err(unexpected(r)),
    };
    let path = opts.key_file.clone().or_else(sluice_net::key::default_path).ok_or_else(|| denied(format!("no key file (set {})", sluice_net::key::KEY_ENV)))?;
    let key = sluice_net::key::load(&path).map_err(|e| denied(e.to_string()))?;
    let mac = sluice_proto::auth_mac(&key, &nonce, crate::proto::META_AUTH_CONTEXT);
    let mine = sluice_net::key::random::<{ sluice_proto::AUTH_BYTES }>().map_err(|e| Error::io("getrandom", &e))?;
    let auth = MetaRequest::Auth { mac: crate::proto::hex(&mac), nonce: crate::proto::hex(&mine) };
    match exchange(&mut stream, &auth).map_err(Exchange::into_error)? {
        // Nothing the role says is believed before it proved the key too.
        MetaReply::Authenticated { proof } => match crate::proto::unhex::<{ sluice_proto::AUTH_BYTES }>(&proof) {
            Some(p) if sluice_proto::proof_verify(&key, &mine, &nonce, crate::proto::META_AUTH_CONTEXT, &p) => Ok(stream),
            _ => Err(Error::new(ErrorKind::Meta, libc::EACCES, format!("metadata role at {addr} is not trusted: its answer does not prove it holds the key"))),
        },
        r => Err(unexpected(r)),
    }
}

impl StripedClient {
    /// Connect to the metadata role at `unix:PATH` or `tcp:HOST:PORT`
    /// with default options.
    pub fn connect(addr: &str) -> Result<StripedClient> {
        StripedClient::connect_with(addr, ConnectOptions::default())
    }

    /// Connect; `opts` is used for every data-server connection.
    /// `addr` may list several roles that serve one store (`a,b`): the
    /// first that answers is used, and the next when it stops answering.
    pub fn connect_with(addr: &str, opts: ConnectOptions) -> Result<StripedClient> {
        let addrs: Vec<String> = addr.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect();
        let (at, stream) = meta_connect_any(&addrs, 0, &opts)?;
        let mut c = StripedClient { meta: Mutex::new(stream), addrs, at: at.into(), servers: Vec::new(), data: Vec::new(), opts };
        let servers = c.call(MetaRequest::Servers).map_err(|e| {
            // A data server does not speak the metadata protocol: say so,
            // rather than how the JSON exchange happened to fail.
            match sluice_client::Client::connect_with(addr, c.opts.clone()) {
                Ok(_) => Error::new(
                    ErrorKind::Meta,
                    libc::EPROTOTYPE,
                    format!("{addr} is a sluice data server, not a cluster's metadata role: use the address `sluice cluster` printed (or `sluice meta --listen`)"),
                ),
                Err(_) => e,
            }
        })?;
        match servers {
            MetaReply::Servers(s) => {
                c.data = s.iter().map(|_| Mutex::new(None)).collect();
                c.servers = s;
                Ok(c)
            }
            r => Err(Error::new(ErrorKind::Meta, libc::EPROTO, format!("unexpected metadata reply {r:?}"))),
        }
    }

    /// The application id every data-server connection declares.
    pub fn app(&self) -> String {
        self.opts.app.clone().unwrap_or_else(sluice_client::default_app)
    }

    /// The data servers' addresses, in layout order.
    pub fn servers(&self) -> &[String] {
        &self.servers
    }

    /// One request and its reply. A connection the role closed (it closes
    /// idle ones, and only between requests) is opened again first; a
    /// request that only reads is sent once more on a new connection if
    /// the old one turns out closed while it was sent (the role never
    /// closes a connection with a request read and unanswered, so no
    /// change is made twice). A connection that failed otherwise (a reply
    /// timed out) is not used again.
    fn call(&self, req: MetaRequest) -> Result<MetaReply> {
        let mut s = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        if s.peer_closed() {
            *s = self.reconnect()?;
        }
        let reads_only = matches!(req, MetaRequest::Servers | MetaRequest::Lookup { .. } | MetaRequest::Readdir { .. });
        let r = match exchange(&mut s, &req) {
            Err(Exchange::Closed(_) | Exchange::Broken(_)) if reads_only => {
                *s = self.reconnect()?;
                exchange(&mut s, &req)
            }
            r => r,
        };
        if let Err(Exchange::Broken(_)) = &r {
            // Not used again: the next call opens a new connection.
            s.shutdown(std::net::Shutdown::Both);
        }
        r.map_err(Exchange::into_error)
    }

    /// A new connection to the role in use, else to the next that answers.
    fn reconnect(&self) -> Result<MetaStream> {
        use std::sync::atomic::Ordering;
        let (at, s) = meta_connect_any(&self.addrs, self.at.load(Ordering::Relaxed), &self.opts)?;
        self.at.store(at, Ordering::Relaxed);
        Ok(s)
    }

    fn entry(&self, req: MetaRequest) -> Result<Entry> {
        match self.call(req)? {
            MetaReply::Entry(e) => Ok(e),
            r => Err(Error::new(ErrorKind::Meta, libc::EPROTO, format!("unexpected metadata reply {r:?}"))),
        }
    }

    /// The connection to data server `server`, opened on first use.
    fn data(&self, server: u32) -> Result<Arc<Client>> {
        let addr = self.servers.get(server as usize).ok_or_else(|| Error::invalid(format!("layout names data server {server}; the cluster has {}", self.servers.len())))?;
        let mut slot = self.data[server as usize].lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        // The slot stays locked (so one connect per server); the slot is
        // empty on failure, so `describe` does not clear it.
        let opts = data_options(&self.opts);
        let c = Arc::new(Client::connect_with(addr, opts).map_err(|e| self.describe(server, "connect", e))?);
        *slot = Some(c.clone());
        Ok(c)
    }

    /// A data-server error; a broken (or, soft, timed-out) connection is
    /// forgotten so that the next `open` reconnects.
    fn data_error(&self, server: u32, what: &str, e: ClientError) -> Error {
        // A soft client's connection that timed out is abandoned too.
        if matches!(e.kind, ClientErrorKind::Disconnected | ClientErrorKind::Connect | ClientErrorKind::Timeout) {
            if let Some(slot) = self.data.get(server as usize) {
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
            }
        }
        self.describe(server, what, e)
    }

    fn describe(&self, server: u32, what: &str, e: ClientError) -> Error {
        let addr = self.servers.get(server as usize).map_or("?", |s| s.as_str());
        // A socket file that is not there means nobody listens, not a
        // missing file.
        let errno = if e.kind == ClientErrorKind::Connect && e.errno == libc::ENOENT { libc::ECONNREFUSED } else { e.errno };
        let how = if matches!(e.kind, ClientErrorKind::Connect | ClientErrorKind::Disconnected) { "unavailable for" } else { "refused" };
        Error::new(ErrorKind::DataServer, errno, format!("data server {server} ({addr}) {how} {what}: {e}"))
    }

    /// The namespace entry at `path`.
    pub fn lookup(&self, path: &str) -> Result<Entry> {
        self.entry(MetaRequest::Lookup { path: path.into() })
    }

    /// Create a new file with layout `req` (unset fields from the parent
    /// directory's default) and its objects; fails if `path` exists.
    ///
    /// The entry is made first, then the objects, each `O_EXCL`: an object
    /// already there belongs to no file of this namespace (a metadata
    /// store started afresh, or restored from an older copy, against data
    /// servers that kept theirs), and a new file must not take its bytes.
    /// When an object cannot be made (that, or its server is down), the
    /// objects made so far and the entry are removed again and the call
    /// fails: a failed create leaves nothing behind. (A client that dies
    /// between the entry and its objects leaves an entry whose missing
    /// objects the next open makes, empty: see `open_objects`.)
    pub fn create(&self, path: &str, req: LayoutRequest) -> Result<StripedFile> {
        let e = self.entry(MetaRequest::Create { path: path.into(), layout: req, exclusive: true })?;
        self.create_objects(path, &e, libc::O_RDWR)
    }

    /// Open `path` with `open(2)` flags; `O_CREAT` creates it with the
    /// parent directory's default layout (as `create`, when it is new),
    /// `O_TRUNC` truncates every object.
    pub fn open(&self, path: &str, flags: i32) -> Result<StripedFile> {
        let object_flags = (flags & libc::O_ACCMODE) | (flags & libc::O_TRUNC);
        if flags & libc::O_CREAT == 0 {
            return self.open_objects(path, &self.lookup(path)?, object_flags);
        }
        // Created here or found: asked as an exclusive create first, so a
        // new file's objects are made as `create` makes them.
        let default = LayoutRequest { stripe_bytes: 0, count: 0, start: -1 };
        match self.entry(MetaRequest::Create { path: path.into(), layout: default, exclusive: true }) {
            Ok(e) => self.create_objects(path, &e, flags & libc::O_ACCMODE),
            Err(err) if err.kind == ErrorKind::Exists && flags & libc::O_EXCL == 0 => self.open_objects(path, &self.lookup(path)?, object_flags),
            Err(err) => Err(err),
        }
    }

    /// Make the objects of new entry `e` (`O_EXCL`, opened with `access`);
    /// on a failure, undo what was made, the entry too (see `create`).
    fn create_objects(&self, path: &str, e: &Entry, access: i32) -> Result<StripedFile> {
        let made = self.objects_of(
            path,
            e,
            |k, server, c, name| {
                c.open(name, access | libc::O_CREAT | libc::O_EXCL, 0o644).map_err(|err| {
                    if err.errno == libc::EEXIST {
                        Error::new(ErrorKind::DataServer, libc::EEXIST, format!("data server {server} already holds object {name} of a file this namespace does not have (a metadata store started afresh or restored against data servers that kept their objects?); {path:?} not created"))
                    } else {
                        self.data_error(server, &format!("creation of {path:?} object {k}"), err)
                    }
                })
            },
            |c, fd, name| {
                let _ = c.close(fd);
                let _ = c.unlink(name);
            },
        );
        if made.is_err() {
            // The entry, if it is still this one.
            if self.lookup(path).is_ok_and(|now| now.id == e.id) {
                let _ = self.entry(MetaRequest::Unlink { path: path.into(), expect: Some(EntryKind::File) });
            }
        }
        made
    }

    /// Open the objects of file entry `e` (from `lookup`) with `open(2)`
    /// access flags and `O_TRUNC`; saves the lookup when the caller has it.
    pub fn open_entry(&self, path: &str, e: &Entry, flags: i32) -> Result<StripedFile> {
        self.open_objects(path, e, (flags & libc::O_ACCMODE) | (flags & libc::O_TRUNC))
    }

    /// Open the objects of existing entry `e`. An object that is missing
    /// is made, empty, as Lustre makes objects lazily: its file's entry
    /// exists, so its bytes are zeros (a client died between a create's
    /// entry and its objects). On a failure the objects opened so far are
    /// closed again.
    fn open_objects(&self, path: &str, e: &Entry, flags: i32) -> Result<StripedFile> {
        self.objects_of(
            path,
            e,
            |k, server, c, name| {
                let fd = match c.open(name, flags, 0o644) {
                    Err(err) if err.errno == libc::ENOENT => c.open(name, flags | libc::O_CREAT, 0o644),
                    other => other,
                };
                fd.map_err(|err| self.data_error(server, &format!("open of {path:?} object {k}"), err))
            },
            |c, fd, _| {
                let _ = c.close(fd);
            },
        )
    }

    /// Each object of file entry `e` (EISDIR for a directory), by
    /// `open_one(k, server, client, object name)`; where one fails, `undo`
    /// is given each opened before it, and the error returned.
    fn objects_of(&self, path: &str, e: &Entry, open_one: impl Fn(u32, u32, &Client, &str) -> Result<Fd>, undo: impl Fn(&Client, Fd, &str)) -> Result<StripedFile> {
        let layout = match (e.kind, e.layout) {
            (EntryKind::File, Some(l)) => l,
            _ => return Err(Error::new(ErrorKind::IsDir, libc::EISDIR, format!("{path:?} is a directory"))),
        };
        let name = object_path(e.id);
        let mut objects: Vec<(Arc<Client>, Fd)> = Vec::with_capacity(layout.count as usize);
        for k in 0..layout.count {
            let server = layout.server_of(k);
            match self.data(server).and_then(|c| open_one(k, server, &c, &name).map(|fd| (c, fd))) {
                Ok(o) => objects.push(o),
                Err(err) => {
                    for (c, fd) in &objects {
                        undo(c, *fd, &name);
                    }
                    return Err(err);
                }
            }
        }
        Ok(StripedFile { path: path.into(), id: e.id, layout, objects })
    }

    /// Close every object handle; the first error, after trying all.
    pub fn close(&self, f: &StripedFile) -> Result<()> {
        let mut first = Ok(());
        for (k, (c, fd)) in f.objects.iter().enumerate() {
            if let Err(e) = c.close(*fd) {
                first = first.and(Err(self.data_error(f.layout.server_of(k as u32), "close", e)));
            }
        }
        first
    }

    /// Run `each` on every object at once (one thread per object).
    fn per_object<T: Send>(&self, f: &StripedFile, what: &str, each: impl Fn(&Client, Fd, u32) -> sluice_client::Result<T> + Sync) -> Result<Vec<T>> {
        let results = in_parallel(f.objects.len(), |k| {
            let (c, fd) = &f.objects[k];
            each(c, *fd, k as u32)
        });
        results.into_iter().enumerate().map(|(k, r)| r.map_err(|e| self.data_error(f.layout.server_of(k as u32), what, e))).collect()
    }

    /// Every object's `fstat`, in object order: all asked at once from
    /// this thread, then each answer taken.
    pub fn object_fstats(&self, f: &StripedFile) -> Result<Vec<Stat>> {
        let err = |k: usize, e| self.data_error(f.layout.server_of(k as u32), "fstat", e);
        let tickets: Vec<_> = f.objects.iter().map(|(c, fd)| c.submit_fstat(*fd)).collect();
        let mut out = Vec::with_capacity(tickets.len());
        let mut first = None;
        for (k, (t, (c, _))) in tickets.into_iter().zip(&f.objects).enumerate() {
            match t.and_then(|t| c.wait_fstat(t)) {
                Ok(st) => out.push(st),
                Err(e) => first = first.or(Some(err(k, e))),
            }
        }
        first.map_or(Ok(out), Err)
    }

    /// Every object's `stat` by name, in object order, without opening
    /// the file (one thread per object).
    pub fn object_stats(&self, e: &Entry) -> Result<Vec<Stat>> {
        let Some(layout) = e.layout else {
            return Err(Error::new(ErrorKind::IsDir, libc::EISDIR, "a directory has no objects"));
        };
        let name = object_path(e.id);
        in_parallel(layout.count as usize, |k| {
            let server = layout.server_of(k as u32);
            self.data(server).and_then(|c| c.stat(&name).map_err(|err| self.data_error(server, "stat of an object", err)))
        })
        .into_iter()
        .collect()
    }

    /// The cluster's capacity and free space: the sum over its data
    /// servers (in the first one's block unit), the shortest name limit.
    pub fn statfs(&self) -> Result<Statfs> {
        let each = in_parallel(self.servers.len(), |k| {
            let server = k as u32;
            self.data(server).and_then(|c| c.statfs(".").map_err(|err| self.data_error(server, "statfs", err)))
        });
        let each = each.into_iter().collect::<Result<Vec<Statfs>>>()?;
        Ok(sum_statfs(&each))
    }

    /// The file size: one past the highest byte any object holds.
    pub fn size(&self, f: &StripedFile) -> Result<u64> {
        let sizes: Vec<u64> = self.object_fstats(f)?.iter().map(|st| st.size).collect();
        Ok(file_size(&f.layout, &sizes))
    }

    /// Set the file size to `len` (each object to its share).
    pub fn ftruncate(&self, f: &StripedFile, len: u64) -> Result<()> {
        self.per_object(f, "ftruncate", |c, fd, k| c.ftruncate(fd, object_size_for(&f.layout, len, k))).map(drop)
    }

    /// Make every object durable.
    pub fn fsync(&self, f: &StripedFile) -> Result<()> {
        self.per_object(f, "fsync", |c, fd, _| c.fsync(fd)).map(drop)
    }

    /// Read up to `buf.len()` bytes at `offset`, stopping at end of file.
    pub fn pread(&self, f: &StripedFile, buf: &mut [u8], offset: u64) -> Result<usize> {
        let size = self.size(f)?;
        let n = (buf.len() as u64).min(size.saturating_sub(offset)) as usize;
        if n > 0 {
            self.read_list(f, &[(offset, n as u64)], &mut buf[..n])?;
        }
        Ok(n)
    }

    /// Write all of `data` at `offset`.
    pub fn pwrite(&self, f: &StripedFile, data: &[u8], offset: u64) -> Result<usize> {
        self.write_list(f, &[(offset, data.len() as u64)], data)
    }

    /// The per-object message lists of a request, and its total bytes.
    fn plan(f: &StripedFile, ranges: &[(u64, u64)], buf_len: usize) -> Result<(Vec<Vec<ObjectList>>, usize)> {
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        if total > buf_len as u64 {
            return Err(Error::invalid(format!("buffer of {buf_len} bytes cannot hold {total} bytes of pieces")));
        }
        let lists = group(&f.layout.map_list(ranges)?);
        Ok((lists.iter().map(|l| chunk(l, STRIPED_LIST_PIECES_MAX, STRIPED_LIST_BYTES_MAX)).collect(), total as usize))
    }

    /// Send each object's messages, in parallel across objects.
    /// Carry out every message of `plan` from this thread: up to
    /// [`MESSAGES_IN_FLIGHT_MAX`] at once on each data server's connection,
    /// all servers at once, each answered in turn (`submit` sends one,
    /// `wait` takes its answer). After an error the messages already sent
    /// are still waited for (their answers must not be left on the
    /// connection), then the first error is returned.
    fn run_messages<T, K>(
        &self,
        f: &StripedFile,
        what: &str,
        plan: &[Vec<ObjectList>],
        submit: impl Fn(&Client, Fd, &ObjectList) -> sluice_client::Result<K>,
        wait: impl Fn(&Client, K, &ObjectList) -> sluice_client::Result<T>,
    ) -> Result<Vec<Vec<T>>> {
        let mut out: Vec<Vec<Option<T>>> = plan.iter().map(|msgs| msgs.iter().map(|_| None).collect()).collect();
        let mut next = vec![0usize; plan.len()];
        let mut flying: Vec<std::collections::VecDeque<(usize, K)>> = plan.iter().map(|_| Default::default()).collect();
        let mut first: Option<Error> = None;
        let fail = |first: &mut Option<Error>, k: u32, e| {
            if first.is_none() {
                *first = Some(self.data_error(f.layout.server_of(k), what, e));
            }
        };
        loop {
            // Fill every server's window first, then take one answer from
            // each: all servers work at once.
            for (i, msgs) in plan.iter().enumerate() {
                while first.is_none() && next[i] < msgs.len() && flying[i].len() < MESSAGES_IN_FLIGHT_MAX {
                    let m = &msgs[next[i]];
                    let (c, fd) = &f.objects[m.object as usize];
                    match submit(c, *fd, m) {
                        Ok(t) => flying[i].push_back((next[i], t)),
                        Err(e) => fail(&mut first, m.object, e),
                    }
                    next[i] += 1;
                }
            }
            let mut busy = false;
            for (i, msgs) in plan.iter().enumerate() {
                if let Some((j, t)) = flying[i].pop_front() {
                    busy = true;
                    let m = &msgs[j];
                    match wait(&f.objects[m.object as usize].0, t, m) {
                        Ok(v) => out[i][j] = Some(v),
                        Err(e) => fail(&mut first, m.object, e),
                    }
                }
            }
            if !busy {
                break;
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(out.into_iter().map(|msgs| msgs.into_iter().map(|v| v.expect("every message answered")).collect()).collect()),
        }
    }

    /// List I/O read: every `(offset, len)` range, back to back, into
    /// `buf`; holes and bytes past end of file read as zeros.
    pub fn read_list(&self, f: &StripedFile, ranges: &[(u64, u64)], buf: &mut [u8]) -> Result<usize> {
        let (plan, total) = Self::plan(f, ranges, buf.len())?;
        self.read_plan(f, &format!("read of {:?}", f.path), &plan, buf, |_| None)?;
        Ok(total)
    }

    /// Carry out a read plan into `buf`, each message in its object's
    /// group where `group` gives one.
    fn read_plan(&self, f: &StripedFile, what: &str, plan: &[Vec<ObjectList>], buf: &mut [u8], group: impl Fn(&ObjectList) -> Option<Group>) -> Result<()> {
        let got = self.run_messages(
            f,
            what,
            plan,
            |c, fd, m| match group(m) {
                Some(g) => c.submit_read_list_group(fd, &m.pieces, g),
                None => c.submit_read_list(fd, &m.pieces),
            },
            |c, t, m| {
                let mut tmp = vec![0u8; m.bytes() as usize];
                c.wait_read_list(t, &mut tmp)?;
                Ok(tmp)
            },
        )?;
        for (msgs, datas) in plan.iter().zip(got) {
            for (m, data) in msgs.iter().zip(datas) {
                let mut at = 0usize;
                for (&(_, len), &b) in m.pieces.iter().zip(&m.buf_offsets) {
                    buf[b as usize..(b + len) as usize].copy_from_slice(&data[at..at + len as usize]);
                    at += len as usize;
                }
            }
        }
        Ok(())
    }

    /// List I/O write: `data` holds the ranges' bytes back to back.
    /// Returns once every server acknowledged its part.
    pub fn write_list(&self, f: &StripedFile, ranges: &[(u64, u64)], data: &[u8]) -> Result<usize> {
        let (plan, total) = Self::plan(f, ranges, data.len())?;
        self.write_plan(f, &format!("write of {:?}", f.path), &plan, data, |_| None)?;
        Ok(total)
    }

    /// Carry out a write plan of `data`, each message in its object's
    /// group where `group` gives one.
    fn write_plan(&self, f: &StripedFile, what: &str, plan: &[Vec<ObjectList>], data: &[u8], group: impl Fn(&ObjectList) -> Option<Group>) -> Result<()> {
        self.run_messages(
            f,
            what,
            plan,
            |c, fd, m| {
                let mut tmp = Vec::with_capacity(m.bytes() as usize);
                for (&(_, len), &b) in m.pieces.iter().zip(&m.buf_offsets) {
                    tmp.extend_from_slice(&data[b as usize..(b + len) as usize]);
                }
                match group(m) {
                    Some(g) => c.submit_write_list_group(fd, &m.pieces, &tmp, g),
                    None => c.submit_write_list(fd, &m.pieces, &tmp),
                }
            },
            |c, t, _| c.wait_write_list(t),
        )?;
        Ok(())
    }

    /// The objects of `f` that `ranges` touch, ascending: what a rank
    /// tells the others before a server-directed collective on a striped
    /// file, so that each object's group knows its participants.
    /// A share too large for one message of a collective is refused here
    /// already (see `list_group_striped`), before any rank is counted.
    pub fn objects_touched(&self, f: &StripedFile, ranges: &[(u64, u64)]) -> Result<Vec<u32>> {
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        let (plan, _) = Self::plan(f, ranges, usize::try_from(total).unwrap_or(usize::MAX))?;
        Self::one_message_each(f, &plan)?;
        Ok(plan.iter().map(|msgs| msgs[0].object).collect())
    }

    /// Refuse a plan in which an object's share takes more than one
    /// message (a striped file: a file of one object takes its group
    /// messages whole).
    fn one_message_each(f: &StripedFile, plan: &[Vec<ObjectList>]) -> Result<()> {
        match plan.iter().find(|msgs| msgs.len() > 1 && f.objects.len() > 1) {
            Some(msgs) => Err(Error::invalid(format!(
                "a collective's share of object {} of {:?} is over one message ({STRIPED_LIST_PIECES_MAX} pieces, {STRIPED_LIST_BYTES_MAX} bytes)",
                msgs[0].object, f.path
            ))),
            None => Ok(()),
        }
    }

    /// One participant of a server-directed collective on a striped file:
    /// each object's share of `ranges` is one group message `id` on that
    /// object's data server, which gathers it with the other ranks' shares
    /// of that object (`participants[k]` of them for object `k`) and serves
    /// them in its disk order. `data` holds the ranges' bytes back to back
    /// (a write), or `buf` receives them (`data` None). A share too large
    /// for one message (`STRIPED_LIST_PIECES_MAX` pieces,
    /// `STRIPED_LIST_BYTES_MAX` bytes) is refused: a participant sends one
    /// message per group.
    #[allow(clippy::too_many_arguments)]
    pub fn list_group_striped(&self, f: &StripedFile, ranges: &[(u64, u64)], data: Option<&[u8]>, buf: &mut [u8], id: u64, participants: &[u32], wait_ms: u32) -> Result<usize> {
        if f.objects.len() == 1 {
            // One object: the file's one group, whatever its size.
            let n = *participants.first().ok_or_else(|| Error::invalid(format!("no participants given for {:?}", f.path)))?;
            let g = Group { id, participants: n, wait_ms };
            return match data {
                Some(d) => self.write_list_group(f, ranges, d, g),
                None => self.read_list_group(f, ranges, buf, g),
            };
        }
        let len = data.map_or(buf.len(), <[u8]>::len);
        let (plan, total) = Self::plan(f, ranges, len)?;
        Self::one_message_each(f, &plan)?;
        for msgs in &plan {
            match participants.get(msgs[0].object as usize) {
                Some(&n) if n > 0 => {}
                _ => return Err(Error::invalid(format!("no participants given for object {} of {:?}", msgs[0].object, f.path))),
            }
        }
        let group = |m: &ObjectList| Some(Group { id, participants: participants[m.object as usize], wait_ms });
        let what = format!("collective {} of {:?}", if data.is_some() { "write" } else { "read" }, f.path);
        match data {
            Some(data) => self.write_plan(f, &what, &plan, data, group)?,
            None => self.read_plan(f, &what, &plan, buf, group)?,
        }
        Ok(total)
    }

    /// The one object of `f`, for a collective: a server-directed group is
    /// gathered by one data server, so the file must not be striped.
    /// The client and handle of `f`'s one object, for a collective's
    /// pipelined calls (`Remote::submit_list_group`).
    pub fn sole_object_client(&self, f: &StripedFile) -> Result<(Arc<Client>, Fd)> {
        self.sole_object(f).map(|(c, fd, _)| (Arc::clone(c), fd))
    }

    fn sole_object<'f>(&self, f: &'f StripedFile) -> Result<(&'f Arc<Client>, Fd, u32)> {
        match f.objects.as_slice() {
            [(c, fd)] => Ok((c, *fd, f.layout.server_of(0))),
            _ => {
                Err(Error::new(ErrorKind::Invalid, libc::EINVAL, format!("{:?} has {} objects: a collective needs a file of one object (stripe count 1)", f.path, f.objects.len())))
            }
        }
    }

    /// `read_list` as one participant of a server-directed collective
    /// (`Client::read_list_group`) on a file of one object.
    pub fn read_list_group(&self, f: &StripedFile, ranges: &[(u64, u64)], buf: &mut [u8], group: Group) -> Result<usize> {
        let (c, fd, server) = self.sole_object(f)?;
        c.read_list_group(fd, ranges, buf, group).map_err(|e| self.data_error(server, &format!("collective read of {:?}", f.path), e))
    }

    /// `write_list` as one participant of a server-directed collective.
    pub fn write_list_group(&self, f: &StripedFile, ranges: &[(u64, u64)], data: &[u8], group: Group) -> Result<usize> {
        let (c, fd, server) = self.sole_object(f)?;
        c.write_list_group(fd, ranges, data, group).map_err(|e| self.data_error(server, &format!("collective write of {:?}", f.path), e))
    }

    /// Create directory `path` (inherits its parent's default layout).
    pub fn mkdir(&self, path: &str) -> Result<Entry> {
        self.entry(MetaRequest::Mkdir { path: path.into() })
    }

    /// Set directory `path`'s default layout for new files.
    pub fn set_dir_default(&self, path: &str, req: LayoutRequest) -> Result<Entry> {
        self.entry(MetaRequest::SetDirDefault { path: path.into(), layout: req })
    }

    /// The entries of directory `path`.
    pub fn readdir(&self, path: &str) -> Result<Vec<(String, Entry)>> {
        match self.call(MetaRequest::Readdir { path: path.into() })? {
            MetaReply::Entries(v) => Ok(v),
            r => Err(Error::new(ErrorKind::Meta, libc::EPROTO, format!("unexpected metadata reply {r:?}"))),
        }
    }

    /// Remove `path` from the namespace, then its objects, best effort:
    /// once the name is gone the unlink has happened and succeeds, as
    /// `rename` does for the file it replaces (an object on a server that
    /// is down stays behind as an orphan; the others are removed).
    pub fn unlink(&self, path: &str) -> Result<()> {
        self.remove(path, None)
    }

    /// `unlink` of an entry of kind `expect` only, when given: `unlink(2)`
    /// of a directory is EISDIR, `rmdir(2)` of a file ENOTDIR.
    pub fn remove(&self, path: &str, expect: Option<EntryKind>) -> Result<()> {
        let e = self.entry(MetaRequest::Unlink { path: path.into(), expect })?;
        let _ = self.remove_objects(&e);
        Ok(())
    }

    /// `rename(2)` in the namespace (no data moves: objects are named by
    /// file id). The objects of a file the target replaced are removed
    /// afterwards, best effort: the rename has happened, so an object on
    /// a server that is down stays behind as an orphan rather than failing
    /// the call.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        match self.call(MetaRequest::Rename { from: from.into(), to: to.into() })? {
            MetaReply::Renamed { replaced } => {
                if let Some(e) = replaced {
                    let _ = self.remove_objects(&e);
                }
                Ok(())
            }
            r => Err(Error::new(ErrorKind::Meta, libc::EPROTO, format!("unexpected metadata reply {r:?}"))),
        }
    }

    /// Remove every object of `e` that can be (one already missing is
    /// fine); the first error, after trying them all.
    fn remove_objects(&self, e: &Entry) -> Result<()> {
        let Some(layout) = e.layout else {
            return Ok(());
        };
        let mut first = Ok(());
        for k in 0..layout.count {
            let server = layout.server_of(k);
            let r = self.data(server).and_then(|c| match c.unlink(&object_path(e.id)) {
                Err(err) if err.errno != libc::ENOENT => Err(self.data_error(server, "unlink of an object", err)),
                _ => Ok(()),
            });
            first = first.and(r);
        }
        first
    }

    /// Where each object of file `path` lives, with its size.
    pub fn objects(&self, path: &str) -> Result<(Entry, Vec<ObjectInfo>)> {
        let e = self.lookup(path)?;
        let Some(layout) = e.layout else {
            return Ok((e, Vec::new()));
        };
        let infos = (0..layout.count)
            .map(|k| {
                let server = layout.server_of(k);
                let name = object_path(e.id);
                let size = self.data(server).and_then(|c| c.stat(&name).map_err(|err| self.data_error(server, "stat", err))).map(|s| s.size).map_err(|err| err.message);
                ObjectInfo { object: k, server, addr: self.servers[server as usize].clone(), path: name, size }
            })
            .collect();
        Ok((e, infos))
    }
}

/// The options of a data-server connection. No transparent recovery: a
/// dead data server fails the calls that need it at once, naming it (the
/// metadata role's layout is what a reconnection would have to re-check).
/// A soft client's stay soft (`Failover`: no reconnection, ETIMEDOUT past
/// the timeout), so a data server that hangs fails its calls too; a hard
/// client's wait for it, saying so after the timeout.
fn data_options(opts: &ConnectOptions) -> ConnectOptions {
    let recovery = match opts.recovery {
        sluice_client::Recovery::Soft | sluice_client::Recovery::Failover => sluice_client::Recovery::Failover,
        _ => sluice_client::Recovery::Off,
    };
    ConnectOptions { recovery, ..opts.clone() }
}

#[cfg(test)]
mod tests {
    use sluice_client::Recovery;

    use super::*;

    #[test]
    fn data_connections_never_reconnect_and_a_soft_client_s_stay_soft() {
        for (given, data) in [(Recovery::Hard, Recovery::Off), (Recovery::Off, Recovery::Off), (Recovery::Soft, Recovery::Failover), (Recovery::Failover, Recovery::Failover)] {
            let o = data_options(&ConnectOptions { recovery: given, ..ConnectOptions::default() });
            assert_eq!(o.recovery, data, "{given:?}");
            assert!(!o.recovery.reconnects());
        }
    }
}
