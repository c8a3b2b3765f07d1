//! The binary's allocator: glibc's (`System`) for everything, except while
//! `sluice sim` runs a world of `sluice_sim::LARGE_WORLD_PROCS` processes
//! or more (`Alloc::huge_pages`). From then on, blocks come from arenas in
//! one reserved mapping that transparent huge pages back.
//!
//! Why: such a world holds gigabytes of small records (each server's
//! scheduler tables, the processes, the messages) touched at random. With
//! 4 KiB pages nearly every access also misses the TLB, and in a VM each
//! miss is a two-level page walk. glibc places small blocks in heaps that
//! grow a page at a time, which THP (`madvise` mode, or even `always`)
//! leaves in small pages.
//!
//! How: the mapping is `ARENAS` arenas of `arena_bytes` each, reserved
//! with `MAP_NORESERVE` and madvised `MADV_HUGEPAGE` once. Each thread
//! allocates from one arena (round robin on its first block); an arena
//! hands out size classes (16-byte steps to 128 bytes, then four a power
//! of two, so at most 25% is lost to rounding) from per-class free lists,
//! then from its untouched end. A block is freed into the arena that holds
//! its address, from any thread, under that arena's lock. A free block of
//! `RELEASE_MIN` or more gives its whole huge pages back to the kernel.
//!
//! Bounds: an arena holds `arena_bytes`; past that, and for alignments
//! above 16 or sizes no class holds, blocks come from glibc, whose blocks
//! are told apart by address. If the mapping cannot be made (a system
//! with overcommit off), nothing changes.
//!
//! Smaller worlds never turn it on: at 10,000 processes the records stay
//! in the caches, and swapping glibc for mimalloc cost about 10% there
//! (docs/results.md, 2026-12-07, mimalloc).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

/// Arenas in the mapping: threads share them round robin.
const ARENAS: usize = 4;
/// Bytes of one arena in the binary's allocator: 64 GiB of address space,
/// of which only what is touched takes memory.
const ARENA_BYTES: usize = 64 << 30;
/// Size classes: 8 small ones, then 4 per power of two up to 2^39 bytes.
const CLASSES: usize = 8 + 4 * 32;
/// Largest size of the 16-byte classes.
const SMALL_MAX: usize = 128;
/// Largest alignment an arena block has (every class size is a multiple).
const ALIGN_MAX: usize = 16;
/// A freed block this large gives its whole huge pages back.
const RELEASE_MIN: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

/// The size class of a block of `size` bytes: (index, bytes it takes).
fn class(size: usize) -> Option<(usize, usize)> {
    if size <= SMALL_MAX {
        let i = size.max(1).div_ceil(16) - 1;
        return Some((i, (i + 1) * 16));
    }
    // size in (2^p, 2^(p+1)], split in four steps of 2^(p-2).
    let p = (usize::BITS - 1 - (size - 1).leading_zeros()) as usize;
    let step = 1usize << (p - 2);
    let j = (size - (1 << p)).div_ceil(step);
    let i = 8 + (p - 7) * 4 + (j - 1);
    (i < CLASSES).then_some((i, (1 << p) + j * step))
}

/// One arena: a range of addresses, its untouched end, and a free list per
/// class (each free block holds the address of the next in its first word).
struct Arena {
    base: usize,
    len: usize,
    used: usize,
    free: [usize; CLASSES],
}

impl Arena {
    const EMPTY: Arena = Arena { base: 0, len: 0, used: 0, free: [0; CLASSES] };

    /// A block for `size` bytes, and whether it was never handed out
    /// (its bytes are still the mapping's zeroes); `None` once the arena
    /// is full for that class, or for a size no class holds.
    ///
    /// # Safety
    /// The arena's range must be mapped, and every address on its free
    /// lists a block it handed out and took back.
    unsafe fn take(&mut self, size: usize) -> Option<(*mut u8, bool)> {
        let (c, bytes) = class(size)?;
        let head = self.free[c];
        if head != 0 {
            self.free[c] = (head as *const usize).read();
            return Some((head as *mut u8, false));
        }
        if self.len - self.used < bytes {
            return None;
        }
        let p = self.base + self.used;
        self.used += bytes;
        Some((p as *mut u8, true))
    }

    /// Take back the block at `p`, handed out for `size` bytes.
    ///
    /// # Safety
    /// `p` must be a live block of this arena for `size` (same class).
    unsafe fn give(&mut self, p: *mut u8, size: usize) {
        let Some((c, bytes)) = class(size) else { return };
        let start = p as usize;
        if bytes >= RELEASE_MIN {
            // Keep the first word (the free list's link) mapped.
            let from = (start + 8).next_multiple_of(HUGE_PAGE);
            let to = (start + bytes) & !(HUGE_PAGE - 1);
            if to > from {
                libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_DONTNEED);
            }
        }
        (p as *mut usize).write(self.free[c]);
        self.free[c] = start;
    }
}

/// The binary's allocator.
#[global_allocator]
static GLOBAL: Alloc = Alloc::new(ARENA_BYTES);

/// Allocate from the huge-page arenas from now on (`Alloc::huge_pages`).
pub fn huge_pages() -> bool {
    GLOBAL.huge_pages()
}

thread_local! {
    /// This thread's arena, once it has taken a block (`usize::MAX`: none).
    static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The allocator (see the module's comment).
pub struct Alloc {
    arena_bytes: usize,
    on: AtomicBool,
    /// Start of the mapping; 0 until it is made.
    base: AtomicUsize,
    reserve: Once,
    next: AtomicUsize,
    arenas: [Mutex<Arena>; ARENAS],
}

impl Alloc {
    pub const fn new(arena_bytes: usize) -> Alloc {
        Alloc {
            arena_bytes,
            on: AtomicBool::new(false),
            base: AtomicUsize::new(0),
            reserve: Once::new(),
            next: AtomicUsize::new(0),
            arenas: [const { Mutex::new(Arena::EMPTY) }; ARENAS],
        }
    }

    /// From now on, allocate from the huge-page arenas (for a large
    /// world). Returns whether they are in use: false where the mapping
    /// could not be made.
    pub fn huge_pages(&self) -> bool {
        self.reserve.call_once(|| {
            let len = ARENAS * self.arena_bytes;
            // SAFETY: a fresh anonymous mapping; nothing else refers to it.
            let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0) };
            if p == libc::MAP_FAILED {
                return;
            }
            // Without THP (mode `never`) this fails and the arenas still
            // work, in small pages.
            // SAFETY: the range is the mapping just made.
            unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
            for (i, a) in self.arenas.iter().enumerate() {
                let mut a = lock(a);
                (a.base, a.len) = (p as usize + i * self.arena_bytes, self.arena_bytes);
            }
            self.base.store(p as usize, Ordering::Release);
        });
        let ok = self.base.load(Ordering::Acquire) != 0;
        self.on.store(ok, Ordering::Release);
        ok
    }

    /// The arena holding address `p`, if one does.
    fn owner(&self, p: *mut u8) -> Option<usize> {
        let base = self.base.load(Ordering::Acquire);
        let off = (p as usize).wrapping_sub(base);
        (base != 0 && off < ARENAS * self.arena_bytes).then(|| off / self.arena_bytes)
    }

    /// A block from this thread's arena; `None` where glibc must serve it.
    fn take(&self, l: Layout) -> Option<(*mut u8, bool)> {
        if !self.on.load(Ordering::Relaxed) || l.align() > ALIGN_MAX {
            return None;
        }
        let i = MINE.with(|m| {
            if m.get() == usize::MAX {
                m.set(self.next.fetch_add(1, Ordering::Relaxed) % ARENAS);
            }
            m.get()
        });
        // SAFETY: the arenas' ranges are mapped once `on` is set, and only
        // `give` fills their free lists.
        unsafe { lock(&self.arenas[i]).take(l.size()) }
    }

    /// Free a block, wherever it came from.
    ///
    /// # Safety
    /// As `GlobalAlloc::dealloc`.
    unsafe fn free(&self, p: *mut u8, l: Layout) {
        match self.owner(p) {
            Some(i) => lock(&self.arenas[i]).give(p, l.size()),
            None => System.dealloc(p, l),
        }
    }
}

fn lock(a: &Mutex<Arena>) -> MutexGuard<'_, Arena> {
    // Nothing under the lock panics; a poisoned lock is still consistent.
    a.lock().unwrap_or_else(|e| e.into_inner())
}

// SAFETY: blocks are disjoint (an arena hands each range out once until it
// is given back), at least `size` long and aligned to at most 16, which
// every class size is a multiple of; larger alignments go to glibc.
unsafe impl GlobalAlloc for Alloc {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        match self.take(l) {
            Some((p, _)) => p,
            None => System.alloc(l),
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        match self.take(l) {
            Some((p, fresh)) => {
                if !fresh {
                    p.write_bytes(0, l.size());
                }
                p
            }
            None => System.alloc_zeroed(l),
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        self.free(p, l)
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, size: usize) -> *mut u8 {
        let mine = self.owner(p).is_some();
        if !mine && !self.on.load(Ordering::Relaxed) {
            return System.realloc(p, l, size);
        }
        if mine && class(size).is_some_and(|c| Some(c) == class(l.size())) {
            return p;
        }
        let to = Layout::from_size_align_unchecked(size, l.align());
        let q = self.alloc(to);
        if !q.is_null() {
            std::ptr::copy_nonoverlapping(p, q, l.size().min(size));
            self.free(p, l);
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_hold_their_sizes_in_order_and_lose_at_most_a_quarter() {
        let mut last = (0, 0);
        let sizes = (1..=70_000usize).chain((17..39).flat_map(|p| [(1usize << p) - 1, 1 << p, (1 << p) + 1, 3 << (p - 1)]));
        for size in sizes {
            let (i, bytes) = class(size).unwrap();
            assert!(bytes >= size && bytes % ALIGN_MAX == 0, "{size}: {bytes}");
            assert!(size <= SMALL_MAX || bytes - size <= size / 4, "{size}: {bytes}");
            if size > last.1 {
                assert!(i > last.0 || last == (0, 0), "{size}: class {i} after {last:?}");
            } else {
                assert_eq!(i, last.0, "{size}");
            }
            last = (i, bytes);
        }
        assert_eq!(class((1 << 39) + 1), None);
        assert_eq!(class(1 << 39).map(|c| c.0), Some(CLASSES - 1));
    }

    /// An arena of room for N blocks of a class hands out N, then none;
    /// a freed block is the next one handed out.
    #[test]
    fn an_arena_holds_its_bytes_and_no_more() {
        let mut buf = vec![0u128; 4 * 64 / 16];
        let mut a = Arena { base: buf.as_mut_ptr() as usize, len: 4 * 64, ..Arena::EMPTY };
        // SAFETY: the range is `buf`, alive for the test.
        unsafe {
            let got: Vec<_> = (0..4).map(|_| a.take(50).unwrap()).collect();
            assert!(got.iter().all(|&(_, fresh)| fresh));
            assert!(a.take(50).is_none(), "block N+1");
            assert!(a.take(16).is_none(), "no room for any class");
            a.give(got[2].0, 64);
            assert_eq!(a.take(49), Some((got[2].0, false)));
            assert!(a.take(64).is_none());
        }
    }

    /// Through the allocator: blocks keep their bytes across growth, go
    /// to glibc when an arena is full or the alignment is too large, and
    /// each free finds its owner.
    #[test]
    fn the_allocator_serves_frees_and_falls_back() {
        static A: Alloc = Alloc::new(1 << 20);
        let l = |size, align| Layout::from_size_align(size, align).unwrap();
        assert!(A.take(l(64, 8)).is_none(), "off until asked");
        if !A.huge_pages() {
            eprintln!("no mapping on this system; nothing to test");
            return;
        }
        // SAFETY: each block is used within its layout and freed once.
        unsafe {
            let p = A.alloc(l(100, 8));
            assert!(A.owner(p).is_some());
            p.write_bytes(7, 100);
            let q = A.realloc(p, l(100, 8), 110);
            assert_eq!(q, p, "same class: same block");
            let r = A.realloc(q, l(110, 8), 5000);
            assert_ne!(r, q);
            assert!((0..100).all(|i| *r.add(i) == 7));
            let z = A.alloc_zeroed(l(112, 8));
            assert_eq!(z, q, "the freed block, zeroed");
            assert!((0..112).all(|i| *z.add(i) == 0));
            let wide = A.alloc(l(64, 64));
            assert!(A.owner(wide).is_none());
            // Fill this thread's arena: 2^20 bytes of 64 KiB blocks.
            let blocks: Vec<_> = (0..16).map(|_| A.alloc(l(65_536, 16))).collect();
            let outside = blocks.iter().filter(|&&b| A.owner(b).is_none()).count();
            assert!((1..16).contains(&outside), "{outside} of 16 from glibc");
            for b in blocks {
                A.dealloc(b, l(65_536, 16));
            }
            for (b, s) in [(r, 5000), (z, 112), (wide, 64)] {
                A.dealloc(b, l(s, if b == wide { 64 } else { 8 }));
            }
        }
    }
}
