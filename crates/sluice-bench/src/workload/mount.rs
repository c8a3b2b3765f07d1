//! A real FUSE mount of a started server for `--via mount`: the `sluice`
//! executable run as `sluice mount` in a child process, waited for until
//! the kernel lists the mount, and unmounted when dropped (error paths
//! included), so no benchmark leaves a mount behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::WorkloadError;

/// How long the mount may take to appear.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long an unmount by SIGTERM may take before the mount is killed
/// and detached lazily.
const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(10);

/// A mount of a server, for as long as this lives.
pub struct Mounted {
    child: Child,
    dir: PathBuf,
}

impl Mounted {
    /// Mount the server at `addr` on `dir` (made if missing) with the
    /// `sluice` executable `exe`.
    pub fn start(exe: &Path, addr: &str, dir: &Path) -> Result<Mounted, WorkloadError> {
        std::fs::create_dir_all(dir).map_err(|e| WorkloadError::io(format!("create {}", dir.display()), e))?;
        let child = Command::new(exe)
            .args(["mount", "--server", addr])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| WorkloadError::io(format!("start {} mount", exe.display()), e))?;
        let mut m = Mounted { child, dir: dir.to_path_buf() };
        let since = Instant::now();
        while !is_mounted(dir) {
            if let Ok(Some(st)) = m.child.try_wait() {
                return Err(WorkloadError::usage(format!("sluice mount on {} exited before mounting ({st})", dir.display())));
            }
            if since.elapsed() > MOUNT_TIMEOUT {
                return Err(WorkloadError::usage(format!("sluice mount on {} did not appear within {MOUNT_TIMEOUT:?}", dir.display())));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(m)
    }

    /// The mount point.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let since = Instant::now();
        while since.elapsed() < UNMOUNT_TIMEOUT {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if is_mounted(&self.dir) {
            let _ = Command::new("fusermount3").args(["-u", "-z"]).arg(&self.dir).status();
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Whether `dir` is a mount point in this process's namespace
/// (/proc/self/mountinfo's fifth field; paths there escape spaces).
fn is_mounted(dir: &Path) -> bool {
    let want = dir.to_string_lossy().replace(' ', "\\040");
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|t| t.lines().any(|l| l.split(' ').nth(4) == Some(want.as_str())))
}
