//! The crate's error type: a kind and a one-line message. Only the model
//! file can fail; the service-time models cannot.

use std::fmt;

/// Why loading a device model file failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file could not be read.
    Read,
    /// The text is not a model file (bad TOML, a missing or unknown field).
    Parse,
    /// A field is out of its range.
    Invalid,
}

/// An error from the device crate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error { kind, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}
