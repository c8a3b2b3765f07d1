//! `aioli`: the scheduler of Lebre, Huard, Denneulin and Sowa, "I/O
//! Scheduling Service for Multi-Application Clusters" (IEEE Cluster 2006;
//! the seed `000_…`), in five mechanisms.
//!
//! 1. **Offset order and aggregation** (the seed's "pre-processing, offset
//!    dependence"). Each file keeps its requests sorted by offset in the
//!    shared store; every dispatch takes the contiguous run around its start
//!    request, across applications, so the strided pieces of a decomposed
//!    read leave as one large access.
//!
//! 2. **Multi-level-feedback quanta** (slides 14/26, steps 1-3). The device
//!    is given to one application at a time for a *turn* of at most its
//!    quantum in bytes. The next turn goes to the application whose oldest
//!    request has waited longest, weighted (the seed's aim: raise the
//!    smallest instantaneous throughput). Each time a turn is handed out,
//!    every other backlogged application's quantum grows by `weight` times
//!    `quantum_bytes_min` (the slides' q = 10, 20, … for three
//!    applications), up to `quantum_bytes_max`; an application that gets
//!    the device drops back to `quantum_bytes_min`. Long waiters thus come
//!    back with long, efficient turns: efficiency with fairness. On a
//!    device that seeks, the minimum is raised to the transfer that makes
//!    the seek to a turn worth while (`DeviceCost::turn_bytes_min`: twice
//!    the seek's time, 2.9 MB on the emulated disk), for the drop and the
//!    growth alike; the seek is the model's or, when longer, the move cost
//!    the policy timed itself on lone dispatches (`seen.rs`), and so for
//!    windows and holds; until it timed a few moves, a model that says
//!    the device seeks is taken to seek at least as a disk does
//!    (`cost::DISK`), since an unconfirmed seek cost may be low by any
//!    factor (tests/model_error.rs). (Growth is
//!    linear per turn waited, not doubling: with ten applications doubling
//!    reaches the cap within one cycle, and small applications then wait
//!    behind ever-longer turns — measured on the seed's ten-application
//!    mix, where they finished later than under fifo.)
//!
//! 3. **Dedicated windows for synchronous readers** (slide 15/26, two `cat`
//!    on two files). A stream (application, client) whose last
//!    `sync_hits_min` requests each started where the previous ended is a
//!    synchronous reader: it cannot send its next request before the last
//!    one completes. When one of its requests completes during its
//!    application's turn, the device is kept for it for a window of twice
//!    its observed think time (clamped to `sync_window_ns_min..max`) instead
//!    of seeking to another file; the think time is the larger of its mean
//!    and its recent peak (the longest, decaying by 1/32 per newer
//!    request), so a reader whose process is now and then woken late on a
//!    busy host keeps its window through it. On a disk the model says
//!    seeks and serves one dispatch at a time, no second dispatch goes
//!    behind one that holds such a reader of the turn's application: it
//!    would end the turn before the reader's next request came
//!    (`window_candidates`). A window that expires unused
//!    resets the stream's evidence, so a reader that stopped costs one
//!    window only, and one whose reader sends a request elsewhere ends.
//!    Evidence is a request that starts where the stream's last one ended
//!    and was sent after that one completed, or a new stream's first
//!    request at offset 0 (as Linux's read-ahead takes a read at a file's
//!    start; with no think time measured yet the window is half the
//!    longest); the pieces of one access that a client splits and sends
//!    together neither count nor reset it. Processes that each wait for
//!    their own piece and together go through a file in order (a
//!    decomposition: no process is
//!    sequential, but each aggregate starts where the last one ended) are
//!    a synchronous reader too, of the file: when the turn's application
//!    has nothing queued after such an aggregate completed, the device
//!    waits for the first piece of the next one for twice the file's
//!    observed think time, and the turn goes on from it (a hold gathers
//!    the rest). Without it, mix10's decompositions got one round a turn
//!    and a far seek there and back each (mix10 on the emulated disk:
//!    52 seeks and 1.74 s, then 33-37 seeks and 1.52-1.56 s).
//!
//! 4. **A quantum adapted to the file's access history** (slide 16/26, n
//!    processes each issuing read(4MB) split by the file system). Each file
//!    has an aggregate target between `file_target_bytes_min` and `..max`.
//!    A request that arrives right next to a piece another stream had
//!    dispatched moments ago (a dispatch it was not part of) could have left
//!    in the same aggregate: the pieces are interleaved, and the target
//!    becomes one piece per stream active on the file. While gathering,
//!    aggregates start at the file's lowest piece, so processes that fell
//!    behind are served first and the others fall back into step. When an aggregate below target is
//!    chosen, the device is held for the missing pieces, for the file's own
//!    hold time counted from the oldest member's arrival. That hold adapts
//!    too (`hold_ns_min..max`): it drifts toward twice the time pieces took
//!    to gather, and doubles when pieces arrive just after a hold gave up.
//!    A hold that expires shrinks the target to what was reached, so a file
//!    whose pieces stopped coming stops being waited for. While its queued
//!    bytes are below its target, a gathering file keeps at most
//!    `GATHER_INFLIGHT_MAX` dispatches in flight (one): its pieces wait in
//!    the store while that one is on the device, and join,
//!    rather than leave one or two at a time through every free slot of a
//!    parallel device (where the hold rule, which weighs every free slot
//!    as idle, would not hold them). When the file's lowest queued piece
//!    lies past a gap after where its last dispatch ended (a process woken
//!    late), the device waits for the gap's piece, once per gap, for the
//!    file's hold time (`gap_wait`): starting past it costs a move there,
//!    one back for the piece and one forward again (the emulated disk
//!    learned from scratch, eight dispatches allowed: 1.44 s and 244 moves
//!    without it in one case of tests/learned_disk.rs, 0.28 s and 6 moves
//!    with it). A stream counts as able to send while it sent lately or
//!    was answered lately and sent nothing since. The late piece itself,
//!    once dispatched just behind the file's last aggregate, neither
//!    moves the file's end nor cuts its target. On a disk that seeks and
//!    serves one dispatch at a time, a file keeps one dispatch in flight
//!    whether gathering or not (a second would only queue behind the
//!    first, committed before the late piece comes).
//!
//! 5. **Bounds.** Holds and windows are capped in time, turns in bytes and
//!    in time (`turn_ns_max`), and
//!    the scheduler's expiry serves anything older than
//!    `request_expire_ns` first; tables of streams and file histories are
//!    capped and evict the least recently used half when full.
//!
//! Where the seed is silent we chose: the turn order (longest weighted
//! wait), growth on hand-out rather than on a clock tick, and adaptive
//! rather than fixed window lengths.
//!
//! Cost: O(log n) per request for the store indices, and O(backlogged
//! applications) per turn: a scan of a dense array of their oldest
//! arrivals (no lookups). The quanta grow lazily, from a count of turns
//! handed out, instead of one by one at every turn.

use super::seen::DeviceSeen;
use super::{Pick, Policy};
use crate::config::{AioliParams, Limits};
use crate::cost::DeviceCost;
use crate::flat::FlatMap;
use crate::hash::FxHashMap;
use crate::idmap::IdMap;
use crate::qos::Gate;
use crate::share::{Rank, Share};
use crate::store::{op_index, Entry, Gather, LazyFifo, Slot, Store};
use crate::types::{AppId, ClientId, Dispatch, DispatchId, FileId, Nanos, Op};

/// Fewest device slots queued bytes are spread over when joining them
/// past the useful size (`pick`): the daemon's default depth.
const SPREAD_SLOTS: u32 = 8;
/// Dispatches a gathering file keeps in flight while its queued bytes are
/// below its target (mechanism 4). On the 2-core VM's virtual disk, whose
/// latency under load barely grows with length (a server trace of the
/// 4 KiB x 32 O_DIRECT decomposition at depth 8: median 187-215 us from
/// 4 KiB to 128 KiB), eight slots took the file's pieces about two at a
/// time as they came (1.7-2.4 requests a dispatch, 0.79-0.86x direct
/// `pread`); a limit of three joined 4.1-4.2 (0.87-1.01x), two 5.8-7.8,
/// and one 10.5-13.1, the next dispatch taking everything that arrived
/// while the last was on the device (six alternating pairs: 0.98x direct
/// against 0.87x with two, medians; docs/scheduling.md). Other files
/// keep the device's other slots; files whose pieces already reach the
/// target (64 KiB x 32: useful size below one piece) keep every slot.
const GATHER_INFLIGHT_MAX: usize = 1;
/// Largest aggregate that spreading queued pieces builds past the useful
/// size on a device that serves several at once: it is there to spread
/// each dispatch's CPU over more bytes, and past 1 MiB that cost is small
/// next to the transfer. With one dispatch at a time no slot is taken
/// away and each piece joined saves its fixed cost, so the queued bytes
/// over `SPREAD_SLOTS` go whole (1 MiB x 128 on the virtual disk, learned
/// one at a time: capped, one piece a dispatch and 1.22-1.35x
/// fifo-merge's time, which joined seven; uncapped 1.01-1.04x).
const SPREAD_BYTES_MAX: u64 = 1 << 20;
/// Entries of a file's map examined when looking for the turn
/// application's next request after the head.
const TURN_SCAN_MAX: usize = 32;
/// Streams remembered per file for the active-stream count.
const FILE_STREAMS_MAX: usize = 256;
/// Recently dispatched ranges remembered (by start and by end) to spot
/// interleaved neighbours: at most this many. Ranges older than the
/// evidence window are swept out when the tables reach twice what the
/// last sweep kept; when more than half the bound is recent, both tables
/// are cleared.
const RECENT_PIECES_MAX: usize = 4_096;
const RECENT_SWEEP_MIN: usize = 64;
/// Members of a dispatch whose stream slots are prefetched before its
/// bookkeeping (`prefetch_dispatch`); a load past the first few would only
/// evict what the others brought in.
const PREFETCH_MEMBERS_MAX: usize = 8;

struct App {
    weight: u32,
    /// The quantum when `since` turns had been handed out; while the
    /// application is backlogged it grows by `weight` times the minimum
    /// for every turn handed out since (`Aioli::quantum_now`).
    quantum: u64,
    since: u64,
    fifo: LazyFifo,
    live: usize,
    forgotten: bool,
    /// While backlogged: the arrival of its oldest request, and its index
    /// in `Aioli::backlog`.
    head: Option<Nanos>,
    at: usize,
}

#[derive(Clone, Copy)]
struct Turn {
    app: AppId,
    remaining: u64,
    /// When the turn began: it ends after `turn_ns_max` whatever is left.
    started: Nanos,
    file: FileId,
    op: Op,
    next_offset: u64,
}

/// One (application, client) stream. Its table is the policy's largest
/// (a server sees every process), so the record is kept to 56 bytes:
/// `NONE` stands for an absent offset, time or dispatch (none of them can
/// reach `u64::MAX`).
struct Stream {
    /// Where the stream's next request would start if it is sequential
    /// (offset `NONE`: unknown).
    expected_file: FileId,
    expected_offset: u64,
    think_ns: u64,
    /// When its last request completed, if it sent none since (`NONE`:
    /// never, or it sent one since).
    last_complete: Nanos,
    /// The last dispatch the stream had a request in (`NONE`: none).
    last_dispatch: u64,
    used: u64,
    hits: u32,
    /// The longest recent think time, decaying by 1/32 at each newer
    /// one (nanoseconds, saturating): a reader that is late now and then
    /// keeps a window that long.
    think_peak: u32,
}

const NONE: u64 = u64::MAX;

impl Default for Stream {
    fn default() -> Stream {
        Stream { expected_file: FileId(0), expected_offset: NONE, think_ns: 0, last_complete: NONE, last_dispatch: NONE, used: 0, hits: 0, think_peak: 0 }
    }
}

impl Stream {
    fn expects(&self, file: FileId, offset: u64) -> bool {
        self.expected_offset != NONE && (self.expected_file, self.expected_offset) == (file, offset)
    }

    fn last_dispatch(&self) -> Option<DispatchId> {
        (self.last_dispatch != NONE).then_some(DispatchId(self.last_dispatch))
    }
}

struct FileHist {
    target: u64,
    /// Streams that sent requests to the file lately, with when (bounded by
    /// `FILE_STREAMS_MAX`), and the mean request length.
    streams: Vec<(u64, Nanos)>,
    len_mean: u64,
    /// How long to hold for missing pieces: adapts to the gather time.
    hold_ns: u64,
    /// The last dispatch left below target (its hold expired).
    short: bool,
    /// The last hold was refused (no piece could come, or the cost model
    /// said it loses): leaving below target then says nothing of the file.
    refused: bool,
    used: u64,
    /// Where the file's last dispatch ended (`NONE`: none yet), and how
    /// many dispatches in a row started where the one before ended, the
    /// first piece at that end sent after it completed (a first aggregate
    /// at offset 0 counts one, as a stream's first request there does).
    /// Processes that each wait for their piece and together go through
    /// the file in order (a decomposition) make such a run: a collective
    /// synchronous reader (mechanism 3).
    last_end: u64,
    /// Where the dispatch that ended at `last_end` started.
    last_start: u64,
    seq_hits: u32,
    /// When the dispatch ending at `last_end` completed (`NONE`: not yet,
    /// or the first piece after it already came), and the mean time from
    /// such a completion to that piece.
    last_complete: Nanos,
    think_ns: u64,
    /// The gap the device last waited to see filled (`gap_wait`): the
    /// file's `last_end` then, and since when.
    gap: (u64, Nanos),
}

#[derive(Clone, Copy)]
struct SyncWindow {
    app: AppId,
    /// The synchronous stream; `None` for a file's collective reader,
    /// whose first piece ends the window and rejoins the turn (a hold
    /// then gathers the others).
    client: Option<ClientId>,
    file: FileId,
    op: Op,
    offset: u64,
    until: Nanos,
}

pub(crate) struct Aioli {
    p: AioliParams,
    dispatch_max: u64,
    apps: IdMap<AppId, App>,
    /// The backlogged applications, in no order: the arrival of each one's
    /// oldest request, its weight, its id. A turn scans this dense array
    /// (no lookups; at most `apps_max` entries), and an application's
    /// entry moves only when its oldest request changes.
    backlog: Vec<(Nanos, u32, AppId)>,
    /// Turns handed out so far: the clock of the lazy quantum growth.
    turns: u64,
    turn: Option<Turn>,
    /// Keyed by `stream_key(app, client)`.
    streams: FlatMap<u64, Stream>,
    files: IdMap<FileId, FileHist>,
    window: Option<SyncWindow>,
    /// Dispatches in flight with a member of the turn's application whose
    /// stream is sequential: a window may wait for its next request once
    /// they complete. At most the dispatches in flight.
    window_candidates: Vec<DispatchId>,
    /// Pieces dispatched lately, keyed by (file, start) and (file, end):
    /// the dispatch that carried each and when.
    recent_by_start: FlatMap<(FileId, u64), (DispatchId, Nanos)>,
    recent_by_end: FlatMap<(FileId, u64), (DispatchId, Nanos)>,
    /// The tables' size at which the next sweep drops ranges older than
    /// the evidence window: twice what the last sweep kept (plus 64), at
    /// most `RECENT_PIECES_MAX`.
    recent_sweep_at: usize,
    /// Applications with at least one eligible request.
    backlogged: usize,
    /// What the device charges, when the driver knows (`model`), with a
    /// move cost no lower than the one seen (`seen`): holds, windows, turn
    /// lengths and the aggregate size weigh it.
    cost: Option<DeviceCost>,
    model: Option<DeviceCost>,
    seen: DeviceSeen,
    /// Dispatches the scheduler keeps in flight, and how many are.
    depth: u32,
    inflight: u32,
    /// Logical clock for the least-recently-used eviction of tables.
    tick: u64,
    scratch: Vec<Slot>,
    /// Windows opened so far (`Stats::windows`).
    windows: u64,
    /// Applications whose service class holds their next requests now
    /// (`set_throttled`): no window waits for them. At most the registered
    /// applications.
    throttled: crate::hash::FxHashSet<AppId>,
    /// The smallest quantum in force (`quanta`), computed when the device
    /// model changes, not at every request.
    quantum_min: u64,
    /// Composite sharing (`share.rs`): groups of applications served
    /// fairly before the applications within them; off while no
    /// application has a path.
    share: Share,
    /// Service classes paced here (`qos.rs`, `set_gate`): the gate of
    /// each application whose class is not open. At most the registered
    /// applications.
    gates: FxHashMap<AppId, Gate>,
    /// Until when a class owed its guarantee counts as active: a
    /// dispatch of it went out or came back lately (its readers' next
    /// requests are on their way). While it is, the others keep one
    /// dispatch in flight at most (`pick`).
    owed_until: Nanos,
    /// Prefetch a dispatch's table slots before its bookkeeping
    /// (`set_prefetch`).
    prefetch: bool,
}

/// A window's length: twice the reader's think time, within
/// `wmin..=wmax`; with no think time measured yet (evidence from offset 0
/// alone), half the longest.
fn window_len(think_ns: u64, wmin: u64, wmax: u64) -> u64 {
    let think = if think_ns == 0 { wmax / 4 } else { think_ns };
    (2 * think).clamp(wmin, wmax.max(wmin))
}

fn stream_key(app: AppId, client: ClientId) -> u64 {
    (u64::from(app.0) << 32) | u64::from(client.0)
}

impl Aioli {
    pub fn new(p: AioliParams, limits: &Limits) -> Aioli {
        Aioli {
            quantum_min: p.quantum_bytes_min,
            dispatch_max: limits.dispatch_bytes_max,
            p,
            apps: IdMap::default(),
            backlog: Vec::new(),
            turns: 0,
            turn: None,
            streams: FlatMap::default(),
            files: IdMap::default(),
            window: None,
            window_candidates: Vec::new(),
            recent_by_start: FlatMap::default(),
            recent_by_end: FlatMap::default(),
            recent_sweep_at: RECENT_SWEEP_MIN,
            backlogged: 0,
            cost: None,
            model: None,
            seen: DeviceSeen::default(),
            depth: limits.dispatches_inflight_max,
            inflight: 0,
            tick: 0,
            scratch: Vec::new(),
            windows: 0,
            throttled: crate::hash::FxHashSet::default(),
            share: Share::default(),
            gates: FxHashMap::default(),
            owed_until: 0,
            prefetch: false,
        }
    }

    /// A dispatch of `d`'s members went out or came back at `now`: an
    /// owed class among them stays active for a window's length.
    fn note_owed(&mut self, d: &Dispatch, now: Nanos) {
        if !self.gates.is_empty() && d.members.iter().any(|m| self.gate(m.app).owed) {
            self.owed_until = now.saturating_add(self.p.sync_window_ns_max.max(1_000_000));
        }
    }

    /// Whether a class owed its guarantee is active at `now`: requests
    /// queued, or a dispatch of it lately.
    fn owed_active(&self, now: Nanos) -> bool {
        !self.gates.is_empty() && (now < self.owed_until || self.queued_where(|g| g.owed))
    }

    /// Whether an application whose gate satisfies `f` has requests
    /// queued.
    fn queued_where(&self, f: impl Fn(Gate) -> bool) -> bool {
        self.gates.iter().any(|(id, &g)| f(g) && self.apps.get(id).is_some_and(|a| a.live > 0))
    }

    #[inline]
    fn gate(&self, id: AppId) -> Gate {
        if self.gates.is_empty() {
            return Gate::OPEN;
        }
        self.gates.get(&id).copied().unwrap_or(Gate::OPEN)
    }

    /// Whether a backlogged application's class is urgent (a full bucket,
    /// an owed guarantee) and not resting.
    fn urgent_waiting(&self) -> bool {
        self.queued_where(|g| g.urgent && !g.held)
    }

    #[inline]
    fn app(&mut self, id: AppId) -> &mut App {
        let q = self.p.quantum_bytes_min;
        self.apps.get_or_insert_with(id, || App { weight: 1, quantum: q, since: 0, fifo: LazyFifo::default(), live: 0, forgotten: false, head: None, at: 0 })
    }

    /// `a`'s quantum after `turns` turns handed out: what it was at
    /// `a.since`, grown by its weight times the minimum per turn while it
    /// was backlogged, up to the maximum. The same figure as growing every
    /// backlogged application at every turn, in O(1).
    fn quantum_now((min, max): (u64, u64), a: &App, turns: u64) -> u64 {
        if a.live == 0 {
            return a.quantum;
        }
        let step = min.saturating_mul(u64::from(a.weight));
        a.quantum.saturating_add(step.saturating_mul(turns - a.since)).min(max)
    }

    /// The cost weighed from the model and what was seen (`seen.rs`), and
    /// the smallest quantum from both: the model's turn or the one the
    /// device's own times ask for, whichever is longer.
    fn refresh_cost(&mut self) {
        self.cost = self.seen.floor(self.model);
        let (min, max) = (self.p.quantum_bytes_min, self.p.quantum_bytes_max);
        self.quantum_min = self.cost.map_or(min, |c| c.turn_bytes_min().max(self.seen.turn_floor(&c)).clamp(min, max));
    }

    /// The smallest quantum and the largest. On a device that seeks the
    /// smallest is at least the transfer that makes the seek to a turn
    /// worth while (`DeviceCost::turn_bytes_min`), and quanta grow by it.
    fn quanta(&self) -> (u64, u64) {
        (self.quantum_min, self.p.quantum_bytes_max)
    }

    /// Keep `id`'s entry in `backlog` at the arrival of its oldest
    /// request; none once it has nothing queued.
    fn reindex_head(&mut self, store: &Store, id: AppId) {
        let Some(a) = self.apps.get_mut(&id) else { return };
        let head = if a.live > 0 { a.fifo.front(store).map(|s| store.entry(s).arrival) } else { None };
        let moved = match (a.head, head) {
            (Some(_), Some(t)) => {
                self.backlog[a.at].0 = t;
                None
            }
            (None, Some(t)) => {
                a.at = self.backlog.len();
                self.backlog.push((t, a.weight, id));
                None
            }
            (Some(_), None) => {
                self.backlog.swap_remove(a.at);
                self.backlog.get(a.at).map(|&(_, _, other)| (other, a.at))
            }
            (None, None) => None,
        };
        a.head = head;
        if let Some((other, at)) = moved {
            self.apps.get_mut(&other).expect("a backlogged application exists").at = at;
        }
    }

    /// Start loading the table slots a dispatch's bookkeeping reads: its
    /// first members' streams, and with `ends` the recent pieces' slots for
    /// its boundaries. Cold at 10^4 servers, their misses then overlap
    /// instead of coming one after another. A hint: it changes nothing.
    #[inline]
    fn prefetch_dispatch(&self, d: &Dispatch, ends: bool) {
        for m in d.members.iter().take(PREFETCH_MEMBERS_MAX) {
            self.streams.prefetch(&stream_key(m.app, m.client));
        }
        if ends {
            self.recent_by_start.prefetch(&(d.file, d.offset));
            self.recent_by_end.prefetch(&(d.file, d.end()));
        }
    }

    #[inline]
    fn stream(&mut self, app: AppId, client: ClientId) -> &mut Stream {
        self.tick += 1;
        let key = stream_key(app, client);
        if self.streams.len() >= self.p.streams_max as usize && !self.streams.contains_key(&key) {
            let keep_from = self.tick.saturating_sub(u64::from(self.p.streams_max) / 2);
            self.streams.retain(|_, s| s.used >= keep_from);
        }
        let s = self.streams.entry_or_default(key);
        s.used = self.tick;
        s
    }

    #[inline]
    fn file(&mut self, id: FileId) -> &mut FileHist {
        self.tick += 1;
        if self.files.len() >= self.p.file_histories_max as usize && !self.files.contains_key(&id) {
            let keep_from = self.tick.saturating_sub(u64::from(self.p.file_histories_max) / 2);
            self.files.retain(|_, f| f.used >= keep_from);
        }
        let (min, hold_ns) = (self.p.file_target_bytes_min, (self.p.hold_ns_max / 5).max(self.p.hold_ns_min));
        let f = self.files.get_or_insert_with(id, || FileHist {
            target: min,
            streams: Vec::new(),
            len_mean: 0,
            hold_ns,
            short: false,
            refused: false,
            used: 0,
            last_end: NONE,
            last_start: NONE,
            seq_hits: 0,
            last_complete: NONE,
            think_ns: 0,
            gap: (NONE, 0),
        });
        f.used = self.tick;
        f
    }

    /// With composite sharing on, the standing of the group whose turn it
    /// is among `apps` (`share.rs`); None: every application may have it.
    fn turn_group(&self, apps: impl Iterator<Item = AppId>) -> Option<Rank> {
        if self.share.active() {
            self.share.least(apps)
        } else {
            None
        }
    }

    /// Among `candidates` (oldest arrival, weight, id of backlogged
    /// applications), the one whose oldest request waited longest,
    /// weighted; ties to the lowest id. An application whose class rests
    /// is passed over; if some class is urgent, only its applications
    /// are candidates; otherwise, with composite sharing, only those of
    /// the least served group.
    fn choose<I: Iterator<Item = (Nanos, u32, AppId)> + Clone>(&self, candidates: I, now: Nanos) -> Option<AppId> {
        let gated = !self.gates.is_empty();
        let urgent = gated && candidates.clone().any(|c| self.gate(c.2).urgent && !self.gate(c.2).held);
        let eligible = |id: AppId| !gated || (!self.gate(id).held && (!urgent || self.gate(id).urgent));
        let group = if urgent { None } else { self.turn_group(candidates.clone().map(|c| c.2).filter(|&id| eligible(id))) };
        let mut best: Option<(u128, AppId)> = None;
        for (arrival, weight, id) in candidates {
            if !eligible(id) || group.is_some_and(|g| self.share.rank(id) != g) {
                continue;
            }
            let waited = u128::from(now.saturating_sub(arrival) + 1) * u128::from(weight);
            if best.is_none_or(|(w, b)| waited > w || (waited == w && id < b)) {
                best = Some((waited, id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// The turn's choice from the backlog index.
    fn longest_waiting(&self, now: Nanos) -> Option<AppId> {
        self.choose(self.backlog.iter().copied(), now)
    }

    /// `longest_waiting` by a scan of every application (for `check`).
    fn longest_waiting_by_scan(&self, store: &Store, now: Nanos) -> Option<AppId> {
        let all: Vec<(Nanos, u32, AppId)> = self
            .apps
            .iter()
            .filter(|(_, a)| a.live > 0)
            .map(|(id, a)| (store.entry(a.fifo.peek(store).expect("live application has a queued request")).arrival, a.weight, id))
            .collect();
        self.choose(all.iter().copied(), now)
    }

    /// Hand the device to the backlogged application that waited longest,
    /// weighted (ties to the lowest id), and grow every other backlogged
    /// application's quantum (lazily: one more turn handed out).
    fn new_turn(&mut self, store: &Store, now: Nanos) -> Option<Turn> {
        let chosen = self.longest_waiting(now)?;
        let (before, bounds) = (self.turns, self.quanta());
        // With composite sharing a turn runs until its group has caught up
        // with the least served competing group, and a quantum past that.
        let lead = if self.share.active() { self.share.lead(chosen, self.backlog.iter().map(|b| b.2).filter(|&o| o != chosen)) } else { None };
        self.turns += 1;
        self.share.chosen(chosen);
        let a = self.apps.get_mut(&chosen).expect("chosen application exists");
        let mut remaining = Self::quantum_now(bounds, a, before).max(bounds.0);
        if let Some(lead) = lead {
            remaining = remaining.max(lead.saturating_add(bounds.0).min(bounds.1));
        }
        (a.quantum, a.since) = (bounds.0, self.turns);
        let head = *store.entry(a.fifo.front(store).expect("chosen application is backlogged"));
        // A turn that goes to the application that had the last one (the
        // least served group's, with composite sharing) goes on from where
        // that one stood, not from the oldest request's file: no seek.
        if let Some(t) = self.turn.filter(|t| t.app == chosen) {
            return Some(Turn { remaining, started: now, ..t });
        }
        Some(Turn { app: chosen, remaining, started: now, file: head.req.file, op: head.req.op, next_offset: head.req.offset })
    }

    /// The turn application's next request: the first one of its requests
    /// at or after where the turn stands in its file, else its oldest.
    fn turn_request(&mut self, store: &Store, t: &Turn) -> Slot {
        if let Some(fq) = store.files.get(&t.file) {
            let mut ahead = fq.maps[op_index(t.op)].from((t.next_offset, 0)).take(TURN_SCAN_MAX);
            if let Some((_, s)) = ahead.find(|&(_, s)| store.entry(s).req.app == t.app) {
                return s;
            }
        }
        self.apps.get_mut(&t.app).and_then(|a| a.fifo.front(store)).expect("turn application is backlogged")
    }

    /// Whether to hold the device for the missing pieces of the aggregate
    /// starting at `slot` (aiming at `target` bytes): returns the time to
    /// wait until. Three tests, each of which can refuse:
    /// - the pieces can come: some stream active on the file has nothing
    ///   waiting there (a synchronous process with a queued request sends
    ///   no other before it is served);
    /// - the file's hold time, counted from the oldest member's arrival,
    ///   has not run out;
    /// - with a device cost model, the dispatches the missing pieces would
    ///   otherwise cost exceed the device time left idle meanwhile
    ///   (`DeviceCost::hold_pays`).
    fn hold_until(&mut self, store: &Store, slot: Slot, target: u64, limit: u64, now: Nanos) -> Option<Nanos> {
        let e = store.entry(slot);
        let file = e.req.file;
        let f = self.files.get(&file)?;
        let (hold_ns, len_mean) = (f.hold_ns, f.len_mean.max(1));
        if target <= self.p.file_target_bytes_min {
            return None;
        }
        let window_ns = 2 * self.p.hold_ns_max;
        let active = f.streams.iter().filter(|&&(_, t)| now.saturating_sub(t) <= window_ns).count();
        let waiting = store.files.get(&file).map_or(0, |fq| fq.count() + fq.blocked.len());
        let run = &mut self.scratch;
        store.run(slot, Gather { limit, merge: true, backward: true }, run);
        let first = store.entry(run[0]).req.offset;
        let end = run.iter().map(|&s| store.entry(s).req.end()).max()?;
        let oldest = run.iter().map(|&s| store.entry(s).arrival).min()?;
        let (until, goal, have) = (oldest + hold_ns, target.min(limit), end - first);
        if have >= goal || until <= now {
            return None;
        }
        let pieces = ((goal - have).div_ceil(len_mean)).min(active.saturating_sub(waiting) as u64);
        let free_slots = self.depth.saturating_sub(self.inflight);
        let pays = pieces > 0 && self.cost.is_none_or(|c| c.hold_pays(pieces, until - now, free_slots));
        if !pays {
            self.file(file).refused = true;
            return None;
        }
        Some(until)
    }

    /// Whether to wait before an aggregate of a gathering file that would
    /// start at `slot`, past a gap after where the file's last dispatch
    /// ended: the piece of that gap is late (a process woken late), and
    /// starting past it costs a move there, one back for the piece and one
    /// forward again. The wait lasts at most the file's hold time from
    /// when the gap was first seen, once per gap, and only while a stream
    /// active on the file has nothing queued there (the piece can come),
    /// the gap is shorter than an aggregate's target, and the model says
    /// two moves cost more than the slots left idle (`hold_pays`).
    fn gap_wait(&mut self, store: &Store, file: FileId, slot: Slot, target: u64, now: Nanos) -> Option<Nanos> {
        let start = store.entry(slot).req.offset;
        let free_slots = self.depth.saturating_sub(self.inflight);
        let (cost, window_ns) = (self.cost, 2 * self.p.hold_ns_max);
        let waiting = store.files.get(&file).map_or(0, |fq| fq.count() + fq.blocked.len());
        let f = self.files.get(&file)?;
        let end = f.last_end;
        if end == NONE || start <= end || start - end > target {
            return None;
        }
        // A stream is active if it sent lately, or was answered lately
        // and sent nothing since: a process late round after round sends
        // once a round, and a round of two moves outlasts the window.
        let answered = |key: &u64| self.streams.get(key).is_some_and(|s| s.last_complete != NONE && now.saturating_sub(s.last_complete) <= window_ns);
        let active = f.streams.iter().filter(|&&(k, t)| now.saturating_sub(t) <= window_ns || answered(&k)).count();
        if active <= waiting || cost.is_some_and(|c| !c.hold_pays(2, f.hold_ns, free_slots)) {
            return None;
        }
        let f = self.files.get_mut(&file)?;
        if f.gap.0 != end {
            f.gap = (end, now);
        }
        let until = f.gap.1 + f.hold_ns;
        (until > now).then_some(until)
    }

    fn window_pick(&mut self, store: &Store, now: Nanos) -> Option<Pick> {
        let w = self.window?;
        if now >= w.until {
            self.window = None;
            match w.client {
                Some(client) => self.stream(w.app, client).hits = 0,
                None => self.file(w.file).seq_hits = 0,
            }
            return None;
        }
        let limit = self.turn.map_or(0, |t| t.remaining).max(self.p.quantum_bytes_min).min(self.gate(w.app).cap.max(1));
        Some(match (store.starting_at(w.file, w.offset), w.client) {
            (Some(slot), Some(_)) => Pick::Start { slot, limit, backward: false },
            (Some(_), None) => {
                // A collective reader's first piece: the turn goes on from
                // it (its next offset), and a hold gathers the others.
                self.window = None;
                return None;
            }
            // The reader sent a request that does not continue its last
            // one (its evidence is gone): it is not coming back there.
            (None, Some(client)) if self.streams.get(&stream_key(w.app, client)).is_none_or(|s| s.hits == 0) => {
                self.window = None;
                return None;
            }
            (None, None) if !self.still_collective(store, &w) => {
                self.window = None;
                return None;
            }
            (None, _) => Pick::Wait(w.until),
        })
    }

    /// Open window `w`, `len` long, unless the cost model says that much
    /// idle time costs more than the seeks it saves; counted.
    fn open_window(&mut self, len: u64, w: SyncWindow) {
        if self.cost.is_none_or(|c| c.window_pays(len)) {
            self.windows += 1;
            self.window = Some(w);
        }
    }

    /// Whether a file's window still waits for its reader: the turn's
    /// application had nothing queued when it opened, so the first of its
    /// requests that came since tells. One further on in the file, same
    /// operation, is a piece of the awaited aggregate that came first; any
    /// other (behind, another file, a write after reads) says the
    /// application is doing something else, and the window ends.
    fn still_collective(&mut self, store: &Store, w: &SyncWindow) -> bool {
        let Some(a) = self.apps.get_mut(&w.app).filter(|a| a.live > 0) else { return true };
        a.fifo.front(store).is_none_or(|slot| {
            let r = store.entry(slot).req;
            (r.file, r.op) == (w.file, w.op) && r.offset > w.offset
        })
    }

    /// Slide 16's adaptation. A request arriving right next to a piece
    /// that *another* stream had dispatched moments ago could have left in
    /// the same aggregate: the file's target grows by its length. (Holds
    /// that expire shrink it back, see `dispatched`.)
    /// `mine`: the last dispatch the request's stream was part of.
    fn grow_on_interleaving(&mut self, r: &crate::types::Request, mine: Option<DispatchId>, now: Nanos) {
        let (window_ns, max, hold_max) = (2 * self.p.hold_ns_max, self.p.file_target_bytes_max.min(self.dispatch_max), self.p.hold_ns_max);
        // A neighbour that left in a dispatch this stream was part of says
        // nothing: this request is the stream's *next* one and could not
        // have joined it.
        let key = stream_key(r.app, r.client);
        let near =
            |t: &FlatMap<(FileId, u64), (DispatchId, Nanos)>, at: u64| t.get(&(r.file, at)).is_some_and(|&(d, when)| Some(d) != mine && now.saturating_sub(when) <= window_ns);
        let interleaved = near(&self.recent_by_end, r.offset) || near(&self.recent_by_start, r.end());
        let f = self.file(r.file);
        f.len_mean = if f.len_mean == 0 { r.len } else { (7 * f.len_mean + r.len) / 8 };
        if r.offset == f.last_end && f.last_complete != NONE {
            // The first piece past the file's last dispatch, sent after it
            // completed: evidence of a collective synchronous reader.
            let think = now.saturating_sub(f.last_complete);
            f.think_ns = if f.think_ns == 0 { think } else { (3 * f.think_ns + think) / 4 };
            f.seq_hits = f.seq_hits.saturating_add(1);
            f.last_complete = NONE;
        }
        match f.streams.iter_mut().find(|(k, _)| *k == key) {
            Some(e) => e.1 = now,
            None => {
                f.streams.retain(|&(_, t)| now.saturating_sub(t) <= window_ns);
                if f.streams.len() < FILE_STREAMS_MAX {
                    f.streams.push((key, now));
                }
            }
        }
        if !interleaved {
            return;
        }
        // The seed's n processes each sending a piece: one aggregate should
        // cover a piece from every stream active on the file.
        let active = f.streams.iter().filter(|&&(_, t)| now.saturating_sub(t) <= window_ns).count() as u64;
        f.target = f.target.max(active * f.len_mean).min(max);
        if std::mem::take(&mut f.short) {
            // The pieces came after the hold gave up: hold longer.
            f.hold_ns = (2 * f.hold_ns).min(hold_max);
        }
    }

    /// Remember where a dispatch began and ended. An aggregate is one
    /// contiguous range, so a later request can only sit next to its outer
    /// boundaries: the members' inner ones need no entry. Ranges older
    /// than the window `grow_on_interleaving` looks back can no longer
    /// count: a sweep drops them once the tables doubled since the last
    /// one (amortised O(1) a dispatch), so the tables stay near the number
    /// of ranges the window holds.
    fn remember_pieces(&mut self, d: &Dispatch, now: Nanos) {
        let len = self.recent_by_start.len().max(self.recent_by_end.len());
        if len >= self.recent_sweep_at {
            let window_ns = 2 * self.p.hold_ns_max;
            self.recent_by_start.retain(|_, &(_, when)| now.saturating_sub(when) <= window_ns);
            self.recent_by_end.retain(|_, &(_, when)| now.saturating_sub(when) <= window_ns);
            let mut kept = self.recent_by_start.len().max(self.recent_by_end.len());
            if kept >= RECENT_PIECES_MAX / 2 {
                // Dispatches come faster than the window ages them.
                self.recent_by_start.clear();
                self.recent_by_end.clear();
                kept = 0;
            }
            self.recent_sweep_at = (2 * kept + RECENT_SWEEP_MIN).min(RECENT_PIECES_MAX);
        }
        self.recent_by_start.insert((d.file, d.offset), (d.id, now));
        self.recent_by_end.insert((d.file, d.end()), (d.id, now));
    }
}

impl Policy for Aioli {
    #[inline]
    fn prefetch_arrival(&self, r: &crate::types::Request) {
        self.apps.prefetch(&r.app);
        self.files.prefetch(&r.file);
        // The slots `enqueued` reads first: the stream's, and the recent
        // pieces' that could end where this one starts (or start where it
        // ends).
        self.streams.prefetch(&stream_key(r.app, r.client));
        self.recent_by_end.prefetch(&(r.file, r.offset));
        self.recent_by_start.prefetch(&(r.file, r.end()));
    }

    #[inline]
    fn prefetch_next(&self, store: &Store) {
        // `pick` goes on with the turn: its application's and file's
        // records.
        if let Some(t) = self.turn {
            self.apps.prefetch(&t.app);
            self.files.prefetch(&t.file);
            store.files.prefetch(&t.file);
        }
    }

    fn enqueued(&mut self, store: &Store, slot: Slot, now: Nanos) {
        let e = *store.entry(slot);
        let r = e.req;
        let turns = self.turns;
        let a = self.app(r.app);
        let live = a.live;
        a.fifo.push(&e, slot, store, live);
        a.live += 1;
        if live == 0 {
            // Its quantum grows again from now on.
            a.since = turns;
        }
        // Only a request older than the head moves it (the first one, or
        // one released from behind a conflict).
        let moves_head = a.head.is_none_or(|h| e.arrival < h);
        self.backlogged += usize::from(live == 0);
        if moves_head {
            self.reindex_head(store, r.app);
        }
        if live == 0 && self.share.active() {
            self.share.place_if_unplaced(r.app);
            self.share.activate(r.app, self.p.quantum_bytes_max);
        }

        let hits_min = self.p.sync_hits_min;
        let s = self.stream(r.app, r.client);
        // Evidence of a synchronous reader: a request that starts where the
        // stream's last one ended, sent after one of its requests completed
        // (the think time is measured from there). A process that splits a
        // large access sends the pieces together, each where the one before
        // ended, with no completion between: such a piece neither counts
        // nor resets; the next request is expected past the last one.
        if s.expected_offset == NONE && r.offset == 0 {
            // A new stream that starts at a file's beginning is taken for
            // the start of a sequential run, as Linux's read-ahead takes a
            // read at offset 0.
            s.hits = 1;
        } else if !s.expects(r.file, r.offset) {
            s.hits = 0;
        } else if s.last_complete != NONE {
            s.hits = (s.hits + 1).min(hits_min.max(1) * 4);
            let think = now.saturating_sub(s.last_complete);
            s.think_ns = if s.think_ns == 0 { think } else { (3 * s.think_ns + think) / 4 };
            s.think_peak = (s.think_peak - s.think_peak / 32).max(u32::try_from(think).unwrap_or(u32::MAX));
        }
        (s.expected_file, s.expected_offset, s.last_complete) = (r.file, r.end(), NONE);
        let mine = s.last_dispatch();

        self.grow_on_interleaving(&r, mine, now);
    }

    fn pick(&mut self, store: &Store, now: Nanos) -> Pick {
        // A paced class: a turn of one that rests ends, and so does any
        // turn but an urgent class's while one is waiting.
        if !self.gates.is_empty() {
            if let Some(t) = self.turn {
                let g = self.gate(t.app);
                if g.held || (!g.urgent && self.urgent_waiting()) {
                    (self.turn, self.window) = (None, None);
                }
            }
        }
        if let Some(p) = self.window_pick(store, now) {
            return p;
        }
        // The device seeks and serves one dispatch at a time (the two
        // rules below).
        let serial_disk = self.cost.is_some_and(|c| c.seek_ns > 0 && c.parallelism <= 1);
        // A disk that seeks and serves one dispatch at a time would only
        // queue the next turn's dispatch behind one whose sequential
        // reader a window may wait for: committed before that reader's
        // next request comes, it ends the turn and the window with it (a
        // 4 MiB reader's two requests then waited a round of turns each,
        // mix10 on the emulated disk learned from scratch, while the
        // learner probed depth two).
        if serial_disk && !self.window_candidates.is_empty() {
            return Pick::Idle;
        }
        // On a device that serves several dispatches at once and shares
        // its bandwidth among them, a guaranteed class's requests would
        // each wait behind all the others' in flight: while an owed class
        // is active, the others keep one in flight at most (the twin of
        // the real disk at depth eight: 321 MB/s against a 500 MB/s
        // guarantee without this, 505 with it).
        if self.inflight >= 2 && self.turn.is_none_or(|t| !self.gate(t.app).owed) && self.owed_active(now) {
            return Pick::Idle;
        }
        let backlogged = |s: &Self, t: &Turn| s.apps.get(&t.app).is_some_and(|a| a.live > 0);
        let turn_ns_max = self.p.turn_ns_max;
        let turn = match self.turn {
            Some(t) if t.remaining > 0 && now.saturating_sub(t.started) < turn_ns_max && backlogged(self, &t) => t,
            _ => match self.new_turn(store, now) {
                Some(t) => t,
                None => return Pick::Idle,
            },
        };
        self.turn = Some(turn);
        let mut slot = self.turn_request(store, &turn);
        let file = store.entry(slot).req.file;
        // Past the useful size a larger aggregate saves almost nothing and
        // takes parallelism away (`DeviceCost::useful_dispatch_bytes`).
        let useful = self.cost.and_then(|c| c.useful_dispatch_bytes()).map_or(u64::MAX, |u| u.max(self.p.file_target_bytes_min));
        let target = self.files.get(&file).map_or(0, |f| f.target).min(useful);
        // A disk that serves one dispatch at a time only queues a file's
        // second dispatch behind its first, committed before the pieces
        // that come meanwhile: a late process's piece then costs a move
        // back for it and one forward again, round after round (the
        // emulated disk learned from scratch, while the learner probed
        // depth two: three moves a round of 32 pieces, 0.53 s against
        // 0.23). One dispatch of a file at a time there; a probe of depth
        // two takes other files' dispatches.
        if serial_disk && store.files.get(&file).is_some_and(|f| !f.inflight.is_empty()) {
            return Pick::Idle;
        }
        if target > self.p.file_target_bytes_min {
            // Gathering: the pieces join in the store while the file has
            // its dispatches in flight; a completion polls again.
            if store.files.get(&file).is_some_and(|f| f.inflight.len() >= GATHER_INFLIGHT_MAX && f.bytes < target) {
                return Pick::Idle;
            }
            // Start from the file's lowest piece, so that processes that
            // fell behind are served first and the others wait for them,
            // which brings their pieces back side by side.
            slot = super::elevator::lowest_at_or_after(store, file, 0).unwrap_or(slot);
            if let Some(until) = self.gap_wait(store, file, slot, target, now) {
                return Pick::Wait(until);
            }
        }
        // The quantum shares the device; alone, an application is not cut.
        // A paced class's tokens cut it all the same.
        let cap = self.gate(turn.app).cap;
        let quantum = if self.backlogged > 1 { turn.remaining } else { self.dispatch_max.min(cap.max(1)) };
        // Joining pieces already queued waits for nothing: past the useful
        // size, an aggregate may still take the file's queued bytes spread
        // over the device's slots, so that as few dispatches as keep every
        // slot busy carry them (each dispatch also costs the server's CPU).
        // At least `SPREAD_SLOTS` slots: the learned parallelism falls when
        // aggregates grow (each takes longer), and spreading over it alone
        // would grow them further.
        let wanted = quantum.max(target);
        let spread = match self.cost {
            Some(c) if useful < wanted => {
                let spread = store.files.get(&file).map_or(0, |f| f.bytes) / u64::from(c.parallelism.max(SPREAD_SLOTS));
                // One dispatch at a time takes no parallelism away: each
                // piece joined saves its whole fixed cost, however large.
                if c.parallelism <= 1 {
                    spread
                } else {
                    spread.min(SPREAD_BYTES_MAX)
                }
            }
            _ => 0,
        };
        let limit = wanted.min(useful.max(spread)).min(cap).max(store.entry(slot).req.len);
        match self.hold_until(store, slot, target, limit, now) {
            Some(until) => Pick::Wait(until),
            None => Pick::Start { slot, limit, backward: true },
        }
    }

    fn dispatched(&mut self, store: &Store, d: &Dispatch, members: &[Entry], _forced: bool, now: Nanos) {
        if self.prefetch {
            self.prefetch_dispatch(d, true);
        }
        self.note_owed(d, now);
        let serial = self.model.is_none_or(|m| m.parallelism <= 1);
        self.seen.dispatched(d, self.inflight, serial, now);
        self.inflight += 1;
        let hits_min = self.p.sync_hits_min;
        if self.turn.is_some_and(|t| d.members.iter().any(|m| m.app == t.app && self.streams.get(&stream_key(m.app, m.client)).is_some_and(|s| s.hits >= hits_min))) {
            self.window_candidates.push(d.id);
        }
        for (m, e) in d.members.iter().zip(members) {
            let (turns, bounds) = (self.turns, self.quanta());
            self.share.charge(m.app, e.req.len);
            let a = self.app(m.app);
            if a.live == 1 {
                // Its quantum stops growing: keep what it reached.
                a.quantum = Self::quantum_now(bounds, a, turns);
                a.since = turns;
            }
            a.live -= 1;
            let (live, forgotten) = (a.live, a.forgotten);
            a.fifo.shrink(store, live);
            // The head is the oldest arrival: a later member leaves it.
            if live == 0 || a.head.is_some_and(|h| e.arrival <= h) {
                self.reindex_head(store, m.app);
            }
            if live == 0 {
                self.backlogged -= 1;
                if forgotten {
                    self.apps.remove(&m.app);
                    self.share.forget(m.app);
                }
            }
            self.stream(m.app, m.client).last_dispatch = d.id.0;
        }
        if let Some(t) = &mut self.turn {
            t.remaining = t.remaining.saturating_sub(d.len);
            (t.file, t.op, t.next_offset) = (d.file, d.op, d.end());
            if t.remaining == 0 {
                self.turn = None;
            }
        }
        if self.window.is_some_and(|w| w.file == d.file && d.offset <= w.offset && w.offset < d.end()) {
            self.window = None;
        }
        self.remember_pieces(d, now);
        let (min, hold_min, hold_max) = (self.p.file_target_bytes_min, self.p.hold_ns_min, self.p.hold_ns_max);
        let gather_ns = now.saturating_sub(members.iter().map(|e| e.arrival).min().unwrap_or(now));
        let f = self.file(d.file);
        // A late piece just behind the file's last dispatch (its process
        // woken late, the aggregate after its gap gone first): the file
        // goes on from that dispatch's end, not this one's, and a piece
        // alone says nothing of the target. Taken as the file's end, it
        // put the next aggregate's gap out of `gap_wait`'s reach and cut
        // the target, and the next late piece came round after round (the
        // emulated disk learned from scratch: two moves a round of 32
        // pieces, 1.5 s against 0.23).
        if f.last_end != NONE && d.end() <= f.last_start && f.last_start - d.end() <= f.target.max(f.len_mean) {
            f.refused = false;
            return;
        }
        if d.offset == 0 && f.last_end == NONE {
            // The file's first aggregate starts at its beginning: the
            // start of a run, as for a stream.
            f.seq_hits = 1;
        } else if d.offset != f.last_end {
            f.seq_hits = 0;
        }
        (f.last_start, f.last_end, f.last_complete) = (d.offset, d.end(), NONE);
        if std::mem::take(&mut f.refused) {
            // No hold was tried: what was reached says nothing.
        } else if d.len < f.target {
            // Dispatched below target: the hold expired (or expiry forced
            // it). Believe what was reached, until new evidence comes.
            f.target = d.len.max(min);
            f.short = true;
        } else if f.target > min {
            // Gathered in time: drift toward twice the time it took.
            f.hold_ns = ((3 * f.hold_ns + 2 * gather_ns) / 4).clamp(hold_min, hold_max);
            f.short = false;
        }
    }

    fn completed(&mut self, store: &Store, d: &Dispatch, now: Nanos) {
        if self.prefetch {
            self.prefetch_dispatch(d, false);
        }
        self.inflight = self.inflight.saturating_sub(1);
        self.note_owed(d, now);
        if let Some(i) = self.window_candidates.iter().position(|&x| x == d.id) {
            self.window_candidates.swap_remove(i);
        }
        if self.seen.completed(d, now) && self.model.is_some() {
            self.refresh_cost();
        }
        // A window for the first synchronous reader of the turn's
        // application among the members, unless windows are off (a zero
        // maximum: devices where moving to another file costs nothing) or
        // the turn is over; the cost model may refuse it (moving to
        // another file costs less than the idle time), which ends the
        // search. Every member's stream learns its completion time (the
        // evidence windows need).
        // Windows are off (flash), or the cost model refuses even the
        // shortest (`window_pays` falls as the window grows, so it would
        // refuse every one: a device whose seek is cheaper than idling its
        // slots): the streams' and files' evidence serves windows only, so
        // nothing here is worth a lookup. Should the learned model come to
        // favour windows, the evidence starts again from the next
        // completion.
        if self.p.sync_window_ns_max == 0 || self.cost.is_some_and(|c| !c.window_pays(self.p.sync_window_ns_min)) {
            return;
        }
        let turn = self.turn.filter(|t| self.window.is_none() && now.saturating_sub(t.started) < self.p.turn_ns_max);
        let (hits_min, wmin, wmax) = (self.p.sync_hits_min, self.p.sync_window_ns_min, self.p.sync_window_ns_max);
        let mut searching = turn.is_some();
        for m in &d.members {
            let throttled = !self.throttled.is_empty() && self.throttled.contains(&m.app);
            let s = self.stream(m.app, m.client);
            s.last_complete = now;
            // A member whose end another member covers (a process's
            // pieces of one large access) expects nothing there, nor one
            // whose stream already sent its next request (queued, or on
            // the device where more than one dispatch is in flight).
            if !searching
                || turn.is_none_or(|t| m.app != t.app)
                || throttled
                || s.hits < hits_min
                || m.end() < d.end()
                || !s.expects(d.file, m.end())
                || store.starting_at(d.file, m.end()).is_some()
            {
                continue;
            }
            searching = false;
            let len = window_len(s.think_ns.max(u64::from(s.think_peak)), wmin, wmax);
            self.open_window(len, SyncWindow { app: m.app, client: Some(m.client), file: d.file, op: d.op, offset: m.end(), until: now + len.max(1) });
        }
        // No synchronous stream: the turn's application may still be a
        // collective reader of the file, whose processes each wait for
        // their piece, and whose next aggregate starts where this one
        // ended. Once it has nothing queued anywhere (else its turn goes
        // on), the device waits for its first piece as for a stream's.
        let Some(f) = self.files.get_mut(&d.file).filter(|f| f.last_end == d.end()) else { return };
        f.last_complete = now;
        let Some(t) = turn.filter(|_| searching) else { return };
        let (hits, think) = (f.seq_hits, f.think_ns);
        let idle = self.apps.get(&t.app).is_none_or(|a| a.live == 0);
        if hits < hits_min || !idle || self.throttled.contains(&t.app) || !d.members.iter().any(|m| m.app == t.app) || store.starting_at(d.file, d.end()).is_some() {
            return;
        }
        let len = window_len(think, wmin, wmax);
        self.open_window(len, SyncWindow { app: t.app, client: None, file: d.file, op: d.op, offset: d.end(), until: now + len.max(1) });
    }

    fn set_device(&mut self, cost: Option<DeviceCost>, depth: u32) {
        (self.model, self.depth) = (cost, depth);
        self.refresh_cost();
    }

    fn set_prefetch(&mut self, on: bool) {
        self.prefetch = on;
    }

    fn set_weight(&mut self, app: AppId, weight: u32) {
        let (turns, bounds) = (self.turns, self.quanta());
        let a = self.app(app);
        // Growth so far at the old weight, from here at the new one.
        (a.quantum, a.since) = (Self::quantum_now(bounds, a, turns), turns);
        a.forgotten = false;
        a.weight = weight;
        if a.head.is_some() {
            let at = a.at;
            self.backlog[at].1 = weight;
        }
    }

    fn windows_opened(&self) -> u64 {
        self.windows
    }

    fn quantum(&self, app: AppId) -> Option<u64> {
        self.apps.get(&app).map(|a| Self::quantum_now(self.quanta(), a, self.turns))
    }

    fn apps_tracked(&self) -> usize {
        self.apps.len()
    }

    fn set_throttled(&mut self, app: AppId, throttled: bool) {
        if !throttled {
            self.throttled.remove(&app);
            return;
        }
        self.throttled.insert(app);
        if self.window.is_some_and(|w| w.app == app) {
            self.window = None;
        }
    }

    fn paces(&self) -> bool {
        true
    }

    fn urgent(&self) -> bool {
        // A window kept for such a class's reader counts: its next
        // request is on its way.
        let bursting = |g: Gate| g.urgent && !g.owed && !g.held;
        !self.gates.is_empty() && (self.queued_where(bursting) || self.window.is_some_and(|w| bursting(self.gate(w.app))))
    }

    fn set_gate(&mut self, app: AppId, gate: Gate) {
        if gate == Gate::OPEN {
            self.gates.remove(&app);
            return;
        }
        self.gates.insert(app, gate);
        if gate.held && self.window.is_some_and(|w| w.app == app) {
            self.window = None;
        }
    }

    fn forget_app(&mut self, app: AppId) {
        self.throttled.remove(&app);
        self.gates.remove(&app);
        match self.apps.get_mut(&app) {
            Some(a) if a.live > 0 => a.forgotten = true,
            Some(_) => {
                self.apps.remove(&app);
                self.share.forget(app);
            }
            None => self.share.forget(app),
        }
    }

    fn set_share(&mut self, app: AppId, keys: &[u64]) {
        self.share.set(app, keys);
        // One put on a path while backlogged stands where its new
        // groups do, as if it had just become backlogged.
        if self.apps.get(&app).is_some_and(|a| a.live > 0) {
            self.share.activate(app, self.p.quantum_bytes_max);
        }
    }

    fn check(&self, store: &Store) {
        let live: usize = self.apps.values().map(|a| a.live).sum();
        assert_eq!(live, store.queued, "aioli live count");
        assert_eq!(self.apps.values().filter(|a| a.live > 0).count(), self.backlogged, "aioli backlogged count");
        for (id, a) in self.apps.iter() {
            assert!(a.fifo.len() <= 2 * a.live + 65, "aioli fifo of {id:?} unbounded");
            let q = Self::quantum_now(self.quanta(), a, self.turns);
            assert!(q >= self.p.quantum_bytes_min && q <= self.p.quantum_bytes_max, "aioli quantum of {id:?}");
            let head = (a.live > 0).then(|| a.fifo.peek(store).map(|s| store.entry(s).arrival)).flatten();
            assert_eq!(a.head, head, "aioli head index of {id:?}");
            if let Some(at) = a.head {
                assert_eq!(self.backlog.get(a.at), Some(&(at, a.weight, id)), "aioli backlog entry of {id:?}");
            }
        }
        assert_eq!(self.backlog.len(), self.backlogged, "aioli backlog size");
        // The index chooses what a scan of every application would, now
        // and much later (weighted waits can change their order).
        if let Some(latest) = self.apps.values().filter_map(|a| a.head).max() {
            for now in [latest, latest + 1_000_000, latest + 1_000_000_000] {
                assert_eq!(self.longest_waiting(now), self.longest_waiting_by_scan(store, now), "aioli turn choice at {now}");
            }
        }
        self.share.check();
        assert!(self.streams.len() <= self.p.streams_max as usize, "aioli streams table over bound");
        const { assert!(std::mem::size_of::<Stream>() <= 56) };
        assert!(self.files.len() <= self.p.file_histories_max as usize, "aioli file table over bound");
        assert!(self.recent_by_start.len() <= RECENT_PIECES_MAX && self.recent_by_end.len() <= RECENT_PIECES_MAX, "aioli recent pieces over bound");
        assert!(self.recent_sweep_at <= RECENT_PIECES_MAX, "aioli recent sweep point over bound");
        for f in self.files.values() {
            assert!(f.target >= self.p.file_target_bytes_min && f.target <= self.p.file_target_bytes_max, "aioli file target");
            assert!(f.streams.len() <= FILE_STREAMS_MAX, "aioli streams of a file over bound");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{stream_key, Aioli, FILE_STREAMS_MAX, RECENT_PIECES_MAX, RECENT_SWEEP_MIN};
    use crate::{AioliParams, AppId, ClientId, Decision, Dispatch, DispatchId, FileId, Limits, Op, PolicyConfig, Request, RequestId, Scheduler};

    const MIB: u64 = 1 << 20;

    /// One 1 MiB read of application `app` (its own file), more than the
    /// minimum quantum, so that each dispatch is one turn.
    fn read(id: u64, app: u32, k: u64) -> Request {
        Request { id: RequestId(id), app: AppId(app), client: ClientId(0), file: FileId(u64::from(app)), op: Op::Read, offset: 2 * k * MIB, len: MIB }
    }

    fn p_max() -> u64 {
        AioliParams::default().quantum_bytes_max
    }

    fn turn(s: &mut Scheduler, now: u64) -> AppId {
        let Decision::Dispatch(d) = s.next(now) else { panic!("a dispatch") };
        s.complete(d.id, now).unwrap();
        s.check_invariants();
        d.members[0].app
    }

    /// Turns go to the application whose one request arrived first,
    /// among 40 that arrived out of id order; to a later one that waited
    /// less but weighs 8; and in arrival order again once it weighs 1.
    #[test]
    fn turns_follow_the_longest_wait_through_weight_changes() {
        let p = AioliParams { sync_window_ns_max: 0, ..AioliParams::default() };
        let mut s = Scheduler::new(PolicyConfig::Aioli(p), Limits { dispatches_inflight_max: 1, ..Limits::default() });
        // Application a sends one request at (a * 17) % 40 ns: out of id
        // order, and its turn ends with it.
        let at = |a: u32| u64::from(a * 17 % 40);
        let mut order: Vec<u32> = (0..40).collect();
        order.sort_by_key(|&a| at(a));
        for &a in &order {
            s.enqueue(read(u64::from(a), a, 0), at(a)).unwrap();
        }
        s.check_invariants();
        let mut now = 1_000;
        for &a in &order[..10] {
            assert_eq!(turn(&mut s, now), AppId(a));
            now += 1;
        }
        // The latest to arrive, weighing 8, has waited 8 times its time:
        // it goes next, ahead of earlier ones.
        let last = *order.last().unwrap();
        s.set_app_weight(AppId(last), 8).unwrap();
        s.check_invariants();
        assert_eq!(turn(&mut s, now), AppId(last));
        now += 1;
        s.set_app_weight(AppId(last), 1).unwrap();
        s.check_invariants();
        for &a in &order[10..39] {
            assert_eq!(turn(&mut s, now), AppId(a));
            now += 1;
        }
    }

    #[test]
    fn quanta_grow_per_turn_waited_and_follow_a_weight_change() {
        let p = AioliParams { sync_window_ns_max: 0, ..AioliParams::default() };
        let min = p.quantum_bytes_min;
        let mut s = Scheduler::new(PolicyConfig::Aioli(p), Limits { dispatches_inflight_max: 1, ..Limits::default() });
        // Applications 1, 2 and 3 take turns sending, one request per
        // nanosecond: their oldest requests arrived at 0, 1 and 2.
        for k in 0..4 {
            for app in 1..=3 {
                let id = k * 3 + u64::from(app) - 1;
                s.enqueue(read(id, app, k), id).unwrap();
            }
        }
        let q = |s: &Scheduler, app: u32| s.quantum(AppId(app)).unwrap();
        assert_eq!(turn(&mut s, 12), AppId(1));
        // Every application that waited a turn grew by the minimum.
        assert_eq!((q(&s, 1), q(&s, 2), q(&s, 3)), (min, 2 * min, 2 * min));
        // Weight 3 while backlogged: what it grew so far stays, and its
        // wait now counts three times, which puts it before application 2
        // (3 x 11 against 12).
        s.set_app_weight(AppId(3), 3).unwrap();
        s.check_invariants();
        assert_eq!(q(&s, 3), 2 * min);
        assert_eq!(turn(&mut s, 12), AppId(3));
        assert_eq!((q(&s, 1), q(&s, 2), q(&s, 3)), (2 * min, 3 * min, min));
        while !s.is_empty() {
            turn(&mut s, 14);
        }
        // Idle applications keep what they reached, and do not grow.
        let kept = (q(&s, 2), q(&s, 3));
        s.enqueue(read(100, 1, 10), 20).unwrap();
        assert_eq!(turn(&mut s, 21), AppId(1));
        assert_eq!((q(&s, 2), q(&s, 3)), kept);

        // A weight-3 application that waits a turn grows three minimums.
        s.enqueue(read(101, 1, 11), 30).unwrap();
        s.enqueue(read(102, 1, 12), 31).unwrap();
        s.enqueue(read(103, 3, 13), 100).unwrap();
        let before = q(&s, 3);
        // 1 x 71 against 3 x 1.
        assert_eq!(turn(&mut s, 100), AppId(1));
        assert_eq!(q(&s, 3), (before + 3 * min).min(p_max()));
    }

    fn dispatch(id: u64, offset: u64) -> Dispatch {
        Dispatch { id: DispatchId(id), file: FileId(1), op: Op::Read, offset, len: 4096, members: Vec::new() }
    }

    #[test]
    fn recent_pieces_bound_at_n_and_n_plus_one_and_aging() {
        let p = AioliParams::default();
        let window_ns = 2 * p.hold_ns_max;
        let mut a = Aioli::new(p, &Limits::default());
        let n = RECENT_PIECES_MAX as u64;
        // Ranges that all stay recent, with the sweep point at the bound
        // (where twice 2,047 kept ranges put it): the tables reach it (N)...
        a.recent_sweep_at = RECENT_PIECES_MAX;
        for i in 0..n {
            a.remember_pieces(&dispatch(i, i * 8192), 0);
        }
        assert_eq!((a.recent_by_start.len(), a.recent_by_end.len()), (RECENT_PIECES_MAX, RECENT_PIECES_MAX));
        // ...and the next one (N+1) finds them all recent: cleared, then it.
        a.remember_pieces(&dispatch(n, n * 8192), 1);
        assert_eq!((a.recent_by_start.len(), a.recent_by_end.len()), (1, 1));
        assert_eq!(a.recent_sweep_at, RECENT_SWEEP_MIN);
        // Ranges older than the window are swept out at the next sweep
        // point, the recent ones kept: the tables follow the window.
        for i in 1..RECENT_SWEEP_MIN as u64 {
            a.remember_pieces(&dispatch(n + i, (n + i) * 8192), 2);
        }
        assert_eq!(a.recent_by_start.len(), RECENT_SWEEP_MIN);
        a.remember_pieces(&dispatch(2 * n, 1 << 40), window_ns + 2);
        // The sweep dropped the range of t = 1, kept the 63 of t = 2.
        assert_eq!(a.recent_by_start.len(), RECENT_SWEEP_MIN);
        a.remember_pieces(&dispatch(2 * n + 1, 1 << 41), window_ns + 3);
        assert!(a.recent_by_start.len() <= 2 * RECENT_SWEEP_MIN + RECENT_SWEEP_MIN);
        let late = 3 * window_ns;
        for i in 0..(3 * RECENT_SWEEP_MIN) as u64 {
            a.remember_pieces(&dispatch(3 * n + i, (1 << 42) + i * 8192), late);
        }
        assert!(a.recent_by_start.values().all(|&(_, when)| when == late), "old ranges outlived a sweep");
        assert!(!a.recent_by_start.contains_key(&(FileId(1), 1 << 40)), "a range older than the window was swept");
    }

    #[test]
    fn a_files_streams_bound_at_n_and_n_plus_one_and_aging() {
        let p = AioliParams::default();
        let window_ns = 2 * p.hold_ns_max;
        let mut a = Aioli::new(p, &Limits::default());
        let piece = |client: u32| Request {
            id: RequestId(u64::from(client)),
            app: AppId(1),
            client: ClientId(client),
            file: FileId(1),
            op: Op::Read,
            offset: u64::from(client) * 4096,
            len: 4096,
        };
        let listed = |a: &mut Aioli| a.file(FileId(1)).streams.len();
        let n = FILE_STREAMS_MAX as u32;
        // N streams sending to the file within the evidence window are
        // all listed...
        for c in 0..n {
            a.grow_on_interleaving(&piece(c), None, 1);
        }
        assert_eq!(listed(&mut a), FILE_STREAMS_MAX);
        // ...the next one (N+1) is not, and a listed one is still known.
        a.grow_on_interleaving(&piece(n), None, 2);
        assert_eq!(listed(&mut a), FILE_STREAMS_MAX);
        assert!(!a.file(FileId(1)).streams.iter().any(|&(k, _)| k == stream_key(AppId(1), ClientId(n))));
        a.grow_on_interleaving(&piece(0), None, 2);
        assert_eq!(a.file(FileId(1)).streams.iter().find(|&&(k, _)| k == stream_key(AppId(1), ClientId(0))).map(|&(_, t)| t), Some(2));
        // Once the others are older than the window, a new stream makes
        // room: only the streams seen within it stay.
        a.grow_on_interleaving(&piece(n), None, window_ns + 2);
        assert_eq!(listed(&mut a), 2, "stream 0 (seen at 2) and the new one");
    }
}
