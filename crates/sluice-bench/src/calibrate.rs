//! `sluice calibrate`: measure a device's cost model.
//!
//! On a scratch file under the given directory it times, with real
//! `pread` calls (O_DIRECT with `direct`):
//!
//! - one reader, sizes 4 KiB, 64 KiB and 1 MiB, each sequential and random:
//!   the mean latency of each cell gives the fixed cost and the cost per
//!   byte (least squares over the sequential cells) and the seek cost (the
//!   median, over the sizes, of the random cell over the sequential one);
//! - random 4 KiB reads at queue depths 1, 2, 4, 8, 16 and 32 (one thread
//!   per slot): the parallelism is the smallest depth whose throughput
//!   reaches `PARALLEL_GAIN_PCT` of the best, the learner's own rule;
//! - random 64 KiB and 1 MiB reads at the server's default queue depth
//!   (`AT_DEPTH`): with the 4 KiB cell of that depth, the time each
//!   dispatch holds the device when it is kept busy, fixed and per byte
//!   (`sim_device`: the simulator's parallel device).
//!
//! Each cell runs for `cell_ms`; the whole run stays well under a minute.
//! The result is a [`ModelFile`], written as TOML, that `sluice serve
//! --device-model` and `sluice sim --device-model` load.

use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sluice_core::cost::PARALLEL_GAIN_PCT;
use sluice_core::DeviceCost;
use sluice_sim::Rng;

use crate::workload::worker::AlignedBuf;

/// Request sizes of the latency cells.
pub const SIZES: [u64; 3] = [4 << 10, 64 << 10, 1 << 20];
/// Queue depths of the throughput cells.
pub const DEPTHS: [u32; 6] = [1, 2, 4, 8, 16, 32];
/// The depth of the larger reads' throughput cells: a server's default
/// queue depth, the depth it keeps its device at.
pub const AT_DEPTH: u32 = sluice_server::QUEUE_DEPTH_DEFAULT;
// `shared_fit` takes the 4 KiB point at `AT_DEPTH` from the depth table.
const _: () = {
    let mut i = 0;
    while DEPTHS[i] != AT_DEPTH {
        i += 1;
    }
};
/// Sizes of the throughput cells at `AT_DEPTH` (4 KiB is in the depth
/// table).
pub const AT_DEPTH_SIZES: [u64; 2] = [64 << 10, 1 << 20];
/// What to measure.
#[derive(Clone, Debug)]
pub struct CalibrateConfig {
    pub root: PathBuf,
    pub direct: bool,
    /// Size of the scratch file (random reads spread over it).
    pub file_bytes: u64,
    /// How long each cell runs.
    pub cell_ms: u64,
}

/// The model file's types live with the device models (`sluice serve`
/// loads them too); calibration fills them in.
pub use sluice_device::model_file::{DepthCell, LatencyCell, Measured, ModelFile, SizeDepthCell};

/// The device as the simulator serves it (`sluice sim
/// --device-model`; `sluice sim --validate --twins` keeps its one-channel
/// twin, docs/sim.md) and its channel count. On a device that gains
/// from parallelism (`parallelism` > 1) it has `min(parallelism,
/// AT_DEPTH)` channels: each dispatch takes its measured latency, but
/// holds the part of the device the channels share for the time per
/// dispatch measured at `AT_DEPTH` (a fit over the 4 KiB, 64 KiB and
/// 1 MiB cells there), so with `AT_DEPTH` channels busy the
/// throughput is the measured one (with fewer, that figure still
/// bounds it). A file without those cells shares the transfer only,
/// on as many channels as the 4 KiB throughput grew from one in flight
/// to that depth.
pub fn sim_device(m: &ModelFile) -> (sluice_sim::ProfileFigures, u32) {
    let mut p = sluice_sim::ProfileFigures { access_ns: m.dispatch_ns, bytes_per_s: m.bytes_per_s(), seek_ns: m.seek_ns, shared_ns: 0, shared_bytes_per_s: 0 };
    let depth = m.parallelism.clamp(1, AT_DEPTH);
    if depth == 1 {
        return (p, 1);
    }
    match m.measured.as_ref().and_then(shared_fit) {
        Some((ns, bytes_per_s)) => {
            (p.shared_ns, p.shared_bytes_per_s) = (ns, bytes_per_s);
            (p, depth)
        }
        None => (p, (m.gain_at(depth).round() as u32).clamp(1, depth)),
    }
}

fn open(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path)
}

/// Tell the kernel to drop the file's cached pages (page-cache runs then
/// measure the device on first touch, as a server serving cold data).
fn drop_cache(f: &File) {
    // SAFETY: a hint on an open descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// Run the calibration and return the model with its measurements.
pub fn run(cfg: &CalibrateConfig) -> Result<ModelFile, String> {
    let path = cfg.root.join(format!(".sluice-calibrate-{}", std::process::id()));
    let result = measure(cfg, &path);
    let _ = std::fs::remove_file(&path);
    result
}

fn measure(cfg: &CalibrateConfig, path: &Path) -> Result<ModelFile, String> {
    let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
    let file_bytes = cfg.file_bytes.max(64 << 20) / (1 << 20) * (1 << 20);
    {
        let mut f = File::create(path).map_err(|e| io("creating", e))?;
        let chunk = vec![0x5au8; 1 << 20];
        for _ in 0..file_bytes >> 20 {
            f.write_all(&chunk).map_err(|e| io("writing", e))?;
        }
        f.sync_all().map_err(|e| io("syncing", e))?;
    }
    let cell = Duration::from_millis(cfg.cell_ms.max(10));
    let mut latency = Vec::new();
    for &bytes in &SIZES {
        for random in [false, true] {
            let f = open(path, cfg.direct).map_err(|e| io("opening", e))?;
            drop_cache(&f);
            let mut buf = AlignedBuf::new(bytes as usize);
            let (mut rng, mut at, mut ops) = (Rng::new(0x2545_f491_4f6c_dd1d ^ bytes), 0u64, 0u64);
            let blocks = file_bytes / bytes;
            let (start, cpu) = (Instant::now(), thread_cpu_ns());
            while start.elapsed() < cell {
                let offset = if random {
                    (rng.next_u64() % blocks) * bytes
                } else {
                    let next = (at + bytes) % (blocks * bytes);
                    std::mem::replace(&mut at, next)
                };
                f.read_at(buf.slice(bytes as usize), offset).map_err(|e| io("reading", e))?;
                ops += 1;
            }
            let mean_ns = (start.elapsed().as_nanos() / u128::from(ops.max(1))) as u64;
            let cpu_ns = thread_cpu_ns().saturating_sub(cpu) / ops.max(1);
            latency.push(LatencyCell { bytes, random, mean_ns, ops, cpu_ns });
        }
    }
    let mut depth = Vec::new();
    for &d in &DEPTHS {
        depth.push(DepthCell { depth: d, ops_per_s: throughput(cfg, path, file_bytes, 4096, d, cell)? });
    }
    let mut at_depth = Vec::new();
    for &bytes in &AT_DEPTH_SIZES {
        at_depth.push(SizeDepthCell { bytes, depth: AT_DEPTH, ops_per_s: throughput(cfg, path, file_bytes, bytes, AT_DEPTH, cell)? });
    }
    let ring = match cfg.direct {
        true => SIZES.iter().map(|&b| ring_cell(path, file_bytes, b, cell)).collect::<Result<Vec<_>, _>>()?,
        false => Vec::new(),
    };
    let cost = fit(&latency, &depth);
    Ok(ModelFile {
        dispatch_ns: cost.dispatch_ns,
        byte_ps: cost.byte_ps,
        seek_ns: cost.seek_ns,
        parallelism: cost.parallelism,
        measured: Some(Measured { root: cfg.root.display().to_string(), direct: cfg.direct, latency, depth, at_depth, ring }),
    })
}

/// CPU time of the calling thread so far (user and system), ns.
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes one timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Random O_DIRECT reads of `bytes`, one at a time through io_uring, each
/// completion awaited by spinning on the ring: the mean latency, and the
/// mean time of the submitting system call as the CPU.
fn ring_cell(path: &Path, file_bytes: u64, bytes: u64, cell: Duration) -> Result<LatencyCell, String> {
    let err = |what: &str, e: std::io::Error| format!("{what} (io_uring) {}: {e}", path.display());
    let f = open(path, true).map_err(|e| err("opening", e))?;
    let mut ring = io_uring::IoUring::new(2).map_err(|e| err("setting up", e))?;
    let mut buf = AlignedBuf::new(bytes as usize);
    let (mut rng, blocks, mut ops, mut submit_ns) = (Rng::new(0x6a09_e667_f3bc_c908 ^ bytes), file_bytes / bytes, 0u64, 0u64);
    let start = Instant::now();
    while start.elapsed() < cell {
        let slice = buf.slice(bytes as usize);
        let read = io_uring::opcode::Read::new(io_uring::types::Fd(f.as_raw_fd()), slice.as_mut_ptr(), bytes as u32).offset((rng.next_u64() % blocks) * bytes).build();
        // SAFETY: the buffer outlives the read, awaited below.
        unsafe { ring.submission().push(&read) }.map_err(|_| "io_uring: submission queue full".to_string())?;
        let at = Instant::now();
        ring.submit().map_err(|e| err("submitting", e))?;
        submit_ns += at.elapsed().as_nanos() as u64;
        let res = loop {
            if let Some(c) = ring.completion().next() {
                break c.result();
            }
            std::hint::spin_loop();
        };
        if res < 0 {
            return Err(err("reading", std::io::Error::from_raw_os_error(-res)));
        }
        ops += 1;
    }
    let mean_ns = (start.elapsed().as_nanos() / u128::from(ops.max(1))) as u64;
    // The submission's system call does the kernel's part of the read
    // before it returns (it does not block): its time is the core's.
    Ok(LatencyCell { bytes, random: true, mean_ns, ops, cpu_ns: submit_ns / ops.max(1) })
}

/// The latency of a dispatch as a spinning loop sees it: a least-squares
/// line over the `ring` cells (fixed nanoseconds, bytes per second, as
/// `shared_fit`). None without two of them.
pub fn ring_fit(m: &Measured) -> Option<(u64, u64)> {
    let pts: Vec<(f64, f64)> = m.ring.iter().map(|c| (c.bytes as f64, c.mean_ns as f64)).collect();
    if pts.len() < 2 {
        return None;
    }
    let (slope, intercept) = line(&pts);
    let bytes_per_s = if slope > 0.0 { (1e9 / slope).min(u64::MAX as f64 / 2.0) as u64 } else { u64::MAX / 2 };
    Some((intercept as u64, bytes_per_s))
}

/// Random reads of `bytes` by `depth` threads for `cell`: operations per
/// second.
fn throughput(cfg: &CalibrateConfig, path: &Path, file_bytes: u64, bytes: u64, depth: u32, cell: Duration) -> Result<f64, String> {
    let f = open(path, cfg.direct).map_err(|e| format!("opening {}: {e}", path.display()))?;
    drop_cache(&f);
    let blocks = file_bytes / bytes;
    let start = Instant::now();
    let ops: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..depth)
            .map(|t| {
                let f = &f;
                s.spawn(move || {
                    let mut buf = AlignedBuf::new(bytes as usize);
                    let (mut rng, mut ops) = (Rng::new(0x9e37_79b9_7f4a_7c15 ^ u64::from(t + 1) ^ bytes), 0u64);
                    while start.elapsed() < cell {
                        if f.read_at(buf.slice(bytes as usize), (rng.next_u64() % blocks) * bytes).is_err() {
                            break;
                        }
                        ops += 1;
                    }
                    ops
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
    });
    Ok(ops as f64 / start.elapsed().as_secs_f64())
}

/// The time per dispatch at `AT_DEPTH` against its size, a least-squares
/// line over the 4 KiB cell of the depth table and the `at_depth` cells:
/// (fixed nanoseconds, bytes per second). None without those cells.
pub fn shared_fit(m: &Measured) -> Option<(u64, u64)> {
    let four = m.depth.iter().find(|c| c.depth == AT_DEPTH).map(|c| (4096.0, c.ops_per_s));
    let pts: Vec<(f64, f64)> = four
        .into_iter()
        .chain(m.at_depth.iter().filter(|c| c.depth == AT_DEPTH).map(|c| (c.bytes as f64, c.ops_per_s)))
        .filter(|p| p.1 > 0.0)
        .map(|(b, ops)| (b, 1e9 / ops))
        .collect();
    if pts.len() < 2 {
        return None;
    }
    let (slope, intercept) = line(&pts);
    let bytes_per_s = if slope > 0.0 { (1e9 / slope).min(u64::MAX as f64 / 2.0) as u64 } else { 0 };
    Some((intercept as u64, bytes_per_s))
}

/// Least squares of y against x: (slope, intercept), both at least 0.
fn line(pts: &[(f64, f64)]) -> (f64, f64) {
    let n = pts.len() as f64;
    let (sx, sy) = (pts.iter().map(|p| p.0).sum::<f64>(), pts.iter().map(|p| p.1).sum::<f64>());
    let (sxx, sxy) = (pts.iter().map(|p| p.0 * p.0).sum::<f64>(), pts.iter().map(|p| p.0 * p.1).sum::<f64>());
    let den = n * sxx - sx * sx;
    let slope = if den.abs() > f64::EPSILON { ((n * sxy - sx * sy) / den).max(0.0) } else { 0.0 };
    let intercept = if n > 0.0 { ((sy - slope * sx) / n).max(0.0) } else { 0.0 };
    (slope, intercept)
}

/// The model from the cells: least squares of the sequential latencies
/// against size, the median random-over-sequential excess of the sizes
/// as the seek, and the parallelism rule over the depths. The median,
/// because the excess at 1 MiB carries that size's noise: one
/// calibration of the O_DIRECT virtual disk, which has no seek cost, had
/// +4.4 us at 4 KiB and -6.1 us at 64 KiB, and the mean of the three was
/// 47.6 us (so about +145 us at 1 MiB).
pub fn fit(latency: &[LatencyCell], depth: &[DepthCell]) -> DeviceCost {
    let excess: Vec<f64> =
        latency.iter().filter(|c| c.random).filter_map(|r| latency.iter().find(|s| !s.random && s.bytes == r.bytes).map(|s| r.mean_ns as f64 - s.mean_ns as f64)).collect();
    // No random cell: NaN, and `max` keeps the 0.
    let seek = crate::median(&excess).max(0.0);
    let seq: Vec<(f64, f64)> = latency.iter().filter(|c| !c.random).map(|c| (c.bytes as f64, c.mean_ns as f64)).collect();
    let (slope, intercept) = line(&seq);
    let best = depth.iter().map(|c| c.ops_per_s).fold(0.0, f64::max);
    let parallelism = depth.iter().find(|c| c.ops_per_s * 100.0 >= best * PARALLEL_GAIN_PCT as f64).map_or(1, |c| c.depth);
    DeviceCost::new(intercept as u64, (slope * 1_000.0) as u64, seek as u64, parallelism)
}

/// The model and its measurements, for people.
pub fn table(m: &ModelFile) -> String {
    let mut out = String::new();
    if let Some(ms) = &m.measured {
        out += &format!("calibration of {} ({})\n", ms.root, if ms.direct { "O_DIRECT" } else { "page cache, dropped first" });
        out += "size      sequential us   random us\n";
        for &b in &SIZES {
            let cell = |r: bool| ms.latency.iter().find(|c| c.bytes == b && c.random == r).map_or(0.0, |c| c.mean_ns as f64 / 1e3);
            out += &format!("{:<9} {:>13.1} {:>11.1}\n", format!("{}K", b >> 10), cell(false), cell(true));
        }
        out += "depth     4K random ops/s\n";
        for c in &ms.depth {
            out += &format!("{:<9} {:>15.0}\n", c.depth, c.ops_per_s);
        }
        for c in &ms.at_depth {
            out += &format!("{}K random at depth {}: {:.0} ops/s ({:.0} MB/s)\n", c.bytes >> 10, c.depth, c.ops_per_s, c.ops_per_s * c.bytes as f64 / 1e6);
        }
        if let Some((ns, bps)) = shared_fit(ms) {
            out += &format!("at depth {AT_DEPTH}: each dispatch holds the device {:.1} us + its bytes at {:.0} MB/s\n", ns as f64 / 1e3, bps as f64 / 1e6);
        }
    }
    out += &format!("model: {}\n", m.cost());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_recovers_a_device_by_hand() {
        // 50 us + 1 ns per byte, seeks 100 us, throughput flat from depth 8.
        let lat = |b: u64, r: bool| LatencyCell { bytes: b, random: r, mean_ns: 50_000 + b + if r { 100_000 } else { 0 }, ops: 10, cpu_ns: 0 };
        let latency: Vec<_> = SIZES.iter().flat_map(|&b| [lat(b, false), lat(b, true)]).collect();
        let depth: Vec<_> = DEPTHS.iter().map(|&d| DepthCell { depth: d, ops_per_s: 1_000.0 * f64::from(d.min(8)) }).collect();
        assert_eq!(fit(&latency, &depth), DeviceCost::new(50_000, 1_000, 100_000, 8));
    }

    #[test]
    fn one_size_s_noise_is_not_a_seek_cost() {
        // One calibration of the O_DIRECT virtual disk (no seek cost):
        // random minus sequential +4.4 us at 4 KiB, -6.1 us at 64 KiB and
        // (from the mean it gave, 47.6 us) about +145 us at 1 MiB.
        let cell = |bytes: u64, random: bool, mean_ns: u64| LatencyCell { bytes, random, mean_ns, ops: 10, cpu_ns: 0 };
        let latency = [
            cell(4096, false, 48_200),
            cell(4096, true, 52_600),
            cell(65_536, false, 73_500),
            cell(65_536, true, 67_400),
            cell(1 << 20, false, 710_000),
            cell(1 << 20, true, 855_000),
        ];
        let m = fit(&latency, &[DepthCell { depth: 1, ops_per_s: 1.0 }]);
        assert_eq!(m.seek_ns, 4_400, "{m:?}");
        assert!((600..=660).contains(&m.byte_ps), "the sequential cells' cost per byte: {m:?}");
    }

    #[test]
    fn the_time_a_dispatch_holds_the_device_at_depth_by_hand() {
        // At depth 8, 20 us per dispatch plus its bytes at 2 GB/s.
        let per = |b: u64| 1e9 / (20_000.0 + b as f64 / 2.0);
        let depth: Vec<_> = DEPTHS.iter().map(|&d| DepthCell { depth: d, ops_per_s: if d == AT_DEPTH { per(4096) } else { 1_000.0 * f64::from(d) } }).collect();
        let at_depth = AT_DEPTH_SIZES.iter().map(|&bytes| SizeDepthCell { bytes, depth: AT_DEPTH, ops_per_s: per(bytes) }).collect();
        let m = Measured { root: "/".into(), direct: true, latency: Vec::new(), depth, at_depth, ring: Vec::new() };
        let (ns, bps) = shared_fit(&m).unwrap();
        assert!(ns.abs_diff(20_000) <= 1 && bps.abs_diff(2_000_000_000) <= 2_000, "{ns} ns, {bps} B/s");
        // The simulator's device: a channel per dispatch in flight (the
        // server's queue depth of the model's 16), each with the latency.
        let model = ModelFile { dispatch_ns: 50_000, byte_ps: 1_000, seek_ns: 0, parallelism: 16, measured: Some(m.clone()) };
        let (p, channels) = sim_device(&model);
        assert_eq!((p.access_ns, p.bytes_per_s, p.shared_ns, channels), (50_000, 1_000_000_000, ns, AT_DEPTH));
        // One cell is no line; a file written before the cells has none.
        let bare = Measured { at_depth: Vec::new(), ..m };
        assert_eq!(shared_fit(&bare), None);
        // Without them the channels share the transfer only, as many as
        // the 4 KiB throughput grew up to the depth (deeper cells do not
        // count); a device that does not gain is one channel.
        let cell = |depth, ops_per_s| DepthCell { depth, ops_per_s };
        let depth = vec![cell(1, 10_000.0), cell(2, 18_000.0), cell(4, 25_000.0), cell(8, 40_000.0), cell(16, 90_000.0)];
        let old_file = ModelFile { measured: Some(Measured { depth, ..bare }), ..model };
        let (p, channels) = sim_device(&old_file);
        assert_eq!((p.shared_ns, p.shared_bytes_per_s, channels), (0, 0, 4));
        assert_eq!(sim_device(&ModelFile { parallelism: 1, ..old_file.clone() }).1, 1);
        assert_eq!(sim_device(&ModelFile { measured: None, ..old_file }).1, AT_DEPTH);
        let old = "dispatch_ns = 1\nbyte_ps = 1\nseek_ns = 1\nparallelism = 4\n[measured]\nroot = \"/\"\ndirect = true\nlatency = []\ndepth = []\n";
        assert_eq!(ModelFile::from_toml(old).unwrap().measured.unwrap().at_depth, Vec::new());
    }
}
