//! Bounds-checked little-endian field reader and writer helpers.

use crate::error::{ProtoError, ProtoErrorKind};

/// Reads fields from a complete body; every read checks the remaining
/// length first, so a lying length prefix is a `Truncated` error.
pub(crate) struct Rd<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Rd<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Rd<'a> {
        Rd { b, pos: 0 }
    }

    pub(crate) fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], ProtoError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| ProtoError::new(ProtoErrorKind::Truncated, format!("{what}: need {n} bytes")))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(crate) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ProtoError> {
        let s = self.bytes(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, ProtoError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &str) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn i32(&mut self, what: &str) -> Result<i32, ProtoError> {
        Ok(i32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn i64(&mut self, what: &str) -> Result<i64, ProtoError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    /// A `u16`-length-prefixed UTF-8 string of at most `max` bytes.
    pub(crate) fn str(&mut self, max: usize, what: &str) -> Result<&'a str, ProtoError> {
        let n = usize::from(self.u16(what)?);
        if n > max {
            return Err(ProtoError::new(ProtoErrorKind::TooLarge, format!("{what}: {n} bytes > {max}")));
        }
        let s = self.bytes(n, what)?;
        std::str::from_utf8(s).map_err(|_| ProtoError::new(ProtoErrorKind::Invalid, format!("{what}: not UTF-8")))
    }

    /// A path: at most [`crate::PATH_BYTES_MAX`] bytes, else `NameTooLong`.
    pub(crate) fn path(&mut self, what: &str) -> Result<&'a str, ProtoError> {
        self.str(crate::PATH_BYTES_MAX, what).map_err(|e| match e.kind {
            ProtoErrorKind::TooLarge => ProtoError::new(ProtoErrorKind::NameTooLong, e.detail),
            _ => e,
        })
    }

    /// A `u32` count, refused above `max` and above what the remaining
    /// bytes could hold at `item_bytes_min` bytes per item.
    pub(crate) fn count(&mut self, max: usize, item_bytes_min: usize, what: &str) -> Result<usize, ProtoError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(ProtoError::new(ProtoErrorKind::TooLarge, format!("{what}: {n} > {max}")));
        }
        if n.saturating_mul(item_bytes_min) > self.remaining() {
            return Err(ProtoError::new(ProtoErrorKind::Truncated, format!("{what}: {n} items do not fit")));
        }
        Ok(n)
    }

    pub(crate) fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }

    /// Everything left: the trailing data payload.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let s = &self.b[self.pos..];
        self.pos = self.b.len();
        s
    }

    pub(crate) fn finish(&self, what: &str) -> Result<(), ProtoError> {
        if self.remaining() != 0 {
            return Err(ProtoError::new(ProtoErrorKind::TrailingBytes, format!("{what}: {} extra bytes", self.remaining())));
        }
        Ok(())
    }
}

pub(crate) fn put_u16(out: &mut Vec<u8>, v: u16) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_i32(out: &mut Vec<u8>, v: i32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// A `u16`-length-prefixed string of at most `max` bytes; longer is an
/// error of `kind`, never a cut (a cut path names another file).
pub(crate) fn put_checked(out: &mut Vec<u8>, s: &str, max: usize, kind: ProtoErrorKind, what: &str) -> Result<(), ProtoError> {
    if s.len() > max.min(usize::from(u16::MAX)) {
        return Err(ProtoError::new(kind, format!("{what}: {} bytes > {max}", s.len())));
    }
    put_str(out, s, max);
    Ok(())
}

/// A `u16`-length-prefixed string, cut to `max` bytes on a char boundary:
/// only for what may be cut (error messages, server-made names).
pub(crate) fn put_str(out: &mut Vec<u8>, s: &str, max: usize) {
    let mut n = s.len().min(max).min(usize::from(u16::MAX));
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    put_u16(out, n as u16);
    out.extend_from_slice(&s.as_bytes()[..n]);
}
