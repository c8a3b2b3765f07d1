//! Software prefetch: ask the processor to start loading a record's cache
//! lines without waiting for them. A hint only; it changes no result.
//!
//! The simulator knows a few events ahead which server an arriving request
//! will reach (`sluice_sim`'s `World::prefetch_ahead`); at 10^4 servers
//! each server's scheduler state is cold by then, and its first loads are
//! cache and TLB misses one after another. [`crate::Scheduler::prefetch_arrival`]
//! names those records so that their misses overlap.

/// Bring `r`'s cache lines in (all of them, for a record larger than one).
#[inline(always)]
pub fn prefetch<T>(r: &T) {
    prefetch_val(r);
}

/// `prefetch` for a record whose size is known at run time only (a trait
/// object).
#[inline(always)]
pub fn prefetch_val<T: ?Sized>(r: &T) {
    let p = std::ptr::from_ref(r).cast::<i8>();
    let size = std::mem::size_of_val(r);
    let mut off = 0;
    while off < size.max(1) {
        line(p.wrapping_add(off));
        off += 64;
    }
    // The last line, when the record straddles one more.
    line(p.wrapping_add(size.saturating_sub(1)));
}

/// Bring the first line of `r` in (for records whose head is what the
/// next access reads).
#[inline(always)]
pub fn prefetch_head<T>(r: &T) {
    line(std::ptr::from_ref(r).cast::<i8>());
}

#[inline(always)]
fn line(p: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it reads nothing into the program and
    // cannot fault, whatever the address (here within a live reference's
    // record).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
