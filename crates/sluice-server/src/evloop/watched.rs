//! The doorbells the loop watches (at most `doorbells_watched_max`), and
//! whether spinning before a sleep pays (`SpinCredit`): the state of
//! `doorbells.rs`, kept apart so that the loop's state can hold it.

use std::sync::Arc;
use std::time::Duration;

use crate::shm::Shm;

/// How long the loop spins before sleeping while dispatches are on the
/// ring (`EventLoop::spin`): about one 4 KiB O_DIRECT read on the 2-core VM.
pub const SPIN: Duration = Duration::from_micros(50);
/// The longest dispatch (as the learned model predicts its service) that
/// the loop spins for: twice `SPIN`.
pub const SPIN_DISPATCH_NS: u64 = 100_000;
/// Spins that saw nothing before the loop stops spinning, and the sleeps
/// after which it tries again.
const SPIN_CREDIT_MAX: u32 = 4;
const SPIN_RETRY: u32 = 64;
/// How long the loop spins, with nothing on the ring, for the next request
/// of a client it has just answered in its post record (`EventLoop::spin`):
/// a woken client's next request comes 15-30 us later on the 2-core VM,
/// and a sleep would cost it a `Nudge` and the loop a wake-up.
pub const SPIN_IDLE: Duration = Duration::from_micros(50);
/// An idle spin's request that came sooner than this after the answer was
/// ready before it (a client that pipelines, answered one by one): the
/// spin did not pay. A blocking client takes longer to be woken and ask
/// again (15-30 us here).
pub const SPIN_IDLE_QUICK: Duration = Duration::from_micros(2);

/// Whether the loop spins before a sleep (`EventLoop::spin`): credit for
/// spins that saw something, at most `SPIN_CREDIT_MAX`; at none, one try
/// every `SPIN_RETRY` sleeps.
#[derive(Debug)]
pub struct SpinCredit {
    credit: u32,
    skipped: u32,
}

impl Default for SpinCredit {
    fn default() -> SpinCredit {
        SpinCredit { credit: SPIN_CREDIT_MAX, skipped: 0 }
    }
}

impl SpinCredit {
    /// Whether this sleep may be spun for.
    pub fn may_spin(&mut self) -> bool {
        if self.credit > 0 {
            return true;
        }
        self.skipped += 1;
        if self.skipped < SPIN_RETRY {
            return false;
        }
        self.skipped = 0;
        true
    }

    /// A spin saw something (`true`) or spun for nothing.
    pub fn paid(&mut self, saw: bool) {
        self.credit = if saw { (self.credit + 1).min(SPIN_CREDIT_MAX) } else { self.credit.saturating_sub(1) };
    }
}

/// The watched doorbells, and whether spinning pays.
#[derive(Default)]
pub struct Doorbells {
    /// Connections whose doorbells the loop looks at on every turn (rung
    /// requests; at most `doorbells_watched_max`), with their regions, so
    /// that a turn looks at each doorbell without finding its connection.
    pub watched: Vec<(u64, Arc<Shm>)>,
    pub spin_credit: SpinCredit,
    /// Whether idle spins (`SPIN_IDLE`) pay: its own credit, as a request
    /// that follows an answer is a different bet from a completion.
    pub idle_credit: SpinCredit,
    /// The region of the solo client whose last request the turn
    /// answered in its post record (`EventLoop::spin`).
    pub posted: Option<Arc<Shm>>,
    /// The last dispatch put on the ring is one the learned model expects
    /// back within `SPIN_DISPATCH_NS`.
    pub spin_short: bool,
}

impl Doorbells {
    pub fn any(&self) -> bool {
        !self.watched.is_empty()
    }

    /// Mark every watched doorbell watched or not.
    pub fn set_watched(&self, on: bool) {
        for (_, shm) in &self.watched {
            shm.set_watched(on);
        }
    }

    /// Watch connection `id`'s doorbell if fewer than `max` are; whether
    /// it is watched now. The count watched.
    pub fn watch(&mut self, id: u64, shm: &Arc<Shm>, max: usize) -> Option<usize> {
        if self.watched.len() >= max {
            return None;
        }
        shm.set_watched(true);
        self.watched.push((id, Arc::clone(shm)));
        Some(self.watched.len())
    }

    /// Connection `id` is gone; the count watched.
    pub fn forget(&mut self, id: u64) -> usize {
        self.watched.retain(|(w, _)| *w != id);
        self.watched.len()
    }

    /// Watch none any more (the drain); the connections that were.
    pub fn unwatch_all(&mut self) -> Vec<u64> {
        self.set_watched(false);
        std::mem::take(&mut self.watched).into_iter().map(|(id, _)| id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{Doorbells, SpinCredit, SPIN_CREDIT_MAX, SPIN_RETRY};
    use crate::shm::{Shm, SHM_REGION_MIN};
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;

    #[test]
    fn doorbells_watched_bound_at_n_and_n_plus_one() {
        let total = Arc::new(AtomicU64::new(0));
        let (shm, _fd) = Shm::create(SHM_REGION_MIN as usize, &total).unwrap();
        let shm = Arc::new(shm);
        let mut d = Doorbells::default();
        assert_eq!(d.watch(1, &shm, 2), Some(1));
        assert_eq!(d.watch(2, &shm, 2), Some(2), "N: the bound");
        assert_eq!(d.watch(3, &shm, 2), None, "N+1: not watched");
        assert_eq!(d.forget(1), 1);
        assert_eq!(d.unwatch_all(), vec![2]);
        assert!(!d.any());
    }

    #[test]
    fn spinning_stops_after_spin_credit_max_vain_spins_and_retries_every_spin_retry_sleeps() {
        let mut s = SpinCredit::default();
        // N vain spins are allowed; after them, none ...
        for _ in 0..SPIN_CREDIT_MAX {
            assert!(s.may_spin());
            s.paid(false);
        }
        // ... for SPIN_RETRY - 1 sleeps, then one try.
        for _ in 0..SPIN_RETRY - 1 {
            assert!(!s.may_spin());
        }
        assert!(s.may_spin(), "the retry");
        // A spin that saw something earns the next one back.
        s.paid(true);
        assert!(s.may_spin());
        s.paid(false);
        assert!(!s.may_spin(), "credit spent again");
        // Credit is bounded: any number of good spins buys SPIN_CREDIT_MAX vain ones.
        let mut s = SpinCredit::default();
        for _ in 0..100 {
            s.paid(true);
        }
        for _ in 0..SPIN_CREDIT_MAX {
            assert!(s.may_spin());
            s.paid(false);
        }
        assert!(!s.may_spin());
    }
}
