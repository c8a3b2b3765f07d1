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
pub mod matrix;
pub mod scheduler;
pub mod workload;

/// Parse a size such as `4096`, `4K`, `128KiB`, `1M`, `2MiB`, `1G`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("bad size unit in {s:?} (use K, M or G)")),
    };
    n.checked_mul(mult).filter(|&v| v > 0).ok_or_else(|| format!("size {s:?} out of range"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_parse() {
        assert_eq!(super::parse_size("4K"), Ok(4096));
        assert_eq!(super::parse_size("128KiB"), Ok(128 << 10));
        assert_eq!(super::parse_size("2M"), Ok(2 << 20));
        assert_eq!(super::parse_size("4096"), Ok(4096));
        assert!(super::parse_size("0").is_err());
        assert!(super::parse_size("4Q").is_err());
        assert!(super::parse_size("").is_err());
    }
}
