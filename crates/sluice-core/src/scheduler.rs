//! The scheduler: the one object a driver (the daemon, the simulator, a
//! test) talks to.
//!
//! It owns what every policy shares and no policy may break:
//!
//! - **Bounds.** Every table is capped by [`Limits`]; going past a cap is an
//!   [`Error`] from `enqueue`, never a drop.
//! - **The ordering barrier.** Two requests whose byte ranges overlap, at
//!   least one a write, are dispatched in arrival order, and the later one
//!   only after the earlier one *completed*: a request that overlaps a
//!   pending earlier one (queued, blocked or in flight) is held in its
//!   file's blocked list, invisible to the policy, until the conflict clears.
//!   Policies therefore only ever see requests they may reorder freely.
//! - **Expiry.** A request older than `request_expire_ns` is dispatched
//!   before any policy choice: the starvation bound all policies share.
//! - **The background class.** An application registered with weight 0
//!   (a migration, a copy to a slower tier) has its requests held outside
//!   the policy's view. They are let in, in arrival order, once nothing
//!   else has been queued, blocked or in flight for `background_idle_ns`
//!   (at most `background_admitted_max`, and twice the depth, at once),
//!   and under foreground load one at a time, at most one per
//!   `background_grace_ns`: the background never starves, and never has
//!   more than that ahead of the foreground. At most
//!   `background_held_max` are held (one more is refused), so they never
//!   take the foreground's room; an application that leaves the class
//!   keeps having its requests held until its held ones are let in, so
//!   its own order holds. A
//!   background request enters the ordering barrier when it is let in, as
//!   if it arrived then: it was not acknowledged, so no one can have
//!   relied on its place.
//! - **Service classes** (`qos.rs`, [`Scheduler::set_qos`]): rate limits
//!   and guarantees decide when a request reaches the policy; a request
//!   waiting in its class queue is counted as `Stats::qos_held` and enters
//!   the ordering barrier when it is let in, as a background one does.
//! - **Counters** per stage, checked for consistency on every dispatch and
//!   completion and by [`Scheduler::check_invariants`].

use crate::config::{Limits, PolicyConfig};
use crate::cost::{CostLearner, DeviceCost, Observation};
use crate::error::{Error, ErrorKind};
use crate::hash::{FxHashMap, FxHashSet};
use crate::idmap::IdMap;
use crate::policy::{self, Pick, Policy};
use crate::qos::{ClassSpec, ClassStats, Gate, Qos, QosError};
use crate::store::{Entry, FileQ, Gather, InFlight, Store};
use crate::types::{AppId, Decision, Dispatch, DispatchId, FileId, Nanos, Request, RequestId};

/// Counters, cumulative except where marked "now".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests admitted by `enqueue`.
    pub inserted: u64,
    /// Of those, how many had to wait behind an overlapping write.
    pub blocked_total: u64,
    /// Requests handed out inside dispatches.
    pub dispatched_requests: u64,
    pub dispatches: u64,
    /// Dispatches forced by `request_expire_ns`.
    pub expired_dispatches: u64,
    pub completed_requests: u64,
    pub completed_dispatches: u64,
    /// Bytes covered by dispatches.
    pub dispatched_bytes: u64,
    /// Now: requests the policy may choose from.
    pub queued: u64,
    /// Now: requests waiting behind an overlapping request.
    pub blocked: u64,
    /// Now: dispatches in flight, and the requests inside them.
    pub inflight_dispatches: u64,
    pub inflight_requests: u64,
    /// Times the policy kept the device idle to let an aggregate grow or
    /// a synchronous reader come back (each distinct wake-up time once).
    pub holds: u64,
    /// Windows the policy opened for a synchronous reader (aioli).
    pub windows: u64,
    /// Now: background requests held outside the policy's view.
    pub background: u64,
    /// Background requests let in, in all.
    pub background_admitted: u64,
    /// Now: requests waiting in service-class queues (`set_qos`).
    pub qos_held: u64,
    /// Times `auto` changed the policy that chooses.
    pub policy_switches: u64,
}

/// The scheduling state machine. See the crate documentation.
pub struct Scheduler {
    limits: Limits,
    config: PolicyConfig,
    policy: Box<dyn Policy + Send>,
    store: Store,
    /// Dispatches in flight, in no order: at most `depth`, a few, so a
    /// scan finds one faster than a hash lookup.
    inflight: Vec<Dispatch>,
    /// Registered applications and their weights (indexed by id: one
    /// lookup a request).
    apps: IdMap<AppId, u32>,
    blocked_bytes: u64,
    /// Background requests not let in yet, arrival order, and their bytes.
    background: std::collections::VecDeque<Entry>,
    background_bytes: u64,
    /// Background requests let in and not completed: at most
    /// `background_admitted_max` at a time (plus the starvation trickle's
    /// one, which is let in only when this is empty).
    background_in: FxHashSet<RequestId>,
    /// Held requests per application: while an application has some, its
    /// new requests are held behind them whatever its class now (a weight
    /// changed from 0 must not let later requests pass earlier ones).
    background_held: FxHashMap<AppId, u32>,
    /// When a background request was last let in.
    background_last: Nanos,
    /// No background request is let in before this (set for a grace when
    /// `files_max` stopped one, so that `next` does not spin).
    background_blocked_until: Nanos,
    /// When foreground work was last pending (enqueued or completed).
    foreground_last: Nanos,
    /// The last `WaitUntil` time handed out (counts `Stats::holds`).
    wait_last: Nanos,
    /// Service classes, when the driver set some (`set_qos`).
    qos: Option<Box<Qos>>,
    /// The device's cost model, when the driver knows one.
    cost: Option<DeviceCost>,
    /// Dispatches kept in flight: at most `dispatches_inflight_max`.
    depth: u32,
    /// Reused buffers: the run being built, its entries, and member lists
    /// of completed or recycled dispatches (at most twice
    /// `dispatches_inflight_max` kept).
    scratch_run: Vec<u32>,
    scratch_entries: Vec<Entry>,
    /// Classes whose gate changed (`push_gates`): at most the classes.
    scratch_gates: Vec<(u16, Gate)>,
    members_pool: Vec<Vec<Request>>,
    seq_next: u64,
    dispatch_next: u64,
    stats: Stats,
}

impl Scheduler {
    /// A scheduler running `config` within `limits` (both clamped).
    pub fn new(config: PolicyConfig, limits: Limits) -> Scheduler {
        let limits = limits.clamped();
        let config = config.clamped();
        Scheduler {
            policy: policy::build(&config, &limits),
            depth: limits.dispatches_inflight_max,
            config,
            limits,
            store: Store::default(),
            inflight: Vec::new(),
            apps: IdMap::default(),
            blocked_bytes: 0,
            background: std::collections::VecDeque::new(),
            background_bytes: 0,
            background_in: FxHashSet::default(),
            background_held: FxHashMap::default(),
            background_last: 0,
            background_blocked_until: 0,
            foreground_last: 0,
            wait_last: 0,
            qos: None,
            cost: None,
            scratch_run: Vec::new(),
            scratch_entries: Vec::new(),
            scratch_gates: Vec::new(),
            members_pool: Vec::new(),
            seq_next: 0,
            dispatch_next: 0,
            stats: Stats::default(),
        }
    }

    pub fn policy_name(&self) -> &'static str {
        self.config.name()
    }

    /// The policy choosing now: `policy_name`, or for `auto` the
    /// candidate it chose last.
    pub fn active_policy_name(&self) -> &'static str {
        self.policy.active_name().unwrap_or(self.config.name())
    }

    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    /// Room left in the queue: requests and bytes that `enqueue` would
    /// still accept now (a driver that admits a batch at once checks it).
    pub fn room(&self) -> (u64, u64) {
        let l = &self.limits;
        let requests = u64::from(l.queued_requests_max).saturating_sub(self.stats.queued + self.stats.blocked + self.stats.background + self.stats.qos_held);
        let bytes = l.queued_bytes_max.saturating_sub(self.store.queued_bytes + self.blocked_bytes + self.background_bytes + self.qos_bytes());
        (requests, bytes)
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A completed dispatch as its driver timed it, for the driver's
    /// learner: the model reaches the policies every
    /// [`crate::cost::MODEL_EVERY`] observations, and the depth follows the
    /// learner's cap whenever it moves. The daemon and `sluice what-if`'s
    /// replays both learn through this, so a replay keeps as many in
    /// flight as the server would have.
    pub fn learn(&mut self, learner: &mut CostLearner, o: Observation) {
        learner.observe(o);
        if learner.observed().is_multiple_of(crate::cost::MODEL_EVERY) {
            self.set_device_cost(Some(learner.model()));
        }
        if self.depth != learner.depth_cap() {
            self.set_depth(learner.depth_cap());
        }
    }

    /// Tell the policy that its tables are cold when it runs (one
    /// scheduler among 10^4 in a simulated world): it then prefetches
    /// inside its own bookkeeping, which only costs where they are warm
    /// (`sluice bench scheduler`: about 4 ns a request). A hint: no
    /// decision changes.
    pub fn set_prefetch(&mut self, on: bool) {
        self.policy.set_prefetch(on);
    }

    /// Tell the policies what the device charges (see
    /// [`crate::cost`]). `None` restores the model-free behaviour.
    pub fn set_device_cost(&mut self, cost: Option<DeviceCost>) {
        self.cost = cost;
        self.policy.set_device(cost, self.depth);
    }

    pub fn device_cost(&self) -> Option<DeviceCost> {
        self.cost
    }

    /// Keep at most `depth` dispatches in flight (clamped to
    /// 1..=`dispatches_inflight_max`): the driver sets it from what the
    /// device gains from ([`crate::CostLearner::depth_cap`]).
    pub fn set_depth(&mut self, depth: u32) {
        self.depth = depth.clamp(1, self.limits.dispatches_inflight_max);
        self.policy.set_device(self.cost, self.depth);
    }

    pub fn depth(&self) -> u32 {
        self.depth
    }

    pub fn stats(&self) -> Stats {
        Stats { windows: self.policy.windows_opened(), policy_switches: self.policy.switches(), ..self.stats }
    }

    /// Requests queued or blocked now (`stats().queued + stats().blocked`,
    /// without building the whole record).
    pub fn waiting(&self) -> u64 {
        self.stats.queued + self.stats.blocked
    }

    /// Dispatches in flight now (`stats().inflight_dispatches`).
    pub fn inflight(&self) -> u64 {
        self.stats.inflight_dispatches
    }

    /// The byte quantum the policy holds for `app` now, where it keeps one
    /// (aioli's multi-level feedback, drr's deficit).
    pub fn quantum(&self, app: AppId) -> Option<u64> {
        self.policy.quantum(app)
    }

    /// Nothing queued, blocked, held in the background or in flight.
    pub fn is_empty(&self) -> bool {
        self.stats.queued == 0 && self.stats.blocked == 0 && self.stats.background == 0 && self.stats.qos_held == 0 && self.stats.inflight_dispatches == 0
    }

    /// Register `app` with a QoS weight (1 = default). Weights scale each
    /// policy's share: DRR's quantum, aIOLi's quantum growth rate. Weight
    /// 0 is the background class (see the module documentation): the
    /// requests it sends from then on are held until the device has
    /// nothing else to do; those it already sent keep their class.
    pub fn set_app_weight(&mut self, app: AppId, weight: u32) -> Result<(), Error> {
        if weight > self.limits.weight_max {
            return Err(Error::new(ErrorKind::InvalidWeight, u64::from(self.limits.weight_max)));
        }
        self.register(app)?;
        *self.apps.get_or_insert_with(app, || weight) = weight;
        self.policy.set_weight(app, weight.max(1));
        Ok(())
    }

    /// Replace the service classes with `specs` (none: no classes). Every
    /// request waiting in a class queue enters the policy now, so nothing
    /// is lost or answered twice; applications keep the class of the same
    /// name, if the new set has one, else go to `default`.
    pub fn set_qos(&mut self, specs: &[ClassSpec], now: Nanos) -> Result<(), QosError> {
        let new = if specs.is_empty() { None } else { Some(Box::new(Qos::new(specs, self.limits.request_expire_ns, now, self.policy.paces())?)) };
        let old = std::mem::replace(&mut self.qos, new);
        if let Some(mut old) = old {
            // Gates come again from the new classes (`push_gates`).
            if old.paced() {
                for (app, _) in old.app_classes() {
                    self.policy.set_gate(app, Gate::OPEN);
                }
            }
            if let Some(q) = self.qos.as_mut() {
                for (app, name) in old.app_classes() {
                    let c = q.class_index(&name);
                    q.set_app_class(app, c);
                }
            }
            for (req, _) in old.drain() {
                self.stats.qos_held -= 1;
                self.enter(req, now);
            }
        }
        Ok(())
    }

    /// Put `app` in class `name` (None or an unknown name: `default`);
    /// false when there are no classes or no class of that name.
    pub fn set_app_class(&mut self, app: AppId, name: Option<&str>) -> bool {
        let Some(q) = self.qos.as_mut() else { return false };
        let c = name.and_then(|n| q.class_index(n));
        q.set_app_class(app, c);
        let gate = q.gate_of(app);
        if q.paced() {
            self.policy.set_gate(app, gate);
        }
        c.is_some()
    }

    /// Tell the policy of every class whose gate changed at `now` (a
    /// policy that paces classes itself).
    fn push_gates(&mut self, now: Nanos) {
        let Some(q) = self.qos.as_mut().filter(|q| q.paced()) else { return };
        let mut changed = std::mem::take(&mut self.scratch_gates);
        q.gates(now, &mut changed);
        for &(c, g) in &changed {
            for app in q.apps_in(c) {
                self.policy.set_gate(app, g);
            }
        }
        changed.clear();
        self.scratch_gates = changed;
    }

    /// Put `app` on a path of share groups, outermost first (`share.rs`):
    /// with `[uid, job]` for every application, users share the device
    /// equally, and each user's jobs share the user's part; the policy's
    /// own order decides within a job. Empty: off any path (sharing is
    /// off while no application has one). At most `SHARE_LEVELS_MAX`
    /// keys (`InvalidRequest` past it). Only aioli (and auto while it runs
    /// aioli) has turns to share; the other policies ignore it.
    pub fn set_app_share(&mut self, app: AppId, keys: &[u64]) -> Result<(), Error> {
        if keys.len() > crate::share::SHARE_LEVELS_MAX {
            return Err(Error::new(ErrorKind::InvalidRequest, crate::share::SHARE_LEVELS_MAX as u64));
        }
        if !keys.is_empty() {
            self.register(app)?;
        }
        self.policy.set_share(app, keys);
        Ok(())
    }

    /// Each class's counters, `default` last; empty without classes.
    pub fn class_stats(&self) -> Vec<ClassStats> {
        self.qos.as_ref().map_or_else(Vec::new, |q| q.stats())
    }

    /// Whether `app` is in the background class.
    pub fn is_background(&self, app: AppId) -> bool {
        self.apps.get(&app) == Some(&0)
    }

    /// Whether a request of `app` arriving now is held: the application
    /// is in the background class, or still has held requests.
    /// `weight`: `app`'s, as registered (`None`: not registered).
    fn holds(&self, app: AppId, weight: Option<u32>) -> bool {
        weight == Some(0) || (!self.background_held.is_empty() && self.background_held.contains_key(&app))
    }

    /// Drop `app`'s registration (its last connection went away). Requests
    /// it still has pending are served as usual.
    pub fn forget_app(&mut self, app: AppId) {
        if let Some(q) = self.qos.as_mut() {
            q.forget_app(app);
        }
        self.apps.remove(&app);
        self.policy.forget_app(app);
    }

    fn register(&mut self, app: AppId) -> Result<(), Error> {
        if !self.apps.contains_key(&app) {
            if self.apps.len() >= self.limits.apps_max as usize {
                return Err(Error::new(ErrorKind::TooManyApps, u64::from(self.limits.apps_max)));
            }
            self.apps.get_or_insert_with(app, || 1);
        }
        Ok(())
    }

    /// `held`: the request would be held in the background (`holds`).
    fn admit_check(&self, req: &Request, held: bool) -> Result<(), Error> {
        let l = &self.limits;
        if req.len == 0 || req.offset.checked_add(req.len).is_none() {
            return Err(Error::new(ErrorKind::InvalidRequest, 0));
        }
        if req.len > l.request_bytes_max {
            return Err(Error::new(ErrorKind::RequestTooLarge, l.request_bytes_max));
        }
        if self.stats.queued + self.stats.blocked + self.stats.background + self.stats.qos_held >= u64::from(l.queued_requests_max) {
            return Err(Error::new(ErrorKind::QueueFull, u64::from(l.queued_requests_max)));
        }
        if self.store.queued_bytes + self.blocked_bytes + self.background_bytes + self.qos_bytes() + req.len > l.queued_bytes_max {
            return Err(Error::new(ErrorKind::QueueBytesFull, l.queued_bytes_max));
        }
        if held && self.stats.background >= u64::from(l.background_held_max) {
            return Err(Error::new(ErrorKind::BackgroundFull, u64::from(l.background_held_max)));
        }
        // A background request takes a file record only when it is let in,
        // and waits for one there.
        if !held && self.store.files_active >= l.files_max as usize && self.store.files.get(&req.file).is_none_or(FileQ::is_idle) {
            return Err(Error::new(ErrorKind::TooManyFiles, u64::from(l.files_max)));
        }
        Ok(())
    }

    /// Bytes of the requests waiting in class queues.
    fn qos_bytes(&self) -> u64 {
        self.qos.as_ref().map_or(0, |q| q.held_bytes)
    }

    /// Start loading the policy's own record (what `prefetch_arrival`
    /// reads first), a step before `prefetch_arrival`.
    #[inline]
    pub fn prefetch_policy(&self) {
        crate::prefetch::prefetch_val(&*self.policy);
    }

    /// A dispatch will complete soon: start loading what `complete` and
    /// the next `next` read first (the dispatches in flight, the policy's
    /// records of where it stands). A hint: it changes nothing.
    #[inline]
    pub fn prefetch_next(&self) {
        if let Some(d) = self.inflight.first() {
            crate::prefetch::prefetch_head(d);
        }
        self.policy.prefetch_next(&self.store);
    }

    /// Request `r` will arrive soon: start loading the records `enqueue`
    /// will touch, so that their cache misses overlap with the driver's
    /// work until then (`crate::prefetch`). A hint: it changes nothing.
    #[inline]
    pub fn prefetch_arrival(&self, r: &Request) {
        self.apps.prefetch(&r.app);
        self.store.prefetch_arrival(r.file);
        self.policy.prefetch_arrival(r);
    }

    /// Admit a request that arrived at `now`. On error nothing changed.
    pub fn enqueue(&mut self, req: Request, now: Nanos) -> Result<(), Error> {
        let weight = self.apps.get(&req.app).copied();
        let held = self.holds(req.app, weight);
        self.admit_check(&req, held)?;
        if weight.is_none() {
            self.register(req.app)?;
        }
        self.stats.inserted += 1;
        if held {
            self.background.push_back(Entry { req, arrival: now, seq: 0 });
            self.background_bytes += req.len;
            self.stats.background += 1;
            *self.background_held.entry(req.app).or_default() += 1;
            return Ok(());
        }
        self.foreground_last = now;
        if let Some(q) = self.qos.as_mut() {
            if !q.arrive(req, now) {
                self.stats.qos_held += 1;
                return Ok(());
            }
        }
        self.enter(req, now);
        Ok(())
    }

    /// Let in the class-queue requests whose class may go at `now`.
    fn release_classes(&mut self, now: Nanos) {
        let Some(q) = self.qos.as_mut() else { return };
        if q.held == 0 {
            return;
        }
        let mut out = Vec::new();
        q.release(now, &mut out);
        for (req, _) in out {
            self.stats.qos_held -= 1;
            self.foreground_last = now;
            self.enter(req, now);
            self.forget_if_gone(req.app);
        }
    }

    /// Put a request through the ordering barrier: blocked behind an
    /// earlier overlapping one, or admitted for the policy.
    fn enter(&mut self, req: Request, now: Nanos) {
        let e = Entry { req, arrival: now, seq: self.seq_next };
        self.seq_next += 1;
        if self.store.conflicts(req.file, req.op, req.offset, req.end(), e.seq) {
            let fq = self.store.files.get_mut(&req.file).expect("conflict implies a file record");
            fq.writes += u32::from(req.op == crate::types::Op::Write);
            fq.blocked.push_back(e);
            self.blocked_bytes += req.len;
            self.stats.blocked += 1;
            self.stats.blocked_total += 1;
        } else {
            self.admit(e, now);
        }
    }

    /// Let background requests in (see the module documentation): all
    /// the bound allows while nothing else is pending, else one when none
    /// is in and the grace has passed since the last. A request whose
    /// file would need a record past `files_max` waits.
    fn admit_background(&mut self, now: Nanos) {
        let grace = self.limits.background_grace_ns;
        if now < self.background_blocked_until {
            return;
        }
        let mut room = if self.foreground_idle_at().is_some_and(|t| now >= t) {
            self.background_max().saturating_sub(self.background_in.len())
        } else {
            usize::from(self.background_in.is_empty() && now.saturating_sub(self.background_last) >= grace)
        };
        while room > 0 {
            let Some(&e) = self.background.front() else { break };
            if self.store.files_active >= self.limits.files_max as usize && self.store.files.get(&e.req.file).is_none_or(FileQ::is_idle) {
                // No file record to spare: try again after a grace, not
                // at every call.
                self.background_blocked_until = now.saturating_add(grace);
                break;
            }
            self.background.pop_front();
            self.background_bytes -= e.req.len;
            self.stats.background -= 1;
            if let std::collections::hash_map::Entry::Occupied(mut h) = self.background_held.entry(e.req.app) {
                *h.get_mut() -= 1;
                if *h.get() == 0 {
                    h.remove();
                }
            }
            self.stats.background_admitted += 1;
            self.background_in.insert(e.req.id);
            self.background_last = now;
            self.enter(e.req, now);
            self.forget_if_gone(e.req.app);
            room -= 1;
        }
    }

    /// Background requests let in at once while the foreground is idle.
    fn background_max(&self) -> usize {
        (self.limits.background_admitted_max as usize).min(2 * self.depth as usize)
    }

    /// With no foreground work pending: when the foreground counts as
    /// idle (`background_idle_ns` after its last).
    fn foreground_idle_at(&self) -> Option<Nanos> {
        let pending = self.stats.queued + self.stats.blocked + self.stats.inflight_requests;
        (pending == self.background_in.len() as u64).then(|| self.foreground_last.saturating_add(self.limits.background_idle_ns))
    }

    /// When background requests that wait may next be let in: the
    /// foreground turning idle (if there is room), or the starvation
    /// trickle (if none is in).
    fn background_due(&self) -> Option<Nanos> {
        if self.background.is_empty() {
            return None;
        }
        let idle = self.foreground_idle_at().filter(|_| self.background_in.len() < self.background_max());
        let trickle = self.background_in.is_empty().then(|| self.background_last.saturating_add(self.limits.background_grace_ns));
        idle.into_iter().chain(trickle).min().map(|t| t.max(self.background_blocked_until))
    }

    fn admit(&mut self, e: Entry, now: Nanos) {
        let slot = self.store.insert(e);
        if let Some(q) = self.qos.as_mut() {
            q.entered(&e.req, slot, &self.store);
        }
        self.stats.queued += 1;
        self.policy.enqueued(&self.store, slot, now);
    }

    /// After a request entered late (released from behind a conflict, or
    /// let in from the background): if its application left meanwhile,
    /// the policy's record goes with its last request. (A request that
    /// enters as it arrives has its application registered.)
    fn forget_if_gone(&mut self, app: AppId) {
        if !self.apps.contains_key(&app) {
            self.policy.forget_app(app);
        }
    }

    /// What the device should do at `now`.
    pub fn next(&mut self, now: Nanos) -> Decision {
        if !self.background.is_empty() {
            self.admit_background(now);
        }
        self.release_classes(now);
        self.push_gates(now);
        // Nothing to start now: wake up for the background's trickle, or
        // for a service class out of debt.
        let mut due = match (self.background_due(), self.qos.as_ref().and_then(|q| q.next_due())) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // A policy that paces classes may pass over every request queued
        // (their classes rest): the oldest still goes at the expiry.
        // (With the device's slots full, a completion polls again.)
        if self.inflight.len() < self.depth as usize && self.qos.as_ref().is_some_and(|q| q.paced()) {
            let expiry = self.store.oldest().map(|s| self.store.entry(s).arrival.saturating_add(self.limits.request_expire_ns));
            due = match (due, expiry) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        match self.next_admitted(now) {
            Decision::Idle => match due {
                Some(t) => Decision::WaitUntil(t.max(now + 1)),
                None => Decision::Idle,
            },
            Decision::WaitUntil(t) => Decision::WaitUntil(due.map_or(t, |b| t.min(b.max(now + 1)))),
            d => d,
        }
    }

    fn next_admitted(&mut self, now: Nanos) -> Decision {
        if self.inflight.len() >= self.depth as usize || self.store.queued == 0 {
            return Decision::Idle;
        }
        let merge = self.policy.merges();
        let dispatch_max = self.limits.dispatch_bytes_max;
        let expire_ns = if self.policy.arrival_order() { 0 } else { self.limits.request_expire_ns };
        // A paced limit's burst (its bucket half full, or its reader's
        // window) goes before expired requests, which still go between
        // bursts: the class's rate is capped. A guarantee owed does not:
        // it could hold them past any bound (and, measured, the others'
        // requests then all expired and went one seek each: 4.7 MB/s
        // against 6.9 beside a 20 MB/s guarantee on the emulated disk).
        let urgent = self.qos.as_ref().is_some_and(|q| q.paced()) && self.policy.urgent();
        let expired = self.store.oldest().filter(|&s| !urgent && now.saturating_sub(self.store.entry(s).arrival) >= expire_ns);
        // A class owed its guarantee goes before the policy's choice.
        let owed = if expired.is_none() { self.qos.as_mut().and_then(|q| q.owed_slot(&self.store, now)) } else { None };
        let (slot, gather, forced) = match expired.or(owed) {
            Some(slot) => (slot, Gather { limit: dispatch_max, merge, backward: true }, true),
            None => match self.policy.pick(&self.store, now) {
                Pick::Start { slot, limit, backward } => (slot, Gather { limit: limit.min(dispatch_max), merge, backward }, false),
                Pick::Wait(t) => {
                    assert!(t > now, "{}: WaitUntil({t}) not after now ({now})", self.policy_name());
                    if self.wait_last != t {
                        self.wait_last = t;
                        self.stats.holds += 1;
                    }
                    return Decision::WaitUntil(t);
                }
                Pick::Idle => return Decision::Idle,
            },
        };
        Decision::Dispatch(self.dispatch(slot, gather, forced && owed.is_none(), forced, now))
    }

    /// Take the aggregate `gather` describes around `slot` off the queue.
    /// `forced`: expiry or a guarantee chose it, not the policy (`expired`:
    /// expiry).
    fn dispatch(&mut self, slot: u32, gather: Gather, expired: bool, forced: bool, now: Nanos) -> Dispatch {
        let (mut run, mut entries) = (std::mem::take(&mut self.scratch_run), std::mem::take(&mut self.scratch_entries));
        self.store.run(slot, gather, &mut run);
        self.store.take(&run, &mut entries);
        let first = entries[0].req;
        let offset = first.offset;
        let end = entries.iter().map(|e| e.req.end()).max().expect("a run is never empty");
        let id = DispatchId(self.dispatch_next);
        self.dispatch_next += 1;
        let mut members = self.members_pool.pop().unwrap_or_default();
        members.clear();
        members.extend(entries.iter().map(|e| e.req));
        let d = Dispatch { id, file: first.file, op: first.op, offset, len: end - offset, members };
        self.store.files.get_mut(&d.file).expect("file of a dispatch").inflight.push(InFlight { id, op: d.op, offset, end });
        let n = d.members.len() as u64;
        if let Some(q) = self.qos.as_mut() {
            d.members.iter().for_each(|m| q.dispatched(m, now));
        }
        self.stats.queued -= n;
        self.stats.dispatched_requests += n;
        self.stats.dispatches += 1;
        self.stats.dispatched_bytes += d.len;
        self.stats.expired_dispatches += u64::from(expired && !self.policy.arrival_order());
        self.stats.inflight_dispatches += 1;
        self.stats.inflight_requests += n;
        self.policy.dispatched(&self.store, &d, &entries, forced, now);
        (self.scratch_run, self.scratch_entries) = (run, entries);
        let mut kept = self.members_pool.pop().unwrap_or_default();
        kept.clone_from(&d.members);
        self.inflight.push(Dispatch { members: kept, ..d.clone_header() });
        debug_assert!(self.counters_consistent());
        d
    }

    /// The device finished dispatch `id` at `now`.
    pub fn complete(&mut self, id: DispatchId, now: Nanos) -> Result<(), Error> {
        let at = self.inflight.iter().position(|d| d.id == id).ok_or(Error::new(ErrorKind::UnknownDispatch, 0))?;
        let d = self.inflight.swap_remove(at);
        let fq = self.store.files.get_mut(&d.file).expect("file of an in-flight dispatch");
        fq.inflight.remove(id);
        if d.op == crate::types::Op::Write {
            fq.writes -= d.members.len() as u32;
        }
        let n = d.members.len() as u64;
        self.stats.inflight_dispatches -= 1;
        self.stats.inflight_requests -= n;
        self.stats.completed_dispatches += 1;
        self.stats.completed_requests += n;
        let background = if self.background_in.is_empty() { 0 } else { d.members.iter().filter(|m| self.background_in.remove(&m.id)).count() };
        if background < d.members.len() {
            self.foreground_last = now;
        }
        if let Some(q) = self.qos.as_mut() {
            let app = d.members[0].app;
            self.policy.set_throttled(app, q.throttled(app, now));
        }
        self.policy.completed(&self.store, &d, now);
        self.release_blocked(d.file, now);
        self.store.settle(d.file);
        self.recycle_members(d.members);
        debug_assert!(self.counters_consistent());
        Ok(())
    }

    /// Give back a dispatch the driver is done with (after `complete`):
    /// its member list serves a later dispatch instead of a new
    /// allocation. Optional; a dispatch simply dropped costs nothing else.
    pub fn recycle(&mut self, d: Dispatch) {
        self.recycle_members(d.members);
    }

    /// Keep a member list for reuse, at most two per dispatch in flight
    /// (the one kept here and the one handed out).
    fn recycle_members(&mut self, members: Vec<Request>) {
        if self.members_pool.len() < 2 * self.limits.dispatches_inflight_max as usize {
            self.members_pool.push(members);
        }
    }

    /// Admit, in arrival order, every blocked request of `file` whose
    /// conflicts have cleared.
    fn release_blocked(&mut self, file: FileId, now: Nanos) {
        let mut i = 0;
        loop {
            let Some(fq) = self.store.files.get(&file) else { return };
            let Some(&b) = fq.blocked.get(i) else { return };
            if self.store.conflicts(file, b.req.op, b.req.offset, b.req.end(), b.seq) {
                i += 1;
                continue;
            }
            // Admit first: with the blocked entry still listed the file
            // never looks idle in between.
            self.admit(b, now);
            self.forget_if_gone(b.req.app);
            let fq = self.store.files.get_mut(&file).expect("checked above");
            fq.blocked.remove(i);
            fq.writes -= u32::from(b.req.op == crate::types::Op::Write);
            self.blocked_bytes -= b.req.len;
            self.stats.blocked -= 1;
        }
    }

    fn counters_consistent(&self) -> bool {
        let s = &self.stats;
        s.inserted == s.queued + s.blocked + s.background + s.qos_held + s.inflight_requests + s.completed_requests
            && s.qos_held == self.qos.as_ref().map_or(0, |q| q.held)
            && s.dispatched_requests == s.inflight_requests + s.completed_requests
            && s.queued == self.store.queued as u64
            && s.inflight_dispatches == self.inflight.len() as u64
    }

    /// Check every invariant, walking all tables. Panics with a description
    /// on the first violation. Drivers call it at shutdown; tests after
    /// every step.
    pub fn check_invariants(&self) {
        assert!(self.counters_consistent(), "counters inconsistent: {:?}", self.stats);
        let (mut queued, mut bytes, mut blocked, mut blocked_bytes, mut inflight) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut active = 0;
        for (file, fq) in self.store.files.iter() {
            assert_eq!(fq.is_idle(), fq.idle_cached, "file {file:?} idle state");
            active += usize::from(!fq.is_idle());
            let writes = fq.maps[1].len() + fq.blocked.iter().filter(|b| b.req.op == crate::types::Op::Write).count();
            let inflight_writes: u64 = self.inflight.iter().filter(|d| d.file == file && d.op == crate::types::Op::Write).map(|d| d.members.len() as u64).sum();
            assert_eq!(u64::from(fq.writes), writes as u64 + inflight_writes, "file {file:?} write count");
            queued += fq.count() as u64;
            let fb: u64 = fq.maps.iter().flat_map(|m| m.values()).map(|s| self.store.entry(s).req.len).sum();
            assert_eq!(fb, fq.bytes, "file {file:?} byte count");
            bytes += fb;
            blocked += fq.blocked.len() as u64;
            blocked_bytes += fq.blocked.iter().map(|b| b.req.len).sum::<u64>();
            inflight += fq.inflight.len() as u64;
            for w in fq.blocked.iter().zip(fq.blocked.iter().skip(1)) {
                assert!(w.0.seq < w.1.seq, "blocked list of {file:?} out of arrival order");
            }
        }
        assert_eq!(queued, self.stats.queued, "queued count");
        assert_eq!(bytes, self.store.queued_bytes, "queued bytes");
        assert_eq!(blocked, self.stats.blocked, "blocked count");
        assert_eq!(blocked_bytes, self.blocked_bytes, "blocked bytes");
        assert_eq!(inflight, self.stats.inflight_dispatches, "in-flight count");
        assert_eq!(active, self.store.files_active, "active file count");
        assert!(self.store.files_active <= self.limits.files_max as usize, "files_max");
        let (idle, listed, live) = self.store.idle_counts();
        assert_eq!(idle + active, self.store.files.len(), "idle file count");
        assert!(self.store.files.dense_capacity_used() <= crate::idmap::DENSE_IDS as usize, "dense file table over its bound");
        assert_eq!(live, idle, "one live idle-list entry per idle file");
        assert!(idle <= crate::store::FILES_IDLE_CACHED_MAX && listed <= 2 * idle + 65, "idle cache bound");
        assert!(self.apps.len() <= self.limits.apps_max as usize);
        // The policy forgets an application with its registration, or
        // with the last of its queued requests.
        let tracked = self.policy.apps_tracked();
        assert!(tracked <= self.apps.len() + self.stats.queued as usize, "the policy keeps {tracked} applications, {} registered", self.apps.len());
        assert!(self.members_pool.len() <= 2 * self.limits.dispatches_inflight_max as usize, "member list pool over its bound");
        assert!(queued + blocked + self.stats.background <= u64::from(self.limits.queued_requests_max));
        assert_eq!(self.background.len() as u64, self.stats.background, "background count");
        assert_eq!(self.background.iter().map(|e| e.req.len).sum::<u64>(), self.background_bytes, "background bytes");
        assert_eq!(self.background_held.values().map(|&n| u64::from(n)).sum::<u64>(), self.stats.background, "held per application");
        assert!(self.stats.background <= u64::from(self.limits.background_held_max), "background_held_max");
        assert!(self.background_in.len() <= self.limits.background_admitted_max as usize, "background let in over its bound");
        assert!(self.background_in.len() as u64 <= queued + blocked + self.stats.inflight_requests, "background let in but not pending");
        self.policy.check(&self.store);
    }
}
