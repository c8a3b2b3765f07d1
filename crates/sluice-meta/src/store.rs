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
use sluice_stripe::{LayoutRequest, SERVERS_MAX};

use sluice_remote::{normalize, Entry, EntryKind, Error, ErrorKind, Result, META_PATH_BYTES_MAX};

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
/// Most entries one `rename` of a directory moves (the directory's whole
/// subtree, in one transaction); past it, an error and nothing moved.
pub const META_RENAME_ENTRIES_MAX: usize = 65_536;

/// The namespace and layouts of one cluster.
pub struct MetaStore {
    db: Database,
    servers: u32,
    dir_entries_max: usize,
    rename_entries_max: usize,
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

fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i64)
}

/// The keys under directory `path` start with this.
fn child_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}/")
    }
}

/// Whether directory `path` has any entry below it.
fn has_children(t: &impl ReadableTable<&'static str, &'static [u8]>, path: &str) -> Result<bool> {
    let prefix = child_prefix(path);
    for item in t.range(prefix.as_str()..).map_err(Error::store)? {
        let (k, _) = item.map_err(Error::store)?;
        let k = k.value();
        if k != path {
            return Ok(k.starts_with(prefix.as_str()));
        }
    }
    Ok(false)
}

fn get(t: &impl ReadableTable<&'static str, &'static [u8]>, path: &str) -> Result<Option<Entry>> {
    t.get(path).map_err(Error::store)?.map(|v| decode(path, v.value())).transpose()
}

/// Record a change in directory `dir`'s list of names.
fn touch(t: &mut redb::Table<&'static str, &'static [u8]>, dir: &str, now: i64) -> Result<()> {
    if let Some(mut e) = get(t, dir)? {
        e.mtime_ns = now;
        t.insert(dir, encode(&e).as_slice()).map_err(Error::store)?;
    }
    Ok(())
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
        // An empty file is not a new namespace: a copy that failed, or a
        // disk that filled, leaves one, and the data servers still hold
        // the old namespace's objects.
        if std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0) {
            return Err(Error::new(ErrorKind::Store, libc::EIO, format!("metadata database {}: the file is empty; remove it to start a new namespace", path.display())));
        }
        // redb asserts (panics) on some damage, a file cut short among
        // them: a clear error instead.
        let db = std::panic::catch_unwind(|| Database::create(path))
            .map_err(|_| Error::new(ErrorKind::Store, libc::EIO, format!("metadata database {}: damaged (cut short?); restore it from a copy", path.display())))?
            .map_err(Error::store)?;
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
                let root = Entry { kind: EntryKind::Dir, id: 0, layout: None, default: Some(LayoutRequest::ROOT_DEFAULT), mtime_ns: now_ns() };
                entries.insert("", encode(&root).as_slice()).map_err(Error::store)?;
            }
        }
        tx.commit().map_err(Error::store)?;
        Ok(MetaStore { db, servers, dir_entries_max: META_DIR_ENTRIES_MAX, rename_entries_max: META_RENAME_ENTRIES_MAX })
    }

    /// Lower the `readdir` bound (tests; a smaller reply frame).
    pub fn with_dir_entries_max(mut self, n: usize) -> MetaStore {
        self.dir_entries_max = n.min(META_DIR_ENTRIES_MAX);
        self
    }

    /// Lower the `rename` bound (tests).
    pub fn with_rename_entries_max(mut self, n: usize) -> MetaStore {
        self.rename_entries_max = n.min(META_RENAME_ENTRIES_MAX);
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
            let now = now_ns();
            let entry = Entry { kind: EntryKind::File, id, layout: Some(layout), default: None, mtime_ns: now };
            t.insert(path.as_str(), encode(&entry).as_slice()).map_err(Error::store)?;
            touch(&mut t, parent_of(&path), now)?;
            entry
        };
        tx.commit().map_err(Error::store)?;
        Ok(entry)
    }

    /// Create directory `path`, inheriting its parent's default layout.
    pub fn mkdir(&self, path: &str) -> Result<Entry> {
        let path = normalize(path)?;
        let tx = self.db.begin_write().map_err(Error::store)?;
        let entry = {
            let mut t = tx.open_table(ENTRIES).map_err(Error::store)?;
            let parent = Self::parent_dir(&t, &path)?;
            if t.get(path.as_str()).map_err(Error::store)?.is_some() {
                return Err(Error::new(ErrorKind::Exists, libc::EEXIST, format!("{path:?} exists")));
            }
            let entry = Entry { kind: EntryKind::Dir, id: 0, layout: None, default: parent.default, mtime_ns: now_ns() };
            t.insert(path.as_str(), encode(&entry).as_slice()).map_err(Error::store)?;
            touch(&mut t, parent_of(&path), entry.mtime_ns)?;
            entry
        };
        tx.commit().map_err(Error::store)?;
        Ok(entry)
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
        self.remove(path, None)
    }

    /// `unlink` that removes only an entry of kind `expect` when given:
    /// a directory is EISDIR for `unlink(2)`, a file ENOTDIR for `rmdir(2)`.
    pub fn remove(&self, path: &str, expect: Option<EntryKind>) -> Result<Entry> {
        let path = normalize(path)?;
        if path.is_empty() {
            return Err(Error::new(ErrorKind::Invalid, libc::EBUSY, "the root cannot be removed"));
        }
        let tx = self.db.begin_write().map_err(Error::store)?;
        let removed = {
            let mut t = tx.open_table(ENTRIES).map_err(Error::store)?;
            match (expect, get(&t, &path)?) {
                (_, None) => return Err(not_found(&path)),
                (Some(EntryKind::File), Some(e)) if e.kind == EntryKind::Dir => return Err(Error::new(ErrorKind::IsDir, libc::EISDIR, format!("{path:?} is a directory"))),
                (Some(EntryKind::Dir), Some(e)) if e.kind == EntryKind::File => return Err(Error::new(ErrorKind::NotDir, libc::ENOTDIR, format!("{path:?} is not a directory"))),
                _ => {}
            }
            if has_children(&t, &path)? {
                return Err(Error::new(ErrorKind::Exists, libc::ENOTEMPTY, format!("{path:?} is not empty")));
            }
            let got = t.remove(path.as_str()).map_err(Error::store)?.ok_or_else(|| not_found(&path))?;
            let removed = decode(&path, got.value())?;
            drop(got);
            touch(&mut t, parent_of(&path), now_ns())?;
            removed
        };
        tx.commit().map_err(Error::store)?;
        Ok(removed)
    }

    /// Move `from` to `to` in one transaction, with `rename(2)`'s rules: a
    /// file replaces a file, a directory replaces an empty directory, and
    /// a directory's whole subtree moves with it (at most
    /// `META_RENAME_ENTRIES_MAX` entries). Objects are named by file id,
    /// so no data moves. Returns the file `to` named before, whose objects
    /// the caller removes.
    pub fn rename(&self, from: &str, to: &str) -> Result<Option<Entry>> {
        let (from, to) = (normalize(from)?, normalize(to)?);
        if from.is_empty() || to.is_empty() {
            return Err(Error::new(ErrorKind::Invalid, libc::EBUSY, "the root cannot be renamed or replaced"));
        }
        if to.starts_with(&child_prefix(&from)) {
            return Err(Error::invalid(format!("cannot move {from:?} into itself ({to:?})")));
        }
        let tx = self.db.begin_write().map_err(Error::store)?;
        let replaced = {
            let mut t = tx.open_table(ENTRIES).map_err(Error::store)?;
            let src = get(&t, &from)?.ok_or_else(|| not_found(&from))?;
            Self::parent_dir(&t, &to)?;
            if from == to {
                return Ok(None);
            }
            let replaced = match (src.kind, get(&t, &to)?) {
                (_, None) => None,
                (EntryKind::File, Some(e)) if e.kind == EntryKind::File => Some(e),
                (EntryKind::Dir, Some(e)) if e.kind == EntryKind::Dir => {
                    if has_children(&t, &to)? {
                        return Err(Error::new(ErrorKind::Exists, libc::ENOTEMPTY, format!("{to:?} is not empty")));
                    }
                    None
                }
                (EntryKind::File, Some(_)) => return Err(Error::new(ErrorKind::IsDir, libc::EISDIR, format!("{to:?} is a directory"))),
                (EntryKind::Dir, Some(_)) => return Err(Error::new(ErrorKind::NotDir, libc::ENOTDIR, format!("{to:?} is not a directory"))),
            };
            let mut moves = vec![(from.clone(), to.clone())];
            if src.kind == EntryKind::Dir {
                let prefix = child_prefix(&from);
                for item in t.range(prefix.as_str()..).map_err(Error::store)? {
                    let (k, _) = item.map_err(Error::store)?;
                    let Some(rest) = k.value().strip_prefix(prefix.as_str()) else {
                        break;
                    };
                    if moves.len() == self.rename_entries_max {
                        return Err(Error::new(
                            ErrorKind::Limit,
                            libc::EOVERFLOW,
                            format!("{from:?} holds more than {} entries (META_RENAME_ENTRIES_MAX)", self.rename_entries_max),
                        ));
                    }
                    let new = format!("{to}/{rest}");
                    // A longer name for the directory lengthens every path
                    // under it: none may pass the bound input paths have.
                    if new.len() > META_PATH_BYTES_MAX {
                        let why = format!("{:?} would be {} bytes, past {META_PATH_BYTES_MAX} (META_PATH_BYTES_MAX)", k.value(), new.len());
                        return Err(Error::new(ErrorKind::Limit, libc::ENAMETOOLONG, why));
                    }
                    moves.push((k.value().to_string(), new));
                }
            }
            for (old, new) in &moves {
                let e = t.remove(old.as_str()).map_err(Error::store)?.map(|v| v.value().to_vec()).ok_or_else(|| not_found(old))?;
                t.insert(new.as_str(), e.as_slice()).map_err(Error::store)?;
            }
            let now = now_ns();
            touch(&mut t, parent_of(&from), now)?;
            touch(&mut t, parent_of(&to), now)?;
            replaced
        };
        tx.commit().map_err(Error::store)?;
        Ok(replaced)
    }

    /// The entries of directory `path`, sorted by name (at most
    /// `META_DIR_ENTRIES_MAX`, or the lower bound set).
    pub fn readdir(&self, path: &str) -> Result<Vec<(String, Entry)>> {
        let path = normalize(path)?;
        let dir = self.lookup(&path)?;
        if dir.kind != EntryKind::Dir {
            return Err(Error::new(ErrorKind::NotDir, libc::ENOTDIR, format!("{path:?} is not a directory")));
        }
        let prefix = child_prefix(&path);
        let tx = self.db.begin_read().map_err(Error::store)?;
        let t = tx.open_table(ENTRIES).map_err(Error::store)?;
        let mut out = Vec::new();
        for item in t.range(prefix.as_str()..).map_err(Error::store)? {
            let (k, v) = item.map_err(Error::store)?;
            let Some(name) = k.value().strip_prefix(prefix.as_str()) else {
                break;
            };
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
