//! The crate reads one way (docs/architecture.md): no module reaches,
//! through `crate::…` paths, a module that reaches it back. Checked on the
//! sources, so a new import that closes a circle fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module name -> the modules its source names as `crate::m`.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let mut used = BTreeSet::new();
        for (i, _) in text.match_indices("crate::") {
            let m: String = text[i + 7..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            // `crate::run` and other items of lib.rs are the crate's API.
            if !m.is_empty() && m != name && src.join(format!("{m}.rs")).exists() {
                used.insert(m);
            }
        }
        graph.insert(name, used);
    }
    graph
}

/// A module of `graph` on a circle, if any (depth-first search).
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(m: &str, graph: &BTreeMap<String, BTreeSet<String>>, path: &mut Vec<String>, done: &mut BTreeSet<String>) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == m) {
            return Some(path[at..].to_vec());
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for next in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

#[test]
fn modules_import_one_way() {
    let graph = imports();
    assert!(graph.len() >= 10 && graph["sim"].contains("state"), "the source scan found the modules: {graph:?}");
    assert_eq!(circle(&graph), None, "modules import each other in a circle");
    // The layers docs/architecture.md names.
    for leaf in ["engine", "net", "slab", "scenario", "workload", "units"] {
        assert!(graph[leaf].iter().all(|m| ["error", "engine", "scenario"].contains(&m.as_str())), "{leaf} is a leaf: {:?}", graph[leaf]);
    }
    for handler in ["client", "server"] {
        assert!(!graph[handler].contains("sim") && !graph[handler].contains("report"), "{handler} reaches the loop or the report");
    }
}

#[test]
fn the_circle_finder_finds_one() {
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    g.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(circle(&g), Some(vec!["a".into(), "b".into(), "c".into()]));
    g.get_mut("c").unwrap().clear();
    assert_eq!(circle(&g), None);
}
