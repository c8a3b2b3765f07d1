//! A minimal deterministic driver: replays request streams through a
//! [`Scheduler`] on virtual time, with a caller-supplied service time per
//! dispatch. Tests and examples use it to drive policies exactly as the
//! daemon and the simulator do (poll when a device slot is free, honour
//! `WaitUntil`, complete in time order), without either of them.
//!
//! A [`Stream`] is one issuer: with `depth` 1 it is synchronous (its next
//! request leaves `think_ns` after the previous one completed), like the
//! seed's POSIX clients; with a larger depth it keeps that many in flight.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::cost::Observation;
use crate::scheduler::Scheduler;
use crate::types::{Decision, Dispatch, DispatchId, FileId, Nanos, Request, RequestId};

/// One issuer of requests.
#[derive(Clone, Debug)]
pub struct Stream {
    pub start_ns: Nanos,
    pub think_ns: Nanos,
    /// Up to this much is added to each think time, chosen by a hash of the
    /// request id: deterministic network jitter.
    pub jitter_ns: Nanos,
    /// Requests in flight at once (at least 1).
    pub depth: usize,
    pub requests: Vec<Request>,
    /// Extra think time before request `k` (by index; missing: none): a
    /// recorded stream's own gaps (`sluice what-if`).
    pub thinks: Vec<Nanos>,
}

/// One dispatch as the replay saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub at_ns: Nanos,
    pub done_ns: Nanos,
    pub dispatch: Dispatch,
}

/// Everything a replay observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Log {
    pub served: Vec<Served>,
    /// Arrival time of every request, by id.
    pub arrivals: Vec<(RequestId, Nanos)>,
    pub end_ns: Nanos,
}

/// Why a replay stopped early.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplayError {
    /// `enqueue` refused a request.
    Refused(RequestId, crate::Error),
    /// More than `events_max` events: a policy that never finishes.
    TooManyEvents(u64),
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Complete(DispatchId),
    Issue(usize),
    Wake,
}

/// How a replay runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Events at most (a policy that never finishes is an error).
    pub events_max: u64,
    /// Run the scheduler's invariant walk after every event (tests).
    pub check_invariants: bool,
    /// The host the issuers share (`None`: an answer lets its issuer go
    /// at once, whatever else was answered at that instant).
    pub host: Option<Host>,
}

impl ReplayOptions {
    /// `events_max` events, with the invariant walk after each (tests).
    pub fn checked(events_max: u64) -> ReplayOptions {
        ReplayOptions { events_max, check_invariants: true, host: None }
    }

    /// `events_max` events, no invariant walk, no host.
    pub fn plain(events_max: u64) -> ReplayOptions {
        ReplayOptions { events_max, check_invariants: false, host: None }
    }
}

/// Most cores a [`Host`] may have (its table of when each core is free).
pub const HOST_CORES_MAX: u32 = 1_024;

/// The CPUs that the processes of a replay and their server share. The
/// server's one loop answers a completed dispatch's requests together:
/// `server_ns` each (the reply and the wake-up of the process asleep on
/// it), one after another, and the processes' next requests are seen when
/// it has done them all (its next turn). Each process then costs
/// `client_ns` of one of the `cores` (its return from the call and its next
/// request), core 0 being the loop's while it works. So 32 processes
/// answered by one aggregate go on 32 answers of the loop later, which is
/// what a live trace shows (docs/observability.md, *What-if*). On a real
/// disk each dispatch also costs the loop `dispatch_ns` (the kernel's path
/// of one read or write: its submission, its completion): a dispatch
/// leaves when the loop is free, and holds it that long; and the loop
/// decides only when it is free, among what arrived while it worked,
/// before it answers what completed (a live trace of 4 KiB O_DIRECT
/// readers under aioli shows the loop dispatching, then answering a
/// dispatch's 27 members in 137 µs, then taking the 22 requests that
/// came meanwhile at one instant).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Host {
    /// At least 1, at most `HOST_CORES_MAX`.
    pub cores: u32,
    pub server_ns: Nanos,
    pub client_ns: Nanos,
    pub dispatch_ns: Nanos,
}

/// When the loop and each core of a [`Host`] are next free.
#[derive(Clone, Debug)]
pub struct HostQueue {
    h: Host,
    server_free: Nanos,
    free: Vec<Nanos>,
}

impl HostQueue {
    pub fn new(h: Host) -> HostQueue {
        HostQueue { h, server_free: 0, free: vec![0; h.cores.clamp(1, HOST_CORES_MAX) as usize] }
    }

    /// When the loop has sent the `k` answers of a dispatch completed at
    /// `now` (behind the answers before them).
    pub fn answered(&mut self, now: Nanos, k: usize) -> Nanos {
        let sent = now.max(self.server_free) + self.h.server_ns.saturating_mul(k as u64);
        self.server_free = sent;
        self.free[0] = self.free[0].max(sent);
        sent
    }

    /// When the loop is done with what it has.
    pub fn free_at(&self) -> Nanos {
        self.server_free
    }

    /// When a dispatch the policy handed out at `now` leaves: once the loop
    /// is done with what it had, which it then does for `dispatch_ns`.
    pub fn dispatched(&mut self, now: Nanos) -> Nanos {
        if self.h.dispatch_ns == 0 {
            return now;
        }
        let leave = now.max(self.server_free);
        self.server_free = leave + self.h.dispatch_ns;
        self.free[0] = self.free[0].max(self.server_free);
        leave
    }

    /// When a process answered at `sent` goes on: on the core free first
    /// (the lowest on a tie), after `client_ns` there.
    pub fn go(&mut self, sent: Nanos) -> Nanos {
        let (i, &free) = self.free.iter().enumerate().min_by_key(|&(i, &f)| (f, i)).expect("a host has a core");
        let done = sent.max(free) + self.h.client_ns;
        self.free[i] = done;
        done
    }
}

/// The stream that request `id` belongs to, and when its next request
/// issues: its process goes on (on the host's core first free, if any)
/// after its answer was sent at `sent`, then thinks.
fn next_issue(
    streams: &[Stream],
    owner: &std::collections::HashMap<RequestId, usize>,
    next_req: &[usize],
    scheduled: &[usize],
    host: Option<&mut HostQueue>,
    id: RequestId,
    sent: Nanos,
) -> (usize, Nanos) {
    let i = owner[&id];
    let jitter = match streams[i].jitter_ns {
        0 => 0,
        j => id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) % j,
    };
    let extra = streams[i].thinks.get(next_req[i] + scheduled[i]).copied().unwrap_or(0);
    let free = host.map_or(sent, |h| h.go(sent));
    (i, free + streams[i].think_ns + jitter + extra)
}

/// Run `streams` to completion. `service` gives each dispatch's duration.
pub fn replay(s: &mut Scheduler, streams: &[Stream], mut service: impl FnMut(&Dispatch) -> Nanos, opts: ReplayOptions) -> Result<Log, ReplayError> {
    replay_observed(s, streams, |_, d| service(d), opts, |_, _| {})
}

/// `replay`, with `service` told the time each dispatch leaves (so that a
/// device may queue them: it returns the time to completion), and
/// `observe` told of each completed dispatch (before the scheduler is)
/// as a driver sees it, free to change the scheduler's model and depth: a
/// learner in the loop, as the daemon runs one.
pub fn replay_observed(
    s: &mut Scheduler,
    streams: &[Stream],
    mut service: impl FnMut(Nanos, &Dispatch) -> Nanos,
    opts: ReplayOptions,
    mut observe: impl FnMut(&mut Scheduler, Observation),
) -> Result<Log, ReplayError> {
    let ReplayOptions { events_max, check_invariants: check, host } = opts;
    let mut host = host.map(HostQueue::new);
    let mut heap: BinaryHeap<Reverse<(Nanos, u64, Event)>> = BinaryHeap::new();
    let mut tie = 0u64;
    let mut push = |heap: &mut BinaryHeap<_>, t: Nanos, e: Event| {
        tie += 1;
        heap.push(Reverse((t, tie, e)));
    };
    let mut next_req = vec![0usize; streams.len()];
    // Issues scheduled and not yet fired, per stream: the request the next
    // one scheduled will issue is `next_req + scheduled`.
    let mut scheduled = vec![0usize; streams.len()];
    let mut owner = std::collections::HashMap::new();
    for (i, st) in streams.iter().enumerate() {
        for (k, r) in st.requests.iter().enumerate() {
            owner.insert(r.id, i);
            if k < st.depth.max(1) {
                push(&mut heap, st.start_ns + st.thinks.get(k).copied().unwrap_or(0), Event::Issue(i));
                scheduled[i] += 1;
            }
        }
    }
    let mut log = Log::default();
    let mut running: Vec<(DispatchId, Nanos, Dispatch, bool, u32)> = Vec::new();
    let mut head: Option<(FileId, u64)> = None;
    let mut events = 0u64;
    // Completed dispatches (in `log.served`) whose members this instant
    // answers.
    let mut answering: Vec<usize> = Vec::new();
    let defer = host.as_ref().is_some_and(|h| h.h.dispatch_ns > 0);
    // The wake-up pushed for when the loop is next free, if any.
    let mut woken: Option<Nanos> = None;
    while let Some(Reverse((now, _, ev))) = heap.pop() {
        events += 1;
        if events > events_max {
            return Err(ReplayError::TooManyEvents(events_max));
        }
        match ev {
            Event::Issue(i) => {
                scheduled[i] -= 1;
                if let Some(&r) = streams[i].requests.get(next_req[i]) {
                    next_req[i] += 1;
                    s.enqueue(r, now).map_err(|e| ReplayError::Refused(r.id, e))?;
                    log.arrivals.push((r.id, now));
                }
            }
            Event::Complete(id) => {
                let at = running.iter().position(|(d, ..)| *d == id).expect("completion of a running dispatch");
                let (_, start, d, seek, depth) = running.swap_remove(at);
                observe(s, Observation { len: d.len, seek, depth, latency_ns: now - start });
                s.complete(id, now).expect("dispatch in flight");
                let members = d.members.len();
                log.served.push(Served { at_ns: start, done_ns: now, dispatch: d });
                // Where dispatches cost the loop, answered after this
                // instant's dispatches have left, as the server's loop
                // submits before it replies; else at once.
                if defer {
                    answering.push(log.served.len() - 1);
                } else {
                    let sent = host.as_mut().map_or(now, |h| h.answered(now, members));
                    for m in &log.served[log.served.len() - 1].dispatch.members {
                        let (i, at) = next_issue(streams, &owner, &next_req, &scheduled, host.as_mut(), m.id, sent);
                        push(&mut heap, at, Event::Issue(i));
                        scheduled[i] += 1;
                    }
                }
            }
            Event::Wake => {}
        }
        if heap.peek().is_some_and(|Reverse((t, _, _))| *t == now) {
            continue;
        }
        // Where dispatches cost the loop, it decides only once it is done
        // with what it had: what arrived meanwhile is there to choose from,
        // and the answers wait for its next dispatches.
        if let Some(free) = host.as_ref().filter(|_| defer).map(HostQueue::free_at).filter(|&f| f > now) {
            if woken != Some(free) {
                push(&mut heap, free, Event::Wake);
                woken = Some(free);
            }
            continue;
        }
        loop {
            match s.next(now) {
                Decision::Dispatch(d) => {
                    let leave = host.as_mut().map_or(now, |h| h.dispatched(now));
                    let done = leave + service(leave, &d).max(1);
                    push(&mut heap, done, Event::Complete(d.id));
                    let seek = head != Some((d.file, d.offset));
                    head = Some((d.file, d.end()));
                    running.push((d.id, leave, d, seek, s.inflight() as u32));
                }
                Decision::WaitUntil(t) => {
                    push(&mut heap, t, Event::Wake);
                    break;
                }
                Decision::Idle => break,
            }
        }
        for k in answering.drain(..) {
            let sent = host.as_mut().map_or(now, |h| h.answered(now, log.served[k].dispatch.members.len()));
            for m in &log.served[k].dispatch.members {
                let (i, at) = next_issue(streams, &owner, &next_req, &scheduled, host.as_mut(), m.id, sent);
                push(&mut heap, at, Event::Issue(i));
                scheduled[i] += 1;
            }
        }
        if check {
            s.check_invariants();
        }
        log.end_ns = now;
    }
    log.served.sort_by_key(|sv| (sv.at_ns, sv.dispatch.id));
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Limits, PolicyConfig};
    use crate::types::{AppId, ClientId, FileId, Op};

    #[test]
    fn a_stream_waits_its_own_think_time_before_each_request() {
        let req = |id: u64, offset: u64| Request { id: RequestId(id), app: AppId(1), client: ClientId(1), file: FileId(1), op: Op::Read, offset, len: 10 };
        let st = Stream { start_ns: 100, think_ns: 0, jitter_ns: 0, depth: 1, requests: vec![req(1, 0), req(2, 10), req(3, 20)], thinks: vec![50, 5_000] };
        let mut s = Scheduler::new(PolicyConfig::from_name("fifo").unwrap(), Limits::default());
        let log = replay(&mut s, &[st], |_| 1_000, ReplayOptions::checked(1_000)).unwrap();
        // Request 1 at 100 + 50, done 1,000 later; request 2 5,000 after
        // that; request 3 has no extra think.
        assert_eq!(log.arrivals, [(RequestId(1), 150), (RequestId(2), 6_150), (RequestId(3), 7_150)]);
    }

    #[test]
    fn answers_given_together_queue_for_the_host_cores() {
        // Four synchronous streams of one file, answered by one aggregate
        // (fifo-merge joins their pieces): on two cores at 10 ns an answer,
        // two go on 10 ns after it and two 20 ns after it.
        let req = |id: u64, client: u32, offset: u64| Request { id: RequestId(id), app: AppId(1), client: ClientId(client), file: FileId(1), op: Op::Read, offset, len: 10 };
        let streams: Vec<Stream> = (0..4u32)
            .map(|c| Stream {
                start_ns: 0,
                think_ns: 0,
                jitter_ns: 0,
                depth: 1,
                requests: vec![req(u64::from(c), c, u64::from(c) * 10), req(10 + u64::from(c), c, 100 + u64::from(c) * 10)],
                thinks: vec![],
            })
            .collect();
        let run = |host: Option<Host>| {
            let mut s = Scheduler::new(PolicyConfig::from_name("fifo-merge").unwrap(), Limits::default());
            let log = replay(&mut s, &streams, |_| 1_000, ReplayOptions { host, ..ReplayOptions::checked(10_000) }).unwrap();
            let mut second: Vec<Nanos> = log.arrivals.iter().filter(|(id, _)| id.0 >= 10).map(|&(_, t)| t).collect();
            second.sort_unstable();
            (log.served[0].dispatch.members.len(), second)
        };
        assert_eq!(run(None), (4, vec![1_000; 4]), "without a host every process goes on at once");
        // The loop sends the four answers in 40 ns (its core busy
        // meanwhile); each process then needs 10 ns of a core, two at a
        // time.
        assert_eq!(run(Some(Host { cores: 2, server_ns: 10, client_ns: 10, dispatch_ns: 0 })), (4, vec![1_050, 1_050, 1_060, 1_060]));
    }

    #[test]
    fn dispatches_leave_one_after_another_when_the_loop_pays_for_each() {
        let mut q = HostQueue::new(Host { cores: 2, server_ns: 5, client_ns: 1, dispatch_ns: 20 });
        assert_eq!((q.dispatched(0), q.dispatched(0), q.dispatched(100)), (0, 20, 100));
        // The loop answers after the dispatches it took on, and the next
        // dispatch waits for the answers.
        assert_eq!(q.answered(110, 2), 130);
        assert_eq!(q.dispatched(125), 130);
        // Without a cost a dispatch leaves at once, whatever the loop does.
        let mut free = HostQueue::new(Host { cores: 1, server_ns: 50, client_ns: 1, dispatch_ns: 0 });
        assert_eq!(free.answered(0, 4), 200);
        assert_eq!(free.dispatched(10), 10);
    }

    #[test]
    fn a_loop_that_pays_for_dispatches_decides_once_it_is_free() {
        // Four processes read neighbouring pieces of one file; the first
        // arrives alone, the others while the loop is busy with its
        // dispatch (20 ns): the loop then takes the three together, as
        // `sluice serve` sees them all on its next turn.
        let req = |c: u32| Request { id: RequestId(u64::from(c)), app: AppId(1), client: ClientId(c), file: FileId(1), op: Op::Read, offset: u64::from(c) * 10, len: 10 };
        let streams: Vec<Stream> = (0..4u32)
            .map(|c| Stream { start_ns: if c == 0 { 0 } else { 4 + u64::from(c) }, think_ns: 0, jitter_ns: 0, depth: 1, requests: vec![req(c)], thinks: vec![] })
            .collect();
        let run = |dispatch_ns: Nanos| {
            let mut s = Scheduler::new(PolicyConfig::from_name("fifo-merge").unwrap(), Limits::default());
            let host = Host { cores: 2, server_ns: 1, client_ns: 1, dispatch_ns };
            let log = replay(&mut s, &streams, |_| 1_000, ReplayOptions { host: Some(host), ..ReplayOptions::checked(10_000) }).unwrap();
            log.served.iter().map(|sv| (sv.at_ns, sv.dispatch.members.len())).collect::<Vec<_>>()
        };
        assert_eq!(run(20), [(0, 1), (20, 3)]);
        // A loop that dispatches for free decides at each arrival.
        assert_eq!(run(0), [(0, 1), (5, 1), (6, 1), (7, 1)]);
    }

    #[test]
    fn a_host_has_at_most_its_bound_of_cores() {
        let cores = |n: u32| HostQueue::new(Host { cores: n, server_ns: 0, client_ns: 1, dispatch_ns: 0 }).free.len();
        assert_eq!((cores(HOST_CORES_MAX), cores(HOST_CORES_MAX + 1), cores(0)), (HOST_CORES_MAX as usize, HOST_CORES_MAX as usize, 1));
        // N answered processes on N cores all go at once; the N+1st waits.
        let mut q = HostQueue::new(Host { cores: 3, server_ns: 0, client_ns: 5, dispatch_ns: 0 });
        let sent = q.answered(100, 4);
        assert_eq!((0..4).map(|_| q.go(sent)).collect::<Vec<_>>(), [105, 105, 105, 110]);
    }
}
