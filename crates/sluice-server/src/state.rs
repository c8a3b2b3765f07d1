//! State shared by every thread of the server: the table of open
//! backing files (one `FileId` per inode, whoever opened it), and the
//! table of applications with their counters.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sluice_core::{AppId, FileId};
use sluice_proto::{AppStats, LATENCY_BUCKETS};

use crate::error::{Error, ErrorKind, Result};
use crate::sync::lock;
use crate::view::{AppRow, Detail, OTHER_APPS};

/// Ranges reserved at a file's end and not yet written, kept per file
/// (`OpenFile::reserve`); past it the oldest is forgotten (its writer may
/// then overlap an append made after a truncate).
pub const RESERVATIONS_MAX: usize = 1024;
/// The longest `Reserve`: Linux's largest single write (`MAX_RW_COUNT`).
pub const RESERVE_BYTES_MAX: u64 = 0x7fff_f000;

/// A file open on behalf of clients: its id, the handles open on it, and
/// its appends (`OpenFile::reserve`).
struct Entry {
    id: FileId,
    refs: u32,
    /// The end of the last range reserved at the end (0: none since the
    /// file was opened or its size set).
    append_end: u64,
    /// Ranges reserved and not yet written, oldest first (at most
    /// `RESERVATIONS_MAX`), and their number, which every handle of the
    /// file reads without the lock (`OpenFile::written`).
    unwritten: VecDeque<(u64, u64)>,
    pending: Arc<AtomicUsize>,
}

/// Backing files open on behalf of clients, keyed by `(device, inode)` so
/// that two clients opening one file share a `FileId` and their requests
/// can be aggregated.
pub struct FileTable {
    map: HashMap<(u64, u64), Entry>,
    id_next: u64,
    files_open_max: u32,
}

impl FileTable {
    pub fn new(files_open_max: u32) -> FileTable {
        FileTable { map: HashMap::new(), id_next: 1, files_open_max }
    }

    fn acquire(&mut self, key: (u64, u64)) -> Result<(FileId, Arc<AtomicUsize>)> {
        if let Some(e) = self.map.get_mut(&key) {
            e.refs += 1;
            return Ok((e.id, Arc::clone(&e.pending)));
        }
        if self.map.len() >= self.files_open_max as usize {
            return Err(Error::limit(libc::ENFILE, format!("too many open files on the server (files_open_max = {})", self.files_open_max)));
        }
        let id = FileId(self.id_next);
        self.id_next += 1;
        let pending = Arc::new(AtomicUsize::new(0));
        self.map.insert(key, Entry { id, refs: 1, append_end: 0, unwritten: VecDeque::new(), pending: Arc::clone(&pending) });
        Ok((id, pending))
    }

    fn release(&mut self, key: (u64, u64)) {
        if let Some(e) = self.map.get_mut(&key) {
            e.refs -= 1;
            if e.refs == 0 {
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
    /// A regular file (only those are ever lent, `lease.rs`).
    pub regular: bool,
    key: (u64, u64),
    table: Arc<Mutex<FileTable>>,
    /// Reservations of the file not yet written (`Entry::pending`).
    reserved: Arc<AtomicUsize>,
}

/// `fstat` of `fd`.
pub fn stat_of(fd: &OwnedFd) -> Result<libc::stat64> {
    // SAFETY: an all-zero stat is valid, and fstat fills it.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer and fd is open.
    if unsafe { libc::fstat64(fd.as_raw_fd(), &mut st) } < 0 {
        return Err(Error::io("fstat", &std::io::Error::last_os_error()));
    }
    Ok(st)
}

impl OpenFile {
    /// Register `fd`, whose `fstat` is `st` (`stat_of`), in `table`.
    pub fn register(fd: OwnedFd, st: &libc::stat64, access: i32, table: &Arc<Mutex<FileTable>>) -> Result<OpenFile> {
        let key = (st.st_dev, st.st_ino);
        let (id, reserved) = lock(table).acquire(key)?;
        let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
        Ok(OpenFile { fd, id, access, regular, key, table: Arc::clone(table), reserved })
    }
}

impl OpenFile {
    /// Reserve `len` bytes at the file's end for an `O_APPEND` write: the
    /// range starts at the file's size, or at the end of the last range
    /// reserved on it if that is further (its writer may not have written
    /// yet). Reservations are made under the file table's lock, so two
    /// never overlap, whichever clients ask; writes that do not go
    /// through the server are not ordered with them. The size is read
    /// before the lock: a file system that hangs holds this caller only,
    /// not every open and close behind the lock.
    pub fn reserve(&self, len: u64) -> Result<u64> {
        if len > RESERVE_BYTES_MAX {
            return Err(Error::invalid(format!("a reservation of {len} bytes: at most {RESERVE_BYTES_MAX}, the largest write")));
        }
        let size = u64::try_from(stat_of(&self.fd)?.st_size).unwrap_or(0);
        let mut t = lock(&self.table);
        let Some(e) = t.map.get_mut(&self.key) else { return Err(Error::invalid("the file left the table")) };
        let at = size.max(e.append_end);
        let end = at
            .checked_add(len)
            .filter(|&e| i64::try_from(e).is_ok())
            .ok_or_else(|| Error::new(ErrorKind::Invalid, libc::EFBIG, format!("appending {len} bytes at {at} passes the largest file size")))?;
        e.append_end = end;
        if e.unwritten.len() >= RESERVATIONS_MAX {
            e.unwritten.pop_front();
        }
        e.unwritten.push_back((at, end));
        e.pending.store(e.unwritten.len(), Ordering::Release);
        Ok(at)
    }

    /// The file's size was set (`ftruncate`, an open with `O_TRUNC`):
    /// the next reservation starts at the new size, or past the ranges
    /// reserved and not yet written (their writers will still write
    /// there: an append made now must not land on them).
    pub fn resized(&self) {
        if let Some(e) = lock(&self.table).map.get_mut(&self.key) {
            e.append_end = e.unwritten.iter().map(|&(_, end)| end).max().unwrap_or(0);
        }
    }

    /// The server wrote `[offset, offset + len)` of the file: reservations
    /// it touches are written. One atomic load when there are none.
    pub fn written(&self, offset: u64, len: u64) {
        if self.reserved.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(e) = lock(&self.table).map.get_mut(&self.key) {
            let end = offset.saturating_add(len);
            e.unwritten.retain(|&(s, t)| t <= offset || s >= end);
            e.pending.store(e.unwritten.len(), Ordering::Release);
        }
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        lock(&self.table).release(self.key);
    }
}

struct App {
    stats: AppStats,
    /// Per-operation counts and detailed latency: only for an application
    /// with its own label in the metrics (`labelled`).
    detail: Option<Box<Detail>>,
    /// Whether the metrics name it (decided when it first connects: the
    /// first `metrics_apps_max` live ones); else it counts in `(other)`.
    labelled: bool,
    connections: u32,
    /// When the last connection closed (server clock, ns); `None` while
    /// connected.
    idle_since_ns: Option<u64>,
}

/// Nanoseconds an application with no connection keeps its entry (its
/// counters in `Stats`, its id for a returning process) before it is
/// forgotten. 60 s: longer than a job step's gap between two programs of
/// one application, short enough that short-lived tools (`sluice cp`,
/// one per file) do not accumulate.
pub const APP_IDLE_GRACE_NS: u64 = 60_000_000_000;

/// Name of the summary row that holds the counters of forgotten apps.
pub const FORGOTTEN_APPS: &str = "(forgotten applications)";

/// Applications by name, with their counters. An application without
/// connections is forgotten after `APP_IDLE_GRACE_NS`, or at once when a
/// new application needs its place; its counters move to one
/// `FORGOTTEN_APPS` row so the shutdown summary still covers everything.
/// The bound `apps_max` therefore refuses a new application only when
/// that many are connected at once. Ids are never reused, so a request of
/// a forgotten application that completes late is never counted for
/// another.
pub struct AppTable {
    by_name: HashMap<String, AppId>,
    apps: HashMap<AppId, App>,
    id_next: u32,
    apps_max: u32,
    forgotten: AppStats,
    /// Metrics: applications labelled until they were forgotten, and late
    /// completions of forgotten ones (the `(forgotten applications)` row).
    forgotten_labelled: (AppStats, Detail),
    /// Metrics: everything ever recorded for applications without a label
    /// (the `(other)` row). Both rows only grow, as counters must.
    other: (AppStats, Detail),
    /// Metrics are on: applications get labels and details.
    detailed: bool,
    /// Labels at most (`ServerLimits::metrics_apps_max`), and held now.
    labels_max: u32,
    labelled_live: u32,
}

pub(crate) fn empty_stats(name: &str, weight: u32) -> AppStats {
    AppStats { name: name.to_string(), weight, requests: 0, dispatches: 0, bytes_read: 0, bytes_written: 0, bytes_leased: 0, errors: 0, latency_us_log2: [0; LATENCY_BUCKETS] }
}

impl AppTable {
    pub fn new(apps_max: u32) -> AppTable {
        let row = |name: &str| (empty_stats(name, 0), Detail::default());
        AppTable {
            by_name: HashMap::new(),
            apps: HashMap::new(),
            id_next: 0,
            apps_max,
            forgotten: empty_stats(FORGOTTEN_APPS, 0),
            forgotten_labelled: row(FORGOTTEN_APPS),
            other: row(OTHER_APPS),
            detailed: false,
            labels_max: 0,
            labelled_live: 0,
        }
    }

    /// Metrics are on: the first `labels_max` live applications get a label
    /// and a detail (set before the first connection).
    pub fn set_detailed(&mut self, on: bool, labels_max: u32) {
        self.detailed = on;
        self.labels_max = labels_max;
    }

    /// A connection of application `name` arrived at `now_ns`.
    pub fn connect(&mut self, name: &str, weight: u32, now_ns: u64) -> Result<AppId> {
        self.forget_idle(now_ns);
        let id = match self.by_name.get(name) {
            Some(&id) => id,
            None => {
                if self.apps.len() >= self.apps_max as usize && !self.forget_oldest_idle() {
                    return Err(Error::limit(libc::EUSERS, format!("too many applications connected at once (apps_max = {})", self.apps_max)));
                }
                let id = AppId(self.id_next);
                self.id_next = self.id_next.checked_add(1).ok_or_else(|| Error::limit(libc::EUSERS, "application ids exhausted (2^32 since start)"))?;
                let labelled = self.detailed && self.labelled_live < self.labels_max;
                self.labelled_live += u32::from(labelled);
                let detail = labelled.then(Box::default);
                self.apps.insert(id, App { stats: empty_stats(name, weight), detail, labelled, connections: 0, idle_since_ns: None });
                self.by_name.insert(name.to_string(), id);
                id
            }
        };
        let app = self.apps.get_mut(&id).expect("by_name and apps agree");
        app.connections += 1;
        app.idle_since_ns = None;
        app.stats.weight = weight;
        Ok(id)
    }

    /// A connection of `app` closed at `now_ns`; true when it was the last.
    pub fn disconnect(&mut self, app: AppId, now_ns: u64) -> bool {
        let Some(a) = self.apps.get_mut(&app) else { return false };
        a.connections -= 1;
        if a.connections == 0 {
            a.idle_since_ns = Some(now_ns);
        }
        a.connections == 0
    }

    /// Forget every application idle for `APP_IDLE_GRACE_NS` or longer.
    fn forget_idle(&mut self, now_ns: u64) {
        let old: Vec<AppId> = self.apps.iter().filter(|(_, a)| a.idle_since_ns.is_some_and(|t| now_ns.saturating_sub(t) >= APP_IDLE_GRACE_NS)).map(|(&id, _)| id).collect();
        old.into_iter().for_each(|id| self.forget(id));
    }

    /// Forget the application idle the longest; false when all are live.
    fn forget_oldest_idle(&mut self) -> bool {
        let oldest = self.apps.iter().filter_map(|(&id, a)| a.idle_since_ns.map(|t| (t, id))).min();
        oldest.map(|(_, id)| self.forget(id)).is_some()
    }

    fn forget(&mut self, id: AppId) {
        let Some(a) = self.apps.remove(&id) else { return };
        self.by_name.remove(&a.stats.name);
        merge(&mut self.forgotten, &a.stats);
        if a.labelled {
            self.labelled_live -= 1;
            merge(&mut self.forgotten_labelled.0, &a.stats);
            if let Some(d) = &a.detail {
                self.forgotten_labelled.1.merge(d);
            }
        }
    }

    /// Applications in the table (connected or within their grace).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.apps.len()
    }

    /// `app`'s own counters, and, when metrics are on, the metrics row that
    /// also counts it: `(other)` for an application without a label, the
    /// forgotten row for one no longer in the table. Its detail too.
    fn rows_of(&mut self, app: AppId) -> (&mut AppStats, Option<&mut Detail>, Option<(&mut AppStats, &mut Detail)>) {
        let detailed = self.detailed;
        match self.apps.get_mut(&app) {
            Some(a) => {
                let extra = (detailed && !a.labelled).then_some((&mut self.other.0, &mut self.other.1));
                (&mut a.stats, a.detail.as_deref_mut(), extra)
            }
            None => (&mut self.forgotten, None, detailed.then_some((&mut self.forgotten_labelled.0, &mut self.forgotten_labelled.1))),
        }
    }

    /// Count one answered request of `app`: `bytes` moved (`None`: an
    /// error), arrival to answer, and, when it reached the device, its
    /// wait for and time on the device.
    pub fn record(&mut self, app: AppId, write: bool, bytes: Option<u64>, latency_ns: u64, timing: Option<(u64, u64)>) {
        let (own, detail, extra) = self.rows_of(app);
        count(own, write, bytes, latency_ns);
        if let Some(d) = detail {
            d.record(write, latency_ns, timing);
        }
        if let Some((row, d)) = extra {
            count(row, write, bytes, latency_ns);
            d.record(write, latency_ns, timing);
        }
    }

    /// Count a cache lease of `bytes` granted to `app`.
    pub fn record_lease(&mut self, app: AppId, bytes: u64) {
        let (own, _, extra) = self.rows_of(app);
        own.bytes_leased += bytes;
        if let Some((row, _)) = extra {
            row.bytes_leased += bytes;
        }
    }

    /// Count `bytes` that `app`'s client reports it wrote itself under
    /// write leases: bytes written, not requests.
    pub fn record_leased_write(&mut self, app: AppId, bytes: u64) {
        let (own, _, extra) = self.rows_of(app);
        own.bytes_written = own.bytes_written.saturating_add(bytes);
        if let Some((row, _)) = extra {
            row.bytes_written = row.bytes_written.saturating_add(bytes);
        }
    }

    /// Count one dispatch that carried requests of `app`.
    pub fn record_dispatch(&mut self, app: AppId) {
        let (own, _, extra) = self.rows_of(app);
        own.dispatches += 1;
        if let Some((row, _)) = extra {
            row.dispatches += 1;
        }
    }

    /// Every application's counters, by id (arrival order), then the
    /// forgotten ones' row when it counted anything.
    pub fn snapshot(&self) -> Vec<AppStats> {
        let mut ids: Vec<&AppId> = self.apps.keys().collect();
        ids.sort();
        let mut out: Vec<AppStats> = ids.into_iter().map(|id| self.apps[id].stats.clone()).collect();
        if self.forgotten.requests > 0 || self.forgotten.bytes_leased > 0 {
            out.push(self.forgotten.clone());
        }
        out
    }

    /// The metrics' rows: every labelled application (by arrival), then
    /// `(other)` and the forgotten row once they counted anything. Only
    /// labelled applications carry a detail, so a scrape copies at most
    /// `labels_max + 2` histograms.
    pub fn rows(&self) -> Vec<AppRow> {
        let mut ids: Vec<&AppId> = self.apps.iter().filter(|(_, a)| a.labelled).map(|(id, _)| id).collect();
        ids.sort();
        let mut out: Vec<AppRow> = ids
            .into_iter()
            .map(|id| {
                let a = &self.apps[id];
                AppRow { ids: vec![*id], stats: a.stats.clone(), detail: a.detail.as_deref().cloned().unwrap_or_default(), connections: a.connections }
            })
            .collect();
        let folded: Vec<(&AppId, &App)> = self.apps.iter().filter(|(_, a)| !a.labelled).collect();
        if !folded.is_empty() || self.other.0.requests > 0 || self.other.0.bytes_leased > 0 {
            let connections = folded.iter().map(|(_, a)| a.connections).sum();
            out.push(AppRow { ids: folded.iter().map(|(id, _)| **id).collect(), stats: self.other.0.clone(), detail: self.other.1.clone(), connections });
        }
        if self.forgotten_labelled.0.requests > 0 || self.forgotten_labelled.0.bytes_leased > 0 {
            out.push(AppRow { ids: Vec::new(), stats: self.forgotten_labelled.0.clone(), detail: self.forgotten_labelled.1.clone(), connections: 0 });
        }
        out
    }

    /// `app`'s name, while it is in the table.
    pub fn name(&self, app: AppId) -> Option<&str> {
        self.apps.get(&app).map(|a| a.stats.name.as_str())
    }

    /// Ids of the applications in the table.
    pub fn ids(&self) -> Vec<AppId> {
        self.apps.keys().copied().collect()
    }
}

/// One answered request in `s`'s counters.
fn count(s: &mut AppStats, write: bool, bytes: Option<u64>, latency_ns: u64) {
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

/// Add `b`'s counters to `a`.
pub(crate) fn merge(a: &mut AppStats, b: &AppStats) {
    a.requests += b.requests;
    a.dispatches += b.dispatches;
    a.bytes_read += b.bytes_read;
    a.bytes_written += b.bytes_written;
    a.bytes_leased += b.bytes_leased;
    a.errors += b.errors;
    a.latency_us_log2.iter_mut().zip(&b.latency_us_log2).for_each(|(x, y)| *x += y);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_file(dir: &std::path::Path, table: &Arc<Mutex<FileTable>>) -> OpenFile {
        let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join("f")).unwrap();
        let fd = OwnedFd::from(f);
        let st = stat_of(&fd).unwrap();
        OpenFile::register(fd, &st, libc::O_RDWR, table).unwrap()
    }

    #[test]
    fn unwritten_reservations_bound_at_n_and_n_plus_one_and_survive_a_truncate() {
        let dir = tempfile::tempdir().unwrap();
        let table = Arc::new(Mutex::new(FileTable::new(4)));
        let f = open_file(dir.path(), &table);
        let unwritten = |f: &OpenFile| lock(&f.table).map[&f.key].unwritten.iter().copied().collect::<Vec<_>>();
        for i in 0..RESERVATIONS_MAX as u64 {
            assert_eq!(f.reserve(10).unwrap(), i * 10);
        }
        assert_eq!(unwritten(&f).len(), RESERVATIONS_MAX);
        assert_eq!(f.reserved.load(Ordering::Acquire), RESERVATIONS_MAX);
        assert_eq!(f.reserve(10).unwrap(), RESERVATIONS_MAX as u64 * 10);
        let u = unwritten(&f);
        assert_eq!((u.len(), u[0]), (RESERVATIONS_MAX, (10, 20)), "N+1: the oldest forgotten");
        // Written ranges leave; a truncate keeps later appends clear of
        // the ones still to be written, and only of those.
        f.written(10, RESERVATIONS_MAX as u64 * 10 - 10);
        assert_eq!(unwritten(&f), vec![(RESERVATIONS_MAX as u64 * 10, RESERVATIONS_MAX as u64 * 10 + 10)]);
        f.resized();
        assert_eq!(f.reserve(5).unwrap(), RESERVATIONS_MAX as u64 * 10 + 10, "clear of the unwritten one");
        f.written(0, u64::MAX);
        assert_eq!(f.reserved.load(Ordering::Acquire), 0);
        f.resized();
        assert_eq!(f.reserve(5).unwrap(), 0, "all written: the new size");
        assert_eq!(f.reserve(RESERVE_BYTES_MAX + 1).unwrap_err().errno, libc::EINVAL);
        assert!(f.reserve(RESERVE_BYTES_MAX).is_ok());
    }

    #[test]
    fn apps_max_refuses_only_when_that_many_are_connected() {
        let mut t = AppTable::new(2);
        let a = t.connect("a", 1, 0).unwrap();
        t.connect("b", 1, 0).unwrap();
        assert_eq!(t.connect("c", 1, 0).unwrap_err().errno, libc::EUSERS, "N live, the N+1st is refused");
        t.record(a, false, Some(10), 1_000, None);
        assert!(t.disconnect(a, 5));
        let c = t.connect("c", 1, 6).unwrap();
        assert_ne!(c, a, "ids are never reused");
        assert_eq!(t.len(), 2);
        t.record(a, false, Some(7), 1_000, None);
        let snap = t.snapshot();
        let forgotten = snap.iter().find(|s| s.name == FORGOTTEN_APPS).expect("a forgotten row");
        assert_eq!((forgotten.requests, forgotten.bytes_read), (2, 17), "a late completion of a forgotten app is counted there");
    }

    #[test]
    fn the_first_n_apps_get_labels_and_the_other_row_only_grows() {
        let mut t = AppTable::new(100);
        t.set_detailed(true, 2);
        let (a, b, c) = (t.connect("a", 1, 0).unwrap(), t.connect("b", 1, 0).unwrap(), t.connect("c", 1, 0).unwrap());
        for app in [a, b, c, c] {
            t.record(app, false, Some(10), 1_000, Some((100, 200)));
        }
        let names = |t: &AppTable| t.rows().iter().map(|r| (r.stats.name.clone(), r.stats.requests, r.detail.reads)).collect::<Vec<_>>();
        assert_eq!(names(&t), [("a".into(), 1, 1), ("b".into(), 1, 1), (OTHER_APPS.into(), 2, 2)], "N labels; the N+1st counts in (other)");
        // c is forgotten: (other) keeps what it counted.
        t.disconnect(c, 1);
        t.connect("d", 1, 1 + APP_IDLE_GRACE_NS).unwrap();
        let rows = t.rows();
        let other = rows.iter().find(|r| r.stats.name == OTHER_APPS).unwrap();
        assert_eq!((other.stats.requests, other.ids.len()), (2, 1), "(other) does not drop when c goes; d is in it now");
        // a is forgotten: its counts move to the forgotten row, its label frees.
        t.disconnect(a, 2);
        let e = t.connect("e", 1, 3 + 2 * APP_IDLE_GRACE_NS).unwrap();
        t.record(e, true, Some(5), 1_000, None);
        let rows = t.rows();
        assert!(rows.iter().any(|r| r.stats.name == "e" && r.detail.writes == 1), "e takes the freed label");
        assert_eq!(rows.iter().find(|r| r.stats.name == FORGOTTEN_APPS).map(|r| r.stats.requests), Some(1), "a's request, in the forgotten row");
    }

    #[test]
    fn an_idle_app_is_forgotten_after_its_grace_and_kept_before() {
        let mut t = AppTable::new(100);
        let a = t.connect("a", 1, 0).unwrap();
        t.disconnect(a, 10);
        t.connect("b", 1, 10 + APP_IDLE_GRACE_NS - 1).unwrap();
        assert_eq!(t.connect("a", 1, 10 + APP_IDLE_GRACE_NS - 1).unwrap(), a, "within its grace a returning app keeps its id");
        t.disconnect(a, 20);
        t.connect("c", 1, 20 + APP_IDLE_GRACE_NS).unwrap();
        assert_eq!(t.len(), 2, "a was forgotten at its grace");
    }
}
