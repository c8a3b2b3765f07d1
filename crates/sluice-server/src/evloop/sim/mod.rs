//! The event loop driven by hand, in simulated time, with simulated I/O.
//!
//! A schedule, made from a seed: a few clients on real Unix sockets speak
//! the protocol to one `EventLoop` built on this thread, whose clock is a
//! number the test sets (`Clock::manual`). The test plays every other
//! part: it sends each client's frames torn into pieces over many turns,
//! carries out the executor's dispatches itself (through a `Storage` that
//! fails some calls and cuts others short), each after a simulated
//! service time (a slow disk now and then holds one for seconds), serves
//! the metadata calls, stalls one client part way through a frame, kills
//! another, and moves the clock. After every turn it checks the bounds;
//! at the end, that every message of a connection the server kept was
//! answered exactly once, that no answer came for a message never sent
//! or came twice, and that every write acknowledged is in the file, read
//! back through the server and from the disk.
//!
//! `thousand_seeded_schedules_keep_the_invariants` runs 1,000 seeds;
//! the mutation tests plant a fault in the delivery path (an answer
//! dropped, or given twice: `queue::Mutation`) and require the checks to
//! catch it.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use sluice_core::{Limits, Op, PolicyConfig, Scheduler};
use sluice_proto::{Cred, Hello, Request, VERSION};

mod client;

use client::{Client, Rng, Sent, REGION};

use super::queue::Mutation;
use super::{EventLoop, Workers};
use crate::config::{Listen, ServerConfig, StorageRef};
use crate::dispatch::Dispatcher;
use crate::exec::{Executor, Job};
use crate::meta::{serve_one, MetaDone, MetaJob};
use crate::root::Root;
use crate::shared::Shared;
use crate::storage::{Storage, Syscalls};
use crate::waker::Waker;

/// The clock's step when nothing is due.
const IDLE_STEP_NS: u64 = 10_000_000;
/// Turns a schedule may take before it is called stuck.
const TURNS_MAX: usize = 20_000;

/// The disk as the schedule sees it: the real calls on a temporary
/// directory, some refused (`EIO`) and some cut short at a block boundary
/// (as an error part way through would), by the schedule's rates.
struct Faulty {
    rng: Mutex<Rng>,
    fail_per_mille: u64,
    short_per_mille: u64,
}

impl Storage for Faulty {
    fn transfer_once(&self, fd: i32, op: Op, iov: &[libc::iovec], offset: u64) -> Result<usize, i32> {
        let (fail, short) = {
            let mut r = self.rng.lock().expect("not poisoned");
            (r.chance(self.fail_per_mille), r.chance(self.short_per_mille))
        };
        if fail {
            return Err(libc::EIO);
        }
        // Cut at a block boundary of the file, where an I/O error part
        // way through stops a transfer.
        let total: usize = iov.iter().map(|v| v.iov_len).sum();
        let cut = (((offset as usize + total / 2) & !4095) as u64).saturating_sub(offset) as usize;
        if short && cut > 0 && iov[0].iov_len >= cut {
            let one = [libc::iovec { iov_base: iov[0].iov_base, iov_len: cut }];
            return Syscalls.transfer_once(fd, op, &one, offset);
        }
        Syscalls.transfer_once(fd, op, iov, offset)
    }
}

/// One schedule: the loop, the test's ends of its workers, the clients.
struct Sim {
    lp: EventLoop,
    clock: &'static AtomicU64,
    jobs: Receiver<Job>,
    done: Sender<Job>,
    meta_jobs: Receiver<MetaJob>,
    meta_done: Sender<MetaDone>,
    exec: Executor,
    /// Dispatches on the simulated disk, with when each completes.
    held: Vec<(u64, Job)>,
    holding: Option<Cred>,
    clients: Vec<Client>,
    rng: Rng,
    dir: PathBuf,
    faults: bool,
    /// Clients may stall, die or not read (else the server has no cause
    /// to close a connection with a message unanswered).
    hostile: bool,
    turn: usize,
    wake_at: Option<u64>,
    violations: Vec<String>,
    /// Dispatches held for seconds (the slow disk).
    slow: u32,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Sim {
    /// Schedule `seed`; `hostile`: some clients stall, die or do not read.
    fn new(seed: u64, mutation: Mutation, hostile: bool) -> Sim {
        let mut rng = Rng(seed);
        let dir = std::env::temp_dir().join(format!("sluice-sim-{}-{seed}-{:?}", std::process::id(), std::thread::current().id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root")).expect("a scratch directory");
        let sock = dir.join("sock");
        let mut config = ServerConfig::new(dir.join("root"), Listen::Unix(sock.clone()));
        let (fail, short) = ([0, 0, 20, 100][rng.below(4) as usize], [0, 100][rng.below(2) as usize]);
        let faulty = Arc::new(Faulty { rng: Mutex::new(Rng(seed ^ 0x5eed)), fail_per_mille: fail, short_per_mille: short });
        config.storage = Some(StorageRef(faulty.clone()));
        (config.write_leases, config.uring, config.queue_depth) = (false, false, 1 + rng.below(4) as u32);
        config.policy = PolicyConfig::from_name(["aioli", "fifo", "fifo-merge"][rng.below(3) as usize]).expect("a known policy");
        let l = &mut config.limits;
        l.frame_bytes_max = 20 << 10;
        l.partial_bytes_max = [20 << 10, 48 << 10, 1 << 20][rng.below(3) as usize];
        l.inflight_per_connection_max = 1 + rng.below(4) as u32;
        (l.frame_stall_ms, l.handshake_timeout_ms) = (500, 2_000);
        config.validate().expect("a valid configuration");
        let clock: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(1_000_000)));
        let root = Root::open(&config.root).expect("the root opens");
        let mut limits = Limits { dispatches_inflight_max: config.queue_depth, ..config.sched_limits.clone() }.clamped();
        limits.apps_max = limits.apps_max.max(8);
        let policy = config.policy.clone();
        let mut shared = Shared::new(config, root, None, limits.apps_max);
        shared.clock = crate::clock::Clock::manual(clock);
        let shared = Arc::new(shared);
        let listener = sluice_net::Listener::bind(&Listen::Unix(sock.clone())).expect("the socket binds");
        let waker = Arc::new(Waker::new().expect("an eventfd"));
        let (jobs_tx, jobs) = mpsc::channel();
        let (done, done_rx) = mpsc::channel();
        let (meta_tx, meta_jobs) = mpsc::channel();
        let (meta_done, meta_done_rx) = mpsc::channel();
        let disp = Dispatcher::new(Scheduler::new(policy, limits), None, Arc::clone(&shared.apps), None);
        let workers = Workers { jobs: jobs_tx, done: done_rx, meta: meta_tx, meta_done: meta_done_rx };
        let direct_writes = Arc::clone(&shared.direct_writes);
        let mut lp = EventLoop::new(shared, listener, waker, disp, workers).expect("the loop starts");
        lp.mutation = (mutation, 0);
        let exec = Executor { storage: faulty, direct: false, device: None, direct_writes, null: None };
        let clients = (0..2 + rng.below(4) as u32).map(|id| Self::client(id, &sock, &mut rng, hostile)).collect();
        let faults = fail > 0 || short > 0;
        Sim {
            lp,
            clock,
            jobs,
            done,
            meta_jobs,
            meta_done,
            exec,
            held: Vec::new(),
            holding: None,
            clients,
            rng,
            dir,
            faults,
            hostile,
            turn: 0,
            wake_at: None,
            violations: Vec::new(),
            slow: 0,
        }
    }

    fn client(id: u32, sock: &std::path::Path, rng: &mut Rng, hostile: bool) -> Client {
        let stream = UnixStream::connect(sock).expect("connect");
        stream.set_nonblocking(true).expect("nonblocking");
        let mut c = Client {
            id,
            stream: Some(stream),
            out: Vec::new(),
            sent_bytes: 0,
            inbuf: Vec::new(),
            next_id: 1,
            sent: BTreeMap::new(),
            answered: HashMap::new(),
            fd: None,
            ops_left: 4 + rng.below(20) as u32,
            depth: 1 + rng.below(4) as u32,
            known: vec![None; REGION as usize],
            writing: Vec::new(),
            stall_at: (hostile && rng.chance(100)).then(|| 20 + rng.below(4_000) as usize),
            kill_at: (hostile && rng.chance(80)).then(|| rng.below(300) as usize),
            deaf_until: if hostile && rng.chance(100) { rng.below(400) as usize } else { 0 },
            gone: false,
            errors: BTreeMap::new(),
        };
        let app = format!("sim-{id}");
        c.send(&Request::Hello(Hello { version: VERSION, app: &app, weight: 1 + id % 3, client_id: id, cred: None }), Sent::Hello);
        c
    }
}

impl Sim {
    fn now(&self) -> u64 {
        self.clock.load(Ordering::SeqCst)
    }

    /// One step: the clients act, the loop turns, the workers' part is
    /// played, the bounds are checked, the clock moves.
    fn step(&mut self) {
        let turn = self.turn;
        let mut replies = Vec::new();
        for c in &mut self.clients {
            if c.kill_at.is_some_and(|t| t <= turn) && !c.gone {
                (c.stream, c.gone) = (None, true);
            }
            if c.gone {
                continue;
            }
            c.issue(&mut self.rng);
            c.write_some(&mut self.rng);
            if c.deaf_until <= turn {
                c.read_replies(&mut replies);
                for (id, r) in replies.drain(..) {
                    match r {
                        Ok(r) => c.take(id, r, self.faults, &mut self.violations),
                        Err(e) => self.violations.push(e),
                    }
                }
                // A client answers at once what its replies let it send.
                c.issue(&mut self.rng);
            }
        }
        let ready = self.lp.poll.wait(0);
        self.wake_at = self.lp.turn(ready);
        self.check_bounds();
        self.play_workers();
        self.advance();
        self.turn += 1;
    }

    /// The executor and metadata pool: calls served at once, dispatches
    /// after their simulated service time, in a seeded order.
    fn play_workers(&mut self) {
        for job in self.meta_jobs.try_iter() {
            let _ = self.meta_done.send(serve_one(&self.lp.shared, job, &mut self.holding));
        }
        let now = self.now();
        for job in self.jobs.try_iter() {
            let slow = self.rng.chance(20);
            self.slow += u32::from(slow);
            let ns = if slow { 3_000_000_000 } else { self.rng.below(2_000_000) };
            self.held.push((now + ns, job));
        }
        while let Some(i) = self.held.iter().position(|(due, _)| *due <= now) {
            let (due, mut job) = self.held.swap_remove(i);
            job.started = now.min(due);
            self.exec.run(&mut job);
            job.service_ns = 1;
            let _ = self.done.send(job);
        }
    }

    /// Move the clock: a little while clients still talk, else to the
    /// next thing due (a dispatch, the scheduler's wake-up), else by
    /// `IDLE_STEP_NS`: the loop's own deadlines (a stalled frame, a
    /// handshake) come in their time, and no live client sits idle long
    /// enough to be taken for gone.
    fn advance(&mut self) {
        let now = self.now();
        let busy = self.clients.iter().any(|c| !c.gone && !c.out.is_empty() && c.stall_at.is_none_or(|a| c.sent_bytes < a));
        let step = if busy {
            self.rng.below(300_000)
        } else {
            let next = self.held.iter().map(|(d, _)| *d).chain(self.wake_at).filter(|&t| t > now).min();
            next.map_or(IDLE_STEP_NS, |t| t - now)
        };
        self.clock.store(now + step.max(1), Ordering::SeqCst);
    }

    /// The loop's bounds, after every turn.
    fn check_bounds(&mut self) {
        let l = &self.lp.shared.config.limits;
        let held = self.lp.budget.held();
        if held > l.partial_bytes_max {
            self.violations.push(format!("turn {}: {held} bytes in partial frames, over {}", self.turn, l.partial_bytes_max));
        }
        if !self.lp.completed.is_empty() {
            self.violations.push(format!("turn {}: {} completions left undelivered", self.turn, self.lp.completed.len()));
        }
        if self.lp.conns.len() > 2 * l.clients_max as usize {
            self.violations.push(format!("turn {}: {} connections held", self.turn, self.lp.conns.len()));
        }
        for c in self.lp.conns.values() {
            if c.inflight > l.inflight_per_connection_max {
                self.violations.push(format!("turn {}: connection {} has {} in flight", self.turn, c.id, c.inflight));
            }
        }
    }
}

impl Sim {
    /// Run the schedule to its end: every client finished (or gone) and
    /// no dispatch held. The violations seen.
    fn run(mut self) -> (Vec<String>, Coverage) {
        while !(self.clients.iter().all(Client::finished) && self.held.is_empty()) {
            if self.turn >= TURNS_MAX {
                let left: Vec<String> = self
                    .clients
                    .iter()
                    .filter(|c| !c.finished())
                    .map(|c| format!("client {}: {} outstanding, {} to send, {} ops left", c.id, c.outstanding(), c.out.len(), c.ops_left))
                    .collect();
                self.violations.push(format!("stuck after {TURNS_MAX} turns: {}", left.join("; ")));
                break;
            }
            self.step();
        }
        self.check_end();
        let mut cov = Coverage { turns: self.turn, slow: self.slow, ..Coverage::default() };
        for c in &self.clients {
            cov.killed += u32::from(c.kill_at.is_some_and(|t| t < self.turn));
            cov.stalled += u32::from(c.stalled());
            for (e, n) in &c.errors {
                *cov.errors.entry(*e).or_insert(0) += n;
            }
        }
        (std::mem::take(&mut self.violations), cov)
    }

    /// At the end: every message of a connection the server kept answered
    /// (at most once was checked as they came), and every acknowledged
    /// byte in the file on disk.
    fn check_end(&mut self) {
        for c in &mut self.clients {
            if !c.gone || !self.hostile {
                for (id, what) in &c.sent {
                    if !c.answered.contains_key(id) {
                        self.violations.push(format!("client {}: request {id} ({what:?}) never answered", c.id));
                    }
                }
            }
            // A write never answered may still land: its bytes are not known.
            for (id, what) in &c.sent {
                if let (Sent::Write { offset, len, .. }, false) = (what, c.answered.contains_key(id)) {
                    let from = (offset - c.base()) as usize;
                    c.known[from..from + *len as usize].iter_mut().for_each(|b| *b = None);
                }
            }
            let file = std::fs::read(self.dir.join("root").join(format!("f{}", c.id % 2))).unwrap_or_default();
            for (i, want) in c.known.iter().enumerate() {
                let at = c.base() as usize + i;
                if let Some(w) = want {
                    if file.get(at) != Some(w) {
                        self.violations.push(format!("client {}: acknowledged byte at {at} is {:?} on disk, not {w}", c.id, file.get(at)));
                        break;
                    }
                }
            }
        }
    }
}

/// What a schedule exercised.
#[derive(Default)]
struct Coverage {
    turns: usize,
    slow: u32,
    killed: u32,
    stalled: u32,
    /// Answers by errno.
    errors: BTreeMap<i32, u32>,
}

/// Run schedule `seed` with `mutation` planted: its violations and what
/// it exercised.
fn schedule(seed: u64, mutation: Mutation, hostile: bool) -> (Vec<String>, Coverage) {
    Sim::new(seed, mutation, hostile).run()
}

#[test]
fn thousand_seeded_schedules_keep_the_invariants() {
    let (mut failed, mut turns, mut all) = (Vec::new(), Vec::new(), Coverage::default());
    for seed in 0..1_000 {
        let (v, cov) = schedule(seed, Mutation::None, true);
        turns.push(cov.turns);
        (all.slow, all.killed, all.stalled) = (all.slow + cov.slow, all.killed + cov.killed, all.stalled + cov.stalled);
        for (e, n) in cov.errors {
            *all.errors.entry(e).or_insert(0) += n;
        }
        if !v.is_empty() {
            failed.push(format!("seed {seed}:\n  {}", v.iter().take(5).cloned().collect::<Vec<_>>().join("\n  ")));
        }
    }
    turns.sort_unstable();
    eprintln!(
        "1,000 schedules: turns median {}, max {}; dispatches held 3 s: {}; clients killed: {}, stalled: {}; answers by errno: {:?}",
        turns[500], turns[999], all.slow, all.killed, all.stalled, all.errors
    );
    // The schedules reach what they are meant to: each fault happened.
    let e = |errno| all.errors.get(&errno).copied().unwrap_or(0);
    assert!(all.slow > 0 && all.killed > 0 && all.stalled > 0, "slow {}, killed {}, stalled {}", all.slow, all.killed, all.stalled);
    assert!(e(libc::EIO) > 0 && e(libc::EAGAIN) > 0 && e(libc::ETIMEDOUT) > 0, "{:?}", all.errors);
    assert!(failed.is_empty(), "{} of 1,000 schedules broke an invariant:\n{}", failed.len(), failed.iter().take(10).cloned().collect::<Vec<_>>().join("\n"));
}

/// Schedules of 50 seeds with `mutation` planted, every client staying:
/// the ones whose checks caught it, of those with that many answers.
fn caught(mutation: Mutation) -> (usize, usize) {
    let runs: Vec<bool> = (0..50).map(|seed| !schedule(seed, mutation, false).0.is_empty()).collect();
    (runs.iter().filter(|&&c| c).count(), runs.len())
}

#[test]
fn without_hostile_clients_no_schedule_reports_anything() {
    let noisy: Vec<u64> = (0..50).filter(|&seed| !schedule(seed, Mutation::None, false).0.is_empty()).collect();
    assert!(noisy.is_empty(), "schedules reporting violations without a mutation: {noisy:?}");
}

#[test]
fn an_answer_dropped_in_delivery_is_caught() {
    let (n, of) = caught(Mutation::Drop(2));
    assert_eq!(n, of, "a dropped answer caught in {n} of {of} schedules");
}

#[test]
fn an_answer_given_twice_is_caught() {
    let (n, of) = caught(Mutation::Twice(2));
    assert_eq!(n, of, "a doubled answer caught in {n} of {of} schedules");
}
