//! Service classes: rate limits and guaranteed minimums an operator sets,
//! in the pure core so that the daemon and the simulator apply the same
//! ones (`Scheduler::set_qos`).
//!
//! A class has any of a rate limit in bytes/s and in requests/s (token
//! buckets whose depth is `depth_ns` worth of the rate) and a guaranteed
//! minimum in bytes/s. Each application is in one class (`set_app_class`;
//! the last class, `default`, holds the others). Classes decide only
//! *when* a class may have the device; the policy still decides what to
//! dispatch, in offset order and aggregated.
//!
//! Two ways to apply them, by the policy's kind:
//!
//! - **Paced by the policy** (`Policy::paces`: aIOLi). Requests enter the
//!   policy as they come and are charged as they are dispatched; the
//!   policy is told each class's `Gate` and keeps it in its turn order.
//!   A limited class *rests* from the dispatch that puts a bucket in debt
//!   until its buckets are half full again; it is then *urgent*: it takes
//!   the next turn (the current one ends at its next dispatch), and its
//!   turn, with windows for its readers, lasts until it rests again. So it
//!   moves in bursts of half a bucket or more, one seek each on a disk,
//!   at its rate on average; a dispatch carries at most a bucket's depth.
//!   A guaranteed class is urgent while *owed* (its guarantee bucket above
//!   minus half its depth): it takes the next turn, a turn as any other.
//!   The bytes it moves while not owed take its bucket down to one depth
//!   of debt at most, so a class gets its guarantee and then its share. A
//!   limit's burst goes before expired requests (they go between bursts);
//!   a guarantee does not.
//! - **At the entry** (every other policy). A request of a limited class
//!   enters the policy when the class's buckets are not in debt; it is
//!   charged as it enters (a request larger than the depth passes and
//!   leaves the bucket in debt); the others wait in their class's queue,
//!   in arrival order. While a class is owed its guarantee, its oldest
//!   request in the policy is dispatched before the policy chooses (with
//!   the requests contiguous to it, as an expired one is).
//! - **Starvation bound.** A request that has waited in a class queue for
//!   `request_expire_ns` enters whatever its class's state, as the
//!   scheduler's expiry bounds every request's wait (paced, the expiry
//!   dispatches it).
//!
//! Bounds: at most `QOS_CLASSES_MAX` classes; requests waiting in class
//! queues count against the scheduler's `queued_requests_max` and
//! `queued_bytes_max` like any queued request. Buckets are integers
//! (units x 10^9, refilled by the nanosecond), so runs are deterministic.

use std::collections::VecDeque;

use crate::hash::FxHashMap;
use crate::store::{LazyFifo, Slot, Store};
use crate::types::{AppId, Nanos, Request, RequestId};

/// Classes of one scheduler, `default` included.
pub const QOS_CLASSES_MAX: usize = 64;
/// Bucket depth when a class names none: 20 ms worth of its rate, so a
/// burst after a quiet spell is 2% of a second's allowance.
pub const QOS_DEPTH_NS_DEFAULT: u64 = 20_000_000;
/// Deepest bucket: 10 s worth of its rate.
pub const QOS_DEPTH_NS_MAX: u64 = 10_000_000_000;
/// The name of the class of applications no rule placed.
pub const QOS_DEFAULT_CLASS: &str = "default";

/// A class as an operator describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassSpec {
    pub name: String,
    pub rate_bytes_per_s: Option<u64>,
    pub rate_requests_per_s: Option<u64>,
    pub guarantee_bytes_per_s: Option<u64>,
    /// Bucket depth as time worth of the rate; 0: `QOS_DEPTH_NS_DEFAULT`.
    pub depth_ns: u64,
}

/// What is wrong with a set of classes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QosError(pub String);

impl std::fmt::Display for QosError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for QosError {}

/// A class's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    pub name: String,
    /// Its rate limit and guarantee, bytes/s (as set).
    pub rate_bytes_per_s: Option<u64>,
    pub guarantee_bytes_per_s: Option<u64>,
    /// Requests waiting in the class queue now, and their bytes.
    pub held: u64,
    pub held_bytes: u64,
    /// Requests and bytes that reached the policy, and bytes dispatched.
    pub admitted_requests: u64,
    pub admitted_bytes: u64,
    pub dispatched_bytes: u64,
    /// Requests that entered by the starvation bound.
    pub expired: u64,
    /// Dispatches made for the class's guarantee, before the policy chose.
    pub guaranteed: u64,
}

/// What a policy that paces classes itself (`Policy::paces`: aIOLi) is
/// told of an application's class (`Policy::set_gate`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gate {
    /// The class is resting: its rate limit went into debt, and it gets
    /// no turn until its bucket is full again.
    pub held: bool,
    /// The class should have the device next: its limit's bucket is half
    /// full (before long tokens would be lost), or its guarantee is owed.
    pub urgent: bool,
    /// Urgent for its guarantee (which, unlike a limit's burst, does not
    /// go before expired requests).
    pub owed: bool,
    /// The most bytes one dispatch of it may carry: its bucket's depth
    /// (`u64::MAX`: no limit).
    pub cap: u64,
}

impl Gate {
    pub const OPEN: Gate = Gate { held: false, urgent: false, owed: false, cap: u64::MAX };
}

/// A token bucket in units x 10^9.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    rate: u64,
    tokens: i128,
    cap: i128,
    at: Nanos,
}

const SCALE: i128 = 1_000_000_000;

impl Bucket {
    fn new(rate: u64, depth_ns: u64, now: Nanos) -> Bucket {
        let cap = i128::from(rate) * i128::from(depth_ns);
        Bucket { rate, tokens: cap, cap, at: now }
    }

    fn refill(&mut self, now: Nanos) {
        if now > self.at {
            self.tokens = (self.tokens + i128::from(self.rate) * i128::from(now - self.at)).min(self.cap);
            self.at = now;
        }
    }

    fn charge(&mut self, units: u64) {
        self.tokens -= i128::from(units) * SCALE;
    }

    /// Half full or more: a paced class's burst may start (the other
    /// half covers the wait for the device, so that no token is lost).
    fn ready(&self) -> bool {
        self.tokens >= self.cap / 2
    }

    /// When the bucket is half full (refilled from `at`).
    fn ready_at_half(&self) -> Nanos {
        let rate = i128::from(self.rate.max(1));
        let ns = ((self.cap / 2 - self.tokens).max(0) + rate - 1) / rate;
        self.at.saturating_add(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    /// When the bucket is out of debt (refilled from `at`).
    fn ready_at(&self) -> Nanos {
        if self.tokens >= 0 {
            return self.at;
        }
        let ns = (-self.tokens + i128::from(self.rate) - 1) / i128::from(self.rate.max(1));
        self.at.saturating_add(u64::try_from(ns).unwrap_or(u64::MAX))
    }
}

struct Class {
    stats: ClassStats,
    bytes: Option<Bucket>,
    requests: Option<Bucket>,
    guarantee: Option<Bucket>,
    /// Requests waiting to reach the policy: the request and its arrival.
    queue: VecDeque<(Request, Nanos)>,
    /// Requests of the class admitted and not yet dispatched.
    admitted_waiting: u64,
    /// With a guarantee: the store slots of its admitted requests, oldest
    /// first (lazily pruned, `LazyFifo`).
    slots: LazyFifo,
    /// Paced: its limit went into debt and it waits for a full bucket.
    resting: bool,
    /// Paced: the gate its applications were last given.
    gate: Gate,
}

impl Class {
    fn refill(&mut self, now: Nanos) {
        for b in [&mut self.bytes, &mut self.requests, &mut self.guarantee].into_iter().flatten() {
            b.refill(now);
        }
    }

    fn limited_until(&self) -> Option<Nanos> {
        [self.bytes, self.requests].into_iter().flatten().filter(|b| b.tokens < 0).map(|b| b.ready_at()).max()
    }

    fn charge(&mut self, len: u64) {
        if let Some(b) = &mut self.bytes {
            b.charge(len);
        }
        if let Some(b) = &mut self.requests {
            b.charge(1);
        }
    }

    fn limited(&self) -> bool {
        self.bytes.is_some() || self.requests.is_some()
    }

    /// Paced: the gate at the buckets' state (refilled). A limited class
    /// rests from the dispatch that puts a bucket in debt until every
    /// bucket is half full again; then it is urgent while half full, so
    /// that it takes the device before a token overflows, and its turn
    /// lasts until it rests again: bursts of half a bucket or more, the
    /// rate kept on average. A dispatch carries at most a bucket's depth.
    fn gate(&mut self) -> Gate {
        let mut g = Gate::OPEN;
        if self.limited() {
            let ready = [self.bytes, self.requests].into_iter().flatten().all(|b| b.ready());
            if self.limited_until().is_some() {
                self.resting = true;
            } else if ready {
                self.resting = false;
            }
            g.held = self.resting;
            g.urgent = !self.resting && ready;
            g.cap = self.bytes.map_or(u64::MAX, |b| u64::try_from(b.cap / SCALE).unwrap_or(u64::MAX).max(1));
        }
        if self.guarantee.is_some_and(|b| b.tokens > -b.cap / 2) && !g.held {
            (g.urgent, g.owed) = (true, true);
        }
        g
    }
}

/// The classes of one scheduler and where each application is.
pub(crate) struct Qos {
    classes: Vec<Class>,
    app_class: FxHashMap<AppId, u16>,
    /// The class each admitted, undispatched request was admitted in (an
    /// application may change class meanwhile): at most the scheduler's
    /// queued requests.
    admitted: FxHashMap<RequestId, u16>,
    expire_ns: Nanos,
    /// The policy paces the classes itself (`Policy::paces`): requests
    /// enter it as they come, are charged as they are dispatched, and the
    /// policy is told each class's `Gate`; no class queue, no dispatch
    /// before the policy for a guarantee.
    paced: bool,
    /// Requests in class queues, and their bytes.
    pub held: u64,
    pub held_bytes: u64,
}

/// Check a set of classes (without `default`, which is added).
pub fn check_classes(specs: &[ClassSpec]) -> Result<(), QosError> {
    if specs.len() + 1 > QOS_CLASSES_MAX {
        return Err(QosError(format!("{} classes: at most {} besides {QOS_DEFAULT_CLASS:?} (QOS_CLASSES_MAX)", specs.len(), QOS_CLASSES_MAX - 1)));
    }
    let mut names = std::collections::BTreeSet::new();
    for s in specs {
        if s.name.is_empty() || s.name == QOS_DEFAULT_CLASS || !names.insert(s.name.as_str()) {
            return Err(QosError(format!("class name {:?}: empty, {QOS_DEFAULT_CLASS:?} or given twice", s.name)));
        }
        if [s.rate_bytes_per_s, s.rate_requests_per_s, s.guarantee_bytes_per_s].contains(&Some(0)) {
            return Err(QosError(format!("class {:?}: a rate or guarantee of 0 (leave it out for none)", s.name)));
        }
        if s.depth_ns > QOS_DEPTH_NS_MAX {
            return Err(QosError(format!("class {:?}: bucket depth {} ns over {QOS_DEPTH_NS_MAX} (QOS_DEPTH_NS_MAX)", s.name, s.depth_ns)));
        }
    }
    Ok(())
}

impl Qos {
    pub fn new(specs: &[ClassSpec], expire_ns: Nanos, now: Nanos, paced: bool) -> Result<Qos, QosError> {
        check_classes(specs)?;
        let default = ClassSpec { name: QOS_DEFAULT_CLASS.into(), ..ClassSpec::default() };
        let classes = specs
            .iter()
            .chain(std::iter::once(&default))
            .map(|s| {
                let depth = if s.depth_ns == 0 { QOS_DEPTH_NS_DEFAULT } else { s.depth_ns };
                Class {
                    stats: ClassStats { name: s.name.clone(), rate_bytes_per_s: s.rate_bytes_per_s, guarantee_bytes_per_s: s.guarantee_bytes_per_s, ..ClassStats::default() },
                    bytes: s.rate_bytes_per_s.map(|r| Bucket::new(r, depth, now)),
                    requests: s.rate_requests_per_s.map(|r| Bucket::new(r, depth, now)),
                    guarantee: s.guarantee_bytes_per_s.map(|r| Bucket::new(r, depth, now)),
                    queue: VecDeque::new(),
                    admitted_waiting: 0,
                    slots: LazyFifo::default(),
                    resting: false,
                    gate: Gate::OPEN,
                }
            })
            .collect();
        Ok(Qos { classes, app_class: FxHashMap::default(), admitted: FxHashMap::default(), expire_ns, paced, held: 0, held_bytes: 0 })
    }

    /// The index of class `name`, if there is one.
    pub fn class_index(&self, name: &str) -> Option<u16> {
        self.classes.iter().position(|c| c.stats.name == name).map(|i| i as u16)
    }

    pub fn set_app_class(&mut self, app: AppId, class: Option<u16>) {
        match class.filter(|&c| usize::from(c) + 1 < self.classes.len()) {
            Some(c) => {
                self.app_class.insert(app, c);
            }
            None => {
                self.app_class.remove(&app);
            }
        }
    }

    /// Each application's class, by name (for a new set of classes).
    pub fn app_classes(&self) -> Vec<(AppId, String)> {
        self.app_class.iter().map(|(&a, &c)| (a, self.classes[usize::from(c)].stats.name.clone())).collect()
    }

    pub fn forget_app(&mut self, app: AppId) {
        self.app_class.remove(&app);
    }

    fn class_of(&self, app: AppId) -> usize {
        self.app_class.get(&app).map_or(self.classes.len() - 1, |&c| usize::from(c))
    }

    /// A request arriving at `now`: true when it may reach the policy now
    /// (charged), false when it waits in its class queue (kept here).
    pub fn arrive(&mut self, req: Request, now: Nanos) -> bool {
        let c = self.class_of(req.app);
        self.classes[c].refill(now);
        let class = &self.classes[c];
        if !self.paced && (!class.queue.is_empty() || class.limited_until().is_some()) {
            self.classes[c].queue.push_back((req, now));
            self.held += 1;
            self.held_bytes += req.len;
            self.classes[c].stats.held += 1;
            self.classes[c].stats.held_bytes += req.len;
            return false;
        }
        self.admit(c, &req);
        true
    }

    fn admit(&mut self, c: usize, req: &Request) {
        self.admitted.insert(req.id, c as u16);
        let k = &mut self.classes[c];
        if !self.paced {
            k.charge(req.len);
        }
        k.admitted_waiting += 1;
        k.stats.admitted_requests += 1;
        k.stats.admitted_bytes += req.len;
    }

    /// Move every request that may go at `now` out of the class queues
    /// into `out` (with its arrival time), in each class's arrival order.
    pub fn release(&mut self, now: Nanos, out: &mut Vec<(Request, Nanos)>) {
        for c in 0..self.classes.len() {
            self.classes[c].refill(now);
            while let Some(&(req, at)) = self.classes[c].queue.front() {
                let expired = now.saturating_sub(at) >= self.expire_ns;
                if !expired && self.classes[c].limited_until().is_some() {
                    break;
                }
                self.classes[c].queue.pop_front();
                self.held -= 1;
                self.held_bytes -= req.len;
                let k = &mut self.classes[c];
                k.stats.held -= 1;
                k.stats.held_bytes -= req.len;
                k.stats.expired += u64::from(expired);
                self.admit(c, &req);
                out.push((req, at));
            }
        }
    }

    /// The earliest time a waiting request may go without anything else
    /// happening: a limited class out of debt, or a wait reaching the
    /// starvation bound.
    pub fn next_due(&self) -> Option<Nanos> {
        let queued = self.classes.iter().filter_map(|k| {
            let (_, at) = k.queue.front()?;
            let expiry = at.saturating_add(self.expire_ns);
            Some(k.limited_until().map_or(expiry, |t| t.min(expiry)))
        });
        // Paced: a resting class with requests in the policy, when its
        // buckets are full again.
        let resting = self
            .classes
            .iter()
            .filter(|k| self.paced && k.resting && k.admitted_waiting > 0)
            .map(|k| [k.bytes, k.requests].into_iter().flatten().map(|b| b.ready_at_half()).max().unwrap_or(0));
        queued.chain(resting).min()
    }

    /// Paced: each class whose gate changed at `now`, and the new gate
    /// (its applications are to be told).
    pub fn gates(&mut self, now: Nanos, out: &mut Vec<(u16, Gate)>) {
        if !self.paced {
            return;
        }
        for (c, k) in self.classes.iter_mut().enumerate() {
            if !k.limited() && k.guarantee.is_none() {
                continue;
            }
            k.refill(now);
            let g = k.gate();
            if g != k.gate {
                k.gate = g;
                out.push((c as u16, g));
            }
        }
    }

    /// The applications in class `c`.
    pub fn apps_in(&self, c: u16) -> impl Iterator<Item = AppId> + '_ {
        self.app_class.iter().filter(move |&(_, &k)| k == c).map(|(&a, _)| a)
    }

    /// The gate `app`'s class last gave (open when not paced).
    pub fn gate_of(&self, app: AppId) -> Gate {
        if !self.paced {
            return Gate::OPEN;
        }
        self.classes[self.class_of(app)].gate
    }

    pub fn paced(&self) -> bool {
        self.paced
    }

    /// Whether `app`'s class holds requests, or would hold the next one
    /// (its buckets in debt at `now`).
    pub fn throttled(&mut self, app: AppId, now: Nanos) -> bool {
        let c = self.class_of(app);
        let k = &mut self.classes[c];
        if k.bytes.is_none() && k.requests.is_none() {
            return false;
        }
        if self.paced {
            return k.resting;
        }
        k.refill(now);
        !k.queue.is_empty() || k.limited_until().is_some()
    }

    /// Request `req` of `store` entered the policy at `slot`: a guaranteed
    /// class keeps it in its slot list.
    pub fn entered(&mut self, req: &Request, slot: Slot, store: &Store) {
        let Some(&c) = self.admitted.get(&req.id) else { return };
        let k = &mut self.classes[usize::from(c)];
        if k.guarantee.is_some() {
            let live = k.admitted_waiting as usize;
            k.slots.push(store.entry(slot), slot, store, live);
        }
    }

    /// The oldest request in the policy of a class owed its guarantee at
    /// `now` (the first such class), to be dispatched before the policy
    /// chooses.
    pub fn owed_slot(&mut self, store: &Store, now: Nanos) -> Option<Slot> {
        if self.paced {
            return None;
        }
        for k in &mut self.classes {
            let Some(g) = &mut k.guarantee else { continue };
            g.refill(now);
            if g.tokens <= 0 {
                continue;
            }
            if let Some(s) = k.slots.front(store) {
                k.stats.guaranteed += 1;
                return Some(s);
            }
        }
        None
    }

    /// Request `req` was dispatched. One admitted before these classes
    /// were set counts for none.
    pub fn dispatched(&mut self, req: &Request, now: Nanos) {
        let Some(c) = self.admitted.remove(&req.id) else { return };
        let (k, len) = (&mut self.classes[usize::from(c)], req.len);
        k.admitted_waiting -= 1;
        k.stats.dispatched_bytes += len;
        if self.paced {
            k.refill(now);
            k.charge(len);
        }
        if let Some(g) = &mut k.guarantee {
            g.refill(now);
            // Paced, a guarantee has no dispatch of its own: count those
            // made while it was owed.
            let owed = self.paced && k.gate.owed;
            k.stats.guaranteed += u64::from(owed);
            let before = g.tokens;
            g.charge(len);
            // Bytes of its share beside the guarantee (dispatched while it
            // was not owed) owe nothing later: they take the bucket down
            // to its depth's debt at most, so that the class is owed again
            // soon after any burst.
            if self.paced && !owed {
                g.tokens = g.tokens.max(before.min(-g.cap));
            }
        }
    }

    /// Every request waiting in a class queue, in class then arrival
    /// order (a new set of classes lets them all in).
    pub fn drain(&mut self) -> Vec<(Request, Nanos)> {
        let mut out = Vec::with_capacity(self.held as usize);
        for k in &mut self.classes {
            out.extend(k.queue.drain(..));
            k.stats.held = 0;
            k.stats.held_bytes = 0;
        }
        (self.held, self.held_bytes) = (0, 0);
        out
    }

    pub fn stats(&self) -> Vec<ClassStats> {
        self.classes.iter().map(|k| k.stats.clone()).collect()
    }
}
