//! Placement: which I/O server owns each file of an array.
//!
//! Panda chooses I/O nodes to minimise the data that crosses the network;
//! with ranks and data servers sharing hosts, that is an assignment
//! problem: give each file (unit) to one server, each server a number of
//! files in proportion to its bandwidth, and maximise the bytes whose rank
//! runs on the file's server's host. One owner per file is also what keeps
//! concurrent partial writes of one Zarr shard from losing data
//! (zarr-python issue 3682).
//!
//! The problem is solved exactly by the Hungarian algorithm
//! (`pathfinding::kuhn_munkres`, O(n³)): rows are files, columns are
//! server slots (a server with capacity c has c columns), weights are the
//! bytes that would stay on the host. Past
//! [`PLACEMENT_HUNGARIAN_UNITS_MAX`] files a greedy pass takes over: each
//! file, largest local share first, goes to the server that keeps most of
//! it on its host and still has room.

use pathfinding::prelude::{kuhn_munkres, Matrix};

use crate::{invalid, Error};

/// The most files placed by the Hungarian algorithm: 512 files and about
/// as many slots take some 10^8 steps (tens of milliseconds); more go to the
/// greedy pass.
pub const PLACEMENT_HUNGARIAN_UNITS_MAX: usize = 512;

/// What placement needs to know.
#[derive(Debug, Clone)]
pub struct PlacementInput<'a> {
    /// `unit_rank_bytes[u][r]`: bytes of file `u` that rank `r` holds.
    pub unit_rank_bytes: &'a [Vec<u64>],
    /// The host of each rank.
    pub rank_host: &'a [usize],
    /// The host of each server.
    pub server_host: &'a [usize],
    /// Each server's share, e.g. its calibrated bandwidth (any positive
    /// unit); files are given in proportion.
    pub server_weight: &'a [f64],
    /// Bytes each server already holds of the array's group (the other
    /// arrays of a timestep; empty: none). The files that do not divide
    /// evenly go to the servers holding least per unit of weight, so a
    /// group of arrays too small to spread (adaptive-mesh patches of one
    /// or two files each) still ends up balanced, not all on server 0.
    pub server_held_bytes: &'a [u64],
    /// The Hungarian algorithm's bound ([`PLACEMENT_HUNGARIAN_UNITS_MAX`]
    /// unless a test lowers it).
    pub hungarian_units_max: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlacementMethod {
    Hungarian,
    Greedy,
}

/// Each file's server, and how many bytes stay on their host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub unit_server: Vec<usize>,
    pub local_bytes: u64,
    pub total_bytes: u64,
    pub method: PlacementMethod,
}

/// Place every file on a server.
pub fn place(input: &PlacementInput) -> Result<Placement, Error> {
    let servers = input.server_host.len();
    if servers == 0 || input.server_weight.len() != servers {
        return Err(invalid("placement needs at least one server, and one weight per server"));
    }
    if input.server_weight.iter().any(|w| !(w.is_finite() && *w > 0.0)) {
        return Err(invalid("every server weight must be positive"));
    }
    if !input.server_held_bytes.is_empty() && input.server_held_bytes.len() != servers {
        return Err(invalid("server_held_bytes needs one entry per server (or none)"));
    }
    let units = input.unit_rank_bytes.len();
    if input.unit_rank_bytes.iter().any(|row| row.len() != input.rank_host.len()) {
        return Err(invalid("unit_rank_bytes must have one column per rank"));
    }
    // local[u][s]: bytes of file u on server s's host.
    let local: Vec<Vec<u64>> = input
        .unit_rank_bytes
        .iter()
        .map(|row| (0..servers).map(|s| row.iter().zip(input.rank_host).filter(|(_, &h)| h == input.server_host[s]).map(|(b, _)| b).sum()).collect())
        .collect();
    let caps = capacities_held(units, input.server_weight, input.server_held_bytes);
    let (unit_server, method) =
        if units <= input.hungarian_units_max { (hungarian(&local, &caps), PlacementMethod::Hungarian) } else { (greedy(&local, &caps), PlacementMethod::Greedy) };
    let local_bytes = unit_server.iter().enumerate().map(|(u, &s)| local[u][s]).sum();
    let total_bytes = input.unit_rank_bytes.iter().flatten().sum();
    Ok(Placement { unit_server, local_bytes, total_bytes, method })
}

/// Files per server, in proportion to the weights (largest remainders),
/// summing to `units`.
pub fn capacities(units: usize, weights: &[f64]) -> Vec<usize> {
    capacities_held(units, weights, &[])
}

/// As [`capacities`], with equal remainders going first to the servers
/// that hold the fewest bytes (`held`, per unit of weight; empty: none)
/// of the group already.
pub fn capacities_held(units: usize, weights: &[f64], held: &[u64]) -> Vec<usize> {
    let sum: f64 = weights.iter().sum();
    let exact: Vec<f64> = weights.iter().map(|w| units as f64 * w / sum).collect();
    let mut caps: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    let load = |s: usize| held.get(s).map_or(0.0, |&b| b as f64 / weights[s]);
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())).then(load(a).total_cmp(&load(b))).then(a.cmp(&b)));
    let short = units - caps.iter().sum::<usize>();
    for &s in order.iter().cycle().take(short) {
        caps[s] += 1;
    }
    caps
}

fn hungarian(local: &[Vec<u64>], caps: &[usize]) -> Vec<usize> {
    if local.is_empty() {
        return Vec::new();
    }
    let slots: Vec<usize> = caps.iter().enumerate().flat_map(|(s, &c)| std::iter::repeat_n(s, c)).collect();
    let m = Matrix::from_fn(local.len(), slots.len(), |(u, k)| local[u][slots[k]] as i64);
    let (_, cols) = kuhn_munkres(&m);
    cols.into_iter().map(|k| slots[k]).collect()
}

fn greedy(local: &[Vec<u64>], caps: &[usize]) -> Vec<usize> {
    let mut left = caps.to_vec();
    let mut order: Vec<usize> = (0..local.len()).collect();
    order.sort_by_key(|&u| std::cmp::Reverse(local[u].iter().max().copied().unwrap_or(0)));
    let mut out = vec![0; local.len()];
    for u in order {
        let s = (0..caps.len()).filter(|&s| left[s] > 0).max_by_key(|&s| (local[u][s], std::cmp::Reverse(s))).unwrap_or(0);
        left[s] = left[s].saturating_sub(1);
        out[u] = s;
    }
    out
}

/// The rank that gathers (writes) or scatters (reads) each file in a
/// client-side two-phase transfer: of the ranks on the file's server's
/// host, the one holding most of the file; if none is there, the one
/// holding most of it anywhere. Ties go to the rank given the fewest files
/// so far, then to the lower rank: files that neighbours hold equally (a
/// chunk cut between two ranks' blocks) spread over them instead of all
/// going to the lowest, which then built and wrote every one while the
/// other waited (a 2 x 2 grid of blocks in chunks of half x and half z:
/// ranks 0 and 2 wrote the four files, 1 and 3 none).
pub fn aggregators(unit_rank_bytes: &[Vec<u64>], rank_host: &[usize], server_host: &[usize], unit_server: &[usize]) -> Vec<usize> {
    let mut given = vec![0usize; rank_host.len()];
    let mut out = Vec::with_capacity(unit_rank_bytes.len());
    for (row, &s) in unit_rank_bytes.iter().zip(unit_server) {
        let load = |r: usize| std::cmp::Reverse(given.get(r).copied().unwrap_or(0));
        let best = |on_host: bool| (0..row.len()).filter(|&r| !on_host || rank_host[r] == server_host[s]).max_by_key(|&r| (row[r], load(r), std::cmp::Reverse(r)));
        let a = best(true).or_else(|| best(false)).unwrap_or(0);
        if let Some(g) = given.get_mut(a) {
            *g += 1;
        }
        out.push(a);
    }
    out
}
