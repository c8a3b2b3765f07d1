//! Requests between admission and reply: their buffers, and how each one's
//! outcome becomes a reply for its connection (a list I/O message replies
//! once, when its last piece is done).
//!
//! Answering produces a [`Delivery`]; the event loop, which owns every
//! connection, queues it on the connection it names (or drops it when that
//! connection is gone).

use std::sync::{Arc, Mutex};

use sluice_core::Request;
use sluice_proto::{AppStats, DirEntry, HelloOk, Response, WireStat};

use crate::shm::Shm;
use crate::state::OpenFile;
use crate::sync::lock;

/// A reply as the event loop sends it; owns its data.
#[derive(Debug)]
pub enum Out {
    HelloOk(HelloOk),
    Ok,
    /// A handle and the file's inode number.
    Fd(u64, u64),
    Data(Vec<u8>),
    Count(u64),
    Stat(WireStat),
    /// A symbolic link's target.
    Link(String),
    /// Text for a person (`Qos`).
    Text(String),
    Statfs(sluice_proto::WireStatfs),
    Dir(Vec<DirEntry>, bool),
    Stats(Vec<AppStats>),
    /// The handshake's key challenge: a fresh nonce.
    Challenge([u8; sluice_proto::AUTH_BYTES]),
    /// A cache lease: offset, bytes, microseconds, descriptor attached.
    Lease(u64, u64, u32, bool),
    Error(i32, String),
}

/// The wire form of a reply (a `Data` payload is borrowed, not copied).
pub fn response(out: &Out) -> Response<'_> {
    match out {
        Out::HelloOk(h) => Response::HelloOk(*h),
        Out::Ok => Response::Ok,
        Out::Fd(fd, ino) => Response::Fd(*fd, *ino),
        Out::Data(d) => Response::Data(d),
        Out::Count(n) => Response::Count(*n),
        Out::Stat(s) => Response::Stat(*s),
        Out::Link(t) => Response::Link(t.clone()),
        Out::Text(t) => Response::Text(t.clone()),
        Out::Statfs(f) => Response::Statfs(*f),
        Out::Dir(e, done) => Response::Dir { entries: e.clone(), done: *done },
        Out::Stats(a) => Response::Stats(a.clone()),
        Out::Challenge(nonce) => Response::Challenge { nonce: *nonce },
        Out::Lease(offset, len, valid_us, lent) => Response::Lease { offset: *offset, len: *len, valid_us: *valid_us, lent: *lent },
        Out::Error(errno, m) => Response::Error { errno: *errno, message: m },
    }
}

/// An answered read or write message, on its way to connection `conn`.
pub struct Delivery {
    pub conn: u64,
    pub wire_id: u64,
    pub out: Out,
    /// Bytes the message took from its connection's `reply_bytes_max` at
    /// admission.
    pub reserved: u64,
    /// The region's post record the answer goes to when it is a `Count`
    /// (`Shm::post`); otherwise the frame goes out and the record says so.
    pub post: Option<(Arc<Shm>, u32)>,
    /// A `Lease` answer for this file handle of the connection: the loop
    /// lends the handle's descriptor with it if it has not yet.
    pub lend: Option<u64>,
}

/// A request's data.
pub enum Buf {
    /// Read destination, sized to the request; truncated to what was read.
    Read(Vec<u8>),
    /// Write source: `body[at..at + len]`, shared by a list's pieces.
    Write(Arc<Vec<u8>>, usize, usize),
    /// The connection's shared region at `[at, at + len)`: a read's
    /// destination (`.3` false) or a write's source (`.3` true).
    Shm(Arc<Shm>, usize, usize, bool),
}

impl Buf {
    /// The bytes a write sends (empty for a read).
    pub fn data(&self) -> &[u8] {
        match self {
            Buf::Write(body, at, len) => &body[*at..*at + *len],
            Buf::Shm(shm, at, len, true) => shm.bytes(*at, *len),
            Buf::Read(_) | Buf::Shm(..) => &[],
        }
    }

    /// The buffer a read fills (empty for a write).
    pub fn read_buf(&mut self) -> &mut [u8] {
        match self {
            Buf::Read(b) => b,
            Buf::Shm(shm, at, len, false) => shm.bytes_mut(*at, *len),
            Buf::Write(..) | Buf::Shm(..) => &mut [],
        }
    }
}

/// A list I/O message whose pieces are scheduled separately.
pub struct ListState {
    pub conn: u64,
    pub wire_id: u64,
    /// Answered with a byte count (writes, shared-memory reads), not data.
    pub counts: bool,
    /// Bytes taken at admission: the pieces' total and the reply frame.
    pub reserved: u64,
    /// The post record to answer in (`Delivery::post`).
    pub post: Option<(Arc<Shm>, u32)>,
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
    /// Settle one piece (`pos`: where its bytes go in `data`); the reply
    /// once it was the last.
    pub fn settle(&self, pos: usize, piece: Option<&[u8]>, result: Result<u64, (i32, String)>) -> Option<Delivery> {
        let mut g = lock(&self.inner);
        match result {
            Ok(n) => g.bytes += n,
            Err(e) => g.error = g.error.take().or(Some(e)),
        }
        if let Some(p) = piece {
            g.data[pos..pos + p.len()].copy_from_slice(p);
        }
        g.remaining -= 1;
        (g.remaining == 0).then(|| self.reply_now(&mut g))
    }

    /// The reply (all pieces settled, or none could be admitted).
    pub fn reply_now(&self, g: &mut ListInner) -> Delivery {
        let out = match g.error.take() {
            Some((errno, msg)) => Out::Error(errno, msg),
            None if self.counts => Out::Count(g.bytes),
            None => Out::Data(std::mem::take(&mut g.data)),
        };
        Delivery { conn: self.conn, wire_id: self.wire_id, out, reserved: self.reserved, post: self.post.clone(), lend: None }
    }
}

/// How a request's outcome is answered.
pub enum Reply {
    /// The connection, the wire id, the bytes taken at admission, and the
    /// post record to answer in.
    Single(u64, u64, u64, Option<(Arc<Shm>, u32)>),
    Piece(Arc<ListState>, usize),
}

/// A read that asked for a cache lease (`ReadLease`) of a range not in
/// the page cache: scheduled as any read, but when its whole dispatch is
/// such reads the dispatch only brings the range into the page cache
/// (`exec::populate`) and each is answered with a lease, so the client
/// copies the data once, from the page cache, as a plain `pread` would,
/// instead of twice through its shared region.
#[derive(Clone, Copy, Debug)]
pub struct LeaseAfter {
    /// The connection's handle of the file (the descriptor to lend).
    pub handle: u64,
    pub valid_us: u32,
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
    /// A lease to answer with once the range is in the page cache.
    pub lease_after: Option<LeaseAfter>,
    /// Set when its dispatch brought the range into the page cache and
    /// moved no data (`exec::populate`): answered with `lease_after`.
    pub populated: bool,
}

fn errno_message(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

impl Pending {
    /// This request's outcome (or a piece's share of it), as a reply when
    /// it completes its message.
    pub fn answer(self) -> Option<Delivery> {
        let result = self.result.map_err(|e| (e, errno_message(e)));
        self.answer_with(result)
    }

    /// Answer with an explicit outcome (used when admission failed).
    pub fn answer_with(self, result: Result<u64, (i32, String)>) -> Option<Delivery> {
        match self.reply {
            Reply::Single(conn, wire_id, reserved, post) => {
                let lease = self.lease_after.filter(|_| self.populated);
                let out = match (result, self.buf, lease) {
                    (Err((errno, msg)), ..) => Out::Error(errno, msg),
                    // In the page cache now: read it yourself (a read that
                    // crosses the end of the file reads short there too).
                    (Ok(_), _, Some(l)) => Out::Lease(self.req.offset, self.req.len, l.valid_us, false),
                    (Ok(_), Buf::Read(b), None) => Out::Data(b),
                    (Ok(n), Buf::Write(..) | Buf::Shm(..), None) => Out::Count(n),
                };
                Some(Delivery { conn, wire_id, out, reserved, post, lend: lease.map(|l| l.handle) })
            }
            Reply::Piece(list, pos) => {
                let piece = match &self.buf {
                    Buf::Read(b) if result.is_ok() => Some(b.as_slice()),
                    _ => None,
                };
                list.settle(pos, piece, result)
            }
        }
    }
}
