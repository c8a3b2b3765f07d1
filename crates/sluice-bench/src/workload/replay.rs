//! Recorded accesses replayed by real processes (`sluice bench custom
//! --darshan LOG`): one worker per rank of a Darshan log, each issuing its
//! rank's accesses in recorded order, on the recorded files (renamed into
//! the scratch directory), waiting its recorded think time before each
//! one (from the end of its previous access to the start of this one).
//!
//! The log's DXT records come as the JSON `scripts/darshan-dxt.py` prints;
//! the runner writes a [`ReplayLog`] next to the files and each worker
//! reads its rank's part from it (a log is too large for the environment
//! variable that carries a worker's spec).
//!
//! Bounds: at most `ACCESSES_MAX` accesses, `FILES_MAX` files and
//! `RANKS_MAX` ranks; an access of at most `ACCESS_BYTES_MAX`, ending at
//! most `FILE_BYTES_MAX` into its file (the files are created sparse at
//! their size, not filled); a think time of at most `THINK_NS_MAX` (longer
//! gaps, a program's compute phases, are cut to it and counted). Under
//! `--direct` an access that is not block-aligned fails with EINVAL, as it
//! would for the program.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::WorkloadError;

/// Accesses a replayed log may hold.
pub const ACCESSES_MAX: usize = 1_000_000;
/// Files it may touch.
pub const FILES_MAX: usize = 4_096;
/// Ranks (worker processes) it may have.
pub const RANKS_MAX: usize = 1_024;
/// Bytes of one access (the largest the service takes in one request).
pub const ACCESS_BYTES_MAX: u64 = 64 << 20;
/// A think time longer than this (1 s) is cut to it.
pub const THINK_NS_MAX: u64 = 1_000_000_000;
/// Furthest byte an access may reach (1 TiB): the files are made sparse to
/// that size before the run, so they take no space beyond what is written.
pub const FILE_BYTES_MAX: u64 = 1 << 40;

/// One access of one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Access {
    /// Index into `ReplayLog::files`.
    pub file: u32,
    pub write: bool,
    pub offset: u64,
    pub len: u64,
    /// Wait this long before issuing it.
    pub think_ns: u64,
}

/// A log made ready for replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReplayLog {
    /// The application: the log's executable, without its path.
    pub app: String,
    /// Scratch file names and the size each must have before the run
    /// (the furthest byte any access reaches).
    pub files: Vec<(String, u64)>,
    pub ranks: Vec<Vec<Access>>,
    /// Think times that were cut to `THINK_NS_MAX`.
    pub thinks_cut: u64,
}

#[derive(Deserialize)]
struct Dxt {
    exe: String,
    files: Vec<String>,
    segments: Vec<(u32, u64, String, u64, u64, f64, f64)>,
}

impl ReplayLog {
    /// From the JSON of `scripts/darshan-dxt.py`.
    pub fn from_dxt_json(json: &str) -> Result<ReplayLog, WorkloadError> {
        let d: Dxt = serde_json::from_str(json).map_err(|e| WorkloadError::usage(format!("not the DXT JSON of scripts/darshan-dxt.py: {e}")))?;
        if d.segments.is_empty() {
            return Err(WorkloadError::usage("the log's DXT records hold no access".into()));
        }
        if d.segments.len() > ACCESSES_MAX || d.files.len() > FILES_MAX {
            return Err(WorkloadError::usage(format!("the log has {} accesses on {} files (at most {ACCESSES_MAX} on {FILES_MAX})", d.segments.len(), d.files.len())));
        }
        let ranks = d.segments.iter().map(|s| s.0 as usize + 1).max().unwrap_or(0);
        if ranks > RANKS_MAX {
            return Err(WorkloadError::usage(format!("the log has {ranks} ranks (at most {RANKS_MAX})")));
        }
        let mut sizes = vec![0u64; d.files.len()];
        let mut per_rank: Vec<Vec<(f64, f64, Access)>> = vec![Vec::new(); ranks];
        for (rank, file, op, offset, len, start, end) in d.segments {
            let f = usize::try_from(file).ok().filter(|&f| f < sizes.len()).ok_or_else(|| WorkloadError::usage(format!("an access names file {file} of {}", sizes.len())))?;
            if len > ACCESS_BYTES_MAX {
                return Err(WorkloadError::usage(format!("an access of {len} bytes (at most {ACCESS_BYTES_MAX})")));
            }
            let reach = offset
                .checked_add(len)
                .filter(|&e| e <= FILE_BYTES_MAX)
                .ok_or_else(|| WorkloadError::usage(format!("an access reaches past {FILE_BYTES_MAX} bytes (offset {offset}, length {len})")))?;
            sizes[f] = sizes[f].max(reach);
            per_rank[rank as usize].push((start, end, Access { file: f as u32, write: op == "w", offset, len, think_ns: 0 }));
        }
        let mut thinks_cut = 0;
        let ranks = per_rank
            .into_iter()
            .map(|mut v| {
                v.sort_by(|a, b| a.0.total_cmp(&b.0));
                let mut prev_end: Option<f64> = None;
                v.into_iter()
                    .map(|(start, end, mut a)| {
                        let gap = prev_end.map_or(0.0, |p| (start - p).max(0.0));
                        let ns = (gap * 1e9) as u64;
                        thinks_cut += u64::from(ns > THINK_NS_MAX);
                        a.think_ns = ns.min(THINK_NS_MAX);
                        prev_end = Some(prev_end.map_or(end, |p| p.max(end)));
                        a
                    })
                    .collect()
            })
            .collect();
        let app = d.exe.split_whitespace().next().unwrap_or("").rsplit('/').next().unwrap_or("").to_string();
        let files = sizes.into_iter().enumerate().map(|(k, s)| (format!("darshan.{k}.dat"), s)).collect();
        Ok(ReplayLog { app: if app.is_empty() { "darshan".into() } else { app }, files, ranks, thinks_cut })
    }

    pub fn save(&self, path: &Path) -> Result<(), WorkloadError> {
        std::fs::write(path, serde_json::to_string(self).expect("plain struct serialises")).map_err(|e| WorkloadError::io(format!("write {}", path.display()), e))
    }

    pub fn load(path: &Path) -> Result<ReplayLog, WorkloadError> {
        let text = std::fs::read_to_string(path).map_err(|e| WorkloadError::io(format!("read {}", path.display()), e))?;
        serde_json::from_str(&text).map_err(|e| WorkloadError::usage(format!("{}: {e}", path.display())))
    }

    /// The application that replays this log: one process per rank, on
    /// one shared set of scratch files. Its `replay` is left for the
    /// caller to point at where `save` put the log.
    pub fn app_spec(&self) -> crate::workload::pattern::AppSpec {
        use crate::workload::pattern::{AppSpec, Dir, Pattern};
        AppSpec {
            name: self.app.clone(),
            procs: self.ranks.len() as u32,
            op: Dir::Read,
            pattern: Pattern::Contiguous,
            size: self.bytes(),
            granularity: self.access_bytes_max(),
            shared_file: true,
            weight: 1,
            replay: None,
            uid: None,
        }
    }

    /// Bytes all ranks move.
    pub fn bytes(&self) -> u64 {
        self.ranks.iter().flatten().map(|a| a.len).sum()
    }

    /// The largest access (the worker's buffer).
    pub fn access_bytes_max(&self) -> u64 {
        self.ranks.iter().flatten().map(|a| a.len).max().unwrap_or(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_keep_their_order_and_think_times() {
        let json = r#"{"exe":"/opt/ior -a POSIX","files":["/a","/b"],"segments":[
            [1,0,"w",4096,4096,0.001,0.002],[0,0,"w",0,4096,0.001,0.003],[0,1,"r",0,100,0.0035,0.004],[0,0,"w",8192,4096,5.0,5.1]]}"#;
        let log = ReplayLog::from_dxt_json(json).unwrap();
        assert_eq!(log.app, "ior");
        assert_eq!(log.files, [("darshan.0.dat".to_string(), 12_288), ("darshan.1.dat".to_string(), 100)], "each file as large as its furthest access");
        assert_eq!(log.ranks.len(), 2);
        let r0: Vec<(u32, bool, u64, u64)> = log.ranks[0].iter().map(|a| (a.file, a.write, a.offset, a.think_ns)).collect();
        assert_eq!(r0, [(0, true, 0, 0), (1, false, 0, 500_000), (0, true, 8192, THINK_NS_MAX)]);
        assert_eq!(log.thinks_cut, 1, "the 4.996 s gap is cut to 1 s and counted");
        assert_eq!(log.bytes(), 4096 * 3 + 100);
        assert!(ReplayLog::from_dxt_json(r#"{"exe":"x","files":[],"segments":[]}"#).is_err());
        assert!(ReplayLog::from_dxt_json(r#"{"exe":"x","files":[],"segments":[[0,3,"r",0,1,0.0,0.1]]}"#).is_err(), "a file index out of range");
        let at = |end: u64| format!(r#"{{"exe":"x","files":["/a"],"segments":[[0,0,"r",{},1,0.0,0.1]]}}"#, end - 1);
        assert!(ReplayLog::from_dxt_json(&at(FILE_BYTES_MAX)).is_ok(), "an access ending at the bound");
        assert!(ReplayLog::from_dxt_json(&at(FILE_BYTES_MAX + 1)).is_err(), "one byte past it");
        assert!(ReplayLog::from_dxt_json(r#"{"exe":"x","files":["/a"],"segments":[[0,0,"r",18446744073709551615,2,0.0,0.1]]}"#).is_err(), "offset + length overflows");
    }
}
