//! The binary's allocator: mimalloc, whose memory comes from the kernel in
//! large aligned regions (arenas) instead of one mapping per large block.
//!
//! That matters to the simulator. A world of 10^5-10^6 processes holds
//! 2-3 GB of records (processes, pieces in flight, each server's scheduler
//! tables) and every event touches a few of them at random, so with 4 KiB
//! pages nearly every access also misses the TLB. Arenas are 2 MiB aligned,
//! so the kernel can back them with transparent huge pages when asked
//! (`madvise(MADV_HUGEPAGE)`, which `huge_pages` turns on); with glibc's
//! allocator the same request left most of the heap in small pages, since
//! its large blocks are separate, unaligned mappings.
//!
//! Huge pages are asked for by the commands that build large worlds only
//! (`sim`, `what-if`): a daemon's memory stays in small pages, so its
//! resident size follows what it holds.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Back memory allocated from now on with transparent huge pages where the
/// kernel allows it (`/sys/kernel/mm/transparent_hugepage/enabled` set to
/// `always` or `madvise`). Memory already allocated keeps its pages.
pub fn huge_pages() {
    // SAFETY: each sets one of mimalloc's options, an atomic store, which
    // mimalloc reads when it next maps or purges memory.
    unsafe {
        libmimalloc_sys::mi_option_set_enabled(libmimalloc_sys::mi_option_large_os_pages, true);
        // Freed memory stays mapped: a purge (`MADV_DONTNEED` of a freed
        // range) splits the huge page under it back into small ones.
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1);
    }
}

/// `mi_option_purge_delay` in mimalloc.h's `mi_option_e` (v2 and v3), which
/// `libmimalloc-sys` does not name: milliseconds before freed memory is
/// returned to the kernel, -1 for never.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
