//! # sluice-device: how long a device takes to serve one access
//!
//! Pure service-time models, shared by the daemon's emulated disk
//! (`sluice serve --device hdd7200`) and the simulator (`sluice sim`), so
//! both charge the same time for the same access.
//!
//! ```
//! use sluice_device::{Access, DeviceModel, Hdd};
//! let mut disk = Hdd::hdd7200();
//! let a = Access { file: 1, offset: 0, len: 1 << 20 };
//! let first = disk.service_ns(a);              // a far seek + rotation + transfer
//! let next = disk.service_ns(Access { offset: 1 << 20, ..a }); // continues: transfer only
//! assert!(first > next);
//! ```
//!
//! [`model_file`] holds the format of a measured device's cost model
//! (`sluice calibrate` writes it, `sluice serve` and `sluice sim` load it).
//!
//! Invariant: a model holds only the head position; it never sleeps, reads
//! a clock or does I/O. Only [`model_file::ModelFile::load`] reads a file.

mod error;
pub mod model_file;

pub use error::{Error, ErrorKind};
pub use model_file::ModelFile;

/// One access as the device sees it: a file, a byte offset, a length.
/// Files are laid out apart from each other, so moving between files is a
/// far seek.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub file: u64,
    pub offset: u64,
    pub len: u64,
}

/// Which kind of head movement an access needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeekKind {
    /// The access starts where the previous one ended.
    None,
    /// Same file, within `near_bytes` of the previous end.
    Near,
    /// Another file, or farther than `near_bytes`.
    Far,
}

/// A device's cost in the three parts a scheduler weighs (the core's
/// `DeviceCost` without the parallelism).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CostParts {
    /// Fixed cost of every access.
    pub access_ns: u64,
    /// Transfer, picoseconds per byte.
    pub byte_ps: u64,
    /// Extra cost of an access that does not continue the previous one
    /// (the far seek, rotation included).
    pub seek_ns: u64,
}

impl CostParts {
    /// The core's cost model of these parts, serving `parallelism` at once:
    /// what a scheduler weighs for a device it knows (the daemon's prior on
    /// its emulated disk, `sluice what-if`'s replay).
    pub fn cost(self, parallelism: u32) -> sluice_core::DeviceCost {
        sluice_core::DeviceCost::new(self.access_ns, self.byte_ps, self.seek_ns, parallelism)
    }
}

/// A device: given the head position it keeps, the time one access takes.
pub trait DeviceModel {
    /// Nanoseconds to serve `a`, moving the head to its end.
    fn service_ns(&mut self, a: Access) -> u64;
    /// The kind of seek `a` would need from the current head position.
    fn seek_kind(&self, a: Access) -> SeekKind;
    /// The model's figures as fixed, per-byte and seek cost.
    fn cost_parts(&self) -> CostParts;
}

fn picoseconds_per_byte(bytes_per_s: u64) -> u64 {
    1_000_000_000_000 / bytes_per_s.max(1)
}

/// A rotating disk.
///
/// The 7200 rpm figures: average seek 8.5-9 ms and track-to-track ~1 ms are
/// the data-sheet values of 7200 rpm desktop drives (Seagate Barracuda
/// 7200.12: 8.5 ms average read seek; WD Caviar Blue: 8.9 ms); the
/// rotational latency is half a revolution, 60 s / 7200 / 2 = 4.17 ms;
/// ~100 MB/s sustained transfer is those drives' media rate. PIOsimHD
/// (seed `004_…`) used the same structure: "track-to-track" cost for
/// accesses within 5 MB of the last one, average access time otherwise.
#[derive(Clone, Debug, PartialEq)]
pub struct Hdd {
    pub seek_far_ns: u64,
    pub seek_near_ns: u64,
    /// Distance under which a seek is a near (track-to-track) one.
    pub near_bytes: u64,
    pub rotation_ns: u64,
    pub bytes_per_s: u64,
    head: Option<(u64, u64)>,
}

/// Nanoseconds to move `len` bytes at `bytes_per_s` (rounded down): in
/// 64 bits where the product fits (under 18 GB), else in 128. The
/// simulator asks this at every dispatch and at every network hop, and a
/// 128-bit division is a library call.
pub fn transfer_ns(len: u64, bytes_per_s: u64) -> u64 {
    match len.checked_mul(1_000_000_000) {
        Some(p) => p / bytes_per_s,
        None => (u128::from(len) * 1_000_000_000 / u128::from(bytes_per_s)) as u64,
    }
}

impl Hdd {
    /// A 7200 rpm disk with the figures above.
    pub fn hdd7200() -> Hdd {
        Hdd { seek_far_ns: 9_000_000, seek_near_ns: 1_000_000, near_bytes: 1 << 20, rotation_ns: 4_170_000, bytes_per_s: 100_000_000, head: None }
    }

    fn transfer_ns(&self, len: u64) -> u64 {
        transfer_ns(len, self.bytes_per_s.max(1))
    }

    /// Put the head where another user of the same disk left it: the
    /// file and the offset its last access ended at (None: unknown, so
    /// the next access seeks far).
    pub fn place_head(&mut self, head: Option<(u64, u64)>) {
        self.head = head;
    }
}

impl DeviceModel for Hdd {
    fn seek_kind(&self, a: Access) -> SeekKind {
        match self.head {
            Some((f, end)) if f == a.file && end == a.offset => SeekKind::None,
            Some((f, end)) if f == a.file && end.abs_diff(a.offset) < self.near_bytes => SeekKind::Near,
            _ => SeekKind::Far,
        }
    }

    fn cost_parts(&self) -> CostParts {
        CostParts { access_ns: 0, byte_ps: picoseconds_per_byte(self.bytes_per_s), seek_ns: self.seek_far_ns + self.rotation_ns }
    }

    fn service_ns(&mut self, a: Access) -> u64 {
        let position = match self.seek_kind(a) {
            SeekKind::None => 0,
            SeekKind::Near => self.seek_near_ns + self.rotation_ns,
            SeekKind::Far => self.seek_far_ns + self.rotation_ns,
        };
        self.head = Some((a.file, a.offset + a.len));
        position + self.transfer_ns(a.len)
    }
}

/// A flash device: a fixed cost per access plus transfer, no seeks.
#[derive(Clone, Debug, PartialEq)]
pub struct Ssd {
    pub access_ns: u64,
    pub bytes_per_s: u64,
    /// Extra cost of an access that does not continue the previous one
    /// (0 for flash; a calibrated device may show one).
    pub seek_ns: u64,
    head: Option<(u64, u64)>,
}

impl Ssd {
    /// A SATA SSD: ~80 us per access (4 KiB random read latency of
    /// data-center SATA drives such as the Intel S4510), 500 MB/s.
    pub fn sata() -> Ssd {
        Ssd { access_ns: 80_000, bytes_per_s: 500_000_000, seek_ns: 0, head: None }
    }

    /// A device profile measured elsewhere: per-access cost and bandwidth.
    pub fn profile(access_ns: u64, bytes_per_s: u64) -> Ssd {
        Ssd { access_ns, bytes_per_s: bytes_per_s.max(1), seek_ns: 0, head: None }
    }

    /// A calibrated device (`sluice calibrate`): per-access cost,
    /// bandwidth and the extra cost of not continuing the previous access.
    pub fn calibrated(access_ns: u64, bytes_per_s: u64, seek_ns: u64) -> Ssd {
        Ssd { seek_ns, ..Ssd::profile(access_ns, bytes_per_s) }
    }
}

impl DeviceModel for Ssd {
    fn seek_kind(&self, a: Access) -> SeekKind {
        match self.head {
            Some((f, end)) if f == a.file && end == a.offset => SeekKind::None,
            _ => SeekKind::Far,
        }
    }

    fn cost_parts(&self) -> CostParts {
        CostParts { access_ns: self.access_ns, byte_ps: picoseconds_per_byte(self.bytes_per_s), seek_ns: self.seek_ns }
    }

    fn service_ns(&mut self, a: Access) -> u64 {
        let seek = if self.seek_kind(a) == SeekKind::None { 0 } else { self.seek_ns };
        self.head = Some((a.file, a.offset + a.len));
        self.access_ns + seek + transfer_ns(a.len, self.bytes_per_s)
    }
}

/// Most channels a [`Channels`] device has.
pub const CHANNELS_MAX: usize = 1_024;

/// When a device of several channels finishes each dispatch: a dispatch
/// takes the free channel first free (the lowest on a tie) for its service
/// time, of which a shared part (`shared_ns` plus its bytes at
/// `shared_ps` picoseconds a byte, at most the whole) holds what the
/// channels share, one dispatch after another, at the end. So with every
/// channel busy the throughput is the shared part's, and alone a dispatch
/// takes its service time. The simulator's server and `sluice what-if`
/// serve a calibrated device this way (`sluice calibrate` measures both
/// parts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channels {
    free: Vec<u64>,
    bus_free: u64,
    shared_ns: u64,
    shared_ps: u64,
}

impl Channels {
    /// `channels` (1..=`CHANNELS_MAX`, clamped) all free at time 0.
    pub fn new(channels: usize, shared_ns: u64, shared_ps: u64) -> Channels {
        Channels { free: vec![0; channels.clamp(1, CHANNELS_MAX)], bus_free: 0, shared_ns, shared_ps }
    }

    pub fn count(&self) -> usize {
        self.free.len()
    }

    /// When a dispatch of `len` bytes that leaves at `now` and takes
    /// `service_ns` alone is done.
    #[inline]
    pub fn serve(&mut self, now: u64, service_ns: u64, len: u64) -> u64 {
        let shared = (u128::from(self.shared_ns) + u128::from(len) * u128::from(self.shared_ps) / 1_000).min(u128::from(service_ns)) as u64;
        let (c, free) = self.free.iter().copied().enumerate().min_by_key(|&(i, t)| (t, i)).expect("a device has a channel");
        let done = (free.max(now) + (service_ns - shared)).max(self.bus_free) + shared;
        self.free[c] = done;
        self.bus_free = done;
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(disk: &mut dyn DeviceModel, a: Access, kind: SeekKind, ns: u64) {
        assert_eq!(disk.seek_kind(a), kind, "{a:?}");
        assert_eq!(disk.service_ns(a), ns, "{a:?}");
    }

    #[test]
    fn hdd7200_service_times_by_hand() {
        let mut d = Hdd::hdd7200();
        // 1 MiB transfer at 100 MB/s = 10.48576 ms.
        let mib = 10_485_760;
        check(&mut d, Access { file: 1, offset: 0, len: 1 << 20 }, SeekKind::Far, 9_000_000 + 4_170_000 + mib);
        check(&mut d, Access { file: 1, offset: 1 << 20, len: 1 << 20 }, SeekKind::None, mib);
        // 4 KiB, 512 KiB past the head: near seek + rotation + 40.96 us.
        check(&mut d, Access { file: 1, offset: (2 << 20) + (512 << 10), len: 4096 }, SeekKind::Near, 1_000_000 + 4_170_000 + 40_960);
        check(&mut d, Access { file: 2, offset: 0, len: 4096 }, SeekKind::Far, 9_000_000 + 4_170_000 + 40_960);
        // Backwards on the same file, farther than 1 MiB: far.
        check(&mut d, Access { file: 2, offset: 10 << 20, len: 4096 }, SeekKind::Far, 9_000_000 + 4_170_000 + 40_960);
    }

    #[test]
    fn transfer_time_is_the_same_on_both_sides_of_the_64_bit_path() {
        let wide = |len: u64, bps: u64| (u128::from(len) * 1_000_000_000 / u128::from(bps)) as u64;
        let last = u64::MAX / 1_000_000_000;
        for len in [0, 1, 4096, 1 << 30, last - 1, last, last + 1, u64::MAX / 2, u64::MAX] {
            for bps in [1, 3, 100_000_000, 2_700_000_000, u64::MAX] {
                assert_eq!(transfer_ns(len, bps), wide(len, bps), "{len} bytes at {bps} B/s");
            }
        }
    }

    #[test]
    fn cost_parts_by_hand() {
        assert_eq!(Hdd::hdd7200().cost_parts(), CostParts { access_ns: 0, byte_ps: 10_000, seek_ns: 13_170_000 });
        assert_eq!(Ssd::calibrated(5, 1_000_000_000, 7).cost_parts(), CostParts { access_ns: 5, byte_ps: 1_000, seek_ns: 7 });
    }

    #[test]
    fn channels_overlap_all_but_the_shared_part() {
        // Two channels, 10 of each 100 ns shared: the second dispatch
        // overlaps the first but for its shared part; a third waits for a
        // channel.
        let mut c = Channels::new(2, 10, 0);
        assert_eq!((c.serve(0, 100, 0), c.serve(0, 100, 0), c.serve(0, 100, 0)), (100, 110, 200));
        // Bytes at 1 ns each are shared too, never more than the whole.
        let mut c = Channels::new(2, 0, 1_000);
        assert_eq!((c.serve(0, 100, 40), c.serve(0, 100, 400)), (100, 200));
        // One channel: one after another, whatever is shared.
        let mut c = Channels::new(1, 0, 0);
        assert_eq!((c.serve(0, 50, 0), c.serve(10, 50, 0), c.serve(500, 50, 0)), (50, 100, 550));
    }

    #[test]
    fn channels_are_bounded_at_n_and_clamped_at_n_plus_one() {
        assert_eq!(Channels::new(CHANNELS_MAX, 0, 0).count(), CHANNELS_MAX);
        assert_eq!(Channels::new(CHANNELS_MAX + 1, 0, 0).count(), CHANNELS_MAX);
        assert_eq!(Channels::new(0, 0, 0).count(), 1);
    }

    #[test]
    fn ssd_charges_access_plus_transfer() {
        let mut d = Ssd::sata();
        check(&mut d, Access { file: 1, offset: 0, len: 500_000 }, SeekKind::Far, 80_000 + 1_000_000);
        check(&mut d, Access { file: 1, offset: 500_000, len: 5_000 }, SeekKind::None, 80_000 + 10_000);
    }
}
