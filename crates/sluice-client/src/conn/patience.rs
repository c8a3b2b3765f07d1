//! How long a call waits for a silent server, and what it says meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long a call waits for a silent server, and what it does then.
#[derive(Debug)]
pub(crate) struct Patience {
    pub timeout: Duration,
    /// Fail with ETIMEDOUT at the timeout (else keep waiting).
    pub soft: bool,
    /// "not responding" was said for the current outage.
    pub warned: AtomicBool,
}

impl Patience {
    /// Say once per outage that the server is not responding.
    pub(crate) fn warn(&self, addr: &str) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            eprintln!("sluice: server {addr} not responding, still trying");
        }
    }

    /// The server answered again: say so if it was reported silent.
    pub(crate) fn answered(&self, addr: &str) {
        if self.warned.load(Ordering::Relaxed) && self.warned.swap(false, Ordering::Relaxed) {
            eprintln!("sluice: server {addr} OK");
        }
    }
}
