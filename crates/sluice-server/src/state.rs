//! State shared by every thread of the server: the clock, the table of
//! open backing files (one `FileId` per inode, whoever opened it), and the
//! table of applications with their counters.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use sluice_core::{AppId, FileId};
use sluice_proto::{AppStats, LATENCY_BUCKETS};

use crate::error::{Error, Result};

/// The monotonic clock the scheduler is driven by: nanoseconds since the
/// server started. Only drivers read it; the core gets `now` passed in.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock { start: Instant::now() }
    }

    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
}

/// Lock a mutex, recovering the data if a panicking thread poisoned it: the
/// tables stay consistent because every update is a single insert/remove.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Backing files open on behalf of clients, keyed by `(device, inode)` so
/// that two clients opening one file share a `FileId` and their requests
/// can be aggregated.
pub struct FileTable {
    map: HashMap<(u64, u64), (FileId, u32)>,
    id_next: u64,
    files_open_max: u32,
}

impl FileTable {
    pub fn new(files_open_max: u32) -> FileTable {
        FileTable { map: HashMap::new(), id_next: 1, files_open_max }
    }

    fn acquire(&mut self, key: (u64, u64)) -> Result<FileId> {
        if let Some((id, refs)) = self.map.get_mut(&key) {
            *refs += 1;
            return Ok(*id);
        }
        if self.map.len() >= self.files_open_max as usize {
            return Err(Error::limit(libc::ENFILE, format!("too many open files on the server (files_open_max = {})", self.files_open_max)));
        }
        let id = FileId(self.id_next);
        self.id_next += 1;
        self.map.insert(key, (id, 1));
        Ok(id)
    }

    fn release(&mut self, key: (u64, u64)) {
        if let Some((_, refs)) = self.map.get_mut(&key) {
            *refs -= 1;
            if *refs == 0 {
                self.map.remove(&key);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }
}

/// One backing file opened by one client `open`. Requests in flight hold
/// an `Arc` to it, so a `close` never pulls the descriptor from under a
/// dispatch.
pub struct OpenFile {
    pub fd: OwnedFd,
    pub id: FileId,
    /// `O_RDONLY`, `O_WRONLY` or `O_RDWR`: what the client may do with it.
    pub access: i32,
    key: (u64, u64),
    table: Arc<Mutex<FileTable>>,
}

impl OpenFile {
    /// Register `fd` in `table`.
    pub fn register(fd: OwnedFd, access: i32, table: &Arc<Mutex<FileTable>>) -> Result<OpenFile> {
        // SAFETY: an all-zero stat is valid, and fstat fills it.
        let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
        // SAFETY: st is a valid out-pointer and fd is open.
        if unsafe { libc::fstat64(fd.as_raw_fd(), &mut st) } < 0 {
            return Err(Error::io("fstat", &std::io::Error::last_os_error()));
        }
        let key = (st.st_dev, st.st_ino);
        let id = lock(table).acquire(key)?;
        Ok(OpenFile { fd, id, access, key, table: Arc::clone(table) })
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        lock(&self.table).release(self.key);
    }
}

struct App {
    stats: AppStats,
    connections: u32,
}

/// Applications by name, with their counters. Entries are kept after the
/// last connection closes so the shutdown summary covers everyone; the
/// table is bounded by `apps_max` and refuses new names past it.
pub struct AppTable {
    by_name: HashMap<String, AppId>,
    apps: Vec<App>,
    apps_max: u32,
}

impl AppTable {
    pub fn new(apps_max: u32) -> AppTable {
        AppTable { by_name: HashMap::new(), apps: Vec::new(), apps_max }
    }

    /// A connection of application `name` arrived.
    pub fn connect(&mut self, name: &str, weight: u32) -> Result<AppId> {
        let id = match self.by_name.get(name) {
            Some(&id) => id,
            None => {
                if self.apps.len() >= self.apps_max as usize {
                    return Err(Error::limit(libc::EUSERS, format!("too many applications (apps_max = {})", self.apps_max)));
                }
                let id = AppId(self.apps.len() as u32);
                let stats =
                    AppStats { name: name.to_string(), weight, requests: 0, dispatches: 0, bytes_read: 0, bytes_written: 0, errors: 0, latency_us_log2: [0; LATENCY_BUCKETS] };
                self.apps.push(App { stats, connections: 0 });
                self.by_name.insert(name.to_string(), id);
                id
            }
        };
        let app = &mut self.apps[id.0 as usize];
        app.connections += 1;
        app.stats.weight = weight;
        Ok(id)
    }

    /// A connection of `app` closed; true when it was the last one.
    pub fn disconnect(&mut self, app: AppId) -> bool {
        let a = &mut self.apps[app.0 as usize];
        a.connections -= 1;
        a.connections == 0
    }

    /// Count one completed request of `app`.
    pub fn record(&mut self, app: AppId, write: bool, bytes: Option<u64>, latency_ns: u64) {
        let Some(a) = self.apps.get_mut(app.0 as usize) else { return };
        let s = &mut a.stats;
        s.requests += 1;
        match bytes {
            Some(b) if write => s.bytes_written += b,
            Some(b) => s.bytes_read += b,
            None => s.errors += 1,
        }
        let us = latency_ns / 1_000;
        let bucket = (64 - us.max(1).leading_zeros() as usize - 1).min(LATENCY_BUCKETS - 1);
        s.latency_us_log2[bucket] += 1;
    }

    /// Count one dispatch that carried requests of `app`.
    pub fn record_dispatch(&mut self, app: AppId) {
        if let Some(a) = self.apps.get_mut(app.0 as usize) {
            a.stats.dispatches += 1;
        }
    }

    pub fn snapshot(&self) -> Vec<AppStats> {
        self.apps.iter().map(|a| a.stats.clone()).collect()
    }
}
