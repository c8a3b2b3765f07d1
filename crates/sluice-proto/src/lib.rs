//! # sluice-proto: the sluice wire protocol
//!
//! Only this crate knows the bytes on the wire. A connection starts with a
//! versioned handshake (`Hello` / `HelloOk`), then carries frames: a
//! 16-byte [`Header`] (body length, opcode, flags, request id) followed by
//! the body. Many requests may be in flight per connection; responses carry
//! the request id they answer and may come back in any order. Errors are a
//! POSIX errno plus a message. The full description is `docs/protocol.md`.
//!
//! Decoding is two-step, as in mini-redis: [`check_header`] looks at the
//! fixed header only and refuses anything insane (unknown opcode, flags
//! set, a length past the caller's `frame_bytes_max`) *before* the caller
//! allocates the body; [`parse_request`] / [`parse_response`] then parse a
//! complete body, capping every inner length before use.
//!
//! ```
//! use sluice_proto::*;
//!
//! let mut wire = Vec::new();
//! encode_request(7, &Request::Read { fd: 3, offset: 4096, len: 4096 }, &mut wire);
//! let h = check_header(&wire, FRAME_BYTES_MAX).unwrap().expect("complete header");
//! assert_eq!((h.request_id, h.body_len as usize), (7, wire.len() - HEADER_BYTES));
//! let req = parse_request(&h, &wire[HEADER_BYTES..]).unwrap();
//! assert_eq!(req, Request::Read { fd: 3, offset: 4096, len: 4096 });
//! ```
//!
//! Invariant: decoding never panics and never allocates more than the
//! declared, already-capped lengths; every limit is a named constant.

mod auth;
mod error;
mod frame;
pub mod meta;
mod msg;
mod wire;

pub use auth::{auth_mac, auth_verify, proof_mac, proof_verify};
pub use error::{ProtoError, ProtoErrorKind};
pub use frame::{check_header, encode_header, hello_after_length, request_id_of, Header, Opcode};
pub use msg::{
    encode_request, encode_request_head, encode_response, encode_response_head, parse_request, parse_response, AppStats, Cred, DirEntry, FileKind, Group, Hello, HelloOk, Request,
    Response, WireStat, WireStatfs, SETATTR_BY_PATH, SETATTR_MODE_KEEP, SETATTR_TIME_NOW, SETATTR_TIME_OMIT,
};

/// Protocol version spoken by this crate; the handshake refuses others.
/// 2: `Hello` carries an optional identity; `Challenge`/`Auth`.
/// 3: shared-memory data (`ShmAttach`, `ReadShm`, `WriteShm`).
/// 4: cache leases (`ReadLease`, `Lease`); `AppStats::bytes_leased`.
/// 5: server-directed collectives (`ReadListGroup`, `WriteListGroup`).
/// 6: write leases (`WriteLease`).
/// 7: posted answers (`post` on `ReadShm`, `WriteShm`, `ReadLease`,
///    `WriteLease`; the records of [`post`]).
/// 8: rung requests (a shared-memory request written into its post
///    record and rung on the region's doorbell; `Nudge`); `POSTS_MAX` 63.
/// 9: the doorbell's `leased_bytes` (bytes the client wrote itself under
///    write leases, counted as written); servers grant write leases by
///    default.
/// 10: `Lstat` and `Readlink`, and the `Link` response (symbolic links
///    are links to the mount and the interposer).
/// 11: `Reserve` (`O_APPEND` writes from many clients never overlap);
///    `Symlink`; `SetAttr`; `Fd` carries the file's inode number.
/// 12: a write lease covers the whole file; a `WriteLease` at
///    [`LEASE_ONLY_AT`] asks for one without its data.
/// 13: `Statfs` and the `StatfsOk` response (`statfs(2)` through the
///    mount and the interposer gives the served file system's figures).
/// 14: the key proof runs both ways: `Auth` carries the client's nonce,
///    and the `HelloOk` that answers it the server's proof
///    ([`proof_mac`]).
pub const VERSION: u16 = 15;
/// First four bytes of a `Hello` body: "SLCE".
pub const MAGIC: u32 = 0x4543_4c53;
/// Bytes of the fixed frame header.
pub const HEADER_BYTES: usize = 16;
/// Largest data payload of one read or write, and of one list I/O message,
/// in bytes. 64 MiB: the scheduling core's `request_bytes_max`.
pub const IO_BYTES_MAX: u32 = 64 << 20;
/// Largest frame (header + body) a peer may send, in bytes, unless a
/// smaller bound is configured: one full I/O payload plus 64 KiB for the
/// fixed fields and a list of pieces.
pub const FRAME_BYTES_MAX: u32 = IO_BYTES_MAX + (64 << 10);
/// `post` of a shared-memory request answered on the socket.
pub const NO_POST: u32 = u32::MAX;
/// `at` of a `WriteLease` that carries no data and asks only for the
/// lease: granted, it is answered `Lease` as any; refused, with an error
/// (EOPNOTSUPP: this server grants no write leases; EAGAIN: not for this
/// handle), and nothing is written. The client then sends the write.
pub const LEASE_ONLY_AT: u64 = u64::MAX;
/// Bytes at the end of a shared-memory region that hold its post records
/// (one page), and of one record (a cache line, so that two clients'
/// threads waiting on neighbouring records do not share one).
pub const POST_AREA_BYTES: u64 = 4096;
/// Bytes of one slot of a shared-memory region: a client cuts its region
/// (less the post area) into slots, and the server grants tapered regions
/// in whole slots.
pub const SHM_SLOT_BYTES: u64 = 1 << 20;
pub const POST_RECORD_BYTES: u64 = 64;
/// Records in the post area: a request's `post` is below this. The
/// area's last record is the doorbell (`post::doorbell_at`).
pub const POSTS_MAX: u32 = (POST_AREA_BYTES / POST_RECORD_BYTES) as u32 - 1;

/// The post records: where the server answers a shared-memory request that
/// named it (`post`), instead of sending a `Count` on the socket, and
/// where a client may leave such a request instead of sending it (a rung
/// request). Record `k` lies at `region_len - POST_AREA_BYTES + k *
/// POST_RECORD_BYTES`.
///
/// | offset | field | |
/// |---|---|---|
/// | 0 | `state`, u32 | a futex word: one of the `POST_*` states |
/// | 4 | `op`, u32 | a rung request: one of the `RUNG_*` kinds |
/// | 8 | `id`, u64 | the request id (the client's), answered with it |
/// | 16 | `count`, u64 | bytes read or written (`POST_COUNTED`) |
/// | 24 | `fd`, u64 | a rung request's file handle |
/// | 32 | `offset`, u64 | its file offset |
/// | 40 | `at`, u64 | where its data lies in the region |
/// | 48 | `len`, u32 | its length |
///
/// **Answers.** The client sets `POST_PENDING` before sending and
/// `POST_SLEEPING` before it sleeps on the word (`FUTEX_WAIT`); the server
/// writes `id` and `count`, then swaps in `POST_COUNTED` (or
/// `POST_ON_SOCKET`: the answer, an error or a lease, comes on the socket
/// as before) and wakes the word only if it found `POST_SLEEPING`.
///
/// **Rung requests.** The area's last record is the doorbell: `mask`, a
/// u64 at 0 (bit `k`: record `k` holds a request not yet taken), and
/// `watched`, a u32 at 8 (1 while the server looks at the mask on every
/// turn of its loop). A client writes a `ReadShm`, `WriteShm`,
/// `ReadLease` or `WriteLease` into the record its `post` names (`op`,
/// `id`, `fd`, `offset`, `at`, `len`; the state `POST_PENDING`), sets the record's bit in `mask` (a sequentially
/// consistent read-modify-write), then reads `watched`: at 0 it sends a
/// `Nudge` frame. The server clears `watched` before it sleeps and then
/// reads every watched mask once more, so either it sees the bit or the
/// client sees 0 and nudges. The server takes a mask by swapping in 0 and
/// treats each record it names as that request arriving on the socket
/// (parsed and checked the same way). Whatever a client writes in its
/// own records spoils only its own requests.
///
/// **Leased writes.** `leased_bytes`, a u64 at 16 of the doorbell, is the
/// bytes the client has written itself under write leases on this
/// connection, a count that only grows (relaxed adds). The server adds
/// what it grew by to the application's `bytes_written` when it grants a
/// lease, answers `Stats`, renders its metrics and when the connection
/// closes: leased writes are counted as the client reports them (a client
/// that misreports misreports only its own application).
pub mod post {
    pub const STATE: usize = 0;
    pub const OP: usize = 4;
    pub const ID: usize = 8;
    pub const COUNT: usize = 16;
    pub const FD: usize = 24;
    pub const OFFSET: usize = 32;
    pub const AT: usize = 40;
    pub const LEN: usize = 48;
    pub const POST_PENDING: u32 = 0;
    pub const POST_SLEEPING: u32 = 1;
    pub const POST_COUNTED: u32 = 2;
    pub const POST_ON_SOCKET: u32 = 3;
    pub const RUNG_READ: u32 = 1;
    pub const RUNG_WRITE: u32 = 2;
    pub const RUNG_READ_LEASE: u32 = 3;
    pub const RUNG_WRITE_LEASE: u32 = 4;
    /// The doorbell's words (offsets in its record).
    pub const MASK: usize = 0;
    pub const WATCHED: usize = 8;
    pub const LEASED_BYTES: usize = 16;

    /// Where record `k` lies in a region of `region_len` bytes (which
    /// holds the area, and `k` below `POSTS_MAX`).
    pub fn record_at(region_len: usize, k: u32) -> usize {
        region_len - super::POST_AREA_BYTES as usize + k as usize * super::POST_RECORD_BYTES as usize
    }

    /// Where the doorbell lies: the area's last record.
    pub fn doorbell_at(region_len: usize) -> usize {
        region_len - super::POST_RECORD_BYTES as usize
    }
}
/// Longest relative path, in bytes: Linux's PATH_MAX.
pub const PATH_BYTES_MAX: usize = 4096;
/// Longest `Qos` command and `Text` answer: 60 KiB (a `u16`-prefixed
/// string); a larger rules file goes to `sluice serve --qos` and SIGHUP.
pub const QOS_TEXT_BYTES_MAX: usize = 60 << 10;
/// Bytes of a challenge nonce, of the shared key, and of an `Auth` MAC
/// (HMAC-SHA256).
pub const AUTH_BYTES: usize = 32;
/// Most supplementary groups an identity may carry. 256: well past the
/// 16 of NFS's AUTH_SYS, and a bound on the handshake's size.
pub const CRED_GROUPS_MAX: usize = 256;
/// Longest application name, in bytes.
pub const APP_NAME_BYTES_MAX: usize = 256;
/// Largest frame (header included) a server takes before the handshake
/// is done: a `Hello` with the longest name and `CRED_GROUPS_MAX` groups
/// fits (about 1.3 KiB), and so does an `Auth`. A peer that has proven
/// nothing cannot make the server reserve a large body.
pub const HANDSHAKE_FRAME_BYTES_MAX: u32 = 4096;
/// Longest error message, in bytes; longer ones are cut on a char boundary.
pub const MESSAGE_BYTES_MAX: usize = 1024;
/// Most `(offset, length)` pieces in one list I/O message (16 B each).
pub const LIST_PIECES_MAX: usize = 4096;
/// Participants of one collective group (a `Group` on a list message).
pub const GROUP_PARTICIPANTS_MAX: u32 = 1 << 16;
/// Most directory entries in one `Dir` response; clients page with `start`.
pub const DIR_ENTRIES_MAX: usize = 1024;
/// Most applications in one `Stats` response.
pub const STATS_APPS_MAX: usize = 4096;
/// Latency histogram buckets: bucket i counts latencies in
/// `[2^i, 2^(i+1))` microseconds (bucket 0 also holds < 1 us).
pub const LATENCY_BUCKETS: usize = 32;

#[cfg(test)]
mod doc_tests {
    /// docs/protocol.md states the version a `Hello` must carry, in its
    /// title and in the `Hello`'s fields: both must be `VERSION`.
    #[test]
    fn the_protocol_document_states_this_version() {
        let doc = include_str!("../../../docs/protocol.md");
        let title = doc.lines().next().unwrap_or("");
        assert_eq!(title, format!("# The sluice wire protocol (version {})", super::VERSION), "docs/protocol.md's title");
        let hello = format!("`version: u16 = {}` (`sluice_proto::VERSION`)", super::VERSION);
        assert!(doc.contains(&hello), "docs/protocol.md's Hello must say {hello}");
        assert_eq!(doc.matches("`version: u16 = ").count(), 1, "the Hello's version is stated once");
    }
}
