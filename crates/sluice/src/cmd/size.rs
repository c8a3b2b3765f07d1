//! The one size grammar of every `sluice` option that takes bytes:
//! a whole number with an optional unit, case-insensitive: none or `B`
//! (bytes), `K`/`KB`/`KiB` (1024), `M`/`MB`/`MiB` (1024^2), `G`/`GB`/`GiB`
//! (1024^3), `T`/`TB`/`TiB` (1024^4). Units are binary, as `lfs setstripe`
//! and `dd` read them.

/// What `--help` says of a size option.
pub const SIZE_HELP: &str = "bytes, or with a unit K, M, G, T (KiB, MiB... also accepted; binary)";

/// Parse a size in the grammar above (0 is a size; callers that need more
/// say so).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}: {SIZE_HELP}"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("bad size unit in {s:?}: {SIZE_HELP}")),
    };
    n.checked_mul(1u64 << shift).ok_or_else(|| format!("size {s:?} is too large"))
}

/// `parse_size`, refusing 0.
pub fn parse_size_positive(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err(format!("size {s:?} must be above 0")),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_grammar() {
        for (s, v) in
            [("512", 512), ("0", 0), ("4K", 4096), ("64k", 65536), ("128KiB", 128 << 10), ("1m", 1 << 20), ("2MB", 2 << 20), ("4G", 4 << 30), ("1TiB", 1 << 40), (" 8b ", 8)]
        {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
        for s in ["", "x", "4Q", "-1", "1.5M", "K", "99999999999G"] {
            assert!(parse_size(s).is_err(), "{s:?} is refused");
        }
        assert!(parse_size_positive("0").is_err() && parse_size_positive("1K") == Ok(1024));
    }
}
