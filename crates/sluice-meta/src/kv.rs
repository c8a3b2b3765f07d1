//! The store's two back ends behind one transaction interface: an
//! embedded `redb` database (one machine, the default) and an etcd
//! cluster (`etcd.rs`, replicated, several `sluice meta` may share it).
//! The namespace logic (`store.rs`) is written once against [`Tx`]: it
//! reads what it needs, then writes; the back end makes that atomic.
//!
//! Keys: entries by their normalised path (the root is `""`), and named
//! counters (`config`). A scan returns the entries whose path starts
//! with a prefix, in key order, with the transaction's own writes seen.

use redb::{Database, ReadableTable, TableDefinition};
use sluice_remote::{Error, ErrorKind, Result};

/// Path (no leading `/`; the root is `""`) → JSON-encoded entry.
pub(crate) const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("entries");
/// Named counters and settings.
pub(crate) const CONFIG: TableDefinition<&str, u64> = TableDefinition::new("config");

/// One transaction of the store: reads, then writes, applied atomically
/// when the closure that received it returns `Ok`.
pub(crate) trait Tx {
    fn get(&mut self, path: &str) -> Result<Option<Vec<u8>>>;
    /// Visit the entries whose path starts with `prefix`, in order, until
    /// `visit` says stop (`false`) or fails.
    fn scan(&mut self, prefix: &str, visit: &mut dyn FnMut(&str, &[u8]) -> Result<bool>) -> Result<()>;
    fn put(&mut self, path: &str, value: &[u8]) -> Result<()>;
    fn delete(&mut self, path: &str) -> Result<()>;
    fn config(&mut self, name: &str) -> Result<Option<u64>>;
    fn set_config(&mut self, name: &str, value: u64) -> Result<()>;
}

fn read_only() -> Error {
    Error::new(ErrorKind::Store, libc::EIO, "a change inside a read-only metadata transaction")
}

/// A redb write transaction's two tables.
pub(crate) struct RedbWrite<'a> {
    pub entries: redb::Table<'a, &'static str, &'static [u8]>,
    pub config: redb::Table<'a, &'static str, u64>,
}

/// Run `f` in one redb write transaction, committed when it returns `Ok`.
pub(crate) fn redb_write<T>(db: &Database, f: &mut dyn FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
    let tx = db.begin_write().map_err(Error::store)?;
    let out = {
        let mut w = RedbWrite { entries: tx.open_table(ENTRIES).map_err(Error::store)?, config: tx.open_table(CONFIG).map_err(Error::store)? };
        f(&mut w)?
    };
    tx.commit().map_err(Error::store)?;
    Ok(out)
}

/// Run `f` in one redb read transaction.
pub(crate) fn redb_read<T>(db: &Database, f: &mut dyn FnMut(&mut dyn Tx) -> Result<T>) -> Result<T> {
    let tx = db.begin_read().map_err(Error::store)?;
    let mut r = RedbRead { entries: tx.open_table(ENTRIES).map_err(Error::store)?, config: tx.open_table(CONFIG).ok() };
    f(&mut r)
}

fn scan_table(t: &impl ReadableTable<&'static str, &'static [u8]>, prefix: &str, visit: &mut dyn FnMut(&str, &[u8]) -> Result<bool>) -> Result<()> {
    for item in t.range(prefix..).map_err(Error::store)? {
        let (k, v) = item.map_err(Error::store)?;
        if !k.value().starts_with(prefix) || !visit(k.value(), v.value())? {
            break;
        }
    }
    Ok(())
}

impl Tx for RedbWrite<'_> {
    fn get(&mut self, path: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.entries.get(path).map_err(Error::store)?.map(|v| v.value().to_vec()))
    }
    fn scan(&mut self, prefix: &str, visit: &mut dyn FnMut(&str, &[u8]) -> Result<bool>) -> Result<()> {
        scan_table(&self.entries, prefix, visit)
    }
    fn put(&mut self, path: &str, value: &[u8]) -> Result<()> {
        self.entries.insert(path, value).map(drop).map_err(Error::store)
    }
    fn delete(&mut self, path: &str) -> Result<()> {
        self.entries.remove(path).map(drop).map_err(Error::store)
    }
    fn config(&mut self, name: &str) -> Result<Option<u64>> {
        Ok(self.config.get(name).map_err(Error::store)?.map(|v| v.value()))
    }
    fn set_config(&mut self, name: &str, value: u64) -> Result<()> {
        self.config.insert(name, value).map(drop).map_err(Error::store)
    }
}

struct RedbRead {
    entries: redb::ReadOnlyTable<&'static str, &'static [u8]>,
    config: Option<redb::ReadOnlyTable<&'static str, u64>>,
}

impl Tx for RedbRead {
    fn get(&mut self, path: &str) -> Result<Option<Vec<u8>>> {
        Ok(self.entries.get(path).map_err(Error::store)?.map(|v| v.value().to_vec()))
    }
    fn scan(&mut self, prefix: &str, visit: &mut dyn FnMut(&str, &[u8]) -> Result<bool>) -> Result<()> {
        scan_table(&self.entries, prefix, visit)
    }
    fn put(&mut self, _: &str, _: &[u8]) -> Result<()> {
        Err(read_only())
    }
    fn delete(&mut self, _: &str) -> Result<()> {
        Err(read_only())
    }
    fn config(&mut self, name: &str) -> Result<Option<u64>> {
        match &self.config {
            Some(t) => Ok(t.get(name).map_err(Error::store)?.map(|v| v.value())),
            None => Ok(None),
        }
    }
    fn set_config(&mut self, _: &str, _: u64) -> Result<()> {
        Err(read_only())
    }
}
