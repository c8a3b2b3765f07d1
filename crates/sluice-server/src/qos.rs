//! Service levels an operator sets (`sluice serve --qos FILE`, reloaded on
//! SIGHUP): classes (the core's `ClassSpec`: rate limits, a guarantee, a
//! depth; and a weight) and rules that put applications in them.
//!
//! ```toml
//! [[class]]
//! name = "checkpoint"
//! rate_bytes_per_s = 2_000_000_000
//!
//! [[class]]
//! name = "interactive"
//! guarantee_bytes_per_s = 100_000_000
//! weight = 4
//!
//! [[rule]]
//! class = "checkpoint"
//! app = "ckpt-*"          # an application id, `*` at the end a prefix
//!
//! [[rule]]
//! class = "interactive"
//! uid = 1000              # also: job = "slurm-42", gid = 100
//! ```
//!
//! The first rule whose every given field matches an application's
//! connection places it; an application no rule matches is in `default`.
//!
//! A sharing order (`share = ["user", "job"]`, before the first table)
//! makes the scheduler share the device fairly among users first, then
//! among each user's jobs, then among a job's applications (the core's
//! `share.rs`); levels: `user` (uid), `group` (gid), `job`, `class`.
//! A file that does not parse, names an unknown class, has a rule that
//! matches everything, or passes a bound is refused with one line, and a
//! running server keeps the rules it had.

use serde::Deserialize;
use sluice_core::{check_qos_classes, ClassSpec, ShareLevel};

/// Rules in one file.
pub const QOS_RULES_MAX: usize = 1_024;
/// Largest rules file read.
pub const QOS_FILE_BYTES_MAX: u64 = 1 << 20;

/// A class and the weight its applications get.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QosClass {
    pub spec: ClassSpec,
    /// Overrides the weight the client asked for (0: the background).
    pub weight: Option<u32>,
}

/// What places an application: every given field must match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub class: String,
    /// The application id; a trailing `*` matches any suffix.
    #[serde(default)]
    pub app: Option<String>,
    /// The job: an application id `slurm-JOB` or `mpi-JOB` (its prefix
    /// up to the job number is enough: `slurm-42` matches `slurm-42`).
    #[serde(default)]
    pub job: Option<String>,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
}

/// A rules file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QosRules {
    pub classes: Vec<QosClass>,
    pub rules: Vec<Rule>,
    /// The sharing order, outermost first (empty: the policy's own
    /// sharing among applications).
    pub share: Vec<ShareLevel>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassToml {
    name: String,
    #[serde(default)]
    rate_bytes_per_s: Option<u64>,
    #[serde(default)]
    rate_requests_per_s: Option<u64>,
    #[serde(default)]
    guarantee_bytes_per_s: Option<u64>,
    #[serde(default)]
    depth_ms: Option<u64>,
    #[serde(default)]
    weight: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[serde(default)]
    share: Vec<String>,
    #[serde(default)]
    class: Vec<ClassToml>,
    #[serde(default)]
    rule: Vec<Rule>,
}

fn matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

impl QosRules {
    /// Parse and check a rules file's text.
    pub fn parse(text: &str) -> Result<QosRules, String> {
        let f: FileToml = toml::from_str(text).map_err(|e| e.message().to_string())?;
        if f.rule.len() > QOS_RULES_MAX {
            return Err(format!("{} rules: at most {QOS_RULES_MAX} (QOS_RULES_MAX)", f.rule.len()));
        }
        let classes: Vec<QosClass> = f
            .class
            .into_iter()
            .map(|c| {
                let depth_ns = c.depth_ms.unwrap_or(0).saturating_mul(1_000_000);
                let spec = ClassSpec {
                    name: c.name,
                    rate_bytes_per_s: c.rate_bytes_per_s,
                    rate_requests_per_s: c.rate_requests_per_s,
                    guarantee_bytes_per_s: c.guarantee_bytes_per_s,
                    depth_ns,
                };
                QosClass { spec, weight: c.weight }
            })
            .collect();
        let specs: Vec<ClassSpec> = classes.iter().map(|c| c.spec.clone()).collect();
        check_qos_classes(&specs).map_err(|e| e.to_string())?;
        for (i, r) in f.rule.iter().enumerate() {
            if !classes.iter().any(|c| c.spec.name == r.class) {
                return Err(format!("rule {}: no class {:?}", i + 1, r.class));
            }
            if r.app.is_none() && r.job.is_none() && r.uid.is_none() && r.gid.is_none() {
                return Err(format!("rule {}: matches every application (give app, job, uid or gid)", i + 1));
            }
        }
        let share = ShareLevel::parse_order(&f.share)?;
        Ok(QosRules { classes, rules: f.rule, share })
    }

    /// Read and parse `path` (at most `QOS_FILE_BYTES_MAX` bytes).
    pub fn load(path: &std::path::Path) -> Result<QosRules, String> {
        let len = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.len();
        if len > QOS_FILE_BYTES_MAX {
            return Err(format!("{}: {len} bytes, over {QOS_FILE_BYTES_MAX} (QOS_FILE_BYTES_MAX)", path.display()));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        QosRules::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// What a set of rules holds, in one line: `2 classes, 1 rules`, and
    /// the sharing order if there is one.
    pub fn summary(&self) -> String {
        let mut out = format!("{} classes, {} rules", self.classes.len(), self.rules.len());
        if !self.share.is_empty() {
            out += &format!(", sharing by {}", self.share.iter().map(|l| l.name()).collect::<Vec<_>>().join(" then "));
        }
        out
    }

    /// The rules as a rules file (what `sluice qos list` shows).
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        if !self.share.is_empty() {
            let levels: Vec<String> = self.share.iter().map(|l| format!("{:?}", l.name())).collect();
            out += &format!("share = [{}]\n\n", levels.join(", "));
        }
        for c in &self.classes {
            let s = &c.spec;
            out += &format!("[[class]]\nname = {:?}\n", s.name);
            for (k, v) in [("rate_bytes_per_s", s.rate_bytes_per_s), ("rate_requests_per_s", s.rate_requests_per_s), ("guarantee_bytes_per_s", s.guarantee_bytes_per_s)] {
                if let Some(v) = v {
                    out += &format!("{k} = {v}\n");
                }
            }
            if s.depth_ns > 0 {
                out += &format!("depth_ms = {}\n", s.depth_ns / 1_000_000);
            }
            if let Some(w) = c.weight {
                out += &format!("weight = {w}\n");
            }
            out += "\n";
        }
        for r in &self.rules {
            out += &format!("[[rule]]\nclass = {:?}\n", r.class);
            if let Some(a) = &r.app {
                out += &format!("app = {a:?}\n");
            }
            if let Some(j) = &r.job {
                out += &format!("job = {j:?}\n");
            }
            if let Some(u) = r.uid {
                out += &format!("uid = {u}\n");
            }
            if let Some(g) = r.gid {
                out += &format!("gid = {g}\n");
            }
            out += "\n";
        }
        out
    }

    /// The classes for the scheduler.
    pub fn specs(&self) -> Vec<ClassSpec> {
        self.classes.iter().map(|c| c.spec.clone()).collect()
    }

    /// The path of share groups of an application named `app`, connected
    /// as `uid`/`gid`, in class `class` (None: `default`): one key per
    /// level of the sharing order.
    pub fn share_keys(&self, app: &str, uid: u32, gid: u32, class: Option<&str>) -> Vec<u64> {
        sluice_core::share::share_keys(&self.share, app, None, uid, gid, class.unwrap_or(sluice_core::QOS_DEFAULT_CLASS))
    }

    /// The class of an application named `app` connected as `uid`/`gid`.
    pub fn class_for(&self, app: &str, uid: u32, gid: u32) -> Option<&QosClass> {
        let rule = self.rules.iter().find(|r| {
            r.app.as_deref().is_none_or(|p| matches(p, app))
                && r.job.as_deref().is_none_or(|j| app == j || app.strip_prefix(j).is_some_and(|rest| rest.starts_with('-')))
                && r.uid.is_none_or(|u| u == uid)
                && r.gid.is_none_or(|g| g == gid)
        })?;
        self.classes.iter().find(|c| c.spec.name == rule.class)
    }
}

/// Each class's counters as `sluice qos stats` shows them.
pub fn stats_table(classes: &[sluice_core::ClassStats], changes: u64) -> String {
    let mut out = format!("{:<24} {:>8} {:>12} {:>12} {:>14} {:>10} {:>10}\n", "class", "waiting", "admitted", "admitted MB", "dispatched MB", "expired", "guaranteed");
    for c in classes {
        let mb = |b: u64| b as f64 / 1e6;
        out += &format!(
            "{:<24} {:>8} {:>12} {:>12.1} {:>14.1} {:>10} {:>10}\n",
            c.name,
            c.held,
            c.admitted_requests,
            mb(c.admitted_bytes),
            mb(c.dispatched_bytes),
            c.expired,
            c.guaranteed
        );
    }
    if classes.is_empty() {
        out += "(no service classes)\n";
    }
    out + &format!("changes since the start: {changes}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[[class]]
name = "checkpoint"
rate_bytes_per_s = 2_000_000_000

[[class]]
name = "interactive"
guarantee_bytes_per_s = 100_000_000
weight = 4
depth_ms = 100

[[rule]]
class = "checkpoint"
app = "ckpt-*"

[[rule]]
class = "interactive"
uid = 1000

[[rule]]
class = "checkpoint"
job = "slurm-42"
"#;

    #[test]
    fn rules_place_applications_first_match_first() {
        let r = QosRules::parse(FILE).unwrap();
        assert_eq!(r.class_for("ckpt-7", 1000, 0).unwrap().spec.name, "checkpoint");
        assert_eq!(r.class_for("python3-12", 1000, 0).unwrap().weight, Some(4));
        assert_eq!(r.class_for("slurm-42", 5, 5).unwrap().spec.name, "checkpoint");
        assert_eq!(r.class_for("slurm-42-post", 5, 5).unwrap().spec.name, "checkpoint", "a job's other applications");
        assert!(r.class_for("slurm-420", 5, 5).is_none(), "another job");
        assert!(r.class_for("cat-1", 5, 5).is_none());
        assert_eq!(r.specs()[1].depth_ns, 100_000_000);
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        for (text, why) in [
            ("[[class]]\nname = \"a\"\nrate = 5\n", "unknown field"),
            ("[[class]]\nname = \"a\"\n[[rule]]\nclass = \"b\"\napp = \"x\"\n", "no class"),
            ("[[class]]\nname = \"a\"\n[[rule]]\nclass = \"a\"\n", "matches every application"),
            ("[[class]]\nname = \"a\"\nrate_bytes_per_s = 0\n", "of 0"),
            ("[[class]]\nname = \"default\"\n", "default"),
            ("not toml at all [", ""),
        ] {
            let e = QosRules::parse(text).unwrap_err();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_sharing_order_groups_users_then_jobs() {
        let r = QosRules::parse("share = [\"user\", \"job\"]\n").unwrap();
        assert!(r.classes.is_empty());
        let k = |app: &str, uid: u32| r.share_keys(app, uid, 0, None);
        assert_eq!(k("slurm-7", 1000), k("slurm-7-post", 1000), "one job");
        assert_ne!(k("slurm-7", 1000), k("slurm-8", 1000));
        assert_eq!(k("slurm-7", 1000)[0], k("slurm-8", 1000)[0], "one user");
        assert_ne!(k("slurm-7", 1000)[0], k("slurm-7", 1001)[0]);
        assert_eq!(QosRules::parse(&r.to_toml()).unwrap(), r, "list writes it back");
    }

    #[test]
    fn share_levels_are_bounded_and_checked() {
        let levels = ["user", "group", "job", "class"];
        let file = |n: usize| format!("share = [{}]\n", levels[..n].iter().map(|l| format!("{l:?}")).collect::<Vec<_>>().join(", "));
        assert_eq!(QosRules::parse(&file(sluice_core::SHARE_LEVELS_MAX)).unwrap().share.len(), sluice_core::SHARE_LEVELS_MAX);
        assert!(QosRules::parse(&file(sluice_core::SHARE_LEVELS_MAX + 1)).unwrap_err().contains("SHARE_LEVELS_MAX"));
        assert!(QosRules::parse("share = [\"user\", \"user\"]\n").unwrap_err().contains("twice"));
        assert!(QosRules::parse("share = [\"planet\"]\n").unwrap_err().contains("no level"));
    }

    #[test]
    fn rules_are_bounded() {
        let mut text = String::from("[[class]]\nname = \"a\"\n");
        for i in 0..QOS_RULES_MAX {
            text += &format!("[[rule]]\nclass = \"a\"\nuid = {i}\n");
        }
        assert_eq!(QosRules::parse(&text).unwrap().rules.len(), QOS_RULES_MAX);
        text += "[[rule]]\nclass = \"a\"\nuid = 99999\n";
        assert!(QosRules::parse(&text).unwrap_err().contains("QOS_RULES_MAX"));
    }
}
