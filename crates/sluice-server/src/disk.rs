//! The emulated disk (`--device hdd7200`): one arm, which a dispatch holds
//! for the modelled service time, so dispatches are served one at a time
//! as on a single-head disk, each paying the seek from where the last one
//! left the head.
//!
//! Shared (`--device-shared PATH`): several servers in front of one shared
//! directory (a forwarder set, `sluice_remote::Forwarders`) take turns on
//! one emulated disk, as forwarders over one file system share its disks.
//! The arm is then also an `flock` on `PATH`, and the head's position
//! lives in `PATH` (the file's inode and the offset where the last
//! dispatch ended), so one server's dispatch after another's pays the
//! seek between them. Without it every server would emulate a disk of its
//! own, and four forwarders would have four times the disk.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use sluice_device::{Access, DeviceModel, Hdd};

use crate::error::{Error, Result};
use crate::sync::lock;

/// Bytes of the head record in a shared disk's file: inode, end offset.
const HEAD_BYTES: usize = 16;

/// The emulated disk of one server, alone or shared with other servers.
pub struct Disk {
    model: Mutex<Hdd>,
    shared: Option<File>,
}

/// The arm, held: the dispatch's service time is asked of it.
pub struct Held<'a> {
    model: MutexGuard<'a, Hdd>,
    shared: Option<&'a File>,
}

impl Disk {
    /// A 7200 rpm disk of this server's own, or shared through the file at
    /// `shared` (created if missing).
    pub fn new(shared: Option<&Path>) -> Result<Disk> {
        let shared = match shared {
            None => None,
            Some(p) => Some(
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(p)
                    .map_err(|e| Error::io(&format!("open the shared disk {}", p.display()), &e))?,
            ),
        };
        Ok(Disk { model: Mutex::new(Hdd::hdd7200()), shared })
    }

    /// Wait for the arm (this server's threads first, then the other
    /// servers sharing the disk).
    pub fn hold(&self) -> Held<'_> {
        let model = lock(&self.model);
        if let Some(f) = &self.shared {
            // SAFETY: flock on a descriptor this struct owns; it blocks
            // until the other holders let go (EINTR: tried again).
            while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
                if std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                    break;
                }
            }
        }
        Held { model, shared: self.shared.as_ref() }
    }
}

impl Held<'_> {
    /// Nanoseconds the disk takes for `len` bytes at `offset` of the file
    /// this server knows as `file` (open on `fd`), and the head moved there.
    pub fn service_ns(&mut self, file: u64, fd: RawFd, offset: u64, len: u64) -> u64 {
        let Some(shared) = self.shared else {
            return self.model.service_ns(Access { file, offset, len });
        };
        // Servers number files each their own way: the inode is common.
        // SAFETY: fstat into a zeroed stat struct.
        let ino = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) == 0 {
                st.st_ino
            } else {
                file
            }
        };
        let mut head = [0u8; HEAD_BYTES];
        let was = match shared.read_at(&mut head, 0) {
            Ok(HEAD_BYTES) => Some((u64::from_le_bytes(head[..8].try_into().expect("8 bytes")), u64::from_le_bytes(head[8..].try_into().expect("8 bytes")))),
            _ => None,
        };
        self.model.place_head(was);
        let ns = self.model.service_ns(Access { file: ino, offset, len });
        head[..8].copy_from_slice(&ino.to_le_bytes());
        head[8..].copy_from_slice(&(offset + len).to_le_bytes());
        // A lost record only costs the next dispatch a seek.
        let _ = shared.write_at(&head, 0);
        ns
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.shared {
            // SAFETY: unlocks the lock `hold` took on this descriptor.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_servers_sharing_a_disk_pay_each_others_seeks() {
        let dir = tempfile::tempdir().unwrap();
        let data = File::create(dir.path().join("f")).unwrap();
        let fd = data.as_raw_fd();
        let path = dir.path().join("disk");
        let (a, b) = (Disk::new(Some(&path)).unwrap(), Disk::new(Some(&path)).unwrap());
        let first = a.hold().service_ns(1, fd, 0, 4096);
        // b's file number differs, the inode does not: b continues a's
        // sequential run (transfer only).
        let next = b.hold().service_ns(99, fd, 4096, 4096);
        assert!(first > 10_000_000 && next < 100_000, "{first} {next}");
        // Two disks of their own: b's first dispatch seeks.
        let (c, d) = (Disk::new(None).unwrap(), Disk::new(None).unwrap());
        c.hold().service_ns(1, fd, 0, 4096);
        assert!(d.hold().service_ns(1, fd, 4096, 4096) > 10_000_000);
    }
}
