//! The event loop: one thread that owns every connection and the
//! scheduler (issue 12's event-driven core).
//!
//! Per wake-up (`epoll_wait`, level-triggered) it accepts new connections,
//! reads every ready one until it would block (many frames per system
//! call, from one scratch buffer), admits their reads and writes into the
//! scheduler, takes back the executors' and the metadata pool's finished
//! work, makes one scheduler pass, and writes every connection's replies in
//! batches. A dispatch whose data is in the page cache is carried out right
//! here (`exec::try_nowait`: `RWF_NOWAIT`, which never blocks), so a cached
//! 4 KiB read costs the client one round trip to this thread and nothing
//! more; the rest go to the executor's workers. Metadata calls that may
//! block go to the metadata pool.
//!
//! Bounds in time (`ServerLimits`): `handshake_timeout_ms` before the
//! handshake, `idle_timeout_s` between frames with nothing in flight,
//! `frame_stall_ms` plus one millisecond per `FRAME_RATE_MIN_BYTES_PER_MS`
//! once a frame started (time spent waiting for the budget not counted),
//! `write_timeout_s` for a reply queue that does not move. Deadlines are
//! checked by a sweep over the connections at the earliest one due.
//!
//! Bounds in memory: a body reserves its length from the partial-frame
//! budget (`partial_bytes_max`, all connections together) when its header
//! arrives and is allocated as it arrives, in chunks of at most
//! `BODY_CHUNK_BYTES`; a body that finds the budget spent waits, unread,
//! until bytes drain. Reply bytes per connection: `conn.rs`.
//!
//! Invariant: bytes held in partial frames never exceed `partial_bytes_max`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::{ClientId, Op, Request as CoreRequest, RequestId};
use sluice_proto::{
    auth_verify, check_header, encode_request, parse_request, Group, Header, HelloOk, Opcode, Request, HEADER_BYTES, IO_BYTES_MAX, LEASE_ONLY_AT, NO_POST, POSTS_MAX, VERSION,
};

use crate::collective::{Arrival, CollectiveLimits, Collectives, Joined};
use crate::config::FRAME_RATE_MIN_BYTES_PER_MS;
use crate::conn::{Conn, Pause, Phase, Rx, SCRATCH_BYTES, SEND_BUFFER_BYTES};
use crate::dispatch::Dispatcher;
use crate::exec::{populated_already, try_nowait, Job};
use crate::ident;
use crate::meta::{MetaDone, MetaJob};
use crate::ops::{runs_inline, Session};
use crate::pending::{Buf, Delivery, LeaseAfter, ListInner, ListState, Out, Pending, Reply};
use crate::ring::{Reaped, Ring};
use crate::shared::Shared;
use crate::sync::lock;
use crate::waker::Waker;
use sluice_net::Listener;

/// Bytes a body takes from the budget, and is read, at a time (1 MiB): a
/// 64 MiB write holds no more than it has received plus one chunk.
pub const BODY_CHUNK_BYTES: usize = 1 << 20;
/// Bytes reserved against `reply_bytes_max` for the frame of each admitted
/// message's reply, besides its data: the largest reply without data (an
/// error with the longest message).
const REPLY_FRAME_BYTES: u64 = (HEADER_BYTES + 8 + sluice_proto::MESSAGE_BYTES_MAX) as u64;
/// Events taken per `epoll_wait`.
const EVENTS_MAX: usize = 256;
/// How long the loop spins before sleeping while dispatches are on the
/// ring (`EventLoop::spin`): about one 4 KiB O_DIRECT read on the 2-core VM.
const SPIN: Duration = Duration::from_micros(50);
/// The longest dispatch (as the learned model predicts its service) that
/// the loop spins for: twice `SPIN`.
const SPIN_DISPATCH_NS: u64 = 100_000;
/// Spins that saw nothing before the loop stops spinning, and the sleeps
/// after which it tries again.
const SPIN_CREDIT_MAX: u32 = 4;
const SPIN_RETRY: u32 = 64;

/// Whether the loop spins before a sleep (`EventLoop::spin`): credit for
/// spins that saw something, at most `SPIN_CREDIT_MAX`; at none, one try
/// every `SPIN_RETRY` sleeps.
#[derive(Debug)]
struct SpinCredit {
    credit: u32,
    skipped: u32,
}

impl Default for SpinCredit {
    fn default() -> SpinCredit {
        SpinCredit { credit: SPIN_CREDIT_MAX, skipped: 0 }
    }
}

impl SpinCredit {
    /// Whether this sleep may be spun for.
    fn may_spin(&mut self) -> bool {
        if self.credit > 0 {
            return true;
        }
        self.skipped += 1;
        if self.skipped < SPIN_RETRY {
            return false;
        }
        self.skipped = 0;
        true
    }

    /// A spin saw something (`true`) or spun for nothing.
    fn paid(&mut self, saw: bool) {
        self.credit = if saw { (self.credit + 1).min(SPIN_CREDIT_MAX) } else { self.credit.saturating_sub(1) };
    }
}

/// Reads of one connection per wake-up, so one busy client cannot keep
/// the loop from the others (level-triggered: the rest comes next turn).
const READS_PER_WAKE: usize = 16;
/// After a failed `accept` (out of descriptors), the listener rests this
/// long instead of waking the loop at once again.
const ACCEPT_REST: Duration = Duration::from_millis(100);

const TOKEN_LISTENER: u64 = 0;
const TOKEN_WAKER: u64 = 1;
const FIRST_CONN: u64 = 2;

/// The partial-frame budget: every body being received reserves its whole
/// length here when its header arrives (so bodies never wait for each
/// other half-way, which could leave the budget spent by frames none of
/// which can finish), and allocates it chunk by chunk as bytes arrive.
struct Budget {
    /// Reserved by bodies in progress.
    held: u64,
    max: u64,
    /// Allocated by them (≤ `held`): what `ServerHandle::partial_bytes`
    /// reports.
    allocated: u64,
}

/// What processing a frame left the connection in.
enum Flow {
    /// Read on.
    Next,
    /// Paused (`conn.pause` says why); the frame was taken in.
    Paused,
    /// An error was answered: read no more.
    Close,
}

/// Where an admitted message's data is.
enum Place {
    /// A read: its reply carries the data.
    Reply,
    /// A write: its frame body, from this offset.
    Body(Arc<Vec<u8>>, usize),
    /// The connection's shared region, from this offset; the post record
    /// to answer in (`NO_POST`: the socket).
    Shm(Arc<crate::shm::Shm>, u64, u32),
}

/// The loop's ends of the executor and the metadata pool.
pub(crate) struct Workers {
    pub jobs: Sender<Job>,
    pub done: Receiver<Job>,
    pub meta: Sender<MetaJob>,
    pub meta_done: Receiver<MetaDone>,
}

pub(crate) struct EventLoop {
    shared: Arc<Shared>,
    epoll: OwnedFd,
    listener: Option<Listener>,
    accept_rest_until: Option<Instant>,
    waker: Arc<Waker>,
    conns: HashMap<u64, Conn>,
    /// Connections whose handshake is done (`Phase::Ready`): at most
    /// `clients_max`. The others, at most as many again, wait for theirs.
    ready_conns: usize,
    conn_next: u64,
    disp: Dispatcher,
    workers: Option<Workers>,
    /// Jobs at the executor, and calls at the metadata pool.
    exec_out: usize,
    meta_out: usize,
    budget: Budget,
    waiting_budget: Vec<u64>,
    scratch: Vec<u8>,
    /// Connections with replies to write, or to look at after a change.
    dirty: Vec<u64>,
    /// Replies produced while their connection was out of the table.
    deferred: Vec<Delivery>,
    /// Post records answered this turn whose clients sleep on them: woken
    /// at the end of the turn, with the socket replies (`flush_dirty`).
    wakes: Vec<(Arc<crate::shm::Shm>, u32)>,
    /// Connections whose doorbells the loop looks at on every turn (rung
    /// requests; at most `doorbells_watched_max`), with their regions, so
    /// that a turn looks at each doorbell without finding its connection.
    watched: Vec<(u64, Arc<crate::shm::Shm>)>,
    request_next: u64,
    /// Page-cache dispatches may run on this thread (`RWF_NOWAIT`).
    inline: bool,
    /// Ranges found in the page cache lately (`lease::Verified`).
    verified: crate::lease::Verified,
    /// Dispatches that would block, handed to the kernel from this thread
    /// (`ring.rs`); `None`: workers carry them out.
    ring: Option<Ring>,
    ring_reaped: Vec<Reaped>,
    /// Whether spinning before a sleep has paid lately (`spin`).
    spin_credit: SpinCredit,
    /// The last dispatch put on the ring is one the learned model expects
    /// back within `SPIN_DISPATCH_NS` (`spin`).
    spin_short: bool,
    /// The earliest deadline of any connection or collective.
    next_sweep: Option<Instant>,
    stopping: bool,
    /// Server-directed collectives still gathering their participants.
    collectives: Collectives<Pending>,
    /// Complete collectives waiting, in order, for room in the scheduler's
    /// queue (each enters whole). They count against `collectives_max` and
    /// `collective_bytes_max` with the gathering ones (`Collectives::check`).
    ready: std::collections::VecDeque<Vec<Pending>>,
    /// Bytes of write data in `ready`.
    ready_write_bytes: u64,
}

fn epoll_ctl(ep: &OwnedFd, op: libc::c_int, fd: libc::c_int, events: u32, token: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: token };
    // SAFETY: ev is a valid epoll_event for the call.
    if unsafe { libc::epoll_ctl(ep.as_raw_fd(), op, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Add what connection `c`'s client reports it wrote itself under write
/// leases since the last look (the doorbell's `leased_bytes`,
/// `sluice_proto::post`) to its application's bytes written. A count that
/// went down (a client writing its own word) adds nothing until it
/// passes what was seen.
fn fold_leased(shared: &Shared, c: &mut Conn) {
    let (Some(shm), Some(app)) = (c.shm.as_ref(), c.app) else { return };
    let now = shm.leased_bytes();
    if now > c.leased_seen {
        lock(&shared.apps).record_leased_write(app, now - c.leased_seen);
        c.leased_seen = now;
    }
}

fn ms_until(t: Instant, now: Instant) -> i64 {
    let d = t.saturating_duration_since(now);
    (d.as_micros().div_ceil(1000)) as i64
}

impl EventLoop {
    pub fn new(shared: Arc<Shared>, listener: Listener, waker: Arc<Waker>, disp: Dispatcher, workers: Workers) -> io::Result<EventLoop> {
        // SAFETY: plain system call; the descriptor is owned from here on.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(fd) };
        let l = &shared.config.limits;
        let collective_limits = CollectiveLimits { groups_max: l.collectives_max as usize, bytes_max: l.collective_bytes_max, wait_ms_max: l.collective_wait_ms_max };
        listener.set_nonblocking()?;
        epoll_ctl(&epoll, libc::EPOLL_CTL_ADD, listener.fd(), libc::EPOLLIN as u32, TOKEN_LISTENER)?;
        epoll_ctl(&epoll, libc::EPOLL_CTL_ADD, waker.fd(), libc::EPOLLIN as u32, TOKEN_WAKER)?;
        let c = &shared.config;
        let inline = !c.direct && c.device == crate::DeviceKind::Real && c.storage.is_none();
        // The ring serves the real device's calls; an emulated disk (which
        // holds a worker for the modelled time) or a test's storage keep
        // the workers. Where the kernel refuses io_uring, workers serve.
        // With O_DIRECT, whole-block writes hold shares of the workers'
        // order of writes (`order::DirectOrder`).
        let order = c.direct.then(|| Arc::clone(&shared.direct_writes));
        let ring = (c.uring && c.device == crate::DeviceKind::Real && c.storage.is_none()).then(|| Ring::new(c.queue_depth, waker.fd(), order, c.sqpoll_idle_ms).ok()).flatten();
        let budget = Budget { held: 0, max: c.limits.partial_bytes_max, allocated: 0 };
        Ok(EventLoop {
            shared,
            epoll,
            listener: Some(listener),
            accept_rest_until: None,
            waker,
            conns: HashMap::new(),
            ready_conns: 0,
            conn_next: FIRST_CONN,
            disp,
            workers: Some(workers),
            exec_out: 0,
            meta_out: 0,
            budget,
            waiting_budget: Vec::new(),
            scratch: vec![0u8; SCRATCH_BYTES],
            dirty: Vec::new(),
            deferred: Vec::new(),
            wakes: Vec::new(),
            watched: Vec::new(),
            request_next: 0,
            inline,
            verified: crate::lease::Verified::new(crate::lease::VERIFIED_FILES_MAX),
            ring,
            ring_reaped: Vec::new(),
            spin_credit: SpinCredit::default(),
            spin_short: false,
            next_sweep: None,
            stopping: false,
            collectives: Collectives::new(collective_limits),
            ready: std::collections::VecDeque::new(),
            ready_write_bytes: 0,
        })
    }

    /// Whether dispatches that would block go through io_uring, and
    /// whether a kernel thread polls its submission queue.
    pub fn uses_ring(&self) -> (bool, bool) {
        (self.ring.is_some(), self.ring.as_ref().is_some_and(Ring::sqpoll))
    }

    /// Serve until the server stops and everything admitted is answered.
    pub fn run(mut self) -> crate::dispatch::Ended {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS_MAX];
        let mut wake_at: Option<u64> = None;
        loop {
            let mut timeout = self.timeout_ms(wake_at);
            if timeout != 0 && self.spin() {
                timeout = 0;
            }
            // Asleep, the loop looks at no doorbell: their clients nudge.
            let unwatched = timeout != 0 && !self.watched.is_empty();
            if unwatched && !self.unwatch() {
                timeout = 0;
            }
            // SAFETY: events has room for EVENTS_MAX entries.
            let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), events.as_mut_ptr(), EVENTS_MAX as libc::c_int, timeout) };
            if unwatched {
                self.set_watched(true);
            }
            for ev in &events[..n.max(0) as usize] {
                let (token, flags) = (ev.u64, ev.events);
                match token {
                    TOKEN_LISTENER => self.accept_all(),
                    TOKEN_WAKER => self.waker.drain(),
                    id => self.on_conn(id, flags),
                }
            }
            self.scan_doorbells();
            self.take_back();
            if self.shared.stopping.load(Ordering::SeqCst) && !self.stopping {
                self.begin_stop();
            }
            wake_at = self.pump();
            // Admit complete collectives waiting for room: the turn's
            // completions made some, and a pump that served everything on
            // the loop made more, which no worker will wake us for.
            while !self.ready.is_empty() {
                let waiting = self.ready.len();
                self.release_ready();
                for d in std::mem::take(&mut self.deferred) {
                    self.deliver(d);
                }
                wake_at = self.pump();
                if self.ready.len() == waiting {
                    break;
                }
            }
            self.flush_dirty();
            if self.shared.view.wanted() {
                // The scrape reads the applications' counters next.
                self.fold_leased_all();
                self.shared.view.publish(self.disp.view());
            }
            if self.accept_rest_until.is_some_and(|t| Instant::now() >= t) {
                self.accept_rest_until = None;
                if let Some(l) = &self.listener {
                    let _ = epoll_ctl(&self.epoll, libc::EPOLL_CTL_ADD, l.fd(), libc::EPOLLIN as u32, TOKEN_LISTENER);
                }
            }
            if self.next_sweep.is_some_and(|t| Instant::now() >= t) {
                self.sweep();
                self.flush_dirty();
            }
            if self.stopping && self.drained() {
                break;
            }
        }
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        ids.into_iter().for_each(|id| self.remove(id));
        self.workers = None;
        self.disp.finish()
    }

    /// Before sleeping while dispatches are on the ring: look at its
    /// completions and the watched doorbells for up to `SPIN`, and say
    /// whether one came. A completion seen here costs the loop no sleep
    /// and no wake-up (two context switches, 20-40 us on the 2-core VM,
    /// as long as a 4 KiB O_DIRECT read), and a rung request no `Nudge`.
    /// Only for short dispatches (the last one on the ring expected back
    /// within `SPIN_DISPATCH_NS` by the learned model: a longer one would
    /// mostly be spun for in vain, taking a core from the clients), and
    /// only while spinning pays: each spin that saw nothing takes credit,
    /// each that saw something gives it back, and at none the loop sleeps
    /// at once, trying a spin again every `SPIN_RETRY` sleeps. Sockets are
    /// not looked at while spinning: an unwatched client's request waits
    /// at most `SPIN`.
    fn spin(&mut self) -> bool {
        let Some(ring) = self.ring.as_mut() else { return false };
        if ring.inflight() == 0 || !self.spin_short || !self.spin_credit.may_spin() {
            return false;
        }
        let until = Instant::now() + SPIN;
        loop {
            if ring.completed() || self.watched.iter().any(|(_, shm)| shm.rung()) {
                self.spin_credit.paid(true);
                return true;
            }
            if Instant::now() >= until {
                self.spin_credit.paid(false);
                return false;
            }
            std::hint::spin_loop();
        }
    }

    /// How long `epoll_wait` may sleep: until the scheduler's wake-up, the
    /// next deadline, the listener's rest, or for ever.
    fn timeout_ms(&self, wake_at: Option<u64>) -> libc::c_int {
        let now = Instant::now();
        let mut t: Option<i64> = wake_at.map(|w| (w.saturating_sub(self.shared.clock.now())).div_ceil(1_000_000) as i64);
        for d in [self.next_sweep, self.accept_rest_until].into_iter().flatten() {
            let ms = ms_until(d, now);
            t = Some(t.map_or(ms, |x| x.min(ms)));
        }
        if !self.dirty.is_empty() {
            // Connections changed after the turn's flush: look again now.
            return 0;
        }
        if self.ring.as_ref().is_some_and(Ring::pending) {
            // Submissions the kernel did not take yet: try again soon.
            t = Some(t.map_or(1, |x| x.min(1)));
        }
        if self.stopping {
            // Draining: look again often (executors and pool wake us too).
            t = Some(t.map_or(10, |x| x.min(10)));
        }
        t.map_or(-1, |x| x.clamp(0, i32::MAX as i64) as libc::c_int)
    }

    fn arm(&mut self, deadline: Instant) {
        self.next_sweep = Some(self.next_sweep.map_or(deadline, |t| t.min(deadline)));
    }

    fn drained(&self) -> bool {
        self.disp.is_empty() && self.ready.is_empty() && self.exec_out == 0 && self.meta_out == 0 && self.conns.values().all(|c| c.finished() || !c.has_output())
    }

    // ---- connections come and go -------------------------------------

    fn accept_all(&mut self) {
        let Some(listener) = self.listener.take() else { return };
        self.accept_from(&listener);
        self.listener = Some(listener);
    }

    fn accept_from(&mut self, listener: &Listener) {
        loop {
            let stream = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // Out of descriptors or memory: rest instead of spinning.
                    let _ = epoll_ctl(&self.epoll, libc::EPOLL_CTL_DEL, listener.fd(), 0, TOKEN_LISTENER);
                    self.accept_rest_until = Some(Instant::now() + ACCEPT_REST);
                    return;
                }
            };
            let fd = stream.as_raw_fd();
            // SAFETY: plain fcntl on a descriptor we own.
            unsafe { libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK) };
            stream.set_nodelay();
            stream.set_send_buffer(SEND_BUFFER_BYTES);
            let clients_max = self.shared.config.limits.clients_max as usize;
            if self.conns.len() >= 2 * clients_max && !self.evict_oldest_handshake(clients_max) {
                // The table holds at most twice `clients_max`: the clients
                // served and as many more connecting. Past that, the socket
                // that has waited longest for its handshake gives way (a
                // peer that connects and says nothing holds no slot for
                // long); where none waits, the new one is told so at once
                // (if its buffer takes it) and closed.
                send_reason(&stream, libc::EBUSY, &format!("server full (clients_max = {clients_max}, and as many more connecting)"));
                continue;
            }
            let id = self.conn_next;
            self.conn_next += 1;
            let now = Instant::now();
            let mut c = Conn::new(id, stream, now);
            if epoll_ctl(&self.epoll, libc::EPOLL_CTL_ADD, fd, libc::EPOLLIN as u32, id).is_err() {
                continue;
            }
            c.registered = true;
            c.interest = libc::EPOLLIN as u32;
            if let Err(e) = &c.peer {
                let msg = format!("cannot tell who the peer is (SO_PEERCRED): {e}");
                self.fail(&mut c, 0, libc::EACCES, msg);
                self.dirty_mark(&mut c);
            }
            self.arm(now + Duration::from_millis(self.shared.config.limits.handshake_timeout_ms));
            self.conns.insert(id, c);
            self.shared.conns_open.store(self.conns.len(), Ordering::Relaxed);
        }
    }

    /// Why a handshake cannot finish now: `clients_max` connections have
    /// finished theirs.
    fn full(&self) -> Option<String> {
        let max = self.shared.config.limits.clients_max;
        (self.ready_conns >= max as usize).then(|| format!("server full (clients_max = {max})"))
    }

    /// Close the connection that has waited longest for its handshake,
    /// telling it why; `false` when every connection has done its own.
    fn evict_oldest_handshake(&mut self, clients_max: usize) -> bool {
        let Some(oldest) = self.conns.values().filter(|c| !matches!(c.phase, Phase::Ready)).map(|c| c.id).min() else { return false };
        if let Some(c) = self.conns.get(&oldest) {
            let msg = format!("handshake not done before newer connections came (clients_max = {clients_max}, and as many more connecting)");
            send_reason(&c.stream, libc::EBUSY, &msg);
        }
        self.shared.handshakes_evicted.fetch_add(1, Ordering::Relaxed);
        self.remove(oldest);
        true
    }

    /// `fold_leased` for every connection in the table.
    fn fold_leased_all(&mut self) {
        for c in self.conns.values_mut() {
            fold_leased(&self.shared, c);
        }
    }

    /// Drop connection `id`: its partial frame's budget, its reply bytes,
    /// its application's connection.
    fn remove(&mut self, id: u64) {
        let Some(mut c) = self.conns.remove(&id) else { return };
        if matches!(c.phase, Phase::Ready) {
            self.ready_conns -= 1;
        }
        fold_leased(&self.shared, &mut c);
        if c.registered {
            let _ = epoll_ctl(&self.epoll, libc::EPOLL_CTL_DEL, c.fd(), 0, id);
        }
        self.abandon_frame(&mut c);
        let held = c.held;
        c.give(held, &self.shared.reply_bytes);
        if let Some(app) = c.app {
            if lock(&self.shared.apps).disconnect(app, self.shared.clock.now()) {
                self.disp.forget(app);
            }
        }
        self.waiting_budget.retain(|&w| w != id);
        if c.watched {
            self.watched.retain(|(w, _)| *w != id);
            self.shared.doorbells_watched.store(self.watched.len(), Ordering::Relaxed);
        }
        self.shared.conns_open.store(self.conns.len(), Ordering::Relaxed);
    }

    /// Give back the budget of a partial frame (closed, timed out, drained).
    fn abandon_frame(&mut self, c: &mut Conn) {
        if let Rx::Body { held, body, .. } = std::mem::replace(&mut c.rx, Rx::Idle) {
            self.allocated(-(body.capacity() as i64));
            self.give_budget(held);
        }
        c.stash = Vec::new();
    }

    /// Bytes allocated by bodies in progress changed by `delta`.
    fn allocated(&mut self, delta: i64) {
        self.budget.allocated = self.budget.allocated.checked_add_signed(delta).expect("allocations balance");
        self.shared.partial_held.store(self.budget.allocated, Ordering::Relaxed);
    }

    fn give_budget(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.budget.held -= n;
        // Connections waiting for the budget try again at the end of the
        // turn (`flush_dirty`), when no connection is out of the table;
        // until then they stay paused, so nothing overtakes their stash.
        for id in std::mem::take(&mut self.waiting_budget) {
            match self.conns.remove(&id) {
                Some(mut c) => {
                    c.resume_pending = true;
                    self.dirty_mark(&mut c);
                    self.conns.insert(id, c);
                }
                // Out of the table while the loop works on it (a removed
                // connection leaves this list in `remove`): it waits on.
                None => self.waiting_budget.push(id),
            }
        }
    }

    fn take_budget(&mut self, n: u64) -> bool {
        if self.budget.held + n > self.budget.max {
            return false;
        }
        self.budget.held += n;
        true
    }

    fn pause_budget(&mut self, c: &mut Conn) {
        c.pause = Some(Pause::Budget(Instant::now()));
        if !self.waiting_budget.contains(&c.id) {
            self.waiting_budget.push(c.id);
        }
    }

    /// Reinsert a connection taken out of the table, then deliver what was
    /// deferred meanwhile and look at it at the end of the turn.
    fn put_back(&mut self, mut c: Conn) {
        let id = c.id;
        self.dirty_mark(&mut c);
        self.conns.insert(id, c);
        for d in std::mem::take(&mut self.deferred) {
            self.deliver(d);
        }
    }

    fn dirty_mark(&mut self, c: &mut Conn) {
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(c.id);
        }
    }

    /// A request that named post record `post` is answered on the
    /// socket: say so in the record, so that its client reads the socket.
    fn post_on_socket(&mut self, c: &Conn, post: u32, id: u64) {
        if post == NO_POST {
            return;
        }
        if let Some(shm) = c.shm.as_ref().filter(|s| s.posts()) {
            if shm.post(post, id, None) {
                self.wakes.push((Arc::clone(shm), post));
            }
        }
    }

    /// Answer request `id` with an error on the socket, its post record
    /// (if it named one) saying so.
    fn error_on_socket(&mut self, c: &mut Conn, id: u64, post: u32, errno: i32, msg: String) {
        c.push(id, Out::Error(errno, msg), 0, &self.shared.reply_bytes);
        self.post_on_socket(c, post, id);
    }

    /// Write replies, fix epoll interest, drop finished connections, then
    /// wake the clients asleep on post records answered this turn.
    fn flush_dirty(&mut self) {
        let now = Instant::now();
        for id in std::mem::take(&mut self.dirty) {
            let Some(c) = self.conns.get_mut(&id) else { continue };
            c.dirty = false;
            c.flush(now, &self.shared.reply_bytes);
            let stalled = c.out_stalled.is_some();
            if c.finished() {
                self.remove(id);
                continue;
            }
            self.update_interest(id);
            if stalled {
                self.arm(now + Duration::from_secs(self.shared.config.limits.write_timeout_s));
            }
            // Replies drained below the bound, or the budget came back:
            // take in what waited, then read again.
            let max = self.shared.config.limits.reply_bytes_max;
            let resumable = self.conns.get(&id).is_some_and(|c| c.resume_pending || matches!(c.pause, Some(Pause::Bytes(need)) if c.held == 0 || c.held + need <= max));
            if resumable {
                let mut c = self.conns.remove(&id).expect("present");
                c.resume_pending = false;
                match c.pause {
                    Some(Pause::Bytes(_)) => c.pause = None,
                    Some(Pause::Budget(_)) => c.pause = None,
                    _ => {}
                }
                if c.pause.is_none() && !self.stopping {
                    self.resume(&mut c);
                }
                self.put_back(c);
            }
        }
        for (shm, k) in self.wakes.drain(..) {
            shm.wake(k);
        }
    }

    fn update_interest(&mut self, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        let want = c.desired_interest();
        if c.broken && c.registered {
            let _ = epoll_ctl(&self.epoll, libc::EPOLL_CTL_DEL, c.fd(), 0, id);
            c.registered = false;
            return;
        }
        if c.registered && want != c.interest && epoll_ctl(&self.epoll, libc::EPOLL_CTL_MOD, c.fd(), want, id).is_ok() {
            c.interest = want;
        }
    }

    // ---- input ---------------------------------------------------------

    fn on_conn(&mut self, id: u64, flags: u32) {
        let Some(mut c) = self.conns.remove(&id) else { return };
        if flags & (libc::EPOLLOUT as u32) != 0 {
            c.out_stalled = None;
        }
        if c.wants_input() {
            self.read_conn(&mut c);
        } else if flags & ((libc::EPOLLHUP | libc::EPOLLERR) as u32) != 0 {
            // Gone while not being read: nothing can reach it any more.
            c.break_output(&self.shared.reply_bytes);
        }
        self.put_back(c);
    }

    /// Read until the socket would block, the connection pauses, or its
    /// share of this wake-up is used.
    fn read_conn(&mut self, c: &mut Conn) {
        for _ in 0..READS_PER_WAKE {
            if !c.wants_input() {
                return;
            }
            let more = if matches!(c.rx, Rx::Body { .. }) { self.read_body(c) } else { self.read_frames(c) };
            if !more {
                return;
            }
        }
    }

    /// A receive without blocking: bytes, 0 at end of stream, `None` when
    /// it would block.
    fn recv(c: &mut Conn, buf: &mut [u8]) -> Option<io::Result<usize>> {
        loop {
            // SAFETY: buf is valid for its length during the call.
            let r = unsafe { libc::recv(c.fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if r >= 0 {
                return Some(Ok(r as usize));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return None,
                _ => return Some(Err(e)),
            }
        }
    }

    /// Between frames or inside a header: read into the scratch buffer (no
    /// more than the budget could hold of a partial frame) and take in
    /// every frame there. `false` when there is nothing more to read now.
    fn read_frames(&mut self, c: &mut Conn) -> bool {
        // Whole frames in the read need no budget; a partial one at its
        // end reserves its body, or waits in the stash (at most this read).
        let room = SCRATCH_BYTES;
        let mut scratch = std::mem::take(&mut self.scratch);
        let got = Self::recv(c, &mut scratch[..room]);
        let more = match got {
            None => false,
            Some(Ok(0)) => {
                self.end_of_stream(c);
                false
            }
            Some(Ok(n)) => {
                let used = self.feed(c, &scratch[..n]);
                if used < n {
                    c.stash.extend_from_slice(&scratch[used..n]);
                }
                n == room
            }
            Some(Err(_)) => {
                c.break_output(&self.shared.reply_bytes);
                false
            }
        };
        self.scratch = scratch;
        more
    }

    /// The client closed its side: inside a frame that is an error;
    /// between frames, replies still go out.
    fn end_of_stream(&mut self, c: &mut Conn) {
        match &c.rx {
            Rx::Idle => {}
            Rx::Head { .. } => self.fail(c, 0, libc::EPROTO, "truncated frame header".into()),
            Rx::Body { header, .. } => {
                let (id, n) = (header.request_id, header.body_len);
                self.fail(c, id, libc::EPROTO, format!("truncated frame body: the connection closed before its {n} bytes arrived"));
            }
        }
        self.abandon_frame(c);
        c.read_closed = true;
    }

    /// Answer `msg` and read no more from `c`.
    fn fail(&mut self, c: &mut Conn, wire_id: u64, errno: i32, msg: String) {
        c.push(wire_id, Out::Error(errno, msg), 0, &self.shared.reply_bytes);
        self.abandon_frame(c);
        c.read_closed = true;
    }

    /// Take in the frames in `bytes`; how many bytes were taken (the rest
    /// waits in the stash while the connection is paused).
    fn feed(&mut self, c: &mut Conn, bytes: &[u8]) -> usize {
        let mut i = 0;
        while i < bytes.len() && c.wants_input() {
            // The header: from an earlier read, or here.
            let (raw, started, from_head) = match &mut c.rx {
                Rx::Head { raw, got, started } => {
                    let n = (HEADER_BYTES - *got).min(bytes.len() - i);
                    raw[*got..*got + n].copy_from_slice(&bytes[i..i + n]);
                    *got += n;
                    i += n;
                    if *got < HEADER_BYTES {
                        return i;
                    }
                    (*raw, *started, true)
                }
                Rx::Idle if bytes.len() - i < HEADER_BYTES => {
                    let mut raw = [0u8; HEADER_BYTES];
                    let n = bytes.len() - i;
                    raw[..n].copy_from_slice(&bytes[i..]);
                    let now = Instant::now();
                    c.rx = Rx::Head { raw, got: n, started: now };
                    self.arm(now + Duration::from_millis(self.shared.config.limits.frame_stall_ms));
                    return bytes.len();
                }
                Rx::Idle => {
                    let raw: [u8; HEADER_BYTES] = bytes[i..i + HEADER_BYTES].try_into().expect("a whole header");
                    i += HEADER_BYTES;
                    (raw, Instant::now(), false)
                }
                Rx::Body { .. } => unreachable!("bodies are read by read_body"),
            };
            c.rx = Rx::Idle;
            let frame_start = i - HEADER_BYTES.min(i);
            let id = sluice_proto::request_id_of(&raw);
            // Before the handshake is done, only a handshake's size: a peer
            // that proved nothing reserves no large body.
            let frame_max = match c.phase {
                Phase::Ready => self.shared.config.limits.frame_bytes_max,
                _ => sluice_proto::HANDSHAKE_FRAME_BYTES_MAX.min(self.shared.config.limits.frame_bytes_max),
            };
            let header = match check_header(&raw, frame_max) {
                Ok(Some(h)) => h,
                Ok(None) => unreachable!("a whole header"),
                Err(e) => {
                    self.fail(c, id, e.errno(), e.to_string());
                    return bytes.len();
                }
            };
            let n = header.body_len as usize;
            if bytes.len() - i >= n {
                let body = &bytes[i..i + n];
                i += n;
                match self.frame(c, header, Cow::Borrowed(body)) {
                    Flow::Next => continue,
                    Flow::Paused => return i,
                    Flow::Close => return bytes.len(),
                }
            }
            // The body goes on past this read: hold it as it arrives.
            let tail = &bytes[i..];
            let wait_for_bytes = matches!(header.opcode, Opcode::Write | Opcode::WriteList | Opcode::WriteListGroup)
                && c.held > 0
                && c.held + u64::from(header.body_len) > self.shared.config.limits.reply_bytes_max;
            // The whole body is reserved now, allocated a chunk at a time.
            let first = n.min(BODY_CHUNK_BYTES).max(tail.len());
            let room = wait_for_bytes || !self.take_budget(n as u64);
            if room {
                // Not now: keep the frame's bytes (the header too) for later.
                if wait_for_bytes {
                    c.pause = Some(Pause::Bytes(u64::from(header.body_len)));
                } else {
                    self.pause_budget(c);
                }
                if from_head {
                    c.stash.extend_from_slice(&raw);
                    return i;
                }
                return frame_start;
            }
            let mut body = Vec::with_capacity(first);
            body.extend_from_slice(tail);
            self.allocated(body.capacity() as i64);
            let allowed = Duration::from_millis(self.shared.config.limits.frame_stall_ms + n as u64 / FRAME_RATE_MIN_BYTES_PER_MS);
            c.rx = Rx::Body { header, body, held: n as u64, started, allowed };
            self.arm(started + allowed);
            return bytes.len();
        }
        i
    }

    /// Inside a body: receive straight into it, chunk by chunk, each taken
    /// from the budget first. `false` when there is nothing more to read now.
    fn read_body(&mut self, c: &mut Conn) -> bool {
        let Rx::Body { header, body, .. } = &mut c.rx else { return false };
        let (n, len) = (header.body_len as usize, body.len());
        if len == body.capacity() && len < n {
            // The next chunk (its bytes were reserved with the header).
            let before = body.capacity();
            body.reserve_exact((n - len).min(BODY_CHUNK_BYTES));
            let grown = body.capacity() - before;
            self.allocated(grown as i64);
        }
        let fd = c.fd();
        let Rx::Body { body, .. } = &mut c.rx else { return false };
        let cap = body.capacity().min(n);
        if len < cap {
            // SAFETY: the spare capacity [len, cap) is allocated; recv
            // initialises the bytes it reports, and only those are kept.
            let r = unsafe { libc::recv(fd, body.as_mut_ptr().add(len).cast(), cap - len, libc::MSG_DONTWAIT) };
            if r > 0 {
                // SAFETY: recv wrote r bytes after len.
                unsafe { body.set_len(len + r as usize) };
            } else if r == 0 {
                self.end_of_stream(c);
                return false;
            } else {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => false,
                    io::ErrorKind::Interrupted => true,
                    _ => {
                        c.break_output(&self.shared.reply_bytes);
                        false
                    }
                };
            }
        }
        let Rx::Body { body, .. } = &c.rx else { return false };
        if body.len() < n {
            return true;
        }
        let Rx::Body { header, body, held, .. } = std::mem::replace(&mut c.rx, Rx::Idle) else { unreachable!() };
        self.allocated(-(body.capacity() as i64));
        self.give_budget(held);
        match self.frame(c, header, Cow::Owned(body)) {
            Flow::Next => true,
            Flow::Paused | Flow::Close => false,
        }
    }

    /// After a pause: the frame that waited, then the stash.
    fn resume(&mut self, c: &mut Conn) {
        if let Some((h, body)) = c.blocked.take() {
            if let Flow::Paused | Flow::Close = self.frame(c, h, Cow::Owned(body)) {
                return;
            }
        }
        let stash = std::mem::take(&mut c.stash);
        if !stash.is_empty() && c.wants_input() {
            let used = self.feed(c, &stash);
            c.stash.extend_from_slice(&stash[used..]);
        } else {
            c.stash = stash;
        }
        // Requests rung while it was paused (an unwatched doorbell's
        // client nudged once for them).
        self.take_rung(c);
    }

    // ---- doorbells (rung requests: `sluice_proto::post`) ---------------

    /// Whether the loop may take `c`'s rung requests now: a ready
    /// connection with a post area, taking input, nothing blocked.
    fn rings(&self, c: &Conn) -> bool {
        !self.stopping && matches!(c.phase, Phase::Ready) && c.wants_input() && c.blocked.is_none() && c.shm.as_ref().is_some_and(|s| s.posts())
    }

    /// Take the requests rung on `c`'s doorbell, each as if its frame had
    /// come on the socket (parsed and checked the same way), answered in
    /// its own record (or on the socket, as a sent one would be). Stops
    /// where the connection pauses; the bits not taken ring again (a
    /// paused connection is looked at again when it resumes).
    fn take_rung(&mut self, c: &mut Conn) -> Flow {
        use sluice_proto::post::{RUNG_READ, RUNG_READ_LEASE, RUNG_WRITE, RUNG_WRITE_LEASE};
        if !self.rings(c) {
            return Flow::Next;
        }
        let shm = Arc::clone(c.shm.as_ref().expect("rings() checked"));
        let mut bits = shm.take_rung();
        while bits != 0 {
            let k = bits.trailing_zeros();
            bits &= bits - 1;
            if k >= POSTS_MAX {
                // The doorbell's own bit names no record.
                continue;
            }
            let r = shm.rung_request(k);
            self.shared.rung.fetch_add(1, Ordering::Relaxed);
            let (fd, offset, len, at, post) = (r.fd, r.offset, r.len, r.at, k);
            let req = match r.op {
                RUNG_READ => Request::ReadShm { fd, offset, len, at, post },
                RUNG_WRITE => Request::WriteShm { fd, offset, len, at, post },
                RUNG_READ_LEASE => Request::ReadLease { fd, offset, len, at, post },
                RUNG_WRITE_LEASE => Request::WriteLease { fd, offset, len, at, post },
                op => {
                    let msg = format!("post record {k} rings with operation {op}, not one of {RUNG_READ}..={RUNG_WRITE_LEASE}");
                    self.error_on_socket(c, r.id, k, libc::EINVAL, msg);
                    continue;
                }
            };
            let mut wire = Vec::with_capacity(HEADER_BYTES + 32);
            encode_request(r.id, &req, &mut wire).expect("a shared-memory request always encodes");
            let h = check_header(&wire, u32::MAX).ok().flatten().expect("a header just encoded");
            wire.drain(..HEADER_BYTES);
            match self.frame(c, h, Cow::Owned(wire)) {
                Flow::Next => {}
                Flow::Paused => {
                    shm.ring_again(bits);
                    return Flow::Paused;
                }
                Flow::Close => return Flow::Close,
            }
        }
        Flow::Next
    }

    /// A `Nudge`: watch `c`'s doorbell from now on if there is room, and
    /// take what it rang.
    fn nudged(&mut self, c: &mut Conn) -> Flow {
        self.shared.nudges.fetch_add(1, Ordering::Relaxed);
        let Some(shm) = c.shm.as_ref().filter(|s| s.posts()) else { return Flow::Next };
        if !c.watched && self.watched.len() < self.shared.config.limits.doorbells_watched_max as usize && !self.stopping {
            shm.set_watched(true);
            c.watched = true;
            self.watched.push((c.id, Arc::clone(shm)));
            self.shared.doorbells_watched.store(self.watched.len(), Ordering::Relaxed);
        }
        self.take_rung(c)
    }

    /// Every turn: take the requests rung on the watched doorbells.
    fn scan_doorbells(&mut self) {
        for i in 0..self.watched.len() {
            let (id, ref shm) = self.watched[i];
            if !shm.rung() || !self.conns.get(&id).is_some_and(|c| self.rings(c)) {
                continue;
            }
            let mut c = self.conns.remove(&id).expect("present");
            self.take_rung(&mut c);
            self.put_back(c);
        }
    }

    /// Mark every watched doorbell watched or not.
    fn set_watched(&self, on: bool) {
        for (_, shm) in &self.watched {
            shm.set_watched(on);
        }
    }

    /// Before sleeping: mark the watched doorbells unwatched, then look at
    /// them once more. False (and watched again) when one was rung
    /// meanwhile: the loop must not sleep. A client that rings after
    /// this sees its doorbell unwatched and nudges.
    fn unwatch(&self) -> bool {
        self.set_watched(false);
        let rung = self.watched.iter().any(|(id, shm)| shm.rung() && self.conns.get(id).is_some_and(|c| self.rings(c)));
        if rung {
            self.set_watched(true);
        }
        !rung
    }

    // ---- frames ----------------------------------------------------------

    fn frame(&mut self, c: &mut Conn, h: Header, body: Cow<'_, [u8]>) -> Flow {
        c.last_frame = Instant::now();
        // Replies of every kind count against `reply_bytes_max`: past it
        // no frame is taken in until they drain (a client pipelining
        // requests whose answers it does not read holds no more).
        if c.held > self.shared.config.limits.reply_bytes_max {
            c.blocked = Some((h, body.into_owned()));
            c.pause = Some(Pause::Bytes(0));
            return Flow::Paused;
        }
        match c.phase {
            Phase::Hello => self.hello(c, h, body),
            Phase::Auth { .. } => self.auth(c, h, &body),
            Phase::Ready => self.request(c, h, body),
        }
    }

    fn refuse(&mut self, c: &mut Conn, wire_id: u64, errno: i32, msg: String) -> Flow {
        self.fail(c, wire_id, errno, msg);
        Flow::Close
    }

    /// The first frame must be a `Hello`; where the identity needs the key
    /// (`ident::needs_key`), a `Challenge` and its `Auth` come between.
    fn hello(&mut self, c: &mut Conn, h: Header, body: Cow<'_, [u8]>) -> Flow {
        let id = h.request_id;
        let hello = match parse_request(&h, &body) {
            Ok(Request::Hello(hello)) => hello,
            Ok(_) => return self.refuse(c, id, libc::EPROTO, "the first frame must be a Hello".into()),
            Err(e) => return self.refuse(c, id, e.errno(), e.to_string()),
        };
        if let Some(msg) = self.full() {
            return self.refuse(c, id, libc::EBUSY, msg);
        }
        let weight_max = self.shared.config.sched_limits.weight_max;
        if hello.weight > weight_max {
            let msg = format!("weight {} outside 0..={weight_max} (0: background)", hello.weight);
            return self.refuse(c, id, libc::EINVAL, msg);
        }
        let peer = c.peer.as_ref().ok().and_then(|p| p.as_ref());
        if ident::needs_key(peer, hello.cred.as_ref()) {
            if self.shared.key.is_none() {
                return self.refuse(c, id, libc::EACCES, "this server has no key: it accepts no TCP clients and no forwarded identities (see --key-file)".into());
            }
            let nonce = match sluice_net::key::random::<{ sluice_proto::AUTH_BYTES }>() {
                Ok(n) => n,
                Err(e) => return self.refuse(c, id, libc::EIO, format!("getrandom: {e}")),
            };
            c.push(id, Out::Challenge(nonce), 0, &self.shared.reply_bytes);
            c.phase = Phase::Auth { nonce, hello: (h, body.into_owned()) };
            return Flow::Next;
        }
        self.welcome(c, id, h, &body)
    }

    /// The `Auth` after a challenge: proven, the handshake completes and is
    /// answered on the `Auth` frame's request id.
    fn auth(&mut self, c: &mut Conn, h: Header, body: &[u8]) -> Flow {
        let Phase::Auth { nonce, hello } = std::mem::replace(&mut c.phase, Phase::Hello) else { unreachable!() };
        let id = h.request_id;
        let key = self.shared.key.expect("challenged only with a key");
        match parse_request(&h, body) {
            Ok(Request::Auth { mac }) if auth_verify(&key, &nonce, &hello.1, &mac) => self.welcome(c, id, hello.0, &hello.1),
            Ok(Request::Auth { .. }) => self.refuse(c, id, libc::EACCES, "authentication failed: the client's key is not this server's".into()),
            Ok(_) => self.refuse(c, id, libc::EACCES, "this server needs the key proven (an Auth frame) before any request".into()),
            Err(e) => self.refuse(c, id, e.errno(), e.to_string()),
        }
    }

    /// Complete the handshake of `hello` (already checked), answering on
    /// `answer_id`.
    fn welcome(&mut self, c: &mut Conn, answer_id: u64, h: Header, body: &[u8]) -> Flow {
        let Ok(Request::Hello(hello)) = parse_request(&h, body) else { unreachable!("parsed before") };
        // Checked again: others may have finished theirs since the Hello.
        if let Some(msg) = self.full() {
            return self.refuse(c, answer_id, libc::EBUSY, msg);
        }
        let peer = c.peer.as_ref().ok().and_then(|p| p.as_ref());
        let identity = match ident::identify(peer, hello.cred.as_ref(), self.shared.config.squash, self.shared.server_uid) {
            Ok(i) => i,
            Err(e) => return self.refuse(c, answer_id, e.errno, e.message),
        };
        let name = if hello.app.is_empty() { "anonymous" } else { hello.app };
        let connected = lock(&self.shared.apps).connect(name, hello.weight, self.shared.clock.now());
        let app = match connected {
            Ok(app) => app,
            Err(e) => return self.refuse(c, answer_id, e.errno, e.message),
        };
        self.disp.set_weight(app, hello.weight);
        c.app = Some(app);
        c.session = Some(Box::new(Session::new(app, ClientId(hello.client_id), identity)));
        c.phase = Phase::Ready;
        self.ready_conns += 1;
        let l = &self.shared.config.limits;
        let ok = HelloOk { version: VERSION, frame_bytes_max: l.frame_bytes_max, io_bytes_max: IO_BYTES_MAX, inflight_per_connection_max: l.inflight_per_connection_max };
        c.push(answer_id, Out::HelloOk(ok), 0, &self.shared.reply_bytes);
        self.arm(Instant::now() + Duration::from_secs(l.idle_timeout_s));
        Flow::Next
    }

    /// A frame after the handshake.
    fn request(&mut self, c: &mut Conn, h: Header, body: Cow<'_, [u8]>) -> Flow {
        /// What the frame asks for, once parsed.
        enum Kind {
            /// File handle, pieces, where a write's data starts in the
            /// body, where the data is in the shared region and the post
            /// record to answer in, the group.
            Io(u64, Vec<(u64, u64)>, Option<usize>, Option<(u64, u32)>, Option<Group>),
            Answered(Out),
            Attach(u64),
            Pool,
        }
        let id = h.request_id;
        let op = if matches!(h.opcode, Opcode::Write | Opcode::WriteList | Opcode::WriteListGroup | Opcode::WriteShm | Opcode::WriteLease) { Op::Write } else { Op::Read };
        let list = matches!(h.opcode, Opcode::ReadList | Opcode::WriteList | Opcode::ReadListGroup | Opcode::WriteListGroup);
        // A `ReadLease` not granted now: answered with a lease once its
        // dispatch has brought the range into the page cache (`admit`).
        let mut lease_after = false;
        let kind = {
            let req = match parse_request(&h, &body) {
                Ok(r) => r,
                Err(e) => return self.refuse(c, id, e.errno(), e.to_string()),
            };
            match req {
                Request::Hello(_) => return self.refuse(c, id, libc::EPROTO, "handshake already done".into()),
                Request::Read { fd, offset, len } => Kind::Io(fd, vec![(offset, u64::from(len))], None, None, None),
                Request::ReadList { fd, pieces, group } => Kind::Io(fd, pieces, None, None, group),
                Request::Write { fd, offset, data } => Kind::Io(fd, vec![(offset, data.len() as u64)], Some(body.len() - data.len()), None, None),
                Request::WriteList { fd, pieces, data, group } => Kind::Io(fd, pieces, Some(body.len() - data.len()), None, group),
                Request::ReadShm { fd, offset, len, at, post } | Request::WriteShm { fd, offset, len, at, post } => {
                    Kind::Io(fd, vec![(offset, u64::from(len))], None, Some((at, post)), None)
                }
                Request::ReadLease { fd, offset, len, at, post } => {
                    if self.lease(c, id, fd, offset, len, Op::Read) {
                        self.post_on_socket(c, post, id);
                        return Flow::Next;
                    }
                    lease_after = self.leases_here(c) && u64::from(len) >= crate::lease::SHORT_BYTES_MIN;
                    Kind::Io(fd, vec![(offset, u64::from(len))], None, Some((at, post)), None)
                }
                Request::WriteLease { fd, offset, len, at, post } => {
                    if self.lease(c, id, fd, offset, len, Op::Write) {
                        self.post_on_socket(c, post, id);
                        return Flow::Next;
                    }
                    if at == LEASE_ONLY_AT {
                        // Asked without its data: refused, nothing to write.
                        let (errno, msg) = if self.grants_write_leases(c) {
                            (libc::EAGAIN, "no write lease for this handle: send the write")
                        } else {
                            (libc::EOPNOTSUPP, "this server grants no write leases: send the write")
                        };
                        self.error_on_socket(c, id, post, errno, msg.into());
                        return Flow::Next;
                    }
                    Kind::Io(fd, vec![(offset, u64::from(len))], None, Some((at, post)), None)
                }
                Request::ShmAttach { bytes } => Kind::Attach(bytes),
                Request::Nudge => return self.nudged(c),
                other if runs_inline(&other) => {
                    if matches!(other, Request::Stats) {
                        fold_leased(&self.shared, c);
                        self.fold_leased_all();
                    }
                    let session = c.session.as_mut().expect("a ready connection holds its session");
                    Kind::Answered(session.metadata(&self.shared, other).unwrap_or_else(|e| Out::Error(e.errno, e.message)))
                }
                other => {
                    drop(other);
                    Kind::Pool
                }
            }
        };
        let (fd, pieces, data_at, shm_at, group) = match kind {
            Kind::Io(fd, pieces, data_at, shm_at, group) => (fd, pieces, data_at, shm_at, group),
            Kind::Answered(out) => {
                c.push(id, out, 0, &self.shared.reply_bytes);
                return Flow::Next;
            }
            Kind::Attach(bytes) => {
                if let Err((errno, msg)) = self.attach(c, id, bytes) {
                    c.push(id, Out::Error(errno, msg), 0, &self.shared.reply_bytes);
                }
                return Flow::Next;
            }
            Kind::Pool => {
                let session = c.session.take().expect("a ready connection holds its session");
                let job = MetaJob { conn: c.id, session, header: h, body: body.into_owned() };
                let workers = self.workers.as_ref().expect("workers live while the loop runs");
                if let Err(e) = workers.meta.send(job) {
                    c.session = Some(e.0.session);
                    return self.refuse(c, id, libc::EIO, "the metadata pool is gone".into());
                }
                self.meta_out += 1;
                c.pause = Some(Pause::Meta);
                return Flow::Paused;
            }
        };
        let total: u64 = pieces.iter().map(|p| p.1).sum();
        // Data in the shared region never passes the socket: only the
        // reply frame is reserved.
        let reserve = REPLY_FRAME_BYTES + if shm_at.is_some() { 0 } else { total };
        let max = self.shared.config.limits.reply_bytes_max;
        if c.held > 0 && c.held + reserve > max {
            c.blocked = Some((h, body.into_owned()));
            c.pause = Some(Pause::Bytes(reserve));
            return Flow::Paused;
        }
        let post = shm_at.map_or(NO_POST, |(_, post)| post);
        let place = match shm_at {
            Some((at, post)) => match &c.shm {
                Some(shm) if post != NO_POST && !shm.posts() => {
                    let msg = format!("post record {post} on a shared region of {} bytes, too small for a post area", shm.len());
                    c.push(id, Out::Error(libc::EINVAL, msg), 0, &self.shared.reply_bytes);
                    return Flow::Next;
                }
                Some(shm) if shm.holds(at, total) => Place::Shm(Arc::clone(shm), at, post),
                Some(shm) => {
                    let msg = format!("region range {at}+{total} outside the shared region of {} bytes", shm.len());
                    self.error_on_socket(c, id, post, libc::EINVAL, msg);
                    return Flow::Next;
                }
                None => {
                    c.push(id, Out::Error(libc::EINVAL, "no shared-memory region on this connection (ShmAttach first)".into()), 0, &self.shared.reply_bytes);
                    return Flow::Next;
                }
            },
            None => match data_at {
                Some(at) => Place::Body(Arc::new(body.into_owned()), at),
                None => Place::Reply,
            },
        };
        if let Err((errno, msg)) = self.admit(c, id, fd, op, list || group.is_some(), pieces, total, place, group, lease_after) {
            self.error_on_socket(c, id, post, errno, msg);
        }
        Flow::Next
    }

    /// Admit a read or write message: one core request per non-empty piece,
    /// into the scheduler, or held with its collective until the group is
    /// complete (`collective.rs`).
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &mut self,
        c: &mut Conn,
        wire_id: u64,
        fd: u64,
        op: Op,
        list: bool,
        pieces: Vec<(u64, u64)>,
        total: u64,
        place: Place,
        group: Option<Group>,
        lease_after: bool,
    ) -> Result<(), (i32, String)> {
        let max = self.shared.config.limits.inflight_per_connection_max;
        if c.inflight >= max {
            return Err((libc::EAGAIN, format!("too many requests in flight on this connection (inflight_per_connection_max = {max})")));
        }
        let session = c.session.as_ref().expect("a ready connection holds its session");
        let file = Arc::clone(session.file(fd).map_err(|e| (e.errno, e.message))?);
        let need = if op == Op::Write { libc::O_WRONLY } else { libc::O_RDONLY };
        if file.access != libc::O_RDWR && file.access != need {
            return Err((libc::EBADF, format!("file handle {fd} is not open for {}", if op == Op::Write { "writing" } else { "reading" })));
        }
        let (app, client) = (session.app, session.client);
        let held_bytes = if op == Op::Write { total } else { 0 };
        if let Some(g) = &group {
            self.collectives.check((file.id, g.id), g, op, held_bytes, (self.ready.len(), self.ready_write_bytes))?;
        }
        let reserved = REPLY_FRAME_BYTES + if matches!(place, Place::Shm(..)) { 0 } else { total };
        let post = match &place {
            Place::Shm(shm, _, post) if *post != NO_POST => Some((Arc::clone(shm), *post)),
            _ => None,
        };
        c.take(reserved, &self.shared.reply_bytes);
        c.inflight += 1;
        let mut at = 0usize;
        let live: Vec<(usize, u64, u64)> = pieces
            .iter()
            .map(|&(o, l)| {
                let p = (at, o, l);
                at += l as usize;
                p
            })
            .filter(|p| p.2 > 0)
            .collect();
        let list = (list || live.is_empty()).then(|| {
            let bytes = if op == Op::Read { vec![0u8; total as usize] } else { Vec::new() };
            let inner = ListInner { remaining: live.len(), data: bytes, bytes: 0, error: None };
            // Shared-memory messages, like writes, answer with a count.
            let count = op == Op::Write || matches!(place, Place::Shm(..));
            Arc::new(ListState { conn: c.id, wire_id, counts: count, reserved, post: post.clone(), inner: std::sync::Mutex::new(inner) })
        });
        let empty = live.is_empty();
        if empty {
            let list = list.as_ref().expect("built for an empty message");
            let d = list.reply_now(&mut lock(&list.inner));
            self.deferred.push(d);
        }
        let now = self.shared.clock.now();
        let mut items = Vec::with_capacity(live.len());
        for (pos, offset, len) in live {
            let id = RequestId(self.request_next);
            self.request_next += 1;
            let req = CoreRequest { id, app, client, file: file.id, op, offset, len };
            let buf = match &place {
                Place::Body(body, at) => Buf::Write(Arc::clone(body), at + pos, len as usize),
                Place::Shm(shm, at, _) => Buf::Shm(Arc::clone(shm), *at as usize + pos, len as usize, op == Op::Write),
                Place::Reply => Buf::Read(vec![0u8; len as usize]),
            };
            let reply = match &list {
                Some(l) => Reply::Piece(Arc::clone(l), pos),
                None => Reply::Single(c.id, wire_id, reserved, post.clone()),
            };
            // Only for what `lease` would lease: a read-only handle of a
            // regular file (`lease_after` says the rest).
            let lease_after = (lease_after && op == Op::Read && list.is_none() && file.regular && file.access == libc::O_RDONLY)
                .then_some(LeaseAfter { handle: fd, valid_us: self.shared.config.limits.lease_valid_us });
            items.push(Pending { req, file: Arc::clone(&file), buf, arrival_ns: now, reply, result: Ok(0), lease_after, populated: false });
        }
        let items = match group {
            None => items,
            // Held until the group is complete; then every participant's
            // pieces enter together, in disk order, as one application's.
            Some(g) => match self.collectives.join(Arrival { key: (file.id, g.id), group: g, op, app, items, bytes: held_bytes }, Instant::now()) {
                Joined::Waiting(deadline) => {
                    self.arm(deadline);
                    return Ok(());
                }
                Joined::Complete { app, mut items } => {
                    items.sort_unstable_by_key(|p| p.req.offset);
                    for p in &mut items {
                        p.req.app = app;
                    }
                    if op == Op::Write {
                        self.ready_write_bytes += items.iter().map(|p| p.req.len).sum::<u64>();
                    }
                    self.ready.push_back(items);
                    self.release_ready();
                    return Ok(());
                }
            },
        };
        if empty && items.is_empty() {
            return Ok(());
        }
        for p in items {
            if let Some(d) = self.disp.submit(p, now) {
                self.deferred.push(d);
            }
        }
        Ok(())
    }

    /// Answer a `ReadLease` or (`op` a write) a `WriteLease` with a lease,
    /// lending the handle's descriptor with its first one (`lease.rs`);
    /// false: the request goes through the scheduler as a `ReadShm` or
    /// `WriteShm`. Never with leases off, on O_DIRECT or an emulated
    /// device (which must see every access), but for a regular file, or
    /// for a bad handle (which that path answers).
    /// - A read: on a read-only handle, when its range is in the page
    ///   cache (`lease::grant`).
    /// - A write (only with `ServerConfig::write_leases`): on a writable
    ///   handle, over the whole file (`[0, u64::MAX)`) for
    ///   `write_lease_valid_us` (the server never opens with O_APPEND,
    ///   `ops::OPEN_FLAGS_ALLOWED`, so a lent descriptor's `pwrite` lands
    ///   at its offset; the client asks for no write lease on its own
    ///   O_APPEND handles). A buffered write only copies into the page
    ///   cache, and what the device pays comes with the kernel's
    ///   write-back, which no order of those copies changes: there is no
    ///   range to check, so a narrower lease would only make a writer ask
    ///   again (a cyclic writer's pieces lie far apart).
    fn lease(&mut self, c: &mut Conn, wire_id: u64, fd: u64, offset: u64, len: u32, op: Op) -> bool {
        let (l, cfg) = (&self.shared.config.limits, &self.shared.config);
        if !self.leases_here(c) {
            return false;
        }
        if op == Op::Write {
            // What the client wrote under its last lease counts now.
            fold_leased(&self.shared, c);
        }
        let session = c.session.as_mut().expect("a ready connection holds its session");
        let Ok(file) = session.file(fd) else { return false };
        if !file.regular {
            return false;
        }
        // The span granted, and the bytes counted as leased.
        let (start, granted, counted, valid) = match op {
            Op::Read => {
                if file.access != libc::O_RDONLY {
                    return false;
                }
                let (now, fresh) = (Instant::now(), Duration::from_micros(u64::from(l.lease_valid_us) / 2));
                let found = self.verified.lookup(file.id, offset, u64::from(len), l.lease_bytes_max, now, fresh).or_else(|| {
                    let g = crate::lease::grant(file.fd.as_raw_fd(), offset, u64::from(len), l.lease_bytes_max);
                    if let Some(g) = g {
                        self.verified.record(file.id, offset, g, now, fresh);
                    }
                    g
                });
                let Some((granted, in_file)) = found else { return false };
                // A lease no longer than a small request saves nothing: the
                // client would still make one round trip per read, and then
                // a `pread` of its own; the loop reads it as cheaply
                // (`lease::SHORT_BYTES_MIN`). Except the handle's first,
                // which lends the descriptor (the FUSE mount's passthrough
                // asks for it with a 4 KiB read).
                if granted <= u64::from(len) && u64::from(len) < crate::lease::SHORT_BYTES_MIN && session.lent.contains(&fd) {
                    return false;
                }
                (offset, granted, in_file, l.lease_valid_us)
            }
            Op::Write => {
                if !cfg.write_leases || len == 0 || file.access == libc::O_RDONLY {
                    return false;
                }
                // Counted: the write that asked (what the client writes
                // under the lease reaches `bytes_written`, `fold_leased`).
                (0, u64::MAX, u64::from(len), l.write_lease_valid_us)
            }
        };
        let Ok(lend) = session.lend(fd) else { return false };
        lock(&self.shared.apps).record_lease(session.app, counted);
        let out = Out::Lease(start, granted, valid, lend.is_some());
        c.push_with(wire_id, out, 0, &self.shared.reply_bytes, lend);
        true
    }

    /// Whether this server leases anything to connection `c`: leases on,
    /// the page cache in use (not O_DIRECT, not an emulated device, which
    /// must see every access), a client on this host.
    fn leases_here(&self, c: &Conn) -> bool {
        let cfg = &self.shared.config;
        cfg.limits.lease_bytes_max != 0 && !cfg.direct && cfg.device == crate::DeviceKind::Real && matches!(c.stream, crate::net::Stream::Unix(_))
    }

    /// Whether this server grants `c` write leases at all (the handle
    /// aside).
    fn grants_write_leases(&self, c: &Conn) -> bool {
        self.shared.config.write_leases && self.leases_here(c)
    }

    /// `ShmAttach`: map a region for this connection's data and send its
    /// descriptor with the answer (`shm.rs`).
    fn attach(&mut self, c: &mut Conn, wire_id: u64, bytes: u64) -> Result<(), (i32, String)> {
        let l = &self.shared.config.limits;
        if !matches!(c.stream, crate::net::Stream::Unix(_)) {
            return Err((libc::EOPNOTSUPP, "shared memory needs a Unix socket: the client must be on the server's host".into()));
        }
        if c.shm.is_some() {
            return Err((libc::EEXIST, "this connection already has a shared-memory region".into()));
        }
        let want = bytes.min(l.shm_bytes_max);
        if want == 0 {
            return Err((libc::EINVAL, "a shared-memory region needs at least one byte".into()));
        }
        let left = l.shm_total_bytes_max.saturating_sub(self.shared.shm_bytes.load(Ordering::Relaxed));
        let Some(grant) = crate::shm::taper(want, left, l.shm_taper_shares) else {
            self.shared.shm_refused.fetch_add(1, Ordering::Relaxed);
            return Err((libc::ENOMEM, format!("shared-memory regions are at their bound (shm_total_bytes_max = {})", l.shm_total_bytes_max)));
        };
        if grant < want {
            self.shared.shm_tapered.fetch_add(1, Ordering::Relaxed);
        }
        let (shm, fd) =
            crate::shm::Shm::create(grant as usize, &self.shared.shm_bytes).map_err(|e| (e.raw_os_error().unwrap_or(libc::EIO), format!("shared-memory region: {e}")))?;
        c.shm = Some(Arc::new(shm));
        c.push_with(wire_id, Out::Count(grant), 0, &self.shared.reply_bytes, Some(fd));
        Ok(())
    }

    // ---- output ----------------------------------------------------------

    /// Queue an answered message on its connection (dropped when the
    /// connection is gone).
    fn deliver(&mut self, mut d: Delivery) {
        let Some(c) = self.conns.get_mut(&d.conn) else { return };
        c.inflight -= 1;
        // A lease answered after its dispatch populated the page cache: the
        // handle's descriptor goes with its first lease, as in `lease`. A
        // handle closed meanwhile lends nothing (the client then reads
        // through the server).
        let mut lend = None;
        if let (Some(handle), Out::Lease(.., lent)) = (d.lend, &mut d.out) {
            lend = c.session.as_mut().and_then(|s| s.lend(handle).ok().flatten());
            *lent = lend.is_some();
        }
        match (d.post, d.out) {
            // Answered in the region: no frame. The connection is still
            // marked dirty so that a pause on its reply bytes is lifted.
            (Some((shm, k)), Out::Count(n)) if !c.broken => {
                c.give(d.reserved, &self.shared.reply_bytes);
                if shm.post(k, d.wire_id, Some(n)) {
                    self.wakes.push((shm, k));
                }
            }
            (post, out) => {
                c.push_with(d.wire_id, out, d.reserved, &self.shared.reply_bytes, lend);
                if let Some((shm, k)) = post {
                    if shm.post(k, d.wire_id, None) {
                        self.wakes.push((shm, k));
                    }
                }
            }
        }
        if !c.dirty {
            c.dirty = true;
            self.dirty.push(d.conn);
        }
        if c.inflight == 0 && c.ready() {
            let idle = Instant::now() + Duration::from_secs(self.shared.config.limits.idle_timeout_s);
            self.arm(idle);
        }
    }

    // ---- the scheduler ---------------------------------------------------

    /// Take back finished jobs and metadata calls.
    fn take_back(&mut self) {
        let Some(w) = self.workers.as_ref() else { return };
        let done: Vec<Job> = w.done.try_iter().collect();
        let meta: Vec<MetaDone> = w.meta_done.try_iter().collect();
        let now = self.shared.clock.now();
        for job in done {
            self.exec_out -= 1;
            for d in self.disp.done(job, now) {
                self.deliver(d);
            }
        }
        if let Some(ring) = self.ring.as_mut() {
            let mut reaped = std::mem::take(&mut self.ring_reaped);
            ring.reap(&mut reaped);
            for r in reaped.drain(..) {
                match r {
                    Reaped::Done(mut job) => {
                        self.exec_out -= 1;
                        job.service_ns = now.saturating_sub(job.started);
                        for d in self.disp.done(job, now) {
                            self.deliver(d);
                        }
                    }
                    // Short or failed: a worker does it again, whole (it
                    // stays counted in `exec_out`).
                    Reaped::Redo(job) => {
                        self.exec_out -= 1;
                        self.send_to_worker(job, now);
                    }
                }
            }
            self.ring_reaped = reaped;
        }
        for m in meta {
            self.meta_out -= 1;
            let Some(mut c) = self.conns.remove(&m.conn) else { continue };
            c.session = Some(m.session);
            c.pause = None;
            c.push(m.wire_id, m.out, 0, &self.shared.reply_bytes);
            c.last_frame = Instant::now();
            if !self.stopping {
                self.resume(&mut c);
            }
            self.put_back(c);
        }
    }

    /// One scheduler pass: every dispatch the policy allows now, carried out
    /// here when the page cache has it, otherwise by a worker. The
    /// scheduler's wake-up time, if it asked to wait.
    fn pump(&mut self) -> Option<u64> {
        let mut now = self.shared.clock.now();
        loop {
            match self.disp.next(now) {
                Ok(mut job) => {
                    // Reads to answer with leases: cached already, settled
                    // here; else populated by a worker (not the ring, whose
                    // reads move data).
                    let populate = job.populate && self.inline;
                    if self.inline && if populate { populated_already(&mut job) } else { try_nowait(&mut job) } {
                        let done = self.shared.clock.now();
                        job.started = now;
                        job.service_ns = done.saturating_sub(now);
                        now = done;
                        for d in self.disp.done(job, now) {
                            self.deliver(d);
                        }
                        continue;
                    }
                    if populate {
                        self.send_to_worker(job, now);
                        continue;
                    }
                    let job = match self.ring.as_mut() {
                        Some(ring) => {
                            job.started = now;
                            self.spin_short = self.disp.predicted_ns(job.dispatch.len) <= SPIN_DISPATCH_NS;
                            match ring.push(job) {
                                Ok(()) => {
                                    self.exec_out += 1;
                                    continue;
                                }
                                Err(job) => job,
                            }
                        }
                        None => job,
                    };
                    self.send_to_worker(job, now);
                }
                Err(wake) => {
                    if let Some(ring) = self.ring.as_mut() {
                        // One system call for the pass's submissions; on
                        // failure they stay queued (`timeout_ms`).
                        let _ = ring.flush();
                    }
                    return wake;
                }
            }
        }
    }

    /// Hand `job` to an executor worker (all of them gone: fail it).
    fn send_to_worker(&mut self, job: Job, now: u64) {
        let workers = self.workers.as_ref().expect("workers live while the loop runs");
        match workers.jobs.send(job) {
            Ok(()) => self.exec_out += 1,
            Err(e) => {
                let mut job = e.0;
                job.items.iter_mut().for_each(|it| it.result = Err(libc::EIO));
                for d in self.disp.done(job, now) {
                    self.deliver(d);
                }
            }
        }
    }

    // ---- time ------------------------------------------------------------

    /// Enforce every connection's deadline; find the next one.
    fn sweep(&mut self) {
        let now = Instant::now();
        // First, so that a connection whose last message expired here gets
        // its idle deadline from the loop below.
        self.expire_collectives(Some(now));
        let l = self.shared.config.limits.clone();
        let (handshake, idle, stall, write) =
            (Duration::from_millis(l.handshake_timeout_ms), Duration::from_secs(l.idle_timeout_s), Duration::from_millis(l.frame_stall_ms), Duration::from_secs(l.write_timeout_s));
        let mut next: Option<Instant> = None;
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            let mut c = self.conns.remove(&id).expect("listed");
            let mut due: Vec<Instant> = Vec::new();
            if let Some(since) = c.out_stalled {
                if now >= since + write {
                    c.break_output(&self.shared.reply_bytes);
                } else {
                    due.push(since + write);
                }
            }
            if !c.read_closed && !c.broken {
                match &c.rx {
                    Rx::Head { started, .. } if now >= *started + stall => {
                        self.fail(&mut c, 0, libc::ETIMEDOUT, format!("frame header stalled (frame_stall_ms = {})", l.frame_stall_ms))
                    }
                    Rx::Head { started, .. } => due.push(*started + stall),
                    Rx::Body { header, body, started, allowed, .. } if now >= *started + *allowed => {
                        let (wid, n, got) = (header.request_id, header.body_len, body.len());
                        self.fail(&mut c, wid, libc::ETIMEDOUT, format!("frame body stalled: {got} of {n} bytes in time (frame_stall_ms = {}, then 1 MiB/s)", l.frame_stall_ms));
                    }
                    Rx::Body { started, allowed, .. } => due.push(*started + *allowed),
                    Rx::Idle if !c.ready() => {
                        if now >= c.accepted + handshake {
                            self.fail(&mut c, 0, libc::ETIMEDOUT, format!("handshake not completed in time (handshake_timeout_ms = {})", l.handshake_timeout_ms));
                        } else {
                            due.push(c.accepted + handshake);
                        }
                    }
                    Rx::Idle if c.inflight == 0 && c.pause.is_none() && c.stash.is_empty() && c.blocked.is_none() => {
                        if now >= c.last_frame + idle {
                            // Idle: closed without a word (clients reconnect).
                            c.read_closed = true;
                        } else {
                            due.push(c.last_frame + idle);
                        }
                    }
                    Rx::Idle => {}
                }
                if c.pause.is_some() || c.resume_pending {
                    // Looked at again while paused: when the pause ends the
                    // idle or stall deadline applies again.
                    due.push(now + stall.min(idle));
                }
                if !c.ready() && !c.read_closed && matches!(c.rx, Rx::Head { .. } | Rx::Body { .. }) {
                    if now >= c.accepted + handshake {
                        self.fail(&mut c, 0, libc::ETIMEDOUT, format!("handshake not completed in time (handshake_timeout_ms = {})", l.handshake_timeout_ms));
                    } else {
                        due.push(c.accepted + handshake);
                    }
                }
            }
            if let Some(d) = due.into_iter().min() {
                next = Some(next.map_or(d, |n: Instant| n.min(d)));
            }
            self.put_back(c);
        }
        if let Some(d) = self.collectives.next_deadline() {
            next = Some(next.map_or(d, |n: Instant| n.min(d)));
        }
        self.next_sweep = next;
    }

    /// Admit complete collectives, oldest first, each whole and only when
    /// the scheduler's queue has room for all of it (its dispatches make
    /// room); one larger than the queue itself is refused (E2BIG).
    fn release_ready(&mut self) {
        let (cap_requests, cap_bytes) = self.disp.capacity();
        while let Some(items) = self.ready.front() {
            let (n, bytes) = (items.len() as u64, items.iter().map(|p| p.req.len).sum::<u64>());
            let write_bytes = if items.first().is_some_and(|p| p.req.op == Op::Write) { bytes } else { 0 };
            if n > cap_requests || bytes > cap_bytes {
                let items = self.ready.pop_front().expect("looked at");
                self.ready_write_bytes -= write_bytes;
                let msg = format!("a collective of {n} pieces and {bytes} bytes exceeds the scheduler's queue ({cap_requests} requests, {cap_bytes} bytes)");
                for p in items {
                    if let Some(d) = p.answer_with(Err((libc::E2BIG, msg.clone()))) {
                        self.deferred.push(d);
                    }
                }
                continue;
            }
            let (room_requests, room_bytes) = self.disp.room();
            if n > room_requests || bytes > room_bytes {
                return;
            }
            let items = self.ready.pop_front().expect("looked at");
            self.ready_write_bytes -= write_bytes;
            let now = self.shared.clock.now();
            for mut p in items {
                p.arrival_ns = now;
                if let Some(d) = self.disp.submit(p, now) {
                    self.deferred.push(d);
                }
            }
        }
    }

    /// Answer every participant of each collective past its deadline (all
    /// of them with `None`, at a stop) with an error; none of it was
    /// carried out.
    fn expire_collectives(&mut self, now: Option<Instant>) {
        for e in self.collectives.expire(now) {
            let (errno, msg) = match now {
                Some(_) => (libc::ETIMEDOUT, format!("collective {}: {} of {} participants arrived in time; nothing was done", e.id, e.arrived, e.participants)),
                None => (libc::ECANCELED, format!("collective {}: the server is stopping; nothing was done", e.id)),
            };
            for p in e.items {
                if let Some(d) = p.answer_with(Err((errno, msg.clone()))) {
                    self.deliver(d);
                }
            }
        }
    }

    /// The drain: accept nothing more, read nothing more (a partial frame
    /// is dropped unacknowledged), close connections still in their
    /// handshake; everything admitted is still carried out and answered.
    fn begin_stop(&mut self) {
        self.stopping = true;
        if let Some(l) = self.listener.take() {
            let _ = epoll_ctl(&self.epoll, libc::EPOLL_CTL_DEL, l.fd(), 0, TOKEN_LISTENER);
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
            if c.pause != Some(Pause::Meta) {
                c.pause = None;
            }
            self.put_back(c);
        }
        self.waiting_budget.clear();
        // Rung requests are no longer taken: their clients nudge, and are
        // answered when the drain closes their connections.
        self.set_watched(false);
        for (id, _) in std::mem::take(&mut self.watched) {
            if let Some(c) = self.conns.get_mut(&id) {
                c.watched = false;
            }
        }
        self.shared.doorbells_watched.store(0, Ordering::Relaxed);
        self.expire_collectives(None);
    }
}

/// Tell a socket that is not kept why, under request id 0, without
/// waiting (what its buffer does not take is lost; it is closed next).
fn send_reason(stream: &crate::net::Stream, errno: i32, msg: &str) {
    let mut out = Vec::new();
    sluice_proto::encode_response(0, &sluice_proto::Response::Error { errno, message: msg }, &mut out);
    let _ = stream.send_nonblocking(&out);
}

#[cfg(test)]
mod spin_tests {
    use super::{SpinCredit, SPIN_CREDIT_MAX, SPIN_RETRY};

    #[test]
    fn spinning_stops_after_spin_credit_max_vain_spins_and_retries_every_spin_retry_sleeps() {
        let mut s = SpinCredit::default();
        // N vain spins are allowed; after them, none ...
        for _ in 0..SPIN_CREDIT_MAX {
            assert!(s.may_spin());
            s.paid(false);
        }
        // ... for SPIN_RETRY - 1 sleeps, then one try.
        for _ in 0..SPIN_RETRY - 1 {
            assert!(!s.may_spin());
        }
        assert!(s.may_spin(), "the retry");
        // A spin that saw something earns the next one back.
        s.paid(true);
        assert!(s.may_spin());
        s.paid(false);
        assert!(!s.may_spin(), "credit spent again");
        // Credit is bounded: any number of good spins buys SPIN_CREDIT_MAX vain ones.
        let mut s = SpinCredit::default();
        for _ in 0..100 {
            s.paid(true);
        }
        for _ in 0..SPIN_CREDIT_MAX {
            assert!(s.may_spin());
            s.paid(false);
        }
        assert!(!s.may_spin());
    }
}
