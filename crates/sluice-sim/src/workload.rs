//! Which bytes each process accesses: the seed's decomposition (strided),
//! contiguous shares, and the rounds of MPI-IO's two-phase collective.
//! Pure arithmetic, tested on its own: every byte of an application is
//! covered by exactly one request.

/// How one application's bytes are laid out over its processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub bytes: u64,
    pub procs: u64,
    pub granularity: u64,
    pub strided: bool,
    /// Blocks per call (strided only; 1 otherwise).
    pub blocks: u64,
}

impl Layout {
    /// Requests (calls) process `rank` issues.
    pub fn requests(&self, rank: u64) -> u64 {
        self.blocks_of(rank).div_ceil(self.blocks.max(1))
    }

    /// Blocks of `granularity` process `rank` accesses in all.
    fn blocks_of(&self, rank: u64) -> u64 {
        if self.strided {
            let n = self.bytes.div_ceil(self.granularity);
            if rank < n {
                (n - rank).div_ceil(self.procs)
            } else {
                0
            }
        } else {
            let (lo, hi) = self.share(rank);
            (hi - lo).div_ceil(self.granularity)
        }
    }

    /// The byte range `[lo, hi)` process `rank` owns (contiguous layout).
    fn share(&self, rank: u64) -> (u64, u64) {
        let share = self.bytes.div_ceil(self.procs);
        let lo = (rank * share).min(self.bytes);
        (lo, (lo + share).min(self.bytes))
    }

    /// The blocks of call `j` of process `rank`: the first block's index
    /// in the rank's sequence (for `block`), and how many.
    pub fn call(&self, rank: u64, j: u64) -> (u64, u64) {
        let b = self.blocks.max(1);
        let first = j * b;
        (first, b.min(self.blocks_of(rank).saturating_sub(first)))
    }

    /// Offset and length of block `j` of process `rank` (with one block
    /// per call, request `j`).
    pub fn request(&self, rank: u64, j: u64) -> (u64, u64) {
        let off = if self.strided { (rank + j * self.procs) * self.granularity } else { self.share(rank).0 + j * self.granularity };
        let end = if self.strided { self.bytes } else { self.share(rank).1 };
        (off, self.granularity.min(end - off))
    }
}

/// The rounds of a two-phase collective over `bytes` with `aggregators`
/// aggregators of `cb_bytes` each (ROMIO: each round, each aggregator
/// accesses one contiguous collective buffer of its file domain).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TwoPhase {
    pub bytes: u64,
    pub aggregators: u64,
    pub cb_bytes: u64,
}

/// The seed's aggregator choice (Chaarawi and Gabriel, as `sluice.mpi`'s
/// `choose_groups`): groups of consecutive ranks, one aggregator each.
/// With `shares` the bytes each rank moves and `k` the bytes one
/// aggregator should move, start from `ceil(total / k)` groups of equal
/// rank counts, split a group above `k` while it has more than one rank,
/// and join neighbours whose bytes together stay at or below `k`.
pub fn choose_groups(shares: &[u64], k: u64) -> Vec<std::ops::Range<usize>> {
    let n = shares.len();
    if n == 0 {
        return Vec::new();
    }
    let total: u64 = shares.iter().sum();
    let count = (total.div_ceil(k.max(1)) as usize).clamp(1, n);
    let size = |g: &std::ops::Range<usize>| shares[g.clone()].iter().sum::<u64>();
    // Python's round(i * n / count), half to even, on exact integers.
    let bound = |i: usize| {
        let (q, r) = ((i * n) / count, (i * n) % count);
        q + usize::from(2 * r > count || (2 * r == count && q % 2 == 1))
    };
    let mut split = Vec::new();
    for i in 0..count {
        // A stack of groups, starting with this one.
        let mut stack = Vec::new();
        stack.push(bound(i)..bound(i + 1));
        while let Some(g) = stack.pop() {
            if g.is_empty() {
                continue;
            }
            if size(&g) > k && g.len() > 1 {
                let mid = g.start + g.len() / 2;
                stack.push(mid..g.end);
                stack.push(g.start..mid);
            } else {
                split.push(g);
            }
        }
    }
    let mut joined: Vec<std::ops::Range<usize>> = Vec::with_capacity(split.len());
    for g in split {
        match joined.last_mut() {
            Some(last) if size(last) + size(&g) <= k => last.end = g.end,
            _ => joined.push(g),
        }
    }
    joined
}

impl TwoPhase {
    pub fn rounds(&self) -> u64 {
        self.bytes.div_ceil(self.aggregators * self.cb_bytes)
    }

    /// Offset and length of aggregator `a`'s access in `round` (length 0
    /// when the last round leaves it nothing).
    pub fn part(&self, round: u64, a: u64) -> (u64, u64) {
        let span = self.aggregators * self.cb_bytes;
        let lo = round * span;
        let hi = (lo + span).min(self.bytes);
        let each = (hi - lo).div_ceil(self.aggregators);
        let off = (lo + a * each).min(hi);
        (off, each.min(hi - off))
    }

    /// Aggregators with a non-empty part in `round`.
    pub fn active(&self, round: u64) -> u64 {
        (0..self.aggregators).filter(|&a| self.part(round, a).1 > 0).count() as u64
    }

    /// Rank of aggregator `a` among `procs` processes: spread evenly, so
    /// aggregators land on distinct nodes (ROMIO's default placement).
    pub fn rank(&self, a: u64, procs: u64) -> u64 {
        a * procs / self.aggregators
    }

    /// Bytes exchanged between one aggregator and one process for a part
    /// of `len` bytes: an even share, at least one byte.
    pub fn exchange_bytes(len: u64, procs: u64) -> u64 {
        len.div_ceil(procs).max(1)
    }
}

/// Where byte `offset` of a file striped in `stripe` units over `count`
/// servers starting at `first` of `servers` lives: the server and the
/// offset in that server's local object, and the bytes left in the unit.
pub fn stripe_map(offset: u64, stripe: u64, count: u64, first: u64, servers: u64) -> (u64, u64, u64) {
    let unit = offset / stripe;
    let server = (first + unit % count) % servers;
    let local = (unit / count) * stripe + offset % stripe;
    (server, local, stripe - offset % stripe)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(l: &Layout) -> Vec<u64> {
        let mut hits = vec![0u64; l.bytes as usize];
        for r in 0..l.procs {
            for j in 0..l.requests(r) {
                let (first, count) = l.call(r, j);
                assert!(count > 0 && count <= l.blocks, "{l:?}: call {j} of rank {r} has {count} blocks");
                for b in first..first + count {
                    let (o, n) = l.request(r, b);
                    assert!(n > 0);
                    hits[o as usize..(o + n) as usize].iter_mut().for_each(|h| *h += 1);
                }
            }
        }
        hits
    }

    #[test]
    fn every_byte_exactly_once() {
        for (strided, blocks) in [(true, 1), (false, 1), (true, 3), (true, 100)] {
            for (bytes, procs, g) in [(1000, 3, 7), (4096, 4, 512), (10, 32, 4), (1 << 12, 1, 100)] {
                let l = Layout { bytes, procs, granularity: g, strided, blocks };
                assert!(covered(&l).iter().all(|&h| h == 1), "{l:?}");
            }
        }
        // Calls of 3 blocks: the rank's blocks in order, the last call short.
        let l = Layout { bytes: 10 << 10, procs: 2, granularity: 1 << 10, strided: true, blocks: 3 };
        assert_eq!((l.requests(0), l.call(0, 0), l.call(0, 1)), (2, (0, 3), (3, 2)));
    }

    #[test]
    fn strided_is_round_robin() {
        let l = Layout { bytes: 8 << 10, procs: 4, granularity: 1 << 10, strided: true, blocks: 1 };
        assert_eq!(l.request(1, 0), (1 << 10, 1 << 10));
        assert_eq!(l.request(1, 1), (5 << 10, 1 << 10));
    }

    #[test]
    fn aggregator_groups_split_and_join_against_k() {
        let r = |g: Vec<std::ops::Range<usize>>| g.into_iter().map(|g| (g.start, g.end)).collect::<Vec<_>>();
        // The cases `python/tests/test_mpi.py` checks for sluice.mpi's
        // `choose_groups`, and random ones, as it answered them.
        assert_eq!(r(choose_groups(&[10; 8], 35)), [(0, 3), (3, 5), (5, 8)]);
        assert_eq!(r(choose_groups(&[100; 4], 50)), [(0, 1), (1, 2), (2, 3), (3, 4)]);
        assert_eq!(r(choose_groups(&[40, 1, 1, 40], 45)), [(0, 2), (2, 4)]);
        assert_eq!(r(choose_groups(&[1, 1, 1, 1, 80], 50)), [(0, 4), (4, 5)]);
        // (piece sizes, buffer bytes, the groups Python chose)
        type Case = (Vec<u64>, u64, Vec<(usize, usize)>);
        let python: [Case; 4] = [
            (vec![9, 25, 41, 3, 4, 34, 6, 23, 37, 3, 32], 28, vec![(0, 1), (1, 2), (2, 3), (3, 5), (5, 6), (6, 7), (7, 8), (8, 9), (9, 10), (10, 11)]),
            (vec![15, 5, 35], 55, vec![(0, 3)]),
            (vec![36, 7], 29, vec![(0, 1), (1, 2)]),
            (
                vec![36, 40, 12, 23, 6, 35, 45, 4, 36, 3, 39, 13, 31, 43, 34, 27, 49, 20, 29],
                75,
                vec![(0, 1), (1, 3), (3, 6), (6, 8), (8, 9), (9, 12), (12, 14), (14, 16), (16, 17), (17, 19)],
            ),
        ];
        for (shares, k, want) in python {
            assert_eq!(r(choose_groups(&shares, k)), want, "{shares:?} k = {k}");
        }
        assert_eq!(r(choose_groups(&[4 << 10; 4], 12 << 10)), [(0, 2), (2, 4)]);
        assert_eq!(r(choose_groups(&[10; 8], 20)), [(0, 2), (2, 4), (4, 6), (6, 8)]);
        // One rank far above k is split off; small neighbours are joined.
        assert_eq!(r(choose_groups(&[100, 1, 1, 1, 1, 1], 10)), [(0, 1), (1, 6)]);
        // k above the total: one group; every rank above k: one each.
        assert_eq!(r(choose_groups(&[5; 6], 1 << 30)), [(0, 6)]);
        assert_eq!(r(choose_groups(&[50; 3], 10)), [(0, 1), (1, 2), (2, 3)]);
        assert!(choose_groups(&[], 10).is_empty());
        // Every rank is in exactly one group, in order.
        for k in [1u64, 7, 30, 1000] {
            let shares: Vec<u64> = (0..37).map(|i| (i * 13 % 11) as u64).collect();
            let g = choose_groups(&shares, k);
            assert_eq!(g.first().unwrap().start, 0);
            assert!(g.windows(2).all(|w| w[0].end == w[1].start) && g.last().unwrap().end == 37);
        }
    }

    #[test]
    fn two_phase_parts_cover_the_file() {
        let t = TwoPhase { bytes: 1000, aggregators: 3, cb_bytes: 100 };
        let mut hits = vec![0; 1000];
        for r in 0..t.rounds() {
            for a in 0..3 {
                let (o, n) = t.part(r, a);
                hits[o as usize..(o + n) as usize].iter_mut().for_each(|h| *h += 1);
            }
        }
        assert!(hits.iter().all(|&h| h == 1));
        assert_eq!((t.rounds(), t.active(3), t.part(3, 2)), (4, 3, (968, 32)));
        assert_eq!(t.rank(2, 32), 21);
    }

    #[test]
    fn striping_round_robin_with_dense_local_objects() {
        // 64 KiB units over 10 servers: unit 12 is on server 2, second row.
        assert_eq!(stripe_map(12 * 65536 + 5, 65536, 10, 0, 10), (2, 65536 + 5, 65536 - 5));
        assert_eq!(stripe_map(5, 65536, 1, 3, 10), (3, 5, 65536 - 5));
    }
}
