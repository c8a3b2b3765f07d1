//! The layering, from `cargo metadata` and the sources: the code injected
//! into every program (the interposer) and the FUSE mount link neither the
//! server nor the metadata database; the server and the `sluice serve` and
//! `sluice cluster` commands use no benchmark code; no crate but
//! `sluice-proto` decodes a frame header or a length prefix; no source file
//! of `sluice-client` is over `CLIENT_FILE_LINES_MAX` lines; and
//! docs/architecture.md's code map names exactly the workspace's crates,
//! with exactly their dependencies on each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Each workspace package's normal (not dev, not build) dependencies,
/// by name, as its manifest declares them (`--no-deps`: nothing to fetch).
/// A dependency outside the workspace is a leaf here; that is enough,
/// since no crate from a registry depends on ours or on redb.
fn graph() -> (BTreeSet<String>, BTreeMap<String, BTreeSet<String>>) {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let o = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline", "--manifest-path"])
        .arg(Path::new(ROOT).join("Cargo.toml"))
        .output()
        .expect("cargo runs");
    assert!(o.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mut members = BTreeSet::new();
    let mut deps = BTreeMap::new();
    for p in v["packages"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap().to_string();
        let normal: BTreeSet<String> = p["dependencies"].as_array().unwrap().iter().filter(|d| d["kind"].is_null()).map(|d| d["name"].as_str().unwrap().to_string()).collect();
        members.insert(name.clone());
        deps.insert(name, normal);
    }
    (members, deps)
}

fn closure(deps: &BTreeMap<String, BTreeSet<String>>, from: &str) -> BTreeSet<String> {
    let (mut seen, mut todo) = (BTreeSet::new(), vec![from.to_string()]);
    while let Some(p) = todo.pop() {
        for d in deps.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn the_interposer_and_the_mount_link_no_server_and_no_database() {
    let (_, deps) = graph();
    for front in ["sluice-preload", "sluice-fuse"] {
        let all = closure(&deps, front);
        for banned in ["sluice-server", "sluice-meta", "redb", "sluice-bench", "sluice-sim"] {
            assert!(!all.contains(banned), "{front} depends on {banned}, directly or not: {all:?}");
        }
        assert!(all.contains("sluice-remote") && all.contains("sluice-client"), "{front}: {all:?}");
    }
}

#[test]
fn the_architecture_map_names_every_crate_and_its_edges() {
    let (members, deps) = graph();
    let doc = std::fs::read_to_string(Path::new(ROOT).join("docs/architecture.md")).unwrap();
    let sections: BTreeSet<String> = doc.lines().filter_map(|l| l.strip_prefix("### `crates/")).map(|l| l.split('`').next().unwrap().to_string()).collect();
    assert_eq!(sections, members, "docs/architecture.md has a `### `crates/NAME`` section per workspace crate");
    // The edge list between workspace crates, as the doc's table has it.
    let mut want = String::new();
    for m in &members {
        let inner: Vec<&str> = deps[m].iter().filter(|d| members.contains(*d)).map(String::as_str).collect();
        want.push_str(&format!("| `{m}` | {} |\n", if inner.is_empty() { "—".to_string() } else { inner.join(", ") }));
    }
    assert!(doc.contains(&want), "docs/architecture.md's crate dependency table differs from cargo metadata; it should read:\n{want}");
}

#[test]
fn the_server_and_the_launcher_link_no_benchmark_code() {
    let (_, deps) = graph();
    for daemon in ["sluice-server", "sluice-launch", "sluice-device", "sluice-meta"] {
        let all = closure(&deps, daemon);
        assert!(!all.contains("sluice-bench"), "{daemon} depends on sluice-bench, directly or not: {all:?}");
    }
}

#[test]
fn the_serve_and_cluster_commands_use_no_benchmark_code() {
    for cmd in ["serve.rs", "cluster.rs"] {
        let path = Path::new(ROOT).join("crates/sluice/src/cmd").join(cmd);
        let text = std::fs::read_to_string(&path).unwrap();
        let uses: Vec<&str> = text.lines().filter(|l| l.contains("sluice_bench")).collect();
        assert!(uses.is_empty(), "{} uses the benchmark crate: {uses:?}", path.display());
    }
}

/// Decoding a frame's fields by hand: the header's length, opcode and
/// flags, and the metadata protocol's length prefix, are `u32`s and `u16`s
/// read little-endian. Only `sluice-proto` does that (`check_header`,
/// `meta_body_len`); `u64`/`f64` reads elsewhere are data (array layouts,
/// Zarr values, hashes), not framing.
const FRAME_DECODING: [&str; 4] = ["u32::from_le_bytes(", "u16::from_le_bytes(", "u32::from_be_bytes(", "u16::from_be_bytes("];

fn rust_sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_crate_but_the_protocol_reads_a_frame_header() {
    let (members, _) = graph();
    let mut files = Vec::new();
    for m in members.iter().filter(|m| *m != "sluice-proto") {
        rust_sources(&Path::new(ROOT).join("crates").join(m).join("src"), &mut files);
    }
    rust_sources(&Path::new(ROOT).join("python/src"), &mut files);
    assert!(files.len() > 50, "the walk found the sources: {}", files.len());
    let mut found = Vec::new();
    for f in &files {
        for (i, line) in std::fs::read_to_string(f).unwrap().lines().enumerate() {
            if FRAME_DECODING.iter().any(|p| line.contains(p)) {
                found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(found.is_empty(), "frames are decoded by sluice-proto only (check_header, meta_body_len):\n{}", found.join("\n"));
}

/// The client library stays split by concern: no source file of
/// `sluice-client` over this many lines.
const CLIENT_FILE_LINES_MAX: usize = 600;

#[test]
fn no_client_source_file_is_over_its_bound() {
    let mut files = Vec::new();
    rust_sources(&Path::new(ROOT).join("crates/sluice-client/src"), &mut files);
    assert!(files.len() > 5, "{files:?}");
    for f in files {
        let lines = std::fs::read_to_string(&f).unwrap().lines().count();
        assert!(lines <= CLIENT_FILE_LINES_MAX, "{}: {lines} lines, over {CLIENT_FILE_LINES_MAX}: split it by concern", f.display());
    }
}
