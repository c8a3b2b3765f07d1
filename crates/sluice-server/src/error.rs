//! The server library's error type: a kind, an errno where the system gave
//! one, and a message. `errno()` is what a client sees on the wire.

use std::fmt;
use std::io;

/// Why an operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The configuration is unusable (bad address, missing root, bad policy).
    Config,
    /// A system call failed.
    Io,
    /// A path tried to leave the root (`..`, absolute, escaping symlink).
    PathEscape,
    /// A named bound was reached; the message names it.
    Limit,
    /// The request itself was invalid (bad fd, bad weight, bad name).
    Invalid,
}

/// An error from the server library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    /// The POSIX errno sent to the client.
    pub errno: i32,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, errno: i32, message: impl Into<String>) -> Error {
        Error { kind, errno, message: message.into() }
    }

    /// A failed system call on `what` (a path, or an operation name).
    pub fn io(what: &str, e: &io::Error) -> Error {
        let errno = e.raw_os_error().unwrap_or(libc::EIO);
        Error::new(ErrorKind::Io, errno, format!("{what}: {}", io::Error::from_raw_os_error(errno)))
    }

    /// A named bound was reached.
    pub fn limit(errno: i32, message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Limit, errno, message)
    }

    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Invalid, libc::EINVAL, message)
    }

    pub fn config(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Config, libc::EINVAL, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// The library's result type.
pub type Result<T> = std::result::Result<T, Error>;
