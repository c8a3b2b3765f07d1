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
use sluice_server::DeviceKind;

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
}

impl HostProfile {
    pub fn host(&self) -> Host {
        Host { cores: self.cores, server_ns: self.server_ns, client_ns: self.client_ns }
    }

    pub fn to_toml(&self) -> String {
        format!(
            "# sluice calibrate --host: what answering one request costs this machine's cores\ncores = {}\nserver_ns = {}\nclient_ns = {}\nruns_ns = {:?}\nwake_ns = {}\n",
            self.cores, self.server_ns, self.client_ns, self.runs_ns, self.wake_ns
        )
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
/// decomposition under fifo, in a scratch directory under `scratch`.
pub fn calibrate(exe: &Path, scratch: &Path, progress: bool) -> Result<HostProfile, String> {
    let sc = scenario::decomposition(HOST_PROCS, PIECE, Dir::Read, HOST_SCALE);
    let requests: u64 = sc.apps.iter().map(|a| a.size / PIECE).sum();
    let root = scratch.join(format!("sluice-host-{}", std::process::id()));
    // The null device, no write leases: every request is the server's.
    let cfg = RunConfig { write_leases: false, ..RunConfig::started(sc, vec!["fifo".into()], DeviceKind::Null, root.clone(), exe.to_path_buf()) };
    // First, while this process has one thread: the wake floor forks.
    let wake_ns = crate::service::wake_floor().map_err(|e| e.to_string())?.map_or(0, |us| (us * 1e3).round() as u64);
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
    Ok(HostProfile { cores, server_ns: loop_ns.max(wake_ns), client_ns, runs_ns, wake_ns })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_reads_back_what_it_wrote() {
        let p = HostProfile { cores: 2, server_ns: 5_200, client_ns: 7_600, runs_ns: vec![[5_000, 7_000], [5_200, 7_600], [6_000, 8_000]], wake_ns: 7_500 };
        assert_eq!(HostProfile::parse(&p.to_toml()).unwrap(), p);
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
