//! The server's configuration: where it listens, what it serves, and every
//! bound it enforces, each with its unit and the reason for its default.

use std::path::PathBuf;

use sluice_core::{Limits, PolicyConfig};

use crate::error::{Error, Result};
use crate::ident::Squash;

/// Dispatches in flight to the backing store by default. 2: one dispatch
/// on the device and one ready behind it, so the device never idles during
/// the completion-to-next-dispatch hand-off (two thread wake-ups, ~20 us),
/// while every other request waits in the scheduler, where the policy can
/// still reorder and aggregate it. A deep device queue would take those
/// decisions away from the policy (aIOLi sat above a shallow queue too).
pub const QUEUE_DEPTH_DEFAULT: u32 = 8;
/// Most dispatches in flight that `--queue-depth` accepts (one worker
/// thread each).
pub const QUEUE_DEPTH_MAX: u32 = 64;
/// Longest `sqpoll_idle_ms` accepted: the kernel's polling thread spins
/// at most this long (1 s) without a submission before it sleeps.
pub const SQPOLL_IDLE_MS_MAX: u32 = 1_000;
/// O_DIRECT alignment of offsets, lengths and buffers, in bytes. 4096
/// covers every logical block size in use (512 and 4096).
pub const DIRECT_ALIGN_BYTES: usize = 4096;

pub use sluice_net::Listen;

/// Which device the dispatches run against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    /// The backing file system, as fast as it is.
    Real,
    /// The real file system, but each dispatch completes no sooner than a
    /// 7200 rpm disk would serve it (`sluice_device::Hdd::hdd7200`).
    Hdd7200,
    /// No device: the event loop completes every read and write at once
    /// without touching a disk (a read returns zeros of the asked length,
    /// a write reports its length). What the server itself costs per
    /// request, with nothing underneath (`sluice bench service --device
    /// null`).
    Null,
}

impl DeviceKind {
    pub fn parse(s: &str) -> Result<DeviceKind> {
        match s {
            "real" => Ok(DeviceKind::Real),
            "hdd7200" => Ok(DeviceKind::Hdd7200),
            "null" => Ok(DeviceKind::Null),
            _ => Err(Error::config(format!("unknown device {s:?} (known: real, hdd7200, null)"))),
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Real => "real",
            DeviceKind::Hdd7200 => "hdd7200",
            DeviceKind::Null => "null",
        }
    }
}

/// Bounds of the server itself (the scheduler's are in `Limits`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections at once (`sluice serve --clients-max`). 1024 by
    /// default; a connection costs a descriptor and about 2 KiB, no
    /// thread (`sluice bench connections`). A silent connection
    /// holds a slot at most `handshake_timeout_ms` before its handshake and
    /// `idle_timeout_s` after it. As many more are kept until their `Hello`,
    /// to be answered EBUSY; a socket past twice `clients_max` is answered
    /// EBUSY and closed at once.
    pub clients_max: u32,
    /// Of `clients_max`, the slots only root and the server's own user may
    /// take: another user finds the table full this many slots early (at
    /// most `clients_max` - 1: other users keep one). 16: an operator's
    /// `sluice ls` and a mount always find room.
    pub clients_reserved: u32,
    /// Connections one user (by uid, after squash) may hold at once; one
    /// more is refused EBUSY. Root and the server's user have no such
    /// limit. 512, half of `clients_max`: a node's ranks, twice over,
    /// and never the whole table (`evloop/fair.rs`).
    pub conns_per_uid_max: u32,
    /// Bytes one user's connections may hold together: admitted reads and
    /// writes, replies not yet read, and frames being received. Past it
    /// that user's connections are not read until bytes drain
    /// (backpressure). Root and the server's user have no such limit.
    /// 512 MiB: half of `held_bytes_max`, so one user never holds it all.
    pub uid_bytes_max: u64,
    /// Bytes held for all clients together: admitted reads and writes
    /// (collectives' data among them), replies not yet read, and frames
    /// being received. Past it no connection takes more until bytes drain.
    /// 1 GiB. Shared-memory regions are bounded apart
    /// (`shm_total_bytes_max`): their pages are the clients' as much as
    /// the server's, and are charged as touched.
    pub held_bytes_max: u64,
    /// Largest frame a client may send, header included, in bytes.
    pub frame_bytes_max: u32,
    /// Reads and writes a connection may have in flight; past it a request
    /// is answered EAGAIN. 256 x 1 MiB bounds one client's pinned memory.
    pub inflight_per_connection_max: u32,
    /// Open files per connection; past it `open` fails with EMFILE.
    pub fds_per_connection_max: u32,
    /// Distinct backing files open at once across all connections.
    pub files_open_max: u32,
    /// Entries a directory may have for `readdir`, which sorts them.
    pub dir_entries_max: u32,
    /// Seconds a reply write may block on a client that does not read.
    pub write_timeout_s: u64,
    /// Milliseconds a new connection has to complete its handshake (the
    /// `Hello`, and the `Auth` when challenged). 10 s: a client on a slow
    /// link needs well under a second; a silent socket holds a
    /// `clients_max` slot no longer than this.
    pub handshake_timeout_ms: u64,
    /// Seconds a connection may stay silent with nothing in flight before
    /// it is closed. 600 s: long enough for a program's pauses between
    /// phases, and a closed idle connection costs a client nothing (it
    /// reconnects and reopens its files on its next call).
    pub idle_timeout_s: u64,
    /// Milliseconds a started frame may take, plus one millisecond per
    /// `FRAME_RATE_MIN_BYTES_PER_MS` bytes of its body: 10 s for a small
    /// frame, 10 s + 64 s for a 64 MiB write at the 1 MiB/s floor. A
    /// stalled frame is answered `ETIMEDOUT` and its connection closed.
    pub frame_stall_ms: u64,
    /// Bytes of frame bodies being received, over all connections. Past
    /// it, readers stop reading bodies until bytes drain (backpressure,
    /// not an error). 512 MiB: eight full 64 MiB writes in flight at once.
    pub partial_bytes_max: u64,
    /// Bytes one connection may hold in admitted reads and writes and in
    /// read replies not yet written to it. Past it the connection is not
    /// read until its replies drain (backpressure), so a client that reads
    /// slowly holds no more. 128 MiB: two full 64 MiB reads, enough to
    /// keep a fast reader's pipe full.
    pub reply_bytes_max: u64,
    /// Bytes of one connection's shared-memory data region (`ShmAttach`;
    /// a larger request is granted this much). 16 MiB and a page: sixteen
    /// 1 MiB requests in flight and their post records
    /// (`sluice_proto::POST_AREA_BYTES`). Memory is charged as the region
    /// is touched.
    pub shm_bytes_max: u64,
    /// Connections whose doorbells the event loop looks at on every turn
    /// (rung requests, `sluice_proto::post`): a connection joins with its
    /// first `Nudge` while there is room and leaves when it closes. The
    /// others' rung requests are taken when they nudge, which they do
    /// for every request. 512: every rank of a large node; each watched
    /// doorbell costs the loop one load a turn and two stores a sleep.
    /// With 64 (the bound before commit 95663e8), a 4 KiB O_DIRECT decomposition of 384
    /// processes took 0.57-0.62 s under aioli, with 512 0.47-0.51 s (128
    /// processes: 0.30-0.39 against 0.27-0.28 s); a client's 4 KiB round
    /// trip beside 500 idle watched connections did not change (medians
    /// 53 and 50 us, 2-core VM).
    pub doorbells_watched_max: u32,
    /// Bytes of all shared-memory regions together. A region takes at
    /// most `1 / shm_taper_shares` of what is left (see there); once less
    /// than the smallest useful region (`SHM_REGION_MIN`) is left,
    /// `ShmAttach` is refused (ENOMEM, counted in
    /// `sluice_shm_refused_total`) and the client keeps the socket path.
    /// 4 GiB: 128 regions of `shm_bytes_max` whole, then smaller ones for
    /// about 470 more clients (with 1 GiB and whole regions only, 63
    /// ranks had one: the other 65 of a 128-process run sent every
    /// request on the socket, without rung requests or write leases, and
    /// the run took 1.5-2.7x as long; docs/results.md). Memory is charged as
    /// regions are touched, so the bound is what clients that touch all
    /// of theirs could make the server hold.
    pub shm_total_bytes_max: u64,
    /// A region is granted at most this share of the shared-memory bytes
    /// left (`shm_total_bytes_max` less the regions granted), in whole
    /// MiB of slots and the post area, and at least `SHM_REGION_MIN`
    /// (one slot): so regions shrink as the budget fills, instead of the
    /// first clients taking it whole and the rest none. 128: with 4 GiB,
    /// the first 128 clients get 16 MiB regions, then each a little less,
    /// down to one slot for the last (about 600 in all). 1: each region
    /// as asked while the rest of the budget holds it, then what is left.
    pub shm_taper_shares: u32,
    /// Bytes a cache lease may cover (`lease.rs`): a `ReadLease` whose
    /// range is in the page cache is answered "read it yourself" for up to
    /// this many bytes from its offset when they are cached too. 32 MiB:
    /// one round trip per 32 MiB keeps a sequential reader of the page
    /// cache at 95% of `pread` where a round trip costs 60 µs and the copy
    /// 25 GB/s (the 2-core VM); checking 32 MiB costs one `cachestat`. 0: no
    /// leases (every read is scheduled; `sluice serve --lease-bytes-max 0`).
    pub lease_bytes_max: u64,
    /// Microseconds a lease is good for. 10 ms: far longer than reading
    /// 32 MiB from the page cache takes (about 1.3 ms), short enough that a page evicted
    /// after the check is rarely read unscheduled.
    pub lease_valid_us: u32,
    /// Microseconds a write lease is good for. A write lease covers the
    /// whole file and checks nothing (a buffered write only copies into
    /// the page cache), so nothing goes stale in it: its time bounds only
    /// how long a client goes on writing unseen once the server would
    /// stop granting. 1 s: a writer asks about once a second, not once
    /// per write (a 10 ms lease made a cyclic writer on this 2-core VM
    /// ask at nearly every write, each ask after a copy into its slot).
    pub write_lease_valid_us: u32,
    /// Applications with their own label in `/metrics` at once (given when
    /// one first connects, freed when it is forgotten, `state.rs`); the
    /// rest count in `app="(other)"`, so a scrape's size, its memory (one
    /// latency histogram per label) and a Prometheus server's series stay
    /// bounded whatever the clients call themselves. 64: more than a node
    /// runs at once, few enough for a dashboard. `sluice serve
    /// --metrics-apps-max`.
    pub metrics_apps_max: u32,
    /// Bytes a live trace may grow to (`trace.rs`); at the bound tracing
    /// stops with a message on stderr and the file stays valid. 256 MiB.
    pub trace_bytes_max: u64,
    /// Server-directed collectives being gathered at once
    /// (`collective.rs`); one more group is refused `EAGAIN`. 1,024: far
    /// more files than one job's collective touches at a time.
    pub collectives_max: u32,
    /// Bytes of write data held in collectives still gathering; a
    /// participant that would pass it is refused `ENOBUFS`, so its group
    /// times out instead of the server growing. 1 GiB: a 64-rank
    /// collective of 16 MiB per rank.
    pub collective_bytes_max: u64,
    /// The longest a group waits for its last participant, whatever it
    /// asks; then every participant that came is answered `ETIMEDOUT`.
    /// 60 s: a slow rank of a large job still makes it, a dead one frees
    /// the others within a minute.
    pub collective_wait_ms_max: u64,
}

/// The floor on how fast a frame's body must arrive once started, in
/// bytes per millisecond (1 MiB/s): slower senders are timed out.
pub const FRAME_RATE_MIN_BYTES_PER_MS: u64 = 1 << 10;

impl Default for ServerLimits {
    fn default() -> ServerLimits {
        ServerLimits {
            clients_max: 1024,
            clients_reserved: 16,
            conns_per_uid_max: 512,
            uid_bytes_max: 512 << 20,
            held_bytes_max: 1 << 30,
            frame_bytes_max: sluice_proto::FRAME_BYTES_MAX,
            inflight_per_connection_max: 256,
            fds_per_connection_max: 1024,
            files_open_max: 65_536,
            dir_entries_max: 1 << 20,
            write_timeout_s: 10,
            handshake_timeout_ms: 10_000,
            idle_timeout_s: 600,
            frame_stall_ms: 10_000,
            partial_bytes_max: 512 << 20,
            reply_bytes_max: 128 << 20,
            shm_bytes_max: (16 << 20) + sluice_proto::POST_AREA_BYTES,
            doorbells_watched_max: 512,
            shm_total_bytes_max: 4 << 30,
            shm_taper_shares: 128,
            lease_bytes_max: 32 << 20,
            lease_valid_us: 10_000,
            write_lease_valid_us: 1_000_000,
            metrics_apps_max: 64,
            trace_bytes_max: 256 << 20,
            collectives_max: 1024,
            collective_bytes_max: 1 << 30,
            collective_wait_ms_max: 60_000,
        }
    }
}

/// Everything `Server::start` needs.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The directory served; no path leaves it.
    pub root: PathBuf,
    pub listen: Listen,
    pub policy: PolicyConfig,
    /// Open backing files with O_DIRECT (bounce buffers handle alignment).
    pub direct: bool,
    /// Grant write leases (`WriteLease`, `lease.rs`) where the server
    /// writes through the page cache: local clients then make those
    /// copies themselves. A buffered write only copies into the page
    /// cache and the device pays at write-back, whose order the copies'
    /// order does not set, so scheduling them costs a round trip each and
    /// buys nothing. Leased writes reach no scheduler, no dispatch and no
    /// trace; their bytes reach the application's `bytes_written` as the
    /// client reports them (`sluice_proto::post::LEASED_BYTES`). On by
    /// default (`sluice serve --no-write-leases`); never on `--direct`
    /// servers or emulated devices.
    pub write_leases: bool,
    pub device: DeviceKind,
    /// With `device` hdd7200: the emulated disk is shared, through this
    /// file, with every other server given the same file (`disk.rs`), as
    /// forwarders over one file system share its disks. None: its own.
    pub device_shared: Option<PathBuf>,
    /// Service classes and the rules that place applications in them
    /// (`sluice serve --qos FILE`, `qos.rs`); None: none.
    pub qos: Option<crate::qos::QosRules>,
    /// Most dispatches in flight, 1..=`QUEUE_DEPTH_MAX` (the executor's
    /// threads); the scheduler keeps as many of them busy as the learned
    /// device model says the device gains from.
    pub queue_depth: u32,
    /// A calibrated device model to start from (`sluice calibrate`). None:
    /// the emulated disk's own figures with `device` hdd7200, else the
    /// learner's generic prior.
    pub device_model: Option<sluice_core::DeviceCost>,
    /// Start the learner from its generic prior even on the emulated
    /// disk, whose figures it is otherwise given: the disk is then one the
    /// scheduler must learn from scratch, as any real device it has no
    /// calibration for (`sluice serve --no-prior`).
    pub no_prior: bool,
    pub limits: ServerLimits,
    /// The scheduler's bounds; `dispatches_inflight_max` is set from
    /// `queue_depth`.
    pub sched_limits: Limits,
    /// Which identities become the anonymous user (`ident`).
    pub squash: Squash,
    /// The shared key clients prove (`sluice_net::key`). `None`: the
    /// default path; created there when the server listens on TCP, read
    /// when it exists otherwise.
    pub key_file: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP at this `HOST:PORT` (port 0:
    /// any free one; `ServerHandle::metrics_addr`). `None`: no endpoint,
    /// and no per-request cost.
    pub metrics: Option<String>,
    /// Write a live Chrome/Perfetto trace here (`trace.rs`).
    pub trace: Option<PathBuf>,
    /// How dispatches reach the files; `None`: the system calls. Tests put
    /// a fault-injecting `Storage` here; dispatches then never run on the
    /// event loop (whose `RWF_NOWAIT` path calls the kernel directly).
    pub storage: Option<StorageRef>,
    /// Hand dispatches that would block to the kernel from the event loop
    /// through io_uring (`ring.rs`) instead of waking an executor worker
    /// for each; where the kernel refuses io_uring, workers serve anyway.
    pub uring: bool,
    /// Submit the ring's dispatches through a kernel thread that polls
    /// the submission queue (io_uring's SQPOLL) and sleeps after this many
    /// milliseconds (1..=`SQPOLL_IDLE_MS_MAX`) without a submission.
    /// The loop then makes no system call to submit, and the file
    /// system's and block layer's submission work runs on that thread:
    /// one more core busy while dispatches come. `None` (the default):
    /// the loop submits them itself. Where the kernel refuses SQPOLL the
    /// ring is made without it (`ServerHandle::sqpoll`).
    pub sqpoll_idle_ms: Option<u32>,
}

/// A shared `Storage`, as `ServerConfig` holds it.
#[derive(Clone)]
pub struct StorageRef(pub std::sync::Arc<dyn crate::storage::Storage>);

impl std::fmt::Debug for StorageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StorageRef(..)")
    }
}

impl ServerConfig {
    /// Defaults for serving `root` on `listen`.
    pub fn new(root: impl Into<PathBuf>, listen: Listen) -> ServerConfig {
        ServerConfig {
            root: root.into(),
            listen,
            policy: PolicyConfig::from_name("aioli").expect("aioli is a known policy"),
            direct: false,
            write_leases: true,
            device: DeviceKind::Real,
            device_shared: None,
            qos: None,
            queue_depth: QUEUE_DEPTH_DEFAULT,
            device_model: None,
            no_prior: false,
            limits: ServerLimits::default(),
            sched_limits: Limits::default(),
            squash: Squash::Root,
            key_file: None,
            metrics: None,
            trace: None,
            storage: None,
            uring: true,
            sqpoll_idle_ms: None,
        }
    }

    /// The checks `Server::start` makes before anything is opened: every
    /// bound in its range (`sluice serve --check` runs them too).
    pub fn validate(&self) -> Result<()> {
        if self.device_shared.is_some() && self.device != DeviceKind::Hdd7200 {
            return Err(Error::config("a shared device (--device-shared) is an emulated disk: give --device hdd7200"));
        }
        if self.queue_depth == 0 || self.queue_depth > QUEUE_DEPTH_MAX {
            return Err(Error::config(format!("queue depth {} outside 1..={QUEUE_DEPTH_MAX}", self.queue_depth)));
        }
        if let Some(ms) = self.sqpoll_idle_ms.filter(|&ms| ms == 0 || ms > SQPOLL_IDLE_MS_MAX) {
            return Err(Error::config(format!("sqpoll idle time {ms} ms outside 1..={SQPOLL_IDLE_MS_MAX}")));
        }
        let l = &self.limits;
        if l.clients_max == 0 || l.inflight_per_connection_max == 0 || l.fds_per_connection_max == 0 || l.files_open_max == 0 || l.shm_taper_shares == 0 {
            return Err(Error::config("server limits must be at least 1"));
        }
        if l.handshake_timeout_ms == 0 || l.idle_timeout_s == 0 || l.frame_stall_ms == 0 || l.reply_bytes_max == 0 {
            return Err(Error::config("timeouts must be at least 1"));
        }
        if l.partial_bytes_max < u64::from(l.frame_bytes_max) {
            return Err(Error::config("partial_bytes_max must hold at least one frame of frame_bytes_max"));
        }
        if l.conns_per_uid_max == 0 {
            return Err(Error::config("conns_per_uid_max must be at least 1"));
        }
        // A message must fit a user's and the server's budgets whole, or
        // it would wait for ever.
        let message = u64::from(l.frame_bytes_max).max(u64::from(sluice_proto::IO_BYTES_MAX)) + (sluice_proto::HEADER_BYTES + 8 + sluice_proto::MESSAGE_BYTES_MAX) as u64;
        if l.uid_bytes_max < message || l.held_bytes_max < l.uid_bytes_max {
            return Err(Error::config(format!("uid_bytes_max must hold one whole message ({message} bytes) and held_bytes_max at least uid_bytes_max")));
        }
        if (l.frame_bytes_max as usize) < sluice_proto::HEADER_BYTES + 64 {
            return Err(Error::config("frame_bytes_max is too small for any request"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> ServerConfig {
        ServerConfig::new("/tmp", Listen::Unix("/tmp/sluice-config-test.sock".into()))
    }

    #[test]
    fn queue_depth_and_sqpoll_idle_bounds_at_n_and_n_plus_one() {
        let with = |f: &dyn Fn(&mut ServerConfig)| {
            let mut c = config();
            f(&mut c);
            c.validate()
        };
        assert!(with(&|c| c.queue_depth = QUEUE_DEPTH_MAX).is_ok());
        assert!(with(&|c| c.queue_depth = QUEUE_DEPTH_MAX + 1).is_err());
        assert!(with(&|c| c.queue_depth = 0).is_err());
        assert!(with(&|c| c.sqpoll_idle_ms = None).is_ok());
        assert!(with(&|c| c.sqpoll_idle_ms = Some(1)).is_ok());
        assert!(with(&|c| c.sqpoll_idle_ms = Some(SQPOLL_IDLE_MS_MAX)).is_ok());
        let e = with(&|c| c.sqpoll_idle_ms = Some(SQPOLL_IDLE_MS_MAX + 1)).unwrap_err();
        assert!(e.to_string().contains("sqpoll idle time 1001 ms outside 1..=1000"), "{e}");
        assert!(with(&|c| c.sqpoll_idle_ms = Some(0)).is_err());
    }

    #[test]
    fn fair_share_bounds_at_n_and_n_plus_one() {
        let with = |f: &dyn Fn(&mut ServerLimits)| {
            let mut c = config();
            f(&mut c.limits);
            c.validate()
        };
        assert!(with(&|l| l.conns_per_uid_max = 1).is_ok());
        assert!(with(&|l| l.conns_per_uid_max = 0).is_err());
        let message =
            u64::from(sluice_proto::FRAME_BYTES_MAX).max(u64::from(sluice_proto::IO_BYTES_MAX)) + (sluice_proto::HEADER_BYTES + 8 + sluice_proto::MESSAGE_BYTES_MAX) as u64;
        assert!(with(&|l| l.uid_bytes_max = message).is_ok(), "a user's share holds one whole message");
        assert!(with(&|l| l.uid_bytes_max = message - 1).is_err(), "one byte less would wait for ever");
        assert!(with(&|l| l.held_bytes_max = l.uid_bytes_max).is_ok());
        assert!(with(&|l| l.held_bytes_max = l.uid_bytes_max - 1).is_err(), "the budget holds at least one user's share");
    }
}
