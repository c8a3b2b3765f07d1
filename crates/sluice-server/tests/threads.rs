//! The event-driven server's threads do not grow with its connections:
//! 300 connected clients, each with a file open and a read
//! answered, and the process has the same threads as with one. Alone in
//! its test binary, so no other test's threads are counted.

mod common;

use common::TestServer;

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").expect("/proc/self/task").count()
}

#[test]
fn three_hundred_connections_add_no_threads() {
    let s = TestServer::start(|_| {});
    std::fs::write(s.path("f"), vec![7u8; 4096]).unwrap();
    let first = s.client("first");
    let fd = first.open("f", libc::O_RDONLY, 0).unwrap();
    let mut buf = [0u8; 16];
    first.pread(fd, &mut buf, 0).unwrap();
    let before = threads();
    let clients: Vec<_> = (0..300)
        .map(|i| {
            let c = s.client(&format!("app{}", i % 7));
            let fd = c.open("f", libc::O_RDONLY, 0).unwrap();
            let mut b = [0u8; 16];
            assert_eq!(c.pread(fd, &mut b, 0).unwrap(), 16);
            c
        })
        .collect();
    assert_eq!(s.handle.connections(), 301);
    let after = threads();
    assert_eq!(after, before, "threads went from {before} to {after} with 300 more connections");
    drop(clients);
}
