//! Migration of finished output to a slower tier (Panda's migration, seed
//! `001`): `sluice array migrate`.
//!
//! A group (a timestep) or an array is copied, file by file, to another
//! path on the same server or to another server or cluster, through
//! connections in the scheduler's background class (weight 0), so the
//! copy takes the device only when the running applications leave it
//! idle. Each copied file is synced and read back, and its CRC32C
//! compared with the source's, before anything is removed. Then the
//! source's `zarr.json` is replaced (write to a temporary name, rename)
//! by one that keeps its node type and attributes and adds
//! [`MIGRATED_ATTRIBUTE`]: where the data went. Only then are the source's
//! other files removed (unless `keep`). [`resolve`] follows the mark, so
//! `sluice array read|info|cat|verify` of a migrated path, or of an array
//! inside a migrated group, read the new tier. The destination is a
//! complete Zarr v3 hierarchy that zarr-python and xarray open directly.
//!
//! A reader that resolved the old path before the switch and opens a file
//! after the removal gets ENOENT; resolving again finds the new tier.
//! Bounds: at most [`MIGRATE_FILES_MAX`] files, copied in pieces of
//! [`COPY_PIECE_BYTES`] with at most [`COPY_PIECES_IN_FLIGHT`] in flight
//! (one window of memory whatever the file's size), a `zarr.json` of at
//! most 16 MiB, and at most [`RESOLVE_HOPS_MAX`] marks followed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_client::{ConnectOptions, FileKind};
use sluice_remote::Remote;

use crate::Error;

/// The attribute of a migrated node's `zarr.json`: `{"path": P, "server":
/// ADDR or null (the same server), "files": N, "bytes": B}`.
pub const MIGRATED_ATTRIBUTE: &str = "sluice_migrated";
/// Most files one migration copies (a timestep of a large run has
/// thousands of chunk or shard files).
pub const MIGRATE_FILES_MAX: usize = 1 << 20;
/// A copy moves files in pieces of this size (the client's shared-memory
/// slot, and a dispatch the scheduler may still join with others).
pub const COPY_PIECE_BYTES: usize = 1 << 20;
/// Pieces of one file read or written at once.
pub const COPY_PIECES_IN_FLIGHT: usize = 8;
/// Most migration marks one [`resolve`] follows (a chain of migrations
/// from tier to tier; a loop ends here with an error).
pub const RESOLVE_HOPS_MAX: usize = 8;

/// What a migration did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migrated {
    pub files: u64,
    pub bytes: u64,
    /// Source files removed (0 with `keep`).
    pub removed: u64,
    pub elapsed: Duration,
}

/// Where a migration goes.
#[derive(Clone, Debug)]
pub struct Target {
    /// The destination's address when it is another server or cluster;
    /// `None`: the source's own server.
    pub addr: Option<String>,
    /// Path of the copy (must not exist yet, or be an empty directory).
    pub path: String,
}

fn client_err(what: &str) -> impl Fn(sluice_client::ClientError) -> Error + '_ {
    move |e| Error::client(what, e)
}

/// Connection options of the background class: weight 0, as an
/// application of its own (`<application>-migrate`): the class belongs to
/// the application, and a migration started inside a job must not put the
/// job's own I/O in the background.
pub fn background() -> ConnectOptions {
    ConnectOptions { weight: 0, app: Some(format!("{}-migrate", sluice_client::default_app())), ..ConnectOptions::default() }
}

/// The temporary name of the mark while it is written.
const MARK_TMP: &str = ".zarr.json.migrating";

fn join(a: &str, b: &str) -> String {
    match (a.trim_matches('/'), b.trim_matches('/')) {
        ("", b) => b.to_string(),
        (a, "") => a.to_string(),
        (a, b) => format!("{a}/{b}"),
    }
}

/// Every regular file under `root` (relative paths, sorted), and every
/// directory (parents first).
fn walk(remote: &Remote, root: &str) -> Result<(Vec<String>, Vec<String>), Error> {
    let (mut files, mut dirs, mut todo) = (Vec::new(), Vec::new(), vec![String::new()]);
    while let Some(rel) = todo.pop() {
        let path = join(root, &rel);
        let mut entries = remote.readdir(&path).map_err(client_err(&path))?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        for e in entries {
            let child = join(&rel, &e.name);
            if e.name == MARK_TMP {
                // A mark an earlier, failed run left half written.
                continue;
            }
            match e.kind {
                FileKind::Dir => {
                    dirs.push(child.clone());
                    todo.push(child);
                }
                FileKind::File => files.push(child),
                _ => return Err(Error::new(format!("{}: not a regular file or directory; migration copies only those", join(root, &child)))),
            }
            if files.len() > MIGRATE_FILES_MAX {
                return Err(Error::new(format!("{root}: more than {MIGRATE_FILES_MAX} files (MIGRATE_FILES_MAX)")));
            }
        }
    }
    files.sort();
    dirs.sort_by_key(|d| d.matches('/').count());
    Ok((files, dirs))
}

/// Most bytes of a `zarr.json` read whole.
const METADATA_BYTES_MAX: u64 = 16 << 20;

/// Read a small file (metadata) whole.
fn read_all(remote: &Remote, path: &str) -> Result<Vec<u8>, Error> {
    let fd = remote.open(path, libc::O_RDONLY, 0).map_err(client_err(path))?;
    let r = (|| {
        let size = remote.fstat(fd).map_err(client_err(path))?.size;
        if size > METADATA_BYTES_MAX {
            return Err(Error::new(format!("{path}: {size} bytes, more than a zarr.json may have ({METADATA_BYTES_MAX})")));
        }
        let mut buf = vec![0u8; size as usize];
        let n = remote.read_pipelined(fd, &mut buf, 0, COPY_PIECE_BYTES).map_err(client_err(path))?;
        buf.truncate(n);
        Ok(buf)
    })();
    let closed = remote.close(fd).map_err(client_err(path));
    let buf = r?;
    closed?;
    Ok(buf)
}

/// Write a small file (metadata) whole, and sync it.
fn write_all(remote: &Remote, path: &str, data: &[u8]) -> Result<(), Error> {
    let fd = remote.open(path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o644).map_err(client_err(path))?;
    let r = (|| {
        remote.write_pipelined(fd, data, 0, COPY_PIECE_BYTES).map_err(client_err(path))?;
        remote.fsync(fd).map_err(client_err(path))
    })();
    let closed = remote.close(fd).map_err(client_err(path));
    r?;
    closed
}

/// The CRC32C and length of a file, read in bounded windows.
fn checksum(remote: &Remote, path: &str, fd: sluice_client::Fd, buf: &mut [u8]) -> Result<(u32, u64), Error> {
    let (mut crc, mut off) = (0u32, 0u64);
    loop {
        let n = remote.read_pipelined(fd, buf, off, COPY_PIECE_BYTES).map_err(client_err(path))?;
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        off += n as u64;
        if n < buf.len() {
            return Ok((crc, off));
        }
    }
}

/// Copy one file in windows of `COPY_PIECES_IN_FLIGHT` pieces, sync it,
/// and check the copy: read back, the same length and CRC32C. Returns its
/// bytes.
fn copy_file(src: &Remote, from: &str, dst: &Remote, to: &str) -> Result<u64, Error> {
    let mut buf = vec![0u8; COPY_PIECE_BYTES * COPY_PIECES_IN_FLIGHT];
    let sfd = src.open(from, libc::O_RDONLY, 0).map_err(client_err(from))?;
    let dfd = match dst.open(to, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o644) {
        Ok(fd) => fd,
        Err(e) => {
            let _ = src.close(sfd);
            return Err(Error::client(to, e));
        }
    };
    let r = (|| {
        let (mut crc, mut off) = (0u32, 0u64);
        loop {
            let n = src.read_pipelined(sfd, &mut buf, off, COPY_PIECE_BYTES).map_err(client_err(from))?;
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            dst.write_pipelined(dfd, &buf[..n], off, COPY_PIECE_BYTES).map_err(client_err(to))?;
            off += n as u64;
            if n < buf.len() {
                break;
            }
        }
        dst.fsync(dfd).map_err(client_err(to))?;
        let back = checksum(dst, to, dfd, &mut buf)?;
        if back != (crc, off) {
            return Err(Error::new(format!("{to}: the copy read back differs from {from} ({} vs {off} bytes, crc32c {:08x} vs {crc:08x}); the source is kept", back.1, back.0)));
        }
        Ok(off)
    })();
    let closed = (src.close(sfd).map_err(client_err(from)), dst.close(dfd).map_err(client_err(to)));
    let n = r?;
    closed.0?;
    closed.1?;
    Ok(n)
}

fn zarr_json_path(path: &str) -> String {
    join(path, "zarr.json")
}

fn parse_json(path: &str, bytes: &[u8]) -> Result<Value, Error> {
    serde_json::from_slice(bytes).map_err(|e| Error::new(format!("{path}: {e}")))
}

/// Migrate the group or array at `path` on `src` to `target`. `dst` is
/// the connection to the target (the same as `src` when `target.addr` is
/// `None`). `keep`: leave the source's data in place (only the mark is
/// written).
pub fn migrate(src: &Remote, path: &str, dst: &Remote, target: &Target, keep: bool) -> Result<Migrated, Error> {
    let t0 = Instant::now();
    let path = path.trim_matches('/').to_string();
    let to = target.path.trim_matches('/').to_string();
    if path.is_empty() || to.is_empty() {
        return Err(Error::new("migration needs a source and a target path (not the root)"));
    }
    if target.addr.is_none() && (to == path || to.starts_with(&format!("{path}/")) || path.starts_with(&format!("{to}/"))) {
        return Err(Error::new(format!("{to} and {path} overlap: the target must lie outside the source on the same server")));
    }
    let meta_path = zarr_json_path(&path);
    let meta_bytes = read_all(src, &meta_path).map_err(|e| {
        if e.errno == Some(libc::ENOENT) {
            Error { message: format!("{path}: no zarr.json (not a Zarr v3 group or array)"), ..e }
        } else {
            e
        }
    })?;
    let meta = parse_json(&meta_path, &meta_bytes)?;
    if !meta["attributes"][MIGRATED_ATTRIBUTE].is_null() {
        return Err(Error::new(format!("{path} was already migrated to {}", meta["attributes"][MIGRATED_ATTRIBUTE])));
    }
    let (files, dirs) = walk(src, &path)?;
    // The target: created fresh, parents included.
    let mut prefix = String::new();
    for part in to.split('/') {
        prefix = join(&prefix, part);
        match dst.mkdir(&prefix, 0o755) {
            Ok(()) => {}
            Err(e) if e.posix_errno() == libc::EEXIST => {}
            Err(e) => return Err(Error::client(&prefix, e)),
        }
    }
    if !dst.readdir(&to).map_err(client_err(&to))?.is_empty() {
        return Err(Error::new(format!("{to}: exists and is not empty; migration writes only into a new or empty directory")));
    }
    for d in &dirs {
        let p = join(&to, d);
        dst.mkdir(&p, 0o755).map_err(client_err(&p))?;
    }
    let mut bytes = 0;
    for f in &files {
        bytes += copy_file(src, &join(&path, f), dst, &join(&to, f))?;
    }
    // The switch: the source's zarr.json now says where the data is.
    let mut marked = meta.clone();
    marked["attributes"][MIGRATED_ATTRIBUTE] = json!({ "path": to, "server": target.addr, "files": files.len(), "bytes": bytes });
    let text = serde_json::to_vec_pretty(&marked).map_err(Error::other)?;
    let tmp = join(&path, MARK_TMP);
    write_all(src, &tmp, &text)?;
    src.rename(&tmp, &meta_path).map_err(client_err(&meta_path))?;
    let mut removed = 0;
    if !keep {
        // The nested nodes' metadata first: a reader that resolves while
        // the data goes finds no unmarked zarr.json below the mark, so it
        // follows the mark instead of reading missing chunks as fill.
        let (meta, data): (Vec<&String>, Vec<&String>) = files.iter().filter(|f| f.as_str() != "zarr.json").partition(|f| f.rsplit('/').next() == Some("zarr.json"));
        for f in meta.into_iter().chain(data) {
            let p = join(&path, f);
            src.unlink(&p).map_err(client_err(&p))?;
            removed += 1;
        }
        for d in dirs.iter().rev() {
            let p = join(&path, d);
            src.rmdir(&p).map_err(client_err(&p))?;
        }
    }
    Ok(Migrated { files: files.len() as u64, bytes, removed, elapsed: t0.elapsed() })
}

/// Where the array or group at `path` on `addr` is now: follows the
/// migration mark of the highest marked `zarr.json` at or above `path`.
/// Returns the address and path to read (`addr` and `path` when not
/// migrated).
pub fn resolve(addr: &str, remote: Arc<Remote>, path: &str) -> Result<(String, Arc<Remote>, String), Error> {
    let (mut addr, mut remote, mut path) = (addr.to_string(), remote, path.trim_matches('/').to_string());
    for _ in 0..RESOLVE_HOPS_MAX {
        match mark(&remote, &path)? {
            None => return Ok((addr, remote, path)),
            Some((server, new_path)) => {
                if let Some(s) = server {
                    remote = Arc::new(Remote::connect(&s).map_err(client_err(&s))?);
                    addr = s;
                }
                path = new_path;
            }
        }
    }
    Err(Error::new(format!("{path}: more than {RESOLVE_HOPS_MAX} migration marks (RESOLVE_HOPS_MAX); a loop?")))
}

/// The mark of the highest marked `zarr.json` at or above `path`,
/// applied to `path`: `(server, path there)`. From the root down, so that
/// a marked group wins over an unmarked node below it that a removal in
/// progress has not reached yet.
fn mark(remote: &Remote, path: &str) -> Result<Option<(Option<String>, String)>, Error> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    for n in 0..=parts.len() {
        let node = parts[..n].join("/");
        let meta_path = zarr_json_path(&node);
        let bytes = match read_all(remote, &meta_path) {
            Ok(b) => b,
            Err(e) if e.errno == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        let meta = parse_json(&meta_path, &bytes)?;
        let m = &meta["attributes"][MIGRATED_ATTRIBUTE];
        if m.is_null() {
            continue;
        }
        let to = m["path"].as_str().ok_or_else(|| Error::new(format!("{meta_path}: {MIGRATED_ATTRIBUTE} without a path")))?;
        let rest = parts[n..].join("/");
        return Ok(Some((m["server"].as_str().map(str::to_string), join(to, &rest))));
    }
    Ok(None)
}
