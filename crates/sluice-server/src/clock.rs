//! The server's monotonic clock: nanoseconds since it started, the time
//! base of the scheduler (which never reads a clock itself).

use std::time::Instant;

/// The monotonic clock the scheduler is driven by: nanoseconds since the
/// server started. Only drivers read it; the core gets `now` passed in.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock { start: Instant::now() }
    }

    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
}
