//! The client's error type: a kind, the POSIX errno a caller (FUSE, the
//! interposer) should report, and a one-line message.

use std::fmt;

/// Why a call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientErrorKind {
    /// No server answered at the address.
    Connect,
    /// The connection broke (server died or closed it); requests that were
    /// in flight fail with this, errno EIO.
    Disconnected,
    /// The server answered with an error (errno and message from it).
    Server,
    /// The server sent bytes this client cannot decode, or refused the
    /// handshake.
    Protocol,
    /// The server did not answer within the client's `--timeout` and the
    /// client is soft: errno ETIMEDOUT.
    Timeout,
    /// The file behind a handle is gone since the server restarted (its
    /// path no longer opens): errno ESTALE.
    Stale,
    /// The call was invalid before reaching the server (bad address, bad
    /// whence, buffer too small).
    Invalid,
    /// The call was given up while it waited for the server, because its
    /// thread's check said its caller is gone (`Abandon`): errno EINTR.
    Interrupted,
}

/// An error from the client library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientError {
    pub kind: ClientErrorKind,
    pub errno: i32,
    pub message: String,
}

impl ClientError {
    pub fn new(kind: ClientErrorKind, errno: i32, message: impl Into<String>) -> ClientError {
        ClientError { kind, errno, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> ClientError {
        ClientError::new(ClientErrorKind::Invalid, libc::EINVAL, message)
    }

    /// The POSIX errno equivalent.
    pub fn errno(&self) -> i32 {
        self.errno
    }

    /// The errno a POSIX caller sees: the one conversion every front end
    /// (the mount, the interposer, the Python package) uses. A socket that
    /// is not there reads as ECONNREFUSED rather than a confusing ENOENT
    /// (which would look like the caller's own file missing); an error
    /// without an errno (a protocol fault) is EIO.
    pub fn posix_errno(&self) -> i32 {
        match (self.kind, self.errno) {
            (ClientErrorKind::Connect, libc::ENOENT) => libc::ECONNREFUSED,
            (_, n) if n > 0 => n,
            _ => libc::EIO,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ClientError {}

/// The library's result type.
pub type Result<T> = std::result::Result<T, ClientError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posix_errno_table() {
        let e = |kind, errno| ClientError { kind, errno, message: String::new() };
        for (kind, errno, want) in [
            (ClientErrorKind::Connect, libc::ENOENT, libc::ECONNREFUSED),
            (ClientErrorKind::Connect, libc::ECONNREFUSED, libc::ECONNREFUSED),
            (ClientErrorKind::Server, libc::ENOENT, libc::ENOENT),
            (ClientErrorKind::Server, libc::ENOSPC, libc::ENOSPC),
            (ClientErrorKind::Protocol, 0, libc::EIO),
            (ClientErrorKind::Server, -1, libc::EIO),
        ] {
            assert_eq!(e(kind, errno).posix_errno(), want, "{kind:?} {errno}");
        }
    }
}
