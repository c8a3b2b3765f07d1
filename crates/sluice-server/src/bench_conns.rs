//! `sluice bench connections`: what `count` idle connected clients cost the
//! server (threads and resident memory it adds), and a 4 KiB round trip
//! of one more client while they stay connected (issue 12's 10,000
//! connections goal).
//!
//! The server runs in this process with `clients_max = count + 1`; the
//! idle clients are bare Unix sockets that completed the handshake, so
//! they add almost nothing on the client side and the figures are the
//! server's. The process's file-descriptor limit is raised to its hard
//! limit first (each connection costs the server three descriptors and
//! this process one).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use sluice_client::{Client, ConnectOptions};
use sluice_proto::{check_header, encode_request, Hello, Request, FRAME_BYTES_MAX, HEADER_BYTES, VERSION};

use crate::error::{Error, ErrorKind, Result};
use crate::{Listen, Server, ServerConfig};

/// What to measure.
#[derive(Clone, Debug)]
pub struct ConnectionsBenchConfig {
    /// Scratch directory for the root and the socket.
    pub dir: PathBuf,
    /// Idle connections held open.
    pub count: u32,
    /// Blocking 4 KiB reads timed while they are open.
    pub rtt_requests: u32,
}

/// The figures.
#[derive(Clone, Debug, Serialize)]
pub struct ConnectionsBenchReport {
    pub count: u32,
    /// Threads of this process with the server idle, and with `count`
    /// connections open: the difference is the server's.
    pub threads_idle: u64,
    pub threads_connected: u64,
    /// Resident memory the connections added, MiB.
    pub rss_added_mib: f64,
    /// Seconds to open and hand-shake all of them.
    pub connect_s: f64,
    /// One more client's 4 KiB read round trip meanwhile, µs.
    pub rtt_4k_us: f64,
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(what, &e)
}

/// `Threads:` and `VmRSS:` (bytes) of this process.
fn threads_and_rss() -> Result<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").map_err(io_err("read /proc/self/status"))?;
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok((field("Threads:"), field("VmRSS:") << 10))
}

/// Raise the soft descriptor limit to the hard one.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

/// A bare socket that completed the handshake.
fn idle_client(path: &std::path::Path, i: u32) -> Result<UnixStream> {
    let mut s = UnixStream::connect(path).map_err(io_err("connect"))?;
    let mut hello = Vec::new();
    let req = Request::Hello(Hello { version: VERSION, app: "idle", weight: 1, client_id: i, cred: None });
    encode_request(0, &req, &mut hello).map_err(|e| Error::invalid(e.to_string()))?;
    s.write_all(&hello).map_err(io_err("hello"))?;
    let mut h = [0u8; HEADER_BYTES];
    s.read_exact(&mut h).map_err(io_err("hello reply"))?;
    let header = check_header(&h, FRAME_BYTES_MAX).ok().flatten().ok_or_else(|| Error::invalid("bad hello reply"))?;
    let mut body = vec![0u8; header.body_len as usize];
    s.read_exact(&mut body).map_err(io_err("hello reply"))?;
    Ok(s)
}

/// Run the benchmark. See the module documentation.
pub fn run(cfg: &ConnectionsBenchConfig) -> Result<ConnectionsBenchReport> {
    raise_fd_limit();
    let scratch = cfg.dir.join(format!("sluice-bench-conns-{}", std::process::id()));
    std::fs::create_dir_all(scratch.join("root")).map_err(io_err("create scratch dir"))?;
    std::fs::write(scratch.join("root/f"), vec![7u8; 1 << 20]).map_err(io_err("write test file"))?;
    let result = measure(cfg, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

fn measure(cfg: &ConnectionsBenchConfig, scratch: &std::path::Path) -> Result<ConnectionsBenchReport> {
    let sock = scratch.join("s.sock");
    let mut sc = ServerConfig::new(scratch.join("root"), Listen::Unix(sock.clone()));
    sc.limits.clients_max = cfg.count.saturating_add(1);
    let mut server = Server::start(sc)?;
    let (threads_idle, rss_idle) = threads_and_rss()?;
    let t = Instant::now();
    let idle = (0..cfg.count).map(|i| idle_client(&sock, i)).collect::<Result<Vec<_>>>()?;
    let connect_s = t.elapsed().as_secs_f64();
    let (threads_connected, rss_connected) = threads_and_rss()?;
    let c = Client::connect_with(server.addr(), ConnectOptions { app: Some("probe".into()), ..ConnectOptions::default() })
        .map_err(|e| Error::new(ErrorKind::Io, e.errno, e.message))?;
    let fd = c.open("f", libc::O_RDONLY, 0).map_err(|e| Error::new(ErrorKind::Io, e.errno, e.message))?;
    let mut buf = [0u8; 4096];
    let t = Instant::now();
    for i in 0..u64::from(cfg.rtt_requests.max(1)) {
        c.pread(fd, &mut buf, (i % 256) * 4096).map_err(|e| Error::new(ErrorKind::Io, e.errno, e.message))?;
    }
    let rtt_4k_us = t.elapsed().as_secs_f64() * 1e6 / f64::from(cfg.rtt_requests.max(1));
    drop(c);
    drop(idle);
    server.shutdown()?;
    Ok(ConnectionsBenchReport {
        count: cfg.count,
        threads_idle,
        threads_connected,
        rss_added_mib: rss_connected.saturating_sub(rss_idle) as f64 / f64::from(1u32 << 20),
        connect_s,
        rtt_4k_us,
    })
}

/// The report as a few lines of text.
pub fn table(r: &ConnectionsBenchReport) -> String {
    format!(
        "{} idle connections\n\
         threads:                      {} idle -> {} connected (+{})\n\
         resident memory added:        {:.1} MiB ({:.1} KiB per connection)\n\
         connect + handshake all:      {:.2} s\n\
         4 KiB round trip meanwhile:   {:.1} us\n",
        r.count,
        r.threads_idle,
        r.threads_connected,
        r.threads_connected.saturating_sub(r.threads_idle),
        r.rss_added_mib,
        r.rss_added_mib * 1024.0 / f64::from(r.count.max(1)),
        r.connect_s,
        r.rtt_4k_us
    )
}
