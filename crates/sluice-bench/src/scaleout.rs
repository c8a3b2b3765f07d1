//! The scale-out benchmark (`sluice bench scaleout`): one large striped
//! file, stripes over every data server, read by several clients at once,
//! with 1, 2, 4… data servers, each on its own device (by default the
//! emulated 7200 rpm disk). Each client has its own connections and reads
//! its contiguous share of the file in requests of `request_bytes`, with
//! `inflight` of them outstanding at once (request `i` on the client's
//! thread `i % inflight`; 1 = one after another); the figure is the file's
//! bytes over the wall time until the last client is done. The file is
//! written first and `fsync`ed; reads are checked.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use sluice_client::ConnectOptions;
use sluice_core::PolicyConfig;
use sluice_server::DeviceKind;

use sluice_remote::{Error, Result, StripedClient, StripedFile};

use sluice_launch::{LocalCluster, LocalClusterConfig};
use sluice_stripe::LayoutRequest;

/// What to run.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleoutConfig {
    /// Data-server counts, one run each.
    pub servers: Vec<u32>,
    pub clients: u32,
    /// Requests each client keeps outstanding.
    pub inflight: u32,
    pub file_bytes: u64,
    pub request_bytes: u64,
    pub stripe_bytes: u64,
    pub policy: String,
    /// `hdd7200` or `real`.
    pub device: String,
}

/// One run.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleoutRun {
    pub servers: u32,
    pub seconds: f64,
    pub mib_per_s: f64,
    /// Bandwidth over the first run's.
    pub speedup: f64,
}

/// The report `--json` writes.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleoutReport {
    pub config: ScaleoutConfig,
    pub runs: Vec<ScaleoutRun>,
}

/// Fill byte of file offset `at`: one value per 4 KiB block, so a piece
/// read from the wrong place is detected.
fn byte_at(at: u64) -> u8 {
    (at >> 12) as u8 ^ 0x5a
}

/// The offset of the first byte of `buf` (read at `at`) that is not
/// `byte_at`'s, checked a 4 KiB block at a time (cheap: the readers share
/// two cores with the servers).
fn first_wrong(buf: &[u8], at: u64) -> Option<u64> {
    let mut i = 0usize;
    while i < buf.len() {
        let off = at + i as u64;
        let len = ((((off >> 12) + 1) << 12) - off).min((buf.len() - i) as u64) as usize;
        let want = byte_at(off);
        if !buf[i..i + len].iter().all(|&b| b == want) {
            return buf[i..i + len].iter().position(|&b| b != want).map(|j| off + j as u64);
        }
        i += len;
    }
    None
}

/// Run every server count in turn, each in a fresh cluster under `scratch`.
pub fn scaleout(cfg: &ScaleoutConfig, scratch: &Path) -> Result<ScaleoutReport> {
    let device = DeviceKind::parse(&cfg.device).map_err(|e| Error::invalid(e.to_string()))?;
    let policy = PolicyConfig::from_name(&cfg.policy).ok_or_else(|| Error::invalid(format!("unknown policy {:?}", cfg.policy)))?;
    if cfg.clients == 0 || cfg.inflight == 0 || cfg.request_bytes == 0 || cfg.file_bytes < u64::from(cfg.clients) {
        return Err(Error::invalid("need clients >= 1, inflight >= 1, request bytes >= 1 and a file of at least one byte per client"));
    }
    let mut runs: Vec<ScaleoutRun> = Vec::new();
    for &servers in &cfg.servers {
        let root = scratch.join(format!("scaleout-{servers}"));
        let _ = std::fs::remove_dir_all(&root);
        let mut lc = LocalClusterConfig::new(&root, servers);
        lc.device = device;
        lc.policy = policy.clone();
        let cluster = LocalCluster::start(lc)?;
        let seconds = one_run(cfg, &cluster);
        drop(cluster);
        let _ = std::fs::remove_dir_all(&root);
        let seconds = seconds?;
        let mib_per_s = cfg.file_bytes as f64 / (1 << 20) as f64 / seconds;
        let speedup = runs.first().map_or(1.0, |first| mib_per_s / first.mib_per_s);
        runs.push(ScaleoutRun { servers, seconds, mib_per_s, speedup });
    }
    Ok(ScaleoutReport { config: cfg.clone(), runs })
}

fn one_run(cfg: &ScaleoutConfig, cluster: &LocalCluster) -> Result<f64> {
    let w = StripedClient::connect(&cluster.addr())?;
    let f = w.create("big.dat", LayoutRequest { stripe_bytes: cfg.stripe_bytes, count: -1, start: 0 })?;
    let chunk = 16u64 << 20; // a multiple of 4 KiB: blocks stay aligned
    let mut buf = vec![0u8; chunk as usize];
    for at in (0..cfg.file_bytes).step_by(chunk as usize) {
        let n = chunk.min(cfg.file_bytes - at);
        for (i, block) in buf[..n as usize].chunks_mut(4096).enumerate() {
            block.fill(byte_at(at + (i as u64) * 4096));
        }
        w.pwrite(&f, &buf[..n as usize], at)?;
    }
    w.fsync(&f)?;
    w.close(&f)?;
    let share = cfg.file_bytes / u64::from(cfg.clients);
    let t = Instant::now();
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..u64::from(cfg.clients))
            .map(|k| {
                let addr = cluster.addr();
                s.spawn(move || -> Result<()> {
                    let c = StripedClient::connect_with(&addr, ConnectOptions { app: Some(format!("reader-{k}")), ..ConnectOptions::default() })?;
                    let f = c.open("big.dat", libc::O_RDONLY)?;
                    let start = k * share;
                    let end = if k + 1 == u64::from(cfg.clients) { cfg.file_bytes } else { start + share };
                    let lanes: Vec<Result<()>> = std::thread::scope(|s| {
                        let (c, f) = (&c, &f);
                        let lanes: Vec<_> =
                            (0..u64::from(cfg.inflight)).map(|lane| s.spawn(move || read_lane(c, f, start, end, cfg.request_bytes, lane, u64::from(cfg.inflight)))).collect();
                        lanes.into_iter().map(|t| t.join().expect("lane thread panicked")).collect()
                    });
                    lanes.into_iter().collect::<Result<Vec<()>>>()?;
                    c.close(&f)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().expect("reader thread panicked")).collect()
    });
    let seconds = t.elapsed().as_secs_f64();
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(seconds)
}

/// Read requests `lane`, `lane + lanes`, … of `[start, end)` and check them.
fn read_lane(c: &StripedClient, f: &StripedFile, start: u64, end: u64, request: u64, lane: u64, lanes: u64) -> Result<()> {
    let mut buf = vec![0u8; request as usize];
    let mut at = start + lane * request;
    while at < end {
        let n = buf.len().min((end - at) as usize);
        c.read_list(f, &[(at, n as u64)], &mut buf[..n])?;
        if let Some(wrong) = first_wrong(&buf[..n], at) {
            return Err(Error::invalid(format!("wrong byte at offset {wrong}")));
        }
        at += lanes * request;
    }
    Ok(())
}

/// The table for people.
pub fn table(r: &ScaleoutReport) -> String {
    let c = &r.config;
    let mut out = format!(
        "scale-out: {} MiB file, {} clients, {} KiB requests ({} in flight per client), {} KiB stripes over every server, device {}, policy {}\n",
        c.file_bytes >> 20,
        c.clients,
        c.request_bytes >> 10,
        c.inflight,
        c.stripe_bytes >> 10,
        c.device,
        c.policy
    );
    out.push_str("servers  seconds    MiB/s  speed-up\n");
    for run in &r.runs {
        out.push_str(&format!("{:>7}  {:>7.2}  {:>7.1}  {:>7.2}x\n", run.servers, run.seconds, run.mib_per_s, run.speedup));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_finds_the_first_wrong_byte_across_blocks() {
        let at = 4096 * 3 - 10;
        let mut buf: Vec<u8> = (0..9000u64).map(|i| byte_at(at + i)).collect();
        assert_eq!(first_wrong(&buf, at), None);
        buf[5000] ^= 1;
        assert_eq!(first_wrong(&buf, at), Some(at + 5000));
        assert_eq!(first_wrong(&buf[..5000], at), None);
    }
}
