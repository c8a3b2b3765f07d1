//! A namespace entry of a cluster (a directory or a file and its
//! layout), and the path rules the metadata role and its clients share.

use serde::{Deserialize, Serialize};
use sluice_stripe::{Layout, LayoutRequest};

use crate::error::{Error, ErrorKind, Result};

/// Longest path the namespace accepts, in bytes.
pub const META_PATH_BYTES_MAX: usize = 4096;
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
}

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
