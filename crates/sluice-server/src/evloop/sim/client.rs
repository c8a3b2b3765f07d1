//! The simulated clients of `sim`: each speaks the protocol on a real
//! Unix socket, sends its frames torn, and checks every answer against
//! what it sent and what the writes acknowledged left in its range.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use sluice_proto::{check_header, encode_request, parse_response, Request, Response, HEADER_BYTES};

/// Bytes of the file each client writes and reads: its own range.
pub const REGION: u64 = 64 << 10;

/// A small, seeded generator (splitmix64).
#[derive(Clone, Copy)]
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// True `per_mille` times in 1,000.
    pub(super) fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1_000) < per_mille
    }
}

/// What a client sent, by request id.
#[derive(Clone)]
pub(super) enum Sent {
    Hello,
    Open,
    /// A write of `len` bytes at `offset`, each byte `fill(offset + i)`.
    Write {
        offset: u64,
        len: u64,
        salt: u8,
    },
    /// A read, and what each byte must be (`None`: not known).
    Read {
        offset: u64,
        want: Vec<Option<u8>>,
    },
}

impl std::fmt::Debug for Sent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sent::Hello => write!(f, "hello"),
            Sent::Open => write!(f, "open"),
            Sent::Write { offset, len, .. } => write!(f, "write of {len} at {offset}"),
            Sent::Read { offset, want } => write!(f, "read of {} at {offset}", want.len()),
        }
    }
}

/// The byte a write with `salt` puts at `at`.
pub(super) fn fill(salt: u8, at: u64) -> u8 {
    salt.wrapping_add((at % 251) as u8)
}

/// One simulated client.
pub(super) struct Client {
    pub(super) id: u32,
    pub(super) stream: Option<UnixStream>,
    /// Bytes still to send, and bytes sent so far.
    pub(super) out: Vec<u8>,
    pub(super) sent_bytes: usize,
    pub(super) inbuf: Vec<u8>,
    pub(super) next_id: u64,
    pub(super) sent: BTreeMap<u64, Sent>,
    pub(super) answered: HashMap<u64, u32>,
    pub(super) fd: Option<u64>,
    pub(super) ops_left: u32,
    pub(super) depth: u32,
    /// The bytes of its range as the acknowledged writes left them.
    pub(super) known: Vec<Option<u8>>,
    /// Writes sent and not yet answered: (offset, len).
    pub(super) writing: Vec<(u64, u64)>,
    /// Stops sending at this many bytes into its next frame, for ever.
    pub(super) stall_at: Option<usize>,
    /// Dropped by the test at this turn.
    pub(super) kill_at: Option<usize>,
    /// Read replies only after this turn (a client that does not read).
    pub(super) deaf_until: usize,
    /// The server closed the connection (or the test killed it).
    pub(super) gone: bool,
    /// Answers of each errno seen, for the coverage figures.
    pub(super) errors: BTreeMap<i32, u32>,
}

impl Client {
    pub(super) fn base(&self) -> u64 {
        u64::from(self.id) * REGION
    }

    pub(super) fn send(&mut self, req: &Request<'_>, what: Sent) {
        let id = self.next_id;
        self.next_id += 1;
        encode_request(id, req, &mut self.out).expect("a request the protocol can carry");
        self.sent.insert(id, what);
    }

    pub(super) fn outstanding(&self) -> usize {
        self.sent.keys().filter(|id| !self.answered.contains_key(id)).count()
    }
}

impl Client {
    /// Its next message, if it may send one: open its file once the
    /// handshake is answered, then reads and writes of its range, at most
    /// `depth` outstanding.
    pub(super) fn issue(&mut self, rng: &mut Rng) {
        let hello_done = self.answered.contains_key(&1);
        if !hello_done || self.outstanding() >= self.depth as usize {
            return;
        }
        let Some(fd) = self.fd else {
            if self.sent.len() == 1 {
                let path = format!("f{}", self.id % 2);
                self.send(&Request::Open { path: &path, flags: libc::O_CREAT | libc::O_RDWR, mode: 0o644 }, Sent::Open);
            }
            return;
        };
        if self.ops_left == 0 {
            return;
        }
        let len = 1 + rng.below(16 << 10);
        let offset = self.base() + rng.below(REGION - len);
        let overlaps = |&(o, l): &(u64, u64)| o < offset + len && offset < o + l;
        if rng.chance(500) {
            // Never over a write still outstanding: the order of two
            // overlapping writes is the server's, which the test does not
            // guess.
            if self.writing.iter().any(overlaps) {
                return;
            }
            let salt = rng.below(256) as u8;
            let data: Vec<u8> = (offset..offset + len).map(|at| fill(salt, at)).collect();
            self.send(&Request::Write { fd, offset, data: &data }, Sent::Write { offset, len, salt });
            self.writing.push((offset, len));
        } else {
            let from = (offset - self.base()) as usize;
            let mut want = self.known[from..from + len as usize].to_vec();
            for &(o, l) in &self.writing {
                for at in o.max(offset)..(o + l).min(offset + len) {
                    want[(at - offset) as usize] = None;
                }
            }
            self.send(&Request::Read { fd, offset, len: len as u32 }, Sent::Read { offset, want });
        }
        self.ops_left -= 1;
    }

    /// Send a torn piece of what it has to send (none past its stall).
    pub(super) fn write_some(&mut self, rng: &mut Rng) {
        let Some(stream) = self.stream.as_mut() else { return };
        let room = self.stall_at.map_or(usize::MAX, |at| at.saturating_sub(self.sent_bytes));
        let piece = [1, 7, 64, 4096, usize::MAX][rng.below(5) as usize].min(self.out.len()).min(room);
        if piece == 0 {
            return;
        }
        match stream.write(&self.out[..piece]) {
            Ok(n) => {
                self.out.drain(..n);
                self.sent_bytes += n;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => self.gone = true,
        }
    }

    /// Read what the server sent; the replies whole so far, decoded.
    pub(super) fn read_replies(&mut self, out: &mut Vec<(u64, Result<Reply, String>)>) {
        let Some(stream) = self.stream.as_mut() else { return };
        let mut buf = [0u8; 64 << 10];
        loop {
            match stream.read(&mut buf) {
                Ok(0) => {
                    self.gone = true;
                    break;
                }
                Ok(n) => self.inbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.gone = true;
                    break;
                }
            }
        }
        loop {
            let h = match check_header(&self.inbuf, u32::MAX) {
                Ok(Some(h)) => h,
                Ok(None) => return,
                Err(e) => return out.push((0, Err(format!("client {}: a malformed reply header: {e}", self.id)))),
            };
            let end = HEADER_BYTES + h.body_len as usize;
            if self.inbuf.len() < end {
                return;
            }
            let reply = parse_response(&h, &self.inbuf[HEADER_BYTES..end]).map(Reply::from).map_err(|e| format!("client {}: a malformed reply: {e}", self.id));
            out.push((h.request_id, reply));
            self.inbuf.drain(..end);
        }
    }
}

/// A reply, owned.
pub(super) enum Reply {
    HelloOk,
    Fd(u64),
    Data(Vec<u8>),
    Count(u64),
    Error(i32),
    Other(String),
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reply::HelloOk => write!(f, "HelloOk"),
            Reply::Fd(fd) => write!(f, "Fd({fd})"),
            Reply::Data(d) => write!(f, "Data({} bytes)", d.len()),
            Reply::Count(n) => write!(f, "Count({n})"),
            Reply::Error(e) => write!(f, "Error({e})"),
            Reply::Other(o) => write!(f, "{o}"),
        }
    }
}

impl From<Response<'_>> for Reply {
    fn from(r: Response<'_>) -> Reply {
        match r {
            Response::HelloOk(_) => Reply::HelloOk,
            Response::Fd(fd, _) => Reply::Fd(fd),
            Response::Data(d) => Reply::Data(d.to_vec()),
            Response::Count(n) => Reply::Count(n),
            Response::Error { errno, .. } => Reply::Error(errno),
            other => Reply::Other(format!("{other:?}")),
        }
    }
}

impl Client {
    /// Take reply `id`: each message answered once, as its kind asks.
    pub(super) fn take(&mut self, id: u64, reply: Reply, faults: bool, bad: &mut Vec<String>) {
        let who = self.id;
        if let Reply::Error(e) = reply {
            *self.errors.entry(e).or_insert(0) += 1;
        }
        if let (Reply::Error(libc::ETIMEDOUT), true) = (&reply, self.stalled()) {
            // Its frame (or handshake) stalled, and the server gave up on
            // it: nothing of it was taken in. A header never completed is
            // answered as request 0.
            if id != 0 {
                *self.answered.entry(id).or_insert(0) += 1;
            }
            return;
        }
        let Some(what) = self.sent.get(&id).cloned() else {
            return bad.push(format!("client {who}: an answer ({reply:?}) to request {id}, never sent"));
        };
        let n = self.answered.entry(id).or_insert(0);
        *n += 1;
        if *n > 1 {
            return bad.push(format!("client {who}: request {id} ({what:?}) answered {n} times"));
        }
        let base = self.base();
        match (what, reply) {
            (Sent::Hello, Reply::HelloOk) => {}
            (Sent::Open, Reply::Fd(fd)) => self.fd = Some(fd),
            (Sent::Write { offset, len, salt }, r) => {
                self.writing.retain(|&w| w != (offset, len));
                let done = match r {
                    Reply::Count(c) if c == len => len,
                    // Refused at admission (too many in flight on the
                    // connection, or the scheduler's queue full): nothing
                    // was written.
                    Reply::Error(libc::EAGAIN) => return,
                    Reply::Error(libc::EIO) if faults => 0,
                    r => {
                        bad.push(format!("client {who}: write of {len} at {offset}: {r:?}"));
                        0
                    }
                };
                for at in offset..offset + len {
                    self.known[(at - base) as usize] = (at < offset + done).then(|| fill(salt, at));
                }
            }
            (Sent::Read { offset, want }, Reply::Data(d)) => {
                if d.len() > want.len() {
                    bad.push(format!("client {who}: read of {} at {offset} gave {}", want.len(), d.len()));
                }
                for (i, w) in want.iter().enumerate() {
                    match (w, d.get(i)) {
                        (Some(w), Some(g)) if w != g => return bad.push(format!("client {who}: read at {offset}: byte {i} is {g}, acknowledged {w}")),
                        (Some(_), None) => return bad.push(format!("client {who}: read at {offset}: short ({} of {}) over acknowledged bytes", d.len(), want.len())),
                        _ => {}
                    }
                }
            }
            (Sent::Read { .. }, Reply::Error(libc::EIO)) if faults => {}
            (Sent::Read { .. }, Reply::Error(libc::EAGAIN)) => {}
            (what, r) => bad.push(format!("client {who}: {what:?} answered {r:?}")),
        }
    }

    /// Whether it stopped part way through a frame.
    pub(super) fn stalled(&self) -> bool {
        self.stall_at.is_some_and(|at| self.sent_bytes >= at) && !self.out.is_empty()
    }

    /// Whether it has nothing more to do.
    pub(super) fn finished(&self) -> bool {
        self.gone || (self.ops_left == 0 && self.out.is_empty() && self.outstanding() == 0 && self.fd.is_some())
    }
}
