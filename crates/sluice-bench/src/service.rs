//! `sluice bench service`: what the service costs over reading the file
//! directly, measured in one run on one file.
//!
//! - Sequential read bandwidth with `request_bytes` requests (1 MiB):
//!   direct `pread` on the backing file vs. through an in-process server
//!   over its Unix socket, with `window` requests in flight and with one
//!   (blocking `pread`). Passes alternate and the best of `rounds` counts,
//!   so both see the same page-cache state.
//! - The round-trip cost of one blocking 4 KiB read through the service,
//!   next to a direct 4 KiB `pread` and next to the floor: the same bytes
//!   (a 36-byte request, a 4,112-byte reply) ping-ponged between two
//!   processes over a Unix socket pair with bare `read`/`write`, measured
//!   in the same run, so the ratio holds on any machine.
//!
//! - The server's CPU per request: the CPU time of its threads
//!   (`sluice-loop`, `sluice-exec`, `sluice-meta`, from each one's
//!   `schedstat`) over the requests its scheduler answered
//!   (`sluice_server::requests_answered`), during the round trips and
//!   during `PIPELINE_4K_WINDOW` 4 KiB reads kept in flight; the second
//!   gives the requests a second one server core carries.
//!
//! With `direct`, the server runs `--direct` and the baseline opens the
//! file with O_DIRECT too, so both read the device rather than the cache.
//! With `device` null (`DeviceKind::Null`) the server touches no disk:
//! what it costs itself.
//!
//! Two clients measure the service: the default one, which asks for cache
//! leases (a cached range is read by the client itself from a lent
//! descriptor, `lease.rs`), and one with leases off, whose every read is
//! scheduled and travels through the shared region. The round trip is
//! the second's (a leased 4 KiB read sends no message at all; it is
//! reported apart).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;
use sluice_client::{Client, ConnectOptions};

use sluice_server::{DeviceKind, Error, ErrorKind, Listen, Result, Server, ServerConfig, DIRECT_ALIGN_BYTES};

/// What to measure.
#[derive(Clone, Debug)]
pub struct ServiceBenchConfig {
    /// Directory for the test file and socket (on the file system to test).
    pub dir: PathBuf,
    pub file_bytes: u64,
    pub request_bytes: usize,
    /// Requests in flight for the pipelined pass.
    pub window: usize,
    pub rounds: u32,
    /// Blocking 4 KiB reads timed for the round-trip figure.
    pub rtt_requests: u32,
    /// O_DIRECT on both sides.
    pub direct: bool,
    /// Serve metrics (on a loopback port) and scrape them every
    /// `SCRAPE_EVERY` while the bench runs: what metrics cost.
    pub metrics: bool,
    /// Record the live trace into the scratch directory: what tracing costs.
    pub trace: bool,
    /// The server's device (`DeviceKind::Null`: none at all).
    pub device: DeviceKind,
}

/// 4 KiB reads kept in flight by the pass that measures the server's CPU
/// per request under load.
pub const PIPELINE_4K_WINDOW: usize = 32;

/// How often the bench scrapes its server's metrics when `metrics` is on
/// (the dashboard's rate).
pub const SCRAPE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl Default for ServiceBenchConfig {
    fn default() -> ServiceBenchConfig {
        ServiceBenchConfig {
            dir: PathBuf::from("/var/tmp"),
            file_bytes: 256 << 20,
            request_bytes: 1 << 20,
            window: 4,
            rounds: 3,
            rtt_requests: 20_000,
            direct: false,
            metrics: false,
            trace: false,
            device: DeviceKind::Real,
        }
    }
}

/// The figures, bandwidths in MiB/s and costs in microseconds.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceBenchReport {
    pub file_bytes: u64,
    pub request_bytes: usize,
    pub window: usize,
    pub direct: bool,
    pub pread_mib_s: f64,
    pub service_mib_s: f64,
    pub service_blocking_mib_s: f64,
    /// `service_mib_s / pread_mib_s`.
    pub service_ratio: f64,
    /// Bytes the server leased to the default client over the run (0 with
    /// `direct`, or with `SLUICE_LEASES=0`).
    pub bytes_leased: u64,
    /// As `service_mib_s` etc., for the client with leases off.
    pub unleased_mib_s: f64,
    pub unleased_blocking_mib_s: f64,
    pub unleased_ratio: f64,
    /// One blocking 4 KiB read by the default client, inside a lease when
    /// the server granted one (no message then).
    pub leased_4k_us: f64,
    /// One blocking 4 KiB read with leases off: the service's round trip.
    pub rtt_4k_us: f64,
    pub pread_4k_us: f64,
    /// The IPC floor for the same exchange (see the module documentation).
    pub floor_4k_us: f64,
    /// `rtt_4k_us / floor_4k_us`: what the service adds over the floor.
    pub rtt_ratio_to_floor: f64,
    /// The waker's microseconds for one futex wake of a process asleep on
    /// shared memory (`wake_floor`): the least a request costs a server
    /// whose client sleeps for the answer. None if no wake found the
    /// child asleep.
    #[serde(default)]
    pub wake_us: Option<f64>,
    /// The server's device (`real`, `hdd7200`, `null`).
    pub device: String,
    /// CPU microseconds of the server's threads per request: during the
    /// blocking 4 KiB round trips, and with `PIPELINE_4K_WINDOW` 4 KiB
    /// reads in flight. None where `/proc` cannot be read.
    pub rtt_server_us_per_request: Option<f64>,
    pub pipelined_server_us_per_request: Option<f64>,
    /// `1e6 / pipelined_server_us_per_request`: 4 KiB requests a second one
    /// server core carries.
    pub requests_per_s_per_core: Option<f64>,
    /// Wall-clock 4 KiB requests a second of the pipelined pass.
    pub pipelined_requests_per_s: f64,
    /// Nanoseconds the interposer's check of its thread's credentials
    /// takes (`sluice_client::ThreadIds::still`, before every call it
    /// makes, so that a privilege drop by raw system calls is followed).
    #[serde(default)]
    pub cred_check_ns: f64,
    /// Whether metrics were served and scraped, how many scrapes were
    /// answered, and the trace's size (0 without `trace`).
    pub metrics: bool,
    pub scrapes: u64,
    pub trace: bool,
    pub trace_bytes: u64,
}

fn io_err(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::io(what, &e)
}

fn client_err(e: sluice_client::ClientError) -> Error {
    Error::new(ErrorKind::Io, e.errno, e.message)
}

/// A buffer aligned for O_DIRECT, carved out of a larger `Vec`.
fn aligned(len: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; len + DIRECT_ALIGN_BYTES];
    let skip = v.as_ptr().align_offset(DIRECT_ALIGN_BYTES);
    (v, skip)
}

fn make_file(path: &Path, bytes: u64) -> Result<()> {
    let f = File::create(path).map_err(io_err("create bench file"))?;
    let chunk: Vec<u8> = (0..1usize << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    let mut at = 0;
    while at < bytes {
        let n = (bytes - at).min(chunk.len() as u64) as usize;
        f.write_all_at(&chunk[..n], at).map_err(io_err("write bench file"))?;
        at += n as u64;
    }
    f.sync_all().map_err(io_err("sync bench file"))
}

/// Seconds for one sequential pass of direct `pread`s.
fn pread_pass(f: &File, cfg: &ServiceBenchConfig, buf: &mut [u8]) -> Result<f64> {
    let t = Instant::now();
    let mut at = 0;
    while at < cfg.file_bytes {
        let n = f.read_at(buf, at).map_err(io_err("pread"))?;
        if n == 0 {
            break;
        }
        at += n as u64;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Seconds for one sequential pass through the service, `window` in flight.
fn service_pass(c: &Client, fd: sluice_client::Fd, cfg: &ServiceBenchConfig, window: usize, buf: &mut [u8]) -> Result<f64> {
    let t = Instant::now();
    let n = cfg.file_bytes.div_ceil(cfg.request_bytes as u64);
    let mut inflight = std::collections::VecDeque::new();
    for i in 0..n {
        inflight.push_back(c.submit_read(fd, cfg.request_bytes, i * cfg.request_bytes as u64).map_err(client_err)?);
        if inflight.len() >= window {
            c.wait_read(inflight.pop_front().expect("non-empty"), buf).map_err(client_err)?;
        }
    }
    for tk in inflight {
        c.wait_read(tk, buf).map_err(client_err)?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Mean microseconds per blocking 4 KiB read, service and direct.
fn rtt(c: &Client, fd: sluice_client::Fd, f: &File, cfg: &ServiceBenchConfig) -> Result<(f64, f64)> {
    let (mut v, skip) = aligned(4096);
    let buf = &mut v[skip..skip + 4096];
    let span = (cfg.file_bytes / 4096).max(1);
    let t = Instant::now();
    for i in 0..u64::from(cfg.rtt_requests) {
        c.pread(fd, buf, (i % span) * 4096).map_err(client_err)?;
    }
    let service = t.elapsed().as_secs_f64() * 1e6 / f64::from(cfg.rtt_requests);
    let t = Instant::now();
    for i in 0..u64::from(cfg.rtt_requests) {
        f.read_at(buf, (i % span) * 4096).map_err(io_err("pread"))?;
    }
    Ok((service, t.elapsed().as_secs_f64() * 1e6 / f64::from(cfg.rtt_requests)))
}

/// CPU nanoseconds of this process's server threads so far (each one's
/// `schedstat`); None where `/proc` cannot be read.
fn server_threads_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if matches!(comm.trim_end(), "sluice-loop" | "sluice-exec" | "sluice-meta") {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(total)
}

/// The server's CPU microseconds per request answered while `f` runs.
/// What one credential check costs, over `CRED_CHECKS` checks.
fn cred_check_ns() -> f64 {
    const CRED_CHECKS: u32 = 200_000;
    let ids = sluice_client::ThreadIds::now();
    let since = Instant::now();
    let same = (0..CRED_CHECKS).filter(|_| std::hint::black_box(&ids).still()).count();
    let ns = since.elapsed().as_nanos() as f64 / f64::from(CRED_CHECKS);
    assert_eq!(same, CRED_CHECKS as usize, "the thread's ids did not change");
    ns
}

fn server_us_per_request<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, Option<f64>)> {
    let (ns0, n0) = (server_threads_ns(), sluice_server::requests_answered());
    let out = f()?;
    let (ns1, n1) = (server_threads_ns(), sluice_server::requests_answered());
    let per = ns0.zip(ns1).filter(|_| n1 > n0).map(|(a, b)| b.saturating_sub(a) as f64 / 1e3 / (n1 - n0) as f64);
    Ok((out, per))
}

/// Requests a second of `requests` 4 KiB reads, `window` in flight.
fn pipelined_4k(c: &Client, fd: sluice_client::Fd, file_bytes: u64, requests: u32, window: usize) -> Result<f64> {
    let (mut v, skip) = aligned(4096);
    let buf = &mut v[skip..skip + 4096];
    let span = (file_bytes / 4096).max(1);
    let t = Instant::now();
    let mut inflight = std::collections::VecDeque::new();
    for i in 0..u64::from(requests) {
        inflight.push_back(c.submit_read(fd, 4096, (i % span) * 4096).map_err(client_err)?);
        if inflight.len() >= window {
            c.wait_read(inflight.pop_front().expect("non-empty"), buf).map_err(client_err)?;
        }
    }
    for tk in inflight {
        c.wait_read(tk, buf).map_err(client_err)?;
    }
    Ok(f64::from(requests) / t.elapsed().as_secs_f64())
}

/// Bytes of the floor's request: a `Read` frame (16-byte header, fd,
/// offset, length).
const FLOOR_REQUEST_BYTES: usize = 36;
/// Bytes of the floor's reply: a 4 KiB `Data` frame.
const FLOOR_REPLY_BYTES: usize = 16 + 4096;
/// Round trips before the floor's timed ones.
const FLOOR_WARMUP: u32 = 200;

/// Fill `buf` from `fd` with bare `read(2)`; false at end of stream.
fn read_raw(fd: i32, buf: &mut [u8]) -> bool {
    let mut at = 0;
    while at < buf.len() {
        // SAFETY: buf[at..] is valid for buf.len() - at bytes.
        let n = unsafe { libc::read(fd, buf[at..].as_mut_ptr().cast(), buf.len() - at) };
        if n <= 0 {
            return false;
        }
        at += n as usize;
    }
    true
}

/// Send `buf` on `fd` with bare `write(2)`; false when the peer is gone.
fn write_raw(fd: i32, buf: &[u8]) -> bool {
    let mut at = 0;
    while at < buf.len() {
        // SAFETY: buf[at..] is valid for buf.len() - at bytes.
        let n = unsafe { libc::write(fd, buf[at..].as_ptr().cast(), buf.len() - at) };
        if n <= 0 {
            return false;
        }
        at += n as usize;
    }
    true
}

/// Mean microseconds of one request/reply exchange between this process
/// and a forked child over a Unix socket pair: the floor under any
/// service on this machine. The child only reads, writes and exits
/// (async-signal-safe), so forking this multi-threaded process is safe.
fn ping_pong_floor(round_trips: u32) -> Result<f64> {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid out-array of two descriptors.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } < 0 {
        return Err(Error::io("socketpair", &std::io::Error::last_os_error()));
    }
    // SAFETY: the child runs only async-signal-safe calls, then _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Error::io("fork", &std::io::Error::last_os_error()));
    }
    if pid == 0 {
        let (mut req, reply) = ([0u8; FLOOR_REQUEST_BYTES], [7u8; FLOOR_REPLY_BYTES]);
        // SAFETY: closing our copy of the parent's end; then a plain loop.
        unsafe { libc::close(fds[0]) };
        while read_raw(fds[1], &mut req) && write_raw(fds[1], &reply) {}
        // SAFETY: leave without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: closing the child's end in the parent.
    unsafe { libc::close(fds[1]) };
    let (req, mut reply) = ([1u8; FLOOR_REQUEST_BYTES], vec![0u8; FLOOR_REPLY_BYTES]);
    let mut exchange = || write_raw(fds[0], &req) && read_raw(fds[0], &mut reply);
    let mut ok = (0..FLOOR_WARMUP).all(|_| exchange());
    let t = Instant::now();
    ok = ok && (0..round_trips.max(1)).all(|_| exchange());
    let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(round_trips.max(1));
    // SAFETY: closing our end ends the child's loop; then reap it.
    unsafe {
        libc::close(fds[0]);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
    if !ok {
        return Err(Error::new(ErrorKind::Io, libc::EPIPE, "the ping-pong child went away"));
    }
    Ok(us)
}

/// Futex wakes timed by `wake_floor`.
const WAKES: u32 = 2_000;
/// How long `wake_floor` leaves the child to fall asleep before each wake.
const WAKE_GAP: std::time::Duration = std::time::Duration::from_micros(100);

/// Mean microseconds the waker spends in one `FUTEX_WAKE` that wakes a
/// forked child asleep on a word of shared memory: what answering a
/// client that sleeps on its post record costs the server at least, per
/// request, on this machine. Only wakes that found the child asleep
/// count; None if none did. The child only waits, stores and exits
/// (async-signal-safe).
pub(crate) fn wake_floor() -> Result<Option<f64>> {
    use std::sync::atomic::{AtomicU32, Ordering};
    // SAFETY: a fresh shared anonymous page, unmapped below.
    let page = unsafe { libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_ANONYMOUS, -1, 0) };
    if page == libc::MAP_FAILED {
        return Err(Error::io("mmap", &std::io::Error::last_os_error()));
    }
    // SAFETY: the page is live, aligned and zeroed; both words are only
    // accessed atomically, here and in the child.
    let (word, ack) = unsafe { (&*(page as *const AtomicU32), &*((page as *const AtomicU32).add(16))) };
    let futex = |op: i32, val: u32| {
        // SAFETY: a futex call on a live, aligned word of shared memory.
        unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), op, val, std::ptr::null::<libc::timespec>(), std::ptr::null::<u32>(), 0) }
    };
    // SAFETY: the child runs only atomics, futex and _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Error::io("fork", &std::io::Error::last_os_error()));
    }
    if pid == 0 {
        loop {
            match word.load(Ordering::Acquire) {
                0 => {
                    futex(libc::FUTEX_WAIT, 0);
                }
                1 => {
                    word.store(0, Ordering::Release);
                    ack.fetch_add(1, Ordering::AcqRel);
                }
                // SAFETY: leave without running the parent's destructors.
                _ => unsafe { libc::_exit(0) },
            }
        }
    }
    let (mut total, mut woken) = (std::time::Duration::ZERO, 0u32);
    for i in 0..WAKES {
        let gap = Instant::now();
        while gap.elapsed() < WAKE_GAP {
            std::hint::spin_loop();
        }
        word.store(1, Ordering::Release);
        let t = Instant::now();
        if futex(libc::FUTEX_WAKE, 1) == 1 {
            total += t.elapsed();
            woken += 1;
        }
        while ack.load(Ordering::Acquire) <= i {
            std::hint::spin_loop();
        }
    }
    word.store(2, Ordering::Release);
    futex(libc::FUTEX_WAKE, 1);
    // SAFETY: reap the child, then unmap the page nobody uses any more.
    unsafe {
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        libc::munmap(page, 4096);
    }
    Ok((woken > 0).then(|| total.as_secs_f64() * 1e6 / f64::from(woken)))
}

/// Run the benchmark. See the module documentation.
pub fn run(cfg: &ServiceBenchConfig) -> Result<ServiceBenchReport> {
    // First, while this process has the fewest threads.
    let floor_4k_us = ping_pong_floor(cfg.rtt_requests)?;
    let wake_us = wake_floor()?;
    let scratch = crate::scratch::Scratch::new(cfg.dir.join(format!("sluice-bench-service-{}", std::process::id())));
    std::fs::create_dir_all(scratch.path().join("root")).map_err(io_err("create scratch dir"))?;
    make_file(&scratch.path().join("root/seq.dat"), cfg.file_bytes)?;
    let mut sc = ServerConfig::new(scratch.path().join("root"), Listen::Unix(scratch.path().join("s.sock")));
    sc.direct = cfg.direct;
    sc.device = cfg.device;
    sc.metrics = cfg.metrics.then(|| "127.0.0.1:0".to_string());
    let trace_path = scratch.path().join("trace.json");
    sc.trace = cfg.trace.then(|| trace_path.clone());
    let mut server = Server::start(sc)?;
    let scraper = server.metrics_addr().map(Scraper::start);
    let opts = ConnectOptions { app: Some("bench-service".into()), ..ConnectOptions::default() };
    let c = Client::connect_with(server.addr(), opts.clone()).map_err(client_err)?;
    let fd = c.open("seq.dat", libc::O_RDONLY, 0).map_err(client_err)?;
    let u = Client::connect_with(server.addr(), ConnectOptions { leases: false, ..opts }).map_err(client_err)?;
    let ufd = u.open("seq.dat", libc::O_RDONLY, 0).map_err(client_err)?;
    let flags = if cfg.direct { libc::O_DIRECT } else { 0 };
    let f = OpenOptions::new().read(true).custom_flags(flags).open(scratch.path().join("root/seq.dat")).map_err(io_err("open bench file"))?;
    let (mut v, skip) = aligned(cfg.request_bytes);
    let buf = &mut v[skip..skip + cfg.request_bytes];
    pread_pass(&f, cfg, buf)?;
    let mut best = [f64::MAX; 5];
    for _ in 0..cfg.rounds.max(1) {
        let pass = [
            pread_pass(&f, cfg, buf)?,
            service_pass(&c, fd, cfg, cfg.window.max(1), buf)?,
            service_pass(&c, fd, cfg, 1, buf)?,
            service_pass(&u, ufd, cfg, cfg.window.max(1), buf)?,
            service_pass(&u, ufd, cfg, 1, buf)?,
        ];
        best.iter_mut().zip(pass).for_each(|(b, p)| *b = b.min(p));
    }
    let [best_pread, best_service, best_blocking, best_unleased, best_unleased_blocking] = best;
    let ((rtt_4k_us, pread_4k_us), rtt_server_us_per_request) = server_us_per_request(|| rtt(&u, ufd, &f, cfg))?;
    let (pipelined_requests_per_s, pipelined_server_us_per_request) = server_us_per_request(|| pipelined_4k(&u, ufd, cfg.file_bytes, cfg.rtt_requests, PIPELINE_4K_WINDOW))?;
    let (leased_4k_us, _) = rtt(&c, fd, &f, cfg)?;
    let bytes_leased = c.server_stats().map_err(client_err)?.app("bench-service").map_or(0, |a| a.bytes_leased);
    drop((c, u));
    let scrapes = scraper.map_or(0, Scraper::stop);
    server.shutdown()?;
    let trace_bytes = if cfg.trace { std::fs::metadata(&trace_path).map_or(0, |m| m.len()) } else { 0 };
    let mib = cfg.file_bytes as f64 / f64::from(1u32 << 20);
    Ok(ServiceBenchReport {
        file_bytes: cfg.file_bytes,
        request_bytes: cfg.request_bytes,
        window: cfg.window,
        direct: cfg.direct,
        pread_mib_s: mib / best_pread,
        service_mib_s: mib / best_service,
        service_blocking_mib_s: mib / best_blocking,
        service_ratio: best_pread / best_service,
        bytes_leased,
        unleased_mib_s: mib / best_unleased,
        unleased_blocking_mib_s: mib / best_unleased_blocking,
        unleased_ratio: best_pread / best_unleased,
        leased_4k_us,
        rtt_4k_us,
        pread_4k_us,
        floor_4k_us,
        rtt_ratio_to_floor: rtt_4k_us / floor_4k_us,
        wake_us,
        device: match cfg.device {
            DeviceKind::Real => "real",
            DeviceKind::Hdd7200 => "hdd7200",
            DeviceKind::Null => "null",
        }
        .into(),
        rtt_server_us_per_request,
        pipelined_server_us_per_request,
        requests_per_s_per_core: pipelined_server_us_per_request.map(|us| 1e6 / us),
        pipelined_requests_per_s,
        cred_check_ns: cred_check_ns(),
        metrics: cfg.metrics,
        scrapes,
        trace: cfg.trace,
        trace_bytes,
    })
}

/// Scrapes `/metrics` every `SCRAPE_EVERY` on a thread until stopped.
struct Scraper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl Scraper {
    fn start(addr: std::net::SocketAddr) -> Scraper {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = std::sync::Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut answered = 0;
            while !s.load(Ordering::Relaxed) {
                if sluice_metrics::get(&addr.to_string(), "/metrics", sluice_metrics::IO_TIMEOUT).is_ok() {
                    answered += 1;
                }
                let t = std::time::Instant::now();
                while t.elapsed() < SCRAPE_EVERY && !s.load(Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            }
            answered
        });
        Scraper { stop, thread }
    }

    /// Stop; the scrapes answered.
    fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// The report as a few lines of text.
pub fn table(r: &ServiceBenchReport) -> String {
    let kib = r.request_bytes >> 10;
    format!(
        "file {} MiB, {kib} KiB requests, O_DIRECT {}\n\
         direct pread:                 {:>8.0} MiB/s\n\
         service, {} in flight:         {:>8.0} MiB/s  ({:.1}% of direct)\n\
         service, blocking pread:      {:>8.0} MiB/s\n\
         leases off, {} in flight:      {:>8.0} MiB/s  ({:.1}% of direct)\n\
         leases off, blocking pread:   {:>8.0} MiB/s\n\
         bytes leased:                 {:>8} MiB\n\
         4 KiB read, leased:           {:>8.1} us\n\
         4 KiB read round trip:        {:>8.1} us (direct pread {:.1} us)\n\
         IPC floor, same bytes:        {:>8.1} us (service {:.2}x the floor)\n\
         futex wake of a sleeper:      {:>8} us of the waker's time\n\
         server CPU per request:       {} us blocking, {} us with {} in flight (device {})\n\
         4 KiB requests a second:      {:>8.0} ({} per server core)\n\
         credential check, sluice run: {:>8.0} ns a call\n\
         metrics: {} ({} scrapes), trace: {} ({} KiB)\n",
        r.file_bytes >> 20,
        if r.direct { "on" } else { "off" },
        r.pread_mib_s,
        r.window,
        r.service_mib_s,
        r.service_ratio * 100.0,
        r.service_blocking_mib_s,
        r.window,
        r.unleased_mib_s,
        r.unleased_ratio * 100.0,
        r.unleased_blocking_mib_s,
        r.bytes_leased >> 20,
        r.leased_4k_us,
        r.rtt_4k_us,
        r.pread_4k_us,
        r.floor_4k_us,
        r.rtt_ratio_to_floor,
        r.wake_us.map_or("-".into(), |us| format!("{us:.1}")),
        r.rtt_server_us_per_request.map_or("-".into(), |us| format!("{us:.1}")),
        r.pipelined_server_us_per_request.map_or("-".into(), |us| format!("{us:.1}")),
        PIPELINE_4K_WINDOW,
        r.device,
        r.pipelined_requests_per_s,
        r.requests_per_s_per_core.map_or("-".into(), |n| format!("{n:.0}")),
        r.cred_check_ns,
        if r.metrics { "on" } else { "off" },
        r.scrapes,
        if r.trace { "on" } else { "off" },
        r.trace_bytes >> 10
    )
}
