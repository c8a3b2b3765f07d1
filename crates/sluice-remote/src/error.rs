//! The crate's error type: a kind, the errno a POSIX caller should see,
//! and a one-line message.

use std::fmt;

/// Why a cluster call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// No such file or directory in the namespace.
    NotFound,
    /// The path exists already.
    Exists,
    /// A path component is not a directory, or a directory was expected.
    NotDir,
    /// A file was expected and the path is a directory.
    IsDir,
    /// Bad argument: path, layout, buffer.
    Invalid,
    /// A named bound was reached.
    Limit,
    /// The metadata database failed.
    Store,
    /// The metadata role is unreachable or answered garbage.
    Meta,
    /// A data server is unreachable, died, or refused an object operation.
    DataServer,
    /// A local system call failed.
    Io,
}

/// An error from the cluster library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub errno: i32,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, errno: i32, message: impl Into<String>) -> Error {
        Error { kind, errno, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Invalid, libc::EINVAL, message)
    }

    pub fn io(what: &str, e: &std::io::Error) -> Error {
        Error::new(ErrorKind::Io, e.raw_os_error().unwrap_or(libc::EIO), format!("{what}: {e}"))
    }

    pub fn store(e: impl std::fmt::Display) -> Error {
        Error::new(ErrorKind::Store, libc::EIO, format!("metadata database: {e}"))
    }

    /// The POSIX errno equivalent.
    pub fn errno(&self) -> i32 {
        self.errno
    }
}

impl From<sluice_stripe::Error> for Error {
    fn from(e: sluice_stripe::Error) -> Error {
        let kind = match e.kind {
            sluice_stripe::ErrorKind::BadLayout => ErrorKind::Invalid,
            sluice_stripe::ErrorKind::TooLarge => ErrorKind::Limit,
        };
        Error::new(kind, libc::EINVAL, e.message)
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
