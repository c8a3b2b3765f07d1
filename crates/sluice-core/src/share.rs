//! Composite sharing: fairness between groups of applications before
//! fairness between applications (`Scheduler::set_app_share`).
//!
//! An operator gives a sharing order such as users, then jobs: each user
//! gets an equal share of the device, and each job an equal share of its
//! user's. The driver puts every application on a path of group keys, one
//! per level, outermost first (a uid, then a job). The policy charges
//! every dispatched byte to each group on its application's path, and
//! hands each new turn to the application whose path is least served,
//! level by level: among the top-level groups with a backlogged
//! application, the one that moved the fewest bytes; within it, the least
//! served group of the next level; and so on. Among the applications of
//! that last group the policy's own order decides (aIOLi: the longest
//! weighted wait). Shares are in bytes, equal among the members of a level.
//!
//! **No banked credit.** A group that was idle would come back far behind
//! the others and take the device until it caught up. Each group keeps a
//! *floor*: how much the child it last chose had been served, which is
//! where its backlogged children stand. A group whose application becomes
//! backlogged is lifted to its parent's floor less `slack` (the policy's
//! longest turn), and a new group starts at the floor: at most one long
//! turn of catching up.
//!
//! Bounds: at most `SHARE_LEVELS_MAX` levels; one path per application the
//! driver placed (the scheduler's `apps_max`), and one group per level and
//! path at most, freed with the last application on it.

use crate::hash::FxHashMap;
use crate::types::AppId;

/// Levels of a sharing order (for instance user, job, and a third such as
/// the service class).
pub const SHARE_LEVELS_MAX: usize = 3;

/// A level of a sharing order: what groups applications at it. The
/// daemon's rules file and the simulator's scenarios name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShareLevel {
    /// The uid the application connected as.
    User,
    /// Its gid.
    Group,
    /// Its job (`job_of`).
    Job,
    /// The service class it is in.
    Class,
}

impl ShareLevel {
    pub const ALL: [ShareLevel; 4] = [ShareLevel::User, ShareLevel::Group, ShareLevel::Job, ShareLevel::Class];

    pub fn name(self) -> &'static str {
        match self {
            ShareLevel::User => "user",
            ShareLevel::Group => "group",
            ShareLevel::Job => "job",
            ShareLevel::Class => "class",
        }
    }

    pub fn parse(name: &str) -> Option<ShareLevel> {
        Self::ALL.into_iter().find(|l| l.name() == name)
    }

    /// Parse a sharing order: known levels, none twice, at most
    /// `SHARE_LEVELS_MAX`.
    pub fn parse_order(names: &[String]) -> Result<Vec<ShareLevel>, String> {
        if names.len() > SHARE_LEVELS_MAX {
            return Err(format!("share: {} levels, at most {SHARE_LEVELS_MAX} (SHARE_LEVELS_MAX)", names.len()));
        }
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            let l = ShareLevel::parse(n).ok_or_else(|| format!("share: no level {n:?} (user, group, job or class)"))?;
            if out.contains(&l) {
                return Err(format!("share: {n:?} given twice"));
            }
            out.push(l);
        }
        Ok(out)
    }
}

/// The job an application belongs to: `slurm-42` for `slurm-42` and
/// `slurm-42-post` (likewise `mpi-N`, the ids a process gets by default
/// in a Slurm or MPI job); any other application is a job of its own.
pub fn job_of(app: &str) -> &str {
    for prefix in ["slurm-", "mpi-"] {
        if let Some(rest) = app.strip_prefix(prefix) {
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            if digits > 0 && rest[digits..].chars().next().is_none_or(|c| c == '-') {
                return &app[..prefix.len() + digits];
            }
        }
    }
    app
}

/// A stable 64-bit key of a name (FNV-1a).
pub fn name_key(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The path of keys of an application named `app`, of job `job` (None:
/// `job_of(app)`), connected as `uid`/`gid`, in class `class`, for a
/// sharing order (what `Scheduler::set_app_share` takes).
pub fn share_keys(order: &[ShareLevel], app: &str, job: Option<&str>, uid: u32, gid: u32, class: &str) -> Vec<u64> {
    order
        .iter()
        .map(|l| match l {
            ShareLevel::User => u64::from(uid),
            ShareLevel::Group => u64::from(gid),
            ShareLevel::Job => name_key(job.unwrap_or_else(|| job_of(app))),
            ShareLevel::Class => name_key(class),
        })
        .collect()
}

/// No group (the parent of a top-level group).
const ROOT: u32 = u32::MAX;
/// The key of the top-level group of applications with no path while
/// others have one.
const UNPLACED: u64 = u64::MAX;

struct Group {
    key: u64,
    parent: u32,
    /// Bytes dispatched for its applications.
    served: u64,
    /// What the child it chose last had been served then.
    floor: u64,
    /// Paths through it.
    refs: u32,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Path {
    len: u8,
    groups: [u32; SHARE_LEVELS_MAX],
}

impl Path {
    fn groups(&self) -> &[u32] {
        &self.groups[..usize::from(self.len)]
    }
}

/// A path's standing, compared level by level: (served, group) pairs, the
/// group breaking ties so that members of one group stay together.
pub(crate) type Rank = [(u64, u32); SHARE_LEVELS_MAX];

/// The groups of one policy and each application's path.
#[derive(Default)]
pub(crate) struct Share {
    groups: Vec<Group>,
    free: Vec<u32>,
    index: FxHashMap<(u32, u64), u32>,
    paths: FxHashMap<AppId, Path>,
    root_floor: u64,
}

impl Share {
    /// Whether any application has a path (sharing is on).
    pub fn active(&self) -> bool {
        !self.paths.is_empty()
    }

    /// Groups in use (for the bound's test).
    pub fn groups(&self) -> usize {
        self.groups.len() - self.free.len()
    }

    fn floor_of(&self, parent: u32) -> u64 {
        if parent == ROOT {
            self.root_floor
        } else {
            self.groups[parent as usize].floor
        }
    }

    fn intern(&mut self, parent: u32, key: u64) -> u32 {
        if let Some(&g) = self.index.get(&(parent, key)) {
            self.groups[g as usize].refs += 1;
            return g;
        }
        let floor = self.floor_of(parent);
        let group = Group { key, parent, served: floor, floor: 0, refs: 1 };
        let g = match self.free.pop() {
            Some(g) => {
                self.groups[g as usize] = group;
                g
            }
            None => {
                self.groups.push(group);
                (self.groups.len() - 1) as u32
            }
        };
        self.index.insert((parent, key), g);
        g
    }

    /// Put `app` on the path of `keys`, outermost first (none: off any
    /// path). At most `SHARE_LEVELS_MAX` keys (the scheduler checks).
    pub fn set(&mut self, app: AppId, keys: &[u64]) {
        debug_assert!(keys.len() <= SHARE_LEVELS_MAX);
        let mut path = Path { len: 0, groups: [ROOT; SHARE_LEVELS_MAX] };
        let mut parent = ROOT;
        for &k in keys.iter().take(SHARE_LEVELS_MAX) {
            parent = self.intern(parent, k);
            path.groups[usize::from(path.len)] = parent;
            path.len += 1;
        }
        if let Some(old) = self.paths.remove(&app) {
            self.release(old);
        }
        if path.len > 0 {
            self.paths.insert(app, path);
        }
    }

    /// An application the policy meets while sharing is on that the
    /// driver placed nowhere: one top-level group holds all such.
    pub fn place_if_unplaced(&mut self, app: AppId) {
        if !self.paths.contains_key(&app) {
            self.set(app, &[UNPLACED]);
        }
    }

    fn release(&mut self, path: Path) {
        for &g in path.groups() {
            let group = &mut self.groups[g as usize];
            group.refs -= 1;
            if group.refs == 0 {
                self.index.remove(&(group.parent, group.key));
                self.free.push(g);
            }
        }
    }

    pub fn forget(&mut self, app: AppId) {
        if let Some(old) = self.paths.remove(&app) {
            self.release(old);
        }
    }

    /// `bytes` of `app`'s were dispatched.
    pub fn charge(&mut self, app: AppId, bytes: u64) {
        if let Some(p) = self.paths.get(&app) {
            for &g in p.groups() {
                let s = &mut self.groups[g as usize].served;
                *s = s.saturating_add(bytes);
            }
        }
    }

    /// `app` became backlogged: lift its groups to their parents' floors
    /// less `slack`, so that an idle spell banks at most that much.
    pub fn activate(&mut self, app: AppId, slack: u64) {
        let Some(p) = self.paths.get(&app).copied() else { return };
        for &g in p.groups() {
            let floor = self.floor_of(self.groups[g as usize].parent).saturating_sub(slack);
            let s = &mut self.groups[g as usize].served;
            *s = (*s).max(floor);
        }
    }

    /// A turn went to `app`: each parent's floor rises to the standing of
    /// the child on its path.
    pub fn chosen(&mut self, app: AppId) {
        let Some(p) = self.paths.get(&app).copied() else { return };
        for &g in p.groups() {
            let (parent, served) = (self.groups[g as usize].parent, self.groups[g as usize].served);
            let floor = if parent == ROOT { &mut self.root_floor } else { &mut self.groups[parent as usize].floor };
            *floor = (*floor).max(served);
        }
    }

    /// `app`'s standing (an application with no path: first, as the
    /// unplaced group would be before the policy meets it).
    pub fn rank(&self, app: AppId) -> Rank {
        let mut r = [(0, 0); SHARE_LEVELS_MAX];
        if let Some(p) = self.paths.get(&app) {
            for (l, &g) in p.groups().iter().enumerate() {
                r[l] = (self.groups[g as usize].served, g);
            }
        }
        r
    }

    /// The least served of `apps`' ranks: the applications that share it
    /// are in the group whose turn it is.
    pub fn least(&self, apps: impl Iterator<Item = AppId>) -> Option<Rank> {
        apps.map(|a| self.rank(a)).min()
    }

    /// How far `app`'s path may run ahead before another group would be
    /// chosen: at the deepest level where some of `others` compete with
    /// it (same groups above, another at that level), the least served
    /// competitor's bytes less its own. None: no competitor.
    pub fn lead(&self, app: AppId, others: impl Iterator<Item = AppId>) -> Option<u64> {
        let mine = self.paths.get(&app)?;
        let mut best: Option<(usize, u64)> = None;
        for o in others {
            let Some(p) = self.paths.get(&o) else { continue };
            let same = mine.groups().iter().zip(p.groups()).take_while(|(a, b)| a == b).count();
            if same >= usize::from(mine.len) || same >= usize::from(p.len) {
                continue;
            }
            let (g, m) = (p.groups[same], mine.groups[same]);
            let gap = self.groups[g as usize].served.saturating_sub(self.groups[m as usize].served);
            best = match best {
                Some((l, b)) if l > same || (l == same && b <= gap) => Some((l, b)),
                _ => Some((same, gap)),
            };
        }
        best.map(|(_, gap)| gap)
    }

    /// Each application's path as (served, key) per level (for tests and
    /// the invariant check).
    pub fn check(&self) {
        let mut refs = vec![0u32; self.groups.len()];
        for p in self.paths.values() {
            assert!(p.len > 0 && usize::from(p.len) <= SHARE_LEVELS_MAX, "share path length");
            for (l, &g) in p.groups().iter().enumerate() {
                refs[g as usize] += 1;
                let parent = self.groups[g as usize].parent;
                assert_eq!(parent, if l == 0 { ROOT } else { p.groups[l - 1] }, "share group's parent");
            }
        }
        for (g, group) in self.groups.iter().enumerate() {
            if self.free.contains(&(g as u32)) {
                continue;
            }
            assert_eq!(group.refs, refs[g], "share group {g}'s paths");
            assert_eq!(self.index.get(&(group.parent, group.key)), Some(&(g as u32)), "share index of group {g}");
        }
        assert_eq!(self.index.len(), self.groups(), "share index size");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_come_from_slurm_and_mpi_ids() {
        assert_eq!(job_of("slurm-42"), "slurm-42");
        assert_eq!(job_of("slurm-42-post"), "slurm-42");
        assert_eq!(job_of("mpi-12-rank"), "mpi-12");
        assert_eq!(job_of("slurm-42x"), "slurm-42x", "not a job number");
        assert_eq!(job_of("slurm-x"), "slurm-x");
        assert_eq!(job_of("cat-1"), "cat-1");
        let order = ShareLevel::parse_order(&["user".into(), "job".into()]).unwrap();
        assert_eq!(share_keys(&order, "slurm-7-a", None, 5, 0, "default"), share_keys(&order, "slurm-7", None, 5, 9, "x"));
        assert_ne!(share_keys(&order, "slurm-7", None, 5, 0, "default"), share_keys(&order, "slurm-8", None, 5, 0, "default"));
    }

    #[test]
    fn groups_are_shared_by_paths_and_freed_with_the_last() {
        let mut s = Share::default();
        s.set(AppId(1), &[10, 1]);
        s.set(AppId(2), &[10, 2]);
        s.set(AppId(3), &[20, 3]);
        assert_eq!(s.groups(), 5);
        s.check();
        s.forget(AppId(1));
        assert_eq!(s.groups(), 4, "job 1 freed, user 10 kept for app 2");
        s.set(AppId(2), &[]);
        s.forget(AppId(3));
        assert_eq!(s.groups(), 0);
        assert!(!s.active());
        s.check();
    }

    #[test]
    fn the_least_served_user_then_job_goes_first() {
        let mut s = Share::default();
        // User 10 runs one job, user 20 four.
        s.set(AppId(1), &[10, 1]);
        for j in 2..6 {
            s.set(AppId(j), &[20, u64::from(j)]);
        }
        let all = || (1..6).map(AppId);
        let mut turns = [0u32; 6];
        for _ in 0..100 {
            let least = s.least(all()).unwrap();
            let app = all().find(|&a| s.rank(a) == least).unwrap();
            turns[app.0 as usize] += 1;
            s.chosen(app);
            s.charge(app, 1 << 20);
        }
        assert_eq!(turns[1], 50, "{turns:?}");
        assert!(turns[2..].iter().all(|&t| t == 12 || t == 13), "{turns:?}");
    }

    #[test]
    fn an_idle_group_banks_at_most_the_slack() {
        let mut s = Share::default();
        s.set(AppId(1), &[10]);
        s.set(AppId(2), &[20]);
        for _ in 0..100 {
            s.chosen(AppId(1));
            s.charge(AppId(1), 1 << 20);
        }
        s.activate(AppId(2), 4 << 20);
        let (a, b) = (s.rank(AppId(1))[0].0, s.rank(AppId(2))[0].0);
        assert_eq!(a - b, (4 << 20) + (1 << 20), "behind by the slack and the last turn");
        // A group new to the level starts at its floor.
        s.set(AppId(3), &[30]);
        assert_eq!(s.rank(AppId(3))[0].0, 99 << 20);
    }
}
