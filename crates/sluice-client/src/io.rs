//! Handles, reads and writes: open and close, the submit/wait pairs that
//! keep several requests in flight, and the blocking `pread`/`pwrite`
//! built on them (leased where a lease covers the range).

use super::*;

impl Client {
    /// Open `path` (relative to the server root) with `open(2)` flags. The
    /// handle survives server restarts (reopened by path).
    pub fn open(&self, path: &str, flags: i32, mode: u32) -> Result<Fd> {
        // Not retried: a create may have happened before the break.
        let (server, gen, ino) = self.with_session(flags & REOPEN_FLAGS_DROPPED == 0, |s| match s.conn.call(&Request::Open { path, flags, mode })? {
            Reply::Fd(fd, ino) => Ok((fd, s.gen, ino)),
            r => Err(unexpected("open", &r)),
        })?;
        let fd = self.fd_next.fetch_add(1, Ordering::Relaxed);
        let pos = Position { at: 0, append: flags & libc::O_APPEND != 0 };
        let h = Handle { server, gen, path: path.to_string(), flags, ino, pos, dead: None, lent: None, lease: None, leases_off: false, ahead: None, read_end: 0 };
        lock(&self.handles).insert(fd, h);
        Ok(Fd(fd))
    }

    /// The inode number of `fd`'s file as the server opened it.
    pub fn ino(&self, fd: Fd) -> Result<u64> {
        lock(&self.handles).get(&fd.0).map(|h| h.ino).ok_or_else(|| bad_handle(fd))
    }

    pub fn close(&self, fd: Fd) -> Result<()> {
        let mut h = lock(&self.handles).remove(&fd.0).ok_or_else(|| bad_handle(fd))?;
        if let Some((_, t)) = h.ahead.take() {
            // Answered before the close, so its slot is free again.
            let _ = self.wait_discard(t);
        }
        if h.dead.is_some() {
            return Ok(());
        }
        let s = self.current();
        if s.gen != h.gen {
            return Ok(()); // Its server handle died with its connection.
        }
        match s.conn.call(&Request::Close { fd: h.server }) {
            Ok(_) => Ok(()),
            // The connection broke: the server closed it with the rest.
            Err(e) if e.kind == ClientErrorKind::Disconnected => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Start a read of `len` bytes at `offset` (at most the server's
    /// `io_bytes_max`); finish it with [`Client::wait_read`].
    pub fn submit_read(&self, fd: Fd, len: usize, offset: u64) -> Result<Ticket> {
        self.on_fd(fd, true, |s, server| {
            if len > s.io_bytes_max {
                return Err(ClientError::invalid(format!("read of {len} bytes exceeds io_bytes_max ({})", s.io_bytes_max)));
            }
            let (local, lease_ok) = self.leased(fd, s.gen, offset, len, false);
            if local.is_some() {
                return Ok(Ticket { id: 0, session: Arc::clone(s), read: Some((fd, len, offset)), slot: None, local, done: None });
            }
            let slot = s.shm.as_ref().and_then(|r| r.take(len));
            let req = match &slot {
                Some(sl) if lease_ok => Request::ReadLease { fd: server, offset, len: len as u32, at: sl.at(), post: sl.arm() },
                Some(sl) => Request::ReadShm { fd: server, offset, len: len as u32, at: sl.at(), post: sl.arm() },
                None => Request::Read { fd: server, offset, len: len as u32 },
            };
            self.note_send();
            let id = send_in(s, &req, slot.as_ref())?;
            // The session the request went out on, exactly: ids restart
            // with each connection.
            Ok(Ticket { id, session: Arc::clone(s), read: Some((fd, len, offset)), slot, local: None, done: None })
        })
    }

    /// Bytes read into `buf` (fewer than asked at end of file). A read
    /// whose connection broke is sent again on the next one.
    pub fn wait_read(&self, mut t: Ticket, buf: &mut [u8]) -> Result<usize> {
        let want = t.read.map_or(buf.len(), |r| r.1.min(buf.len()));
        if let (Some(file), Some((_, _, offset))) = (t.local.take(), t.read) {
            return local_pread(&file, &mut buf[..want], offset);
        }
        let slot = t.slot.take();
        let r = t.session.conn.answer(t.id, slot.as_ref(), if slot.is_some() { None } else { Some(&mut *buf) });
        // Answered (data or error): the slot is done with; the server
        // wrote the data into it before answering.
        let r = match (slot, r) {
            (Some(sl), Ok(Reply::Count(n))) => {
                sl.drain_into(buf, n as usize);
                sl.release();
                Ok(Reply::DataInto((n as usize).min(buf.len())))
            }
            (Some(sl), Ok(Reply::Lease(start, len, valid, lent))) => {
                sl.release();
                let (fd, _, offset) = t.read.expect("a read ticket");
                match self.keep_lease(fd, t.session.gen, start, len, valid, lent) {
                    Some(file) => return local_pread(&file, &mut buf[..want], offset),
                    // Rare (threads racing on a handle's first lease): ask
                    // again without a lease.
                    None => return self.read_socket(fd, &mut buf[..want], offset),
                }
            }
            // Any other answer: the server is done with the slot too.
            (Some(sl), r @ (Ok(_) | Err(ClientError { kind: ClientErrorKind::Server, .. }))) => {
                sl.release();
                r
            }
            // Given up unanswered: the slot is freed once answered.
            (Some(sl), r @ Err(ClientError { kind: ClientErrorKind::Interrupted, .. })) => {
                sl.abandon(t.id);
                r
            }
            (_, r) => r,
        };
        match r {
            Err(e) if e.kind == ClientErrorKind::Disconnected && self.opts.recovery.reconnects() => {
                self.recover(&t.session)?;
                let Some((fd, _, offset)) = t.read else { return Err(e) };
                self.read_socket(fd, &mut buf[..want], offset)
            }
            r => data_into("read", r?, buf),
        }
    }

    /// A plain `Read` of `buf.len()` bytes at `offset`, its data through
    /// the socket (retried after a break).
    pub(crate) fn read_socket(&self, fd: Fd, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.on_fd(fd, true, |s, server| {
            let id = s.conn.send(&Request::Read { fd: server, offset, len: buf.len() as u32 })?;
            data_into("read", s.conn.wait(id, Some(buf))?, buf)
        })
    }

    /// Start a write; finish it with [`Client::wait_write`]. Under a write
    /// lease (`write_leased`) it is done here, and the ticket only says so.
    pub fn submit_write(&self, fd: Fd, data: &[u8], offset: u64) -> Result<Ticket> {
        writable_range(offset, data.len())?;
        let s = self.current();
        if data.len() > s.io_bytes_max {
            return Err(ClientError::invalid(format!("write of {} bytes exceeds io_bytes_max ({})", data.len(), s.io_bytes_max)));
        }
        if let Some(n) = self.write_leased(fd, data, offset)? {
            return Ok(Ticket { id: 0, session: self.current(), read: None, slot: None, local: None, done: Some(n) });
        }
        self.on_fd(fd, false, |s, server| {
            // A small write rides the socket with its header, unless the
            // region rings its requests (then it costs no send at all).
            let small = data.len() < shm::WRITE_MIN_BYTES && !s.shm.as_ref().is_some_and(|r| r.rings());
            let slot = if small { None } else { s.shm.as_ref().and_then(|r| r.take(data.len())) };
            let req = match &slot {
                Some(sl) => {
                    sl.fill(data);
                    Request::WriteShm { fd: server, offset, len: data.len() as u32, at: sl.at(), post: sl.arm() }
                }
                None => Request::Write { fd: server, offset, data },
            };
            self.note_send();
            let id = send_in(s, &req, slot.as_ref())?;
            Ok(Ticket { id, session: Arc::clone(s), read: None, slot, local: None, done: None })
        })
    }

    /// Bytes written; acknowledged only after the server's system call
    /// returned. A write whose connection broke fails with EIO (it may or
    /// may not have reached the disk) and is never sent twice.
    pub fn wait_write(&self, mut t: Ticket) -> Result<usize> {
        if let Some(n) = t.done {
            return Ok(n);
        }
        let r = t.session.conn.answer(t.id, t.slot.as_ref(), None);
        match (t.slot.take(), &r) {
            (Some(sl), Ok(_) | Err(ClientError { kind: ClientErrorKind::Server, .. })) => sl.release(),
            // Given up unanswered: the slot is freed once answered.
            (Some(sl), Err(ClientError { kind: ClientErrorKind::Interrupted, .. })) => sl.abandon(t.id),
            _ => {}
        }
        self.written("write", &t.session, r)
    }

    /// The count a write's answer carries. A write whose connection broke
    /// is not sent again (it may have been carried out): the session
    /// reconnects for later calls and the write fails.
    pub(crate) fn written(&self, what: &str, session: &Session, r: Result<Reply>) -> Result<usize> {
        match r {
            Ok(Reply::Count(n)) => Ok(n as usize),
            Ok(r) => Err(unexpected(what, &r)),
            Err(e) => {
                if e.kind == ClientErrorKind::Disconnected {
                    self.recover(session)?;
                }
                Err(e)
            }
        }
    }

    pub(crate) fn io_bytes_max(&self) -> usize {
        self.current().io_bytes_max.max(1)
    }

    /// Read up to `buf.len()` bytes at `offset`; large reads are split (at
    /// the shared region's slot size, else at `io_bytes_max`) and
    /// pipelined. Inside a live cache lease, one local `pread`.
    pub fn pread(&self, fd: Fd, buf: &mut [u8], offset: u64) -> Result<usize> {
        if let Some(r) = self.pread_leased(fd, buf, offset) {
            self.lease_ahead(fd, offset, buf.len());
            return r;
        }
        match self.take_ahead(fd, offset, buf.len()) {
            Some(Ok(t)) => {
                if let Some(r) = self.wait_ahead(t, buf) {
                    return r;
                }
            }
            Some(Err(t)) => {
                let _ = self.wait_discard(t);
            }
            None => {}
        }
        // With a shared region, pieces of a slot each: every piece can
        // travel through the region or be answered with a lease.
        let chunk = if self.current().shm.is_some() { shm::SLOT_BYTES } else { self.io_bytes_max() };
        let mut tickets: Vec<(usize, Ticket)> = Vec::new();
        for at in (0..buf.len()).step_by(chunk) {
            match self.submit_read(fd, chunk.min(buf.len() - at), offset + at as u64) {
                Ok(t) => tickets.push((at, t)),
                Err(e) => {
                    // Those already sent are waited on (each holds its
                    // slot until answered), then the failure is told.
                    for (_, t) in tickets {
                        let _ = self.wait_discard(t);
                    }
                    return Err(e);
                }
            }
        }
        let mut total = 0;
        let mut short = false;
        let mut failed = None;
        // Every ticket is waited on, even after a failure: each holds its
        // slot of the shared region until answered.
        for (at, t) in tickets {
            let end = (at + chunk).min(buf.len());
            match self.wait_read(t, &mut buf[at..end]) {
                Ok(n) if !short => {
                    total += n;
                    short = n < end - at;
                }
                Ok(_) => {}
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        failed.map_or(Ok(total), Err)
    }

    /// Write all of `data` at `offset`; large writes are split and pipelined.
    /// Under a write lease (held, or asked for by the first piece:
    /// `submit_write`), each piece is a local `pwrite`.
    pub fn pwrite(&self, fd: Fd, data: &[u8], offset: u64) -> Result<usize> {
        writable_range(offset, data.len())?;
        self.pwrite_chunks(fd, data, offset)
    }

    /// `pwrite` through the server: `io_bytes_max` pieces, pipelined.
    pub(crate) fn pwrite_chunks(&self, fd: Fd, data: &[u8], offset: u64) -> Result<usize> {
        let chunk = self.io_bytes_max();
        let mut tickets: Vec<Ticket> = Vec::new();
        for (i, c) in data.chunks(chunk).enumerate() {
            match self.submit_write(fd, c, offset + (i * chunk) as u64) {
                Ok(t) => tickets.push(t),
                Err(e) => {
                    // As in `pread`: the writes already sent are waited on.
                    for t in tickets {
                        let _ = self.wait_write(t);
                    }
                    return Err(e);
                }
            }
        }
        // Every ticket is waited on, even after a failure (see `pread`).
        let results: Vec<Result<usize>> = tickets.into_iter().map(|t| self.wait_write(t)).collect();
        results.into_iter().sum()
    }
}
