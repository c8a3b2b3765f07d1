//! Step 2 of a collective, from plan to messages: which list messages a
//! rank sends, in which order, and with which server-directed group. The
//! Rust collectives (`sluice-zarr`, `sluice array`) and the Python binding
//! (`sluice.array`) both send exactly [`rank_messages`], so that a plan
//! means the same traffic from either.
//!
//! A server-directed group is the j-th message of every rank that has one
//! for file `u`: its id is the collective's base plus `j` (a server keys
//! groups by file and id, so files may share ids), and its participants
//! are how many ranks have a j-th message for `u`. Every rank sends its
//! messages in (file, j) order, so the oldest incomplete group always has
//! every participant's message sent or on its way. The base is one per
//! collective, the same on every rank: [`group_base`] makes one (the
//! Python binding makes it on rank 0 and broadcasts it).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::plan::{messages, MessageLimits, Piece, Plan};

/// The server-directed group of one list message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupTag {
    pub id: u64,
    pub participants: u32,
}

/// One list message of a rank's transfer: the j-th of its messages for
/// file `unit`, its pieces in disk order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub unit: u64,
    pub j: usize,
    pub pieces: Vec<Piece>,
    pub group: Option<GroupTag>,
}

impl Message {
    /// The file ranges, as a list message carries them.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        self.pieces.iter().map(|p| (p.file_off, p.len)).collect()
    }

    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
    }
}

/// The groups of one server-directed collective.
#[derive(Clone, Debug)]
pub struct Groups {
    base: u64,
    /// `participants[u][j]`.
    participants: Vec<Vec<u32>>,
}

impl Groups {
    pub fn new(plan: &Plan, units: u64, limits: &MessageLimits, base: u64) -> Groups {
        Groups { base, participants: plan.group_participants(units, limits) }
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    /// The same groups for another collective of the same plan.
    pub fn rebased(&self, base: u64) -> Groups {
        Groups { base, participants: self.participants.clone() }
    }

    /// The group of the j-th message of file `u`.
    pub fn tag(&self, u: u64, j: usize) -> GroupTag {
        GroupTag { id: self.base.wrapping_add(j as u64), participants: self.participants[u as usize][j] }
    }
}

/// Low bits of a group base left zero: a collective's ids are its base
/// plus a message index below 2^20 (a million messages a file), so the
/// id ranges of two distinct bases never overlap.
const GROUP_INDEX_BITS: u32 = 20;

/// A group base for a new collective: distinct from every other this
/// process made (a counter above a prefix drawn once per process), and
/// from other processes' with high probability (the prefix is a hash of
/// the clock and the process id), so that a later collective on the same
/// file is never taken for this one. Bit 63 clear (Python's integers and
/// the protocol take it alike).
pub fn group_base() -> u64 {
    static PREFIX: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let prefix = *PREFIX.get_or_init(|| {
        let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        splitmix64(clock ^ (u64::from(std::process::id()) << 32))
    });
    (prefix.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) << GROUP_INDEX_BITS) & !(1 << 63)
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Rank `r`'s messages, file by file (in file order), each file's in
/// disk order: the order every rank sends them in. With `groups`, each
/// message carries its server-directed group.
pub fn rank_messages(plan: &Plan, r: u64, limits: &MessageLimits, groups: Option<&Groups>) -> Vec<Vec<Message>> {
    plan.rank_files(r)
        .into_iter()
        .map(|file| {
            let u = file[0].unit;
            messages(&file, limits).into_iter().enumerate().map(|(j, pieces)| Message { unit: u, j, pieces, group: groups.map(|g| g.tag(u, j)) }).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{plan, Dist, Distribution, Dtype, Layout, PlanLimits};

    fn plan_of(ranks: u64) -> (Plan, u64) {
        // 8 x 8 float64 in chunks of 4 x 4, rows cyclic over the ranks.
        let layout = Layout::new(vec![8, 8], Dtype::F64, vec![4, 4], None).unwrap();
        let dist = Distribution::new(vec![8, 8], vec![ranks, 1], vec![Dist::Cyclic(1), Dist::Star]).unwrap();
        (plan(&dist, &layout, &PlanLimits::default()).unwrap(), layout.units())
    }

    #[test]
    fn every_piece_of_a_rank_goes_once_in_file_then_disk_order() {
        let (p, units) = plan_of(4);
        let limits = MessageLimits { pieces_max: 3, bytes_max: 1 << 20 };
        for r in 0..4 {
            let msgs = rank_messages(&p, r, &limits, None);
            let flat: Vec<Piece> = msgs.iter().flatten().flat_map(|m| m.pieces.clone()).collect();
            let mut want: Vec<Piece> = p.rank(r).copied().collect();
            want.sort_unstable();
            assert_eq!(flat, want, "rank {r}");
            assert!(msgs.iter().flatten().all(|m| m.pieces.len() <= 3 && m.group.is_none()));
            assert!(msgs.iter().all(|f| f.iter().enumerate().all(|(j, m)| m.j == j && m.unit == f[0].unit)));
            assert!(msgs.windows(2).all(|w| w[0][0].unit < w[1][0].unit) && msgs.len() as u64 <= units);
        }
    }

    #[test]
    fn a_group_is_the_jth_message_of_every_rank_with_one_for_the_file() {
        let (p, units) = plan_of(4);
        let limits = MessageLimits { pieces_max: 1, bytes_max: 1 << 20 };
        let g = Groups::new(&p, units, &limits, 1_000);
        let all: Vec<Message> = (0..4).flat_map(|r| rank_messages(&p, r, &limits, Some(&g)).into_iter().flatten()).collect();
        for m in &all {
            let tag = m.group.unwrap();
            assert_eq!(tag.id, 1_000 + m.j as u64);
            let senders = all.iter().filter(|o| (o.unit, o.j) == (m.unit, m.j)).count();
            assert_eq!(tag.participants as usize, senders, "file {} message {}", m.unit, m.j);
        }
    }

    #[test]
    fn group_bases_differ_and_their_id_ranges_never_overlap() {
        let bases: Vec<u64> = (0..1_000).map(|_| group_base()).collect();
        for w in bases.windows(2) {
            assert_ne!(w[0], w[1]);
            assert_eq!(w[0] >> 63, 0);
            assert_eq!(w[0] & ((1 << GROUP_INDEX_BITS) - 1), 0, "message indexes below 2^20 stay within a base's range");
        }
    }
}
