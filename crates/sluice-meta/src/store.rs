//! The metadata store: the namespace (directories and files, keyed by
//! their full path) and each file's layout, in an embedded `redb`
//! database (`MetaStore::open`) or an etcd cluster
//! (`MetaStore::open_etcd`). Every change is one transaction (`kv.rs`),
//! so it survives a crash and, on etcd, any `sluice meta` sharing the
//! store sees it whole.
//!
//! Directories carry a default `LayoutRequest`; `mkdir` copies the
//! parent's, and a new file fills its unset layout fields from its parent's
//! default (Lustre's inheritance). The root's default is
//! `LayoutRequest::ROOT_DEFAULT` until `setstripe` changes it. Every
//! change of a directory's names also changes the directory's entry (its
//! time), which is what makes two etcd transactions on one directory
//! conflict.

use std::path::Path;

use redb::Database;
use sluice_stripe::{LayoutRequest, SERVERS_MAX};

use sluice_remote::{normalize, Entry, EntryKind, Error, ErrorKind, Result, META_PATH_BYTES_MAX};

use crate::etcd::Etcd;
use crate::kv::{redb_read, redb_write, Tx, CONFIG, ENTRIES};

/// The last file id handed out.
const NEXT_ID_KEY: &str = "last_file_id";
/// Data servers the cluster had when the store was last opened.
const SERVERS_KEY: &str = "servers";

/// Most entries one directory holds: a create, mkdir or rename that would
/// put one more there is refused (ENOSPC), so `readdir` lists every
/// directory whole and its reply frame stays bounded. (A directory of a
/// store written before entries were counted may hold more: its `readdir`
/// fails with EOVERFLOW, and it takes no new entry.)
pub const META_DIR_ENTRIES_MAX: usize = 4096;
/// Most entries one `rename` of a directory moves (the directory's whole
/// subtree, in one transaction); past it, an error and nothing moved.
pub const META_RENAME_ENTRIES_MAX: usize = 65_536;

/// File ids a store on etcd takes from the shared counter at once: one
/// transaction per this many creates touches the counter, so the roles
/// sharing a store do not all conflict on it. Ids stay unique, not dense.
pub const META_ID_BLOCK: u64 = 256;

/// The namespace and layouts of one cluster.
pub struct MetaStore {
    backend: Backend,
    /// On etcd: the ids taken and not yet handed out, `[next, end)`.
    ids: std::sync::Mutex<(u64, u64)>,
    servers: u32,
    dir_entries_max: usize,
    rename_entries_max: usize,
}

enum Backend {
    Redb(Database),
    Etcd(Etcd),
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
fn has_children(t: &mut dyn Tx, path: &str) -> Result<bool> {
    let mut found = false;
    t.scan(&child_prefix(path), &mut |k, _| {
        found = k != path;
        Ok(!found)
    })?;
    Ok(found)
}

fn get(t: &mut dyn Tx, path: &str) -> Result<Option<Entry>> {
    t.get(path)?.map(|v| decode(path, &v)).transpose()
}

/// Entries directly in directory `path` (a scan of its whole subtree:
/// only for a directory whose count was never kept).
fn count_children(t: &mut dyn Tx, path: &str) -> Result<u64> {
    let prefix = child_prefix(path);
    let mut n = 0;
    t.scan(&prefix, &mut |k, _| {
        let name = &k[prefix.len()..];
        n += u64::from(!name.is_empty() && !name.contains('/'));
        Ok(true)
    })?;
    Ok(n)
}

/// Record a change in directory `dir`'s list of names: `added` entries
/// more (or fewer), already put or deleted in `t`. Past `max` entries the
/// change is refused (the caller's transaction is then not committed).
fn touch(t: &mut dyn Tx, dir: &str, now: i64, added: i64, max: usize) -> Result<()> {
    let Some(mut e) = get(t, dir)? else { return Ok(()) };
    let children = match e.children {
        Some(n) => n.saturating_add_signed(added),
        // Not kept yet: the subtree as `t` has it, the change included.
        None => count_children(t, dir)?,
    };
    if added > 0 && children > max as u64 {
        return Err(Error::new(ErrorKind::Limit, libc::ENOSPC, format!("{dir:?} holds {max} entries already (META_DIR_ENTRIES_MAX)")));
    }
    (e.mtime_ns, e.children) = (now, Some(children));
    t.put(dir, &encode(&e))?;
    Ok(())
}

fn not_found(path: &str) -> Error {
    Error::new(ErrorKind::NotFound, libc::ENOENT, format!("{path:?}: no such file or directory"))
}

fn parent_dir(t: &mut dyn Tx, path: &str) -> Result<Entry> {
    if path.is_empty() {
        return Err(Error::new(ErrorKind::Exists, libc::EEXIST, "the root always exists"));
    }
    let parent = parent_of(path);
    let e = get(t, parent)?.ok_or_else(|| not_found(parent))?;
    if e.kind != EntryKind::Dir {
        return Err(Error::new(ErrorKind::NotDir, libc::ENOTDIR, format!("{parent:?} is not a directory")));
    }
    Ok(e)
}

/// Record the server count (refusing fewer than the store was made for)
/// and make the root: the first transaction of every opening.
fn init(t: &mut dyn Tx, servers: u32) -> Result<()> {
    if let Some(b) = t.config(SERVERS_KEY)?.filter(|&b| b > u64::from(servers)) {
        return Err(Error::invalid(format!("the metadata store was made for {b} data servers; {servers} given")));
    }
    t.set_config(SERVERS_KEY, u64::from(servers))?;
    if t.get("")?.is_none() {
        let root = Entry { kind: EntryKind::Dir, id: 0, layout: None, default: Some(LayoutRequest::ROOT_DEFAULT), mtime_ns: now_ns(), children: Some(0) };
        t.put("", &encode(&root))?;
    }
    Ok(())
}

impl MetaStore {
    /// Open (or create) the database at `path` for a cluster of `servers`
    /// data servers; refuses fewer servers than the store was made with
    /// (existing layouts name them).
    pub fn open(path: &Path, servers: u32) -> Result<MetaStore> {
        check_servers(servers)?;
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
        // Both tables exist from the first opening on, so a read finds them.
        let tx = db.begin_write().map_err(Error::store)?;
        tx.open_table(ENTRIES).map_err(Error::store)?;
        tx.open_table(CONFIG).map_err(Error::store)?;
        tx.commit().map_err(Error::store)?;
        MetaStore::over(Backend::Redb(db), servers)
    }

    /// Open (or create) the namespace kept in the etcd cluster at
    /// `endpoints` (`etcd://h1:2379,h2:2379` or `h1:2379,...`), under key
    /// prefix `prefix` (one cluster's namespace per prefix).
    pub fn open_etcd(endpoints: &str, prefix: &str, servers: u32) -> Result<MetaStore> {
        check_servers(servers)?;
        let etcd = Etcd::new(endpoints, prefix)?;
        // etcd applies at most `Etcd::TXN_OPS_MAX` operations in one
        // transaction: a rename moves each entry with two.
        let rename_max = (Etcd::TXN_OPS_MAX - 4) / 2;
        let store = MetaStore::over(Backend::Etcd(etcd), servers)?;
        Ok(store.with_rename_entries_max(rename_max))
    }

    fn over(backend: Backend, servers: u32) -> Result<MetaStore> {
        let store = MetaStore { backend, ids: std::sync::Mutex::new((0, 0)), servers, dir_entries_max: META_DIR_ENTRIES_MAX, rename_entries_max: META_RENAME_ENTRIES_MAX };
        store.write(&mut |t| init(t, servers))?;
        Ok(store)
    }

    /// Which back end: `redb` or `etcd`.
    pub fn backend(&self) -> &'static str {
        match self.backend {
            Backend::Redb(_) => "redb",
            Backend::Etcd(_) => "etcd",
        }
    }

    fn write<T>(&self, f: &mut dyn FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        match &self.backend {
            Backend::Redb(db) => redb_write(db, f),
            Backend::Etcd(e) => e.transact(f),
        }
    }

    fn read<T>(&self, f: &mut dyn FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
        match &self.backend {
            Backend::Redb(db) => redb_read(db, f),
            Backend::Etcd(e) => e.transact(f),
        }
    }

    /// A new file id: the next of the counter, in `t` (redb); on etcd the
    /// next of this store's block, a new block taken in a transaction of
    /// its own when it ran out.
    fn next_id(&self, t: &mut dyn Tx) -> Result<u64> {
        if let Backend::Redb(_) = self.backend {
            let id = t.config(NEXT_ID_KEY)?.unwrap_or(0) + 1;
            t.set_config(NEXT_ID_KEY, id)?;
            return Ok(id);
        }
        let mut ids = self.ids.lock().unwrap_or_else(|p| p.into_inner());
        if ids.0 == ids.1 {
            let last = self.write(&mut |t| {
                let last = t.config(NEXT_ID_KEY)?.unwrap_or(0);
                t.set_config(NEXT_ID_KEY, last + META_ID_BLOCK)?;
                Ok(last)
            })?;
            *ids = (last + 1, last + 1 + META_ID_BLOCK);
        }
        ids.0 += 1;
        Ok(ids.0 - 1)
    }

    /// Lower the bound on a directory's entries (tests).
    pub fn with_dir_entries_max(mut self, n: usize) -> MetaStore {
        self.dir_entries_max = n.min(META_DIR_ENTRIES_MAX);
        self
    }

    /// Lower the `rename` bound (tests).
    pub fn with_rename_entries_max(mut self, n: usize) -> MetaStore {
        self.rename_entries_max = n.min(self.rename_entries_max);
        self
    }

    /// Data servers of the cluster.
    pub fn servers(&self) -> u32 {
        self.servers
    }

    /// The entry at `path`.
    pub fn lookup(&self, path: &str) -> Result<Entry> {
        let path = normalize(path)?;
        self.read(&mut |t| get(t, &path)?.ok_or_else(|| not_found(&path)))
    }

    /// Create file `path` with `req` (unset fields from the parent's
    /// default). An existing file is returned as it is unless `exclusive`.
    pub fn create(&self, path: &str, req: LayoutRequest, exclusive: bool) -> Result<Entry> {
        req.check()?;
        let path = normalize(path)?;
        self.write(&mut |t| {
            let parent = parent_dir(t, &path)?;
            if let Some(e) = get(t, &path)? {
                return match (e.kind, exclusive) {
                    (EntryKind::File, false) => Ok(e),
                    (EntryKind::Dir, _) => Err(Error::new(ErrorKind::IsDir, libc::EISDIR, format!("{path:?} is a directory"))),
                    _ => Err(Error::new(ErrorKind::Exists, libc::EEXIST, format!("{path:?} exists"))),
                };
            }
            let id = self.next_id(t)?;
            let inherited = req.inherit(&parent.default.unwrap_or(LayoutRequest::ROOT_DEFAULT));
            let layout = inherited.resolve(self.servers, id)?;
            let now = now_ns();
            let entry = Entry { kind: EntryKind::File, id, layout: Some(layout), default: None, mtime_ns: now, children: None };
            t.put(&path, &encode(&entry))?;
            touch(t, parent_of(&path), now, 1, self.dir_entries_max)?;
            Ok(entry)
        })
    }

    /// Create directory `path`, inheriting its parent's default layout.
    pub fn mkdir(&self, path: &str) -> Result<Entry> {
        let path = normalize(path)?;
        self.write(&mut |t| {
            let parent = parent_dir(t, &path)?;
            if t.get(&path)?.is_some() {
                return Err(Error::new(ErrorKind::Exists, libc::EEXIST, format!("{path:?} exists")));
            }
            let entry = Entry { kind: EntryKind::Dir, id: 0, layout: None, default: parent.default, mtime_ns: now_ns(), children: Some(0) };
            t.put(&path, &encode(&entry))?;
            touch(t, parent_of(&path), entry.mtime_ns, 1, self.dir_entries_max)?;
            Ok(entry)
        })
    }

    /// Set directory `path`'s default layout for new entries (unset fields
    /// keep the current default's).
    pub fn set_dir_default(&self, path: &str, req: LayoutRequest) -> Result<Entry> {
        req.check()?;
        let path = normalize(path)?;
        self.write(&mut |t| {
            let mut e = get(t, &path)?.ok_or_else(|| not_found(&path))?;
            if e.kind != EntryKind::Dir {
                return Err(Error::new(ErrorKind::NotDir, libc::ENOTDIR, format!("{path:?} is not a directory")));
            }
            e.default = Some(req.inherit(&e.default.unwrap_or(LayoutRequest::ROOT_DEFAULT)));
            t.put(&path, &encode(&e))?;
            Ok(e)
        })
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
        self.write(&mut |t| {
            let removed = match (expect, get(t, &path)?) {
                (_, None) => return Err(not_found(&path)),
                (Some(EntryKind::File), Some(e)) if e.kind == EntryKind::Dir => return Err(Error::new(ErrorKind::IsDir, libc::EISDIR, format!("{path:?} is a directory"))),
                (Some(EntryKind::Dir), Some(e)) if e.kind == EntryKind::File => return Err(Error::new(ErrorKind::NotDir, libc::ENOTDIR, format!("{path:?} is not a directory"))),
                (_, Some(e)) => e,
            };
            if removed.kind == EntryKind::Dir && has_children(t, &path)? {
                return Err(Error::new(ErrorKind::Exists, libc::ENOTEMPTY, format!("{path:?} is not empty")));
            }
            t.delete(&path)?;
            touch(t, parent_of(&path), now_ns(), -1, self.dir_entries_max)?;
            Ok(removed)
        })
    }

    /// Move `from` to `to` in one transaction, with `rename(2)`'s rules: a
    /// file replaces a file, a directory replaces an empty directory, and
    /// a directory's whole subtree moves with it (at most
    /// `META_RENAME_ENTRIES_MAX` entries; fewer on etcd). Objects are
    /// named by file id, so no data moves. Returns the file `to` named
    /// before, whose objects the caller removes.
    pub fn rename(&self, from: &str, to: &str) -> Result<Option<Entry>> {
        let (from, to) = (normalize(from)?, normalize(to)?);
        if from.is_empty() || to.is_empty() {
            return Err(Error::new(ErrorKind::Invalid, libc::EBUSY, "the root cannot be renamed or replaced"));
        }
        if to.starts_with(&child_prefix(&from)) {
            return Err(Error::invalid(format!("cannot move {from:?} into itself ({to:?})")));
        }
        self.write(&mut |t| {
            let src = get(t, &from)?.ok_or_else(|| not_found(&from))?;
            parent_dir(t, &to)?;
            if from == to {
                return Ok(None);
            }
            let existing = get(t, &to)?;
            let to_existed = existing.is_some();
            let replaced = match (src.kind, existing) {
                (_, None) => None,
                (EntryKind::File, Some(e)) if e.kind == EntryKind::File => Some(e),
                (EntryKind::Dir, Some(e)) if e.kind == EntryKind::Dir => {
                    if has_children(t, &to)? {
                        return Err(Error::new(ErrorKind::Exists, libc::ENOTEMPTY, format!("{to:?} is not empty")));
                    }
                    None
                }
                (EntryKind::File, Some(_)) => return Err(Error::new(ErrorKind::IsDir, libc::EISDIR, format!("{to:?} is a directory"))),
                (EntryKind::Dir, Some(_)) => return Err(Error::new(ErrorKind::NotDir, libc::ENOTDIR, format!("{to:?} is not a directory"))),
            };
            let mut moves = vec![(from.clone(), to.clone(), encode(&src))];
            if src.kind == EntryKind::Dir {
                self.subtree_moves(t, &from, &to, &mut moves)?;
            }
            for (old, _, _) in &moves {
                t.delete(old)?;
            }
            for (_, new, value) in &moves {
                t.put(new, value)?;
            }
            // `to` was there already (a file replaced, an empty directory
            // taken over): its directory keeps its count.
            let took_a_name = i64::from(!to_existed);
            let now = now_ns();
            if parent_of(&from) == parent_of(&to) {
                // One change of one directory (counted once if never kept).
                touch(t, parent_of(&to), now, took_a_name - 1, self.dir_entries_max)?;
            } else {
                touch(t, parent_of(&from), now, -1, self.dir_entries_max)?;
                touch(t, parent_of(&to), now, took_a_name, self.dir_entries_max)?;
            }
            Ok(replaced)
        })
    }

    /// Every entry under directory `from` and its new path under `to`,
    /// within the rename bound and the path bound.
    fn subtree_moves(&self, t: &mut dyn Tx, from: &str, to: &str, moves: &mut Vec<(String, String, Vec<u8>)>) -> Result<()> {
        let prefix = child_prefix(from);
        let mut failed = None;
        t.scan(&prefix, &mut |k, v| {
            let rest = &k[prefix.len()..];
            if moves.len() == self.rename_entries_max {
                failed = Some(Error::new(ErrorKind::Limit, libc::EOVERFLOW, format!("{from:?} holds more than {} entries (META_RENAME_ENTRIES_MAX)", self.rename_entries_max)));
                return Ok(false);
            }
            let new = format!("{to}/{rest}");
            // A longer name for the directory lengthens every path
            // under it: none may pass the bound input paths have.
            if new.len() > META_PATH_BYTES_MAX {
                failed = Some(Error::new(ErrorKind::Limit, libc::ENAMETOOLONG, format!("{k:?} would be {} bytes, past {META_PATH_BYTES_MAX} (META_PATH_BYTES_MAX)", new.len())));
                return Ok(false);
            }
            moves.push((k.to_string(), new, v.to_vec()));
            Ok(true)
        })?;
        failed.map_or(Ok(()), Err)
    }

    /// The entries of directory `path`, sorted by name (at most
    /// `META_DIR_ENTRIES_MAX`, or the lower bound set).
    pub fn readdir(&self, path: &str) -> Result<Vec<(String, Entry)>> {
        let path = normalize(path)?;
        let prefix = child_prefix(&path);
        self.read(&mut |t| {
            let dir = get(t, &path)?.ok_or_else(|| not_found(&path))?;
            if dir.kind != EntryKind::Dir {
                return Err(Error::new(ErrorKind::NotDir, libc::ENOTDIR, format!("{path:?} is not a directory")));
            }
            let mut out = Vec::new();
            let mut failed = None;
            t.scan(&prefix, &mut |k, v| {
                let name = &k[prefix.len()..];
                if name.is_empty() || name.contains('/') {
                    return Ok(true);
                }
                if out.len() == self.dir_entries_max {
                    failed = Some(Error::new(ErrorKind::Limit, libc::EOVERFLOW, format!("{path:?} has more than {} entries (META_DIR_ENTRIES_MAX)", self.dir_entries_max)));
                    return Ok(false);
                }
                out.push((name.to_string(), decode(k, v)?));
                Ok(true)
            })?;
            failed.map_or(Ok(out), Err)
        })
    }
}

fn check_servers(servers: u32) -> Result<()> {
    if servers == 0 || servers > SERVERS_MAX {
        return Err(Error::invalid(format!("{servers} data servers: expected 1..={SERVERS_MAX}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of a store written before its entries were counted
    /// (`children` absent) is counted at its next change, that change
    /// included, and bounded from then on.
    #[test]
    fn a_directory_never_counted_is_counted_at_its_next_change() {
        let dir = tempfile::tempdir().unwrap();
        let store = MetaStore::open(&dir.path().join("m.redb"), 1).unwrap().with_dir_entries_max(3);
        store.mkdir("d").unwrap();
        for name in ["d/a", "d/b"] {
            store.create(name, LayoutRequest::default(), true).unwrap();
        }
        store.mkdir("d/sub").unwrap();
        store.create("d/sub/x", LayoutRequest::default(), true).unwrap();
        // Forget the count, as an older store never wrote it.
        store
            .write(&mut |t| {
                let mut e = get(t, "d")?.expect("d exists");
                e.children = None;
                t.put("d", &encode(&e))
            })
            .unwrap();
        assert_eq!(store.lookup("d").unwrap().children, None);
        // a, b, sub and the new one: over the bound, refused, still not
        // counted.
        assert_eq!(store.create("d/c", LayoutRequest::default(), true).unwrap_err().errno, libc::ENOSPC);
        assert_eq!(store.lookup("d").unwrap().children, None);
        // A change that goes through counts it (b and sub; not sub/x).
        store.unlink("d/a").unwrap();
        assert_eq!(store.lookup("d").unwrap().children, Some(2));
        store.create("d/c", LayoutRequest::default(), true).unwrap();
        assert_eq!(store.create("d/e", LayoutRequest::default(), true).unwrap_err().errno, libc::ENOSPC);
        assert_eq!(store.lookup("d").unwrap().children, Some(3));
    }
}
