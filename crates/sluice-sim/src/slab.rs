//! A bounded slab: records addressed by a `u32` index, freed slots reused,
//! at most `max` live at once. Pieces and messages in flight live here, so
//! a run's memory is bounded by what is in flight, not by its length.

use crate::error::{Error, ErrorKind};

pub struct Slab<T> {
    items: Vec<T>,
    free: Vec<u32>,
    live: usize,
    max: usize,
    what: &'static str,
}

impl<T: Copy + Default> Slab<T> {
    /// An empty slab of at most `max` live records named `what` in errors.
    pub fn new(max: usize, what: &'static str) -> Slab<T> {
        Slab { items: Vec::new(), free: Vec::new(), live: 0, max: max.min(u32::MAX as usize), what }
    }

    pub fn insert(&mut self, t: T) -> Result<u32, Error> {
        if self.live >= self.max {
            return Err(Error::new(ErrorKind::Bound, format!("more than {} {} in flight", self.max, self.what)));
        }
        self.live += 1;
        Ok(match self.free.pop() {
            Some(i) => {
                self.items[i as usize] = t;
                i
            }
            None => {
                self.items.push(t);
                (self.items.len() - 1) as u32
            }
        })
    }

    pub fn get(&self, i: u32) -> &T {
        &self.items[i as usize]
    }

    /// Slot `i`'s record if the slot was ever used (for prefetching).
    pub fn peek(&self, i: u32) -> Option<&T> {
        self.items.get(i as usize)
    }

    pub fn get_mut(&mut self, i: u32) -> &mut T {
        &mut self.items[i as usize]
    }

    /// Free slot `i`, returning its record.
    pub fn remove(&mut self, i: u32) -> T {
        debug_assert!(!self.free.contains(&i), "double free of {} {i}", self.what);
        self.live -= 1;
        self.free.push(i);
        std::mem::take(&mut self.items[i as usize])
    }

    pub fn live(&self) -> usize {
        self.live
    }

    /// Slots ever allocated: the high-water mark of `live`.
    pub fn capacity_used(&self) -> usize {
        self.items.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_at_n_and_n_plus_one_and_reuse() {
        let mut s: Slab<u64> = Slab::new(2, "things");
        let a = s.insert(10).unwrap();
        let b = s.insert(20).unwrap();
        assert_eq!(s.insert(30).unwrap_err().kind, ErrorKind::Bound);
        assert_eq!(s.remove(a), 10);
        let c = s.insert(30).unwrap();
        assert_eq!((c, *s.get(b), s.live(), s.capacity_used()), (a, 20, 2, 2));
    }
}
