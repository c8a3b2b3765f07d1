//! Live metrics and the live trace, against a real server and
//! real clients: a scrape counts exactly what the clients did; the
//! endpoint's bounds (request head, stalled client, labelled applications)
//! hold at N and N+1; the trace holds every answered request, and a paused
//! trace records nothing.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{pattern, TestServer};
use sluice_client::{Client, ConnectOptions};
use sluice_server::metrics::{parse, OTHER_APPS, REQUEST_BYTES_MAX};

type Samples = Vec<sluice_server::metrics::Sample>;

fn with_metrics(apps_max: u32) -> TestServer {
    TestServer::start(|c| {
        c.metrics = Some("127.0.0.1:0".into());
        c.limits.metrics_apps_max = apps_max;
    })
}

fn client(s: &TestServer, app: &str) -> Client {
    // Leases off: every read is a scheduled request.
    Client::connect_with(&s.addr(), ConnectOptions { app: Some(app.into()), leases: false, ..ConnectOptions::default() }).expect("client connects")
}

/// `(status, body)` of one HTTP exchange.
fn http(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn scrape(s: &TestServer) -> Samples {
    let (status, body) = http(s.handle.metrics_addr().expect("metrics on"), b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(status, 200, "{body}");
    parse(&body).expect("the exposition parses")
}

use sluice_server::metrics::value;

#[test]
fn a_scrape_counts_exactly_what_the_clients_did() {
    let s = with_metrics(64);
    let (mut writes, mut written, mut reads, mut read) = (0u64, 0u64, 0u64, 0u64);
    let w = client(&s, "writer");
    let fd = w.open("f", libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
    // Small ones over the socket, large ones through shared memory.
    for (i, len) in [512usize, 4096, 65_536, 1 << 20, 100, 300_000].iter().cycle().take(60).enumerate() {
        let data = pattern(*len, i as u64);
        w.pwrite(fd, &data, (i as u64) << 20).unwrap();
        writes += 1;
        written += *len as u64;
    }
    // Scrape while a reader runs on another thread.
    let r = client(&s, "reader");
    let rfd = r.open("f", libc::O_RDONLY, 0).unwrap();
    let reader = std::thread::spawn(move || {
        let (mut n, mut bytes) = (0u64, 0u64);
        let mut buf = vec![0u8; 1 << 20];
        for k in 0..200u64 {
            let len = [4096usize, 1 << 20, 777][k as usize % 3];
            bytes += r.pread(rfd, &mut buf[..len], (k % 60) << 20).unwrap() as u64;
            n += 1;
        }
        (n, bytes)
    });
    let during = scrape(&s);
    assert!(value(&during, "sluice_scheduler_view_ok", &[]) == Some(1.0), "the event loop answers a scrape under load");
    (reads, read) = {
        let (n, b) = reader.join().unwrap();
        (reads + n, read + b)
    };
    // The reader's client closed its connection when its thread ended;
    // the server learns of it on its own event loop, so a scrape made at
    // once may still count it (one `make test` saw 1 connection): scrape
    // until it is gone, for at most 5 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let after = loop {
        let now = scrape(&s);
        if value(&now, "sluice_app_connections", &[("app", "reader")]) == Some(0.0) || std::time::Instant::now() >= deadline {
            break now;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let v = |name: &str, labels: &[(&str, &str)]| value(&after, name, labels).unwrap_or_else(|| panic!("{name} {labels:?} missing"));
    assert_eq!(v("sluice_app_requests_total", &[("app", "writer"), ("op", "write")]), writes as f64);
    assert_eq!(v("sluice_app_bytes_total", &[("app", "writer"), ("op", "write")]), written as f64);
    assert_eq!(v("sluice_app_requests_total", &[("app", "reader"), ("op", "read")]), reads as f64);
    assert_eq!(v("sluice_app_bytes_total", &[("app", "reader"), ("op", "read")]), read as f64);
    assert_eq!(v("sluice_app_requests_total", &[("app", "reader"), ("op", "write")]), 0.0);
    for app in ["writer", "reader"] {
        let n = if app == "writer" { writes } else { reads };
        assert_eq!(v("sluice_app_latency_seconds_count", &[("app", app)]), n as f64, "every request's latency is recorded");
        assert_eq!(v("sluice_app_queue_wait_seconds_count", &[("app", app)]), n as f64);
        assert_eq!(v("sluice_app_service_seconds_bucket", &[("app", app), ("le", "+Inf")]), n as f64);
        assert_eq!(v("sluice_app_errors_total", &[("app", app)]), 0.0);
        assert_eq!(v("sluice_app_connections", &[("app", app)]), if app == "writer" { 1.0 } else { 0.0 }, "the reader's client is gone");
    }
    // The server's own counters (the Stats request) agree exactly.
    let st = w.server_stats().unwrap();
    let (ws, rs) = (st.app("writer").unwrap(), st.app("reader").unwrap());
    assert_eq!((ws.requests, ws.bytes_written, ws.dispatches), (writes, written, v("sluice_app_dispatches_total", &[("app", "writer")]) as u64));
    assert_eq!((rs.requests, rs.bytes_read), (reads, read));
    // Scheduler and device: everything admitted was dispatched and is done.
    assert_eq!(v("sluice_scheduler_requests_total", &[]), (writes + reads) as f64);
    assert_eq!(v("sluice_scheduler_queued_requests", &[]) + v("sluice_scheduler_inflight_requests", &[]), 0.0);
    assert!(v("sluice_device_bytes_total", &[("op", "write")]) >= written as f64);
    assert_eq!(v("sluice_device_dispatches_total", &[]), v("sluice_scheduler_dispatches_total", &[]));
    assert!(value(&after, "sluice_scheduler_policy", &[("policy", "aioli")]).is_some());
    assert_eq!(value(&after, "sluice_scheduler_active_policy", &[("policy", "aioli")]), Some(1.0), "aioli chooses under aioli");
    assert_eq!(v("sluice_scheduler_policy_switches_total", &[]), 0.0, "one policy decides for the server's lifetime");
    assert!(value(&after, "sluice_device_model_parallelism", &[]).is_some(), "the learned model is exposed");
}

/// Writes under write leases (the default) are no requests, but a scrape
/// counts their bytes as the client reports them, connection still open.
#[test]
fn a_scrape_counts_the_bytes_written_under_write_leases() {
    let s = with_metrics(64);
    let c = Client::connect_with(&s.addr(), ConnectOptions { app: Some("leaser".into()), ..ConnectOptions::default() }).unwrap();
    let fd = c.open("w", libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
    for k in 0..16u64 {
        assert_eq!(c.pwrite(fd, &pattern(32 << 10, k), k * (32 << 10)).unwrap(), 32 << 10);
    }
    let m = scrape(&s);
    assert_eq!(value(&m, "sluice_app_bytes_total", &[("app", "leaser"), ("op", "write")]), Some(16.0 * f64::from(32 << 10)));
    assert_eq!(value(&m, "sluice_app_requests_total", &[("app", "leaser"), ("op", "write")]), Some(0.0), "leased: no request");
    assert_eq!(value(&m, "sluice_device_dispatches_total", &[]), Some(0.0));
}

#[test]
fn applications_past_the_label_bound_are_folded_into_other() {
    let s = with_metrics(2);
    let clients: Vec<Client> = ["a", "b", "c"].iter().map(|a| client(&s, a)).collect();
    for (k, c) in clients.iter().enumerate() {
        let fd = c.open(&format!("f{k}"), libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
        for i in 0..=k as u64 {
            c.pwrite(fd, b"hello", i * 5).unwrap();
        }
    }
    let m = scrape(&s);
    let n = |app: &str| value(&m, "sluice_app_requests_total", &[("app", app), ("op", "write")]);
    assert_eq!((n("a"), n("b")), (Some(1.0), Some(2.0)), "the first N applications keep their label");
    assert_eq!((n("c"), n(OTHER_APPS)), (None, Some(3.0)), "the N+1st is summed under (other)");
    let s2 = with_metrics(3);
    let c2: Vec<Client> = ["a", "b", "c"].iter().map(|a| client(&s2, a)).collect();
    c2.iter().for_each(|c| assert!(c.open("g", libc::O_CREAT | libc::O_RDWR, 0o644).is_ok()));
    let m2 = scrape(&s2);
    assert!(
        value(&m2, "sluice_app_connections", &[("app", "c")]).is_some() && value(&m2, "sluice_app_connections", &[("app", OTHER_APPS)]).is_none(),
        "N apps at a bound of N: no fold"
    );
}

#[test]
fn the_request_head_bound_holds_at_n_and_n_plus_1() {
    let s = with_metrics(64);
    let addr = s.handle.metrics_addr().unwrap();
    let head = |total: usize| {
        let base = "GET /metrics HTTP/1.1\r\nX-Pad: ";
        let pad = total - base.len() - 4;
        format!("{base}{}\r\n\r\n", "p".repeat(pad)).into_bytes()
    };
    assert_eq!(head(REQUEST_BYTES_MAX).len(), REQUEST_BYTES_MAX);
    assert_eq!(http(addr, &head(REQUEST_BYTES_MAX)).0, 200, "a head of exactly the bound is served");
    assert_eq!(http(addr, &head(REQUEST_BYTES_MAX + 1)).0, 431, "one byte more is refused");
    assert_eq!(http(addr, b"POST /metrics HTTP/1.1\r\n\r\n").0, 405);
    assert_eq!(http(addr, b"GET /nope HTTP/1.1\r\n\r\n").0, 404);
    let (status, page) = http(addr, b"GET / HTTP/1.1\r\n\r\n");
    assert!(status == 200 && page.contains("<canvas") && !page.contains("http://") && !page.contains("https://"), "the dashboard is one page that fetches nothing from elsewhere");
}

#[test]
fn a_stalled_scrape_client_is_dropped_and_the_next_is_served_meanwhile() {
    let s = with_metrics(64);
    let addr = s.handle.metrics_addr().unwrap();
    let mut stalled = TcpStream::connect(addr).unwrap();
    stalled.write_all(b"GET /metr").unwrap();
    let t = Instant::now();
    let (status, _) = http(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(status, 200);
    // Served one client at a time, it waited for the stalled one's 2 s;
    // served at once, it takes milliseconds (so the bound is generous).
    assert!(t.elapsed() < sluice_server::metrics::IO_TIMEOUT, "it waited for the stalled one: {:?}", t.elapsed());
    let mut rest = Vec::new();
    stalled.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(stalled.read_to_end(&mut rest).map(|_| rest.len()).unwrap_or(0), 0, "the stalled client got nothing and was closed");
}

#[test]
fn the_live_trace_holds_every_request_and_a_pause_records_nothing() {
    let dir = common::temp_dir();
    let path = dir.path().join("live.json");
    let p = path.clone();
    let mut s = TestServer::start(move |c| c.trace = Some(p));
    let c = client(&s, "traced");
    let fd = c.open("f", libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
    let burst = |n: u64| (0..n).for_each(|i| assert_eq!(c.pwrite(fd, &pattern(4096, i), i * 4096).unwrap(), 4096));
    burst(10);
    assert!(s.handle.tracing());
    assert!(s.handle.set_tracing(false));
    burst(7);
    assert!(s.handle.set_tracing(true));
    burst(5);
    drop(c);
    s.handle.shutdown().unwrap();
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).expect("a complete JSON document");
    let ev = doc["traceEvents"].as_array().unwrap();
    let begins = |cat: &str| ev.iter().filter(|e| e["cat"] == cat && e["ph"] == "b").count();
    assert_eq!(begins("request"), 15, "10 before the pause and 5 after it");
    let members: u64 = ev.iter().filter(|e| e["cat"] == "dispatch" && e["ph"] == "b").map(|e| e["args"]["requests"].as_u64().unwrap()).sum();
    assert_eq!(members, 15, "dispatches carry exactly the traced requests");
    assert!(ev.iter().any(|e| e["name"] == "process_name" && e["args"]["name"] == "traced"), "the application's track is named");
    assert_eq!(doc["otherData"]["records_dropped"], 0);
}

#[test]
fn the_emulated_disk_starts_the_learner_from_its_own_figures() {
    // One 4 KiB write and read: far too few dispatches to learn a seek
    // cost, so what the model shows is where the learner started. On the
    // emulated disk that is the disk's own figures (13.17 ms of seek and
    // rotation); on a real device the generic prior (no seek).
    for (device, seek_min, seek_max) in [(sluice_server::DeviceKind::Hdd7200, 0.010, 0.015), (sluice_server::DeviceKind::Real, 0.0, 0.000_001)] {
        let s = TestServer::start(|c| {
            c.metrics = Some("127.0.0.1:0".into());
            c.device = device;
            c.queue_depth = 1;
        });
        let c = client(&s, "one");
        let fd = c.open("f", libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
        c.pwrite(fd, &pattern(4096, 1), 0).unwrap();
        let mut buf = vec![0u8; 4096];
        c.pread(fd, &mut buf, 0).unwrap();
        let seek = value(&scrape(&s), "sluice_device_model_seek_seconds", &[]).expect("the model is exposed after a dispatch");
        assert!((seek_min..=seek_max).contains(&seek), "{device:?}: the model starts at {seek} s of seek");
    }
}

#[test]
fn a_short_read_teaches_the_learner_nothing() {
    // A read past the end of the file returns at once with nothing: were
    // it a latency of its length, the learner's lower edges (which drop
    // to any shorter latency) would take it for the device's cost.
    let s = TestServer::start(|c| c.metrics = Some("127.0.0.1:0".into()));
    std::fs::write(s.root.path().join("f"), pattern(4096, 1)).unwrap();
    let c = client(&s, "one");
    let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 4096];
    for _ in 0..4 {
        assert_eq!(c.pread(fd, &mut buf, 1 << 20).unwrap(), 0);
    }
    assert_eq!(c.pread(fd, &mut buf, 2048).unwrap(), 2048, "a read that ends at the end of the file is short too");
    assert_eq!(value(&scrape(&s), "sluice_device_model_seek_seconds", &[]), None, "the model is shown once a dispatch was observed");
    assert_eq!(c.pread(fd, &mut buf, 0).unwrap(), 4096);
    assert!(value(&scrape(&s), "sluice_device_model_seek_seconds", &[]).is_some(), "a whole read is observed");
}

#[test]
fn service_classes_and_their_changes_are_in_the_exposition() {
    let s = TestServer::start(|c| c.metrics = Some("127.0.0.1:0".into()));
    let m = scrape(&s);
    assert_eq!(value(&m, "sluice_qos_changes_total", &[]), Some(0.0));
    assert_eq!(value(&m, "sluice_qos_class_dispatched_bytes_total", &[("class", "default")]), None, "no classes, no class families");
    let rules = "[[class]]\nname = \"slow\"\nrate_bytes_per_s = 1000000\n[[rule]]\nclass = \"slow\"\napp = \"slow\"\n";
    s.handle.set_qos(Some(sluice_server::qos::QosRules::parse(rules).unwrap()));
    common::within_5s("the classes applied", || !s.handle.class_stats().is_empty());
    std::fs::write(s.path("q"), pattern(8192, 1)).unwrap();
    let c = client(&s, "slow");
    let fd = c.open("q", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 4096];
    c.pread(fd, &mut buf, 0).unwrap();
    let m = scrape(&s);
    assert_eq!(value(&m, "sluice_qos_changes_total", &[]), Some(1.0));
    assert_eq!(value(&m, "sluice_qos_class_admitted_requests_total", &[("class", "slow")]), Some(1.0));
    assert_eq!(value(&m, "sluice_qos_class_dispatched_bytes_total", &[("class", "slow")]), Some(4096.0));
    assert_eq!(value(&m, "sluice_qos_class_waiting_requests", &[("class", "default")]), Some(0.0));
}
