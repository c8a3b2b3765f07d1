//! The discrete-event engine: a priority queue of timestamped events and
//! the seeded random source, as in PIOsimHD (seed `004_…`, "Diskrete
//! Ereignis-Simulation": while events remain, handle the earliest one by
//! delegating it to its component, which may schedule later ones).
//!
//! Ties are broken by insertion order (a sequence number), so a run is a
//! pure function of its scenario and seed. The queue is bounded: pushing
//! past `pending_max` is an error, never a drop.

use std::collections::VecDeque;

pub use sluice_core::prefetch::prefetch;

use crate::error::{Error, ErrorKind};

/// Nanoseconds of simulated time.
pub type Time = u64;

/// Width of one calendar bucket: 2^13 ns = 8.2 us, the order of a network
/// hop or a fraction of an SSD access, so a bucket holds a few events.
const BUCKET_NS_LOG2: u32 = 13;
/// Buckets in the calendar: 2^12, a window of 33.5 ms ahead of now (past
/// an HDD's far seek); later events wait in the overflow heap until the
/// window reaches them. 4,096 bucket headers (96 KiB) stay in L2.
const BUCKETS_LOG2: u32 = 12;
const BUCKETS: usize = 1 << BUCKETS_LOG2;
/// Children per node of the overflow heap.
const ARITY: usize = 4;
/// Bits of a bucket entry's packed key that hold the push sequence number;
/// the others hold the time within the bucket. Pushes are bounded by it
/// (2^51, years of simulation at 10^7 events per second).
const SEQ_BITS: u32 = 64 - BUCKET_NS_LOG2;
pub const PUSHES_MAX: u64 = 1 << SEQ_BITS;

#[derive(Clone, Copy)]
struct Key {
    at: Time,
    seq: u64,
}

impl Key {
    fn before(&self, o: &Key) -> bool {
        (self.at, self.seq) < (o.at, o.seq)
    }

    fn bucket(&self) -> u64 {
        self.at >> BUCKET_NS_LOG2
    }

    /// The key inside its bucket as one integer, ordered as `(at, seq)`:
    /// the time's offset in the bucket above the sequence number.
    fn packed(&self) -> u64 {
        ((self.at & ((1 << BUCKET_NS_LOG2) - 1)) << SEQ_BITS) | self.seq
    }

    fn unpack(bucket: u64, packed: u64) -> Time {
        (bucket << BUCKET_NS_LOG2) | (packed >> SEQ_BITS)
    }
}

/// Pending events, earliest first; equal times in push order.
///
/// A calendar queue (Brown 1988): events within the 33.5 ms window ahead
/// of the current bucket are appended, unsorted, to the bucket of their
/// 8 us slice; a bucket is sorted once, when it becomes current, and popped
/// from its end; a bitmap skips empty buckets. A bucket entry keeps its
/// (time, push order) packed in one integer (`Key::packed`): 16 bytes an
/// entry, one comparison per step of the sort. Events beyond the window
/// wait in a 4-ary heap. Events for the current instant (a message sent, a
/// process continuing) go to a FIFO served once nothing scheduled earlier
/// is left at this instant. Events pushed into the current bucket after it
/// was sorted go to a small 4-ary heap beside it (`late`), not into the
/// sorted vector: an all-to-all exchange of 1,024 ranks pushes a million
/// messages into one 8 us slice, and inserting each in order moved the
/// whole bucket every time (96% of a run's time in `memmove`). The order
/// is exactly (time, push order), at a small fraction of a binary heap's
/// cache misses.
pub struct EventQueue<E> {
    /// Absolute index (`at >> BUCKET_NS_LOG2`) of the current bucket.
    current: u64,
    /// Whether the current bucket is sorted (descending; next at the end).
    sorted: bool,
    buckets: Vec<Vec<(u64, E)>>,
    occupied: Vec<u64>,
    overflow: Vec<(Key, E)>,
    /// Events of the current bucket pushed after it was sorted (a heap).
    late: Vec<(Key, E)>,
    /// Events for `now`, pushed while `now` was current, in push order.
    instant: VecDeque<E>,
    queued: usize,
    seq: u64,
    pending_max: usize,
    /// Pushes a queue takes in its life (`PUSHES_MAX`; lower in tests).
    pushes_max: u64,
    now: Time,
    popped: u64,
}

impl<E> EventQueue<E> {
    /// An empty queue that holds at most `pending_max` events.
    pub fn new(pending_max: usize) -> EventQueue<E> {
        EventQueue {
            current: 0,
            sorted: false,
            buckets: (0..BUCKETS).map(|_| Vec::new()).collect(),
            occupied: vec![0; BUCKETS / 64],
            overflow: Vec::new(),
            late: Vec::new(),
            instant: VecDeque::new(),
            queued: 0,
            seq: 0,
            pending_max,
            pushes_max: PUSHES_MAX,
            now: 0,
            popped: 0,
        }
    }

    /// A queue that takes only `pushes_max` pushes (to test that bound).
    #[cfg(test)]
    fn with_pushes_max(pending_max: usize, pushes_max: u64) -> EventQueue<E> {
        EventQueue { pushes_max: pushes_max.min(PUSHES_MAX), ..EventQueue::new(pending_max) }
    }

    /// Schedule `ev` at `at`, which must not be in the past.
    pub fn push(&mut self, at: Time, ev: E) -> Result<(), Error> {
        assert!(at >= self.now, "event scheduled in the past ({at} < {})", self.now);
        if self.len() >= self.pending_max {
            return Err(Error::new(ErrorKind::Bound, format!("more than {} pending events (events_pending_max)", self.pending_max)));
        }
        if at == self.now && self.popped > 0 {
            self.instant.push_back(ev);
            return Ok(());
        }
        if self.seq >= self.pushes_max {
            return Err(Error::new(ErrorKind::Bound, format!("more than {} events pushed", self.pushes_max)));
        }
        let key = Key { at, seq: self.seq };
        self.seq += 1;
        self.queued += 1;
        if key.bucket() >= self.current + BUCKETS as u64 {
            self.overflow.push((key, ev));
            let last = self.overflow.len() - 1;
            sift_up(&mut self.overflow, last);
        } else {
            self.file(key, ev);
        }
        Ok(())
    }

    /// Put an event of the window into its bucket.
    fn file(&mut self, key: Key, ev: E) {
        let i = (key.bucket() as usize) & (BUCKETS - 1);
        if key.bucket() == self.current && self.sorted {
            self.late.push((key, ev));
            let last = self.late.len() - 1;
            sift_up(&mut self.late, last);
        } else {
            self.buckets[i].push((key.packed(), ev));
        }
        self.occupied[i / 64] |= 1 << (i % 64);
    }

    /// The earliest event, advancing the clock to its time.
    ///
    /// The current bucket only moves when no instant event waits, so while
    /// one waits the current bucket is the one of `now`, and every later
    /// push lands at or after it.
    pub fn pop(&mut self) -> Option<(Time, E)> {
        if !self.instant.is_empty() {
            let earlier = self.sort_current().is_some_and(|at| at <= self.now);
            if !earlier {
                self.popped += 1;
                return self.instant.pop_front().map(|ev| (self.now, ev));
            }
        }
        while self.queued > 0 && self.sort_current().is_none() {
            self.advance();
        }
        if self.queued == 0 {
            return None;
        }
        let i = (self.current as usize) & (BUCKETS - 1);
        // The earlier of the sorted bucket's last entry and the late heap's
        // top (usually empty).
        let from_late = !self.late.is_empty()
            && match (self.buckets[i].last(), self.late.first()) {
                (Some(&(packed, _)), Some((k, _))) => k.packed() < packed,
                _ => true,
            };
        let out = if from_late {
            let (k, ev) = pop_heap(&mut self.late);
            self.pop_done(i, k.packed(), ev)
        } else {
            let (packed, ev) = self.buckets[i].pop().expect("the current bucket has an event");
            self.pop_done(i, packed, ev)
        };
        Some(out)
    }

    fn pop_done(&mut self, i: usize, packed: u64, ev: E) -> (Time, E) {
        if self.buckets[i].is_empty() && self.late.is_empty() {
            self.occupied[i / 64] &= !(1 << (i % 64));
        }
        self.queued -= 1;
        let at = Key::unpack(self.current, packed);
        self.now = at;
        self.popped += 1;
        (at, ev)
    }

    /// Sort the current bucket if it is not yet; the time of its earliest
    /// event.
    fn sort_current(&mut self) -> Option<Time> {
        let b = &mut self.buckets[(self.current as usize) & (BUCKETS - 1)];
        if !self.sorted && !b.is_empty() {
            b.sort_unstable_by_key(|x| std::cmp::Reverse(x.0));
            self.sorted = true;
        }
        let sorted = b.last().map(|&(k, _)| k);
        let earliest = match self.late.first() {
            None => sorted,
            Some((k, _)) => Some(sorted.map_or(k.packed(), |s| s.min(k.packed()))),
        };
        earliest.map(|k| Key::unpack(self.current, k))
    }

    /// Move to the next occupied bucket (or jump to the overflow's first
    /// event when the window is empty), refilling the window's far end.
    fn advance(&mut self) {
        debug_assert!(self.late.is_empty(), "the current bucket's late events were all popped");
        self.sorted = false;
        self.current = match self.next_occupied() {
            Some(b) => b,
            None => self.overflow[0].0.bucket(),
        };
        while self.overflow.first().is_some_and(|(k, _)| k.bucket() < self.current + BUCKETS as u64) {
            let (k, ev) = pop_heap(&mut self.overflow);
            self.file(k, ev);
        }
    }

    /// The absolute index of the first occupied bucket after the current.
    fn next_occupied(&self) -> Option<u64> {
        let start = (self.current as usize + 1) & (BUCKETS - 1);
        for step in 0..=BUCKETS / 64 {
            let w = (start / 64 + step) % (BUCKETS / 64);
            let mut bits = self.occupied[w];
            if step == 0 {
                bits &= !0u64 << (start % 64);
            }
            if bits != 0 {
                let i = w * 64 + bits.trailing_zeros() as usize;
                let ahead = (i + BUCKETS - (self.current as usize & (BUCKETS - 1))) % BUCKETS;
                return Some(self.current + if ahead == 0 { BUCKETS as u64 } else { ahead as u64 });
            }
        }
        None
    }

    /// An event due soon after the next: the `k`-th of those waiting for
    /// this instant, else of the sorted current bucket's, in the order they
    /// will pop (late pushes into the bucket are not looked at). Only a
    /// hint, to prefetch what it will touch; `None` when not known.
    pub fn peek_ahead(&self, k: usize) -> Option<&E> {
        if let Some(ev) = self.instant.get(k) {
            return Some(ev);
        }
        let k = k - self.instant.len();
        if !self.sorted {
            return None;
        }
        let b = &self.buckets[(self.current as usize) & (BUCKETS - 1)];
        b.len().checked_sub(k + 1).map(|i| &b[i].1)
    }

    /// The time of the last event popped.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Events popped so far.
    pub fn popped(&self) -> u64 {
        self.popped
    }

    pub fn len(&self) -> usize {
        self.queued + self.instant.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn sift_up<E>(h: &mut [(Key, E)], mut i: usize) {
    while i > 0 {
        let parent = (i - 1) / ARITY;
        if !h[i].0.before(&h[parent].0) {
            break;
        }
        h.swap(i, parent);
        i = parent;
    }
}

fn pop_heap<E>(h: &mut Vec<(Key, E)>) -> (Key, E) {
    let top = h.swap_remove(0);
    let (n, mut i) = (h.len(), 0);
    loop {
        let first = ARITY * i + 1;
        if first >= n {
            return top;
        }
        let min = (first..(first + ARITY).min(n)).fold(first, |m, c| if h[c].0.before(&h[m].0) { c } else { m });
        if !h[min].0.before(&h[i].0) {
            return top;
        }
        h.swap(i, min);
        i = min;
    }
}

/// The one random source of a run: SplitMix64 (Steele, Lea, Flood 2014),
/// small, fast and fully determined by its seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_then_push_order() {
        let mut q = EventQueue::new(16);
        for (at, ev) in [(30, 'a'), (10, 'b'), (30, 'c'), (10, 'd'), (20, 'e')] {
            q.push(at, ev).unwrap();
        }
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec![(10, 'b'), (10, 'd'), (20, 'e'), (30, 'a'), (30, 'c')]);
        assert_eq!((q.now(), q.popped()), (30, 5));
    }

    #[test]
    fn same_instant_events_keep_push_order() {
        let mut q = EventQueue::new(16);
        q.push(10, 'a').unwrap();
        q.push(10, 'b').unwrap();
        q.push(20, 'z').unwrap();
        assert_eq!(q.pop(), Some((10, 'a')));
        // Pushed at 10 for 10: after 'b', which was pushed earlier.
        q.push(10, 'c').unwrap();
        q.push(15, 'd').unwrap();
        q.push(10, 'e').unwrap();
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec![(10, 'b'), (10, 'c'), (10, 'e'), (15, 'd'), (20, 'z')]);
    }

    #[test]
    fn matches_a_sorted_reference_on_random_schedules() {
        let mut rng = Rng::new(3);
        let mut q = EventQueue::new(1 << 20);
        // Pending (time, push number): the earliest, equal times by push.
        let mut reference: Vec<(Time, u64)> = Vec::new();
        let (mut id, mut now) = (0u64, 0);
        for step in 0..60_000 {
            if step % 3 != 2 || q.is_empty() {
                // Same instant, same bucket, next buckets, the window's
                // edge, far beyond it.
                let ahead = [0, 1, rng.below(5_000), rng.below(100_000), rng.below(200_000_000), rng.below(1 << 40)];
                let at = now + ahead[rng.below(ahead.len() as u64) as usize];
                q.push(at, id).unwrap();
                reference.push((at, id));
                id += 1;
            } else {
                let got = q.pop().unwrap();
                let min = *reference.iter().min().unwrap();
                assert_eq!(got, min);
                reference.retain(|&p| p != min);
                now = got.0;
            }
        }
        reference.sort();
        assert_eq!(std::iter::from_fn(|| q.pop()).collect::<Vec<_>>(), reference);
    }

    #[test]
    fn peek_ahead_names_the_events_that_pop_next() {
        let mut rng = Rng::new(9);
        let mut q = EventQueue::new(1 << 16);
        for id in 0..2_000u64 {
            q.push(rng.below(50_000), id).unwrap();
        }
        let mut seen = 0;
        while let Some((now, _)) = q.pop() {
            // Events for this instant go ahead of the bucket's.
            if now % 7 == 0 {
                q.push(now, 10_000 + now).unwrap();
            }
            let ahead: Vec<Option<u64>> = (0..4).map(|k| q.peek_ahead(k).copied()).collect();
            let mut copy_of_next = Vec::new();
            // What pops next, without pushes in between, is what was peeked
            // (where the peek knew).
            for (k, want) in ahead.iter().enumerate() {
                let Some(want) = *want else { continue };
                while copy_of_next.len() <= k {
                    match q.pop() {
                        Some((_, ev)) => copy_of_next.push(ev),
                        None => break,
                    }
                }
                assert_eq!(copy_of_next.get(k), Some(&want), "peek {k}");
                seen += 1;
            }
            if q.is_empty() {
                break;
            }
        }
        assert!(seen > 500, "the peeks knew the next events {seen} times");
    }

    #[test]
    fn a_burst_into_the_sorted_current_bucket_keeps_the_order() {
        // The all-to-all case: once the current 8 us bucket is sorted (by a
        // pop), 20,000 more events land in it, later and earlier times
        // mixed, equal times in push order; they come out in (time, push)
        // order, interleaved with the bucket's own.
        let mut q = EventQueue::new(1 << 20);
        q.push(1_000, 0u64).unwrap();
        q.push(5_000, 1).unwrap();
        assert_eq!(q.pop(), Some((1_000, 0)));
        let mut want = vec![(5_000, 1)];
        for i in 0..20_000u64 {
            let at = 1_000 + (i * 7_919) % 7_000;
            q.push(at, i + 2).unwrap();
            want.push((at, i + 2));
        }
        want.sort();
        assert_eq!(std::iter::from_fn(|| q.pop()).collect::<Vec<_>>(), want);
        assert!(q.late.is_empty() && q.is_empty());
    }

    #[test]
    fn pending_bound_at_n_and_n_plus_one() {
        let mut q = EventQueue::new(3);
        for i in 0..3 {
            q.push(i, ()).unwrap();
        }
        let e = q.push(5, ()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Bound);
        q.pop();
        q.push(5, ()).unwrap();
    }

    #[test]
    fn pushes_bound_at_n_and_n_plus_one() {
        let mut q = EventQueue::with_pushes_max(16, 3);
        for i in 0..3 {
            q.push(i, ()).unwrap();
        }
        assert_eq!(q.push(5, ()).unwrap_err().kind, ErrorKind::Bound);
        // The full sequence range packs and unpacks: the last number
        // below the bound still orders after an earlier push at one time.
        let mut q = EventQueue::new(16);
        q.seq = PUSHES_MAX - 2;
        q.push(7, 'a').unwrap();
        q.push(7, 'b').unwrap();
        assert_eq!(q.push(7, 'c').unwrap_err().kind, ErrorKind::Bound);
        assert_eq!((q.pop(), q.pop(), q.pop()), (Some((7, 'a')), Some((7, 'b')), None));
    }

    #[test]
    fn rng_is_a_function_of_its_seed() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = Rng::new(8);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut r = Rng::new(1);
        assert!((0..1000).all(|_| r.below(10) < 10));
    }
}
