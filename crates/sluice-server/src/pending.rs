//! Requests between admission and reply: their buffers, and how each one's
//! outcome becomes a reply on its connection (a list I/O message replies
//! once, when its last piece is done).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use sluice_core::Request;
use sluice_proto::{encode_response, AppStats, DirEntry, HelloOk, Response, WireStat};

use crate::net::Stream;
use crate::state::{lock, OpenFile};

/// A reply as the writer thread sends it; owns its data.
#[derive(Debug)]
pub enum Out {
    HelloOk(HelloOk),
    Ok,
    Fd(u64),
    Data(Vec<u8>),
    Count(u64),
    Stat(WireStat),
    Dir(Vec<DirEntry>, bool),
    Stats(Vec<AppStats>),
    /// The handshake's key challenge: a fresh nonce.
    Challenge([u8; sluice_proto::AUTH_BYTES]),
    Error(i32, String),
    /// Not a reply: wakes the writer to send a worker's `leftover`.
    Flush,
}

/// Largest reply (payload bytes) an executor worker sends itself instead
/// of handing it to the connection's writer thread. 64 KiB: a small reply
/// then costs one thread wake-up less (~20 us of a ~90 us round trip on
/// the 2-core CI machine), while large payloads still go through the
/// writer, which sends them from their buffers without a copy.
pub const DIRECT_REPLY_BYTES_MAX: usize = 64 << 10;

/// The sending side of a connection, shared by its writer thread and the
/// executor workers. Whoever holds the lock may write whole frames.
pub struct WriteSide {
    pub stream: Stream,
    /// The unsent tail of a frame a worker could only partly send without
    /// blocking; the writer thread sends it before anything else.
    pub leftover: Vec<u8>,
    pub broken: bool,
}

/// Longest wait for a connection's bytes to drain before looking at the
/// stop flag again.
const DRAIN_TICK: Duration = Duration::from_millis(100);

/// The bytes one connection holds: data of its admitted reads and writes,
/// and read replies not yet written to its socket (`reply_bytes_max`).
/// Past the bound its reader stops reading (backpressure), so a client
/// that does not read its replies stops being read, and holds no more.
pub struct ConnBytes {
    held: Mutex<u64>,
    drained: Condvar,
    max: u64,
    /// The writer is gone: nothing will drain any more.
    closed: AtomicBool,
    /// The same bytes over all connections, for `ServerHandle::reply_bytes`.
    total: Arc<AtomicU64>,
}

impl ConnBytes {
    pub fn new(max: u64, total: Arc<AtomicU64>) -> ConnBytes {
        ConnBytes { held: Mutex::new(0), drained: Condvar::new(), max, closed: AtomicBool::new(false), total }
    }

    /// Take `n` bytes, waiting while they would pass the bound (a message
    /// larger than the bound is taken alone). `false` when the connection's
    /// writer is gone or the server stops.
    pub fn take(&self, n: u64, stopping: &AtomicBool) -> bool {
        let mut held = lock(&self.held);
        while *held > 0 && *held + n > self.max {
            if self.closed.load(Ordering::SeqCst) || stopping.load(Ordering::SeqCst) {
                return false;
            }
            held = self.drained.wait_timeout(held, DRAIN_TICK).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
        *held += n;
        self.total.fetch_add(n, Ordering::Relaxed);
        true
    }

    pub fn give(&self, n: u64) {
        if n == 0 {
            return;
        }
        let mut held = lock(&self.held);
        *held -= n;
        self.total.fetch_sub(n, Ordering::Relaxed);
        drop(held);
        self.drained.notify_all();
    }

    /// The writer is gone: wake a reader waiting for bytes to drain.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.drained.notify_all();
    }
}

/// Where replies for one connection go, and its in-flight count.
#[derive(Clone)]
pub struct ReplyTo {
    pub tx: Sender<(u64, Out)>,
    /// Reads and writes of this connection admitted and not yet answered.
    pub inflight: Arc<AtomicU32>,
    pub out: Arc<Mutex<WriteSide>>,
    pub bytes: Arc<ConnBytes>,
}

impl ReplyTo {
    /// Answer an admitted request that took `reserved` bytes at admission:
    /// the in-flight count drops, and so do the bytes, but a read's data
    /// only once it is written to the socket.
    pub fn finish(&self, wire_id: u64, out: Out, reserved: u64) {
        self.inflight.fetch_sub(1, Ordering::AcqRel);
        let data = if let Out::Data(d) = &out { d.len() as u64 } else { 0 };
        self.bytes.give(reserved.saturating_sub(data));
        match self.try_direct(wire_id, out) {
            Ok(()) => self.bytes.give(data.min(reserved)),
            Err(out) => {
                let _ = self.tx.send((wire_id, out));
            }
        }
    }

    /// Send a small reply from this thread without ever blocking; give it
    /// back when the socket is busy, full, or owned by the writer.
    fn try_direct(&self, wire_id: u64, out: Out) -> Result<(), Out> {
        let data_len = if let Out::Data(d) = &out { d.len() } else { 0 };
        if data_len > DIRECT_REPLY_BYTES_MAX {
            return Err(out);
        }
        let Ok(mut w) = self.out.try_lock() else { return Err(out) };
        if w.broken || !w.leftover.is_empty() {
            return Err(out);
        }
        let mut frame = Vec::with_capacity(64 + data_len);
        encode_response(wire_id, &response(&out), &mut frame);
        match w.stream.send_nonblocking(&frame) {
            Ok(n) if n == frame.len() => Ok(()),
            Ok(0) => Err(out),
            Ok(n) => {
                w.leftover = frame[n..].to_vec();
                drop(w);
                let _ = self.tx.send((wire_id, Out::Flush));
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(out),
            Err(_) => {
                w.broken = true;
                Ok(())
            }
        }
    }
}

/// The wire form of a reply (a `Data` payload is borrowed, not copied).
pub fn response(out: &Out) -> Response<'_> {
    match out {
        Out::HelloOk(h) => Response::HelloOk(*h),
        Out::Ok | Out::Flush => Response::Ok,
        Out::Fd(fd) => Response::Fd(*fd),
        Out::Data(d) => Response::Data(d),
        Out::Count(n) => Response::Count(*n),
        Out::Stat(s) => Response::Stat(*s),
        Out::Dir(e, done) => Response::Dir { entries: e.clone(), done: *done },
        Out::Stats(a) => Response::Stats(a.clone()),
        Out::Challenge(nonce) => Response::Challenge { nonce: *nonce },
        Out::Error(errno, m) => Response::Error { errno: *errno, message: m },
    }
}

/// A request's data.
pub enum Buf {
    /// Read destination, sized to the request; truncated to what was read.
    Read(Vec<u8>),
    /// Write source: `body[at..at + len]`, shared by a list's pieces.
    Write(Arc<Vec<u8>>, usize, usize),
}

impl Buf {
    /// The bytes a write sends (empty for a read).
    pub fn data(&self) -> &[u8] {
        match self {
            Buf::Write(body, at, len) => &body[*at..*at + *len],
            Buf::Read(_) => &[],
        }
    }

    /// The buffer a read fills (empty for a write).
    pub fn read_buf(&mut self) -> &mut [u8] {
        match self {
            Buf::Read(b) => b,
            Buf::Write(..) => &mut [],
        }
    }
}

/// A list I/O message whose pieces are scheduled separately.
pub struct ListState {
    pub reply: ReplyTo,
    pub wire_id: u64,
    pub write: bool,
    /// Bytes taken at admission (`ConnBytes`): the pieces' total.
    pub reserved: u64,
    pub inner: Mutex<ListInner>,
}

pub struct ListInner {
    /// Pieces not yet settled.
    pub remaining: usize,
    /// Read: the pieces back to back (zeros past end of file).
    pub data: Vec<u8>,
    pub bytes: u64,
    pub error: Option<(i32, String)>,
}

impl ListState {
    /// Settle one piece (`pos`: where its bytes go in `data`).
    pub fn settle(&self, pos: usize, piece: Option<&[u8]>, result: Result<u64, (i32, String)>) {
        let mut g = lock(&self.inner);
        match result {
            Ok(n) => g.bytes += n,
            Err(e) => g.error = g.error.take().or(Some(e)),
        }
        if let Some(p) = piece {
            g.data[pos..pos + p.len()].copy_from_slice(p);
        }
        g.remaining -= 1;
        if g.remaining == 0 {
            self.reply_now(&mut g);
        }
    }

    /// Send the reply (all pieces settled, or none could be admitted).
    pub fn reply_now(&self, g: &mut ListInner) {
        let out = match g.error.take() {
            Some((errno, msg)) => Out::Error(errno, msg),
            None if self.write => Out::Count(g.bytes),
            None => Out::Data(std::mem::take(&mut g.data)),
        };
        self.reply.finish(self.wire_id, out, self.reserved);
    }
}

/// How a request's outcome is answered.
pub enum Reply {
    /// The connection, the wire id, and the bytes taken at admission.
    Single(ReplyTo, u64, u64),
    Piece(Arc<ListState>, usize),
}

/// One admitted read or write piece.
pub struct Pending {
    pub req: Request,
    pub file: Arc<OpenFile>,
    pub buf: Buf,
    pub arrival_ns: u64,
    pub reply: Reply,
    /// Set by the executor: bytes transferred, or an errno.
    pub result: Result<u64, i32>,
}

fn errno_message(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

impl Pending {
    /// Send this request's outcome (or a piece's share of it).
    pub fn answer(self) {
        let result = self.result.map_err(|e| (e, errno_message(e)));
        self.answer_with(result);
    }

    /// Answer with an explicit outcome (used when admission failed).
    pub fn answer_with(self, result: Result<u64, (i32, String)>) {
        match self.reply {
            Reply::Single(to, id, reserved) => {
                let out = match (result, self.buf) {
                    (Err((errno, msg)), _) => Out::Error(errno, msg),
                    (Ok(_), Buf::Read(b)) => Out::Data(b),
                    (Ok(n), Buf::Write(..)) => Out::Count(n),
                };
                to.finish(id, out, reserved);
            }
            Reply::Piece(list, pos) => {
                let piece = match &self.buf {
                    Buf::Read(b) if result.is_ok() => Some(b.as_slice()),
                    _ => None,
                };
                list.settle(pos, piece, result);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_bytes_hold_n_and_make_the_n_plus_1st_wait_until_drained() {
        let (total, stop) = (Arc::new(AtomicU64::new(0)), AtomicBool::new(false));
        let b = Arc::new(ConnBytes::new(100, Arc::clone(&total)));
        assert!(b.take(60, &stop) && b.take(40, &stop), "N bytes are taken at once");
        assert_eq!(total.load(Ordering::Relaxed), 100);
        let waiter = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.take(1, &AtomicBool::new(false)))
        };
        std::thread::sleep(Duration::from_millis(150));
        assert!(!waiter.is_finished(), "the N+1st byte waits");
        b.give(40);
        assert!(waiter.join().unwrap(), "and is taken once bytes drained");
        assert_eq!(total.load(Ordering::Relaxed), 61);
        // A message larger than the bound is taken alone, never deadlocks.
        let solo = ConnBytes::new(10, Arc::new(AtomicU64::new(0)));
        assert!(solo.take(50, &stop));
        // A closed connection never waits.
        b.close();
        assert!(!b.take(1000, &stop));
    }
}
