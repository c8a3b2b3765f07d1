//! The host profile: what answering one request costs this machine's
//! cores, measured once (`sluice calibrate --host`) for the replays of
//! `sluice what-if`.
//!
//! A recorded run's think times hold the host's queueing: when one
//! aggregate answers 32 processes on a 2-core machine, the last of them
//! sends its next request 16 answers later, not at once. A replay under
//! another policy answers in other batches, so it must take that queueing
//! out of the recording and put its own back (`sluice_core::replay::Host`).
//! The cost of an answer is measured with nothing else in the way: 32
//! processes read a shared file in 4 KiB pieces from a server on the null
//! device (no disk, every request completes at once), under fifo, so that
//! the machine does nothing but answer, wake and issue. The CPU of the
//! server's loop thread over the requests answered is the loop's share of
//! an answer, and the rest of the CPU the whole machine spent (every
//! process, and what the hypervisor took) the process's share
//! (`client_ns`); the run with the median total of `HOST_RUNS` runs. There
//! the processes rarely sleep (32 of them keep 2 cores busy), but a
//! process answered after a disk's rotation does, and waking it costs
//! the loop a futex wake-up: `server_ns` is at least the wake floor, a
//! sleeping process's wake-up timed alone (`sluice bench service`'s
//! `wake_us`). A live trace of 32 strided readers on the emulated disk
//! under aioli shows what this models: every aggregate's 32 processes
//! sent their next requests 243-266 µs after it completed, about 7.6 µs
//! of the loop an answer, against a loop CPU of 4.0-4.4 µs a request in
//! the null run and a wake floor of 7-10 µs.
//!
//! Bounds: `HOST_PROFILE_BYTES_MAX` for a profile file read back.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sluice_core::replay::{Host, HOST_CORES_MAX};
use sluice_device::ModelFile;
use sluice_server::DeviceKind;
use sluice_sim::whatif::{Device, Disk, Options};

use crate::workload::pattern::Dir;
use crate::workload::runner::{self, RunConfig};
use crate::workload::scenario;

/// Processes of the calibration run.
pub const HOST_PROCS: u32 = 32;
/// Runs; the profile takes their median.
pub const HOST_RUNS: usize = 3;
/// Bytes of a profile file read back.
pub const HOST_PROFILE_BYTES_MAX: u64 = 64 << 10;
/// The calibration's shared file: 64 MiB, 16,384 requests of 4 KiB.
const HOST_SCALE: f64 = 1.0 / 64.0;
const PIECE: u64 = 4 << 10;
/// The disk calibration's scratch file (`sluice calibrate`'s default).
const DISK_FILE_BYTES: u64 = 256 << 20;

/// A machine's host profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostProfile {
    /// Cores the processes and the server share.
    pub cores: u32,
    /// Nanoseconds of the server's loop an answer costs.
    pub server_ns: u64,
    /// Nanoseconds of one core the answered process then costs.
    pub client_ns: u64,
    /// What each run measured (`[loop ns, client_ns]`), for the record.
    #[serde(default)]
    pub runs_ns: Vec<[u64; 2]>,
    /// The wake floor measured (ns), for the record.
    #[serde(default)]
    pub wake_ns: u64,
    /// The disk under the calibration's directory, measured with O_DIRECT
    /// (`sluice calibrate --direct`): what-if serves the traces of a
    /// server on this machine's real device with O_DIRECT on it. None
    /// where it could not be measured (O_DIRECT refused, as on tmpfs).
    #[serde(default)]
    pub disk: Option<ModelFile>,
}

impl HostProfile {
    pub fn host(&self) -> Host {
        Host { cores: self.cores, server_ns: self.server_ns, client_ns: self.client_ns, dispatch_ns: 0 }
    }

    /// The disk as what-if serves it (`calibrate::sim_device`).
    pub fn disk(&self) -> Option<Disk> {
        self.disk.as_ref().map(|m| {
            let (mut figures, channels) = crate::calibrate::sim_device(m);
            // A server's loop spins for a short dispatch: it sees the
            // latency of the ring cells, without a thread's wake-up (the
            // cells read at random, so no seek is added).
            if let Some((ns, bytes_per_s)) = m.measured.as_ref().and_then(crate::calibrate::ring_fit) {
                (figures.access_ns, figures.bytes_per_s, figures.seek_ns) = (ns, bytes_per_s, 0);
            }
            // The kernel's whole path of one 4 KiB random read on the
            // reader's core (submission, completion, the reader's sleep and
            // wake-up). The ring's submission alone (its cells' `cpu_ns`)
            // is less: 13.6 against 22.1 us on the 2-core VM, and with it
            // fifo's 4 KiB predictions there fell 22-27% short of the real
            // runs (docs/results.md, 2026-12-07).
            let dispatch_cpu_ns = m.measured.as_ref().and_then(|x| x.latency.iter().find(|c| c.random && c.bytes == 4096)).map_or(0, |c| c.cpu_ns);
            Disk { figures, channels, dispatch_cpu_ns }
        })
    }

    /// What-if's options for traces this machine recorded: its host, its
    /// disk, the device `Auto`.
    pub fn whatif_options(&self) -> Options {
        Options { device: Device::Auto, host: Some(self.host()), disk: self.disk() }
    }

    pub fn to_toml(&self) -> String {
        let body = toml::to_string(self).expect("a host profile serialises");
        format!("# sluice calibrate --host: what answering one request costs this machine's cores, and its disk\n{body}")
    }

    /// Read a profile back, refusing what no calibration could write.
    pub fn parse(text: &str) -> Result<HostProfile, String> {
        let p: HostProfile = toml::from_str(text).map_err(|e| format!("not a host profile: {e}"))?;
        if !(1..=HOST_CORES_MAX).contains(&p.cores) {
            return Err(format!("host profile: cores {} outside 1..={HOST_CORES_MAX}", p.cores));
        }
        if p.server_ns.max(p.client_ns) > 1_000_000_000 {
            return Err(format!("host profile: an answer of {} + {} ns is over a second", p.server_ns, p.client_ns));
        }
        Ok(p)
    }

    pub fn load(path: &Path) -> Result<HostProfile, String> {
        let len = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.len();
        if len > HOST_PROFILE_BYTES_MAX {
            return Err(format!("{}: {len} bytes; a host profile is at most {HOST_PROFILE_BYTES_MAX}", path.display()));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        HostProfile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// Where `sluice calibrate --host` keeps this machine's profile by
/// default: `$XDG_CACHE_HOME/sluice/host.toml`, else
/// `$HOME/.cache/sluice/host.toml`.
pub fn default_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()).map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("sluice").join("host.toml"))
}

/// This machine's profile where `sluice calibrate --host` keeps it by
/// default (`default_path`), if it was measured.
pub fn load_default() -> Result<Option<HostProfile>, String> {
    match default_path().filter(|p| p.exists()) {
        Some(p) => HostProfile::load(&p).map(Some),
        None => Ok(None),
    }
}

/// Measure this machine: `HOST_RUNS` runs of the null-device
/// decomposition under fifo, in a scratch directory under `scratch`, and
/// the disk under `disk_root` with O_DIRECT, `cell_ms` a cell
/// (`sluice calibrate --direct`; None where O_DIRECT is refused there).
pub fn calibrate(exe: &Path, scratch: &Path, disk_root: &Path, cell_ms: u64, progress: bool) -> Result<HostProfile, String> {
    let sc = scenario::decomposition(HOST_PROCS, PIECE, Dir::Read, HOST_SCALE);
    let requests: u64 = sc.apps.iter().map(|a| a.size / PIECE).sum();
    let root = scratch.join(format!("sluice-host-{}", std::process::id()));
    // The null device, no write leases: every request is the server's.
    let cfg = RunConfig { write_leases: false, ..RunConfig::started(sc, vec!["fifo".into()], DeviceKind::Null, root.clone(), exe.to_path_buf()) };
    // First, while this process has one thread: the wake floor forks.
    let wake_ns = crate::service::wake_floor().map_err(|e| e.to_string())?.map_or(0, |us| (us * 1e3).round() as u64);
    // Then the runs' directory, removed after each run and however the
    // calibration ends (a Ctrl-C included; its guard starts a thread).
    let _root = crate::scratch::Scratch::new(&root);
    let mut runs_ns = Vec::new();
    for i in 0..HOST_RUNS {
        if progress {
            eprintln!("calibrate --host: run {} of {HOST_RUNS} ({HOST_PROCS} processes, {requests} requests of 4 KiB, null device)", i + 1);
        }
        let r = runner::run(&cfg).map_err(|e| e.to_string());
        let _ = std::fs::remove_dir_all(&root);
        let cpu = r?.runs.first().and_then(|run| run.cpu).ok_or("the calibration run measured no CPU time")?;
        let server_s = cpu.server_loop_cpu_s.or(cpu.server_cpu_s).ok_or("the calibration run did not measure its server")?;
        let per = |s: f64| (s * 1e9 / requests as f64).round() as u64;
        runs_ns.push([per(server_s), per((cpu.cpu_s - server_s).max(0.0))]);
    }
    let mut sorted = runs_ns.clone();
    sorted.sort_unstable_by_key(|[s, c]| s + c);
    let [loop_ns, client_ns] = sorted[sorted.len() / 2];
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()).min(HOST_CORES_MAX as usize) as u32;
    if progress {
        eprintln!("calibrate --host: the disk under {} with O_DIRECT ({cell_ms} ms a cell)", disk_root.display());
    }
    let cfg = crate::calibrate::CalibrateConfig { root: disk_root.to_path_buf(), direct: true, file_bytes: DISK_FILE_BYTES, cell_ms };
    let disk = match crate::calibrate::run(&cfg) {
        Ok(m) => Some(m),
        Err(e) if progress => {
            eprintln!("calibrate --host: no disk in the profile ({e})");
            None
        }
        Err(_) => None,
    };
    Ok(HostProfile { cores, server_ns: loop_ns.max(wake_ns), client_ns, runs_ns, wake_ns, disk })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_device::model_file::{DepthCell, LatencyCell, Measured};

    #[test]
    fn a_profile_reads_back_what_it_wrote() {
        let p = HostProfile { cores: 2, server_ns: 5_200, client_ns: 7_600, runs_ns: vec![[5_000, 7_000], [5_200, 7_600], [6_000, 8_000]], wake_ns: 7_500, disk: None };
        assert_eq!(HostProfile::parse(&p.to_toml()).unwrap(), p);
    }

    #[test]
    fn a_profile_keeps_its_disk_and_what_if_serves_the_ring_cells_latency() {
        let cell = |bytes: u64, mean_ns: u64, cpu_ns: u64| LatencyCell { bytes, random: true, mean_ns, ops: 100, cpu_ns };
        let measured = Measured {
            root: "/var/tmp".into(),
            direct: true,
            latency: vec![cell(4096, 50_000, 22_000)],
            depth: vec![DepthCell { depth: 1, ops_per_s: 20_000.0 }, DepthCell { depth: 8, ops_per_s: 80_000.0 }],
            at_depth: Vec::new(),
            // 30 us + 1 ns a byte through the ring.
            ring: vec![cell(4096, 34_096, 13_000), cell(1 << 20, 30_000 + (1 << 20), 40_000)],
        };
        let m = ModelFile { dispatch_ns: 45_000, byte_ps: 500, seek_ns: 0, parallelism: 8, measured: Some(measured) };
        let p = HostProfile { cores: 2, server_ns: 7_000, client_ns: 6_000, runs_ns: Vec::new(), wake_ns: 7_000, disk: Some(m) };
        let back = HostProfile::parse(&p.to_toml()).unwrap();
        assert_eq!(back, p);
        let d = back.disk().unwrap();
        assert_eq!((d.figures.access_ns, d.figures.bytes_per_s, d.figures.seek_ns), (30_000, 1_000_000_000, 0));
        assert_eq!(d.dispatch_cpu_ns, 22_000, "the 4 KiB random read's CPU");
        let o = back.whatif_options();
        assert_eq!((o.device, o.host.map(|h| h.cores), o.disk), (Device::Auto, Some(2), Some(d)));
        // A profile from before disks were kept reads back without one.
        assert_eq!(HostProfile::parse("cores = 2\nserver_ns = 1000\nclient_ns = 1000\n").unwrap().disk(), None);
    }

    #[test]
    fn cores_are_bounded_at_n_and_refused_at_n_plus_one() {
        let at = |cores: u32| HostProfile::parse(&format!("cores = {cores}\nserver_ns = 1000\nclient_ns = 1000\n"));
        assert!(at(HOST_CORES_MAX).is_ok());
        assert!(at(HOST_CORES_MAX + 1).unwrap_err().contains("outside"));
        assert!(at(0).is_err());
        assert!(HostProfile::parse("cores = 2\n").unwrap_err().contains("not a host profile"));
    }

    #[test]
    fn a_profile_file_over_its_bound_is_refused() {
        let dir = std::env::temp_dir().join(format!("sluice-host-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (at, over) = (dir.join("at.toml"), dir.join("over.toml"));
        let body = "cores = 2\nserver_ns = 1000\nclient_ns = 2000\n";
        let pad = |n: usize| format!("{body}{}", "#".repeat(n - body.len()));
        std::fs::write(&at, pad(HOST_PROFILE_BYTES_MAX as usize)).unwrap();
        std::fs::write(&over, pad(HOST_PROFILE_BYTES_MAX as usize + 1)).unwrap();
        let (a, o) = (HostProfile::load(&at), HostProfile::load(&over));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(a.unwrap().client_ns, 2000);
        assert!(o.unwrap_err().contains("at most"));
    }
}
