//! The metadata store: the namespace (directories and files, keyed by
//! their full path) and each file's layout, in a `redb` database. Every
//! change is one committed write transaction, so it survives a crash.
//!
//! Directories carry a default `LayoutRequest`; `mkdir` copies the
//! parent's, and a new file fills its unset layout fields from its parent's
//! default (Lustre's inheritance). The root's default is
//! `LayoutRequest::ROOT_DEFAULT` until `setstripe` changes it.

use std::path::Path;

use redb::{Database, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use sluice_stripe::{Layout, LayoutRequest, SERVERS_MAX};

use crate::error::{Error, ErrorKind, Result};

/// Path (no leading `/`; the root is `""`) → JSON-encoded [`Entry`].
const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("entries");
/// Named counters and settings.
const CONFIG: TableDefinition<&str, u64> = TableDefinition::new("config");
/// The last file id handed out.
const NEXT_ID_KEY: &str = "last_file_id";
/// Data servers the cluster had when the store was last opened.
const SERVERS_KEY: &str = "servers";

/// Most entries `readdir` returns for one directory; past it, an error
/// (the wire frame and the caller's memory stay bounded).
pub const META_DIR_ENTRIES_MAX: usize = 4096;
/// Longest path the namespace accepts, in bytes.
pub const META_PATH_BYTES_MAX: usize = 4096;

/// Directory or file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    Dir,
    File,
}

/// One namespace entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub kind: EntryKind,
    /// File id (names the objects); 0 for directories.
    pub id: u64,
    /// The file's layout; `None` for directories.
    pub layout: Option<Layout>,
    /// A directory's default for new files and subdirectories.
    pub default: Option<LayoutRequest>,
}

/// The namespace and layouts of one cluster.
pub struct MetaStore {
    db: Database,
    servers: u32,
    dir_entries_max: usize,
}

/// `a/b/c` from `/a//b/c/`; refuses `.`, `..` and over-long paths.
pub fn normalize(path: &str) -> Result<String> {
    if path.len() > META_PATH_BYTES_MAX {
        return Err(Error::new(ErrorKind::Limit, libc::ENAMETOOLONG, format!("path of {} bytes exceeds {META_PATH_BYTES_MAX}", path.len())));
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.iter().any(|p| *p == "." || *p == "..") {
        return Err(Error::invalid(format!("path {path:?}: . and .. are not allowed")));
    }
    Ok(parts.join("/"))
}

fn parent_of(path: &str) -> &str {
    path.rfind('/').map_or("", |i| &path[..i])
}

fn decode(path: &str, bytes: &[u8]) -> Result<Entry> {
    serde_json::from_slice(bytes).map_err(|e| Error::new(ErrorKind::Store, libc::EIO, format!("metadata entry {path:?} is corrupt: {e}")))
}

fn encode(e: &Entry) -> Vec<u8> {
    serde_json::to_vec(e).expect("an entry always serialises")
}

fn not_found(path: &str) -> Error {
    Error::new(ErrorKind::NotFound, libc::ENOENT, format!("{path:?}: no such file or directory"))
}

impl MetaStore {
    /// Open (or create) the database at `path` for a cluster of `servers`
    /// data servers; refuses fewer servers than the store was made with
    /// (existing layouts name them).
    pub fn open(path: &Path, servers: u32) -> Result<MetaStore> {
        if servers == 0 || servers > SERVERS_MAX {
            return Err(Error::invalid(format!("{servers} data servers: expected 1..={SERVERS_MAX}")));
        }
        let db = Database::create(path).map_err(Error::store)?;
        let tx = db.begin_write().map_err(Error::store)?;
        {
            let mut config = tx.open_table(CONFIG).map_err(Error::store)?;
            let before = config.get(SERVERS_KEY).map_err(Error::store)?.map(|v| v.value());
            if let Some(b) = before.filter(|&b| b > servers as u64) {
                return Err(Error::invalid(format!("the metadata store was made for {b} data servers; {servers} given")));
            }
            config.insert(SERVERS_KEY, servers as u64).map_err(Error::store)?;
            let mut entries = tx.open_table(ENTRIES).map_err(Error::store)?;
            if entries.get("").map_err(Error::store)?.is_none() {
                let root = Entry { kind: EntryKind::Dir, id: 0, layout: None, default: Some(LayoutRequest::ROOT_DEFAULT) };
                entries.insert("", encode(&root).as_slice()).map_err(Error::store)?;
            }
        }
        tx.commit().map_err(Error::store)?;
        Ok(MetaStore { db, servers, dir_entries_max: META_DIR_ENTRIES_MAX })
    }

    /// Lower the `readdir` bound (tests; a smaller reply frame).
    pub fn with_dir_entries_max(mut self, n: usize) -> MetaStore {
        self.dir_entries_max = n.min(META_DIR_ENTRIES_MAX);
        self
    }

    /// Data servers of the cluster.
    pub fn servers(&self) -> u32 {
        self.servers
    }

    /// The entry at `path`.
    pub fn lookup(&self, path: &str) -> Result<Entry> {
        let path = normalize(path)?;
        let tx = self.db.begin_read().map_err(Error::store)?;
        let t = tx.open_table(ENTRIES).map_err(Error::store)?;
        let got = t.get(path.as_str()).map_err(Error::store)?;
        got.map(|v| decode(&path, v.value())).unwrap_or_else(|| Err(not_found(&path)))
    }

    fn parent_dir(t: &impl ReadableTable<&'static str, &'static [u8]>, path: &str) -> Result<Entry> {
        if path.is_empty() {
            return Err(Error::new(ErrorKind::Exists, libc::EEXIST, "the root always exists"));
        }
        let parent = parent_of(path);
        let got = t.get(parent).map_err(Error::store)?.ok_or_else(|| not_found(parent))?;
        let e = decode(parent, got.value())?;
        if e.kind != EntryKind::Dir {
            return Err(Error::new(ErrorKind::NotDir, libc::ENOTDIR, format!("{parent:?} is not a directory")));
        }
        Ok(e)
    }

    /// Create file `path` with `req` (unset fields from the parent's
    /// default). An existing file is returned as it is unless `exclusive`.
    pub fn create(&self, path: &str, req: LayoutRequest, exclusive: bool) -> Result<Entry> {
        req.check()?;
        let path = normalize(path)?;
        let tx = self.db.begin_write().map_err(Error::store)?;
        let entry = {
            let mut t = tx.open_table(ENTRIES).map_err(Error::store)?;
            let parent = Self::parent_dir(&t, &path)?;
            let existing = t.get(path.as_str()).map_err(Error::store)?.map(|v| decode(&path, v.value()));
            if let Some(e) = existing {
                let e = e?;
                return match (e.kind, exclusive) {
                    (EntryKind::File, false) => Ok(e),
                    (EntryKind::Dir, _) => Err(Error::new(ErrorKind::IsDir, libc::EISDIR, format!("{path:?} is a directory"))),
                    _ => Err(Error::new(ErrorKind::Exists, libc::EEXIST, format!("{path:?} exists"))),
                };
            }
            let mut config = tx.open_table(CONFIG).map_err(Error::store)?;
            let id = config.get(NEXT_ID_KEY).map_err(Error::store)?.map_or(0, |v| v.value()) + 1;
            config.insert(NEXT_ID_KEY, id).map_err(Error::store)?;
            let inherited = req.inherit(&parent.default.unwrap_or(LayoutRequest::ROOT_DEFAULT));
            let layout = inherited.resolve(self.servers, id)?;
            let entry = Entry { kind: EntryKind::File, id, layout: Some(layout), default: None };
            t.insert(path.as_str(), encode(&entry).as_slice()).map_err(Error::store)?;
            entry
        };
        tx.commit().map_err(Error::store)?;
        Ok(entry)
    }

    /// Create directory `path`, inheriting its parent's default layout.
    pub fn mkdir(&self, path: &str) -> Result<Entry> {
        let path = normalize(path)?;
        self.write_entry(&path, |t, path| {
            let parent = Self::parent_dir(t, path)?;
            if t.get(path).map_err(Error::store)?.is_some() {
                return Err(Error::new(ErrorKind::Exists, libc::EEXIST, format!("{path:?} exists")));
            }
            Ok(Entry { kind: EntryKind::Dir, id: 0, layout: None, default: parent.default })
        })
    }

    /// Set directory `path`'s default layout for new entries (unset fields
    /// keep the current default's).
    pub fn set_dir_default(&self, path: &str, req: LayoutRequest) -> Result<Entry> {
        req.check()?;
        let path = normalize(path)?;
        self.write_entry(&path, |t, path| {
            let got = t.get(path).map_err(Error::store)?.ok_or_else(|| not_found(path))?;
            let mut e = decode(path, got.value())?;
            if e.kind != EntryKind::Dir {
                return Err(Error::new(ErrorKind::NotDir, libc::ENOTDIR, format!("{path:?} is not a directory")));
            }
            e.default = Some(req.inherit(&e.default.unwrap_or(LayoutRequest::ROOT_DEFAULT)));
            Ok(e)
        })
    }

    fn write_entry(&self, path: &str, make: impl FnOnce(&redb::Table<&'static str, &'static [u8]>, &str) -> Result<Entry>) -> Result<Entry> {
        let tx = self.db.begin_write().map_err(Error::store)?;
        let entry = {
            let mut t = tx.open_table(ENTRIES).map_err(Error::store)?;
            let entry = make(&t, path)?;
            t.insert(path, encode(&entry).as_slice()).map_err(Error::store)?;
            entry
        };
        tx.commit().map_err(Error::store)?;
        Ok(entry)
    }

    /// Remove file or empty directory `path`; the removed entry (the
    /// caller removes a file's objects).
    pub fn unlink(&self, path: &str) -> Result<Entry> {
        let path = normalize(path)?;
        if path.is_empty() {
            return Err(Error::invalid("the root cannot be removed"));
        }
        if !self.readdir(&path).map(|v| v.is_empty()).unwrap_or(true) {
            return Err(Error::new(ErrorKind::Exists, libc::ENOTEMPTY, format!("{path:?} is not empty")));
        }
        let tx = self.db.begin_write().map_err(Error::store)?;
        let removed = {
            let mut t = tx.open_table(ENTRIES).map_err(Error::store)?;
            let got = t.remove(path.as_str()).map_err(Error::store)?.ok_or_else(|| not_found(&path))?;
            decode(&path, got.value())?
        };
        tx.commit().map_err(Error::store)?;
        Ok(removed)
    }

    /// The entries of directory `path`, sorted by name (at most
    /// `META_DIR_ENTRIES_MAX`, or the lower bound set).
    pub fn readdir(&self, path: &str) -> Result<Vec<(String, Entry)>> {
        let path = normalize(path)?;
        let dir = self.lookup(&path)?;
        if dir.kind != EntryKind::Dir {
            return Err(Error::new(ErrorKind::NotDir, libc::ENOTDIR, format!("{path:?} is not a directory")));
        }
        let prefix = if path.is_empty() { String::new() } else { format!("{path}/") };
        let tx = self.db.begin_read().map_err(Error::store)?;
        let t = tx.open_table(ENTRIES).map_err(Error::store)?;
        let mut out = Vec::new();
        for item in t.range(prefix.as_str()..).map_err(Error::store)? {
            let (k, v) = item.map_err(Error::store)?;
            let Some(name) = k.value().strip_prefix(prefix.as_str()) else { break };
            if name.is_empty() || name.contains('/') {
                continue;
            }
            if out.len() == self.dir_entries_max {
                return Err(Error::new(ErrorKind::Limit, libc::EOVERFLOW, format!("{path:?} has more than {} entries (META_DIR_ENTRIES_MAX)", self.dir_entries_max)));
            }
            out.push((name.to_string(), decode(k.value(), v.value())?));
        }
        Ok(out)
    }
}
