//! The policies. Each chooses where the next aggregate starts and how large
//! it may grow; the [`crate::Scheduler`] builds the aggregate from the
//! shared store, so aggregation rules and the ordering barrier are the same
//! for all.

mod aioli;
pub(crate) mod auto;
mod drr;
mod elevator;
mod fifo;
mod seen;
mod sjf;
mod window;

use crate::config::{Limits, PolicyConfig};
use crate::cost::DeviceCost;
use crate::store::{Entry, Slot, Store};
use crate::types::{AppId, Dispatch, Nanos};

/// A policy's choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pick {
    /// Start the aggregate at `slot`, span at most `limit` bytes, and also
    /// take contiguous requests below the start when `backward`.
    Start { slot: Slot, limit: u64, backward: bool },
    /// Keep the device idle until this time (strictly after now).
    Wait(Nanos),
    /// Nothing to choose.
    Idle,
}

/// What a policy implements. Every hook receives the store read-only.
pub(crate) trait Policy {
    /// Whether aggregates may hold more than one request.
    fn merges(&self) -> bool {
        true
    }
    /// Whether the policy is plain arrival order: the scheduler then starts
    /// every aggregate at the oldest eligible request and never calls `pick`.
    fn arrival_order(&self) -> bool {
        false
    }
    /// Request `r` will arrive soon: start loading what `enqueued` will
    /// read of the policy's tables (a hint).
    #[inline]
    fn prefetch_arrival(&self, _r: &crate::types::Request) {}
    /// The device will soon be free again: start loading what the next
    /// `pick` reads first (a hint).
    #[inline]
    fn prefetch_next(&self, _store: &Store) {}
    /// The request in `slot` became eligible.
    fn enqueued(&mut self, store: &Store, slot: Slot, now: Nanos);
    /// Choose the next aggregate. Only called when `store.queued > 0`.
    fn pick(&mut self, store: &Store, now: Nanos) -> Pick;
    /// `d` left the queue (its `members` are no longer in the store).
    /// `forced` when expiry chose it rather than the policy.
    fn dispatched(&mut self, store: &Store, d: &Dispatch, members: &[Entry], forced: bool, now: Nanos);
    /// `d` completed on the device.
    fn completed(&mut self, _store: &Store, _d: &Dispatch, _now: Nanos) {}
    fn set_weight(&mut self, _app: AppId, _weight: u32) {}
    /// Whether the policy's tables are cold when it runs (the simulator's
    /// large worlds): it may then start loading what its bookkeeping will
    /// read before reading it (`Scheduler::set_prefetch`).
    fn set_prefetch(&mut self, _on: bool) {}
    /// The device's cost model (`None`: unknown) and the dispatches the
    /// scheduler keeps in flight.
    fn set_device(&mut self, _cost: Option<DeviceCost>, _depth: u32) {}
    fn forget_app(&mut self, _app: AppId) {}
    /// `app`'s service class holds its next requests for now (`qos.rs`):
    /// keep no device idle for them (aioli's windows).
    fn set_throttled(&mut self, _app: AppId, _throttled: bool) {}
    /// Whether the policy paces service classes itself (`qos.rs`): their
    /// requests then enter it as they come, and it is told each class's
    /// `Gate` (resting, urgent, the bytes its next turn may carry).
    fn paces(&self) -> bool {
        false
    }
    /// `app`'s class's gate changed (a policy that `paces`).
    fn set_gate(&mut self, _app: AppId, _gate: crate::qos::Gate) {}
    /// Whether an application of a class in a limit's burst (urgent, not
    /// for a guarantee) has requests queued, or the device is kept for
    /// one's reader (a policy that `paces`): expired requests wait.
    fn urgent(&self) -> bool {
        false
    }
    /// `app`'s path of share groups, outermost first (`share.rs`; empty:
    /// none). Policies without turns ignore it.
    fn set_share(&mut self, _app: AppId, _keys: &[u64]) {}
    /// Applications the policy keeps a record of (for the invariant that
    /// it forgets them: at most the registered ones plus those with
    /// requests still queued).
    fn apps_tracked(&self) -> usize {
        0
    }
    /// Windows opened for synchronous readers so far.
    fn windows_opened(&self) -> u64 {
        0
    }
    /// `app`'s byte quantum now, for policies that keep one.
    fn quantum(&self, _app: AppId) -> Option<u64> {
        None
    }
    /// Times the policy changed which of its candidates chooses (`auto`).
    fn switches(&self) -> u64 {
        0
    }
    /// The candidate choosing now, for a policy that has several (`auto`).
    fn active_name(&self) -> Option<&'static str> {
        None
    }
    /// Panic if the policy's own indices disagree with the store.
    fn check(&self, _store: &Store) {}
}

pub(crate) fn build(config: &PolicyConfig, limits: &Limits) -> Box<dyn Policy + Send> {
    match config {
        PolicyConfig::Fifo => Box::new(fifo::Fifo::new(false)),
        PolicyConfig::FifoMerge => Box::new(fifo::Fifo::new(true)),
        PolicyConfig::Elevator => Box::new(elevator::Elevator::default()),
        PolicyConfig::Sjf => Box::new(sjf::Sjf::default()),
        PolicyConfig::Window { window_ns } => Box::new(window::Window::new(*window_ns)),
        PolicyConfig::Drr { quantum_bytes } => Box::new(drr::Drr::new(*quantum_bytes)),
        PolicyConfig::Aioli(p) => Box::new(aioli::Aioli::new(p.clone(), limits)),
        PolicyConfig::Auto(p) => Box::new(auto::Auto::new(p.clone(), limits)),
    }
}
