//! No label by a numbered round of work or by an internal tracker number in
//! the project's sources and docs: a reader of the repository cannot open
//! them, so a comment says what the thing is (or cites a date, a commit or
//! a public tracker) instead.
//!
//! The test walks `crates/`, `python/`, `docs/`, `README.md`, `scenarios/`,
//! `scripts/`, `examples/`, the Makefile and `.ci/` (build outputs and
//! virtual environments left out) and fails with every
//! offending `file:line`. A label is, case-insensitively, one of the words
//! below at the start of a word, a space, `_` or `#`, then a digit. Lines
//! that cite a public tracker are allowed ([`PUBLIC`]).

use std::path::{Path, PathBuf};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// The words that, followed by a number, label a round of work or a
/// tracker entry. Longest first, so that the plural wins.
const WORDS: [&str; 6] = ["sessions", "session", "waves", "wave", "issues", "issue"];

/// Markers of a public tracker on the same line: such a number can be
/// looked up by anyone.
const PUBLIC: [&str; 3] = ["zarr-python", "LU-", "github.com/"];

/// Directory names never walked: build outputs, environments, caches.
const SKIPPED_DIRS: [&str; 8] = ["target", ".venv", "venv", "build", "dist", "__pycache__", ".pytest_cache", "node_modules"];

/// Whether `line` carries a label: a word of [`WORDS`] not preceded by a
/// letter or digit, then one separator (space, `_`, `#`, or a space and
/// `#`), then a digit.
fn has_label(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    let b = lower.as_bytes();
    for word in WORDS {
        let mut from = 0;
        while let Some(at) = lower[from..].find(word) {
            let start = from + at;
            from = start + 1;
            if start > 0 && b[start - 1].is_ascii_alphanumeric() {
                continue;
            }
            let rest = &b[start + word.len()..];
            let digit_at = match rest {
                [b' ', b'#', ..] => 2,
                [b' ' | b'_' | b'#', ..] => 1,
                _ => continue,
            };
            if rest.get(digit_at).is_some_and(u8::is_ascii_digit) {
                return true;
            }
        }
    }
    false
}

/// Whether a labelled line is allowed: it cites a public tracker.
fn allowed(line: &str) -> bool {
    PUBLIC.iter().any(|p| line.contains(p))
}

/// Every file under `dir`, skipping [`SKIPPED_DIRS`] and hidden entries.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            if !name.starts_with('.') && !SKIPPED_DIRS.contains(&name.as_str()) && !name.ends_with(".egg-info") {
                walk(&path, out);
            }
        } else if kind.is_file() {
            out.push(path);
        }
    }
}

/// The offending `file:line: text` entries of the files under `paths`
/// (relative to the repository root). Binary files (with a NUL) are skipped.
fn offences(paths: &[&str]) -> Vec<String> {
    let root = Path::new(ROOT);
    let mut files = Vec::new();
    for p in paths {
        let full = root.join(p);
        if full.is_dir() {
            walk(&full, &mut files);
        } else if full.is_file() {
            files.push(full);
        }
    }
    files.sort();
    let mut found = Vec::new();
    for f in files {
        let Ok(bytes) = std::fs::read(&f) else { continue };
        if bytes.contains(&0) {
            continue;
        }
        let text = String::from_utf8_lossy(&bytes);
        let shown = f.strip_prefix(root).unwrap_or(&f).display().to_string();
        for (i, line) in text.lines().enumerate() {
            if has_label(line) && !allowed(line) {
                found.push(format!("{shown}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    found
}

fn check(paths: &[&str]) {
    let found = offences(paths);
    assert!(
        found.is_empty(),
        "{} line(s) label things by a numbered round of work or an internal tracker number; say what the thing is instead:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_matcher_finds_labels_and_only_labels() {
    // Written with escapes, so that this file carries no label itself.
    for bad in ["before Session\u{20}21,", "(issue\u{20}12)", "issue\u{20}\u{23}7", "Issues\u{20}11 and 12", "waves\u{20}2-3", "fn issue\u{5f}12_resets()", "see wave\u{23}3"] {
        assert!(has_label(bad), "{bad:?} is a label");
    }
    for fine in ["the session reconnects", "sessions", "a wave of 12", "reissue 3", "session_id 4", "tissue 5"] {
        assert!(!has_label(fine), "{fine:?} is not a label");
    }
    assert!(allowed("(zarr-python issue 3682)") && !allowed("(issue 3682)"));
}

#[test]
fn sources_carry_no_round_or_tracker_labels() {
    check(&["crates", "python"]);
}

#[test]
fn docs_carry_no_round_or_tracker_labels() {
    check(&["docs", "README.md"]);
}

#[test]
fn scenarios_scripts_and_examples_carry_no_round_or_tracker_labels() {
    check(&["scenarios", "scripts", "examples", "Makefile", ".ci"]);
}
