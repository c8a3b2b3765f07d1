//! The dispatcher: the one owner of the `Scheduler`, driven by the event
//! loop. The loop passes `now` (read once per turn) to the core, submits
//! admitted requests, asks for every dispatch the policy allows, and
//! reports each one's completion with its service time; the dispatcher
//! learns the device cost model from those times.
//!
//! Invariant: at shutdown the scheduler is empty, its invariants hold, and
//! every admitted request got exactly one answer.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sluice_core::{AppId, CostLearner, Decision, DeviceCost, DispatchId, ErrorKind as CoreKind, FileId, Observation, Op, RequestId, Scheduler};

use crate::exec::Job;
use crate::idhash::IdMap;
use crate::pending::{Delivery, Pending};
use crate::state::AppTable;
use crate::sync::lock;
use crate::trace::{Member, Record, Tracer};
use crate::view::{DeviceCounters, View};

/// Requests answered by every dispatcher of this process since it
/// started (`requests_answered`).
static ANSWERED: AtomicU64 = AtomicU64::new(0);

/// Requests answered by every server of this process since it started,
/// refusals included: what a benchmark divides the servers' CPU time by.
pub fn requests_answered() -> u64 {
    ANSWERED.load(Ordering::Relaxed)
}

/// What the event loop hands back when it ends.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ended {
    pub scheduler: sluice_core::Stats,
    pub device_model: Option<DeviceCost>,
    /// Sum of the dispatches' service times (overlapping ones each count).
    pub device_busy_ns: u64,
    /// Dispatches that did not continue the previous one.
    pub device_seeks: u64,
}

pub struct Dispatcher {
    pub sched: Scheduler,
    apps: Arc<Mutex<AppTable>>,
    pending: IdMap<RequestId, Pending>,
    /// The device cost model, learned from every dispatch.
    learner: CostLearner,
    /// Dispatches in flight: each one's length, whether it continued the
    /// previous one, and the depth it left at. Bounded by the scheduler's
    /// `dispatches_inflight_max`.
    sent: IdMap<DispatchId, (u64, bool, u32)>,
    /// Where the previous dispatch ended.
    head: Option<(FileId, u64)>,
    answered: u64,
    admitted: u64,
    device: DeviceCounters,
    /// The live trace (`--trace`), and the applications whose track it
    /// has named (cleared past `TRACE_NAMED_MAX`, which names them again).
    tracer: Option<Tracer>,
    named: HashSet<AppId>,
    /// The applications of the dispatch `done` looks at (kept to reuse
    /// its allocation).
    seen: Vec<AppId>,
    /// The service classes' rules, and each registered application's
    /// name and identity, to place it again when they change (at most
    /// the scheduler's `apps_max`).
    qos: Option<crate::qos::QosRules>,
    placed: HashMap<AppId, (String, u32, u32)>,
}

/// Applications the trace remembers having named.
const TRACE_NAMED_MAX: usize = 4_096;

/// The applications of `seen` the trace has not named yet, now counted as
/// named in `named`, which holds at most `max` (past it, it starts over:
/// they are named again).
fn to_name(named: &mut HashSet<AppId>, seen: &[AppId], max: usize) -> Vec<AppId> {
    if named.len() + seen.len() > max {
        named.clear();
    }
    seen.iter().copied().filter(|&app| named.insert(app)).collect()
}

/// Errno and message for a request the scheduler refused.
fn refusal(e: sluice_core::Error) -> (i32, String) {
    let errno = match e.kind {
        CoreKind::QueueFull | CoreKind::QueueBytesFull | CoreKind::TooManyFiles | CoreKind::BackgroundFull => libc::EAGAIN,
        CoreKind::TooManyApps => libc::EUSERS,
        CoreKind::RequestTooLarge => libc::E2BIG,
        _ => libc::EINVAL,
    };
    (errno, e.to_string())
}

impl Dispatcher {
    /// `prior`: a device model to start from (`sluice calibrate`, or the
    /// emulated disk's figures); the learner refines it from the
    /// dispatches it sees.
    pub fn new(mut sched: Scheduler, prior: Option<DeviceCost>, apps: Arc<Mutex<AppTable>>, tracer: Option<Tracer>) -> Dispatcher {
        let learner = CostLearner::new(prior);
        sched.set_device_cost(Some(learner.model()));
        sched.set_depth(learner.depth_cap());
        Dispatcher {
            sched,
            apps,
            pending: IdMap::default(),
            learner,
            sent: IdMap::default(),
            head: None,
            answered: 0,
            admitted: 0,
            device: DeviceCounters::default(),
            tracer,
            named: HashSet::new(),
            seen: Vec::new(),
            qos: None,
            placed: HashMap::new(),
        }
    }

    /// Enqueue an admitted request; its refusal, to answer, when the
    /// scheduler will not take it.
    pub fn submit(&mut self, p: Pending, now: u64) -> Option<Delivery> {
        self.admitted += 1;
        match self.sched.enqueue(p.req, now) {
            Ok(()) => {
                self.pending.insert(p.req.id, p);
                None
            }
            Err(e) => {
                self.answered += 1;
                ANSWERED.fetch_add(1, Ordering::Relaxed);
                lock(&self.apps).record(p.req.app, p.req.op == Op::Write, None, 0, None);
                p.answer_with(Err(refusal(e)))
            }
        }
    }

    /// The policy's next dispatch now, as a job; otherwise the time to
    /// wake up at (`Err(Some(t))`) or nothing to do (`Err(None)`).
    pub fn next(&mut self, now: u64) -> Result<Job, Option<u64>> {
        match self.sched.next(now) {
            Decision::Dispatch(d) => {
                let seek = self.head != Some((d.file, d.offset));
                self.head = Some((d.file, d.end()));
                self.sent.insert(d.id, (d.len, seek, self.sched.inflight() as u32));
                let items: Vec<Pending> = d.members.iter().map(|m| self.pending.remove(&m.id).expect("every member is pending")).collect();
                let populate = d.op == Op::Read && items.iter().all(|it| it.lease_after.is_some());
                Ok(Job { dispatch: d, items, started: 0, service_ns: 0, populate })
            }
            Decision::WaitUntil(t) => Err(Some(t)),
            Decision::Idle => Err(None),
        }
    }

    /// Job `job` is done (its members carry their results): learn from its
    /// service time, tell the scheduler, count it in the application table;
    /// its replies go to `replies`.
    pub fn done(&mut self, job: Job, now: u64, replies: &mut Vec<Delivery>) {
        let id = job.dispatch.id;
        // A failed or short transfer (a read past the end of the file)
        // says nothing of what the device charges for its length.
        let whole = job.items.iter().all(|it| it.result == Ok(it.req.len));
        let seek = self.learn(id, job.service_ns, whole);
        let d = &mut self.device;
        d.dispatches += 1;
        d.busy_ns += job.service_ns;
        d.seeks += u64::from(seek);
        match job.dispatch.op {
            Op::Write => d.bytes_written += job.dispatch.len,
            Op::Read => d.bytes_read += job.dispatch.len,
        }
        if let Err(e) = self.sched.complete(id, now) {
            panic!("completion of {id:?} refused: {e}");
        }
        self.answered += job.items.len() as u64;
        ANSWERED.fetch_add(job.items.len() as u64, Ordering::Relaxed);
        if job.dispatch.op == Op::Write {
            for it in &job.items {
                // An append's range is written: a truncate no longer has
                // to keep later appends clear of it.
                if let Ok(n) = it.result {
                    it.file.written(it.req.offset, n);
                }
            }
        }
        let mut table = lock(&self.apps);
        let mut seen = std::mem::take(&mut self.seen);
        seen.clear();
        for it in &job.items {
            if !seen.contains(&it.req.app) {
                seen.push(it.req.app);
                table.record_dispatch(it.req.app);
            }
            let timing = (job.started.saturating_sub(it.arrival_ns), job.service_ns);
            table.record(it.req.app, it.req.op == Op::Write, it.result.ok(), now.saturating_sub(it.arrival_ns), Some(timing));
        }
        if let Some(t) = self.tracer.as_ref().filter(|t| t.on()) {
            for app in to_name(&mut self.named, &seen, TRACE_NAMED_MAX) {
                t.send(Record::App(app, table.name(app).unwrap_or(crate::state::FORGOTTEN_APPS).to_string()));
            }
            let members = job
                .items
                .iter()
                .map(|it| Member { app: it.req.app, client: it.req.client.0, id: it.req.id.0, offset: it.req.offset, len: it.req.len, arrival_ns: it.arrival_ns })
                .collect();
            let d = &job.dispatch;
            t.send(Record::Dispatch { id: d.id.0, op: d.op, file: d.file.0, offset: d.offset, len: d.len, started: job.started, service: job.service_ns, answered: now, members });
        }
        drop(table);
        self.seen = seen;
        replies.extend(job.items.into_iter().filter_map(Pending::answer));
        self.sched.recycle(job.dispatch);
    }

    /// The learned service time of a dispatch of `len` bytes that does not
    /// seek.
    pub(crate) fn predicted_ns(&self, len: u64) -> u64 {
        self.learner.model().service_ns(len, false)
    }

    /// Feed dispatch `id`'s service time to the learner if it moved its
    /// `whole` length; pass the model on to the scheduler every
    /// `sluice_core::cost::MODEL_EVERY` dispatches (`Scheduler::learn`). Whether it was a seek.
    fn learn(&mut self, id: DispatchId, service_ns: u64, whole: bool) -> bool {
        let Some((len, seek, depth)) = self.sent.remove(&id) else { return false };
        if !whole {
            return seek;
        }
        self.sched.learn(&mut self.learner, Observation { len, seek, depth, latency_ns: service_ns });
        seek
    }

    /// What a metrics scrape sees of the scheduler and the device now.
    pub fn view(&self) -> View {
        let ids = lock(&self.apps).ids();
        let quanta = ids.iter().filter_map(|&a| self.sched.quantum(a).map(|q| (a, q))).collect();
        let mut waiting: HashMap<AppId, u64> = HashMap::new();
        self.pending.values().for_each(|p| *waiting.entry(p.req.app).or_default() += 1);
        View {
            policy: self.sched.policy_name(),
            active_policy: self.sched.active_policy_name(),
            stats: self.sched.stats(),
            depth: self.sched.depth(),
            model: (self.learner.observed() > 0).then(|| self.learner.model()),
            device: self.device,
            quanta,
            waiting: waiting.into_iter().collect(),
            classes: self.sched.class_stats(),
        }
    }

    /// Replace the service classes and rules (none: none), placing every
    /// application known by its name and identity again.
    pub fn set_qos(&mut self, rules: Option<crate::qos::QosRules>, now: u64) {
        let specs = rules.as_ref().map_or_else(Vec::new, |r| r.specs());
        // Checked when the rules were parsed.
        if let Err(e) = self.sched.set_qos(&specs, now) {
            eprintln!("sluice: qos: {e} (rules not applied)");
            return;
        }
        self.qos = rules;
        let known: Vec<(AppId, (String, u32, u32))> = self.placed.iter().map(|(&a, p)| (a, p.clone())).collect();
        for (app, (name, uid, gid)) in known {
            self.classify(app, &name, uid, gid, None);
        }
    }

    /// The rules in force, if any.
    pub fn qos_rules(&self) -> Option<&crate::qos::QosRules> {
        self.qos.as_ref()
    }

    /// Put `app` (named `name`, connected as `uid`/`gid`) in the class the
    /// rules give it, with that class's weight, else `weight` (the one its
    /// client asked for; None: keep it).
    pub fn classify(&mut self, app: AppId, name: &str, uid: u32, gid: u32, weight: Option<u32>) {
        let class = self.qos.as_ref().and_then(|r| r.class_for(name, uid, gid)).cloned();
        if self.qos.is_some() {
            self.sched.set_app_class(app, class.as_ref().map(|c| c.spec.name.as_str()));
        }
        let keys = self.qos.as_ref().map_or_else(Vec::new, |r| r.share_keys(name, uid, gid, class.as_ref().map(|c| c.spec.name.as_str())));
        // Checked when the rules were parsed; the application is
        // registered.
        let _ = self.sched.set_app_share(app, &keys);
        // Kept without rules too: rules given later place it.
        if self.placed.get(&app).is_none_or(|p| p.0 != name || p.1 != uid || p.2 != gid) {
            self.placed.insert(app, (name.to_string(), uid, gid));
        }
        if let Some(w) = class.and_then(|c| c.weight).or(weight) {
            let _ = self.sched.set_app_weight(app, w);
        }
    }

    pub fn forget(&mut self, app: AppId) {
        self.placed.remove(&app);
        self.sched.forget_app(app);
    }

    pub fn is_empty(&self) -> bool {
        self.sched.is_empty()
    }

    /// Requests and bytes the scheduler's queue still takes now.
    pub fn room(&self) -> (u64, u64) {
        self.sched.room()
    }

    /// The most requests and bytes its queue ever takes.
    pub fn capacity(&self) -> (u64, u64) {
        let l = self.sched.limits();
        (u64::from(l.queued_requests_max), l.queued_bytes_max)
    }

    /// Check the shutdown invariants; the scheduler's counters, the
    /// learned model and the device's busy time.
    pub fn finish(self) -> Ended {
        self.sched.check_invariants();
        assert!(self.pending.is_empty(), "{} requests pending at shutdown", self.pending.len());
        assert_eq!(self.admitted, self.answered, "admitted and answered requests differ at shutdown");
        Ended {
            scheduler: self.sched.stats(),
            device_model: (self.learner.observed() > 0).then(|| self.learner.model()),
            device_busy_ns: self.device.busy_ns,
            device_seeks: self.device.seeks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_named_applications_bound_at_n_and_n_plus_one() {
        let mut named = HashSet::new();
        let ids = |r: std::ops::Range<u32>| r.map(AppId).collect::<Vec<_>>();
        assert_eq!(to_name(&mut named, &ids(0..3), 4), ids(0..3));
        assert_eq!(to_name(&mut named, &ids(1..2), 4), ids(0..0), "a named one is not named again");
        assert_eq!(to_name(&mut named, &ids(3..4), 4), ids(3..4));
        assert_eq!(named.len(), 4, "N");
        // N+1: the set starts over; every application seen is named again.
        assert_eq!(to_name(&mut named, &ids(0..1), 4), ids(0..1));
        assert_eq!(named.len(), 1);
    }
}
