//! HPF distributions: which elements of an array each rank holds, and where
//! they sit in the rank's local memory.
//!
//! A rank's local array is C-ordered, with, in each dimension, the indices
//! it owns in increasing order. That is what an MPI program allocates for
//! `(BLOCK, CYCLIC(k), *)`: element `g` of a CYCLIC(k) dimension over `p`
//! processes lives on process `(g / k) % p`, at local index
//! `(g / (k p)) k + g % k`. HPF-2's GEN_BLOCK(b0, b1, ...) gives process
//! `c` the `b_c` indices after those of processes `0..c`: uneven data, as
//! adaptive-mesh codes hold it.

use crate::{invalid, limit, unravel, Error, DIMS_MAX, RANKS_MAX};

/// How one dimension is spread over its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dist {
    /// Contiguous blocks of `ceil(n / p)` indices, one per process.
    Block,
    /// Blocks of `k` indices dealt round-robin; CYCLIC(1) is CYCLIC.
    Cyclic(u64),
    /// Contiguous blocks of the given sizes, one per process in order
    /// (HPF-2 GEN_BLOCK): they sum to the extent, a block may be empty.
    GenBlock(Vec<u64>),
    /// Not distributed (`*`): every index on the one process of the dimension.
    Star,
}

impl Dist {
    /// Parse `block`, `cyclic`, `cyclic(K)`, `gen_block(B0:B1:...)` (the
    /// sizes separated by `:`, or by spaces or commas where the caller does
    /// not split on them) or `*`.
    pub fn parse(s: &str) -> Result<Dist, Error> {
        let t = s.trim().to_ascii_lowercase();
        match t.as_str() {
            "block" => return Ok(Dist::Block),
            "cyclic" => return Ok(Dist::Cyclic(1)),
            "*" | "star" | "none" => return Ok(Dist::Star),
            _ => {}
        }
        if let Some(sizes) = t.strip_prefix("gen_block(").and_then(|r| r.strip_suffix(')')) {
            let sizes: Option<Vec<u64>> = sizes.split([':', ',', ' ']).filter(|x| !x.is_empty()).map(|x| x.parse().ok()).collect();
            return match sizes {
                Some(v) if !v.is_empty() => Ok(Dist::GenBlock(v)),
                _ => Err(invalid(format!("{s:?}: gen_block takes one block size per process, e.g. gen_block(6:1:1)"))),
            };
        }
        let k = t
            .strip_prefix("cyclic(")
            .and_then(|r| r.strip_suffix(')'))
            .and_then(|k| k.parse::<u64>().ok())
            .filter(|&k| k > 0)
            .ok_or_else(|| invalid(format!("{s:?} is not a distribution (block, cyclic, cyclic(K) with K > 0, or *)")))?;
        Ok(Dist::Cyclic(k))
    }
}

impl std::fmt::Display for Dist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dist::Block => f.write_str("BLOCK"),
            Dist::Cyclic(1) => f.write_str("CYCLIC"),
            Dist::Cyclic(k) => write!(f, "CYCLIC({k})"),
            Dist::GenBlock(b) => write!(f, "GEN_BLOCK({})", b.iter().map(u64::to_string).collect::<Vec<_>>().join(":")),
            Dist::Star => f.write_str("*"),
        }
    }
}

/// An array shape spread over a process grid (ranks in row-major order of
/// the grid), one [`Dist`] per dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Distribution {
    shape: Vec<u64>,
    grid: Vec<u64>,
    dists: Vec<Dist>,
}

impl Distribution {
    pub fn new(shape: Vec<u64>, grid: Vec<u64>, dists: Vec<Dist>) -> Result<Distribution, Error> {
        let n = shape.len();
        if n == 0 || n > DIMS_MAX {
            return Err(limit(format!("an array has 1 to {DIMS_MAX} dimensions, not {n}")));
        }
        if grid.len() != n || dists.len() != n {
            return Err(invalid(format!("shape has {n} dimensions but the grid has {} and the distribution {}", grid.len(), dists.len())));
        }
        if shape.contains(&0) || grid.contains(&0) {
            return Err(invalid("every extent of the shape and the grid must be at least 1"));
        }
        for d in 0..n {
            if dists[d] == Dist::Star && grid[d] != 1 {
                return Err(invalid(format!("dimension {d} is * (not distributed) but has {} processes", grid[d])));
            }
            if let Dist::GenBlock(b) = &dists[d] {
                if b.len() as u64 != grid[d] || b.iter().try_fold(0u64, |a, &x| a.checked_add(x)) != Some(shape[d]) {
                    return Err(invalid(format!("dimension {d}: GEN_BLOCK needs {} sizes (one per process) summing to {}, got {b:?}", grid[d], shape[d])));
                }
            }
        }
        let ranks = grid.iter().try_fold(1u64, |a, &g| a.checked_mul(g)).filter(|&r| r <= RANKS_MAX);
        if ranks.is_none() {
            return Err(limit(format!("the grid {grid:?} has more than {RANKS_MAX} ranks")));
        }
        Ok(Distribution { shape, grid, dists })
    }

    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    pub fn grid(&self) -> &[u64] {
        &self.grid
    }

    pub fn dists(&self) -> &[Dist] {
        &self.dists
    }

    pub fn ranks(&self) -> u64 {
        self.grid.iter().product()
    }

    /// The grid coordinates of `rank`.
    pub fn coords(&self, rank: u64) -> Vec<u64> {
        unravel(rank, &self.grid)
    }

    /// The index intervals `[lo, hi)` that grid coordinate `c` owns in
    /// dimension `d`, in increasing order (empty when it owns none).
    pub fn intervals(&self, d: usize, c: u64) -> Vec<(u64, u64)> {
        let (n, p) = (self.shape[d], self.grid[d]);
        match &self.dists[d] {
            Dist::Star => vec![(0, n)],
            Dist::GenBlock(b) => {
                let lo: u64 = b[..c as usize].iter().sum();
                let hi = lo + b[c as usize];
                if lo < hi {
                    vec![(lo, hi)]
                } else {
                    Vec::new()
                }
            }
            Dist::Block => {
                let b = n.div_ceil(p);
                let lo = (c * b).min(n);
                let hi = ((c + 1) * b).min(n);
                if lo < hi {
                    vec![(lo, hi)]
                } else {
                    Vec::new()
                }
            }
            &Dist::Cyclic(k) => {
                let mut v = Vec::new();
                let mut lo = c * k;
                while lo < n {
                    v.push((lo, (lo + k).min(n)));
                    lo += k * p;
                }
                v
            }
        }
    }

    /// The shape of `rank`'s local array (zero in a dimension where it
    /// owns nothing).
    pub fn local_shape(&self, rank: u64) -> Vec<u64> {
        let c = self.coords(rank);
        (0..self.shape.len()).map(|d| self.intervals(d, c[d]).iter().map(|(lo, hi)| hi - lo).sum()).collect()
    }

    /// The number of elements `rank` holds.
    pub fn local_elements(&self, rank: u64) -> u64 {
        self.local_shape(rank).iter().product()
    }

    /// For each dimension, the global index of each of `rank`'s local
    /// indices: what fills or checks a local array element by element.
    pub fn local_to_global(&self, rank: u64) -> Vec<Vec<u64>> {
        let c = self.coords(rank);
        (0..self.shape.len()).map(|d| self.intervals(d, c[d]).into_iter().flat_map(|(lo, hi)| lo..hi).collect()).collect()
    }

    /// Which rank holds global element `g`, and at which local C-order
    /// element index: computed from the closed forms, independently of
    /// [`Distribution::intervals`], so each can check the other.
    pub fn owner(&self, g: &[u64]) -> (u64, u64) {
        let n = self.shape.len();
        let mut coords = vec![0; n];
        let mut local = vec![0; n];
        for d in 0..n {
            let p = self.grid[d];
            (coords[d], local[d]) = match &self.dists[d] {
                Dist::Star => (0, g[d]),
                Dist::GenBlock(b) => {
                    // The process whose block's end is past g: the first
                    // prefix sum above g (blocks may be empty).
                    let ends: Vec<u64> = b.iter().scan(0, |e, &x| {
                        *e += x;
                        Some(*e)
                    }).collect();
                    let c = ends.partition_point(|&e| e <= g[d]);
                    (c as u64, g[d] - (ends[c] - b[c]))
                }
                Dist::Block => {
                    let b = self.shape[d].div_ceil(p);
                    (g[d] / b, g[d] % b)
                }
                &Dist::Cyclic(k) => ((g[d] / k) % p, (g[d] / (k * p)) * k + g[d] % k),
            };
        }
        let rank = crate::ravel(&coords, &self.grid);
        (rank, crate::ravel(&local, &self.local_shape(rank)))
    }
}
