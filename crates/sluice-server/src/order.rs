//! The order of O_DIRECT writes (`DirectOrder`), shared by the executor's
//! workers, the event loop's ring and the metadata calls that change a
//! file's size.

use std::sync::{Condvar, Mutex, MutexGuard};

/// The order of O_DIRECT writes. A write that reads back an edge block,
/// or fixes the file's size after writing whole blocks past its end,
/// runs alone, so that no write to the same blocks and no write past the
/// end races with it. A write of whole blocks at both ends does neither
/// and runs shared, side by side with others (the scheduler never has two
/// overlapping writes out). Unlike a `RwLock`, a share can be taken
/// without waiting and given back from another turn of the event loop
/// (`try_share` / `unshare`): the ring holds one from a write's
/// submission to its completion, and never blocks the loop. A write
/// waiting to run alone stops new shares, so it is not starved.
#[derive(Default)]
pub struct DirectOrder {
    state: Mutex<OrderState>,
    changed: Condvar,
}

#[derive(Default)]
struct OrderState {
    shares: usize,
    alone: bool,
    waiting_alone: usize,
}

/// A share of a `DirectOrder` held until dropped.
pub struct ShareGuard<'a>(&'a DirectOrder);

/// A `DirectOrder` held alone until dropped.
pub struct AloneGuard<'a>(&'a DirectOrder);

impl DirectOrder {
    fn state(&self) -> MutexGuard<'_, OrderState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, OrderState>) -> MutexGuard<'a, OrderState> {
        self.changed.wait(g).unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for a share (while a write runs alone or waits to).
    pub fn shared(&self) -> ShareGuard<'_> {
        let mut s = self.state();
        while s.alone || s.waiting_alone > 0 {
            s = self.wait(s);
        }
        s.shares += 1;
        ShareGuard(self)
    }

    /// Wait to run alone (until every share is given back).
    pub fn alone(&self) -> AloneGuard<'_> {
        let mut s = self.state();
        s.waiting_alone += 1;
        while s.alone || s.shares > 0 {
            s = self.wait(s);
        }
        s.waiting_alone -= 1;
        s.alone = true;
        AloneGuard(self)
    }

    /// Take a share now if one is free; `false`: a write runs alone or
    /// waits to. Give it back with `unshare`.
    pub fn try_share(&self) -> bool {
        let mut s = self.state();
        if s.alone || s.waiting_alone > 0 {
            return false;
        }
        s.shares += 1;
        true
    }

    /// Give back a share `try_share` took.
    pub fn unshare(&self) {
        let mut s = self.state();
        s.shares = s.shares.checked_sub(1).expect("unshare without a share");
        if s.shares == 0 {
            self.changed.notify_all();
        }
    }

    /// Shares held now (tests).
    #[cfg(test)]
    pub fn shares(&self) -> usize {
        self.state().shares
    }

    /// Writes waiting to run alone now (tests).
    #[cfg(test)]
    pub fn waiting_alone(&self) -> usize {
        self.state().waiting_alone
    }
}

impl Drop for ShareGuard<'_> {
    fn drop(&mut self) {
        self.0.unshare();
    }
}

impl Drop for AloneGuard<'_> {
    fn drop(&mut self) {
        self.0.state().alone = false;
        self.0.changed.notify_all();
    }
}
