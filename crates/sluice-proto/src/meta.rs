//! The metadata role's wire format (a cluster's namespace protocol): each
//! frame is a 4-byte little-endian body length, capped at
//! [`META_FRAME_BYTES_MAX`] before anything is allocated, then a JSON body.
//! One request, one reply, in order. Data never crosses this protocol:
//! only names and layouts. The metadata role (`sluice-meta`) and its
//! clients (`sluice-remote`) both speak it from here.

use std::io::{Read, Write};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sluice_stripe::{Layout, LayoutRequest};

use crate::error::{ProtoError, ProtoErrorKind};

/// Directory or file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    Dir,
    File,
}

/// One namespace entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub kind: EntryKind,
    /// File id (names the objects); 0 for directories.
    pub id: u64,
    /// The file's layout; `None` for directories.
    pub layout: Option<Layout>,
    /// A directory's default for new files and subdirectories.
    pub default: Option<LayoutRequest>,
    /// Last change of the entry (a directory: of its list of names), in
    /// ns since the epoch; 0 in stores written before it was recorded.
    #[serde(default)]
    pub mtime_ns: i64,
    /// A directory's entries (its direct children), kept by the metadata
    /// store so that a directory never holds more than its bound; `None`
    /// for files, and for directories of stores written before it was
    /// kept (counted at their next change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub children: Option<u64>,
}

/// Largest frame body, in bytes: a full `readdir` reply
/// (`META_DIR_ENTRIES_MAX` entries of a few hundred bytes) fits.
pub const META_FRAME_BYTES_MAX: usize = 4 << 20;

/// A request to the metadata role.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaRequest {
    /// A TCP client's first request: asks for a `Challenge`.
    AuthStart,
    /// The answer to a `Challenge`: HMAC-SHA256 under the shared key of
    /// the nonce and `META_AUTH_CONTEXT` (`crate::auth_mac`), hex; and the
    /// client's own fresh nonce, hex, which `Authenticated` proves the key
    /// over in turn.
    Auth {
        mac: String,
        nonce: String,
    },
    /// The data servers' addresses, object `k` of a layout on
    /// `servers[layout.server_of(k)]`.
    Servers,
    Lookup {
        path: String,
    },
    Create {
        path: String,
        layout: LayoutRequest,
        exclusive: bool,
    },
    Mkdir {
        path: String,
    },
    SetDirDefault {
        path: String,
        layout: LayoutRequest,
    },
    /// Remove `path`; with `expect`, only an entry of that kind
    /// (EISDIR / ENOTDIR otherwise).
    Unlink {
        path: String,
        #[serde(default)]
        expect: Option<EntryKind>,
    },
    Readdir {
        path: String,
    },
    /// `rename(2)` in the namespace; answered `Renamed`.
    Rename {
        from: String,
        to: String,
    },
}

/// The metadata role's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaReply {
    /// A fresh nonce, hex, to prove the key over (TCP only).
    Challenge {
        nonce: String,
    },
    /// The key was proven: requests are served. `proof`: the role's own
    /// proof of the key, hex (`crate::proof_mac` of the client's nonce,
    /// the role's and `META_AUTH_CONTEXT`), which the client checks before
    /// it believes any answer.
    Authenticated {
        proof: String,
    },
    Servers(Vec<String>),
    Entry(Entry),
    Entries(Vec<(String, Entry)>),
    /// A rename's result: the file the target named before, if any, whose
    /// objects the client removes.
    Renamed {
        replaced: Option<Entry>,
    },
    Error {
        errno: i32,
        message: String,
    },
}

/// What the metadata role's key proof covers besides the nonce: a MAC
/// made for a data server's `Hello` proves nothing here, and the reverse.
pub const META_AUTH_CONTEXT: &[u8] = b"sluice-meta-auth-v1";

/// Bytes as lowercase hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Hex to exactly `N` bytes; `None` for anything else.
pub fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Bytes of a metadata frame's length prefix.
pub const META_LENGTH_BYTES: usize = 4;

/// The body length a metadata frame's prefix announces, refused past
/// [`META_FRAME_BYTES_MAX`] (before the caller allocates anything).
pub fn meta_body_len(prefix: [u8; META_LENGTH_BYTES]) -> Result<usize, ProtoError> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > META_FRAME_BYTES_MAX {
        return Err(ProtoError::new(ProtoErrorKind::TooLarge, format!("metadata frame of {len} bytes exceeds {META_FRAME_BYTES_MAX} (META_FRAME_BYTES_MAX)")));
    }
    Ok(len)
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

/// Read one frame's body; `Ok(None)` at a clean end of stream. A length
/// past [`META_FRAME_BYTES_MAX`] is `InvalidData`, refused before anything
/// is allocated.
pub fn recv_body(r: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    let mut prefix = [0u8; META_LENGTH_BYTES];
    match r.read_exact(&mut prefix) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = meta_body_len(prefix).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.detail))?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

/// Decode a frame body.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProtoError> {
    serde_json::from_slice(body).map_err(|e| ProtoError::new(ProtoErrorKind::Invalid, format!("bad metadata frame: {e}")))
}

/// The errno a metadata role answers to a data-protocol `Hello`: the
/// address is a cluster, to be used through the striped client.
pub const CLUSTER_ERRNO: i32 = 66; // EREMOTE on Linux (checked against libc in sluice-remote)

/// The request id of a sluice data-protocol `Hello` read as the first
/// metadata frame (both start with a 4-byte little-endian length; JSON
/// never starts with byte 0x01): the data protocol's own header check decides.
pub fn sluice_hello(body: &[u8]) -> Option<u64> {
    crate::hello_after_length(body)
}

/// Answer a data-protocol `Hello` with its `Error` frame, errno
/// `CLUSTER_ERRNO`, so that a client that tried the data protocol knows to
/// switch to the striped client (`Remote::connect` does).
pub fn refuse_sluice_hello(w: &mut impl Write, request_id: u64) -> std::io::Result<()> {
    let message = "this address is a sluice cluster's metadata role: use the striped client (sluice_remote::Remote)";
    let mut out = Vec::new();
    crate::encode_response(request_id, &crate::Response::Error { errno: CLUSTER_ERRNO, message }, &mut out);
    w.write_all(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_length_prefix_is_bounded_at_n_and_n_plus_one() {
        let max = META_FRAME_BYTES_MAX as u32;
        assert_eq!(meta_body_len(max.to_le_bytes()), Ok(META_FRAME_BYTES_MAX));
        assert_eq!(meta_body_len((max + 1).to_le_bytes()).unwrap_err().kind, ProtoErrorKind::TooLarge);
    }

    #[test]
    fn frame_bound_at_n_and_n_plus_one() {
        let at = |n: usize| -> std::io::Result<MetaRequest> {
            let mut f = (n as u32).to_le_bytes().to_vec();
            f.extend(std::iter::repeat_n(b' ', n));
            let body = recv_body(&mut f.as_slice())?.expect("a frame");
            parse(&body).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
        };
        // N: accepted by the length check, then refused as bad JSON.
        assert_eq!(at(META_FRAME_BYTES_MAX).unwrap_err().kind(), std::io::ErrorKind::InvalidData, "N: past the length check, refused as JSON");
        assert!(at(META_FRAME_BYTES_MAX + 1).unwrap_err().to_string().contains("META_FRAME_BYTES_MAX"));
    }

    #[test]
    fn round_trip_and_truncation() {
        let mut buf = Vec::new();
        send(&mut buf, &MetaRequest::Lookup { path: "a/b".into() }).unwrap();
        let body = recv_body(&mut buf.as_slice()).unwrap().unwrap();
        assert_eq!(parse::<MetaRequest>(&body).unwrap(), MetaRequest::Lookup { path: "a/b".into() });
        assert!(recv_body(&mut &buf[..buf.len() - 1]).is_err());
        assert_eq!(recv_body(&mut &buf[..0]).unwrap(), None);
    }

    #[test]
    fn a_data_protocol_hello_is_recognised_and_json_is_not() {
        let hello = crate::Request::Hello(crate::Hello { version: crate::VERSION, app: "a", weight: 1, client_id: 7, cred: None });
        let mut frame = Vec::new();
        crate::encode_request(42, &hello, &mut frame).unwrap();
        let body = recv_body(&mut frame.as_slice()).unwrap().unwrap();
        assert_eq!(sluice_hello(&body), Some(42));
        let mut json = Vec::new();
        send(&mut json, &MetaRequest::Servers).unwrap();
        assert_eq!(sluice_hello(&recv_body(&mut json.as_slice()).unwrap().unwrap()), None);
        // The refusal is a well-formed data-protocol Error frame.
        let mut out = Vec::new();
        refuse_sluice_hello(&mut out, 42).unwrap();
        let h = crate::check_header(&out, crate::FRAME_BYTES_MAX).unwrap().unwrap();
        match crate::parse_response(&h, &out[crate::HEADER_BYTES..]).unwrap() {
            crate::Response::Error { errno, .. } => assert_eq!(errno, CLUSTER_ERRNO),
            r => panic!("unexpected {r:?}"),
        }
    }
}
