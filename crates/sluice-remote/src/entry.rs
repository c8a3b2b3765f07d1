//! The path rules the metadata role and its clients share (the entry
//! itself is `sluice_proto::meta::Entry`).

use crate::error::{Error, ErrorKind, Result};

/// Longest path the namespace accepts, in bytes.
pub const META_PATH_BYTES_MAX: usize = 4096;
/// Longest name (one path component), in bytes: POSIX's `NAME_MAX` on
/// Linux. With `META_READDIR_ENTRIES_MAX` names it bounds a listing's
/// reply (4,096 names of 4,005 bytes made one past the 4 MiB frame, and
/// the role closed the connection instead of answering).
pub const META_NAME_BYTES_MAX: usize = 255;
/// `a/b/c` from `/a//b/./c/` (`.` is the root); refuses `..`, over-long
/// paths and over-long names (`ENAMETOOLONG`).
pub fn normalize(path: &str) -> Result<String> {
    if path.len() > META_PATH_BYTES_MAX {
        return Err(Error::new(ErrorKind::Limit, libc::ENAMETOOLONG, format!("path of {} bytes exceeds {META_PATH_BYTES_MAX}", path.len())));
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    if parts.contains(&"..") {
        return Err(Error::invalid(format!("path {path:?}: .. is not allowed")));
    }
    if let Some(long) = parts.iter().find(|p| p.len() > META_NAME_BYTES_MAX) {
        return Err(Error::new(ErrorKind::Limit, libc::ENAMETOOLONG, format!("a name of {} bytes exceeds {META_NAME_BYTES_MAX} (META_NAME_BYTES_MAX)", long.len())));
    }
    Ok(parts.join("/"))
}
