//! The real libc functions behind the ones we interpose, each resolved once
//! with `dlsym(RTLD_NEXT, …)` on first use and cached in a static.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Sentinel for "looked up, not present in this libc".
const MISSING: usize = 1;

/// The address of the next definition of `name` (NUL-terminated), or
/// `None` when this libc has none (e.g. `statx` before glibc 2.28).
pub fn resolve(slot: &AtomicUsize, name: &'static str) -> Option<usize> {
    let p = slot.load(Ordering::Acquire);
    if p == MISSING {
        return None;
    }
    if p != 0 {
        return Some(p);
    }
    // SAFETY: `name` is a NUL-terminated literal; RTLD_NEXT searches the
    // objects loaded after this one, i.e. libc, never ourselves.
    let q = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) } as usize;
    slot.store(if q == 0 { MISSING } else { q }, Ordering::Release);
    (q != 0).then_some(q)
}

/// Print one line and abort: a libc without `name` cannot run programs.
pub fn missing(name: &str) -> ! {
    let msg = format!("sluice: libc has no {}\n", name.trim_end_matches('\0'));
    // SAFETY: writing a valid buffer to stderr, then aborting.
    unsafe {
        libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
        libc::abort()
    }
}

/// `try_real!(name, fn(args) -> ret)`: `Option` of the real function.
macro_rules! try_real {
    ($name:ident, fn($($t:ty),*) -> $r:ty) => {{
        static SLOT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        // The macro may expand inside an `unsafe` block of its caller.
        #[allow(unused_unsafe)]
        let f = $crate::real::resolve(&SLOT, concat!(stringify!($name), "\0")).map(|p| {
            // SAFETY: `p` is libc's definition of this symbol, whose C
            // signature is the one written at the call site.
            unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(p) }
        });
        f
    }};
}

/// `real!(name, fn(args) -> ret)`: the real function; aborts if absent.
macro_rules! real {
    ($name:ident, fn($($t:ty),*) -> $r:ty) => {
        match $crate::real::try_real!($name, fn($($t),*) -> $r) {
            Some(f) => f,
            None => $crate::real::missing(stringify!($name)),
        }
    };
}

pub(crate) use {real, try_real};
