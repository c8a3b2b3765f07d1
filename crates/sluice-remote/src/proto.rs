//! The metadata protocol (`sluice_proto::meta`) with this crate's errors:
//! what the striped client and the metadata role call.

use std::io::Read;

use serde::de::DeserializeOwned;
pub use sluice_proto::meta::{
    hex, meta_body_len, refuse_sluice_hello, send, sluice_hello, unhex, MetaReply, MetaRequest, CLUSTER_ERRNO, META_AUTH_CONTEXT, META_FRAME_BYTES_MAX, META_LENGTH_BYTES,
};

use crate::error::{Error, ErrorKind, Result};

/// Read one frame's body; `Ok(None)` at a clean end of stream.
pub fn recv_body(r: &mut impl Read) -> Result<Option<Vec<u8>>> {
    sluice_proto::meta::recv_body(r).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidData => Error::new(ErrorKind::Limit, libc::EPROTO, e.to_string()),
        _ => Error::io("metadata connection", &e),
    })
}

/// Decode a frame body.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T> {
    sluice_proto::meta::parse(body).map_err(|e| Error::new(ErrorKind::Meta, libc::EPROTO, e.to_string()))
}

/// Read one frame; `Ok(None)` at a clean end of stream.
pub fn recv<T: DeserializeOwned>(r: &mut impl Read) -> Result<Option<T>> {
    recv_body(r)?.map(|b| parse(&b)).transpose()
}

#[cfg(test)]
mod tests {
    #[test]
    fn cluster_errno_is_eremote() {
        assert_eq!(super::CLUSTER_ERRNO, libc::EREMOTE);
    }
}
