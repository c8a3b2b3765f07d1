//! The file system: every FUSE operation becomes one sluice client call,
//! run on tokio's blocking pool so that concurrent requests stay
//! concurrent. Errors become errno values in exactly one place, `errno`.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::num::NonZeroU32;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fuse3::path::prelude::*;
use fuse3::{Errno, FileType, Result};
use futures_util::stream;
use sluice_client::{ClientError, Fd, FileKind, Stat};
use sluice_remote::{Remote, RemoteKind};

use crate::conns::{Caller, Conns, CONNECTIONS_MAX as CONNS_MAX};
use crate::stats::STATS;
use crate::MountConfig;

/// Connections kept at once (re-exported for the docs and tests).
pub const CONNECTIONS_MAX: usize = CONNS_MAX;
/// Open files at once; `open` past it fails with ENFILE.
pub const HANDLES_MAX: usize = 65_536;
/// Largest read or write the kernel sends in one request: 1 MiB, the
/// sequential size the benchmarks use.
pub const MAX_WRITE_BYTES: u32 = 1 << 20;
/// How long the kernel may cache names and attributes. Short: other
/// clients of the server change files too.
const TTL: Duration = Duration::from_millis(200);
/// FOPEN_DIRECT_IO: no page cache, the application's sizes go to the server.
const FOPEN_DIRECT_IO: u32 = 1;

struct Handle {
    client: Arc<Remote>,
    fd: Fd,
}

pub(crate) struct SluiceFs {
    conns: Conns,
    handles: Mutex<HashMap<u64, Handle>>,
    handles_max: usize,
    fh_next: AtomicU64,
}

/// Client errors as errno values: the client's one conversion.
fn errno(e: ClientError) -> Errno {
    Errno::from(e.posix_errno())
}

/// A mount path ("/a/b") as a server path ("a/b"; the root is ".").
fn server_path(p: &OsStr) -> Result<String> {
    let s = std::str::from_utf8(p.as_bytes()).map_err(|_| Errno::from(libc::EINVAL))?;
    let s = s.trim_start_matches('/');
    Ok(if s.is_empty() { ".".into() } else { s.into() })
}

fn join(parent: &OsStr, name: &OsStr) -> Result<String> {
    let mut p = OsString::from(parent);
    if !p.as_bytes().ends_with(b"/") {
        p.push("/");
    }
    p.push(name);
    server_path(&p)
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn attr(st: &Stat) -> FileAttr {
    let kind = match st.mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        _ => FileType::RegularFile,
    };
    FileAttr {
        size: st.size,
        blocks: st.blocks,
        atime: time(st.atime_ns),
        mtime: time(st.mtime_ns),
        ctime: time(st.ctime_ns),
        kind,
        perm: (st.mode & 0o7777) as u16,
        nlink: st.nlink,
        uid: st.uid,
        gid: st.gid,
        rdev: 0,
        blksize: st.blksize,
    }
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        _ => FileType::RegularFile,
    }
}

/// Run a blocking client call off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> std::result::Result<T, ClientError> + Send + 'static) -> Result<T> {
    STATS.calls.fetch_add(1, Ordering::Relaxed);
    let r = match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(errno),
        Err(_) => Err(Errno::from(libc::EIO)),
    };
    if r.is_err() {
        STATS.errors.fetch_add(1, Ordering::Relaxed);
    }
    r
}

impl SluiceFs {
    pub fn new(cfg: MountConfig, kind: RemoteKind) -> SluiceFs {
        SluiceFs { conns: Conns::new(cfg.server, kind, cfg.app), handles: Mutex::new(HashMap::new()), handles_max: HANDLES_MAX, fh_next: AtomicU64::new(1) }
    }

    fn client(&self, req: &Request) -> Result<Arc<Remote>> {
        let caller = Caller { pid: req.pid, uid: req.uid, gid: req.gid };
        self.conns.get(caller).map_err(|e| {
            self.conns.drop_conn(caller);
            errno(e)
        })
    }

    fn handle(&self, fh: u64) -> Result<(Arc<Remote>, Fd)> {
        let h = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        h.get(&fh).map(|h| (Arc::clone(&h.client), h.fd)).ok_or_else(|| Errno::from(libc::EBADF))
    }

    fn add_handle(&self, client: Arc<Remote>, fd: Fd) -> Result<u64> {
        let mut h = self.handles.lock().unwrap_or_else(|p| p.into_inner());
        if h.len() >= self.handles_max {
            drop(h);
            let _ = client.close(fd);
            return Err(Errno::from(libc::ENFILE));
        }
        let fh = self.fh_next.fetch_add(1, Ordering::Relaxed);
        h.insert(fh, Handle { client, fd });
        STATS.handles_open.store(h.len() as u64, Ordering::Relaxed);
        Ok(fh)
    }

    async fn stat_path(&self, req: &Request, path: String) -> Result<FileAttr> {
        let c = self.client(req)?;
        blocking(move || c.stat(&path)).await.map(|st| attr(&st))
    }

    async fn open_path(&self, req: &Request, path: String, flags: i32, mode: u32) -> Result<(u64, FileAttr)> {
        let c = self.client(req)?;
        let (fd, st) = blocking(move || {
            let fd = c.open(&path, flags, mode)?;
            match c.fstat(fd) {
                Ok(st) => Ok((fd, st, c)),
                Err(e) => {
                    let _ = c.close(fd);
                    Err(e)
                }
            }
        })
        .await
        .map(|(fd, st, c)| ((fd, c), st))?;
        let fh = self.add_handle(fd.1, fd.0)?;
        Ok((fh, attr(&st)))
    }
}

impl PathFilesystem for SluiceFs {
    async fn init(&self, _req: Request) -> Result<ReplyInit> {
        Ok(ReplyInit::new(NonZeroU32::new(MAX_WRITE_BYTES).expect("non-zero")))
    }

    async fn destroy(&self, _req: Request) {}

    async fn lookup(&self, req: Request, parent: &OsStr, name: &OsStr) -> Result<ReplyEntry> {
        let attr = self.stat_path(&req, join(parent, name)?).await?;
        Ok(ReplyEntry { ttl: TTL, attr })
    }

    async fn getattr(&self, req: Request, path: Option<&OsStr>, fh: Option<u64>, _flags: u32) -> Result<ReplyAttr> {
        let attr = match (fh, path) {
            (Some(fh), _) => {
                let (c, fd) = self.handle(fh)?;
                blocking(move || c.fstat(fd)).await.map(|st| attr(&st))?
            }
            (None, Some(p)) => self.stat_path(&req, server_path(p)?).await?,
            (None, None) => return Err(Errno::from(libc::ENOENT)),
        };
        Ok(ReplyAttr { ttl: TTL, attr })
    }

    /// Only the size is forwarded (truncate). Mode, owner and times are not
    /// part of the protocol; they are accepted and left unchanged, as
    /// documented in docs/fuse.md, so `cp -p` and `tar x` do not fail.
    async fn setattr(&self, req: Request, path: Option<&OsStr>, fh: Option<u64>, set: SetAttr) -> Result<ReplyAttr> {
        if let Some(size) = set.size {
            match (fh, path) {
                (Some(fh), _) => {
                    let (c, fd) = self.handle(fh)?;
                    blocking(move || c.ftruncate(fd, size)).await?;
                }
                (None, Some(p)) => {
                    let (c, path) = (self.client(&req)?, server_path(p)?);
                    blocking(move || {
                        let fd = c.open(&path, libc::O_WRONLY, 0)?;
                        let r = c.ftruncate(fd, size);
                        let _ = c.close(fd);
                        r
                    })
                    .await?;
                }
                (None, None) => return Err(Errno::from(libc::ENOENT)),
            }
        }
        self.getattr(req, path, fh, 0).await
    }

    async fn open(&self, req: Request, path: &OsStr, flags: u32) -> Result<ReplyOpen> {
        let flags = flags as i32 & !(libc::O_CREAT | libc::O_EXCL);
        let (fh, _) = self.open_path(&req, server_path(path)?, flags, 0).await?;
        Ok(ReplyOpen { fh, flags: FOPEN_DIRECT_IO })
    }

    async fn create(&self, req: Request, parent: &OsStr, name: &OsStr, mode: u32, flags: u32) -> Result<ReplyCreated> {
        let (fh, attr) = self.open_path(&req, join(parent, name)?, flags as i32 | libc::O_CREAT, mode & 0o7777).await?;
        Ok(ReplyCreated { ttl: TTL, attr, generation: 0, fh, flags: FOPEN_DIRECT_IO })
    }

    async fn read(&self, _req: Request, _path: Option<&OsStr>, fh: u64, offset: u64, size: u32) -> Result<ReplyData> {
        let since = Instant::now();
        let (c, fd) = self.handle(fh)?;
        // Inside a cache lease the read is a `pread` from the page cache:
        // done here, without a hop to a blocking thread.
        let mut buf = vec![0u8; size as usize];
        match c.pread_leased(fd, &mut buf, offset) {
            Some(Ok(n)) => {
                buf.truncate(n);
                STATS.leased_reads.fetch_add(1, Ordering::Relaxed);
                STATS.data(false, n, since);
                return Ok(ReplyData { data: Bytes::from(buf) });
            }
            Some(Err(e)) => return Err(errno(e)),
            None => {}
        }
        let data = blocking(move || {
            let n = c.pread(fd, &mut buf, offset)?;
            buf.truncate(n);
            Ok(buf)
        })
        .await?;
        STATS.data(false, data.len(), since);
        Ok(ReplyData { data: Bytes::from(data) })
    }

    async fn write(&self, _req: Request, _path: Option<&OsStr>, fh: u64, offset: u64, data: &[u8], _write_flags: u32, _flags: u32) -> Result<ReplyWrite> {
        let since = Instant::now();
        let (c, fd) = self.handle(fh)?;
        let data = data.to_vec();
        let written = blocking(move || c.pwrite(fd, &data, offset)).await?;
        STATS.data(true, written, since);
        Ok(ReplyWrite { written: written as u32 })
    }

    async fn release(&self, _req: Request, _path: Option<&OsStr>, fh: u64, _flags: u32, _lock_owner: u64, _flush: bool) -> Result<()> {
        let h = {
            let mut all = self.handles.lock().unwrap_or_else(|p| p.into_inner());
            let h = all.remove(&fh);
            STATS.handles_open.store(all.len() as u64, Ordering::Relaxed);
            h
        };
        match h {
            Some(h) => blocking(move || h.client.close(h.fd)).await,
            None => Err(Errno::from(libc::EBADF)),
        }
    }

    async fn fsync(&self, _req: Request, _path: Option<&OsStr>, fh: u64, datasync: bool) -> Result<()> {
        let (c, fd) = self.handle(fh)?;
        blocking(move || if datasync { c.fdatasync(fd) } else { c.fsync(fd) }).await
    }

    async fn flush(&self, _req: Request, _path: Option<&OsStr>, _fh: u64, _lock_owner: u64) -> Result<()> {
        Ok(())
    }

    async fn mkdir(&self, req: Request, parent: &OsStr, name: &OsStr, mode: u32, _umask: u32) -> Result<ReplyEntry> {
        let (c, path) = (self.client(&req)?, join(parent, name)?);
        let st = blocking(move || {
            c.mkdir(&path, mode & 0o7777)?;
            c.stat(&path)
        })
        .await?;
        Ok(ReplyEntry { ttl: TTL, attr: attr(&st) })
    }

    async fn unlink(&self, req: Request, parent: &OsStr, name: &OsStr) -> Result<()> {
        let (c, path) = (self.client(&req)?, join(parent, name)?);
        blocking(move || c.unlink(&path)).await
    }

    async fn rmdir(&self, req: Request, parent: &OsStr, name: &OsStr) -> Result<()> {
        let (c, path) = (self.client(&req)?, join(parent, name)?);
        blocking(move || c.rmdir(&path)).await
    }

    async fn rename(&self, req: Request, origin_parent: &OsStr, origin_name: &OsStr, parent: &OsStr, name: &OsStr) -> Result<()> {
        let (c, from, to) = (self.client(&req)?, join(origin_parent, origin_name)?, join(parent, name)?);
        blocking(move || c.rename(&from, &to)).await
    }

    async fn opendir(&self, _req: Request, _path: &OsStr, _flags: u32) -> Result<ReplyOpen> {
        Ok(ReplyOpen { fh: 0, flags: 0 })
    }

    async fn readdir<'a>(
        &'a self,
        req: Request,
        path: &'a OsStr,
        _fh: u64,
        offset: i64,
    ) -> Result<ReplyDirectory<impl futures_util::Stream<Item = Result<DirectoryEntry>> + Send + 'a>> {
        let (c, p) = (self.client(&req)?, server_path(path)?);
        let list = blocking(move || c.readdir(&p)).await?;
        let dots = [(FileType::Directory, "."), (FileType::Directory, "..")].into_iter().map(|(k, n)| (k, OsString::from(n)));
        let all = dots.chain(list.into_iter().map(|e| (kind(e.kind), OsString::from(e.name))));
        let entries: Vec<_> = all.enumerate().skip(offset.max(0) as usize).map(|(i, (kind, name))| Ok(DirectoryEntry { kind, name, offset: i as i64 + 1 })).collect();
        Ok(ReplyDirectory { entries: stream::iter(entries) })
    }

    async fn readdirplus<'a>(
        &'a self,
        req: Request,
        parent: &'a OsStr,
        _fh: u64,
        offset: u64,
        _lock_owner: u64,
    ) -> Result<ReplyDirectoryPlus<impl futures_util::Stream<Item = Result<DirectoryEntryPlus>> + Send + 'a>> {
        let (c, dir) = (self.client(&req)?, server_path(parent)?);
        let entries = blocking(move || {
            let list = c.readdir(&dir)?;
            let here = c.stat(&dir)?;
            let mut out = vec![(OsString::from("."), here), (OsString::from(".."), here)];
            for e in list {
                let path = if dir == "." { e.name.clone() } else { format!("{dir}/{}", e.name) };
                // An entry removed meanwhile is skipped, not an error.
                if let Ok(st) = c.stat(&path) {
                    out.push((OsString::from(e.name), st));
                }
            }
            Ok(out)
        })
        .await?;
        let entries: Vec<_> = entries
            .into_iter()
            .enumerate()
            .skip(offset as usize)
            .map(|(i, (name, st))| {
                let attr = attr(&st);
                Ok(DirectoryEntryPlus { kind: attr.kind, name, offset: i as i64 + 1, attr, entry_ttl: TTL, attr_ttl: TTL })
            })
            .collect();
        Ok(ReplyDirectoryPlus { entries: stream::iter(entries) })
    }

    async fn releasedir(&self, _req: Request, _path: &OsStr, _fh: u64, _flags: u32) -> Result<()> {
        Ok(())
    }

    async fn statfs(&self, _req: Request, _path: &OsStr) -> Result<ReplyStatFs> {
        Ok(ReplyStatFs { blocks: 0, bfree: 0, bavail: 0, files: 0, ffree: 0, bsize: 4096, namelen: 255, frsize: 4096 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_server::{Listen, Server, ServerConfig};

    /// An in-process server on a temporary directory, stopped on drop.
    struct Served(sluice_server::ServerHandle, std::path::PathBuf);

    impl Drop for Served {
        fn drop(&mut self) {
            let _ = self.0.shutdown();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }

    fn served(name: &str) -> Served {
        let dir = std::env::temp_dir().join(format!("sluice-fuse-unit-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), b"x").unwrap();
        let h = Server::start(ServerConfig::new(&dir, Listen::Unix(dir.join("s.sock")))).unwrap();
        Served(h, dir)
    }

    #[test]
    fn connections_table_holds_at_most_connections_max() {
        let s = served("conns");
        let conns = Conns::new(s.0.addr().to_string(), RemoteKind::Server, Some("bound-test".into()));
        for pid in 0..CONNECTIONS_MAX as u32 {
            conns.get(Caller { pid, uid: 0, gid: 0 }).unwrap();
        }
        assert_eq!(conns.len(), CONNECTIONS_MAX, "N connections kept");
        conns.get(Caller { pid: CONNECTIONS_MAX as u32, uid: 0, gid: 0 }).unwrap();
        assert_eq!(conns.len(), CONNECTIONS_MAX, "the N+1st evicts the least recently used");
    }

    #[test]
    fn open_handles_past_the_bound_are_refused_with_enfile() {
        let s = served("handles");
        let mut fs = SluiceFs::new(MountConfig::new(s.0.addr().to_string(), "/unused"), RemoteKind::Server);
        fs.handles_max = 2;
        let c = Arc::new(Remote::connect(s.0.addr()).unwrap());
        for _ in 0..2 {
            let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
            fs.add_handle(Arc::clone(&c), fd).unwrap();
        }
        let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
        assert_eq!(fs.add_handle(Arc::clone(&c), fd).err(), Some(Errno::from(libc::ENFILE)));
    }
}
