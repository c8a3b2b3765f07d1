//! `sluice._sluice`: the client library for Python. One class, `Client`,
//! over `sluice_remote::Remote`, so that an address is one server or a
//! cluster's metadata role (striped files): open and close files, read
//! into and write from any object with the buffer protocol (numpy arrays,
//! bytearray, memoryview) without copying through Python objects, and list
//! I/O (many pieces of a file in one request). Every call releases the GIL
//! while it waits for the server. Errors are `OSError` with the errno the
//! server or the client gave.
//!
//! `ArrayPlan` is `sluice-array`'s plan of a distributed array (HPF
//! distribution in memory, Zarr v3 layout on disk) with the per-rank steps
//! of a collective that `sluice.array` runs between MPI calls.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use sluice_array::{aggregators, gather, plan, rank_messages, scatter, Dist, Distribution, Dtype, Layout, MessageLimits, Plan, PlanLimits};
use sluice_client::{ClientError, ConnectOptions, Fd, Group};
use sluice_remote::Remote as Inner;

fn os_error(e: ClientError) -> PyErr {
    PyOSError::new_err((e.posix_errno(), e.message))
}

/// Any object's bytes through the buffer protocol, whatever its item type
/// (a float64 numpy array is its 8 x n bytes): requested with
/// `PyBUF_SIMPLE`, so the exporter hands out one contiguous run of bytes or
/// refuses. Released on drop.
struct Bytes {
    view: ffi::Py_buffer,
}

impl Bytes {
    fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Bytes> {
        let flags = if writable { ffi::PyBUF_SIMPLE | ffi::PyBUF_WRITABLE } else { ffi::PyBUF_SIMPLE };
        // SAFETY: an all-zero Py_buffer is a valid out-parameter.
        let mut view: ffi::Py_buffer = unsafe { std::mem::zeroed() };
        // SAFETY: obj is a live object; on success `view` holds a buffer we release in Drop.
        if unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut view, flags) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        Ok(Bytes { view })
    }

    /// Address and length; a zero-length buffer (whose address may be
    /// NULL) is given a dangling, aligned address, valid for no bytes.
    fn addr_len(&self) -> (usize, usize) {
        match self.view.len {
            0 => (std::ptr::NonNull::<u8>::dangling().as_ptr() as usize, 0),
            n => (self.view.buf as usize, n as usize),
        }
    }
}

impl Drop for Bytes {
    fn drop(&mut self) {
        // SAFETY: released once, with the GIL held (Drop runs where the
        // object was taken, outside `allow_threads`).
        unsafe { ffi::PyBuffer_Release(&mut self.view) };
    }
}

/// A group's participants: one count, or one per object of a striped file.
#[derive(FromPyObject)]
enum Participants {
    One(u32),
    PerObject(Vec<u32>),
}

impl Participants {
    fn counts(self) -> Vec<u32> {
        match self {
            Participants::One(n) => vec![n],
            Participants::PerObject(v) => v,
        }
    }
}

/// Pieces `(offset, length)` and the bytes they add up to.
fn pieces_of(pieces: Vec<(u64, u64)>) -> PyResult<(Vec<(u64, u64)>, usize)> {
    let total = pieces.iter().try_fold(0u64, |t, &(_, l)| t.checked_add(l)).ok_or_else(|| PyValueError::new_err("piece lengths overflow"))?;
    Ok((pieces, total as usize))
}

/// A connection to a sluice server (`unix:PATH` or `tcp:HOST:PORT`).
///
/// `app` names the application the scheduler shares the device among
/// (default: the program's name and session, as for `sluice run`);
/// `client_id` tells its processes apart (MPI ranks: the rank).
#[pyclass(frozen, module = "sluice._sluice")]
struct Client {
    inner: Inner,
}

impl Client {
    /// List I/O into (`write`: from) `obj`'s bytes, in one request, with
    /// or without a server-directed group.
    fn list_io(&self, py: Python<'_>, fd: u64, pieces: Vec<(u64, u64)>, obj: &Bound<'_, PyAny>, write: bool, group: Option<(u64, Vec<u32>, u32)>) -> PyResult<usize> {
        let (pieces, total) = pieces_of(pieces)?;
        let bytes = Bytes::get(obj, !write)?;
        let (addr, len) = bytes.addr_len();
        // A read may fill the start of a larger buffer; a write's data is
        // the pieces' bytes exactly (extra bytes were dropped unsaid).
        if len < total || (write && len != total) {
            let what = if write { "the data holds" } else { "the buffer holds" };
            return Err(PyValueError::new_err(format!("{what} {len} bytes, the pieces {total}")));
        }
        py.allow_threads(move || {
            // SAFETY: as in `pread`: the exported buffer stays alive (held
            // by `bytes`) for the call, `len` contiguous bytes, writable
            // when reading into it.
            if write {
                let b = unsafe { std::slice::from_raw_parts(addr as *const u8, total) };
                match group {
                    Some((id, n, wait_ms)) => self.inner.list_group_any(Fd(fd), &pieces, Some(b), &mut [], id, &n, wait_ms),
                    None => self.inner.write_list(Fd(fd), &pieces, b),
                }
            } else {
                // SAFETY: as above; the buffer was exported writable.
                let b = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, total) };
                match group {
                    Some((id, n, wait_ms)) => self.inner.list_group_any(Fd(fd), &pieces, None, b, id, &n, wait_ms),
                    None => self.inner.read_list(Fd(fd), &pieces, b),
                }
            }
        })
        .map_err(os_error)
    }
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (addr, app = None, client_id = None, weight = 1))]
    fn new(py: Python<'_>, addr: &str, app: Option<String>, client_id: Option<u32>, weight: u32) -> PyResult<Client> {
        let opts = ConnectOptions { app, client_id, weight, ..ConnectOptions::default() };
        let addr = addr.to_string();
        let inner = py.allow_threads(move || Inner::connect_with(&addr, opts)).map_err(os_error)?;
        Ok(Client { inner })
    }

    /// The data servers behind the address: 1 for one server, N for a
    /// cluster's metadata role (whose files are striped over them).
    #[getter]
    fn servers(&self) -> usize {
        self.inner.servers()
    }

    /// The application id the server knows this connection by.
    #[getter]
    fn app(&self) -> String {
        self.inner.app()
    }

    /// Open `path` (relative to the server's root) with `os.O_*` flags.
    #[pyo3(signature = (path, flags = libc::O_RDONLY, mode = 0o644))]
    fn open(&self, py: Python<'_>, path: &str, flags: i32, mode: u32) -> PyResult<u64> {
        py.allow_threads(|| self.inner.open(path, flags, mode)).map(|fd| fd.0).map_err(os_error)
    }

    fn close(&self, py: Python<'_>, fd: u64) -> PyResult<()> {
        py.allow_threads(|| self.inner.close(Fd(fd))).map_err(os_error)
    }

    /// Read into `buf` (any writable contiguous buffer) from `offset`; the
    /// bytes read (fewer at the end of the file).
    fn pread(&self, py: Python<'_>, fd: u64, buf: &Bound<'_, PyAny>, offset: u64) -> PyResult<usize> {
        let buf = Bytes::get(buf, true)?;
        let (addr, len) = buf.addr_len();
        py.allow_threads(move || {
            // SAFETY: the buffer stays exported (held by `buf`) for this call
            // and is `len` writable contiguous bytes.
            let b = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
            self.inner.pread(Fd(fd), b, offset)
        })
        .map_err(os_error)
    }

    /// Write all of `data` (any contiguous buffer) at `offset`.
    fn pwrite(&self, py: Python<'_>, fd: u64, data: &Bound<'_, PyAny>, offset: u64) -> PyResult<usize> {
        let data = Bytes::get(data, false)?;
        let (addr, len) = data.addr_len();
        py.allow_threads(move || {
            // SAFETY: as in `pread`, read-only use.
            let b = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
            self.inner.pwrite(Fd(fd), b, offset)
        })
        .map_err(os_error)
    }

    /// Read the pieces `[(offset, length), ...]` of the file, in order,
    /// into `buf` back to back, in one request; the bytes read.
    fn read_list(&self, py: Python<'_>, fd: u64, pieces: Vec<(u64, u64)>, buf: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.list_io(py, fd, pieces, buf, false, None)
    }

    /// Write `data` back to back over the pieces `[(offset, length), ...]`
    /// of the file, in one request.
    fn write_list(&self, py: Python<'_>, fd: u64, pieces: Vec<(u64, u64)>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.list_io(py, fd, pieces, data, true, None)
    }

    /// `write_list` as one participant of a server-directed group: the
    /// server holds the group's messages until `participants` of them
    /// (every rank's message with this `group_id`) have come, or fails
    /// them all with ETIMEDOUT after `wait_ms`, then serves them together
    /// in disk order. On a cluster's striped file `participants` is a list,
    /// one count per object of the file (`objects_touched`): each object's
    /// share is one group on its data server. The bytes written.
    #[pyo3(signature = (fd, pieces, data, group_id, participants, wait_ms = 30_000))]
    #[allow(clippy::too_many_arguments)] // the Python signature
    fn write_list_group(&self, py: Python<'_>, fd: u64, pieces: Vec<(u64, u64)>, data: &Bound<'_, PyAny>, group_id: u64, participants: Participants, wait_ms: u32) -> PyResult<usize> {
        self.list_io(py, fd, pieces, data, true, Some((group_id, participants.counts(), wait_ms)))
    }

    /// `read_list` as one participant of a server-directed group (see
    /// `write_list_group`). The bytes read.
    #[pyo3(signature = (fd, pieces, buf, group_id, participants, wait_ms = 30_000))]
    #[allow(clippy::too_many_arguments)] // the Python signature
    fn read_list_group(&self, py: Python<'_>, fd: u64, pieces: Vec<(u64, u64)>, buf: &Bound<'_, PyAny>, group_id: u64, participants: Participants, wait_ms: u32) -> PyResult<usize> {
        self.list_io(py, fd, pieces, buf, false, Some((group_id, participants.counts(), wait_ms)))
    }

    /// The file's striping on a cluster, `(stripe_bytes, count)` (byte `o`
    /// is in object `(o // stripe_bytes) % count`, one data server each), or
    /// None (one server, or a file of one object).
    fn stripe(&self, py: Python<'_>, fd: u64) -> PyResult<Option<(u64, u32)>> {
        py.allow_threads(|| self.inner.stripe(Fd(fd))).map_err(os_error)
    }

    /// The objects of the file that `pieces` touch, ascending: `[0]` on one
    /// server; on a cluster's striped file, the objects (one per data
    /// server the file spans) whose groups a collective message joins.
    fn objects_touched(&self, py: Python<'_>, fd: u64, pieces: Vec<(u64, u64)>) -> PyResult<Vec<u32>> {
        py.allow_threads(|| self.inner.objects_touched(Fd(fd), &pieces)).map_err(os_error)
    }

    /// The file's size in bytes.
    fn size(&self, py: Python<'_>, fd: u64) -> PyResult<u64> {
        py.allow_threads(|| self.inner.fstat(Fd(fd))).map(|st| st.size).map_err(os_error)
    }

    fn ftruncate(&self, py: Python<'_>, fd: u64, size: u64) -> PyResult<()> {
        py.allow_threads(|| self.inner.ftruncate(Fd(fd), size)).map_err(os_error)
    }

    fn fsync(&self, py: Python<'_>, fd: u64) -> PyResult<()> {
        py.allow_threads(|| self.inner.fsync(Fd(fd))).map_err(os_error)
    }

    /// Remove `path`.
    fn unlink(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        py.allow_threads(|| self.inner.unlink(path)).map_err(os_error)
    }

    /// Rename `src` to `dst` (atomically, on one server).
    fn rename(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        py.allow_threads(|| self.inner.rename(src, dst)).map_err(os_error)
    }

    /// Create directory `path`.
    #[pyo3(signature = (path, mode = 0o755))]
    fn mkdir(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        py.allow_threads(|| self.inner.mkdir(path, mode)).map_err(os_error)
    }
}

fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// List messages as the Rust collective sends them.
const MESSAGE_LIMITS: MessageLimits = MessageLimits::COLLECTIVE;

/// The plan of one distributed array: its Zarr v3 layout, its HPF
/// distribution over a process grid (`dist`: `block`, `cyclic`,
/// `cyclic(K)` or `*` per dimension), and every rank's pieces.
#[pyclass(frozen, module = "sluice._sluice")]
struct ArrayPlan {
    layout: Layout,
    dist: Distribution,
    plan: Plan,
    /// The plan's server-directed groups (any base), made on first use.
    groups: std::sync::OnceLock<sluice_array::Groups>,
    aggregator: Vec<usize>,
    /// Two-phase: `[r][a]`, rank `r`'s pieces of the files rank `a`
    /// aggregates (`by_aggregator`), worked out on first use.
    exchange: std::sync::OnceLock<Vec<Vec<Vec<sluice_array::Piece>>>>,
}

impl ArrayPlan {
    fn build(layout: Layout, grid: Vec<u64>, dist: Vec<String>) -> PyResult<ArrayPlan> {
        let dists = dist.iter().map(|d| Dist::parse(d)).collect::<Result<Vec<_>, _>>().map_err(value_error)?;
        let dist = Distribution::new(layout.shape().to_vec(), grid, dists).map_err(value_error)?;
        let plan = plan(&dist, &layout, &PlanLimits::default()).map_err(value_error)?;
        let ranks = dist.ranks() as usize;
        // One server: each file's aggregator is the rank holding most of it.
        let bytes = plan.unit_rank_bytes(layout.units(), dist.ranks());
        let aggregator = aggregators(&bytes, &vec![0; ranks], &[0], &vec![0; layout.units() as usize]);
        Ok(ArrayPlan { layout, dist, plan, groups: std::sync::OnceLock::new(), aggregator, exchange: std::sync::OnceLock::new() })
    }

    /// File `u`'s key; with `time`, the array's first dimension is a time
    /// axis planned one step deep, and the key is that of step `time`.
    fn unit_key(&self, u: u64, time: Option<u64>) -> PyResult<String> {
        let key = self.layout.key(u);
        match time {
            None => Ok(key),
            Some(t) if self.layout.shape().first() == Some(&1) => Ok(format!("c/{t}{}", key.strip_prefix("c/0").unwrap_or(&key[1..]))),
            Some(_) => Err(PyValueError::new_err("a time step needs a plan whose first dimension (time) has extent 1")),
        }
    }

    fn unit_path(&self, path: &str, u: u64, time: Option<u64>) -> PyResult<String> {
        Ok(format!("{}/{}", path.trim_matches('/'), self.unit_key(u, time)?))
    }

    /// Two-phase: rank `r`'s pieces of each file, grouped by the rank that
    /// aggregates the file (`[a]`), in the order both sides of the
    /// exchange walk them: file, then offset.
    fn by_aggregator(&self, r: u64) -> &[Vec<sluice_array::Piece>] {
        let all = self.exchange.get_or_init(|| {
            (0..self.dist.ranks())
                .map(|r| {
                    let mut out = vec![Vec::new(); self.dist.ranks() as usize];
                    for file in self.plan.rank_files(r) {
                        out[self.aggregator[file[0].unit as usize]].extend(file);
                    }
                    out
                })
                .collect()
        });
        &all[r as usize]
    }

    /// The plan's server-directed groups with base `b`.
    fn groups_of(&self, b: u64) -> sluice_array::Groups {
        self.groups.get_or_init(|| sluice_array::Groups::new(&self.plan, self.layout.units(), &MESSAGE_LIMITS, 0)).rebased(b)
    }

    fn check_rank(&self, rank: u64) -> PyResult<()> {
        if rank >= self.dist.ranks() {
            return Err(PyValueError::new_err(format!("rank {rank} of a plan for {} ranks", self.dist.ranks())));
        }
        Ok(())
    }

    /// `rank`'s local array as a buffer of exactly its share.
    fn local_of(&self, rank: u64, local: &Bound<'_, PyAny>, writable: bool) -> PyResult<Bytes> {
        let buf = Bytes::get(local, writable)?;
        let want = (self.dist.local_elements(rank) * self.layout.dtype().bytes()) as usize;
        if buf.addr_len().1 != want {
            return Err(PyValueError::new_err(format!("rank {rank}'s local array has {} bytes, its share is {want}", buf.addr_len().1)));
        }
        Ok(buf)
    }

    /// Two-phase: for each rank in order, its pieces of the files `rank`
    /// aggregates, with where they start in `rank`'s side of the exchange
    /// (what it gets for a write, sends for a read); and that side's bytes.
    fn exchange_side(&self, rank: u64) -> (Vec<(u64, &[sluice_array::Piece])>, u64) {
        let mut at = 0u64;
        let parts = (0..self.dist.ranks())
            .map(|s| {
                let pieces = self.by_aggregator(s)[rank as usize].as_slice();
                let start = at;
                at += piece_bytes(pieces);
                (start, pieces)
            })
            .collect();
        (parts, at)
    }

    /// The files `rank` aggregates (with `time`: of that step), with their
    /// paths under `path`.
    fn aggregated_files(&self, path: &str, rank: u64, time: Option<u64>) -> PyResult<Vec<(u64, String)>> {
        (0..self.layout.units()).filter(|&u| self.aggregator[u as usize] as u64 == rank).map(|u| Ok((u, self.unit_path(path, u, time)?))).collect()
    }
}

/// Two-phase: visit file `u`'s pieces in every rank's part of the
/// exchange (`parts`, from `ArrayPlan::exchange_side`), with each piece's
/// offset in the exchange. Each part lists its pieces file by file, so
/// one cursor a part (`cursors`, starting at `(0, start)`) walks them as
/// the files are visited in order.
fn walk_file(parts: &[(u64, &[sluice_array::Piece])], cursors: &mut [(usize, u64)], u: u64, mut visit: impl FnMut(&sluice_array::Piece, usize)) {
    for ((_, pieces), (i, off)) in parts.iter().zip(cursors.iter_mut()) {
        while let Some(p) = pieces.get(*i).filter(|p| p.unit == u) {
            visit(p, *off as usize);
            (*i, *off) = (*i + 1, *off + p.len);
        }
    }
}

/// The bytes of `pieces`.
fn piece_bytes(pieces: &[sluice_array::Piece]) -> u64 {
    pieces.iter().map(|p| p.len).sum()
}

/// A buffer of exactly `want` bytes for an exchange.
fn exchange_buf(obj: &Bound<'_, PyAny>, writable: bool, want: u64) -> PyResult<Bytes> {
    let buf = Bytes::get(obj, writable)?;
    if buf.addr_len().1 as u64 != want {
        return Err(PyValueError::new_err(format!("an exchange buffer of {} bytes where the plan moves {want}", buf.addr_len().1)));
    }
    Ok(buf)
}

#[pymethods]
impl ArrayPlan {
    #[new]
    #[pyo3(signature = (shape, dtype, chunks, grid, dist, shards = None))]
    fn new(shape: Vec<u64>, dtype: &str, chunks: Vec<u64>, grid: Vec<u64>, dist: Vec<String>, shards: Option<Vec<u64>>) -> PyResult<ArrayPlan> {
        let layout = Layout::new(shape, Dtype::parse(dtype).map_err(value_error)?, chunks, shards).map_err(value_error)?;
        ArrayPlan::build(layout, grid, dist)
    }

    /// The plan of an existing array from its `zarr.json` text (one sluice
    /// can write: uncompressed, fixed offsets).
    #[staticmethod]
    fn from_zarr_json(text: &str, grid: Vec<u64>, dist: Vec<String>) -> PyResult<ArrayPlan> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(value_error)?;
        ArrayPlan::build(Layout::from_zarr_json(&v).map_err(value_error)?, grid, dist)
    }

    /// The shape of `rank`'s block of an array of `shape` distributed
    /// over `grid` by `dist`, from the distribution alone: planning the
    /// whole array to learn it failed on layouts `write` takes (a chunk
    /// past 1 TiB, a plan past `pieces_max`).
    #[staticmethod]
    fn local_shape_of(shape: Vec<u64>, grid: Vec<u64>, dist: Vec<String>, rank: u64) -> PyResult<Vec<u64>> {
        let dists = dist.iter().map(|d| Dist::parse(d)).collect::<Result<Vec<_>, _>>().map_err(value_error)?;
        let dist = Distribution::new(shape, grid, dists).map_err(value_error)?;
        if rank >= dist.ranks() {
            return Err(PyValueError::new_err(format!("rank {rank} of a grid of {} ranks", dist.ranks())));
        }
        Ok(dist.local_shape(rank))
    }

    #[getter]
    fn shape(&self) -> Vec<u64> {
        self.layout.shape().to_vec()
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        self.layout.dtype().name()
    }

    #[getter]
    fn ranks(&self) -> u64 {
        self.dist.ranks()
    }

    /// The shape of `rank`'s local array.
    fn local_shape(&self, rank: u64) -> Vec<u64> {
        self.dist.local_shape(rank)
    }

    /// The array's `zarr.json`, with dimension names and attributes (JSON text).
    fn zarr_json(&self, dims: Vec<String>, attributes: &str) -> PyResult<String> {
        let attrs: serde_json::Value = serde_json::from_str(attributes).map_err(value_error)?;
        Ok(serde_json::to_string_pretty(&self.layout.zarr_json(&dims, attrs)).map_err(value_error)?)
    }

    /// Raise unless every shard file of the array at `path` has its inner
    /// chunks where this plan reads them, as its index says
    /// (`Layout::check_shard_index`). A shard never written is fine (it
    /// reads as the fill value).
    fn check_shard_indexes(&self, py: Python<'_>, client: PyRef<'_, Client>, path: &str) -> PyResult<()> {
        if self.layout.shard().is_none() {
            return Ok(());
        }
        let inner = &client.inner;
        for u in 0..self.layout.units() {
            let p = self.unit_path(path, u, None)?;
            let want = self.layout.shard_index(u).len();
            let found = py.allow_threads(|| -> Result<Option<(u64, Vec<u8>)>, ClientError> {
                let fd = match inner.open(&p, libc::O_RDONLY, 0) {
                    Err(e) if e.errno == libc::ENOENT => return Ok(None),
                    other => other?,
                };
                let read = (|| {
                    let size = inner.fstat(fd)?.size;
                    let mut got = vec![0u8; want];
                    let n = if size >= want as u64 { inner.pread(fd, &mut got, size - want as u64)? } else { 0 };
                    got.truncate(n);
                    Ok((size, got))
                })();
                let _ = inner.close(fd);
                read.map(Some)
            });
            let Some((size, tail)) = found.map_err(os_error)? else { continue };
            self.layout.check_shard_index(u, size, &tail).map_err(|m| PyValueError::new_err(format!("{p}: {m}")))?;
        }
        Ok(())
    }

    /// The directories the array's files go in, relative to the array
    /// (with `time`: those of that time step, see `transfer`).
    #[pyo3(signature = (time = None))]
    fn unit_dirs(&self, time: Option<u64>) -> PyResult<Vec<String>> {
        let mut dirs = Vec::new();
        for u in 0..self.layout.units() {
            let k = self.unit_key(u, time)?;
            dirs.push(k[..k.rfind('/').unwrap_or(0)].to_string());
        }
        dirs.dedup();
        Ok(dirs)
    }

    /// Step 1 of a collective write, for `rank`: create the files it
    /// aggregates under `path`, sized, with their shard index (with
    /// `time`: the files of that time step, see `transfer`). On a cluster
    /// file `u` is one object on data server `u` mod N (`Remote::create_on`):
    /// a server-directed collective needs files of one object, and the
    /// array's files spread over the servers.
    #[pyo3(signature = (client, path, rank, time = None))]
    fn prepare(&self, py: Python<'_>, client: PyRef<'_, Client>, path: &str, rank: u64, time: Option<u64>) -> PyResult<()> {
        let inner = &client.inner;
        let paths = (0..self.layout.units()).filter(|&u| self.aggregator[u as usize] as u64 == rank).map(|u| Ok((u, self.unit_path(path, u, time)?))).collect::<PyResult<Vec<_>>>()?;
        py.allow_threads(|| {
            for (u, p) in &paths {
                let u = *u;
                let fd = inner.create_on(p, u as usize, 0o644)?;
                let index = self.layout.shard_index(u);
                let r = if index.is_empty() {
                    inner.ftruncate(fd, self.layout.unit_bytes())
                } else {
                    inner.pwrite(fd, &index, self.layout.unit_data_bytes()).map(|_| ())
                };
                let c = inner.close(fd);
                r.and(c)?;
            }
            Ok(())
        })
        .map_err(os_error)
    }

    /// Step 2, for `rank`: move its local array (`local`, its bytes in C
    /// order) to (`write`) or from the files, file by file as list I/O.
    /// With `group_base` (the same on every rank) each message is a
    /// participant of a server-directed group. With `time`, the plan's
    /// first dimension (extent 1) is step `time` of a time axis chunked
    /// one step deep: the files are those of that step. The bytes moved.
    #[pyo3(signature = (client, path, rank, local, write, group_base = None, wait_ms = 30_000, time = None))]
    #[allow(clippy::too_many_arguments)]
    fn transfer(
        &self,
        py: Python<'_>,
        client: PyRef<'_, Client>,
        path: &str,
        rank: u64,
        local: &Bound<'_, PyAny>,
        write: bool,
        group_base: Option<u64>,
        wait_ms: u32,
        time: Option<u64>,
    ) -> PyResult<u64> {
        if rank >= self.dist.ranks() {
            return Err(PyValueError::new_err(format!("rank {rank} of a plan for {} ranks", self.dist.ranks())));
        }
        let buf = Bytes::get(local, !write)?;
        let (addr, len) = buf.addr_len();
        let want = (self.dist.local_elements(rank) * self.layout.dtype().bytes()) as usize;
        if len != want {
            return Err(PyValueError::new_err(format!("rank {rank}'s local array has {len} bytes, its share is {want}")));
        }
        let inner = &client.inner;
        let paths = (0..self.layout.units()).map(|u| self.unit_path(path, u, time)).collect::<PyResult<Vec<_>>>()?;
        let groups = group_base.map(|b| self.groups_of(b));
        py.allow_threads(move || {
            // SAFETY: the buffer stays exported (held by `buf`) for this call
            // and is `len` contiguous bytes, writable when reading.
            let local = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) };
            let mut moved = 0u64;
            for file in rank_messages(&self.plan, rank, &MESSAGE_LIMITS, groups.as_ref()) {
                let u = file[0].unit;
                let flags = if write { libc::O_WRONLY } else { libc::O_RDONLY };
                let fd = match inner.open(&paths[u as usize], flags, 0) {
                    // A chunk or shard never written reads as the fill value
                    // (zero, `Layout::from_zarr_json`), as zarr-python reads
                    // it: zarr-python leaves out chunks that are all fill,
                    // and a time series may have steps not yet written.
                    // Every rank reading this file finds it missing alike,
                    // so a group's participants all leave it out.
                    Err(e) if !write && e.errno == libc::ENOENT => {
                        for m in &file {
                            scatter(&m.pieces, &vec![0u8; m.bytes() as usize], local);
                            moved += m.bytes();
                        }
                        continue;
                    }
                    other => other?,
                };
                let mut r = Ok(());
                for m in &file {
                    let group = m.group.map(|t| Group { id: t.id, participants: t.participants, wait_ms });
                    r = if write {
                        let data = gather(&m.pieces, local);
                        match group {
                            Some(g) => inner.write_list_group(fd, &m.ranges(), &data, g),
                            None => inner.write_list(fd, &m.ranges(), &data),
                        }
                        .map(|_| ())
                    } else {
                        let mut data = vec![0u8; m.bytes() as usize];
                        let got = match group {
                            Some(g) => inner.read_list_group(fd, &m.ranges(), &mut data, g),
                            None => inner.read_list(fd, &m.ranges(), &mut data),
                        };
                        got.map(|_| scatter(&m.pieces, &data, local))
                    };
                    if r.is_err() {
                        break;
                    }
                    moved += m.bytes();
                }
                let c = inner.close(fd);
                r.and(c)?;
            }
            Ok(moved)
        })
        .map_err(os_error)
    }

    /// Rank `rank`'s list messages in the order `transfer` sends them
    /// (`sluice_array::rank_messages`, as the Rust collectives send them):
    /// `(file, j, [(offset, length), ...], group)`, the group `(id,
    /// participants)` with `group_base` (server-directed), else None.
    #[pyo3(signature = (rank, group_base = None))]
    fn messages(&self, rank: u64, group_base: Option<u64>) -> PyResult<Vec<(u64, usize, Vec<(u64, u64)>, Option<(u64, u32)>)>> {
        if rank >= self.dist.ranks() {
            return Err(PyValueError::new_err(format!("rank {rank} of a plan for {} ranks", self.dist.ranks())));
        }
        let groups = group_base.map(|b| self.groups_of(b));
        Ok(rank_messages(&self.plan, rank, &MESSAGE_LIMITS, groups.as_ref()).into_iter().flatten().map(|m| (m.unit, m.j, m.ranges(), m.group.map(|t| (t.id, t.participants)))).collect())
    }

    /// Two-phase (`sluice.array`'s `strategy="two-phase"`): each file is
    /// built whole in the memory of the rank that aggregates it (the rank
    /// holding most of it) and written with one call, after an exchange
    /// between ranks. `(to, from)`: the bytes `rank` sends each rank `d`
    /// in a write's exchange (its pieces of the files `d` aggregates) and
    /// gets from each rank `s` (`s`'s pieces of the files `rank`
    /// aggregates). A read's exchange is the same with the two swapped.
    fn two_phase_counts(&self, rank: u64) -> PyResult<(Vec<u64>, Vec<u64>)> {
        self.check_rank(rank)?;
        let to = self.by_aggregator(rank).iter().map(|v| piece_bytes(v)).collect();
        let from = self.exchange_side(rank).0.iter().map(|(_, pieces)| piece_bytes(pieces)).collect();
        Ok((to, from))
    }

    /// Two-phase write, step 1: `rank`'s local bytes packed into `out`
    /// (the sum of `to` bytes) for the exchange: for each rank in order,
    /// this rank's pieces of the files it aggregates.
    fn two_phase_pack(&self, rank: u64, local: &Bound<'_, PyAny>, out: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check_rank(rank)?;
        let groups = self.by_aggregator(rank);
        let src = self.local_of(rank, local, false)?;
        let dst = exchange_buf(out, true, groups.iter().map(|g| piece_bytes(g)).sum())?;
        let ((sa, sl), (da, dl)) = (src.addr_len(), dst.addr_len());
        // SAFETY: both buffers stay exported (held above) for this call;
        // `out` is writable, and they are distinct objects' memory.
        let (src, dst) = unsafe { (std::slice::from_raw_parts(sa as *const u8, sl), std::slice::from_raw_parts_mut(da as *mut u8, dl)) };
        let mut at = 0;
        for p in groups.iter().flatten() {
            let n = p.len as usize;
            dst[at..at + n].copy_from_slice(&src[p.mem_off as usize..p.mem_off as usize + n]);
            at += n;
        }
        Ok(())
    }

    /// Two-phase write, step 2: the files `rank` aggregates, built from
    /// `got` (the exchange's bytes, from each rank in order, as
    /// `two_phase_pack` packed them) and written whole: created
    /// (truncated), data and shard index in one `pwrite`, closed. Holds
    /// one file's bytes at a time. The bytes written.
    #[pyo3(signature = (client, path, rank, got, time = None))]
    fn two_phase_write(&self, py: Python<'_>, client: PyRef<'_, Client>, path: &str, rank: u64, got: &Bound<'_, PyAny>, time: Option<u64>) -> PyResult<u64> {
        self.check_rank(rank)?;
        let (parts, bytes) = self.exchange_side(rank);
        let buf = exchange_buf(got, false, bytes)?;
        let (ga, gl) = buf.addr_len();
        let files = self.aggregated_files(path, rank, time)?;
        let inner = &client.inner;
        py.allow_threads(move || {
            // SAFETY: `got` stays exported (held by `buf`) for this call.
            let got = unsafe { std::slice::from_raw_parts(ga as *const u8, gl) };
            let mut cursors: Vec<(usize, u64)> = parts.iter().map(|(start, _)| (0, *start)).collect();
            let mut written = 0u64;
            // One file's bytes at a time, the buffer reused (zeroed: a
            // file's edge chunks have bytes no piece covers).
            let mut data = vec![0u8; if files.is_empty() { 0 } else { self.layout.unit_bytes() as usize }];
            for (k, (u, p)) in files.iter().enumerate() {
                let u = *u;
                if k > 0 {
                    data.fill(0);
                }
                walk_file(&parts, &mut cursors, u, |pc, o| {
                    let (f, n) = (pc.file_off as usize, pc.len as usize);
                    data[f..f + n].copy_from_slice(&got[o..o + n]);
                });
                let index = self.layout.shard_index(u);
                let d = self.layout.unit_data_bytes() as usize;
                data[d..d + index.len()].copy_from_slice(&index);
                let fd = inner.create_on(p, u as usize, 0o644)?;
                let r = inner.pwrite(fd, &data, 0);
                let c = inner.close(fd);
                written += r? as u64;
                c?;
            }
            Ok(written)
        })
        .map_err(os_error)
    }

    /// Two-phase read, step 1: the files `rank` aggregates, each read
    /// whole, packed into `out` (the sum of `from` bytes of
    /// `two_phase_counts`) for each rank `d` in order: `d`'s pieces of
    /// them. Holds one file's bytes at a time. The bytes read.
    #[pyo3(signature = (client, path, rank, out, time = None))]
    fn two_phase_read(&self, py: Python<'_>, client: PyRef<'_, Client>, path: &str, rank: u64, out: &Bound<'_, PyAny>, time: Option<u64>) -> PyResult<u64> {
        self.check_rank(rank)?;
        let (parts, bytes) = self.exchange_side(rank);
        let buf = exchange_buf(out, true, bytes)?;
        let (oa, ol) = buf.addr_len();
        let files = self.aggregated_files(path, rank, time)?;
        let inner = &client.inner;
        py.allow_threads(move || {
            // SAFETY: `out` stays exported and writable (held by `buf`).
            let out = unsafe { std::slice::from_raw_parts_mut(oa as *mut u8, ol) };
            let mut cursors: Vec<(usize, u64)> = parts.iter().map(|(start, _)| (0, *start)).collect();
            let mut read = 0u64;
            // The data part only (the shard index is not needed), one
            // file at a time, the buffer reused; past the end of the
            // file, zeros.
            let mut data = vec![0u8; if files.is_empty() { 0 } else { self.layout.unit_data_bytes() as usize }];
            for (k, (u, p)) in files.iter().enumerate() {
                if k > 0 {
                    data.fill(0);
                }
                // A file never written: zeros, the fill value (see `transfer`).
                match inner.open(p, libc::O_RDONLY, 0) {
                    Err(e) if e.errno == libc::ENOENT => {}
                    other => {
                        let fd = other?;
                        let r = inner.pread(fd, &mut data, 0);
                        let c = inner.close(fd);
                        read += r? as u64;
                        c?;
                    }
                }
                walk_file(&parts, &mut cursors, *u, |pc, o| {
                    let (f, n) = (pc.file_off as usize, pc.len as usize);
                    out[o..o + n].copy_from_slice(&data[f..f + n]);
                });
            }
            Ok(read)
        })
        .map_err(os_error)
    }

    /// Two-phase read, step 2: `got` (from each rank in order: this rank's
    /// pieces of the files it aggregates) into `local`.
    fn two_phase_unpack(&self, rank: u64, got: &Bound<'_, PyAny>, local: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check_rank(rank)?;
        let groups = self.by_aggregator(rank);
        let dst = self.local_of(rank, local, true)?;
        let src = exchange_buf(got, false, groups.iter().map(|g| piece_bytes(g)).sum())?;
        let ((sa, sl), (da, dl)) = (src.addr_len(), dst.addr_len());
        // SAFETY: both buffers stay exported (held above) for this call;
        // `local` is writable, and they are distinct objects' memory.
        let (src, dst) = unsafe { (std::slice::from_raw_parts(sa as *const u8, sl), std::slice::from_raw_parts_mut(da as *mut u8, dl)) };
        let mut at = 0;
        for p in groups.iter().flatten() {
            let n = p.len as usize;
            dst[p.mem_off as usize..p.mem_off as usize + n].copy_from_slice(&src[at..at + n]);
            at += n;
        }
        Ok(())
    }
}

/// A base for the group ids of a new server-directed collective
/// (`sluice_array::group_base`, as the Rust collectives make theirs): made
/// on one rank and broadcast, the same on every rank.
#[pyfunction]
fn group_base() -> u64 {
    sluice_array::group_base()
}

#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_function(wrap_pyfunction!(group_base, m)?)?;
    m.add_class::<ArrayPlan>()?;
    Ok(())
}
