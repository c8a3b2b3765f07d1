//! The decoder's error type: what was wrong with a frame, and the errno the
//! server answers it with.

use std::fmt;

/// What was wrong with the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProtoErrorKind {
    /// The body ended before a field did.
    Truncated,
    /// Bytes left over after the last field.
    TrailingBytes,
    /// A length prefix or count past its named bound.
    TooLarge,
    /// An opcode this version does not know, or a response where a request
    /// was expected (and the reverse).
    UnknownOpcode,
    /// Reserved header flags were not zero.
    BadFlags,
    /// A handshake with the wrong magic number.
    BadMagic,
    /// A handshake with a version this side does not speak.
    BadVersion,
    /// A string that is not UTF-8, or a field with an impossible value.
    Invalid,
    /// A path longer than [`crate::PATH_BYTES_MAX`]: refused at both ends,
    /// never cut (a cut path names another file).
    NameTooLong,
}

/// A malformed frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtoError {
    pub kind: ProtoErrorKind,
    pub detail: String,
}

impl ProtoError {
    pub fn new(kind: ProtoErrorKind, detail: impl Into<String>) -> ProtoError {
        ProtoError { kind, detail: detail.into() }
    }

    /// The POSIX errno a server replies with for this error.
    pub fn errno(&self) -> i32 {
        match self.kind {
            ProtoErrorKind::TooLarge => 90,      // EMSGSIZE
            ProtoErrorKind::UnknownOpcode => 38, // ENOSYS
            ProtoErrorKind::NameTooLong => 36,   // ENAMETOOLONG
            _ => 71,                             // EPROTO
        }
    }
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            ProtoErrorKind::Truncated => "truncated frame",
            ProtoErrorKind::TrailingBytes => "trailing bytes in frame",
            ProtoErrorKind::TooLarge => "frame field too large",
            ProtoErrorKind::UnknownOpcode => "unknown opcode",
            ProtoErrorKind::BadFlags => "reserved flags set",
            ProtoErrorKind::BadMagic => "bad handshake magic",
            ProtoErrorKind::BadVersion => "unsupported protocol version",
            ProtoErrorKind::Invalid => "invalid field",
            ProtoErrorKind::NameTooLong => "path too long",
        };
        write!(f, "{what}: {}", self.detail)
    }
}

impl std::error::Error for ProtoError {}
