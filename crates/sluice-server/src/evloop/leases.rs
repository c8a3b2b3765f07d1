//! Answers admission gives without the scheduler: cache leases
//! (`lease.rs`: the client reads or writes the page cache itself) and a
//! connection's shared-memory region (`shm.rs`).

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::Op;

use super::EventLoop;
use crate::conn::Conn;
use crate::pending::Out;
use crate::sync::lock;

impl EventLoop {
    /// Answer a `ReadLease` or (`op` a write) a `WriteLease` with a lease,
    /// lending the handle's descriptor with its first one (`lease.rs`);
    /// false: the request goes through the scheduler as a `ReadShm` or
    /// `WriteShm`. Never with leases off, on O_DIRECT or an emulated
    /// device (which must see every access), but for a regular file, or
    /// for a bad handle (which that path answers).
    /// - A read: on a read-only handle, when its range is in the page
    ///   cache (`lease::grant`).
    /// - A write (only with `ServerConfig::write_leases`): on a writable
    ///   handle, over the whole file (`[0, u64::MAX)`) for
    ///   `write_lease_valid_us` (the server never opens with O_APPEND,
    ///   `ops::OPEN_FLAGS_ALLOWED`, so a lent descriptor's `pwrite` lands
    ///   at its offset). A buffered write only copies into the page
    ///   cache, and what the device pays comes with the kernel's
    ///   write-back, which no order of those copies changes: there is no
    ///   range to check, so a narrower lease would only make a writer ask
    ///   again (a cyclic writer's pieces lie far apart).
    pub(super) fn lease(&mut self, c: &mut Conn, wire_id: u64, fd: u64, offset: u64, len: u32, op: Op) -> bool {
        if !self.leases_here(c) {
            return false;
        }
        if op == Op::Write {
            // What the client wrote under its last lease counts now.
            c.fold_leased(&self.shared.apps);
        }
        // The span granted, the bytes counted as leased, for how long.
        let span = match op {
            Op::Read => self.read_lease(c, fd, offset, len),
            Op::Write => self.write_lease(c, fd, len),
        };
        let Some((start, granted, counted, valid)) = span else { return false };
        let session = c.session.as_mut().expect("a ready connection holds its session");
        let Ok(lend) = session.lend(fd) else { return false };
        lock(&self.shared.apps).record_lease(session.app, counted);
        let out = Out::Lease(start, granted, valid, lend.is_some());
        c.push_with(wire_id, out, 0, &self.shared.reply_bytes, lend);
        true
    }

    /// A read lease: on a read-only handle of a regular file, when its
    /// range is in the page cache (looked up in `verified` first).
    fn read_lease(&mut self, c: &Conn, fd: u64, offset: u64, len: u32) -> Option<(u64, u64, u64, u32)> {
        let l = &self.shared.config.limits;
        let session = c.session.as_ref().expect("a ready connection holds its session");
        let file = session.file(fd).ok().filter(|f| f.regular && f.access == libc::O_RDONLY)?;
        let (now, fresh) = (self.now.at, Duration::from_micros(u64::from(l.lease_valid_us) / 2));
        let found = self.verified.lookup(file.id, offset, u64::from(len), l.lease_bytes_max, now, fresh).or_else(|| {
            let g = crate::lease::grant(file.fd.as_raw_fd(), offset, u64::from(len), l.lease_bytes_max);
            if let Some(g) = g {
                self.verified.record(file.id, offset, g, now, fresh);
            }
            g
        });
        let (granted, in_file) = found?;
        // A lease no longer than a small request saves nothing: the client
        // would still make one round trip per read, and then a `pread` of
        // its own; the loop reads it as cheaply (`lease::SHORT_BYTES_MIN`).
        // Except the handle's first, which lends the descriptor (the FUSE
        // mount's passthrough asks for it with a 4 KiB read).
        if granted <= u64::from(len) && u64::from(len) < crate::lease::SHORT_BYTES_MIN && session.lent.contains(&fd) {
            return None;
        }
        Some((offset, granted, in_file, l.lease_valid_us))
    }

    /// A write lease: over the whole file, on a writable handle of a
    /// regular file, with `ServerConfig::write_leases`. Counted: the write
    /// that asked (what the client writes under the lease reaches
    /// `bytes_written` through `fold_leased`).
    fn write_lease(&self, c: &Conn, fd: u64, len: u32) -> Option<(u64, u64, u64, u32)> {
        let cfg = &self.shared.config;
        let session = c.session.as_ref().expect("a ready connection holds its session");
        let file = session.file(fd).ok().filter(|f| f.regular)?;
        if !cfg.write_leases || len == 0 || file.access == libc::O_RDONLY {
            return None;
        }
        Some((0, u64::MAX, u64::from(len), cfg.limits.write_lease_valid_us))
    }

    /// Whether this server leases anything to connection `c`: leases on,
    /// the page cache in use (not O_DIRECT, not an emulated device, which
    /// must see every access), a client on this host.
    pub(super) fn leases_here(&self, c: &Conn) -> bool {
        let cfg = &self.shared.config;
        cfg.limits.lease_bytes_max != 0 && !cfg.direct && cfg.device == crate::config::DeviceKind::Real && matches!(c.stream, crate::net::Stream::Unix(_))
    }

    /// Whether this server grants `c` write leases at all (the handle
    /// aside).
    pub(super) fn grants_write_leases(&self, c: &Conn) -> bool {
        self.shared.config.write_leases && self.leases_here(c)
    }

    /// `ShmAttach`: map a region for this connection's data and send its
    /// descriptor with the answer (`shm.rs`).
    pub(super) fn attach(&mut self, c: &mut Conn, wire_id: u64, bytes: u64) -> Result<(), (i32, String)> {
        let l = &self.shared.config.limits;
        if !matches!(c.stream, crate::net::Stream::Unix(_)) {
            return Err((libc::EOPNOTSUPP, "shared memory needs a Unix socket: the client must be on the server's host".into()));
        }
        if c.shm.is_some() {
            return Err((libc::EEXIST, "this connection already has a shared-memory region".into()));
        }
        let want = bytes.min(l.shm_bytes_max);
        if want == 0 {
            return Err((libc::EINVAL, "a shared-memory region needs at least one byte".into()));
        }
        let left = l.shm_total_bytes_max.saturating_sub(self.shared.shm_bytes.load(Ordering::Relaxed));
        let Some(grant) = crate::shm::taper(want, left, l.shm_taper_shares) else {
            self.shared.shm_refused.fetch_add(1, Ordering::Relaxed);
            return Err((libc::ENOMEM, format!("shared-memory regions are at their bound (shm_total_bytes_max = {})", l.shm_total_bytes_max)));
        };
        if grant < want {
            self.shared.shm_tapered.fetch_add(1, Ordering::Relaxed);
        }
        let (shm, fd) =
            crate::shm::Shm::create(grant as usize, &self.shared.shm_bytes).map_err(|e| (e.raw_os_error().unwrap_or(libc::EIO), format!("shared-memory region: {e}")))?;
        c.shm = Some(Arc::new(shm));
        c.push_with(wire_id, Out::Count(grant), 0, &self.shared.reply_bytes, Some(fd));
        Ok(())
    }
}
