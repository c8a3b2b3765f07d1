//! Structure-aware fuzzing of a live server: seeded, valid
//! sessions (a `Hello` and a run of real requests on real paths), then
//! mutated as a hostile or broken client would (bytes flipped, frames cut,
//! duplicated or swapped, lengths that lie, a half-close mid-frame), sent
//! on fresh connections. After each session the server must have answered
//! only well-formed frames, never more than one per request sent plus one,
//! and a bystander's connection must still work; nothing may appear
//! outside the root.
//!
//! Bounded in sessions and in time: `SLUICE_FUZZ_SESSIONS` (default 3,000)
//! and `SLUICE_FUZZ_SECS` (default 20). A failure prints its seed;
//! `SLUICE_FUZZ_SEED=N` replays one session.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::TestServer;
use sluice_proto::*;

/// SplitMix64: one u64 drives a whole session.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const PATHS: [&str; 7] = ["a", "d/b", "d", "", "../escape", "/etc/passwd", "d/../a"];

/// One valid request on the session's paths and handles 3..6.
fn request(r: &mut Rng, data: &[u8]) -> Vec<u8> {
    let path = PATHS[r.below(PATHS.len() as u64) as usize];
    let (fd, off, len) = (3 + r.below(4), r.below(1 << 20), 1 + r.below(64 << 10));
    let req = match r.below(12) {
        0 => Request::Open { path, flags: [libc::O_RDONLY, libc::O_RDWR | libc::O_CREAT, libc::O_WRONLY | libc::O_TRUNC][r.below(3) as usize], mode: 0o644 },
        1 => Request::Read { fd, offset: off, len: len as u32 },
        2 => Request::Write { fd, offset: off, data: &data[..r.below(data.len() as u64) as usize] },
        3 => Request::ReadList { fd, pieces: (0..r.below(5)).map(|_| (r.below(1 << 20), r.below(4096))).collect(), group: None },
        4 => Request::Stat { path },
        5 => Request::Fstat { fd },
        6 => Request::Readdir { path, start: r.below(3) as u32 },
        7 => Request::Mkdir { path, mode: 0o755 },
        8 => Request::Close { fd },
        9 => Request::Ftruncate { fd, len: r.below(1 << 16) },
        10 => Request::Rename { from: path, to: PATHS[r.below(PATHS.len() as u64) as usize] },
        _ => Request::Stats,
    };
    let mut out = Vec::new();
    encode_request(r.next(), &req, &mut out).expect("session paths are short");
    out
}

/// A valid session as frames: `Hello` first.
fn session(r: &mut Rng) -> Vec<Vec<u8>> {
    let data: Vec<u8> = (0..4096).map(|i| i as u8).collect();
    let mut hello = Vec::new();
    encode_request(0, &Request::Hello(Hello { version: VERSION, app: "fuzz", weight: 1, client_id: 1, cred: None }), &mut hello).unwrap();
    let mut frames = vec![hello];
    frames.extend((0..1 + r.below(12)).map(|_| request(r, &data)));
    frames
}

/// Mutate a session as a broken or hostile client would. Returns the
/// bytes and whether to half-close after them.
fn mutate(r: &mut Rng, mut frames: Vec<Vec<u8>>) -> (Vec<u8>, bool) {
    for _ in 0..r.below(3) {
        let i = r.below(frames.len() as u64) as usize;
        let n = frames.len() as u64;
        let f = &mut frames[i];
        match r.below(7) {
            0 => {
                let at = r.below(f.len() as u64) as usize;
                f[at] ^= 1 << r.below(8);
            }
            1 => f.truncate(r.below(f.len() as u64) as usize),
            2 => {
                let at = r.below(f.len() as u64 + 1) as usize;
                let junk: Vec<u8> = (0..1 + r.below(16)).map(|_| r.next() as u8).collect();
                f.splice(at..at, junk);
            }
            3 => {
                let dup = f.clone();
                frames.insert(i, dup);
            }
            4 if n > 1 => {
                let j = r.below(n) as usize;
                frames.swap(i, j);
            }
            5 if f.len() >= 4 => {
                let lie = [0u32, 1, r.next() as u32, u32::MAX, (f.len() as u32).saturating_sub(HEADER_BYTES as u32 - 1)][r.below(5) as usize];
                f[..4].copy_from_slice(&lie.to_le_bytes());
            }
            _ => {} // Valid: most sessions keep some well-formed frames.
        }
    }
    // Most sessions end with a half-close; one in eight stalls instead.
    (frames.concat(), r.below(8) != 0)
}

/// Send one session; read every reply to the end. Panics (with the seed)
/// on a malformed reply or more replies than requests. Returns how many
/// replies succeeded and how many were errors.
fn run_session(s: &TestServer, seed: u64) -> (u64, u64) {
    let mut r = Rng(seed);
    let frames = session(&mut r);
    let sent = frames.len();
    let (bytes, half_close) = mutate(&mut r, frames);
    let mut sock = UnixStream::connect(s.addr().strip_prefix("unix:").unwrap()).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let _ = sock.write_all(&bytes);
    if half_close {
        let _ = sock.shutdown(std::net::Shutdown::Write);
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 64 << 10];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // Still open and quiet: the server waits for more of a frame
            // that will never come; drop the connection.
            Err(_) => break,
        }
    }
    let mut rest = got.as_slice();
    let (mut replies, mut errors) = (0, 0u64);
    while !rest.is_empty() {
        let h = check_header(rest, FRAME_BYTES_MAX).unwrap_or_else(|e| panic!("seed {seed}: malformed reply header: {e}"));
        let h = h.unwrap_or_else(|| panic!("seed {seed}: reply cut inside its header"));
        let end = HEADER_BYTES + h.body_len as usize;
        assert!(rest.len() >= end, "seed {seed}: reply cut inside its body");
        let resp = parse_response(&h, &rest[HEADER_BYTES..end]).unwrap_or_else(|e| panic!("seed {seed}: malformed reply: {e}"));
        errors += u64::from(matches!(resp, Response::Error { .. }));
        rest = &rest[end..];
        replies += 1;
    }
    assert!(replies <= sent * 2 + 1, "seed {seed}: {replies} replies to at most {} frames", sent * 2);
    (replies as u64 - errors, errors)
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn mutated_valid_sessions_never_harm_the_server() {
    let s = TestServer::start(|c| c.limits.frame_bytes_max = 1 << 20);
    std::fs::create_dir(s.path("d")).unwrap();
    std::fs::write(s.path("a"), vec![1u8; 8192]).unwrap();
    let bystander = s.client("bystander");
    let fd = bystander.open("by", libc::O_RDWR | libc::O_CREAT, 0o644).unwrap();
    let seeds: Vec<u64> = match std::env::var("SLUICE_FUZZ_SEED") {
        Ok(v) => vec![v.parse().expect("a u64 seed")],
        Err(_) => (0..env_u64("SLUICE_FUZZ_SESSIONS", 3_000)).collect(),
    };
    let deadline = Instant::now() + Duration::from_secs(env_u64("SLUICE_FUZZ_SECS", 20));
    let (mut ran, mut ok, mut refused) = (0u64, 0u64, 0u64);
    for seed in seeds {
        if Instant::now() > deadline {
            break;
        }
        let (o, e) = run_session(&s, seed);
        (ran, ok, refused) = (ran + 1, ok + o, refused + e);
        if seed % 100 == 0 {
            assert_eq!(bystander.pwrite(fd, b"alive", 0).unwrap(), 5, "seed {seed}: the bystander's connection broke");
        }
    }
    assert!(ran >= 100, "only {ran} sessions ran: the machine is far too slow for the budget");
    assert_eq!(bystander.pwrite(fd, b"still alive", 0).unwrap(), 11);
    // "../escape" is one of the session paths: it must never exist.
    assert!(!s.root().parent().unwrap().join("escape").exists(), "a session created a file outside the root");
    // Not vacuous: the sessions reached real work, and the mutations hit.
    assert!(ok > ran && refused > ran / 10, "{ran} sessions: {ok} replies succeeded, {refused} were errors");
    eprintln!("fuzz: {ran} mutated sessions, {ok} successful replies, {refused} error replies");
}
