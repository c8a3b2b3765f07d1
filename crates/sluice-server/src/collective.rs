//! Server-directed collectives (Panda, seed 001): the list messages of one
//! group on one file are held until every participant has sent its own,
//! then admitted together, so the scheduler sees the whole collective at
//! once and serves it in disk order, in aggregates as large as its
//! contiguity allows, as the work of one application (the first
//! participant's).
//!
//! Nothing of a group is carried out before it is complete: a group whose
//! participants have not all arrived by its deadline (the first arrival
//! plus the group's wait, at most `collective_wait_ms_max`) is answered
//! `ETIMEDOUT` for every participant that came, and no byte of it is
//! written or read. A participant whose client died simply never arrives.
//!
//! Bounds (`ServerLimits`): `collectives_max` groups held at once (one
//! more is refused `EAGAIN`), `collective_bytes_max` bytes of write data
//! held in them (past it `ENOBUFS`), and the wait. A connection's held
//! messages also count against its `inflight_per_connection_max` and
//! `reply_bytes_max`, like any admitted message.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sluice_core::{AppId, FileId, Op};
use sluice_proto::Group;

/// A group's name on this server: its file and the id its participants
/// gave it.
pub type GroupKey = (FileId, u64);

/// Bounds of the table.
#[derive(Clone, Copy, Debug)]
pub struct CollectiveLimits {
    pub groups_max: usize,
    pub bytes_max: u64,
    pub wait_ms_max: u64,
}

struct Held<T> {
    participants: u32,
    arrived: u32,
    op: Op,
    app: AppId,
    items: Vec<T>,
    bytes: u64,
    deadline: Instant,
}

/// One participant's message: its group, direction, application, items
/// and bytes of write data.
pub struct Arrival<T> {
    pub key: GroupKey,
    pub group: Group,
    pub op: Op,
    pub app: AppId,
    pub items: Vec<T>,
    pub bytes: u64,
}

/// What a participant's arrival did.
pub enum Joined<T> {
    /// Others are still to come.
    Waiting(Instant),
    /// It was the last: every participant's items, to admit now as `app`'s.
    Complete { app: AppId, items: Vec<T> },
}

/// A group that missed its deadline (or was cut short by a stop).
pub struct Expired<T> {
    pub id: u64,
    pub arrived: u32,
    pub participants: u32,
    pub items: Vec<T>,
}

/// Every group being gathered.
pub struct Collectives<T> {
    groups: HashMap<GroupKey, Held<T>>,
    limits: CollectiveLimits,
    bytes: u64,
}

impl<T> Collectives<T> {
    pub fn new(limits: CollectiveLimits) -> Collectives<T> {
        Collectives { groups: HashMap::new(), limits, bytes: 0 }
    }

    /// Whether a participant of `g` moving `bytes` of write data may join:
    /// checked before the message takes anything. `elsewhere`: complete
    /// groups (and their write bytes) still waiting for the scheduler's
    /// queue, which count against the same bounds.
    pub fn check(&self, key: GroupKey, g: &Group, op: Op, bytes: u64, elsewhere: (usize, u64)) -> Result<(), (i32, String)> {
        let (groups_elsewhere, bytes_elsewhere) = elsewhere;
        let held = self.bytes + bytes_elsewhere;
        match self.groups.get(&key) {
            Some(h) if h.participants != g.participants => {
                Err((libc::EINVAL, format!("collective {}: {} participants announced, {} by an earlier one", g.id, g.participants, h.participants)))
            }
            Some(h) if h.op != op => Err((libc::EINVAL, format!("collective {}: reads and writes in one group", g.id))),
            None if self.groups.len() + groups_elsewhere >= self.limits.groups_max => {
                Err((libc::EAGAIN, format!("{} collectives are being gathered (collectives_max)", self.limits.groups_max)))
            }
            _ if held + bytes > self.limits.bytes_max => Err((
                libc::ENOBUFS,
                format!("collective {}: {} bytes held by collectives, {bytes} more would pass collective_bytes_max = {}", g.id, self.bytes, self.limits.bytes_max),
            )),
            _ => Ok(()),
        }
    }

    /// A participant arrives with its items (after [`Collectives::check`]).
    pub fn join(&mut self, a: Arrival<T>, now: Instant) -> Joined<T> {
        let Arrival { key, group: g, op, app, items, bytes } = a;
        let wait = Duration::from_millis(u64::from(g.wait_ms).min(self.limits.wait_ms_max));
        let h = self.groups.entry(key).or_insert_with(|| Held { participants: g.participants, arrived: 0, op, app, items: Vec::new(), bytes: 0, deadline: now + wait });
        h.arrived += 1;
        h.items.extend(items);
        h.bytes += bytes;
        self.bytes += bytes;
        if h.arrived < h.participants {
            return Joined::Waiting(h.deadline);
        }
        let h = self.groups.remove(&key).expect("just seen");
        self.bytes -= h.bytes;
        Joined::Complete { app: h.app, items: h.items }
    }

    /// Take every group whose deadline has passed (all of them with
    /// `now = None`, at a stop).
    pub fn expire(&mut self, now: Option<Instant>) -> Vec<Expired<T>> {
        let due: Vec<GroupKey> = self.groups.iter().filter(|(_, h)| now.is_none_or(|n| n >= h.deadline)).map(|(k, _)| *k).collect();
        due.into_iter()
            .map(|k| {
                let h = self.groups.remove(&k).expect("listed");
                self.bytes -= h.bytes;
                Expired { id: k.1, arrived: h.arrived, participants: h.participants, items: h.items }
            })
            .collect()
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.groups.values().map(|h| h.deadline).min()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> CollectiveLimits {
        CollectiveLimits { groups_max: 2, bytes_max: 100, wait_ms_max: 1000 }
    }

    fn g(id: u64, participants: u32) -> Group {
        Group { id, participants, wait_ms: 50 }
    }

    #[test]
    fn a_group_completes_with_its_last_participant_as_the_first_ones_application() {
        let mut t: Collectives<u32> = Collectives::new(limits());
        let now = Instant::now();
        let k = (FileId(1), 7);
        assert!(matches!(t.join(Arrival { key: k, group: g(7, 3), op: Op::Write, app: AppId(1), items: vec![1], bytes: 10 }, now), Joined::Waiting(_)));
        assert!(matches!(t.join(Arrival { key: k, group: g(7, 3), op: Op::Write, app: AppId(2), items: vec![], bytes: 0 }, now), Joined::Waiting(_)));
        assert_eq!(t.bytes(), 10);
        match t.join(Arrival { key: k, group: g(7, 3), op: Op::Write, app: AppId(3), items: vec![2, 3], bytes: 20 }, now) {
            Joined::Complete { app, items } => assert_eq!((app, items), (AppId(1), vec![1, 2, 3])),
            Joined::Waiting(_) => panic!("three of three arrived"),
        }
        assert_eq!((t.len(), t.bytes()), (0, 0));
    }

    #[test]
    fn groups_max_is_a_bound_at_n_and_n_plus_1() {
        let mut t: Collectives<u32> = Collectives::new(limits());
        let now = Instant::now();
        for id in 0..2 {
            assert!(t.check((FileId(1), id), &g(id, 2), Op::Read, 0, (0, 0)).is_ok());
            let _ = t.join(Arrival { key: (FileId(1), id), group: g(id, 2), op: Op::Read, app: AppId(1), items: vec![], bytes: 0 }, now);
        }
        assert_eq!(t.check((FileId(1), 2), &g(2, 2), Op::Read, 0, (0, 0)).unwrap_err().0, libc::EAGAIN);
        // A participant of a group already held still joins.
        assert!(t.check((FileId(1), 1), &g(1, 2), Op::Read, 0, (0, 0)).is_ok());
    }

    #[test]
    fn bytes_max_is_a_bound_at_n_and_n_plus_1() {
        let mut t: Collectives<u32> = Collectives::new(limits());
        let now = Instant::now();
        let k = (FileId(1), 1);
        let _ = t.join(Arrival { key: k, group: g(1, 3), op: Op::Write, app: AppId(1), items: vec![], bytes: 60 }, now);
        assert!(t.check(k, &g(1, 3), Op::Write, 40, (0, 0)).is_ok());
        assert_eq!(t.check(k, &g(1, 3), Op::Write, 41, (0, 0)).unwrap_err().0, libc::ENOBUFS);
    }

    #[test]
    fn complete_groups_waiting_for_the_queue_count_against_both_bounds() {
        let mut t: Collectives<u32> = Collectives::new(limits());
        let now = Instant::now();
        let _ = t.join(Arrival { key: (FileId(1), 1), group: g(1, 2), op: Op::Write, app: AppId(1), items: vec![], bytes: 10 }, now);
        // One gathering and one waiting elsewhere: a third group is one too many.
        assert!(t.check((FileId(1), 2), &g(2, 2), Op::Write, 0, (0, 0)).is_ok());
        assert_eq!(t.check((FileId(1), 2), &g(2, 2), Op::Write, 0, (1, 0)).unwrap_err().0, libc::EAGAIN);
        // 10 held here and 50 waiting: 40 more fit, 41 do not.
        assert!(t.check((FileId(1), 1), &g(1, 2), Op::Write, 40, (0, 50)).is_ok());
        assert_eq!(t.check((FileId(1), 1), &g(1, 2), Op::Write, 41, (0, 50)).unwrap_err().0, libc::ENOBUFS);
    }

    #[test]
    fn mismatched_participants_or_directions_are_refused() {
        let mut t: Collectives<u32> = Collectives::new(limits());
        let k = (FileId(1), 1);
        let _ = t.join(Arrival { key: k, group: g(1, 3), op: Op::Write, app: AppId(1), items: vec![], bytes: 0 }, Instant::now());
        assert_eq!(t.check(k, &g(1, 4), Op::Write, 0, (0, 0)).unwrap_err().0, libc::EINVAL);
        assert_eq!(t.check(k, &g(1, 3), Op::Read, 0, (0, 0)).unwrap_err().0, libc::EINVAL);
        // The same id on another file is another group.
        assert!(t.check((FileId(2), 1), &g(1, 4), Op::Read, 0, (0, 0)).is_ok());
    }

    #[test]
    fn an_incomplete_group_expires_at_its_deadline_with_everything_it_held() {
        let mut t: Collectives<u32> = Collectives::new(limits());
        let now = Instant::now();
        let k = (FileId(1), 9);
        let Joined::Waiting(deadline) = t.join(Arrival { key: k, group: g(9, 4), op: Op::Write, app: AppId(1), items: vec![5, 6], bytes: 30 }, now) else { panic!() };
        assert_eq!(deadline, now + Duration::from_millis(50));
        assert!(t.expire(Some(deadline - Duration::from_millis(1))).is_empty());
        let e = t.expire(Some(deadline));
        assert_eq!((e.len(), e[0].id, e[0].arrived, e[0].participants, e[0].items.clone()), (1, 9, 1, 4, vec![5, 6]));
        assert_eq!((t.len(), t.bytes()), (0, 0));
    }

    #[test]
    fn the_wait_is_clamped_by_wait_ms_max() {
        let mut t: Collectives<u32> = Collectives::new(limits());
        let now = Instant::now();
        let long = Group { id: 1, participants: 2, wait_ms: u32::MAX };
        let Joined::Waiting(deadline) = t.join(Arrival { key: (FileId(1), 1), group: long, op: Op::Read, app: AppId(1), items: vec![], bytes: 0 }, now) else { panic!() };
        assert_eq!(deadline, now + Duration::from_millis(1000));
    }
}
