//! Read-ahead of leases: once a sequential reader is past the middle of
//! its lease, the next one is asked for while it still copies, and taken
//! (or discarded) by the read that reaches it.

use super::*;

impl Client {
    /// Ask for the lease after the live one once a sequential reader is
    /// past its middle: the server's check of the next range
    /// (`cachestat`, about 8 µs per MiB on the 2-core VM, 16% of a 20 GB/s
    /// copy) then runs while this reader copies, instead of while it
    /// waits. One at a time per handle; only from the blocking `pread`.
    /// Only for a read that continued the one before: where the cached
    /// run ends the read ahead reaches the device, a whole slot of it,
    /// which a strided reader does not want and its next read then waits
    /// for (a 4 KiB x 32 strided decomposition of cold data through
    /// read-only handles ran 2-3x slower than with leases off).
    pub(crate) fn lease_ahead(&self, fd: Fd, offset: u64, len: usize) {
        let next = {
            let mut handles = lock(&self.handles);
            let Some(h) = handles.get_mut(&fd.0) else { return };
            let sequential = std::mem::replace(&mut h.read_end, offset.saturating_add(len as u64)) == offset;
            let Some((start, end, _)) = h.lease else { return };
            if !sequential || h.ahead.is_some() || h.leases_off || offset.saturating_add(len as u64) <= start + (end - start) / 2 {
                return;
            }
            end
        };
        let Ok(t) = self.submit_read(fd, shm::SLOT_BYTES, next) else { return };
        if t.local.is_some() {
            // Covered already: a local ticket sent nothing.
            return;
        }
        if t.slot.is_none() {
            // No slot free: it went as a plain read; take its answer.
            let _ = self.wait_discard(t);
            return;
        }
        let extra = {
            let mut handles = lock(&self.handles);
            match handles.get_mut(&fd.0) {
                Some(h) if h.ahead.is_none() => {
                    h.ahead = Some((next, t));
                    None
                }
                _ => Some(t),
            }
        };
        if let Some(t) = extra {
            // Another thread asked first, or the handle closed meanwhile.
            let _ = self.wait_discard(t);
        }
    }

    /// The lease asked for ahead on `fd`: `Ok` when it starts at `offset`
    /// and covers a read of `len` (at most a slot), `Err` when the reader
    /// went elsewhere (to be waited for and dropped, freeing its slot).
    /// (Also where this read ends: `Handle::read_end`.)
    pub(crate) fn take_ahead(&self, fd: Fd, offset: u64, len: usize) -> Option<std::result::Result<Ticket, Ticket>> {
        let mut handles = lock(&self.handles);
        let h = handles.get_mut(&fd.0)?;
        h.read_end = offset.saturating_add(len as u64);
        let (at, _) = h.ahead.as_ref()?;
        let usable = *at == offset && len <= shm::SLOT_BYTES;
        let (_, t) = h.ahead.take().expect("looked at");
        Some(if usable { Ok(t) } else { Err(t) })
    }

    /// The answer to a lease asked ahead (`lease_ahead`), used only when it
    /// is a lease: a lease is read from the page cache when it is used,
    /// but data was read when the server answered, perhaps long before,
    /// and a write acknowledged since (to any client) would not be in it.
    /// `None` (data, or anything else): dropped, and the caller reads
    /// afresh. Before, the data was served: a reader got the bytes a write
    /// had replaced, or the end of a file another client had since grown.
    pub(crate) fn wait_ahead(&self, mut t: Ticket, buf: &mut [u8]) -> Option<Result<usize>> {
        let want = t.read.map_or(buf.len(), |r| r.1.min(buf.len()));
        let slot = t.slot.take()?;
        match t.session.conn.answer(t.id, Some(&slot), None) {
            Ok(Reply::Lease(start, len, valid, lent)) => {
                slot.release();
                let (fd, _, offset) = t.read?;
                let file = self.keep_lease(fd, t.session.gen, start, len, valid, lent)?;
                Some(local_pread(&file, &mut buf[..want], offset))
            }
            // Answered otherwise: the server is done with the slot.
            Ok(_) | Err(ClientError { kind: ClientErrorKind::Server, .. }) => {
                slot.release();
                None
            }
            // Given up unanswered (the caller is gone): the slot is freed
            // once answered, and the caller asks no more.
            Err(e @ ClientError { kind: ClientErrorKind::Interrupted, .. }) => {
                slot.abandon(t.id);
                Some(Err(e))
            }
            Err(_) => None,
        }
    }

    /// Wait for a read nobody wants any more, so that its slot is freed.
    pub(crate) fn wait_discard(&self, t: Ticket) -> Result<usize> {
        let len = t.read.map_or(0, |r| r.1);
        let mut scratch = vec![0u8; len];
        self.wait_read(t, &mut scratch)
    }
}
