//! Scenarios: the cluster, the servers and the applications of one
//! simulation, read from TOML (format and units in `docs/sim.md`).
//!
//! Parsing is two-step, as everywhere in sluice: serde checks the shape
//! (unknown fields are errors), then [`Scenario::validate`] checks ranges
//! and bounds before anything is allocated from them.

use serde::Deserialize;

use crate::error::{Error, ErrorKind};

/// Processes in one scenario. 1 Mi: a 10,000-node cluster with 100 cores
/// each; every per-process table is sized from this.
pub const PROCS_MAX: u64 = 1 << 20;
/// I/O servers in one scenario.
pub const SIM_SERVERS_MAX: u64 = 65_536;
/// Blocks one list call may name (`blocks_per_call`).
pub const BLOCKS_PER_CALL_MAX: u64 = 1 << 16;
/// Compute nodes in one scenario.
pub const NODES_MAX: u64 = 1 << 20;
/// Cores of a shared host (`[cluster] host_cores`).
pub const HOST_CORES_MAX: u64 = 4_096;
/// Applications in one scenario (the core's `apps_max` default).
pub const APPS_MAX: usize = 4_096;
/// Points of a granularity sweep.
pub const SWEEP_POINTS_MAX: usize = 64;
/// Most dispatches one simulated device serves at once, and most a server
/// keeps in flight (`channels`, `dispatches_inflight`).
pub const CHANNELS_MAX: u32 = 64;

/// A whole scenario file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Seed of the run's random source (start jitter).
    #[serde(default = "one")]
    pub seed: u64,
    /// Every application's `bytes` is multiplied by this (tests run small).
    #[serde(default = "unit")]
    pub scale: f64,
    /// Modes run when the command line names none: `policy` or
    /// `policy/cache` (cache one of `none`, `write-behind`, `aggregation`).
    #[serde(default = "default_modes")]
    pub modes: Vec<String>,
    /// Application granularities to sweep; each point is a run per mode,
    /// overriding the `granularity_bytes` of applications marked `sweep`.
    #[serde(default)]
    pub sweep_granularity_bytes: Vec<u64>,
    /// MPI-IO aggregator counts to sweep instead; each point is a run per
    /// mode, overriding the `aggregators` of applications marked `sweep`
    /// (the seed's bandwidth-against-aggregators curves).
    #[serde(default)]
    pub sweep_aggregators: Vec<u64>,
    pub network: Network,
    pub cluster: Cluster,
    pub server: Server,
    /// Forwarders in front of the servers (`sluice_remote::Forwarders`):
    /// when set, the processes' requests go to a forwarder, whose
    /// scheduler dispatches them to the server holding the file.
    #[serde(default)]
    pub forwarders: Option<ForwarderSet>,
    #[serde(default)]
    pub client: Client,
    #[serde(rename = "app")]
    pub apps: Vec<App>,
    /// Service classes every server's scheduler applies (`[[class]]`, as
    /// in `sluice serve --qos`; docs/qos.md); an application names its
    /// class with `class`.
    #[serde(default, rename = "class")]
    pub classes: Vec<SimClass>,
    /// A sharing order (`share = ["user", "job"]`, as in the daemon's
    /// rules file): groups of applications shared fairly before the
    /// applications within them (the core's `share.rs`). Empty: none.
    #[serde(default)]
    pub share: Vec<String>,
    #[serde(default)]
    pub bounds: Bounds,
    /// Overrides of the `aioli` policy's parameters (default: the core's).
    #[serde(default)]
    pub aioli: AioliOverrides,
}

/// Any of `sluice_core::AioliParams`, to tune the policy to a device.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AioliOverrides {
    pub quantum_bytes_min: Option<u64>,
    pub quantum_bytes_max: Option<u64>,
    pub file_target_bytes_min: Option<u64>,
    pub file_target_bytes_max: Option<u64>,
    pub hold_ns_max: Option<u64>,
    pub sync_window_ns_min: Option<u64>,
    pub sync_window_ns_max: Option<u64>,
    pub sync_hits_min: Option<u32>,
    pub turn_ns_max: Option<u64>,
}

impl AioliOverrides {
    /// The core's defaults with these overrides applied.
    pub fn params(&self) -> sluice_core::AioliParams {
        let mut p = sluice_core::AioliParams::default();
        let set = |field: &mut u64, v: Option<u64>| *field = v.unwrap_or(*field);
        set(&mut p.quantum_bytes_min, self.quantum_bytes_min);
        set(&mut p.quantum_bytes_max, self.quantum_bytes_max);
        set(&mut p.file_target_bytes_min, self.file_target_bytes_min);
        set(&mut p.file_target_bytes_max, self.file_target_bytes_max);
        set(&mut p.hold_ns_max, self.hold_ns_max);
        set(&mut p.sync_window_ns_min, self.sync_window_ns_min);
        set(&mut p.sync_window_ns_max, self.sync_window_ns_max);
        set(&mut p.turn_ns_max, self.turn_ns_max);
        p.sync_hits_min = self.sync_hits_min.unwrap_or(p.sync_hits_min);
        p
    }

    /// The parameters for a server with `device`. Dedicated windows only
    /// pay where moving to another file costs (a seek): the device cost
    /// model the server passes to the core decides that
    /// (`DeviceCost::window_pays`), so the parameters are the same for
    /// every device.
    pub fn params_for(&self, _device: &str) -> sluice_core::AioliParams {
        self.params()
    }
}

fn one() -> u64 {
    1
}
fn unit() -> f64 {
    1.0
}
fn default_modes() -> Vec<String> {
    vec!["fifo".into(), "aioli".into()]
}

/// NICs and the switch (store-and-forward, one star).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    pub nic_bytes_per_s: u64,
    /// One-way latency added at each NIC (sending and receiving).
    pub nic_latency_ns: u64,
    pub switch_bytes_per_s: u64,
    #[serde(default)]
    pub switch_latency_ns: u64,
    /// Transfer granularity: a message crosses each hop as packets of this
    /// size, so the next hop starts after the first packet.
    #[serde(default = "packet_default")]
    pub packet_bytes: u64,
    /// Bytes of a request or acknowledgement without payload (RPC header).
    #[serde(default = "header_default")]
    pub header_bytes: u64,
}

fn packet_default() -> u64 {
    1500
}
fn header_default() -> u64 {
    128
}

/// Compute nodes; process `k` (over all applications) runs on node
/// `k % compute_nodes`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    pub compute_nodes: u64,
    /// When positive, every node runs on one host with this many cores,
    /// which the processes' and the servers' CPU time share (the twin of a
    /// run on one machine); 0 (the default): each node has its own CPU.
    #[serde(default)]
    pub host_cores: u64,
    /// CPU time a process spends on each request it sends (the client
    /// library and the system calls of sending and receiving): its piece
    /// leaves that much later, after a free core when `host_cores` is set.
    /// 0 (the default): free.
    #[serde(default)]
    pub client_cpu_ns_per_request: u64,
}

/// The I/O servers: each has a scheduler, a cache layer and a device.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    pub count: u64,
    /// `hdd7200`, `ssd`, `hdd` (figures in `[server.hdd]`) or `profile`
    /// (figures in `[server.profile]`).
    pub device: String,
    #[serde(default)]
    pub hdd: Option<HddFigures>,
    #[serde(default)]
    pub profile: Option<ProfileFigures>,
    /// Striping unit; files are striped round-robin over `stripe_count`
    /// servers starting at `file % count`.
    #[serde(default = "stripe_default")]
    pub stripe_bytes: u64,
    /// Servers a file is striped over (1 = whole files on one server).
    #[serde(default = "one")]
    pub stripe_count: u64,
    /// Cache size for write-behind (dirty bytes) and aggregation (blocks).
    #[serde(default)]
    pub cache_bytes: u64,
    /// Block the aggregation cache reads whole (default: the stripe).
    #[serde(default)]
    pub cache_block_bytes: u64,
    /// Requests the server holds before its scheduler (nfsd backlog);
    /// beyond it the run fails.
    #[serde(default = "backlog_default")]
    pub backlog_max: u64,
    /// CPU time the server spends on each request message (receiving,
    /// deciding, answering), on one thread: a request reaches the cache
    /// layer and the scheduler only after the server's earlier requests
    /// had theirs. 0 (the default): free. `sluice sim --validate` sets it
    /// from the real server's CPU per request.
    #[serde(default)]
    pub cpu_ns_per_request: u64,
    /// The cost model the scheduler weighs its holds and windows with, when
    /// it is not the device's own figures: a real server learns its model
    /// online, and `sluice sim --validate` hands its twin the one the real
    /// server had learned. None (the default): the device's figures.
    #[serde(default)]
    pub scheduler_model: Option<SchedulerModel>,
    /// Dispatches the device serves at once (flash, a virtual disk): each
    /// pays its fixed and seek cost on a channel of its own, in parallel,
    /// while the bytes of all of them share the device's bandwidth, one
    /// transfer at a time. 1 (the default): one dispatch at a time (one
    /// disk arm), exactly the model's service time each.
    #[serde(default = "one_u32")]
    pub channels: u32,
    /// Dispatches the server keeps in flight (the daemon's
    /// `--queue-depth`, as limited by what it learned); those past
    /// `channels` wait in the device's queue, in order. 0 (the default):
    /// `channels`.
    #[serde(default)]
    pub dispatches_inflight: u32,
}

impl Server {
    /// Dispatches the server keeps in flight.
    pub fn depth(&self) -> u32 {
        if self.dispatches_inflight == 0 {
            self.channels
        } else {
            self.dispatches_inflight
        }
    }
}

/// A set of forwarders: each a scheduler (with the server's policy) on a
/// node of its own, in front of the `[server]`s, which then only serve
/// dispatches, each server a whole file (`file % count`) on its device.
/// A process sends each request to the forwarder its mode's home rule
/// names (`Mode::home`): the file's (one scheduler sees all of a file's
/// requests) or its own (a static map of processes to forwarders). The
/// hop from forwarder to server is not modelled (as if each forwarder
/// were on the servers' fabric at no cost).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwarderSet {
    pub count: u64,
}

/// A service class (`sluice_core::ClassSpec`), as the daemon's rules
/// file writes one.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimClass {
    pub name: String,
    #[serde(default)]
    pub rate_bytes_per_s: Option<u64>,
    #[serde(default)]
    pub rate_requests_per_s: Option<u64>,
    #[serde(default)]
    pub guarantee_bytes_per_s: Option<u64>,
    #[serde(default)]
    pub depth_ms: Option<u64>,
}

impl SimClass {
    pub fn spec(&self) -> sluice_core::ClassSpec {
        sluice_core::ClassSpec {
            name: self.name.clone(),
            rate_bytes_per_s: self.rate_bytes_per_s,
            rate_requests_per_s: self.rate_requests_per_s,
            guarantee_bytes_per_s: self.guarantee_bytes_per_s,
            depth_ns: self.depth_ms.unwrap_or(0).saturating_mul(1_000_000),
        }
    }
}

/// A cost model as the scheduler sees it (`sluice_core::DeviceCost`, one
/// dispatch at a time).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SchedulerModel {
    /// Fixed cost of every dispatch.
    pub dispatch_ns: u64,
    /// Transfer, picoseconds per byte.
    pub byte_ps: u64,
    /// Extra cost of a dispatch that does not continue the previous one.
    pub seek_ns: u64,
    /// Dispatches the model says the device serves at once (the learned
    /// parallelism). None (the default): the device's `channels`.
    #[serde(default)]
    pub parallelism: Option<u32>,
}

fn one_u32() -> u32 {
    1
}

fn stripe_default() -> u64 {
    64 << 10
}
fn backlog_default() -> u64 {
    1 << 20
}

/// A rotating disk's published figures.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HddFigures {
    pub seek_far_ns: u64,
    pub seek_near_ns: u64,
    pub near_bytes: u64,
    pub rotation_ns: u64,
    pub bytes_per_s: u64,
}

/// A measured device profile: cost per access and bandwidth.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFigures {
    pub access_ns: u64,
    pub bytes_per_s: u64,
    /// Extra cost of an access that does not continue the previous one.
    #[serde(default)]
    pub seek_ns: u64,
    /// With several `channels`: the part of each dispatch's service time
    /// the channels do not overlap, `shared_ns` plus its bytes at
    /// `shared_bytes_per_s` (what `sluice calibrate` measures at the
    /// server's queue depth). Both 0 (the default): the transfer at
    /// `bytes_per_s`.
    #[serde(default)]
    pub shared_ns: u64,
    /// The bandwidth of the shared part; 0 with `shared_ns` > 0: the bytes
    /// share nothing, only `shared_ns` is shared.
    #[serde(default)]
    pub shared_bytes_per_s: u64,
}

impl ProfileFigures {
    /// The shared part's cost per byte, picoseconds (0: its bytes share
    /// nothing).
    pub fn shared_ps(&self) -> u64 {
        1_000_000_000_000u64.checked_div(self.shared_bytes_per_s).unwrap_or(0)
    }
}

/// The client side of the file system and of MPI-IO.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Client {
    /// File-system granularity: one application request is sent as pieces
    /// of at most this size, in parallel (NFS rsize/wsize). 0: no split.
    pub fs_piece_bytes: u64,
    /// Pieces one process keeps in flight (RPC slot table).
    pub pieces_inflight_max: u64,
    /// MPI-IO collective buffer per aggregator per round (ROMIO
    /// `cb_buffer_size`).
    pub cb_buffer_bytes: u64,
    /// Process start times are spread uniformly over this (seeded).
    pub start_jitter_ns: u64,
}

impl Default for Client {
    fn default() -> Client {
        Client { fs_piece_bytes: 32 << 10, pieces_inflight_max: 16, cb_buffer_bytes: 16 << 20, start_jitter_ns: 100_000 }
    }
}

/// How an application's processes divide its bytes.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Piece `i` of size `granularity` goes to process `i % procs`: the
    /// seed's decomposition, PIOsimHD's simple-strided.
    Strided,
    /// Each process reads its own contiguous `bytes / procs` in order.
    Contiguous,
}

/// POSIX (independent), MPI-IO two-phase collective I/O, or a
/// server-directed collective (Panda; sluice's collective groups).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Interface {
    Posix,
    Mpiio,
    /// Per round every process sends each server one list message with
    /// all its pieces of its next call there; a server holds a round's
    /// messages until every process that has pieces for it sent its
    /// own, then hands them all to its scheduler at once (in offset
    /// order) and answers each message when its pieces are done.
    ServerDirected,
}

/// Read or write.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum OpName {
    Read,
    Write,
}

/// One application.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct App {
    pub name: String,
    pub procs: u64,
    pub op: OpName,
    pub pattern: Pattern,
    pub bytes: u64,
    pub granularity_bytes: u64,
    #[serde(default = "posix")]
    pub interface: Interface,
    /// MPI-IO aggregators (ROMIO `cb_nodes`).
    #[serde(default = "one")]
    pub aggregators: u64,
    /// When positive, the aggregators are chosen by the seed's rule
    /// instead (`workload::choose_groups` over the processes' equal
    /// shares of `bytes`, with this as k, the bytes one aggregator should
    /// move; OMPIO's `bytes_per_agg` is 32 MiB), after scaling.
    #[serde(default)]
    pub k_bytes: u64,
    /// Think time of each process between two requests.
    #[serde(default)]
    pub think_ns: u64,
    #[serde(default)]
    pub start_ns: u64,
    /// Each process's start after `start_ns`, in rank order, instead of
    /// the client's seeded jitter: measured starts (`sluice sim
    /// --validate` gives its twin those of the real run, since the order
    /// in which the processes first reach the server decides a FIFO
    /// server's order for the rest of the run). Empty: the jitter.
    #[serde(default)]
    pub start_offsets_ns: Vec<u64>,
    /// Blocks of `granularity_bytes` per call of a strided POSIX process:
    /// one call lists this many of its blocks (non-contiguous list I/O,
    /// PIOsimHD's "100 blocks"), sent as separate pieces, up to
    /// `pieces_inflight_max` at a time; the call returns when all are
    /// done. 1: one block per call.
    #[serde(default = "one")]
    pub blocks_per_call: u64,
    /// Whether the scenario's granularity sweep applies to this application.
    #[serde(default)]
    pub sweep: bool,
    /// The service class of its requests (`[[class]]`); none: `default`.
    #[serde(default)]
    pub class: Option<String>,
    /// The uid (and gid) its processes run as, for a sharing order.
    #[serde(default)]
    pub user: u32,
    /// Its job, for a sharing order; none: from its name as the daemon
    /// takes it (`slurm-42-post` is in job `slurm-42`).
    #[serde(default)]
    pub job: Option<String>,
    /// Recorded accesses to replay instead of `pattern` (`sluice sim
    /// --darshan`): one list per process. Not in scenario files.
    #[serde(skip)]
    pub recorded: Option<std::sync::Arc<Recorded>>,
}

/// A recorded application: each process's accesses in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    pub ranks: Vec<Vec<RecordedAccess>>,
}

/// One recorded access.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecordedAccess {
    pub write: bool,
    /// The application's file it goes to (an index).
    pub file: u32,
    pub offset: u64,
    pub len: u64,
    /// Wait this long before issuing it (after the previous answer; the
    /// first one's, after the process starts).
    pub think_ns: u64,
}

fn posix() -> Interface {
    Interface::Posix
}

/// Engine bounds; a run that reaches one fails with its seed.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bounds {
    /// Events handled in one run.
    pub events_max: u64,
    /// Events pending at once.
    pub events_pending_max: u64,
    /// Simulated time of one run.
    pub sim_ns_max: u64,
    /// Trace events kept for `--trace`.
    pub trace_events_max: u64,
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds { events_max: 2_000_000_000, events_pending_max: 1 << 24, sim_ns_max: 100_000 * 1_000_000_000, trace_events_max: 2_000_000 }
    }
}

fn invalid(what: String) -> Error {
    Error::new(ErrorKind::Invalid, what)
}

impl Scenario {
    /// Processes of all its applications.
    pub fn procs_total(&self) -> u64 {
        self.apps.iter().map(|a| a.procs).sum()
    }

    /// Parse and validate a scenario.
    pub fn from_toml(text: &str) -> Result<Scenario, Error> {
        let s: Scenario = toml::from_str(text).map_err(|e| Error::new(ErrorKind::Parse, e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    /// Check every range; called by [`Scenario::from_toml`], and again by
    /// the runner after command-line overrides.
    pub fn validate(&self) -> Result<(), Error> {
        let n = &self.network;
        if n.nic_bytes_per_s == 0 || n.switch_bytes_per_s == 0 || n.packet_bytes == 0 {
            return Err(invalid("network bandwidths and packet_bytes must be positive".into()));
        }
        if !(self.scale > 0.0 && self.scale <= 1e6) {
            return Err(invalid(format!("scale {} outside (0, 1e6]", self.scale)));
        }
        if self.cluster.compute_nodes == 0 || self.cluster.compute_nodes > NODES_MAX {
            return Err(invalid(format!("compute_nodes must be 1..={NODES_MAX}")));
        }
        if self.cluster.host_cores > HOST_CORES_MAX {
            return Err(invalid(format!("host_cores must be 0..={HOST_CORES_MAX}")));
        }
        self.validate_server()?;
        self.validate_client()?;
        let specs: Vec<sluice_core::ClassSpec> = self.classes.iter().map(SimClass::spec).collect();
        sluice_core::check_qos_classes(&specs).map_err(|e| invalid(format!("classes: {e}")))?;
        sluice_core::ShareLevel::parse_order(&self.share).map_err(invalid)?;
        if let Some(a) = self.apps.iter().find(|a| a.class.as_ref().is_some_and(|c| !self.classes.iter().any(|k| &k.name == c))) {
            return Err(invalid(format!("application {:?}: no class {:?}", a.name, a.class.as_deref().unwrap_or_default())));
        }
        if let Some(f) = &self.forwarders {
            if f.count == 0 || f.count > SIM_SERVERS_MAX {
                return Err(invalid(format!("forwarder count must be 1..={SIM_SERVERS_MAX}")));
            }
            if let Some(a) = self.apps.iter().find(|a| a.interface != Interface::Posix) {
                return Err(invalid(format!("application {:?}: forwarder sets are modelled for posix requests only", a.name)));
            }
        }
        if self.apps.is_empty() || self.apps.len() > APPS_MAX {
            return Err(invalid(format!("need 1..={APPS_MAX} applications")));
        }
        let procs = self.procs_total();
        if procs > PROCS_MAX {
            return Err(invalid(format!("{procs} processes, more than procs_max = {PROCS_MAX}")));
        }
        if self.sweep_granularity_bytes.len() > SWEEP_POINTS_MAX {
            return Err(invalid(format!("more than {SWEEP_POINTS_MAX} sweep points")));
        }
        if self.sweep_granularity_bytes.contains(&0) {
            return Err(invalid("sweep granularity 0".into()));
        }
        if self.sweep_aggregators.len() > SWEEP_POINTS_MAX {
            return Err(invalid(format!("more than {SWEEP_POINTS_MAX} sweep points")));
        }
        if !self.sweep_aggregators.is_empty() && !self.sweep_granularity_bytes.is_empty() {
            return Err(invalid("one sweep at a time: sweep_granularity_bytes or sweep_aggregators".into()));
        }
        for a in self.apps.iter().filter(|a| a.sweep && !self.sweep_aggregators.is_empty()) {
            if a.interface != Interface::Mpiio {
                return Err(invalid(format!("application {:?}: an aggregator sweep needs the mpiio interface", a.name)));
            }
            if let Some(&p) = self.sweep_aggregators.iter().find(|&&p| p == 0 || p > a.procs) {
                return Err(invalid(format!("application {:?}: sweep point {p} aggregators, not in 1..={}", a.name, a.procs)));
            }
        }
        self.apps.iter().try_for_each(App::validate)
    }

    fn validate_server(&self) -> Result<(), Error> {
        let s = &self.server;
        if s.count == 0 || s.count > SIM_SERVERS_MAX {
            return Err(invalid(format!("server count must be 1..={SIM_SERVERS_MAX}")));
        }
        if s.stripe_bytes == 0 || s.stripe_count == 0 || s.stripe_count > s.count {
            return Err(invalid("stripe_bytes > 0 and 1 <= stripe_count <= count".into()));
        }
        match (s.device.as_str(), &s.hdd, &s.profile) {
            ("hdd7200" | "ssd", _, _) | ("hdd", Some(_), _) | ("profile", _, Some(_)) => {}
            (d, _, _) => return Err(invalid(format!("device {d:?}: hdd7200, ssd, hdd with [server.hdd], profile with [server.profile]"))),
        }
        if s.hdd.as_ref().is_some_and(|h| h.bytes_per_s == 0) || s.profile.as_ref().is_some_and(|p| p.bytes_per_s == 0) {
            return Err(invalid("device bytes_per_s must be positive".into()));
        }
        if !(1..=CHANNELS_MAX).contains(&s.channels) {
            return Err(invalid(format!("channels {} outside 1..={CHANNELS_MAX}", s.channels)));
        }
        if s.dispatches_inflight > CHANNELS_MAX {
            return Err(invalid(format!("dispatches_inflight {} outside 0..={CHANNELS_MAX}", s.dispatches_inflight)));
        }
        if s.scheduler_model.and_then(|m| m.parallelism).is_some_and(|p| !(1..=CHANNELS_MAX).contains(&p)) {
            return Err(invalid(format!("scheduler_model.parallelism must be 1..={CHANNELS_MAX}")));
        }
        Ok(())
    }

    fn validate_client(&self) -> Result<(), Error> {
        let c = &self.client;
        if c.pieces_inflight_max == 0 || c.pieces_inflight_max > 4_096 {
            return Err(invalid("pieces_inflight_max must be 1..=4096".into()));
        }
        if c.cb_buffer_bytes == 0 || c.cb_buffer_bytes > 64 << 20 {
            return Err(invalid("cb_buffer_bytes must be 1..=64 MiB".into()));
        }
        if c.fs_piece_bytes > 64 << 20 {
            return Err(invalid("fs_piece_bytes at most 64 MiB".into()));
        }
        Ok(())
    }
}

impl App {
    /// An application built in code rather than read from a file: a POSIX
    /// one with the file format's defaults (one aggregator, no think time,
    /// one block per call, not swept, not recorded).
    pub fn posix(name: String, procs: u64, op: OpName, pattern: Pattern, bytes: u64, granularity_bytes: u64) -> App {
        App {
            name,
            procs,
            op,
            pattern,
            bytes,
            granularity_bytes,
            interface: posix(),
            aggregators: one(),
            k_bytes: 0,
            think_ns: 0,
            start_ns: 0,
            start_offsets_ns: Vec::new(),
            blocks_per_call: one(),
            sweep: false,
            class: None,
            user: 0,
            job: None,
            recorded: None,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |what: &str| Err(invalid(format!("application {:?}: {what}", self.name)));
        if self.procs == 0 {
            return bad("procs must be positive");
        }
        if self.bytes == 0 || self.granularity_bytes == 0 {
            return bad("bytes and granularity_bytes must be positive");
        }
        if self.granularity_bytes > 64 << 20 {
            return bad("granularity_bytes at most 64 MiB");
        }
        if !self.start_offsets_ns.is_empty() && self.start_offsets_ns.len() as u64 != self.procs {
            return bad(&format!("start_offsets_ns lists {} starts for {} processes", self.start_offsets_ns.len(), self.procs));
        }
        if self.interface == Interface::Mpiio && (self.aggregators == 0 || self.aggregators > self.procs) {
            return bad("aggregators must be 1..=procs");
        }
        if self.k_bytes > 0 && self.interface != Interface::Mpiio {
            return bad("k_bytes chooses MPI-IO aggregators: it needs the mpiio interface");
        }
        if self.blocks_per_call == 0 || self.blocks_per_call > BLOCKS_PER_CALL_MAX {
            return bad(&format!("blocks_per_call must be 1..={BLOCKS_PER_CALL_MAX}"));
        }
        if self.blocks_per_call > 1 && (self.pattern != Pattern::Strided || self.interface == Interface::Mpiio) {
            return bad("blocks_per_call > 1 needs the strided pattern and the POSIX or server-directed interface");
        }
        Ok(())
    }
}

/// Cache layer of the I/O servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cache {
    /// Every request goes to the scheduler; replies when the device is done.
    None,
    /// Writes are acknowledged on arrival while dirty bytes fit in
    /// `cache_bytes`, and flushed through the scheduler.
    WriteBehind,
    /// Write-behind, and reads fetch whole `cache_block_bytes` blocks kept
    /// in a bounded cache, so the other clients' pieces of a block hit.
    Aggregation,
}

impl Cache {
    pub fn name(self) -> &'static str {
        match self {
            Cache::None => "none",
            Cache::WriteBehind => "write-behind",
            Cache::Aggregation => "aggregation",
        }
    }
}

/// One mode: a policy and a cache layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mode {
    pub policy: String,
    pub cache: Cache,
    /// Which forwarder a request goes to, with `[forwarders]`.
    pub home: Home,
}

/// What picks a request's forwarder (`[forwarders]`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Home {
    /// Its file's home: one forwarder per file.
    #[default]
    File,
    /// Its process's: one forwarder per process.
    Client,
}

impl Mode {
    /// `policy`, `policy/cache`, either with `@file` or `@client` (the
    /// home rule with `[forwarders]`).
    pub fn parse(text: &str) -> Result<Mode, Error> {
        let (text, home) = match text.split_once('@') {
            None | Some((_, "file")) => (text.split('@').next().unwrap_or(text), Home::File),
            Some((t, "client")) => (t, Home::Client),
            Some((_, h)) => return Err(Error::new(ErrorKind::UnknownMode, format!("home {h:?} (known: file, client)"))),
        };
        let (p, c) = text.split_once('/').unwrap_or((text, "none"));
        if sluice_core::PolicyConfig::from_name(p).is_none() {
            let known = sluice_core::POLICY_NAMES.join(", ");
            return Err(Error::new(ErrorKind::UnknownMode, format!("policy {p:?} (known: {known})")));
        }
        let cache = match c {
            "none" => Cache::None,
            "write-behind" => Cache::WriteBehind,
            "aggregation" => Cache::Aggregation,
            _ => return Err(Error::new(ErrorKind::UnknownMode, format!("cache {c:?} (known: none, write-behind, aggregation)"))),
        };
        Ok(Mode { policy: p.to_string(), cache, home })
    }

    /// The label used in tables and JSON: the policy alone when the cache
    /// is `none`, else `policy/cache`.
    pub fn label(&self) -> String {
        let base = match self.cache {
            Cache::None => self.policy.clone(),
            c => format!("{}/{}", self.policy, c.name()),
        };
        match self.home {
            Home::File => base,
            Home::Client => format!("{base}@client"),
        }
    }
}
