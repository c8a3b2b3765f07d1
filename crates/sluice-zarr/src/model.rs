//! The cost model of a collective's strategies (docs/arrays.md): five
//! parameters measured against a sluice address, and each strategy's
//! predicted time from them and the plan. `sluice bench array` reports it
//! beside the measured times; `sluice array write|read --strategy auto`
//! lets it choose.
//!
//! A strategy's time is the slowest data server's pieces, dispatches (run
//! on as many executors as there are cores) and bytes, plus the round
//! trips a rank waits for, plus, for two-phase, the in-memory shuffle
//! spread over the cores. Independent list I/O is assumed to get one
//! dispatch per piece (no merging across ranks); server-directed one per
//! file, cut at the scheduler's dispatch bound; two-phase one per
//! contiguous transfer.

use std::time::Instant;

use serde::Serialize;
use sluice_array::{Distribution, Layout, Plan};
use sluice_remote::Remote;

use crate::collective::{Strategy, TRANSFER_BYTES_MAX};
use crate::Error;

/// The model's parameters.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Params {
    /// A message's round trip (an 8-byte write), ns.
    pub message_ns: f64,
    /// Per piece of a list message that joins its neighbour's dispatch, ns.
    pub piece_ns: f64,
    /// Per dispatch beyond the pieces it carries, ns.
    pub dispatch_ns: f64,
    /// Per byte moved to or from a data server, ns.
    pub byte_ns: f64,
    /// Per byte copied in memory (the two-phase shuffle), ns.
    pub copy_byte_ns: f64,
}

/// How much calibration writes.
#[derive(Clone, Copy, Debug)]
pub struct CalibrateOptions {
    /// Bytes per write of the per-byte measurement.
    pub write_bytes: usize,
    /// Writes per writer (one writer per core, at once).
    pub writes_per_writer: u64,
}

impl CalibrateOptions {
    /// The benchmark's: 16 MiB writes, 4 per writer.
    pub const BENCH: CalibrateOptions = CalibrateOptions { write_bytes: 16 << 20, writes_per_writer: 4 };
    /// Before a collective (`--strategy auto`): 4 MiB writes, 2 per writer.
    pub const QUICK: CalibrateOptions = CalibrateOptions { write_bytes: 4 << 20, writes_per_writer: 2 };
}

fn timed(f: impl FnOnce() -> Result<(), Error>) -> Result<f64, Error> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_nanos() as f64)
}

fn client(what: &str) -> impl Fn(sluice_client::ClientError) -> Error + '_ {
    move |e| Error::client(what, e)
}

/// Measure the parameters against `addr`, with scratch files named
/// `prefix-*` (removed afterwards).
pub fn calibrate(addr: &str, prefix: &str, opts: CalibrateOptions) -> Result<Params, Error> {
    const N: u64 = 4096;
    let remote = Remote::connect(addr).map_err(client("connect"))?;
    let path = format!("{prefix}-calibrate");
    let fd = remote.open(&path, libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC, 0o600).map_err(client("calibrate"))?;
    let big = vec![7u8; opts.write_bytes];
    let result = (|| {
        remote.pwrite(fd, &big[..big.len().min(1 << 20)], 0).map_err(client("calibrate"))?;
        let message_ns = timed(|| {
            for i in 0..500u64 {
                remote.pwrite(fd, &big[..8], i * 8).map_err(client("calibrate"))?;
            }
            Ok(())
        })? / 500.0;
        let small = vec![1u8; (N * 64) as usize];
        let joined: Vec<(u64, u64)> = (0..N).map(|i| (i * 64, 64)).collect();
        let apart: Vec<(u64, u64)> = (0..N).map(|i| (i * 4096, 64)).collect();
        // Twice each, the second timed: the pages exist by then, as they
        // do for most of a collective.
        remote.write_list(fd, &joined, &small).map_err(client("calibrate"))?;
        let t_joined = timed(|| remote.write_list(fd, &joined, &small).map(|_| ()).map_err(client("calibrate")))?;
        remote.write_list(fd, &apart, &small).map_err(client("calibrate"))?;
        let t_apart = timed(|| remote.write_list(fd, &apart, &small).map(|_| ()).map_err(client("calibrate")))?;
        // Bytes: one writer per core at once, as a collective's ranks load a
        // server (one sequential writer made it 3x too slow).
        let writers = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1) as u64;
        let byte_ns = timed(|| {
            std::thread::scope(|sc| {
                let handles: Vec<_> = (0..writers)
                    .map(|w| {
                        let (big, path) = (&big, format!("{prefix}-calibrate-{w}"));
                        sc.spawn(move || -> Result<(), Error> {
                            let r = Remote::connect(addr).map_err(client("connect"))?;
                            let fd = r.open(&path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o600).map_err(client("calibrate"))?;
                            for i in 0..opts.writes_per_writer {
                                r.pwrite(fd, big, i * big.len() as u64).map_err(client("calibrate"))?;
                            }
                            r.close(fd).map_err(client("calibrate"))?;
                            r.unlink(&path).map_err(client("calibrate"))
                        })
                    })
                    .collect();
                handles.into_iter().try_for_each(|h| h.join().map_err(|_| Error::new("a calibration writer panicked"))?)
            })
        })? / (opts.writes_per_writer * writers * big.len() as u64) as f64;
        Ok::<_, Error>((message_ns, ((t_joined - message_ns) / N as f64).max(0.0), ((t_apart - t_joined) / N as f64).max(0.0), byte_ns))
    })();
    let _ = remote.close(fd);
    let _ = remote.unlink(&path);
    let (message_ns, piece_ns, dispatch_ns, byte_ns) = result?;
    let src = vec![1u8; 64 << 20];
    let mut dst = vec![0u8; 64 << 20];
    dst.copy_from_slice(&src);
    let copy = timed(|| {
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        Ok(())
    })?;
    Ok(Params { message_ns, piece_ns, dispatch_ns, byte_ns, copy_byte_ns: copy / src.len() as f64 })
}

/// Each data server's write bandwidth (bytes per second) behind `addr`:
/// a file of one object on each server in turn (scratch files named
/// `prefix-weigh-S`, removed), 2 writes of 4 MiB. One server: `[its]`.
/// For placement's shares on heterogeneous servers (Panda's balancing).
pub fn server_bandwidths(addr: &str, prefix: &str) -> Result<Vec<f64>, Error> {
    let remote = Remote::connect(addr).map_err(client("connect"))?;
    let servers = remote.servers();
    let data = vec![5u8; 4 << 20];
    let mut out = Vec::with_capacity(servers);
    for s in 0..servers {
        let path = format!("{prefix}-weigh-{s}");
        if let Remote::Cluster(k) = &remote {
            let req = sluice_stripe::LayoutRequest { stripe_bytes: 0, count: 1, start: s as i32 };
            let f = k.striped().create(&path, req).map_err(|e| Error::client("weigh", e.into()))?;
            k.striped().close(&f).map_err(|e| Error::client("weigh", e.into()))?;
        }
        let fd = remote.open(&path, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC, 0o600).map_err(client("weigh"))?;
        remote.pwrite(fd, &data, 0).map_err(client("weigh"))?;
        let t = timed(|| remote.pwrite(fd, &data, data.len() as u64).map(|_| ()).map_err(client("weigh")));
        let _ = remote.close(fd);
        let _ = remote.unlink(&path);
        out.push(data.len() as f64 / (t? / 1e9).max(1e-9));
    }
    Ok(out)
}

/// What a strategy's prediction needs to know of the collective.
pub struct Shape<'a> {
    pub plan: &'a Plan,
    pub layout: &'a Layout,
    pub dist: &'a Distribution,
    pub unit_server: &'a [usize],
    pub servers: usize,
}

/// A strategy's predicted time, in seconds.
pub fn predict(s: &Shape, strategy: Strategy, m: &Params) -> f64 {
    let (layout, n) = (s.layout, s.servers.max(1));
    let (mut pieces, mut dispatches, mut bytes) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
    // The scheduler's default bound (a server may be configured otherwise).
    let dispatch_bytes_max = sluice_core::Limits::default().dispatch_bytes_max;
    let server_of = |unit: u64| s.unit_server[unit as usize].min(n - 1);
    for piece in s.plan.pieces() {
        bytes[server_of(piece.unit)] += piece.len;
        if strategy != Strategy::TwoPhase {
            pieces[server_of(piece.unit)] += 1;
        }
        if strategy == Strategy::Independent {
            dispatches[server_of(piece.unit)] += piece.len.div_ceil(dispatch_bytes_max);
        }
    }
    for u in 0..layout.units() {
        dispatches[server_of(u)] += match strategy {
            Strategy::Independent => 0,
            Strategy::ServerDirected => layout.unit_data_bytes().div_ceil(dispatch_bytes_max),
            Strategy::TwoPhase => layout.unit_bytes().div_ceil(TRANSFER_BYTES_MAX),
        };
    }
    let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1) as f64;
    let server_ns = (0..n).map(|i| pieces[i] as f64 * m.piece_ns + dispatches[i] as f64 * m.dispatch_ns / cores + bytes[i] as f64 * m.byte_ns).fold(0.0, f64::max);
    // Round trips a rank waits for: its list messages, or its transfers.
    let ranks = s.dist.ranks() as f64;
    let messages = match strategy {
        Strategy::TwoPhase => layout.units() as f64 * layout.unit_bytes().div_ceil(TRANSFER_BYTES_MAX) as f64 / ranks,
        _ => (s.plan.pieces().len() as f64 / sluice_proto::LIST_PIECES_MAX as f64).max(layout.units() as f64) / ranks,
    };
    let shuffle_ns = if strategy == Strategy::TwoPhase { s.plan.bytes() as f64 * m.copy_byte_ns / cores.min(ranks) } else { 0.0 };
    (server_ns + messages * m.message_ns + shuffle_ns) / 1e9
}

/// Every strategy's prediction, and the one with the smallest.
pub fn choose(s: &Shape, m: &Params) -> (Strategy, Vec<(Strategy, f64)>) {
    let all: Vec<(Strategy, f64)> = [Strategy::Independent, Strategy::TwoPhase, Strategy::ServerDirected].into_iter().map(|st| (st, predict(s, st, m))).collect();
    let best = all.iter().min_by(|a, b| a.1.total_cmp(&b.1)).map(|x| x.0).unwrap_or(Strategy::Independent);
    (best, all)
}
