//! Service classes on a running server: the rules place each application
//! by its name and identity; a rate-limited class is held to its rate; a
//! live change (`ServerHandle::set_qos`) takes effect at once, with every
//! request answered exactly once.

mod common;

use std::time::{Duration, Instant};

use common::{pattern, TestServer};
use sluice_client::{Client, ConnectOptions};
use sluice_server::qos::QosRules;

const RULES: &str = r#"
[[class]]
name = "slow"
rate_requests_per_s = 200

[[rule]]
class = "slow"
app = "slow-*"
"#;

fn client(s: &TestServer, app: &str) -> Client {
    // No leases: every read reaches the scheduler.
    Client::connect_with(&s.addr(), ConnectOptions { app: Some(app.into()), leases: false, ..ConnectOptions::default() }).unwrap()
}

#[test]
fn a_limited_class_is_held_to_its_rate_and_a_live_change_frees_it_at_once() {
    let s = TestServer::start(|c| c.qos = Some(QosRules::parse(RULES).unwrap()));
    let data = pattern(4096 * 400, 3);
    std::fs::write(s.path("f"), &data).unwrap();
    let (slow, fast) = (client(&s, "slow-1"), client(&s, "fast-1"));
    let (fs, ff) = (slow.open("f", libc::O_RDONLY, 0).unwrap(), fast.open("f", libc::O_RDONLY, 0).unwrap());
    let mut buf = vec![0u8; 4096];
    // 40 reads at 200 a second (after a bucket of 20 ms, 4 reads): about
    // 180 ms; the other application is not held.
    let t = Instant::now();
    for i in 0..40u64 {
        assert_eq!(slow.pread(fs, &mut buf, i * 4096).unwrap(), 4096);
        assert_eq!(&buf[..], &data[(i * 4096) as usize..][..4096]);
    }
    let limited = t.elapsed();
    assert!(limited >= Duration::from_millis(150), "40 reads at 200/s took {limited:?}");
    let t = Instant::now();
    for i in 0..40u64 {
        fast.pread(ff, &mut buf, i * 4096).unwrap();
    }
    assert!(t.elapsed() < limited / 2, "the default class is not limited: {:?}", t.elapsed());
    let classes = s.handle.class_stats();
    assert_eq!(classes.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["slow", "default"]);
    assert_eq!(classes[0].admitted_requests, 40);
    // Live: the limit goes while a reader of the class is at work.
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        let mut done = Vec::new();
        for i in 40..400u64 {
            assert_eq!(slow.pread(fs, &mut buf, i * 4096).unwrap(), 4096);
            assert_eq!(&buf[..], &data[(i * 4096) as usize..][..4096], "read {i}");
            done.push(Instant::now());
        }
        (done, slow)
    });
    std::thread::sleep(Duration::from_millis(200));
    let changed = Instant::now();
    s.handle.set_qos(None);
    let (done, slow) = reader.join().unwrap();
    let after: Vec<&Instant> = done.iter().filter(|&&d| d > changed).collect();
    // Within 100 ms of the change, at least 50 reads completed (the limit
    // allowed 20 in that time).
    let quick = after.iter().filter(|&&&d| d.duration_since(changed) < Duration::from_millis(100)).count();
    assert!(quick >= 50, "{quick} reads in the 100 ms after the change");
    assert_eq!(s.handle.qos_changes(), 1);
    // Every read answered once: the server counted exactly the client's.
    let st = slow.server_stats().unwrap();
    assert_eq!(st.app("slow-1").unwrap().requests, 400);
    assert!(s.handle.class_stats().is_empty(), "no classes left");
}

#[test]
fn the_rules_place_applications_and_a_new_set_places_them_again() {
    let s = TestServer::start(|_| {});
    let c = client(&s, "slow-2");
    std::fs::write(s.path("g"), vec![1u8; 4096 * 8]).unwrap();
    let fd = c.open("g", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![0u8; 4096];
    c.pread(fd, &mut buf, 0).unwrap();
    assert!(s.handle.class_stats().is_empty(), "no classes before --qos");
    // Rules given live place an application already connected.
    s.handle.set_qos(Some(QosRules::parse(RULES).unwrap()));
    common::within_5s("the rules applied", || !s.handle.class_stats().is_empty());
    for i in 1..8u64 {
        c.pread(fd, &mut buf, i * 4096).unwrap();
    }
    let classes = s.handle.class_stats();
    assert_eq!(classes[0].name, "slow");
    assert_eq!(classes[0].admitted_requests, 7, "{classes:?}");
}
