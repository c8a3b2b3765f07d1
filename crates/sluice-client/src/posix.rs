//! POSIX positions: `read`, `write` and `lseek` on the client's own file
//! position per handle, which survives a reconnection.

use super::*;

impl Client {
    pub(crate) fn position(&self, fd: Fd) -> Result<Position> {
        lock(&self.handles).get(&fd.0).map(|h| h.pos).ok_or_else(|| bad_handle(fd))
    }

    pub(crate) fn set_position(&self, fd: Fd, at: u64) {
        if let Some(h) = lock(&self.handles).get_mut(&fd.0) {
            h.pos.at = at;
        }
    }

    /// Read at the file position and advance it.
    pub fn read(&self, fd: Fd, buf: &mut [u8]) -> Result<usize> {
        let at = self.position(fd)?.at;
        let n = self.pread(fd, buf, at)?;
        self.set_position(fd, at + n as u64);
        Ok(n)
    }

    /// Write at the file position (at the end with `O_APPEND`: the server
    /// hands it out, [`Client::reserve`]) and advance it.
    pub fn write(&self, fd: Fd, data: &[u8]) -> Result<usize> {
        let p = self.position(fd)?;
        let at = if p.append && !data.is_empty() { self.reserve(fd, data.len() as u64)? } else { p.at };
        let n = self.pwrite(fd, data, at)?;
        self.set_position(fd, at + n as u64);
        Ok(n)
    }

    /// Move the file position; the new position.
    pub fn lseek(&self, fd: Fd, offset: i64, whence: Whence) -> Result<u64> {
        let base = match whence {
            Whence::Set => 0,
            Whence::Cur => self.position(fd)?.at as i64,
            Whence::End => self.fstat(fd)?.size as i64,
        };
        let at = base.checked_add(offset).filter(|&a| a >= 0).ok_or_else(|| ClientError::invalid("lseek to a negative position"))?;
        self.position(fd)?;
        self.set_position(fd, at as u64);
        Ok(at as u64)
    }
}
