//! The device model file: the four numbers the scheduler weighs (a
//! [`sluice_core::DeviceCost`]) and the measurements they came from, as
//! TOML. `sluice calibrate` writes it; `sluice serve --device-model` and
//! `sluice sim --device-model` load it.
//!
//! ```
//! use sluice_device::model_file::ModelFile;
//! let m = ModelFile::from_toml("dispatch_ns = 50000\nbyte_ps = 1000\nseek_ns = 0\nparallelism = 8\n").unwrap();
//! assert_eq!(m.cost().parallelism, 8);
//! assert_eq!(m.bytes_per_s(), 1_000_000_000);
//! ```
//!
//! Invariant: a loaded file's parallelism is in 1..=`sluice_core::cost::DEPTH_MAX`;
//! unknown fields are refused.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sluice_core::DeviceCost;

use crate::{Error, ErrorKind};

/// One latency cell: the mean time of `ops` reads of `bytes`, sequential
/// or random, one at a time.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LatencyCell {
    pub bytes: u64,
    pub random: bool,
    pub mean_ns: u64,
    pub ops: u64,
    /// CPU time of the reading thread per read (user and system), where
    /// measured: what the kernel's path of one read costs a core.
    #[serde(default)]
    pub cpu_ns: u64,
}

/// One throughput cell: random 4 KiB reads at a queue depth.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DepthCell {
    pub depth: u32,
    pub ops_per_s: f64,
}

/// One throughput cell of larger reads.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SizeDepthCell {
    pub bytes: u64,
    pub depth: u32,
    pub ops_per_s: f64,
}

/// The model file: the four numbers the scheduler weighs, and the
/// measurements they came from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    pub dispatch_ns: u64,
    pub byte_ps: u64,
    pub seek_ns: u64,
    pub parallelism: u32,
    #[serde(default)]
    pub measured: Option<Measured>,
}

/// Where a model file came from.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Measured {
    pub root: String,
    pub direct: bool,
    pub latency: Vec<LatencyCell>,
    pub depth: Vec<DepthCell>,
    /// Random reads of larger sizes at the server's default queue depth
    /// (absent from files written before them).
    #[serde(default)]
    pub at_depth: Vec<SizeDepthCell>,
    /// Random reads one at a time through io_uring, the completion awaited
    /// by spinning on the ring, as `sluice serve`'s loop awaits a short
    /// one: the latency its dispatches see, without a thread's wake-up
    /// (with O_DIRECT only; absent from files written before them).
    #[serde(default)]
    pub ring: Vec<LatencyCell>,
}

impl ModelFile {
    /// The cost model the scheduler weighs.
    pub fn cost(&self) -> DeviceCost {
        DeviceCost::new(self.dispatch_ns, self.byte_ps, self.seek_ns, self.parallelism)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a model file serialises")
    }

    pub fn from_toml(text: &str) -> Result<ModelFile, Error> {
        let m: ModelFile = toml::from_str(text).map_err(|e| Error::new(ErrorKind::Parse, format!("device model: {e}")))?;
        if m.parallelism == 0 || m.parallelism > sluice_core::cost::DEPTH_MAX {
            return Err(Error::new(ErrorKind::Invalid, format!("device model: parallelism {} outside 1..={}", m.parallelism, sluice_core::cost::DEPTH_MAX)));
        }
        Ok(m)
    }

    /// The transfer rate, bytes per second (a model without a byte cost:
    /// practically unbounded).
    pub fn bytes_per_s(&self) -> u64 {
        1_000_000_000_000u64.checked_div(self.byte_ps).unwrap_or(u64::MAX / 2)
    }

    /// How many times the 4 KiB throughput grew from one in flight to
    /// `depth` (`depth` itself where nothing was measured: a device that
    /// scales perfectly), at least 1.
    pub fn gain_at(&self, depth: u32) -> f64 {
        let p = f64::from(depth.max(1));
        let Some(cells) = self.measured.as_ref().map(|x| &x.depth) else { return p };
        let one = cells.iter().find(|c| c.depth == 1).map_or(0.0, |c| c.ops_per_s);
        let at = cells.iter().filter(|c| c.depth <= depth).map(|c| c.ops_per_s).fold(0.0, f64::max);
        if one > 0.0 && at > 0.0 {
            (at / one).clamp(1.0, p)
        } else {
            p
        }
    }

    /// Read a model file written by `sluice calibrate`.
    pub fn load(path: &Path) -> Result<ModelFile, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::new(ErrorKind::Read, format!("reading {}: {e}", path.display())))?;
        ModelFile::from_toml(&text).map_err(|e| Error::new(e.kind, format!("{}: {e}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_files_round_trip_and_refuse_nonsense() {
        let m = ModelFile { dispatch_ns: 1, byte_ps: 2, seek_ns: 3, parallelism: 4, measured: None };
        assert_eq!(ModelFile::from_toml(&m.to_toml()), Ok(m));
        let zero = ModelFile::from_toml("dispatch_ns = 1\nbyte_ps = 1\nseek_ns = 1\nparallelism = 0\n").unwrap_err();
        assert_eq!(zero.kind, ErrorKind::Invalid);
        assert_eq!(ModelFile::from_toml("dispatch_ns = 1\n").unwrap_err().kind, ErrorKind::Parse);
        assert!(ModelFile::from_toml("dispatch_ns = 1\nbyte_ps = 1\nseek_ns = 1\nparallelism = 1\nspeed = 3\n").is_err());
        let old = "dispatch_ns = 1\nbyte_ps = 1\nseek_ns = 1\nparallelism = 4\n[measured]\nroot = \"/\"\ndirect = true\nlatency = []\ndepth = []\n";
        assert_eq!(ModelFile::from_toml(old).unwrap().measured.unwrap().at_depth, Vec::new());
        let missing = ModelFile::load(Path::new("/nonexistent/model.toml")).unwrap_err();
        assert_eq!(missing.kind, ErrorKind::Read);
        assert!(missing.to_string().starts_with("reading /nonexistent/model.toml: "), "{missing}");
    }

    #[test]
    fn the_gain_is_the_measured_growth_up_to_the_depth() {
        let cell = |depth, ops_per_s| DepthCell { depth, ops_per_s };
        let depth = vec![cell(1, 10_000.0), cell(2, 18_000.0), cell(4, 25_000.0), cell(8, 40_000.0)];
        let measured = Measured { root: "/".into(), direct: true, latency: Vec::new(), depth, at_depth: Vec::new(), ring: Vec::new() };
        let m = ModelFile { dispatch_ns: 1, byte_ps: 0, seek_ns: 0, parallelism: 8, measured: Some(measured) };
        assert_eq!(m.gain_at(4), 2.5);
        assert_eq!(m.gain_at(1), 1.0);
        assert_eq!(ModelFile { measured: None, ..m.clone() }.gain_at(6), 6.0);
        assert_eq!(m.bytes_per_s(), u64::MAX / 2);
    }
}
