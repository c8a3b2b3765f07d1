//! `auto`: aioli or fifo-merge, whichever would have served the recent
//! requests sooner on this device: a default that is never
//! worse than either.
//!
//! aioli wins where a separate access is costly (seeks, a large fixed
//! cost per dispatch) and can lose where the device serves many small
//! requests in parallel at little cost each; fifo-merge, arrival order
//! with contiguous requests joined, is the baseline it must not lose to.
//! Which one wins depends on the device and on the workload of the
//! moment, and both are known to the server: the device through the cost
//! model its driver learns (`crate::cost`), the workload through the
//! requests it saw. So `auto` keeps both policies up to date and lets one
//! of them choose:
//!
//! 1. **Both candidates see everything.** Every hook (`enqueued`,
//!    `dispatched`, `completed`, weights, the device model) goes to both,
//!    so either can take over at any moment with state as complete as if
//!    it had run all along; only the active one answers `pick` (and says
//!    whether the scheduler serves in arrival order).
//! 2. **A window of recent requests.** The last
//!    `AUTO_WINDOW_REQUESTS_MAX` requests are remembered with when they
//!    entered and when they completed.
//! 3. **A replay per candidate.** Once the window is full, then every
//!    `AUTO_REPLAY_EVERY_REQUESTS` completions (and at most once per
//!    `AUTO_PERIOD_NS_MIN` of the driver's clock), the completed requests
//!    of the window become
//!    closed-loop streams, one per (application, client): each keeps as
//!    many requests outstanding as it had at most, and sends each one as
//!    long after the completion that freed its place as it did for real.
//!    Each candidate serves them in a scheduler of its own
//!    ([`crate::replay`]), the device taking `DeviceCost::service_ns` per
//!    dispatch (a seek where a dispatch does not continue the one before)
//!    with as many in flight as the model's parallelism.
//! 4. **A switch with a margin.** The other candidate becomes the active
//!    one when its replay ends at least `AUTO_MARGIN_PCT` sooner than the
//!    active one's; every switch is counted (`Stats::policy_switches`).
//!
//! Without a device model, or with fewer than
//! `AUTO_WINDOW_REQUESTS_MIN` completed requests in the window, nothing
//! is replayed and aioli stays. Like everything in the core it reads no
//! clock: the same requests at the same times make the same switches.
//!
//! Memory: the window grows with the requests seen, to at most
//! `AUTO_WINDOW_REQUESTS_MAX` records of 64 bytes and their index, about
//! 84 KiB per scheduler: in a simulated cluster of 10,000 servers, up to
//! about 820 MiB.
//!
//! Cost: both candidates' bookkeeping a request, one hash insert and one
//! removal (the window's index by request id), and two replays of at most
//! `AUTO_WINDOW_REQUESTS_MAX` requests each every
//! `AUTO_REPLAY_EVERY_REQUESTS` requests, on the driver's thread.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use super::aioli::Aioli;
use super::fifo::Fifo;
use super::{Pick, Policy};
use crate::config::{AioliParams, Limits, PolicyConfig};
use crate::cost::DeviceCost;
use crate::hash::FxHashMap;
use crate::replay::{replay, ReplayOptions, Stream};
use crate::scheduler::Scheduler;
use crate::store::{Entry, Slot, Store};
use crate::types::{AppId, ClientId, Dispatch, Nanos, Request, RequestId};

/// Requests the window remembers; past it the oldest is dropped. 1,024:
/// about a millisecond of replay per candidate on the 2-core VM.
pub const AUTO_WINDOW_REQUESTS_MAX: usize = 1_024;
/// Completed requests in the window below which no replay is run: too few
/// to tell the candidates apart.
pub const AUTO_WINDOW_REQUESTS_MIN: usize = 64;
/// Completions between replays (the first comes once the window is full):
/// four windows, so that the replays cost about half a replayed request
/// per request served, a small part of what serving it costs.
pub const AUTO_REPLAY_EVERY_REQUESTS: u64 = 4 * AUTO_WINDOW_REQUESTS_MAX as u64;
/// And at least this long between replays, nanoseconds of the driver's
/// clock (100 ms), so that a fast device does not replay back to back.
pub const AUTO_PERIOD_NS_MIN: Nanos = 100_000_000;
/// How much sooner (percent) the other candidate's replay must end to
/// take over: less is the replay's own error, and a switch back and
/// forth on it would only add noise.
pub const AUTO_MARGIN_PCT: u64 = 3;
/// Events one replay may take: a candidate that has not finished by then
/// is not chosen.
const AUTO_REPLAY_EVENTS_MAX: u64 = 64 * AUTO_WINDOW_REQUESTS_MAX as u64;

/// The candidates, in the order of `Auto::candidates`.
pub const AUTO_CANDIDATES: [&str; 2] = ["aioli", "fifo-merge"];

const NONE: Nanos = Nanos::MAX;

/// One remembered request.
#[derive(Clone, Copy)]
struct Rec {
    req: Request,
    arrival: Nanos,
    /// When it completed (`NONE`: not yet).
    done: Nanos,
}

pub(crate) struct Auto {
    aioli_params: AioliParams,
    limits: Limits,
    candidates: [Box<dyn Policy + Send>; 2],
    active: usize,
    /// The window, oldest first; `first_seq` numbers its front, and
    /// `by_id` finds a request that has not completed yet.
    window: VecDeque<Rec>,
    first_seq: u64,
    by_id: FxHashMap<RequestId, u64>,
    /// Applications given a weight other than 1.
    weights: FxHashMap<AppId, u32>,
    cost: Option<DeviceCost>,
    /// Completions until the next replay, and the time before which none
    /// is run.
    replay_in: u64,
    replay_after: Nanos,
    switches: u64,
    /// Windows opened while aioli was the active candidate: before its
    /// current term, and aioli's own count when that term began.
    windows_before: u64,
    windows_at_switch: u64,
}

impl Auto {
    pub fn new(p: AioliParams, limits: &Limits) -> Auto {
        Auto {
            candidates: [Box::new(Aioli::new(p.clone(), limits)), Box::new(Fifo::new(true))],
            aioli_params: p,
            limits: limits.clone(),
            active: 0,
            window: VecDeque::new(),
            first_seq: 0,
            by_id: FxHashMap::default(),
            weights: FxHashMap::default(),
            cost: None,
            replay_in: AUTO_WINDOW_REQUESTS_MAX as u64,
            replay_after: 0,
            switches: 0,
            windows_before: 0,
            windows_at_switch: 0,
        }
    }

    fn active(&self) -> &(dyn Policy + Send) {
        &*self.candidates[self.active]
    }

    /// Remember `e`, dropping the oldest request past the bound.
    fn remember(&mut self, e: &Entry) {
        if self.window.len() == AUTO_WINDOW_REQUESTS_MAX {
            let old = self.window.pop_front().expect("the window is full");
            if self.by_id.get(&old.req.id) == Some(&self.first_seq) {
                self.by_id.remove(&old.req.id);
            }
            self.first_seq += 1;
        }
        self.by_id.insert(e.req.id, self.first_seq + self.window.len() as u64);
        self.window.push_back(Rec { req: e.req, arrival: e.arrival, done: NONE });
    }

    /// Run a replay if one is due, and switch if the other candidate won.
    fn maybe_replay(&mut self, completed: u64, now: Nanos) {
        self.replay_in = self.replay_in.saturating_sub(completed);
        if self.replay_in > 0 || now < self.replay_after {
            return;
        }
        (self.replay_in, self.replay_after) = (AUTO_REPLAY_EVERY_REQUESTS, now.saturating_add(AUTO_PERIOD_NS_MIN));
        let Some(cost) = self.cost else { return };
        let streams = window_streams(&self.window);
        if streams.iter().map(|s| s.requests.len()).sum::<usize>() < AUTO_WINDOW_REQUESTS_MIN {
            return;
        }
        let ends: Vec<Option<Nanos>> = (0..AUTO_CANDIDATES.len()).map(|c| self.replay_end(c, &streams, cost)).collect();
        let (Some(mine), Some(other)) = (ends[self.active], ends[1 - self.active]) else { return };
        if u128::from(other) * 100 < u128::from(mine) * u128::from(100 - AUTO_MARGIN_PCT) {
            self.switch_to(1 - self.active);
        }
    }

    /// When the window's streams would end under candidate `c`.
    fn replay_end(&self, c: usize, streams: &[Stream], cost: DeviceCost) -> Option<Nanos> {
        let config = match c {
            0 => PolicyConfig::Aioli(self.aioli_params.clone()),
            _ => PolicyConfig::FifoMerge,
        };
        let depth = cost.parallelism.clamp(1, self.limits.dispatches_inflight_max);
        let mut s = Scheduler::new(config, Limits { dispatches_inflight_max: depth, ..self.limits.clone() });
        s.set_device_cost(Some(cost));
        s.set_depth(depth);
        for (&app, &w) in &self.weights {
            s.set_app_weight(app, w.max(1)).ok()?;
        }
        let log = replay(&mut s, streams, cost.serving(), ReplayOptions::plain(AUTO_REPLAY_EVENTS_MAX)).ok()?;
        log.served.iter().map(|sv| sv.done_ns).max()
    }

    fn switch_to(&mut self, c: usize) {
        if c == self.active {
            return;
        }
        let aioli_windows = self.candidates[0].windows_opened();
        if self.active == 0 {
            self.windows_before += aioli_windows - self.windows_at_switch;
        } else {
            self.windows_at_switch = aioli_windows;
        }
        self.active = c;
        self.switches += 1;
    }
}

/// The window's completed requests as closed-loop streams, one per
/// (application, client), their times counted from the window's first
/// arrival (module documentation, step 3). Requests are renumbered from
/// 1 (ids may repeat across a daemon's connections).
fn window_streams(window: &VecDeque<Rec>) -> Vec<Stream> {
    let t0 = window.iter().map(|r| r.arrival).min().unwrap_or(0);
    let mut by_stream: BTreeMap<(AppId, ClientId), Vec<Rec>> = BTreeMap::new();
    for r in window.iter().filter(|r| r.done != NONE) {
        by_stream.entry((r.req.app, r.req.client)).or_default().push(*r);
    }
    let mut next_id = 0u64;
    by_stream
        .into_values()
        .map(|recs| {
            let depth = outstanding_max(&recs);
            let start = recs[0].arrival - t0;
            // The first `depth` requests leave after the stream's start; each
            // later one after the completion that freed its place.
            let thinks =
                recs.iter().enumerate().map(|(i, r)| if i < depth { r.arrival.saturating_sub(recs[0].arrival) } else { r.arrival.saturating_sub(recs[i - depth].done) }).collect();
            let requests = recs
                .iter()
                .map(|r| {
                    next_id += 1;
                    Request { id: RequestId(next_id), ..r.req }
                })
                .collect();
            Stream { start_ns: start, think_ns: 0, jitter_ns: 0, depth, requests, thinks }
        })
        .collect()
}

/// The most of `recs` (in arrival order) outstanding at once.
fn outstanding_max(recs: &[Rec]) -> usize {
    let mut out: BinaryHeap<Reverse<Nanos>> = BinaryHeap::new();
    let mut most = 1;
    for r in recs {
        while out.peek().is_some_and(|&Reverse(done)| done <= r.arrival) {
            out.pop();
        }
        out.push(Reverse(r.done));
        most = most.max(out.len());
    }
    most
}

impl Policy for Auto {
    fn merges(&self) -> bool {
        self.active().merges()
    }

    fn arrival_order(&self) -> bool {
        self.active().arrival_order()
    }

    fn enqueued(&mut self, store: &Store, slot: Slot, now: Nanos) {
        for c in &mut self.candidates {
            c.enqueued(store, slot, now);
        }
        self.remember(store.entry(slot));
    }

    fn pick(&mut self, store: &Store, now: Nanos) -> Pick {
        self.candidates[self.active].pick(store, now)
    }

    fn dispatched(&mut self, store: &Store, d: &Dispatch, members: &[Entry], forced: bool, now: Nanos) {
        for c in &mut self.candidates {
            c.dispatched(store, d, members, forced, now);
        }
    }

    fn completed(&mut self, store: &Store, d: &Dispatch, now: Nanos) {
        for c in &mut self.candidates {
            c.completed(store, d, now);
        }
        for m in &d.members {
            if let Some(seq) = self.by_id.remove(&m.id) {
                if let Some(r) = seq.checked_sub(self.first_seq).and_then(|i| self.window.get_mut(i as usize)) {
                    r.done = now;
                }
            }
        }
        self.maybe_replay(d.members.len() as u64, now);
    }

    fn set_weight(&mut self, app: AppId, weight: u32) {
        for c in &mut self.candidates {
            c.set_weight(app, weight);
        }
        if weight == 1 {
            self.weights.remove(&app);
        } else {
            self.weights.insert(app, weight);
        }
    }

    fn set_device(&mut self, cost: Option<DeviceCost>, depth: u32) {
        self.cost = cost;
        for c in &mut self.candidates {
            c.set_device(cost, depth);
        }
    }

    fn set_prefetch(&mut self, on: bool) {
        for c in &mut self.candidates {
            c.set_prefetch(on);
        }
    }

    fn set_throttled(&mut self, app: AppId, throttled: bool) {
        for c in &mut self.candidates {
            c.set_throttled(app, throttled);
        }
    }

    fn set_share(&mut self, app: AppId, keys: &[u64]) {
        for c in &mut self.candidates {
            c.set_share(app, keys);
        }
    }

    fn forget_app(&mut self, app: AppId) {
        for c in &mut self.candidates {
            c.forget_app(app);
        }
        self.weights.remove(&app);
    }

    fn apps_tracked(&self) -> usize {
        self.candidates.iter().map(|c| c.apps_tracked()).max().unwrap_or(0)
    }

    fn windows_opened(&self) -> u64 {
        let during = if self.active == 0 { self.candidates[0].windows_opened() - self.windows_at_switch } else { 0 };
        self.windows_before + during
    }

    fn quantum(&self, app: AppId) -> Option<u64> {
        self.active().quantum(app)
    }

    fn switches(&self) -> u64 {
        self.switches
    }

    fn active_name(&self) -> Option<&'static str> {
        Some(AUTO_CANDIDATES[self.active])
    }

    fn check(&self, store: &Store) {
        for c in &self.candidates {
            c.check(store);
        }
        assert!(self.window.len() <= AUTO_WINDOW_REQUESTS_MAX, "auto's window over its bound");
        assert!(self.by_id.len() <= self.window.len(), "auto's index of the window: {} for {} requests", self.by_id.len(), self.window.len());
        assert!(self.weights.len() <= self.limits.apps_max as usize, "auto's weights over apps_max");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{FileId, Op, RequestId};

    fn entry(id: u64, client: u32, offset: u64, arrival: Nanos) -> Entry {
        let req = Request { id: RequestId(id), app: AppId(1), client: ClientId(client), file: FileId(1), op: Op::Read, offset, len: 4096 };
        Entry { req, arrival, seq: id }
    }

    fn rec(e: Entry, done: Nanos) -> Rec {
        Rec { req: e.req, arrival: e.arrival, done }
    }

    /// The window keeps `AUTO_WINDOW_REQUESTS_MAX` requests; one more drops
    /// the oldest, and its index entry with it.
    #[test]
    fn the_window_is_bounded_at_n_and_n_plus_1() {
        let mut a = Auto::new(AioliParams::default(), &Limits::default());
        for i in 0..AUTO_WINDOW_REQUESTS_MAX as u64 {
            a.remember(&entry(i, 0, i * 4096, i));
        }
        assert_eq!((a.window.len(), a.by_id.len(), a.first_seq), (AUTO_WINDOW_REQUESTS_MAX, AUTO_WINDOW_REQUESTS_MAX, 0));
        a.remember(&entry(AUTO_WINDOW_REQUESTS_MAX as u64, 0, 0, 0));
        assert_eq!((a.window.len(), a.by_id.len(), a.first_seq), (AUTO_WINDOW_REQUESTS_MAX, AUTO_WINDOW_REQUESTS_MAX, 1));
        assert!(!a.by_id.contains_key(&RequestId(0)), "the oldest left the index");
        assert_eq!(a.by_id[&RequestId(AUTO_WINDOW_REQUESTS_MAX as u64)], AUTO_WINDOW_REQUESTS_MAX as u64);
    }

    /// A synchronous stream replays with the gaps it left after each
    /// completion; one with two requests out at once keeps two out.
    #[test]
    fn the_window_becomes_closed_loop_streams() {
        let window: VecDeque<Rec> = [
            rec(entry(1, 7, 0, 1_000), 1_500),
            rec(entry(2, 7, 4096, 1_800), 2_000),
            rec(entry(3, 7, 8192, 2_900), 3_000),
            rec(entry(4, 9, 0, 1_000), 2_000),
            rec(entry(5, 9, 4096, 1_100), 2_100),
            rec(entry(6, 9, 8192, 2_150), 2_500),
            rec(entry(7, 9, 12288, 2_200), NONE),
        ]
        .into();
        let s = window_streams(&window);
        assert_eq!(s.len(), 2, "one stream per client");
        let (sync, two) = (&s[0], &s[1]);
        assert_eq!((sync.start_ns, sync.depth, sync.thinks.as_slice()), (0, 1, &[0, 300, 900][..]));
        assert_eq!((two.start_ns, two.depth, two.thinks.as_slice()), (0, 2, &[0, 100, 150][..]), "request 7 has not completed");
        let ids: Vec<u64> = s.iter().flat_map(|st| st.requests.iter().map(|r| r.id.0)).collect();
        assert_eq!(ids, [1, 2, 3, 4, 5, 6], "renumbered from 1");
    }

    /// Below `AUTO_WINDOW_REQUESTS_MIN` completed requests no replay is
    /// run, whatever the model.
    #[test]
    fn too_few_requests_replay_nothing() {
        let mut a = Auto::new(AioliParams::default(), &Limits::default());
        a.set_device(Some(DeviceCost::new(20_000, 500, 0, 8)), 8);
        for i in 0..AUTO_WINDOW_REQUESTS_MIN as u64 - 1 {
            a.remember(&entry(i, 0, i * 4096, i));
            a.window.back_mut().expect("just remembered").done = i + 1;
        }
        a.replay_in = 1;
        a.maybe_replay(1, 1_000_000);
        assert_eq!((a.switches, a.replay_in), (0, AUTO_REPLAY_EVERY_REQUESTS), "the replay was due and found too few");
    }
}
