//! The metadata role's wire format: each frame is a 4-byte little-endian
//! body length, capped at `META_FRAME_BYTES_MAX` before anything is
//! allocated, then a JSON body. One request, one reply, in order, on a
//! Unix socket. Data never crosses this protocol: only names and layouts.

use std::io::{Read, Write};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sluice_stripe::LayoutRequest;

use crate::error::{Error, ErrorKind, Result};
use crate::meta::Entry;

/// Largest frame body, in bytes: a full `readdir` reply
/// (`META_DIR_ENTRIES_MAX` entries of a few hundred bytes) fits.
pub const META_FRAME_BYTES_MAX: usize = 4 << 20;

/// A request to the metadata role.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaRequest {
    /// The data servers' addresses, object `k` of a layout on
    /// `servers[layout.server_of(k)]`.
    Servers,
    Lookup { path: String },
    Create { path: String, layout: LayoutRequest, exclusive: bool },
    Mkdir { path: String },
    SetDirDefault { path: String, layout: LayoutRequest },
    Unlink { path: String },
    Readdir { path: String },
}

/// The metadata role's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaReply {
    Servers(Vec<String>),
    Entry(Entry),
    Entries(Vec<(String, Entry)>),
    Error { errno: i32, message: String },
}

/// Write one frame.
pub fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> std::io::Result<()> {
    let body = serde_json::to_vec(msg).expect("protocol messages always serialise");
    if body.len() > META_FRAME_BYTES_MAX {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("frame of {} bytes exceeds {META_FRAME_BYTES_MAX}", body.len())));
    }
    let mut frame = (body.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&body);
    w.write_all(&frame)
}

/// Read one frame; `Ok(None)` at a clean end of stream.
pub fn recv<T: DeserializeOwned>(r: &mut impl Read) -> Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(Error::io("metadata connection", &e)),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > META_FRAME_BYTES_MAX {
        return Err(Error::new(ErrorKind::Limit, libc::EPROTO, format!("metadata frame of {len} bytes exceeds {META_FRAME_BYTES_MAX} (META_FRAME_BYTES_MAX)")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| Error::io("metadata connection", &e))?;
    serde_json::from_slice(&body).map(Some).map_err(|e| Error::new(ErrorKind::Meta, libc::EPROTO, format!("bad metadata frame: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_bound_at_n_and_n_plus_one() {
        let at = |n: usize| {
            let mut f = (n as u32).to_le_bytes().to_vec();
            f.extend(std::iter::repeat_n(b' ', n));
            recv::<MetaRequest>(&mut f.as_slice())
        };
        // N: accepted by the length check, then refused as bad JSON.
        assert_eq!(at(META_FRAME_BYTES_MAX).unwrap_err().kind, ErrorKind::Meta);
        assert_eq!(at(META_FRAME_BYTES_MAX + 1).unwrap_err().kind, ErrorKind::Limit);
    }

    #[test]
    fn round_trip_and_truncation() {
        let mut buf = Vec::new();
        send(&mut buf, &MetaRequest::Lookup { path: "a/b".into() }).unwrap();
        assert_eq!(recv::<MetaRequest>(&mut buf.as_slice()).unwrap(), Some(MetaRequest::Lookup { path: "a/b".into() }));
        assert!(recv::<MetaRequest>(&mut &buf[..buf.len() - 1]).is_err());
        assert_eq!(recv::<MetaRequest>(&mut &buf[..0]).unwrap(), None);
    }
}
