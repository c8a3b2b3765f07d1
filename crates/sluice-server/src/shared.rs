//! State every server thread shares: the configuration, the root, the
//! clock, the file and application tables, and the counters that
//! `ServerHandle` and the metrics endpoint read.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use crate::clock::Clock;
use crate::config::ServerConfig;
use crate::order::DirectOrder;
use crate::root::Root;
use crate::state::{AppTable, FileTable};
use crate::view::ViewSlot;

/// State every server thread shares.
pub(crate) struct Shared {
    pub config: ServerConfig,
    pub root: Root,
    pub clock: Clock,
    pub files: Arc<Mutex<FileTable>>,
    pub apps: Arc<Mutex<AppTable>>,
    pub stopping: AtomicBool,
    /// The shared key connections prove (see `ident`); `None`: no
    /// connection can prove one, so TCP is refused.
    pub key: Option<[u8; sluice_net::key::KEY_BYTES]>,
    /// The server's effective uid: 0 takes callers' identities.
    pub server_uid: u32,
    /// Bytes held in partial frames, all connections together (the event
    /// loop keeps the count; this is its copy for `ServerHandle`).
    pub partial_held: AtomicU64,
    /// Bytes connections hold in admitted requests and unsent replies,
    /// all together (each is bounded by `reply_bytes_max`).
    pub reply_bytes: AtomicU64,
    /// Connections open now.
    pub conns_open: AtomicUsize,
    /// Bytes of all shared-memory regions (`shm_total_bytes_max`).
    pub shm_bytes: Arc<AtomicU64>,
    /// `ShmAttach`es refused at `shm_total_bytes_max` since the start.
    pub shm_refused: AtomicU64,
    /// Connections closed before their handshake to make room for newer
    /// ones (the table full at twice `clients_max`), since the start.
    pub handshakes_evicted: AtomicU64,
    /// Idle connections closed to make room for another user
    /// (`evloop/fair.rs`).
    pub conns_evicted: AtomicU64,
    /// Handshakes refused because their user held `conns_per_uid_max`.
    pub uid_refused: AtomicU64,
    /// `ShmAttach`es granted less than asked (and than `shm_bytes_max`)
    /// because the budget was filling (`shm::taper`).
    pub shm_tapered: AtomicU64,
    /// Requests taken from doorbells (rung, not sent), and `Nudge` frames
    /// received, since the start; doorbells watched now (at most
    /// `doorbells_watched_max`).
    pub rung: AtomicU64,
    pub nudges: AtomicU64,
    pub doorbells_watched: AtomicUsize,
    /// The order of `--direct` writes, shared by the executor's workers
    /// and the event loop's ring (`order::DirectOrder`).
    pub direct_writes: Arc<DirectOrder>,
    /// Where a metrics scrape asks the event loop for its view.
    pub view: ViewSlot,
    /// New service classes for the event loop to apply at its next turn
    /// (`ServerHandle::set_qos`; `Some(None)` removes them), flagged by
    /// `qos_pending`; and the changes applied since the start.
    pub qos_update: Mutex<Option<Option<crate::qos::QosRules>>>,
    pub qos_pending: AtomicBool,
    pub qos_changes: AtomicU64,
}

impl Shared {
    /// The shared state of a server over `root`, before its first
    /// connection; `apps_max`: the scheduler's bound on applications.
    pub fn new(config: ServerConfig, root: Root, key: Option<[u8; sluice_net::key::KEY_BYTES]>, apps_max: u32) -> Shared {
        Shared {
            root,
            clock: Clock::new(),
            files: Arc::new(Mutex::new(FileTable::new(config.limits.files_open_max))),
            apps: Arc::new(Mutex::new({
                let mut t = AppTable::new(apps_max);
                // Before the first connection, so every application has its detail.
                t.set_detailed(config.metrics.is_some(), config.limits.metrics_apps_max);
                t
            })),
            stopping: AtomicBool::new(false),
            key,
            server_uid: crate::ident::server_uid(),
            partial_held: AtomicU64::new(0),
            reply_bytes: AtomicU64::new(0),
            conns_open: AtomicUsize::new(0),
            shm_bytes: Arc::new(AtomicU64::new(0)),
            shm_refused: AtomicU64::new(0),
            handshakes_evicted: AtomicU64::new(0),
            conns_evicted: AtomicU64::new(0),
            uid_refused: AtomicU64::new(0),
            shm_tapered: AtomicU64::new(0),
            rung: AtomicU64::new(0),
            nudges: AtomicU64::new(0),
            doorbells_watched: AtomicUsize::new(0),
            direct_writes: Arc::default(),
            view: ViewSlot::default(),
            qos_update: Mutex::new(None),
            qos_pending: AtomicBool::new(false),
            qos_changes: AtomicU64::new(0),
            config,
        }
    }
}
