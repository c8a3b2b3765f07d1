//! Mapping between file offsets and object offsets: single offsets, lists
//! of ranges (list I/O), grouping per object, cutting groups into messages,
//! and the file size derived from the object sizes.

use crate::error::{Error, ErrorKind, Result};
use crate::layout::Layout;

/// Most pieces one mapping may produce. 1 Mi pieces is 512 MiB at the
/// smallest stripe size (512 B) and about 48 MiB of piece descriptors; a
/// larger request is refused rather than allocated.
pub const MAP_PIECES_MAX: usize = 1 << 20;

/// Where one file byte lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loc {
    /// Object index within the layout, 0..count.
    pub object: u32,
    /// Data server holding the object.
    pub server: u32,
    /// Byte offset within the object.
    pub object_offset: u64,
}

/// One contiguous part of a request that lies in one stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub object: u32,
    pub server: u32,
    pub object_offset: u64,
    pub len: u64,
    /// Where the piece's bytes sit in the caller's buffer (the request's
    /// ranges laid back to back).
    pub buf_offset: u64,
}

/// The pieces of one object, in request order: one list-I/O message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectList {
    pub object: u32,
    pub server: u32,
    /// `(object offset, len)`, as `read_list`/`write_list` take them.
    pub pieces: Vec<(u64, u64)>,
    /// The caller-buffer offset of each piece.
    pub buf_offsets: Vec<u64>,
}

impl ObjectList {
    /// Bytes the list moves.
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.1).sum()
    }

    fn push(&mut self, object_offset: u64, len: u64, buf_offset: u64) {
        if let (Some(last), Some(&last_buf)) = (self.pieces.last_mut(), self.buf_offsets.last()) {
            if last.0 + last.1 == object_offset && last_buf + last.1 == buf_offset {
                last.1 += len;
                return;
            }
        }
        self.pieces.push((object_offset, len));
        self.buf_offsets.push(buf_offset);
    }
}

impl Layout {
    /// The object, server and object offset of file byte `offset`.
    pub fn locate(&self, offset: u64) -> Loc {
        let stripe = offset / self.stripe_bytes;
        let object = (stripe % self.count as u64) as u32;
        let row = stripe / self.count as u64;
        Loc { object, server: self.server_of(object), object_offset: row * self.stripe_bytes + offset % self.stripe_bytes }
    }

    /// The file offset of byte `object_offset` of object `object`
    /// (saturating at `u64::MAX` for offsets no file can reach).
    pub fn logical(&self, object: u32, object_offset: u64) -> u64 {
        let sb = self.stripe_bytes as u128;
        let row = object_offset as u128 / sb;
        let at = (row * self.count as u128 + object as u128) * sb + object_offset as u128 % sb;
        at.min(u64::MAX as u128) as u64
    }

    /// Cut the ranges `(offset, len)` at stripe boundaries; the pieces come
    /// in request order, their buffer offsets laid back to back.
    pub fn map_list(&self, ranges: &[(u64, u64)]) -> Result<Vec<Piece>> {
        let mut out = Vec::new();
        let mut buf_offset = 0u64;
        for &(offset, len) in ranges {
            offset.checked_add(len).ok_or_else(|| Error::new(ErrorKind::TooLarge, format!("range at {offset} of {len} bytes passes 2^64")))?;
            let (mut at, end) = (offset, offset + len);
            while at < end {
                if out.len() == MAP_PIECES_MAX {
                    return Err(Error::new(ErrorKind::TooLarge, format!("request maps to more than {MAP_PIECES_MAX} pieces (MAP_PIECES_MAX)")));
                }
                let loc = self.locate(at);
                let n = (end - at).min(self.stripe_bytes - at % self.stripe_bytes);
                out.push(Piece { object: loc.object, server: loc.server, object_offset: loc.object_offset, len: n, buf_offset });
                at += n;
                buf_offset += n;
            }
        }
        Ok(out)
    }
}

/// Group pieces per object (ascending object), keeping request order
/// within each and merging pieces contiguous in both object and buffer.
pub fn group(pieces: &[Piece]) -> Vec<ObjectList> {
    let mut lists: Vec<ObjectList> = Vec::new();
    for p in pieces {
        let i = match lists.binary_search_by_key(&p.object, |l| l.object) {
            Ok(i) => i,
            Err(i) => {
                lists.insert(i, ObjectList { object: p.object, server: p.server, ..ObjectList::default() });
                i
            }
        };
        lists[i].push(p.object_offset, p.len, p.buf_offset);
    }
    lists
}

/// Cut one object's list into messages of at most `pieces_max` pieces and
/// `bytes_max` bytes each (both at least 1), splitting long pieces.
pub fn chunk(list: &ObjectList, pieces_max: usize, bytes_max: u64) -> Vec<ObjectList> {
    let (pieces_max, bytes_max) = (pieces_max.max(1), bytes_max.max(1));
    let mut out = Vec::new();
    let mut cur = ObjectList { object: list.object, server: list.server, ..ObjectList::default() };
    let mut cur_bytes = 0u64;
    for (&(mut off, mut len), &buf) in list.pieces.iter().zip(&list.buf_offsets) {
        let mut buf = buf;
        while len > 0 {
            if cur.pieces.len() == pieces_max || cur_bytes == bytes_max {
                out.push(std::mem::replace(&mut cur, ObjectList { object: list.object, server: list.server, ..ObjectList::default() }));
                cur_bytes = 0;
            }
            let n = len.min(bytes_max - cur_bytes);
            cur.pieces.push((off, n));
            cur.buf_offsets.push(buf);
            (off, len, buf, cur_bytes) = (off + n, len - n, buf + n, cur_bytes + n);
        }
    }
    if !cur.pieces.is_empty() {
        out.push(cur);
    }
    out
}

/// The file size given each object's size (index = object): one past the
/// highest file byte any object holds, as PVFS and Lustre derive it.
pub fn file_size(layout: &Layout, object_sizes: &[u64]) -> u64 {
    let ends = object_sizes.iter().enumerate().filter(|(_, &s)| s > 0);
    ends.map(|(k, &s)| layout.logical(k as u32, s - 1).saturating_add(1)).max().unwrap_or(0)
}

/// The size object `object` has in a file of `size` bytes with no holes
/// at its end (what `ftruncate` sets on each object).
pub fn object_size_for(layout: &Layout, size: u64, object: u32) -> u64 {
    let (sb, count) = (layout.stripe_bytes, layout.count as u64);
    let full = size / sb;
    let mut bytes = (full / count + u64::from((object as u64) < full % count)) * sb;
    if full % count == object as u64 {
        bytes += size % sb;
    }
    bytes
}
