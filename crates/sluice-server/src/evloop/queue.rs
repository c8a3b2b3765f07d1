//! What comes back to the loop: a dispatch carried out (on the loop, on
//! the ring or by a worker) or a message answered without one. Each enters
//! the loop's one completion queue (`EventLoop::completed`), and
//! `completion.rs` delivers it. Bound: no more entries than messages
//! admitted and not yet answered (each is answered once), at most
//! `inflight_per_connection_max` per connection; `complete` empties the
//! queue before the turn goes on.

use crate::exec::Job;
use crate::pending::Delivery;

/// What comes back to the loop.
pub enum Completion {
    /// A dispatch carried out: its members hold their results.
    Dispatch(Job),
    /// A message answered without a dispatch of its own.
    Answer(Delivery),
}

/// A fault planted in the delivery path, for the test that must catch it
/// (`sim/`): the `nth` answer delivered (from 0) is dropped, or given
/// twice.
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mutation {
    #[default]
    None,
    Drop(u64),
    Twice(u64),
}
