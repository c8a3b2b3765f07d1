//! A zarrs store over a sluice address (one server or a cluster), so that
//! the zarrs crate reads and writes Zarr v3 through the scheduler.
//!
//! A key `a/b/zarr.json` is the file `ROOT/a/b/zarr.json` on the server.
//! A missing file is a missing key (`ENOENT` → `None`); every other error
//! is a storage error carrying the client's message (with its errno).
//! Listing walks directories with `readdir`, bounded by
//! [`STORE_LIST_KEYS_MAX`].

use std::sync::Arc;

use sluice_client::{ClientError, FileKind};
use sluice_remote::Remote;
use zarrs::storage::byte_range::{ByteRange, ByteRangeIterator};
use zarrs::storage::{
    Bytes, ListableStorageTraits, MaybeBytesIterator, OffsetBytesIterator, ReadableStorageTraits, StorageError, StoreKey, StoreKeys, StoreKeysPrefixes, StorePrefix,
    WritableStorageTraits,
};

/// The most keys one listing returns; past it, the listing is an error
/// rather than a silent truncation.
pub const STORE_LIST_KEYS_MAX: usize = 1 << 20;

/// Zarr keys under `root` on a sluice address.
pub struct SluiceStore {
    remote: Arc<Remote>,
    root: String,
    list_keys_max: usize,
}

fn storage_error(what: &str, e: ClientError) -> StorageError {
    StorageError::Other(format!("{what}: {e}"))
}

fn enoent(e: &ClientError) -> bool {
    e.posix_errno() == libc::ENOENT
}

impl SluiceStore {
    /// Keys under `root` (a server path; empty for the server's root).
    pub fn new(remote: Arc<Remote>, root: &str) -> SluiceStore {
        SluiceStore { remote, root: root.trim_matches('/').to_string(), list_keys_max: STORE_LIST_KEYS_MAX }
    }

    /// Lower the listing bound (tests).
    pub fn with_list_keys_max(mut self, n: usize) -> SluiceStore {
        self.list_keys_max = n;
        self
    }

    pub fn remote(&self) -> &Remote {
        &self.remote
    }

    fn path(&self, key: &str) -> String {
        match (self.root.is_empty(), key.is_empty()) {
            (true, _) => key.to_string(),
            (false, true) => self.root.clone(),
            (false, false) => format!("{}/{key}", self.root),
        }
    }

    fn read_ranges(&self, key: &StoreKey, ranges: Vec<ByteRange>) -> Result<Option<Vec<Bytes>>, StorageError> {
        let path = self.path(key.as_str());
        let fd = match self.remote.open(&path, libc::O_RDONLY, 0) {
            Ok(fd) => fd,
            Err(e) if enoent(&e) => return Ok(None),
            Err(e) => return Err(storage_error(&format!("open {path}"), e)),
        };
        let out = (|| {
            let size = self.remote.fstat(fd).map_err(|e| storage_error(&format!("stat {path}"), e))?.size;
            let mut out = Vec::with_capacity(ranges.len());
            for r in ranges {
                let (start, len) = (r.start(size), r.length(size));
                if start + len > size {
                    return Err(StorageError::Other(format!("{path}: range {start}+{len} past its {size} bytes")));
                }
                let mut buf = vec![0u8; len as usize];
                let mut at = 0;
                while at < buf.len() {
                    let n = self.remote.pread(fd, &mut buf[at..], start + at as u64).map_err(|e| storage_error(&format!("read {path}"), e))?;
                    if n == 0 {
                        return Err(StorageError::Other(format!("{path}: file shrank while read")));
                    }
                    at += n;
                }
                out.push(Bytes::from(buf));
            }
            Ok(out)
        })();
        let _ = self.remote.close(fd);
        out.map(Some)
    }

    fn mkdir_parents(&self, path: &str) -> Result<(), StorageError> {
        let mut at = 0;
        while let Some(i) = path[at..].find('/') {
            let dir = &path[..at + i];
            match self.remote.mkdir(dir, 0o755) {
                Ok(()) => {}
                Err(e) if e.posix_errno() == libc::EEXIST => {}
                Err(e) => return Err(storage_error(&format!("mkdir {dir}"), e)),
            }
            at += i + 1;
        }
        Ok(())
    }

    fn write_at(&self, key: &StoreKey, flags: i32, parts: &mut dyn Iterator<Item = (u64, Bytes)>) -> Result<(), StorageError> {
        let path = self.path(key.as_str());
        self.mkdir_parents(&path)?;
        let fd = self.remote.open(&path, libc::O_WRONLY | libc::O_CREAT | flags, 0o644).map_err(|e| storage_error(&format!("create {path}"), e))?;
        let mut r = Ok(());
        for (off, data) in parts {
            r = self.remote.pwrite(fd, &data, off).map(|_| ()).map_err(|e| storage_error(&format!("write {path}"), e));
            if r.is_err() {
                break;
            }
        }
        let c = self.remote.close(fd).map_err(|e| storage_error(&format!("close {path}"), e));
        r.and(c)
    }

    /// Every file key under `dir` (a key prefix without its slash).
    fn walk(&self, dir: &str, out: &mut Vec<StoreKey>) -> Result<(), StorageError> {
        let entries = match self.remote.readdir(&self.path(dir)) {
            Ok(v) => v,
            Err(e) if enoent(&e) => return Ok(()),
            Err(e) => return Err(storage_error(&format!("list {}", self.path(dir)), e)),
        };
        for e in entries {
            let key = if dir.is_empty() { e.name.clone() } else { format!("{dir}/{}", e.name) };
            if e.kind == FileKind::Dir {
                self.walk(&key, out)?;
            } else {
                if out.len() >= self.list_keys_max {
                    return Err(StorageError::Other(format!("more than {} keys under {:?} (STORE_LIST_KEYS_MAX)", self.list_keys_max, self.root)));
                }
                out.push(StoreKey::new(key).map_err(|e| StorageError::Other(e.to_string()))?);
            }
        }
        Ok(())
    }
}

impl ReadableStorageTraits for SluiceStore {
    fn get_partial_many<'a>(&'a self, key: &StoreKey, ranges: ByteRangeIterator<'a>) -> Result<MaybeBytesIterator<'a>, StorageError> {
        Ok(self.read_ranges(key, ranges.collect())?.map(|v| Box::new(v.into_iter().map(Ok)) as _))
    }

    fn size_key(&self, key: &StoreKey) -> Result<Option<u64>, StorageError> {
        match self.remote.stat(&self.path(key.as_str())) {
            Ok(st) => Ok(Some(st.size)),
            Err(e) if enoent(&e) => Ok(None),
            Err(e) => Err(storage_error(&format!("stat {}", key.as_str()), e)),
        }
    }

    fn supports_get_partial(&self) -> bool {
        true
    }
}

impl WritableStorageTraits for SluiceStore {
    fn set(&self, key: &StoreKey, value: Bytes) -> Result<(), StorageError> {
        self.write_at(key, libc::O_TRUNC, &mut std::iter::once((0, value)))
    }

    fn set_partial_many(&self, key: &StoreKey, mut offset_values: OffsetBytesIterator) -> Result<(), StorageError> {
        self.write_at(key, 0, &mut offset_values)
    }

    fn erase(&self, key: &StoreKey) -> Result<(), StorageError> {
        match self.remote.unlink(&self.path(key.as_str())) {
            Ok(()) => Ok(()),
            Err(e) if enoent(&e) => Ok(()),
            Err(e) => Err(storage_error(&format!("remove {}", key.as_str()), e)),
        }
    }

    fn erase_prefix(&self, prefix: &StorePrefix) -> Result<(), StorageError> {
        for key in self.list_prefix(prefix)? {
            self.erase(&key)?;
        }
        Ok(())
    }

    fn supports_set_partial(&self) -> bool {
        true
    }
}

impl ListableStorageTraits for SluiceStore {
    fn list(&self) -> Result<StoreKeys, StorageError> {
        self.list_prefix(&StorePrefix::root())
    }

    fn list_prefix(&self, prefix: &StorePrefix) -> Result<StoreKeys, StorageError> {
        let mut out = Vec::new();
        self.walk(prefix.as_str().trim_end_matches('/'), &mut out)?;
        out.sort();
        Ok(out)
    }

    fn list_dir(&self, prefix: &StorePrefix) -> Result<StoreKeysPrefixes, StorageError> {
        let dir = prefix.as_str().trim_end_matches('/');
        let entries = match self.remote.readdir(&self.path(dir)) {
            Ok(v) => v,
            Err(e) if enoent(&e) => Vec::new(),
            Err(e) => return Err(storage_error(&format!("list {}", self.path(dir)), e)),
        };
        let (mut keys, mut prefixes) = (Vec::new(), Vec::new());
        for e in entries.into_iter().take(self.list_keys_max) {
            let name = if dir.is_empty() { e.name } else { format!("{dir}/{}", e.name) };
            if e.kind == FileKind::Dir {
                prefixes.push(StorePrefix::new(format!("{name}/")).map_err(|e| StorageError::Other(e.to_string()))?);
            } else {
                keys.push(StoreKey::new(name).map_err(|e| StorageError::Other(e.to_string()))?);
            }
        }
        Ok(StoreKeysPrefixes::new(keys, prefixes))
    }

    fn size_prefix(&self, prefix: &StorePrefix) -> Result<u64, StorageError> {
        let mut total = 0;
        for key in self.list_prefix(prefix)? {
            total += self.size_key(&key)?.unwrap_or(0);
        }
        Ok(total)
    }
}
