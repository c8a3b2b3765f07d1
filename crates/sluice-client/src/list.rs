//! List I/O: one message for many pieces of a file (MPI-IO views,
//! collective array I/O), blocking or submitted, optionally tagged with a
//! server-directed group; leased pieces are moved locally.

use super::*;

impl Client {
    /// SFIO's mread: read every `(offset, len)` piece, back to back, into
    /// `buf` with one message. Bytes past end of file read as zeros. The
    /// leading pieces that cache leases cover are read through the lent
    /// descriptor instead (as `write_list` does with write leases).
    pub fn read_list(&self, fd: Fd, pieces: &[(u64, u64)], buf: &mut [u8]) -> Result<usize> {
        self.read_list_in(fd, pieces, buf, None)
    }

    /// SFIO's mwrite: `data` holds the pieces back to back.
    pub fn write_list(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8]) -> Result<usize> {
        self.write_list_in(fd, pieces, data, None)
    }

    /// Start a list read ([`Client::read_list`]); finish it with
    /// [`Client::wait_read_list`]. One thread may keep several in flight,
    /// on one server or many (the striped client does).
    pub fn submit_read_list(&self, fd: Fd, pieces: &[(u64, u64)]) -> Result<ListTicket> {
        self.submit_read_list_in(fd, pieces, None)
    }

    /// [`Client::submit_read_list`] as one participant of a
    /// server-directed collective ([`Client::read_list_group`]).
    pub fn submit_read_list_group(&self, fd: Fd, pieces: &[(u64, u64)], group: Group) -> Result<ListTicket> {
        self.submit_read_list_in(fd, pieces, Some(group))
    }

    pub(crate) fn submit_read_list_in(&self, fd: Fd, pieces: &[(u64, u64)], group: Option<Group>) -> Result<ListTicket> {
        self.on_fd(fd, group.is_none(), |s, server| {
            let id = s.conn.send(&Request::ReadList { fd: server, pieces: pieces.to_vec(), group })?;
            let again = group.is_none().then(|| pieces.to_vec());
            Ok(ListTicket { id, session: Arc::clone(s), fd, pieces: again })
        })
    }

    /// The bytes of a submitted list read, back to back in `buf`. A read
    /// whose connection broke is sent again on the next one.
    pub fn wait_read_list(&self, t: ListTicket, buf: &mut [u8]) -> Result<usize> {
        match t.session.conn.wait(t.id, Some(&mut *buf)) {
            Err(e) if e.kind == ClientErrorKind::Disconnected && self.opts.recovery.reconnects() => {
                self.recover(&t.session)?;
                match t.pieces {
                    Some(pieces) => self.read_list(t.fd, &pieces, buf),
                    None => Err(e),
                }
            }
            r => data_into("read list", r?, buf),
        }
    }

    /// Start an `fstat`; finish it with [`Client::wait_fstat`] (so one
    /// thread can ask every object of a striped file at once).
    pub fn submit_fstat(&self, fd: Fd) -> Result<ListTicket> {
        self.on_fd(fd, true, |s, server| {
            let id = s.conn.send(&Request::Fstat { fd: server })?;
            Ok(ListTicket { id, session: Arc::clone(s), fd, pieces: None })
        })
    }

    /// The answer of a submitted `fstat` (asked again on a new connection
    /// if this one broke).
    pub fn wait_fstat(&self, t: ListTicket) -> Result<Stat> {
        match t.session.conn.wait(t.id, None) {
            Ok(Reply::Stat(st)) => Ok(st),
            Ok(r) => Err(unexpected("fstat", &r)),
            Err(e) if e.kind == ClientErrorKind::Disconnected && self.opts.recovery.reconnects() => {
                self.recover(&t.session)?;
                self.fstat(t.fd)
            }
            Err(e) => Err(e),
        }
    }

    /// Start a list write ([`Client::write_list`]); finish it with
    /// [`Client::wait_write_list`].
    pub fn submit_write_list(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8]) -> Result<ListTicket> {
        self.submit_write_list_in(fd, pieces, data, None)
    }

    /// [`Client::submit_write_list`] as one participant of a
    /// server-directed collective ([`Client::write_list_group`]).
    pub fn submit_write_list_group(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8], group: Group) -> Result<ListTicket> {
        self.submit_write_list_in(fd, pieces, data, Some(group))
    }

    pub(crate) fn submit_write_list_in(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8], group: Option<Group>) -> Result<ListTicket> {
        self.on_fd(fd, false, |s, server| {
            let id = s.conn.send(&Request::WriteList { fd: server, pieces: pieces.to_vec(), data, group })?;
            Ok(ListTicket { id, session: Arc::clone(s), fd, pieces: None })
        })
    }

    /// The bytes a submitted list write wrote. A write whose connection
    /// broke is not sent again (it may have been carried out): EIO.
    pub fn wait_write_list(&self, t: ListTicket) -> Result<usize> {
        self.written("write list", &t.session, t.session.conn.wait(t.id, None))
    }

    /// `read_list` as one participant of a server-directed collective: the
    /// server holds it until all `group.participants` messages of
    /// `group.id` on this file have come, then serves them together in
    /// disk order. ETIMEDOUT if they do not all come within the wait.
    pub fn read_list_group(&self, fd: Fd, pieces: &[(u64, u64)], buf: &mut [u8], group: Group) -> Result<usize> {
        self.read_list_in(fd, pieces, buf, Some(group))
    }

    /// `write_list` as one participant of a server-directed collective;
    /// nothing of the group is written unless all participants come.
    pub fn write_list_group(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8], group: Group) -> Result<usize> {
        self.write_list_in(fd, pieces, data, Some(group))
    }

    pub(crate) fn read_list_in(&self, fd: Fd, pieces: &[(u64, u64)], buf: &mut [u8], group: Option<Group>) -> Result<usize> {
        let total: u64 = pieces.iter().map(|p| p.1).sum();
        if total > buf.len() as u64 {
            return Err(ClientError::invalid(format!("buffer of {} bytes cannot hold {total} bytes of pieces", buf.len())));
        }
        let (done, rest) = if group.is_none() { self.read_list_leased(fd, pieces, buf)? } else { (0, 0) };
        if rest == pieces.len() {
            return Ok(done);
        }
        let (pieces, buf) = (&pieces[rest..], &mut buf[done..]);
        // A collective's read is not sent again after a break: it would
        // count twice in its group.
        self.on_fd(fd, group.is_none(), |s, server| {
            let id = s.conn.send(&Request::ReadList { fd: server, pieces: pieces.to_vec(), group })?;
            let r = s.conn.wait(id, Some(&mut *buf))?;
            data_into("read list", r, buf)
        })
        .map(|n| done + n)
    }

    /// The leading pieces of a list read that cache leases cover, read
    /// through the lent descriptor: each inside a live lease locally, else
    /// (one that fits a slot) with `pread`, whose answer brings a lease for
    /// those after it when their range is cached. Such a try follows only
    /// the call's start or a piece read under a lease: where the data is
    /// not cached, the rest go as one list message, not one request a
    /// piece. Bytes past end of file read as zeros, as the list message's
    /// do. `(bytes of buf filled, pieces done)`.
    pub(crate) fn read_list_leased(&self, fd: Fd, pieces: &[(u64, u64)], buf: &mut [u8]) -> Result<(usize, usize)> {
        let s = self.current();
        let (mut at, mut may_ask) = (0usize, true);
        for (i, &(offset, len)) in pieces.iter().enumerate() {
            let Some(part) = buf.get_mut(at..at.saturating_add(len as usize)) else { return Ok((at, i)) };
            let n = match self.leased(fd, s.gen, offset, part.len(), false) {
                (Some(file), _) => {
                    may_ask = true;
                    local_pread(&file, part, offset)?
                }
                (None, true) if may_ask && s.shm.is_some() && part.len() <= shm::SLOT_BYTES => {
                    may_ask = false;
                    self.pread(fd, part, offset)?
                }
                _ => return Ok((at, i)),
            };
            part[n..].fill(0);
            at += part.len();
        }
        Ok((at, pieces.len()))
    }

    pub(crate) fn write_list_in(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8], group: Option<Group>) -> Result<usize> {
        let (done, at, rest) = if group.is_none() { self.write_list_leased(fd, pieces, data)? } else { (0, 0, 0) };
        if rest == pieces.len() {
            return Ok(done);
        }
        let (pieces, data) = (&pieces[rest..], &data[at..]);
        let req = |server| Request::WriteList { fd: server, pieces: pieces.to_vec(), data, group };
        match self.on_fd(fd, false, |s, server| s.conn.call(&req(server)))? {
            Reply::Count(n) => Ok(done + n as usize),
            r => Err(unexpected("write list", &r)),
        }
    }

    /// The leading pieces of a list write that write leases cover, written
    /// through the lent descriptor (`write_leased`: the first asks for the
    /// lease, which covers the whole file). `(bytes written, bytes of data
    /// used, pieces done)`; the rest go as one list message.
    pub(crate) fn write_list_leased(&self, fd: Fd, pieces: &[(u64, u64)], data: &[u8]) -> Result<(usize, usize, usize)> {
        let (mut done, mut at) = (0usize, 0usize);
        for (i, &(offset, len)) in pieces.iter().enumerate() {
            let Some(part) = data.get(at..at.saturating_add(len as usize)) else { return Ok((done, at, i)) };
            match self.write_leased(fd, part, offset)? {
                Some(n) => done += n,
                None => return Ok((done, at, i)),
            }
            at += part.len();
        }
        Ok((done, at, pieces.len()))
    }
}
