//! What the device did, as a policy sees it: each dispatch's own time,
//! split into those that continued where the last one ended and those
//! that moved. From them, what a move costs beyond a continuing transfer
//! of the same size (its bytes charged at most a disk's rate, so that a
//! short continuing dispatch's fixed cost, spread over few bytes, cannot
//! make a long move look free), and what a byte costs.
//!
//! A dispatch's own time runs from when it left, or from when the one
//! before it completed if that was later: on a device that serves one
//! dispatch at a time, in order, the time it was served. Timing only
//! dispatches alone on the device would miss the moves of a scheduler
//! that sends a piece behind the head while another dispatch is out
//! (a late process's piece, then the run after it): on the emulated disk
//! such a policy made 45 moves and timed none. On a device the model
//! says serves several at once, only dispatches alone on it are timed.
//!
//! A policy that decides by a device model (turn lengths, windows, holds)
//! takes the larger of the model's move cost and this one, so a model
//! that underestimates the device (a learner still settling, a wrong
//! calibration, or a device it never saw) cannot talk it into switching
//! files more often than the device repays. An overestimating model only
//! lengthens turns, which costs no throughput.
//!
//! Bounds: two running means, three counters, and the dispatches out
//! (at most `OUT_MAX`, the oldest forgotten).

use std::collections::VecDeque;

use crate::cost::{DeviceCost, DEPTH_MAX, DISK};
use crate::types::{Dispatch, DispatchId, FileId, Nanos};

/// Dispatches out on the device that are remembered.
pub const OUT_MAX: usize = DEPTH_MAX as usize;
/// Dispatches of each kind seen before the figures are used.
pub const SEEN_MIN: u32 = 4;
/// Completions after which a disk's move cost (`cost::DISK`) is no longer
/// assumed for a model that says its device seeks, if too few dispatches
/// were alone on the device to time its moves: the model is then taken
/// as it is.
pub const PRIOR_COMPLETIONS_MAX: u32 = 256;
/// Weight of the newest sample in the running means: 1/8.
const NEWEST_SHIFT: u32 = 3;

/// A dispatch out on the device: which, when it left, whether it moved,
/// whether its time will be its own.
#[derive(Clone, Copy, Debug)]
struct Out {
    id: DispatchId,
    at: Nanos,
    moved: bool,
    timed: bool,
}

/// The running record.
#[derive(Clone, Debug, Default)]
pub struct DeviceSeen {
    /// Where the last dispatch ended.
    last_end: Option<(FileId, u64)>,
    out: VecDeque<Out>,
    /// When the last dispatch completed.
    last_done: Nanos,
    /// Picoseconds per byte of a continuing dispatch, its fixed cost
    /// included, and how many were seen.
    byte_ps: u64,
    continued: u32,
    /// What a moving dispatch took beyond a continuing one of its size
    /// (signed: on a device that does not seek, the differences are noise
    /// around zero and must average out, not be clipped into a cost), and
    /// how many were seen.
    move_ns: i64,
    moved: u32,
    /// Completions seen, up to `PRIOR_COMPLETIONS_MAX`.
    completions: u32,
}

fn mean(old: i64, new: i64, n: u32) -> i64 {
    if n == 0 {
        return new;
    }
    let (old, new) = (i128::from(old), i128::from(new));
    (old + ((new - old) >> NEWEST_SHIFT)).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl DeviceSeen {
    /// `d` left for the device, which had `inflight` dispatches already;
    /// `serial`: the model says it serves one at a time.
    pub fn dispatched(&mut self, d: &Dispatch, inflight: u32, serial: bool, now: Nanos) {
        // The first dispatch comes from nowhere: neither kind, not timed.
        let first = self.last_end.is_none();
        let moved = self.last_end != Some((d.file, d.offset));
        self.last_end = Some((d.file, d.end()));
        if !serial && inflight > 0 {
            // A second dispatch on a device that overlaps them: neither
            // time is its own.
            self.out.iter_mut().for_each(|o| o.timed = false);
        }
        if self.out.len() >= OUT_MAX {
            self.out.pop_front();
        }
        self.out.push_back(Out { id: d.id, at: now, moved, timed: !first && (serial || inflight == 0) });
    }

    /// `d` completed; whether the figures changed.
    pub fn completed(&mut self, d: &Dispatch, now: Nanos) -> bool {
        let mut expired = false;
        if self.completions < PRIOR_COMPLETIONS_MAX {
            self.completions += 1;
            // The disk's figures are no longer assumed.
            expired = self.completions == PRIOR_COMPLETIONS_MAX && self.move_ns().is_none();
        }
        self.time(d, now) || expired
    }

    /// Take `d`'s own time into the figures; whether they changed.
    fn time(&mut self, d: &Dispatch, now: Nanos) -> bool {
        let Some(at) = self.out.iter().position(|o| o.id == d.id) else { return false };
        let a = self.out.remove(at).expect("found");
        let took = now.saturating_sub(a.at.max(self.last_done));
        self.last_done = now;
        if !a.timed {
            return false;
        }
        let len = d.len.max(1);
        if !a.moved {
            let ps = u64::try_from(u128::from(took) * 1_000 / u128::from(len)).unwrap_or(u64::MAX);
            self.byte_ps = mean(signed(self.byte_ps), signed(ps), self.continued).max(0) as u64;
            self.continued = self.continued.saturating_add(1);
            return self.continued >= SEEN_MIN;
        }
        // A move's transfer is taken at most at a disk's rate per byte
        // (`cost::DISK`), and at that rate before any continuing dispatch
        // was timed. A continuing dispatch's rate carries its fixed cost,
        // which a short one spreads over few bytes (a 4 KiB read 1.4 ms
        // into a rotation: 344 ns a byte), and charged to a long move's
        // bytes it made every move look free. Without a rate at all, a
        // scheduler whose every dispatch moved (a late piece, then the
        // run past it, round after round) never learned what a move
        // costs, and so never held to stop moving. Too low a rate only
        // overstates moves, which lengthens turns and costs no throughput.
        let byte_ps = if self.continued == 0 { DISK.byte_ps } else { self.byte_ps.min(DISK.byte_ps) };
        let transfer = u64::try_from(u128::from(len) * u128::from(byte_ps) / 1_000).unwrap_or(u64::MAX);
        self.move_ns = mean(self.move_ns, signed(took) - signed(transfer), self.moved);
        self.moved = self.moved.saturating_add(1);
        self.moved >= SEEN_MIN
    }

    /// The move cost seen, once `SEEN_MIN` moves were timed.
    pub fn move_ns(&self) -> Option<u64> {
        (self.moved >= SEEN_MIN).then_some(self.move_ns.max(0) as u64)
    }

    /// The move cost the evidence asks for at least: the one seen once
    /// moves were timed; before that, where `model` says the device seeks
    /// at all, a disk's (`cost::DISK`), for at most
    /// `PRIOR_COMPLETIONS_MAX` completions: an unconfirmed seek cost may
    /// be low by any factor, and a policy that believed it would switch
    /// files (or give up holds and windows) more often than the device
    /// repays. None where neither applies.
    fn evidence(&self, model: &DeviceCost) -> Option<DeviceCost> {
        match self.move_ns() {
            // The model's rule (`DeviceCost::turn_bytes_min`) applied to
            // the move cost and cost per byte seen, one at a time.
            Some(m) => Some(DeviceCost::new(0, if self.continued >= SEEN_MIN && self.byte_ps > 0 { self.byte_ps } else { DISK.byte_ps }, m, 1)),
            None if model.seek_ns > 0 && self.completions < PRIOR_COMPLETIONS_MAX => Some(DISK),
            None => None,
        }
    }

    /// The shortest turn the evidence asks for beside `model`'s
    /// (`DeviceCost::turn_bytes_min` of `evidence`); 0 without any.
    pub fn turn_floor(&self, model: &DeviceCost) -> u64 {
        self.evidence(model).map_or(0, |e| e.turn_bytes_min())
    }

    /// `model` with a move cost no lower than the evidence's.
    pub fn floor(&self, model: Option<DeviceCost>) -> Option<DeviceCost> {
        let m = model?;
        let seen = self.evidence(&m).map_or(self.move_ns().unwrap_or(0), |e| e.seek_ns);
        Some(DeviceCost { seek_ns: m.seek_ns.max(seen), ..m })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Op;

    fn d(id: u64, file: u64, offset: u64, len: u64) -> Dispatch {
        Dispatch { id: DispatchId(id), file: FileId(file), op: Op::Read, offset, len, members: Vec::new() }
    }

    /// A device of 10 ns a byte and 5 ms a move, one dispatch at a time.
    fn feed(seen: &mut DeviceSeen, n: u64) {
        let mut now = 0;
        for k in 0..n {
            // Alternate files every fourth dispatch: three continue, one moves.
            let (file, offset) = ((k / 4) % 2, k * 4096);
            let x = d(k, file, offset, 4096);
            let moved = seen.last_end != Some((x.file, x.offset));
            seen.dispatched(&x, 0, true, now);
            now += 40_960 + if moved { 5_000_000 } else { 0 };
            seen.completed(&x, now);
        }
    }

    #[test]
    fn the_move_cost_and_turn_come_from_the_device_s_own_times() {
        let mut seen = DeviceSeen::default();
        feed(&mut seen, 64);
        let m = seen.move_ns().expect("both kinds seen");
        assert!((4_900_000..=5_100_000).contains(&m), "{m}");
        let t = seen.turn_floor(&DeviceCost::new(0, 10_000, 50_000, 1));
        assert!((2 * 4_900_000 / 10..=2 * 5_100_000 / 10).contains(&t), "{t}");
        let low = DeviceCost::new(0, 10_000, 50_000, 1);
        assert_eq!(seen.floor(Some(low)).unwrap().seek_ns, m, "an underestimate is raised");
        let high = DeviceCost::new(0, 10_000, 50_000_000, 1);
        assert_eq!(seen.floor(Some(high)).unwrap().seek_ns, 50_000_000, "an overestimate stays");
        assert_eq!(seen.floor(None), None, "no model, none made up");
    }

    #[test]
    fn an_unconfirmed_seek_is_taken_for_a_disk_s_until_timed_or_for_prior_completions_max() {
        let low = DeviceCost::new(0, 10_000, 50_000, 1);
        let flash = DeviceCost::new(50_000, 1_000, 0, 4);
        let fresh = DeviceSeen::default();
        assert_eq!(fresh.floor(Some(low)).unwrap().seek_ns, DISK.seek_ns, "a seeking device: a disk's until timed");
        assert_eq!(fresh.turn_floor(&low), DISK.turn_bytes_min());
        assert_eq!(fresh.floor(Some(flash)), Some(flash), "a model without seeks is taken as it is");
        assert_eq!(fresh.turn_floor(&flash), 0);
        // Moves timed: the seen figures, not the disk's.
        let mut seen = DeviceSeen::default();
        feed(&mut seen, 64);
        assert_eq!(seen.floor(Some(low)).unwrap().seek_ns, seen.move_ns().unwrap());
        // Never alone on the device: the disk's figures for
        // PRIOR_COMPLETIONS_MAX completions (the last one reports the
        // change), then the model's.
        let mut busy = DeviceSeen::default();
        for k in 0..u64::from(PRIOR_COMPLETIONS_MAX) {
            let x = d(k, 1, k * 4096, 4096);
            busy.dispatched(&x, 1, false, k);
            let changed = busy.completed(&x, k + 1);
            let last = k + 1 == u64::from(PRIOR_COMPLETIONS_MAX);
            assert_eq!(changed, last, "completion {k}");
            let want = if last { low.seek_ns } else { DISK.seek_ns };
            assert_eq!(busy.floor(Some(low)).unwrap().seek_ns, want, "completion {k}");
        }
    }

    #[test]
    fn on_a_serial_device_a_queued_dispatch_is_timed_from_the_completion_before_it() {
        // 10 ns a byte: continuing 4 KiB dispatches take 40,960 ns.
        let mut seen = DeviceSeen::default();
        let mut now = 0;
        for k in 0..8u64 {
            let x = d(k, 1, k * 4096, 4096);
            seen.dispatched(&x, 0, true, now);
            now += 40_960;
            seen.completed(&x, now);
        }
        // Two out at once, the second moving (5 ms) behind the first.
        let (a, b) = (d(100, 1, 8 * 4096, 4096), d(101, 2, 0, 4096));
        for k in 0..4u64 {
            let (a, b) = (d(a.id.0 + 2 * k, 1, (8 + k) * 4096, 4096), d(b.id.0 + 2 * k, 2 + k, 0, 4096));
            // After the first round `a` moves back from `b`'s file too.
            let back = if k == 0 { 0 } else { 5_000_000 };
            seen.dispatched(&a, 0, true, now);
            seen.dispatched(&b, 1, true, now);
            now += back + 40_960;
            seen.completed(&a, now);
            now += 5_000_000 + 40_960;
            seen.completed(&b, now);
        }
        let m = seen.move_ns().expect("moves queued behind another are timed");
        assert!((4_900_000..=5_100_000).contains(&m), "{m}");
    }

    #[test]
    fn moves_are_timed_before_any_continuing_dispatch_and_at_most_at_a_disk_s_rate() {
        // Every dispatch moves: 124 KiB runs and lone 4 KiB pieces, each
        // 5 ms of move plus its transfer at 10 ns a byte.
        let mut seen = DeviceSeen::default();
        let mut now = 0;
        for k in 0..9u64 {
            let len = if k % 2 == 0 { 126_976 } else { 4_096 };
            let x = d(k, 1, (k * 2 + 1) * 1_048_576, len);
            seen.dispatched(&x, 0, true, now);
            now += 5_000_000 + len * 10;
            seen.completed(&x, now);
        }
        let m = seen.move_ns().expect("moves timed without a continuing one");
        assert!((4_900_000..=5_100_000).contains(&m), "{m}");
        // A short continuing dispatch far into a rotation (1.4 ms for 4 KiB:
        // 344 ns a byte) must not make a long move look free.
        let mut seen = DeviceSeen::default();
        let mut now = 0;
        for k in 0..13u64 {
            let (x, took) = if k < 5 { (d(k, 1, k * 4_096, 4_096), 1_400_000) } else { (d(k, 1, k * 1_048_576, 126_976), 5_000_000 + 1_269_760) };
            seen.dispatched(&x, 0, true, now);
            now += took;
            seen.completed(&x, now);
        }
        let m = seen.move_ns().expect("both kinds seen");
        assert!(m >= 4_900_000, "a long move's bytes at a disk's rate at most: {m}");
    }

    #[test]
    fn the_dispatches_out_are_bounded_at_out_max() {
        let mut seen = DeviceSeen::default();
        for k in 0..OUT_MAX as u64 {
            seen.dispatched(&d(k, 1, k * 4096, 4096), k as u32, true, k);
        }
        assert_eq!(seen.out.len(), OUT_MAX, "N remembered");
        seen.dispatched(&d(999, 1, 0, 4096), OUT_MAX as u32, true, 1_000);
        assert_eq!(seen.out.len(), OUT_MAX, "N + 1: the oldest forgotten");
        assert!(!seen.completed(&d(0, 1, 0, 4096), 2_000), "a forgotten dispatch is not timed");
        assert!(seen.out.iter().all(|o| o.id.0 != 0));
    }

    #[test]
    fn noise_on_a_device_that_does_not_seek_is_no_move_cost() {
        // Moving and continuing dispatches alike take 40 us +- 20 us.
        let mut seen = DeviceSeen::default();
        let mut now = 0;
        for k in 0..256u64 {
            let x = d(k, (k / 4) % 2, k * 4096, 4096);
            seen.dispatched(&x, 0, true, now);
            now += 40_000 + (k * 7_919 % 41) * 1_000 - 20_000;
            seen.completed(&x, now);
        }
        assert!(seen.move_ns().unwrap() < 10_000, "{:?}", seen.move_ns());
    }

    #[test]
    fn figures_wait_for_seen_min_moves_and_overlap_is_not_timed() {
        let mut seen = DeviceSeen::default();
        feed(&mut seen, 3);
        assert_eq!(seen.move_ns(), None, "under SEEN_MIN moves");
        let mut other = DeviceSeen::default();
        let (a, b) = (d(1, 1, 0, 4096), d(2, 1, 4096, 4096));
        other.dispatched(&a, 0, false, 0);
        other.dispatched(&b, 1, false, 10);
        assert!(!other.completed(&a, 1_000_000) && !other.completed(&b, 2_000_000), "two on a device that overlaps them: neither timed");
        assert_eq!(other.continued + other.moved, 0);
    }
}
