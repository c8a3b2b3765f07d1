//! Lent descriptors and leases: the file descriptors a server lends with
//! a cache or write lease, their process-wide bound, and the reads and
//! writes a client then makes on them itself.

use super::*;

/// `(st_dev, st_ino)` of an open file.
fn file_key(f: &std::fs::File) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    f.metadata().ok().map(|m| (m.dev(), m.ino()))
}

/// Lent descriptors this process holds (every client together).
static LENT_HELD: AtomicUsize = AtomicUsize::new(0);

/// The most lent descriptors a process holds: a quarter of its descriptor
/// limit (at least 16). Each handle that takes leases holds one, and
/// under the interposer each service file holds a placeholder too: with
/// no bound, a process under `ulimit -n 1024` ran out of descriptors at
/// 509 open files. Past it a handle takes no leases (its reads and writes
/// go through the server).
fn lent_max() -> usize {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills a valid struct.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 { lim.rlim_cur } else { 1024 };
    usize::try_from(soft / 4).unwrap_or(usize::MAX).max(16)
}

/// Count one more in `held` unless it holds `max` already.
fn take_one(held: &AtomicUsize, max: usize) -> bool {
    if held.fetch_add(1, Ordering::AcqRel) >= max {
        held.fetch_sub(1, Ordering::AcqRel);
        return false;
    }
    true
}

impl Lent {
    /// Keep a lent descriptor, unless the process holds `lent_max` already.
    pub(crate) fn new(fd: OwnedFd) -> Option<Lent> {
        if !take_one(&LENT_HELD, lent_max()) {
            return None;
        }
        let file = std::fs::File::from(fd);
        match file_key(&file) {
            Some(key) => Some(Lent { key, file }),
            None => {
                LENT_HELD.fetch_sub(1, Ordering::AcqRel);
                None
            }
        }
    }

    /// Whether the descriptor still refers to the file it was lent for. A
    /// program that closes descriptors it does not own (and, under the
    /// interposer, then opens another file on the same number) must not
    /// make a leased read return another file's bytes: one `fstat` per
    /// leased read rules it out.
    pub(crate) fn intact(&self) -> bool {
        file_key(&self.file) == Some(self.key)
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        LENT_HELD.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `pwrite` all of `data` on a lent descriptor (checked `intact` by the
/// caller, as for reads), and report the bytes in the session's region
/// (`shm::Region::add_leased`), which the server counts as written.
fn local_pwrite(lent: &Lent, data: &[u8], offset: u64, region: Option<&Arc<shm::Region>>) -> Result<usize> {
    use std::os::unix::fs::FileExt;
    lent.file.write_all_at(data, offset).map_err(|e| ClientError::new(ClientErrorKind::Server, e.raw_os_error().unwrap_or(libc::EIO), format!("leased write: {e}")))?;
    if let Some(r) = region {
        r.add_leased(data.len() as u64);
    }
    Ok(data.len())
}

/// `pread` on a lent descriptor until `buf` is full or end of file.
pub(crate) fn local_pread(lent: &Lent, buf: &mut [u8], offset: u64) -> Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut at = 0;
    while at < buf.len() {
        match lent.file.read_at(&mut buf[at..], offset + at as u64) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ClientError::new(ClientErrorKind::Server, e.raw_os_error().unwrap_or(libc::EIO), format!("leased read: {e}"))),
        }
    }
    Ok(at)
}

/// Lent descriptors this process holds now (every client together).
pub fn lent_held() -> usize {
    LENT_HELD.load(Ordering::Acquire)
}

impl Client {
    /// Give back every descriptor the server lent this client (each closes
    /// once no read in flight uses it); its handles take no more leases.
    /// For a process out of descriptors (`lent_held`).
    pub fn shed_lent(&self) {
        for h in lock(&self.handles).values_mut() {
            if h.lent.is_some() {
                (h.lent, h.lease, h.leases_off) = (None, None, true);
            }
        }
    }

    /// For a read (or, with `write`, a write) of `fd` on session `gen`: the
    /// lent descriptor when a live lease covers it, and whether to ask for
    /// a lease otherwise (leases on; a read-only handle for a read, a
    /// writable one without O_APPEND for a write: a handle's leases are
    /// all of its one kind, so a read of a read-write handle never uses
    /// a write lease).
    pub(crate) fn leased(&self, fd: Fd, gen: u64, offset: u64, len: usize, write: bool) -> (Option<Arc<Lent>>, bool) {
        if !self.opts.leases {
            return (None, false);
        }
        let mut h = lock(&self.handles);
        let Some(h) = h.get_mut(&fd.0) else { return (None, false) };
        let kind = if write { h.flags & libc::O_ACCMODE != libc::O_RDONLY && h.flags & libc::O_APPEND == 0 } else { h.flags & libc::O_ACCMODE == libc::O_RDONLY };
        if !kind {
            return (None, false);
        }
        // A handle not lent a descriptor yet asks no lease while the
        // process holds `lent_max`: the server would lend it one.
        let ok = !h.leases_off && (h.lent.is_some() || lent_held() < lent_max());
        let live = match (&h.lent, h.lease) {
            (Some(file), Some((start, end, until))) if h.gen == gen && offset >= start && offset.saturating_add(len as u64) <= end && Instant::now() < until => {
                Some(Arc::clone(file))
            }
            _ => None,
        };
        match live {
            Some(f) if !f.intact() => {
                (h.lent, h.lease, h.leases_off) = (None, None, true);
                (None, false)
            }
            live => (live, ok),
        }
    }

    /// Keep the lease the server answered for `fd` on session `gen` (with
    /// the descriptor it lent, the first time); the descriptor to read
    /// from, or `None` when the lent one is not known here (another
    /// thread's reply that carried it is not taken in yet).
    pub(crate) fn keep_lease(&self, fd: Fd, gen: u64, start: u64, len: u64, valid: Duration, lent: Option<OwnedFd>) -> Option<Arc<Lent>> {
        let offered = lent.is_some();
        let lent = lent.and_then(Lent::new).map(Arc::new);
        let mut h = lock(&self.handles);
        let Some(h) = h.get_mut(&fd.0).filter(|h| h.gen == gen) else { return lent };
        if offered && lent.is_none() {
            // Not kept (`lent_max`): this handle asks no more leases.
            (h.lent, h.lease, h.leases_off) = (None, None, true);
            return None;
        }
        if let Some(f) = &lent {
            h.lent = Some(Arc::clone(f));
        }
        let file = h.lent.clone()?;
        if !file.intact() {
            (h.lent, h.lease, h.leases_off) = (None, None, true);
            return None;
        }
        h.lease = Some((start, start.saturating_add(len), Instant::now() + valid));
        Some(file)
    }

    /// Write all of `data` at `offset` through the lent descriptor when a
    /// write lease covers it, or when one asked for now is granted; `None`:
    /// the server is to write it (this handle, or this server, grants no
    /// write lease). The lease is asked without the data (`WriteLease` at
    /// `LEASE_ONLY_AT`, protocol 12): a granted one then costs no copy
    /// into the shared region, and covers the whole file for the time the
    /// server gives. A refusal makes the handle ask no more; a server that
    /// grants none at all (EOPNOTSUPP) makes the session ask no more.
    pub(crate) fn write_leased(&self, fd: Fd, data: &[u8], offset: u64) -> Result<Option<usize>> {
        let s = self.current();
        let (local, ask) = self.leased(fd, s.gen, offset, data.len(), true);
        if let Some(file) = local {
            return local_pwrite(&file, data, offset, s.shm.as_ref()).map(Some);
        }
        // Without a region the client could not report what it writes
        // (its doorbell's `leased_bytes`): it asks for no write lease.
        if !ask || data.is_empty() || s.shm.is_none() || s.write_leases_refused.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX).min(IO_BYTES_MAX);
        // Asking changes nothing on disk: asked again after a break.
        let granted = self.on_fd(fd, true, |s, server| {
            self.note_send();
            match s.conn.call(&Request::WriteLease { fd: server, offset, len, at: LEASE_ONLY_AT, post: NO_POST }) {
                Ok(Reply::Lease(start, span, valid, lent)) => Ok(Some((s.gen, start, span, valid, lent))),
                Ok(_) => Ok(None),
                Err(e) if e.kind == ClientErrorKind::Server => {
                    if e.errno == libc::EOPNOTSUPP {
                        s.write_leases_refused.store(true, Ordering::Relaxed);
                    }
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        })?;
        match granted {
            Some((gen, start, span, valid, lent)) => match self.keep_lease(fd, gen, start, span, valid, lent) {
                Some(file) => local_pwrite(&file, data, offset, self.current().shm.as_ref()).map(Some),
                // Rare (threads racing on a handle's first lease): the
                // server writes this one.
                None => Ok(None),
            },
            None => {
                if let Some(h) = lock(&self.handles).get_mut(&fd.0) {
                    h.leases_off = true;
                }
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod lent_tests {
    use super::*;

    #[test]
    fn lent_descriptors_bound_at_n_and_n_plus_one() {
        let held = AtomicUsize::new(0);
        for _ in 0..16 {
            assert!(take_one(&held, 16));
        }
        assert!(!take_one(&held, 16), "N+1 refused");
        assert_eq!(held.load(Ordering::Acquire), 16, "a refusal takes nothing");
        held.fetch_sub(1, Ordering::AcqRel);
        assert!(take_one(&held, 16), "one given back makes room");
        assert!(lent_max() >= 16);
    }
}
