//! What the device charges, as numbers: the cost model the scheduler's
//! decisions weigh.
//!
//! A [`DeviceCost`] says what one dispatch costs: a fixed part (system call,
//! device latency, the server's hand-offs), a part per byte, an extra part
//! when the access does not continue the previous one (a seek), and how many
//! dispatches the device serves at once with gain. The driver supplies it
//! with [`crate::Scheduler::set_device_cost`]: the daemon from its
//! [`CostLearner`] (and a `sluice calibrate` file as the starting point), the
//! simulator from its own device model. The core stays pure: the model
//! reaches it as numbers.
//!
//! The learner is pure too. The driver reports each completed dispatch
//! (length, whether it continued the previous access, how many dispatches
//! were in flight when it left, how long it took) and the learner keeps:
//!
//! - `seek_ns` by comparing, within each power-of-two length class, the
//!   latencies of dispatches that seeked with those that continued (their
//!   means among dispatches alone on the device where there are enough,
//!   so that near and far moves count as what they cost on average; else
//!   the lower edges below), and
//!   `dispatch_ns` and `byte_ps` by least squares of latency (less the seek
//!   cost where it applies) against length; once two lengths have
//!   dispatches that continued, only those enter the line (a class that
//!   only ever seeks far would otherwise put the far seek's excess over
//!   the average seek into the line). Both use only the dispatches
//!   that did not queue in the device (in flight at most the current
//!   parallelism), with older ones decaying, and the prior model (a
//!   calibration, else [`GENERIC`]) as a few fixed pseudo-observations, so
//!   the fit stays determined when every dispatch has the same length.
//!   The seek cost is taken only between equal lengths because a
//!   scheduler that aggregates seeks mostly between large aggregates: a
//!   joint fit over every length gave a 737 µs seek cost to a device with
//!   none (the O_DIRECT virtual disk, 64 KiB x 128 decomposition), and the
//!   holds it then paid for idled the device. The least squares weigh
//!   relative errors (each point by the inverse square of the latency the
//!   model predicts at its length), so the fixed cost comes from the short
//!   dispatches, not from the intercept of the long ones' wandering
//!   edges (0.6-0.8 ms learned for that device with plain weights). The
//!   points fitted are not
//!   the latencies themselves but, per length class and seek or not, the
//!   lower edge of that class's latencies ([`Edge`]): what the host adds
//!   to a latency (a busy event loop, a thread waiting for a core among a
//!   hundred runnable processes) only ever lengthens it, often by more
//!   than the device took, and a fit of the mean put that into the fixed
//!   cost (0.3-0.9 ms learned for a 76 µs device on the 2-core VM). An
//!   edge enters the fit once it has seen `EDGE_SAMPLES_MIN` dispatches
//!   (that did not queue), and the fixed cost is at most the lowest edge
//!   seen lately: no dispatch takes less than it;
//! - `parallelism` from the throughput at each depth against depth one's,
//!   on the same dispatches: per depth and length class, the mean latency
//!   of dispatches that continued the previous one. A serial device's
//!   dispatch at depth d waits for others, so its throughput (depth over
//!   the latency's growth) stays near one; a device that serves k at
//!   once reaches k. The model does not enter (a seek cost not yet known
//!   made every seeking dispatch look like a slowdown of its depth), and
//!   a host delay lengthens every depth alike. Until some depth gains at least
//!   `PARALLEL_GAIN_MIN` over depth one, the parallelism is one, the
//!   safe choice on a disk; above one it is the smallest depth within
//!   `PARALLEL_GAIN_PCT` of the best, and a smaller estimate replaces it
//!   only once it falls below `PARALLEL_KEEP` of the best (hysteresis).
//!   The scheduler probes one depth above it ([`CostLearner::depth_cap`]),
//!   so a device that gains from more is found out, and one that does not
//!   pays one extra dispatch in flight now and then.
//!
//! Bounds: one bucket per depth up to `DEPTH_MAX`, two edges per length
//! class (`EDGE_CLASSES`), one mean per depth and length class; the fit is a fixed 2x2 system. Arithmetic is `f64`, deterministic for a given input.

use crate::types::{Dispatch, FileId, Nanos};

/// Deepest in-flight level the learner keeps a bucket for.
pub const DEPTH_MAX: u32 = 64;
/// A depth counts as gaining when its throughput reaches this percentage of
/// the best depth's: below it, more in flight only queues in the device.
pub const PARALLEL_GAIN_PCT: u64 = 90;
/// A driver passes the learned model to its scheduler every this many
/// observations (`Scheduler::learn`): often enough to follow the device,
/// rarely enough that the policies' thresholds do not move every dispatch.
pub const MODEL_EVERY: u64 = 32;
/// Observations at the depth above the learned parallelism before it stops
/// being probed all the time (`CostLearner::depth_cap`).
const DEPTH_SAMPLES_MIN: u32 = 16;
/// A depth above one is believed to gain only when its throughput is at
/// least this many times depth one's (the same dispatches compared): a
/// busy host moves latencies by tens of percent, and a one-arm disk
/// taken for a wider one is kept busy with dispatches it serves in its
/// own order, seeking where the scheduler planned none. On a one-arm
/// disk whose queue serves two dispatches in either order, a dispatch
/// that left beside another waits for it half the time, so depth two
/// looks 4/3 as fast as depth one; and a lone dispatch pays the wake-up
/// of an idle executor thread that one behind another does not (on the
/// emulated disk learned from scratch, 1.5 still let 6 of 20 runs learn
/// 2-4). A device must nearly double its throughput at depth two (the
/// only depth probed from one) to be taken as parallel: one that serves
/// two at once may be missed (one at a time is the safe error), one that
/// serves four or more is not.
const PARALLEL_GAIN_MIN: f64 = 1.8;
/// Observations a (depth, length class) bucket needs before its mean
/// latency enters the comparison between depths.
const CLASS_SAMPLES_MIN: u32 = 8;
/// Once a parallelism above one is learned, it is kept while its
/// throughput stays within this fraction of the best depth's (hysteresis:
/// the estimate does not flap between neighbours on noise).
const PARALLEL_KEEP: f64 = 0.8;
/// Every `PROBE_PERIOD` observations the learner probes one depth above
/// the learned parallelism for `PROBE_LEN` of them.
const PROBE_PERIOD: u64 = 1_024;
const PROBE_LEN: u64 = 64;

/// What one dispatch costs on a device. All zero but `parallelism` means
/// "free": no hold or window ever pays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCost {
    /// Fixed cost of one dispatch, nanoseconds.
    pub dispatch_ns: u64,
    /// Transfer cost, picoseconds per byte (1,000 = 1 GB/s).
    pub byte_ps: u64,
    /// Extra cost of an access that does not continue the previous one.
    pub seek_ns: u64,
    /// Dispatches the device serves at once with gain (1 = one at a time).
    pub parallelism: u32,
}

/// The model for people: "50.0 us per dispatch, 1.000 ns per byte, seek
/// 0.0 us, parallelism 8" (what `sluice serve` prints when it stops and
/// `sluice calibrate` after measuring).
impl std::fmt::Display for DeviceCost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} us per dispatch, {:.3} ns per byte, seek {:.1} us, parallelism {}",
            self.dispatch_ns as f64 / 1e3,
            self.byte_ps as f64 / 1e3,
            self.seek_ns as f64 / 1e3,
            self.parallelism
        )
    }
}

impl DeviceCost {
    /// A device with the given parts, parallelism forced into 1..=`DEPTH_MAX`.
    pub fn new(dispatch_ns: u64, byte_ps: u64, seek_ns: u64, parallelism: u32) -> DeviceCost {
        DeviceCost { dispatch_ns, byte_ps, seek_ns, parallelism: parallelism.clamp(1, DEPTH_MAX) }
    }

    /// Predicted service time of one dispatch of `len` bytes.
    pub fn service_ns(&self, len: u64, seek: bool) -> u64 {
        let transfer = (u128::from(len) * u128::from(self.byte_ps) / 1_000) as u64;
        self.dispatch_ns + transfer + if seek { self.seek_ns } else { 0 }
    }

    /// A device that serves dispatches as this model predicts, for
    /// [`crate::replay`]: a seek before each dispatch that does not start
    /// where the one before ended (none before the first).
    pub fn serving(self) -> impl FnMut(&Dispatch) -> Nanos {
        let mut last: Option<(FileId, u64)> = None;
        move |d: &Dispatch| {
            let seek = last.is_some_and(|l| l != (d.file, d.offset));
            last = Some((d.file, d.end()));
            self.service_ns(d.len, seek)
        }
    }

    /// Shortest turn worth moving the device to another application: the
    /// bytes whose transfer takes twice the seek (shared by the device's
    /// parallelism), so that moving between turns takes at most a third
    /// of the device's time. 0 where a seek costs nothing or a byte does.
    pub fn turn_bytes_min(&self) -> u64 {
        if self.byte_ps == 0 {
            return 0;
        }
        let bytes = 2 * u128::from(self.seek_ns) * 1_000 / u128::from(self.byte_ps) / u128::from(self.parallelism.max(1));
        bytes.min(u128::from(u64::MAX)) as u64
    }

    /// What a request sent as a dispatch of its own costs beyond joining
    /// another: the fixed part and the seek.
    pub fn separate_ns(&self) -> u64 {
        self.dispatch_ns.saturating_add(self.seek_ns)
    }

    /// The decision rule for holds: keeping `free_slots` device slots idle
    /// for `wait_ns` pays when the `pieces` expected to join would each
    /// otherwise cost a dispatch of their own. Both sides are device time.
    pub fn hold_pays(&self, pieces: u64, wait_ns: Nanos, free_slots: u32) -> bool {
        u128::from(pieces) * u128::from(self.separate_ns()) > u128::from(wait_ns) * u128::from(free_slots.max(1))
    }

    /// The decision rule for windows: idling the device for `len_ns` to
    /// keep a synchronous reader pays when moving away and back (two
    /// seeks) would cost more than the idle time of every slot.
    pub fn window_pays(&self, len_ns: Nanos) -> bool {
        2 * u128::from(self.seek_ns) > u128::from(len_ns) * u128::from(self.parallelism)
    }

    /// Largest aggregate worth building: past the point where its transfer
    /// is eight times the fixed and seek cost, a larger aggregate saves
    /// under 1/8 of a dispatch and only takes parallelism away. On a
    /// device that serves `parallelism` dispatches at once the fixed cost
    /// overlaps, so what joining saves is that cost over the parallelism.
    /// `None` when the device has no byte cost (no such point).
    pub fn useful_dispatch_bytes(&self) -> Option<u64> {
        let per_slot = u128::from(self.separate_ns()) / u128::from(self.parallelism.max(1));
        (self.byte_ps > 0).then(|| (per_slot * 8_000 / u128::from(self.byte_ps)).min(u128::from(u64::MAX)) as u64)
    }
}

/// One completed dispatch, as the driver measured it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    pub len: u64,
    /// It did not start where the previous dispatch ended.
    pub seek: bool,
    /// Dispatches in flight when it left, itself included.
    pub depth: u32,
    /// From dispatch to completion, as the driver saw it.
    pub latency_ns: Nanos,
}

/// What a device that seeks is taken to cost until its moves were timed
/// (`policy::seen`): a 7200 rpm desktop drive's data-sheet figures (8.5 ms
/// average seek, 4.17 ms half a revolution, 100 MB/s), one dispatch at a
/// time. A model that says the device seeks but is still unconfirmed may
/// be low by any factor; turns this long cost a device that seeks less
/// only fairness at the start, never throughput.
pub const DISK: DeviceCost = DeviceCost { dispatch_ns: 0, byte_ps: 10_000, seek_ns: 12_670_000, parallelism: 1 };

/// The model a learner starts from when no calibration is given: a
/// fast device (50 us per dispatch, 1 GB/s, no seek cost, one at a time).
/// Real observations outweigh it within a few dozen dispatches.
pub const GENERIC: DeviceCost = DeviceCost { dispatch_ns: 50_000, byte_ps: 1_000, seek_ns: 0, parallelism: 1 };
/// Weight of the prior's pseudo-observations (never decayed), against at
/// most `1 / (1 - DECAY)` = 1,024 for the observations.
const PRIOR_WEIGHT: f64 = 2.0;
/// Per observation, older ones keep this much of their weight.
const DECAY: f64 = 1.0 - 1.0 / 1_024.0;

/// Length classes the learner keeps a lower edge for: one per power of two
/// (lengths past 2^39 share the last).
const EDGE_CLASSES: usize = 40;
/// An edge drops to any latency below it at once (the host only ever
/// lengthens a latency; the daemon does not report failed or short
/// transfers, which may be faster than the device's cost) and
/// follows one above it 1/256 of the way: latencies the host delayed
/// barely move it, and it still rises, slowly, when the device itself
/// gets slower. (Following lower ones 1/8 of the way, as before, left the
/// 64 KiB edge at 300-430 us after a dozen dispatches whose lowest was
/// 90-125 us, on a device that takes 86, and the fit's fixed cost at
/// 270-610 us.) On the emulated disk a seek class's edge is its nearest
/// seek's (5.17 ms near, 13.17 ms far), as the 1/8 step's was nearly:
/// the seek cost learned there is the cheap end of the disk's.
const EDGE_UP: f64 = 1.0 / 256.0;
/// A class's weight in the fit: its decayed count of observations, at
/// most this.
const EDGE_WEIGHT_MAX: f64 = 256.0;
/// Observations a length class needs before its edge enters the fit.
const EDGE_SAMPLES_MIN: u32 = 8;

/// The lower edge of one length class's latencies.
#[derive(Clone, Copy, Debug, Default)]
struct Edge {
    /// Mean length seen (moving), the point's abscissa.
    len: f64,
    /// The edge itself, nanoseconds.
    latency: f64,
    /// Decayed count of observations.
    weight: f64,
    /// Observations ever (not decayed).
    seen: u32,
}

impl Edge {
    fn add(&mut self, len: f64, latency: f64) {
        if self.seen == 0 {
            (self.len, self.latency) = (len, latency);
        } else {
            self.len += (len - self.len) / 8.0;
            self.latency = if latency < self.latency { latency } else { self.latency + (latency - self.latency) * EDGE_UP };
        }
        self.weight += 1.0;
        self.seen = self.seen.saturating_add(1);
    }

    /// Whether it has seen enough latencies to be an edge: it starts at
    /// the first one, which may be any latency at all (a cold start's
    /// 2.8 ms for 128 KiB).
    fn settled(&self) -> bool {
        self.seen >= EDGE_SAMPLES_MIN
    }

    /// Settled and seen lately (a decayed count of one or more): an edge
    /// that may bound the fixed cost. A class the scheduler stopped
    /// sending keeps its edge, which would otherwise hold the fixed cost
    /// down after the device got slower.
    fn current(&self) -> bool {
        self.settled() && self.weight >= 1.0
    }
}

/// Weighted least squares of latency against length: the normal
/// equations in sums.
#[derive(Clone, Copy, Debug, Default)]
struct Line {
    w: f64,
    x: f64,
    xx: f64,
    y: f64,
    xy: f64,
}

impl Line {
    fn add(&mut self, x: f64, y: f64, w: f64) {
        self.w += w;
        self.x += w * x;
        self.xx += w * x * x;
        self.y += w * y;
        self.xy += w * x * y;
    }

    /// (intercept, slope per byte); `None` when every point has the same
    /// length.
    fn solve(&self) -> Option<(f64, f64)> {
        let d = self.w * self.xx - self.x * self.x;
        // Also `None` for a NaN determinant.
        if d.partial_cmp(&(f64::EPSILON * self.w * self.xx)) != Some(std::cmp::Ordering::Greater) {
            return None;
        }
        let slope = (self.w * self.xy - self.x * self.y) / d;
        Some(((self.y - slope * self.x) / self.w, slope))
    }

    /// The slope of the best line with the given intercept; `None`
    /// without a point away from zero length.
    fn slope_through(&self, intercept: f64) -> Option<f64> {
        (self.xx > 0.0).then(|| (self.xy - intercept * self.x) / self.xx)
    }
}

/// Decayed sums of one length class's lone dispatches of one kind
/// (continuing or moving): their mean length and latency.
#[derive(Clone, Copy, Debug, Default)]
struct Mean {
    w: f64,
    len: f64,
    latency: f64,
}

impl Mean {
    fn add(&mut self, len: f64, latency: f64) {
        self.w += 1.0;
        self.len += len;
        self.latency += latency;
    }

    fn decay(&mut self) {
        self.w *= DECAY;
        self.len *= DECAY;
        self.latency *= DECAY;
    }

    fn means(&self) -> (f64, f64) {
        (self.len / self.w, self.latency / self.w)
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Avg {
    value: f64,
    n: u32,
}

impl Avg {
    fn add(&mut self, x: f64) {
        self.value = if self.n == 0 { x } else { self.value + (x - self.value) / 8.0 };
        self.n = self.n.saturating_add(1);
    }
}

/// The online learner (see the module documentation).
#[derive(Clone, Debug)]
pub struct CostLearner {
    /// The model it started from (a calibration, else [`GENERIC`]): a few
    /// pseudo-observations that keep the fit determined.
    prior: DeviceCost,
    /// Lower edges per (length class, seek).
    edges: Vec<[Edge; 2]>,
    /// Means per (length class, seek) of dispatches alone on the device:
    /// what a move costs on average (`mean_move`).
    lone: Vec<[Mean; 2]>,
    model: DeviceCost,
    /// Per depth (index depth - 1): dispatches observed there, which
    /// tell `depth_cap` whether the depth above is still to be probed.
    at_depth: Vec<u32>,
    /// Per depth and length class (index `class_index`), the mean
    /// latency of dispatches that continued the previous one: depths are
    /// compared on the same dispatches, so no seek (whose cost the model
    /// may not know yet) reads as a depth's slowdown, and a host delay
    /// lengthens every depth alike.
    by_depth: Vec<Avg>,
    observed: u64,
}

/// Where (depth, length class) lives in `CostLearner::by_depth`.
fn class_index(depth: u32, class: usize) -> usize {
    (depth as usize - 1) * EDGE_CLASSES + class
}

impl Default for CostLearner {
    fn default() -> CostLearner {
        CostLearner::new(None)
    }
}

impl CostLearner {
    /// A learner that starts from `prior` (a calibration), else from
    /// [`GENERIC`].
    pub fn new(prior: Option<DeviceCost>) -> CostLearner {
        let start = prior.unwrap_or(GENERIC);
        CostLearner {
            prior: start,
            edges: vec![[Edge::default(); 2]; EDGE_CLASSES],
            lone: vec![[Mean::default(); 2]; EDGE_CLASSES],
            model: start,
            at_depth: vec![0; DEPTH_MAX as usize],
            by_depth: vec![Avg::default(); DEPTH_MAX as usize * EDGE_CLASSES],
            observed: 0,
        }
    }

    /// Dispatches observed so far.
    pub fn observed(&self) -> u64 {
        self.observed
    }

    /// Take one completed dispatch into account.
    pub fn observe(&mut self, o: Observation) {
        self.observed += 1;
        let depth = o.depth.clamp(1, DEPTH_MAX);
        let seen = &mut self.at_depth[depth as usize - 1];
        *seen = seen.saturating_add(1);
        let class = (64 - o.len.leading_zeros() as usize).min(EDGE_CLASSES - 1);
        if !o.seek {
            self.by_depth[class_index(depth, class)].add(o.latency_ns as f64);
        }
        if depth == 1 {
            self.lone.iter_mut().flatten().for_each(Mean::decay);
            self.lone[class][usize::from(o.seek)].add(o.len as f64, o.latency_ns as f64);
        }
        // Only dispatches that did not queue in the device tell its costs.
        if depth <= self.model.parallelism {
            self.edges.iter_mut().flatten().for_each(|e| e.weight *= DECAY);
            self.edges[class][usize::from(o.seek)].add(o.len as f64, o.latency_ns as f64);
            let clamp = |v: f64| if v.is_finite() { v.clamp(0.0, 1e12) as u64 } else { 0 };
            let seek = self.seek_estimate();
            let mut line = Line::default();
            // Relative errors: each point weighs by the inverse square of
            // the latency the model predicts at its length, so the fixed
            // cost comes from the short dispatches and the long ones,
            // whose edges wander by more than a short dispatch's whole
            // cost, set the cost per byte.
            let model = self.model;
            let rel = |len: f64| 1.0 / (model.service_ns(len as u64, false).max(1) as f64).powi(2);
            for len in [4_096u64, 1 << 20] {
                line.add(len as f64, self.prior.service_ns(len, false) as f64, 2.0 * PRIOR_WEIGHT * rel(len as f64));
            }
            // A seeking edge enters the line less the seek cost, which is
            // an average over the classes that have both kinds; where seeks
            // differ in cost (an arm that moves near or far), a class that
            // only seeks far would put the difference into the line (a
            // 4 KiB class of 13 ms far seeks made the cost per byte 50
            // times the disk's under fifo, mix10 on the emulated disk). So
            // once two lengths have continuing edges, those alone set it.
            let continuing = self.edges.iter().filter(|[cont, _]| cont.settled()).count();
            let kinds = if continuing >= 2 { 1 } else { 2 };
            for (s, e) in self.edges.iter().flat_map(|pair| pair.iter().take(kinds).enumerate()).filter(|(_, e)| e.settled()) {
                line.add(e.len, e.latency - s as f64 * seek, e.weight.min(EDGE_WEIGHT_MAX) * rel(e.len));
            }
            if let Some((fixed, per_byte)) = line.solve() {
                // No dispatch takes less than the fixed cost, so the
                // lowest current edge bounds it: host delays that do not
                // grow with length (a loop thread waiting for a core)
                // tilt the line and lift its intercept above every short
                // latency. Bounded, the cost per byte is refitted through
                // the bound.
                let lowest = self.edges.iter().flatten().filter(|e| e.current()).map(|e| e.latency).fold(f64::INFINITY, f64::min);
                let (fixed, per_byte) = if fixed > lowest { (lowest, line.slope_through(lowest).unwrap_or(per_byte)) } else { (fixed, per_byte) };
                (self.model.dispatch_ns, self.model.byte_ps) = (clamp(fixed), clamp(per_byte * 1_000.0));
            }
            self.model.seek_ns = clamp(seek);
        }
        self.model.parallelism = self.parallelism_estimate();
    }

    /// The seek cost: in each length class whose two edges are settled, how much
    /// the seeking dispatches' edge lies above the continuing ones', less
    /// what their lengths differ by; weighted by the rarer kind's count,
    /// with the prior's seek cost as one more class. Only dispatches of
    /// one length are compared: when the seeking ones are all of another
    /// length (a scheduler that seeks only between large aggregates), a
    /// fit over every length would put into the seek cost whatever the
    /// device charges those lengths beyond a straight line.
    fn seek_estimate(&self) -> f64 {
        let per_byte = self.model.byte_ps as f64 / 1_000.0;
        if let Some(mean) = self.mean_move(per_byte) {
            return mean;
        }
        let (mut sum, mut weight) = (self.prior.seek_ns as f64 * PRIOR_WEIGHT, PRIOR_WEIGHT);
        for [cont, seek] in &self.edges {
            let w = cont.weight.min(seek.weight).min(EDGE_WEIGHT_MAX);
            if cont.settled() && seek.settled() {
                sum += w * (seek.latency - cont.latency - per_byte * (seek.len - cont.len));
                weight += w;
            }
        }
        (sum / weight).max(0.0)
    }

    /// What a move costs on average: in each length class with at least
    /// `CLASS_SAMPLES_MIN` lone dispatches of both kinds (decayed), how
    /// much the moving ones' mean latency lies above the continuing
    /// ones', less what their mean lengths differ by; weighted by the
    /// rarer kind's count. Where moves differ in cost (near and far on a
    /// disk) the lower edges give the cheapest (the emulated disk's 5.17
    /// ms track to track where its far seek is 13.17 ms: with a quarter of
    /// the moves near, 5.3-5.7 ms learned against 11.2 on average); the
    /// means give what moving costs. A host delay lengthens both kinds
    /// alike and cancels. `None` until some class has enough of both.
    fn mean_move(&self, per_byte: f64) -> Option<f64> {
        let (mut sum, mut weight) = (0.0f64, 0.0f64);
        for [cont, moved] in &self.lone {
            let w = cont.w.min(moved.w);
            if w < f64::from(CLASS_SAMPLES_MIN) {
                continue;
            }
            let ((cl, ct), (ml, mt)) = (cont.means(), moved.means());
            sum += w * (mt - ct - per_byte * (ml - cl));
            weight += w;
        }
        (weight > 0.0).then(|| (sum / weight).max(0.0))
    }

    /// Each depth's throughput relative to depth one's: the depth over
    /// how much longer the same dispatches take there (the mean latencies
    /// of continuing dispatches of one length class, geometric mean over
    /// the classes both depths have seen enough of). A serial device
    /// stays near 1 at every depth (a dispatch at depth d waits for
    /// others); one that serves k at once reaches k. `None` where a depth
    /// shares no class with depth one: no evidence, and the parallelism
    /// then stays at the safe one, as on a disk.
    fn throughput_by_depth(&self) -> [Option<f64>; DEPTH_MAX as usize] {
        std::array::from_fn(|d| {
            if d == 0 {
                return Some(1.0);
            }
            let (mut log_sum, mut weight) = (0.0f64, 0.0f64);
            for class in 0..EDGE_CLASSES {
                let (one, here) = (self.by_depth[class_index(1, class)], self.by_depth[class_index(d as u32 + 1, class)]);
                if one.n >= CLASS_SAMPLES_MIN && here.n >= CLASS_SAMPLES_MIN && one.value > 0.0 && here.value > 0.0 {
                    let w = f64::from(one.n.min(here.n));
                    log_sum += w * (here.value / one.value).ln();
                    weight += w;
                }
            }
            (weight > 0.0).then(|| (d + 1) as f64 / (log_sum / weight).exp())
        })
    }

    /// The parallelism: one, unless some depth's throughput is at least
    /// `PARALLEL_GAIN_MIN` times depth one's; then the smallest depth
    /// that reaches `PARALLEL_GAIN_PCT` of the best. A smaller estimate
    /// than the current parallelism replaces it only once the current
    /// one falls below `PARALLEL_KEEP` of the best.
    fn parallelism_estimate(&self) -> u32 {
        let tput = self.throughput_by_depth();
        let best = tput.iter().flatten().copied().fold(1.0, f64::max);
        if best < PARALLEL_GAIN_MIN {
            return 1;
        }
        let estimate = tput.iter().position(|t| t.is_some_and(|t| t * 100.0 >= best * PARALLEL_GAIN_PCT as f64)).map_or(1, |d| d as u32 + 1);
        let current = self.model.parallelism;
        let keep = estimate < current && tput[current as usize - 1].is_some_and(|t| t >= best * PARALLEL_KEEP);
        if keep {
            current
        } else {
            estimate
        }
    }

    /// The parallelism learned so far.
    pub fn parallelism(&self) -> u32 {
        self.model.parallelism
    }

    /// How many dispatches the scheduler should keep in flight: the
    /// learned parallelism, plus one while probing whether more would
    /// gain: until the depth above has `DEPTH_SAMPLES_MIN` samples, then
    /// for `PROBE_LEN` of every `PROBE_PERIOD` observations (a device
    /// that gains nothing from it pays an extra dispatch in flight 1/16
    /// of the time).
    pub fn depth_cap(&self) -> u32 {
        let above = self.model.parallelism as usize;
        let unknown = above < DEPTH_MAX as usize && self.at_depth[above] < DEPTH_SAMPLES_MIN;
        let probing = unknown || self.observed % PROBE_PERIOD < PROBE_LEN;
        (self.model.parallelism + u32::from(probing)).min(DEPTH_MAX)
    }

    /// The model as learned so far (the prior before any observation).
    pub fn model(&self) -> DeviceCost {
        self.model
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_reads_in_microseconds_and_nanoseconds_per_byte() {
        assert_eq!(DeviceCost::new(50_000, 1_000, 8_500_000, 8).to_string(), "50.0 us per dispatch, 1.000 ns per byte, seek 8500.0 us, parallelism 8");
    }

    #[test]
    fn decision_rules_by_hand() {
        let disk = DeviceCost::new(50_000, 10_000, 13_000_000, 1);
        // 3 pieces x 13.05 ms saved against 5 ms of one idle slot.
        assert!(disk.hold_pays(3, 5_000_000, 1));
        assert!(disk.window_pays(2_000_000));
        let flash = DeviceCost::new(20_000, 500, 0, 8);
        // 3 pieces x 20 us against 100 us of 4 idle slots: no.
        assert!(!flash.hold_pays(3, 100_000, 4));
        assert!(flash.hold_pays(30, 100_000, 4));
        assert!(!flash.window_pays(20_000));
        // 8 x 20 us / 8 slots of transfer at 0.5 ns/byte: 40,000 bytes.
        assert_eq!(flash.useful_dispatch_bytes(), Some(40_000));
        assert_eq!(DeviceCost::new(20_000, 500, 0, 1).useful_dispatch_bytes(), Some(320_000));
        assert_eq!(DeviceCost::new(1, 0, 0, 1).useful_dispatch_bytes(), None);
        assert_eq!(flash.service_ns(1_000, true), 20_500);
    }

    #[test]
    fn depth_cap_is_bounded() {
        let l = CostLearner::new(Some(DeviceCost::new(1, 1, 1, 500)));
        assert_eq!(l.depth_cap(), DEPTH_MAX);
        assert_eq!(CostLearner::default().depth_cap(), 2);
        assert_eq!(CostLearner::default().model(), GENERIC);
    }
}
