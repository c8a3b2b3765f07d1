//! The request store every policy shares.
//!
//! Each queued request lives once in a slab and is indexed twice, as in
//! mq-deadline: in its file's offset-ordered map (one per op) for "next by
//! position" and aggregation, and in a global arrival FIFO for "oldest".
//! Policies keep their own indices on top, by slot, and learn of removals
//! through the dispatch they are shown.
//!
//! The store also keeps, per file, the dispatches in flight and the requests
//! blocked behind an overlapping write, so the conflict check is local to
//! one file.

use std::collections::VecDeque;

use crate::idmap::IdMap;
use crate::index::OffsetIndex;
use crate::types::{DispatchId, FileId, Nanos, Op, Request};

/// Index of a queued request in the slab.
pub(crate) type Slot = u32;

/// How an aggregate gathers requests around its first one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gather {
    /// Bytes the aggregate may span.
    pub limit: u64,
    /// Take contiguous requests at all (false: the first request alone).
    pub merge: bool,
    /// Also take contiguous requests below the first one.
    pub backward: bool,
}

/// A request as the scheduler holds it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub req: Request,
    pub arrival: Nanos,
    /// Admission order, unique over the scheduler's life.
    pub seq: u64,
}

/// A dispatch in flight, as the conflict check needs it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InFlight {
    pub id: DispatchId,
    pub op: Op,
    pub offset: u64,
    pub end: u64,
}

/// A file's dispatches in flight. The first sits in the file's record
/// itself: most files have one at a time (aioli keeps a gathering file
/// to one), and a completion then finds it without following a pointer
/// to a heap buffer, a cache miss of its own at many files. More go to a
/// vector. Order is not kept (no reader needs it).
#[derive(Default, Debug)]
pub(crate) struct InFlightList {
    first: Option<InFlight>,
    rest: Vec<InFlight>,
}

impl InFlightList {
    pub fn push(&mut self, f: InFlight) {
        if self.first.is_none() {
            self.first = Some(f);
        } else {
            self.rest.push(f);
        }
    }

    /// Remove dispatch `id`, if listed.
    pub fn remove(&mut self, id: DispatchId) {
        if self.first.is_some_and(|f| f.id == id) {
            self.first = self.rest.pop();
        } else if let Some(at) = self.rest.iter().position(|f| f.id == id) {
            self.rest.swap_remove(at);
        }
    }

    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    pub fn iter(&self) -> impl Iterator<Item = &InFlight> {
        self.first.iter().chain(&self.rest)
    }
}

/// Everything pending on one file.
#[derive(Default, Debug)]
pub(crate) struct FileQ {
    /// Eligible requests by `(offset, seq)`, reads at 0 and writes at 1.
    pub maps: [OffsetIndex; 2],
    /// Longest request queued since the maps were last empty: bounds how
    /// far back an overlap search must look.
    pub len_max: u64,
    pub bytes: u64,
    /// Writes pending on the file: queued, blocked or in flight. A read on
    /// a file without any cannot conflict.
    pub writes: u32,
    pub inflight: InFlightList,
    /// Requests waiting for an earlier overlapping request, arrival order.
    pub blocked: VecDeque<Entry>,
    /// The record sits in the idle cache.
    pub idle_cached: bool,
    /// Which of the file's idle periods its `idle_order` entry belongs to:
    /// older entries for the same file are stale.
    idle_generation: u64,
}

impl FileQ {
    pub fn count(&self) -> usize {
        self.maps[0].len() + self.maps[1].len()
    }

    pub fn is_idle(&self) -> bool {
        self.count() == 0 && self.inflight.is_empty() && self.blocked.is_empty()
    }
}

pub(crate) fn op_index(op: Op) -> usize {
    match op {
        Op::Read => 0,
        Op::Write => 1,
    }
}

/// A FIFO of slots with lazy deletion, compacted so that dead entries never
/// outnumber live ones by more than a constant: its length stays bounded by
/// `2 * live + COMPACT_SLACK`.
#[derive(Default, Debug)]
pub(crate) struct LazyFifo {
    q: VecDeque<(u64, Slot)>,
}

/// Dead entries tolerated before a compaction is considered.
const COMPACT_SLACK: usize = 64;

impl LazyFifo {
    /// Drop dead entries once they outnumber `live` by the slack. Called
    /// after removals, so the bound holds at all times.
    pub fn shrink(&mut self, store: &Store, live: usize) {
        if self.q.len() > 2 * live + COMPACT_SLACK {
            self.q.retain(|&(seq, s)| store.live(s, seq));
        }
    }

    /// Append, keeping the FIFO sorted by `seq`: an entry older than the
    /// back (a request released from the blocked list) is placed in order.
    pub fn push(&mut self, e: &Entry, slot: Slot, store: &Store, live: usize) {
        self.shrink(store, live);
        match self.q.back() {
            Some(&(back, _)) if back > e.seq => {
                let at = self.q.partition_point(|&(seq, _)| seq < e.seq);
                self.q.insert(at, (e.seq, slot));
            }
            _ => self.q.push_back((e.seq, slot)),
        }
    }

    /// The oldest live slot, dropping dead ones from the front.
    pub fn front(&mut self, store: &Store) -> Option<Slot> {
        while let Some(&(seq, s)) = self.q.front() {
            if store.live(s, seq) {
                return Some(s);
            }
            self.q.pop_front();
        }
        None
    }

    /// Start loading the FIFO's newest entry (where a push goes).
    #[inline]
    pub fn prefetch_back(&self) {
        if let Some(b) = self.q.back() {
            crate::prefetch::prefetch_head(b);
        }
    }

    /// The oldest live slot, leaving dead ones in place (for checks).
    pub fn peek(&self, store: &Store) -> Option<Slot> {
        self.q.iter().find(|&&(seq, s)| store.live(s, seq)).map(|&(_, s)| s)
    }

    pub fn len(&self) -> usize {
        self.q.len()
    }
}

/// Idle file records kept for reuse: dropping a record frees its maps'
/// nodes, and a file touched again soon would allocate them anew. Past this
/// many, the longest-idle records are dropped.
pub(crate) const FILES_IDLE_CACHED_MAX: usize = 1_024;

/// All eligible requests, plus per-file in-flight and blocked lists.
#[derive(Default)]
pub(crate) struct Store {
    slab: Vec<Option<Entry>>,
    free: Vec<Slot>,
    /// Active files (something pending) and up to `FILES_IDLE_CACHED_MAX`
    /// idle ones.
    pub files: IdMap<FileId, FileQ>,
    pub files_active: usize,
    files_idle: usize,
    /// Files that went idle, oldest first, with the generation of that idle
    /// period; stale entries (the file became active again since) are
    /// skipped and compacted away like `LazyFifo`'s.
    idle_order: VecDeque<(FileId, u64)>,
    idle_generation_next: u64,
    arrivals: LazyFifo,
    /// Reused by `take` (the slots an index span gave back).
    scratch: Vec<Slot>,
    /// Eligible requests and their bytes.
    pub queued: usize,
    pub queued_bytes: u64,
}

impl Store {
    /// Start loading what admitting a request on `file` touches: the slot
    /// it will take, the file's record, the arrival FIFO's end.
    #[inline]
    pub fn prefetch_arrival(&self, file: FileId) {
        if let Some(e) = self.free.last().and_then(|&s| self.slab.get(s as usize)) {
            crate::prefetch::prefetch(e);
        }
        self.files.prefetch(&file);
        self.arrivals.prefetch_back();
    }

    pub fn live(&self, slot: Slot, seq: u64) -> bool {
        matches!(self.slab.get(slot as usize), Some(Some(e)) if e.seq == seq)
    }

    pub fn entry(&self, slot: Slot) -> &Entry {
        self.slab[slot as usize].as_ref().expect("slot is live")
    }

    /// Admit an eligible request; returns its slot.
    pub fn insert(&mut self, e: Entry) -> Slot {
        let slot = match self.free.pop() {
            Some(s) => {
                self.slab[s as usize] = Some(e);
                s
            }
            None => {
                self.slab.push(Some(e));
                (self.slab.len() - 1) as Slot
            }
        };
        let fq = self.files.get_or_insert_with(e.req.file, FileQ::default);
        if fq.is_idle() {
            self.files_active += 1;
            // A cached record becomes active again; a new one was not idle.
            self.files_idle -= usize::from(fq.idle_cached);
            fq.idle_cached = false;
        }
        fq.writes += u32::from(e.req.op == Op::Write);
        fq.maps[op_index(e.req.op)].insert((e.req.offset, e.seq), slot);
        fq.len_max = fq.len_max.max(e.req.len);
        fq.bytes += e.req.len;
        self.compact_idle_order();
        self.queued += 1;
        self.queued_bytes += e.req.len;
        let live = self.queued;
        let mut arrivals = std::mem::take(&mut self.arrivals);
        arrivals.push(&e, slot, self, live);
        self.arrivals = arrivals;
        slot
    }

    /// The oldest eligible request.
    pub fn oldest(&mut self) -> Option<Slot> {
        let mut arrivals = std::mem::take(&mut self.arrivals);
        let front = arrivals.front(self);
        self.arrivals = arrivals;
        front
    }

    /// The eligible request with the lowest `(offset, seq)` at or after
    /// `offset` in `file`'s `op` map.
    pub fn first_at_or_after(&self, file: FileId, op: Op, offset: u64) -> Option<Slot> {
        let fq = self.files.get(&file)?;
        fq.maps[op_index(op)].from((offset, 0)).next().map(|(_, s)| s)
    }

    /// An eligible request starting exactly at `offset`, either op.
    pub fn starting_at(&self, file: FileId, offset: u64) -> Option<Slot> {
        let fq = self.files.get(&file)?;
        fq.maps.iter().find_map(|m| m.range((offset, 0), (offset + 1, 0)).next().map(|(_, s)| s))
    }

    /// The slots of the contiguous run around `start`, in offset order, whose
    /// span stays within `g.limit` bytes (the start request alone may
    /// exceed it). With `g.merge` false the run is the start request alone.
    pub fn run(&self, start: Slot, g: Gather, out: &mut Vec<Slot>) {
        let Gather { limit, merge, backward } = g;
        out.clear();
        let s = self.entry(start);
        if !merge {
            out.push(start);
            return;
        }
        let map = &self.files.get(&s.req.file).expect("file of a queued request").maps[op_index(s.req.op)];
        let key = (s.req.offset, s.seq);
        let (mut lo, mut hi) = (s.req.offset, s.req.end());
        if backward {
            for (_, c) in map.before(key) {
                let r = self.entry(c).req;
                if r.end() < lo || hi.max(r.end()) - r.offset > limit {
                    break;
                }
                lo = r.offset;
                hi = hi.max(r.end());
                out.push(c);
            }
        }
        out.reverse();
        out.push(start);
        for (_, c) in map.after(key) {
            let r = self.entry(c).req;
            if r.offset > hi || hi.max(r.end()) - lo > limit {
                break;
            }
            hi = hi.max(r.end());
            out.push(c);
        }
    }

    /// Remove the slots of a run (`Store::run`'s: consecutive in their
    /// file's index), returning their entries in offset order.
    pub fn take(&mut self, run: &[Slot], out: &mut Vec<Entry>) {
        out.clear();
        let Some(&start) = run.first() else { return };
        let first = *self.entry(start);
        let fq = self.files.get_mut(&first.req.file).expect("file of a queued request");
        let mut slots = std::mem::take(&mut self.scratch);
        slots.clear();
        fq.maps[op_index(first.req.op)].remove_span((first.req.offset, first.seq), run.len(), &mut slots);
        assert_eq!(slots, run, "a run is consecutive in its file's index");
        for &slot in run {
            let e = self.slab[slot as usize].take().expect("slot is live");
            self.free.push(slot);
            fq.bytes -= e.req.len;
            self.queued -= 1;
            self.queued_bytes -= e.req.len;
            out.push(e);
        }
        if fq.count() == 0 {
            fq.len_max = 0;
        }
        self.scratch = slots;
        let mut arrivals = std::mem::take(&mut self.arrivals);
        arrivals.shrink(self, self.queued);
        self.arrivals = arrivals;
    }

    /// Whether a request `(op, offset..end)` on `file` that was admitted as
    /// `seq` must wait: some pending request admitted before it (queued,
    /// blocked or in flight) overlaps it and one of the two is a write.
    pub fn conflicts(&self, file: FileId, op: Op, offset: u64, end: u64, seq: u64) -> bool {
        let Some(fq) = self.files.get(&file) else { return false };
        if op == Op::Read && fq.writes == 0 {
            return false;
        }
        let clash = |other_op: Op, o_off: u64, o_end: u64| (op == Op::Write || other_op == Op::Write) && o_off < end && offset < o_end;
        if fq.inflight.iter().any(|f| clash(f.op, f.offset, f.end)) {
            return true;
        }
        if fq.blocked.iter().take_while(|b| b.seq < seq).any(|b| clash(b.req.op, b.req.offset, b.req.end())) {
            return true;
        }
        let from = offset.saturating_sub(fq.len_max);
        let maps: &[usize] = if op == Op::Write { &[0, 1] } else { &[1] };
        maps.iter().filter(|&&i| !fq.maps[i].is_empty()).any(|&i| {
            fq.maps[i].range((from, 0), (end, 0)).any(|((_, s_seq), slot)| {
                let r = self.entry(slot).req;
                s_seq < seq && clash(r.op, r.offset, r.end())
            })
        })
    }

    /// Once nothing is pending on `file`, move its record to the idle
    /// cache, dropping the longest-idle records past the cache bound.
    pub fn settle(&mut self, file: FileId) {
        let Some(fq) = self.files.get_mut(&file) else { return };
        if !fq.is_idle() || fq.idle_cached {
            return;
        }
        fq.idle_cached = true;
        fq.len_max = 0;
        fq.idle_generation = self.idle_generation_next;
        self.idle_order.push_back((file, self.idle_generation_next));
        self.idle_generation_next += 1;
        self.files_active -= 1;
        self.files_idle += 1;
        while self.files_idle > FILES_IDLE_CACHED_MAX {
            let (old, generation) = self.idle_order.pop_front().expect("idle files are listed");
            if self.is_idle_entry(old, generation) {
                self.files.remove(&old);
                self.files_idle -= 1;
            }
        }
        self.compact_idle_order();
    }

    /// Whether an `idle_order` entry is the current one of an idle file.
    fn is_idle_entry(&self, file: FileId, generation: u64) -> bool {
        self.files.get(&file).is_some_and(|q| q.idle_cached && q.idle_generation == generation)
    }

    /// Drop stale entries once they outnumber the live ones by the slack;
    /// each idle file has exactly one live entry, so this is amortised O(1).
    fn compact_idle_order(&mut self) {
        if self.idle_order.len() > 2 * self.files_idle + 64 {
            let mut order = std::mem::take(&mut self.idle_order);
            order.retain(|&(f, g)| self.is_idle_entry(f, g));
            self.idle_order = order;
        }
    }

    /// Idle records cached, the length of their order list, and how many
    /// of its entries are live (exactly one per idle record, which is what
    /// lets a compaction shrink the list below its threshold).
    pub fn idle_counts(&self) -> (usize, usize, usize) {
        let live = self.idle_order.iter().filter(|&&(f, g)| self.is_idle_entry(f, g)).count();
        (self.files_idle, self.idle_order.len(), live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn in_flight_list_behaves_as_a_set(steps in proptest::collection::vec((proptest::bool::ANY, 0u64..6), 1..60)) {
            let mut l = InFlightList::default();
            let mut model: Vec<u64> = Vec::new();
            for (push, id) in steps {
                if push && !model.contains(&id) {
                    l.push(InFlight { id: DispatchId(id), op: Op::Read, offset: id, end: id + 1 });
                    model.push(id);
                } else {
                    l.remove(DispatchId(id));
                    model.retain(|&m| m != id);
                }
                let mut have: Vec<u64> = l.iter().map(|f| f.id.0).collect();
                have.sort_unstable();
                let mut want = model.clone();
                want.sort_unstable();
                proptest::prop_assert_eq!(have, want);
                proptest::prop_assert_eq!((l.len(), l.is_empty()), (model.len(), model.is_empty()));
            }
        }
    }
}
