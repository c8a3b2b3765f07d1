//! The server's monotonic clock: nanoseconds since it started, the time
//! base of the scheduler (which never reads a clock itself), and one
//! reading of it in both forms (`Now`), which the event loop takes once
//! per turn and passes down.

#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The monotonic clock the scheduler is driven by: nanoseconds since the
/// server started. Only drivers read it; the core gets `now` passed in.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
    /// Simulated time (tests that drive the event loop, `evloop/sim/`):
    /// nanoseconds the test sets.
    #[cfg(test)]
    manual: Option<&'static AtomicU64>,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            start: Instant::now(),
            #[cfg(test)]
            manual: None,
        }
    }

    /// A clock that reads what the test stored in `ns`.
    #[cfg(test)]
    pub fn manual(ns: &'static AtomicU64) -> Clock {
        Clock { start: Instant::now(), manual: Some(ns) }
    }

    pub fn now(&self) -> u64 {
        #[cfg(test)]
        if let Some(ns) = self.manual {
            return ns.load(Ordering::SeqCst);
        }
        self.start.elapsed().as_nanos() as u64
    }

    /// Read the clock once: the instant (for the loop's deadlines) and the
    /// scheduler's nanoseconds of that same instant.
    pub fn read(&self) -> Now {
        #[cfg(test)]
        if let Some(ns) = self.manual {
            let ns = ns.load(Ordering::SeqCst);
            return Now { at: self.start + std::time::Duration::from_nanos(ns), ns };
        }
        let at = Instant::now();
        Now { at, ns: at.saturating_duration_since(self.start).as_nanos() as u64 }
    }
}

/// One reading of the clock.
#[derive(Clone, Copy, Debug)]
pub struct Now {
    pub at: Instant,
    /// `at` as the scheduler's nanoseconds (`Clock::now`).
    pub ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_gives_the_same_instant_in_both_forms() {
        let c = Clock::new();
        let before = c.now();
        let n = c.read();
        let after = c.now();
        assert!(before <= n.ns && n.ns <= after, "{before} {} {after}", n.ns);
        assert_eq!(n.ns, n.at.duration_since(c.start).as_nanos() as u64);
    }
}
