//! Read-ahead for sequential readers of a striped file. A program reading
//! through the FUSE mount gets at most 1 MiB per kernel request, so each
//! request would reach one data server while the others idle. When a
//! handle's reads are sequential and smaller than one stripe row (stripe
//! size x count, at most `READ_AHEAD_BYTES_MAX`), a read fetches the whole
//! row (one message per server, all at once) and keeps the rest for the
//! next reads.
//!
//! Coherence: a window is served only while no write or truncate went
//! through any handle of the same file on this `Remote` since the window
//! began to fill (the file's generation, counted after each such call
//! returns, so a fill that raced one is not served either), and for at
//! most `READ_AHEAD_TTL`; a write by another client (another mount,
//! another process's `Remote`) may thus be seen up to that much later, as
//! with the mount's attribute cache. Memory: one window per open handle, and at
//! most `READ_AHEAD_TOTAL_MAX` bytes over all handles of one `Remote`;
//! past it, reads go to the servers as asked, without read-ahead.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::client::{StripedClient, StripedFile};
use crate::error::Result;

/// Largest read-ahead window: one stripe row, at most this.
pub const READ_AHEAD_BYTES_MAX: u64 = 16 << 20;
/// Read-ahead bytes held at once by all handles of one cluster `Remote`.
pub const READ_AHEAD_TOTAL_MAX: usize = 256 << 20;
/// How long a read-ahead window may be served.
pub const READ_AHEAD_TTL: Duration = Duration::from_millis(200);

/// Bytes of read-ahead held, against a bound.
pub(crate) struct Budget {
    used: AtomicUsize,
    max: usize,
}

impl Budget {
    pub fn new(max: usize) -> Budget {
        Budget { used: AtomicUsize::new(0), max }
    }

    fn take(&self, n: usize) -> bool {
        self.used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| (u + n <= self.max).then_some(u + n)).is_ok()
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }
}

#[derive(Default)]
struct Window {
    /// Where the last read through this handle ended.
    next: u64,
    /// File offset of `data[0]`.
    offset: u64,
    data: Vec<u8>,
    /// The read that filled `data` stopped at end of file.
    eof: bool,
    /// Bytes of the budget this window holds.
    held: usize,
    filled: Option<Instant>,
    /// The file's generation when the fill began.
    generation: u64,
}

impl Window {
    /// Copy `[off, off + buf.len())` from the window when it holds it
    /// (or holds up to end of file) and is fresh.
    fn serve(&mut self, buf: &mut [u8], off: u64, now: Instant, generation: u64) -> Option<usize> {
        let fresh = self.filled.is_some_and(|t| now.duration_since(t) < READ_AHEAD_TTL) && self.generation == generation;
        let end = self.offset + self.data.len() as u64;
        let want = off + buf.len() as u64;
        if !fresh || off < self.offset || off > end || (want > end && !self.eof) {
            return None;
        }
        let n = (want.min(end) - off) as usize;
        let from = (off - self.offset) as usize;
        buf[..n].copy_from_slice(&self.data[from..from + n]);
        self.next = off + n as u64;
        Some(n)
    }

    fn clear(&mut self, budget: &Budget) {
        budget.give(std::mem::take(&mut self.held));
        self.data = Vec::new();
        self.filled = None;
    }
}

/// A striped file open through a `Remote`, with its read-ahead window.
pub(crate) struct OpenFile {
    pub file: StripedFile,
    window: Mutex<Window>,
    /// Writes and truncates through any handle of this file on this
    /// `Remote` (shared by its handles): a window filled under an older
    /// count is not served.
    generation: Arc<AtomicU64>,
}

impl OpenFile {
    pub fn new(file: StripedFile, generation: Arc<AtomicU64>) -> OpenFile {
        OpenFile { file, window: Mutex::new(Window::default()), generation }
    }

    fn window(&self) -> MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `pread`, from the window or the servers; sequential small reads
    /// fetch a whole stripe row when the budget allows.
    pub fn pread(&self, client: &StripedClient, budget: &Budget, buf: &mut [u8], off: u64) -> Result<usize> {
        let layout = &self.file.layout;
        let row = layout.stripe_bytes.saturating_mul(u64::from(layout.count)).min(READ_AHEAD_BYTES_MAX) as usize;
        let mut w = self.window();
        let now = Instant::now();
        let generation = self.generation.load(Ordering::Acquire);
        if let Some(n) = w.serve(buf, off, now, generation) {
            return Ok(n);
        }
        let sequential = off == w.next;
        w.clear(budget);
        if sequential && buf.len() < row && budget.take(row) {
            let mut data = vec![0u8; row];
            let n = match client.pread(&self.file, &mut data, off) {
                Ok(n) => n,
                Err(e) => {
                    budget.give(row);
                    return Err(e);
                }
            };
            data.truncate(n);
            *w = Window { next: off, offset: off, data, eof: n < row, held: row, filled: Some(now), generation };
            return Ok(w.serve(buf, off, now, generation).unwrap_or(0));
        }
        let n = client.pread(&self.file, buf, off)?;
        w.next = off + n as u64;
        Ok(n)
    }

    /// Drop the window (a write or truncate through this handle, close).
    pub fn invalidate(&self, budget: &Budget) {
        self.window().clear(budget);
    }

    /// A write or truncate through this handle returned (whether it
    /// succeeded or not: part of it may have been carried out): no window
    /// of this file filled before it is served again, on any handle.
    pub fn changed(&self, budget: &Budget) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.invalidate(budget);
    }
}
