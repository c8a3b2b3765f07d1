//! Service classes: rate limits and guaranteed minimums an operator sets,
//! in the pure core so that the daemon and the simulator apply the same
//! ones (`Scheduler::set_qos`).
//!
//! A class has any of a rate limit in bytes/s and in requests/s (token
//! buckets whose depth is `depth_ns` worth of the rate) and a guaranteed
//! minimum in bytes/s. Each application is in one class (`set_app_class`;
//! the last class, `default`, holds the others). Classes decide only
//! *when* a request may reach the policy; the policy (aIOLi) still decides
//! what to dispatch, in offset order and aggregated, among what reached it.
//!
//! - **Rate limit.** A request of a limited class enters the policy when
//!   the class's buckets are not in debt; it is charged its bytes (and one
//!   request) as it enters, so a request larger than the depth passes and
//!   leaves the bucket in debt. Others wait in their class's queue, in
//!   arrival order.
//! - **Guarantee.** A class is *owed* while its guarantee bucket, filled
//!   at the guaranteed rate and drained by the bytes it has dispatched, is
//!   positive. While a class is owed, its oldest request that reached the
//!   policy is dispatched before the policy chooses (with the requests
//!   contiguous to it, as an expired one is); otherwise the policy
//!   chooses as usual, so a class gets its guarantee plus its share.
//! - **Starvation bound.** A request that has waited in a class queue for
//!   `request_expire_ns` enters whatever its class's state, as the
//!   scheduler's expiry bounds every request's wait.
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
    pub fn new(specs: &[ClassSpec], expire_ns: Nanos, now: Nanos) -> Result<Qos, QosError> {
        check_classes(specs)?;
        let default = ClassSpec { name: QOS_DEFAULT_CLASS.into(), ..ClassSpec::default() };
        let classes = specs
            .iter()
            .chain(std::iter::once(&default))
            .map(|s| {
                let depth = if s.depth_ns == 0 { QOS_DEPTH_NS_DEFAULT } else { s.depth_ns };
                Class {
                    stats: ClassStats { name: s.name.clone(), ..ClassStats::default() },
                    bytes: s.rate_bytes_per_s.map(|r| Bucket::new(r, depth, now)),
                    requests: s.rate_requests_per_s.map(|r| Bucket::new(r, depth, now)),
                    guarantee: s.guarantee_bytes_per_s.map(|r| Bucket::new(r, depth, now)),
                    queue: VecDeque::new(),
                    admitted_waiting: 0,
                    slots: LazyFifo::default(),
                }
            })
            .collect();
        Ok(Qos { classes, app_class: FxHashMap::default(), admitted: FxHashMap::default(), expire_ns, held: 0, held_bytes: 0 })
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
        if !class.queue.is_empty() || class.limited_until().is_some() {
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
        if let Some(b) = &mut k.bytes {
            b.charge(req.len);
        }
        if let Some(b) = &mut k.requests {
            b.charge(1);
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
        self.classes
            .iter()
            .filter_map(|k| {
                let (_, at) = k.queue.front()?;
                let expiry = at.saturating_add(self.expire_ns);
                Some(k.limited_until().map_or(expiry, |t| t.min(expiry)))
            })
            .min()
    }

    /// Whether `app`'s class holds requests, or would hold the next one
    /// (its buckets in debt at `now`).
    pub fn throttled(&mut self, app: AppId, now: Nanos) -> bool {
        let c = self.class_of(app);
        let k = &mut self.classes[c];
        if k.bytes.is_none() && k.requests.is_none() {
            return false;
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
        if let Some(g) = &mut k.guarantee {
            g.refill(now);
            g.charge(len);
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
