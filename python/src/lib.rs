//! `sluice._sluice`: the client library for Python. One class, `Client`,
//! over `sluice_client::Client`: open and close files on a server, read
//! into and write from any object with the buffer protocol (numpy arrays,
//! bytearray, memoryview) without copying through Python objects, and list
//! I/O (many pieces of a file in one request). Every call releases the GIL
//! while it waits for the server. Errors are `OSError` with the errno the
//! server or the client gave.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use sluice_client::{Client as Inner, ClientError, ConnectOptions, Fd};

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

    /// The application id the server knows this connection by.
    #[getter]
    fn app(&self) -> String {
        self.inner.app().to_string()
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
        let (pieces, total) = pieces_of(pieces)?;
        let buf = Bytes::get(buf, true)?;
        let (addr, len) = buf.addr_len();
        if len < total {
            return Err(PyValueError::new_err(format!("the buffer holds {len} bytes, the pieces {total}")));
        }
        py.allow_threads(move || {
            // SAFETY: as in `pread`.
            let b = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, total) };
            self.inner.read_list(Fd(fd), &pieces, b)
        })
        .map_err(os_error)
    }

    /// Write `data` back to back over the pieces `[(offset, length), ...]`
    /// of the file, in one request.
    fn write_list(&self, py: Python<'_>, fd: u64, pieces: Vec<(u64, u64)>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let (pieces, total) = pieces_of(pieces)?;
        let data = Bytes::get(data, false)?;
        let (addr, len) = data.addr_len();
        if len < total {
            return Err(PyValueError::new_err(format!("the data holds {len} bytes, the pieces {total}")));
        }
        py.allow_threads(move || {
            // SAFETY: as in `pread`, read-only use.
            let b = unsafe { std::slice::from_raw_parts(addr as *const u8, total) };
            self.inner.write_list(Fd(fd), &pieces, b)
        })
        .map_err(os_error)
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
}

#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    Ok(())
}
