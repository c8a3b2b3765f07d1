//! What the event loop shows a metrics scrape, and the per-application
//! detail the application table keeps for it: plain data, a slot where a
//! scrape and the loop meet, and nothing that renders (`metrics.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use sluice_core::{AppId, DeviceCost};
use sluice_metrics::log2_bucket as bucket;
use sluice_proto::{AppStats, LATENCY_BUCKETS};

use crate::sync::lock;
use crate::waker::Waker;

/// How long a scrape waits for the event loop's view of the scheduler;
/// past it the scrape is served without the scheduler's families (and
/// `sluice_scheduler_view_ok 0`).
pub const VIEW_WAIT: Duration = Duration::from_secs(1);
/// Label value of the applications past `metrics_apps_max`.
pub const OTHER_APPS: &str = "(other)";
/// Highest latency the detailed histogram tells apart (1 hour, in µs);
/// longer ones count as this.
const LATENCY_US_MAX: u64 = 3_600_000_000;

/// One application's detailed latency, kept only when metrics are on.
#[derive(Clone, Debug)]
pub struct Detail {
    pub reads: u64,
    pub writes: u64,
    /// Arrival to the start of its dispatch's system call (scheduler queue
    /// and executor queue), log2 µs buckets as `AppStats::latency_us_log2`.
    pub wait_us_log2: [u64; LATENCY_BUCKETS],
    pub wait_ns_sum: u64,
    /// The dispatch's system call.
    pub service_us_log2: [u64; LATENCY_BUCKETS],
    pub service_ns_sum: u64,
    /// Arrival to answer, µs.
    pub latency: Histogram<u64>,
    pub latency_ns_sum: u64,
}

impl Detail {
    pub fn new() -> Detail {
        Detail {
            reads: 0,
            writes: 0,
            wait_us_log2: [0; LATENCY_BUCKETS],
            wait_ns_sum: 0,
            service_us_log2: [0; LATENCY_BUCKETS],
            service_ns_sum: 0,
            latency: Histogram::new_with_bounds(1, LATENCY_US_MAX, 2).expect("valid histogram bounds"),
            latency_ns_sum: 0,
        }
    }

    /// One answered request. `timing`: its queue wait and service time,
    /// when it reached the device (a refused request has none).
    pub fn record(&mut self, write: bool, latency_ns: u64, timing: Option<(u64, u64)>) {
        if write {
            self.writes += 1;
        } else {
            self.reads += 1;
        }
        self.latency.saturating_record((latency_ns / 1_000).clamp(1, LATENCY_US_MAX));
        self.latency_ns_sum += latency_ns;
        if let Some((wait, service)) = timing {
            self.wait_us_log2[bucket(wait)] += 1;
            self.wait_ns_sum += wait;
            self.service_us_log2[bucket(service)] += 1;
            self.service_ns_sum += service;
        }
    }

    pub fn merge(&mut self, o: &Detail) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.wait_us_log2.iter_mut().zip(&o.wait_us_log2).for_each(|(a, b)| *a += b);
        self.service_us_log2.iter_mut().zip(&o.service_us_log2).for_each(|(a, b)| *a += b);
        self.wait_ns_sum += o.wait_ns_sum;
        self.service_ns_sum += o.service_ns_sum;
        let _ = self.latency.add(&o.latency);
        self.latency_ns_sum += o.latency_ns_sum;
    }
}

impl Default for Detail {
    fn default() -> Detail {
        Detail::new()
    }
}

/// One application as a scrape sees it.
#[derive(Clone, Debug)]
pub struct AppRow {
    /// The applications the row stands for: one, those folded into
    /// `(other)`, or none (the forgotten row).
    pub ids: Vec<AppId>,
    pub stats: AppStats,
    pub detail: Detail,
    pub connections: u32,
}

/// The device as the dispatcher saw it, cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    pub dispatches: u64,
    /// Sum of the dispatches' service times (they may overlap).
    pub busy_ns: u64,
    /// Dispatches that did not continue the previous one.
    pub seeks: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// The event loop's answer to a scrape.
#[derive(Clone, Debug, Default)]
pub struct View {
    pub policy: &'static str,
    /// The policy choosing now: `policy`, or the candidate `auto` chose.
    pub active_policy: &'static str,
    pub stats: sluice_core::Stats,
    /// Dispatches the scheduler keeps in flight now.
    pub depth: u32,
    pub model: Option<DeviceCost>,
    pub device: DeviceCounters,
    /// Per application: its quantum now (policies that keep one) and its
    /// requests waiting in the scheduler.
    pub quanta: Vec<(AppId, u64)>,
    pub waiting: Vec<(AppId, u64)>,
    /// Each service class's counters (`default` last; empty without).
    pub classes: Vec<sluice_core::ClassStats>,
}

/// Where a scrape and the event loop meet.
#[derive(Default)]
pub struct ViewSlot {
    wanted: AtomicBool,
    view: Mutex<Option<View>>,
    ready: Condvar,
}

impl ViewSlot {
    /// Whether a scrape waits for a view (the loop checks once per turn).
    pub fn wanted(&self) -> bool {
        self.wanted.load(Ordering::Relaxed)
    }

    pub fn publish(&self, v: View) {
        self.wanted.store(false, Ordering::Relaxed);
        *lock(&self.view) = Some(v);
        self.ready.notify_all();
    }

    pub(crate) fn ask(&self, waker: &Waker) -> Option<View> {
        let mut g = lock(&self.view);
        *g = None;
        self.wanted.store(true, Ordering::Relaxed);
        waker.wake();
        let (mut g, _) = self.ready.wait_timeout_while(g, VIEW_WAIT, |v| v.is_none()).unwrap_or_else(|p| p.into_inner());
        self.wanted.store(false, Ordering::Relaxed);
        g.take()
    }
}
