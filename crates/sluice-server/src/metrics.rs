//! Live metrics: `sluice serve --metrics HOST:PORT` serves the
//! Prometheus text exposition format (version 0.0.4) at `/metrics`, and the
//! dashboard page at `/`.
//!
//! Where the numbers come from. Per-application counters and latency live
//! in the `AppTable` (`state.rs`), updated where every request is answered
//! (`Dispatcher::done`, `Dispatcher::submit`), so a scrape counts exactly
//! what the server answered. The scheduler is not `Send` and belongs to the
//! event loop: a scrape asks the loop for a [`View`] (one flag, one wake,
//! at most `VIEW_WAIT`), which the loop builds between two turns. The loop
//! pays one atomic load per turn for this, and nothing when no endpoint is
//! configured; per request, the detailed latency (an `hdrhistogram`, two
//! significant digits) is recorded only when metrics are on.
//!
//! Bounds: the endpoint's (`sluice_metrics`: many scrapes at once on one
//! thread of low priority, at most `CONNS_MAX` held, an 8 KiB request
//! head, 2 s per client in all; one rendering per turn however many ask).
//! A scrape takes the application table's lock only to copy its rows, and
//! never a lock of the event loop's: the loop answers its view between
//! two turns. At most
//! `ServerLimits::metrics_apps_max` applications labelled at once, the
//! others counted in `app="(other)"` (`AppTable`, `state.rs`).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sluice_core::AppId;
use sluice_proto::LATENCY_BUCKETS;

use crate::error::{Error, Result};
use crate::shared::Shared;
use crate::sync::lock;
use crate::view::{AppRow, View};
pub use crate::view::{Detail, OTHER_APPS, VIEW_WAIT};
use crate::waker::Waker;
pub use sluice_metrics::{get, parse, value, Endpoint, Sample, CONNS_MAX, IO_TIMEOUT, REQUEST_BYTES_MAX};
use sluice_metrics::{Expo, LOG2_BUCKETS, TEXT_FORMAT};

const _: () = assert!(LATENCY_BUCKETS == LOG2_BUCKETS, "the protocol's latency buckets are the exposition's");

/// Serve `/metrics` and the dashboard for `shared` (`sluice_metrics`'s
/// endpoint, one thread).
pub(crate) fn start(shared: &Arc<Shared>, waker: &Arc<Waker>, addr: &str) -> Result<Endpoint> {
    let (s, w) = (Arc::clone(shared), Arc::clone(waker));
    Endpoint::start(addr, move |path| match path {
        "/metrics" => Some((TEXT_FORMAT, render(&s, &w))),
        "/" | "/index.html" => Some(("text/html; charset=utf-8", DASHBOARD.to_string())),
        _ => None,
    })
    .map_err(|e| Error::io("start the metrics endpoint", &e))
}

/// The dashboard: one static page, no build step, no network.
const DASHBOARD: &str = include_str!("dashboard.html");

/// The whole exposition.
pub(crate) fn render(shared: &Shared, waker: &Waker) -> String {
    let view = shared.view.ask(waker);
    let rows = lock(&shared.apps).rows();
    let mut e = Expo::default();
    apps(&mut e, &rows, view.as_ref());
    server(&mut e, shared);
    e.family("sluice_scheduler_view_ok", "gauge", "1 when the event loop answered this scrape in time (the scheduler and device families below are present)");
    e.sample("sluice_scheduler_view_ok", &[], u64::from(view.is_some()) as f64);
    e.family("sluice_qos_changes_total", "counter", "Changes of the service classes applied since the start (sluice qos, SIGHUP)");
    e.sample("sluice_qos_changes_total", &[], shared.qos_changes.load(std::sync::atomic::Ordering::Relaxed) as f64);
    if let Some(v) = &view {
        scheduler(&mut e, v);
        classes(&mut e, v);
    }
    e.out
}

/// One family of a class's counters: name, kind, help, the figure.
/// A class's setting as a family: name, help, the value (None: unset).
type ClassSetting = (&'static str, &'static str, fn(&sluice_core::ClassStats) -> Option<u64>);
type ClassFamily = (&'static str, &'static str, &'static str, fn(&sluice_core::ClassStats) -> u64);

/// Each service class's counters (docs/qos.md); none without classes.
fn classes(e: &mut Expo, v: &View) {
    if v.classes.is_empty() {
        return;
    }
    let per: [ClassFamily; 5] = [
        ("sluice_qos_class_waiting_requests", "gauge", "Requests waiting in the class's queue now", |c| c.held),
        ("sluice_qos_class_admitted_requests_total", "counter", "Requests of the class that reached the policy", |c| c.admitted_requests),
        ("sluice_qos_class_dispatched_bytes_total", "counter", "Bytes of the class dispatched (its rate, against its limit)", |c| c.dispatched_bytes),
        ("sluice_qos_class_expired_total", "counter", "Requests of the class let in by the 1 s starvation bound", |c| c.expired),
        ("sluice_qos_class_guaranteed_total", "counter", "Dispatches made for the class's guarantee before the policy chose", |c| c.guaranteed),
    ];
    for (name, kind, help, get) in per {
        e.family(name, kind, help);
        for c in &v.classes {
            e.sample(name, &[("class", &c.name)], get(c) as f64);
        }
    }
    // What the operator set, for the dashboard's rate against it.
    let set: [ClassSetting; 2] = [
        ("sluice_qos_class_rate_limit_bytes_per_second", "The class's rate limit, bytes/s (classes with one)", |c| c.rate_bytes_per_s),
        ("sluice_qos_class_guarantee_bytes_per_second", "The class's guaranteed minimum, bytes/s (classes with one)", |c| c.guarantee_bytes_per_s),
    ];
    for (name, help, get) in set {
        e.family(name, "gauge", help);
        for c in &v.classes {
            if let Some(x) = get(c) {
                e.sample(name, &[("class", &c.name)], x as f64);
            }
        }
    }
}

fn apps(e: &mut Expo, rows: &[AppRow], view: Option<&View>) {
    let label = |r: &AppRow| r.stats.name.clone();
    let ops = |r: &AppRow| [("read", r.detail.reads, r.stats.bytes_read), ("write", r.detail.writes, r.stats.bytes_written)];
    e.family("sluice_app_requests_total", "counter", "Requests answered, per application and operation (errors included)");
    for r in rows {
        for (op, n, _) in ops(r) {
            e.sample("sluice_app_requests_total", &[("app", &label(r)), ("op", op)], n as f64);
        }
    }
    e.family("sluice_app_bytes_total", "counter", "Bytes read or written through the scheduler, per application");
    for r in rows {
        for (op, _, b) in ops(r) {
            e.sample("sluice_app_bytes_total", &[("app", &label(r)), ("op", op)], b as f64);
        }
    }
    // (name, type, help, the figure of a row)
    type Simple = (&'static str, &'static str, &'static str, fn(&AppRow) -> u64);
    let simple: [Simple; 4] = [
        (
            "sluice_app_leased_bytes_total",
            "counter",
            "Bytes a client read itself under a cache lease (the part inside the file), and the bytes of each write that asked for a write lease",
            |r| r.stats.bytes_leased,
        ),
        ("sluice_app_errors_total", "counter", "Requests answered with an error", |r| r.stats.errors),
        ("sluice_app_dispatches_total", "counter", "Dispatches that carried at least one request of the application", |r| r.stats.dispatches),
        ("sluice_app_connections", "gauge", "Connections open now", |r| u64::from(r.connections)),
    ];
    for (name, kind, help, f) in simple {
        e.family(name, kind, help);
        for r in rows {
            e.sample(name, &[("app", &label(r))], f(r) as f64);
        }
    }
    e.family("sluice_app_requests_per_dispatch", "gauge", "Requests answered per dispatch that carried the application's requests (aggregation)");
    for r in rows {
        e.sample("sluice_app_requests_per_dispatch", &[("app", &label(r))], r.stats.aggregation_factor());
    }
    if let Some(v) = view {
        let sum = |list: &[(AppId, u64)], r: &AppRow| list.iter().filter(|(a, _)| r.ids.contains(a)).map(|(_, n)| *n).sum::<u64>();
        let quantum = |r: &AppRow| match r.ids[..] {
            [id] => v.quanta.iter().find(|(a, _)| *a == id).map(|(_, q)| *q),
            _ => None,
        };
        e.family("sluice_app_quantum_bytes", "gauge", "The application's byte quantum now (aioli, drr)");
        for r in rows {
            if let Some(q) = quantum(r) {
                e.sample("sluice_app_quantum_bytes", &[("app", &label(r))], q as f64);
            }
        }
        e.family("sluice_app_waiting_requests", "gauge", "Requests of the application waiting in the scheduler now (queued or blocked)");
        for r in rows {
            e.sample("sluice_app_waiting_requests", &[("app", &label(r))], sum(&v.waiting, r) as f64);
        }
    }
    app_latency(e, rows);
}

/// The applications' latency families: queue wait, service, arrival to
/// answer.
fn app_latency(e: &mut Expo, rows: &[AppRow]) {
    let label = |r: &AppRow| r.stats.name.clone();
    e.family("sluice_app_queue_wait_seconds", "histogram", "Arrival to the start of the dispatch's system call");
    for r in rows {
        e.log2_histogram("sluice_app_queue_wait_seconds", ("app", &label(r)), &r.detail.wait_us_log2, r.detail.wait_ns_sum);
    }
    e.family("sluice_app_service_seconds", "histogram", "The dispatch's system call, for each request it carried");
    for r in rows {
        e.log2_histogram("sluice_app_service_seconds", ("app", &label(r)), &r.detail.service_us_log2, r.detail.service_ns_sum);
    }
    e.family("sluice_app_latency_seconds", "summary", "Arrival to answer, quantiles since the server started (hdrhistogram, 2 significant digits)");
    for r in rows {
        let app = label(r);
        for q in ["0.5", "0.9", "0.99", "0.999"] {
            let us = if r.detail.latency.is_empty() { 0 } else { r.detail.latency.value_at_quantile(q.parse().expect("a quantile")) };
            e.sample("sluice_app_latency_seconds", &[("app", &app), ("quantile", q)], us as f64 / 1e6);
        }
        e.sample("sluice_app_latency_seconds_sum", &[("app", &app)], r.detail.latency_ns_sum as f64 / 1e9);
        e.sample("sluice_app_latency_seconds_count", &[("app", &app)], r.detail.latency.len() as f64);
    }
}

fn server(e: &mut Expo, shared: &Shared) {
    let gauges: [(&str, &str, f64); 9] = [
        ("sluice_connections", "Connections open now", shared.conns_open.load(Ordering::Relaxed) as f64),
        ("sluice_doorbells_watched", "Doorbells the loop looks at every turn (bounded by doorbells_watched_max)", shared.doorbells_watched.load(Ordering::Relaxed) as f64),
        ("sluice_files_open", "Distinct backing files open now", lock(&shared.files).len() as f64),
        ("sluice_partial_frame_bytes", "Bytes held in partial frames now (bounded by partial_bytes_max)", shared.partial_held.load(Ordering::Relaxed) as f64),
        ("sluice_reply_bytes", "Bytes held in admitted requests and unsent replies now", shared.reply_bytes.load(Ordering::Relaxed) as f64),
        (
            "sluice_held_bytes",
            "Bytes held for clients now: admitted requests, unsent replies and partial frames (bounded by held_bytes_max)",
            (shared.reply_bytes.load(Ordering::Relaxed) + shared.partial_held.load(Ordering::Relaxed)) as f64,
        ),
        ("sluice_held_bytes_max", "The server's budget of bytes held for clients (held_bytes_max)", shared.config.limits.held_bytes_max as f64),
        ("sluice_shm_bytes", "Bytes of shared-memory regions mapped now", shared.shm_bytes.load(Ordering::Relaxed) as f64),
        ("sluice_uptime_seconds", "Seconds since the server started", shared.clock.now() as f64 / 1e9),
    ];
    for (name, help, v) in gauges {
        e.family(name, "gauge", help);
        e.sample(name, &[], v);
    }
    let counters: [(&str, &str, u64); 7] = [
        ("sluice_rung_requests_total", "Requests taken from shared-memory doorbells instead of the socket", shared.rung.load(Ordering::Relaxed)),
        ("sluice_nudges_total", "Nudge frames received (a rung request while its doorbell was not watched)", shared.nudges.load(Ordering::Relaxed)),
        ("sluice_shm_refused_total", "Shared-memory regions refused at shm_total_bytes_max (those clients use the socket)", shared.shm_refused.load(Ordering::Relaxed)),
        ("sluice_shm_tapered_total", "Shared-memory regions granted smaller than asked, the budget filling (shm_taper_shares)", shared.shm_tapered.load(Ordering::Relaxed)),
        ("sluice_handshakes_evicted_total", "Connections closed before their handshake, making room for newer ones", shared.handshakes_evicted.load(Ordering::Relaxed)),
        ("sluice_connections_evicted_total", "Idle connections of the user holding the most closed to make room for another user", shared.conns_evicted.load(Ordering::Relaxed)),
        ("sluice_connections_refused_per_user_total", "Handshakes refused because their user held conns_per_uid_max connections", shared.uid_refused.load(Ordering::Relaxed)),
    ];
    for (name, help, n) in counters {
        e.family(name, "counter", help);
        e.sample(name, &[], n as f64);
    }
}

fn scheduler(e: &mut Expo, v: &View) {
    e.family("sluice_scheduler_policy", "gauge", "The policy deciding (label), always 1");
    e.sample("sluice_scheduler_policy", &[("policy", v.policy)], 1.0);
    e.family("sluice_scheduler_active_policy", "gauge", "The policy choosing now (label): the policy, or the candidate auto chose; always 1");
    e.sample("sluice_scheduler_active_policy", &[("policy", v.active_policy)], 1.0);
    let s = &v.stats;
    let gauges: [(&str, &str, u64); 6] = [
        ("sluice_scheduler_queued_requests", "Requests the policy may choose from now", s.queued),
        ("sluice_scheduler_blocked_requests", "Requests waiting behind an overlapping request now", s.blocked),
        ("sluice_scheduler_inflight_dispatches", "Dispatches on the device now", s.inflight_dispatches),
        ("sluice_scheduler_inflight_requests", "Requests inside the dispatches on the device now", s.inflight_requests),
        ("sluice_scheduler_background_requests", "Requests of background-class (weight 0) applications held until the device is free", s.background),
        ("sluice_scheduler_depth", "Dispatches the scheduler keeps in flight (learned from the device)", u64::from(v.depth)),
    ];
    for (name, help, n) in gauges {
        e.family(name, "gauge", help);
        e.sample(name, &[], n as f64);
    }
    let counters: [(&str, &str, u64); 8] = [
        ("sluice_scheduler_requests_total", "Requests admitted into the scheduler", s.inserted),
        ("sluice_scheduler_blocked_total", "Requests that had to wait behind an overlapping write", s.blocked_total),
        ("sluice_scheduler_dispatches_total", "Dispatches handed to the device", s.dispatches),
        ("sluice_scheduler_expired_dispatches_total", "Dispatches forced by request_expire_ns", s.expired_dispatches),
        ("sluice_scheduler_holds_total", "Times the policy kept the device idle for an aggregate to grow or a reader to return", s.holds),
        ("sluice_scheduler_windows_total", "Windows opened for synchronous readers (aioli)", s.windows),
        ("sluice_scheduler_background_admitted_total", "Background-class requests let in to the policy", s.background_admitted),
        ("sluice_scheduler_policy_switches_total", "Times auto changed the policy that chooses", s.policy_switches),
    ];
    for (name, help, n) in counters {
        e.family(name, "counter", help);
        e.sample(name, &[], n as f64);
    }
    let d = &v.device;
    let dev: [(&str, &str, f64); 3] = [
        ("sluice_device_dispatches_total", "Dispatches the device completed", d.dispatches as f64),
        ("sluice_device_busy_seconds_total", "Sum of the dispatches' service times (overlapping ones each count)", d.busy_ns as f64 / 1e9),
        ("sluice_device_seeks_total", "Dispatches that did not continue where the previous one ended", d.seeks as f64),
    ];
    for (name, help, x) in dev {
        e.family(name, "counter", help);
        e.sample(name, &[], x);
    }
    e.family("sluice_device_bytes_total", "counter", "Bytes the device's dispatches covered");
    e.sample("sluice_device_bytes_total", &[("op", "read")], d.bytes_read as f64);
    e.sample("sluice_device_bytes_total", &[("op", "write")], d.bytes_written as f64);
    if let Some(m) = v.model {
        let model: [(&str, &str, f64); 4] = [
            ("sluice_device_model_dispatch_seconds", "Learned fixed cost of one dispatch", m.dispatch_ns as f64 / 1e9),
            ("sluice_device_model_byte_seconds", "Learned transfer cost per byte", m.byte_ps as f64 / 1e12),
            ("sluice_device_model_seek_seconds", "Learned extra cost of a dispatch that does not continue the previous one", m.seek_ns as f64 / 1e9),
            ("sluice_device_model_parallelism", "Dispatches the device serves at once with gain (learned)", f64::from(m.parallelism)),
        ];
        for (name, help, x) in model {
            e.family(name, "gauge", help);
            e.sample(name, &[], x);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u32, name: &str, requests: u64) -> AppRow {
        let mut stats = crate::state::empty_stats(name, 1);
        stats.requests = requests;
        stats.bytes_read = requests * 10;
        let mut detail = Detail::new();
        (0..requests).for_each(|_| detail.record(false, 5_000, Some((1_000, 2_000))));
        AppRow { ids: vec![AppId(id)], stats, detail, connections: 1 }
    }

    #[test]
    fn the_exposition_parses_and_histograms_are_cumulative() {
        let mut e = Expo::default();
        let r = row(0, "we\"ird\\app\nname", 3);
        apps(&mut e, &[r], None);
        let samples = parse(&e.out).expect("every line parses");
        let get = |name: &str, le: Option<&str>| samples.iter().find(|(n, l, _)| n == name && le.is_none_or(|le| l.iter().any(|(k, v)| k == "le" && v == le))).map(|s| s.2);
        assert_eq!(samples.iter().find(|(n, _, _)| n == "sluice_app_requests_total").unwrap().1[0].1, "we\"ird\\app\nname", "label escaping round-trips");
        assert_eq!(get("sluice_app_queue_wait_seconds_bucket", Some("0.000002")), Some(3.0), "1 µs waits are at most 2 µs");
        assert_eq!(get("sluice_app_service_seconds_bucket", Some("0.000002")), Some(3.0), "2 µs services are at most 2 µs (le)");
        assert!(get("sluice_app_service_seconds_bucket", Some("0.000001")).is_none(), "no bucket below 2 µs");
        assert_eq!(get("sluice_app_queue_wait_seconds_bucket", Some("+Inf")), Some(3.0));
        assert_eq!(get("sluice_app_service_seconds_count", None), Some(3.0));
        assert_eq!(get("sluice_app_latency_seconds_count", None), Some(3.0));
        let p50 = samples.iter().find(|(n, l, _)| n == "sluice_app_latency_seconds" && l.iter().any(|(_, v)| v == "0.5")).unwrap().2;
        assert!((p50 - 5e-6).abs() < 1e-7, "p50 is the recorded 5 µs: {p50}");
        assert!(parse("bad line here x").is_err() && parse("ok{a=\"1\"} 2\n# c").is_ok(), "the parser refuses what is not a sample");
    }
}
