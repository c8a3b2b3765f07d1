//! The partial-frame budget (`partial_bytes_max`, all connections
//! together): every body being received reserves its whole length here
//! when its header arrives (so bodies never wait for each other half-way,
//! which could leave the budget spent by frames none of which can finish),
//! and allocates it chunk by chunk as bytes arrive. Connections whose body
//! found the budget spent wait on its list until bytes come back.
//!
//! Invariant: `allocated ≤ held ≤ max`.

/// The budget and the connections waiting for it.
pub struct Budget {
    /// Reserved by bodies in progress.
    held: u64,
    max: u64,
    /// Allocated by them (≤ `held`): what `ServerHandle::partial_bytes`
    /// reports.
    allocated: u64,
    /// Connections paused until the budget has room (each at most once).
    waiting: Vec<u64>,
}

impl Budget {
    pub fn new(max: u64) -> Budget {
        Budget { held: 0, max, allocated: 0, waiting: Vec::new() }
    }

    /// Reserve `n` bytes; `false` (nothing taken) past `max`.
    pub fn take(&mut self, n: u64) -> bool {
        if self.held + n > self.max {
            return false;
        }
        self.held += n;
        true
    }

    /// Give back `n` reserved bytes; whether a connection waits for them.
    pub fn give(&mut self, n: u64) -> bool {
        self.held -= n;
        n > 0 && !self.waiting.is_empty()
    }

    /// Bytes reserved by bodies in progress.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Bytes allocated by bodies changed by `delta`; the new total.
    pub fn allocate(&mut self, delta: i64) -> u64 {
        self.allocated = self.allocated.checked_add_signed(delta).expect("allocations balance");
        self.allocated
    }

    /// Connection `id` waits for room.
    pub fn wait(&mut self, id: u64) {
        if !self.waiting.contains(&id) {
            self.waiting.push(id);
        }
    }

    /// Every waiting connection, now no longer waiting.
    pub fn take_waiting(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.waiting)
    }

    /// Connection `id` is gone (or, with every one, the loop stops).
    pub fn forget(&mut self, id: u64) {
        self.waiting.retain(|&w| w != id);
    }

    pub fn forget_all(&mut self) {
        self.waiting.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_takes_max_bytes_and_refuses_one_more() {
        let mut b = Budget::new(100);
        assert!(b.take(60));
        assert!(b.take(40), "N: exactly max");
        assert!(!b.take(1), "N+1: refused");
        b.wait(7);
        b.wait(7);
        assert!(b.give(1), "a connection waits");
        assert!(b.take(1));
        assert_eq!(b.take_waiting(), vec![7], "listed once");
        assert!(!b.give(100), "nobody waits");
        assert!(b.take(100));
    }

    #[test]
    fn allocations_balance() {
        let mut b = Budget::new(10);
        assert!(b.take(10));
        assert_eq!(b.allocate(4), 4);
        assert_eq!(b.allocate(6), 10);
        assert_eq!(b.allocate(-10), 0);
    }
}
