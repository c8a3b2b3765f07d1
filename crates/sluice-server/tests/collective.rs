//! Server-directed collectives: list messages tagged with a
//! group are held until every participant's has come, then served
//! together in disk order as one application's work; an incomplete group
//! times out for every participant and nothing of it is done, while other
//! clients go on undisturbed.

mod common;

use std::time::{Duration, Instant};

use common::{pattern, TestServer};
use sluice_client::{Client, Group};

const PIECE: u64 = 4096;

fn open(c: &Client, path: &str) -> sluice_client::Fd {
    c.open(path, libc::O_RDWR | libc::O_CREAT, 0o644).unwrap()
}

/// Rank `r` of `n`: every n-th 4 KiB piece of a 1 MiB file (CYCLIC).
fn cyclic(r: u64, n: u64) -> Vec<(u64, u64)> {
    (0..256 / n).map(|i| ((i * n + r) * PIECE, PIECE)).collect()
}

#[test]
fn a_complete_group_is_served_together_in_disk_order_as_one_application() {
    let s = TestServer::start(|_| {});
    let whole = pattern(1 << 20, 7);
    let group = Group { id: 42, participants: 4, wait_ms: 10_000 };
    std::thread::scope(|sc| {
        for r in 0..4u64 {
            let (s, whole) = (&s, &whole);
            sc.spawn(move || {
                let c = s.client(&format!("rank{r}"));
                let fd = open(&c, "a");
                let pieces = cyclic(r, 4);
                let data: Vec<u8> = pieces.iter().flat_map(|&(o, l)| whole[o as usize..(o + l) as usize].to_vec()).collect();
                assert_eq!(c.write_list_group(fd, &pieces, &data, group).unwrap(), data.len());
            });
        }
    });
    assert_eq!(std::fs::read(s.path("a")).unwrap(), whole);
    // All 256 pieces counted once, under one application (the first
    // participant's), in a handful of dispatches instead of 256.
    let stats = s.client("observer").server_stats().unwrap();
    let ranks: Vec<_> = stats.apps.iter().filter(|a| a.name.starts_with("rank") && a.requests > 0).collect();
    assert_eq!(ranks.len(), 1, "one application did the collective: {:?}", stats.apps);
    assert_eq!(ranks[0].requests, 256);
    assert!(ranks[0].dispatches <= 16, "{} dispatches for 256 contiguous pieces", ranks[0].dispatches);

    // A collective read of the same file by three ranks.
    let group = Group { id: 43, participants: 3, wait_ms: 10_000 };
    std::thread::scope(|sc| {
        for r in 0..3u64 {
            let (s, whole) = (&s, &whole);
            sc.spawn(move || {
                let c = s.client("readers");
                let fd = open(&c, "a");
                let pieces: Vec<(u64, u64)> = (0..85).map(|i| ((i * 3 + r) * PIECE, PIECE)).collect();
                let mut buf = vec![0u8; pieces.len() * PIECE as usize];
                c.read_list_group(fd, &pieces, &mut buf, group).unwrap();
                for (k, &(o, l)) in pieces.iter().enumerate() {
                    assert_eq!(&buf[k * PIECE as usize..(k + 1) * PIECE as usize], &whole[o as usize..(o + l) as usize]);
                }
            });
        }
    });
}

#[test]
fn a_group_missing_a_participant_times_out_for_everyone_and_does_nothing() {
    let s = TestServer::start(|_| {});
    let group = Group { id: 1, participants: 3, wait_ms: 400 };
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        for r in 0..2u64 {
            let s = &s;
            sc.spawn(move || {
                let c = s.client("job");
                let fd = open(&c, "b");
                let pieces = cyclic(r, 3);
                let data = vec![0xab; pieces.len() * PIECE as usize];
                let e = c.write_list_group(fd, &pieces, &data, group).unwrap_err();
                assert_eq!(e.posix_errno(), libc::ETIMEDOUT, "{e}");
                assert!(e.to_string().contains("2 of 3 participants"), "{e}");
            });
        }
        // Meanwhile another application is served as usual.
        let s = &s;
        sc.spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let c = s.client("other");
            let fd = open(&c, "c");
            let t = Instant::now();
            c.pwrite(fd, &[1u8; 4096], 0).unwrap();
            assert!(t.elapsed() < Duration::from_millis(300), "an unrelated write waited {:?}", t.elapsed());
        });
    });
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(400) && waited < Duration::from_secs(10), "timed out after {waited:?}");
    // Nothing of the group was written.
    assert_eq!(std::fs::metadata(s.path("b")).unwrap().len(), 0);
}

#[test]
fn the_wait_is_clamped_by_collective_wait_ms_max() {
    let s = TestServer::start(|c| c.limits.collective_wait_ms_max = 200);
    let c = s.client("job");
    let fd = open(&c, "d");
    let t0 = Instant::now();
    let e = c.write_list_group(fd, &[(0, 8)], &[0u8; 8], Group { id: 5, participants: 2, wait_ms: u32::MAX }).unwrap_err();
    assert_eq!(e.posix_errno(), libc::ETIMEDOUT);
    assert!(t0.elapsed() < Duration::from_secs(5), "waited {:?} past the server's bound", t0.elapsed());
}

#[test]
fn a_participant_that_disagrees_is_refused_and_collectives_max_holds_at_n_and_n_plus_1() {
    let s = TestServer::start(|c| {
        c.limits.collectives_max = 2;
        c.limits.collective_wait_ms_max = 500;
    });
    std::thread::scope(|sc| {
        let s = &s;
        // Groups 1 and 2 gather (and later time out): the table is full.
        for id in [1u64, 2] {
            sc.spawn(move || {
                let c = s.client("job");
                let fd = open(&c, "e");
                let e = c.write_list_group(fd, &[(0, 8)], &[0u8; 8], Group { id, participants: 2, wait_ms: 500 }).unwrap_err();
                assert_eq!(e.posix_errno(), libc::ETIMEDOUT);
            });
        }
        std::thread::sleep(Duration::from_millis(150));
        let c = s.client("late");
        let fd = open(&c, "e");
        // A third group is one too many.
        let e = c.read_list_group(fd, &[(0, 8)], &mut [0u8; 8], Group { id: 3, participants: 2, wait_ms: 500 }).unwrap_err();
        assert_eq!(e.posix_errno(), libc::EAGAIN, "{e}");
        assert!(e.to_string().contains("collectives_max"), "{e}");
        // A participant of group 1 announcing another size is refused.
        let e = c.write_list_group(fd, &[(8, 8)], &[0u8; 8], Group { id: 1, participants: 5, wait_ms: 500 }).unwrap_err();
        assert_eq!(e.posix_errno(), libc::EINVAL, "{e}");
    });
    // Both expired: the table has room again, and a group of one completes at once.
    let c = s.client("job");
    let fd = open(&c, "e");
    assert_eq!(c.write_list_group(fd, &[(0, 4)], b"done", Group { id: 9, participants: 1, wait_ms: 500 }).unwrap(), 4);
    assert_eq!(std::fs::read(s.path("e")).unwrap(), b"done");
}

#[test]
fn a_group_enters_the_queue_whole_or_is_refused_whole() {
    // A queue of 8 requests: a complete group of 8 pieces enters (and is
    // written), one of 9 can never fit and is refused E2BIG with nothing
    // written.
    let s = TestServer::start(|c| c.sched_limits.queued_requests_max = 8);
    let run = |id: u64, pieces_per_rank: u64| -> Vec<i32> {
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..2u64)
                .map(|r| {
                    let s = &s;
                    sc.spawn(move || {
                        let c = s.client("job");
                        let fd = open(&c, "q");
                        let pieces: Vec<(u64, u64)> = (0..pieces_per_rank).map(|i| ((id * 100 + i * 2 + r) * 8, 8)).collect();
                        let data = vec![id as u8; pieces.len() * 8];
                        c.write_list_group(fd, &pieces, &data, Group { id, participants: 2, wait_ms: 5_000 }).map(|_| 0).unwrap_or_else(|e| e.posix_errno())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    assert_eq!(run(1, 4), vec![0, 0], "8 pieces fit a queue of 8");
    let five = run(2, 5);
    assert_eq!(five, vec![libc::E2BIG, libc::E2BIG], "10 pieces never fit");
    let bytes = std::fs::read(s.path("q")).unwrap();
    assert_eq!(bytes.len(), 864, "nothing past the first group");
    assert!(bytes[800..864].iter().all(|&b| b == 1), "the first group was written");
}
