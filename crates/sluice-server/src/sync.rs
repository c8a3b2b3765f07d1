//! Locking that survives a panicking thread.

use std::sync::{Mutex, MutexGuard};

/// Lock a mutex, recovering the data if a panicking thread poisoned it: the
/// tables stay consistent because every update is a single insert/remove.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
