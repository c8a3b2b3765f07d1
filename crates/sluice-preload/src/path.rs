//! Lexical path handling: normalise `.`, `..` and repeated slashes, and
//! map a local absolute path under the prefix to the server's relative
//! path. Symlinks are not followed (the prefix need not exist locally).

/// `abs` (starting with `/`) with `.`, `..` and `//` resolved lexically;
/// `..` at the root stays at the root.
pub fn normalise(abs: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in abs.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let mut out = String::with_capacity(abs.len());
    for p in &parts {
        out.push('/');
        out.push_str(p);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// The server path of normalised absolute `abs` when it lies under the
/// normalised `prefix`: `"."` for the prefix itself, else `a/b`.
pub fn within(prefix: &str, abs: &str) -> Option<String> {
    if abs == prefix {
        return Some(".".into());
    }
    let rest = if prefix == "/" { abs.strip_prefix('/')? } else { abs.strip_prefix(prefix)?.strip_prefix('/')? };
    Some(if rest.is_empty() { ".".into() } else { rest.to_string() })
}

/// `rel` resolved against directory `base` (absolute), normalised; an
/// absolute `rel` ignores `base`.
pub fn join(base: &str, rel: &str) -> String {
    if rel.starts_with('/') {
        normalise(rel)
    } else {
        normalise(&format!("{base}/{rel}"))
    }
}

/// The server path of `rel` relative to the server directory `dir`.
pub fn server_join(dir: &str, rel: &str) -> Option<String> {
    let abs = join(&format!("/{dir}"), rel);
    within("/", &abs)
}

/// `server` (a normalised server path) with the trailing slash the
/// caller's `p` had: the server resolves `file/` as the kernel does
/// (ENOTDIR for a file; a link is followed), where dropping it opened the
/// file (`cat PREFIX/file/` read it).
pub fn keep_trailing_slash(p: &str, server: String) -> String {
    if p.ends_with('/') && server != "." {
        server + "/"
    } else {
        server
    }
}

/// The text to store in a link at server path `link` for `target` as the
/// program gave it: an absolute target under `prefix` (normalised)
/// becomes relative to the link's directory, so that the server (which
/// refuses absolute paths) and a mount anywhere follow it; any other
/// target is kept as given, as `symlink(2)` does.
pub fn link_text(prefix: &str, link: &str, target: &str) -> String {
    let Some(to) = target.starts_with('/').then(|| within(prefix, &normalise(target))).flatten() else { return target.to_string() };
    let depth = link.split('/').filter(|c| !c.is_empty() && *c != ".").count().saturating_sub(1);
    let up = "../".repeat(depth);
    match (to.as_str(), depth) {
        (".", 0) => ".".into(),
        (".", _) => up.trim_end_matches('/').to_string(),
        (t, _) => format!("{up}{t}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trailing_slash_is_kept_but_for_the_root() {
        assert_eq!(keep_trailing_slash("/sluice/f/", "f".into()), "f/");
        assert_eq!(keep_trailing_slash("/sluice/f", "f".into()), "f");
        assert_eq!(keep_trailing_slash("/sluice/", ".".into()), ".");
        assert_eq!(keep_trailing_slash("d/..//", "a".into()), "a/");
    }

    #[test]
    fn absolute_link_targets_under_the_prefix_become_relative() {
        assert_eq!(link_text("/sluice", "l", "/sluice/a/b"), "a/b");
        assert_eq!(link_text("/sluice", "d/e/l", "/sluice/a/b"), "../../a/b");
        assert_eq!(link_text("/sluice", "d/l", "/sluice"), "..");
        assert_eq!(link_text("/sluice", "l", "/sluice/"), ".");
        assert_eq!(link_text("/sluice", "d/l", "/sluice/x/../a"), "../a");
        assert_eq!(link_text("/sluice", "d/l", "/etc/passwd"), "/etc/passwd");
        assert_eq!(link_text("/sluice", "d/l", "../a"), "../a");
        assert_eq!(link_text("/", "d/l", "/a"), "../a");
    }

    fn check(prefix: &str, cwd: &str, path: &str, expected: Option<&str>) {
        let got = within(&normalise(prefix), &join(cwd, path));
        assert_eq!(got.as_deref(), expected, "prefix {prefix} cwd {cwd} path {path}");
    }

    #[test]
    fn paths_under_the_prefix_map_to_server_paths() {
        check("/sluice", "/", "/sluice/a/b", Some("a/b"));
        check("/sluice/", "/", "/sluice//a/./b/", Some("a/b"));
        check("/sluice", "/", "/sluice", Some("."));
        check("/sluice", "/", "/sluice/a/..", Some("."));
        check("/sluice", "/sluice/d", "x", Some("d/x"));
        check("/sluice", "/tmp/w", "../../sluice/x", Some("x"));
        check("/", "/", "/etc/passwd", Some("etc/passwd"));
    }

    #[test]
    fn paths_outside_the_prefix_are_left_alone() {
        check("/sluice", "/", "/sluicex/a", None);
        check("/sluice", "/", "/sluice/../etc/passwd", None);
        check("/sluice", "/sluice", "..", None);
        check("/sluice", "/tmp", "a", None);
        check("/sluice", "/", "/../..", None);
    }

    #[test]
    fn server_join_stays_inside_the_root() {
        assert_eq!(server_join("d", "x/../y").as_deref(), Some("d/y"));
        assert_eq!(server_join(".", "a").as_deref(), Some("a"));
        assert_eq!(server_join("d", "../../x").as_deref(), Some("x"));
    }
}
