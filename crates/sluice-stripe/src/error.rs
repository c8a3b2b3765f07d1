//! The crate's error type: a kind and a one-line message.

use std::fmt;

/// Why a layout or a mapping was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A layout parameter is out of range (stripe size, count, start).
    BadLayout,
    /// A mapping would exceed a named bound (`MAP_PIECES_MAX`) or overflow
    /// the 64-bit offset space.
    TooLarge,
}

/// An error from the layout arithmetic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
