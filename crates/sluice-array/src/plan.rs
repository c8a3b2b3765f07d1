//! The planner: from where elements are in memory ([`Distribution`]) and
//! on disk ([`Layout`]), the list of byte runs to move.
//!
//! For each rank, its owned region is a product of index intervals, one
//! list per dimension (one interval for BLOCK, several for CYCLIC(k)).
//! Each box of that product is cut by the chunk grid; inside a chunk, each
//! row along the last dimension is contiguous both in the rank's memory
//! and in the chunk's file, and consecutive rows that stay contiguous in
//! both are joined. Every element of the array lands in exactly one piece
//! (property-tested in `tests/plan.rs`).

use crate::{limit, ravel, unravel, Distribution, Error, Layout};

/// One run of bytes: `len` bytes at `mem_off` in rank `rank`'s local array
/// are `len` bytes at `file_off` in file `unit` of the array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Piece {
    pub unit: u64,
    pub file_off: u64,
    pub rank: u64,
    pub mem_off: u64,
    pub len: u64,
}

/// Bounds of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanLimits {
    /// The most pieces a plan may hold, so that a fine CYCLIC(1) of a large
    /// array is refused with an error instead of exhausting memory. At 40
    /// bytes a piece, the default holds 160 MiB.
    pub pieces_max: usize,
}

impl Default for PlanLimits {
    fn default() -> PlanLimits {
        PlanLimits { pieces_max: 1 << 22 }
    }
}

/// Every piece of a collective operation, grouped by rank, each rank's
/// sorted by memory offset.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pieces: Vec<Piece>,
    /// `starts[r]..starts[r + 1]` are rank `r`'s pieces.
    starts: Vec<usize>,
}

impl Plan {
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// Rank `r`'s pieces, by memory offset.
    pub fn rank(&self, r: u64) -> impl Iterator<Item = &Piece> {
        let r = r as usize;
        self.pieces[self.starts[r]..self.starts[r + 1]].iter()
    }

    /// Every piece in disk order (file, then offset): the order in which a
    /// server-directed transfer visits them.
    pub fn disk_order(&self) -> Vec<Piece> {
        let mut v = self.pieces.clone();
        v.sort_unstable();
        v
    }

    /// Bytes moved in all.
    pub fn bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
    }

    /// Rank `r`'s pieces grouped by file, each group in disk order.
    pub fn rank_files(&self, r: u64) -> Vec<Vec<Piece>> {
        let mut mine: Vec<Piece> = self.rank(r).copied().collect();
        mine.sort_unstable();
        mine.chunk_by(|a, b| a.unit == b.unit).map(|g| g.to_vec()).collect()
    }

    /// For a server-directed transfer in which every rank sends its pieces
    /// of each file as [`messages`]: `participants[u][j]` is how many ranks
    /// have a j-th message for file `u` (the j-th messages of a file form
    /// one group, so no rank waits on its own later message).
    pub fn group_participants(&self, units: u64, limits: &MessageLimits) -> Vec<Vec<u32>> {
        let mut participants: Vec<Vec<u32>> = vec![Vec::new(); units as usize];
        for r in 0..self.starts.len() as u64 - 1 {
            for file in self.rank_files(r) {
                let row = &mut participants[file[0].unit as usize];
                for j in 0..messages(&file, limits).len() {
                    if row.len() <= j {
                        row.push(0);
                    }
                    row[j] += 1;
                }
            }
        }
        participants
    }

    /// `bytes[u][r]`: the bytes of file `u` that rank `r` holds, for
    /// placement.
    pub fn unit_rank_bytes(&self, units: u64, ranks: u64) -> Vec<Vec<u64>> {
        let mut m = vec![vec![0u64; ranks as usize]; units as usize];
        for p in &self.pieces {
            m[p.unit as usize][p.rank as usize] += p.len;
        }
        m
    }
}

/// Plan a collective transfer of the whole array between the ranks of
/// `dist` and the files of `layout`.
pub fn plan(dist: &Distribution, layout: &Layout, limits: &PlanLimits) -> Result<Plan, Error> {
    if dist.shape() != layout.shape() {
        return Err(crate::invalid(format!("the distribution's shape {:?} differs from the layout's {:?}", dist.shape(), layout.shape())));
    }
    let mut plan = Plan { pieces: Vec::new(), starts: vec![0] };
    for r in 0..dist.ranks() {
        let start = plan.pieces.len();
        plan_rank(dist, layout, r, limits, &mut plan.pieces)?;
        plan.pieces[start..].sort_unstable_by_key(|p| p.mem_off);
        plan.starts.push(plan.pieces.len());
    }
    Ok(plan)
}

/// One box of a rank's region: per dimension, the global interval and the
/// local index where it starts.
struct RankBox {
    lo: Vec<u64>,
    hi: Vec<u64>,
    local_lo: Vec<u64>,
}

fn plan_rank(dist: &Distribution, layout: &Layout, r: u64, limits: &PlanLimits, out: &mut Vec<Piece>) -> Result<(), Error> {
    let n = dist.shape().len();
    let coords = dist.coords(r);
    let per_dim: Vec<Vec<(u64, u64, u64)>> = (0..n)
        .map(|d| {
            let mut local = 0;
            dist.intervals(d, coords[d])
                .into_iter()
                .map(|(lo, hi)| {
                    let l = local;
                    local += hi - lo;
                    (lo, hi, l)
                })
                .collect()
        })
        .collect();
    if per_dim.iter().any(|v| v.is_empty()) {
        return Ok(());
    }
    let counts: Vec<u64> = per_dim.iter().map(|v| v.len() as u64).collect();
    let local_shape = dist.local_shape(r);
    for b in 0..counts.iter().product() {
        let pick = unravel(b, &counts);
        let rb = RankBox {
            lo: (0..n).map(|d| per_dim[d][pick[d] as usize].0).collect(),
            hi: (0..n).map(|d| per_dim[d][pick[d] as usize].1).collect(),
            local_lo: (0..n).map(|d| per_dim[d][pick[d] as usize].2).collect(),
        };
        plan_box(layout, r, &rb, &local_shape, limits, out)?;
    }
    Ok(())
}

/// Cut one box of rank `r` by the chunk grid, in the rank's memory order
/// (rows of the box in C order, chunks along each row in turn).
fn plan_box(layout: &Layout, r: u64, rb: &RankBox, local_shape: &[u64], limits: &PlanLimits, out: &mut Vec<Piece>) -> Result<(), Error> {
    let n = rb.lo.len();
    let el = layout.dtype().bytes();
    let chunk = layout.chunk();
    let rows: Vec<u64> = (0..n - 1).map(|d| rb.hi[d] - rb.lo[d]).collect();
    let rows_total: u64 = rows.iter().product();
    let last = n - 1;
    // The row's coordinates, global and local, advanced in C order from
    // one row to the next (no allocation a row).
    let mut g = rb.lo.clone();
    let mut local = rb.local_lo.clone();
    for row in 0..rows_total {
        if row > 0 {
            for d in (0..last).rev() {
                g[d] += 1;
                local[d] += 1;
                if g[d] < rb.hi[d] {
                    break;
                }
                g[d] = rb.lo[d];
                local[d] = rb.local_lo[d];
            }
        }
        // Walk the row chunk by chunk along the last dimension.
        let mut x = rb.lo[last];
        while x < rb.hi[last] {
            let end = ((x / chunk[last] + 1) * chunk[last]).min(rb.hi[last]);
            g[last] = x;
            local[last] = rb.local_lo[last] + (x - rb.lo[last]);
            let (unit, file_off) = layout.locate(&g);
            let piece = Piece { unit, file_off, rank: r, mem_off: ravel(&local, local_shape) * el, len: (end - x) * el };
            push(out, piece, limits)?;
            x = end;
        }
    }
    Ok(())
}

/// Append `p`, joining it to the previous piece when both runs continue.
fn push(out: &mut Vec<Piece>, p: Piece, limits: &PlanLimits) -> Result<(), Error> {
    if let Some(q) = out.last_mut() {
        if q.rank == p.rank && q.unit == p.unit && q.file_off + q.len == p.file_off && q.mem_off + q.len == p.mem_off {
            q.len += p.len;
            return Ok(());
        }
    }
    if out.len() >= limits.pieces_max {
        return Err(limit(format!("the plan needs more than {} pieces (pieces_max); use larger chunks or a coarser distribution", limits.pieces_max)));
    }
    out.push(p);
    Ok(())
}

/// The most pieces and bytes of one list message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageLimits {
    pub pieces_max: usize,
    pub bytes_max: u64,
}

impl MessageLimits {
    /// A collective's list messages (the Rust collective and the Python
    /// binding alike): the protocol's `LIST_PIECES_MAX` (4,096, checked in
    /// `sluice-zarr`) and 16 MiB, large enough that a message's fixed cost
    /// is small, small enough that several are in flight per server.
    pub const COLLECTIVE: MessageLimits = MessageLimits { pieces_max: 4096, bytes_max: 16 << 20 };
}

/// The memory side of a message: `pieces`' bytes of a rank's `local`
/// array, back to back, as a list write sends them.
pub fn gather(pieces: &[Piece], local: &[u8]) -> Vec<u8> {
    let mut data = Vec::with_capacity(pieces.iter().map(|p| p.len as usize).sum());
    for p in pieces {
        data.extend_from_slice(&local[p.mem_off as usize..(p.mem_off + p.len) as usize]);
    }
    data
}

/// The reverse of [`gather`]: a list read's `data` into `local`.
pub fn scatter(pieces: &[Piece], data: &[u8], local: &mut [u8]) {
    let mut at = 0;
    for p in pieces {
        local[p.mem_off as usize..(p.mem_off + p.len) as usize].copy_from_slice(&data[at..at + p.len as usize]);
        at += p.len as usize;
    }
}

/// Cut one file's pieces (in disk order) into list messages within
/// `limits`; a piece longer than `bytes_max` is cut too.
pub fn messages(pieces: &[Piece], limits: &MessageLimits) -> Vec<Vec<Piece>> {
    let (mut out, mut cur, mut bytes): (Vec<Vec<Piece>>, Vec<Piece>, u64) = (Vec::new(), Vec::new(), 0);
    for p in pieces {
        let mut p = *p;
        while p.len > 0 {
            let take = p.len.min(limits.bytes_max - bytes);
            cur.push(Piece { len: take, ..p });
            bytes += take;
            p = Piece { file_off: p.file_off + take, mem_off: p.mem_off + take, len: p.len - take, ..p };
            if bytes == limits.bytes_max || cur.len() == limits.pieces_max {
                out.push(std::mem::take(&mut cur));
                bytes = 0;
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}
