//! # sluice-bench: the workloads behind `sluice bench`
//!
//! Each benchmark returns a report value that the binary prints as a table
//! and, with `--json PATH`, writes as JSON whose shape is documented in
//! `docs/bench.md`.
//!
//! ```
//! let report = sluice_bench::scheduler::run(&sluice_bench::scheduler::Config { requests: 2_000, ..Default::default() });
//! assert_eq!(report.policies.len(), sluice_core::POLICY_NAMES.len());
//! ```

pub mod calibrate;

/// The median of `v` (the mean of the middle two for an even count); NaN
/// when empty.
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

pub mod connections;
pub mod forwarders;
pub mod host;
pub mod matrix;
pub mod meta;
pub mod predict;
pub mod qos;
pub mod scaleout;
pub mod scheduler;
pub mod scratch;
pub mod service;
pub mod validate;
pub mod workload;
