//! Admission: what a request after the handshake asks for (`decode`), and
//! whether a read or write is scheduled, waits or is refused (`admit`).
//! Both are pure functions of the decoded request and of the state they
//! are shown (`Seen`), so they are tested here without a socket; the
//! loop carries out what they decide (`request.rs`).

use sluice_core::{FileId, Op};
use sluice_proto::{Group, Request, HEADER_BYTES, LEASE_ONLY_AT, NO_POST};

use crate::collective::Collectives;

/// Bytes reserved against `reply_bytes_max` for the frame of each admitted
/// message's reply, besides its data: the largest reply without data (an
/// error with the longest message).
pub const REPLY_FRAME_BYTES: u64 = (HEADER_BYTES + 8 + sluice_proto::MESSAGE_BYTES_MAX) as u64;

/// A read or write message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Io {
    /// The connection's file handle.
    pub fd: u64,
    pub op: Op,
    /// `(offset, len)` of each piece, in the message's order.
    pub pieces: Vec<(u64, u64)>,
    /// A write's data: where it starts in the frame body.
    pub data_at: Option<usize>,
    /// Data in the connection's shared region: where, and the post record
    /// to answer in (`NO_POST`: the socket).
    pub shm_at: Option<(u64, u32)>,
    /// A participant of a server-directed collective.
    pub group: Option<Group>,
    /// A list message: answered once, when every piece is done.
    pub list: bool,
    /// A `ReadLease` not granted at once: answered with a lease once its
    /// dispatch has brought the range into the page cache.
    pub lease_after: bool,
}

impl Io {
    fn one(fd: u64, op: Op, offset: u64, len: u64) -> Io {
        Io { fd, op, pieces: vec![(offset, len)], data_at: None, shm_at: None, group: None, list: false, lease_after: false }
    }

    /// Bytes of data, all pieces together.
    pub fn total(&self) -> u64 {
        self.pieces.iter().map(|p| p.1).sum()
    }

    /// The post record to answer in (`NO_POST`: none).
    pub fn post(&self) -> u32 {
        self.shm_at.map_or(NO_POST, |(_, post)| post)
    }
}

/// What a request after the handshake asks for.
#[derive(Debug)]
pub enum Asked {
    /// A read or write to admit.
    Io(Io),
    /// A cache lease, granted now if it can be (`leases.rs`); otherwise
    /// the read or write `Io` goes through the scheduler, unless `only`
    /// (a `WriteLease` sent without its data), which is refused.
    Lease { io: Io, len: u32, only: bool },
    /// A shared-memory region of this many bytes.
    Attach(u64),
    /// The client rang its doorbell.
    Nudge,
    /// A metadata call answered on the loop (`ops::runs_inline`).
    Inline,
    /// A metadata call that may block: to the metadata pool.
    Pool,
    /// A protocol error: answered, then the connection is closed.
    Close(i32, String),
}

/// What `request` asks for; `body_len`: its frame body's length (a
/// write's data ends the body).
pub fn decode(req: Request<'_>, body_len: usize) -> Asked {
    let write_at = |data: &[u8]| Some(body_len - data.len());
    match req {
        Request::Hello(_) => Asked::Close(libc::EPROTO, "handshake already done".into()),
        Request::Read { fd, offset, len } => Asked::Io(Io::one(fd, Op::Read, offset, u64::from(len))),
        Request::ReadList { fd, pieces, group } => Asked::Io(Io { pieces, group, list: true, ..Io::one(fd, Op::Read, 0, 0) }),
        Request::Write { fd, offset, data } => Asked::Io(Io { data_at: write_at(data), ..Io::one(fd, Op::Write, offset, data.len() as u64) }),
        Request::WriteList { fd, pieces, data, group } => Asked::Io(Io { pieces, group, list: true, data_at: write_at(data), ..Io::one(fd, Op::Write, 0, 0) }),
        Request::ReadShm { fd, offset, len, at, post } => Asked::Io(Io { shm_at: Some((at, post)), ..Io::one(fd, Op::Read, offset, u64::from(len)) }),
        Request::WriteShm { fd, offset, len, at, post } => Asked::Io(Io { shm_at: Some((at, post)), ..Io::one(fd, Op::Write, offset, u64::from(len)) }),
        Request::ReadLease { fd, offset, len, at, post } => Asked::Lease { io: Io { shm_at: Some((at, post)), ..Io::one(fd, Op::Read, offset, u64::from(len)) }, len, only: false },
        Request::WriteLease { fd, offset, len, at, post } => {
            Asked::Lease { io: Io { shm_at: Some((at, post)), ..Io::one(fd, Op::Write, offset, u64::from(len)) }, len, only: at == LEASE_ONLY_AT }
        }
        Request::ShmAttach { bytes } => Asked::Attach(bytes),
        Request::Nudge => Asked::Nudge,
        other if crate::ops::runs_inline(&other) => Asked::Inline,
        _ => Asked::Pool,
    }
}

/// The state admission looks at, shown to it explicitly.
pub struct Seen<'a, T> {
    /// Reply bytes the connection holds now, and their bound.
    pub held: u64,
    pub reply_bytes_max: u64,
    /// Bytes its user's share and the server's budget both leave
    /// (`fair::room`).
    pub room: u64,
    /// Messages the connection has in flight, and their bound.
    pub inflight: u32,
    pub inflight_max: u32,
    /// The connection's shared region: its length and whether it has a
    /// post area.
    pub region: Option<(u64, bool)>,
    /// The handle's file and its access mode (`O_RDONLY`, `O_WRONLY` or
    /// `O_RDWR`), or why the handle is bad.
    pub file: Result<(FileId, i32), (i32, String)>,
    pub collectives: &'a Collectives<T>,
    /// Complete collectives waiting for room: their number, and their
    /// bytes of write data.
    pub ready: (usize, u64),
}

/// What becomes of a read or write message.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    /// Into the scheduler (or its collective): `reserved` reply bytes are
    /// taken for it, and its `total` bytes of data lie where `Io` says.
    Schedule { file: FileId, total: u64, reserved: u64 },
    /// Not now: the connection holds too many reply bytes. The frame waits
    /// until `need` more fit (or none are held).
    Wait { need: u64 },
    /// Not now: its user's share or the server's budget has no room for
    /// `need` bytes; the frame waits until they fit.
    Starve { need: u64 },
    /// Answered at once with an error (and its post record says so).
    Refuse { errno: i32, msg: String },
}

/// Admit `io`, shown `seen`.
pub fn admit<T>(io: &Io, seen: &Seen<'_, T>) -> Admission {
    let total = io.total();
    // Data in the shared region never passes the socket: only the reply
    // frame is reserved.
    let reserved = REPLY_FRAME_BYTES + if io.shm_at.is_some() { 0 } else { total };
    if seen.held > 0 && seen.held + reserved > seen.reply_bytes_max {
        return Admission::Wait { need: reserved };
    }
    if reserved > seen.room {
        return Admission::Starve { need: reserved };
    }
    let refuse = |errno: i32, msg: String| Admission::Refuse { errno, msg };
    if let Some((at, post)) = io.shm_at {
        match seen.region {
            Some((len, false)) if post != NO_POST => return refuse(libc::EINVAL, format!("post record {post} on a shared region of {len} bytes, too small for a post area")),
            Some((len, _)) if at.checked_add(total).is_none_or(|end| end > len) => {
                return refuse(libc::EINVAL, format!("region range {at}+{total} outside the shared region of {len} bytes"))
            }
            Some(_) => {}
            None => return refuse(libc::EINVAL, "no shared-memory region on this connection (ShmAttach first)".into()),
        }
    }
    if seen.inflight >= seen.inflight_max {
        return refuse(libc::EAGAIN, format!("too many requests in flight on this connection (inflight_per_connection_max = {})", seen.inflight_max));
    }
    let (file, access) = match &seen.file {
        Ok(f) => *f,
        Err((errno, msg)) => return refuse(*errno, msg.clone()),
    };
    let need = if io.op == Op::Write { libc::O_WRONLY } else { libc::O_RDONLY };
    if access != libc::O_RDWR && access != need {
        return refuse(libc::EBADF, format!("file handle {} is not open for {}", io.fd, if io.op == Op::Write { "writing" } else { "reading" }));
    }
    if let Some(g) = &io.group {
        let held_bytes = if io.op == Op::Write { total } else { 0 };
        if let Err((errno, msg)) = seen.collectives.check((file, g.id), g, io.op, held_bytes, seen.ready) {
            return refuse(errno, msg);
        }
    }
    Admission::Schedule { file, total, reserved }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::CollectiveLimits;

    const MAX: u64 = 1 << 20;

    fn seen(c: &Collectives<()>) -> Seen<'_, ()> {
        Seen { held: 0, reply_bytes_max: MAX, room: u64::MAX, inflight: 0, inflight_max: 4, region: None, file: Ok((FileId(1), libc::O_RDWR)), collectives: c, ready: (0, 0) }
    }

    fn table() -> Collectives<()> {
        Collectives::new(CollectiveLimits { groups_max: 1, bytes_max: 100, wait_ms_max: 10 })
    }

    fn read(len: u64) -> Io {
        Io::one(3, Op::Read, 0, len)
    }

    #[test]
    fn a_read_is_scheduled_with_its_data_and_reply_frame_reserved() {
        let c = table();
        assert_eq!(admit(&read(4096), &seen(&c)), Admission::Schedule { file: FileId(1), total: 4096, reserved: REPLY_FRAME_BYTES + 4096 });
        let shm = Io { shm_at: Some((0, NO_POST)), ..read(4096) };
        let s = Seen { region: Some((4096, false)), ..seen(&c) };
        assert_eq!(admit(&shm, &s), Admission::Schedule { file: FileId(1), total: 4096, reserved: REPLY_FRAME_BYTES }, "shared-memory data is not reserved");
    }

    #[test]
    fn reply_bytes_bound_at_n_and_n_plus_one() {
        let c = table();
        let io = read(4096);
        let reserved = REPLY_FRAME_BYTES + 4096;
        let at = |held| admit(&io, &Seen { held, ..seen(&c) });
        assert!(matches!(at(MAX - reserved), Admission::Schedule { .. }), "N: exactly the bound");
        assert_eq!(at(MAX - reserved + 1), Admission::Wait { need: reserved }, "N+1: waits");
        // A message larger than the bound is admitted alone.
        assert!(matches!(admit(&read(2 * MAX), &seen(&c)), Admission::Schedule { .. }));
    }

    #[test]
    fn the_user_s_and_server_s_room_at_n_and_n_plus_one() {
        let c = table();
        let io = read(4096);
        let reserved = REPLY_FRAME_BYTES + 4096;
        let at = |room| admit(&io, &Seen { room, ..seen(&c) });
        assert!(matches!(at(reserved), Admission::Schedule { .. }), "N: exactly the room left");
        assert_eq!(at(reserved - 1), Admission::Starve { need: reserved }, "N+1: waits for room");
        // Unlike its own bound, a connection holding nothing waits too:
        // the budgets are never passed.
        assert_eq!(admit(&io, &Seen { held: 0, room: 0, ..seen(&c) }), Admission::Starve { need: reserved });
    }

    #[test]
    fn inflight_bound_at_n_and_n_plus_one() {
        let c = table();
        assert!(matches!(admit(&read(1), &Seen { inflight: 3, ..seen(&c) }), Admission::Schedule { .. }), "the 4th of 4");
        let Admission::Refuse { errno, .. } = admit(&read(1), &Seen { inflight: 4, ..seen(&c) }) else { panic!("the 5th is refused") };
        assert_eq!(errno, libc::EAGAIN);
    }

    #[test]
    fn bad_handles_and_access_are_refused() {
        let c = table();
        let bad = Seen { file: Err((libc::EBADF, "bad file handle 3".into())), ..seen(&c) };
        assert_eq!(admit(&read(1), &bad), Admission::Refuse { errno: libc::EBADF, msg: "bad file handle 3".into() });
        let wronly = Seen { file: Ok((FileId(1), libc::O_WRONLY)), ..seen(&c) };
        assert!(matches!(admit(&read(1), &wronly), Admission::Refuse { errno: libc::EBADF, .. }));
        let write = Io { op: Op::Write, ..read(1) };
        assert!(matches!(admit(&write, &wronly), Admission::Schedule { .. }));
    }

    #[test]
    fn shared_memory_ranges_are_checked() {
        let c = table();
        let io = |at, post| Io { shm_at: Some((at, post)), ..read(4096) };
        let refused = |io: &Io, region| matches!(admit(io, &Seen { region, ..seen(&c) }), Admission::Refuse { errno: libc::EINVAL, .. });
        assert!(refused(&io(0, NO_POST), None), "no region");
        assert!(!refused(&io(4096, NO_POST), Some((8192, false))), "the last slot");
        assert!(refused(&io(4097, NO_POST), Some((8192, false))), "one byte past");
        assert!(refused(&io(u64::MAX, NO_POST), Some((8192, false))), "overflow");
        assert!(refused(&io(0, 1), Some((8192, false))), "a post record without a post area");
        assert!(!refused(&io(0, 1), Some((8192, true))));
    }

    #[test]
    fn a_collective_past_its_table_is_refused() {
        let c = table();
        let g = |id| Some(Group { id, participants: 2, wait_ms: 5 });
        assert!(matches!(admit(&Io { group: g(1), ..read(1) }, &seen(&c)), Admission::Schedule { .. }), "the first group");
        let full = Seen { ready: (1, 0), ..seen(&c) };
        assert!(matches!(admit(&Io { group: g(2), ..read(1) }, &full), Admission::Refuse { errno: libc::EAGAIN, .. }), "collectives_max = 1 held");
    }

    #[test]
    fn decoding_names_what_each_request_asks_for() {
        let data = [7u8; 10];
        match decode(Request::Write { fd: 3, offset: 8, data: &data }, 30) {
            Asked::Io(io) => assert_eq!((io.op, io.pieces, io.data_at, io.list), (Op::Write, vec![(8, 10)], Some(20), false)),
            other => panic!("{other:?}"),
        }
        match decode(Request::ReadList { fd: 3, pieces: vec![(0, 1), (9, 2)], group: None }, 0) {
            Asked::Io(io) => assert_eq!((io.total(), io.list, io.post()), (3, true, NO_POST)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(decode(Request::WriteLease { fd: 3, offset: 0, len: 1, at: LEASE_ONLY_AT, post: NO_POST }, 0), Asked::Lease { only: true, .. }));
        assert!(matches!(decode(Request::Stats, 0), Asked::Inline));
        assert!(matches!(decode(Request::Nudge, 0), Asked::Nudge));
        assert!(matches!(decode(Request::Fsync { fd: 3 }, 0), Asked::Pool));
    }
}
