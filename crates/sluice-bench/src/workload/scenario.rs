//! The seed's experiments as scenarios (sizes as in the seed, scalable).

use serde::Deserialize;

use super::pattern::{AppSpec, Dir, Pattern};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A scenario: named applications started together.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    pub name: String,
    pub apps: Vec<AppSpec>,
}

fn app(name: &str, procs: u32, op: Dir, pattern: Pattern, size: u64, g: u64) -> AppSpec {
    AppSpec { name: name.into(), procs, op, pattern, size, granularity: g, shared_file: true, weight: 1, replay: None, uid: None }
}

/// Scale a size, keeping at least one piece per process and whole pieces.
fn scaled(size: u64, scale: f64, g: u64, procs: u32) -> u64 {
    let s = (size as f64 * scale) as u64;
    let unit = g * u64::from(procs.max(1));
    (s / unit).max(1) * unit
}

/// The seed's decomposition: `procs` processes, granularity `g`, a 4 GB
/// shared file by default.
pub fn decomposition(procs: u32, g: u64, op: Dir, scale: f64) -> Scenario {
    let size = scaled(4 * GIB, scale, g, procs);
    Scenario { name: "decomposition".into(), apps: vec![app("decomposition", procs, op, Pattern::Strided, size, g)] }
}

/// Seed "Case 1": the decomposition plus a `cat` of a 16 MiB file with
/// 32 KiB requests.
pub fn interference(procs: u32, g: u64, scale: f64) -> Scenario {
    let mut s = decomposition(procs, g, Dir::Read, scale);
    s.name = "interference".into();
    let cat_size = scaled(16 * MIB, scale.max(1.0 / 16.0), 32 * KIB, 1);
    s.apps.push(app("cat", 1, Dir::Read, Pattern::Contiguous, cat_size, 32 * KIB));
    s
}

/// Seed "Case 2": ten applications started together.
pub fn mix10(scale: f64) -> Scenario {
    use Dir::*;
    use Pattern::*;
    let rows: [(&str, u32, Dir, Pattern, u64, u64); 10] = [
        ("read-decomp-2g", 32, Read, Strided, 2 * GIB, 128 * KIB),
        ("write-decomp-2g", 32, Write, Strided, 2 * GIB, 128 * KIB),
        ("read-decomp-256m", 16, Read, Strided, 256 * MIB, 8 * KIB),
        ("write-decomp-128m", 8, Write, Strided, 128 * MIB, 64 * KIB),
        ("read-seq-1g", 1, Read, Contiguous, GIB, 2 * MIB),
        ("write-seq-512m", 1, Write, Contiguous, 512 * MIB, 2 * MIB),
        ("read-seq-32m", 1, Read, Contiguous, 32 * MIB, 4 * KIB),
        ("write-seq-32m", 1, Write, Contiguous, 32 * MIB, 4 * KIB),
        ("read-seq-4m", 1, Read, Contiguous, 4 * MIB, 32 * KIB),
        ("write-seq-4m", 1, Write, Contiguous, 4 * MIB, 32 * KIB),
    ];
    let apps = rows.iter().map(|&(n, p, op, pat, size, g)| app(n, p, op, pat, scaled(size, scale, g, p), g)).collect();
    Scenario { name: "mix10".into(), apps }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomFile {
    name: Option<String>,
    #[serde(rename = "app")]
    apps: Vec<AppSpec>,
}

/// A user's scenario from TOML: `[[app]]` tables with the `AppSpec` fields.
pub fn custom(text: &str, scale: f64) -> Result<Scenario, String> {
    let f: CustomFile = toml::from_str(text).map_err(|e| format!("scenario file: {e}"))?;
    if f.apps.is_empty() {
        return Err("scenario file: no [[app]] tables".into());
    }
    let mut apps = f.apps;
    for a in &mut apps {
        if a.procs == 0 || a.granularity == 0 || a.size == 0 {
            return Err(format!("app {}: procs, granularity and size must be positive", a.name));
        }
        a.size = scaled(a.size, scale, a.granularity, if a.shared_file { a.procs } else { 1 });
    }
    Ok(Scenario { name: f.name.unwrap_or_else(|| "custom".into()), apps })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix10_is_the_seed_table_at_full_scale() {
        let s = mix10(1.0);
        assert_eq!(s.apps.len(), 10);
        let total: u64 = s.apps.iter().map(AppSpec::bytes).sum();
        // 2 + 2 GiB + 256 + 128 MiB + 1 GiB + 512 MiB + 2 x 32 MiB + 2 x 4 MiB.
        assert_eq!(total, 5 * GIB + (256 + 128 + 512 + 64 + 8) * MIB);
        assert_eq!(s.apps.iter().map(|a| a.procs).sum::<u32>(), 32 + 32 + 16 + 8 + 6);
    }

    #[test]
    fn scaling_keeps_whole_pieces_per_process() {
        let s = decomposition(32, 4 * KIB, Dir::Read, 1.0 / 16.0);
        assert_eq!(s.apps[0].size, 256 * MIB);
        let tiny = decomposition(32, 4 * KIB, Dir::Read, 1e-9);
        assert_eq!(tiny.apps[0].size, 32 * 4 * KIB, "at least one piece per process");
    }

    #[test]
    fn custom_scenarios_parse_and_reject_nonsense() {
        let ok = "name = \"mine\"\n[[app]]\nname = \"ckpt\"\nprocs = 4\nop = \"write\"\npattern = \"strided\"\nsize = 1048576\ngranularity = 65536\n";
        let s = custom(ok, 1.0).unwrap();
        assert_eq!((s.name.as_str(), s.apps[0].procs, s.apps[0].shared_file), ("mine", 4, true));
        assert!(custom("[[app]]\nname = \"x\"\nprocs = 0\nop = \"read\"\npattern = \"random\"\nsize = 1\ngranularity = 1\n", 1.0).is_err());
        assert!(custom("[[app]]\nname = \"x\"\nbogus = 1\n", 1.0).unwrap_err().contains("scenario file"));
        assert!(custom("name = \"empty\"\napp = []\n", 1.0).is_err());
    }
}
