//! Passthrough: the file itself, for a caller (the FUSE mount) that can
//! hand the kernel a descriptor when the server lent one and every page
//! is cached; and a read served from a live lease alone.

use super::*;

/// What [`Client::passthrough_file`] found.
#[derive(Debug)]
pub enum Passthrough {
    /// The file itself, every page of it cached now.
    File(std::fs::File),
    /// The server lent the file, but not all of it is cached.
    NotCached,
    /// No descriptor lent: the server lends none (another host, O_DIRECT,
    /// an emulated device), the first bytes were not cached, or no prime
    /// was asked for.
    NotLent,
    /// Not a candidate: leases off, not a read-only handle, an empty file,
    /// or a lent descriptor that no longer is the file.
    Unsuitable,
}

impl Client {
    /// The file behind read-only handle `fd` itself, when every page of it
    /// is in the page cache now: a duplicate of the descriptor the server
    /// lent for cache leases. When none was lent yet and `prime` is set, it
    /// is asked for first, with a read of the file's first bytes (which the
    /// server answers with a lease only if they are cached and it lends at
    /// all). The FUSE mount hands the file to the kernel (passthrough).
    /// `size`: the file's size, as the caller's `fstat` just found it.
    pub fn passthrough_file(&self, fd: Fd, size: u64, prime: bool) -> Result<Passthrough> {
        use std::os::fd::AsRawFd;
        if !self.opts.leases {
            return Ok(Passthrough::Unsuitable);
        }
        let lent = || -> Option<Option<Arc<Lent>>> {
            let h = lock(&self.handles);
            let h = h.get(&fd.0).filter(|h| h.flags & libc::O_ACCMODE == libc::O_RDONLY && !h.leases_off && h.dead.is_none())?;
            Some(h.lent.clone())
        };
        if lent().is_none() {
            return Ok(Passthrough::Unsuitable);
        }
        if size == 0 {
            return Ok(Passthrough::Unsuitable);
        }
        if lent().flatten().is_none() {
            if !prime {
                return Ok(Passthrough::NotLent);
            }
            let mut first = vec![0u8; size.min(4096) as usize];
            self.pread(fd, &mut first, 0)?;
        }
        let Some(l) = lent().flatten() else { return Ok(Passthrough::NotLent) };
        if !l.intact() {
            return Ok(Passthrough::Unsuitable);
        }
        match sluice_net::cache::all_cached(l.file.as_raw_fd(), 0, size) {
            Some(true) => Ok(Passthrough::File(
                l.file.try_clone().map_err(|e| ClientError::new(ClientErrorKind::Server, e.raw_os_error().unwrap_or(libc::EIO), format!("passthrough: {e}")))?,
            )),
            _ => Ok(Passthrough::NotCached),
        }
    }

    /// Read from the page cache under a live cache lease that covers
    /// `[offset, offset + buf.len())`, without any message and without
    /// waiting for the server; `None` when no live lease covers it (then
    /// [`Client::pread`], which may be answered with a new one). For
    /// callers that must not block, such as the FUSE mount's async threads.
    pub fn pread_leased(&self, fd: Fd, buf: &mut [u8], offset: u64) -> Option<Result<usize>> {
        let gen = self.current().gen;
        let (file, _) = self.leased(fd, gen, offset, buf.len(), false);
        file.map(|f| local_pread(&f, buf, offset))
    }
}
