//! A file's queued requests in `(offset, admission)` order: the index the
//! store keeps per file and op, asked for "the first at or after an
//! offset", "the neighbours of this request" and "those in this range".
//!
//! A sorted list of short sorted chunks: a lookup is a binary search over
//! the chunks' last keys, then one within the chunk; an insert or a removal
//! moves at most a chunk (`CHUNK_MAX` entries), and a full chunk splits in
//! two. Most files hold a few requests at a time, in one chunk, so the
//! common operation is a search and a short move in one array; requests
//! arriving in offset order are appended. A `BTreeMap` did the same job
//! with a node allocation per idle-to-busy transition and twice the
//! instructions per insert and removal (`sluice bench scheduler`).
//!
//! Memory: a chunk holds at most `CHUNK_MAX + 1` entries' capacity, an
//! emptied chunk is dropped (except the last one), so an idle index keeps
//! at most one chunk (`CHUNK_MAX + 1` entries) and `CHUNKS_KEPT` headers.

use std::cmp::Ordering;

/// An entry's key: its offset, then its admission number (unique).
pub(crate) type Key = (u64, u64);

/// Entries of one chunk past which it splits in two.
pub(crate) const CHUNK_MAX: usize = 32;
/// Capacity of an index's first chunk (most files hold a few requests).
const CHUNK_FIRST: usize = 8;
/// Chunk headers an emptied index keeps allocated.
const CHUNKS_KEPT: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Item {
    key: Key,
    value: u32,
}

/// An ordered map from [`Key`] to a slot number.
#[derive(Debug, Default)]
pub(crate) struct OffsetIndex {
    /// The first chunk, kept in the index itself: most files need no
    /// other, and a lookup then follows one pointer, not two. Empty only
    /// when the index is.
    head: Vec<Item>,
    /// The chunks after the first, in key order, none empty.
    tail: Vec<Vec<Item>>,
    len: usize,
}

/// A position: chunk, then entry within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Pos(usize, usize);

impl OffsetIndex {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn chunks(&self) -> usize {
        1 + self.tail.len()
    }

    fn chunk(&self, c: usize) -> &Vec<Item> {
        if c == 0 {
            &self.head
        } else {
            &self.tail[c - 1]
        }
    }

    fn chunk_mut(&mut self, c: usize) -> &mut Vec<Item> {
        if c == 0 {
            &mut self.head
        } else {
            &mut self.tail[c - 1]
        }
    }

    /// Drop chunk `c`, empty, unless it is the only one.
    fn drop_chunk(&mut self, c: usize) {
        match c {
            _ if self.tail.is_empty() => {}
            0 => self.head = self.tail.remove(0),
            _ => {
                self.tail.remove(c - 1);
            }
        }
    }

    /// The chunk that holds `key`, or would: the first whose last key is
    /// not below it, else the last chunk.
    fn chunk_of(&self, key: Key) -> usize {
        if self.tail.is_empty() || self.head.last().is_none_or(|l| l.key >= key) {
            return 0;
        }
        let n = self.tail.len();
        1 + self.tail[..n - 1].partition_point(|c| c.last().is_some_and(|l| l.key < key))
    }

    /// The position of the first entry at or after `key` (may be one past
    /// the end of a chunk, then the next chunk's start follows).
    fn lower_bound(&self, key: Key) -> Pos {
        let c = self.chunk_of(key);
        Pos(c, self.chunk(c).partition_point(|it| it.key < key))
    }

    /// Insert `key`; a key already present takes the new value.
    pub fn insert(&mut self, key: Key, value: u32) {
        let item = Item { key, value };
        if self.head.capacity() == 0 {
            self.head.reserve_exact(CHUNK_FIRST);
        }
        let last = self.chunks() - 1;
        let c = match self.chunk(last).last() {
            // In offset order: append (the common case of a sequential
            // reader or writer).
            Some(l) if l.key < key => last,
            _ => self.chunk_of(key),
        };
        let chunk = self.chunk_mut(c);
        let at = chunk.partition_point(|it| it.key < key);
        if chunk.get(at).is_some_and(|it| it.key == key) {
            chunk[at].value = value;
            return;
        }
        chunk.insert(at, item);
        let upper = (chunk.len() > CHUNK_MAX).then(|| {
            // The new chunk gets the whole capacity at once (it would grow
            // to it by reallocations otherwise).
            let mut upper = Vec::with_capacity(CHUNK_MAX + 1);
            upper.extend(chunk.drain(chunk.len() / 2..));
            upper
        });
        self.len += 1;
        if let Some(upper) = upper {
            self.tail.insert(c, upper);
        }
    }

    /// Remove `key`; its value, if it was present. (The store removes
    /// whole spans, `remove_span`; this one is the tests' reference.)
    #[cfg(test)]
    pub fn remove(&mut self, key: Key) -> Option<u32> {
        let c = self.chunk_of(key);
        let chunk = self.chunk_mut(c);
        let at = chunk.partition_point(|it| it.key < key);
        if chunk.get(at).is_none_or(|it| it.key != key) {
            return None;
        }
        let value = chunk.remove(at).value;
        self.len -= 1;
        if self.chunk(c).is_empty() {
            self.drop_chunk(c);
        }
        Some(value)
    }

    /// Remove `n` consecutive entries, the first with key `first`; their
    /// values in order. Panics if `first` is absent or fewer than `n`
    /// entries follow it (a caller's broken invariant).
    pub fn remove_span(&mut self, first: Key, n: usize, out: &mut Vec<u32>) {
        let Pos(mut c, at) = self.lower_bound(first);
        assert!(self.item(Pos(c, at)).is_some_and(|it| it.key == first), "span start {first:?} not in the index");
        let mut left = n;
        let mut at = at;
        while left > 0 {
            let chunk = self.chunk_mut(c);
            let take = left.min(chunk.len() - at);
            out.extend(chunk.drain(at..at + take).map(|it| it.value));
            left -= take;
            self.len -= take;
            if self.chunk(c).is_empty() && !self.tail.is_empty() {
                self.drop_chunk(c);
            } else {
                c += 1;
            }
            at = 0;
            assert!(left == 0 || c < self.chunks(), "span of {n} from {first:?} runs past the index");
        }
        if self.tail.is_empty() && self.tail.capacity() > CHUNKS_KEPT {
            self.tail.shrink_to(CHUNKS_KEPT);
        }
    }

    fn item(&self, p: Pos) -> Option<&Item> {
        if p.0 >= self.chunks() {
            return None;
        }
        self.chunk(p.0).get(p.1)
    }

    /// Entries with keys at or after `from`, ascending.
    pub fn from(&self, from: Key) -> Ascending<'_> {
        Ascending { index: self, pos: self.lower_bound(from) }
    }

    /// Entries with keys after `key` (excluded), ascending.
    pub fn after(&self, key: Key) -> Ascending<'_> {
        let mut it = self.from(key);
        if it.peek_key() == Some(key) {
            it.next();
        }
        it
    }

    /// Entries with keys before `key` (excluded), descending.
    pub fn before(&self, key: Key) -> Descending<'_> {
        let Pos(c, i) = self.lower_bound(key);
        Descending { index: self, chunk: c, end: i }
    }

    /// Entries with keys in `[from, to)`, ascending.
    pub fn range(&self, from: Key, to: Key) -> impl Iterator<Item = (Key, u32)> + '_ {
        self.from(from).take_while(move |&(k, _)| k.cmp(&to) == Ordering::Less)
    }

    /// Every entry, ascending.
    pub fn iter(&self) -> Ascending<'_> {
        Ascending { index: self, pos: Pos(0, 0) }
    }

    pub fn values(&self) -> impl Iterator<Item = u32> + '_ {
        self.iter().map(|(_, v)| v)
    }

    /// The chunks' sizes (for tests of the bound).
    #[cfg(test)]
    fn chunk_lens(&self) -> Vec<usize> {
        (0..self.chunks()).map(|c| self.chunk(c).len()).collect()
    }
}

/// Ascending iteration from a position.
pub(crate) struct Ascending<'a> {
    index: &'a OffsetIndex,
    pos: Pos,
}

impl Ascending<'_> {
    fn settle(&mut self) {
        while self.pos.0 < self.index.chunks() && self.pos.1 >= self.index.chunk(self.pos.0).len() {
            self.pos = Pos(self.pos.0 + 1, 0);
        }
    }

    fn peek_key(&mut self) -> Option<Key> {
        self.settle();
        self.index.item(self.pos).map(|it| it.key)
    }
}

impl Iterator for Ascending<'_> {
    type Item = (Key, u32);

    fn next(&mut self) -> Option<(Key, u32)> {
        self.settle();
        let it = *self.index.item(self.pos)?;
        self.pos.1 += 1;
        Some((it.key, it.value))
    }
}

/// Descending iteration: entries of `chunk` below `end`, then the earlier
/// chunks'.
pub(crate) struct Descending<'a> {
    index: &'a OffsetIndex,
    chunk: usize,
    end: usize,
}

impl Iterator for Descending<'_> {
    type Item = (Key, u32);

    fn next(&mut self) -> Option<(Key, u32)> {
        loop {
            if self.end > 0 {
                self.end -= 1;
                let it = self.index.chunk(self.chunk)[self.end];
                return Some((it.key, it.value));
            }
            if self.chunk == 0 {
                return None;
            }
            self.chunk -= 1;
            self.end = self.index.chunk(self.chunk).len();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, u64),
        Remove(u64, u64),
        RemoveNth(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u64..200, 0u64..4).prop_map(|(o, s)| Op::Insert(o, s)),
            1 => (0u64..200, 0u64..4).prop_map(|(o, s)| Op::Remove(o, s)),
            3 => (0usize..400).prop_map(Op::RemoveNth),
        ]
    }

    fn check(ix: &OffsetIndex, reference: &BTreeMap<Key, u32>, probes: &[Key]) {
        assert_eq!(ix.len(), reference.len());
        assert_eq!(ix.iter().collect::<Vec<_>>(), reference.iter().map(|(&k, &v)| (k, v)).collect::<Vec<_>>());
        for &p in probes {
            let want: Vec<_> = reference.range(p..).map(|(&k, &v)| (k, v)).collect();
            assert_eq!(ix.from(p).collect::<Vec<_>>(), want, "from {p:?}");
            let want: Vec<_> = reference.range(..p).rev().map(|(&k, &v)| (k, v)).collect();
            assert_eq!(ix.before(p).collect::<Vec<_>>(), want, "before {p:?}");
            let want: Vec<_> = reference.range((std::ops::Bound::Excluded(p), std::ops::Bound::Unbounded)).map(|(&k, &v)| (k, v)).collect();
            assert_eq!(ix.after(p).collect::<Vec<_>>(), want, "after {p:?}");
            let to = (p.0 + 17, 0);
            let want: Vec<_> = reference.range(p..to).map(|(&k, &v)| (k, v)).collect();
            assert_eq!(ix.range(p, to).collect::<Vec<_>>(), want, "range {p:?}..{to:?}");
        }
        for c in ix.chunk_lens() {
            assert!(c <= CHUNK_MAX, "a chunk of {c} entries");
        }
        assert!(ix.is_empty() || ix.chunk_lens().iter().all(|&c| c > 0), "an empty chunk in a non-empty index");
    }

    proptest! {
        #[test]
        fn behaves_as_an_ordered_map(ops in prop::collection::vec(op(), 1..600), probes in prop::collection::vec((0u64..210, 0u64..5), 8)) {
            let mut ix = OffsetIndex::default();
            let mut reference = BTreeMap::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(o, s) => {
                        ix.insert((o, s), n as u32);
                        reference.insert((o, s), n as u32);
                    }
                    Op::Remove(o, s) => prop_assert_eq!(ix.remove((o, s)), reference.remove(&(o, s))),
                    Op::RemoveNth(i) => {
                        if let Some(&k) = reference.keys().nth(i % reference.len().max(1)) {
                            prop_assert_eq!(ix.remove(k), reference.remove(&k));
                        }
                    }
                }
            }
            check(&ix, &reference, &probes);
        }
    }

    proptest! {
        #[test]
        fn a_span_removal_is_the_same_as_removing_each(keys in prop::collection::btree_set(0u64..500, 1..300), from in 0usize..300, n in 1usize..120) {
            let mut ix = OffsetIndex::default();
            let mut reference = BTreeMap::new();
            for (i, &k) in keys.iter().enumerate() {
                // Reversed arrivals too, so that chunks split.
                let k = if i % 2 == 0 { k } else { 500 - k };
                ix.insert((k, 0), k as u32);
                reference.insert((k, 0), k as u32);
            }
            let from = from % reference.len();
            let n = n.min(reference.len() - from);
            let span: Vec<Key> = reference.keys().skip(from).take(n).copied().collect();
            let mut got = Vec::new();
            ix.remove_span(span[0], n, &mut got);
            let want: Vec<u32> = span.iter().map(|k| reference.remove(k).unwrap()).collect();
            prop_assert_eq!(got, want);
            check(&ix, &reference, &[(0, 0), (250, 0), span[0]]);
        }
    }

    #[test]
    fn a_chunk_splits_past_chunk_max_and_an_emptied_index_keeps_one() {
        let mut ix = OffsetIndex::default();
        for i in 0..CHUNK_MAX as u64 {
            ix.insert((i, 0), i as u32);
        }
        assert_eq!(ix.chunk_lens(), vec![CHUNK_MAX]);
        // One more: N + 1 entries split the chunk in two halves.
        ix.insert((CHUNK_MAX as u64, 0), 0);
        assert_eq!(ix.chunk_lens(), vec![CHUNK_MAX / 2, CHUNK_MAX / 2 + 1]);
        for i in 0..=CHUNK_MAX as u64 {
            assert!(ix.remove((i, 0)).is_some());
        }
        assert!(ix.is_empty());
        assert_eq!(ix.chunk_lens(), vec![0]);
        assert!(ix.head.capacity() <= CHUNK_MAX + 1);
    }

    #[test]
    fn sequential_and_reverse_arrivals_keep_order() {
        let mut ix = OffsetIndex::default();
        for i in (0..1_000u64).rev() {
            ix.insert((i * 4096, i), i as u32);
        }
        for i in 1_000..2_000u64 {
            ix.insert((i * 4096, i), i as u32);
        }
        assert_eq!(ix.values().collect::<Vec<_>>(), (0..2_000).collect::<Vec<_>>());
        assert_eq!(ix.from((4096 * 1_500, 0)).next(), Some(((4096 * 1_500, 1_500), 1_500)));
    }
}
