//! Collective array I/O planning, after Panda (seed `001`): the part of
//! "write the temperature array of timestep 40, distributed (BLOCK, BLOCK,
//! *) over 64 ranks" that needs no I/O.
//!
//! - [`Distribution`]: an array's shape spread over a process grid, one
//!   HPF distribution per dimension ([`Dist::Block`], [`Dist::Cyclic`],
//!   [`Dist::Star`]). It says which elements a rank holds and where they
//!   sit in its local, C-ordered memory.
//! - [`Layout`]: the array on disk as a Zarr v3 array, chunked and
//!   optionally sharded, with uncompressed chunks at fixed offsets, so
//!   every element has one file and one byte offset ([`Layout::locate`]).
//! - [`plan`]: from the two, the exact list of [`Piece`]s, each a run of
//!   bytes that is contiguous both in a rank's memory and in one file.
//! - [`place`]: which I/O server owns each file, as an assignment problem
//!   solved with the Hungarian algorithm (Panda's choice of I/O nodes).
//!
//! Like `sluice-core`, this crate does no I/O and reads no clock; the
//! `sluice array` command and the benchmark drive it.
//!
//! ```
//! use sluice_array::{plan, Dist, Distribution, Dtype, Layout, PlanLimits};
//! // A 4 x 6 array of f64 over a 2 x 1 grid, rows in BLOCK, columns whole.
//! let dist = Distribution::new(vec![4, 6], vec![2, 1], vec![Dist::Block, Dist::Star]).unwrap();
//! // On disk: chunks of 2 x 3, no shards.
//! let layout = Layout::new(vec![4, 6], Dtype::F64, vec![2, 3], None).unwrap();
//! let p = plan(&dist, &layout, &PlanLimits::default()).unwrap();
//! // Rank 0 holds rows 0-1: one run of 3 elements per row per chunk.
//! assert_eq!(p.rank(0).count(), 4);
//! assert_eq!(p.bytes(), 4 * 6 * 8);
//! ```

mod dist;
mod layout;
mod messages;
mod place;
mod plan;

pub use dist::{Dist, Distribution};
pub use layout::{Dtype, Layout, SHARD_INDEX_ENTRY_BYTES};
pub use messages::{group_base, rank_messages, GroupTag, Groups, Message};
pub use place::{aggregators, capacities, capacities_held, place, Placement, PlacementInput, PlacementMethod, PLACEMENT_HUNGARIAN_UNITS_MAX};
pub use plan::{gather, messages, plan, scatter, MessageLimits, Piece, Plan, PlanLimits};

/// The most dimensions an array may have. Zarr sets none; 8 covers every
/// array we know of and bounds the per-element index arithmetic.
pub const DIMS_MAX: usize = 8;

/// The most ranks a distribution may span (the exascale range of seed 004).
pub const RANKS_MAX: u64 = 1 << 20;

/// The most files (Zarr chunks, or shards) one array may have on disk.
pub const UNITS_MAX: u64 = 1 << 24;

/// Why an array description or a plan was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The description contradicts itself (ranks differ, zero extents, ...).
    Invalid,
    /// A named bound was passed.
    Limit,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error { kind: ErrorKind::Invalid, message: message.into() }
}

pub(crate) fn limit(message: impl Into<String>) -> Error {
    Error { kind: ErrorKind::Limit, message: message.into() }
}

/// Row-major (C order) coordinates of linear index `i` in `shape`.
pub fn unravel(mut i: u64, shape: &[u64]) -> Vec<u64> {
    let mut c = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        c[d] = i % shape[d];
        i /= shape[d];
    }
    c
}

/// Row-major (C order) linear index of coordinates `c` in `shape`.
pub fn ravel(c: &[u64], shape: &[u64]) -> u64 {
    c.iter().zip(shape).fold(0, |acc, (&x, &n)| acc * n + x)
}
