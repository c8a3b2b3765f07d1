//! Reading frames off one connection within the server's time and memory
//! bounds (`ServerLimits`).
//!
//! - Time: before its handshake a connection has `handshake_timeout_ms`;
//!   between frames, with nothing in flight, `idle_timeout_s`; once a frame
//!   has started, `frame_stall_ms` plus one millisecond per
//!   `FRAME_RATE_MIN_BYTES_PER_MS` bytes of its body. Each read waits at
//!   most until the deadline that applies (a socket receive timeout), so a
//!   silent or trickling client frees its slot and its memory.
//! - Memory: a body is allocated as its bytes arrive, chunk by chunk, never
//!   when the header announces it; every chunk is first taken from the
//!   server-wide `PartialBudget` (`partial_bytes_max`). When the budget is
//!   spent the reader waits, so its connection is not read (backpressure),
//!   until other frames complete or time out. Waiting for the budget does
//!   not count against the frame's own deadline.
//!
//! Invariant: bytes held in partial frames over all connections never
//! exceed `partial_bytes_max`; a frame's bytes return to the budget when
//! it is complete or abandoned.

use std::io::{self, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use sluice_proto::{check_header, Header, HEADER_BYTES};

use crate::config::FRAME_RATE_MIN_BYTES_PER_MS;
use crate::net::Stream;
use crate::state::lock;

/// Bytes a reader takes from the budget, and reads, at a time (1 MiB): a
/// 64 MiB write holds no more than it has received plus one chunk.
const BODY_CHUNK_BYTES: usize = 1 << 20;
/// Longest single wait of a read without a deadline (something in flight):
/// it wakes to look again whether the connection became idle.
const READ_TICK: Duration = Duration::from_secs(1);
/// Longest wait for the budget before looking at the stop flag again.
const BUDGET_TICK: Duration = Duration::from_millis(100);

/// A connection's input: its read buffer over the socket, and the receive
/// timeout last set on the socket, which is set again only when the wait
/// changes (almost always the `READ_TICK`: no system call per frame).
pub(crate) struct Input {
    r: BufReader<Stream>,
    timeout: Option<Duration>,
}

impl Input {
    pub fn new(stream: Stream, buffer_bytes: usize) -> Input {
        Input { r: BufReader::with_capacity(buffer_bytes, stream), timeout: None }
    }

    fn wait_at_most(&mut self, wait: Duration) -> io::Result<()> {
        if self.timeout != Some(wait) {
            self.r.get_ref().set_read_timeout(Some(wait))?;
            self.timeout = Some(wait);
        }
        Ok(())
    }
}

/// The bytes all connections may hold in partial frames.
pub(crate) struct PartialBudget {
    held: Mutex<u64>,
    drained: Condvar,
    max: u64,
}

impl PartialBudget {
    pub fn new(max: u64) -> PartialBudget {
        PartialBudget { held: Mutex::new(0), drained: Condvar::new(), max }
    }

    /// Take `n` bytes, waiting while they are not there; `false` when the
    /// server stops first.
    fn take(&self, n: u64, stopping: &AtomicBool) -> bool {
        let mut held = lock(&self.held);
        while *held + n > self.max {
            if stopping.load(Ordering::SeqCst) {
                return false;
            }
            held = self.drained.wait_timeout(held, BUDGET_TICK).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
        *held += n;
        true
    }

    fn give(&self, n: u64) {
        let mut held = lock(&self.held);
        *held -= n;
        drop(held);
        self.drained.notify_all();
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        *lock(&self.held)
    }
}

/// The outcome of reading one frame.
pub(crate) enum FrameRead {
    Frame(Header, Vec<u8>),
    /// Clean end of stream between frames, an idle connection timed out,
    /// or the server stops: close without a word.
    Eof,
    /// Malformed or stalled: the request id from the raw header, and why.
    Bad(u64, i32, String),
}

/// What a connection's reader needs to read frames within the bounds.
pub(crate) struct Intake<'a> {
    pub frame_bytes_max: u32,
    pub frame_stall_ms: u64,
    pub budget: &'a PartialBudget,
    pub stopping: &'a AtomicBool,
}

/// Why a read gave up.
enum Cut {
    /// End of stream: before any byte of the frame (`clean`) or inside it.
    Eof {
        clean: bool,
    },
    /// The deadline passed: before the frame started, or inside it.
    Late {
        started: bool,
    },
    Io,
}

/// A frame's deadline, once its first byte arrived.
struct Started {
    at: Instant,
    allowed: Duration,
}

impl Started {
    fn deadline(&self) -> Instant {
        self.at + self.allowed
    }
}

/// The socket wait until `deadline`, at most `READ_TICK`; `None` once past.
fn wait_until(deadline: Option<Instant>) -> Option<Duration> {
    match deadline {
        None => Some(READ_TICK),
        Some(d) => d.checked_duration_since(Instant::now()).filter(|w| !w.is_zero()).map(|w| w.min(READ_TICK)),
    }
}

/// Fill `buf`. Before the frame started, `waiting` gives the deadline
/// (re-asked at each wake-up: the connection may become idle); after, the
/// frame's own.
fn fill(r: &mut Input, buf: &mut [u8], started: &mut Option<Started>, stall_ms: u64, waiting: &dyn Fn() -> Option<Instant>) -> Result<(), Cut> {
    let mut at = 0;
    while at < buf.len() {
        if r.r.buffer().is_empty() {
            let deadline = match started {
                Some(s) => Some(s.deadline()),
                None => waiting(),
            };
            let wait = wait_until(deadline).ok_or(Cut::Late { started: started.is_some() })?;
            r.wait_at_most(wait).map_err(|_| Cut::Io)?;
        }
        match r.r.read(&mut buf[at..]) {
            Ok(0) => return Err(Cut::Eof { clean: at == 0 && started.is_none() }),
            Ok(n) => {
                at += n;
                started.get_or_insert_with(|| Started { at: Instant::now(), allowed: Duration::from_millis(stall_ms) });
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted) => {}
            Err(_) => return Err(Cut::Io),
        }
    }
    Ok(())
}

impl Intake<'_> {
    /// Read one frame: step one (header complete and sane) before any body
    /// byte is held; the body then as it arrives, within the budget. The
    /// caller's `parse_request` is step two.
    pub fn read_frame(&self, r: &mut Input, waiting: &dyn Fn() -> Option<Instant>) -> FrameRead {
        let mut started = None;
        let mut h = [0u8; HEADER_BYTES];
        match fill(r, &mut h, &mut started, self.frame_stall_ms, waiting) {
            Ok(()) => {}
            Err(Cut::Eof { clean: false }) => return FrameRead::Bad(0, libc::EPROTO, "truncated frame header".into()),
            Err(Cut::Late { started: true }) => return FrameRead::Bad(0, libc::ETIMEDOUT, format!("frame header stalled (frame_stall_ms = {})", self.frame_stall_ms)),
            Err(_) => return FrameRead::Eof,
        }
        let id = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
        let header = match check_header(&h, self.frame_bytes_max) {
            Ok(Some(hd)) => hd,
            Ok(None) => return FrameRead::Bad(id, libc::EPROTO, "truncated frame header".into()),
            Err(e) => return FrameRead::Bad(id, e.errno(), e.to_string()),
        };
        let n = header.body_len as usize;
        if let Some(s) = started.as_mut() {
            s.allowed += Duration::from_millis(n as u64 / FRAME_RATE_MIN_BYTES_PER_MS);
        }
        let mut body = Vec::new();
        let mut held = 0u64;
        let got = self.read_body(r, &mut body, n, &mut held, &mut started, waiting);
        self.budget.give(held);
        match got {
            Ok(()) => FrameRead::Frame(header, body),
            Err(Cut::Eof { .. }) => FrameRead::Bad(id, libc::EPROTO, format!("truncated frame body: the connection closed before its {n} bytes arrived")),
            Err(Cut::Late { .. }) => {
                FrameRead::Bad(id, libc::ETIMEDOUT, format!("frame body stalled: {} of {n} bytes in time (frame_stall_ms = {}, then 1 MiB/s)", body.len(), self.frame_stall_ms))
            }
            Err(Cut::Io) => FrameRead::Eof,
        }
    }

    /// Receive `n` body bytes chunk by chunk, each taken from the budget
    /// first (`held` counts them, for the caller to give back).
    fn read_body(&self, r: &mut Input, body: &mut Vec<u8>, n: usize, held: &mut u64, started: &mut Option<Started>, waiting: &dyn Fn() -> Option<Instant>) -> Result<(), Cut> {
        while body.len() < n {
            let want = (n - body.len()).min(BODY_CHUNK_BYTES);
            let asked = Instant::now();
            if !self.budget.take(want as u64, self.stopping) {
                return Err(Cut::Io);
            }
            *held += want as u64;
            // Time spent waiting for the budget is the server's, not the
            // client's: it does not count against the frame's deadline.
            if let Some(s) = started.as_mut() {
                s.allowed += asked.elapsed();
            }
            let old = body.len();
            body.resize(old + want, 0);
            fill(r, &mut body[old..], started, self.frame_stall_ms, waiting).inspect_err(|_| body.truncate(old))?;
        }
        Ok(())
    }
}
