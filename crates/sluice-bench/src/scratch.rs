//! Scratch directories that go away however a benchmark ends: when their
//! `Scratch` is dropped, and when the process is stopped by SIGINT,
//! SIGTERM or SIGHUP (a Ctrl-C in the terminal), where no destructor runs.
//!
//! The first `Scratch` installs a handler for those signals (unless the
//! process ignores one, as a background job of a script ignores SIGINT).
//! The handler only writes the signal's number to a pipe, which is
//! async-signal-safe. A thread reading the pipe removes every live scratch
//! directory, then restores the signal's default action and raises it
//! again, so the process ends as the signal would have ended it. Handlers
//! are reset when a child execs, so the workers a benchmark starts keep
//! the default actions (a signal mask would be inherited, which is why
//! none is used).
//!
//! Bounds: at most `SCRATCH_LIVE_MAX` directories are registered at once;
//! one beyond is still removed on drop, but not on a signal.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, Once};

/// Scratch directories registered at once.
pub const SCRATCH_LIVE_MAX: usize = 64;

/// The signals after which the scratch directories are removed.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The live scratch directories, at most `max`.
struct Registry {
    live: Vec<PathBuf>,
    max: usize,
}

impl Registry {
    const fn new(max: usize) -> Registry {
        Registry { live: Vec::new(), max }
    }

    /// Whether `path` was registered (false at the bound).
    fn add(&mut self, path: &Path) -> bool {
        if self.live.len() >= self.max {
            return false;
        }
        self.live.push(path.to_path_buf());
        true
    }

    fn remove(&mut self, path: &Path) {
        if let Some(i) = self.live.iter().position(|p| p == path) {
            self.live.swap_remove(i);
        }
    }
}

static LIVE: Mutex<Registry> = Mutex::new(Registry::new(SCRATCH_LIVE_MAX));
static INSTALL: Once = Once::new();
/// The pipe's write end, for the handler (-1 until installed).
static PIPE_W: AtomicI32 = AtomicI32::new(-1);

/// A directory removed, with everything in it, when this is dropped or
/// the process is stopped by a signal. It need not exist yet.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
    registered: bool,
}

impl Scratch {
    pub fn new(path: impl Into<PathBuf>) -> Scratch {
        INSTALL.call_once(install);
        let path = path.into();
        let registered = LIVE.lock().unwrap_or_else(|e| e.into_inner()).add(&path);
        Scratch { path, registered }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a signal would remove it too (false past `SCRATCH_LIVE_MAX`).
    pub fn removed_on_signal(&self) -> bool {
        self.registered
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.registered {
            LIVE.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.path);
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = PIPE_W.load(Ordering::Relaxed);
    let byte = sig as u8;
    // SAFETY: write(2) is async-signal-safe; one byte from a live local.
    unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
}

fn install() {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills the two descriptors of a live array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    PIPE_W.store(fds[1], Ordering::Relaxed);
    let read_end = fds[0];
    let spawned = std::thread::Builder::new().name("sluice-scratch".into()).spawn(move || {
        let mut byte = 0u8;
        loop {
            // SAFETY: read(2) into a live one-byte buffer.
            match unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) } {
                1 => break,
                -1 if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => continue,
                _ => return,
            }
        }
        let live = std::mem::take(&mut LIVE.lock().unwrap_or_else(|e| e.into_inner()).live);
        for p in &live {
            let _ = std::fs::remove_dir_all(p);
        }
        let sig = libc::c_int::from(byte);
        // SAFETY: restore the default action and raise the signal again,
        // so that the process ends as it would have.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    });
    if spawned.is_err() {
        return;
    }
    for sig in SIGNALS {
        // SAFETY: sigaction with null `act` only reads the current action.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
        if old.sa_sigaction == libc::SIG_IGN {
            continue;
        }
        // SAFETY: the handler only writes to a pipe (async-signal-safe).
        unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_holds_n_and_refuses_n_plus_one() {
        let mut r = Registry::new(3);
        let p = |k: u32| PathBuf::from(format!("/x/{k}"));
        assert!((0..3).all(|k| r.add(&p(k))), "N registered");
        assert!(!r.add(&p(3)), "N+1 refused");
        r.remove(&p(1));
        assert!(r.add(&p(3)), "room again once one is dropped");
        assert_eq!(r.live.len(), 3);
    }

    #[test]
    fn a_scratch_is_removed_on_drop_whatever_is_in_it() {
        let path = std::env::temp_dir().join(format!("sluice-scratch-test-{}", std::process::id()));
        let s = Scratch::new(&path);
        std::fs::create_dir_all(path.join("inside")).unwrap();
        std::fs::write(path.join("inside/f"), b"x").unwrap();
        assert!(s.removed_on_signal());
        drop(s);
        assert!(!path.exists());
        assert!(!LIVE.lock().unwrap().live.contains(&path), "unregistered on drop");
    }
}
