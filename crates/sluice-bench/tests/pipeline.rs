//! The striped client carries a request of many messages from the
//! calling thread: no thread per object or per call. Alone in
//! its test binary, because it counts the process's threads while a read
//! runs, and tests running beside it would start theirs.

use std::time::Duration;

use sluice_client::ConnectOptions;
use sluice_launch::*;
use sluice_remote::*;

fn pattern(len: u64) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8).collect()
}

#[test]
fn a_request_of_more_messages_than_the_window_is_pipelined_from_one_thread() {
    // Each server gets MESSAGES_IN_FLIGHT_MAX + 2 messages of
    // STRIPED_LIST_BYTES_MAX: the window fills, drains and refills.
    let dir = tempfile::tempdir().unwrap();
    let c = LocalCluster::start(LocalClusterConfig::new(dir.path(), 3)).unwrap();
    let s = StripedClient::connect_with(&c.addr(), ConnectOptions { app: Some("big".into()), ..ConnectOptions::default() }).unwrap();
    let f = s.create("big.dat", LayoutRequest { stripe_bytes: 1 << 20, count: -1, start: 0 }).unwrap();
    let len = STRIPED_LIST_BYTES_MAX * (MESSAGES_IN_FLIGHT_MAX as u64 + 2) * 3;
    let data = pattern(len);
    assert_eq!(s.pwrite(&f, &data, 0).unwrap(), data.len());
    // A sampler thread watches the process's thread count while the read
    // runs: the read itself starts none (the per-object threads of old
    // would show up for milliseconds).
    let threads = || -> usize {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap()
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (most, back) = std::thread::scope(|sc| {
        let watcher = sc.spawn(|| {
            let mut most = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(threads());
                std::thread::sleep(Duration::from_micros(200));
            }
            most
        });
        std::thread::sleep(Duration::from_millis(20));
        let during_idle = threads();
        let mut back = vec![0u8; data.len()];
        assert_eq!(s.pread(&f, &mut back, 0).unwrap(), data.len());
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (watcher.join().unwrap().saturating_sub(during_idle), back)
    });
    assert!(back == data, "the pipelined read returns every byte in place");
    assert_eq!(most, 0, "the read started {most} threads");
}
