//! The server's shape, read from its sources: its modules in layers, each
//! importing only from layers below its own (`LAYERS`), no source file
//! over `FILE_LINES_MAX` lines and no function over `FN_LINES_MAX`.
//!
//! An import is any path through `crate::`, `super::`, or (in a module
//! with children) a child's name, outside comments and outside the
//! file's `#[cfg(test)]` module. The event loop's stages are `impl
//! EventLoop` blocks over one state (`evloop/mod.rs`): they import that
//! state and the loop's leaf modules, never each other; the methods they
//! call on one another are not imports, and this test does not see them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
const FILE_LINES_MAX: usize = 600;
const FN_LINES_MAX: usize = 70;

/// The modules, bottom layer first. A module imports only from layers
/// below its own; modules of one layer do not import each other.
const LAYERS: &[&[&str]] = &[
    &["error", "clock", "sync", "waker", "storage", "order", "net", "shm", "collective", "idhash"],
    &["root", "ident", "view", "trace", "disk", "qos"],
    &["config", "lease", "state"],
    &["pending", "shared"],
    &["exec", "ops", "metrics"],
    &["ring", "dispatch", "conn", "meta"],
    // The event loop's leaves: its readiness interface, the partial-frame
    // budget, admission's pure decisions, the completion queue, the
    // watched doorbells.
    &["evloop::poll", "evloop::budget", "evloop::admission", "evloop::queue", "evloop::watched", "evloop::fair"],
    // The loop's state, and the turn that walks the stages.
    &["evloop"],
    // The stages.
    &[
        "evloop::input",
        "evloop::handshake",
        "evloop::request",
        "evloop::leases",
        "evloop::gather",
        "evloop::doorbells",
        "evloop::completion",
        "evloop::conns",
        "evloop::deadlines",
        "evloop::view",
    ],
    // The test that drives the loop by hand (built for tests only): its
    // clients, then the schedule.
    &["evloop::sim::client"],
    &["evloop::sim"],
    &["lib"],
];

/// Every `.rs` file under `dir`, with its module's path (`lib` for the
/// crate root, `a::b` for `a/b.rs` or `a/b/mod.rs`).
fn modules(dir: &Path, prefix: &str, out: &mut BTreeMap<String, PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_stem().unwrap().to_str().unwrap().to_string();
        let path = if prefix.is_empty() { name.clone() } else { format!("{prefix}::{name}") };
        if p.is_dir() {
            modules(&p, &path, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let module = if name == "mod" { prefix.to_string() } else { path };
            out.insert(module, p);
        }
    }
}

/// The file's code: comments and its test module (from `#[cfg(test)]`
/// before a `mod`) left out, and each other line under `#[cfg(test)]` (a
/// test-only field, statement or import).
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod ").next().unwrap();
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.trim() == "#[cfg(test)]" {
            lines.next();
            continue;
        }
        out.push(l.split("//").next().unwrap());
    }
    out.join("\n")
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = s.find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The first segment of each path `text` continues with after a `::`:
/// `a::B` gives `a`, `{a, b::C}` gives `a` and `b`.
fn firsts(text: &str) -> Vec<&str> {
    match text.strip_prefix('{') {
        Some(group) => group.split('}').next().unwrap().split(',').map(|g| ident(g.trim())).filter(|g| !g.is_empty()).collect(),
        None => vec![ident(text)],
    }
}

/// The modules `module`'s code imports.
fn imports(module: &str, code: &str, all: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    let parent = module.rsplit_once("::").map_or("lib", |(p, _)| p);
    let resolve = |base: &str, seg: &str| {
        let child = if base == "lib" { seg.to_string() } else { format!("{base}::{seg}") };
        if all.contains_key(&child) {
            child
        } else {
            base.to_string()
        }
    };
    let children: Vec<&str> = all.keys().filter_map(|k| k.strip_prefix(module).and_then(|r| r.strip_prefix("::"))).collect();
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("::") {
        let before = &code[..i];
        let word_start = before.rfind(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_')).map_or(0, |k| k + 1);
        let word = &before[word_start..];
        // Only a path's first segment: not `a::b` in `x::a::b`.
        if before[..word_start].ends_with("::") {
            continue;
        }
        let rest = &code[i + 2..];
        for seg in firsts(rest) {
            let m = match word {
                "crate" => resolve("lib", seg),
                "super" => resolve(parent, seg),
                "self" => resolve(module, seg),
                w if children.contains(&w) => format!("{module}::{w}"),
                _ => continue,
            };
            // `crate::evloop::input::X` names the stage, not the loop.
            let m = match rest.strip_prefix(seg).and_then(|r| r.strip_prefix("::")) {
                Some(r) if all.contains_key(&format!("{m}::{}", ident(r))) => format!("{m}::{}", ident(r)),
                _ => m,
            };
            if m != module {
                out.insert(m);
            }
        }
    }
    out
}

#[test]
fn no_module_imports_from_a_module_above_it() {
    let mut all = BTreeMap::new();
    modules(Path::new(SRC), "", &mut all);
    let layer: BTreeMap<&str, usize> = LAYERS.iter().enumerate().flat_map(|(i, l)| l.iter().map(move |m| (*m, i))).collect();
    let listed: BTreeSet<&str> = layer.keys().copied().collect();
    let found: BTreeSet<&str> = all.keys().map(String::as_str).collect();
    assert_eq!(listed, found, "LAYERS lists exactly the server's modules");
    let mut wrong = Vec::new();
    for (module, path) in &all {
        for dep in imports(module, &code(&std::fs::read_to_string(path).unwrap()), &all) {
            if layer[dep.as_str()] >= layer[module.as_str()] {
                wrong.push(format!("{module} (layer {}) imports {dep} (layer {})", layer[module.as_str()], layer[dep.as_str()]));
            }
        }
    }
    assert!(wrong.is_empty(), "imports that do not run down the layers:\n{}", wrong.join("\n"));
}

/// Each function in `text`: its name, first line and length in lines
/// (signature to closing brace, braces matched; a body's braces inside
/// strings come in pairs, and character literals are skipped).
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let l = line.split("//").next().unwrap().trim_start();
        let l = l.strip_prefix("pub(crate) ").or_else(|| l.strip_prefix("pub(super) ")).or_else(|| l.strip_prefix("pub ")).unwrap_or(l);
        let l = l.strip_prefix("const ").unwrap_or(l);
        let l = l.strip_prefix("unsafe ").unwrap_or(l);
        let Some(sig) = l.strip_prefix("fn ") else { continue };
        let (mut depth, mut opened) = (0i32, false);
        for (j, body) in lines.iter().enumerate().skip(i) {
            let b = body.split("//").next().unwrap().replace("'{'", "").replace("'}'", "");
            if !opened && b.trim_end().ends_with(';') && !b.contains('{') {
                break;
            }
            for ch in b.chars() {
                match ch {
                    '{' => (depth, opened) = (depth + 1, true),
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if opened && depth == 0 {
                out.push((ident(sig).to_string(), i + 1, j - i + 1));
                break;
            }
        }
    }
    out
}

#[test]
fn no_file_over_600_lines_and_no_function_over_70() {
    let mut all = BTreeMap::new();
    modules(Path::new(SRC), "", &mut all);
    let mut wrong = Vec::new();
    for path in all.values() {
        let text = std::fs::read_to_string(path).unwrap();
        let name = path.strip_prefix(SRC).unwrap().display().to_string();
        let n = text.lines().count();
        if n > FILE_LINES_MAX {
            wrong.push(format!("{name}: {n} lines (FILE_LINES_MAX = {FILE_LINES_MAX})"));
        }
        for (f, at, len) in functions(&text) {
            if len > FN_LINES_MAX {
                wrong.push(format!("{name}:{at}: fn {f} is {len} lines (FN_LINES_MAX = {FN_LINES_MAX})"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_checks_see_what_they_check() {
    // The function counter: a short body, a long one, a declaration.
    let long = format!("fn long() {{\n{}}}\n", "    let x = 1;\n".repeat(FN_LINES_MAX - 1));
    let text = format!("fn f(a: u8) -> u8 {{\n    if a > 0 {{ 1 }} else {{ '{{' as u8 }}\n}}\n{long}fn g();\n");
    let found = functions(&text);
    assert_eq!(found, vec![("f".into(), 1, 3), ("long".into(), 4, FN_LINES_MAX + 1)], "N+1 lines found");
    // Imports: crate and super paths, groups, children, stage paths.
    let all: BTreeMap<String, PathBuf> =
        ["lib", "a", "b", "view", "evloop", "evloop::input", "evloop::poll", "evloop::view"].iter().map(|m| (m.to_string(), PathBuf::new())).collect();
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<String>>();
    let raw = "use crate::{a, b::X};\nuse super::{EventLoop, poll::P};\nlet x = crate::evloop::input::Y; // crate::Lib\n#[cfg(test)]\nuse crate::view::T;";
    assert_eq!(imports("evloop::poll", &code(raw), &all), set(&["a", "b", "evloop", "evloop::input"]));
    // Code after a test-only line is still read; a test module is not.
    let raw = "    #[cfg(test)]\n    x: crate::a::X,\n    y: crate::b::Y,\n#[cfg(test)]\nmod tests {\n    use crate::view::T;\n}";
    assert_eq!(imports("evloop::poll", &code(raw), &all), set(&["b"]));
    let raw = "use poll::Poll;\nlet t = crate::view::V;\nlet s = std::io::Error;";
    assert_eq!(imports("evloop", &code(raw), &all), set(&["evloop::poll", "view"]), "a child by its name; the crate's `view`, not the child's");
}
