//! # sluice-metrics: Prometheus text exposition, and where it is served
//!
//! The three roles that run for long (the I/O server, the mount, the
//! metadata role) serve their metrics the same way: [`Expo`] writes the
//! text format (version 0.0.4), [`Endpoint`] serves it over HTTP on one
//! thread, and [`parse`] reads it back strictly (tests, `sluice top`).
//!
//! Bounds of the endpoint: it serves many clients at once from one thread
//! (a `poll(2)` loop over nonblocking sockets), at most [`CONNS_MAX`] of
//! them (one more closes the one held longest); a request head of at most
//! [`REQUEST_BYTES_MAX`] bytes (431 past it); a client gets [`IO_TIMEOUT`]
//! in all to send its request and take the answer, then is closed; only
//! `GET` (405). A route is asked at most once per path per turn of the
//! loop, however many clients asked for it in that turn. The thread runs
//! at a lower priority ([`NICE`]): a flood of scrapes takes CPU time from
//! the endpoint, not from the role it reports on.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes of an HTTP request head the endpoint reads; a longer one is
/// answered 431 and closed.
pub const REQUEST_BYTES_MAX: usize = 8 << 10;
/// A scrape client gets this long, in all, to send its request and take
/// the answer; then it is closed (one trickling byte at a time holds a
/// place no longer).
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Clients held at once. One more closes the one held longest (as the
/// newest is accepted): a scrape takes milliseconds, so it loses its place
/// only if this many connections arrive meanwhile, while slow or silent
/// clients, which hold theirs longest, go first. 64: a few Prometheus
/// servers and dashboards many times over, at most 64 request heads of
/// `REQUEST_BYTES_MAX` held.
pub const CONNS_MAX: usize = 64;
/// Longest the loop sleeps in `poll(2)` with nothing to do, in ms (it
/// wakes sooner for a deadline or a client).
const POLL_MS_MAX: u64 = 1_000;
/// The endpoint thread's nice value (Linux sets it per thread): scrapes
/// yield the CPU to the role's own threads.
pub const NICE: i32 = 10;

/// What a route answers: content type and body.
pub type Page = (&'static str, String);

/// The content type of the text format.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The endpoint's bounds; [`Endpoint::start`] uses the constants above.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Clients held at once ([`CONNS_MAX`]).
    pub conns_max: usize,
    /// Each client's time in all ([`IO_TIMEOUT`]).
    pub io_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { conns_max: CONNS_MAX, io_timeout: IO_TIMEOUT }
    }
}

/// The endpoint's thread; stopped (and joined) on drop.
pub struct Endpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Bind `addr` (`HOST:PORT` or `tcp:HOST:PORT`; port 0 picks one) and
    /// serve: `route` gets the path of each `GET` and answers, or `None`
    /// for 404.
    pub fn start(addr: &str, route: impl Fn(&str) -> Option<Page> + Send + 'static) -> std::io::Result<Endpoint> {
        Endpoint::start_with(addr, Limits::default(), route)
    }

    /// `start` with other bounds (tests).
    pub fn start_with(addr: &str, limits: Limits, route: impl Fn(&str) -> Option<Page> + Send + 'static) -> std::io::Result<Endpoint> {
        assert!(limits.conns_max > 0, "an endpoint holds at least one client");
        let addr = addr.strip_prefix("tcp:").unwrap_or(addr);
        let l = TcpListener::bind(addr).map_err(|e| std::io::Error::new(e.kind(), format!("bind the metrics endpoint {addr}: {e}")))?;
        l.set_nonblocking(true)?;
        let local = l.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = Arc::clone(&stop);
        let thread = std::thread::Builder::new().name("sluice-metrics".into()).spawn(move || {
            // SAFETY: setpriority on this thread's own id (Linux: per thread).
            unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, NICE) };
            serve(&l, limits, route, &st)
        })?;
        Ok(Endpoint { addr: local, stop, thread: Some(thread) })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the loop's poll.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One client: its request head as read so far, then its answer.
struct Scrape {
    s: TcpStream,
    deadline: Instant,
    head: Vec<u8>,
    /// The whole answer once the head is in, and how much of it was sent.
    out: Option<(Vec<u8>, usize)>,
}

/// The loop: clients in the order they came (the oldest first out when
/// full), each closed when answered, gone, or past its deadline.
fn serve(l: &TcpListener, limits: Limits, route: impl Fn(&str) -> Option<Page>, stop: &AtomicBool) {
    let mut held: VecDeque<Scrape> = VecDeque::with_capacity(limits.conns_max);
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(limits.conns_max + 1);
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        held.retain(|c| c.deadline > now);
        fds.clear();
        fds.push(libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        fds.extend(held.iter().map(|c| libc::pollfd { fd: c.s.as_raw_fd(), events: if c.out.is_some() { libc::POLLOUT } else { libc::POLLIN }, revents: 0 }));
        let soonest = held.iter().map(|c| c.deadline.saturating_duration_since(now).as_millis() as u64 + 1).min().unwrap_or(POLL_MS_MAX);
        // SAFETY: fds is a valid array of fds.len() pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, soonest.min(POLL_MS_MAX) as libc::c_int) };
        if n <= 0 {
            continue;
        }
        // One rendering per path per turn, shared by every client that
        // asked for it in this turn.
        let mut pages: Vec<(String, Option<Page>)> = Vec::new();
        let mut render = |path: &str| match pages.iter().find(|(p, _)| p == path) {
            Some((_, page)) => page.clone(),
            None => {
                let page = route(path);
                pages.push((path.to_string(), page.clone()));
                page
            }
        };
        let mut kept = VecDeque::with_capacity(limits.conns_max);
        for (mut c, fd) in held.drain(..).zip(&fds[1..]) {
            if fd.revents == 0 || step(&mut c, &mut render) {
                kept.push_back(c);
            }
        }
        held = kept;
        if fds[0].revents != 0 {
            accept(l, limits, &mut held);
        }
    }
}

/// Take every waiting connection; past `conns_max` held, the oldest goes.
fn accept(l: &TcpListener, limits: Limits, held: &mut VecDeque<Scrape>) {
    while let Ok((s, _)) = l.accept() {
        if s.set_nonblocking(true).is_err() {
            continue;
        }
        if held.len() >= limits.conns_max {
            held.pop_front();
        }
        held.push_back(Scrape { s, deadline: Instant::now() + limits.io_timeout, head: Vec::new(), out: None });
    }
}

/// Move `c` on as far as its socket allows; false when it is done (answered
/// or gone).
fn step(c: &mut Scrape, render: &mut impl FnMut(&str) -> Option<Page>) -> bool {
    if c.out.is_none() {
        let mut buf = [0u8; 4096];
        let room = (REQUEST_BYTES_MAX + 1 - c.head.len()).min(buf.len());
        match c.s.read(&mut buf[..room]) {
            Ok(0) => return false,
            Ok(n) => c.head.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => return true,
            Err(_) => return false,
        }
        let (status, ctype, body) = match head_of(&c.head) {
            Head::Partial => return true,
            Head::Whole(head) => answer(&head, render),
            Head::TooLarge => (431, "text/plain", format!("request head over {REQUEST_BYTES_MAX} bytes\n")),
            Head::Bad => return false,
        };
        c.out = Some((response(status, ctype, &body), 0));
    }
    let Some((out, sent)) = &mut c.out else { return false };
    while *sent < out.len() {
        match c.s.write(&out[*sent..]) {
            Ok(0) => return false,
            Ok(n) => *sent += n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => return true,
            Err(_) => return false,
        }
    }
    false
}

/// An HTTP/1.1 answer, whole.
fn response(status: u16, ctype: &str, body: &str) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Bad Request",
    };
    let head = format!("HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n", body.len());
    [head.as_bytes(), body.as_bytes()].concat()
}

fn answer(head: &str, route: &mut impl FnMut(&str) -> Option<Page>) -> (u16, &'static str, String) {
    let mut parts = head.lines().next().unwrap_or("").split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method != "GET" {
        return (405, "text/plain", "only GET\n".into());
    }
    match route(target.split('?').next().unwrap_or("")) {
        Some((ctype, body)) => (200, ctype, body),
        None => (404, "text/plain", "not found: try /metrics\n".into()),
    }
}

/// How far a request head is.
enum Head {
    Partial,
    Whole(String),
    TooLarge,
    /// Not text.
    Bad,
}

/// Whether `got` holds a whole request head (up to the blank line), within
/// `REQUEST_BYTES_MAX` bytes.
fn head_of(got: &[u8]) -> Head {
    match got.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(end) if end + 4 > REQUEST_BYTES_MAX => Head::TooLarge,
        Some(end) => String::from_utf8(got[..end].to_vec()).map_or(Head::Bad, Head::Whole),
        None if got.len() > REQUEST_BYTES_MAX => Head::TooLarge,
        None => Head::Partial,
    }
}

/// Bytes of an answer `get` reads at most.
pub const REPLY_BYTES_MAX: u64 = 16 << 20;

/// `GET path` from an endpoint at `addr` (`HOST:PORT` or `tcp:HOST:PORT`),
/// the whole exchange bounded by `timeout`: the body of a 200 answer, else
/// an error that says what went wrong (`sluice top`, the service bench,
/// tests). An answer over `REPLY_BYTES_MAX` is an error, not cut short.
pub fn get(addr: &str, path: &str, timeout: Duration) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind};
    let deadline = Instant::now() + timeout;
    let addr = addr.strip_prefix("tcp:").unwrap_or(addr);
    let sock: SocketAddr = addr.parse().map_err(|_| Error::new(ErrorKind::InvalidInput, format!("{addr:?} is not HOST:PORT (an IP address and a port)")))?;
    let mut s = TcpStream::connect_timeout(&sock, timeout).map_err(|e| Error::new(e.kind(), format!("no metrics endpoint at {addr}: {e}")))?;
    // What is left of the timeout (at least a millisecond: zero means none).
    let left = || deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    s.set_write_timeout(Some(left()))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut out = Vec::new();
    let mut chunk = [0u8; 64 << 10];
    loop {
        if Instant::now() >= deadline {
            return Err(Error::new(ErrorKind::TimedOut, format!("{addr}{path}: no whole answer within {timeout:?}")));
        }
        s.set_read_timeout(Some(left()))?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) if (out.len() + n) as u64 > REPLY_BYTES_MAX => {
                return Err(Error::new(ErrorKind::InvalidData, format!("{addr}{path}: answer over {REPLY_BYTES_MAX} bytes (REPLY_BYTES_MAX)")));
            }
            Ok(n) => out.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(Error::new(ErrorKind::TimedOut, format!("{addr}{path}: no whole answer within {timeout:?}")));
            }
            Err(e) => return Err(e),
        }
    }
    let out = String::from_utf8(out).map_err(|_| Error::new(ErrorKind::InvalidData, "an answer that is not UTF-8"))?;
    let (head, body) = out.split_once("\r\n\r\n").ok_or_else(|| Error::new(ErrorKind::InvalidData, "not an HTTP reply"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(Error::other(format!("{addr}{path}: {}", head.lines().next().unwrap_or(""))));
    }
    Ok(body.to_string())
}

/// A log2 latency histogram any thread records into (the mount's and the
/// metadata role's): `LOG2_BUCKETS` counters and the sum, in ns.
pub struct AtomicHistogram {
    buckets: [std::sync::atomic::AtomicU64; LOG2_BUCKETS],
    sum_ns: std::sync::atomic::AtomicU64,
}

impl AtomicHistogram {
    pub const fn new() -> AtomicHistogram {
        AtomicHistogram { buckets: [const { std::sync::atomic::AtomicU64::new(0) }; LOG2_BUCKETS], sum_ns: std::sync::atomic::AtomicU64::new(0) }
    }

    pub fn record(&self, ns: u64) {
        self.buckets[log2_bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Its samples as `name{label, le}` etc. (the family line is the caller's).
    pub fn render(&self, e: &mut Expo, name: &str, label: (&str, &str)) {
        let b: [u64; LOG2_BUCKETS] = std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed));
        e.log2_histogram(name, label, &b, self.sum_ns.load(Ordering::Relaxed));
    }
}

impl Default for AtomicHistogram {
    fn default() -> AtomicHistogram {
        AtomicHistogram::new()
    }
}

/// Buckets of a log2 histogram: bucket i counts values above 2^i µs and
/// at most 2^(i+1) µs (bucket 0: at most 2 µs), the last one everything
/// above; so Prometheus's `le` (at most) is exact at the bounds.
pub const LOG2_BUCKETS: usize = 32;

/// The log2 bucket of `ns`.
pub fn log2_bucket(ns: u64) -> usize {
    let us = ns.saturating_sub(1) / 1_000;
    (63 - us.max(1).leading_zeros() as usize).min(LOG2_BUCKETS - 1)
}

/// A text exposition being written.
#[derive(Default)]
pub struct Expo {
    pub out: String,
}

impl Expo {
    /// Start a family: its help line and type.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", help.replace('\\', "\\\\").replace('\n', "\\n"));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// One sample; label values are escaped.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let val = val.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let _ = write!(self.out, "{k}=\"{val}\"");
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {v}");
    }

    /// A histogram from log2 µs buckets (bucket i: below 2^(i+1) µs).
    pub fn log2_histogram(&mut self, name: &str, label: (&str, &str), buckets: &[u64; LOG2_BUCKETS], sum_ns: u64) {
        let mut seen = 0;
        for (i, n) in buckets.iter().enumerate().take(LOG2_BUCKETS - 1) {
            seen += n;
            let le = format!("{}", (2u64 << i) as f64 / 1e6);
            self.sample(&format!("{name}_bucket"), &[label, ("le", &le)], seen as f64);
        }
        let total = seen + buckets[LOG2_BUCKETS - 1];
        self.sample(&format!("{name}_bucket"), &[label, ("le", "+Inf")], total as f64);
        self.sample(&format!("{name}_sum"), &[label], sum_ns as f64 / 1e9);
        self.sample(&format!("{name}_count"), &[label], total as f64);
    }
}

/// Parse an exposition into `(name, labels, value)` samples, refusing any
/// line that is not a comment or a well-formed sample (for tests and
/// `sluice top`).
pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || format!("line {}: {line:?}", n + 1);
        let (name_end, labels, rest) = match line.find('{') {
            Some(b) => {
                let close = b + line[b..].rfind('}').ok_or_else(bad)?;
                (b, parse_labels(&line[b + 1..close]).ok_or_else(bad)?, &line[close + 1..])
            }
            None => {
                let sp = line.find(' ').ok_or_else(bad)?;
                (sp, Vec::new(), &line[sp..])
            }
        };
        let name = &line[..name_end];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            return Err(bad());
        }
        let value = match rest.trim() {
            "+Inf" => f64::INFINITY,
            v => v.parse::<f64>().map_err(|_| bad())?,
        };
        out.push((name.to_string(), labels, value));
    }
    Ok(out)
}

fn parse_labels(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut it = s.chars().peekable();
    while it.peek().is_some() {
        let key: String = it.by_ref().take_while(|&c| c != '=').collect();
        if it.next()? != '"' {
            return None;
        }
        let mut val = String::new();
        loop {
            match it.next()? {
                '\\' => match it.next()? {
                    'n' => val.push('\n'),
                    c => val.push(c),
                },
                '"' => break,
                c => val.push(c),
            }
        }
        out.push((key.trim().to_string(), val));
        match it.next() {
            None => break,
            Some(',') => continue,
            Some(_) => return None,
        }
    }
    Some(out)
}

/// The samples of `name` whose labels include all of `labels`, summed
/// (`None` when there is none).
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = samples.iter().filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))).peekable();
    found.peek()?;
    Some(found.map(|s| s.2).sum())
}

/// One parsed sample: name, labels, value.
pub type Sample = (String, Vec<(String, String)>, f64);

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake endpoint that answers one request with `answer`, sent in
    /// pieces of `piece` bytes `gap` apart.
    fn fake(answer: Vec<u8>, piece: usize, gap: Duration) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && s.read(&mut b).unwrap_or(0) == 1 {
                head.push(b[0]);
            }
            for p in answer.chunks(piece) {
                if s.write_all(p).is_err() {
                    return;
                }
                std::thread::sleep(gap);
            }
        });
        addr
    }

    #[test]
    fn get_takes_an_answer_of_reply_bytes_max_and_refuses_one_more() {
        const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\n\r\n";
        let answer = |bytes: u64| [HEAD, &vec![b'x'; bytes as usize - HEAD.len()]].concat();
        let at = get(&fake(answer(REPLY_BYTES_MAX), 1 << 20, Duration::ZERO).to_string(), "/metrics", Duration::from_secs(20)).unwrap();
        assert_eq!(at.len() as u64, REPLY_BYTES_MAX - HEAD.len() as u64);
        let e = get(&fake(answer(REPLY_BYTES_MAX + 1), 1 << 20, Duration::ZERO).to_string(), "/metrics", Duration::from_secs(20)).unwrap_err();
        assert!(e.to_string().contains("REPLY_BYTES_MAX"), "{e}");
    }

    /// An endpoint that trickles its answer, each byte within the timeout
    /// of the last, is given up when the whole exchange took `timeout`.
    #[test]
    fn get_gives_a_trickling_endpoint_up_at_the_timeout() {
        let answer = b"HTTP/1.1 200 OK\r\n\r\nsluice_up 1\n".to_vec();
        let t = Instant::now();
        let e = get(&fake(answer, 1, Duration::from_millis(100)).to_string(), "/metrics", Duration::from_millis(500)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    fn http(addr: SocketAddr, request: &[u8]) -> u16 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
    }

    #[test]
    fn the_request_head_bound_holds_at_n_and_n_plus_1() {
        let e = Endpoint::start("127.0.0.1:0", |p| (p == "/metrics").then(|| (TEXT_FORMAT, "x 1\n".to_string()))).unwrap();
        let head = |total: usize| {
            let base = "GET /metrics HTTP/1.1\r\nX-Pad: ";
            format!("{base}{}\r\n\r\n", "p".repeat(total - base.len() - 4)).into_bytes()
        };
        assert_eq!(http(e.addr(), &head(REQUEST_BYTES_MAX)), 200, "a head of exactly the bound is served");
        assert_eq!(http(e.addr(), &head(REQUEST_BYTES_MAX + 1)), 431, "one byte more is refused");
        assert_eq!(http(e.addr(), b"POST /metrics HTTP/1.1\r\n\r\n"), 405);
        assert_eq!(http(e.addr(), b"GET /nope HTTP/1.1\r\n\r\n"), 404);
    }

    #[test]
    fn samples_round_trip_and_bad_lines_are_refused() {
        let mut e = Expo::default();
        e.family("m", "counter", "help with \\ and\nnewline");
        e.sample("m", &[("app", "we\"ird\\name\n")], 3.0);
        e.sample("m", &[("app", "b")], 4.0);
        let mut b = [0u64; LOG2_BUCKETS];
        b[log2_bucket(1_500)] += 2;
        e.log2_histogram("h_seconds", ("app", "b"), &b, 3_000);
        let s = parse(&e.out).unwrap();
        assert_eq!(value(&s, "m", &[("app", "we\"ird\\name\n")]), Some(3.0), "escaping round-trips");
        assert_eq!(value(&s, "m", &[]), Some(7.0), "summed over labels");
        assert_eq!(value(&s, "h_seconds_bucket", &[("le", "0.000002")]), Some(2.0), "1.5 µs is below 2 µs");
        assert_eq!(value(&s, "h_seconds_count", &[]), Some(2.0));
        assert!(parse("bad line here x").is_err() && parse("ok{a=\"1\"} 2\n# c").is_ok());
        assert!(parse("x} 1 {").is_err(), "a brace before the label set is refused, not a panic");
    }

    #[test]
    fn bucket_bounds_are_inclusive_as_le_says() {
        assert_eq!((log2_bucket(0), log2_bucket(2_000), log2_bucket(2_001)), (0, 0, 1), "2 µs is le 2 µs");
        assert_eq!((log2_bucket(4_000), log2_bucket(4_001)), (1, 2));
        assert_eq!(log2_bucket(u64::MAX), LOG2_BUCKETS - 1);
    }

    /// Open `n` clients that each sent part of a request head, in order.
    fn partial(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
        (0..n)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
                s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                s
            })
            .collect()
    }

    /// Finish `s`'s request and read its answer: the status, 0 for none.
    fn finish(s: &mut TcpStream) -> u16 {
        let _ = s.write_all(b"\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
    }

    #[test]
    fn the_connection_bound_holds_at_n_and_n_plus_1() {
        // A deadline far beyond the test's run, so that only the bound can
        // close a client here; the deadline has its own tests.
        let limits = Limits { conns_max: CONNS_MAX, io_timeout: Duration::from_secs(600) };
        let e = Endpoint::start_with("127.0.0.1:0", limits, |_| Some((TEXT_FORMAT, "x 1\n".to_string()))).unwrap();
        let mut n = partial(e.addr(), CONNS_MAX);
        // At N: the first client is still held. Served and closed, it frees
        // its place; the next check starts with N - 1 held.
        assert_eq!(finish(&mut n[0]), 200, "N clients are held at once, the oldest included");
        // Back to N, then one more: the oldest held (n[1]) is closed, the
        // newest served, and the others still are.
        n.extend(partial(e.addr(), 1));
        let mut extra = partial(e.addr(), 1).pop().unwrap();
        assert_eq!(finish(&mut extra), 200, "the newest is served");
        assert_eq!(finish(&mut n[1]), 0, "at N + 1 the client held longest was closed unanswered");
        assert_eq!(finish(&mut n[2]), 200, "and only that one");
        assert_eq!(finish(n.last_mut().unwrap()), 200);
    }

    #[test]
    fn silent_clients_do_not_delay_a_scrape() {
        let e = Endpoint::start("127.0.0.1:0", |_| Some((TEXT_FORMAT, "x 1\n".to_string()))).unwrap();
        // Twice as many silent clients as the endpoint holds: served one at
        // a time, they held it 2 s each, 256 s in all.
        let _silent = partial(e.addr(), 2 * CONNS_MAX);
        let t = Instant::now();
        let mut s = TcpStream::connect(e.addr()).unwrap();
        s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        // The limit is the scrape's own deadline (2 s), hundreds of times
        // what serving it takes on a loaded machine.
        assert!(out.starts_with("HTTP/1.1 200"), "a scrape behind {} silent clients: {out:?} after {:?}", 2 * CONNS_MAX, t.elapsed());
    }

    #[test]
    fn a_trickling_client_is_dropped_after_the_overall_timeout() {
        let e = Endpoint::start("127.0.0.1:0", |_| Some((TEXT_FORMAT, "x 1\n".to_string()))).unwrap();
        let mut slow = TcpStream::connect(e.addr()).unwrap();
        // A whole request, one byte every 100 ms: 3.1 s in all, each gap far
        // below IO_TIMEOUT. Served, it would have held the endpoint 3.1 s.
        let request = b"GET /metrics HTTP/1.1\r\nX: y\r\n\r\n";
        assert!(request.len() as u32 * 100 > IO_TIMEOUT.as_millis() as u32);
        for b in request {
            std::thread::sleep(Duration::from_millis(100));
            if slow.write_all(&[*b]).is_err() {
                break;
            }
        }
        let mut rest = String::new();
        let _ = slow.read_to_string(&mut rest);
        assert!(!rest.starts_with("HTTP/1.1 200"), "a client that took 3.1 s for its request was served");
        assert_eq!(http(e.addr(), b"GET /metrics HTTP/1.1\r\n\r\n"), 200, "the next client is served");
    }
}
