//! The path rules the metadata role and its clients share (the entry
//! itself is `sluice_proto::meta::Entry`).

use crate::error::{Error, ErrorKind, Result};

/// Longest path the namespace accepts, in bytes.
pub const META_PATH_BYTES_MAX: usize = 4096;
/// `a/b/c` from `/a//b/./c/` (`.` is the root); refuses `..` and
/// over-long paths.
pub fn normalize(path: &str) -> Result<String> {
    if path.len() > META_PATH_BYTES_MAX {
        return Err(Error::new(ErrorKind::Limit, libc::ENAMETOOLONG, format!("path of {} bytes exceeds {META_PATH_BYTES_MAX}", path.len())));
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    if parts.contains(&"..") {
        return Err(Error::invalid(format!("path {path:?}: .. is not allowed")));
    }
    Ok(parts.join("/"))
}
