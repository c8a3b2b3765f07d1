//! The dispatcher: the one thread that owns the `Scheduler`. Requests from
//! every connection arrive here as events; it reads the monotonic clock
//! once per turn, passes `now` to the core, sends each `Dispatch` to the
//! executor, and honours `WaitUntil(t)` (sleep until `t` or the next event)
//! and `Idle` (sleep until the next event).
//!
//! Invariant: at shutdown the scheduler is empty, its invariants hold, and
//! every admitted request got exactly one answer.

use std::collections::HashMap;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Duration;

use sluice_core::{AppId, CostLearner, Decision, DeviceCost, DispatchId, ErrorKind as CoreKind, FileId, Observation, Op, RequestId, Scheduler};

use crate::exec::Job;
use crate::pending::Pending;
use crate::state::{lock, AppTable, Clock};

/// The learned model reaches the scheduler every this many dispatches
/// (the depth at every one).
const MODEL_EVERY: u64 = 32;

/// What the dispatcher reacts to.
pub enum Event {
    /// Requests admitted by a connection (a list message brings many).
    Submit(Vec<Pending>),
    /// The executor finished dispatch `.0` (its service took `.2` ns, from
    /// a worker taking it up to the system call's return) and answered its
    /// `.1` members.
    Done(DispatchId, u64, u64),
    /// An application connected with this weight.
    Weight(AppId, u32),
    /// An application's last connection closed.
    Forget(AppId),
    /// Drain: finish what was admitted, then exit.
    Stop,
}

pub struct Dispatcher {
    pub sched: Scheduler,
    pub events: Receiver<Event>,
    pub jobs: Sender<Job>,
    pub apps: Arc<std::sync::Mutex<AppTable>>,
    pub clock: Clock,
    pending: HashMap<RequestId, Pending>,
    /// The device cost model, learned from every dispatch (issue 11).
    learner: CostLearner,
    /// Dispatches in flight: each one's length, whether it continued the
    /// previous one, and the depth it left at. Bounded by the scheduler's
    /// `dispatches_inflight_max`.
    sent: HashMap<DispatchId, (u64, bool, u32)>,
    /// Where the previous dispatch ended.
    head: Option<(FileId, u64)>,
    stopping: bool,
    answered: u64,
    admitted: u64,
}

/// Errno and message for a request the scheduler refused.
fn refusal(e: sluice_core::Error) -> (i32, String) {
    let errno = match e.kind {
        CoreKind::QueueFull | CoreKind::QueueBytesFull | CoreKind::TooManyFiles => libc::EAGAIN,
        CoreKind::TooManyApps => libc::EUSERS,
        CoreKind::RequestTooLarge => libc::E2BIG,
        _ => libc::EINVAL,
    };
    (errno, e.to_string())
}

impl Dispatcher {
    /// `prior`: a calibrated device model to start from (`sluice
    /// calibrate`); the learner refines it from the dispatches it sees.
    pub fn new(mut sched: Scheduler, prior: Option<DeviceCost>, events: Receiver<Event>, jobs: Sender<Job>, apps: Arc<std::sync::Mutex<AppTable>>, clock: Clock) -> Dispatcher {
        let learner = CostLearner::new(prior);
        sched.set_device_cost(Some(learner.model()));
        sched.set_depth(learner.depth_cap());
        Dispatcher { sched, events, jobs, apps, clock, pending: HashMap::new(), learner, sent: HashMap::new(), head: None, stopping: false, answered: 0, admitted: 0 }
    }

    /// Run until `Stop` has been received and everything admitted is done.
    pub fn run(mut self) -> (sluice_core::Stats, Option<DeviceCost>) {
        loop {
            let now = self.clock.now();
            let wake = self.dispatch_ready(now);
            if self.stopping && self.sched.is_empty() {
                break;
            }
            let event = match wake {
                Some(t) => match self.events.recv_timeout(Duration::from_nanos(t.saturating_sub(self.clock.now()))) {
                    Ok(e) => Some(e),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => Some(Event::Stop),
                },
                None => Some(self.events.recv().unwrap_or(Event::Stop)),
            };
            if let Some(e) = event {
                self.handle(e);
            }
            while let Ok(e) = self.events.try_recv() {
                self.handle(e);
            }
        }
        self.sched.check_invariants();
        assert!(self.pending.is_empty(), "{} requests pending at shutdown", self.pending.len());
        assert_eq!(self.admitted, self.answered, "admitted and answered requests differ at shutdown");
        (self.sched.stats(), (self.learner.observed() > 0).then(|| self.learner.model()))
    }

    /// Hand out every dispatch the policy allows now; the time to wake up
    /// at, if the policy asked to wait.
    fn dispatch_ready(&mut self, now: u64) -> Option<u64> {
        loop {
            match self.sched.next(now) {
                Decision::Dispatch(d) => {
                    let seek = self.head != Some((d.file, d.offset));
                    self.head = Some((d.file, d.end()));
                    self.sent.insert(d.id, (d.len, seek, self.sched.stats().inflight_dispatches as u32));
                    let items = d.members.iter().map(|m| self.pending.remove(&m.id).expect("every member is pending")).collect();
                    if let Err(err) = self.jobs.send(Job { dispatch: d, items, started: 0 }) {
                        self.executor_gone(err.0, now);
                    }
                }
                Decision::WaitUntil(t) => return Some(t),
                Decision::Idle => return None,
            }
        }
    }

    /// The executor is gone (it cannot be, short of a panic): fail the job.
    fn executor_gone(&mut self, mut job: Job, now: u64) {
        for it in &mut job.items {
            it.result = Err(libc::EIO);
        }
        self.completed(job, now);
    }

    fn handle(&mut self, e: Event) {
        match e {
            Event::Submit(items) => items.into_iter().for_each(|p| self.submit(p)),
            Event::Done(id, answered, service_ns) => {
                let now = self.clock.now();
                self.learn(id, service_ns);
                self.complete(id, now);
                self.answered += answered;
            }
            Event::Weight(app, w) => {
                let _ = self.sched.set_app_weight(app, w);
            }
            Event::Forget(app) => self.sched.forget_app(app),
            Event::Stop => self.stopping = true,
        }
    }

    /// Feed dispatch `id`'s service time to the learner; pass the model on
    /// to the scheduler every `MODEL_EVERY` dispatches.
    fn learn(&mut self, id: DispatchId, service_ns: u64) {
        let Some((len, seek, depth)) = self.sent.remove(&id) else { return };
        self.learner.observe(Observation { len, seek, depth, latency_ns: service_ns });
        if self.learner.observed().is_multiple_of(MODEL_EVERY) {
            self.sched.set_device_cost(Some(self.learner.model()));
        }
        if self.sched.depth() != self.learner.depth_cap() {
            self.sched.set_depth(self.learner.depth_cap());
        }
    }

    fn submit(&mut self, p: Pending) {
        let now = self.clock.now();
        self.admitted += 1;
        match self.sched.enqueue(p.req, now) {
            Ok(()) => {
                self.pending.insert(p.req.id, p);
            }
            Err(e) => {
                self.answered += 1;
                lock(&self.apps).record(p.req.app, p.req.op == Op::Write, None, 0);
                p.answer_with(Err(refusal(e)));
            }
        }
    }

    fn complete(&mut self, id: DispatchId, now: u64) {
        if let Err(e) = self.sched.complete(id, now) {
            panic!("completion of {id:?} refused: {e}");
        }
    }

    /// Settle a job here (the executor is gone).
    fn completed(&mut self, job: Job, now: u64) {
        let id = job.dispatch.id;
        self.sent.remove(&id);
        self.answered += answer_job(&self.apps, job, now);
        self.complete(id, now);
    }
}

/// Count a finished job in the application table and answer its members;
/// how many were answered. The executor calls it as soon as the system
/// call returned, so the reply does not wait for the dispatcher.
pub fn answer_job(apps: &std::sync::Mutex<AppTable>, job: Job, now: u64) -> u64 {
    let mut table = lock(apps);
    let mut seen: Vec<AppId> = Vec::new();
    for it in &job.items {
        if !seen.contains(&it.req.app) {
            seen.push(it.req.app);
            table.record_dispatch(it.req.app);
        }
        table.record(it.req.app, it.req.op == Op::Write, it.result.ok(), now.saturating_sub(it.arrival_ns));
    }
    drop(table);
    let n = job.items.len() as u64;
    job.items.into_iter().for_each(Pending::answer);
    n
}
