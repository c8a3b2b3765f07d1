//! Zarr v3 arrays on sluice.
//!
//! - [`SluiceStore`]: a store for the `zarrs` crate over a sluice address
//!   (one server or a cluster), so any Zarr v3 array, compressed or not,
//!   is read (and may be written) through the scheduler.
//! - [`collective`]: writes and reads of an array distributed over ranks,
//!   by the plan of `sluice-array`, with the independent and two-phase
//!   strategies.
//! - [`inspect`]: what `sluice array info|ls|cat|verify` show.
//!
//! sluice's own writer produces the fixed-offset subset of Zarr v3
//! (`sluice_array::Layout`), which zarr-python, xarray and zarrs read.

pub mod collective;
pub mod inspect;
pub mod migrate;
pub mod model;
mod store;

pub use store::{SluiceStore, STORE_LIST_KEYS_MAX};

use sluice_client::ClientError;

/// An error with its context, and the errno when the service gave one.
#[derive(Debug, Clone)]
pub struct Error {
    pub message: String,
    pub errno: Option<i32>,
}

impl Error {
    pub fn new(message: impl Into<String>) -> Error {
        Error { message: message.into(), errno: None }
    }

    pub fn client(what: &str, e: ClientError) -> Error {
        Error { message: format!("{what}: {e}"), errno: Some(e.posix_errno()) }
    }

    pub fn other(e: impl std::fmt::Display) -> Error {
        Error::new(e.to_string())
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<sluice_array::Error> for Error {
    fn from(e: sluice_array::Error) -> Error {
        Error::new(e.message)
    }
}
