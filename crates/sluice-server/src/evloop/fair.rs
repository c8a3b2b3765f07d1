//! Fair shares between users: how many connections and bytes each uid
//! holds (`Uids`), whether a newcomer takes a slot, takes one from the
//! user holding the most, or is refused (`place`, pure), and how many
//! bytes a connection may still take (`room`, pure); and how a socket that
//! is not kept is told why (`send_reason`).
//!
//! Root and the server's own user ("privileged") have no per-user limit
//! and may take the `clients_reserved` slots no one else can; everyone
//! else is held to `conns_per_uid_max` connections and `uid_bytes_max`
//! bytes. When the table is full, a newcomer closes the idle connection
//! (nothing in flight, nothing unsent) that has been silent longest of the
//! user holding the most connections, if that user holds more than the
//! newcomer's own (so a flood of silent connections gives way, and two
//! users at equal shares do not close each other's).
//!
//! Bounds: one entry per uid with a connection, so at most `clients_max`
//! entries; each entry's counts are the sums over its connections.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// One user's share.
struct UidUse {
    conns: u32,
    /// Bytes its connections hold (`Conn::take`, `Conn::uid_take`).
    held: Arc<AtomicU64>,
}

/// Every user with a connection whose handshake is done.
#[derive(Default)]
pub struct Uids {
    map: HashMap<u32, UidUse>,
}

impl Uids {
    /// A connection of `uid` joined: the counter its bytes go to.
    pub fn join(&mut self, uid: u32) -> Arc<AtomicU64> {
        let e = self.map.entry(uid).or_insert_with(|| UidUse { conns: 0, held: Arc::new(AtomicU64::new(0)) });
        e.conns += 1;
        Arc::clone(&e.held)
    }

    /// A connection of `uid` left (its bytes were given back first).
    pub fn leave(&mut self, uid: u32) {
        if let Some(e) = self.map.get_mut(&uid) {
            e.conns -= 1;
            if e.conns == 0 {
                self.map.remove(&uid);
            }
        }
    }

    pub fn conns(&self, uid: u32) -> u32 {
        self.map.get(&uid).map_or(0, |e| e.conns)
    }

    /// Users with a connection now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The unprivileged user holding the most connections, if it holds
    /// more than `than` (ties: the lower uid, so the choice is stable).
    pub fn busiest(&self, than: u32, privileged: impl Fn(u32) -> bool) -> Option<u32> {
        self.map.iter().filter(|(&uid, e)| !privileged(uid) && e.conns > than).max_by_key(|(&uid, e)| (e.conns, std::cmp::Reverse(uid))).map(|(&uid, _)| uid)
    }
}

/// What the table looks like to a newcomer.
#[derive(Clone, Copy, Debug)]
pub struct Table {
    /// Connections whose handshake is done.
    pub ready: usize,
    pub clients_max: u32,
    pub clients_reserved: u32,
    pub conns_per_uid_max: u32,
    /// The newcomer's user holds this many already.
    pub mine: u32,
    pub privileged: bool,
}

/// What becomes of a newcomer.
#[derive(Debug, PartialEq, Eq)]
pub enum Place {
    /// A slot is free.
    Free,
    /// The table is full for it: close an idle connection of the busiest
    /// user (holding more than `mine`), or refuse if there is none.
    Evict,
    /// Refused with this message (EBUSY).
    Refuse(String),
}

/// Where the newcomer goes.
pub fn place(t: &Table) -> Place {
    if !t.privileged && t.mine >= t.conns_per_uid_max {
        return Place::Refuse(format!("this user holds {} connections (conns_per_uid_max = {})", t.mine, t.conns_per_uid_max));
    }
    // Other users keep at least one slot, whatever is reserved.
    let limit = if t.privileged { t.clients_max } else { t.clients_max - t.clients_reserved.min(t.clients_max.saturating_sub(1)) };
    if t.ready < limit as usize {
        Place::Free
    } else {
        Place::Evict
    }
}

/// The message of a refusal when nothing could be evicted.
pub fn full(t: &Table) -> String {
    if t.privileged {
        format!("server full (clients_max = {})", t.clients_max)
    } else {
        format!("server full (clients_max = {}, of which {} kept for root and the server's user)", t.clients_max, t.clients_reserved)
    }
}

/// Bytes a connection may still take: what its user's share and the
/// server's budget both leave (`None` for the user's share: privileged).
pub fn room(uid_held: Option<u64>, uid_bytes_max: u64, all_held: u64, held_bytes_max: u64) -> u64 {
    let global = held_bytes_max.saturating_sub(all_held);
    match uid_held {
        Some(h) => global.min(uid_bytes_max.saturating_sub(h)),
        None => global,
    }
}

/// Tell a socket that is not kept why (a newcomer refused, a connection
/// closed for another), under request id 0, without
/// waiting (what its buffer does not take is lost; it is closed next).
pub fn send_reason(stream: &crate::net::Stream, errno: i32, msg: &str) {
    let mut out = Vec::new();
    sluice_proto::encode_response(0, &sluice_proto::Response::Error { errno, message: msg }, &mut out);
    let _ = stream.send_nonblocking(&out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(ready: usize, mine: u32, privileged: bool) -> Table {
        Table { ready, clients_max: 10, clients_reserved: 2, conns_per_uid_max: 4, mine, privileged }
    }

    #[test]
    fn a_user_takes_conns_per_uid_max_connections_and_is_refused_one_more() {
        assert_eq!(place(&table(0, 3, false)), Place::Free, "N - 1 held: the Nth is free");
        assert!(matches!(place(&table(0, 4, false)), Place::Refuse(m) if m.contains("conns_per_uid_max = 4")), "N held: refused");
        assert_eq!(place(&table(0, 4, true)), Place::Free, "root has no per-user limit");
    }

    #[test]
    fn the_reserved_slots_are_root_s_alone() {
        assert_eq!(place(&table(7, 0, false)), Place::Free, "clients_max - reserved - 1 ready: free");
        assert_eq!(place(&table(8, 0, false)), Place::Evict, "clients_max - reserved ready: full for a user");
        assert_eq!(place(&table(9, 0, true)), Place::Free, "root takes a reserved slot");
        assert_eq!(place(&table(10, 0, true)), Place::Evict, "clients_max ready: full for root too");
        let small = Table { clients_max: 2, clients_reserved: 16, ..table(0, 0, false) };
        assert_eq!(place(&small), Place::Free, "more reserved than slots: other users keep one");
        assert_eq!(place(&Table { ready: 1, ..small }), Place::Evict);
    }

    #[test]
    fn the_busiest_unprivileged_user_gives_way_only_to_a_smaller_one() {
        let mut u = Uids::default();
        for _ in 0..3 {
            u.join(1000);
        }
        u.join(1001);
        for _ in 0..5 {
            u.join(0);
        }
        let privileged = |uid: u32| uid == 0;
        assert_eq!(u.busiest(1, privileged), Some(1000), "root's five do not count");
        assert_eq!(u.busiest(2, privileged), Some(1000));
        assert_eq!(u.busiest(3, privileged), None, "a user with as many is not closed for");
        u.leave(1001);
        assert_eq!((u.len(), u.conns(1001)), (2, 0), "an entry goes with its last connection");
    }

    #[test]
    fn room_is_the_smaller_of_the_user_s_share_and_the_server_s_budget() {
        assert_eq!(room(Some(0), 100, 0, 1000), 100);
        assert_eq!(room(Some(100), 100, 100, 1000), 0, "the user's share spent at N");
        assert_eq!(room(Some(101), 100, 101, 1000), 0, "and past it");
        assert_eq!(room(None, 100, 900, 1000), 100, "privileged: the budget's rest");
        assert_eq!(room(Some(0), 100, 1000, 1000), 0, "the budget spent");
    }
}
