//! One server connection per calling process and identity, so the
//! scheduler sees each process as its own stream and the server checks
//! each caller's own rights. A mount run by root forwards the identity the
//! kernel gave for each request (uid, gid, and the groups of the calling
//! process from `/proc`); a mount run by a user acts as that user for
//! everyone, as any user-mounted FUSE file system does.
//!
//! The table is bounded by `CONNECTIONS_MAX`; past it the least recently
//! used connection is dropped from the table (requests still running on it
//! keep it alive through their `Arc`). Kernel-initiated requests (pid 0)
//! share one connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sluice_client::ConnectOptions;
use sluice_remote::{Remote, RemoteKind};

/// Connections kept at once.
pub const CONNECTIONS_MAX: usize = 256;

struct Entry {
    client: Arc<Remote>,
    used: u64,
}

pub(crate) struct Conns {
    server: String,
    /// A single server or a cluster: asked once, at mount.
    kind: RemoteKind,
    app: Option<String>,
    table: Mutex<(HashMap<Caller, Entry>, u64)>,
    /// Whether callers' identities are forwarded (the mount runs as root).
    forward: bool,
}

/// Who is calling: a process and the identity it calls with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Caller {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Conns {
    pub fn new(server: String, kind: RemoteKind, app: Option<String>) -> Conns {
        // SAFETY: geteuid has no preconditions.
        let forward = unsafe { libc::geteuid() } == 0;
        Conns { server, kind, app, table: Mutex::new((HashMap::new(), 0)), forward }
    }

    /// The connection of `caller`, opened on first use.
    pub fn get(&self, caller: Caller) -> Result<Arc<Remote>, sluice_client::ClientError> {
        let pid = caller.pid;
        {
            let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
            t.1 += 1;
            let tick = t.1;
            if let Some(e) = t.0.get_mut(&caller) {
                e.used = tick;
                return Ok(Arc::clone(&e.client));
            }
        }
        let cred = self.forward.then(|| sluice_client::Cred { uid: caller.uid, gid: caller.gid, groups: groups_of(pid) });
        let opts = ConnectOptions { app: Some(self.app.clone().unwrap_or_else(|| app_of(pid))), client_id: Some(pid), cred, ..ConnectOptions::default() };
        let client = Arc::new(self.connect_patiently(opts)?);
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if t.0.len() >= CONNECTIONS_MAX && !t.0.contains_key(&caller) {
            let oldest = t.0.iter().min_by_key(|(_, e)| e.used).map(|(&p, _)| p);
            if let Some(p) = oldest {
                t.0.remove(&p);
            }
        }
        t.1 += 1;
        let used = t.1;
        t.0.entry(caller).or_insert(Entry { client: Arc::clone(&client), used });
        crate::stats::STATS.connections.store(t.0.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(client)
    }

    /// Connect for a new caller. The server answered at mount time, so a
    /// server not there now is an outage, not a mistake: wait for it as
    /// the client library waits after a break (hard: for as long as it
    /// takes, saying so once after the timeout; soft: ETIMEDOUT then).
    fn connect_patiently(&self, opts: ConnectOptions) -> Result<Remote, sluice_client::ClientError> {
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(20);
        let mut warned = false;
        loop {
            match Remote::connect_as(&self.server, self.kind, opts.clone()) {
                Err(e) if e.errno == libc::ECONNREFUSED || e.errno == libc::ENOENT => {
                    if started.elapsed() >= opts.timeout {
                        if opts.recovery == sluice_client::Recovery::Soft {
                            return Err(sluice_client::ClientError::new(
                                sluice_client::ClientErrorKind::Timeout,
                                libc::ETIMEDOUT,
                                format!("{} (for {:?})", e.message, opts.timeout),
                            ));
                        }
                        if !warned {
                            eprintln!("sluice: server {} not responding, still trying", self.server);
                            warned = true;
                        }
                    }
                    // The caller may die meanwhile: it must not wait for
                    // the server too (`crate::fs::watch`).
                    sluice_client::abandonable_sleep(pause, "connecting to the server")?;
                    pause = (pause * 2).min(std::time::Duration::from_secs(1));
                }
                other => {
                    if warned && other.is_ok() {
                        eprintln!("sluice: server {} OK", self.server);
                    }
                    return other;
                }
            }
        }
    }

    /// Forget a connection that failed, so the next call reconnects.
    pub fn drop_conn(&self, caller: Caller) {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.0.remove(&caller);
        crate::stats::STATS.connections.store(t.0.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.lock().unwrap().0.len()
    }
}

/// Supplementary groups of process `pid` (`Groups:` in `/proc/PID/status`),
/// at most `CRED_GROUPS_MAX`; none when the process is gone.
pub(crate) fn groups_of(pid: u32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:")).unwrap_or("");
    line.split_whitespace().filter_map(|g| g.parse().ok()).take(sluice_client::CRED_GROUPS_MAX).collect()
}

/// The application id of process `pid`, read from /proc: the client's one
/// rule (`sluice_client::app_id`), so a process is the same application
/// through the mount as through the library or `sluice run`.
pub(crate) fn app_of(pid: u32) -> String {
    if pid == 0 {
        return "kernel".into();
    }
    let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let var = |name: &str| env.split(|&b| b == 0).find_map(|kv| kv.strip_prefix(format!("{name}=").as_bytes()).map(|v| String::from_utf8_lossy(v).into_owned()));
    let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
        return format!("pid-{pid}");
    };
    // SAFETY: getsid only reads a process's session id.
    let sid = unsafe { libc::getsid(pid as libc::pid_t) };
    sluice_client::app_id(var, comm.trim(), sid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_of_reads_the_callers_environment() {
        // This test process, read through /proc as the mount reads a
        // caller: the same id the library gives it for itself.
        let me = std::process::id();
        let name = app_of(me);
        assert_eq!(name, sluice_client::default_app(), "one rule, whoever asks");
        assert_eq!(app_of(0), "kernel");
        assert!(app_of(u32::MAX).starts_with("pid-"), "a vanished process has a fallback name");
    }
}
