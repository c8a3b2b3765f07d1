//! Test harness: an in-process server on a temporary root and socket,
//! drained and removed when the guard drops, even when a test fails.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use sluice_client::{Client, ConnectOptions};
use sluice_server::{Listen, Server, ServerConfig, ServerHandle};
use tempfile::TempDir;

/// A running server and the directories it lives in.
pub struct TestServer {
    pub handle: ServerHandle,
    pub root: TempDir,
    _sock_dir: TempDir,
}

/// A temporary directory on the target's file system (ext4 here, unlike
/// /dev/shm), so O_DIRECT works in it.
pub fn temp_dir() -> TempDir {
    tempfile::Builder::new().prefix("sluice-").tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

impl TestServer {
    /// Start a server with `tweak` applied to the default configuration.
    pub fn start(tweak: impl FnOnce(&mut ServerConfig)) -> TestServer {
        let root = temp_dir();
        let sock_dir = tempfile::Builder::new().prefix("sluice-sock-").tempdir().expect("socket dir");
        let sock = sock_dir.path().join("s.sock");
        let mut cfg = ServerConfig::new(root.path(), Listen::Unix(sock));
        tweak(&mut cfg);
        let handle = Server::start(cfg).expect("server starts");
        TestServer { handle, root, _sock_dir: sock_dir }
    }

    pub fn addr(&self) -> String {
        self.handle.addr().to_string()
    }

    /// A client of application `app`.
    pub fn client(&self, app: &str) -> Client {
        Client::connect_with(&self.addr(), ConnectOptions { app: Some(app.into()), ..ConnectOptions::default() }).expect("client connects")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }
}

/// Deterministic test bytes: `len` bytes seeded by `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Read one reply frame from a raw connection (descriptors it carries are
/// dropped by the plain `read`).
pub fn raw_reply(sock: &mut UnixStream) -> (sluice_proto::Header, Vec<u8>) {
    let mut h = [0u8; sluice_proto::HEADER_BYTES];
    sock.read_exact(&mut h).unwrap();
    let h = sluice_proto::check_header(&h, sluice_proto::FRAME_BYTES_MAX).unwrap().unwrap();
    let mut body = vec![0u8; h.body_len as usize];
    sock.read_exact(&mut body).unwrap();
    (h, body)
}

/// Send `req` as request `id` on a raw connection; its reply, as `Debug`.
pub fn raw_call(sock: &mut UnixStream, id: u64, req: &sluice_proto::Request<'_>) -> String {
    let mut f = Vec::new();
    sluice_proto::encode_request(id, req, &mut f).unwrap();
    sock.write_all(&f).unwrap();
    let (h, body) = raw_reply(sock);
    assert_eq!(h.request_id, id);
    format!("{:?}", sluice_proto::parse_response(&h, &body).unwrap())
}

/// A raw connection to `s` that said Hello as application "raw" and opened
/// `path` read-only as handle 3.
pub fn raw_session(s: &TestServer, path: &str) -> UnixStream {
    use sluice_proto::{Hello, Request, VERSION};
    let mut sock = UnixStream::connect(s.addr().strip_prefix("unix:").unwrap()).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
    raw_call(&mut sock, 1, &Request::Hello(Hello { version: VERSION, app: "raw", weight: 1, client_id: 0, cred: None }));
    let fd = raw_call(&mut sock, 2, &Request::Open { path, flags: libc::O_RDONLY, mode: 0 });
    assert!(fd.starts_with("Fd(3, "), "{fd}");
    sock
}

/// Wait up to 5 s for `done`, failing with `what`.
pub fn within_5s(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
