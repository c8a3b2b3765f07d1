//! # sluice-core: the scheduling core
//!
//! A pure state machine that decides in which order, and in which
//! aggregates, the requests of many applications reach one device. It never
//! reads a clock, touches a file or spawns a thread: every entry point takes
//! `now` in nanoseconds, so the daemon (`sluice serve`) and the simulator
//! (`sluice sim`) drive the identical code.
//!
//! ```
//! use sluice_core::*;
//!
//! let mut s = Scheduler::new(PolicyConfig::from_name("aioli").unwrap(), Limits::default());
//! // Two processes of one application read adjacent 4 KiB pieces.
//! for (i, client) in [(0u64, 0u32), (1, 1)] {
//!     let req = Request { id: RequestId(i), app: AppId(1), client: ClientId(client), file: FileId(7),
//!                         op: Op::Read, offset: i * 4096, len: 4096 };
//!     s.enqueue(req, 0).unwrap();
//! }
//! let Decision::Dispatch(d) = s.next(10) else { panic!("the device is free") };
//! assert_eq!((d.offset, d.len, d.members.len()), (0, 8192, 2)); // one aggregate
//! s.complete(d.id, 60_000).unwrap();
//! assert!(s.is_empty());
//! ```
//!
//! The policies (`fifo`, `fifo-merge`, `elevator`, `sjf`, `window`, `drr`,
//! `aioli`) are described in `docs/scheduling.md` and in their modules.
//!
//! Invariants the [`Scheduler`] keeps for every policy: each request is
//! dispatched exactly once; an aggregate is one file, one op, one contiguous
//! range; overlapping requests with a write among them are dispatched in
//! arrival order, each after the previous completed; every table is bounded
//! by [`Limits`].

mod config;
pub mod cost;
mod error;
mod flat;
mod hash;
mod idmap;
mod index;
mod policy;
pub mod prefetch;
pub mod qos;
pub mod replay;
mod scheduler;
pub mod share;
mod store;
mod types;

pub use config::{AioliParams, Limits, PolicyConfig, POLICY_NAMES};
pub use cost::{CostLearner, DeviceCost, Observation};
pub use error::{Error, ErrorKind};
pub use idmap::DENSE_IDS as FILE_IDS_DENSE;
pub use qos::{check_classes as check_qos_classes, ClassSpec, ClassStats, QosError, QOS_CLASSES_MAX, QOS_DEFAULT_CLASS, QOS_DEPTH_NS_DEFAULT, QOS_DEPTH_NS_MAX};
pub use scheduler::{Scheduler, Stats};
pub use share::{ShareLevel, SHARE_LEVELS_MAX};
pub use types::{AppId, ClientId, Decision, Dispatch, DispatchId, FileId, Nanos, Op, Request, RequestId};
