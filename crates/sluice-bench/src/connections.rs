//! `sluice bench connections`: what `count` idle connected clients cost the
//! server (threads and resident memory it adds), and a 4 KiB round trip
//! of one more client while they stay connected (the 10,000
//! connections goal). With `stalled_writes`, it then measures the server's
//! second memory bound: that many more connections each send the header of
//! a `stalled_body_mib` write and `stalled_sent_mib` of its body, then
//! stop; the server's resident memory may grow by at most its budget for
//! partial frames (`partial_bytes_max`, 512 MiB by default), since a body
//! reserves its length from that budget when its header arrives and past
//! it the server reads no new body.
//!
//! The server runs with `clients_max = count + 1`: as a `sluice serve`
//! child process when `server_exe` names the binary (the figures are then
//! that process's, and each process needs one descriptor per connection),
//! otherwise in this process (which then needs two). The idle clients are
//! bare Unix sockets that completed the handshake. The descriptor limit is
//! raised to the hard limit first; a count that cannot fit is refused with
//! the figures, not left to hang.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use sluice_client::{Client, ConnectOptions};
use sluice_proto::{check_header, encode_header, encode_request, Hello, Opcode, Request, FRAME_BYTES_MAX, HEADER_BYTES, VERSION};

use sluice_server::{Error, ErrorKind, Listen, Result, Server, ServerConfig};

/// What to measure.
#[derive(Clone, Debug)]
pub struct ConnectionsBenchConfig {
    /// Scratch directory for the root and the socket.
    pub dir: PathBuf,
    /// Idle connections held open.
    pub count: u32,
    /// Blocking 4 KiB reads timed while they are open.
    pub rtt_requests: u32,
    /// Run the server as `EXE serve ...` in a child process (the `sluice`
    /// binary); `None`: in this process.
    pub server_exe: Option<PathBuf>,
    /// Connections that then each stall in the body of one write (0: none).
    pub stalled_writes: u32,
    /// That write's body length and how much of it is sent, MiB.
    pub stalled_body_mib: u32,
    pub stalled_sent_mib: u32,
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
    /// The stalled writes (`stalled_*` of the configuration).
    pub stalled_writes: u32,
    pub stalled_body_mib: u32,
    pub stalled_sent_mib: u32,
    /// Resident memory the stalled writes added once it settled, MiB.
    pub stalled_rss_added_mib: f64,
    /// What the server may hold in partial frames (`partial_bytes_max`,
    /// its default), MiB: the bound `stalled_rss_added_mib` is checked
    /// against.
    pub partial_budget_mib: f64,
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(what, &e)
}

/// `Threads:` and `VmRSS:` (bytes) of process `pid` (`self`: this one).
fn threads_and_rss(pid: &str) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(io_err("read /proc/PID/status"))?;
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok((field("Threads:"), field("VmRSS:") << 10))
}

/// Descriptors beyond the connections' that a process needs here.
const FD_MARGIN: u64 = 64;

/// A `sluice serve` child, stopped (SIGTERM, then waited for) on drop.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        // SAFETY: plain kill on our own child's pid.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// Start `exe serve` on `sock` and wait until it answers.
fn spawn_server(exe: &std::path::Path, scratch: &std::path::Path, sock: &std::path::Path, clients_max: u32) -> Result<Child> {
    let child = std::process::Command::new(exe)
        .arg("serve")
        .arg("--root")
        .arg(scratch.join("root"))
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .arg("--clients-max")
        .arg(clients_max.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(io_err("spawn sluice serve"))?;
    let child = Child(child);
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while UnixStream::connect(sock).is_err() {
        if Instant::now() > deadline {
            return Err(Error::new(ErrorKind::Io, libc::ETIMEDOUT, "sluice serve did not come up in 10 s"));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(child)
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

/// A connection that sent the header of a `body` byte write and `sent`
/// bytes of its body, from a thread of its own (the server stops reading a
/// body it has no budget for, so the send blocks): the thread and a handle
/// to unblock it.
fn stalled_write(path: &std::path::Path, i: u32, body: u32, sent: usize) -> Result<(UnixStream, std::thread::JoinHandle<()>)> {
    let s = idle_client(path, i)?;
    let mut frame = Vec::with_capacity(HEADER_BYTES + 16);
    encode_header(Opcode::Write, 1, body, &mut frame);
    // The body starts with the handle and offset: a handle never opened,
    // so the write, if ever whole, is answered EBADF and writes nothing.
    frame.extend_from_slice(&u64::MAX.to_le_bytes());
    frame.extend_from_slice(&0u64.to_le_bytes());
    let mut w = s.try_clone().map_err(io_err("clone socket"))?;
    let rest = sent.saturating_sub(16);
    let t = std::thread::spawn(move || {
        let chunk = vec![0x5Au8; 1 << 20];
        if w.write_all(&frame).is_err() {
            return;
        }
        let mut left = rest;
        while left > 0 {
            let n = left.min(chunk.len());
            if w.write_all(&chunk[..n]).is_err() {
                return;
            }
            left -= n;
        }
    });
    Ok((s, t))
}

/// Resident memory of `pid` once it stops growing: sampled every 100 ms
/// until two samples 500 ms apart agree within 1 MiB, or 10 s.
fn settled_rss(pid: &str) -> Result<u64> {
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    let mut last = threads_and_rss(pid)?.1;
    let mut stable_since = Instant::now();
    loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = threads_and_rss(pid)?.1;
        if now.abs_diff(last) > 1 << 20 {
            (last, stable_since) = (now, Instant::now());
        } else if stable_since.elapsed() >= std::time::Duration::from_millis(500) || Instant::now() > deadline {
            return Ok(now);
        }
    }
}

/// Run the benchmark. See the module documentation.
pub fn run(cfg: &ConnectionsBenchConfig) -> Result<ConnectionsBenchReport> {
    let limit = sluice_server::raise_fd_limit();
    let per_conn = if cfg.server_exe.is_some() { 1 } else { 2 };
    let need = (u64::from(cfg.count) + u64::from(cfg.stalled_writes)) * per_conn + FD_MARGIN;
    if need > limit {
        return Err(Error::config(format!(
            "{} connections need about {need} descriptors in this process, and its limit is {limit} (raise it, or run the server as a child: the sluice command does)",
            cfg.count
        )));
    }
    // Removed however the bench ends, a Ctrl-C included.
    let guard = crate::scratch::Scratch::new(cfg.dir.join(format!("sluice-bench-conns-{}", std::process::id())));
    let scratch = guard.path();
    std::fs::create_dir_all(scratch.join("root")).map_err(io_err("create scratch dir"))?;
    std::fs::write(scratch.join("root/f"), vec![7u8; 1 << 20]).map_err(io_err("write test file"))?;
    measure(cfg, scratch)
}

fn measure(cfg: &ConnectionsBenchConfig, scratch: &std::path::Path) -> Result<ConnectionsBenchReport> {
    let sock = scratch.join("s.sock");
    let clients_max = cfg.count.saturating_add(cfg.stalled_writes).saturating_add(1);
    // The server: a child process, or in this one.
    let (child, mut server) = match &cfg.server_exe {
        Some(exe) => (Some(spawn_server(exe, scratch, &sock, clients_max)?), None),
        None => {
            let mut sc = ServerConfig::new(scratch.join("root"), Listen::Unix(sock.clone()));
            sc.limits.clients_max = clients_max;
            (None, Some(Server::start(sc)?))
        }
    };
    let pid = child.as_ref().map_or_else(|| "self".to_string(), |c| c.0.id().to_string());
    let (threads_idle, rss_idle) = threads_and_rss(&pid)?;
    let t = Instant::now();
    let idle = (0..cfg.count).map(|i| idle_client(&sock, i)).collect::<Result<Vec<_>>>()?;
    let connect_s = t.elapsed().as_secs_f64();
    let (threads_connected, rss_connected) = threads_and_rss(&pid)?;
    let c = Client::connect_with(&format!("unix:{}", sock.display()), ConnectOptions { app: Some("probe".into()), ..ConnectOptions::default() })
        .map_err(|e| Error::new(ErrorKind::Io, e.errno, e.message))?;
    let fd = c.open("f", libc::O_RDONLY, 0).map_err(|e| Error::new(ErrorKind::Io, e.errno, e.message))?;
    let mut buf = [0u8; 4096];
    let t = Instant::now();
    for i in 0..u64::from(cfg.rtt_requests.max(1)) {
        c.pread(fd, &mut buf, (i % 256) * 4096).map_err(|e| Error::new(ErrorKind::Io, e.errno, e.message))?;
    }
    let rtt_4k_us = t.elapsed().as_secs_f64() * 1e6 / f64::from(cfg.rtt_requests.max(1));
    drop(c);
    // The stalled writes, measured against the memory with the idle
    // connections open.
    let body = cfg.stalled_body_mib.saturating_mul(1 << 20).min(FRAME_BYTES_MAX);
    let sent = (cfg.stalled_sent_mib as usize) << 20;
    let mut stalled_rss_added_mib = 0.0;
    if cfg.stalled_writes > 0 {
        let before = settled_rss(&pid)?;
        let stalled = (0..cfg.stalled_writes).map(|i| stalled_write(&sock, cfg.count + i, body, sent)).collect::<Result<Vec<_>>>()?;
        let after = settled_rss(&pid)?;
        stalled_rss_added_mib = after.saturating_sub(before) as f64 / f64::from(1u32 << 20);
        for (s, t) in stalled {
            let _ = s.shutdown(std::net::Shutdown::Both);
            let _ = t.join();
        }
    }
    drop(idle);
    if let Some(s) = server.as_mut() {
        s.shutdown()?;
    }
    drop(child);
    Ok(ConnectionsBenchReport {
        count: cfg.count,
        threads_idle,
        threads_connected,
        rss_added_mib: rss_connected.saturating_sub(rss_idle) as f64 / f64::from(1u32 << 20),
        connect_s,
        rtt_4k_us,
        stalled_writes: cfg.stalled_writes,
        stalled_body_mib: body >> 20,
        stalled_sent_mib: cfg.stalled_sent_mib,
        stalled_rss_added_mib,
        partial_budget_mib: ServerConfig::new(".", Listen::Unix(sock.clone())).limits.partial_bytes_max as f64 / f64::from(1u32 << 20),
    })
}

/// The report as a few lines of text.
pub fn table(r: &ConnectionsBenchReport) -> String {
    let stalled = if r.stalled_writes == 0 {
        String::new()
    } else {
        format!(
            "{} stalled writes ({} MiB of {} MiB sent each)\n\
             resident memory added:        {:.1} MiB (budget for partial frames {:.0} MiB: {})\n",
            r.stalled_writes,
            r.stalled_sent_mib,
            r.stalled_body_mib,
            r.stalled_rss_added_mib,
            r.partial_budget_mib,
            if r.stalled_rss_added_mib <= r.partial_budget_mib { "within" } else { "OVER" }
        )
    };
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
    ) + &stalled
}
