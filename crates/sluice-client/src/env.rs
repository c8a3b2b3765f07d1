//! The environment and the caller's identity: which server (`SLUICE_SERVER`),
//! which application (`SLUICE_APP`, the batch job, else the program and
//! its session), and the credentials a connection states.

use super::*;

/// This process's effective uid, gid and supplementary groups.
pub fn own_cred() -> Cred {
    // SAFETY: geteuid/getegid cannot fail; getgroups fills at most n.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let mut groups = vec![0 as libc::gid_t; sluice_proto::CRED_GROUPS_MAX];
    // SAFETY: groups holds CRED_GROUPS_MAX entries.
    let n = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
    groups.truncate(n.max(0) as usize);
    Cred { uid, gid, groups }
}

/// The server address: `explicit` (from `--server`), else `SLUICE_SERVER`.
pub fn server_addr(explicit: Option<&str>) -> Result<String> {
    if let Some(a) = explicit {
        return Ok(a.to_string());
    }
    std::env::var(SERVER_ENV).map_err(|_| ClientError::invalid(format!("no sluice server given: pass --server ADDR or set {SERVER_ENV}")))
}

/// The application a process belongs to, from its environment (`var`),
/// its command name and its session: the one rule every access path uses
/// (the library and the interposer for themselves, the mount for each
/// caller), so one program started one way is one application whichever
/// way it reaches sluice. In order:
/// 1. `SLUICE_APP`, as given;
/// 2. the batch job: `slurm-$SLURM_JOB_ID`;
/// 3. the MPI job, so that every rank of one `mpirun` is one application:
///    `mpi-$PMIX_NAMESPACE` (OpenMPI, any PMIx launcher), else
///    `mpi-$OMPI_MCA_ess_base_jobid`;
/// 4. the command name and the session id (`cat-4242`): two shells'
///    programs are two applications.
pub fn app_id(var: impl Fn(&str) -> Option<String>, command: &str, session: i32) -> String {
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    if let Some(a) = set(APP_ENV) {
        return a;
    }
    if let Some(j) = set("SLURM_JOB_ID") {
        return format!("slurm-{j}");
    }
    if let Some(ns) = set("PMIX_NAMESPACE").or_else(|| set("OMPI_MCA_ess_base_jobid")) {
        return format!("mpi-{ns}");
    }
    format!("{}-{session}", if command.is_empty() { "unknown" } else { command })
}

/// This process's application (`app_id` of its own environment, command
/// name and session).
pub fn default_app() -> String {
    let command = std::fs::read_to_string("/proc/self/comm")
        .map(|c| c.trim().to_string())
        .ok()
        .or_else(|| std::env::args().next().and_then(|a| std::path::Path::new(&a).file_name().map(|f| f.to_string_lossy().into_owned())))
        .unwrap_or_default();
    // SAFETY: getsid(0) only reads the caller's session id.
    let sid = unsafe { libc::getsid(0) };
    app_id(|k| std::env::var(k).ok(), &command, sid)
}

#[cfg(test)]
mod app_id_tests {
    use super::app_id;

    #[test]
    fn app_id_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        assert_eq!(app_id(env(&[("SLUICE_APP", "climate"), ("SLURM_JOB_ID", "7"), ("PMIX_NAMESPACE", "ns")]), "cat", 42), "climate");
        assert_eq!(app_id(env(&[("SLURM_JOB_ID", "7"), ("PMIX_NAMESPACE", "ns")]), "cat", 42), "slurm-7");
        assert_eq!(app_id(env(&[("PMIX_NAMESPACE", "prterun-h-1234@1"), ("OMPI_MCA_ess_base_jobid", "9")]), "python3", 42), "mpi-prterun-h-1234@1");
        assert_eq!(app_id(env(&[("OMPI_MCA_ess_base_jobid", "9")]), "python3", 42), "mpi-9");
        assert_eq!(app_id(env(&[("SLUICE_APP", "")]), "cat", 42), "cat-42", "an empty value is not set");
        assert_eq!(app_id(env(&[]), "", 7), "unknown-7");
    }
}
