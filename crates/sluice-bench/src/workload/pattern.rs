//! Applications and the accesses each of their processes makes.
//!
//! An [`AppSpec`] describes one application of a scenario: how many
//! processes, which file (shared or one per process), the access pattern,
//! the direction and the granularity. [`accesses`] lists, for one rank, the
//! `(offset, len)` pieces in the order the process issues them. The
//! generators are pure so the tests can check that the ranks' pieces cover
//! each file exactly once.

use serde::{Deserialize, Serialize};

/// How a process walks its share of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Each process reads its own contiguous block (1/P of the file) from
    /// start to end; with one process, a sequential `cat`/`dd`.
    Contiguous,
    /// The seed's decomposition: piece k of size g goes to process k mod P.
    Strided,
    /// Each process visits the pieces of its strided share in a random
    /// (seeded) order.
    Random,
}

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    Read,
    Write,
}

/// One application of a scenario.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppSpec {
    pub name: String,
    pub procs: u32,
    pub op: Dir,
    pub pattern: Pattern,
    /// Bytes of the whole file (shared) or of each process's file.
    pub size: u64,
    pub granularity: u64,
    /// One file for all processes (true) or one per process.
    #[serde(default = "yes")]
    pub shared_file: bool,
    /// QoS weight given to the scheduler.
    #[serde(default = "one")]
    pub weight: u32,
    /// Recorded accesses to replay instead of a pattern (`replay.rs`): a
    /// `ReplayLog` file, one rank per process; `size` is then the bytes
    /// all ranks move, and `op`, `pattern` and `granularity` are unused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<std::path::PathBuf>,
    /// The user (uid, and gid the same) its processes run as; None: the
    /// benchmark's own. Reads only: the files are the benchmark's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

impl AppSpec {
    /// The file (relative to the scratch root) rank `rank` uses.
    pub fn file_name(&self, rank: u32) -> String {
        if self.shared_file {
            format!("{}.dat", self.name)
        } else {
            format!("{}.{rank}.dat", self.name)
        }
    }

    /// Every file the application uses, with its size.
    pub fn files(&self) -> Vec<(String, u64)> {
        let ranks = if self.shared_file { 1 } else { self.procs };
        (0..ranks).map(|r| (self.file_name(r), self.size)).collect()
    }

    /// Bytes the whole application moves.
    pub fn bytes(&self) -> u64 {
        if self.shared_file {
            self.size
        } else {
            self.size * u64::from(self.procs)
        }
    }
}

/// The pieces rank `rank` of `app` accesses, in issue order. On a shared
/// file the ranks split the file; on per-process files each rank covers its
/// whole file. The last piece may be short.
pub fn accesses(app: &AppSpec, rank: u32, seed: u64) -> Vec<(u64, u64)> {
    let (procs, g, size) = (u64::from(app.procs.max(1)), app.granularity.max(1), app.size);
    let (share_procs, me) = if app.shared_file { (procs, u64::from(rank)) } else { (1, 0) };
    let pieces = size.div_ceil(g);
    let piece = |k: u64| (k * g, g.min(size - k * g));
    let mut out: Vec<(u64, u64)> = match app.pattern {
        Pattern::Contiguous => {
            let per = pieces.div_ceil(share_procs);
            (me * per..((me + 1) * per).min(pieces)).map(piece).collect()
        }
        Pattern::Strided | Pattern::Random => (me..pieces).step_by(share_procs as usize).map(piece).collect(),
    };
    if app.pattern == Pattern::Random {
        shuffle(&mut out, seed ^ u64::from(rank).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
    out
}

/// Fisher-Yates with a xorshift generator: deterministic per seed.
fn shuffle<T>(v: &mut [T], seed: u64) {
    let mut x = seed | 1;
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(pattern: Pattern, procs: u32, size: u64, g: u64, shared: bool) -> AppSpec {
        AppSpec { name: "a".into(), procs, op: Dir::Read, pattern, size, granularity: g, shared_file: shared, weight: 1, replay: None, uid: None }
    }

    /// Every byte of every file is covered exactly once over all ranks.
    fn check_exact_cover(a: &AppSpec) {
        let mut per_file: std::collections::BTreeMap<String, Vec<(u64, u64)>> = Default::default();
        for r in 0..a.procs {
            per_file.entry(a.file_name(r)).or_default().extend(accesses(a, r, 7));
        }
        for (f, mut pieces) in per_file {
            pieces.sort();
            let mut at = 0;
            for (off, len) in pieces {
                assert_eq!(off, at, "{f}: gap or overlap at {at} in {a:?}");
                assert!(len > 0);
                at += len;
            }
            assert_eq!(at, a.size, "{f}: covered {at} of {} bytes", a.size);
        }
    }

    #[test]
    fn every_pattern_covers_each_file_exactly_once() {
        for pattern in [Pattern::Contiguous, Pattern::Strided, Pattern::Random] {
            for (procs, size, g) in [(1, 1 << 20, 4096), (32, 1 << 20, 4096), (7, 1_000_003, 4096), (16, 4096 * 5, 4096), (3, 100, 4096)] {
                check_exact_cover(&app(pattern, procs, size, g, true));
                check_exact_cover(&app(pattern, procs, size, g, false));
            }
        }
    }

    #[test]
    fn strided_is_the_seed_decomposition() {
        let a = app(Pattern::Strided, 4, 16 * 4096, 4096, true);
        let offs: Vec<u64> = accesses(&a, 1, 0).iter().map(|p| p.0 / 4096).collect();
        assert_eq!(offs, vec![1, 5, 9, 13], "process 1 takes pieces 1, 1+P, 1+2P, …");
    }

    #[test]
    fn random_is_a_seeded_permutation() {
        let a = app(Pattern::Random, 2, 64 * 4096, 4096, true);
        let (x, y) = (accesses(&a, 0, 1), accesses(&a, 0, 1));
        assert_eq!(x, y, "same seed, same order");
        let mut s = x.clone();
        s.sort();
        assert_ne!(x, s, "a random order is not the sorted one");
        assert_eq!(s, accesses(&app(Pattern::Strided, 2, 64 * 4096, 4096, true), 0, 1));
    }
}
