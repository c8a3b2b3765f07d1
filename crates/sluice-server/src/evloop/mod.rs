//! The event loop: one thread that owns every connection and the
//! scheduler, in stages, one file each; this file holds the loop's state
//! and walks the stages once per turn (`run`).
//!
//! A turn: sleep in `epoll_wait` (or spin, `doorbells.rs`), read the
//! clock once, then
//! 1. **input** (`input.rs`): accept, read every ready connection until it
//!    would block (many frames per system call, from one scratch buffer),
//!    frame them within the partial-frame budget (`budget.rs`);
//! 2. each frame goes to the **handshake** (`handshake.rs`) or, once that
//!    is done, to **admission** (`admission.rs` decides, purely;
//!    `request.rs` carries it out; leases and regions: `leases.rs`;
//!    collectives: `gather.rs`), as do requests rung on the watched
//!    **doorbells** (`doorbells.rs`);
//! 3. **completion** (`completion.rs`): the executors', the ring's and the
//!    metadata pool's finished work comes back; one scheduler pass
//!    dispatches what the policy allows (on the loop when the page cache
//!    or the null device serves it without blocking, else on the ring or
//!    a worker); every completion enters one queue, and one function
//!    answers it;
//! 4. replies are written in batches (`conns.rs`);
//! 5. **deadlines** (`deadlines.rs`), and the metrics **view**
//!    (`view.rs`).
//!
//! The clock is read once per turn, after the sleep (`EventLoop::now`),
//! and passed down. Two places read it again, on purpose: the scheduler
//! pass (`completion.rs`), before the first dispatch it times itself (on
//! the loop or the ring: its service time must not count the turn's
//! input) and after each one carried out on the loop (its service time
//! feeds the learner, and the turn's `now` moves on by it; the null
//! device is not timed); and the spin before a sleep, which waits on the
//! clock.
//!
//! Bounds in time (`ServerLimits`): `handshake_timeout_ms`,
//! `idle_timeout_s`, `frame_stall_ms` plus one millisecond per
//! `FRAME_RATE_MIN_BYTES_PER_MS`, `write_timeout_s` (`deadlines.rs`).
//! Bounds in memory: the partial-frame budget (`budget.rs`), bodies read in
//! chunks of at most `BODY_CHUNK_BYTES`, reply bytes per connection
//! (`conn.rs`).
//!
//! Invariant: bytes held in partial frames never exceed
//! `partial_bytes_max`; every admitted message is answered once.

mod admission;
mod budget;
mod completion;
mod conns;
mod deadlines;
mod doorbells;
mod fair;
mod gather;
mod handshake;
mod input;
mod leases;
mod poll;
mod queue;
mod request;
#[cfg(test)]
mod sim;
mod view;
mod watched;

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use sluice_net::Listener;

use crate::clock::Now;
use crate::collective::{CollectiveLimits, Collectives};
use crate::conn::{Conn, SCRATCH_BYTES};
use crate::dispatch::{Dispatcher, Ended};
use crate::exec::Job;
use crate::idhash::IdMap;
use crate::meta::{MetaDone, MetaJob};
use crate::pending::Pending;
use crate::ring::{Reaped, Ring};
use crate::shared::Shared;
use crate::shm::Shm;
use crate::waker::Waker;

use budget::Budget;
use poll::{Poll, TOKEN_LISTENER, TOKEN_WAKER};
use queue::Completion;
use watched::Doorbells;

/// Bytes a body takes from the budget, and is read, at a time (1 MiB): a
/// 64 MiB write holds no more than it has received plus one chunk.
pub const BODY_CHUNK_BYTES: usize = 1 << 20;

/// What processing a frame left the connection in.
enum Flow {
    /// Read on.
    Next,
    /// Paused (`conn.pause` says why); the frame was taken in.
    Paused,
    /// An error was answered: read no more.
    Close,
}

/// The loop's ends of the executor and the metadata pool.
pub(crate) struct Workers {
    pub jobs: Sender<Job>,
    pub done: Receiver<Job>,
    pub meta: Sender<MetaJob>,
    pub meta_done: Receiver<MetaDone>,
}

/// How the loop carries out a dispatch itself, without blocking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Inline {
    /// Never: every dispatch goes to the ring or a worker.
    No,
    /// When the page cache has it (`RWF_NOWAIT`).
    PageCache,
    /// Always, touching no file: the null device (`DeviceKind::Null`).
    Null,
}

pub(crate) struct EventLoop {
    shared: Arc<Shared>,
    poll: Poll,
    listener: Option<Listener>,
    accept_rest_until: Option<Instant>,
    waker: Arc<Waker>,
    conns: IdMap<u64, Conn>,
    /// Connections whose handshake is done (`Phase::Ready`): at most
    /// `clients_max`. The others, at most as many again, wait for theirs.
    ready_conns: usize,
    /// Each user's connections and bytes (`fair.rs`).
    uids: fair::Uids,
    /// Connections paused for room in their user's share or the server's
    /// budget (`Pause::Room`), looked at when bytes drain: at most one
    /// entry per connection.
    starved: Vec<u64>,
    conn_next: u64,
    disp: Dispatcher,
    workers: Option<Workers>,
    /// Jobs at the executor or on the ring, and calls at the metadata pool.
    exec_out: usize,
    meta_out: usize,
    budget: Budget,
    scratch: Vec<u8>,
    /// Connections with replies to write, or to look at after a change.
    dirty: Vec<u64>,
    /// The one completion queue: dispatches done and messages answered,
    /// delivered by `complete` whenever no connection is out of the table.
    completed: VecDeque<Completion>,
    /// A dispatch's replies, on their way from the dispatcher to `deliver`
    /// (kept to reuse its allocation).
    replies: Vec<crate::pending::Delivery>,
    /// Post records answered this turn whose clients sleep on them: woken
    /// at the end of the turn, with the socket replies (`flush_dirty`).
    wakes: Vec<(Arc<Shm>, u32)>,
    doorbells: Doorbells,
    request_next: u64,
    inline: Inline,
    /// Ranges found in the page cache lately (`lease::Verified`).
    verified: crate::lease::Verified,
    /// Dispatches that would block, handed to the kernel from this thread
    /// (`ring.rs`); `None`: workers carry them out.
    ring: Option<Ring>,
    ring_reaped: Vec<Reaped>,
    /// The earliest deadline of any connection or collective.
    next_sweep: Option<Instant>,
    stopping: bool,
    /// Server-directed collectives still gathering their participants.
    collectives: Collectives<Pending>,
    /// Complete collectives waiting, in order, for room in the scheduler's
    /// queue (each enters whole). They count against `collectives_max` and
    /// `collective_bytes_max` with the gathering ones (`Collectives::check`).
    ready: VecDeque<Vec<Pending>>,
    /// Bytes of write data in `ready`.
    ready_write_bytes: u64,
    /// The clock, read once per turn (see the module doc).
    now: Now,
    /// A fault planted in `deliver` by the test that must catch it.
    #[cfg(test)]
    mutation: (queue::Mutation, u64),
}

impl EventLoop {
    pub fn new(shared: Arc<Shared>, listener: Listener, waker: Arc<Waker>, disp: Dispatcher, workers: Workers) -> io::Result<EventLoop> {
        let poll = Poll::new()?;
        let c = &shared.config;
        let l = &c.limits;
        let collective_limits = CollectiveLimits { groups_max: l.collectives_max as usize, bytes_max: l.collective_bytes_max, wait_ms_max: l.collective_wait_ms_max };
        listener.set_nonblocking()?;
        poll.add(listener.fd(), libc::EPOLLIN as u32, TOKEN_LISTENER)?;
        poll.add(waker.fd(), libc::EPOLLIN as u32, TOKEN_WAKER)?;
        let real = c.device == crate::config::DeviceKind::Real && c.storage.is_none();
        let inline = match c.device {
            crate::config::DeviceKind::Null => Inline::Null,
            _ if real && !c.direct => Inline::PageCache,
            _ => Inline::No,
        };
        // The ring serves the real device's calls; an emulated disk (which
        // holds a worker for the modelled time) or a test's storage keep
        // the workers. Where the kernel refuses io_uring, workers serve.
        // With O_DIRECT, whole-block writes hold shares of the workers'
        // order of writes (`order::DirectOrder`).
        let order = c.direct.then(|| Arc::clone(&shared.direct_writes));
        let ring = (c.uring && real).then(|| Ring::new(c.queue_depth, waker.fd(), order, c.sqpoll_idle_ms).ok()).flatten();
        Ok(EventLoop {
            poll,
            listener: Some(listener),
            accept_rest_until: None,
            waker,
            conns: IdMap::default(),
            ready_conns: 0,
            uids: fair::Uids::default(),
            starved: Vec::new(),
            conn_next: poll::FIRST_CONN,
            disp,
            workers: Some(workers),
            exec_out: 0,
            meta_out: 0,
            budget: Budget::new(l.partial_bytes_max),
            scratch: vec![0u8; SCRATCH_BYTES],
            dirty: Vec::new(),
            completed: VecDeque::new(),
            replies: Vec::new(),
            wakes: Vec::new(),
            doorbells: Doorbells::default(),
            request_next: 0,
            inline,
            verified: crate::lease::Verified::new(crate::lease::VERIFIED_FILES_MAX),
            ring,
            ring_reaped: Vec::new(),
            next_sweep: None,
            stopping: false,
            collectives: Collectives::new(collective_limits),
            ready: VecDeque::new(),
            ready_write_bytes: 0,
            now: shared.clock.read(),
            #[cfg(test)]
            mutation: (queue::Mutation::None, 0),
            shared,
        })
    }

    /// Whether dispatches that would block go through io_uring, and
    /// whether a kernel thread polls its submission queue.
    pub fn uses_ring(&self) -> (bool, bool) {
        (self.ring.is_some(), self.ring.as_ref().is_some_and(Ring::sqpoll))
    }

    /// Serve until the server stops and everything admitted is answered.
    pub fn run(mut self) -> Ended {
        let mut wake_at: Option<u64> = None;
        loop {
            let ready = self.sleep(wake_at);
            wake_at = self.turn(ready);
            if self.stopping && self.drained() {
                break;
            }
        }
        self.end()
    }

    /// One turn after the sleep, `ready` descriptors ready: the
    /// scheduler's wake-up time.
    fn turn(&mut self, ready: usize) -> Option<u64> {
        self.now = self.shared.clock.read();
        for i in 0..ready {
            match self.poll.event(i) {
                (TOKEN_LISTENER, _) => self.accept_all(),
                (TOKEN_WAKER, _) => self.waker.drain(),
                (id, flags) => self.on_conn(id, flags),
            }
        }
        self.scan_doorbells();
        self.take_back();
        if self.shared.qos_pending.load(Ordering::Acquire) {
            self.apply_qos();
        }
        if self.shared.stopping.load(Ordering::SeqCst) && !self.stopping {
            self.begin_stop();
        }
        let wake_at = self.schedule();
        self.flush_dirty();
        self.publish_view();
        self.deadlines();
        wake_at
    }

    /// Apply the service classes `ServerHandle::set_qos` left.
    fn apply_qos(&mut self) {
        self.shared.qos_pending.store(false, Ordering::Release);
        let Some(rules) = crate::sync::lock(&self.shared.qos_update).take() else { return };
        self.change_qos(rules);
    }

    /// Replace the service classes, logged and counted.
    fn change_qos(&mut self, rules: Option<crate::qos::QosRules>) {
        let what = rules.as_ref().map_or_else(|| "no classes".to_string(), |r| r.summary());
        self.disp.set_qos(rules, self.now.ns);
        self.shared.qos_changes.fetch_add(1, Ordering::Relaxed);
        eprintln!("sluice: qos: now {what}");
    }

    /// An operator's `Qos` command (`sluice qos`): its answer, or an errno
    /// and why.
    pub(super) fn qos_command(&mut self, command: &str) -> Result<String, (i32, String)> {
        let (verb, rest) = command.split_once(char::is_whitespace).map_or((command, ""), |(v, r)| (v, r.trim_start()));
        let current = self.disp.qos_rules().cloned();
        match verb {
            "list" => Ok(current.map_or_else(|| "# no service classes\n".to_string(), |r| r.to_toml())),
            "stats" => Ok(crate::qos::stats_table(&self.disp.sched.class_stats(), self.shared.qos_changes.load(Ordering::Relaxed))),
            "set" => {
                let rules = crate::qos::QosRules::parse(rest).map_err(|e| (libc::EINVAL, format!("rules refused, the ones in force kept: {e}")))?;
                let said = format!("{}\n", rules.summary());
                self.change_qos(Some(rules));
                Ok(said)
            }
            "rm" => {
                let mut rules = current.ok_or((libc::ENOENT, "no service classes".to_string()))?;
                let before = rules.classes.len();
                rules.classes.retain(|c| c.spec.name != rest);
                if rules.classes.len() == before {
                    return Err((libc::ENOENT, format!("no class {rest:?}")));
                }
                rules.rules.retain(|r| r.class != rest);
                self.change_qos((!rules.classes.is_empty() || !rules.share.is_empty()).then_some(rules));
                Ok(format!("class {rest:?} removed, with its rules\n"))
            }
            "clear" => {
                self.change_qos(None);
                Ok("no service classes\n".to_string())
            }
            _ => Err((libc::EINVAL, format!("qos command {verb:?}: give list, stats, set RULES, rm CLASS or clear"))),
        }
    }

    /// Close every connection and hand back the scheduler's figures.
    fn end(mut self) -> Ended {
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        ids.into_iter().for_each(|id| self.remove(id));
        self.workers = None;
        self.disp.finish()
    }

    /// Sleep until something is ready (or the timeout): spin first where
    /// that pays, look at no doorbell while asleep. How many descriptors
    /// are ready.
    fn sleep(&mut self, wake_at: Option<u64>) -> usize {
        let mut timeout = self.timeout_ms(wake_at);
        if timeout != 0 && self.spin() {
            timeout = 0;
        }
        // Asleep, the loop looks at no doorbell: their clients nudge.
        let unwatched = timeout != 0 && self.doorbells.any();
        if unwatched && !self.unwatch() {
            timeout = 0;
        }
        let ready = self.poll.wait(timeout);
        if unwatched {
            self.doorbells.set_watched(true);
        }
        ready
    }

    /// Scheduler passes until nothing more enters: complete collectives
    /// waiting for room enter as the turn's completions make some (a pass
    /// that served everything on the loop makes more, which no worker
    /// will wake the loop for). The scheduler's wake-up time.
    fn schedule(&mut self) -> Option<u64> {
        let mut wake_at = self.pump();
        while !self.ready.is_empty() {
            let waiting = self.ready.len();
            self.release_ready();
            self.complete();
            wake_at = self.pump();
            if self.ready.len() == waiting {
                break;
            }
        }
        wake_at
    }

    fn drained(&self) -> bool {
        self.disp.is_empty() && self.ready.is_empty() && self.exec_out == 0 && self.meta_out == 0 && self.conns.values().all(|c| c.finished() || !c.has_output())
    }

    /// The drain: accept nothing more, read nothing more (a partial frame
    /// is dropped unacknowledged), close connections still in their
    /// handshake; everything admitted is still carried out and answered.
    fn begin_stop(&mut self) {
        self.stopping = true;
        if let Some(l) = self.listener.take() {
            self.poll.delete(l.fd(), TOKEN_LISTENER);
        }
        self.accept_rest_until = None;
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            let mut c = self.conns.remove(&id).expect("listed");
            self.abandon_frame(&mut c);
            c.blocked = None;
            c.read_closed = true;
            if !c.ready() {
                c.break_output(&self.shared.reply_bytes);
            }
            if c.pause != Some(crate::conn::Pause::Meta) {
                c.pause = None;
            }
            self.put_back(c);
        }
        self.budget.forget_all();
        self.starved.clear();
        // Rung requests are no longer taken: their clients nudge, and are
        // answered when the drain closes their connections.
        for id in self.doorbells.unwatch_all() {
            if let Some(c) = self.conns.get_mut(&id) {
                c.watched = false;
            }
        }
        self.shared.doorbells_watched.store(0, Ordering::Relaxed);
        self.expire_collectives(true);
        self.complete();
    }
}
