//! # sluice-stripe: layout arithmetic for striped files
//!
//! A striped file is cut into stripes of `stripe_bytes`; stripe `i` lives
//! in object `i % count`, at object offset `(i / count) * stripe_bytes`,
//! and object `k` lives on data server `(start + k) % servers` (Lustre's
//! RAID-0 layout). This crate maps a file byte range, or a list of ranges
//! (list I/O), onto object pieces, groups them per object (one message per
//! server: SFIO's message combining), cuts each group into messages that
//! fit the wire bounds, and maps object offsets back. It does no I/O.
//!
//! ```
//! use sluice_stripe::{Layout, group};
//!
//! let l = Layout::new(4096, 2, 0, 3).unwrap();
//! let loc = l.locate(5000);
//! assert_eq!((loc.object, loc.server, loc.object_offset), (1, 1, 904));
//! assert_eq!(l.logical(loc.object, loc.object_offset), 5000);
//! let pieces = l.map_list(&[(0, 10_000)]).unwrap();
//! let per_object = group(&pieces);
//! assert_eq!(per_object.len(), 2);
//! ```
//!
//! Invariant: the pieces of a mapping cover exactly the requested bytes,
//! once each, in request order (property-tested in `tests/layout.rs`).

mod error;
mod layout;
mod map;

pub use error::{Error, ErrorKind, Result};
pub use layout::{Layout, LayoutRequest, COUNT_ALL, SERVERS_MAX, STRIPE_BYTES_DEFAULT, STRIPE_BYTES_MAX, STRIPE_UNIT_BYTES};
pub use map::{chunk, file_size, group, object_size_for, Loc, ObjectList, Piece, MAP_PIECES_MAX};
