//! Bounds and policy parameters, each with its unit and the reason for its
//! default. Values set at run time are clamped by [`Limits::clamped`] and
//! [`PolicyConfig::clamped`].

/// Hard bounds on every table and queue the scheduler keeps. Exceeding one
/// is an [`crate::Error`], never a silent drop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Requests waiting in the scheduler (eligible or blocked). 64 Ki keeps
    /// the worst-case memory of the index near 10 MiB.
    pub queued_requests_max: u32,
    /// Bytes of request payload waiting. 1 GiB: the daemon holds write data
    /// for queued writes, and this is what it may pin.
    pub queued_bytes_max: u64,
    /// Largest single request. 64 MiB, the largest read a client may send.
    pub request_bytes_max: u64,
    /// Largest aggregate handed to the device. 8 MiB: twice the seed's
    /// largest useful aggregate (32 processes x 128 KiB).
    pub dispatch_bytes_max: u64,
    /// Dispatches in flight at once; `next` answers `Idle` at the bound.
    pub dispatches_inflight_max: u32,
    /// Distinct files with queued, blocked or in-flight requests.
    pub files_max: u32,
    /// Registered applications.
    pub apps_max: u32,
    /// Largest per-application weight.
    pub weight_max: u32,
    /// Age after which a request is served before any younger one, whatever
    /// the policy: the starvation bound. 1 s, as mq-deadline's write expiry.
    pub request_expire_ns: u64,
    /// Background requests (of applications with weight 0) the scheduler
    /// lets in at once when the foreground is idle; the bound in force is
    /// the smaller of this and twice the depth kept in flight, so that a
    /// foreground request arriving meanwhile finds at most two dispatches'
    /// worth per device slot ahead of it. 64.
    pub background_admitted_max: u32,
    /// How long the foreground must have had nothing pending before the
    /// background gets the device (CFQ's idle class waits 200 ms): a
    /// synchronous reader leaves the queue empty between two requests for
    /// tens of microseconds, and the background must not take those gaps.
    /// 10 ms: far longer than such a gap, far shorter than a compute phase.
    pub background_idle_ns: u64,
    /// Background requests held at once: they drain slowly under load
    /// (one per `background_grace_ns`), so they get a bound of their own
    /// and cannot take the foreground's room in `queued_requests_max`.
    /// 1,024: four connections' worth of the per-connection in-flight
    /// bound. One more is refused (the client gets EAGAIN).
    pub background_held_max: u32,
    /// Under foreground load, one background request is let in when none
    /// is in and this long has passed since the last: the background's
    /// starvation bound. 1 s, as `request_expire_ns`: a 1 MiB piece per
    /// second takes about 2% of a 7200 rpm disk (100 ms took 17%: a
    /// reader beside a migration ran 1.4x its time alone, see docs/results.md).
    pub background_grace_ns: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            queued_requests_max: 65_536,
            queued_bytes_max: 1 << 30,
            request_bytes_max: 64 << 20,
            dispatch_bytes_max: 8 << 20,
            dispatches_inflight_max: 64,
            files_max: 65_536,
            apps_max: 4_096,
            weight_max: 64,
            request_expire_ns: 1_000_000_000,
            background_admitted_max: 64,
            background_idle_ns: 10_000_000,
            background_held_max: 1_024,
            background_grace_ns: 1_000_000_000,
        }
    }
}

impl Limits {
    /// The same limits with every value forced into its sane range.
    pub fn clamped(mut self) -> Limits {
        self.queued_requests_max = self.queued_requests_max.clamp(1, 1 << 24);
        self.queued_bytes_max = self.queued_bytes_max.max(1);
        self.request_bytes_max = self.request_bytes_max.clamp(1, 1 << 32);
        self.dispatch_bytes_max = self.dispatch_bytes_max.clamp(1, 1 << 32);
        self.dispatches_inflight_max = self.dispatches_inflight_max.clamp(1, 4_096);
        self.files_max = self.files_max.clamp(1, 1 << 24);
        self.apps_max = self.apps_max.clamp(1, 1 << 20);
        self.weight_max = self.weight_max.clamp(1, 1_024);
        self.request_expire_ns = self.request_expire_ns.max(1);
        self.background_admitted_max = self.background_admitted_max.clamp(1, 1 << 16);
        self.background_grace_ns = self.background_grace_ns.clamp(1, 60_000_000_000);
        self.background_idle_ns = self.background_idle_ns.min(60_000_000_000);
        self.background_held_max = self.background_held_max.clamp(1, 1 << 24);
        self
    }
}

/// Parameters of the `aioli` policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AioliParams {
    /// Quantum an application gets when it has just been served (the top
    /// level of the multi-level feedback). 512 KiB: a rotating disk's seek
    /// (~13 ms) costs as much as moving ~1.3 MB, so shorter turns would
    /// spend most of the disk's time seeking between applications. With
    /// a device model, aioli raises it to `DeviceCost::turn_bytes_min`
    /// (the transfer that takes twice the seek: 2.9 MB on the emulated
    /// disk), so that seeks between turns take at most a third of the
    /// device's time; on flash (no seek cost) it stays.
    pub quantum_bytes_min: u64,
    /// Largest quantum a long-waiting application can grow to. 32 MiB:
    /// about 0.3 s of a 100 MB/s disk, beyond which fairness suffers.
    pub quantum_bytes_max: u64,
    /// Longest a turn may keep the device, whatever its quantum. 100 ms,
    /// about eight average HDD seeks: a small synchronous reader with a
    /// grown quantum and dedicated windows would otherwise hold the device
    /// for seconds (found in the simulated ten-application mix, where a
    /// 32 KiB reader waited 652 ms behind a 4 KiB reader's turn).
    pub turn_ns_max: u64,
    /// Smallest aggregate target a file's history can shrink to.
    pub file_target_bytes_min: u64,
    /// Largest aggregate target a file's history can grow to.
    pub file_target_bytes_max: u64,
    /// Shortest and longest the device is held for the missing pieces of a
    /// file's aggregate; each file's hold adapts in between to the time its
    /// pieces take to gather. 50 µs: about one socket round trip. 5 ms:
    /// under half an HDD seek, so a hold never costs more than it can save.
    pub hold_ns_min: u64,
    pub hold_ns_max: u64,
    /// Shortest dedicated window for a synchronous reader.
    pub sync_window_ns_min: u64,
    /// Longest dedicated window for a synchronous reader. 2 ms: a reader
    /// that thinks longer is not worth idling a disk for. 0 turns windows
    /// off, for devices where moving to another file costs nothing (flash):
    /// there a window only idles the device.
    pub sync_window_ns_max: u64,
    /// Contiguous requests, each sent after the one before completed, a
    /// stream (or a file's run of aggregates) must show before it gets
    /// windows. 1: a reader that came back once where it left off is
    /// likely to again, and a window that goes unused costs at most
    /// `sync_window_ns_max` (against a seek saved) and resets the
    /// evidence. With 2, each small reader of the seed's ten-application
    /// mix paid a far seek a turn for one more turn than with 1 (mix10 on
    /// the emulated disk, four alternating pairs: 1.54-1.64 s with 1,
    /// 1.66-1.69 s with 2).
    pub sync_hits_min: u32,
    /// Synchronous streams remembered (bounded table, oldest evicted).
    pub streams_max: u32,
    /// File histories remembered (bounded table, oldest evicted).
    pub file_histories_max: u32,
}

impl Default for AioliParams {
    fn default() -> AioliParams {
        AioliParams {
            quantum_bytes_min: 512 << 10,
            quantum_bytes_max: 32 << 20,
            turn_ns_max: 100_000_000,
            file_target_bytes_min: 4 << 10,
            file_target_bytes_max: 8 << 20,
            hold_ns_min: 50_000,
            hold_ns_max: 5_000_000,
            sync_window_ns_min: 20_000,
            sync_window_ns_max: 2_000_000,
            sync_hits_min: 1,
            streams_max: 16_384,
            file_histories_max: 16_384,
        }
    }
}

impl AioliParams {
    /// The same parameters forced into sane ranges.
    pub fn clamped(mut self) -> AioliParams {
        self.quantum_bytes_min = self.quantum_bytes_min.clamp(512, 1 << 30);
        self.quantum_bytes_max = self.quantum_bytes_max.clamp(self.quantum_bytes_min, 1 << 32);
        self.turn_ns_max = self.turn_ns_max.clamp(1_000, 60_000_000_000);
        self.file_target_bytes_min = self.file_target_bytes_min.clamp(1, 1 << 30);
        self.file_target_bytes_max = self.file_target_bytes_max.clamp(self.file_target_bytes_min, 1 << 32);
        self.hold_ns_max = self.hold_ns_max.min(1_000_000_000);
        self.hold_ns_min = self.hold_ns_min.min(self.hold_ns_max);
        self.sync_window_ns_max = self.sync_window_ns_max.min(1_000_000_000);
        self.sync_window_ns_min = self.sync_window_ns_min.min(self.sync_window_ns_max);
        self.sync_hits_min = self.sync_hits_min.clamp(1, 64);
        self.streams_max = self.streams_max.clamp(1, 1 << 24);
        self.file_histories_max = self.file_histories_max.clamp(1, 1 << 24);
        self
    }
}

/// Which policy, with its parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyConfig {
    /// Arrival order, no merging: the "no scheduler" baseline.
    Fifo,
    /// Arrival order, contiguous requests merged (AGIOS's TO-agg).
    FifoMerge,
    /// Per-file offset order, C-SCAN across files, merging.
    Elevator,
    /// The file with the fewest queued bytes first.
    Sjf,
    /// Arrival-time windows of `window_ns`; inside a window, one application
    /// at a time in application order.
    Window { window_ns: u64 },
    /// Deficit round-robin across applications; each round an application
    /// earns `quantum_bytes x weight`.
    Drr { quantum_bytes: u64 },
    /// The seed's algorithm.
    Aioli(AioliParams),
    /// aioli (with these parameters) or fifo-merge, whichever a replay of
    /// the recent requests on the device's cost model serves sooner
    /// (`policy/auto.rs`).
    Auto(AioliParams),
}

/// Every policy name `PolicyConfig::from_name` accepts.
pub const POLICY_NAMES: [&str; 8] = ["fifo", "fifo-merge", "elevator", "sjf", "window", "drr", "aioli", "auto"];

impl PolicyConfig {
    /// The policy's default configuration, by name.
    pub fn from_name(name: &str) -> Option<PolicyConfig> {
        Some(match name {
            "fifo" => PolicyConfig::Fifo,
            "fifo-merge" => PolicyConfig::FifoMerge,
            "elevator" => PolicyConfig::Elevator,
            "sjf" => PolicyConfig::Sjf,
            "window" => PolicyConfig::Window { window_ns: 2_000_000 },
            "drr" => PolicyConfig::Drr { quantum_bytes: 256 << 10 },
            "aioli" => PolicyConfig::Aioli(AioliParams::default()),
            "auto" => PolicyConfig::Auto(AioliParams::default()),
            _ => return None,
        })
    }

    /// The policy's name, as `from_name` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            PolicyConfig::Fifo => "fifo",
            PolicyConfig::FifoMerge => "fifo-merge",
            PolicyConfig::Elevator => "elevator",
            PolicyConfig::Sjf => "sjf",
            PolicyConfig::Window { .. } => "window",
            PolicyConfig::Drr { .. } => "drr",
            PolicyConfig::Aioli(_) => "aioli",
            PolicyConfig::Auto(_) => "auto",
        }
    }

    /// The same configuration with parameters forced into sane ranges.
    pub fn clamped(self) -> PolicyConfig {
        match self {
            PolicyConfig::Window { window_ns } => PolicyConfig::Window { window_ns: window_ns.clamp(1_000, 10_000_000_000) },
            PolicyConfig::Drr { quantum_bytes } => PolicyConfig::Drr { quantum_bytes: quantum_bytes.clamp(512, 1 << 30) },
            PolicyConfig::Auto(p) => PolicyConfig::Auto(p.clamped()),
            PolicyConfig::Aioli(p) => PolicyConfig::Aioli(p.clamped()),
            other => other,
        }
    }
}
