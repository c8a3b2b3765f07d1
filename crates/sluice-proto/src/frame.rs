//! The fixed frame header and the first decoding step: is the header
//! complete and sane?

use crate::error::{ProtoError, ProtoErrorKind};
use crate::HEADER_BYTES;

/// Every message type. Requests are below 0x80, responses at or above.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Opcode {
    Hello = 0x01,
    Open = 0x02,
    Close = 0x03,
    Read = 0x04,
    Write = 0x05,
    ReadList = 0x06,
    WriteList = 0x07,
    Fsync = 0x08,
    Fdatasync = 0x09,
    Ftruncate = 0x0a,
    Stat = 0x0b,
    Fstat = 0x0c,
    Unlink = 0x0d,
    Rename = 0x0e,
    Mkdir = 0x0f,
    Rmdir = 0x10,
    Readdir = 0x11,
    Stats = 0x12,
    Auth = 0x13,
    /// Ask for a shared-memory data region (answered `Count` with the
    /// region's memfd attached, Unix sockets only).
    ShmAttach = 0x14,
    /// A read whose data lands in the shared region (answered `Count`).
    ReadShm = 0x15,
    /// A write whose data is taken from the shared region.
    WriteShm = 0x16,
    /// A read that may be answered with a cache lease instead of data
    /// (`Lease`); otherwise as `ReadShm`.
    ReadLease = 0x17,
    /// `ReadList` as one participant of a collective (a [`crate::Group`]).
    ReadListGroup = 0x18,
    /// `WriteList` as one participant of a collective.
    WriteListGroup = 0x19,
    /// A write that may be answered with a write lease instead of being
    /// carried out (`Lease`); otherwise as `WriteShm`.
    WriteLease = 0x1a,
    /// "Look at my doorbell" (`crate::post`): requests wait in the
    /// connection's post records. No body, no answer.
    Nudge = 0x1b,
    /// `Stat` that does not follow a final symbolic link (answered
    /// `StatOk`).
    Lstat = 0x1c,
    /// A symbolic link's target (answered `Link`).
    Readlink = 0x1d,
    /// Reserve bytes at a file's end, for an `O_APPEND` write (answered
    /// `Count` with the offset where they start).
    Reserve = 0x1e,
    /// Make a symbolic link (answered `Ok`).
    Symlink = 0x1f,
    /// Change a file's mode or times (answered `Ok`).
    SetAttr = 0x20,
    /// The served file system's capacity and free space, as `statvfs(3)`
    /// gives it (answered `StatfsOk`).
    Statfs = 0x21,
    /// An operator's command on the service classes (answered `Text`):
    /// `list`, `stats`, `set` and a rules file, `rm CLASS`, `clear`.
    Qos = 0x22,
    HelloOk = 0x81,
    Ok = 0x82,
    Fd = 0x83,
    Data = 0x84,
    Count = 0x85,
    StatOk = 0x86,
    Dir = 0x87,
    StatsOk = 0x88,
    Challenge = 0x89,
    /// "Read this range yourself": it is in the page cache (see
    /// [`crate::Response::Lease`]).
    Lease = 0x8a,
    /// A symbolic link's target, as `readlink(2)` gives it.
    Link = 0x8b,
    /// The figures of `statvfs(3)` (see [`crate::WireStatfs`]).
    StatfsOk = 0x8c,
    /// Text for a person to read (the answer to `Qos`).
    Text = 0x8d,
    Error = 0xff,
}

const OPCODES: [Opcode; 48] = [
    Opcode::Hello,
    Opcode::Open,
    Opcode::Close,
    Opcode::Read,
    Opcode::Write,
    Opcode::ReadList,
    Opcode::WriteList,
    Opcode::Fsync,
    Opcode::Fdatasync,
    Opcode::Ftruncate,
    Opcode::Stat,
    Opcode::Fstat,
    Opcode::Unlink,
    Opcode::Rename,
    Opcode::Mkdir,
    Opcode::Rmdir,
    Opcode::Readdir,
    Opcode::Stats,
    Opcode::Auth,
    Opcode::ShmAttach,
    Opcode::ReadShm,
    Opcode::WriteShm,
    Opcode::ReadLease,
    Opcode::ReadListGroup,
    Opcode::WriteListGroup,
    Opcode::WriteLease,
    Opcode::Nudge,
    Opcode::Lstat,
    Opcode::Readlink,
    Opcode::Reserve,
    Opcode::Symlink,
    Opcode::SetAttr,
    Opcode::Statfs,
    Opcode::Qos,
    Opcode::HelloOk,
    Opcode::Ok,
    Opcode::Fd,
    Opcode::Data,
    Opcode::Count,
    Opcode::StatOk,
    Opcode::Dir,
    Opcode::StatsOk,
    Opcode::Challenge,
    Opcode::Lease,
    Opcode::Link,
    Opcode::StatfsOk,
    Opcode::Text,
    Opcode::Error,
];

impl Opcode {
    /// The opcode with this wire value, if any.
    pub fn from_u16(v: u16) -> Option<Opcode> {
        OPCODES.iter().copied().find(|&o| o as u16 == v)
    }

    /// Whether this opcode is a response (server to client).
    pub fn is_response(self) -> bool {
        self as u16 >= 0x80
    }
}

/// The fixed 16-byte header: `body_len: u32, opcode: u16, flags: u16,
/// request_id: u64`, all little-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub body_len: u32,
    pub opcode: Opcode,
    pub request_id: u64,
}

/// Step one of decoding: `Ok(None)` while fewer than [`HEADER_BYTES`] are
/// available; otherwise the header, refused when the frame would exceed
/// `frame_bytes_max` (header included), the opcode is unknown, or the
/// reserved flags are set. Call it before allocating the body.
pub fn check_header(buf: &[u8], frame_bytes_max: u32) -> Result<Option<Header>, ProtoError> {
    if buf.len() < HEADER_BYTES {
        return Ok(None);
    }
    let body_len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let op = u16::from_le_bytes([buf[4], buf[5]]);
    let flags = u16::from_le_bytes([buf[6], buf[7]]);
    let mut id = [0u8; 8];
    id.copy_from_slice(&buf[8..16]);
    let frame_bytes = u64::from(body_len) + HEADER_BYTES as u64;
    if frame_bytes > u64::from(frame_bytes_max) {
        let detail = format!("{frame_bytes} bytes > frame_bytes_max {frame_bytes_max}");
        return Err(ProtoError::new(ProtoErrorKind::TooLarge, detail));
    }
    let opcode = Opcode::from_u16(op).ok_or_else(|| ProtoError::new(ProtoErrorKind::UnknownOpcode, format!("0x{op:04x}")))?;
    if flags != 0 {
        return Err(ProtoError::new(ProtoErrorKind::BadFlags, format!("0x{flags:04x}")));
    }
    Ok(Some(Header { body_len, opcode, request_id: u64::from_le_bytes(id) }))
}

/// The request id of a whole header, whatever else is wrong with it: what
/// a server answers its error to when [`check_header`] refuses the frame.
pub fn request_id_of(header: &[u8; HEADER_BYTES]) -> u64 {
    u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"))
}

/// A data-protocol `Hello` as a reader of another length-prefixed protocol
/// sees it when it took the frame's first 4 bytes (the body length) as its
/// own length prefix: `rest` is what follows them (opcode, flags, request
/// id, then the `Hello` body, which starts with [`crate::MAGIC`]). Its
/// request id if it is one, so that the metadata role can answer a data
/// client in the client's own protocol.
pub fn hello_after_length(rest: &[u8]) -> Option<u64> {
    if rest.len() < HEADER_BYTES {
        return None;
    }
    let mut header = [0u8; HEADER_BYTES];
    header[4..].copy_from_slice(&rest[..HEADER_BYTES - 4]);
    let magic = rest[HEADER_BYTES - 4..HEADER_BYTES] == crate::MAGIC.to_le_bytes();
    match check_header(&header, u32::MAX) {
        Ok(Some(h)) if h.opcode == Opcode::Hello && magic => Some(h.request_id),
        _ => None,
    }
}

/// Append a header for a body of `body_len` bytes.
pub fn encode_header(opcode: Opcode, request_id: u64, body_len: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&body_len.to_le_bytes());
    out.extend_from_slice(&(opcode as u16).to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
}
