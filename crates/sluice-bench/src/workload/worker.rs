//! One rank: the process the runner starts for each simulated MPI rank.
//!
//! Protocol on its pipes: the worker opens its file (or connects), prints
//! `ready`, waits for a line on stdin, runs its accesses one at a time
//! (synchronous, like the seed's clients), then prints one JSON line with
//! what it did. Errors go to stderr with exit status 1.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::pattern::{accesses, AppSpec, Dir};
use super::replay::{Access, ReplayLog};
use super::WorkloadError;

/// Where the rank's I/O goes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Target {
    /// pread/pwrite on the file under `root` (O_DIRECT when `direct_io`).
    Direct { root: PathBuf, direct_io: bool },
    /// Through sluice: one server, a cluster or a forwarder set (`Remote`).
    Service { addr: String },
    /// pread/pwrite on `prefix` (O_DIRECT when `direct_io`), in a process
    /// started with the interposer `lib` preloaded and pointed at `addr`
    /// (what `sluice run` does).
    Preload { addr: String, lib: PathBuf, prefix: PathBuf, direct_io: bool },
}

/// Everything a worker needs, passed as JSON in `SLUICE_BENCH_WORKER`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub app: AppSpec,
    pub rank: u32,
    pub seed: u64,
    pub target: Target,
    /// The rank makes what it wrote durable before it reports (`fsync`),
    /// so the time counted is the time until the data is on the device;
    /// asked of ranks whose writes go through a page cache (not O_DIRECT,
    /// and not to an O_DIRECT server).
    #[serde(default)]
    pub durable: bool,
}

/// The environment variable carrying the spec.
pub const SPEC_ENV: &str = "SLUICE_BENCH_WORKER";

/// What a worker reports.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WorkerResult {
    pub bytes: u64,
    pub requests: u64,
    /// When the rank started, on the machine's monotonic clock
    /// (`monotonic_ns`): when its first request left (through the service,
    /// as the client sent it; on a file, the clock read before the call).
    pub start_ns: u64,
    /// CPU time the rank's process used from the common start to its
    /// last access (`CLOCK_PROCESS_CPUTIME_ID`, ns): what the client side
    /// of its requests cost, measured apart from the rest of the machine.
    #[serde(default)]
    pub cpu_ns: u64,
}

/// This process's CPU time (user and system, every thread) in nanoseconds.
pub fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "CLOCK_PROCESS_CPUTIME_ID is always available on Linux");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for the runner and its
/// workers (a `std::time::Instant` cannot cross processes).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(r, 0, "CLOCK_MONOTONIC is always available on Linux");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Alignment of O_DIRECT buffers (the logical block size of any disk).
const DIRECT_ALIGN: usize = 4096;

/// A heap buffer aligned for O_DIRECT.
pub(crate) struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    pub(crate) fn new(len: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(DIRECT_ALIGN), DIRECT_ALIGN).expect("valid layout");
        // SAFETY: the layout has a non-zero size; the memory is zeroed so
        // every byte is initialised before any slice is formed.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory for a {len}-byte buffer");
        AlignedBuf { ptr, layout }
    }

    pub(crate) fn slice(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.layout.size());
        // SAFETY: ptr is valid for layout.size() initialised bytes, owned
        // by self and borrowed mutably for the slice's lifetime.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

enum Backend {
    File(File),
    Service(Box<sluice_remote::Remote>, sluice_client::Fd),
}

impl Backend {
    fn open(spec: &WorkerSpec) -> Result<Backend, WorkloadError> {
        let name = spec.app.file_name(spec.rank);
        // A reader opens read-only, as applications do (ROMIO's
        // MPI_MODE_RDONLY is O_RDONLY); through the service that lets a
        // page-cache read take a cache lease, which a read-write handle
        // never gets.
        let write = spec.app.op == Dir::Write;
        match &spec.target {
            Target::Direct { root, direct_io } | Target::Preload { prefix: root, direct_io, .. } => {
                let flags = if *direct_io { libc::O_DIRECT } else { 0 };
                let f = OpenOptions::new().read(true).write(write).custom_flags(flags).open(root.join(&name));
                Ok(Backend::File(f.map_err(|e| WorkloadError::io(format!("open {name}"), e))?))
            }
            Target::Service { addr } => {
                let opts = sluice_client::ConnectOptions { app: Some(spec.app.name.clone()), weight: spec.app.weight, client_id: Some(spec.rank), ..Default::default() };
                let c = sluice_remote::Remote::connect_with(addr, opts).map_err(WorkloadError::client)?;
                let fd = c.open(&name, if write { libc::O_RDWR } else { libc::O_RDONLY }, 0).map_err(WorkloadError::client)?;
                Ok(Backend::Service(Box::new(c), fd))
            }
        }
    }

    /// Note when the first request leaves (`first_sent`).
    fn mark_first(&self) {
        if let Backend::Service(c, _) = self {
            c.mark_next_send();
        }
    }

    /// When the first request left, on the monotonic clock: as the client
    /// saw it send, else `before` (the clock read before the call).
    fn first_sent(&self, before: u64) -> u64 {
        match self {
            Backend::Service(c, _) => sent_ns(c, before),
            Backend::File(_) => before,
        }
    }

    /// Make what this rank wrote durable (`fsync`).
    fn sync(&self) -> Result<(), WorkloadError> {
        match self {
            Backend::File(f) => f.sync_all().map_err(|e| WorkloadError::io("fsync".into(), e)),
            Backend::Service(c, fd) => c.fsync(*fd).map_err(WorkloadError::client),
        }
    }

    fn access(&self, op: Dir, buf: &mut [u8], offset: u64) -> Result<usize, WorkloadError> {
        match (self, op) {
            (Backend::File(f), Dir::Read) => f.read_at(buf, offset).map_err(|e| WorkloadError::io("pread".into(), e)),
            (Backend::File(f), Dir::Write) => f.write_at(buf, offset).map_err(|e| WorkloadError::io("pwrite".into(), e)),
            (Backend::Service(c, fd), Dir::Read) => c.pread(*fd, buf, offset).map_err(WorkloadError::client),
            (Backend::Service(c, fd), Dir::Write) => c.pwrite(*fd, buf, offset).map_err(WorkloadError::client),
        }
    }
}

/// When `c`'s marked request left, on the monotonic clock (`before` when
/// it sent none): a clock read right at the send, so that two processes
/// that reach the server microseconds apart are recorded in that order.
fn sent_ns(c: &sluice_remote::Remote, before: u64) -> u64 {
    c.marked_send().map_or(before, |at| monotonic_ns().saturating_sub(at.elapsed().as_nanos() as u64).max(before))
}

/// Say `ready`, then wait for the runner's `go` (the common start).
fn ready_then_go() -> Result<(), WorkloadError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready").and_then(|_| out.flush()).map_err(|e| WorkloadError::io("stdout".into(), e))?;
    let mut go = String::new();
    std::io::stdin().lock().read_line(&mut go).map_err(|e| WorkloadError::io("stdin".into(), e))?;
    if go.trim() != "go" {
        return Err(WorkloadError::usage("the runner went away before the start".into()));
    }
    Ok(())
}

/// The one JSON line a finished rank prints.
fn report(result: &WorkerResult) -> Result<(), WorkloadError> {
    let line = serde_json::to_string(result).expect("plain struct serialises");
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|_| out.flush()).map_err(|e| WorkloadError::io("stdout".into(), e))
}

/// Run one rank: the body of `sluice bench worker`.
pub fn run_worker() -> Result<(), WorkloadError> {
    let text = std::env::var(SPEC_ENV).map_err(|_| WorkloadError::usage(format!("{SPEC_ENV} is not set: this command is started by `sluice bench`")))?;
    let spec: WorkerSpec = serde_json::from_str(&text).map_err(|e| WorkloadError::usage(format!("bad worker spec: {e}")))?;
    if let Some(log) = &spec.app.replay {
        return run_replay(&spec, &ReplayLog::load(log)?);
    }
    let pieces = accesses(&spec.app, spec.rank, spec.seed);
    let backend = Backend::open(&spec)?;
    let mut buf = AlignedBuf::new(spec.app.granularity as usize);
    buf.slice(spec.app.granularity as usize).fill(0x5a ^ spec.rank as u8);
    ready_then_go()?;
    let cpu0 = process_cpu_ns();
    let before = monotonic_ns();
    backend.mark_first();
    let mut result = WorkerResult { start_ns: before, ..WorkerResult::default() };
    for (i, (offset, len)) in pieces.into_iter().enumerate() {
        let done = backend.access(spec.app.op, buf.slice(len as usize), offset)?;
        if i == 0 {
            result.start_ns = backend.first_sent(before);
        }
        if done != len as usize {
            return Err(WorkloadError::usage(format!("short {:?} at {offset}: {done} of {len} bytes", spec.app.op)));
        }
        result.bytes += len;
        result.requests += 1;
    }
    if spec.durable && spec.app.op == Dir::Write {
        backend.sync()?;
    }
    result.cpu_ns = process_cpu_ns().saturating_sub(cpu0);
    report(&result)
}

/// Files one replaying rank has open, on its target.
enum ReplayFiles {
    Direct(HashMap<u32, File>),
    Service(Box<sluice_remote::Remote>, HashMap<u32, sluice_client::Fd>),
}

/// Run one rank of a recorded log: its accesses in order, each after its
/// think time, then the same report line as a pattern's rank.
fn run_replay(spec: &WorkerSpec, log: &ReplayLog) -> Result<(), WorkloadError> {
    let mine: &[Access] = log.ranks.get(spec.rank as usize).map_or(&[], |v| v.as_slice());
    let mut used: Vec<u32> = mine.iter().map(|a| a.file).collect();
    used.sort_unstable();
    used.dedup();
    let name = |f: u32| log.files[f as usize].0.clone();
    let files = match &spec.target {
        Target::Direct { root, direct_io } | Target::Preload { prefix: root, direct_io, .. } => {
            let flags = if *direct_io { libc::O_DIRECT } else { 0 };
            let open = |f: u32| {
                OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(flags)
                    .open(root.join(name(f)))
                    .map(|h| (f, h))
                    .map_err(|e| WorkloadError::io(format!("open {}", name(f)), e))
            };
            ReplayFiles::Direct(used.iter().map(|&f| open(f)).collect::<Result<_, _>>()?)
        }
        Target::Service { addr } => {
            let opts = sluice_client::ConnectOptions { app: Some(spec.app.name.clone()), weight: spec.app.weight, client_id: Some(spec.rank), ..Default::default() };
            let c = sluice_remote::Remote::connect_with(addr, opts).map_err(WorkloadError::client)?;
            let fds = used.iter().map(|&f| c.open(&name(f), libc::O_RDWR, 0).map(|fd| (f, fd)).map_err(WorkloadError::client)).collect::<Result<_, _>>()?;
            ReplayFiles::Service(Box::new(c), fds)
        }
    };
    let len_max = log.access_bytes_max() as usize;
    let mut buf = AlignedBuf::new(len_max);
    buf.slice(len_max).fill(0x5a ^ spec.rank as u8);
    ready_then_go()?;
    let cpu0 = process_cpu_ns();
    let before = monotonic_ns();
    if let ReplayFiles::Service(c, _) = &files {
        c.mark_next_send();
    }
    let mut result = WorkerResult { start_ns: before, ..WorkerResult::default() };
    for a in mine {
        if a.think_ns > 0 {
            std::thread::sleep(std::time::Duration::from_nanos(a.think_ns));
        }
        let b = buf.slice(a.len as usize);
        let done = match (&files, a.write) {
            (ReplayFiles::Direct(m), false) => m[&a.file].read_at(b, a.offset).map_err(|e| WorkloadError::io("pread".into(), e))?,
            (ReplayFiles::Direct(m), true) => m[&a.file].write_at(b, a.offset).map_err(|e| WorkloadError::io("pwrite".into(), e))?,
            (ReplayFiles::Service(c, m), false) => c.pread(m[&a.file], b, a.offset).map_err(WorkloadError::client)?,
            (ReplayFiles::Service(c, m), true) => c.pwrite(m[&a.file], b, a.offset).map_err(WorkloadError::client)?,
        };
        if done != a.len as usize {
            return Err(WorkloadError::usage(format!("short {} at {} of {}: {done} of {} bytes", if a.write { "write" } else { "read" }, a.offset, name(a.file), a.len)));
        }
        if let (0, ReplayFiles::Service(c, _)) = (result.requests, &files) {
            result.start_ns = sent_ns(c, before);
        }
        result.bytes += a.len;
        result.requests += 1;
    }
    if spec.durable && mine.iter().any(|a| a.write) {
        let written: Vec<u32> = used.iter().copied().filter(|f| mine.iter().any(|a| a.write && a.file == *f)).collect();
        for f in written {
            match &files {
                ReplayFiles::Direct(m) => m[&f].sync_all().map_err(|e| WorkloadError::io("fsync".into(), e))?,
                ReplayFiles::Service(c, m) => c.fsync(m[&f]).map_err(WorkloadError::client)?,
            }
        }
    }
    result.cpu_ns = process_cpu_ns().saturating_sub(cpu0);
    report(&result)
}
